"""One GPU visit with a 7B reasoning model (docs/vllm.md, "A 7B reasoning model on one
visit"): in one process, so the engine starts once, each step time-bounded and its figures
written the moment it finishes (a visit cut short returns what it measured):

1. facts: the card, vLLM and torch, the model's files;
2. sample: ``prb run configs/sample.yaml`` with ``backend.name=vllm`` on the model (rubrics
   given; the GGUF loaded directly, its tokenizer and config from the Hugging Face folder
   made here from the GGUF's metadata, scripts/gguf_hf_folder.py), the reasoning handled
   (``backend.vllm.reasoning``, JSON after the reasoning): wall time with the engine's start,
   each stage's requests, re-asks, failures and reasoning tokens, the funnel and its drops;
3. tokens: the distribution of tokens per verdict and per reasoning block, from the cache;
4. release: ``prb publish`` and ``prb audit`` of the run (the shortcut probe's verdict);
5. eval: ``prb eval`` of the release with the same model as judge, settings question,
   profile and rubric (rubric-blind and rubric-aware accuracy, profile gain, intervals);
6. judge rate: the judge stage's own requests sent again on the same engine, constrained as
   the stage sends them and unconstrained (no grammar, ``ignore_eos``, the same max_tokens),
   output tokens per second of each and their ratio (issue 40's >= 0.8);
7. grammar only (when time is left): the same judge requests on an engine that answers JSON
   under the grammar from its first token (``json_mode: grammar_only``): how many parse,
   their tokens, rate, and agreement with the reason-first verdicts.

usage (on the GPU machine, after ``source .gpu/kit/env.sh`` and the model's staging,
scripts/gpu_stage_model.sh):
    python scripts/gpu_visit.py [--model-dir /root/model] [--out $OUT/visit] [--budget 512]
        [--deadline-s 225] [--dummy]

``--dummy`` loads the Hugging Face folder alone with random weights (``load_format=dummy``):
the 7B's shape, vocabulary and tokenizer, noise for text, reasoning off (random weights never
close a block) and no grammar-only step; only the rates mean anything.
Figures: OUT/visit.json (and each run's folders beside it).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import platform
import sqlite3
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from pipeline.core.io import write_json_atomic  # noqa: E402

STEP_NEEDS = {  # seconds a step needs at least, to be started (measured: see docs/vllm.md)
    "sample": 60,
    "tokens": 1,
    "release": 10,
    "eval": 30,
    "judge_rate": 25,
    "grammar_only": 70,
}


class Visit:
    """The figures, written after every step."""

    def __init__(self, out: Path, deadline_s: float) -> None:
        self.out, self.start = out, time.monotonic()
        self.deadline = self.start + deadline_s
        self.figures: dict[str, Any] = {"steps": {}}
        out.mkdir(parents=True, exist_ok=True)

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def save(self) -> None:
        self.figures["elapsed_s"] = round(time.monotonic() - self.start, 1)
        write_json_atomic(self.out / "visit.json", self.figures)

    def step(self, name: str, fn: Any, *args: Any) -> Any:
        if self.left() < STEP_NEEDS.get(name, 0):
            self.figures["steps"][name] = {
                "skipped": f"{self.left():.0f} s left, needs {STEP_NEEDS[name]}"
            }
            self.save()
            print(f"== [{name}] skipped: not enough time left", flush=True)
            return None
        print(f"== [{name}] ({self.left():.0f} s left)", flush=True)
        t0 = time.monotonic()
        try:
            got = fn(*args)
            entry = {"seconds": round(time.monotonic() - t0, 1), **(got or {})}
        except BaseException as exc:  # a failing step must not lose the others' figures
            entry = {
                "seconds": round(time.monotonic() - t0, 1),
                "error": f"{type(exc).__name__}: {exc}"[:2000],
            }
            got = None
            if isinstance(exc, KeyboardInterrupt):
                raise
        self.figures["steps"][name] = entry
        self.save()
        print(f"== [{name}] {json.dumps(entry)[:600]}", flush=True)
        return got


def cli(*args: str) -> int:
    """``prb ARGS`` in this process (the vLLM engine is shared across the calls)."""
    from pipeline.cli import main

    try:
        return int(main(list(args)) or 0)
    except SystemExit as exc:
        return int(exc.code or 0) if not isinstance(exc.code, str) else 1


def model_files(model_dir: Path, dummy: bool) -> tuple[str, Path]:
    hf = model_dir / "hf"
    if not (hf / "config.json").is_file():
        raise SystemExit(f"gpu_visit: {hf}/config.json is missing (stage the model first)")
    if dummy:
        return str(hf), hf
    ggufs = sorted(model_dir.glob("*.gguf"))
    if not ggufs:
        raise SystemExit(f"gpu_visit: no .gguf in {model_dir} (stage it, or --dummy)")
    return str(ggufs[0]), hf


def backend_sets(
    model: str, hf: Path, a: argparse.Namespace, json_mode: str = "reason_first"
) -> list[str]:
    sets = {
        "backend.name": "vllm",
        "backend.model": model,
        "backend.vllm.max_model_len": str(a.max_model_len),
        "backend.vllm.dtype": a.dtype,
        "backend.vllm.reasoning.enabled": "true",
        "backend.vllm.reasoning.budget": str(a.budget),
        "backend.vllm.reasoning.json_mode": json_mode,
        "backend.vllm.reasoning.parser": "deepseek_r1",
    }
    if a.dummy:
        # random weights never close a reasoning block: the grammar from the first token,
        # so the run ends and the judge's rates are measured on the 7B's shape and vocabulary
        sets["backend.vllm.engine_args.load_format"] = "dummy"
        sets["backend.vllm.reasoning.enabled"] = "false"
    else:  # the GGUF loaded directly: its tokenizer and config from the folder made here
        sets["backend.vllm.engine_args.tokenizer"] = str(hf)
        sets["backend.vllm.engine_args.hf_config_path"] = str(hf)
    return [x for k, v in sets.items() for x in ("--set", f"{k}={v}")]


def facts(model: str, hf: Path, a: argparse.Namespace) -> dict[str, Any]:
    import importlib.metadata as md

    out: dict[str, Any] = {"python": platform.python_version(), "dummy_weights": a.dummy}
    for lib in ("vllm", "torch", "transformers", "xgrammar"):
        try:
            out[lib] = md.version(lib)
        except md.PackageNotFoundError:
            out[lib] = None
    try:
        import torch

        out["device"] = (
            torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no CUDA device"
        )
        if torch.cuda.is_available():
            out["device_memory_gib"] = round(
                torch.cuda.get_device_properties(0).total_memory / 2**30, 1
            )
    except Exception as exc:
        out["device"] = f"unknown ({type(exc).__name__}: {exc})"[:200]
    p = Path(model)
    out["model"] = {"path": model, "bytes": p.stat().st_size if p.is_file() else None}
    out["hf_folder"] = sorted(x.name for x in hf.iterdir())
    if p.is_file():
        from pipeline.backends.gguf import check_gguf

        check_gguf(p)  # raises on a cut file: the step says so
        out["model"]["whole"] = True
    return out


def llm_blocks(stats: dict[str, Any]) -> list[dict[str, Any]]:
    llm = stats.get("llm") or {}
    if "sent" in llm:
        return [llm]
    return [v for v in llm.values() if isinstance(v, dict) and "sent" in v]


def stage_figures(run: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    keys = (
        "requests",
        "sent",
        "cached",
        "failed",
        "reasks",
        "length_reasks",
        "reasoned_answers",
        "reasoning_tokens",
        "reasoning_cut",
        "prompt_tokens",
        "completion_tokens",
        "seconds",
    )
    for stage in ("rubrics", "responses", "judge", "pairs"):
        f = run / stage / "stats.json"
        if not f.is_file():
            out[stage] = {"finished": False}
            continue
        stats = json.loads(f.read_text())
        blocks = llm_blocks(stats)
        entry: dict[str, Any] = {"finished": (run / stage / "_DONE.json").is_file()}
        for k in keys:
            entry[k] = round(sum(float(b.get(k) or 0) for b in blocks), 2) if blocks else None
        reasons: dict[str, int] = {}
        for b in blocks:
            for k, v in (b.get("failure_reasons") or {}).items():
                reasons[k] = reasons.get(k, 0) + int(v)
        entry["failure_reasons"] = reasons
        if stage == "pairs":
            entry = {
                k: stats.get(k)
                for k in ("examples", "kept", "dropped", "dropped_by_reason", "kept_by_strategy")
            }
        out[stage] = entry
    return out


def sample(model: str, hf: Path, a: argparse.Namespace, out: Path) -> dict[str, Any]:
    t0 = time.monotonic()
    rc = cli(
        "run",
        "configs/sample.yaml",
        "--no-progress",
        "--set",
        f"run.output_dir={out}",
        "--set",
        "run.name=visit",
        *backend_sets(model, hf, a),
    )
    wall = time.monotonic() - t0
    return {
        "exit_status": rc,
        "wall_s_with_engine_start": round(wall, 1),
        "under_90_s": wall < 90,
        "stages": stage_figures(out / "visit"),
    }


def _percentiles(xs: list[int]) -> dict[str, Any]:
    if not xs:
        return {"n": 0}
    s = sorted(xs)

    def q(p: float) -> int:
        return s[min(len(s) - 1, int(p * len(s)))]

    return {
        "n": len(s),
        "min": s[0],
        "p10": q(0.1),
        "p50": q(0.5),
        "p90": q(0.9),
        "max": s[-1],
        "mean": round(statistics.fmean(s), 1),
    }


def answers(run: Path, stage: str | None = None) -> list[tuple[dict, dict]]:
    con = sqlite3.connect(run / "cache.sqlite")
    try:
        sql = "SELECT stage, request, response FROM responses"
        rows = con.execute(
            sql + (" WHERE stage = ?" if stage else ""), (stage,) if stage else ()
        ).fetchall()
    finally:
        con.close()
    return [(json.loads(q), json.loads(r)) for _, q, r in rows]


def tokens(run: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for stage in ("rubrics", "responses", "judge"):
        verdict: dict[str, list[int]] = {}
        reasoning: list[int] = []
        cut = 0
        for req, res in answers(run, stage):
            kind = req.get("schema_name") or "text"
            for c in res["choices"]:
                r = int(c.get("reasoning_tokens") or 0)
                reasoning.append(r)
                cut += bool(c.get("reasoning_cut"))
                share = int(res.get("completion_tokens") or 0) // max(len(res["choices"]), 1)
                verdict.setdefault(kind, []).append(max(share - r, 0))
        out[stage] = {
            "answer_tokens_by_kind": {k: _percentiles(v) for k, v in verdict.items()},
            "reasoning_tokens": _percentiles(reasoning),
            "reasoning_cut": cut,
        }
    return out


def release(run: Path) -> dict[str, Any]:
    rc_pub = cli("publish", str(run))
    rc_audit = cli("audit", str(run / "publish"))
    got: dict[str, Any] = {"publish_exit": rc_pub, "audit_exit": rc_audit}
    card = run / "publish" / "README.md"
    got["card_says_reasoning_model"] = (
        card.is_file() and "Answers from a reasoning model" in card.read_text()
    )
    for f in (run / "publish" / "report" / "audit.json", run / "report" / "audit.json"):
        if f.is_file():
            audit = json.loads(f.read_text())
            got["audit_verdict"] = audit.get("verdict")
            got["probe"] = {k: v for k, v in audit.items() if "probe" in k}
            break
    return got


def evaluate(model: str, hf: Path, a: argparse.Namespace, run: Path) -> dict[str, Any]:
    out = run / "eval"
    rc = cli(
        "eval",
        str(run / "publish"),
        "--scorer",
        "judge:",
        "--config",
        "configs/sample.yaml",
        "--setting",
        "question",
        "--setting",
        "profile",
        "--setting",
        "rubric",
        "--no-progress",
        "--out",
        str(out),
        *backend_sets(model, hf, a),
    )
    got: dict[str, Any] = {"exit_status": rc, "settings": {}}
    for f in sorted(out.rglob("results.json")):
        res = json.loads(f.read_text())
        for setting, block in (res.get("settings") or {}).items():
            m = block.get("metrics") or {}
            got["settings"][setting] = {
                k: m.get(k) for k in ("accuracy", "ci95", "ties", "failed", "pairs")
            }
            got["settings"][setting]["position_consistency"] = (m.get("position") or {}).get(
                "consistency"
            )
        if res.get("profile_gain"):
            got["profile_gain"] = res["profile_gain"]
    return got


def _backend(
    model: str, hf: Path, a: argparse.Namespace, json_mode: str, ignore_eos: bool = False
) -> Any:
    from pipeline.backends.vllm_backend import VLLMBackend
    from pipeline.config import load_config

    cfg = load_config(
        ROOT / "configs" / "sample.yaml",
        [s for s in backend_sets(model, hf, a, json_mode) if s != "--set"],
    )
    cls = VLLMBackend
    if ignore_eos:
        cls = type("IgnoreEos", (VLLMBackend,), {"extra_sampling": {"ignore_eos": True}})
    return cls(cfg.backend)


def judge_requests(run: Path, limit: int) -> list[Any]:
    from pipeline.backends.batchstore import request_from_dict

    reqs = []
    for req, _ in answers(run, "judge"):
        if any(m.get("role") == "assistant" for m in req["messages"]) or req.get(
            "reasoning_budget"
        ):
            continue  # first attempts only
        reqs.append(request_from_dict(req))
    return reqs[:limit]


def _chat(backend: Any, requests: list[Any]) -> tuple[float, int, list[Any]]:
    backend.llm.reset_prefix_cache() if hasattr(backend.llm, "reset_prefix_cache") else None
    t0 = time.perf_counter()
    outs = backend.llm.chat(
        messages=[r.message_dicts() for r in requests],
        sampling_params=[backend.sampling_params(r) for r in requests],
        use_tqdm=False,
    )
    seconds = time.perf_counter() - t0
    return seconds, sum(len(o.token_ids) for out in outs for o in out.outputs), outs


def judge_rate(model: str, hf: Path, a: argparse.Namespace, run: Path) -> dict[str, Any]:
    from dataclasses import replace

    requests = judge_requests(run, a.rate_requests)
    if not requests:
        return {"error": "no judge request in the run's cache"}
    constrained = _backend(model, hf, a, "reason_first")
    free = _backend(model, hf, a, "reason_first", ignore_eos=True)
    assert free.llm is constrained.llm  # one engine
    _chat(free, [replace(r, json_schema=None, max_tokens=8) for r in requests[:16]])  # warm-up
    got: dict[str, Any] = {"requests": len(requests)}
    for name, backend, reqs in (
        ("constrained", constrained, requests),
        ("unconstrained", free, [replace(r, json_schema=None) for r in requests]),
    ):
        seconds, toks, _ = _chat(backend, reqs)
        got[name] = {
            "seconds": round(seconds, 2),
            "output_tokens": toks,
            "tokens_per_s": round(toks / seconds, 1),
        }
    got["ratio"] = round(
        got["constrained"]["tokens_per_s"] / got["unconstrained"]["tokens_per_s"], 3
    )
    got["meets_0_8"] = got["ratio"] >= 0.8
    return got


def grammar_only(model: str, hf: Path, a: argparse.Namespace, run: Path) -> dict[str, Any]:
    from pipeline.backends.reasoning import split
    from pipeline.backends.vllm_backend import shutdown_engines
    from pipeline.types import schemas

    requests = judge_requests(run, a.rate_requests)
    if not requests:
        return {"error": "no judge request in the run's cache"}
    first = {req["messages"][-1]["content"]: res for req, res in answers(run, "judge")}
    shutdown_engines()  # the GPU holds one 7B engine at a time
    t0 = time.monotonic()
    backend = _backend(model, hf, a, "grammar_only")
    start = time.monotonic() - t0
    seconds, toks, outs = _chat(backend, requests)
    parsed = agree = compared = tagged = 0
    for req, out in zip(requests, outs, strict=True):
        text = out.outputs[0].text
        tagged += "<think>" in text
        try:
            value = json.loads(text)
            parsed += 1
        except ValueError:
            continue
        before = first.get(req.messages[-1][1])
        if before is not None:
            answer, _, _ = split(before["choices"][0]["text"])
            with contextlib.suppress(ValueError):
                old = json.loads(answer)
                compared += 1
                agree += all(
                    old.get(k) == value.get(k)
                    for k in ("winner", "correctness", "relevance", "helpfulness")
                    if k in old
                )
    _ = schemas  # the decisions are compared; a stage would also clip rationales
    return {
        "engine_start_s": round(start, 1),
        "requests": len(requests),
        "parsed": parsed,
        "with_a_think_tag": tagged,
        "output_tokens": toks,
        "tokens_per_s": round(toks / seconds, 1),
        "decisions_compared": compared,
        "decisions_agreeing": agree,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--model-dir", type=Path, default=Path(os.environ.get("MODEL_DIR", "/root/model"))
    )
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "outputs")) / "visit")
    ap.add_argument("--budget", type=int, default=512, help="reasoning tokens per answer")
    ap.add_argument("--max-model-len", type=int, default=8192)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--deadline-s", type=float, default=225.0, help="start no step after this")
    ap.add_argument("--rate-requests", type=int, default=192, help="judge requests sent again")
    ap.add_argument("--dummy", action="store_true", help="random weights from the folder")
    a = ap.parse_args(argv)
    os.chdir(ROOT)
    v = Visit(a.out.resolve(), a.deadline_s)
    v.figures.update(
        {
            "what": __doc__.splitlines()[0],
            "command": " ".join(sys.argv),
            "settings": {k: str(val) for k, val in vars(a).items()},
        }
    )
    model, hf = model_files(a.model_dir, a.dummy)
    run = v.out / "visit"
    try:
        v.figures["steps"]["facts"] = facts(model, hf, a)
    except Exception as exc:  # said in the figures; the steps after it will fail on their own
        v.figures["steps"]["facts"] = {"error": f"{type(exc).__name__}: {exc}"[:2000]}
    v.figures["device"] = v.figures["steps"]["facts"].get("device")
    v.save()
    v.step("sample", sample, model, hf, a, v.out)
    if (run / "cache.sqlite").is_file():
        v.step("tokens", tokens, run)
    if (run / "pairs" / "_DONE.json").is_file():
        v.step("release", release, run)
        if (run / "publish").is_dir():
            v.step("eval", evaluate, model, hf, a, run)
    if (run / "cache.sqlite").is_file():
        v.step("judge_rate", judge_rate, model, hf, a, run)
        if not a.dummy:  # random weights: nothing to compare the modes on
            v.step("grammar_only", grammar_only, model, hf, a, run)
    v.save()
    print(f"wrote {v.out / 'visit.json'}", flush=True)
    with contextlib.suppress(Exception), contextlib.redirect_stderr(io.StringIO()):
        from pipeline.backends.vllm_backend import shutdown_engines

        shutdown_engines()
    return 0


if __name__ == "__main__":
    sys.exit(main())
