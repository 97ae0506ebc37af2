"""What ``prb plan`` puts where nothing exists yet: an empty cache for a run that has none,
and placeholder answers and rubric aspects of the expected length."""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pipeline.config import Config
from pipeline.core.errors import PipelineError
from pipeline.plan.counters import TokenCounter
from pipeline.run import RunDir
from pipeline.run.cache import RequestCache

# words of a generated rubric's aspect when no rubric exists yet to measure
GUESSED_ASPECT_WORDS = 8


class NoCache(RequestCache):
    """The cache of a run that has none yet: holds nothing and opens no file (planning must
    not create one). Its look-ups take no keys, so no request is hashed for nothing."""

    def __init__(self) -> None:
        self.path = Path("(no cache.sqlite yet)")
        self.readonly = True

    def get_many(self, keys: Iterable[str]) -> dict[str, Any]:
        return {}

    def present(self, keys: Iterable[str]) -> set[str]:
        return set()

    def get_derived(self, key: str) -> Any:
        return None

    def get_derived_many(self, keys: Iterable[str]) -> dict[str, Any]:
        return {}

    def ledger(self, stage: str | None = None) -> list[dict[str, Any]]:
        return []

    def prompt_sample(self, served_by: str, limit: int = 500) -> list[tuple[str, int]]:
        return []

    def backends(self) -> dict[str, dict[str, Any]]:
        return {}

    def close(self) -> None:
        pass


class Filler:
    """Text of the expected length standing in for answers and rubric aspects, made of the
    input's own words (so a tokenizer counts it like the real thing)."""

    def __init__(self, corpus: list[str], answer_words: int, aspects: int, aspect_words: int):
        self.words = corpus or "the answer explains what to do and why it helps".split()
        self.answer_words, self.n_aspects, self.aspect_words = answer_words, aspects, aspect_words
        self._answer = self._take(0, answer_words)

    def _take(self, start: int, n: int) -> str:
        it = itertools.islice(itertools.cycle(self.words), start, start + max(n, 1))
        return " ".join(it)

    def answer(self) -> str:
        return self._answer

    def aspects(self) -> list[dict[str, str]]:
        # distinct texts: a rubric keeps one of two identical aspects
        return [
            {"aspect": f"{i + 1}: {self._take(7 * i, self.aspect_words)}"}
            for i in range(self.n_aspects)
        ]


def _corpus(rows: Iterable[dict], limit: int = 200) -> list[str]:
    words: list[str] = []
    for row in itertools.islice(rows, limit):
        words.extend(str(row.get("question") or "").split())
        for post in row.get("profile") or []:
            if isinstance(post, dict):
                words.extend(str(post.get("text") or "").split())
    return words


def _rows_sample(rd: RunDir, stage: str, limit: int = 2000) -> list[dict]:
    try:
        return list(itertools.islice(rd.stage(stage).rows(), limit))
    except PipelineError:
        return []


def make_filler(
    config: Config,
    rd: RunDir,
    ingest_rows: Iterable[dict],
    counter: TokenCounter,
    measured: dict[str, dict[str, Any]],
) -> tuple[Filler, list[str]]:
    """Placeholders sized from what the run has (answers and rubrics on disk, this
    backend's answers in the cache), else from the settings; notes say which."""
    corpus = _corpus(ingest_rows)
    sample = " ".join(corpus[:2000])
    tokens_per_word = counter.text(sample) / max(len(sample.split()), 1) if sample else 1.3
    r = config.responses
    notes = []
    answers = [
        w for c in _rows_sample(rd, "responses") if isinstance(w := c.get("word_count"), int)
    ]
    if answers:
        words = round(sum(answers) / len(answers))
        notes.append(
            f"answers not yet written count {words} words each: the mean of "
            f"{len(answers)} answers on disk"
        )
    elif "responses" in measured:
        per = measured["responses"]["output_per_choice"]
        words = round(per / max(tokens_per_word, 1e-6))
        notes.append(
            f"answers not yet written count {words} words each ({per:.0f} tokens: the "
            "mean of this backend's answers in the cache)"
        )
    else:
        words = min(r.word_cap, int((r.sampling.max_tokens or 0) / max(tokens_per_word, 1e-6)))
        notes.append(
            f"answers not yet written count {words} words each: responses.word_cap, "
            "the length the prompts ask for (nothing measured yet)"
        )
    rubrics = [x for x in _rows_sample(rd, "rubrics") if x.get("source") == "generated"]
    if rubrics:
        items = [it.get("aspect", "") for x in rubrics for it in x.get("items", [])]
        n_aspects = round(len(items) / len(rubrics))
        aspect_words = round(sum(len(a.split()) for a in items) / max(len(items), 1))
        basis = f"the mean of {len(rubrics)} generated rubrics on disk"
    else:
        n_aspects = round((config.rubrics.min_items + config.rubrics.max_items) / 2)
        aspect_words = GUESSED_ASPECT_WORDS
        basis = "a guess: between rubrics.min_items and max_items"
    if config.rubrics.source == "generated":
        notes.append(
            f"rubrics not yet generated hold {n_aspects} aspects of {aspect_words} words ({basis})"
        )
    return Filler(corpus, words, n_aspects, aspect_words), notes
