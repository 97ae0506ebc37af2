"""Checks the stand-in chat server through the real ``openai`` client over HTTP."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import jsonschema
import openai
import pydantic
import pytest
from standin_player import count_words, coverage_score
from standin_server import StandinServer, generate_from_schema

from pipeline.config import load_config
from pipeline.orchestration.orchestrate import run_pipeline
from pipeline.run import RunDir
from pipeline.types import schemas

ROOT = Path(__file__).resolve().parents[1]
DIMS = ("correctness", "relevance", "helpfulness")

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
    server.inject("slow", delay=120)
    start = time.monotonic()
    with pytest.raises(openai.APITimeoutError):
        _ask(client, timeout=0.5)
    assert time.monotonic() - start < 60  # gave up long before the 120 s answer
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
    proc = subprocess.Popen(
        [*cmd, "--latency-sigma", "0.5", "--port-file", str(port_file)],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 240  # generous: a busy machine starts Python slowly
        while not port_file.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        port = int(port_file.read_text())
        c = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="t", max_retries=0)
        assert len(_ask(c, n=2).choices) == 2
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 0
    assert proc.stderr is not None
    # one line says where it listens and that its answers are not a model's
    assert proc.stderr.read().splitlines() == [
        f"stand-in OpenAI server listening on http://127.0.0.1:{port}/v1 "
        "(answers are rule-based filler, not a model)"
    ]


# --- the rule-based player (standin_player.py): prompts shaped like prompts/*.j2 ---------

QUESTION = "How do I get better at drawing hands without spending hours on anatomy books?"
POINTS = [
    "Suggests short practice sessions that fit a train commute",
    "Uses digital-tool tricks like photographing your own hand as reference",
    "Favours gesture-style, playful drills over anatomy theory",
]
POSTS = ["Sketching on the train to work every morning.", "My characters hide their hands."]
CAP = 60
WORDS = re.compile(r"[\w']+")


def _gen_prompt(instruction: str, points: list[str], tail: str = "", cap: int = CAP) -> list:
    posts = "\n".join(f"- {p}" for p in POSTS)
    listed = "\n".join(f"- {p}" for p in points)
    user = (
        f"Their past posts:\n{posts}\n\nQuestion: {QUESTION}\n\n"
        f"Write an answer of at most {cap} words that {instruction}:\n{listed}{tail}"
    )
    return [
        {"role": "system", "content": "You answer questions."},
        {"role": "user", "content": user},
    ]


def _judge_prompt(*answers: str, items: list[tuple[str | None, str]] = ()) -> list:
    blocks = "\n\n".join(
        f"Answer{f' {k}' if len(answers) > 1 else ''}:\n<<<\n{a}\n>>>"
        for k, a in zip("AB", answers, strict=False)
    )
    listed = "\n".join(
        (f"- {i}: {a}" if i.startswith("P") else f"- id {i}: {a}") if i else f"- {a}"
        for i, a in items
    )
    header = "What this person expects in an answer:\n" if items and not items[0][0] else ""
    if items and items[0][0]:
        user = f"Question:\n{QUESTION}\n\n{blocks}\n\nScore each point:\n{listed}\nJSON only."
    elif items:
        user = f"Question:\n{QUESTION}\n\n{header}{listed}\n\n{blocks}\n\nJSON only."
    else:
        user = f"Question:\n{QUESTION}\n\n{blocks}\n\nJSON only."
    return [{"role": "system", "content": "You judge."}, {"role": "user", "content": user}]


def _fmt(name: str, schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema}}


def _obj(props: dict) -> dict:
    return {"type": "object", "properties": props, "required": list(props),
            "additionalProperties": False}  # fmt: skip


IDS = ["a1f0c2d3e4b", "a9e8d7c6b5a", "a0b1c2d3e4f"]
# the schemas the stages send (pipeline/types/schemas.py), at their default token budgets
RUBRIC_NEW = schemas.rubric_schema(2, 4, 2048)
QUALITY_NEW = schemas.quality_schema(1024)
COVERAGE_NEW, _ = schemas.coverage_schema(len(IDS), 1024)
PAIRWISE_NEW = schemas.pairwise_schema(1024)
# the shapes the stages sent before bounded schemas (pydantic-style, with $defs)
COVERAGE_OLD = {
    "$defs": {"ItemCoverage": _obj({"id": {"type": "string"}, "rationale": {"type": "string"},
                                    "score": {"enum": [0, 1, 2], "type": "integer"}})},
    **_obj({"items": {"type": "array", "items": {"$ref": "#/$defs/ItemCoverage"}}}),
}  # fmt: skip
QUALITY_OLD = _obj(
    {k: v for d in DIMS for k, v in (
        (f"{d}_rationale", {"type": "string"}), (d, {"type": "integer", "minimum": 1,
                                                     "maximum": 5}))}
)  # fmt: skip
PAIRWISE_OLD = _obj({"rationale": {"type": "string"},
                     "winner": {"enum": ["A", "B", "tie"], "type": "string"}})  # fmt: skip


def _verdict(client: openai.OpenAI, messages: list, name: str, schema: dict) -> dict:
    content = _ask(client, messages=messages, response_format=_fmt(name, schema))
    value = json.loads(content.choices[0].message.content or "")
    jsonschema.validate(value, schema)  # enums, bounds, required, no extra properties
    return value


@pytest.mark.parametrize("shape", ["new", "old"])
def test_player_coverage_follows_the_text(client: openai.OpenAI, shape: str) -> None:
    answer = (
        "Keep short practice sessions on your train commute. Photograph your own hand as a "
        "reference with a digital tool."
    )
    # the prompt lists the points by position (P1, P2, ...) today, by item id before
    ids = schemas.coverage_keys(len(IDS)) if shape == "new" else IDS
    items = list(zip(ids, POINTS, strict=True))
    schema = schemas.wire(COVERAGE_NEW) if shape == "new" else COVERAGE_OLD
    v = _verdict(client, _judge_prompt(answer, items=items), "CoverageVerdict", schema)
    if shape == "new":
        scores, rationales = v["scores"], v["rationales"]
    else:
        scores = {it["id"]: it["score"] for it in v["items"]}
        rationales = {it["id"]: it["rationale"] for it in v["items"]}
    assert list(scores) == ids
    assert scores == {ids[0]: 2, ids[1]: 2, ids[2]: 0}  # the third point is never mentioned
    assert all(r.endswith(".") for r in rationales.values())
    assert "photograph" in rationales[ids[1]]


@pytest.mark.parametrize("shape", ["new", "old"])
def test_player_quality_and_pairwise(client: openai.OpenAI, shape: str) -> None:
    quality = QUALITY_NEW if shape == "new" else QUALITY_OLD
    pairwise = PAIRWISE_NEW if shape == "new" else PAIRWISE_OLD
    on_topic = "Draw hands in quick gesture sketches. " * 8
    good = _verdict(client, _judge_prompt(on_topic), "QualityVerdict", quality)
    assert all(good[d] >= 4 for d in DIMS)
    if shape == "new":  # verdict fields first, as the schema orders them
        assert list(good)[:3] == list(DIMS)
    empty = _verdict(client, _judge_prompt(""), "QualityVerdict", quality)
    assert all(empty[d] == 1 for d in DIMS)

    covering = "Keep short practice sessions on the train commute; photograph your own hand."
    general = "Learn the basics of drawing hands first and keep notes on what works for you."
    listed = [(None, p) for p in POINTS]
    winners = [
        _verdict(client, _judge_prompt(a, b, items=listed), "PairwiseVerdict", pairwise)["winner"]
        for a, b in ((covering, general), (general, covering))
    ]
    assert winners == ["A", "B"]  # rubric-aware: the covering answer, in both orders
    blind = [
        _verdict(client, _judge_prompt(a, b), "PairwiseVerdict", pairwise)["winner"]
        for a, b in ((covering, general), (general, covering))
    ]
    assert blind == ["A", "A"]  # rubric-blind: position bias, never one side in both orders


def test_player_rubric_is_distinct_and_bounded(client: openai.OpenAI) -> None:
    narrative = (
        "I draw on my iPad during a 40-minute train commute. I've bounced off anatomy books "
        "before. I want short, fun exercises I can do on the train."
    )
    posts = "\n".join(f"- {p}" for p in POSTS)
    user = (
        f"Question:\n{QUESTION}\n\nThe person's explanation of what they are looking for:\n"
        f"{narrative}\n\nTheir past posts, most relevant first:\n{posts}\n\nList aspects."
    )
    msgs = [{"role": "user", "content": user}]
    v = _verdict(client, msgs, "rubric", RUBRIC_NEW)
    aspects = [a["aspect"] for a in v["aspects"]]
    assert 2 <= len(aspects) <= 4 and len(set(aspects)) == len(aspects)
    assert any("iPad" in a for a in aspects) and any("anatomy" in a for a in aspects)
    # the legacy schema (no bounds) still validates
    legacy = json.loads((ROOT / "rubrics" / "rubric.schema.json").read_text())
    _verdict(client, msgs, "rubric", legacy)


def _covered(answer: str) -> list[int]:
    return [coverage_score(answer, p, QUESTION)[0] for p in POINTS]


def test_player_generation_covers_avoids_and_caps(client: openai.OpenAI) -> None:
    def answers(msgs: list, n: int = 2) -> list[str]:
        return [c.message.content or "" for c in _ask(client, messages=msgs, n=n).choices]

    chosen = answers(_gen_prompt("covers every one of these points", POINTS))
    assert chosen[0] != chosen[1]
    avoid = answers(_gen_prompt("does not address any of these points", POINTS))
    tail = f"\nbut that does not address this point at all:\n- {POINTS[2]}"
    violate = answers(_gen_prompt("covers these points", POINTS[:2], tail))
    for text in chosen + avoid + violate:
        assert 20 <= count_words(text) <= CAP and text.endswith(".")
    assert all(_covered(t) == [2, 2, 2] for t in chosen)
    assert all(_covered(t) == [0, 0, 0] for t in avoid)
    assert all(_covered(t) == [2, 2, 0] for t in violate)

    # a small model covers at most three points: a fourth is left out
    four = [*POINTS, "Recommends a stylus with a soft nib for smoother lines"]
    (text,) = answers(_gen_prompt("covers every one of these points", four), n=1)
    assert coverage_score(text, four[3], QUESTION)[0] == 0

    # "at most N words", and a re-ask turn after the prompt, still hold
    msgs = _gen_prompt("covers every one of these points", POINTS, cap=12)
    msgs += [{"role": "assistant", "content": "x"}, {"role": "user", "content": "Shorter."}]
    for text in answers(msgs, n=3):
        assert 0 < count_words(text) <= 12 and text.endswith(".")


def _grams(text: str, n: int = 5) -> set[tuple[str, ...]]:
    words = [w.lower() for w in WORDS.findall(text)]
    return {tuple(words[i : i + n]) for i in range(len(words) - n + 1)}


def test_player_answers_open_differently_and_name_the_topic_without_copying_it(
    client: openai.OpenAI,
) -> None:
    # a model varies how it opens and refers to the question; it does not open every
    # answer alike or repeat the question (a text rule on same openings or question echo
    # would otherwise trip on the stand-in rather than on a real model's habits)
    msgs = _gen_prompt("covers every one of these points", POINTS)
    texts = [c.message.content or "" for c in _ask(client, messages=msgs, n=12).choices]
    openings = {" ".join(t.split()[:3]) for t in texts}
    assert len(openings) >= 6, openings
    question_words = {w.lower() for w in WORDS.findall(QUESTION) if len(w) > 3}
    for t in texts:
        assert not _grams(t) & _grams(QUESTION), t  # no five words of the question in a row
        assert question_words & {w.lower() for w in WORDS.findall(t)}, t  # but on topic
    # deterministic per request: the same request gets the same answers
    again = [c.message.content or "" for c in _ask(client, messages=msgs, n=12).choices]
    assert again == texts


def test_responder_wins_and_filler_mode(client: openai.OpenAI) -> None:
    msgs = _gen_prompt("covers every one of these points", POINTS)
    with StandinServer(responder=lambda body, i: "crafted") as srv:
        c = openai.OpenAI(base_url=srv.base_url, api_key="t", max_retries=0)
        assert _ask(c, messages=msgs).choices[0].message.content == "crafted"
    with StandinServer(mode="filler") as srv:
        c = openai.OpenAI(base_url=srv.base_url, api_key="t", max_retries=0)
        filler = _ask(c, messages=msgs).choices[0].message.content or ""
        assert _covered(filler) != [2, 2, 2]  # filler words, not the points
        v = _verdict(c, _judge_prompt("x"), "PairwiseVerdict", PAIRWISE_NEW)
        assert v["winner"] in ("A", "B", "tie")
    with pytest.raises(ValueError, match="unknown mode"):
        StandinServer(mode="model")


def test_sample_run_against_the_player_keeps_most_examples(tmp_path: Path) -> None:
    """The README's offline path: `prb run configs/sample.yaml` against the stand-in."""
    with StandinServer() as srv:
        overrides = [
            f"backend.openai.base_url={srv.base_url}",
            f"run.output_dir={tmp_path}",
            "backend.openai.max_concurrency=8",
        ]
        stats = run_pipeline(load_config(ROOT / "configs" / "sample.yaml", overrides),
                             progress=False, echo=lambda _m: None)  # fmt: skip
    run = RunDir(tmp_path / "sample")
    assert stats["judge"]["parse_failures"] == 0
    s = stats["pairs"]
    assert s["examples"] == 12 and s["kept"] >= 6
    assert s["kept"] + s["dropped"] == 12 == s["kept"] + sum(s["dropped_by_reason"].values())
    # the player covers at most three points, so examples whose rubric has four lose their
    # pairs to the coverage filter; no other filter drops an example
    long_rubrics = {r["example_id"] for r in run.stage("rubrics").rows() if len(r["items"]) > 3}
    dropped = {r["example_id"]: r["reason"] for r in run.stage("pairs").rejects()}
    assert long_rubrics and dropped == dict.fromkeys(long_rubrics, "coverage")
    assert s["dropped_by_reason"]["coverage"] == len(long_rubrics)
    kept = list(run.stage("pairs").rows())
    assert len({r["strategy"] for r in kept}) >= 2  # several strategies make it through
    # answers do not repeat their question, and open in more than one way
    answers = [r[side] for r in kept for side in ("chosen", "rejected")]
    assert not any(
        _grams(a) & _grams(r["question"]) for r in kept for a in (r["chosen"], r["rejected"])
    )
    assert len({" ".join(a.split()[:2]) for a in answers}) >= len(answers) // 2
    for row in kept:
        assert row["judge"]["pairwise"]["pairwise_aware"]["AB"]["prefers"] == "chosen"
        assert row["judge"]["pairwise"]["pairwise_blind"]["BA"]["prefers"] != "chosen"
