"""The openai backend against a hosted API's rate limit: following it against a fixed pool.

Starts the loopback server of tests/provider_limits.py as a separate process (the
stand-in's answers behind a requests-per-minute and a tokens-per-minute limit, refilled
continuously as OpenAI's are, 429 with Retry-After and the ``x-ratelimit-*`` headers on
every answer; its minute scaled down to ``--minute-s`` seconds) and, on a fresh server
each, runs the backend for ``--seconds`` on a feed that never runs dry:

- ``follow``: ``backend.openai.follow_rate_limits: true`` (the default): sends paced by the
  headers, 429s pausing every worker;
- ``fixed``: ``follow_rate_limits: false``, today's fixed pool: ``max_concurrency`` in
  flight whatever the server says, each 429 retried after its Retry-After;
- ``fixed_refusals_free`` (``rpm`` only): the fixed pool against a server where a refused
  request does not count against the limit (OpenAI says it does; without that, a fixed
  pool loses less to its 429s).

Two limits bind in turn: ``rpm`` (the request limit; tokens plentiful) and ``tpm`` (the
token limit; requests plentiful). Figures are the server's own counts, over the steady
part of the run (from ``--settle`` seconds on, once the full bucket a run starts with is
spent): answers per second over the limit's rate (tokens charged per second for ``tpm``),
and the share of HTTP requests answered 429, over the steady part and the whole run. The
target: the ratio >= 0.9 with under 1% of requests answered 429, for ``follow``.

Writes benchmarks/results/hosted_limits.json::

    .venv/bin/python benchmarks/hosted_limits.py [--seconds 13] [--minute-s 6]
        [--rpm 300] [--tpm 96000] [--concurrency 64] [--latency-ms 200] [--out PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from importlib import metadata
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
for _p in (ROOT, ROOT / "tests"):
    if str(_p) not in sys.path:  # run as a script from anywhere
        sys.path.insert(0, str(_p))

from provider_limits import token_charge  # noqa: E402

from pipeline.backends.openai.backend import OpenAIBackend  # noqa: E402
from pipeline.config import BackendSection  # noqa: E402
from pipeline.kinds.backend import RequestFeed  # noqa: E402
from pipeline.types.chat import ChatRequest, ChatResult  # noqa: E402

SERVER_SCRIPT = ROOT / "tests" / "provider_limits.py"
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "hosted_limits.json"
MODEL = "standin-model"
MAX_TOKENS = 200
TARGET_RATIO, TARGET_429 = 0.9, 0.01
_FILLER = (
    "I have been sketching on my commute for a year, mostly on an iPad, and I want practical "
    "advice that fits short sessions rather than long theory. I tried two anatomy books and "
    "found them too dry, but quick gesture drawing felt fun and kept me going. "
)


class LimitedProcess:
    """tests/provider_limits.py in its own process; its counters read when it stops."""

    def __init__(self, args: list[str]) -> None:
        self.args = args
        self._tmp = tempfile.TemporaryDirectory(prefix="limited-")
        self.dir = Path(self._tmp.name)
        self.proc: subprocess.Popen[bytes] | None = None
        self.base_url = ""

    def start(self, wait_s: float = 30.0) -> LimitedProcess:
        port_file, log_path = self.dir / "port", self.dir / "server.log"
        cmd = [sys.executable, str(SERVER_SCRIPT), "--port", "0", "--port-file", str(port_file),
               "--stats-file", str(self.dir / "stats.json"), *self.args]  # fmt: skip
        with open(log_path, "wb") as log:
            self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log)
        deadline = time.monotonic() + wait_s
        while not port_file.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"limited server did not start:\n{log_path.read_text()[-2000:]}")
            time.sleep(0.05)
        self.base_url = f"http://127.0.0.1:{int(port_file.read_text())}/v1"
        return self

    def stop(self) -> dict[str, Any]:
        """Stop the server (SIGTERM: it writes its counters) and return them."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.proc = None
        stats_path = self.dir / "stats.json"
        stats = json.loads(stats_path.read_text()) if stats_path.exists() else {}
        self._tmp.cleanup()
        return stats


def requests_for(label: str, n: int) -> list[ChatRequest]:
    """N distinct requests of about 150 words, as a responses stage sends them."""
    ask = "how do I get better at drawing hands? Answer in at most 100 words."
    return [
        ChatRequest(
            messages=(
                ("system", "You answer questions for a specific person. Match their tone."),
                ("user", f"[{label} #{k}] {_FILLER * 2}Question {k}: {ask}"),
            ),
            model=MODEL,
            temperature=0.8,
            top_p=0.95,
            max_tokens=MAX_TOKENS,
            seed=k,
        )
        for k in range(n)
    ]


async def drive(cfg: BackendSection, requests: list[ChatRequest], seconds: float) -> dict[str, Any]:
    """The backend on a feed of ``requests`` for ``seconds``; then the workers are stopped."""
    backend = OpenAIBackend(cfg)
    feed = RequestFeed()
    for i, r in enumerate(requests):
        feed.put(i, r)
    feed.close()
    ok = failed = 0
    reasons: dict[str, int] = {}
    stream = backend.stream(feed)
    t0 = time.perf_counter()
    try:

        async def consume() -> None:
            nonlocal ok, failed
            async for _, res in stream:
                if isinstance(res, ChatResult):
                    ok += 1
                else:
                    failed += 1
                    key = res.reason[:60]
                    reasons[key] = reasons.get(key, 0) + 1

        try:
            await asyncio.wait_for(consume(), seconds)
            ran_dry = True
        except asyncio.TimeoutError:
            ran_dry = False
    finally:
        await stream.aclose()  # type: ignore[attr-defined]
        await backend.aclose()
    limiter = asdict(backend.limits.stats) if backend.limits is not None else None
    return {
        "client_seconds": round(time.perf_counter() - t0, 2),
        "answered": ok,
        "failed": failed,
        "failure_reasons": reasons,
        "feed_ran_dry": ran_dry,
        "limiter": limiter,
    }


def figures(stats: dict[str, Any], scenario: str, settle: float, seconds: float) -> dict[str, Any]:
    """The server's counts over the steady part [settle, seconds] of the run, and over all."""
    t0 = stats["first_at"]
    steady = seconds - settle
    answered = [
        (t - t0, c) for t, c in zip(stats["answered_at"], stats["answered_tokens"], strict=True)
    ]
    in_window = [(t, c) for t, c in answered if settle <= t <= seconds]
    refused = [t - t0 for t in stats["refused_at"]]
    refused_window = sum(1 for t in refused if settle <= t <= seconds)
    requests_window = len(in_window) + refused_window
    dim = "requests" if scenario == "rpm" else "tokens"
    per_s = stats["limits"][dim]["per_s"]
    used = len(in_window) if dim == "requests" else sum(c for _, c in in_window)
    total_requests = stats["requests"]
    return {
        "binding_limit": dim,
        "limit_per_s": round(per_s, 2),
        "steady_window_s": [settle, seconds],
        "answered_per_s": round(len(in_window) / steady, 2),
        "tokens_charged_per_s": round(sum(c for _, c in in_window) / steady, 1),
        "ratio_to_limit": round(used / steady / per_s, 3),
        "http_requests": total_requests,
        "answered_429": stats["statuses"].get("429", 0),
        "share_429": round(stats["statuses"].get("429", 0) / max(1, total_requests), 4),
        "share_429_steady": round(refused_window / max(1, requests_window), 4),
        "statuses": stats["statuses"],
        "most_in_flight_server_side": stats["most_in_flight"],
    }


def measure(args: argparse.Namespace, scenario: str, variant: str) -> dict[str, Any]:
    limits = (
        ["--rpm", str(args.rpm), "--tpm", str(args.tpm * 100)]
        if scenario == "rpm"
        else ["--rpm", str(args.rpm * 100), "--tpm", str(args.tpm)]
    )
    if variant == "fixed_refusals_free":
        limits.append("--no-count-rejected")
    server_args = [
        *limits,
        *("--minute-s", str(args.minute_s), "--mode", "filler"),
        *("--latency-ms", str(args.latency_ms), "--latency-sigma", str(args.sigma)),
    ]
    # enough requests that the feed never runs dry in the time given: the full bucket a
    # run starts with, then twice the limit's rate
    per_request = token_charge({"messages": [{"content": m[1]} for m in
                                             requests_for("x", 1)[0].messages],
                                "max_tokens": MAX_TOKENS})  # fmt: skip
    rate = args.rpm / args.minute_s if scenario == "rpm" else args.tpm / args.minute_s / per_request
    n = int(rate * args.minute_s + 2 * rate * args.seconds) + args.concurrency
    load_before = os.getloadavg()[0]
    server = LimitedProcess(server_args).start()
    try:
        # the other request settings as a config leaves them (max_attempts 6, backoff 0.5-30 s)
        cfg = BackendSection(
            name="openai",
            model=MODEL,
            openai={
                "base_url": server.base_url,
                "max_concurrency": args.concurrency,
                "follow_rate_limits": variant == "follow",
                "timeout_s": 120.0,
            },
        )
        client = asyncio.run(drive(cfg, requests_for(f"{scenario}-{variant}", n), args.seconds))
    finally:
        stats = server.stop()
    result = {
        "scenario": scenario,
        "variant": variant,
        "requests_fed": n,
        **figures(stats, scenario, args.settle, args.seconds),
        "client": client,
        "load_1min_before": round(load_before, 2),
        "load_1min_after": round(os.getloadavg()[0], 2),
    }
    result["target_met"] = (
        result["ratio_to_limit"] >= TARGET_RATIO and result["share_429"] < TARGET_429
    )
    return result


def versions() -> dict[str, str | None]:
    def version(name: str) -> str | None:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return None

    return {n: version(n) for n in ("openai", "aiohttp", "httpx2", "tenacity")}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=13.0, help="how long each run lasts")
    ap.add_argument("--settle", type=float, default=3.0, help="seconds before the steady part")
    ap.add_argument("--minute-s", type=float, default=6.0, help="seconds the server's minute lasts")
    ap.add_argument("--rpm", type=int, default=300, help="requests per (scaled) minute")
    ap.add_argument("--tpm", type=int, default=96_000, help="tokens per (scaled) minute")
    ap.add_argument("--concurrency", type=int, default=64, help="backend.openai.max_concurrency")
    ap.add_argument("--latency-ms", type=float, default=200.0, help="server's median latency")
    ap.add_argument("--sigma", type=float, default=0.5, help="log-normal spread of the latency")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where to write the JSON")
    from _smoke import add_flag as add_smoke_flag
    from _smoke import apply as apply_smoke

    add_smoke_flag(ap)
    args = ap.parse_args(argv)
    apply_smoke(args, seconds=3.0, settle=1.0, minute_s=1.0, rpm=40, tpm=12_000,
                concurrency=16, latency_ms=20.0)  # fmt: skip

    runs: dict[str, dict[str, Any]] = {}
    for scenario in ("rpm", "tpm"):
        runs[scenario] = {}
        # a refused request counting against the limit (as OpenAI says it does) is what
        # sinks a fixed pool on the request limit; the third run shows it without that
        variants = (
            ("follow", "fixed", "fixed_refusals_free") if scenario == "rpm" else ("follow", "fixed")
        )
        for variant in variants:
            r = measure(args, scenario, variant)
            runs[scenario][variant] = r
            print(
                f"{scenario:<4} {variant:<7} {r['answered_per_s']:>7.1f} answers/s  ratio "
                f"{r['ratio_to_limit']:.3f}  429s {r['answered_429']:>5} of {r['http_requests']:>5}"
                f" ({100 * r['share_429']:.2f}%)  failed {r['client']['failed']}  "
                f"most in flight {r['most_in_flight_server_side']}",
                flush=True,
            )
    result = {
        "benchmark": "hosted_limits",
        "smoke": args.smoke,
        "server": "tests/provider_limits.py in a separate process, restarted for every run: "
        "the stand-in's filler answers behind an RPM and a TPM token bucket refilled "
        f"continuously, its minute lasting {args.minute_s} s; a refused request counts "
        "against the request limit (as OpenAI documents)",
        "settings": {
            "seconds": args.seconds,
            "settle_s": args.settle,
            "minute_s": args.minute_s,
            "rpm": args.rpm,
            "tpm": args.tpm,
            "max_concurrency": args.concurrency,
            "latency": f"log-normal, median {args.latency_ms} ms, sigma {args.sigma}",
            "max_tokens": MAX_TOKENS,
            "other_limit": "the limit that does not bind is set 100 times higher",
        },
        "target": {"ratio_to_limit_min": TARGET_RATIO, "share_429_max": TARGET_429},
        "summary": {
            s: {
                v: {k: runs[s][v][k] for k in ("ratio_to_limit", "share_429", "target_met")}
                | {"failed": runs[s][v]["client"]["failed"]}
                for v in runs[s]
            }
            for s in runs
        },
        "runs": runs,
        "machine": {
            "cpu_count": os.cpu_count(),
            "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
            "platform": platform.platform(),
            "python": platform.python_version(),
            **versions(),
        },
        "timestamp": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": shlex.join(getattr(sys, "orig_argv", [sys.executable, *sys.argv])),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
