"""The per-pair rules with their thresholds and patterns: :class:`Rules`.

One implementation of each rule, below everything that uses it: the pair stage's filters
(``pipeline/filters.py``), the audit's checks (``pipeline/audit/checks.py``) and the run
config, whose ``pairs`` section takes its defaults from here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Any

from rapidfuzz import fuzz

from pipeline.fields import (
    DIMENSIONS,
    ORDERS,
    count_words,
    is_number,
    largest_quality_gap,
    visible_text,
    word_cap_limit,
    words,
)
from pipeline.rules.patterns import DEFAULT_META_PATTERNS, DEFAULT_REFUSAL_PATTERNS
from pipeline.rules.regexgate import PatternSet
from pipeline.rules.text import Hit, ends_mid_sentence, normalise, quote, tail, word_similarity


@dataclass
class Rules:
    """The thresholds and patterns of every check, from a run config's ``pairs`` section
    and ``responses.word_cap`` (:meth:`from_config`). The defaults here are the config's
    defaults (``PairsSection`` reads them with :func:`default`)."""

    word_cap: int = 100
    length_slack: float = 0.1
    length_ratio_min: float = 0.67
    length_ratio_max: float = 1.5
    similarity_min: float = 10.0
    similarity_max: float = 85.0
    refusal_patterns: Sequence[str] = DEFAULT_REFUSAL_PATTERNS
    meta_patterns: Sequence[str] = DEFAULT_META_PATTERNS
    echo_min_words: int = 5
    echo_threshold: float = 90.0
    quality_floor: int = 4
    quality_gap_max: int = 1
    coverage_chosen_min: int = 2
    coverage_rejected_max: int = 0
    coverage_kept_min: int = 1
    dedup_question_threshold: float = 95.0
    dedup_answer_threshold: float = 95.0
    dedup_profile_threshold: float = 90.0
    _refusal: PatternSet = field(init=False, repr=False)
    _meta: PatternSet = field(init=False, repr=False)
    _aspects: dict[str, tuple[tuple[str, ...], frozenset[str]]] = field(init=False, repr=False)
    _echo_share: float = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._aspects = {}
        self._echo_share = 0.4 if self.echo_threshold >= 85 else 0.0
        self._refusal = PatternSet(self.refusal_patterns, "pairs.refusal_patterns")
        self._meta = PatternSet(self.meta_patterns, "pairs.meta_patterns")

    @classmethod
    def from_config(cls, pairs: Any = None, word_cap: int | None = None) -> Rules:
        """From a config's ``pairs`` section (None: these defaults, which are the config's
        own) and the word cap."""
        if pairs is None:
            return cls(word_cap=100 if word_cap is None else word_cap)
        names = [n for n in cls.__dataclass_fields__ if not n.startswith("_") and n != "word_cap"]
        kw = {n: getattr(pairs, n) for n in names if hasattr(pairs, n)}
        return cls(word_cap=100 if word_cap is None else word_cap, **kw)

    @property
    def cap(self) -> float:
        return word_cap_limit(self.word_cap, self.length_slack)

    def thresholds(self) -> dict[str, Any]:
        """Every threshold by its config name (a pattern list as its length), and the cap
        they make: what a report says it checked with, read from here, never listed."""
        out: dict[str, Any] = {}
        for name in self.__dataclass_fields__:
            if not name.startswith("_"):
                value = getattr(self, name)
                out[name] = len(value) if name.endswith("_patterns") else value
        out["cap"] = round(self.cap, 2)
        return out

    # ---- one answer --------------------------------------------------------------------

    @staticmethod
    def empty(text: str) -> Hit | None:
        """No visible text (``pipeline.fields.visible_text``, the test ingest applies to the
        input): empty, blanks only, or only invisible and control characters."""
        if not visible_text(text):
            if not text:
                what = "is empty"
            elif not text.strip():
                what = "is whitespace only"
            else:
                what = "has no visible text (only invisible or control characters)"
            return Hit(what, repr(text[:20]))
        return None

    def over_cap(self, text: str, n_words: int | None = None) -> Hit | None:
        n = count_words(text) if n_words is None else n_words
        if n > self.cap:
            return Hit(
                f"has {n} words, over the cap of {self.cap:.0f} "
                f"({self.word_cap} + {self.length_slack:.0%} slack): {tail(text, 40)!r}",
                f"{n} words",
            )
        return None

    def refusal(self, text: str, tokens: AbstractSet[str] | None = None) -> Hit | None:
        found = self._refusal.first(text, tokens)
        if found is None:
            return None
        _, m = found
        return Hit(f"refuses: {m.group(0).strip()!r}", m.group(0))

    def meta_text(self, text: str, tokens: AbstractSet[str] | None = None) -> Hit | None:
        found = self._meta.first(text, tokens)
        if found is None:
            return None
        _, m = found
        # quote the match with a little context, so a reader sees the phrase in place
        lo, hi = max(0, m.start() - 25), min(len(text), m.end() + 25)
        around = ("…" if lo else "") + text[lo:hi].strip() + ("…" if hi < len(text) else "")
        return Hit(
            f"talks about its brief: {m.group(0).strip()!r} in {quote(around, 120)!r}",
            quote(around, 120),
        )

    def _aspect(self, aspect: str) -> tuple[tuple[str, ...], frozenset[str]]:
        """An aspect's normalised forms (none when it is too short to count) and its
        longer words; cached, since every aspect is checked against both answers.

        Rubric aspects describe the answer ("Suggests short sessions that fit a commute"),
        so an answer that copies one usually drops the describing verb: the form without a
        leading third-person verb is checked too."""
        cache = self._aspects
        got = cache.get(aspect)
        if got is None:
            a = normalise(aspect)
            n = a.count(" ") + 1
            forms: list[str] = []
            if n >= self.echo_min_words:
                forms.append(a)
                head, _, rest = a.partition(" ")
                if head.endswith("s") and n - 1 >= self.echo_min_words:
                    forms.append(rest)
            got = (tuple(forms), frozenset(w for w in words(aspect) if len(w) > 2))
            if len(cache) >= 100_000:
                cache.clear()
            cache[aspect] = got
        return got

    @staticmethod
    def truncated_text(text: str) -> Hit | None:
        return ends_mid_sentence(text)

    def rubric_echo(
        self, text: str, aspects: Sequence[str], tokens: AbstractSet[str] | None = None
    ) -> Hit | None:
        """The answer holds a rubric aspect's text verbatim or nearly: character-level
        partial ratio at or above ``echo_threshold`` for an aspect of at least
        ``echo_min_words`` words (shorter ones are common phrases, not a copy).

        Aspects most of whose words are absent from the answer are skipped before the
        fuzzy match: a window within 10% character edits of the aspect keeps at least
        about half of its words intact, so an aspect with under 40% of its longer words
        in the answer cannot reach the threshold (this shortcut is off for thresholds
        under 85, where that bound does not hold)."""
        norm = None
        for aspect in aspects:
            forms, key = self._aspect(aspect)
            if not forms:
                continue
            if tokens is not None and key and len(key & tokens) < self._echo_share * len(key):
                continue
            if norm is None:
                norm = normalise(text)
            for a in forms:
                if len(norm) < len(a):  # partial_ratio would look for the answer in the aspect
                    continue
                score = fuzz.partial_ratio(a, norm, score_cutoff=self.echo_threshold)
                if score:
                    al = fuzz.partial_ratio_alignment(a, norm)
                    excerpt = norm[al.dest_start : al.dest_end] if al else a
                    return Hit(
                        f"copies the rubric aspect {quote(aspect)!r} "
                        f"({score:.0f}/100 match): {excerpt!r}",
                        excerpt,
                    )
        return None

    # ---- the two answers ------------------------------------------------------------------

    @staticmethod
    def identical(chosen: str, rejected: str) -> Hit | None:
        if chosen.strip() and " ".join(chosen.lower().split()) == " ".join(
            rejected.lower().split()
        ):
            return Hit(f"chosen and rejected are the same text: {quote(chosen, 60)!r}", "")
        return None

    def near_identical(
        self, chosen: str, rejected: str, similarity: float | None = None
    ) -> Hit | None:
        s = word_similarity(chosen, rejected) if similarity is None else similarity
        if s > self.similarity_max:
            return Hit(
                f"answers too similar ({s:.0f} > {self.similarity_max:g} word-level "
                f"similarity): {quote(chosen, 50)!r} vs {quote(rejected, 50)!r}",
                f"similarity {s:.0f}",
            )
        return None

    def too_different(self, similarity: float) -> Hit | None:
        if similarity < self.similarity_min:
            return Hit(
                f"answers too different ({similarity:.0f} < {self.similarity_min:g})",
                f"similarity {similarity:.0f}",
            )
        return None

    def length_ratio(self, n_chosen: int, n_rejected: int) -> Hit | None:
        ratio = n_chosen / n_rejected if n_rejected else float("inf")
        if not self.length_ratio_min <= ratio <= self.length_ratio_max:
            return Hit(
                f"length ratio chosen/rejected {ratio:.2f} outside "
                f"[{self.length_ratio_min}, {self.length_ratio_max}]",
                f"{n_chosen}/{n_rejected} words",
            )
        return None

    # ---- judge verdicts -------------------------------------------------------------------

    def below_floor(self, qc: Mapping[str, Any] | None, qr: Mapping[str, Any] | None) -> Hit | None:
        """Rule ``quality_floor`` (the method name differs from the threshold's)."""
        for side, q in (("chosen", qc), ("rejected", qr)):
            if not q:
                return Hit(f"no quality judgment for {side}", side)
            low = [
                f"{d} {q[d]:g}"
                for d in DIMENSIONS
                if is_number(q.get(d)) and q[d] < self.quality_floor
            ]
            if low:
                return Hit(
                    f"{side} scores below {self.quality_floor} on {', '.join(low)}",
                    f"{side}: {', '.join(low)}",
                )
        return None

    def quality_gap(self, qc: Mapping[str, Any] | None, qr: Mapping[str, Any] | None) -> Hit | None:
        if not qc or not qr:
            return Hit("missing quality judgment", "")
        worst = largest_quality_gap(qc, qr)
        if worst is not None and worst[1] > self.quality_gap_max:
            d, gap = worst
            return Hit(
                f"quality gap {gap:g} on {d} > {self.quality_gap_max} "
                f"(chosen {qc[d]:g}, rejected {qr[d]:g})",
                f"{d}: {qc[d]:g} vs {qr[d]:g}",
            )
        return None

    def coverage(
        self,
        chosen: Mapping[str, Any],
        rejected: Mapping[str, Any],
        items: Sequence[Mapping[str, Any]],
        violated: Sequence[str] = (),
        kept: Sequence[str] | None = None,
    ) -> Hit | None:
        """Per-item coverage (0/1/2 per rubric item): the chosen answer covers every item
        at least ``coverage_chosen_min``; the rejected one covers none of the items it
        targets (``violated``, default every item) above ``coverage_rejected_max``; and,
        for a rejected answer that keeps some items (``kept``: violate_one), each of those
        at least ``coverage_kept_min``. Items are named by their text."""
        text = {it["item_id"]: it.get("aspect") or it["item_id"] for it in items}
        ids = list(text)

        def named(found: list[str], scores: Mapping[str, Any]) -> str:
            shown = [f"{quote(text.get(i, i), 60)!r} ({i}: {scores.get(i, 0)})" for i in found[:3]]
            more = f" and {len(found) - 3} more" if len(found) > 3 else ""
            return ", ".join(shown) + more

        low = [i for i in ids if chosen.get(i, 0) < self.coverage_chosen_min]
        if low:
            return Hit(
                f"chosen covers {named(low, chosen)} below {self.coverage_chosen_min}",
                f"chosen: {len(low)} items",
            )
        targeted = list(violated) or ids
        hit = [i for i in targeted if rejected.get(i, 0) > self.coverage_rejected_max]
        if hit:
            return Hit(
                f"rejected covers targeted items {named(hit, rejected)} above "
                f"{self.coverage_rejected_max}",
                f"rejected: {len(hit)} items",
            )
        lost = [i for i in kept or () if rejected.get(i, 0) < self.coverage_kept_min]
        if lost:
            return Hit(
                f"violate_one rejected also misses {named(lost, rejected)} (below "
                f"{self.coverage_kept_min})",
                f"rejected: {len(lost)} kept items",
            )
        return None

    def coverage_means(self, chosen_mean: Any, rejected_mean: Any) -> Hit | None:
        """Release rows keep coverage as means over the rubric items: a chosen mean below
        the per-item minimum means at least one item is below it."""
        if is_number(chosen_mean) and chosen_mean < self.coverage_chosen_min:
            return Hit(
                f"chosen's mean coverage {chosen_mean:.2f} is below "
                f"{self.coverage_chosen_min} (some rubric item not covered)",
                f"chosen {chosen_mean:.2f}",
            )
        if is_number(rejected_mean) and rejected_mean > self.coverage_rejected_max:
            return Hit(
                f"rejected's mean coverage of its targeted items {rejected_mean:.2f} is above "
                f"{self.coverage_rejected_max}",
                f"rejected {rejected_mean:.2f}",
            )
        return None

    @staticmethod
    def aware_disagrees(prefers: Mapping[str, Any]) -> Hit | None:
        ab, ba = (prefers.get(o) for o in ORDERS)
        if [ab, ba] != ["chosen", "chosen"]:
            return Hit(f"rubric-aware verdicts AB/BA: {ab}/{ba}", f"{ab}/{ba}")
        return None

    @staticmethod
    def blind_leak(prefers: Mapping[str, Any]) -> Hit | None:
        if [prefers.get(o) for o in ORDERS] == ["chosen", "chosen"]:
            return Hit("rubric-blind judge prefers the chosen in both orders (leakage)", "")
        return None


def default(name: str) -> Any:
    """The default of one of :class:`Rules`' settings (the config's ``pairs`` section uses
    it, so a threshold's default is written once)."""
    f = Rules.__dataclass_fields__[name]
    return f.default
