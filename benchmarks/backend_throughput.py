"""Throughput of the openai backend (through LLMRunner and its cache) against a bare client.

Starts the stand-in OpenAI server (tests/standin_server.py) as a separate process, with a
log-normal latency (median 200 ms, sigma 0.8 by default), and in the same run measures:

- ``backend``: ``LLMRunner`` over ``OpenAIBackend`` with a fresh ``RequestCache`` in a temp
  dir (one SQLite commit per answer included), N distinct requests, concurrency C;
- ``bare``: a plain ``AsyncOpenAI`` loop (``max_retries=0``) bounded by an
  ``asyncio.Semaphore(C)`` over N distinct requests with the same sampling parameters;

each on both HTTP transports (aiohttp via ``openai.DefaultAioHttpClient()``, and the
default httpx). Every measurement sends its own request contents, so no cache is shared.
Each measurement gets a fresh server process started with the same latency seed, so all
see the same latency draws. Measurements are interleaved (bare and backend alternate,
their order flipped on every repeat) so drift on the machine hits both; per variant the
median over repeats is kept. The target is backend >= 0.9 x bare on the same transport.

Writes benchmarks/results/backend_throughput.json and prints a short table::

    .venv/bin/python benchmarks/backend_throughput.py [--requests 5000] [--concurrency 64]
        [--latency-ms 200] [--sigma 0.8] [--repeats 1] [--out PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import functools
import json
import math
import os
import platform
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

import openai

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(ROOT))

from pipeline.backends.openai.backend import OpenAIBackend  # noqa: E402
from pipeline.config import BackendSection  # noqa: E402
from pipeline.engine.llm import Answer, LLMRunner  # noqa: E402
from pipeline.run.cache import RequestCache  # noqa: E402
from pipeline.types.chat import ChatRequest  # noqa: E402

SERVER_SCRIPT = ROOT / "tests" / "standin_server.py"
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "backend_throughput.json"
MODEL = "standin-model"
TRANSPORTS = ("aiohttp", "httpx")
TARGET = 0.9
LATENCY_SEED = 0
# sampling parameters sent by both variants, as the responses stage sends them
SAMPLING = {"temperature": 0.8, "top_p": 0.95, "max_tokens": 400}

_FILLER = (
    "I have been sketching on my commute for a year, mostly on an iPad, and I want practical "
    "advice that fits short sessions rather than long theory. I tried two anatomy books and "
    "found them too dry, but quick gesture drawing felt fun and kept me going. "
)


class StandinProcess:
    """The stand-in server in its own process, so it does not share the client's GIL."""

    def __init__(self, latency_ms: float, sigma: float, seed: int = 0) -> None:
        self.latency_ms, self.sigma, self.seed = latency_ms, sigma, seed
        self.proc: subprocess.Popen | None = None
        self.base_url = ""
        self._tmp = tempfile.TemporaryDirectory(prefix="standin-")

    def start(self, wait_s: float = 20.0) -> StandinProcess:
        port_file = Path(self._tmp.name) / "port"
        log = open(Path(self._tmp.name) / "server.log", "wb")  # noqa: SIM115 - kept for the child
        cmd = [
            sys.executable,
            str(SERVER_SCRIPT),
            "--port", "0",
            "--port-file", str(port_file),
            "--latency-ms", str(self.latency_ms),
            "--latency-sigma", str(self.sigma),
            "--latency-seed", str(self.seed),
        ]  # fmt: skip
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log)
        log.close()
        deadline = time.monotonic() + wait_s
        while not port_file.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                err = (Path(self._tmp.name) / "server.log").read_text(errors="replace")
                raise RuntimeError(f"stand-in server did not start:\n{err[-2000:]}")
            time.sleep(0.05)
        self.base_url = f"http://127.0.0.1:{int(port_file.read_text())}/v1"
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.proc = None
        self._tmp.cleanup()

    def __enter__(self) -> StandinProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def lognormal_model(latency_ms: float, sigma: float, concurrency: int) -> dict[str, Any]:
    mean_ms = latency_ms * math.exp(sigma**2 / 2)
    return {
        "distribution": "lognormal: median_ms * exp(sigma * N(0, 1)), per request",
        "median_ms": latency_ms,
        "sigma": sigma,
        "mean_ms": round(mean_ms, 1),
        # Little's law: with C requests always in flight, the best a client can do
        "ideal_requests_per_s": round(concurrency / (mean_ms / 1000.0), 1) if mean_ms else None,
    }


def machine_info() -> dict[str, Any]:
    def version(name: str) -> str | None:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return None

    return {
        "cpu_count": os.cpu_count(),
        "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
        "platform": platform.platform(),
        "python": platform.python_version(),
        "openai": version("openai"),
        "aiohttp": version("aiohttp"),
        "httpx2": version("httpx2"),
        "httpx": version("httpx"),
        "tenacity": version("tenacity"),
    }


def run_metadata() -> dict[str, Any]:
    return {
        "machine": machine_info(),
        "timestamp": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": shlex.join(getattr(sys, "orig_argv", [sys.executable, *sys.argv])),
    }


def make_messages(label: str, n: int) -> list[tuple[tuple[str, str], ...]]:
    """N distinct prompts (about 150 words each); ``label`` keeps measurements apart."""
    system = ("system", "You answer questions for a specific person. Match their tone.")
    ask = "how do I get better at drawing hands? Answer in at most 100 words."
    return [
        (system, ("user", f"[{label} #{k}] {_FILLER * 2}Question {k}: {ask}")) for k in range(n)
    ]


def backend_section(base_url: str, transport: str, concurrency: int) -> BackendSection:
    return BackendSection(
        name="openai",
        model=MODEL,
        base_url=base_url,
        max_concurrency=concurrency,
        http_transport=transport,
        timeout_s=120.0,
    )


async def measure_backend(
    cfg: BackendSection, requests: Sequence[ChatRequest], cache_dir: Path
) -> dict[str, Any]:
    """LLMRunner + OpenAIBackend + a fresh RequestCache: the path a stage takes."""
    backend = OpenAIBackend(cfg)
    cache = RequestCache(cache_dir / "cache.sqlite")
    # text_reasks=0: the bare client it is compared with does not ask a cut answer again
    runner = LLMRunner(backend, cache, "bench", progress=False, text_reasks=0)
    ok = failed = 0
    try:
        c0, t0 = time.process_time(), time.perf_counter()
        async for _, outcome in runner.stream(requests):
            if isinstance(outcome, Answer):
                ok += 1
            else:
                failed += 1
        seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
        stored = cache.count()
    finally:
        await backend.aclose()
        cache.close()
    if stored != ok:
        raise RuntimeError(f"cache holds {stored} answers, expected {ok}")
    return {"seconds": seconds, "cpu_s": cpu, "ok": ok, "failed": failed}


async def measure_bare(
    base_url: str, transport: str, requests: Sequence[ChatRequest], concurrency: int
) -> dict[str, Any]:
    """The floor: a plain AsyncOpenAI loop with a semaphore, no retries, no cache."""
    http_client = openai.DefaultAioHttpClient(timeout=120.0) if transport == "aiohttp" else None
    client = openai.AsyncOpenAI(
        base_url=base_url, api_key="EMPTY", max_retries=0, timeout=120.0, http_client=http_client
    )
    sem = asyncio.Semaphore(concurrency)

    async def one(req: ChatRequest) -> bool:
        async with sem:
            try:
                resp = await client.chat.completions.create(
                    model=req.model,
                    messages=req.message_dicts(),
                    temperature=req.temperature,
                    top_p=req.top_p,
                    max_tokens=req.max_tokens,
                    n=req.n,
                    seed=req.seed,
                )
            except openai.OpenAIError:
                return False
            return bool(resp.choices and resp.choices[0].message.content is not None)

    try:
        c0, t0 = time.process_time(), time.perf_counter()
        results = await asyncio.gather(*(one(r) for r in requests))
        seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    finally:
        await client.close()
    ok = sum(results)
    return {"seconds": seconds, "cpu_s": cpu, "ok": ok, "failed": len(results) - ok}


def requests_for(label: str, n: int) -> list[ChatRequest]:
    return [
        ChatRequest(messages=m, model=MODEL, n=1, seed=k, **SAMPLING)
        for k, m in enumerate(make_messages(label, n))
    ]


def run_measurement(
    variant: str,
    transport: str,
    repeat: int,
    base_url: str,
    n: int,
    concurrency: int,
    workdir: Path,
) -> dict[str, Any]:
    label = f"{variant}-{transport}-r{repeat}"
    requests = requests_for(label, n)
    if variant == "backend":
        cache_dir = workdir / label
        cache_dir.mkdir()
        cfg = backend_section(base_url, transport, concurrency)
        res = asyncio.run(measure_backend(cfg, requests, cache_dir))
    else:
        res = asyncio.run(measure_bare(base_url, transport, requests, concurrency))
    if res["failed"]:
        raise RuntimeError(f"{label}: {res['failed']} of {n} requests failed")
    res.update(
        label=label,
        variant=variant,
        transport=transport,
        repeat=repeat,
        requests_per_s=round(n / res["seconds"], 2),
        seconds=round(res["seconds"], 3),
        cpu_s=round(res["cpu_s"], 3),
    )
    return res


def measure_with_fresh_server(
    args: argparse.Namespace, measure: Callable[[str], dict[str, Any]]
) -> dict[str, Any]:
    """Run one measurement against its own server process, started with the same seed.

    Every measurement then sees the same sequence of latency draws, so the heavy tail of
    the log-normal (which decides the last seconds of a run) is not luck of the draw.
    The server's CPU time is read from the reaped child's rusage.
    """
    # other work on the machine skews a CPU-bound client: keep the load seen at the start
    load_before = os.getloadavg()[0]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    server = StandinProcess(args.latency_ms, args.sigma, seed=LATENCY_SEED)
    try:
        server.start()
        result = measure(server.base_url)
    finally:
        server.stop()  # terminates and reaps the process, whatever happened
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    result["server_cpu_s"] = round(cpu, 3)
    result["load_1min_before"] = round(load_before, 2)
    return result


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    rps: dict[str, float] = {}
    cpu_ms: dict[str, float] = {}
    for variant in ("bare", "backend"):
        for transport in TRANSPORTS:
            mine = [r for r in runs if r["variant"] == variant and r["transport"] == transport]
            if mine:
                key = f"{variant}/{transport}"
                rps[key] = round(statistics.median(r["requests_per_s"] for r in mine), 2)
                per_req = [1000 * r["cpu_s"] / r["ok"] for r in mine]
                cpu_ms[key] = round(statistics.median(per_req), 3)
    ratio = {
        t: round(rps[f"backend/{t}"] / rps[f"bare/{t}"], 3)
        for t in TRANSPORTS
        if f"backend/{t}" in rps and f"bare/{t}" in rps
    }
    transport_ratio = {
        v: round(rps[f"{v}/aiohttp"] / rps[f"{v}/httpx"], 3)
        for v in ("bare", "backend")
        if f"{v}/aiohttp" in rps and f"{v}/httpx" in rps
    }
    return {
        "requests_per_s": rps,
        "client_cpu_ms_per_request": cpu_ms,
        "ratio_backend_over_bare": ratio,
        "ratio_aiohttp_over_httpx": transport_ratio,
        "target": {
            "backend_over_bare_min": TARGET,
            "met": {t: r >= TARGET for t, r in ratio.items()},
        },
    }


def print_table(result: dict[str, Any]) -> None:
    s = result["summary"]
    print(
        f"\n{result['requests']} requests, concurrency {result['concurrency']}, latency "
        f"median {result['latency_model']['median_ms']} ms sigma {result['latency_model']['sigma']}"
        f" (ideal {result['latency_model']['ideal_requests_per_s']} req/s)"
    )
    print(f"{'variant':<20}{'req/s':>10}{'cpu ms/req':>12}")
    for key, value in s["requests_per_s"].items():
        print(f"{key:<20}{value:>10.1f}{s['client_cpu_ms_per_request'][key]:>12.2f}")
    for t, r in s["ratio_backend_over_bare"].items():
        verdict = "met" if r >= TARGET else "NOT met"
        print(f"backend/bare {t:<8}{r:>10.3f}  (target >= {TARGET}: {verdict})")
    for v, r in s["ratio_aiohttp_over_httpx"].items():
        print(f"aiohttp/httpx {v:<7}{r:>10.3f}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=5000, help="distinct requests per measurement")
    ap.add_argument("--concurrency", type=int, default=64, help="requests in flight at most")
    ap.add_argument("--latency-ms", type=float, default=200.0, help="server's median latency")
    ap.add_argument("--sigma", type=float, default=0.8, help="log-normal spread of the latency")
    ap.add_argument("--repeats", type=int, default=1, help="measurements per variant (median)")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where to write the JSON")
    from _smoke import add_flag as add_smoke_flag
    from _smoke import apply as apply_smoke

    add_smoke_flag(ap)
    args = ap.parse_args(argv)
    apply_smoke(args, requests=40, repeats=1, latency_ms=5.0)

    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-throughput-") as tmp:
        for rep in range(args.repeats):
            for transport in TRANSPORTS:
                # alternate which goes first, so a drifting machine favours neither
                order = ("bare", "backend") if (rep % 2 == 0) else ("backend", "bare")
                for variant in order:
                    measure = functools.partial(
                        run_measurement,
                        variant,
                        transport,
                        rep,
                        n=args.requests,
                        concurrency=args.concurrency,
                        workdir=Path(tmp),
                    )
                    r = measure_with_fresh_server(args, measure)
                    runs.append(r)
                    print(
                        f"{r['label']:<24} {r['requests_per_s']:>8.1f} req/s "
                        f"{r['seconds']:>7.2f} s  cpu {r['cpu_s']:.2f} s  "
                        f"server cpu {r['server_cpu_s']:.2f} s",
                        flush=True,
                    )

    result = {
        "benchmark": "backend_throughput",
        "smoke": args.smoke,
        "requests": args.requests,
        "concurrency": args.concurrency,
        "repeats": args.repeats,
        "latency_model": lognormal_model(args.latency_ms, args.sigma, args.concurrency),
        "server": "tests/standin_server.py in a separate process, restarted for every "
        f"measurement with latency seed {LATENCY_SEED} (the same latency draws for each)",
        "sampling": SAMPLING,
        "summary": None,
        "runs": runs,
        **run_metadata(),
    }
    result["summary"] = summarize(runs)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print_table(result)
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
