"""Pair filters. Each answers keep, or drop with a reason; the pair stage counts drops by
filter name and keeps every dropped pair on disk with its reason.

The rules themselves live in ``pipeline/audit/checks.py`` (:class:`Rules`), which the audit
runs on any pairs file: a filter here decides which rule applies to a pair and words the
reason, so the audit and the pair stage never disagree about what a rule means.

Adding a filter: a class here with a ``name`` and ``check`` (or ``apply`` for a filter over
the whole set), a ``FILTERS.register`` line, its rule in ``Rules`` if the audit should run
it too, a config field if it has a threshold, and a test that shows both a keep and a drop.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, ClassVar

from pipeline.fields import ORDERS, count_words, words
from pipeline.registry import Registry
from pipeline.rules import Hit, Rules, word_similarity
from pipeline.rules.verdicts import prefers

__all__ = ["FILTERS", "KEEP", "PairFilter", "PairView", "Verdict", "word_similarity"]

FILTERS: Registry[type[PairFilter]] = Registry(
    "filter", "pipeline.filters:PairFilter", field="pairs.filters"
)


@dataclass
class PairView:
    """One chosen x rejected combination with everything the judge said about it."""

    example: dict[str, Any]
    rubric: dict[str, Any]
    chosen: dict[str, Any]
    rejected: dict[str, Any]
    quality_chosen: dict[str, Any] | None = None
    quality_rejected: dict[str, Any] | None = None
    coverage_chosen: dict[str, Any] | None = None
    coverage_rejected: dict[str, Any] | None = None
    pairwise: dict[str, Any] = field(default_factory=dict)


Verdict = tuple[bool, str | None]
KEEP: Verdict = (True, None)


class PairFilter:
    name: ClassVar[str]
    set_level: ClassVar[bool] = False
    # reads the judge's verdicts: refused in a run whose judge is off (judge.enabled)
    reads_verdicts: ClassVar[bool] = False

    def __init__(self, rules: Rules) -> None:
        # one Rules per run, shared by every filter (``Rules.from_config`` of the run's
        # ``pairs`` section and ``responses.word_cap``)
        self.rules = rules

    def check(self, pair: PairView) -> Verdict:
        """Keep, or drop with a reason (filters over one pair)."""
        raise NotImplementedError

    def apply(self, rows: list[dict[str, Any]]) -> dict[str, str]:
        """example_id -> reason for the rows to drop (filters with ``set_level``)."""
        raise NotImplementedError


@functools.lru_cache(maxsize=8192)
def _word_set(text: str) -> frozenset[str]:
    """A text's words (``pipeline.fields.words``), once per text: an answer sits in several
    combinations and three rules gate on its words."""
    return frozenset(words(text))


def _texts(pair: PairView) -> list[tuple[str, str]]:
    return [("chosen", pair.chosen["text"]), ("rejected", pair.rejected["text"])]


def _drop(side: str | None, hit: Hit) -> Verdict:
    return False, (f"{side} answer {hit.detail}" if side else hit.detail)


@FILTERS.register("judge_parse")
class JudgeParse(PairFilter):
    """Every judgment of the pair parsed (after re-asks); otherwise nothing can be trusted."""

    name = "judge_parse"
    reads_verdicts = True

    def check(self, pair: PairView) -> Verdict:
        for label, j in (
            ("quality of chosen", pair.quality_chosen),
            ("quality of rejected", pair.quality_rejected),
            ("coverage of chosen", pair.coverage_chosen),
            ("coverage of rejected", pair.coverage_rejected),
        ):
            if not j or not j.get("parse_ok"):
                return False, f"{label} did not parse"
        for kind in ("pairwise_aware", "pairwise_blind"):
            for order in ORDERS:
                v = pair.pairwise.get(kind, {}).get(order)
                if not v or not v.get("parse_ok"):
                    return False, f"{kind} {order} did not parse"
        return KEEP


@FILTERS.register("truncated")
class Truncated(PairFilter):
    """An answer cut by max_tokens (finish_reason 'length') is not a finished answer."""

    name = "truncated"

    def check(self, pair: PairView) -> Verdict:
        for side, c in (("chosen", pair.chosen), ("rejected", pair.rejected)):
            if c.get("finish_reason") == "length":
                if ((c.get("provenance") or {}).get("reasoning") or {}).get("cut"):
                    # a reasoning model's reasoning used its whole budget: no answer came
                    return False, f"{side} answer never came: reasoning_exhausted"
                return False, f"{side} answer was truncated (finish_reason length)"
        return KEEP


class _TextRule(PairFilter):
    """A rule on each answer's text alone (shared with the audit's check of that name)."""

    def hit(self, text: str, pair: PairView) -> Hit | None:
        raise NotImplementedError

    def check(self, pair: PairView) -> Verdict:
        for side, text in _texts(pair):
            h = self.hit(text, pair)
            if h:
                return _drop(side, h)
        return KEEP


@FILTERS.register("empty")
class Empty(_TextRule):
    """An empty or whitespace-only answer is no answer."""

    name = "empty"

    def hit(self, text: str, pair: PairView) -> Hit | None:
        return self.rules.empty(text)


@FILTERS.register("truncated_text")
class TruncatedText(_TextRule):
    """An answer that stops mid-sentence, seen from its text alone (a server that does not
    report finish_reason, or a model that stopped early)."""

    name = "truncated_text"

    def hit(self, text: str, pair: PairView) -> Hit | None:
        return self.rules.truncated_text(text) if text.strip() else None


@FILTERS.register("refusal")
class Refusal(_TextRule):
    name = "refusal"

    def hit(self, text: str, pair: PairView) -> Hit | None:
        return self.rules.refusal(text, _word_set(text))


@FILTERS.register("meta_text")
class MetaText(_TextRule):
    """An answer that talks about its brief ("the rubric", "the aspects you expect") gives the
    preference away in words instead of content."""

    name = "meta_text"

    def hit(self, text: str, pair: PairView) -> Hit | None:
        return self.rules.meta_text(text, _word_set(text))


@FILTERS.register("rubric_echo")
class RubricEcho(_TextRule):
    """An answer that copies a rubric aspect's text: a reward model could reward the copied
    words rather than the fit to the user."""

    name = "rubric_echo"

    def hit(self, text: str, pair: PairView) -> Hit | None:
        aspects = [
            it["aspect"]
            for it in (pair.rubric or {}).get("items") or []
            if isinstance(it.get("aspect"), str)
        ]
        return self.rules.rubric_echo(text, aspects, _word_set(text)) if aspects else None


@FILTERS.register("length")
class Length(PairFilter):
    """Both under the word cap (with slack), and of comparable length, so length cannot
    stand in for preference."""

    name = "length"

    def check(self, pair: PairView) -> Verdict:
        counts = {}
        for side, text in _texts(pair):
            counts[side] = count_words(text)
            h = self.rules.over_cap(text, counts[side])
            if h:
                return _drop(side, h)
        for side, text in _texts(pair):
            if counts[side] == 0:  # no words at all (only punctuation): no length ratio
                return _drop(side, self.rules.empty(text) or Hit("has no words", text[:20]))
        h = self.rules.length_ratio(counts["chosen"], counts["rejected"])
        return _drop(None, h) if h else KEEP


@FILTERS.register("quality_floor")
class QualityFloor(PairFilter):
    """Both answers must be correct, relevant and helpful on their own."""

    name = "quality_floor"
    reads_verdicts = True

    def check(self, pair: PairView) -> Verdict:
        for side, q in (("chosen", pair.quality_chosen), ("rejected", pair.quality_rejected)):
            if not q or not q.get("parse_ok"):
                return False, f"no quality judgment for {side}"
        h = self.rules.below_floor(pair.quality_chosen, pair.quality_rejected)
        return _drop(None, h) if h else KEEP


@FILTERS.register("quality_gap")
class QualityGap(PairFilter):
    """General quality must not separate the answers: only preference should."""

    name = "quality_gap"
    reads_verdicts = True

    def check(self, pair: PairView) -> Verdict:
        qc, qr = pair.quality_chosen, pair.quality_rejected
        if not qc or not qr or not qc.get("parse_ok") or not qr.get("parse_ok"):
            return False, "missing quality judgment"
        h = self.rules.quality_gap(qc, qr)
        return _drop(None, h) if h else KEEP


@FILTERS.register("coverage")
class Coverage(PairFilter):
    """The chosen answer covers every item; the rejected fails the items it targets and,
    for violate_one, still covers the others."""

    name = "coverage"
    reads_verdicts = True

    def check(self, pair: PairView) -> Verdict:
        cc, cr = pair.coverage_chosen, pair.coverage_rejected
        if not cc or not cr or not cc.get("parse_ok") or not cr.get("parse_ok"):
            return False, "missing coverage judgment"
        h = self.rules.coverage(
            cc["scores"],
            cr["scores"],
            pair.rubric["items"],
            violated=pair.rejected.get("violates") or [],
            kept=pair.rejected.get("honours") or []
            if pair.rejected.get("strategy") == "violate_one"
            else None,
        )
        return _drop(None, h) if h else KEEP


@FILTERS.register("pairwise_consistency")
class PairwiseConsistency(PairFilter):
    """The rubric-aware judge prefers the chosen in both orders; the rubric-blind judge must
    not (if general quality alone picks the chosen both times, the pair leaks)."""

    name = "pairwise_consistency"
    reads_verdicts = True

    def check(self, pair: PairView) -> Verdict:
        h = self.rules.aware_disagrees(
            prefers(pair.pairwise, "pairwise_aware")
        ) or self.rules.blind_leak(prefers(pair.pairwise, "pairwise_blind"))
        return _drop(None, h) if h else KEEP


@FILTERS.register("similarity")
class Similarity(PairFilter):
    """Near-identical pairs cannot be judged; very different ones let style stand in for
    preference."""

    name = "similarity"

    def check(self, pair: PairView) -> Verdict:
        s = word_similarity(pair.chosen["text"], pair.rejected["text"])
        h = self.rules.near_identical(pair.chosen["text"], pair.rejected["text"], s)
        h = h or self.rules.too_different(s)
        return _drop(None, h) if h else KEEP


@FILTERS.register("near_duplicate")
class NearDuplicate(PairFilter):
    """Across the whole set, within a user: a question that near-duplicates one the same
    user asked, or an answer that near-duplicates one of the same user's, drops the later
    example (by id); across users only a repeated pair (both answers) does. The same
    question from different users is what a personalized benchmark is made of.
    See ``pipeline.dedup.personal_duplicates``."""

    name = "near_duplicate"
    set_level = True

    def apply(self, rows: list[dict[str, Any]]) -> dict[str, str]:
        """rows: kept pairs (``example_id``, ``question``, ``chosen``, ``rejected``, and
        ``user_id`` and ``profile``, the user's posts joined with newlines, where known);
        returns example_id -> reason detail for those to drop."""
        from pipeline.dedup import personal_duplicates

        light = [
            {
                "example_id": r["example_id"],
                "user_id": r.get("user_id"),
                "profile": r.get("profile"),
                "question": r["question"],
                "chosen": r["chosen"],
                "rejected": r["rejected"],
            }
            for r in rows
        ]
        dups = personal_duplicates(
            light,
            question_threshold=self.rules.dedup_question_threshold,
            answer_threshold=self.rules.dedup_answer_threshold,
            profile_threshold=self.rules.dedup_profile_threshold,
        )
        return {ex_id: d.describe() for ex_id, d in dups.items()}
