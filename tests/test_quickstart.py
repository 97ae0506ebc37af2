"""The README's quickstart: everything on the hand-written sample, offline, from a fresh
folder, with fake secrets in the environment that must reach no file."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from pipeline.run import RunDir

SECRETS = {
    "OPENAI_API_KEY": "sk-fake-openai-123456",
    "LABEL_STUDIO_API_KEY": "ls-fake-token-abcdef",
    "HF_TOKEN": "hf_fake_token_7890",
}


def test_quickstart_runs_every_step_offline(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in SECRETS}
    env.update(SECRETS, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    res = subprocess.run(
        [sys.executable, "-m", "pipeline.cli", "quickstart", "--out", str(tmp_path / "out")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    run = tmp_path / "out" / "quickstart"
    rd = RunDir(run)
    for stage in ("ingest", "rubrics", "responses", "judge", "pairs"):
        assert rd.stage(stage).done, stage
    assert len(list(rd.stage("ingest").rows())) == 4
    assert len(list(rd.stage("responses").rows())) == 8
    kept, dropped = list(rd.stage("pairs").rows()), list(rd.stage("pairs").rejects())
    assert len(kept) == 3
    assert [r["reason"] for r in dropped] == ["length"]  # the hand-written one-line answer

    tasks = json.loads((run / "annotate" / "round-1" / "tasks.json").read_text())
    # sample_size 3 holds every kept pair: none is left to make a gold task from, and a gold
    # task repeating a real task's question would give itself away (issue 52)
    assert len(tasks) == 3 and not any(t["data"].get("gold") for t in tasks)
    assert {t["data"]["pair_id"] for t in tasks if not t["data"].get("gold")} == {
        r["pair_id"] for r in kept
    }

    release = run / "publish"
    code = (
        "import datasets, json, sys; "
        "ds = datasets.load_dataset('parquet', split='test', "
        "data_files={'test': sys.argv[1] + '/all/*.parquet'}); "
        "print(json.dumps([len(ds), ds.column_names[:8]]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(release)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    n, cols = json.loads(out.strip().splitlines()[-1])
    assert n == 3
    assert cols == [
        "id",
        "question",
        "profile",
        "rubric_aspects",
        "narrative",
        "category",
        "chosen",
        "rejected",
    ]
    report = json.loads((run / "report" / "audit.json").read_text())
    assert report["n_pairs"] == 3
    assert (run / "report" / "audit.html").stat().st_size > 1000

    for f in tmp_path.rglob("*"):
        if f.is_file():
            data = f.read_bytes()
            for name, value in SECRETS.items():
                assert value.encode() not in data, f"{name} leaked into {f}"
    assert not any(v in res.stdout + res.stderr for v in SECRETS.values())


def test_a_local_quickstart_that_kept_nothing_names_a_whole_command(tmp_path):
    """Its next step was `--set backend.model=PATH.gguf`, which `prb quickstart` does not
    take: it is now the whole `prb run` line, and the CLI parses it."""
    import shlex

    from pipeline.cli.prb import build_parser
    from pipeline.quickstart import next_steps

    text = next_steps({"run_dir": str(tmp_path / "out" / "quickstart-local"), "kept": 0})
    line = next(x for x in text.splitlines() if "A larger GGUF" in x)
    command = line.split("(docs/local.md): ", 1)[1]
    words = shlex.split(command)
    assert words[1] == "run" and "backend.model=PATH.gguf" in words
    args = build_parser().parse_args(words[1:])
    assert args.command == "run" and "backend.name=llamacpp" in args.overrides
