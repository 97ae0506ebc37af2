"""The reasoning handling on real engine output (pipeline/backends/reasoning.py).

- On the packaged SmolLM2-135M (marked llamacpp; CI runs these): not a reasoning model, so
  its JSON answers under the reason-first grammar open a reasoning block that the grammar
  then holds open until the model closes it, which a 135M model mostly never does: the path
  of a reasoning that uses its whole budget, on llama.cpp's own engine and grammar.
- On DeepSeek-R1-Distill-Qwen-7B (marked r1_7b and llamacpp): a response and a verdict of
  each kind through the pipeline, every answer stored without its reasoning and the
  reasoning's tokens counted. Skipped unless ``PRB_R1_GGUF`` names the whole GGUF (4.5 GB:
  docs/local.md, "A reasoning model"); CI deselects it (it cannot fetch 4.5 GB in its time).
- The Hugging Face folder made from a GGUF's metadata (scripts/gguf_hf_folder.py), checked
  token for token against llama.cpp's reading of the same GGUF, on SmolLM2's.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from pipeline.engine.llm import Answer, Failure, Job, LLMRunner
from pipeline.kinds.backend import BackendSection
from pipeline.kinds.settings import LLAMACPP_DEFAULT_MODEL
from pipeline.run.cache import RequestCache
from pipeline.types import schemas
from pipeline.types.chat import ChatRequest

ROOT = Path(__file__).resolve().parents[1]
HAVE_LLAMA = importlib.util.find_spec("llama_cpp") is not None
needs_llama = pytest.mark.skipif(
    not HAVE_LLAMA and not os.environ.get("CI"), reason="no llama-cpp-python"
)
SCHEMA = {
    "type": "object",
    "properties": {"winner": {"enum": ["A", "B"]}},
    "required": ["winner"],
    "additionalProperties": False,
}


def _validate(req: ChatRequest, text: str) -> Any:
    """The stages' own reading of a JSON answer: parsed whole and checked against its schema."""
    return schemas.parse(req.json_schema or SCHEMA, text)


def _run(cfg: BackendSection, tmp_path: Path, jobs: list[Job]) -> tuple[dict, Any]:
    from pipeline.backends.llamacpp_backend import LlamaCppBackend

    async def go() -> tuple[dict, Any]:
        backend = LlamaCppBackend(cfg)
        cache = RequestCache(tmp_path / "cache.sqlite")
        runner = LLMRunner(backend, cache, "judge", progress=False)
        try:
            got = {tag: out async for tag, out in runner.run(jobs)}
        finally:
            cache.close()
        return got, runner.stats

    return asyncio.run(go())


def _ask(text: str, schema: dict | None, max_tokens: int) -> ChatRequest:
    return ChatRequest(
        messages=(("user", text),), model=LLAMACPP_DEFAULT_MODEL, max_tokens=max_tokens,
        json_schema=schema,
    )  # fmt: skip


@pytest.mark.llamacpp
@needs_llama
def test_reason_first_grammar_on_llama_cpp_never_reads_a_reasoning_as_an_answer(
    tmp_path: Path,
) -> None:
    cfg = BackendSection(
        name="llamacpp",
        llamacpp={"context_length": 1024, "reasoning": {"enabled": True, "budget": 8}},
    )
    questions = ["Answer A or B: which letter comes first?", "Pick A or B for a sunny day."]
    jobs = [Job(_ask(q, SCHEMA, 12), i, _validate) for i, q in enumerate(questions)]
    jobs.append(Job(_ask("Say hello in five words.", None, 12), "text"))
    got, stats = _run(cfg, tmp_path, jobs)
    for i in range(len(questions)):
        out = got[i]
        if isinstance(out, Answer):  # the model closed its reasoning: JSON after it
            (choice,) = out.result.choices
            assert out.parsed[0]["winner"] in ("A", "B")
            assert "<think>" not in choice.text and "</think>" not in choice.text
            assert choice.reasoning is not None and not choice.reasoning_cut
        else:  # it did not: asked once more with twice the budget, then given up
            assert isinstance(out, Failure) and out.final
            assert out.reason.startswith("reasoning_exhausted: the reasoning used its budget of 16")
    # the reasoning's tokens are counted: a reasoning that used every token is all of them
    assert stats.reasoning_tokens > 0 and stats.reasoned_answers >= len(questions)
    assert stats.reasoning_cut == 2 * sum(
        isinstance(got[i], Failure) for i in range(len(questions))
    )
    # free text from a model that wrote no block is its answer, unchanged
    text = got["text"]
    assert isinstance(text, Answer) and text.result.choices[0].reasoning is None
    assert text.result.choices[0].text.strip()


@pytest.mark.llamacpp
@needs_llama
def test_grammar_only_answers_json_from_the_first_token(tmp_path: Path) -> None:
    cfg = BackendSection(
        name="llamacpp",
        llamacpp={"context_length": 1024, "reasoning": {"enabled": True, "budget": 8,
                                                        "json_mode": "grammar_only"}},
    )  # fmt: skip
    got, stats = _run(cfg, tmp_path, [Job(_ask("A or B?", SCHEMA, 12), "j", _validate)])
    answer = got["j"]
    assert isinstance(answer, Answer) and answer.parsed[0]["winner"] in ("A", "B")
    assert answer.result.choices[0].reasoning is None  # no block: the grammar began with "{"
    assert answer.result.completion_tokens <= 12  # no reasoning budget added
    assert stats.reasoning_tokens == 0


@pytest.mark.llamacpp
@needs_llama
def test_gguf_hf_folder_and_its_check_against_llama_cpp(tmp_path: Path) -> None:
    """On SmolLM2's GGUF: the folder loads in transformers with its chat template and the
    vocabulary's size, and the check's verdict is the token-by-token comparison itself
    (for SmolLM2 transformers' converter splits some whitespace runs unlike llama.cpp's
    smollm pre-tokenizer, so the check must find them; DeepSeek-R1's matched on every
    text: benchmarks/results/gguf_hf_folder.json)."""
    import llama_cpp
    from transformers import AutoTokenizer

    sys.path.insert(0, str(ROOT / "scripts"))
    from gguf_hf_folder import HARD_CASES, check, make_folder

    from pipeline.backends.llamacpp_backend import resolve_model

    gguf = resolve_model(LLAMACPP_DEFAULT_MODEL)
    made = make_folder(gguf, tmp_path / "hf")
    assert made["architectures"] == ["LlamaForCausalLM"] and made["chat_template"]
    assert made["tokenizer_size"] == made["vocab"]  # no token added past the vocabulary
    result = check(tmp_path / "hf", gguf)
    assert result["chat_template_same_text"] and result["chat_template_same_ids"]
    tok = AutoTokenizer.from_pretrained(str(tmp_path / "hf"))
    llm = llama_cpp.Llama(model_path=str(tmp_path / "hf" / "header.gguf"), vocab_only=True,
                          verbose=False)  # fmt: skip
    differ = [t[:80] for t in HARD_CASES if tok.encode(t, add_special_tokens=False)
              != llm.tokenize(t.encode("utf-8"), add_bos=False, special=True)]  # fmt: skip
    found = [d["text"] for d in result["differences"]]
    assert set(differ) <= set(found) and result["ok"] is (result["differing_texts"] == 0)


R1 = os.environ.get("PRB_R1_GGUF", "")


@pytest.mark.r1_7b
@pytest.mark.llamacpp
@pytest.mark.skipif(not R1 or not Path(R1).is_file(), reason="PRB_R1_GGUF names no GGUF file")
def test_r1_7b_answers_stored_without_their_reasoning(tmp_path: Path) -> None:
    """About 10 requests on 2 cores at 1-3 tokens/s: tens of minutes (nice it)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import reasoning_model

    out = tmp_path / "r1.json"
    rc = reasoning_model.main(
        ["--model", R1, "--label", "r1", "--out", str(out), "--budget", "256"]
    )
    run = json.loads(out.read_text())["runs"]["r1"]
    assert rc == 0, run.get("reason")
    s = run["summary"]
    assert s["answers"] >= 8 and s["with_reasoning"] > 0 and s["reasoning_tokens"] > 0
    assert s["texts_with_tags"] == 0 and s["rows_with_a_tag"] == 0


@pytest.mark.llamacpp
@needs_llama
def test_gguf_quantize_writes_a_gguf_llama_cpp_loads(tmp_path: Path) -> None:
    """scripts/gguf_quantize.py (fewer pieces to carry to a GPU): SmolLM2's Q4_1 to Q8_0,
    then that to Q3_K_M, each a whole GGUF that llama.cpp loads and answers with."""
    import subprocess

    import llama_cpp

    from pipeline.backends.gguf import check_gguf
    from pipeline.backends.llamacpp_backend import resolve_model

    src = resolve_model(LLAMACPP_DEFAULT_MODEL)
    script = str(ROOT / "scripts" / "gguf_quantize.py")
    q8, q3 = tmp_path / "q8.gguf", tmp_path / "q3.gguf"
    for a, b, kind in ((src, q8, "Q8_0"), (q8, q3, "Q3_K_M")):
        proc = subprocess.run([sys.executable, script, str(a), str(b), kind, "--threads", "1"],
                              capture_output=True, text=True)  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert json.loads(proc.stdout.splitlines()[-1])["type"] == kind
        check_gguf(b)
    assert q3.stat().st_size < q8.stat().st_size
    llm = llama_cpp.Llama(model_path=str(q3), n_ctx=256, verbose=False)
    out = llm.create_completion("The capital of France is", max_tokens=4, temperature=0)
    assert out["choices"][0]["text"].strip()
    bad = subprocess.run([sys.executable, script, str(src), str(tmp_path / "x.gguf"), "Q9_Z"],
                         capture_output=True, text=True)  # fmt: skip
    assert bad.returncode == 2 and "unknown type Q9_Z; known:" in bad.stderr
