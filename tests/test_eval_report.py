"""Eval results beside a split: the finder the audit report uses and its HTML section."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pipeline.core.errors import InputError
from pipeline.eval import metrics
from pipeline.eval.report import find_eval_results, render_eval_html
from pipeline.eval.results import default_root, leaderboard_rows, render_leaderboard, write_results


def _results(name: str, slug: str, control: bool = False) -> dict[str, Any]:
    """A results document as prb eval writes it (figures from the real metrics code)."""
    settings = {
        "question": {
            "label": "question only",
            "role": "score",
            "metrics": metrics.summary(["win", "loss", "win", "tie"]),
        },
        "profile": {
            "label": "with profile",
            "role": "score",
            "metrics": metrics.summary(["win", "win", "win", "tie"]),
        },
    }
    if control:
        settings["rubric"] = {
            "label": "control",
            "role": "control",
            "metrics": metrics.summary(["win"] * 4),
        }
    return {
        "schema": 1,
        "created": "2026-01-01T00:00:00+00:00",
        "scorer": {"kind": "pointwise", "slug": slug, "name": name},
        "split": {"path": "x", "fingerprint": "abc"},
        "settings": settings,
        "profile_gain": metrics.paired_gain(["win", "win", "win", "tie"], ["win", "loss"] * 2),
    }


def test_default_roots(tmp_path: Path) -> None:
    run = tmp_path / "run"
    (run / "publish" / "all").mkdir(parents=True)
    (run / "run.yaml").write_text("run: {}\nbackend: {}\n")
    assert default_root(run) == run / "eval"
    assert default_root(run / "publish") == run / "eval"
    f = tmp_path / "pairs.jsonl"
    f.write_text("")
    assert default_root(f) == tmp_path / "pairs-eval"
    (tmp_path / "release" / "all").mkdir(parents=True)
    assert default_root(tmp_path / "release") == tmp_path / "release-eval"


def test_find_and_render(tmp_path: Path) -> None:
    split = tmp_path / "pairs.jsonl"
    split.write_text("")
    assert find_eval_results(split) == []
    assert render_eval_html([]) == ""
    root = default_root(split)
    write_results(root, _results("<script>alert(1)</script>", "rm-evil", control=True), [])
    write_results(root, _results("judge & co", "judge-co"), [])
    (root / "broken").mkdir()
    (root / "broken" / "results.json").write_text("{not json")

    found = find_eval_results(split)
    assert [(r.get("scorer", {}).get("slug"), r.get("setting")) for r in found] == [
        (None, None),
        ("judge-co", "question"),
        ("judge-co", "profile"),
        ("rm-evil", "question"),
        ("rm-evil", "profile"),
        ("rm-evil", "rubric"),
    ]
    assert "error" in found[0]
    assert all(list(r["settings"]) == [r["setting"]] for r in found[1:])  # a file per setting
    assert find_eval_results(root)[1:] == found[1:]  # the eval root itself works too

    page = render_eval_html(found)
    assert "<script>" not in page and "&lt;script&gt;" in page
    assert "judge &amp; co" in page
    assert "rubric (control, not a score)" in page
    # profile gain: wins 1, 2, 3 with the profile against 1, 3 without -> +1 over 4 pairs
    assert "+0.250 [" in page

    md = render_leaderboard(
        json.loads(line) for line in (root / "leaderboard.jsonl").read_text().splitlines()
    )
    assert md.count("| rubric |") == 1 and "Validity controls (not scores)" in md


def _layout1(root: Path, doc: dict[str, Any], settings_on_board: list[str]) -> None:
    """An eval root as layout 1 wrote it: one results.json and scores.jsonl per scorer with
    every setting of its latest run, and leaderboard rows pointing at that one file."""
    slug = doc["scorer"]["slug"]
    (root / slug).mkdir(parents=True)
    (root / slug / "results.json").write_text(json.dumps(doc))
    scores = [
        {"pair": f"p{i}", "setting": s, "outcome": "win"} for s in doc["settings"] for i in range(4)
    ]
    (root / slug / "scores.jsonl").write_text("".join(json.dumps(r) + "\n" for r in scores))
    every = _results("x", slug, control=True)["settings"]  # a row for a setting it lost
    board = [
        {**row, "results": f"{slug}/results.json"}
        for s in settings_on_board
        for row in leaderboard_rows({**doc, "settings": {s: every[s]}})
    ]
    (root / "leaderboard.jsonl").write_text("".join(json.dumps(r) + "\n" for r in board))


def test_a_layout1_root_reads_then_moves_on_the_next_write(tmp_path: Path) -> None:
    root = tmp_path / "ev"
    old = _results("old", "rm-old")  # question and profile, in one file
    _layout1(root, old, ["question", "profile"])
    (found,) = find_eval_results(root)
    assert found["path"] == str(root / "rm-old" / "results.json")
    assert list(found["settings"]) == ["question", "profile"]
    assert "+0.250 [" in render_eval_html([found])

    # the next run of the scorer, on the rubric alone, moves the old file's settings into
    # their folders first; nothing of them is lost
    new = _results("old", "rm-old", control=True)
    new["settings"] = {"rubric": new["settings"]["rubric"]}
    new["created"] = "2026-02-02T00:00:00+00:00"
    write_results(root, new, [{"pair": "p0", "setting": "rubric", "outcome": "win"}])
    assert not (root / "rm-old" / "results.json").exists()
    assert not (root / "rm-old" / "scores.jsonl").exists()
    for setting in ("question", "profile"):
        moved = json.loads((root / "rm-old" / setting / "results.json").read_text())
        assert moved["settings"] == {setting: old["settings"][setting]}
        assert moved["moved_from"] == "rm-old/results.json (layout 1)"
        assert moved["created"] == old["created"]
        rows = (root / "rm-old" / setting / "scores.jsonl").read_text().splitlines()
        assert len(rows) == 4 and all(json.loads(r)["setting"] == setting for r in rows)
    assert (
        json.loads((root / "rm-old" / "profile" / "results.json").read_text())["profile_gain"]
        == old["profile_gain"]
    )
    board = {r["setting"]: r for r in map(json.loads, (root / "leaderboard.jsonl").open())}
    assert {s: r["results"] for s, r in board.items()} == {
        s: f"rm-old/{s}/results.json" for s in ("question", "profile", "rubric")
    }
    assert board["rubric"]["created"] == new["created"]
    assert board["question"]["created"] == old["created"]
    found = find_eval_results(root)
    assert [r["setting"] for r in found] == ["question", "profile", "rubric"]


def test_a_layout1_file_overwritten_by_another_setting(tmp_path: Path) -> None:
    """Layout 1's bug: a rubric run replaced results.json, while the leaderboard kept the
    question and profile rows pointing at it. Those rows keep their figures and lose the
    pointer (the file is gone); the rubric row gets its own file."""
    root = tmp_path / "ev"
    doc = _results("old", "rm-old", control=True)
    doc["settings"] = {"rubric": doc["settings"]["rubric"]}
    _layout1(root, doc, ["question", "profile", "rubric"])
    new = _results("old", "rm-old")
    new["settings"] = {"question": new["settings"]["question"]}
    write_results(root, new, [])
    board = {r["setting"]: r for r in map(json.loads, (root / "leaderboard.jsonl").open())}
    assert board["question"]["results"] == "rm-old/question/results.json"
    assert board["rubric"]["results"] == "rm-old/rubric/results.json"
    assert board["profile"]["results"] is None and board["profile"]["accuracy"] is not None
    assert sorted(p.parent.name for p in (root / "rm-old").glob("*/results.json")) == [
        "question",
        "rubric",
    ]


def test_a_bad_layout1_file_is_a_one_line_error(tmp_path: Path) -> None:
    root = tmp_path / "ev"
    (root / "rm-x").mkdir(parents=True)
    (root / "rm-x" / "results.json").write_text("{not json")
    with pytest.raises(InputError, match="move the scorer's folder aside") as err:
        write_results(root, _results("x", "rm-x"), [])
    assert "rm-x/results.json" in str(err.value)
    assert not (root / "rm-x" / "question").exists()  # nothing written


def _write_many(root: str, prefix: str, n: int) -> None:
    for i in range(n):
        write_results(Path(root), _results(f"{prefix}{i}", f"rm-{prefix}{i}"), [])


def test_concurrent_runs_keep_every_leaderboard_row(tmp_path: Path) -> None:
    """Two processes writing results into one root at the same time: the lock keeps each
    leaderboard rewrite from dropping the rows the other just added."""
    import multiprocessing as mp

    root = tmp_path / "ev"
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_write_many, args=(str(root), p, 15)) for p in ("a", "b")]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(120)
        assert proc.exitcode == 0
    board = [json.loads(x) for x in (root / "leaderboard.jsonl").read_text().splitlines()]
    assert len(board) == 2 * 15 * 2  # 30 scorers, question and profile each
    assert all((root / r["results"]).is_file() for r in board)
