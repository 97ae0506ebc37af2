"""Every registered backend passes the conformance suite (tests/backend_conformance.py):
cache, identity, re-ask, resume, n samples, finish reasons, JSON-schema answers. openai
runs against the stand-in server, replay from a cache recorded there, batchfile from the
stand-in's answers kept as `prb batch import` keeps them, vllm and llamacpp
against the fake engines their own tests use, llamacpp also on the real engine (marked
llamacpp: CI runs it after building the extra) and ray on a local Ray (marked ray)."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any

import pytest
from backend_conformance import Conformance, Harness, run_stage
from test_llamacpp_backend import _skip as _skip_without_llama_cpp
from test_llamacpp_backend import fake_llama, gguf  # noqa: F401 - fixtures used by name
from test_ray_backend import RAY_SETTINGS, local_ray  # noqa: F401 - a fixture used by name
from test_vllm_backend import fake_vllm  # noqa: F401 - a fixture used by name

from pipeline.backends.batchfile import BatchFileBackend
from pipeline.backends.identity import identity_id
from pipeline.backends.llamacpp_backend import LlamaCppBackend
from pipeline.backends.openai.backend import OpenAIBackend
from pipeline.backends.ray_backend import RayBackend
from pipeline.backends.replay import ReplayBackend
from pipeline.backends.vllm_backend import VLLMBackend
from pipeline.core.errors import ConfigError
from pipeline.kinds.backend import BACKENDS, Backend, BackendRegistry, BackendSection
from pipeline.kinds.settings import LLAMACPP_DEFAULT_MODEL
from pipeline.run.cache import RequestCache

try:
    HAVE_RAY = importlib.util.find_spec("ray") is not None
except (ImportError, ValueError):
    HAVE_RAY = False
_skip_without_ray = pytest.mark.skipif(
    not HAVE_RAY and not os.environ.get("CI"), reason="ray is not installed; CI runs these"
)


def _server_section(
    server: Any, model: str, openai: dict[str, Any] | None = None, **kw: Any
) -> BackendSection:
    return BackendSection(
        model=model,
        max_attempts=3,
        backoff_initial_s=0.01,
        backoff_max_s=0.2,
        openai={
            "base_url": server.base_url,
            "max_concurrency": 4,
            "timeout_s": 10,
            **(openai or {}),
        },
        **kw,
    )


def _record_on_standin(server: Any):
    """Replay's recording: the suite's requests answered by the stand-in into a cache of
    their own, which the replay section then names."""

    def record(tmp: Path, cfg: BackendSection, jobs: list) -> BackendSection:
        live = _server_section(server, cfg.model, name="openai")
        recorded = tmp / "recorded" / "cache.sqlite"
        for requests, validate in jobs:
            run_stage(live, recorded, requests, validate)
        ident = OpenAIBackend.identify(live, [cfg.model])
        with RequestCache(recorded) as cache:
            cache.put_backend(identity_id(ident), ident)
        return BackendSection(name="replay", model=cfg.model, replay={"cache": str(recorded)})

    return record


def _record_batch_answers(server: Any):
    """The batchfile backend's answers: every answer the stand-in gives the suite's
    requests (re-asks and invalid first answers included), kept as `prb batch import`
    keeps them, in the state file beside the run's cache (tmp/run)."""

    def record(tmp: Path, cfg: BackendSection, jobs: list) -> BackendSection:
        import asyncio

        from pipeline.backends.batchstore import BatchState
        from pipeline.engine.llm import LLMRunner
        from pipeline.run import RunDir
        from pipeline.types.chat import ChatResult

        live = _server_section(server, cfg.model, name="openai")
        answers: list[tuple[str, ChatResult, str]] = []

        async def go(requests: list, validate: Any) -> None:
            backend = OpenAIBackend(live)
            ask = backend.complete

            async def complete(req: Any) -> Any:
                res = await ask(req)
                if isinstance(res, ChatResult):
                    answers.append((req.key, res, "recorded"))
                return res

            backend.complete = complete  # type: ignore[method-assign]
            with RequestCache(tmp / "recorded" / "cache.sqlite") as cache:
                runner = LLMRunner(backend, cache, "responses", progress=False, max_reasks=2)
                try:
                    async for _ in runner.stream(requests, validate):
                        pass
                finally:
                    await backend.aclose()

        for requests, validate in jobs:
            asyncio.run(go(requests, validate))
        with BatchState(RunDir(tmp / "run").batch_state, create=True) as state:
            state.store(answers, [])
        return cfg

    return record


def _harness(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> Harness:
    if kind == "openai":
        server = request.getfixturevalue("server")
        return Harness(OpenAIBackend, lambda t, m: _server_section(server, m, name="openai"))
    if kind == "openai-batch":  # the Batch API mode, against tests/provider_batches.py
        from provider_batches import BatchesServer

        server = BatchesServer().start()
        request.addfinalizer(server.stop)
        batch = {"batch": True, "batch_poll_s": 0.02, "batch_collect_s": 0.05}
        return Harness(OpenAIBackend, lambda t, m: _server_section(server, m, batch, name="openai"))
    if kind == "replay":
        server = request.getfixturevalue("server")
        return Harness(
            ReplayBackend,
            lambda t, m: BackendSection(name="replay", model=m),
            record=_record_on_standin(server),
        )
    if kind == "batchfile":
        server = request.getfixturevalue("server")
        return Harness(
            BatchFileBackend,
            lambda t, m: BackendSection(name="batchfile", model=m),
            record=_record_batch_answers(server),
        )
    if kind == "vllm":
        request.getfixturevalue("fake_vllm")
        return Harness(
            VLLMBackend, lambda t, m: BackendSection(name="vllm", model=m), json_schema=False
        )
    if kind == "llamacpp-fake":
        request.getfixturevalue("fake_llama")
        model = gguf(tmp_path)
        return Harness(
            LlamaCppBackend,
            lambda t, m: BackendSection(name="llamacpp", model=m),
            model=str(model),
            json_schema=False,
        )
    if kind == "llamacpp":
        return Harness(
            LlamaCppBackend,
            lambda t, m: BackendSection(name="llamacpp", model=m),
            model=LLAMACPP_DEFAULT_MODEL,
        )
    assert kind == "ray"
    server = request.getfixturevalue("server")
    request.getfixturevalue("local_ray")
    return Harness(
        RayBackend, lambda t, m: _server_section(server, m, name="ray", ray=RAY_SETTINGS)
    )


# one entry per registered backend (a test below holds them equal); a new built-in backend
# adds its line here, a backend of a test module adds one line there (test_backend_echo.py)
KINDS = [
    "openai",
    "openai-batch",
    "replay",
    "batchfile",
    "vllm",
    "llamacpp-fake",
    pytest.param("llamacpp", marks=[pytest.mark.llamacpp, _skip_without_llama_cpp]),
    pytest.param("ray", marks=[pytest.mark.ray, _skip_without_ray]),
]


@pytest.fixture(params=KINDS)
def harness(request: pytest.FixtureRequest, tmp_path: Path) -> Harness:
    return _harness(request.param, request, tmp_path)


class TestEveryBackend(Conformance):
    """The suite, once per entry of KINDS."""


def test_every_registered_backend_is_in_the_suite() -> None:
    names = {getattr(k, "values", [k])[0].split("-")[0] for k in KINDS}
    assert set(BACKENDS.names()) <= names, "a backend without a conformance entry"


def test_the_registry_refuses_a_taken_name_and_anything_but_a_backend() -> None:
    reg = BackendRegistry("backend", Backend)
    reg.register("openai", "pipeline.backends.openai.backend:OpenAIBackend")
    with pytest.raises(ValueError, match="backend 'openai' is already registered"):
        reg.register("openai", OpenAIBackend)
    with pytest.raises(TypeError, match=r"is not a subclass of pipeline\.kinds\.backend\.Backend"):
        reg.register("dict", dict)
    with pytest.raises(TypeError, match="its name is 'replay'"):
        reg.register("other", ReplayBackend)
    reg.register("lazy", "pipeline.run.cache:RequestCache")  # checked when imported
    with pytest.raises(TypeError, match="is not a subclass"):
        reg.get("lazy")
    with pytest.raises(ConfigError) as err:
        reg.check("opnai")
    assert "Did you mean 'openai'?" in str(err.value)
    assert issubclass(reg.get("openai"), Backend)


def test_a_backend_name_is_asked_nowhere_outside_the_backends() -> None:
    """No module outside pipeline/backends/ compares a backend's name (help text aside)."""
    import re

    root = Path(__file__).resolve().parents[1] / "pipeline"
    names = "|".join(BACKENDS.names())
    pattern = re.compile(
        rf"""\.name\s*(==|!=|in)\s*[("'\[]*({names})|["']({names})["']\s*(==|!=)"""
    )
    hits = [
        f"{p.relative_to(root.parent)}:{n}"
        for p in root.rglob("*.py")
        if "backends" not in p.parts
        for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
        if pattern.search(line)
    ]
    assert not hits, hits


@pytest.mark.parametrize(
    ("name", "module", "install"),
    [
        ("ray", "ray", "pip install 'personalized-rewardbench[ray]'"),
        ("vllm", "vllm", "> keep-torch.txt && pip install 'personalized-rewardbench[vllm]' "
                         "-c keep-torch.txt (on a machine with a CUDA GPU)"),
        ("llamacpp", "llama_cpp", "pip install 'personalized-rewardbench[local]'"),
    ],
)  # fmt: skip
def test_a_missing_extra_is_one_line_before_the_first_stage_even_on_a_finished_run(
    tmp_path, server, capsys, monkeypatch, name, module, install
):
    """A run whose stages are done, continued with a backend whose extra is missing: the
    backend says so with the README's install line, exit 1, instead of "nothing to do"."""
    import importlib.util

    from conftest import disk_state, write_config

    from pipeline.cli import main

    cfg = write_config(tmp_path, server)
    assert main(["run", str(cfg), "--until", "responses", "--no-progress"]) == 0
    capsys.readouterr()
    before = disk_state(tmp_path / "outputs")
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda m, *a: None if m == module else real(m, *a)
    )
    model = str(gguf(tmp_path)) if name == "llamacpp" else "standin-model"
    argv = ["run", str(cfg), "--until", "responses", "--no-progress",
            "--set", f"backend.name={name}", "--set", f"backend.model={model}"]  # fmt: skip
    assert main(argv) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f"error: backend.name is '{name}', but {module} is not installed: ")
    assert err[-1].endswith(install)
    assert not any("nothing to do" in line or "] running" in line for line in err)
    after = {k: v for k, v in disk_state(tmp_path / "outputs").items() if "gguf" not in k}
    assert after == before  # nothing written: run.yaml and the stages as they were
