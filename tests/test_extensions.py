"""Kinds added from outside the package, each as one class and its registration, with no
other file edited (docs/architecture.md, "Extending"): a structured-output dialect that
takes its place in `auto`'s probe by its rank, and a pair rule with a threshold and an
audit check, which the config, the pair stage, the audit and the docs all take from its
class. (The backend and input format of the same exercise are in
tests/test_backend_echo.py and tests/test_input_formats.py.)"""

from __future__ import annotations

import json
from typing import Any

import pytest
from conftest import write_config

from pipeline.backends.openai.dialects import Dialect, schema_statement
from pipeline.cli import main
from pipeline.config import load_config
from pipeline.core.errors import ConfigError
from pipeline.kinds.dialect import DIALECTS, StructuredOutput, next_in_probe, probe_order
from pipeline.rules import RULES, Hit, PairRule, PairView, RowView, audit, threshold
from pipeline.run import RunDir
from pipeline.types import schemas
from pipeline.types.chat import ChatRequest


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


class NoExclamation(PairRule):
    """the chosen answer holds more exclamation marks than `max_exclamations`

    a made-up house rule"""

    position = 75  # after rubric_echo (70), before length (80)
    max_exclamations = threshold(
        int, 0, "Most exclamation marks a chosen answer may hold.", ge=0, le=100
    )

    def exclaims(self, text: str) -> Hit | None:
        n = text.count("!")
        if n > self.max_exclamations:
            return Hit(f"the chosen answer exclaims {n} times", "!" * n)
        return None

    def combination(self, pair: PairView) -> Hit | None:
        return self.exclaims(pair.chosen["text"])

    @audit("exclaims", "Exclaims")
    def exclaims_row(self, row: RowView) -> Hit | None:
        """the chosen answer holds more '!' than pairs.max_exclamations"""
        return self.exclaims(row.texts["chosen"])


@pytest.fixture
def hinted():
    DIALECTS.register("json_object_hinted", JsonObjectHinted)
    try:
        yield JsonObjectHinted
    finally:
        DIALECTS.unregister("json_object_hinted")


@pytest.fixture
def no_exclamation():
    RULES.register("no_exclamation", NoExclamation)
    try:
        yield NoExclamation
    finally:
        RULES.unregister("no_exclamation")


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


def test_a_rule_added_from_outside_is_configured_run_and_audited(
    tmp_path, server, capsys, no_exclamation
):
    # its threshold is a config field, with its bounds, listed with the others
    assert main(["config", "fields"]) == 0
    assert "pairs.max_exclamations" in capsys.readouterr().out
    bad = write_config(tmp_path, server, pairs={"max_exclamations": -1})
    with pytest.raises(ConfigError, match=r"pairs\.max_exclamations"):
        load_config(bad)
    # it runs by default, at its position, and counts its drops by its name
    cfg = write_config(tmp_path, server, pairs={"max_exclamations": 0})
    assert load_config(cfg).pairs.filters.index("no_exclamation") == 7
    assert main(["run", str(cfg), "--no-progress"]) == 0
    run = RunDir(tmp_path / "outputs" / "t")
    assert "no_exclamation" in run.stage("pairs").stats()["dropped_by_reason"]
    kept = list(run.stage("pairs").rows())
    assert kept and all("!" not in p["chosen"] for p in kept)
    # the audit runs its check with the run's threshold: a pair edited to exclaim is flagged
    assert main(["audit", str(run.path), "--out", str(tmp_path / "report")]) in (0, 3)
    report = json.loads((tmp_path / "report" / "audit.json").read_text())
    assert "exclaims" in report["checks"]["ran"]
    assert report["checks"]["rules"]["max_exclamations"] == 0
    rows = [{**p, "chosen": p["chosen"] + " Go!"} for p in kept]
    src = tmp_path / "edited.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["audit", str(src), "--out", str(tmp_path / "r2")]) in (0, 3)
    flags = (tmp_path / "r2" / "flags.jsonl").read_text().splitlines()
    assert sum('"exclaims"' in f for f in flags) == len(rows)
    # and the docs' tables list it
    from gen_config_docs import audit_table, filter_table

    assert "`no_exclamation`" in filter_table() and "`max_exclamations` 0" in filter_table()
    assert "`exclaims`" in audit_table()


def test_a_threshold_renamed_on_one_side_is_refused_naming_it():
    """The rule reads ``max_exclamations`` but declares ``max_exclamation``: refused when it
    is registered (so before any config loads), never run with a default."""

    class Renamed(PairRule):
        max_exclamation = threshold(int, 0, "Most exclamation marks.", ge=0)

        def combination(self, pair: PairView) -> Hit | None:
            n = pair.chosen["text"].count("!")
            return Hit("exclaims", "") if n > self.max_exclamations else None

    with pytest.raises(ValueError, match=r"self\.max_exclamations, which it does not declare"):
        RULES.register("renamed", Renamed)
    assert "renamed" not in RULES

    class Orphan(PairRule):
        max_exclamations = threshold(int, 0, "Most exclamation marks.", ge=0)

        def combination(self, pair: PairView) -> Hit | None:
            return None

    with pytest.raises(ValueError, match=r"threshold pairs\.max_exclamations but never reads"):
        RULES.register("orphan", Orphan)
    # and a config naming a threshold no rule declares is refused with its field
    with pytest.raises(ConfigError, match=r"pairs\.max_exclamations"):
        load_config_text("pairs:\n  max_exclamations: 1\n")


def load_config_text(text: str):
    import yaml
    from pydantic import ValidationError

    from pipeline.config import Config
    from pipeline.config.load import format_validation

    try:
        return Config.model_validate(yaml.safe_load(text))
    except ValidationError as exc:
        raise format_validation(exc, "inline.yaml") from None
