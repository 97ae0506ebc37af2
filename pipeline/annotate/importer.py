"""Pull a round's annotations back (``prb annotate import RUN --round N``).

Every task of the round's project is downloaded with all its annotations (one full JSON
export, unannotated tasks included), or read from such an export downloaded by hand
(``--from-file``). Each annotation's A/B choice is mapped back to the pair's sides with the
task's recorded ``a_side``. Per task and annotator only the latest annotation counts (an
annotator who edits or resubmits changes their vote); a skipped (cancelled) or empty
annotation is kept on disk but is not a vote.

The export is checked against a schema task by task and annotation by annotation
(:class:`ExportTask`, :class:`ExportAnnotation`): a task or annotation that does not fit
(a choice someone added in the Label Studio UI, a rating that is text, a task id that is
not a number...) is left out and listed with its id and the reason, and the rest of the
round is imported. Only a body that is not a JSON list of tasks stops the import, and an
export that holds none of the round's tasks (an empty list, another project's export).

An import merges with the round's earlier ones (``--replace`` drops those): vote rows are
keyed by annotation id and task key, so the same export twice changes no file and votes an
export lacks are kept. Only the round's own task keys are imported (a task of another key
goes to ``skipped.jsonl``), and the pair a task stands for comes from the round's
tasks.json, not from the export. Tasks carrying one key are one pair: an annotator's
identical annotations on two copies count once, and copies that disagree leave the pair
unresolved and in adjudication (:func:`_pool`).

Files under ``<run>/annotate/round-N/``:

- ``annotations.jsonl``: one row per (task, annotator): label, flags, confidence, comment,
  annotator id and email, ``was_cancelled``, ``updated_at``.
- ``verdicts.jsonl``: one row per pair task: votes, majority, share and status
  ("verified": majority chosen with at least ``annotation.min_votes`` votes; "refuted":
  majority rejected or both_bad with at least that many; else "unresolved"), flag counts.
- ``adjudication.jsonl``: pairs with no clear majority or with any flag, for a second look.
- ``skipped.jsonl``: each task or annotation left out of the import, with its id and why.
- ``agreement.json``: alpha, kappa, raw agreement, human vs judge, gold accuracy, counts
  (``counts.skipped_tasks`` and ``counts.skipped_annotations`` among them).
"""

from __future__ import annotations

import json
import re
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from pipeline.annotate.agreement import Annotation, gold_accuracy, majority, summarize
from pipeline.annotate.errors import LabelStudioError
from pipeline.annotate.export import check_connection, client_url, connect, find_project
from pipeline.annotate.rounds import REFUTED, STATUSES, UNRESOLVED, VERIFIED
from pipeline.annotate.tasks import (
    CHOICE_CONTROL,
    CHOICES,
    COMMENT_CONTROL,
    CONFIDENCE_CONTROL,
    FLAGS,
    FLAGS_CONTROL,
    map_choice,
    project_title,
)
from pipeline.config import Config
from pipeline.core.io import (
    dumps,
    loads,
    path_kind,
    read_json,
    write_json_atomic,
    write_jsonl_atomic,
)
from pipeline.rules.verdicts import direction, prefers
from pipeline.run import Round, RunDir

FLAG_NAMES = tuple(FLAGS.values())
# annotation/labeling_config.xml: <Rating name="confidence" maxRating="5">
MAX_RATING = 5
# skipped tasks and annotations printed by the command; all of them are in skipped.jsonl
SHOW_SKIPPED = 20


# ---- the export's schema -------------------------------------------------------------------


class _ExportModel(BaseModel):
    # strict: "7" is not a task id and 1 is not a boolean; Label Studio writes neither.
    # Fields this module does not read may be anything (extra="allow").
    model_config = ConfigDict(strict=True, extra="allow")


class ExportTaskData(_ExportModel):
    """A task's ``data`` as ``prb annotate export`` sent it (see tasks.public_task)."""

    task_key: str
    pair_id: str | None = None
    gold: bool | None = None
    a_side: str | None = None  # only in tasks of rounds exported before sides.json


class ExportUser(_ExportModel):
    """``completed_by`` as some exports write it: the user expanded."""

    id: int | None = None
    email: str | None = None


class ExportAnnotation(_ExportModel):
    """Who annotated and when: enough to tell which annotation is an annotator's latest.
    The result (what they chose) is checked separately, by :func:`parse_result`."""

    id: int | None = None
    completed_by: int | ExportUser | None = None
    was_cancelled: bool | None = False
    created_at: str | None = None
    updated_at: str | None = None
    result: list[dict[str, Any]] | None = None


class ExportTask(_ExportModel):
    """One task of a Label Studio JSON export; each annotation is checked on its own."""

    id: int
    data: dict[str, Any]
    annotations: list[Any] | None = None


class _ChoiceValue(_ExportModel):
    choices: list[str]


class _RatingValue(_ExportModel):
    rating: int


class _TextValue(_ExportModel):
    text: str | list[str]


class SkippedError(Exception):
    """A task or an annotation that does not fit the export's schema; says why."""


def _why(err: ValidationError, what: str) -> str:
    """The first problem of a validation error as one short clause."""
    e = err.errors()[0]
    # a union adds the member tried to the location ("completed_by.int"): not a field name
    parts = [str(p) for p in e["loc"] if not _TYPE_TAG.fullmatch(str(p))]
    field = ".".join([what, *parts])
    if e["type"] == "missing":
        return f"{field}: missing"
    got = type(e["input"]).__name__
    got = {"str": "text", "dict": "an object", "list": "a list", "NoneType": "null"}.get(got, got)
    return f"{field}: {e['msg'].removeprefix('Value error, ')} (got {got})"


_TYPE_TAG = re.compile(r"int|str|bool|float|[A-Z]\w*|\w+\[.*\]")


# ---- reading Label Studio's export ---------------------------------------------------------


def download_export(client: Any, project_id: int) -> bytes:
    """The project's full JSON export: every task with all its annotations, cancelled
    ones included."""
    chunks = client.projects.exports.download_sync(
        project_id, export_type="JSON", download_all_tasks=True
    )
    return chunks if isinstance(chunks, bytes) else b"".join(chunks)


def read_export_file(path: str | Path) -> bytes:
    """An export downloaded by hand; only a regular file is opened (a pipe would hang)."""
    path = Path(path)
    kind = path_kind(path)
    if kind is None:
        raise LabelStudioError(
            f"{path}: no such file; download the project's export from Label Studio "
            "(Export > JSON) and pass its path"
        )
    if kind != "a file":
        raise LabelStudioError(f"{path}: is {kind}, not a file; pass the downloaded JSON export")
    try:
        return path.read_bytes()
    except OSError as exc:
        raise LabelStudioError(f"{path}: cannot read it ({exc.strerror or exc})") from None


def parse_export(raw: bytes | str, source: str) -> list[Any]:
    """The list of tasks in a JSON export body; anything else is a one-line error naming
    ``source`` (the file or the project and server it came from). The tasks themselves are
    checked later, one by one."""
    redo = "export the project again as JSON (Export > JSON, not JSON_MIN or CSV)"
    try:
        body = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise LabelStudioError(
            f"{source}: the export is not valid JSON ({exc.msg} at line {exc.lineno} column "
            f"{exc.colno}; cut short?); {redo}"
        ) from None
    except UnicodeDecodeError as exc:
        raise LabelStudioError(
            f"{source}: the export is not UTF-8 text ({exc.reason} at byte {exc.start}); {redo}"
        ) from None
    except RecursionError:
        raise LabelStudioError(
            f"{source}: the export is nested too deeply to read; {redo}"
        ) from None
    except ValueError as exc:  # an integer past Python's digit limit
        raise LabelStudioError(f"{source}: the export cannot be read ({exc}); {redo}") from None
    if not isinstance(body, list):
        kind = {dict: "a JSON object"}.get(type(body), f"a JSON {type(body).__name__}")
        raise LabelStudioError(
            f"{source}: the export holds {kind}, not the list of tasks a JSON export is; {redo}"
        )
    return body


def parse_result(result: list[dict[str, Any]] | None) -> dict[str, Any]:
    """choice, flags, confidence and comment from an annotation's result list; raises
    SkippedError on a value the labeling config cannot have produced."""
    out: dict[str, Any] = {"choice": None, "flags": [], "confidence": None, "comment": None}
    for i, r in enumerate(result or []):
        name, value = r.get("from_name"), r.get("value")
        if name not in (CHOICE_CONTROL, FLAGS_CONTROL, CONFIDENCE_CONTROL, COMMENT_CONTROL):
            continue  # a control added in the UI: not ours to read
        if not isinstance(value, dict):
            raise SkippedError(
                f"result[{i}] ({name}): value must be an object, got {type(value).__name__}"
            )
        try:
            if name == CHOICE_CONTROL:
                picked = _ChoiceValue.model_validate(value).choices
                out["choice"] = picked[0] if picked else None
                if out["choice"] is not None:
                    try:
                        map_choice(out["choice"], "chosen")  # the one rule for known choices
                    except ValueError:
                        raise SkippedError(
                            f"result[{i}] (choice): {out['choice']!r} is not one of "
                            f"{', '.join(CHOICES)} (a choice added in the Label Studio UI?)"
                        ) from None
            elif name == FLAGS_CONTROL:
                picked = _ChoiceValue.model_validate(value).choices
                out["flags"] = sorted(FLAGS.get(c, c) for c in picked)
            elif name == CONFIDENCE_CONTROL:
                rating = _RatingValue.model_validate(value).rating
                if not 1 <= rating <= MAX_RATING:
                    raise SkippedError(
                        f"result[{i}] (confidence): rating {rating} is outside 1..{MAX_RATING}"
                    )
                out["confidence"] = rating
            else:
                text = _TextValue.model_validate(value).text
                text = text if isinstance(text, list) else [text]
                out["comment"] = "\n".join(text) or None
        except ValidationError as err:
            raise SkippedError(_why(err, f"result[{i}] ({name}).value")) from None
    return out


def _annotator(
    completed_by: int | ExportUser | None, users: dict[int, str]
) -> tuple[int | None, str]:
    if isinstance(completed_by, ExportUser):  # some exports expand the user
        uid = completed_by.id
        known = users.get(uid) if uid is not None else None
        return uid, completed_by.email or known or f"user-{uid}"
    known = users.get(completed_by) if completed_by is not None else None
    return completed_by, known or f"user-{completed_by}"


def latest_per_annotator(
    annotations: list[ExportAnnotation], users: dict[int, str]
) -> tuple[list[ExportAnnotation], int]:
    """Each annotator's newest annotation on a task; returns (kept, superseded count)."""
    by_user: dict[str, ExportAnnotation] = {}
    for a in sorted(annotations, key=lambda a: (a.updated_at or "", a.id or 0)):
        _, who = _annotator(a.completed_by, users)
        by_user[who] = a  # sorted oldest first: the last one assigned is the newest
    return list(by_user.values()), len(annotations) - len(by_user)


def vote_rows(
    task: ExportTask,
    data: ExportTaskData,
    users: dict[int, str],
    local_side: dict[str, str],
    skipped: list[dict[str, Any]],
) -> tuple[list[dict], int]:
    """One row per annotator of ``task`` (their latest annotation), A/B mapped back.
    Annotations that do not fit the schema go to ``skipped`` instead."""
    key = data.task_key
    side = local_side.get(key) or data.a_side
    valid: list[ExportAnnotation] = []
    for j, raw in enumerate(task.annotations or []):
        try:
            valid.append(ExportAnnotation.model_validate(raw))
        except ValidationError as err:
            ann_id = raw.get("id") if isinstance(raw, dict) else None
            skipped.append(_skip(task.id, key, _why(err, f"annotations[{j}]"), ann_id, position=j))
    kept, superseded = latest_per_annotator(valid, users)
    if kept and side not in ("chosen", "rejected"):
        raise SkippedError(
            f"no recorded A side for task_key {key!r} (sides.json lacks it): cannot map A/B "
            "back to chosen/rejected"
        )
    rows = []
    for a in kept:
        uid, email = _annotator(a.completed_by, users)
        try:
            parsed = parse_result(a.result)
        except SkippedError as exc:
            # the annotator's latest answer is unreadable: they have no vote on this task
            skipped.append(_skip(task.id, key, str(exc), a.id, annotator=email))
            continue
        cancelled = bool(a.was_cancelled)
        label = None
        if not cancelled and parsed["choice"] is not None:
            label = map_choice(parsed["choice"], str(side))
        rows.append(
            {
                "task_key": key,
                "pair_id": data.pair_id,
                "gold": bool(data.gold),
                "task_id": task.id,
                "annotation_id": a.id,
                "annotator_id": uid,
                "annotator": email,
                "choice": parsed["choice"],
                "a_side": side,
                "label": label,
                "flags": parsed["flags"],
                "confidence": parsed["confidence"],
                "comment": parsed["comment"],
                "was_cancelled": cancelled,
                "created_at": a.created_at,
                "updated_at": a.updated_at,
            }
        )
    return rows, superseded


def _plain(v: Any) -> Any:
    """An id as stored in skipped.jsonl: a number or text as is, anything else shown."""
    if v is None or (isinstance(v, (int, str)) and not isinstance(v, bool)):
        return v
    return repr(v)[:80]


def _skip(
    task_id: Any, task_key: str | None, reason: str, annotation_id: Any = None, **extra: Any
) -> dict[str, Any]:
    """A row of skipped.jsonl: an annotation when it has an id or an annotator, else a task."""
    kind = "annotation" if annotation_id is not None or extra else "task"
    return {
        "kind": kind,
        "task_id": _plain(task_id),
        "annotation_id": _plain(annotation_id),
        "task_key": task_key,
        "reason": reason,
        **extra,
    }


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
        status = VERIFIED
    elif label in ("rejected", "both_bad") and len(votes) >= min_votes:
        status = REFUTED
    else:
        status = UNRESOLVED
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


def _check_tasks(
    raw_tasks: list[Any], skipped: list[dict[str, Any]]
) -> list[tuple[ExportTask, ExportTaskData | None]]:
    """The tasks that fit the schema, by id, each with its data (None: not one of ours);
    the others go to ``skipped`` with their position in the export."""
    good: list[tuple[ExportTask, ExportTaskData | None]] = []
    for n, raw in enumerate(raw_tasks):
        raw_id = raw.get("id") if isinstance(raw, dict) else None
        try:
            if not isinstance(raw, dict):
                raise SkippedError(f"must be an object, got {type(raw).__name__}")
            try:
                task = ExportTask.model_validate(raw)
            except ValidationError as err:
                raise SkippedError(_why(err, "task")) from None
            if "task_key" not in task.data:
                good.append((task, None))  # added by hand in the UI; not ours to judge
                continue
            try:
                data = ExportTaskData.model_validate(task.data)
            except ValidationError as err:
                raise SkippedError(_why(err, "data")) from None
        except SkippedError as exc:
            raw_data = raw.get("data") if isinstance(raw, dict) else None
            key = raw_data.get("task_key") if isinstance(raw_data, dict) else None
            key = key if isinstance(key, str) else None
            skipped.append(_skip(raw_id, key, str(exc)) | {"position": n})
            continue
        good.append((task, data))
    return sorted(good, key=lambda td: td[0].id)


def _check_exported(run_dir: Path, round_no: int) -> None:
    """Without the round's answer key (sides.json) no A/B choice can be mapped back."""
    rnd = RunDir(run_dir).round(round_no)
    if not rnd.sides.exists() and not rnd.tasks.exists():
        raise LabelStudioError(
            f"round {round_no} of {run_dir} was never exported from here ({rnd.sides} "
            f"is missing); run `prb annotate export {run_dir} --round {round_no}` first"
        )


def import_round(
    config: Config,
    run_dir: str | Path,
    round_no: int,
    *,
    client: Any | None = None,
    export_file: str | Path | None = None,
    replace: bool = False,
) -> dict[str, Any]:
    """Download the round's annotations (or read ``export_file``, a JSON export saved
    from Label Studio), merge them with the round's earlier votes (``replace``: drop
    those), write votes, verdicts, adjudication, skipped and agreement."""
    run_dir = Path(run_dir)
    if export_file is not None:
        _check_exported(run_dir, round_no)
        raw = read_export_file(export_file)
        tasks = parse_export(raw, str(export_file))
        origin: dict[str, Any] = {"project_id": None, "url": None, "file": str(export_file)}
        users: dict[int, str] = {}
    else:
        if client is None:
            client = connect(config)
        else:
            check_connection(client, client_url(client), config.annotation.token_env)
        project_id = _project_id(client, run_dir, round_no)
        _check_exported(run_dir, round_no)
        users = {u.id: u.email for u in client.users.list()}
        source = f"the export of project {project_id} at {client_url(client)}"
        tasks = parse_export(download_export(client, project_id), source)
        origin = {"project_id": project_id, "url": client_url(client), "file": None}
    return summarize_round(config, run_dir, round_no, tasks, users, origin, replace=replace)


def _round_tasks(rnd: Round) -> dict[str, dict[str, Any]]:
    """task_key -> {"pair_id", "gold"} of every task the round was exported with (its
    tasks.json, else its sides.json): the only keys an import may write votes for. The pair
    a task stands for comes from here, never from the export, which anyone can edit."""
    if rnd.tasks.exists():
        out = {}
        for t in read_json(rnd.tasks):
            data = t.get("data") if isinstance(t, dict) else None
            if isinstance(data, dict) and isinstance(data.get("task_key"), str):
                out[data["task_key"]] = {
                    "pair_id": data.get("pair_id"),
                    "gold": bool(data.get("gold")),
                }
        return out
    if rnd.sides.exists():
        return {
            k: {"pair_id": k.removeprefix("gold:"), "gold": k.startswith("gold:")}
            for k in read_json(rnd.sides)
        }
    return {}


def _row_key(r: dict[str, Any]) -> tuple[Any, ...]:
    """A vote row's identity across imports: its annotation id within its task key (an
    annotation without an id: its task and annotator)."""
    if r.get("annotation_id") is not None:
        return (r["task_key"], "id", r["annotation_id"])
    return (r["task_key"], "task", r.get("task_id"), r.get("annotator"))


# what the merge reads of an earlier import's row
_ROW_FIELDS = ("task_key", "task_id", "annotation_id", "annotator", "label", "flags",
               "confidence", "comment", "was_cancelled")  # fmt: skip
_LABELS = (None, "chosen", "rejected", "tie", "both_bad")


def _earlier_rows(rnd: Round) -> list[dict[str, Any]]:
    """The round's annotations.jsonl from earlier imports (empty when there is none); a
    damaged line is one error naming it, and nothing is written."""
    path = rnd.annotations
    if not path.is_file():
        return []
    fix = "pass --replace to rebuild the round's votes from this export alone"
    rows = []
    with open(path, "rb") as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                row = loads(line)
            except ValueError:
                raise LabelStudioError(f"{path}, line {n}: not valid JSON; {fix}") from None
            if not isinstance(row, dict) or not isinstance(row.get("task_key"), str):
                raise LabelStudioError(f"{path}, line {n}: not a vote row (no task_key); {fix}")
            missing = [k for k in _ROW_FIELDS if k not in row]
            if missing:
                raise LabelStudioError(
                    f"{path}, line {n}: a vote row without {missing[0]!r}; {fix}"
                )
            if row["label"] not in _LABELS or not isinstance(row["flags"], list):
                raise LabelStudioError(
                    f"{path}, line {n}: label {row['label']!r} or flags of the wrong kind; {fix}"
                )
            rows.append(row)
    return rows


def _latest(rows: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], int]:
    """Per task key, task and annotator only the newest row: an annotator who resubmitted
    after an earlier import changes their vote. Returns (kept, superseded count)."""
    best: dict[tuple[Any, ...], dict[str, Any]] = {}
    for r in sorted(rows, key=lambda r: (r.get("updated_at") or "", r.get("annotation_id") or 0)):
        best[(r["task_key"], r.get("task_id"), r.get("annotator"))] = r
    return list(best.values()), len(rows) - len(best)


_SAME_VOTE = ("label", "choice", "flags", "confidence", "comment", "was_cancelled")


def _pool(rows: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, Any] | None, int]:
    """The rows of one task key, from one or more tasks (copies) carrying it: identical
    annotations of one annotator on two copies count once. Returns (rows kept, the
    conflict between copies or None, identical copies dropped).

    A conflict: an annotator voted differently on two copies, or the copies' own majorities
    differ. A copy added by hand (or a task imported twice and annotated twice) must not
    decide a pair, so a conflicted pair stays unresolved and goes to adjudication."""
    kept: list[dict[str, Any]] = []
    dropped = 0
    seen: dict[tuple[Any, ...], dict[str, Any]] = {}
    for r in sorted(rows, key=lambda r: (r.get("task_id") or 0, r.get("annotation_id") or 0)):
        same = (r.get("annotator"), *(json.dumps(r.get(k), sort_keys=True) for k in _SAME_VOTE))
        if same in seen:
            dropped += 1
            continue
        seen[same] = r
        kept.append(r)
    copies = sorted({r.get("task_id") for r in rows}, key=lambda t: (str(type(t)), t))
    if len(copies) < 2:
        return kept, None, dropped
    why = []
    labels_of: dict[str, set[str]] = {}
    for r in kept:
        if r["label"] is not None:
            labels_of.setdefault(str(r.get("annotator")), set()).add(r["label"])
    split = sorted(a for a, labels in labels_of.items() if len(labels) > 1)
    if split:
        why.append(f"{split[0]} voted differently on two copies")
    majorities = set()
    for t in copies:
        votes = [r["label"] for r in kept if r.get("task_id") == t and r["label"] is not None]
        if votes:
            majorities.add(majority(votes)[0])
    if len(majorities) > 1:
        why.append("the copies' majorities differ")
    conflict = {"task_ids": copies, "why": "; ".join(why)} if why else None
    return kept, conflict, dropped


def _same_file(path: Path, data: bytes) -> bool:
    try:
        return path.read_bytes() == data
    except OSError:
        return False


def _write_rows(path: Path, rows: list[dict[str, Any]]) -> None:
    """Rows as JSON lines, written only when they differ from what is there: importing
    the same export again changes no file."""
    if not _same_file(path, b"".join(dumps(r) + b"\n" for r in rows)):
        write_jsonl_atomic(path, rows)


def summarize_round(
    config: Config,
    run_dir: Path,
    round_no: int,
    tasks: list[Any],
    users: dict[int, str],
    origin: dict[str, Any],
    *,
    replace: bool = False,
) -> dict[str, Any]:
    """Votes, verdicts, adjudication and agreement of a round from its exported tasks
    (as :func:`parse_export` returns them), merged with the votes of earlier imports
    (``replace``: this export's votes only); writes the round's files.

    An export that holds none of the round's tasks is refused and the round is left as it
    was (the wrong project, an empty list); a task whose key the round does not have is
    left out and listed in skipped.jsonl."""
    rd = RunDir(run_dir)
    r = _RoundImport(rd.round(round_no), config.annotation.min_votes)
    r.check(tasks, origin)
    # what this import changed: in the command's output, not in agreement.json, whose
    # counts describe the round (so the same export again leaves it as it was)
    this_import = r.merge(r.exported_votes(users), replace)
    d = r.decide({p["pair_id"]: p for p in rd.pair_records()})
    agreement = _agreement(d)
    summary = agreement["counts"] = r.counted(origin, d, agreement)
    r.write(d, agreement)
    files = {"files": str(r.rnd.path), "skipped_file": str(r.rnd.skipped)}
    return summary | this_import | {"replaced": replace, "skipped": r.skipped} | files


@dataclass
class _Decided:
    """What a round's votes decide: the rows of its files and what agreement is read from."""

    rows: list[dict] = field(default_factory=list)  # annotations.jsonl
    verdicts: list[dict] = field(default_factory=list)  # verdicts.jsonl
    adjudicate: list[dict] = field(default_factory=list)  # adjudication.jsonl
    conflicts: list[dict[str, Any]] = field(default_factory=list)
    pair_votes: list[Annotation] = field(default_factory=list)
    gold_votes: list[Annotation] = field(default_factory=list)
    gold_map: dict[str, str] = field(default_factory=dict)
    judge_map: dict[str, str] = field(default_factory=dict)


class _RoundImport:
    """One import of a round, step by step (:func:`summarize_round`): what it counts and
    leaves out as it goes is kept here."""

    def __init__(self, rnd: Round, min_votes: int) -> None:
        self.rnd, self.min_votes = rnd, min_votes
        self.local_side = _local_sides(rnd)
        self.known = _round_tasks(rnd)
        self.skipped: list[dict[str, Any]] = []
        self.counts: Counter = Counter()
        self.keys_seen: Counter = Counter()
        self.task_ids_of: dict[str, set[Any]] = {}  # the tasks carrying each key
        self.latest: list[dict[str, Any]] = []

    def check(self, tasks: list[Any], origin: dict[str, Any]) -> None:
        """Refuse an export that holds none of the round's tasks; keep each task's data."""
        self.checked = _check_tasks(tasks, self.skipped)
        if any(data is not None and data.task_key in self.known for _, data in self.checked):
            return
        source = origin.get("file") or (
            f"the export of project {origin.get('project_id')} at {origin.get('url')}"
        )
        ours = sum(data is not None for _, data in self.checked)
        what = (
            "no tasks"
            if not tasks
            else f"{len(tasks)} tasks, {ours} with a task_key, none of them this round's"
        )
        n = self.rnd.number
        raise LabelStudioError(
            f"{source}: holds none of round {n}'s {len(self.known)} tasks ({what}); nothing "
            f"was imported and the round is left as it was; export round {n}'s own "
            "project (Export > JSON) and import that"
        )

    def exported_votes(self, users: dict[int, str]) -> list[dict]:
        """The vote rows of the export's tasks of this round (others are skipped)."""
        new_rows: list[dict] = []
        for task, data in self.checked:
            if data is None:
                self.counts["foreign_tasks"] += 1
                continue
            key = data.task_key
            if key not in self.known:
                self.skipped.append(
                    _skip(task.id, key, f"task_key {key!r} is not a task of round "
                          f"{self.rnd.number} (not in {self.rnd.tasks.name}); its votes "
                          "were not imported")
                )  # fmt: skip
                continue
            try:
                task_rows, superseded = vote_rows(task, data, users, self.local_side, self.skipped)
            except SkippedError as exc:
                self.skipped.append(_skip(task.id, key, str(exc)))
                continue
            self.keys_seen[key] += 1
            self.task_ids_of.setdefault(key, set()).add(task.id)
            self.counts["superseded"] += superseded
            self.counts["annotations_total"] += len(task.annotations or [])
            for r in task_rows:  # the pair comes from the round, not from the export
                r["pair_id"], r["gold"] = self.known[key]["pair_id"], self.known[key]["gold"]
            new_rows.extend(task_rows)
        return new_rows

    def merge(self, new_rows: list[dict], replace: bool) -> dict[str, int]:
        """This export's rows replace the same annotations of earlier imports; then each
        annotator's latest vote per task. Returns what this import changed."""
        known = self.known
        earlier = [] if replace else [r for r in _earlier_rows(self.rnd) if r["task_key"] in known]
        merged = {_row_key(r): r for r in earlier}
        incoming = {_row_key(r): r for r in new_rows}  # a task twice in the export: once
        fresh = sum(k not in merged for k in incoming)
        changed = sum(k in merged and merged[k] != r for k, r in incoming.items())
        merged.update(incoming)
        self.latest, superseded_later = _latest(list(merged.values()))
        self.counts["superseded"] += superseded_later
        return {
            "new_votes": fresh,
            "changed_votes": changed,
            "kept_from_earlier_imports": len(earlier),
        }

    def decide(self, pairs: dict[str, dict[str, Any]]) -> _Decided:
        """Every task of the round this export or an earlier import holds, annotated or
        not, in the order of its first task id: its votes pooled, a pair's verdict and
        whether it goes to adjudication, a gold task's votes graded."""
        by_key: dict[str, list[dict]] = {k: [] for k in self.task_ids_of}
        for r in self.latest:
            by_key.setdefault(r["task_key"], []).append(r)
            self.task_ids_of.setdefault(r["task_key"], set()).add(r.get("task_id"))

        def first_task(key: str) -> tuple[int, str]:
            ids = [t for t in self.task_ids_of[key] if isinstance(t, int)]
            return (min(ids) if ids else 0, key)

        d = _Decided()
        for key in sorted(by_key, key=first_task):
            task_rows, conflict, dropped = _pool(by_key[key])
            self.counts["pooled_duplicates"] += dropped
            d.rows.extend(task_rows)
            pair_id, gold = self.known[key]["pair_id"], self.known[key]["gold"]
            if conflict is not None:
                d.conflicts.append({"task_key": key, "pair_id": pair_id, **conflict})
            votes = self._votes(task_rows)
            sink = d.gold_votes if gold else d.pair_votes
            sink.extend(Annotation(key, r["annotator"], r["label"]) for r in votes)
            if gold:
                self.counts["gold_tasks"] += 1
                d.gold_map[key] = "chosen"  # the on-topic answer always plays the chosen side
                continue
            self.counts["pair_tasks"] += 1
            row = self._verdict_row(key, pair_id, votes, conflict, pairs.get(pair_id))
            if row["judge"] is not None:
                d.judge_map[key] = row["judge"]
            d.verdicts.append(row)
            reasons = ["conflicting_copies"] if conflict is not None else []
            if row["n_votes"] >= 2 and row["majority"] is None:
                reasons.append("no_majority")
            reasons += [f for f in FLAG_NAMES if row["flags"][f]]
            if reasons:
                comments = [r["comment"] for r in votes if r["comment"]]
                d.adjudicate.append(row | {"reasons": reasons, "comments": comments})
        return d

    def _votes(self, task_rows: list[dict]) -> list[dict]:
        """A task's votes: one per annotator; one who voted differently on two copies has
        none."""
        by_annotator: dict[str, set[str]] = {}
        for r in task_rows:
            if r["label"] is not None:
                by_annotator.setdefault(str(r["annotator"]), set()).add(r["label"])
        voted = {a: next(iter(ls)) for a, ls in by_annotator.items() if len(ls) == 1}
        votes = [r for r in task_rows if r["label"] is not None and str(r["annotator"]) in voted]
        votes = list({str(r["annotator"]): r for r in votes}.values())
        self.counts["cancelled"] += sum(r["was_cancelled"] for r in task_rows)
        self.counts["empty"] += sum(
            not r["was_cancelled"] and r["label"] is None for r in task_rows
        )
        self.counts["annotated_tasks" if votes else "unannotated_tasks"] += 1
        return votes

    def _verdict_row(
        self, key: str, pair_id: str | None, votes: list[dict], conflict: dict | None,
        pair: dict | None,
    ) -> dict[str, Any]:  # fmt: skip
        """A pair task's row of verdicts.jsonl."""
        labels = [r["label"] for r in votes]
        v = verdict(labels, self.min_votes)
        if conflict is not None:
            v["status"] = UNRESOLVED  # a copy never decides a pair
        flags = Counter(f for r in votes for f in r["flags"])
        confs = [r["confidence"] for r in votes if r["confidence"] is not None]
        task_ids = sorted(self.task_ids_of[key], key=lambda t: (str(type(t)), t))
        row = {
            "pair_id": pair_id,
            "task_key": key,
            "task_id": task_ids[0] if task_ids else None,
            "n_votes": len(labels),
            "votes": dict(Counter(labels)),
            **v,
            "flags": {f: flags.get(f, 0) for f in FLAG_NAMES},
            "mean_confidence": round(sum(confs) / len(confs), 3) if confs else None,
            "judge": judge_direction(pair) if pair_id is not None else None,
            "annotators": [r["annotator"] for r in votes],
        }
        if len(task_ids) > 1:
            row["task_ids"] = task_ids
        if conflict is not None:
            row["conflict"] = conflict["why"]
        self.counts[v["status"]] += 1
        return row

    def counted(
        self, origin: dict[str, Any], d: _Decided, agreement: dict[str, Any]
    ) -> dict[str, Any]:
        """The round's counts (agreement.json's, and the command's output)."""
        c, skipped, min_votes = self.counts, self.skipped, self.min_votes
        short = [r for r in d.verdicts if 0 < r["n_votes"] < min_votes]
        return {
            "round": self.rnd.number,
            "project_id": origin["project_id"],
            "url": origin["url"],
            "export_file": origin["file"],
            "tasks": len(self.keys_seen),
            "pair_tasks": c["pair_tasks"],
            "gold_tasks": c["gold_tasks"],
            "foreign_tasks": c["foreign_tasks"],
            "duplicate_task_keys": sum(n - 1 for n in self.keys_seen.values() if n > 1),
            "annotated_tasks": c["annotated_tasks"],
            "unannotated_tasks": c["unannotated_tasks"],
            "annotations_total": c["annotations_total"],
            "annotation_rows": len(d.rows),
            "votes": len(d.pair_votes) + len(d.gold_votes),
            "pooled_duplicates": c["pooled_duplicates"],
            "conflicts": len(d.conflicts),
            "conflicting_pairs": d.conflicts,
            "cancelled": c["cancelled"],
            "empty": c["empty"],
            "superseded": c["superseded"],
            "skipped_tasks": sum(1 for s in skipped if s["kind"] == "task"),
            "skipped_annotations": sum(1 for s in skipped if s["kind"] == "annotation"),
            "annotators": len({r["annotator"] for r in d.rows}),
            **{s: c[s] for s in STATUSES},
            "adjudication": len(d.adjudicate),
            "min_votes": min_votes,
            "short_of_votes": len(short),
            "votes_note": votes_note(len(short), len(d.verdicts), min_votes, short),
            "krippendorff_alpha": agreement["krippendorff_alpha"],
            "raw_agreement": agreement["raw_agreement"],
            "gold_accuracy_overall": agreement["gold_accuracy_overall"],
        }

    def write(self, d: _Decided, agreement: dict[str, Any]) -> None:
        """The round's files; the same export imported again leaves agreement.json as it
        was, its time included."""
        rnd = self.rnd
        _write_rows(rnd.annotations, d.rows)
        _write_rows(rnd.verdicts, d.verdicts)
        _write_rows(rnd.adjudication, d.adjudicate)
        _write_rows(rnd.skipped, self.skipped)
        before = _earlier_agreement(rnd)
        if before is None or _without_time(before) != _without_time(agreement):
            write_json_atomic(rnd.agreement, agreement | {"time": time.time()})


def _agreement(d: _Decided) -> dict[str, Any]:
    """Agreement among the annotators, with the judge, and on the gold tasks."""
    agreement = summarize(d.pair_votes, judge=d.judge_map)
    agreement["gold_accuracy"] = gold_accuracy(d.gold_votes, d.gold_map)
    agreement["gold_votes"] = len(d.gold_votes)
    n_gold_right = sum(v["correct"] for v in agreement["gold_accuracy"].values())
    n_gold_graded = sum(v["n"] for v in agreement["gold_accuracy"].values())
    agreement["gold_accuracy_overall"] = n_gold_right / n_gold_graded if n_gold_graded else None
    return agreement


def votes_note(short: int, pairs: int, min_votes: int, rows: list[dict[str, Any]]) -> str | None:
    """Why pairs with votes stay unresolved for want of more, in one line: a pair is
    verified or refuted only with ``annotation.min_votes`` votes (printed by the import,
    kept in agreement.json's counts); None when no pair has some votes but too few."""
    if not short:
        return None
    most = max(r["n_votes"] for r in rows)
    return (
        f"{short} of {pairs} pairs have fewer votes than annotation.min_votes ({min_votes}; "
        f"the most any of them has is {most}), so they can be neither verified nor "
        "refuted: have more annotators vote on them, or set annotation.min_votes lower "
        f"(--set annotation.min_votes={max(most, 1)}) and import again"
    )


def _without_time(agreement: dict[str, Any]) -> str:
    return json.dumps({**agreement, "time": None}, sort_keys=True, default=str)


def _earlier_agreement(rnd: Round) -> dict[str, Any] | None:
    try:
        got = read_json(rnd.agreement)
    except (OSError, ValueError):
        return None
    return got if isinstance(got, dict) else None
