"""Tests for the vllm backend against a fake ``vllm`` package (no GPU, no vLLM needed)."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import time
import types
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from pipeline.config import BackendSection
from pipeline.core.errors import BackendError
from pipeline.engine.llm import Answer, LLMRunner
from pipeline.run.cache import RequestCache
from pipeline.types.chat import ChatRequest, ChatResult, RequestFailure

MODEL = "fake/model"


# --- the fake vllm package ---------------------------------------------------------------


class FakeParams:
    """Records its keyword arguments, like SamplingParams / StructuredOutputsParams."""

    def __init__(self, **kwargs: Any) -> None:
        self.kwargs = kwargs

    def __getattr__(self, name: str) -> Any:
        try:
            return self.__dict__["kwargs"][name]
        except KeyError:
            raise AttributeError(name) from None


class FakeSamplingParams(FakeParams):
    pass


class FakeStructuredOutputsParams(FakeParams):
    pass


@dataclass
class FakeCompletion:
    text: str
    finish_reason: str | None
    token_ids: list[int]


@dataclass
class FakeRequestOutput:
    prompt_token_ids: list[int] | None
    outputs: list[FakeCompletion] = field(default_factory=list)


def answer_text(conversation: list[dict[str, str]], k: int) -> str:
    """The fake model's deterministic answer: it names the conversation's last message."""
    return f"answer[{k}] to {conversation[-1]['content']}"


@dataclass
class ChatCall:
    conversations: list[list[dict[str, str]]]
    sampling_params: list[FakeSamplingParams]
    use_tqdm: Any


class FakeEngineCore:
    """vLLM 0.26.0's ``LLM.llm_engine.engine_core``: the client of the engine-core process."""

    def __init__(self) -> None:
        self.shutdowns = 0

    def shutdown(self, timeout: float | None = None) -> None:
        self.shutdowns += 1


class FakeLLM:
    instances: list[FakeLLM] = []  # replaced per test by the fixture
    fail_on_call: set[int] = set()  # 1-based numbers of chat calls that raise
    delay_s: float = 0.0  # how long each chat call blocks, like a GPU batch would

    def __init__(self, **kwargs: Any) -> None:
        self.kwargs = kwargs
        self.calls: list[ChatCall] = []
        self.llm_engine = types.SimpleNamespace(engine_core=FakeEngineCore())
        type(self).instances.append(self)

    def chat(
        self,
        messages: Sequence[list[dict[str, str]]],
        sampling_params: Sequence[FakeSamplingParams],
        use_tqdm: Any = True,
    ) -> list[FakeRequestOutput]:
        assert len(messages) == len(sampling_params)
        self.calls.append(ChatCall(list(messages), list(sampling_params), use_tqdm))
        time.sleep(type(self).delay_s)
        if len(self.calls) in type(self).fail_on_call:
            raise RuntimeError("CUDA out of memory (fake)")
        outs = []
        for conv, sp in zip(messages, sampling_params, strict=True):
            prompt_len = sum(len(m["content"].split()) for m in conv)
            completions = [
                FakeCompletion(answer_text(conv, k), "length" if k else None, list(range(3 + k)))
                for k in range(sp.n)
            ]
            outs.append(FakeRequestOutput(list(range(prompt_len)), completions))
        return outs


@pytest.fixture()
def fake_vllm(monkeypatch: pytest.MonkeyPatch) -> type[FakeLLM]:
    """Install a fake ``vllm`` and ``vllm.sampling_params``; start and end with no engines."""
    from pipeline.backends.vllm_backend import shutdown_engines

    llm_cls = type("LLM", (FakeLLM,), {"instances": [], "fail_on_call": set(), "delay_s": 0.0})
    fake = types.ModuleType("vllm")
    fake.LLM = llm_cls
    fake.SamplingParams = FakeSamplingParams
    sp_mod = types.ModuleType("vllm.sampling_params")
    sp_mod.SamplingParams = FakeSamplingParams
    sp_mod.StructuredOutputsParams = FakeStructuredOutputsParams
    fake.sampling_params = sp_mod
    monkeypatch.setitem(sys.modules, "vllm", fake)
    monkeypatch.setitem(sys.modules, "vllm.sampling_params", sp_mod)
    shutdown_engines()
    yield llm_cls
    shutdown_engines()


def make_cfg(**vllm: Any) -> BackendSection:
    return BackendSection(name="vllm", model=MODEL, vllm=vllm)


def make_backend(**vllm: Any):
    from pipeline.backends.vllm_backend import VLLMBackend

    return VLLMBackend(make_cfg(**vllm))


def req(user: str, question: str, **kw: Any) -> ChatRequest:
    return ChatRequest(
        messages=(
            ("system", "You write personalised answers."),
            ("user", f"Profile of {user}: likes things. Question: {question}"),
        ),
        model=MODEL,
        **kw,
    )


def collect(backend, requests: Sequence[ChatRequest]) -> list[tuple[int, Any]]:
    async def go() -> list[tuple[int, Any]]:
        return [item async for item in backend.run(requests)]

    return asyncio.run(go())


# --- tests -------------------------------------------------------------------------------


def test_engine_kwargs_come_from_config(fake_vllm: type[FakeLLM]) -> None:
    make_backend(
        tensor_parallel_size=2,
        gpu_memory_utilization=0.75,
        dtype="bfloat16",
        enable_prefix_caching=False,
        engine_args={"max_num_seqs": 128, "enforce_eager": True},
    )
    (llm,) = fake_vllm.instances
    assert llm.kwargs == {
        "model": MODEL,
        "tensor_parallel_size": 2,
        "gpu_memory_utilization": 0.75,
        "dtype": "bfloat16",
        "enable_prefix_caching": False,
        "max_num_seqs": 128,  # engine_args win over the named settings
        "enforce_eager": True,
        # the grammar engine for JSON answers, named so the run records it
        "structured_outputs_config": {"backend": "xgrammar"},
    }
    assert "max_model_len" not in llm.kwargs  # None means: the model's own default

    make_backend(max_model_len=4096)
    assert fake_vllm.instances[1].kwargs["max_model_len"] == 4096
    assert fake_vllm.instances[1].kwargs["enable_prefix_caching"] is True  # the default
    # 512, not vLLM's 1024: more running sequences than the CUDA-graph capture size measured
    # intermittently slower on an H100 (docs/vllm.md)
    assert fake_vllm.instances[1].kwargs["max_num_seqs"] == 512

    make_backend(max_num_seqs=256)
    assert fake_vllm.instances[2].kwargs["max_num_seqs"] == 256


def test_verified_version_is_the_one_the_extra_pins() -> None:
    from pipeline.backends.vllm_backend import VERIFIED_VLLM_VERSION

    pyproject = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text()
    extra = re.search(r"^vllm = \[(.*?)\]", pyproject, re.M | re.S)
    assert extra is not None
    assert f'"vllm=={VERIFIED_VLLM_VERSION}"' in extra.group(1)
    assert '"torch==2.11.0"' in extra.group(1)  # the torch that vLLM 0.26.0's wheel pins


def test_shutdown_engines_stops_each_engine_core_once(fake_vllm: type[FakeLLM]) -> None:
    from pipeline.backends.vllm_backend import shutdown_engines

    make_backend(dtype="bfloat16")
    make_backend(dtype="float16")
    cores = [llm.llm_engine.engine_core for llm in fake_vllm.instances]
    assert shutdown_engines() == 2
    assert [c.shutdowns for c in cores] == [1, 1]
    assert shutdown_engines() == 0  # nothing left: no second shutdown
    assert [c.shutdowns for c in cores] == [1, 1]


def test_shutdown_prefers_llm_shutdown_and_survives_errors(fake_vllm: type[FakeLLM]) -> None:
    from pipeline.backends.vllm_backend import shutdown_engines

    calls: list[str] = []

    def broken() -> None:
        calls.append("llm.shutdown")
        raise RuntimeError("already gone")

    backend = make_backend()
    backend.llm.shutdown = broken  # a later vLLM's LLM.shutdown() is used when present
    assert shutdown_engines() == 1  # the error does not escape (it also runs at exit)
    assert calls == ["llm.shutdown"]
    assert backend.llm.llm_engine.engine_core.shutdowns == 0


FAKE_VLLM_PACKAGE = """
import os, sys
class SamplingParams:
    def __init__(self, **kw): self.__dict__.update(kw)
class _Core:
    def shutdown(self, timeout=None):
        print("engine core shut down", flush=True)
        if os.environ.get("FAKE_SHUTDOWN_FAILS"):
            raise RuntimeError("boom")
class _Engine:
    engine_core = _Core()
class LLM:
    def __init__(self, **kw):
        self.llm_engine = _Engine()
"""


@pytest.mark.parametrize("fails", [False, True])
def test_engine_is_shut_down_at_process_exit(tmp_path: Path, fails: bool) -> None:
    pkg = tmp_path / "vllm"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(FAKE_VLLM_PACKAGE)
    (pkg / "sampling_params.py").write_text(
        "from vllm import SamplingParams\n"
        "class StructuredOutputsParams:\n"
        "    def __init__(self, **kw): self.__dict__.update(kw)\n"
    )
    code = (
        "from pipeline.config import BackendSection\n"
        "from pipeline.backends.vllm_backend import VLLMBackend\n"
        "VLLMBackend(BackendSection(name='vllm', model='m'))\n"
        "VLLMBackend(BackendSection(name='vllm', model='m'))\n"  # the same engine, reused
        "print('main done', flush=True)\n"
    )
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(root)])}
    if fails:
        env["FAKE_SHUTDOWN_FAILS"] = "1"
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["main done", "engine core shut down"]
    assert "Traceback" not in proc.stderr


def test_chunks_of_chunk_size_and_each_answer_maps_to_its_request(
    fake_vllm: type[FakeLLM],
) -> None:
    backend = make_backend(chunk_size=4)
    # Reverse order so sorting actually moves requests around.
    requests = [req(f"u{9 - i}", f"question {9 - i}") for i in range(10)]
    got = collect(backend, requests)

    (llm,) = fake_vllm.instances
    assert [len(c.conversations) for c in llm.calls] == [4, 4, 2]
    assert all(c.use_tqdm is False for c in llm.calls)
    assert sorted(i for i, _ in got) == list(range(10))  # each index exactly once
    for i, res in got:
        assert isinstance(res, ChatResult)
        assert res.choices[0].text == answer_text(requests[i].message_dicts(), 0)
        assert res.choices[0].finish_reason == "stop"  # None from vLLM -> "stop"
        assert res.model == MODEL
        expected_prompt = sum(len(c.split()) for _, c in requests[i].messages)
        assert res.prompt_tokens == expected_prompt
        assert res.completion_tokens == 3


def test_requests_sharing_a_prefix_are_sent_together(fake_vllm: type[FakeLLM]) -> None:
    backend = make_backend(chunk_size=3)

    def user_req(user: str, q: int) -> ChatRequest:
        return ChatRequest(
            messages=(("system", f"System for {user}"), ("user", f"{user} profile. Q{q}")),
            model=MODEL,
        )

    # Interleaved: alice, bob, alice, bob, ...
    requests = [user_req(u, q) for q in range(3) for u in ("bob", "alice")]
    got = collect(backend, requests)
    assert len(got) == 6

    (llm,) = fake_vllm.instances
    sent = [conv[0]["content"] for call in llm.calls for conv in call.conversations]
    # Grouped by prefix: one run per user, not alternating.
    assert sent == ["System for alice"] * 3 + ["System for bob"] * 3
    # With chunk_size 3, each call holds exactly one user's prompts.
    assert [{conv[0]["content"] for conv in c.conversations} for c in llm.calls] == [
        {"System for alice"},
        {"System for bob"},
    ]


def test_sampling_params_per_request(fake_vllm: type[FakeLLM]) -> None:
    backend = make_backend()
    schema = {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}
    requests = [
        req("u1", "q1", n=3, temperature=0.7, top_p=0.9, max_tokens=100, seed=11),
        req("u2", "q2", n=1, temperature=0.0, top_p=1.0, max_tokens=50, json_schema=schema),
    ]
    got = dict(collect(backend, requests))

    (call,) = fake_vllm.instances[0].calls
    by_question = {
        conv[-1]["content"].rsplit(" ", 1)[-1]: sp
        for conv, sp in zip(call.conversations, call.sampling_params, strict=True)
    }
    sp1, sp2 = by_question["q1"], by_question["q2"]
    assert sp1.kwargs == {"n": 3, "temperature": 0.7, "top_p": 0.9, "max_tokens": 100, "seed": 11}
    assert "structured_outputs" not in sp1.kwargs
    assert isinstance(sp2.structured_outputs, FakeStructuredOutputsParams)
    assert sp2.structured_outputs.kwargs == {"json": schema}
    assert (sp2.n, sp2.temperature, sp2.max_tokens, sp2.seed) == (1, 0.0, 50, None)

    # n samples come back as n choices, token counts summed over them.
    assert [c.text for c in got[0].choices] == [
        answer_text(requests[0].message_dicts(), k) for k in range(3)
    ]
    assert [c.finish_reason for c in got[0].choices] == ["stop", "length", "length"]
    assert got[0].completion_tokens == 3 + 4 + 5


def test_engine_shared_across_backends_and_survives_aclose(fake_vllm: type[FakeLLM]) -> None:
    from pipeline.backends.vllm_backend import shutdown_engines

    first = make_backend(dtype="bfloat16")
    asyncio.run(first.aclose())
    second = make_backend(dtype="bfloat16")
    assert len(fake_vllm.instances) == 1
    assert second.llm is first.llm

    collect(second, [req("u", "q")])  # still usable after the first backend closed
    assert len(first.llm.calls) == 1

    make_backend(dtype="float16")  # different settings: a different engine
    assert len(fake_vllm.instances) == 2

    assert shutdown_engines() == 2
    third = make_backend(dtype="bfloat16")
    assert len(fake_vllm.instances) == 3
    assert third.llm is not first.llm


def test_failing_chunk_yields_failures_and_other_chunks_succeed(
    fake_vllm: type[FakeLLM],
) -> None:
    fake_vllm.fail_on_call = {2}
    backend = make_backend(chunk_size=2)
    requests = [req(f"u{i}", f"q{i}") for i in range(5)]
    got = collect(backend, requests)

    assert sorted(i for i, _ in got) == list(range(5))
    calls = fake_vllm.instances[0].calls
    assert len(calls) == 3  # the failure did not stop the run
    failed_questions = {conv[-1]["content"] for conv in calls[1].conversations}
    for i, res in got:
        if requests[i].messages[-1][1] in failed_questions:
            assert isinstance(res, RequestFailure)
            assert res.transient is True
            assert res.reason.startswith("RuntimeError: CUDA out of memory")
        else:
            assert isinstance(res, ChatResult)
            assert res.choices[0].text == answer_text(requests[i].message_dicts(), 0)
    assert sum(isinstance(r, RequestFailure) for _, r in got) == 2


def test_chat_runs_off_the_event_loop(fake_vllm: type[FakeLLM]) -> None:
    # While the engine works on a chunk, the loop must keep running (cache commits,
    # progress); a blocking call on the loop thread would starve this ticker.
    fake_vllm.delay_s = 0.3
    backend = make_backend(chunk_size=1)

    async def go() -> tuple[int, int]:
        ticks = 0
        stop = asyncio.Event()

        async def ticker() -> None:
            nonlocal ticks
            while not stop.is_set():
                ticks += 1
                await asyncio.sleep(0.01)

        task = asyncio.create_task(ticker())
        got = [item async for item in backend.run([req("u", "q1"), req("u", "q2")])]
        stop.set()
        await task
        return ticks, len(got)

    ticks, answered = asyncio.run(go())
    assert answered == 2
    assert ticks >= 10  # ~60 expected over 0.6 s of engine time; 1-2 if the loop blocked


def test_missing_vllm_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    from pipeline.backends.vllm_backend import VLLMBackend

    monkeypatch.setitem(sys.modules, "vllm", None)  # makes `import vllm` raise ImportError
    with pytest.raises(BackendError) as err:
        VLLMBackend(make_cfg())
    assert "personalized-rewardbench[vllm]" in str(err.value)
    assert "GPU" in str(err.value)


def test_package_import_does_not_import_vllm(tmp_path: Path) -> None:
    # An importable (empty) `vllm` on the path: loading the package, the backend registry,
    # the factory and this module must still leave it unimported.
    (tmp_path / "vllm").mkdir()
    (tmp_path / "vllm" / "__init__.py").write_text("")
    code = (
        "import sys, pipeline, pipeline.backends, pipeline.backends.factory, "
        "pipeline.backends.vllm_backend, pipeline.engine.llm; "
        "assert 'vllm' not in sys.modules"
    )
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(root)])}
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr


def test_end_to_end_with_runner_and_cache(fake_vllm: type[FakeLLM], tmp_path: Path) -> None:
    from pipeline.backends.factory import make_backend as factory_make_backend

    cfg = make_cfg(chunk_size=3)
    requests = [req(f"u{i % 2}", f"q{i}", seed=i) for i in range(7)]
    cache_path = tmp_path / "cache.sqlite"

    async def run_once() -> dict[int, Any]:
        backend = factory_make_backend(cfg, cache_path)
        with RequestCache(cache_path) as cache:
            # text_reasks=0: the fake model's answers name their prompt and stop without a
            # full stop; this test is about the engine calls, not about cut answers
            runner = LLMRunner(backend, cache, "responses", progress=False, text_reasks=0)
            out = {i: o async for i, o in runner.stream(requests)}
            stats = runner.stats
        await backend.aclose()
        return out, stats

    first, stats1 = asyncio.run(run_once())
    llm = fake_vllm.instances[0]
    assert len(llm.calls) == 3  # 7 requests in chunks of 3
    assert stats1.sent == 7 and stats1.cached == 0
    assert all(isinstance(a, Answer) and not a.cached for a in first.values())
    with RequestCache(cache_path) as cache:
        assert cache.count("responses") == 7

    second, stats2 = asyncio.run(run_once())
    assert len(fake_vllm.instances) == 1  # same engine reused
    assert len(llm.calls) == 3  # zero new chat calls: everything came from the cache
    assert stats2.cached == 7 and stats2.sent == 0
    for i in range(7):
        assert second[i].cached
        assert second[i].result.choices[0].text == first[i].result.choices[0].text
        assert second[i].result.choices[0].text == answer_text(requests[i].message_dicts(), 0)


def test_runner_sends_chunks_of_chunk_size_requests(
    fake_vllm: type[FakeLLM], tmp_path: Path
) -> None:
    # chunk_size counts requests end to end: the runner's streaming feed must not cut the
    # engine's batches to its own default chunk (fewer, larger LLM.chat calls are faster).
    backend = make_backend(chunk_size=300)
    requests = [req(f"u{i % 7}", f"q{i}", seed=i) for i in range(700)]

    async def go() -> int:
        with RequestCache(tmp_path / "cache.sqlite") as cache:
            # text_reasks=0: the fake model's answers name their prompt and stop without a
            # full stop; this test is about the engine calls, not about cut answers
            runner = LLMRunner(backend, cache, "responses", progress=False, text_reasks=0)
            return sum([1 async for _ in runner.stream(requests)])

    assert asyncio.run(go()) == 700
    assert [len(c.conversations) for c in fake_vllm.instances[0].calls] == [300, 300, 100]


def test_the_grammar_engine_is_part_of_the_identity_and_decides_the_schema_form(
    fake_vllm: type[FakeLLM],
) -> None:
    """xgrammar (the default) is sent schemas without string bounds; guidance (llguidance
    enforces them cheaply) the full ones; the two are different backends to the cache."""
    from pipeline.backends.vllm_backend import VLLMBackend
    from pipeline.kinds.backend import BackendSection
    from pipeline.types import schemas

    default = BackendSection(name="vllm", model=MODEL)
    guided = BackendSection(
        name="vllm", model=MODEL, vllm={"structured_outputs_backend": "guidance"}
    )
    a = VLLMBackend.identify(default, [MODEL])
    b = VLLMBackend.identify(guided, [MODEL])
    assert a["structured_outputs"]["backend"] == "xgrammar" and schemas.SCHEMA_BOUNDS not in a
    assert b["structured_outputs"]["backend"] == "guidance" and b[schemas.SCHEMA_BOUNDS] is True
    q = schemas.quality_schema(1024)
    assert schemas.bounded_strings(schemas.for_engine(q, a)) == 0
    assert schemas.for_engine(q, b) is q
    assert "JSON by guidance" in VLLMBackend.describe(b)
    make_backend(structured_outputs_backend="guidance")
    assert fake_vllm.instances[-1].kwargs["structured_outputs_config"] == {"backend": "guidance"}
