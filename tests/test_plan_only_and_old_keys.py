"""Found by trying the merged commands from outside: `prb plan --only STAGE` on a run that
has begun, `prb plan` of a folder `prb run` refuses, a file's once-flat backend key with a
`--set` of its new name, and `prb status` saying a deprecation once."""

from __future__ import annotations

import json

import yaml
from conftest import disk_state, write_config

from pipeline.cli import main


def test_plan_only_a_stage_of_a_run_that_has_begun(tmp_path, server, capsys):
    cfg = write_config(tmp_path, server)
    assert main(["run", str(cfg), "--until", "responses", "--no-progress"]) == 0
    capsys.readouterr()
    sent = server.request_count
    assert main(["plan", str(cfg), "--only", "judge", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    stages = {s["stage"]: s for s in out["stages"]}
    assert stages["judge"]["action"] == "run"
    assert all(stages[n]["action"] != "run" for n in ("ingest", "rubrics", "responses"))
    assert stages["judge"]["to_send"]["requests"] > 0
    assert server.request_count == sent  # planning sent nothing
    # after the run, the finished stage is compared with a plan made as if nothing had run
    assert main(["run", str(cfg), "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["plan", str(cfg), "--only", "judge", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert "judge" in out["before_the_run"]
    assert set(out["before_the_run"]) <= {s["stage"] for s in out["stages"]}
    judge = next(s for s in out["stages"] if s["stage"] == "judge")
    assert judge["action"] == "skip"
    # the finished stage holds the requests it sent: part of the largest it could send
    before = out["before_the_run"]["judge"]
    assert judge["total"]["requests"] <= before["requests"]
    off = abs(before["requests_expected"] - judge["total"]["requests"])
    assert off <= 0.25 * before["requests"]


def test_plan_refuses_a_folder_run_would_refuse(tmp_path, server, capsys):
    mine = tmp_path / "mine" / "research"
    (mine / "responses").mkdir(parents=True)
    (mine / "responses" / "survey.csv").write_text("a,b\n1,2\n")
    cfg = write_config(tmp_path, server)
    before = disk_state(tmp_path / "mine")
    over = ["--set", f"run.output_dir={tmp_path / 'mine'}", "--set", "run.name=research"]
    assert main(["plan", str(cfg), *over]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "exists and is not a run directory" in err[0], err
    assert "research" in err[0]
    assert disk_state(tmp_path / "mine") == before


def test_a_set_of_the_new_name_overrides_a_files_flat_key(tmp_path, server, capsys):
    cfg = write_config(tmp_path, server)
    data = yaml.safe_load(cfg.read_text())
    openai = data["backend"].pop("openai")
    data["backend"]["base_url"] = "http://127.0.0.1:9/v1"  # the old, flat key
    data["backend"]["max_concurrency"] = openai["max_concurrency"]
    cfg.write_text(yaml.safe_dump(data))
    # the file's flat key and a --set of its new name: the --set wins, one warning
    args = ["config", "show", str(cfg), "--set", f"backend.openai.base_url={server.base_url}"]
    assert main(args) == 0
    out, err = capsys.readouterr()
    assert server.base_url in out and "127.0.0.1:9/" not in out
    assert err.count("warning:") == 1 and "backend.base_url is now backend.openai.base_url" in err
    # both in the file itself with two values: one line naming the file
    data["backend"]["openai"] = {"base_url": server.base_url}
    cfg.write_text(yaml.safe_dump(data))
    assert main(["config", "show", str(cfg)]) == 1
    err = capsys.readouterr().err
    assert f"{cfg}" in err and "are both given" in err


def test_status_says_a_deprecation_once(tmp_path, server, capsys):
    cfg = write_config(tmp_path, server)
    data = yaml.safe_load(cfg.read_text())
    data["backend"]["api_key_env"] = data["backend"]["openai"].pop("api_key_env", "PRB_KEY")
    cfg.write_text(yaml.safe_dump(data))
    assert main(["run", str(cfg), "--until", "ingest", "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["status", str(cfg)]) == 0
    err = capsys.readouterr().err
    assert err.count("backend.api_key_env is now backend.openai.api_key_env") == 1, err
