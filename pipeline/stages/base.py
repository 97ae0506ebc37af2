"""The stage base class and the registry of stages, in run order."""

from __future__ import annotations

import abc
import contextlib
import functools
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

from pipeline.backends.factory import make_backend
from pipeline.backends.identity import NOT_KEYED, identity_id
from pipeline.config import Config
from pipeline.core.errors import BackendError, PipelineError, StageError
from pipeline.core.sourcehash import code_closure, source_hashes
from pipeline.engine.budget import make_budget
from pipeline.engine.llm import LLMRunner
from pipeline.kinds.backend import BACKENDS, Backend
from pipeline.kinds.stages import ORDER
from pipeline.run import RunDir, ShardIndex, StageDir
from pipeline.run.cache import RequestCache
from pipeline.types.chat import ChatRequest
from pipeline.types.schemas import for_engine


class UndeclaredRead(StageError, KeyError):
    """A stage read a field of an upstream row that it does not declare in its ``reads``:
    a bug in the stage (its code and its declaration disagree), raised at the read. A
    ``KeyError`` too, as a missing key is; so stage code never catches ``KeyError`` around
    an upstream read (it would hide this)."""

    def __init__(self, stage: str, upstream: str, key: object) -> None:
        self.stage, self.upstream, self.key = stage, upstream, key
        super().__init__(
            f"stage '{stage}' read field {key!r} of a '{upstream}' row without declaring it: "
            f"add it to {stage}'s `reads['{upstream}']` (a bug in the stage, nothing was written "
            "for the example it was reading)"
        )

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


class UpstreamRow(dict):
    """An upstream row as a stage sees it: only the fields the stage declares reading from
    that stage. Reading any other field raises :class:`UndeclaredRead` at once (``[]`` and
    ``get`` alike); a declared field the row lacks behaves as in a plain dict."""

    __slots__ = ("_declared", "_stage", "_upstream")

    def __init__(
        self, row: Mapping[str, Any], stage: str, upstream: str, declared: AbstractSet[str]
    ) -> None:
        super().__init__((k, v) for k, v in row.items() if k in declared)
        self._declared = declared
        self._stage = stage
        self._upstream = upstream

    def __missing__(self, key: str) -> Any:
        if key in self._declared:
            raise KeyError(key)
        raise UndeclaredRead(self._stage, self._upstream, key)

    def get(self, key: str, default: Any = None) -> Any:
        if key not in self._declared:
            raise UndeclaredRead(self._stage, self._upstream, key)
        return dict.get(self, key, default)


class UpstreamIndex:
    """:class:`ShardIndex` of an upstream stage, its rows seen through :class:`UpstreamRow`."""

    def __init__(self, index: ShardIndex, view: Callable[[Mapping[str, Any]], UpstreamRow]) -> None:
        self._index = index
        self._view = view

    def get(self, value: str) -> list[UpstreamRow]:
        """The rows of ``value`` (empty when it has none)."""
        return [self._view(r) for r in self._index.get(value)]

    def __contains__(self, value: object) -> bool:
        return isinstance(value, str) and value in self._index

    def __len__(self) -> int:
        return len(self._index)

    def __iter__(self) -> Iterator[str]:
        """The keys, in the order of the shards."""
        return iter(self._index)


class IndexedFields(Mapping[str, Any]):
    """key -> ``fields(row)`` of an upstream stage's row, read from its shards when asked
    (through an :class:`UpstreamIndex`), the last ``keep`` kept: what a stage looks up per
    example without holding every upstream row (``Stage.input_fields``)."""

    def __init__(
        self, index: UpstreamIndex, fields: Callable[[Mapping[str, Any]], Any], keep: int = 1024
    ) -> None:
        self._index = index
        self._fields = fields
        self._recent: dict[str, Any] = {}
        self._keep = keep

    def __getitem__(self, key: str) -> Any:
        if key in self._recent:
            return self._recent[key]
        rows = self._index.get(key)
        if not rows:
            raise KeyError(key)
        value = self._fields(rows[-1])  # (one row a key; the last, as a dict of them kept)
        if len(self._recent) >= self._keep:
            del self._recent[next(iter(self._recent))]
        self._recent[key] = value
        return value

    def __contains__(self, key: object) -> bool:
        return key in self._index

    def __iter__(self) -> Iterator[str]:
        return iter(self._index)

    def __len__(self) -> int:
        return len(self._index)


@dataclass
class Context:
    """What a stage gets: the config, the run directory and lazily built shared services."""

    config: Config
    run_dir: RunDir
    progress: bool = True
    fingerprints: dict[str, str] = field(default_factory=dict)
    _cache: RequestCache | None = None
    _served_by: dict[str, Any] | None = None
    _served_by_id: tuple[dict[str, Any], str] | None = None  # (identity, its id), memoised
    warnings: list[str] = field(default_factory=list)
    # `prb plan` only: rows a stage's input would hold, by stage, where that stage's
    # folder does not hold them yet (Stage.input_rows reads these instead); each read may
    # make them again rather than hold them (pipeline/plan/estimate.py)
    planned_rows: dict[str, Iterable[dict]] | None = None

    @property
    def served_by(self) -> dict[str, Any]:
        """The identity of the backend that answers this run's requests (computed once, on
        first use: only a run with an LLM stage to plan needs it)."""
        if self._served_by is None:
            self._served_by = resolve_identity(self)
        return self._served_by

    @property
    def served_by_id(self) -> str:
        """The id every request of this run carries (``ChatRequest.served_by``); hashed
        once per identity, not once per request."""
        ident = self.served_by
        if self._served_by_id is None or self._served_by_id[0] is not ident:
            self._served_by_id = (ident, identity_id(ident))
        return self._served_by_id[1]

    def sent_schema(self, schema: dict[str, Any]) -> dict[str, Any]:
        """What a request carries of ``schema`` for the backend that answers: the full
        schema where its grammar engine enforces string bounds cheaply, else the form
        without them (pipeline/types/schemas.py: for_engine)."""
        return for_engine(schema, self.served_by)

    def served_by_setting(self) -> dict[str, Any]:
        """The identity as a stage's settings hold it: only what is keyed, so a note on
        how it was found never changes a fingerprint."""
        return {k: v for k, v in self.served_by.items() if k not in NOT_KEYED}

    def assume_served_by(self, identity: dict[str, Any]) -> None:
        """Take ``identity`` as what answers this run, without asking the backend (``prb
        plan``, when the backend cannot say: the plan goes on, matching no cached answer)."""
        self._served_by = identity

    @property
    def cache(self) -> RequestCache:
        if self._cache is None:
            self._cache = RequestCache(self.run_dir.cache_path)
        return self._cache

    def use_cache(self, cache: RequestCache) -> None:
        """Look requests up in ``cache`` instead of opening the run's cache.sqlite for
        writing (``prb plan``: the file opened read-only, or an empty stand-in); closed with
        the context."""
        self._cache = cache

    @contextlib.asynccontextmanager
    async def llm(self, stage: str) -> AsyncIterator[LLMRunner]:
        """A request runner for one stage, its backend opened inside the running loop."""
        b = self.config.backend
        backend: Backend = make_backend(b, self.run_dir.cache_path, self.config.resolve_input)
        self.cache.put_backend(self.served_by_id, self.served_by)
        budget = make_budget(self.config, self.cache, self.served_by_id, self.served_by)
        try:
            yield LLMRunner(
                backend,
                self.cache,
                stage,
                max_reasks=b.max_reasks,
                abort_after_failures=b.abort_after_failures,
                progress=self.progress,
                invalid_retry_runs=b.invalid_retry_runs,
                budget=budget,
            )
        finally:
            await backend.aclose()

    def close(self) -> None:
        if self._cache is not None:
            self._cache.close()
            self._cache = None


@dataclass
class PlannedExample:
    """What a stage would do for one example (``prb plan``, pipeline/plan/)."""

    example_id: str
    # the first attempts the stage sends for it: the same requests `run` builds
    requests: list[ChatRequest]
    # the rows it would write; answers not known yet are placeholders
    rows: list[dict] = field(default_factory=list)
    # requests a finished row kept in the cache stands for (the judge's memo): all cached
    replayed: int = 0
    # True: built from placeholder inputs or a guessed shortlist, so the prompts (not the
    # number of requests) are estimates
    estimated: bool = False
    # True: ``rows`` hold placeholder text where answers are not in the cache yet
    placeholders: bool = False
    # the share of runs that send each request (None: every one is sent): the judge asks
    # what its verdicts so far make worth asking (``prb plan``'s expected count)
    sent_share: list[float] | None = None


class Placeholders(Protocol):
    """Text standing in for answers that do not exist yet (``prb plan``)."""

    def answer(self) -> str:
        """A candidate answer of the expected length."""
        ...

    def aspects(self) -> list[dict[str, str]]:
        """A generated rubric's items, of the expected number and length."""
        ...


# Where the code that decides rows lives, below the stages: the rules, the record layout,
# schemas and prompt rendering, profile ranking, the input readers.
ROW_CODE: tuple[str, ...] = (
    "pipeline.rules", "pipeline.types.records", "pipeline.types.schemas",
    "pipeline.types.prompts", "pipeline.types.promptfiles", "pipeline.types.profile",
    "pipeline.core.fields", "pipeline.core.ids", "pipeline.inputs",
)  # fmt: skip


def _decides_rows(module: str) -> bool:
    return any(module == m or module.startswith(m + ".") for m in ROW_CODE)


@functools.lru_cache(maxsize=32)
def stage_code(module: str) -> tuple[str, ...]:
    """A stage module and the :data:`ROW_CODE` modules its rows come from."""
    return code_closure(module, _decides_rows)


class Stage(abc.ABC):
    """One job: read the previous stage's rows, write this stage's folder."""

    name: ClassVar[str]
    # Column contract: the fields this stage reads from each upstream stage, declared here
    # by the reader (never imported from the producer), and the fields it writes itself.
    # `prb run` checks every read against the producer's writes before any work starts
    # (pipeline.orchestration.orchestrate.check_contracts), and a stage's first shard
    # against its writes.
    # The stage sees upstream rows only through these declarations (:class:`UpstreamRow`):
    # a read its code makes and its declaration lacks fails at once.
    reads: ClassVar[Mapping[str, AbstractSet[str]]] = {}
    writes: ClassVar[AbstractSet[str]] = frozenset()
    # False: a stage cut short is re-done from its start (no LLM calls, cheap) instead of
    # resumed from its shards
    resumable: ClassVar[bool] = True

    @property
    def code(self) -> tuple[str, ...]:
        """The modules whose code decides this stage's rows: its own module and every module
        of :data:`ROW_CODE` it imports (lazily too, and the input formats a registry names),
        followed through their imports; derived, never listed by hand. Their source,
        normalised so that comments, docstrings and formatting do not count
        (pipeline/core/sourcehash.py), joins the stage's fingerprint: editing one re-does the
        stage, and the re-do message names the module."""
        return stage_code(type(self).__module__)

    @property
    def requires(self) -> tuple[str, ...]:
        """The stage whose fingerprint joins this one's: the latest, in run order, of those
        it reads (its own fingerprint covers the stages before it)."""
        read = [n for n in ORDER if n in self.reads]
        return (read[-1],) if read else ()

    def shard_size(self, ctx: Context) -> int:
        """Examples per output shard: the ``chunk_size`` of this stage's own config section
        (each stage sizes its own shards)."""
        return int(getattr(ctx.config, self.name).chunk_size)

    def code_fingerprint(self) -> dict[str, str]:
        """module -> hash of its normalised source, for every module in :attr:`code`."""
        return source_hashes(self.code)

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

    def plan_examples(
        self, ctx: Context, done: AbstractSet[str], placeholders: Placeholders
    ) -> Iterator[PlannedExample]:
        """For ``prb plan``: what this stage would send and write for each example of its
        input not in ``done``, built by the same code ``run`` uses. Reads only (the cache
        through ``ctx.cache``, which a plan opens read-only). A stage that sends no request
        and whose rows no later LLM stage reads has nothing to say."""
        return iter(())

    def plan_note(self, ctx: Context) -> str | None:
        """For ``prb plan``: what its expected count assumes, where not every request it
        could send is sent (:attr:`PlannedExample.sent_share`)."""
        return None

    # helpers -------------------------------------------------------------------------
    def view(self, stage: str) -> Callable[[Mapping[str, Any]], UpstreamRow]:
        """How this stage sees a row of ``stage``: only the fields it declares reading."""
        declared = self.reads.get(stage)
        if declared is None:
            raise StageError(
                f"stage '{self.name}' reads rows of '{stage}' without declaring it in "
                "`reads`: a bug in the stage"
            )
        declared = frozenset(declared)
        return lambda row: UpstreamRow(row, self.name, stage, declared)

    def input_rows(self, ctx: Context, stage: str) -> Iterator[UpstreamRow]:
        """The rows of an upstream stage, each seen through :meth:`view`."""
        view = self.view(stage)
        if ctx.planned_rows is not None and stage in ctx.planned_rows:
            return map(view, ctx.planned_rows[stage])
        return map(view, self.input_stage(ctx, stage).rows())

    def input_count(self, ctx: Context, stage: str) -> int:
        """How many rows an upstream stage holds: a finished stage's manifest counts them
        (nothing is read); the rows ``prb plan`` makes up are counted."""
        if ctx.planned_rows is not None and stage in ctx.planned_rows:
            return sum(1 for _ in self.input_rows(ctx, stage))
        marker = self.input_stage(ctx, stage).marker()
        assert marker is not None  # input_stage: the stage is done
        return marker.rows

    def input_index(self, ctx: Context, stage: str, key: str = "example_id") -> UpstreamIndex:
        """An upstream stage's rows by ``key`` (``StageDir.index``), seen through :meth:`view`."""
        view = self.view(stage)
        return UpstreamIndex(self.input_stage(ctx, stage).index(key), view)

    def input_fields(
        self, ctx: Context, stage: str, fields: Callable[[Mapping[str, Any]], Any]
    ) -> Mapping[str, Any]:
        """example_id -> ``fields(row)`` of an upstream stage: from a finished stage read by
        offset as asked (:class:`IndexedFields`), never all held; only the rows ``prb plan``
        makes up for a stage not run yet are gathered in a dict."""
        if ctx.planned_rows is not None and stage in ctx.planned_rows:
            return {r["example_id"]: fields(r) for r in self.input_rows(ctx, stage)}
        return IndexedFields(self.input_index(ctx, stage), fields)

    def input_stage(self, ctx: Context, stage: str) -> StageDir:
        sd = ctx.run_dir.stage(stage)
        if not sd.done:
            raise StageError(f"stage '{self.name}' needs stage '{stage}', which is not done")
        return sd


def resolve_identity(ctx: Context) -> dict[str, Any]:
    """What answers this run (pipeline/backends/identity.py). When a server cannot be
    reached, the identity this run recorded for the same backend settings is assumed, with
    a warning: the answers the cache holds for it are served, and the first request it does
    not hold fails at the server."""
    cfg = ctx.config
    b = cfg.backend
    kind = BACKENDS.get(b.name)
    models = [b.model] + ([cfg.judge.model] if cfg.judge.model else [])
    asked = kind.asked(b)
    try:
        identity = kind.identify(
            b, models, resolve=cfg.resolve_input, cache_path=ctx.run_dir.cache_path
        )
    except BackendError as exc:
        for sd in ctx.run_dir.stages():
            try:
                meta = sd.meta
            except PipelineError:
                continue
            recorded = (meta.environment or {}).get("served_by") if meta else None
            if isinstance(recorded, dict) and recorded.get("asked") == asked:
                ctx.warnings.append(f"{exc} Continuing with the answers in the run's cache.")
                note = "not reachable now; assumed to be what served this run before"
                return {**recorded, "assumed": note}
        raise
    ctx.warnings.extend(kind.warnings(identity))
    return {**identity, "asked": asked}
