"""Deterministic ids and content hashes."""

from __future__ import annotations

import hashlib
import json
from typing import Any


def canonical_json(obj: Any) -> str:
    """JSON with sorted keys and no whitespace, so equal content hashes equally."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def content_hash(obj: Any, length: int = 64) -> str:
    """sha256 of the canonical JSON of ``obj`` (hex, truncated to ``length``)."""
    data = obj if isinstance(obj, str) else canonical_json(obj)
    # surrogatepass: a lone surrogate (a model answer can carry one) hashes instead of
    # failing; every other string encodes exactly as plain UTF-8, so no key changes
    return hashlib.sha256(data.encode("utf-8", "surrogatepass")).hexdigest()[:length]


def stable_id(*parts: Any, length: int = 16) -> str:
    """A short id derived only from its inputs: the same inputs give the same id on every run."""
    return content_hash(list(parts), length=length)


def pair_id(example_id: str, chosen_id: str, rejected_id: str) -> str:
    """The one id of a chosen/rejected pair, used by the judge, the pair stage, annotation
    tasks and the release alike."""
    return stable_id("pair", example_id, chosen_id, rejected_id)
