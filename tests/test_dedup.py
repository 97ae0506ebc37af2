"""pipeline.rules.dedup: MinHash + LSH near-duplicate detection, checked against planted edits and
against brute force. All texts here are synthetic (made-up words, Zipf-like frequencies)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from rapidfuzz import fuzz, process
from rapidfuzz.utils import default_process

from pipeline.rules.dedup import (
    Duplicate,
    _minhash,
    _shingle_hashes,
    _tokenize,
    _verify,
    drop_later_duplicates,
    duplicate_groups,
    near_duplicate_pairs,
    person_clusters,
    personal_duplicates,
)

ROOT = Path(__file__).resolve().parent.parent


def _vocab(rng: np.random.Generator, size: int = 3000) -> list[str]:
    letters = list("abcdefghijklmnopqrstuvwxyz")
    words: dict[str, None] = {}
    while len(words) < size:
        words["".join(rng.choice(letters, size=int(rng.integers(3, 9))))] = None
    return list(words)


def _corpus(n: int, seed: int, lo: int = 45, hi: int = 76) -> tuple[list[list[str]], list[str]]:
    """``n`` random word lists of lo..hi-1 words (Zipf-like draws) and the vocabulary."""
    rng = np.random.default_rng(seed)
    vocab = _vocab(rng)
    weights = 1.0 / np.arange(1, len(vocab) + 1) ** 1.1
    weights /= weights.sum()
    docs = [
        [vocab[k] for k in rng.choice(len(vocab), size=int(rng.integers(lo, hi)), p=weights)]
        for _ in range(n)
    ]
    return docs, vocab


def _render(words: list[str]) -> str:
    """Words as text with sentence punctuation and capitals, which normalisation removes."""
    out = []
    for start in range(0, len(words), 10):
        chunk = words[start : start + 10]
        out.append(" ".join([chunk[0].capitalize(), *chunk[1:]]) + ".")
    return " ".join(out)


def _edit(words: list[str], kind: str, rng: np.random.Generator, vocab: list[str]) -> list[str]:
    """A near-duplicate: ``subN`` substitutes N words at random places, ``move`` moves a clause."""
    if kind == "move":
        cut = int(rng.integers(8, 15))  # the first clause goes to the end
        return words[cut:] + words[:cut]
    changed = list(words)
    for p in rng.choice(len(words), size=int(kind[-1]), replace=False).tolist():
        while changed[p] == words[p]:
            changed[p] = vocab[int(rng.integers(len(vocab)))]
    return changed


def _planted(
    n: int, n_planted: int, seed: int, kinds: tuple[str, ...] = ("sub1", "sub2", "sub3", "move")
) -> tuple[list[str], set[tuple[int, int]]]:
    """``n`` texts of which ``n_planted`` are edited copies of others, and the planted pairs."""
    docs, vocab = _corpus(n - n_planted, seed)
    rng = np.random.default_rng(seed + 1)
    texts = [_render(d) for d in docs]
    pairs = set()
    for k, base in enumerate(rng.choice(len(docs), size=n_planted, replace=False).tolist()):
        texts.append(_render(_edit(docs[base], kinds[k % len(kinds)], rng, vocab)))
        pairs.add((base, len(texts) - 1))
    return texts, pairs


@pytest.fixture(scope="module")
def planted_2000() -> tuple[list[str], set[tuple[int, int]]]:
    return _planted(2000, 40, seed=1)


def test_planted_near_duplicates_are_all_found(planted_2000):
    texts, planted = planted_2000
    pairs = near_duplicate_pairs(texts)
    found = {(i, j) for i, j, _ in pairs}
    assert planted <= found, f"missed {sorted(planted - found)}"
    # Precision: every reported pair is a planted one, and its score really passes.
    assert found == planted
    assert all(score >= 90.0 for *_, score in pairs)


def test_unrelated_texts_are_never_reported():
    docs, _ = _corpus(2000, seed=7)
    texts = [_render(d) for d in docs]
    stats: dict[str, float] = {}
    assert near_duplicate_pairs(texts, stats=stats) == []
    # Blocking did its job: a handful of candidates at most, not millions of pairs.
    assert stats["candidate_pairs"] < 50


def test_output_is_sorted_pairs_with_i_below_j(planted_2000):
    texts, _ = planted_2000
    pairs = near_duplicate_pairs(texts)
    assert pairs == sorted(pairs)
    assert all(i < j for i, j, _ in pairs)
    assert all(isinstance(i, int) and isinstance(s, float) for i, _, s in pairs)


def test_exact_duplicates_and_case_or_punctuation_only_differences():
    docs, _ = _corpus(50, seed=3)
    texts = [_render(d) for d in docs]
    texts.append(texts[10])  # 50: exact copy of 10
    texts.append(texts[20].upper().replace(".", "!"))  # 51: same words as 20
    pairs = near_duplicate_pairs(texts)
    assert (10, 50, 100.0) in pairs
    assert (20, 51, 100.0) in pairs
    assert len(pairs) == 2


def test_short_texts_use_their_word_set():
    texts = ["Thank you!", "thank you", "You, thank.", "No.", "Yes", "yes!!", "ok", "fine thanks"]
    pairs = {(i, j) for i, j, _ in near_duplicate_pairs(texts)}
    # Shorter than a shingle: compared as word sets, like token_set_ratio does.
    assert pairs == {(0, 1), (0, 2), (1, 2), (4, 5)}


def test_empty_input_and_empty_texts():
    assert near_duplicate_pairs([]) == []
    assert near_duplicate_pairs(["only one text here"]) == []
    # Texts with no words once normalised are never reported, not even with each other.
    assert near_duplicate_pairs(["", "", "  ", "?!", "same words", "same words"]) == [(4, 5, 100.0)]
    assert duplicate_groups([]) == []
    assert drop_later_duplicates([], []) == {}


def test_deterministic_within_and_across_processes(planted_2000):
    texts, _ = planted_2000
    texts = texts[:300] + texts[-40:]
    first = near_duplicate_pairs(texts, seed=5)
    assert first and near_duplicate_pairs(texts, seed=5) == first
    # A fresh interpreter with another str-hash salt gives the same answer: word hashes are
    # blake2b, not hash().
    code = (
        "import json, sys; from pipeline.rules.dedup import near_duplicate_pairs as f; "
        "print(json.dumps(f(json.load(sys.stdin), seed=5)))"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run(
        [sys.executable, "-c", code],
        input=json.dumps(texts),
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
        env=env,
    )
    assert [tuple(p) for p in json.loads(out.stdout)] == first


def test_signature_agreement_estimates_jaccard():
    """The MinHash itself: the share of equal rows estimates the shingle Jaccard."""
    docs, vocab = _corpus(40, seed=11)
    rng = np.random.default_rng(0)
    texts = []
    for d in docs[:20]:
        texts += [_render(d), _render(_edit(d, "sub6", rng, vocab))]
    tokens, lengths, normalised = _tokenize(texts)
    shingles, counts = _shingle_hashes(tokens, lengths, 3)
    assert counts.tolist() == [len(t.split()) - 2 for t in normalised]
    sig = _minhash(shingles, counts, 256, seed=0)
    errors = []
    for k in range(0, len(texts), 2):
        a, b = (
            {tuple(w[i : i + 3]) for i in range(len(w) - 2)}
            for w in (normalised[k].split(), normalised[k + 1].split())
        )
        errors.append(np.mean(sig[:, k] == sig[:, k + 1]) - len(a & b) / len(a | b))
    # Standard error with 256 rows is <= 0.03 per pair; a broken hash or reduceat is far off.
    assert abs(np.mean(errors)) < 0.03
    assert max(abs(e) for e in errors) < 0.12


def test_oversized_bucket_is_windowed_but_stays_one_group():
    docs, _ = _corpus(30, seed=4)
    boiler = "I am sorry, but I cannot help with that request today."
    texts = [_render(d) for d in docs] + [boiler] * 60
    every = near_duplicate_pairs(texts, max_bucket=60)
    assert len(every) == 60 * 59 // 2  # a bucket of 60 <= max_bucket: all pairs listed
    capped = near_duplicate_pairs(texts, max_bucket=10, window=3)
    assert 0 < len(capped) <= 60 * 3  # sliding window: at most `window` pairs per member
    assert duplicate_groups(texts, max_bucket=10, window=3) == [list(range(30, 90))]


def _templated(n: int, seed: int) -> list[str]:
    """Questions written from three templates with four 10-word slots and two free words:
    buckets of hundreds of members that share a template, as a generated set has."""
    rng = np.random.default_rng(seed)
    vocab = _vocab(rng, 400)
    templates = [
        "How do I get started with {a} {b} when I only have {c} {d} free?",
        "What is the best way to stay motivated with {a} {b} given {c} {d}?",
        "Any advice on {a} {b} for someone with {c} {d} and little else?",
    ]
    pools = [vocab[k * 10 : (k + 1) * 10] for k in range(4)]
    texts = []
    for _ in range(n):
        slots = {s: pool[int(rng.integers(10))] for s, pool in zip("abcd", pools, strict=True)}
        tail = " ".join(rng.choice(vocab[40:], 2).tolist())
        texts.append(templates[int(rng.integers(3))].format(**slots) + " " + tail)
    return texts


def test_oversized_buckets_are_split_keeping_recall():
    """2,000 templated questions, brute force at 90 (337 pairs): without splitting (one huge
    max_bucket) LSH finds 0.94 of them from 208k candidates; split at 50 it finds 0.91 from
    75k, and the pairs it finds are verified ones."""
    texts = _templated(2000, seed=7)
    norm = [" ".join(default_process(t).split()) for t in texts]
    scores = process.cdist(norm, norm, scorer=fuzz.token_set_ratio, workers=-1)
    brute = {(int(i), int(j)) for i, j in zip(*np.nonzero(scores >= 90.0), strict=True) if i < j}
    kw = {"shingle": 2, "num_perm": 128, "bands": 32}
    whole: dict[str, float] = {}
    unsplit = {
        (i, j) for i, j, _ in near_duplicate_pairs(texts, max_bucket=10**9, stats=whole, **kw)
    }
    split: dict[str, float] = {}
    found = {(i, j) for i, j, _ in near_duplicate_pairs(texts, max_bucket=50, stats=split, **kw)}
    assert found <= brute and unsplit <= brute
    assert split["candidate_pairs"] < 0.5 * whole["candidate_pairs"]
    assert len(found) >= 0.95 * len(unsplit), (len(found), len(unsplit), len(brute))


def test_groups_are_connected_components():
    docs, vocab = _corpus(200, seed=9, lo=40, hi=41)
    # Distinct words, so that every replaced word really leaves the word set.
    a = [str(w) for w in np.random.default_rng(0).choice(vocab, size=40, replace=False)]
    # Replacements are digit strings: no letters in common with the words they replace, which
    # token_set_ratio would otherwise partly credit.
    b = [*a[:5], *(f"{k:06d}" for k in range(1, 6)), *a[10:]]  # five contiguous words replaced
    c = [*b[:25], *(f"{k:06d}" for k in range(6, 11)), *b[30:]]  # five more, elsewhere
    texts = [_render(d) for d in docs]
    texts[10], texts[50], texts[120] = _render(a), _render(b), _render(c)
    norm = [default_process(t) for t in (texts[10], texts[50], texts[120])]
    # The scenario: a~b and b~c pass, a~c does not.
    assert fuzz.token_set_ratio(norm[0], norm[1]) >= 90
    assert fuzz.token_set_ratio(norm[1], norm[2]) >= 90
    assert fuzz.token_set_ratio(norm[0], norm[2]) < 90
    pairs = {(i, j) for i, j, _ in near_duplicate_pairs(texts)}
    assert pairs == {(10, 50), (50, 120)}
    texts[150] = texts[160]  # a second, separate group
    assert duplicate_groups(texts) == [[10, 50, 120], [150, 160]]


def test_drop_later_duplicates_keeps_the_smallest_id():
    docs, _ = _corpus(20, seed=5)
    texts = [_render(d) for d in docs]
    texts[7] = texts[3]
    texts[15] = texts[3].lower()
    ids = [f"ex-{k:03d}" for k in range(20)]
    ids[3], ids[7], ids[15] = "ex-900", "ex-100", "ex-500"
    assert drop_later_duplicates(ids, texts) == {"ex-900": "ex-100", "ex-500": "ex-100"}
    with pytest.raises(ValueError, match="ids for"):
        drop_later_duplicates(ids[:-1], texts)
    with pytest.raises(ValueError, match="unique"):
        drop_later_duplicates(["a", "a", *ids[2:]], texts)


def test_threshold_is_inclusive():
    docs, vocab = _corpus(1, seed=6, lo=30, hi=31)
    rng = np.random.default_rng(1)
    texts = [_render(docs[0]), _render(_edit(docs[0], "sub1", rng, vocab))]
    ((_, _, score),) = near_duplicate_pairs(texts, threshold=0.0)
    assert 90 <= score < 100
    assert near_duplicate_pairs(texts, threshold=score) == [(0, 1, score)]
    assert near_duplicate_pairs(texts, threshold=min(100.0, score + 0.01)) == []


@pytest.mark.parametrize(
    "scorer", [fuzz.token_set_ratio, fuzz.token_sort_ratio, fuzz.ratio, fuzz.partial_ratio]
)
def test_verify_scores_are_the_scorers_own_on_the_texts(scorer):
    """_verify writes each text once in the form its scorer reads (sorted, or sorted distinct
    words); the scores must be exactly the scorer's on the normalised texts: repeated words,
    words in another order, case, punctuation and one-word texts included."""
    rng = np.random.default_rng(3)
    vocab = ["alpha", "beta", "Beta", "gamma,", "delta", "x", "épée", "2", "b2", "zeta-eta"]
    texts = [" ".join(rng.choice(vocab, size=int(rng.integers(1, 12))).tolist()) for _ in range(60)]
    texts += ["beta beta beta alpha", "alpha beta", "Alpha, BETA!", "", "   "]
    n = len(texts)
    _, _, normalised = _tokenize(texts)
    codes = np.array([i * n + j for i in range(n) for j in range(i + 1, n)], dtype=np.int64)
    got = {(i, j): score for i, j, score in _verify(codes, n, normalised, 0.0, scorer)}
    assert len(got) == codes.size  # threshold 0 keeps every candidate
    for i in range(n):
        for j in range(i + 1, n):
            assert got[i, j] == float(scorer(normalised[i], normalised[j])), (texts[i], texts[j])


@pytest.mark.parametrize(
    "kw", [{"num_perm": 64, "bands": 10}, {"shingle": 0}, {"threshold": 101}, {"max_bucket": 1}]
)
def test_bad_parameters_are_rejected(kw):
    with pytest.raises(ValueError):
        near_duplicate_pairs(["a b c", "a b c"], **kw)


def test_recall_against_brute_force():
    """All-pairs token_set_ratio on 300 texts (40 planted 1-3 word edits or a moved clause).

    Measured with the defaults (64 rows, 16 bands): brute force finds exactly the 40 planted
    pairs, LSH finds all 40 (recall 1.00, precision 1.00). For scale, the same check with
    heavier edits that brute force still scores >= 90, over seeds 21-23: 4 scattered words
    0.93-0.98, 5 words 0.80-0.90, 6-8 words 0.61-0.73 (0.80-0.95 with num_perm=128, bands=32),
    the expected cost of the S-curve at Jaccard 0.5 (see ``_candidates``).
    """
    texts, planted = _planted(300, 40, seed=21)
    norm = [default_process(t) for t in texts]
    scores = process.cdist(norm, norm, scorer=fuzz.token_set_ratio, workers=-1)
    brute = {(int(i), int(j)) for i, j in zip(*np.nonzero(scores >= 90.0), strict=True) if i < j}
    assert planted <= brute  # the planted edits really are near-duplicates
    found = {(i, j) for i, j, _ in near_duplicate_pairs(texts)}
    assert found <= brute  # verified pairs are exactly brute-force pairs
    recall = len(found & brute) / len(brute)
    assert recall >= 0.95, recall


# ---- near-duplicates in a personalized set (personal_duplicates) ---------------------------


def _rows_same_question(n_users: int, seed: int = 0) -> list[dict]:
    """``n_users`` users, each with an own profile, ask one question; all get the same
    generic rejected answer and an own chosen answer."""
    docs, _ = _corpus(2 * n_users + 1, seed)
    generic = _render(docs[-1])
    return [
        {
            "example_id": f"e{u:05d}",
            "user_id": f"u{u}",
            "profile": _render(docs[2 * u]),
            "question": "How do I keep a sourdough starter alive while travelling?",
            "chosen": _render(docs[2 * u + 1]),
            "rejected": generic,
        }
        for u in range(n_users)
    ]


def test_person_clusters():
    ids = ["u1", "u1", "u2", None, None, None, None]
    profiles = [None, "a b c", "x y z w v", "x y z w v", "p q r s t u", None, None]
    assert person_clusters(ids, profiles) == [0, 0, 2, 2, 4, 5, 5]


def test_many_users_one_question_none_dropped_and_a_repeat_found():
    """1,500 users ask the same question (one LSH bucket past max_bucket, compared only
    within a window): nobody is a duplicate, and one user asking twice still is."""
    rows = _rows_same_question(1500)
    assert personal_duplicates(rows) == {}
    again = {**rows[700], "example_id": "e99999", "chosen": "Feed it before you leave."}
    drops = personal_duplicates([*rows, again])
    assert list(drops) == ["e99999"]
    assert drops["e99999"] == Duplicate("question", "e00700")


def test_one_person_under_two_ids_is_found_within_its_group():
    """Profiles are compared between the rows of one near-duplicate group: a user who asks
    again under a new id with the same posts is the same person; another user asking the
    same question, with their own posts, is not."""
    rows = _rows_same_question(40, seed=5)
    twin = {**rows[12], "example_id": "e90000", "user_id": "u-new-account"}
    twin["chosen"] = "Keep it in the fridge and feed it once a week."
    drops = personal_duplicates([*rows, twin])
    assert drops == {"e90000": Duplicate("question", "e00012")}
    stranger = {**twin, "profile": _render(_corpus(1, seed=99)[0][0])}
    assert personal_duplicates([*rows, stranger]) == {}


def test_personal_duplicates_answer_and_pair_rules():
    rows = _rows_same_question(6, seed=3)
    # the same user, another question, reusing an answer: dropped (the later id)
    reuse = {**rows[1], "example_id": "e00100", "question": "Which bread flour is best?"}
    reuse["rejected"] = "Use a strong white flour with at least twelve percent protein."
    drops = personal_duplicates([*rows, reuse])
    assert drops == {"e00100": Duplicate("answer", "e00001", "chosen", "chosen")}
    # another user with both answers of rows[2]: the same pair twice
    copy = {**rows[2], "example_id": "e00200", "user_id": "u-other", "profile": "Else."}
    drops = personal_duplicates([*rows, copy])
    assert drops == {"e00200": Duplicate("pair", "e00002")}
