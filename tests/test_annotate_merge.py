"""`prb annotate import` merges, never erases (issue 28).

Votes are keyed by annotation id and task key: the same export imported twice changes no
file; an export holding none of the round's tasks (an empty list, another project's) is
refused with one line and the round's files are compared byte for byte before and after,
through --from-file and through the server path; a task whose key the round does not have
is listed in skipped.jsonl and never becomes a verdict; two tasks carrying one pair are one
pair, and a copy whose votes disagree never makes it verified. `--replace` is the one way
to drop earlier votes. The run and the votes are SYNTHETIC (tests/test_annotate_tasks.py).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import test_annotate_import as base  # a module import: its tests are not collected twice
from conftest import disk_state

from pipeline.annotate.errors import LabelStudioError
from pipeline.annotate.importer import import_round
from pipeline.cli import main
from pipeline.config import load_config

ROUND_FILES = ("annotations.jsonl", "verdicts.jsonl", "adjudication.jsonl", "agreement.json",
               "skipped.jsonl")  # fmt: skip


def _import(
    capsys, run_dir: Path, export: Any, tmp_path: Path, *extra: str
) -> tuple[int, str, str]:
    path = tmp_path / "export.json"
    path.write_text(json.dumps(export))
    rc = main(["annotate", "import", str(run_dir), "--round", "1", "--from-file", str(path),
               *extra])  # fmt: skip
    out = capsys.readouterr()
    return rc, out.out, out.err


def _round(run_dir: Path) -> Path:
    return run_dir / "annotate" / "round-1"


def _verdicts(run_dir: Path) -> dict[str, dict[str, Any]]:
    rows = base._read(run_dir, "verdicts.jsonl")
    by_pair = {v["pair_id"]: v for v in rows}
    assert len(by_pair) == len(rows), "two verdict rows for one pair"
    return by_pair


def _only_user(export: list[dict], user: int) -> list[dict]:
    out = copy.deepcopy(export)
    for t in out:
        t["annotations"] = [a for a in t["annotations"] if a["completed_by"] == user]
    return out


@pytest.fixture
def round1(tmp_path: Path) -> tuple[Path, list[dict[str, Any]]]:
    run_dir = base.make_round(tmp_path)
    return run_dir, base.ls_export(run_dir)


def test_the_same_export_twice_changes_no_file(round1, tmp_path, capsys):
    run_dir, export = round1
    assert _import(capsys, run_dir, export, tmp_path)[0] == 0
    before = disk_state(_round(run_dir))
    rc, out, err = _import(capsys, run_dir, export, tmp_path)
    assert rc == 0, err
    assert "0 new and 0 changed votes merged with 24 from earlier imports" in out, out
    assert disk_state(_round(run_dir)) == before  # agreement.json's time included
    assert base._read(run_dir, "agreement.json")["counts"]["votes"] == 24


@pytest.mark.parametrize(
    "other",
    [
        lambda e: [],
        lambda e: [{"id": 7, "data": {"text": "another project's task"}, "annotations": []}],
        lambda e: [{**t, "data": {**t["data"], "task_key": "other-" + t["data"]["task_key"]}}
                   for t in e],
    ],
    ids=["empty_list", "another_project", "other_task_keys"],
)  # fmt: skip
def test_an_export_without_the_rounds_tasks_is_refused_and_keeps_the_votes(
    round1, tmp_path, capsys, other
):
    run_dir, export = round1
    assert _import(capsys, run_dir, export, tmp_path)[0] == 0
    assert len(base._read(run_dir, "annotations.jsonl")) == 24
    before = disk_state(_round(run_dir))
    rc, _, err = _import(capsys, run_dir, other(export), tmp_path)
    assert rc == 1 and "Traceback" not in err
    (line,) = err.strip().splitlines()
    assert "holds none of round 1's 12 tasks" in line and "left as it was" in line, line
    assert str(tmp_path / "export.json") in line
    assert disk_state(_round(run_dir)) == before
    assert len(base._read(run_dir, "annotations.jsonl")) == 24
    assert sum(v["status"] == "verified" for v in _verdicts(run_dir).values()) == 10


def test_imports_merge_and_replace_is_explicit(round1, tmp_path, capsys):
    run_dir, export = round1
    assert _import(capsys, run_dir, _only_user(export, 1), tmp_path)[0] == 0
    rc, out, _ = _import(capsys, run_dir, _only_user(export, 2), tmp_path)
    assert rc == 0 and "12 new and 0 changed votes merged with 12 from earlier" in out, out
    rows = base._read(run_dir, "annotations.jsonl")
    assert len(rows) == 24 and {r["annotator"] for r in rows} == {"user-1", "user-2"}
    assert all(v["n_votes"] == 2 for v in _verdicts(run_dir).values())

    rc, out, _ = _import(capsys, run_dir, _only_user(export, 1), tmp_path, "--replace")
    assert rc == 0 and "replaced the round's earlier votes" in out
    rows = base._read(run_dir, "annotations.jsonl")
    assert len(rows) == 12 and {r["annotator"] for r in rows} == {"user-1"}


def test_a_changed_vote_replaces_the_earlier_one(round1, tmp_path, capsys):
    run_dir, export = round1
    assert _import(capsys, run_dir, export, tmp_path)[0] == 0
    edited = copy.deepcopy(export)
    ann = edited[0]["annotations"][0]  # task 1, user 1: picks the other answer later
    letter = ann["result"][0]["value"]["choices"][0]
    ann["result"][0]["value"]["choices"] = ["B" if letter == "A" else "A"]
    ann["updated_at"] = "2026-02-01T00:00:00Z"
    rc, out, _ = _import(capsys, run_dir, edited, tmp_path)
    assert rc == 0 and "0 new and 1 changed votes" in out, out
    rows = base._read(run_dir, "annotations.jsonl")
    assert len(rows) == 24
    mine = [r for r in rows if r["task_id"] == 1 and r["annotator"] == "user-1"]
    assert len(mine) == 1 and mine[0]["label"] == "rejected"


def test_a_task_of_an_unknown_key_is_skipped_never_a_verdict(round1, tmp_path, capsys):
    run_dir, export = round1
    extra = copy.deepcopy(export[0])
    extra["id"] = 500
    extra["data"] = {**extra["data"], "task_key": "made-up-key", "pair_id": "made-up",
                     "a_side": "chosen"}  # fmt: skip
    rc, out, err = _import(capsys, run_dir, [*export, extra], tmp_path)
    assert rc == 0, err
    assert "task 500: task_key 'made-up-key' is not a task of round 1" in out, out
    (skipped,) = base._read(run_dir, "skipped.jsonl")
    assert skipped["task_id"] == 500 and skipped["task_key"] == "made-up-key"
    verdicts = base._read(run_dir, "verdicts.jsonl")
    assert len(verdicts) == 10 and all(v["pair_id"] for v in verdicts)
    assert "made-up" not in {v["pair_id"] for v in verdicts}
    assert not [r for r in base._read(run_dir, "annotations.jsonl") if r["task_id"] == 500]


@pytest.mark.parametrize("new_ids", [False, True], ids=["same_ids", "new_ids"])
def test_every_task_twice_counts_each_vote_once(round1, tmp_path, capsys, new_ids):
    run_dir, export = round1
    twice = copy.deepcopy(export)
    for t in copy.deepcopy(export):
        if new_ids:  # a second copy of the project's tasks, annotated the same way again
            t["id"] += 100
            for a in t["annotations"]:
                a["id"] += 1000
        twice.append(t)
    rc, out, err = _import(capsys, run_dir, twice, tmp_path)
    assert rc == 0, err
    counts = base._read(run_dir, "agreement.json")["counts"]
    assert counts["votes"] == 24 and counts["duplicate_task_keys"] == 12
    assert counts["conflicts"] == 0
    verdicts = _verdicts(run_dir)  # one row per pair
    assert len(verdicts) == 10 and all(v["n_votes"] == 2 for v in verdicts.values())
    assert len(base._read(run_dir, "annotations.jsonl")) == 24
    assert "12 tasks repeat a task already in the export" in out


def _split(export: list[dict]) -> tuple[list[dict], str]:
    """Task 1 voted 1-1 (user 1 for the chosen answer, user 2 against); its pair id."""
    export = copy.deepcopy(export)
    a2 = export[0]["annotations"][1]
    letter = a2["result"][0]["value"]["choices"][0]
    a2["result"][0]["value"]["choices"] = ["B" if letter == "A" else "A"]
    return export, export[0]["data"]["pair_id"]


@pytest.mark.parametrize("voters", [(3, 4), (1, 2)], ids=["new_annotators", "same_annotators"])
def test_a_conflicting_copy_never_makes_a_pair_verified(round1, tmp_path, capsys, voters):
    run_dir, export = round1
    export, pair = _split(export)
    copy_task = copy.deepcopy(export[0])
    copy_task["id"] = 999
    agree = copy.deepcopy(export[0]["annotations"][0])  # user 1's vote for the chosen answer
    copy_task["annotations"] = [agree | {"id": 9000 + u, "completed_by": u} for u in voters]
    rc, out, err = _import(capsys, run_dir, [*export, copy_task], tmp_path, "--set",
                           "annotation.min_votes=2")  # fmt: skip
    assert rc == 0, err
    v = _verdicts(run_dir)[pair]
    assert v["status"] == "unresolved" and v["task_ids"] == [1, 999] and v["conflict"]
    counts = base._read(run_dir, "agreement.json")["counts"]
    assert counts["conflicts"] == 1 and counts["conflicting_pairs"][0]["pair_id"] == pair
    assert f"conflict: pair {pair} is in tasks 1, 999" in out, out
    adjudication = {a["pair_id"]: a for a in base._read(run_dir, "adjudication.jsonl")}
    assert "conflicting_copies" in adjudication[pair]["reasons"]
    # without the copy the same votes leave the pair unresolved too: the copy decided nothing
    rc, _, _ = _import(capsys, run_dir, export, tmp_path, "--replace", "--set",
                       "annotation.min_votes=2")  # fmt: skip
    assert rc == 0 and _verdicts(run_dir)[pair]["status"] == "unresolved"


class _Chunks:
    def __init__(self, body: bytes) -> None:
        self.body = body

    def download_sync(self, project_id: int, **kw: Any) -> bytes:
        return self.body


def _fake_client(run_dir: Path, body: bytes) -> Any:
    """Just enough of the Label Studio SDK client for the import's server path."""
    from pipeline.annotate.tasks import project_title

    project = SimpleNamespace(id=3, title=project_title(run_dir, 1))
    return SimpleNamespace(
        _client_wrapper=SimpleNamespace(get_base_url=lambda: "http://127.0.0.1:9"),
        users=SimpleNamespace(whoami=lambda: SimpleNamespace(id=1, email="a@b"),
                              list=lambda: []),
        projects=SimpleNamespace(list=lambda **kw: [project], get=lambda id: project,
                                 exports=_Chunks(body)),
    )  # fmt: skip


def test_the_server_path_refuses_an_export_without_the_rounds_tasks(round1, tmp_path, capsys):
    run_dir, export = round1
    cfg = load_config(run_dir / "run.yaml")
    import_round(cfg, run_dir, 1, client=_fake_client(run_dir, json.dumps(export).encode()))
    assert len(base._read(run_dir, "annotations.jsonl")) == 24
    before = disk_state(_round(run_dir))
    with pytest.raises(LabelStudioError, match="holds none of round 1's 12 tasks") as got:
        import_round(cfg, run_dir, 1, client=_fake_client(run_dir, b"[]"))
    assert "the export of project 3 at http://127.0.0.1:9" in str(got.value)
    assert disk_state(_round(run_dir)) == before


@pytest.mark.parametrize(
    "damage",
    ['{"task_key": "x"', '{"task_key": 3}', '{"task_key": "k", "label": "chosen"}'],
    ids=["cut_short", "key_not_text", "fields_missing"],
)
def test_a_damaged_earlier_import_is_named_and_nothing_changes(round1, tmp_path, capsys, damage):
    run_dir, export = round1
    assert _import(capsys, run_dir, export, tmp_path)[0] == 0
    annotations = _round(run_dir) / "annotations.jsonl"
    annotations.write_text(annotations.read_text() + damage + "\n")
    before = disk_state(_round(run_dir))
    rc, _, err = _import(capsys, run_dir, export, tmp_path)
    assert rc == 1
    (line,) = err.strip().splitlines()
    assert f"{annotations}, line 25" in line and "--replace" in line, line
    assert disk_state(_round(run_dir)) == before
    # --replace rebuilds the round from the export alone
    rc, _, err = _import(capsys, run_dir, export, tmp_path, "--replace")
    assert rc == 0, err
    assert len(base._read(run_dir, "annotations.jsonl")) == 24
