"""The responses stage through the ``ray`` backend with 1 and 2 workers: start-up cost,
steady-state throughput, and a clearly labelled projection to N GPU workers.

Writes synthetic LaMP-style examples (benchmarks/generation.py's generator; labelled
synthetic, not LaMP-QA data), runs ingest and rubrics (given: no LLM), then times the real
responses stage (n=2, strategies [avoid_all]: 2 requests of n=2 per example) with
``backend.name: ray``, ``ray.engine: http``, against the stand-in OpenAI server
(tests/standin_server.py) in a separate process with a log-normal latency (median 200 ms,
sigma 0.8), restarted with the same latency seed for every measurement.

Every measurement starts a fresh local Ray (loopback only, no dashboard, ``--num-cpus``)
and shuts it down at the end. Start-up and steady state are measured apart:

* ``ray_init_s``: ``ray.init`` alone, timed directly;
* ``first_answer_s``: from the stage's start to its first answer in the request cache
  (the cache stamps each answer as it arrives): planning the dataset, starting the worker
  pool and a process for the post-processing, and the first batch's requests;
* steady state, ``r``: answers/s between the 20th and the 80th percentile answer of the
  largest stage size, away from both ends: answers that queued up while the pipeline
  started arrive in a burst after the first one, and the last batches speed up as the
  input runs out (seen here at 1 worker: ~40 answers/s for the first 50 s, ~90 in the last
  25 s). As a cross-check, the stage times at all sizes W (``--sizes``) are fitted as
  ``T(W) = a + W / r_fit``.

The same at zero server latency gives the ceiling of the driver side (Ray Data, the
runner, the cache) on this machine: the rate at which it drains answers that wait. The
``projection`` section models N workers as ``T(N) = S + W / min(N r e, C)`` and lists the
inputs it needs; it is a model, not a measurement, and this machine's stand-in numbers say
nothing about a GPU's vLLM rate.

    .venv/bin/python benchmarks/ray_scaling.py [--sizes 500,2000] [--repeats 2]
        [--workers 1,2] [--batch-size 64] [--num-cpus 2] [--out PATH]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
for p in (ROOT, Path(__file__).resolve().parent):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

from backend_throughput import LATENCY_SEED, StandinProcess, lognormal_model, run_metadata  # noqa: E402
from generation import SYNTHETIC_NOTE, prepare_run, quiet, write_synthetic_examples  # noqa: E402

from pipeline.backends.ray_backend import init_local_ray  # noqa: E402
from pipeline.orchestration.orchestrate import run_pipeline  # noqa: E402

DEFAULT_OUT = ROOT / "benchmarks" / "results" / "ray_scaling.json"
MODEL = "standin-model"
REQUESTS_PER_EXAMPLE = 2  # chosen + avoid_all, each one request of n=2


def write_config(
    workdir: Path, name: str, data: Path, base_url: str, workers: int, args: argparse.Namespace
) -> Path:
    cfg = {
        "run": {"name": name, "output_dir": str(workdir / "outputs"), "seed": 0},
        "input": {"format": "lamp", "path": str(data)},
        "backend": {
            "name": "ray",
            "model": MODEL,
            "openai": {"base_url": base_url, "timeout_s": 120},
            "ray": {
                "engine": "http",
                "replicas": workers,
                "batch_size": args.batch_size,
                "num_cpus": args.num_cpus,
            },
        },
        "rubrics": {"source": "given"},
        "responses": {"n": 2, "strategies": ["avoid_all"]},
    }
    path = workdir / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def arrivals(cache: Path, since: float) -> list[float]:
    """Seconds from ``since`` to each answer of the responses stage, in order."""
    with sqlite3.connect(f"file:{cache}?mode=ro", uri=True) as db:
        rows = db.execute("SELECT created FROM responses WHERE stage='responses'").fetchall()
    return sorted(t - since for (t,) in rows)


def measure(
    work: Path,
    name: str,
    data: Path,
    n_examples: int,
    base_url: str,
    workers: int,
    args: argparse.Namespace,
) -> dict[str, Any]:
    """One stage run on a fresh local Ray; Ray is shut down whatever happens."""
    import ray

    cfg = prepare_run(write_config(work, name, data, base_url, workers, args), n_examples)
    t0 = time.perf_counter()
    if not init_local_ray(args.num_cpus):
        raise RuntimeError("a Ray was already running; each measurement needs a fresh one")
    try:
        init_s = time.perf_counter() - t0
        start = time.time()
        stats = run_pipeline(cfg, only="responses", progress=False, echo=quiet)["responses"]
        stage_s = time.time() - start
    finally:
        t1 = time.perf_counter()
        ray.shutdown()
        shutdown_s = time.perf_counter() - t1
    llm = stats["llm"]
    if stats["pending_examples"] or llm["failed"]:
        raise RuntimeError(f"responses stage had failures: {llm}")
    got = arrivals(cfg.run_dir / "cache.sqlite", start)
    lo, hi = int(len(got) * 0.2), int(len(got) * 0.8)
    return {
        "workers": workers,
        "requests": len(got),
        "ray_init_s": init_s,
        "first_answer_s": got[0],
        "last_answer_s": got[-1],
        "mid_rate_requests_per_s": (hi - lo) / (got[hi] - got[lo]),
        "stage_s": stage_s,
        "ray_shutdown_s": shutdown_s,
    }


def ray_processes_left(timeout: float = 15.0) -> list[str]:
    """Ray processes still running as children of this process (none after a shutdown)."""
    deadline = time.monotonic() + timeout
    while True:
        out = subprocess.run(["ps", "-eo", "ppid=,args="], capture_output=True, text=True)
        left = [
            line.strip()
            for line in out.stdout.splitlines()
            if line.split(None, 1)[0] == str(os.getpid()) and "ray" in line.lower()
        ]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


def with_server(args: argparse.Namespace, latency_ms: float, fn) -> dict[str, Any]:
    server = StandinProcess(latency_ms, args.sigma, seed=LATENCY_SEED)
    try:
        server.start()
        return fn(server.base_url)
    finally:
        server.stop()


def fit(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Steady rate (median mid-run rate at the largest size), start-up medians, and the
    least-squares cross-check ``stage_s = a + W / r_fit`` over all sizes."""
    largest = max(r["requests"] for r in runs)
    xs = [r["requests"] for r in runs]
    ys = [r["stage_s"] for r in runs]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum(
        (x - mx) ** 2 for x in xs
    )
    intercept = my - slope * mx
    residuals = [y - (intercept + slope * x) for x, y in zip(xs, ys, strict=True)]
    return {
        "steady_requests_per_s": round(
            statistics.median(
                r["mid_rate_requests_per_s"] for r in runs if r["requests"] == largest
            ),
            1,
        ),
        "steady_measured_on_requests": largest,
        "fit_requests_per_s": round(1 / slope, 1) if slope > 0 else None,
        "fit_intercept_s": round(intercept, 2),
        "fit_max_abs_residual_s": round(max(abs(e) for e in residuals), 2),
        "points": [[x, round(y, 2)] for x, y in zip(xs, ys, strict=True)],
        "ray_init_s_median": round(statistics.median(r["ray_init_s"] for r in runs), 2),
        "first_answer_s_median": round(statistics.median(r["first_answer_s"] for r in runs), 2),
        "startup_s_median": round(
            statistics.median(r["ray_init_s"] + r["first_answer_s"] for r in runs), 2
        ),
    }


def batch_bound(latency_ms: float, sigma: float, batch_size: int, trials: int = 4000) -> dict:
    """What one worker can do if it waits for each batch's slowest request (Ray's HTTP stage
    returns a batch only when all its requests are back): batch_size / E[max latency]."""
    rng = random.Random(0)
    draws = (
        max(latency_ms * math.exp(sigma * rng.gauss(0.0, 1.0)) for _ in range(batch_size))
        for _ in range(trials)
    )
    expected_max_ms = statistics.fmean(draws)
    return {
        "model": "one batch at a time per worker: r = batch_size / E[max latency of a batch]",
        "expected_batch_max_latency_ms": round(expected_max_ms, 1),
        # at zero latency (a smoke run) there is no bound from latency
        "requests_per_s_per_worker": (
            round(batch_size / (expected_max_ms / 1000.0), 1) if expected_max_ms > 0 else None
        ),
        "note": "a pool that keeps batch_size requests in flight all the time (the openai "
        "backend) is bounded by Little's law instead: see latency_model",
    }


def projection(by_workers: dict[str, Any], ceiling: float | None) -> dict[str, Any]:
    """``T(N) = S + W / min(N r e, C)``, with this machine's stand-in inputs as an example."""
    one, two = by_workers.get("1"), by_workers.get("2")
    r1 = one["steady_requests_per_s"] if one else None
    r2 = two["steady_requests_per_s"] if two else None
    e = r2 / (2 * r1) if r1 and r2 else None
    s = statistics.median(v["startup_s_median"] for v in by_workers.values())
    w = 100_000
    example = {}
    if r1 and e:
        for n in (1, 2, 4, 8, 16, 32):
            rate = r1 * (n * e if n > 1 else 1)
            if ceiling:
                rate = min(rate, ceiling)
            example[str(n)] = round(s + w / rate, 1)
    return {
        "label": "PROJECTION, NOT A MEASUREMENT",
        "model": "T(N) = S + W / min(N * r * e, C)",
        "terms": {
            "T(N)": "wall time of one stage with N workers (vLLM replicas)",
            "S": "fixed start-up: ray.init + time to the first answer (with vLLM: engine "
            "start, weights load and CUDA graph capture per replica, in parallel)",
            "W": "requests in the stage (rows per sample with the vllm engine)",
            "r": "steady requests/s of ONE worker",
            "e": "parallel efficiency (1 = perfect), from 2 workers against 1",
            "C": "driver-side ceiling: the most answers/s Ray Data, the runner and the "
            "request cache take on the driver (measured here at zero server latency)",
        },
        "inputs_needed_for_gpu": [
            "r: measured with ONE vLLM replica on the target GPU for this workload (model, "
            "prompt and answer lengths, batch_size, n), never assumed from this machine",
            "S: measured on the cluster (weights download and load dominate)",
            "e: measured with 2 or more replicas on the cluster",
            "C: measured on the cluster's driver node",
        ],
        "assumptions": [
            "workers are independent: one GPU (or tensor-parallel group) per engine, or one "
            "server per worker with the http engine; nothing shared saturates first",
            "e measured at 2 workers holds at N (optimistic: it only falls with N)",
            "W is large enough to keep every worker busy; the last batch's tail is ignored",
            "S is paid once per stage: each stage opens its own backend and dataset",
        ],
        "this_machine_inputs": {
            "S_s": round(s, 2),
            "r_requests_per_s": r1,
            "e": round(e, 3) if e else None,
            "C_requests_per_s": ceiling,
            "caveat": "Ray's HTTP worker against the stand-in server on a 2-core machine "
            "that also runs the server and the driver: not a GPU, not a vLLM engine",
        },
        "example_T_seconds_for_W_100000_with_this_machine_inputs": example,
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="500,2000", help="stage sizes, in examples")
    ap.add_argument("--repeats", type=int, default=2, help="measurements per size and count")
    ap.add_argument("--workers", default="1,2", help="comma-separated ray.replicas to measure")
    ap.add_argument("--batch-size", type=int, default=64, help="ray.batch_size")
    ap.add_argument("--num-cpus", type=int, default=2, help="CPUs of the local Ray")
    ap.add_argument("--latency-ms", type=float, default=200.0, help="server's median latency")
    ap.add_argument("--sigma", type=float, default=0.8, help="log-normal spread of the latency")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where to write the JSON")
    from _smoke import add_flag as add_smoke_flag
    from _smoke import apply as apply_smoke

    add_smoke_flag(ap)
    args = ap.parse_args(argv)
    apply_smoke(args, sizes="8,16", repeats=1, workers="1", latency_ms=0.0)
    workers = [int(w) for w in args.workers.split(",")]
    sizes = [int(s) for s in args.sizes.split(",")]
    if len(sizes) < 2:
        ap.error("--sizes needs two sizes or more to fit a rate")

    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-ray-") as tmp:
        work = Path(tmp)
        data = {n: write_synthetic_examples(work / f"synthetic_lamp_{n}.jsonl", n) for n in sizes}
        # sizes interleaved across worker counts, so a slow spell of the machine does not
        # land on one worker count only
        plan = [
            (w, n, args.latency_ms, "scaling", rep)
            for rep in range(args.repeats)
            for n in sizes
            for w in (workers if rep % 2 == 0 else workers[::-1])
        ]
        if not args.smoke:
            plan += [(max(workers), n, 0.0, "ceiling", 0) for n in sizes]
        for w, n, latency, kind, rep in plan:
            name = f"{kind}-w{w}-e{n}-r{rep}"
            r = with_server(
                args,
                latency,
                lambda url, name=name, n=n, w=w: measure(work, name, data[n], n, url, w, args),
            )
            r.update(kind=kind, examples=n, repeat=rep, latency_ms=latency)
            r["load_1min"] = os.getloadavg()[0]
            runs.append(r)
            print(
                f"{kind:<8} workers={w} requests={r['requests']:5d}  init {r['ray_init_s']:5.2f}"
                f" s  first answer {r['first_answer_s']:5.2f} s  stage {r['stage_s']:6.2f} s"
                f"  mid-run {r['mid_rate_requests_per_s']:7.1f} req/s",
                flush=True,
            )

    left = ray_processes_left()
    if left:
        raise RuntimeError(f"Ray processes outlived ray.shutdown(): {left}")

    by_workers = {
        str(w): fit([r for r in runs if r["kind"] == "scaling" and r["workers"] == w])
        for w in workers
    }
    # a smoke run's scaling runs are at zero latency already: they stand in for the ceiling
    ceiling_fit = fit([r for r in runs if r["kind"] == ("scaling" if args.smoke else "ceiling")])
    ceiling = ceiling_fit["steady_requests_per_s"]
    result = {
        "benchmark": "ray_scaling",
        "smoke": args.smoke,
        "data": SYNTHETIC_NOTE,
        "workload": {
            "stage": "responses",
            "n": 2,
            "strategies": ["avoid_all"],
            "sizes_examples": sizes,
            "repeats": args.repeats,
            "sizes_requests": [n * REQUESTS_PER_EXAMPLE for n in sizes],
            "backend": "ray, engine http (Ray Data HttpRequestProcessor)",
            "batch_size": args.batch_size,
            "requests_in_flight_per_worker": args.batch_size,
            "local_ray_num_cpus": args.num_cpus,
        },
        "latency_model": lognormal_model(args.latency_ms, args.sigma, args.batch_size),
        "batch_model": batch_bound(args.latency_ms, args.sigma, args.batch_size),
        "server": "tests/standin_server.py in a separate process, restarted for every "
        f"measurement with latency seed {LATENCY_SEED}",
        "measured": {
            "by_workers": by_workers,
            "driver_ceiling_at_zero_latency": ceiling_fit,
        },
        "projection": projection(by_workers, ceiling),
        "runs": [
            {k: round(v, 3) if isinstance(v, float) else v for k, v in r.items()} for r in runs
        ],
        "ray_processes_left_after_shutdown": left,
        "versions": {
            lib: metadata.version(lib) for lib in ("ray", "aiohttp", "pyarrow", "pydantic")
        },
        **run_metadata(),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")

    print(f"\nbatch_size {args.batch_size}; stage sizes {result['workload']['sizes_requests']}")
    for w, f in by_workers.items():
        print(
            f"workers={w}: start-up {f['startup_s_median']:.2f} s (ray.init "
            f"{f['ray_init_s_median']:.2f} + first answer {f['first_answer_s_median']:.2f}); "
            f"steady {f['steady_requests_per_s']} req/s (fit over sizes: "
            f"{f['fit_requests_per_s']} req/s)"
        )
    bound = result["batch_model"]["requests_per_s_per_worker"]
    print(f"one batch at a time, waiting for its slowest request: {bound} req/s per worker")
    print(f"driver ceiling (zero latency): {ceiling} req/s")
    proj = result["projection"]
    print(f"{proj['label']}: {proj['model']}")
    print(
        "  example T(N) for W=100,000 with this machine's inputs (s): "
        + json.dumps(proj["example_T_seconds_for_W_100000_with_this_machine_inputs"])
    )
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
