"""How many requests the openai backend sends, and when: following the server's rate limit.

Hosted APIs report what is left of an account's limits on every response, as OpenAI
documents: ``x-ratelimit-limit-requests`` / ``-tokens`` (the limit), ``x-ratelimit-remaining-
requests`` / ``-tokens`` (what is left) and ``x-ratelimit-reset-requests`` / ``-tokens`` (the
time until the limit is back to its initial state, as a Go duration: ``6m0s``, ``1s``,
``20ms``). Their limits refill continuously (one request of a 5,000-per-minute limit "resets"
in 12 ms), so each is a token bucket: ``limit`` deep, refilled at ``(limit - remaining) /
reset`` per second.

:class:`RateLimiter` keeps a copy of each bucket on the client. Every attempt takes a permit
(:meth:`RateLimiter.acquire`) before it is sent, which charges the bucket one request and the
request's estimated tokens (the prompt's characters / 4 plus ``max_tokens`` x ``n``, the
estimate the provider charges on arrival) and waits while the bucket is short. Every
response brings the server's own count back (:meth:`RateLimiter.observe`): the copy is set to
what the server said when it took that request, plus the refill since, minus what was sent
after it, so an estimate that is off never drifts further than the requests in flight.

A 429 pauses every new attempt for its Retry-After (capped like the retry wait) and halves
the requests allowed in flight (at most once per round of requests: the 429s of requests
sent before the cut do not cut again); each answer adds back ``1 / allowed``, so the window
grows by one per round trip up to ``max_concurrency`` (additive increase, multiplicative
decrease). That is what follows a server that 429s without headers.

A server that sends none of these headers and never answers 429 (a local vLLM) is never
throttled: the window starts at ``max_concurrency``, and until a header or a 429 arrives a
permit is a counter incremented, with no lock and no wait.
"""

from __future__ import annotations

import asyncio
import datetime
import re
import sys
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from email.utils import parsedate_to_datetime

# What OpenAI's limits are per when a server reports a limit and no reset time (RPM, TPM).
DEFAULT_WINDOW_S = 60.0
# What a bucket keeps unspent: 2% of the limit, and at least the request's own cost again.
# Requests sent close together may reach the server in another order than they were sent,
# so its count can lag the copy's by a request or two. Once the bucket is down to the
# reserve, sends go at the refill rate: it costs only the start of a run.
RESERVE = 0.02
# The longest single sleep before the wait is worked out again: an answer arriving
# meanwhile may show that the bucket holds more than the copy thought.
_MAX_NAP_S = 0.25

_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|h|m|s)")
_UNIT_S = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}


def parse_duration(text: str | None) -> float | None:
    """Seconds in a rate-limit reset header: a Go duration (``6m0s``, ``1.5s``, ``20ms``,
    ``1h2m3.5s``) or a plain number of seconds; None for anything else."""
    if text is None:
        return None
    text = text.strip()
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        pass
    else:
        return value if value >= 0 and value != float("inf") else None
    pos, total = 0, 0.0
    for m in _DURATION_PART.finditer(text):
        if m.start() != pos:
            return None
        total += float(m.group(1)) * _UNIT_S[m.group(2)]
        pos = m.end()
    return total if pos == len(text) and pos > 0 else None


def _number(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        return None
    return value if 0 <= value < float("inf") else None


@dataclass(slots=True)
class Ticket:
    """One attempt's permit: when it was sent, in what order, and what it was charged."""

    seq: int
    sent: float
    tokens: float
    spent_tokens: float  # every attempt's estimated tokens up to and with this one


@dataclass(slots=True)
class Bucket:
    """The client's copy of one of the server's limits (requests or tokens)."""

    limit: float
    rate: float  # refill per second
    level: float  # what is left at ``at``, less what was sent since
    at: float
    synced: int = -1  # the newest attempt (seq) whose answer set ``level``

    def left(self, now: float) -> float:
        return min(self.limit, self.level + self.rate * (now - self.at))

    def charge(self, cost: float, now: float) -> None:
        self.level, self.at = self.left(now) - cost, now

    def wait(self, cost: float, now: float) -> float:
        """Seconds until ``cost`` fits with the reserve left over (a cost above the limit
        waits for a full bucket)."""
        need = min(cost + max(RESERVE * self.limit, cost), self.limit) - self.left(now)
        if need <= 0:
            return 0.0
        return need / self.rate if self.rate > 0 else _MAX_NAP_S


@dataclass
class LimiterStats:
    """What the limiter did, for a benchmark or a test to read."""

    throttled: int = 0  # attempts that waited for a permit
    waited_s: float = 0.0
    rate_limited: int = 0  # 429 answers seen
    cuts: int = 0  # times the window was halved
    lowest_window: float = 0.0
    most_in_flight: int = 0
    headers_seen: bool = False


@dataclass
class RateLimiter:
    """Permits for attempts, within ``max_concurrency``, following the server's limits.

    ``clock`` and ``sleep`` are the event loop's by default; a test passes its own.
    """

    max_concurrency: int
    max_pause_s: float = 30.0
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
    window: float = field(init=False)
    in_flight: int = field(default=0, init=False)
    stats: LimiterStats = field(default_factory=LimiterStats, init=False)

    def __post_init__(self) -> None:
        self.window = float(self.max_concurrency)
        self.stats.lowest_window = self.window
        self.engaged = False  # a header or a 429 seen: from then on permits may wait
        self.pause_until = 0.0
        self.requests: Bucket | None = None
        self.tokens: Bucket | None = None
        self._seq = 0
        self._spent_tokens = 0.0
        self._cut_after = -1  # 429s of attempts sent up to this seq do not cut again
        self._turn: asyncio.Lock | None = None  # first come, first served once engaged
        self._freed: asyncio.Event | None = None

    # ---- permits --------------------------------------------------------------------
    def _issue(self, tokens: float, now: float) -> Ticket:
        self._seq += 1
        self._spent_tokens += tokens
        self.in_flight += 1
        if self.in_flight > self.stats.most_in_flight:
            self.stats.most_in_flight = self.in_flight
        if self.requests is not None:
            self.requests.charge(1.0, now)
        if self.tokens is not None:
            self.tokens.charge(tokens, now)
        return Ticket(self._seq, now, tokens, self._spent_tokens)

    def delay(self, tokens: float, now: float) -> float:
        """Seconds before an attempt of ``tokens`` may be sent, by the pause and the buckets."""
        wait = self.pause_until - now
        for bucket, cost in ((self.requests, 1.0), (self.tokens, tokens)):
            if bucket is not None:
                wait = max(wait, bucket.wait(cost, now))
        return max(0.0, wait)

    def allowed(self) -> int:
        """Attempts allowed in flight now."""
        return max(1, int(self.window))

    async def acquire(self, tokens: float = 0.0) -> Ticket:
        """A permit for one attempt estimated at ``tokens``; waits while the window is full,
        the server asked for a pause, or a bucket is short."""
        if not self.engaged and self.in_flight < self.max_concurrency:
            return self._issue(tokens, self.clock())
        if self._turn is None:
            self._turn, self._freed = asyncio.Lock(), asyncio.Event()
        assert self._freed is not None
        waited = False
        t0 = self.clock()
        async with self._turn:
            while True:
                now = self.clock()
                if self.in_flight >= self.allowed():
                    waited = True
                    self._freed.clear()
                    await self._freed.wait()
                    continue
                wait = self.delay(tokens, now)
                if wait <= 0:
                    break
                waited = True
                # at least a millisecond: a float's last bit must not spin the loop
                await self.sleep(min(max(wait, 0.001), _MAX_NAP_S))
            ticket = self._issue(tokens, now)
        if waited:
            self.stats.throttled += 1
            self.stats.waited_s += ticket.sent - t0
        return ticket

    def release(self, ticket: Ticket, answered: bool) -> None:
        """The attempt of ``ticket`` is over; ``answered``: the server answered it (not 429)."""
        self.in_flight -= 1
        if answered and self.window < self.max_concurrency:
            self.window = min(float(self.max_concurrency), self.window + 1.0 / self.window)
        if self._freed is not None:
            self._freed.set()

    # ---- what the server says -------------------------------------------------------
    def observe(self, ticket: Ticket | None, status: int, headers: Mapping[str, str]) -> None:
        """A response's status and headers, for the attempt of ``ticket`` (None: a response
        to something else, which still tells what is left)."""
        now = self.clock()
        if status == 429:
            self._rate_limited(ticket, headers, now)
        for name in ("requests", "tokens"):
            limit = _number(headers.get(f"x-ratelimit-limit-{name}"))
            left = _number(headers.get(f"x-ratelimit-remaining-{name}"))
            if limit is None or left is None or limit <= 0:
                continue
            self.engaged = self.stats.headers_seen = True
            reset = parse_duration(headers.get(f"x-ratelimit-reset-{name}"))
            self._sync(name, limit, left, reset, ticket, now)

    def _sync(
        self,
        name: str,
        limit: float,
        left: float,
        reset: float | None,
        ticket: Ticket | None,
        now: float,
    ) -> None:
        bucket: Bucket | None = getattr(self, name)
        known = reset is not None and reset > 0 and left < limit
        # a bucket at 0 may be in debt (a refused request still counts), which only its
        # reset time shows: the rate is taken from answers that have some left
        if known and (left > 0 or bucket is None):
            rate = (limit - left) / reset  # type: ignore[operator]
        elif bucket is not None:
            rate = bucket.rate
        else:
            rate = limit / DEFAULT_WINDOW_S
        if left <= 0 and known:
            left = min(0.0, limit - reset * rate)  # type: ignore[operator]
        if bucket is None:
            bucket = Bucket(limit, rate, min(left, limit), now)
            setattr(self, name, bucket)
        bucket.limit, bucket.rate = limit, rate
        if ticket is None or ticket.seq <= bucket.synced:
            return  # an older answer than the one the copy was last set from
        # the server had `left` when it took this attempt; since then the bucket refilled,
        # and every attempt sent after this one was charged
        if name == "requests":
            after = float(self._seq - ticket.seq)
        else:
            after = self._spent_tokens - ticket.spent_tokens
        bucket.level = min(limit, left + rate * max(0.0, now - ticket.sent)) - after
        bucket.at, bucket.synced = now, ticket.seq

    def _rate_limited(self, ticket: Ticket | None, headers: Mapping[str, str], now: float) -> None:
        self.engaged = True
        self.stats.rate_limited += 1
        hinted = retry_after(headers)
        if hinted is not None:
            say_capped_wait(hinted, self.max_pause_s)
            self.pause_until = max(self.pause_until, now + min(hinted, self.max_pause_s))
        # with the headers the buckets pace the sends and the pause covers a miss; halving
        # the window too would starve a slow server of the requests in flight it needs
        if (
            self.stats.headers_seen
            or (headers.get("x-ratelimit-limit-requests") is not None)
            or (headers.get("x-ratelimit-limit-tokens") is not None)
        ):
            return
        if ticket is None or ticket.seq > self._cut_after:
            self.window = max(1.0, self.window / 2)
            self._cut_after = self._seq
            self.stats.cuts += 1
            self.stats.lowest_window = min(self.stats.lowest_window, self.window)


# what a server asked and was not given, said once per process (a run's every request may
# carry the same Retry-After)
_CAPPED_SAID: set[str] = set()


def say_capped_wait(asked: float, cap: float, where: str = "the server") -> None:
    """One line, the first time ``where`` asks to wait longer than ``cap`` seconds: what
    it asked and what is done instead (a wait of years would stall the run for good)."""
    if asked <= cap or where in _CAPPED_SAID:
        return
    _CAPPED_SAID.add(where)
    print(
        f"warning: {where} asked to wait {asked:,.0f} s before trying again (Retry-After); "
        f"waiting {cap:g} s at most (backend.backoff_max_s), so requests it keeps refusing "
        "fail after backend.max_attempts tries and are asked again on the next run",
        file=sys.stderr,
        flush=True,
    )


def retry_after(headers: Mapping[str, str]) -> float | None:
    """Seconds a response asks to wait (``retry-after-ms``, else ``Retry-After`` in seconds
    or as an HTTP date), if it does."""
    ms = headers.get("retry-after-ms")
    if ms:
        try:
            return max(0.0, float(ms) / 1000.0)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
        return max(0.0, (when - datetime.datetime.now(when.tzinfo)).total_seconds())
    except (TypeError, ValueError):
        return None


def estimate_tokens(characters: int, max_tokens: int | None, n: int) -> float:
    """What a provider charges a request on arrival: the prompt's characters / 4 (about
    four characters a token in English) plus the most it may write."""
    return characters / 4.0 + (max_tokens or 0) * max(1, n)
