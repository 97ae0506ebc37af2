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
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from pipeline.fields import DIMENSIONS, ORDERS, SIDES, words
from pipeline.rules import Hit, Rules


class Check(NamedTuple):
    code: str
    label: str  # a human title for tables and plots
    kind: str  # "text" (the answers alone), "judge" (judge columns), "set" (across rows)
    meaning: str
    filter: str | None  # the pair-stage filter that applies the same rule, if any


CHECKS: dict[str, Check] = {
    c.code: c
    for c in (
        Check("empty", "Empty answer", "text", "an answer is empty or whitespace only", "empty"),
        Check(
            "identical",
            "Identical answers",
            "text",
            "chosen and rejected are the same text (ignoring case and spacing)",
            "similarity",
        ),
        Check(
            "near_identical",
            "Near-identical answers",
            "text",
            "word-level similarity of chosen and rejected above pairs.similarity_max",
            "similarity",
        ),
        Check(
            "over_cap",
            "Over the word cap",
            "text",
            "an answer has more words than the cap times (1 + pairs.length_slack)",
            "length",
        ),
        Check(
            "refusal", "Refusal", "text", "an answer refuses (pairs.refusal_patterns)", "refusal"
        ),
        Check(
            "meta_text",
            "Meta-text",
            "text",
            "an answer talks about its brief: instructions, rubric, aspects, word limits "
            "(pairs.meta_patterns)",
            "meta_text",
        ),
        Check(
            "truncated_text",
            "Ends mid-sentence",
            "text",
            "an answer stops mid-sentence: no closing punctuation, or a trailing comma, "
            "colon or function word",
            "truncated_text",
        ),
        Check(
            "cut_off",
            "Cut off at max_tokens",
            "text",
            "an answer stopped on the token limit (finish_reason length; needs the "
            "finish_reasons column)",
            "truncated",
        ),
        Check(
            "rubric_echo",
            "Rubric echo",
            "text",
            "an answer copies a rubric aspect verbatim or nearly (needs rubric_aspects)",
            "rubric_echo",
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
        ),
        Check(
            "quality_gap",
            "Quality gap",
            "judge",
            "the rubric-blind scores differ by more than pairs.quality_gap_max",
            "quality_gap",
        ),
        Check(
            "coverage",
            "Coverage off",
            "judge",
            "the chosen's mean coverage is below pairs.coverage_chosen_min, or the "
            "rejected's (of its violated items) above pairs.coverage_rejected_max",
            "coverage",
        ),
        Check(
            "blind_leak",
            "Rubric-blind leak",
            "judge",
            "the rubric-blind judge prefers the chosen in both A/B orders",
            "pairwise_consistency",
        ),
        Check(
            "aware_disagrees",
            "Rubric-aware judge disagrees",
            "judge",
            "the rubric-aware judge does not prefer the chosen in both A/B orders",
            "pairwise_consistency",
        ),
    )
}
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
    """The checks of one row, appended to ``flags``. ``n_words``, ``similarity`` and
    ``tokens`` (each answer's ``words()``) pass what the caller computed already, so no
    text is split twice."""
    texts = {"chosen": r["chosen"], "rejected": r["rejected"]}
    aspects = _aspects(r)
    finish = r.get("finish_reasons")
    live = []
    for k, side in enumerate(SIDES):
        t = texts[side]
        hit = rules.empty(t)
        if hit:
            _flag(flags, ids, cats, i, "empty", hit, side)
            continue
        live.append(side)
        wc = n_words[k] if n_words is not None else None
        toks = set(tokens[k]) if tokens is not None else set(words(t))
        if isinstance(finish, Mapping) and finish.get(side) == "length":
            _flag(flags, ids, cats, i, "cut_off", Hit(CUT_OFF, "finish_reason length"), side)
        for code, h in (
            ("over_cap", rules.over_cap(t, wc)),
            ("refusal", rules.refusal(t, toks)),
            ("meta_text", rules.meta_text(t, toks)),
            ("truncated_text", rules.truncated_text(t)),
            ("rubric_echo", rules.rubric_echo(t, aspects, toks) if aspects else None),
        ):
            if h:
                _flag(flags, ids, cats, i, code, h, side)
    if len(live) == 2:
        hit = rules.identical(texts["chosen"], texts["rejected"])
        if hit:
            _flag(flags, ids, cats, i, "identical", hit)
        else:
            hit = rules.near_identical(texts["chosen"], texts["rejected"], similarity)
            if hit:
                _flag(flags, ids, cats, i, "near_identical", hit)
    _judge_checks(flags, ids, cats, i, r, rules)


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
    flags.sort(key=lambda f: (f["row"], list(CHECKS).index(f["check"]), f["side"] or ""))


def _judge_checks(
    flags: list[dict[str, Any]],
    ids: Sequence[str],
    cats: Sequence[str | None],
    i: int,
    r: Mapping[str, Any],
    rules: Rules,
) -> None:
    qc, qr = r.get("quality_chosen"), r.get("quality_rejected")
    has_q = [
        isinstance(q, Mapping) and any(q.get(d) is not None for d in DIMENSIONS) for q in (qc, qr)
    ]
    if all(has_q):
        for code, h in (
            ("quality_floor", rules.below_floor(qc, qr)),
            ("quality_gap", rules.quality_gap(qc, qr)),
        ):
            if h:
                _flag(flags, ids, cats, i, code, h)
    rej = r.get("coverage_rejected_violated_mean")
    if rej is None:
        rej = r.get("coverage_rejected_mean")
    if r.get("coverage_chosen_mean") is not None or rej is not None:
        h = rules.coverage_means(r.get("coverage_chosen_mean"), rej)
        if h:
            _flag(flags, ids, cats, i, "coverage", h)
    for col, code, rule in (
        ("pairwise_aware", "aware_disagrees", rules.aware_disagrees),
        ("pairwise_blind", "blind_leak", rules.blind_leak),
    ):
        prefs = r.get(col)
        if isinstance(prefs, Mapping) and any(prefs.get(o) is not None for o in ORDERS):
            h = rule(prefs)
            if h:
                _flag(flags, ids, cats, i, code, h)
