"""The stage contract can fail: each stage declares the fields it reads from each upstream
stage (written by the reader, never imported from the producer), and `prb run` checks them
against what the producer declares it writes before any work starts."""

from __future__ import annotations

import pytest
from conftest import write_config

from pipeline.cli import main
from pipeline.errors import StageError
from pipeline.orchestrate import check_contracts
from pipeline.records import PAIR_RECORD_FIELDS
from pipeline.stages import ORDER, STAGES


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
