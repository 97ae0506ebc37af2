"""``prb annotate {serve,export,import}``: the parser and the handler (pipeline/cli/prb.py
registers them).

Only argparse, pathlib and the package's errors module are imported at module level, so
``prb --help`` stays instant; the commands' modules load when a command runs.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from pipeline.annotate.errors import LabelStudioError
from pipeline.core.cliargs import add_set_option as _add_set

# Rounds are numbered from 1; a run has a handful. The cap only keeps a typo (an extra
# digit or two) from naming a folder and a project nobody meant.
MAX_ROUND = 10_000


def round_number(text: str) -> int:
    """``--round`` as typed: a whole number from 1 to MAX_ROUND (argparse's ``type``)."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"must be a round number (1, 2, ...), got {text!r}"
        ) from None
    if not 1 <= n <= MAX_ROUND:
        raise argparse.ArgumentTypeError(
            f"round numbers run from 1 to {MAX_ROUND}, got {n}; the first round is --round 1"
        )
    return n


def add_annotate_parser(sub: argparse._SubParsersAction) -> None:
    """Add ``prb annotate {serve,export,import}`` to the CLI's subparsers."""
    p = sub.add_parser("annotate", help="human verification rounds in Label Studio")
    asub = p.add_subparsers(dest="annotate_command", metavar="ACTION")

    s = asub.add_parser("serve", help="run a local Label Studio on 127.0.0.1 until Ctrl-C")
    s.add_argument(
        "config",
        nargs="?",
        type=Path,
        help="a run config or run directory for the annotation settings (default settings)",
    )
    s.add_argument("--port", type=int, help="port (default annotation.port)")
    _add_set(s, "annotation.port=8081")

    e = asub.add_parser(
        "export", help="send a round's tasks to Label Studio (again: adds only what is missing)"
    )
    e.add_argument("run", type=Path, help="a run directory (outputs/<run>) or the run's config")
    e.add_argument(
        "--round", dest="round_no", type=round_number, required=True, help="round number (1..)"
    )
    e.add_argument(
        "--file-only", action="store_true", help="only write tasks.json; contact no server"
    )
    _add_set(e, "annotation.sample_size=100")

    i = asub.add_parser("import", help="pull a round's annotations: verdicts and agreement")
    i.add_argument("run", type=Path, help="a run directory (outputs/<run>) or the run's config")
    i.add_argument(
        "--round", dest="round_no", type=round_number, required=True, help="round number (1..)"
    )
    i.add_argument(
        "--from-file",
        dest="from_file",
        type=Path,
        metavar="EXPORT.json",
        help="read a JSON export downloaded from Label Studio (Export > JSON) instead of "
        "asking the server; needs no server or token",
    )
    i.add_argument(
        "--replace",
        action="store_true",
        help="replace the round's votes with this export's (by default an import merges: "
        "votes of earlier imports that this export lacks are kept)",
    )
    _add_set(i, "annotation.min_votes=3")


def load_annotate_config(target: Path | None, overrides: list[str]) -> tuple[Any, Path | None]:
    """(config, run directory) from a run config file, a run directory (its run.yaml), or
    nothing (defaults)."""
    from pipeline.config import config_from_overrides
    from pipeline.run import open_run

    if target is None:
        return config_from_overrides(overrides), None
    rd, cfg = open_run(target, overrides)
    if cfg is None:
        raise LabelStudioError(
            f"{rd.shown}: the run's run.yaml cannot be read; pass the run's config file instead"
        )
    return cfg, rd.path


def cmd_annotate(args: argparse.Namespace) -> int:
    """Handler for ``prb annotate ...``; returns the exit code."""
    action = getattr(args, "annotate_command", None)
    if action not in ("serve", "export", "import"):
        print(
            "usage: prb annotate {serve [CONFIG] | export RUN --round N | "
            "import RUN --round N [--from-file EXPORT.json] [--replace]}"
        )
        return 2
    if action == "serve":
        from pipeline.annotate.server import serve

        cfg, _ = load_annotate_config(args.config, args.overrides)
        return serve(cfg, port=args.port)
    cfg, run_dir = load_annotate_config(args.run, args.overrides)
    if run_dir is None:
        raise LabelStudioError(f"annotate {action} needs a run: pass its config file or folder")
    if action == "export":
        from pipeline.annotate.export import export_round

        s = export_round(cfg, run_dir, args.round_no, file_only=args.file_only)
        print(
            f"round {s['round']}: {s['tasks']} tasks ({s['pairs']} pairs + {s['gold']} gold; "
            f"{s['excluded_from_earlier_rounds']} pairs left out as sent in earlier rounds)"
        )
        if s.get("gold_note"):
            print(f"note: {s['gold_note']}")
        if s["file_only"]:
            print(f"wrote {s['tasks_file']} (import it by hand in Label Studio)")
        else:
            print(
                f"project {s['project_id']} '{s['title']}' at {s['url']}: sent {s['sent']}, "
                f"already there {s['already_there']}"
            )
        return 0
    from pipeline.annotate.importer import SHOW_SKIPPED, import_round

    s = import_round(cfg, run_dir, args.round_no, export_file=args.from_file, replace=args.replace)
    alpha = s["krippendorff_alpha"]
    merged = (
        "replaced the round's earlier votes"
        if s["replaced"]
        else f"{s['new_votes']} new and {s['changed_votes']} changed votes merged with "
        f"{s['kept_from_earlier_imports']} from earlier imports"
    )
    print(
        f"round {s['round']}: {merged}\n"
        f"{s['tasks']} tasks, {s['annotated_tasks']} annotated, "
        f"{s['votes']} votes from {s['annotators']} annotators "
        f"({s['cancelled']} skipped, {s['superseded']} superseded)\n"
        f"verified {s['verified']}, refuted {s['refuted']}, unresolved {s['unresolved']}; "
        f"{s['adjudication']} to adjudicate; alpha "
        + (f"{alpha:.3f}" if alpha is not None else "n/a")
    )
    if s.get("votes_note"):
        print(f"note: {s['votes_note']}")
    if s["duplicate_task_keys"] or s["pooled_duplicates"]:
        same = s["pooled_duplicates"]
        print(
            f"{s['duplicate_task_keys']} tasks repeat a task already in the export: one pair "
            "each" + (f", {same} identical annotations counted once" if same else "")
        )
    for c in s["conflicting_pairs"][:SHOW_SKIPPED]:
        print(
            f"conflict: pair {c['pair_id']} is in tasks {', '.join(map(str, c['task_ids']))} "
            f"and {c['why']}; it stays unresolved (in adjudication.jsonl)"
        )
    left_out = s["skipped"]
    if left_out:
        listing = s["skipped_file"]
        parts = [
            f"{n} {what}{'s' if n != 1 else ''}"
            for n, what in ((s["skipped_tasks"], "task"), (s["skipped_annotations"], "annotation"))
            if n
        ]
        print(
            f"left out {' and '.join(parts)} that do not fit Label Studio's export format or "
            f"this round (all listed in {listing}); fix them in Label Studio and import again:"
        )
        for row in left_out[:SHOW_SKIPPED]:
            what = f"task {row['task_id']}"
            if row["kind"] == "annotation":
                what += f", annotation {row['annotation_id']}"
            print(f"  {what}: {row['reason']}")
        if len(left_out) > SHOW_SKIPPED:
            print(f"  ... and {len(left_out) - SHOW_SKIPPED} more in {listing}")
    return 0
