"""Send a verification round to Label Studio (``prb annotate export RUN --round N``).

The round's tasks (see :mod:`pipeline.annotate.tasks`) go to the project titled
``prb <run> round N``, created if missing. The project's existing tasks are listed first and
only tasks whose key is not there yet are imported, so running the export again, or after
an interrupted one, adds exactly what is missing and never duplicates a task.

Files under ``<run>/annotate/round-N/``:

- ``tasks.json``: the tasks as a Label Studio import file (also importable by hand); each
  task records its ``pair_id``, ``task_key`` and ``a_side``.
- ``export.json``: project id, server URL (never the token), seed and counts.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from pipeline.annotate.errors import LabelStudioError
from pipeline.annotate.tasks import (
    RoundPlan,
    build_round,
    guidelines_html,
    label_config,
    project_title,
    public_task,
    sides_of,
)
from pipeline.config import Config
from pipeline.core.io import read_json, write_json_atomic
from pipeline.core.redact import public_url
from pipeline.run import RunDir

CLIENT_TIMEOUT_S = 300.0  # a full project export of thousands of tasks is one response
PAGE_SIZE = 1000


# ---- connecting ----------------------------------------------------------------------------


def server_url(config: Config) -> str:
    """``annotation.url``, or the local server ``prb annotate serve`` starts."""
    url = config.annotation.url or f"http://127.0.0.1:{config.annotation.port}"
    return url.rstrip("/")


def client_url(client: Any) -> str:
    """The server's URL as shown and recorded: without any user:password@ or query key."""
    return public_url(str(client._client_wrapper.get_base_url()).rstrip("/"))


def check_connection(client: Any, url: str, token_env: str | None = None) -> dict[str, Any]:
    """Fail clearly unless ``url`` is a Label Studio that accepts the token.

    One cheap authenticated call (who am I) before anything is sent. Messages name the URL
    and the variable holding the token, never the token.
    """
    import httpx
    from label_studio_sdk.core.api_error import ApiError

    url = public_url(url)  # only shown in messages from here on
    where = f"${token_env}" if token_env else "the API token"
    try:
        me = client.users.whoami()
    except httpx.TransportError as exc:
        raise LabelStudioError(
            f"cannot reach Label Studio at {url} ({type(exc).__name__}); start the local "
            "server with `prb annotate serve` or set annotation.url"
        ) from None
    except ApiError as exc:
        if exc.status_code in (401, 403):
            raise LabelStudioError(
                f"Label Studio at {url} rejected the token in {where} (HTTP {exc.status_code}); "
                "copy the token from Account & Settings, or for the local server from "
                "`prb annotate serve`'s output"
            ) from None
        raise LabelStudioError(
            f"{url} answered HTTP {exc.status_code} to GET /api/current-user/whoami; "
            "is it a Label Studio server?"
        ) from None
    except Exception as exc:  # an HTML page or garbage: not a Label Studio API
        raise LabelStudioError(
            f"{url} did not answer like a Label Studio server ({type(exc).__name__})"
        ) from None
    return {"id": getattr(me, "id", None), "email": getattr(me, "email", None)}


def connect(config: Config, *, url: str | None = None, token: str | None = None) -> Any:
    """A Label Studio SDK client for the configured server, checked before use.

    The token comes from the environment variable named by ``annotation.token_env``.
    """
    try:
        from label_studio_sdk import LabelStudio
    except ImportError:
        raise LabelStudioError(
            "the Label Studio client is not installed: pip install label-studio-sdk==2.1.2"
        ) from None

    url = (url or server_url(config)).rstrip("/")
    env = config.annotation.token_env
    token = token if token is not None else os.environ.get(env)
    if not token:
        raise LabelStudioError(
            f"no Label Studio API token: set the environment variable {env} "
            f"(the token of a user on {url})"
        )
    client = LabelStudio(base_url=url, api_key=token, timeout=CLIENT_TIMEOUT_S)
    check_connection(client, url, env)
    return client


# ---- projects and tasks --------------------------------------------------------------------


def find_project(client: Any, title: str) -> Any | None:
    """The project with exactly this title (the oldest if several), or None."""
    # the server filters by "title contains"; keep exact matches only
    found = [p for p in client.projects.list(title=title, page_size=100) if p.title == title]
    return min(found, key=lambda p: p.id) if found else None


def find_or_create_project(
    client: Any, title: str, *, description: str = "", overlap: int = 3
) -> tuple[Any, bool]:
    """The round's project (found by title), created with our labeling config if missing.

    ``overlap`` is how many annotators Label Studio hands each task to.
    """
    guidelines = guidelines_html()
    project = find_project(client, title)
    if project is not None:
        if not (project.expert_instruction or "").strip():
            # a round exported before the guidelines were sent: fill them in (never over
            # instructions someone wrote in Label Studio)
            project = client.projects.update(
                project.id, expert_instruction=guidelines, show_instruction=True
            )
        return project, False
    project = client.projects.create(
        title=title,
        description=description,
        label_config=label_config(),
        # annotation/guidelines.md, opened before an annotator's first task and from the
        # labeling page: when to pick tie or both bad, what the flags mean, and not to
        # reward length or polish on their own
        expert_instruction=guidelines,
        show_instruction=True,
        show_skip_button=True,
        maximum_annotations=overlap,
    )
    return project, True


def iter_task_data(client: Any, project_id: int) -> Iterator[dict[str, Any]]:
    """The ``data`` of every task in the project (paginated listing, no annotations)."""
    # include=id,data skips the per-task counters the listing computes otherwise:
    # measured 1.9 s instead of 4.8 s for 3,000 tasks (benchmarks/annotation_roundtrip.py)
    pages = client.tasks.list(
        project=project_id, fields="task_only", include="id,data", page_size=PAGE_SIZE
    )
    for task in pages:
        yield task.data or {}


def existing_task_keys(client: Any, project_id: int) -> Counter:
    """How many tasks the project holds per task key (tasks without a key are ignored)."""
    return Counter(d["task_key"] for d in iter_task_data(client, project_id) if "task_key" in d)


def _batches(items: Sequence[dict], size: int) -> Iterator[Sequence[dict]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


# ---- the round -----------------------------------------------------------------------------


def plan_round(config: Config, run_dir: str | Path, round_no: int) -> RoundPlan:
    a = config.annotation
    return build_round(
        run_dir,
        round_no,
        sample_size=a.sample_size,
        stratify_by=list(a.stratify_by),
        gold_tasks=a.gold_tasks,
        base_seed=config.run.seed,
    )


def _check_same_round(path: Path, plan: RoundPlan) -> None:
    """A round's task set is fixed once written: refuse to silently send a different one."""
    if not path.exists():
        return
    before = [t["data"]["task_key"] for t in read_json(path)]
    if sorted(before) != sorted(plan.keys()):
        new = len(set(plan.keys()) - set(before))
        gone = len(set(before) - set(plan.keys()))
        raise LabelStudioError(
            f"{path}: round {plan.round_no} was exported with a different task set "
            f"({new} new, {gone} no longer drawn; the pairs or the annotation settings "
            "changed); export a new round number instead"
        )


def export_round(
    config: Config,
    run_dir: str | Path,
    round_no: int,
    *,
    client: Any | None = None,
    file_only: bool = False,
) -> dict[str, Any]:
    """Write the round's task file and send the tasks the project does not have yet."""
    run_dir = Path(run_dir)
    rnd = RunDir(run_dir).round(round_no)
    plan = plan_round(config, run_dir, round_no)
    tasks_path = rnd.tasks
    _check_same_round(tasks_path, plan)
    title = project_title(run_dir, round_no)
    summary: dict[str, Any] = {
        "run": run_dir.resolve().name,
        "round": round_no,
        "title": title,
        "seed": plan.seed,
        "ab_seed": plan.seed,
        "tasks": len(plan.tasks),
        "pairs": plan.n_pairs,
        "gold": plan.n_gold,
        "gold_note": plan.gold_note,
        "excluded_from_earlier_rounds": plan.excluded,
        "strata": plan.strata,
        "stratify_by": list(config.annotation.stratify_by),
        "a_side_counts": dict(Counter(t["data"]["a_side"] for t in plan.tasks)),
        "tasks_file": str(tasks_path),
        "file_only": file_only,
    }

    if not file_only:
        # connect and check before writing anything that claims the round was sent
        if client is None:
            client = connect(config)
        else:
            check_connection(client, client_url(client), config.annotation.token_env)
    # the answer key (which side is A) stays local; what annotators can see goes out
    write_json_atomic(rnd.sides, sides_of(plan.tasks))
    public = [public_task(t) for t in plan.tasks]
    write_json_atomic(tasks_path, public)
    if file_only:
        summary.update(project_id=None, url=None, sent=0, already_there=0, status="file_only")
        write_json_atomic(rnd.export, summary | {"time": time.time()})
        return summary

    assert client is not None  # connected above whenever file_only is false
    url = client_url(client)
    project, created = find_or_create_project(
        client,
        title,
        description=f"Human verification of {summary['run']}, round {round_no}",
        # annotators per task: the smallest odd number >= min_votes (at least 3), so two
        # people who disagree get a third who breaks the tie
        overlap=max(3, config.annotation.min_votes | 1),
    )
    existing = existing_task_keys(client, project.id)
    wanted = set(plan.keys())
    missing = [t for t in public if t["data"]["task_key"] not in existing]
    summary.update(
        url=url,
        project_id=project.id,
        project_created=created,
        already_there=sum(1 for k in existing if k in wanted),
        duplicates_on_server=sum(n - 1 for n in existing.values() if n > 1),
        unknown_on_server=sum(n for k, n in existing.items() if k not in wanted),
        sent=0,
        status="sending",
    )
    # Written before sending: an interrupted export still leaves the project id for import.
    write_json_atomic(rnd.export, summary | {"time": time.time()})
    try:
        for batch in _batches(missing, config.annotation.batch_size):
            # No automatic retry: a POST retried after a lost response could import the
            # batch twice. A failed batch fails the command; running it again sends what is
            # missing.
            client.projects.import_tasks(
                id=project.id, request=list(batch), request_options={"max_retries": 0}
            )
            summary["sent"] += len(batch)
    except BaseException as exc:
        summary["status"] = "interrupted"
        write_json_atomic(rnd.export, summary | {"time": time.time()})
        import httpx
        from label_studio_sdk.core.api_error import ApiError

        if isinstance(exc, (ApiError, httpx.HTTPError)):
            if isinstance(exc, ApiError):
                what = f"HTTP {exc.status_code}: {str(exc.body)[:300]}"
            else:
                what = type(exc).__name__
            raise LabelStudioError(
                f"importing tasks into project {project.id} at {url} failed ({what}) after "
                f"{summary['sent']} of {len(missing)}; run the export again to send the rest"
            ) from None
        raise
    summary["status"] = "complete"
    summary["tasks_on_server"] = summary["already_there"] + summary["sent"]
    write_json_atomic(rnd.export, summary | {"time": time.time()})
    return summary
