"""Kinds added from outside the package, each as one class and its registration, with no
other file edited (docs/architecture.md, "Extending"): a structured-output dialect that
takes its place in `auto`'s probe by its rank, and a pair filter that a run's config names
and the pair stage runs. (The backend, input format and audit check of the same exercise
are in tests/test_backend_echo.py, tests/test_input_formats.py and
tests/test_audit_checks.py.)"""

from __future__ import annotations

import json
from typing import Any

import pytest
from conftest import write_config

from pipeline import schemas
from pipeline.backends.openai.dialects import Dialect, schema_statement
from pipeline.chat import ChatRequest
from pipeline.cli import main
from pipeline.config import load_config
from pipeline.errors import ConfigError
from pipeline.filters import FILTERS, KEEP, PairFilter, PairView, Verdict
from pipeline.kinds.dialect import DIALECTS, StructuredOutput, next_in_probe, probe_order
from pipeline.run import RunDir


class JsonObjectHinted(StructuredOutput):
    """``json_object`` with the schema's name as a hint (a made-up server's dialect)."""

    probe_rank = 35  # after json_object_schema (30), before json_object (40)
    summary = "json_object with a schema-name hint"

    @classmethod
    def apply(cls, req: ChatRequest, body: dict[str, Any], schema_name: str) -> None:
        body["response_format"] = {"type": "json_object", "hint": schema_name}

    @classmethod
    def note(cls, req: ChatRequest) -> str:
        return schema_statement(req.json_schema or {})


class NoExclamation(PairFilter):
    """Drops a pair whose chosen answer exclaims (a made-up house rule)."""

    name = "no_exclamation"

    def check(self, pair: PairView) -> Verdict:
        if "!" in pair.chosen["text"]:
            return False, "the chosen answer exclaims"
        return KEEP


@pytest.fixture
def hinted():
    DIALECTS.register("json_object_hinted", JsonObjectHinted)
    try:
        yield JsonObjectHinted
    finally:
        DIALECTS.unregister("json_object_hinted")


@pytest.fixture
def no_exclamation():
    FILTERS.register("no_exclamation", NoExclamation)
    try:
        yield NoExclamation
    finally:
        FILTERS.unregister("no_exclamation")


def test_a_dialect_added_from_outside_takes_its_place_by_rank(tmp_path, hinted):
    order = probe_order()
    assert order.index("json_object_schema") < order.index("json_object_hinted")
    assert order.index("json_object_hinted") < order.index("json_object")
    assert next_in_probe("json_object_schema") == "json_object_hinted"
    assert next_in_probe("json_object_hinted") == "json_object"
    # a config may name it; the body and the prompt are the class's
    cfg = load_config(
        write_config(tmp_path, backend={"openai": {"structured_output": "json_object_hinted"}})
    )
    assert cfg.backend.openai.structured_output == "json_object_hinted"
    schema = schemas.quality_schema(512)
    req = ChatRequest((("user", "Rate it."),), "m", json_schema=schema, schema_name="quality")
    (body,) = Dialect(structured_output="json_object_hinted").bodies(req)
    assert body["response_format"] == {"type": "json_object", "hint": "quality"}
    assert json.dumps(schema, separators=(",", ":")) in body["messages"][0]["content"]
    # the answer is not held to the schema: the JSON is taken out of the text around it
    assert not JsonObjectHinted.enforced


def test_a_dialect_not_registered_is_refused_with_the_closest(tmp_path):
    bad = write_config(tmp_path, backend={"openai": {"structured_output": "json_objct"}})
    with pytest.raises(ConfigError) as err:
        load_config(bad)
    assert "Did you mean 'json_object'?" in str(err.value)
    assert "backend.openai.structured_output" in str(err.value)


def test_a_filter_added_from_outside_runs_in_the_pair_stage(tmp_path, server, no_exclamation):
    filters = ["empty", "no_exclamation"]
    cfg = write_config(tmp_path, server, pairs={"filters": filters})
    assert main(["run", str(cfg), "--no-progress"]) == 0
    stats = RunDir(tmp_path / "outputs" / "t").stage("pairs").stats()
    # counted by its name, like the built-in filters, whether it dropped any or not
    assert "no_exclamation" in stats["dropped_by_reason"]
    kept = list(RunDir(tmp_path / "outputs" / "t").stage("pairs").rows())
    assert kept and all("!" not in p["chosen"] for p in kept)
