"""The openai backend's batch mode (``backend.openai.batch``) against a loopback server
with OpenAI's Files and Batches endpoints (tests/provider_batches.py), the real ``openai``
SDK as the client: the sample config gives the rows a run without batch gives; a run killed
after it submitted a batch resumes by polling that batch, never submitting it again;
error-file and expired lines go into the next batch; files split at the limits."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import openai
import pytest
from provider_batches import BatchesServer
from standin_server import StandinServer

from pipeline.config import load_config
from pipeline.core.errors import StageError
from pipeline.orchestration.orchestrate import run_pipeline
from pipeline.run import RunDir

ROOT = Path(__file__).resolve().parent.parent
SAMPLE_CONFIG = ROOT / "configs" / "sample.yaml"
LLM_STAGES = ("responses", "judge")  # the sample config's rubrics are given


def sample_overrides(tmp_path: Path, server: StandinServer, name: str, batch: bool) -> list[str]:
    """configs/sample.yaml on 2 examples against ``server``; batch mode polls fast. The
    judge asks every combination at once in both (judge.stop: all, what a batch backend
    does by default), so the two give the same rows."""
    out = [
        "input.limit=2",
        f"run.output_dir={tmp_path / 'outputs'}",
        f"run.name={name}",
        f"backend.openai.base_url={server.base_url}",
        "backend.openai.timeout_s=120",
        "judge.stop=all",
    ]
    if batch:
        out += [
            "backend.openai.batch=true",
            "backend.openai.batch_poll_s=0.05",
            "backend.openai.batch_collect_s=0.2",
        ]
    return out


def run_sample(
    tmp_path: Path, server: StandinServer, name: str, batch: bool, *extra: str
) -> RunDir:
    cfg = load_config(SAMPLE_CONFIG, [*sample_overrides(tmp_path, server, name, batch), *extra])
    run_pipeline(cfg, progress=False, echo=lambda s: None)
    return RunDir(cfg.run_dir)


def _keyed(value):
    """A row without the address each server was asked at (two servers, two ports): an
    identity's ``asked`` is a note, not part of its id."""
    if isinstance(value, dict):
        return {k: _keyed(v) for k, v in value.items() if k != "asked"}
    if isinstance(value, list):
        return [_keyed(v) for v in value]
    return value


def stage_rows(rd: RunDir) -> dict[str, list[dict]]:
    return {
        name: sorted((_keyed(r) for r in rd.stage(name).rows()), key=json.dumps)
        for name in ("responses", "judge", "pairs")
    }


def served_by(rd: RunDir, stage: str) -> str:
    """The id of what answered a stage (the URL it was asked at is not part of it)."""
    from pipeline.backends.identity import identity_id

    return identity_id(rd.stage(stage).meta.environment["served_by"])


def all_lines(server: BatchesServer) -> list[tuple[str, str]]:
    """(batch id, custom_id) of every line of every batch created, in creation order."""
    return [(b, line["custom_id"]) for b in server.created_ids() for line in server.batch_lines(b)]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The sample config without batch, against the stand-in."""
    tmp = tmp_path_factory.mktemp("reference")
    with StandinServer() as server:
        rd = run_sample(tmp, server, "plain", batch=False)
        assert server.request_count > 0
    return rd


def test_sample_config_in_batch_mode_gives_the_same_rows(tmp_path, reference):
    with BatchesServer() as server:
        rd = run_sample(tmp_path, server, "batch", batch=True)
        assert server.request_count == 0, "batch mode sent chat requests one by one"
        lines = all_lines(server)
    assert server.creates >= 2  # responses, then judge (pointwise, then the pairwise follow-ups)
    ids = [cid for _, cid in lines]
    assert len(ids) == len(set(ids)), "a request went into two batches"
    assert server.lines_answered == len(ids)
    # the same server code answers both: the stand-in reports itself the same way
    for stage in LLM_STAGES:
        assert served_by(rd, stage) == served_by(reference, stage)
    assert stage_rows(rd) == stage_rows(reference)
    assert sum(1 for _ in rd.stage("pairs").rows()) == 2
    records = [json.loads(p.read_text()) for p in rd.openai_batches.glob("*.json")]
    assert sorted(r["batch_id"] for r in records) == sorted(server.created_ids())
    assert all(r["status"] == "completed" and r["delivered"] for r in records)
    # what was handed over is in the cache; the downloaded files are not kept twice
    assert not list(rd.openai_batches.glob("*.jsonl"))


def _wait(condition, what: str, proc: subprocess.Popen, timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if proc.poll() is not None:
            raise AssertionError(f"the run ended before {what}: {proc.stderr.read()[-2000:]}")
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def test_killed_after_submission_resumes_without_submitting_again(tmp_path, reference):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with BatchesServer() as server:
        server.hold()  # the first batch stays in progress until the kill is done
        args = sample_overrides(tmp_path, server, "killed", batch=True)
        cmd = [sys.executable, "-m", "pipeline.cli", "run", str(SAMPLE_CONFIG), "--no-progress"]
        for a in args:
            cmd += ["--set", a]
        proc = subprocess.Popen(
            cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )
        try:
            # polled twice: the batch's id was recorded before the first poll, and what
            # the first poll said (in_progress) before the second
            _wait(
                lambda: server.creates == 1 and sum(server.retrieves.values()) >= 2,
                "the first batch was polled",
                proc,
            )
        finally:
            proc.kill()
            proc.wait()
        first = server.created_ids()[0]
        rd = RunDir(tmp_path / "outputs" / "killed")
        records = [json.loads(p.read_text()) for p in rd.openai_batches.glob("*.json")]
        assert [r["batch_id"] for r in records] == [first]
        assert records[0]["custom_ids"] == [x["custom_id"] for x in server.batch_lines(first)]

        # prb status shows it in flight
        st = subprocess.run(
            [sys.executable, "-m", "pipeline.cli", "status", str(rd.path)],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert st.returncode == 0, st.stderr
        assert f"batch {first}: in_progress, 0 of {records[0]['requests']} answered" in st.stdout

        server.release()
        polls_before = server.retrieves[first]
        res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
        assert res.returncode == 0, res.stderr[-3000:]
        assert server.retrieves[first] > polls_before, "the recorded batch was not polled"
        lines = all_lines(server)
    ids = [cid for _, cid in lines]
    assert len(ids) == len(set(ids)), "a request was submitted in two batches"
    assert server.creates == len(set(server.created_ids())) == len({b for b, _ in lines})
    assert stage_rows(rd) == stage_rows(reference)


def test_error_file_lines_go_into_the_next_batch(tmp_path, reference):
    with BatchesServer() as server:
        server.inject("500", count=2, message="the server had an error processing your request")
        server.inject("429", count=1)
        rd = run_sample(tmp_path, server, "errors", batch=True)
        batches = server.created_ids()
        first_errors = server.files[server.batches[batches[0]]["error_file_id"]]["data"]
        failed = [json.loads(x)["custom_id"] for x in first_errors.decode().splitlines()]
        second = {x["custom_id"] for x in server.batch_lines(batches[1])}
    assert len(failed) == 3
    assert set(failed) <= second, "the error file's lines were not submitted again"
    stats = json.loads((rd.stage("responses").path / "stats.json").read_text())
    assert stats["llm"]["failed"] == 0
    assert stage_rows(rd) == stage_rows(reference)


def test_a_client_error_line_is_a_recorded_failure_not_resent(tmp_path):
    with BatchesServer() as server:
        server.inject("400", count=1, message="Invalid 'messages': too long")
        with pytest.raises(
            StageError, match=r"1 examples have failed requests \(\{'batch HTTP 400': 1\}\)"
        ):
            run_sample(tmp_path, server, "refused", True, "backend.max_attempts=3")
        bad = server.files[server.batches[server.created_ids()[0]]["error_file_id"]]["data"]
        key = json.loads(bad.decode().splitlines()[0])["custom_id"]
        resent = [b for b, cid in all_lines(server) if cid == key]
    assert len(resent) == 1, "a 400 line was submitted again"
    import sqlite3

    db = sqlite3.connect(tmp_path / "outputs" / "refused" / "cache.sqlite")
    reasons = [r for (r,) in db.execute("SELECT reason FROM errors WHERE key = ?", (key,))]
    db.close()
    assert len(reasons) == 1
    assert reasons[0].startswith("batch HTTP 400: the request failed in the batch (HTTP 400: ")
    assert "Invalid 'messages': too long" in reasons[0]


def test_an_expired_batch_keeps_its_answers_and_resubmits_the_rest(tmp_path, reference):
    with BatchesServer() as server:
        server.expire_next(4)
        rd = run_sample(tmp_path, server, "expired", batch=True)
        first, second = server.created_ids()[:2]
        assert server.batches[first]["status"] == "expired"
        done = [
            json.loads(x)["custom_id"]
            for x in server.files[server.batches[first]["output_file_id"]]["data"]
            .decode()
            .splitlines()
        ]
        sent_first = [x["custom_id"] for x in server.batch_lines(first)]
        sent_second = {x["custom_id"] for x in server.batch_lines(second)}
    assert len(done) == 4
    rest = set(sent_first) - set(done)
    assert rest and rest <= sent_second and not set(done) & sent_second
    assert stage_rows(rd) == stage_rows(reference)


def test_files_split_at_the_request_and_byte_limits(tmp_path, reference):
    # the server refuses a file over 3 requests, as OpenAI refuses one over 50,000
    with BatchesServer(max_requests=3, max_bytes=8_000) as server:
        rd = run_sample(
            tmp_path,
            server,
            "split",
            True,
            "backend.openai.batch_max_requests=3",
            "backend.openai.batch_max_bytes=8000",
        )
        sizes = [
            (
                len(server.batch_lines(b)),
                server.files[server.batches[b]["input_file_id"]]["obj"]["bytes"],
            )
            for b in server.created_ids()
        ]
        statuses = {server.batches[b]["status"] for b in server.created_ids()}
        ids = [cid for _, cid in all_lines(server)]
    assert statuses == {"completed"}
    assert all(n <= 3 and size <= 8_000 for n, size in sizes)
    # the responses stage alone asks 10 requests: at least 4 files of at most 3
    assert len(sizes) >= 4
    assert len(ids) == len(set(ids)), "a request went into two files"
    assert stage_rows(rd) == stage_rows(reference)


def test_a_failed_batch_is_one_line_naming_the_reason(tmp_path):
    with BatchesServer(max_requests=3) as server:
        args = sample_overrides(tmp_path, server, "failed", batch=True)
        cmd = [sys.executable, "-m", "pipeline.cli", "run", str(SAMPLE_CONFIG), "--no-progress"]
        for a in args:
            cmd += ["--set", a]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
        bid = server.created_ids()[0]
    assert res.returncode != 0
    assert "Traceback" not in res.stderr
    last = res.stderr.strip().splitlines()[-1]
    assert f"openai batch {bid} failed: The batch input file has more than 3 requests." in last


def test_a_batch_created_but_not_recorded_is_found_again(tmp_path):
    """A kill between batches.create and the record of its id: the next run finds the
    batch by its input file and polls it; nothing is created twice."""
    from pipeline.backends.openai.backend import OpenAIBackend
    from pipeline.backends.openai.batch import Ledger
    from pipeline.backends.openai.lines import request_line
    from pipeline.kinds.backend import BackendSection, RequestFeed
    from pipeline.types.chat import ChatRequest

    with BatchesServer() as server:
        cfg = BackendSection.model_validate(
            {
                "model": "standin-model",
                "openai": {
                    "base_url": server.base_url,
                    "batch": True,
                    "batch_poll_s": 0.05,
                    "batch_collect_s": 0.0,
                },
            }
        )
        reqs = [
            ChatRequest(
                messages=(("user", f"Say something about {i}."),),
                model="standin-model",
                max_tokens=20,
            )
            for i in range(3)
        ]
        data = "".join(json.dumps(request_line(r, r.openai_body())) + "\n" for r in reqs)
        client = openai.OpenAI(base_url=server.base_url, api_key="test")
        up = client.files.create(
            file=("x.jsonl", data.encode(), "application/jsonl"), purpose="batch"
        )
        made = client.batches.create(
            input_file_id=up.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        client.close()
        folder = tmp_path / "run" / "openai-batches"
        Ledger(folder).save(
            {
                "local": "0-killed",
                "created": time.time(),
                "state": "uploaded",
                "url": server.base_url,
                "requests": 3,
                "bytes": len(data),
                "input_file_id": up.id,
                "custom_ids": [r.key for r in reqs],
            }
        )

        async def go() -> dict:
            backend = OpenAIBackend.build(cfg, cache_path=tmp_path / "run" / "cache.sqlite")
            feed = RequestFeed()
            for i, r in enumerate(reqs):
                feed.put(i, r)
            out = {}
            async for token, res in backend.stream(feed):
                out[token] = res
                if len(out) == len(reqs):
                    feed.close()
            await backend.aclose()
            return out

        out = asyncio.run(go())
        assert server.creates == 1
        assert server.retrieves[made.id] >= 1
    assert sorted(out) == [0, 1, 2]
    assert all(res.choices[0].text for res in out.values())
    rec = json.loads((folder / "0-killed.json").read_text())
    assert rec["batch_id"] == made.id and rec["status"] == "completed"


PRICES = [
    "run.prices.input_usd_per_million=2.5",
    "run.prices.output_usd_per_million=10",
    "run.prices.batch_input_usd_per_million=1.25",
    "run.prices.batch_output_usd_per_million=5",
]


def _plan(tmp_path: Path, *sets: str) -> tuple[dict, str]:
    from pipeline.cli import main

    args = ["plan", str(SAMPLE_CONFIG), "--tokens-per-second", "100"]
    base = [
        "input.limit=2",
        f"run.output_dir={tmp_path / 'outputs'}",
        "backend.openai.base_url=http://127.0.0.1:9/v1",
        *PRICES,
        *sets,
    ]
    for s in base:
        args += ["--set", s]
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        assert main([*args, "--json"]) == 0
    data = json.loads(out.getvalue())
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        assert main(args) == 0
    return data, out.getvalue()


def test_plan_shows_the_batch_price_beside_the_standard_one(tmp_path):
    data, text = _plan(tmp_path)
    c, t = data["cost"], data["totals"]
    prompt, bound = t["prompt_tokens_bound"], t["output_tokens_bound"]
    assert c["usd_bound"] == pytest.approx((prompt * 2.5 + bound * 10) / 1e6)
    assert c["batch"]["usd_bound"] == pytest.approx((prompt * 1.25 + bound * 5) / 1e6)
    assert c["paid"] == "standard"
    standard_usd = t["budget_to_finish"]["usd"]
    assert f"cost: ${c['usd_bound']:,.2f} at most" in text
    assert (
        f"cost at batch rates: ${c['batch']['usd_bound']:,.2f} at most, at $1.25 / $5 per "
        "million prompt / output tokens (run.prices.batch_*): if sent as batches" in text
    )

    data, text = _plan(tmp_path, "backend.openai.batch=true")
    c = data["cost"]
    assert c["paid"] == "batch"
    assert "what this run pays (backend.openai.batch is on)" in text
    assert "batches are answered within 24 hours" in text
    # the budget a batch run finishes under is priced at the batch rates
    assert data["totals"]["budget_to_finish"]["usd"] == pytest.approx(standard_usd / 2, rel=1e-3)


def test_a_batch_run_is_budgeted_and_accounted_at_batch_rates(tmp_path):
    from pipeline.engine.budget import cost_usd, make_budget
    from pipeline.run.cache import RequestCache

    with BatchesServer() as server:
        rd = run_sample(tmp_path, server, "priced", True, *PRICES)
        cfg = load_config(
            SAMPLE_CONFIG,
            [*sample_overrides(tmp_path, server, "priced", True), *PRICES, "run.budget.usd=100"],
        )
    ledger = json.loads((rd.stage("responses").path / "stats.json").read_text())["ledger"]["run"]
    assert ledger["answers"] > 0
    batch = cost_usd(
        ledger["prompt_tokens"], ledger["completion_tokens"], cfg.run.prices.batch_rates()
    )
    assert ledger["usd"] == pytest.approx(batch)
    with RequestCache(rd.cache_path) as cache:
        budget = make_budget(cfg, cache, "x")
        assert budget is not None and budget.prices.input_usd_per_million == 1.25
        plain = load_config(SAMPLE_CONFIG, [*PRICES, "run.budget.usd=100"])
        budget = make_budget(plain, cache, "x")
        assert budget is not None and budget.prices.input_usd_per_million == 2.5


def test_one_batch_price_without_the_other_is_refused_at_load(tmp_path):
    from pipeline.core.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        load_config(SAMPLE_CONFIG, ["run.prices.batch_input_usd_per_million=1.25"])
    assert err.value.field == "run.prices.batch_output_usd_per_million"
    assert "give both run.prices.batch_input_usd_per_million" in str(err.value)


def test_a_server_without_a_batch_api_is_one_line_and_leaves_no_record(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with StandinServer() as server:  # chat completions only, as `vllm serve`
        cmd = [sys.executable, "-m", "pipeline.cli", "run", str(SAMPLE_CONFIG), "--no-progress"]
        for a in sample_overrides(tmp_path, server, "nobatch", batch=True):
            cmd += ["--set", a]
        res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
        assert server.request_count == 0
    assert res.returncode != 0 and "Traceback" not in res.stderr
    assert res.stderr.strip().splitlines()[-1] == (
        f"error: the server at {server.base_url} has no Batch API (the upload of a batch file "
        "got HTTP 404); set backend.openai.batch to false, or point backend.openai.base_url "
        "at a server that has one (OpenAI's)"
    )
    assert list((tmp_path / "outputs" / "nobatch" / "openai-batches").glob("*")) == []


def test_a_cancelled_batch_fails_its_unanswered_requests_for_the_next_run(tmp_path, reference):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with BatchesServer() as server:
        server.hold()
        cmd = [sys.executable, "-m", "pipeline.cli", "run", str(SAMPLE_CONFIG), "--no-progress"]
        for a in sample_overrides(tmp_path, server, "cancelled", batch=True):
            cmd += ["--set", a]
        proc = subprocess.Popen(
            cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )
        try:
            _wait(lambda: server.creates == 1 and sum(server.retrieves.values()) >= 1,
                  "the first batch was polled", proc)  # fmt: skip
            client = openai.OpenAI(base_url=server.base_url, api_key="test")
            cancelled = client.batches.cancel(server.created_ids()[0])
            client.close()
            assert cancelled.status == "cancelling"
            _, err = proc.communicate(timeout=600)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert proc.returncode != 0 and "Traceback" not in err
        assert err.strip().splitlines()[-1] == (
            "error: stage 'responses': 2 examples have failed requests ({'batch cancelled': "
            "10}); they are recorded in cache.sqlite and will be retried: run the same command "
            "again"
        )
        assert server.creates == 1  # a cancelled batch is not resubmitted in the same run
        server.release()
        res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
        assert res.returncode == 0, res.stderr[-2000:]
        rd = RunDir(tmp_path / "outputs" / "cancelled")
    assert stage_rows(rd) == stage_rows(reference)


def test_the_api_limit_of_50000_requests_a_file_holds_at_the_defaults(tmp_path):
    """The split at the real limit (the tests above use a small one): 60,000 requests make
    a file of 50,000 and one of 10,000, each line once, in order."""
    from pipeline.backends.openai.backend import OpenAIBackend
    from pipeline.kinds.backend import BackendSection
    from pipeline.types.chat import ChatRequest

    cfg = BackendSection.model_validate({"openai": {"batch": True}})
    assert cfg.openai.batch_max_requests == 50_000
    assert cfg.openai.batch_max_bytes == 200_000_000
    backend = OpenAIBackend.build(cfg, cache_path=tmp_path / "cache.sqlite")
    assert backend.window == 50_000
    runner = backend._batches()
    reqs = [ChatRequest(messages=(("user", f"q{i}"),), model="m") for i in range(60_000)]
    waiters = {r.key: [(i, r)] for i, r in enumerate(reqs)}
    files, too_big = runner._split(list(waiters), waiters)
    assert too_big == []
    assert [len(f) for f in files] == [50_000, 10_000]
    assert [k for f in files for k, _ in f] == [r.key for r in reqs]
    first = json.loads(files[0][0][1])
    assert first == {"custom_id": reqs[0].key, "method": "POST", "url": "/v1/chat/completions",
                     "body": reqs[0].openai_body()}  # fmt: skip
    asyncio.run(backend.aclose())


def test_killed_after_a_batch_is_stored_but_before_the_cache_holds_it(tmp_path, reference):
    """The narrowest window: the batch is final and its results are stored beside its
    record, then the process dies (pipeline/core/io.py's failpoints) before the runner commits
    them. The next run answers them from the stored file: no poll, no new batch."""
    import re

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with BatchesServer() as server:

        def cmd(name: str) -> list[str]:
            out = [sys.executable, "-m", "pipeline.cli", "run", str(SAMPLE_CONFIG), "--no-progress"]
            for a in sample_overrides(tmp_path, server, name, batch=True):
                out += ["--set", a]
            return out

        # where the first batch's record says "finished": the failpoint after that write
        log = tmp_path / "points.log"
        res = subprocess.run(cmd("counted"), env={**env, "PRB_CRASH_LOG": str(log)},
                             capture_output=True, text=True, timeout=600)  # fmt: skip
        assert res.returncode == 0, res.stderr[-2000:]
        labels = [line.split("\t", 1) for line in log.read_text().splitlines()]
        stored = next(i for i, (_, lab) in enumerate(labels) if lab.endswith(".output.jsonl"))
        local = re.search(r"openai-batches/(.+)\.output\.jsonl", labels[stored][1]).group(1)
        at = next(
            int(n) for n, lab in labels[stored:] if lab == f"after openai-batches/{local}.json"
        )

        creates = server.creates
        res = subprocess.run(cmd("crashed"), env={**env, "PRB_CRASH_AT": str(at)},
                             capture_output=True, text=True, timeout=600)  # fmt: skip
        assert res.returncode == 86, res.stderr[-2000:]
        assert server.creates == creates + 1
        rd = RunDir(tmp_path / "outputs" / "crashed")
        (record,) = [json.loads(p.read_text()) for p in rd.openai_batches.glob("*.json")]
        assert record["state"] == "finished" and not record.get("delivered")
        assert (rd.openai_batches / f"{record['local']}.output.jsonl").is_file()
        polls = server.retrieves[record["batch_id"]]

        res = subprocess.run(cmd("crashed"), env=env, capture_output=True, text=True, timeout=600)
        assert res.returncode == 0, res.stderr[-2000:]
        assert server.retrieves[record["batch_id"]] == polls, "the stored batch was polled"
        resumed = server.created_ids()[creates + 1 :]
        again = {x["custom_id"] for b in resumed for x in server.batch_lines(b)}
    assert not again & set(record["custom_ids"]), "a stored answer was paid for again"
    assert stage_rows(rd) == stage_rows(reference)


def test_the_key_reaches_every_batch_call_and_no_file_of_the_run(tmp_path, monkeypatch):
    key = "sk-test-batch-0123456789abcdef"
    monkeypatch.setenv("OPENAI_API_KEY", key)
    with BatchesServer(authorization=f"Bearer {key}") as server:
        rd = run_sample(tmp_path, server, "keyed", True)
        assert server.refused == 0 and server.creates >= 2
    assert sum(1 for _ in rd.stage("pairs").rows()) == 2
    for p in rd.path.rglob("*"):
        if p.is_file():
            assert key.encode() not in p.read_bytes(), p


class DatedBatchesServer(BatchesServer):
    """Answers as OpenAI does: a request for ``gpt-4o-mini`` is answered by the dated
    snapshot that served it, ``model: gpt-4o-mini-2024-07-18``."""

    async def _respond(self, body, fault):
        from aiohttp import web

        resp = await super()._respond(body, fault)
        if resp.status != 200:
            return resp
        data = json.loads(resp.body)
        data["model"] = f"{data['model']}-2024-07-18"
        return web.json_response(data)


def test_answers_from_a_dated_snapshot_of_the_model_are_taken(tmp_path, reference):
    with DatedBatchesServer() as server:
        rd = run_sample(tmp_path, server, "dated", batch=True)
        assert server.lines_answered > 0
    # every answer is taken, and recorded with the snapshot that served it
    models = {r["provenance"]["model"] for r in rd.stage("responses").rows()}
    assert models == {"Qwen/Qwen2.5-7B-Instruct-2024-07-18"}
    assert len(stage_rows(rd)["pairs"]) == 2


def test_same_model_takes_the_name_or_its_dated_snapshot_only():
    from pipeline.backends.openai.lines import same_model

    assert same_model("gpt-4o-mini", "gpt-4o-mini")
    assert same_model("gpt-4o-mini", "gpt-4o-mini-2024-07-18")
    assert not same_model("gpt-4o-mini", "gpt-4o-mini-tts")
    assert not same_model("gpt-4o-mini", "gpt-4o-mini-2024-07")
    assert not same_model("gpt-4o", "gpt-4o-mini-2024-07-18")
    assert not same_model("gpt-4o-mini", None)
