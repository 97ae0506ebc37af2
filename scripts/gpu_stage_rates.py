"""Each LLM stage's answers, tokens and rates in a run folder, read from its request cache.

Works on a run that is still going or was stopped (a time-bounded check on a GPU): the
cache holds every answer as it arrived, with the time it was stored, so a stage that did
not finish still shows how far it got and how fast. A finished stage's rate is over its
LLM time (its stats.json); an unfinished one's from the previous stage's last answer (the
run's first answer for the first stage) to its own last.

usage: python scripts/gpu_stage_rates.py RUN_DIR
"""

from __future__ import annotations

import json
import sqlite3
import sys
from pathlib import Path


def stage_rates(run_dir: Path) -> list[dict[str, object]]:
    """Per stage: answers stored, prompt and completion tokens, seconds between its first
    and last answer, and answers and completion tokens per second over that span."""
    db = run_dir / "cache.sqlite"
    if not db.is_file():
        raise SystemExit(f"gpu_stage_rates: {db} does not exist (no answer was stored yet)")
    # not read-only: a run stopped at its limit may leave a write-ahead log to replay
    con = sqlite3.connect(db)
    try:
        rows = con.execute(
            "SELECT stage, response, created FROM responses ORDER BY stage, created"
        ).fetchall()
    finally:
        con.close()
    out: dict[str, dict[str, float]] = {}
    for stage, response, created in rows:
        r = json.loads(response)
        s = out.setdefault(stage, {"answers": 0, "prompt_tokens": 0, "completion_tokens": 0,
                                   "first": created, "last": created})  # fmt: skip
        s["answers"] += 1
        s["prompt_tokens"] += int(r.get("prompt_tokens") or 0)
        s["completion_tokens"] += int(r.get("completion_tokens") or 0)
        s["last"] = created
    result = []
    previous_end: float | None = None
    for stage, s in sorted(out.items(), key=lambda kv: kv[1]["first"]):
        done = (run_dir / stage / "_DONE.json").exists()
        seconds = _llm_seconds(run_dir / stage / "stats.json") if done else None
        start = s["first"] if previous_end is None else previous_end
        span = max(seconds if seconds else s["last"] - start, 1e-9)
        previous_end = s["last"]
        result.append(
            {
                "stage": stage,
                "finished": done,
                "answers": int(s["answers"]),
                "prompt_tokens": int(s["prompt_tokens"]),
                "completion_tokens": int(s["completion_tokens"]),
                "span_s": round(span, 2),
                "answers_per_s": round(s["answers"] / span, 2),
                "completion_tokens_per_s": round(s["completion_tokens"] / span, 1),
            }
        )
    return result


def _llm_seconds(stats_file: Path) -> float | None:
    try:
        stats = json.loads(stats_file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    llm = stats.get("llm") or {}
    return float(llm["seconds"]) if isinstance(llm.get("seconds"), (int, float)) else None


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python scripts/gpu_stage_rates.py RUN_DIR", file=sys.stderr)
        return 2
    for r in stage_rates(Path(argv[0])):
        state = "done" if r["finished"] else "NOT FINISHED"
        print(
            f"{r['stage']:>10} ({state}): {r['answers']} answers, {r['completion_tokens']} "
            f"completion tokens in {r['span_s']} s: {r['answers_per_s']} answers/s, "
            f"{r['completion_tokens_per_s']} tokens/s"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
