"""Pair filters. Each answers keep, or drop with a reason; the pair stage counts drops by
filter name and keeps every dropped pair on disk with its reason.

Adding a filter: a class here with a ``name`` and ``check`` (or ``apply`` for a filter over
the whole set), a ``FILTERS.register`` line, a config field if it has a threshold, and a
test that shows both a keep and a drop.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, ClassVar

from rapidfuzz import fuzz

from pipeline.registry import Registry

FILTERS = Registry("filter")
DIMENSIONS = ("correctness", "relevance", "helpfulness")


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

    def __init__(self, pairs_cfg: Any, word_cap: int) -> None:
        self.cfg = pairs_cfg
        self.word_cap = word_cap

    def check(self, pair: PairView) -> Verdict:
        raise NotImplementedError


def _words(text: str) -> list[str]:
    return re.findall(r"[\w']+", text.lower())


@FILTERS.register("judge_parse")
class JudgeParse(PairFilter):
    """Every judgment of the pair parsed (after re-asks); otherwise nothing can be trusted."""

    name = "judge_parse"

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
            for order in ("AB", "BA"):
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
                return False, f"{side} answer was truncated (finish_reason length)"
        return KEEP


class _PatternFilter(PairFilter):
    patterns_field: ClassVar[str]

    def __init__(self, pairs_cfg: Any, word_cap: int) -> None:
        super().__init__(pairs_cfg, word_cap)
        pats = getattr(pairs_cfg, self.patterns_field)
        self.patterns = [re.compile(p, re.IGNORECASE | re.MULTILINE) for p in pats]

    def check(self, pair: PairView) -> Verdict:
        for side, c in (("chosen", pair.chosen), ("rejected", pair.rejected)):
            for p in self.patterns:
                m = p.search(c["text"])
                if m:
                    return False, f"{side} answer matches {p.pattern!r}: {m.group(0)!r}"
        return KEEP


@FILTERS.register("refusal")
class Refusal(_PatternFilter):
    name = "refusal"
    patterns_field = "refusal_patterns"


@FILTERS.register("meta_text")
class MetaText(_PatternFilter):
    """An answer that talks about its brief ("the rubric", "the aspects you expect") gives the
    preference away in words instead of content."""

    name = "meta_text"
    patterns_field = "meta_patterns"


@FILTERS.register("length")
class Length(PairFilter):
    """Both under the word cap (with slack), and of comparable length, so length cannot
    stand in for preference."""

    name = "length"

    def check(self, pair: PairView) -> Verdict:
        cap = self.word_cap * (1 + self.cfg.length_slack)
        wc = len(_words(pair.chosen["text"]))
        wr = len(_words(pair.rejected["text"]))
        if wc > cap or wr > cap:
            return False, f"word counts {wc}/{wr} exceed the cap {cap:.0f}"
        if wr == 0 or wc == 0:
            return False, "an answer is empty"
        ratio = wc / wr
        if not self.cfg.length_ratio_min <= ratio <= self.cfg.length_ratio_max:
            return False, (
                f"length ratio chosen/rejected {ratio:.2f} outside "
                f"[{self.cfg.length_ratio_min}, {self.cfg.length_ratio_max}]"
            )
        return KEEP


@FILTERS.register("quality_floor")
class QualityFloor(PairFilter):
    """Both answers must be correct, relevant and helpful on their own."""

    name = "quality_floor"

    def check(self, pair: PairView) -> Verdict:
        floor = self.cfg.quality_floor
        for side, q in (("chosen", pair.quality_chosen), ("rejected", pair.quality_rejected)):
            if not q or not q.get("parse_ok"):
                return False, f"no quality judgment for {side}"
            low = [d for d in DIMENSIONS if q[d] < floor]
            if low:
                return False, f"{side} scores below {floor} on {', '.join(low)}"
        return KEEP


@FILTERS.register("quality_gap")
class QualityGap(PairFilter):
    """General quality must not separate the answers: only preference should."""

    name = "quality_gap"

    def check(self, pair: PairView) -> Verdict:
        qc, qr = pair.quality_chosen, pair.quality_rejected
        if not qc or not qr or not qc.get("parse_ok") or not qr.get("parse_ok"):
            return False, "missing quality judgment"
        gaps = {d: abs(qc[d] - qr[d]) for d in DIMENSIONS}
        worst = max(gaps, key=gaps.get)
        if gaps[worst] > self.cfg.quality_gap_max:
            return False, f"quality gap {gaps[worst]} on {worst} > {self.cfg.quality_gap_max}"
        return KEEP


@FILTERS.register("coverage")
class Coverage(PairFilter):
    """The chosen answer covers every item; the rejected fails the items it targets and,
    for violate_one, still covers the others."""

    name = "coverage"

    def check(self, pair: PairView) -> Verdict:
        cc, cr = pair.coverage_chosen, pair.coverage_rejected
        if not cc or not cr or not cc.get("parse_ok") or not cr.get("parse_ok"):
            return False, "missing coverage judgment"
        items = [it["item_id"] for it in pair.rubric["items"]]
        low = [i for i in items if cc["scores"].get(i, 0) < self.cfg.coverage_chosen_min]
        if low:
            return False, f"chosen covers {low} below {self.cfg.coverage_chosen_min}"
        violated = pair.rejected.get("violates") or items
        hit = [i for i in violated if cr["scores"].get(i, 0) > self.cfg.coverage_rejected_max]
        if hit:
            return False, f"rejected covers targeted items {hit}"
        if pair.rejected.get("strategy") == "violate_one":
            kept = pair.rejected.get("honours") or []
            lost = [i for i in kept if cr["scores"].get(i, 0) < self.cfg.coverage_kept_min]
            if lost:
                return False, f"violate_one rejected also misses {lost}"
        return KEEP


@FILTERS.register("pairwise_consistency")
class PairwiseConsistency(PairFilter):
    """The rubric-aware judge prefers the chosen in both orders; the rubric-blind judge must
    not (if general quality alone picks the chosen both times, the pair leaks)."""

    name = "pairwise_consistency"

    def check(self, pair: PairView) -> Verdict:
        aware = pair.pairwise.get("pairwise_aware", {})
        blind = pair.pairwise.get("pairwise_blind", {})
        prefs = [aware.get(o, {}).get("prefers") for o in ("AB", "BA")]
        if prefs != ["chosen", "chosen"]:
            return False, f"rubric-aware verdicts AB/BA: {prefs[0]}/{prefs[1]}"
        bprefs = [blind.get(o, {}).get("prefers") for o in ("AB", "BA")]
        if bprefs == ["chosen", "chosen"]:
            return False, "rubric-blind judge prefers the chosen in both orders (leakage)"
        return KEEP


def word_similarity(a: str, b: str) -> float:
    """Word-level Indel similarity (0-100): rapidfuzz over word lists, not characters, so
    two unrelated English texts score low instead of ~50."""
    return float(fuzz.ratio(_words(a), _words(b)))


@FILTERS.register("similarity")
class Similarity(PairFilter):
    """Near-identical pairs cannot be judged; very different ones let style stand in for
    preference."""

    name = "similarity"

    def check(self, pair: PairView) -> Verdict:
        s = word_similarity(pair.chosen["text"], pair.rejected["text"])
        if s > self.cfg.similarity_max:
            return False, f"answers too similar ({s:.0f} > {self.cfg.similarity_max})"
        if s < self.cfg.similarity_min:
            return False, f"answers too different ({s:.0f} < {self.cfg.similarity_min})"
        return KEEP


@FILTERS.register("near_duplicate")
class NearDuplicate(PairFilter):
    """Across the whole set: a question, or an answer, that near-duplicates one of an
    earlier example (by id) drops the later example."""

    name = "near_duplicate"
    set_level = True

    def apply(self, rows: list[dict[str, Any]]) -> dict[str, str]:
        """rows: kept pairs; returns example_id -> reason detail for those to drop."""
        from pipeline.dedup import drop_later_duplicates

        drops: dict[str, str] = {}
        ids = [r["example_id"] for r in rows]
        # Questions are short (12-20 words): 2-word shingles and more bands keep recall of
        # one- and two-word edits high (about 1.00 / 0.89 on synthetic questions, measured
        # while building pipeline/dedup.py) at a small cost for a few thousand questions.
        for ex_id, kept in drop_later_duplicates(
            ids,
            [r["question"] for r in rows],
            self.cfg.dedup_question_threshold,
            shingle=2,
            num_perm=128,
            bands=32,
        ).items():
            drops[ex_id] = f"question near-duplicates example {kept}"
        # answers: both sides of every pair, as one pool; an answer id is example:side
        ans_ids, ans_texts = [], []
        for r in rows:
            if r["example_id"] in drops:
                continue
            for side in ("chosen", "rejected"):
                ans_ids.append(f"{r['example_id']}:{side}")
                ans_texts.append(r[side])
        for aid, kept in drop_later_duplicates(
            ans_ids, ans_texts, self.cfg.dedup_answer_threshold
        ).items():
            ex_id, kept_ex = aid.split(":")[0], kept.split(":")[0]
            if ex_id != kept_ex and ex_id not in drops:
                drops[ex_id] = f"answer {aid} near-duplicates {kept}"
        return drops
