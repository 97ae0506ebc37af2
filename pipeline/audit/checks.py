"""The audit's checks: the catalogue of check codes and the pass over a whole set.

The rules themselves (what counts as empty, over the cap, a refusal, meta-text, a gap...)
are in ``pipeline/rules/``, shared with the pair stage's filters; this module decides
which rule applies to a row of a pairs file and records a flag per (row, check, side).
The set-level checks (exact duplicate rows, near-duplicates within a user) are in
:func:`check_set` and ``pipeline/dedup.py``.

Every code is listed in :data:`CHECKS` and documented in ``docs/audit.md``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

from pipeline.fields import DIMENSIONS, ORDERS, SIDES, words
from pipeline.registry import Registry
from pipeline.rules import Hit, Rules


class RowView:
    """One row of a pairs file as the checks read it: each answer's text, and what the
    caller computed already (word counts, similarity, words), computed here otherwise."""

    def __init__(
        self,
        r: Mapping[str, Any],
        n_words: tuple[int, int] | None = None,
        similarity: float | None = None,
        tokens: tuple[Sequence[str], Sequence[str]] | None = None,
    ) -> None:
        self.row = r
        self.texts = {"chosen": r["chosen"], "rejected": r["rejected"]}
        self.similarity = similarity
        self._n_words = dict(zip(SIDES, n_words, strict=True)) if n_words is not None else {}
        self._tokens = dict(zip(SIDES, tokens, strict=True)) if tokens is not None else {}
        self._words: dict[str, set[str]] = {}
        self.aspects = _aspects(r)

    def n_words(self, side: str) -> int | None:
        return self._n_words.get(side)

    def words(self, side: str) -> set[str]:
        got = self._words.get(side)
        if got is None:
            toks = self._tokens.get(side)
            got = self._words[side] = set(toks if toks is not None else words(self.texts[side]))
        return got


# a rule on one answer (given its side), or on the whole row
SideRule = Callable[[Rules, RowView, str], "Hit | None"]
RowRule = Callable[[Rules, RowView], "Hit | None"]


class Check(NamedTuple):
    code: str
    label: str  # a human title for tables and plots
    kind: str  # "text" (the answers alone), "judge" (judge columns), "set" (across rows)
    meaning: str
    filter: str | None  # the pair-stage filter that applies the same rule, if any
    # how :func:`check_row` runs it: on each answer with visible text (``side``), or once
    # on the row (``row``; a "text" one only when both answers have visible text). A "set"
    # check has neither: :func:`check_set` runs it across rows.
    side: SideRule | None = None
    row: RowRule | None = None
    # another check of the row that, when it fires, makes this one moot
    unless: str | None = None


def _cut_off(rules: Rules, row: RowView, side: str) -> Hit | None:
    finish = row.row.get("finish_reasons")
    if isinstance(finish, Mapping) and finish.get(side) == "length":
        return Hit(CUT_OFF, "finish_reason length")
    return None


def _quality(rule: str) -> RowRule:
    """The :class:`Rules` method ``rule`` on both answers' rubric-blind scores, where the
    row has them."""

    def run(rules: Rules, row: RowView) -> Hit | None:
        qc, qr = row.row.get("quality_chosen"), row.row.get("quality_rejected")
        has = [
            isinstance(q, Mapping) and any(q.get(d) is not None for d in DIMENSIONS)
            for q in (qc, qr)
        ]
        return getattr(rules, rule)(qc, qr) if all(has) else None

    return run


def _coverage(rules: Rules, row: RowView) -> Hit | None:
    r = row.row
    rej = r.get("coverage_rejected_violated_mean")
    if rej is None:
        rej = r.get("coverage_rejected_mean")
    if r.get("coverage_chosen_mean") is None and rej is None:
        return None
    return rules.coverage_means(r.get("coverage_chosen_mean"), rej)


def _pairwise(col: str, rule: str) -> RowRule:
    """The :class:`Rules` method ``rule`` on one pairwise judge's preferences per A/B
    order (column ``col``), where the row has them."""

    def run(rules: Rules, row: RowView) -> Hit | None:
        prefs = row.row.get(col)
        if isinstance(prefs, Mapping) and any(prefs.get(o) is not None for o in ORDERS):
            return getattr(rules, rule)(prefs)
        return None

    return run


# the catalogue: one registry entry per check, in report order
CHECKS: Registry[Check] = Registry("audit check", Check, name_attr="code", instances=True)
for _check in (
    Check(
        "empty",
        "Empty answer",
        "text",
        "an answer is empty or whitespace only",
        "empty",
        side=lambda rules, row, side: rules.empty(row.texts[side]),
    ),
    Check(
        "identical",
        "Identical answers",
        "text",
        "chosen and rejected are the same text (ignoring case and spacing)",
        "similarity",
        row=lambda rules, row: rules.identical(row.texts["chosen"], row.texts["rejected"]),
    ),
    Check(
        "near_identical",
        "Near-identical answers",
        "text",
        "word-level similarity of chosen and rejected above pairs.similarity_max",
        "similarity",
        row=lambda rules, row: rules.near_identical(
            row.texts["chosen"], row.texts["rejected"], row.similarity
        ),
        unless="identical",
    ),
    Check(
        "over_cap",
        "Over the word cap",
        "text",
        "an answer has more words than the cap times (1 + pairs.length_slack)",
        "length",
        side=lambda rules, row, side: rules.over_cap(row.texts[side], row.n_words(side)),
    ),
    Check(
        "refusal",
        "Refusal",
        "text",
        "an answer refuses (pairs.refusal_patterns)",
        "refusal",
        side=lambda rules, row, side: rules.refusal(row.texts[side], row.words(side)),
    ),
    Check(
        "meta_text",
        "Meta-text",
        "text",
        "an answer talks about its brief: instructions, rubric, aspects, word limits "
        "(pairs.meta_patterns)",
        "meta_text",
        side=lambda rules, row, side: rules.meta_text(row.texts[side], row.words(side)),
    ),
    Check(
        "truncated_text",
        "Ends mid-sentence",
        "text",
        "an answer stops mid-sentence: no closing punctuation, or a trailing comma, "
        "colon or function word",
        "truncated_text",
        side=lambda rules, row, side: rules.truncated_text(row.texts[side]),
    ),
    Check(
        "cut_off",
        "Cut off at max_tokens",
        "text",
        "an answer stopped on the token limit (finish_reason length; needs the "
        "finish_reasons column)",
        "truncated",
        side=_cut_off,
    ),
    Check(
        "rubric_echo",
        "Rubric echo",
        "text",
        "an answer copies a rubric aspect verbatim or nearly (needs rubric_aspects)",
        "rubric_echo",
        side=lambda rules, row, side: (
            rules.rubric_echo(row.texts[side], row.aspects, row.words(side))
            if row.aspects
            else None
        ),
    ),
    Check(
        "duplicate_row",
        "Duplicate row",
        "set",
        "same user, same question, same chosen and rejected as an earlier row",
        None,
    ),
    Check(
        "near_duplicate",
        "Near-duplicate",
        "set",
        "the question near-duplicates an earlier one of the same user, an answer "
        "near-duplicates one of the same user's, or both answers repeat another user's pair",
        "near_duplicate",
    ),
    Check(
        "quality_floor",
        "Below the quality floor",
        "judge",
        "the rubric-blind judge scores an answer below pairs.quality_floor",
        "quality_floor",
        row=_quality("below_floor"),
    ),
    Check(
        "quality_gap",
        "Quality gap",
        "judge",
        "the rubric-blind scores differ by more than pairs.quality_gap_max",
        "quality_gap",
        row=_quality("quality_gap"),
    ),
    Check(
        "coverage",
        "Coverage off",
        "judge",
        "the chosen's mean coverage is below pairs.coverage_chosen_min, or the "
        "rejected's (of its violated items) above pairs.coverage_rejected_max",
        "coverage",
        row=_coverage,
    ),
    Check(
        "blind_leak",
        "Rubric-blind leak",
        "judge",
        "the rubric-blind judge prefers the chosen in both A/B orders",
        "pairwise_consistency",
        row=_pairwise("pairwise_blind", "blind_leak"),
    ),
    Check(
        "aware_disagrees",
        "Rubric-aware judge disagrees",
        "judge",
        "the rubric-aware judge does not prefer the chosen in both A/B orders",
        "pairwise_consistency",
        row=_pairwise("pairwise_aware", "aware_disagrees"),
    ),
):
    CHECKS.register(_check.code, _check)
# the check an answer must pass for its other checks to run (there is nothing to check)
GATE = "empty"
CUT_OFF = "stopped at max_tokens (finish_reason length): not a finished answer"
# Not a per-pair check, but a gate `--fail-on` accepts: the shortcut probe does not clear the
# set (it flagged, or the set is too small to clear).
PROBE_GATE = "shortcut_probe"


# ---- the audit's pass over a whole set --------------------------------------------------


def _aspects(row: Mapping[str, Any]) -> list[str]:
    out = []
    for a in row.get("rubric_aspects") or ():
        if isinstance(a, Mapping) and isinstance(a.get("aspect"), str):
            out.append(a["aspect"])
    return out


def profile_text(row: Mapping[str, Any]) -> str | None:
    """The user's profile posts joined with newlines (None when the row has none)."""
    from pipeline.dedup import profile_text as joined  # numpy: only when the audit runs

    return joined(row.get("profile"))


def _user_key(row: Mapping[str, Any]) -> str:
    uid = row.get("user_id")
    if uid is not None and uid != "":
        return f"u:{uid}"
    prof = profile_text(row)
    if prof:
        return "p:" + hashlib.blake2b(prof.encode(), digest_size=12).hexdigest()
    return "?"


def _flag(
    flags: list[dict[str, Any]],
    ids: Sequence[str],
    cats: Sequence[str | None],
    i: int,
    code: str,
    hit: Hit,
    side: str | None = None,
) -> None:
    detail = f"{side} answer {hit.detail}" if side else hit.detail
    flags.append(
        {
            "id": ids[i],
            "row": i,
            "check": code,
            "side": side,
            "category": cats[i],
            "detail": detail,
            "excerpt": hit.excerpt,
        }
    )


def run_checks(
    rows: Sequence[Mapping[str, Any]],
    rules: Rules,
    *,
    ids: Sequence[str],
    timings: dict[str, float] | None = None,
) -> list[dict[str, Any]]:
    """Every check on every row; one flag per (row, check, side) that fires.

    ``ids`` name the rows in the flags (the source's ``id``). Judge checks run only on
    rows that carry the judge columns they need. (The audit itself calls
    :func:`check_row` from its own pass over the rows, then :func:`check_set`.)
    """
    import time

    clock = time.perf_counter()
    cats = categories(rows)
    flags: list[dict[str, Any]] = []
    for i, r in enumerate(rows):
        check_row(flags, i, r, rules, ids, cats)
    if timings is not None:
        timings["checks_rows_s"] = round(time.perf_counter() - clock, 3)
    check_set(flags, rows, rules, ids, cats, timings)
    return flags


def categories(rows: Sequence[Mapping[str, Any]]) -> list[str | None]:
    return [None if r.get("category") is None else str(r.get("category")) for r in rows]


def check_row(
    flags: list[dict[str, Any]],
    i: int,
    r: Mapping[str, Any],
    rules: Rules,
    ids: Sequence[str],
    cats: Sequence[str | None],
    n_words: tuple[int, int] | None = None,
    similarity: float | None = None,
    tokens: tuple[Sequence[str], Sequence[str]] | None = None,
) -> None:
    """The catalogue's checks of one row (:data:`CHECKS`), appended to ``flags``.
    ``n_words``, ``similarity`` and ``tokens`` (each answer's ``words()``) pass what the
    caller computed already, so no text is split twice.

    An answer without visible text gets the ``empty`` flag and no other check of its own;
    the checks on both answers' text run only when both have visible text."""
    row = RowView(r, n_words, similarity, tokens)
    gate = CHECKS[GATE]
    fired: set[str] = set()
    live = 0
    for side in SIDES:
        # the gate first: an answer without visible text gets no other check of its own
        if gate.side is not None and (hit := gate.side(rules, row, side)):
            _flag(flags, ids, cats, i, GATE, hit, side)
            fired.add(GATE)
            continue
        live += 1
        for check in CHECKS.values():
            if check.side is None or check is gate:
                continue
            if hit := check.side(rules, row, side):
                _flag(flags, ids, cats, i, check.code, hit, side)
                fired.add(check.code)
    # in catalogue order, so a check another one defers to (``unless``) has run first
    for check in CHECKS.values():
        if check.row is None or check.unless in fired:
            continue
        if check.kind == "text" and live < len(SIDES):
            continue
        if hit := check.row(rules, row):
            _flag(flags, ids, cats, i, check.code, hit)
            fired.add(check.code)


def check_set(
    flags: list[dict[str, Any]],
    rows: Sequence[Mapping[str, Any]],
    rules: Rules,
    ids: Sequence[str],
    cats: Sequence[str | None],
    timings: dict[str, float] | None = None,
) -> None:
    """The checks across rows (exact duplicates, near-duplicates within a user), appended
    to ``flags``, which are then sorted by row and check."""
    import time

    from pipeline.dedup import personal_duplicates

    clock = time.perf_counter()
    # exact duplicate rows: same user, question and answers as an earlier row
    seen: dict[bytes, int] = {}
    for i, r in enumerate(rows):
        norm = (" ".join(str(r[c]).split()) for c in ("question", "chosen", "rejected"))
        key = "\x00".join([_user_key(r), *norm])
        digest = hashlib.blake2b(key.encode(), digest_size=16).digest()
        first = seen.setdefault(digest, i)
        if first != i:
            _flag(
                flags,
                ids,
                cats,
                i,
                "duplicate_row",
                Hit(f"repeats row {ids[first]} (same user, question and answers)", ids[first]),
            )
    dup_rows = {f["row"] for f in flags if f["check"] == "duplicate_row"}

    # near-duplicates within a user; exact duplicates are already flagged above
    # the rows themselves, not copies: profiles are joined only for the few rows whose
    # question or answers have a near-duplicate
    keep = [i for i in range(len(rows)) if i not in dup_rows]
    dups = personal_duplicates(
        [rows[i] for i in keep],
        question_threshold=rules.dedup_question_threshold,
        answer_threshold=rules.dedup_answer_threshold,
        profile_threshold=rules.dedup_profile_threshold,
        keys=[f"{i:09d}" for i in keep],
    )
    for key, d in sorted(dups.items()):
        i, kept = int(key), int(d.kept)
        _flag(flags, ids, cats, i, "near_duplicate", Hit(d.describe(ids[kept]), ids[kept]))
    if timings is not None:
        timings["checks_set_s"] = round(time.perf_counter() - clock, 3)
    order = {code: i for i, code in enumerate(CHECKS)}
    flags.sort(key=lambda f: (f["row"], order[f["check"]], f["side"] or ""))
