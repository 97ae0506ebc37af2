"""Every command that reads a run gives the guarantees `prb run` gives: a finished stage is
verified against its manifest and its metadata is parsed into typed objects before it is
read. Damage (a shard cut mid-line or at a line boundary, a metadata file of the wrong
shape) is one line naming the file and the command that repairs it; nothing is published,
exported, reported or evaluated from a damaged or partial stage."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import write_config
from standin_server import StandinServer

from pipeline.cli import main
from pipeline.config import load_config
from pipeline.orchestration.orchestrate import run_pipeline
from pipeline.run import RunDir


@pytest.fixture(scope="module")
def base_run(tmp_path_factory) -> tuple[Path, Path]:
    tmp = tmp_path_factory.mktemp("readers")
    with StandinServer() as s:
        cfg = write_config(tmp, s)
        run_pipeline(load_config(cfg), progress=False, echo=lambda m: None)
    return cfg, tmp / "outputs" / "t"


@pytest.fixture
def run(base_run, tmp_path) -> tuple[Path, Path]:
    cfg, src = base_run
    dst = tmp_path / "outputs" / "t"
    shutil.copytree(src, dst)
    data = load_config(cfg).model_dump(mode="json")
    data["run"]["output_dir"] = str(tmp_path / "outputs")
    own = tmp_path / "config.yaml"
    own.write_text(json.dumps(data))
    return own, dst


def _shard(run: Path) -> Path:
    return RunDir(run).stage("pairs").data_path(0)


def cut_mid_line(run: Path) -> Path:
    shard = _shard(run)
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) - 40])
    return shard


def cut_last_line(run: Path) -> Path:
    shard = _shard(run)
    lines = shard.read_bytes().splitlines(keepends=True)
    shard.write_bytes(b"".join(lines[:-1]))  # still valid JSON lines: one pair fewer
    return shard


def _write(path: Path, value: object) -> Path:
    path.write_text(json.dumps(value))
    return path


DAMAGE: dict[str, Callable[[Path], Path]] = {
    "shard cut mid-line": cut_mid_line,
    "shard lost its last line": cut_last_line,
    "stage.json is []": lambda run: _write(run / "pairs" / "stage.json", []),
    'stage.json is "x"': lambda run: _write(run / "pairs" / "stage.json", "x"),
    "_DONE.json is []": lambda run: _write(run / "pairs" / "_DONE.json", []),
    "a manifest entry is a string": lambda run: _write(
        run / "pairs" / "_DONE.json",
        {**json.loads((run / "pairs" / "_DONE.json").read_text()), "files": {"x": "y"}},
    ),
    "stats.json is []": lambda run: _write(run / "pairs" / "stats.json", []),
}


def _model_folder(tmp: Path) -> Path:
    # only what `prb eval` checks before reading the split: reading must fail first
    folder = tmp / "rm"
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text("{}")
    return folder


READERS: dict[str, Callable[[Path, Path], tuple[list[str], str | None]]] = {
    # argv, and the folder the command would have written (must not exist afterwards)
    "publish": lambda run, tmp: (["publish", str(run)], "publish"),
    "annotate export": lambda run, tmp: (
        ["annotate", "export", str(run), "--round", "1", "--file-only"],
        "annotate",
    ),
    "audit": lambda run, tmp: (["audit", str(run)], "report"),
    "eval": lambda run, tmp: (["eval", str(run), "--scorer", f"rm:{_model_folder(tmp)}"], "eval"),
    "inspect": lambda run, tmp: (["inspect", str(run)], None),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
@pytest.mark.parametrize("reader", list(READERS))
def test_every_reader_refuses_a_damaged_stage_in_one_line(run, tmp_path, capsys, reader, damage):
    _, run_dir = run
    named = DAMAGE[damage](run_dir)
    argv, writes = READERS[reader](run_dir, tmp_path)
    assert main(argv) == 1
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert len(err) == 1, captured.err
    assert str(named) in err[0] and "--redo pairs" in err[0], err[0]
    assert "Traceback" not in captured.err + captured.out
    if writes:
        assert not (run_dir / writes).exists(), f"{reader} wrote {writes}/ from a damaged stage"


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_status_names_the_damage_and_exits_non_zero(run, capsys, damage):
    _, run_dir = run
    named = DAMAGE[damage](run_dir)
    assert main(["status", str(run_dir)]) == 1
    out = capsys.readouterr()
    line = next(x for x in out.out.splitlines() if x.strip().startswith("pairs"))
    assert "DAMAGED" in line and str(named) in line and "--redo pairs" in line, line
    assert "Traceback" not in out.err + out.out


@pytest.mark.parametrize("damage", [d for d in DAMAGE if "shard" not in d])
def test_run_refuses_metadata_of_the_wrong_shape_in_one_line(run, capsys, damage):
    cfg, run_dir = run
    named = DAMAGE[damage](run_dir)
    before = sorted((p.name, p.stat().st_size) for p in (run_dir / "pairs").iterdir())
    assert main(["run", str(cfg), "--no-progress"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(named) in err[0] and "--redo pairs" in err[0], err
    assert sorted((p.name, p.stat().st_size) for p in (run_dir / "pairs").iterdir()) == before
    # the command the line names repairs it, from the cache
    assert main(["run", str(cfg), "--no-progress", "--redo", "pairs"]) == 0
    assert RunDir(run_dir).stage("pairs").verify() == []


def test_publish_never_publishes_a_partial_stage(run, capsys):
    _, run_dir = run
    (run_dir / "pairs" / "_DONE.json").unlink()
    assert main(["publish", str(run_dir)]) == 1
    err = capsys.readouterr().err
    assert "stage 'pairs' has not finished" in err and "--until pairs" in err
    assert not (run_dir / "publish").exists()


def test_a_record_of_the_wrong_shape_is_named_by_field(run, capsys):
    """A shard that matches its manifest but holds a record a command cannot read (written
    by hand, or by an older version): the shard, the line and the field."""
    _, run_dir = run
    shard = _shard(run_dir)
    lines = shard.read_text().splitlines()
    rec = json.loads(lines[0])
    rec["profile_view"] = {"order": "first"}
    lines[0] = json.dumps(rec)
    shard.write_text("\n".join(lines) + "\n")
    stage = RunDir(run_dir).stage("pairs")
    stage.finish(stage.stats())
    assert main(["publish", str(run_dir)]) == 1
    err = capsys.readouterr().err
    assert f"{shard}, line 1: 'profile_view.order' must be a list of indices" in err
    assert "--redo pairs" in err and not (run_dir / "publish").exists()
