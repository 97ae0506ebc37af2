"""The ``batchfile`` backend: answers come from batch files run elsewhere (vLLM's
``run_batch`` on a cluster with no port open), never from a server this machine reaches.

It answers a request with the answer `prb batch import` read for it, and says of every
other request that it has no answer yet (``RequestFailure.unanswered``): the runner keeps
that example pending and the stage stops at its end, saying how many requests wait. `prb
batch export` runs the stages with it and writes those requests to a batch file.

Its identity (what every request's key holds) is fixed by the config alone: the kind and
the model names the run asks for, so `prb plan`, `prb batch` and `prb run` agree on every
key without contacting anything. An import checks that each result line was answered by
the model its request names; a change of model is a new identity, and new keys.
"""

from __future__ import annotations

import contextvars
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.backends.batchstore import BatchState
from pipeline.kinds.backend import Backend, BackendSection, Resolve
from pipeline.run import RunDir
from pipeline.run.cache import INVALID_PREFIX, RequestCache
from pipeline.types.chat import ChatRequest, ChatResult, RequestFailure
from pipeline.types.schemas import SCHEMA_BOUNDS

NO_ANSWER = "no answer imported yet"


@dataclass
class Recording:
    """What the batchfile backends of one `prb batch` command saw: the requests they had
    no answer for (in the order the runner asked) and those they answered."""

    missing: dict[str, ChatRequest] = field(default_factory=dict)
    answered: dict[str, ChatRequest] = field(default_factory=dict)
    retired: int = 0  # answers set aside: requests given up on, asked afresh


_RECORDING: contextvars.ContextVar[Recording | None] = contextvars.ContextVar(
    "prb_batch_recording", default=None
)


@contextmanager
def recording() -> Iterator[Recording]:
    """Record what the batchfile backend is asked while the block runs."""
    rec = Recording()
    token = _RECORDING.set(rec)
    try:
        yield rec
    finally:
        _RECORDING.reset(token)


class BatchFileBackend(Backend):
    name = "batchfile"
    failing = (
        "their answers come from batch files (backend.name batchfile): write them with "
        "`prb batch export CONFIG`, run the file (e.g. vLLM's run_batch), then "
        "`prb batch import CONFIG RESULTS.jsonl`"
    )

    def __init__(
        self, cfg: BackendSection, state: Path | None = None, cache_path: Path | None = None
    ) -> None:
        self.cfg = cfg
        self.state = BatchState(state) if state is not None else None
        self.cache_path = cache_path
        self._since = time.time()
        self._answered: dict[str, ChatRequest] = {}  # what it handed the runner, by key

    async def run(
        self, requests: Sequence[ChatRequest]
    ) -> AsyncIterator[tuple[int, ChatResult | RequestFailure]]:
        found = self.state.answers(r.key for r in requests) if self.state is not None else {}
        rec = _RECORDING.get()
        for i, req in enumerate(requests):
            hit = found.get(req.key)
            if hit is None:
                if rec is not None:
                    rec.missing[req.key] = req
                yield i, RequestFailure(NO_ANSWER, attempts=0, unanswered=True)
            else:
                self._answered[req.key] = req
                if rec is not None:
                    rec.answered[req.key] = req
                yield i, hit

    async def aclose(self) -> None:
        if self.state is None:
            return
        try:
            self._retire_given_up()
        finally:
            self.state.close()

    def _retire_given_up(self) -> None:
        """The runner gave up on a request whose answer stayed invalid after its re-asks
        (recorded in the cache's errors, retried on the next run): retire the imported
        answers of that request and its re-asks, so the next export asks it afresh, as
        the next `prb run` against a server would send it again. Without this a re-run
        would replay the same answers and count as a retry that never was."""
        if not self._answered or self.cache_path is None or not self.cache_path.exists():
            return
        with RequestCache(self.cache_path, readonly=True) as cache:
            gave_up = [
                self._answered[e["key"]]
                for e in cache.errors()
                if e["created"] >= self._since
                and str(e["reason"]).startswith(INVALID_PREFIX)
                and e["key"] in self._answered
            ]
        retired = [
            r.key
            for first in gave_up
            for r in self._answered.values()
            # a re-ask is its request with the bad answer and the reason appended
            if r.model == first.model and r.messages[: len(first.messages)] == first.messages
        ]
        if retired:
            assert self.state is not None
            self.state.retire(retired)
            rec = _RECORDING.get()
            if rec is not None:
                rec.retired += len(retired)

    # ---- the kind ----------------------------------------------------------------------
    @classmethod
    def answers_in_rounds(cls, cfg: BackendSection) -> bool:
        return True  # each round is a batch job on the cluster

    @classmethod
    def build(
        cls,
        cfg: BackendSection,
        *,
        cache_path: Path | None = None,
        resolve: Resolve | None = None,
    ) -> Backend:
        # the state file sits beside the run's cache (pipeline/run/layout.py)
        state = RunDir(cache_path.parent).batch_state if cache_path is not None else None
        return cls(cfg, state, cache_path)

    @classmethod
    def identify(
        cls,
        cfg: BackendSection,
        models: Sequence[str],
        *,
        resolve: Resolve | None = None,
        cache_path: Path | None = None,
    ) -> dict[str, Any]:
        # from the config alone: nothing is contacted, so every command agrees on the keys;
        # schemas go with their string bounds only when asked (backend.openai.schema_bounds:
        # for run_batch with --structured-outputs-config '{"backend": "guidance"}')
        ident = {"kind": cls.name, "models": sorted(set(models)), "model_output": True}
        if cfg.openai.schema_bounds:
            ident[SCHEMA_BOUNDS] = True
        return ident

    @classmethod
    def describe(cls, identity: dict[str, Any]) -> str:
        models = ", ".join(identity.get("models") or []) or "no model named"
        return f"batch files answered by {models} (OpenAI batch format, e.g. vLLM run_batch)"
