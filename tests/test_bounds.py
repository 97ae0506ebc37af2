"""Options a user types are bounded where the config's own field is (issue 28): a bool
never slips into a number field (`run.budget.requests=true` was a budget of 1 request), and
`prb plan --tokens-per-second` takes a sensible throughput only. Each refusal is one line
naming the field or option, and nothing is written."""

from __future__ import annotations

import json
import re

import pytest
from conftest import disk_state, write_config

from pipeline.cli import main
from pipeline.config import load_config


@pytest.mark.parametrize(
    "override",
    ["run.budget.requests=true", "run.budget.tokens=false", "run.budget.usd=true",
     "backend.openai.max_concurrency=true", "responses.n=true", "run.seed=false",
     "backend.openai.timeout_s=true"],
)  # fmt: skip
def test_a_bool_in_a_number_field_is_refused(tmp_path, server, capsys, override):
    cfg = write_config(tmp_path, server)
    before = disk_state(tmp_path)
    assert main(["run", str(cfg), "--set", override, "--no-progress"]) == 1
    (line,) = capsys.readouterr().err.strip().splitlines()
    field, value = override.split("=")
    assert f"field '{field}'" in line and f"must be a number, not {value}" in line, line
    assert disk_state(tmp_path) == before  # no run directory


def test_a_bool_in_the_config_file_is_refused_too(tmp_path, server):
    cfg = write_config(tmp_path, server, run={"budget": {"requests": True}})
    with pytest.raises(Exception, match=r"run.budget.requests.*must be a number, not true"):
        load_config(cfg)
    # numbers still are numbers, and none is no limit
    cfg = write_config(tmp_path, server, run={"budget": {"requests": 5, "tokens": 10**6}})
    assert load_config(cfg).run.budget.requests == 5
    assert load_config(cfg).run.budget.tokens == 10**6


@pytest.mark.parametrize("tps", ["1e308", "5e-324", "0.009", "10000001", "inf", "nan", "-1"])
def test_plan_refuses_a_throughput_outside_the_range(tmp_path, capsys, tps):
    cfg = write_config(tmp_path)
    before = disk_state(tmp_path)
    with pytest.raises(SystemExit) as exc:
        main(["plan", str(cfg), f"--tokens-per-second={tps}"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "--tokens-per-second" in err[-1] and tps in err[-1], err
    assert "Traceback" not in "\n".join(err)
    assert disk_state(tmp_path) == before


@pytest.mark.parametrize("tps", ["0.01", "10000000"])
def test_plan_at_the_ends_of_the_range_prints_plain_figures(tmp_path, capsys, tps):
    cfg = write_config(tmp_path)
    assert main(["plan", str(cfg), "--json", f"--tokens-per-second={tps}"]) == 0
    data = json.loads(capsys.readouterr().out)
    seconds = data["time"]["seconds"]
    assert 0 <= seconds < 1e12  # finite, and no 309-digit figure
    assert main(["plan", str(cfg), f"--tokens-per-second={tps}"]) == 0
    out = capsys.readouterr().out
    assert "inf" not in out.lower().replace("info", "")
    assert not re.search(r"\d{16,}", out.replace(",", "")), out
