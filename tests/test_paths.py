"""Paths that mean one thing: a relative `run.output_dir` in a config resolves against the
config file's folder wherever `prb` is started, `--set` paths against the current folder,
and the run directory is printed as its absolute path."""

from __future__ import annotations

import os
from pathlib import Path

import yaml
from conftest import SAMPLE
from standin_server import StandinServer

from pipeline.cli import main
from pipeline.config import load_config


def _config(folder: Path, server: StandinServer) -> Path:
    folder.mkdir(parents=True)
    cfg = folder / "run.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "run": {"name": "rel", "output_dir": "../outputs"},
                "input": {"format": "lamp", "path": str(SAMPLE), "limit": 2},
                "backend": {"openai": {"base_url": server.base_url, "max_concurrency": 4}},
                "responses": {"n": 1},
            }
        )
    )
    return cfg


def test_a_run_started_from_another_folder_is_the_same_run(tmp_path, capsys, monkeypatch):
    with StandinServer() as s:
        cfg = _config(tmp_path / "project" / "configs", s)
        want = tmp_path / "project" / "outputs" / "rel"
        monkeypatch.chdir(tmp_path / "project")
        assert main(["run", "configs/run.yaml", "--no-progress"]) == 0
        assert capsys.readouterr().out.strip() == f"run directory: {want}"
        sent = s.request_count
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir()
        monkeypatch.chdir(elsewhere)
        assert main(["run", str(cfg), "--no-progress"]) == 0
        assert capsys.readouterr().out.strip() == f"run directory: {want}"
        assert s.request_count == sent  # the same run: nothing sent again
    assert not (elsewhere / "outputs").exists() and not (tmp_path / "outputs").exists()


def test_set_paths_are_the_current_folders(tmp_path, monkeypatch):
    with StandinServer() as s:
        cfg = _config(tmp_path / "configs", s)
    monkeypatch.chdir(tmp_path)
    assert load_config(cfg).run_dir == tmp_path / "outputs" / "rel"
    got = load_config(cfg, ["run.output_dir=mine"]).run_dir
    assert got == Path(os.path.abspath("mine")) / "rel"
