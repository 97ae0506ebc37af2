"""The shortcut probe: do cheap surface features tell the chosen answer from the rejected?

A benchmark such features can solve measures style, not personal preference. The probe is a
logistic regression on (chosen - rejected) feature differences, symmetrised, with 5-fold
cross-validation split by pair, plus each feature's AUC alone. One rule
(:func:`probe_status`) turns its figures into ``clear``, ``flagged`` or ``too_small``; it
names the features that drive it by their single-feature AUC and direction. Under
``PROBE_MIN_PAIRS`` pairs it cannot run; :func:`asymmetries` still says which side is
longer or more formatted, pair by pair.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Sequence
from typing import Any

from pipeline.core.fields import count_words, row_id, words

PROBE_FLAG_AUC = 0.6
PROBE_FOLDS = 5
PROBE_SEED = 0
# With fewer pairs than this a 5-fold AUC is noise, not evidence.
PROBE_MIN_PAIRS = 10
# Side-swapped re-runs that give the probe's chance level, on at most this many pairs.
PROBE_NULL_RUNS = 20
PROBE_NULL_MAX_PAIRS = 5000
# A feature drives the probe when, alone, it passes the threshold in either direction
# (its AUC above PROBE_FLAG_AUC or below 1 - PROBE_FLAG_AUC): the same test the rule uses.
MAX_DRIVERS = 3
# A plain asymmetry is notable when one side has more of a feature in this share of pairs.
ASYMMETRY_SHARE = 0.75

_LIST_RE = re.compile(r"^\s*(?:[-*+•]|\d+[.)])\s+", re.M)
_HEADER_RE = re.compile(r"^\s{0,3}#{1,6}\s", re.M)
_BOLD_RE = re.compile(r"\*\*[^*\n]+\*\*|__[^_\n]+__")
PROBE_FEATURES = (
    "words",
    "chars",
    "question_overlap",
    "list_items",
    "bold",
    "headers",
    "newlines",
    "commas",
    "periods",
    "exclamations",
    "questions",
    "colons",
)
# Human names (plots, tables) and what "more" and "less" of each mean, said of the chosen.
FEATURE_NAMES = {
    "words": ("length in words", "are longer (in words)", "are shorter (in words)"),
    "chars": ("length in characters", "are longer (in characters)", "are shorter (in characters)"),
    "question_overlap": (
        "overlap with the question",
        "repeat more of the question's words",
        "repeat fewer of the question's words",
    ),
    "list_items": ("list items", "use more list items", "use fewer list items"),
    "bold": ("bold text", "use more bold text", "use less bold text"),
    "headers": ("headings", "use more headings", "use fewer headings"),
    "newlines": ("line breaks", "have more line breaks", "have fewer line breaks"),
    "commas": ("commas", "use more commas", "use fewer commas"),
    "periods": ("full stops", "have more full stops", "have fewer full stops"),
    "exclamations": (
        "exclamation marks",
        "use more exclamation marks",
        "use fewer exclamation marks",
    ),
    "questions": ("question marks", "ask more questions", "ask fewer questions"),
    "colons": ("colons", "use more colons", "use fewer colons"),
}


def feature_name(feature: str) -> str:
    return FEATURE_NAMES[feature][0]


def surface_features(question: str, answer: str) -> list[float]:
    """Cheap features of one answer, in the order of ``PROBE_FEATURES``."""
    ws = words(answer)
    return _features(set(words(question)), answer, ws, count_words(answer))


def _features(q: set[str], answer: str, ws: Sequence[str], n_words: int) -> list[float]:
    return [
        float(n_words),
        float(len(answer)),
        sum(map(q.__contains__, ws)) / len(ws) if ws else 0.0,
        float(len(_LIST_RE.findall(answer))),
        float(len(_BOLD_RE.findall(answer))),
        float(len(_HEADER_RE.findall(answer))),
        float(answer.count("\n")),
        float(answer.count(",")),
        float(answer.count(".")),
        float(answer.count("!")),
        float(answer.count("?")),
        float(answer.count(":")),
    ]


def _auc(y: Any, score: Any) -> float:
    """ROC AUC by the rank-sum formula (ties count half): the same figure as
    sklearn's roc_auc_score, without its per-call validation cost, which dominated the
    probe's run time with the side-swapped re-runs."""
    import numpy as np

    y = np.asarray(y, dtype=bool)
    # average 1-based ranks: tied scores share the mean of the ranks they span
    _, inverse, counts = np.unique(np.asarray(score), return_inverse=True, return_counts=True)
    ranks = (np.cumsum(counts) - (counts - 1) / 2)[inverse]
    n_pos, n_neg = int(y.sum()), int((~y).sum())
    return float((ranks[y].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


# Inverse L2 strength, as scikit-learn's LogisticRegression default (C=1.0) on
# standardised features.
PROBE_C = 1.0


def _fit_pairs(diff: Any, c: float = PROBE_C) -> tuple[Any, Any]:
    """Logistic regression without intercept on the symmetrised pairs, features scaled to
    unit spread; returns the weights for unscaled features and the standardised weights.

    On mirrored data ((d, 1) and (-d, 0) for every pair) the log-loss of both rows is
    log(1 + exp(-w.d)), so the fit is the same as one row per pair labelled 1 with twice
    the weight: half the work. It is solved by Newton's method with backtracking (12
    weights: a 12x12 system per step), the objective scikit-learn's lbfgs solver
    minimises (C * sum of log-losses + |w|^2 / 2), without its per-fit overhead, which
    dominated the probe's 105 fits.
    """
    import numpy as np

    # std of [d, -d]: its mean is exactly zero
    scale = np.sqrt((diff**2).mean(axis=0))
    scale[scale == 0] = 1.0
    x = diff / scale
    k = x.shape[1]
    w = np.zeros(k)
    cc = 2.0 * c  # both mirrored rows of a pair carry the same loss

    def objective(v: Any) -> float:
        return float(cc * np.logaddexp(0.0, -(x @ v)).sum() + 0.5 * v @ v)

    f = objective(w)
    for _ in range(50):
        z = x @ w
        p = 0.5 * (1.0 + np.tanh(-0.5 * z))  # sigmoid(-z), overflow-free
        grad = -cc * (x.T @ p) + w
        hess = cc * (x.T * (p * (1.0 - p))) @ x + np.eye(k)
        step = np.linalg.solve(hess, grad)
        t = 1.0
        while True:
            w_new = w - t * step
            f_new = objective(w_new)
            if f_new <= f - 1e-4 * t * float(grad @ step) or t < 1e-8:
                break
            t *= 0.5
        done = f - f_new <= 1e-10 * max(1.0, abs(f))
        w, f = w_new, f_new
        if done:
            break
    return w / scale, w


def _folds(n: int, seed: int) -> list[tuple[Any, Any]]:
    """(train, test) index arrays of a shuffled k-fold split: the same folds as
    scikit-learn's ``KFold(PROBE_FOLDS, shuffle=True, random_state=seed)``, without
    importing scikit-learn (seconds of start-up for one split)."""
    import numpy as np

    idx = np.arange(n)
    np.random.RandomState(seed).shuffle(idx)
    sizes = np.full(PROBE_FOLDS, n // PROBE_FOLDS)
    sizes[: n % PROBE_FOLDS] += 1
    out, start = [], 0
    for size in sizes:
        test = np.sort(idx[start : start + size])
        mask = np.ones(n, dtype=bool)
        mask[test] = False
        out.append((np.flatnonzero(mask), test))
        start += size
    return out


def _cv_auc(diff: Any, seed: int) -> tuple[list[float], list[float], list[float]]:
    """Per-fold AUCs and the out-of-fold labels and scores of the symmetrised probe."""
    import numpy as np

    fold_aucs: list[float] = []
    oof_y: list[float] = []
    oof_p: list[float] = []
    for train, test in _folds(len(diff), seed):
        w, _ = _fit_pairs(diff[train])
        # each test pair gives (chosen - rejected, 1) and (rejected - chosen, 0): both rows
        # of a pair sit in the same fold, so the probe never sees the mirror of a test row
        s = diff[test] @ w  # the logit; AUC needs only the order
        score = np.concatenate([s, -s])
        yte = np.concatenate([np.ones(len(test)), np.zeros(len(test))])
        fold_aucs.append(_auc(yte, score))
        oof_y.extend(yte.tolist())
        oof_p.extend(score.tolist())
    return fold_aucs, oof_y, oof_p


def probe_matrix(n: int) -> Any:
    """An empty (pairs x features) matrix for :func:`feature_difference` rows, or None
    when the set is too small for the probe."""
    import numpy as np

    return np.empty((n, len(PROBE_FEATURES))) if n >= PROBE_MIN_PAIRS else None


def feature_difference(
    r: dict[str, Any],
    tc: Sequence[str] | None = None,
    tr: Sequence[str] | None = None,
    nc: int | None = None,
    nr: int | None = None,
) -> list[float]:
    """(chosen - rejected) features of one pair; ``tc``/``tr`` and ``nc``/``nr`` reuse the
    words and counts the caller already has."""
    q = set(words(r["question"]))
    tc = words(r["chosen"]) if tc is None else tc
    tr = words(r["rejected"]) if tr is None else tr
    nc = count_words(r["chosen"]) if nc is None else nc
    nr = count_words(r["rejected"]) if nr is None else nr
    a = _features(q, r["chosen"], tc, nc)
    b = _features(q, r["rejected"], tr, nr)
    return [x - y for x, y in zip(a, b, strict=True)]


def _differences(rows: Sequence[dict[str, Any]]) -> Any:
    """(chosen - rejected) features, one row per pair."""
    import numpy as np

    out = np.empty((len(rows), len(PROBE_FEATURES)), dtype=float)
    for i, r in enumerate(rows):
        out[i] = feature_difference(r)
    return out


def strength(auc: float) -> float:
    """How well one feature separates the sides, whichever side has more of it: an AUC of
    0.3 (the chosen has less) separates as well as 0.7."""
    return max(auc, 1.0 - auc)


def drivers(single: dict[str, float]) -> list[dict[str, Any]]:
    """The features that alone pass the threshold (:func:`strength` above
    ``PROBE_FLAG_AUC``), strongest first, each with its direction in words."""
    out = []
    ranked = sorted(PROBE_FEATURES, key=lambda f: (-strength(single[f]), PROBE_FEATURES.index(f)))
    for f in ranked[:MAX_DRIVERS]:
        auc = single[f]
        if strength(auc) <= PROBE_FLAG_AUC:
            break
        more = auc > 0.5
        phrase = FEATURE_NAMES[f][1 if more else 2]
        out.append(
            {
                "feature": f,
                "label": feature_name(f),
                "auc": auc,
                "direction": "chosen has more" if more else "chosen has less",
                "text": f"chosen answers {phrase} (single-feature AUC {auc:.2f})",
            }
        )
    return out


def asymmetries(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per feature, in how many pairs the chosen has more and in how many less; the plain
    figures a set too small for the probe still gets."""
    import numpy as np

    n = len(rows)
    diff = _differences(rows) if n else np.zeros((0, len(PROBE_FEATURES)))
    out = []
    for k, f in enumerate(PROBE_FEATURES):
        more, less = int((diff[:, k] > 0).sum()), int((diff[:, k] < 0).sum())
        side_more = more >= less
        top = more if side_more else less
        notable = n >= 2 and top >= ASYMMETRY_SHARE * n
        phrase = FEATURE_NAMES[f][1 if side_more else 2]
        out.append(
            {
                "feature": f,
                "label": feature_name(f),
                "chosen_more": more,
                "chosen_less": less,
                "equal": n - more - less,
                "notable": bool(notable),
                "text": f"chosen answers {phrase} in {top} of {n} pairs",
            }
        )
    return out


def _single_aucs(diff: Any) -> list[float]:
    """Each feature's AUC alone on the symmetrised pairs (no fitting: the difference
    itself is the score)."""
    import numpy as np

    x_all = np.concatenate([diff, -diff])
    y_all = np.concatenate([np.ones(len(diff)), np.zeros(len(diff))])
    return [_auc(y_all, x_all[:, i]) for i in range(diff.shape[1])]


def _figures(diff: Any, seed: int) -> tuple[list[float], float, list[float]]:
    """The probe's figures on one matrix: per-fold AUCs, the pooled out-of-fold AUC and the
    single-feature AUCs."""
    fold_aucs, oof_y, oof_p = _cv_auc(diff, seed)
    return fold_aucs, _auc(oof_y, oof_p), _single_aucs(diff)


def _highest(auc: float, pooled: float, single: Sequence[float]) -> float:
    """The figure the rule reads: the highest of the cross-validated AUC, the pooled AUC
    and every feature's strength alone."""
    return max(auc, pooled, *(strength(a) for a in single))


def probe_status(probe: dict[str, Any]) -> dict[str, Any]:
    """The rule that turns the probe's figures into one decision (docs/audit.md, "The
    shortcut probe"): ``flagged`` when its highest figure is above the threshold and above
    what 95% of side-swapped runs of the same size reach; ``clear`` when that figure and
    the chance level are both at or under the threshold; else ``too_small`` (the set is too
    small for the figures to tell a shortcut from chance), with ``needs_pairs``, about the
    size at which chance stays under the threshold."""
    thr = PROBE_FLAG_AUC
    n = probe["pairs"]
    if "auc" not in probe:  # not run: no chance level, so no size to clear can be told
        return {"status": "too_small", "needs_pairs": None, "over_threshold": []}
    single = probe["single_feature_auc"]
    figures = [
        {"figure": "auc", "label": "AUC (mean over folds)", "value": probe["auc"]},
        {"figure": "pooled_auc", "label": "pooled out-of-fold AUC", "value": probe["pooled_auc"]},
        *(
            {
                "figure": f"single_feature_auc.{f}",
                "label": f"{feature_name(f)} alone",
                "value": round(strength(single[f]), 4),
            }
            for f in PROBE_FEATURES
        ),
    ]
    figures.sort(key=lambda x: -x["value"])
    top, chance = figures[0]["value"], probe["chance_highest_p95"]
    over = [x for x in figures if x["value"] > thr]
    if top > thr and top > chance:
        status = "flagged"
    elif top <= thr and chance <= thr:
        status = "clear"
    else:
        status = "too_small"
    # the chance band's distance from 0.5 shrinks as 1/sqrt(n): the size at which it
    # would sit at the threshold
    needs = math.ceil(n * ((chance - 0.5) / (thr - 0.5)) ** 2) if status == "too_small" else None
    return {"status": status, "highest": figures[0], "over_threshold": over, "needs_pairs": needs}


def set_order(rows: Sequence[dict[str, Any]]) -> list[int]:
    """The rows' positions sorted by what the pairs hold (chosen text, rejected text,
    question, then the row's id): one order for one set of pairs, whatever order they
    were read in. Rows equal on all four are interchangeable."""

    def key(i: int) -> tuple[str, str, str, str]:
        r = rows[i]
        return (r["chosen"], r["rejected"], str(r.get("question") or ""), row_id(r) or "")

    return sorted(range(len(rows)), key=key)


def shortcut_probe(
    rows: Sequence[dict[str, Any]],
    *,
    timings: dict[str, float] | None = None,
    diff: Any = None,
) -> dict[str, Any]:
    """Cross-validated AUC of a logistic regression telling chosen from rejected by
    surface features, with folds split by pair, each feature's AUC alone, the figures
    reached by chance, the features that drive it and the decision of
    :func:`probe_status`. ``diff``: the (chosen - rejected) feature matrix, if the caller
    built it (:func:`probe_matrix`, :func:`feature_difference`)."""
    n = len(rows)
    if n < PROBE_MIN_PAIRS:
        out: dict[str, Any] = {
            "skipped": f"{n} pairs; the probe runs from {PROBE_MIN_PAIRS} pairs",
            "pairs": n,
            "threshold": PROBE_FLAG_AUC,
            "runs_from": PROBE_MIN_PAIRS,
        }
        out.update(probe_status(out))
        out["flagged"] = False
        return out
    import numpy as np

    clock = time.perf_counter()
    if diff is None:  # the caller did not compute the features in its own pass
        diff = _differences(rows)
    if timings is not None:
        timings["probe_features_s"] = round(time.perf_counter() - clock, 3)
        clock = time.perf_counter()
    # The folds and the side swaps below are drawn by position, so the pairs are first put
    # in an order that depends on the set alone: a file shuffled, or a release and the
    # run it was built from (whose rows come in another order), give the same figures.
    diff = diff[set_order(rows)]
    fold_aucs, pooled, single_list = _figures(diff, PROBE_SEED)
    auc = float(np.mean(fold_aucs))

    # The chance level: the same figures on pairs whose sides were swapped at random. Its
    # spread is wide on small sets (the highest figure reaches 0.9 at 10 pairs), so a
    # small set can pass the threshold by luck, and a figure under it proves nothing.
    # Past PROBE_NULL_MAX_PAIRS pairs the swapped runs use a random sample of that many
    # and their distance from 0.5 is scaled by sqrt(sample / n) (an AUC's chance spread
    # shrinks as 1/sqrt(n)): the band is then a few thousandths wide either way, and the
    # 100 extra fits stop growing with the set.
    rng = np.random.default_rng(PROBE_SEED)
    sample = diff
    if n > PROBE_NULL_MAX_PAIRS:
        sample = diff[rng.choice(n, size=PROBE_NULL_MAX_PAIRS, replace=False)]
    shrink = math.sqrt(len(sample) / n)
    null_auc, null_top = [], []
    for k in range(PROBE_NULL_RUNS):
        swapped = sample * rng.choice([-1.0, 1.0], size=(len(sample), 1))
        f_aucs, f_pooled, f_single = _figures(swapped, PROBE_SEED + k)
        null_auc.append(0.5 + shrink * (float(np.mean(f_aucs)) - 0.5))
        null_top.append(0.5 + shrink * (_highest(float(np.mean(f_aucs)), f_pooled, f_single) - 0.5))
    null_auc.sort()
    null_top.sort()
    p95 = math.ceil(0.95 * PROBE_NULL_RUNS) - 1

    _, std_coefs = _fit_pairs(diff)
    single = {name: round(a, 4) for name, a in zip(PROBE_FEATURES, single_list, strict=True)}
    if timings is not None:
        timings["probe_fit_s"] = round(time.perf_counter() - clock, 3)
    out = {
        "auc": round(auc, 4),
        "fold_aucs": [round(a, 4) for a in fold_aucs],
        "pooled_auc": round(pooled, 4),
        "threshold": PROBE_FLAG_AUC,
        "chance_auc_mean": round(float(np.mean(null_auc)), 4),
        "chance_auc_p95": round(null_auc[p95], 4),
        # the same for the highest figure, which the rule compares
        "chance_highest_p95": round(null_top[p95], 4),
        "chance_sample": len(sample),
        "above_chance": auc > null_auc[p95],
        "folds": PROBE_FOLDS,
        "seed": PROBE_SEED,
        "pairs": n,
        "runs_from": PROBE_MIN_PAIRS,
        "features": list(PROBE_FEATURES),
        "feature_names": {f: feature_name(f) for f in PROBE_FEATURES},
        # standardised coefficients: positive means the chosen side has more of it
        "coefficients": {
            k: round(float(c), 4) for k, c in zip(PROBE_FEATURES, std_coefs, strict=True)
        },
        "single_feature_auc": single,
        "drivers": drivers(single),
    }
    out.update(probe_status(out))
    out["flagged"] = out["status"] == "flagged"
    return out
