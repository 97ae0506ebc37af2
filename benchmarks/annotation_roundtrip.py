"""Annotation round trip through a real Label Studio: export 3,000 tasks, import 3,000 annotations.

Data is SYNTHETIC (tests/test_annotate_tasks.py ``make_synthetic_run``: made-up words, not
model output). A fresh Label Studio 1.23.2 (from ``PRB_LABEL_STUDIO_VENV``, default
``.labelstudio/venv``) runs on a free loopback port with a temporary data dir, deleted at
the end. Timed, each with the SDK client already connected:

- ``export``: ``export_round`` of 2,950 sampled pairs + 50 gold tasks = 3,000 tasks into a
  new project (sampling, BM25 profile views, listing the empty project, imports in batches
  of ``annotation.batch_size``), plus the sampling/task-building part alone for context;
- ``re-export``: the same export again (lists 3,000 tasks, sends nothing);
- ``import``: ``import_round`` after 3,000 annotations exist (1,000 tasks x 3 annotators,
  created through the API beforehand, untimed): full JSON export download, A/B mapping,
  verdicts, agreement, four output files.

Target from the issue: export and import each under 30 s on this machine.

Writes benchmarks/results/annotation_roundtrip.json::

    .venv/bin/python benchmarks/annotation_roundtrip.py [--tasks 3000] [--out PATH]
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.metadata as md
import json
import os
import platform
import random
import secrets
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
for p in (ROOT, ROOT / "tests"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

import test_annotate_tasks as synth  # noqa: E402

from pipeline.annotate.export import export_round, plan_round  # noqa: E402
from pipeline.annotate.importer import import_round  # noqa: E402
from pipeline.annotate.server import LabelStudioServer, free_port, installed_version  # noqa: E402

DEFAULT_OUT = ROOT / "benchmarks" / "results" / "annotation_roundtrip.json"
TARGET_SECONDS = 30.0
GOLD = 50
ANNOTATORS = ("ann1", "ann2", "ann3")


def machine() -> dict[str, Any]:
    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            cpu = next(line.split(":", 1)[1].strip() for line in fh if "model name" in line)
    except (OSError, StopIteration):
        pass
    return {
        "cpu_count": os.cpu_count(),
        "cpu": cpu,
        "platform": platform.platform(),
        "python": platform.python_version(),
        # other work on the machine slows the timings; this says how busy it was
        "load_average_1_5_15min": [round(x, 2) for x in os.getloadavg()],
    }


def _choice_result(letter: str) -> list[dict]:
    return [
        {
            "from_name": "choice",
            "to_name": "question",
            "type": "choices",
            "value": {"choices": [letter]},
        }
    ]


def create_annotations(
    client: Any, project_id: int, n: int, seed: int, sides: dict[str, str]
) -> dict[str, Any]:
    """``n`` annotations: the first n/3 tasks get one from each of three API-created users.
    ``sides``: task_key -> a_side, from the round's plan (the server's tasks do not hold it)."""
    users = {}
    for name in ANNOTATORS:
        u = client.users.create(
            username=name, email=f"{name}@bench.test", password=secrets.token_urlsafe(12)
        )
        users[name] = u.id
    tasks = list(client.tasks.list(project=project_id, fields="task_only", page_size=1000))
    tasks.sort(key=lambda t: t.id)
    per_task = len(ANNOTATORS)
    todo = [(t, name) for t in tasks[: n // per_task] for name in ANNOTATORS]
    rng = random.Random(seed)
    # mostly "chosen" votes (70%), clicked as A or B by each task's a_side, so the agreement
    # figures are neither degenerate nor perfect
    labels = [
        rng.choices(["chosen", "rejected", "tie", "both bad"], [70, 20, 7, 3])[0] for _ in todo
    ]
    letters = [
        ("A" if lab == sides[t.data["task_key"]] else "B") if lab in ("chosen", "rejected") else lab
        for (t, _), lab in zip(todo, labels, strict=True)
    ]

    def post(job: tuple[tuple[Any, str], str]) -> None:
        (task, name), letter = job
        client.annotations.create(
            id=task.id, result=_choice_result(letter), completed_by=users[name]
        )

    t0 = time.perf_counter()
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(post, zip(todo, letters, strict=True)))
    return {"created": len(todo), "seconds_untimed": round(time.perf_counter() - t0, 2)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=3000, help="tasks to export (incl. 50 gold)")
    ap.add_argument("--annotations", type=int, default=3000)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--seed", type=int, default=0)
    from _smoke import add_flag as add_smoke_flag
    from _smoke import apply as apply_smoke

    add_smoke_flag(ap)
    args = ap.parse_args(argv)
    apply_smoke(args, tasks=60, annotations=30)

    venv = Path(os.environ.get("PRB_LABEL_STUDIO_VENV", ROOT / ".labelstudio" / "venv"))
    work = Path(tempfile.mkdtemp(prefix="prb-bench-annot-"))
    try:
        run_dir = work / "bench-run"
        synth.make_synthetic_run(run_dir, args.tasks + 300, seed=args.seed, shards=4)
        cfg = synth.make_config(
            work, sample_size=args.tasks - GOLD, gold_tasks=GOLD, batch_size=100
        )
        t0 = time.perf_counter()
        plan = plan_round(cfg, run_dir, 1)
        plan_s = time.perf_counter() - t0
        assert len(plan.tasks) == args.tasks

        server = LabelStudioServer(
            venv,
            work / "ls-data",
            port=free_port(),
            token=secrets.token_hex(20),
            password=secrets.token_urlsafe(12),
        )
        t0 = time.perf_counter()
        with server:
            startup_s = time.perf_counter() - t0
            from label_studio_sdk import LabelStudio

            client = LabelStudio(base_url=server.url, api_key=server.token, timeout=300)
            client.users.whoami()  # connection warm, SDK imported: not part of the timings
            cfg.annotation.url = server.url

            t0 = time.perf_counter()
            exp = export_round(cfg, run_dir, 1, client=client)
            export_s = time.perf_counter() - t0
            assert exp["sent"] == args.tasks, exp

            t0 = time.perf_counter()
            again = export_round(cfg, run_dir, 1, client=client)
            reexport_s = time.perf_counter() - t0
            assert again["sent"] == 0 and again["already_there"] == args.tasks, again

            sides = {t["data"]["task_key"]: t["data"]["a_side"] for t in plan.tasks}
            made = create_annotations(client, exp["project_id"], args.annotations, args.seed, sides)

            t0 = time.perf_counter()
            imp = import_round(cfg, run_dir, 1, client=client)
            import_s = time.perf_counter() - t0
            assert imp["annotations_total"] == made["created"], imp
            assert imp["votes"] == made["created"], imp
        assert not server.running
    finally:
        shutil.rmtree(work, ignore_errors=True)

    result = {
        "benchmark": "annotation round trip through a real Label Studio server",
        "smoke": args.smoke,
        "data": f"synthetic run ({args.tasks + 300} kept pairs, seed {args.seed}); "
        f"{args.tasks - GOLD} sampled pairs + {GOLD} gold tasks; "
        f"{made['created']} annotations = {made['created'] // 3} tasks x 3 API-created users, "
        "labels drawn independently (70% chosen, 20% rejected, 7% tie, 3% both bad), so "
        "agreement beyond chance is about zero by construction",
        "figures": {
            "export_seconds": round(export_s, 2),
            "export_tasks": exp["sent"],
            "export_tasks_per_second": round(exp["sent"] / export_s, 1),
            "plan_only_seconds": round(plan_s, 2),
            "re_export_seconds": round(reexport_s, 2),
            "import_seconds": round(import_s, 2),
            "import_annotations": imp["annotations_total"],
            "import_tasks": imp["tasks"],
            "import_annotations_per_second": round(imp["annotations_total"] / import_s, 1),
            "server_startup_seconds_fresh_data_dir": round(startup_s, 1),
            "annotation_creation_seconds_untimed": made["seconds_untimed"],
            "batch_size": cfg.annotation.batch_size,
        },
        "import_summary": {k: v for k, v in imp.items() if k not in ("url",)},
        "targets": {"export_seconds": TARGET_SECONDS, "import_seconds": TARGET_SECONDS},
        "meets_target": export_s <= TARGET_SECONDS and import_s <= TARGET_SECONDS,
        "machine": machine(),
        "versions": {
            "label-studio (server venv)": installed_version(venv),
            "label-studio-sdk": md.version("label-studio-sdk"),
            "personalized-rewardbench": md.version("personalized-rewardbench"),
        },
        "timestamp": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(
            [".venv/bin/python", "benchmarks/annotation_roundtrip.py", *sys.argv[1:]]
        ),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    f = result["figures"]
    print(
        f"export {f['export_tasks']} tasks: {f['export_seconds']} s "
        f"(plan alone {f['plan_only_seconds']} s; re-export {f['re_export_seconds']} s)\n"
        f"import {f['import_annotations']} annotations on {f['import_tasks']} tasks: "
        f"{f['import_seconds']} s\n"
        f"target <= {TARGET_SECONDS:.0f} s each: {'met' if result['meets_target'] else 'MISSED'}"
        f"\nwrote {args.out}"
    )
    return 0 if result["meets_target"] else 1


if __name__ == "__main__":
    sys.exit(main())
