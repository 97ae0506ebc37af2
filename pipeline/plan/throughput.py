"""Output tokens per second for the plan's time: given, measured on the run, or measured
by the project's benchmarks (read from a source checkout's benchmarks/results/ only: an
installed package has no such folder, and the plan's time line says so)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pipeline.core.errors import PipelineError
from pipeline.engine.budget import LLM_STAGES
from pipeline.kinds.backend import BACKENDS
from pipeline.stages.base import Context


def benchmark_results() -> Path | None:
    """The folder the project's benchmarks write their figures to, where this package runs
    from a source checkout (it sits beside the package); an installed package has none."""
    folder = Path(__file__).resolve().parents[2] / "benchmarks" / "results"
    return folder if folder.is_dir() else None


def throughput(
    ctx: Context, given: float | None, measured: dict[str, dict[str, Any]]
) -> tuple[float | None, str]:
    """Output tokens per second, and where the figure comes from."""
    if given is not None:
        return given, "given with --tokens-per-second"
    tokens = seconds = 0.0
    for name in LLM_STAGES:
        try:
            llm = ctx.run_dir.stage(name).stats().get("llm")
        except PipelineError:
            continue
        if isinstance(llm, dict) and llm.get("sent") and name in measured:
            tokens += float(llm.get("completion_tokens") or 0)
            seconds += float(llm.get("seconds") or 0)
    if tokens and seconds:
        return tokens / seconds, "measured on this run (the latest invocation of its LLM stages)"
    benchmark = BACKENDS.get(ctx.config.backend.name).throughput_benchmark
    results = benchmark_results()
    if benchmark is not None and results is None:
        return None, (
            "no throughput: give --tokens-per-second (output tokens per second); the figures "
            f"benchmarks/{Path(benchmark).stem}.py measures are read from a source checkout's "
            "benchmarks/results/, which this installation lacks"
        )
    if benchmark is not None and results is not None:
        path = results / benchmark
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            figures = [
                v.get("output_tokens_per_s")
                for v in (data.get("variants") or data.get("results") or [])
                if isinstance(v, dict)
            ]
            best = max(f for f in figures if isinstance(f, (int, float)))
            return float(best), f"measured by benchmarks/{path.stem}.py ({path.name})"
        except (OSError, ValueError, AttributeError):
            pass
    return None, "no throughput: give --tokens-per-second (output tokens per second)"
