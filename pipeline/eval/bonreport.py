"""``prb eval bon``'s HTML report: one self-contained page (inline SVG, no script, every
value escaped) with the scaling curves, the mean judge score against k (on a log2 axis),
one line per scorer and a chart per setting, and the figures as tables."""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from typing import Any

from pipeline.eval.bonfigures import ALL

_E = html.escape
COLOURS = ("#2b6cb0", "#c05621", "#2f855a", "#9b2c2c", "#6b46c1", "#b7791f", "#319795", "#4a5568")


def svg_curves(
    title: str, ks: Sequence[int], lines: Sequence[tuple[str, Sequence[float | None]]]
) -> str:
    """A line chart: x = k (log2 spacing), y = the mean score, one line and legend entry per
    (name, values); a missing value breaks its line."""
    width, height, left, right, top, bottom = 640, 300, 56, 170, 30, 44
    values: list[float] = [v for _, vs in lines for v in vs if v is not None]
    if not values or not ks:
        return f"<p class='nochart'>{_E(title)}: nothing to plot</p>"
    lo, hi = min(values), max(values)
    if hi - lo < 1e-9:
        lo, hi = lo - 0.05, hi + 0.05
    pad = (hi - lo) * 0.08
    lo, hi = lo - pad, hi + pad
    xs = [math.log2(k) for k in ks]
    x0, x1 = min(xs), max(xs) if max(xs) > min(xs) else min(xs) + 1

    def px(k: int) -> float:
        return left + (math.log2(k) - x0) / (x1 - x0) * (width - left - right)

    def py(v: float) -> float:
        return top + (hi - v) / (hi - lo) * (height - top - bottom)

    parts = [
        f'<svg width="{width}" height="{height}" role="img" aria-label="{_E(title)}" '
        'xmlns="http://www.w3.org/2000/svg">',
        f'<text x="{left}" y="18" font-size="13" font-weight="bold">{_E(title)}</text>',
        f'<line x1="{left}" y1="{height - bottom}" x2="{width - right}" y2="{height - bottom}" '
        'stroke="#555"/>',
        f'<line x1="{left}" y1="{top}" x2="{left}" y2="{height - bottom}" stroke="#555"/>',
    ]
    for k in ks:
        x = px(k)
        parts.append(
            f'<line x1="{x:.1f}" y1="{height - bottom}" x2="{x:.1f}" y2="{height - bottom + 4}" '
            f'stroke="#555"/><text x="{x:.1f}" y="{height - bottom + 16}" font-size="11" '
            f'text-anchor="middle">{k}</text>'
        )
    for i in range(5):
        v = lo + (hi - lo) * i / 4
        y = py(v)
        parts.append(
            f'<line x1="{left - 4}" y1="{y:.1f}" x2="{width - right}" y2="{y:.1f}" '
            f'stroke="#eee"/><text x="{left - 6}" y="{y + 4:.1f}" font-size="11" '
            f'text-anchor="end">{v:.2f}</text>'
        )
    parts.append(
        f'<text x="{(left + width - right) / 2:.0f}" y="{height - 6}" font-size="12" '
        'text-anchor="middle">k (answers the reward model chooses from)</text>'
    )
    for i, (name, vs) in enumerate(lines):
        colour = COLOURS[i % len(COLOURS)]
        run: list[str] = []
        segments: list[list[str]] = [run]
        for k, value in zip(ks, vs, strict=True):
            if value is None:
                run = []
                segments.append(run)
                continue
            v = float(value)
            run.append(f"{px(k):.1f},{py(v):.1f}")
            parts.append(
                f'<circle cx="{px(k):.1f}" cy="{py(v):.1f}" r="3" fill="{colour}">'
                f"<title>{_E(name)} k={k}: {v:.3f}</title></circle>"
            )
        for seg in segments:
            if len(seg) > 1:
                parts.append(
                    f'<polyline fill="none" stroke="{colour}" stroke-width="2" '
                    f'points="{" ".join(seg)}"/>'
                )
        ly = top + 14 + 18 * i
        parts.append(
            f'<line x1="{width - right + 12}" y1="{ly}" x2="{width - right + 30}" y2="{ly}" '
            f'stroke="{colour}" stroke-width="2"/><text x="{width - right + 34}" y="{ly + 4}" '
            f'font-size="11">{_E(name[:22])}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)


def _num(v: Any) -> str:
    return "-" if v is None else f"{v:.3f}"


def _ci(ci: Any) -> str:
    return "" if not ci else f"[{ci[0]:.3f}, {ci[1]:.3f}]"


def render_report(result: dict[str, Any]) -> str:
    """The page for one ``prb eval bon`` result (bon.json's figures)."""
    ks = result["ks"]
    sections = []
    for s, label in result["settings"].items():
        lines = [
            (b["name"], [b["curves"][s][ALL]["k"][str(k)]["mean"] for k in ks])
            for b in result["scorers"]
        ]
        chart = svg_curves(f"best-of-k, setting {s}: mean judge score", ks, lines)
        head = "".join(f"<th>k={k}</th>" for k in ks)
        rows = []
        for b in result["scorers"]:
            for subset, fig in b["curves"][s].items():
                cells = "".join(
                    f"<td>{_num(fig['k'][str(k)]['mean'])}<br><small>"
                    f"{_E(_ci(fig['k'][str(k)]['ci95']))}</small></td>"
                    for k in ks
                )
                g = fig["gain"]
                rows.append(
                    f"<tr><td>{_E(b['name'])}</td><td>{_E(subset)}</td>{cells}"
                    f"<td>{_num(g['gain'])}<br><small>{_E(_ci(g['ci95']))}</small></td></tr>"
                )
        table = result.get("tables", {}).get(s, {})
        corr = ""
        for r in table.get("figures") or []:
            m = r.get("metrics") or {}
            cells = "".join(
                f"<td>{_num((m.get(x) or {}).get('value'))}<br><small>"
                f"{_E(_ci((m.get(x) or {}).get('ci95')))}</small></td>"
                for x in ("spearman", "kendall_tau_weighted", "ndcg", "rbo")
            )
            corr += (
                f"<tr><td>{_E(r['subset'])}</td><td>{_E(r['downstream'])}</td>"
                f"<td>{r['models']}</td>{cells}</tr>"
            )
        corr_html = (
            "<h3>Benchmark accuracy against the downstream figures</h3><table><tr><th>subset"
            "</th><th>downstream</th><th>models</th><th>Spearman</th><th>weighted tau</th>"
            f"<th>NDCG</th><th>RBO</th></tr>{corr}</table>"
            if corr
            else f"<p class='note'>{_E(table.get('correlate_note') or 'no correlation')}</p>"
        )
        sections.append(
            f"<section><h2>Setting {_E(s)}</h2><p>{_E(label)}</p>{chart}"
            f"<table><tr><th>scorer</th><th>subset</th>{head}<th>gain over k=1</th></tr>"
            f"{''.join(rows)}</table>{corr_html}</section>"
        )
    pol, jud = result["policy"], result["judge"]
    style = (
        "body{font-family:sans-serif;max-width:1000px;margin:2em auto;color:#222}"
        "table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ccc;"
        "padding:2px 8px;text-align:left;vertical-align:top}.note{color:#555}"
        "svg{display:block;margin:.5em 0}small{color:#555}"
    )
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        f"<title>Best-of-N: {_E(str(result['split'].get('path')))}</title>"
        f"<style>{style}</style></head><body><h1>Best-of-N downstream evaluation</h1>"
        f"<p>{_E(str(result['split'].get('path')))}: {result['questions']} questions, N = "
        f"{result['n']} samples each from {_E(str(pol['model']))} ({_E(pol['described'])}), "
        f"temperature {pol['temperature']}, top_p {pol['top_p']}, max_tokens "
        f"{pol['max_tokens']}. Each distinct picked answer judged once by "
        f"{_E(str(jud['model']))}: {_E(jud['scale'])}. Intervals: 95% bootstrap over "
        f"questions. Ties: {_E(result['ties'])}.</p>" + "".join(sections) + "</body></html>"
    )
