"""Agreement statistics: every expected figure is worked out by hand in the comments."""

from __future__ import annotations

import json
import random

import pytest

from pipeline.annotate.agreement import (
    LABELS,
    Annotation,
    cohen_kappa,
    gold_accuracy,
    human_vs_judge,
    krippendorff_alpha_nominal,
    majority,
    pairwise_cohen_kappa,
    raw_agreement,
    summarize,
)

C, R, T, BB = "chosen", "rejected", "tie", "both_bad"


def grid(rows: dict[str, list[str | None]]) -> list[Annotation]:
    """Annotations from ``{annotator: [label of item 1, item 2, ...]}``; None = no vote."""
    out = []
    for name, labels in rows.items():
        for i, lab in enumerate(labels, start=1):
            if lab is not None:
                out.append(Annotation(f"i{i}", name, lab))
    return out


# 4 items x 3 annotators, z skipped i3.
#        i1  i2  i3  i4
#   x    C   C   R   T
#   y    C   R   R   T
#   z    C   C   .   R
SMALL = grid({"x": [C, C, R, T], "y": [C, R, R, T], "z": [C, C, None, R]})


# --- Krippendorff's alpha -------------------------------------------------------------------


def test_alpha_small_case_from_coincidence_matrix():
    # Each item u with m_u votes adds 1/(m_u - 1) per ordered pair of its votes:
    #   i1 (C,C,C), m=3: o[C,C] += 3*2/2 = 3
    #   i2 (C,R,C), m=3: o[C,C] += 2*1/2 = 1; o[C,R] += 2*1/2 = 1; o[R,C] += 1
    #   i3 (R,R),   m=2: o[R,R] += 2*1/1 = 2
    #   i4 (T,T,R), m=3: o[T,T] += 1; o[T,R] += 1; o[R,T] += 1
    # Coincidence matrix:
    #          C  R  T | n_c
    #     C    4  1  0 |  5
    #     R    1  2  1 |  4
    #     T    0  1  1 |  2
    #   n = 11; off-diagonal sum = 4; sum_{c!=k} n_c n_k = 11^2 - (25 + 16 + 4) = 76
    #   alpha = 1 - (n - 1) * 4 / 76 = 1 - 40/76 = 36/76 = 9/19
    assert krippendorff_alpha_nominal(SMALL) == pytest.approx(9 / 19)
    assert krippendorff_alpha_nominal(SMALL) == pytest.approx(0.473684, abs=1e-6)


def test_alpha_krippendorff_2011_textbook_example():
    # Krippendorff (2011), "Computing Krippendorff's Alpha-Reliability", section C: 4 observers,
    # 12 units, values 1..5, missing values; published nominal alpha = 0.743.
    rows = {
        "A": ["1", "2", "3", "3", "2", "1", "4", "1", "2", None, None, None],
        "B": ["1", "2", "3", "3", "2", "2", "4", "1", "2", "5", None, "3"],
        "C": [None, "3", "3", "3", "2", "3", "4", "2", "2", "5", "1", None],
        "D": ["1", "2", "3", "3", "2", "4", "4", "1", "2", "5", "1", None],
    }
    # Unit 12 has one value, so it is not pairable. By hand:
    #   u1 (1,1,1) m=3: o11 += 3     u2 (2,2,3,2): o22 += 2, o23 = o32 += 1
    #   u3, u4 (3 x4): o33 += 4 each  u5, u9 (2 x4): o22 += 4 each   u7 (4 x4): o44 += 4
    #   u6 (1,2,3,4): every off-diagonal pair among 1..4 += 1/3
    #   u8 (1,1,2,1): o11 += 2, o12 = o21 += 1     u10 (5,5,5) m=3: o55 += 3   u11 (1,1): o11 += 2
    # Coincidence matrix:
    #          1     2     3     4   5 | n_c
    #     1    7    4/3   1/3   1/3  0 |  9
    #     2   4/3   10    4/3   1/3  0 | 13
    #     3   1/3   4/3    8    1/3  0 | 10
    #     4   1/3   1/3   1/3    4   0 |  5
    #     5    0     0     0     0   3 |  3
    # (n_c = 9, 13, 10, 5, 3 as published.) n = 40, off-diagonal sum = 8,
    #   sum_{c!=k} n_c n_k = 1600 - (81 + 169 + 100 + 25 + 9) = 1216
    #   alpha = 1 - 39 * 8 / 1216 = 904 / 1216 = 0.74342...
    alpha = krippendorff_alpha_nominal(grid(rows))
    assert alpha == pytest.approx(904 / 1216)
    assert round(alpha, 3) == 0.743


def test_alpha_perfect_agreement_is_one():
    anns = grid({"x": [C, R, T, BB], "y": [C, R, T, BB], "z": [C, R, None, BB]})
    assert krippendorff_alpha_nominal(anns) == pytest.approx(1.0)


def test_alpha_systematic_disagreement_is_negative():
    # i1 (C,R), i2 (R,C): o[C,R] = o[R,C] = 2, diagonal 0; n_C = n_R = 2, n = 4
    #   alpha = 1 - 3 * 4 / (16 - 4 - 4) = 1 - 12/8 = -0.5
    anns = grid({"x": [C, R], "y": [R, C]})
    assert krippendorff_alpha_nominal(anns) == pytest.approx(-0.5)


def test_alpha_all_identical_labels_is_none():
    anns = grid({"x": [C, C, C], "y": [C, C, C]})
    assert krippendorff_alpha_nominal(anns) is None
    # A different label on an item with a single vote is not pairable, so still None.
    anns.append(Annotation("i4", "x", R))
    assert krippendorff_alpha_nominal(anns) is None


def test_alpha_single_annotations_only_is_none():
    anns = [Annotation("i1", "x", C), Annotation("i2", "y", R), Annotation("i3", "x", T)]
    assert krippendorff_alpha_nominal(anns) is None
    assert krippendorff_alpha_nominal([]) is None


def test_alpha_ignores_items_with_one_vote():
    # Adding lone votes must not change the 9/19 of the small case.
    extra = [Annotation("i9", "x", BB), Annotation("i10", "y", T)]
    assert krippendorff_alpha_nominal(SMALL + extra) == pytest.approx(9 / 19)


def test_alpha_order_independent():
    shuffled = list(SMALL)
    random.Random(0).shuffle(shuffled)
    assert krippendorff_alpha_nominal(shuffled) == pytest.approx(9 / 19)


def test_alpha_label_set_validated_and_unused_labels_harmless():
    # "both_bad" is in LABELS but unused: nominal alpha is unchanged.
    assert krippendorff_alpha_nominal(SMALL, LABELS) == pytest.approx(9 / 19)
    with pytest.raises(ValueError, match="'A'"):
        krippendorff_alpha_nominal([*SMALL, Annotation("i1", "w", "A")], LABELS)


def test_duplicate_votes_keep_the_last():
    # x first said R on i1, then C: only C counts, so this is the perfect-agreement case.
    anns = [
        Annotation("i1", "x", R),
        Annotation("i1", "y", C),
        Annotation("i2", "x", R),
        Annotation("i2", "y", R),
        Annotation("i1", "x", C),
    ]
    assert krippendorff_alpha_nominal(anns) == pytest.approx(1.0)
    assert raw_agreement(anns) == pytest.approx(1.0)
    pair = pairwise_cohen_kappa(anns)[("x", "y")]
    assert pair["n_items"] == 2 and pair["raw_agreement"] == 1.0
    # Reversed, x's last vote on i1 is R: i1 (R,C), i2 (R,R).
    #   o[R,R] = 2, o[R,C] = o[C,R] = 1; n_R = 3, n_C = 1, n = 4
    #   alpha = 1 - 3 * 2 / (16 - 9 - 1) = 1 - 6/6 = 0
    anns[0], anns[-1] = anns[-1], anns[0]
    assert krippendorff_alpha_nominal(anns) == pytest.approx(0.0)
    assert raw_agreement(anns) == pytest.approx(0.5)
    s = summarize(anns)
    assert s["annotations"] == 4 and s["duplicates_dropped"] == 1


# --- Cohen's kappa --------------------------------------------------------------------------


def test_cohen_kappa_ten_items_2x2():
    #                b: C   b: R
    #     a: C         4      2      | 6
    #     a: R         1      3      | 4
    #                  5      5
    # po = (4 + 3)/10 = 0.7; pe = 0.6*0.5 + 0.4*0.5 = 0.5; kappa = (0.7 - 0.5)/(1 - 0.5) = 0.4
    a = [C] * 4 + [C] * 2 + [R] * 1 + [R] * 3
    b = [C] * 4 + [R] * 2 + [C] * 1 + [R] * 3
    assert cohen_kappa(a, b) == pytest.approx(0.4)
    assert cohen_kappa(b, a) == pytest.approx(0.4)  # symmetric


def test_cohen_kappa_edges():
    assert cohen_kappa([C, R], [C, R]) == pytest.approx(1.0)
    # po = 0, pe = 0.5*0.5 + 0.5*0.5 = 0.5 -> kappa = -1
    assert cohen_kappa([C, R], [R, C]) == pytest.approx(-1.0)
    assert cohen_kappa([C], [C]) is None  # n < 2
    assert cohen_kappa([], []) is None
    assert cohen_kappa([C, C, C], [C, C, C]) is None  # pe = 1
    # One rater constant, other not: pe = 1*(2/3) = 2/3, po = 2/3 -> kappa = 0 (defined).
    assert cohen_kappa([C, C, C], [C, C, R]) == pytest.approx(0.0)
    with pytest.raises(ValueError):
        cohen_kappa([C, R], [C])


def test_pairwise_cohen_kappa_small_case():
    pairs = pairwise_cohen_kappa(SMALL)
    assert set(pairs) == {("x", "y"), ("x", "z"), ("y", "z")}
    # x-y on i1..i4: x = C,C,R,T; y = C,R,R,T. po = 3/4.
    #   p_x = (C .5, R .25, T .25), p_y = (C .25, R .5, T .25)
    #   pe = .125 + .125 + .0625 = .3125; kappa = (.75 - .3125)/.6875 = 7/11
    assert pairs[("x", "y")] == {
        "kappa": pytest.approx(7 / 11),
        "n_items": 4,
        "raw_agreement": pytest.approx(0.75),
    }
    # x-z on i1, i2, i4: x = C,C,T; z = C,C,R. po = 2/3; pe = (2/3)(2/3) = 4/9
    #   kappa = (2/3 - 4/9)/(5/9) = 2/5
    assert pairs[("x", "z")]["kappa"] == pytest.approx(0.4)
    assert pairs[("x", "z")]["n_items"] == 3
    # y-z on i1, i2, i4: y = C,R,T; z = C,C,R. po = 1/3; pe = (1/3)(2/3) + (1/3)(1/3) = 1/3
    #   kappa = 0
    assert pairs[("y", "z")]["kappa"] == pytest.approx(0.0)
    assert pairs[("y", "z")]["raw_agreement"] == pytest.approx(1 / 3)


def test_pairwise_keys_sorted_and_non_overlapping_pairs_listed():
    anns = [
        Annotation("i1", "zoe", C),
        Annotation("i1", "amy", C),
        Annotation("i2", "bob", R),
    ]
    pairs = pairwise_cohen_kappa(anns)
    assert list(pairs) == [("amy", "bob"), ("amy", "zoe"), ("bob", "zoe")]
    assert pairs[("amy", "bob")] == {"kappa": None, "n_items": 0, "raw_agreement": None}
    # One shared item: raw agreement defined, kappa not (n_items < 2).
    assert pairs[("amy", "zoe")] == {"kappa": None, "n_items": 1, "raw_agreement": 1.0}


# --- raw agreement, majority ----------------------------------------------------------------


def test_raw_agreement_weights_items_by_pairs():
    # SMALL: i1 3/3 pairs agree, i2 1/3, i3 1/1, i4 1/3 -> (3 + 1 + 1 + 1)/(3 + 3 + 1 + 3) = 0.6
    # (an unweighted mean of item rates would be (1 + 1/3 + 1 + 1/3)/4 = 2/3 instead)
    assert raw_agreement(SMALL) == pytest.approx(0.6)
    assert raw_agreement([Annotation("i1", "x", C)]) is None
    assert raw_agreement([]) is None


def test_majority():
    assert majority([C, C, T]) == (C, pytest.approx(2 / 3))
    assert majority([C, R]) == (None, 0.5)  # tie: no majority
    assert majority([C, C, R, R, T]) == (None, pytest.approx(0.4))  # tie between top two
    assert majority([C, C, R, T]) == (C, 0.5)  # plurality, not a tie
    assert majority([BB]) == (BB, 1.0)
    assert majority([]) == (None, 0.0)


# --- human vs judge, gold -------------------------------------------------------------------


def test_human_vs_judge():
    verdicts = {"i1": C, "i2": R, "i3": None, "i4": T, "i5": C}
    judge = {"i1": C, "i2": C, "i3": C, "i4": T, "i6": R}
    # Counted: i1, i2, i4 (i3 human tie, i5 no judge, i6 no human).
    #   human C,R,T vs judge C,C,T: agreement 2/3
    #   p_h = (1/3 each), p_j = (C 2/3, T 1/3): pe = 2/9 + 1/9 = 1/3
    #   kappa = (2/3 - 1/3)/(1 - 1/3) = 0.5
    out = human_vs_judge(verdicts, judge)
    assert out == {"n": 3, "agreement": pytest.approx(2 / 3), "kappa": pytest.approx(0.5)}
    # A human "both_bad" never matches the judge.
    assert human_vs_judge({"i1": BB}, {"i1": C})["agreement"] == 0.0
    assert human_vs_judge({}, judge) == {"n": 0, "agreement": None, "kappa": None}


def test_gold_accuracy():
    gold = {"i1": C, "i2": R}
    anns = [
        *SMALL,
        Annotation("i5", "w", C),  # w labelled no gold item
    ]
    # x: i1 C (ok), i2 C (wrong) -> 1/2; y: i1 C ok, i2 R ok -> 2/2; z: i1 ok, i2 C wrong -> 1/2
    assert gold_accuracy(anns, gold) == {
        "w": {"n": 0, "correct": 0, "accuracy": None},
        "x": {"n": 2, "correct": 1, "accuracy": 0.5},
        "y": {"n": 2, "correct": 2, "accuracy": 1.0},
        "z": {"n": 2, "correct": 1, "accuracy": 0.5},
    }
    # A corrected gold vote (last one) is what gets graded.
    fixed = gold_accuracy([*anns, Annotation("i2", "x", R)], gold)
    assert fixed["x"] == {"n": 2, "correct": 2, "accuracy": 1.0}


# --- summary --------------------------------------------------------------------------------


def test_summarize_small_case_is_json_and_consistent():
    judge = {"i1": C, "i2": C, "i3": R, "i4": R}
    gold = {"i1": C}
    s = summarize([*SMALL, Annotation("i5", "x", BB)], judge=judge, gold=gold)
    assert json.loads(json.dumps(s, allow_nan=False)) == s
    assert s["items"] == 5
    assert s["annotators"] == 3
    assert s["annotations"] == 12
    assert s["duplicates_dropped"] == 0
    assert s["items_with_2plus"] == 4
    assert s["krippendorff_alpha"] == pytest.approx(9 / 19)  # i5 has one vote: not pairable
    assert s["raw_agreement"] == pytest.approx(0.6)
    assert set(s["pairwise_kappa"]) == {"x|y", "x|z", "y|z"}
    assert s["pairwise_kappa"]["x|y"]["kappa"] == pytest.approx(7 / 11)
    assert s["pairwise_kappa"]["x|y"]["annotators"] == ["x", "y"]
    # Majorities: i1 C (3/3), i2 C (2/3), i3 R (2/2), i4 T (2/3), i5 both_bad (1/1).
    assert s["majority"]["i2"] == {"label": C, "share": pytest.approx(2 / 3)}
    assert s["majority"]["i4"]["label"] == T
    # vs judge over i1..i4 (i5 has no judge): human C,C,R,T; judge C,C,R,R -> agreement 3/4
    #   p_h = (C .5, R .25, T .25), p_j = (C .5, R .5): pe = .25 + .125 = .375
    #   kappa = (.75 - .375)/.625 = 0.6
    assert s["human_vs_judge"] == {
        "n": 4,
        "agreement": pytest.approx(0.75),
        "kappa": pytest.approx(0.6),
    }
    assert s["gold_accuracy"]["x"] == {"n": 1, "correct": 1, "accuracy": 1.0}


def test_summarize_without_judge_or_gold_and_undefined_figures():
    s = summarize([Annotation("i1", "x", C)])
    assert s["human_vs_judge"] is None and s["gold_accuracy"] is None
    assert s["krippendorff_alpha"] is None and s["raw_agreement"] is None
    assert s["pairwise_kappa"] == {}
    assert json.loads(json.dumps(s, allow_nan=False)) == s


def test_summarize_rejects_unmapped_ab_labels():
    with pytest.raises(ValueError, match="'B'"):
        summarize([Annotation("i1", "x", "A"), Annotation("i1", "y", "B")])
    # labels=None accepts any label set (e.g. numeric codes).
    s = summarize([Annotation("i1", "x", "1"), Annotation("i1", "y", "2")], labels=None)
    assert s["raw_agreement"] == 0.0


# --- independent cross-check ----------------------------------------------------------------


def test_alpha_matches_krippendorff_package_on_random_data():
    # Optional: the hand-computed cases above are the primary check; this one only runs when the
    # reference implementation (PyPI "krippendorff", not a project dependency) is installed.
    kd = pytest.importorskip("krippendorff")
    np = pytest.importorskip("numpy")
    rng = random.Random(1234)
    for trial in range(25):
        n_coders, n_items = rng.randint(2, 5), rng.randint(3, 30)
        matrix = np.full((n_coders, n_items), np.nan)
        anns = []
        for c in range(n_coders):
            for i in range(n_items):
                if rng.random() < 0.25:
                    continue  # missing value
                v = rng.randrange(len(LABELS)) if rng.random() < 0.6 else i % len(LABELS)
                matrix[c, i] = v
                anns.append(Annotation(f"i{i}", f"c{c}", LABELS[v]))
        ours = krippendorff_alpha_nominal(anns)
        if ours is None:
            continue
        ref = kd.alpha(reliability_data=matrix, level_of_measurement="nominal")
        assert ours == pytest.approx(ref, abs=1e-9), trial
