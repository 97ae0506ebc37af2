"""The machine-readable summary `prb run --json` prints at the end, for scripts.

Built from what the run left on disk (each stage's stats.json and state), so a run that
stopped on an error is summarised the same way as one that finished.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from pipeline.core.errors import PipelineError
from pipeline.kinds.stages import ORDER
from pipeline.run import RunDir

_REQUEST_KEYS = ("requests", "sent", "cached", "failed", "reasks")


def _stats(rd: RunDir, name: str) -> dict[str, Any]:
    # the summary is printed after an error too: a damaged stats.json leaves its figures
    # out (the error line already names what is wrong)
    try:
        return rd.stage(name).stats()
    except PipelineError:
        return {}


def run_summary(
    run_dir: str | Path,
    ran: list[str],
    *,
    seconds: float,
    error: str | None = None,
    next_commands: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Every stage's state and counts; request totals over the stages this command ran.

    ``ran`` names the stages this command executed (the others were already done, or were
    not asked for). ``next_commands``: after a budget stop, the commands that go on
    (``resume``) and plan the rest (``plan``), as the CLI prints them.
    """
    rd = RunDir(run_dir)
    stages: dict[str, Any] = {}
    # sent counts every request that went to the backend, re-asks included; reasks says
    # how many of the requests were re-asks (sent, or answered by the cache)
    totals = dict.fromkeys(("sent", "cached", "failed", "reasks", "tokens"), 0)
    for name in ORDER:
        try:
            state, done, expected = rd.stage(name).status()
        except PipelineError:
            state, done, expected = "damaged", 0, None
        stats = _stats(rd, name) if state != "not started" else {}
        entry: dict[str, Any] = {
            "state": state,
            "ran": name in ran,
            "examples_done": done,
            "examples_expected": expected,
            "counts": {
                k: v
                for k, v in stats.items()
                if isinstance(v, int) and not isinstance(v, bool) and k != "seconds"
            },
            "seconds": stats.get("seconds"),
        }
        llm = stats.get("llm")
        if isinstance(llm, dict) and "requests" in llm:
            entry["requests"] = {k: llm.get(k, 0) for k in _REQUEST_KEYS}
            if llm.get("failure_reasons"):
                entry["requests"]["failure_reasons"] = llm["failure_reasons"]
            if name in ran:
                for k in ("sent", "cached", "failed", "reasks"):
                    totals[k] += int(llm.get(k, 0))
                totals["tokens"] += int(llm.get("prompt_tokens", 0)) + int(
                    llm.get("completion_tokens", 0)
                )
        if name == "pairs" and stats:
            entry["dropped_by_reason"] = {
                k: v for k, v in (stats.get("dropped_by_reason") or {}).items() if v
            }
        stages[name] = entry
    pairs = stages["pairs"]
    out = {
        "ok": error is None,
        "error": error,
        "run_dir": rd.shown,
        "stages_run": [n for n in ORDER if n in ran],
        "stages": stages,
        "pairs_kept": pairs["counts"].get("kept") if pairs["state"] == "done" else None,
        "requests": totals,
        "seconds": round(seconds, 3),
    }
    if next_commands:
        out["next"] = next_commands
    return out


def stages_started_since(run_dir: str | Path, since: float) -> list[str]:
    """The stages a command that began at ``since`` (time.time()) executed.

    Each executed stage records its start in stage.json (StageDir.begin) with the same
    clock; a stage that was skipped as done keeps the start of the run that made it.
    """
    rd = RunDir(run_dir)
    started = []
    for n in ORDER:
        try:
            meta = rd.stage(n).meta
        except PipelineError:
            continue
        if meta is not None and meta.started is not None and meta.started >= since:
            started.append(n)
    return started


def print_run_summary(
    run_dir: str | Path,
    *,
    since: float,
    error: str | None = None,
    next_commands: dict[str, str] | None = None,
) -> None:
    """Print run_summary() as JSON on stdout for a command that began at ``since``."""
    ran = stages_started_since(run_dir, since)
    summary = run_summary(
        run_dir, ran, seconds=time.time() - since, error=error, next_commands=next_commands
    )
    print(json.dumps(summary, indent=2), flush=True)
