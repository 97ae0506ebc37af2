"""The rule that ranks pairs and picks the published one, pinned with worked numbers: a
change of a weight, a term or the tie-break fails here."""

from __future__ import annotations

import math

from pipeline.rules import PairView
from pipeline.rules.verdicts import (
    a_side,
    direction,
    margin,
    mean_coverage,
    prefers,
    shown_side,
)
from pipeline.stages.pairs import pick

COV_C = {"a": 2, "b": 2, "c": 1}  # mean 5/3
COV_R = {"a": 0, "b": 1, "c": 2}
Q_C = {"correctness": 5, "relevance": 5, "helpfulness": 4}
Q_R = {"correctness": 5, "relevance": 3, "helpfulness": 4}  # largest gap: relevance, 2


def test_margin_worked_examples():
    # coverage: chosen 5/3; rejected on its targeted items a, b: 1/2
    base = 5 / 3 - 1 / 2
    # before the pairwise verdicts: a quarter point off per unit of the largest gap (2)
    assert math.isclose(margin(COV_C, COV_R, ["a", "b"], Q_C, Q_R), base - 0.5)
    # a blind judge that prefers neither side in both orders: + a quarter point per order
    tie = {"AB": "tie", "BA": "rejected"}
    assert math.isclose(margin(COV_C, COV_R, ["a", "b"], Q_C, Q_R, blind=tie), base + 0.5 - 0.5)
    # one order leaks (prefers the chosen): only the other order counts
    leak = {"AB": "chosen", "BA": "tie"}
    assert math.isclose(margin(COV_C, COV_R, ["a", "b"], Q_C, Q_R, blind=leak), base + 0.25 - 0.5)
    # no targeted items listed: the rejected answer's coverage of every item
    assert math.isclose(margin(COV_C, COV_R, [], Q_C, Q_R), 5 / 3 - 1 - 0.5)


def test_mean_coverage_counts_a_missing_item_as_zero():
    assert mean_coverage({"a": 2}, ["a", "b"]) == 1.0
    assert mean_coverage({}, []) == 0.0


def _view(blind: dict[str, str]) -> PairView:
    return PairView(
        example={},
        rubric={},
        chosen={"text": "x"},
        rejected={"text": "y", "violates": ["a", "b"]},
        quality_chosen={**Q_C, "parse_ok": True},
        quality_rejected={**Q_R, "parse_ok": True},
        coverage_chosen={"scores": COV_C, "parse_ok": True},
        coverage_rejected={"scores": COV_R, "parse_ok": True},
        pairwise={"pairwise_blind": {o: {"prefers": p} for o, p in blind.items()}},
    )


def test_the_pair_stage_ranks_by_the_same_margin_rounded():
    m = _view({"AB": "tie", "BA": "tie"}).margin()
    assert m == round(5 / 3 - 1 / 2 + 0.5 - 0.5, 4) == 1.1667
    bad = _view({"AB": "tie", "BA": "tie"})
    bad.quality_rejected = None
    assert bad.margin() == float("-inf")


def test_pick_takes_the_best_margin_then_the_smaller_pair_id():
    assert pick([(0.5, "p2"), (1.25, "p9"), (1.0, "p1")]) == 1
    assert pick([(1.0, "p9"), (1.0, "p3"), (0.0, "p1")]) == 1  # a tie goes to p3
    assert pick([(float("-inf"), "a"), (float("-inf"), "b")]) == 0


def test_prefers_and_direction():
    pairwise = {"pairwise_aware": {"AB": {"prefers": "chosen"}, "BA": {"prefers": "chosen"}}}
    assert prefers(pairwise, "pairwise_aware") == {"AB": "chosen", "BA": "chosen"}
    assert prefers(pairwise, "pairwise_blind") == {"AB": None, "BA": None}
    assert direction({"AB": "chosen", "BA": "chosen"}) == "chosen"
    assert direction({"AB": "rejected", "BA": "rejected"}) == "rejected"
    assert direction({"AB": "chosen", "BA": "rejected"}) == "tie"
    assert direction({"AB": None, "BA": None}) is None


def test_a_b_sides():
    assert a_side("AB") == "chosen" and a_side("BA") == "rejected"
    assert shown_side("A", "chosen") == "chosen" and shown_side("B", "chosen") == "rejected"
    assert shown_side("A", "rejected") == "rejected" and shown_side("B", "rejected") == "chosen"
