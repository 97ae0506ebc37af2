"""``prb eval``: its arguments and the short table it prints. Imports only argparse and
pathlib at module level, so ``prb --help`` stays instant."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from pipeline.core.cliargs import add_set_option
from pipeline.core.errors import InputError
from pipeline.core.fields import show, show_ci

SETTING_NAMES = ("question", "profile", "rubric")
# prb eval bon's settings besides question and profile (pipeline.eval.bon.SETTINGS)
BON_ONLY_SETTINGS = ("profile-reference",)

EPILOG = """\
scorers:
  rm:MODEL_FOLDER[,key=value...]   a reward model (AutoModelForSequenceClassification)
  judge:MODEL_NAME[,key=value...]  an LLM judge through the configured backend
                                   (judge: alone uses backend.model / judge.model)
settings:
  question  the question only (the reference protocol)
  profile   the question with the user's top-k profile posts before it
  rubric    CONTROL: the rubric aspects are shown; a validity check of the split,
            never a score (the reference's rubric-aware check)

examples:
  prb eval outputs/run/publish --scorer rm:/models/Skywork-Reward-V2-Llama-3.1-8B
  prb eval pairs.jsonl --scorer judge:Qwen/Qwen2.5-7B-Instruct,format=text \\
      --setting question --setting profile --setting rubric

Options of each scorer kind: prb eval --scorer-help

prb eval bon SPLIT --scorer SPEC [--scorer SPEC...] [--policy MODEL] [--n 16] [--k 1,2,4,8,16]
                   [--judge MODEL] [--accuracy-from EVAL_DIR] [--plan] [--out DIR]
  Best-of-N downstream evaluation: N answers per question from a policy model, every
  answer scored by every scorer (rm: or gen:), the best of the first k kept for each k, each
  distinct kept answer scored once by a rubric-aware judge (0-2 per aspect); the mean per
  scorer, setting, subset and k with bootstrap intervals, the scaling curves (report.html)
  and the table prb eval correlate reads, joined with each scorer's accuracy from prb eval
  (docs/eval.md). Counts and tokens, and the cost at the reference's size, are printed
  before anything is sent; --plan prints them and stops.

prb eval correlate TABLE.csv [--bootstrap N] [--seed S] [--rbo-p P] [--baseline COLUMN]
                   [--out FILE.json]
  Spearman's rho, weighted Kendall tau, NDCG and RBO between the accuracy of reward models
  on a split and their downstream scores, per subset and overall, each with a bootstrap
  interval over models; with --baseline, the difference from another benchmark's column.
  TABLE.csv: columns model, accuracy, optional subset, and one downstream score column or
  more (docs/eval.md). Give the table right after the word correlate.
"""


def add_eval_parser(sub: Any) -> argparse.ArgumentParser:
    """Register ``prb eval`` on the top-level subparsers."""
    p = sub.add_parser(
        "eval",
        help="evaluate reward models and LLM judges on a split, with and without the profile",
        description="Score a pairs split with reward models and LLM judges; write "
        "results.json per scorer and setting and a leaderboard beside them.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "split",
        type=Path,
        nargs="?",
        help="a release folder, a run directory, or a JSONL / parquet / save_to_disk dataset "
        "in the reference schema (or the word correlate, then TABLE.csv)",
    )
    p.add_argument(
        "table",
        type=Path,
        nargs="?",
        help="after correlate only: the CSV of models, accuracy and downstream scores",
    )
    p.add_argument(
        "--scorer",
        action="append",
        default=[],
        metavar="SPEC",
        help="rm:MODEL_FOLDER[,k=v...] or judge:MODEL[,k=v...] (repeatable)",
    )
    p.add_argument(
        "--setting",
        action="append",
        choices=(*SETTING_NAMES, *BON_ONLY_SETTINGS),
        help="what the scorer sees (repeatable; default: question and profile; prb eval bon: "
        "question, profile or profile-reference, default profile)",
    )
    p.add_argument(
        "--out",
        type=Path,
        help="eval root (default: <run>/eval for a run or its release, else <input>-eval); "
        "for correlate, the JSON file (default: <table>-correlate.json beside it)",
    )
    p.add_argument(
        "--config",
        type=Path,
        help="a run config: its backend (judges) and profile selection for rows without a "
        "recorded ranking (default: built-in)",
    )
    add_set_option(p, "backend.name=vllm --set profile.top_k=5")
    p.add_argument(
        "--stale-ok",
        action="store_true",
        help="evaluate a run's release (or pair stage) even when the run has moved on since "
        "it was built; refused without it",
    )
    p.add_argument("--limit", type=int, help="evaluate only the first N pairs")
    p.add_argument(
        "--bootstrap",
        type=_whole(1, MAX_BOOTSTRAP),
        default=1000,
        help=f"bootstrap resamples, 1 to {MAX_BOOTSTRAP:,} (default 1000)",
    )
    p.add_argument(
        "--seed", type=_whole(0), default=0, help="bootstrap seed, 0 or more (default 0)"
    )
    p.add_argument(
        "--rbo-p",
        type=float,
        default=None,
        metavar="P",
        help="correlate: the persistence of rank-biased overlap, between 0 and 1 (default 0.9)",
    )
    p.add_argument(
        "--baseline",
        metavar="COLUMN",
        help="correlate: a column holding another benchmark's accuracy of the same models "
        "(RewardBench's, say); each metric is also given for it, and this benchmark's minus "
        "it with a paired bootstrap interval",
    )
    add_bon_arguments(p)
    p.add_argument("--no-progress", action="store_true", help="hide progress bars")
    p.add_argument("--scorer-help", action="store_true", help="list every scorer option and exit")
    p.set_defaults(eval_handler=cmd_eval)
    return p


def _ks(text: str) -> list[int]:
    try:
        return [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected whole numbers separated by commas, e.g. 1,2,4,8,16, got {text!r}"
        ) from None


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None


def _float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None


# dest -> default of every option of prb eval bon only (refused without it)
BON_DEFAULTS: dict[str, Any] = {
    "policy": None,
    "n": None,
    "k": None,
    "judge": None,
    "judge_format": None,
    "sample_prompt": None,
    "judge_prompt": None,
    "posts": None,
    "temperature": None,
    "top_p": None,
    "max_tokens": None,
    "judge_max_tokens": None,
    "accuracy_from": None,
    "accuracy_setting": None,
    "policy_overrides": [],
    "judge_overrides": [],
    "plan": False,
}


def add_bon_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``prb eval bon SPLIT`` (docs/eval.md, "Best-of-N")."""
    g = p.add_argument_group("prb eval bon SPLIT (best-of-N downstream evaluation)")
    g.add_argument(
        "--policy",
        metavar="MODEL",
        help="the model that draws the answers (default: backend.model)",
    )
    g.add_argument("--n", type=_int, metavar="N", help="answers per question (default 16)")
    g.add_argument(
        "--k",
        type=_ks,
        metavar="K,K...",
        help="the k values, each up to N (default 1, 2, 4, ... and N)",
    )
    g.add_argument(
        "--judge",
        metavar="MODEL",
        help="the rubric-aware judge (default: judge.model, else backend.model)",
    )
    g.add_argument(
        "--judge-format",
        choices=("list", "json"),
        help="list: a [2, 0, 1] list of scores read as the reference reads it "
        "(default); json: the project's JSON coverage verdict",
    )
    g.add_argument(
        "--sample-prompt",
        metavar="FILE",
        help="the policy's prompt file, with {question} and {profile} (default: "
        "prompts/bon_sample.txt; the reference's: REFERENCE/prompts/sample.txt)",
    )
    g.add_argument(
        "--judge-prompt",
        metavar="FILE",
        help="the judge's prompt file, with {question}, {answer} and {aspects} or "
        "{aspect_list} (default: prompts/bon_judge.txt; the reference's: "
        "REFERENCE/prompts/evaluation.txt)",
    )
    g.add_argument(
        "--posts",
        type=_int,
        metavar="K",
        help="profile posts in the sample prompt (default 10, the reference's)",
    )
    g.add_argument("--temperature", type=_float, help="the policy's temperature (default 1.0)")
    g.add_argument("--top-p", type=_float, help="the policy's top_p (default 0.9)")
    g.add_argument("--max-tokens", type=_int, help="the policy's max_tokens (default 512)")
    g.add_argument(
        "--judge-max-tokens",
        type=_int,
        help="the judge's max_tokens (default 32 for list, judge.sampling's for json)",
    )
    g.add_argument(
        "--accuracy-from",
        type=Path,
        metavar="EVAL_DIR",
        help="prb eval's results folder of the same split, for each scorer's "
        "benchmark accuracy (default: the split's eval root when it exists)",
    )
    g.add_argument(
        "--accuracy-setting",
        choices=SETTING_NAMES[:2],
        help="which prb eval setting's accuracy the table carries (default "
        "question, the reference's benchmark protocol)",
    )
    g.add_argument(
        "--policy-set",
        dest="policy_overrides",
        action="append",
        default=[],
        metavar="KEY.PATH=VALUE",
        help="a config override for the policy only, over --config and --set",
    )
    g.add_argument(
        "--judge-set",
        dest="judge_overrides",
        action="append",
        default=[],
        metavar="KEY.PATH=VALUE",
        help="a config override for the judge only, over --config and --set",
    )
    g.add_argument(
        "--plan",
        action="store_true",
        help="print what would be sent (requests, tokens, the cost at the "
        "reference's size) and stop",
    )


# The most bootstrap resamples: a 95% interval is stable long before; past it a typo
# (1000000000000) would run for days or exhaust memory.
MAX_BOOTSTRAP = 100_000


def _whole(lo: int, hi: int | None = None) -> Any:
    """An argparse type: a whole number from ``lo`` (to ``hi``); a bad one is argparse's
    usage line, exit status 2."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if hi is None and value < lo:
            raise argparse.ArgumentTypeError(f"must be {lo:,} or more, got {value:,}")
        if hi is not None and not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"must be from {lo:,} to {hi:,}, got {value:,}")
        return value

    return parse


def _config(args: argparse.Namespace, more: list[str] | None = None) -> Any:
    from pipeline.config import config_from_overrides, load_config

    overrides = [*args.overrides, *(more or [])]
    if args.config is not None:
        return load_config(args.config, overrides)
    return config_from_overrides(overrides)


def _rate(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def print_table(all_results: list[dict[str, Any]], out: Any = None) -> None:
    """The short table: per scorer and setting, the pooled accuracy, its interval, the mean
    of the per-category accuracies (``by cat``, "-" without categories), ties, failed
    pairs and unparsed verdicts (judges; "-" for reward models)."""
    out = out or sys.stdout
    print(
        f"{'scorer':34s} {'setting':9s} {'accuracy':>8s}  {'95% CI':16s} {'by cat':>6s} "
        f"{'ties':>5s} {'failed':>6s} {'unparsed':>8s}",
        file=out,
    )
    for res in all_results:
        name = res["scorer"]["name"][:34]
        for setting, block in res["settings"].items():
            m = block["metrics"]
            mark = "*" if block["role"] == "control" else ""
            unparsed = m.get("unparsed_verdicts")
            line = (
                f"{name:34s} {setting + mark:9s} {show(m['accuracy']):>8s}  "
                f"{show_ci(m['ci95']):16s} {_rate(m.get('accuracy_mean_of_categories')):>6s} "
                f"{m['ties']:>5d} {m['failed']:>6d} {'-' if unparsed is None else unparsed:>8}"
            )
            pos = m.get("position")
            if pos and pos.get("consistency") is not None:
                line += f"  consistency {pos['consistency']:.3f}, A-bias {pos['bias']:+.3f}"
            if pos and pos.get("accuracy_reference_order") is not None:
                # the reference script's one-order figure (seed 42 per subset), pooled
                line += (
                    f", reference order {pos['accuracy_reference_order']:.3f} "
                    f"({pos['reference_order_correct']}/{pos['reference_order_scored']})"
                )
                macro = pos.get("accuracy_reference_order_mean_of_categories")
                if macro is not None:
                    line += f", by cat {macro:.3f}"
            print(line, file=out)
        gain = res.get("profile_gain")
        if gain and gain.get("gain") is not None:
            print(
                f"{'':34s} profile gain {gain['gain']:+.3f} {show_ci(gain['ci95'])} over "
                f"{gain['pairs']} pairs",
                file=out,
            )
        for setting, why in res.get("skipped_settings", {}).items():
            print(f"{'':34s} {setting} skipped: {why}", file=out)
        if res["scorer"].get("truncated_inputs"):
            print(
                f"{'':34s} warning: {res['scorer']['truncated_inputs']} inputs cut at "
                f"{res['scorer']['max_length']} tokens",
                file=out,
            )
        if res["scorer"].get("unparsed_verdicts_read_as") == "A":
            print(f"{'':34s} unparsed verdicts read as 'A' (unparsed=a)", file=out)
    if any(b["role"] == "control" for r in all_results for b in r["settings"].values()):
        print(
            "* control: the scorer saw the rubric; a validity check of the split, not a score",
            file=out,
        )
    if any(
        b["metrics"].get("accuracy_mean_of_categories") is not None
        for r in all_results
        for b in r["settings"].values()
    ):
        print("by cat: the mean of the per-category accuracies (each category counts once)",
              file=out)  # fmt: skip


CORRELATE = "correlate"
BON = "bon"
# what prb eval correlate reads: every other option is refused with it
_CORRELATE_DEFAULTS: dict[str, Any] = {
    "scorer": [],
    "setting": None,
    "config": None,
    "stale_ok": False,
    "limit": None,
}


def _refuse(args: argparse.Namespace, defaults: dict[str, Any], command: str) -> None:
    """Options of another form of prb eval, given to this one: one line naming the flag."""
    for key, default in defaults.items():
        if getattr(args, key, default) != default:
            flag = {"policy_overrides": "--policy-set", "judge_overrides": "--judge-set"}.get(
                key, "--" + key.replace("_", "-")
            )
            raise InputError(f"is not an option of {command}", path=flag)


def cmd_bon(args: argparse.Namespace) -> int:
    """``prb eval bon SPLIT``: best-of-N downstream evaluation (``pipeline.eval.bon``)."""
    _refuse(args, {"rbo_p": None, "baseline": None}, "prb eval bon")
    if args.bootstrap < 1:
        raise InputError("must be at least 1", path="--bootstrap")
    if args.limit is not None and args.limit < 1:
        raise InputError("must be at least 1", path="--limit")
    for s in args.setting or ():
        if s == "rubric":
            raise InputError(
                "the rubric control shows a scorer the answer key; best-of-N scores with "
                "question, profile or profile-reference",
                path="--setting",
            )
    from pipeline.eval import bon

    cfg = _config(args)
    opts = bon.BonOptions(
        split=Path(args.table),
        scorers=list(args.scorer),
        settings=list(dict.fromkeys(args.setting or bon.DEFAULT_SETTINGS)),
        cfg=cfg,
        policy_cfg=_config(args, args.policy_overrides) if args.policy_overrides else cfg,
        judge_cfg=_config(args, args.judge_overrides) if args.judge_overrides else cfg,
        policy=args.policy or "",
        judge=args.judge or "",
        n=bon.DEFAULT_N if args.n is None else args.n,
        ks=args.k,
        judge_format=args.judge_format or "list",
        sample_prompt=args.sample_prompt or "",
        judge_prompt=args.judge_prompt or "",
        posts=bon.DEFAULT_POSTS if args.posts is None else args.posts,
        temperature=bon.DEFAULT_TEMPERATURE if args.temperature is None else args.temperature,
        top_p=bon.DEFAULT_TOP_P if args.top_p is None else args.top_p,
        max_tokens=bon.DEFAULT_MAX_TOKENS if args.max_tokens is None else args.max_tokens,
        judge_max_tokens=args.judge_max_tokens or 0,
        accuracy_from=args.accuracy_from,
        accuracy_setting=args.accuracy_setting or "question",
        out=args.out,
        limit=args.limit,
        n_boot=args.bootstrap,
        seed=args.seed,
        plan_only=args.plan,
        progress=not args.no_progress,
        stale_ok=args.stale_ok,
    )
    if args.judge_max_tokens is not None and args.judge_max_tokens < 1:
        raise InputError(f"must be at least 1, got {args.judge_max_tokens}",
                         path="--judge-max-tokens")  # fmt: skip
    result = bon.run_bon(opts)
    if opts.plan_only:
        return 0
    print(bon.format_summary(result))
    for s, t in result["tables"].items():
        print(f"table ({s}): {t['csv']} ({t['rows']} rows)")
        for note in t["notes"]:
            print(f"  note: {note}")
        if t.get("correlate"):
            print(f"  correlations: {t['correlate']}  (prb eval correlate {t['csv']})")
        else:
            print(f"  {t.get('correlate_note')}")
    print(f"report: {result['outputs']['report']}")
    print(f"figures: {result['outputs']['bon']}")
    return 0


def cmd_correlate(args: argparse.Namespace) -> int:
    """``prb eval correlate TABLE.csv``: print the correlations and write their JSON."""
    from pipeline.core.io import path_kind, write_json_atomic
    from pipeline.eval.correlate import (
        correlate,
        default_out,
        format_table,
        written_by_correlate,
    )
    from pipeline.run.outputs import check_output

    _refuse(args, BON_DEFAULTS, "prb eval correlate")
    for key, default in _CORRELATE_DEFAULTS.items():
        if getattr(args, key, default) != default:
            flag = "--" + key.replace("_", "-")
            raise InputError("is not an option of prb eval correlate", path=flag)
    if getattr(args, "overrides", None):
        raise InputError("is not an option of prb eval correlate", path="--set")
    if args.bootstrap < 1:
        raise InputError("must be at least 1", path="--bootstrap")
    from pipeline.eval.rankmetrics import DEFAULT_RBO_P

    rbo_p = DEFAULT_RBO_P if args.rbo_p is None else args.rbo_p
    if not 0.0 < rbo_p < 1.0:  # NaN fails both
        raise InputError(f"must be between 0 and 1 (exclusive), got {args.rbo_p}", path="--rbo-p")
    # the default goes beside the table; a table read from a pipe (`<(cat t.csv)`, a
    # /dev/fd path) has no folder of its own, so its JSON is written only to --out
    kind = path_kind(args.table)
    out = args.out if args.out is not None or kind != "a file" else default_out(args.table)
    if out is not None:
        check_output(
            out,
            flag="--out",
            command="prb eval correlate",
            reads=[("the table being read", args.table)],
            ours=written_by_correlate,
        )
    res = correlate(
        args.table, n_boot=args.bootstrap, seed=args.seed, rbo_p=rbo_p, baseline=args.baseline
    )
    print(f"correlations in {res['table']} ({res['models']} models)")
    print(format_table(res))
    if out is None:
        print(
            f"note: the table is {kind}, with no folder to write its results beside; they "
            "are printed above only: give --out FILE.json to keep them as JSON",
            file=sys.stderr,
        )
        return 0
    write_json_atomic(out, res)
    print(f"results: {out}")
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    if args.scorer_help:
        from pipeline.eval.spec import describe_options

        print(describe_options())
        return 0
    if args.table is not None:
        # `prb eval correlate TABLE.csv` / `prb eval bon SPLIT`: only with the word first
        # (a split folder named correlate or bon is still evaluated when nothing follows)
        if str(args.split) == BON:
            return cmd_bon(args)
        if str(args.split) != CORRELATE:
            raise InputError(
                f"one split at a time (got {str(args.split)!r} and {str(args.table)!r}); "
                "a second path only follows the word correlate (prb eval correlate "
                "TABLE.csv) or bon (prb eval bon SPLIT)"
            )
        return cmd_correlate(args)
    for flag, value in (("--rbo-p", args.rbo_p), ("--baseline", args.baseline)):
        if value is not None:
            raise InputError("is an option of prb eval correlate TABLE.csv only", path=flag)
    if args.split is None:
        raise InputError("give the split to evaluate (a release, run directory or file)")
    if str(args.split) == CORRELATE and not args.scorer and not args.split.exists():
        raise InputError("give the table right after the word: prb eval correlate TABLE.csv")
    if str(args.split) == BON and not args.split.exists():
        raise InputError("give the split right after the word: prb eval bon SPLIT --scorer ...")
    _refuse(args, BON_DEFAULTS, "prb eval (prb eval bon SPLIT takes it)")
    if any(s in BON_ONLY_SETTINGS for s in args.setting or ()):
        raise InputError(
            "profile-reference is a setting of prb eval bon only (the reference's BoN "
            "scoring input); prb eval takes question, profile or rubric",
            path="--setting",
        )
    if args.out is not None:  # the one check of outputs, before anything else
        from pipeline.eval.results import check_root

        reads = [("the split being evaluated", args.split)]
        check_root(
            args.out, reads + ([("the config being run", args.config)] if args.config else [])
        )
    if not args.scorer:
        raise InputError(
            "give at least one --scorer rm:MODEL_FOLDER or --scorer judge:MODEL", path="--scorer"
        )
    if args.bootstrap < 1:
        raise InputError("must be at least 1", path="--bootstrap")
    if args.limit is not None and args.limit < 1:
        raise InputError("must be at least 1", path="--limit")
    from pipeline.eval.evaluate import evaluate, judge_model_of
    from pipeline.eval.spec import check_unique_names, parse_spec

    specs = [parse_spec(s) for s in args.scorer]  # every spec checked before any model loads
    cfg = _config(args)
    check_unique_names(specs, lambda spec: judge_model_of(spec, cfg))  # before any preflight
    for spec in specs:
        spec.scorer.preflight(spec)  # model folders, extras: before the split loads
    settings = list(dict.fromkeys(args.setting or ("question", "profile")))
    results = evaluate(
        args.split,
        specs,
        cfg=cfg,
        settings=settings,
        out=args.out,
        limit=args.limit,
        n_boot=args.bootstrap,
        seed=args.seed,
        progress=not args.no_progress,
        stale_ok=args.stale_ok,
    )
    split = results[0]["split"]
    print(f"evaluated {split['rows']} pairs from {split['path']}")
    if split.get("note"):
        print(f"  note: {split['note']}")
    print_table(results)
    for res in results:
        for path in res["outputs"]["results"].values():
            print(f"results: {path}")
    print(f"leaderboard: {results[-1]['outputs']['leaderboard']}")
    failed = sum(
        b["metrics"].get("failed_requests", 0) for r in results for b in r["settings"].values()
    )
    if failed:
        print(
            f"{failed} judge requests failed to get an answer; run the same command again to "
            "retry them (answered requests are cached)",
            file=sys.stderr,
        )
        return 1
    return 0
