"""The audit's per-pair checks on a pairs file with planted defects (issue 11).

A clean set of pairs, built from hand-written advice sentences (written for this test, not
model output), gets at least three rows of every defect kind mixed in. Each planted row
must be flagged by the check for its kind, and clean rows may be flagged at most at
CLEAN_FLAG_RATE_MAX: 2%, i.e. one clean row in fifty. The rules are heuristics on open
text (regexes for meta-text and refusals, a punctuation rule for truncation, fuzzy
matching for echoes), so a rare false alarm on ordinary advice is possible in principle;
one in fifty is the most a reviewer reading flags.jsonl should have to dismiss. On this
set the measured rate is 0.
"""

from __future__ import annotations

import json
import random
from collections import defaultdict

import pytest

from pipeline.audit import audit

CLEAN_FLAG_RATE_MAX = 0.02

# Ordinary advice, written by hand for this test; every sentence ends with a full stop.
SENTENCES = [
    "Start with ten-minute sessions on the train and keep a small sketchbook in your bag.",
    "Trace your own hand photos at low opacity, then redraw the pose from memory.",
    "A used turntable with a built-in phono stage saves you buying a separate preamp.",
    "Put the speakers on stands away from the wall so the bass stays tight.",
    "Let the villain believe he is the hero of his own story.",
    "Cut every monologue in half and let a single gesture carry the threat.",
    "A short-scale guitar with light strings is kinder to small hands.",
    "Folk tunes you already know make twenty-minute sessions feel like play.",
    "Anchor the habit to waking up rather than to a fixed time on the clock.",
    "Keep the first version tiny: one glass of water and two lines in the journal.",
    "Walk four minutes, jog one, and repeat five times on grass or a track.",
    "On rainy weeks, do the same intervals as brisk walks under cover.",
    "Break the thesis into tasks that fit in one sitting and start the easiest first.",
    "Work beside a friend for an hour; body doubling makes starting easier.",
    "Save a fixed share of every payment into a buffer account before you spend.",
    "Pay off the loan with the highest rate first while the deposit can wait.",
    "Agree with your husband on a rhythm you can keep, then share it together.",
    "A warm message on the weeks you skip keeps the door open.",
    "Join a walking tour of the old town and read one local history book a month.",
    "Visit the museum on its free evening and sketch one object each time.",
    "Book a language exchange that meets in a café near your flat.",
    "Write the budget down on Sunday and check it again on Thursday.",
    "Compare three options in the same price range before deciding.",
    "Rest a full day after any hard session so your knee can recover.",
    "Ask your teacher for one concrete example when feedback feels vague.",
    "Try the cheapest option first and upgrade once you know what you miss.",
    "Read the chapter aloud; clumsy sentences show up at once.",
    "Stretch your calves after each run and walk the last five minutes.",
    "Plan meals for three days at a time so shopping stays simple.",
    "Keep a list of questions for your advisor and bring it to every meeting.",
]
QUESTIONS = [
    "How do I get better at drawing hands without spending hours on anatomy books?",
    "Which turntable should I buy for a small flat on a budget?",
    "How can I make my novella's villain more convincing?",
    "Which guitar suits someone with small hands who already plays piano?",
    "How do I build a morning routine that actually sticks?",
    "How do I start running with a dodgy knee when it rains all the time?",
    "How do I stay productive on my thesis with ADHD?",
    "How should I save money when my income is irregular?",
    "How do I handle Sunday lunches with my in-laws without burning out?",
    "What is a good way to explore the history of my new city?",
]
ASPECTS = [
    "Suggests short practice sessions that fit a train commute",
    "Keeps recommendations within a budget of roughly three hundred",
    "Grounds the villain's motives in the story's political world",
    "Builds on existing piano and music theory knowledge",
    "Anchors the routine to waking up rather than a clock time",
    "Uses a gradual knee friendly progression with soft surfaces",
    "Gives ADHD aware strategies like flexible time blocks",
    "Handles irregular income with a buffer and a percentage saved",
    "Involves the husband as a partner in the approach",
    "Suggests walking based ways to explore local history",
]
CATEGORIES = ["Art_and_Entertainment", "Lifestyle_and_Personal_Development", "Society_and_Culture"]


HOBBIES = ["choir", "chess", "climbing", "pottery", "running", "birding", "quilting", "cycling"]
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
PLACES = ["library", "harbour", "station", "market", "park", "school", "museum", "river", "mill"]


def _own_post(i: int) -> str:
    """A post only user i wrote (i % 8, i % 7 and i % 9 differ for every i below 504):
    distinct users have distinct profiles, as real ones do."""
    return (
        f"My {HOBBIES[i % 8]} group meets on {DAYS[i % 7]}s near the {PLACES[i % 9]}, "
        f"and I have been going for {i % 9 + 2} years."
    )


def _answer(rng: random.Random, k: int) -> str:
    return " ".join(rng.sample(SENTENCES, k))


def clean_rows(n: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        q = i % len(QUESTIONS)
        rows.append(
            {
                "id": f"clean-{i:03d}",
                "user_id": f"user-{i:03d}",
                "question": QUESTIONS[q],
                "profile": [
                    {"id": f"u{i}-p1", "category": CATEGORIES[q % 3], "text": _own_post(i)},
                    {
                        "id": f"u{i}-p2",
                        "category": CATEGORIES[q % 3],
                        "text": rng.choice(SENTENCES),
                    },
                ],
                # aspects of another question than the answers: covering one in one's own
                # words is fine, copying it is what rubric_echo is for
                "rubric_aspects": [
                    {"aspect": ASPECTS[(q + 3) % len(ASPECTS)], "evidence": "e", "reason": "r"}
                ],
                "narrative": "why I ask",
                "category": CATEGORIES[q % 3],
                "chosen": _answer(rng, 4),
                "rejected": _answer(rng, 4),
            }
        )
    return rows


def plant(rows: list[dict], rng: random.Random) -> dict[str, str]:
    """Append three rows of every text defect; returns id -> expected check."""
    expected: dict[str, str] = {}

    def add(kind: str, k: int, **change) -> None:
        base = dict(rng.choice(rows[:60]))
        row = {**base, "id": f"{kind}-{k}", "user_id": f"{kind}-user-{k}", **change}
        row["profile"] = [{"id": "x", "category": "c", "text": f"{kind} profile {k}"}]
        rows.append(row)
        expected[row["id"]] = kind

    for k in range(3):
        a = _answer(rng, 4)
        add("identical", k, chosen=a, rejected=" " + a.upper())
        add("near_identical", k, chosen=a, rejected=a.replace(".", "!", 1) + " Good luck.")
        add("empty", k, rejected=["", "   ", "\n\t "][k])
        add("over_cap", k, chosen=_answer(rng, 12))
        add(
            "refusal",
            k,
            rejected=[
                "I'm sorry, but I can't help with that request.",
                "As an AI, I cannot provide personal advice. Please ask a professional.",
                "I am unable to assist with questions about money.",
            ][k],
        )
        add(
            "meta_text",
            k,
            chosen=_answer(rng, 3)
            + [
                " This answer covers all the points you listed.",
                " Per your instructions, I left out the commute.",
                " I've kept it under 100 words.",
            ][k],
        )
        add(
            "truncated_text",
            k,
            chosen=_answer(rng, 3) + [" Then add", " Finally, try the", " Options include:"][k],
        )
        add(
            "rubric_echo",
            k,
            rubric_aspects=[{"aspect": ASPECTS[0], "evidence": "e", "reason": "r"}],
            chosen=_answer(rng, 2) + " It suggests short practice sessions that fit a train "
            "commute. " + _answer(rng, 1),
        )
    return expected


def plant_duplicates(rows: list[dict], rng: random.Random) -> dict[str, str]:
    """Appended after the shuffle: the later copy is the one flagged, and a copy must come
    after its original for that."""
    expected: dict[str, str] = {}
    originals = [r for r in rows if r["id"].startswith("clean-")][:6]
    # exact duplicate rows: a clean row again, same user, question and answers
    for k in range(3):
        dup = {**originals[k], "id": f"duplicate_row-{k}"}
        rows.append(dup)
        expected[dup["id"]] = "duplicate_row"
    # the same user asking (nearly) the same question again, with other answers
    for k in range(3):
        src = originals[3 + k]
        again = {
            **src,
            "id": f"near_duplicate-{k}",
            "question": src["question"].rstrip("?") + " ?",
            "chosen": _answer(rng, 4),
            "rejected": _answer(rng, 4),
        }
        rows.append(again)
        expected[again["id"]] = "near_duplicate"
    return expected


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def audited(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("planted")
    rows = clean_rows(80)
    clean_ids = {r["id"] for r in rows}
    expected = plant(rows, random.Random(1))
    random.Random(2).shuffle(rows)  # defects mixed in, not appended at the end
    expected |= plant_duplicates(rows, random.Random(3))
    fig = audit(_write(tmp / "pairs.jsonl", rows), tmp / "report")
    flags = [json.loads(x) for x in (tmp / "report" / "flags.jsonl").read_text().splitlines()]
    return fig, flags, expected, clean_ids, tmp


def test_every_planted_defect_is_flagged_by_its_check(audited):
    fig, flags, expected, _, _ = audited
    by_id = defaultdict(set)
    for f in flags:
        by_id[f["id"]].add(f["check"])
    missed = {i: k for i, k in expected.items() if k not in by_id[i]}
    assert missed == {}
    kinds = defaultdict(int)
    for k in expected.values():
        kinds[k] += 1
    assert all(n >= 3 for n in kinds.values()) and len(kinds) == 10
    for kind, n in kinds.items():
        assert fig["checks"]["counts"][kind] >= n, kind


def test_clean_rows_are_rarely_flagged(audited):
    _, flags, _, clean_ids, _ = audited
    # six clean rows were copied (duplicate_row) or re-asked (near_duplicate): those flags
    # land on the later copies, never on the originals
    flagged_clean = {f["id"] for f in flags if f["id"] in clean_ids}
    assert len(flagged_clean) <= CLEAN_FLAG_RATE_MAX * len(clean_ids), flagged_clean
    assert flagged_clean == set()  # measured: none


def test_flags_name_the_row_the_check_and_the_words(audited):
    _, flags, _, _, _ = audited
    for f in flags:
        assert set(f) >= {"id", "check", "detail", "side", "category", "excerpt", "row"}
        assert f["detail"] and isinstance(f["detail"], str)
    meta = [f for f in flags if f["check"] == "meta_text"]
    assert any("points you listed" in f["detail"] for f in meta)
    refusal = [f for f in flags if f["check"] == "refusal"]
    assert all(f["side"] == "rejected" for f in refusal)
    echo = [f for f in flags if f["check"] == "rubric_echo"]
    assert all("short practice sessions that fit a train commute" in f["detail"] for f in echo)
    dups = [f for f in flags if f["check"] == "duplicate_row"]
    assert all(f["detail"].startswith("repeats row clean-") for f in dups)
    near = [f for f in flags if f["id"].startswith("near_duplicate-")]
    assert len(near) == 3 and all("same user" in f["detail"] for f in near)
    # the planted identical and near-identical rows share their answers across users:
    # the same pair with the same winner twice is a duplicate too
    pairs = [f for f in flags if f["id"].startswith("near_identical-")]
    assert all("another user" in f["detail"] for f in pairs if f["check"] == "near_duplicate")
    trunc = [f for f in flags if f["check"] == "truncated_text"]
    assert {f["excerpt"][-9:] for f in trunc} >= {"Then add", "y the", "include:"} or trunc


def test_judge_checks_only_run_where_judge_columns_exist(audited):
    fig, _, _, _, _ = audited
    for code in ("quality_floor", "quality_gap", "coverage", "blind_leak", "aware_disagrees"):
        assert code in fig["checks"]["not_run"] and code not in fig["checks"]["counts"]


def test_judge_column_checks(tmp_path):
    rows = clean_rows(30, seed=4)
    good_q = {"correctness": 5, "relevance": 5, "helpfulness": 4}
    for r in rows:
        r.update(
            quality_chosen=dict(good_q),
            quality_rejected=dict(good_q),
            coverage_chosen_mean=2.0,
            coverage_rejected_mean=0.0,
            pairwise_aware={"AB": "chosen", "BA": "chosen"},
            pairwise_blind={"AB": "tie", "BA": "chosen"},
        )
    planted = {}
    for k in range(3):
        rows[k]["quality_chosen"] = {**good_q, "helpfulness": 3}  # both low, no gap
        rows[k]["quality_rejected"] = {**good_q, "helpfulness": 3}
        planted[rows[k]["id"]] = "quality_floor"
        rows[3 + k]["quality_rejected"] = {**good_q, "correctness": 4, "relevance": 4}
        rows[3 + k]["quality_chosen"] = {**good_q, "correctness": 5, "relevance": 5}
        rows[3 + k]["quality_rejected"]["correctness"] = 3
        planted[rows[3 + k]["id"]] = "quality_gap"
        rows[6 + k]["coverage_chosen_mean"] = 1.5
        planted[rows[6 + k]["id"]] = "coverage"
        rows[9 + k]["pairwise_blind"] = {"AB": "chosen", "BA": "chosen"}
        planted[rows[9 + k]["id"]] = "blind_leak"
        rows[12 + k]["pairwise_aware"] = {"AB": "chosen", "BA": "rejected"}
        planted[rows[12 + k]["id"]] = "aware_disagrees"
    fig = audit(_write(tmp_path / "judged.jsonl", rows), tmp_path / "out")
    flags = [json.loads(x) for x in (tmp_path / "out" / "flags.jsonl").read_text().splitlines()]
    got = defaultdict(set)
    for f in flags:
        got[f["id"]].add(f["check"])
    assert all(k in got[i] for i, k in planted.items())
    judge_flags = {f["id"] for f in flags if f["check"] in set(planted.values())}
    assert judge_flags == set(planted)  # no judge flag on the other rows
    # every judge check ran; cut_off did not, since these rows have no finish_reasons
    assert fig["checks"]["not_run"] == {"cut_off": "no finish_reasons values in this source"}
    # on a 1-5 scale with a floor of 4 a gap above 1 needs a score below 4: both fire there
    assert fig["checks"]["counts"]["quality_floor"] == 6
    assert fig["checks"]["counts"]["quality_gap"] == 3


def test_users_asking_the_same_question_are_not_duplicates(tmp_path):
    """Five users with different profiles ask the same question and get the same generic
    rejected answer: nothing is a duplicate. The same user asking twice is."""
    rng = random.Random(5)
    generic = _answer(rng, 4)
    rows = []
    for u in range(5):
        rows.append(
            {
                "id": f"u{u}",
                "user_id": f"user-{u}",
                "question": QUESTIONS[0],
                "profile": [{"id": "p", "category": "c", "text": _answer(rng, 2)}],
                "category": CATEGORIES[0],
                "chosen": _answer(rng, 4),
                "rejected": generic,
            }
        )
    fig = audit(_write(tmp_path / "same_q.jsonl", rows), tmp_path / "o1")
    assert fig["checks"]["counts"]["near_duplicate"] == 0
    assert fig["checks"]["counts"]["duplicate_row"] == 0

    # the reference release has no user_id: profiles tell the users apart
    no_ids = [{k: v for k, v in r.items() if k != "user_id"} for r in rows]
    fig = audit(_write(tmp_path / "no_ids.jsonl", no_ids), tmp_path / "o2")
    assert fig["checks"]["counts"]["near_duplicate"] == 0

    again = {**rows[2], "id": "u2-again", "chosen": _answer(rng, 4)}
    fig = audit(_write(tmp_path / "twice.jsonl", [*rows, again]), tmp_path / "o3")
    flags = (tmp_path / "o3" / "flags.jsonl").read_text().splitlines()
    near = [json.loads(x) for x in flags if '"near_duplicate"' in x]
    assert [f["id"] for f in near] == ["u2-again"] and "u2" in near[0]["detail"]


def test_check_row_runs_every_rules_checks(monkeypatch):
    from pipeline.audit.checks import check_row
    from pipeline.rules import RULES, Hit, PairRule, RuleSet, audit

    long = " ".join(["word"] * 120) + "."
    row = {"chosen": long, "rejected": "Short and finished.", "category": "c"}

    def flags_of(r, rules=None):
        flags: list[dict] = []
        check_row(flags, 0, r, rules or RuleSet(), ["r0"], ["c"])
        return [(f["check"], f["side"]) for f in flags]

    assert flags_of(row) == [("over_cap", "chosen")]

    # a rule registered with its checks runs them, on each answer or on the row, with no
    # other edit
    class Loud(PairRule):
        @audit("shouting", "Shouting", per="answer")
        def answer(self, a):
            """an answer in capitals"""
            return Hit("shouts", "") if a.text.isupper() else None

        @audit("same_length", "Same length")
        def same(self, r):
            """both answers as long"""
            n = r.n_words("chosen") == r.n_words("rejected")
            return (
                Hit("same", "")
                if n and len(r.texts["chosen"]) == len(r.texts["rejected"])
                else None
            )

    # the registry's entries as they are, restored after the test
    monkeypatch.setattr(RULES, "_entries", dict(RULES._entries))
    RULES.register("loud", Loud)
    loud = {"chosen": "STOP NOW.", "rejected": "STOP NOW.", "category": "c"}
    assert sorted(flags_of(loud)) == [
        ("identical", None), ("same_length", None),
        ("shouting", "chosen"), ("shouting", "rejected"),
    ]  # fmt: skip
    # an answer with no visible text gets its `empty` flag and none of its own other
    # checks, and the checks on both answers' text do not run
    assert sorted(flags_of({**loud, "rejected": "  "})) == [
        ("empty", "rejected"), ("shouting", "chosen"),
    ]  # fmt: skip
    # and a rule taken out of the registry no longer runs
    RULES.unregister("length")
    assert flags_of(row) == []
