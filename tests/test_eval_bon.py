"""`prb eval bon` on the sample release (configs/sample.yaml against the stand-in server,
published), three tiny reward models and the stand-in as policy, generative scorer and
judge: end to end into `prb eval correlate`, the figures recomputed here from the files it
wrote, kills in every phase resumed without a request sent twice, and bad input refused in
one line with nothing written.

The sample input is hand-written, the stand-in answers by rule and the reward models have
random weights (tests/bon_setup.py): the figures measure the machinery only."""

from __future__ import annotations

import asyncio
import csv
import json
import multiprocessing
import os
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from bon_setup import ROOT, backend_args, bon_args, build_models, build_release, curves
from conftest import disk_state
from standin_server import StandinServer

from pipeline.cli import main
from pipeline.eval.bon import SAMPLE_SYSTEM
from pipeline.eval.generative import JUDGE_SYSTEM


class Gate:
    """The stand-in's responder: holds every request of one phase past the first ``after``
    (it never answers them) until ``release``; the player answers everything else."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.match: Any = None
        self.after = 0
        self.seen = 0
        self.held: list[str] = []
        self.open = threading.Event()

    def arm(self, match: Any, after: int) -> None:
        with self.lock:
            self.match, self.after, self.seen, self.held = match, after, 0, []
            self.open.clear()

    def release(self) -> None:
        with self.lock:
            self.match = None
        self.open.set()

    async def __call__(self, body: dict[str, Any], _: int) -> None:
        with self.lock:
            if self.match is None or not self.match(body):
                return None
            self.seen += 1
            hold = self.seen > self.after
            if hold:
                self.held.append(key(body))
        while hold and not self.open.is_set():
            await asyncio.sleep(0.01)
        return None


def key(body: dict[str, Any]) -> str:
    """What makes a request itself (the cache key's parts as sent)."""
    parts = [body.get(k) for k in ("model", "messages", "seed", "max_tokens", "temperature")]
    return json.dumps([*parts, body.get("response_format")], sort_keys=True)


def _system(body: dict[str, Any]) -> str:
    return next((m["content"] for m in body["messages"] if m["role"] == "system"), "")


def _user(body: dict[str, Any]) -> str:
    return next((m["content"] for m in body["messages"] if m["role"] == "user"), "")


PHASES = {
    "sample": lambda b: _system(b) == SAMPLE_SYSTEM,
    "score": lambda b: _system(b) == JUDGE_SYSTEM and "one number between 0 and 1" in _user(b),
    "judge": lambda b: _system(b) == JUDGE_SYSTEM and "square brackets" in _user(b),
}


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    gate = Gate()
    with StandinServer(responder=gate) as server:
        tmp = tmp_path_factory.mktemp("bon")
        release = build_release(tmp, server.base_url)
        models = build_models(release, tmp / "models", 4)
        # each scorer's benchmark accuracy, question only (the reference's protocol)
        specs = [a for m in models[:3] for a in ("--scorer", f"rm:{m}")]
        specs += ["--scorer", "gen:standin-model,name=standin-gen"]
        args = ["eval", str(release), *specs, "--setting", "question", "--no-progress"]
        assert main([*args, "--bootstrap", "50", *backend_args(server.base_url)]) == 0
        yield {
            "tmp": tmp,
            "release": release,
            "models": models[:3],
            "fourth": models[3],
            "server": server,
            "gate": gate,
            "eval_root": tmp / "sample" / "eval",
        }


@pytest.fixture(scope="module")
def reference(world: dict[str, Any]) -> dict[str, Any]:
    """One uninterrupted run, and every request it sent."""
    server = world["server"]
    out = world["tmp"] / "bon-reference"
    server.reset()
    assert main(bon_args(world["release"], world["models"], server.base_url, out)) == 0
    return {"out": out, "bodies": [r["body"] for r in server.requests]}


def _jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines() if x]


def test_bon_then_correlate_end_to_end(
    world: dict[str, Any], reference: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    out, bodies = reference["out"], reference["bodies"]
    doc = json.loads((out / "bon.json").read_text(encoding="utf-8"))
    q, n = doc["questions"], doc["n"]
    assert q >= 6 and n == 4 and doc["ks"] == [1, 2, 4]
    # every request distinct; N samples per question, each its own seed
    assert len({key(b) for b in bodies}) == len(bodies)
    samples = [b for b in bodies if PHASES["sample"](b)]
    assert len(samples) == q * n and len({b["seed"] for b in samples}) == q * n
    assert all(b["temperature"] == 1.0 and b["top_p"] == 0.9 and b["max_tokens"] == 512
               for b in samples)  # fmt: skip

    # best-of-k recomputed from the scores: the first maximum of the first k samples
    scores: dict[tuple[str, str], list[float]] = {}
    for r in _jsonl(out / "scores.jsonl"):
        scores.setdefault((r["scorer"], r["question"]), [0.0] * n)[r["sample"]] = r["score"]
    picks = _jsonl(out / "picks.jsonl")
    assert len(picks) == 4 * q * 3  # scorers x questions x k
    for p in picks:
        row = scores[(p["scorer"], p["question"])][: p["k"]]
        assert p["sample"] == row.index(max(row)), p
    # each distinct picked answer judged once: one request per distinct (question, text)
    texts = {(r["question"], r["sample"]): r["text"] for r in _jsonl(out / "samples.jsonl")}
    picked = {(p["question"], p["sample"]) for p in picks}
    verdicts = {(v["question"], v["sample"]): v for v in _jsonl(out / "verdicts.jsonl")}
    assert set(verdicts) == picked
    judge_requests = [b for b in bodies if PHASES["judge"](b)]
    assert len(judge_requests) == len({(qk, texts[(qk, i)]) for qk, i in picked})
    assert doc["judge"]["judged_answers"] == len(picked) < len(picks)
    # the means: over questions, of the judge's mean over aspects of each pick
    for block in doc["scorers"]:
        fig = block["curves"]["profile"]
        for k in (1, 2, 4):
            mine = [
                verdicts[(p["question"], p["sample"])]["score"]
                for p in picks
                if p["scorer"] == block["name"] and p["k"] == k
            ]
            assert fig["all"]["k"][str(k)]["mean"] == pytest.approx(statistics.fmean(mine))
            assert fig["all"]["k"][str(k)]["questions"] == q
    # k = 1 is sample 0 for every scorer
    assert {p["sample"] for p in picks if p["k"] == 1} == {0}

    # the table joins each scorer's prb eval accuracy, per subset
    with open(out / "correlate-profile.csv", encoding="utf-8") as fh:
        table = list(csv.DictReader(fh))
    names = {b["name"] for b in doc["scorers"]}
    assert {r["model"] for r in table} == names
    res = json.loads(
        (world["eval_root"] / "rm-tiny-rm-0" / "question" / "results.json").read_text()
    )
    cats = res["settings"]["question"]["metrics"]["by"]["category"]
    for r in table:
        if r["model"] == "tiny-rm-0":
            assert float(r["accuracy"]) == cats[r["subset"]]["accuracy"]
        block = next(b for b in doc["scorers"] if b["name"] == r["model"])
        assert float(r["bon_k4"]) == block["curves"]["profile"][r["subset"]]["k"]["4"]["mean"]
    # prb eval correlate reads it: the four metrics per subset and overall
    capsys.readouterr()
    assert main(["eval", "correlate", str(out / "correlate-profile.csv"), "--bootstrap", "50"]) == 0
    got = json.loads((out / "correlate-profile-correlate.json").read_text())
    assert {r["subset"] for r in got["correlations"]} >= {"overall"}
    assert all(set(r["metrics"]) == {"spearman", "kendall_tau_weighted", "ndcg", "rbo"}
               for r in got["correlations"] if r["metrics"])  # fmt: skip
    assert (out / "report.html").read_text().count("<polyline") >= 1


def test_a_rerun_sends_nothing_and_another_scorer_draws_no_sample(
    world: dict[str, Any], reference: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    server, out = world["server"], world["tmp"] / "bon-rerun"
    shutil.copytree(reference["out"], out)
    server.reset()
    capsys.readouterr()
    assert main(bon_args(world["release"], world["models"], server.base_url, out)) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("prb eval bon:")  # the plan first
    assert "at the reference's size (2,830 questions, N=16)" in printed
    assert server.request_count == 0
    assert curves(out) == curves(reference["out"])
    # a fourth reward model: nothing is drawn again, only its picks are judged
    models = [*world["models"], world["fourth"]]
    assert main(bon_args(world["release"], models, server.base_url, out)) == 0
    assert not [r for r in server.requests if PHASES["sample"](r["body"])]
    assert not [r for r in server.requests if PHASES["score"](r["body"])]
    doc = json.loads((out / "bon.json").read_text())
    assert "tiny-rm-3" in [b["name"] for b in doc["scorers"]]


def test_the_json_coverage_judge_reads_its_verdicts(
    world: dict[str, Any], reference: dict[str, Any]
) -> None:
    server, out = world["server"], world["tmp"] / "bon-json"
    shutil.copytree(reference["out"], out)
    server.reset()
    args = bon_args(world["release"], world["models"], server.base_url, out)
    assert main([*args, "--judge-format", "json"]) == 0
    bodies = [r["body"] for r in server.requests]
    # the samples and scores are cached: only the judge is asked, under its JSON schema
    assert bodies and all(b["response_format"]["type"] == "json_schema" for b in bodies)
    assert all("P1:" in _user(b) for b in bodies)  # the coverage prompt's labelled points
    db = sqlite3.connect(f"file:{out / 'cache.sqlite'}?mode=ro", uri=True)
    try:
        answers = {
            k: json.loads(json.loads(r)["choices"][0]["text"])["scores"]
            for k, r in db.execute(
                "SELECT key, response FROM responses WHERE stage='bon-judge' "
                "AND request LIKE '%CoverageVerdict%'"
            )
        }
    finally:
        db.close()
    verdicts = _jsonl(out / "verdicts.jsonl")
    assert len(answers) == len(bodies) == len({v["request"] for v in verdicts})
    for v in verdicts:
        scores = list(answers[v["request"]].values())
        assert v["scores"] == scores and set(scores) <= {0, 1, 2}
        assert v["score"] == pytest.approx(statistics.fmean(scores))
    doc = json.loads((out / "bon.json").read_text())
    assert doc["judge"]["format"] == "json" and doc["judge"]["unjudged_questions"] == []


def _cached_keys(cache: Path) -> set[str]:
    """The request of every answer the cache holds, as the server saw it."""
    db = sqlite3.connect(f"file:{cache}?mode=ro", uri=True)
    try:
        rows = [json.loads(r) for (r,) in db.execute("SELECT request FROM responses")]
    finally:
        db.close()
    out = set()
    for r in rows:
        body = {
            "model": r["model"],
            "messages": r["messages"],
            "seed": r["seed"],
            "max_tokens": r["max_tokens"],
            "temperature": r["temperature"],
            "response_format": None,
        }
        out.add(key(body))
    return out


def _env() -> dict[str, str]:
    paths = [str(ROOT), str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}


@pytest.mark.parametrize(("phase", "after"), [("sample", 10), ("score", 6), ("judge", 4)])
def test_sigkill_in_a_phase_then_the_same_command(
    world: dict[str, Any], reference: dict[str, Any], phase: str, after: int
) -> None:
    server, gate = world["server"], world["gate"]
    out = world["tmp"] / f"bon-kill-{phase}"
    args = bon_args(world["release"], world["models"], server.base_url, out)
    server.reset()
    gate.arm(PHASES[phase], after)
    proc = subprocess.Popen([sys.executable, "-m", "pipeline.cli", *args], env=_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)  # fmt: skip
    deadline = time.monotonic() + 600  # generous: a busy machine starts torch slowly
    try:
        while gate.seen <= after:  # until one request of the phase is held, unanswered
            assert proc.poll() is None, proc.stderr.read().decode()[-3000:]  # type: ignore[union-attr]
            assert time.monotonic() < deadline, "the command never reached the phase"
            time.sleep(0.01)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        gate.release()
    killed = [r["body"] for r in server.requests]
    held = set(gate.held)
    assert 1 <= len(held) <= 4  # at most max_concurrency in flight
    assert not (out / "bon.json").exists()  # nothing but the cache was written
    answered_before = _cached_keys(out / "cache.sqlite")
    assert not held & answered_before
    assert sum(PHASES[phase](b) for b in killed) < sum(
        PHASES[phase](b) for b in reference["bodies"]
    ), "the kill must land before the phase ends"

    server.reset()
    assert main(args) == 0
    resumed = [r["body"] for r in server.requests]
    # no request whose answer was in the cache is sent again; only those in flight at the
    # kill (sent, their answer not committed yet: held by the gate, or on their way back)
    counts = Counter(key(b) for b in killed + resumed)
    again = {k for k, c in counts.items() if c > 1}
    assert not again & answered_before
    assert held <= again and len(again) <= 8 and max(counts.values()) == 2
    assert set(counts) == {key(b) for b in reference["bodies"]}
    assert curves(out) == curves(reference["out"])
    ref_table = (reference["out"] / "correlate-profile.csv").read_bytes()
    assert (out / "correlate-profile.csv").read_bytes() == ref_table


def test_kill_mid_reward_model_scoring_keeps_the_scores_made(
    world: dict[str, Any], reference: dict[str, Any]
) -> None:
    from crash_child import run_bon_crashing

    server = world["server"]
    out = world["tmp"] / "bon-kill-rm"
    args = bon_args(world["release"], world["models"], server.base_url, out, gen=False)
    ctx = multiprocessing.get_context("spawn")
    # 8 answers a commit; killed right after the 6th
    child = ctx.Process(target=run_bon_crashing, args=(args, 8, 6))
    child.start()
    child.join(600)
    assert child.exitcode == 86
    server.reset()
    assert main(args) == 0
    # the samples were all cached; the judge was never reached: only its requests go out
    assert server.request_count > 0
    assert all(PHASES["judge"](r["body"]) for r in server.requests)
    doc = json.loads((out / "bon.json").read_text())
    ref_doc = json.loads((reference["out"] / "bon.json").read_text())
    # what the first run scored (a fresh cache) per model, in commits of 8 answers: the
    # first six commits were kept, so the second run scored the rest, nothing twice
    first = [b["scorer"]["scored_now"] for b in ref_doc["scorers"][:3]]
    left, kept = 6, []
    for made in first:
        chunks = min(left, -(-made // 8))
        kept.append(min(made, 8 * chunks))
        left -= chunks
    assert 0 < sum(kept) < sum(first)
    assert [b["scorer"]["scored_now"] for b in doc["scorers"]] == [
        m - k for m, k in zip(first, kept, strict=True)
    ]
    ref = {name: c for name, c in curves(reference["out"]) if name.startswith("tiny")}
    assert dict(curves(out)) == ref


def test_bad_input_is_one_line_and_writes_nothing(
    world: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    tmp, release, server = world["tmp"], world["release"], world["server"]
    m0 = world["models"][0]
    broken = tmp / "broken-rm"
    shutil.copytree(m0, broken)
    (broken / "config.json").write_text("{not json", encoding="utf-8")
    rows = [json.loads(x) for x in (world["eval_root"] / "rm-tiny-rm-0" / "question"
                                    / "scores.jsonl").read_text().splitlines()]  # fmt: skip
    assert rows
    import pyarrow.parquet as pq

    table = pq.read_table(release / "all" / "test-00000-of-00001.parquet").to_pylist()
    bare = tmp / "no-aspects.jsonl"
    bare.write_text("".join(json.dumps({**r, "rubric_aspects": []}, default=str) + "\n"
                            for r in table))  # fmt: skip
    other = tmp / "other-eval"
    assert main(["eval", str(release), "--scorer", f"rm:{m0}", "--setting", "question",
                 "--limit", "3", "--out", str(other), "--no-progress"]) == 0  # fmt: skip
    capsys.readouterr()
    out = tmp / "bad-out"
    base = ["eval", "bon", str(release), "--out", str(out), "--no-progress",
            *backend_args(server.base_url)]  # fmt: skip
    cases = [
        ([f"--scorer=rm:{broken}"], f"{broken}, field '--scorer rm': cannot load"),
        ([f"--scorer=rm:{m0}", "--n", "4", "--k", "1,8"], "--k: k=8 is more than the 4"),
        ([f"--scorer=rm:{m0}", "--n", "0"], "--n: must be at least 1"),
        ([f"--scorer=rm:{m0}", f"--scorer=gen:standin-model,name={m0.name}"],
         "--scorer: two scorers are named 'tiny-rm-0'"),
        ([f"--scorer=rm:{m0}", "--policy-set", "backend.openai.base_url=http://127.0.0.1:9/v1"],
         "policy (standin-model): cannot reach the OpenAI-compatible server"),
        ([f"--scorer=rm:{m0}", "--accuracy-from", str(other)],
         "was made on another split"),
        (["--scorer=judge:standin-model"], "judge: compares two answers"),
        ([f"--scorer=rm:{m0}", "--setting", "rubric"], "--setting: the rubric control"),
    ]  # fmt: skip
    for extra, said in cases:
        before = disk_state(tmp)
        assert main([*base, *extra]) == 1, extra
        err = capsys.readouterr().err.strip()
        assert said in err, (extra, err)
        assert "\n" not in err and "Traceback" not in err, err
        assert disk_state(tmp) == before, extra
        assert not out.exists()
    # a split without rubric aspects: the judge has nothing to score against
    before = disk_state(tmp)
    assert main(["eval", "bon", str(bare), f"--scorer=rm:{m0}", "--no-progress",
                 *backend_args(server.base_url)]) == 1  # fmt: skip
    err = capsys.readouterr().err.strip()
    assert "field 'rubric_aspects'" in err and "have no rubric_aspects" in err, err
    assert disk_state(tmp) == before
    # a folder of the user's as --out: refused, left as it was
    mine = tmp / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    assert main([*base[:3], f"--scorer=rm:{m0}", "--out", str(mine), *base[6:]]) == 1
    assert "did not write (no .prb-bon)" in capsys.readouterr().err
    assert [p.name for p in mine.iterdir()] == ["notes.txt"]


def test_the_release_states_its_validity_from_the_outputs_made_for_it(
    world: dict[str, Any], reference: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    """The card's and the audit report's validity section: each claim's figure is the one
    in the file it names (whose SHA-256 it gives), or "not measured" with the command."""
    import hashlib

    tmp, release, server, root = world["tmp"], world["release"], world["server"], world["eval_root"]
    args = ["eval", str(release), "--scorer", "judge:standin-model", "--no-progress",
            "--setting", "question", "--setting", "profile", "--setting", "rubric",
            "--bootstrap", "50", *backend_args(server.base_url)]  # fmt: skip
    assert main(args) == 0
    shutil.copytree(reference["out"], root / "bon")  # prb eval bon's default folder
    # a results file made on another release is passed over
    stray = root / "stray" / "question"
    stray.mkdir(parents=True)
    doc = json.loads((root / "rm-tiny-rm-0" / "question" / "results.json").read_text())
    doc["split"]["data_sha256"] = "0" * 64
    (stray / "results.json").write_text(json.dumps(doc))
    assert main(["audit", str(release)]) == 0
    assert main(["publish", str(tmp / "sample")]) == 0
    capsys.readouterr()
    audit = json.loads((tmp / "sample" / "report" / "audit.json").read_text())
    v = audit["validity"]
    assert v["release_data_sha256"] == audit["source"]["data_sha256"]
    assert "1 prb eval results file(s) made on another split" in v["passed_over"]
    claims = {c["claim"]: c for c in v["claims"]}
    assert list(claims) == [
        "rubric_blind_judge_accuracy", "rubric_aware_judge_accuracy", "profile_gain",
        "shortcut_probe_auc", "human_agreement", "downstream_correlation",
    ]  # fmt: skip

    def read(file: str) -> tuple[dict[str, Any], str]:
        raw = (tmp / "sample" / file).read_bytes()
        return json.loads(raw), hashlib.sha256(raw).hexdigest()

    for name, setting in (("rubric_blind_judge_accuracy", "question"),
                          ("rubric_aware_judge_accuracy", "rubric")):  # fmt: skip
        (fig,) = claims[name]["figures"]
        got, sha = read(fig["file"])
        assert fig["file"] == f"eval/judge-standin-model/{setting}/results.json"
        m = got["settings"][setting]["metrics"]
        assert (fig["value"], fig["ci95"], fig["sha256"]) == (m["accuracy"], m["ci95"], sha)
    gains = {f["who"]: f for f in claims["profile_gain"]["figures"]}
    got, sha = read(gains["standin-model"]["file"])
    assert gains["standin-model"]["value"] == got["profile_gain"]["gain"]
    (probe,) = claims["shortcut_probe_auc"]["figures"]
    assert probe["value"] == audit["shortcut_probe"]["auc"]  # this audit's own figure
    assert claims["human_agreement"]["figures"] == []
    assert claims["human_agreement"]["not_measured"].startswith("prb annotate export")
    (down,) = claims["downstream_correlation"]["figures"]
    corr, sha = read(down["file"])
    assert down["file"] == "eval/bon/correlate-profile.json" and down["sha256"] == sha
    (overall,) = [r for r in corr["correlations"]
                  if r["subset"] == "overall" and r["downstream"] == "bon_k4"]  # fmt: skip
    assert down["metrics"]["ndcg"]["value"] == overall["metrics"]["ndcg"]["value"]
    assert down["metrics"]["rbo"]["ci95"] == overall["metrics"]["rbo"]["ci95"]
    # the card: the same claims, from the files as they are now (the audit's own file too)
    card = (release / "README.md").read_text()
    section = card.split("## Validity", 1)[1].split("\n## ", 1)[0]
    assert "`eval/judge-standin-model/question/results.json` (sha256 " in section
    _, audit_sha = read("report/audit.json")
    assert f"`report/audit.json` (sha256 `{audit_sha[:16]}`)" in section
    assert f"`eval/bon/correlate-profile.json` (sha256 `{sha[:16]}`)" in section
    assert "| not measured |" in section and "prb annotate export" in section
    assert "stray" not in section
    html = (tmp / "sample" / "report" / "audit.html").read_text()
    assert "<section id='validity'>" in html and "correlate-profile.json" in html
