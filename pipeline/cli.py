"""The `prb` command. Heavy modules are imported inside each command so --help is instant."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def _add_set(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY.PATH=VALUE",
        help="override a config field (repeatable), e.g. --set responses.n=4",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="prb",
        description="Build benchmarks for personalized reward models (personalized-rewardbench).",
    )
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("run", help="run the pipeline stages in order, resuming finished work")
    p.add_argument("config", type=Path, help="the run's YAML config")
    p.add_argument("--until", metavar="STAGE", help="stop after this stage")
    p.add_argument("--only", metavar="STAGE", help="run only this stage (upstream must be done)")
    p.add_argument("--no-progress", action="store_true", help="hide progress bars")
    _add_set(p)

    p = sub.add_parser("config", help="inspect configs")
    csub = p.add_subparsers(dest="config_command", metavar="ACTION")
    show = csub.add_parser("show", help="print the resolved config")
    show.add_argument("config", type=Path)
    show.add_argument("--describe", action="store_true", help="also list every field's meaning")
    _add_set(show)
    fields = csub.add_parser("fields", help="list every config field with its default and meaning")
    fields.add_argument("--markdown", action="store_true", help="as a Markdown table")

    p = sub.add_parser("status", help="show each stage of a run: done, partial or not started")
    p.add_argument("run", type=Path, help="a run directory (outputs/<run>) or the run's config")
    _add_set(p)
    return parser


def _run_dir(target: Path, overrides: list[str]) -> Path:
    if target.is_file() and target.suffix in (".yaml", ".yml"):
        from pipeline.config import load_config

        return load_config(target, overrides).run_dir
    return target


def cmd_run(args: argparse.Namespace) -> int:
    from pipeline.config import load_config
    from pipeline.orchestrate import run_pipeline

    cfg = load_config(args.config, args.overrides)
    run_pipeline(cfg, until=args.until, only=args.only, progress=not args.no_progress)
    print(f"run directory: {cfg.run_dir}")
    return 0


def cmd_config(args: argparse.Namespace) -> int:
    from pipeline.config import describe_fields, load_config

    if args.config_command == "fields":
        if args.markdown:
            print("| field | default | meaning |\n|---|---|---|")
            for name, default, desc in describe_fields():
                print(f"| `{name}` | `{default}` | {desc} |")
            return 0
        for name, default, desc in describe_fields():
            print(f"{name:40s} {default:28s} {desc}")
        return 0
    if args.config_command != "show":
        print("usage: prb config {show CONFIG | fields}", file=sys.stderr)
        return 2
    cfg = load_config(args.config, args.overrides)
    print(cfg.to_yaml(), end="")
    if args.describe:
        print()
        for name, default, desc in describe_fields():
            print(f"# {name}: {desc} (default {default})")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    from pipeline.cache import RequestCache
    from pipeline.rundir import RunDir
    from pipeline.stages import ORDER

    path = _run_dir(args.run, args.overrides)
    if not path.exists():
        print(f"{path}: no such run directory", file=sys.stderr)
        return 1
    rd = RunDir(path)
    print(f"run: {path}")
    for name in ORDER:
        state, done, expected = rd.stage(name).status()
        if state == "partial":
            state = f"partial ({done} of {expected if expected is not None else '?'} examples)"
        elif state == "done":
            state = f"done ({done} examples)"
        print(f"  {name:12s} {state}")
    if rd.cache_path.exists():
        with RequestCache(rd.cache_path, readonly=True) as cache:
            print(f"  cache: {cache.count()} answered requests, {len(cache.errors())} errors")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.version:
        from pipeline import __version__

        print(__version__)
        return 0
    handlers = {"run": cmd_run, "config": cmd_config, "status": cmd_status}
    if args.command not in handlers:
        parser.print_help()
        return 2
    from pipeline.errors import PipelineError

    try:
        return handlers[args.command](args)
    except PipelineError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted; finished work is kept, run the same command to resume", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
