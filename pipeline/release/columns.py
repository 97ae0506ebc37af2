"""The release row, defined once: every column with its type, its group and its check.

A release (``prb publish``) is one parquet file per config whose rows are built from the
pair records (:mod:`pipeline.types.records`). Everything that knows a release column reads it
from :data:`COLUMNS`:

- :func:`features`: the ``datasets`` Features (and so the Arrow schema) of the files;
- :func:`build_row`: the row of one pair record and its human verdict;
- :func:`check_row`: whether a row read back (a release, or any pairs file in the
  reference schema) has each checked column of the type the table gives it; the first
  that has not is a :class:`~pipeline.types.records.RecordProblem` naming the field.

Groups: ``reference`` (the reference release's eight columns, in its names, types and
order, so its evaluation code loads ours unchanged), ``provenance`` (what built the pair),
``judge`` (the LLM judge's verdicts), ``human`` (the latest annotation round's verdict)
and ``profile`` (the run's profile ranking: the posts its prompts showed, most relevant
first).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pipeline.core.fields import (
    COVERAGE_MAX,
    COVERAGE_MIN,
    DIMENSIONS,
    ORDERS,
    PREFERENCES,
    QUALITY_MAX,
    QUALITY_MIN,
    SIDES,
    is_number,
    quality_scores,
)
from pipeline.rules.verdicts import prefers
from pipeline.types.records import RecordProblem

if TYPE_CHECKING:
    from datasets import Features

GROUPS: tuple[str, ...] = ("reference", "provenance", "judge", "human", "profile")
# Lone surrogates survive json.loads but cannot be written as UTF-8 (or hashed).
_SURROGATE_RE = re.compile(r"[\ud800-\udfff]")


# ---- value kinds: an Arrow type and a check each -----------------------------------------


class Kind:
    """A column's value type: its ``datasets`` feature and its check."""

    def feature(self) -> Any:
        raise NotImplementedError

    def check(self, v: Any, field: str) -> None:
        """Raise :class:`RecordProblem` when ``v`` is not of this kind."""
        raise NotImplementedError


@dataclass(frozen=True)
class Text(Kind):
    """A string; ``ident``: an integer is taken too (numeric ids are ids)."""

    optional: bool = True
    ident: bool = False

    def feature(self) -> Any:
        from datasets import Value

        return Value("string")

    def check(self, v: Any, field: str) -> None:
        if v is None and self.optional:
            return
        if self.ident and isinstance(v, int) and not isinstance(v, bool):
            return
        if not isinstance(v, str):
            raise RecordProblem(field, "a string" + (" or null" if self.optional else ""), v)
        m = None if v.isascii() else _SURROGATE_RE.search(v)  # isascii: one C pass
        if m:
            raise RecordProblem(
                field, "valid Unicode text", f"a lone surrogate \\u{ord(m.group()):04x}"
            )


@dataclass(frozen=True)
class Choice(Kind):
    """One of a few strings, or null."""

    values: tuple[str, ...]

    def feature(self) -> Any:
        from datasets import Value

        return Value("string")

    def check(self, v: Any, field: str) -> None:
        if v is not None and v not in self.values:
            raise RecordProblem(field, " / ".join(self.values) + " or null", v)


@dataclass(frozen=True)
class Number(Kind):
    """An int64 or float64; with bounds, a number inside them (named ``what``) or null."""

    dtype: str = "float64"
    lo: float | None = None
    hi: float | None = None
    what: str = "a number"

    def feature(self) -> Any:
        from datasets import Value

        return Value(self.dtype)

    def check(self, v: Any, field: str) -> None:
        if v is None:
            return
        bounded = self.lo is not None and self.hi is not None
        if not is_number(v) or (bounded and not self.lo <= v <= self.hi):
            span = f" {self.lo:g}-{self.hi:g}" if bounded else ""
            raise RecordProblem(field, f"{self.what}{span} or null", v)


@dataclass(frozen=True)
class Seq(Kind):
    """A list of one kind's values, or null."""

    item: Kind
    what: str

    def feature(self) -> Any:
        from datasets import List

        return List(self.item.feature())

    def check(self, v: Any, field: str) -> None:
        if v is None:
            return
        if not isinstance(v, list):
            raise RecordProblem(field, self.what + " or null", v)
        for k, x in enumerate(v):
            self.item.check(x, f"{field}[{k}]")


@dataclass(frozen=True)
class Struct(Kind):
    """An object of named fields (each of its own kind), or null; ``what`` names it in a
    message."""

    fields: tuple[tuple[str, Kind], ...]
    what: str

    def feature(self) -> Any:
        return {name: kind.feature() for name, kind in self.fields}

    def check(self, v: Any, field: str) -> None:
        if v is None:
            return
        if not isinstance(v, Mapping):
            raise RecordProblem(field, self.what, v)
        for name, kind in self.fields:
            kind.check(v.get(name), f"{field}.{name}")


@dataclass(frozen=True)
class Records(Kind):
    """A list of objects of named fields, or null (``profile``, ``rubric_aspects``)."""

    fields: tuple[tuple[str, Kind], ...]

    def feature(self) -> Any:
        from datasets import List

        return List({name: kind.feature() for name, kind in self.fields})

    def check(self, v: Any, field: str) -> None:
        if v is None:
            return
        if not isinstance(v, list):
            raise RecordProblem(field, "a list of objects or null", v)
        for k, item in enumerate(v):
            if not isinstance(item, Mapping):
                raise RecordProblem(f"{field}[{k}]", "an object", item)
            for name, kind in self.fields:
                kind.check(item.get(name), f"{field}[{k}].{name}")

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.fields)


class _Unchecked(Kind):
    """Wraps a kind whose values no reader of a release relies on: any value passes the
    check (a pairs file from elsewhere may use the name for something else)."""

    def __init__(self, kind: Kind) -> None:
        self.kind = kind

    def feature(self) -> Any:
        return self.kind.feature()

    def check(self, v: Any, field: str) -> None:
        return None


# ---- what a row is built from -------------------------------------------------------------


def json_text(obj: Any) -> str:
    """A value as the release's JSON columns and figures write it: sorted keys, UTF-8."""
    return json.dumps(obj, sort_keys=True, ensure_ascii=False)


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _template_info(p: dict | None) -> dict[str, Any] | None:
    if not p:
        return None
    return {k: p.get(k) for k in ("template", "template_version", "template_hash")}


def credited(prov: Mapping[str, Any]) -> str | None:
    """What to credit with an answer or verdict: the model name, unless what served it was
    no model (the stand-in, hand-written answers): then that, never the name it was asked
    under."""
    served = prov.get("served_by") or {}
    if isinstance(served, dict) and served.get("model_output") is False:
        who = served.get("responder") or served.get("kind") or "stand-in"
        return f"not a model: {who} answers (requested as {prov.get('model')})"
    return prov.get("model")


def _generator(record: Mapping[str, Any]) -> dict[str, Any]:
    return (record.get("provenance") or {}).get("generator") or {}


def _judge_prov(record: Mapping[str, Any]) -> dict[str, Any]:
    return (record.get("provenance") or {}).get("judge") or {}


def generator_model(record: Mapping[str, Any]) -> str | None:
    """What wrote the pair's answers, as the release names it."""
    gen = _generator(record)
    ch, rj = credited(gen.get("chosen") or {}), credited(gen.get("rejected") or {})
    return ch if ch == rj else f"{ch} (chosen), {rj} (rejected)"


def sampling_of(record: Mapping[str, Any]) -> dict[str, Any]:
    """Generator sampling per side, judge sampling and seed (the release's `sampling`);
    the judge's is null for a pair nothing judged (``judge.enabled: false``)."""
    gen = _generator(record)
    g_ch, g_rj = gen.get("chosen") or {}, gen.get("rejected") or {}
    judge = _judge_prov(record)
    return {
        "chosen": {**(g_ch.get("sampling") or {}), "n": g_ch.get("n")},
        "rejected": {**(g_rj.get("sampling") or {}), "n": g_rj.get("n")},
        "judge": None
        if judge.get("judged") is False
        else {**(judge.get("sampling") or {}), "seed": judge.get("seed")},
    }


def templates_of(record: Mapping[str, Any]) -> dict[str, Any]:
    """Template name, version and sha256 per side and per judge template."""
    gen = _generator(record)
    judge = _judge_prov(record)
    return {
        "chosen": _template_info(gen.get("chosen")),
        "rejected": _template_info(gen.get("rejected")),
        "judge": {k: _template_info(v) for k, v in (judge.get("templates") or {}).items()},
    }


def _judge(record: Mapping[str, Any]) -> dict[str, Any]:
    return record.get("judge") or {}


def _coverage(record: Mapping[str, Any], side: str) -> dict[str, Any]:
    return (_judge(record).get("coverage") or {}).get(side) or {}


def _violated_coverage(record: Mapping[str, Any]) -> float | None:
    cov = _coverage(record, "rejected")
    return _mean([cov[i] for i in record.get("violated_item_ids") or [] if i in cov])


def _items(record: Mapping[str, Any]) -> list[dict[str, Any]]:
    return (record.get("rubric") or {}).get("items") or []


def ranked_profile(record: Mapping[str, Any]) -> tuple[list[Mapping[str, Any]], list[int] | None]:
    """The record's profile as the release holds it: the posts the run's ranking put first
    (``profile_view.order``), most relevant first, then every other post in source order,
    so a reader of the first k posts (the reference's BoN/ and PPO/ scripts) reads the
    ranking; and the ranking's indices into that list (0..k-1). A record without a
    ranking keeps its source order (and None)."""
    posts = list(record.get("profile") or [])
    view = record.get("profile_view")
    order = view.get("order") if isinstance(view, Mapping) else None
    if not isinstance(order, list):
        return posts, None
    first = list(dict.fromkeys(
        i for i in order if isinstance(i, int) and not isinstance(i, bool) and 0 <= i < len(posts)
    ))  # fmt: skip
    if len(first) != len(order):  # not a ranking of these posts: the check names it
        return posts, order
    shown = set(first)
    rest = [i for i in range(len(posts)) if i not in shown]
    return [posts[i] for i in first + rest], list(range(len(first)))


def _profile_view(record: Mapping[str, Any]) -> dict[str, Any] | None:
    view = record.get("profile_view")
    if not isinstance(view, Mapping):
        return None
    return {"ranker": view.get("ranker"), "top_k": view.get("top_k"),
            "order": ranked_profile(record)[1]}  # fmt: skip


# ---- the table ----------------------------------------------------------------------------

Builder = Callable[[Mapping[str, Any], Mapping[str, Any]], Any]


@dataclass(frozen=True)
class Column:
    """One release column: ``kind`` gives its type and check, ``build`` its value from a
    pair record and the pair's latest human verdict (an empty mapping when none)."""

    name: str
    kind: Kind
    group: str
    build: Builder
    doc: str = ""
    required: bool = False  # every pairs file the audit reads must have it
    privileged: bool = False  # the user's hidden expectations: never a reward model's input


_S = Text()
_ID = Text(ident=True)
_I64 = Number("int64")
_F64 = Number("float64")
PROFILE_POST = Records((("id", _ID), ("category", _S), ("text", _S)))
RUBRIC_ASPECT = Records((("aspect", _S), ("evidence", _S), ("reason", _S)))
QUALITY = Struct(
    tuple((d, Number("int64", QUALITY_MIN, QUALITY_MAX, "a score")) for d in DIMENSIONS),
    "an object of scores (" + ", ".join(DIMENSIONS) + ")",
)
COVERAGE_MEAN = Number("float64", COVERAGE_MIN, COVERAGE_MAX)
PAIRWISE = Struct(tuple((o, Choice(PREFERENCES)) for o in ORDERS), "an object {AB, BA}")
PROFILE_VIEW = Struct(
    (("ranker", _S), ("top_k", _I64), ("order", Seq(Number("int64"), "a list of indices"))),
    "an object {ranker, top_k, order} or null",
)


def _col(name: str, kind: Kind, group: str, build: Builder, doc: str = "", **kw: Any) -> Column:
    return Column(name, kind, group, build, doc, **kw)


def _unchecked(kind: Kind) -> Kind:
    return _Unchecked(kind)


def _record(key: str) -> Builder:
    return lambda r, v: r.get(key)


COLUMNS: tuple[Column, ...] = (
    # the reference release's eight columns, in its order
    _col("id", _ID, "reference",
         lambda r, v: str(r.get("source_id") or r["example_id"]),
         "the source example's id"),
    _col("question", Text(optional=False), "reference", lambda r, v: r["question"],
         required=True),
    _col("profile", PROFILE_POST, "reference",
         lambda r, v: [{"id": p.get("id"), "category": p.get("category"),
                        "text": p.get("text")} for p in ranked_profile(r)[0]],
         "every past post of the user: the run's top_k ranked first, the rest in source "
         "order"),
    _col("rubric_aspects", RUBRIC_ASPECT, "reference",
         lambda r, v: [{k: it.get(k) for k in ("aspect", "evidence", "reason")}
                       for it in _items(r)],
         privileged=True),
    _col("narrative", _S, "reference", _record("narrative"), privileged=True),
    _col("category", _S, "reference", _record("category")),
    _col("chosen", Text(optional=False), "reference", lambda r, v: r["chosen"], required=True),
    _col("rejected", Text(optional=False), "reference", lambda r, v: r["rejected"],
         required=True),
    # provenance
    _col("pair_id", _ID, "provenance", lambda r, v: r["pair_id"]),
    _col("example_id", _ID, "provenance", lambda r, v: r["example_id"]),
    _col("user_id", _ID, "provenance", _record("user_id")),
    _col("rubric_version", _unchecked(_S), "provenance", _record("rubric_version")),
    _col("rubric_source", _unchecked(_S), "provenance",
         lambda r, v: (r.get("rubric") or {}).get("source")),
    _col("rubric_item_ids", _unchecked(Seq(_S, "a list of strings")), "provenance",
         lambda r, v: [it.get("item_id") for it in _items(r)],
         "aligned with rubric_aspects; violated_item_ids refer here"),
    _col("strategy", _unchecked(_S), "provenance", _record("strategy")),
    _col("violated_item_ids", _unchecked(Seq(_S, "a list of strings")), "provenance",
         lambda r, v: list(r.get("violated_item_ids") or [])),
    _col("finish_reasons", Struct(tuple((s, _S) for s in SIDES),
                                  "an object {chosen, rejected} or null"), "provenance",
         lambda r, v: {s: (r.get("finish_reasons") or {}).get(s) for s in SIDES},
         '"length": cut at max_tokens'),
    _col("generator_model", _unchecked(_S), "provenance", lambda r, v: generator_model(r)),
    _col("judge_model", _unchecked(_S), "provenance", lambda r, v: credited(_judge_prov(r))),
    _col("sampling", _unchecked(_S), "provenance", lambda r, v: json_text(sampling_of(r)),
         "JSON: generator sampling per side, judge sampling and seed"),
    _col("seeds", _unchecked(Struct(tuple((s, _I64) for s in SIDES), "an object")),
         "provenance",
         lambda r, v: {s: (_generator(r).get(s) or {}).get("seed") for s in SIDES}),
    _col("template_hashes", _unchecked(_S), "provenance", lambda r, v: json_text(templates_of(r)),
         "JSON: template name, version and sha256 per side and judge"),
    _col("margin", _unchecked(_F64), "provenance", _record("margin")),
    _col("similarity", _unchecked(_F64), "provenance", _record("similarity")),
    # the judge
    _col("quality_chosen", QUALITY, "judge",
         lambda r, v: quality_scores((_judge(r).get("quality") or {}).get("chosen"))),
    _col("quality_rejected", QUALITY, "judge",
         lambda r, v: quality_scores((_judge(r).get("quality") or {}).get("rejected"))),
    _col("coverage_chosen_mean", COVERAGE_MEAN, "judge",
         lambda r, v: _mean(list(_coverage(r, "chosen").values()))),
    _col("coverage_rejected_mean", COVERAGE_MEAN, "judge",
         lambda r, v: _mean(list(_coverage(r, "rejected").values()))),
    _col("coverage_rejected_violated_mean", COVERAGE_MEAN, "judge",
         lambda r, v: _violated_coverage(r)),
    _col("pairwise_aware", PAIRWISE, "judge",
         lambda r, v: prefers(_judge(r).get("pairwise") or {}, "pairwise_aware"),
         "which side each A/B order preferred: chosen/rejected/tie"),
    _col("pairwise_blind", PAIRWISE, "judge",
         lambda r, v: prefers(_judge(r).get("pairwise") or {}, "pairwise_blind")),
    # human verification
    _col("human_verdict", _S, "human", lambda r, v: v.get("status"),
         "latest status: verified / unresolved; null: not annotated"),
    _col("human_majority", _unchecked(_S), "human", lambda r, v: v.get("majority")),
    _col("human_votes", _unchecked(_I64), "human", lambda r, v: int(v.get("n_votes") or 0)),
    _col("human_agreement", Number("float64", 0, 1, "a share"), "human",
         lambda r, v: v.get("share"), "share of votes behind the majority label"),
    _col("human_round", _unchecked(_I64), "human", lambda r, v: v.get("round")),
    # the run's profile ranking
    _col("profile_view", PROFILE_VIEW, "profile", lambda r, v: _profile_view(r),
         "the run's ranking: `order` indexes `profile`, most relevant first (the release "
         "puts them first: 0..k-1); `ranker` and `top_k` made it"),
)  # fmt: skip

BY_NAME: dict[str, Column] = {c.name: c for c in COLUMNS}


def names(group: str | None = None, **flags: bool) -> tuple[str, ...]:
    """Column names in table order: of one group, and/or with the given flags set
    (``required=True``, ``privileged=True``)."""
    return tuple(
        c.name
        for c in COLUMNS
        if (group is None or c.group == group)
        and all(getattr(c, k) == want for k, want in flags.items())
    )


# The reference release's eight columns, in its order.
REFERENCE_COLUMNS: tuple[str, ...] = names("reference")
# What any pairs file must have for the audit to read it.
REQUIRED_COLUMNS: tuple[str, ...] = names(required=True)
# Columns that describe the user's hidden expectations: never a reward model's input.
PRIVILEGED_COLUMNS: tuple[str, ...] = names(privileged=True)
# Sub-fields of the list columns.
PROFILE_FIELDS: tuple[str, ...] = PROFILE_POST.names
ASPECT_FIELDS: tuple[str, ...] = RUBRIC_ASPECT.names


def features(group: str | None = None) -> Features:
    """The ``datasets`` Features of the release (or of one group's columns), in table
    order; ``features().arrow_schema`` is the parquet files' schema."""
    from datasets import Features

    return Features({c.name: c.kind.feature() for c in COLUMNS if group in (None, c.group)})


def build_row(record: Mapping[str, Any], verdict: Mapping[str, Any] | None) -> dict[str, Any]:
    """The release row of one pair record (:mod:`pipeline.types.records`) and its latest human
    verdict (None: not annotated)."""
    v = verdict or {}
    return {c.name: c.build(record, v) for c in COLUMNS}


# Checked first: a row without its texts is refused for that, before any other field.
_CHECK_ORDER: tuple[Column, ...] = tuple(
    sorted(COLUMNS, key=lambda c: (not c.required, COLUMNS.index(c)))
)


def check_row(row: Mapping[str, Any]) -> None:
    """Raise :class:`RecordProblem` naming the first field of ``row`` whose value is not of
    its column's kind (missing fields are null); plus the profile ranking's indices must
    point into the row's profile."""
    for c in _CHECK_ORDER:
        c.kind.check(row.get(c.name), c.name)
    view = row.get("profile_view")
    if isinstance(view, Mapping) and view.get("order") is not None:
        n = len(row.get("profile") or [])
        for k, i in enumerate(view["order"]):
            if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < n:
                raise RecordProblem(
                    f"profile_view.order[{k}]", f"an index into profile (0-{n - 1})", i
                )
