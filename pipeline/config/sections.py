"""The config's sections: one pydantic model per YAML section, and ``Config`` composing them.

Every field has a type, a default where one makes sense and a one-line description
(``prb config show`` prints them resolved). Secrets never live here: the config names the
environment variable that holds a key, never the key.
"""

from __future__ import annotations

import os
import typing
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, Field, SerializeAsAny, create_model, field_validator

from pipeline.core.errors import ConfigError
from pipeline.core.redact import public_url
from pipeline.core.section import Section
from pipeline.inputs import InputSection
from pipeline.kinds.backend import BackendSection
from pipeline.kinds.settings import check_http_url as _check_http_url
from pipeline.rules import RULES, default_filters, threshold_fields

STRATEGIES = ("avoid_all", "violate_one", "other_user")
Strategy = Literal["avoid_all", "violate_one", "other_user"]


class _Section(Section):
    """A section of the config (the rules every section keeps: pipeline/core/section.py)."""


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
    # OpenAI's Batch API answers at half these rates; the budget and the plan use them when
    # the backend sends batches (backend.openai.batch)
    batch_input_usd_per_million: float | None = Field(
        None,
        ge=0,
        le=1_000_000,
        description="US dollars per million prompt tokens sent through a batch API; none: "
        "unknown (a batch run is then priced at the standard rates).",
    )
    batch_output_usd_per_million: float | None = Field(
        None,
        ge=0,
        le=1_000_000,
        description="US dollars per million output tokens answered through a batch API; "
        "none: unknown.",
    )

    def batch_rates(self) -> PricesSection | None:
        """These prices with the batch rates in place of the standard ones; None when the
        batch rates are not given."""
        if self.batch_input_usd_per_million is None or self.batch_output_usd_per_million is None:
            return None
        return self.model_copy(
            update={
                "input_usd_per_million": self.batch_input_usd_per_million,
                "output_usd_per_million": self.batch_output_usd_per_million,
            }
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
        if not v:
            raise ValueError("must not be empty: it names the run's folder under run.output_dir")
        if "/" in v or v in (".", ".."):
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


class SamplingSection(_Section):
    temperature: float = Field(0.8, ge=0, le=2, description="Sampling temperature.")
    top_p: float = Field(0.95, gt=0, le=1, description="Nucleus sampling mass.")
    # 2**20 tokens: more than any model's whole context window
    max_tokens: int | None = Field(
        400,
        ge=1,
        le=2**20,
        description="Longest answer in tokens; null (the judge's and the rubric stage's "
        "default): what the longest answer its JSON schema allows takes (docs/plan.md).",
    )


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
    merge_given: bool = Field(
        False,
        description="Merge near-identical aspects of a given rubric too (off: a given rubric "
        "is kept as the input has it, as the reference keeps it; only exact repeats go).",
    )
    given_as_is: bool = Field(
        False,
        description="Keep a given rubric exactly as the input has it, as the reference's "
        "construction does: an empty (or missing) rubric_aspects is an empty rubric whose pair "
        "is still written ({plan} empty), an aspect repeated is kept with an item id of its "
        "own, and spaces at an aspect's ends stay. Off: such a question is dropped "
        "(no_given_rubric), a repeat is kept once and the ends are trimmed (docs/inputs.md).",
    )
    sampling: SamplingSection = Field(
        default_factory=lambda: SamplingSection(temperature=0.0, top_p=1.0, max_tokens=None),
        description="Sampling for rubric generation (greedy by default: one rubric per user); "
        "a max_tokens given also sizes the schema's text fields.",
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
        default_factory=lambda: SamplingSection(temperature=0.0, top_p=1.0, max_tokens=None),
        description="Sampling for judge calls (greedy: verdicts should be reproducible); "
        "max_tokens null: each verdict's schema's bound; a number also sizes the schemas' "
        "rationales.",
    )
    rationale_max_chars: int = Field(
        300,
        ge=40,
        le=100_000,
        description="Longest rationale a verdict schema allows (shorter when a given "
        "max_tokens is tight; see pipeline/types/schemas.py).",
    )
    enabled: bool = Field(
        True,
        description="false: the stage sends nothing and passes each example's chosen x "
        "rejected combinations on unjudged (the reference's construction); pairs.filters may "
        "then hold only filters that read no verdict (docs/filters.md).",
    )
    max_pairs_per_example: int = Field(
        4,
        ge=1,
        le=1000,
        description="Chosen x rejected combinations per example sent to the pairwise judge, "
        "best pointwise margin first.",
    )
    stop: Literal["auto", "first_pass", "outranked", "all"] = Field(
        "auto",
        description="When an example stops asking pairwise verdicts: first_pass, at the first "
        "combination that passes every filter (the kept pair: the best pointwise margin that "
        "passes); outranked, once no combination left can beat the best passed on the full "
        "margin (the pair judging all would keep); all, every combination a filter does not "
        "drop on its pointwise verdicts, in one round; auto: all for a backend that answers "
        "in rounds (batch files, a batch API), first_pass otherwise.",
    )
    chunk_size: int = _shard_size("judge")


# the response prompts a user's file may replace, and the placeholders each needs
PROMPT_FILE_USES: dict[str, tuple[str, ...]] = {
    "chosen": ("question", "profile", "plan"),
    "avoid_all": ("question", "profile", "plan"),
}
# filled where a file has them, never required
PROMPT_FILE_OPTIONAL: tuple[str, ...] = ("word_cap",)


class PromptsSection(_Section):
    dir: Path | None = Field(
        None,
        description="A folder of prompt files in the reference's style: plain text with "
        "{question}, {profile} and {plan} placeholders (e.g. a reference checkout's "
        "prompts/); relative paths resolve against the config file.",
    )
    files: dict[Literal["chosen", "avoid_all"], str] = Field(
        default_factory=dict,
        description="Response prompt -> its file in prompts.dir (e.g. chosen: chosen.txt, "
        "avoid_all: rejected.txt); a prompt not named here is the project's own "
        '(prompts/*.j2). docs/config.md, "Prompt files".',
    )

    @field_validator("files")
    @classmethod
    def _file_names(cls, v: dict[str, str]) -> dict[str, str]:
        for key, name in v.items():
            if not name.strip() or Path(name).is_absolute() or ".." in Path(name).parts:
                raise ValueError(
                    f"{key}: {name!r} is not a file name inside prompts.dir; give e.g. chosen.txt"
                )
        return v


class PairsSection(_Section):
    """The ``pairs`` section: the filters to run and, as fields of the model
    :func:`pairs_model` builds, every registered rule's thresholds (``pipeline/rules/``)."""

    filters: list[str] = Field(
        default_factory=default_filters,
        description="Pair filters in the order they run (see docs/filters.md).",
    )
    chunk_size: int = _shard_size("pairs")

    @field_validator("filters")
    @classmethod
    def _known_filters(cls, v: list[str]) -> list[str]:
        for name in v:
            try:
                RULES.check(name)
            except ConfigError as exc:
                raise ValueError(exc.reason) from None
            if RULES.get(name).position is None:
                raise ValueError(f"'{name}' is an audit check, not a pair filter")
        return v


_PAIRS: dict[tuple[Any, ...], type[PairsSection]] = {}


def pairs_model() -> type[PairsSection]:
    """The ``pairs`` section's model with a field per threshold of every registered rule,
    built again when the registered rules change."""
    key = tuple(RULES.items())
    got = _PAIRS.get(key)
    if got is None:
        _PAIRS.clear()
        got = _PAIRS[key] = create_model(  # type: ignore[call-overload]
            "PairsSection", __base__=PairsSection, __module__=__name__, **threshold_fields()
        )
    return got


def pairs_section(**values: Any) -> PairsSection:
    """A ``pairs`` section with these values (the others their defaults)."""
    return pairs_model()(**values)


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
        description="Virtual environment holding the label-studio server (created if "
        "missing); unset in the config, $PRB_LABEL_STUDIO_VENV names one when set.",
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
        "up (at least 1). Made of pairs outside the round only: fewer or none when those run "
        "out, and the export says so.",
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


def path_fields(model: type[BaseModel], prefix: str = "") -> list[str]:
    """The dotted names of ``model``'s fields typed as a path (or an optional one)."""
    out = []
    for name, f in model.model_fields.items():
        kind = f.annotation
        if isinstance(kind, type) and issubclass(kind, BaseModel):
            out += path_fields(kind, f"{prefix}{name}.")
        elif kind is Path or Path in typing.get_args(kind):
            out.append(f"{prefix}{name}")
    return out


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
    prompts: PromptsSection = Field(
        default_factory=PromptsSection,
        description="Prompt files that replace the project's response prompts.",
    )
    pairs: SerializeAsAny[PairsSection] = Field(
        default_factory=pairs_section, description="Pair stage."
    )

    @field_validator("pairs", mode="before")
    @classmethod
    def _current_pairs(cls, v: Any) -> Any:
        # validated by the model of the rules registered now: a rule's thresholds are its
        # fields, and a section made before a rule was registered is read again
        model = pairs_model()
        if isinstance(v, PairsSection) and type(v) is not model:
            v = v.model_dump()
        return v if isinstance(v, model) else model.model_validate(v)

    annotation: AnnotationSection = Field(
        default_factory=AnnotationSection, description="Human verification rounds."
    )

    # Where the config file lives; relative input paths resolve against it.
    _base_dir: Path = Path(".")

    # The config file this config was read from (resolved); None when built in code.
    _source: Path | None = None

    def set_base_dir(self, folder: Path) -> None:
        """Resolve relative paths of this config against ``folder`` (the config file's)."""
        self._base_dir = folder

    def set_source(self, path: Path) -> None:
        """Record the config file this config was read from (``load_config``)."""
        self._source = Path(path)

    @property
    def source(self) -> Path | None:
        """The config file this config was read from; None when it was built in code."""
        return self._source

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
        # every path as the config meant it (a relative one is the config file's folder's):
        # run.yaml is read from the run directory, where the file's folder is not known.
        # The annotation server's folders are the current folder's (prb annotate serve)
        for dotted in path_fields(type(self)):
            if dotted.startswith("annotation."):
                continue
            *above, leaf = dotted.split(".")
            node: Any = data
            for key in above:
                node = node.get(key) if isinstance(node, dict) else None
            if isinstance(node, dict) and isinstance(node.get(leaf), str) and node[leaf]:
                node[leaf] = os.path.abspath(self.resolve_input(Path(node[leaf])) or "")
        data["backend"] = self.backend.public(data["backend"])
        if data["annotation"].get("url"):
            data["annotation"]["url"] = public_url(data["annotation"]["url"])
        return yaml.safe_dump(data, sort_keys=False, allow_unicode=True)
