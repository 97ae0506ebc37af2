"""Runs a stage's LLM requests: cache first, then the backend, with JSON validation,
re-asks, failure accounting and progress, streaming.

Requests come from an iterable the runner pulls lazily, so a stage never builds its
whole request list: at most ``window`` requests are in flight (enough to keep the
backend's workers or engine busy), and a stage's memory does not grow with its input.
Cache lookups happen in batches as jobs are admitted. Answers are committed to the cache
in batches, and an answer is yielded (acknowledged) only after its batch is committed.

A stage may ``push`` follow-up jobs while it consumes results (the judge asks for
pairwise verdicts once an example's pointwise verdicts are in); they go ahead of the
remaining input.

Validation and re-asks: an answer that does not validate is re-asked (a new request
carrying the bad answer and the error), up to ``max_reasks`` times. An answer cut off by
``max_tokens`` is re-asked with twice the tokens, unless the job's ``salvage`` reads it: a
verdict cut short after its decisions, at max_tokens or by a stop token that the engine's
grammar let through inside a string (pipeline/types/schemas.py). Only answers that
validate are cached; an answer still invalid after its re-asks is recorded in the cache's
errors table and reported as a pending failure, retried on the next run. After
``invalid_retry_runs``
earlier runs failed the same way (a deterministic model gives the same answer) the
failure is final and the stage records it as such.

Reasoning models (pipeline/backends/reasoning.py): an answer's reasoning reaches the runner
apart from its text. An answer whose reasoning used its whole budget without ending has no
answer in it: it is stored (its tokens were spent) and asked again once with twice the
reasoning budget (``reasoning_retries``); if that one is cut too, a JSON request fails for
good with the reason ``reasoning_exhausted`` and a free-text one is handed over as it is
(empty, finish reason "length", ``reasoning_cut``), for the pair filters to drop. It is
never validated or read as an answer.

Budget (pipeline/engine/budget.py): with ``run.budget`` set, a request is sent only while the
run's spending plus a bound of everything in flight stays within it. A request that does
not fit waits (and no more input is taken) until answers in flight make room; when nothing
is in flight and it still does not fit, the runner stops: everything answered has been
handed over and committed, and it raises BudgetReached.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from pipeline.backends.reasoning import cut_reason, retry_request
from pipeline.core.errors import BackendError, StageError, Unanswered
from pipeline.core.progress import Progress
from pipeline.engine.budget import Budget
from pipeline.kinds.backend import Backend, RequestFeed
from pipeline.rules.text import unfinished
from pipeline.run.cache import INVALID_PREFIX, RequestCache
from pipeline.types.chat import ChatRequest, ChatResult, RequestFailure

# validate(request, text) -> parsed value; raises ValueError with a short reason when invalid.
# It always receives the job's original request, also when judging the answer to a re-ask.
Validator = Callable[[ChatRequest, str], Any]

REASK_TEMPLATE = (
    "Your previous answer could not be used: {error}. Reply again with only a JSON object "
    "that matches the requested schema, and nothing else."
)
REASK_LENGTH_TEMPLATE = (
    "Your previous answer was cut off at the length limit before it was complete ({error}). "
    "Reply again with only a complete JSON object that matches the requested schema, and "
    "keep the free-text fields short."
)
# A re-ask after a cut-off answer doubles max_tokens, up to this many.
MAX_TOKENS_CAP = 16384
# A free-text answer that is not finished (pipeline.rules.text.unfinished: cut at
# max_tokens, no visible text, ending mid-sentence) is asked again this many times, with
# twice the tokens and the same messages; what then comes back is kept, with its finish
# reason, and the pair filters drop it if it is still unfinished.
TEXT_REASKS = 1
# An answer whose reasoning used its whole budget is asked again this many times with twice
# the reasoning budget before it counts as exhausted.
REASONING_RETRIES = 1


@dataclass
class Answer:
    result: ChatResult
    parsed: list[Any]  # one per choice when a validator was given, else empty
    request: ChatRequest  # the request finally answered (a re-ask, maybe)
    cached: bool = False
    reasks: int = 0


@dataclass
class Failure:
    reason: str
    attempts: int = 0
    reasks: int = 0
    # final: retrying cannot help (an invalid answer again after its retry budget, a
    # request the replay cache lacks); the stage records it. Otherwise the example is
    # left pending and the request is retried on the next run.
    final: bool = False


@dataclass
class Job:
    """One request of a stage: ``tag`` comes back with its outcome."""

    request: ChatRequest
    tag: Any = None
    validate: Validator | None = None
    # reads an answer cut at max_tokens whose ``validate`` failed (schemas.read with
    # cut=True): a judge verdict whose decisions are whole is kept instead of re-asked
    salvage: Validator | None = None


@dataclass
class RunStats:
    # the backend's name; one that does not answer new requests (Backend.answers_new)
    # "sent" nothing: its answers came from a replay cache, not a model
    backend: str = ""
    requests: int = 0
    cached: int = 0
    sent: int = 0
    failed: int = 0
    reasks: int = 0
    length_reasks: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    seconds: float = 0.0
    failure_reasons: dict[str, int] = field(default_factory=dict)
    # a reasoning model's answers (completion_tokens includes these tokens): how many of
    # the answers received had a reasoning block, its tokens, and the answers whose
    # reasoning used its whole budget (asked again, or given up as reasoning_exhausted)
    reasoned_answers: int = 0
    reasoning_tokens: int = 0
    reasoning_cut: int = 0

    def as_dict(self) -> dict[str, Any]:
        out = {**self.__dict__, "failure_reasons": dict(self.failure_reasons)}
        if not (self.reasoned_answers or self.reasoning_cut):
            # a model that does not reason: the stats read as they always have
            for k in ("reasoned_answers", "reasoning_tokens", "reasoning_cut"):
                del out[k]
        return out


def text_retry(req: ChatRequest) -> ChatRequest | None:
    """The request an unfinished free-text answer is asked again with: the same messages,
    twice the tokens (up to MAX_TOKENS_CAP); None when there is no more room. The runner
    sends it, and ``prb plan`` counts it, through this one function."""
    more = min(req.max_tokens * 2, MAX_TOKENS_CAP)
    return replace(req, max_tokens=more) if more > req.max_tokens else None


def reask_request(req: ChatRequest, bad: str, error: str, finish_reason: str) -> ChatRequest:
    """The same request with the invalid answer and the reason appended; it keeps ``n``, so
    the answer that finally validates has as many choices as the stage asked for. A cut-off
    answer is re-asked with twice the tokens: repeating the limit would cut it again."""
    cut = finish_reason == "length"
    template = REASK_LENGTH_TEMPLATE if cut else REASK_TEMPLATE
    msgs = (*req.messages, ("assistant", bad), ("user", template.format(error=error)))
    max_tokens = min(req.max_tokens * 2, MAX_TOKENS_CAP) if cut else req.max_tokens
    return replace(req, messages=msgs, max_tokens=max(max_tokens, req.max_tokens))


def _cut(result: ChatResult) -> bool:
    """Whether any choice's reasoning used its whole budget: no answer to read."""
    return any(c.reasoning_cut for c in result.choices)


def _reason_code(reason: str) -> str:
    return reason.split(":", 1)[0][:60]


@dataclass
class _Flight:
    job: Job
    request: ChatRequest  # what is being asked now: the job's request or a re-ask
    reasks: int = 0
    reasoning_retries: int = 0  # asked again for a reasoning that used its whole budget


class LLMRunner:
    def __init__(
        self,
        backend: Backend,
        cache: RequestCache,
        stage: str,
        *,
        max_reasks: int = 2,
        abort_after_failures: int = 50,
        progress: bool | Progress = True,
        window: int | None = None,
        invalid_retry_runs: int = 1,
        lookup_batch: int = 512,
        commit_batch: int = 256,
        text_reasks: int = TEXT_REASKS,
        budget: Budget | None = None,
        reasoning_retries: int = REASONING_RETRIES,
    ) -> None:
        self.backend = backend
        self.cache = cache
        self.stage = stage
        self.max_reasks = max_reasks
        self.abort_after_failures = abort_after_failures
        self.window = max(1, window or backend.window)
        self.invalid_retry_runs = invalid_retry_runs
        self.lookup_batch = lookup_batch
        self.commit_batch = commit_batch
        # benchmarks that compare with a bare client set 0: they measure transport
        self.text_reasks = text_reasks
        self.reasoning_retries = reasoning_retries
        # the backend's reasoning settings as its identity records them (None: it does not
        # reason): what a reasoning retry's budget is doubled from
        self._reasoning = backend.reasoning_record
        self.stats = RunStats(backend=backend.name)
        self._own_progress = not isinstance(progress, Progress)
        self.progress: Progress | None = progress if isinstance(progress, Progress) else None
        self._progress_enabled = bool(progress)
        self._pushed: deque[Job] = deque()
        self.budget = budget  # run.budget: checked in _send, settled in _receive
        self._held: deque[_Flight] = deque()  # requests waiting for room in the budget

    # ---- public ------------------------------------------------------------------------
    def replayed(self, requests: int, reasks: int = 0, expected: int = 0) -> None:
        """Count the requests of a unit of work whose result the stage took whole from the
        cache (a finished row stored under the hash of its inputs) as cached answers;
        ``expected`` is what the progress total already counted for it."""
        self.stats.requests += requests
        self.stats.cached += requests
        self.stats.reasks += reasks
        if self.progress is not None:
            self.progress.add_total(requests - expected)
            self.progress.update(requests, cached=True)

    def push(self, job: Job) -> None:
        """Add a follow-up job; it is admitted before the rest of the input."""
        self._pushed.append(job)
        if self.progress is not None:
            self.progress.add_total(1)

    async def stream(
        self,
        requests: Iterable[ChatRequest],
        validate: Validator | None = None,
        salvage: Validator | None = None,
    ) -> AsyncIterator[tuple[int, Answer | Failure]]:
        """Yield ``(index, outcome)`` for every request, as each becomes final."""
        total = len(requests) if isinstance(requests, Sequence) else None
        jobs = (Job(r, i, validate, salvage) for i, r in enumerate(requests))
        async for tag, outcome in self.run(jobs, total=total):
            yield tag, outcome

    async def run(
        self, jobs: Iterable[Job], total: int | None = None
    ) -> AsyncIterator[tuple[Any, Answer | Failure]]:
        """Yield ``(tag, outcome)`` for every job (and every pushed job) as each becomes
        final; ``total`` is the expected number of jobs, for the progress display."""
        if self.progress is None:
            self.progress = Progress(self.stage, total, enabled=self._progress_enabled)
        elif total:
            self.progress.add_total(total)
        start = time.perf_counter()
        source: Iterator[Job] = iter(jobs)
        exhausted = False
        self._feed = RequestFeed()
        self._results: asyncio.Queue[Any] = asyncio.Queue()
        self._flights: dict[int, _Flight] = {}
        self._next_token = 0
        self._ready: deque[tuple[Any, Answer | Failure]] = deque()
        self._consecutive = 0
        self._replay_missing = 0
        self._unanswered = 0
        pump = asyncio.create_task(self._pump())
        try:
            while True:
                # 1. admit jobs while the window has room: in flight and answered but not
                # yet handed over both count, or a fully cached input would be read whole
                # before the first outcome is yielded
                while (
                    len(self._flights) + len(self._ready) < self.window
                    and (self._pushed or not exhausted)
                    and not self._held
                ):
                    batch: list[Job] = []
                    while self._pushed and len(batch) < self.lookup_batch:
                        batch.append(self._pushed.popleft())
                    while not exhausted and len(batch) < self.lookup_batch:
                        try:
                            batch.append(next(source))
                        except StopIteration:
                            exhausted = True
                    if not batch:
                        break
                    self._admit(batch)
                # 2. hand over what is final (the consumer may push follow-ups meanwhile)
                if self._ready:
                    while self._ready:
                        yield self._ready.popleft()
                    continue
                # 3. finished?
                if not self._flights:
                    if self._held:
                        # nothing in flight: the budget cannot make more room than now
                        self._release()
                        if self._flights:
                            continue
                        break
                    if self._pushed or not exhausted:
                        continue
                    break
                # 4. wait for answers, then take every answer already waiting
                first = await self._results.get()
                arrived = [first]
                while len(arrived) < self.commit_batch and not self._results.empty():
                    arrived.append(self._results.get_nowait())
                self._receive(arrived)
                if self._held:
                    self._release()
        finally:
            self._feed.close()
            if not pump.done():
                pump.cancel()
            await asyncio.gather(pump, return_exceptions=True)
            self.stats.seconds += time.perf_counter() - start
            if self._own_progress and self.progress is not None:
                self.progress.close()
        if self.budget is not None and self._held:
            # everything that was in flight is answered, handed over and committed
            raise self.budget.reached(self.stage, self.stats.as_dict())
        if self._replay_missing:
            raise BackendError(
                f"replay: {self._replay_missing} of {self.stats.requests} requests of stage "
                f"'{self.stage}' are not in the request cache; run this stage with a live "
                "backend first"
            )
        if self._unanswered:
            total = self.stats.requests
            raise Unanswered(self.stage, self._unanswered, total, self.backend.failing)

    # ---- internals ---------------------------------------------------------------------
    async def _pump(self) -> None:
        """Run the backend over the feed; its results (or its crash) go to the queue."""
        try:
            async for token, res in self.backend.stream(self._feed):
                self._results.put_nowait((token, res))
        except Exception as exc:  # surfaced by the main loop, not lost in a task
            self._results.put_nowait(exc)

    def _send(self, flight: _Flight) -> None:
        if self.budget is not None and (self._held or not self.budget.admit(flight.request)):
            self._held.append(flight)  # waits until answers in flight make room
            return
        self._dispatch(flight)

    def _release(self) -> None:
        """Send the held requests that fit in the budget now, in order."""
        assert self.budget is not None
        while self._held and self.budget.admit(self._held[0].request):
            self._dispatch(self._held.popleft())

    def _dispatch(self, flight: _Flight) -> None:
        token = self._next_token
        self._next_token += 1
        self._flights[token] = flight
        self._feed.put(token, flight.request)

    def _finish(self, tag: Any, outcome: Answer | Failure, tokens: int = 0) -> None:
        st = self.stats
        assert self.progress is not None
        if isinstance(outcome, Failure):
            st.failed += 1
            code = _reason_code(outcome.reason)
            st.failure_reasons[code] = st.failure_reasons.get(code, 0) + 1
            self.progress.update(failed=True)
        else:
            self.progress.update(cached=outcome.cached, tokens=tokens)
        self._ready.append((tag, outcome))

    def _check(
        self,
        req: ChatRequest,
        result: ChatResult,
        validate: Validator | None,
        salvage: Validator | None = None,
    ) -> tuple[list[Any], str | None, str, str]:
        """(parsed choices, None, "", "") when all validate, else ([], error, the bad text,
        its finish reason). Free text (no validator): an error when a choice is unfinished.
        A choice that fails ``validate`` is read by ``salvage``, if any: an answer cut short,
        at max_tokens or by a stop token the engine's grammar let through (whole or
        invalid answers fail it as they failed ``validate``)."""
        if validate is None:
            for choice in result.choices:
                why = unfinished(choice.text, choice.finish_reason)
                if why is not None:
                    return [], why, choice.text, choice.finish_reason
            return [], None, "", ""
        parsed: list[Any] = []
        for choice in result.choices:
            try:
                parsed.append(validate(req, choice.text))
                continue
            except ValueError as exc:
                error = str(exc)[:300]
            if salvage is not None:
                try:
                    parsed.append(salvage(req, choice.text))
                    continue
                except ValueError as exc:
                    error = str(exc)[:300]
            return [], error, choice.text, choice.finish_reason
        return parsed, None, "", ""

    def _admit(self, batch: list[Job]) -> None:
        """Answer what the cache holds, send the rest."""
        self.stats.requests += len(batch)
        hits = self.cache.get_many(j.request.key for j in batch)
        for job in batch:
            hit = hits.get(job.request.key)
            if hit is None:
                self._send(_Flight(job, job.request))
                continue
            if _cut(hit):
                self._retry_reasoning(_Flight(job, job.request), hit, cached=True)
                continue
            parsed, err, bad, finish = self._check(job.request, hit, job.validate, job.salvage)
            if err is None:
                self.stats.cached += 1
                self._finish(job.tag, Answer(hit, parsed, job.request, cached=True))
            elif job.validate is None:
                self._retry_text(_Flight(job, job.request), hit, finish, cached=True)
            else:
                # cached before validation was this strict: re-ask (from the cache if an
                # earlier run already did)
                self._reask(_Flight(job, job.request), bad, err, finish)

    def _reask(self, flight: _Flight, bad: str, err: str, finish: str) -> None:
        req = reask_request(flight.request, bad, err, finish)
        self.stats.reasks += 1
        if finish == "length":
            self.stats.length_reasks += 1
        nxt = _Flight(flight.job, req, flight.reasks + 1, flight.reasoning_retries)
        hit = self.cache.get(req.key)
        if hit is None:
            self._send(nxt)
            return
        job = flight.job
        if _cut(hit):
            self._retry_reasoning(nxt, hit, cached=True)
            return
        parsed, err2, bad2, finish2 = self._check(job.request, hit, job.validate, job.salvage)
        if err2 is None:
            self.stats.cached += 1
            self._finish(flight.job.tag, Answer(hit, parsed, req, cached=True, reasks=nxt.reasks))
        elif nxt.reasks < self.max_reasks:
            self._reask(nxt, bad2, err2, finish2)
        else:
            self._give_up(nxt, err2)

    def _retry_text(
        self, flight: _Flight, result: ChatResult, finish: str, *, cached: bool = False
    ) -> ChatResult | None:
        """An unfinished free-text answer: ask the same messages again once with twice the
        tokens (from the cache if an earlier run did), and return None. Past the retry,
        ``result`` is the answer, kept as it is (its finish reason says it is cut): a fresh
        one is returned for the caller to store, a cached one is finished here."""
        job = flight.job
        retry = text_retry(flight.request)
        if flight.reasks >= self.text_reasks or retry is None:
            if cached:
                self.stats.cached += 1
                answer = Answer(result, [], flight.request, cached=True, reasks=flight.reasks)
                self._finish(job.tag, answer)
                return None
            return result
        self.stats.reasks += 1
        if finish == "length":
            self.stats.length_reasks += 1
        nxt = _Flight(job, retry, flight.reasks + 1, flight.reasoning_retries)
        hit = self.cache.get(nxt.request.key)
        if hit is None:
            self._send(nxt)
        elif _cut(hit):
            self._retry_reasoning(nxt, hit, cached=True)
        else:
            self.stats.cached += 1
            self._finish(job.tag, Answer(hit, [], nxt.request, cached=True, reasks=nxt.reasks))
        return None

    def _retry_reasoning(self, flight: _Flight, result: ChatResult, *, cached: bool) -> None:
        """An answer whose reasoning used its whole budget (stored already when it is
        fresh): asked again with twice the budget (from the cache if an earlier run did);
        past ``reasoning_retries``, exhausted: a final failure of a JSON request, a free-text
        one handed over as it is (empty, cut), never validated."""
        job = flight.job
        self.stats.reasoning_cut += 1
        retry = None
        if flight.reasoning_retries < self.reasoning_retries:
            retry = retry_request(flight.request, self._reasoning)
        if retry is None:
            reason = cut_reason(result, flight.request, self._reasoning)
            if job.validate is None:
                self.stats.cached += cached
                answer = Answer(result, [], flight.request, cached=cached, reasks=flight.reasks)
                self._finish(job.tag, answer)
                return
            self.cache.put_error(job.request, self.stage, reason, flight.reasks + 1)
            self._finish(job.tag, Failure(reason, flight.reasks + 1, flight.reasks, final=True))
            return
        self.stats.reasks += 1
        nxt = _Flight(job, retry, flight.reasks + 1, flight.reasoning_retries + 1)
        hit = self.cache.get(retry.key)
        if hit is None:
            self._send(nxt)
            return
        if _cut(hit):
            self._retry_reasoning(nxt, hit, cached=True)
            return
        parsed, err, bad, finish = self._check(job.request, hit, job.validate, job.salvage)
        if err is None or job.validate is None:
            self.stats.cached += 1
            self._finish(job.tag, Answer(hit, parsed, retry, cached=True, reasks=nxt.reasks))
        elif nxt.reasks < self.max_reasks:
            self._reask(nxt, bad, err, finish)
        else:
            self._give_up(nxt, err)

    def _give_up(self, flight: _Flight, err: str) -> None:
        """Invalid after every re-ask: an error, never an answer; final after the budget."""
        job = flight.job
        earlier = self.cache.invalid_failures([job.request.key]).get(job.request.key, 0)
        reason = f"{INVALID_PREFIX}: {err} (after {flight.reasks} re-asks)"
        self.cache.put_error(job.request, self.stage, reason, flight.reasks + 1)
        final = earlier >= self.invalid_retry_runs
        self._finish(job.tag, Failure(reason, flight.reasks + 1, flight.reasks, final=final))

    def _receive(self, arrived: list[Any]) -> None:
        st = self.stats
        to_cache: list[tuple[ChatRequest, ChatResult, str, int]] = []
        errors: list[tuple[ChatRequest, str, str, int]] = []
        answered: list[tuple[Any, Answer, int]] = []
        failed: list[tuple[Any, Failure]] = []
        cut: list[tuple[_Flight, ChatResult]] = []
        for item in arrived:
            if isinstance(item, BaseException):
                raise item
            token, res = item
            flight = self._flights.pop(token)
            job = flight.job
            if self.budget is not None:
                self.budget.settle(flight.request, res)
            if isinstance(res, RequestFailure) and res.unanswered:
                # nothing was sent: its answer is to come from elsewhere (batch files). The
                # example waits, no error is recorded, and it does not count as a failure in
                # a row; the stage stops at the end, saying how many wait
                self._unanswered += 1
                failed.append((job.tag, Failure(res.reason, 0, flight.reasks)))
                continue
            if isinstance(res, RequestFailure) and not self.backend.answers_new:
                # nothing can answer it here; counted and reported once at the end
                self._replay_missing += 1
                failed.append((job.tag, Failure(res.reason, 0, flight.reasks, final=True)))
                continue
            if isinstance(res, RequestFailure):
                self._consecutive += 1
                errors.append((flight.request, self.stage, res.reason, res.attempts))
                failed.append((job.tag, Failure(res.reason, res.attempts, flight.reasks)))
                if self._consecutive >= self.abort_after_failures:
                    self.cache.put_errors(errors)
                    raise StageError(
                        f"stage '{self.stage}': {self._consecutive} requests in a row failed; "
                        f"{self.backend.failing}. Last error: {res.reason}"
                    )
                continue
            self._consecutive = 0
            st.sent += 1
            st.prompt_tokens += res.prompt_tokens
            st.completion_tokens += res.completion_tokens
            if res.reasoned:
                st.reasoned_answers += 1
                st.reasoning_tokens += res.reasoning_tokens
            if _cut(res):
                # no answer in it: stored (its tokens were spent; a re-run finds it, then its
                # retry), then, once stored, asked again with more reasoning budget or given up
                to_cache.append((flight.request, res, self.stage, flight.reasks))
                cut.append((flight, res))
                continue
            parsed, err, bad, finish = self._check(job.request, res, job.validate, job.salvage)
            if err is not None and job.validate is None:
                # free text: asked again once with more tokens; past that, kept as it is.
                # The unfinished answer is stored too, under its own request (its finish
                # reason says what it is): a re-run finds it, then its retry, and sends
                # nothing. It is never handed over as an answer while a retry is due.
                if self._retry_text(flight, res, finish) is None:
                    to_cache.append((flight.request, res, self.stage, flight.reasks))
                    continue
                err = None
            if err is None:
                to_cache.append((flight.request, res, self.stage, flight.reasks))
                answered.append(
                    (job.tag, Answer(res, parsed, flight.request, reasks=flight.reasks),
                     res.completion_tokens)
                )  # fmt: skip
            elif flight.reasks < self.max_reasks:
                self._reask(flight, bad, err, finish)
            else:
                self._give_up(flight, err)
        # durable first, acknowledged after: a yielded answer survives a kill
        self.cache.put_many(to_cache)
        self.cache.put_errors(errors)
        for flight, res in cut:
            self._retry_reasoning(flight, res, cached=False)
        for tag, answer, tokens in answered:
            self._finish(tag, answer, tokens)
        for tag, failure in failed:
            self._finish(tag, failure)
