"""The JSON schemas the stages send, and how their answers are read.

Real models write until they hit ``max_tokens``; under guided decoding (vLLM structured
outputs, a server's ``response_format``, llama.cpp's grammar) a free-text string is where
they do it. Each schema here is closed (``additionalProperties: false``, every property
required), ids are fixed property names and verdicts, scores and winners are ``enum``s, and
every free-text field has a ``maxLength`` derived from the request's ``max_tokens``:
the longest valid instance, written without whitespace, fits in ``FILL`` of ``max_tokens``
counting one token per character. Fields that decide a verdict come first, free text
last, so an answer cut anywhere in its text has already written the decision.

Two forms of each schema: the full one, which every answer is checked against, and its
``wire`` form, the same closed structure without the ``maxLength`` of free text. A string
bound costs xgrammar 0.2.8 (vLLM's default engine) dearly: a bounded schema compiled in
0.3-0.9 s and filled the token mask at 0.05-4.8 ms a token, against at most 0.02 s and
0.008 ms without the bounds; llguidance pays 0.05 ms and llama.cpp's grammar the same
with or without them (benchmarks/structured_output.py, docs/structured-output.md). So an
engine is sent the full schema only where it enforces the bounds cheaply, as its
backend's identity says (``for_engine``), and the bound is kept on this side by one rule
for every backend:

- ``max_tokens`` bounds what an engine writes, as before;
- an answer is checked against the full schema (``check``); free text over its bound is
  shortened to the bound, at a word boundary (``clip``), and the shortened fields are
  recorded with the row (``clipped``): the bound exists so that an answer fits its
  ``max_tokens``, and what fits is the model's own text;
- an answer cut short is read up to the cut (``read(..., cut=True)``): its decision
  fields must be whole, a free-text field the cut went through keeps what was written,
  one it never reached is empty, and an array item it went through is dropped. An answer
  whose decisions the cut reached is re-asked (with twice the tokens when it hit
  ``max_tokens``). Cut short means at ``max_tokens``, or by a stop token that the
  engine's grammar let through inside a string: xgrammar's tokenizer info, built as vLLM
  builds it from SmolLM2-135M-Instruct's tokenizer, lists no special token, so
  ``<|endoftext|>`` and ``<|im_start|>`` are allowed inside a JSON string, and a model
  that stops on one ends mid-string (seen on an H200 with vLLM 0.26.0: 49 of the
  sample's judge requests, docs/structured-output.md).

The coverage schema is one per rubric size: its properties are the points' positions
(``P1``, ``P2``, ...), which the prompt lists, not the items' own ids, so a run compiles
a grammar per size rather than per example.

Only keywords every engine enforces: scores are ``enum`` rather than ``minimum``/``maximum``
(llama.cpp's grammar ignores numeric bounds), and rubric items carry no ``uniqueItems``
(no grammar engine enforces it; the rubrics stage merges repeated aspects itself and
re-asks). tests/test_schemas.py holds each stage's schemas to the keywords llama.cpp's and
xgrammar's converters enforce.

JSON is parsed leniently where the text is unambiguous: a raw control character (a
newline, a tab) inside a string is taken as that character, since llama.cpp's grammar lets
one through and strict JSON parsing would reject the answer.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from pipeline.core.fields import COVERAGE_MAX, COVERAGE_MIN, DIMENSIONS, QUALITY_MAX, QUALITY_MIN
from pipeline.core.resources import data_dir

# Share of max_tokens the longest valid answer may take; the rest is spare.
FILL = 0.9
# The score scales (pipeline/core/fields.py), as enums (see the module docstring).
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


# Tokens per character of a schema's longest valid answer, written compact or indented:
# at most 0.298 on SmolLM2's and Qwen2's tokenizers (DeepSeek-R1-Distill-Qwen-7B's), over
# every schema the stages send at the defaults (benchmarks/verdict_tokens.py). A third
# over that leaves room for denser text; an answer cut at the bound is read up to its cut
# or re-asked with twice the tokens (pipeline/engine/llm.py).
TOKENS_PER_CHAR = 0.4
# A generated rubric item's fields when max_tokens does not size them (null, the default):
# aspect 2 : evidence 1 : reason 1, as the token-sized ones
RUBRIC_CHARS = (150, 75, 75)


def answer_tokens(schema: dict[str, Any]) -> int:
    """The max_tokens that holds the longest valid answer of ``schema`` as models write it
    (``TOKENS_PER_CHAR``): a judge verdict's and a generated rubric's, where the config's
    ``max_tokens`` is null (the default)."""
    return math.ceil(worst_case_chars(schema) * TOKENS_PER_CHAR)


def request_tokens(schema: dict[str, Any], max_tokens: int | None) -> int:
    """A request's max_tokens: the config's, else the schema's own (:func:`answer_tokens`)."""
    return answer_tokens(schema) if max_tokens is None else max_tokens


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
def quality_schema(max_tokens: int | None, rationale_cap: int = 300) -> dict[str, Any]:
    """Scores first (an enum of 1..5), then one rationale per dimension, each of
    ``rationale_cap`` characters (fewer where a given ``max_tokens`` cannot hold them).
    Cached: one object per setting, shared by every request (treat it as read-only)."""

    def build(n: int) -> dict[str, Any]:
        props: dict[str, Any] = {d: {"type": "integer", "enum": list(SCORES)}
                                 for d in DIMENSIONS}  # fmt: skip
        for d in DIMENSIONS:
            props[f"{d}_rationale"] = {"type": "string", "maxLength": n}
        return _closed(props)

    if max_tokens is None:
        return build(rationale_cap)
    per = _split(_budget(max_tokens) - worst_case_chars(build(0)), len(DIMENSIONS),
                 rationale_cap, MIN_RATIONALE, "quality rationale", max_tokens)  # fmt: skip
    return build(per)


@lru_cache(maxsize=16)
def pairwise_schema(max_tokens: int | None, rationale_cap: int = 300) -> dict[str, Any]:
    """The winner first (an enum), then a short rationale. Cached like quality_schema."""

    def build(n: int) -> dict[str, Any]:
        return _closed({"winner": {"type": "string", "enum": list(VERDICTS)},
                        "rationale": {"type": "string", "maxLength": n}})  # fmt: skip

    if max_tokens is None:
        return build(rationale_cap)
    per = _split(_budget(max_tokens) - worst_case_chars(build(0)), 1, rationale_cap,
                 MIN_RATIONALE, "pairwise rationale", max_tokens)  # fmt: skip
    return build(per)


def coverage_keys(n_items: int) -> list[str]:
    """The coverage schema's property names for a rubric of ``n_items`` points, in the
    order the prompt lists them."""
    return [f"P{i}" for i in range(1, n_items + 1)]


@lru_cache(maxsize=64)
def coverage_schema(
    n_items: int, max_tokens: int | None, rationale_cap: int = 200
) -> tuple[dict[str, Any], int]:
    """One required property per rubric point under ``scores`` (0, 1 or 2), keyed by the
    point's position (``coverage_keys``), then one rationale per point. One schema per
    rubric size, so an engine compiles a handful of grammars in a run, not one per
    example. Returns the schema and the max_tokens the request needs: a rubric with more
    points than ``max_tokens`` holds gets the tokens its shortest answer needs, since the
    schema bounds the answer anyway. Cached like quality_schema."""
    keys = coverage_keys(n_items)

    def build(n: int) -> dict[str, Any]:
        scores = _closed({k: {"type": "integer", "enum": list(COVERAGE_SCORES)} for k in keys})
        rationales = _closed({k: {"type": "string", "maxLength": n} for k in keys})
        return _closed({"scores": scores, "rationales": rationales})

    if max_tokens is None:
        schema = build(rationale_cap)
        return schema, answer_tokens(schema)
    free = _budget(max_tokens) - worst_case_chars(build(0))
    per = min(rationale_cap, free // max(n_items, 1))
    if per < MIN_RATIONALE:
        schema = build(MIN_RATIONALE)
        return schema, max(max_tokens, tokens_needed(schema))
    return build(per), max_tokens


# ---- rubrics ---------------------------------------------------------------------------


@lru_cache(maxsize=1)
def _rubric_base() -> str:
    return (data_dir("rubrics") / "rubric.schema.json").read_text(encoding="utf-8")


def rubric_schema(min_items: int, max_items: int, max_tokens: int | None) -> dict[str, Any]:
    """rubrics/rubric.schema.json with the item counts and the lengths filled in: each
    field's maxLength from max_tokens (aspect 2 : evidence 1 : reason 1), or
    ``RUBRIC_CHARS`` when it is None. Repeated aspects are the rubrics stage's to merge (no
    grammar engine enforces uniqueItems)."""

    def build(aspect: int, other: int) -> dict[str, Any]:
        schema = json.loads(_rubric_base())
        arr = schema["properties"]["aspects"]
        arr.update(minItems=min_items, maxItems=max_items)
        props = arr["items"]["properties"]
        props["aspect"]["maxLength"] = aspect
        props["evidence"]["maxLength"] = other
        props["reason"]["maxLength"] = other
        return schema

    if max_tokens is None:
        return build(RUBRIC_CHARS[0], RUBRIC_CHARS[1])
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


# ---- what an engine is sent --------------------------------------------------------


def is_free_text(node: dict[str, Any]) -> bool:
    """A string a model writes freely (no ``enum``): its bound is checked on this side."""
    return node.get("type") == "string" and "enum" not in node


# id(schema) -> (schema, its wire form); holding the schema keeps its id unique. The
# builders above are cached, so a run holds a handful of schemas.
_WIRE: dict[int, tuple[dict[str, Any], dict[str, Any]]] = {}


def wire(schema: dict[str, Any]) -> dict[str, Any]:
    """The form of ``schema`` sent to an engine: the same closed structure, enums and
    required fields, without the ``maxLength`` of free text (see the module docstring).
    Memoised per schema object: treat the result as read-only."""
    hit = _WIRE.get(id(schema))
    if hit is not None and hit[0] is schema:
        return hit[1]
    out = _strip_bounds(schema)
    if len(_WIRE) >= 1024:
        _WIRE.clear()
    _WIRE[id(schema)] = (schema, out)
    return out


def _strip_bounds(node: Any) -> Any:
    if isinstance(node, list):
        return [_strip_bounds(v) for v in node]
    if not isinstance(node, dict):
        return node
    free = is_free_text(node)
    return {k: _strip_bounds(v) for k, v in node.items() if not (free and k == "maxLength")}


# The identity key (pipeline/backends/identity.py) of a backend whose grammar engine is
# sent the free-text bounds: it enforces them cheaply (llama.cpp's grammar, llguidance).
SCHEMA_BOUNDS = "schema_bounds"


def for_engine(schema: dict[str, Any], served_by: Any) -> dict[str, Any]:
    """The form of ``schema`` a request carries for the backend ``served_by`` (its
    identity): the full schema where its engine enforces string bounds cheaply (the
    identity says ``schema_bounds``), else the wire form. A replayed run keeps the form
    its recorded backend was sent, since its identity is the recorded one."""
    return schema if served_by.get(SCHEMA_BOUNDS) else wire(schema)


def bounded_strings(schema: dict[str, Any]) -> int:
    """How many string nodes of ``schema`` carry a ``maxLength`` (0 for a wire schema)."""
    n = 1 if schema.get("type") == "string" and "maxLength" in schema else 0
    for key in ("properties",):
        n += sum(bounded_strings(v) for v in schema.get(key, {}).values())
    if isinstance(schema.get("items"), dict):
        n += bounded_strings(schema["items"])
    return n


# ---- reading answers -----------------------------------------------------------------


@dataclass(frozen=True)
class Reading:
    """An answer read against a schema: its value, whether it was read from an answer cut
    at ``max_tokens``, and the free-text fields shortened to their bound (dotted paths)."""

    value: Any
    cut: bool = False
    clipped: tuple[str, ...] = ()


def read(schema: dict[str, Any], text: str, *, cut: bool = False, clip: bool = False) -> Reading:
    """Parse an answer and check it against ``schema``.

    ``cut``: the answer may have been cut short (at ``max_tokens``, or by a stop token
    the engine's grammar let through); it is read up to the cut (a whole answer is read
    as it is). Its decision fields (enums, numbers) must be whole; a
    free-text field the cut went through keeps what was written, one it never reached is
    empty, an array item it went through is dropped. ``clip``: free text over its
    ``maxLength`` is shortened to it rather than refused. ValueError names the first
    failing place, so a re-ask can tell the model what to fix."""
    try:
        value = json.loads(text, strict=False)
        was_cut = False
    except ValueError as exc:
        if not cut:
            raise ValueError(f"answer: not valid JSON ({exc.args[0][:80]})") from None
        value = _complete(schema, _parse_prefix(text), "answer")
        was_cut = True
    clipped: list[str] = []
    if clip:
        value = _clip(schema, value, "answer", clipped)
    check(schema, value)
    return Reading(value, was_cut, tuple(clipped))


class _Open:
    """A value the cut went through: a string, object or array left open."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value


_NUMBER = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?")
_WS = re.compile(r"[ \t\n\r]*")
# the end of a string the cut went through: a run of backslashes, maybe with the start of
# a \uXXXX escape (an odd run ends in an escape the cut split)
_SPLIT_ESCAPE = re.compile(r"(\\+)(?:u[0-9a-fA-F]{0,3})?$")


class _Cut(Exception):
    """The text ended inside a value that cannot be kept (a key, a number, a literal)."""


def _parse_prefix(text: str) -> Any:
    """Parse a prefix of a JSON text; values left open by its end come back as ``_Open``.
    ValueError when the text is not a prefix of JSON at all."""
    pos = _WS.match(text, 0).end()  # type: ignore[union-attr]
    if pos == len(text):
        raise ValueError("answer: cut off before anything was written")
    try:
        value, _ = _prefix_value(text, pos)
    except _Cut:
        raise ValueError("answer: cut off before its first field was whole") from None
    return value


def _prefix_value(text: str, pos: int) -> tuple[Any, int]:
    ch = text[pos]
    if ch == "{":
        return _prefix_container(text, pos, {})
    if ch == "[":
        return _prefix_container(text, pos, [])
    if ch == '"':
        return _prefix_string(text, pos)
    m = _NUMBER.match(text, pos)
    if m:
        if m.end() == len(text):
            raise _Cut  # the number may go on
        return json.loads(m.group()), m.end()
    for word, val in (("true", True), ("false", False), ("null", None)):
        if text.startswith(word, pos):
            return val, pos + len(word)
        if word.startswith(text[pos:]):
            raise _Cut
    raise ValueError(f"answer: not valid JSON (unexpected {ch!r} at {pos})")


def _prefix_string(text: str, pos: int) -> tuple[Any, int]:
    """A string at ``pos``: whole, or open to the end of the text (an ``_Open``)."""
    scan = json.decoder.scanstring  # type: ignore[attr-defined]
    try:
        return scan(text, pos + 1, False)
    except ValueError:
        pass
    # open to the end: drop an escape the cut split (an odd run of backslashes, or \u
    # with fewer than four hex digits), close it, and it must read to the very end
    tail = text[pos + 1 :]
    m = _SPLIT_ESCAPE.search(tail)
    if m is not None:
        run = len(m.group(1))
        tail = tail[: m.start()] + m.group(1)[: run - 1] if run % 2 else tail
    try:
        value, end = scan(tail + '"', 0, False)
    except ValueError:
        raise ValueError("answer: not valid JSON (a string)") from None
    if end != len(tail) + 1:  # a closing quote before the end: the text is broken
        raise ValueError("answer: not valid JSON (a string)")
    if value and "\ud800" <= value[-1] <= "\udbff":
        value = value[:-1]  # half of a surrogate pair the cut split: not text on its own
    return _Open(value), len(text)


def _prefix_container(text: str, pos: int, box: Any) -> tuple[Any, int]:
    is_obj = isinstance(box, dict)
    close = "}" if is_obj else "]"
    pos += 1
    while True:
        pos = _WS.match(text, pos).end()  # type: ignore[union-attr]
        if pos == len(text):
            return _Open(box), pos
        if text[pos] == close:
            return box, pos + 1
        if (is_obj and box) or (not is_obj and box):
            if text[pos] != ",":
                raise ValueError(f"answer: not valid JSON (expected ',' at {pos})")
            pos = _WS.match(text, pos + 1).end()  # type: ignore[union-attr]
            if pos == len(text):
                return _Open(box), pos
        if is_obj:
            if text[pos] != '"':
                raise ValueError(f"answer: not valid JSON (expected a key at {pos})")
            key, pos = _prefix_string(text, pos)
            if isinstance(key, _Open):
                return _Open(box), len(text)
            pos = _WS.match(text, pos).end()  # type: ignore[union-attr]
            if pos == len(text):
                return _Open(box), pos
            if text[pos] != ":":
                raise ValueError(f"answer: not valid JSON (expected ':' at {pos})")
            pos = _WS.match(text, pos + 1).end()  # type: ignore[union-attr]
            if pos == len(text):
                return _Open(box), pos
        try:
            value, pos = _prefix_value(text, pos)
        except _Cut:
            return _Open(box), len(text)
        if is_obj:
            box[key] = value
        else:
            box.append(value)
        if isinstance(value, _Open):
            return _Open(box), pos


def _complete(schema: dict[str, Any], node: Any, where: str) -> Any:
    """The value of a cut answer read against ``schema`` (see ``read``)."""
    if not isinstance(node, _Open):
        return node
    value = node.value
    kind = schema.get("type")
    if isinstance(value, str):
        if is_free_text(schema):
            return value
        raise ValueError(f"{where}: cut off at the length limit before it was whole")
    if isinstance(value, dict) and kind == "object":
        props = schema.get("properties", {})
        out = {}
        for name, v in value.items():
            out[name] = _complete(props[name], v, f"{where}.{name}") if name in props else v
        for name in schema.get("required", []):
            if name in out:
                continue
            if is_free_text(props.get(name, {})):
                out[name] = ""
            else:
                raise ValueError(f"{where}.{name}: cut off at the length limit before it")
        return out
    if isinstance(value, list) and kind == "array":
        if value and isinstance(value[-1], _Open):
            value = value[:-1]  # the item the cut went through
        return value
    raise ValueError(f"{where}: cut off at the length limit")


def clip_text(text: str, bound: int) -> str:
    """``text`` shortened to at most ``bound`` characters, at a word boundary when one
    lies in the second half, without trailing spaces."""
    if len(text) <= bound:
        return text
    cut = text[:bound]
    if not text[bound].isspace():
        space = cut.rfind(" ")
        if space >= bound // 2:
            cut = cut[:space]
    return cut.rstrip()


def _clip(schema: dict[str, Any], value: Any, where: str, clipped: list[str]) -> Any:
    """``value`` with free text over its ``maxLength`` shortened to it (paths noted)."""
    kind = schema.get("type")
    if kind == "string" and isinstance(value, str) and is_free_text(schema):
        bound = schema.get("maxLength")
        if bound is not None and len(value) > bound:
            clipped.append(where)
            return clip_text(value, bound)
        return value
    if kind == "object" and isinstance(value, dict):
        props = schema.get("properties", {})
        return {k: _clip(props[k], v, f"{where}.{k}", clipped) if k in props else v
                for k, v in value.items()}  # fmt: skip
    if kind == "array" and isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [_clip(schema["items"], v, f"{where}[{i}]", clipped) for i, v in enumerate(value)]
    return value


# ---- checking answers ------------------------------------------------------------------


def parse(schema: dict[str, Any], text: str) -> Any:
    """Parse a whole answer and check it against ``schema`` (``read`` without its
    options); ValueError names the first failing place. Raw control characters inside
    strings are accepted (``strict=False``): the text is unambiguous, and llama.cpp's
    grammar lets them through."""
    return read(schema, text).value


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
