"""Every command the CLI suggests to run next is run here, as printed (split with shlex,
through the CLI in-process), and does what the suggestion says: a budget stop's resume
command finishes the run under the limit it proposes, its plan names the same run, a
refusal's `--until` command builds the missing stage of that run, and so on. Each
suggestion carries the config and the --set options of the command it continues."""

from __future__ import annotations

import json
import re
import shlex
import sqlite3

import pytest
from conftest import write_config

from pipeline.cli import main
from pipeline.cli.errorline import format_error
from pipeline.config import load_config
from pipeline.kinds.stages import ORDER
from pipeline.plan import estimate
from pipeline.run import RunDir

PRICES = ["run.prices.input_usd_per_million=0.5", "run.prices.output_usd_per_million=2.0"]


def _suggested(text: str, head: str) -> list[str]:
    """The backquoted commands in ``text`` that start with ``head``."""
    return [c for c in re.findall(r"`([^`]+)`", text) if c.startswith(head)]


def _run_suggestion(command: str) -> int:
    argv = shlex.split(command)
    assert argv[0] == "prb"
    return main(argv[1:])


def _sets(argv: list[str]) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv) if a == "--set"]


@pytest.mark.parametrize(
    ("limit", "value"),
    # 200 requests and 60,000 tokens stop in the judge; 8,000 tokens in the responses, so
    # the plan bounds the judge's prompts on answers not written yet
    [("requests", 200), ("tokens", 60_000), ("tokens", 8_000), ("usd", 0.05)],
)
def test_a_budget_stop_proposes_a_limit_that_finishes_the_run(
    tmp_path, server, capsys, limit, value
):
    """The issue's case: 444 requests to send and a limit of 200. The proposed limit is
    what `prb plan` counts to finish (not twice the limit), the resume command it prints
    finishes the same run in one go, and the plan command it prints plans that run."""
    cfg = write_config(tmp_path, server)
    sets = ["run.name=budgeted", *PRICES, f"run.budget.{limit}={value}"]
    argv = ["run", str(cfg), "--no-progress"] + [x for s in sets for x in ("--set", s)]
    assert main(argv) == 4
    err = capsys.readouterr().err
    (resume,) = _suggested(err, "prb run ")
    (plan,) = _suggested(err, "prb plan ")

    # the plan command: the same run (run.name and the prices kept), nothing else
    assert _sets(shlex.split(plan)) == sets
    assert main([*shlex.split(plan)[1:], "--json"]) == 0
    planned = json.loads(capsys.readouterr().out)
    assert planned["run_dir"].endswith("outputs/budgeted")
    need = planned["totals"]["budget_to_finish"][limit]

    # the resume command: the same --set options, the limit raised to the plan's figure
    resume_sets = _sets(shlex.split(resume))
    assert resume_sets[:-1] == sets[:-1]
    raised = resume_sets[-1]
    assert raised.startswith(f"run.budget.{limit}=")
    shown = float(raised.split("=", 1)[1])
    assert shown >= need and shown > value
    assert shown == pytest.approx(need, abs=0.01)  # the plan's figure, not a guess
    if limit == "requests":
        spent = planned["totals"]["budget_to_finish"]["spent_requests"]
        assert need == spent + planned["totals"]["requests_to_send"]
        # at most every request (the judge's largest): 444 in all here
        assert spent < need <= 60 + 384
    assert f"raise run.budget.{limit} to {raised.split('=', 1)[1]}" in err

    assert _run_suggestion(resume) == 0  # one go: it does not stop again
    rd = RunDir(tmp_path / "outputs" / "budgeted")
    assert all(rd.stage(n).done for n in ORDER)
    assert not (tmp_path / "outputs" / "t").exists()  # no other run was started


def test_a_budget_stop_under_until_and_json_carries_the_commands(tmp_path, server, capsys):
    cfg = write_config(tmp_path, server)
    argv = ["run", str(cfg), "--until", "responses", "--no-progress", "--json"]
    argv += ["--set", "run.name=part", "--set", "run.budget.requests=20"]
    assert main(argv) == 4
    captured = capsys.readouterr()
    summary = json.loads(captured.out)
    nxt = summary["next"]
    assert _suggested(captured.err, "prb run ") == [nxt["resume"]]
    assert _suggested(captured.err, "prb plan ") == [nxt["plan"]]
    for command in nxt.values():
        argv = shlex.split(command)
        assert argv[argv.index("--until") + 1] == "responses"
        assert "run.name=part" in _sets(argv)

    assert main([*shlex.split(nxt["plan"])[1:], "--json"]) == 0
    planned = json.loads(capsys.readouterr().out)
    assert [s["stage"] for s in planned["stages"]] == ["ingest", "rubrics", "responses"]
    assert planned["run_dir"].endswith("outputs/part")

    assert _run_suggestion(nxt["resume"]) == 0
    rd = RunDir(tmp_path / "outputs" / "part")
    assert rd.stage("responses").done and not rd.stage("judge").path.exists()


def test_the_plan_prints_the_budget_that_finishes(tmp_path, server, capsys):
    cfg = write_config(tmp_path, server)
    assert main(["plan", str(cfg), "--set", "run.name=p"]) == 0
    out = capsys.readouterr().out
    plan = estimate(load_config(cfg, ["run.name=p"]))
    need = plan.totals["budget_to_finish"]
    assert f"budget: the rest finishes under run.budget.requests {need['requests']:,}" in out
    assert need["requests"] == plan.totals["requests_to_send"] == 444
    # the token figure bounds prompts by their bytes, as the budget does: above the plan's
    # own token count of the same prompts
    assert need["tokens"] > plan.totals["prompt_tokens_bound"] + plan.totals["output_tokens_bound"]


def test_a_stage_needed_first_names_the_command_that_builds_it(tmp_path, server, capsys):
    cfg = write_config(tmp_path, server)
    sets = ["--set", "run.name=only", "--set", "responses.n=1"]
    assert main(["run", str(cfg), "--no-progress", "--until", "rubrics", *sets]) == 0
    capsys.readouterr()
    assert main(["run", str(cfg), "--no-progress", "--only", "judge", *sets]) == 1
    err = capsys.readouterr().err
    (command,) = _suggested(err, "prb run ")
    argv = shlex.split(command)
    assert argv[argv.index("--until") + 1] == "responses"
    assert _sets(argv) == ["run.name=only", "responses.n=1"]
    assert _run_suggestion(command) == 0
    rd = RunDir(tmp_path / "outputs" / "only")
    assert rd.stage("responses").done
    # the suggestion built what --only judge needed: it now runs
    assert main(["run", str(cfg), "--no-progress", "--only", "judge", *sets]) == 0
    assert rd.stage("judge").done


def test_status_of_a_run_not_started_says_how_to_start_it(tmp_path, server, capsys):
    cfg = write_config(tmp_path, server)
    sets = ["--set", "run.name=later", "--set", "responses.n=1"]
    assert main(["status", str(cfg), *sets]) == 0
    out = capsys.readouterr().out
    assert out.startswith("no run yet at ")
    (command,) = _suggested(out, "prb run ")
    assert _sets(shlex.split(command)) == ["run.name=later", "responses.n=1"]
    assert not (tmp_path / "outputs").exists()  # status created nothing
    assert _run_suggestion(command + " --until rubrics") == 0
    assert RunDir(tmp_path / "outputs" / "later").stage("rubrics").done
    capsys.readouterr()

    # publish on a run not started names the same command, --set options included
    assert main(["publish", str(cfg), "--set", "run.name=other"]) == 1
    (command,) = _suggested(capsys.readouterr().err, "prb run ")
    assert _sets(shlex.split(command)) == ["run.name=other"]


def test_inspect_points_at_the_status_of_the_same_run(tmp_path, server, capsys):
    cfg = write_config(tmp_path, server)
    sets = ["--set", "run.name=ins"]
    assert main(["run", str(cfg), "--no-progress", "--until", "rubrics", *sets]) == 0
    capsys.readouterr()
    assert main(["inspect", str(cfg), "--stage", "judge", *sets]) == 1
    (command,) = _suggested(capsys.readouterr().err, "prb status ")
    assert _run_suggestion(command) == 0
    out = capsys.readouterr().out
    assert out.startswith("run: ") and "outputs/ins" in out.splitlines()[0]
    assert re.search(r"rubrics\s+done", out)


def test_a_damaged_cache_names_the_repair_of_the_same_run(tmp_path, server, capsys):
    cfg = write_config(tmp_path, server)
    sets = ["--set", "run.name=damaged", "--set", "responses.n=1"]
    assert main(["run", str(cfg), "--no-progress", "--until", "responses", *sets]) == 0
    cache = tmp_path / "outputs" / "damaged" / "cache.sqlite"
    with sqlite3.connect(cache) as db:
        answers = db.execute("SELECT COUNT(*) FROM responses").fetchone()[0]
    data = bytearray(cache.read_bytes())
    data[4096 : 4096 * 3] = b"\xff" * (4096 * 2)  # pages after the header: unreadable
    cache.write_bytes(bytes(data))
    capsys.readouterr()
    assert main(["run", str(cfg), "--no-progress", "--redo", "responses", *sets]) == 1
    err = capsys.readouterr().err
    (command,) = _suggested(err, "prb cache repair ")
    assert str(cache) in err
    assert shlex.split(command)[3:] == [str(cache.parent)]  # the run directory itself
    # an SQLite error escaping the cache is named from the config: with its --set options
    damaged = sqlite3.DatabaseError("database disk image is malformed")
    line = format_error(damaged, cfg, sets[1::2])
    assert line is not None and str(cache) in line
    (from_config,) = _suggested(line, "prb cache repair ")
    assert shlex.split(from_config)[3:] == [str(cfg), *sets]
    for suggested in (command, from_config):
        assert _run_suggestion(suggested) == 0
        out = capsys.readouterr().out
        assert f"repaired {cache}" in out
    # the repaired run goes on: what the damage lost is asked again
    redo = ["run", str(cfg), "--no-progress", "--until", "responses", "--redo", "responses"]
    assert main([*redo, *sets]) == 0
    with sqlite3.connect(cache) as db:
        assert db.execute("SELECT COUNT(*) FROM responses").fetchone()[0] == answers


def test_the_plan_without_prices_names_the_command_that_shows_the_cost(tmp_path, server, capsys):
    cfg = write_config(tmp_path, server)
    assert main(["plan", str(cfg), "--until", "responses", "--set", "run.name=priced"]) == 0
    out = capsys.readouterr().out
    (command,) = _suggested(out, "prb plan ")
    argv = shlex.split(command)
    assert argv[argv.index("--until") + 1] == "responses"
    assert _sets(argv)[0] == "run.name=priced" and len(_sets(argv)) == 3
    assert _run_suggestion(command) == 0
    out = capsys.readouterr().out
    assert "outputs/priced" in out.splitlines()[0]
    cost = next(x for x in out.splitlines() if x.startswith("cost: "))
    # no answers measured yet: the bound only, at the prices the suggestion gave
    assert re.match(r"cost: \$[\d.,]+ at most for first attempts", cost), cost
    assert "at $0.15 / $0.6 per million" in cost
