"""The audit report: one self-contained HTML page (inline SVG plots, the figures embedded as
JSON), and the files written beside it.

Everything a row holds reaches the page through ``html.escape`` (text) or :func:`_json_for_html`
(embedded data, with ``<``, ``>`` and ``&`` written as JSON escapes), so no field, the
category included, can open a tag, close the data script or start a comment.
"""

from __future__ import annotations

import contextlib
import html
import json
import math
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pipeline.audit.probe import FEATURE_NAMES
from pipeline.core.errors import InputError, PipelineError
from pipeline.core.fields import show_cell
from pipeline.rules import audit_checks

_COLORS = ("#2b6cb0", "#c05621", "#2f855a", "#6b46c1")
_E = html.escape


# ---- plots ------------------------------------------------------------------------------


def _axis(v: float, integer: bool = False) -> tuple[float, float]:
    """(axis maximum, tick step): round ticks (1, 2 or 5 times a power of ten), three to
    six intervals, the axis just above the largest value. ``integer``: for counts, the
    step is a whole number (at least 1), so no tick reads 0.5 answers."""
    if v <= 0:
        return (1.0, 1.0) if integer else (1.0, 0.25)
    mag = 10 ** math.floor(math.log10(v / 6))
    for m in (1, 2, 5, 10, 20):
        step = max(m * mag, 1) if integer else m * mag
        if v / step <= 6:
            return step * max(math.ceil(v / step - 1e-9), 1), step
    return v, v / 4  # pragma: no cover - the loop always returns


def _nice_max(v: float) -> float:
    return _axis(v)[0]


def _tick(v: float, percent: bool) -> str:
    if percent:
        return f"{v * 100:.0f}%"
    return f"{v:,.0f}" if v >= 10 or v == int(v) else f"{v:.2g}"


def svg_bars(
    title: str,
    labels: Sequence[str],
    series: dict[str, Sequence[float | None]],
    y_max: float | None = None,
    *,
    x_title: str = "",
    y_title: str = "",
    percent: bool = False,
    integer: bool = False,
) -> str:
    """A grouped vertical bar chart as inline SVG (no script, no external reference),
    with axis titles, y ticks and x labels that fit (rotated when there are many).
    ``integer``: the values are counts, and the y ticks whole numbers. The caller draws
    no chart without data (:func:`_no_chart` says why instead)."""
    width, left, right, plot_h = 720, 64, 16, 204
    top = 50 if len(series) > 1 else 34  # room for the legend under the title
    longest = min(max((len(lb) for lb in labels), default=0), 36)
    many = len(labels) > 8 or longest > 12
    # rotated labels (-35 degrees, about 5.5 px per character) take sin(35) of their length
    bottom = (24 + math.ceil(3.2 * longest) + 26) if many else 62
    height = top + plot_h + bottom
    plot_w = width - left - right
    vals = [v for s in series.values() for v in s if v is not None]
    if y_max is not None:
        axis_max, tick_step = y_max, y_max / 4
    else:
        axis_max, tick_step = _axis(max([*vals, 0.0]), integer)
    n_ticks = round(axis_max / tick_step)
    n_groups, n_series = max(len(labels), 1), max(len(series), 1)
    group_w = plot_w / n_groups
    bar_w = group_w * 0.8 / n_series
    base = top + plot_h
    parts = [
        f'<svg width="{width}" height="{height}" role="img" aria-label="{_E(title)}" '
        f'xmlns="http://www.w3.org/2000/svg">',
        f'<text x="{width / 2}" y="18" text-anchor="middle" font-size="14" '
        f'font-weight="bold">{_E(title)}</text>',
    ]
    for k in range(n_ticks + 1):  # y ticks and grid lines at round values
        tick = tick_step * k
        y = base - plot_h * k / n_ticks
        parts.append(
            f'<line x1="{left}" y1="{y:.1f}" x2="{left + plot_w}" y2="{y:.1f}" '
            f'stroke="{"#333" if k == 0 else "#e2e2e2"}"/>'
            f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end" font-size="11">'
            f"{_E(_tick(tick, percent))}</text>"
        )
    for si, (name, values) in enumerate(series.items()):
        color = _COLORS[si % len(_COLORS)]
        for gi, value in enumerate(values):
            v = value or 0.0
            h = plot_h * min(max(v, 0.0) / axis_max, 1.0) if axis_max else 0.0
            x = left + gi * group_w + group_w * 0.1 + si * bar_w
            shown = f"{v * 100:.1f}%" if percent else f"{v:,.0f}" if integer else f"{v:,.4g}"
            parts.append(
                f'<rect x="{x:.1f}" y="{base - h:.1f}" width="{max(bar_w - 1, 1):.1f}" '
                f'height="{h:.1f}" fill="{color}"><title>{_E(name)}, {_E(labels[gi])}: '
                f"{_E(shown)}</title></rect>"
            )
        if len(series) > 1:
            lx = left + plot_w - 150 * (len(series) - si)
            parts.append(
                f'<rect x="{lx}" y="{top - 20}" width="10" height="10" fill="{color}"/>'
                f'<text x="{lx + 14}" y="{top - 11}" font-size="11">{_E(name)}</text>'
            )
    step = max(1, math.ceil(n_groups / 24))  # keep labels from overlapping
    for gi, label in enumerate(labels):
        if gi % step:
            continue
        x = left + gi * group_w + group_w / 2
        room = 36 if many else 22
        short = label if len(label) <= room else label[: room - 1] + "…"
        if many:
            parts.append(
                f'<text x="{x:.1f}" y="{base + 12}" text-anchor="end" font-size="10" '
                f'transform="rotate(-35 {x:.1f} {base + 12})">{_E(short)}</text>'
            )
        else:
            parts.append(
                f'<text x="{x:.1f}" y="{base + 15}" text-anchor="middle" font-size="11">'
                f"{_E(short)}</text>"
            )
    if x_title:
        parts.append(
            f'<text x="{left + plot_w / 2}" y="{height - 8}" text-anchor="middle" '
            f'font-size="12">{_E(x_title)}</text>'
        )
    if y_title:
        yc = top + plot_h / 2
        parts.append(
            f'<text x="14" y="{yc:.1f}" text-anchor="middle" font-size="12" '
            f'transform="rotate(-90 14 {yc:.1f})">{_E(y_title)}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)


def svg_hbars(
    title: str,
    labels: Sequence[str],
    values: Sequence[float],
    *,
    x_max: float,
    x_title: str,
    reference: float | None = None,
    band: tuple[float, float] | None = None,
    origin: float = 0.0,
    fmt: str = "{:.2f}",
) -> str:
    """Horizontal bars with their labels on the left: for long labels (features, checks).
    Each bar runs from ``origin`` to its value (an AUC's bar from 0.5, so 0.3 and 0.7
    look equally strong). ``reference``: a dashed line; ``band``: a shaded span, and bars
    that end outside it are drawn in the flag colour."""
    left, right, top, row_h = 190, 60, 34, 20
    width = 720
    plot_w = width - left - right
    height = top + row_h * max(len(labels), 1) + 44
    parts = [
        f'<svg width="{width}" height="{height}" role="img" aria-label="{_E(title)}" '
        f'xmlns="http://www.w3.org/2000/svg">',
        f'<text x="{width / 2}" y="18" text-anchor="middle" font-size="14" '
        f'font-weight="bold">{_E(title)}</text>',
    ]
    base = top + row_h * len(labels) + 4
    if band is not None:
        x0, x1 = (left + plot_w * b / x_max for b in band)
        parts.append(
            f'<rect x="{x0:.1f}" y="{top}" width="{x1 - x0:.1f}" height="{base - top}" '
            'fill="#edf2f7"/>'
            + "".join(
                f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{base}" stroke="#975a16"/>'
                for x in (x0, x1)
            )
        )

    def at(v: float) -> float:
        return left + plot_w * min(max(v, 0.0) / x_max, 1.0) if x_max else float(left)

    for i, (label, v) in enumerate(zip(labels, values, strict=True)):
        y = top + i * row_h
        x0, x1 = sorted((at(origin), at(v)))
        short = label if len(label) <= 30 else label[:29] + "…"
        outside = band is not None and not band[0] <= v <= band[1]
        color = "#9b2c2c" if outside else _COLORS[0]
        # the value sits past the bar's end, on the side it grows to (right when there is
        # no room on the left, next to the row's label)
        if round(v, 2) < origin and x0 - left > 34:
            value = f'<text x="{x0 - 4:.1f}" y="{y + 14}" text-anchor="end" font-size="11">'
        else:
            value = f'<text x="{x1 + 4:.1f}" y="{y + 14}" font-size="11">'
        parts.append(
            f'<text x="{left - 8}" y="{y + 14}" text-anchor="end" font-size="12">{_E(short)}'
            f'</text><rect x="{x0:.1f}" y="{y + 3}" width="{x1 - x0:.1f}" '
            f'height="{row_h - 6}" fill="{color}"><title>{_E(label)}: {_E(fmt.format(v))}'
            f"</title></rect>{value}{_E(fmt.format(v))}</text>"
        )
    parts.append(f'<line x1="{left}" y1="{base}" x2="{left + plot_w}" y2="{base}" stroke="#333"/>')
    _, step = _axis(x_max)
    n_ticks = max(round(x_max / step), 1)
    for k in range(n_ticks + 1):
        v = step * k
        x = left + plot_w * v / x_max
        parts.append(
            f'<text x="{x:.1f}" y="{base + 14}" text-anchor="middle" font-size="11">'
            f"{_E(fmt.format(v))}</text>"
        )
    if reference is not None:
        x = left + plot_w * reference / x_max
        parts.append(
            f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{base}" stroke="#9b2c2c" '
            'stroke-dasharray="4 3"/>'
        )
    parts.append(
        f'<text x="{left + plot_w / 2}" y="{height - 6}" text-anchor="middle" font-size="12">'
        f"{_E(x_title)}</text></svg>"
    )
    return "".join(parts)


# ---- tables -----------------------------------------------------------------------------


def _table(rows: Sequence[tuple[str, Any] | tuple[str, Any, bool]]) -> str:
    body = "".join(
        f"<tr><th>{_E(r[0])}</th><td>{_E(show_cell(r[1], len(r) > 2 and bool(r[2])))}</td></tr>"
        for r in rows
    )
    return f"<table>{body}</table>"


def _grid(head: Sequence[str], rows: Sequence[Sequence[Any]], cls: str = "") -> str:
    h = "".join(f"<th>{_E(c)}</th>" for c in head)
    b = "".join("<tr>" + "".join(f"<td>{_E(show_cell(v))}</td>" for v in r) + "</tr>" for r in rows)
    return f'<table class="{cls}"><tr>{h}</tr>{b}</table>'


def _edge_labels(hist: dict[str, Any]) -> list[str]:
    edges = hist["edges"]
    out = [f"{edges[i]:g}–{edges[i + 1]:g}" for i in range(len(edges) - 1)]
    if out and hist.get("open_end"):
        out[-1] = f"{edges[-2]:g}+"  # outliers past the last edge land here
    if out and hist.get("open_start"):
        out[0] = f"< {edges[1]:g}"
    return out


def _json_for_html(obj: Any) -> str:
    """JSON that can sit inside <script type="application/json"> whatever its strings hold:
    '<', '>' and '&' become \\u escapes, so nothing can close the element, open a comment
    or start a tag, and JSON.parse (or json.loads) reads the same data back."""
    text = json.dumps(obj, sort_keys=True, ensure_ascii=False)
    return text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")


# ---- sections ---------------------------------------------------------------------------


def _no_chart(why: str) -> str:
    """What stands where a chart would be when there is nothing to plot."""
    return f'<p class="nochart">No chart: {_E(why)}.</p>'


_STATUS_CLASS = {"clear": "ok", "flagged": "flag", "too_small": "warn"}
_REASON_CLASS = {"fired": "flag", "flagged": "flag", "cannot_clear": "warn"}


def _summary_section(fig: dict[str, Any]) -> str:
    """The verdict: its headline and every reason, as ``--fail-on`` and the CLI read them."""
    v = fig["verdict"]
    out = f'<p class="headline {_STATUS_CLASS[v["status"]]}">{_E(v["headline"])}</p>'
    if v["reasons"]:
        out += (
            "<ul>"
            + "".join(
                f'<li class="{_REASON_CLASS[r["kind"]]}">{_E(r["text"])}</li>' for r in v["reasons"]
            )
            + "</ul>"
        )
    return f"<h2>Summary</h2>{out}"


def _checks_section(fig: dict[str, Any]) -> str:
    c = fig["checks"]
    rows = []
    for code, check in audit_checks().items():
        if code in c["counts"]:
            rows.append(
                (
                    check.label,
                    code,
                    c["counts"][code],
                    f"{c['per_100'].get(code, 0):.1f}",
                    check.meaning,
                )
            )
        else:
            rows.append((check.label, code, "not run", "", c["not_run"].get(code, "")))
    ran = [code for code in audit_checks() if code in c["counts"]]
    chart = (
        svg_hbars(
            "Pairs flagged per check (per 100 pairs)",
            [audit_checks()[k].label for k in ran],
            [c["per_100"].get(k, 0.0) for k in ran],
            x_max=_nice_max(max([c["per_100"].get(k, 0.0) for k in ran] + [1.0])),
            x_title="pairs flagged per 100 pairs",
            fmt="{:.1f}",
        )
        if c["pairs_flagged"]
        else _no_chart(f"no check fired on any of the {fig['n_pairs']:,} pairs")
    )
    cap = c["rules"]
    return (
        f"<h2>Checks</h2><p>{c['pairs_flagged']:,} of {fig['n_pairs']:,} pairs "
        f"({show_cell(c['share_flagged'], True)}) flagged by at least one check. Word cap "
        f"{cap['cap']:g} words ({cap['word_cap']} + {cap['length_slack']:.0%} slack); "
        f"rules from {_E(str(cap.get('from', 'the config defaults')))}. "
        "Every flag is in flags.jsonl.</p>"
        + _grid(["check", "code", "pairs", "per 100", "meaning"], rows)
        + chart
    )


def _flagged_section(fig: dict[str, Any]) -> str:
    c = fig["checks"]
    ex = c["examples"]
    if not ex:
        return "<h2>Flagged pairs</h2><p>None.</p>"
    rows = [
        (
            audit_checks()[f["check"]].label if f["check"] in audit_checks() else f["check"],
            f["id"],
            f["category"] if f["category"] is not None else "",
            f["side"] or "pair",
            f["detail"],
        )
        for f in ex
    ]
    more = (
        f" Showing the first {len(ex):,} of {c['flags']:,}; flags.jsonl has them all."
        if c["flags"] > len(ex)
        else ""
    )
    return f"<h2>Flagged pairs</h2><p>One row per pair and check that fired.{more}</p>" + _grid(
        ["check", "id", "category", "side", "what fired"], rows, "flags"
    )


def _length_section(fig: dict[str, Any]) -> str:
    ln = fig["length"]
    return (
        "<h2>Length</h2>"
        + _table(
            [
                ("pairs", fig["n_pairs"]),
                ("mean words, chosen", ln["chosen_words"]["mean"]),
                ("mean words, rejected", ln["rejected_words"]["mean"]),
                ("pairs where the chosen is longer", ln["share_chosen_longer"], True),
                ("pairs of equal length", ln["share_equal"], True),
                ("pairs where the rejected is longer", ln["share_rejected_longer"], True),
                ("mean difference in words (chosen − rejected)", ln["mean_difference"]),
            ]
        )
        + svg_bars(
            "Answer length",
            _edge_labels(ln["histogram"]),
            {"chosen": ln["histogram"]["chosen"], "rejected": ln["histogram"]["rejected"]},
            x_title="words per answer",
            y_title="answers",
            integer=True,
        )
    )


def _similarity_section(fig: dict[str, Any]) -> str:
    sim = fig["similarity"]
    names = {"mean": "mean", "median": "median", "p10": "10th percentile"}
    names |= {"p90": "90th percentile", "min": "least", "max": "most"}
    return (
        "<h2>Similarity of chosen and rejected</h2><p>Word-level Indel similarity, 0 (nothing "
        "shared) to 100 (same words in the same order).</p>"
        + _table([(names[k], sim.get(k)) for k in names])
        + svg_bars(
            "Chosen vs rejected similarity",
            _edge_labels(sim["histogram"]),
            {"pairs": sim["histogram"]["counts"]},
            x_title="word-level similarity (0-100)",
            y_title="pairs",
            integer=True,
        )
    )


def _judge_sections(fig: dict[str, Any]) -> str:
    out = ""
    missing = []
    if not fig["quality_gap"]:
        missing.append("quality gap (no quality_chosen / quality_rejected columns)")
    if not fig["coverage_gap"]:
        missing.append("coverage gap (no coverage_chosen_mean / coverage_rejected_mean columns)")
    if not fig["leakage"]:
        missing.append("rubric-blind leakage (no pairwise_blind column)")
    if not fig["agreement"]:
        missing.append(
            "human agreement (no human_verdict column and no agreement rounds in release.json)"
        )
    if fig["quality_gap"]:
        q = fig["quality_gap"]["dimensions"]
        out += "<h2>Quality gap (rubric-blind judge, chosen − rejected)</h2>" + _grid(
            ["dimension", "mean gap", "chosen scored higher", "rejected scored higher"],
            [
                (
                    d,
                    q[d]["mean_gap"],
                    show_cell(q[d]["share_chosen_higher"], True),
                    show_cell(q[d]["share_rejected_higher"], True),
                )
                for d in q
            ],
        )
    if fig["coverage_gap"]:
        c = fig["coverage_gap"]
        out += "<h2>Coverage gap (rubric-aware judge, 0-2)</h2>" + _table(
            [
                ("mean coverage, chosen", c["mean_chosen"]),
                ("mean coverage, rejected", c["mean_rejected"]),
                ("mean gap", c["mean_gap"]),
            ]
        )
    if fig["leakage"]:
        lk = fig["leakage"]
        out += (
            "<h2>Rubric-blind leakage</h2><p>How often a judge that does not see the rubric "
            "already prefers the chosen answer: general quality, not personal fit.</p>"
            + _table(
                [
                    ("verdicts from", lk["source"]),
                    ("verdicts", lk["verdicts"]),
                    ("pairs judged", lk["pairs"]),
                    ("verdicts preferring the chosen", lk["share_prefers_chosen"], True),
                    ("verdicts preferring the rejected", lk["share_prefers_rejected"], True),
                    ("ties", lk["share_tie"], True),
                    (
                        "pairs where both orders prefer the chosen",
                        lk["share_pairs_chosen_both_orders"],
                        True,
                    ),
                ]
            )
        )
    if fig["agreement"]:
        a = fig["agreement"]
        out += (
            "<h2>Human agreement</h2>"
            + _table([(_agreement_label(k), v) for k, v in a.items() if not isinstance(v, dict)])
            + "".join(
                f"<h3>{_E(str(rnd))}</h3>"
                + _table(
                    [(_agreement_label(k), v) for k, v in r.items() if not isinstance(v, dict)]
                )
                for rnd, r in (a.get("rounds") or {}).items()
                if isinstance(r, dict)
            )
        )
    if missing:
        said = "Not in this source, so not shown: " + "; ".join(_E(m) for m in missing) + "."
        # with no judge figure at all the note gets the section's heading
        out += (
            f'<p class="note">{said}</p>'
            if out
            else f"<h2>Judge and human figures</h2><p>{said}</p>"
        )
    return out


# The agreement figures' keys (audit/figures.py, and each round's summary in release.json,
# pipeline/publish.py) as the report's table shows them
AGREEMENT_LABELS = {
    "annotated_pairs": "annotated pairs",
    "mean_vote_share": "mean vote share",
    "items": "tasks annotated",
    "annotators": "annotators",
    "annotations": "annotations",
    "items_with_2plus": "tasks with two or more votes",
    "krippendorff_alpha": "Krippendorff's alpha",
    "raw_agreement": "raw agreement",
    "gold_accuracy": "gold task accuracy",
}


def _agreement_label(key: Any) -> str:
    """A figure's label; a key this table does not know yet is shown in words."""
    return AGREEMENT_LABELS.get(str(key), str(key).replace("_", " "))


def _category_section(fig: dict[str, Any]) -> str:
    cats = fig["per_category"]
    if not fig.get("has_category", True):
        return "<h2>Per category</h2><p>No category column in this source.</p>"
    judged = fig["leakage"] is not None  # the blind judge's column only where it exists
    head = ["category", "pairs", "words, chosen", "words, rejected", "chosen longer"]
    head += ["similarity", *(["blind judge prefers chosen"] if judged else []), "flagged per 100"]
    rows = [
        (
            cat,
            c["pairs"],
            c["mean_words_chosen"],
            c["mean_words_rejected"],
            show_cell(c["share_chosen_longer"], True),
            c["mean_similarity"],
            *([show_cell(c["blind_prefers_chosen"], True)] if judged else []),
            c["flagged_per_100"],
        )
        for cat, c in cats.items()
    ]
    chart = (
        svg_bars(
            "Pairs where the chosen is longer, per category",
            list(cats),
            {"chosen longer": [c["share_chosen_longer"] or 0.0 for c in cats.values()]},
            y_max=1.0,
            x_title="category",
            y_title="share of pairs",
            percent=True,
        )
        if len(cats) > 1
        else _no_chart("one category only; the table holds its figures")
    )
    return "<h2>Per category</h2>" + _grid(head, rows) + chart


_PROBE_STATUS = {
    "clear": "Clears the set",
    "flagged": "Flagged",
    "too_small": "Too small to clear",
}


def _probe_section(fig: dict[str, Any]) -> str:
    probe = fig["shortcut_probe"]
    thr = probe["threshold"]
    reason = next((r for r in fig["verdict"]["reasons"] if r["gate"] == "shortcut_probe"), None)
    said = reason["text"] if reason else fig["verdict"]["shortcut"]["clear_text"]
    decision = f'<p class="{_STATUS_CLASS[probe["status"]]}">{_E(said[0].upper() + said[1:])}.</p>'
    if "auc" not in probe:
        asym = probe.get("asymmetries") or []
        return (
            f"<h2>Shortcut probe</h2>{decision}<p>Not run: {_E(probe['skipped'])}. The plain "
            "asymmetries below are what the set shows.</p>"
            + _grid(
                ["feature", "chosen has more", "chosen has less", "equal"],
                [(a["label"], a["chosen_more"], a["chosen_less"], a["equal"]) for a in asym],
            )
        )
    drivers = probe.get("drivers") or []
    named = (
        f"<p>Features that alone pass {thr} (AUC above {thr} or below {1 - thr:.1f}): "
        + "; ".join(_E(d["text"]) for d in drivers)
        + ".</p>"
        if drivers
        else f"<p>No single feature passes {thr} alone (every single-feature AUC is between "
        f"{1 - thr:.1f} and {thr}).</p>"
    )
    feats = probe["features"]
    top = probe["highest"]
    return (
        "<h2>Shortcut probe</h2>"
        + decision
        + "<p>Logistic regression on surface features of (chosen − rejected), symmetrised, "
        f"{probe['folds']}-fold cross-validation split by pair (seed {probe['seed']}), and "
        "each feature's AUC alone. The rule reads the highest of the cross-validated AUC, "
        f"the pooled AUC and every feature alone (in its stronger direction): over {thr} "
        "and over what 95% of side-swapped runs of this size reach, the set is flagged; "
        f"it and that chance level both at or under {thr}, the set is clear; else it is "
        "too small to tell.</p>"
        + named
        + _table(
            [
                ("AUC (mean over folds)", probe["auc"]),
                ("AUC (pooled out-of-fold)", probe["pooled_auc"]),
                (f"highest figure ({top['label']})", top["value"]),
                (
                    "chance: 95% of side-swapped runs reach (highest figure)",
                    probe["chance_highest_p95"],
                ),
                ("chance: 95% of side-swapped runs reach (AUC)", probe["chance_auc_p95"]),
                ("threshold", thr),
                ("decision", _PROBE_STATUS[probe["status"]].lower()),
            ]
        )
        + svg_hbars(
            f"Single-feature AUC (0.5: no signal; outside {1 - thr:.1f}-{thr}: over the threshold)",
            [FEATURE_NAMES[f][0] for f in feats],
            [probe["single_feature_auc"][f] for f in feats],
            x_max=1.0,
            x_title="AUC of the feature alone (above 0.5: the chosen has more)",
            reference=0.5,
            band=(1 - thr, thr),
            origin=0.5,
        )
    )


def _compare_section(fig: dict[str, Any]) -> str:
    other = fig.get("compare")
    if not other:
        return ""
    a, b = fig, other
    name_a, name_b = "this source", "compared source"

    def probe_cell(f: dict[str, Any]) -> str:
        p = f["shortcut_probe"]
        status = _PROBE_STATUS[p["status"]].lower()
        if "auc" not in p:
            return f"{status} (not run: {p['pairs']} pairs)"
        top = p["highest"]
        return f"{status}: {top['label']} {top['value']:.3f}"

    rows: list[tuple[str, Any, Any]] = [
        ("source", a["source"]["path"], b["source"]["path"]),
        ("pairs", a["n_pairs"], b["n_pairs"]),
        (
            "mean words, chosen",
            a["length"]["chosen_words"]["mean"],
            b["length"]["chosen_words"]["mean"],
        ),
        (
            "mean words, rejected",
            a["length"]["rejected_words"]["mean"],
            b["length"]["rejected_words"]["mean"],
        ),
        (
            "chosen longer",
            show_cell(a["length"]["share_chosen_longer"], True),
            show_cell(b["length"]["share_chosen_longer"], True),
        ),
        ("mean similarity", a["similarity"]["mean"], b["similarity"]["mean"]),
        (
            "verdict",
            a["verdict"]["status"].replace("_", " "),
            b["verdict"]["status"].replace("_", " "),
        ),
        ("shortcut probe", probe_cell(a), probe_cell(b)),
        (
            "pairs flagged per 100",
            round(100 * (a["checks"]["share_flagged"] or 0), 2),
            round(100 * (b["checks"]["share_flagged"] or 0), 2),
        ),
    ]
    codes = [c for c in audit_checks() if c in a["checks"]["counts"] or c in b["checks"]["counts"]]
    fired = [c for c in codes if a["checks"]["counts"].get(c) or b["checks"]["counts"].get(c)]
    for code in codes:
        rows.append(
            (
                f"{audit_checks()[code].label} per 100",
                a["checks"]["per_100"].get(code, "not run"),
                b["checks"]["per_100"].get(code, "not run"),
            )
        )
    cats = sorted(set(a["per_category"]) | set(b["per_category"]))
    cat_rows = []
    for cat in cats:
        ca, cb = a["per_category"].get(cat) or {}, b["per_category"].get(cat) or {}
        cat_rows.append(
            (
                cat,
                ca.get("pairs", 0),
                cb.get("pairs", 0),
                show_cell(ca.get("share_chosen_longer"), True),
                show_cell(cb.get("share_chosen_longer"), True),
                ca.get("mean_similarity"),
                cb.get("mean_similarity"),
                ca.get("flagged_per_100"),
                cb.get("flagged_per_100"),
            )
        )
    return (
        f"<h2>Side by side</h2><p>{_E(name_a)}: {_E(a['source']['path'])}; {_E(name_b)}: "
        f"{_E(b['source']['path'])}. Both audited with the same rules.</p>"
        + _grid(["figure", name_a, name_b], rows)
        + (
            svg_bars(
                "Checks fired per 100 pairs",
                [audit_checks()[c].label for c in fired],
                {
                    name_a: [a["checks"]["per_100"].get(c, 0.0) for c in fired],
                    name_b: [b["checks"]["per_100"].get(c, 0.0) for c in fired],
                },
                x_title="check (those that fired in either source)",
                y_title="pairs per 100",
            )
            if fired
            else _no_chart("no check fired in either source")
        )
        + "<h3>Per category</h3>"
        + _grid(
            [
                "category",
                f"pairs ({name_a})",
                f"pairs ({name_b})",
                f"chosen longer ({name_a})",
                f"chosen longer ({name_b})",
                f"similarity ({name_a})",
                f"similarity ({name_b})",
                f"flagged per 100 ({name_a})",
                f"flagged per 100 ({name_b})",
            ],
            cat_rows,
        )
    )


def _validity_section(fig: dict[str, Any]) -> str:
    """The release's validity claims, each with its figure and the file it was read from,
    or "not measured" with the command (pipeline/publish/validity.py)."""
    from pipeline.publish.validity import rows

    v = fig.get("validity") or {}
    if not v.get("claims"):
        note = v.get("note") or "no validity claims"
        return f"<section id='validity'><h2>Validity</h2><p class='note'>{_E(note)}</p></section>"
    cells = [[c.replace("`", "") for c in r] for r in rows(v)]
    body = _grid(["claim", "figure", "interval", "from"], cells)
    passed = f"<p class='note'>{_E(v['passed_over'])}</p>" if v.get("passed_over") else ""
    return (
        "<section id='validity'><h2>Validity</h2><p>What the outputs made for this release "
        "(those recording its data file's SHA-256) say: its pairs differ by personal "
        "preference alone, and its accuracy predicts reward models' downstream results. "
        "Each figure is read from the file named, never computed again here.</p>"
        f"{body}{passed}</section>"
    )


def render_html(fig: dict[str, Any]) -> str:
    """The report page: tables, inline SVG plots and the figures as embedded JSON."""
    src = fig["source"]
    note = f'<p class="note">{_E(src["note"])}</p>' if src.get("note") else ""
    sections = [
        _summary_section(fig),
        _checks_section(fig),
        _flagged_section(fig),
        _length_section(fig),
        _similarity_section(fig),
        _judge_sections(fig),
        _category_section(fig),
        _probe_section(fig),
        _validity_section(fig),
        _compare_section(fig),
    ]
    style = (
        "body{font-family:sans-serif;max-width:1000px;margin:2em auto;color:#222}"
        "table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ccc;"
        "padding:2px 8px;text-align:left;vertical-align:top}"
        "table.flags td:last-child{max-width:520px;word-break:break-word}"
        ".flag{color:#9b2c2c;font-weight:bold}.warn{color:#975a16;font-weight:bold}"
        ".ok{color:#276749}.note{color:#555;font-style:italic}svg{display:block;margin:.5em 0}"
        ".headline{font-size:1.15em;font-weight:bold;padding:.5em .8em;border-left:5px solid}"
        ".nochart{color:#555}li.flag,li.warn{font-weight:normal}"
    )
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        f"<title>Audit: {_E(str(src['path']))}</title><style>{style}</style></head><body>"
        f"<h1>Pair audit</h1><p>{_E(str(src['path']))} ({_E(str(src['format']))}, "
        f"{fig['n_pairs']:,} pairs)</p>{note}"
        + "".join(sections)
        + '<script type="application/json" id="figures">'
        + _json_for_html(fig)
        + "</script></body></html>"
    )


# ---- files ------------------------------------------------------------------------------


def flags_jsonl(flags: Sequence[dict[str, Any]]) -> str:
    keys = ("id", "check", "detail", "side", "category", "excerpt", "row")
    return "".join(json.dumps({k: f[k] for k in keys}, ensure_ascii=False) + "\n" for f in flags)


def write_files(out: Path, files: dict[str, str]) -> None:
    """Write every file or none: each goes to a temporary file beside its target first,
    and only when all are on disk are they renamed into place."""
    if out.exists() and not out.is_dir():
        raise InputError(
            "is a file; --out takes a folder for audit.html, audit.json and flags.jsonl",
            path=out,
            field="--out",
        )
    created = not out.exists()
    temps: list[tuple[str, Path]] = []
    try:
        out.mkdir(parents=True, exist_ok=True)
        for name, text in files.items():
            fd, tmp_name = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=out)
            temps.append((name, Path(tmp_name)))
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(text)
                fh.flush()
                os.fsync(fh.fileno())
            os.chmod(tmp_name, 0o644)
        for name, tmp in temps:
            os.replace(tmp, out / name)
    except OSError as exc:
        for _, tmp in temps:
            with contextlib.suppress(OSError):
                tmp.unlink()
        if created:
            with contextlib.suppress(OSError):
                out.rmdir()
        raise PipelineError(
            f"{exc.filename or out}: cannot write the report ({exc.strerror}); "
            "choose another folder with --out"
        ) from None
