"""benchmarks/vllm_throughput.py and scripts/gpu_e2e.sh against a fake ``vllm`` package.

No GPU here: the fake package has vLLM 0.26.0's surface that the project touches
(``LLM(**kwargs)``, ``LLM.chat`` with one ``SamplingParams`` per conversation,
``reset_prefix_cache``, ``llm_engine.engine_core.shutdown``, ``StructuredOutputsParams``).
Its answers come from the stand-in server's rule-based player, so the end-to-end script
runs every stage and its funnel has kept pairs. Every call is logged to a JSONL file that
the tests read back.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent
ANY_TEXT = r"(.|\n)*"  # benchmarks/structured_output.py's, written out: the test reads it

FAKE_VLLM = '''
"""A fake vllm (tests/test_gpu_scripts.py): answers from the stand-in's rule-based player."""
import json
import os

from standin_server import generate_from_schema, text_answer, _rng_for
from standin_player import ModelPlayer

__version__ = "0.26.0"
_PLAYER = ModelPlayer(generate_from_schema)


def _log(**row):
    with open(os.environ["FAKE_VLLM_LOG"], "a") as fh:
        fh.write(json.dumps(row) + "\\n")


class SamplingParams:
    def __init__(self, n=1, temperature=1.0, top_p=1.0, max_tokens=16, seed=None,
                 structured_outputs=None, ignore_eos=False):
        self.n, self.temperature, self.top_p = n, temperature, top_p
        self.max_tokens, self.seed, self.ignore_eos = max_tokens, seed, ignore_eos
        self.structured_outputs = structured_outputs


class _Completion:
    def __init__(self, text, token_ids, finish_reason):
        self.text, self.token_ids, self.finish_reason = text, token_ids, finish_reason


class _Output:
    def __init__(self, prompt_token_ids, outputs):
        self.prompt_token_ids, self.outputs = prompt_token_ids, outputs


class _Core:
    def shutdown(self, timeout=None):
        _log(event="shutdown")
        print("fake engine core shut down", flush=True)


class _Engine:
    def __init__(self):
        self.engine_core = _Core()


END_ID = 151649  # DeepSeek-R1's </think>, one token
# FAKE_VLLM_REASONING=N: play a reasoning model, N words of <think> before every answer
_THINK = int(os.environ.get("FAKE_VLLM_REASONING") or 0)


class _Tokenizer:
    def encode(self, text, add_special_tokens=True):
        return [END_ID] if text == "</think>" else list(range(len(text.split())))


class LLM:
    def __init__(self, **kwargs):
        self.llm_engine = _Engine()
        # a grammar from the first token leaves no room for a <think> block; vLLM applies
        # it after the reasoning only with a reasoning parser
        conf = kwargs.get("structured_outputs_config") or {}
        self._reason_first = bool(conf.get("reasoning_parser"))
        _log(event="init", kwargs=kwargs)

    def get_tokenizer(self):
        return _Tokenizer()

    def reset_prefix_cache(self):
        _log(event="reset_prefix_cache")
        return True

    def chat(self, messages, sampling_params, use_tqdm=True):
        assert isinstance(sampling_params, list) and len(sampling_params) == len(messages)
        _log(event="chat", size=len(messages), ignore_eos=[p.ignore_eos for p in sampling_params],
             max_tokens=sorted({p.max_tokens for p in sampling_params}),
             seeds=[p.seed for p in sampling_params], use_tqdm=use_tqdm,
             bounded=[None if p.structured_outputs is None
                      or p.structured_outputs.json is None
                      else "maxLength" in json.dumps(p.structured_outputs.json)
                      for p in sampling_params],
             regex=[None if p.structured_outputs is None else p.structured_outputs.regex
                    for p in sampling_params])
        outs = []
        for conv, sp in zip(messages, sampling_params):
            body = {"model": "fake", "messages": conv, "seed": sp.seed,
                    "temperature": sp.temperature}
            schema = None if sp.structured_outputs is None else sp.structured_outputs.json
            if schema is not None:
                body["response_format"] = {"type": "json_schema",
                                           "json_schema": {"name": "", "schema": schema}}
            completions = []
            for k in range(sp.n):
                text = _PLAYER.answer(body, k)
                if text is None:
                    if schema is not None:
                        text = json.dumps(generate_from_schema(schema, _rng_for(body, k)))
                    else:
                        text = text_answer(_rng_for(body, k), conv)
                words = text.split()
                if _THINK and not sp.ignore_eos and (schema is None or self._reason_first):
                    think = ["Okay,", "let", "me", "think."] + ["hmm"] * max(0, _THINK - 4)
                    if len(think) >= sp.max_tokens:  # the limit comes inside the reasoning
                        text = "<think>\\n" + " ".join(think[: sp.max_tokens])
                        ids, finish = list(range(sp.max_tokens)), "length"
                    else:
                        room = sp.max_tokens - len(think) - 1
                        finish = "length" if len(words) > room else "stop"
                        answer = " ".join(words[:room])
                        text = "<think>\\n" + " ".join(think) + "\\n</think>\\n\\n" + answer
                        n_answer = min(len(words), room)
                        ids = list(range(len(think))) + [END_ID] + list(range(n_answer))
                    completions.append(_Completion(text, ids, finish))
                    continue
                n_tokens = sp.max_tokens if sp.ignore_eos else min(len(words), sp.max_tokens)
                finish = "length" if sp.ignore_eos or len(words) > sp.max_tokens else "stop"
                if len(words) > sp.max_tokens:
                    text = " ".join(words[: sp.max_tokens])
                completions.append(_Completion(text, list(range(n_tokens)), finish))
            prompt = sum(len(m["content"].split()) for m in conv)
            outs.append(_Output(list(range(prompt)), completions))
        return outs
'''
FAKE_SAMPLING_PARAMS = """
from vllm import SamplingParams


class StructuredOutputsParams:
    def __init__(self, json=None, regex=None, **kw):
        assert (json is None) != (regex is None), "one constraint a request"
        self.json, self.regex = json, regex
"""


@pytest.fixture
def fake_env(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """Environment with the fake vllm first on PYTHONPATH, and the call log it writes."""
    pkg = tmp_path / "fake" / "vllm"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(FAKE_VLLM)
    (pkg / "sampling_params.py").write_text(FAKE_SAMPLING_PARAMS)
    log = tmp_path / "vllm-calls.jsonl"
    path = os.pathsep.join([str(tmp_path / "fake"), str(TESTS), str(ROOT)])
    env = {**os.environ, "PYTHONPATH": path, "FAKE_VLLM_LOG": str(log), "PYTHON": sys.executable}
    return env, log


def read_log(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines()]


def model_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}')
    return folder


def test_throughput_benchmark_compares_backend_and_raw(fake_env, tmp_path: Path) -> None:
    env, log = fake_env
    out = tmp_path / "vllm_throughput.json"
    cmd = [
        sys.executable,
        str(ROOT / "benchmarks" / "vllm_throughput.py"),
        "--model", str(model_dir(tmp_path)),
        "--load-format", "dummy",
        "--requests", "40", "--n", "2", "--max-tokens", "8", "--users", "3",
        "--chunk-sizes", "7,64", "--repeats", "2",
        "--engine-arg", "enforce_eager=true",
        "--out", str(out),
    ]  # fmt: skip
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())

    assert result["device"].startswith("no CUDA device")  # no GPU here; a GPU names itself
    assert result["verified_vllm_version"] == "0.26.0" == result["versions"]["vllm"]
    assert result["engine"]["load_format"] == "dummy"
    assert result["engine"]["max_num_seqs"] == 512  # the config default
    assert result["engine"]["enforce_eager"] is True
    assert result["workload"]["requests"] == 40 and result["workload"]["ignore_eos"] is True
    figures = result["figures"]
    assert set(figures) == {"raw", "backend@7", "backend@64"}
    for name, f in figures.items():
        assert f["output_tokens"] == 40 * 2 * 8  # ignore_eos: max_tokens per sample
        assert len(f["seconds_all"]) == 2 and f["requests_per_s"] > 0 and f["failed"] == 0
        if name != "raw":
            assert f["ratio_vs_raw"] > 0 and f["same_output_tokens_as_raw"] is True
    assert "backend@7" in proc.stdout and f"wrote {out}" in proc.stdout

    calls = read_log(log)
    assert [c["event"] for c in calls].count("init") == 1  # one engine for every variant
    chats = [c for c in calls if c["event"] == "chat"]
    assert all(all(c["ignore_eos"]) and c["use_tqdm"] is False for c in chats)
    warmup, rest = chats[0], chats[1:]
    assert warmup["max_tokens"] == [16] and warmup["size"] == 40
    sizes = sorted(c["size"] for c in rest)
    # per repeat: raw in one call of 40, chunk 64 in one call, chunk 7 in 5 calls of 7 + 5
    assert sizes == sorted([40, 40] * 2 + [7] * 10 + [5] * 2)
    # raw and backend send the same requests: the same seeds
    seeds = {tuple(sorted(c["seeds"])) for c in rest if c["size"] == 40}
    assert len(seeds) == 1
    assert [c["event"] for c in calls].count("reset_prefix_cache") == 1 + 3 * 2
    assert calls[-1]["event"] == "shutdown"  # the engine is shut down at exit


def test_gpu_e2e_runs_the_sample_and_prints_the_funnel(fake_env, tmp_path: Path) -> None:
    env, log = fake_env
    out = tmp_path / "e2e"
    cmd = ["bash", str(ROOT / "scripts" / "gpu_e2e.sh"), str(model_dir(tmp_path)), str(out)]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stdout.splitlines()

    funnel = next(line for line in lines if line.startswith("funnel: "))
    kept = int(funnel.split("-> ")[1].split()[0])
    assert funnel.startswith("funnel: 12 examples") and kept >= 6
    stage_lines = {s: next(x for x in lines if x.strip().startswith(f"{s}:")) for s in
                   ("ingest", "rubrics", "responses", "judge", "pairs")}  # fmt: skip
    for s in ("responses", "judge"):
        assert "failed 0" in stage_lines[s] and "failure reasons {}" in stage_lines[s]
    assert "PARTIAL" not in proc.stdout
    assert "vllm_verified_with" in proc.stdout
    assert "fake engine core shut down" in proc.stdout

    run = out / "gpu_e2e"
    assert json.loads((run / "pairs" / "stats.json").read_text())["kept"] == kept
    resolved = (run / "run.yaml").read_text()
    assert "name: vllm" in resolved and str(tmp_path / "model") in resolved
    init = next(c for c in read_log(log) if c["event"] == "init")
    assert init["kwargs"]["model"] == str(tmp_path / "model")
    assert init["kwargs"]["max_num_seqs"] == 512


@pytest.mark.parametrize(
    ("args", "message"),
    [([], "usage: bash scripts/gpu_e2e.sh MODEL_DIR"), (["/no/such/model"], "does not exist")],
)
def test_gpu_e2e_usage_errors(fake_env, args: list[str], message: str) -> None:
    env, _ = fake_env
    cmd = ["bash", str(ROOT / "scripts" / "gpu_e2e.sh"), *args]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    assert proc.returncode == 2
    assert message in proc.stderr and "Traceback" not in proc.stderr


def test_judge_benchmark_compares_constrained_and_unconstrained(fake_env, tmp_path: Path) -> None:
    env, log = fake_env
    out = tmp_path / "vllm_judge.json"
    cmd = [
        sys.executable,
        str(ROOT / "benchmarks" / "vllm_throughput.py"),
        "--stage", "judge",
        "--model", str(model_dir(tmp_path)),
        "--load-format", "dummy",
        "--requests", "30", "--users", "3", "--chunk-sizes", "7", "--repeats", "2",
        "--bounded-requests", "4",
        "--out", str(out),
    ]  # fmt: skip
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["engine"]["structured_outputs_config"] == {"backend": "xgrammar"}
    assert result["workload"]["requests"] == 30 and result["workload"]["max_tokens"] == 384
    # quality, coverage (3 points) and pairwise: three distinct schemas, one per kind
    assert result["workload"]["distinct_schemas"] == 3
    figures = result["figures"]
    assert set(figures) == {"unconstrained_raw", "any_text_raw", "constrained_raw", "backend@7"}
    assert figures["unconstrained_raw"]["output_tokens"] == 30 * 384  # ignore_eos
    assert figures["any_text_raw"]["output_tokens"] == 30 * 384
    split = result["split"]
    assert split["structured_output_path"] == round(
        figures["any_text_raw"]["output_tokens_per_s"]
        / figures["unconstrained_raw"]["output_tokens_per_s"],
        3,
    )
    assert split["judge_schemas_over_any_text"] == round(
        figures["constrained_raw"]["output_tokens_per_s"]
        / figures["any_text_raw"]["output_tokens_per_s"],
        3,
    )
    for name in ("constrained_raw", "backend@7"):
        f = figures[name]
        assert f["failed"] == 0 and f["tokens_per_s_vs_unconstrained"] > 0
        # the player's verdicts end before max_tokens: fewer tokens than unconstrained
        assert 0 < f["output_tokens"] < 30 * 384
    assert result["bounded_before"]["requests"] == 4
    assert "backend@7" in proc.stdout and "bounded (before)" in proc.stdout

    chats = [c for c in read_log(log) if c["event"] == "chat"]
    # unconstrained calls ignore EOS and carry no schema; constrained ones never ignore EOS
    # and carry the sent form (no maxLength), but for the bounded requests measured last
    free = [c for c in chats if all(c["ignore_eos"])]
    assert free and all(b is None for c in free for b in c["bounded"])
    # the any-text variant: free requests with the benchmark's one regex, and nothing else
    any_text = [c for c in free if any(c["regex"])]
    assert len(any_text) == 3  # warm-up, then once a repeat
    assert {x for c in any_text for x in c["regex"]} == {ANY_TEXT}
    assert all(x is None for c in chats if c not in any_text for x in c["regex"])
    sent = [c for c in chats if c["size"] == 30 and not any(c["ignore_eos"])]
    assert len(sent) == 2 and all(b is False for c in sent for b in c["bounded"])
    assert chats[-2]["size"] == 4 and all(chats[-2]["bounded"])  # bounded, then the same 4 sent
    assert chats[-1]["size"] == 4 and not any(chats[-1]["bounded"])


def test_gpu_check_runs_every_step_and_prints_the_rates(fake_env, tmp_path: Path) -> None:
    env, log = fake_env
    dummy = tmp_path / "m7b"
    dummy.mkdir()
    (dummy / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}')
    env = {**env, "MODEL": str(model_dir(tmp_path)), "DUMMY_MODEL": str(dummy),
           "REF_EXAMPLES": "40", "T_REF": "300"}  # fmt: skip
    out = tmp_path / "check"
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), str(out)],
                          env=env, capture_output=True, text=True)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = (out / "summary.txt").read_text()
    for step in ("sample_given", "judge_benchmark", "sample_generated", "reference_size"):
        assert f"{step}: exit 0 after" in summary
    # the reference-size step's stages, with their rates read back from its cache
    assert "responses (done): 80 answers" in summary  # 40 examples, chosen + avoid_all
    assert "judge (done):" in summary and "tokens/s" in summary
    # where the time went, under each step: the stages' closing lines, the judge table, split
    assert summary.count("  [responses] done:") == 3  # given, generated, the reference's size
    assert "  any_text_raw " in summary and "  split: vLLM's structured-output path" in summary
    assert json.loads((out / "vllm_judge.json").read_text())["figures"]["backend@4096"]
    assert "source: generated" in (out / "generated" / "gpu_e2e" / "run.yaml").read_text()
    inits = [c for c in read_log(log) if c["event"] == "init"]
    # every engine is built with the pinned structured-output engine
    assert inits and all(
        c["kwargs"]["structured_outputs_config"] == {"backend": "xgrammar"} for c in inits
    )


def tiny_gguf(path: Path) -> Path:
    """A GGUF with one metadata field and one tensor of four floats (the project's header
    check passes it): what the staging and the visit carry in place of a 4.5 GB model here."""
    import struct

    def text(b: bytes) -> bytes:
        return struct.pack("<Q", len(b)) + b

    body = b"GGUF" + struct.pack("<IQQ", 3, 1, 1)
    body += text(b"general.architecture") + struct.pack("<I", 8) + text(b"qwen2")
    body += text(b"output_norm.weight") + struct.pack("<IQIQ", 1, 4, 0, 0)  # F32 [4] at 0
    body += b"\0" * (-len(body) % 32)
    path.write_bytes(body + struct.pack("<4f", 1, 1, 1, 1))
    return path


def test_model_staging_splits_keeps_and_joins_with_checksums(tmp_path: Path) -> None:
    """scripts/gpu_stage_model.sh: split here, one piece kept a call, joined and checked
    there; a piece damaged on the way is refused by name."""
    src = tmp_path / "src"
    (src / "hf").mkdir(parents=True)
    gguf = src / "model.gguf"
    gguf.write_bytes(os.urandom(3_000_000))
    (src / "hf" / "config.json").write_text('{"architectures": ["Qwen2ForCausalLM"]}')
    out, stage, model = tmp_path / "pieces", tmp_path / "stage", tmp_path / "model"
    env = {**os.environ, "PIECE_MIB": "1", "STAGE": str(stage), "MODEL_DIR": str(model)}
    script = str(ROOT / "scripts" / "gpu_stage_model.sh")

    def sh(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", script, *args], env=env, capture_output=True, text=True)

    made = sh("split", str(gguf), str(src / "hf"), str(out))
    assert made.returncode == 0, made.stderr
    pieces = sorted(p.name for p in out.glob("m[0-9][0-9][0-9]"))
    assert pieces == ["m000", "m001", "m002"]
    calls = sh("calls", str(out)).stdout.splitlines()
    assert len(calls) == 4 and calls[0].startswith("run: bash scripts/gpu_stage_model.sh keep 0")
    assert sh("join", str(out)).returncode == 3  # nothing kept yet: refused, names the pieces
    for i in range(3):
        assert sh("keep", str(i), str(out)).returncode == 0
    # a piece damaged on the way is refused by name and not kept
    good = (out / "m001").read_bytes()
    (out / "m001").write_bytes(b"x" + good[1:])
    bad = sh("keep", "1", str(out))
    assert bad.returncode == 3 and "m001 arrived damaged" in bad.stderr
    (out / "m001").write_bytes(good)
    joined = sh("join", str(out))
    assert joined.returncode == 0, joined.stderr
    assert (model / "model.gguf").read_bytes() == gguf.read_bytes()
    assert (model / "hf" / "config.json").is_file()
    assert not list(stage.glob("m[0-9]*"))  # the pieces are gone once joined


def test_gpu_visit_runs_every_step_and_writes_figures_as_it_goes(fake_env, tmp_path: Path) -> None:
    """scripts/gpu_visit.sh against the fake vllm playing a reasoning model: the sample with
    the reasoning handled, the token distributions, publish and audit, eval with the same
    model as judge, the judge's constrained rate against the unconstrained one, and the
    grammar-only engine; every step's figures in visit.json."""
    env, log = fake_env
    model = tmp_path / "model"
    (model / "hf").mkdir(parents=True)
    (model / "hf" / "config.json").write_text('{"architectures": ["Qwen2ForCausalLM"]}')
    tiny_gguf(model / "r1.gguf")
    out = tmp_path / "visit"
    env = {**env, "FAKE_VLLM_REASONING": "12", "LIMIT_S": "900", "KIT": str(tmp_path / "no-kit")}
    cmd = ["bash", str(ROOT / "scripts" / "gpu_visit.sh"), str(out), "--",
           "--model-dir", str(model), "--budget", "64", "--rate-requests", "24"]  # fmt: skip
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    figures = json.loads((out / "visit.json").read_text())
    steps = figures["steps"]
    errors = {k: v["error"] for k, v in steps.items() if "error" in v}
    assert not errors, errors
    assert set(steps) == {
        "facts",
        "sample",
        "tokens",
        "release",
        "eval",
        "judge_rate",
        "grammar_only",
    }
    assert figures["device"] and steps["facts"]["model"]["whole"] is True
    sample = steps["sample"]
    assert sample["exit_status"] == 0 and sample["wall_s_with_engine_start"] > 0
    judge = sample["stages"]["judge"]
    assert judge["failed"] == 0 and judge["reasoned_answers"] > 0 and judge["reasoning_tokens"] > 0
    assert sample["stages"]["pairs"]["kept"] > 0
    assert steps["tokens"]["judge"]["reasoning_tokens"]["p50"] == 13  # 12 words + </think>
    assert steps["release"]["card_says_reasoning_model"] is True
    assert set(steps["eval"]["settings"]) == {"question", "profile", "rubric"}
    rate = steps["judge_rate"]
    assert rate["requests"] == 24 and rate["constrained"]["output_tokens"] > 0 and rate["ratio"] > 0
    assert steps["grammar_only"]["parsed"] == 24 and steps["grammar_only"]["with_a_think_tag"] == 0
    inits = [c for c in read_log(log) if c["event"] == "init"]
    # the GGUF loaded directly, its tokenizer and config from the folder; the grammar after
    # the reasoning, then an engine that answers under the grammar from the first token
    first = inits[0]["kwargs"]
    assert first["model"] == str(model / "r1.gguf") and first["tokenizer"] == str(model / "hf")
    assert first["hf_config_path"] == str(model / "hf")
    assert first["structured_outputs_config"]["reasoning_parser"] == "deepseek_r1"
    assert "reasoning_parser" not in inits[-1]["kwargs"]["structured_outputs_config"]
    # stored without its reasoning: no answer of the run holds the fake's <think> words
    texts = [json.dumps(r) for s in ("responses", "judge") for r in _rows(out / "visit" / s)]
    assert texts and not any("Okay, let me think." in t for t in texts)


def _rows(folder: Path) -> list[dict]:
    return [
        json.loads(x)
        for f in sorted(folder.glob("data-*.jsonl"))
        for x in f.read_text().splitlines()
    ]


def test_gpu_visit_out_of_time_skips_steps_but_keeps_the_facts(fake_env, tmp_path: Path) -> None:
    env, _ = fake_env
    model = tmp_path / "model"
    (model / "hf").mkdir(parents=True)
    (model / "hf" / "config.json").write_text("{}")
    tiny_gguf(model / "r1.gguf")
    out = tmp_path / "visit"
    cmd = [sys.executable, str(ROOT / "scripts" / "gpu_visit.py"), "--model-dir", str(model),
           "--out", str(out), "--deadline-s", "0"]  # fmt: skip
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    steps = json.loads((out / "visit.json").read_text())["steps"]
    assert steps["facts"]["model"]["whole"] is True
    assert steps["sample"]["skipped"].endswith("needs 60")


def test_gpu_visit_dummy_loads_the_folder_with_random_weights(fake_env, tmp_path: Path) -> None:
    """--dummy: no GGUF, the folder made from its metadata loaded with random weights; the
    rates are measured, the modes are not compared."""
    env, log = fake_env
    model = tmp_path / "model"
    (model / "hf").mkdir(parents=True)
    (model / "hf" / "config.json").write_text('{"architectures": ["Qwen2ForCausalLM"]}')
    out = tmp_path / "visit"
    cmd = [sys.executable, str(ROOT / "scripts" / "gpu_visit.py"), "--model-dir", str(model),
           "--out", str(out), "--dummy", "--rate-requests", "8"]  # fmt: skip
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    steps = json.loads((out / "visit.json").read_text())["steps"]
    assert "grammar_only" not in steps and steps["judge_rate"]["requests"] == 8
    assert steps["facts"]["dummy_weights"] is True
    init = next(c for c in read_log(log) if c["event"] == "init")["kwargs"]
    assert init["model"] == str(model / "hf") and init["load_format"] == "dummy"
