"""`prb plan CONFIG`: what a run will send, and what it may cost, before anything is sent.

For every stage: the examples it would process, its requests (counted from the stage's own
request builders, ``Stage.plan_examples``, the same requests ``prb run`` sends, so their
keys are looked up in the run's cache and a resumed run counts only what is missing), the
prompt tokens of what is to be sent, and the output tokens: the bound (``max_tokens`` for
each choice) and, where the run's cache has answers of this backend, the measured mean.
Then time (at a throughput given or measured) and money (at ``run.prices``). After a run,
the estimate of each whole stage stands beside what its ledger says was received.

A stage whose input does not exist yet (the judge before the answers) is planned on
placeholder rows: the upstream stage's own row builder fed with placeholder text of the
expected length. Its number of requests is still exact when every upstream answer comes
back (the judge asks two pointwise questions per candidate and four per shortlisted pair);
its prompts are estimates, and the table marks them.

Planning writes nothing (no run directory, no cache file, no lock) and sends no request:
the cache is opened read-only, or an empty one is kept in memory; the backend's identity
(part of every request's key) may ask a server's ``/models``, and when it cannot be had the
identity the run recorded is used, or the plan says the cache cannot be matched.

One concern a module: ``counters`` (counting a prompt's tokens), ``placeholders`` (the empty
cache of a run that has none, placeholder answers and aspects), ``estimate`` (the stages
counted, the totals summed), ``throughput`` (output tokens per second for the time),
``result`` (what a plan holds), ``render`` (the table). The names importers use are here.
"""

from __future__ import annotations

from pipeline.plan.counters import (
    CharCounter,
    SampledCounter,
    TokenCounter,
    WordCounter,
    choose_counter,
    hf_counter,
)
from pipeline.plan.estimate import estimate
from pipeline.plan.placeholders import Filler, NoCache, make_filler
from pipeline.plan.render import render
from pipeline.plan.result import Figures, Plan, StageEstimate

__all__ = [
    "CharCounter",
    "Figures",
    "Filler",
    "NoCache",
    "Plan",
    "SampledCounter",
    "StageEstimate",
    "TokenCounter",
    "WordCounter",
    "choose_counter",
    "estimate",
    "hf_counter",
    "make_filler",
    "render",
]
