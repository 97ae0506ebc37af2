"""What the judge costs per example at the reference's size, as `prb plan` counts it: the
requests it could send and those it expects to, and their output-token bounds, with the
judge's order and schema-sized verdicts (the defaults) against the old way (every
shortlisted combination judged, 1,024 tokens a verdict: ``judge.stop: all``,
``judge.sampling.max_tokens: 1024``, which reproduce its counts).

Input: 2,830 synthetic examples (benchmarks/scale.py's generator, labelled synthetic on
every row; not LaMP-QA) under configs/reference.yaml's settings (avoid_all, n=2, the word
cap, given rubrics), ranked by BM25 rather than Contriever (no encoder download here:
ranking changes prompts, not counts), the stand-in server as backend
(tests/standin_server.py in its own process). Three plans, each one `prb plan --json`:
``before`` (the old way), ``fresh`` (the defaults, no run yet: the pass shares the judge
assumes), ``after_pilot`` (after `prb run --set input.limit=PILOT` on the stand-in, whose
judged rows measure the shares). Writes benchmarks/results/judge_cost.json::

    python benchmarks/judge_cost.py [--n 2830] [--pilot 200]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "judge_cost.json"
sys.path.insert(0, str(Path(__file__).resolve().parent))

import _smoke  # noqa: E402
from backend_throughput import run_metadata  # noqa: E402
from scale import Server, write_synthetic_input  # noqa: E402

OLD_WAY = ["--set", "judge.stop=all", "--set", "judge.sampling.max_tokens=1024"]


def write_config(work: Path, data: Path, base_url: str) -> Path:
    import yaml

    cfg = yaml.safe_load((ROOT / "configs" / "reference.yaml").read_text())
    cfg["run"]["output_dir"] = str(work / "outputs")
    cfg["input"] = {"format": "lamp", "path": str(data)}
    cfg["backend"]["openai"] = {"base_url": base_url, "timeout_s": 30, "max_concurrency": 64}
    cfg["profile"] = {"ranker": "bm25", "top_k": 10}
    path = work / "reference-synthetic.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def prb(*argv: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "pipeline.cli", *argv]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=3600)


def plan(cfg: Path, *extra: str) -> dict[str, Any]:
    proc = prb("plan", str(cfg), "--json", *extra)
    if proc.returncode != 0:
        raise RuntimeError(f"prb plan failed: {proc.stderr[-2000:]}")
    data = json.loads(proc.stdout)
    (judge,) = [s for s in data["stages"] if s["stage"] == "judge"]
    n = max(judge["examples_to_do"], 1)
    send = judge["to_send"]
    return {
        "examples": judge["examples_to_do"],
        "requests_largest": send["requests"],
        "requests_expected": round(send["requests_expected"], 1),
        "requests_largest_per_example": round(send["requests"] / n, 2),
        "requests_expected_per_example": round(send["requests_expected"] / n, 2),
        "output_bound_largest": send["output_bound"],
        "output_bound_expected": round(send["output_bound_expected"]),
        "notes": judge["notes"],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=2830)
    ap.add_argument("--pilot", type=int, default=200)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    _smoke.add_flag(ap)
    args = ap.parse_args(argv)
    _smoke.apply(args, n=24, pilot=12)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        data = work / "synthetic.jsonl"
        write_synthetic_input(data, args.n)
        server = Server(work, "stock").start()
        try:
            cfg = write_config(work, data, server.base_url)
            result: dict[str, Any] = {"before": plan(cfg, *OLD_WAY), "fresh": plan(cfg)}
            pilot = prb("run", str(cfg), "--no-progress", "--set", f"input.limit={args.pilot}")
            if pilot.returncode not in (0, 5):
                raise RuntimeError(f"the pilot failed: {pilot.stderr[-2000:]}")
            result["after_pilot"] = plan(cfg)
        finally:
            server.stop()
    before, fresh, after = result["before"], result["fresh"], result["after_pilot"]
    out = {
        "benchmark": "judge_cost",
        "smoke": args.smoke,
        **run_metadata(),
        "command": " ".join(["python", "benchmarks/judge_cost.py", *(argv or sys.argv[1:])]),
        "data": f"{args.n} synthetic examples (benchmarks/scale.py), not LaMP-QA",
        "config": "configs/reference.yaml's settings; input synthetic, BM25, the stand-in",
        "pilot": args.pilot,
        "plans": result,
        "summary": {
            "requests_per_example": {
                "before": before["requests_largest_per_example"],
                "largest": fresh["requests_largest_per_example"],
                "expected_assumed_shares": fresh["requests_expected_per_example"],
                "expected_after_pilot": after["requests_expected_per_example"],
            },
            "output_bound_tokens": {
                "before": before["output_bound_largest"],
                "largest": fresh["output_bound_largest"],
                "expected_assumed_shares": fresh["output_bound_expected"],
            },
        },
        "seconds": round(time.perf_counter() - t0, 1),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out["summary"], indent=2))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
