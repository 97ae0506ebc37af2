"""A value for a JSON schema: what a backend without a model answers a JSON-schema request
with (the echo backend of docs/backends.md, tests' stand-ins). Deterministic for a given
``random.Random``."""

from __future__ import annotations

import json
import math
import random
from collections.abc import Sequence
from typing import Any

_WORDS = (
    "the answer should address the user needs while staying concise and helpful it "
    "considers context preferences tone detail examples evidence structure clarity"
).split()
_FORMATS = {"date-time": "2024-01-01T00:00:00Z", "date": "2024-01-01", "time": "12:00:00",
            "email": "user@example.com", "uri": "https://example.com/",
            "uuid": "00000000-0000-4000-8000-000000000000"}  # fmt: skip


def schema_instance(
    schema: dict[str, Any],
    rng: random.Random | None = None,
    root: dict[str, Any] | None = None,
    depth: int = 0,
    *,
    words: Sequence[str] = _WORDS,
) -> Any:
    """A value that validates against a (pydantic-style) JSON schema: ``$ref``, ``const``,
    ``enum``, ``anyOf``/``oneOf``/``allOf``, objects with their required properties, arrays
    within min/maxItems (unique when asked), strings within min/maxLength and the common
    formats, numbers within their bounds. For a backend that answers without a model (a
    test's, docs/backends.md) and for tests. ``words``: the vocabulary of generated strings
    (the stand-in server, tests/standin_server.py, passes its own)."""
    rng = rng if rng is not None else random.Random(0)
    root = schema if root is None else root
    deep = depth > 6  # recursive models: stop growing, prefer empty lists and null branches
    if "$ref" in schema:
        target: Any = root
        for part in schema["$ref"].lstrip("#/").split("/"):
            target = target[part.replace("~1", "/").replace("~0", "~")]
        return schema_instance(target, rng, root, depth + 1, words=words)
    if "const" in schema:
        return schema["const"]
    if schema.get("enum"):
        return rng.choice(schema["enum"])
    for key in ("anyOf", "oneOf"):
        if branches := schema.get(key):
            if deep and any(b.get("type") == "null" for b in branches):
                return None
            return schema_instance(branches[0], rng, root, depth + 1, words=words)
    if branches := schema.get("allOf"):
        merged = {k: v for k, v in schema.items() if k != "allOf"}
        for branch in branches:
            merged.update(branch)
        return schema_instance(merged, rng, root, depth + 1, words=words)
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind is None:
        kind = "object" if "properties" in schema else "array" if "items" in schema else "string"
    if kind == "object":
        props = dict(schema.get("properties", {}))
        for name in schema.get("required", []):
            props.setdefault(name, {"type": "string"})
        return {k: schema_instance(v, rng, root, depth + 1, words=words) for k, v in props.items()}
    if kind == "array":
        lo, hi = schema.get("minItems", 0), schema.get("maxItems", math.inf)
        n = lo if deep else int(min(max(3, lo), hi))
        prefix = schema.get("prefixItems", [])
        items: list[Any] = []
        seen: set[str] = set()
        for _ in range(n * 20 if schema.get("uniqueItems") else n):  # retries to stay unique
            if len(items) == n:
                break
            sub = prefix[len(items)] if len(items) < len(prefix) else schema.get("items", {})
            value = schema_instance(sub, rng, root, depth + 1, words=words)
            key = json.dumps(value, sort_keys=True)
            if schema.get("uniqueItems") and key in seen:
                continue
            seen.add(key)
            items.append(value)
        return items
    if kind == "string":
        fmt = schema.get("format")
        if fmt in _FORMATS:
            return _FORMATS[fmt]
        text = " ".join(rng.choice(words) for _ in range(rng.randint(2, 5)))
        while len(text) < schema.get("minLength", 0):
            text += " " + rng.choice(words)
        return text[: schema.get("maxLength", len(text))]
    if kind in ("integer", "number"):
        return _number(schema, rng, integer=kind == "integer")
    if kind == "boolean":
        return rng.random() < 0.5
    return None


def _number(schema: dict[str, Any], rng: random.Random, integer: bool) -> int | float:
    """A number within minimum/maximum (exclusive bounds too); open ranges stay near 0..10."""
    lo, hi = schema.get("minimum"), schema.get("maximum")
    xlo, xhi = schema.get("exclusiveMinimum"), schema.get("exclusiveMaximum")
    if integer:
        lo = math.ceil(lo) if lo is not None else None if xlo is None else math.floor(xlo) + 1
        hi = math.floor(hi) if hi is not None else None if xhi is None else math.ceil(xhi) - 1
    else:
        lo, hi = (lo if lo is not None else xlo), (hi if hi is not None else xhi)
    lo = (0 if hi is None else hi - 10) if lo is None else lo
    hi = lo + 10 if hi is None else min(hi, lo + 10)
    if integer:
        return rng.randint(lo, max(lo, hi))
    value = min(max(round(rng.uniform(lo, hi), 2), lo), hi)
    return (lo + hi) / 2 if value in (xlo, xhi) else value
