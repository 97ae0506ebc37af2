"""Config loading: types, unknown keys, overrides, secrets, and the CLI's view of them."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from pipeline.cli import main
from pipeline.config import describe_fields, load_config
from pipeline.core.errors import ConfigError


def _write(tmp_path: Path, data) -> Path:
    p = tmp_path / "c.yaml"
    p.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
    return p


def test_defaults_and_override(tmp_path, capsys):
    p = _write(tmp_path, {"responses": {"n": 3}})
    cfg = load_config(p, ["responses.word_cap=80", "backend.openai.max_concurrency=7"])
    assert cfg.responses.n == 3
    assert cfg.responses.word_cap == 80
    assert cfg.backend.openai.max_concurrency == 7
    assert cfg.profile.top_k == 10  # default
    assert capsys.readouterr().err == ""  # new keys: no deprecation line


def test_flat_backend_keys_are_read_into_their_section_with_one_warning(tmp_path, capsys):
    """A config written before the backend sections (backend.base_url, replay_cache...)
    still loads, each key in its section, with one warning line; --set with a flat key
    overrides the file's section value."""
    p = _write(
        tmp_path,
        {"backend": {"name": "replay", "base_url": "http://h:1/v1", "timeout_s": 5,
                     "replay_cache": "c.jsonl", "openai": {"max_concurrency": 3}}},
    )  # fmt: skip
    (tmp_path / "c.jsonl").write_text("")
    cfg = load_config(p, ["backend.max_concurrency=9"])
    b = cfg.backend
    assert (b.openai.base_url, b.openai.timeout_s, b.openai.max_concurrency) == (
        "http://h:1/v1",
        5,
        9,
    )
    assert b.replay.cache == Path("c.jsonl")
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"warning: {p}")
    for old, new in (("base_url", "openai.base_url"), ("replay_cache", "replay.cache"),
                     ("max_concurrency", "openai.max_concurrency")):  # fmt: skip
        assert f"backend.{old} is now backend.{new}" in err[0]
    # written back (run.yaml) in the new shape, which loads without a warning
    again = _write(tmp_path, cfg.to_yaml())
    back = load_config(again).backend
    assert back.replay.cache == tmp_path / "c.jsonl"  # written resolved, as the file meant it
    assert back.model_copy(update={"replay": b.replay}) == b
    assert capsys.readouterr().err == ""
    # the same key flat and in its section with two values: one line naming both
    clash = _write(tmp_path, {"backend": {"base_url": "http://a:1/v1",
                                          "openai": {"base_url": "http://b:1/v1"}}})  # fmt: skip
    with pytest.raises(ConfigError) as err_info:
        load_config(clash)
    assert "backend.base_url and backend.openai.base_url are both given" in str(err_info.value)


def test_relative_input_resolves_against_config_folder(tmp_path):
    sub = tmp_path / "cfgs"
    sub.mkdir()
    p = sub / "c.yaml"
    p.write_text(yaml.safe_dump({"input": {"path": "../data/x.jsonl"}}))
    cfg = load_config(p)
    assert cfg.resolve_input(cfg.input.path).resolve() == (tmp_path / "data" / "x.jsonl").resolve()


@pytest.mark.parametrize(
    ("data", "field", "needle"),
    [
        ({"responses": {"nn": 2}}, "responses.nn", "did you mean 'n'"),
        ({"responses": {"n": 0}}, "responses.n", "greater than or equal to 1"),
        ({"responses": {"n": "many"}}, "responses.n", "must be a whole number, got 'many'"),
        ({"backend": {"vllm": 3}}, "backend.vllm", "must be a section of settings"),
        ({"run": {"name": ""}}, "run.name", "must not be empty"),
        ({"responses": {"strategies": ["avoid_al"]}}, "responses.strategies.0", "avoid_all"),
        ({"backend": {"name": "vlm"}}, "backend.name", "Did you mean 'vllm'"),
        ({"backend": {"api_key": "sk-live-123"}}, "backend.api_key", "environment variable"),
        ({"rubrics": {"source": "magic"}}, "rubrics.source", "given"),
        ({"bogus": {}}, "bogus", "unknown key"),
    ],
)
def test_bad_values_name_file_and_field(tmp_path, data, field, needle):
    p = _write(tmp_path, data)
    with pytest.raises(ConfigError) as ei:
        load_config(p)
    msg = str(ei.value)
    assert str(p) in msg
    assert f"'{field}'" in msg
    assert needle in msg
    # a secret given by mistake is never echoed back
    assert "sk-live-123" not in msg


def test_min_greater_than_max(tmp_path):
    p = _write(tmp_path, {"rubrics": {"min_items": 5, "max_items": 2}})
    with pytest.raises(ConfigError, match="min_items"):
        load_config(p)


def test_yaml_syntax_error_names_line(tmp_path):
    p = _write(tmp_path, "run:\n  name: x\n responses: [\n")
    with pytest.raises(ConfigError) as ei:
        load_config(p)
    assert ei.value.line is not None
    assert str(p) in str(ei.value)


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.yaml")


def test_bad_override_syntax(tmp_path):
    p = _write(tmp_path, {})
    with pytest.raises(ConfigError, match=r"key\.path=value"):
        load_config(p, ["responses.n"])
    with pytest.raises(ConfigError, match=r"responses\.zzz"):
        load_config(p, ["responses.zzz=1"])


def test_every_field_is_described():
    rows = describe_fields()
    assert len(rows) > 30
    missing = [name for name, _, desc in rows if not desc]
    assert missing == []


def test_cli_config_show_and_error(tmp_path, capsys):
    p = _write(tmp_path, {"responses": {"n": 4}})
    assert main(["config", "show", str(p), "--set", "run.name=abc"]) == 0
    shown = yaml.safe_load(capsys.readouterr().out)
    assert shown["responses"]["n"] == 4
    assert shown["run"]["name"] == "abc"
    bad = _write(tmp_path, {"responses": {"n": -1}})
    assert main(["config", "show", str(bad)]) == 1
    err = capsys.readouterr().err
    assert "responses.n" in err and str(bad) in err


def test_the_generated_doc_tables_match_the_code():
    """docs/config.md's fields, docs/filters.md's filters and docs/audit.md's checks are
    generated (scripts/gen_config_docs.py, `make docs`); keep them in step."""
    from gen_config_docs import DOCS, TABLES, rewrite

    for name, (marker, make) in TABLES.items():
        doc = DOCS / name
        assert rewrite(doc, marker, make()) == doc.read_text(), f"`make docs` ({name})"


@pytest.mark.parametrize("key", ["run..name", ".run.name", "run.name.", "run.."])
def test_a_set_key_with_an_empty_part_is_refused_not_read_as_another(tmp_path, key):
    """`--set run..name=x` was read as run.name: a typo must not set a field silently."""
    p = _write(tmp_path, {})
    with pytest.raises(ConfigError, match="has an empty part") as exc:
        load_config(p, [f"{key}=x"])
    assert str(exc.value).startswith("--set: ")


@pytest.mark.parametrize(
    ("value", "got", "what"),
    [
        ("2024", "got 2024", "as a number"),
        ("0755", "got 493", "octal"),
        ("yes", "got true", "true/false"),
        ("2024-01-01", "", "is a date"),
    ],
)
def test_yaml_reading_a_name_as_a_number_or_a_bool_gets_the_quote_hint(tmp_path, value, got, what):
    """`--set run.name=2024` / `=0755` / `=yes`: YAML's number, octal and bool get the hint
    a date gets (quote it), in the file and on the command line, in one line."""
    p = _write(tmp_path, f"run:\n  name: {value}\n")
    for overrides in ([], [f"run.name={value}"]):
        src = _write(tmp_path, {}) if overrides else p
        with pytest.raises(ConfigError) as exc:
            load_config(src, overrides)
        line = str(exc.value)
        assert "field 'run.name'" in line and got in line and what in line, line
        assert "quote it" in line and "\n" not in line
    # quoted, it is text
    assert load_config(_write(tmp_path, {}), [f'run.name="{value}"']).run.name == value
