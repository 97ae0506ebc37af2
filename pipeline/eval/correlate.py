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

from pipeline.errors import InputError

MODEL, SUBSET, ACCURACY = "model", "subset", "accuracy"
OVERALL = "overall"  # the mean over subsets; reserved as a subset name
ALL = "all"  # the one group of a table without a subset column
MIN_MODELS = 3
_CELLS = 4_000_000  # resamples x models x models per batch of the rank computation


def average_ranks(a: np.ndarray) -> np.ndarray:
    """Ranks along the last axis, from 1, ties given the mean of the ranks they span:
    a value's rank is the number of values below it plus (the number equal to it, itself
    included, + 1) / 2."""
    a = np.asarray(a, dtype=float)
    below = (a[..., None, :] < a[..., :, None]).sum(axis=-1)
    equal = (a[..., None, :] == a[..., :, None]).sum(axis=-1)
    return below + (equal + 1) / 2.0


def _pearson_rows(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Pearson's r of each row of x with the same row of y; NaN where a row is constant."""
    xc = x - x.mean(axis=-1, keepdims=True)
    yc = y - y.mean(axis=-1, keepdims=True)
    sxx = (xc * xc).sum(axis=-1)
    syy = (yc * yc).sum(axis=-1)
    sxy = (xc * yc).sum(axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        r = sxy / np.sqrt(sxx * syy)
    r = np.where((sxx > 0) & (syy > 0), r, np.nan)
    return np.clip(r, -1.0, 1.0)


def spearman_rows(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Spearman's rho of each row of x with the same row of y (average ranks for ties);
    NaN where either row is constant."""
    return _pearson_rows(average_ranks(x), average_ranks(y))


def spearman(x: Sequence[float], y: Sequence[float]) -> float | None:
    """Spearman's rho of two equally long sequences; None when either is constant."""
    r = float(spearman_rows(np.asarray([x], dtype=float), np.asarray([y], dtype=float))[0])
    return None if math.isnan(r) else r


def bootstrap_spearman(
    x: Sequence[float], y: Sequence[float], n_boot: int, seed: int
) -> tuple[list[float] | None, int]:
    """The 95% percentile interval of rho over models resampled with replacement, and how
    many resamples left rho undefined (the module's docstring gives the exact draw)."""
    xv = np.asarray(x, dtype=float)
    yv = np.asarray(y, dtype=float)
    n = len(xv)
    idx = np.random.default_rng(seed).integers(0, n, size=(n_boot, n))
    rows = max(1, _CELLS // (n * n))
    rhos = np.concatenate(
        [
            spearman_rows(xv[idx[i : i + rows]], yv[idx[i : i + rows]])
            for i in range(0, n_boot, rows)
        ]
    )
    defined = rhos[~np.isnan(rhos)]
    undefined = int(n_boot - len(defined))
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


def read_table(path: str | Path) -> Table:
    """Read and check a correlate table (the module's docstring gives its format)."""
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
    downstream = [n for n in names if n not in (MODEL, SUBSET, ACCURACY)]
    if not downstream:
        raise InputError(
            "has no downstream score column: add one (e.g. bon, ppo) beside model and accuracy",
            path=p,
            line=head_line,
        )
    has_subsets = SUBSET in names
    table = Table(p, hashlib.sha256(raw).hexdigest(), downstream, has_subsets)
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
        scores = {d: _number(row[d], p, line, d, required=False) for d in downstream}
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
        for d in table.downstream:
            vals = [v for s in subsets if (v := table.rows[s][m][1][d]) is not None]
            scores[d] = sum(vals) / len(vals) if len(vals) == len(subsets) else None
        out[m] = (sum(accs) / len(accs), scores)
    return out, left_out


def _one(
    group: str,
    rows: dict[str, tuple[float, dict[str, float | None]]],
    column: str,
    n_boot: int,
    seed: int,
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
            note=f"{len(models)} model(s) with a {column} score; needs {MIN_MODELS}",
        )
        return out
    rho = spearman(x, y)
    ci, undefined = bootstrap_spearman(x, y, n_boot, seed)
    out.update(
        spearman=None if rho is None else round(rho, 4),
        ci95=ci,
        undefined_resamples=undefined,
        model_names=models,
    )
    if rho is None:
        out["note"] = "undefined: accuracy or the score is the same for every model"
    return out


def correlate(path: str | Path, n_boot: int = 1000, seed: int = 0) -> dict[str, Any]:
    """Read the table at ``path`` and compute every correlation (the JSON ``--out`` writes)."""
    if n_boot < 1:
        raise InputError("must be at least 1", path="--bootstrap")
    table = read_table(path)
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
        _one(g, rows, d, n_boot, seed) for g, rows in groups.items() for d in table.downstream
    ]
    return {
        "table": str(table.path),
        "table_sha256": table.sha256,
        "models": len({m for rows in table.rows.values() for m in rows}),
        "subsets": list(table.rows) if table.has_subsets else [],
        "downstream": table.downstream,
        "statistic": "Spearman's rank correlation (average ranks for ties) between accuracy "
        "and each downstream score, across models",
        "overall": "per model, the mean over the subsets of accuracy and of each score"
        if OVERALL in groups
        else None,
        "bootstrap": {
            "resamples": n_boot,
            "seed": seed,
            "interval": "95% percentile, models resampled with replacement; "
            "numpy.random.default_rng(seed).integers(0, n, (resamples, n)) per correlation",
        },
        "correlations": results,
        "notes": notes,
    }


def format_table(res: dict[str, Any]) -> str:
    """The correlations as a short text table."""
    lines = [f"{'subset':24s} {'downstream':16s} {'models':>6s} {'spearman':>8s}  95% CI"]
    for r in res["correlations"]:
        rho = "-" if r["spearman"] is None else f"{r['spearman']:+.3f}"
        ci = "-" if r["ci95"] is None else f"[{r['ci95'][0]:+.3f}, {r['ci95'][1]:+.3f}]"
        line = (
            f"{r['subset'][:24]:24s} {r['downstream'][:16]:16s} {r['models']:>6d} {rho:>8s}  {ci}"
        )
        if r.get("undefined_resamples"):
            line += f"  ({r['undefined_resamples']} resamples undefined)"
        if r.get("note"):
            line += f"  {r['note']}"
        lines.append(line)
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
