"""The JSON schemas the stages send, sized so a constrained decoder can always finish them.

Real models write until they hit ``max_tokens``; under guided decoding (vLLM structured
outputs, a server's ``response_format``, llama.cpp's grammar) an unbounded string is where
they do it, and the answer is cut off before it is valid JSON. So every schema here is
closed: ids are one fixed property each (coverage) or an ``enum`` (verdicts), scores are
an ``enum`` of the allowed integers, and every free-text field has a ``maxLength`` derived
from the request's ``max_tokens``.

Only keywords every engine enforces: scores are ``enum`` rather than ``minimum``/``maximum``
(llama.cpp's grammar ignores numeric bounds), and rubric items carry no ``uniqueItems``
(no grammar engine enforces it; the rubrics stage merges repeated aspects itself and
re-asks). tests/test_schemas.py holds each stage's schemas to the keywords llama.cpp's and
xgrammar's (vLLM's default) converters enforce.

The bound: the longest valid instance, written without whitespace, must fit in
``FILL`` of ``max_tokens`` counting one token per character (every token of a JSON
answer writes at least one character, so ASCII output cannot exceed it; the rest is
room to spare). Fields that decide a verdict come first, free text last, so even a
decoder that stops early has written the decision.

Answers are checked against the very schema that was sent (``check``), one rule: the
validator covers the keywords these schemas use, and a test cross-checks it with the
``jsonschema`` package. JSON is parsed leniently where the text is unambiguous: a raw
control character (a newline, a tab) inside a string is taken as that character, since
llama.cpp's grammar lets one through and strict JSON parsing would reject the answer.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

from pipeline.fields import COVERAGE_MAX, COVERAGE_MIN, DIMENSIONS, QUALITY_MAX, QUALITY_MIN
from pipeline.resources import data_dir

# Share of max_tokens the longest valid answer may take; the rest is spare.
FILL = 0.9
# The score scales (pipeline/fields.py), as enums (see the module docstring).
SCORES = tuple(range(QUALITY_MIN, QUALITY_MAX + 1))
COVERAGE_SCORES = tuple(range(COVERAGE_MIN, COVERAGE_MAX + 1))
# Shortest useful free text: below these a config cannot hold a sensible answer.
MIN_RATIONALE = 40
MIN_ASPECT = 40
MIN_EVIDENCE = 20
VERDICTS = ("A", "B", "tie")


class SchemaBudgetError(ValueError):
    """max_tokens cannot hold the shortest useful answer of a schema."""


# ---- sizes -----------------------------------------------------------------------------


def worst_case_chars(schema: dict[str, Any]) -> int:
    """Characters of the longest instance of ``schema`` written without whitespace."""
    if "enum" in schema:
        return max(len(json.dumps(v)) for v in schema["enum"])
    kind = schema.get("type")
    if kind == "object":
        props = schema.get("properties", {})
        inner = sum(len(json.dumps(k)) + 1 + worst_case_chars(v) for k, v in props.items())
        return 2 + inner + max(len(props) - 1, 0)
    if kind == "array":
        n = schema["maxItems"]
        return 2 + n * worst_case_chars(schema["items"]) + max(n - 1, 0)
    if kind == "string":
        return 2 + schema["maxLength"]
    if kind == "integer":
        return max(len(str(schema["minimum"])), len(str(schema["maximum"])))
    if kind == "boolean":
        return 5
    raise ValueError(f"unbounded schema node: {schema}")


def _budget(max_tokens: int) -> int:
    return int(max_tokens * FILL)


def tokens_needed(schema: dict[str, Any]) -> int:
    """The smallest max_tokens that holds the longest instance of ``schema``."""
    return math.ceil(worst_case_chars(schema) / FILL)


def _split(free_chars: int, fields: int, cap: int, floor: int, what: str, max_tokens: int) -> int:
    per = min(cap, free_chars // max(fields, 1))
    if per < floor:
        raise SchemaBudgetError(
            f"max_tokens {max_tokens} leaves {max(per, 0)} characters per {what} (needs at "
            f"least {floor}); raise max_tokens"
        )
    return per


# ---- judge -----------------------------------------------------------------------------


@lru_cache(maxsize=16)
def quality_schema(max_tokens: int, rationale_cap: int = 300) -> dict[str, Any]:
    """Scores first (an enum of 1..5), then one rationale per dimension. Cached: one
    object per setting, shared by every request (treat it as read-only)."""

    def build(n: int) -> dict[str, Any]:
        props: dict[str, Any] = {d: {"type": "integer", "enum": list(SCORES)}
                                 for d in DIMENSIONS}  # fmt: skip
        for d in DIMENSIONS:
            props[f"{d}_rationale"] = {"type": "string", "maxLength": n}
        return _closed(props)

    per = _split(_budget(max_tokens) - worst_case_chars(build(0)), len(DIMENSIONS),
                 rationale_cap, MIN_RATIONALE, "quality rationale", max_tokens)  # fmt: skip
    return build(per)


@lru_cache(maxsize=16)
def pairwise_schema(max_tokens: int, rationale_cap: int = 300) -> dict[str, Any]:
    """The winner first (an enum), then a short rationale. Cached like quality_schema."""

    def build(n: int) -> dict[str, Any]:
        return _closed({"winner": {"type": "string", "enum": list(VERDICTS)},
                        "rationale": {"type": "string", "maxLength": n}})  # fmt: skip

    per = _split(_budget(max_tokens) - worst_case_chars(build(0)), 1, rationale_cap,
                 MIN_RATIONALE, "pairwise rationale", max_tokens)  # fmt: skip
    return build(per)


def coverage_schema(
    item_ids: Sequence[str], max_tokens: int, rationale_cap: int = 200
) -> tuple[dict[str, Any], int]:
    """One required property per rubric item under ``scores`` (0, 1 or 2), then one
    rationale per item. Returns the schema and the max_tokens the request needs: a rubric
    with more items than ``max_tokens`` holds gets the tokens its shortest answer needs,
    since the schema bounds the answer anyway."""

    def build(n: int) -> dict[str, Any]:
        scores = _closed({i: {"type": "integer", "enum": list(COVERAGE_SCORES)} for i in item_ids})
        rationales = _closed({i: {"type": "string", "maxLength": n} for i in item_ids})
        return _closed({"scores": scores, "rationales": rationales})

    free = _budget(max_tokens) - worst_case_chars(build(0))
    per = min(rationale_cap, free // max(len(item_ids), 1))
    if per < MIN_RATIONALE:
        schema = build(MIN_RATIONALE)
        return schema, max(max_tokens, tokens_needed(schema))
    return build(per), max_tokens


# ---- rubrics ---------------------------------------------------------------------------


@lru_cache(maxsize=1)
def _rubric_base() -> str:
    return (data_dir("rubrics") / "rubric.schema.json").read_text(encoding="utf-8")


def rubric_schema(min_items: int, max_items: int, max_tokens: int) -> dict[str, Any]:
    """rubrics/rubric.schema.json with the item counts and the lengths filled in: each
    field's maxLength from max_tokens (aspect 2 : evidence 1 : reason 1). Repeated
    aspects are the rubrics stage's to merge (no grammar engine enforces uniqueItems)."""

    def build(aspect: int, other: int) -> dict[str, Any]:
        schema = json.loads(_rubric_base())
        arr = schema["properties"]["aspects"]
        arr.update(minItems=min_items, maxItems=max_items)
        props = arr["items"]["properties"]
        props["aspect"]["maxLength"] = aspect
        props["evidence"]["maxLength"] = other
        props["reason"]["maxLength"] = other
        return schema

    free = _budget(max_tokens) - worst_case_chars(build(0, 0))
    per_item = free // max_items
    aspect = min(200, per_item // 2)
    other = min(200, (per_item - aspect) // 2)
    if aspect < MIN_ASPECT or other < MIN_EVIDENCE:
        raise SchemaBudgetError(
            f"max_tokens {max_tokens} leaves {max(per_item, 0)} characters per rubric item "
            f"for {max_items} items (needs {MIN_ASPECT + 2 * MIN_EVIDENCE}); raise "
            "max_tokens or lower max_items"
        )
    return build(aspect, other)


def _closed(props: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "properties": props, "required": list(props),
            "additionalProperties": False}  # fmt: skip


# ---- checking answers ------------------------------------------------------------------


def parse(schema: dict[str, Any], text: str) -> Any:
    """Parse an answer and check it against ``schema``; ValueError names the first
    failing place, so a re-ask can tell the model what to fix. Raw control characters
    inside strings are accepted (``strict=False``): the text is unambiguous, and
    llama.cpp's grammar lets them through."""
    try:
        value = json.loads(text, strict=False)
    except ValueError as exc:
        raise ValueError(f"answer: not valid JSON ({exc.args[0][:80]})") from None
    check(schema, value)
    return value


def check(schema: dict[str, Any], value: Any, where: str = "answer") -> None:
    """Validate ``value`` against the subset of JSON Schema these schemas use."""
    if "enum" in schema:
        # 1 == True == 1.0 in Python: a score must be the integer itself
        wrong_type = schema.get("type") == "integer" and not isinstance(value, int)
        if value not in schema["enum"] or isinstance(value, bool) or wrong_type:
            raise ValueError(f"{where}: must be one of {schema['enum']}, got {value!r}"[:200])
        return
    kind = schema.get("type")
    if kind == "object":
        if not isinstance(value, dict):
            raise ValueError(f"{where}: must be an object")
        props = schema.get("properties", {})
        for name in schema.get("required", []):
            if name not in value:
                raise ValueError(f"{where}.{name}: missing")
        if schema.get("additionalProperties") is False:
            extra = [k for k in value if k not in props]
            if extra:
                raise ValueError(f"{where}: unexpected field {extra[0]!r}"[:200])
        for name, sub in props.items():
            if name in value:
                check(sub, value[name], f"{where}.{name}")
    elif kind == "array":
        if not isinstance(value, list):
            raise ValueError(f"{where}: must be an array")
        if len(value) < schema.get("minItems", 0):
            raise ValueError(f"{where}: at least {schema['minItems']} items, got {len(value)}")
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            raise ValueError(f"{where}: at most {schema['maxItems']} items, got {len(value)}")
        for i, v in enumerate(value):
            check(schema["items"], v, f"{where}[{i}]")
    elif kind == "string":
        if not isinstance(value, str):
            raise ValueError(f"{where}: must be a string")
        if len(value) < schema.get("minLength", 0):
            raise ValueError(f"{where}: at least {schema['minLength']} characters")
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            raise ValueError(f"{where}: at most {schema['maxLength']} characters")
    elif kind == "integer":
        if not isinstance(value, int) or isinstance(value, bool):
            raise ValueError(f"{where}: must be an integer")
        if not schema.get("minimum", value) <= value <= schema.get("maximum", value):
            raise ValueError(
                f"{where}: must be within {schema.get('minimum')}..{schema.get('maximum')}"
            )
    elif kind == "boolean" and not isinstance(value, bool):
        raise ValueError(f"{where}: must be true or false")


# ---- config check ----------------------------------------------------------------------


def check_budgets(cfg: Any) -> list[tuple[str, str]]:
    """(dotted field, problem) for every schema the config's max_tokens cannot hold."""
    problems = []
    j = cfg.judge
    for field, build in (
        ("judge.sampling.max_tokens", lambda: quality_schema(j.sampling.max_tokens,
                                                             j.rationale_max_chars)),
        ("judge.sampling.max_tokens", lambda: pairwise_schema(j.sampling.max_tokens,
                                                              j.rationale_max_chars)),
    ):  # fmt: skip
        try:
            build()
        except SchemaBudgetError as exc:
            problems.append((field, str(exc)))
    if cfg.rubrics.source == "generated":
        r = cfg.rubrics
        try:
            rubric_schema(r.min_items, r.max_items, r.sampling.max_tokens)
        except SchemaBudgetError as exc:
            problems.append(("rubrics.sampling.max_tokens", str(exc)))
    return problems
