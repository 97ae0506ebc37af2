"""Ray Data's LLM module (``backend.name: ray``), for when one machine is not enough.

A stage's pending requests become a Ray dataset, one row per request (per sample with the
vLLM engine), split into blocks of ``ray.batch_size`` rows so that every batch is its own
Ray task; ``ray.data.llm.build_processor`` maps it through ``ray.replicas`` workers, and
rows are read back in a worker thread as each batch completes, so the runner caches every
answer as it arrives and a killed run loses at most the batches in flight.

``ray.engine: http`` sends each row to ``backend.openai.base_url`` with Ray's HTTP processor (any
OpenAI-compatible server, e.g. one ``vllm serve`` per GPU behind a load balancer).
``ray.engine: vllm`` runs one vLLM engine per replica on the cluster's GPUs.

Ray 2.60's HTTP stage has three habits worked around through its ``session_factory``
(:class:`ReplySession`), each checked in ``tests/test_ray_backend.py``:

* it awaits the requests of a batch one after the other; the session starts each request
  when the stage creates it, so a worker has a whole batch in flight;
* rows cross Arrow blocks between stages, which infers one struct type per column: a key
  missing from one request becomes ``null`` in the others and ints become floats next to
  a null (``seed: 5`` reaches the server as ``5.0``, changing the answer). The request body
  therefore travels as one JSON string and the reply comes back as flat fields;
* a request still failing after its retries, or a body that is not JSON, raises and fails
  the whole dataset. The session retries the statuses our ``openai`` backend treats as
  transient (by reporting them to Ray as 503, which Ray retries with its backoff) and
  turns the last failed attempt into a reply row, so a failure is one request's, with its
  reason. Ray's backoff doubles ``backoff_initial_s`` per retry; it ignores Retry-After
  and ``backoff_max_s``.

``ray`` is imported only when this backend is built. A local Ray (``ray.address`` unset) is
started on first use, bound to loopback with no dashboard, and shut down by ``aclose()``;
a Ray the backend did not start is left running.

Threads: rows are read in a worker thread, and Ray Data runs its own executor thread. The
first dataset a process runs imports about 120 more Ray Data modules (planner, optimizer
rules, the streaming executor...), each taking the logging module's lock while holding its
import lock; done in the worker thread, next to threads that log, that deadlocked a CI run
for good. They are imported on the main thread when the backend is built
(:func:`import_execution_modules`), and a wait for rows longer than
``ray.result_timeout_s`` fails the stage with one line instead of hanging.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib
import json
import math
import os
import sys
import threading
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

from pipeline.backends.identity import plain_url
from pipeline.backends.vllm_backend import describe_engine, engine_identity, engine_kwargs
from pipeline.core.errors import BackendError
from pipeline.kinds.backend import Backend, BackendSection, Resolve
from pipeline.kinds.settings import RaySettings
from pipeline.types.chat import ChatRequest, ChatResult, Choice, RequestFailure

INSTALL_HINT = "pip install 'personalized-rewardbench[ray]'"
GPU_INSTALL_HINT = "pip install 'personalized-rewardbench[ray-gpu]'"  # ray[llm] pins its vLLM
# The HTTP workers wait on the network: a whole CPU each would cap replicas at the CPU count
# for nothing. The preprocessing asks for the same share so Ray fuses it into the worker
# (measured here: 17 batches/s of 8 rows fused, 4 as separate tasks); the postprocessing
# only reshapes a few dicts.
HTTP_WORKER_CPUS = 0.25
MAP_TASK_CPUS = 0.1
# Statuses retried like the openai backend does (with every 5xx); other 4xx are final.
_TRANSIENT_STATUS = {408, 409, 425, 429}
_RETRY_STATUS = 503  # one Ray's HTTP stage retries: how the session asks for another attempt
_END = object()
# What Ray Data imports the first time a dataset executes, named by the modules that pull
# in the rest (Ray 2.60; tests/test_ray_backend.py checks that a run imports nothing more
# off the main thread, so a Ray that moves one is caught there).
EXECUTION_MODULES = (
    "ray.data._internal.execution.streaming_executor",
    "ray.data._internal.planner.planner",
    "ray.data._internal.logical.optimizers",
    "ray.data._internal.execution.callbacks.execution_idx_update_callback",
    "ray.data._internal.execution.callbacks.insert_issue_detectors",
    "ray.data._internal.execution.callbacks.resource_allocator_prometheus_callback",
    "ray.data.extensions",
)


def import_execution_modules() -> None:
    """Import what Ray Data would import on first execution, here, on the calling (main)
    thread, before any thread of ours or Ray Data's exists to race with (module doc)."""
    for name in EXECUTION_MODULES:
        with contextlib.suppress(ImportError):  # moved in another Ray: the test names it
            importlib.import_module(name)


def import_ray() -> tuple[Any, Any]:
    """``(ray, ray.data.llm)``, or a BackendError naming the extra to install."""
    try:
        ray = importlib.import_module("ray")
        # import_module, not ``from ray.data import llm``: it honours sys.modules, so tests
        # can stand in a fake ``ray.data.llm``.
        llm = importlib.import_module("ray.data.llm")
    except ImportError as exc:
        raise BackendError(
            f"the ray backend needs Ray Data's LLM module, which is not importable ({exc}); "
            f"install the extra: {INSTALL_HINT}"
        ) from None
    return ray, llm


def prefer_loopback() -> None:
    """Make a local Ray started from this process listen on 127.0.0.1 only.

    Ray turns ``_node_ip_address="127.0.0.1"`` into the machine's address and binds its
    servers to every interface, unless cluster mode is off, which ``ray`` reads from this
    variable at import (it is named for macOS and Windows, where off is the default).
    """
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # a local Ray phones no one
    constants = sys.modules.get("ray._private.ray_constants")
    if constants is not None:  # ray was imported before: its constant is already read
        setattr(constants, "ENABLE_RAY_CLUSTER", False)  # noqa: B010 - a module constant


def init_local_ray(num_cpus: int | None = None) -> bool:
    """Start a local, loopback-only Ray with no dashboard unless one is running.

    Returns whether it started one (and so should shut it down). Tests and benchmarks use
    it to share one Ray between several backends.
    """
    prefer_loopback()
    ray, _ = import_ray()
    if ray.is_initialized():
        return False
    ray.init(
        num_cpus=num_cpus,
        include_dashboard=False,
        _node_ip_address="127.0.0.1",
        # Worker logs stay in Ray's session directory: failures come back as exceptions,
        # and forwarded worker chatter would scroll over the progress bar.
        log_to_driver=False,
    )
    return True


# -- rows for the HTTP processor ---------------------------------------------------------------
def http_rows(requests: Sequence[ChatRequest]) -> list[dict[str, Any]]:
    """One row per request: its index and its body as a JSON string (see the module doc)."""
    return [{"index": i, "body": json.dumps(r.openai_body())} for i, r in enumerate(requests)]


def _http_preprocess(row: dict[str, Any]) -> dict[str, Any]:
    # The payload Ray posts: ReplySession.post unwraps it and sends ``body`` as is.
    return {"payload": {"index": row["index"], "body": row["body"]}}


def _http_postprocess(row: dict[str, Any]) -> dict[str, Any]:
    return {"index": row["index"], **row["http_response"]}


def _error_message(text: str) -> str:
    try:
        err = json.loads(text).get("error")
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])
    except (ValueError, AttributeError):
        pass
    return text.strip()[:200] or "(empty body)"


def reply_outcome(
    status: int, text: str, error: str = "", attempts: int = 1, model: str = ""
) -> ChatResult | RequestFailure:
    """What one HTTP reply means: an answer, or a failure with its reason."""
    if error:  # the last attempt never got an answer (timeout, connection refused...)
        return RequestFailure(error[:500], attempts, transient=True)
    if not 200 <= status < 300:
        transient = status in _TRANSIENT_STATUS or status >= 500
        reason = f"HTTP {status}: {_error_message(text)}"[:500]
        return RequestFailure(reason, attempts, transient=transient)
    try:
        body = json.loads(text)
        choices = body["choices"]
        messages = [c["message"] for c in choices]
    except (ValueError, TypeError, KeyError) as exc:
        # a glitch of the server, not the request's fault, as in the openai backend
        reason = f"{type(exc).__name__}: the server's answer is not a chat completion"
        return RequestFailure(reason, attempts, transient=True)
    if not choices or any(m.get("content") is None for m in messages):
        return RequestFailure("EmptyAnswer: the server returned no content", attempts, True)
    usage = body.get("usage") or {}
    return ChatResult(
        choices=[
            Choice(m["content"], c.get("finish_reason") or "stop")
            for c, m in zip(choices, messages, strict=True)
        ],
        prompt_tokens=usage.get("prompt_tokens") or 0,
        completion_tokens=usage.get("completion_tokens") or 0,
        model=body.get("model") or model,
    )


class _Reply:
    """What Ray's HTTP stage sees of a response: status, reason and ``json()``."""

    def __init__(self, status: int, fields: dict[str, Any]) -> None:
        self.status = status
        self.reason = "retry" if status == _RETRY_STATUS else "OK"
        self._fields = fields

    async def __aenter__(self) -> _Reply:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    async def json(self) -> dict[str, Any]:
        # flat fields of fixed types, so Arrow keeps them as they are
        return self._fields


class ReplySession:
    """The aiohttp session Ray's HTTP stage opens per batch (its ``session_factory``).

    ``post`` starts the request at once and returns a task, so a batch's requests run
    concurrently. It counts attempts per row: until the last, a transient failure is
    reported to Ray as a 503 (Ray waits and posts again); the last attempt, and any final
    answer, come back as a row with the real status, body and error.
    """

    def __init__(self, *, timeout_s: float, max_attempts: int) -> None:
        import aiohttp

        self._aiohttp = aiohttp
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s))
        self._max_attempts = max_attempts
        self._attempts: dict[int, int] = {}
        self._tasks: list[asyncio.Task] = []

    async def __aenter__(self) -> ReplySession:
        return self

    async def __aexit__(self, *exc: object) -> None:
        for task in self._tasks:  # left over only when the batch failed half-way
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._session.close()

    def post(self, url: str, *, headers: Any = None, data: Any = None, **_: Any) -> asyncio.Task:
        envelope = json.loads(data)
        index = envelope["index"]
        attempt = self._attempts[index] = self._attempts.get(index, 0) + 1
        task = asyncio.ensure_future(self._send(url, headers, envelope["body"], attempt))
        self._tasks.append(task)
        return task

    async def _send(self, url: str, headers: Any, body: str, attempt: int) -> _Reply:
        last = attempt >= self._max_attempts
        fields: dict[str, Any] = {"status": 0, "text": "", "error": "", "attempts": attempt}
        try:
            async with self._session.post(url, headers=headers, data=body) as resp:
                # bytes, decoded leniently: a body that is not UTF-8 is a bad answer, not an
                # exception that would fail the whole batch
                raw = await resp.read()
                fields["status"], fields["text"] = resp.status, raw.decode("utf-8", "replace")
        except (asyncio.TimeoutError, self._aiohttp.ClientError) as exc:
            fields["error"] = f"{type(exc).__name__}: {exc}"[:500]
            return _Reply(200 if last else _RETRY_STATUS, fields)
        outcome = reply_outcome(fields["status"], fields["text"], attempts=attempt)
        retry = isinstance(outcome, RequestFailure) and outcome.transient and not last
        return _Reply(_RETRY_STATUS if retry else 200, fields)


# -- rows for the vLLM engine processor --------------------------------------------------------
def vllm_rows(requests: Sequence[ChatRequest]) -> list[dict[str, Any]]:
    """One row per sample: Ray's vLLM stage keeps only the first completion of a prompt, so
    a request for ``n`` samples becomes ``n`` rows with seeds ``seed, seed+1, ...``."""
    rows = []
    for i, req in enumerate(requests):
        for j in range(req.n):
            params: dict[str, Any] = {
                "n": 1,
                "temperature": float(req.temperature),
                "top_p": float(req.top_p),
                "max_tokens": req.max_tokens,
            }
            if req.seed is not None:
                params["seed"] = req.seed + j
            if req.json_schema is not None:
                # Ray builds vllm's StructuredOutputsParams(**this); a JSON string keeps the
                # schema's arbitrary nesting out of Arrow's type inference.
                params["structured_outputs"] = {"json": json.dumps(req.json_schema)}
            rows.append(
                {
                    "index": i,
                    "sample": j,
                    "messages": req.message_dicts(),
                    "sampling_params": params,
                }
            )
    return rows


def _vllm_postprocess(row: dict[str, Any]) -> dict[str, Any]:
    return {
        "index": row["index"],
        "sample": row["sample"],
        "text": row["generated_text"],
        "prompt_tokens": row["num_input_tokens"],
        "completion_tokens": row["num_generated_tokens"],
    }


def _describe(exc: BaseException) -> str:
    # Ray wraps worker errors in a long traceback; its last line names the cause.
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    return f"{type(exc).__name__}: {lines[-1] if lines else ''}"[:500]


class RayBackend(Backend):
    """Answers chat requests with Ray Data's LLM processors, streamed back per batch."""

    name = "ray"
    settings = RaySettings
    extra = "ray"
    extra_module = "ray"
    libraries = ("ray",)

    def __init__(self, cfg: BackendSection) -> None:
        """``cfg`` is the config's ``backend`` section."""
        self.cfg = cfg
        self.rc = cfg.ray
        if self.rc.engine == "vllm":
            self._check_gpus()
        if self.rc.address is None:
            prefer_loopback()  # before the import: ray reads it then
        self._ray, self._llm = import_ray()
        import_execution_modules()
        self._started_ray = False
        self._answered = False  # a 403 after an answer is one request's, not the key's
        if self.rc.engine == "http":
            from pipeline.backends.openai.backend import check_reachable

            check_reachable(cfg.openai)  # fail in a second, not after starting Ray

    def _check_gpus(self) -> None:
        v = self.cfg.vllm
        per_engine = v.tensor_parallel_size * v.engine_args.get("pipeline_parallel_size", 1)
        if self.rc.num_gpus_per_replica != per_engine:
            raise BackendError(
                f"ray.num_gpus_per_replica is {self.rc.num_gpus_per_replica}, but a vLLM engine "
                f"with tensor_parallel_size x pipeline_parallel_size = {per_engine} takes "
                f"{per_engine} GPUs under Ray Data; make them equal"
            )

    # -- Ray ---------------------------------------------------------------------------------
    def _ensure_ray(self) -> None:
        ray = self._ray
        if ray.is_initialized():
            pass
        elif self.rc.address is None:
            self._started_ray = init_local_ray(self.rc.num_cpus)
        else:
            import pipeline

            ray.init(
                address=self.rc.address,
                include_dashboard=False,
                log_to_driver=False,
                # workers elsewhere import this module (the session, the row mappers)
                runtime_env={"py_modules": [pipeline]},
            )
            self._started_ray = True  # our connection: aclose() disconnects it
        # the runner draws its own progress bar; Ray's would log a line every few seconds
        ray.data.DataContext.get_current().enable_progress_bars = False

    async def aclose(self) -> None:
        """Shut down the Ray this backend started (a local one, or its connection)."""
        if self._started_ray and self._ray.is_initialized():
            self._ray.shutdown()
        self._started_ray = False

    # -- processors --------------------------------------------------------------------------
    def build_processor(self, blocks: int | None = None) -> Any:
        """The Ray Data LLM processor for ``ray.engine``, built from the config, for a
        dataset of ``blocks`` blocks (one per batch)."""
        rc, llm = self.rc, self._llm
        # (n, n): a fixed pool of n workers. A bare n means an autoscaling pool from 1, which
        # starts one worker (one model load, for vLLM) and adds the others while work waits.
        pool = (rc.replicas, rc.replicas)
        # Each postprocessing task in flight takes a worker process: uncapped, Ray started
        # one per queued batch, and on 2 cores that delayed the first answer by ~25 s.
        post = {"num_cpus": MAP_TASK_CPUS, "concurrency": min(rc.replicas, blocks or rc.replicas)}
        if rc.engine == "http":
            from pipeline.backends.openai.backend import endpoint

            # the key (or the URL's credentials) is read here and handed to Ray's workers;
            # never logged or stored by us
            ep = endpoint(self.cfg.openai)
            config = llm.HttpRequestProcessorConfig(
                url=ep.url("/chat/completions"),
                headers=dict(ep.headers),
                batch_size=rc.batch_size,
                concurrency=pool,
                max_retries=self.cfg.max_attempts - 1,
                base_retry_wait_time_in_s=self.cfg.backoff_initial_s,
                session_factory=functools.partial(
                    ReplySession,
                    timeout_s=self.cfg.openai.timeout_s,
                    max_attempts=self.cfg.max_attempts,
                ),
                http_request_stage={"num_cpus": HTTP_WORKER_CPUS},
            )
            return llm.build_processor(
                config,
                preprocess=_http_preprocess,
                postprocess=_http_postprocess,
                preprocess_map_kwargs={"num_cpus": HTTP_WORKER_CPUS},
                postprocess_map_kwargs=post,
            )
        kwargs = engine_kwargs(self.cfg)
        model = kwargs.pop("model")  # Ray takes it as model_source and warns if repeated
        config = llm.vLLMEngineProcessorConfig(
            model_source=model,
            engine_kwargs=kwargs,
            batch_size=rc.batch_size,
            concurrency=pool,
            # a failed row comes back with __inference_error__ instead of failing the dataset
            should_continue_on_error=True,
        )
        try:
            return llm.build_processor(
                config, postprocess=_vllm_postprocess, postprocess_map_kwargs=post
            )
        except ImportError as exc:  # Ray imports transformers and vLLM only at this point
            raise BackendError(
                f"ray.engine vllm needs vLLM and transformers where the run starts ({exc}); "
                f"install the extra: {GPU_INSTALL_HINT}"
            ) from None

    def _dataset(self, rows: list[dict[str, Any]]) -> Any:
        # One block per batch, so each batch is its own task and its rows come back as soon
        # as it is done, instead of with everything else that task was given.
        blocks = math.ceil(len(rows) / self.rc.batch_size)
        ds = self._ray.data.from_items(rows, override_num_blocks=blocks)
        return self.build_processor(blocks)(ds)

    async def _rows_of(self, ds: Any) -> AsyncIterator[dict[str, Any]]:
        """The dataset's output rows as they complete; iteration blocks, so it runs in a
        thread that hands each row to the event loop."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[Any, BaseException | None]] = asyncio.Queue()
        stop = threading.Event()

        def put(item: tuple[Any, BaseException | None]) -> None:
            try:
                loop.call_soon_threadsafe(queue.put_nowait, item)
            except RuntimeError:  # the loop is closed: nobody listens any more
                stop.set()

        def pump() -> None:
            try:
                for row in ds.iter_rows():
                    if stop.is_set():
                        return
                    put((row, None))
            except Exception as exc:
                put((None, exc))
            finally:
                put((_END, None))

        threading.Thread(target=pump, name="ray-backend-rows", daemon=True).start()
        limit = self.rc.result_timeout_s
        try:
            while True:
                try:
                    row, exc = await asyncio.wait_for(queue.get(), limit)
                except asyncio.TimeoutError:
                    raise BackendError(
                        f"ray: no answer came back for {limit:g} s; Ray looks stuck (see "
                        "`ray status` and the logs under /tmp/ray/session_latest/logs). Run "
                        "the same command again: answers already received are kept. If one "
                        "batch can take that long, raise backend.ray.result_timeout_s"
                    ) from None
                if exc is not None:
                    raise exc
                if row is _END:
                    return
                yield row
        finally:
            stop.set()

    # -- run ---------------------------------------------------------------------------------
    async def run(
        self, requests: Sequence[ChatRequest]
    ) -> AsyncIterator[tuple[int, ChatResult | RequestFailure]]:
        if not requests:
            return
        self._ensure_ray()
        if self.rc.engine == "http":
            groups = [list(range(len(requests)))]
        else:
            # Arrow turns a seed column holding ints and nulls into floats, which vLLM
            # rejects: seeded and unseeded requests go in separate datasets.
            seeded = [i for i, r in enumerate(requests) if r.seed is not None]
            unseeded = [i for i, r in enumerate(requests) if r.seed is None]
            groups = [g for g in (seeded, unseeded) if g]
        for group in groups:
            async for j, outcome in self._run_group([requests[i] for i in group]):
                yield group[j], outcome

    async def _run_group(
        self, requests: Sequence[ChatRequest]
    ) -> AsyncIterator[tuple[int, ChatResult | RequestFailure]]:
        http = self.rc.engine == "http"
        # built outside the try: a config Ray rejects is an error, not N failed requests
        ds = self._dataset(http_rows(requests) if http else vllm_rows(requests))
        done: set[int] = set()
        samples: dict[int, dict[int, dict[str, Any]]] = {}
        try:
            async for row in self._rows_of(ds):
                i = int(row["index"])
                if i in done:
                    continue
                outcome: ChatResult | RequestFailure | None
                if http:
                    status, attempts = int(row["status"]), int(row["attempts"])
                    if status == 401 or (status == 403 and not self._answered):
                        from pipeline.backends.openai.backend import auth_error

                        raise auth_error(self.cfg.openai, status, _error_message(row["text"]))
                    outcome = reply_outcome(
                        status, row["text"], row["error"], attempts, self.cfg.model
                    )
                    self._answered = self._answered or isinstance(outcome, ChatResult)
                else:
                    outcome = self._gather(requests[i], samples.setdefault(i, {}), row)
                    if outcome is None:
                        continue  # more samples of this request to come
                done.add(i)
                yield i, outcome
        except BackendError:
            raise  # refused credentials or a stuck Ray: the stage stops with this line
        except Exception as exc:
            # The dataset failed (a worker died, a batch raised): what has not come back
            # is recorded as failed and retried by the next run.
            reason = f"ray: {_describe(exc)}"
            for i in range(len(requests)):
                if i not in done:
                    done.add(i)
                    yield i, RequestFailure(reason, attempts=1, transient=True)
        for i in range(len(requests)):
            if i not in done:  # never expected; a request must not vanish silently
                yield i, RequestFailure("ray: the dataset returned no row for this request")

    # ---- the kind ----------------------------------------------------------------------
    @classmethod
    def install_hint(cls) -> str:
        return INSTALL_HINT

    @classmethod
    def preflight(
        cls, cfg: BackendSection, *, resolve: Resolve | None = None, cached: bool = False
    ) -> str | None:
        cls.check_installed(cfg)
        section = "openai" if cfg.ray.engine == "http" else "vllm"
        if getattr(cfg, section).reasoning.enabled:
            # its answers would come back with the reasoning in them
            raise BackendError(
                f"backend.{section}.reasoning.enabled is true, but the ray backend does not "
                "take a reasoning model's reasoning out of its answers; use backend.name "
                f"{section} for a reasoning model (docs/backends.md, 'Reasoning models')"
            )
        if cfg.ray.engine == "http":
            from pipeline.backends.openai.backend import check_reachable
            from pipeline.backends.openai.dialects import only_todays_body

            # the http engine sends each request's own body as it is (no dialects)
            if (sent := only_todays_body(cfg.openai)) is not None:
                raise BackendError(
                    "backend.openai.structured_output is "
                    f"{cfg.openai.structured_output}, but the ray backend's http engine "
                    f"sends {sent} only; use backend.name openai for another dialect, "
                    "or leave it at auto"
                )
            check_reachable(cfg.openai)
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
        if cfg.ray.engine == "http":
            from pipeline.backends.openai.backend import server_identity

            return server_identity(cfg.openai, models, "ray-http")
        return engine_identity(cfg, "ray-vllm")

    @classmethod
    def describe(cls, identity: dict[str, Any]) -> str:
        if identity.get("kind") == "ray-http":
            from pipeline.backends.openai.backend import describe_server

            return describe_server(identity)
        return describe_engine(identity)

    @classmethod
    def asked(cls, cfg: BackendSection) -> dict[str, Any]:
        return {"backend": cls.name, "url": plain_url(cfg.openai.base_url)}

    def _gather(
        self, req: ChatRequest, got: dict[int, dict[str, Any]], row: dict[str, Any]
    ) -> ChatResult | RequestFailure | None:
        """Collect one vLLM sample; the request's outcome once all ``n`` are in."""
        error = row.get("__inference_error__") or ""
        if error:
            return RequestFailure(f"vllm: {error}"[:500], attempts=1, transient=True)
        got[int(row["sample"])] = row
        if len(got) < req.n:
            return None
        ordered = [got[j] for j in range(req.n)]
        return ChatResult(
            # Ray's row carries no finish reason: the token count tells a cut-off answer
            choices=[
                Choice(s["text"], "length" if s["completion_tokens"] >= req.max_tokens else "stop")
                for s in ordered
            ],
            prompt_tokens=int(ordered[0]["prompt_tokens"]),
            completion_tokens=sum(int(s["completion_tokens"]) for s in ordered),
            model=self.cfg.model,
        )
