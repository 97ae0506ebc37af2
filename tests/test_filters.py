"""Each pair filter on crafted pairs: one that it keeps and one that it drops."""

from __future__ import annotations

import copy

import pytest

from pipeline.config import pairs_section
from pipeline.rules import RULES, PairView, RuleSet, word_similarity

ITEMS = [{"item_id": "a1", "aspect": "x"}, {"item_id": "a2", "aspect": "y"}]
CHOSEN_TEXT = (
    "Start with ten minute gesture sessions on your commute and use a free pose site; "
    "trace your own hand photos twice a week to learn the basic shapes."
)
REJECTED_TEXT = (
    "Start with a structured anatomy course and study the bones of the hand in detail; "
    "practise from a mirror each evening to learn the basic shapes."
)


def good_pair() -> PairView:
    items = [dict(it) for it in ITEMS]
    q = {"parse_ok": True, "correctness": 5, "relevance": 5, "helpfulness": 4}
    verdict = {"parse_ok": True}
    return PairView(
        example={"example_id": "e1", "question": "How do I draw hands?"},
        rubric={"items": items},
        chosen={"text": CHOSEN_TEXT, "finish_reason": "stop", "strategy": "chosen"},
        rejected={
            "text": REJECTED_TEXT,
            "finish_reason": "stop",
            "strategy": "avoid_all",
            "violates": ["a1", "a2"],
            "honours": [],
        },
        quality_chosen=dict(q),
        quality_rejected=dict(q),
        coverage_chosen={"parse_ok": True, "scores": {"a1": 2, "a2": 2}},
        coverage_rejected={"parse_ok": True, "scores": {"a1": 0, "a2": 0}},
        pairwise={
            "pairwise_aware": {
                "AB": {**verdict, "prefers": "chosen"},
                "BA": {**verdict, "prefers": "chosen"},
            },
            "pairwise_blind": {
                "AB": {**verdict, "prefers": "tie"},
                "BA": {**verdict, "prefers": "chosen"},
            },
        },
    )


def run(name: str, pair: PairView, **cfg):
    return RuleSet(pairs_section(**cfg), 100).rules[name].check(pair)


def mutate(fn) -> PairView:
    p = copy.deepcopy(good_pair())
    fn(p)
    return p


ECHOED_ASPECT = "Suggests short practice sessions that fit a train commute"


def _echo(p: PairView) -> None:
    p.rubric["items"][0]["aspect"] = ECHOED_ASPECT
    p.chosen["text"] = (
        CHOSEN_TEXT + " It suggests short practice sessions that fit a train commute."
    )


CASES = {
    "judge_parse": lambda p: p.coverage_rejected.update(parse_ok=False),
    "empty": lambda p: p.rejected.update(text="  \n "),
    "truncated_text": lambda p: p.chosen.update(text=CHOSEN_TEXT[:-1] + " and then"),
    "rubric_echo": _echo,
    "truncated": lambda p: p.rejected.update(finish_reason="length"),
    "refusal": lambda p: p.rejected.update(text="I'm sorry, but I can't help with that."),
    "meta_text": lambda p: p.chosen.update(text=CHOSEN_TEXT + " This covers your rubric."),
    "length": lambda p: p.chosen.update(text=CHOSEN_TEXT + " more words" * 40),
    "quality_floor": lambda p: p.quality_rejected.update(correctness=2),
    "quality_gap": lambda p: (
        p.quality_chosen.update(helpfulness=5),
        p.quality_rejected.update(helpfulness=3),
    ),
    "coverage": lambda p: p.coverage_chosen["scores"].update(a2=1),
    "pairwise_consistency": lambda p: p.pairwise["pairwise_aware"]["BA"].update(prefers="rejected"),
    "similarity": lambda p: p.rejected.update(text=CHOSEN_TEXT),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_filter_keeps_good_and_drops_bad(name):
    ok, why = run(name, good_pair(), quality_floor=4)
    assert ok and why is None
    ok, why = run(name, mutate(CASES[name]), quality_floor=4)
    assert not ok
    assert isinstance(why, str) and why


def test_every_pair_filter_has_a_case():
    pair_level = {n for n, r in RULES.items() if r.position is not None and not r.set_level}
    assert pair_level == set(CASES)


def test_coverage_violate_one_must_keep_other_items():
    def to_violate_one(p):
        p.rejected.update(strategy="violate_one", violates=["a1"], honours=["a2"])
        p.coverage_rejected["scores"].update(a1=0, a2=2)

    assert run("coverage", mutate(to_violate_one)) == (True, None)

    def loses_kept(p):
        to_violate_one(p)
        p.coverage_rejected["scores"]["a2"] = 0

    ok, why = run("coverage", mutate(loses_kept))
    assert not ok and "a2" in why

    def hits_target(p):
        to_violate_one(p)
        p.coverage_rejected["scores"]["a1"] = 1

    ok, why = run("coverage", mutate(hits_target))
    assert not ok and "a1" in why


def test_blind_judge_leak_is_dropped():
    def leak(p):
        p.pairwise["pairwise_blind"]["AB"]["prefers"] = "chosen"
        p.pairwise["pairwise_blind"]["BA"]["prefers"] = "chosen"

    ok, why = run("pairwise_consistency", mutate(leak))
    assert not ok and "leak" in why


def test_length_ratio_band():
    short = mutate(lambda p: p.rejected.update(text="Use a pose site daily."))
    ok, why = run("length", short)
    assert not ok and "ratio" in why


def test_similarity_too_different():
    other = mutate(lambda p: p.rejected.update(text="Quantum zebra violin parliament."))
    ok, why = run("similarity", other)
    assert not ok and "too different" in why
    assert word_similarity("a b c", "a b c") == 100.0


def test_meta_text_leaves_ordinary_uses_alone():
    ordinary = mutate(
        lambda p: p.chosen.update(
            text=CHOSEN_TEXT + " Several aspects of drawing improve together."
        )
    )
    assert run("meta_text", ordinary) == (True, None)


def test_near_duplicate_set_filter():
    """Within one user: a repeated question and an answer reused across questions drop the
    later example. (Until the rule learnt about users these rows carried no user_id and
    the whole set counted as one user; they now say so explicitly.)"""
    f = RuleSet().rules["near_duplicate"]
    base = "how do i keep my sourdough starter alive while travelling for two weeks"
    rows = [
        {
            "example_id": "e1",
            "user_id": "u1",
            "question": base,
            "chosen": "feed it and refrigerate it well",
            "rejected": "dry some of it on baking paper first",
        },
        {
            "example_id": "e2",
            "user_id": "u1",
            "question": base + "?",
            "chosen": "ask a neighbour to feed it",
            "rejected": "freeze a small portion of it",
        },
        {
            "example_id": "e3",
            "user_id": "u1",
            "question": "which chess opening suits a beginner best",
            "chosen": "play the italian game and learn its plans",
            "rejected": "feed it and refrigerate it well",
        },
        {
            "example_id": "e4",
            "user_id": "u2",
            "question": "what running shoes for flat feet",
            "chosen": "look for stability shoes with firm arch support",
            "rejected": "try a gait analysis at a running shop",
        },
    ]
    drops = f.apply(rows)
    assert set(drops) == {"e2", "e3"}
    assert "e1" in drops["e2"] and "question" in drops["e2"]
    assert "answer" in drops["e3"]


PROFILES = [
    "I sketch on my iPad on the train every morning.\nGesture drawing is the only fun drill.",
    "Retired art teacher. I paint watercolour landscapes.\nI love anatomy books, honestly.",
    "Student on a tight budget.\nI mostly draw manga characters in pencil.",
    "I do tattoo flash designs for friends.\nMy line work is good, hands are not.",
    "Parent of two, I draw with my kids at weekends.\nWe use crayons and cheap paper.",
]
QUESTION = "How do I get better at drawing hands without spending hours on anatomy books?"
GENERIC = (
    "Break the hand into simple forms: a box for the palm and cylinders for the fingers. "
    "Draw each form from several angles, then combine them and compare with photos."
)


def _users_asking_the_same_question() -> list[dict]:
    rows = []
    for k, prof in enumerate(PROFILES):
        rows.append(
            {
                "example_id": f"e{k}",
                "user_id": f"u{k}",
                "profile": prof,
                "question": QUESTION,
                "chosen": f"Personal answer {k}: " + prof.split(".")[0] + ", so start there.",
                # the same generic rejected answer suits everyone who asks this question
                "rejected": GENERIC,
            }
        )
    return rows


def test_near_duplicate_keeps_distinct_users_asking_the_same_question():
    f = RuleSet().rules["near_duplicate"]
    rows = _users_asking_the_same_question()
    assert f.apply(rows) == {}
    # old callers without profiles: distinct user ids alone keep them apart too
    assert f.apply([{k: v for k, v in r.items() if k != "profile"} for r in rows]) == {}
    # profile as the list of posts the ingest stage writes is read the same way
    listed = [{**r, "profile": [{"text": t} for t in r["profile"].split("\n")]} for r in rows]
    assert f.apply(listed) == {}


def test_near_duplicate_drops_the_same_user_asking_twice():
    f = RuleSet().rules["near_duplicate"]
    rows = _users_asking_the_same_question()
    again = {**rows[2], "example_id": "e9", "chosen": "Another personal answer for user 2."}
    drops = f.apply([*rows, again])
    assert set(drops) == {"e9"} and "e2" in drops["e9"] and "question" in drops["e9"]
    # the same person under a second user id: near-identical profiles make them one
    alias = {**again, "user_id": "u2-alias", "profile": rows[2]["profile"] + " "}
    assert set(f.apply([*rows, alias])) == {"e9"}


def test_near_duplicate_same_pair_for_two_users_is_a_duplicate():
    """One shared answer across users is kept (above); both answers repeated with the
    same winner for another user tests the same thing twice."""
    f = RuleSet().rules["near_duplicate"]
    rows = _users_asking_the_same_question()
    copy_pair = {**rows[1], "example_id": "e7", "user_id": "u7", "profile": "Someone else."}
    drops = f.apply([*rows, copy_pair])
    assert set(drops) == {"e7"} and "e1" in drops["e7"] and "another user" in drops["e7"]
    # swapped sides (one user's chosen is another's rejected) is a wanted contrast: kept
    swapped = {**copy_pair, "chosen": rows[1]["rejected"], "rejected": rows[1]["chosen"]}
    assert f.apply([*rows, swapped]) == {}


def _pair_stage_filters(tmp_path, **config):
    from pipeline.config import Config
    from pipeline.run import RunDir
    from pipeline.stages.base import Context
    from pipeline.stages.pairs import PairStage

    cfg = Config.model_validate({"run": {"output_dir": str(tmp_path)}, **config})
    return PairStage().filters(Context(config=cfg, run_dir=RunDir(tmp_path / "run")))


def test_the_pair_stage_hands_its_filters_the_runs_word_cap(tmp_path):
    # 80 and 76 words: over a cap of 60 (66 with the slack), under the default 100
    def lengthen(p):
        p.chosen.update(text=" ".join(["word"] * 79) + " end.")
        p.rejected.update(text=" ".join(["other"] * 75) + " end.")

    long_pair = mutate(lengthen)
    filters = _pair_stage_filters(tmp_path, responses={"word_cap": 60})
    (length,) = [f for f in filters if f.name == "length"]
    ok, why = length.check(long_pair)
    assert not ok and why is not None
    assert why.startswith("chosen answer has 80 words, over the cap of 66 (60 + 10% slack)")
    # the same pair under the default cap passes the length rule
    (default_length,) = [f for f in _pair_stage_filters(tmp_path) if f.name == "length"]
    assert default_length.check(long_pair) == (True, None)


def test_the_pair_stage_builds_its_rules_once(tmp_path, monkeypatch):
    built = []
    original = RuleSet.__init__

    def counting(self, *args, **kw):
        built.append(self)
        original(self, *args, **kw)

    monkeypatch.setattr(RuleSet, "__init__", counting)
    filters = _pair_stage_filters(
        tmp_path, pairs={"similarity_max": 80.0}, responses={"word_cap": 120}
    )
    assert len(filters) == len(pairs_section().filters) > 1
    assert len(built) == 1
    (rules,) = built
    assert all(rules.rules[f.name] is f for f in filters)
    assert {f.word_cap for f in filters} == {120}
    assert rules.rules["similarity"].similarity_max == 80.0
