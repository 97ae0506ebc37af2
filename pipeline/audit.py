"""audit: shortcuts and quality of a pairs file, ours or any in the reference schema.

Reads a release folder (its ``all`` config), a run directory (its ``publish`` folder),
a JSONL or parquet file, or a folder written by ``datasets``' ``save_to_disk``. Writes
``audit.html`` (self-contained: plots are inline SVG, the figures are embedded as JSON)
and ``audit.json`` with the same figures.

The shortcut probe asks whether cheap surface features (length, overlap with the
question, markdown marks, punctuation) tell the chosen answer from the rejected one. A
benchmark such features can solve measures style, not personal preference: the probe is
flagged when its cross-validated AUC exceeds ``PROBE_FLAG_AUC``.
"""

from __future__ import annotations

import html
import json
import math
import re
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pipeline.errors import InputError
from pipeline.io import write_json_atomic, write_text_atomic

REQUIRED_COLUMNS = ("question", "chosen", "rejected")
PROBE_FLAG_AUC = 0.6
PROBE_FOLDS = 5
PROBE_SEED = 0
# With fewer pairs than this a 5-fold AUC is noise, not evidence.
PROBE_MIN_PAIRS = 10
# Side-swapped re-runs that give the probe's chance level.
PROBE_NULL_RUNS = 20
DIMENSIONS = ("correctness", "relevance", "helpfulness")

# A rubric-blind judge for sets without judge columns: (question, answer A, answer B) ->
# "A", "B" or "tie". The audit asks it in both orders.
Judge = Callable[[str, str, str], str]

_WORD_RE = re.compile(r"\w+")
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


# ---- loading ----------------------------------------------------------------------------


def _check_columns(
    path: Path, columns: list[str], line: int | None = None, row: int | None = None
) -> None:
    """Raise naming the file (and line or row) and the first required column missing."""
    for col in REQUIRED_COLUMNS:
        if col not in columns:
            where = f"row {row}: " if row is not None else ""
            raise InputError(
                f"{where}missing column '{col}': the reference schema needs "
                f"{', '.join(REQUIRED_COLUMNS)}; found: {', '.join(columns) or 'none'}",
                path=path,
                line=line,
                field=col,
            )


def _from_table(path: Path, table: Any) -> list[dict[str, Any]]:
    _check_columns(path, list(table.column_names))
    return table.to_pylist()


def _from_parquet(path: Path) -> list[dict[str, Any]]:
    import pyarrow.parquet as pq

    files = sorted(path.glob("*.parquet")) if path.is_dir() else [path]
    if not files:
        raise InputError("no parquet file here", path=path)
    rows: list[dict[str, Any]] = []
    for f in files:
        rows.extend(_from_table(f, pq.read_table(f)))
    return rows


def _from_json(path: Path) -> list[dict[str, Any]]:
    """JSON lines, or (for a .json file) one array of objects."""
    with open(path, encoding="utf-8") as fh:
        head = fh.read(4096).lstrip()
    if head.startswith("["):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise InputError(f"not valid JSON: {exc.msg}", path=path, line=exc.lineno) from None
        if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
            raise InputError("expected a JSON array of objects", path=path)
        for i, row in enumerate(data):
            _check_columns(path, list(row), row=i)
        return data
    rows = []
    with open(path, encoding="utf-8") as fh:
        for line_no, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise InputError(f"not valid JSON: {exc.msg}", path=path, line=line_no) from None
            if not isinstance(row, dict):
                raise InputError("each line must be a JSON object", path=path, line=line_no)
            _check_columns(path, list(row), line=line_no)
            rows.append(row)
    return rows


def _from_disk(path: Path) -> list[dict[str, Any]]:
    from datasets import DatasetDict, load_from_disk

    ds = load_from_disk(str(path))
    if isinstance(ds, DatasetDict):
        if "test" in ds:
            ds = ds["test"]
        elif len(ds) == 1:
            ds = next(iter(ds.values()))
        else:
            raise InputError(
                f"a DatasetDict with splits {', '.join(ds)} and none named 'test'; "
                "save the split to audit",
                path=path,
            )
    return _from_table(path, ds.data.table)


def load_pairs(path: str | Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Rows of a pairs file and a description of where they came from."""
    path = Path(path)
    if not path.exists():
        raise InputError("no such file or folder", path=path)
    if path.is_dir():
        if (path / "publish" / "all").is_dir():  # a run directory
            path = path / "publish"
        if (path / "all").is_dir():
            return _from_parquet(path / "all"), {"path": str(path), "format": "release"}
        if (path / "dataset_info.json").exists() or (path / "dataset_dict.json").exists():
            return _from_disk(path), {"path": str(path), "format": "save_to_disk"}
        if any(path.glob("*.parquet")):
            return _from_parquet(path), {"path": str(path), "format": "parquet"}
        raise InputError(
            "not a release folder (no 'all' config), a save_to_disk folder or a folder of "
            "parquet files",
            path=path,
        )
    if path.suffix == ".parquet":
        return _from_parquet(path), {"path": str(path), "format": "parquet"}
    if path.suffix in (".jsonl", ".json", ".ndjson"):
        fmt = "json" if path.suffix == ".json" else "jsonl"
        return _from_json(path), {"path": str(path), "format": fmt}
    raise InputError("unknown format: expected .jsonl, .parquet or a folder", path=path)


def _check_texts(rows: list[dict[str, Any]], source: str) -> None:
    for i, r in enumerate(rows):
        for col in REQUIRED_COLUMNS:
            if not isinstance(r.get(col), str):
                raise InputError(
                    f"row {i}: '{col}' must be a string, got {type(r.get(col)).__name__}",
                    path=source,
                    field=col,
                )


# ---- figures ----------------------------------------------------------------------------


def _words(text: str) -> list[str]:
    return _WORD_RE.findall(text.lower())


def _quantile(sorted_vals: list[float], q: float) -> float:
    if not sorted_vals:
        return float("nan")
    pos = (len(sorted_vals) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return sorted_vals[lo] + (sorted_vals[hi] - sorted_vals[lo]) * (pos - lo)


def _describe(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"n": 0, "mean": None, "median": None, "p10": None, "p90": None}
    s = sorted(values)
    return {
        "n": len(s),
        "mean": round(sum(s) / len(s), 4),
        "median": round(_quantile(s, 0.5), 4),
        "p10": round(_quantile(s, 0.1), 4),
        "p90": round(_quantile(s, 0.9), 4),
        "min": round(s[0], 4),
        "max": round(s[-1], 4),
    }


def _histogram(values: list[float], edges: list[float]) -> list[int]:
    counts = [0] * (len(edges) - 1)
    for v in values:
        for i in range(len(counts)):
            last = i == len(counts) - 1
            if edges[i] <= v < edges[i + 1] or (last and v == edges[-1]):
                counts[i] += 1
                break
    return counts


def _share(n: int, d: int) -> float | None:
    return round(n / d, 4) if d else None


def _length_figures(rows: list[dict[str, Any]]) -> dict[str, Any]:
    wc = [len(r["chosen"].split()) for r in rows]
    wr = [len(r["rejected"].split()) for r in rows]
    top = max([*wc, *wr, 1])
    step = max(1, math.ceil(top / 10))
    edges = [float(step * i) for i in range(11)]
    n = len(rows)
    return {
        "chosen_words": _describe(wc),
        "rejected_words": _describe(wr),
        "share_chosen_longer": _share(sum(a > b for a, b in zip(wc, wr, strict=True)), n),
        "share_equal": _share(sum(a == b for a, b in zip(wc, wr, strict=True)), n),
        "share_rejected_longer": _share(sum(a < b for a, b in zip(wc, wr, strict=True)), n),
        "mean_difference": round(sum(a - b for a, b in zip(wc, wr, strict=True)) / n, 4)
        if n
        else None,
        "histogram": {
            "edges": edges,
            "chosen": _histogram(wc, edges),
            "rejected": _histogram(wr, edges),
        },
    }


def _similarity_figures(sims: list[float]) -> dict[str, Any]:
    edges = [float(x) for x in range(0, 101, 10)]
    return {**_describe(sims), "histogram": {"edges": edges, "counts": _histogram(sims, edges)}}


def _quality_figures(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    with_q = [
        r
        for r in rows
        if isinstance(r.get("quality_chosen"), dict) and isinstance(r.get("quality_rejected"), dict)
    ]
    if not with_q:
        return None
    out: dict[str, Any] = {"n": len(with_q), "dimensions": {}}
    for d in DIMENSIONS:
        gaps = [
            r["quality_chosen"][d] - r["quality_rejected"][d]
            for r in with_q
            if r["quality_chosen"].get(d) is not None and r["quality_rejected"].get(d) is not None
        ]
        out["dimensions"][d] = {
            "mean_gap": round(sum(gaps) / len(gaps), 4) if gaps else None,
            "share_chosen_higher": _share(sum(g > 0 for g in gaps), len(gaps)),
            "share_rejected_higher": _share(sum(g < 0 for g in gaps), len(gaps)),
        }
    return out


def _coverage_figures(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    pairs = [
        (r["coverage_chosen_mean"], r["coverage_rejected_mean"])
        for r in rows
        if r.get("coverage_chosen_mean") is not None and r.get("coverage_rejected_mean") is not None
    ]
    if not pairs:
        return None
    c = [a for a, _ in pairs]
    j = [b for _, b in pairs]
    return {
        "n": len(pairs),
        "mean_chosen": round(sum(c) / len(c), 4),
        "mean_rejected": round(sum(j) / len(j), 4),
        "mean_gap": round(sum(a - b for a, b in pairs) / len(pairs), 4),
    }


def _blind_verdicts(rows: list[dict[str, Any]], judge: Judge | None) -> list[list[str | None]]:
    """Per pair, the side each A/B order of the rubric-blind judge preferred."""
    if judge is not None:
        out = []
        for r in rows:
            ab = judge(r["question"], r["chosen"], r["rejected"])
            ba = judge(r["question"], r["rejected"], r["chosen"])
            out.append(
                [
                    {"A": "chosen", "B": "rejected"}.get(ab, "tie"),
                    {"A": "rejected", "B": "chosen"}.get(ba, "tie"),
                ]
            )
        return out
    return [
        [r["pairwise_blind"].get("AB"), r["pairwise_blind"].get("BA")]
        if isinstance(r.get("pairwise_blind"), dict)
        else []
        for r in rows
    ]


def _leakage_figures(per_pair: list[list[str | None]], source: str) -> dict[str, Any] | None:
    votes = [v for pair in per_pair for v in pair if v is not None]
    if not votes:
        return None
    c = Counter(votes)
    judged = [p for p in per_pair if any(v is not None for v in p)]
    return {
        "source": source,
        "verdicts": len(votes),
        "pairs": len(judged),
        "share_prefers_chosen": _share(c["chosen"], len(votes)),
        "share_prefers_rejected": _share(c["rejected"], len(votes)),
        "share_tie": _share(c["tie"], len(votes)),
        "share_pairs_chosen_both_orders": _share(
            sum(p.count("chosen") == 2 for p in judged), len(judged)
        ),
    }


def _agreement_figures(rows: list[dict[str, Any]], path: Path) -> dict[str, Any] | None:
    out: dict[str, Any] = {}
    if any("human_verdict" in r for r in rows):
        verdicts = Counter(str(r.get("human_verdict")) for r in rows)
        shares = [r["human_agreement"] for r in rows if r.get("human_agreement") is not None]
        out["annotated_pairs"] = sum(n for k, n in verdicts.items() if k != "None")
        out["verdicts"] = {("not annotated" if k == "None" else k): n for k, n in verdicts.items()}
        out["mean_vote_share"] = round(sum(shares) / len(shares), 4) if shares else None
    release = path / "release.json" if path.is_dir() else None
    if release is not None and release.exists():
        rounds = json.loads(release.read_text(encoding="utf-8")).get("agreement") or {}
        if rounds:
            out["rounds"] = rounds
    if not out or (not out.get("annotated_pairs") and not out.get("rounds")):
        return None
    return out


# ---- shortcut probe ---------------------------------------------------------------------


def surface_features(question: str, answer: str) -> list[float]:
    """Cheap features of one answer, in the order of ``PROBE_FEATURES``."""
    words = _words(answer)
    q = set(_words(question))
    return [
        float(len(answer.split())),
        float(len(answer)),
        sum(w in q for w in words) / len(words) if words else 0.0,
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


def _fit(x: Any, y: Any) -> tuple[Any, Any]:
    """Logistic regression without intercept on features scaled to unit spread; returns
    the weights for unscaled features and the standardised weights."""
    import numpy as np
    from sklearn import config_context
    from sklearn.linear_model import LogisticRegression

    scale = x.std(axis=0)
    scale[scale == 0] = 1.0
    # no intercept: on mirrored data the decision must flip with the sign of the input
    with config_context(assume_finite=True, skip_parameter_validation=True):
        clf = LogisticRegression(fit_intercept=False, max_iter=1000).fit(x / scale, y)
    return np.asarray(clf.coef_[0]) / scale, np.asarray(clf.coef_[0])


def _cv_auc(diff: Any, seed: int) -> tuple[list[float], list[float], list[float]]:
    """Per-fold AUCs and the out-of-fold labels and scores of the symmetrised probe."""
    import numpy as np
    from sklearn.model_selection import KFold

    def expand(idx: Any) -> tuple[Any, Any]:
        # each pair gives (chosen - rejected, 1) and (rejected - chosen, 0): both rows of a
        # pair always sit in the same fold, so the probe never sees the mirror of a test row
        x = np.concatenate([diff[idx], -diff[idx]])
        y = np.concatenate([np.ones(len(idx)), np.zeros(len(idx))])
        return x, y

    folds = KFold(n_splits=PROBE_FOLDS, shuffle=True, random_state=seed)
    fold_aucs: list[float] = []
    oof_y: list[float] = []
    oof_p: list[float] = []
    for train, test in folds.split(np.arange(len(diff))):
        w, _ = _fit(*expand(train))
        xte, yte = expand(test)
        score = xte @ w  # the logit; AUC needs only the order
        fold_aucs.append(_auc(yte, score))
        oof_y.extend(yte.tolist())
        oof_p.extend(score.tolist())
    return fold_aucs, oof_y, oof_p


def shortcut_probe(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Cross-validated AUC of a logistic regression telling chosen from rejected by
    surface features, with folds split by pair, and the AUCs it reaches by chance."""
    n = len(rows)
    if n < PROBE_MIN_PAIRS:
        return {"skipped": f"{n} pairs; the probe needs at least {PROBE_MIN_PAIRS}"}
    import numpy as np

    diff = np.array(
        [
            np.subtract(
                surface_features(r["question"], r["chosen"]),
                surface_features(r["question"], r["rejected"]),
            )
            for r in rows
        ]
    )
    fold_aucs, oof_y, oof_p = _cv_auc(diff, PROBE_SEED)
    auc = float(np.mean(fold_aucs))

    # The chance level: the same probe on pairs whose sides were swapped at random. Its
    # spread is wide on small sets (about 0.07 at 150 pairs, 0.04 at 400), so a small set
    # can pass 0.6 by luck; the report shows the band next to the flag.
    rng = np.random.default_rng(PROBE_SEED)
    null = sorted(
        float(np.mean(_cv_auc(diff * rng.choice([-1.0, 1.0], size=(n, 1)), PROBE_SEED + k)[0]))
        for k in range(PROBE_NULL_RUNS)
    )
    null_p95 = null[math.ceil(0.95 * len(null)) - 1]

    x_all = np.concatenate([diff, -diff])
    y_all = np.concatenate([np.ones(n), np.zeros(n)])
    _, std_coefs = _fit(x_all, y_all)
    single = {name: round(_auc(y_all, x_all[:, i]), 4) for i, name in enumerate(PROBE_FEATURES)}
    return {
        "auc": round(auc, 4),
        "fold_aucs": [round(a, 4) for a in fold_aucs],
        "pooled_auc": round(_auc(oof_y, oof_p), 4),
        "flagged": auc > PROBE_FLAG_AUC,
        "threshold": PROBE_FLAG_AUC,
        "chance_auc_mean": round(float(np.mean(null)), 4),
        "chance_auc_p95": round(null_p95, 4),
        "above_chance": auc > null_p95,
        "folds": PROBE_FOLDS,
        "seed": PROBE_SEED,
        "pairs": n,
        "features": list(PROBE_FEATURES),
        # standardised coefficients: positive means the chosen side has more of it
        "coefficients": {
            k: round(float(c), 4) for k, c in zip(PROBE_FEATURES, std_coefs, strict=True)
        },
        "single_feature_auc": single,
    }


# ---- report -----------------------------------------------------------------------------


def _per_category(
    rows: list[dict[str, Any]], sims: list[float], blind: list[list[str | None]]
) -> dict[str, Any]:
    groups: dict[str, list[int]] = {}
    for i, r in enumerate(rows):
        groups.setdefault(str(r.get("category")), []).append(i)
    out = {}
    for cat, idx in sorted(groups.items()):
        sub = [rows[i] for i in idx]
        length = _length_figures(sub)
        leak = _leakage_figures([blind[i] for i in idx], "")
        out[cat] = {
            "pairs": len(idx),
            "mean_words_chosen": length["chosen_words"]["mean"],
            "mean_words_rejected": length["rejected_words"]["mean"],
            "share_chosen_longer": length["share_chosen_longer"],
            "mean_similarity": round(sum(sims[i] for i in idx) / len(idx), 4),
            "blind_prefers_chosen": leak["share_prefers_chosen"] if leak else None,
        }
    return out


def _clean(obj: Any) -> Any:
    """NaN and infinities become None so the JSON stays valid."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_clean(v) for v in obj]
    return obj


def compute_figures(
    rows: list[dict[str, Any]], source: dict[str, Any], judge: Judge | None = None
) -> dict[str, Any]:
    """Every figure of the audit, as a JSON-serialisable dict."""
    from pipeline.filters import word_similarity

    _check_texts(rows, source["path"])
    if not rows:
        raise InputError("no rows to audit", path=source["path"])
    sims = [round(word_similarity(r["chosen"], r["rejected"]), 2) for r in rows]
    blind = _blind_verdicts(rows, judge)
    probe = shortcut_probe(rows)
    flags = []
    if probe.get("flagged"):
        chance = (
            ""
            if probe["above_chance"]
            else f" (but within chance at {probe['pairs']} pairs: 95% of side-swapped runs "
            f"reach {probe['chance_auc_p95']:.3f})"
        )
        flags.append(
            f"shortcut probe AUC {probe['auc']:.3f} > {PROBE_FLAG_AUC}: surface features "
            f"tell the chosen answer apart; the benchmark may reward style, not preference" + chance
        )
    figures = {
        "source": {**source, "rows": len(rows)},
        "n_pairs": len(rows),
        "length": _length_figures(rows),
        "similarity": _similarity_figures(sims),
        "quality_gap": _quality_figures(rows),
        "coverage_gap": _coverage_figures(rows),
        "leakage": _leakage_figures(
            blind, "judge callable" if judge is not None else "pairwise_blind column"
        ),
        "per_category": _per_category(rows, sims, blind),
        "agreement": _agreement_figures(rows, Path(source["path"])),
        "shortcut_probe": probe,
        "flags": flags,
    }
    return _clean(figures)


def _default_out(path: Path) -> Path:
    if path.is_dir() and (path / "publish" / "all").is_dir():
        return path / "report"
    if path.is_dir() and (path.parent / "run.yaml").exists():
        return path.parent / "report"  # a run's release: the run's report folder
    return path.with_name(f"{path.stem if path.is_file() else path.name}-audit")


def audit(
    path: str | Path, out_dir: str | Path | None = None, judge: Judge | None = None
) -> dict[str, Any]:
    """Audit a pairs file; write ``audit.html`` and ``audit.json`` under ``out_dir``.

    ``judge`` is an optional rubric-blind judge used for the leakage figure on sets that
    carry no judge columns. Returns the figures, plus ``outputs`` with the two paths.
    """
    path = Path(path)
    rows, source = load_pairs(path)
    figures = compute_figures(rows, source, judge)
    out = Path(out_dir) if out_dir is not None else _default_out(path)
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / "audit.json", figures)
    write_text_atomic(out / "audit.html", render_html(figures))
    return {
        **figures,
        "outputs": {"html": str(out / "audit.html"), "json": str(out / "audit.json")},
    }


# ---- HTML and SVG -----------------------------------------------------------------------

_COLORS = ("#2b6cb0", "#c05621", "#2f855a", "#6b46c1")


def svg_bars(
    title: str, labels: list[str], series: dict[str, list[float]], y_max: float | None = None
) -> str:
    """A grouped bar chart as inline SVG (no script, no external reference)."""
    width, height, left, bottom, top = 640, 260, 48, 56, 28
    plot_w, plot_h = width - left - 16, height - bottom - top
    vals = [v for s in series.values() for v in s if v is not None]
    y_max = y_max if y_max is not None else max([*vals, 1e-9])
    n_groups, n_series = max(len(labels), 1), max(len(series), 1)
    group_w = plot_w / n_groups
    bar_w = group_w * 0.8 / n_series
    e = html.escape
    parts = [
        f'<svg width="{width}" height="{height}" role="img" aria-label="{e(title)}">',
        f'<text x="{width / 2}" y="16" text-anchor="middle" font-size="13">{e(title)}</text>',
        f'<line x1="{left}" y1="{top + plot_h}" x2="{left + plot_w}" y2="{top + plot_h}" '
        'stroke="#333"/>',
        f'<text x="{left - 6}" y="{top + 4}" text-anchor="end" font-size="10">{y_max:.3g}</text>',
        f'<text x="{left - 6}" y="{top + plot_h}" text-anchor="end" font-size="10">0</text>',
    ]
    for si, (name, values) in enumerate(series.items()):
        color = _COLORS[si % len(_COLORS)]
        for gi, v in enumerate(values):
            v = v or 0.0
            h = plot_h * min(max(v, 0.0) / y_max, 1.0)
            x = left + gi * group_w + group_w * 0.1 + si * bar_w
            parts.append(
                f'<rect x="{x:.1f}" y="{top + plot_h - h:.1f}" width="{bar_w:.1f}" '
                f'height="{h:.1f}" fill="{color}"><title>{e(name)} {e(labels[gi])}: '
                f"{v:.4g}</title></rect>"
            )
        parts.append(
            f'<rect x="{left + si * 130}" y="{height - 14}" width="10" height="10" '
            f'fill="{color}"/><text x="{left + si * 130 + 14}" y="{height - 5}" '
            f'font-size="11">{e(name)}</text>'
        )
    step = max(1, math.ceil(n_groups / 12))  # keep axis labels from overlapping
    for gi, label in enumerate(labels):
        if gi % step == 0:
            x = left + gi * group_w + group_w / 2
            parts.append(
                f'<text x="{x:.1f}" y="{top + plot_h + 14}" text-anchor="middle" '
                f'font-size="10">{e(label[:18])}</text>'
            )
    parts.append("</svg>")
    return "".join(parts)


def _fmt(v: Any) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def _table(rows: list[tuple[str, Any]]) -> str:
    body = "".join(
        f"<tr><th>{html.escape(k)}</th><td>{html.escape(_fmt(v))}</td></tr>" for k, v in rows
    )
    return f"<table>{body}</table>"


def _edge_labels(edges: list[float]) -> list[str]:
    return [f"{edges[i]:g}-{edges[i + 1]:g}" for i in range(len(edges) - 1)]


def render_html(fig: dict[str, Any]) -> str:
    """The report page: tables, inline SVG plots and the figures as embedded JSON."""
    e = html.escape
    ln, sim, probe = fig["length"], fig["similarity"], fig["shortcut_probe"]
    sections = []
    flags = "".join(f'<p class="flag">{e(f)}</p>' for f in fig["flags"]) or (
        '<p class="ok">No shortcut flagged.</p>'
    )
    sections.append(f"<h2>Summary</h2>{flags}")
    sections.append(
        "<h2>Length</h2>"
        + _table(
            [
                ("pairs", fig["n_pairs"]),
                ("mean words, chosen", ln["chosen_words"]["mean"]),
                ("mean words, rejected", ln["rejected_words"]["mean"]),
                ("share of pairs where the chosen is longer", ln["share_chosen_longer"]),
                ("share of equal length", ln["share_equal"]),
                ("mean difference (chosen - rejected)", ln["mean_difference"]),
            ]
        )
        + svg_bars(
            "Word counts",
            _edge_labels(ln["histogram"]["edges"]),
            {"chosen": ln["histogram"]["chosen"], "rejected": ln["histogram"]["rejected"]},
        )
    )
    sections.append(
        "<h2>Similarity (word-level, 0-100)</h2>"
        + _table([(k, sim.get(k)) for k in ("mean", "median", "p10", "p90", "min", "max")])
        + svg_bars(
            "Chosen vs rejected similarity",
            _edge_labels(sim["histogram"]["edges"]),
            {"pairs": sim["histogram"]["counts"]},
        )
    )
    if fig["quality_gap"]:
        q = fig["quality_gap"]["dimensions"]
        sections.append(
            "<h2>Quality gap (rubric-blind judge, chosen - rejected)</h2>"
            + _table(
                [(f"{d}: mean gap", q[d]["mean_gap"]) for d in q]
                + [(f"{d}: chosen higher", q[d]["share_chosen_higher"]) for d in q]
            )
        )
    if fig["coverage_gap"]:
        c = fig["coverage_gap"]
        sections.append(
            "<h2>Coverage gap (rubric-aware judge, 0-2)</h2>"
            + _table([(k, c[k]) for k in ("mean_chosen", "mean_rejected", "mean_gap")])
        )
    if fig["leakage"]:
        lk = fig["leakage"]
        sections.append(
            "<h2>Rubric-blind leakage</h2><p>How often a judge that does not see the rubric "
            "already prefers the chosen answer: general quality, not personal fit.</p>"
            + _table([(k, v) for k, v in lk.items()])
        )
    cats = fig["per_category"]
    if cats:
        head = (
            "<tr><th>category</th><th>pairs</th><th>words chosen</th><th>words rejected</th>"
            "<th>chosen longer</th><th>similarity</th><th>blind prefers chosen</th></tr>"
        )
        body = "".join(
            "<tr>" + "".join(f"<td>{e(_fmt(v))}</td>" for v in (cat, *c.values())) + "</tr>"
            for cat, c in cats.items()
        )
        sections.append(
            f"<h2>Per category</h2><table>{head}{body}</table>"
            + svg_bars(
                "Share of pairs where the chosen is longer",
                list(cats),
                {"chosen longer": [c["share_chosen_longer"] or 0.0 for c in cats.values()]},
                y_max=1.0,
            )
        )
    if fig["agreement"]:
        a = fig["agreement"]
        sections.append(
            "<h2>Human agreement</h2>"
            + _table([(k, v) for k, v in a.items() if not isinstance(v, dict)])
            + "".join(
                f"<h3>{e(rnd)}</h3>"
                + _table([(k, v) for k, v in r.items() if not isinstance(v, dict)])
                for rnd, r in (a.get("rounds") or {}).items()
            )
        )
    if "auc" in probe:
        sections.append(
            "<h2>Shortcut probe</h2><p>Logistic regression on surface features of "
            "(chosen - rejected), symmetrised, "
            f"{probe['folds']}-fold cross-validation split by pair (seed {probe['seed']}). "
            f"Flagged above AUC {probe['threshold']}.</p>"
            + _table(
                [
                    ("AUC (mean over folds)", probe["auc"]),
                    ("AUC (pooled out-of-fold)", probe["pooled_auc"]),
                    ("flagged", probe["flagged"]),
                    ("chance AUC, mean of side-swapped runs", probe["chance_auc_mean"]),
                    ("chance AUC, 95th percentile", probe["chance_auc_p95"]),
                    ("above chance", probe["above_chance"]),
                ]
            )
            + svg_bars(
                "Single-feature AUC (0.5 = no signal)",
                probe["features"],
                {"AUC": [probe["single_feature_auc"][k] for k in probe["features"]]},
                y_max=1.0,
            )
        )
    else:
        sections.append(f"<h2>Shortcut probe</h2><p>Skipped: {e(probe['skipped'])}</p>")
    # the figures ride along as data; "</" is escaped so no text can close the script tag
    data = json.dumps(fig, sort_keys=True, ensure_ascii=False).replace("</", "<\\/")
    style = (
        "body{font-family:sans-serif;max-width:900px;margin:2em auto;color:#222}"
        "table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ccc;"
        "padding:2px 8px;text-align:left}.flag{color:#9b2c2c;font-weight:bold}.ok{color:#276749}"
    )
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        f"<title>Audit: {e(fig['source']['path'])}</title><style>{style}</style></head><body>"
        f"<h1>Pair audit</h1><p>{e(fig['source']['path'])} ({e(fig['source']['format'])}, "
        f"{fig['n_pairs']} pairs)</p>"
        + "".join(sections)
        + f'<script type="application/json" id="figures">{data}</script></body></html>'
    )
