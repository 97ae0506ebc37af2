"""The judge keeps each finished row under the hash of its inputs: a re-run over the same
inputs takes rows from there (no request rebuilt, looked up or sent), equal to the rows it
would have rebuilt; any change to an input or a setting misses; a row with a verdict that
stayed invalid is never kept, so it is asked again."""

from __future__ import annotations

import copy
import json
import sqlite3

from conftest import write_config

from pipeline.config import load_config
from pipeline.orchestration.orchestrate import run_pipeline
from pipeline.run import RunDir
from pipeline.stages.base import Context
from pipeline.stages.judge import MEMO_KIND, JudgeStage


def _run(cfg_path, overrides=(), redo=None, until=None):
    cfg = load_config(cfg_path, list(overrides))
    return run_pipeline(cfg, redo=redo, until=until, progress=False, echo=lambda s: None)


def _rows(rd: RunDir, stage: str) -> list[str]:
    sd = rd.stage(stage)
    return sorted(json.dumps(r, sort_keys=True) for r in [*sd.rows(), *sd.rejects()])


def _memo_count(rd: RunDir) -> int:
    with sqlite3.connect(rd.cache_path) as db:
        return db.execute("SELECT COUNT(*) FROM derived WHERE kind=?", (MEMO_KIND,)).fetchone()[0]


def test_rerun_takes_rows_from_cache_and_they_equal_rebuilt_rows(tmp_path, server):
    cfg = write_config(tmp_path, server)
    first = _run(cfg)
    rd = RunDir(tmp_path / "outputs" / "t")
    n_examples = first["judge"]["examples"]
    assert first["judge"]["rows_from_cache"] == 0
    assert _memo_count(rd) == n_examples
    judge_rows, pair_rows = _rows(rd, "judge"), _rows(rd, "pairs")
    requests = first["judge"]["llm"]["requests"]
    sent = server.request_count

    again = _run(cfg, redo="judge")
    assert server.request_count == sent  # nothing sent
    assert again["judge"]["rows_from_cache"] == n_examples
    # counted as the cached requests they stand for
    assert again["judge"]["llm"]["requests"] == requests
    assert again["judge"]["llm"]["cached"] == requests
    assert _rows(rd, "judge") == judge_rows
    assert _rows(rd, "pairs") == pair_rows

    # without the stored rows, rebuilding from the cached answers gives the same rows
    with sqlite3.connect(rd.cache_path) as db:
        db.execute("DELETE FROM derived WHERE kind=?", (MEMO_KIND,))
    rebuilt = _run(cfg, redo="judge")
    assert rebuilt["judge"]["rows_from_cache"] == 0
    assert rebuilt["judge"]["llm"]["cached"] == requests
    assert _rows(rd, "judge") == judge_rows
    assert server.request_count == sent


def test_a_changed_setting_or_input_misses(tmp_path, server):
    cfg = write_config(tmp_path, server)
    _run(cfg)
    rd = RunDir(tmp_path / "outputs" / "t")
    n = _memo_count(rd)

    # a judge setting: every row is rebuilt (and kept under its new key)
    changed = _run(cfg, ["judge.max_pairs_per_example=1"])
    assert changed["judge"]["rows_from_cache"] == 0
    assert all(len(json.loads(r)["pairwise"]) <= 1 for r in _rows(rd, "judge"))
    assert _memo_count(rd) == 2 * n


def test_the_key_covers_every_input_of_the_row(tmp_path, server):
    cfg_path = write_config(tmp_path, server)
    _run(cfg_path, until="responses")
    cfg = load_config(cfg_path)
    rd = RunDir(tmp_path / "outputs" / "t")
    cands = [c for c in rd.stage("responses").rows()]
    ex_id = cands[0]["example_id"]
    mine = [c for c in cands if c["example_id"] == ex_id]
    questions, items = {ex_id: "q"}, {ex_id: [{"item_id": "i1", "aspect": "a"}]}
    stage = JudgeStage()
    ctx = Context(cfg, rd, progress=False)
    salt = stage.memo_salt(ctx)
    key = stage.memo_key(salt, questions, items, mine)
    assert key == stage.memo_key(salt, questions, items, copy.deepcopy(mine))
    edited = copy.deepcopy(mine)
    edited[0]["text"] += " Edited."
    reordered = [{k: c[k] for k in reversed(list(c))} for c in mine]  # same content
    others = [
        stage.memo_key(salt, questions, items, edited),
        stage.memo_key(salt, {ex_id: "q2"}, items, mine),
        stage.memo_key(salt, questions, {ex_id: [{"item_id": "i1", "aspect": "b"}]}, mine),
        stage.memo_key(salt, questions, items, mine[1:]),
    ]
    assert key not in others and len(set(others)) == len(others)
    assert stage.memo_key(salt, questions, items, reordered) == key
    for override in ("judge.max_pairs_per_example=1", "backend.max_reasks=5",
                     "judge.sampling.temperature=0.5", "run.seed=7"):  # fmt: skip
        other = Context(load_config(cfg_path, [override]), rd, progress=False)
        assert stage.memo_salt(other) != salt, override


def test_a_row_with_an_invalid_verdict_is_not_kept(tmp_path, server):
    cfg = write_config(tmp_path, server, backend={"max_reasks": 0, "invalid_retry_runs": 0})
    _run(cfg, until="responses")
    # every answer of the first quality request stays invalid (no re-ask, final at once)
    server.inject(
        "bad_json", 1, match=lambda b: "QualityVerdict" in json.dumps(b.get("response_format"))
    )
    first = _run(cfg)
    rd = RunDir(tmp_path / "outputs" / "t")
    rows = [json.loads(r) for r in _rows(rd, "judge")]
    failed = [r for r in rows if not all(v["parse_ok"] for v in r["quality"].values())]
    assert len(failed) == 1
    assert _memo_count(rd) == first["judge"]["examples"] - 1
    again = _run(cfg, redo="judge")
    assert again["judge"]["rows_from_cache"] == first["judge"]["examples"] - 1
