"""benchmarks/local_model.py records a sample run's time with its re-asks named: the
figures it keeps are read from a real `prb run --json` summary (here of a stand-in run
with re-asks injected, since the local model's run takes half an hour and more)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from conftest import write_config

from pipeline.cli import main

ROOT = Path(__file__).resolve().parent.parent


def _bench():
    spec = importlib.util.spec_from_file_location(
        "local_model_bench", ROOT / "benchmarks" / "local_model.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_sample_run_records_its_re_asks(tmp_path, server, capsys):
    bench = _bench()
    # the README's own run name: the benchmark times the command the README shows
    assert "run.name=sample-local" in bench.SAMPLE_OVERRIDES
    cfg = write_config(tmp_path, server, responses={"strategies": ["avoid_all"]})
    server.inject("bad_json", 4, match=lambda b: "QualityVerdict" in json.dumps(b))
    assert main(["run", str(cfg), "--no-progress", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    got = bench.sample_requests(summary)
    assert got["reasks"] == 4
    judge = got["per_stage"]["judge"]
    assert judge["reasks"] == 4 and judge["sent"] == judge["requests"] + 4
    assert got["sent"] == sum(s["sent"] for s in got["per_stage"].values())
    assert set(got["per_stage"]) == {"responses", "judge"}
    assert all(s["seconds"] > 0 for s in got["per_stage"].values())
    assert bench.sample_requests("not json: the run failed") == {}
