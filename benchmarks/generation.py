"""The responses stage end to end, against the backend alone on the same requests.

Writes 500 synthetic LaMP-style examples (3 given rubric aspects and 8 profile posts each;
labelled synthetic, not LaMP-QA data) and a run config into a temp dir, starts the
stand-in OpenAI server (tests/standin_server.py) as a separate process with a log-normal
latency (median 200 ms, sigma 0.8), and runs the real stages: ``run_pipeline(...,
until="rubrics")`` first (given rubrics, no LLM), then, timed, ``run_pipeline(...,
only="responses")`` with n=2 and strategies [avoid_all], so 2 requests of n=2 per example
(1,000 requests), backend openai at concurrency 64.

In the same run it times the backend alone: ``LLMRunner`` + ``OpenAIBackend`` + a fresh
``RequestCache`` over exactly the stage's ``ChatRequest`` list (built with
``ResponseStage().example_jobs``, and checked against the keys the stage cached), so
stage/backend compares like with like. Each measurement gets a fresh server process with
the same latency seed (so the same latency draws); measurements alternate (backend, stage;
flipped on each repeat) and the median per measurement is kept. Reported: examples/s for the stage,
requests/s for both, the ratio (target >= 0.9), the share of the stage's wall time spent
outside waiting for the server (1 - backend seconds / stage seconds), and the stage's
client CPU time over its wall time (work that the waiting did not hide).

Writes benchmarks/results/generation.json and prints a short table::

    .venv/bin/python benchmarks/generation.py [--examples 500] [--concurrency 64]
        [--latency-ms 200] [--sigma 0.8] [--repeats 3] [--out PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import random
import sqlite3
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
for p in (ROOT, Path(__file__).resolve().parent):  # the package, and backend_throughput
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

from backend_throughput import (  # noqa: E402
    LATENCY_SEED,
    StandinProcess,
    lognormal_model,
    measure_with_fresh_server,
    run_metadata,
)

from pipeline.backends.openai.backend import OpenAIBackend  # noqa: E402
from pipeline.config import Config, load_config  # noqa: E402
from pipeline.engine.llm import Answer, LLMRunner  # noqa: E402
from pipeline.orchestration.orchestrate import run_pipeline  # noqa: E402
from pipeline.run import RunDir  # noqa: E402
from pipeline.run.cache import RequestCache  # noqa: E402
from pipeline.stages.base import Context  # noqa: E402
from pipeline.stages.responses import ResponseStage  # noqa: E402
from pipeline.types.chat import ChatRequest  # noqa: E402

DEFAULT_OUT = ROOT / "benchmarks" / "results" / "generation.json"
MODEL = "standin-model"
TARGET = 0.9
SYNTHETIC_NOTE = "synthetic benchmark data (benchmarks/generation.py); not from LaMP-QA"

CATEGORIES = {
    "Art_and_Entertainment": ["drawing", "watercolour painting", "film photography",
                              "songwriting", "learning the guitar", "writing short fiction"],
    "Lifestyle_and_Personal_Development": ["running a first marathon", "meal prepping",
                                           "waking up earlier", "learning Spanish",
                                           "budgeting on a small salary", "home workouts"],
    "Society_and_Culture": ["talking politics with family", "moving to a new city",
                            "volunteering locally", "hosting a holiday dinner",
                            "joining a book club", "writing to a local council"],
}  # fmt: skip
QUESTIONS = [
    "How do I get started with {t} when I only have a little free time?",
    "What is the best way to stay motivated with {t} over a whole year?",
    "I keep giving up on {t}. What should I change in my approach?",
    "Any advice on {t} for someone on a tight budget?",
]
POSTS = [
    "Tried {t} again this weekend and it went better than last time, though I still rush it.",
    "My evenings are packed with work calls, so I only get about twenty minutes for {t}.",
    "Does anyone else find the online guides on {t} far too long and theoretical?",
    "Bought a cheap second-hand kit for {t}; not fancy, but it does the job for now.",
    "I learn best from short videos and hands-on practice, not from thick books.",
    "Finally cooked a proper dinner for friends. The sauce was a bit thin but they were kind.",
    "Cycling to work in the rain again. At least the coffee at the office is decent.",
    "I prefer advice that is blunt and practical; lists of vague tips drive me mad.",
    "Spent the whole Sunday reorganising my flat and feel oddly proud of it.",
    "My sister keeps telling me to join a group for {t}, but I am shy around strangers.",
    "Looking for free resources on {t}; paid courses are out of reach this month.",
    "Tracking my progress in a notebook helps me more than any app I have tried.",
]
ASPECTS = [
    ("Suggests practice routines that fit into twenty-minute evening slots",
     "My evenings are packed with work calls", "They have little time on weekdays."),
    ("Recommends free or very cheap resources instead of paid courses",
     "paid courses are out of reach this month", "Money is tight for them right now."),
    ("Favours short videos and hands-on exercises over long reading",
     "I learn best from short videos", "They dislike dry, theory-heavy material."),
    ("Uses a blunt, practical tone without vague motivational filler",
     "lists of vague tips drive me mad", "They want direct advice."),
    ("Proposes tracking progress with a simple paper notebook",
     "Tracking my progress in a notebook helps", "A notebook already works for them."),
    ("Offers ways to take part without meeting crowds of strangers",
     "I am shy around strangers", "Group settings make them uneasy."),
]  # fmt: skip


def write_synthetic_examples(path: Path, n: int = 500, seed: int = 0) -> Path:
    """N LaMP-style rows, each with 3 rubric aspects and 8 profile posts (synthetic)."""
    rng = random.Random(seed)
    cats = list(CATEGORIES)
    with open(path, "w", encoding="utf-8") as fh:
        for k in range(n):
            cat = cats[k % len(cats)]
            topic = rng.choice(CATEGORIES[cat])
            posts = rng.sample(POSTS, 8)
            profile = [
                {
                    "id": f"synth{k:04d}-p{j:02d}",
                    "category": rng.choice(cats),
                    "text": text.format(t=topic) + f" (post {j} of user {k})",
                }
                for j, text in enumerate(posts)
            ]
            aspects = [
                {"aspect": a, "evidence": e, "reason": r} for a, e, r in rng.sample(ASPECTS, 3)
            ]
            row = {
                "_note": SYNTHETIC_NOTE,
                "id": f"synth-{k:04d}",
                "user_id": f"synth-user-{k:04d}",
                "category": cat,
                "question": rng.choice(QUESTIONS).format(t=topic) + f" (#{k})",
                "profile": profile,
                "narrative": f"I am asking about {topic} because I want to make real progress.",
                "rubric_aspects": aspects,
            }
            fh.write(json.dumps(row) + "\n")
    return path


def write_config(workdir: Path, name: str, input_path: Path, base_url: str, conc: int) -> Path:
    cfg = {
        "run": {"name": name, "output_dir": str(workdir / "outputs"), "seed": 0},
        "input": {"format": "lamp", "path": str(input_path)},
        "backend": {
            "name": "openai",
            "model": MODEL,
            "openai": {"base_url": base_url, "max_concurrency": conc, "timeout_s": 120},
        },
        "rubrics": {"source": "given"},
        "responses": {"n": 2, "strategies": ["avoid_all"]},
    }
    path = workdir / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def quiet(_msg: str) -> None:
    pass


def prepare_run(config_path: Path, n_examples: int) -> Config:
    """Ingest and rubrics (given: no LLM), checked to be the workload described above.
    The config's server must be up: every stage asks it which model serves the run."""
    cfg = load_config(config_path)
    stats = run_pipeline(cfg, until="rubrics", progress=False, echo=quiet)
    rub = stats["rubrics"]
    if rub["rubrics"] != n_examples or rub["items_mean"] != 3:
        raise RuntimeError(f"unexpected rubrics stage output: {rub}")
    return cfg


def stage_requests(cfg: Config) -> list[ChatRequest]:
    """The responses stage's own request list, built by the stage's own code."""
    ctx = Context(config=cfg, run_dir=RunDir(cfg.run_dir), progress=False)
    try:
        stage = ResponseStage()
        rubrics = stage.load_rubrics(ctx, stage)
        donors = stage.donors(ctx, rubrics)
        skipped: Counter = Counter()
        requests = []
        for ex in stage.input_rows(ctx, "ingest"):
            if ex["example_id"] in rubrics:
                requests += stage.example_jobs(ctx, ex, rubrics, donors, skipped)[1]
    finally:
        ctx.close()
    return requests


def prepare(
    args: argparse.Namespace, work: Path, name: str, data: Path
) -> tuple[Config, list[ChatRequest]]:
    """A run directory through rubrics, and the responses stage's requests.

    Every stage asks the server which model serves it (the backend's identity is part of
    every request's key), so this runs against a server of its own; the stand-in reports
    the same identity at any URL, so the requests built here are the ones each
    measurement's fresh server receives."""
    with StandinProcess(args.latency_ms, args.sigma, seed=LATENCY_SEED) as server:
        cfg = prepare_run(write_config(work, name, data, server.base_url, args.concurrency),
                          args.examples)  # fmt: skip
        return cfg, stage_requests(cfg)


def measure_stage(cfg: Config) -> dict[str, Any]:
    c0, t0 = time.process_time(), time.perf_counter()
    stats = run_pipeline(cfg, only="responses", progress=False, echo=quiet)["responses"]
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    llm = stats["llm"]
    if stats["pending_examples"] or llm["failed"]:
        raise RuntimeError(f"responses stage had failures: {llm}")
    return {
        "seconds": wall,
        "cpu_s": cpu,
        "stage_seconds": stats["seconds"],  # the orchestrator's own timing of stage.run
        "llm_stream_seconds": llm["seconds"],  # inside LLMRunner.stream
        "examples": stats["examples"],
        "candidates": stats["candidates"],
        "requests": llm["requests"],
        "sent": llm["sent"],
    }


async def _backend_only(cfg: Config, requests: list[ChatRequest], cache_path: Path) -> int:
    backend = OpenAIBackend(cfg.backend)
    cache = RequestCache(cache_path)
    # text_reasks=0: the bare client it is compared with does not ask a cut answer again
    runner = LLMRunner(backend, cache, "responses", progress=False, text_reasks=0)
    ok = 0
    try:
        async for _, outcome in runner.stream(requests):
            ok += isinstance(outcome, Answer)
    finally:
        await backend.aclose()
        cache.close()
    return ok


def measure_backend(cfg: Config, requests: list[ChatRequest], cache_path: Path) -> dict[str, Any]:
    c0, t0 = time.process_time(), time.perf_counter()
    ok = asyncio.run(_backend_only(cfg, requests, cache_path))
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    if ok != len(requests):
        raise RuntimeError(f"backend alone: {len(requests) - ok} of {len(requests)} failed")
    return {"seconds": wall, "cpu_s": cpu, "requests": len(requests)}


def measure_one(
    kind: str, cfg: Config, requests: list[ChatRequest], backend_cache: Path, base_url: str
) -> dict[str, Any]:
    cfg.backend.openai.base_url = base_url
    if kind == "backend":
        return measure_backend(cfg, requests, backend_cache)
    r = measure_stage(cfg)
    if cached_keys(cfg.run_dir / "cache.sqlite", "responses") != {q.key for q in requests}:
        raise RuntimeError("the backend-only requests differ from the ones the stage sent")
    return r


def cached_keys(cache_path: Path, stage: str) -> set[str]:
    with sqlite3.connect(f"file:{cache_path}?mode=ro", uri=True) as db:
        return {k for (k,) in db.execute("SELECT key FROM responses WHERE stage=?", (stage,))}


def summarize(runs: list[dict[str, Any]], n_examples: int) -> dict[str, Any]:
    stage = [r for r in runs if r["kind"] == "stage"]
    backend = [r for r in runs if r["kind"] == "backend"]
    n_req = stage[0]["requests"]
    stage_s = statistics.median(r["seconds"] for r in stage)
    backend_s = statistics.median(r["seconds"] for r in backend)
    ratio = backend_s / stage_s
    return {
        "stage_seconds": round(stage_s, 3),
        "backend_seconds": round(backend_s, 3),
        "stage_examples_per_s": round(n_examples / stage_s, 2),
        "stage_requests_per_s": round(n_req / stage_s, 2),
        "backend_requests_per_s": round(n_req / backend_s, 2),
        "ratio_stage_over_backend": round(ratio, 3),
        "share_outside_waiting_by_ratio": round(1 - ratio, 3),
        "stage_cpu_over_wall": round(
            statistics.median(r["cpu_s"] / r["seconds"] for r in stage), 3
        ),
        "backend_cpu_over_wall": round(
            statistics.median(r["cpu_s"] / r["seconds"] for r in backend), 3
        ),
        "stage_seconds_outside_llm_stream": round(
            statistics.median(r["seconds"] - r["llm_stream_seconds"] for r in stage), 3
        ),
        "target": {"stage_over_backend_min": TARGET, "met": ratio >= TARGET},
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--examples", type=int, default=500, help="synthetic examples to generate")
    ap.add_argument("--concurrency", type=int, default=64, help="backend.openai.max_concurrency")
    ap.add_argument("--latency-ms", type=float, default=200.0, help="server's median latency")
    ap.add_argument("--sigma", type=float, default=0.8, help="log-normal spread of the latency")
    ap.add_argument("--repeats", type=int, default=3, help="measurements of each (median)")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where to write the JSON")
    from _smoke import add_flag as add_smoke_flag
    from _smoke import apply as apply_smoke

    add_smoke_flag(ap)
    args = ap.parse_args(argv)
    apply_smoke(args, examples=8, repeats=1, latency_ms=5.0)

    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-generation-") as tmp:
        work = Path(tmp)
        data = write_synthetic_examples(work / "synthetic_lamp.jsonl", args.examples)
        for rep in range(args.repeats):
            # a fresh run directory (and so a fresh cache) per repeat; the server's URL is
            # set per measurement (it is not part of any stage's fingerprint)
            cfg, requests = prepare(args, work, f"run{rep}", data)
            order = ("backend", "stage") if rep % 2 == 0 else ("stage", "backend")
            for kind in order:
                measure = functools.partial(
                    measure_one, kind, cfg, requests, work / f"backend-only-{rep}.sqlite"
                )
                r = measure_with_fresh_server(args, measure)
                r.update(kind=kind, repeat=rep)
                runs.append(r)
                n = r["requests"]
                print(
                    f"{kind:<8} r{rep}  {r['seconds']:7.2f} s  {n / r['seconds']:7.1f} req/s"
                    f"  cpu {r['cpu_s']:.2f} s  server cpu {r['server_cpu_s']:.2f} s",
                    flush=True,
                )

    summary = summarize(runs, args.examples)
    result = {
        "benchmark": "generation",
        "smoke": args.smoke,
        "examples": args.examples,
        "data": SYNTHETIC_NOTE,
        "workload": {
            "stage": "responses",
            "n": 2,
            "strategies": ["avoid_all"],
            "requests": runs[0]["requests"],
            "rubric_items_per_example": 3,
            "profile_posts_per_example": 8,
        },
        "concurrency": args.concurrency,
        "repeats": args.repeats,
        "latency_model": lognormal_model(args.latency_ms, args.sigma, args.concurrency),
        "server": "tests/standin_server.py in a separate process, restarted for every "
        f"measurement with latency seed {LATENCY_SEED} (the same latency draws for each)",
        "summary": summary,
        "runs": [
            {k: round(v, 3) if isinstance(v, float) else v for k, v in r.items()} for r in runs
        ],
        **run_metadata(),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")

    s = summary
    print(f"\n{args.examples} synthetic examples, {result['workload']['requests']} requests")
    print(
        f"stage:   {s['stage_seconds']:7.2f} s  {s['stage_examples_per_s']:7.1f} examples/s"
        f"  {s['stage_requests_per_s']:7.1f} req/s  cpu/wall {s['stage_cpu_over_wall']}"
    )
    print(
        f"backend: {s['backend_seconds']:7.2f} s  {'':19}"
        f"  {s['backend_requests_per_s']:7.1f} req/s  cpu/wall {s['backend_cpu_over_wall']}"
    )
    verdict = "met" if s["target"]["met"] else "NOT met"
    print(
        f"stage/backend throughput {s['ratio_stage_over_backend']} (target >= {TARGET}: "
        f"{verdict}); share outside waiting {s['share_outside_waiting_by_ratio']}"
    )
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
