"""What served each answer is part of its identity: an answer of one backend never reaches
another backend's stages or its card, and a release built from the stand-in says plainly
that its answers are not model output."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import write_config
from standin_server import StandinServer

from pipeline.cli import main
from pipeline.run import RunDir


def _texts(run: Path) -> set[str]:
    return {c["text"] for c in RunDir(run).stage("responses").rows()}


def test_another_backend_under_the_same_run_gets_none_of_the_first_ones_answers(tmp_path, capsys):
    run = tmp_path / "outputs" / "t"
    with StandinServer() as standin:
        cfg = write_config(tmp_path, standin, input={"limit": 4})
        assert main(["run", str(cfg), "--no-progress"]) == 0
        first = _texts(run)
        assert main(["publish", str(run)]) == 0
    card = (run / "publish" / "README.md").read_text()
    assert "**Not model output.**" in card and "the project's stand-in server" in card
    release = json.loads((run / "publish" / "release.json").read_text())
    assert "not a model" in release["provenance"]["generator_models"][0]
    capsys.readouterr()

    # the same config and run directory, now answered by a server that reports a real model
    # (it plays the same rules, so the texts may coincide: what shows which server answered
    # is that nothing came from the cache and every row records the new server)
    real = {"owned_by": "vllm", "root": "/models/qwen2.5-7b"}
    with StandinServer(report_as=real, model="standin-model") as other:
        cfg = write_config(tmp_path, other, input={"limit": 4})
        assert main(["run", str(cfg), "--no-progress"]) == 0
        sent = other.request_count
    err = capsys.readouterr().err
    # every LLM stage re-done, saying why; every request sent to the new server
    for stage in ("responses", "judge"):
        assert f"[{stage}] re-doing: served_by" in err, err
    cached = [int(x) for x in __import__("re").findall(r"cached (\d+)", err)]
    assert sent > 0 and cached and all(n == 0 for n in cached), err
    assert first and _texts(run)
    for c in RunDir(run).stage("responses").rows():
        assert c["provenance"]["served_by"]["kind"] == "openai"
    for j in RunDir(run).stage("judge").rows():
        assert j["provenance"]["served_by"]["kind"] == "openai"

    assert main(["publish", str(run)]) == 0
    card = (run / "publish" / "README.md").read_text()
    assert "Not model output" not in card and "not a model" not in card
    assert "/models/qwen2.5-7b" in card and "owned" not in card.split("## Provenance")[0]
    env = json.loads((run / "environment.json").read_text())
    assert env["served_by"]["kind"] == "openai"
    assert env["served_by"]["models"]["standin-model"]["root"] == "/models/qwen2.5-7b"
    for stage in ("responses", "judge"):
        meta = RunDir(run).stage(stage).meta
        assert meta is not None and meta.environment["served_by"]["kind"] == "openai"


def test_the_identity_is_part_of_every_request_key(tmp_path):
    from pipeline.run.cache import RequestCache

    with StandinServer() as s:
        cfg = write_config(tmp_path, s, input={"limit": 2})
        assert main(["run", str(cfg), "--no-progress", "--until", "responses"]) == 0
    run = tmp_path / "outputs" / "t"
    with RequestCache(run / "cache.sqlite", readonly=True) as cache:
        backends = cache.backends()
    assert len(backends) == 1
    ((_, identity),) = backends.items()
    assert identity["kind"] == "stand-in" and identity["model_output"] is False
    for c in RunDir(run).stage("responses").rows():
        assert c["provenance"]["served_by"]["kind"] == "stand-in"
