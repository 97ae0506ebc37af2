"""The streaming LLM runner: bounded window, lazy input, follow-up jobs, re-asks that raise
max_tokens after a cut-off answer, and failures that stay failures (never cached as
answers, retried on the next run, final after the retry budget)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from pipeline.core.errors import BackendError
from pipeline.engine.llm import Answer, Failure, Job, LLMRunner
from pipeline.kinds.backend import Backend, RequestFeed
from pipeline.run.cache import RequestCache
from pipeline.types import schemas
from pipeline.types.chat import ChatRequest, ChatResult, Choice, RequestFailure

SCHEMA = schemas.pairwise_schema(256)


def validate(req: ChatRequest, text: str) -> Any:
    return schemas.parse(SCHEMA, text)


class ScriptedBackend(Backend):
    """Answers with ``answer(request) -> (text, finish_reason)``; records what it saw and
    the most requests it ever held at once."""

    name = "scripted"
    stream_chunk = 8

    def __init__(self, answer: Callable[[ChatRequest], tuple[str, str] | None]) -> None:
        self.answer = answer
        self.seen: list[ChatRequest] = []
        self.holding = 0
        self.peak = 0

    async def run(
        self, requests: Sequence[ChatRequest]
    ) -> AsyncIterator[tuple[int, ChatResult | RequestFailure]]:
        for i, req in enumerate(requests):
            self.seen.append(req)
            got = self.answer(req)
            await asyncio.sleep(0)
            if got is None:
                yield i, RequestFailure("HTTP 503: unavailable", attempts=3)
            else:
                yield i, ChatResult([Choice(*got)], 10, 5, "m")

    async def stream(self, feed: RequestFeed) -> AsyncIterator[tuple[Any, Any]]:
        while True:
            batch = await feed.take(self.stream_chunk)
            if not batch:
                return
            self.holding += len(batch)
            self.peak = max(self.peak, self.holding + len(feed))
            async for j, res in self.run([r for _, r in batch]):
                self.holding -= 1
                yield batch[j][0], res


def request(i: int, max_tokens: int = 256) -> ChatRequest:
    return ChatRequest(
        messages=(("user", f"question {i}"),),
        model="m",
        max_tokens=max_tokens,
        json_schema=SCHEMA,
        schema_name="PairwiseVerdict",
    )


def good(req: ChatRequest) -> tuple[str, str]:
    return json.dumps({"winner": "A", "rationale": "ok"}), "stop"


def collect(runner: LLMRunner, jobs: Any) -> list[tuple[Any, Any]]:
    async def go() -> list[tuple[Any, Any]]:
        return [x async for x in runner.run(jobs)]

    return asyncio.run(go())


@pytest.fixture
def cache(tmp_path: Path):
    with RequestCache(tmp_path / "cache.sqlite") as c:
        yield c


def test_window_bounds_requests_in_flight_and_input_is_read_lazily(cache):
    backend = ScriptedBackend(good)
    runner = LLMRunner(backend, cache, "t", progress=False, window=16, lookup_batch=4)
    pulled = 0
    lead = []  # jobs pulled but not yet answered, each time an outcome is yielded

    def jobs():
        nonlocal pulled
        for i in range(500):
            pulled += 1
            yield Job(request(i), i, validate)

    async def go() -> list[Any]:
        out = []
        async for tag, outcome in runner.run(jobs()):
            out.append((tag, outcome))
            lead.append(pulled - len(out))
        return out

    out = asyncio.run(go())
    assert sorted(t for t, _ in out) == list(range(500))
    assert all(isinstance(o, Answer) for _, o in out)
    assert backend.peak <= 16
    # the input is consumed as the window frees up, never far ahead of the answers
    assert max(lead) <= 16 + 4
    assert cache.count() == 500


def test_cached_answers_are_served_without_the_backend(cache):
    backend = ScriptedBackend(good)
    collect(LLMRunner(backend, cache, "t", progress=False), (Job(request(i), i, validate)
                                                           for i in range(20)))  # fmt: skip
    backend.seen.clear()
    runner = LLMRunner(backend, cache, "t", progress=False)
    out = collect(runner, (Job(request(i), i, validate) for i in range(20)))
    assert backend.seen == []
    assert all(o.cached for _, o in out)
    assert runner.stats.cached == 20 and runner.stats.sent == 0


def test_pushed_follow_ups_are_answered_in_the_same_run(cache):
    backend = ScriptedBackend(good)
    runner = LLMRunner(backend, cache, "t", progress=False, window=4)

    async def go() -> list[Any]:
        tags = []
        async for tag, _ in runner.run(Job(request(i), ("first", i), validate) for i in range(10)):
            tags.append(tag)
            if tag[0] == "first":
                runner.push(Job(request(100 + tag[1]), ("follow", tag[1]), validate))
        return tags

    tags = asyncio.run(go())
    assert sorted(t for t in tags if t[0] == "follow") == [("follow", i) for i in range(10)]
    assert len(tags) == 20


def test_cut_off_answer_is_reasked_with_more_tokens(cache):
    """A JSON answer cut at max_tokens is re-asked with twice the tokens, not the same."""
    full = json.dumps({"winner": "B", "rationale": "x" * 150})

    def answer(req: ChatRequest) -> tuple[str, str]:
        if req.max_tokens < 200:  # the model needs ~170 tokens to finish this answer
            return full[: req.max_tokens], "length"
        return full, "stop"

    backend = ScriptedBackend(answer)
    runner = LLMRunner(backend, cache, "t", progress=False, max_reasks=3)
    ((_, outcome),) = collect(runner, [Job(request(0, max_tokens=60), 0, validate)])
    assert isinstance(outcome, Answer)
    assert [r.max_tokens for r in backend.seen] == [60, 120, 240]
    assert outcome.request.max_tokens == 240 and outcome.parsed[0]["winner"] == "B"
    assert runner.stats.length_reasks == 2
    # the re-asks say why: the answer was cut off
    assert "cut off" in backend.seen[1].messages[-1][1]


def test_invalid_answers_are_errors_retried_next_run_then_final(cache):
    """Still invalid after the re-asks: recorded as an error, never cached as an answer,
    pending (retried) on the next run; after invalid_retry_runs such runs, final."""
    backend = ScriptedBackend(lambda req: ('{"winner": "C", "rationale": "r"}', "stop"))

    def once() -> Failure:
        runner = LLMRunner(backend, cache, "t", progress=False, max_reasks=1)
        ((_, outcome),) = collect(runner, [Job(request(0), 0, validate)])
        assert isinstance(outcome, Failure)
        return outcome

    first = once()
    assert not first.final and first.reason.startswith("invalid_json")
    assert "answer.winner: must be one of" in first.reason
    assert cache.count() == 0  # nothing invalid is stored as an answer
    assert len(cache.errors("t")) == 1
    sent = len(backend.seen)
    second = once()
    assert len(backend.seen) == sent + 2  # the request and its re-ask were sent again
    assert second.final


def test_a_transient_burst_of_bad_answers_heals_on_the_next_run(cache):
    calls = {"n": 0}

    def answer(req: ChatRequest) -> tuple[str, str]:
        calls["n"] += 1
        return ("{not json", "stop") if calls["n"] <= 2 else good(req)

    backend = ScriptedBackend(answer)
    runner = LLMRunner(backend, cache, "t", progress=False, max_reasks=1)
    ((_, first),) = collect(runner, [Job(request(0), 0, validate)])
    assert isinstance(first, Failure) and not first.final
    runner = LLMRunner(backend, cache, "t", progress=False, max_reasks=1)
    ((_, second),) = collect(runner, [Job(request(0), 0, validate)])
    assert isinstance(second, Answer) and second.parsed[0]["winner"] == "A"
    assert cache.get(request(0).key) is not None


def test_transport_failures_are_pending_and_summed(cache):
    backend = ScriptedBackend(lambda req: None if "1" in req.messages[0][1] else good(req))
    runner = LLMRunner(backend, cache, "t", progress=False)
    out = dict(collect(runner, (Job(request(i), i, validate) for i in range(12))))
    failed = [i for i, o in out.items() if isinstance(o, Failure)]
    assert failed == [1, 10, 11]
    assert all(not out[i].final for i in failed)
    assert runner.stats.failure_reasons == {"HTTP 503": 3}
    assert len(cache.errors("t")) == 3


def test_replay_misses_are_counted_and_reported(cache, tmp_path):
    from pipeline.backends.replay import ReplayBackend
    from pipeline.config import BackendSection

    collect(LLMRunner(ScriptedBackend(good), cache, "t", progress=False),
            (Job(request(i), i, validate) for i in range(3)))  # fmt: skip
    replay = ReplayBackend(BackendSection(name="replay"), cache_path=cache.path)
    runner = LLMRunner(replay, cache, "t", progress=False)
    with pytest.raises(BackendError, match="replay: 2 of 5 requests of stage 't'"):
        collect(runner, (Job(request(i), i, validate) for i in range(5)))


def test_a_fully_cached_input_is_still_read_lazily(cache):
    """Cache hits never enter the in-flight set; the window must still bound how far the
    input is read ahead of what the stage has consumed."""
    backend = ScriptedBackend(good)
    collect(LLMRunner(backend, cache, "t", progress=False),
            (Job(request(i), i, validate) for i in range(300)))  # fmt: skip
    runner = LLMRunner(backend, cache, "t", progress=False, window=16, lookup_batch=4)
    pulled = 0
    lead = []

    def jobs():
        nonlocal pulled
        for i in range(300):
            pulled += 1
            yield Job(request(i), i, validate)

    async def go() -> int:
        n = 0
        async for _ in runner.run(jobs()):
            n += 1
            lead.append(pulled - n)
        return n

    assert asyncio.run(go()) == 300
    assert runner.stats.cached == 300
    assert max(lead) <= 16 + 4


def test_request_keys_are_the_canonical_json_of_the_request():
    """ChatRequest.key builds its canonical JSON from parts (the schema serialised once);
    it must equal canonical_json(to_dict()) to the byte, or every cached answer is lost."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from pipeline.core.ids import canonical_json, content_hash

    text = st.text(alphabet=st.characters(exclude_categories=["Cs"]), max_size=60)
    schemas_ = st.sampled_from(
        [
            None,
            SCHEMA,
            schemas.quality_schema(1024),
            {"type": "object", "properties": {"é\\": {"enum": [1.5]}}},
        ]
    )

    @settings(max_examples=400, deadline=None)
    @given(
        messages=st.lists(st.tuples(st.sampled_from(["system", "user", "assistant"]), text),
                          min_size=1, max_size=4),
        model=text,
        temperature=st.floats(0, 2, allow_nan=False) | st.integers(0, 2),
        top_p=st.floats(0.01, 1, allow_nan=False),
        max_tokens=st.integers(1, 100_000),
        n=st.integers(1, 8),
        seed=st.none() | st.integers(-(2**31), 2**31),
        schema=schemas_,
        name=text,
    )  # fmt: skip
    def check(messages, model, temperature, top_p, max_tokens, n, seed, schema, name):
        req = ChatRequest(tuple(messages), model, temperature, top_p, max_tokens, n, seed,
                          schema, name)  # fmt: skip
        assert req.canonical() == canonical_json(req.to_dict())
        assert req.key == content_hash(req.to_dict())

    check()


# ---- an answer cut short: read up to the cut when its decisions are whole ---------------


def _cut_job(i: int) -> Job:
    def salvage(req: ChatRequest, text: str) -> Any:
        return schemas.read(SCHEMA, text, cut=True, clip=True)

    return Job(request(i), i, lambda req, text: schemas.read(SCHEMA, text, clip=True), salvage)


@pytest.mark.parametrize("finish", ["length", "stop"])
def test_a_verdict_cut_after_its_decision_is_kept_without_a_reask(tmp_path: Path, finish: str):
    """Cut at max_tokens, or by a stop token a grammar let through inside the string (seen
    on vLLM's xgrammar): the winner is whole, so the verdict is kept, marked as cut."""

    def cut(req: ChatRequest) -> tuple[str, str]:
        return '{"winner": "B", "rationale": "It names the \\"tool\\" and then it goes on', finish

    backend = ScriptedBackend(cut)
    with RequestCache(tmp_path / "c.sqlite") as cache:
        runner = LLMRunner(backend, cache, "judge", progress=False)
        ((_, outcome),) = collect(runner, [_cut_job(0)])
    assert isinstance(outcome, Answer) and outcome.reasks == 0
    reading = outcome.parsed[0]
    assert reading.cut and reading.value["winner"] == "B"
    assert reading.value["rationale"] == 'It names the "tool" and then it goes on'
    assert len(backend.seen) == 1 and runner.stats.reasks == 0


def test_a_verdict_cut_before_its_decision_is_asked_again(tmp_path: Path):
    answers = iter([('{"winner": "ti', "length"), ('{"winner": "tie", "rationale": "x"}', "stop")])
    backend = ScriptedBackend(lambda req: next(answers))
    with RequestCache(tmp_path / "c.sqlite") as cache:
        runner = LLMRunner(backend, cache, "judge", progress=False)
        ((_, outcome),) = collect(runner, [_cut_job(0)])
    assert isinstance(outcome, Answer) and outcome.reasks == 1
    assert not outcome.parsed[0].cut and outcome.parsed[0].value["winner"] == "tie"
    # cut at max_tokens: asked again with twice the tokens
    assert [r.max_tokens for r in backend.seen] == [256, 512]
    assert runner.stats.length_reasks == 1
