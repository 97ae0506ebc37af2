"""What a plan holds: per stage its figures (requests, tokens, bounds), and the totals,
time and cost; ``Plan.as_dict`` is ``prb plan --json``."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class Figures:
    requests: int = 0
    prompt_tokens: int = 0
    # the prompts with every placeholder answer in them at its max_tokens
    prompt_bound: int = 0
    output_bound: int = 0
    output_expected: float | None = None
    # the counts weighted by the share of runs that send each request: where a stage sends
    # only some of the requests it could (the judge: PlannedExample.sent_share), fewer
    requests_expected: float = 0.0
    prompt_expected: float = 0.0
    output_bound_expected: float = 0.0
    choices: int = 0
    # the prompts as run.budget bounds them before sending (UTF-8 bytes plus
    # TEMPLATE_TOKENS_PER_MESSAGE a message; pipeline/engine/budget.py), placeholder answers at
    # max_tokens: what a budget must leave room for
    budget_prompt: int = 0


@dataclass
class StageEstimate:
    stage: str
    action: str  # skip | resume | run | redo, as `prb run` would decide
    uses_llm: bool
    examples: int = 0  # examples of the stage's input
    examples_to_do: int = 0
    # every first attempt of the stage over all its examples, and what is still to send
    total: Figures = field(default_factory=Figures)
    to_send: Figures = field(default_factory=Figures)
    cached: int = 0
    estimated: bool = False  # prompts built on placeholder inputs
    placeholders: bool = False  # rows it would write hold placeholder text
    reask_rate: float | None = None  # measured on this backend's answers in the cache
    reasks_expected: float = 0.0
    reask_prompt_tokens: float = 0.0
    reask_output_tokens: float = 0.0
    output_mean: float | None = None  # measured output tokens per choice
    output_basis: str = ""
    tokens: str = ""  # how prompt tokens were counted
    actual: dict[str, Any] | None = None  # the ledger: what the cache holds as received
    notes: list[str] = field(default_factory=list)


@dataclass
class Plan:
    run_dir: str
    backend: str
    stages: list[StageEstimate]
    totals: dict[str, Any]
    time: dict[str, Any]
    cost: dict[str, Any]
    notes: list[str]
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)
