"""Run configuration: one YAML file per run, validated with pydantic.

Every field has a type, a default where one makes sense and a one-line description
(``prb config show`` prints them resolved). Unknown keys and bad values fail at load
time with the file and the dotted field name. Secrets never live here: the config
names the environment variable that holds a key, never the key.
"""

from __future__ import annotations

import difflib
import json
import os
import re
import sys
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    Field,
    ValidationError,
    field_validator,
)

from pipeline.backends.settings import FLAT_KEYS as _FLAT_BACKEND_KEYS
from pipeline.backends.settings import BackendSection, deprecation_line, move_flat_keys
from pipeline.backends.settings import check_http_url as _check_http_url
from pipeline.errors import ConfigError
from pipeline.inputs import FORMATS
from pipeline.io import path_kind  # here too for its importers; it lives in io, below the readers
from pipeline.redact import public_url, redact, register_names, register_value, url_secrets
from pipeline.rules import DEFAULT_META_PATTERNS, DEFAULT_REFUSAL_PATTERNS
from pipeline.rules import default as rule_default
from pipeline.section import Section

STRATEGIES = ("avoid_all", "violate_one", "other_user")
Strategy = Literal["avoid_all", "violate_one", "other_user"]


class _Section(Section):
    """A section of the config (the rules every section keeps: pipeline/section.py)."""


class BudgetSection(_Section):
    """What a run may spend (docs/plan.md). Counted over the run's life for the backend that
    answers it: the answers its cache.sqlite holds, plus what this invocation receives."""

    # bounds guard against typos (an extra zero or two), not real budgets
    requests: int | None = Field(
        None,
        ge=1,
        le=10**12,
        description="Stop before a request would take the run's answered requests past this "
        "many; none: no limit.",
    )
    tokens: int | None = Field(
        None,
        ge=1,
        le=10**15,
        description="Stop before a request could take the run's prompt plus output tokens past "
        "this many; none: no limit.",
    )
    usd: float | None = Field(
        None,
        gt=0,
        le=10**9,
        description="Stop before a request could take the run's cost at run.prices past this "
        "many US dollars; none: no limit.",
    )


class PricesSection(_Section):
    """A hosted API's prices, for the cost `prb plan`, the stats, `prb status` and the card
    show, and for run.budget.usd."""

    input_usd_per_million: float | None = Field(
        None, ge=0, le=1_000_000, description="US dollars per million prompt tokens; none: unknown."
    )
    output_usd_per_million: float | None = Field(
        None, ge=0, le=1_000_000, description="US dollars per million output tokens; none: unknown."
    )


class RunSection(_Section):
    name: str = Field("run", description="Run name; the run directory is <output_dir>/<name>.")
    output_dir: Path = Field(
        Path("outputs"),
        description="Folder holding run directories; relative: to the config file's folder "
        "(from --set: to the current folder).",
    )
    seed: int = Field(0, description="Base seed: sampling seeds and A/B shuffles derive from it.")
    # neither decides a stage's output: they are not in any stage's fingerprint
    budget: BudgetSection = Field(
        default_factory=BudgetSection,
        description="Spending limits checked before each request is sent (docs/plan.md).",
    )
    prices: PricesSection = Field(
        default_factory=PricesSection, description="Per-million-token prices of the backend."
    )

    @field_validator("name")
    @classmethod
    def _safe_name(cls, v: str) -> str:
        if not v or "/" in v or v in (".", ".."):
            raise ValueError("must be a plain folder name (no '/')")
        if any(ord(ch) < 32 or ord(ch) == 127 for ch in v):
            raise ValueError("must be a plain folder name without control characters (NUL...)")
        if len(v.encode("utf-8", "surrogatepass")) > 255:
            raise ValueError("must be at most 255 bytes long (a file system limit)")
        return v

    @field_validator("seed")
    @classmethod
    def _int64_seed(cls, v: int) -> int:
        # stored in SQLite, parquet and request bodies, all of which hold 64-bit integers
        if not -(2**63) <= v < 2**63:
            raise ValueError("must fit in a signed 64-bit integer")
        return v


def _shard_size(stage: str) -> Any:
    """A stage's own shard size: every stage section has one, of the same default."""
    return Field(
        256,
        ge=1,
        le=1_000_000,
        description=f"Examples per {stage} stage output shard (a crash loses at most one).",
    )


class InputSection(_Section):
    format: str = Field(
        "lamp",
        # the registry's formats, each described by its reader class
        description="; ".join(f"{n}: {FORMATS.get(n).summary.rstrip('.')}" for n in FORMATS.names())
        + ". Others: docs/inputs.md.",
    )
    path: Path | None = Field(
        None, description="lamp: the JSONL file; hf: the dataset folder or parquet file."
    )
    users_path: Path | None = Field(None, description="generic: the users JSONL file.")
    questions_path: Path | None = Field(None, description="generic: the questions JSONL file.")
    dataset: str | None = Field(
        None,
        description="hub: the dataset's Hub name (e.g. alireza7/LaMP-QA) or a local dataset "
        "repository folder.",
    )
    configs: list[str] = Field(
        default_factory=list,
        description="hub: the configs to read, in order; each config's name is the category "
        "of its rows that carry none; empty: the dataset's default config.",
    )
    revision: str | None = Field(None, description="hub: a branch, tag or commit; none: main.")
    cache_dir: Path | None = Field(
        None, description="hub: the datasets cache folder; none: HF_DATASETS_CACHE or its default."
    )
    split: str | None = Field(
        None, description="hf: split to read from a DatasetDict folder; hub: the split to load."
    )
    columns: dict[str, str] = Field(
        default_factory=dict,
        description="hf, hub: our field name -> the source column name (e.g. {question: query}).",
    )
    # upper bounds on counts guard against typos (an extra zero or two), not real inputs
    limit: int | None = Field(
        None, ge=1, le=1_000_000_000, description="Read at most this many examples."
    )
    chunk_size: int = _shard_size("ingest")

    @field_validator("format")
    @classmethod
    def _registered(cls, v: str) -> str:
        # the list of formats is the registry's (pipeline/inputs/), not kept here
        if v not in FORMATS:
            raise ValueError(FORMATS.unknown(v))
        return v

    @field_validator("configs")
    @classmethod
    def _unique_configs(cls, v: list[str]) -> list[str]:
        if len(set(v)) != len(v):
            raise ValueError("configs must not repeat")
        return v


class SamplingSection(_Section):
    temperature: float = Field(0.8, ge=0, le=2, description="Sampling temperature.")
    top_p: float = Field(0.95, gt=0, le=1, description="Nucleus sampling mass.")
    # 2**20 tokens: more than any model's whole context window
    max_tokens: int = Field(400, ge=1, le=2**20, description="Longest answer in tokens.")


class ProfileSection(_Section):
    top_k: int = Field(
        10, ge=1, le=10_000, description="Past posts kept per example, most relevant first."
    )
    ranker: Literal["bm25", "embedding", "contriever"] = Field(
        "bm25",
        description="bm25: lexical, no model; embedding: sentence-transformers; contriever: "
        "a transformers encoder, mean pooling and dot product (the reference's ranking).",
    )
    embedding_model: str = Field(
        "all-MiniLM-L6-v2",
        description="embedding: a local sentence-transformers model path or name.",
    )
    contriever_model: str = Field(
        "facebook/contriever-msmarco",
        description="contriever: a transformers encoder's Hub name or local folder.",
    )
    batch_size: int = Field(
        16, ge=1, le=4096, description="contriever: texts per encoder forward pass."
    )

    @property
    def model(self) -> str:
        """The chosen ranker's model ("" for bm25, which needs none)."""
        return {"embedding": self.embedding_model, "contriever": self.contriever_model}.get(
            self.ranker, ""
        )


class RubricsSection(_Section):
    source: Literal["given", "generated"] = Field(
        "given", description="given: the input's rubric_aspects; generated: derived by the LLM."
    )
    # every aspect is judged as its own item of one request: 100 is far past useful
    min_items: int = Field(
        2, ge=1, le=100, description="Fewest aspects a generated rubric may have."
    )
    max_items: int = Field(6, ge=1, le=100, description="Most aspects a generated rubric may have.")
    merge_threshold: float = Field(
        90.0,
        ge=0,
        le=100,
        description="rapidfuzz token_set_ratio at or above which two aspects are merged.",
    )
    sampling: SamplingSection = Field(
        default_factory=lambda: SamplingSection(temperature=0.0, top_p=1.0, max_tokens=2048),
        description="Sampling for rubric generation (greedy by default: one rubric per user); "
        "max_tokens also sizes the schema's text fields.",
    )
    reasks: int = Field(
        2,
        ge=0,
        le=10,
        description="Re-asks, with the reason, when merging near-duplicate aspects leaves "
        "fewer than min_items.",
    )
    chunk_size: int = _shard_size("rubrics")


class ResponsesSection(_Section):
    n: int = Field(
        2, ge=1, le=100, description="Candidates per side (chosen, and per strategy rejected)."
    )
    strategies: list[Strategy] = Field(
        default_factory=lambda: list[Strategy](["avoid_all"]),
        min_length=1,
        description="Rejected strategies: avoid_all, violate_one, other_user.",
    )
    word_cap: int = Field(
        100, ge=10, le=10_000, description="Word cap stated to the model for both sides."
    )
    sampling: SamplingSection = Field(
        default_factory=SamplingSection, description="Sampling for chosen and rejected answers."
    )
    chunk_size: int = _shard_size("responses")

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
        default_factory=lambda: SamplingSection(temperature=0.0, top_p=1.0, max_tokens=1024),
        description="Sampling for judge calls (greedy: verdicts should be reproducible); "
        "max_tokens also sizes the verdict schemas' rationales.",
    )
    rationale_max_chars: int = Field(
        300,
        ge=40,
        le=100_000,
        description="Longest rationale a verdict schema allows (shorter when max_tokens is "
        "tight; see pipeline/schemas.py).",
    )
    max_pairs_per_example: int = Field(
        4,
        ge=1,
        le=1000,
        description="Chosen x rejected combinations per example sent to the pairwise judge, "
        "best pointwise margin first.",
    )
    chunk_size: int = _shard_size("judge")


class PairsSection(_Section):
    filters: list[str] = Field(
        default_factory=lambda: [
            "judge_parse",
            "truncated",
            "empty",
            "truncated_text",
            "refusal",
            "meta_text",
            "rubric_echo",
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
        rule_default("quality_floor"),
        ge=1,
        le=5,
        description="Both answers score at least this on all three dimensions.",
    )
    quality_gap_max: int = Field(
        rule_default("quality_gap_max"),
        ge=0,
        le=4,
        description="Largest allowed difference on any quality dimension.",
    )
    coverage_chosen_min: int = Field(
        rule_default("coverage_chosen_min"),
        ge=0,
        le=2,
        description="The chosen answer's least coverage score on every item.",
    )
    coverage_rejected_max: int = Field(
        rule_default("coverage_rejected_max"),
        ge=0,
        le=2,
        description="The rejected answer's highest score on its violated items.",
    )
    coverage_kept_min: int = Field(
        rule_default("coverage_kept_min"),
        ge=0,
        le=2,
        description="violate_one: the rejected answer's least score on the items it keeps.",
    )
    # ten times the cap is no cap at all
    length_slack: float = Field(
        rule_default("length_slack"),
        ge=0,
        le=10,
        description="Word cap tolerance: both answers <= word_cap * (1 + slack).",
    )
    # the word counts of two capped answers differ by less than word_cap * (1 + slack)
    length_ratio_min: float = Field(
        rule_default("length_ratio_min"),
        gt=0,
        le=1000,
        description="Least chosen/rejected word-count ratio.",
    )
    length_ratio_max: float = Field(
        rule_default("length_ratio_max"),
        gt=0,
        le=1000,
        description="Largest chosen/rejected ratio.",
    )
    similarity_min: float = Field(
        rule_default("similarity_min"),
        ge=0,
        le=100,
        description="Least word-level similarity (rapidfuzz Indel, 0-100).",
    )
    similarity_max: float = Field(
        rule_default("similarity_max"),
        ge=0,
        le=100,
        description="Largest word-level similarity (near-identical above).",
    )
    dedup_question_threshold: float = Field(
        rule_default("dedup_question_threshold"),
        ge=0,
        le=100,
        description="One user's questions this similar are duplicates.",
    )
    dedup_answer_threshold: float = Field(
        rule_default("dedup_answer_threshold"),
        ge=0,
        le=100,
        description="Answers this similar are duplicates: within a user, or both answers of "
        "a pair across users (docs/audit.md).",
    )
    dedup_profile_threshold: float = Field(
        rule_default("dedup_profile_threshold"),
        ge=0,
        le=100,
        description="Profiles this similar are one person for dedup.",
    )
    echo_min_words: int = Field(
        rule_default("echo_min_words"),
        ge=1,
        le=1000,
        description="rubric_echo: least words a rubric aspect needs to count.",
    )
    echo_threshold: float = Field(
        rule_default("echo_threshold"),
        ge=0,
        le=100,
        description="rubric_echo: least partial match (0-100) of an aspect.",
    )
    meta_patterns: list[str] = Field(
        default_factory=lambda: list(DEFAULT_META_PATTERNS),
        description="Regexes (case-insensitive) that mark an answer talking about its brief "
        "(defaults: pipeline/rules/patterns.py, docs/audit.md).",
    )
    refusal_patterns: list[str] = Field(
        default_factory=lambda: list(DEFAULT_REFUSAL_PATTERNS),
        description="Regexes (case-insensitive) that mark a refusal.",
    )
    chunk_size: int = _shard_size("pairs")

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

    @field_validator("meta_patterns", "refusal_patterns")
    @classmethod
    def _valid_regexes(cls, v: list[str]) -> list[str]:
        # compiled as the filters compile them, so a bad one fails here, not after the LLM calls
        for i, pattern in enumerate(v):
            try:
                rx = re.compile(pattern, re.IGNORECASE | re.MULTILINE)
            except (re.error, RecursionError, OverflowError) as exc:
                raise ValueError(
                    f"item {i} is not a valid regular expression ({exc}); fix or remove it"
                ) from None
            if rx.search("") is not None:
                raise ValueError(
                    f"item {i} ({pattern!r}) matches empty text, so it would drop every pair"
                )
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
    sample_size: int = Field(
        200, ge=1, le=1_000_000, description="Pairs sampled per round (gold excluded)."
    )
    stratify_by: list[Literal["category", "strategy", "confidence"]] = Field(
        default_factory=lambda: list[Literal["category", "strategy", "confidence"]](
            ["category", "strategy", "confidence"]
        ),
        description="Strata the sample is spread over; confidence: the judge margin's tercile.",
    )
    gold_tasks: int = Field(
        10,
        ge=0,
        le=10_000,
        description="Attention-check tasks with a known answer added to a round of "
        "annotation.sample_size pairs; a round with fewer pairs gets the same share, rounded "
        "up (at least 1).",
    )
    batch_size: int = Field(100, ge=1, le=10_000, description="Tasks per import request.")
    min_votes: int = Field(
        2,
        ge=1,
        le=100,
        description="Annotations a pair needs before it can be verified or refuted.",
    )

    @field_validator("url")
    @classmethod
    def _http_url(cls, v: str | None) -> str | None:
        return None if v is None else _check_http_url(v)


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
        """A path from the config: relative ones are the config file's folder's."""
        if p is None:
            return None
        p = Path(p).expanduser()
        return p if p.is_absolute() else (self._base_dir / p)

    @property
    def run_dir(self) -> Path:
        """The run directory, absolute: the same folder wherever `prb` is started."""
        out = self.resolve_input(Path(self.run.output_dir))
        assert out is not None
        return Path(os.path.abspath(out / self.run.name))

    def to_yaml(self) -> str:
        """The resolved config as YAML, with the credentials in URLs (user:password@, a
        key in the query string) left out."""
        data = self.model_dump(mode="json")
        data["backend"] = self.backend.public(data["backend"])
        if data["annotation"].get("url"):
            data["annotation"]["url"] = public_url(data["annotation"]["url"])
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
    lines: list[tuple[str, str]] = []
    first_field = None
    for e in err.errors():
        loc = tuple(e["loc"])
        field = ".".join(str(p) for p in loc) or "<root>"
        first_field = first_field or field
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            name = str(loc[-1])
            if name.lower() in _SECRET_KEYS or name.lower().endswith(("_key", "_token")):
                msg = (
                    "secrets are not read from config files; put the value in an environment "
                    "variable and name it (e.g. backend.openai.api_key_env)"
                )
            else:
                known = _fields_of(Config, loc)
                close = difflib.get_close_matches(name, known, n=1)
                msg = "unknown key" + (f"; did you mean '{close[0]}'?" if close else "")
                if known:
                    msg += f" (known: {', '.join(known)})"
        lines.append((field, msg))
    # one line: a single problem reads "<file>, field 'x': <what>", several are listed
    if len(lines) == 1:
        return ConfigError(redact(lines[0][1]), path=source, field=first_field)
    detail = "; ".join(f"field '{f}': {m}" for f, m in lines)
    return ConfigError(
        redact(f"invalid config ({len(lines)} problems): {detail}"), path=source, field=first_field
    )


def config_from_overrides(overrides: list[str]) -> Config:
    """The defaults with ``--set`` overrides, for commands run without a config file; a bad
    value is one ConfigError naming the field."""
    _warn_flat_keys(_flat_backend_keys({}, overrides), "--set")
    data = apply_overrides({}, overrides)
    _check_plain(data, "--set")
    try:
        cfg = Config.model_validate(data)
    except ValidationError as err:
        raise _format_validation(err, "--set") from None
    register_names([*cfg.backend.secret_env_names(), cfg.annotation.token_env])
    return cfg


def parse_override(spec: str) -> tuple[list[str], Any]:
    """Parse ``key.path=value``; the value is read as YAML (so 3, true, [a, b] work)."""
    if "=" not in spec:
        raise ConfigError(f"--set expects key.path=value, got {spec!r}", path="--set")
    key, raw = spec.split("=", 1)
    parts = [p for p in key.strip().split(".") if p]
    if not parts:
        raise ConfigError(f"--set has an empty key: {spec!r}", path="--set")
    try:
        value = yaml.load(raw, Loader=ConfigLoader) if raw.strip() else ""
    except (yaml.YAMLError, ValueError, RecursionError) as exc:
        # the value is not repeated: it may be a secret typed in the wrong place
        raise ConfigError(
            f"cannot parse the value as YAML ({_yaml_problem(exc)})", path="--set", field=key
        ) from None
    return parts, value


# Config fields that hold paths. In a config file a relative one is the file's folder's;
# typed with --set it is the current folder's, like any path on a command line.
PATH_FIELDS = (
    "run.output_dir",
    "input.path",
    "input.users_path",
    "input.questions_path",
    "input.cache_dir",
    "backend.replay.cache",
)


def _current_key(parts: list[str]) -> list[str]:
    """A key path with a backend key that was once flat (backend.base_url) in its section."""
    if len(parts) == 2 and parts[0] == "backend" and parts[1] in _FLAT_BACKEND_KEYS:
        return ["backend", *_FLAT_BACKEND_KEYS[parts[1]]]
    return parts


def _flat_backend_keys(data: dict, overrides: list[str]) -> list[str]:
    """The once-flat backend keys a config file and its ``--set`` options use."""
    found = []
    backend = data.get("backend")
    if isinstance(backend, dict):
        found += [k for k in backend if k in _FLAT_BACKEND_KEYS]
    for spec in overrides:
        key = spec.split("=", 1)[0].strip().split(".")
        if len(key) == 2 and key[0] == "backend" and key[1] in _FLAT_BACKEND_KEYS:
            found.append(key[1])
    return list(dict.fromkeys(found))


def _warn_flat_keys(found: list[str], source: str) -> None:
    # a warning, not an error: configs written before the backend sections still run
    if found:
        print(deprecation_line(found, source), file=sys.stderr)


def apply_overrides(data: dict, overrides: list[str], cwd_paths: bool = False) -> dict:
    """Apply ``--set`` overrides to the parsed config. ``cwd_paths``: a relative path given
    for a path field is made absolute against the current folder (the config file's folder
    is what relative paths in the file itself resolve against)."""
    for spec in overrides:
        parts, value = parse_override(spec)
        parts = _current_key(parts)
        path_field = ".".join(parts) in PATH_FIELDS and isinstance(value, str) and value
        if cwd_paths and path_field and not Path(value).expanduser().is_absolute():
            value = os.path.abspath(value)
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


def _yaml_problem(exc: BaseException) -> str:
    """What is wrong, without the snippet PyYAML quotes (the line may hold a secret)."""
    if isinstance(exc, yaml.MarkedYAMLError):
        # the error's own line goes into ConfigError's prefix; here the column, and where
        # an unclosed quote or bracket started
        text = exc.problem or "syntax error"
        if exc.problem_mark is not None:
            text += f" at column {exc.problem_mark.column + 1}"
        ctx, start = exc.context, exc.context_mark
        if (
            ctx
            and start is not None
            and (exc.problem_mark is None or start.line != exc.problem_mark.line)
        ):
            text += f", {ctx} started on line {start.line + 1}"
        elif ctx:
            text += f", {ctx}"
        return redact(text)
    if isinstance(exc, RecursionError):
        return "nested too deeply"
    if isinstance(exc, ValueError) and "digits" in str(exc):
        return "a number has too many digits"
    return redact(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)


# `api_key_env: NAME` / `token_env: NAME`, found before parsing so that even a YAML error
# message is redacted with the variables this config names
_ENV_NAME_RE = re.compile(
    r"^\s*(?:api_key_env|token_env)\s*:\s*[\"']?([A-Za-z_][A-Za-z0-9_]*)", re.MULTILINE
)


_YAML_TYPES = {
    "bytes": "binary data (!!binary)",
    "set": "a set (!!set)",
    "date": "a date",
    "datetime": "a timestamp",
}


# A config is a few hundred values; YAML aliases can make a small file expand to billions.
_MAX_CONFIG_VALUES = 100_000
# A config is a few KiB; anything far larger is the wrong file.
_MAX_CONFIG_BYTES = 1 << 20


class DuplicateKeyError(yaml.constructor.ConstructorError):
    """A mapping holds the same key twice (YAML itself keeps the last one silently)."""

    def __init__(self, key: Any, first: yaml.Mark, second: yaml.Mark) -> None:
        self.key = key
        self.first_line = first.line + 1
        self.line = second.line + 1
        super().__init__(
            None, None, f"duplicate key {key!r} (first on line {self.first_line})", second
        )


class ConfigLoader(yaml.SafeLoader):
    """PyYAML's SafeLoader, refusing a key given twice in one mapping: two ``responses:``
    blocks would otherwise lose the first without a word."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, yaml.Mark] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue  # `<<: *base` then a key of its own overrides: allowed
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.setdefault(key, key_node.start_mark)
                except TypeError:
                    continue  # unhashable: the base class says so with its own error
                if first is not key_node.start_mark:
                    raise DuplicateKeyError(key, first, key_node.start_mark)
        return super().construct_mapping(node, deep=deep)


def check_input_path(
    path: Path,
    want: Literal["file", "folder or parquet file"],
    *,
    field: str,
    source: str,
    what: str = "a JSONL file",
) -> None:
    """Refuse an existing input path that is not what ``want`` says, before anything opens
    it: a named pipe or a device would be read forever. A missing path is left to the
    reader, which says so."""
    kind = path_kind(path)
    if kind is None or (kind == "a file" and want == "file"):
        return
    if want == "folder or parquet file" and (
        kind == "a folder" or (kind == "a file" and path.suffix.lower() == ".parquet")
    ):
        if kind == "a folder":
            # datasets reads every file of the folder: a pipe in it hangs as well
            for inner in sorted(path.rglob("*")):
                inner_kind = path_kind(inner)
                if inner_kind not in ("a file", "a folder", None):
                    raise ConfigError(
                        f"{inner} in the dataset folder is {inner_kind}, not a file; "
                        "remove it or point input.path at a clean copy",
                        path=source,
                        field=field,
                    )
        return
    if want != "file":
        what = "a `datasets` folder or a .parquet file"
    raise ConfigError(
        f"{path} is {kind}, not {what}; point {field} at {what}", path=source, field=field
    )


def _check_input_paths(cfg: Config, source: str) -> None:
    """Every input path the config names is what its format reads (nothing is read yet)."""
    for field, p, want in FORMATS.get(cfg.input.format).path_fields(cfg.input):
        resolved = cfg.resolve_input(p)
        if resolved is not None:
            try:
                check_input_path(resolved, want, field=field, source=source)
            except ConfigError as exc:
                other = FORMATS.detect(resolved)
                if other is None or other == cfg.input.format:
                    raise
                hint = f"; it looks like input.format '{other}'"
                raise ConfigError(exc.reason + hint, path=source, field=field) from None
    section = cfg.backend.section()
    for field, p, what in section.input_files() if section is not None else []:
        resolved = cfg.resolve_input(p)
        if resolved is not None:
            check_input_path(resolved, "file", field=field, source=source, what=what)


def _check_plain(data: Any, source: str) -> None:
    """Only JSON-like values, and only valid Unicode, may reach the config: run.yaml, request
    bodies and folder names are written from it. Also refuses alias loops and alias bombs.
    Iterative (the data may nest deeply); each shared container is sized once."""

    def fail(where: str, problem: str) -> ConfigError:
        return ConfigError(problem, path=source, field=where or None)

    sizes: dict[int, int] = {}  # id(container) -> values it expands to
    open_: set[int] = set()  # containers on the current path, to find loops
    stack: list[tuple[str, Any, bool]] = [("", data, False)]
    while stack:
        where, value, leaving = stack.pop()
        if isinstance(value, (dict, list)):
            key = id(value)
            children = list(value.values() if isinstance(value, dict) else value)
            if leaving:
                open_.discard(key)
                sizes[key] = 1 + sum(sizes.get(id(c), 1) for c in children)
                if sizes[key] > _MAX_CONFIG_VALUES:
                    raise fail(where, "expands to too many values (YAML aliases?); simplify it")
                continue
            if key in open_:
                raise fail(where, "refers to itself (a YAML alias loop); remove the alias")
            if key in sizes:
                continue
            open_.add(key)
            stack.append((where, value, True))
            if isinstance(value, dict):
                for k, item in value.items():
                    if not isinstance(k, str):
                        raise fail(where, f"key {k!r} must be text; quote it")
                    stack.append((f"{where}.{k}" if where else k, item, False))
            else:
                stack.extend((f"{where}.{i}", item, False) for i, item in enumerate(value))
        elif isinstance(value, str):
            if any(0xD800 <= ord(ch) <= 0xDFFF for ch in value):
                raise fail(where, "holds a lone UTF-16 surrogate (not valid Unicode); remove it")
        elif value is not None and not isinstance(value, (bool, int, float)):
            what = _YAML_TYPES.get(type(value).__name__, type(value).__name__)
            raise fail(where, f"is {what}; use plain values (quote it to make it text)")


def _check_consistency(cfg: Config, source: str) -> None:
    """Settings that are valid one by one but contradict each other (every pair would drop)."""
    r, p = cfg.rubrics, cfg.pairs
    prices = cfg.run.prices
    given = [x is not None for x in (prices.input_usd_per_million, prices.output_usd_per_million)]
    if any(given) and not all(given):
        missing = "input" if not given[0] else "output"
        raise ConfigError(
            "give both run.prices.input_usd_per_million and output_usd_per_million (0 for a "
            "side that is free), or neither",
            path=source,
            field=f"run.prices.{missing}_usd_per_million",
        )
    if cfg.run.budget.usd is not None and not all(given):
        raise ConfigError(
            "run.budget.usd needs the backend's prices: set run.prices.input_usd_per_million "
            "and output_usd_per_million",
            path=source,
            field="run.budget.usd",
        )
    if r.min_items > r.max_items:
        raise ConfigError(
            f"rubrics.min_items ({r.min_items}) exceeds rubrics.max_items ({r.max_items}); "
            "lower min_items or raise max_items",
            path=source,
            field="rubrics.min_items",
        )
    if p.length_ratio_min > p.length_ratio_max:
        raise ConfigError(
            f"pairs.length_ratio_min ({p.length_ratio_min}) exceeds pairs.length_ratio_max "
            f"({p.length_ratio_max}), so every pair would be dropped; swap or widen them",
            path=source,
            field="pairs.length_ratio_min",
        )
    if p.similarity_min > p.similarity_max:
        raise ConfigError(
            f"pairs.similarity_min ({p.similarity_min}) exceeds pairs.similarity_max "
            f"({p.similarity_max}), so every pair would be dropped; swap or widen them",
            path=source,
            field="pairs.similarity_min",
        )
    if "length" in p.filters:
        # both answers hold 1..cap words, so chosen/rejected lies within [1/cap, cap]
        cap = int(cfg.responses.word_cap * (1 + p.length_slack))
        if p.length_ratio_min > cap or p.length_ratio_max < 1 / max(cap, 1):
            raise ConfigError(
                f"pairs.length_ratio_min/max [{p.length_ratio_min}, {p.length_ratio_max}] "
                f"excludes every ratio two answers of 1 to {cap} words can have, so every pair "
                "would be dropped",
                path=source,
                field="pairs.length_ratio_min",
            )


def _check_output_dir(cfg: Config, source: str) -> None:
    """run.output_dir (and the run directory in it) must be folders, or not exist yet."""
    for p in (Path(cfg.run.output_dir), cfg.run_dir):
        probe = p
        # the first part of the path that exists must be a folder
        while not probe.exists() and probe != probe.parent:
            probe = probe.parent
        if probe.exists() and not probe.is_dir():
            field = "run.output_dir" if p != cfg.run_dir else "run.name"
            raise ConfigError(
                f"{probe} is a file, not a folder; point run.output_dir at a folder "
                "(or move the file away)",
                path=source,
                field=field,
            )


def load_config(path: str | Path, overrides: list[str] | None = None) -> Config:
    """Load, override and validate a YAML config; errors name the file and the field.

    The environment variables the config names as holding secrets are registered with
    ``pipeline.redact``, so that every later error and echo masks their values.
    """
    path = Path(path)
    kind = path_kind(path)
    if kind is None:
        raise ConfigError("config file not found", path=path)
    if kind != "a file":
        # a named pipe or /dev/zero would be read forever
        raise ConfigError(f"is {kind}, not a file; pass the run's YAML config file", path=path)
    try:
        with open(path, "rb") as fh:
            raw = fh.read(_MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"cannot read config: {exc.strerror or exc}", path=path) from None
    if len(raw) > _MAX_CONFIG_BYTES:
        raise ConfigError(
            f"is larger than {_MAX_CONFIG_BYTES // 1024} KiB, too large for a config (one is a "
            "few KiB); pass the run's YAML config file",
            path=path,
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise ConfigError(
            f"not UTF-8 text (byte 0x{raw[exc.start]:02x} is {exc.reason}); save the file as UTF-8",
            path=path,
            line=line,
        ) from None
    register_names(_ENV_NAME_RE.findall(text))
    try:
        data = yaml.load(text, Loader=ConfigLoader)
    except DuplicateKeyError as exc:
        raise ConfigError(
            redact(
                f"key {exc.key!r} appears twice in one mapping (first on line "
                f"{exc.first_line}); YAML would silently keep only this one: merge the two "
                "or delete one"
            ),
            path=path,
            line=exc.line,
        ) from None
    except (yaml.YAMLError, ValueError, RecursionError) as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        raise ConfigError(
            f"not valid YAML: {_yaml_problem(exc)}; fix the syntax there",
            path=path,
            line=mark.line + 1 if mark is not None else None,
        ) from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError("the top level must be a mapping of sections", path=path)
    source = str(path) + (" (with --set overrides)" if overrides else "")
    _warn_flat_keys(_flat_backend_keys(data, overrides or []), source)
    data = apply_overrides(data, overrides or [], cwd_paths=True)
    _check_plain(data, source)
    backend = data.get("backend")
    if isinstance(backend, dict):
        try:  # moved here too, so that a clash names the file
            data["backend"], _ = move_flat_keys(backend)
        except ValueError as exc:
            raise ConfigError(str(exc), path=source, field="backend") from None
    try:
        cfg = Config.model_validate(data)
    except ValidationError as err:
        raise _format_validation(err, source) from None
    except RecursionError:
        raise ConfigError("nested too deeply", path=source) from None
    register_names([*cfg.backend.secret_env_names(), cfg.annotation.token_env])
    for url in (*cfg.backend.urls(), cfg.annotation.url):
        for secret in url_secrets(url) if url else []:
            register_value(secret)
    cfg._base_dir = path.resolve().parent  # before the checks that look at the run dir
    _check_consistency(cfg, source)
    _check_output_dir(cfg, source)
    _check_schema_budgets(cfg, source)
    cfg._base_dir = path.resolve().parent
    _check_input_paths(cfg, source)
    return cfg


def _check_schema_budgets(cfg: Config, source: str) -> None:
    """Every JSON schema a stage sends must fit its max_tokens (see pipeline/schemas.py):
    found now, not after an hour of cut-off answers."""
    from pipeline.schemas import check_budgets

    problems = check_budgets(cfg)
    if problems:
        field, why = problems[0]
        raise ConfigError(why, path=source, field=field)


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
            desc = f.description or ""
            bounds = _bounds_text(f.metadata)
            rows.append((dotted, shown, f"{desc} {bounds}" if bounds else desc))
    return rows


def _bounds_text(metadata: list[Any]) -> str | None:
    """A field's allowed range from its ge/gt/le/lt constraints, e.g. "(1 to 1,024)"."""
    low = high = None
    for m in metadata:
        if getattr(m, "ge", None) is not None:
            low = f"{m.ge:,}"
        elif getattr(m, "gt", None) is not None:
            low = f"more than {m.gt:,}"
        if getattr(m, "le", None) is not None:
            high = f"{m.le:,}"
        elif getattr(m, "lt", None) is not None:
            high = f"less than {m.lt:,}"
    if low is None and high is None:
        return None
    if high is None:
        return f"({low})" if str(low).startswith("more") else f"(at least {low})"
    if low is None:
        return f"(at most {high})"
    if low.startswith("more"):
        return f"({low}, at most {high})"
    return f"({low} to {high})"
