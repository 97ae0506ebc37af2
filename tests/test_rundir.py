"""The run directory cannot be corrupted quietly: one writer at a time, finished stages
verified against their manifests, damage reported with the repair command, refusals that
change nothing, stray temporary files cleaned up, column contracts enforced."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from conftest import ROOT, write_config
from standin_server import StandinServer

from pipeline.cli import main
from pipeline.config import load_config
from pipeline.core.errors import StageError
from pipeline.orchestration.orchestrate import run_pipeline
from pipeline.run import RunDir, StageDir


def _run(cfg: Path, *overrides: str, **kw):
    return run_pipeline(load_config(cfg, list(overrides)), progress=False, **kw)


def _snapshot(run_dir: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(run_dir)): p.read_bytes()
        for p in sorted(run_dir.rglob("*"))
        if p.is_file() and not p.name.startswith(("cache.sqlite", ".lock"))
    }


def _rows(run_dir: Path, stage: str) -> list[dict]:
    return list(RunDir(run_dir).stage(stage).rows())


def test_two_concurrent_runs_one_waits_out_with_the_lock_message(tmp_path):
    # The first run's LLM requests wait at a gate until the second run has been refused:
    # the first is sure to hold the lock meanwhile however slow the machine is, and the
    # second returning while the gate is shut shows it did not wait for the lock.
    gate = threading.Event()

    async def held(body: dict, i: int) -> None:
        while not gate.is_set():
            await asyncio.sleep(0.02)
        return None  # then the stand-in's own answer

    with StandinServer(responder=held) as srv:
        cfg = write_config(tmp_path, srv, backend={"max_concurrency": 4})
        cmd = [sys.executable, "-m", "pipeline.cli", "run", str(cfg), "--no-progress"]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        first = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, env=env)
        try:
            deadline = time.monotonic() + 300
            while not srv.request_count:  # the first run holds the lock and waits at the gate
                assert time.monotonic() < deadline and first.poll() is None
                time.sleep(0.02)
            second = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
            assert first.poll() is None  # still held at the gate: the second did not wait
        finally:
            gate.set()
        assert first.wait(timeout=300) == 0, first.stderr.read()[-2000:]
    assert second.returncode == 1
    assert "is in use by pid" in second.stderr and str(first.pid) in second.stderr
    assert "Traceback" not in second.stderr
    run_dir = tmp_path / "outputs" / "t"
    cands = _rows(run_dir, "responses")
    assert max(Counter(c["candidate_id"] for c in cands).values()) == 1
    assert len({c["example_id"] for c in cands}) == 12
    assert len(_rows(run_dir, "judge")) == 12
    for stage in ("ingest", "rubrics", "responses", "judge", "pairs"):
        assert RunDir(run_dir).stage(stage).verify() == []


def test_a_lock_left_by_a_dead_process_is_taken_over(tmp_path, server):
    cfg = write_config(tmp_path, server)
    run_dir = tmp_path / "outputs" / "t"
    run_dir.mkdir(parents=True)
    # a holder that died: its record is there, its flock is gone with its process
    (run_dir / ".lock").write_text(json.dumps({"pid": 999999, "started": "yesterday"}))
    _run(cfg, until="rubrics")
    assert RunDir(run_dir).stage("rubrics").done


@pytest.fixture
def finished(tmp_path, server):
    cfg = write_config(tmp_path, server)
    _run(cfg, until="judge")
    return cfg, tmp_path / "outputs" / "t"


def test_a_truncated_shard_is_reported_with_the_repair_command(finished, server, capsys):
    cfg, run_dir = finished
    shard = run_dir / "responses" / "data-00000.jsonl"
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) // 2])  # cut mid-line
    assert main(["run", str(cfg), "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert str(shard) in err and "--redo responses" in err and "Traceback" not in err
    assert not (run_dir / "pairs").exists()  # refused before anything ran

    # the one command it names repairs it, from the cache: nothing is sent
    shard.write_bytes(data[: len(data) // 2])
    sent = server.request_count
    assert main(["run", str(cfg), "--no-progress", "--redo", "responses", "--until", "judge"]) == 0
    assert server.request_count == sent
    assert len({c["example_id"] for c in _rows(run_dir, "responses")}) == 12
    assert RunDir(run_dir).stage("responses").verify() == []


def test_missing_lines_and_missing_files_are_reported(finished, capsys):
    cfg, run_dir = finished
    shard = run_dir / "judge" / "data-00000.jsonl"
    lines = shard.read_text().splitlines(keepends=True)
    shard.write_text("".join(lines[:-1]))  # a whole line gone: still valid JSONL
    assert main(["run", str(cfg), "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert str(shard) in err and "--redo judge" in err
    shard.unlink()
    assert main(["run", str(cfg), "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert f"{shard}: missing" in err and "--redo judge" in err


def test_a_damaged_cache_is_one_line_with_the_repair_command(finished, capsys):
    cfg, run_dir = finished
    cache = run_dir / "cache.sqlite"
    # checkpoint the WAL into the main file, then overwrite pages in its middle
    import sqlite3

    db = sqlite3.connect(cache)
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.close()
    size = cache.stat().st_size
    with open(cache, "r+b") as fh:
        fh.seek(size // 3)
        fh.write(os.urandom(size // 3))
    for argv in (["status", str(run_dir)], ["run", str(cfg), "--no-progress", "--redo", "judge"]):
        assert main(argv) == 1
        err = capsys.readouterr().err
        assert f"prb cache repair {run_dir}" in err and "Traceback" not in err, err
        assert len(err.strip().splitlines()) == 1

    assert main(["cache", "repair", str(run_dir)]) == 0
    out = capsys.readouterr().out
    assert "damaged file is kept" in out
    assert list(run_dir.glob("cache.sqlite.damaged-*"))
    assert main(["status", str(run_dir)]) == 0


def test_a_refusal_changes_nothing(finished, capsys):
    cfg, run_dir = finished
    before = _snapshot(run_dir)
    with pytest.raises(StageError, match="run `prb run CONFIG --until rubrics` first"):
        _run(cfg, "rubrics.merge_threshold=80", only="pairs")
    assert _snapshot(run_dir) == before  # rubrics kept, run.yaml not rewritten


def test_refusing_or_invalid_config_leaves_no_run_directory(tmp_path, server, capsys):
    cfg = write_config(tmp_path, server)
    assert main(["run", str(cfg), "--only", "judge", "--no-progress"]) == 1
    assert not (tmp_path / "outputs" / "t").exists()
    assert main(["run", str(cfg), "--set", "responses.n=0"]) == 1
    assert not (tmp_path / "outputs").exists()


def test_stray_temporary_files_and_trash_are_cleaned_up(finished):
    cfg, run_dir = finished
    (run_dir / "judge" / ".data-00001.jsonl.x1y2.tmp").write_text('{"half": ')
    (run_dir / ".trash-judge-123").mkdir()
    (run_dir / ".trash-judge-123" / "data-00000.jsonl").write_text("{}\n")
    _run(cfg, until="judge")
    assert not list(run_dir.rglob("*.tmp")) and not (run_dir / ".trash-judge-123").exists()


def test_a_row_without_its_declared_fields_fails_at_the_first_shard(tmp_path):
    sd = StageDir(tmp_path / "judge")
    sd.path.mkdir()
    sd.contract = {"example_id", "quality", "coverage", "pairwise"}
    with pytest.raises(StageError, match=r"without the fields it declares \['coverage'\]"):
        sd.write_shard([{"example_id": "e", "quality": {}, "pairwise": []}])
    assert sd.shard_ids() == []  # nothing written


def test_a_stage_breaking_its_contract_stops_the_run(tmp_path, server, monkeypatch):
    from pipeline.stages.rubrics import RubricStage

    monkeypatch.setattr(RubricStage, "writes", RubricStage.writes | {"not_written"})
    with pytest.raises(StageError, match="not_written"):
        _run(write_config(tmp_path, server), until="rubrics")
    assert not RunDir(tmp_path / "outputs" / "t").stage("rubrics").done
