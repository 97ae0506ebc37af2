"""A free-text answer (a chosen or rejected candidate) that is not finished — cut at
max_tokens, no visible text, or ending mid-sentence though the server said "stop" — is
asked again once with twice the tokens; its finish reason travels with the candidate to
the filters and the audit, and one that is still cut off is recorded as such, never kept
as a finished answer."""

from __future__ import annotations

from collections import Counter

from conftest import write_config
from standin_server import StandinServer

from pipeline.cli import main
from pipeline.rules.text import unfinished
from pipeline.run import RunDir


def _free_text(body: dict) -> bool:
    return not body.get("response_format")


def _asks_chosen(body: dict) -> bool:
    return "covers every one of these points" in body["messages"][-1]["content"]


def test_the_rule():
    assert unfinished("A complete sentence.", "stop") is None
    assert "finish_reason length" in unfinished("A complete sentence.", "length")
    assert unfinished("\u200b\u2060 ", "stop") == "no visible text"
    assert "mid-sentence" in unfinished('{"aspects": [', "stop")
    assert "mid-sentence" in unfinished("Start with the basics and", "stop")


def test_a_cut_answer_is_asked_again_once_with_twice_the_tokens(tmp_path):
    with StandinServer() as s:
        cfg = write_config(tmp_path, s, input={"limit": 2})
        s.inject("length", count=1, match=_free_text)  # the first answer is cut
        s.inject("bad_json", count=1, match=_free_text)  # the second garbled, "stop"
        assert main(["run", str(cfg), "--no-progress", "--until", "responses"]) == 0
        bodies = [r["body"] for r in s.requests if _free_text(r["body"])]
    cands = list(RunDir(tmp_path / "outputs" / "t").stage("responses").rows())
    # each faulty answer was asked again with twice the tokens, once
    tokens = Counter(b["max_tokens"] for b in bodies)
    assert tokens == {400: len(bodies) - 2, 800: 2}, tokens
    assert all(c["finish_reason"] == "stop" for c in cands)
    retried = [c for c in cands if c["provenance"]["reasks"] == 1]
    assert len(retried) == 2 * 2  # n=2 choices per request, both re-asked
    assert all(c["provenance"]["max_tokens"] == 800 for c in retried)
    assert not any(c["text"].startswith('{"aspects"') for c in cands)
    stats = RunDir(tmp_path / "outputs" / "t").stage("responses").stats()
    assert stats["llm"]["reasks"] == 2 and stats["llm"]["length_reasks"] == 1


def test_an_answer_still_cut_after_its_retry_is_recorded_and_dropped(tmp_path, capsys):
    with StandinServer() as s:
        cfg = write_config(
            tmp_path, s, input={"limit": 1}, responses={"n": 1, "strategies": ["avoid_all"]}
        )
        # the chosen answer's request, and then its retry, are both cut
        s.inject("length", count=2, match=lambda b: _free_text(b) and _asks_chosen(b))
        # its one example drops (truncated, below): no pair kept, exit status 5
        assert main(["run", str(cfg), "--no-progress"]) == 5
        sent = s.request_count
        # re-doing the stage asks nothing again: the cut answer and its retry are both in
        # the cache, and the retry's answer is the model's, recorded as cut
        assert main(["run", str(cfg), "--no-progress", "--redo", "responses"]) == 5
        assert s.request_count == sent
    rd = RunDir(tmp_path / "outputs" / "t")
    cut = [c for c in rd.stage("responses").rows() if c["finish_reason"] == "length"]
    assert len(cut) == 1 and cut[0]["provenance"]["reasks"] == 1
    # the pair filters see the finish reason and say why the example is gone
    (drop,) = list(rd.stage("pairs").rejects())
    assert drop["reason"] == "truncated" and "finish_reason length" in drop["detail"]


def test_inspect_names_rubric_items_by_their_text(tmp_path, capsys):
    # the stand-in covers at most three points per answer: four-point rubrics drop on
    # coverage, and inspect shows which points, by their words
    with StandinServer() as s:
        cfg = write_config(tmp_path, s)
        assert main(["run", str(cfg), "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["inspect", str(tmp_path / "outputs" / "t"), "--reason", "coverage"]) == 0
    out = capsys.readouterr().out
    rubrics = {
        r["example_id"]: r for r in RunDir(tmp_path / "outputs" / "t").stage("rubrics").rows()
    }
    drops = [r for r in RunDir(tmp_path / "outputs" / "t").stage("pairs").rejects()
             if r["reason"] == "coverage"]  # fmt: skip
    assert drops
    for d in drops:
        items = rubrics[d["example_id"]]["items"]
        named = [it for it in items if it["item_id"] in d["detail"]]
        assert named and all(it["aspect"][:30] in d["detail"] for it in named), d["detail"]
        assert d["detail"] in out
