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

    p = sub.add_parser(
        "quickstart",
        help="run everything on the hand-written sample, offline (replayed answers)",
    )
    p.add_argument(
        "--out", type=Path, default=Path("outputs"), help="output folder (default outputs)"
    )

    p = sub.add_parser("config", help="inspect configs")
    csub = p.add_subparsers(dest="config_command", metavar="ACTION")
    show = csub.add_parser("show", help="print the resolved config")
    show.add_argument("config", type=Path)
    show.add_argument("--describe", action="store_true", help="also list every field's meaning")
    _add_set(show)
    fields = csub.add_parser("fields", help="list every config field with its default and meaning")
    fields.add_argument("--markdown", action="store_true", help="as a Markdown table")

    p = sub.add_parser("inspect", help="list the pairs a filter dropped, with the reason")
    p.add_argument("run", type=Path, help="a run directory (outputs/<run>) or the run's config")
    p.add_argument("--reason", metavar="NAME", help="only drops with this reason (a filter name)")
    p.add_argument("--stage", default="pairs", help="stage whose rejects to list (default pairs)")
    p.add_argument("--limit", type=int, default=20, help="show at most this many (0: all)")
    p.add_argument("--json", action="store_true", help="print the rejected rows as JSON lines")
    _add_set(p)

    p = sub.add_parser("status", help="show each stage of a run: done, partial or not started")
    p.add_argument("run", type=Path, help="a run directory (outputs/<run>) or the run's config")
    _add_set(p)

    p = sub.add_parser(
        "publish", help="build the release: parquet per category plus 'all', and a dataset card"
    )
    p.add_argument("run", type=Path, help="a run directory (outputs/<run>) or the run's config")
    p.add_argument(
        "--policy",
        choices=["verified", "filtered"],
        default="filtered",
        help="verified: human-verified pairs only; filtered: every kept pair not refuted (default)",
    )
    p.add_argument("--out", type=Path, help="release folder (default: <run>/publish)")
    p.add_argument("--license", default="cc-by-4.0", help="license id for the card")
    p.add_argument(
        "--push-to-hub",
        metavar="REPO",
        help="also upload to this Hub dataset repo (token from HF_TOKEN; new repos are private)",
    )
    _add_set(p)

    p = sub.add_parser(
        "audit", help="report length bias, similarity, leakage and shortcuts (HTML + JSON)"
    )
    p.add_argument(
        "path",
        type=Path,
        help="a release folder, a run directory, or a JSONL / parquet / save_to_disk dataset "
        "in the reference schema",
    )
    p.add_argument("--out", type=Path, help="report folder (default: beside the input)")

    # pipeline.annotate imports only argparse, pathlib and the errors module at this point
    from pipeline.annotate import add_annotate_parser

    add_annotate_parser(sub)
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


def cmd_annotate(args: argparse.Namespace) -> int:
    from pipeline.annotate import cmd_annotate as run

    return run(args)


def cmd_quickstart(args: argparse.Namespace) -> int:
    from pipeline.quickstart import run_quickstart

    res = run_quickstart(args.out)
    print(f"run directory: {res['run_dir']}")
    print(f"annotation tasks: {res['annotation']['tasks_file']}")
    print(f"release: {res['publish']['out']}")
    print(f"audit report: {res['audit']['outputs']['html']}")
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


def cmd_inspect(args: argparse.Namespace) -> int:
    import json
    from collections import Counter

    from pipeline.rundir import RunDir

    path = _run_dir(args.run, args.overrides)
    sd = RunDir(path).stage(args.stage)
    if not sd.path.exists():
        print(f"{sd.path}: stage '{args.stage}' has not run", file=sys.stderr)
        return 1
    rejects = list(sd.rejects())
    counts = Counter(r["reason"] for r in rejects)
    if args.reason and args.reason not in counts:
        known = ", ".join(f"{k} ({v})" for k, v in counts.most_common()) or "none"
        print(f"no drops with reason '{args.reason}'; reasons here: {known}", file=sys.stderr)
        return 1
    chosen = [r for r in rejects if not args.reason or r["reason"] == args.reason]
    shown = chosen if args.limit == 0 else chosen[: args.limit]
    if args.json:
        for r in shown:
            print(json.dumps(r, ensure_ascii=False))
        return 0
    print(
        f"{args.stage}: {len(rejects)} dropped; by reason: "
        + ", ".join(f"{k} {v}" for k, v in counts.most_common())
    )
    for r in shown:
        print(f"- {r['example_id']} [{r['reason']}] {r.get('detail', '')}")
        for p in r.get("pairs", [])[:8]:
            print(
                f"    {p['strategy']:12s} {p['chosen_id']} vs {p['rejected_id']}: "
                f"{p['reason'] or 'kept'} {p.get('detail') or ''}"
            )
    if len(chosen) > len(shown):
        print(f"... {len(chosen) - len(shown)} more (--limit 0 shows all)")
    return 0


def cmd_publish(args: argparse.Namespace) -> int:
    from pipeline.publish import publish

    cfg = None
    if args.run.is_file() and args.run.suffix in (".yaml", ".yml"):
        from pipeline.config import load_config

        cfg = load_config(args.run, args.overrides)
        run_dir = cfg.run_dir
    else:
        run_dir = args.run
    res = publish(
        cfg,
        run_dir,
        policy=args.policy,
        out_dir=args.out,
        push_to_hub=args.push_to_hub,
        license=args.license,
    )
    parts = ", ".join(f"{k} {v}" for k, v in res["configs"].items())
    print(f"published {res['rows']} pairs (policy {res['policy']}) to {res['out']}: {parts}")
    if res["excluded"]:
        print("excluded: " + ", ".join(f"{k} {v}" for k, v in res["excluded"].items()))
    if res["pushed"]:
        print(f"uploaded to {res['pushed']}")
    return 0


def cmd_audit(args: argparse.Namespace) -> int:
    from pipeline.audit import audit

    res = audit(args.path, args.out)
    probe = res["shortcut_probe"]
    length = res["length"]
    print(f"audited {res['n_pairs']} pairs from {res['source']['path']}")
    print(f"  chosen longer in {length['share_chosen_longer']:.1%} of pairs")
    if "auc" in probe:
        mark = "FLAGGED" if probe["flagged"] else "ok"
        print(f"  shortcut probe AUC {probe['auc']:.3f} ({mark}, threshold {probe['threshold']})")
    else:
        print(f"  shortcut probe skipped: {probe['skipped']}")
    print(f"report: {res['outputs']['html']}  figures: {res['outputs']['json']}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.version:
        from pipeline import __version__

        print(__version__)
        return 0
    handlers = {
        "run": cmd_run,
        "config": cmd_config,
        "status": cmd_status,
        "inspect": cmd_inspect,
        "quickstart": cmd_quickstart,
        "annotate": cmd_annotate,
        "publish": cmd_publish,
        "audit": cmd_audit,
    }
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
