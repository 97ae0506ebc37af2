"""End to end on the sample input against the stand-in server: ingest, rubrics (both
sources), responses (all three strategies), invalidation, status and secrets."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import pytest
from conftest import write_config
from standin_server import StandinServer

from pipeline.cli import main
from pipeline.config import load_config
from pipeline.core.errors import BackendError, InputError, StageError
from pipeline.orchestration.orchestrate import run_pipeline
from pipeline.run import RunDir

N_EXAMPLES = 12


def _run(path: Path, **kw):
    return run_pipeline(load_config(path, kw.pop("overrides", None)), progress=False, **kw)


def _rows(run_dir: Path, stage: str) -> list[dict]:
    return list(RunDir(run_dir).stage(stage).rows())


@pytest.mark.parametrize("source", ["given", "generated"])
def test_end_to_end(tmp_path, server, source):
    cfg_path = write_config(tmp_path, server, rubrics={"source": source})
    stats = _run(cfg_path)
    run_dir = tmp_path / "outputs" / "t"
    assert set(stats) == {"ingest", "rubrics", "responses", "judge", "pairs"}

    examples = _rows(run_dir, "ingest")
    assert len(examples) == N_EXAMPLES
    assert Counter(e["category"] for e in examples) == {
        "Art_and_Entertainment": 4,
        "Lifestyle_and_Personal_Development": 4,
        "Society_and_Culture": 4,
    }

    rubrics = _rows(run_dir, "rubrics")
    assert len(rubrics) == N_EXAMPLES
    for r in rubrics:
        assert r["source"] == source
        assert 2 <= len(r["items"]) <= 6
        assert all(it["item_id"].startswith("a") and it["aspect"] for it in r["items"])
        if source == "generated":
            prov = r["provenance"]
            assert prov["template"] == "rubric_generate"
            assert len(prov["template_hash"]) == 64
            assert prov["model"] == "standin-model"
            assert prov["usage"]["completion_tokens"] > 0

    cands = _rows(run_dir, "responses")
    n = 2
    by_strategy = Counter(c["strategy"] for c in cands)
    # chosen, avoid_all and violate_one: n per example; other_user: n per example with a donor
    assert by_strategy["chosen"] == N_EXAMPLES * n
    assert by_strategy["avoid_all"] == N_EXAMPLES * n
    assert by_strategy["violate_one"] == N_EXAMPLES * n
    assert by_strategy["other_user"] == N_EXAMPLES * n
    assert len({c["candidate_id"] for c in cands}) == len(cands)
    rub_by_ex = {r["example_id"]: r for r in rubrics}
    for c in cands:
        items = [it["item_id"] for it in rub_by_ex[c["example_id"]]["items"]]
        prov = c["provenance"]
        assert prov["template"] == f"response_{c['strategy']}"
        assert len(prov["template_hash"]) == 64
        assert prov["model"] == "standin-model"
        assert prov["sampling"] == {"temperature": 0.8, "top_p": 0.95, "max_tokens": 400}
        assert isinstance(prov["seed"], int)
        assert prov["usage"]["prompt_tokens"] > 0
        assert c["finish_reason"] in ("stop", "length")
        assert c["text"].strip()
        assert c["rubric_version"] == rub_by_ex[c["example_id"]]["rubric_version"]
        if c["strategy"] == "chosen":
            assert c["side"] == "chosen" and c["honours"] == items and c["violates"] == []
        elif c["strategy"] == "avoid_all":
            assert c["side"] == "rejected" and c["violates"] == items and c["honours"] == []
        elif c["strategy"] == "violate_one":
            assert c["violates"] == [c["target_item"]]
            assert sorted(c["honours"] + c["violates"]) == sorted(items)
        else:
            donor = c["other_user"]
            assert donor["user_id"] != c["user_id"]
            assert donor["example_id"] != c["example_id"]
    # the word cap reaches the prompt; the stand-in honours it, so answers stay under it
    assert max(c["word_count"] for c in cands) <= 100
    # the two violate_one samples of an example target different items
    targets = Counter((c["example_id"], c["target_item"]) for c in cands if "target_item" in c)
    assert max(targets.values()) == 1

    # a second run is served from the finished stages: no request at all
    before = server.request_count
    _run(cfg_path)
    assert server.request_count == before


def test_changing_responses_setting_redoes_responses_only(tmp_path, server, capsys):
    cfg_path = write_config(tmp_path, server, rubrics={"source": "generated"})
    _run(cfg_path, until="responses")
    rd = RunDir(tmp_path / "outputs" / "t")
    rubric_marker = (rd.stage("rubrics").path / "_DONE.json").read_text()
    old = {c["candidate_id"] for c in rd.stage("responses").rows()}
    sent = server.request_count

    messages: list[str] = []
    stats = run_pipeline(
        load_config(cfg_path, ["responses.word_cap=60"]),
        until="responses",
        progress=False,
        echo=messages.append,
    )
    assert "rubrics" not in stats and "ingest" not in stats
    assert "responses" in stats
    assert (rd.stage("rubrics").path / "_DONE.json").read_text() == rubric_marker
    assert any("[responses] re-doing" in m and "word_cap" in m for m in messages)
    # rubric requests were not sent again; every response prompt changed, so all were sent
    new_bodies = [r["body"] for r in server.requests[sent:]]
    assert not any(b.get("response_format") for b in new_bodies)
    assert len(new_bodies) == len(
        {c["provenance"]["request_key"] for c in rd.stage("responses").rows()}
    )
    assert {c["candidate_id"] for c in rd.stage("responses").rows()} == old  # ids: same inputs


def test_changing_rubric_setting_redoes_downstream(tmp_path, server):
    cfg_path = write_config(tmp_path, server)
    _run(cfg_path)
    messages: list[str] = []
    stats = run_pipeline(
        load_config(cfg_path, ["rubrics.merge_threshold=50"]), progress=False, echo=messages.append
    )
    assert set(stats) == {"rubrics", "responses", "judge", "pairs"}
    assert any("[responses] re-doing: stage 'rubrics' was re-done" in m for m in messages)


def test_until_and_only(tmp_path, server, capsys):
    cfg_path = write_config(tmp_path, server)
    stats = _run(cfg_path, until="rubrics")
    assert set(stats) == {"ingest", "rubrics"}
    assert server.request_count == 0
    assert main(["status", str(tmp_path / "outputs" / "t")]) == 0
    out = capsys.readouterr().out
    assert "rubrics      done (12 examples)" in out
    assert "responses    not started" in out
    stats = _run(cfg_path, only="responses")
    assert set(stats) == {"responses"}


def test_only_needs_upstream(tmp_path, server):
    cfg_path = write_config(tmp_path, server)
    with pytest.raises(StageError, match="--until ingest"):
        _run(cfg_path, only="rubrics")


def test_unknown_stage_suggests(tmp_path, server):
    cfg_path = write_config(tmp_path, server)
    wanted = "--until: unknown stage 'response'. Did you mean 'responses'"
    with pytest.raises(Exception, match=re.escape(wanted)):
        _run(cfg_path, until="response")


def test_bad_input_writes_nothing(tmp_path, server):
    bad = tmp_path / "bad.jsonl"
    good = Path(__file__).resolve().parent.parent / "examples" / "sample_lamp.jsonl"
    lines = good.read_text().splitlines()
    bad.write_text("\n".join([*lines[:3], '{"id": "x", "question": 5, "profile": []}']) + "\n")
    cfg_path = write_config(tmp_path, server, input={"path": str(bad)})
    with pytest.raises(InputError) as ei:
        _run(cfg_path)
    assert ei.value.line == 4 and ei.value.field == "question"
    assert not (tmp_path / "outputs" / "t" / "ingest").exists()
    assert main(["run", str(cfg_path), "--no-progress"]) == 1


def test_server_down_is_a_clear_error(tmp_path):
    cfg_path = write_config(tmp_path, None)  # port 9: nothing listens
    with pytest.raises(BackendError, match="cannot reach"):
        _run(cfg_path)


def test_a_fully_cached_stage_needs_no_server(tmp_path):
    with StandinServer() as srv:
        cfg_path = write_config(tmp_path, srv)
        _run(cfg_path, until="judge")
    # the server is gone; the answers are in the run's cache
    messages: list[str] = []
    stats = run_pipeline(
        load_config(cfg_path), redo="responses", progress=False, echo=messages.append
    )
    assert stats["judge"]["llm"]["sent"] == 0 and stats["judge"]["llm"]["cached"] > 0
    assert any(m.startswith("warning: cannot reach") for m in messages)
    # a setting that needs new answers stops at its first uncached request
    with pytest.raises(BackendError, match="cannot reach"):
        _run(cfg_path, overrides=["responses.word_cap=60"], until="responses")


def test_failed_requests_leave_stage_partial_then_resume(tmp_path, server):
    cfg_path = write_config(
        tmp_path,
        server,
        backend={"max_attempts": 1, "max_concurrency": 1},
        responses={"strategies": ["avoid_all"]},
    )
    _run(cfg_path, until="rubrics")
    server.inject("400", count=1)
    with pytest.raises(StageError, match="will be retried"):
        _run(cfg_path, until="responses")
    rd = RunDir(tmp_path / "outputs" / "t")
    state, done, expected = rd.stage("responses").status()
    assert (state, done, expected) == ("partial", N_EXAMPLES - 1, N_EXAMPLES)
    sent = server.request_count
    stats = _run(cfg_path, until="responses")
    assert stats["responses"]["resumed_examples"] == N_EXAMPLES - 1
    assert server.request_count - sent == 1  # only the failed request goes out again
    assert rd.stage("responses").status()[0] == "done"


def test_replay_backend_runs_offline_and_reports_misses(tmp_path, server):
    cfg_path = write_config(tmp_path, server, rubrics={"source": "generated"})
    _run(cfg_path)
    cache = tmp_path / "outputs" / "t" / "cache.sqlite"
    # a fresh run answered from the recorded cache, with no server at all
    cfg2 = load_config(
        cfg_path,
        [
            "run.name=replayed",
            "backend.name=replay",
            f"backend.replay.cache={cache}",
            "backend.openai.base_url=http://127.0.0.1:9/v1",
        ],
    )
    sent = server.request_count
    run_pipeline(cfg2, progress=False)
    assert server.request_count == sent
    a = sorted(
        (c["candidate_id"], c["text"]) for c in _rows(tmp_path / "outputs" / "t", "responses")
    )
    b = sorted(
        (c["candidate_id"], c["text"])
        for c in _rows(tmp_path / "outputs" / "replayed", "responses")
    )
    assert a == b
    # a setting that changes the prompts misses the cache: a clear error with the count
    cfg3 = load_config(
        cfg_path,
        [
            "run.name=replay-miss",
            "backend.name=replay",
            f"backend.replay.cache={cache}",
            "responses.word_cap=50",
        ],
    )
    with pytest.raises(BackendError, match=r"replay: \d+ of \d+ requests of stage 'responses'"):
        run_pipeline(cfg3, progress=False)


def test_secrets_never_reach_run_files(tmp_path, server, monkeypatch, capsys):
    secret = "sk-test-SECRET-4242"
    monkeypatch.setenv("OPENAI_API_KEY", secret)
    cfg_path = write_config(tmp_path, server, rubrics={"source": "generated"})
    assert main(["run", str(cfg_path), "--no-progress"]) == 0
    # the key did reach the server (it is used), but no file of the run holds it
    run_dir = tmp_path / "outputs" / "t"
    for f in run_dir.rglob("*"):
        if f.is_file():
            assert secret.encode() not in f.read_bytes(), f
    captured = capsys.readouterr()
    assert secret not in captured.out + captured.err
    run_yaml = (run_dir / "run.yaml").read_text()
    assert "api_key_env: OPENAI_API_KEY" in run_yaml
    env = json.loads((run_dir / "environment.json").read_text())
    assert env["openai"]


def test_a_lone_surrogate_in_a_model_answer_flows_through(tmp_path):
    """A server can send an escaped lone surrogate inside an answer: it is not Unicode, so
    it arrives as U+FFFD, and the answer is stored, hashed and judged like any other."""

    def odd(body: dict, i: int) -> str | None:
        if body.get("response_format"):
            return None  # the stand-in's own verdicts
        return "Tailored advice \ud800 with a stray surrogate. Start small and keep at it."

    with StandinServer(responder=odd) as srv:
        cfg_path = write_config(tmp_path, srv, responses={"n": 1, "strategies": ["avoid_all"]})
        stats = _run(cfg_path)
    assert stats["judge"]["examples"] == N_EXAMPLES
    texts = [c["text"] for c in _rows(tmp_path / "outputs" / "t", "responses")]
    assert texts and all("advice \ufffd with" in t for t in texts)


def test_each_stage_sizes_its_own_shards(tmp_path, server, capsys):
    sizes = {"ingest": 5, "rubrics": 4, "responses": 3, "judge": 2, "pairs": 7}
    sections = {"input": "ingest", "rubrics": "rubrics", "judge": "judge", "pairs": "pairs"}
    cfg_path = write_config(
        tmp_path,
        server,
        **{sec: {"chunk_size": sizes[st]} for sec, st in sections.items()},
        responses={"n": 1, "strategies": ["avoid_all"], "chunk_size": sizes["responses"]},
    )
    stats = _run(cfg_path)
    rd = RunDir(tmp_path / "outputs" / "t")
    kept = stats["pairs"]["kept"]
    for name, size in sizes.items():
        sd = rd.stage(name)
        examples_in: dict[Path, set[str]] = {sd.data_path(n): set() for n in sd.shard_ids()}
        for path, _, row in sd.numbered_rows():
            examples_in[path].add(row["example_id"])
        per_shard = [len(examples_in[sd.data_path(n)]) for n in sd.shard_ids()]
        n = kept if name == "pairs" else N_EXAMPLES
        # full shards of the stage's own size, the remainder last (pairs: then the
        # shards that carry only its rejects)
        full = [size] * (n // size) + ([n % size] if n % size else [])
        assert per_shard[: len(full)] == full, name
        assert not any(per_shard[len(full) :]), name
    # a stage's shard size is its own setting: changing the judge's re-does the judge
    # (from the cache) and the pairs after it, nothing before
    capsys.readouterr()
    assert main(["run", str(cfg_path), "--no-progress", "--set", "judge.chunk_size=3"]) == 0
    err = capsys.readouterr().err
    assert "[judge] re-doing: judge.chunk_size: 2 -> 3" in err
    assert "[responses] done, nothing to do" in err


# ---- a given rubric is the input's ---------------------------------------------------------


def test_every_example_with_a_given_rubric_is_kept_as_the_input_has_it(tmp_path, server):
    """An example whose LaMP-QA rubric_aspects hold one aspect, or two near-duplicates, was
    dropped by the checks meant for generated rubrics (min_items, merging): the regenerated
    subsets came out smaller than the input. Given rubrics are kept as they are; merging them
    is asked for with rubrics.merge_given."""
    rows = [json.loads(x) for x in (Path(__file__).parent.parent / "examples" /
                                    "sample_lamp.jsonl").read_text().splitlines()[:3]]  # fmt: skip
    one = {"aspect": "Mentions a cheap way to practise", "evidence": "e", "reason": "r"}
    twin = {"aspect": "Mentions a cheap way to practise daily", "evidence": "e", "reason": "r"}
    rows[0]["rubric_aspects"] = [one]
    rows[1]["rubric_aspects"] = [one, twin]
    data = tmp_path / "input.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = write_config(tmp_path, server, input={"path": str(data)})
    assert main(["run", str(cfg), "--until", "rubrics", "--no-progress"]) == 0
    sd = RunDir(tmp_path / "outputs" / "t").stage("rubrics")
    got = {r["example_id"]: len(r["items"]) for r in sd.rows()}
    assert len(got) == 3 and not list(sd.rejects())
    counts = sorted(got.values())
    assert counts[0] == 1 and 2 in counts  # the one-aspect rubric, the near-duplicate pair

    assert main(["run", str(cfg), "--until", "rubrics", "--no-progress",
                 "--set", "rubrics.merge_given=true"]) == 0  # fmt: skip
    merged = sorted(len(r["items"]) for r in sd.rows())
    assert merged.count(1) == 2 and len(merged) == 3  # the twins merged, still kept
