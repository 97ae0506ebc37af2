"""The figures of ``prb eval bon``: best-of-k picks, the mean downstream score per scorer,
setting, subset and k with a bootstrap interval, and the table ``prb eval correlate`` reads.

Best-of-k (the reference's ``BoN/score.py``): for each question, the highest-scored of its
first ``k`` samples (samples in the order they were drawn, 0 to N-1). **Ties** go to the
lowest sample index, which is what the reference's ``max()`` over the first k does (it
keeps the first maximum); a score that is not a number (NaN) ranks below every number, so it
is picked only when every one of the k is NaN, and then the first. The pick of k is thus
the pick of k-1 unless sample k-1 scores strictly higher.

A picked answer's downstream score is the judge's mean over the question's rubric aspects
(0, 1 or 2 each). Per scorer, setting, subset and k: the mean over questions, with a 95%
percentile bootstrap over questions (``pipeline.eval.metrics.bootstrap_ci``: the same draw
``prb eval`` uses), the standard deviation, min and max (as the reference's summary), and
the gain over k = 1 (the mean at the largest k minus the mean at k = 1, a paired bootstrap
over the same questions).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from pipeline.eval.metrics import bootstrap_ci

ALL = "all"  # the figures over every question, beside each subset's


def default_ks(n: int) -> list[int]:
    """1, 2, 4, ... up to ``n``, and ``n`` itself (the reference's k values within N)."""
    ks = []
    k = 1
    while k <= n:
        ks.append(k)
        k *= 2
    if ks[-1] != n:
        ks.append(n)
    return ks


def _key(score: float) -> float:
    return -math.inf if score != score else score  # NaN below every number


def best_of_k(scores: Sequence[float], ks: Sequence[int]) -> dict[int, int]:
    """For each k: the index of the highest of ``scores[:k]``, ties to the lowest index."""
    out = {}
    best = 0
    done = 0
    for k in sorted(ks):
        for i in range(done, min(k, len(scores))):
            if _key(scores[i]) > _key(scores[best]):
                best = i
        done = max(done, k)
        out[k] = best
    return out


def _std(values: Sequence[float]) -> float:
    return float(np.std(np.asarray(values, dtype=float)))  # the reference's np.std (ddof 0)


def summarize(values: Sequence[float], n_boot: int, seed: int) -> dict[str, Any]:
    """Mean (unrounded), 95% interval, std, min, max and count of per-question scores."""
    if not values:
        return {"questions": 0, "mean": None, "ci95": None, "std": None, "min": None, "max": None}
    v = [float(x) for x in values]
    return {
        "questions": len(v),
        "mean": sum(v) / len(v),
        "ci95": bootstrap_ci(v, n_boot, seed),
        "std": _std(v),
        "min": min(v),
        "max": max(v),
    }


def gain(top: Sequence[float], first: Sequence[float], n_boot: int, seed: int) -> dict[str, Any]:
    """Mean of ``top - first`` over the same questions, with a paired bootstrap."""
    diffs = [a - b for a, b in zip(top, first, strict=True)]
    if not diffs:
        return {"gain": None, "ci95": None}
    return {"gain": sum(diffs) / len(diffs), "ci95": bootstrap_ci(diffs, n_boot, seed)}


def curves(
    picks: dict[str, dict[int, int]],
    judged: dict[tuple[str, int], float],
    subsets: dict[str, str | None],
    ks: Sequence[int],
    n_boot: int,
    seed: int,
) -> dict[str, Any]:
    """One scorer and setting's figures: per subset (and ``all``), per k, the summary of
    the picked answers' downstream scores; and the gain of the largest k over k = 1.

    ``picks``: question -> k -> sample index; ``judged``: (question, sample) -> score;
    ``subsets``: question -> its subset (None: the split has none)."""
    groups: dict[str, list[str]] = {ALL: list(picks)}
    for q in picks:
        if subsets.get(q) is not None:
            groups.setdefault(str(subsets[q]), []).append(q)
    out: dict[str, Any] = {}
    top = max(ks)
    for name, questions in groups.items():
        per_k = {}
        for k in ks:
            per_k[str(k)] = summarize([judged[(q, picks[q][k])] for q in questions], n_boot, seed)
        first = [judged[(q, picks[q][min(ks)])] for q in questions]
        best = [judged[(q, picks[q][top])] for q in questions]
        out[name] = {"k": per_k, "gain": gain(best, first, n_boot, seed)}
    return out


def table_rows(
    blocks: Sequence[dict[str, Any]],
    setting: str,
    ks: Sequence[int],
) -> tuple[list[str], list[list[Any]], list[str]]:
    """The correlate table of one setting: a row per scorer (and subset) with its benchmark
    accuracy and its downstream figures: ``bon_k<N>``, the mean at the largest k, and
    ``bon_mean_k``, the mean of the curve over every k above 1 (how early a scorer finds
    the better answers). (The gain over k = 1 would rank scorers as ``bon_k<N>`` does: k =
    1 is sample 0 for every scorer.) Scorers without an accuracy are left out and named.
    Returns (header, rows, notes)."""
    top = max(ks)
    down = f"bon_k{top}"
    above = [k for k in ks if k > 1]
    has_subsets = any(len(b["curves"][setting]) > 1 for b in blocks)
    header = ["model", *(["subset"] if has_subsets else []), "accuracy", down]
    header += ["bon_mean_k"] if len(above) > 1 else []
    rows: list[list[Any]] = []
    notes = []
    for b in blocks:
        acc = b.get("accuracy")
        if not acc:
            notes.append(f"{b['name']}: no benchmark accuracy ({b.get('accuracy_note')})")
            continue
        for subset, fig in b["curves"][setting].items():
            if has_subsets and subset == ALL:
                continue
            value = acc["by_subset"].get(subset) if has_subsets else acc["accuracy"]
            if value is None:
                notes.append(f"{b['name']}: no accuracy on subset {subset!r}")
                continue
            mean = fig["k"][str(top)]["mean"]
            row: list[Any] = [b["name"], *([subset] if has_subsets else []), value, mean]
            if len(above) > 1:
                curve = [fig["k"][str(k)]["mean"] for k in above]
                row.append(None if None in curve else sum(curve) / len(curve))
            rows.append(row)
    return header, rows, notes


def csv_text(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """The table as CSV (numbers with every digit: ``repr`` of a float)."""
    import csv
    import io

    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(header)
    for r in rows:
        w.writerow(["" if x is None else repr(x) if isinstance(x, float) else x for x in r])
    return buf.getvalue()
