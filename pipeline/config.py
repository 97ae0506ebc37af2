"""Run configuration: one YAML file per run, validated with pydantic.

Every field has a type, a default where one makes sense and a one-line description
(``prb config show`` prints them resolved). Unknown keys and bad values fail at load
time with the file and the dotted field name. Secrets never live here: the config
names the environment variable that holds a key, never the key.
"""

from __future__ import annotations

import difflib
import json
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from pipeline.errors import ConfigError

STRATEGIES = ("avoid_all", "violate_one", "other_user")
Strategy = Literal["avoid_all", "violate_one", "other_user"]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class RunSection(_Section):
    name: str = Field("run", description="Run name; the run directory is <output_dir>/<name>.")
    output_dir: Path = Field(
        Path("outputs"), description="Folder holding run directories (relative to the CWD)."
    )
    seed: int = Field(0, description="Base seed: sampling seeds and A/B shuffles derive from it.")

    @field_validator("name")
    @classmethod
    def _safe_name(cls, v: str) -> str:
        if not v or "/" in v or v in (".", ".."):
            raise ValueError("must be a plain folder name (no '/')")
        return v


class InputSection(_Section):
    format: Literal["lamp", "generic", "hf"] = Field(
        "lamp",
        description="lamp: LaMP-QA-style JSONL; generic: users.jsonl + questions.jsonl; "
        "hf: a `datasets` folder or a parquet file with a column mapping.",
    )
    path: Path | None = Field(
        None, description="lamp: the JSONL file; hf: the dataset folder or parquet file."
    )
    users_path: Path | None = Field(None, description="generic: the users JSONL file.")
    questions_path: Path | None = Field(None, description="generic: the questions JSONL file.")
    split: str | None = Field(None, description="hf: split to read from a DatasetDict folder.")
    columns: dict[str, str] = Field(
        default_factory=dict,
        description="hf: our field name -> the source column name (e.g. {question: query}).",
    )
    limit: int | None = Field(None, ge=1, description="Read at most this many examples.")


class VLLMSection(_Section):
    tensor_parallel_size: int = Field(1, ge=1, description="GPUs per engine (tensor parallel).")
    gpu_memory_utilization: float = Field(
        0.9, gt=0, le=1, description="Share of GPU memory vLLM may take."
    )
    max_model_len: int | None = Field(None, ge=1, description="Context length; model default.")
    dtype: str = Field("auto", description="Weights dtype: auto, bfloat16, float16...")
    enable_prefix_caching: bool = Field(
        True, description="Reuse KV cache across prompts that share a prefix."
    )
    chunk_size: int = Field(
        4096, ge=1, description="Requests per batched LLM.chat call (bounds memory and loss)."
    )
    engine_args: dict[str, Any] = Field(
        default_factory=dict, description="Extra keyword arguments for vllm.LLM(...)."
    )


class RaySection(_Section):
    address: str | None = Field(
        None, description="Ray cluster address (ray://host:10001 or auto); none: a local Ray."
    )
    engine: Literal["http", "vllm"] = Field(
        "http",
        description="http: Ray Data's HTTP processor against backend.base_url; vllm: a vLLM "
        "engine per replica on the cluster's GPUs.",
    )
    replicas: int = Field(
        1, ge=1, description="Parallel workers (http) or vLLM engine replicas (vllm)."
    )
    batch_size: int = Field(64, ge=1, description="Rows per Ray Data batch.")
    num_cpus: int | None = Field(
        None, ge=1, description="CPUs for a local Ray (ignored when address is set)."
    )
    num_gpus_per_replica: int = Field(1, ge=0, description="vllm: GPUs per engine replica.")


class BackendSection(_Section):
    name: str = Field("openai", description="Backend: openai, vllm, ray or replay.")
    model: str = Field("stand-in", description="Model name sent to the server / loaded by vLLM.")
    base_url: str = Field(
        "http://127.0.0.1:8000/v1", description="openai: base URL of the compatible server."
    )
    api_key_env: str = Field(
        "OPENAI_API_KEY",
        description="openai: name of the environment variable that holds the API key.",
    )
    max_concurrency: int = Field(64, ge=1, description="openai: requests in flight at most.")
    timeout_s: float = Field(120.0, gt=0, description="openai: per-request timeout in seconds.")
    max_attempts: int = Field(
        6, ge=1, description="Attempts per request on transient errors (429, 5xx, timeouts)."
    )
    backoff_initial_s: float = Field(0.5, ge=0, description="First retry wait; doubles each try.")
    backoff_max_s: float = Field(30.0, ge=0, description="Longest wait between two attempts.")
    http_transport: Literal["aiohttp", "httpx"] = Field(
        "aiohttp",
        description="openai: HTTP transport; aiohttp measured faster here "
        "(benchmarks/backend_throughput.py).",
    )
    max_reasks: int = Field(
        2, ge=0, description="Re-asks when a JSON-schema answer does not parse or validate."
    )
    abort_after_failures: int = Field(
        50,
        ge=1,
        description="Stop the stage after this many consecutive failed requests "
        "(the server is likely down).",
    )
    replay_cache: Path | None = Field(
        None,
        description="replay: a cache.sqlite or its JSONL export to answer from, relative to "
        "the config file (default: the run's own cache).",
    )
    vllm: VLLMSection = Field(default_factory=VLLMSection, description="vllm backend settings.")
    ray: RaySection = Field(default_factory=RaySection, description="ray backend settings.")

    @field_validator("name")
    @classmethod
    def _known_backend(cls, v: str) -> str:
        from pipeline.backends import BACKENDS

        try:
            BACKENDS.check(v)
        except ConfigError as exc:
            raise ValueError(exc.reason) from None
        return v


class SamplingSection(_Section):
    temperature: float = Field(0.8, ge=0, le=2, description="Sampling temperature.")
    top_p: float = Field(0.95, gt=0, le=1, description="Nucleus sampling mass.")
    max_tokens: int = Field(400, ge=1, description="Longest answer in tokens.")


class ProfileSection(_Section):
    top_k: int = Field(10, ge=1, description="Past posts kept per example, most relevant first.")
    ranker: Literal["bm25", "embedding"] = Field(
        "bm25", description="bm25: lexical, no model; embedding: sentence-transformers."
    )
    embedding_model: str = Field(
        "all-MiniLM-L6-v2",
        description="embedding: a local sentence-transformers model path or name.",
    )


class RubricsSection(_Section):
    source: Literal["given", "generated"] = Field(
        "given", description="given: the input's rubric_aspects; generated: derived by the LLM."
    )
    min_items: int = Field(2, ge=1, description="Fewest aspects a generated rubric may have.")
    max_items: int = Field(6, ge=1, description="Most aspects a generated rubric may have.")
    merge_threshold: float = Field(
        90.0,
        ge=0,
        le=100,
        description="rapidfuzz token_set_ratio at or above which two aspects are merged.",
    )
    sampling: SamplingSection = Field(
        default_factory=lambda: SamplingSection(temperature=0.0, top_p=1.0, max_tokens=1024),
        description="Sampling for rubric generation (greedy by default: one rubric per user).",
    )


class ResponsesSection(_Section):
    n: int = Field(2, ge=1, description="Candidates per side (chosen, and per strategy rejected).")
    strategies: list[Strategy] = Field(
        default_factory=lambda: ["avoid_all"],
        min_length=1,
        description="Rejected strategies: avoid_all, violate_one, other_user.",
    )
    word_cap: int = Field(100, ge=10, description="Word cap stated to the model for both sides.")
    sampling: SamplingSection = Field(
        default_factory=SamplingSection, description="Sampling for chosen and rejected answers."
    )
    chunk_size: int = Field(
        256, ge=1, description="Examples per output shard (a crash loses at most one chunk)."
    )

    @field_validator("strategies")
    @classmethod
    def _unique(cls, v: list[str]) -> list[str]:
        if len(set(v)) != len(v):
            raise ValueError("strategies must not repeat")
        return v


class JudgeSection(_Section):
    model: str | None = Field(
        None, description="Judge model; default: backend.model (a stronger judge is better)."
    )
    sampling: SamplingSection = Field(
        default_factory=lambda: SamplingSection(temperature=0.0, top_p=1.0, max_tokens=768),
        description="Sampling for judge calls (greedy: verdicts should be reproducible).",
    )
    max_pairs_per_example: int = Field(
        4,
        ge=1,
        description="Chosen x rejected combinations per example sent to the pairwise judge, "
        "best pointwise margin first.",
    )


class PairsSection(_Section):
    filters: list[str] = Field(
        default_factory=lambda: [
            "judge_parse",
            "truncated",
            "refusal",
            "meta_text",
            "length",
            "quality_floor",
            "quality_gap",
            "coverage",
            "pairwise_consistency",
            "similarity",
            "near_duplicate",
        ],
        description="Pair filters in the order they run (see docs/filters.md).",
    )
    quality_floor: int = Field(
        4, ge=1, le=5, description="Both answers score at least this on all three dimensions."
    )
    quality_gap_max: int = Field(
        1, ge=0, le=4, description="Largest allowed difference on any quality dimension."
    )
    coverage_chosen_min: int = Field(
        2, ge=0, le=2, description="The chosen answer's least coverage score on every item."
    )
    coverage_rejected_max: int = Field(
        0, ge=0, le=2, description="The rejected answer's highest score on its violated items."
    )
    coverage_kept_min: int = Field(
        1,
        ge=0,
        le=2,
        description="violate_one: the rejected answer's least score on the items it keeps.",
    )
    length_slack: float = Field(
        0.1, ge=0, description="Word cap tolerance: both answers <= word_cap * (1 + slack)."
    )
    length_ratio_min: float = Field(
        0.67, gt=0, description="Least chosen/rejected word-count ratio."
    )
    length_ratio_max: float = Field(1.5, gt=0, description="Largest chosen/rejected ratio.")
    similarity_min: float = Field(
        10.0, ge=0, le=100, description="Least word-level similarity (rapidfuzz Indel, 0-100)."
    )
    similarity_max: float = Field(
        85.0, ge=0, le=100, description="Largest word-level similarity (near-identical above)."
    )
    dedup_question_threshold: float = Field(
        95.0, ge=0, le=100, description="Questions this similar across the set are duplicates."
    )
    dedup_answer_threshold: float = Field(
        95.0, ge=0, le=100, description="Answers this similar across the set are duplicates."
    )
    meta_patterns: list[str] = Field(
        default_factory=lambda: [
            r"\brubric",
            r"\b(?:listed|given|expected|following|required) (?:aspects|points)\b",
            r"\b(?:the )?user(?:'s)? expect",
            r"\bwhat you expect\b",
            r"\bas (?:you )?(?:requested|instructed)\b",
            r"\bthis (?:answer|response) (?:covers|avoids|addresses)\b",
        ],
        description="Regexes (case-insensitive) that mark an answer talking about its brief.",
    )
    refusal_patterns: list[str] = Field(
        default_factory=lambda: [
            r"^\W*(?:i'?m sorry|sorry,|i apologi[sz]e|as an ai)\b",
            r"\bi (?:cannot|can't|can not|won't|am unable to) (?:help|assist|provide|answer)\b",
        ],
        description="Regexes (case-insensitive) that mark a refusal.",
    )

    @field_validator("filters")
    @classmethod
    def _known_filters(cls, v: list[str]) -> list[str]:
        from pipeline.filters import FILTERS

        for name in v:
            try:
                FILTERS.check(name)
            except ConfigError as exc:
                raise ValueError(exc.reason) from None
        return v


class AnnotationSection(_Section):
    url: str | None = Field(
        None,
        description="An existing Label Studio server; none: the local one `prb annotate serve` "
        "starts on 127.0.0.1.",
    )
    port: int = Field(8089, ge=1, le=65535, description="Port of the local server.")
    token_env: str = Field(
        "LABEL_STUDIO_API_KEY",
        description="Environment variable holding the Label Studio API token.",
    )
    server_venv: Path = Field(
        Path(".labelstudio/venv"),
        description="Virtual environment holding the label-studio server (created if missing).",
    )
    data_dir: Path = Field(
        Path(".labelstudio/data"),
        description="LABEL_STUDIO_BASE_DATA_DIR of the local server (its SQLite and media).",
    )
    sample_size: int = Field(200, ge=1, description="Pairs sampled per round (gold excluded).")
    stratify_by: list[Literal["category", "strategy", "confidence"]] = Field(
        default_factory=lambda: ["category", "strategy", "confidence"],
        description="Strata the sample is spread over; confidence: the judge margin's tercile.",
    )
    gold_tasks: int = Field(
        10, ge=0, description="Attention-check tasks with a known answer added per round."
    )
    batch_size: int = Field(100, ge=1, description="Tasks per import request.")
    min_votes: int = Field(
        2, ge=1, description="Annotations a pair needs before it can be verified or refuted."
    )


class Config(_Section):
    run: RunSection = Field(default_factory=RunSection, description="Run identity and seed.")
    input: InputSection = Field(
        default_factory=InputSection, description="Where examples come from."
    )
    backend: BackendSection = Field(default_factory=BackendSection, description="LLM backend.")
    profile: ProfileSection = Field(
        default_factory=ProfileSection, description="Profile selection."
    )
    rubrics: RubricsSection = Field(default_factory=RubricsSection, description="Rubric stage.")
    responses: ResponsesSection = Field(
        default_factory=ResponsesSection, description="Response stage."
    )
    judge: JudgeSection = Field(default_factory=JudgeSection, description="Judge stage.")
    pairs: PairsSection = Field(default_factory=PairsSection, description="Pair stage.")
    annotation: AnnotationSection = Field(
        default_factory=AnnotationSection, description="Human verification rounds."
    )

    # Where the config file lives; relative input paths resolve against it.
    _base_dir: Path = Path(".")

    def resolve_input(self, p: Path | None) -> Path | None:
        if p is None:
            return None
        p = Path(p).expanduser()
        return p if p.is_absolute() else (self._base_dir / p)

    @property
    def run_dir(self) -> Path:
        return Path(self.run.output_dir) / self.run.name

    def to_yaml(self) -> str:
        data = self.model_dump(mode="json")
        return yaml.safe_dump(data, sort_keys=False, allow_unicode=True)


_SECRET_KEYS = {"api_key", "token", "password", "secret", "access_token"}


def _fields_of(model: type[BaseModel], loc: tuple) -> list[str]:
    """Field names valid at ``loc`` (for 'did you mean')."""
    cur: Any = model
    for part in loc[:-1]:
        if not (isinstance(cur, type) and issubclass(cur, BaseModel)):
            return []
        f = cur.model_fields.get(str(part))
        if f is None:
            return []
        cur = f.annotation
    if isinstance(cur, type) and issubclass(cur, BaseModel):
        return list(cur.model_fields)
    return []


def _format_validation(err: ValidationError, source: str) -> ConfigError:
    lines = []
    first_field = None
    for e in err.errors():
        loc = tuple(e["loc"])
        field = ".".join(str(p) for p in loc) or "<root>"
        first_field = first_field or field
        msg = e["msg"]
        if e["type"] == "extra_forbidden":
            name = str(loc[-1])
            if name.lower() in _SECRET_KEYS or name.lower().endswith(("_key", "_token")):
                msg = (
                    "secrets are not read from config files; put the value in an environment "
                    "variable and name it (e.g. backend.api_key_env)"
                )
            else:
                known = _fields_of(Config, loc)
                close = difflib.get_close_matches(name, known, n=1)
                msg = "unknown key" + (f"; did you mean '{close[0]}'?" if close else "")
                if known:
                    msg += f" (known: {', '.join(known)})"
        lines.append(f"field '{field}': {msg}")
    detail = "\n  ".join(lines)
    return ConfigError(f"invalid config\n  {detail}", path=source, field=first_field)


def parse_override(spec: str) -> tuple[list[str], Any]:
    """Parse ``key.path=value``; the value is read as YAML (so 3, true, [a, b] work)."""
    if "=" not in spec:
        raise ConfigError(f"--set expects key.path=value, got {spec!r}", path="--set")
    key, raw = spec.split("=", 1)
    parts = [p for p in key.strip().split(".") if p]
    if not parts:
        raise ConfigError(f"--set has an empty key: {spec!r}", path="--set")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as exc:
        raise ConfigError(f"cannot parse value {raw!r}: {exc}", path="--set", field=key) from exc
    return parts, value


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    for spec in overrides:
        parts, value = parse_override(spec)
        cur = data
        for p in parts[:-1]:
            nxt = cur.get(p)
            if nxt is None:
                nxt = cur[p] = {}
            if not isinstance(nxt, dict):
                raise ConfigError(
                    "cannot set below a non-mapping value", path="--set", field=".".join(parts)
                )
            cur = nxt
        cur[parts[-1]] = value
    return data


def load_config(path: str | Path, overrides: list[str] | None = None) -> Config:
    """Load, override and validate a YAML config; errors name the file and the field."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError("config file not found", path=path) from None
    except OSError as exc:
        raise ConfigError(f"cannot read config: {exc}", path=path) from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        raise ConfigError(f"not valid YAML: {exc}", path=path, line=line) from exc
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError("the top level must be a mapping of sections", path=path)
    data = apply_overrides(data, overrides or [])
    source = str(path) + (" (with --set overrides)" if overrides else "")
    try:
        cfg = Config.model_validate(data)
    except ValidationError as err:
        raise _format_validation(err, source) from None
    if cfg.rubrics.min_items > cfg.rubrics.max_items:
        raise ConfigError(
            "rubrics.min_items must not exceed rubrics.max_items", path=source, field="rubrics"
        )
    cfg._base_dir = path.resolve().parent
    return cfg


def describe_fields(model: BaseModel | None = None, prefix: str = "") -> list[tuple[str, str, str]]:
    """(dotted name, default as JSON, description) for every field, for docs and the CLI.

    Walks a default instance, so a section's own defaults (rubric sampling is greedy,
    say) show rather than the defaults of the nested class.
    """
    model = model if model is not None else Config()
    rows = []
    for name, f in type(model).model_fields.items():
        dotted = f"{prefix}{name}"
        value = getattr(model, name)
        if isinstance(value, BaseModel):
            rows.extend(describe_fields(value, dotted + "."))
        else:
            shown = json.dumps(str(value) if isinstance(value, Path) else value)
            rows.append((dotted, shown, f.description or ""))
    return rows
