"""The ray backend: Ray Data's HTTP processor against the stand-in server on a local Ray,
and the vLLM engine processor's construction against a fake ``ray.data.llm``.

Tests that need Ray share one local Ray (2 CPUs, loopback only, no dashboard) and are
skipped when ``ray`` is not installed, unless ``CI`` is set: there they must run.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import types
from collections import Counter
from pathlib import Path

import pytest
from conftest import write_config
from standin_server import StandinServer

from pipeline.backends.factory import make_backend
from pipeline.backends.ray_backend import RayBackend, init_local_ray, vllm_rows
from pipeline.config import BackendSection, load_config
from pipeline.core.errors import BackendError
from pipeline.engine.llm import Answer, Failure, LLMRunner
from pipeline.orchestration.orchestrate import run_pipeline
from pipeline.run import RunDir
from pipeline.run.cache import RequestCache
from pipeline.types.chat import ChatRequest, ChatResult, RequestFailure

pytestmark = pytest.mark.ray

try:
    HAVE_RAY = importlib.util.find_spec("ray") is not None  # without importing it
except (ImportError, ValueError):  # ValueError: sys.modules["ray"] is None
    HAVE_RAY = False
needs_ray = pytest.mark.skipif(
    not HAVE_RAY and not os.environ.get("CI"),
    reason="ray is not installed (pip install 'personalized-rewardbench[ray]'); CI runs these",
)
RAY_SETTINGS = {"num_cpus": 2, "batch_size": 8, "replicas": 2}
SCHEMA = {
    "type": "object",
    "properties": {"score": {"type": "integer", "minimum": 1, "maximum": 5}},
    "required": ["score"],
}


def _ray_children(pid: int) -> list[str]:
    """Ray processes whose parent is ``pid`` (gcs_server, raylet, monitors...)."""
    out = subprocess.run(["ps", "-eo", "ppid=,args="], capture_output=True, text=True).stdout
    return [
        line.strip()
        for line in out.splitlines()
        if line.split(None, 1)[0] == str(pid) and "ray" in line.lower()
    ]


def _session_pids(sid: int) -> list[int]:
    """Live processes in session ``sid`` (a subprocess started with start_new_session)."""
    out = subprocess.run(["ps", "-eo", "pid=,sid=,stat="], capture_output=True, text=True)
    return [
        int(pid)
        for pid, s, stat in (line.split() for line in out.stdout.splitlines())
        if int(s) == sid and not stat.startswith("Z")
    ]


def _wait_gone(check, timeout: float = 30.0) -> list:
    deadline = time.monotonic() + timeout
    left = check()
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = check()
    return left


@pytest.fixture(scope="module")
def local_ray():
    """One local Ray for the module's tests; shut down and checked gone at the end."""
    started = init_local_ray(num_cpus=2)
    import ray

    yield ray
    if started:
        ray.shutdown()
        left = _wait_gone(lambda: _ray_children(os.getpid()))
        assert not left, f"Ray processes outlived ray.shutdown(): {left}"


def _request(i: int, **kw) -> ChatRequest:
    return ChatRequest(messages=(("user", f"question {i}"),), model="standin-model", **kw)


# -- (a) same output as the openai backend ----------------------------------------------------
@needs_ray
def test_same_rows_as_openai_backend(tmp_path, server, local_ray):
    rows = {}
    sent = {}
    for name in ("openai", "ray"):
        before = server.request_count
        (tmp_path / name).mkdir()
        cfg_path = write_config(
            tmp_path / name,
            server,
            backend={"name": name, "ray": RAY_SETTINGS},
            rubrics={"source": "generated"},  # JSON-schema requests go through Ray too
        )
        run_pipeline(load_config(cfg_path), until="responses", progress=False)
        run_dir = RunDir(tmp_path / name / "outputs" / "t")
        rows[name] = {s: list(run_dir.stage(s).rows()) for s in ("rubrics", "responses")}
        sent[name] = server.request_count - before

    assert sent["ray"] == sent["openai"] > 0, "each run sends every request once"
    cands = {
        k: sorted((c["candidate_id"], c["text"]) for c in v["responses"]) for k, v in rows.items()
    }
    assert len(cands["ray"]) == 12 * 4 * 2  # examples x (chosen + 3 strategies) x n
    assert cands["ray"] == cands["openai"]
    items = {
        k: sorted((r["example_id"], json.dumps(r["items"], sort_keys=True)) for r in v["rubrics"])
        for k, v in rows.items()
    }
    assert items["ray"] == items["openai"]


# -- faults: each request fails or succeeds on its own ----------------------------------------
@needs_ray
def test_faults_are_per_request_with_reasons(server, local_ray, tmp_path):
    cfg = BackendSection(
        name="ray",
        base_url=server.base_url,
        max_attempts=3,
        backoff_initial_s=0.01,
        timeout_s=10,
        ray=RAY_SETTINGS,
    )
    requests = [
        _request(i, seed=5 + i % 2, n=1 + i % 2, json_schema=SCHEMA if i % 3 == 0 else None)
        for i in range(24)
    ]

    def only(i):
        return lambda body: body["messages"][0]["content"] == f"question {i}"

    server.inject("429", 2, match=only(1))  # recovers on the third attempt
    server.inject("500", 3, match=only(2))  # fails all three: transient
    server.inject("400", 1, match=only(4))  # the request's fault: not retried
    server.inject("malformed", 1, match=only(5))  # unreadable body: retried, recovers
    server.inject("503", 1, match=only(7))  # recovers on the second attempt

    async def go():
        backend = RayBackend(cfg)
        try:
            return [item async for item in backend.run(requests)]
        finally:
            await backend.aclose()

    results = asyncio.run(go())
    assert local_ray.is_initialized(), "a backend must not shut down a Ray it did not start"
    assert sorted(i for i, _ in results) == list(range(24))
    out = dict(results)
    failed = {i for i, r in out.items() if isinstance(r, RequestFailure)}
    assert failed == {2, 4}
    assert out[2].transient and out[2].attempts == 3 and out[2].reason.startswith("HTTP 500")
    assert not out[4].transient and out[4].attempts == 1 and out[4].reason.startswith("HTTP 400")
    for i, r in out.items():
        if i not in failed:
            assert isinstance(r, ChatResult) and len(r.choices) == requests[i].n
            assert r.prompt_tokens > 0 and r.completion_tokens > 0
    assert json.loads(out[3].choices[0].text)["score"] in range(1, 6)

    # the server saw exactly the openai backend's body (ints stay ints, no null keys)
    bodies = {}
    for rec in server.requests:
        bodies.setdefault(rec["body"]["messages"][0]["content"], rec["body"])
    for i, req in enumerate(requests):
        assert bodies[f"question {i}"] == req.openai_body()
    attempts = Counter(rec["body"]["messages"][0]["content"] for rec in server.requests)
    assert attempts["question 1"] == 3 and attempts["question 2"] == 3
    assert attempts["question 4"] == 1 and attempts["question 7"] == 2


# -- (b) SIGKILL mid-stage, then resume --------------------------------------------------------
N_EXAMPLES = 60  # x (chosen + avoid_all) x n=1 = 120 requests, 15 batches of 8


def _synthetic_input(path: Path, n: int) -> Path:
    """LaMP-style rows generated here (synthetic, not LaMP-QA data)."""
    with open(path, "w") as fh:
        for i in range(n):
            fh.write(
                json.dumps(
                    {
                        "_note": "synthetic test data generated by tests/test_ray_backend.py",
                        "id": f"syn-{i:03d}",
                        "question": f"How do I start learning the cello, case {i}?",
                        "category": "Art_and_Entertainment",
                        "profile": [
                            {"id": f"p{i}-{j}", "text": f"Post {j} of {i}."} for j in range(3)
                        ],
                        "narrative": "I have twenty minutes a day.",
                        "rubric_aspects": [
                            {"aspect": a, "evidence": "", "reason": ""}
                            for a in ("Fits twenty-minute sessions", "Suggests a cheap rental")
                        ],
                    }
                )
                + "\n"
            )
    return path


def _prompt_key(body: dict) -> str:
    return json.dumps([body["messages"], body.get("seed"), body.get("n")], sort_keys=True)


def _cached(cache: Path) -> list[tuple[str, str]]:
    """(key, prompt key) of every cached answer of the responses stage."""
    try:
        db = sqlite3.connect(f"file:{cache}?mode=ro", uri=True, timeout=1)
        try:
            rows = db.execute("SELECT key, request FROM responses WHERE stage='responses'")
            return [(k, _prompt_key(json.loads(r))) for k, r in rows.fetchall()]
        finally:
            db.close()
    except sqlite3.OperationalError:
        return []


def _kill_session(proc: subprocess.Popen) -> None:
    """SIGKILL the run's process group, then whatever of its Ray outlived it (Ray's workers
    put themselves in their own process groups, but stay in the run's session)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()

    def survivors():
        pids = _session_pids(proc.pid)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return pids

    assert not _wait_gone(survivors), "processes of the killed run survived"


@needs_ray
@pytest.mark.slow
def test_sigkill_then_resume_repeats_no_finished_request(tmp_path, server):
    cfg_path = write_config(
        tmp_path,
        server,
        input={"path": str(_synthetic_input(tmp_path / "syn.jsonl", N_EXAMPLES))},
        backend={"name": "ray", "ray": {"num_cpus": 2, "batch_size": 8, "replicas": 1}},
        rubrics={"source": "given"},
        responses={"n": 1, "strategies": ["avoid_all"]},
    )
    run_pipeline(load_config(cfg_path), until="rubrics", progress=False)  # no LLM calls
    total = N_EXAMPLES * 2
    server.latency_ms = 300  # slow enough for the kill to land mid-stage

    cmd = [sys.executable, "-m", "pipeline.cli", "run", str(cfg_path), "--no-progress"]
    cmd += ["--until", "responses"]
    cache = tmp_path / "outputs" / "t" / "cache.sqlite"
    proc = subprocess.Popen(
        cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True
    )
    deadline = time.monotonic() + 180
    try:
        while len(_cached(cache)) < 16:  # two batches: answers land while the run goes on
            assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
            assert time.monotonic() < deadline, "the run cached nothing"
            time.sleep(0.05)
    finally:
        _kill_session(proc)
    proc.stderr.close()
    done_before = {p for _, p in _cached(cache)}
    assert 16 <= len(done_before) < total, "the kill must land in the middle of the stage"

    sent_before = server.request_count
    server.latency_ms = 0
    proc = subprocess.Popen(
        cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True
    )
    try:
        _, err = proc.communicate(timeout=240)
        # a run that ends well shuts down the Ray it started (aclose): nothing outlives it
        # (60 s: a busy machine reaps slowly)
        left = _wait_gone(lambda: _session_pids(proc.pid), timeout=60)
    finally:
        _kill_session(proc)
    assert proc.returncode == 0, err.decode()[-3000:]
    assert not left, f"processes outlived the finished run: {left}"

    resent = [
        rec["body"]
        for rec in server.requests[sent_before:]
        if _prompt_key(rec["body"]) in done_before
    ]
    assert resent == [], f"{len(resent)} finished requests were sent again"
    keys = [k for k, _ in _cached(cache)]
    assert len(keys) == len(set(keys)) == total
    resumed = list(RunDir(tmp_path / "outputs" / "t").stage("responses").rows())
    ids = Counter(r["candidate_id"] for r in resumed)
    assert len(resumed) == total and max(ids.values()) == 1

    # an uninterrupted run with the openai backend gives the same ids and texts
    ref = load_config(cfg_path, ["run.name=reference", "backend.name=openai"])
    run_pipeline(ref, until="responses", progress=False)
    ref_rows = RunDir(tmp_path / "outputs" / "reference").stage("responses").rows()
    assert sorted((r["candidate_id"], r["text"]) for r in resumed) == sorted(
        (r["candidate_id"], r["text"]) for r in ref_rows
    )


# -- (c) the vLLM engine processor, built against a fake ray.data.llm ------------------------
class _FakeRayLLM(types.ModuleType):
    """Records the processor config and plays vLLM: answers each row it is given."""

    def __init__(self) -> None:
        super().__init__("ray.data.llm")
        self.configs: list[dict] = []
        self.builds: list[dict] = []
        self.rows: list[dict] = []

    def HttpRequestProcessorConfig(self, **kw):
        raise AssertionError("engine vllm must not build the HTTP processor")

    def vLLMEngineProcessorConfig(self, **kw):
        self.configs.append(kw)
        return kw

    def build_processor(self, config, **kw):
        self.builds.append(kw)
        post = kw["postprocess"]

        def engine(row: dict) -> dict:
            self.rows.append(row)
            if row["messages"][0]["content"] == "question 2":
                # how Ray returns a row that failed with should_continue_on_error
                return {**row, "__inference_error__": "ValueError: prompt too long"}
            out = {**row, "generated_text": f"answer {row['index']}.{row['sample']}"}
            out.update(num_input_tokens=7, num_generated_tokens=3 * (row["sample"] + 1))
            return {**post(out), "__inference_error__": ""}

        return lambda ds: types.SimpleNamespace(iter_rows=lambda: map(engine, ds))


def _fake_ray(llm: _FakeRayLLM) -> types.ModuleType:
    ray = types.ModuleType("ray")
    ray.is_initialized = lambda: True  # the cluster's Ray, already connected
    ray.data = types.SimpleNamespace(
        from_items=lambda rows, **kw: list(rows),
        llm=llm,
        DataContext=types.SimpleNamespace(get_current=types.SimpleNamespace),
    )
    return ray


def test_vllm_engine_processor_config(monkeypatch):
    llm = _FakeRayLLM()
    monkeypatch.setitem(sys.modules, "ray", _fake_ray(llm))
    monkeypatch.setitem(sys.modules, "ray.data.llm", llm)
    cfg = BackendSection(
        name="ray",
        model="org/model-8b",
        vllm={
            "tensor_parallel_size": 2,
            "max_model_len": 8192,
            "enable_prefix_caching": True,
            "engine_args": {"enforce_eager": True},
        },
        ray={
            "address": "ray://head:10001",
            "engine": "vllm",
            "replicas": 3,
            "batch_size": 16,
            "num_gpus_per_replica": 2,
        },
    )
    backend = make_backend(cfg)
    assert isinstance(backend, RayBackend)
    requests = [
        _request(0, seed=11, n=2, json_schema=SCHEMA),
        _request(1, seed=12, max_tokens=3),
        _request(2, seed=13),
        _request(3),  # unseeded: its own dataset (Arrow would make the seed column floats)
    ]

    async def go():
        return [item async for item in backend.run(requests)]

    out = dict(asyncio.run(go()))

    config = llm.configs[0]
    assert config["model_source"] == "org/model-8b"
    assert config["engine_kwargs"] == {
        "tensor_parallel_size": 2,
        "gpu_memory_utilization": 0.9,
        "dtype": "auto",
        "enable_prefix_caching": True,
        "max_num_seqs": 512,  # backend.vllm.max_num_seqs, as for the in-process engine
        # the grammar engine, as for the in-process engine (backend.vllm)
        "structured_outputs_config": {"backend": "xgrammar"},
        "max_model_len": 8192,
        "enforce_eager": True,
    }
    assert config["concurrency"] == (3, 3)  # a fixed pool of 3 engines
    assert config["batch_size"] == 16
    assert config["should_continue_on_error"] is True
    assert len(llm.configs) == 2  # seeded and unseeded requests, one dataset each

    # per-row sampling params: one row per sample, the schema as vLLM structured outputs
    first = [r for r in llm.rows if r["index"] == 0 and r["messages"][0]["content"] == "question 0"]
    assert [r["sampling_params"]["seed"] for r in first] == [11, 12]
    for r in first:
        params = r["sampling_params"]
        assert params["n"] == 1 and params["max_tokens"] == 512
        assert json.loads(params["structured_outputs"]["json"]) == SCHEMA
    assert "structured_outputs" not in vllm_rows([requests[1]])[0]["sampling_params"]
    assert "seed" not in vllm_rows([requests[3]])[0]["sampling_params"]

    assert out[0].choices[0].text == "answer 0.0" and out[0].choices[1].text == "answer 0.1"
    assert out[0].prompt_tokens == 7 and out[0].completion_tokens == 3 + 6
    assert out[1].choices[0].finish_reason == "length"  # 3 tokens of max_tokens=3
    assert out[3].choices[0].finish_reason == "stop"
    assert isinstance(out[2], RequestFailure) and "prompt too long" in out[2].reason


@needs_ray
def test_vllm_config_is_valid_for_the_installed_ray(monkeypatch):
    """The keyword names the fake recorded are ones the real config class accepts."""
    real = importlib.import_module("ray.data.llm")
    llm = _FakeRayLLM()
    with monkeypatch.context() as m:
        m.setitem(sys.modules, "ray", _fake_ray(llm))
        m.setitem(sys.modules, "ray.data.llm", llm)
        cfg = BackendSection(
            name="ray",
            model="org/model-8b",
            vllm={"tensor_parallel_size": 2, "max_model_len": 8192},
            ray={"address": "auto", "engine": "vllm", "replicas": 3, "num_gpus_per_replica": 2},
        )
        RayBackend(cfg).build_processor()
    config = real.vLLMEngineProcessorConfig(**llm.configs[0])
    assert config.concurrency == (3, 3) and config.should_continue_on_error
    assert config.engine_kwargs["tensor_parallel_size"] == 2
    assert config.engine_kwargs["max_model_len"] == 8192


def test_vllm_engine_gpus_must_match_parallelism(monkeypatch):
    llm = _FakeRayLLM()
    monkeypatch.setitem(sys.modules, "ray", _fake_ray(llm))
    monkeypatch.setitem(sys.modules, "ray.data.llm", llm)
    cfg = BackendSection(
        name="ray",
        vllm={"tensor_parallel_size": 4},
        ray={"address": "auto", "engine": "vllm", "num_gpus_per_replica": 1},
    )
    with pytest.raises(BackendError, match="num_gpus_per_replica"):
        RayBackend(cfg)


def test_vllm_engine_without_vllm_names_the_gpu_extra(monkeypatch):
    llm = _FakeRayLLM()

    def no_vllm(config, **kw):
        raise ModuleNotFoundError("No module named 'transformers'")

    llm.build_processor = no_vllm
    monkeypatch.setitem(sys.modules, "ray", _fake_ray(llm))
    monkeypatch.setitem(sys.modules, "ray.data.llm", llm)
    cfg = BackendSection(name="ray", ray={"address": "auto", "engine": "vllm"})
    with pytest.raises(BackendError, match=r"personalized-rewardbench\[ray-gpu\]"):
        RayBackend(cfg).build_processor()


# -- (d) ray missing ---------------------------------------------------------------------------
def test_missing_ray_names_the_extra(monkeypatch, server):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    # the backend sets these before importing ray; monkeypatch restores them afterwards
    monkeypatch.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "0")
    cfg = BackendSection(name="ray", base_url=server.base_url)
    with pytest.raises(BackendError, match=r"pip install 'personalized-rewardbench\[ray\]'"):
        make_backend(cfg)


# -- the runner caches what the ray backend answers --------------------------------------------
@needs_ray
def test_runner_caches_ray_answers(tmp_path, server, local_ray):
    cfg = BackendSection(name="ray", base_url=server.base_url, ray=RAY_SETTINGS)
    requests = [_request(i, seed=1) for i in range(10)]

    async def go():
        backend = RayBackend(cfg)
        cache = RequestCache(tmp_path / "cache.sqlite")
        try:
            runner = LLMRunner(backend, cache, "test", progress=False)
            return [o async for _, o in runner.stream(requests)], runner.stats
        finally:
            await backend.aclose()
            cache.close()

    first, stats = asyncio.run(go())
    assert all(isinstance(o, Answer) and not o.cached for o in first) and stats.sent == 10
    sent = server.request_count
    again, stats = asyncio.run(go())
    assert all(isinstance(o, Answer) and o.cached for o in again) and stats.cached == 10
    assert server.request_count == sent, "cached requests must not reach Ray or the server"
    assert not any(isinstance(o, Failure) for o in first + again)


# -- threads: Ray Data's first-use imports, and a Ray that never answers ----------------------
_IMPORT_PROBE = r"""
import asyncio, builtins, sys, threading
sys.path.insert(0, "tests")
from standin_server import StandinServer
from pipeline.backends.ray_backend import RayBackend, init_local_ray
from pipeline.types.chat import ChatRequest
from pipeline.config import BackendSection

off_main = set()
real_import = builtins.__import__

def tracing_import(name, *args, **kw):
    if threading.current_thread() is threading.main_thread():
        return real_import(name, *args, **kw)
    before = set(sys.modules)
    try:
        return real_import(name, *args, **kw)
    finally:
        off_main.update(set(sys.modules) - before)

with StandinServer() as server:
    init_local_ray(num_cpus=2)
    builtins.__import__ = tracing_import
    cfg = BackendSection(name="ray", base_url=server.base_url,
                         ray={"num_cpus": 2, "batch_size": 4, "replicas": 2})
    async def go():
        backend = RayBackend(cfg)
        try:
            reqs = [ChatRequest(messages=(("user", f"q {i}"),), model="standin-model")
                    for i in range(8)]
            return [x async for x in backend.run(reqs)]
        finally:
            await backend.aclose()
    answers = asyncio.run(go())
    builtins.__import__ = real_import
print("ANSWERS", len(answers))
print("OFF_MAIN", sorted(m for m in off_main if m.startswith(("ray", "pyarrow"))))
"""


@needs_ray
def test_a_fresh_process_imports_no_ray_module_off_the_main_thread(tmp_path):
    """The CI deadlock's precondition: Ray Data's first-use imports (each taking the
    logging lock inside an import lock) ran in our row thread while other threads logged.
    In a fresh interpreter (nothing imported yet, as in a clean clone's first Ray test),
    every module a run needs must already be imported on the main thread."""
    script = tmp_path / "probe.py"
    script.write_text(_IMPORT_PROBE)
    root = Path(__file__).resolve().parent.parent
    proc = subprocess.run(
        [sys.executable, str(script)], cwd=root, capture_output=True, text=True, timeout=240
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = dict(ln.split(" ", 1) for ln in proc.stdout.splitlines() if " " in ln)
    assert lines["ANSWERS"] == "8"
    assert lines["OFF_MAIN"] == "[]", f"imported off the main thread: {lines['OFF_MAIN']}"


class _StuckRayLLM(_FakeRayLLM):
    """A processor whose dataset never yields a row: a Ray that hangs."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()

    def build_processor(self, config, **kw):
        def never(ds):
            def rows():
                self.release.wait(60)  # the test releases it; a bound in case it does not
                return iter(())

            return types.SimpleNamespace(iter_rows=rows)

        return never


def test_a_stuck_ray_fails_with_one_line_after_result_timeout(monkeypatch):
    llm = _StuckRayLLM()
    monkeypatch.setitem(sys.modules, "ray", _fake_ray(llm))
    monkeypatch.setitem(sys.modules, "ray.data.llm", llm)
    cfg = BackendSection(
        name="ray", ray={"address": "auto", "engine": "vllm", "result_timeout_s": 0.5}
    )
    backend = RayBackend(cfg)

    async def go():
        return [item async for item in backend.run([_request(0), _request(1)])]

    start = time.monotonic()
    try:
        with pytest.raises(BackendError) as err:
            asyncio.run(go())
    finally:
        llm.release.set()
    assert time.monotonic() - start < 60  # the stuck engine would never answer
    msg = str(err.value)
    assert "no answer came back for 0.5 s" in msg and "backend.ray.result_timeout_s" in msg
    assert "\n" not in msg


@needs_ray
def test_credentials_in_the_url_and_a_refused_key_through_ray(local_ray, monkeypatch):
    import base64

    basic = "Basic " + base64.b64encode(b"alice:pw-for-ray").decode()
    with StandinServer(authorization=basic) as s:
        url = s.base_url.replace("http://", "http://alice:pw-for-ray@") + "?api-key=k9"
        cfg = BackendSection(name="ray", base_url=url, ray=RAY_SETTINGS)

        async def go(backend):
            try:
                return [x async for x in backend.run([_request(i) for i in range(4)])]
            finally:
                await backend.aclose()

        out = asyncio.run(go(RayBackend(cfg)))
        assert all(isinstance(r, ChatResult) for _, r in out) and s.refused == 0
        assert [r["query"] for r in s.requests] == [{"api-key": "k9"}] * 4
    # a key refused on the chat requests (the probe's /models is open): one line, at once
    monkeypatch.setenv("OPENAI_API_KEY", "sk-not-accepted-0000000000")
    with StandinServer() as s:
        s.inject("401", 100)
        cfg = BackendSection(name="ray", base_url=s.base_url, ray=RAY_SETTINGS)
        with pytest.raises(BackendError, match=r"refused the API key in \$OPENAI_API_KEY"):
            asyncio.run(go(RayBackend(cfg)))
