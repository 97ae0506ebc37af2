"""vLLM's offline engine, in-process on the GPU (``backend.name: vllm``).

The engine is built once per process and shared: stages open and close a backend each,
but loading weights and capturing CUDA graphs costs minutes, so engines live in a
module-level cache keyed by their construction arguments and survive ``aclose()``.
``shutdown_engines()`` drops them.

Requests are sorted so prompts that share a prefix (same system prompt, same user's
profile, same question) sit next to each other: with prefix caching on, vLLM then computes
that shared KV cache once instead of once per sample. They are sent in chunks of
``backend.vllm.chunk_size``, one batched ``LLM.chat`` call per chunk: a chunk bounds the
memory held by pending prompts and outputs, and since answers reach the request cache as
each chunk returns, a crash loses at most one chunk of work.

Engines are shut down at process exit (an ``atexit`` hook registered with the first engine):
left to garbage collection, vLLM's engine-core process dies before its client and every run
ends with "engine core exited unexpectedly".

``vllm`` is imported only when this backend is built, so the package runs without a GPU.
The backend was verified against vLLM ``VERIFIED_VLLM_VERSION`` (see docs/vllm.md).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import gc
import json
import threading
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from pipeline.backends import reasoning
from pipeline.backends.identity import file_sha256, folder_sha256, version
from pipeline.core.errors import BackendError
from pipeline.kinds.backend import Backend, BackendSection, Resolve
from pipeline.kinds.settings import VLLMSettings
from pipeline.types.chat import ChatRequest, ChatResult, Choice, RequestFailure, reasoning_allowance
from pipeline.types.schemas import SCHEMA_BOUNDS

# The vLLM release this backend's calls were checked against on a GPU (LLM.chat with a list
# of SamplingParams, n, seeds, StructuredOutputsParams, finish reasons, token counts, and the
# engine-core shutdown below). Recorded in each run's environment.json.
VERIFIED_VLLM_VERSION = "0.26.0"

# the README's line (docs/vllm.md): the machine's torch as a constraint, so that pip stops
# instead of replacing it with the torch vLLM's wheel pins
INSTALL_LINE = (
    "python -c \"import torch; print('torch=='+torch.__version__.split('+')[0])\" "
    "> keep-torch.txt && pip install 'personalized-rewardbench[vllm]' -c keep-torch.txt"
)
_INSTALL_HINT = (
    f"install the extra: {INSTALL_LINE} (needs a CUDA GPU), "
    "or use backend.name: openai against a `vllm serve` server"
)


class _Engine:
    """A shared ``vllm.LLM`` and the lock that serialises calls into it.

    ``LLM`` is not thread-safe; two backends sharing one engine (or a run that overlaps
    another) must not call ``chat`` at the same time from different worker threads.
    """

    def __init__(self, llm: Any) -> None:
        self.llm = llm
        self.lock = threading.Lock()


_ENGINES: dict[str, _Engine] = {}
_ENGINES_LOCK = threading.Lock()
_ATEXIT_REGISTERED = False


def engine_kwargs(cfg: BackendSection) -> dict[str, Any]:
    """Keyword arguments for ``vllm.LLM(...)`` from the config's ``backend`` section."""
    v = cfg.vllm
    kw: dict[str, Any] = {
        "model": cfg.model,
        "tensor_parallel_size": v.tensor_parallel_size,
        "gpu_memory_utilization": v.gpu_memory_utilization,
        "dtype": v.dtype,
        "enable_prefix_caching": v.enable_prefix_caching,
        "max_num_seqs": v.max_num_seqs,
        # the grammar engine for JSON answers (docs/structured-output.md)
        "structured_outputs_config": {"backend": v.structured_outputs_backend},
    }
    record = v.reasoning.record(parser=True)
    if record is not None and record.get("parser"):
        # a reasoning model answering JSON after its reasoning (json_mode reason_first):
        # vLLM's reasoning parser tells its structured-output manager where the reasoning
        # ends, and the grammar constrains only what follows (docs/vllm.md)
        kw["structured_outputs_config"]["reasoning_parser"] = record["parser"]
    if v.max_model_len is not None:
        kw["max_model_len"] = v.max_model_len
    # engine_args may override the named settings on purpose (escape hatch).
    kw.update(v.engine_args)
    return kw


def _engine_key(kwargs: dict[str, Any]) -> str:
    """Canonical JSON of the engine arguments: equal settings share one engine."""
    return json.dumps(kwargs, sort_keys=True, separators=(",", ":"), default=repr)


def _get_engine(vllm: Any, kwargs: dict[str, Any]) -> _Engine:
    key = _engine_key(kwargs)
    # Held while building, so two backends created at once never load the model twice.
    with _ENGINES_LOCK:
        engine = _ENGINES.get(key)
        if engine is None:
            engine = _Engine(vllm.LLM(**kwargs))
            _ENGINES[key] = engine
            _register_atexit()
        return engine


def _register_atexit() -> None:
    # Registered after vLLM is imported, so it runs before multiprocessing's own exit hook
    # (atexit runs hooks last-in first-out) while the engine-core process is still alive.
    global _ATEXIT_REGISTERED
    if not _ATEXIT_REGISTERED:
        atexit.register(shutdown_engines)
        _ATEXIT_REGISTERED = True


def _shutdown_llm(llm: Any) -> bool:
    """Stop one ``vllm.LLM``'s engine core; True if a shutdown method was found and ran.

    vLLM 0.26.0 has no ``LLM.shutdown()``; its engine client's ``shutdown()`` stops the
    engine-core process and detaches the finaliser, so the liveness monitor exits quietly
    instead of logging "engine core exited unexpectedly". A later ``LLM.shutdown()`` is used
    if present.
    """
    stop = getattr(llm, "shutdown", None)
    if not callable(stop):
        core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
        stop = getattr(core, "shutdown", None)
    if not callable(stop):
        return False
    stop()
    return True


def shutdown_engines() -> int:
    """Shut down and drop every cached engine so its GPU memory is freed; returns how many.

    Runs at process exit too; a failing shutdown must not hide the run's own exit status,
    so its error is suppressed (the process is ending anyway).
    """
    with _ENGINES_LOCK:
        engines = list(_ENGINES.values())
        _ENGINES.clear()
    for engine in engines:
        # A chat still running (an interrupted run) holds the lock: wait a little, then stop
        # the engine under it anyway rather than hang the exit.
        got = engine.lock.acquire(timeout=5)
        try:
            with contextlib.suppress(Exception):
                _shutdown_llm(engine.llm)
        finally:
            if got:
                engine.lock.release()
    n = len(engines)
    del engines
    gc.collect()
    return n


def _import_vllm() -> tuple[Any, Any, Any]:
    """``(vllm, SamplingParams, StructuredOutputsParams)``, or a BackendError saying why."""
    try:
        import vllm
    except ImportError as exc:
        raise BackendError(
            f"the vllm backend needs vLLM, which is not importable ({exc}); " + _INSTALL_HINT
        ) from None
    try:
        from vllm.sampling_params import StructuredOutputsParams
    except ImportError as exc:
        raise BackendError(
            f"the installed vLLM is too old for this backend ({exc}); it needs vllm>=0.10.2: "
            + _INSTALL_HINT
        ) from None
    return vllm, vllm.SamplingParams, StructuredOutputsParams


def describe_error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:500]


class VLLMBackend(Backend):
    """Answers chat requests with an in-process ``vllm.LLM``, batched per chunk."""

    name = "vllm"
    settings = VLLMSettings
    extra = "vllm"
    extra_module = "vllm"
    install_line = INSTALL_LINE + " (on a machine with a CUDA GPU)"
    failing = "the in-process vLLM engine fails them"
    libraries = ("vllm", "torch")
    throughput_benchmark = "vllm_throughput.json"
    environment = {"vllm_verified_with": VERIFIED_VLLM_VERSION}
    reasoning_parser = True  # structured_outputs_config.reasoning_parser (reason_first)
    # Extra SamplingParams keywords for every request; empty in the pipeline.
    # benchmarks/vllm_throughput.py sets ignore_eos so it and raw LLM.chat generate alike.
    extra_sampling: dict[str, Any] = {}

    def __init__(self, cfg: BackendSection) -> None:
        """``cfg`` is the config's ``backend`` section."""
        self.cfg = cfg
        # The runner hands a streaming backend ``stream_chunk`` requests per run() call and
        # keeps twice that in flight: one LLM.chat call per chunk_size requests, as before.
        self.stream_chunk = cfg.vllm.chunk_size
        vllm, self._SamplingParams, self._StructuredOutputsParams = _import_vllm()
        self.engine_kwargs = engine_kwargs(cfg)
        self._engine = _get_engine(vllm, self.engine_kwargs)
        self._reasoning = self.reasoning_record
        self._end_id: int | None = None  # the reasoning's end tag as one token, if it is
        if self._reasoning is not None:
            self._end_id = _single_token(self.llm, self._reasoning["tags"][1])

    @property
    def llm(self) -> Any:
        return self._engine.llm

    def sampling_params(self, req: ChatRequest) -> Any:
        """One ``SamplingParams`` per request: n, temperature, top_p, max_tokens, seed,
        and a JSON-schema constraint when the request carries one."""
        kw: dict[str, Any] = {
            "n": req.n,
            "temperature": req.temperature,
            "top_p": req.top_p,
            # a reasoning model's reasoning budget on top of the answer's own
            "max_tokens": req.max_tokens + reasoning_allowance(req, self._reasoning),
            "seed": req.seed,
        }
        if req.json_schema is not None:
            kw["structured_outputs"] = self._StructuredOutputsParams(json=req.json_schema)
        return self._SamplingParams(**kw, **self.extra_sampling)

    def _chat(self, chunk: Sequence[ChatRequest]) -> list[Any]:
        """The blocking batched call; runs in a worker thread."""
        with self._engine.lock:
            return list(
                self.llm.chat(
                    messages=[r.message_dicts() for r in chunk],
                    sampling_params=[self.sampling_params(r) for r in chunk],
                    use_tqdm=False,
                )
            )

    def _result(self, out: Any) -> ChatResult | RequestFailure:
        if not out.outputs:
            return RequestFailure("EmptyOutput: vLLM returned no completions", transient=True)
        choices = [Choice(o.text, o.finish_reason or "stop") for o in out.outputs]
        if self._reasoning is not None:
            # the offline engine returns the reasoning in the text: taken out here, its
            # tokens counted from the token ids (up to and with the end tag's)
            split = [reasoning.split_choice(c, self._reasoning) for c in choices]
            choices = [
                replace(c, reasoning_tokens=self._reasoning_tokens(o))
                if c.reasoning is not None
                else c
                for c, o in zip(split, out.outputs, strict=True)
            ]
        result = ChatResult(
            choices=choices,
            prompt_tokens=len(out.prompt_token_ids or []),
            completion_tokens=sum(len(o.token_ids) for o in out.outputs),
            model=self.cfg.model,
        )
        return reasoning.bound_tokens(reasoning.share_tokens(result))

    def _reasoning_tokens(self, output: Any) -> int:
        """A completion's reasoning tokens: up to and with the end tag's token, or all of
        them when the reasoning never ended; 0 (shared out by characters later) when the end
        tag is not one token of this tokenizer."""
        ids = list(output.token_ids or [])
        if self._end_id is None:
            return 0
        return ids.index(self._end_id) + 1 if self._end_id in ids else len(ids)

    async def run(
        self, requests: Sequence[ChatRequest]
    ) -> AsyncIterator[tuple[int, ChatResult | RequestFailure]]:
        # Sorting by the messages tuple groups shared prefixes (system prompt, then the
        # user's profile, then the question) so prefix caching reuses their KV cache.
        order = sorted(range(len(requests)), key=lambda i: requests[i].messages)
        size = self.cfg.vllm.chunk_size
        for start in range(0, len(order), size):
            idx = order[start : start + size]
            chunk = [requests[i] for i in idx]
            try:
                # A worker thread keeps the event loop free to commit answers and update
                # progress while the GPU works on this chunk.
                outputs = await asyncio.to_thread(self._chat, chunk)
                if len(outputs) != len(chunk):
                    raise RuntimeError(
                        f"LLM.chat returned {len(outputs)} outputs for {len(chunk)} requests"
                    )
            except Exception as exc:
                # The whole chunk fails together; later chunks still get their chance.
                reason = describe_error(exc)
                for i in idx:
                    yield i, RequestFailure(reason, attempts=1, transient=True)
                continue
            for i, out in zip(idx, outputs, strict=True):
                yield i, self._result(out)

    async def aclose(self) -> None:
        """Keeps the engine: the next stage reuses it. ``shutdown_engines()`` frees it."""
        return None

    # ---- the kind ----------------------------------------------------------------------
    @classmethod
    def identify(
        cls,
        cfg: BackendSection,
        models: Sequence[str],
        *,
        resolve: Resolve | None = None,
        cache_path: Path | None = None,
    ) -> dict[str, Any]:
        return engine_identity(cfg, cls.name)

    @classmethod
    def describe(cls, identity: dict[str, Any]) -> str:
        return describe_engine(identity)


def _single_token(llm: Any, text: str) -> int | None:
    """The id of ``text`` when the engine's tokenizer holds it as one token (DeepSeek-R1's
    and Qwen3's ``</think>`` are), else None."""
    try:
        tokenizer = llm.get_tokenizer()
        ids = tokenizer.encode(text, add_special_tokens=False)
    except Exception:  # a tokenizer without these calls: counted by characters instead
        return None
    return int(ids[0]) if isinstance(ids, list) and len(ids) == 1 else None


def engine_identity(cfg: BackendSection, kind: str) -> dict[str, Any]:
    """A vLLM engine's identity: its version, the model folder's content hash and the
    structured-output engine that constrains its JSON answers (answers made under another
    grammar engine are another backend's: the cache never mixes them)."""
    model = str(cfg.model)
    local = Path(model).expanduser()
    so = structured_outputs(cfg)
    ident: dict[str, Any] = {
        "kind": kind,
        "version": version("vllm"),
        "model": model,
        # a model folder, or one file (a GGUF vLLM loads directly)
        "files_sha256": folder_sha256(local)
        if local.is_dir()
        else file_sha256(local)
        if local.is_file()
        else None,
        "model_output": True,
        "structured_outputs": so,
    }
    # a GGUF's tokenizer and config come from a folder of their own: part of what answers
    for arg in ("tokenizer", "hf_config_path"):
        folder = cfg.vllm.engine_args.get(arg)
        if isinstance(folder, str) and folder != model and Path(folder).is_dir():
            ident[f"{arg}_sha256"] = folder_sha256(Path(folder))
    if so["backend"] == "guidance":  # llguidance enforces string bounds cheaply: send them
        ident[SCHEMA_BOUNDS] = True
    record = cfg.vllm.reasoning.record(parser=True)
    if record is not None:  # answers made another way are another backend's
        ident["reasoning"] = record
    return ident


def structured_outputs(cfg: BackendSection) -> dict[str, Any]:
    """The structured-output settings the engine is built with (``engine_args`` may
    override the named setting, as it may any other)."""
    kw = engine_kwargs(cfg)
    conf = kw.get("structured_outputs_config") or {}
    if not isinstance(conf, dict):  # an object handed in through engine_args
        conf = {k: getattr(conf, k) for k in ("backend",) if hasattr(conf, k)}
    return {"backend": conf.get("backend", "auto"), "xgrammar": version("xgrammar"),
            "llguidance": version("llguidance")}  # fmt: skip


def describe_engine(identity: dict[str, Any]) -> str:
    digest = identity.get("files_sha256")
    text = f"vLLM {identity.get('version') or '?'} in-process, model {identity.get('model')}"
    so = identity.get("structured_outputs") or {}
    if so.get("backend"):
        text += f", JSON by {so['backend']}"
    text += reasoning.describe(identity.get("reasoning"))
    return text + (f" (files sha256 {digest[:12]})" if digest else " (not a local folder: no hash)")
