"""The llamacpp backend: its mapping of requests against a fake ``llama_cpp`` (no model
needed), and against the real engine on the SmolLM2-135M GGUF that the `local` extra
ships (skipped without the extra, unless CI is set: there they must run)."""

from __future__ import annotations

import asyncio
import hashlib
import importlib.util
import json
import os
import struct
import subprocess
import sys
import threading
import time
import types
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import write_config

from pipeline.backends import llamacpp_backend as lb
from pipeline.backends.factory import make_backend, preflight
from pipeline.config import Config, load_config
from pipeline.core.errors import BackendError, StageError
from pipeline.engine.llm import LLMRunner
from pipeline.kinds.backend import BackendSection
from pipeline.kinds.settings import LLAMACPP_DEFAULT_MODEL
from pipeline.run.cache import RequestCache
from pipeline.types import schemas
from pipeline.types.chat import ChatRequest, ChatResult, RequestFailure

ROOT = Path(__file__).resolve().parents[1]

try:
    HAVE_LLAMA_CPP = importlib.util.find_spec("llama_cpp") is not None
except (ImportError, ValueError):  # ValueError: sys.modules["llama_cpp"] is None
    HAVE_LLAMA_CPP = False
_skip = pytest.mark.skipif(
    not HAVE_LLAMA_CPP and not os.environ.get("CI"),
    reason="llama-cpp-python is not installed (pip install 'personalized-rewardbench[local]'); "
    "CI runs these",
)


def needs_model(test: Any) -> Any:
    """The real engine: marked llamacpp (CI runs these once the extra is built)."""
    return pytest.mark.llamacpp(_skip(test))


# --- a fake llama_cpp --------------------------------------------------------------------


class FakeGrammar:
    built: list[str] = []  # the schemas converted, as JSON (replaced per test)

    def __init__(self, text: str) -> None:
        self._grammar = text

    @classmethod
    def from_json_schema(cls, json_schema: str, verbose: bool = True) -> FakeGrammar:
        cls.built.append(json_schema)
        if "$ref" in json_schema:
            raise AssertionError("Error resolving ref")  # as the real converter does
        return cls(f"root ::= grammar-for {json_schema}")


class FakeLlama:
    instances: list[FakeLlama] = []
    delay_s = 0.0
    context = 1000  # tokens; a longer prompt raises like llama.cpp

    def __init__(self, **kwargs: Any) -> None:
        self.kwargs = kwargs
        self.calls: list[dict[str, Any]] = []
        self.closed = False
        self._model = types.SimpleNamespace(vocab="vocab")
        type(self).instances.append(self)

    def create_chat_completion(self, **kw: Any) -> dict[str, Any]:
        self.calls.append(kw)
        time.sleep(type(self).delay_s)
        prompt = sum(len(m["content"].split()) for m in kw["messages"])
        if prompt >= type(self).context:
            raise ValueError(
                f"Requested tokens ({prompt}) exceed context window of {type(self).context}"
            )
        k = len(self.calls)
        text = f"answer {k} seed {kw['seed']}"
        finish = "length" if kw["max_tokens"] < 5 else "stop"
        return {
            "choices": [{"message": {"role": "assistant", "content": text},
                         "finish_reason": finish}],
            "usage": {"prompt_tokens": prompt, "completion_tokens": 3 + k,
                      "total_tokens": prompt + 3 + k},
        }  # fmt: skip

    def close(self) -> None:
        self.closed = True


@pytest.fixture()
def fake_llama(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> type[FakeLlama]:
    """A fake ``llama_cpp`` module and a fake GGUF file; no engines before or after."""
    llama_cls = type("Llama", (FakeLlama,), {"instances": [], "delay_s": 0.0, "context": 1000})
    grammar_cls = type("LlamaGrammar", (FakeGrammar,), {"built": []})
    fake = types.ModuleType("llama_cpp")
    fake.__version__ = "0.0-fake"
    fake.Llama = llama_cls
    fake.LlamaGrammar = grammar_cls
    fake.null_grammar_for = set()  # grammar texts the fake parser refuses
    fake.freed = []

    def init_grammar(vocab: Any, text: bytes, root: bytes) -> Any:
        return None if text.decode() in fake.null_grammar_for else ("sampler", text)

    fake.llama_sampler_init_grammar = init_grammar
    fake.llama_sampler_free = fake.freed.append
    monkeypatch.setitem(sys.modules, "llama_cpp", fake)
    lb.shutdown_engines()
    yield llama_cls
    lb.shutdown_engines()


def gguf_bytes(
    *,
    version: int = 3,
    tensors: int | None = None,
    kvs: int | None = None,
    elements: int = 4,
    cut: int = 0,
) -> bytes:
    """A small GGUF file as llama.cpp's format has it: header, one metadata entry, one F32
    tensor of ``elements`` values; ``tensors``/``kvs`` overwrite the header's counts,
    ``cut`` drops that many bytes from the end."""
    key, value = b"general.architecture", b"llama"
    kv = struct.pack("<Q", len(key)) + key + struct.pack("<I", 8)
    kv += struct.pack("<Q", len(value)) + value
    tensor = struct.pack("<Q", 1) + b"w" + struct.pack("<IQIQ", 1, elements, 0, 0)
    head = b"GGUF" + struct.pack("<IQQ", version, 1 if tensors is None else tensors,
                                 1 if kvs is None else kvs) + kv + tensor  # fmt: skip
    head += b"\0" * (-len(head) % 32)  # the data section is aligned to 32 bytes
    data = head + struct.pack(f"<{elements}f", *range(elements))
    return data[: len(data) - cut] if cut else data


def gguf(tmp_path: Path, name: str = "model.gguf", body: bytes = b"") -> Path:
    """A loadable-looking GGUF file (the fake engine never reads it; the preflight does)."""
    path = tmp_path / name
    path.write_bytes(gguf_bytes() + body)
    return path


def cfg_for(model: Path | str, **llamacpp: Any) -> BackendSection:
    return BackendSection(name="llamacpp", model=str(model), llamacpp=llamacpp)


def req(text: str, model: str, **kw: Any) -> ChatRequest:
    return ChatRequest(messages=(("system", "You answer."), ("user", text)), model=model, **kw)


def collect(backend: Any, requests: Sequence[ChatRequest]) -> dict[int, Any]:
    async def go() -> dict[int, Any]:
        return {i: r async for i, r in backend.run(requests)}

    return asyncio.run(go())


# --- configuration -----------------------------------------------------------------------


def test_no_model_given_means_the_packaged_gguf_for_llamacpp_only():
    for given in ({}, {"model": None}, {"model": ""}):
        assert BackendSection(name="llamacpp", **given).model == LLAMACPP_DEFAULT_MODEL
    assert BackendSection(name="llamacpp", model="m.gguf").model == "m.gguf"
    assert BackendSection().model == "stand-in"  # other backends keep their default
    assert BackendSection(name="vllm").model == "stand-in"
    section = BackendSection()
    section.name = "llamacpp"  # set later: the default follows the backend
    assert section.model == LLAMACPP_DEFAULT_MODEL
    section.name = "openai"
    assert section.model == "stand-in"


def test_run_yaml_names_the_default_model_not_a_site_packages_path(tmp_path: Path):
    cfg = load_config(write_config(tmp_path), ["backend.name=llamacpp", "backend.model="])
    dumped = yaml.safe_load(cfg.to_yaml())
    assert dumped["backend"]["model"] == LLAMACPP_DEFAULT_MODEL
    assert "site-packages" not in cfg.to_yaml()
    # the settings section and its measured defaults are part of the config
    assert dumped["backend"]["llamacpp"] == Config().backend.llamacpp.model_dump(mode="json")


def test_engine_kwargs_come_from_the_config(tmp_path: Path):
    path = gguf(tmp_path)
    kw = lb.engine_kwargs(cfg_for(path, threads=3, context_length=2048, batch_size=64), path)
    assert kw == {"model_path": str(path), "n_ctx": 2048, "n_batch": 64, "n_ubatch": 64,
                  "n_threads": 3, "n_threads_batch": 3, "verbose": False}  # fmt: skip
    kw = lb.engine_kwargs(cfg_for(path, threads_batch=2, engine_args={"n_batch": 8}), path)
    assert kw["n_threads_batch"] == 2 and kw["n_batch"] == 8  # engine_args win


# --- the model file ----------------------------------------------------------------------


def test_a_missing_folder_or_non_gguf_model_is_one_line_naming_the_path(tmp_path: Path):
    not_gguf = tmp_path / "weights.bin"
    not_gguf.write_bytes(b"PK\x03\x04 a zip, not a GGUF")
    for path, why in ((tmp_path / "nope.gguf", "does not exist"), (tmp_path, "is a folder"),
                      (not_gguf, "is not a GGUF file")):  # fmt: skip
        with pytest.raises(BackendError) as err:
            lb.resolve_model(str(path))
        assert str(path) in str(err.value) and why in str(err.value)
        assert "\n" not in str(err.value)


def test_package_references(tmp_path: Path):
    with pytest.raises(BackendError, match="expected pkg:<package>/<file>"):
        lb.resolve_model("pkg:only_a_package")
    with pytest.raises(BackendError, match="'no_such_pkg_xyz' is not installed"):
        lb.resolve_model("pkg:no_such_pkg_xyz/m.gguf")


def test_a_relative_model_path_is_relative_to_the_config_file(
    fake_llama: type[FakeLlama], tmp_path: Path
):
    (tmp_path / "models").mkdir()
    path = gguf(tmp_path / "models")
    cfg = load_config(
        write_config(tmp_path), ["backend.name=llamacpp", "backend.model=models/model.gguf"]
    )
    backend = make_backend(cfg.backend, None, cfg.resolve_input)
    assert fake_llama.instances[0].kwargs["model_path"] == str(path)
    assert backend.identity["model"] == "models/model.gguf"  # as the config names it


def test_preflight_names_the_extra_and_checks_the_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    real = importlib.util.find_spec

    def installed(yes: bool) -> None:  # llama_cpp installed or not, whatever this machine has
        fake = types.SimpleNamespace(name="llama_cpp") if yes else None
        monkeypatch.setattr(
            importlib.util,
            "find_spec",
            lambda name, *a: fake if name == "llama_cpp" else real(name, *a),
        )

    installed(True)
    with pytest.raises(BackendError, match="does not exist"):
        preflight(cfg_for(tmp_path / "missing.gguf"))
    assert preflight(cfg_for(gguf(tmp_path))) is None
    installed(False)
    with pytest.raises(BackendError, match=r"personalized-rewardbench\[local\]"):
        preflight(cfg_for(gguf(tmp_path)))


def test_missing_llama_cpp_names_the_extra(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # `import llama_cpp` raises
    with pytest.raises(BackendError) as err:
        lb.LlamaCppBackend(cfg_for(gguf(tmp_path)))
    assert "personalized-rewardbench[local]" in str(err.value)


def test_package_import_does_not_import_llama_cpp():
    code = (
        "import sys, pipeline, pipeline.backends, pipeline.backends.factory, "
        "pipeline.backends.llamacpp_backend, pipeline.engine.llm, pipeline.config; "
        "assert 'llama_cpp' not in sys.modules, 'imported'"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


# --- seeds and sampling ------------------------------------------------------------------


def test_sample_seeds_are_32_bit_distinct_and_never_llamas_random_value():
    seeds = [lb.sample_seed(s, i) for s in (0, 1, -5, 2**62, 2**31 - 2) for i in range(4)]
    assert all(isinstance(s, int) and 0 <= s < 0xFFFFFFFF for s in seeds)
    assert len(set(seeds)) == len(seeds)
    assert lb.sample_seed(7, 1) == lb.sample_seed(7, 1)  # a function of (seed, index) only
    digest = hashlib.sha256(b"llamacpp-seed:7:1").hexdigest()
    assert lb.sample_seed(7, 1) == int(digest[:8], 16) % 0xFFFFFFFF  # as documented
    assert lb.sample_seed(None, 0) is None


def test_n_samples_seeds_finish_reasons_and_token_counts(
    fake_llama: type[FakeLlama], tmp_path: Path
):
    path = gguf(tmp_path)
    backend = lb.LlamaCppBackend(cfg_for(path))
    m = str(path)
    got = collect(backend, [req("one two three", m, n=3, seed=11, temperature=0.7, top_p=0.9,
                                max_tokens=50),
                            req("cut", m, max_tokens=2, seed=None)])  # fmt: skip
    calls = fake_llama.instances[0].calls
    first = [c for c in calls if c["messages"][-1]["content"] == "one two three"]
    assert [c["seed"] for c in first] == [lb.sample_seed(11, i) for i in range(3)]
    for c in first:
        assert (c["temperature"], c["top_p"], c["max_tokens"]) == (0.7, 0.9, 50)
        assert (c["top_k"], c["min_p"], c["repeat_penalty"]) == (0, 0.0, 1.0)  # OpenAI's
        assert c["grammar"] is None
    res = got[0]
    assert isinstance(res, ChatResult) and len(res.choices) == 3
    assert [c.text.split(" seed ")[1] for c in res.choices] == [
        str(lb.sample_seed(11, i)) for i in range(3)
    ]
    assert res.prompt_tokens == 5  # once per request, not once per sample
    numbers = [int(c.text.split()[1]) for c in res.choices]
    assert res.completion_tokens == sum(3 + k for k in numbers)  # summed over samples
    assert res.model == m
    assert got[1].choices[0].finish_reason == "length"
    assert got[1].choices[0].text.endswith("seed None")  # no seed: llama.cpp's own


def test_json_requests_get_a_grammar_built_once_per_schema(
    fake_llama: type[FakeLlama], tmp_path: Path
):
    path = gguf(tmp_path)
    backend = lb.LlamaCppBackend(cfg_for(path))
    schema = schemas.pairwise_schema(1024)
    got = collect(backend, [req(f"q{i}", str(path), json_schema=schema) for i in range(4)])
    assert all(isinstance(r, ChatResult) for r in got.values())
    llama_cpp = sys.modules["llama_cpp"]
    assert llama_cpp.LlamaGrammar.built == [json.dumps(schema)]  # converted once
    grammars = {id(c["grammar"]) for c in fake_llama.instances[0].calls}
    assert len(grammars) == 1 and None not in grammars
    assert len(llama_cpp.freed) == 1  # the parse check's sampler is freed


def test_a_schema_llama_cpp_cannot_take_fails_that_request_only(
    fake_llama: type[FakeLlama], tmp_path: Path
):
    path = gguf(tmp_path)
    backend = lb.LlamaCppBackend(cfg_for(path))
    m = str(path)
    unparsable = {"type": "object", "properties": {"x": {"type": "string", "maxLength": 9}}}
    llama_cpp = sys.modules["llama_cpp"]
    llama_cpp.null_grammar_for.add(f"root ::= grammar-for {json.dumps(unparsable)}")
    got = collect(backend, [req("a", m, json_schema={"$ref": "#/x"}),
                            req("b", m, json_schema=unparsable), req("c", m)])  # fmt: skip
    assert isinstance(got[0], RequestFailure) and not got[0].transient
    assert got[0].reason.startswith("schema: llama.cpp's JSON-schema converter refused")
    assert isinstance(got[1], RequestFailure)
    assert "grammar parser refused" in got[1].reason
    assert isinstance(got[2], ChatResult)
    # never sent unconstrained: only the plain request reached the engine
    assert [c["messages"][-1]["content"] for c in fake_llama.instances[0].calls] == ["c"]


def test_a_prompt_longer_than_the_context_fails_with_the_numbers(
    fake_llama: type[FakeLlama], tmp_path: Path
):
    path = gguf(tmp_path)
    backend = lb.LlamaCppBackend(cfg_for(path))
    got = collect(backend, [req("word " * 2000, str(path)), req("short", str(path))])
    assert isinstance(got[0], RequestFailure) and not got[0].transient
    assert got[0].reason.startswith("prompt_too_long: Requested tokens (2002) exceed context")
    assert "backend.llamacpp.context_length" in got[0].reason
    assert isinstance(got[1], ChatResult)


# --- engines, threads and streaming ------------------------------------------------------


def test_engine_shared_across_backends_and_stages(fake_llama: type[FakeLlama], tmp_path: Path):
    path = gguf(tmp_path)
    first = lb.LlamaCppBackend(cfg_for(path))
    asyncio.run(first.aclose())
    second = lb.LlamaCppBackend(cfg_for(path))
    assert second.llm is first.llm and len(fake_llama.instances) == 1
    lb.LlamaCppBackend(cfg_for(path, threads=2))  # other settings: another engine
    assert len(fake_llama.instances) == 2
    assert lb.shutdown_engines() == 2
    assert all(llm.closed for llm in fake_llama.instances)


def test_each_request_uses_the_engine_of_its_model(fake_llama: type[FakeLlama], tmp_path: Path):
    """judge.model may name another GGUF: its requests go to that model's engine."""
    main, judge = gguf(tmp_path, "main.gguf"), gguf(tmp_path, "judge.gguf")
    backend = lb.LlamaCppBackend(cfg_for(main))
    got = collect(backend, [req("a", str(judge)), req("b", str(main)),
                            req("c", str(tmp_path / "gone.gguf"))])  # fmt: skip
    by_path = {llm.kwargs["model_path"]: llm for llm in fake_llama.instances}
    assert [c["messages"][-1]["content"] for c in by_path[str(judge)].calls] == ["a"]
    assert [c["messages"][-1]["content"] for c in by_path[str(main)].calls] == ["b"]
    assert got[0].model == str(judge)
    assert isinstance(got[2], RequestFailure) and "does not exist" in got[2].reason


def test_calls_are_serialised_and_run_off_the_event_loop(
    fake_llama: type[FakeLlama], tmp_path: Path
):
    """Two backends on one engine never call it at once; the loop keeps ticking; each
    answer arrives as soon as it is done, not at the end of the chunk."""
    fake_llama.delay_s = 0.15
    path = gguf(tmp_path)
    a, b = lb.LlamaCppBackend(cfg_for(path)), lb.LlamaCppBackend(cfg_for(path))
    inside = 0
    most = 0
    guard = threading.Lock()
    original = fake_llama.create_chat_completion

    def counting(self: Any, **kw: Any) -> Any:
        nonlocal inside, most
        with guard:
            inside += 1
            most = max(most, inside)
        try:
            return original(self, **kw)
        finally:
            with guard:
                inside -= 1

    fake_llama.create_chat_completion = counting

    async def go() -> tuple[int, list[float], float]:
        ticks = 0
        stop = asyncio.Event()

        async def ticker() -> None:
            nonlocal ticks
            while not stop.is_set():
                ticks += 1
                await asyncio.sleep(0.01)

        start = time.perf_counter()
        arrivals: list[float] = []

        async def drain(backend: Any, tag: str) -> None:
            async for _ in backend.run([req(f"{tag}{i}", str(path)) for i in range(3)]):
                arrivals.append(time.perf_counter() - start)

        task = asyncio.create_task(ticker())
        await asyncio.gather(drain(a, "a"), drain(b, "b"))
        stop.set()
        await task
        return ticks, arrivals, time.perf_counter() - start

    ticks, arrivals, total = asyncio.run(go())
    assert most == 1  # the lock held: one call in the engine at a time
    assert len(arrivals) == 6 and ticks >= 20  # ~90 expected over 0.9 s; ~1 if blocked
    assert min(arrivals) < total / 2  # the first answers did not wait for the last


def test_runner_caches_and_a_rerun_sends_nothing(fake_llama: type[FakeLlama], tmp_path: Path):
    path = gguf(tmp_path)
    cfg = cfg_for(path)
    schema = schemas.pairwise_schema(1024)
    requests = [req(f"q{i}", str(path), seed=i, n=1 + i % 2) for i in range(5)]
    requests.append(req("json", str(path), json_schema=schema))

    def validate(r: ChatRequest, text: str) -> Any:
        if r.json_schema is None:
            return text
        raise ValueError("answer: not valid JSON")  # the fake never writes JSON

    async def run_once() -> Any:
        backend = make_backend(cfg, tmp_path / "cache.sqlite")
        with RequestCache(tmp_path / "cache.sqlite") as cache:
            runner = LLMRunner(backend, cache, "responses", progress=False, max_reasks=1)
            out = {i: o async for i, o in runner.stream(requests, validate)}
        return out, runner.stats

    out1, stats1 = asyncio.run(run_once())
    assert stats1.sent == 7 and stats1.failed == 1 and stats1.reasks == 1  # invalid: re-asked
    calls = len(fake_llama.instances[0].calls)
    out2, stats2 = asyncio.run(run_once())
    assert stats2.cached == 5 and stats2.sent == 2  # the invalid answer was never cached
    assert len(fake_llama.instances) == 1
    assert len(fake_llama.instances[0].calls) == calls + 2
    for i in range(5):
        assert out2[i].cached
        assert out2[i].result.choices == out1[i].result.choices


# --- the real engine ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def real_backend() -> Any:
    if not HAVE_LLAMA_CPP:
        pytest.skip("llama-cpp-python is not installed")
    lb.shutdown_engines()
    backend = lb.LlamaCppBackend(BackendSection(name="llamacpp", llamacpp={"context_length": 512}))
    yield backend
    lb.shutdown_engines()


@needs_model
def test_real_identity_names_the_engine_and_hashes_the_file(real_backend: Any):
    ident = real_backend.identity
    path = lb.resolve_model(LLAMACPP_DEFAULT_MODEL)
    assert ident["kind"] == "llamacpp" and ident["model_output"] is True
    assert ident["version"] == lb.VERIFIED_LLAMA_CPP_VERSION
    assert ident["model"] == LLAMACPP_DEFAULT_MODEL
    assert ident["file"] == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert ident["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert ident["schema_bounds"] is True  # llama.cpp is sent the full schemas
    # what the run records without loading the engine is the same identity
    assert lb.gguf_identity(real_backend.cfg) == ident


@needs_model
def test_real_answers_map_like_vllm(real_backend: Any):
    m = LLAMACPP_DEFAULT_MODEL
    schema = schemas.pairwise_schema(384)
    requests = [
        req("Which is better for a beginner, A: a ukulele, or B: a cello? Answer in JSON.", m,
            json_schema=schema, temperature=0.0, max_tokens=384),
        req("Name three fruits.", m, n=2, seed=3, temperature=0.8, max_tokens=24),
        req("word " * 600, m, max_tokens=8),  # longer than the 512-token context
        req("Count to one hundred.", m, max_tokens=6, temperature=0.0),
    ]  # fmt: skip
    got = collect(real_backend, requests)
    verdict = got[0]
    assert isinstance(verdict, ChatResult) and verdict.choices[0].finish_reason == "stop"
    assert schemas.parse(schema, verdict.choices[0].text)["winner"] in schemas.VERDICTS
    two = got[1]
    assert len(two.choices) == 2 and two.prompt_tokens > 5
    assert 0 < two.completion_tokens <= 48
    assert isinstance(got[2], RequestFailure) and got[2].reason.startswith("prompt_too_long")
    assert got[3].choices[0].finish_reason == "length" and got[3].completion_tokens == 6
    # the same request again: the same answers (seeded, per sample)
    again = collect(real_backend, [requests[1]])
    assert [c.text for c in again[0].choices] == [c.text for c in two.choices]


@pytest.mark.slow
@needs_model
def test_real_grammar_answers_to_every_stage_prompt_pass_schemas_parse(real_backend: Any):
    """Each stage's prompt and schema, answered by SmolLM2 under llama.cpp's grammar:
    every answer that completes parses and validates (the model's content may be junk)."""
    from pipeline.types.prompts import load_template

    lb.shutdown_engines()
    backend = lb.LlamaCppBackend(BackendSection(name="llamacpp"))
    m = LLAMACPP_DEFAULT_MODEL
    question = "How do I keep basil alive on a windowsill?"
    answer = "Water it when the soil is dry, give it six hours of sun, pinch off flowers."
    aspects = ["Mentions watering", "Mentions sunlight"]
    items = [{"key": k, "aspect": a}
             for k, a in zip(schemas.coverage_keys(2), aspects, strict=True)]  # fmt: skip
    profile = [{"text": "I grow herbs indoors in a small flat."}]
    cases = [
        ("judge_quality", {"question": question, "answer": answer},
         schemas.quality_schema(1024), 1024),
        ("judge_pairwise_blind", {"question": question, "answer_a": answer,
         "answer_b": "Buy a new plant."}, schemas.pairwise_schema(1024), 1024),
        ("judge_coverage", {"question": question, "answer": answer, "items": items},
         *schemas.coverage_schema(2, 1024)),
        ("rubric_generate", {"question": question, "narrative": None, "profile": profile,
         "min_items": 2, "max_items": 4}, schemas.rubric_schema(2, 4, 2048), 2048),
    ]  # fmt: skip
    requests = []
    for template, values, schema, max_tokens in cases:
        msgs = load_template(template).render(**values)
        # sent as the stages send it to llama.cpp: with the free text's bounds (its identity
        # says schema_bounds: schemas.for_engine)
        requests.append(ChatRequest(messages=msgs, model=m, temperature=0.0, max_tokens=max_tokens,
                                    seed=0, json_schema=schema))  # fmt: skip
    got = collect(backend, requests)
    for i, (template, *_rest) in enumerate(cases):
        res = got[i]
        assert isinstance(res, ChatResult), (template, res)
        choice = res.choices[0]
        print(f"{template}: {choice.finish_reason} {choice.text[:160]!r}")
        assert choice.finish_reason == "stop", template  # the bounded schema fits max_tokens
        schemas.read(cases[i][2], choice.text, clip=True)  # as the stages read it


# --- the GGUF header, checked before the run ----------------------------------------------


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (gguf_bytes(version=1), "its GGUF version is 1; llama.cpp reads versions 2 and 3"),
        (gguf_bytes(tensors=0), "counts 0 tensors and 1 metadata entries, which no model has"),
        (gguf_bytes(kvs=1 << 40), "metadata entries, which no model has"),
        (gguf_bytes(kvs=2), "a damaged header?"),  # the tensor read as metadata
        (gguf_bytes(cut=1), "its tensors need 144 bytes but the file has 143"),
        (gguf_bytes()[:30], "it ends inside its header"),
        (b"GGUF", "it ends inside its header"),
    ],
)  # fmt: skip
def test_a_gguf_that_llama_cpp_cannot_load_is_one_line_before_the_run(
    tmp_path: Path, data: bytes, why: str
) -> None:
    """The whole header is read (magic, version, counts, metadata, tensor descriptions,
    and the file long enough for its tensors): a damaged file is named by the preflight,
    not found at the responses stage."""
    path = tmp_path / "broken.gguf"
    path.write_bytes(data)
    with pytest.raises(BackendError) as err:
        lb.resolve_model(str(path))
    line = str(err.value)
    assert line.startswith(f"backend.model: {path} cannot be loaded by llama.cpp: ")
    assert why in line and "\n" not in line
    good = tmp_path / "good.gguf"
    good.write_bytes(gguf_bytes())
    assert lb.resolve_model(str(good)) == good


def test_a_damaged_gguf_stops_prb_run_before_any_stage(tmp_path: Path, capsys, monkeypatch):
    from pipeline.cli import main

    monkeypatch.setattr(lb.Backend, "check_installed", classmethod(lambda cls, cfg: None))
    model = tmp_path / "cut.gguf"
    model.write_bytes(gguf_bytes(cut=8))
    cfg = write_config(tmp_path, backend={"name": "llamacpp", "model": str(model)})
    assert main(["run", str(cfg), "--no-progress"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == (
        f"error: backend.model: {model} cannot be loaded by llama.cpp: its tensors need 144 "
        "bytes but the file has 136 (a cut or partial download?)"
    )
    assert not any("[ingest]" in line for line in err)  # before the first stage
    assert not (tmp_path / "outputs" / "t").exists()


def test_every_request_failing_in_process_does_not_blame_a_server(
    fake_llama: type[FakeLlama], tmp_path: Path
) -> None:
    """A context too small for every prompt: the stage stops, naming the in-process engine
    and the setting to raise, never 'the server looks down'."""
    fake_llama.context = 5
    backend = lb.LlamaCppBackend(cfg_for(gguf(tmp_path), context_length=64))
    requests = [req(f"a long enough question number {i}", backend.cfg.model) for i in range(4)]

    async def go() -> None:
        with RequestCache(tmp_path / "cache.sqlite") as cache:
            runner = LLMRunner(backend, cache, "responses", progress=False,
                               abort_after_failures=3)  # fmt: skip
            async for _ in runner.stream(requests):
                pass

    with pytest.raises(StageError) as err:
        asyncio.run(go())
    line = str(err.value)
    assert "3 requests in a row failed; the in-process llama.cpp engine fails them" in line
    assert "server" not in line
    assert "raise backend.llamacpp.context_length" in line
