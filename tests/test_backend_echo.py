"""A backend added by a test module alone, as docs/backends.md describes: the class, its
registration, and one line that runs the conformance suite on it."""

from __future__ import annotations

import json
import random
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from backend_conformance import Harness, conformance

from pipeline.backends.instance import schema_instance
from pipeline.kinds.backend import BACKENDS, Backend, BackendSection, Resolve
from pipeline.types.chat import ChatRequest, ChatResult, Choice, RequestFailure


class EchoBackend(Backend):
    """Says the question back (a JSON-schema request gets a valid instance): not a model."""

    name = "echo"

    async def run(
        self, requests: Sequence[ChatRequest]
    ) -> AsyncIterator[tuple[int, ChatResult | RequestFailure]]:
        for i, req in enumerate(requests):
            rng = random.Random(req.key)
            texts = [
                json.dumps(schema_instance(req.json_schema, rng))
                if req.json_schema is not None
                else f"You asked: {req.messages[-1][1]} (sample {k + 1})."
                for k in range(req.n)
            ]
            yield (
                i,
                ChatResult(
                    [Choice(t, "stop") for t in texts],
                    prompt_tokens=sum(len(c.split()) for _, c in req.messages),
                    completion_tokens=sum(len(t.split()) for t in texts),
                    model=req.model,
                ),
            )

    @classmethod
    def identify(
        cls,
        cfg: BackendSection,
        models: Sequence[str],
        *,
        resolve: Resolve | None = None,
        cache_path: Path | None = None,
    ) -> dict[str, Any]:
        return {"kind": "echo", "version": 1, "model_output": False}

    @classmethod
    def describe(cls, identity: dict[str, Any]) -> str:
        return "the echo backend (the question said back, not a model)"


@pytest.fixture(autouse=True, scope="module")
def _registered():
    # registered for this module's tests only: other modules list the built-in backends
    BACKENDS.register("echo", EchoBackend)
    yield
    BACKENDS.unregister("echo")


TestEcho = conformance(
    Harness(EchoBackend, lambda tmp, model: BackendSection(name="echo", model=model))
)


def test_a_config_may_name_the_new_backend_and_a_run_uses_it(tmp_path, capsys):
    """`backend.name: echo` validates, and a whole run's LLM stages go through it."""
    from conftest import write_config

    from pipeline.config import load_config
    from pipeline.orchestration.orchestrate import run_pipeline
    from pipeline.run import RunDir

    cfg = load_config(write_config(tmp_path, backend={"name": "echo"}))
    run_pipeline(cfg, until="responses", progress=False)
    rows = list(RunDir(cfg.run_dir).stage("responses").rows())
    assert rows and all(r["text"].startswith("You asked: ") for r in rows)
    meta = RunDir(cfg.run_dir).stage("responses").meta
    assert meta is not None and meta.environment["served_by"]["kind"] == "echo"
