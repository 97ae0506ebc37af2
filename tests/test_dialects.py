"""Each provider's structured-output dialect (pipeline/backends/openai/dialects.py): the sample
config end to end against servers that take requests the way real providers do
(tests/provider_dialects.py), through the real openai client; what the run found is
recorded in its identity, asked once, and a server that takes today's body keeps the
identity and cache keys it always had."""

from __future__ import annotations

import importlib.util
import json
import os
import random
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import jsonschema
import pytest
from conftest import write_config
from provider_dialects import ProviderServer, strict_problem
from standin_server import StandinServer

from pipeline.backends.identity import identity_id
from pipeline.backends.openai import dialects
from pipeline.backends.openai.backend import OpenAIBackend, server_identity
from pipeline.backends.openai.dialects import Dialect, json_in_text, strict_schema
from pipeline.backends.openai.wire import refused_feature
from pipeline.cli import main
from pipeline.config import load_config
from pipeline.kinds.settings import OpenAISettings
from pipeline.orchestration.orchestrate import run_pipeline
from pipeline.run import RunDir
from pipeline.types import schemas
from pipeline.types.chat import ChatRequest

ROOT = Path(__file__).resolve().parents[1]
MODEL = "Qwen/Qwen2.5-7B-Instruct"  # configs/sample.yaml's
LLM_STAGES = ("rubrics", "responses", "judge")

STAGE_SCHEMAS = {
    "quality": schemas.quality_schema(512),
    "pairwise": schemas.pairwise_schema(512),
    "coverage": schemas.coverage_schema(3, 512)[0],
    "rubric": schemas.rubric_schema(2, 6, 1024),
}


def _req(schema: dict | None, n: int = 1, seed: int | None = 7) -> ChatRequest:
    msgs = (("system", "You judge."), ("user", "Question: q"))
    return ChatRequest(msgs, "m", n=n, seed=seed, json_schema=schema, schema_name="quality")


# ---- the dialects, one by one ---------------------------------------------------------------


def test_todays_dialect_sends_todays_body_and_adds_nothing_to_the_identity():
    req = _req(STAGE_SCHEMAS["quality"], n=2)
    assert Dialect().bodies(req) == [req.openai_body()]
    assert Dialect().record() == {}
    ident = {"kind": "openai", "url": "http://x/v1", "models": {}, "model_output": True}
    cfg = OpenAISettings(base_url="http://127.0.0.1:9/v1", structured_output="json_schema")
    assert dialects.identify(ident, cfg, [], None) is ident


@pytest.mark.parametrize("name", sorted(STAGE_SCHEMAS))
def test_strict_schemas_are_what_strict_mode_takes_and_their_limits_go_to_the_prompt(name):
    full = STAGE_SCHEMAS[name]
    strict, moved = strict_schema(full)
    assert strict_problem(full) is not None  # maxLength etc.: refused as they are
    assert strict_problem(strict) is None
    assert moved and all(line.startswith("answer") for line in moved)
    body = Dialect("json_schema_strict").bodies(_req(full))[0]
    assert body["response_format"]["json_schema"]["strict"] is True
    system = body["messages"][0]["content"]
    assert system.startswith("You judge.") and all(line in system for line in moved)
    # an answer valid against the full schema is valid against the strict one
    rng = random.Random(0)
    from standin_server import generate_from_schema

    for _ in range(5):
        value = generate_from_schema(full, rng)
        jsonschema.validate(value, full)
        jsonschema.validate(value, strict)


def test_json_object_and_none_state_the_full_schema_in_the_prompt():
    full = STAGE_SCHEMAS["rubric"]
    for kind, fmt in (
        ("json_object_schema", {"type": "json_object", "schema": full}),
        ("json_object", {"type": "json_object"}),
        ("none", None),
    ):
        (body,) = Dialect(kind).bodies(_req(full))
        assert body.get("response_format") == fmt
        system = body["messages"][0]["content"]
        assert "JSON" in system and json.dumps(full, separators=(",", ":")) in system
        assert body["messages"][1:] == [{"role": "user", "content": "Question: q"}]
    # a request without a system message gets one, first
    req = ChatRequest((("user", "hi"),), "m", json_schema=full)
    (body,) = Dialect("none").bodies(req)
    assert [m["role"] for m in body["messages"]] == ["system", "user"]


def test_parameters_each_server_refuses_are_renamed_dropped_or_split():
    req = _req(None, n=3, seed=11)
    d = Dialect(max_tokens="max_completion_tokens", n="split")
    bodies = d.bodies(req)
    assert len(bodies) == 3 and all("n" not in b and "max_tokens" not in b for b in bodies)
    assert all(b["max_completion_tokens"] == req.max_tokens for b in bodies)
    seeds = [b["seed"] for b in bodies]
    assert len(set(seeds)) == 3 and seeds == [b["seed"] for b in d.bodies(req)]
    assert seeds != [b["seed"] for b in d.bodies(_req(None, n=3, seed=12))]
    no_seed = Dialect(n="split", seed="dropped").bodies(req)
    assert len(no_seed) == 3 and all("seed" not in b for b in no_seed)


def test_the_json_is_taken_out_of_prose_and_code_fences():
    obj = '{"winner": "A", "rationale": "It {covers} more."}'
    for text in (
        obj,
        f"Sure! Here it is:\n```json\n{obj}\n```\nHope this helps.",
        f"My verdict: {obj} -- done",
        f"```\n{obj}\n```",
    ):
        assert json.loads(json_in_text(text)) == json.loads(obj)
    assert json_in_text("no JSON at all {oops") == "no JSON at all {oops"


@pytest.mark.parametrize(
    "status, message, param, feature",
    [
        # llama-cpp-python 0.3.36's server, as it answered here
        (500, "1 validation error:\n  {'type': 'literal_error', 'loc': ('body', "
         "'response_format', 'type'), 'msg': \"Input should be 'text' or 'json_object'\"}",
         None, "structured_output"),
        (400, "Invalid schema for response_format 'quality': In context=(), 'maxLength' is "
         "not permitted.", "response_format", "structured_output"),
        (400, "Unsupported parameter: 'max_tokens' is not supported with this model. Use "
         "'max_completion_tokens' instead.", "max_tokens", "max_tokens"),
        (400, "Unsupported value: 'n' must be 1 for this model.", None, "n"),
        (400, "Unrecognized request argument supplied: seed", None, "seed"),
        # limits and other errors are not refusals of a parameter
        (400, "This model's maximum context length is 2048 tokens. However, you requested "
         "2100 tokens.", "messages", None),
        (400, "'max_tokens' or 'max_completion_tokens' is too large: 600.", None, None),
        (503, "Service Unavailable: response_format not supported", None, None),
        (404, "The model `x` does not exist", None, None),
    ],
)  # fmt: skip
def test_refusals_are_told_apart(status, message, param, feature):
    assert refused_feature(status, message, param) == feature


# ---- the sample config against each provider ------------------------------------------------

# behaviour -> what auto finds (Dialect.record()) and at most how many refusals that takes
EXPECTED = {
    "strict": ({"structured_output": "json_schema_strict"}, 1),
    "llamacpp": ({"structured_output": "json_object_schema", "n": "split"}, 2),
    "json_object": ({"structured_output": "json_object"}, 3),
    "ignores_format": ({"structured_output": "none"}, 0),
    "max_completion_tokens": ({"max_tokens": "max_completion_tokens"}, 1),
    "no_n": ({"n": "split"}, 1),
    "ignores_seed": ({}, 0),
    "refuses_seed": ({"seed": "dropped"}, 1),
}


def _sample(tmp_path: Path, server: StandinServer, *more: str):
    overrides = [
        f"backend.openai.base_url={server.base_url}",
        f"run.output_dir={tmp_path}",
        "backend.openai.max_concurrency=8",
        "backend.backoff_initial_s=0.01",
        "input.limit=2",
        *more,
    ]
    return load_config(ROOT / "configs" / "sample.yaml", overrides)


def _funnel(stats: dict) -> dict:
    s = stats["pairs"]
    return {"examples": s["examples"], "kept": s["kept"], "dropped": s["dropped_by_reason"]}


@pytest.mark.parametrize("behaviour", sorted(EXPECTED))
def test_the_sample_config_runs_against_each_provider(tmp_path, capsys, behaviour):
    record, most_refusals = EXPECTED[behaviour]
    with ProviderServer(behaviour, model=MODEL) as srv:
        cfg = _sample(tmp_path, srv)
        stats = run_pipeline(cfg, progress=False, echo=lambda _m: None)
        refusals = list(srv.refused)
        sent = srv.request_count
        err = capsys.readouterr().err
        # every stage done, no request failed, the JSON answers valid at the first try
        run = RunDir(tmp_path / "sample")
        for stage in ("ingest", *LLM_STAGES, "pairs"):
            assert run.stage(stage).done, stage
        for stage in LLM_STAGES:
            llm = stats[stage].get("llm") or {}
            assert llm.get("failed", 0) == 0 and not llm.get("failure_reasons"), (stage, llm)
        assert stats["judge"]["parse_failures"] == 0
        # what auto found: asked once (its refusals only), said in one line, recorded
        assert len(refusals) <= most_refusals, refusals
        lines = [ln for ln in err.splitlines() if ln.startswith("backend.openai: the server")]
        assert len(lines) == 1, err
        env = json.loads((run.path / "environment.json").read_text())
        served = env["served_by"]
        assert served.get("dialect", {}).get(MODEL, {}) == record, served
        assert served["kind"] == "openai"
        funnel = _funnel(stats)
        assert funnel["examples"] == 2 and funnel["kept"] + sum(funnel["dropped"].values()) == 2

        # the same command again: nothing to do, nothing asked (the record is read back)
        again = run_pipeline(_sample(tmp_path, srv), progress=False, echo=lambda _m: None)
        assert again == {} or all(not v.get("llm", {}).get("sent") for v in again.values())
        assert srv.request_count == sent
        assert "backend.openai: the server" not in capsys.readouterr().err


def test_a_server_that_takes_todays_body_keeps_its_identity_and_is_asked_once(tmp_path, capsys):
    real = {"owned_by": "vllm", "root": "/models/qwen"}
    with StandinServer(report_as=real, model=MODEL) as srv:
        cfg = _sample(tmp_path, srv)
        before = server_identity(cfg.backend.openai, [MODEL], "openai")
        assert srv.request_count == 0
        run_pipeline(cfg, progress=False, echo=lambda _m: None)
        probes = [
            r for r in srv.requests if r["body"]["messages"][-1]["content"] == "Name one colour."
        ]
        assert len(probes) == 1 and probes[0]["body"]["n"] == 2
        env = json.loads((tmp_path / "sample" / "environment.json").read_text())
        served = {k: v for k, v in env["served_by"].items() if k != "asked"}
        assert served == before and identity_id(served) == identity_id(before)
        assert "takes structured output json_schema" in capsys.readouterr().err
        sent = srv.request_count
        run_pipeline(_sample(tmp_path, srv), progress=False, echo=lambda _m: None)
        assert srv.request_count == sent  # recorded in the run's cache: not asked again

        # a run made before dialects existed (its cache holds no record): asked once more,
        # nothing re-done, and recorded from then on
        with sqlite3.connect(tmp_path / "sample" / "cache.sqlite") as db:
            assert db.execute("DELETE FROM derived WHERE kind = 'dialect'").rowcount == 1
        dialects._FOUND.clear()  # what a new process knows: nothing
        said: list[str] = []
        run_pipeline(_sample(tmp_path, srv), progress=False, echo=said.append)
        stages = [line for line in said if line.startswith("[")]
        assert stages and all(line.endswith("done, nothing to do") for line in stages), said
        assert srv.request_count == sent + 1
        dialects._FOUND.clear()
        run_pipeline(_sample(tmp_path, srv), progress=False, echo=lambda _m: None)
        assert srv.request_count == sent + 1


def test_the_stand_in_is_never_asked_and_an_explicit_dialect_joins_its_identity(tmp_path):
    with StandinServer() as srv:
        cfg = write_config(tmp_path, srv, input={"limit": 1},
                           backend={"openai": {"structured_output": "json_object"}})  # fmt: skip
        assert main(["run", str(cfg), "--no-progress", "--until", "responses"]) == 0
        assert srv.requests and not any(
            r["body"]["messages"][-1]["content"] == "Name one colour." for r in srv.requests
        )
    meta = RunDir(tmp_path / "outputs" / "t").stage("responses").meta
    assert meta is not None
    served = meta.environment["served_by"]
    assert served["kind"] == "stand-in"
    assert served["dialect"] == {"standin-model": {"structured_output": "json_object"}}


def test_an_explicit_dialect_the_server_refuses_stops_before_any_stage(tmp_path, capsys):
    with ProviderServer("llamacpp", model="standin-model") as srv:
        cfg = write_config(tmp_path, srv, input={"limit": 1},
                           backend={"openai": {"structured_output": "json_schema"}})  # fmt: skip
        assert main(["run", str(cfg), "--no-progress"]) != 0
        chat = srv.request_count
    err = capsys.readouterr().err
    assert "backend.openai.structured_output" in err and "refuses structured output" in err
    assert "json_schema_strict" in err and "Traceback" not in err
    assert chat == 1  # the probe, nothing else


def test_a_refusal_mid_run_stops_the_stage_with_what_to_do(tmp_path, capsys):
    with StandinServer() as srv:
        cfg = write_config(tmp_path, srv, input={"limit": 1})
        srv.inject("400", count=1000, message="response_format 'json_schema' is not supported",
                   match=lambda body: "response_format" in body)  # fmt: skip
        assert main(["run", str(cfg), "--no-progress"]) != 0
        refused = sum(1 for r in srv.requests if r["status"] == 400)
    err = capsys.readouterr().err
    assert "refused structured output json_schema for model standin-model" in err, err
    assert "(HTTP 400: response_format 'json_schema' is not supported)" in err
    assert f"set {dialects.SETTING} to json_schema_strict" in err
    assert "will be retried" not in err and "Traceback" not in err
    assert refused <= 8 * 2  # stopped at once: at most the requests already in flight


# ---- the real one: llama-cpp-python's own OpenAI server ------------------------------------

HAVE_LLAMA_SERVER = (
    importlib.util.find_spec("llama_cpp") is not None
    and importlib.util.find_spec("uvicorn") is not None
    and importlib.util.find_spec("sse_starlette") is not None
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
@pytest.mark.llamacpp
@pytest.mark.timeout(1800)
@pytest.mark.skipif(
    not HAVE_LLAMA_SERVER and not os.environ.get("CI"),
    reason="llama-cpp-python's server is not installed "
    "(pip install 'personalized-rewardbench[local-server]'); CI runs this",
)
def test_the_sample_config_runs_against_llama_cpp_pythons_own_server(tmp_path, capsys):
    """`python -m llama_cpp.server` on the packaged SmolLM2 refuses json_schema (a 500) and
    answers one choice whatever n is: the run finds json_object with the schema beside it
    and single requests, and no request fails for a reason of the pipeline's."""
    from pipeline.backends.llamacpp_backend import resolve_model
    from pipeline.kinds.settings import LLAMACPP_DEFAULT_MODEL

    gguf = resolve_model(LLAMACPP_DEFAULT_MODEL)
    port = _free_port()
    log = (tmp_path / "server.log").open("wb")
    cmd = [sys.executable, "-m", "llama_cpp.server", "--model", str(gguf),
           "--model_alias", "smollm2", "--host", "127.0.0.1", "--port", str(port),
           "--n_ctx", "8192", "--n_threads", "1"]  # fmt: skip
    server = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 600  # loading on a busy machine: poll, generously
        while True:
            assert server.poll() is None, (tmp_path / "server.log").read_text()[-2000:]
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=5):
                    break
            except OSError:
                assert time.monotonic() < deadline, "llama_cpp.server did not start"
                time.sleep(1)
        overrides = [
            f"backend.openai.base_url=http://127.0.0.1:{port}/v1",
            "backend.model=smollm2",
            f"run.output_dir={tmp_path}",
            "input.limit=1",
            "responses.n=1",
            "backend.openai.max_concurrency=2",
            "judge.sampling.max_tokens=300",
        ]
        start = time.monotonic()
        cfg = load_config(ROOT / "configs" / "sample.yaml", overrides)
        stats = run_pipeline(cfg, progress=False, echo=lambda _m: None)
        seconds = time.monotonic() - start
        # asked for a name it does not list (the README's line without --model_alias): the
        # server would answer as its one model, so it is a warning and the card says so
        qwen = "Qwen/Qwen2.5-7B-Instruct"
        ident = server_identity(cfg.backend.openai, [qwen], "openai")
        assert ident["models"][qwen] is None and ident["listed"] == ["smollm2"], ident
        assert f"does not list the model {qwen!r}" in OpenAIBackend.warnings(ident)[0]
        assert "the server lists smollm2" in OpenAIBackend.describe(ident)
    finally:
        server.terminate()
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(30)
        log.close()
    err = capsys.readouterr().err
    run = RunDir(tmp_path / "sample")
    for stage in ("ingest", *LLM_STAGES, "pairs"):
        assert run.stage(stage).done, (stage, err[-2000:])
    for stage in LLM_STAGES:
        llm = stats[stage].get("llm") or {}
        # the model's own invalid answers would show as invalid_json: there are none either
        assert llm.get("failed", 0) == 0 and not llm.get("failure_reasons"), (stage, llm)
    meta = run.stage("judge").meta
    assert meta is not None
    served = meta.environment["served_by"]
    assert served["dialect"]["smollm2"] == {"structured_output": "json_object_schema", "n": "split"}
    # what it refused, said once
    assert "response_format.type: Input should be 'text' or 'json_object'" in err
    funnel = _funnel(stats)
    with capsys.disabled():
        print(f"\nllama_cpp.server SmolLM2-135M: {seconds:.0f} s, funnel {json.dumps(funnel)}, "
              f"judge {stats['judge']['llm']}")  # fmt: skip


def test_plan_never_asks_and_reads_what_the_run_found(tmp_path, capsys):
    sample = str(ROOT / "configs" / "sample.yaml")
    with ProviderServer("json_object", model=MODEL) as srv:
        sets = [f"backend.openai.base_url={srv.base_url}", f"run.output_dir={tmp_path}",
                "input.limit=1", "backend.openai.max_concurrency=8"]  # fmt: skip
        args = [a for s in sets for a in ("--set", s)]
        assert main(["plan", sample, *args]) == 0
        assert srv.request_count == 0  # a plan sends nothing, the probe included
        before = capsys.readouterr().out
        run_pipeline(load_config(sample, sets), progress=False, echo=lambda _m: None)
        sent = srv.request_count
        capsys.readouterr()
        assert main(["plan", sample, *args]) == 0
        assert srv.request_count == sent
        after = capsys.readouterr().out
    assert "structured output json_object" not in before
    assert f"{MODEL}: structured output json_object" in after, after


def test_the_ray_http_engine_refuses_a_dialect_it_cannot_send():
    pytest.importorskip("ray")
    from pipeline.backends.ray_backend import RayBackend
    from pipeline.core.errors import BackendError
    from pipeline.kinds.backend import BackendSection

    cfg = BackendSection(name="ray", openai={"structured_output": "json_object"})
    with pytest.raises(BackendError, match="sends json_schema only"):
        RayBackend.preflight(cfg)


# ---- what a request costs as it is sent: run.budget and prb plan ---------------------------


def test_a_request_is_bounded_and_counted_as_the_server_is_sent_it():
    from pipeline.engine.budget import request_bound

    req = _req(STAGE_SCHEMAS["quality"], n=2)
    today = request_bound(req)
    assert request_bound(req, Dialect().as_sent) == today
    # the schema stated in the prompt: one request's prompt grows by the statement
    stated = Dialect(structured_output="json_object")
    (sent,) = stated.as_sent(req)
    note = dialects.schema_statement(req.json_schema)
    assert sent.messages[0] == ("system", f"You judge.\n\n{note}") and sent.n == 2
    bound = request_bound(req, stated.as_sent)
    assert bound.prompt_tokens == today.prompt_tokens + len(f"\n\n{note}".encode())
    assert bound.completion_tokens == today.completion_tokens
    # n split: a prompt per choice, one choice each; the output bound is the same
    split = Dialect(structured_output="json_object", n="split")
    copies = split.as_sent(req)
    assert len(copies) == 2 and all(c.n == 1 and c.messages == sent.messages for c in copies)
    bound2 = request_bound(req, split.as_sent)
    assert bound2.prompt_tokens == 2 * bound.prompt_tokens
    assert (bound2.requests, bound2.completion_tokens) == (1, today.completion_tokens)
    # what the backend sends is what is counted
    bodies = split.bodies(req)
    assert [b["messages"] for b in bodies] == [c.message_dicts() for c in copies]
    # strict mode adds only the limits it cannot carry; a schema without any adds nothing
    strict = Dialect(structured_output="json_schema_strict")
    assert strict.as_sent(_req({"type": "object", "properties": {}})) == [
        _req({"type": "object", "properties": {}})
    ]


def test_the_plan_counts_the_prompts_a_dialect_sends_and_the_budget_bounds_them(tmp_path):
    """On the stand-in, whose token count the plan knows exactly (the words of each
    message), a run told to send llama-cpp-python's form (json_object with the schema, and
    the schema stated in the prompt): the plan afterwards counts every stage's prompt
    tokens as the server reported them."""
    from pipeline.engine.budget import make_budget
    from pipeline.plan import estimate
    from pipeline.run.cache import RequestCache

    with StandinServer() as srv:
        llama_cpp_form = {"openai": {"structured_output": "json_object_schema"}}
        cfg = write_config(tmp_path, srv, input={"limit": 2}, backend=llama_cpp_form)
        # every stage finishes (5: the two examples keep no pair; the plan is what counts)
        assert main(["run", str(cfg), "--no-progress"]) in (0, 5)
        config = load_config(cfg)
        plan = estimate(config)
    by_stage = {e.stage: e for e in plan.stages}
    checked = 0
    for stage in LLM_STAGES:
        est = by_stage[stage]
        if not est.total.requests or (est.actual or {}).get("reasks"):
            continue  # (given rubrics send nothing; a re-ask's prompt is not a first one)
        assert est.total.prompt_tokens == est.actual["prompt_tokens"], stage
        checked += 1
    assert checked >= 2
    assert any("structured output json_object_schema" in n for n in plan.notes), plan.notes
    # the budget a stage's runner gets bounds a request as sent
    ident = RunDir(tmp_path / "outputs" / "t").stage("judge").meta.environment["served_by"]
    budget_cfg = load_config(cfg, ["run.budget.tokens=1000000000"])
    with RequestCache(tmp_path / "outputs" / "t" / "cache.sqlite") as cache:
        budget = make_budget(budget_cfg, cache, identity_id(ident), ident)
    assert budget is not None
    req = ChatRequest((("system", "s"), ("user", "u")), "standin-model",
                      json_schema=STAGE_SCHEMAS["quality"])  # fmt: skip
    assert budget.bound(req).prompt_tokens > len(dialects.schema_statement(req.json_schema))
    # replaying those answers, the record is read as the backend that made it reads it
    from pipeline.backends.replay import ReplayBackend

    (as_sent, _), (replayed, _) = OpenAIBackend.as_sent(ident), ReplayBackend.as_sent(ident)
    assert replayed(req) == as_sent(req) != [req]


def test_a_plan_says_when_the_servers_dialect_is_not_known_yet(tmp_path, capsys):
    """Before a run has asked a server what it takes, the plan counted today's body with
    no word: against llama-cpp-python's server it planned about half the prompt tokens the
    run sent. It now says the dialect is not known yet and what it can add."""
    from test_openai_backend import _SlowModels

    srv = _SlowModels([0.0])  # an OpenAI-compatible /models, not the stand-in
    try:
        cfg = write_config(tmp_path, srv, backend={"model": "m"}, input={"limit": 2})
        assert main(["plan", str(cfg)]) == 0
        out = capsys.readouterr().out
        # told which dialect, the plan counts it and says nothing more
        told = ["--set", "backend.openai.structured_output=json_schema"]
        assert main(["plan", str(cfg), *told]) == 0
        again = capsys.readouterr().out
    finally:
        srv.close()
    assert f"the server at {srv.base_url} takes for JSON requests with 'm' is not known yet" in out
    assert "prompt tokens more a JSON request" in out
    assert "set backend.openai.structured_output" in out
    assert "(reported as m)" in again and "is not known yet" not in again
