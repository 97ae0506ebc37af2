"""The pair record: what the pair stage writes for every kept pair, once, and what every
command after it reads (publish, annotate, audit, eval), through one accessor
(:meth:`pipeline.run.RunDir.pair_records`) with one error policy.

A record carries everything a downstream command needs, so none of them joins the pair
stage with the ingest and rubric stages again:

- the example: ``example_id``, ``source_id``, ``user_id``, ``question``, ``category``,
  ``narrative``, ``profile`` (every past post: ``id``, ``category``, ``text``);
- ``profile_view``: the profile ranking the run used (``ranker``, ``top_k`` and ``order``,
  the indices of the top posts in ``profile``, most relevant first): computed once, at
  ingest, by the configured ranker;
- ``rubric``: ``version``, ``source`` and ``items`` (``item_id``, ``aspect``,
  ``evidence``, ``reason``); ``rubric_version`` repeats the version;
- the pair: ``pair_id``, ``chosen``, ``rejected``, ``chosen_id``, ``rejected_id``,
  ``strategy``, ``violated_item_ids``, ``finish_reasons`` (per side), ``margin``,
  ``similarity``;
- ``judge``: quality per side, coverage scores per side, pairwise verdicts
  (``pairwise_aware``/``pairwise_blind``, each per A/B order);
- ``provenance``: ``generator`` per side and ``judge``: model, sampling, seed, templates.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pipeline.core.fields import (
    COVERAGE_MAX,
    COVERAGE_MIN,
    DIMENSIONS,
    PREFERENCES,
    QUALITY_MAX,
    QUALITY_MIN,
    is_number,
)

PAIR_RECORD_FIELDS: frozenset[str] = frozenset(
    {
        "pair_id",
        "example_id",
        "source_id",
        "user_id",
        "question",
        "category",
        "narrative",
        "profile",
        "profile_view",
        "rubric",
        "rubric_version",
        "chosen",
        "rejected",
        "chosen_id",
        "rejected_id",
        "strategy",
        "violated_item_ids",
        "finish_reasons",
        "margin",
        "similarity",
        "judge",
        "provenance",
    }
)


def type_name(v: Any) -> str:
    """A value's type as an error message names it."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return f"{str(v).lower()} (a boolean)"
    if isinstance(v, str):
        return f"the string {v[:30]!r}"
    if isinstance(v, int | float):
        return f"{v!r}"
    return {"list": "a list", "dict": "an object"}.get(type(v).__name__, type(v).__name__)


class RecordProblem(ValueError):
    """A field of a pair record that is missing or of the wrong type."""

    def __init__(self, field: str, expected: str, value: Any) -> None:
        self.field = field
        super().__init__(f"'{field}' must be {expected}, got {type_name(value)}")


def _text(rec: Mapping[str, Any], field: str, optional: bool = False) -> None:
    v = rec.get(field)
    if v is None and optional:
        return
    if not isinstance(v, str):
        raise RecordProblem(field, "a string" + (" or null" if optional else ""), v)


def _ident(rec: Mapping[str, Any], field: str) -> None:
    v = rec.get(field)
    if v is not None and (isinstance(v, bool) or not isinstance(v, str | int)):
        raise RecordProblem(field, "a string", v)


def _object(v: Any, field: str) -> Mapping[str, Any]:
    if not isinstance(v, Mapping):
        raise RecordProblem(field, "an object", v)
    return v


def check_judge(judge: Any, field: str = "judge") -> None:
    """The judge block of a pair: quality scores 1-5 per side, coverage 0-2 per item and
    side, pairwise preferences per kind and order (each part may be absent)."""
    if judge is None:
        return
    judge = _object(judge, field)
    for key in ("quality", "coverage", "pairwise"):
        if judge.get(key) is not None:
            _object(judge[key], f"{field}.{key}")
    for side in ("chosen", "rejected"):
        q = (judge.get("quality") or {}).get(side)
        if q is not None:
            q = _object(q, f"{field}.quality.{side}")
            for d in DIMENSIONS:
                v = q.get(d)
                if v is not None and (not is_number(v) or not QUALITY_MIN <= v <= QUALITY_MAX):
                    raise RecordProblem(
                        f"{field}.quality.{side}.{d}", f"a score {QUALITY_MIN}-{QUALITY_MAX}", v
                    )
        cov = (judge.get("coverage") or {}).get(side)
        if cov is not None:
            if not isinstance(cov, Mapping):
                raise RecordProblem(f"{field}.coverage.{side}", "an object of item scores", cov)
            for item, score in cov.items():
                if not is_number(score) or not COVERAGE_MIN <= score <= COVERAGE_MAX:
                    raise RecordProblem(
                        f"{field}.coverage.{side}.{item}",
                        f"a number {COVERAGE_MIN}-{COVERAGE_MAX}",
                        score,
                    )
    for kind, v in (judge.get("pairwise") or {}).items():
        v = _object(v, f"{field}.pairwise.{kind}")
        for order, verdict in v.items():
            if verdict is None:
                continue
            verdict = _object(verdict, f"{field}.pairwise.{kind}.{order}")
            prefers = verdict.get("prefers")
            if prefers is not None and prefers not in PREFERENCES:
                raise RecordProblem(
                    f"{field}.pairwise.{kind}.{order}.prefers", " / ".join(PREFERENCES), prefers
                )


def check_pair_record(rec: Mapping[str, Any]) -> None:
    """Raise :class:`RecordProblem` naming the first field a downstream command reads that
    is missing or of the wrong type."""
    for field in ("pair_id", "example_id", "question", "chosen", "rejected", "chosen_id",
                  "rejected_id", "strategy", "rubric_version"):  # fmt: skip
        _text(rec, field)
    for field in ("category", "narrative"):
        _text(rec, field, optional=True)
    for field in ("source_id", "user_id"):
        _ident(rec, field)
    profile = rec.get("profile")
    if not isinstance(profile, list):
        raise RecordProblem("profile", "a list of posts", profile)
    for i, post in enumerate(profile):
        post = _object(post, f"profile[{i}]")
        if not isinstance(post.get("text"), str):
            raise RecordProblem(f"profile[{i}].text", "a string", post.get("text"))
    view = _object(rec.get("profile_view"), "profile_view")
    order = view.get("order")
    if not isinstance(order, list) or not all(
        isinstance(i, int) and not isinstance(i, bool) and 0 <= i < len(profile) for i in order
    ):
        raise RecordProblem("profile_view.order", "a list of indices into profile", order)
    rubric = _object(rec.get("rubric"), "rubric")
    items = rubric.get("items")
    if not isinstance(items, list):
        raise RecordProblem("rubric.items", "a list", items)
    for i, it in enumerate(items):
        it = _object(it, f"rubric.items[{i}]")
        for key in ("item_id", "aspect"):
            if not isinstance(it.get(key), str):
                raise RecordProblem(f"rubric.items[{i}].{key}", "a string", it.get(key))
    violated = rec.get("violated_item_ids")
    if not isinstance(violated, list) or not all(isinstance(v, str) for v in violated):
        raise RecordProblem("violated_item_ids", "a list of item ids", violated)
    for field in ("margin", "similarity"):
        v = rec.get(field)
        if v is not None and not is_number(v):
            raise RecordProblem(field, "a number or null", v)
    _object(rec.get("finish_reasons"), "finish_reasons")
    check_judge(rec.get("judge"))
    _object(rec.get("provenance"), "provenance")


def ranked_posts(rec: Mapping[str, Any], k: int | None = None) -> list[dict[str, Any]]:
    """The record's profile posts in the run's ranking, most relevant first (the first
    ``k`` of them when given)."""
    order = rec["profile_view"]["order"]
    if k is not None:
        order = order[:k]
    return [rec["profile"][i] for i in order]
