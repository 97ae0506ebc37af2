"""Checks the stand-in chat server through the real ``openai`` client over HTTP."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import openai
import pydantic
import pytest
from standin_server import StandinServer, generate_from_schema

MSGS = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "How should I plan a weekend trip?"},
]


class Aspect(pydantic.BaseModel):
    name: str = pydantic.Field(min_length=12)
    weight: float = pydantic.Field(ge=0.0, le=1.0)
    priority: int = pydantic.Field(gt=0, le=3)
    kind: Literal["style", "content", "format"]
    note: str | None = None


class Rubric(pydantic.BaseModel):
    title: str
    aspects: list[Aspect] = pydantic.Field(min_length=4, max_length=6)
    tags: list[str] = pydantic.Field(max_length=2)
    strict: bool


@pytest.fixture(scope="module")
def server() -> Iterator[StandinServer]:
    with StandinServer() as srv:
        yield srv


@pytest.fixture()
def client(server: StandinServer) -> openai.OpenAI:
    server.reset()
    return openai.OpenAI(base_url=server.base_url, api_key="test", max_retries=0)


def _ask(client: openai.OpenAI, **kw: object) -> openai.types.chat.ChatCompletion:
    return client.chat.completions.create(model="m", messages=kw.pop("messages", MSGS), **kw)


def test_n_choices_and_usage(client: openai.OpenAI, server: StandinServer) -> None:
    resp = _ask(client, n=3)
    assert resp.object == "chat.completion" and resp.model == "m"
    assert [c.index for c in resp.choices] == [0, 1, 2]
    texts = [c.message.content or "" for c in resp.choices]
    assert len(set(texts)) == 3
    assert all(40 <= len(t.split()) <= 90 for t in texts)
    assert all(c.finish_reason == "stop" and c.message.role == "assistant" for c in resp.choices)
    assert resp.usage is not None
    assert resp.usage.completion_tokens == sum(len(t.split()) for t in texts)
    assert resp.usage.prompt_tokens == 5 + 7
    assert resp.usage.total_tokens == resp.usage.prompt_tokens + resp.usage.completion_tokens
    assert server.request_count == 1 and server.requests[0]["body"]["n"] == 3


def test_deterministic_answers(client: openai.OpenAI) -> None:
    def texts(**kw: object) -> list[str | None]:
        return [c.message.content for c in _ask(client, n=2, **kw).choices]

    first = texts(seed=1, temperature=0.7)
    assert texts(seed=1, temperature=0.7) == first
    assert texts(seed=2, temperature=0.7) != first
    assert texts(seed=1, temperature=1.0) != first
    # A fresh server instance answers the same: content does not depend on server state.
    with StandinServer() as other:
        fresh = openai.OpenAI(base_url=other.base_url, api_key="test", max_retries=0)
        assert [c.message.content for c in _ask(fresh, n=2, seed=1, temperature=0.7).choices] == (
            first
        )


def test_word_cap_in_last_user_message(client: openai.OpenAI) -> None:
    msgs = [*MSGS, {"role": "user", "content": "Answer in at most 7 words, please."}]
    resp = _ask(client, messages=msgs, n=4)
    assert all(0 < len((c.message.content or "").split()) <= 7 for c in resp.choices)


def test_max_tokens_truncates_with_length(client: openai.OpenAI) -> None:
    resp = _ask(client, max_tokens=5, n=2)
    assert all(c.finish_reason == "length" for c in resp.choices)
    assert all(len((c.message.content or "").split()) == 5 for c in resp.choices)
    resp = _ask(client, max_completion_tokens=8)
    assert resp.choices[0].finish_reason == "length"
    assert len((resp.choices[0].message.content or "").split()) == 8
    assert _ask(client, max_tokens=500).choices[0].finish_reason == "stop"


def test_json_schema_answer_validates(client: openai.OpenAI) -> None:
    schema = Rubric.model_json_schema()
    assert "$defs" in schema  # the nested model goes through $ref resolution
    fmt = {"type": "json_schema", "json_schema": {"name": "rubric", "schema": schema}}
    resp = _ask(client, response_format=fmt, n=3, seed=4)
    for choice in resp.choices:
        rubric = Rubric.model_validate_json(choice.message.content or "")
        assert 4 <= len(rubric.aspects) <= 6 and len(rubric.tags) <= 2
    # The SDK's structured-output helper sends a strict schema and parses the answer itself.
    parsed = client.chat.completions.parse(model="m", messages=MSGS, response_format=Rubric)
    assert isinstance(parsed.choices[0].message.parsed, Rubric)


def test_schema_generator_keywords() -> None:
    import random

    schema = {
        "type": "object",
        "required": ["c", "e", "n", "x", "s", "b"],
        "properties": {
            "c": {"const": "fixed"},
            "e": {"enum": [3, 5]},
            "n": {"type": "number", "exclusiveMinimum": 0.5, "exclusiveMaximum": 0.51},
            "x": {"type": ["integer", "null"], "minimum": -4, "maximum": -2},
            "s": {"oneOf": [{"type": "string", "minLength": 40}, {"type": "integer"}]},
            "b": {"type": "array", "items": {"type": "boolean"}, "minItems": 5},
        },
    }
    value = generate_from_schema(schema, random.Random(0))
    assert value["c"] == "fixed" and value["e"] in (3, 5)
    assert 0.5 < value["n"] < 0.51 and -4 <= value["x"] <= -2
    assert isinstance(value["s"], str) and len(value["s"]) >= 40
    assert len(value["b"]) == 5 and all(isinstance(b, bool) for b in value["b"])


def test_json_object_and_responder(client: openai.OpenAI) -> None:
    content = _ask(client, response_format={"type": "json_object"}).choices[0].message.content
    assert isinstance(json.loads(content or "")["answer"], str)

    def responder(body: dict, index: int) -> str | None:
        return f"crafted {index}" if "crafted" in body["messages"][-1]["content"] else None

    with StandinServer(responder=responder) as srv:
        c = openai.OpenAI(base_url=srv.base_url, api_key="test", max_retries=0)
        got = _ask(c, n=2, messages=[{"role": "user", "content": "crafted please"}])
        assert [ch.message.content for ch in got.choices] == ["crafted 0", "crafted 1"]
        assert len((_ask(c).choices[0].message.content or "").split()) >= 40  # None: default


def test_http_faults_reach_the_client(client: openai.OpenAI, server: StandinServer) -> None:
    server.inject("429", retry_after=0.25)
    with pytest.raises(openai.RateLimitError) as rate:
        _ask(client)
    assert rate.value.response.headers["retry-after"] == "0.25"
    assert rate.value.status_code == 429
    server.inject("500")
    with pytest.raises(openai.InternalServerError):
        _ask(client)
    server.inject("503")
    with pytest.raises(openai.InternalServerError) as unavailable:
        _ask(client)
    assert unavailable.value.status_code == 503
    server.inject("400")
    with pytest.raises(openai.BadRequestError):
        _ask(client)
    server.inject("malformed")
    with pytest.raises((openai.APIResponseValidationError, json.JSONDecodeError)):
        _ask(client)
    assert _ask(client).choices[0].finish_reason == "stop"  # faults are used up
    assert server.request_count == 6
    assert [r["status"] for r in server.requests] == [429, 500, 503, 400, 200, 200]
    assert [r["fault"] for r in server.requests][-2:] == ["malformed", None]


def test_slow_fault_times_out_client(client: openai.OpenAI, server: StandinServer) -> None:
    server.inject("slow", delay=3)
    start = time.monotonic()
    with pytest.raises(openai.APITimeoutError):
        _ask(client, timeout=0.5)
    assert time.monotonic() - start < 2.5
    assert server.requests[0]["fault"] == "slow"


def test_content_faults(client: openai.OpenAI, server: StandinServer) -> None:
    server.inject("bad_json", match=lambda body: "response_format" in body)
    server.inject("length")
    cut = _ask(client, seed=9).choices[0]
    assert cut.finish_reason == "length"
    full = _ask(client, seed=9).choices[0].message.content or ""
    assert full.startswith(cut.message.content or "") and len(full) > len(cut.message.content or "")
    fmt = {
        "type": "json_schema",
        "json_schema": {"name": "r", "schema": Rubric.model_json_schema()},
    }
    bad = _ask(client, response_format=fmt).choices[0].message.content or ""
    with pytest.raises(json.JSONDecodeError):
        json.loads(bad)
    assert [r["fault"] for r in server.requests] == ["length", None, "bad_json"]


def test_fault_count_predicate_and_sdk_retries(server: StandinServer) -> None:
    server.reset()
    retrying = openai.OpenAI(base_url=server.base_url, api_key="test", max_retries=2)
    server.inject("429", count=2, retry_after=0.01)
    assert _ask(retrying).choices[0].finish_reason == "stop"  # third attempt succeeds
    assert [r["status"] for r in server.requests] == [429, 429, 200]
    server.inject("500", match=lambda body: body.get("seed") == 13)
    plain = openai.OpenAI(base_url=server.base_url, api_key="test", max_retries=0)
    assert _ask(plain, seed=1).choices  # not matched: the fault stays queued
    with pytest.raises(openai.InternalServerError):
        _ask(plain, seed=13)
    with pytest.raises(ValueError):
        server.inject("teapot")
    server.inject("500", count=3)
    server.reset()
    assert server.request_count == 0 and _ask(plain).choices  # reset dropped queued faults


def test_invalid_body_and_models(server: StandinServer) -> None:
    req = urllib.request.Request(
        server.base_url + "/chat/completions", data=b"not json", method="POST"
    )
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(req, timeout=5)
    assert err.value.code == 400 and "messages" in json.loads(err.value.read())["error"]["message"]
    client = openai.OpenAI(base_url=server.base_url, api_key="test", max_retries=0)
    assert [m.id for m in client.models.list()] == ["standin-model"]


def test_latency_model() -> None:
    with StandinServer(latency_ms=80, latency_sigma=0.0) as srv:
        c = openai.OpenAI(base_url=srv.base_url, api_key="test", max_retries=0)
        start = time.monotonic()
        _ask(c)
        assert time.monotonic() - start >= 0.075


def test_cli_foreground_process(tmp_path: Path) -> None:
    port_file = tmp_path / "port"
    script = Path(__file__).with_name("standin_server.py")
    cmd = [sys.executable, str(script), "--port", "0", "--latency-ms", "5"]
    proc = subprocess.Popen([*cmd, "--latency-sigma", "0.5", "--port-file", str(port_file)])
    try:
        deadline = time.monotonic() + 20
        while not port_file.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        port = int(port_file.read_text())
        c = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="t", max_retries=0)
        assert len(_ask(c, n=2).choices) == 2
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
