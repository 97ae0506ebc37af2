"""Answers only from an existing request cache, so a run recorded on a GPU machine can be
filtered, annotated, audited and published anywhere without a model.

The cache is a run's ``cache.sqlite`` or a JSONL export of one (one object per line with
``key`` and ``response``), the form in which the quickstart ships its answers.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterable, Sequence
from pathlib import Path
from typing import Any

from pipeline.backends.identity import identity_id, owner
from pipeline.core.errors import BackendError
from pipeline.kinds.backend import BACKENDS, AsSent, Backend, BackendSection, Resolve
from pipeline.kinds.settings import ReplaySettings
from pipeline.run.cache import RequestCache
from pipeline.types.chat import ChatRequest, ChatResult, RequestFailure


class _JsonlCache:
    def __init__(self, path: Path) -> None:
        self._answers: dict[str, ChatResult] = {}
        self.identities: dict[str, dict[str, Any]] = {}
        with open(path, encoding="utf-8") as fh:
            for n, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                    self._answers[row["key"]] = ChatResult.from_dict(row["response"])
                    served = row.get("served_by")
                    if isinstance(served, dict):
                        self.identities[identity_id(served)] = served
                except (ValueError, KeyError, TypeError) as exc:
                    raise BackendError(f"{path}, line {n}: not a cache row ({exc})") from None

    def get_many(self, keys: Iterable[str]) -> dict[str, ChatResult]:
        return {k: self._answers[k] for k in keys if k in self._answers}

    def close(self) -> None:
        pass


def recorded_identity(source: Path | None) -> dict[str, Any]:
    """The identity of the backend whose answers ``source`` (a cache.sqlite or its JSONL
    export) holds: what a replay's requests are keyed by, with ``replayed_from`` added."""
    if source is None or not Path(source).exists():
        raise BackendError(
            f"replay: no answers to replay at {source}; run the stages with a live backend first"
        )
    source = Path(source)
    if source.suffix == ".jsonl":
        found = _JsonlCache(source).identities
    else:
        with RequestCache(source, readonly=True) as cache:
            found = cache.backends()
    if len(found) != 1:
        what = (
            "no record of the backend that answered"
            if not found
            else (f"answers of {len(found)} backends")
        )
        raise BackendError(
            f"replay: {source} holds {what}; replay needs the answers of one backend, "
            "recorded by this version (rebuild it from a run, e.g. "
            "scripts/build_quickstart_cache.py for the quickstart's)"
        )
    (identity,) = found.values()
    return {**identity, "replayed_from": source.name}


class ReplayBackend(Backend):
    name = "replay"
    settings = ReplaySettings
    # it reads answers back; a request its cache lacks cannot be answered here
    answers_new = False

    def __init__(
        self,
        cfg: BackendSection,
        cache_path: Path | None = None,
        replay_path: Path | None = None,
    ) -> None:
        """``replay_path``: ``backend.replay.cache`` resolved against the config file's
        folder; without one, the run's own cache (``cache_path``)."""
        self.cfg = cfg
        if replay_path is None and cfg.replay.cache:
            replay_path = Path(cfg.replay.cache)
        source = replay_path or cache_path
        self.source = source
        self.cache: RequestCache | _JsonlCache | None = None
        if replay_path is not None and not replay_path.exists():
            raise BackendError(f"replay cache not found: {replay_path}")
        if source is not None and source.exists():
            self.cache = (
                _JsonlCache(source) if source.suffix == ".jsonl" else RequestCache(source, True)
            )

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

    # ---- the kind ----------------------------------------------------------------------
    @staticmethod
    def cache_file(cfg: BackendSection, resolve: Resolve | None) -> Path | None:
        """``backend.replay.cache``, placed against the config file's folder."""
        given = cfg.replay.cache
        return (resolve(given) if resolve else given) if given else None

    @classmethod
    def build(
        cls,
        cfg: BackendSection,
        *,
        cache_path: Path | None = None,
        resolve: Resolve | None = None,
    ) -> Backend:
        return cls(cfg, cache_path=cache_path, replay_path=cls.cache_file(cfg, resolve))

    @classmethod
    def preflight(
        cls, cfg: BackendSection, *, resolve: Resolve | None = None, cached: bool = False
    ) -> str | None:
        path = cls.cache_file(cfg, resolve)
        if path is not None and not Path(path).exists():
            raise BackendError(f"backend.replay.cache: {path} does not exist")
        return None

    @classmethod
    def as_sent(cls, identity: dict[str, Any]) -> tuple[AsSent, list[str]]:
        # the recorded answers' server was sent them as the backend that recorded them
        # says (the stand-in, an OpenAI-compatible server, through the openai backend)
        kind = owner(identity) or BACKENDS.get("openai")
        return super().as_sent(identity) if kind is cls else kind.as_sent(identity)

    @classmethod
    def identify(
        cls,
        cfg: BackendSection,
        models: Sequence[str],
        *,
        resolve: Resolve | None = None,
        cache_path: Path | None = None,
    ) -> dict[str, Any]:
        source = cls.cache_file(cfg, resolve)
        return recorded_identity(Path(source) if source else cache_path)
