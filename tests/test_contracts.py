"""The stage contract can fail: each stage declares the fields it reads from each upstream
stage (written by the reader, never imported from the producer), and `prb run` checks them
against what the producer declares it writes before any work starts."""

from __future__ import annotations

import pytest
from conftest import write_config

from pipeline.cli import main
from pipeline.core.errors import StageError
from pipeline.kinds.stages import ORDER
from pipeline.orchestration.orchestrate import check_contracts
from pipeline.stages import STAGES
from pipeline.types.records import PAIR_RECORD_FIELDS


def _stages():
    return {n: STAGES.get(n)() for n in ORDER}


def test_the_shipped_declarations_hold():
    check_contracts(_stages())
    # and the pair stage writes exactly the pair record every command reads
    assert set(STAGES.get("pairs").writes) == set(PAIR_RECORD_FIELDS)


def test_reads_are_the_readers_own_not_the_producers_constant():
    stages = _stages()
    for name, st in stages.items():
        for up, fields in st.reads.items():
            # a reader that copied the producer's whole write set could never disagree
            assert set(fields) != set(stages[up].writes) or name == "pairs", (name, up)


def test_a_read_the_producer_does_not_write_is_refused_before_any_work(
    tmp_path, server, monkeypatch, capsys
):
    from pipeline.stages.judge import JudgeStage

    broken = {**JudgeStage.reads, "responses": JudgeStage.reads["responses"] | {"tone"}}
    monkeypatch.setattr(JudgeStage, "reads", broken)
    with pytest.raises(StageError, match=r"stage 'judge' reads \['tone'\] from 'responses'"):
        check_contracts(_stages())
    cfg = write_config(tmp_path, server)
    assert main(["run", str(cfg), "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert "reads ['tone'] from 'responses'" in err and "Traceback" not in err
    assert not (tmp_path / "outputs").exists()  # refused before the run directory exists
    assert server.request_count == 0


def test_a_producer_that_stops_writing_a_field_breaks_its_readers(monkeypatch):
    from pipeline.stages.responses import ResponseStage

    monkeypatch.setattr(ResponseStage, "writes", ResponseStage.writes - {"violates"})
    with pytest.raises(StageError, match=r"reads \['violates'\] from 'responses'"):
        check_contracts(_stages())


def test_a_read_from_a_later_stage_is_refused(monkeypatch):
    from pipeline.stages.rubrics import RubricStage

    monkeypatch.setattr(RubricStage, "reads", {**RubricStage.reads, "judge": {"quality"}})
    with pytest.raises(
        StageError, match="declares reads from 'judge', which is not a stage before"
    ):
        check_contracts(_stages())


def test_a_stage_sees_an_upstream_row_only_through_its_declared_reads():
    from pipeline.stages.base import UndeclaredRead, UpstreamRow

    row = UpstreamRow(
        {"example_id": "e1", "text": "an answer", "provenance": {"model": "m"}},
        "judge",
        "responses",
        frozenset({"example_id", "text", "violates"}),
    )
    assert dict(row) == {"example_id": "e1", "text": "an answer"}
    assert row["text"] == "an answer" and row.get("violates", []) == []
    assert "provenance" not in row
    for read in (lambda: row["provenance"], lambda: row.get("provenance")):
        with pytest.raises(UndeclaredRead) as caught:
            read()
        assert str(caught.value) == (
            "stage 'judge' read field 'provenance' of a 'responses' row without declaring it: "
            "add it to judge's `reads['responses']` (a bug in the stage, nothing was written "
            "for the example it was reading)"
        )
        assert isinstance(caught.value, KeyError) and isinstance(caught.value, StageError)
    with pytest.raises(KeyError) as missing:  # declared but absent: a plain KeyError
        row["violates"]
    assert not isinstance(missing.value, UndeclaredRead)


def test_requires_is_the_latest_stage_read():
    assert {n: STAGES.get(n)().requires for n in ORDER} == {
        "ingest": (),
        "rubrics": ("ingest",),
        "responses": ("rubrics",),
        "judge": ("responses",),
        "pairs": ("judge",),
    }


def test_the_run_directory_knows_the_stages_in_their_run_order():
    from pipeline.run import STAGE_NAMES

    assert STAGE_NAMES is ORDER
    assert list(STAGES) == list(ORDER)  # every registered stage has its place in the order


def test_every_stage_reads_only_what_it_declares(tmp_path, server, capsys):
    # the whole sample through every stage, and `prb plan` before and after: each read
    # any stage makes goes through its declared view, which raises on anything else
    cfg = write_config(tmp_path, server)
    assert main(["plan", str(cfg)]) == 0
    assert main(["run", str(cfg), "--no-progress"]) == 0
    assert main(["plan", str(cfg)]) == 0
    out = capsys.readouterr()
    assert "without declaring it" not in out.out + out.err
    assert "[pairs] done: examples=12" in out.err


def test_an_undeclared_read_fails_at_once_naming_stage_and_field(
    tmp_path, server, monkeypatch, capsys
):
    from pipeline.stages.judge import JudgeStage

    # the judge's code reads each candidate's text; its declaration no longer says so
    narrowed = {**JudgeStage.reads, "responses": JudgeStage.reads["responses"] - {"text"}}
    monkeypatch.setattr(JudgeStage, "reads", narrowed)
    check_contracts(_stages())  # the declarations alone still agree
    cfg = write_config(tmp_path, server)
    assert main(["run", str(cfg), "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert "stage 'judge' read field 'text' of a 'responses' row without declaring it" in err
    assert "Traceback" not in err
    judge = tmp_path / "outputs" / "t" / "judge"
    assert not (judge / "_DONE.json").exists()
    assert not list(judge.glob("data-*.jsonl"))
    assert (tmp_path / "outputs" / "t" / "responses" / "_DONE.json").exists()
