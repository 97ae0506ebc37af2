"""Judge and pair stages end to end on the sample input against the stand-in server.

A responder plays a consistent model: generation prompts get answers tagged with their
side, and judge prompts get verdicts that follow those tags, so the funnel has both
keeps and drops whose reasons are known in advance.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from collections import Counter

import pytest
from conftest import write_config
from standin_server import StandinServer

from pipeline.cli import main
from pipeline.config import load_config
from pipeline.core.errors import StageError
from pipeline.orchestration.orchestrate import run_pipeline
from pipeline.rules import Answer as Text
from pipeline.rules import RuleSet
from pipeline.run import RunDir
from pipeline.run.cache import RequestCache

WORDS = (
    "practical simple steady weekly small clear useful daily quick gentle focused honest "
    "careful patient cheap local friendly flexible short regular"
).split()
META_QUESTION = "hands"  # examples whose question mentions it get a chosen with meta-text


def _user_text(body: dict) -> str:
    return body["messages"][-1]["content"]


def _answers(text: str) -> list[str]:
    return re.findall(r"<<<\n(.*?)\n>>>", text, re.S)


def _side(answer: str) -> str:
    return "chosen" if answer.startswith("Tailored:") else "rejected"


def responder(body: dict, i: int) -> str | None:
    fmt = body.get("response_format") or {}
    name = (fmt.get("json_schema") or {}).get("name")
    text = _user_text(body)
    if name is None:  # generation
        q = re.search(r"Question: (.*)", text).group(1)
        rng = random.Random(hashlib.sha256((text + str(i)).encode()).hexdigest())
        filler = " ".join(rng.choice(WORDS) for _ in range(30))
        if "covers every one of these points" in text:
            meta = " as your rubric asks" if META_QUESTION in q.lower() else ""
            return f"Tailored: for '{q}' try this {filler}{meta}."
        return f"General: for '{q}' consider this {filler}."
    if name == "QualityVerdict":
        scores = {d: 4 for d in ("correctness", "relevance", "helpfulness")}
        return json.dumps(scores | {f"{d}_rationale": "fine" for d in scores})
    if name == "CoverageVerdict":
        ids = re.findall(r"- (P\d+):", text)
        score = 2 if _side(_answers(text)[0]) == "chosen" else 0
        return json.dumps({"scores": {x: score for x in ids}, "rationales": {x: "r" for x in ids}})
    if name == "PairwiseVerdict":
        a, _b = _answers(text)
        if "expects in an answer" in text:  # rubric-aware
            winner = "A" if _side(a) == "chosen" else "B"
        else:
            winner = "tie"
        return json.dumps({"winner": winner, "rationale": "r"})
    return None


@pytest.fixture
def smart_server():
    with StandinServer(responder=responder) as s:
        yield s


def test_judge_and_pairs_funnel(tmp_path, smart_server, capsys):
    cfg_path = write_config(tmp_path, smart_server, responses={"n": 2})
    messages: list[str] = []
    stats = run_pipeline(load_config(cfg_path), progress=False, echo=messages.append)
    rd = RunDir(tmp_path / "outputs" / "t")

    judged = list(rd.stage("judge").rows())
    assert len(judged) == 12
    skipped = 0
    for j in judged:
        assert len(j["quality"]) == 8  # n=2 chosen + n=2 for each of 3 strategies
        # a candidate a text rule drops gets no verdict: here the chosen answers that talk
        # about the rubric (meta_text, which runs before every verdict-reading filter)
        asked = [v for v in j["quality"].values() if not v.get("skipped")]
        skipped += sum(v.get("skipped") == "meta_text" for v in j["quality"].values())
        assert all(v["parse_ok"] and v["rationale"] for v in asked)
        # how each verdict was read: whole, nothing shortened (the responder writes short)
        assert all(v["cut"] is False and v["clipped"] == [] for v in asked)
        assert len(j["pairwise"]) == 4  # judge.max_pairs_per_example
        for p in j["pairwise"]:
            # asked in steps, the rubric-aware verdicts first, both orders each; none for a
            # combination a pointwise filter drops, or once one has passed (outranked)
            kinds = [k for k in ("pairwise_aware", "pairwise_blind") if k in p]
            assert kinds in ([], ["pairwise_aware"], ["pairwise_aware", "pairwise_blind"])
            for kind in kinds:
                assert set(p[kind]) == {"AB", "BA"}
            if p.get("not_asked") == "outranked":
                assert kinds == []
    assert skipped == 2 * sum(
        META_QUESTION in r["question"].lower() for r in rd.stage("ingest").rows()
    )
    assert stats["judge"]["candidates_skipped"] == {"meta_text": skipped}

    s = stats["pairs"]
    kept, rejects = list(rd.stage("pairs").rows()), list(rd.stage("pairs").rejects())
    assert s["kept"] + s["dropped"] == s["examples"] == 12
    assert len(kept) == s["kept"] and len(rejects) == s["dropped"]
    assert sum(s["dropped_by_reason"].values()) == s["dropped"]
    # two sample questions mention hands; their chosen answers talk about the rubric
    meta = [r for r in rejects if r["reason"] == "meta_text"]
    assert len(meta) == sum(
        META_QUESTION in r["question"].lower() for r in rd.stage("ingest").rows()
    )
    assert len(meta) >= 1
    assert all("rubric" in r["detail"] for r in meta)
    assert s["kept"] == 12 - len(meta)
    # violate_one rejects lose their kept items in this model: dropped by coverage
    assert s["pairs_dropped_by_filter"]["coverage"] > 0
    for r in kept:
        assert r["chosen"].startswith("Tailored:") and r["rejected"].startswith("General:")
        assert r["strategy"] in ("avoid_all", "other_user")  # violate_one loses its kept items
        assert r["judge"]["pairwise"]["pairwise_aware"]["AB"]["prefers"] == "chosen"
    assert len({r["pair_id"] for r in kept}) == len(kept)
    # the judge's shortlist and the pair stage name a pair with the same id
    judged_ids = {p["pair_id"] for j in judged for p in j["pairwise"]}
    assert {r["pair_id"] for r in kept} <= judged_ids
    assert any("= kept" in m for m in messages)

    # every dropped example is listed with its reason
    assert main(["inspect", str(rd.path), "--reason", "meta_text"]) == 0
    out = capsys.readouterr().out
    assert f"meta_text {len(meta)}" in out
    assert all(r["example_id"] in out for r in meta)
    assert main(["inspect", str(rd.path), "--reason", "nonsense"]) == 1


def test_new_pair_thresholds_re_judge_from_the_cache(tmp_path, smart_server):
    """The judge asks only what the pair rules can still use, so new thresholds re-do it
    too, from the cache: nothing answered before is sent again, and the run keeps what a
    fresh run with those thresholds keeps."""
    cfg_path = write_config(tmp_path, smart_server)
    run_pipeline(load_config(cfg_path), progress=False)
    sent = smart_server.request_count
    stats = run_pipeline(load_config(cfg_path, ["pairs.quality_floor=5"]), progress=False)
    assert set(stats) == {"judge", "pairs"}
    assert stats["judge"]["llm"]["sent"] == smart_server.request_count - sent
    assert stats["pairs"]["kept"] == 0
    assert stats["pairs"]["dropped_by_reason"]["quality_floor"] > 0
    # a stricter floor drops pairs on their pointwise verdicts: no pairwise verdict needed
    assert smart_server.request_count == sent
    # relaxed again: the verdicts the first run asked are all in the cache
    stats = run_pipeline(load_config(cfg_path, ["pairs.similarity_max=99"]), progress=False)
    (tmp_path / "fresh").mkdir()
    fresh = write_config(tmp_path / "fresh", smart_server, pairs={"similarity_max": 99})
    before = smart_server.request_count
    again = run_pipeline(load_config(fresh), progress=False)
    assert stats["judge"]["llm"]["sent"] <= again["judge"]["llm"]["sent"]
    kept = {r["pair_id"] for r in RunDir(tmp_path / "outputs" / "t").stage("pairs").rows()}
    fresh_kept = RunDir(tmp_path / "fresh" / "outputs" / "t").stage("pairs").rows()
    assert kept == {r["pair_id"] for r in fresh_kept}
    assert smart_server.request_count > before


def test_judge_unparsable_answers_stay_failures_until_final(tmp_path):
    """A judge whose coverage answers never validate: the first run records them as errors
    (never as answers) and leaves the examples pending, exit non-zero; the next run sends
    them again, and after that retry (backend.invalid_retry_runs: 1) the failure is final
    and every pair drops as judge_parse, with the parse error kept."""

    def bad_coverage(body: dict, i: int) -> str | None:
        name = ((body.get("response_format") or {}).get("json_schema") or {}).get("name")
        if name == "CoverageVerdict":
            return json.dumps({"scores": {"a0": 2}, "rationales": {"a0": "r"}})
        return responder(body, i)

    with StandinServer(responder=bad_coverage) as srv:
        cfg_path = write_config(
            tmp_path, srv, responses={"n": 1, "strategies": ["avoid_all"]},
            backend={"max_reasks": 1},
        )  # fmt: skip
        with pytest.raises(StageError, match="12 examples have failed requests"):
            run_pipeline(load_config(cfg_path), progress=False)
        rd = RunDir(tmp_path / "outputs" / "t")
        assert not rd.stage("judge").done and not list(rd.stage("judge").rows())
        # the chosen answers that talk about the rubric are never judged (meta_text)
        meta = RuleSet().rules["meta_text"]
        asked = sum(not meta.answer(Text(c["text"])) for c in rd.stage("responses").rows())
        assert asked == 24 - 2
        with RequestCache(rd.cache_path, readonly=True) as cache:
            errors = cache.errors("judge")
            assert len(errors) == asked  # one coverage request per candidate judged
            assert all(e["reason"].startswith("invalid_json") for e in errors)
            # the invalid answers were never stored as answers
            assert cache.count("judge") == asked  # the quality verdicts only
        sent = srv.request_count
        stats = run_pipeline(load_config(cfg_path), progress=False)
        # the coverage requests and their re-asks were sent again; no pairwise verdict,
        # since judge_parse drops each pair on its unparsed coverage; the quality verdicts
        # came from the cache
        assert srv.request_count - sent == asked * 2
    assert stats["pairs"]["dropped_by_reason"]["judge_parse"] == 12
    judged = list(rd.stage("judge").rows())
    cov = [v for j in judged for v in j["coverage"].values() if not v.get("skipped")]
    assert len(cov) == asked and all(not v["parse_ok"] and "scores" in v["error"] for v in cov)
    assert Counter(r["reason"] for r in rd.stage("pairs").rejects()) == {"judge_parse": 12}


def test_a_run_that_keeps_no_pair_says_so_and_exits_5(tmp_path, smart_server, capsys):
    """Every stage worked but the filters dropped every example: not a benchmark, so not
    exit 0. One line gives the drops by reason and the inspect command for this run."""
    cfg_path = write_config(tmp_path, smart_server)
    args = ["run", str(cfg_path), "--no-progress", "--set", "pairs.quality_floor=5"]
    assert main(args) == 5
    err = capsys.readouterr().err
    assert "Traceback" not in err
    err = err.strip().splitlines()[-1]  # the stages' progress lines come first
    stats = RunDir(load_config(cfg_path).run_dir).stage("pairs").stats()
    n = stats["examples"]
    assert stats["kept"] == 0 and stats["dropped_by_reason"]["quality_floor"] > 0
    assert err.startswith(f"no pair kept: the pair stage dropped all {n} examples (")
    assert f"quality_floor {stats['dropped_by_reason']['quality_floor']}" in err
    assert f"`prb inspect {cfg_path} --set pairs.quality_floor=5`" in err
    # --json: the summary says not ok, with the same line; a run stopped before the pair
    # stage is not asked about pairs
    assert main([*args, "--json"]) == 5
    summary = json.loads(capsys.readouterr().out)
    assert summary["ok"] is False and summary["pairs_kept"] == 0
    assert summary["error"].startswith("no pair kept:")
    assert main([*args, "--until", "judge"]) == 0
    # the thresholds back: pairs kept, exit 0
    assert main(["run", str(cfg_path), "--no-progress"]) == 0


def test_an_example_without_a_rubric_is_in_the_funnel_and_inspect_says_where(
    tmp_path, smart_server, capsys
):
    """A row whose rubric is empty is dropped by the rubrics stage: the run's funnel starts
    at the input and names that drop, and `prb inspect` on the pair stage points to it."""
    from conftest import SAMPLE

    rows = [json.loads(x) for x in SAMPLE.read_text(encoding="utf-8").splitlines() if x]
    rows[0]["rubric_aspects"] = []
    data = tmp_path / "input.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    cfg_path = write_config(tmp_path, smart_server, input={"format": "lamp", "path": str(data)})
    assert main(["run", str(cfg_path), "--no-progress"]) == 0
    err = capsys.readouterr().err
    rd = RunDir(load_config(cfg_path).run_dir)
    reasons = rd.stage("rubrics").stats()["reject_reasons"]
    (reason,) = reasons
    assert f"  input             {len(rows):6d}" in err
    assert f"  - {reason + ' (rubrics)':16s}{1:6d}" in err
    assert f"  examples          {len(rows) - 1:6d}" in err
    assert main(["inspect", str(rd.path)]) == 0
    out = capsys.readouterr().out
    assert f"(1 more dropped by the rubrics stage: {reason} 1; `prb inspect " in out
    assert "--stage rubrics`" in out
