"""The rules a pair must pass, below everything that uses them.

- ``text``: a :class:`Hit`, an answer cut off mid-sentence, word-level similarity;
- ``patterns``: the default meta-text and refusal regexes (data);
- ``regexgate``: :class:`PatternSet`, regexes gated by the words they need;
- ``pair``: :class:`Rules`, every per-pair rule with its thresholds (the config's defaults);
- ``verdicts``: what the judge's verdicts on a pair say (preferences per A/B order, the
  rubric-aware direction, the margin that ranks a pair).

The pair filters, the audit's checks, the annotation import and publish import from here;
nothing here imports the config, a stage or a command.
"""

from pipeline.rules.pair import Rules, default
from pipeline.rules.patterns import DEFAULT_META_PATTERNS, DEFAULT_REFUSAL_PATTERNS
from pipeline.rules.regexgate import PatternSet
from pipeline.rules.text import (
    Hit,
    ends_mid_sentence,
    normalise,
    token_similarity,
    word_similarity,
)

__all__ = [
    "DEFAULT_META_PATTERNS",
    "DEFAULT_REFUSAL_PATTERNS",
    "Hit",
    "PatternSet",
    "Rules",
    "default",
    "ends_mid_sentence",
    "normalise",
    "token_similarity",
    "word_similarity",
]
