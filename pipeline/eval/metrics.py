"""Figures of an evaluation: accuracy with ties apart, bootstrap intervals, per-group
figures, position consistency and bias, and the profile gain.

A pair's outcome is ``"win"`` (the chosen answer preferred), ``"loss"``, ``"tie"``, or
``None`` when the scorer failed on it (an unparseable verdict, a failed request). Accuracy is
wins over scored pairs: a tie is not a win, and is counted and reported on its own (with
``accuracy_ties_half`` giving it half a point, as RewardBench does). Failed pairs are left out
of every rate and counted as ``failed``.

Intervals are percentile bootstraps over pairs: ``n_boot`` resamples of the scored pairs
drawn with ``numpy.random.default_rng(seed).integers(0, n, (n_boot, n))``, the 2.5th and
97.5th percentiles of the resampled accuracies (numpy's default linear interpolation). The
profile gain resamples the same pairs for both settings (a paired bootstrap).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import numpy as np

from pipeline.core.fields import ORDERS
from pipeline.rules.verdicts import a_side, shown_side

N_BOOT = 1000
SEED = 0
REFERENCE_SHUFFLE_SEED = 42  # the reference pairwise script's A/B shuffle seed
_CHUNK = 2_000_000  # resample cells per numpy batch: bounds memory on large splits


def _r(x: float | None) -> float | None:
    return None if x is None else round(float(x), 4)


def _r4(x: float) -> float:
    return round(float(x), 4)


def bootstrap_ci(
    values: Sequence[float], n_boot: int = N_BOOT, seed: int = SEED
) -> list[float] | None:
    """95% percentile interval of the mean of ``values``; None when there are none."""
    v = np.asarray(values, dtype=float)
    n = len(v)
    if n == 0:
        return None
    rng = np.random.default_rng(seed)
    rows = max(1, _CHUNK // n)
    means = []
    for start in range(0, n_boot, rows):
        idx = rng.integers(0, n, size=(min(rows, n_boot - start), n))
        means.append(v[idx].mean(axis=1))
    lo, hi = np.quantile(np.concatenate(means), [0.025, 0.975])
    return [_r4(lo), _r4(hi)]


def _wins(outcomes: Sequence[str | None]) -> list[float]:
    return [1.0 if o == "win" else 0.0 for o in outcomes if o is not None]


def summary(
    outcomes: Sequence[str | None], n_boot: int = N_BOOT, seed: int = SEED
) -> dict[str, Any]:
    """Counts, accuracy, its 95% interval, and the tie-aware variants."""
    wins = sum(o == "win" for o in outcomes)
    losses = sum(o == "loss" for o in outcomes)
    ties = sum(o == "tie" for o in outcomes)
    scored = wins + losses + ties
    return {
        "pairs": len(outcomes),
        "scored": scored,
        "failed": len(outcomes) - scored,
        "wins": wins,
        "losses": losses,
        "ties": ties,
        "accuracy": _r(wins / scored) if scored else None,
        "ci95": bootstrap_ci(_wins(outcomes), n_boot, seed),
        "tie_share": _r(ties / scored) if scored else None,
        "accuracy_ties_half": _r((wins + ties / 2) / scored) if scored else None,
    }


def by_group(
    outcomes: Sequence[str | None],
    groups: Sequence[dict[str, str]],
    n_boot: int = N_BOOT,
    seed: int = SEED,
) -> dict[str, dict[str, Any]]:
    """``{column: {value: summary}}`` for every group column any pair has."""
    columns = sorted({c for g in groups for c in g})
    out: dict[str, dict[str, Any]] = {}
    for col in columns:
        values = sorted({g[col] for g in groups if col in g})
        out[col] = {}
        for value in values:
            sub = [o for o, g in zip(outcomes, groups, strict=True) if g.get(col) == value]
            s = summary(sub, n_boot, seed)
            out[col][value] = {
                k: s[k] for k in ("pairs", "scored", "wins", "ties", "accuracy", "ci95")
            }
    return out


def mean_of_rates(counts: Sequence[tuple[int, int]] | None) -> float | None:
    """The unweighted mean of ``hits / scored`` over groups (a macro average: each category
    counts once, whatever its size), over the groups with anything scored; None without
    any. No interval: the pooled accuracy's ``ci95`` is the one resampled."""
    rates = [hits / scored for hits, scored in counts or () if scored]
    return _r(sum(rates) / len(rates)) if rates else None


def paired_gain(
    with_: Sequence[str | None],
    without: Sequence[str | None],
    n_boot: int = N_BOOT,
    seed: int = SEED,
) -> dict[str, Any]:
    """Accuracy with minus accuracy without, over the pairs scored in both settings."""
    diffs = [
        (a == "win") - (b == "win")
        for a, b in zip(with_, without, strict=True)
        if a is not None and b is not None
    ]
    if not diffs:
        return {"pairs": 0, "gain": None, "ci95": None}
    return {
        "pairs": len(diffs),
        "gain": _r(sum(diffs) / len(diffs)),
        "ci95": bootstrap_ci(diffs, n_boot, seed),
        "improved": sum(d > 0 for d in diffs),
        "worsened": sum(d < 0 for d in diffs),
    }


def pointwise_outcome(chosen: float | None, rejected: float | None) -> str | None:
    if chosen is None or rejected is None or chosen != chosen or rejected != rejected:
        return None  # missing or NaN
    if chosen > rejected:
        return "win"
    return "loss" if chosen < rejected else "tie"


def side(order: str, letter: str | None) -> str | None:
    """Which answer a verdict letter names (``pipeline.rules.verdicts``): order "AB" shows
    the chosen answer as A."""
    if letter is None:
        return None
    if letter == "tie":
        return "tie"
    return shown_side(letter, a_side(order))


def pairwise_outcome(ab: str | None, ba: str | None) -> str | None:
    """A pair's outcome from its two verdicts (each "A", "B", "tie" or None if failed):
    a win needs the chosen answer in both orders, a loss the rejected one in both; any
    other parsed combination (the judge changed its mind with the order, or said tie) is
    a tie."""
    s1, s2 = (side(o, v) for o, v in zip(ORDERS, (ab, ba), strict=True))
    if s1 is None or s2 is None:
        return None
    if s1 == s2 == "chosen":
        return "win"
    if s1 == s2 == "rejected":
        return "loss"
    return "tie"


def position_figures(
    ab: Sequence[str | None],
    ba: Sequence[str | None],
    seed: int = REFERENCE_SHUFFLE_SEED,
    subsets: Sequence[str] | None = None,
) -> dict[str, Any]:
    """Position consistency and bias from both orders of every pair.

    ``consistency``: share of pairs (both orders parsed) whose verdicts name the same answer.
    ``accuracy_chosen_first`` / ``_second``: share of verdicts preferring the chosen answer
    when it is shown as A / as B; ``bias`` is the first minus the second (> 0 favours A; the
    reference script reports its absolute value). ``share_a``: verdicts answering "A".
    ``accuracy_single_order``: the mean of the two, the expected accuracy of one random order.
    ``accuracy_reference_order``: the accuracy of the one order per pair that the reference
    script's shuffle would have asked, for comparison with its published figures. The
    reference runs once per subset and seeds ``random.seed(42)`` each time (chosen first
    when ``random() < 0.5``, pairs in the subset's order): with ``subsets`` (each pair's
    subset, e.g. its category) the draw restarts for each subset, and the figure is pooled
    over them (``reference_order_correct`` of ``reference_order_scored``).
    """
    both = [(a, b) for a, b in zip(ab, ba, strict=True) if a is not None and b is not None]
    consistent = sum(side(ORDERS[0], a) == side(ORDERS[1], b) for a, b in both)
    first = [side("AB", a) == "chosen" for a in ab if a is not None]
    second = [side("BA", b) == "chosen" for b in ba if b is not None]
    letters = [x for x in (*ab, *ba) if x in ("A", "B")]
    acc1 = sum(first) / len(first) if first else None
    acc2 = sum(second) / len(second) if second else None
    names = list(subsets) if subsets is not None else [""] * len(ab)
    rngs: dict[str, random.Random] = {}
    ref = []
    for a, b, name in zip(ab, ba, names, strict=True):
        rng = rngs.setdefault(name, random.Random(seed))  # one restarted draw per subset
        chosen_first = rng.random() < 0.5  # drawn for every pair, as the reference does
        verdict, order = (a, "AB") if chosen_first else (b, "BA")
        if verdict is not None:
            ref.append(side(order, verdict) == "chosen")
    return {
        "pairs_both_orders": len(both),
        "consistency": _r(consistent / len(both)) if both else None,
        "accuracy_chosen_first": _r(acc1),
        "accuracy_chosen_second": _r(acc2),
        "bias": _r(acc1 - acc2) if acc1 is not None and acc2 is not None else None,
        "share_a": _r(letters.count("A") / len(letters)) if letters else None,
        "accuracy_single_order": _r((acc1 + acc2) / 2)
        if acc1 is not None and acc2 is not None
        else None,
        "accuracy_reference_order": _r(sum(ref) / len(ref)) if ref else None,
        "reference_order_correct": sum(ref),
        "reference_order_scored": len(ref),
        "reference_order_seed": seed,
        "reference_order_seeded_per": "category" if subsets is not None else "split",
    }
