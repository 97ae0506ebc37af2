"""Every input a user can get wrong ends in one line on stderr, never a traceback.

Each case runs the real entry point (``pipeline.cli.main`` or ``python -m pipeline.cli`` in
a subprocess) and checks: a non-zero exit, exactly one ``error:`` line that names the file,
line or field and says what to do, and no "Traceback". Input files here are written by hand
for the test.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import ROOT, SAMPLE, write_config

from pipeline.cli import main
from pipeline.cli.errorline import format_error

ROW = {"id": "q1", "question": "How do I start?", "profile": [{"id": "p1", "text": "I paint."}]}


def one_error_line(capsys, argv: list[str], *, only_line: bool = False) -> str:
    """Run ``prb argv``; assert it failed with one error line and no traceback; return it."""
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc != 0, err
    assert "Traceback" not in err, err
    lines = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1, err
    if only_line:
        assert err.strip().splitlines() == lines, err
    return lines[0]


# ---- input JSONL (ingest) -------------------------------------------------------------


def _ingest_error(tmp_path: Path, capsys, data: bytes) -> tuple[str, Path]:
    src = tmp_path / "input.jsonl"
    src.write_bytes(data)
    cfg = write_config(tmp_path, input={"format": "lamp", "path": str(src)})
    line = one_error_line(capsys, ["run", str(cfg), "--until", "ingest", "--no-progress"])
    assert str(src) in line
    # nothing of the ingest stage is left behind as if it were data
    assert not list((tmp_path / "outputs").glob("*/ingest/data-*.jsonl"))
    return line, src


def test_lone_surrogate_names_line_and_field(tmp_path, capsys):
    good = json.dumps(ROW) + "\n"
    bad = json.dumps(ROW).replace("How do I start?", "How \\ud800 start?") + "\n"
    line, _ = _ingest_error(tmp_path, capsys, (good.replace("q1", "q0") + bad).encode())
    assert "line 2" in line and "field 'question'" in line
    assert "surrogate" in line and "fix the escape" in line


def test_surrogate_pair_is_fine(tmp_path):
    from pipeline.config import InputSection
    from pipeline.inputs.ingest import load_examples

    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps(ROW).replace("start?", "start? \\ud83d\\ude00") + "\n")
    (row,) = load_examples(InputSection(path=src))
    assert row["question"].endswith("\U0001f600")


def test_deeply_nested_arrays(tmp_path, capsys):
    deep = '{"id": "q1", "question": "x", "profile": ' + "[" * 100_000 + "]" * 100_000 + "}"
    line, _ = _ingest_error(tmp_path, capsys, deep.encode() + b"\n")
    assert "line 1" in line and "nested too deeply" in line


def test_five_thousand_digit_integer(tmp_path, capsys):
    row = json.dumps(ROW).replace('"q1"', "9" * 5000)
    line, _ = _ingest_error(tmp_path, capsys, row.encode() + b"\n")
    assert "line 1" in line and "too many digits" in line and "ids must be" in line


def test_non_utf8_input(tmp_path, capsys):
    text = json.dumps(ROW, ensure_ascii=False).replace("I paint.", "Café")
    line, _ = _ingest_error(tmp_path, capsys, text.encode("latin-1") + b"\n")
    assert "line 1" in line and "not valid UTF-8" in line and "save the file as UTF-8" in line


@pytest.mark.parametrize("data", [b"", b"\n\n  \n"], ids=["empty", "blank"])
def test_empty_input_is_an_error_not_a_zero_pair_run(tmp_path, capsys, data):
    line, _ = _ingest_error(tmp_path, capsys, data)
    assert "holds no rows" in line and "point the config at" in line


# ---- the config file ------------------------------------------------------------------


def _config_error(tmp_path: Path, capsys, data: bytes | dict) -> tuple[str, Path]:
    p = tmp_path / "bad.yaml"
    p.write_bytes(data if isinstance(data, bytes) else yaml.safe_dump(data).encode())
    line = one_error_line(capsys, ["config", "show", str(p)], only_line=True)
    assert str(p) in line
    return line, p


def test_config_not_utf8(tmp_path, capsys):
    line, _ = _config_error(tmp_path, capsys, "run:\n  name: café\n".encode("latin-1"))
    assert "line 2" in line and "not UTF-8" in line and "save the file as UTF-8" in line


def test_nul_byte_in_run_name(tmp_path, capsys):
    line, _ = _config_error(tmp_path, capsys, b'run:\n  name: "a\\0b"\n')
    assert "field 'run.name'" in line and "control characters" in line


def test_nul_byte_in_run_name_override(tmp_path, capsys):
    cfg = write_config(tmp_path)
    line = one_error_line(capsys, ["config", "show", str(cfg), "--set", "run.name=a\x00b"])
    assert "run.name" in line


def test_base_url_not_a_url(tmp_path, capsys):
    line, _ = _config_error(tmp_path, capsys, {"backend": {"openai": {"base_url": "notaurl"}}})
    assert "field 'backend.openai.base_url'" in line and "http://127.0.0.1:8000/v1" in line


def test_output_dir_is_a_file(tmp_path, capsys):
    blocker = tmp_path / "outputs"
    blocker.write_text("not a folder\n")
    cfg = write_config(tmp_path)  # run.output_dir = tmp_path/outputs
    line = one_error_line(capsys, ["run", str(cfg), "--no-progress"], only_line=True)
    assert "field 'run.output_dir'" in line and str(blocker) in line
    assert "point run.output_dir at a folder" in line
    assert blocker.read_text() == "not a folder\n"


@pytest.mark.parametrize("field", ["meta_patterns", "refusal_patterns"])
def test_invalid_regex_fails_at_config_load(tmp_path, capsys, field):
    line, _ = _config_error(tmp_path, capsys, {"pairs": {field: [r"\bok\b", "(unclosed"]}})
    assert f"field 'pairs.{field}'" in line and "item 1" in line
    assert "not a valid regular expression" in line and "fix or remove it" in line


@pytest.mark.parametrize(
    ("pairs", "responses", "field"),
    [
        ({"length_ratio_min": 2.0, "length_ratio_max": 1.0}, {}, "pairs.length_ratio_min"),
        ({"similarity_min": 90, "similarity_max": 20}, {}, "pairs.similarity_min"),
        # two answers of 1..110 words cannot differ by a factor of 200
        ({"length_ratio_min": 200, "length_ratio_max": 300}, {}, "pairs.length_ratio_min"),
        ({"length_ratio_min": 0.001, "length_ratio_max": 0.002}, {}, "pairs.length_ratio_min"),
        ({"refusal_patterns": ["x*"]}, {}, "pairs.refusal_patterns"),
    ],
)
def test_thresholds_that_drop_every_pair(tmp_path, capsys, pairs, responses, field):
    line, _ = _config_error(tmp_path, capsys, {"pairs": pairs, "responses": responses})
    assert f"field '{field}'" in line and "every pair" in line


@pytest.mark.parametrize(
    "section",
    [
        {"pairs": {"meta_patterns": ["(unclosed"]}},
        {"pairs": {"similarity_min": 90, "similarity_max": 20}},
        {"backend": {"base_url": "notaurl"}},
    ],
)
def test_bad_config_is_refused_before_anything_is_written(tmp_path, capsys, section):
    cfg = write_config(tmp_path, **section)
    line = one_error_line(capsys, ["run", str(cfg), "--no-progress"], only_line=True)
    assert str(cfg) in line
    assert not (tmp_path / "outputs").exists()  # no run directory, no run.yaml


def test_rubric_min_above_max(tmp_path, capsys):
    line, _ = _config_error(tmp_path, capsys, {"rubrics": {"min_items": 5, "max_items": 2}})
    assert "field 'rubrics.min_items'" in line and "lower min_items" in line


def test_consistent_thresholds_still_load(tmp_path, capsys):
    cfg = write_config(tmp_path, pairs={"length_ratio_min": 1.0, "length_ratio_max": 1.0})
    assert main(["config", "show", str(cfg)]) == 0


def test_yaml_syntax_error_is_one_line(tmp_path, capsys):
    line, _ = _config_error(tmp_path, capsys, b"run:\n  name: x\nresponses: [\n")
    assert "line 4" in line and "fix the syntax" in line


# ---- publish --push-to-hub --------------------------------------------------------------


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    """A run through the pairs stage against the stand-in server."""
    from standin_server import StandinServer
    from test_judge_pairs import responder

    from pipeline.config import load_config
    from pipeline.orchestration.orchestrate import run_pipeline

    tmp = tmp_path_factory.mktemp("run")
    with StandinServer(responder=responder) as s:
        run_pipeline(load_config(write_config(tmp, s)), progress=False, echo=lambda m: None)
    return tmp / "outputs" / "t"


def test_push_to_hub_cannot_connect(finished_run, tmp_path, capsys, monkeypatch):
    import huggingface_hub.constants

    # a port nothing listens on: the connection is refused at once
    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setenv("HF_TOKEN", "hf_fakeTokenForTests0123456789")
    out = tmp_path / "release"
    argv = ["publish", str(finished_run), "--out", str(out), "--push-to-hub", "someone/prb"]
    line = one_error_line(capsys, argv)
    assert "--push-to-hub someone/prb" in line and "upload failed" in line
    assert "http://127.0.0.1:9" in line and "HF_TOKEN" in line
    assert "hf_fakeTokenForTests0123456789" not in line
    assert (out / "README.md").exists()  # the local release is whole; only the upload failed


# ---- OS errors: disk full, read-only, no permission ------------------------------------


def _unshare_works(*flags: str) -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", *flags, "true"], capture_output=True)
    return probe.returncode == 0


def _prb_subprocess(prefix: list[str], *argv: str) -> subprocess.CompletedProcess:
    cmd = [*prefix, sys.executable, "-m", "pipeline.cli", *argv]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=120)


def _assert_one_line(proc: subprocess.CompletedProcess, *needles: str) -> str:
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1, proc.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def _mounted(tmp_path: Path, options: str) -> tuple[list[str], Path]:
    """A command prefix that runs inside a private mount namespace with a small tmpfs."""
    if not _unshare_works("-rm"):
        pytest.skip("needs unprivileged user and mount namespaces (unshare -rm)")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    script = f'mount -t tmpfs -o {options} tmpfs "{mnt}" && exec "$@"'
    return ["unshare", "-rm", "sh", "-c", script, "sh"], mnt


def test_disk_full(tmp_path):
    prefix, mnt = _mounted(tmp_path, "size=4k")
    cfg = write_config(tmp_path, run={"name": "t", "output_dir": str(mnt / "out")})
    proc = _prb_subprocess(prefix, "run", str(cfg), "--until", "ingest", "--no-progress")
    line = _assert_one_line(proc, "No space left on device", str(mnt))
    assert "free some disk space" in line


def test_read_only_file_system(tmp_path):
    prefix, mnt = _mounted(tmp_path, "ro")
    cfg = write_config(tmp_path, run={"name": "t", "output_dir": str(mnt / "out")})
    proc = _prb_subprocess(prefix, "run", str(cfg), "--until", "ingest", "--no-progress")
    line = _assert_one_line(proc, "Read-only file system", str(mnt))
    assert "cannot write" in line and "writable folder" in line


def test_folder_without_write_permission(tmp_path):
    folder = tmp_path / "locked"
    folder.mkdir()
    folder.chmod(0o555)
    if os.geteuid() != 0:
        prefix: list[str] = []
    elif _unshare_works("-U", "--map-user=65534", "--map-group=65534"):
        # root ignores permissions; as an unprivileged user in a user namespace it does not
        prefix = ["unshare", "-U", "--map-user=65534", "--map-group=65534"]
    else:
        pytest.skip("running as root without user namespaces: permissions are not enforced")
    try:
        cfg = write_config(tmp_path, run={"name": "t", "output_dir": str(folder)})
        proc = _prb_subprocess(prefix, "run", str(cfg), "--until", "ingest", "--no-progress")
    finally:
        folder.chmod(0o755)
    line = _assert_one_line(proc, "Permission denied", str(folder))
    assert "cannot write" in line and "permissions" in line


# ---- the request cache ------------------------------------------------------------------


def test_corrupted_cache_names_file_and_repair_command(tmp_path, capsys):
    run = tmp_path / "outputs" / "t"
    run.mkdir(parents=True)
    # a run's folder (its marker): an unmarked folder whose cache.sqlite is not prb's is
    # not taken for a run at all (tests/test_run_ownership.py)
    (run / ".prb-run").write_text('{"created_by": "prb run"}')
    (run / "cache.sqlite").write_bytes(b"this is not an SQLite database, just text" * 200)
    line = one_error_line(capsys, ["status", str(run)])
    assert "cache.sqlite" in line and "prb cache repair" in line


def test_sqlite_error_line_names_cache_and_command(tmp_path):
    bad = tmp_path / "run" / "cache.sqlite"
    bad.parent.mkdir()
    bad.write_bytes(b"garbage" * 1000)
    with pytest.raises(sqlite3.DatabaseError) as ei:
        sqlite3.connect(bad).execute("SELECT 1 FROM sqlite_master").fetchall()
    line = format_error(ei.value, bad.parent)
    assert line is not None
    assert str(bad) in line and f"prb cache repair {bad.parent}" in line and "\n" not in line


# ---- the error path of main() -----------------------------------------------------------


def test_library_errors_become_one_line():
    with pytest.raises(UnicodeDecodeError) as ude:
        b"caf\xe9".decode("utf-8")
    line = format_error(ude.value)
    assert line is not None and "not valid UTF-8" in line and "--debug" in line
    with pytest.raises(re.error) as rxe:
        re.compile("(x")
    line = format_error(rxe.value)
    assert line is not None and "'(x'" in line and "fix it in the config" in line
    assert format_error(ZeroDivisionError()) is None  # a bug keeps its traceback


def test_debug_flag_adds_the_traceback(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("backend:\n  openai:\n    base_url: notaurl\n")
    for argv in (["--debug", "config", "show", str(bad)], ["config", "show", str(bad), "--debug"]):
        assert main(argv) == 1
        err = capsys.readouterr().err
        assert "Traceback" in err and err.strip().splitlines()[-1].startswith("error:")
    assert main(["config", "show", str(bad)]) == 1
    assert "Traceback" not in capsys.readouterr().err


def test_keyboard_interrupt_and_bugs(tmp_path, capsys, monkeypatch):
    import pipeline.cli.prb as cli

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "cmd_config", interrupted)
    assert main(["config", "fields"]) == 130
    assert "interrupted" in capsys.readouterr().err

    def bug(args):
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(cli, "cmd_config", bug)
    with pytest.raises(ZeroDivisionError):
        main(["config", "fields"])


def test_sample_input_still_runs(tmp_path, capsys):
    cfg = write_config(tmp_path, input={"format": "lamp", "path": str(SAMPLE)})
    assert main(["run", str(cfg), "--until", "ingest", "--no-progress"]) == 0
