"""Generative reward models (``gen:MODEL``): an LLM asked to rate one answer with a number,
through the configured backend and the request cache.

The request is the reference's ``BoN/score.py`` (generative): a system turn, then a
template filled with ``{question}``, ``{answer}`` and, where the template has them,
``{profile}`` (the setting's profile: empty with the question only) and ``{rubric}`` (the
rubric control only); greedy, 10 tokens. The template is the user's file
(``template=FILE``, read as ``pipeline.types.promptfiles`` reads a reference-style prompt) or the
project's ``prompts/gen_score.txt``.

The score is read as the reference reads it: the answer, stripped, as a number if it is one;
else the first number of the forms ``.5``, ``0.5``, ``1``, ``1.0`` (or a longer run of
digits after a leading 0 or 1) in it; else 0.5. It is clipped to [0, 1]. An answer read as
0.5 for want of a number is counted (``unparsed``), not hidden.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.core.resources import data_dir
from pipeline.types.chat import ChatRequest
from pipeline.types.promptfiles import PromptFile, read_prompt_file

# The system turn the reference's BoN scripts send to a generative scorer and to the judge
# (BoN/score.py, BoN/evaluate.py), quoted so that a request is the reference's request.
JUDGE_SYSTEM = "You are a fair and insightful judge."
DEFAULT_TEMPLATE = "gen_score.txt"  # in the project's prompts/ folder
TEMPLATE_NEEDS = ("question", "answer")
TEMPLATE_FILLS = ("profile", "rubric")
# the reference's fallback reading: the first of these number forms in the answer
_NUMBER = re.compile(r"0?\.\d+|[01]\.?\d*")
UNREAD_SCORE = 0.5


@dataclass(frozen=True)
class Answered:
    """One answer to score, with what a scorer may see beside it in its setting."""

    question: str
    answer: str
    profile: str = ""  # what {profile} shows ("" when the setting shows no profile)
    rubric: str = ""  # what {rubric} shows (the rubric control only)
    user_turn: str = ""  # what a reward model sees before the answer


def read_template(option: str) -> PromptFile:
    """The scorer's template: the user's file, or the project's default; checked for its
    placeholders (one line naming the file)."""
    path = Path(option).expanduser() if option else data_dir("prompts") / DEFAULT_TEMPLATE
    return read_prompt_file(
        path,
        needs=TEMPLATE_NEEDS,
        fills=TEMPLATE_FILLS,
        what="a generative scorer's template",
    )


def read_score(text: str) -> tuple[float, bool]:
    """(the score, whether a number was found), the reference's reading (module doc)."""
    stripped = text.strip()
    try:
        value = float(stripped)
    except ValueError:
        found = _NUMBER.search(stripped)
        if found is None:
            return UNREAD_SCORE, False
        value = float(found.group(0))
    return max(0.0, min(1.0, value)), True


def build_requests(
    items: Sequence[Answered],
    template: PromptFile,
    model: str,
    spec: Any,
    seed: int,
    served_by: str,
) -> list[ChatRequest]:
    """One request per answer: the system turn, then the template filled (one pass)."""
    out = []
    for it in items:
        values = {
            "question": it.question,
            "answer": it.answer,
            "profile": it.profile,
            "rubric": it.rubric,
        }
        out.append(
            ChatRequest(
                messages=(("system", JUDGE_SYSTEM), ("user", template.fill(values))),
                model=model,
                temperature=spec.opt("temperature"),
                top_p=1.0,
                max_tokens=spec.opt("max_tokens"),
                n=1,
                seed=seed,
                served_by=served_by,
            )
        )
    return out


@dataclass
class GenScores:
    scores: list[float | None]  # None: the request got no answer (retried next run)
    unparsed: int  # answers with no number, read as UNREAD_SCORE
    failed: int
    stats: dict[str, Any]


def score_answers(
    spec: Any,
    items: Sequence[Answered],
    role: Any,
    cache_path: Path,
    *,
    stage: str,
    seed: int,
    progress: bool = True,
) -> GenScores:
    """Score every answer with the generative scorer ``spec`` through ``role``
    (``pipeline.eval.llmcalls.Role``); identical requests are sent once."""
    from pipeline.engine.llm import Answer
    from pipeline.eval.llmcalls import ask

    template = spec.prompts.get("template") or read_template("")
    reqs = build_requests(items, template, role.model, spec, seed, role.served_id)
    asked = ask(role, cache_path, stage, reqs, progress=progress)
    scores: list[float | None] = []
    unparsed = 0
    for outcome in asked.outcomes:
        if not isinstance(outcome, Answer):
            scores.append(None)
            continue
        value, found = read_score(outcome.result.choices[0].text)
        unparsed += not found
        scores.append(value)
    return GenScores(scores, unparsed, asked.failed, asked.stats)
