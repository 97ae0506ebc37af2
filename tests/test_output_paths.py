"""One check for every path a user names as an output (pipeline/run/outputs.py).

The commands are found in the argument parser, not listed here: every subcommand with an
``--out`` or ``-o`` option. Each is run against a run's own files (its request cache, its
run.yaml, a shard, a manifest, its marker, a stage folder, the run itself, a link to its
cache), the config or table the command reads and a file of the user's; each refusal is
one line with the same wording, exit status 1, and every byte under the test's folder is
the same before and after."""

from __future__ import annotations

import argparse
import os
import shutil
from pathlib import Path

import pytest
from conftest import disk_state, write_config
from standin_server import StandinServer

from pipeline.cli.prb import build_parser, main
from pipeline.config import load_config
from pipeline.orchestration.orchestrate import run_pipeline
from pipeline.run.outputs import LEFT_AS_IT_IS

OUT_FLAGS = ("--out", "-o")


def _leaves(parser: argparse.ArgumentParser, words: tuple[str, ...] = ()):
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield words, parser
        return
    for sub in subs:
        for name, child in sub.choices.items():
            yield from _leaves(child, (*words, name))


def output_commands() -> list[tuple[tuple[str, ...], argparse.ArgumentParser, str]]:
    """(command words, its parser, its output flag) of every command that writes a path the
    user names."""
    found = []
    for words, parser in _leaves(build_parser()):
        for action in parser._actions:
            flag = next((f for f in action.option_strings if f in OUT_FLAGS), None)
            if flag is not None:
                found.append((words, parser, flag))
    return found


# how each positional argument of those commands is filled: a new command's positional
# that is not here fails test_every_output_command_is_covered, which says what to add
POSITIONALS = {
    "config": "config",  # the run's config file
    "run": "run",  # the run directory
    "split": "run",
    "path": "run",  # prb audit: a run, release or pairs file
}


def invocations(tmp: Path, run: Path, cfg: Path, table: Path):
    """(id, argv without the output path, flag, what it reads) for every output command;
    `prb eval` once per mode: a split, and `correlate TABLE`."""
    values = {"config": str(cfg), "run": str(run)}
    for words, parser, flag in output_commands():
        positionals = [a for a in parser._actions if not a.option_strings]
        argv = list(words)
        for a in positionals:
            if a.dest == "table":  # only after the word correlate (prb eval)
                continue
            argv.append(values[POSITIONALS[a.dest]])
        yield " ".join(words), argv, flag, cfg
        if any(a.dest == "table" for a in positionals):
            yield f"{' '.join(words)} correlate", [*words, "correlate", str(table)], flag, table


def test_every_output_command_is_covered():
    found = output_commands()
    names = {" ".join(w) for w, _, _ in found}
    # the commands known today must be among them (the parser is the list, this is a floor)
    assert {"quickstart", "publish", "audit", "eval", "batch export"} <= names, names
    for words, parser, _ in found:
        for a in parser._actions:
            if not a.option_strings and a.dest != "table":
                assert a.dest in POSITIONALS, (
                    f"prb {' '.join(words)} takes a positional {a.dest!r}: say in POSITIONALS "
                    "how to fill it, so its output path is checked below"
                )


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("outs")
    with StandinServer() as s:
        cfg = write_config(tmp, s)
        run_pipeline(load_config(cfg), progress=False, echo=lambda m: None)
    (tmp / "table.csv").write_text("model,accuracy,bon\na,0.6,1\nb,0.7,2\nc,0.8,3\n")
    (tmp / "notes.csv").write_text("mine,1\n")
    return tmp


@pytest.fixture
def tmp(base, tmp_path) -> Path:
    dst = tmp_path / "w"
    shutil.copytree(base, dst, symlinks=True)
    cfg = dst / "config.yaml"
    cfg.write_text(cfg.read_text().replace(str(base), str(dst)))
    (dst / "cache-link").symlink_to(dst / "outputs" / "t" / "cache.sqlite")
    return dst


TARGETS = {
    "cache": "outputs/t/cache.sqlite",
    "run.yaml": "outputs/t/run.yaml",
    "shard": "outputs/t/ingest/data-00000.jsonl",
    "manifest": "outputs/t/ingest/_DONE.json",
    "marker": "outputs/t/.prb-run",
    "stage folder": "outputs/t/ingest",
    "run": "outputs/t",
    "link to the cache": "cache-link",
    "users file": "notes.csv",
    "what it reads": None,  # the config being run, or the table being read
}


def test_every_output_command_refuses_a_runs_files_its_input_and_a_users_file(tmp, capsys):
    run = tmp / "outputs" / "t"
    assert (run / "cache.sqlite").is_file() and (run / "ingest" / "_DONE.json").is_file()
    seen = set()
    for name, argv, flag, reads in invocations(tmp, run, tmp / "config.yaml", tmp / "table.csv"):
        for target, rel in TARGETS.items():
            out = reads if rel is None else tmp / rel
            before = disk_state(tmp)
            rc = main([*argv, flag, str(out)])
            captured = capsys.readouterr()
            err = captured.err.strip().splitlines()
            where = f"prb {name} {flag} <{target}>"
            assert rc == 1, f"{where}: exit {rc}\n{captured.out}{captured.err}"
            assert len(err) == 1 and "Traceback" not in captured.err, (where, captured.err)
            assert err[0].startswith(f"error: {out}, field '{flag}': is "), (where, err[0])
            assert LEFT_AS_IT_IS in err[0], (where, err[0])
            assert disk_state(tmp) == before, f"{where} changed the disk"
            seen.add(name)
    assert {"eval", "eval correlate", "batch export", "audit", "publish", "quickstart"} <= seen


def test_what_a_refusal_says_each_target_is(tmp, capsys):
    run = tmp / "outputs" / "t"
    said = {}
    for target, rel in TARGETS.items():
        out = tmp / "table.csv" if rel is None else tmp / rel
        assert main(["eval", "correlate", str(tmp / "table.csv"), "--out", str(out)]) == 1
        said[target] = capsys.readouterr().err
    assert "the request cache (cache.sqlite" in said["cache"] and str(run) in said["cache"]
    assert "the request cache" in said["link to the cache"]  # by its real path
    assert "the resolved config (run.yaml)" in said["run.yaml"]
    assert "inside the folder of stage 'ingest'" in said["shard"]
    assert "inside the folder of stage 'ingest'" in said["manifest"]
    assert "the marker (.prb-run)" in said["marker"]
    assert "the folder of stage 'ingest'" in said["stage folder"]
    assert f"the run directory {run}" in said["run"]
    assert "a file `prb eval correlate` did not write" in said["users file"]
    assert "the table being read" in said["what it reads"]


def test_an_output_the_command_wrote_is_replaced_and_a_new_one_in_a_run_is_fine(tmp, capsys):
    """The check refuses what is not the command's; what is stays usable: an earlier result
    is replaced, and a new file at the run's top (``<run>/correlate.json``) is written."""
    table = tmp / "table.csv"
    for out in (tmp / "outputs" / "t" / "correlate.json", tmp / "c.json"):
        assert main(["eval", "correlate", str(table), "--out", str(out), "--bootstrap", "20"]) == 0
        first = out.read_bytes()
        assert main(["eval", "correlate", str(table), "--out", str(out), "--bootstrap", "20"]) == 0
        assert out.read_bytes() == first
    capsys.readouterr()


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs named pipes")
def test_correlate_of_a_piped_table_prints_and_says_to_give_out(tmp, capsys):
    """`prb eval correlate <(cat t.csv)`: no file beside a pipe to write the default to;
    the correlations are printed and one note says to give --out."""
    import threading

    fifo = tmp / "piped"
    os.mkfifo(fifo)
    text = (tmp / "table.csv").read_text()

    def feed() -> None:
        with open(fifo, "w") as fh:
            fh.write(text)

    writer = threading.Thread(target=feed, daemon=True)
    writer.start()
    before = disk_state(tmp)
    assert main(["eval", "correlate", str(fifo), "--bootstrap", "20"]) == 0
    writer.join(timeout=60)
    captured = capsys.readouterr()
    assert "spearman" in captured.out.lower() or "bon" in captured.out, captured.out
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and "give --out FILE.json" in err[0] and "a named pipe" in err[0]
    assert "piped-correlate.json" not in captured.err + captured.out
    assert disk_state(tmp) == before


def test_a_default_output_beside_a_file_of_a_release_goes_to_the_runs_folder(tmp, capsys):
    """`prb audit <run>/publish/all/x.parquet` put its report beside the file, inside the
    release; the one check refuses a release's folders, so the default is the run's own
    report/ folder, and the release is left byte for byte."""
    run = tmp / "outputs" / "t"
    assert main(["publish", str(run)]) == 0
    (data,) = (run / "publish" / "all").glob("*.parquet")
    release = disk_state(run / "publish")
    assert main(["audit", str(data)]) == 0
    assert (run / "report" / "audit.json").is_file()
    assert disk_state(run / "publish") == release
    capsys.readouterr()
