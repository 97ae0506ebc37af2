"""The audit: shortcut probe on crafted sets, every input format, schema errors, and a
report that is self-contained and carries the same figures as its JSON."""

from __future__ import annotations

import json
import random
import re

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.audit import PROBE_FLAG_AUC, audit, load_pairs
from pipeline.cli import main
from pipeline.core.errors import InputError
from pipeline.publish import DATA_FILE
from pipeline.release import features as release_features

VOCAB = (
    "garden budget commute recipe training weekend museum novel guitar budget family city "
    "walk savings habit journal friend library coffee plan morning evening season market"
).split()


# Answers draw from a larger made-up vocabulary: with only the 24 words above, any two
# answers hold the same set of words and near-duplicate each other by token_set_ratio.
ANSWER_VOCAB = VOCAB + [
    a + b
    for a in ("ka", "lo", "mi", "ne", "ru", "sa", "te", "vo")
    for b in ("bar", "dim", "fen", "gol", "hux", "jat", "kel", "mop", "nir", "pul", "quin", "rast")
]


def _text(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(ANSWER_VOCAB) for _ in range(n)).capitalize() + "."


def crafted(n: int, biased: bool, seed: int = 1) -> list[dict]:
    """Pairs in the reference schema. biased: every chosen is the rejected plus 15-30
    words; balanced: both sides drawn from the same length distribution."""
    rng = random.Random(seed)
    posts = random.Random(seed + 1000)  # its own stream: the pairs stay what they were
    rows = []
    for i in range(n):
        q = f"How should I plan my {rng.choice(VOCAB)} this {rng.choice(VOCAB)}?"
        rejected = _text(rng, rng.randint(30, 60))
        if biased:
            chosen = rejected[:-1] + " " + _text(rng, rng.randint(15, 30))
        else:
            chosen = _text(rng, rng.randint(30, 60))
        rows.append(
            {
                "id": f"ex-{i}",
                "question": q,
                # one user per row: distinct profiles (a shared profile would make every
                # row the same person, and repeated questions their duplicates); not
                # "past post 3" / "past post 4", which token_sort_ratio scores 91
                "profile": [{"id": f"p{i}", "category": "Cat", "text": _text(posts, 12)}],
                "rubric_aspects": [{"aspect": "a", "evidence": "e", "reason": "r"}],
                "narrative": "why I ask",
                "category": "Alpha" if i % 3 else "Beta",
                "chosen": chosen,
                "rejected": rejected,
            }
        )
    return rows


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_length_biased_set_is_flagged(tmp_path):
    src = write_jsonl(tmp_path / "biased.jsonl", crafted(150, biased=True))
    fig = audit(src, tmp_path / "out")
    probe = fig["shortcut_probe"]
    assert fig["length"]["share_chosen_longer"] == 1.0
    assert probe["auc"] > 0.95
    assert probe["flagged"] is True and probe["above_chance"] is True
    assert probe["auc"] > probe["chance_auc_p95"]
    assert len(probe["fold_aucs"]) == 5
    assert probe["single_feature_auc"]["words"] == 1.0  # length alone separates them
    reasons = fig["verdict"]["reasons"]
    assert fig["verdict"]["status"] == "flagged" and probe["status"] == "flagged"
    assert [r["kind"] for r in reasons if r["gate"] == "shortcut_probe"] == ["flagged"]


def test_balanced_set_passes(tmp_path):
    # 300 pairs: the chance spread of the AUC is about 0.045 here (0.07 at 150 pairs)
    src = write_jsonl(tmp_path / "balanced.jsonl", crafted(300, biased=False))
    fig = audit(src, tmp_path / "out")
    probe = fig["shortcut_probe"]
    assert abs(probe["auc"] - 0.5) < 0.08
    assert probe["auc"] <= PROBE_FLAG_AUC
    assert probe["flagged"] is False
    assert probe["above_chance"] is False
    assert 0.45 < probe["chance_auc_mean"] < 0.55
    assert probe["status"] == "clear" and fig["verdict"]["status"] == "clear"
    assert fig["verdict"]["reasons"] == []
    assert 0.35 < fig["length"]["share_chosen_longer"] < 0.65


def test_probe_figures_depend_on_the_set_not_on_the_row_order(tmp_path):
    # the folds and the side swaps are drawn by position: before the rows were put in one
    # order, a shuffled file (or a release beside the run it came from, whose rows come in
    # another order) moved the chance level enough to turn "flagged" into "too small"
    rows = crafted(40, biased=False, seed=5)
    ref = audit(write_jsonl(tmp_path / "r.jsonl", rows), tmp_path / "or")
    for seed in (1, 2, 3):
        shuffled = rows[:]
        random.Random(seed).shuffle(shuffled)
        got = audit(write_jsonl(tmp_path / f"s{seed}.jsonl", shuffled), tmp_path / f"o{seed}")
        assert got["shortcut_probe"] == ref["shortcut_probe"]
        assert got["verdict"] == ref["verdict"]
    # ids do not decide the order either: the same pairs renamed give the same figures
    renamed = [{**r, "id": f"other-{len(rows) - i}"} for i, r in enumerate(rows)]
    got = audit(write_jsonl(tmp_path / "n.jsonl", renamed[::-1]), tmp_path / "on")
    assert got["shortcut_probe"] == ref["shortcut_probe"]


def test_probe_is_deterministic_and_skips_tiny_sets(tmp_path):
    rows = crafted(60, biased=False, seed=3)
    a = audit(write_jsonl(tmp_path / "a.jsonl", rows), tmp_path / "oa")["shortcut_probe"]
    b = audit(write_jsonl(tmp_path / "b.jsonl", rows), tmp_path / "ob")["shortcut_probe"]
    assert a["fold_aucs"] == b["fold_aucs"]  # fixed seed: same folds, same figures
    tiny = audit(write_jsonl(tmp_path / "t.jsonl", rows[:4]), tmp_path / "ot")
    assert "skipped" in tiny["shortcut_probe"] and tiny["verdict"]["status"] == "too_small"
    # too small to clear: a warning, never a green "no shortcut" (issue 11, item 3)
    assert [r["kind"] for r in tiny["verdict"]["reasons"]] == ["cannot_clear"]
    page = (tmp_path / "ot" / "audit.html").read_text(encoding="utf-8")
    assert "No shortcut flagged" not in page and 'class="ok"' not in page


def test_same_figures_from_jsonl_parquet_and_save_to_disk(tmp_path):
    from datasets import Dataset, DatasetDict

    rows = crafted(40, biased=True)
    src_jsonl = write_jsonl(tmp_path / "pairs.jsonl", rows)
    src_json = tmp_path / "pairs.json"  # one JSON array rather than JSON lines
    src_json.write_text(json.dumps(rows), encoding="utf-8")
    src_parquet = tmp_path / "pairs.parquet"
    pq.write_table(pa.Table.from_pylist(rows), src_parquet)
    src_disk = tmp_path / "saved"
    Dataset.from_list(rows).save_to_disk(str(src_disk))
    src_dict = tmp_path / "saved_dict"
    DatasetDict({"test": Dataset.from_list(rows)}).save_to_disk(str(src_dict))

    results = {}
    for name, src in [
        ("jsonl", src_jsonl),
        ("json", src_json),
        ("parquet", src_parquet),
        ("save_to_disk", src_disk),
        ("save_to_disk", src_dict),
    ]:
        fig = audit(src, tmp_path / f"out-{src.name}")
        assert fig["source"]["format"] == name
        results[src.name] = {k: fig[k] for k in ("n_pairs", "length", "similarity")} | {
            "auc": fig["shortcut_probe"]["auc"],
            "cats": fig["per_category"],
        }
    first = next(iter(results.values()))
    assert first["n_pairs"] == 40
    assert set(first["cats"]) == {"Alpha", "Beta"}
    assert first["cats"]["Beta"]["pairs"] == 14  # i % 3 == 0 for 14 of 0..39
    assert all(r == first for r in results.values())


def test_bad_schema_names_file_and_column(tmp_path):
    rows = [{k: v for k, v in r.items() if k != "rejected"} for r in crafted(12, False)]
    src = write_jsonl(tmp_path / "no_rejected.jsonl", rows)
    with pytest.raises(InputError) as err:
        audit(src, tmp_path / "out")
    assert str(src) in str(err.value) and "'rejected'" in str(err.value)
    assert err.value.field == "rejected"
    assert not (tmp_path / "out").exists()

    pq_src = tmp_path / "no_chosen.parquet"
    pq.write_table(
        pa.Table.from_pylist(
            [{k: v for k, v in r.items() if k != "chosen"} for r in crafted(5, 0)]
        ),
        pq_src,
    )
    with pytest.raises(InputError) as err:
        load_pairs(pq_src)
    assert str(pq_src) in str(err.value) and "'chosen'" in str(err.value)

    from datasets import Dataset

    disk = tmp_path / "no_question"
    Dataset.from_list([{"chosen": "a", "rejected": "b"}]).save_to_disk(str(disk))
    with pytest.raises(InputError) as err:
        load_pairs(disk)
    assert str(disk) in str(err.value) and "'question'" in str(err.value)

    # the CLI prints the same message and exits 1, without a traceback
    assert main(["audit", str(src), "--out", str(tmp_path / "cli")]) == 1


def test_html_is_self_contained_and_matches_json(tmp_path):
    rows = crafted(30, biased=True)
    rows[0]["category"] = "<script>alert(1)</script>"  # text from the data is escaped
    fig = audit(write_jsonl(tmp_path / "p.jsonl", rows), tmp_path / "out")
    page = (tmp_path / "out" / "audit.html").read_text(encoding="utf-8")
    saved = json.loads((tmp_path / "out" / "audit.json").read_text(encoding="utf-8"))

    assert not re.search(r"""(?:src|href)\s*=\s*["']?\s*(?:https?:)?//""", page, re.I)
    assert "<link" not in page.lower() and "@import" not in page
    assert page.count("<svg") >= 3  # word counts, similarity, probe (and per category)
    assert "<script>alert(1)</script>" not in page

    embedded = re.search(r'<script type="application/json" id="figures">(.*?)</script>', page, re.S)
    assert embedded is not None
    from_page = json.loads(embedded.group(1))  # "<" is written as \u003c: plain JSON
    returned = {k: v for k, v in fig.items() if k != "outputs"}
    assert from_page == saved == json.loads(json.dumps(returned))
    assert f"{fig['shortcut_probe']['auc']:.4g}" in page


def _release(tmp_path, n: int = 20):
    """A release folder in our schema with known judge and human columns."""
    base = crafted(n, biased=False, seed=5)
    rows = []
    for i, r in enumerate(base):
        q_ch = {"correctness": 5 if i < 4 else 4, "relevance": 4, "helpfulness": 4}
        blind = (
            {"AB": "chosen", "BA": "chosen"}
            if i < 5
            else {"AB": "chosen", "BA": "tie"}
            if i < 10
            else {"AB": "tie", "BA": "tie"}
        )
        rows.append(
            {
                **r,
                "quality_chosen": q_ch,
                "quality_rejected": {"correctness": 4, "relevance": 4, "helpfulness": 4},
                "coverage_chosen_mean": 2.0,
                "coverage_rejected_mean": 0.5,
                "pairwise_blind": blind,
                "human_verdict": "verified" if i < 6 else None,
                "human_agreement": 1.0 if i < 3 else (2 / 3 if i < 6 else None),
            }
        )
    feats = release_features()
    full = [{name: row.get(name) for name in feats} for row in rows]
    rel = tmp_path / "release"
    (rel / "all").mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(full, schema=feats.arrow_schema), rel / "all" / DATA_FILE)
    (rel / "README.md").write_text("---\nlicense: cc-by-4.0\n---\n")
    (rel / "release.json").write_text(
        json.dumps(
            {
                "agreement": {
                    "round-1": {"krippendorff_alpha": 0.42, "items": 6, "items_with_2plus": 4}
                }
            }
        )
    )
    return rel


def test_release_folder_judge_and_human_figures(tmp_path):
    rel = _release(tmp_path)
    fig = audit(rel, tmp_path / "out")
    assert fig["source"]["format"] == "release" and fig["n_pairs"] == 20
    # 5 pairs chosen/chosen, 5 chosen/tie, 10 tie/tie: 15 of 40 verdicts prefer the chosen
    assert fig["leakage"]["verdicts"] == 40
    assert fig["leakage"]["share_prefers_chosen"] == 0.375
    assert fig["leakage"]["share_pairs_chosen_both_orders"] == 0.25
    assert fig["quality_gap"]["dimensions"]["correctness"]["mean_gap"] == 0.2
    assert fig["quality_gap"]["dimensions"]["relevance"]["share_chosen_higher"] == 0.0
    assert fig["coverage_gap"]["mean_gap"] == 1.5
    assert fig["agreement"]["annotated_pairs"] == 6
    assert fig["agreement"]["mean_vote_share"] == pytest.approx(0.8333, abs=1e-4)
    assert fig["agreement"]["rounds"]["round-1"]["krippendorff_alpha"] == 0.42
    # the report's table names each figure in words, never by its key
    page = (tmp_path / "out" / "audit.html").read_text(encoding="utf-8")
    table = page.split("<h2>Human agreement</h2>", 1)[1].split("<h2>", 1)[0]
    for label, value in (
        ("tasks annotated", "6"),
        ("tasks with two or more votes", "4"),
        ("Krippendorff&#x27;s alpha", "0.42"),
    ):
        assert re.search(rf"<t[dh]>{label}</t[dh]>\s*<td[^>]*>{value}", table), label
    assert "2plus" not in table and "krippendorff_alpha" not in table


def test_judge_callable_measures_leakage_on_plain_files(tmp_path):
    src = write_jsonl(tmp_path / "p.jsonl", crafted(20, biased=True))

    def longer(_q: str, a: str, b: str) -> str:
        return "A" if len(a) > len(b) else "B"

    fig = audit(src, tmp_path / "o1", judge=longer)
    assert fig["leakage"]["source"] == "judge callable"
    assert fig["leakage"]["share_prefers_chosen"] == 1.0

    def always_a(_q: str, a: str, b: str) -> str:
        return "A"  # pure position bias: half the verdicts land on the chosen

    fig = audit(src, tmp_path / "o2", judge=always_a)
    assert fig["leakage"]["share_prefers_chosen"] == 0.5
    assert fig["leakage"]["share_pairs_chosen_both_orders"] == 0.0
    # without a judge and without judge columns there is no leakage figure
    assert audit(src, tmp_path / "o3")["leakage"] is None


def test_rank_auc_matches_sklearn():
    import numpy as np
    from sklearn.metrics import roc_auc_score

    from pipeline.audit import _auc

    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, 300)
    for score in (rng.integers(0, 5, 300).astype(float), rng.normal(size=300)):  # ties, none
        assert _auc(y, score) == pytest.approx(roc_auc_score(y, score), abs=1e-12)


@pytest.mark.parametrize("fmt", ["release", "jsonl"])
def test_compact_rows_give_the_figures_and_flags_of_whole_rows(tmp_path, monkeypatch, fmt):
    """The audit checks each row's types as it reads it, then keeps only what it reads
    (the profile as one shared text): its figures and flags are those of the whole rows,
    read in batches too small to hold a file (a duplicate and a near-duplicate found by
    their shared profile, as the rows have no user id)."""
    from pipeline.audit import load as load_mod
    from pipeline.audit.figures import analyse
    from pipeline.audit.report import flags_jsonl

    monkeypatch.setattr(load_mod, "BATCH_ROWS", 7)
    if fmt == "release":
        src = _release(tmp_path, n=40)
    else:
        rows = crafted(40, biased=True)
        rows[5] = {**rows[4], "id": "ex-dup"}  # the same person, question and answers
        rows[7] = {**rows[6], "id": "ex-near", "question": rows[6]["question"] + " Please."}
        src = write_jsonl(tmp_path / "pairs.jsonl", rows)
    fig = audit(src, tmp_path / "out")
    whole, source = load_pairs(src)
    assert isinstance(whole[0]["profile"], list)  # the whole rows: posts as objects
    figures, flags = analyse(whole, source)
    figures["checks"]["rules"]["from"] = fig["checks"]["rules"]["from"]
    written = json.loads((tmp_path / "out" / "audit.json").read_text(encoding="utf-8"))
    # the release's validity claims are read from other commands' outputs, not analysed
    assert "claims" in written.pop("validity")
    assert written == json.loads(json.dumps(figures))
    assert (tmp_path / "out" / "flags.jsonl").read_text(encoding="utf-8") == flags_jsonl(flags)
    if fmt == "jsonl":
        assert {"duplicate_row", "near_duplicate"} <= {f["check"] for f in flags}


def test_compact_reading_names_the_first_bad_row_as_before(tmp_path):
    """A row of the wrong type is named as the whole-row check names it: the first one,
    with its file, line and field, and nothing is written."""
    from pipeline.audit.load import check_types

    rows = crafted(12, biased=False)
    rows[3]["chosen"] = 7
    rows[8]["rejected"] = ["not", "text"]
    src = write_jsonl(tmp_path / "pairs.jsonl", rows)
    whole, source = load_pairs(src)
    with pytest.raises(InputError) as want:
        check_types(whole, source)
    with pytest.raises(InputError) as got:
        audit(src, tmp_path / "out")
    assert str(got.value) == str(want.value)
    assert "line 4" in str(got.value) and "chosen" in str(got.value)
    assert not (tmp_path / "out").exists()
