"""Pull a round's annotations back (``prb annotate import RUN --round N``).

Every task of the round's project is downloaded with all its annotations (one full JSON
export, unannotated tasks included). Each annotation's A/B choice is mapped back to the
pair's sides with the task's recorded ``a_side``. Per task and annotator only the latest
annotation counts (an annotator who edits or resubmits changes their vote); a skipped
(cancelled) or empty annotation is kept on disk but is not a vote.

Files under ``<run>/annotate/round-N/``:

- ``annotations.jsonl``: one row per (task, annotator): label, flags, confidence, comment,
  annotator id and email, ``was_cancelled``, ``updated_at``.
- ``verdicts.jsonl``: one row per pair task: votes, majority, share and status
  ("verified": majority chosen with at least ``annotation.min_votes`` votes; "refuted":
  majority rejected or both_bad with at least that many; else "unresolved"), flag counts.
- ``adjudication.jsonl``: pairs with no clear majority or with any flag, for a second look.
- ``agreement.json``: alpha, kappa, raw agreement, human vs judge, gold accuracy, counts.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

from pipeline.annotate import LabelStudioError
from pipeline.annotate.agreement import Annotation, gold_accuracy, majority, summarize
from pipeline.annotate.export import check_connection, client_url, connect, find_project
from pipeline.annotate.tasks import (
    CHOICE_CONTROL,
    COMMENT_CONTROL,
    CONFIDENCE_CONTROL,
    FLAGS,
    FLAGS_CONTROL,
    map_choice,
    project_title,
)
from pipeline.config import Config
from pipeline.io import read_json, write_json_atomic, write_jsonl_atomic
from pipeline.rules.verdicts import direction, prefers
from pipeline.run import Round, RunDir

FLAG_NAMES = tuple(FLAGS.values())


# ---- reading Label Studio's export ---------------------------------------------------------


def download_tasks(client: Any, project_id: int) -> list[dict[str, Any]]:
    """Every task of the project with all its annotations, cancelled ones included."""
    chunks = client.projects.exports.download_sync(
        project_id, export_type="JSON", download_all_tasks=True
    )
    raw = chunks if isinstance(chunks, bytes) else b"".join(chunks)
    return json.loads(raw)


def parse_result(result: list[dict[str, Any]] | None) -> dict[str, Any]:
    """choice, flags, confidence and comment from an annotation's result list."""
    out: dict[str, Any] = {"choice": None, "flags": [], "confidence": None, "comment": None}
    for r in result or []:
        name, value = r.get("from_name"), r.get("value") or {}
        if name == CHOICE_CONTROL:
            picked = value.get("choices") or []
            out["choice"] = picked[0] if picked else None
        elif name == FLAGS_CONTROL:
            out["flags"] = sorted(FLAGS.get(c, c) for c in value.get("choices") or [])
        elif name == CONFIDENCE_CONTROL:
            out["confidence"] = value.get("rating")
        elif name == COMMENT_CONTROL:
            text = value.get("text") or []
            text = text if isinstance(text, list) else [text]
            out["comment"] = "\n".join(str(t) for t in text) or None
    return out


def _annotator(completed_by: Any, users: dict[int, str]) -> tuple[int | None, str]:
    if isinstance(completed_by, dict):  # some exports expand the user
        uid = completed_by.get("id")
        known = users.get(uid) if isinstance(uid, int) else None
        return uid, completed_by.get("email") or known or f"user-{uid}"
    return completed_by, users.get(completed_by) or f"user-{completed_by}"


def latest_per_annotator(annotations: list[dict], users: dict[int, str]) -> tuple[list, int]:
    """Each annotator's newest annotation on a task; returns (kept, superseded count)."""
    by_user: dict[str, dict] = {}
    for a in sorted(annotations, key=lambda a: (a.get("updated_at") or "", a.get("id") or 0)):
        _, who = _annotator(a.get("completed_by"), users)
        by_user[who] = a  # sorted oldest first: the last one assigned is the newest
    return list(by_user.values()), len(annotations) - len(by_user)


def vote_rows(
    task: dict[str, Any], users: dict[int, str], local_side: dict[str, str]
) -> tuple[list[dict], int]:
    """One row per annotator of ``task`` (their latest annotation), A/B mapped back."""
    data = task.get("data") or {}
    key = data["task_key"]
    side = local_side.get(key) or data.get("a_side")
    kept, superseded = latest_per_annotator(task.get("annotations") or [], users)
    if kept and side not in ("chosen", "rejected"):
        raise LabelStudioError(
            f"task {task.get('id')} ({key}) has no recorded A side (sides.json lacks it): "
            "cannot map A/B back to chosen/rejected"
        )
    rows = []
    for a in kept:
        uid, email = _annotator(a.get("completed_by"), users)
        parsed = parse_result(a.get("result"))
        cancelled = bool(a.get("was_cancelled"))
        label = None
        if not cancelled and parsed["choice"] is not None:
            label = map_choice(parsed["choice"], str(side))
        rows.append(
            {
                "task_key": key,
                "pair_id": data.get("pair_id"),
                "gold": bool(data.get("gold")),
                "task_id": task.get("id"),
                "annotation_id": a.get("id"),
                "annotator_id": uid,
                "annotator": email,
                "choice": parsed["choice"],
                "a_side": side,
                "label": label,
                "flags": parsed["flags"],
                "confidence": parsed["confidence"],
                "comment": parsed["comment"],
                "was_cancelled": cancelled,
                "created_at": a.get("created_at"),
                "updated_at": a.get("updated_at"),
            }
        )
    return rows, superseded


# ---- verdicts ------------------------------------------------------------------------------


def judge_direction(pair: dict | None) -> str | None:
    """What the rubric-aware judge said about the pair, over both presentation orders
    (``pipeline.rules.verdicts.direction``); None when the pair carries no verdict."""
    if not pair:
        return None
    return direction(prefers((pair.get("judge") or {}).get("pairwise"), "pairwise_aware"))


def verdict(votes: list[str], min_votes: int) -> dict[str, Any]:
    label, share = majority(votes)
    if label == "chosen" and len(votes) >= min_votes:
        status = "verified"
    elif label in ("rejected", "both_bad") and len(votes) >= min_votes:
        status = "refuted"
    else:
        status = "unresolved"
    return {"majority": label, "share": round(share, 4), "status": status}


def _local_sides(rnd: Round) -> dict[str, str]:
    """task_key -> a_side from the round's private sides.json (tasks.json of rounds exported
    before the answer key was kept out of the tasks)."""
    if rnd.sides.exists():
        return {k: v["a_side"] for k, v in read_json(rnd.sides).items()}
    if rnd.tasks.exists():
        return {
            t["data"]["task_key"]: t["data"]["a_side"]
            for t in read_json(rnd.tasks)
            if "a_side" in t["data"]
        }
    return {}


def _project_id(client: Any, run_dir: Path, round_no: int) -> int:
    """The round's project: the id export.json recorded for this server, else by title."""
    from label_studio_sdk.core.api_error import ApiError

    title = project_title(run_dir, round_no)
    record = RunDir(run_dir).round(round_no).export
    if record.exists():
        info = read_json(record)
        if info.get("project_id") and info.get("url") == client_url(client):
            try:
                return int(client.projects.get(id=info["project_id"]).id)
            except ApiError as exc:
                if exc.status_code != 404:
                    raise
    project = find_project(client, title)
    if project is None:
        raise LabelStudioError(
            f"no project titled '{title}' on {client_url(client)}; "
            f"run `prb annotate export {run_dir} --round {round_no}` first"
        )
    return int(project.id)


def import_round(
    config: Config, run_dir: str | Path, round_no: int, *, client: Any | None = None
) -> dict[str, Any]:
    """Download the round's annotations, write votes, verdicts, adjudication and agreement."""
    run_dir = Path(run_dir)
    rd = RunDir(run_dir)
    rnd = rd.round(round_no)
    if client is None:
        client = connect(config)
    else:
        check_connection(client, client_url(client), config.annotation.token_env)
    project_id = _project_id(client, run_dir, round_no)
    users = {u.id: u.email for u in client.users.list()}
    tasks = download_tasks(client, project_id)
    local_side = _local_sides(rnd)
    pairs = {p["pair_id"]: p for p in rd.pair_records()}
    min_votes = config.annotation.min_votes

    rows: list[dict] = []
    verdict_rows: list[dict] = []
    adjudicate: list[dict] = []
    pair_votes: list[Annotation] = []
    gold_votes: list[Annotation] = []
    gold_map: dict[str, str] = {}
    judge_map: dict[str, str] = {}
    counts: Counter = Counter()
    keys_seen: Counter = Counter()

    for task in sorted(tasks, key=lambda t: t.get("id") or 0):
        data = task.get("data") or {}
        if "task_key" not in data:
            counts["foreign_tasks"] += 1  # added by hand in the UI; not ours to judge
            continue
        key = data["task_key"]
        keys_seen[key] += 1
        gold = bool(data.get("gold"))
        task_rows, superseded = vote_rows(task, users, local_side)
        counts["superseded"] += superseded
        counts["annotations_total"] += len(task.get("annotations") or [])
        rows.extend(task_rows)
        votes = [r for r in task_rows if r["label"] is not None]
        counts["cancelled"] += sum(r["was_cancelled"] for r in task_rows)
        counts["empty"] += sum(not r["was_cancelled"] and r["label"] is None for r in task_rows)
        counts["annotated_tasks" if votes else "unannotated_tasks"] += 1
        sink = gold_votes if gold else pair_votes
        sink.extend(Annotation(key, r["annotator"], r["label"]) for r in votes)
        if gold:
            counts["gold_tasks"] += 1
            gold_map[key] = "chosen"  # the on-topic answer always plays the chosen side
            continue
        counts["pair_tasks"] += 1
        pair_id = data.get("pair_id")
        direction = judge_direction(pairs.get(pair_id))
        if direction is not None:
            judge_map[key] = direction
        labels = [r["label"] for r in votes]
        v = verdict(labels, min_votes)
        flags = Counter(f for r in votes for f in r["flags"])
        confs = [r["confidence"] for r in votes if r["confidence"] is not None]
        row = {
            "pair_id": pair_id,
            "task_key": key,
            "task_id": task.get("id"),
            "n_votes": len(labels),
            "votes": dict(Counter(labels)),
            **v,
            "flags": {f: flags.get(f, 0) for f in FLAG_NAMES},
            "mean_confidence": round(sum(confs) / len(confs), 3) if confs else None,
            "judge": direction,
            "annotators": [r["annotator"] for r in votes],
        }
        verdict_rows.append(row)
        counts[v["status"]] += 1
        reasons = []
        if len(labels) >= 2 and v["majority"] is None:
            reasons.append("no_majority")
        reasons += [f for f in FLAG_NAMES if flags.get(f)]
        if reasons:
            comments = [r["comment"] for r in votes if r["comment"]]
            adjudicate.append(row | {"reasons": reasons, "comments": comments})

    agreement = summarize(pair_votes, judge=judge_map)
    agreement["gold_accuracy"] = gold_accuracy(gold_votes, gold_map)
    agreement["gold_votes"] = len(gold_votes)
    n_gold_right = sum(v["correct"] for v in agreement["gold_accuracy"].values())
    n_gold_graded = sum(v["n"] for v in agreement["gold_accuracy"].values())
    agreement["gold_accuracy_overall"] = n_gold_right / n_gold_graded if n_gold_graded else None

    summary = {
        "round": round_no,
        "project_id": project_id,
        "url": client_url(client),
        "tasks": sum(keys_seen.values()),
        "pair_tasks": counts["pair_tasks"],
        "gold_tasks": counts["gold_tasks"],
        "foreign_tasks": counts["foreign_tasks"],
        "duplicate_task_keys": sum(n - 1 for n in keys_seen.values() if n > 1),
        "annotated_tasks": counts["annotated_tasks"],
        "unannotated_tasks": counts["unannotated_tasks"],
        "annotations_total": counts["annotations_total"],
        "annotation_rows": len(rows),
        "votes": sum(1 for r in rows if r["label"] is not None),
        "cancelled": counts["cancelled"],
        "empty": counts["empty"],
        "superseded": counts["superseded"],
        "annotators": len({r["annotator"] for r in rows}),
        "verified": counts["verified"],
        "refuted": counts["refuted"],
        "unresolved": counts["unresolved"],
        "adjudication": len(adjudicate),
        "min_votes": min_votes,
        "krippendorff_alpha": agreement["krippendorff_alpha"],
        "raw_agreement": agreement["raw_agreement"],
        "gold_accuracy_overall": agreement["gold_accuracy_overall"],
    }
    agreement["counts"] = summary
    agreement["time"] = time.time()

    write_jsonl_atomic(rnd.annotations, rows)
    write_jsonl_atomic(rnd.verdicts, verdict_rows)
    write_jsonl_atomic(rnd.adjudication, adjudicate)
    write_json_atomic(rnd.agreement, agreement)
    return summary
