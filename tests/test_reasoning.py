"""A reasoning model's answers (pipeline/backends/reasoning.py): the reasoning taken out of
every answer, counted, recorded by its length, its budget added on top of max_tokens, and a
reasoning that uses its whole budget asked again and then dropped, never read as an answer.

Played by the stand-in server (tests/standin_server.py: ``reasoning="inline"``, a <think>
block in the content, and ``"field"``, the reasoning apart as vLLM's server returns it with
--reasoning-parser) and by a fake vllm module; the real model's output through llama.cpp is
tests/test_reasoning_model.py.
"""

from __future__ import annotations

import asyncio
import json
import sys
import types
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from conftest import write_config
from standin_server import StandinServer

from pipeline.backends.identity import identity_id
from pipeline.backends.openai.backend import OpenAIBackend
from pipeline.backends.reasoning import split, split_choice
from pipeline.config import BackendSection, load_config
from pipeline.core.ids import canonical_json
from pipeline.engine.llm import Answer, Failure, Job, LLMRunner
from pipeline.orchestration.orchestrate import run_pipeline
from pipeline.run import RunDir
from pipeline.run.cache import RequestCache
from pipeline.types import schemas
from pipeline.types.chat import ChatRequest, Choice, output_bound

SCHEMA = {
    "type": "object",
    "properties": {"winner": {"enum": ["A", "B"]}},
    "required": ["winner"],
    "additionalProperties": False,
}
RECORD = {"budget": 64, "json_mode": "reason_first", "tags": ["<think>", "</think>"]}


def validate(req: ChatRequest, text: str) -> Any:
    """The stages' own reading of a JSON answer: parsed whole and checked against its schema."""
    return schemas.parse(req.json_schema or SCHEMA, text)


# ---- splitting ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "opens", "expected"),
    [
        ("<think>\nweigh A\n</think>\n\nA is best.", False, ("A is best.", "weigh A", True)),
        # the template opened the block: only the end tag is in the answer (R1's newer template)
        ("weigh A\n</think>\n{\"winner\": \"A\"}", False, ('{"winner": "A"}', "weigh A", True)),
        ("<think>\nstill weighing A and", False, ("", "still weighing A and", False)),
        ("A plain answer, no reasoning.", False, ("A plain answer, no reasoning.", None, True)),
        ("still weighing", True, ("", "still weighing", False)),
    ],
)  # fmt: skip
def test_split_follows_the_deepseek_r1_parser(text, opens, expected) -> None:
    assert split(text, template_opens=opens) == expected


def test_a_reasoning_cut_at_the_limit_is_no_answer() -> None:
    cut = split_choice(Choice("<think>\nhmm, A or", "length"), RECORD)
    assert cut.text == "" and cut.reasoning == "hmm, A or" and cut.reasoning_cut
    # the answer itself cut after the reasoning ended is an ordinary cut answer
    late = split_choice(Choice("<think>ok</think>A is bet", "length"), RECORD)
    assert late.text == "A is bet" and not late.reasoning_cut
    # a server that split it: null content at the limit is a cut reasoning
    served = split_choice(Choice("", "length", reasoning="hmm"), RECORD)
    assert served.reasoning_cut and served.reasoning == "hmm"


def test_request_keys_change_only_with_a_reasoning_budget_set() -> None:
    req = ChatRequest(messages=(("user", "q"),), model="m", json_schema=SCHEMA)
    assert req.canonical() == canonical_json(req.to_dict())
    assert "reasoning_budget" not in req.canonical()  # every other request keeps its key
    more = ChatRequest(
        messages=(("user", "q"),), model="m", json_schema=SCHEMA, reasoning_budget=128
    )
    assert more.canonical() == canonical_json(more.to_dict()) and more.key != req.key
    # the bound the budget and `prb plan` count: max_tokens plus the reasoning's allowance
    assert output_bound(req) == 512
    assert output_bound(req, RECORD) == 512 + 64 and output_bound(more, RECORD) == 512 + 128
    grammar_only = {**RECORD, "json_mode": "grammar_only"}
    assert output_bound(req, grammar_only) == 512  # JSON from its first token: no reasoning


def test_choice_round_trips_its_reasoning_and_old_caches_read_the_same() -> None:
    from pipeline.types.chat import ChatResult

    plain = ChatResult([Choice("a", "stop")], 1, 2, "m")
    assert plain.to_dict()["choices"] == [{"text": "a", "finish_reason": "stop"}]
    r = ChatResult([Choice("a", "stop", "why", 7, False)], 1, 9, "m")
    back = ChatResult.from_dict(json.loads(json.dumps(r.to_dict())))
    assert back == r and back.reasoning_tokens == 7 and back.reasoned


# ---- the openai backend against the stand-in playing a reasoning model -------------------


def backend_cfg(server: StandinServer, **reasoning: Any) -> BackendSection:
    return BackendSection(
        name="openai",
        model="standin-model",
        backoff_initial_s=0.01,
        openai={"base_url": server.base_url, "max_concurrency": 2, "reasoning": reasoning},
    )


def run_jobs(cfg: BackendSection, tmp_path: Path, jobs: list[Job]) -> tuple[list, Any]:
    async def go() -> tuple[list, Any]:
        backend = OpenAIBackend(cfg)
        cache = RequestCache(tmp_path / "cache.sqlite")
        runner = LLMRunner(backend, cache, "judge", progress=False)
        try:
            out = [item async for item in runner.run(jobs)]
        finally:
            await backend.aclose()
            cache.close()
        return out, runner.stats

    return asyncio.run(go())


def request(text: str, schema: dict | None = None, max_tokens: int = 60) -> ChatRequest:
    return ChatRequest(
        messages=(("user", text),), model="standin-model", max_tokens=max_tokens, json_schema=schema
    )


@pytest.mark.parametrize("mode", ["inline", "field"])
def test_reasoning_is_taken_out_and_counted(tmp_path: Path, mode: str) -> None:
    with StandinServer(reasoning=mode, reasoning_words=30) as server:
        cfg = backend_cfg(server, enabled=True, budget=100)
        jobs = [
            Job(request("Say hello to the user in one sentence."), "text"),
            Job(request("Which is better?", SCHEMA), "json", validate),
        ]
        out, stats = run_jobs(cfg, tmp_path, jobs)
        sent = [r["body"] for r in server.requests]
    answers = dict(out)
    for tag in ("text", "json"):
        a = answers[tag]
        assert isinstance(a, Answer)
        (choice,) = a.result.choices
        assert "<think>" not in choice.text and "</think>" not in choice.text
        assert "let me think" not in choice.text
        assert choice.reasoning.startswith("Okay, let me think")
        assert choice.reasoning_tokens > 0 and not choice.reasoning_cut
    assert answers["json"].parsed == [json.loads(answers["json"].result.choices[0].text)]
    # the engine is asked for the reasoning budget on top of the answer's max_tokens
    assert {b["max_tokens"] for b in sent} == {60 + 100}
    assert stats.reasoned_answers == 2 and stats.reasoning_tokens >= 2 * 25
    assert stats.as_dict()["reasoning_tokens"] == stats.reasoning_tokens


def test_a_server_that_splits_needs_no_setting(tmp_path: Path) -> None:
    # vllm serve --reasoning-parser: the content is the answer, the reasoning apart
    with StandinServer(reasoning="field", reasoning_words=20) as server:
        out, stats = run_jobs(backend_cfg(server), tmp_path, [Job(request("Say hi."), "t")])
        assert server.requests[0]["body"]["max_tokens"] == 60  # no budget added: not told
    ((_, a),) = out
    assert a.result.choices[0].reasoning and "Okay, let me" not in a.result.choices[0].text
    assert stats.reasoning_tokens > 0


def test_without_the_setting_an_inline_block_stays_in_the_text(tmp_path: Path) -> None:
    # what happens to a user who does not say the model reasons: the docs' warning, shown
    with StandinServer(reasoning="inline", reasoning_words=10) as server:
        out, _ = run_jobs(backend_cfg(server), tmp_path, [Job(request("Say hi."), "t")])
    assert out[0][1].result.choices[0].text.startswith("<think>")


def test_reasoning_that_uses_its_budget_is_asked_again_with_twice_it(tmp_path: Path) -> None:
    with StandinServer(reasoning="inline", reasoning_words=20) as server:
        server.inject("reasoning_length", 1)  # the first answer never ends its reasoning
        cfg = backend_cfg(server, enabled=True, budget=50)
        out, stats = run_jobs(cfg, tmp_path, [Job(request("Which?", SCHEMA), "j", validate)])
        sent = [r["body"]["max_tokens"] for r in server.requests]
    ((_, a),) = out
    assert isinstance(a, Answer) and a.parsed[0]["winner"] in ("A", "B")
    assert sent == [60 + 50, 60 + 100]  # the retry doubles the reasoning budget only
    assert a.request.reasoning_budget == 100 and a.reasks == 1
    assert stats.reasoning_cut == 1 and stats.failed == 0


def test_reasoning_exhausted_twice_is_its_own_failure_never_an_answer(tmp_path: Path) -> None:
    with StandinServer(reasoning="field", reasoning_words=20) as server:
        server.inject("reasoning_length", 4)
        cfg = backend_cfg(server, enabled=True, budget=50)
        jobs = [Job(request("Which?", SCHEMA), "j", validate), Job(request("Say hi."), "t")]
        out, stats = run_jobs(cfg, tmp_path, jobs)
        assert server.request_count == 4  # each asked once more, then given up
    got = dict(out)
    failure = got["j"]
    assert isinstance(failure, Failure) and failure.final
    assert failure.reason.startswith("reasoning_exhausted: the reasoning used its budget of 100")
    assert stats.failure_reasons == {"reasoning_exhausted": 1}
    # free text: handed over as it is, empty and cut, for the pair filters to drop
    text = got["t"]
    assert isinstance(text, Answer)
    (choice,) = text.result.choices
    assert choice.text == "" and choice.finish_reason == "length" and choice.reasoning_cut
    # stored all the same (tokens were spent): a second run sends nothing
    with StandinServer(reasoning="field", reasoning_words=20) as again:
        cfg2 = backend_cfg(again, enabled=True, budget=50)
        cfg2 = cfg2.model_copy(
            update={"openai": cfg.openai.model_copy(update={"base_url": again.base_url})}
        )
        out2, _ = run_jobs(cfg2, tmp_path, [Job(request("Say hi."), "t")])
        assert again.request_count == 0
    assert out2[0][1].result.choices[0].reasoning_cut


def test_reasoning_settings_are_part_of_the_identity(tmp_path: Path) -> None:
    with StandinServer(reasoning="inline") as server:
        plain = OpenAIBackend.identify(backend_cfg(server), ["standin-model"])
        on = OpenAIBackend.identify(backend_cfg(server, enabled=True), ["standin-model"])
        other = OpenAIBackend.identify(
            backend_cfg(server, enabled=True, json_mode="grammar_only"), ["standin-model"]
        )
    assert "reasoning" not in plain and on["reasoning"]["budget"] == 1024
    assert len({identity_id(x) for x in (plain, on, other)}) == 3
    assert "a reasoning model (budget 1024 tokens" in OpenAIBackend.describe(
        {**on, "kind": "openai"}
    )


# ---- a whole run on the stand-in playing a reasoning model ------------------------------


def test_a_run_on_a_reasoning_model_stores_no_reasoning_anywhere(tmp_path: Path) -> None:
    with StandinServer(reasoning="inline", reasoning_words=25) as server:
        path = write_config(
            tmp_path,
            server,
            backend={"openai": {"reasoning": {"enabled": True, "budget": 200}}},
            rubrics={"source": "generated"},
        )
        run_pipeline(load_config(path), progress=False)
    run = RunDir(tmp_path / "outputs" / "t")
    every = []
    for stage in ("rubrics", "responses", "judge", "pairs"):
        rows = list(run.stage(stage).rows())
        every += [json.dumps(r) for r in rows]
    # the stand-in's reasoning opens with these words, its block with the tag and a newline
    # (the tags themselves are in each row's provenance, as the identity records them)
    assert every and not any("let me think about what this" in t for t in every)
    assert not any("<think>\\n" in t or "</think>\\n" in t for t in every)
    cands = list(run.stage("responses").rows())
    recorded = [c["provenance"]["reasoning"] for c in cands]
    assert all(r["tokens"] > 0 and r["chars"] > 0 and r["cut"] is False for r in recorded)
    stats = run.stage("judge").stats()["llm"]
    assert stats["reasoned_answers"] > 0 and stats["reasoning_tokens"] > 0
    kept = run.stage("pairs").stats()["kept"]
    assert kept > 0
    from pipeline.cli import main

    assert main(["publish", str(run.path)]) == 0
    card = (run.path / "publish" / "README.md").read_text()
    assert "**Answers from a reasoning model.**" in card
    assert "reasoning tokens in" in card


# ---- the vllm backend against a fake vllm -----------------------------------------------


@dataclass
class _Out:
    text: str
    finish_reason: str
    token_ids: list[int]


@dataclass
class _ReqOut:
    prompt_token_ids: list[int]
    outputs: list[_Out] = field(default_factory=list)


END_ID = 151649  # DeepSeek-R1's </think>


class _Tokenizer:
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [END_ID] if text == "</think>" else [1] * len(text.split())


class _FakeLLM:
    last: _FakeLLM | None = None

    def __init__(self, **kwargs: Any) -> None:
        self.kwargs = kwargs
        self.params: list[Any] = []
        self.llm_engine = types.SimpleNamespace(
            engine_core=types.SimpleNamespace(shutdown=lambda: None)
        )
        type(self).last = self

    def get_tokenizer(self) -> _Tokenizer:
        return _Tokenizer()

    def chat(self, messages: Sequence[Any], sampling_params: Sequence[Any], use_tqdm: Any = True):
        self.params += list(sampling_params)
        outs = []
        for sp in sampling_params:
            think = ["hm"] * 12
            if sp.kwargs["max_tokens"] <= 12:  # the reasoning reaches the limit
                outs.append(
                    _ReqOut(
                        [0],
                        [
                            _Out(
                                "<think>\n" + " ".join(think),
                                "length",
                                [5] * sp.kwargs["max_tokens"],
                            )
                        ],
                    )
                )
                continue
            answer = '{"winner": "B"}' if sp.kwargs.get("structured_outputs") else "Fine."
            ids = [5] * 12 + [END_ID] + [7, 7]
            outs.append(
                _ReqOut(
                    [0],
                    [_Out("<think>\n" + " ".join(think) + "\n</think>\n\n" + answer, "stop", ids)],
                )
            )
        return outs


class _Params:
    def __init__(self, **kwargs: Any) -> None:
        self.kwargs = kwargs

    def __getattr__(self, name: str) -> Any:
        return self.__dict__["kwargs"].get(name)


@pytest.fixture
def fake_vllm(monkeypatch: pytest.MonkeyPatch):
    from pipeline.backends.vllm_backend import shutdown_engines

    fake = types.ModuleType("vllm")
    fake.LLM = _FakeLLM
    fake.SamplingParams = _Params
    sp = types.ModuleType("vllm.sampling_params")
    sp.StructuredOutputsParams = _Params
    monkeypatch.setitem(sys.modules, "vllm", fake)
    monkeypatch.setitem(sys.modules, "vllm.sampling_params", sp)
    shutdown_engines()
    yield _FakeLLM
    shutdown_engines()


def test_vllm_backend_reasons_first_and_counts_from_token_ids(fake_vllm, tmp_path: Path) -> None:
    from pipeline.backends.vllm_backend import VLLMBackend, engine_identity

    cfg = BackendSection(
        name="vllm", model="m", vllm={"reasoning": {"enabled": True, "budget": 40}}
    )
    backend = VLLMBackend(cfg)
    llm = fake_vllm.last
    # the grammar starts after the reasoning: vLLM's reasoning parser in the engine's config
    assert llm.kwargs["structured_outputs_config"] == {
        "backend": "xgrammar",
        "reasoning_parser": "deepseek_r1",
    }
    cache = RequestCache(tmp_path / "c.sqlite")
    jobs = [Job(request("Which?", SCHEMA, 20), "j", validate), Job(request("Hi", None, 20), "t")]

    async def go() -> list:
        runner = LLMRunner(backend, cache, "judge", progress=False)
        return [x async for x in runner.run(jobs)]

    out = dict(asyncio.run(go()))
    for tag in ("j", "t"):
        (choice,) = out[tag].result.choices
        assert "<think>" not in choice.text and choice.reasoning == " ".join(["hm"] * 12)
        assert choice.reasoning_tokens == 13  # up to and with the end tag's token id
    assert out["j"].parsed == [{"winner": "B"}]
    assert {p.kwargs["max_tokens"] for p in llm.params} == {20 + 40}
    ident = engine_identity(cfg, "vllm")
    assert ident["reasoning"]["parser"] == "deepseek_r1"
    grammar_only = BackendSection(
        name="vllm", model="m", vllm={"reasoning": {"enabled": True, "json_mode": "grammar_only"}}
    )
    # answering under the grammar from the first token: no parser, another identity
    assert "parser" not in engine_identity(grammar_only, "vllm")["reasoning"]
    assert identity_id(ident) != identity_id(engine_identity(grammar_only, "vllm"))
    cache.close()


def test_ray_refuses_a_reasoning_model() -> None:
    from pipeline.backends.ray_backend import RayBackend
    from pipeline.core.errors import BackendError

    cfg = BackendSection(
        name="ray", model="m", ray={"engine": "vllm"}, vllm={"reasoning": {"enabled": True}}
    )
    with pytest.raises(BackendError, match="does not take a reasoning model's reasoning out"):
        RayBackend.preflight(cfg)


def test_a_server_reasoning_past_max_tokens_untold_fails_with_the_setting_to_use(
    tmp_path: Path,
) -> None:
    with StandinServer(reasoning="field", reasoning_words=20) as server:
        server.inject("reasoning_length", 1)
        out, stats = run_jobs(
            backend_cfg(server), tmp_path, [Job(request("Which?", SCHEMA), "j", validate)]
        )
        assert server.request_count == 1  # no budget to double: given up at once
    failure = out[0][1]
    assert isinstance(failure, Failure) and failure.final
    assert "used every one of the 60 tokens" in failure.reason
    assert "reasoning.enabled" in failure.reason and stats.reasoning_cut == 1


def test_plan_counts_the_reasoning_budget_in_every_output_bound(tmp_path: Path, capsys) -> None:
    from pipeline.cli import main

    with StandinServer(reasoning="inline") as server:
        bounds = {}
        for budget in (None, 300):
            reasoning = {"enabled": True, "budget": budget} if budget else {}
            cfg = write_config(tmp_path, server, backend={"openai": {"reasoning": reasoning}})
            assert main(["plan", str(cfg), "--json", "--until", "responses"]) == 0
            data = json.loads(capsys.readouterr().out)
            bounds[budget] = data["totals"]["output_tokens_bound"]
            notes = " ".join(data.get("notes") or [])
            assert ("up to 300 reasoning tokens" in notes) is bool(budget)
    # the responses' 60 requests (rubrics given) hold 96 choices, each its budget more
    assert data["totals"]["requests_to_send"] == 60
    assert bounds[300] - bounds[None] == 300 * 96


def test_each_verdict_records_its_reasoning_length(tmp_path: Path) -> None:
    with StandinServer(reasoning="field", reasoning_words=15) as server:
        path = write_config(tmp_path, server, backend={"openai": {"reasoning": {"enabled": True}}})
        run_pipeline(load_config(path), progress=False)
    row = next(iter(RunDir(tmp_path / "outputs" / "t").stage("judge").rows()))
    verdicts = [*row["quality"].values(), *row["coverage"].values()]
    verdicts += [
        v
        for p in row["pairwise"]
        for k in ("pairwise_aware", "pairwise_blind")
        for v in p.get(k, {}).values()  # the judge asks only what can change the kept pair
    ]
    verdicts = [v for v in verdicts if not v.get("skipped")]
    assert verdicts and all(v["reasoning_tokens"] > 0 for v in verdicts)
    assert not any("Okay, let me think" in json.dumps(v) for v in verdicts)
