"""Where evaluation results go, and the leaderboard beside them.

Layout under the eval root (default: ``<run>/eval/`` for a run directory or a run's
release, else ``<input>-eval/`` beside the input)::

    <root>/
      leaderboard.jsonl     one row per (scorer, setting): the latest result of each
      leaderboard.md        the same rows as a table, controls listed apart
      <scorer-slug>/
        results.json        every figure of one scorer on the split
        scores.jsonl        per pair and setting: scores or verdicts, and the outcome
        cache.sqlite        judges only: every request and answer (a re-run sends nothing)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pipeline.errors import InputError
from pipeline.fields import show, show_ci
from pipeline.io import write_json_atomic, write_jsonl_atomic, write_text_atomic
from pipeline.run import run_of

RESULTS_FILE = "results.json"
SCORES_FILE = "scores.jsonl"
LEADERBOARD_JSONL = "leaderboard.jsonl"
LEADERBOARD_MD = "leaderboard.md"
SCHEMA_VERSION = 1


def default_root(path: str | Path) -> Path:
    """Where ``prb eval`` writes for a split at ``path`` (and where the audit looks)."""
    path = Path(path)
    run = run_of(path)
    if run is not None:
        return run.eval_dir
    name = path.stem if path.is_file() else path.name
    return path.with_name(f"{name}-eval")


def leaderboard_rows(results: dict[str, Any]) -> list[dict[str, Any]]:
    """One leaderboard row per setting of one scorer's results."""
    rows = []
    gain = results.get("profile_gain") or {}
    for name, s in results["settings"].items():
        m = s["metrics"]
        rows.append(
            {
                "scorer": results["scorer"]["slug"],
                "name": results["scorer"]["name"],
                "kind": results["scorer"]["kind"],
                "setting": name,
                "role": s["role"],
                "accuracy": m["accuracy"],
                "ci95": m["ci95"],
                "ties": m["ties"],
                "failed": m["failed"],
                "pairs": m["pairs"],
                "profile_gain": gain.get("gain") if name == "profile" else None,
                "profile_gain_ci95": gain.get("ci95") if name == "profile" else None,
                "split": results["split"]["fingerprint"],
                "created": results["created"],
                "results": f"{results['scorer']['slug']}/{RESULTS_FILE}",
            }
        )
    return rows


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render_leaderboard(rows: list[dict[str, Any]]) -> str:
    rows = list(rows)
    head = (
        "| scorer | kind | setting | accuracy | 95% CI | ties | failed | pairs | profile gain "
        "| split |\n|---|---|---|---|---|---|---|---|---|---|\n"
    )

    def line(r: dict[str, Any]) -> str:
        gain = ""
        if r["profile_gain"] is not None:
            gain = f"{r['profile_gain']:+.3f} {show_ci(r['profile_gain_ci95'])}"
        cells = [
            r["name"],
            r["kind"],
            r["setting"],
            show(r["accuracy"]),
            show_ci(r["ci95"]),
            show(r["ties"]),
            show(r["failed"]),
            show(r["pairs"]),
            gain,
            r["split"],
        ]
        return "| " + " | ".join(_md_cell(str(c)) for c in cells) + " |\n"

    def key(r: dict[str, Any]) -> tuple:
        return (r["setting"], -(r["accuracy"] if r["accuracy"] is not None else -1), r["name"])

    scores = sorted((r for r in rows if r["role"] == "score"), key=key)
    controls = sorted((r for r in rows if r["role"] != "score"), key=key)
    text = (
        "# Evaluation leaderboard\n\nAccuracy: share of scored pairs where the chosen answer "
        "is preferred (ties and failures counted apart; 95% bootstrap interval over pairs). "
        "Written by `prb eval`; one row per scorer and setting, the latest run of each.\n\n"
    )
    text += head + "".join(line(r) for r in scores)
    if controls:
        text += (
            "\n## Validity controls (not scores)\n\nThe scorer saw the rubric aspects: how "
            "often the pair's direction agrees with the rubric. A check of the split, never "
            "a model's result.\n\n" + head + "".join(line(r) for r in controls)
        )
    return text


def write_results(
    root: Path, results: dict[str, Any], scores: list[dict[str, Any]]
) -> dict[str, str]:
    """Write one scorer's results and scores, then update both leaderboards atomically."""
    out = root / results["scorer"]["slug"]
    out.mkdir(parents=True, exist_ok=True)
    write_jsonl_atomic(out / SCORES_FILE, scores)
    write_json_atomic(out / RESULTS_FILE, results)
    board = root / LEADERBOARD_JSONL
    rows: list[dict[str, Any]] = []
    if board.exists():
        with open(board, encoding="utf-8") as fh:
            for n, line in enumerate(fh, start=1):
                if not line.strip():
                    continue
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise InputError(
                        f"not valid JSON ({exc.msg}); fix or delete the line, then run again",
                        path=board,
                        line=n,
                    ) from None
    new = leaderboard_rows(results)
    replaced = {(r["scorer"], r["setting"]) for r in new}
    rows = [r for r in rows if (r.get("scorer"), r.get("setting")) not in replaced] + new
    write_jsonl_atomic(board, rows)
    write_text_atomic(root / LEADERBOARD_MD, render_leaderboard(rows))
    return {
        "results": str(out / RESULTS_FILE),
        "scores": str(out / SCORES_FILE),
        "leaderboard": str(root / LEADERBOARD_MD),
    }
