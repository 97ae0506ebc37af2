"""`prb batch export` and `prb batch import` (docs/batch.md); the work is in
pipeline/batch/files.py, imported when a command runs."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from pipeline.core.cliargs import add_set_option as _add_set
from pipeline.core.cliargs import command_line
from pipeline.core.redact import redact


def add_batch_parser(sub: Any) -> None:
    p = sub.add_parser(
        "batch",
        help="batch files for a runner with no server (vLLM run_batch on a cluster): export "
        "the requests, import the results",
        description="The cluster loop, for a config with backend.name batchfile: `prb batch "
        "export CONFIG` writes the requests the next stage would send as OpenAI batch JSONL; "
        "answer them elsewhere (python -m vllm.entrypoints.openai.run_batch -i FILE -o "
        "RESULTS); `prb batch import CONFIG RESULTS` checks every result line and stores the "
        "answers in the run's cache; repeat until export has nothing to write. See "
        "docs/batch.md.",
    )
    bsub = p.add_subparsers(dest="batch_command", metavar="ACTION")
    ex = bsub.add_parser(
        "export",
        help="write the requests the next stage waits for as OpenAI batch JSONL",
        description="Run the stages as `prb run` does, with the answers imported so far, "
        "until the first stage that waits for answers, and write the requests it waits for "
        "(custom_id: the request's cache key). Contacts no server.",
    )
    ex.add_argument("config", type=Path, help="the run's YAML config (backend.name batchfile)")
    ex.add_argument(
        "-o",
        "--out",
        type=Path,
        help="the file to write (default: batch/requests-STAGE-NNN.jsonl in the run directory)",
    )
    ex.add_argument("--no-progress", action="store_true", help="hide progress bars")
    _add_set(ex)
    im = bsub.add_parser(
        "import",
        help="check result files (vLLM run_batch / OpenAI batch output) and store their answers",
        description="Check every result line (JSON, a custom_id this run exported, once, "
        "status 200 without error, a finished answer from the model the request names), "
        "keep the answers, and run the stages so that each answer is validated, cached or "
        "re-asked as an answer from a server would be. Lines that fail a check are named and "
        "skipped, never cached; their requests go out in the next export.",
    )
    im.add_argument("config", type=Path, help="the run's YAML config (backend.name batchfile)")
    im.add_argument("files", type=Path, nargs="+", metavar="FILE", help="result JSONL files")
    im.add_argument("--no-progress", action="store_true", help="hide progress bars")
    _add_set(im)
    p.set_defaults(batch_handler=cmd_batch)


def cmd_batch(args: argparse.Namespace) -> int:
    from pipeline.batch.files import SHOWN_LINES, describe_next, export_requests, import_results
    from pipeline.config import load_config

    if args.batch_command not in ("export", "import"):
        print("usage: prb batch {export,import} CONFIG ...", file=sys.stderr)
        return 2
    cfg = load_config(args.config, args.overrides)
    run = command_line(["prb", "run", args.config], args.overrides)
    kw: dict[str, Any] = {"progress": not args.no_progress, "command": run}
    if args.batch_command == "export":
        done = export_requests(cfg, args.out, **kw)
        if done.path is None:
            print(describe_next(run, None, 0))
            return 0
        model = cfg.backend.model
        words = ["prb", "batch", "import", args.config, "results.jsonl"]
        then = command_line(words, args.overrides)
        print(
            f"wrote {done.requests} requests of stage '{done.stage}' to {done.path}; answer "
            f"them, e.g. `python -m vllm.entrypoints.openai.run_batch -i {done.path.name} "
            f"-o results.jsonl --model {model}`, then `{then}`"
        )
        return 0
    res = import_results(cfg, args.files, **kw)
    for line in res.named[:SHOWN_LINES]:
        print(redact(f"skipped {line}"), file=sys.stderr)
    if len(res.named) > SHOWN_LINES:
        print(f"... and {len(res.named) - SHOWN_LINES} more skipped lines", file=sys.stderr)
    print(res.summary(args.files))
    print(describe_next(run, res.stopped, res.waiting))
    return 0
