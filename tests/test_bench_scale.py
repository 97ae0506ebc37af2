"""benchmarks/scale.py at a tiny size: it runs every stage, the bare client and the cached
re-run, and writes the figures it promises (checked for shape and sanity, never timing)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "scale.py"
STAGES = ["ingest", "rubrics", "responses", "judge", "pairs"]
N = 40
# per example: chosen, avoid_all and other_user (n=2 each) + violate_one (two n=1 requests)
RESPONSES_PER_EXAMPLE = 5
# per example: 8 candidates x (quality + coverage) + 4 shortlisted pairs x 2 judges x 2 orders
JUDGE_PER_EXAMPLE = 16 + 16


def _load_scale():
    spec = importlib.util.spec_from_file_location("bench_scale", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _run(tmp_path: Path, *args: str) -> dict:
    out = tmp_path / "scale.json"
    cmd = [sys.executable, str(SCRIPT), "--out", str(out), "--workdir", str(tmp_path), *args]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    return json.loads(out.read_text())


def test_synthetic_input_has_the_described_shape(tmp_path):
    scale = _load_scale()
    info = scale.write_synthetic_input(tmp_path / "in.jsonl", 200)
    rows = [json.loads(line) for line in (tmp_path / "in.jsonl").read_text().splitlines()]
    assert info["examples"] == len(rows) == 200
    assert all(r["_note"].startswith("synthetic") for r in rows)
    assert all(len(r["profile"]) == 30 for r in rows)
    assert all(3 <= len(r["rubric_aspects"]) <= 5 for r in rows)
    per_user = Counter(r["user_id"] for r in rows)
    assert info["users"] == len(per_user)
    # 3 to 5 questions per user (the last user may be cut short by the size)
    assert all(3 <= k <= 5 for k in list(per_user.values())[:-1])
    assert {r["category"] for r in rows} == set(scale.CATEGORIES)
    assert len({r["id"] for r in rows}) == 200


def test_scale_benchmark_writes_sane_figures(tmp_path):
    d = _run(tmp_path, "--sizes", str(N), "--max-seconds", "240", "--keep")
    for key in ("benchmark", "data", "workload", "server", "method", "sizes", "growth"):
        assert key in d
    assert {"cpu_count", "python", "platform"} <= set(d["machine"])
    assert "scale.py" in d["command"] and "--sizes" in d["command"]
    assert d["targets"]["peak_rss_bytes"]["met"] is True
    assert d["complete"] is True

    (size,) = d["sizes"]
    assert size["examples"] == N and size["data"] == "synthetic" and size["status"] == "ok"
    assert list(size["stages"]) == STAGES
    for name, st in size["stages"].items():
        assert st["status"] == "ok", (name, st["log_tail"])
        assert st["data"] == "synthetic"
        assert 0 < st["wall_s"] < 240
        assert 10e6 < st["peak_rss_bytes"] < 4 * 1024**3
        assert st["shard_bytes"] > 0

    # the judge asks only what the pair rules can still use: at most every verdict
    judge = size["stages"]["judge"]["llm"]["sent"]
    assert 0 < judge <= JUDGE_PER_EXAMPLE * N
    expected = {"responses": RESPONSES_PER_EXAMPLE * N, "judge": judge}
    for name, want in expected.items():
        st = size["stages"][name]
        assert st["requests"] == st["llm"]["sent"] == st["cache_rows_added"] == want
        assert st["cache_bytes"] > 0
        bare = st["bare"]
        assert bare["status"] == "ok"
        assert bare["ok"] == bare["requests"] == bare["read_requests"] == want
        assert bare["requests_per_s"] > 0 and st["pipeline_per_s"] > 0
        assert st["ratio_vs_bare"] == round(st["pipeline_per_s"] / bare["requests_per_s"], 3)

    rerun = size["cached_rerun"]
    assert rerun["status"] == "ok"
    for name, st in rerun["stages"].items():
        assert st["rows_identical_to_first_run"] is True, name
        if name in expected:
            assert st["all_cached"] is True
            assert st["llm"]["cached"] == expected[name] and st["llm"]["sent"] == 0

    # the kept size re-run by hand's way: a new stand-in (a new port), the scan timed
    (kept,) = tmp_path.glob(f"scale-*/n{N}")
    again = _run(tmp_path, "--rerun-kept", str(kept))
    assert again["sizes"] == d["sizes"]  # the run's figures kept beside it
    r = again["rerun_kept"]
    assert r["examples"] == N and set(r["ledger_scan_seconds"]) == set(expected)
    assert r["cached_rerun"]["status"] == "ok"
    for name in expected:
        assert r["cached_rerun"]["stages"][name]["all_cached"] is True
    assert r["rows_identical_with_the_url_masked"] == dict.fromkeys(STAGES, True)


def test_a_stage_past_its_budget_is_recorded_as_timed_out(tmp_path):
    d = _run(tmp_path, "--sizes", "20", "--max-seconds", "0.05")
    (size,) = d["sizes"]
    assert size["status"] == "timed out"
    assert list(size["stages"]) == ["ingest"]
    assert size["stages"]["ingest"]["timed_out"] is True
    assert "cached_rerun" not in size
    assert d["targets"]["ratio_vs_bare"] == {"min": 0.9, "values": {}, "met": None}


def test_replicated_pairs_publish_as_that_many_distinct_rows(tmp_path):
    """--replicate RUN --pairs-only: the run's kept pairs copied under new ids, the source
    run left as it was; the copy publishes as that many distinct rows."""
    import hashlib

    from conftest import write_config
    from standin_server import StandinServer
    from test_judge_pairs import responder

    from pipeline.config import load_config
    from pipeline.orchestration.orchestrate import run_pipeline
    from pipeline.publish import publish
    from pipeline.run import RunDir

    with StandinServer(responder=responder) as s:
        run_pipeline(load_config(write_config(tmp_path, s)), progress=False, echo=lambda m: 0)
    src = tmp_path / "outputs" / "t"

    def digest() -> str:
        files = sorted(p for p in src.rglob("*") if p.is_file() and "cache.sqlite" not in p.name)
        return hashlib.sha256(b"".join(p.read_bytes() for p in files)).hexdigest()

    before = digest()
    kept = len(list(RunDir(src).pair_records()))
    scale = _load_scale()
    dst = tmp_path / "copy" / "t"
    assert scale.replicate_pairs(src, dst, 3) == {"pairs": 3 * kept}
    assert digest() == before
    records = list(RunDir(dst).pair_records())
    assert (
        len({r["pair_id"] for r in records}) == len({r["example_id"] for r in records}) == 3 * kept
    )
    result = publish(None, dst, out_dir=tmp_path / "release")
    assert result["rows"] == 3 * kept


def test_targets_are_also_judged_at_the_largest_size_alone():
    """Start-up weighs on the smallest size's rate and re-run share: the targets are checked
    on every size, and under ``at_largest`` on the largest one (growth: the step into it)."""
    scale = _load_scale()

    def size(n, responses, rerun):
        return {
            "examples": n,
            "status": "ok",
            "stages": {
                "responses": {"ratio_vs_bare": responses, "peak_rss_bytes": 100},
                "judge": {"ratio_vs_bare": 1.3, "peak_rss_bytes": 200},
            },
            "commands": {"audit": {"peak_rss_bytes": 300}},
            "cached_rerun": {"time_vs_first_run": rerun, "peak_rss_bytes": 50},
        }

    sizes = [size(1000, 0.74, 0.12), size(100000, 0.95, 0.08)]
    grow = [
        {"from": 1000, "to": 10000, "stages": {"audit": {"growth": 1.3}}},
        {"from": 10000, "to": 100000, "stages": {"audit": {"growth": 1.1}}},
    ]
    t = scale.targets(sizes, grow)
    assert [t[k]["met"] for k in ("ratio_vs_bare", "growth", "cached_rerun_vs_first")] == [
        False,
        False,
        False,
    ]
    top = t["at_largest"]
    assert top["examples"] == 100000
    assert top["ratio_vs_bare"]["values"] == {"100000/responses": 0.95, "100000/judge": 1.3}
    assert top["growth"]["worst_stage"] == {"10000->100000": 1.1}
    assert top["peak_rss_bytes"]["values"] == {100000: 300}
    assert all(top[k]["met"] is True for k in top if k != "examples")
    # one size measured: nothing more to say
    assert "at_largest" not in scale.targets(sizes[:1], [])
