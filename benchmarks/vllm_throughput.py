"""The vllm backend against raw ``vllm.LLM.chat`` on the same prompts, on one GPU.

Builds requests shaped like the responses stage from synthetic data (labelled synthetic,
not LaMP-QA): ``--users`` people with 10 past posts each; every example is one user and
one question, with a chosen and an avoid_all prompt rendered from the real templates
(``prompts/response_chosen.j2``, ``response_avoid_all.j2``), so prompts share the system
turn, the user's posts and the question (prefix caching applies), each with ``n`` samples
and its own seed. Both paths set ``ignore_eos``, so they generate the same number of tokens
(``max_tokens`` per sample) and the comparison is of the serving path only.

One engine serves every measurement: the backend's own (``VLLMBackend``, built from the
same config fields a run uses), and the raw path calls ``chat`` on that engine with all
requests in one call. The backend path is a stage's: ``LLMRunner`` + a fresh
``RequestCache`` + ``VLLMBackend.run`` (prefix-sorted, one ``LLM.chat`` per chunk), once
per ``--chunk-sizes`` value. The prefix cache is reset before every measurement, a warm-up
call comes first (a sampling kernel compiles on the first call of a process), the order
of measurements flips on every repeat, and the median of ``--repeats`` is kept.

Needs a CUDA GPU and vLLM; runs offline from a local model folder. With
``--load-format dummy`` the weights are random (a realistic size, no download, noise for
text), e.g. the 7B-shaped folder ``../shared/gpu/make_dummy_7b.py`` writes::

    python benchmarks/vllm_throughput.py --model /root/m7b --load-format dummy \\
        [--requests 1500] [--n 2] [--max-tokens 128] [--chunk-sizes 256,1024,4096] \\
        [--repeats 3] [--max-num-seqs 512] [--out benchmarks/results/vllm_throughput.json]

Writes the JSON (device name, versions, engine arguments, per-variant seconds, req/s,
output tokens/s, backend/raw ratios) and prints a table.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import platform
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from pipeline.backends.settings import BackendSection  # noqa: E402
from pipeline.backends.settings import VLLMSettings as VLLMSection  # noqa: E402
from pipeline.cache import RequestCache  # noqa: E402
from pipeline.chat import ChatRequest  # noqa: E402
from pipeline.io import write_json_atomic  # noqa: E402
from pipeline.llm import Answer, LLMRunner  # noqa: E402
from pipeline.prompts import load_template  # noqa: E402
from pipeline.stages.responses import derive_seed  # noqa: E402

DEFAULT_OUT = ROOT / "benchmarks" / "results" / "vllm_throughput.json"
SYNTHETIC_NOTE = "synthetic benchmark data (benchmarks/vllm_throughput.py); not from LaMP-QA"
TEMPERATURE, TOP_P, WORD_CAP = 0.8, 0.95, 100
TOPICS = [
    "sketching on the train", "jazz records", "a fantasy novella", "folk guitar",
    "night shifts", "running after knee surgery", "a PhD thesis", "freelance savings",
    "family dinners", "a new city", "online misinformation", "tipping abroad",
]  # fmt: skip
POST = (
    "Post {k} about {topic}: this week I tried a new approach, kept notes on what worked and "
    "what did not, and I am still figuring out how to fit it around work, money and the "
    "people I live with."
)


def build_requests(model: str, n_requests: int, users: int, n: int, max_tokens: int) -> list:
    """``n_requests`` ChatRequests: per example a chosen and an avoid_all prompt."""
    chosen, avoid = load_template("response_chosen"), load_template("response_avoid_all")
    requests: list[ChatRequest] = []
    example = 0
    while len(requests) < n_requests:
        user = example % users
        topic = TOPICS[user % len(TOPICS)]
        profile = [{"text": POST.format(k=k, topic=topic)} for k in range(10)]
        question = f"Question {example // users} from user {user}: how do I get better at {topic}?"
        items = [
            {"aspect": f"Fits the answer to {topic} (point {j}) for user {user}"} for j in range(3)
        ]
        for strategy, tmpl in (("chosen", chosen), ("avoid_all", avoid)):
            if len(requests) == n_requests:
                break
            msgs = tmpl.render(question=question, profile=profile, word_cap=WORD_CAP, items=items)
            requests.append(
                ChatRequest(
                    messages=msgs,
                    model=model,
                    temperature=TEMPERATURE,
                    top_p=TOP_P,
                    max_tokens=max_tokens,
                    n=n,
                    seed=derive_seed(0, f"bench-{example}", strategy, 0),
                )
            )
        example += 1
    return requests


def backend_config(args: argparse.Namespace, chunk_size: int) -> BackendSection:
    engine_args: dict[str, Any] = dict(args.engine_arg)
    if args.load_format:
        engine_args["load_format"] = args.load_format
    vllm: dict[str, Any] = {
        "chunk_size": chunk_size,
        "gpu_memory_utilization": args.gpu_memory_utilization,
        "max_num_seqs": args.max_num_seqs,
        "engine_args": engine_args,
    }
    if args.max_model_len:
        vllm["max_model_len"] = args.max_model_len
    return BackendSection(name="vllm", model=args.model, vllm=vllm)


def _reset_prefix_cache(llm: Any) -> None:
    reset = getattr(llm, "reset_prefix_cache", None)
    if callable(reset):
        reset()


def measure_raw(backend: Any, requests: list[ChatRequest]) -> dict[str, Any]:
    """All requests in one ``LLM.chat`` call on the backend's engine, in stage order."""
    params = [backend.sampling_params(r) for r in requests]
    convs = [r.message_dicts() for r in requests]
    _reset_prefix_cache(backend.llm)
    t0 = time.perf_counter()
    outs = backend.llm.chat(messages=convs, sampling_params=params, use_tqdm=False)
    seconds = time.perf_counter() - t0
    tokens = sum(len(o.token_ids) for out in outs for o in out.outputs)
    prompt = sum(len(out.prompt_token_ids or []) for out in outs)
    return {"seconds": seconds, "output_tokens": tokens, "prompt_tokens": prompt, "failed": 0}


def measure_backend(backend: Any, requests: list[ChatRequest], tmp: Path) -> dict[str, Any]:
    """The path a stage takes: LLMRunner + a fresh RequestCache + VLLMBackend.run."""

    async def go() -> dict[str, Any]:
        folder = Path(tempfile.mkdtemp(dir=tmp))
        tokens = prompt = failed = 0
        with RequestCache(folder / "cache.sqlite") as cache:
            # text_reasks=0: the bare client it is compared with does not ask a cut answer again
            runner = LLMRunner(backend, cache, "bench", progress=False, text_reasks=0)
            _reset_prefix_cache(backend.llm)
            t0 = time.perf_counter()
            async for _, outcome in runner.stream(requests):
                if isinstance(outcome, Answer):
                    tokens += outcome.result.completion_tokens
                    prompt += outcome.result.prompt_tokens
                else:
                    failed += 1
            seconds = time.perf_counter() - t0
        return {
            "seconds": seconds,
            "output_tokens": tokens,
            "prompt_tokens": prompt,
            "failed": failed,
        }

    return asyncio.run(go())


def summarise(runs: list[dict[str, Any]], n_requests: int) -> dict[str, Any]:
    med = statistics.median(r["seconds"] for r in runs)
    tokens = runs[0]["output_tokens"]
    return {
        "seconds_median": round(med, 3),
        "seconds_all": [round(r["seconds"], 3) for r in runs],
        "requests_per_s": round(n_requests / med, 2),
        "output_tokens": tokens,
        "output_tokens_per_s": round(tokens / med, 1),
        "prompt_tokens": runs[0]["prompt_tokens"],
        "failed": max(r["failed"] for r in runs),
    }


def device_name() -> str:
    try:
        import torch
    except ImportError:
        return "no CUDA device (torch not importable)"
    try:
        if torch.cuda.is_available():
            return torch.cuda.get_device_name(0)
    except Exception as exc:  # a broken CUDA setup: say so in the figures
        return f"unknown ({type(exc).__name__}: {exc})"[:200]
    return "no CUDA device"


def versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {"python": platform.python_version()}
    for name in ("vllm", "torch", "transformers"):
        try:
            out[name] = getattr(__import__(name), "__version__", None)
        except Exception:
            out[name] = None
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="a local model folder (or a model name)")
    ap.add_argument("--load-format", default=None, help="e.g. dummy: random weights, no files")
    ap.add_argument("--requests", type=int, default=1500)
    ap.add_argument("--n", type=int, default=2, help="samples per request")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--users", type=int, default=50, help="distinct profiles (shared prefixes)")
    ap.add_argument("--chunk-sizes", default=f"256,1024,{VLLMSection().chunk_size}")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-num-seqs", type=int, default=VLLMSection().max_num_seqs)
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    ap.add_argument("--max-model-len", type=int, default=2048)
    ap.add_argument(
        "--engine-arg",
        action="append",
        default=[],
        type=_engine_arg,
        metavar="KEY=JSON",
        help="another vllm.LLM keyword, value as JSON (repeatable), e.g. enforce_eager=true",
    )
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    from _smoke import add_flag as add_smoke_flag
    from _smoke import apply as apply_smoke

    add_smoke_flag(ap)
    args = ap.parse_args(argv)
    apply_smoke(args, requests=8, repeats=1, chunk_sizes="4", max_tokens=4, users=2)
    chunk_sizes = [int(c) for c in args.chunk_sizes.split(",") if c.strip()]

    from pipeline.backends.vllm_backend import VERIFIED_VLLM_VERSION, VLLMBackend

    class IgnoreEosBackend(VLLMBackend):
        extra_sampling = {"ignore_eos": True}  # both paths generate max_tokens per sample

    requests = build_requests(args.model, args.requests, args.users, args.n, args.max_tokens)
    t0 = time.perf_counter()
    backends = {c: IgnoreEosBackend(backend_config(args, c)) for c in chunk_sizes}
    engine_seconds = time.perf_counter() - t0
    first = backends[chunk_sizes[0]]
    assert all(b.llm is first.llm for b in backends.values())  # one engine for all

    warm = [ChatRequest(r.messages, r.model, TEMPERATURE, TOP_P, 16, 1, r.seed) for r in requests]
    measure_raw(first, warm[: min(64, len(warm))])  # compiles the sampling kernels

    variants = ["raw", *(f"backend@{c}" for c in chunk_sizes)]
    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
    with tempfile.TemporaryDirectory(prefix="vllm-bench-") as tmp:
        for rep in range(args.repeats):
            for v in variants if rep % 2 == 0 else variants[::-1]:
                if v == "raw":
                    runs[v].append(measure_raw(first, requests))
                else:
                    chunk = int(v.split("@")[1])
                    runs[v].append(measure_backend(backends[chunk], requests, Path(tmp)))
                print(f"  repeat {rep + 1} {v}: {runs[v][-1]['seconds']:.2f} s", flush=True)

    figures = {v: summarise(r, len(requests)) for v, r in runs.items()}
    raw = figures["raw"]
    for v in variants[1:]:
        f = figures[v]
        f["ratio_vs_raw"] = round(raw["seconds_median"] / f["seconds_median"], 3)
        f["same_output_tokens_as_raw"] = f["output_tokens"] == raw["output_tokens"]
    prompt_tokens = raw["prompt_tokens"] / max(len(requests), 1)
    result = {
        "benchmark": "vllm_throughput",
        "smoke": args.smoke,
        "device": device_name(),
        "versions": versions(),
        "verified_vllm_version": VERIFIED_VLLM_VERSION,
        "model": args.model,
        "load_format": args.load_format or "auto",
        "engine": first.engine_kwargs,
        "engine_load_seconds": round(engine_seconds, 1),
        "data": SYNTHETIC_NOTE,
        "workload": {
            "requests": len(requests),
            "shape": "responses stage: chosen + avoid_all prompts per example (real templates)",
            "users": args.users,
            "n": args.n,
            "max_tokens": args.max_tokens,
            "ignore_eos": True,
            "temperature": TEMPERATURE,
            "top_p": TOP_P,
            "prompt_tokens_mean": round(prompt_tokens, 1),
        },
        "repeats": args.repeats,
        "order": "raw then each chunk size, reversed on every other repeat; prefix cache reset "
        "before each measurement; one warm-up call first",
        "figures": figures,
        "timestamp": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": shlex.join(getattr(sys, "orig_argv", [sys.executable, *sys.argv])),
        "cpu_count": os.cpu_count(),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(args.out, result)

    vllm_version = result["versions"]["vllm"]
    print(f"device: {result['device']}  vllm {vllm_version}  engine {first.engine_kwargs}")
    print(f"{'variant':<16}{'median s':>10}{'req/s':>10}{'out tok/s':>12}{'vs raw':>8}")
    for v, f in figures.items():
        ratio = f.get("ratio_vs_raw", 1.0)
        print(
            f"{v:<16}{f['seconds_median']:>10.2f}{f['requests_per_s']:>10.1f}"
            f"{f['output_tokens_per_s']:>12.0f}{ratio:>8.3f}"
        )
    print(f"wrote {args.out}")
    return 0


def _engine_arg(text: str) -> tuple[str, Any]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=JSON, got {text!r}")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value  # a bare string, e.g. dtype=bfloat16


if __name__ == "__main__":
    sys.exit(main())
