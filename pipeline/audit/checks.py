"""The audit's pass over a whole set: every rule's audit checks (``pipeline/rules/``, the
same classes the pair stage filters with) on each row, then across rows, one flag per
(row, check, side) that fires, and which checks ran (a check that skipped every row, for
want of its columns, did not)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pipeline.core.fields import SIDES
from pipeline.rules import SKIP, Hit, RowView, RuleSet, audit_checks

# the check an answer must pass for its other checks to run (there is nothing to check)
GATE = "empty"
# Not a per-pair check, but a gate `--fail-on` accepts: the shortcut probe does not clear the
# set (it flagged, or the set is too small to clear).
PROBE_GATE = "shortcut_probe"


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


def categories(rows: Sequence[Mapping[str, Any]]) -> list[str | None]:
    return [None if r.get("category") is None else str(r.get("category")) for r in rows]


def check_row(
    flags: list[dict[str, Any]],
    i: int,
    r: Mapping[str, Any],
    rules: RuleSet,
    ids: Sequence[str],
    cats: Sequence[str | None],
    n_words: tuple[int, int] | None = None,
    similarity: float | None = None,
    tokens: tuple[Sequence[str], Sequence[str]] | None = None,
    ran: set[str] | None = None,
) -> None:
    """Every rule's checks of one row, appended to ``flags``; the codes of those that read
    the row (did not skip it) added to ``ran``. ``n_words``, ``similarity`` and ``tokens``
    (each answer's ``words()``) pass what the caller computed already.

    An answer without visible text gets the ``empty`` flag and no other check of its own;
    the checks on both answers' text run only when both have visible text."""
    row = RowView(r, n_words, similarity, tokens)
    ran = set() if ran is None else ran
    checks = [(c, run) for c, run in rules.checks() if c.per != "set"]
    gate = next(run for c, run in checks if c.code == GATE)
    fired: set[str] = set()
    live = 0
    for side in SIDES:
        answer = row.answers[side]
        # the gate first: an answer without visible text gets no other check of its own
        ran.add(GATE)
        hit = gate(answer)
        if isinstance(hit, Hit):
            _flag(flags, ids, cats, i, GATE, hit, side)
            fired.add(GATE)
            continue
        live += 1
        for check, run in checks:
            if check.per == "answer" and check.code != GATE:
                _found(flags, ids, cats, i, check.code, run(answer), fired, ran, side)
    # in report order, so a check another one defers to (``unless``) has run first
    for check, run in checks:
        if check.per != "row" or check.unless in fired:
            continue
        if check.kind == "text" and live < len(SIDES):
            continue
        _found(flags, ids, cats, i, check.code, run(row), fired, ran)


def _found(
    flags: list[dict[str, Any]],
    ids: Sequence[str],
    cats: Sequence[str | None],
    i: int,
    code: str,
    found: Any,
    fired: set[str],
    ran: set[str],
    side: str | None = None,
) -> None:
    if found is SKIP:
        return
    ran.add(code)
    if isinstance(found, Hit):
        _flag(flags, ids, cats, i, code, found, side)
        fired.add(code)


def check_set(
    flags: list[dict[str, Any]],
    rows: Sequence[Mapping[str, Any]],
    rules: RuleSet,
    ids: Sequence[str],
    cats: Sequence[str | None],
    timings: dict[str, float] | None = None,
    ran: set[str] | None = None,
) -> None:
    """The checks across rows (exact duplicates, near-duplicates within a user), appended
    to ``flags``, which are then sorted by row and check; a row flagged by a check another
    one defers to (``unless``) is left out of that one."""
    import time

    clock = time.perf_counter()
    for check, run in rules.checks():
        if check.per != "set":
            continue
        skip = {f["row"] for f in flags if f["check"] == check.unless}
        for i, hit in run(rows, ids, skip):
            _flag(flags, ids, cats, i, check.code, hit)
        if ran is not None:
            ran.add(check.code)
    if timings is not None:
        timings["checks_set_s"] = round(time.perf_counter() - clock, 3)
    order = {code: i for i, code in enumerate(audit_checks())}
    flags.sort(key=lambda f: (f["row"], order[f["check"]], f["side"] or ""))
