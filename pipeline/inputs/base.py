"""What an input format is: a reader class that owns its paths, its detection, its
reading (every row validated with a line- or row-exact error) and its example count, and
the registry that names them (``input.format`` in the config).

The field checks every format shares live here too, so that the same bad value reads the
same way whichever format carried it. Rows a reader yields have exactly the keys of the
``examples`` contract (see ``example_row``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator

from pipeline.core.errors import InputError
from pipeline.core.fields import visible_text
from pipeline.core.ids import stable_id
from pipeline.core.registry import Registry
from pipeline.core.section import Section

# What a configured path must be (checked when the config loads, before anything opens it).
PathWant = Literal["file", "folder or parquet file"]
Resolve = Callable[[Path | None], Path | None]


class InputFormat:
    """One input format. Subclass it, register it (``FORMATS.register("name", Class)`` or
    ``@register_format("name")``) and ``input.format: name`` reads with it; see docs/inputs.md.

    An instance reads one configured input: ``section`` is the config's ``input`` section,
    ``resolve`` turns a configured path into a usable one (relative paths are the config
    file's folder's)."""

    # set by the registry from the registered name
    name: ClassVar[str] = ""
    # a few words for input.format's description (`prb config fields`, docs/config.md)
    summary: ClassVar[str] = ""

    def __init__(self, section: InputSection, resolve: Resolve = lambda p: p) -> None:
        self.section = section
        self.resolve = resolve

    @classmethod
    def path_fields(cls, section: InputSection) -> list[tuple[str, Path | None, PathWant]]:
        """(dotted config field, configured path, what must be there) for every path this
        format reads. The config refuses a path that is something else (a named pipe, a
        device) when it loads, before anything opens it; ingest fingerprints their content."""
        return []

    @classmethod
    def detect(cls, path: Path) -> bool:
        """Whether ``path`` looks like this format's input; cheap (a stat, a few bytes).
        Used to name the right format when a path does not fit the configured one."""
        return False

    def sources(self) -> list[Path]:
        """The resolved files or folders whose content decides the examples."""
        found = []
        for _, p, _ in self.path_fields(self.section):
            resolved = self.resolve(p)
            if resolved is not None:
                found.append(resolved)
        return found

    def read(self) -> Iterator[dict]:
        """Every example, validated, in input order (``input.limit`` is applied by the
        caller). Raise ``InputError`` naming the file, the line or row and the field of the
        first problem; a reader may stream, so rows before a bad one may have been yielded."""
        raise NotImplementedError

    def count(self) -> int:
        """How many examples the input holds (before ``input.limit``), for progress and the
        plan. Cheap where the format allows (lines, a dataset's row count); a bad input may
        be counted, the read still refuses it."""
        return sum(1 for _ in self.read())

    def need_path(self, field: str) -> Path:
        """The resolved ``input.<field>``, or an error saying this format needs it."""
        value = self.resolve(getattr(self.section, field))
        if value is None:
            raise InputError(
                f"must be set for input.format '{self.name}': give it in the config file or "
                f"with --set input.{field}=...",
                field=f"input.{field}",
            )
        return Path(value)


class FormatRegistry(Registry[type[InputFormat]]):
    """Input format names -> reader classes (pipeline/core/registry.py's checks). Built-in
    formats are ``"module:Class"`` strings imported on first use (``datasets`` stays out
    of a JSONL run); a class given directly is checked at once."""

    def detect(self, path: Path) -> str | None:
        """The first format whose ``detect`` recognises ``path``, if any."""
        for name in self.names():
            if self.get(name).detect(path):
                return name
        return None


FORMATS = FormatRegistry("input format", InputFormat, field="input.format")


def register_format(name: str) -> Callable[[type[InputFormat]], type[InputFormat]]:
    """Class decorator: ``@register_format("csv") class CsvFormat(InputFormat): ...``."""
    return FORMATS.register(name)


class InputSection(Section):
    """The config's ``input`` section: which format reads the examples, and its paths."""

    format: str = Field(
        "lamp",
        description="Input format, one of the registered readers (others: docs/inputs.md):",
        json_schema_extra={"registry": "pipeline.inputs:FORMATS"},
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
    chunk_size: int = Field(
        256, ge=1, le=1_000_000,
        description="Examples per ingest stage output shard (a crash loses at most one).",
    )  # fmt: skip

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


# ---------------------------------------------------------------------------------------
# Where a row comes from, and the field checks every format shares


@dataclass(frozen=True)
class Loc:
    """Where a row comes from: the file, its line (or row) number and the word to use."""

    path: Path | str
    line: int
    unit: str = "line"  # "line" for text files, "row" for datasets / parquet

    def fail(self, field: str | None, message: str) -> InputError:
        # InputError's own prefix already says "line N"; for table rows say "row N" as well.
        if self.unit != "line":
            message = f"{self.unit} {self.line}: {message}"
        return InputError(message, path=self.path, line=self.line, field=field)


def kind_of(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list | tuple):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def required(obj: Mapping[str, Any], key: str, field: str, loc: Loc) -> Any:
    # A missing key and a null read the same (Arrow fills absent struct fields with null).
    if obj.get(key) is None:
        raise loc.fail(field, "required field is missing or null")
    return obj[key]


def _blank(value: str) -> str:
    """How a string with nothing visible is described in an error."""
    if not value:
        return "an empty string"
    if not value.strip():
        return "only whitespace"
    return "text with nothing visible (only zero-width, control or blank characters)"


def text(value: Any, field: str, loc: Loc) -> str:
    if not isinstance(value, str):
        raise loc.fail(field, f"must be a non-empty string, got {kind_of(value)}")
    if not visible_text(value):
        raise loc.fail(field, f"must be a non-empty string, got {_blank(value)}")
    return value


def opt_text(value: Any, field: str, loc: Loc) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise loc.fail(field, f"must be a string or null, got {kind_of(value)}")
    return value


def ident(value: Any, field: str, loc: Loc) -> str:
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise loc.fail(field, f"must be a non-empty string or an integer, got {kind_of(value)}")
    as_text = str(value)
    if not visible_text(as_text):
        raise loc.fail(field, f"must be a non-empty string or an integer, got {_blank(as_text)}")
    return as_text


def profile(value: Any, field: str, loc: Loc) -> list[dict]:
    if not isinstance(value, list | tuple):
        raise loc.fail(field, f"must be a list of past posts, got {kind_of(value)}")
    posts = []
    for i, item in enumerate(value):
        where = f"{field}[{i}]"
        if not isinstance(item, Mapping):
            raise loc.fail(where, f"must be an object with 'id' and 'text', got {kind_of(item)}")
        f_id, f_text = f"{where}.id", f"{where}.text"
        posts.append(
            {
                "id": ident(required(item, "id", f_id, loc), f_id, loc),
                "category": opt_text(item.get("category"), f"{where}.category", loc),
                "text": text(required(item, "text", f_text, loc), f_text, loc),
            }
        )
    return posts


def rubric(value: Any, field: str, loc: Loc) -> list[dict] | None:
    if value is None:
        return None
    if not isinstance(value, list | tuple):
        raise loc.fail(field, f"must be a list of rubric aspects or null, got {kind_of(value)}")
    items = []
    for i, item in enumerate(value):
        where = f"{field}[{i}]"
        if not isinstance(item, Mapping):
            raise loc.fail(where, f"must be an object with 'aspect', got {kind_of(item)}")
        aspect = required(item, "aspect", f"{where}.aspect", loc)
        items.append(
            {
                "aspect": text(aspect, f"{where}.aspect", loc),
                "evidence": opt_text(item.get("evidence"), f"{where}.evidence", loc) or "",
                "reason": opt_text(item.get("reason"), f"{where}.reason", loc) or "",
            }
        )
    return items


# Our field names, each read from the key of the same name unless a mapping says otherwise
# (the input's own id is read from "id").
FIELDS = (
    "source_id",
    "user_id",
    "question",
    "category",
    "profile",
    "narrative",
    "rubric_aspects",
)
DEFAULT_KEYS: dict[str, str] = {name: name for name in FIELDS} | {"source_id": "id"}


def question_fields(obj: Mapping[str, Any], loc: Loc, keys: Mapping[str, str]) -> dict:
    """Validate the per-question fields (everything but the profile and the user)."""
    k_id, k_q = keys["source_id"], keys["question"]
    source_id = ident(required(obj, k_id, k_id, loc), k_id, loc)
    question = text(required(obj, k_q, k_q, loc), k_q, loc)
    k_cat, k_nar, k_rub = keys["category"], keys["narrative"], keys["rubric_aspects"]
    return {
        "source_id": source_id,
        "question": question,
        "category": opt_text(obj.get(k_cat), k_cat, loc),
        "narrative": opt_text(obj.get(k_nar), k_nar, loc),
        "rubric_aspects": rubric(obj.get(k_rub), k_rub, loc),
    }


def example_row(fields: dict, user_id: str, posts: list[dict]) -> dict:
    """One row of the ``examples`` contract from validated fields."""
    source_id = fields["source_id"]
    return {
        "example_id": stable_id("example", source_id),
        "source_id": source_id,
        "user_id": user_id,
        "question": fields["question"],
        "category": fields["category"],
        "profile": posts,
        "narrative": fields["narrative"],
        "rubric_aspects": fields["rubric_aspects"],
    }


class Unique:
    """Remembers where each id was first seen, to name both lines of a duplicate (and both
    sources, when one input spans several: a Hub dataset's configs)."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.seen: dict[str, tuple[Path | str, int]] = {}

    def add(self, key: str, field: str, loc: Loc) -> None:
        first = self.seen.get(key)
        if first is not None:
            where = "" if first[0] == loc.path else f"in {first[0]}, "
            raise loc.fail(
                field,
                f"duplicate {self.what} {key!r} (first seen {where or 'on '}{loc.unit} {first[1]})",
            )
        self.seen[key] = (loc.path, loc.line)
