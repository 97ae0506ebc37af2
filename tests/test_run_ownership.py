"""`prb run` writes only into a folder it made (or an empty one, or an earlier run), and
replacing a stage removes exactly the files the stage wrote: a user's file in the run
directory or in a stage folder survives a re-done stage, byte for byte. Every case compares
the disk before and after (sizes and sha256), not only the exit status."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import disk_state, write_config

import pipeline.run.stage as stage_module
from pipeline.cli import main
from pipeline.config import load_config
from pipeline.orchestration.orchestrate import run_pipeline
from pipeline.run import RunDir

SMALL = dict(
    input={"limit": 3},
    responses={"n": 1, "strategies": ["avoid_all", "violate_one"], "chunk_size": 1},
)


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0], err
    return err[0]


def _rows(run: Path, stage: str) -> list[str]:
    sd = RunDir(run).stage(stage)
    return sorted(json.dumps(r, sort_keys=True) for r in [*sd.rows(), *sd.rejects()])


def test_run_refuses_a_users_folder_and_writes_nothing(tmp_path, server, capsys):
    research = tmp_path / "outputs" / "research"
    (research / "responses").mkdir(parents=True)
    (research / "responses" / "survey.csv").write_text("id,answer\n1,yes\n2,no\n")
    cfg = write_config(tmp_path, server, run={"name": "research"}, **SMALL)
    before = disk_state(tmp_path / "outputs")

    assert main(["run", str(cfg), "--no-progress"]) == 1
    line = _one_error_line(capsys)
    assert str(research.resolve()) in line and "not a run directory" in line, line
    assert "'responses'" in line  # names what is there
    assert disk_state(tmp_path / "outputs") == before  # no run.yaml, no .lock, nothing

    # the library entry point refuses the same way (quickstart and tests call it)
    with pytest.raises(Exception, match="not a run directory"):
        run_pipeline(load_config(cfg), progress=False, echo=lambda m: None)
    assert disk_state(tmp_path / "outputs") == before


def test_a_file_where_the_run_directory_goes_is_refused(tmp_path, server, capsys):
    (tmp_path / "outputs").mkdir()
    (tmp_path / "outputs" / "t").write_text("mine")
    cfg = write_config(tmp_path, server, **SMALL)
    before = disk_state(tmp_path / "outputs")
    assert main(["run", str(cfg), "--no-progress"]) == 1
    assert "not a folder" in _one_error_line(capsys)
    assert disk_state(tmp_path / "outputs") == before


def test_an_empty_folder_becomes_a_marked_run(tmp_path, server):
    (tmp_path / "outputs" / "t").mkdir(parents=True)
    cfg = write_config(tmp_path, server, **SMALL)
    assert main(["run", str(cfg), "--until", "ingest", "--no-progress"]) == 0
    run = tmp_path / "outputs" / "t"
    assert (run / ".prb-run").is_file()
    assert RunDir(run).stage("ingest").done
    # a marked run is taken again, even once its stages are gone
    for p in ("run.yaml", "cache.sqlite", "environment.json"):
        (run / p).unlink(missing_ok=True)
    assert main(["run", str(cfg), "--until", "ingest", "--no-progress"]) == 0


@pytest.mark.parametrize("how", ["--redo", "changed setting"])
def test_a_redone_stage_keeps_a_users_file_in_its_folder(tmp_path, server, capsys, how):
    cfg = write_config(tmp_path, server, **SMALL)
    assert main(["run", str(cfg), "--until", "responses", "--no-progress"]) == 0
    run = tmp_path / "outputs" / "t"
    want = _rows(run, "responses")
    survey = run / "responses" / "survey.csv"
    survey.write_text("id,answer\n1,yes\n")
    notes = run / "notes"
    notes.mkdir()
    (notes / "plan.md").write_text("# mine\n")
    mine = {k: v for k, v in disk_state(tmp_path).items() if "survey" in k or "notes" in k}
    capsys.readouterr()

    if how == "--redo":
        argv = ["run", str(cfg), "--until", "responses", "--redo", "responses"]
    else:
        argv = ["run", str(cfg), "--until", "responses", "--set", "responses.word_cap=150"]
    assert main([*argv, "--no-progress"]) == 0
    err = capsys.readouterr().err
    assert "left 1 file(s) prb did not write" in err and "survey.csv" in err, err
    after = disk_state(tmp_path)
    assert {k: after[k] for k in mine} == mine  # the user's files, byte for byte
    sd = RunDir(run).stage("responses")
    assert sd.done and sd.verify() == []
    if how == "--redo":
        assert _rows(run, "responses") == want  # the same rows, from the cache


def test_a_shard_named_stranger_refuses_the_redo_and_removes_nothing(tmp_path, server, capsys):
    cfg = write_config(tmp_path, server, **SMALL)
    assert main(["run", str(cfg), "--until", "ingest", "--no-progress"]) == 0
    stranger = tmp_path / "outputs" / "t" / "ingest" / "data-00099.jsonl"
    stranger.write_text('{"example_id": "mine"}\n')
    before = disk_state(tmp_path / "outputs" / "t" / "ingest")
    capsys.readouterr()
    assert main(["run", str(cfg), "--until", "ingest", "--redo", "ingest", "--no-progress"]) == 1
    line = _one_error_line(capsys)
    assert str(stranger) in line and "not written by this stage" in line, line
    assert disk_state(tmp_path / "outputs" / "t" / "ingest") == before


class _Killed(Exception):
    pass


@pytest.mark.parametrize("at", [1, 2, 3, 5])
def test_a_clear_killed_half_way_is_redone_by_the_next_run(tmp_path, server, monkeypatch, at):
    """A kill at any point of a clear: the next run (no --redo) re-does the stage instead
    of resuming from what the clear left, and ends with the same rows."""
    cfg = write_config(tmp_path, server, **SMALL)
    run_pipeline(load_config(cfg), until="responses", progress=False, echo=lambda m: None)
    run = tmp_path / "outputs" / "t"
    want = _rows(run, "responses")
    (run / "responses" / "survey.csv").write_text("mine")  # the slow, ordered clear
    seen = 0

    def crash(label: str) -> None:
        nonlocal seen
        if label.startswith("clear "):
            seen += 1
            if seen == at:
                raise _Killed(label)

    monkeypatch.setattr(stage_module, "crash_point", crash)
    with pytest.raises(_Killed):
        run_pipeline(
            load_config(cfg), until="responses", redo="responses", progress=False,
            echo=lambda m: None,
        )  # fmt: skip
    monkeypatch.undo()
    said: list[str] = []
    run_pipeline(load_config(cfg), until="responses", progress=False, echo=said.append)
    assert any("re-doing" in s for s in said if s.startswith("[responses]")), said
    assert _rows(run, "responses") == want
    assert (run / "responses" / "survey.csv").read_text() == "mine"


def test_a_users_dot_tmp_file_in_the_run_survives_the_stray_cleanup(tmp_path, server):
    """A run removes the temporary files a killed writer left (".<name>.<random>.tmp"),
    not a file of the user's that merely ends in .tmp."""
    cfg = write_config(tmp_path, server, **SMALL)
    assert main(["run", str(cfg), "--until", "ingest", "--no-progress"]) == 0
    run = tmp_path / "outputs" / "t"
    (run / ".notes.tmp").write_text("mine")
    (run / "draft.tmp").write_text("mine too")
    (run / "ingest" / ".data-00000.jsonl.k3j9x2ab.tmp").write_text('{"half": ')  # ours
    mine = {k: v for k, v in disk_state(run).items() if k in (".notes.tmp", "draft.tmp")}
    assert main(["run", str(cfg), "--until", "ingest", "--no-progress"]) == 0
    after = disk_state(run)
    assert {k: after[k] for k in mine} == mine
    assert "ingest/.data-00000.jsonl.k3j9x2ab.tmp" not in after


# ---- a folder that merely holds files of a run's names is not a run ----------------------


def _users_cache(path: Path) -> None:
    import sqlite3

    con = sqlite3.connect(path)
    con.execute("CREATE TABLE responses (id INTEGER, answer TEXT)")  # a name prb uses too
    con.execute("CREATE TABLE people (name TEXT)")
    con.execute("INSERT INTO people VALUES ('ada')")
    con.commit()
    con.close()


@pytest.mark.parametrize(
    ("what", "expect"),
    [
        ("run.yaml", "run.yaml is not a prb config ('jobs' is not one of its sections)"),
        ("cache.sqlite", "cache.sqlite is not prb's request cache (it has a table 'people')"),
        ("judge/stage.json", "judge/stage.json is not prb's record of the judge stage"),
        ("judge/stage.json+done", "judge/stage.json is not prb's record of the judge stage"),
    ],
)
def test_a_users_folder_with_a_runs_file_names_is_refused_whole(
    tmp_path, server, capsys, what, expect
):
    """A folder of the user's holding their own run.yaml, cache.sqlite or judge/stage.json
    (with a data shard beside it) was taken for an older run: run.yaml overwritten, tables
    added to the database, the shard replaced by `--redo judge`. Now every command that
    would write refuses it in one line, and nothing on disk changes."""
    folder = tmp_path / "outputs" / "t"
    folder.mkdir(parents=True)
    if what == "run.yaml":
        (folder / "run.yaml").write_text("jobs:\n  build:\n    runs-on: ubuntu\n")
    elif what == "cache.sqlite":
        _users_cache(folder / "cache.sqlite")
    else:
        (folder / "judge").mkdir()
        (folder / "judge" / "stage.json").write_text('{"stage": "my judging", "fingerprint": "x"}')
        (folder / "judge" / "data-00000.jsonl").write_text('{"mine": 1}\n')
        if what.endswith("+done"):
            (folder / "judge" / "_DONE.json").write_text('{"files": {}}')
    cfg = write_config(tmp_path, server, **SMALL)
    before = disk_state(tmp_path / "outputs")
    for argv in (["run", str(cfg)], ["run", str(cfg), "--redo", "judge"]):
        assert main([*argv, "--no-progress"]) == 1
        line = _one_error_line(capsys)
        assert "not a run directory" in line and expect in line, line
        assert disk_state(tmp_path / "outputs") == before  # not a byte written
    assert main(["status", str(folder)]) != 0
    assert expect in _one_error_line(capsys)
    assert disk_state(tmp_path / "outputs") == before


def test_an_older_run_without_the_marker_is_still_taken(tmp_path, server):
    """A run made before the marker existed (its run.yaml, its request cache in WAL mode,
    its finished stages) reads as prb's own and is carried on."""
    cfg = write_config(tmp_path, server, **SMALL)
    assert main(["run", str(cfg), "--until", "responses", "--no-progress"]) == 0
    run = tmp_path / "outputs" / "t"
    (run / ".prb-run").unlink()
    assert (run / "cache.sqlite").is_file() and RunDir(run).not_a_run() is None
    assert main(["run", str(cfg), "--until", "judge", "--no-progress"]) == 0
    assert RunDir(run).stage("judge").done


def test_a_missing_ranker_extra_is_one_line_before_anything_is_written(
    tmp_path, server, capsys, monkeypatch
):
    """profile.ranker contriever without its extra crashed `prb plan` and `prb run` with a
    torch ImportError traceback, after `prb run` had made the run folder. (The libraries
    are installed here: the ranker is made to need one that is not.)"""
    import pipeline.types.profile as profile

    monkeypatch.setitem(profile.RANKER_NEEDS, "contriever", (("no_such_module_prb",), "contriever"))
    cfg = write_config(tmp_path, server, profile={"ranker": "contriever"}, **SMALL)
    (tmp_path / "outputs").mkdir()
    for argv in (["plan", str(cfg)], ["run", str(cfg), "--no-progress"]):
        assert main(argv) != 0
        line = _one_error_line(capsys)
        assert "profile.ranker 'contriever'" in line, line
        assert "pip install 'personalized-rewardbench[contriever]'" in line, line
        assert list((tmp_path / "outputs").iterdir()) == []  # no run folder was made


@pytest.mark.parametrize("how", ["in the file", "--set run.name"])
def test_a_config_that_is_its_own_runs_run_yaml_is_never_written_over(
    tmp_path, server, capsys, how
):
    """A user's config named run.yaml, in the folder its own run.output_dir/run.name point
    at (`output_dir: ..`, `name: study`, the file in study/), was adopted as a run and the
    resolved config written over it: comments, order and relative paths lost (issue 52)."""
    study = tmp_path / "study"
    study.mkdir()
    mine = study / "run.yaml"
    body = write_config(tmp_path, server, **SMALL).read_text()
    name = "study" if how == "in the file" else "other"
    body = body.replace(f"output_dir: {tmp_path / 'outputs'}", "output_dir: ..")
    body = body.replace("name: t\n", f"name: {name}\n")
    mine.write_text("# my study: keep this comment\n" + body)
    overrides = [] if how == "in the file" else ["--set", "run.name=study"]
    before = disk_state(tmp_path)
    batch = ["--set", "backend.name=batchfile", "--no-progress"]
    for command, extra in (("run", ["--no-progress"]), ("plan", []), ("batch export", batch)):
        assert main([*command.split(), str(mine), *overrides, *extra]) == 1
        line = _one_error_line(capsys)
        assert line.startswith(f"error: {mine.resolve()}: is the run.yaml of its own run"), line
        assert disk_state(tmp_path) == before, command  # every byte of the file, no .lock
    # a run's own resolved run.yaml is its config exactly: running it again changes nothing
    cfg = write_config(tmp_path, server, **SMALL)
    assert main(["run", str(cfg), "--no-progress"]) == 0
    resolved = tmp_path / "outputs" / "t" / "run.yaml"
    text = resolved.read_bytes()
    assert main(["run", str(resolved), "--no-progress"]) == 0
    assert resolved.read_bytes() == text
    capsys.readouterr()
