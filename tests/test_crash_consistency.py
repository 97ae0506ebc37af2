"""Kill a run at every point where durable state changes, resume it, and compare with an
uninterrupted run: same rows (ids and texts), no duplicates, every stage verified.

The failpoints (pipeline/core/io.py ``crash_point``) sit before and after every atomic write and
every cache commit. A child process (tests/crash_child.py, forked by a spawned fork server)
runs the pipeline with ``PRB_CRASH_AT=k`` and dies with ``os._exit`` at its k-th point (no
finally block runs, as with SIGKILL); the test then resumes the run and checks it. Every
point of every stage is hit once by the test marked exhaustive; CI kills at the first point
of each kind (every stage's shards, metadata and marker, each stage's cache commits),
which fits its time limit on a busy 2-core machine.
"""

from __future__ import annotations

import json
import multiprocessing
import re
from collections import Counter
from pathlib import Path

import crash_child
import pytest
from conftest import write_config

from pipeline.config import load_config
from pipeline.kinds.stages import ORDER
from pipeline.orchestration.orchestrate import run_pipeline
from pipeline.run import RunDir

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
# Children are never forked from this process, which runs threads (the stand-in server,
# pytest-timeout's): a fork copies whatever lock one of them holds, and the child hung on
# it (seen twice on a busy machine). The fork server is a fresh interpreter started with
# spawn; it runs no thread, imports the pipeline once, and forks each child from that
# clean state, so a child starts in milliseconds instead of re-importing for each of the
# ~180 failpoints (a plain spawn per child took 5 min 48 s here, against 77 s).
_SPAWN = multiprocessing.get_context("forkserver")
_SPAWN.set_forkserver_preload(
    ["crash_child", "pipeline.orchestration.orchestrate", "pipeline.config"]
)

ID_KEYS = {"ingest": "example_id", "rubrics": "example_id", "responses": "candidate_id",
           "judge": "example_id", "pairs": "example_id"}  # fmt: skip


def _child(cfg: Path, env: dict[str, str]) -> int:
    """Run the pipeline in a child forked by the fork server, with failpoint settings; its
    exit status."""
    proc = _SPAWN.Process(target=crash_child.run, args=(str(cfg), env))
    proc.start()
    proc.join(timeout=240)
    if proc.exitcode is None:  # never expected: say so instead of hanging the suite
        proc.kill()
        proc.join()
        raise AssertionError(f"the child for {cfg.name} did not finish in 240 s")
    return proc.exitcode


def _contents(run_dir: Path) -> dict[str, list[str]]:
    out = {}
    rd = RunDir(run_dir)
    for name in ORDER:
        sd = rd.stage(name)
        assert sd.done, f"{name} not done after resume"
        assert sd.verify() == []
        rows = list(sd.rows())
        ids = Counter(r[ID_KEYS[name]] for r in rows)
        assert not ids or max(ids.values()) == 1, f"duplicate rows in {name}"
        rows += list(sd.rejects())
        out[name] = sorted(json.dumps(r, sort_keys=True) for r in rows)
    return out


def kinds(points: list[str]) -> list[str]:
    """Each failpoint's kind: its label without the numbers (shard, point count), and for a
    cache commit the stage it belongs to, e.g. "before judge/data-N.jsonl" or "after cache
    commit (responses)"."""
    out = []
    stage = ""
    for p in points:
        label = re.sub(r"\d+", "N", p.split("\t", 1)[1])
        if "/" in label:
            stage = label.split(" ", 1)[1].split("/", 1)[0]
        elif "commit" in label:
            label += f" ({stage})"
        out.append(label)
    return out


def sample(points: list[str]) -> list[int]:
    """The points (numbered from 1) to kill at in CI: the first point of each kind, so
    every kind of write (each stage's shards, metadata and marker, each stage's cache
    commits, before and after) is killed once, in a third of the time all points take."""
    first: dict[str, int] = {}
    for k, kind in enumerate(kinds(points), 1):
        first.setdefault(kind, k)
    return sorted(first.values())


def _kill_and_resume(tmp_path: Path, server, every: bool) -> None:
    cfg_args = dict(
        input={"limit": 3, "chunk_size": 1},  # every stage a shard per example
        backend={"max_concurrency": 1},  # answers arrive one at a time: the same points each run
        rubrics={"chunk_size": 1},
        responses={"n": 1, "strategies": ["avoid_all", "violate_one"], "chunk_size": 1},
        judge={"max_pairs_per_example": 1, "chunk_size": 1},
        pairs={"chunk_size": 1},
    )
    cfg = write_config(tmp_path, server, **cfg_args)
    base = load_config(cfg)

    def config_for(name: str) -> Path:
        data = base.model_dump(mode="json")
        data["run"]["name"] = name
        data["input"]["path"] = str(base.resolve_input(base.input.path))
        path = tmp_path / f"{name}.yaml"
        path.write_text(json.dumps(data))  # JSON is YAML
        return path

    reference = config_for("reference")
    log = tmp_path / "points.log"
    assert _child(reference, {"PRB_CRASH_LOG": str(log)}) == 0
    points = log.read_text().splitlines()
    labels = Counter(p.split("\t")[1].split(" ", 1)[0] for p in points)
    assert labels["before"] > 40 and labels["after"] > 40  # writes and commits, all stages
    assert any("cache commit" in p for p in points)
    want = _contents(tmp_path / "outputs" / "reference")

    chosen = list(range(1, len(points) + 1)) if every else sample(points)
    # every kind of point is among those killed at, in CI as in the full run
    every_kind = kinds(points)
    assert {every_kind[k - 1] for k in chosen} == set(every_kind)
    crashed = 0
    for k in chosen:
        cfg_k = config_for(f"k{k}")
        code = _child(cfg_k, {"PRB_CRASH_AT": str(k)})
        crashed += code == 86
        run_pipeline(load_config(cfg_k), progress=False, echo=lambda s: None)
        got = _contents(tmp_path / "outputs" / f"k{k}")
        assert got == want, f"resume after a kill at point {k} ({points[k - 1]}) differs"
    assert crashed == len(chosen)  # every chosen point was hit and killed the run once


def test_a_kill_at_each_kind_of_write_point_resumes_to_the_same_output(tmp_path, server):
    """CI's version: the first point of every kind (see :func:`sample`)."""
    _kill_and_resume(tmp_path, server, every=False)


@pytest.mark.exhaustive
@pytest.mark.timeout(3600)
def test_a_kill_at_every_write_point_resumes_to_the_same_output(tmp_path, server):
    """Every one of the ~180 points: minutes on a quiet machine, past any per-test limit
    on a busy one, so CI leaves it out (-m "not exhaustive"); run it after a change to
    how the run directory is written: pytest -m exhaustive."""
    _kill_and_resume(tmp_path, server, every=True)
