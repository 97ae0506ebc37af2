"""Any OpenAI-compatible chat server (vLLM's `vllm serve`, hosted APIs, the test stand-in).

A fixed pool of ``max_concurrency`` workers pulls requests from a queue, so the number
in flight is bounded without creating a task per request. Each attempt first takes a
permit from a rate limiter (pipeline/backends/openai/ratelimit.py) fed by every response's
``x-ratelimit-*`` headers and 429s, so against a hosted API's limit fewer requests are
in flight and sends are paced; a server that sends no such headers never waits for one
(``backend.openai.follow_rate_limits``). Transient errors (429, 5xx,
timeouts, dropped connections, unreadable bodies) are retried with tenacity: exponential
backoff with full jitter, Retry-After honoured on 429, a cap on attempts. Other 4xx
errors are the request's fault and are never retried. The client's own retries are
off, so attempts do not multiply.

A server that refuses the credentials (401, or 403 before any request succeeded) stops the
stage at once with a line naming the variable that holds the key, instead of failing every
request until the run decides the server is down. Credentials written into
``backend.openai.base_url`` work on both transports: ``user:password@`` is sent as HTTP Basic
auth (for a proxy in front of the server; it replaces the API key, as httpx itself would
do) and the query string (``?api-key=...``) goes with every request.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractContextManager
from contextvars import ContextVar
from pathlib import Path
from typing import Any

import openai
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
    stop_after_attempt,
    wait_random_exponential,
)

from pipeline.backends import reasoning
from pipeline.backends.gguf import gguf_counter_notes
from pipeline.backends.identity import STANDIN_OWNER, plain_url, standin_identity
from pipeline.backends.openai import dialects
from pipeline.backends.openai.batch import BatchRunner
from pipeline.backends.openai.ratelimit import (
    RateLimiter,
    Ticket,
    estimate_tokens,
    say_capped_wait,
)
from pipeline.backends.openai.wire import (
    auth_error,
    check_reachable,
    describe_error,
    endpoint,
    is_transient,
    list_models,
    parse_reply,
    refusal_of,
    retry_after_seconds,
)
from pipeline.core.errors import BackendError
from pipeline.kinds.backend import (
    AsSent,
    Backend,
    BackendSection,
    RequestFeed,
    Resolve,
    TokenCount,
)
from pipeline.kinds.settings import OpenAISettings
from pipeline.run import RunDir
from pipeline.types.chat import ChatRequest, ChatResult, RequestFailure, reasoning_allowance
from pipeline.types.schemas import SCHEMA_BOUNDS

# The permit of the attempt a task is sending, for the response hook that reads the
# rate-limit headers (the hook runs in the task that sent the request).
_TICKET: ContextVar[Ticket | None] = ContextVar("prb_rate_limit_ticket", default=None)


class _Wait:
    """Retry-After when the server gives one (capped), else exponential backoff with jitter."""

    def __init__(self, initial: float, maximum: float) -> None:
        self.maximum = maximum
        self.backoff = wait_random_exponential(multiplier=initial, max=maximum)

    def __call__(self, state: RetryCallState) -> float:
        exc = state.outcome.exception() if state.outcome else None
        hinted = retry_after_seconds(exc) if exc is not None else None
        if hinted is not None:
            say_capped_wait(hinted, self.maximum)
            return min(hinted, self.maximum)
        return self.backoff(state)


class OpenAIBackend(Backend):
    name = "openai"
    settings = OpenAISettings
    libraries = ("openai",)

    def __init__(self, cfg: BackendSection, cache_path: Path | None = None) -> None:
        """``cfg`` is the config's ``backend`` section; the server is ``cfg.openai``;
        ``cache_path`` the run's cache, where what the server takes is kept."""
        self.cfg = cfg
        self.server = s = cfg.openai
        self.cache_path = cache_path
        # what the server takes, per model (pipeline/backends/openai/dialects.py): what identify()
        # found for this run, so the bodies sent are the ones the identity records
        self._dialects: dict[str, dialects.Dialect] = {}
        dialects.keep(s, cache_path)
        # The key is read here and held only by the client; it is never logged or stored.
        api_key = os.environ.get(s.api_key_env) or "EMPTY"
        ep = endpoint(s)
        # what the server says of its rate limit steers how many attempts are in flight
        # (pipeline/backends/openai/ratelimit.py); off, the pool is a fixed max_concurrency
        self.limits: RateLimiter | None = None
        hooks: dict[str, Any] = {}
        if s.follow_rate_limits:
            self.limits = RateLimiter(s.max_concurrency, max_pause_s=cfg.backoff_max_s)
            hooks = {"event_hooks": {"response": [self._observe]}}
        http_client = None
        if s.http_transport == "aiohttp":
            http_client = openai.DefaultAioHttpClient(timeout=s.timeout_s, **hooks)
        elif hooks:
            http_client = openai.DefaultAsyncHttpxClient(timeout=s.timeout_s, **hooks)
        self.client = openai.AsyncOpenAI(
            base_url=ep.base,
            api_key=api_key,
            max_retries=0,
            timeout=s.timeout_s,
            http_client=http_client,
            # URL credentials replace the Bearer key (custom headers win in the client)
            default_headers=ep.headers if ep.sends == "basic" else None,
            default_query=ep.query or None,
        )
        self._answered = False  # a 403 after an answer is one request's, not the key's
        self._reasoning = self.reasoning_record
        self._retrying: dict[str, Any] = dict(
            stop=stop_after_attempt(cfg.max_attempts),
            wait=_Wait(cfg.backoff_initial_s, cfg.backoff_max_s),
            retry=retry_if_exception(is_transient),
            reraise=True,
        )

    def dialect(self, model: str) -> dialects.Dialect:
        """What the server takes for ``model`` (the body, the parameters)."""
        d = self._dialects.get(model)
        if d is None:
            d = self._dialects[model] = dialects.known(self.server, model, self.cache_path)
        return d

    async def _once(self, req: ChatRequest) -> ChatResult:
        # the body in the server's dialect; a server that does not serve n > 1 gets n
        # requests of one choice each, answered one after another (one worker's slot)
        d = self.dialect(req.model)
        bodies = self._bodies(req)
        if len(bodies) == 1:
            result = await self._post(req, bodies[0])
        else:
            result = dialects.merge([await self._post(req, b) for b in bodies])
        return d.answer(req, self._reasoned(result))

    def _bodies(self, req: ChatRequest) -> list[dict[str, Any]]:
        """The request's bodies in the server's dialect, a reasoning model's reasoning budget
        added to the answer's max_tokens (pipeline/backends/reasoning.py)."""
        bodies = self.dialect(req.model).bodies(req)
        extra = reasoning_allowance(req, self._reasoning)
        if extra:
            for body in bodies:
                key = "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens"
                body[key] = int(body[key]) + extra
        return bodies

    def _reasoned(self, result: ChatResult) -> ChatResult:
        """The reasoning apart from the answer: a <think> block in the content taken out
        when the model reasons (``backend.openai.reasoning``); a server's own reasoning
        field is read apart by parse_reply whatever the setting."""
        if self._reasoning is not None:
            return reasoning.finish(result, self._reasoning)
        return reasoning.share_tokens(result) if result.reasoned else result

    async def _post(self, req: ChatRequest, body: dict[str, Any]) -> ChatResult:
        # client.post with cast_to=object: the SDK's HTTP, auth and error types, without
        # chat.completions.create's recursive transform of the body against its TypedDicts
        # (a no-op for our plain-JSON bodies, and most of the client's CPU per request with
        # a JSON schema attached: 1.56 -> 0.77 ms, measured against the stand-in server)
        # and without building pydantic models for the reply.
        resp: Any = await self.client.post("/chat/completions", body=body, cast_to=object)
        return parse_reply(resp, req)

    async def _observe(self, response: Any) -> None:
        """Every HTTP response (an httpx event hook): its rate-limit headers and 429s."""
        if self.limits is not None:
            self.limits.observe(_TICKET.get(), response.status_code, response.headers)

    async def _attempt(self, req: ChatRequest) -> ChatResult:
        """One attempt, sent when the rate limiter gives it a permit."""
        limits = self.limits
        if limits is None:
            return await self._once(req)
        chars = sum(len(text) for _, text in req.messages)
        ticket = await limits.acquire(estimate_tokens(chars, req.max_tokens, req.n))
        context = _TICKET.set(ticket)
        answered = False
        try:
            result = await self._once(req)
            answered = True
            return result
        finally:
            _TICKET.reset(context)
            limits.release(ticket, answered)

    async def complete(self, req: ChatRequest) -> ChatResult | RequestFailure:
        """One request with its retries; raises BackendError when the server refuses the
        credentials (nothing else will get through either)."""
        attempts = 0
        try:
            async for attempt in AsyncRetrying(**self._retrying):
                with attempt:
                    attempts += 1
                    result = await self._attempt(req)
                    self._answered = True
                    return result
        except openai.APIStatusError as exc:
            if exc.status_code == 401 or (exc.status_code == 403 and not self._answered):
                raise auth_error(self.server, exc.status_code, exc.message) from None
            refused = refusal_of(exc)
            if refused is not None:  # every other request would be refused the same way
                raise dialects.refusal_error(
                    self.server, req.model, self.dialect(req.model), exc, refused,
                    self.cache_path,
                ) from None  # fmt: skip
            return RequestFailure(describe_error(exc), attempts, transient=is_transient(exc))
        except Exception as exc:
            return RequestFailure(describe_error(exc), attempts, transient=is_transient(exc))
        raise AssertionError("unreachable")  # pragma: no cover

    @property
    def window(self) -> int:
        if self.server.batch:  # a round of batches gathers this many (openai_batch.py)
            return self.server.batch_window
        # enough queued behind the workers that none waits while the runner refills
        return 4 * self.server.max_concurrency

    async def stream(
        self, feed: RequestFeed
    ) -> AsyncIterator[tuple[Any, ChatResult | RequestFailure]]:
        """A fixed pool of ``max_concurrency`` workers, each taking the next request from
        the feed as soon as its last one is answered; with ``backend.openai.batch``, files
        through the Batch API (pipeline/backends/openai/batch.py)."""
        if self.server.batch:
            async for item in self._batches().stream(feed):
                yield item
            return
        out: asyncio.Queue[Any] = asyncio.Queue()
        finished = object()
        first = await feed.get()
        if first is None:
            return
        # reached only when a request is not cached: a fully cached stage needs no server
        await asyncio.to_thread(check_reachable, self.server)
        waiting = [first]

        async def worker() -> None:
            try:
                while (item := waiting.pop() if waiting else await feed.get()) is not None:
                    token, req = item
                    out.put_nowait((token, await self.complete(req)))
            except BackendError as exc:  # refused credentials: raised by the consumer below
                out.put_nowait(exc)
            finally:
                out.put_nowait(finished)

        n = self.server.max_concurrency
        workers = [asyncio.create_task(worker()) for _ in range(n)]
        try:
            ended = 0
            while ended < n:
                item = await out.get()
                if item is finished:
                    ended += 1
                    continue
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            for w in workers:
                w.cancel()
            await asyncio.gather(*workers, return_exceptions=True)

    async def run(
        self, requests: Sequence[ChatRequest]
    ) -> AsyncIterator[tuple[int, ChatResult | RequestFailure]]:
        feed = RequestFeed()
        for i, req in enumerate(requests):
            feed.put(i, req)
        feed.close()
        async for i, res in self.stream(feed):
            yield i, res

    async def aclose(self) -> None:
        await self.client.close()

    # the run directory's folder of Batch API records (set by build from the run's cache)
    batch_folder: Path | None = None

    def _batches(self) -> BatchRunner:
        if self.batch_folder is None:
            raise BackendError(
                "backend.openai.batch needs a run directory to record its batches in; "
                "run it through `prb run`"
            )
        return BatchRunner(
            self.cfg,
            self.client,
            self._retrying,
            self.batch_folder,
            body=self._batch_body,
            answer=lambda req, result: self.dialect(req.model).answer(req, self._reasoned(result)),
        )

    def _batch_body(self, req: ChatRequest) -> dict[str, Any]:
        """A batch line's body in the server's dialect (the same body a request sent one by
        one gets). A dialect that asks for ``n`` answers as ``n`` requests has no one line
        for the request: batch mode cannot send it."""
        bodies = self._bodies(req)
        if len(bodies) != 1:
            raise BackendError(
                f"the server at {plain_url(self.server.base_url)} does not serve n > 1 for "
                f"{req.model}, and batch mode sends one line per request: set "
                "backend.openai.batch=false, or responses.n=1"
            )
        return bodies[0]

    @classmethod
    def build(
        cls,
        cfg: BackendSection,
        *,
        cache_path: Path | None = None,
        resolve: Resolve | None = None,
    ) -> OpenAIBackend:
        backend = cls(cfg, cache_path=cache_path)
        if cache_path is not None:  # the batches are recorded beside the run's cache
            backend.batch_folder = RunDir(cache_path.parent).openai_batches
        return backend

    # ---- the kind ----------------------------------------------------------------------
    @classmethod
    def preflight(
        cls, cfg: BackendSection, *, resolve: Resolve | None = None, cached: bool = False
    ) -> str | None:
        # the server is asked before the first request again, not only here: a stage
        # whose answers are all cached needs no server
        try:
            check_reachable(cfg.openai)
        except BackendError as exc:
            if not cached:
                raise
            return f"{exc} Continuing with the answers in the run's cache."
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
        # what the server takes joins the identity only where it differs from the body
        # every server took before (pipeline/backends/openai/dialects.py)
        identity = server_identity(cfg.openai, models, cls.name)
        return dialects.identify(identity, cfg.openai, models, cache_path)

    @classmethod
    def describe(cls, identity: dict[str, Any]) -> str:
        return describe_server(identity)

    @classmethod
    def warnings(cls, identity: dict[str, Any]) -> list[str]:
        listed = identity.get("listed") or []
        missing = [n for n, m in (identity.get("models") or {}).items() if m is None]
        if not listed or not missing:
            return []
        names = ", ".join(repr(n) for n in missing)
        return [
            f"the server at {identity.get('url')} does not list the model {names} (it lists "
            f"{', '.join(repr(x) for x in listed)}); a server that answers any name with the "
            "model it has (llama-cpp-python's does) has its answers recorded under the name "
            "asked: set backend.model to a name it lists, or start it with --model_alias NAME"
        ]

    @classmethod
    def batch_priced(cls, cfg: BackendSection) -> bool:
        return cfg.openai.batch

    @classmethod
    def token_counter(
        cls, cfg: BackendSection, model: str, resolve: Resolve | None = None
    ) -> tuple[TokenCount | None, list[str]]:
        """A model named by its .gguf file, as a server such as llama.cpp's may be asked
        for it, is counted with the file's own tokenizer (pipeline/backends/gguf.py)."""
        if model.endswith(".gguf"):
            path = Path(model).expanduser()
            path = (resolve(path) if resolve else path) or path
            if path.is_file():
                return gguf_counter_notes(path)
        return None, []

    @classmethod
    def asked(cls, cfg: BackendSection) -> dict[str, Any]:
        return {"backend": cls.name, "url": plain_url(cfg.openai.base_url)}

    @classmethod
    def as_sent(cls, identity: dict[str, Any]) -> tuple[AsSent, list[str]]:
        return dialects.sending(identity)  # the server's recorded dialects

    @classmethod
    def planning(
        cls, schemas: Callable[[], list[dict[str, Any]]]
    ) -> AbstractContextManager[list[str]]:
        return dialects.planning(schemas)


def server_identity(cfg: OpenAISettings, models: Sequence[str], kind: str) -> dict[str, Any]:
    """What a server answers as (pipeline/backends/identity.py): its URL without
    credentials and, for each model the run asks for, the entry it reports at /models;
    or the project's stand-in, which reports itself so."""
    # schemas sent with their string bounds (backend.openai.schema_bounds): answers made
    # under another grammar are another backend's; so are a reasoning model's answers read
    # another way (backend.openai.reasoning)
    bounds: dict[str, Any] = {SCHEMA_BOUNDS: True} if cfg.schema_bounds else {}
    record = cfg.reasoning.record()
    if record is not None:
        bounds["reasoning"] = record
    listed = list_models(cfg)
    by_id = {m.get("id"): m for m in listed if isinstance(m, dict)}
    for entry in by_id.values():
        if entry.get("owned_by") == STANDIN_OWNER:
            return {**standin_identity(entry), **bounds}
    reported: dict[str, dict[str, Any] | None] = {}
    for name in sorted(set(models)):
        m = by_id.get(name)
        reported[name] = (
            {k: m.get(k) for k in ("id", "root", "owned_by")} if isinstance(m, dict) else None
        )
    out: dict[str, Any] = {
        "kind": kind,
        "url": plain_url(str(cfg.base_url)),
        "models": reported,
        "model_output": True,
        **bounds,
    }
    if by_id and None in reported.values():
        # a model asked for that the server does not list: what it does list is part of
        # what answered (llama-cpp-python's server answers any name with its one model)
        out["listed"] = sorted(str(k) for k in by_id)[:10]
    return out


def describe_server(identity: dict[str, Any]) -> str:
    models = identity.get("models") or {}
    listed = identity.get("listed") or []
    unlisted = f"nothing: the server lists {', '.join(listed)}" if listed else "nothing"
    shown = ", ".join(
        f"{name} (reported as {(m or {}).get('id') or unlisted})" for name, m in models.items()
    )
    text = f"the server at {identity.get('url')}: {shown or 'no model reported'}"
    for name, record in sorted((identity.get("dialect") or {}).items()):
        d = dialects.Dialect.from_record(record)
        if d is not None:
            text += f"; {name}: {d.describe()}"
    if identity.get(SCHEMA_BOUNDS):
        text += "; schemas sent with their string bounds"
    return text + reasoning.describe(identity.get("reasoning"))
