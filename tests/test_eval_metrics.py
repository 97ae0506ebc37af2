"""prb eval's figures against values computed by hand on crafted outcomes."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pipeline.eval import metrics


def test_summary_counts_ties_and_failures_apart() -> None:
    outcomes = ["win", "win", "loss", "tie", None, "win"]
    s = metrics.summary(outcomes)
    # 6 pairs; 1 failed; of 5 scored: 3 wins, 1 loss, 1 tie
    assert (s["pairs"], s["scored"], s["failed"]) == (6, 5, 1)
    assert (s["wins"], s["losses"], s["ties"]) == (3, 1, 1)
    assert s["accuracy"] == 0.6  # 3 / 5: a tie is not a win
    assert s["tie_share"] == 0.2
    assert s["accuracy_ties_half"] == 0.7  # (3 + 0.5) / 5


def test_interval_bounds_fixed_seed() -> None:
    # degenerate splits: every resample has the same accuracy
    assert metrics.bootstrap_ci([1.0] * 7) == [1.0, 1.0]
    assert metrics.bootstrap_ci([0.0] * 7) == [0.0, 0.0]
    assert metrics.bootstrap_ci([]) is None
    # the documented procedure, written out independently
    values = np.array([1, 1, 0, 1, 0, 1, 1, 0, 1, 1], dtype=float)
    rng = np.random.default_rng(7)
    means = values[rng.integers(0, 10, size=(500, 10))].mean(axis=1)
    expected = [round(float(q), 4) for q in np.quantile(means, [0.025, 0.975])]
    assert metrics.bootstrap_ci(values, n_boot=500, seed=7) == expected
    assert metrics.bootstrap_ci(values, n_boot=500, seed=7) == expected  # same seed, same bounds
    # at n = 400, p = 0.75 the percentile interval is close to the normal one (±0.042)
    big = [1.0] * 300 + [0.0] * 100
    lo, hi = metrics.bootstrap_ci(big, n_boot=2000, seed=0)
    half = 1.96 * math.sqrt(0.75 * 0.25 / 400)
    assert lo == pytest.approx(0.75 - half, abs=0.01)
    assert hi == pytest.approx(0.75 + half, abs=0.01)
    assert lo < 0.75 < hi


def test_bootstrap_in_chunks_matches_one_draw(monkeypatch: pytest.MonkeyPatch) -> None:
    values = [1.0, 0.0, 1.0, 1.0, 0.0, 1.0]
    whole = metrics.bootstrap_ci(values, n_boot=300, seed=3)
    monkeypatch.setattr(metrics, "_CHUNK", 12)  # two resamples per numpy batch
    assert metrics.bootstrap_ci(values, n_boot=300, seed=3) == whole


def test_per_group_figures() -> None:
    outcomes = ["win", "loss", "win", "tie", "win", None]
    groups = [
        {"category": "Art", "strategy": "avoid_all"},
        {"category": "Art", "strategy": "violate_one"},
        {"category": "Art", "strategy": "avoid_all"},
        {"category": "Life", "strategy": "avoid_all"},
        {"category": "Life", "strategy": "violate_one"},
        {"category": "Life"},
    ]
    by = metrics.by_group(outcomes, groups)
    assert by["category"]["Art"]["accuracy"] == pytest.approx(2 / 3, abs=1e-4)
    assert by["category"]["Art"]["pairs"] == 3
    assert by["category"]["Life"]["accuracy"] == 0.5  # win, tie; the failed pair left out
    assert by["category"]["Life"]["ties"] == 1
    assert by["category"]["Life"]["scored"] == 2
    assert by["strategy"]["avoid_all"]["accuracy"] == pytest.approx(2 / 3, abs=1e-4)
    assert by["strategy"]["violate_one"]["accuracy"] == 0.5
    assert by["category"]["Art"]["ci95"] == metrics.bootstrap_ci([1.0, 0.0, 1.0])


def test_profile_gain_is_paired() -> None:
    with_profile = ["win", "win", "loss", "win", None]
    question_only = ["loss", "win", "loss", "loss", "win"]
    g = metrics.paired_gain(with_profile, question_only)
    # pairs 1-4 scored in both: differences 1, 0, 0, 1
    assert g["pairs"] == 4
    assert g["gain"] == 0.5
    assert (g["improved"], g["worsened"]) == (2, 0)
    assert g["ci95"] == metrics.bootstrap_ci([1, 0, 0, 1])
    assert metrics.paired_gain([None], ["win"])["gain"] is None


def test_pointwise_outcome() -> None:
    assert metrics.pointwise_outcome(1.0, 0.5) == "win"
    assert metrics.pointwise_outcome(0.5, 1.0) == "loss"
    assert metrics.pointwise_outcome(0.5, 0.5) == "tie"
    assert metrics.pointwise_outcome(float("nan"), 0.5) is None


def test_pairwise_outcome_needs_both_orders() -> None:
    # "AB" shows the chosen answer as A, "BA" as B
    assert metrics.pairwise_outcome("A", "B") == "win"
    assert metrics.pairwise_outcome("B", "A") == "loss"
    assert metrics.pairwise_outcome("A", "A") == "tie"  # always A: position, not preference
    assert metrics.pairwise_outcome("tie", "B") == "tie"
    assert metrics.pairwise_outcome("A", None) is None  # one order failed: the pair failed


def test_position_consistency_and_bias() -> None:
    ab = ["A", "A", "B", "A", None]
    ba = ["B", "A", "A", "B", "B"]
    p = metrics.position_figures(ab, ba)
    # sides: 1 chosen/chosen, 2 chosen/rejected, 3 rejected/rejected, 4 chosen/chosen
    assert p["pairs_both_orders"] == 4
    assert p["consistency"] == 0.75
    assert p["accuracy_chosen_first"] == 0.75  # AB verdicts A, A, B, A
    assert p["accuracy_chosen_second"] == 0.6  # BA verdicts B, A, A, B, B
    assert p["bias"] == 0.15
    assert p["share_a"] == round(5 / 9, 4)
    assert p["accuracy_single_order"] == 0.675
    # random.seed(42) draws 0.639, 0.025, 0.275, 0.223, 0.736: the chosen answer first
    # (order AB) for pairs 2-4, second (BA) for pairs 1 and 5 -> correct on 1, 2, 4, 5
    assert p["accuracy_reference_order"] == 0.8


def test_reference_order_draw_restarts_for_each_subset() -> None:
    # The reference's pairwise script runs once per subset and calls random.seed(42) each
    # time. Subset x: draws 0.639, 0.025 -> pair 1 asked BA, pair 2 AB; subset y starts
    # again: 0.639, 0.025, 0.275 -> pair 3 BA, pair 4 AB, pair 5 AB.
    ab = ["A", "A", "B", "A", None]
    ba = ["B", "A", "A", "B", "B"]
    p = metrics.position_figures(ab, ba, subsets=["x", "x", "y", "y", "y"])
    # pair 1 BA "B": chosen; 2 AB "A": chosen; 3 BA "A": rejected; 4 AB "A": chosen;
    # pair 5's AB verdict failed: not scored
    assert (p["reference_order_correct"], p["reference_order_scored"]) == (3, 4)
    assert p["accuracy_reference_order"] == 0.75
    assert p["reference_order_seeded_per"] == "category"
    # one draw over the whole split (the figure before) is another figure: 0.8
    whole = metrics.position_figures(ab, ba)
    assert (whole["reference_order_correct"], whole["reference_order_scored"]) == (4, 5)
    assert whole["reference_order_seeded_per"] == "split"
    # a subset on its own gives the same draw as its part of the pooled figure
    y = metrics.position_figures(ab[2:], ba[2:])
    assert (y["reference_order_correct"], y["reference_order_scored"]) == (1, 2)
