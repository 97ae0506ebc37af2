"""Answers only from an existing request cache, so a run recorded on a GPU machine can be
filtered, annotated, audited and published anywhere without a model."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

from pipeline.backends.base import Backend, ChatRequest, ChatResult, RequestFailure
from pipeline.cache import RequestCache


class ReplayBackend(Backend):
    name = "replay"

    def __init__(self, cfg: Any, cache_path: Path | None = None) -> None:
        self.cfg = cfg
        source = Path(cfg.replay_cache) if cfg.replay_cache else cache_path
        self.source = source
        self.cache = RequestCache(source, readonly=True) if source and source.exists() else None

    def missing(self, requests: Sequence[ChatRequest]) -> int:
        """How many of ``requests`` the cache cannot answer (checked before a stage starts)."""
        if self.cache is None:
            return len(requests)
        found = self.cache.get_many(r.key for r in requests)
        return sum(1 for r in requests if r.key not in found)

    async def run(
        self, requests: Sequence[ChatRequest]
    ) -> AsyncIterator[tuple[int, ChatResult | RequestFailure]]:
        found = self.cache.get_many(r.key for r in requests) if self.cache else {}
        for i, r in enumerate(requests):
            hit = found.get(r.key)
            if hit is None:
                yield i, RequestFailure("not in the replay cache", attempts=0, transient=False)
            else:
                yield i, hit

    async def aclose(self) -> None:
        if self.cache is not None:
            self.cache.close()
