"""Near-duplicate detection over many texts: MinHash + LSH blocking, then a rapidfuzz check.

Comparing every pair is quadratic (100,000 answers are 5e9 pairs), so candidate pairs come from
locality-sensitive hashing instead:

1. normalise each text (rapidfuzz ``default_process``: lowercase, every non-alphanumeric
   character becomes a space) and split it into words;
2. shingle: the set of ``shingle``-word windows; a text with fewer words than ``shingle`` uses its
   set of single words instead, so short texts still get a signature;
3. MinHash: ``num_perm`` hash functions ``(a*x + b) mod p`` applied to every shingle hash at once
   with numpy, minimum per text with ``np.minimum.reduceat``;
4. LSH banding: the signature is cut into ``bands`` bands of ``r = num_perm // bands`` rows; texts
   whose rows agree in one band land in the same bucket and every pair in a bucket is a candidate;
5. verify each distinct candidate with ``rapidfuzz.fuzz.token_set_ratio >= threshold``.

Empty texts (no words once normalised) are never reported: there is nothing to compare.
"""

from __future__ import annotations

import hashlib
import os
import time
from array import array
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple

import numpy as np
from rapidfuzz import fuzz, process
from rapidfuzz.utils import default_process

__all__ = [
    "Duplicate",
    "drop_later_duplicates",
    "duplicate_groups",
    "near_duplicate_pairs",
    "person_clusters",
    "personal_duplicates",
]

# Largest prime below 2^32. With a, b, x < p, a*x + b < 2^64, so the universal hash
# (a*x + b) mod p is computed exactly in uint64 and its values fit in uint32.
_P = (1 << 32) - 5
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)  # multiplier that spreads bits when combining hashes
_SHORT_TAG = np.uint64(0x5BD1E9955BD1E995)  # keeps single-word shingles apart from k-word ones
# MinHash works through the shingles in slices of about this many (see _minhash).
_MINHASH_SLICE = 1 << 16
# Candidates are verified in slices of this many pairs, bounding the temporary string lists.
_VERIFY_CHUNK = 200_000


def near_duplicate_pairs(
    texts: Sequence[str],
    threshold: float = 90.0,
    *,
    shingle: int = 3,
    num_perm: int = 64,
    bands: int = 16,
    seed: int = 0,
    max_bucket: int = 50,
    window: int = 20,
    stats: dict[str, float] | None = None,
    scorer: Callable[..., float] = fuzz.token_set_ratio,
) -> list[tuple[int, int, float]]:
    """Pairs ``(i, j, score)``, ``i < j``, of texts whose token_set_ratio is ``>= threshold``.

    Only pairs that share an LSH bucket are scored, so recall is probabilistic (see the note on
    bands and rows below); every pair returned has been verified. A bucket with more than
    ``max_bucket`` members (texts written from one template, boilerplate repeated thousands of
    times) would give a quadratic number of candidates, so it is split by the next band: its
    members stay candidates only of those that also share that band, and so on until every
    piece is small. That bounds the candidates per text by ``max_bucket`` per band whatever the
    size of the set, and keeps the pairs that matter: near-duplicates agree on most bands, and
    so stay together through the splits. Members that agree on every band (identical
    signatures) are ordered by their whole signature and each is compared only with the next
    ``window`` members: such a cluster is then not listed pair by pair, but it stays connected
    through chains of pairs, which is what ``duplicate_groups`` needs. What splitting costs in
    recall on templated texts, where buckets are large:
    tests/test_dedup.py::test_oversized_buckets_are_split_keeping_recall; what it saves from
    1,000 to 100,000 examples: ``commands.dedup_steps`` in benchmarks/results/scale.json
    (docs/scale.md). Sorted by ``(i, j)``;
    the same input, seed and parameters always give the same output. If ``stats`` is given it
    receives the counts ``candidate_pairs`` and ``verified_pairs`` and the seconds spent per
    step (``*_s``).
    ``scorer`` verifies the candidates (a rapidfuzz scorer; default token_set_ratio).
    """
    if not 0.0 <= threshold <= 100.0:
        raise ValueError(f"threshold must be within [0, 100], got {threshold}")
    if shingle < 1:
        raise ValueError(f"shingle must be >= 1, got {shingle}")
    if bands < 1 or num_perm < bands or num_perm % bands:
        raise ValueError(f"num_perm ({num_perm}) must be a positive multiple of bands ({bands})")
    if max_bucket < 2 or window < 1:
        raise ValueError("max_bucket must be >= 2 and window >= 1")

    stats = {} if stats is None else stats
    stats.update(candidate_pairs=0, verified_pairs=0)
    clock = time.perf_counter()

    def lap(step: str) -> None:
        nonlocal clock
        now = time.perf_counter()
        stats[f"{step}_s"] = now - clock
        clock = now

    n = len(texts)
    tokens, lengths, normalised = _tokenize(texts)
    lap("tokenize")
    shingles, counts = _shingle_hashes(tokens, lengths, shingle)
    del tokens
    lap("shingle")
    docs = np.flatnonzero(counts)  # texts with at least one shingle
    if docs.size < 2:
        return []
    signature = _minhash(shingles, counts[docs], num_perm, seed)
    del shingles
    lap("minhash")
    codes = _candidates(signature, docs, n, bands, max_bucket, window)
    del signature
    lap("lsh")
    pairs = _verify(codes, n, normalised, threshold, scorer)
    lap("verify")
    stats.update(candidate_pairs=int(codes.size), verified_pairs=len(pairs))
    return pairs


def duplicate_groups(texts: Sequence[str], threshold: float = 90.0, **kw) -> list[list[int]]:
    """Connected components (union-find) of the verified pairs: groups of two or more indices.

    Each group is sorted and groups are ordered by their first index. Being a near-duplicate is
    not transitive, so a group may hold two texts that only meet through a third (a~b, b~c).
    ``kw`` goes to :func:`near_duplicate_pairs`.
    """
    parent = list(range(len(texts)))

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]  # path halving keeps the trees shallow
            x = parent[x]
        return x

    for i, j, _ in near_duplicate_pairs(texts, threshold, **kw):
        ri, rj = find(i), find(j)
        if ri != rj:
            parent[max(ri, rj)] = min(ri, rj)
    groups: dict[int, list[int]] = {}
    for x in range(len(texts)):
        groups.setdefault(find(x), []).append(x)
    # x runs in increasing order, so each group is already sorted and its root is its first index.
    return sorted((g for g in groups.values() if len(g) > 1), key=lambda g: g[0])


def drop_later_duplicates(
    ids: Sequence[str], texts: Sequence[str], threshold: float = 90.0, **kw
) -> dict[str, str]:
    """Map the id of every duplicate to the id kept for its group (the smallest id in the group).

    Ids not in the mapping are kept. ``kw`` goes to :func:`near_duplicate_pairs`.
    """
    if len(ids) != len(texts):
        raise ValueError(f"{len(ids)} ids for {len(texts)} texts")
    if len(set(ids)) != len(ids):
        raise ValueError("ids must be unique")
    dropped: dict[str, str] = {}
    for group in duplicate_groups(texts, threshold, **kw):
        members = [ids[i] for i in group]
        kept = min(members)
        dropped.update((m, kept) for m in members if m != kept)
    return dropped


def _mix64(h: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser, in place: every input bit affects every output bit."""
    h ^= h >> np.uint64(30)
    h *= np.uint64(0xBF58476D1CE4E5B9)
    h ^= h >> np.uint64(27)
    h *= np.uint64(0x94D049BB133111EB)
    h ^= h >> np.uint64(31)
    return h


def _word_hash(word: str) -> int:
    """A stable 64-bit hash of a word (Python's hash() is salted per process)."""
    return int.from_bytes(hashlib.blake2b(word.encode(), digest_size=8).digest(), "little")


def _tokenize(texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Word hashes of all texts back to back, words per text, and the normalised texts.

    Words go through a vocabulary dict first so that each distinct word is hashed once; its hash
    is blake2b of the word, so a text's signature depends on that text alone, not on the corpus.
    """
    vocab: dict[str, int] = {}
    add = vocab.setdefault
    lengths = np.empty(len(texts), dtype=np.int64)
    normalised: list[str] = []
    ids = array("q")  # 8 bytes per word; a list of ints would take ~36
    for k, text in enumerate(texts):
        words = default_process(text).split()
        lengths[k] = len(words)
        normalised.append(" ".join(words))
        ids.extend([add(w, len(vocab)) for w in words])
    word_hash = np.fromiter((_word_hash(w) for w in vocab), dtype=np.uint64, count=len(vocab))
    return word_hash[np.frombuffer(ids, dtype=np.int64)], lengths, normalised


def _shingle_hashes(
    tokens: np.ndarray, lengths: np.ndarray, k: int
) -> tuple[np.ndarray, np.ndarray]:
    """32-bit hashes of every shingle, grouped by text in order, and the count per text."""
    total = tokens.size
    ends = np.cumsum(lengths)
    starts = ends - lengths
    short = lengths < k  # these texts use their set of single words
    counts = np.where(short, lengths, lengths - k + 1)
    doc_of = np.repeat(np.arange(lengths.size), lengths)
    pos_in_doc = np.arange(total) - starts[doc_of]
    # A k-word window starting at position p exists if it ends inside the same text.
    keep = np.where(short[doc_of], True, pos_in_doc <= (lengths - k)[doc_of])
    del pos_in_doc

    h = tokens.copy()
    span = max(total - k + 1, 0)  # number of k-word windows over the whole concatenation
    if k > 1:
        # Windows are built over the concatenation; those crossing a text boundary are dropped
        # by `keep`. Combining is order-sensitive: "a b c" and "c b a" are different shingles.
        for m in range(1, k):
            h[:span] = _mix64(h[:span] * _GOLDEN ^ tokens[m : span + m])
        short_pos = short[doc_of]
        h[short_pos] = tokens[short_pos] ^ _SHORT_TAG
        del short_pos
    h = _mix64(h[keep])
    # The universal hash below takes x < p < 2^32; the top 32 bits of a mixed hash are uniform.
    x = h >> np.uint64(32)
    x %= np.uint64(_P)
    return x, counts


def _minhash(shingles: np.ndarray, counts: np.ndarray, num_perm: int, seed: int) -> np.ndarray:
    """MinHash signatures, shape ``(num_perm, texts)``, uint32; ``counts`` are all > 0."""
    rng = np.random.default_rng(seed)
    a = rng.integers(1, _P, size=num_perm, dtype=np.uint64)
    b = rng.integers(0, _P, size=num_perm, dtype=np.uint64)
    p = np.uint64(_P)
    ends = np.cumsum(counts)
    starts = ends - counts
    signature = np.empty((num_perm, counts.size), dtype=np.uint32)
    # Work in slices of whole texts, ~64k shingles (512 KB) each, running all hash functions over
    # one slice before the next: the slice and its buffer stay in the CPU cache, where looping
    # each hash function over all shingles (48 MB at 100k answers) is bound by memory bandwidth.
    # On one core at 100k answers: 2.2 s of CPU instead of 2.9-3.7 s.
    cuts = np.searchsorted(ends, np.arange(_MINHASH_SLICE, ends[-1], _MINHASH_SLICE)) + 1
    bounds = np.unique(np.concatenate(([0], cuts, [counts.size])))
    slices = list(zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True))

    def run(part: list[tuple[int, int]]) -> None:
        for d0, d1 in part:
            x = shingles[starts[d0] : ends[d1 - 1]]
            offsets = starts[d0:d1] - starts[d0]
            buf = np.empty_like(x)
            for i in range(num_perm):
                np.multiply(x, a[i], out=buf)
                np.add(buf, b[i], out=buf)
                np.remainder(buf, p, out=buf)
                signature[i, d0:d1] = np.minimum.reduceat(buf, offsets)

    # numpy releases the GIL inside these loops, so threads share out the slices; each
    # slice fills its own columns, so the result does not depend on scheduling.
    workers = max(1, min(os.cpu_count() or 1, 4, len(slices)))
    if workers == 1:
        run(slices)
    else:
        with ThreadPoolExecutor(workers) as pool:
            list(pool.map(run, [slices[w::workers] for w in range(workers)]))
    return signature


def _candidates(
    signature: np.ndarray, docs: np.ndarray, n: int, bands: int, max_bucket: int, window: int
) -> np.ndarray:
    """Distinct candidate pairs as codes ``i * n + j`` (i < j), sorted.

    Bands and rows. With b bands of r rows, two texts whose shingle sets have Jaccard similarity
    J share at least one bucket with probability 1 - (1 - J^r)^b, an S-curve whose steep part
    sits near J = (1/b)^(1/r). The default 64 = 16 x 4 puts it at (1/16)^(1/4) = 0.5:
    P = 0.64 at J = 0.5, 0.96 at 0.66, 0.995 at 0.73, 0.9998 at 0.8, while unrelated answers
    (J <= 0.05) collide with P <= 16 * 0.05^4 = 1e-4, which keeps the candidate list small.

    Which Jaccard does token_set_ratio >= 90 correspond to? Substituting d of n distinct words
    scores at least about 2(n - d) / (2n - d), which is >= 0.9 up to d = 2n/11 (18% of the
    words; in practice a little more, as letters shared by the differing words also count).
    With 3-word shingles each scattered substitution breaks up to 3 shingles, so
    J = (n - 2 - 3d) / (n - 2 + 3d): 0.90 for one word of 60, 0.73 for three, but only ~0.3 at
    the 18% limit (~0.65 if the edits form one contiguous span). No single S-curve matches
    token_set_ratio >= 90 exactly. The default targets the near-duplicates a benchmark really
    gets (a few words changed, a sentence moved: J >= ~0.7, found with P >= 0.99) and keeps
    false candidates near zero; pairs with many scattered edits that still score >= 90 are
    found only sometimes (tests/test_dedup.py::test_recall_against_brute_force has figures).
    More recall costs time: num_perm=128, bands=32 (threshold 0.42) misses a three-word edit
    with P = 2e-5 and takes about twice as long.
    """
    rows = signature.shape[0] // bands
    size = docs.size
    # Order inside a bucket: by a hash of the whole signature, so that identical texts sit next
    # to each other and the last resort's sliding window chains them together.
    whole = np.zeros(size, dtype=np.uint64)
    for row in signature:
        whole = _mix64(whole * _GOLDEN ^ row)
    keys = np.empty((bands, size), dtype=np.uint64)
    for band in range(bands):
        key = np.zeros(size, dtype=np.uint64)
        for row in signature[band * rows : (band + 1) * rows]:
            # 64-bit key per band; a rare collision only adds a candidate that verify rejects.
            key = _mix64(key * _GOLDEN ^ row)
        keys[band] = key
    codes: list[np.ndarray] = []
    for band in range(bands):
        at = np.arange(size)  # positions (into docs) of the members still being split
        key = keys[band]
        for depth in range(bands):
            order = np.lexsort((whole[at], key))
            at, key = at[order], key[order]
            count = at.size
            new = np.empty(count, dtype=bool)
            new[0] = True
            np.not_equal(key[1:], key[:-1], out=new[1:])
            run_start = np.flatnonzero(new)
            run_len = np.diff(np.append(run_start, count))
            run_of = np.cumsum(new) - 1
            bucket = run_len[run_of]
            small = bucket <= max_bucket
            # How many following members each member is paired with: all of its bucket when it
            # is small; none when oversized (it is split further below), except at the last
            # depth, where every band agrees and `window` neighbours chain the cluster together.
            after = run_start[run_of] + bucket - 1 - np.arange(count)
            last = depth == bands - 1
            reach = np.where(small, after, np.minimum(after, window) if last else 0)
            _bucket_pairs(docs[at], reach, n, codes)
            if last or small.all():
                break
            # An oversized bucket is split by the next band: its members stay paired only with
            # those that also share that band, so each split needs twice the agreement.
            at, key = at[~small], key[~small]
            key = _mix64(key * _GOLDEN ^ keys[(band + depth + 1) % bands][at])
    if not codes:
        return np.empty(0, dtype=np.int64)
    return np.unique(np.concatenate(codes))


def _bucket_pairs(members: np.ndarray, reach: np.ndarray, n: int, out: list[np.ndarray]) -> None:
    """Append the codes of each member paired with the next ``reach[k]`` members."""
    active = np.flatnonzero(reach)
    step = 1
    while active.size:
        i, j = members[active], members[active + step]
        out.append(np.minimum(i, j) * n + np.maximum(i, j))
        active = active[reach[active] > step]
        step += 1


def _verify(
    codes: np.ndarray,
    n: int,
    normalised: list[str],
    threshold: float,
    scorer: Callable[..., float] = fuzz.token_set_ratio,
) -> list[tuple[int, int, float]]:
    """Score candidates with token_set_ratio and keep those at or above the threshold.

    Why token_set_ratio rather than ratio: it is what the rest of the pipeline already uses for
    "same question" and "same aspect", and it ignores word order: an answer with one sentence
    moved scores 100, where ratio gives 68-91 (mean ~83 on the benchmark's synthetic answers)
    and would miss most of them at 90. Its weak spot is containment: a text whose words are
    a subset of another's scores 100. The LSH step keeps that in check: a pair seldom gets here
    below a shingle Jaccard of about 0.5, i.e. unless the shorter text covers about half of the
    longer one.
    """
    pairs: list[tuple[int, int, float]] = []
    if codes.size == 0:
        return pairs
    texts = _prepared(normalised, codes, n, scorer)
    for lo in range(0, codes.size, _VERIFY_CHUNK):
        chunk = codes[lo : lo + _VERIFY_CHUNK]
        first, second = (chunk // n).tolist(), (chunk % n).tolist()
        scores = process.cpdist(
            [texts[i] for i in first],
            [texts[j] for j in second],
            scorer=scorer,
            # No score_cutoff: with one, rapidfuzz 3.14 returned 0 for a pair scoring exactly
            # the cutoff (test_threshold_is_inclusive), and even for cutoff - 1e-6; we want
            # ">= threshold" exactly. Candidates are few, so the early exit saves little.
            dtype=np.float64,
            workers=-1,
        )
        hits = np.flatnonzero(scores >= threshold)
        pairs.extend((first[h], second[h], float(scores[h])) for h in hits)
    return pairs


def _sorted_words(text: str) -> str:
    return " ".join(sorted(text.split()))


def _sorted_distinct_words(text: str) -> str:
    return " ".join(sorted(set(text.split())))


# what each scorer reads of a text, written out once per text (see _prepared)
_PREPARE: dict[Callable[..., float], Callable[[str], str]] = {
    fuzz.token_sort_ratio: _sorted_words,
    fuzz.token_set_ratio: _sorted_distinct_words,
}


def _prepared(
    normalised: list[str], codes: np.ndarray, n: int, scorer: Callable[..., float]
) -> list[str] | dict[int, str]:
    """The texts the candidates are scored on, each written once in the form ``scorer``
    reaches anyway: its sorted words for token_sort_ratio, its sorted distinct words for
    token_set_ratio (which read a text only as that list, resp. set, of words, so the score
    is the same, and a text in several candidates is split and sorted once instead of once
    per candidate: the answers of 33,749 released pairs verified in 10.0 s instead of 12.5 s,
    ``dedup_verify_before_after`` in benchmarks/results/scale.json); any other scorer gets
    the normalised texts as they are."""
    prepare = _PREPARE.get(scorer)
    if prepare is None:
        return normalised
    used = np.unique(np.concatenate((codes // n, codes % n))).tolist()
    return {k: prepare(normalised[k]) for k in used}


# ---- near-duplicates in a personalized benchmark -------------------------------------------


class Duplicate(NamedTuple):
    """Why an example duplicates an earlier one (the one ``kept``)."""

    kind: str  # "question", "answer" (same user) or "pair" (both answers, another user)
    kept: str
    side: str | None = None  # for "answer": this example's side, and the kept one's
    kept_side: str | None = None

    def describe(self, kept_label: str | None = None) -> str:
        k = kept_label if kept_label is not None else self.kept
        if self.kind == "question":
            return f"question near-duplicates example {k}'s, asked by the same user"
        if self.kind == "answer":
            return (
                f"{self.side} answer near-duplicates example {k}'s {self.kept_side} answer, "
                "for the same user"
            )
        return (
            f"chosen and rejected near-duplicate example {k}'s chosen and rejected: the same "
            "pair, with the same winner, for another user"
        )


def profile_text(profile: Any) -> str | None:
    """A profile as one text: already joined, or a list of posts with ``text``, sorted and
    joined with newlines (so a profile reads the same whichever ranking ordered it: a
    release holds each row's posts in that question's ranked order); None when there is
    none."""
    if profile is None or isinstance(profile, str):
        return profile or None
    texts = sorted(p.get("text") or "" for p in profile if isinstance(p, Mapping))
    return "\n".join(texts) or None


class _UnionFind:
    def __init__(self, n: int) -> None:
        self.parent = list(range(n))

    def find(self, x: int) -> int:
        parent = self.parent
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    def union(self, a: int, b: int) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[max(ra, rb)] = min(ra, rb)


def person_clusters(
    user_ids: Sequence[object], profiles: Sequence[str | None], threshold: float = 90.0
) -> list[int]:
    """One cluster id per row: rows of one ``user_id`` share it, and so do rows whose
    profile texts near-duplicate each other (the same person under two ids, or a source
    without user ids). Rows with neither a user id nor a profile cannot be told apart and
    share one cluster. Profiles are compared once per distinct text, with MinHash LSH, and
    verified with token_sort_ratio (the same words in any order)."""
    n = len(user_ids)
    if len(profiles) != n:
        raise ValueError(f"{len(profiles)} profiles for {n} rows")
    uf = _UnionFind(n)
    first_user: dict[str, int] = {}
    first_text: dict[str, int] = {}
    unknown: int | None = None
    for i in range(n):
        uid, prof = user_ids[i], profiles[i]
        if uid is not None and uid != "":
            uf.union(i, first_user.setdefault(str(uid), i))
        elif not prof:
            unknown = i if unknown is None else unknown
            uf.union(i, unknown)
        if prof:
            uf.union(i, first_text.setdefault(prof, i))
    if len(first_text) > 1:
        texts = list(first_text)
        # token_sort_ratio, not token_set_ratio: two people who share one post of several
        # are not one person, and token_set_ratio scores containment as identity
        for a, b, _ in _similar_pairs(texts, threshold, fuzz.token_sort_ratio):
            uf.union(first_text[texts[a]], first_text[texts[b]])
    return [uf.find(i) for i in range(n)]


# Up to this many texts are compared all against all (at most 2,016 pairs); more go through LSH.
_ALL_PAIRS_UP_TO = 64


def _similar_pairs(
    texts: Sequence[str], threshold: float, scorer: Callable[..., float]
) -> list[tuple[int, int, float]]:
    """:func:`near_duplicate_pairs` with ``scorer``, but a handful of texts are compared every
    pair against every pair (exact, and cheaper than hashing them); both normalise alike."""
    if len(texts) > _ALL_PAIRS_UP_TO:
        return near_duplicate_pairs(texts, threshold, scorer=scorer)
    normalised = [" ".join(default_process(t).split()) for t in texts]
    pairs = []
    for i in range(len(texts)):
        for j in range(i + 1, len(texts)):
            if normalised[i] and normalised[j]:
                score = float(scorer(normalised[i], normalised[j]))
                if score >= threshold:
                    pairs.append((i, j, score))
    return pairs


def personal_duplicates(
    rows: Sequence[Mapping[str, Any]],
    question_threshold: float = 95.0,
    answer_threshold: float = 95.0,
    profile_threshold: float = 90.0,
    *,
    keys: Sequence[str] | None = None,
    stats: dict[str, Any] | None = None,
) -> dict[str, Duplicate]:
    """Examples to drop from a personalized set, mapped to why; the smallest
    ``example_id`` of each group is kept.

    ``rows`` carry ``example_id`` (or pass ``keys``, one per row), ``question``,
    ``chosen``, ``rejected`` and, where known, ``user_id`` and ``profile`` (the user's
    posts joined with newlines, or the list of posts with their ``text``). The same question
    from different users is the point of a personalized benchmark, so the rules work within
    a person (a user id, or near-identical profiles; see :func:`person_clusters`):

    - question: near-duplicates an earlier question of the same person;
    - answer: either answer near-duplicates an answer of another example of the same
      person (either side);
    - pair: across persons, only when both the chosen and the rejected near-duplicate
      another example's chosen and rejected. One shared answer across users is expected
      (the same generic rejected answer suits everyone who asks a common question), and a
      chosen that is another user's rejected is a wanted contrast; the same two answers
      with the same winner for two users test the same thing twice.

    If ``stats`` is given it receives, per step, what it did and its seconds: ``questions``
    and ``answers`` (candidate and verified pairs), ``persons`` (near-duplicate groups and
    the rows in them, whose profiles are compared).

    Near-duplicate texts are found over the whole set (MinHash LSH, then connected
    components); who is the same person is then decided within each component, between
    its own rows only, so profiles are compared a few at a time, never across the whole set
    (two user ids are one person when their profiles near-duplicate each other directly, or
    through another row of the same component).
    """
    n = len(rows)
    ids = [str(r["example_id"]) for r in rows] if keys is None else list(keys)
    if len(set(ids)) != n:
        raise ValueError("example ids must be unique")
    drops: dict[str, Duplicate] = {}
    if n < 2:
        return drops

    # Questions are short (12-20 words): 2-word shingles and more bands keep recall of
    # one- and two-word edits high (about 1.00 / 0.89 on synthetic questions, measured
    # while building this module) at a small cost.
    stats = {} if stats is None else stats
    clock = time.perf_counter()

    def step(name: str, counts: dict[str, float], **more: int) -> None:
        nonlocal clock
        now = time.perf_counter()
        stats[name] = {
            **{k: int(counts[k]) for k in ("candidate_pairs", "verified_pairs") if k in counts},
            **more,
            "seconds": round(now - clock, 3),
        }
        clock = now

    found: dict[str, float] = {}
    quf = _UnionFind(n)
    for i, j, _ in near_duplicate_pairs(
        [r["question"] for r in rows],
        question_threshold,
        shingle=2,
        num_perm=128,
        bands=32,
        stats=found,
    ):
        quf.union(i, j)
    qcomps = _components(quf, range(n))
    step("questions", found)

    texts = [r[side] for r in rows for side in ("chosen", "rejected")]
    auf = _UnionFind(len(texts))
    for a, b, _ in near_duplicate_pairs(texts, answer_threshold, stats=found):
        auf.union(a, b)
    acomps = _components(auf, range(len(texts)))
    step("answers", found)
    compared = [0, 0]  # groups, rows

    profiles: dict[int, str | None] = {}

    def persons(members: Sequence[int]) -> dict[int, int]:
        """Who among these rows is one person (see :func:`person_clusters`)."""
        compared[0] += 1
        compared[1] += len(members)
        for i in members:
            if i not in profiles:
                profiles[i] = profile_text(rows[i].get("profile"))
        labels = person_clusters(
            [rows[i].get("user_id") for i in members],
            [profiles[i] for i in members],
            profile_threshold,
        )
        return dict(zip(members, labels, strict=True))

    def earliest(members: Iterable[int]) -> int:
        return min(members, key=lambda i: ids[i])

    # questions: within one component, group by person
    for members in qcomps.values():
        person = persons(members)
        by_person: dict[int, list[int]] = {}
        for i in members:
            by_person.setdefault(person[i], []).append(i)
        for group in by_person.values():
            if len(group) > 1:
                kept = earliest(group)
                for i in group:
                    if i != kept:
                        drops[ids[i]] = Duplicate("question", ids[kept])

    # answers of one person: an answer shared by two examples (either side)
    sides = ("chosen", "rejected")
    for members in acomps.values():
        live = [a for a in members if ids[a // 2] not in drops]
        if len({a // 2 for a in live}) < 2:
            continue
        person = persons(sorted({a // 2 for a in live}))
        by_person_a: dict[int, list[int]] = {}
        for a in live:
            by_person_a.setdefault(person[a // 2], []).append(a)
        for answers in by_person_a.values():
            if len({a // 2 for a in answers}) < 2:
                continue
            order = sorted(answers, key=lambda a: (ids[a // 2], a))
            kept, kept_side = order[0] // 2, sides[order[0] % 2]
            for a in order:
                i = a // 2
                if i != kept and ids[i] not in drops:
                    drops[ids[i]] = Duplicate("answer", ids[kept], sides[a % 2], kept_side)

    step("persons", {}, groups=compared[0], rows=compared[1])

    # across persons: both answers repeat another example's pair, on the same sides
    comp = {a: root for root, m in acomps.items() for a in m}
    by_pair: dict[tuple[int, int], list[int]] = {}
    for i in range(n):
        c, r = comp.get(2 * i), comp.get(2 * i + 1)
        if c is not None and r is not None and ids[i] not in drops:
            by_pair.setdefault((c, r), []).append(i)
    for members in by_pair.values():
        if len(members) > 1:
            kept = earliest(members)
            for i in members:
                if i != kept:
                    drops[ids[i]] = Duplicate("pair", ids[kept])
    return drops


def _components(uf: _UnionFind, items: Iterable[int]) -> dict[int, list[int]]:
    groups: dict[int, list[int]] = {}
    for x in items:
        groups.setdefault(uf.find(x), []).append(x)
    return {k: v for k, v in groups.items() if len(v) > 1}
