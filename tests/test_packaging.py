"""The wheel carries prompts/, rubrics/ and annotation/, and the installed package finds them."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow


def test_wheel_ships_data_and_finds_it(tmp_path):
    dist = tmp_path / "dist"
    subprocess.run(
        [sys.executable, "-m", "hatchling", "build", "-t", "wheel", "-d", str(dist)],
        cwd=ROOT,
        check=True,
        capture_output=True,
    )
    wheel = next(dist.glob("personalized_rewardbench-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    for needed in (
        "pipeline/_data/prompts/response_chosen.j2",
        "pipeline/_data/rubrics/rubric.schema.json",
        "pipeline/_data/annotation/README.md",
        "pipeline/_data/configs/quickstart.yaml",
        "pipeline/_data/examples/quickstart/cache.jsonl",
        "pipeline/cli/prb.py",
    ):
        assert needed in names
    assert not any(n.startswith(("tests/", "outputs/")) for n in names)

    target = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--target",
            str(target),
            str(wheel),
        ],
        check=True,
        capture_output=True,
    )
    code = (
        "import pipeline, pipeline.core.resources as r, pipeline.quickstart as q; "
        "print(pipeline.__file__); print(r.data_dir('prompts')); print(q.quickstart_config())"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env={"PYTHONPATH": str(target)},
        check=True,
        capture_output=True,
        text=True,
    ).stdout.splitlines()
    assert out[0].startswith(str(target))
    assert out[1] == str(target / "pipeline" / "_data" / "prompts")
    assert out[2] == str(target / "pipeline" / "_data" / "configs" / "quickstart.yaml")

    # the code in each stage's fingerprint is read from the installed modules and hashes
    # as the checkout's does: a run moved between the two re-does nothing
    code = (
        "import json, pipeline.stages.base as b; from pipeline.kinds.stages import ORDER; "
        "from pipeline.stages import STAGES; "
        "print(b.__file__); "
        "print(json.dumps({n: STAGES.get(n)().code_fingerprint() for n in ORDER}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env={"PYTHONPATH": str(target)},
        check=True,
        capture_output=True,
        text=True,
    ).stdout.splitlines()
    from pipeline.kinds.stages import ORDER
    from pipeline.stages import STAGES

    assert out[0].startswith(str(target))
    assert json.loads(out[1]) == {n: STAGES.get(n)().code_fingerprint() for n in ORDER}

    # `prb plan` runs from the wheel, which has no benchmarks/results/ (a checkout's folder):
    # the time says where a measured throughput would come from instead of reading a path
    # the package does not have, and planning writes nothing into the installation
    shipped = target / "pipeline" / "_data" / "configs" / "quickstart.yaml"
    before = sorted(
        p.relative_to(target) for p in target.rglob("*") if "__pycache__" not in p.parts
    )
    args = ["plan", str(shipped), "--json", "--set", "backend.name=vllm"]
    res = subprocess.run(
        [sys.executable, "-m", "pipeline.cli", *args],
        cwd=tmp_path,
        env={"PYTHONPATH": str(target)},
        check=True,
        capture_output=True,
        text=True,
    )
    plan = json.loads(res.stdout)
    assert plan["totals"]["requests_to_send"] == 40  # as planned from the checkout
    assert plan["time"]["output_tokens_per_second"] is None
    assert "benchmarks/results/, which this installation lacks" in plan["time"]["source"]
    after = sorted(p.relative_to(target) for p in target.rglob("*") if "__pycache__" not in p.parts)
    assert after == before


def test_help_imports_no_engine():
    res = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "pipeline.cli", "--help"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "run" in res.stdout and "status" in res.stdout
    imported = res.stderr
    for heavy in ("vllm", "ray", "datasets", "openai", "torch"):
        assert f" {heavy}\n" not in imported and f" {heavy}." not in imported, heavy
