"""The code behind a stage's rows is part of its fingerprint (pipeline/core/sourcehash.py):
editing a module a stage names re-does that stage (and the later ones), the message names
the module, an LLM stage re-done this way is answered from the request cache, and an edit
to comments, docstrings or layout re-does nothing."""

from __future__ import annotations

import importlib.util
import json
import sys
import zipfile

import pytest
from conftest import write_config

from pipeline.cli import main
from pipeline.core import sourcehash
from pipeline.kinds.stages import ORDER
from pipeline.stages import STAGES

ORIGINAL = sourcehash.read_source


def _edit(monkeypatch, module: str, old: str, new: str) -> None:
    """Make ``module``'s source, as the fingerprint reads it, have ``new`` for ``old``."""
    text = ORIGINAL(module)
    assert isinstance(text, str) and text.count(old) == 1, old
    edited = text.replace(old, new)

    def read(name: str) -> str | bytes:
        return edited if name == module else ORIGINAL(name)

    monkeypatch.setattr(sourcehash, "read_source", read)


def _run(cfg, capsys) -> str:
    assert main(["run", str(cfg), "--no-progress"]) == 0
    return capsys.readouterr().err


OVER_CAP = "        if n > self.cap:\n            slack = "


def test_every_stage_names_its_own_module_and_modules_that_exist():
    for name in ORDER:
        stage = STAGES.get(name)()
        assert type(stage).__module__ in stage.code, name
        for module in stage.code:
            assert importlib.util.find_spec(module) is not None, (name, module)
        assert set(stage.code_fingerprint()) == set(stage.code)


def test_comments_docstrings_and_layout_do_not_count_but_code_does():
    base = 'def f(x):\n    """Doc."""\n    return x + 1  # one\n'
    same = (
        '"""A module docstring."""\n\n\ndef f(\n    x,\n):\n    """Another doc,\n    longer."""\n'
        "    # a comment\n    return (x\n            + 1)\n"
    )
    assert sourcehash.normalised_source(base) == sourcehash.normalised_source(same)
    for changed in (
        base.replace("+ 1", "+ 2"),
        base.replace("x + 1", "1 + x"),
        base.replace("return x + 1", "return str(x + 1)"),
        base + "\nLIMIT = 3\n",
    ):
        assert sourcehash.normalised_source(changed) != sourcehash.normalised_source(base)


def test_source_is_read_through_the_import_system_not_the_checkout(tmp_path, monkeypatch):
    # a module in a zip (as from a zipped install) hashes like the same source on disk
    source = 'LIMIT = 3\n\n\ndef over(n):\n    """Over the limit."""\n    return n > LIMIT\n'
    (tmp_path / "ondisk_rules.py").write_text(source)
    with zipfile.ZipFile(tmp_path / "pkg.zip", "w") as z:
        z.writestr("zipped_rules.py", "# zipped\n" + source)
    monkeypatch.syspath_prepend(str(tmp_path / "pkg.zip"))
    monkeypatch.syspath_prepend(str(tmp_path))
    assert "zipped_rules" not in sys.modules
    assert sourcehash.source_hash("zipped_rules") == sourcehash.source_hash("ondisk_rules")
    assert "zipped_rules" not in sys.modules  # read, never imported
    with pytest.raises(sourcehash.PipelineError, match="'no_such_rules' is named as stage code"):
        sourcehash.source_hash("no_such_rules")


def test_a_change_to_a_rule_re_does_the_pair_stage_naming_the_module(
    tmp_path, server, monkeypatch, capsys
):
    cfg = write_config(tmp_path, server)
    _run(cfg, capsys)
    pairs = tmp_path / "outputs" / "t" / "pairs" / "stage.json"
    before = pairs.read_bytes()
    sent = server.request_count

    # a comment and a docstring in the length rule, and a reformatted line: nothing re-done
    _edit(
        monkeypatch,
        "pipeline.rules.catalogue",
        OVER_CAP,
        '        """Over the cap, slack included."""\n'
        "        # the slack keeps a near miss\n"
        "        if (\n            n > self.cap\n        ):\n"
        "            slack = ",
    )
    err = _run(cfg, capsys)
    assert [f"[{n}] done, nothing to do" in err for n in ORDER] == [True] * len(ORDER)
    assert pairs.read_bytes() == before

    # the rule itself: the pair stage is re-done, and the judge, which asks only what the
    # rules can still use, from its cache; nothing before them
    _edit(monkeypatch, "pipeline.rules.catalogue", OVER_CAP, OVER_CAP.replace(">", ">="))
    err = _run(cfg, capsys)
    assert "[judge] re-doing: the code of pipeline.rules.catalogue changed" in err
    assert "[pairs] re-doing: the code of pipeline.rules.catalogue changed" in err
    for name in ORDER[:-2]:
        assert f"[{name}] done, nothing to do" in err
    assert server.request_count == sent
    assert pairs.read_bytes() != before


def test_an_llm_stage_re_done_for_its_code_is_answered_from_the_cache(
    tmp_path, server, monkeypatch, capsys
):
    cfg = write_config(tmp_path, server)
    _run(cfg, capsys)
    judge = tmp_path / "outputs" / "t" / "judge"
    rows_before = (judge / "data-00000.jsonl").read_bytes()
    sent = server.request_count
    asked = json.loads((judge / "stats.json").read_text())["llm"]["requests"]

    same_rows = "        ids = list(ex.cands) and [c["  # another way to write the same
    _edit(monkeypatch, "pipeline.stages.judge", "        ids = [c[", same_rows)
    err = _run(cfg, capsys)
    assert "[judge] re-doing: the code of pipeline.stages.judge changed" in err
    assert "[pairs] re-doing: stage 'judge' was re-done" in err
    assert "[responses] done, nothing to do" in err
    # every request came from the cache (the memo of finished rows keys on the code too)
    assert server.request_count == sent
    assert f"sent 0, cached {asked}, failed 0" in err
    assert (judge / "data-00000.jsonl").read_bytes() == rows_before
    # the judge's memo of finished rows holds its code in the key: the rows were rebuilt
    # from the cached answers, not taken whole from memos made by the old code
    stats = json.loads((judge / "stats.json").read_text())
    assert stats["rows_from_cache"] == 0
    # the same code again: the memos made by this code serve every row
    assert main(["run", str(cfg), "--no-progress", "--redo", "judge"]) == 0
    stats = json.loads((judge / "stats.json").read_text())
    assert stats["rows_from_cache"] == 12
    assert server.request_count == sent


def test_the_message_of_a_stage_finished_before_its_code_was_recorded():
    from pipeline.orchestration.orchestrate import explain_change

    old = {"pairs": {"quality_floor": 4}, "upstream": {"judge": "a"}}
    new = {**old, "code": {"pipeline.rules.base": "1", "pipeline.rules.pair": "2"}}
    assert explain_change(old, new) == "finished by a version that did not record its code"
    newer = {**new, "code": {"pipeline.rules.base": "1", "pipeline.rules.pair": "3"}}
    assert explain_change(new, newer) == "the code of pipeline.rules.pair changed"
    moved = {**new, "code": {"pipeline.rules.base": "1", "pipeline.rules.other": "2"}}
    assert explain_change(new, moved) == (
        "its code now includes pipeline.rules.other; its code no longer includes "
        "pipeline.rules.pair"
    )


def test_a_field_a_newer_python_adds_to_a_node_changes_nothing(monkeypatch):
    # Python 3.12 added `type_params` to function and class nodes: empty in code that does
    # not use it, so the text (and every stage's fingerprint) stays the same across versions
    import ast

    source = "class A:\n    def f(self, x):\n        return x[1:]\n"
    before = sourcehash.normalised_source(source)
    for node in (ast.FunctionDef, ast.ClassDef):
        monkeypatch.setattr(node, "_fields", (*node._fields, "future_field"))
    assert sourcehash.normalised_source(source) == before
    # and an empty field is still told apart from a filled one
    assert sourcehash.normalised_source(source.replace("x[1:]", "x[:1]")) != before


def test_a_stages_code_is_derived_from_what_it_imports():
    """No hand-kept list: a stage's code is its module and the row-deciding modules it
    imports, followed through theirs (pipeline.stages.base.ROW_CODE); the readers the input
    registry names count for ingest, and the engines and storage never do."""
    from pipeline.stages.base import ROW_CODE

    code = {n: STAGES.get(n)().code for n in ORDER}
    # a module imported since a list was last edited by hand (the prompt files)
    assert "pipeline.types.promptfiles" in code["responses"]
    # the registry's lazy entries ("module:Class") of the formats ingest reads with
    assert {"pipeline.inputs.jsonl", "pipeline.inputs.tables"} <= set(code["ingest"])
    # followed through: the rules and the parts they import
    rules = {"pipeline.rules.base", "pipeline.rules.catalogue", "pipeline.rules.regexgate"}
    assert rules <= set(code["pairs"])
    for name, modules in code.items():
        assert modules[0] == STAGES.get(name).__module__
        for m in modules[1:]:
            assert any(m == r or m.startswith(r + ".") for r in ROW_CODE), (name, m)
