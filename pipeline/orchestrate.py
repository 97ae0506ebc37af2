"""Runs stages in order, resuming finished work and re-doing what a settings change made stale."""

from __future__ import annotations

import json
import platform
import sys
import time
from collections.abc import Callable
from importlib import metadata
from typing import Any

from pipeline.config import Config
from pipeline.errors import ConfigError, StageError
from pipeline.ids import content_hash
from pipeline.io import write_json_atomic, write_text_atomic
from pipeline.rundir import RunDir
from pipeline.stages import ORDER, STAGES
from pipeline.stages.base import Context, Stage

_LIBS = (
    "personalized-rewardbench",
    "openai",
    "vllm",
    "ray",
    "datasets",
    "pyarrow",
    "numpy",
    "huggingface-hub",
    "rapidfuzz",
    "tenacity",
    "rank-bm25",
    "sentence-transformers",
    "torch",
    "label-studio-sdk",
)


def library_versions() -> dict[str, str | None]:
    """Python, platform and library versions (from package metadata: nothing is imported)."""
    out: dict[str, str | None] = {
        "python": platform.python_version(),
        "platform": platform.platform(),
    }
    for lib in _LIBS:
        try:
            out[lib] = metadata.version(lib)
        except metadata.PackageNotFoundError:
            out[lib] = None
    return out


def _flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(d, dict):
        out: dict[str, Any] = {}
        for k, v in d.items():
            out.update(_flatten(v, f"{prefix}{k}."))
        return out
    return {prefix.rstrip("."): d}


def explain_change(old: dict[str, Any], new: dict[str, Any], limit: int = 4) -> str:
    """Human-readable list of the settings that differ between two stage runs."""
    a, b = _flatten(old), _flatten(new)
    changed = []
    for key in sorted(set(a) | set(b)):
        if a.get(key) != b.get(key):
            if key.startswith("upstream."):
                changed.append(f"stage '{key.split('.', 1)[1]}' was re-done")
            else:
                va, vb = json.dumps(a.get(key))[:40], json.dumps(b.get(key))[:40]
                changed.append(f"{key}: {va} -> {vb}")
    more = f" (+{len(changed) - limit} more)" if len(changed) > limit else ""
    return "; ".join(changed[:limit]) + more if changed else "settings changed"


def plan_stages(until: str | None = None, only: str | None = None) -> list[str]:
    for name in (until, only):
        if name is not None and name not in ORDER:
            STAGES.check(name)  # raises with "did you mean"
    if until and only:
        raise ConfigError("use --until or --only, not both")
    if only:
        return [only]
    if until:
        return list(ORDER[: ORDER.index(until) + 1])
    return list(ORDER)


def check_contracts(stages: dict[str, Stage]) -> None:
    """Each stage's declared reads must be among its upstream stage's declared writes."""
    for name, st in stages.items():
        for up, fields in st.reads.items():
            if up not in stages:
                raise StageError(f"stage '{name}' reads from unknown stage '{up}'")
            missing = set(fields) - stages[up].writes
            if missing:
                raise StageError(
                    f"stage '{name}' reads {sorted(missing)} from '{up}', which does not write them"
                )


def run_pipeline(
    config: Config,
    *,
    until: str | None = None,
    only: str | None = None,
    progress: bool = True,
    echo: Callable[[str], None] = lambda s: print(s, file=sys.stderr),
) -> dict[str, dict[str, Any]]:
    """Run the planned stages; returns each executed stage's stats."""
    plan = plan_stages(until, only)
    last = ORDER.index(plan[-1])
    stages: dict[str, Stage] = {n: STAGES.get(n)() for n in ORDER[: last + 1]}
    check_contracts(stages)

    rd = RunDir(config.run_dir)
    rd.path.mkdir(parents=True, exist_ok=True)
    write_text_atomic(
        rd.config_path,
        "# Resolved config of this run (secrets are never written here).\n" + config.to_yaml(),
    )
    # environment.json describes the latest invocation; each stage.json keeps the one that
    # ran that stage, since a run may be generated on a GPU machine and resumed elsewhere.
    env = library_versions()
    write_json_atomic(rd.path / "environment.json", env)

    ctx = Context(config=config, run_dir=rd, progress=progress)
    results: dict[str, dict[str, Any]] = {}
    try:
        for name, stage in stages.items():
            sd = rd.stage(name)
            settings = stage.settings(ctx)
            settings["upstream"] = {u: ctx.fingerprints[u] for u in stage.requires}
            fp = content_hash(settings)
            ctx.fingerprints[name] = fp
            meta = sd.meta
            if meta is not None and meta.get("fingerprint") != fp:
                why = explain_change(meta.get("settings", {}), settings)
                echo(f"[{name}] re-doing: {why}")
                sd.clear()
            elif sd.done:
                echo(f"[{name}] done, nothing to do")
                continue
            if name not in plan:
                raise StageError(
                    f"stage '{name}' is needed by '{plan[0]}' but is not done with the current "
                    f"settings; run `prb run CONFIG --until {name}` first"
                )
            resuming = sd.path.exists() and bool(sd.shard_ids())
            expected = stage.expected(ctx)
            sd.begin(fp, settings, expected, environment=env)
            echo(f"[{name}] {'resuming' if resuming else 'running'} ({expected} examples)")
            t0 = time.perf_counter()
            stats = stage.run(ctx, sd)
            stats["seconds"] = round(time.perf_counter() - t0, 3)
            stats["fingerprint"] = fp
            if stats.get("pending_examples"):
                write_json_atomic(sd.path / "stats.json", stats)
                raise StageError(
                    f"stage '{name}': {stats['pending_examples']} examples have failed requests "
                    f"({stats.get('llm', {}).get('failure_reasons')}); they are recorded in "
                    "cache.sqlite and will be retried: run the same command again"
                )
            sd.finish(stats)
            results[name] = stats
            echo(f"[{name}] done: {summarize(stats)}")
            if "dropped_by_reason" in stats:
                echo(funnel(stats))
    finally:
        ctx.close()
    return results


def summarize(stats: dict[str, Any]) -> str:
    keys = [k for k, v in stats.items() if isinstance(v, (int, float)) and k != "seconds"]
    parts = [f"{k}={stats[k]}" for k in keys[:6]]
    return ", ".join(parts) + f" in {stats.get('seconds', 0)}s"


def funnel(stats: dict[str, Any]) -> str:
    """The pair stage's funnel as text: examples in, drops by reason, pairs kept."""
    lines = [f"  examples          {stats['examples']:6d}"]
    for reason, n in stats["dropped_by_reason"].items():
        if n:
            lines.append(f"  - {reason:16s}{n:6d}")
    lines.append(f"  = kept            {stats['kept']:6d}")
    return "\n".join(lines)
