"""Scoring single answers for ``prb eval bon``, one function per scorer kind (named by the
kind's ``answer_scorer`` in ``pipeline.eval.spec.SCORERS``): ``(spec, answers, context) ->
ScoredAnswers``.

- ``rm_scores``: a sequence classifier through the project's pointwise engines
  (``pipeline.eval.pointwise``: the same encoder, engines and reductions as ``prb eval``).
  Each score is kept in the bon folder's request cache (its ``derived`` table) under a
  hash of the scorer's fingerprint (its result-folder name, the model folder's SHA-256,
  the torch and transformers versions) and of the exact user turn and answer, committed
  every ``SCORE_CHUNK`` answers: a re-run, or a run killed half-way, scores only what is
  missing, and the model is not loaded when nothing is.
- ``gen_scores``: a generative scorer through its backend (``pipeline.eval.generative``);
  its requests are cached as every request is.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.backends.identity import folder_sha256, version
from pipeline.core.ids import content_hash
from pipeline.core.io import crash_point
from pipeline.eval.generative import Answered, score_answers
from pipeline.eval.pointwise import load_scorer

SCORE_CHUNK = 512  # answers scored, then committed, at a time
DERIVED_KIND = "bon-rm-score"


@dataclass
class ScoreContext:
    cache_path: Path
    seed: int
    roles: dict[str, Any] = field(default_factory=dict)  # spec text -> Role (gen scorers)
    progress: bool = True
    stage: str = "bon-score"


@dataclass
class ScoredAnswers:
    scores: list[float | None]  # None: no score yet (a request that failed)
    info: dict[str, Any]
    computed: int = 0  # scores made by this run (the rest came from the cache)
    failed: int = 0
    unparsed: int = 0  # generative answers without a number (read as 0.5)


def rm_fingerprint(spec: Any) -> str:
    """What decides a reward model's scores besides its input: its folder's content, the
    options that change a figure (its result-folder name) and the libraries' versions."""
    folder = Path(spec.target).expanduser()
    return content_hash(
        [spec.slug(), folder_sha256(folder), version("torch"), version("transformers")], 24
    )


def rm_scores(spec: Any, items: Sequence[Answered], ctx: ScoreContext) -> ScoredAnswers:
    from pipeline.run.cache import RequestCache

    fp = rm_fingerprint(spec)
    keys = [content_hash([fp, it.user_turn, it.answer], 32) for it in items]
    info: dict[str, Any] = {"fingerprint": fp, "model_path": str(Path(spec.target).expanduser())}
    with RequestCache(ctx.cache_path) as cache:
        have = cache.get_derived_many(keys)
        missing = list(dict.fromkeys(k for k in keys if k not in have))
        computed = 0
        if missing:
            first = {k: i for i, k in reversed(list(enumerate(keys)))}
            encoder, engine = load_scorer(spec, progress=ctx.progress)
            try:
                for start in range(0, len(missing), SCORE_CHUNK):
                    chunk = missing[start : start + SCORE_CHUNK]
                    convs = [(items[first[k]].user_turn, items[first[k]].answer) for k in chunk]
                    got = engine.score_ids(encoder.encode(convs))
                    cache.put_derived_many(
                        [(k, DERIVED_KIND, float(v)) for k, v in zip(chunk, got, strict=True)]
                    )
                    crash_point("bon rm scores")
                    have.update(zip(chunk, got, strict=True))
                    computed += len(chunk)
                info.update(
                    engine.info(),
                    num_labels=engine.num_labels,
                    max_length=encoder.max_length,
                    truncated_inputs=encoder.truncated,
                    special_tokens=encoder.special_tokens,
                )
            finally:
                engine.close()
    # a NaN score is stored as null (JSON has no NaN) and read back as NaN
    scores: list[float | None] = [float("nan") if have[k] is None else float(have[k]) for k in keys]
    return ScoredAnswers(scores, info, computed=computed)


def gen_scores(spec: Any, items: Sequence[Answered], ctx: ScoreContext) -> ScoredAnswers:
    role = ctx.roles[spec.text]
    got = score_answers(
        spec, items, role, ctx.cache_path, stage=ctx.stage, seed=ctx.seed, progress=ctx.progress
    )
    info = {
        **role.describe(),
        "template": spec.prompts["template"].provenance(),
        "temperature": spec.opt("temperature"),
        "max_tokens": spec.opt("max_tokens"),
        "requests": got.stats,
    }
    return ScoredAnswers(
        got.scores, info, computed=got.stats.get("sent", 0), failed=got.failed,
        unparsed=got.unparsed,
    )  # fmt: skip
