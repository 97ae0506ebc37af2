"""publish: a real run's kept pairs become a release that `datasets` loads offline, with
the reference columns and types, one config per category plus `all`, only the pairs the
policy allows, no secret, and nothing half-written when it fails."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml
from conftest import write_config
from standin_server import StandinServer
from test_judge_pairs import responder

from pipeline.cli import main
from pipeline.config import load_config
from pipeline.core.errors import PipelineError, StageError
from pipeline.orchestration.orchestrate import run_pipeline
from pipeline.publish import DATA_FILE, publish
from pipeline.run import RunDir

REFERENCE = ["id", "question", "profile", "rubric_aspects", "narrative", "category"]
REFERENCE += ["chosen", "rejected"]
FAKE_SECRETS = {
    "OPENAI_API_KEY": "sk-fake-openai-0123456789abcdef",
    "LABEL_STUDIO_API_KEY": "ls-fake-token-abcdef0123456789",
    "HF_TOKEN": "hf_fakeTokenForTests0123456789",
}


@pytest.fixture(scope="module")
def base_run(tmp_path_factory) -> Path:
    """A run through the pairs stage against the stand-in server: 10 kept pairs."""
    tmp = tmp_path_factory.mktemp("run")
    with StandinServer(responder=responder) as s:
        stats = run_pipeline(load_config(write_config(tmp, s)), progress=False, echo=lambda m: 0)
    assert stats["pairs"]["kept"] >= 6
    return tmp / "outputs" / "t"


@pytest.fixture
def run(base_run, tmp_path) -> Path:
    """A private copy of the run, so a test may add annotation rounds to it."""
    dst = tmp_path / "outputs" / "t"
    shutil.copytree(base_run, dst)
    return dst


def kept_pairs(run: Path) -> list[dict]:
    return list(RunDir(run).stage("pairs").rows())


def write_round(run: Path, name: str, verdicts: list[dict], agreement: dict | None = None):
    d = run / "annotate" / name
    d.mkdir(parents=True, exist_ok=True)
    (d / "verdicts.jsonl").write_text("".join(json.dumps(v) + "\n" for v in verdicts))
    if agreement is not None:
        (d / "agreement.json").write_text(json.dumps(agreement))


def verdict(pair_id: str, status: str, majority: str | None = "chosen", n: int = 3) -> dict:
    share = 1.0 if status == "verified" else 0.5
    return {
        "pair_id": pair_id,
        "n_votes": n,
        "majority": majority,
        "share": share,
        "status": status,
    }


def load_offline(out: Path, configs: list[str], cache: Path) -> dict:
    """Load each config in a fresh interpreter with the Hub switched off."""
    code = f"""
import json, sys
from datasets import load_dataset
res = {{}}
for name in {configs!r}:
    ds = load_dataset({str(out)!r}, name, split="test", cache_dir={str(cache)!r})
    res[name] = {{
        "rows": len(ds),
        "columns": ds.column_names,
        "features": ds.features.to_dict(),
        "pair_ids": list(ds["pair_id"]),
        "ids": list(ds["id"]),
    }}
print(json.dumps(res))
"""
    env = {
        **os.environ,
        "HF_DATASETS_OFFLINE": "1",
        "HF_HUB_OFFLINE": "1",
        "HF_HOME": str(cache / "home"),
    }
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=240
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_release_loads_offline_with_reference_schema(run, tmp_path):
    from datasets import Features, List, Value

    res = publish(None, run, policy="filtered")
    out = run / "publish"
    assert res["out"] == str(out)
    pairs = kept_pairs(run)
    per_cat = Counter(p["category"] for p in pairs)
    assert res["configs"] == {"all": len(pairs), **per_cat}
    assert len(per_cat) == 3  # the sample covers the reference's three categories

    loaded = load_offline(out, list(res["configs"]), tmp_path / "hf-cache")
    s = Value("string")
    expected = Features(
        {
            "id": s,
            "question": s,
            "profile": List({"id": s, "category": s, "text": s}),
            "rubric_aspects": List({"aspect": s, "evidence": s, "reason": s}),
            "narrative": s,
            "category": s,
            "chosen": s,
            "rejected": s,
        }
    )
    for name, got in loaded.items():
        feats = Features.from_dict(got["features"])
        assert got["columns"][:8] == REFERENCE
        assert Features({k: feats[k] for k in REFERENCE}) == expected
        assert got["rows"] == (len(pairs) if name == "all" else per_cat[name])
    assert sorted(loaded["all"]["pair_ids"]) == sorted(p["pair_id"] for p in pairs)
    # `id` is the source example's own id, one per pair
    ingest = {e["example_id"]: e for e in RunDir(run).stage("ingest").rows()}
    assert sorted(loaded["all"]["ids"]) == sorted(
        ingest[p["example_id"]]["source_id"] for p in pairs
    )

    # the row carries the example in full and the generator's provenance
    table = pq.read_table(out / "all" / DATA_FILE).to_pylist()
    row = next(r for r in table if r["pair_id"] == pairs[0]["pair_id"])
    ex = ingest[pairs[0]["example_id"]]
    assert row["profile"] == ex["profile"] and row["narrative"] == ex["narrative"]
    assert [a["aspect"] for a in row["rubric_aspects"]] == [
        a["aspect"] for a in ex["rubric_aspects"]
    ]
    gen = pairs[0]["provenance"]["generator"]
    assert row["seeds"] == {"chosen": gen["chosen"]["seed"], "rejected": gen["rejected"]["seed"]}
    # the stand-in is credited as what it is, never as the model name it was asked under
    credit = "not a model: custom answers (requested as standin-model)"
    assert row["generator_model"] == credit and row["judge_model"] == credit
    hashes = json.loads(row["template_hashes"])
    assert hashes["chosen"]["template_hash"] == gen["chosen"]["template_hash"]
    assert json.loads(row["sampling"])["chosen"]["temperature"] == 0.8
    assert set(row["violated_item_ids"]) <= set(row["rubric_item_ids"])
    assert row["quality_chosen"]["correctness"] == 4 and row["coverage_chosen_mean"] == 2.0
    assert row["human_verdict"] is None and row["human_votes"] == 0


def test_card_header_and_contents(run, tmp_path):
    publish(None, run, policy="filtered", out_dir=tmp_path / "rel", license="cc-by-nc-4.0")
    card = (tmp_path / "rel" / "README.md").read_text(encoding="utf-8")
    assert card.startswith("---\n")
    header = yaml.safe_load(card.split("---\n")[1])
    assert header["license"] == "cc-by-nc-4.0"
    assert header["size_categories"] == ["n<1K"] and header["task_categories"]
    assert header["pretty_name"]
    configs = {c["config_name"]: c["data_files"][0] for c in header["configs"]}
    assert set(configs) == {p.name for p in (tmp_path / "rel").iterdir() if p.is_dir()}
    for files in configs.values():
        assert files["split"] == "test" and (tmp_path / "rel" / files["path"]).is_file()
    assert next(c for c in header["configs"] if c.get("default"))["config_name"] == "all"

    body = " ".join(card.split())
    assert "`rubric_aspects` and `narrative` must never be given to a reward model" in body
    assert "refuted** are excluded under every policy" in body
    stats = json.loads((run / "pairs" / "stats.json").read_text())
    assert f"| examples entering the pair stage | {stats['examples']} |" in card
    assert f"| dropped by filter `meta_text` | {stats['dropped_by_reason']['meta_text']} |" in card
    env = json.loads((run / "environment.json").read_text())
    # thresholds and library versions are tables, not one JSON line each (issue 12, item 9)
    assert f"| rapidfuzz | {env['rapidfuzz']} | n/a |" in card
    assert "| `quality_floor` | 4 |" in card and "| `length_ratio_min` | 0.67 |" in card
    assert '{"coverage_chosen_min"' not in card and '{"python"' not in card
    # no model answered (the stand-in did) and the sample input is hand-written: the first
    # two paragraphs say so
    first, second = card.split("\n# ", 1)[1].split("\n\n")[1:3]
    assert "**Not model output.**" in first and "stand-in server" in first
    assert "hand-written sample input (`examples/sample_lamp.jsonl`)" in " ".join(second.split())
    assert "standin-model" in card and "What decides the output" in card
    release = json.loads((tmp_path / "rel" / "release.json").read_text())
    assert release["license"] == "cc-by-nc-4.0" and release["funnel"]["kept"] == stats["kept"]


def test_policies_follow_the_latest_verdict(run, tmp_path):
    ids = [p["pair_id"] for p in kept_pairs(run)]
    a, b, c, d = ids[:4]
    # round-10 comes after round-2 (numeric, not text order) and its verdicts win
    write_round(
        run,
        "round-2",
        [
            verdict(a, "verified"),
            verdict(b, "refuted", "rejected"),
            verdict(c, "unresolved", None),
            verdict(d, "verified"),
            verdict("gold-task-1", "verified"),  # not a kept pair: ignored
        ],
        {
            "items": 5,
            "annotators": 3,
            "krippendorff_alpha": 0.613,
            "raw_agreement": 0.8,
            "human_vs_judge": {"n": 4, "agreement": 0.75, "kappa": 0.4},
            "pairwise_kappa": {"alice|bob": {"annotators": ["alice", "bob"], "kappa": 0.5}},
            "gold_accuracy": {"alice": {"n": 2, "correct": 2, "accuracy": 1.0}},
            "gold_accuracy_overall": 0.9,
            "majority": {a: {"label": "chosen", "share": 1.0}},
            "counts": {"url": "http://127.0.0.1:8089", "project_id": 7},
        },
    )
    write_round(run, "round-10", [verdict(c, "verified"), verdict(d, "refuted", "both_bad")])

    res = publish(None, run, policy="verified", out_dir=tmp_path / "verified")
    got = {
        r["pair_id"]: r
        for r in pq.read_table(tmp_path / "verified" / "all" / DATA_FILE).to_pylist()
    }
    assert set(got) == {a, c}
    assert res["excluded"] == {"refuted": 2, "not_annotated": len(ids) - 4}
    assert got[c]["human_verdict"] == "verified" and got[c]["human_round"] == 10
    assert got[a]["human_votes"] == 3 and got[a]["human_agreement"] == 1.0
    assert sum(res["configs"].values()) == 2 * res["rows"]  # each row in `all` and its category

    res = publish(None, run, policy="filtered", out_dir=tmp_path / "filtered")
    got = {
        r["pair_id"]: r
        for r in pq.read_table(tmp_path / "filtered" / "all" / DATA_FILE).to_pylist()
    }
    assert set(got) == set(ids) - {b, d}  # refuted pairs are never published
    assert res["excluded"] == {"refuted": 2}
    assert got[ids[4]]["human_verdict"] is None and got[ids[4]]["human_votes"] == 0

    card = (tmp_path / "filtered" / "README.md").read_text(encoding="utf-8")
    assert "| round-2 | 5 | 3 | 0.613 | 0.800 | 0.750 | 0.900 |" in card
    assert "| excluded at publish: refuted | 2 |" in card
    for f in (tmp_path / "filtered").rglob("*"):  # annotator names stay out of the release
        if f.is_file():
            data = f.read_bytes()
            assert b"alice" not in data and b"127.0.0.1:8089" not in data


def test_verified_without_verdicts_is_a_clear_error(run, tmp_path, capsys):
    with pytest.raises(PipelineError, match="no pair passes policy 'verified'"):
        publish(None, run, policy="verified", out_dir=tmp_path / "rel")
    assert not (tmp_path / "rel").exists()
    rc = main(["publish", str(run), "--policy", "verified", "--out", str(tmp_path / "rel")])
    assert rc == 1 and "no pair passes" in capsys.readouterr().err


def test_bad_verdict_row_names_file_and_line(run, tmp_path):
    pid = kept_pairs(run)[0]["pair_id"]
    write_round(run, "round-1", [verdict(pid, "verified"), {"pair_id": pid, "status": "maybe"}])
    with pytest.raises(PipelineError) as err:
        publish(None, run, out_dir=tmp_path / "rel")
    assert "verdicts.jsonl" in str(err.value) and "line 2" in str(err.value)


def test_no_secret_in_any_file(run, tmp_path, monkeypatch):
    for name, value in FAKE_SECRETS.items():
        monkeypatch.setenv(name, value)
    out = tmp_path / "rel"
    publish(None, run, out_dir=out)
    files = [f for f in out.rglob("*") if f.is_file()]
    assert len(files) >= 6  # README, release.json, all + three categories
    for f in files:
        data = f.read_bytes()
        for value in FAKE_SECRETS.values():
            assert value.encode() not in data, f"{f} holds a secret"


def _leftovers(parent: Path) -> list[str]:
    return [p.name for p in parent.iterdir() if p.name.startswith(".")]


def test_secret_in_the_data_stops_the_publish(run, tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", FAKE_SECRETS["OPENAI_API_KEY"])
    shard = run / "pairs" / "data-00000.jsonl"
    rows = [json.loads(x) for x in shard.read_text().splitlines()]
    rows[1]["chosen"] += " key " + FAKE_SECRETS["OPENAI_API_KEY"]
    shard.write_text("".join(json.dumps(r) + "\n" for r in rows))
    pairs = RunDir(run).stage("pairs")
    pairs.finish(pairs.stats())  # a manifest that matches: the secret check must catch it
    out = tmp_path / "rel"
    with pytest.raises(PipelineError, match="OPENAI_API_KEY") as err:
        publish(None, run, out_dir=out)
    assert FAKE_SECRETS["OPENAI_API_KEY"] not in str(err.value)  # names it, never shows it
    assert not out.exists() and _leftovers(tmp_path) == []


def test_failure_midway_keeps_the_previous_release(run, tmp_path, monkeypatch):
    import pipeline.publish.make as pub  # the module that renders the card mid-publish

    out = tmp_path / "rel"
    publish(None, run, out_dir=out)
    before = {str(f.relative_to(out)): f.read_bytes() for f in out.rglob("*") if f.is_file()}

    def boom(summary):
        raise RuntimeError("disk full")

    monkeypatch.setattr(pub, "render_card", boom)  # after the parquet files are written
    with pytest.raises(RuntimeError, match="disk full"):
        publish(None, run, policy="filtered", out_dir=out, license="mit", force=True)
    after = {str(f.relative_to(out)): f.read_bytes() for f in out.rglob("*") if f.is_file()}
    assert after == before
    assert _leftovers(tmp_path) == []

    fresh = tmp_path / "fresh"
    with pytest.raises(RuntimeError):
        publish(None, run, out_dir=fresh)
    assert not fresh.exists() and _leftovers(tmp_path) == []


def test_push_without_token_fails_before_anything(run, tmp_path, monkeypatch):
    import huggingface_hub

    monkeypatch.delenv("HF_TOKEN", raising=False)
    calls = []

    class Recorder:
        def __init__(self, *a, **k):
            calls.append(("init", a, k))

        def __getattr__(self, name):
            calls.append(name)
            return lambda *a, **k: None

    monkeypatch.setattr(huggingface_hub, "HfApi", Recorder)
    out = tmp_path / "rel"
    with pytest.raises(PipelineError, match="HF_TOKEN"):
        publish(None, run, out_dir=out, push_to_hub="someone/prb")
    assert calls == [] and not out.exists()
    rc = main(["publish", str(run), "--out", str(out), "--push-to-hub", "someone/prb"])
    assert rc == 1 and calls == [] and not out.exists()


def test_unfinished_pairs_stage_is_refused(run, tmp_path):
    (run / "pairs" / "_DONE.json").unlink()
    with pytest.raises(StageError, match="stage 'pairs' has not finished"):
        publish(None, run, out_dir=tmp_path / "rel")
    assert not (tmp_path / "rel").exists()


def test_cli_publish_from_config_then_audit(run, tmp_path, capsys):
    cfg = run.parent.parent / "config.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "run": {"name": "t", "output_dir": str(run.parent), "seed": 0},
                "input": {
                    "format": "lamp",
                    "path": str(Path(__file__).parent.parent / "examples" / "sample_lamp.jsonl"),
                },
            }
        )
    )
    assert main(["publish", str(cfg)]) == 0
    out = capsys.readouterr().out
    assert f"published {len(kept_pairs(run))} pairs (policy filtered)" in out
    assert (run / "publish" / "all" / DATA_FILE).exists()

    assert main(["audit", str(run)]) == 0  # a run directory: its release, report beside it
    report = json.loads((run / "report" / "audit.json").read_text())
    assert report["source"]["format"] == "release"
    assert report["n_pairs"] == len(kept_pairs(run))
    assert report["coverage_gap"]["mean_gap"] == 2.0  # the responder's judge: 2 vs 0
    assert report["leakage"]["share_tie"] == 1.0  # its rubric-blind judge always ties


# ---- loading a local release by its folder (issue 21) ---------------------------------

LOADER = """
import json, sys
from datasets import load_dataset
res = []
for job in json.loads(sys.argv[1]):
    if job["config"] == "parquet":  # the card's other local route: the parquet files
        ds = load_dataset("parquet", data_files={"test": job["path"] + "/all/*.parquet"},
                          split="test")
    else:  # the reference scripts' call, nothing added: load_dataset(path, SUBSET, split)
        ds = load_dataset(job["path"], job["config"], split="test")
    out = {**job, "columns": ds.column_names, "pair_ids": sorted(ds["pair_id"])}
    if job.get("save_to"):  # a user who keeps a loaded copy with save_to_disk
        from datasets import load_from_disk
        ds.save_to_disk(job["save_to"])
        out["reloaded"] = sorted(load_from_disk(job["save_to"])["pair_id"])
    res.append(out)
print(json.dumps(res))
"""


def load_by_folder(jobs: list[dict], cache: Path) -> list[dict]:
    """Run the loads in a fresh interpreter whose `datasets` cache is ``cache`` (set through
    the environment, as a user's would be: the load calls pass no extra argument)."""
    env = {
        **os.environ,
        "HF_DATASETS_OFFLINE": "1",
        "HF_HUB_OFFLINE": "1",
        "HF_HOME": str(cache / "home"),
        "HF_DATASETS_CACHE": str(cache / "datasets"),
    }
    proc = subprocess.run(
        [sys.executable, "-c", LOADER, json.dumps(jobs)],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def release_pair_ids(out: Path) -> dict[str, list[str]]:
    """Config name -> the pair ids its parquet file holds, read with pyarrow alone."""
    return {
        d.name: sorted(pq.read_table(d / DATA_FILE, columns=["pair_id"])["pair_id"].to_pylist())
        for d in out.iterdir()
        if d.is_dir()
    }


def test_two_releases_in_folders_of_one_name_load_their_own_rows(run, tmp_path):
    from pipeline.audit import load_pairs
    from pipeline.publish import REFERENCE_SUBSETS

    pairs = kept_pairs(run)
    ids = [p["pair_id"] for p in pairs]
    one_per_category = list({p["category"]: p["pair_id"] for p in pairs}.values())
    first = tmp_path / "a" / "publish"
    second = tmp_path / "b" / "publish"
    publish(None, run, policy="filtered", out_dir=first)
    write_round(run, "round-1", [verdict(i, "verified") for i in one_per_category])
    publish(None, run, policy="verified", out_dir=second)
    want = {first: release_pair_ids(first), second: release_pair_ids(second)}
    assert len(want[first]["all"]) == len(ids) and len(want[second]["all"]) == 3
    # both have the reference's three subsets, under its names: the same configs, other rows
    assert set(want[first]) == set(want[second]) == {"all", *REFERENCE_SUBSETS}

    def jobs(out: Path) -> list[dict]:
        return [{"path": str(out), "config": name} for name in sorted(want[out])]

    # one cache for both, each release loaded in its own process (as two users on one
    # machine would): the second must not be served the first one's cached rows
    shared = tmp_path / "shared-cache"
    loaded = load_by_folder(jobs(first), shared) + load_by_folder(jobs(second), shared)
    # and the second release alone, in a cache of its own
    loaded += load_by_folder(jobs(second), tmp_path / "fresh-cache")
    for got in loaded:
        out = Path(got["path"])
        assert got["pair_ids"] == want[out][got["config"]], (got["path"], got["config"])
        assert got["columns"][:8] == REFERENCE

    # the same folder published again with other rows: its new rows, through the same cache
    refuted = next(i for i in ids if i not in one_per_category)
    write_round(run, "round-2", [verdict(refuted, "refuted", "rejected")])
    publish(None, run, policy="filtered", out_dir=first, force=True)  # an explicit --out
    want[first] = release_pair_ids(first)
    assert len(want[first]["all"]) == len(ids) - 1
    again = load_by_folder(
        [
            *jobs(first),
            {"path": str(first), "config": "parquet"},
            {"path": str(second), "config": "parquet"},
            {"path": str(first), "config": "all", "save_to": str(tmp_path / "saved")},
        ],
        shared,
    )
    for got in again:
        out = Path(got["path"])
        assert got["pair_ids"] == want[out]["all" if got["config"] == "parquet" else got["config"]]
    assert again[-1]["reloaded"] == want[first]["all"]
    # the project's own readers (audit, eval) read the folder's parquet directly
    rows, source = load_pairs(first)
    assert source["format"] == "release"
    assert sorted(r["pair_id"] for r in rows) == want[first]["all"]


def test_card_names_each_data_file_by_digest_and_tells_how_to_push(run, tmp_path):
    from pipeline.core.io import file_digest

    out = tmp_path / "rel"
    publish(None, run, out_dir=out)
    card = (out / "README.md").read_text(encoding="utf-8")
    header = yaml.safe_load(card.split("---\n")[1])
    release = json.loads((out / "release.json").read_text())
    for entry in header["configs"]:
        name = entry["config_name"]
        digest, size, _ = file_digest(out / name / DATA_FILE)
        assert digest in entry["description"]
        assert release["data_files"][name] == {
            "path": f"{name}/{DATA_FILE}",
            "sha256": digest,
            "bytes": size,
        }
    body = " ".join(card.split())
    assert 'load_dataset("<this folder>", "Art_and_Entertainment", split="test")' in body
    assert "--push-to-hub" in body and "Society_and_Culture" in body


def test_the_streamed_release_is_the_whole_table_written_at_once(run, tmp_path, monkeypatch):
    """`prb publish` reads the kept pairs twice (where each is, then one at a time in the
    release's order) and builds each config's columns from batches: every parquet file is
    byte for byte the one the whole table of rows gives, built and written at once (what
    publish did before it streamed), and the card's figures are those of all the rows."""
    import io

    import pyarrow as pa

    from pipeline.publish import make
    from pipeline.publish.card import config_name
    from pipeline.release import build_row, features

    monkeypatch.setattr(make._Columns, "BATCH", 3)  # several batches to join per config
    out = tmp_path / "release"
    publish(None, run, out_dir=out)
    rows = [build_row(r, None) for r in RunDir(run).pair_records()]
    rows.sort(key=lambda r: (r["category"] or "", r["id"]))
    configs: dict[str, list[dict]] = {"all": rows}
    for r in rows:
        configs.setdefault(config_name(r["category"]), []).append(r)
    assert len(rows) > 2 * make._Columns.BATCH and len(configs) >= 3
    for name, part in configs.items():
        whole = io.BytesIO()
        pq.write_table(pa.Table.from_pylist(part, schema=features().arrow_schema), whole)
        assert (out / name / DATA_FILE).read_bytes() == whole.getvalue(), name
    summary = json.loads((out / "release.json").read_text())
    assert summary["configs"] == {name: len(part) for name, part in configs.items()}
    assert summary["per_category"] == {
        str(c): {"pairs": n, "verified": 0} for c, n in Counter(r["category"] for r in rows).items()
    }
    prov = summary["provenance"]
    assert prov["generator_models"] == sorted({r["generator_model"] for r in rows})
    assert prov["judge_models"] == sorted({r["judge_model"] for r in rows})


def test_a_pair_changed_while_publishing_stops_it(run, tmp_path, monkeypatch):
    """The second read of a pair is checked against the first: a pairs shard changed in
    between stops the publish with one line naming the shard and line, nothing written."""
    first = RunDir.located_pair_records

    def then_changed(self):
        yield from first(self)
        shard = sorted((run / "pairs").glob("data-*.jsonl"))[0]
        lines = shard.read_bytes().splitlines(keepends=True)
        lines[0] = lines[0].replace(b'"margin":', b'"margin": ')
        shard.write_bytes(b"".join(lines))

    monkeypatch.setattr(RunDir, "located_pair_records", then_changed)
    out = tmp_path / "release"
    with pytest.raises(PipelineError, match=r"data-\d+\.jsonl, line 1: changed while"):
        publish(None, run, out_dir=out)
    assert not out.exists() and _leftovers(tmp_path) == []
