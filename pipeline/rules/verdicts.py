"""What the judge's verdicts on a pair say, one definition each.

- :func:`prefers`: which side each A/B order of a pairwise verdict preferred;
- :func:`direction`: the rubric-aware judge's direction over both orders (the annotation
  import compares human votes with it);
- :func:`margin`: how clearly a pair separates preference from quality. The judge stage
  ranks its shortlist by it before the pairwise verdicts exist, the pair stage picks the
  published pair by it once they do.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pipeline.core.fields import ORDERS, largest_quality_gap

# Margin = chosen's mean coverage - rejected's mean coverage of the items it targets
#          + BLIND_WEIGHT per A/B order whose rubric-blind verdict does not prefer the chosen
#          - GAP_WEIGHT per unit of the largest quality difference.
# A quarter point each: one order of a non-leaking blind verdict, or one point of quality
# gap, is worth a quarter of an item's full coverage difference (the coverage terms range
# over 0..2). tests/test_margin.py pins these numbers.
BLIND_WEIGHT = 0.25
GAP_WEIGHT = 0.25


def prefers(pairwise: Mapping[str, Any] | None, kind: str) -> dict[str, str | None]:
    """``{"AB": side, "BA": side}``: which side (chosen / rejected / tie) each presentation
    order of the ``kind`` verdict ("pairwise_aware" or "pairwise_blind") preferred; None
    where that order has no verdict."""
    v = (pairwise or {}).get(kind) or {}
    return {o: (v.get(o) or {}).get("prefers") for o in ORDERS}


def direction(prefs: Mapping[str, str | None]) -> str | None:
    """One direction over both orders: "chosen" (or "rejected") when both orders preferred
    that side, "tie" when they disagree or called a tie, None when there is no verdict."""
    ab, ba = (prefs.get(o) for o in ORDERS)
    if ab is None and ba is None:
        return None
    if ab == ba and ab in ("chosen", "rejected"):
        return ab
    return "tie"


def mean_coverage(scores: Mapping[str, Any] | None, items: Sequence[str] | None = None) -> float:
    """Mean coverage score over ``items`` (default: every scored item); an item without a
    score counts 0, no items count 0."""
    scores = scores or {}
    keys = list(items) if items else list(scores)
    if not keys:
        return 0.0
    return sum(scores.get(i, 0) for i in keys) / len(keys)


def margin(
    coverage_chosen: Mapping[str, Any],
    coverage_rejected: Mapping[str, Any],
    violated: Sequence[str],
    quality_chosen: Mapping[str, Any],
    quality_rejected: Mapping[str, Any],
    blind: Mapping[str, str | None] | None = None,
) -> float:
    """The margin of a pair (see the formula above). ``blind``: the rubric-blind verdict's
    preference per order (:func:`prefers`); None before the pairwise judge has run, when
    the blind term is left out. ``violated``: the rejected answer's targeted items (empty:
    every item the rejected answer was scored on)."""
    cov_c = mean_coverage(coverage_chosen)
    cov_r = mean_coverage(coverage_rejected, violated)
    worst = largest_quality_gap(quality_chosen, quality_rejected)
    gap = worst[1] if worst is not None else 0
    if blind is None:
        return cov_c - cov_r - GAP_WEIGHT * gap
    not_leaky = sum(1 for o in ORDERS if blind.get(o) != "chosen")
    return cov_c - cov_r + BLIND_WEIGHT * not_leaky - GAP_WEIGHT * gap


def margin_bound(pointwise: float | None) -> float:
    """The largest margin a combination with this pointwise margin (the margin before the
    pairwise verdicts, None: a verdict missing) can reach once they are in: every blind
    order not preferring the chosen. A little over, so a rounded margin never falls out."""
    if pointwise is None:
        return float("-inf")
    return pointwise + BLIND_WEIGHT * len(ORDERS) + 1e-3


def a_side(order: str) -> str:
    """Which side of the pair is shown as answer A in a presentation order: "AB" shows the
    chosen answer first, "BA" the rejected one."""
    return "chosen" if order == ORDERS[0] else "rejected"


def shown_side(letter: str, a_is: str) -> str:
    """The pair's side behind answer ``letter`` ("A" or "B") when ``a_is`` ("chosen" or
    "rejected") was shown as A."""
    if a_is not in ("chosen", "rejected"):
        raise ValueError(f"a_side must be 'chosen' or 'rejected', got {a_is!r}")
    if letter == "A":
        return a_is
    if letter == "B":
        return "rejected" if a_is == "chosen" else "chosen"
    raise ValueError(f"answer letter must be 'A' or 'B', got {letter!r}")
