"""Concurrency that follows the rate limit (pipeline/backends/openai/ratelimit.py).

The controller on its own, on header sequences and 429 bursts, with a clock the test
moves; then the openai backend through the real ``openai`` SDK against the loopback server
of tests/provider_limits.py, which enforces a requests-per-minute and a tokens-per-minute
limit as OpenAI does, and counts on its side what it answered and how many requests were
in flight at once.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from typing import Any

import pytest
from provider_limits import LimitedServer, go_duration, token_charge
from standin_server import StandinServer

from pipeline.backends.openai.backend import OpenAIBackend
from pipeline.backends.openai.ratelimit import RESERVE, RateLimiter, Ticket, parse_duration
from pipeline.config import BackendSection
from pipeline.kinds.settings import OpenAISettings
from pipeline.types.chat import ChatRequest, ChatResult, RequestFailure

MODEL = "standin-model"


# -- the controller, on a clock the test moves ------------------------------------------------


class Clock:
    """A monotonic clock that moves only when the limiter sleeps on it."""

    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds
        await asyncio.sleep(0)


def limiter(max_concurrency: int = 8, **kw: Any) -> tuple[RateLimiter, Clock]:
    clock = Clock()
    return RateLimiter(max_concurrency, clock=clock, sleep=clock.sleep, **kw), clock


Spec = tuple[int, int, str]


def headers(
    requests: Spec | None = None, tokens: Spec | None = None, **extra: str
) -> dict[str, str]:
    """x-ratelimit headers from (limit, remaining, reset) per limit, as OpenAI sends them."""
    out: dict[str, str] = dict(extra)
    for name, spec in (("requests", requests), ("tokens", tokens)):
        if spec is not None:
            limit, left, reset = spec
            out |= {f"x-ratelimit-limit-{name}": str(limit),
                    f"x-ratelimit-remaining-{name}": str(left),
                    f"x-ratelimit-reset-{name}": reset}  # fmt: skip
    return out


def take(lim: RateLimiter, n: int, tokens: float = 0.0) -> list[Ticket]:
    async def go() -> list[Ticket]:
        return [await lim.acquire(tokens) for _ in range(n)]

    return asyncio.run(go())


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("6m0s", 360.0), ("1s", 1.0), ("20ms", 0.02), ("12ms", 0.012), ("8.64s", 8.64),
     ("4m12.172s", 252.172), ("23h18m29.144s", 83909.144), ("1.5", 1.5), ("0s", 0.0),
     ("250us", 0.00025), ("", None), ("soon", None), ("5x", None), ("1s2", None),
     ("-1", None), (None, None)],
)  # fmt: skip
def test_reset_durations_are_read_as_go_writes_them(text: str | None, seconds: float) -> None:
    got = parse_duration(text)
    assert got == pytest.approx(seconds) if seconds is not None else got is None


@pytest.mark.parametrize("seconds", [0.012, 0.02, 1.0, 1.5, 59.25, 360.0, 3723.5])
def test_the_loopback_server_writes_durations_the_client_reads(seconds: float) -> None:
    assert parse_duration(go_duration(seconds)) == pytest.approx(seconds, abs=1e-3)


def test_no_headers_and_no_429_never_waits_and_keeps_the_whole_pool() -> None:
    lim, clock = limiter(8)
    tickets = take(lim, 8)
    assert lim.in_flight == 8 and clock.slept == []
    for t in tickets:
        lim.observe(t, 200, {"content-type": "application/json"})
        lim.release(t, answered=True)
    assert not lim.engaged and lim.window == 8 and lim.stats.throttled == 0
    assert [t.seq for t in tickets] == list(range(1, 9))


def test_the_request_headers_pace_sends_at_the_refill_rate() -> None:
    # 10 requests a "minute" of 1 s: 10 sent, the answer to the last says none are left
    # and the bucket is full again in 1 s, so 10 more take about a second
    lim, clock = limiter(64)
    first = take(lim, 10)
    lim.observe(first[-1], 200, headers(requests=(10, 0, "1s")))
    assert lim.requests is not None and lim.requests.rate == pytest.approx(10.0)
    start = clock.now
    later = take(lim, 10)
    elapsed = clock.now - start
    # the reserve (one request: more than 2% of 10) is kept back once; 10 sends at 10 a
    # second
    assert RESERVE * 10 < 1
    assert elapsed == pytest.approx((10 + 1) / 10, rel=0.05)
    gaps = [b.sent - a.sent for a, b in itertools.pairwise(later)]
    assert all(g == pytest.approx(0.1, rel=0.05) for g in gaps)
    assert lim.stats.throttled == 10 and lim.window == 64


def test_an_answer_from_a_later_request_corrects_the_copy_and_an_older_one_does_not() -> None:
    lim, clock = limiter(64)
    a, b = take(lim, 2)
    # b's answer: another client spent the limit; a's answer (sent before) said plenty
    lim.observe(b, 200, headers(requests=(100, 0, "6s")))
    lim.observe(a, 200, headers(requests=(100, 90, "600ms")))
    assert lim.requests is not None and lim.requests.synced == b.seq
    start = clock.now
    take(lim, 1)
    assert clock.now - start > 0.05  # waited for a refill, not trusting a's stale count


def test_the_copy_counts_what_was_sent_after_the_answered_request() -> None:
    lim, clock = limiter(64)
    tickets = take(lim, 5)
    # the server had 5 left after the first; four more were sent since: 1 left
    lim.observe(tickets[0], 200, headers(requests=(60, 5, "55s")))
    assert lim.requests is not None
    assert lim.requests.left(clock.now) == pytest.approx(1.0)


def test_a_bucket_in_debt_is_read_from_its_reset_time() -> None:
    # remaining never goes below 0, but a refused request still counted: the reset time
    # (70 s for a 60-a-minute limit) says the bucket is 10 in debt
    lim, clock = limiter(64)
    t1, t2 = take(lim, 2)
    lim.observe(t1, 200, headers(requests=(60, 30, "30s")))  # 1 a second
    lim.observe(t2, 429, headers(requests=(60, 0, "1m10s"), **{"retry-after-ms": "11000"}))
    assert lim.requests is not None
    assert lim.requests.left(clock.now) == pytest.approx(-10.0)
    assert lim.pause_until == pytest.approx(clock.now + 11.0)


def test_tokens_bind_when_the_estimate_exceeds_what_is_left() -> None:
    lim, clock = limiter(64)
    (t,) = take(lim, 1, tokens=400)
    # 10,000 tokens a minute of 10 s: 1,000 a second; 1,000 left
    lim.observe(t, 200, headers(tokens=(10_000, 1000, "9s")))
    assert lim.tokens is not None and lim.tokens.rate == pytest.approx(1000.0)
    start = clock.now
    take(lim, 1, tokens=400)
    assert clock.now == start  # 400 and a reserve of as much again fit in 1,000
    take(lim, 1, tokens=400)
    # 600 left, 800 needed: 0.2 s of refill
    assert clock.now - start == pytest.approx(0.2, rel=0.05)
    # a request larger than the whole limit waits for a full bucket, never for ever
    take(lim, 1, tokens=50_000)
    assert clock.now - start < 15


@pytest.mark.parametrize(
    "odd",
    [{"x-ratelimit-limit-requests": "many", "x-ratelimit-remaining-requests": "5"},
     {"x-ratelimit-limit-requests": "nan", "x-ratelimit-remaining-requests": "inf"},
     {"x-ratelimit-limit-requests": "0", "x-ratelimit-remaining-requests": "0"},
     {"x-ratelimit-limit-tokens": "100", "x-ratelimit-remaining-tokens": "-3",
      "x-ratelimit-reset-tokens": "later"},
     {"retry-after": "Wed, 99 Foo 2026", "retry-after-ms": "soon"}],
)  # fmt: skip
def test_headers_that_say_nothing_usable_change_nothing(odd: dict[str, str]) -> None:
    lim, clock = limiter(8)
    (t,) = take(lim, 1)
    lim.observe(t, 200, odd)
    assert lim.requests is None and lim.tokens is None and lim.pause_until == 0
    take(lim, 7)
    assert clock.slept == []


def test_a_429_burst_with_headers_pauses_every_send_for_retry_after() -> None:
    lim, clock = limiter(32)
    tickets = take(lim, 16)
    for t in tickets:
        lim.observe(t, 429, headers(requests=(600, 0, "1m0s"), **{"retry-after-ms": "500"}))
        lim.release(t, answered=False)
    assert lim.stats.rate_limited == 16
    assert lim.window == 32  # the headers pace the sends; the window is not cut
    start = clock.now
    take(lim, 1)
    assert clock.now - start >= 0.5


def test_a_429_burst_without_headers_halves_the_window_once_per_round() -> None:
    lim, clock = limiter(32)
    burst = take(lim, 16)
    for t in burst:  # all sent before the first refusal came back: one cut, not sixteen
        lim.observe(t, 429, {"retry-after": "1"})
        lim.release(t, answered=False)
    assert lim.window == 16 and lim.stats.cuts == 1
    assert lim.pause_until == pytest.approx(clock.now + 1.0)
    (late,) = take(lim, 1)  # sent after the cut: its refusal cuts again
    assert clock.now >= lim.pause_until
    lim.observe(late, 429, {})
    lim.release(late, answered=False)
    assert lim.window == 8 and lim.stats.cuts == 2
    # additive increase: a window's worth of answers adds about one
    for _ in range(8):
        (t,) = take(lim, 1)
        lim.observe(t, 200, {})
        lim.release(t, answered=True)
    assert 8.9 < lim.window < 9.1
    for _ in range(2000):
        (t,) = take(lim, 1)
        lim.release(t, answered=True)
    assert lim.window == 32  # back to max_concurrency, never above


def test_the_window_bounds_the_requests_in_flight() -> None:
    async def go() -> list[int]:
        lim = RateLimiter(8)
        seen: list[int] = []
        first = [await lim.acquire() for _ in range(3)]
        lim.observe(first[0], 429, {})  # a refusal without headers: the window goes to 4
        lim.observe(first[1], 429, {})  # sent before that cut: no second cut
        assert lim.allowed() == 4
        first.append(await lim.acquire())
        lim.observe(first[-1], 429, {})  # sent after it: 2
        assert lim.allowed() == 2 and lim.in_flight == 4

        async def one() -> None:
            t = await lim.acquire()
            seen.append(lim.in_flight)
            await asyncio.sleep(0.01)
            lim.release(t, answered=False)

        waiting = [asyncio.create_task(one()) for _ in range(6)]
        await asyncio.sleep(0.05)
        assert seen == []  # 4 in flight, 2 allowed: nobody starts
        for t in first:
            lim.release(t, answered=False)
        await asyncio.wait_for(asyncio.gather(*waiting), 30)
        return seen

    seen = asyncio.run(go())
    assert len(seen) == 6 and max(seen) <= 2


# -- the loopback server ----------------------------------------------------------------------


def post(server: StandinServer, body: dict[str, Any]) -> tuple[int, dict[str, str], bytes]:
    data = json.dumps(body).encode()
    req = urllib.request.Request(
        f"{server.base_url}/chat/completions", data, {"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def test_the_loopback_server_refuses_above_its_limit_with_openai_headers() -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "x" * 400}], "max_tokens": 50}
    assert token_charge(body) == 100 + 50
    with LimitedServer(rpm=2, tpm=10_000, minute_s=60) as server:
        answers = [post(server, body) for _ in range(3)]
    (s1, h1, _), (s2, h2, _), (s3, h3, b3) = answers
    assert (s1, s2, s3) == (200, 200, 429)
    assert h1["x-ratelimit-limit-requests"] == "2" and h1["x-ratelimit-remaining-requests"] == "1"
    assert h1["x-ratelimit-limit-tokens"] == "10000"
    assert int(h1["x-ratelimit-remaining-tokens"]) in (9850, 9849)  # refilled a hair since
    assert parse_duration(h1["x-ratelimit-reset-requests"]) == pytest.approx(30.0, abs=0.5)
    assert h2["x-ratelimit-remaining-requests"] == "0"
    assert h3["x-ratelimit-remaining-requests"] == "0"
    # the refusal counted (OpenAI: unsuccessful requests count): about 1 of debt, 60 s
    # to get one request back
    assert 59 <= int(h3["retry-after-ms"]) / 1000 <= 61 and h3["Retry-After"] in ("60", "61")
    assert parse_duration(h3["x-ratelimit-reset-requests"]) == pytest.approx(90.0, abs=1)
    assert b"rate_limit_exceeded" in b3 and b"requests per minute" in b3
    assert [r["status"] for r in server.requests] == [200, 200, 429]
    assert server.requests[2]["fault"] == "rate_limit"


# -- the backend, through the real SDK --------------------------------------------------------


def requests(n: int, label: str = "q", max_tokens: int = 100) -> list[ChatRequest]:
    return [
        ChatRequest(
            messages=(("system", "Be brief."), ("user", f"{label} {k}: " + "tell me more " * 12)),
            model=MODEL,
            max_tokens=max_tokens,
            seed=k,
        )
        for k in range(n)
    ]


def cfg_for(server: StandinServer, **kw: Any) -> BackendSection:
    opts: dict[str, Any] = {
        "timeout_s": 60.0,
        "max_attempts": 6,
        "backoff_initial_s": 0.05,
        "backoff_max_s": 5.0,
        "max_concurrency": 32,
    }
    opts.update(kw)
    # the openai server's own settings go in its section (backend.openai)
    server_keys = set(OpenAISettings.model_fields)
    section = {k: v for k, v in opts.items() if k in server_keys}
    rest = {k: v for k, v in opts.items() if k not in server_keys}
    return BackendSection(
        name="openai", model=MODEL, openai={"base_url": server.base_url, **section}, **rest
    )


def run_backend(
    cfg: BackendSection, reqs: Sequence[ChatRequest]
) -> tuple[list[ChatResult | RequestFailure], OpenAIBackend]:
    async def go() -> tuple[dict[int, ChatResult | RequestFailure], OpenAIBackend]:
        backend = OpenAIBackend(cfg)
        out: dict[int, ChatResult | RequestFailure] = {}
        try:
            async for i, res in backend.run(reqs):
                out[i] = res
        finally:
            await backend.aclose()
        return out, backend

    out, backend = asyncio.run(go())
    assert sorted(out) == list(range(len(reqs)))
    return [out[i] for i in range(len(reqs))], backend


def statuses(server: StandinServer) -> dict[int, int]:
    out: dict[int, int] = {}
    for r in server.requests:
        out[r["status"]] = out.get(r["status"], 0) + 1
    return out


@pytest.mark.parametrize("transport", ["aiohttp", "httpx"])
def test_a_stage_sized_burst_under_a_request_limit_finishes_with_few_429s(transport: str) -> None:
    # 30 requests a second (60 a "minute" of 2 s), a full bucket of 60 to start with:
    # 200 requests take about (200 - 60) / 30 = 4.7 s whoever sends them
    n = 200
    with LimitedServer(rpm=60, minute_s=2.0, latency_ms=50) as server:
        results, backend = run_backend(cfg_for(server, http_transport=transport), requests(n))
        got = statuses(server)
        answered_at = sorted(r["time"] for r in server.requests if r["status"] == 200)
        most = server.most_in_flight
    assert all(isinstance(r, ChatResult) for r in results), [
        r.reason for r in results if isinstance(r, RequestFailure)
    ][:3]
    assert got.get(200) == n
    # few: a pool that ignores the limit is refused on over a quarter of its requests (the
    # next test). The bucket is timed on both sides, so a busy machine shifts a few sends
    # across a refill: 5 of 200 were refused once in CI on the shared 2-core machine
    assert got.get(429, 0) <= n * 0.05, got
    # the limit held: no faster than the bucket and its refill allow
    assert answered_at[-1] - answered_at[0] >= (n - 60) / 30 * 0.9
    # never more in flight than max_concurrency, counted on the server
    assert 1 < most <= 32
    assert backend.limits is not None and backend.limits.stats.headers_seen
    assert backend.limits.stats.throttled > 0


def test_the_same_burst_without_following_the_limit_is_refused_often() -> None:
    """The loopback limit bites a pool that ignores it (what the test above avoids)."""
    with LimitedServer(rpm=60, minute_s=2.0, latency_ms=50) as server:
        cfg = cfg_for(server, follow_rate_limits=False, max_attempts=2, backoff_max_s=0.5)
        results, backend = run_backend(cfg, requests(120))
        got = statuses(server)
    assert backend.limits is None
    assert got.get(429, 0) > 30, got
    assert any(isinstance(r, RequestFailure) and "429" in r.reason for r in results)


def test_a_burst_under_a_token_limit_finishes_with_few_429s() -> None:
    reqs = requests(150, max_tokens=200)
    per = token_charge({"messages": [{"content": t} for _, t in reqs[0].messages],
                        "max_tokens": 200})  # fmt: skip
    # tokens for 25 requests a second; requests plentiful
    tpm = per * 25 * 2
    with LimitedServer(rpm=100_000, tpm=tpm, minute_s=2.0, latency_ms=50) as server:
        results, backend = run_backend(cfg_for(server), reqs)
        got = statuses(server)
        answered_at = sorted(r["time"] for r in server.requests if r["status"] == 200)
        most = server.most_in_flight
    assert all(isinstance(r, ChatResult) for r in results)
    assert got.get(200) == 150 and got.get(429, 0) <= 3, got
    assert answered_at[-1] - answered_at[0] >= (150 - 50) / 25 * 0.9
    assert most <= 32
    assert backend.limits is not None and backend.limits.tokens is not None


def test_a_server_without_limits_gets_the_whole_pool_at_once() -> None:
    """No headers, no 429 (a local vLLM): max_concurrency in flight from the first request,
    nothing throttled; the controller never engages."""
    with LimitedServer(latency_ms=100) as server:
        results, backend = run_backend(cfg_for(server, max_concurrency=8), requests(40))
        most = server.most_in_flight
        sent = [r for r in server.requests if r["status"] == 200]
    assert all(isinstance(r, ChatResult) for r in results) and len(sent) == 40
    assert most == 8
    lim = backend.limits
    assert lim is not None and not lim.engaged
    assert lim.stats.throttled == 0 and lim.stats.most_in_flight == 8 and lim.window == 8


def test_429s_without_headers_cut_the_window_and_every_request_is_answered(
    server: StandinServer,
) -> None:
    server.latency_ms = 20
    server.inject("429", count=12, retry_after=0.1)
    results, backend = run_backend(cfg_for(server, max_concurrency=16), requests(60))
    assert all(isinstance(r, ChatResult) for r in results)
    assert statuses(server) == {429: 12, 200: 60}
    lim = backend.limits
    assert lim is not None and lim.stats.rate_limited == 12
    assert 1 <= lim.stats.cuts < 12  # halved per round, not per refusal
    assert lim.stats.lowest_window < 16


def test_following_the_limit_can_be_turned_off() -> None:
    with LimitedServer(latency_ms=5) as server:
        results, backend = run_backend(cfg_for(server, follow_rate_limits=False), requests(5))
    assert backend.limits is None and all(isinstance(r, ChatResult) for r in results)


def test_timing_under_the_limit_matches_the_limit_not_max_concurrency() -> None:
    """20 requests a second (a full bucket of 20 to start with) and a 100 ms server: the
    limit sets the pace, not max_concurrency, and the sends wait for it instead of being
    refused."""
    with LimitedServer(rpm=20, minute_s=1.0, latency_ms=100) as server:
        t0 = time.monotonic()
        results, backend = run_backend(cfg_for(server, max_concurrency=16), requests(80))
        seconds = time.monotonic() - t0
        got = statuses(server)
    assert all(isinstance(r, ChatResult) for r in results)
    assert got.get(429, 0) <= 2, got
    assert seconds >= (80 - 20) / 20 * 0.9
    assert backend.limits is not None and backend.limits.stats.waited_s > 0


def test_a_retry_after_beyond_the_cap_is_said_once_with_what_is_done(
    server: StandinServer, capsys, monkeypatch
) -> None:
    """A Retry-After of a year was capped at backend.backoff_max_s without a word: the run
    seemed to hang. The first such answer is now one warning line saying what the server
    asked and what is done; every request is still answered."""
    import pipeline.backends.openai.ratelimit as rl

    monkeypatch.setattr(rl, "_CAPPED_SAID", set())
    server.inject("429", count=2, retry_after=31_536_000)  # a year
    results, _ = run_backend(cfg_for(server, max_concurrency=2, backoff_max_s=0.2), requests(4))
    assert all(isinstance(r, ChatResult) for r in results)
    err = [line for line in capsys.readouterr().err.splitlines() if "Retry-After" in line]
    assert len(err) == 1, err
    assert "asked to wait 31,536,000 s" in err[0] and "waiting 0.2 s at most" in err[0]
    assert "backend.backoff_max_s" in err[0]
