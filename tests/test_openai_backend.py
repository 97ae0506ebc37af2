"""The openai backend and the LLM runner against the stand-in server, over real HTTP.

Each fault test asserts the outcome and exactly how many requests the server saw, so a
retry that multiplies (or one that never happens) fails here. No pytest-asyncio: every
test drives its own loop with ``asyncio.run``.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from standin_server import StandinServer

from pipeline.backends.openai.backend import OpenAIBackend
from pipeline.backends.replay import ReplayBackend
from pipeline.config import BackendSection
from pipeline.core.errors import BackendError, StageError
from pipeline.engine.llm import REASK_TEMPLATE, Answer, Failure, LLMRunner
from pipeline.run.cache import RequestCache
from pipeline.types.chat import ChatRequest, ChatResult, RequestFailure

MODEL = "standin-model"
SCHEMA = {
    "type": "object",
    "properties": {"aspects": {"type": "array", "items": {"type": "string"}, "minItems": 1}},
    "required": ["aspects"],
    "additionalProperties": False,
}


def backend_cfg(server: StandinServer, **kw: Any) -> BackendSection:
    opts: dict[str, Any] = {
        "timeout_s": 60.0,  # generous: a busy machine must not time a request out
        "max_attempts": 3,
        "backoff_initial_s": 0.01,
        "backoff_max_s": 0.5,
        "max_concurrency": 4,
    }
    opts.update(kw)
    return BackendSection(name="openai", model=MODEL, base_url=server.base_url, **opts)


def req(text: str, **kw: Any) -> ChatRequest:
    return ChatRequest(messages=(("system", "Be brief."), ("user", text)), model=MODEL, **kw)


def last_user(body: dict[str, Any]) -> str:
    return body["messages"][-1]["content"]


def run_backend(
    cfg: BackendSection, requests: Sequence[ChatRequest]
) -> tuple[list[ChatResult | RequestFailure], float, OpenAIBackend]:
    """All results in input order, the wall time, and the (closed) backend."""

    async def go() -> tuple[dict[int, ChatResult | RequestFailure], float, OpenAIBackend]:
        backend = OpenAIBackend(cfg)  # built inside the loop, as Context.llm does
        out: dict[int, ChatResult | RequestFailure] = {}
        t0 = time.perf_counter()
        try:
            async for i, res in backend.run(requests):
                assert i not in out, f"index {i} yielded twice"
                out[i] = res
        finally:
            await backend.aclose()
        return out, time.perf_counter() - t0, backend

    out, seconds, backend = asyncio.run(go())
    assert sorted(out) == list(range(len(requests)))
    return [out[i] for i in range(len(requests))], seconds, backend


def one(cfg: BackendSection, request: ChatRequest | None = None) -> tuple[Any, float]:
    results, seconds, _ = run_backend(cfg, [request or req("hello")])
    return results[0], seconds


def statuses(server: StandinServer) -> list[int]:
    return [r["status"] for r in server.requests]


# -- the backend alone: one test per fault -------------------------------------------------


@pytest.mark.parametrize("transport", ["aiohttp", "httpx"])
def test_happy_path_on_both_transports(server: StandinServer, transport: str) -> None:
    server.responder = lambda body, i: f"echo {last_user(body)} #{i}"
    requests = [req(f"q{k}", n=2, seed=k, temperature=0.7, max_tokens=50) for k in range(6)]
    results, _, backend = run_backend(backend_cfg(server, http_transport=transport), requests)

    # the configured transport is the one really used
    http_client = type(backend.client._client).__name__
    assert ("AioHttp" in http_client) == (transport == "aiohttp"), http_client
    # every answer comes back under its own request's index, with all n choices
    for k, res in enumerate(results):
        assert isinstance(res, ChatResult)
        assert [c.text for c in res.choices] == [f"echo q{k} #0", f"echo q{k} #1"]
        assert {c.finish_reason for c in res.choices} == {"stop"}
        assert res.prompt_tokens > 0 and res.completion_tokens > 0
        assert res.model == MODEL
    assert server.request_count == 6
    body = next(r["body"] for r in server.requests if last_user(r["body"]) == "q3")
    assert (body["n"], body["seed"], body["temperature"], body["max_tokens"]) == (2, 3, 0.7, 50)
    assert "response_format" not in body


def test_json_schema_is_sent_as_response_format(server: StandinServer) -> None:
    res, _ = one(backend_cfg(server), req("rubric please", json_schema=SCHEMA, schema_name="rub"))
    fmt = server.requests[0]["body"]["response_format"]
    assert fmt == {"type": "json_schema", "json_schema": {"name": "rub", "schema": SCHEMA}}
    assert isinstance(json.loads(res.choices[0].text)["aspects"], list)


def test_429_waits_for_retry_after_then_succeeds(server: StandinServer) -> None:
    server.inject("429", retry_after=0.3)
    # backoff_initial_s is 0.01, so only the header can explain a wait of 0.3 s
    res, seconds = one(backend_cfg(server))
    assert isinstance(res, ChatResult)
    assert statuses(server) == [429, 200]
    first, second = server.requests
    assert second["time"] - first["time"] >= 0.25
    assert seconds >= 0.25


def test_retry_after_is_capped_by_backoff_max(server: StandinServer) -> None:
    server.inject("429", retry_after=30)
    res, seconds = one(backend_cfg(server, backoff_max_s=0.2))
    assert isinstance(res, ChatResult)
    assert statuses(server) == [429, 200]
    assert seconds < 20  # waited backoff_max_s, not the 30 s asked for


@pytest.mark.parametrize("kind", ["500", "503"])
def test_5xx_is_retried(server: StandinServer, kind: str) -> None:
    server.inject(kind)
    res, _ = one(backend_cfg(server))
    assert isinstance(res, ChatResult) and res.choices[0].text
    assert statuses(server) == [int(kind), 200]


@pytest.mark.parametrize("transport", ["aiohttp", "httpx"])
def test_slow_answer_times_out_and_is_retried(server: StandinServer, transport: str) -> None:
    # the slow answer takes 120 s; the timeout is 3 s, long enough for the retry's answer
    # (milliseconds) to arrive even on a busy machine
    server.inject("slow", delay=120.0)
    res, seconds = one(backend_cfg(server, timeout_s=3.0, http_transport=transport))
    assert isinstance(res, ChatResult)
    assert server.request_count == 2
    assert [r["fault"] for r in server.requests] == ["slow", None]
    # the client gave up after its timeout instead of waiting out the slow answer
    assert 3.0 <= seconds < 60


def test_malformed_body_is_retried(server: StandinServer) -> None:
    server.inject("malformed")
    res, _ = one(backend_cfg(server))
    assert isinstance(res, ChatResult) and res.choices[0].text
    assert [r["fault"] for r in server.requests] == ["malformed", None]


def test_400_is_not_retried(server: StandinServer) -> None:
    server.inject("400", count=5)
    res, _ = one(backend_cfg(server, max_attempts=5))
    assert isinstance(res, RequestFailure)
    assert res.transient is False
    assert res.attempts == 1
    assert "400" in res.reason
    assert server.request_count == 1


def test_persistent_500_gives_up_after_max_attempts(server: StandinServer) -> None:
    server.inject("500", count=10)
    res, _ = one(backend_cfg(server, max_attempts=3))
    assert isinstance(res, RequestFailure)
    assert res.transient is True
    assert res.attempts == 3
    assert "500" in res.reason
    assert statuses(server) == [500, 500, 500]


def test_length_finish_reason_is_data_not_an_error(server: StandinServer) -> None:
    server.inject("length")
    res, _ = one(backend_cfg(server))
    assert isinstance(res, ChatResult)
    assert res.choices[0].finish_reason == "length"
    assert res.choices[0].text
    assert server.request_count == 1


def test_concurrency_is_bounded(server: StandinServer) -> None:
    # The responder's sleep is the server's 100 ms latency, and it sees every request in
    # flight on the server side, so it can count them.
    state = {"now": 0, "max": 0, "done": 0}

    async def responder(body: dict[str, Any], i: int) -> None:
        state["now"] += 1
        state["max"] = max(state["max"], state["now"])
        try:
            await asyncio.sleep(0.1)
        finally:
            state["now"] -= 1
            state["done"] += 1
        return None  # fall back to the generated answer

    server.responder = responder
    requests = [req(f"q{k}") for k in range(20)]
    results, _, _ = run_backend(backend_cfg(server, max_concurrency=4), requests)
    assert all(isinstance(r, ChatResult) for r in results)
    assert server.request_count == 20 and state["done"] == 20
    assert state["max"] <= 4
    assert state["max"] == 4  # the pool is really used, not one request at a time


# -- through LLMRunner and the request cache ------------------------------------------------


def run_runner(
    cfg: BackendSection,
    cache: RequestCache,
    requests: Sequence[ChatRequest],
    validate: Any = None,
    *,
    stage: str = "responses",
    backend: Any = None,
    **runner_kw: Any,
) -> tuple[dict[int, Answer | Failure], LLMRunner]:
    async def go() -> tuple[dict[int, Answer | Failure], LLMRunner]:
        b = backend if backend is not None else OpenAIBackend(cfg)
        runner = LLMRunner(b, cache, stage, progress=False, **runner_kw)
        out: dict[int, Answer | Failure] = {}
        try:
            async for i, outcome in runner.stream(requests, validate):
                out[i] = outcome
        finally:
            await b.aclose()
        return out, runner

    return asyncio.run(go())


def validate_aspects(_req: ChatRequest, text: str) -> dict:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON: {exc.msg}") from None
    if not isinstance(value, dict) or not isinstance(value.get("aspects"), list):
        raise ValueError("aspects: missing")
    return value


def test_second_run_is_served_from_the_cache(server: StandinServer, tmp_path: Path) -> None:
    requests = [req(f"q{k}", n=2, seed=k) for k in range(6)]
    path = tmp_path / "cache.sqlite"
    with RequestCache(path) as cache:
        first, runner = run_runner(backend_cfg(server), cache, requests)
    assert all(isinstance(a, Answer) and not a.cached for a in first.values())
    assert runner.stats.sent == 6
    assert server.request_count == 6

    with RequestCache(path) as cache:  # reopened from disk: the answers are durable
        assert cache.count("responses") == 6
        second, runner = run_runner(backend_cfg(server), cache, requests)
    assert server.request_count == 6  # not one new request
    assert len(second) == 6
    for i, ans in second.items():
        assert isinstance(ans, Answer) and ans.cached
        assert [c.text for c in ans.result.choices] == [c.text for c in first[i].result.choices]
    assert (runner.stats.cached, runner.stats.sent) == (6, 0)


def test_failed_request_is_recorded_and_retried_next_run(
    server: StandinServer, tmp_path: Path
) -> None:
    requests = [req(f"q{k}") for k in range(3)]
    server.inject("500", count=3, match=lambda body: last_user(body) == "q1")
    with RequestCache(tmp_path / "cache.sqlite") as cache:
        out, runner = run_runner(backend_cfg(server, max_attempts=3), cache, requests)
        assert isinstance(out[1], Failure) and "500" in out[1].reason
        assert out[1].attempts == 3
        assert isinstance(out[0], Answer) and isinstance(out[2], Answer)
        errors = cache.errors()
        assert [(e["key"], e["stage"], e["attempts"]) for e in errors] == [
            (requests[1].key, "responses", 3)
        ]
        assert "500" in errors[0]["reason"]
        # a failure is never stored as data
        assert cache.get(requests[1].key) is None
        assert cache.count() == 2
        assert runner.stats.failed == 1 and runner.stats.failure_reasons == {"HTTP 500": 1}
        assert server.request_count == 5  # 1 + 3 attempts + 1

        again, runner = run_runner(backend_cfg(server), cache, requests)
        assert server.request_count == 6  # only the failed one is sent again
        assert last_user(server.requests[-1]["body"]) == "q1"
        assert all(isinstance(a, Answer) for a in again.values())
        assert again[1].cached is False and again[0].cached and again[2].cached
        assert cache.get(requests[1].key) is not None
        assert cache.count() == 3


def test_invalid_json_is_reasked_once(server: StandinServer, tmp_path: Path) -> None:
    server.inject("bad_json")
    request = req("give me a rubric", json_schema=SCHEMA)
    with RequestCache(tmp_path / "cache.sqlite") as cache:
        out, runner = run_runner(
            backend_cfg(server), cache, [request], validate_aspects, max_reasks=2
        )
    ans = out[0]
    assert isinstance(ans, Answer)
    assert ans.reasks == 1
    assert isinstance(ans.parsed[0]["aspects"], list) and ans.parsed[0]["aspects"]
    assert ans.request is not None and ans.request.key != request.key
    assert server.request_count == 2
    assert runner.stats.reasks == 1
    reask = server.requests[1]["body"]
    assert reask["messages"][-2] == {"role": "assistant", "content": '{"aspects": ['}
    assert last_user(reask).startswith(REASK_TEMPLATE.split("{", 1)[0])
    assert reask["response_format"]["json_schema"]["schema"] == SCHEMA


def test_reask_with_several_choices_quotes_the_invalid_one_and_keeps_n(
    server: StandinServer, tmp_path: Path
) -> None:
    # first request: choice 0 valid, choice 1 not JSON; re-asks get generated answers
    server.responder = lambda body, i: (
        ('{"aspects": ["a"]}' if i == 0 else "not json") if len(body["messages"]) == 2 else None
    )
    with RequestCache(tmp_path / "cache.sqlite") as cache:
        out, _ = run_runner(
            backend_cfg(server), cache, [req("rubric", n=2, json_schema=SCHEMA)], validate_aspects
        )
    reask = server.requests[1]["body"]
    assert reask["messages"][-2]["content"] == "not json"
    assert isinstance(out[0], Answer) and len(out[0].result.choices) == 2


def test_invalid_json_every_time_fails_after_max_reasks(
    server: StandinServer, tmp_path: Path
) -> None:
    server.inject("bad_json", count=10)
    with RequestCache(tmp_path / "cache.sqlite") as cache:
        out, runner = run_runner(
            backend_cfg(server),
            cache,
            [req("give me a rubric", json_schema=SCHEMA)],
            validate_aspects,
            max_reasks=2,
        )
    fail = out[0]
    assert isinstance(fail, Failure)
    assert fail.reason.startswith("invalid_json")
    assert fail.reasks == 2
    assert server.request_count == 3  # the request and two re-asks
    assert runner.stats.failure_reasons == {"invalid_json": 1}


def test_replay_over_incomplete_cache_names_missing_count_and_stage(
    server: StandinServer, tmp_path: Path
) -> None:
    requests = [req(f"q{k}") for k in range(5)]
    path = tmp_path / "cache.sqlite"
    with RequestCache(path) as cache:
        run_runner(backend_cfg(server), cache, requests[:2], stage="rubrics")
    assert server.request_count == 2

    replay_cfg = BackendSection(name="replay", model=MODEL, replay_cache=path)
    with RequestCache(path) as cache:
        with pytest.raises(BackendError) as err:
            run_runner(
                replay_cfg, cache, requests, stage="rubrics", backend=ReplayBackend(replay_cfg)
            )
        # the complete subset replays without a server
        out, _ = run_runner(
            replay_cfg, cache, requests[:2], stage="rubrics", backend=ReplayBackend(replay_cfg)
        )
    assert "3 of 5" in str(err.value)
    assert "'rubrics'" in str(err.value)
    assert all(isinstance(a, Answer) and a.cached for a in out.values())
    assert server.request_count == 2  # replay never talks to a server


def test_replay_answers_from_a_separate_replay_cache(server: StandinServer, tmp_path: Path) -> None:
    requests = [req(f"q{k}") for k in range(3)]
    recorded = tmp_path / "gpu-run" / "cache.sqlite"
    with RequestCache(recorded) as cache:
        run_runner(backend_cfg(server), cache, requests)
    replay_cfg = BackendSection(name="replay", model=MODEL, replay_cache=recorded)
    with RequestCache(tmp_path / "here" / "cache.sqlite") as cache:
        out, _ = run_runner(replay_cfg, cache, requests, backend=ReplayBackend(replay_cfg))
        assert cache.count() == 3  # replayed answers land in this run's own cache
    assert all(isinstance(a, Answer) for a in out.values())
    assert server.request_count == 3  # the recording run only


def test_consecutive_failures_abort_the_stage(server: StandinServer, tmp_path: Path) -> None:
    server.inject("400", count=1000)
    requests = [req(f"q{k}") for k in range(200)]

    async def go(cache: RequestCache) -> tuple[StageError, int, int]:
        backend = OpenAIBackend(backend_cfg(server, max_concurrency=4))
        runner = LLMRunner(backend, cache, "responses", abort_after_failures=3, progress=False)
        try:
            with pytest.raises(StageError) as err:
                async for _ in runner.stream(requests):
                    pass
            # the loop keeps running (as it would in a caller that handles the error):
            # requests already in flight may still land, but the aborted stage must not go
            # on working through the other ~190
            await asyncio.sleep(0.3)
            settled = server.request_count
            await asyncio.sleep(0.3)
            return err.value, settled, server.request_count
        finally:
            await backend.aclose()

    with RequestCache(tmp_path / "cache.sqlite") as cache:
        err, settled, later = asyncio.run(go(cache))
        assert cache.count() == 0
        assert 3 <= len(cache.errors()) <= 3 + 4
    assert "3 requests in a row failed" in str(err)
    assert "'responses'" in str(err) and "400" in str(err)
    # 4 workers: up to one more request each before the abort, and one in flight after it
    assert settled <= 3 + 2 * 4
    assert later == settled


def test_failures_that_are_not_consecutive_do_not_abort(
    server: StandinServer, tmp_path: Path
) -> None:
    odd = {f"q{k}" for k in range(1, 10, 2)}
    server.inject("400", count=5, match=lambda body: last_user(body) in odd)
    requests = [req(f"q{k}") for k in range(10)]
    with RequestCache(tmp_path / "cache.sqlite") as cache:
        out, runner = run_runner(
            backend_cfg(server, max_concurrency=1), cache, requests, abort_after_failures=2
        )
        assert len(cache.errors()) == 5 and cache.count() == 5
    assert sum(isinstance(o, Failure) for o in out.values()) == 5
    assert runner.stats.failed == 5 and server.request_count == 10


# ---- a busy server is not a missing one ---------------------------------------------------


class _SlowModels:
    """A loopback HTTP server whose /models answers after ``delays`` seconds, one delay
    per ask (the last repeats): a single-threaded server busy generating."""

    def __init__(self, delays: list[float]) -> None:
        import http.server
        import threading

        owner = self
        self.asks = 0

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                delay = delays[min(owner.asks, len(delays) - 1)]
                owner.asks += 1
                time.sleep(delay)
                body = json.dumps({"data": [{"id": "m", "object": "model"}]}).encode()
                try:
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except OSError:  # the client gave up waiting
                    pass

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def test_a_busy_server_is_waited_for_then_named_busy_not_down(monkeypatch) -> None:
    """llama-cpp-python's server answers one request at a time: /models waited behind a
    generation past the 10 s check, and the run said it could not reach it, suggesting
    `vllm serve`. It is now asked again with the requests' own timeout, and a server still
    silent is called busy."""
    import pipeline.backends.openai.wire as ob
    from pipeline.kinds.settings import OpenAISettings

    monkeypatch.setattr(ob, "MODELS_FIRST_WAIT_S", 0.3)
    slow = _SlowModels([0.8, 0.0])  # busy for the first ask only
    try:
        cfg = OpenAISettings(base_url=slow.base_url, timeout_s=5)
        ob.check_reachable(cfg)  # answered on the second ask
        assert slow.asks == 2
    finally:
        slow.close()
    silent = _SlowModels([3.0])
    try:
        cfg = OpenAISettings(base_url=silent.base_url, timeout_s=0.8)
        with pytest.raises(BackendError) as info:
            ob.check_reachable(cfg)
        msg = str(info.value)
        assert "took the connection but did not answer /models within 0.8 s" in msg
        assert "busy" in msg and "vllm serve" not in msg and "backend.openai.timeout_s" in msg
    finally:
        silent.close()


def test_a_server_that_is_not_there_names_how_to_start_one() -> None:
    import socket

    import pipeline.backends.openai.wire as ob
    from pipeline.kinds.settings import OpenAISettings

    with socket.socket() as s:  # a free port, closed again: nothing listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(BackendError) as info:
        ob.check_reachable(OpenAISettings(base_url=f"http://127.0.0.1:{port}/v1"))
    msg = str(info.value)
    assert "cannot reach the OpenAI-compatible server" in msg
    assert "`vllm serve MODEL`" in msg and "llama_cpp.server" in msg


def test_a_model_the_server_does_not_list_is_a_warning_and_on_the_card() -> None:
    """llama-cpp-python's server answers any model name with its one model: asked for
    Qwen2.5-7B, every answer was recorded as Qwen's, and the plan said "(reported as
    nothing)" without a word. What the server lists is now part of what answered, said as a
    warning, and in the description the card shows."""
    import pipeline.backends.openai.backend as ob
    from pipeline.kinds.settings import OpenAISettings

    srv = _SlowModels([0.0])  # lists the model 'm' only
    try:
        cfg = OpenAISettings(base_url=srv.base_url)
        asked = "Qwen/Qwen2.5-7B-Instruct"
        ident = ob.server_identity(cfg, [asked], "openai")
        listed = ob.server_identity(cfg, ["m"], "openai")
    finally:
        srv.close()
    assert ident["models"][asked] is None and ident["listed"] == ["m"]
    (warning,) = OpenAIBackend.warnings(ident)
    assert f"does not list the model {asked!r} (it lists 'm')" in warning
    assert "--model_alias" in warning and "backend.model" in warning
    assert "reported as nothing: the server lists m" in OpenAIBackend.describe(ident)
    # a model it lists: no warning, and the identity is what it was
    assert "listed" not in listed and OpenAIBackend.warnings(listed) == []
