"""Where evaluation results go, and the leaderboard beside them.

Layout under the eval root (default: ``<run>/eval/`` for a run directory or a run's
release, else ``<input>-eval/`` beside the input)::

    <root>/
      leaderboard.jsonl     one row per (scorer, setting): the latest result of each, with
                            the path of the results file it came from
      leaderboard.md        the same rows as a table, controls listed apart
      <scorer-slug>/
        <setting>/          question, profile or rubric
          results.json      every figure of one scorer on one setting
          scores.jsonl      per pair: scores or verdicts, and the outcome
        cache.sqlite        judges only: every request and answer (a re-run sends nothing)

One file per scorer and setting rather than one per scorer with settings merged into it:
each file is written whole by the one run that evaluated that setting, so its split
fingerprint, options, versions and date describe the figures in it, and a run of one
setting never rewrites another's. The profile gain needs the question and profile outcomes
of one run; it is kept with the profile results of the run that evaluated both. The
leaderboard is the one file runs share: it is rewritten under a lock on the root.

Layout 1 (until issue 21) kept ``<scorer-slug>/results.json`` and ``scores.jsonl`` with
every setting of the scorer's latest run, so a run of another setting replaced them. Such
a root still reads (``pipeline.eval.report``); the first run that writes a scorer's results
moves its layout-1 files into the setting folders.
"""

from __future__ import annotations

import fcntl
import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pipeline.core.errors import InputError
from pipeline.core.fields import show, show_ci
from pipeline.core.io import read_json, write_json_atomic, write_jsonl_atomic, write_text_atomic
from pipeline.eval.data import SETTINGS
from pipeline.run import default_eval_root
from pipeline.run.layout import LOCK
from pipeline.run.outputs import check_output

RESULTS_FILE = "results.json"
SCORES_FILE = "scores.jsonl"
LEADERBOARD_JSONL = "leaderboard.jsonl"
LEADERBOARD_MD = "leaderboard.md"
LOCK_FILE = LOCK  # the eval root has its own lock, named like a run's
SCHEMA_VERSION = 2  # 1: one results.json per scorer (layout 1); 2: one per scorer and setting


def default_root(path: str | Path) -> Path:
    """Where ``prb eval`` writes for a split at ``path`` (and where the audit looks):
    ``pipeline.run.default_eval_root``, the one rule."""
    return default_eval_root(path)


def check_root(root: Path, reads: list[tuple[str, Path]]) -> None:
    """The eval root and the leaderboard files in it, through the one check of outputs
    (:func:`pipeline.run.outputs.check_output`): never a run's own files or folders, what
    is being read, or a leaderboard file `prb eval` did not write."""
    check_output(root, flag="--out", command="prb eval", folder=True, reads=reads)
    if root.is_dir():
        for name in (LEADERBOARD_JSONL, LEADERBOARD_MD):
            check_output(root / name, flag="--out", command="prb eval", ours=_written_by_eval)


def _written_by_eval(path: Path) -> bool:
    try:
        text = path.read_text(encoding="utf-8")
        if path.name == LEADERBOARD_MD:
            return text.startswith("# Evaluation leaderboard\n")
        rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    except (OSError, UnicodeDecodeError, ValueError, RecursionError):
        return False
    return all(isinstance(r, dict) and {"scorer", "setting"} <= r.keys() for r in rows)


def results_path(slug: str, setting: str) -> str:
    """Where one scorer's results on one setting live, relative to the eval root."""
    return f"{slug}/{setting}/{RESULTS_FILE}"


def split_by_setting(results: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """One results document per setting of a run: its own block, the run's shared fields,
    and the profile gain with the profile results only."""
    out = {}
    for name, block in results["settings"].items():
        doc = {k: v for k, v in results.items() if k != "outputs"}
        doc.update(
            schema=SCHEMA_VERSION,
            setting=name,
            settings={name: block},
            profile_gain=results.get("profile_gain") if name == "profile" else None,
        )
        out[name] = doc
    return out


def leaderboard_rows(results: dict[str, Any]) -> list[dict[str, Any]]:
    """One leaderboard row per setting of one scorer's results."""
    rows = []
    gain = results.get("profile_gain") or {}
    slug = results["scorer"]["slug"]
    for name, s in results["settings"].items():
        m = s["metrics"]
        rows.append(
            {
                "scorer": slug,
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
                "results": results_path(slug, name),
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


@contextmanager
def _locked(root: Path) -> Iterator[None]:
    """Hold an exclusive lock on the eval root: two ``prb eval`` runs writing to one root
    (another setting or scorer on a second GPU) would otherwise each rewrite the
    leaderboard from what they read before the other wrote, and drop its rows."""
    root.mkdir(parents=True, exist_ok=True)
    with open(root / LOCK_FILE, "a") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def _read_board(board: Path) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    if not board.exists():
        return rows
    with open(board, encoding="utf-8") as fh:
        for n, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise InputError(
                    f"not valid JSON ({exc.msg}); fix or delete the line, then run again",
                    path=board,
                    line=n,
                ) from None
            if not isinstance(row, dict):
                raise InputError(
                    "not a leaderboard row; fix or delete the line, then run again",
                    path=board,
                    line=n,
                )
            rows.append(row)
    return rows


def _read_layout1_scores(path: Path) -> list[dict[str, Any]]:
    rows = []
    with open(path, encoding="utf-8") as fh:
        for n, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise InputError(
                    f"not valid JSON ({exc.msg}); move the scorer's folder aside, then run again",
                    path=path,
                    line=n,
                ) from None
    return rows


def move_layout1(root: Path, slug: str) -> list[str]:
    """Move a scorer's layout-1 ``results.json`` and ``scores.jsonl`` into its setting
    folders; returns the settings moved. A setting that already has its own folder keeps
    it (a later run wrote it)."""
    old = root / slug / RESULTS_FILE
    if not old.is_file():
        return []
    what_to_do = "move the scorer's folder aside, then run again"
    try:
        doc = read_json(old)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InputError(
            f"an eval results file that is not valid JSON ({exc}); {what_to_do}", path=old
        ) from None
    settings = doc.get("settings") if isinstance(doc, dict) else None
    if not isinstance(settings, dict) or not isinstance(doc.get("scorer"), dict):
        raise InputError(f"not an eval results file (no settings); {what_to_do}", path=old)
    unknown = [name for name in settings if name not in SETTINGS]
    if unknown:  # a setting's name becomes a folder name: only ours
        raise InputError(f"unknown setting {unknown[0]!r}; {what_to_do}", path=old)
    old_scores = root / slug / SCORES_FILE
    scores = _read_layout1_scores(old_scores) if old_scores.exists() else []
    moved = []
    for name, part in split_by_setting(doc).items():
        folder = root / slug / name
        if (folder / RESULTS_FILE).exists():
            continue
        part["moved_from"] = f"{slug}/{RESULTS_FILE} (layout 1)"
        folder.mkdir(parents=True, exist_ok=True)
        write_jsonl_atomic(folder / SCORES_FILE, [r for r in scores if r.get("setting") == name])
        write_json_atomic(folder / RESULTS_FILE, part)
        moved.append(name)
    # removed only once every setting has its own copy: a crash before this point leaves
    # layout-1 files that the next run moves again (skipping the settings already moved)
    old_scores.unlink(missing_ok=True)
    old.unlink()
    return moved


def write_results(
    root: Path, results: dict[str, Any], scores: list[dict[str, Any]]
) -> dict[str, Any]:
    """Write one scorer's results and scores per setting, then update both leaderboards.

    Only the settings of this run are written; the scorer's other settings keep their
    files and leaderboard rows.
    """
    slug = results["scorer"]["slug"]
    board = root / LEADERBOARD_JSONL
    written: dict[str, dict[str, str]] = {"results": {}, "scores": {}}
    with _locked(root):
        move_layout1(root, slug)
        for name, doc in split_by_setting(results).items():
            folder = root / slug / name
            folder.mkdir(parents=True, exist_ok=True)
            write_jsonl_atomic(folder / SCORES_FILE, [r for r in scores if r["setting"] == name])
            write_json_atomic(folder / RESULTS_FILE, doc)
            written["results"][name] = str(folder / RESULTS_FILE)
            written["scores"][name] = str(folder / SCORES_FILE)
        new = leaderboard_rows(results)
        replaced = {(r["scorer"], r["setting"]) for r in new}
        rows = []
        for r in _read_board(board):
            key = (r.get("scorer"), r.get("setting"))
            if key in replaced:
                continue
            if r.get("scorer") == slug and isinstance(r.get("setting"), str):
                # a layout-1 row pointed at <slug>/results.json, which a later run of
                # another setting may have replaced: point it at its setting's own file,
                # or at nothing when that file was lost
                own = results_path(slug, r["setting"])
                r["results"] = own if (root / own).is_file() else None
            rows.append(r)
        rows += new
        write_jsonl_atomic(board, rows)
        write_text_atomic(root / LEADERBOARD_MD, render_leaderboard(rows))
    return {**written, "leaderboard": str(root / LEADERBOARD_MD)}
