"""The one interface every chat backend implements."""

from __future__ import annotations

import abc
import asyncio
from collections import deque
from collections.abc import AsyncIterator, Sequence
from typing import Any

from pipeline.chat import ChatRequest, ChatResult, RequestFailure


class RequestFeed:
    """The requests a runner has ready for a backend, in order, until it is closed.

    The runner puts requests in as its window allows; a backend takes them one at a time
    (a worker pool) or in chunks (a batch engine). ``get``/``take`` return ``None``/``[]``
    once the feed is closed and empty.
    """

    def __init__(self) -> None:
        self._items: deque[tuple[Any, ChatRequest]] = deque()
        self._changed = asyncio.Event()
        self._closed = False

    def put(self, token: Any, request: ChatRequest) -> None:
        self._items.append((token, request))
        self._changed.set()

    def close(self) -> None:
        self._closed = True
        self._changed.set()

    def __len__(self) -> int:
        return len(self._items)

    async def _wait(self) -> None:
        while not self._items and not self._closed:
            self._changed.clear()
            await self._changed.wait()

    async def get(self) -> tuple[Any, ChatRequest] | None:
        await self._wait()
        return self._items.popleft() if self._items else None

    async def take(self, n: int, linger: float = 0.0) -> list[tuple[Any, ChatRequest]]:
        """Up to ``n`` items, waiting for the first; with ``linger``, waits that long once
        for a fuller chunk (a batch engine works better on full batches)."""
        await self._wait()
        if linger and len(self._items) < n and not self._closed:
            await asyncio.sleep(linger)
        out: list[tuple[Any, ChatRequest]] = []
        while self._items and len(out) < n:
            out.append(self._items.popleft())
        return out


class Backend(abc.ABC):
    """Answers chat requests; results stream back as they arrive, tagged by input index."""

    name: str = "base"
    # stream(): requests per run() call, and how long to wait for a fuller chunk
    stream_chunk: int = 256
    stream_linger: float = 0.0

    @property
    def window(self) -> int:
        """Requests a runner should keep in flight to keep this backend busy."""
        return 2 * self.stream_chunk

    @abc.abstractmethod
    def run(
        self, requests: Sequence[ChatRequest]
    ) -> AsyncIterator[tuple[int, ChatResult | RequestFailure]]:
        """Yield ``(index, result or failure)`` for every request, in completion order."""

    async def stream(
        self, feed: RequestFeed
    ) -> AsyncIterator[tuple[Any, ChatResult | RequestFailure]]:
        """Answer the feed's requests until it closes, yielding ``(token, outcome)``.
        This default sends chunks through ``run``; a backend with a worker pool overrides
        it to keep every worker busy across chunk boundaries."""
        while True:
            batch = await feed.take(self.stream_chunk, self.stream_linger)
            if not batch:
                return
            async for j, res in self.run([r for _, r in batch]):
                yield batch[j][0], res

    async def aclose(self) -> None:  # noqa: B027 - optional hook
        """Release connections or engines."""
