"""Agreement statistics for human verification rounds of pairwise annotations.

The open-source Label Studio server computes no inter-annotator agreement, so the project does
(see DESIGN.md, "Human verification"). Every vote is a nominal label, normally one of
:data:`LABELS`, already mapped from the randomised A/B order back to the pair's sides by the
caller, so "chosen" always means the pair's chosen response.

Conventions shared by every function here:

* **Duplicate votes.** If one annotator labelled the same item more than once, only their *last*
  vote in the input sequence counts (callers pass annotations oldest first, so the last one is the
  latest); earlier ones are dropped before anything is counted.
* **Undefined is None.** A statistic with no defined value (too little data, or a chance term of
  zero) is returned as ``None``, never NaN, so the summary stays valid JSON and a missing figure
  can't be mistaken for a number.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import combinations
from typing import Any

import numpy as np

__all__ = [
    "LABELS",
    "Annotation",
    "cohen_kappa",
    "gold_accuracy",
    "human_vs_judge",
    "krippendorff_alpha_nominal",
    "majority",
    "pairwise_cohen_kappa",
    "raw_agreement",
    "summarize",
]

# The label set of a pairwise verification task, after mapping A/B back to the pair's sides.
LABELS: tuple[str, ...] = ("chosen", "rejected", "tie", "both_bad")


@dataclass(frozen=True)
class Annotation:
    """One vote: ``annotator`` gave ``label`` to item ``item_id``."""

    item_id: str
    annotator: str
    label: str


def _latest_votes(annotations: Sequence[Annotation]) -> dict[str, dict[str, str]]:
    """``{item_id: {annotator: label}}`` keeping each annotator's last vote per item.

    Plain dict assignment does the "last one wins" rule; items keep first-appearance order so
    outputs are stable for a given input.
    """
    votes: dict[str, dict[str, str]] = {}
    for a in annotations:
        votes.setdefault(a.item_id, {})[a.annotator] = a.label
    return votes


def _check_labels(votes: Mapping[str, Mapping[str, str]], labels: Sequence[str] | None) -> None:
    """Raise ValueError on a vote outside ``labels`` (a caller that forgot the A/B mapping)."""
    if labels is None:
        return
    allowed = set(labels)
    bad = sorted({lab for item in votes.values() for lab in item.values()} - allowed)
    if bad:
        raise ValueError(f"labels not in {sorted(allowed)}: {bad}")


def krippendorff_alpha_nominal(
    annotations: Sequence[Annotation], labels: Sequence[str] | None = None
) -> float | None:
    """Krippendorff's alpha for nominal data, computed from the coincidence matrix.

    Only items with at least two votes contribute ("pairable values"); an item with a single vote
    says nothing about agreement. Each such item ``u`` with ``m_u`` votes adds, for every ordered
    pair of its votes, ``1 / (m_u - 1)`` to ``o[c, k]``; with ``n_c`` the row sums and ``n`` the
    total::

        alpha = 1 - (n - 1) * sum_{c != k} o[c, k] / sum_{c != k} n_c * n_k

    ``labels``, when given, is the allowed label set: a vote outside it raises ValueError. Labels
    that are allowed but never used do not change nominal alpha.

    Returns None when there are fewer than two pairable values, or when the expected disagreement
    is 0 (every pairable value has the same label). Alpha is then 0/0: perfect observed agreement
    but no variation to tell it from chance. Returning 1.0 would claim a reliability the data
    cannot show, and NaN would break JSON, so None marks it as undefined.
    """
    votes = _latest_votes(annotations)
    _check_labels(votes, labels)
    pairable = [list(v.values()) for v in votes.values() if len(v) >= 2]
    if not pairable:
        return None
    cats = sorted({lab for unit in pairable for lab in unit})
    if len(cats) < 2:
        return None  # a single category: expected disagreement is exactly 0
    index = {c: i for i, c in enumerate(cats)}
    # counts[u, c]: how many votes item u got for category c.
    counts = np.zeros((len(pairable), len(cats)), dtype=np.float64)
    for u, unit in enumerate(pairable):
        for lab in unit:
            counts[u, index[lab]] += 1
    m = counts.sum(axis=1)
    w = 1.0 / (m - 1.0)
    # o[c, k] = sum_u (n_uc * n_uk - [c == k] * n_uc) / (m_u - 1): pairs of *different* votes.
    o = (counts * w[:, None]).T @ counts - np.diag(w @ counts)
    n_c = o.sum(axis=1)
    n = n_c.sum()
    observed = o.sum() - np.trace(o)  # off-diagonal mass
    expected = n * n - float(n_c @ n_c)  # sum_{c != k} n_c n_k; > 0 with >= 2 used categories
    return float(1.0 - (n - 1.0) * observed / expected)


def cohen_kappa(a: Sequence[str], b: Sequence[str]) -> float | None:
    """Cohen's kappa between two raters' labels on the same items (``a[i]`` and ``b[i]``).

    ``kappa = (po - pe) / (1 - pe)`` with ``po`` the observed agreement and ``pe`` the chance
    agreement from each rater's own label distribution. None when fewer than 2 items, or when
    ``pe == 1`` (both raters used one and the same label throughout: 0/0).
    """
    if len(a) != len(b):
        raise ValueError(f"rater sequences differ in length: {len(a)} != {len(b)}")
    n = len(a)
    if n < 2:
        return None
    # pe == 1 exactly when both used the same single label; test that on the labels rather
    # than comparing a float against 1.
    if len(set(a)) == 1 and set(a) == set(b):
        return None
    po = sum(x == y for x, y in zip(a, b, strict=True)) / n
    ca, cb = Counter(a), Counter(b)
    pe = sum(ca[c] * cb[c] for c in ca) / (n * n)
    return float((po - pe) / (1.0 - pe))


def _pair_stats(votes: Mapping[str, Mapping[str, str]], x: str, y: str) -> dict[str, Any]:
    shared = [(v[x], v[y]) for v in votes.values() if x in v and y in v]
    la = [p[0] for p in shared]
    lb = [p[1] for p in shared]
    n = len(shared)
    return {
        "kappa": cohen_kappa(la, lb),
        "n_items": n,
        "raw_agreement": (sum(p == q for p, q in shared) / n) if n else None,
    }


def pairwise_cohen_kappa(
    annotations: Sequence[Annotation],
) -> dict[tuple[str, str], dict[str, Any]]:
    """Cohen's kappa for every unordered annotator pair, keyed by the sorted pair of names.

    Each value is ``{"kappa", "n_items", "raw_agreement"}`` over the items both labelled. Every
    pair is listed, including ones that share no item (``n_items == 0``, both figures None), so a
    round whose annotators never overlap is visible rather than silently absent. ``kappa`` is None
    when ``n_items < 2`` or the chance agreement is 1; ``raw_agreement`` is None when
    ``n_items == 0``.
    """
    votes = _latest_votes(annotations)
    annotators = sorted({name for v in votes.values() for name in v})
    return {(x, y): _pair_stats(votes, x, y) for x, y in combinations(annotators, 2)}


def raw_agreement(annotations: Sequence[Annotation]) -> float | None:
    """Pairwise percent agreement over items with at least two votes.

    Every unordered pair of votes on the same item is one comparison; the result is agreeing
    pairs over all pairs, pooled across items. So an item with ``m`` votes weighs ``m(m-1)/2``
    (an item with 4 votes counts 6 times as much as one with 2), not 1. None when no item has
    two votes.
    """
    agree = total = 0
    for v in _latest_votes(annotations).values():
        m = len(v)
        if m < 2:
            continue
        total += m * (m - 1) // 2
        agree += sum(k * (k - 1) // 2 for k in Counter(v.values()).values())
    return agree / total if total else None


def majority(labels: Sequence[str]) -> tuple[str | None, float]:
    """The most frequent label and its share of ``labels``.

    A tie between the top labels gives ``(None, share)``: there is no majority, and the share
    still says how split the vote was. No labels gives ``(None, 0.0)``.
    """
    if not labels:
        return None, 0.0
    ranked = Counter(labels).most_common()
    top = ranked[0][1]
    share = top / len(labels)
    if len(ranked) > 1 and ranked[1][1] == top:
        return None, share
    return ranked[0][0], share


def human_vs_judge(verdicts: Mapping[str, str | None], judge: Mapping[str, str]) -> dict[str, Any]:
    """Agreement of the human verdict per item (``majority`` label) with the judge's direction.

    Counted over items that have both a non-None human verdict and a judge direction; items where
    the humans tied (verdict None) or the judge gave nothing are left out. The judge says
    "chosen"/"rejected"/"tie"; a human "both_bad" verdict therefore always counts as a
    disagreement. Returns ``{"n", "agreement", "kappa"}`` (figures None when undefined).
    """
    items = [i for i, v in verdicts.items() if v is not None and judge.get(i) is not None]
    human = [str(verdicts[i]) for i in items]  # never None here: filtered just above
    model = [judge[i] for i in items]
    n = len(items)
    return {
        "n": n,
        "agreement": (sum(h == j for h, j in zip(human, model, strict=True)) / n) if n else None,
        "kappa": cohen_kappa(human, model),
    }


def gold_accuracy(
    annotations: Sequence[Annotation], gold: Mapping[str, str]
) -> dict[str, dict[str, Any]]:
    """Per annotator, how often their (latest) vote on a gold item matches its known answer.

    Every annotator in ``annotations`` is listed, sorted by name; one who labelled no gold item
    has ``n == 0`` and ``accuracy`` None.
    """
    votes = _latest_votes(annotations)
    out: dict[str, dict[str, Any]] = {}
    for name in sorted({a for v in votes.values() for a in v}):
        graded = [v[name] == gold[i] for i, v in votes.items() if i in gold and name in v]
        n, correct = len(graded), sum(graded)
        out[name] = {"n": n, "correct": correct, "accuracy": correct / n if n else None}
    return out


def summarize(
    annotations: Sequence[Annotation],
    judge: Mapping[str, str] | None = None,
    gold: Mapping[str, str] | None = None,
    *,
    labels: Sequence[str] | None = LABELS,
) -> dict[str, Any]:
    """Every agreement figure for one round as a JSON-serialisable dict.

    Keys: ``items``, ``annotators``, ``annotations`` (votes counted, after keeping each
    annotator's last vote per item), ``duplicates_dropped``, ``items_with_2plus``,
    ``krippendorff_alpha``, ``raw_agreement``, ``pairwise_kappa`` (keyed ``"a|b"`` with the
    sorted names; each value also lists ``annotators`` since a name may itself contain "|"),
    ``majority`` (per item ``{"label", "share"}``), ``human_vs_judge`` and ``gold_accuracy``
    (None when ``judge`` / ``gold`` is not given).

    ``labels`` (default :data:`LABELS`) is the allowed label set; a vote outside it raises
    ValueError, which catches votes still in A/B form. Pass None to accept any label.

    Human-vs-judge uses the majority verdict of every item, including items with one vote (that
    vote is the verdict); items whose votes tie are left out.
    """
    votes = _latest_votes(annotations)
    _check_labels(votes, labels)
    n_votes = sum(len(v) for v in votes.values())
    verdicts: dict[str, str | None] = {}
    maj: dict[str, dict[str, Any]] = {}
    for item, v in votes.items():
        label, share = majority(list(v.values()))
        verdicts[item] = label
        maj[item] = {"label": label, "share": share}
    pairs = pairwise_cohen_kappa(annotations)
    return {
        "items": len(votes),
        "annotators": len({a for v in votes.values() for a in v}),
        "annotations": n_votes,
        "duplicates_dropped": len(annotations) - n_votes,
        "items_with_2plus": sum(len(v) >= 2 for v in votes.values()),
        "krippendorff_alpha": krippendorff_alpha_nominal(annotations, labels),
        "raw_agreement": raw_agreement(annotations),
        "pairwise_kappa": {f"{x}|{y}": {"annotators": [x, y], **s} for (x, y), s in pairs.items()},
        "majority": maj,
        "human_vs_judge": human_vs_judge(verdicts, judge) if judge is not None else None,
        "gold_accuracy": gold_accuracy(annotations, gold) if gold is not None else None,
    }
