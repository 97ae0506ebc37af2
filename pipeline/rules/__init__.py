"""The rules a pair must pass, below everything that uses them.

- ``base``: what a rule is (:class:`PairRule`: its thresholds, its test on an answer, a
  combination or the set, its drop's wording, its audit checks), the registry
  :data:`RULES` and :class:`RuleSet` (every rule built from a config's ``pairs`` section);
- ``catalogue``: the built-in rules, one class each;
- ``text``: a :class:`Hit`, an answer cut off mid-sentence, word-level similarity;
- ``patterns``: the default meta-text and refusal regexes (data);
- ``regexgate``: :class:`PatternSet`, regexes gated by the words they need;
- ``verdicts``: what the judge's verdicts on a pair say (preferences per A/B order, the
  rubric-aware direction, the margin that ranks a pair).

The pair stage, the audit, the config's ``pairs`` section, the annotation import and
publish import from here; nothing here imports the config, a stage or a command.
"""

from pipeline.rules import catalogue as _catalogue  # registers the built-in rules
from pipeline.rules.base import (
    KEEP,
    RULES,
    SKIP,
    Answer,
    AuditCheck,
    Outcome,
    PairRule,
    PairView,
    RowView,
    RuleSet,
    Verdict,
    audit,
    audit_checks,
    default_filters,
    run_filters,
    threshold,
    threshold_fields,
)
from pipeline.rules.text import (
    Hit,
    ends_mid_sentence,
    normalise,
    token_similarity,
    word_similarity,
)

CUT_OFF = _catalogue.CUT_OFF

__all__ = [
    "CUT_OFF",
    "KEEP",
    "RULES",
    "SKIP",
    "Answer",
    "AuditCheck",
    "Hit",
    "Outcome",
    "PairRule",
    "PairView",
    "RowView",
    "RuleSet",
    "Verdict",
    "audit",
    "audit_checks",
    "default_filters",
    "ends_mid_sentence",
    "normalise",
    "run_filters",
    "threshold",
    "threshold_fields",
    "token_similarity",
    "word_similarity",
]
