"""run.budget: a run stops before a request could cross it, keeps everything answered,
leaves nothing half-written, and resumes to the rows an unbudgeted run writes."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from conftest import write_config

from pipeline.cli import main
from pipeline.config import load_config
from pipeline.core.errors import ConfigError
from pipeline.engine.budget import backend_spend, cost_usd
from pipeline.kinds.stages import ORDER
from pipeline.orchestration.orchestrate import run_pipeline
from pipeline.run import RunDir
from pipeline.run.cache import RequestCache
from pipeline.types import schemas
from pipeline.types.chat import ChatResult

ID_KEYS = {
    "ingest": "example_id",
    "rubrics": "example_id",
    "responses": "candidate_id",
    "judge": "example_id",
    "pairs": "pair_id",
}
PRICES = {"input_usd_per_million": 0.5, "output_usd_per_million": 2.0}
SETTINGS = dict(
    input={"chunk_size": 1},  # every stage a shard per example
    rubrics={"chunk_size": 1},
    responses={"n": 2, "strategies": ["avoid_all", "violate_one"], "chunk_size": 1},
    judge={"max_pairs_per_example": 2, "chunk_size": 1},
    pairs={"chunk_size": 1},
)


def _contents(run_dir: Path) -> dict[str, list[str]]:
    """Every stage's rows and rejects, checked finished, verified and without duplicates."""
    out = {}
    for name in ORDER:
        sd = RunDir(run_dir).stage(name)
        assert sd.done and sd.verify() == [], name
        rows = list(sd.rows())
        ids = Counter(r[ID_KEYS[name]] for r in rows)
        assert not ids or max(ids.values()) == 1, f"duplicate rows in {name}"
        out[name] = sorted(json.dumps(r, sort_keys=True) for r in rows + list(sd.rejects()))
    return out


def _nothing_half_written(run_dir: Path) -> None:
    """Each stage is finished and verified, or has no _DONE.json; no temporary file is
    left; every shard is whole JSON; the cache holds only answers that validate."""
    rd = RunDir(run_dir)
    strays = [p for p in run_dir.rglob(".*") if p.name.endswith(".tmp") or ".trash-" in p.name]
    assert strays == []
    for sd in rd.stages():
        if sd.done:
            assert sd.verify() == [], sd.name
        elif sd.path.exists():
            assert not (sd.path / "_DONE.json").exists()
        for n in sd.shard_ids():  # data and rejects parse line by line
            list(sd._read(sd.data_path(n)))
    with RequestCache(rd.cache_path, readonly=True) as cache:
        rows = cache._db.execute("SELECT request, response FROM responses").fetchall()
    for req_json, resp_json in rows:
        req, res = json.loads(req_json), ChatResult.from_dict(json.loads(resp_json))
        assert len(res.choices) == req["n"]
        if req["json_schema"] is not None:
            for choice in res.choices:
                schemas.parse(req["json_schema"], choice.text)


def _named(base: Path, name: str, tmp_path: Path) -> Path:
    cfg = load_config(base)
    data = cfg.model_dump(mode="json")
    data["run"]["name"] = name
    data["input"]["path"] = str(cfg.resolve_input(cfg.input.path))
    path = tmp_path / f"{name}.yaml"
    path.write_text(json.dumps(data))  # JSON is YAML
    return path


@pytest.mark.parametrize(
    ("limit", "value"),
    [("requests", 40), ("tokens", 30_000), ("usd", 0.03)],
)
def test_a_budget_stops_between_requests_and_resumes_to_the_same_rows(
    tmp_path, server, capsys, limit, value
):
    base = write_config(tmp_path, server, run={"prices": PRICES}, **SETTINGS)
    reference = _named(base, "reference", tmp_path)
    run_pipeline(load_config(reference), progress=False, echo=lambda s: None)
    want = _contents(tmp_path / "outputs" / "reference")

    budgeted = _named(base, "budgeted", tmp_path)
    rc = main(["run", str(budgeted), "--no-progress", "--set", f"run.budget.{limit}={value}"])
    assert rc == 4
    err = capsys.readouterr().err
    assert f"stopped at run.budget.{limit}" in err
    assert f"prb run {budgeted} --set run.budget.{limit}=" in err  # the resume command
    assert "--redo" not in err
    run_dir = tmp_path / "outputs" / "budgeted"
    rd = RunDir(run_dir)
    assert not all(sd.done for sd in rd.stages())  # it stopped before the end
    stopped = next(sd for sd in rd.stages() if sd.path.exists() and not sd.done)
    stats = stopped.stats()
    assert stats["stopped_by_budget"]["limit"] == f"run.budget.{limit}"
    assert stats["ledger"]["invocation"]["sent"] == stats["llm"]["sent"]
    _nothing_half_written(run_dir)

    # what was received never crossed the budget
    cfg = load_config(budgeted)
    with RequestCache(rd.cache_path, readonly=True) as cache:
        (served_by,) = cache.backends()
        spent = backend_spend(cache, served_by)
    got = {
        "requests": spent.requests,
        "tokens": spent.tokens,
        "usd": cost_usd(spent.prompt_tokens, spent.completion_tokens, cfg.run.prices),
    }
    assert 0 < got[limit] <= value
    # a conservative bound, but not a timid one: at least half the budget is used
    assert got[limit] >= value / 2, got

    # the same command without the budget goes on from there
    assert main(["run", str(budgeted), "--no-progress"]) == 0
    assert _contents(run_dir) == want
    _nothing_half_written(run_dir)


def test_a_request_larger_than_the_budget_sends_nothing(tmp_path, server, capsys):
    cfg = write_config(tmp_path, server, run={"budget": {"tokens": 50}})
    assert main(["run", str(cfg), "--no-progress", "--json"]) == 4
    captured = capsys.readouterr()
    summary = json.loads(captured.out)
    assert summary["ok"] is False and "run.budget.tokens" in summary["error"]
    assert server.request_count == 0
    rd = RunDir(load_config(cfg).run_dir)
    assert rd.stage("rubrics").done and not rd.stage("responses").done
    assert rd.stage("responses").shard_ids() == []
    assert "0 requests" in captured.err


def test_a_budget_counts_what_the_run_already_received(tmp_path, server):
    """The ledger spans invocations: a second run with a budget below what the first one
    spent stops at once."""
    cfg = write_config(tmp_path, server)
    run_pipeline(load_config(cfg), progress=False, echo=lambda s: None, until="responses")
    sent = server.request_count
    rc = main(["run", str(cfg), "--no-progress", "--set", f"run.budget.requests={sent + 1}"])
    assert rc == 4
    assert server.request_count == sent + 1  # one more request fitted, then it stopped


def test_budget_and_prices_are_checked_at_load(tmp_path):
    cfg = write_config(tmp_path, run={"budget": {"usd": 5}})
    with pytest.raises(ConfigError, match=r"run\.budget\.usd.*run\.prices"):
        load_config(cfg)
    cfg = write_config(tmp_path, run={"prices": {"input_usd_per_million": 1.0}})
    with pytest.raises(ConfigError, match="output_usd_per_million"):
        load_config(cfg)
    for bad in (
        "run.budget.tokens=0",
        "run.budget.requests=-1",
        "run.prices.input_usd_per_million=.nan",
    ):
        with pytest.raises(ConfigError):
            load_config(write_config(tmp_path), [bad])


def test_a_budget_is_not_a_setting_of_any_stage(tmp_path, server):
    """Changing the budget or the prices re-does nothing."""
    cfg = write_config(tmp_path, server)
    run_pipeline(load_config(cfg), progress=False, echo=lambda s: None)
    stats = run_pipeline(
        load_config(
            cfg,
            [
                "run.budget.tokens=10",
                "run.prices.input_usd_per_million=1",
                "run.prices.output_usd_per_million=1",
            ],
        ),
        progress=False,
        echo=lambda s: None,
    )
    assert stats == {}  # every stage skipped as done


def test_the_ledger_in_stats_status_and_the_card(tmp_path, server, capsys):
    """What was sent and received, with re-asks and cost: in each LLM stage's stats.json,
    in `prb status`, on the dataset card; and the plan's measured re-ask rate."""
    cfg = write_config(tmp_path, server, run={"prices": PRICES})
    # three unusable verdicts: each is re-asked once
    server.inject("bad_json", 3, match=lambda b: "QualityVerdict" in json.dumps(b))
    assert main(["run", str(cfg), "--no-progress"]) == 0
    config = load_config(cfg)
    rd = RunDir(config.run_dir)
    total_answers = total_prompt = total_output = 0
    for name in ("responses", "judge"):
        stats = rd.stage(name).stats()
        llm, ledger = stats["llm"], stats["ledger"]
        run = ledger["run"]
        # a fresh run: what the cache holds is what this invocation received and kept
        assert run["answers"] == llm["sent"] - (3 if name == "judge" else 0)
        assert run["reasks"] == llm["reasks"] == (3 if name == "judge" else 0)
        assert ledger["invocation"]["sent"] == llm["sent"]
        assert run["usd"] == pytest.approx(
            (run["prompt_tokens"] * 0.5 + run["completion_tokens"] * 2.0) / 1e6
        )
        total_answers += run["answers"]
        total_prompt += run["prompt_tokens"]
        total_output += run["completion_tokens"]

    assert main(["status", str(cfg)]) == 0
    out = capsys.readouterr().out
    assert out.count("ledger: ") == 2
    assert f"spent: {total_answers:,} answers (3 re-asks), {total_prompt:,} prompt" in out

    assert main(["publish", str(cfg)]) == 0
    card = (rd.release_dir / "README.md").read_text()
    assert "### What building it took" in card
    assert f"| **total** | {total_answers} | 3 | {total_prompt} | {total_output} |" in card
    release = json.loads((rd.release_dir / "release.json").read_text())
    assert release["ledger"]["total"]["answers"] == total_answers

    from pipeline.plan import estimate

    judge = next(e for e in estimate(config).stages if e.stage == "judge")
    assert judge.reask_rate == pytest.approx(3 / (total_answers - 60 - 3))
