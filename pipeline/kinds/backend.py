"""The one class every backend is: it answers chat requests, and its class answers
everything else about its kind (docs/backends.md, "Adding a backend"): its name, its
settings section, its pip extra, whether it can answer new requests, how it is built,
checked before a run, identified, described, and how `prb plan` counts its tokens.
Nothing outside pipeline/backends/ asks a backend's name. Beside it, its registry
(``BACKENDS``) and the config's ``backend`` section (``BackendSection``), whose name must
be registered and which holds each backend's settings (pipeline/kinds/settings.py)."""

from __future__ import annotations

import abc
import asyncio
import contextlib
import importlib.util
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from pydantic import Field, field_validator, model_validator

from pipeline.core.errors import BackendError, ConfigError
from pipeline.core.redact import public_url
from pipeline.core.registry import Registry
from pipeline.kinds.settings import (
    LLAMACPP_DEFAULT_MODEL,
    LlamaCppSettings,
    OpenAISettings,
    RaySettings,
    ReasoningSettings,
    ReplaySettings,
    Settings,
    VLLMSettings,
    move_flat_keys,
)
from pipeline.types.chat import ChatRequest, ChatResult, RequestFailure

# places a path from the config against the config file's folder
Resolve = Callable[[Path | None], Path | None]
# a request as its server receives it: the requests it goes out as (Backend.as_sent)
AsSent = Callable[[ChatRequest], list[ChatRequest]]


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


@dataclass(frozen=True)
class TokenCount:
    """A model's own token count, for `prb plan`: a request's prompt tokens, a text's
    tokens, and how they are counted (printed with the plan)."""

    prompt: Callable[[ChatRequest], int]
    text: Callable[[str], int]
    method: str


class Backend(abc.ABC):
    """Answers chat requests; results stream back as they arrive, tagged by input index.

    Class attributes and class methods describe the kind without building it (building
    may load a model for minutes); a subclass sets what differs from these defaults.
    """

    name: ClassVar[str] = "base"
    # its settings section, backend.<name> (pipeline/kinds/settings.py); None: none
    settings: ClassVar[type[Settings] | None] = None
    # the pip extra it needs and a module that extra installs (None: nothing beyond the
    # package's own dependencies), and the install line to print when it is missing
    extra: ClassVar[str | None] = None
    extra_module: ClassVar[str | None] = None
    install_line: ClassVar[str | None] = None
    # False: it only reads back recorded answers (replay); a request it lacks is reported
    # once at the end of the stage, never retried, never counted as "sent"
    answers_new: ClassVar[bool] = True
    # what a stage stopped after abort_after_failures failures in a row says of it
    failing: ClassVar[str] = "the server looks down"
    # distributions whose versions each run's environment.json records, and facts it
    # records beside them
    libraries: ClassVar[tuple[str, ...]] = ()
    environment: ClassVar[dict[str, str]] = {}
    # benchmarks/results/<file> holding this backend's measured output tokens per second
    # (`prb plan` uses it when the run has no measurement of its own)
    throughput_benchmark: ClassVar[str | None] = None
    # whether it hands its engine a reasoning parser (backend.<name>.reasoning.parser: vllm)
    reasoning_parser: ClassVar[bool] = False
    # stream(): requests per run() call, and how long to wait for a fuller chunk
    stream_chunk: int = 256
    stream_linger: float = 0.0

    def __init__(self, cfg: BackendSection) -> None:
        """``cfg`` is the config's ``backend`` section."""
        self.cfg = cfg

    @property
    def window(self) -> int:
        """Requests a runner should keep in flight to keep this backend busy."""
        return 2 * self.stream_chunk

    @property
    def reasoning_record(self) -> dict[str, Any] | None:
        """Its reasoning settings as its identity records them (``ReasoningSettings.record``;
        None: its model does not reason, or its section has no such settings)."""
        getter = getattr(getattr(self, "cfg", None), "reasoning", None)
        settings = getter(self.name) if callable(getter) else None
        return settings.record(self.reasoning_parser) if settings is not None else None

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

    # ---- the kind: answered without building a backend ---------------------------------
    @classmethod
    def build(
        cls,
        cfg: BackendSection,
        *,
        cache_path: Path | None = None,
        resolve: Resolve | None = None,
    ) -> Backend:
        """The backend for the config's ``backend`` section; ``cache_path`` is the run's
        request cache, ``resolve`` places a path from the config."""
        return cls(cfg)

    @classmethod
    def install_hint(cls) -> str:
        """The line that installs what this backend needs."""
        return cls.install_line or f"pip install 'personalized-rewardbench[{cls.extra}]'"

    @classmethod
    def check_installed(cls, cfg: BackendSection) -> None:
        """BackendError, one line with the install line, when the extra is missing."""
        module = cls.extra_module
        if module is not None and importlib.util.find_spec(module) is None:
            raise BackendError(
                f"backend.name is '{cls.name}', but {module} is not installed: {cls.install_hint()}"
            )

    @classmethod
    def preflight(
        cls, cfg: BackendSection, *, resolve: Resolve | None = None, cached: bool = False
    ) -> str | None:
        """Check, without building it (loading a model takes minutes), that the backend can
        answer: its extra, its server, its files. Raises BackendError saying what to fix;
        returns a warning for a problem the run's cache may make harmless (``cached``:
        the run has a request cache)."""
        cls.check_installed(cfg)
        return None

    @classmethod
    def identify(
        cls,
        cfg: BackendSection,
        models: Sequence[str],
        *,
        resolve: Resolve | None = None,
        cache_path: Path | None = None,
    ) -> dict[str, Any]:
        """What answers a run that asks for ``models`` (pipeline/backends/identity.py): a
        small dict, part of every request's key. Its ``kind`` is this backend's name or
        starts with it and a dash (``ray-http``), so that :meth:`describe` is found again
        from a recorded identity. BackendError when it cannot be known. Every
        registered backend defines it (the conformance suite checks; a stand-in made for
        one test may not)."""
        raise BackendError(
            f"backend '{cls.name}' cannot say what answers it: its class needs identify() "
            "(docs/backends.md)"
        )

    @classmethod
    def describe(cls, identity: dict[str, Any]) -> str:
        """One line for people: what served, from an identity :meth:`identify` made."""
        return str(identity.get("kind"))

    @classmethod
    def warnings(cls, identity: dict[str, Any]) -> list[str]:
        """What a user should hear about an identity :meth:`identify` made (a server that
        does not list the model asked for); said once before the stages run."""
        return []

    @classmethod
    def asked(cls, cfg: BackendSection) -> dict[str, Any]:
        """The settings an identity was asked with: a run whose server cannot be reached
        assumes the identity it recorded for the same ones."""
        return {"backend": cls.name, "url": None}

    @classmethod
    def token_counter(
        cls, cfg: BackendSection, model: str, resolve: Resolve | None = None
    ) -> tuple[TokenCount | None, list[str]]:
        """The model's own token count when this machine has its tokenizer (`prb plan`),
        and notes on why not; (None, notes): plan looks further (a local Hugging Face
        tokenizer, then an estimate). Here: none (a backend that knows its model's
        tokenizer says so)."""
        return None, []

    @classmethod
    def batch_priced(cls, cfg: BackendSection) -> bool:
        """Whether this configuration sends its requests through a batch API, priced at
        ``run.prices``' batch rates (the budget, `prb plan`, the ledger)."""
        return False

    @classmethod
    def answers_in_rounds(cls, cfg: BackendSection) -> bool:
        """Whether each round of requests is a job of its own that may take hours (batch
        files, a batch API): a stage then asks in as few rounds as it can."""
        return cls.batch_priced(cfg)

    @classmethod
    def stage_model(cls, cfg: BackendSection, model: str | None = None) -> str:
        """The model a stage asks for: its own (``judge.model``), else backend.model."""
        return model or cfg.model

    @classmethod
    def as_sent(cls, identity: dict[str, Any]) -> tuple[AsSent, list[str]]:
        """How the server ``identity`` records receives a request: as the requests it goes
        out as, on which `prb plan` and ``run.budget`` count prompts and bounds, and the
        plan's notes on that. Here: as it is, nothing to note."""
        return (lambda req: [req]), []

    @classmethod
    def planning(
        cls, schemas: Callable[[], list[dict[str, Any]]]
    ) -> AbstractContextManager[list[str]]:
        """Inside: :meth:`identify` asks no server what it takes (`prb plan` sends
        nothing); the list it yields gets, on leaving, the plan's notes on what it could
        not know that way. ``schemas``: the JSON schemas the run sends, as sent. Here:
        nothing to note."""
        return contextlib.nullcontext([])


# ---- the registry -----------------------------------------------------------------------
# A backend is one class: registering it here, by its module path (imported on first use),
# or with BACKENDS.register anywhere else, is all that adding one takes (docs/backends.md).


class BackendRegistry(Registry[type[Backend]]):
    """Name -> backend class (pipeline/core/registry.py's checks), plus what a run records of
    every registered backend."""

    def answers_new(self, name: str) -> bool:
        """Whether backend ``name`` sends requests to a model (not a replay); True for a
        name no longer registered (an older run's)."""
        return name not in self or self.get(name).answers_new

    def environment(self) -> dict[str, str]:
        """Every registered backend's own facts for environment.json (the vLLM release
        its backend was verified with)."""
        out: dict[str, str] = {}
        for name in self.names():
            out.update(self.get(name).environment)
        return out

    def libraries(self) -> list[str]:
        """Every registered backend's libraries, for a run's environment.json."""
        out: list[str] = []
        for name in self.names():
            out += self.get(name).libraries
        return list(dict.fromkeys(out))


BACKENDS = BackendRegistry("backend", Backend, field="backend.name")
BACKENDS.register("openai", "pipeline.backends.openai.backend:OpenAIBackend")
BACKENDS.register("vllm", "pipeline.backends.vllm_backend:VLLMBackend")
BACKENDS.register("llamacpp", "pipeline.backends.llamacpp_backend:LlamaCppBackend")
BACKENDS.register("replay", "pipeline.backends.replay:ReplayBackend")
BACKENDS.register("ray", "pipeline.backends.ray_backend:RayBackend")
BACKENDS.register("batchfile", "pipeline.backends.batchfile:BatchFileBackend")


class BackendSection(Settings):
    """The ``backend`` section: what every backend shares, then one section per backend."""

    name: str = Field(
        "openai",
        description="Backend, one of the registered ones:",
        json_schema_extra={"registry": "pipeline.kinds.backend:BACKENDS"},
    )
    model: str = Field(
        "stand-in",
        description="Model name sent to the server / loaded by vLLM; llamacpp: a GGUF file "
        f"(default: {LLAMACPP_DEFAULT_MODEL}, no download).",
    )
    max_attempts: int = Field(
        6,
        ge=1,
        le=100,
        description="Attempts per request on transient errors (429, 5xx, timeouts).",
    )
    backoff_initial_s: float = Field(
        0.5, ge=0, le=600, description="First retry wait; doubles each try."
    )
    backoff_max_s: float = Field(
        30.0, ge=0, le=3600, description="Longest wait between two attempts."
    )
    max_reasks: int = Field(
        2,
        ge=0,
        le=10,
        description="Re-asks when a JSON-schema answer does not parse or validate.",
    )
    invalid_retry_runs: int = Field(
        1,
        ge=0,
        le=100,
        description="Runs that retry a request whose answer stayed invalid after its "
        "re-asks before the failure is final (a deterministic model repeats itself).",
    )
    abort_after_failures: int = Field(
        50,
        ge=1,
        le=1_000_000,
        description="Stop the stage after this many consecutive failed requests "
        "(the server or engine is likely down).",
    )
    openai: OpenAISettings = Field(
        default_factory=OpenAISettings,
        description="openai backend settings (also the ray backend's http engine).",
    )
    vllm: VLLMSettings = Field(
        default_factory=VLLMSettings,
        description="vllm backend settings (also the ray backend's vllm engine).",
    )
    llamacpp: LlamaCppSettings = Field(
        default_factory=LlamaCppSettings, description="llamacpp backend settings."
    )
    ray: RaySettings = Field(default_factory=RaySettings, description="ray backend settings.")
    replay: ReplaySettings = Field(
        default_factory=ReplaySettings, description="replay backend settings."
    )

    def sections(self) -> dict[str, Settings]:
        """Every backend's section, by backend name."""
        return {k: v for k, v in self if isinstance(v, Settings)}

    def secret_env_names(self) -> list[str]:
        """The environment variables the sections name as holding secrets."""
        return [getattr(s, f) for s in self.sections().values() for f in s.secret_env_fields]

    def urls(self) -> list[str]:
        """Every URL the sections hold (their credentials are registered as secrets)."""
        return [getattr(s, f) for s in self.sections().values() for f in s.url_fields]

    def public(self, data: dict[str, Any]) -> dict[str, Any]:
        """``data`` (this section dumped) with the URLs' credentials masked."""
        for name, s in self.sections().items():
            for f in s.url_fields:
                if isinstance(data.get(name), dict) and data[name].get(f):
                    data[name][f] = public_url(data[name][f])
        return data

    def reasoning(self, name: str | None = None) -> ReasoningSettings | None:
        """The reasoning settings of backend ``name`` (default: the configured one), when
        it has them and they are on."""
        r = getattr(self.section(name), "reasoning", None)
        return r if isinstance(r, ReasoningSettings) and r.enabled else None

    def section(self, name: str | None = None) -> Settings | None:
        """The settings section of backend ``name`` (default: the configured one); None
        for a backend without one."""
        value = getattr(self, name or self.name, None)
        return value if isinstance(value, Settings) else None

    @model_validator(mode="before")
    @classmethod
    def _flat_keys(cls, data: Any) -> Any:
        # keys an older config held flat; the loader prints the deprecation line
        if isinstance(data, dict):
            data, _ = move_flat_keys(data)
        return data

    @model_validator(mode="before")
    @classmethod
    def _no_model_given(cls, data: Any) -> Any:
        # for a backend with its own default model a null or empty model means "none
        # given", as if left out
        if isinstance(data, dict) and not data.get("model") and "model" in data:
            section = cls.model_fields.get(str(data.get("name")))
            kind = section.annotation if section is not None else None
            if isinstance(kind, type) and issubclass(kind, Settings) and kind.default_model:
                data = {k: v for k, v in data.items() if k != "model"}
        return data

    @model_validator(mode="after")
    def _backend_default_model(self) -> BackendSection:
        # No model given: a backend with its own default (llamacpp's packaged GGUF) uses
        # it; the others keep the shared default. Also when `name` is assigned later.
        # (__dict__: no re-validation loop.)
        if "model" not in self.model_fields_set:
            section = self.section()
            own = section.default_model if section is not None else None
            self.__dict__["model"] = own or type(self).model_fields["model"].default
        return self

    @field_validator("name")
    @classmethod
    def _known_backend(cls, v: str) -> str:
        try:
            BACKENDS.check(v)
        except ConfigError as exc:
            raise ValueError(exc.reason) from None
        return v
