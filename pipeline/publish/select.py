"""Which kept pairs a release publishes, by policy and the human verdicts.

``verified`` publishes only pairs whose latest human verdict is "verified"; ``filtered``
publishes every kept pair except those humans refuted. A later annotation round's verdict
for a pair replaces an earlier one (``pipeline.annotate.rounds.latest_verdicts``).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from pipeline.annotate.rounds import REFUTED, UNRESOLVED, VERIFIED
from pipeline.core.errors import PipelineError

POLICIES = ("verified", "filtered")


def check_policy(policy: str) -> None:
    if policy not in POLICIES:
        raise PipelineError(f"unknown policy {policy!r}; choose one of {', '.join(POLICIES)}")


def select_pairs(
    pairs: list[dict[str, Any]], verdicts: dict[str, dict[str, Any]], policy: str
) -> tuple[list[dict[str, Any]], Counter]:
    """The pairs the policy publishes, and a count of the others by why they were left out."""
    check_policy(policy)
    kept: list[dict[str, Any]] = []
    excluded: Counter[str] = Counter()
    for p in pairs:
        status = (verdicts.get(p["pair_id"]) or {}).get("status")
        if status == REFUTED:  # never published, under any policy
            excluded[REFUTED] += 1
        elif policy == "verified" and status != VERIFIED:
            excluded[UNRESOLVED if status == UNRESOLVED else "not_annotated"] += 1
        else:
            kept.append(p)
    return kept, excluded
