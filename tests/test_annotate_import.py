"""`prb annotate import` reads any Label Studio export without a traceback (issue 20).

No server here: the round is exported with ``--file-only`` and the annotations come back
through ``--from-file``, a JSON export as Label Studio writes it. The run and the
annotations are SYNTHETIC (tests/test_annotate_tasks.py makes the run; the votes below are
written by hand). A task or an annotation of an unexpected shape is left out, listed with
its id and the reason, and the rest of the round is imported; a body that is not a JSON
list of tasks is one error line that changes nothing on disk.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import test_annotate_tasks as synth  # a module import: its tests are not collected twice
from conftest import disk_state

from pipeline.cli import main

SIDES = ("chosen", "rejected")


def make_round(tmp_path: Path) -> Path:
    """A SYNTHETIC run whose round 1 (10 pairs + 2 gold) was exported to a file."""
    run_dir = tmp_path / "synthetic"
    synth.make_synthetic_run(run_dir, 40)
    cfg = synth.make_config(tmp_path, sample_size=10, gold_tasks=2)
    (run_dir / "run.yaml").write_text(cfg.to_yaml())
    assert main(["annotate", "export", str(run_dir), "--round", "1", "--file-only"]) == 0
    return run_dir


def _choice(letter: Any) -> dict[str, Any]:
    return {"from_name": "choice", "to_name": "question", "type": "choices",
            "value": {"choices": [letter]}}  # fmt: skip


def _rating(stars: Any) -> dict[str, Any]:
    return {"from_name": "confidence", "to_name": "question", "type": "rating",
            "value": {"rating": stars}}  # fmt: skip


def ls_export(run_dir: Path) -> list[dict[str, Any]]:
    """A Label Studio JSON export of round 1 in which two annotators (user ids 1 and 2)
    picked the chosen answer on every task, with confidence 4. Task ids are 1..N; the
    annotation of user u on task i has id 10 * i + u."""
    out = run_dir / "annotate" / "round-1"
    tasks = json.loads((out / "tasks.json").read_text())
    sides = json.loads((out / "sides.json").read_text())
    export = []
    for i, t in enumerate(tasks, start=1):
        a_side = sides[t["data"]["task_key"]]["a_side"]
        letter = "A" if a_side == "chosen" else "B"
        annotations = [
            {
                "id": 10 * i + u,
                "completed_by": u,
                "was_cancelled": False,
                "created_at": "2026-01-01T00:00:00Z",
                "updated_at": f"2026-01-01T00:00:0{u}Z",
                "result": [_choice(letter), _rating(4)],
            }
            for u in (1, 2)
        ]
        export.append({"id": i, "data": t["data"], "annotations": annotations})
    return export


def _import(capsys, run_dir: Path, export_path: Path) -> tuple[int, str, str]:
    rc = main(["annotate", "import", str(run_dir), "--round", "1", "--from-file", str(export_path)])
    out = capsys.readouterr()
    return rc, out.out, out.err


def _read(run_dir: Path, name: str) -> Any:
    path = run_dir / "annotate" / "round-1" / name
    if name.endswith(".jsonl"):
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return json.loads(path.read_text())


@pytest.fixture
def round1(tmp_path: Path) -> tuple[Path, list[dict[str, Any]]]:
    run_dir = make_round(tmp_path)
    return run_dir, ls_export(run_dir)


def test_a_clean_export_imports_every_vote(round1, tmp_path, capsys):
    run_dir, export = round1
    path = tmp_path / "export.json"
    path.write_text(json.dumps(export))
    rc, out, err = _import(capsys, run_dir, path)
    assert rc == 0, err
    counts = _read(run_dir, "agreement.json")["counts"]
    assert counts["tasks"] == 12 and counts["votes"] == 24
    assert counts["skipped_tasks"] == counts["skipped_annotations"] == 0
    assert counts["verified"] == 10 and counts["export_file"] == str(path)
    assert _read(run_dir, "skipped.jsonl") == []
    assert "left out" not in out


# Each shape breaks task 1 (or its first annotation, id 11, by user 1) one way; the rest
# of the export stays valid. (shape, break it, skipped kind, words the reason must hold)
def _task(e: list) -> dict:
    return e[0]


def _ann(e: list) -> dict:
    return e[0]["annotations"][0]


SHAPES: list[tuple[str, Callable[[list], None], str, str]] = [
    ("unknown_choice", lambda e: _ann(e)["result"].__setitem__(0, _choice("Skip")),
     "annotation", "'Skip' is not one of A, B, tie, both bad"),
    ("choice_integer", lambda e: _ann(e)["result"].__setitem__(0, _choice(1)),
     "annotation", "choices.0: Input should be a valid string (got int)"),
    ("rating_string", lambda e: _ann(e)["result"][1]["value"].__setitem__("rating", "4"),
     "annotation", "rating: Input should be a valid"),
    ("value_list", lambda e: _ann(e)["result"][0].__setitem__("value", ["A"]),
     "annotation", "value must be an object, got list"),
    ("result_string", lambda e: _ann(e).__setitem__("result", "A"),
     "annotation", "result: Input should be a valid list (got text)"),
    ("completed_by_list", lambda e: _ann(e).__setitem__("completed_by", [1, 2]),
     "annotation", "completed_by"),
    ("updated_at_integer", lambda e: _ann(e).__setitem__("updated_at", 1767225600),
     "annotation", "updated_at: Input should be a valid string (got int)"),
    ("annotations_dict", lambda e: _task(e).__setitem__("annotations", {"0": _ann(e)}),
     "task", "annotations: Input should be a valid list (got an object)"),
    ("data_string", lambda e: _task(e).__setitem__("data", "question text"),
     "task", "data: Input should be a valid dictionary (got text)"),
    ("task_id_string", lambda e: _task(e).__setitem__("id", "1"),
     "task", "id: Input should be a valid integer (got text)"),
]  # fmt: skip


@pytest.mark.parametrize(("shape", "damage", "kind", "why"), SHAPES, ids=[s[0] for s in SHAPES])
def test_one_bad_task_or_annotation_does_not_lose_the_round(
    round1, tmp_path, capsys, shape, damage, kind, why
):
    run_dir, export = round1
    export = copy.deepcopy(export)
    damage(export)
    path = tmp_path / "export.json"
    path.write_text(json.dumps(export))
    rc, out, err = _import(capsys, run_dir, path)
    assert rc == 0, err
    assert "Traceback" not in out + err
    # reported in the output with its ids and the reason...
    shown = "task 1, annotation 11" if kind == "annotation" else "task 1:"
    lines = [ln for ln in out.splitlines() if shown in ln]
    assert len(lines) == 1 and why in lines[0], out
    # ...and in the round's files
    (skipped,) = _read(run_dir, "skipped.jsonl")
    assert skipped["kind"] == kind and why in skipped["reason"]
    assert skipped["task_id"] == (1 if shape != "task_id_string" else "1")
    counts = _read(run_dir, "agreement.json")["counts"]
    assert counts[f"skipped_{kind}s"] == 1
    # everything else is imported: the other 11 tasks' votes, and user 2's on task 1
    if kind == "task":
        assert counts["tasks"] == 11 and counts["votes"] == 22
    else:
        assert counts["tasks"] == 12 and counts["votes"] == 23
        task1 = [r for r in _read(run_dir, "annotations.jsonl") if r["task_id"] == 1]
        assert [r["annotator"] for r in task1] == ["user-2"]


@pytest.mark.parametrize(
    ("body", "words"),
    [
        (lambda e: json.dumps({"tasks": e}), "holds a JSON object, not the list of tasks"),
        (lambda e: json.dumps(e)[:-40], "not valid JSON"),
        (lambda e: "<html><body>Login</body></html>", "not valid JSON (Expecting value"),
    ],
    ids=["object", "truncated", "not_json"],
)
def test_a_body_that_is_not_a_list_of_tasks_is_one_line(round1, tmp_path, capsys, body, words):
    run_dir, export = round1
    path = tmp_path / "export.json"
    path.write_text(body(export))
    before = disk_state(tmp_path)
    rc, _, err = _import(capsys, run_dir, path)
    assert rc == 1 and "Traceback" not in err
    (line,) = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert str(path) in line and words in line and "export the project again as JSON" in line
    assert disk_state(tmp_path) == before


def test_an_unchanged_annotation_edited_later_to_a_bad_choice_is_no_vote(round1, tmp_path, capsys):
    """The annotator's latest answer decides: a newer annotation with an unknown choice
    supersedes their older valid one, so they have no vote (and it is listed)."""
    run_dir, export = round1
    newer = copy.deepcopy(_ann(export)) | {"id": 99, "updated_at": "2026-01-02T00:00:00Z"}
    newer["result"][0] = _choice("Skip")
    export[0]["annotations"].append(newer)
    path = tmp_path / "export.json"
    path.write_text(json.dumps(export))
    rc, out, _ = _import(capsys, run_dir, path)
    assert rc == 0 and "task 1, annotation 99: result[0] (choice): 'Skip'" in out
    counts = _read(run_dir, "agreement.json")["counts"]
    assert counts["votes"] == 23 and counts["superseded"] == 1


def test_a_round_never_exported_is_refused_before_anything_is_written(tmp_path, capsys):
    run_dir = tmp_path / "synthetic"
    synth.make_synthetic_run(run_dir, 20)
    (run_dir / "run.yaml").write_text(synth.make_config(tmp_path).to_yaml())
    path = tmp_path / "export.json"
    path.write_text("[]")
    before = disk_state(tmp_path)
    rc, _, err = _import(capsys, run_dir, path)
    assert rc == 1 and "Traceback" not in err
    assert "was never exported" in err and f"prb annotate export {run_dir} --round 1" in err
    assert disk_state(tmp_path) == before


# ---- round numbers ---------------------------------------------------------------------


@pytest.mark.parametrize("action", ["export", "import"])
@pytest.mark.parametrize("round_no", ["0", "-1", "99999999", "one"])
def test_round_numbers_are_checked_where_they_are_parsed(tmp_path, capsys, action, round_no):
    run_dir = tmp_path / "synthetic"
    synth.make_synthetic_run(run_dir, 20)
    (run_dir / "run.yaml").write_text(synth.make_config(tmp_path).to_yaml())
    before = disk_state(tmp_path)
    extra = ["--file-only"] if action == "export" else []
    with pytest.raises(SystemExit) as stop:
        main(["annotate", action, str(run_dir), "--round", round_no, *extra])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and "Traceback" not in err
    (line,) = [ln for ln in err.splitlines() if "error:" in ln]
    assert "argument --round" in line
    if round_no == "one":
        assert "must be a round number (1, 2, ...)" in line
    else:
        assert f"got {round_no}" in line and "the first round is --round 1" in line
    assert disk_state(tmp_path) == before


def test_a_pipe_for_the_run_or_the_export_is_named(round1, tmp_path, capsys):
    import os

    run_dir, _ = round1
    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    before = disk_state(tmp_path)
    for argv in (
        ["annotate", "import", str(pipe), "--round", "1"],
        ["annotate", "import", str(run_dir), "--round", "1", "--from-file", str(pipe)],
    ):
        assert main(argv) == 1
        err = capsys.readouterr().err
        assert "Traceback" not in err and f"{pipe}: is a named pipe" in err
    assert disk_state(tmp_path) == before


def test_a_round_short_of_votes_says_which_setting_and_publish_verified_says_why(
    round1, tmp_path, capsys
):
    """A one-annotator round said "verified 0, refuted 0, unresolved 10" without naming
    annotation.min_votes, and `prb publish --policy verified` then published nothing
    (issue 52): both now say why, naming the setting and the votes there are."""
    run_dir, export = round1
    for task in export:
        task["annotations"] = task["annotations"][:1]  # one annotator
    path = tmp_path / "export.json"
    path.write_text(json.dumps(export))
    rc, out, err = _import(capsys, run_dir, path)
    assert rc == 0, err
    assert "verified 0, refuted 0, unresolved 10" in out
    notes = [line for line in out.splitlines() if line.startswith("note: ")]
    assert len(notes) == 1, out
    assert "10 of 10 pairs have fewer votes than annotation.min_votes (2;" in notes[0]
    assert "the most any of them has is 1" in notes[0]
    assert "--set annotation.min_votes=1" in notes[0]
    counts = _read(run_dir, "agreement.json")["counts"]
    assert counts["short_of_votes"] == 10 and counts["votes_note"] == notes[0][len("note: ") :]

    before = disk_state(tmp_path)
    assert main(["publish", str(run_dir), "--policy", "verified"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no pair passes policy 'verified'" in err[0], err
    assert "10 unresolved pairs have fewer votes than annotation.min_votes (2 when" in err[0]
    assert "the most any has is 1" in err[0] and "--policy filtered" in err[0]
    assert "30 kept pairs are in no imported round" in err[0]  # 40 kept, 10 in round 1
    assert disk_state(tmp_path) == before
    # with the setting it names, the round verifies its pairs
    rc = main(["annotate", "import", str(run_dir), "--round", "1", "--from-file", str(path),
               "--set", "annotation.min_votes=1"])  # fmt: skip
    assert rc == 0 and "verified 10" in capsys.readouterr().out
