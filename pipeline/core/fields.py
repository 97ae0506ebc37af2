"""One definition of the judge dimensions, the shared row fields and the word-count rule.

The pair filters, the audit's checks, the published figures and the response stage all
count words and name judge dimensions through this module, so a length the audit reports
is the length the filter judged.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Mapping
from typing import Any

# Rubric-blind quality dimensions the judge scores 1-5, in the order they are asked.
DIMENSIONS: tuple[str, ...] = ("correctness", "relevance", "helpfulness")
QUALITY_MIN, QUALITY_MAX = 1, 5
# Rubric-aware coverage of one rubric item: 0 missed, 1 partly, 2 covered.
COVERAGE_MIN, COVERAGE_MAX = 0, 2
# Pairwise verdicts are asked in both A/B orders; each says which side it preferred.
ORDERS: tuple[str, ...] = ("AB", "BA")
PREFERENCES: tuple[str, ...] = ("chosen", "rejected", "tie")

# A word is a run of letters, digits, underscores or apostrophes ("don't" is one word,
# "well-known" two). Punctuation and markdown marks are not words.
WORD_RE = re.compile(r"[\w']+")

# ---- row fields -------------------------------------------------------------------------
# The release's columns (their names, types, groups and checks) are one table in
# pipeline/release/columns.py; here only what rows of every kind share.

# Ids, most specific first: the reference's `id` (the source example), then ours.
ID_COLUMNS: tuple[str, ...] = ("id", "pair_id", "example_id")
SIDES: tuple[str, ...] = ("chosen", "rejected")


def words(text: str) -> list[str]:
    """The lower-cased words of ``text`` under the project's one word rule."""
    return WORD_RE.findall(text.lower())


def count_words(text: str) -> int:
    """How many words ``text`` has under the project's one word rule."""
    return len(WORD_RE.findall(text))


def words_and_count(text: str) -> tuple[list[str], int]:
    """``(words(text), count_words(text))`` with one split where that is exact: for ASCII
    text lower-casing moves no word boundary, so the count is the number of words."""
    ws = words(text)
    return ws, (len(ws) if text.isascii() else count_words(text))


def word_cap_limit(word_cap: int, slack: float) -> float:
    """The most words an answer may have: the stated cap plus the pair stage's slack
    (models overshoot a stated cap slightly)."""
    return word_cap * (1 + slack)


# Characters that draw nothing but are letters or symbols by category, so the category
# test below misses them: Unicode's Default_Ignorable_Code_Point set (combining grapheme
# joiner, Hangul fillers, Mongolian and variation selectors, tag characters...) and the
# blank Braille pattern. NFKC keeps them all.
_INVISIBLE_RE = re.compile(
    "[\u034f\u115f\u1160\u17b4\u17b5\u180b-\u180f\u2800\u3164\ufe00-\ufe0f"
    "\uffa0\ufff0-\ufff8\U0001bca0-\U0001bca3\U0001d173-\U0001d17a"
    "\U000e0000-\U000e0fff]"
)
# Control (Cc), format (Cf: zero-width space, word joiner, BOM, bidi marks), surrogate
# (Cs), unassigned (Cn) and separator (Z*) characters show nothing on their own.
_INVISIBLE_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Cn", "Zs", "Zl", "Zp"})


def visible_text(text: str) -> str:
    """What a reader sees of ``text``: NFKC-normalised, with control, format, zero-width
    and other invisible characters removed and whitespace runs made one space, stripped.
    Empty when ``text`` shows nothing (only U+200B, NULs, blanks...): the one test of a
    required text field being empty."""
    if text.isascii() and text.isprintable():  # the common case, without normalising
        return " ".join(text.split())
    out = []
    for ch in _INVISIBLE_RE.sub("", unicodedata.normalize("NFKC", text)):
        if ch.isspace():
            out.append(" ")
        elif unicodedata.category(ch) not in _INVISIBLE_CATEGORIES:
            out.append(ch)
    return " ".join("".join(out).split())


def row_id(row: Mapping[str, Any], fallback: str | None = None) -> str | None:
    """The id a person would look a row up by: ``id``, else ``pair_id``, else
    ``example_id``, else ``fallback``."""
    for col in ID_COLUMNS:
        v = row.get(col)
        if v is not None and v != "":
            return str(v)
    return fallback


def quality_scores(q: Mapping[str, Any] | None) -> dict[str, Any]:
    """The three dimension scores of one quality judgment (missing ones are None)."""
    q = q or {}
    return {d: q.get(d) for d in DIMENSIONS}


def largest_quality_gap(qc: Mapping[str, Any], qr: Mapping[str, Any]) -> tuple[str, float] | None:
    """The dimension where the two judgments differ most and by how much; None when no
    dimension has both scores."""
    gaps = {
        d: abs(qc[d] - qr[d]) for d in DIMENSIONS if qc.get(d) is not None and qr.get(d) is not None
    }
    if not gaps:
        return None
    worst = max(gaps, key=lambda d: gaps[d])  # ties: the first in DIMENSIONS order
    return worst, gaps[worst]


def is_number(v: Any) -> bool:
    """An int or float that is not a bool (JSON true is not a score)."""
    return isinstance(v, int | float) and not isinstance(v, bool)


def show(x: Any) -> str:
    """A figure as cards and summaries print it: three decimals for floats, n/a for none."""
    if x is None:
        return "n/a"
    if isinstance(x, float):
        return f"{x:.3f}"
    return str(x)


def show_ci(ci: Any) -> str:
    """A 95% interval as reports print it: ``[0.612, 0.734]``, n/a for none."""
    if not ci or len(ci) != 2 or not all(is_number(x) for x in ci):
        return "n/a"
    return f"[{ci[0]:.3f}, {ci[1]:.3f}]"


def show_cell(v: Any, percent: bool = False) -> str:
    """A figure in a report's table: four significant digits for floats (a share as a
    percentage with ``percent``), thousands separators for counts, yes/no, n/a for none."""
    if v is None:
        return "n/a"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if percent and isinstance(v, int | float):
        return f"{v * 100:.1f}%"
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)
