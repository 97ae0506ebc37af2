"""The stage base class and the registry of stages, in run order."""

from __future__ import annotations

import abc
import contextlib
from collections.abc import AsyncIterator, Iterator, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Any, ClassVar

from pipeline.backends.base import Backend
from pipeline.cache import RequestCache
from pipeline.config import Config
from pipeline.errors import StageError
from pipeline.llm import LLMRunner
from pipeline.run import RunDir, StageDir


@dataclass
class Context:
    """What a stage gets: the config, the run directory and lazily built shared services."""

    config: Config
    run_dir: RunDir
    progress: bool = True
    fingerprints: dict[str, str] = field(default_factory=dict)
    _cache: RequestCache | None = None

    @property
    def cache(self) -> RequestCache:
        if self._cache is None:
            self._cache = RequestCache(self.run_dir.cache_path)
        return self._cache

    @contextlib.asynccontextmanager
    async def llm(self, stage: str) -> AsyncIterator[LLMRunner]:
        """A request runner for one stage, its backend opened inside the running loop."""
        from pipeline.backends.factory import make_backend

        b = self.config.backend
        backend: Backend = make_backend(b, self.run_dir.cache_path, self.config.resolve_input)
        try:
            yield LLMRunner(
                backend,
                self.cache,
                stage,
                max_reasks=b.max_reasks,
                abort_after_failures=b.abort_after_failures,
                progress=self.progress,
                invalid_retry_runs=b.invalid_retry_runs,
            )
        finally:
            await backend.aclose()

    def close(self) -> None:
        if self._cache is not None:
            self._cache.close()
            self._cache = None


class Stage(abc.ABC):
    """One job: read the previous stage's rows, write this stage's folder."""

    name: ClassVar[str]
    requires: ClassVar[tuple[str, ...]] = ()
    # Column contract: the fields this stage reads from each upstream stage, declared here
    # by the reader (never imported from the producer), and the fields it writes itself.
    # `prb run` checks every read against the producer's writes before any work starts
    # (pipeline.orchestrate.check_contracts), and a stage's first shard against its writes.
    reads: ClassVar[Mapping[str, AbstractSet[str]]] = {}
    writes: ClassVar[AbstractSet[str]] = frozenset()
    # False: a stage cut short is re-done from its start (no LLM calls, cheap) instead of
    # resumed from its shards
    resumable: ClassVar[bool] = True

    def uses_llm(self, ctx: Context) -> bool:
        """Whether this stage sends LLM requests with the current settings."""
        return False

    @abc.abstractmethod
    def settings(self, ctx: Context) -> dict[str, Any]:
        """Everything that decides this stage's output (config slice, template hashes)."""

    @abc.abstractmethod
    def expected(self, ctx: Context) -> int:
        """How many examples this stage will process."""

    @abc.abstractmethod
    def run(self, ctx: Context, out: StageDir) -> dict[str, Any]:
        """Produce the stage's shards in ``out``; return stats. Resume from ``out``'s shards."""

    # helpers -------------------------------------------------------------------------
    def input_rows(self, ctx: Context, stage: str) -> Iterator[dict]:
        return self.input_stage(ctx, stage).rows()

    def input_stage(self, ctx: Context, stage: str) -> StageDir:
        sd = ctx.run_dir.stage(stage)
        if not sd.done:
            raise StageError(f"stage '{self.name}' needs stage '{stage}', which is not done")
        return sd
