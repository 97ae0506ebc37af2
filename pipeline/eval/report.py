"""Eval results found beside a split, for the audit report: a finder and an HTML section.

``find_eval_results(path)`` looks in the eval root ``prb eval`` uses by default for that
split (``<run>/eval/`` or ``<input>-eval/``) and returns every readable results file, one
per scorer and setting (``<scorer>/<setting>/results.json``; a layout-1 root's
``<scorer>/results.json``, all settings in one, reads too). ``render_eval_html(results)``
turns them into one self-contained ``<section>`` (every value escaped).
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

from pipeline.core.fields import show, show_ci
from pipeline.eval.data import SETTINGS
from pipeline.eval.results import LEADERBOARD_JSONL, RESULTS_FILE, default_root

_ORDER = {name: i for i, name in enumerate(SETTINGS)}


def _sort_key(f: Path, root: Path) -> tuple:
    # by scorer, then the settings in their usual order; a layout-1 file (every setting)
    # where its scorer's settings would be
    parts = f.relative_to(root).parts
    setting = parts[1] if len(parts) == 3 else ""
    return (parts[0], _ORDER.get(setting, -1 if not setting else len(_ORDER)), setting)


def find_eval_results(path: str | Path) -> list[dict[str, Any]]:
    """Results of every scorer evaluated on the split at ``path`` (its default eval root,
    or ``path`` itself when it is an eval root), one per scorer and setting, sorted by
    scorer; unreadable files are skipped with a note in their place."""
    path = Path(path)
    roots = [path] if (path / LEADERBOARD_JSONL).exists() else [default_root(path)]
    found = []
    for root in roots:
        if not root.is_dir():
            continue
        files = [*root.glob(f"*/*/{RESULTS_FILE}"), *root.glob(f"*/{RESULTS_FILE}")]
        for f in sorted(files, key=lambda f: _sort_key(f, root)):
            try:
                res = json.loads(f.read_text(encoding="utf-8"))
                if not isinstance(res, dict) or not isinstance(res.get("settings"), dict):
                    raise ValueError("not an eval results file")
            except (OSError, ValueError) as exc:
                found.append({"error": f"{f}: {exc}", "path": str(f)})
                continue
            found.append({**res, "path": str(f)})
    return found


def render_eval_html(results: list[dict[str, Any]]) -> str:
    """One ``<section>`` with a row per (scorer, setting); controls marked as such."""
    e = html.escape
    if not results:
        return ""
    head = (
        "<tr><th>scorer</th><th>setting</th><th>accuracy</th><th>95% CI</th><th>ties</th>"
        "<th>failed</th><th>pairs</th><th>position consistency</th><th>profile gain</th></tr>"
    )
    rows, notes = [], []
    for res in results:
        if "error" in res:
            notes.append(f"<p class='flag'>{e(str(res['error']))}</p>")
            continue
        scorer = res.get("scorer", {})
        gain = res.get("profile_gain") or {}
        for setting, block in (res.get("settings") or {}).items():
            m = block.get("metrics", {})
            control = block.get("role") == "control"
            pos = (m.get("position") or {}).get("consistency")
            g = ""
            if setting == "profile" and gain.get("gain") is not None:
                g = f"{gain['gain']:+.3f} {show_ci(gain.get('ci95'))}"
            label = f"{setting} (control, not a score)" if control else setting
            cells = [
                scorer.get("name", scorer.get("slug", "?")),
                label,
                show(m.get("accuracy")),
                show_ci(m.get("ci95")),
                show(m.get("ties")),
                show(m.get("failed")),
                show(m.get("pairs")),
                show(pos),
                g,
            ]
            rows.append(
                "<tr" + (" class='control'" if control else "") + ">"
                + "".join(f"<td>{e(str(c))}</td>" for c in cells)
                + "</tr>"
            )  # fmt: skip
    return (
        "<section id='eval'><h2>Evaluation results</h2><p>Reward models and judges run by "
        "<code>prb eval</code> on this split. Accuracy: share of scored pairs where the chosen "
        "answer is preferred, ties and failures apart. A profile gain near zero means the "
        "split does not reward reading the profile; a question-only score far above 0.5 means "
        "the pairs differ in something besides personal preference. Rows marked control saw "
        "the rubric: a validity check, not a score.</p>"
        f"<table>{head}{''.join(rows)}</table>{''.join(notes)}</section>"
    )
