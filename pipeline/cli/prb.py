"""The `prb` command. Heavy modules are imported inside each command so --help is instant."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline import __version__
from pipeline.core.cliargs import add_set_option as _add_set
from pipeline.core.cliargs import command_line
from pipeline.core.errors import NO_PAIR_KEPT_EXIT_STATUS, BudgetReached, PipelineError
from pipeline.kinds.stages import ORDER

if TYPE_CHECKING:
    from pipeline.config import Config
    from pipeline.run import RunDir

# the stage names in run order, for help texts (pipeline.stages.ORDER, kept in step by a test)
_STAGES = "ingest, rubrics, responses, judge, pairs"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="prb",
        description="Build benchmarks for personalized reward models (personalized-rewardbench).",
    )
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("run", help="run the pipeline stages in order, resuming finished work")
    p.add_argument("config", type=Path, help="the run's YAML config")
    p.add_argument("--until", metavar="STAGE", help=f"stop after this stage ({_STAGES})")
    p.add_argument(
        "--only", metavar="STAGE", help="run only this stage (the stages before it must be done)"
    )
    p.add_argument(
        "--redo",
        metavar="STAGE",
        help="re-do this stage and the later ones even if done (repairs a damaged stage; "
        "cached answers are reused)",
    )
    p.add_argument("--no-progress", action="store_true", help="hide progress bars")
    p.add_argument(
        "--json",
        action="store_true",
        help="print a JSON summary on stdout at the end, also after an error (stages run, "
        "per-stage counts, pairs kept, requests sent/cached/failed, seconds)",
    )
    _add_set(p)

    p = sub.add_parser(
        "plan",
        help="before a run: its requests, tokens, time and cost per stage (sends and writes "
        "nothing)",
        description="What `prb run CONFIG` would send, per stage: requests (from the stages' "
        "own request builders; a resumed run counts only what is missing from its cache), "
        "prompt tokens (the model's tokenizer when it is on this machine, else an estimate "
        "whose method is printed), output tokens (the max_tokens bound, and the measured mean "
        "when the cache has answers), then time and cost (run.prices). After a run, the "
        "estimate against what was received. Writes nothing and sends no request (it may ask "
        "a server's /models for the backend's identity). See docs/plan.md.",
    )
    p.add_argument("config", type=Path, help="the run's YAML config")
    p.add_argument("--until", metavar="STAGE", help=f"plan up to this stage ({_STAGES})")
    p.add_argument("--only", metavar="STAGE", help="plan only this stage")
    p.add_argument(
        "--tokens-per-second",
        type=_throughput,
        metavar="X",
        help="output tokens per second the backend produces, for the time estimate "
        "(default: measured on this run, or by benchmarks/ for vllm)",
    )
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    _add_set(p)

    p = sub.add_parser(
        "quickstart",
        help="run everything on the hand-written sample, offline (replayed answers)",
        description="Run the whole pipeline on 4 hand-written sample examples, offline, in a "
        "few seconds: the five stages (model answers and verdicts are hand-written and "
        "replayed from a cache; no model runs), a round-1 annotation task file, the release "
        "and the audit report, all under OUT/quickstart. Ends with the next steps.",
    )
    p.add_argument(
        "--out", type=Path, default=Path("outputs"), help="output folder (default outputs)"
    )
    p.add_argument(
        "--local",
        action="store_true",
        help="answer the four examples with the local model instead (llama.cpp on CPU, the "
        "packaged SmolLM2-135M; extra `local`; a few minutes), under OUT/quickstart-local",
    )

    p = sub.add_parser("config", help="inspect configs")
    csub = p.add_subparsers(dest="config_command", metavar="ACTION")
    show = csub.add_parser("show", help="print the resolved config")
    show.add_argument("config", type=Path)
    show.add_argument("--describe", action="store_true", help="also list every field's meaning")
    _add_set(show)
    fields = csub.add_parser("fields", help="list every config field with its default and meaning")
    fields.add_argument("--markdown", action="store_true", help="as a Markdown table")

    p = sub.add_parser(
        "inspect",
        help="list the examples a stage dropped, with the reason",
        description="List the examples a stage dropped (default: the pair stage's filters), "
        "each with its source row's id, the start of its question and the reason. Filters "
        "and their thresholds: docs/filters.md.",
    )
    p.add_argument(
        "run",
        type=Path,
        nargs="?",
        help="a run directory (outputs/<run>) or the run's config; none: list the runs",
    )
    p.add_argument("--reason", metavar="NAME", help="only drops with this reason (a filter name)")
    p.add_argument(
        "--stage", default="pairs", help=f"stage whose rejects to list: {_STAGES} (default pairs)"
    )
    p.add_argument("--limit", type=int, default=20, help="show at most this many (0: all)")
    p.add_argument(
        "--json",
        action="store_true",
        help="print the rejected rows as JSON lines (with the source row's source_id and question)",
    )
    _add_set(p)

    p = sub.add_parser("status", help="show each stage of a run: done, partial or not started")
    p.add_argument(
        "run",
        type=Path,
        nargs="?",
        help="a run directory (outputs/<run>) or the run's config; none: list the runs",
    )
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
        "--force",
        action="store_true",
        help="replace the earlier release in --out (only a folder `prb publish` wrote is ever "
        "replaced; the run's own <run>/publish is replaced without it)",
    )
    p.add_argument(
        "--push-to-hub",
        metavar="REPO",
        help="also upload to this Hub dataset repo (token from HF_TOKEN; new repos are private)",
    )
    _add_set(p)

    p = sub.add_parser(
        "audit",
        help="flag bad pairs (one line per pair and check) and report length bias, "
        "similarity, leakage and shortcuts (HTML + JSON)",
        description="Audit a pairs source: per-pair checks (flags.jsonl), figures "
        "(audit.json) and a report (audit.html), all from one verdict: clear, flagged, or too "
        "small to clear of shortcuts. Checks and codes: docs/audit.md. Exit code: 0, or 3 when "
        "the verdict has a reason --fail-on names (a check that fired or could not run, the "
        "probe flagging, a set too small to clear); 1 on an error.",
    )
    p.add_argument(
        "path",
        type=Path,
        help="a release folder, a run directory (its release, or its pair stage's kept pairs "
        "when it has none), or a JSONL / JSON / parquet / save_to_disk dataset in the "
        "reference schema",
    )
    p.add_argument("--out", type=Path, help="report folder (default: beside the input)")
    p.add_argument(
        "--compare",
        type=Path,
        metavar="OTHER",
        help="a second source (same kinds as PATH) to show side by side in the report",
    )
    p.add_argument(
        "--fail-on",
        metavar="CHECK[,CHECK]",
        help="exit 3 when one of these checks fires or cannot run on this source (codes in "
        "docs/audit.md; shortcut_probe: the probe does not clear the set, flagged or too "
        "small), or 'any' for every check that fired and the probe",
    )
    p.add_argument(
        "--word-cap",
        type=int,
        metavar="N",
        help="the stated word cap the over_cap check uses (default: the cap a release "
        "records, else the run's responses.word_cap, else 100), plus pairs.length_slack",
    )
    p.add_argument(
        "--config",
        type=Path,
        help="a run config whose pairs section (patterns, thresholds) the checks use "
        "(default: the rules a release records, else the run's run.yaml, else the defaults)",
    )
    p.add_argument(
        "--stale-ok",
        action="store_true",
        help="audit a run's release (or pair stage) even when the run has moved on since it "
        "was built (a stage re-done or being re-done); refused without it",
    )

    p = sub.add_parser("cache", help="look after a run's request cache (cache.sqlite)")
    csub = p.add_subparsers(dest="cache_command", metavar="ACTION")
    rep = csub.add_parser(
        "repair",
        help="salvage a damaged cache.sqlite: copy every readable answer into a fresh file "
        "and keep the damaged one beside it",
    )
    rep.add_argument("run", type=Path, help="a run directory (outputs/<run>) or the run's config")
    _add_set(rep)

    # pipeline.annotate.cli imports only argparse, pathlib and the errors modules at this point
    from pipeline.annotate.cli import add_annotate_parser

    add_annotate_parser(sub)
    # pipeline.eval.cli imports only argparse and pathlib; the scorers load when used
    from pipeline.eval.cli import add_eval_parser

    add_eval_parser(sub)
    # pipeline.batch.cli imports only argparse and pathlib; the work loads when used
    from pipeline.batch.cli import add_batch_parser

    add_batch_parser(sub)
    return parser


def _positive(text: str) -> float:
    """A finite number above 0 (argparse type)."""
    import math

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be a finite number above 0")
    return value


# `prb plan --tokens-per-second`: a hundredth of a token a second (a CPU on a large model)
# to ten million (a large cluster); outside that, a typo. 1e308 printed a 309-digit
# figure and 5e-324 an "inf h".
THROUGHPUT_RANGE = (0.01, 1e7)


def _throughput(text: str) -> float:
    """Output tokens per second within THROUGHPUT_RANGE (argparse type)."""
    value = _positive(text)
    low, high = THROUGHPUT_RANGE
    if not low <= value <= high:
        raise argparse.ArgumentTypeError(
            f"{text!r} is outside {low:g} .. {high:,.0f} output tokens per second; pass the "
            "backend's measured throughput (benchmarks/ measures it for vllm)"
        )
    return value


def cmd_plan(args: argparse.Namespace) -> int:
    import json
    from dataclasses import asdict

    from pipeline.config import load_config
    from pipeline.plan import estimate, render

    cfg = load_config(args.config, args.overrides)
    kw = {"until": args.until, "only": args.only, "tokens_per_second": args.tokens_per_second}
    plan = estimate(cfg, **kw)
    # finished stages are compared with what a plan said before they ran
    finished = any(e.action == "skip" and e.actual for e in plan.stages)
    # a fresh plan has no earlier stage done: `--only STAGE` is planned from the start up
    # to that stage, and only the stages this plan shows are compared
    fresh_kw = {**kw, "until": args.only or args.until, "only": None}
    fresh = estimate(cfg, **fresh_kw, fresh=True) if finished else None
    shown = {e.stage for e in plan.stages}
    if args.json:
        data = plan.as_dict()
        if fresh is not None:
            data["before_the_run"] = {
                e.stage: asdict(e.total) for e in fresh.stages if e.stage in shown
            }
        print(json.dumps(data, indent=2))
    else:
        command = command_line(
            ["prb", "plan", args.config], args.overrides, until=args.until, only=args.only
        )
        print(render(plan, fresh, command))
    return 0


def _after_budget(args: argparse.Namespace, cfg: Config, exc: BudgetReached) -> dict[str, str]:
    """What goes on after a budget stop: ``resume``, the same command (without --redo,
    which would clear the stage again) with the reached limit raised to what `prb plan`
    says the rest needs (``budget_to_finish``: what this backend was paid so far plus the
    budget's own bound of every request to send); ``plan``, the plan of the same run;
    ``why``, where the raised figure comes from."""
    import math

    from pipeline.plan import estimate

    field = str(exc.spent.get("limit") or "run.budget.tokens")
    key = field.rsplit(".", 1)[-1]
    value = exc.spent.get("value") or 0
    options = {"until": args.until, "only": args.only}
    try:
        need = estimate(cfg, **options).totals["budget_to_finish"][key]
        why = "what `prb plan` counts for the rest, with what was spent"
    except Exception as failed:  # the stop is reported whatever the plan runs into
        need = None
        why = f"twice the limit: the plan could not be made ({type(failed).__name__}: {failed})"
    if need is None:  # (a usd limit always has prices: checked at load)
        need = value * 2
    if key == "usd":
        raised = f"{max(math.ceil(float(need) * 100) / 100, float(value) + 0.01):.2f}"
    else:
        raised = str(max(int(need), int(value) + 1))
    kept = [o for o in args.overrides if not o.startswith(field + "=")]
    return {
        "resume": command_line(
            ["prb", "run", args.config], [*kept, f"{field}={raised}"], **options
        ),
        "plan": command_line(["prb", "plan", args.config], args.overrides, **options),
        "limit": field,
        "raised": raised,
        "why": why,
    }


def cmd_run(args: argparse.Namespace) -> int:
    import time

    from pipeline.config import load_config
    from pipeline.run import RunDir

    cfg = load_config(args.config, args.overrides)
    t0 = time.time()
    try:
        # a second writer is refused before the stage machinery is even imported
        rd = RunDir(cfg.run_dir)
        rd.check_writable(cfg)  # a folder of the user's is refused before anything is written
        lock = rd.lock()
        if lock.path.parent.is_dir():
            lock.acquire(create=False)
        from pipeline.orchestration.orchestrate import run_pipeline

        run_pipeline(
            cfg,
            until=args.until,
            only=args.only,
            redo=args.redo,
            progress=not args.no_progress,
            lock=lock,
            command=command_line(["prb", "run", args.config], args.overrides),
        )
    except BudgetReached as exc:
        # a clean stop, not a failure: what it reached, what was spent, how to go on
        after = _after_budget(args, cfg, exc)
        if args.json:
            from pipeline.cli.errorline import format_error
            from pipeline.orchestration.runsummary import print_run_summary

            print_run_summary(
                cfg.run_dir,
                since=t0,
                error=format_error(exc, args.config, args.overrides),
                next_commands={k: after[k] for k in ("resume", "plan")},
            )
        from pipeline.core.redact import redact

        print(
            redact(
                f"stopped: {exc}. To go on, raise {after['limit']} to {after['raised']} "
                f"({after['why']}) or remove it, and run the same command: "
                f"`{after['resume']}`; `{after['plan']}` shows what the rest needs"
            ),
            file=sys.stderr,
        )
        return BudgetReached.EXIT_STATUS
    except Exception as exc:
        if args.json:
            from pipeline.cli.errorline import format_error
            from pipeline.orchestration.runsummary import print_run_summary

            error = format_error(exc, args.config, args.overrides)
            if error is not None:  # None is a bug: main() shows its traceback, no summary
                print_run_summary(cfg.run_dir, since=t0, error=error)
        raise
    nothing = _no_pair_kept(cfg.run_dir, args)
    if args.json:
        from pipeline.orchestration.runsummary import print_run_summary

        print_run_summary(cfg.run_dir, since=t0, error=nothing)
    else:
        print(f"run directory: {os.path.abspath(cfg.run_dir)}")
    if nothing is not None:
        print(nothing, file=sys.stderr)
        return NO_PAIR_KEPT_EXIT_STATUS
    return 0


def _no_pair_kept(run_dir: str | Path, args: argparse.Namespace) -> str | None:
    """One line when this command finished the pair stage and it kept no pair (every
    example dropped by a filter): the drops by reason and where to look; else None."""
    from pipeline.run import RunDir

    last = args.only or args.until
    if last is not None and ORDER.index(last) < ORDER.index("pairs"):
        return None  # the pair stage was not asked for
    if args.only is not None and args.only != "pairs":
        return None
    sd = RunDir(run_dir).stage("pairs")
    if not sd.done:
        return None
    stats = sd.stats()
    if stats.get("kept") != 0:
        return None
    drops = sorted(((n, r) for r, n in (stats.get("dropped_by_reason") or {}).items() if n),
                   key=lambda x: (-x[0], x[1]))  # fmt: skip
    why = ", ".join(f"{r} {n}" for n, r in drops) or "no example reached the pair stage"
    inspect = command_line(["prb", "inspect", args.config], args.overrides)
    return (
        f"no pair kept: the pair stage dropped all {stats.get('examples', 0)} examples "
        f"({why}); `{inspect}` lists each drop with its reason, docs/filters.md says what "
        "each filter asks (a stronger model, or looser pairs.* settings, keeps more)"
    )


def cmd_cache(args: argparse.Namespace) -> int:
    from pipeline.run import open_run
    from pipeline.run.cache import repair_cache

    if args.cache_command != "repair":
        print("usage: prb cache repair RUN", file=sys.stderr)
        return 2
    rd, _ = open_run(args.run, args.overrides)  # an existing run, or one line; creates nothing
    with rd.lock("prb cache repair").acquire(create=False):
        res = repair_cache(rd.cache_path)
    saved = res["saved"]
    print(
        f"repaired {res['path']}: kept {saved['responses']} answers and {saved['errors']} "
        f"error records; {res['unreadable_ranges']} unreadable row ranges were dropped. "
        f"The damaged file is kept as {res['damaged_copy']}. Finished stages keep their data; "
        "a stage that still needs a lost answer sends that request again."
    )
    return 0


def cmd_annotate(args: argparse.Namespace) -> int:
    from pipeline.annotate.cli import cmd_annotate as run

    return run(args)


def cmd_quickstart(args: argparse.Namespace) -> int:
    from pipeline.quickstart import next_steps, run_quickstart

    res = run_quickstart(args.out, local=args.local)
    print(f"run directory: {res['run_dir']}")
    if res.get("kept"):
        print(f"annotation tasks: {res['annotation']['tasks_file']}")
        print(f"release: {res['publish']['out']}")
        print(f"audit report: {res['audit']['outputs']['html']}")
    print()
    print(next_steps(res))
    return 0


def cmd_config(args: argparse.Namespace) -> int:
    import json

    from pipeline.config import describe_fields, load_config

    if args.config_command == "fields":
        if args.markdown:
            print("| field | default | meaning |\n|---|---|---|")
            for name, default, desc in describe_fields():
                if len(default) > 80 and default.startswith("["):
                    # a long list (regex patterns): its size here, the values in the config
                    n = len(json.loads(default))
                    shown = f"{n} entries (`prb config show CONFIG` prints them)"
                else:
                    shown = f"`{default}`"
                shown = shown.replace("|", "\\|")  # a | would end the table cell
                print(f"| `{name}` | {shown} | {desc.replace('|', chr(92) + '|')} |")
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


def list_runs(outputs: Path = Path("outputs"), *, overview: bool = False) -> int:
    """When a command that takes a run gets none: the runs under outputs/, newest first.
    Exit status 2 (the run is missing), or 0 for ``overview`` (`prb status`, where "no
    runs yet" or the list of runs is the answer asked for; docs/errors.md)."""
    from pipeline.run import RunDir

    runs = sorted(
        (p for p in outputs.glob("*") if p.is_dir() and RunDir(p).is_run()),
        key=lambda p: p.stat().st_mtime,
        reverse=True,
    )
    if not runs:
        print(
            f"no runs under {outputs}/ yet: start one with `prb quickstart`, or "
            "`prb run CONFIG` (see configs/sample.yaml)",
            file=sys.stdout if overview else sys.stderr,
        )
        return 0 if overview else 2
    print(f"runs under {outputs}/ (newest first); pass one of them:")
    for p in runs:
        print(f"  {p}")
    return 0 if overview else 2


def _not_started(target: Path, overrides: list[str]) -> str | None:
    """For a config whose run directory does not exist yet: the line that says so, with
    the command that starts it (the same --set options); None otherwise."""
    if not (target.is_file() and target.suffix in (".yaml", ".yml")):
        return None
    import contextlib
    import io

    from pipeline.config import load_config
    from pipeline.run import RunDir

    # its warnings (a deprecated key) are shown once: here when the run has not begun,
    # else by the command's own load of the same config
    said = io.StringIO()
    with contextlib.redirect_stderr(said):
        rd = RunDir(load_config(target, overrides).run_dir)
    if rd.path.exists():
        return None
    sys.stderr.write(said.getvalue())
    start = command_line(["prb", "run", target], overrides)
    return f"no run yet at {rd.shown}: start it with `{start}`"


def cmd_status(args: argparse.Namespace) -> int:
    from pipeline.run import open_run
    from pipeline.run.cache import RequestCache

    if args.run is None:
        return list_runs(overview=True)
    not_started = _not_started(args.run, args.overrides)
    if not_started is not None:  # nothing is wrong: the run has not begun
        print(not_started)
        return 0
    rd, cfg = open_run(args.run, args.overrides)
    per_stage: dict[str, dict[str, int]] = {}
    total = errors = 0
    ledger: dict = {}
    if rd.cache_path.exists():
        from pipeline.engine.budget import run_ledger, run_prices

        ledger = run_ledger(rd, run_prices(cfg) if cfg is not None else None)
        with RequestCache(rd.cache_path, readonly=True) as cache:
            per_stage = cache.counts_by_stage()
            total = sum(v["answers"] for v in per_stage.values())
            errors = sum(v["errors"] for v in per_stage.values())
    print(f"run: {rd.shown}")
    earlier, current = _earlier_backends(rd)
    damaged = False
    for name in ORDER:
        sd = rd.stage(name)
        try:
            state, done, expected = sd.status()
            if state == "partial":
                of = expected if expected is not None else "?"
                state = f"partial ({done} of {of} examples)"
                stopped = sd.stats().get("stopped_by_budget")
                if isinstance(stopped, dict):
                    state += f", stopped at {stopped.get('limit')} = {stopped.get('value')}"
            elif state == "done":
                state = f"done ({done} examples)"
                sd.check_intact()  # the same check, and the same line, as `prb run`
        except PipelineError as exc:
            state, damaged = f"DAMAGED: {exc}", True
        c = per_stage.get(name)
        if c and state != "not started":
            extra = f"{c['answers']} answers cached"
            if c["failed_keys"]:
                extra += (
                    f", {c['failed_keys']} requests failed ({c['errors']} failures recorded; "
                    "retried on the next run)"
                )
            state += f"; {extra}"
        if name in earlier:
            state += f" [earlier backend: {earlier[name][1]}]"
        print(f"  {name:12s} {state}")
        if name in ledger.get("stages", {}):
            print(f"  {'':12s} {_ledger_line(ledger['stages'][name])}")
    if ledger:
        t = ledger["total"]
        money = f", ${t['usd']:,.2f} at run.prices" if t["usd"] is not None else ""
        if earlier:  # each backend's spending apart: one total would add two backends
            for label, names in _spend_groups(ledger, earlier, current):
                print(f"  spent {label}: {_spend_line(ledger, names)}")
        else:
            print(
                f"  spent: {t['answers']:,} answers ({t['reasks']:,} re-asks), "
                f"{t['prompt_tokens']:,} prompt + {t['completion_tokens']:,} output tokens{money}"
            )
    if rd.cache_path.exists():
        size = rd.cache_path.stat().st_size / 1e6
        print(
            f"  cache: {total} answers, {errors} failures recorded ({rd.cache_path}, {size:.1f} MB)"
        )
    if rd.openai_batches.is_dir():  # the Batch API's batches in flight (imports openai)
        from pipeline.backends.openai.batch import status_lines

        for line in status_lines(rd.openai_batches):
            print(f"  {line}")
    return 1 if damaged else 0


def _earlier_backends(rd: RunDir) -> tuple[dict[str, tuple[str, str]], str]:
    """Stages whose answers came from another backend than the run's latest (the backend
    of the LLM stage started last), as stage -> (backend id, description), and the latest
    backend's description; a stage without a backend of its own (pairs) goes with the
    stage before it. Empty when every stage had one backend."""
    from pipeline.backends.identity import describe, identity_id

    served: dict[str, tuple[float, str, str]] = {}
    for name in ORDER:
        try:
            meta = rd.stage(name).meta
        except PipelineError:
            continue
        ident = (meta.environment or {}).get("served_by") if meta is not None else None
        if isinstance(ident, dict) and meta is not None:
            served[name] = (meta.started or 0.0, identity_id(ident), describe(ident))
    if len({sid for _, sid, _ in served.values()}) < 2:
        return {}, ""
    _, current, current_text = max(served.values())
    out: dict[str, tuple[str, str]] = {}
    last: tuple[str, str] | None = None
    for name in ORDER:
        if name in served:
            _, sid, text = served[name]
            last = (sid, text)
        elif last is None or not rd.stage(name).path.exists():
            continue
        if last is not None and last[0] != current:
            out[name] = last
    return out, current_text


def _spend_groups(
    ledger: dict, earlier: dict[str, tuple[str, str]], current: str
) -> list[tuple[str, list[str]]]:
    """(label, ledger stages) for the current backend, then each earlier one."""
    stages = list(ledger.get("stages", {}))
    groups = [(f"by the current backend, {current}", [n for n in stages if n not in earlier])]
    for sid, text in dict.fromkeys(earlier.values()):
        groups.append(
            (f"earlier by {text}", [n for n in stages if earlier.get(n, ("",))[0] == sid])
        )
    return [(label, names) for label, names in groups if names]


def _spend_line(ledger: dict, names: list[str]) -> str:
    entries = [ledger["stages"][n] for n in names]
    total = {k: sum(e[k] for e in entries) for k in ("answers", "reasks", "prompt_tokens",
                                                     "completion_tokens")}  # fmt: skip
    usd = [e["usd"] for e in entries if e.get("usd") is not None]
    money = f", ${sum(usd):,.2f} at run.prices" if usd else ""
    return (
        f"{total['answers']:,} answers ({total['reasks']:,} re-asks), "
        f"{total['prompt_tokens']:,} prompt + {total['completion_tokens']:,} output tokens"
        f"{money} ({', '.join(names)})"
    )


def _ledger_line(entry: dict) -> str:
    """One stage's ledger for `prb status`: what its backend answered over the run's life
    (cache.sqlite), and what the latest invocation did (stats.json)."""
    money = f", ${entry['usd']:,.2f}" if entry.get("usd") is not None else ""
    line = (
        f"ledger: {entry['answers']:,} answers ({entry['reasks']:,} re-asks), "
        f"{entry['prompt_tokens']:,} prompt + {entry['completion_tokens']:,} output tokens"
        f"{money}"
    )
    inv = entry.get("latest_invocation")
    if inv:
        secs = inv.get("seconds")
        took = f", {secs:.1f} s" if isinstance(secs, (int, float)) else ""
        line += (
            f"; latest invocation: sent {inv.get('sent')}, cached {inv.get('cached')}, "
            f"failed {inv.get('failed')}, re-asks {inv.get('reasks')}{took}"
        )
    return line


def _example_sources(rd: RunDir, example_ids: set[str]) -> dict[str, tuple[str, str]]:
    """example_id -> (source row id, question), read from the run's finished ingest stage."""
    found: dict[str, tuple[str, str]] = {}
    if not example_ids:
        return found
    for row in rd.finished("ingest").rows():
        if row.get("example_id") in example_ids:
            found[row["example_id"]] = (str(row.get("source_id", "?")), row.get("question", ""))
            if len(found) == len(example_ids):
                break
    return found


def _clip(text: str, width: int = 70) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= width else text[: width - 1].rstrip() + "…"


def cmd_inspect(args: argparse.Namespace) -> int:
    import json
    from collections import Counter

    from pipeline.orchestration.orchestrate import _unknown_stage
    from pipeline.run import open_run

    if args.run is None:
        return list_runs()
    if args.stage not in ORDER:
        raise _unknown_stage(args.stage, "the STAGE argument")
    rd, _ = open_run(args.run, args.overrides)
    sd = rd.stage(args.stage)
    if not sd.path.exists():
        print(
            f"{rd.shown}: stage '{args.stage}' has not run yet; "
            f"`{command_line(['prb', 'status', args.run], args.overrides)}` shows where the "
            "run stands",
            file=sys.stderr,
        )
        return 1
    if sd.done:
        sd.check_intact()  # a damaged stage is named with its repair, never half-listed
    rejects = list(sd.rejects())
    counts = Counter(r.get("reason") for r in rejects)
    if args.reason and args.reason not in counts:
        known = ", ".join(f"{k} ({v})" for k, v in counts.most_common()) or "none"
        print(f"no drops with reason '{args.reason}'; reasons here: {known}", file=sys.stderr)
        return 1
    chosen = [r for r in rejects if not args.reason or r.get("reason") == args.reason]
    shown = chosen if args.limit == 0 else chosen[: args.limit]
    sources = _example_sources(rd, {r["example_id"] for r in shown if "example_id" in r})
    if args.json:
        for r in shown:
            src = sources.get(r.get("example_id", ""))
            extra = {"source_id": src[0], "question": src[1]} if src else {}
            print(json.dumps({**extra, **r}, ensure_ascii=False))
        return 0
    n = sd.stats().get("examples") if sd.done else None
    of = f" of {n} examples" if isinstance(n, int) else ""
    if args.stage == "pairs":  # the examples that never reached it are another stage's
        from pipeline.orchestration.orchestrate import dropped_before

        for stage, reasons in dropped_before(rd).items():
            said = ", ".join(f"{k} {v}" for k, v in reasons.items())
            more = command_line(["prb", "inspect", args.run], args.overrides, stage=stage)
            of += f" ({sum(reasons.values())} more dropped by the {stage} stage: {said}; `{more}`)"
    if not rejects:
        print(f"{args.stage}: nothing dropped{of}")
        return 0
    print(
        f"{args.stage}: {len(rejects)}{of} dropped; by reason: "
        + ", ".join(f"{k} {v}" for k, v in counts.most_common())
    )
    for r in shown:
        src_id, question = sources.get(r.get("example_id", ""), ("?", ""))
        print(f"- {src_id} (example {r.get('example_id')}) [{r.get('reason')}] "
              f"{r.get('detail', '')}")  # fmt: skip
        if question:
            print(f"    question: {_clip(question)}")
        for p in r.get("pairs", [])[:8]:
            verdict = f"[{p['reason']}] {p.get('detail') or ''}" if p["reason"] else "kept"
            print(f"    {p['strategy']:12s} {p['chosen_id']} vs {p['rejected_id']}: {verdict}")
    if len(chosen) > len(shown):
        print(f"... {len(chosen) - len(shown)} more (--limit 0 shows all)")
    more = "--reason NAME lists one reason, --json prints the full rows"
    if args.stage == "pairs":
        more += "; what each filter checks and why: docs/filters.md"
    print(f"({more})")
    return 0


def cmd_publish(args: argparse.Namespace) -> int:
    from pipeline.publish import publish
    from pipeline.run import open_run

    rd, cfg = open_run(args.run, args.overrides)
    res = publish(
        cfg,
        rd.path,
        policy=args.policy,
        out_dir=args.out,
        push_to_hub=args.push_to_hub,
        license=args.license,
        force=args.force,
    )
    parts = ", ".join(f"{k} {v}" for k, v in res["configs"].items())
    print(f"published {res['rows']} pairs (policy {res['policy']}) to {res['out']}: {parts}")
    if res.get("note"):
        print(res["note"])
    if res["excluded"]:
        print("excluded: " + ", ".join(f"{k} {v}" for k, v in res["excluded"].items()))
    if res["pushed"]:
        print(f"uploaded to {res['pushed']}")
    return 0


def cmd_audit(args: argparse.Namespace) -> int:
    from pipeline.audit import audit
    from pipeline.audit.run import GATE_EXIT, gate, parse_fail_on

    fail_on = parse_fail_on(args.fail_on)  # a typo fails before the work, not after
    res = audit(
        args.path,
        args.out,
        compare=args.compare,
        config=args.config,
        word_cap=args.word_cap,
        stale_ok=args.stale_ok,
    )
    probe, length = res["shortcut_probe"], res["length"]
    verdict = res["verdict"]  # the decision the report's headline and --fail-on read
    print(f"audited {res['n_pairs']} pairs from {res['source']['path']}")
    if res["source"].get("note"):
        print(f"  note: {res['source']['note']}")
    print(verdict["headline"])
    for reason in verdict["reasons"]:
        print(f"  - {reason['text']}")
    print(f"  chosen longer in {length['share_chosen_longer']:.1%} of pairs")
    mark = {"flagged": "FLAGGED", "clear": "clear", "too_small": "too small to clear"}
    if "auc" in probe:
        top = probe["highest"]
        print(
            f"  shortcut probe ({mark[probe['status']]}): AUC {probe['auc']:.3f}, pooled "
            f"{probe['pooled_auc']:.3f}; highest figure {top['label']} {top['value']:.3f} "
            f"(threshold {probe['threshold']}; chance reaches {probe['chance_highest_p95']:.3f})"
        )
    else:
        print(f"  shortcut probe ({mark[probe['status']]}): not run, {probe['skipped']}")
    if "compare" in res:
        other = res["compare"]
        print(
            f"  compared with {other['source']['path']}: {other['n_pairs']} pairs, "
            f"{other['checks']['pairs_flagged']} flagged"
        )
    print(
        f"report: {res['outputs']['html']}  figures: {res['outputs']['json']}  "
        f"flags: {res['outputs']['flags']}"
    )
    failed = gate(res, fail_on)
    if failed:
        print(f"audit gate failed (--fail-on {args.fail_on}): {'; '.join(failed)}", file=sys.stderr)
        return GATE_EXIT
    return 0


# Commands that only show something: a reader that stops early (`| head`) is no error.
SHOW_ONLY = frozenset({"config", "status", "inspect", "plan"})


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    parser.add_argument("--debug", action="store_true", help="on an error, print the traceback")
    argv = list(sys.argv[1:] if argv is None else argv)
    # --debug is taken anywhere before a bare "--", not only before the command
    cut = argv.index("--") if "--" in argv else len(argv)
    debug = "--debug" in argv[:cut]
    args = parser.parse_args([a for i, a in enumerate(argv) if i >= cut or a != "--debug"])
    if args.version:
        print(__version__)
        return 0
    handlers = {
        "run": cmd_run,
        "plan": cmd_plan,
        "config": cmd_config,
        "status": cmd_status,
        "inspect": cmd_inspect,
        "quickstart": cmd_quickstart,
        "annotate": cmd_annotate,
        "publish": cmd_publish,
        "audit": cmd_audit,
        "cache": cmd_cache,
        "eval": lambda a: a.eval_handler(a),  # set by add_eval_parser
        "batch": lambda a: a.batch_handler(a),  # set by add_batch_parser
    }
    if args.command not in handlers:
        parser.print_help()
        return 2
    try:
        return handlers[args.command](args)
    except KeyboardInterrupt:
        print("interrupted; finished work is kept, run the same command to resume", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # the reader of our output stopped. For a command that only shows something
        # (`prb config fields | head`) that is not an error; a command that works (a run
        # whose progress went to `| head -1`) stopped half-way, so its status says so:
        # 141, as a shell reports a process ended by SIGPIPE. Either way stdout goes to
        # devnull so the interpreter's final flush does not complain.
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        if args.command in SHOW_ONLY:
            return 0
        with contextlib.suppress(OSError):
            print(
                "stopped: the reader of this command's output went away; finished work is "
                "kept, run the same command to resume",
                file=sys.stderr,
            )
        return 141
    except Exception as exc:
        # one path for every expected failure: one line (redacted), the traceback on --debug;
        # anything format_error does not know is a bug and keeps its traceback
        from pipeline.cli.errorline import format_error

        target = getattr(args, "run", None) or getattr(args, "config", None)
        line = format_error(exc, target, getattr(args, "overrides", None) or ())
        if line is None:
            raise
        if debug:
            import traceback

            from pipeline.core.redact import redact

            # redacted like the line below: a URL with a key in it, a server's echo of it
            print(redact(traceback.format_exc()), end="", file=sys.stderr)
        print(f"error: {line}", file=sys.stderr)
        return 1
