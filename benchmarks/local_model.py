"""The llamacpp backend against bare ``llama_cpp.Llama.create_chat_completion``, on CPU,
on the SmolLM2-135M GGUF the `local` extra ships; and the sample run end to end on it.

Requests are the ones the stages send, rendered with the project's templates
(``prompts/``) from the first ``--examples`` examples of ``examples/sample_lamp.jsonl``
(hand-written sample data, not LaMP-QA) and their given rubric aspects: per example a
chosen and an avoid_all answer request (free text, temperature 0.8, top_p 0.95, ``n``
samples, seeds as the responses stage derives them) and a quality, a coverage and a
pairwise-blind verdict request (JSON schema, greedy, the judge's defaults: max_tokens 1024,
rationales up to 300 characters) about a fixed hand-written answer (labelled as such).

- backend: the path a stage takes: ``LLMRunner`` with a fresh ``RequestCache`` and the
  stage's validator (``schemas.parse``) over ``LlamaCppBackend``;
- bare: a loop calling ``create_chat_completion`` on a ``Llama`` built with the same
  arguments, one call per sample, the same messages, sampling (OpenAI's: top_k and min_p
  off), seeds (``sample_seed``) and max_tokens, JSON requests through
  ``response_format={"type": "json_object", "schema": ...}``.

Both engines' KV caches are reset before each measurement. Per thread count the two paths
run back to back, in an order that flips on every repeat, so a busy shared machine weighs
on both alike; ``os.getloadavg()`` is recorded around every measurement, and CPU seconds
beside wall seconds. The ratio is taken per repeat (backend tokens/s over bare tokens/s,
measured next to each other), and its median kept. A settings sweep (batch size, context
length) runs the backend alone. Then the sample run: ``prb run configs/sample.yaml`` with
the llamacpp backend (its defaults) and the overrides printed in the JSON, timed end to
end: trimmed (3 examples, n 1, two strategies) and/or in full.

    python benchmarks/local_model.py [--threads 1,2,4] [--repeats 3] [--examples 2]
        [--max-tokens 200] [--sweep] [--sweep-repeats 2] [--sample-run trimmed|full]...
        [--skip-compare] [--update] [--out benchmarks/results/local_model.json]

``--update`` keeps what --out already holds and replaces only the sections run now,
recording that command under ``updates``.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import platform
import random
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from pipeline.backends import llamacpp_backend as lb  # noqa: E402
from pipeline.core.io import write_json_atomic  # noqa: E402
from pipeline.engine.llm import Answer, LLMRunner  # noqa: E402
from pipeline.kinds.backend import BackendSection  # noqa: E402
from pipeline.kinds.settings import LLAMACPP_DEFAULT_MODEL  # noqa: E402
from pipeline.run.cache import RequestCache  # noqa: E402
from pipeline.stages.responses import derive_seed  # noqa: E402
from pipeline.types import schemas  # noqa: E402
from pipeline.types.chat import ChatRequest  # noqa: E402
from pipeline.types.prompts import load_template  # noqa: E402

DEFAULT_OUT = ROOT / "benchmarks" / "results" / "local_model.json"
SAMPLE = ROOT / "examples" / "sample_lamp.jsonl"
# A fixed answer for the verdict prompts (hand-written for this benchmark, not model output).
JUDGED_ANSWER = (
    "Start small: practise for ten minutes a day on the train, keep a notebook of what "
    "worked, and ask one friend for honest feedback each week."
)
JUDGED_OTHER = "Read a thick textbook from cover to cover before trying anything yourself."


def _examples(k: int) -> list[dict[str, Any]]:
    rows = [json.loads(line) for line in SAMPLE.read_text(encoding="utf-8").splitlines() if line]
    return rows[:k]


def build_requests(k: int, n: int, max_tokens: int) -> list[tuple[ChatRequest, str]]:
    """(request, kind) for the first ``k`` sample examples, as the stages build them."""
    m = LLAMACPP_DEFAULT_MODEL
    out: list[tuple[ChatRequest, str]] = []
    q_schema = schemas.quality_schema(1024, 300)
    p_schema = schemas.pairwise_schema(1024, 300)
    for ex in _examples(k):
        items = [{"item_id": f"a{j:02d}", "aspect": a} for j, a in enumerate(ex["rubric_aspects"])]
        common = {"question": ex["question"], "profile": ex["profile"][:10], "word_cap": 100}
        for strategy in ("chosen", "avoid_all"):
            msgs = load_template(f"response_{strategy}").render(items=items, **common)
            seed = derive_seed(0, ex["id"], strategy, 0)
            out.append(
                (
                    ChatRequest(
                        messages=msgs,
                        model=m,
                        temperature=0.8,
                        top_p=0.95,
                        max_tokens=max_tokens,
                        n=n,
                        seed=seed,
                    ),
                    "free",
                )
            )
        c_schema, c_tokens = schemas.coverage_schema(len(items), 1024, 300)
        keys = schemas.coverage_keys(len(items))
        points = [{"key": k, "aspect": it["aspect"]} for k, it in zip(keys, items, strict=True)]
        judge = [
            ("judge_quality", {"answer": JUDGED_ANSWER}, q_schema, 1024),
            ("judge_coverage", {"answer": JUDGED_ANSWER, "items": points}, c_schema, c_tokens),
            (
                "judge_pairwise_blind",
                {"answer_a": JUDGED_ANSWER, "answer_b": JUDGED_OTHER},
                p_schema,
                1024,
            ),
        ]
        for template, values, schema, tokens in judge:
            msgs = load_template(template).render(question=ex["question"], **values)
            out.append(
                (
                    ChatRequest(
                        messages=msgs,
                        model=m,
                        temperature=0.0,
                        top_p=1.0,
                        max_tokens=tokens,
                        n=1,
                        seed=0,
                        # as the stages send it to llama.cpp: with its string bounds
                        json_schema=schema,
                    ),
                    "json",
                )
            )
    return out


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def measure_backend(backend: Any, requests: list[ChatRequest], tmp: Path) -> dict[str, Any]:
    """A stage's path: LLMRunner + a fresh cache + the stage's JSON validator."""

    def validate(req: ChatRequest, text: str) -> Any:
        return schemas.parse(req.json_schema, text) if req.json_schema is not None else text

    async def go() -> dict[str, Any]:
        folder = Path(tempfile.mkdtemp(dir=tmp))
        texts: list[list[str]] = [[] for _ in requests]
        tokens = prompt = failed = 0
        with RequestCache(folder / "cache.sqlite") as cache:
            runner = LLMRunner(backend, cache, "bench", progress=False)
            backend.llm.reset()
            load0, cpu0, t0 = _load(), _cpu(), time.perf_counter()
            async for i, outcome in runner.stream(requests, validate):
                if isinstance(outcome, Answer):
                    texts[i] = [c.text for c in outcome.result.choices]
                    tokens += outcome.result.completion_tokens
                    prompt += outcome.result.prompt_tokens
                else:
                    failed += 1
            seconds, cpu = time.perf_counter() - t0, _cpu() - cpu0
        return {
            "seconds": round(seconds, 3),
            "cpu_seconds": round(cpu, 3),
            "output_tokens": tokens,
            "prompt_tokens": prompt,
            "failed": failed,
            "reasks": runner.stats.reasks,
            "sent": runner.stats.sent,
            "load_before": load0,
            "load_after": _load(),
            "texts": texts,
        }

    return asyncio.run(go())


def measure_bare(llm: Any, requests: list[ChatRequest]) -> dict[str, Any]:
    """A plain loop over create_chat_completion, one call per sample, in input order."""
    texts: list[list[str]] = []
    tokens = prompt = 0
    llm.reset()
    load0, cpu0, t0 = _load(), _cpu(), time.perf_counter()
    for req in requests:
        fmt = None
        if req.json_schema is not None:
            fmt = {"type": "json_object", "schema": req.json_schema}
        samples = []
        for i in range(req.n):
            out = llm.create_chat_completion(
                messages=req.message_dicts(),
                temperature=req.temperature,
                top_p=req.top_p,
                top_k=0,
                min_p=0.0,
                repeat_penalty=1.0,
                max_tokens=req.max_tokens,
                seed=lb.sample_seed(req.seed, i),
                response_format=fmt,
            )
            samples.append(out["choices"][0]["message"]["content"] or "")
            tokens += out["usage"]["completion_tokens"]
            if i == 0:
                prompt += out["usage"]["prompt_tokens"]
        texts.append(samples)
    seconds, cpu = time.perf_counter() - t0, _cpu() - cpu0
    return {
        "seconds": round(seconds, 3),
        "cpu_seconds": round(cpu, 3),
        "output_tokens": tokens,
        "prompt_tokens": prompt,
        "failed": 0,
        "load_before": load0,
        "load_after": _load(),
        "texts": texts,
    }


def rates(run: dict[str, Any], n_requests: int) -> dict[str, Any]:
    return {
        "tokens_per_s": round(run["output_tokens"] / run["seconds"], 2),
        "requests_per_s": round(n_requests / run["seconds"], 3),
        "tokens_per_cpu_s": round(run["output_tokens"] / max(run["cpu_seconds"], 1e-9), 2),
    }


def section(threads: int, **settings: Any) -> BackendSection:
    return BackendSection(name="llamacpp", llamacpp={"threads": threads, **settings})


def compare(args: argparse.Namespace, requests: list[ChatRequest], tmp: Path) -> dict[str, Any]:
    """Backend vs bare per thread count, paired per repeat, order flipped each repeat."""
    import llama_cpp

    path = lb.resolve_model(LLAMACPP_DEFAULT_MODEL)
    n_req = len(requests)
    results: dict[str, Any] = {}
    engines = {}
    for t in args.threads:
        cfg = section(t)
        engines[t] = (lb.LlamaCppBackend(cfg), llama_cpp.Llama(**lb.engine_kwargs(cfg, path)))
        results[str(t)] = {"backend": [], "bare": [], "ratio_tokens_per_s": []}
    # one unmeasured pass per path first: page the model in, warm the caches
    warm_backend, warm_llm = engines[args.threads[0]]
    measure_backend(warm_backend, requests[:1], tmp)
    measure_bare(warm_llm, requests[:1])
    for rep in range(args.repeats):
        order = list(args.threads)
        random.Random(rep).shuffle(order)
        for t in order:
            backend, llm = engines[t]
            paths = ["backend", "bare"] if (rep + t) % 2 == 0 else ["bare", "backend"]
            pair: dict[str, Any] = {}
            for p in paths:
                run = (
                    measure_backend(backend, requests, tmp)
                    if p == "backend"
                    else (measure_bare(llm, requests))
                )
                run.update(rates(run, n_req), repeat=rep, order=paths.index(p))
                pair[p] = run
                print(
                    f"threads {t} rep {rep} {p:7s} {run['seconds']:7.1f} s "
                    f"{run['tokens_per_s']:6.1f} tok/s  load {run['load_before']}",
                    flush=True,
                )
            same = sum(
                a == b for a, b in zip(pair["backend"]["texts"], pair["bare"]["texts"], strict=True)
            )
            for p in ("backend", "bare"):
                pair[p].pop("texts")
                results[str(t)][p].append(pair[p])
            results[str(t)]["ratio_tokens_per_s"].append(
                round(pair["backend"]["tokens_per_s"] / pair["bare"]["tokens_per_s"], 3)
            )
            results[str(t)].setdefault("identical_answers", []).append(f"{same}/{n_req}")
    summary = {}
    for t, r in results.items():
        summary[t] = {
            p: {
                k: statistics.median(run[k] for run in r[p])
                for k in ("tokens_per_s", "requests_per_s", "tokens_per_cpu_s")
            }
            for p in ("backend", "bare")
        }
        summary[t]["ratio_tokens_per_s_median"] = statistics.median(r["ratio_tokens_per_s"])
        # CPU seconds the process spent: what a busy machine's waits do not inflate
        summary[t]["ratio_tokens_per_cpu_s_median"] = round(
            statistics.median(
                b["tokens_per_cpu_s"] / a["tokens_per_cpu_s"]
                for b, a in zip(r["backend"], r["bare"], strict=True)
            ),
            3,
        )
        summary[t]["ratio_requests_per_s_median"] = round(
            statistics.median(
                b["requests_per_s"] / a["requests_per_s"]
                for b, a in zip(r["backend"], r["bare"], strict=True)
            ),
            3,
        )
    return {"runs": results, "summary": summary}


def sweep(args: argparse.Namespace, requests: list[ChatRequest], tmp: Path) -> dict[str, Any]:
    """The backend alone under other settings than the defaults, at the first thread
    count; interleaved."""
    t = args.threads[0]
    variants = {
        "default": {},
        "batch_size=128": {"batch_size": 128},
        "batch_size=2048": {"batch_size": 2048},
        "context_length=4096": {"context_length": 4096},
    }
    backends = {}
    for name, settings in variants.items():
        t0 = time.perf_counter()
        backends[name] = lb.LlamaCppBackend(section(t, **settings))
        backends[name].load_seconds = round(time.perf_counter() - t0, 3)
    out: dict[str, Any] = {
        name: {"load_seconds": b.load_seconds, "runs": []} for name, b in backends.items()
    }
    for rep in range(args.sweep_repeats):
        names = list(variants)
        random.Random(100 + rep).shuffle(names)
        for name in names:
            run = measure_backend(backends[name], requests, tmp)
            run.pop("texts")
            run.update(rates(run, len(requests)), repeat=rep)
            out[name]["runs"].append(run)
            print(
                f"sweep {name:20s} rep {rep} {run['seconds']:7.1f} s "
                f"{run['tokens_per_s']:6.1f} tok/s  load {run['load_before']}",
                flush=True,
            )
    for name in variants:
        runs = out[name]["runs"]
        out[name]["tokens_per_s_median"] = statistics.median(r["tokens_per_s"] for r in runs)
        out[name]["seconds_median"] = statistics.median(r["seconds"] for r in runs)
    return {"threads": t, "variants": variants, "results": out}


SAMPLE_OVERRIDES = [
    "backend.name=llamacpp",
    "backend.model=",  # the default: the packaged SmolLM2-135M GGUF
    # the README's command: its own run, never the stand-in's outputs/sample
    "run.name=sample-local",
]
# --sample-run trimmed: 3 of the 12 examples, one answer per side, two rejected strategies
SAMPLE_TRIM = ["input.limit=3", "responses.n=1", "responses.strategies=[avoid_all, violate_one]"]


def sample_requests(summary: Any) -> dict[str, Any]:
    """What a sample run sent, from its `prb run --json` summary: the totals with the
    re-asks named (``sent`` counts them too: an unfinished answer is asked again with
    twice the tokens), and per LLM stage its requests, re-asks and seconds."""
    if not isinstance(summary, dict):
        return {}
    totals = summary.get("requests") or {}
    out: dict[str, Any] = {
        k: totals.get(k) for k in ("sent", "cached", "failed", "reasks", "tokens")
    }
    out["per_stage"] = {
        name: {"seconds": stage.get("seconds"), **stage["requests"]}
        for name, stage in (summary.get("stages") or {}).items()
        if isinstance(stage, dict) and isinstance(stage.get("requests"), dict)
    }
    return out


def sample_run(tmp: Path, kind: str) -> dict[str, Any]:
    """`prb run configs/sample.yaml` on the local model (trimmed or in full), timed end to
    end in a subprocess; the output folder is a temporary one. The time includes the
    re-asks, which ``requests`` counts (``reasks``, and per stage)."""
    overrides = SAMPLE_OVERRIDES + (SAMPLE_TRIM if kind == "trimmed" else [])
    overrides = [*overrides, f"run.output_dir={tmp / ('sample-' + kind)}"]
    cmd = [
        sys.executable,
        "-m",
        "pipeline.cli",
        "run",
        "configs/sample.yaml",
        "--no-progress",
        "--json",
    ] + [x for o in overrides for x in ("--set", o)]
    load0, t0 = _load(), time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    summary: Any = None
    try:
        summary = json.loads(proc.stdout)
    except ValueError:
        summary = proc.stdout[-2000:]
    return {
        "kind": kind,
        "command": "prb run configs/sample.yaml --no-progress --json "
        + " ".join(f"--set {shlex.quote(o)}" for o in overrides[:-1]),
        "exit_code": proc.returncode,
        "seconds": round(seconds, 1),
        "load_before": load0,
        "load_after": _load(),
        "requests": sample_requests(summary),
        "summary": summary,
        "stderr_tail": proc.stderr[-1500:],
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", default="1,2,4", help="thread counts, comma-separated")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--examples", type=int, default=2, help="sample examples to build from")
    ap.add_argument("--n", type=int, default=2, help="samples per free-text request")
    ap.add_argument("--max-tokens", type=int, default=200, help="free-text max_tokens")
    ap.add_argument("--sweep", action="store_true", help="also batch size / context length")
    ap.add_argument("--sweep-repeats", type=int, default=2)
    ap.add_argument(
        "--sample-run",
        action="append",
        choices=["trimmed", "full"],
        default=[],
        help="also time the sample run on the local model (repeatable)",
    )
    ap.add_argument("--skip-compare", action="store_true")
    ap.add_argument(
        "--update",
        action="store_true",
        help="keep the other sections of --out; replace only those run now (listed, with "
        "this command, under 'updates')",
    )
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    from _smoke import add_flag as add_smoke_flag
    from _smoke import apply as apply_smoke

    add_smoke_flag(ap)
    args = ap.parse_args(argv)
    apply_smoke(args, threads="1", repeats=1, examples=1, n=1, max_tokens=8, sweep=False,
                sample_run=[], update=False)  # fmt: skip
    args.threads = [int(x) for x in args.threads.split(",")]

    import llama_cpp

    built = build_requests(args.examples, args.n, args.max_tokens)
    requests = [r for r, _ in built]
    command = "python benchmarks/local_model.py " + shlex.join(
        sys.argv[1:] if argv is None else argv
    )
    date = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    result: dict[str, Any] = {
        "benchmark": "local_model",
        "smoke": args.smoke,
        "command": command,
        "date": date,
        "machine": {
            "platform": platform.platform(),
            "cpus_usable": lb.default_threads(),
            "cpu_count": os.cpu_count(),
            "load_at_start": _load(),
            "note": "shared with other engineers' jobs; see load_before/after",
        },
        "versions": {
            "python": platform.python_version(),
            "llama_cpp_python": llama_cpp.__version__,
        },
        "model": LLAMACPP_DEFAULT_MODEL,
        "requests": {
            "total": len(requests),
            "free_text": sum(k == "free" for _, k in built),
            "json_schema": sum(k == "json" for _, k in built),
            "samples": sum(r.n for r in requests),
            "data": "examples/sample_lamp.jsonl (hand-written sample data), first "
            f"{args.examples} examples; judged answers hand-written",
            "free_text_max_tokens": args.max_tokens,
            "n": args.n,
        },
        "defaults": BackendSection(name="llamacpp").llamacpp.model_dump(),
    }
    if args.update and args.out.exists():
        earlier = json.loads(args.out.read_text(encoding="utf-8"))
        sections = [
            x
            for x, on in (
                ("compare", not args.skip_compare),
                ("sweep", args.sweep),
                ("sample_run", bool(args.sample_run)),
            )
            if on
        ]
        update = {
            "command": command,
            "date": date,
            "sections": sections,
            "load_at_start": result["machine"]["load_at_start"],
        }
        earlier.setdefault("updates", []).append(update)
        result = earlier
    with tempfile.TemporaryDirectory(prefix="prb-local-bench-") as tmp_name:
        tmp = Path(tmp_name)
        if not args.skip_compare:
            result["compare"] = compare(args, requests, tmp)
            write_json_atomic(args.out, result)
        if args.sweep:
            result["sweep"] = sweep(args, requests, tmp)
            write_json_atomic(args.out, result)
        for kind in args.sample_run:
            lb.shutdown_engines()
            result.setdefault("sample_run", {})[kind] = sample_run(tmp, kind)
            write_json_atomic(args.out, result)
        if args.update and "updates" in result:
            result["updates"][-1]["load_at_end"] = _load()
        else:
            result["machine"]["load_at_end"] = _load()
        write_json_atomic(args.out, result)
    print(json.dumps(result.get("compare", {}).get("summary", {}), indent=1))


if __name__ == "__main__":
    main()
