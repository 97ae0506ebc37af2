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

``--stage judge`` measures the judge instead: its real requests (quality, coverage and
both pairwise verdicts, rendered from ``prompts/judge_*.j2`` over synthetic answers, each
with the JSON schema the stage sends, ``schemas.wire``) through the backend (``LLMRunner``
with the stage's validators, re-asks off so the request count is fixed) and through raw
``LLM.chat`` with the same schemas, against raw unconstrained ``LLM.chat`` on the same
prompts with the same ``max_tokens`` and ``ignore_eos`` (no grammar at all): the
constrained rate over the unconstrained one, in output tokens per second, is what the
grammar engine costs. That loss is split by a third raw variant, ``any_text_raw``: the
unconstrained requests through vLLM's structured-output path with a grammar that allows
any text (``structured_output.ANY_TEXT``, next to nothing to compute), so what vLLM's path
costs by itself and what the judge's schemas add over it are each a ratio. (That grammar
may end: a request whose model picks the end token there is ended by vLLM; every rate
counts the tokens written.)
``--bounded-requests K`` adds K requests with the full schemas (every rationale's
``maxLength``: what the stage sent before), measured last::

    python benchmarks/vllm_throughput.py --stage judge --model /root/m7b --load-format dummy \
        [--requests 512] [--max-tokens 384] [--bounded-requests 48]

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
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from pipeline.core.io import write_json_atomic  # noqa: E402
from pipeline.engine.llm import Answer, Job, LLMRunner  # noqa: E402
from pipeline.kinds.backend import BackendSection  # noqa: E402
from pipeline.kinds.settings import VLLMSettings as VLLMSection  # noqa: E402
from pipeline.run.cache import RequestCache  # noqa: E402
from pipeline.stages.responses import derive_seed  # noqa: E402
from pipeline.types import schemas  # noqa: E402
from pipeline.types.chat import ChatRequest  # noqa: E402
from pipeline.types.prompts import load_template  # noqa: E402

sys.path.insert(0, str(ROOT / "benchmarks"))
from structured_output import ANY_TEXT  # noqa: E402

DEFAULT_OUT = ROOT / "benchmarks" / "results" / "vllm_throughput.json"
DEFAULT_JUDGE_OUT = ROOT / "benchmarks" / "results" / "vllm_judge.json"
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


JUDGE_ANSWER = (
    "Start with {topic} for ten minutes a day, keep a short log of what you tried, and change "
    "one thing a week. Ask someone who has done it for a second opinion, and plan around the "
    "hours you really have. Answer {k}."
)


def build_judge_requests(
    model: str, n_requests: int, users: int, max_tokens: int, bounded: bool = False
) -> list[tuple[ChatRequest, dict[str, Any]]]:
    """``n_requests`` (request, full schema) pairs shaped like the judge stage's: per
    example a quality and a coverage verdict for two answers, then the pair's rubric-aware
    and rubric-blind verdicts in both orders. Sent with ``schemas.wire`` of the schema, or
    the full schema itself with ``bounded``."""
    t = {k: load_template(f"judge_{k}") for k in ("quality", "coverage")}
    t["aware"] = load_template("judge_pairwise_aware")
    t["blind"] = load_template("judge_pairwise_blind")
    q_schema = schemas.quality_schema(max_tokens)
    p_schema = schemas.pairwise_schema(max_tokens)
    c_schema, c_tokens = schemas.coverage_schema(3, max_tokens)
    out: list[tuple[ChatRequest, dict[str, Any]]] = []
    example = 0
    while len(out) < n_requests:
        user = example % users
        topic = TOPICS[user % len(TOPICS)]
        question = f"Question {example // users} from user {user}: how do I get better at {topic}?"
        aspects = [f"Fits the answer to {topic} (point {j}) for user {user}" for j in range(3)]
        points = [{"key": k, "aspect": a}
                  for k, a in zip(schemas.coverage_keys(3), aspects, strict=True)]  # fmt: skip
        answers = [JUDGE_ANSWER.format(topic=topic, k=f"{example}-{i}") for i in range(2)]
        asks: list[tuple[Any, dict[str, Any], int]] = []
        for a in answers:
            asks.append((t["quality"].render(question=question, answer=a), q_schema, max_tokens))
            msgs = t["coverage"].render(question=question, answer=a, items=points)
            asks.append((msgs, c_schema, c_tokens))
        items = [{"aspect": a} for a in aspects]
        for kind in ("aware", "blind"):
            for a, b in (answers, answers[::-1]):
                msgs = t[kind].render(question=question, answer_a=a, answer_b=b, items=items)
                asks.append((msgs, p_schema, max_tokens))
        for msgs, full, tokens in asks:
            if len(out) == n_requests:
                break
            sent = full if bounded else schemas.wire(full)
            out.append((ChatRequest(msgs, model, 0.0, 1.0, tokens, 1, 0, json_schema=sent), full))
        example += 1
    return out


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
    if getattr(args, "structured_outputs_backend", None):
        vllm["structured_outputs_backend"] = args.structured_outputs_backend
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


def measure_backend(
    backend: Any,
    requests: list[ChatRequest],
    tmp: Path,
    fulls: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The path a stage takes: LLMRunner + a fresh RequestCache + VLLMBackend.run; with
    ``fulls`` (the judge), each answer read as the judge stage reads it."""

    async def go() -> dict[str, Any]:
        folder = Path(tempfile.mkdtemp(dir=tmp))
        tokens = prompt = failed = cut = 0
        with RequestCache(folder / "cache.sqlite") as cache:
            # text_reasks=0: the bare client it is compared with does not ask a cut answer
            # again; max_reasks=0: neither does it re-ask an invalid one
            runner = LLMRunner(backend, cache, "bench", progress=False, text_reasks=0, max_reasks=0)
            _reset_prefix_cache(backend.llm)
            t0 = time.perf_counter()
            if fulls is None:
                stream = runner.stream(requests)
            else:
                by_key = {r.key: f for r, f in zip(requests, fulls, strict=True)}
                jobs = [Job(r, i, *_readers(by_key[r.key])) for i, r in enumerate(requests)]
                stream = runner.run(jobs, total=len(jobs))
            async for _, outcome in stream:
                if isinstance(outcome, Answer):
                    cut += bool(outcome.parsed) and bool(getattr(outcome.parsed[0], "cut", 0))
                else:
                    failed += 1
            seconds = time.perf_counter() - t0
            # every answer the engine wrote, also one that failed its check (the judge: an
            # answer cut before its decisions, which the stage would ask again)
            tokens, prompt = runner.stats.completion_tokens, runner.stats.prompt_tokens
        out = {"seconds": seconds, "output_tokens": tokens, "prompt_tokens": prompt}
        out["failed"] = failed
        if fulls is not None:
            out["read_up_to_a_cut"] = cut
        return out

    return asyncio.run(go())


def _readers(full: dict[str, Any]) -> tuple[Any, Any]:
    """The judge stage's validator and salvage for a schema (pipeline/stages/judge.py)."""

    def validate(req: ChatRequest, text: str) -> Any:
        return schemas.read(full, text, clip=True)

    def salvage(req: ChatRequest, text: str) -> Any:
        return schemas.read(full, text, cut=True, clip=True)

    return validate, salvage


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


def alternate(
    runs: dict[str, list[dict[str, Any]]], repeats: int, measure: Callable[[str], dict[str, Any]]
) -> None:
    """Each variant of ``runs`` measured ``repeats`` times, the order reversed every other
    repeat (so no variant always runs on a warmer engine), each run printed."""
    variants = list(runs)
    for rep in range(repeats):
        for v in variants if rep % 2 == 0 else variants[::-1]:
            runs[v].append(measure(v))
            print(f"  repeat {rep + 1} {v}: {runs[v][-1]['seconds']:.2f} s", flush=True)


def header(args: argparse.Namespace, first: Any, engine_seconds: float) -> dict[str, Any]:
    """What every results file of this script says of the machine, the engine and the data."""
    from pipeline.backends.vllm_backend import VERIFIED_VLLM_VERSION

    return {
        "smoke": args.smoke,
        "device": device_name(),
        "versions": versions(),
        "verified_vllm_version": VERIFIED_VLLM_VERSION,
        "model": args.model,
        "load_format": args.load_format or "auto",
        "engine": first.engine_kwargs,
        "engine_load_seconds": round(engine_seconds, 1),
        "data": SYNTHETIC_NOTE,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="a local model folder (or a model name)")
    ap.add_argument("--load-format", default=None, help="e.g. dummy: random weights, no files")
    ap.add_argument("--requests", type=int, default=1500)
    ap.add_argument("--n", type=int, default=2, help="samples per request")
    ap.add_argument(
        "--max-tokens", type=int, default=None, help="per request (default 128; judge: 384)"
    )
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
    ap.add_argument(
        "--stage",
        choices=("responses", "judge"),
        default="responses",
        help="the stage whose requests are measured (judge: with its JSON schemas)",
    )
    ap.add_argument(
        "--bounded-requests",
        type=int,
        default=0,
        help="judge: also this many requests with the full (maxLength-bounded) schemas, last",
    )
    ap.add_argument(
        "--structured-outputs-backend",
        default=None,
        help="backend.vllm.structured_outputs_backend (default: the config's)",
    )
    ap.add_argument("--out", type=Path, default=None)
    from _smoke import add_flag as add_smoke_flag
    from _smoke import apply as apply_smoke

    add_smoke_flag(ap)
    args = ap.parse_args(argv)
    if args.out is None:
        args.out = DEFAULT_JUDGE_OUT if args.stage == "judge" else DEFAULT_OUT
    if args.max_tokens is None:
        args.max_tokens = 384 if args.stage == "judge" else 128
    if args.stage == "judge":
        apply_smoke(args, requests=8, repeats=1, chunk_sizes="4", users=2, bounded_requests=2)
        return judge_main(args)
    apply_smoke(args, requests=8, repeats=1, chunk_sizes="4", max_tokens=4, users=2)
    chunk_sizes = [int(c) for c in args.chunk_sizes.split(",") if c.strip()]

    from pipeline.backends.vllm_backend import VLLMBackend

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

        def measure(v: str) -> dict[str, Any]:
            if v == "raw":
                return measure_raw(first, requests)
            return measure_backend(backends[int(v.split("@")[1])], requests, Path(tmp))

        alternate(runs, args.repeats, measure)

    figures = {v: summarise(r, len(requests)) for v, r in runs.items()}
    raw = figures["raw"]
    for v in variants[1:]:
        f = figures[v]
        f["ratio_vs_raw"] = round(raw["seconds_median"] / f["seconds_median"], 3)
        f["same_output_tokens_as_raw"] = f["output_tokens"] == raw["output_tokens"]
    prompt_tokens = raw["prompt_tokens"] / max(len(requests), 1)
    result = {
        "benchmark": "vllm_throughput",
        **header(args, first, engine_seconds),
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


def judge_main(args: argparse.Namespace) -> int:
    """``--stage judge``: the judge's constrained requests against unconstrained ones."""
    from dataclasses import replace

    from pipeline.backends.vllm_backend import VLLMBackend

    class IgnoreEosBackend(VLLMBackend):
        extra_sampling = {"ignore_eos": True}

    class AnyTextBackend(VLLMBackend):
        """Free requests through vLLM's structured-output path with a grammar that allows
        any text (and costs next to nothing): what that path costs by itself."""

        @property  # type: ignore[override]
        def extra_sampling(self) -> dict[str, Any]:
            # a fresh constraint for each request: vLLM writes its engine choice into it
            return {
                "ignore_eos": True,
                "structured_outputs": self._StructuredOutputsParams(regex=ANY_TEXT),
            }

    chunk_sizes = [int(c) for c in args.chunk_sizes.split(",") if c.strip()]
    # sent as a run sends them to this engine: the full schemas to llguidance, which
    # enforces string bounds cheaply, the wire form to xgrammar (schemas.for_engine)
    ident = VLLMBackend.identify(backend_config(args, chunk_sizes[0]), [args.model])
    sent_full = bool(ident.get(schemas.SCHEMA_BOUNDS))
    pairs = build_judge_requests(
        args.model, args.requests, args.users, args.max_tokens, bounded=sent_full
    )
    requests = [r for r, _ in pairs]
    fulls = [f for _, f in pairs]
    # the same prompts and max_tokens, no grammar, generating max_tokens each (ignore_eos)
    free = [replace(r, json_schema=None) for r in requests]
    t0 = time.perf_counter()
    backends = {c: VLLMBackend(backend_config(args, c)) for c in chunk_sizes}
    first = backends[chunk_sizes[0]]
    free_backend = IgnoreEosBackend(backend_config(args, chunk_sizes[0]))
    any_text_backend = AnyTextBackend(backend_config(args, chunk_sizes[0]))
    engine_seconds = time.perf_counter() - t0
    engines = [*backends.values(), free_backend, any_text_backend]
    assert all(b.llm is first.llm for b in engines)  # one engine

    # warm-up: the sampling kernels, and each distinct grammar once
    measure_raw(free_backend, [replace(r, max_tokens=16) for r in free[:64]])
    measure_raw(any_text_backend, [replace(r, max_tokens=16) for r in free[:64]])
    distinct = {json.dumps(r.json_schema, sort_keys=True): r for r in requests}
    measure_raw(first, [replace(r, max_tokens=16) for r in distinct.values()])

    variants = [
        "unconstrained_raw",
        "any_text_raw",
        "constrained_raw",
        *(f"backend@{c}" for c in chunk_sizes),
    ]
    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
    with tempfile.TemporaryDirectory(prefix="vllm-judge-") as tmp:

        def measure(v: str) -> dict[str, Any]:
            if v == "unconstrained_raw":
                return measure_raw(free_backend, free)
            if v == "any_text_raw":
                return measure_raw(any_text_backend, free)
            if v == "constrained_raw":
                return measure_raw(first, requests)
            chunk = int(v.split("@")[1])
            return measure_backend(backends[chunk], requests, Path(tmp), fulls)

        alternate(runs, args.repeats, measure)

    figures = {v: summarise(r, len(requests)) for v, r in runs.items()}
    free_rate = figures["unconstrained_raw"]["output_tokens_per_s"]
    for v in variants[1:]:
        figures[v]["tokens_per_s_vs_unconstrained"] = round(
            figures[v]["output_tokens_per_s"] / free_rate, 3
        )
        if v.startswith("backend@"):
            figures[v]["read_up_to_a_cut"] = runs[v][0].get("read_up_to_a_cut")
    any_rate = figures["any_text_raw"]["output_tokens_per_s"]
    split = {
        "what": "the constrained rate's loss, split: vLLM's structured-output path with a "
        "grammar that allows any text (any_text_raw over unconstrained_raw), then the judge's "
        "schemas over that grammar (constrained_raw over any_text_raw)",
        "structured_output_path": round(any_rate / free_rate, 3),
        "judge_schemas_over_any_text": round(
            figures["constrained_raw"]["output_tokens_per_s"] / max(any_rate, 1e-9), 3
        ),
    }
    result: dict[str, Any] = {
        "benchmark": "vllm_throughput --stage judge",
        **header(args, first, engine_seconds),
        "workload": {
            "requests": len(requests),
            "shape": "judge stage: per example quality and coverage (3 points) for two answers, "
            "then rubric-aware and rubric-blind pairwise in both orders (real templates); "
            "schemas as the stage sends them (schemas.for_engine)",
            "schemas_sent_with_bounds": sent_full,
            "distinct_schemas": len(distinct),
            "users": args.users,
            "max_tokens": args.max_tokens,
            "temperature": 0.0,
            "unconstrained": "the same prompts without a schema, ignore_eos",
            "any_text": f"the same prompts without a schema, ignore_eos, the regex {ANY_TEXT!r} "
            "as their structured output",
        },
        "repeats": args.repeats,
        "figures": figures,
        "split": split,
        "target": "constrained output tokens/s >= 0.8 x unconstrained",
        "timestamp": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": shlex.join(getattr(sys, "orig_argv", [sys.executable, *sys.argv])),
        "cpu_count": os.cpu_count(),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(args.out, result)
    print(f"device: {result['device']}  vllm {result['versions']['vllm']}  engine "
          f"{first.engine_kwargs}")  # fmt: skip
    print(f"{'variant':<20}{'median s':>10}{'req/s':>10}{'out tok/s':>12}{'vs free':>9}")
    for v, f in figures.items():
        ratio = f.get("tokens_per_s_vs_unconstrained", 1.0)
        print(
            f"{v:<20}{f['seconds_median']:>10.2f}{f['requests_per_s']:>10.1f}"
            f"{f['output_tokens_per_s']:>12.0f}{ratio:>9.3f}"
        )
    print(f"split: vLLM's structured-output path {split['structured_output_path']:.3f} of "
          f"unconstrained; the judge's schemas {split['judge_schemas_over_any_text']:.3f} of "
          f"the any-text grammar", flush=True)  # fmt: skip
    print(f"wrote {args.out}", flush=True)

    if args.bounded_requests:
        # last, and written apart: the full schemas' grammars may crawl (what they replace)
        bounded = build_judge_requests(
            args.model, args.bounded_requests, args.users, args.max_tokens, bounded=True
        )
        breqs = [r for r, _ in bounded]
        got = measure_raw(first, breqs)
        fig = summarise([got], len(breqs))
        same = measure_raw(first, requests[: len(breqs)])
        fig_same = summarise([same], len(breqs))
        result["bounded_before"] = {
            "requests": len(breqs),
            "what": "the same first requests with the full schemas (every rationale's "
            "maxLength), raw LLM.chat, once; beside them the sent (wire) schemas, once",
            "bounded": fig,
            "sent": fig_same,
            "tokens_per_s_bounded_vs_sent": round(
                fig["output_tokens_per_s"] / max(fig_same["output_tokens_per_s"], 1e-9), 4
            ),
        }
        write_json_atomic(args.out, result)
        print(f"bounded (before), {len(breqs)} requests: {fig['seconds_median']:.2f} s, "
              f"{fig['output_tokens_per_s']:.0f} tok/s; sent: {fig_same['seconds_median']:.2f} s, "
              f"{fig_same['output_tokens_per_s']:.0f} tok/s", flush=True)  # fmt: skip
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
