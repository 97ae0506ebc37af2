"""prb eval keeps each scorer's results per setting: a run of one setting never replaces
another's file, and every leaderboard row points at the file its figures came from. Runs
the real CLI with the tiny reward model (built here, no download)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from eval_split import all_texts, write_split

from pipeline.cli import main
from pipeline.eval.report import find_eval_results
from pipeline.eval.tiny import build_tiny_reward_model

SLUG = "rm-tiny-rm"
SETTINGS = ("question", "profile", "rubric")


@pytest.fixture(scope="module")
def tiny_rm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_reward_model(tmp_path_factory.mktemp("rm") / "tiny-rm", all_texts())


def _eval(split: Path, root: Path, rm: Path, *settings: str, limit: int | None = None) -> int:
    args = ["eval", str(split), "--scorer", f"rm:{rm}", "--out", str(root), "--no-progress"]
    args += [x for s in settings for x in ("--setting", s)]
    args += ["--set", "profile.top_k=2"] + (["--limit", str(limit)] if limit else [])
    return main(args)


def _files(root: Path) -> dict[str, bytes]:
    """Every file under the scorer's folder but the judge cache, by relative path."""
    return {
        str(f.relative_to(root)): f.read_bytes()
        for f in sorted((root / SLUG).rglob("*"))
        if f.is_file()
    }


def _board(root: Path) -> dict[str, dict[str, Any]]:
    rows = [json.loads(x) for x in (root / "leaderboard.jsonl").read_text().splitlines()]
    assert len(rows) == len({(r["scorer"], r["setting"]) for r in rows})  # one per pair
    return {r["setting"]: r for r in rows}


def _check_rows_point_at_their_own_files(root: Path) -> None:
    for setting, row in _board(root).items():
        assert row["results"] == f"{SLUG}/{setting}/results.json"
        doc = json.loads((root / row["results"]).read_text())
        assert doc["setting"] == setting and list(doc["settings"]) == [setting]
        m = doc["settings"][setting]["metrics"]
        assert (row["accuracy"], row["pairs"], row["ci95"]) == (
            m["accuracy"],
            m["pairs"],
            m["ci95"],
        )
        assert row["created"] == doc["created"] and row["split"] == doc["split"]["fingerprint"]
        gain = (doc.get("profile_gain") or {}).get("gain")
        assert row["profile_gain"] == gain
        scores = (root / SLUG / setting / "scores.jsonl").read_text().splitlines()
        assert len(scores) == m["pairs"]
        assert {json.loads(x)["setting"] for x in scores} == {setting}


def test_question_profile_then_rubric_then_question_again(
    tiny_rm: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    split = write_split(tmp_path)
    root = tmp_path / "ev"

    assert _eval(split, root, tiny_rm, "question", "profile") == 0
    out = capsys.readouterr().out
    assert f"results: {root / SLUG / 'question' / 'results.json'}" in out
    assert f"results: {root / SLUG / 'profile' / 'results.json'}" in out
    assert set(_board(root)) == {"question", "profile"}
    _check_rows_point_at_their_own_files(root)
    gain = _board(root)["profile"]["profile_gain"]
    assert gain is not None  # question and profile in one run
    first = _files(root)

    assert _eval(split, root, tiny_rm, "rubric") == 0
    assert "results: " + str(root / SLUG / "rubric" / "results.json") in capsys.readouterr().out
    assert set(_board(root)) == set(SETTINGS)
    _check_rows_point_at_their_own_files(root)
    second = _files(root)
    assert {k: v for k, v in second.items() if "/rubric/" not in k} == first  # untouched
    assert _board(root)["rubric"]["role"] == "control"

    # the question again, on fewer pairs so its figures differ from the first run's
    assert _eval(split, root, tiny_rm, "question", limit=4) == 0
    out = capsys.readouterr().out
    assert out.count("results: ") == 1
    board = _board(root)
    assert set(board) == set(SETTINGS)
    _check_rows_point_at_their_own_files(root)
    assert board["question"]["pairs"] == 4
    assert board["profile"]["pairs"] == board["rubric"]["pairs"] == 6
    third = _files(root)
    assert {k: v for k, v in third.items() if "/question/" not in k} == {
        k: v for k, v in second.items() if "/question/" not in k
    }
    assert third[f"{SLUG}/question/results.json"] != second[f"{SLUG}/question/results.json"]
    # the profile gain stays the one computed beside the first run's question outcomes
    assert board["profile"]["profile_gain"] == gain
    assert json.loads(third[f"{SLUG}/profile/results.json"])["profile_gain"]["pairs"] == 6

    # the finder the audit report uses: one entry per setting, in setting order
    found = find_eval_results(root)
    assert [(r["scorer"]["slug"], r["setting"]) for r in found] == [(SLUG, s) for s in SETTINGS]
    md = (root / "leaderboard.md").read_text()
    assert md.count(f"| {found[0]['scorer']['name']} |") == 3


def test_a_layout1_root_from_a_real_run_reads_and_moves(tiny_rm: Path, tmp_path: Path) -> None:
    """A root in the layout prb eval wrote until issue 21, rebuilt from a real run: one
    results.json and scores.jsonl per scorer with every setting, leaderboard rows pointing
    at it. It still reads, and the next run (rubric) moves it before writing its own."""
    split = write_split(tmp_path)
    root = tmp_path / "ev"
    assert _eval(split, root, tiny_rm, "question", "profile") == 0
    docs = {s: json.loads((root / SLUG / s / "results.json").read_text()) for s in SETTINGS[:2]}
    scores = [
        x for s in SETTINGS[:2] for x in (root / SLUG / s / "scores.jsonl").read_text().splitlines()
    ]
    figures = {s: d["settings"][s] for s, d in docs.items()}
    old = {**docs["question"], "schema": 1, "settings": figures}
    old["profile_gain"] = docs["profile"]["profile_gain"]
    del old["setting"]
    for s in SETTINGS[:2]:
        for f in (root / SLUG / s).iterdir():
            f.unlink()
        (root / SLUG / s).rmdir()
    (root / SLUG / "results.json").write_text(json.dumps(old))
    (root / SLUG / "scores.jsonl").write_text("\n".join(scores) + "\n")
    rows = [json.loads(x) for x in (root / "leaderboard.jsonl").read_text().splitlines()]
    (root / "leaderboard.jsonl").write_text(
        "".join(json.dumps({**r, "results": f"{SLUG}/results.json"}) + "\n" for r in rows)
    )

    (found,) = find_eval_results(root)
    assert found["settings"] == figures and found["profile_gain"] == old["profile_gain"]

    assert _eval(split, root, tiny_rm, "rubric") == 0
    assert not (root / SLUG / "results.json").exists()
    _check_rows_point_at_their_own_files(root)
    for s in SETTINGS[:2]:
        moved = json.loads((root / SLUG / s / "results.json").read_text())
        assert moved["settings"] == {s: figures[s]} and moved["created"] == old["created"]
    assert [r["setting"] for r in find_eval_results(root)] == list(SETTINGS)
