"""What every backend must do for the runner and the stages (docs/backends.md): the
conformance suite. Not a test module itself: ``tests/test_backend_conformance.py`` runs it
for every registered backend, and a new backend runs it with one line in its own test
module (``tests/test_backend_echo.py``)::

    TestEcho = conformance(Harness(EchoBackend, lambda tmp: BackendSection(name="echo")))

A ``Harness`` says how to configure the backend for a test (and, for a backend that only
replays, how to record what it replays). Each test drives the real ``LLMRunner`` over a
real ``RequestCache``, and counts what reaches the backend by watching its request feed.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pipeline.backends.identity import describe, identity_id, owner
from pipeline.core.errors import BackendError
from pipeline.engine.llm import Answer, Failure, LLMRunner
from pipeline.kinds.backend import BACKENDS, Backend, BackendSection, RequestFeed
from pipeline.run.cache import RequestCache
from pipeline.types.chat import ChatRequest

SCHEMA = {
    "type": "object",
    "properties": {
        # an enum, as the stages' schemas have it: not every engine enforces minimum/maximum
        "score": {"type": "integer", "enum": [1, 2, 3, 4, 5]},
        "reason": {"type": "string", "maxLength": 80},
    },
    "required": ["score", "reason"],
    "additionalProperties": False,
}
FINISH_REASONS = {"stop", "length"}


@dataclass
class Harness:
    """How the suite sets a backend up: ``config(tmp_path, model)`` is its ``backend``
    section; ``record(tmp_path, cfg, jobs)``, for a backend that cannot answer new
    requests, records the answers to the suite's requests first (each job: requests and a
    validator) and returns the section that replays them; ``json_schema``: whether its
    answers follow a request's JSON schema (a fake engine's may not)."""

    backend: type[Backend]
    config: Callable[[Path, str], BackendSection]
    model: str = "conformance-model"
    json_schema: bool = True
    record: (
        Callable[[Path, BackendSection, list[tuple[list[ChatRequest], Any]]], BackendSection] | None
    ) = None


def _requests(model: str, count: int, tag: str, **kw: Any) -> list[ChatRequest]:
    return [
        ChatRequest(
            messages=(("system", "Answer in one sentence."), ("user", f"{tag} question {i}?")),
            model=model,
            temperature=0.0,
            top_p=1.0,
            max_tokens=64,
            seed=7 + i,
            **kw,
        )
        for i in range(count)
    ]


def _accept(req: ChatRequest, text: str) -> str:
    """Any answer: the suite checks the backend, not the runner's unfinished-text rule."""
    return text


class RejectFirst:
    """A validator that refuses the first answer to each request once (it is handed the
    stage's request, not the re-ask): the runner must re-ask, and take the second."""

    def __init__(self) -> None:
        self.refused: set[str] = set()

    def __call__(self, req: ChatRequest, text: str) -> str:
        if req.key not in self.refused:
            self.refused.add(req.key)
            raise ValueError("say it again, please")
        return text


def _schema_valid(req: ChatRequest, text: str) -> dict:
    value = json.loads(text)
    if not (isinstance(value, dict) and set(value) == {"score", "reason"}):
        raise ValueError(f"not the schema's object: {text[:80]}")
    if not (isinstance(value["score"], int) and 1 <= value["score"] <= 5):
        raise ValueError("score out of range")
    return value


def _texts(outcome: Answer | Failure) -> list[str]:
    assert isinstance(outcome, Answer), outcome
    return [c.text for c in outcome.result.choices]


class _Watched(RequestFeed):
    """The runner's feed, recording every request the backend takes from it."""

    def __init__(self, inner: RequestFeed, seen: list[ChatRequest]) -> None:
        self.inner, self.seen = inner, seen

    def put(self, token: Any, request: ChatRequest) -> None:  # pragma: no cover - unused
        self.inner.put(token, request)

    def close(self) -> None:  # pragma: no cover - unused
        self.inner.close()

    def __len__(self) -> int:
        return len(self.inner)

    async def get(self) -> tuple[Any, ChatRequest] | None:
        item = await self.inner.get()
        if item is not None:
            self.seen.append(item[1])
        return item

    async def take(self, n: int, linger: float = 0.0) -> list[tuple[Any, ChatRequest]]:
        items = await self.inner.take(n, linger)
        self.seen.extend(r for _, r in items)
        return items


def watch(backend: Backend) -> list[ChatRequest]:
    """Every request ``backend`` is handed from now on."""
    seen: list[ChatRequest] = []
    stream = backend.stream

    def watched(feed: RequestFeed) -> Any:
        return stream(_Watched(feed, seen))

    backend.stream = watched  # type: ignore[method-assign]
    return seen


def run_stage(
    cfg: BackendSection,
    cache_path: Path,
    requests: Sequence[ChatRequest],
    validate: Any = None,
    *,
    stop_after: int | None = None,
) -> tuple[dict[int, Answer | Failure], LLMRunner, list[ChatRequest]]:
    """The outcomes of one runner over ``requests`` (only the first ``stop_after`` when
    given: an interrupted stage), the runner, and what reached the backend."""

    async def go() -> tuple[dict[int, Answer | Failure], LLMRunner, list[ChatRequest]]:
        backend = BACKENDS.get(cfg.name).build(cfg, cache_path=cache_path)
        seen = watch(backend)
        out: dict[int, Answer | Failure] = {}
        with RequestCache(cache_path) as cache:
            runner = LLMRunner(backend, cache, "responses", progress=False, max_reasks=2)
            try:
                async for i, outcome in runner.stream(requests, validate):
                    out[i] = outcome
                    if stop_after is not None and len(out) >= stop_after:
                        break
            finally:
                await backend.aclose()
        return out, runner, seen

    return asyncio.run(go())


class Conformance:
    """The suite; ``harness`` is set by :func:`conformance` (or a fixture of that name)."""

    def _cfg(
        self, harness: Harness, tmp_path: Path, jobs: list[tuple[list, Any]]
    ) -> BackendSection:
        cfg = harness.config(tmp_path, harness.model)
        assert cfg.name == harness.backend.name
        if harness.record is not None:
            cfg = harness.record(tmp_path, cfg, jobs)
        return cfg

    def test_the_class_describes_its_kind(self, harness: Harness) -> None:
        cls = harness.backend
        assert BACKENDS.get(cls.name) is cls, "registered under its own name"
        cfg = harness.config(Path("."), harness.model)
        assert cls.asked(cfg)["backend"] == cls.name
        if cls.extra is not None:
            assert cls.extra in cls.install_hint() and "pip install" in cls.install_hint()
        section = cfg.section(cls.name)
        assert cls.settings is None or isinstance(section, cls.settings)

    def test_answers_are_cached_and_served_from_the_cache(
        self, harness: Harness, tmp_path: Path
    ) -> None:
        requests = _requests(harness.model, 6, "cache")
        cfg = self._cfg(harness, tmp_path, [(requests, _accept)])
        cache = tmp_path / "run" / "cache.sqlite"
        first, runner, seen = run_stage(cfg, cache, requests, _accept)
        assert all(isinstance(a, Answer) and not a.cached for a in first.values()), first
        assert sorted(r.key for r in seen) == sorted(r.key for r in requests)
        assert runner.stats.requests == 6 and runner.stats.failed == 0
        with RequestCache(cache, readonly=True) as c:
            assert c.count() == 6
        again, runner, seen = run_stage(cfg, cache, requests, _accept)
        assert seen == [] and runner.stats.cached == 6
        for i, a in again.items():
            assert isinstance(a, Answer) and a.cached
            assert [c.text for c in a.result.choices] == _texts(first[i])

    def test_identity_is_stable_and_described(self, harness: Harness, tmp_path: Path) -> None:
        requests = _requests(harness.model, 1, "identity")
        cfg = self._cfg(harness, tmp_path, [(requests, _accept)])
        cls = harness.backend
        cache = tmp_path / "run" / "cache.sqlite"
        kw: dict[str, Any] = {"cache_path": cache}
        one = cls.identify(cfg, [harness.model], **kw)
        two = cls.identify(cfg, [harness.model], **kw)
        assert identity_id(one) == identity_id(two)
        kind = str(one.get("kind"))
        assert kind == "stand-in" or owner(one) is not None, f"no backend owns kind {kind!r}"
        line = describe(one)
        assert line and "\n" not in line and line != kind
        assert isinstance(one.get("model_output"), bool)

    def test_an_invalid_answer_is_asked_again(self, harness: Harness, tmp_path: Path) -> None:
        requests = _requests(harness.model, 3, "reask")
        cfg = self._cfg(harness, tmp_path, [(requests, RejectFirst())])
        if not harness.backend.answers_new:
            # the runner stores valid answers only, so the refused first answers were never
            # recorded: a replay says in one line how many it lacks, and sends nothing
            with pytest.raises(BackendError) as err:
                run_stage(cfg, tmp_path / "run" / "cache.sqlite", requests, RejectFirst())
            assert "3 of 3 requests of stage 'responses' are not in the request cache" in str(
                err.value
            )
            return
        out, runner, seen = run_stage(cfg, tmp_path / "run" / "cache.sqlite", requests,
                                      RejectFirst())  # fmt: skip
        for a in out.values():
            assert isinstance(a, Answer), a
            assert a.reasks == 1 and len(a.request.messages) == 4
            assert a.request.messages[2][0] == "assistant"
        assert runner.stats.reasks == 3
        assert len(seen) == 6  # each request and its re-ask, once

    def test_an_interrupted_stage_resumes_from_the_cache(
        self, harness: Harness, tmp_path: Path
    ) -> None:
        requests = _requests(harness.model, 8, "resume")
        cfg = self._cfg(harness, tmp_path, [(requests, _accept)])
        cache = tmp_path / "run" / "cache.sqlite"
        first, _, _ = run_stage(cfg, cache, requests, _accept, stop_after=3)
        assert len(first) == 3
        out, runner, seen = run_stage(cfg, cache, requests, _accept)
        assert len(out) == 8 and all(isinstance(a, Answer) for a in out.values())
        # what the interrupted run answered is served again, never sent twice
        for i, a in first.items():
            assert _texts(out[i]) == _texts(a) and out[i].cached  # type: ignore[union-attr]
        assert runner.stats.cached >= 3
        assert {r.key for r in seen}.isdisjoint(requests[i].key for i in first)
        assert len(seen) + runner.stats.cached == 8

    def test_n_samples_and_finish_reasons(self, harness: Harness, tmp_path: Path) -> None:
        requests = _requests(harness.model, 2, "samples", n=3)
        cfg = self._cfg(harness, tmp_path, [(requests, _accept)])
        out, runner, _ = run_stage(cfg, tmp_path / "run" / "cache.sqlite", requests, _accept)
        for a in out.values():
            assert isinstance(a, Answer), a
            choices = a.result.choices
            assert len(choices) == 3
            assert all(isinstance(c.text, str) and c.text for c in choices)
            assert {c.finish_reason for c in choices} <= FINISH_REASONS
            assert a.result.prompt_tokens >= 0 and a.result.completion_tokens >= 0
        assert runner.stats.prompt_tokens >= 0

    def test_json_schema_requests_get_schema_answers(
        self, harness: Harness, tmp_path: Path
    ) -> None:
        if not harness.json_schema:
            return  # a fake engine without constrained decoding: its own tests cover it
        requests = _requests(harness.model, 3, "schema", json_schema=SCHEMA)
        cfg = self._cfg(harness, tmp_path, [(requests, _schema_valid)])
        out, _, _ = run_stage(cfg, tmp_path / "run" / "cache.sqlite", requests, _schema_valid)
        for a in out.values():
            assert isinstance(a, Answer), a
            assert all(isinstance(p, dict) and 1 <= p["score"] <= 5 for p in a.parsed)


def conformance(harness: Harness) -> type:
    """The suite as a test class for one backend: ``TestX = conformance(Harness(...))``."""

    class Suite(Conformance):
        @pytest.fixture()
        def harness(self) -> Harness:
            return harness_

    harness_ = harness
    Suite.__name__ = Suite.__qualname__ = f"Test{harness.backend.__name__}Conformance"
    return Suite
