"""One model asked through one configured backend, every request through a request cache:
what ``prb eval bon``'s policy, judge and generative scorers (and ``prb eval``'s generative
scorer) share.

A ``Role`` is identified before anything is sent (``identify_role``): the backend's identity
(part of every request's key, ``pipeline/backends/identity.py``) and its preflight, so a
server that is down is one line before a file is written. ``ask`` sends requests through
``pipeline.engine.llm.LLMRunner`` (cache first; answers committed before they are handed over, so
a kill loses only what was in flight), sends a request repeated in the list once, and
returns each request's outcome in order.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.backends.factory import make_backend, preflight
from pipeline.backends.identity import describe, identify, identity_id
from pipeline.core.errors import BackendError
from pipeline.engine.llm import Answer, Failure, LLMRunner, Validator
from pipeline.run.cache import RequestCache
from pipeline.types.chat import ChatRequest


@dataclass(frozen=True)
class Role:
    """A model through a config's backend: what answers it, identified."""

    name: str  # policy, judge, or the scorer's name: for messages
    cfg: Any  # the Config whose backend section answers
    model: str
    identity: dict[str, Any]
    served_id: str
    warning: str | None = None  # the backend's preflight warning (answers from the cache)

    def describe(self) -> dict[str, Any]:
        """What results.json / bon.json record of it."""
        return {
            "model": self.model,
            "backend": self.cfg.backend.name,
            "served_by": self.identity,
            "described": describe(self.identity),
        }


def identify_role(
    name: str, cfg: Any, model: str, cache_path: Path, *, cached: bool = False
) -> Role:
    """The role's backend checked (its extra, its server: BackendError naming what to fix)
    and identified; ``cached``: the cache exists, so a server that cannot be reached is a
    warning (answers may all be there), as for a run."""
    try:
        warning = preflight(cfg.backend, cfg.resolve_input, cached=cached)
        served = identify(cfg.backend, [model], resolve=cfg.resolve_input, cache_path=cache_path)
    except BackendError as exc:
        raise BackendError(f"{name} ({model}): {exc}") from None
    return Role(name, cfg, model, served, identity_id(served), warning)


@dataclass
class Asked:
    """Each request's outcome, in order, and the runner's counts."""

    outcomes: list[Answer | Failure]
    stats: dict[str, Any]

    @property
    def failed(self) -> int:
        """Requests without an answer (a transport failure or an invalid answer)."""
        return sum(isinstance(o, Failure) for o in self.outcomes)


def ask(
    role: Role,
    cache_path: Path,
    stage: str,
    requests: Sequence[ChatRequest],
    *,
    validate: Validator | None = None,
    max_reasks: int = 0,
    progress: bool = True,
) -> Asked:
    """Answer ``requests`` (from the cache, else from the role's backend); a request that
    repeats one earlier in the list is sent once. Free-text answers are kept as they come
    (no re-ask of an answer cut at max_tokens: the reference keeps them, and a sample is a
    sample); JSON ones are re-asked ``max_reasks`` times when they do not validate."""
    first: dict[str, int] = {}
    unique: list[ChatRequest] = []
    where = []
    for req in requests:
        k = req.key
        if k not in first:
            first[k] = len(unique)
            unique.append(req)
        where.append(first[k])

    async def go() -> tuple[list[Answer | Failure | None], dict[str, Any]]:
        backend = make_backend(role.cfg.backend, cache_path, role.cfg.resolve_input)
        got: list[Answer | Failure | None] = [None] * len(unique)
        try:
            with RequestCache(cache_path) as cache:
                cache.put_backend(role.served_id, role.identity)
                runner = LLMRunner(
                    backend,
                    cache,
                    stage,
                    max_reasks=max_reasks,
                    abort_after_failures=role.cfg.backend.abort_after_failures,
                    progress=progress,
                    text_reasks=0,
                    invalid_retry_runs=0,
                )
                async for i, outcome in runner.stream(unique, validate):
                    got[i] = outcome
                stats = runner.stats.as_dict()
        finally:
            await backend.aclose()
        return got, stats

    cache_path.parent.mkdir(parents=True, exist_ok=True)
    got, stats = asyncio.run(go())
    outcomes = []
    for i in where:
        o = got[i]
        assert o is not None  # the runner yields every request once
        outcomes.append(o)
    return Asked(outcomes, stats)
