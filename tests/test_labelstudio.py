"""Round trips through a REAL Label Studio server (no mock), started once per test session.

The server runs from its own virtualenv: env ``PRB_LABEL_STUDIO_VENV``, default
``.labelstudio/venv`` in the repository root. Without it these tests skip, unless ``CI`` is
set, where they fail. It listens on a free loopback port with a fresh data dir under the
session's temporary folder and is stopped at the end of the session.

Users: three annotators are created through the API (``POST /api/users/``) by the preset
admin. The open-source server gives an admin no way to obtain another user's token, so
their annotations are created by the admin with ``completed_by`` set to each annotator,
which the API allows; the export attributes them to the annotators exactly like
annotations submitted in the UI.

All run data here is SYNTHETIC (see ``make_synthetic_run``).
"""

from __future__ import annotations

import importlib.util
import json
import os
import secrets
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from pipeline.annotate.errors import LabelStudioError
from pipeline.annotate.export import connect, export_round, find_project
from pipeline.annotate.importer import import_round
from pipeline.annotate.server import LabelStudioServer, free_port, local_credentials

sys.path.insert(0, str(Path(__file__).resolve().parent))
import test_annotate_tasks as synth  # a module import: its tests are not collected twice

ROOT = Path(__file__).resolve().parent.parent
VENV = Path(os.environ.get("PRB_LABEL_STUDIO_VENV", ROOT / ".labelstudio" / "venv"))

pytestmark = pytest.mark.labelstudio


@pytest.fixture(scope="session")
def ls_server(tmp_path_factory):
    if importlib.util.find_spec("label_studio_sdk") is None:
        reason = "label-studio-sdk is not installed: pip install -e '.[annotate]'"
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    if not (VENV / "bin" / "label-studio").exists():
        reason = (
            f"no Label Studio server venv at {VENV}: create it with `python3 -m venv {VENV} && "
            f"{VENV}/bin/pip install label-studio==1.23.2`, or point PRB_LABEL_STUDIO_VENV at one"
        )
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    data_dir = tmp_path_factory.mktemp("labelstudio-data")
    server = LabelStudioServer(
        VENV,
        data_dir,
        port=free_port(),
        token=secrets.token_hex(20),
        password=secrets.token_urlsafe(12),
        startup_timeout=240,
    )
    with server:
        yield server
    assert not server.running


@pytest.fixture(scope="session")
def client(ls_server):
    from label_studio_sdk import LabelStudio

    return LabelStudio(base_url=ls_server.url, api_key=ls_server.token, timeout=120)


@pytest.fixture(scope="session")
def annotators(client) -> dict[str, int]:
    """Three annotators created through the API: name -> user id."""
    ids = {}
    for name in ("ann1", "ann2", "ann3"):
        user = client.users.create(
            username=name, email=f"{name}@prb.test", password=secrets.token_urlsafe(12)
        )
        ids[name] = user.id
    listed = {u.email for u in client.users.list()}
    assert {f"{n}@prb.test" for n in ids} <= listed
    return ids


def _run(tmp_path: Path, n: int, **kw) -> tuple[Path, list[dict]]:
    """A synthetic run whose folder name (and so its project titles) is unique per test."""
    run_dir = tmp_path / f"run-{tmp_path.name}"
    return run_dir, synth.make_synthetic_run(run_dir, n, **kw)


def _config(tmp_path: Path, server: LabelStudioServer, **annotation):
    return synth.make_config(tmp_path, url=server.url, **annotation)


def _sides(run_dir: Path, round_no: int = 1) -> dict[str, str]:
    """task_key -> a_side, from the round's private sides.json (never sent to the server)."""
    path = run_dir / "annotate" / f"round-{round_no}" / "sides.json"
    return {k: v["a_side"] for k, v in json.loads(path.read_text()).items()}


def _tasks_by_key(client, project_id: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for t in client.tasks.list(project=project_id, fields="task_only", page_size=500):
        assert t.data["task_key"] not in out, "duplicate task on the server"
        out[t.data["task_key"]] = t
    return out


def _result(choice: str, *, flags=(), rating=None, comment=None) -> list[dict]:
    res = [
        {
            "from_name": "choice",
            "to_name": "question",
            "type": "choices",
            "value": {"choices": [choice]},
        }
    ]
    if flags:
        res.append(
            {
                "from_name": "flags",
                "to_name": "question",
                "type": "choices",
                "value": {"choices": list(flags)},
            }
        )
    if rating is not None:
        res.append(
            {
                "from_name": "confidence",
                "to_name": "question",
                "type": "rating",
                "value": {"rating": rating},
            }
        )
    if comment:
        res.append(
            {
                "from_name": "comment",
                "to_name": "question",
                "type": "textarea",
                "value": {"text": [comment]},
            }
        )
    return res


def _letter(label: str, a_side: str) -> str:
    """The choice an annotator clicks to mean ``label`` on a task with this a_side."""
    if label in ("chosen", "rejected"):
        return "A" if label == a_side else "B"
    return {"tie": "tie", "both_bad": "both bad"}[label]


def _read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# ---- export --------------------------------------------------------------------------------


def test_export_200_tasks_then_again_adds_nothing(tmp_path, ls_server, client):
    run_dir, _ = _run(tmp_path, 220)
    cfg = _config(tmp_path, ls_server, sample_size=190, gold_tasks=10, batch_size=64)

    first = export_round(cfg, run_dir, 1, client=client)
    assert first["sent"] == 200 and first["already_there"] == 0
    assert first["project_created"] is True
    on_server = _tasks_by_key(client, first["project_id"])
    local = json.loads((run_dir / "annotate" / "round-1" / "tasks.json").read_text())
    assert set(on_server) == {t["data"]["task_key"] for t in local}
    assert sum(1 for k in on_server if k.startswith("gold:")) == 10
    # the pair id travels with each task; the answer key (which side is A) does not
    sides = _sides(run_dir)
    assert set(sides) == set(on_server)
    assert set(sides.values()) == {"chosen", "rejected"}
    for t in local:
        server_data = on_server[t["data"]["task_key"]].data
        assert server_data["pair_id"] == t["data"]["pair_id"]
        assert "a_side" not in server_data and "expected" not in server_data
        assert "a_side" not in t["data"] and "expected" not in t["data"]

    second = export_round(cfg, run_dir, 1, client=client)
    assert second["sent"] == 0 and second["already_there"] == 200
    assert second["project_created"] is False
    assert second["project_id"] == first["project_id"]
    assert len(_tasks_by_key(client, first["project_id"])) == 200
    info = json.loads((run_dir / "annotate" / "round-1" / "export.json").read_text())
    assert info["status"] == "complete" and info["tasks_on_server"] == 200
    assert info["url"] == ls_server.url
    assert ls_server.token not in (run_dir / "annotate" / "round-1" / "export.json").read_text()


class _DropsAfter:
    """A real SDK client whose task import fails after ``n`` batches (a dropped connection)."""

    def __init__(self, client, n: int) -> None:
        self._client, self._left = client, n

    def __getattr__(self, name):
        return getattr(self._client, name)

    @property
    def projects(self):
        outer = self

        class _Projects:
            def __getattr__(self, name):
                return getattr(outer._client.projects, name)

            def import_tasks(self, **kw):
                if outer._left == 0:
                    raise ConnectionError("connection dropped (simulated)")
                outer._left -= 1
                return outer._client.projects.import_tasks(**kw)

        return _Projects()


def test_interrupted_export_resumes_without_duplicates(tmp_path, ls_server, client):
    run_dir, _ = _run(tmp_path, 120)
    cfg = _config(tmp_path, ls_server, sample_size=95, gold_tasks=5, batch_size=30)
    with pytest.raises(ConnectionError):
        export_round(cfg, run_dir, 1, client=_DropsAfter(client, 2))
    info = json.loads((run_dir / "annotate" / "round-1" / "export.json").read_text())
    assert info["status"] == "interrupted" and info["sent"] == 60
    assert len(_tasks_by_key(client, info["project_id"])) == 60

    again = export_round(cfg, run_dir, 1, client=client)
    assert again["already_there"] == 60 and again["sent"] == 40
    assert len(_tasks_by_key(client, info["project_id"])) == 100


# ---- import --------------------------------------------------------------------------------


def test_import_keeps_every_vote_and_counts_right(tmp_path, ls_server, client, annotators):
    run_dir, _ = _run(tmp_path, 60)
    cfg = _config(tmp_path, ls_server, sample_size=20, gold_tasks=2)
    exp = export_round(cfg, run_dir, 1, client=client)
    tasks = _tasks_by_key(client, exp["project_id"])
    sides = _sides(run_dir)
    pair_keys = sorted(k for k in tasks if not k.startswith("gold:"))
    u1, u2, u3 = annotators["ann1"], annotators["ann2"], annotators["ann3"]

    def annotate(key, user, label, **kw):
        t = tasks[key]
        return client.annotations.create(
            id=t.id, result=_result(_letter(label, sides[key]), **kw), completed_by=user
        )

    k0, k1, k2, k3, k4 = pair_keys[:5]
    # k0: two annotations that disagree
    annotate(k0, u1, "chosen", rating=5, comment="clear")
    annotate(k0, u2, "rejected", flags=["general quality differs"])
    # k1: three annotators, one of whom edits their answer afterwards (latest wins)
    annotate(k1, u1, "chosen")
    annotate(k1, u2, "chosen")
    edited = annotate(k1, u3, "rejected")
    client.annotations.update(id=edited.id, result=_result(_letter("chosen", sides[k1])))
    # k2: one vote and one skip (cancelled annotations are not votes)
    annotate(k2, u1, "both_bad")
    client.annotations.create(id=tasks[k2].id, result=[], was_cancelled=True, completed_by=u2)
    # k3: the same annotator submits twice; only the newer one counts
    annotate(k3, u2, "rejected")
    annotate(k3, u2, "tie")
    # k4: a single skip and nothing else
    client.annotations.create(id=tasks[k4].id, result=[], was_cancelled=True, completed_by=u3)

    summary = import_round(cfg, run_dir, 1, client=client)
    out = run_dir / "annotate" / "round-1"
    rows = _read_jsonl(out / "annotations.jsonl")
    verdicts = {v["task_key"]: v for v in _read_jsonl(out / "verdicts.jsonl")}

    assert summary["tasks"] == 22 and summary["pair_tasks"] == 20 and summary["gold_tasks"] == 2
    assert summary["annotations_total"] == 10  # everything the server holds
    assert summary["superseded"] == 1  # k3's first submission
    assert summary["annotation_rows"] == len(rows) == 9  # one per (task, annotator)
    assert summary["cancelled"] == 2
    assert summary["votes"] == 7
    assert summary["annotated_tasks"] == 4  # k4 has only a skip
    assert summary["unannotated_tasks"] == 18
    assert summary["annotators"] == 3
    assert len(verdicts) == 20  # unannotated pairs are listed too, not lost

    assert verdicts[k0]["n_votes"] == 2 and verdicts[k0]["majority"] is None
    assert verdicts[k0]["votes"] == {"chosen": 1, "rejected": 1}
    assert verdicts[k0]["flags"]["general_quality_differs"] == 1
    assert verdicts[k1]["votes"] == {"chosen": 3}  # the edit turned ann3's vote to chosen
    assert verdicts[k1]["status"] == "verified"
    assert verdicts[k2]["n_votes"] == 1 and verdicts[k2]["status"] == "unresolved"
    assert verdicts[k3]["votes"] == {"tie": 1}
    assert verdicts[k4]["n_votes"] == 0
    untouched = [k for k in pair_keys if k not in (k0, k1, k2, k3, k4)]
    assert all(verdicts[k]["n_votes"] == 0 for k in untouched)

    r0 = {r["annotator"]: r for r in rows if r["task_key"] == k0}
    assert set(r0) == {"ann1@prb.test", "ann2@prb.test"}
    assert r0["ann1@prb.test"]["confidence"] == 5
    assert r0["ann1@prb.test"]["comment"] == "clear"
    assert r0["ann1@prb.test"]["annotator_id"] == u1
    assert r0["ann1@prb.test"]["choice"] == _letter("chosen", sides[k0])
    skip = next(r for r in rows if r["task_key"] == k2 and r["was_cancelled"])
    assert skip["label"] is None and skip["annotator"] == "ann2@prb.test"
    assert all(r["updated_at"] for r in rows)

    adjudication = {a["task_key"]: a for a in _read_jsonl(out / "adjudication.jsonl")}
    assert set(adjudication) == {k0}
    assert adjudication[k0]["reasons"] == ["no_majority", "general_quality_differs"]
    assert adjudication[k0]["comments"] == ["clear"]

    # importing again changes nothing: the same figures, no new or changed vote
    again = import_round(cfg, run_dir, 1, client=client)
    assert again["new_votes"] == again["changed_votes"] == 0
    assert again["kept_from_earlier_imports"] == len(rows)
    this_import = ("new_votes", "changed_votes", "kept_from_earlier_imports")
    assert {k: v for k, v in again.items() if k not in this_import} == {
        k: v for k, v in summary.items() if k not in this_import
    }


def test_agreement_matches_hand_computed_values(tmp_path, ls_server, client, annotators):
    """A crafted round through the server; every figure below is worked out by hand.

    Votes (pairs P1..P4 in task-key order; "-" = no vote):

        P1: chosen   chosen   chosen
        P2: chosen   chosen   rejected
        P3: rejected rejected (skip)
        P4: tie      chosen   -

    Raw agreement: vote pairs per item 3+3+1+1 = 8, agreeing 3+1+1+0 = 5 -> 0.625.
    Krippendorff's alpha (nominal): coincidences o_cc = 3+1 = 4, o_cr = o_rc = 1, o_rr = 2,
    o_ct = o_tc = 1; n_c = 6, n_r = 3, n_t = 1, n = 10; observed off-diagonal 4, expected
    n^2 - sum n_c^2 = 100 - 46 = 54; alpha = 1 - 9 * 4 / 54 = 1/3.
    Cohen's kappa ann1|ann2 on P1..P4: po = 3/4, pe = (2*3 + 1*1)/16 = 7/16,
    kappa = (12/16 - 7/16) / (9/16) = 5/9. ann1|ann3 and ann2|ann3 on P1, P2: po = 1/2,
    pe = 1/2, kappa = 0.
    Majority: P1, P2 chosen (verified), P3 rejected (refuted), P4 none (unresolved).
    Judge (synthetic rows prefer chosen in both orders for these pairs): agrees on P1, P2,
    not P3; P4 has no human verdict -> 2/3 over n = 3.
    Gold: ann1 picks the on-topic answer, ann2 the off-topic one -> 1.0 and 0.0.
    """
    # a judge that prefers chosen in both orders on every pair keeps human-vs-judge simple
    run_dir, pairs = _run(tmp_path, 14, split_judge_every=0)
    cfg = _config(tmp_path, ls_server, sample_size=4, gold_tasks=1, stratify_by=["category"])
    exp = export_round(cfg, run_dir, 1, client=client)
    tasks = _tasks_by_key(client, exp["project_id"])
    sides = _sides(run_dir)
    pair_keys = sorted(k for k in tasks if not k.startswith("gold:"))
    assert len(pair_keys) == 4
    aware = [p["judge"]["pairwise"]["pairwise_aware"] for p in pairs]
    assert all(a["AB"]["prefers"] == a["BA"]["prefers"] == "chosen" for a in aware)
    gold_key = next(k for k in tasks if k.startswith("gold:"))
    names = ("ann1", "ann2", "ann3")
    plan = {
        pair_keys[0]: ("chosen", "chosen", "chosen"),
        pair_keys[1]: ("chosen", "chosen", "rejected"),
        pair_keys[2]: ("rejected", "rejected", "skip"),
        pair_keys[3]: ("tie", "chosen", None),
        gold_key: ("chosen", "rejected", None),
    }
    for key, labels in plan.items():
        t = tasks[key]
        for name, label in zip(names, labels, strict=True):
            if label is None:
                continue
            if label == "skip":
                client.annotations.create(
                    id=t.id, result=[], was_cancelled=True, completed_by=annotators[name]
                )
                continue
            client.annotations.create(
                id=t.id,
                result=_result(_letter(label, sides[key])),
                completed_by=annotators[name],
            )

    summary = import_round(cfg, run_dir, 1, client=client)
    ag = json.loads((run_dir / "annotate" / "round-1" / "agreement.json").read_text())

    assert ag["items"] == 4 and ag["annotations"] == 10 and ag["annotators"] == 3
    assert ag["raw_agreement"] == pytest.approx(0.625)
    assert ag["krippendorff_alpha"] == pytest.approx(1 / 3)
    kappa = ag["pairwise_kappa"]
    assert kappa["ann1@prb.test|ann2@prb.test"]["kappa"] == pytest.approx(5 / 9)
    assert kappa["ann1@prb.test|ann2@prb.test"]["n_items"] == 4
    assert kappa["ann1@prb.test|ann3@prb.test"]["kappa"] == pytest.approx(0.0)
    assert kappa["ann2@prb.test|ann3@prb.test"]["n_items"] == 2
    assert ag["human_vs_judge"]["n"] == 3
    assert ag["human_vs_judge"]["agreement"] == pytest.approx(2 / 3)
    assert ag["gold_accuracy"]["ann1@prb.test"]["accuracy"] == 1.0
    assert ag["gold_accuracy"]["ann2@prb.test"]["accuracy"] == 0.0
    assert ag["gold_accuracy_overall"] == pytest.approx(0.5)

    verdicts = {v["task_key"]: v for v in _read_jsonl(run_dir / "annotate/round-1/verdicts.jsonl")}
    assert [verdicts[k]["status"] for k in pair_keys] == [
        "verified",
        "verified",
        "refuted",
        "unresolved",
    ]
    assert verdicts[pair_keys[1]]["share"] == pytest.approx(2 / 3, abs=1e-4)
    assert verdicts[pair_keys[2]]["n_votes"] == 2  # the skip is not a vote
    assert summary["verified"] == 2 and summary["refuted"] == 1 and summary["unresolved"] == 1
    adjudication = _read_jsonl(run_dir / "annotate/round-1/adjudication.jsonl")
    assert [a["task_key"] for a in adjudication] == [pair_keys[3]]


def test_a_choice_added_in_the_ui_is_left_out_and_listed(tmp_path, ls_server, client, annotators):
    """Someone added "Skip" to the choices in the UI and an annotator used it: that
    annotation is listed in skipped.jsonl, every other vote is imported."""
    run_dir, _ = _run(tmp_path, 20)
    cfg = _config(tmp_path, ls_server, sample_size=4, gold_tasks=0)
    exp = export_round(cfg, run_dir, 1, client=client)
    tasks = _tasks_by_key(client, exp["project_id"])
    sides = _sides(run_dir)
    k0, k1 = sorted(tasks)[:2]
    u1, u2 = annotators["ann1"], annotators["ann2"]
    client.annotations.create(id=tasks[k0].id, result=_result("Skip"), completed_by=u1)
    client.annotations.create(
        id=tasks[k0].id, result=_result(_letter("chosen", sides[k0])), completed_by=u2
    )
    client.annotations.create(
        id=tasks[k1].id, result=_result(_letter("tie", sides[k1])), completed_by=u1
    )

    summary = import_round(cfg, run_dir, 1, client=client)
    assert summary["votes"] == 2 and summary["skipped_annotations"] == 1
    (row,) = _read_jsonl(run_dir / "annotate" / "round-1" / "skipped.jsonl")
    assert row["task_id"] == tasks[k0].id and row["annotator"] == "ann1@prb.test"
    assert "'Skip' is not one of A, B, tie, both bad" in row["reason"]
    verdicts = {v["task_key"]: v for v in _read_jsonl(run_dir / "annotate/round-1/verdicts.jsonl")}
    assert verdicts[k0]["votes"] == {"chosen": 1} and verdicts[k1]["votes"] == {"tie": 1}


# ---- failures before anything is sent ------------------------------------------------------


def test_server_down_is_a_clear_error_before_anything_is_sent(tmp_path, ls_server):
    run_dir, _ = _run(tmp_path, 30)
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    cfg = synth.make_config(tmp_path, url=dead, sample_size=10, gold_tasks=0)
    os.environ["PRB_TEST_LS_TOKEN"] = "a-token-that-must-not-leak-1234"
    try:
        cfg.annotation.token_env = "PRB_TEST_LS_TOKEN"
        with pytest.raises(LabelStudioError) as err:
            export_round(cfg, run_dir, 1)
    finally:
        del os.environ["PRB_TEST_LS_TOKEN"]
    msg = str(err.value)
    assert dead in msg and "cannot reach" in msg
    assert "must-not-leak" not in msg
    assert not (run_dir / "annotate" / "round-1").exists()  # nothing written, nothing sent


def test_wrong_token_is_a_clear_error_before_anything_is_sent(tmp_path, ls_server, client):
    run_dir, _ = _run(tmp_path, 30)
    cfg = _config(tmp_path, ls_server, sample_size=10, gold_tasks=0)
    wrong = "f" * 40
    with pytest.raises(LabelStudioError) as err:
        connect(cfg, token=wrong)
    msg = str(err.value)
    assert ls_server.url in msg and "rejected the token" in msg and wrong not in msg

    os.environ[cfg.annotation.token_env] = wrong
    try:
        with pytest.raises(LabelStudioError, match="rejected the token"):
            export_round(cfg, run_dir, 1)
        with pytest.raises(LabelStudioError, match="rejected the token"):
            import_round(cfg, run_dir, 1)
    finally:
        del os.environ[cfg.annotation.token_env]
    assert find_project(client, f"prb {run_dir.name} round 1") is None
    assert not (run_dir / "annotate" / "round-1" / "tasks.json").exists()


def test_missing_token_names_the_variable(tmp_path, ls_server, monkeypatch):
    monkeypatch.delenv("LABEL_STUDIO_API_KEY", raising=False)
    cfg = _config(tmp_path, ls_server)
    with pytest.raises(LabelStudioError, match="LABEL_STUDIO_API_KEY"):
        connect(cfg)


def test_import_of_a_round_never_exported_says_so(tmp_path, ls_server, client):
    run_dir, _ = _run(tmp_path, 10)
    cfg = _config(tmp_path, ls_server)
    with pytest.raises(LabelStudioError, match="prb annotate export"):
        import_round(cfg, run_dir, 5, client=client)


# ---- the server itself ---------------------------------------------------------------------


def test_busy_port_fails_clearly_instead_of_moving(tmp_path, ls_server):
    other = LabelStudioServer(
        VENV, tmp_path / "ls2", port=ls_server.port, token="x" * 40, password="pw-unused"
    )
    with pytest.raises(LabelStudioError, match=f"port {ls_server.port} .* already in use"):
        other.start()
    assert not other.running
    assert "x" * 40 not in repr(other)


def test_server_is_local_and_keeps_its_data_in_its_data_dir(ls_server):
    assert ls_server.url.startswith("http://127.0.0.1:")
    assert (ls_server.data_dir / "label_studio.sqlite3").exists()
    log = ls_server.log_path.read_text(errors="replace")
    assert ls_server.token not in log


def test_local_credentials_are_private_and_stable(tmp_path, monkeypatch):
    monkeypatch.setenv("PRB_TEST_TOKEN_ENV", "t" * 40)
    first = local_credentials(tmp_path / "data", "PRB_TEST_TOKEN_ENV")
    assert first["token"] == "t" * 40
    mode = (tmp_path / "data" / "prb-credentials.json").stat().st_mode & 0o777
    assert mode == 0o600
    monkeypatch.setenv("PRB_TEST_TOKEN_ENV", "u" * 40)
    assert local_credentials(tmp_path / "data", "PRB_TEST_TOKEN_ENV") == first


def test_round_projects_are_found_by_title(tmp_path, ls_server, client):
    run_dir, _ = _run(tmp_path, 20)
    cfg = _config(tmp_path, ls_server, sample_size=5, gold_tasks=0)
    a = export_round(cfg, run_dir, 1, client=client)
    b = export_round(cfg, run_dir, 2, client=client)
    assert a["project_id"] != b["project_id"]
    assert find_project(client, f"prb {run_dir.name} round 1").id == a["project_id"]
    counts = Counter(
        p.title for p in client.projects.list(page_size=100) if run_dir.name in p.title
    )
    assert all(n == 1 for n in counts.values())


def test_the_rounds_project_shows_the_guidelines_to_annotators(tmp_path, ls_server, client):
    """The project was created with expert_instruction '' and show_instruction False, and
    the labeling page defined none of the choices (issue 52). Read back from the server:
    the instructions are annotation/guidelines.md (opened before the first task), and the
    labeling config carries each definition. A project made before this (no instructions)
    gets them on the next export; instructions written in Label Studio are kept."""
    from pipeline.annotate.tasks import guidelines_html

    run_dir, _ = _run(tmp_path, 12)
    cfg = _config(tmp_path, ls_server, sample_size=5, gold_tasks=1)
    pid = export_round(cfg, run_dir, 1, client=client)["project_id"]
    project = client.projects.get(id=pid)
    assert project.show_instruction is True
    shown = project.expert_instruction or ""
    assert shown == guidelines_html()
    for words in (
        "<strong>both bad</strong>",
        "<strong>general quality differs</strong>",
        "<strong>rubric unclear</strong>",
        "Do <strong>not</strong> reward length",
    ):
        assert words in shown, words  # fmt: skip
    config = project.label_config or ""
    for words in (
        "both bad: neither answer is acceptable",
        "general quality differs: one",
        "rubric unclear: the rubric is vague",
        "Do not reward length, polish",
    ):
        assert words in config, words  # fmt: skip

    # an older round's project, without instructions: filled in by the next export
    client.projects.update(id=pid, expert_instruction="", show_instruction=False)
    export_round(cfg, run_dir, 1, client=client)
    again = client.projects.get(id=pid)
    assert again.expert_instruction == shown and again.show_instruction is True
    # instructions someone wrote in Label Studio are theirs
    client.projects.update(id=pid, expert_instruction="<p>ours</p>")
    export_round(cfg, run_dir, 1, client=client)
    assert client.projects.get(id=pid).expert_instruction == "<p>ours</p>"
