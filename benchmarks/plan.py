"""`prb plan` on the reference benchmark's size: 2,830 synthetic examples, n=2, three
rejected strategies, the judge's defaults.

Input: benchmarks/scale.py's generator (synthetic LaMP-style rows, labelled synthetic on
every row, not LaMP-QA). Every measurement is one subprocess, `python -m pipeline.cli plan
CONFIG --json`, timed from spawn to exit (interpreter start-up and imports included), over
a fresh run (no run directory: the plan reads and ranks the input in memory, and plans the
judge on placeholder answers), in three settings:

- ``standin``: the backend is the stand-in server (tests/standin_server.py in its own
  process), whose identity the plan reads at ``/models``; tokens are counted its way;
- ``no_server``: the backend URL answers nothing; the identity is unknown and tokens are
  estimated at 4 characters per token;
- ``after_pilot``: the ``standin`` run after `prb run CONFIG --set input.limit=PILOT` (the
  pilot's answers measure output lengths and are found in the cache); the pilot itself is
  not timed.

Then (unless ``--no-full-run``) the whole run itself, `prb run CONFIG`, and per LLM stage
the ``after_pilot`` plan against what that run's stats.json says it sent and received:
requests to send against sent, prompt tokens against the backend's count, expected output
against received output.

It checks that planning wrote nothing (the run directory of a fresh plan does not appear;
after the pilot, every file of the run is unchanged) and writes
benchmarks/results/plan.json: per setting the wall times of ``--repeats`` runs, the plan's
own seconds, its totals and the table `prb plan` prints. ::

    .venv/bin/python benchmarks/plan.py [--n 2830] [--repeats 3] [--pilot 50]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "plan.json"
TARGET_S = 10.0
sys.path.insert(0, str(Path(__file__).resolve().parent))

from backend_throughput import run_metadata  # noqa: E402
from scale import MODEL, STRATEGIES, N, Server, write_synthetic_input  # noqa: E402

# illustrative prices and throughput, so the table shows its time and cost lines; they are
# not measurements of any model or API
PRICES = {"input_usd_per_million": 0.15, "output_usd_per_million": 0.60}
TOKENS_PER_SECOND = 2000.0


def write_config(work: Path, name: str, data: Path, base_url: str) -> Path:
    import yaml

    cfg = {
        "run": {"name": name, "output_dir": str(work / "outputs"), "seed": 0, "prices": PRICES},
        "input": {"format": "lamp", "path": str(data)},
        "backend": {
            "name": "openai",
            "model": MODEL,
            "openai": {"base_url": base_url, "timeout_s": 10},
        },
        "profile": {"top_k": 10, "ranker": "bm25"},
        "rubrics": {"source": "given"},
        "responses": {"n": N, "strategies": STRATEGIES},
    }
    path = work / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def tree_state(folder: Path) -> dict[str, str]:
    if not folder.exists():
        return {}
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def plan_once(cfg: Path, *extra: str) -> tuple[float, subprocess.CompletedProcess]:
    cmd = [sys.executable, "-m", "pipeline.cli", "plan", str(cfg), *extra]
    cmd += ["--tokens-per-second", str(TOKENS_PER_SECOND)]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    return time.perf_counter() - t0, proc


def measure(cfg: Path, run_dir: Path, repeats: int) -> dict[str, Any]:
    before = tree_state(run_dir)
    walls, plan = [], None
    for _ in range(repeats):
        wall, proc = plan_once(cfg, "--json")
        if proc.returncode != 0:
            raise RuntimeError(f"prb plan failed: {proc.stderr[-2000:]}")
        walls.append(round(wall, 3))
        plan = json.loads(proc.stdout)
    _, table = plan_once(cfg)
    assert tree_state(run_dir) == before, "prb plan changed the run directory"
    assert plan is not None
    stages = {
        s["stage"]: {
            "action": s["action"],
            "examples_to_do": s["examples_to_do"],
            "requests": s["total"]["requests"],
            "cached": s["cached"],
            "to_send": s["to_send"]["requests"],
            # the judge sends part of what it could: what the plan expects it to send
            "to_send_expected": round(s["to_send"]["requests_expected"], 1),
            "prompt_tokens": s["to_send"]["prompt_tokens"],
            "prompt_tokens_expected": round(s["to_send"]["prompt_expected"]),
            "output_expected": s["to_send"]["output_expected"],
            "output_bound": s["to_send"]["output_bound"],
            "estimated": s["estimated"],
        }
        for s in plan["stages"]
        if s["uses_llm"]
    }
    return {
        "wall_s": walls,
        "wall_s_median": statistics.median(walls),
        "plan_seconds": plan["seconds"],
        "backend": plan["backend"],
        "stages": stages,
        "totals": plan["totals"],
        "time": plan["time"],
        "cost": plan["cost"],
        "table": table.stdout.splitlines(),
        "wrote_nothing": True,
    }


def check_against_run(cfg: Path, run_dir: Path, results: dict[str, Any]) -> dict[str, Any]:
    """Run the whole pipeline; the after_pilot plan per LLM stage against what it sent."""
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "pipeline.cli", "run", str(cfg), "--no-progress"],
        cwd=ROOT, capture_output=True, text=True, timeout=3600,
    )  # fmt: skip
    if proc.returncode != 0:
        raise RuntimeError(f"full run failed: {proc.stderr[-2000:]}")
    out: dict[str, Any] = {"run_seconds": round(time.perf_counter() - t0, 1), "stages": {}}
    for name, planned in results["after_pilot"]["stages"].items():
        stats = json.loads((run_dir / name / "stats.json").read_text())
        llm = stats["llm"]
        expected = planned["output_expected"]
        out["stages"][name] = {
            "requests_planned": planned["to_send"],
            "requests_expected": planned["to_send_expected"],
            "requests_sent": llm["sent"],
            "reasks": llm["reasks"],
            "failed": llm["failed"],
            "prompt_tokens_planned": planned["prompt_tokens_expected"],
            "prompt_tokens_actual": llm["prompt_tokens"],
            "prompt_ratio": round(
                planned["prompt_tokens_expected"] / max(llm["prompt_tokens"], 1), 3
            ),
            "output_tokens_planned": expected,
            "output_tokens_actual": llm["completion_tokens"],
            "output_ratio": round(expected / max(llm["completion_tokens"], 1), 3)
            if expected is not None
            else None,
        }
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=2830, help="synthetic examples (default 2,830)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--pilot", type=int, default=50, help="examples of the pilot run")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument(
        "--no-full-run", action="store_true", help="skip the full run that checks the plan"
    )
    from _smoke import add_flag as add_smoke_flag
    from _smoke import apply as apply_smoke

    add_smoke_flag(ap)
    args = ap.parse_args(argv)
    apply_smoke(args, n=40, repeats=1, pilot=5)

    work = Path(tempfile.mkdtemp(prefix="bench-plan-"))
    results: dict[str, Any] = {}
    checked: dict[str, Any] | None = None
    try:
        data = work / "input.jsonl"
        made = write_synthetic_input(data, args.n)
        server = Server(work, "bench").start()
        try:
            cfg = write_config(work, "standin", data, server.base_url)
            results["standin"] = measure(cfg, work / "outputs" / "standin", args.repeats)
            assert not (work / "outputs" / "standin").exists()
            off = write_config(work, "no_server", data, "http://127.0.0.1:9/v1")
            results["no_server"] = measure(off, work / "outputs" / "no_server", args.repeats)
            assert not (work / "outputs" / "no_server").exists()
            pilot = subprocess.run(
                [sys.executable, "-m", "pipeline.cli", "run", str(cfg), "--no-progress",
                 "--set", f"input.limit={args.pilot}"],
                cwd=ROOT, capture_output=True, text=True, timeout=1800,
            )  # fmt: skip
            if pilot.returncode != 0:
                raise RuntimeError(f"pilot run failed: {pilot.stderr[-2000:]}")
            results["after_pilot"] = measure(cfg, work / "outputs" / "standin", args.repeats)
            if not args.no_full_run:
                checked = check_against_run(cfg, work / "outputs" / "standin", results)
        finally:
            server.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)

    result = {
        "benchmark": "plan",
        "smoke": args.smoke,
        "data": "synthetic benchmark data generated by benchmarks/scale.py; not from LaMP-QA",
        "input": made,
        "workload": {
            "n": N,
            "strategies": STRATEGIES,
            "rubrics": "given",
            "judge": "defaults",
            "pilot_examples": args.pilot,
        },
        "method": __doc__.split("\n\n")[1].replace("\n", " "),
        "illustrative": {"prices": PRICES, "tokens_per_second": TOKENS_PER_SECOND},
        "target": {
            "seconds": TARGET_S,
            "met": all(r["wall_s_median"] < TARGET_S for r in results.values()),
        },
        "settings": results,
        "plan_against_run": checked,
        **run_metadata(),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    for name, r in results.items():
        print(f"== {name}: median {r['wall_s_median']} s over {r['wall_s']} "
              f"(plan's own {r['plan_seconds']} s)")  # fmt: skip
        print("\n".join(r["table"]))
        print()
    if checked is not None:
        print(f"== the plan after the pilot against the full run ({checked['run_seconds']} s)")
        for name, c in checked["stages"].items():
            print(
                f"{name}: requests {c['requests_planned']:,} planned, {c['requests_sent']:,} "
                f"sent; prompt x{c['prompt_ratio']}, output x{c['output_ratio']} (plan/actual)"
            )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
