"""`prb run`, `prb publish` and `prb audit` end to end on a real model: SmolLM2-135M under
llama.cpp (the default of ``backend.name: llamacpp``, shipped by the `local` extra), on
three examples of the hand-written sample (``examples/sample_lamp.jsonl``), one answer per
side, one rejected strategy, the rubrics given. The same config against the stand-in
server is the fast comparison. Assertions are on the outputs, not on exit codes.

A 135M model is weak: expect junk verdicts and many drops. What must hold is that the
pipeline handles it: every stage finishes, failures are counted, the funnel adds up,
every drop has a reason, no invalid answer is cached, and a re-run sends nothing. The
funnel is printed (pytest -s, CI logs).
"""

from __future__ import annotations

import importlib.util
import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import SAMPLE

from pipeline.kinds.settings import LLAMACPP_DEFAULT_MODEL
from pipeline.types import schemas

ROOT = Path(__file__).resolve().parents[1]
STAGES = ("ingest", "rubrics", "responses", "judge", "pairs")
LLM_STAGES = ("responses", "judge")

try:
    HAVE_LLAMA_CPP = importlib.util.find_spec("llama_cpp") is not None
except (ImportError, ValueError):
    HAVE_LLAMA_CPP = False


def trimmed_config(tmp_path: Path, backend: dict[str, Any]) -> Path:
    cfg = {
        "run": {"name": "local", "output_dir": str(tmp_path / "outputs"), "seed": 0},
        "input": {"format": "lamp", "path": str(SAMPLE), "limit": 3},
        "backend": backend,
        "rubrics": {"source": "given"},
        "responses": {"n": 1, "strategies": ["avoid_all"]},
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def prb(*argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [sys.executable, "-m", "pipeline.cli", *argv], cwd=cwd, capture_output=True, text=True
    )
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


def rows(folder: Path, prefix: str) -> list[dict[str, Any]]:
    return [json.loads(line) for f in sorted(folder.glob(f"{prefix}-*.jsonl"))
            for line in f.read_text(encoding="utf-8").splitlines() if line]  # fmt: skip


def check_run_status(proc: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    """A finished `prb run --json`: exit 0 with pairs kept; with none kept (a tiny model's
    answers can all drop) exit 5, the summary not ok and its error the one line on stderr."""
    summary = json.loads(proc.stdout)
    if summary.get("pairs_kept") == 0:
        assert proc.returncode == 5 and summary["ok"] is False, proc.stderr
        assert summary["error"].startswith("no pair kept:"), summary["error"]
        assert proc.stderr.strip().splitlines()[-1] == summary["error"]
    else:
        assert proc.returncode == 0 and summary["ok"], proc.stderr
    return summary


def check_run(run_dir: Path) -> dict[str, Any]:
    """The output invariants of a finished run; returns the funnel and request counts."""
    for stage in STAGES:
        assert (run_dir / stage / "_DONE.json").is_file(), f"{stage} not done"
    requests = {}
    for stage in LLM_STAGES:
        llm = json.loads((run_dir / stage / "stats.json").read_text())["llm"]
        for key in ("requests", "sent", "failed", "cached"):
            assert isinstance(llm[key], int) and llm[key] >= 0, (stage, key, llm)
        assert llm["sent"] + llm["cached"] + llm["failed"] >= llm["requests"] > 0, (stage, llm)
        assert sum(llm["failure_reasons"].values()) == llm["failed"], (stage, llm)
        requests[stage] = llm
    pairs = run_dir / "pairs"
    stats = json.loads((pairs / "stats.json").read_text())
    kept, rejects = rows(pairs, "data"), rows(pairs, "rejects")
    assert stats["kept"] + stats["dropped"] == stats["examples"], stats
    assert (len(kept), len(rejects)) == (stats["kept"], stats["dropped"]), stats
    for r in rejects:  # every drop says why
        assert r.get("reason"), r
    assert sum(stats["dropped_by_reason"].values()) == stats["dropped"], stats
    # no invalid answer was ever cached as an answer
    with sqlite3.connect(run_dir / "cache.sqlite") as db:
        cached = db.execute("SELECT request, response FROM responses").fetchall()
    checked = 0
    for request, response in cached:
        schema = json.loads(request).get("json_schema")
        if schema is None:
            continue
        for choice in json.loads(response)["choices"]:
            schemas.parse(schema, choice["text"])
            checked += 1
    assert checked > 0
    return {"stats": stats, "requests": requests, "json_answers_checked": checked}


def check_rerun_sends_nothing(config: Path, run_dir: Path, first: dict[str, Any]) -> None:
    """A re-run of every LLM stage answers from the cache; only requests that failed
    the first time (pending, retried by design) may be sent again."""
    proc = prb("run", str(config), "--redo", "responses", "--no-progress", "--json", cwd=ROOT)
    check_run_status(proc)
    for stage in LLM_STAGES:
        llm = json.loads((run_dir / stage / "stats.json").read_text())["llm"]
        assert llm["sent"] <= first["requests"][stage]["failed"], (stage, llm)
        if first["requests"][stage]["failed"] == 0:
            assert llm["sent"] == 0 and llm["cached"] == llm["requests"], (stage, llm)


def publish_and_audit(run_dir: Path, kept: int) -> str:
    """`prb publish` then `prb audit`; with no pair kept, publish refuses in one line and
    the audit has no rows: both are checked to say so."""
    pub = prb("publish", str(run_dir), cwd=ROOT)
    aud = prb("audit", str(run_dir), cwd=ROOT)
    if kept == 0:
        # publishing nothing is refused, on one line, and nothing is written
        assert pub.returncode == 1
        assert pub.stderr.strip().count("\n") == 0
        assert "no pair passes policy 'filtered' (0 kept by the filters" in pub.stderr
        assert not (run_dir / "publish").exists()
        assert aud.returncode == 1 and "no rows to audit" in aud.stderr
        return "nothing kept: publish refused (one line), audit had no rows"
    release = run_dir / "publish"
    assert pub.returncode == 0, pub.stderr
    card = json.loads((release / "release.json").read_text())
    assert card["rows"] == kept and card["configs"]["all"] == kept
    import pyarrow.parquet as pq

    assert sum(pq.read_table(p).num_rows for p in (release / "all").glob("*.parquet")) == kept
    assert (release / "README.md").is_file()
    assert aud.returncode == 0, aud.stderr
    report = json.loads((run_dir / "report" / "audit.json").read_text())
    assert report["n_pairs"] == kept
    return f"published {kept} pairs, audit written"


def show(label: str, result: dict[str, Any], note: str) -> None:
    s = result["stats"]
    reasons = {k: v for k, v in s["dropped_by_reason"].items() if v}
    req = {k: {x: v[x] for x in ("requests", "sent", "failed", "reasks")}
           for k, v in result["requests"].items()}  # fmt: skip
    failures = {k: v["failure_reasons"] for k, v in result["requests"].items()}
    print(
        f"\n[{label}] funnel: examples {s['examples']} -> kept {s['kept']}, dropped "
        f"{s['dropped']} {reasons}; requests {req}; failure reasons {failures}; {note}"
    )


def test_the_trimmed_config_against_the_standin_server(tmp_path: Path):
    """The comparison: the same config, answered by the stand-in server's rule player."""
    from standin_server import StandinServer

    with StandinServer() as server:
        config = trimmed_config(tmp_path, {"name": "openai", "model": "standin-model",
                                           "openai": {"base_url": server.base_url}})  # fmt: skip
        proc = prb("run", str(config), "--no-progress", "--json", cwd=ROOT)
        check_run_status(proc)
        run_dir = tmp_path / "outputs" / "local"
        result = check_run(run_dir)
        check_rerun_sends_nothing(config, run_dir, result)
    note = publish_and_audit(run_dir, result["stats"]["kept"])
    show("stand-in", result, note)


@pytest.mark.slow
@pytest.mark.llamacpp
@pytest.mark.timeout(1800)
@pytest.mark.skipif(
    not HAVE_LLAMA_CPP and not os.environ.get("CI"),
    reason="llama-cpp-python is not installed (pip install 'personalized-rewardbench[local]'); "
    "CI runs this",
)
def test_prb_run_publish_audit_on_the_local_model(tmp_path: Path):
    config = trimmed_config(tmp_path, {"name": "llamacpp"})  # no model: the packaged GGUF
    proc = prb("run", str(config), "--no-progress", "--json", cwd=ROOT)
    check_run_status(proc)
    run_dir = tmp_path / "outputs" / "local"
    assert yaml.safe_load((run_dir / "run.yaml").read_text())["backend"]["model"] == (
        LLAMACPP_DEFAULT_MODEL
    )
    result = check_run(run_dir)
    note = publish_and_audit(run_dir, result["stats"]["kept"])
    check_rerun_sends_nothing(config, run_dir, result)
    show("llamacpp SmolLM2-135M", result, note)


@pytest.mark.slow
@pytest.mark.llamacpp
@pytest.mark.timeout(1200)
@pytest.mark.skipif(
    not HAVE_LLAMA_CPP and not os.environ.get("CI"),
    reason="llama-cpp-python is not installed (pip install 'personalized-rewardbench[local]'); "
    "CI runs this",
)
def test_quickstart_local_answers_the_four_examples_on_the_local_model(tmp_path: Path):
    """`prb quickstart --local`: the quickstart's examples, answered by the packaged model
    instead of replayed; what it keeps goes on to annotation, release and audit, and a
    tiny model that keeps nothing ends with where to look instead."""
    proc = prb("quickstart", "--local", "--out", str(tmp_path / "out"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    run_dir = tmp_path / "out" / "quickstart-local"
    assert f"run directory: {run_dir}" in proc.stdout
    result = check_run(run_dir)
    env = json.loads((run_dir / "environment.json").read_text())
    assert env["served_by"]["kind"] == "llamacpp" and env["served_by"]["model_output"]
    if result["stats"]["kept"]:
        assert (run_dir / "publish" / "all").is_dir() and (run_dir / "report").is_dir()
    else:
        assert "kept no pair" in proc.stderr and "inspect" in proc.stdout
        assert not (run_dir / "publish").exists()
    show("quickstart --local", result, f"kept {result['stats']['kept']}")
