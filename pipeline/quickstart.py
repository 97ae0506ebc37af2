"""`prb quickstart`: the whole pipeline on the shipped sample, offline, in seconds.

ingest -> rubrics -> responses -> judge -> pairs (answers replayed from the hand-written
cache in examples/quickstart/), then a round-1 annotation export to a file, the release,
and the audit report.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pipeline.config import Config, load_config
from pipeline.errors import PipelineError


def quickstart_config() -> Path:
    """configs/quickstart.yaml from a checkout, or the copy packaged in the wheel."""
    pkg = Path(__file__).resolve().parent
    for candidate in (
        pkg / "_data" / "configs" / "quickstart.yaml",
        pkg.parent / "configs" / "quickstart.yaml",
    ):
        if candidate.exists():
            return candidate
    raise PipelineError("configs/quickstart.yaml not found; run from a checkout of the project")


def run_quickstart(
    output_dir: str | Path = "outputs",
    *,
    config: Config | None = None,
    echo: Callable[[str], None] = lambda s: print(s, file=sys.stderr),
) -> dict[str, Any]:
    """Run every step; returns the paths and summaries of what each step wrote."""
    from pipeline.annotate.export import export_round
    from pipeline.audit import audit
    from pipeline.orchestrate import run_pipeline
    from pipeline.publish import publish

    cfg = config or load_config(quickstart_config(), [f"run.output_dir={output_dir}"])
    stages = run_pipeline(cfg, progress=False, echo=echo)
    run_dir = cfg.run_dir
    echo("[annotate] exporting round 1 to a task file (no server needed)")
    exported = export_round(cfg, run_dir, 1, file_only=True)
    echo(f"[annotate] {exported['tasks']} tasks -> {exported['tasks_file']}")
    released = publish(cfg, run_dir, policy="filtered")
    echo(f"[publish] {released['rows']} pairs -> {released['out']}")
    report = audit(released["out"], run_dir / "report")
    echo(f"[audit] {report['n_pairs']} pairs -> {report['outputs']['html']}")
    return {
        "run_dir": str(run_dir),
        "stages": stages,
        "annotation": exported,
        "publish": released,
        "audit": report,
    }
