"""configs/reference.yaml, the reference's construction, on a local stand-in of LaMP-QA's
layout (tests/lamp_repo.py) with a tiny encoder for the Contriever ranking and the
stand-in server: `prb plan` from the datasets cache, the one-line error when the dataset
is neither cached nor reachable, and a run end to end to a release whose subsets are the
three configs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import yaml
from lamp_repo import CONFIGS, build_lamp_repo, cache_as_hub

from pipeline.cli import main
from pipeline.run import RunDir

pytest.importorskip("transformers")  # the contriever extra; CI installs it

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = ROOT / "configs" / "reference.yaml"
PRB = [sys.executable, "-c", "import sys; from pipeline.cli import main; sys.exit(main())"]


@pytest.fixture(scope="module")
def encoder(tmp_path_factory) -> str:
    from tiny_encoder import build_tiny_encoder

    return str(build_tiny_encoder(tmp_path_factory.mktemp("tiny-bert")))


def _offline_env(tmp_path: Path, datasets_cache: Path) -> dict[str, str]:
    return dict(
        os.environ,
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        HF_HOME=str(tmp_path / "hf-home"),
        HF_DATASETS_CACHE=str(datasets_cache),
        PYTHONPATH=str(ROOT),
    )


def test_the_config_is_the_reference_construction():
    cfg = yaml.safe_load(REFERENCE.read_text())
    assert cfg["input"] == {
        "format": "hub",
        "dataset": "alireza7/LaMP-QA",
        "configs": list(CONFIGS),
        "split": "test",
    }
    assert cfg["profile"]["ranker"] == "contriever"
    assert cfg["profile"]["contriever_model"] == "facebook/contriever-msmarco"
    assert cfg["responses"] == {"strategies": ["avoid_all"], "word_cap": 100}
    assert cfg["rubrics"] == {"source": "given"}


def test_plan_reads_the_dataset_from_the_cache_offline(tmp_path, encoder):
    cache = cache_as_hub(tmp_path / "datasets-cache", tmp_path / "work")
    out = tmp_path / "outputs"
    proc = subprocess.run(
        [*PRB, "plan", str(REFERENCE), "--set", f"profile.contriever_model={encoder}",
         "--set", f"run.output_dir={out}",
         "--set", "run.prices.input_usd_per_million=0.15",
         "--set", "run.prices.output_usd_per_million=0.6"],
        env=_offline_env(tmp_path, cache), capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {line.split()[0]: line.split() for line in proc.stdout.splitlines() if line.strip()}
    # 12 questions over the three configs; one chosen and one avoid_all answer, n 2 each
    assert rows["ingest"][:3] == ["ingest", "run", "12"]
    assert rows["responses"][:6] == ["responses", "run", "12", "24", "0", "24"]
    cost = next(line for line in proc.stdout.splitlines() if line.startswith("cost:"))
    assert "$" in cost
    assert "Traceback" not in proc.stderr
    assert not out.exists()  # planning wrote nothing


def test_plan_offline_without_the_dataset_says_what_to_download(tmp_path):
    proc = subprocess.run(
        [*PRB, "plan", str(REFERENCE), "--set", f"run.output_dir={tmp_path / 'outputs'}"],
        env=_offline_env(tmp_path, tmp_path / "empty-cache"),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(
        "error: alireza7/LaMP-QA [Art_and_Entertainment/test]: the dataset is not in the local "
        f"datasets cache ({tmp_path / 'empty-cache'}) and offline mode is on"
    )
    assert "datasets.load_dataset('alireza7/LaMP-QA', c, split='test')" in lines[0]
    assert "HF_DATASETS_CACHE" in lines[0]


def test_reference_end_to_end_to_a_release_of_the_three_configs(tmp_path, server, encoder):
    repo = build_lamp_repo(tmp_path / "LaMP-QA")
    sets = [
        f"input.dataset={repo}",
        f"input.cache_dir={tmp_path / 'datasets-cache'}",
        f"profile.contriever_model={encoder}",
        f"run.output_dir={tmp_path / 'outputs'}",
        f"backend.openai.base_url={server.base_url}",
        "backend.model=standin-model",
        "backend.openai.max_concurrency=8",
    ]
    args = [a for s in sets for a in ("--set", s)]
    assert main(["run", str(REFERENCE), "--no-progress", *args]) == 0
    run_dir = tmp_path / "outputs" / "reference"
    rd = RunDir(run_dir)

    examples = list(rd.stage("ingest").rows())
    assert Counter(e["category"] for e in examples) == {c: 4 for c in CONFIGS}
    # the profile view is the Contriever ranking, recorded once at ingest
    from pipeline.types.profile import rank_contriever

    ex = examples[0]
    assert ex["profile_view"] == {
        "ranker": "contriever",
        "top_k": 10,
        "order": rank_contriever(ex["question"], ex["profile"], encoder)[:10],
    }
    strategies = Counter(c["strategy"] for c in rd.stage("responses").rows())
    assert strategies == {"chosen": 24, "avoid_all": 24}

    assert main(["publish", str(run_dir)]) == 0
    release = run_dir / "publish"
    subsets = sorted(p.name for p in release.iterdir() if p.is_dir())
    assert subsets == sorted([*CONFIGS, "all"])
    import pyarrow.parquet as pq

    kept = 0
    for config in CONFIGS:
        (data,) = (release / config).glob("*.parquet")
        rows = pq.read_table(data).to_pylist()
        assert rows and {r["category"] for r in rows} == {config}
        kept += len(rows)
    (all_data,) = (release / "all").glob("*.parquet")
    assert pq.read_table(all_data).num_rows == kept
    info = json.loads((release / "release.json").read_text())
    assert set(info["configs"]) == {*CONFIGS, "all"}
