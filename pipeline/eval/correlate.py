"""``prb eval correlate TABLE.csv``: does a split's accuracy predict downstream results?

The user brings a CSV of reward models with their accuracy on the split and their scores in
downstream uses (best-of-N, PPO, ...), one row per model, or per model and subset::

    model,subset,accuracy,bon,ppo
    rm-a,Art,0.71,7.9,6.2
    rm-a,Lifestyle,0.64,7.1,
    ...

``model`` and ``accuracy`` are required; ``subset`` is optional; every other column is a
downstream score (higher is better), numeric, or empty where the model has none (that model
is then left out of that column's correlations). For each subset and each downstream column
this reports Spearman's rank correlation between accuracy and the score across models, and
with two subsets or more an ``overall`` row: per model, the mean over the subsets of its
accuracy and of its score (a model without a row or a score for every subset is left out).
Without a ``subset`` column the one group is ``all``.

Spearman's rho is Pearson's correlation of the ranks, ties given their average rank (as
``scipy.stats.spearmanr``); it is undefined (None) when either side is constant. The 95%
interval is a percentile bootstrap over models: for a correlation over ``n`` models,
``numpy.random.default_rng(seed).integers(0, n, (n_boot, n))`` draws the resamples (a fresh
generator for every correlation, so a figure does not depend on the table's other columns),
rho is computed on each, resamples where it is undefined (all models drawn tie on one side)
are left out and counted, and the interval is the 2.5th and 97.5th percentiles of the rest
(numpy's default linear interpolation).

Beside rho, the same correlation is measured with the rank metrics the reference reports
(``pipeline.eval.rankmetrics`` defines each): weighted Kendall tau, NDCG and RBO (its
persistence ``p``, 0.9 by default, is stated in the output), each with the same bootstrap
interval, one draw of resamples shared by the four metrics. With ``baseline`` (``--baseline
COLUMN``), that column holds another benchmark's accuracy of the same models (RewardBench's,
say): it is not a downstream score, and each metric is also computed for it, with this
benchmark's figure minus the baseline's and a paired bootstrap interval of the difference
(every resample of models scores both benchmarks), over the models that have both.

Bad input (a missing column, a value that is not a number, a repeated model, fewer than 3
models) is one line naming the file, the line and the column.
"""

from __future__ import annotations

import csv
import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.core.errors import InputError
from pipeline.eval.rankmetrics import (
    DEFAULT_RBO_P,
    LABELS,
    METRICS,
    average_ranks,
    metric_rows,
    spearman_rows,
)

__all__ = ["average_ranks", "bootstrap_spearman", "correlate", "read_table", "spearman"]

MODEL, SUBSET, ACCURACY = "model", "subset", "accuracy"
OVERALL = "overall"  # the mean over subsets; reserved as a subset name
ALL = "all"  # the one group of a table without a subset column
MIN_MODELS = 3
_CELLS = 4_000_000  # resamples x models x models per batch of the rank computation


def spearman(x: Sequence[float], y: Sequence[float]) -> float | None:
    """Spearman's rho of two equally long sequences; None when either is constant."""
    r = float(spearman_rows(np.asarray([x], dtype=float), np.asarray([y], dtype=float))[0])
    return None if math.isnan(r) else r


def bootstrap_spearman(
    x: Sequence[float], y: Sequence[float], n_boot: int, seed: int
) -> tuple[list[float] | None, int]:
    """The 95% percentile interval of rho over models resampled with replacement, and how
    many resamples left rho undefined (the module's docstring gives the exact draw)."""
    idx = _draw(len(x), n_boot, seed)
    return _interval(_resampled("spearman", x, y, idx, DEFAULT_RBO_P))


def _draw(n: int, n_boot: int, seed: int) -> np.ndarray:
    """The documented resamples of ``n`` models: a fresh generator per correlation."""
    return np.random.default_rng(seed).integers(0, n, size=(n_boot, n))


def _resampled(
    metric: str, x: Sequence[float], y: Sequence[float], idx: np.ndarray, rbo_p: float
) -> np.ndarray:
    """The metric on every resample (a row of ``idx``), in batches that bound memory."""
    xv = np.asarray(x, dtype=float)
    yv = np.asarray(y, dtype=float)
    n_boot, n = idx.shape
    rows = max(1, _CELLS // (n * n))
    return np.concatenate(
        [
            metric_rows(metric, xv[idx[i : i + rows]], yv[idx[i : i + rows]], rbo_p)
            for i in range(0, n_boot, rows)
        ]
    )


def _interval(values: np.ndarray) -> tuple[list[float] | None, int]:
    """The 2.5th and 97.5th percentiles of the defined values, and how many were not."""
    defined = values[~np.isnan(values)]
    undefined = int(len(values) - len(defined))
    if len(defined) == 0:
        return None, undefined
    lo, hi = np.quantile(defined, [0.025, 0.975])
    return [round(float(lo), 4), round(float(hi), 4)], undefined


@dataclass
class Table:
    """A correlate table, read and checked: per subset, per model, accuracy and scores."""

    path: Path
    sha256: str
    downstream: list[str]
    has_subsets: bool
    baseline: str | None = None  # a column holding another benchmark's accuracy
    # subset -> model -> (accuracy, {downstream column: score or None})
    rows: dict[str, dict[str, tuple[float, dict[str, float | None]]]] = field(default_factory=dict)


def _number(raw: str, path: Path, line: int, column: str, *, required: bool) -> float | None:
    text = raw.strip()
    if not text:
        if required:
            raise InputError("is empty; every row needs its accuracy", path=path, line=line,
                             field=column)  # fmt: skip
        return None
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise InputError(f"{text!r} is not a finite number", path=path, line=line, field=column)
    return value


def read_table(path: str | Path, baseline: str | None = None) -> Table:
    """Read and check a correlate table (the module's docstring gives its format);
    ``baseline``: the column that holds another benchmark's accuracy (not a downstream
    score), as ``--baseline`` names it."""
    p = Path(path).expanduser()
    try:
        raw = p.read_bytes()
    except IsADirectoryError:
        raise InputError("is a folder; give the CSV file", path=p) from None
    except OSError as exc:
        raise InputError(f"cannot be read ({exc.strerror or exc})", path=p) from None
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise InputError("is not UTF-8 text; save it as UTF-8", path=p, line=line) from None
    reader = csv.reader(text.splitlines())
    header = next(reader, None)
    while header is not None and not any(c.strip() for c in header):
        header = next(reader, None)
    if header is None:
        raise InputError(
            "is empty; give a header line such as model,subset,accuracy,bon", path=p, line=1
        )
    head_line = reader.line_num
    names = [c.strip() for c in header]
    for i, name in enumerate(names):
        if not name:
            raise InputError(f"column {i + 1} has no name", path=p, line=head_line)
        if name in names[:i]:
            raise InputError("is a repeated column name", path=p, line=head_line, field=name)
    for need in (MODEL, ACCURACY):
        if need not in names:
            raise InputError(
                f"has no '{need}' column (columns: {', '.join(names)}); the header needs "
                "model, accuracy and one downstream score column or more",
                path=p,
                line=head_line,
                field=need,
            )
    if baseline is not None and baseline not in names:
        raise InputError(
            f"has no '{baseline}' column for --baseline (columns: {', '.join(names)})",
            path=p,
            line=head_line,
            field=baseline,
        )
    if baseline in (MODEL, SUBSET, ACCURACY):
        raise InputError(
            f"--baseline names another benchmark's accuracy column, not '{baseline}'",
            path=p,
            line=head_line,
            field=baseline,
        )
    downstream = [n for n in names if n not in (MODEL, SUBSET, ACCURACY, baseline)]
    if not downstream:
        raise InputError(
            "has no downstream score column: add one (e.g. bon, ppo) beside model and accuracy",
            path=p,
            line=head_line,
        )
    has_subsets = SUBSET in names
    table = Table(p, hashlib.sha256(raw).hexdigest(), downstream, has_subsets, baseline)
    read_columns = downstream + ([baseline] if baseline else [])
    first_line: dict[tuple[str, str], int] = {}
    subset_line: dict[str, int] = {}
    for cells in reader:
        line = reader.line_num
        if not any(c.strip() for c in cells):
            continue
        if len(cells) != len(names):
            raise InputError(
                f"has {len(cells)} cells where the header has {len(names)} columns",
                path=p,
                line=line,
            )
        row = dict(zip(names, cells, strict=True))
        model = row[MODEL].strip()
        if not model:
            raise InputError("is empty; every row names its model", path=p, line=line,
                             field=MODEL)  # fmt: skip
        subset = row[SUBSET].strip() if has_subsets else ALL
        if has_subsets and not subset:
            raise InputError("is empty; every row names its subset", path=p, line=line,
                             field=SUBSET)  # fmt: skip
        if has_subsets and subset == OVERALL:
            raise InputError(
                f"'{OVERALL}' is the mean over the subsets, computed here; leave its rows "
                "out (for a pooled figure, give a table without a subset column)",
                path=p,
                line=line,
                field=SUBSET,
            )
        if (subset, model) in first_line:
            where = f" in subset {subset!r}" if has_subsets else ""
            raise InputError(
                f"model {model!r}{where} is already on line {first_line[(subset, model)]}; "
                "give each model one row" + (" per subset" if has_subsets else ""),
                path=p,
                line=line,
                field=MODEL,
            )
        first_line[(subset, model)] = line
        subset_line.setdefault(subset, line)
        acc = _number(row[ACCURACY], p, line, ACCURACY, required=True)
        assert acc is not None
        scores = {d: _number(row[d], p, line, d, required=False) for d in read_columns}
        table.rows.setdefault(subset, {})[model] = (acc, scores)
    if not table.rows:
        raise InputError("has a header but no rows", path=p)
    for subset, models in table.rows.items():
        if len(models) < MIN_MODELS:
            where = f"subset {subset!r} has" if has_subsets else "the table has"
            raise InputError(
                f"{where} {len(models)} model(s) (from this line); a rank correlation needs "
                f"at least {MIN_MODELS}",
                path=p,
                line=subset_line[subset],
                field=SUBSET if has_subsets else MODEL,
            )
    return table


def _overall(table: Table) -> tuple[dict[str, tuple[float, dict[str, float | None]]], list[str]]:
    """Per model, the mean over every subset of its accuracy and of each score (None where
    a subset lacks the score); models without a row in every subset are left out (named)."""
    subsets = list(table.rows)
    models = list(dict.fromkeys(m for rows in table.rows.values() for m in rows))
    out: dict[str, tuple[float, dict[str, float | None]]] = {}
    left_out = []
    for m in models:
        if any(m not in table.rows[s] for s in subsets):
            left_out.append(m)
            continue
        accs = [table.rows[s][m][0] for s in subsets]
        scores: dict[str, float | None] = {}
        for d in table.downstream + ([table.baseline] if table.baseline else []):
            vals = [v for s in subsets if (v := table.rows[s][m][1][d]) is not None]
            scores[d] = sum(vals) / len(vals) if len(vals) == len(subsets) else None
        out[m] = (sum(accs) / len(accs), scores)
    return out, left_out


def _figures(
    x: list[float], y: list[float], n_boot: int, seed: int, rbo_p: float
) -> dict[str, dict[str, Any]]:
    """Every metric of accuracy ``x`` against scores ``y``: its value, 95% interval and the
    resamples where it was undefined; one draw of resamples shared by the metrics."""
    idx = _draw(len(x), n_boot, seed)
    out = {}
    for name in METRICS:
        v = metric_rows(name, np.asarray([x]), np.asarray([y]), rbo_p)[0]
        ci, undefined = _interval(_resampled(name, x, y, idx, rbo_p))
        out[name] = {
            "value": None if math.isnan(v) else float(v),
            "ci95": ci,
            "undefined_resamples": undefined,
        }
    return out


def _difference(
    x: list[float], b: list[float], y: list[float], n_boot: int, seed: int, rbo_p: float
) -> dict[str, dict[str, Any]]:
    """Per metric, this benchmark's figure minus the baseline's on the same models, with a
    paired bootstrap: each resample of models scores both, the difference is taken on it."""
    idx = _draw(len(x), n_boot, seed)
    out = {}
    for name in METRICS:
        ours = metric_rows(name, np.asarray([x]), np.asarray([y]), rbo_p)[0]
        theirs = metric_rows(name, np.asarray([b]), np.asarray([y]), rbo_p)[0]
        diffs = _resampled(name, x, y, idx, rbo_p) - _resampled(name, b, y, idx, rbo_p)
        ci, undefined = _interval(diffs)
        d = ours - theirs
        out[name] = {
            "value": None if math.isnan(d) else float(d),
            "ci95": ci,
            "undefined_resamples": undefined,
        }
    return out


def _one(
    group: str,
    rows: dict[str, tuple[float, dict[str, float | None]]],
    column: str,
    n_boot: int,
    seed: int,
    rbo_p: float = DEFAULT_RBO_P,
    baseline: str | None = None,
) -> dict[str, Any]:
    models, x, y = [], [], []
    for m, (acc, scores) in rows.items():
        score = scores[column]
        if score is not None:
            models.append(m)
            x.append(acc)
            y.append(score)
    out: dict[str, Any] = {"subset": group, "downstream": column, "models": len(models)}
    if len(models) < MIN_MODELS:
        out.update(
            spearman=None,
            ci95=None,
            undefined_resamples=None,
            metrics=None,
            note=f"{len(models)} model(s) with a {column} score; needs {MIN_MODELS}",
        )
        return out
    figures = _figures(x, y, n_boot, seed, rbo_p)
    rho = figures["spearman"]
    out.update(
        spearman=None if rho["value"] is None else round(rho["value"], 4),
        ci95=rho["ci95"],
        undefined_resamples=rho["undefined_resamples"],
        model_names=models,
        metrics=figures,
    )
    if rho["value"] is None:
        out["note"] = "undefined: accuracy or the score is the same for every model"
    if baseline is not None:
        out["baseline"] = _baseline(rows, column, baseline, n_boot, seed, rbo_p)
    return out


def _baseline(
    rows: dict[str, tuple[float, dict[str, float | None]]],
    column: str,
    baseline: str,
    n_boot: int,
    seed: int,
    rbo_p: float,
) -> dict[str, Any]:
    """The baseline benchmark's figures against the same downstream column, and this
    benchmark's minus the baseline's, over the models that have both."""
    models, x, b, y = [], [], [], []
    for m, (acc, scores) in rows.items():
        score, base = scores[column], scores[baseline]
        if score is not None and base is not None:
            models.append(m)
            x.append(acc)
            b.append(base)
            y.append(score)
    out: dict[str, Any] = {"column": baseline, "models": len(models)}
    if len(models) < MIN_MODELS:
        out.update(
            metrics=None,
            difference=None,
            note=f"{len(models)} model(s) with both a {baseline} and a {column} figure; "
            f"needs {MIN_MODELS}",
        )
        return out
    out.update(
        model_names=models,
        metrics=_figures(b, y, n_boot, seed, rbo_p),
        difference=_difference(x, b, y, n_boot, seed, rbo_p),
    )
    return out


def correlate(
    path: str | Path,
    n_boot: int = 1000,
    seed: int = 0,
    rbo_p: float = DEFAULT_RBO_P,
    baseline: str | None = None,
) -> dict[str, Any]:
    """Read the table at ``path`` and compute every correlation (the JSON ``--out`` writes)."""
    if n_boot < 1:
        raise InputError("must be at least 1", path="--bootstrap")
    if not (isinstance(rbo_p, float) and 0.0 < rbo_p < 1.0):
        raise InputError(f"must be between 0 and 1 (exclusive), got {rbo_p}", path="--rbo-p")
    table = read_table(path, baseline)
    groups = dict(table.rows)
    notes = []
    if table.has_subsets and len(table.rows) >= 2:
        overall, left_out = _overall(table)
        if left_out:
            notes.append(f"{OVERALL}: left out {', '.join(left_out)} (no row in every subset)")
        if len(overall) >= MIN_MODELS:
            groups[OVERALL] = overall
        else:
            notes.append(f"{OVERALL}: fewer than {MIN_MODELS} models have every subset")
    results = [
        _one(g, rows, d, n_boot, seed, rbo_p, baseline)
        for g, rows in groups.items()
        for d in table.downstream
    ]
    return {
        "table": str(table.path),
        "table_sha256": table.sha256,
        "models": len({m for rows in table.rows.values() for m in rows}),
        "subsets": list(table.rows) if table.has_subsets else [],
        "downstream": table.downstream,
        "statistic": "Spearman's rank correlation (average ranks for ties) between accuracy "
        "and each downstream score, across models",
        "metrics": {name: LABELS[name] for name in METRICS},
        "rbo_persistence": rbo_p,
        "baseline": table.baseline,
        "overall": "per model, the mean over the subsets of accuracy and of each score"
        if OVERALL in groups
        else None,
        "bootstrap": {
            "resamples": n_boot,
            "seed": seed,
            "interval": "95% percentile, models resampled with replacement; "
            "numpy.random.default_rng(seed).integers(0, n, (resamples, n)) per correlation, "
            "the same resamples for every metric (and, against a baseline, for both "
            "benchmarks: a paired bootstrap of the difference)",
        },
        "correlations": results,
        "notes": notes,
    }


_SHORT = {"spearman": "spearman", "kendall_tau_weighted": "w-tau", "ndcg": "ndcg", "rbo": "rbo"}


def _cell(f: dict[str, Any] | None, signed: bool = True) -> str:
    if not f or f.get("value") is None:
        return f"{'-':>7s} {'':17s}"
    v = f"{f['value']:+.3f}" if signed else f"{f['value']:.3f}"
    ci = f["ci95"]
    band = "" if ci is None else f"[{ci[0]:+.2f}, {ci[1]:+.2f}]"
    return f"{v:>7s} {band:17s}"


def format_table(res: dict[str, Any]) -> str:
    """The correlations as a short text table: each metric with its 95% interval."""
    head = " ".join(f"{_SHORT[m]:>7s} {'95% CI':17s}" for m in METRICS)
    lines = [f"{'subset':20s} {'downstream':14s} {'models':>6s} {head}"]
    for r in res["correlations"]:
        figs = r.get("metrics") or {}
        cells = " ".join(_cell(figs.get(m)) for m in METRICS)
        line = f"{r['subset'][:20]:20s} {r['downstream'][:14]:14s} {r['models']:>6d} {cells}"
        if r.get("undefined_resamples"):
            line += f"  ({r['undefined_resamples']} resamples undefined for rho)"
        if r.get("note"):
            line += f"  {r['note']}"
        lines.append(line.rstrip())
        base = r.get("baseline")
        if base and base.get("difference"):
            diff = " ".join(_cell(base["difference"].get(m)) for m in METRICS)
            lines.append(f"{'':20s} {('- ' + base['column'])[:14]:14s} {base['models']:>6d} {diff}"
                         .rstrip())  # fmt: skip
        elif base and base.get("note"):
            lines.append(f"{'':20s} - {base['column']}: {base['note']}")
    lines.append(f"RBO persistence p = {res['rbo_persistence']:g}; w-tau: weighted Kendall tau")
    if res.get("baseline"):
        lines.append(
            f"- {res['baseline']}: this benchmark's figure minus the one of the baseline "
            f"column {res['baseline']!r}, paired bootstrap over models"
        )
    lines += [f"note: {n}" for n in res["notes"]]
    return "\n".join(lines)


def default_out(path: str | Path) -> Path:
    """Where the JSON goes without ``--out``: ``<table>-correlate.json`` beside the table."""
    p = Path(path)
    return p.with_name(f"{p.stem}-correlate.json")


def written_by_correlate(path: Path) -> bool:
    """Whether the file at ``path`` is a JSON result of ``prb eval correlate`` (which
    ``--out`` may replace): an object with the keys :func:`correlate` writes."""
    import json

    try:
        with open(path, "rb") as fh:
            raw = json.loads(fh.read(64 * 1024 * 1024))
    except (OSError, ValueError, RecursionError):
        return False
    return isinstance(raw, dict) and {"table", "table_sha256", "correlations"} <= raw.keys()
