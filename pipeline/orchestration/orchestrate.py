"""Runs stages in order, resuming finished work and re-doing what a settings change made stale.

Plan, then act. The plan decides for every stage up to the last one asked for whether it
is done (skip), partly done with the same settings (resume), stale (redo) or new (run),
and refuses (a stage needed upstream is not done; a finished stage's data is damaged)
before anything on disk changes. Only a plan that goes ahead takes the run directory's
lock, writes ``run.yaml`` and touches a stage folder.

A stage is done when its marker's manifest matches its files and the upstream data it was
built from is the data on disk now (each marker records its inputs' manifests), so a stage
whose input was rebuilt is rebuilt too, never silently left out of date.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from typing import Any

from pipeline.backends.factory import check_installed, preflight
from pipeline.config import Config
from pipeline.core.errors import BudgetReached, ConfigError, StageError, Unanswered
from pipeline.core.ids import content_hash
from pipeline.core.io import remove_strays
from pipeline.engine.budget import run_prices, stage_ledger
from pipeline.inputs.ingest import check_input
from pipeline.kinds.backend import BACKENDS
from pipeline.kinds.stages import ORDER
from pipeline.run import RunDir, RunLock, StageDir
from pipeline.stages import STAGES
from pipeline.stages.base import Context, Stage
from pipeline.types.profile import check_ranker_installed

# besides each backend's own (Backend.libraries)
_LIBS = (
    "personalized-rewardbench",
    "torch",
    "datasets",
    "pyarrow",
    "numpy",
    "huggingface-hub",
    "rapidfuzz",
    "tenacity",
    "sentence-transformers",
    "transformers",
    "label-studio-sdk",
)


def library_versions() -> dict[str, str | None]:
    """Python, platform and library versions (from package metadata: nothing is imported)."""
    out: dict[str, str | None] = {
        "python": platform.python_version(),
        "platform": platform.platform(),
    }
    for lib in dict.fromkeys([_LIBS[0], *BACKENDS.libraries(), *_LIBS[1:]]):
        try:
            out[lib] = metadata.version(lib)
        except metadata.PackageNotFoundError:
            out[lib] = None
    out.update(BACKENDS.environment())
    return out


def _flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(d, dict):
        out: dict[str, Any] = {}
        for k, v in d.items():
            out.update(_flatten(v, f"{prefix}{k}."))
        return out
    return {prefix.rstrip("."): d}


# a value in a re-do reason is shown whole up to this many characters, else shortened
SHOWN_VALUE_CHARS = 60
_BREAKS = " /\\.:_-,;=+"


def shown_value(value: Any, width: int = SHOWN_VALUE_CHARS) -> str:
    """A setting's value for a re-do reason: its JSON, whole when it fits in ``width``;
    else cut after the last separator (space, /, ., :, _, -...) that fits, never
    mid-word, with "…" (and the closing quote of a string) to show it was cut."""
    text = json.dumps(value, ensure_ascii=False)
    if len(text) <= width:
        return text
    head = text[: width - 2]
    cut = max(head.rfind(c) for c in _BREAKS)
    if cut > width // 3:  # a separator late enough to keep most of the value
        head = head[: cut + 1]
    return head + "…" + ('"' if text.endswith('"') else "")


def explain_change(old: dict[str, Any], new: dict[str, Any], limit: int = 4) -> str:
    """Human-readable list of the settings that differ between two stage runs."""
    if "code" in new and "code" not in old:
        return "finished by a version that did not record its code"
    # module names hold dots: the code's entries are compared whole, not flattened
    old_code, new_code = old.get("code") or {}, new.get("code") or {}
    a = _flatten({k: v for k, v in old.items() if k != "code"})
    b = _flatten({k: v for k, v in new.items() if k != "code"})
    changed = []
    for m in sorted(set(old_code) | set(new_code)):
        if m not in new_code:
            changed.append(f"its code no longer includes {m}")
        elif m not in old_code:
            changed.append(f"its code now includes {m}")
        elif old_code[m] != new_code[m]:
            changed.append(f"the code of {m} changed")
    for key in sorted(set(a) | set(b)):
        if a.get(key) != b.get(key):
            if key.startswith("upstream."):
                changed.append(f"stage '{key.split('.', 1)[1]}' was re-done")
            else:
                va, vb = shown_value(a.get(key)), shown_value(b.get(key))
                changed.append(f"{key}: {va} -> {vb}")
    more = f" (+{len(changed) - limit} more)" if len(changed) > limit else ""
    return "; ".join(changed[:limit]) + more if changed else "settings changed"


def _unknown_stage(name: str, option: str = "stage") -> ConfigError:
    """``option`` is what the user typed the name into (``--until``, ``--only``...)."""
    import difflib

    close = difflib.get_close_matches(name, ORDER, n=1)
    hint = f" Did you mean '{close[0]}'?" if close else ""
    return ConfigError(
        f"{option}: unknown stage '{name}'.{hint} Stages in run order: {', '.join(ORDER)}"
    )


def plan_stages(
    until: str | None = None, only: str | None = None, redo: str | None = None
) -> list[str]:
    for option, name in (("--until", until), ("--only", only), ("--redo", redo)):
        if name is not None and name not in ORDER:
            raise _unknown_stage(name, option)
    if until and only:
        raise ConfigError("use --until or --only, not both")
    if only:
        return [only]
    if until:
        return list(ORDER[: ORDER.index(until) + 1])
    return list(ORDER)


def check_contracts(stages: dict[str, Stage]) -> None:
    """Each stage's declared reads must be among what the stage it reads from declares it
    writes, and that stage must run before it; checked before any work starts."""
    order = list(stages)
    for name, st in stages.items():
        for up, fields in st.reads.items():
            if up not in stages or order.index(up) >= order.index(name):
                raise StageError(
                    f"stage '{name}' declares reads from '{up}', which is not a stage before "
                    "it: a bug in the stage's declaration, nothing was run"
                )
            missing = set(fields) - set(stages[up].writes)
            if missing:
                raise StageError(
                    f"stage '{name}' reads {sorted(missing)} from '{up}', which does not "
                    "declare writing them: a bug in a stage's declaration, nothing was run"
                )


@dataclass
class StagePlan:
    name: str
    stage: Stage
    settings: dict[str, Any]
    fingerprint: str
    action: str  # skip | resume | run | redo
    why: str = ""


def make_plan(
    ctx: Context,
    stages: dict[str, Stage],
    plan: list[str],
    redo: str | None = None,
    command: str = "prb run CONFIG",
) -> list[StagePlan]:
    """Decide every stage's action without changing anything; raise on a refusal.
    ``command``: the command (config and --set options) a refusal's suggestion names."""
    rd = ctx.run_dir
    out: list[StagePlan] = []
    rebuilt: set[str] = set()  # stages whose data this run will (re)write
    for name, stage in stages.items():
        sd = rd.stage(name)
        settings = stage.settings(ctx)
        settings["upstream"] = {u: ctx.fingerprints[u] for u in stage.requires}
        # the code that decides its rows: editing it re-does the stage (LLM stages answer
        # from the request cache, as their requests are unchanged)
        settings["code"] = stage.code_fingerprint()
        fp = content_hash(settings)
        ctx.fingerprints[name] = fp
        if redo is not None and name in plan and ORDER.index(name) >= ORDER.index(redo):
            # its metadata is not read: --redo is how a damaged stage.json is repaired
            action, why = "run", ""
            if sd.path.exists():
                action, why = "redo", _redo_reason(name, stage, redo)
        else:
            action, why = _decide(rd, sd, stage, settings, fp, rebuilt)
        if action != "skip":
            rebuilt.add(name)
            if name not in plan:
                first = plan[0]
                raise StageError(
                    f"stage '{name}' is needed by '{first}' but is not done with the current "
                    f"settings ({why or 'not run yet'}); run `{command} --until {name}` first"
                )
        out.append(StagePlan(name, stage, settings, fp, action, why))
    return out


def _redo_reason(name: str, stage: Stage, redo: str) -> str:
    """Why ``--redo REDO`` re-does stage ``name``: asked for it, or its input is re-done."""
    if name == redo:
        return f"asked with --redo {redo}"
    # every stage after the one asked for re-does because what it reads is re-done
    inputs = [u for u in (*stage.requires, *stage.reads) if ORDER.index(u) >= ORDER.index(redo)]
    if inputs:
        return f"its input stage '{inputs[0]}' is re-done (--redo {redo})"
    return f"it comes after stage '{redo}', which is re-done (--redo {redo})"


def _decide(
    rd: RunDir, sd: StageDir, stage: Stage, settings: dict[str, Any], fp: str, rebuilt: set[str]
) -> tuple[str, str]:
    """(action, why) of a stage not asked to be re-done: redo when its settings or inputs
    changed, skip when it is done and intact (damage raises), resume when it started."""
    meta = sd.meta
    if sd.interrupted_clear:
        return "redo", "an earlier re-do of it was interrupted"
    if meta is not None and meta.fingerprint != fp:
        return "redo", explain_change(meta.settings, settings)
    if sd.done:
        marker = sd.marker()
        assert marker is not None  # done: the marker is there
        changed_inputs = [u for u in stage.reads if u in rebuilt]
        if marker.files is None:
            return "redo", "finished by an older version (no manifest)"
        if changed_inputs:
            return "redo", f"its input stage '{changed_inputs[0]}' is being rebuilt"
        if marker.inputs is not None and any(
            marker.inputs.get(u) != rd.stage(u).content_id() for u in stage.reads
        ):
            return "redo", "its input data changed since it finished"
        sd.check_intact()
        return "skip", ""
    if meta is not None:
        return "resume", ""
    return "run", ""


def _preflight(ctx: Context, plans: list[StagePlan], echo: Callable[[str], None]) -> None:
    """A backend that cannot be built fails before the first stage, not at the third."""
    for p in plans:
        if p.action == "redo":
            ctx.run_dir.stage(p.name).check_clearable()  # before anything changes
    if any(p.name == "ingest" and p.action != "skip" for p in plans):
        # bad input, and a ranker whose extra is missing, are refused before the run
        # directory is created or changed
        check_input(ctx.config.input, ctx.config.resolve_input)
        check_ranker_installed(ctx.config.profile.ranker)
    if any(p.stage.uses_llm(ctx) for p in plans):
        # said by the backend itself, before the first stage, also when every stage is
        # done: a finished run answered "nothing to do" for a backend it could not run
        check_installed(ctx.config.backend)
    if any(p.action != "skip" and p.stage.uses_llm(ctx) for p in plans):
        cached = ctx.run_dir.cache_path.exists()
        warning = preflight(ctx.config.backend, ctx.config.resolve_input, cached=cached)
        if warning and not ctx.warnings:  # an unreachable server is said once
            echo(f"warning: {warning}")
        if cached and any(p.action == "redo" and p.stage.uses_llm(ctx) for p in plans):
            # a stage is about to be cleared: a damaged cache is found now, before that.
            # quick_check reads the whole file, so only then; otherwise a damaged cache is
            # found at its first use, with the same one-line error and nothing lost
            ctx.cache.check()


def _refuse_undoing(rd: RunDir, plans: list[StagePlan], what: str, command: str) -> None:
    """One ConfigError when ``plans`` would re-do a finished stage (`prb batch export`
    with another backend than the one that finished it: its work would be thrown away)."""
    for p in plans:
        if p.action == "redo" and rd.stage(p.name).done:
            raise ConfigError(
                f"`{what}` would re-do stage '{p.name}' of {rd.shown}, which is finished "
                f"({p.why}); batch files never undo finished work, so nothing was changed: "
                "give the run a new name (--set run.name=NAME) to answer every stage with batch "
                f"files, or re-do it on purpose first with `{command} --redo {p.name}`"
            )


def run_pipeline(
    config: Config,
    *,
    until: str | None = None,
    only: str | None = None,
    redo: str | None = None,
    progress: bool = True,
    echo: Callable[[str], None] = lambda s: print(s, file=sys.stderr),
    lock: RunLock | None = None,
    command: str = "prb run CONFIG",
    keep_finished: str | None = None,
) -> dict[str, dict[str, Any]]:
    """Run the planned stages; returns each executed stage's stats. ``lock``: the run
    directory's lock, already taken by the caller (`prb run` takes it before importing the
    stages, so a second writer is refused at once); released here at the end. ``command``:
    the `prb run` command with its config and --set options, for suggestions.
    ``keep_finished``: the command (`prb batch`) that must never undo a finished
    stage: a plan that would re-do one is refused before anything changes."""
    names = plan_stages(until, only, redo)
    if redo is not None and redo not in names:
        raise ConfigError(f"--redo {redo} is outside the stages this command runs")
    last = ORDER.index(names[-1])
    stages: dict[str, Stage] = {n: STAGES.get(n)() for n in ORDER[: last + 1]}
    check_contracts(stages)

    rd = RunDir(config.run_dir)
    ctx = Context(config=config, run_dir=rd, progress=progress)
    existed = os.path.lexists(rd.path)
    lock = lock or rd.lock()
    if existed:
        rd.check_writable(config)  # a folder of the user's is refused before the lock file
        lock.acquire()
    results: dict[str, dict[str, Any]] = {}
    try:
        plans = make_plan(ctx, stages, names, redo, command)
        if keep_finished:
            _refuse_undoing(rd, plans, keep_finished, command)
        for w in dict.fromkeys(ctx.warnings):
            echo(f"warning: {w}")
        _preflight(ctx, plans, echo)
        if not existed:
            # nothing was on disk, so a refusal above left nothing behind either; another
            # process may create the folder meanwhile, so plan again under the lock
            rd.path.mkdir(parents=True, exist_ok=True)
            lock.acquire()
            rd.check_writable(config)
            ctx.fingerprints.clear()
            plans = make_plan(ctx, stages, names, redo, command)
        # the plan goes ahead: from here on the run directory changes
        rd.mark()
        removed = remove_strays(rd.path)
        if removed:
            echo(f"removed {removed} temporary files left by an interrupted run")
        rd.write_config(rd.resolved_config(config))
        # environment.json describes the latest invocation; each stage.json keeps the one
        # that ran that stage, since a run may be generated on a GPU machine and resumed
        # elsewhere.
        env: dict[str, Any] = dict(library_versions())
        llm_stages = [p.name for p in plans if p.stage.uses_llm(ctx)]
        if llm_stages:
            # what answers this invocation's requests; each stage.json keeps its own
            env["served_by"] = ctx.served_by
            env["served_by_stages"] = llm_stages
        rd.write_environment(env)
        for p in plans:
            try:
                stats = _act(ctx, p, env, echo)
            except Unanswered as exc:  # its suggestion names this run's config and --set
                raise exc.suggesting(command) from None
            if stats is not None:
                results[p.name] = stats
    finally:
        ctx.close()
        lock.release()
    return results


def _act(
    ctx: Context, p: StagePlan, env: dict[str, Any], echo: Callable[[str], None]
) -> dict[str, Any] | None:
    name, stage = p.name, p.stage
    sd = ctx.run_dir.stage(name)
    if p.action == "skip":
        echo(f"[{name}] done, nothing to do")
        return None
    if p.action == "redo":
        echo(f"[{name}] re-doing: {p.why}")
        left = sd.clear()
        if left:
            shown = ", ".join(x.name for x in left[:3]) + (" ..." if len(left) > 3 else "")
            echo(f"[{name}] left {len(left)} file(s) prb did not write in {sd.path}: {shown}")
    elif p.action == "resume" and not stage.resumable:
        sd.clear_shards()  # cheap to redo from scratch, and never appends twice
    resuming = p.action == "resume" and stage.resumable and bool(sd.shard_ids())
    expected = stage.expected(ctx)
    env = {k: v for k, v in env.items() if k not in ("served_by", "served_by_stages")}
    if stage.uses_llm(ctx):
        env["served_by"] = ctx.served_by  # what produced this stage's answers
    sd.begin(p.fingerprint, p.settings, expected, environment=env)
    sd.contract = set(stage.writes)
    echo(f"[{name}] {'resuming' if resuming else 'running'} ({expected} examples)")
    t0 = time.perf_counter()
    try:
        stats = stage.run(ctx, sd)
    except BudgetReached as exc:
        # what finished is in its shards (the stage loop flushes on the way out); the
        # stage stays unfinished, with this invocation's figures and the ledger
        stopped = {
            "stopped_by_budget": exc.spent,
            "llm": exc.stats,
            "seconds": round(time.perf_counter() - t0, 3),
            "fingerprint": p.fingerprint,
        }
        stopped["ledger"] = _ledger(ctx, name, exc.stats)
        sd.write_stats(stopped)
        raise
    stats["seconds"] = round(time.perf_counter() - t0, 3)
    stats["fingerprint"] = p.fingerprint
    if stage.uses_llm(ctx):
        stats["ledger"] = _ledger(ctx, name, stats.get("llm"))
    if stats.get("pending_examples"):
        sd.write_stats(stats)
        llm = stats.get("llm") or {}
        raise StageError(
            f"stage '{name}': {stats['pending_examples']} examples have failed requests "
            f"({llm.get('failure_reasons')}); they are recorded in cache.sqlite and will be "
            "retried: run the same command again"
        )
    inputs = {u: ctx.run_dir.stage(u).content_id() for u in stage.reads}
    sd.finish(stats, inputs=inputs)
    echo(f"[{name}] done: {summarize(stats)}")
    if "dropped_by_reason" in stats:
        echo(funnel(stats, dropped_before(ctx.run_dir)))
    return stats


def dropped_before(rd: RunDir) -> dict[str, dict[str, int]]:
    """The examples stages before the pair stage dropped, by stage and reason (the rubrics
    stage's rejects: a row without a usable rubric), so the funnel starts at the input."""
    out = {}
    for name in ("rubrics",):
        sd = rd.stage(name)
        reasons = sd.stats().get("reject_reasons") if sd.done else None
        if isinstance(reasons, dict) and any(reasons.values()):
            out[name] = {str(k): int(v) for k, v in reasons.items() if v}
    return out


def _ledger(ctx: Context, name: str, llm: dict[str, Any] | None) -> dict[str, Any]:
    """A stage's ledger for its stats.json (pipeline/engine/budget.py)."""
    prices = run_prices(ctx.config)  # the batch rates when the backend sends batches
    return stage_ledger(ctx.cache, name, ctx.served_by_id, prices, llm)


def summarize(stats: dict[str, Any]) -> str:
    keys = [k for k, v in stats.items() if isinstance(v, (int, float)) and k != "seconds"]
    parts = [f"{k}={stats[k]}" for k in keys[:6]]
    llm = stats.get("llm")
    if isinstance(llm, dict) and "requests" in llm:
        sent = "sent" if BACKENDS.answers_new(str(llm.get("backend"))) else "replayed"
        # sent counts re-asks too: named, so sent above requests is explained
        reasks = llm.get("reasks") or 0
        more = f" + {reasks} re-asks" if reasks else ""
        parts.append(
            f"requests {llm['requests']}{more} ({sent} {llm['sent']}, cached {llm['cached']}, "
            f"failed {llm['failed']})"
        )
    return ", ".join(parts) + f" in {stats.get('seconds', 0)}s"


def funnel(stats: dict[str, Any], before: dict[str, dict[str, int]] | None = None) -> str:
    """The pair stage's funnel as text: examples in, drops by reason, pairs kept; with
    ``before`` (:func:`dropped_before`), the examples earlier stages dropped first."""
    lines = []
    if before:
        n_before = sum(n for reasons in before.values() for n in reasons.values())
        lines.append(f"  input             {stats['examples'] + n_before:6d}")
        for stage, reasons in before.items():
            for reason, n in reasons.items():
                lines.append(f"  - {reason + ' (' + stage + ')':16s}{n:6d}")
    lines.append(f"  examples          {stats['examples']:6d}")
    for reason, n in stats["dropped_by_reason"].items():
        if n:
            lines.append(f"  - {reason:16s}{n:6d}")
    lines.append(f"  = kept            {stats['kept']:6d}")
    return "\n".join(lines)
