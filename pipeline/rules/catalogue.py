"""The built-in pair rules, registered in the audit's report order (``position`` is the
pair stage's default order). A rule's docstring says when it drops a pair, then why; an
audit method's docstring says when it fires: docs/filters.md and docs/audit.md list them."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from rapidfuzz import fuzz

from pipeline.core.fields import (
    DIMENSIONS,
    ORDERS,
    is_number,
    largest_quality_gap,
    visible_text,
    word_cap_limit,
    words,
)
from pipeline.rules.base import (
    KEEP,
    RULES,
    SKIP,
    Answer,
    Found,
    PairRule,
    PairView,
    RowView,
    Skip,
    Verdict,
    audit,
    threshold,
)
from pipeline.rules.dedup import personal_duplicates, profile_text
from pipeline.rules.patterns import DEFAULT_META_PATTERNS, DEFAULT_REFUSAL_PATTERNS
from pipeline.rules.regexgate import PatternSet
from pipeline.rules.text import Hit, ends_mid_sentence, normalise, quote, tail, word_similarity
from pipeline.rules.verdicts import prefers

CUT_OFF = "stopped at max_tokens (finish_reason length): not a finished answer"


def valid_patterns(v: list[str]) -> list[str]:
    """Regexes compiled as the rules compile them: a bad one fails when the config loads."""
    for i, pattern in enumerate(v):
        try:
            rx = re.compile(pattern, re.IGNORECASE | re.MULTILINE)
        except (re.error, RecursionError, OverflowError) as exc:
            raise ValueError(
                f"item {i} is not a valid regular expression ({exc}); fix or remove it"
            ) from None
        if rx.search("") is not None:
            raise ValueError(
                f"item {i} ({pattern!r}) matches empty text, so it would drop every pair"
            )
    return v


def _no_text(text: str) -> Hit | None:
    """No visible text (``pipeline.core.fields.visible_text``, the test ingest applies)."""
    if visible_text(text):
        return None
    if not text.strip():
        return Hit("is whitespace only" if text else "is empty", repr(text[:20]))
    return Hit("has no visible text (only invisible or control characters)", repr(text[:20]))


@RULES.register("empty")
class Empty(PairRule):
    """either answer is empty or whitespace only

    an answer with nothing to read cannot be preferred for anything"""

    position = 30

    @audit("empty", "Empty answer", per="answer")
    def answer(self, a: Answer) -> Found:
        """an answer is empty or whitespace only"""
        return _no_text(a.text)


@RULES.register("similarity")
class Similarity(PairRule):
    """the answers are near-identical or share almost nothing

    word-level rapidfuzz Indel similarity: above the maximum a judge cannot tell them apart;
    below the minimum style rather than preference separates them"""

    position = 130
    similarity_min = threshold(
        float, 10.0, "Least word-level similarity (rapidfuzz Indel, 0-100).", ge=0, le=100
    )
    similarity_max = threshold(
        float, 85.0, "Largest word-level similarity (near-identical above).", ge=0, le=100
    )

    def near(self, chosen: str, rejected: str, s: float | None = None) -> Hit | None:
        s = word_similarity(chosen, rejected) if s is None else s
        if s > self.similarity_max:
            why = f"answers too similar ({s:.0f} > {self.similarity_max:g} word-level similarity)"
            return Hit(
                f"{why}: {quote(chosen, 50)!r} vs {quote(rejected, 50)!r}", f"similarity {s:.0f}"
            )
        return None

    def combination(self, pair: PairView) -> Hit | None:
        s = word_similarity(pair.chosen["text"], pair.rejected["text"])
        if hit := self.near(pair.chosen["text"], pair.rejected["text"], s):
            return hit
        if s < self.similarity_min:
            return Hit(
                f"answers too different ({s:.0f} < {self.similarity_min:g})", f"similarity {s:.0f}"
            )
        return None

    @audit("identical", "Identical answers")
    def identical(self, row: RowView) -> Found:
        """chosen and rejected are the same text (ignoring case and spacing)"""
        chosen, rejected = row.texts["chosen"], row.texts["rejected"]
        if chosen.strip() and " ".join(chosen.lower().split()) == " ".join(
            rejected.lower().split()
        ):
            return Hit(f"chosen and rejected are the same text: {quote(chosen, 60)!r}", "")
        return None

    @audit("near_identical", "Near-identical answers", unless="identical")
    def near_identical(self, row: RowView) -> Found:
        """word-level similarity of chosen and rejected above pairs.similarity_max"""
        return self.near(row.texts["chosen"], row.texts["rejected"], row.similarity)

    @classmethod
    def settings_problem(
        cls, values: Mapping[str, Any], word_cap: int, enabled: bool
    ) -> tuple[str, str] | None:
        low, high = values["similarity_min"], values["similarity_max"]
        if low > high:
            why = f"pairs.similarity_min ({low}) exceeds pairs.similarity_max ({high})"
            return "similarity_min", f"{why}, so every pair would be dropped; swap or widen them"
        return None


@RULES.register("length")
class Length(PairRule):
    """an answer is over the cap, or the two differ too much in length

    models overshoot a stated cap (`responses.word_cap`) slightly, hence the slack; the ratio
    band keeps length from standing in for preference (the reference benchmark's RMs are known
    to favour longer answers). The ratio is a figure in the audit, not a per-pair check"""

    position = 80
    # ten times the cap is no cap at all; two capped answers' counts differ by less than it
    length_slack = threshold(
        float, 0.1, "Word cap tolerance: both answers <= word_cap * (1 + slack).", ge=0, le=10
    )
    length_ratio_min = threshold(
        float, 0.67, "Least chosen/rejected word-count ratio.", gt=0, le=1000
    )
    length_ratio_max = threshold(float, 1.5, "Largest chosen/rejected ratio.", gt=0, le=1000)

    @property
    def cap(self) -> float:
        return word_cap_limit(self.word_cap, self.length_slack)

    @audit("over_cap", "Over the word cap", per="answer")
    def answer(self, a: Answer) -> Found:
        """an answer has more words than the cap times (1 + pairs.length_slack)"""
        n = a.n_words
        if n > self.cap:
            slack = f"({self.word_cap} + {self.length_slack:.0%} slack)"
            return Hit(
                f"has {n} words, over the cap of {self.cap:.0f} {slack}: {tail(a.text, 40)!r}",
                f"{n} words",
            )
        return None

    def check(self, pair: PairView) -> Verdict:
        answers = {side: pair.answer(side) for side in ("chosen", "rejected")}
        for side, a in answers.items():
            if hit := self.answer(a):
                return False, f"{side} answer {hit.detail}"
        for side, a in answers.items():
            if a.n_words == 0:  # no words at all (only punctuation): no length ratio
                return (
                    False,
                    f"{side} answer {(_no_text(a.text) or Hit('has no words', '')).detail}",
                )
        n_chosen, n_rejected = answers["chosen"].n_words, answers["rejected"].n_words
        ratio = n_chosen / n_rejected if n_rejected else float("inf")
        if not self.length_ratio_min <= ratio <= self.length_ratio_max:
            band = f"[{self.length_ratio_min}, {self.length_ratio_max}]"
            return False, f"length ratio chosen/rejected {ratio:.2f} outside {band}"
        return KEEP

    @classmethod
    def settings_problem(
        cls, values: Mapping[str, Any], word_cap: int, enabled: bool
    ) -> tuple[str, str] | None:
        low, high = values["length_ratio_min"], values["length_ratio_max"]
        if low > high:
            why = f"pairs.length_ratio_min ({low}) exceeds pairs.length_ratio_max ({high})"
            return "length_ratio_min", f"{why}, so every pair would be dropped; swap or widen them"
        # both answers hold 1..cap words, so chosen/rejected lies within [1/cap, cap]
        cap = int(word_cap * (1 + values["length_slack"]))
        if enabled and (low > cap or high < 1 / max(cap, 1)):
            why = f"pairs.length_ratio_min/max [{low}, {high}] excludes every ratio two answers"
            return (
                "length_ratio_min",
                f"{why} of 1 to {cap} words can have, so every pair would be dropped",
            )
        return None


class _Patterns(PairRule):
    """A rule on the first of a list of regexes (the threshold ``setting``) an answer holds."""

    setting = ""

    def setup(self) -> None:
        self.patterns = PatternSet(getattr(self, self.setting), f"pairs.{self.setting}")

    def match(self, a: Answer) -> re.Match[str] | None:
        found = self.patterns.first(a.text, a.tokens)
        return None if found is None else found[1]


@RULES.register("refusal")
class Refusal(_Patterns):
    """either answer refuses

    an apology or "as an AI" opening followed by a refusal ("I'm sorry, but I can't…"), or
    "I cannot/can't/am unable to help/assist/provide/answer" anywhere. "I'm sorry to hear…"
    and "I can't help but notice" pass"""

    position, setting = 50, "refusal_patterns"
    refusal_patterns = threshold(
        list[str],
        list(DEFAULT_REFUSAL_PATTERNS),
        "Regexes (case-insensitive) that mark a refusal.",
        check=valid_patterns,
    )

    @audit("refusal", "Refusal", per="answer")
    def answer(self, a: Answer) -> Found:
        """an answer refuses (pairs.refusal_patterns)"""
        m = self.match(a)
        return None if m is None else Hit(f"refuses: {m.group(0).strip()!r}", m.group(0))


@RULES.register("meta_text")
class MetaText(_Patterns):
    """either answer talks about its brief

    the ways models mention instructions, rubrics, aspects, points listed, what the user
    expects, word limits, or describe the answer itself ("This response avoids…", "I've kept
    it under 100 words"); each needs a second cue so ordinary uses of the same words pass
    ("manage your expectations", "as instructed by your doctor"). Tested on 129 phrasings and
    171 ordinary sentences (`tests/test_checks.py`)"""

    position, setting = 60, "meta_patterns"
    meta_patterns = threshold(
        list[str],
        list(DEFAULT_META_PATTERNS),
        "Regexes (case-insensitive) that mark an answer talking about its brief "
        "(defaults: pipeline/rules/patterns.py, docs/audit.md).",
        check=valid_patterns,
    )

    @audit("meta_text", "Meta-text", per="answer")
    def answer(self, a: Answer) -> Found:
        """an answer talks about its brief: instructions, rubric, aspects, word limits
        (pairs.meta_patterns)"""
        m = self.match(a)
        if m is None:
            return None
        # quote the match with a little context, so a reader sees the phrase in place
        lo, hi = max(0, m.start() - 25), min(len(a.text), m.end() + 25)
        around = quote(
            ("…" if lo else "") + a.text[lo:hi].strip() + ("…" if hi < len(a.text) else ""), 120
        )
        return Hit(f"talks about its brief: {m.group(0).strip()!r} in {around!r}", around)


@RULES.register("truncated_text")
class TruncatedText(PairRule):
    """either answer stops mid-sentence, seen from its text: no closing punctuation at the end
    of prose, or a trailing comma, colon, dash or function word ("and", "the")

    lists, headings and tables often end without a full stop, so a last line of that kind
    needs a dangling mark or word to count; catches servers that do not report
    `finish_reason` and models that stop early"""

    position = 40

    @audit("truncated_text", "Ends mid-sentence", per="answer")
    def answer(self, a: Answer) -> Found:
        """an answer stops mid-sentence: no closing punctuation, or a trailing comma, colon
        or function word"""
        return ends_mid_sentence(a.text) if a.text.strip() else None


@RULES.register("truncated")
class Truncated(PairRule):
    """either answer stopped at `max_tokens` (`finish_reason: length`)

    a cut answer is unfinished, and its missing end could hold the aspect"""

    position = 20

    @audit("cut_off", "Cut off at max_tokens", per="answer", needs=("finish_reasons",))
    def answer(self, a: Answer) -> Found:
        """an answer stopped on the token limit (finish_reason length; needs the
        finish_reasons column)"""
        if a.finish_reason is None:
            return SKIP
        if a.finish_reason != "length":
            return None
        if a.reasoning_cut:  # a reasoning model's reasoning used its whole budget
            return Hit("never came: reasoning_exhausted", "reasoning_exhausted")
        return Hit(CUT_OFF, "finish_reason length")


@RULES.register("rubric_echo")
class RubricEcho(PairRule):
    """either answer copies one of the rubric's aspects verbatim or nearly (the aspect
    without its describing verb, "Suggests …", counts too)

    an answer that repeats the rubric's words could be rewarded for the words, not for
    fitting the user; covering an aspect in one's own words passes"""

    position = 70
    echo_min_words = threshold(
        int, 5, "rubric_echo: least words a rubric aspect needs to count.", ge=1, le=1000
    )
    echo_threshold = threshold(
        float, 90.0, "rubric_echo: least partial match (0-100) of an aspect.", ge=0, le=100
    )

    def setup(self) -> None:
        self._aspects: dict[str, tuple[tuple[str, ...], frozenset[str]]] = {}
        self._echo_share = 0.4 if self.echo_threshold >= 85 else 0.0

    def _aspect(self, aspect: str) -> tuple[tuple[str, ...], frozenset[str]]:
        """An aspect's normalised forms (none when it is too short to count) and its longer
        words; cached, since every aspect is checked against both answers. Aspects describe
        the answer ("Suggests short sessions"), so an answer that copies one usually drops
        the describing verb: the form without a leading third-person verb counts too."""
        got = self._aspects.get(aspect)
        if got is None:
            a = normalise(aspect)
            n = a.count(" ") + 1
            head, _, rest = a.partition(" ")
            forms = [a, rest] if head.endswith("s") and n - 1 >= self.echo_min_words else [a]
            got = (
                tuple(forms) if n >= self.echo_min_words else (),
                frozenset(w for w in words(aspect) if len(w) > 2),
            )
            if len(self._aspects) >= 100_000:
                self._aspects.clear()
            self._aspects[aspect] = got
        return got

    @audit("rubric_echo", "Rubric echo", per="answer", needs=("rubric_aspects",))
    def answer(self, a: Answer) -> Found:
        """an answer copies a rubric aspect verbatim or nearly (needs rubric_aspects)"""
        # A character-level partial ratio at or above echo_threshold, for aspects of at least
        # echo_min_words words. An aspect with under 40% of its longer words in the answer is
        # skipped first: a window within 10% character edits of it keeps about half of its
        # words intact, so it cannot reach the threshold (not so under 85: no shortcut there).
        if not a.aspects:
            return SKIP
        norm = None
        for aspect in a.aspects:
            forms, key = self._aspect(aspect)
            if not forms or (key and len(key & a.tokens) < self._echo_share * len(key)):
                continue
            norm = normalise(a.text) if norm is None else norm
            for form in forms:
                if len(norm) < len(form):  # partial_ratio would look for the answer in it
                    continue
                if score := fuzz.partial_ratio(form, norm, score_cutoff=self.echo_threshold):
                    al = fuzz.partial_ratio_alignment(form, norm)
                    excerpt = norm[al.dest_start : al.dest_end] if al else form
                    why = f"copies the rubric aspect {quote(aspect)!r} ({score:.0f}/100 match)"
                    return Hit(f"{why}: {excerpt!r}", excerpt)
        return None


def _user_key(row: Mapping[str, Any]) -> str:
    uid = row.get("user_id")
    if uid is not None and uid != "":
        return f"u:{uid}"
    prof = profile_text(row.get("profile"))
    return "p:" + hashlib.blake2b(prof.encode(), digest_size=12).hexdigest() if prof else "?"


@RULES.register("duplicate_row")
class DuplicateRow(PairRule):
    """An exact copy of an earlier row: an audit check only (the pair stage keeps one pair per
    example, and near_duplicate covers copies across examples)."""

    @audit("duplicate_row", "Duplicate row", per="set")
    def duplicates(
        self, rows: Sequence[Mapping[str, Any]], ids: Sequence[str], skip: set[int]
    ) -> Iterator[tuple[int, Hit]]:
        """same user, same question, same chosen and rejected as an earlier row"""
        seen: dict[bytes, int] = {}
        for i, r in enumerate(rows):
            norm = (" ".join(str(r[c]).split()) for c in ("question", "chosen", "rejected"))
            digest = hashlib.blake2b(
                "\x00".join([_user_key(r), *norm]).encode(), digest_size=16
            ).digest()
            if (first := seen.setdefault(digest, i)) != i:
                yield (
                    i,
                    Hit(f"repeats row {ids[first]} (same user, question and answers)", ids[first]),
                )


@RULES.register("near_duplicate")
class NearDuplicate(PairRule):
    """(whole set) within one person: the question near-duplicates one the person asked
    earlier, or an answer near-duplicates one of the person's other answers; across persons:
    both answers repeat another example's chosen and rejected

    rapidfuzz `token_set_ratio` for questions and answers, `token_sort_ratio` of profiles
    (above it two user ids are one person); candidates from MinHash LSH (`pipeline/rules/dedup.py`),
    so the pass stays sub-quadratic. The same question from different users is the point of a
    personalized benchmark and never a duplicate"""

    position, set_level = 140, True
    dedup_question_threshold = threshold(
        float, 95.0, "One user's questions this similar are duplicates.", ge=0, le=100
    )
    dedup_answer_threshold = threshold(
        float,
        95.0,
        "Answers this similar are duplicates: within a user, or both answers of a pair "
        "across users (docs/audit.md).",
        ge=0,
        le=100,
    )
    dedup_profile_threshold = threshold(
        float, 90.0, "Profiles this similar are one person for dedup.", ge=0, le=100
    )

    def _duplicates(self, rows: Sequence[Mapping[str, Any]], **kw: Any) -> dict[str, Any]:
        return personal_duplicates(
            rows,
            question_threshold=self.dedup_question_threshold,
            answer_threshold=self.dedup_answer_threshold,
            profile_threshold=self.dedup_profile_threshold,
            **kw,
        )

    def apply(self, rows: list[dict[str, Any]]) -> dict[str, str]:
        """rows: kept pairs (``example_id``, ``question``, ``chosen``, ``rejected``, and
        ``user_id`` and ``profile``, the user's posts joined, where known)."""
        light = [
            {
                k: r.get(k)
                for k in ("example_id", "user_id", "profile", "question", "chosen", "rejected")
            }
            for r in rows
        ]
        return {ex_id: d.describe() for ex_id, d in self._duplicates(light).items()}

    @audit("near_duplicate", "Near-duplicate", per="set", unless="duplicate_row")
    def near_duplicates(
        self, rows: Sequence[Mapping[str, Any]], ids: Sequence[str], skip: set[int]
    ) -> Iterator[tuple[int, Hit]]:
        """the question near-duplicates an earlier one of the same user, an answer
        near-duplicates one of the same user's, or both answers repeat another user's pair"""
        # the rows themselves, not copies: profiles are joined only for the few rows whose
        # question or answers have a near-duplicate
        keep = [i for i in range(len(rows)) if i not in skip]
        found = self._duplicates([rows[i] for i in keep], keys=[f"{i:09d}" for i in keep])
        for key, d in sorted(found.items()):
            yield int(key), Hit(d.describe(ids[int(d.kept)]), ids[int(d.kept)])


def _judged(*verdicts: Any) -> bool:
    return all(v and v.get("parse_ok") for v in verdicts)


def _qualities(row: RowView) -> tuple[Any, Any] | Any:
    """Both answers' rubric-blind scores, or SKIP where the row lacks either."""
    both = (row.row.get("quality_chosen"), row.row.get("quality_rejected"))
    has = [isinstance(q, Mapping) and any(q.get(d) is not None for d in DIMENSIONS) for q in both]
    return both if all(has) else SKIP


@RULES.register("quality_floor")
class QualityFloor(PairRule):
    """either answer scores below the floor on correctness, relevance or helpfulness

    both answers must be good on their own"""

    position, reads_verdicts = 90, True
    quality_floor = threshold(
        int, 4, "Both answers score at least this on all three dimensions.", ge=1, le=5
    )

    def below(self, qc: Mapping[str, Any], qr: Mapping[str, Any]) -> Hit | None:
        for side, q in (("chosen", qc), ("rejected", qr)):
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

    def check(self, pair: PairView) -> Verdict:
        for side, q in (("chosen", pair.quality_chosen), ("rejected", pair.quality_rejected)):
            if not _judged(q):
                return False, f"no quality judgment for {side}"
        hit = self.below(pair.quality_chosen or {}, pair.quality_rejected or {})
        return (False, hit.detail) if hit else KEEP

    @audit("quality_floor", "Below the quality floor", needs=("quality_chosen", "quality_rejected"))
    def floor_row(self, row: RowView) -> Found:
        """the rubric-blind judge scores an answer below pairs.quality_floor"""
        both = _qualities(row)
        return both if both is SKIP else self.below(*both)


@RULES.register("quality_gap")
class QualityGap(PairRule):
    """the answers differ by more than the gap on any dimension

    general quality must not separate them"""

    position, reads_verdicts = 100, True
    quality_gap_max = threshold(
        int, 1, "Largest allowed difference on any quality dimension.", ge=0, le=4
    )

    def gap(self, qc: Mapping[str, Any], qr: Mapping[str, Any]) -> Hit | None:
        worst = largest_quality_gap(qc, qr)
        if worst is None or worst[1] <= self.quality_gap_max:
            return None
        d, gap = worst
        why = f"quality gap {gap:g} on {d} > {self.quality_gap_max}"
        why += f" (chosen {qc[d]:g}, rejected {qr[d]:g})"
        return Hit(why, f"{d}: {qc[d]:g} vs {qr[d]:g}")

    def check(self, pair: PairView) -> Verdict:
        if not _judged(pair.quality_chosen, pair.quality_rejected):
            return False, "missing quality judgment"
        hit = self.gap(pair.quality_chosen or {}, pair.quality_rejected or {})
        return (False, hit.detail) if hit else KEEP

    @audit("quality_gap", "Quality gap", needs=("quality_chosen", "quality_rejected"))
    def gap_row(self, row: RowView) -> Found:
        """the rubric-blind scores differ by more than pairs.quality_gap_max"""
        both = _qualities(row)
        return both if both is SKIP else self.gap(*both)


@RULES.register("coverage")
class Coverage(PairRule):
    """the chosen misses an item, the rejected covers a targeted item, or a `violate_one`
    rejected also loses an item it should keep

    per rubric item on the judge's 0/1/2 scale (items named by their text); the audit reads a
    release's per-pair means"""

    position, reads_verdicts = 110, True
    coverage_chosen_min = threshold(
        int, 2, "The chosen answer's least coverage score on every item.", ge=0, le=2
    )
    coverage_rejected_max = threshold(
        int, 0, "The rejected answer's highest score on its violated items.", ge=0, le=2
    )
    coverage_kept_min = threshold(
        int, 1, "violate_one: the rejected answer's least score on the items it keeps.", ge=0, le=2
    )

    def check(self, pair: PairView) -> Verdict:
        cc, cr = pair.coverage_chosen, pair.coverage_rejected
        if not cc or not cr or not _judged(cc, cr):
            return False, "missing coverage judgment"
        chosen, rejected, rej = cc["scores"], cr["scores"], pair.rejected
        text = {it["item_id"]: it.get("aspect") or it["item_id"] for it in pair.rubric["items"]}

        def named(found: list[str], scores: Mapping[str, Any]) -> str:
            shown = [f"{quote(text.get(i, i), 60)!r} ({i}: {scores.get(i, 0)})" for i in found[:3]]
            return ", ".join(shown) + (f" and {len(found) - 3} more" if len(found) > 3 else "")

        if low := [i for i in text if chosen.get(i, 0) < self.coverage_chosen_min]:
            return False, f"chosen covers {named(low, chosen)} below {self.coverage_chosen_min}"
        targeted = list(rej.get("violates") or []) or list(text)
        if hit := [i for i in targeted if rejected.get(i, 0) > self.coverage_rejected_max]:
            why = f"rejected covers targeted items {named(hit, rejected)}"
            return False, f"{why} above {self.coverage_rejected_max}"
        kept = (rej.get("honours") or []) if rej.get("strategy") == "violate_one" else []
        if lost := [i for i in kept if rejected.get(i, 0) < self.coverage_kept_min]:
            why = f"violate_one rejected also misses {named(lost, rejected)}"
            return False, f"{why} (below {self.coverage_kept_min})"
        return KEEP

    @audit("coverage", "Coverage off", needs=("coverage_chosen_mean", "coverage_rejected_mean"))
    def means(self, row: RowView) -> Found:
        """the chosen's mean coverage is below pairs.coverage_chosen_min, or the rejected's
        (of its violated items) above pairs.coverage_rejected_max"""
        # a chosen mean below the per-item minimum means at least one item is below it
        chosen: Any = row.row.get("coverage_chosen_mean")
        rejected: Any = row.row.get("coverage_rejected_violated_mean")
        rejected = row.row.get("coverage_rejected_mean") if rejected is None else rejected
        if chosen is None and rejected is None:
            return SKIP
        if is_number(chosen) and chosen < self.coverage_chosen_min:
            why = f"chosen's mean coverage {chosen:.2f} is below {self.coverage_chosen_min}"
            return Hit(f"{why} (some rubric item not covered)", f"chosen {chosen:.2f}")
        if is_number(rejected) and rejected > self.coverage_rejected_max:
            why = f"rejected's mean coverage of its targeted items {rejected:.2f} is above"
            return Hit(f"{why} {self.coverage_rejected_max}", f"rejected {rejected:.2f}")
        return None


def _prefs(row: RowView, col: str) -> Any:
    """A row's preference per A/B order in ``col``, or SKIP when it has none."""
    prefs = row.row.get(col)
    has = isinstance(prefs, Mapping) and any(prefs.get(o) is not None for o in ORDERS)
    return prefs if has else SKIP


@RULES.register("pairwise_consistency")
class PairwiseConsistency(PairRule):
    """the rubric-aware judge does not prefer the chosen in both orders, or the rubric-blind
    judge prefers it in both

    position-consistent preference is the signal; a blind preference means the pair leaks"""

    position, reads_verdicts = 120, True

    @staticmethod
    def disagrees(prefs: Mapping[str, Any]) -> Hit | None:
        ab, ba = (prefs.get(o) for o in ORDERS)
        both = [ab, ba] == ["chosen", "chosen"]
        return None if both else Hit(f"rubric-aware verdicts AB/BA: {ab}/{ba}", f"{ab}/{ba}")

    @staticmethod
    def leaks(prefs: Mapping[str, Any]) -> Hit | None:
        if [prefs.get(o) for o in ORDERS] == ["chosen", "chosen"]:
            return Hit("rubric-blind judge prefers the chosen in both orders (leakage)", "")
        return None

    def check(self, pair: PairView) -> Verdict | Skip:
        # the rubric-aware verdicts decide first: asked alone, they can drop a pair
        if "pairwise_aware" in pair.pending:
            return SKIP
        if hit := self.disagrees(prefers(pair.pairwise, "pairwise_aware")):
            return False, hit.detail
        if "pairwise_blind" in pair.pending:
            return SKIP
        hit = self.leaks(prefers(pair.pairwise, "pairwise_blind"))
        return (False, hit.detail) if hit else KEEP

    @audit("blind_leak", "Rubric-blind leak", needs=("pairwise_blind",))
    def blind_leak(self, row: RowView) -> Found:
        """the rubric-blind judge prefers the chosen in both A/B orders"""
        prefs = _prefs(row, "pairwise_blind")
        return prefs if prefs is SKIP else self.leaks(prefs)

    @audit("aware_disagrees", "Rubric-aware judge disagrees", needs=("pairwise_aware",))
    def aware_disagrees(self, row: RowView) -> Found:
        """the rubric-aware judge does not prefer the chosen in both A/B orders"""
        prefs = _prefs(row, "pairwise_aware")
        return prefs if prefs is SKIP else self.disagrees(prefs)


@RULES.register("judge_parse")
class JudgeParse(PairRule):
    """any judgment of the pair did not parse after its re-asks

    an unparsed verdict cannot be trusted either way"""

    position, reads_verdicts, asked_only = 10, True, True

    def check(self, pair: PairView) -> Verdict:
        for kind in ("quality", "coverage"):
            for side in ("chosen", "rejected"):
                j = getattr(pair, f"{kind}_{side}")
                # a candidate the judge did not ask about, since a text rule drops it
                if not (j and j.get("skipped")) and not _judged(j):
                    return False, f"{kind} of {side} did not parse"
        for kind in ("pairwise_aware", "pairwise_blind"):
            for order in ORDERS if kind not in pair.pending else ():
                if not _judged(pair.pairwise.get(kind, {}).get(order)):
                    return False, f"{kind} {order} did not parse"
        return KEEP
