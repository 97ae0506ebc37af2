"""A loopback chat server that enforces a hosted API's rate limit, as OpenAI documents it.

It answers like the stand-in (tests/standin_server.py: the same player and schema answers,
bounded by ``max_tokens``, with its latency), and in front of that keeps two limits per
"minute": requests (RPM) and tokens (TPM). Each is a token bucket ``limit`` deep, refilled
continuously at ``limit`` per minute; that is what OpenAI's reset headers show (one request
of a 5,000-per-minute limit "resets" in 12 ms). The minute is ``minute_s`` seconds long, so
a limit scaled down runs a test in seconds.

- A request is charged on arrival: one request, and tokens estimated as OpenAI describes,
  the prompt's characters / 4 plus ``max_tokens`` x ``n`` (a request larger than the
  whole token limit waits for a full bucket).
- When either bucket is short the answer is 429 ``rate_limit_exceeded``, with
  ``retry-after-ms`` and ``Retry-After`` (whole seconds, rounded up) saying when it would
  fit; a refused request still counts against the request limit, as OpenAI says
  unsuccessful requests do (down to one minute of debt).
- Every answer, 200 or 429, carries ``x-ratelimit-limit-requests``, ``-remaining-requests``,
  ``-reset-requests`` and the three ``-tokens`` ones, durations written as Go writes them
  (``1m0s``, ``1.5s``, ``12ms``).

Server-side counters a test reads: ``in_flight`` / ``most_in_flight`` (chat requests
being handled, latency included), and the request records (``status`` 429 with fault
``rate_limit`` for a refusal, ``time`` of arrival).

In-process::

    with LimitedServer(rpm=600, tpm=200_000, minute_s=6, latency_ms=50) as server: ...

As a process (the benchmark), writing its counters to ``--stats-file`` when it stops::

    python tests/provider_limits.py --rpm 300 --minute-s 6 --port-file p --stats-file s
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from aiohttp import web
from standin_server import MODES, StandinServer, _error, _message_text


def go_duration(seconds: float) -> str:
    """``seconds`` as Go (and OpenAI's headers) write a duration: 6m0s, 1.5s, 12ms."""
    if seconds <= 0:
        return "0s"
    if seconds < 1:
        ms = round(seconds * 1000, 3)
        return f"{ms:.3f}".rstrip("0").rstrip(".") + "ms" if ms >= 0.001 else "1µs"
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    text = f"{round(secs, 3):.3f}".rstrip("0").rstrip(".") + "s"
    if hours:
        return f"{int(hours)}h{int(minutes)}m{text}"
    return f"{int(minutes)}m{text}" if minutes else text


def token_charge(body: dict[str, Any]) -> int:
    """Tokens a request is charged on arrival: its characters / 4 plus the most it may write."""
    chars = sum(len(_message_text(m)) for m in body.get("messages") or [] if isinstance(m, dict))
    most = body.get("max_completion_tokens") or body.get("max_tokens") or 0
    n = body.get("n") or 1
    if not isinstance(most, int) or not isinstance(n, int):
        most, n = 0, 1
    return math.ceil(chars / 4) + most * max(1, n)


class Bucket:
    """One limit: ``limit`` deep, refilled at ``limit / minute_s`` per second."""

    def __init__(self, limit: float, minute_s: float, now: float) -> None:
        self.limit, self.rate = float(limit), limit / minute_s
        self.level, self.at = float(limit), now

    def refill(self, now: float) -> None:
        self.level = min(self.limit, self.level + self.rate * (now - self.at))
        self.at = now

    def short(self, cost: float) -> float:
        """Seconds until ``cost`` (at most the whole limit) fits; 0 when it does now."""
        return max(0.0, (min(cost, self.limit) - self.level) / self.rate)

    def headers(self, name: str) -> dict[str, str]:
        return {
            f"x-ratelimit-limit-{name}": str(int(self.limit)),
            f"x-ratelimit-remaining-{name}": str(max(0, math.floor(self.level))),
            f"x-ratelimit-reset-{name}": go_duration((self.limit - self.level) / self.rate),
        }


class LimitedServer(StandinServer):
    """The stand-in behind an RPM and a TPM limit (either may be None: no such limit).

    ``count_rejected``: a 429 still takes a request from the request limit (OpenAI: "unsuccessful
    requests contribute to your per-minute limit"). ``clock``: the limits' clock.
    """

    def __init__(
        self,
        *,
        rpm: int | None = None,
        tpm: int | None = None,
        minute_s: float = 60.0,
        count_rejected: bool = True,
        clock: Callable[[], float] = time.monotonic,
        **kw: Any,
    ) -> None:
        super().__init__(**kw)
        if minute_s <= 0:
            raise ValueError("minute_s must be above 0")
        self.clock = clock
        now = clock()
        self.limits = {
            name: Bucket(limit, minute_s, now)
            for name, limit in (("requests", rpm), ("tokens", tpm))
            if limit is not None
        }
        self.minute_s = minute_s
        self.count_rejected = count_rejected
        self.in_flight = 0
        self.most_in_flight = 0
        self._limit_lock = threading.Lock()

    def _admit(self, body: dict[str, Any]) -> tuple[str | None, dict[str, str]]:
        """Charge ``body`` to the limits, or refuse it (the limits it is short of); the
        headers to answer with."""
        cost = {"requests": 1.0, "tokens": float(token_charge(body))}
        with self._limit_lock:
            now = self.clock()
            for bucket in self.limits.values():
                bucket.refill(now)
            short = {n: b.short(cost[n]) for n, b in self.limits.items()}
            wait = max(short.values(), default=0.0)
            if wait <= 0:
                for name, bucket in self.limits.items():
                    bucket.level -= cost[name]
            elif self.count_rejected and "requests" in self.limits:
                r = self.limits["requests"]
                r.level = max(-r.limit, r.level - 1)
                wait = max(wait, r.short(1.0))
            headers: dict[str, str] = {}
            for name, bucket in self.limits.items():
                headers.update(bucket.headers(name))
        if wait > 0:
            headers["retry-after-ms"] = str(max(1, math.ceil(wait * 1000)))
            headers["Retry-After"] = str(max(1, math.ceil(wait)))
        return " and ".join(n for n, w in short.items() if w > 0) or None, headers

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        self.in_flight += 1  # the server's loop is one thread: no lock needed
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            try:
                body = await request.json()  # aiohttp keeps the body for the stand-in
            except ValueError:
                body = None
            if not isinstance(body, dict):
                return await super()._chat(request)  # its 400
            refused, headers = self._admit(body)
            if refused:
                record = {"body": body, "status": 429, "fault": "rate_limit",
                          "time": time.time(), "query": dict(request.query)}  # fmt: skip
                with self._lock:
                    self._records.append(record)
                per = {"requests": "requests per minute", "tokens": "tokens per minute"}
                what = " and ".join(per[n] for n in refused.split(" and "))
                return _error(429, f"Rate limit reached for {what} (loopback limit).", headers)
            response = await super()._chat(request)
            response.headers.update(headers)
            return response
        finally:
            self.in_flight -= 1

    def stats(self) -> dict[str, Any]:
        """Counters for a benchmark: statuses, arrival times (and token charges) of the answered
        and the refused, most in flight."""
        records = self.requests
        statuses: dict[str, int] = {}
        for r in records:
            statuses[str(r["status"])] = statuses.get(str(r["status"]), 0) + 1
        return {
            "requests": len(records),
            "statuses": statuses,
            "answered_at": [r["time"] for r in records if r["status"] == 200],
            "answered_tokens": [token_charge(r["body"]) for r in records if r["status"] == 200],
            "refused_at": [r["time"] for r in records if r["status"] == 429],
            "first_at": min((r["time"] for r in records), default=None),
            "most_in_flight": self.most_in_flight,
            "limits": {n: {"limit": b.limit, "per_s": b.rate} for n, b in self.limits.items()},
            "minute_s": self.minute_s,
        }


def main(argv: list[str] | None = None) -> None:
    """Run the limited server in the foreground until SIGTERM; then write its counters."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, default=0, help="0 picks a free port")
    ap.add_argument("--port-file", help="write the bound port here once listening")
    ap.add_argument("--stats-file", help="write the counters here (JSON) when stopped")
    ap.add_argument("--rpm", type=int, default=None, help="requests per minute")
    ap.add_argument("--tpm", type=int, default=None, help="tokens per minute")
    ap.add_argument("--minute-s", type=float, default=60.0, help="seconds a minute lasts")
    ap.add_argument(
        "--no-count-rejected",
        dest="count_rejected",
        action="store_false",
        help="a 429 does not count against the request limit",
    )
    ap.add_argument("--latency-ms", type=float, default=0.0, help="median per-request latency")
    ap.add_argument("--latency-sigma", type=float, default=0.0, help="log-normal spread")
    ap.add_argument("--latency-seed", type=int, default=0)
    ap.add_argument("--mode", choices=MODES, default="player")
    opts = vars(ap.parse_args(argv))
    port_file, stats_file = opts.pop("port_file"), opts.pop("stats_file")
    server = LimitedServer(host="127.0.0.1", **opts)
    try:
        asyncio.run(server.serve_forever(port_file))
    finally:
        if stats_file:
            tmp = f"{stats_file}.tmp{os.getpid()}"
            with open(tmp, "w") as fh:
                json.dump(server.stats(), fh)
            os.replace(tmp, stats_file)
        print("limited server stopped", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
