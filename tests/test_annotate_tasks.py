"""Round building without a server: sampling, A/B randomisation, gold tasks, file-only export.

``make_synthetic_run`` is shared with tests/test_labelstudio.py and the annotation benchmark.
"""

from __future__ import annotations

import json
import random
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

import pytest

from pipeline.annotate.errors import LabelStudioError
from pipeline.annotate.export import export_round, plan_round
from pipeline.annotate.importer import judge_direction, parse_result, verdict
from pipeline.annotate.tasks import (
    CHOICE_CONTROL,
    CHOICES,
    COMMENT_CONTROL,
    CONFIDENCE_CONTROL,
    FLAGS,
    FLAGS_CONTROL,
    a_side_for,
    allocate,
    build_round,
    confidence_levels,
    label_config,
    load_run,
    map_choice,
    pick_gold,
    stratified_sample,
    stratum,
)
from pipeline.config import Config
from pipeline.run import RunDir
from pipeline.types.profile import rank_profile

CATEGORIES = {
    "Art_and_Entertainment": 0.5,
    "Lifestyle_and_Personal_Development": 0.3,
    "Society_and_Culture": 0.2,
}
STRATEGIES = {"avoid_all": 0.6, "violate_one": 0.3, "other_user": 0.1}
WORDS = (
    "garden budget commute sketch novel recipe violin hiking startup pottery museum podcast "
    "chess climbing journal sourdough festival cinema volunteer language marathon camera"
).split()


def _text(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n)).capitalize() + "."


def make_synthetic_run(
    run_dir: Path, n: int, seed: int = 0, shards: int = 2, split_judge_every: int = 7
) -> list[dict]:
    """A SYNTHETIC run directory (ingest, rubrics, pairs) with ``n`` kept pairs.

    Made-up words, not model output: strata are deliberately unequal (categories 50/30/20%,
    strategies 60/30/10%), margins come in quarter steps so ties occur, and one pair in
    ``split_judge_every`` (0: none) has a rubric-aware judge that called a tie in one order.
    """
    rng = random.Random(seed)
    examples, rubrics, pairs = [], [], []
    for i in range(n):
        ex_id = f"ex{i:05d}"
        cat = rng.choices(list(CATEGORIES), weights=list(CATEGORIES.values()))[0]
        strat = rng.choices(list(STRATEGIES), weights=list(STRATEGIES.values()))[0]
        question = f"Synthetic question {i} about {rng.choice(WORDS)} and {rng.choice(WORDS)}?"
        profile = [
            {"id": f"{ex_id}-p{j}", "category": cat, "text": _text(rng, rng.randint(8, 80))}
            for j in range(5)
        ]
        examples.append(
            {
                "example_id": ex_id,
                "source_id": f"synthetic-{i}",
                "user_id": f"u{i % 97:03d}",
                "question": question,
                "category": cat,
                "profile": profile,
                "narrative": _text(rng, 20),
                "rubric_aspects": None,
            }
        )
        items = [
            {"item_id": f"a{i:05d}{k}", "aspect": _text(rng, 6), "evidence": "", "reason": ""}
            for k in range(3)
        ]
        rubrics.append(
            {
                "example_id": ex_id,
                "user_id": examples[-1]["user_id"],
                "rubric_version": f"rv{i:05d}",
                "source": "given",
                "items": items,
            }
        )
        split = split_judge_every and i % split_judge_every == 3
        second = "tie" if split else "chosen"
        pairs.append(
            {
                "pair_id": f"pair{i:05d}",
                "example_id": ex_id,
                "source_id": f"synthetic-{i}",
                "user_id": examples[-1]["user_id"],
                "question": question,
                "category": cat,
                "narrative": examples[-1]["narrative"],
                "profile": profile,
                # the run's ranking, as ingest records it
                "profile_view": {
                    "ranker": "bm25",
                    "top_k": 10,
                    "order": rank_profile(question, profile, 10),
                },
                "rubric": {"version": f"rv{i:05d}", "source": "given", "items": items},
                "finish_reasons": {"chosen": "stop", "rejected": "stop"},
                "similarity": None,
                "provenance": {},
                "chosen": f"CHOSEN {i}: " + _text(rng, 40),
                "rejected": f"REJECTED {i}: " + _text(rng, 40),
                "chosen_id": f"c{i}",
                "rejected_id": f"r{i}",
                "strategy": strat,
                "violated_item_ids": [items[0]["item_id"]],
                "rubric_version": f"rv{i:05d}",
                "margin": rng.randint(4, 12) / 4,
                "judge": {
                    "pairwise": {
                        "pairwise_aware": {
                            "AB": {"prefers": "chosen"},
                            "BA": {"prefers": second},
                        },
                        "pairwise_blind": {"AB": {"prefers": "tie"}, "BA": {"prefers": "tie"}},
                    }
                },
            }
        )
    rd = RunDir(run_dir)
    for name, rows in (("ingest", examples), ("rubrics", rubrics), ("pairs", pairs)):
        sd = rd.stage(name)
        sd.begin("synthetic", {"synthetic": True}, n)
        step = -(-n // shards) if name == "pairs" else n
        for s in range(0, n, step):
            sd.write_shard(rows[s : s + step])
        sd.finish({"synthetic": True, "rows": n})
    return pairs


def make_config(tmp_path: Path, **annotation) -> Config:
    return Config.model_validate(
        {
            "run": {"name": "synthetic", "output_dir": str(tmp_path), "seed": 7},
            "annotation": {"sample_size": 60, "gold_tasks": 5, **annotation},
        }
    )


@pytest.fixture
def run(tmp_path: Path) -> tuple[Path, list[dict]]:
    run_dir = tmp_path / "synthetic"
    return run_dir, make_synthetic_run(run_dir, 220)


# ---- sampling ------------------------------------------------------------------------------


def test_confidence_terciles_are_equal_sized_and_ordered(run):
    _, pairs = run
    levels = confidence_levels(pairs)
    sizes = Counter(levels.values())
    assert max(sizes.values()) - min(sizes.values()) <= 1
    margins = {lv: [p["margin"] for p in pairs if levels[p["pair_id"]] == lv] for lv in sizes}
    assert max(margins["low"]) <= min(margins["mid"])
    assert max(margins["mid"]) <= min(margins["high"])


def test_allocation_is_proportional_largest_remainder():
    sizes = {("a",): 50, ("b",): 30, ("c",): 20}
    assert allocate(sizes, 10, seed=0) == {("a",): 5, ("b",): 3, ("c",): 2}
    got = allocate({("a",): 1, ("b",): 1, ("c",): 1}, 2, seed=0)
    assert sum(got.values()) == 2 and set(got.values()) == {0, 1}
    assert allocate(sizes, 500, seed=0) == sizes  # never more than a stratum holds


def test_stratified_sample_matches_proportions_per_stratum(run):
    _, pairs = run
    keys = ["category", "strategy", "confidence"]
    levels = confidence_levels(pairs)
    sample = stratified_sample(pairs, 100, keys, seed=3, levels=levels)
    assert len(sample.pairs) == 100
    assert len({p["pair_id"] for p in sample.pairs}) == 100
    population = Counter(stratum(p, keys, levels) for p in pairs)
    got = Counter(stratum(p, keys, levels) for p in sample.pairs)
    for s, size in population.items():
        exact = 100 * size / len(pairs)
        assert abs(got[s] - exact) < 1, (s, got[s], exact)
    # the recorded strata table agrees with the sample
    assert sum(v["sampled"] for v in sample.strata.values()) == 100
    assert sum(v["population"] for v in sample.strata.values()) == len(pairs)
    # and per category alone, the shares follow the population's
    cat_pop = Counter(p["category"] for p in pairs)
    cat_got = Counter(p["category"] for p in sample.pairs)
    for c in cat_pop:
        assert abs(cat_got[c] - 100 * cat_pop[c] / len(pairs)) <= len(population) / 2


def test_sampling_is_deterministic_and_ignores_input_order(run):
    _, pairs = run
    keys = ["category", "strategy", "confidence"]
    a = stratified_sample(pairs, 50, keys, seed=11)
    shuffled = list(pairs)
    random.Random(5).shuffle(shuffled)
    b = stratified_sample(shuffled, 50, keys, seed=11)
    assert [p["pair_id"] for p in a.pairs] == [p["pair_id"] for p in b.pairs]
    c = stratified_sample(pairs, 50, keys, seed=12)
    assert {p["pair_id"] for p in a.pairs} != {p["pair_id"] for p in c.pairs}


def test_sample_excludes_given_pairs_and_shrinks_to_what_is_left(run):
    _, pairs = run
    first = stratified_sample(pairs, 200, ["category"], seed=1)
    sent = {p["pair_id"] for p in first.pairs}
    second = stratified_sample(pairs, 200, ["category"], seed=2, exclude=sent)
    assert len(second.pairs) == 20
    assert not sent & {p["pair_id"] for p in second.pairs}


# ---- A/B and gold --------------------------------------------------------------------------


def test_ab_sides_are_randomised_recorded_and_map_back(run):
    run_dir, pairs = run
    by_id = {p["pair_id"]: p for p in pairs}
    plan = build_round(
        run_dir, 1, sample_size=120, stratify_by=["category"], gold_tasks=0, base_seed=0
    )
    sides = Counter(t["data"]["a_side"] for t in plan.tasks)
    assert set(sides) == {"chosen", "rejected"}
    assert 35 <= sides["chosen"] <= 85  # a fair coin over 120 tasks
    for t in plan.tasks:
        d = t["data"]
        pair = by_id[d["pair_id"]]
        other = "rejected" if d["a_side"] == "chosen" else "chosen"
        assert d["answer_a"] == pair[d["a_side"]]
        assert d["answer_b"] == pair[other]
        # clicking the chosen answer's letter maps back to "chosen", whichever side it is on
        letter = "A" if d["a_side"] == "chosen" else "B"
        assert map_choice(letter, d["a_side"]) == "chosen"
        assert map_choice("B" if letter == "A" else "A", d["a_side"]) == "rejected"
        assert d["a_side"] == a_side_for(d["task_key"], plan.seed)
    assert map_choice("tie", "chosen") == "tie"
    assert map_choice("both bad", "rejected") == "both_bad"
    with pytest.raises(ValueError):
        map_choice("C", "chosen")


def test_gold_tasks_pair_an_on_topic_answer_with_an_unrelated_one(run):
    run_dir, pairs = run
    by_id = {p["pair_id"]: p for p in pairs}
    plan = build_round(
        run_dir, 1, sample_size=50, stratify_by=["category"], gold_tasks=8, base_seed=0
    )
    gold = [t["data"] for t in plan.tasks if t["data"]["gold"]]
    real = {t["data"]["pair_id"] for t in plan.tasks if not t["data"]["gold"]}
    assert len(gold) == 8 and plan.n_gold == 8
    for d in gold:
        base, decoy = by_id[d["pair_id"]], by_id[d["distractor_pair_id"]]
        assert d["task_key"] == f"gold:{d['pair_id']}"
        assert d["pair_id"] not in real  # not also a real task in the same round
        assert decoy["category"] != base["category"]
        assert decoy["question"] != base["question"]
        on_topic = d["answer_a"] if d["expected"] == "A" else d["answer_b"]
        off_topic = d["answer_b"] if d["expected"] == "A" else d["answer_a"]
        assert on_topic == base["chosen"]
        assert off_topic == decoy["chosen"]
        assert map_choice(d["expected"], d["a_side"]) == "chosen"
    # gold tasks are spread through the round, not appended at the end
    positions = [i for i, t in enumerate(plan.tasks) if t["data"]["gold"]]
    assert positions != list(range(len(plan.tasks) - 8, len(plan.tasks)))


@pytest.mark.parametrize(
    ("pairs", "sample_size", "gold"),
    [(400, 200, 10), (260, 200, 10), (30, 10, 1), (60, 30, 2), (12, 2, 1)],
)
def test_a_smaller_round_gets_the_same_share_of_gold_tasks(tmp_path, pairs, sample_size, gold):
    """The share of gold tasks (10 in a round of 200 pairs): a full round keeps its 10, a
    10-pair round gets 1 (not 10 beside 10 pairs), 30 pairs get 2, every round with a pair
    one; here each run has enough pairs outside the round to make them from."""
    from pipeline.annotate.tasks import gold_count

    assert [gold_count(10, n, 200) for n in (220, 200, 10, 30, 2)] == [10, 10, 1, 2, 1]
    run_dir = tmp_path / "synthetic"
    make_synthetic_run(run_dir, pairs)
    config = make_config(
        tmp_path, sample_size=sample_size, gold_tasks=gold_count(10, sample_size, 200)
    )
    done = export_round(config, run_dir, 1, file_only=True)
    tasks = json.loads(Path(done["tasks_file"]).read_text())
    assert sum(t["data"]["gold"] for t in tasks) == done["gold"] == gold
    assert done["pairs"] == sample_size == len(tasks) - gold
    assert done["gold_note"] is None


@pytest.mark.parametrize("pairs", [3, 10, 200])
def test_a_round_holding_every_pair_has_no_gold_and_says_so(tmp_path, pairs, capsys):
    """Sample round 1 (fewer kept pairs than annotation.sample_size) showed its gold task's
    question and Answer A two tasks from the real task of the same pair, and its off-topic
    answer was another task's chosen answer (issue 52): with no pair outside the round
    there is no gold task, one line says why, and export.json keeps that line."""
    from pipeline.cli import main

    run_dir = tmp_path / "synthetic"
    make_synthetic_run(run_dir, pairs)
    (run_dir / "run.yaml").write_text(
        make_config(tmp_path, sample_size=200, gold_tasks=10).to_yaml()
    )
    assert main(["annotate", "export", str(run_dir), "--round", "1", "--file-only"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    notes = [line for line in out if line.startswith("note: ")]
    assert len(notes) == 1 and "no gold attention check in this round" in notes[0], out
    assert f"0 of the run's {pairs} kept pairs are outside it" in notes[0]
    assert "annotation.sample_size" in notes[0]
    info = json.loads((run_dir / "annotate" / "round-1" / "export.json").read_text())
    assert info["gold"] == 0 and info["gold_note"] == notes[0].removeprefix("note: ")
    tasks = json.loads((run_dir / "annotate" / "round-1" / "tasks.json").read_text())
    assert len(tasks) == pairs and not any(t["data"]["gold"] for t in tasks)


def test_gold_tasks_share_no_question_or_answer_with_the_rounds_other_tasks(tmp_path):
    """With pairs to spare, each gold task's question and both answers appear in no other
    task of the round (its real tasks and the other gold tasks), whatever the seed; a
    round with a few pairs outside it makes what they allow and says how many."""
    run_dir = tmp_path / "synthetic"
    make_synthetic_run(run_dir, 40)
    for seed, sample, want in ((0, 30, 5), (1, 30, 5), (2, 36, 5)):
        plan = build_round(
            run_dir, 1, sample_size=sample, stratify_by=["category"], gold_tasks=want,
            base_seed=seed,
        )  # fmt: skip
        shown: Counter = Counter()
        for t in plan.tasks:
            d = t["data"]
            shown.update({d["question"], d["answer_a"], d["answer_b"]})
        gold = [t["data"] for t in plan.tasks if t["data"]["gold"]]
        for d in gold:
            for text in (d["question"], d["answer_a"], d["answer_b"]):
                assert shown[text] == 1, (seed, text[:40])
        # each gold task takes two pairs outside the round: 10 outside -> 5, 4 -> 2
        assert len(gold) == plan.n_gold == min(want, (40 - sample) // 2), seed
        if plan.n_gold < want:
            assert plan.gold_note and plan.gold_note.startswith(f"{plan.n_gold} of {want} gold")
        else:
            assert plan.gold_note is None


def test_gold_falls_back_to_other_examples_with_one_category(run):
    _, pairs = run
    one_cat = [p | {"category": "X"} for p in pairs[:10]]
    gold = pick_gold(one_cat, 3, seed=0)
    assert len(gold) == 3
    assert all(b["example_id"] != d["example_id"] for b, d in gold)


def test_task_shows_profile_top3_and_rubric_items(run):
    run_dir, _ = run
    data = load_run(run_dir)
    plan = build_round(
        run_dir, 1, sample_size=5, stratify_by=["category"], gold_tasks=0, base_seed=0
    )
    d = plan.tasks[0]["data"]
    assert len(d["profile"].splitlines()) == 3
    assert all(len(line) <= 2 + 280 for line in d["profile"].splitlines())
    items = data.by_pair[d["pair_id"]]["rubric"]["items"]
    assert d["rubric"].splitlines() == [f"{i}. {it['aspect']}" for i, it in enumerate(items, 1)]


# ---- file-only export ----------------------------------------------------------------------


def test_file_only_export_writes_importable_tasks_and_is_stable(run, tmp_path):
    run_dir, _ = run
    cfg = make_config(tmp_path)
    summary = export_round(cfg, run_dir, 1, file_only=True)
    tasks_path = run_dir / "annotate" / "round-1" / "tasks.json"
    tasks = json.loads(tasks_path.read_text())
    assert summary["tasks"] == len(tasks) == 65
    assert summary["pairs"] == 60 and summary["gold"] == 5
    keys = [t["data"]["task_key"] for t in tasks]
    assert len(set(keys)) == len(keys)
    assert all(set(t) == {"data"} for t in tasks)  # Label Studio's import format
    # what annotators can see holds no answer key; it stays in the local sides.json
    assert not any("a_side" in t["data"] or "expected" in t["data"] for t in tasks)
    sides = json.loads((run_dir / "annotate" / "round-1" / "sides.json").read_text())
    assert set(sides) == set(keys)
    assert all(v["a_side"] in ("chosen", "rejected") for v in sides.values())
    assert sum("expected" in v for v in sides.values()) == 5  # the gold tasks' answers
    info = json.loads((run_dir / "annotate" / "round-1" / "export.json").read_text())
    assert info["status"] == "file_only" and info["project_id"] is None
    assert info["seed"] == 7 + 1
    # same round again: byte-identical tasks
    before = tasks_path.read_bytes()
    export_round(cfg, run_dir, 1, file_only=True)
    assert tasks_path.read_bytes() == before
    # round 2 leaves out round 1's pairs
    export_round(cfg, run_dir, 2, file_only=True)
    r2 = json.loads((run_dir / "annotate" / "round-2" / "tasks.json").read_text())
    r1_pairs = {t["data"]["pair_id"] for t in tasks if not t["data"]["gold"]}
    r2_pairs = {t["data"]["pair_id"] for t in r2 if not t["data"]["gold"]}
    assert len(r2_pairs) == 60 and not r1_pairs & r2_pairs
    # a round's task set is fixed: other settings for the same round are refused
    with pytest.raises(LabelStudioError, match="different task set"):
        export_round(make_config(tmp_path, sample_size=70), run_dir, 1, file_only=True)


def test_plan_uses_config_seed_plus_round(run, tmp_path):
    run_dir, _ = run
    p1 = plan_round(make_config(tmp_path), run_dir, 1)
    p1b = plan_round(make_config(tmp_path), run_dir, 1)
    p3 = plan_round(make_config(tmp_path), run_dir, 3)
    assert p1.seed == 8 and p3.seed == 10
    assert p1.tasks == p1b.tasks
    assert p1.keys() != p3.keys()


def test_missing_or_unfinished_pairs_stage_is_a_clear_error(run, tmp_path):
    from pipeline.core.errors import StageError

    with pytest.raises(StageError, match="stage 'pairs' has not run"):
        load_run(tmp_path / "nothing")
    run_dir, _ = run
    (run_dir / "pairs" / "_DONE.json").unlink()
    with pytest.raises(StageError, match="has not finished"):
        load_run(run_dir)


# ---- labeling config and result parsing ----------------------------------------------------


def test_labeling_config_shows_plain_text_and_matches_the_code():
    root = ET.fromstring(label_config())
    tags = {el.tag for el in root.iter()}
    assert "HyperText" not in tags and "HTML" not in tags
    texts = {el.get("name"): el.get("value") for el in root.iter("Text")}
    assert texts == {
        "question": "$question",
        "profile": "$profile",
        "rubric": "$rubric",
        "answer_a": "$answer_a",
        "answer_b": "$answer_b",
    }
    controls = {el.get("name"): el for el in root.iter() if el.get("toName")}
    assert set(controls) == {CHOICE_CONTROL, FLAGS_CONTROL, CONFIDENCE_CONTROL, COMMENT_CONTROL}
    choice = controls[CHOICE_CONTROL]
    assert choice.get("required") == "true"
    assert [c.get("value") for c in choice.iter("Choice")] == list(CHOICES)
    assert [c.get("value") for c in controls[FLAGS_CONTROL].iter("Choice")] == list(FLAGS)
    assert controls[FLAGS_CONTROL].get("choice") == "multiple"
    assert controls[CONFIDENCE_CONTROL].tag == "Rating"
    assert controls[COMMENT_CONTROL].tag == "TextArea"
    assert controls[COMMENT_CONTROL].get("required") in (None, "false")


def test_the_labeling_page_defines_every_choice_and_flag_in_the_guidelines_words():
    """Nothing on the labeling page defined "both bad", "general quality differs" or
    "rubric unclear" (issue 52): each choice and flag now has its definition beside the
    controls, in words the guidelines use, and the length rule is on the page."""
    import re

    from pipeline.annotate.tasks import guidelines_html, markdown_html

    root = ET.fromstring(label_config())
    shown = [el.get("value") or "" for el in root.iter("Header")]
    guide = re.sub(r"<[^>]+>", "", guidelines_html())
    for term in (*[c for c in CHOICES if c not in ("A", "B")], *FLAGS):
        lines = [h for h in shown if h.startswith(f"{term}: ")]
        assert len(lines) == 1, (term, shown)
        definition = lines[0].removeprefix(f"{term}: ").rstrip(".")
        # the first clause of each definition is the guidelines' own
        assert definition.split(" (")[0].split(";")[0].lower() in guide.lower(), (term, definition)
    assert any("Do not reward length, polish, formatting or confident tone" in h for h in shown)
    assert "Do <strong>not</strong> reward length, polish" in guidelines_html()
    # the renderer escapes what is not its Markdown
    assert (
        markdown_html("a <b>x</b> & **y**")
        == "<p>a &lt;b&gt;x&lt;/b&gt; &amp; <strong>y</strong></p>"
    )


def test_parse_result_reads_every_control():
    result = [
        {"from_name": "choice", "to_name": "question", "type": "choices",
         "value": {"choices": ["both bad"]}},
        {"from_name": "flags", "to_name": "question", "type": "choices",
         "value": {"choices": ["rubric unclear", "general quality differs"]}},
        {"from_name": "confidence", "to_name": "question", "type": "rating",
         "value": {"rating": 4}},
        {"from_name": "comment", "to_name": "question", "type": "textarea",
         "value": {"text": ["too close to call"]}},
    ]  # fmt: skip
    got = parse_result(result)
    assert got == {
        "choice": "both bad",
        "flags": ["general_quality_differs", "rubric_unclear"],
        "confidence": 4,
        "comment": "too close to call",
    }
    assert parse_result([])["choice"] is None


def test_judge_direction_and_verdict_status():
    def pair(ab, ba):
        return {"judge": {"pairwise": {"pairwise_aware": {"AB": {"prefers": ab},
                                                          "BA": {"prefers": ba}}}}}  # fmt: skip

    assert judge_direction(pair("chosen", "chosen")) == "chosen"
    assert judge_direction(pair("rejected", "rejected")) == "rejected"
    assert judge_direction(pair("chosen", "tie")) == "tie"
    assert judge_direction(pair("chosen", "rejected")) == "tie"
    assert judge_direction({"judge": {}}) is None
    assert verdict(["chosen", "chosen"], 2)["status"] == "verified"
    assert verdict(["chosen"], 2)["status"] == "unresolved"  # too few votes
    assert verdict(["both_bad", "rejected", "both_bad"], 2)["status"] == "refuted"
    assert verdict(["chosen", "rejected"], 2) == {
        "majority": None,
        "share": 0.5,
        "status": "unresolved",
    }
    assert verdict(["tie", "tie"], 2)["status"] == "unresolved"


def test_cli_handler_exports_file_only_from_a_run_directory(run, tmp_path, capsys):
    import argparse

    from pipeline.annotate.cli import add_annotate_parser, cmd_annotate

    run_dir, _ = run
    (run_dir / "run.yaml").write_text(make_config(tmp_path).to_yaml())
    parser = argparse.ArgumentParser(prog="prb")
    add_annotate_parser(parser.add_subparsers(dest="command"))
    sets = ["--set", "annotation.sample_size=30", "--set", "annotation.gold_tasks=3"]
    args = parser.parse_args(
        ["annotate", "export", str(run_dir), "--round", "2", "--file-only", *sets]
    )
    assert cmd_annotate(args) == 0
    tasks = json.loads((run_dir / "annotate" / "round-2" / "tasks.json").read_text())
    assert len(tasks) == 33
    assert "33 tasks (30 pairs + 3 gold" in capsys.readouterr().out
    assert cmd_annotate(parser.parse_args(["annotate"])) == 2


# ---- the server wrapper, with a stand-in executable (the real one: test_labelstudio.py) -----


def _fake_venv(tmp_path: Path, script: str) -> Path:
    venv = tmp_path / "fake-venv"
    exe = venv / "bin" / "label-studio"
    exe.parent.mkdir(parents=True)
    exe.write_text("#!/bin/sh\n" + script)
    exe.chmod(0o755)
    return venv


def test_server_that_exits_early_reports_its_log_tail(tmp_path):
    from pipeline.annotate.server import LabelStudioServer, free_port

    venv = _fake_venv(tmp_path, "echo 'django.db.utils.OperationalError: boom' >&2\nexit 3\n")
    server = LabelStudioServer(
        venv, tmp_path / "data", port=free_port(), token="t" * 40, password="pw"
    )
    with pytest.raises(LabelStudioError) as err:
        server.start()
    msg = str(err.value)
    assert "exited with code 3" in msg and "OperationalError: boom" in msg
    assert "t" * 40 not in msg
    assert not server.running


def test_server_that_never_answers_times_out_and_is_stopped(tmp_path):
    from pipeline.annotate.server import LabelStudioServer, free_port

    venv = _fake_venv(tmp_path, "echo starting\nexec sleep 60\n")
    server = LabelStudioServer(
        venv, tmp_path / "data", port=free_port(), token="t" * 40, password="pw",
        startup_timeout=1.5,
    )  # fmt: skip
    with pytest.raises(LabelStudioError, match=r"did not answer .*/health within 2 s"):
        server.start()
    assert not server.running  # the stand-in was killed, not left behind


def test_server_venv_without_label_studio_is_a_clear_error(tmp_path):
    from pipeline.annotate.server import ensure_server_venv

    with pytest.raises(LabelStudioError, match=r"no label-studio in .*pip install label-studio"):
        ensure_server_venv(tmp_path / "absent", create=False)


FAKE_PIP = """\
import pathlib, sys, time
go = pathlib.Path(sys.argv[1])
for name in ("django", "numpy", "label-studio-sdk"):
    print("Collecting " + name + "==1.0", flush=True)
while not go.exists():  # the test lets it finish once it has seen the progress it wants
    time.sleep(0.05)
print("Installing collected packages: django, numpy, label-studio-sdk", flush=True)
print("Successfully installed django-1.0 numpy-1.0 label-studio-sdk-1.0", flush=True)
"""


def test_a_first_install_says_how_far_it_got_and_where_its_log_is(tmp_path, monkeypatch):
    """`prb annotate serve`'s first start said "installing ... (takes minutes)" and then
    nothing for 25 minutes (issue 52): now the first line names the log and how to use a
    venv one already has, and a line follows at least every PROGRESS_EVERY_S (<= 30 s)
    with what pip has collected. pip is played by a script here (the real install is
    measured in README.md); the progress is parsed from its real output format."""
    import sys

    from pipeline.annotate import server

    assert server.PROGRESS_EVERY_S <= 30
    venv = tmp_path / "ls" / "venv"
    script = tmp_path / "fake_pip.py"
    script.write_text(FAKE_PIP)
    go = tmp_path / "go"
    monkeypatch.setattr(
        server,
        "_install_commands",
        lambda v: [[sys.executable, "-c", "pass"], [sys.executable, str(script), str(go)]],
    )
    said: list[str] = []

    def echo(line: str) -> None:
        said.append(line)
        if "collected 3 packages" in line:
            go.touch()

    server.ensure_server_venv(venv, echo=echo, every_s=0.05)
    log = server.install_log(venv)
    assert f"tail -f {log}" in said[0] and "annotation.server_venv=PATH" in said[0]
    assert "PRB_LABEL_STUDIO_VENV" in said[0]
    assert any("collected 3 packages so far (the latest: label-studio-sdk==1.0)" in s for s in said)
    assert said[-1].endswith("installed 3 packages; Label Studio is installed")
    assert "Successfully installed" in log.read_text()


def test_serve_takes_a_named_venv_from_the_config_or_the_environment(tmp_path, monkeypatch):
    from pipeline.annotate.server import server_venv
    from pipeline.config import config_from_overrides

    monkeypatch.delenv("PRB_LABEL_STUDIO_VENV", raising=False)
    assert server_venv(config_from_overrides([]).annotation) == Path(".labelstudio/venv")
    monkeypatch.setenv("PRB_LABEL_STUDIO_VENV", str(tmp_path / "mine"))
    assert server_venv(config_from_overrides([]).annotation) == tmp_path / "mine"
    named = config_from_overrides([f"annotation.server_venv={tmp_path / 'cfg'}"])
    assert server_venv(named.annotation) == tmp_path / "cfg"  # the config's wins
