"""Small units: ids, atomic writes, cache, prompts, profile ranking, rubric items, registry."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from pipeline.core.errors import ConfigError, PipelineError
from pipeline.core.ids import content_hash, stable_id
from pipeline.core.io import atomic_open, read_jsonl, write_jsonl_atomic
from pipeline.core.registry import Registry
from pipeline.core.resources import data_dir
from pipeline.run import StageDir
from pipeline.run.cache import RequestCache
from pipeline.stages.responses import DonorEntry, derive_seed, find_donors
from pipeline.stages.rubrics import make_rubric_row, merge_items
from pipeline.types.chat import ChatRequest, ChatResult, Choice
from pipeline.types.profile import select_profile
from pipeline.types.prompts import load_template, parse_template


def test_ids_are_deterministic_and_input_sensitive():
    assert stable_id("u1", "q", 0) == stable_id("u1", "q", 0)
    assert stable_id("u1", "q", 0) != stable_id("u1", "q", 1)
    assert content_hash({"a": 1, "b": 2}) == content_hash({"b": 2, "a": 1})
    assert derive_seed(0, "ex", "chosen", 0) != derive_seed(1, "ex", "chosen", 0)
    assert 0 <= derive_seed(0, "ex", "chosen", 0) < 2**31


def test_atomic_write_leaves_old_file_on_error(tmp_path):
    target = tmp_path / "f.jsonl"
    write_jsonl_atomic(target, [{"a": 1}])
    with pytest.raises(RuntimeError), atomic_open(target) as fh:
        fh.write('{"a": 2}\n')
        raise RuntimeError("crash mid-write")
    assert list(read_jsonl(target)) == [{"a": 1}]
    assert [p.name for p in tmp_path.iterdir()] == ["f.jsonl"]  # no temp file left


def test_request_key_covers_everything_that_decides_the_answer():
    base = ChatRequest(messages=(("user", "hi"),), model="m", temperature=0.5, seed=1)
    variants = [
        ChatRequest(messages=(("user", "hi!"),), model="m", temperature=0.5, seed=1),
        ChatRequest(messages=(("user", "hi"),), model="m2", temperature=0.5, seed=1),
        ChatRequest(messages=(("user", "hi"),), model="m", temperature=0.6, seed=1),
        ChatRequest(messages=(("user", "hi"),), model="m", temperature=0.5, seed=2),
        ChatRequest(messages=(("user", "hi"),), model="m", temperature=0.5, seed=1, n=2),
        ChatRequest(
            messages=(("user", "hi"),),
            model="m",
            temperature=0.5,
            seed=1,
            json_schema={"type": "object"},
        ),
    ]
    keys = {base.key} | {v.key for v in variants}
    assert len(keys) == len(variants) + 1
    same = ChatRequest(messages=(("user", "hi"),), model="m", temperature=0.5, seed=1)
    assert same.key == base.key


def test_cache_roundtrip_errors_kept_apart(tmp_path):
    req = ChatRequest(messages=(("user", "x"),), model="m")
    with RequestCache(tmp_path / "c.sqlite") as cache:
        assert cache.get(req.key) is None
        cache.put_error(req, "s", "HTTP 500", 3)
        assert cache.get(req.key) is None  # a failure is never served as an answer
        res = ChatResult([Choice("answer", "stop")], 3, 1, "m")
        cache.put(req, res, "s")
        cache.put(req, res, "s")  # idempotent
        assert cache.count("s") == 1
        assert cache.get(req.key) == res
        assert cache.errors("s")[0]["reason"] == "HTTP 500"


def test_stage_dir_shards_and_orphan_rejects(tmp_path):
    sd = StageDir(tmp_path / "st")
    sd.begin("fp", {}, expected=3)
    sd.write_shard([{"example_id": "a"}], [{"example_id": "b", "reason": "x"}])
    # a crash between the rejects file and the data file of the next shard
    (sd.path / "rejects-00001.jsonl").write_text('{"example_id": "c", "reason": "x"}\n')
    sd.begin("fp", {}, expected=3)
    assert not (sd.path / "rejects-00001.jsonl").exists()
    assert sd.done_examples() == {"a", "b"}
    assert sd.status() == ("partial", 2, 3)
    sd.finish({"n": 2})
    assert sd.status() == ("done", 2, 3)


def test_templates_have_versions_and_render():
    for name in (
        "rubric_generate",
        "response_chosen",
        "response_avoid_all",
        "response_violate_one",
        "response_other_user",
    ):
        t = load_template(name)
        assert t.version == "1"
        assert len(t.sha256) == 64
    t = load_template("response_chosen")
    msgs = t.render(
        question="Q?", profile=[{"text": "post"}], word_cap=50, items=[{"aspect": "mention cost"}]
    )
    assert [r for r, _ in msgs] == ["system", "user"]
    assert "at most 50 words" in msgs[1][1] and "mention cost" in msgs[1][1]
    with pytest.raises(PipelineError, match="question"):
        t.render(profile=[], word_cap=5, items=[])  # a missing variable is an error
    with pytest.raises(PipelineError, match="version"):
        parse_template("x", "### user\nhi")


def test_profile_selection_prefers_relevant_posts():
    posts = [
        {"id": "1", "text": "I baked sourdough bread this weekend"},
        {"id": "2", "text": "My watercolor painting keeps getting muddy colors"},
        {"id": "3", "text": "Cycling to work is scary"},
        {"id": "4", "text": "Which watercolor paper stops colors going muddy?"},
    ]
    top = select_profile("How do I stop my watercolor colors from getting muddy?", posts, k=2)
    assert {p["id"] for p in top} == {"2", "4"}
    assert select_profile("anything", posts[:1], k=5) == posts[:1]


def test_rubric_items_merge_and_stable_ids():
    items = [
        {"aspect": "Suggests free online resources", "evidence": "e", "reason": "r"},
        {"aspect": "suggests free online resources!", "evidence": "e2", "reason": "r2"},
        {"aspect": "Keeps practice sessions short", "evidence": "", "reason": ""},
    ]
    kept, merged = merge_items(items, threshold=90)
    assert [k["aspect"] for k in kept] == [items[0]["aspect"], items[2]["aspect"]]
    assert merged[0]["into"] == items[0]["aspect"]
    ex = {"example_id": "e1", "user_id": "u1"}
    row1 = make_rubric_row(ex, kept, "given", {})
    row2 = make_rubric_row(ex, list(kept), "given", {})
    assert row1 == row2
    assert len({it["item_id"] for it in row1["items"]}) == 2
    row3 = make_rubric_row(ex, kept[:1], "given", {})
    assert row3["rubric_version"] != row1["rubric_version"]
    assert row3["items"][0]["item_id"] == row1["items"][0]["item_id"]


def test_donors_are_other_users_with_similar_questions():
    exs = [
        {"example_id": "a", "user_id": "u1", "question": "best watercolor paper", "category": "A"},
        {
            "example_id": "b",
            "user_id": "u2",
            "question": "which watercolor paper is best",
            "category": "A",
        },
        {
            "example_id": "c",
            "user_id": "u3",
            "question": "how to train for a marathon",
            "category": "B",
        },
        {
            "example_id": "d",
            "user_id": "u1",
            "question": "best watercolor paper ever",
            "category": "A",
        },
    ]
    pool = [DonorEntry(e["example_id"], e["user_id"], e["category"], e["question"]) for e in exs]
    donors = find_donors(pool)
    assert donors["a"] == "b"  # d is the same user: never a donor
    assert donors["b"] in {"a", "d"}
    assert donors["c"] != "c"


def _donor_pool(templates: list[str], users: int, numbered: bool = False) -> list[DonorEntry]:
    """1,500 questions made here from ``templates`` with a topic ``{t}`` and a detail
    ``{d}``, asked by ``users`` users in categories A-C; ``numbered``: each ends in a
    number only it has."""
    import random

    rng = random.Random(0)
    topics = ["watercolor painting", "marathon training", "home brewing", "rock climbing",
              "budget travel", "sourdough baking", "chess openings", "vegetable gardening",
              "woodworking", "photography", "retirement saving", "learning spanish"]  # fmt: skip
    details = ["little time", "a small apartment", "two kids", "a tight budget", "a bad knee",
               "no experience", "a full-time job", "a noisy neighbour"]  # fmt: skip
    return [
        DonorEntry(f"ex{i:05d}", f"u{rng.randrange(users)}", rng.choice("ABC"),
                   rng.choice(templates).format(t=rng.choice(topics), d=rng.choice(details))
                   + (f" (case {i})" if numbered else ""))
        for i in range(1500)
    ]  # fmt: skip


def test_donors_found_through_the_word_index_score_as_high_as_every_comparison():
    """Above DONOR_BRUTE_LIMIT each question is scored only against the examples that
    share its rarest words; on 1,500 questions built from templates, topics and details
    (made here) the donor so found scores as high as comparing every pair finds."""

    from rapidfuzz import fuzz

    templates = ["how do I get better at {t}", "what should I know before starting {t}",
                 "best way to learn {t} on a budget", "tips for {t} with {d}",
                 "is {t} worth it if I have {d}", "how to plan {t} around {d}"]  # fmt: skip
    pool = _donor_pool(templates, users=400)
    every = find_donors(pool, brute_limit=10**9)
    indexed = find_donors(pool, brute_limit=0)
    by = {e.example_id: e for e in pool}

    def score(a: str, b: str | None) -> float:
        assert b is not None and by[a].user_id != by[b].user_id
        same = by[a].category == by[b].category
        return fuzz.token_set_ratio(by[a].question, by[b].question) + (10 if same else 0)

    assert every.keys() == indexed.keys() == by.keys()
    assert all(score(k, indexed[k]) >= score(k, every[k]) for k in by)


def test_a_question_with_a_word_of_its_own_still_finds_a_donor():
    """Every question here has a number only it has (its rarest word, which finds only
    itself) and topic words more common than the index scans: each must still get a
    donor of another user (the 100,000-example scale run got none, and silently skipped
    the other_user strategy for every example)."""
    topics = ["home brewing", "rock climbing", "budget travel"]
    pool = [
        DonorEntry(f"ex{i:04d}", f"u{i % 40}", "A", f"tips for {topics[i % 3]} (station {i})")
        for i in range(300)
    ]
    donors = find_donors(pool, brute_limit=0, candidates=8)
    by = {e.example_id: e for e in pool}
    assert all(d is not None and by[d].user_id != by[k].user_id for k, d in donors.items())
    # the same topic is the most similar question
    assert all(by[d].question.split("(")[0] == by[k].question.split("(")[0]
               for k, d in donors.items())  # fmt: skip


def test_donors_of_questions_with_words_of_their_own_stay_close_to_every_comparison():
    """1,500 templated questions, each ending in a number only it has, with the index's
    scan cap (4 x 32 candidates) below the common words' lists: the donor search narrows a
    common word by the question's next words (the 100,000-example run took the first 1,024
    examples of the word instead). Measured: its donor scores within the same-category
    bonus (10) of comparing every pair on every question, 0.18 below on average (taking
    the word's first 128 examples: 0.15, comparing 4 times as many)."""

    from rapidfuzz import fuzz

    templates = ["how do I get better at {t} with {d}", "best way to learn {t} on {d}",
                 "what should I know before starting {t} given {d}", "tips for {t} with {d}",
                 "is {t} worth it if I have {d}", "how to plan {t} around {d}"]  # fmt: skip
    pool = _donor_pool(templates, users=375, numbered=True)
    every = find_donors(pool, brute_limit=10**9)
    indexed = find_donors(pool, brute_limit=0, candidates=32)
    by = {e.example_id: e for e in pool}

    def score(a: str, b: str | None) -> float:
        assert b is not None and by[a].user_id != by[b].user_id
        same = by[a].category == by[b].category
        return fuzz.token_set_ratio(by[a].question, by[b].question) + (10 if same else 0)

    gaps = [score(k, every[k]) - score(k, indexed[k]) for k in by]
    assert max(gaps) <= 10.0 + 1e-9
    assert sum(gaps) / len(gaps) < 0.25
    assert sum(g > 0 for g in gaps) < 0.12 * len(gaps)


def test_registry_did_you_mean():
    r: Registry[type] = Registry("widget", object, name_attr="widget_name")
    r.register("alpha", "json:JSONDecoder")
    assert r.get("alpha") is json.JSONDecoder  # lazy import resolved on first use
    with pytest.raises(ConfigError, match="Did you mean 'alpha'"):
        r.get("alpah")


def test_data_dirs_found():
    for name in ("prompts", "rubrics", "annotation"):
        assert data_dir(name).is_dir()
    assert (data_dir("prompts") / "response_chosen.j2").exists()
    assert isinstance(Path(data_dir("rubrics")), Path)


def test_atomic_write_has_the_usual_file_mode(tmp_path):
    target = tmp_path / "f.json"
    write_jsonl_atomic(target, [{"a": 1}])
    mask = os.umask(0)
    os.umask(mask)
    assert (target.stat().st_mode & 0o777) == (0o666 & ~mask)


def test_bm25_scores_equal_rank_bm25():
    """The project's BM25+ gives rank_bm25's BM25Plus scores exactly (and so the same
    profile order) on generated profiles, repeated query words and empty posts included."""
    from hypothesis import given, settings
    from hypothesis import strategies as st
    from rank_bm25 import BM25Plus

    from pipeline.types.profile import bm25_scores

    word = st.sampled_from("tea garden chess run poem bake map code paint sleep ink".split())
    doc = st.lists(word, max_size=12)

    @settings(max_examples=300, deadline=None)
    @given(query=st.lists(word, max_size=8), docs=st.lists(doc, min_size=1, max_size=12))
    def check(query, docs):
        docs = [d or ["<empty>"] for d in docs]
        ours = bm25_scores(query, docs)
        ref = BM25Plus(docs).get_scores(query)
        assert ours.tolist() == ref.tolist()

    check()


def test_finished_upstream_stages_are_read_by_offset_not_held(tmp_path):
    """The responses stage's rubrics and the judge's questions and rubric items are read
    through each upstream stage's shard index as an example asks (not held in a dict of
    every row), and give the fields such a dict gave."""
    from conftest import write_config
    from standin_server import StandinServer

    from pipeline.cli import main
    from pipeline.config import load_config
    from pipeline.run import RunDir
    from pipeline.stages.base import Context, IndexedFields
    from pipeline.stages.judge import JudgeStage
    from pipeline.stages.responses import ResponseStage, _rubric_fields

    with StandinServer() as srv:
        cfg = write_config(tmp_path, srv)
        assert main(["run", str(cfg), "--no-progress", "--until", "rubrics"]) == 0
    config = load_config(cfg)
    ctx = Context(config=config, run_dir=RunDir(config.run_dir), progress=False)
    stage = ResponseStage()
    lazy = stage.load_rubrics(ctx, stage)
    assert isinstance(lazy, IndexedFields)
    held = {r["example_id"]: _rubric_fields(r) for r in stage.input_rows(ctx, "rubrics")}
    assert len(held) > 1 and len(lazy) == len(held) and list(lazy) == list(held)
    assert all(lazy[k] == v for k, v in reversed(held.items()))
    assert "no-such-example" not in lazy
    with pytest.raises(KeyError):
        lazy["no-such-example"]
    # the judge's questions and rubric items, the same way
    questions, items = JudgeStage().prompt_inputs(ctx)
    assert isinstance(questions, IndexedFields) and isinstance(items, IndexedFields)
    ingest = {r["example_id"]: r["question"] for r in stage.input_rows(ctx, "ingest")}
    assert dict(questions) == ingest
    assert dict(items) == {k: v["items"] for k, v in held.items()}
