"""What the `prb eval bon` tests, its overhead benchmark and the reference-fidelity script
run on: the sample release (configs/sample.yaml against the stand-in server, published),
three tiny reward models built from its words, and the command line that evaluates them.

The sample input is HAND-WRITTEN (examples/sample_lamp.jsonl), the stand-in answers by
rule (tests/standin_player.py), and the reward models have random weights: the figures
measure the machinery, never a model's quality.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
N_MODELS = 3


def build_release(tmp: Path, base_url: str) -> Path:
    """`prb run configs/sample.yaml` against the stand-in at ``base_url``, published into
    ``tmp/sample/publish``; returns the release folder."""
    from pipeline.cli import main
    from pipeline.config import load_config
    from pipeline.orchestrate import run_pipeline

    overrides = [
        f"backend.openai.base_url={base_url}",
        f"run.output_dir={tmp}",
        "backend.openai.max_concurrency=8",
        "backend.openai.timeout_s=120",
    ]
    cfg = load_config(ROOT / "configs" / "sample.yaml", overrides)
    run_pipeline(cfg, progress=False, echo=lambda _m: None)
    assert main(["publish", str(tmp / "sample")]) == 0
    return tmp / "sample" / "publish"


def build_models(release: Path, folder: Path, n: int = N_MODELS) -> list[Path]:
    """Tiny reward models (random weights, one seed each) over the release's words, as
    ``python -m pipeline.eval.tiny`` builds them."""
    from pipeline.eval.tiny import build_tiny_reward_model, split_texts

    texts = split_texts(release)
    return [build_tiny_reward_model(folder / f"tiny-rm-{i}", texts, seed=i) for i in range(n)]


def backend_args(base_url: str, concurrency: int = 4) -> list[str]:
    return [
        "--set",
        f"backend.openai.base_url={base_url}",
        "--set",
        "backend.model=standin-model",
        "--set",
        f"backend.openai.max_concurrency={concurrency}",
        "--set",
        "backend.openai.timeout_s=120",
        "--set",
        "backend.backoff_initial_s=0.01",
    ]


def bon_args(
    release: Path, models: list[Path], base_url: str, out: Path, *extra: str, gen: bool = True
) -> list[str]:
    """``prb eval bon`` over the tiny models (and the stand-in as a generative scorer),
    N = 4, the stand-in as policy and judge."""
    args = ["eval", "bon", str(release)]
    for m in models:
        args += ["--scorer", f"rm:{m}"]
    if gen:
        args += ["--scorer", "gen:standin-model,name=standin-gen"]
    return [
        *args,
        "--n",
        "4",
        "--out",
        str(out),
        "--no-progress",
        "--bootstrap",
        "200",
        *backend_args(base_url),
        *extra,
    ]


def curves(out: Path) -> list[Any]:
    """What must not change between two runs of one command: every scorer's curves."""
    doc = json.loads((out / "bon.json").read_text(encoding="utf-8"))
    return [(b["name"], b["curves"]) for b in doc["scorers"]]
