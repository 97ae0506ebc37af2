"""Nothing a user types deletes their files: `prb publish --out` replaces only a folder
`prb publish` wrote (and the run's own release), never a run, a stage, a file or anything
else; commands pointed at something that is not a run create nothing. Every refusal is
one line, exit 1, and the disk is compared before and after (sizes and hashes)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest
from conftest import write_config
from standin_server import StandinServer

from pipeline.cli import main
from pipeline.config import load_config
from pipeline.orchestration.orchestrate import run_pipeline


def listing(root: Path) -> dict[str, tuple[int, str]]:
    """Every file and folder under ``root``: size and sha256 (folders: -1)."""
    out: dict[str, tuple[int, str]] = {}
    for p in sorted(root.rglob("*")):
        rel = str(p.relative_to(root))
        if p.is_dir():
            out[rel] = (-1, "")
        else:
            out[rel] = (p.stat().st_size, hashlib.sha256(p.read_bytes()).hexdigest())
    return out


@pytest.fixture(scope="module")
def base_run(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("safe")
    with StandinServer() as s:
        run_pipeline(load_config(write_config(tmp, s)), progress=False, echo=lambda m: None)
    return tmp / "outputs" / "t"


@pytest.fixture
def run(base_run, tmp_path) -> Path:
    dst = tmp_path / "outputs" / "t"
    shutil.copytree(base_run, dst)
    return dst


def _refused(capsys, argv: list[str], *names: str) -> str:
    assert main(argv) == 1
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in captured.err, captured.err
    for name in names:
        assert name in err[0], err[0]
    return err[0]


def test_publish_out_a_folder_of_the_users_keeps_it(run, tmp_path, capsys):
    keep = tmp_path / "keep"
    keep.mkdir()
    (keep / "thesis.tex").write_text("x")
    before = listing(tmp_path)
    _refused(capsys, ["publish", str(run), "--out", str(keep)], str(keep), "not written by")
    assert listing(tmp_path) == before


@pytest.mark.parametrize("where", ["run", "stage", "parent"])
def test_publish_out_the_run_or_inside_it_is_refused(run, tmp_path, capsys, where):
    out = {"run": run, "stage": run / "pairs", "parent": run.parent}[where]
    before = listing(tmp_path)
    _refused(capsys, ["publish", str(run), "--out", str(out)], "--out")
    assert listing(tmp_path) == before


def test_publish_out_a_file_is_refused(run, tmp_path, capsys):
    target = tmp_path / "notes.txt"
    target.write_text("mine")
    before = listing(tmp_path)
    _refused(capsys, ["publish", str(run), "--out", str(target)], "is a file")
    assert listing(tmp_path) == before


def test_an_earlier_release_is_replaced_only_with_force(run, tmp_path, capsys):
    out = tmp_path / "release"
    assert main(["publish", str(run), "--out", str(out)]) == 0
    assert (out / ".prb-release").is_file()
    capsys.readouterr()
    before = listing(tmp_path)
    _refused(capsys, ["publish", str(run), "--out", str(out)], "--force")
    assert listing(tmp_path) == before
    assert main(["publish", str(run), "--out", str(out), "--force"]) == 0
    assert "replaced the earlier release" in capsys.readouterr().out
    # the run's own release folder is the run's: published again without --force
    assert main(["publish", str(run)]) == 0 and main(["publish", str(run)]) == 0
    marker = json.loads((run / "publish" / ".prb-release").read_text())
    assert marker["written_by"] == "prb publish"


def _user_files(out: Path) -> None:
    """What a person adds to a release folder after publishing: a notebook, a folder of
    figures (one of them in a subfolder), an empty folder, and a note in a config folder."""
    (out / "analysis.ipynb").write_text('{"cells": []}')
    (out / "figs" / "png").mkdir(parents=True)
    (out / "figs" / "lengths.svg").write_text("<svg/>")
    (out / "figs" / "png" / "a.png").write_bytes(b"\x89PNG....")
    (out / "drafts").mkdir()
    (out / "all" / "NOTES.md").write_text("checked by hand")


USER_FILES = ("analysis.ipynb", "figs", "figs/lengths.svg", "figs/png", "figs/png/a.png",
              "drafts", "all/NOTES.md")  # fmt: skip


def _release_files(out: Path) -> dict[str, tuple[int, str]]:
    return {k: v for k, v in listing(out).items() if k not in USER_FILES}


@pytest.mark.parametrize("default", [False, True], ids=["out-force", "run-release"])
def test_replacing_a_release_keeps_what_the_user_added(run, tmp_path, capsys, default):
    out = run / "publish" if default else tmp_path / "release"
    argv = ["publish", str(run)] + ([] if default else ["--out", str(out)])
    assert main(argv) == 0
    first = _release_files(out)
    marker = json.loads((out / ".prb-release").read_text())
    assert set(marker["files"]) == {k for k, v in first.items() if v[0] >= 0} - {".prb-release"}
    _user_files(out)
    theirs = {k: v for k, v in listing(out).items() if k in USER_FILES}
    assert len(theirs) == len(USER_FILES)

    # another policy's release: every file of ours replaced, every file of theirs kept
    assert main([*argv, "--license", "mit"] + ([] if default else ["--force"])) == 0
    after = listing(out)
    assert {k: v for k, v in after.items() if k in USER_FILES} == theirs
    second = _release_files(out)
    assert set(second) == set(first)  # the same files, none added or lost
    changed = {k for k in first if first[k] != second[k]}
    assert {"README.md", "release.json", ".prb-release"} <= changed  # the new release's
    assert "license: mit" in (out / "README.md").read_text()
    marker = json.loads((out / ".prb-release").read_text())
    assert not set(marker["files"]) & set(USER_FILES)  # theirs never become ours
    leftovers = [p.name for p in out.parent.iterdir() if p.name.startswith(f".{out.name}")]
    assert leftovers == []  # no temporary or old release folder beside it


def test_a_stranger_that_would_make_the_release_wrong_is_refused(run, tmp_path, capsys):
    out = tmp_path / "release"
    assert main(["publish", str(run), "--out", str(out)]) == 0
    capsys.readouterr()
    # a parquet file in a config folder would be read as part of that config
    (out / "all" / "extra.parquet").write_bytes(b"PAR1")
    before = listing(tmp_path)
    line = _refused(capsys, ["publish", str(run), "--out", str(out), "--force"], "--out")
    assert "all/extra.parquet" in line and "config 'all'" in line
    assert listing(tmp_path) == before
    (out / "all" / "extra.parquet").unlink()
    # a release file edited by hand: replacing it would lose the edit
    readme = out / "README.md"
    readme.write_text(readme.read_text() + "\nMy notes.\n")
    before = listing(tmp_path)
    line = _refused(capsys, ["publish", str(run), "--out", str(out), "--force"], "README.md")
    assert "changed since" in line
    assert listing(tmp_path) == before


def test_out_through_a_link_into_the_run_is_refused(run, tmp_path, capsys):
    link = tmp_path / "shortcut"
    link.symlink_to(run, target_is_directory=True)
    before = listing(tmp_path)
    line = _refused(capsys, ["publish", str(run), "--out", str(link / "rel")], "--out")
    assert f"is inside the run directory {run.resolve()}" in line
    assert f"it leads to {(run / 'rel').resolve()}" in line
    assert listing(tmp_path) == before and not (run / "rel").exists()


def test_an_empty_folder_is_used_as_it_is(run, tmp_path):
    out = tmp_path / "empty"
    out.mkdir()
    assert main(["publish", str(run), "--out", str(out)]) == 0
    assert (out / "all").is_dir()


@pytest.mark.parametrize("command", ["cache repair", "status", "inspect", "publish"])
def test_commands_on_something_that_is_not_a_run_create_nothing(tmp_path, capsys, command):
    typo = tmp_path / "typo" / "deep" / "run"
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "thesis.tex").write_text("x")
    afile = tmp_path / "some.txt"
    afile.write_text("x")
    before = listing(tmp_path)
    for target, says in (
        (typo, "no such run directory"),
        (plain, "not a run directory"),
        (afile, "a file, not a run directory"),
    ):
        _refused(capsys, [*command.split(), str(target)], str(target), says)
    assert listing(tmp_path) == before  # no folder, no .lock, nothing


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs named pipes")
def test_a_named_pipe_is_not_a_run(tmp_path, capsys):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    _refused(capsys, ["status", str(fifo)], "named pipe")
