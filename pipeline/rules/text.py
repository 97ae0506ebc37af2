"""What the rules say about a text: a :class:`Hit` (a sentence quoting the offending
words), an answer cut off mid-sentence, and the word-level similarity of two answers."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import NamedTuple

from rapidfuzz import fuzz
from rapidfuzz.utils import default_process

from pipeline.core.fields import visible_text, words


class Hit(NamedTuple):
    detail: str  # a sentence, quoting the offending words
    excerpt: str  # the offending words alone, for tables


def quote(text: str, limit: int = 80) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def tail(text: str, limit: int = 60) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else "…" + text[-(limit - 1) :]


# ---- truncation from text alone -----------------------------------------------------------

_TERMINAL = ".!?…。！？"
# Closing quotes and emphasis marks that may follow the final full stop.
_TRAILING_MARKS = "\"'”’»*_`~ \t\r\n"
# an open bracket or brace is never a sentence's end ('{"aspects": [' is a cut JSON answer)
_DANGLING_PUNCT = ",;:-–—/(&+[{"
# A sentence does not end on these words; an answer that does was cut off.
_DANGLING_WORDS = frozenset(
    "a an the and or but nor so yet to of in on at by for from with without into onto "
    "about as than that which who whose whom when while if because although though "
    "your my our their his her its this these those is are was were be been will would "
    "can could should may might must such like very more most also then".split()
)
_LIST_LINE_RE = re.compile(r"^\s*(?:[-*+•]|\d+[.)])\s+")
_HEADER_LINE_RE = re.compile(r"^\s{0,3}#{1,6}\s")


def ends_mid_sentence(text: str) -> Hit | None:
    """The answer stops where no sentence ends. Lists, headings and tables often end
    without a full stop, so a final line of that kind needs a dangling word or mark to
    count; prose needs only the missing closing punctuation."""
    core = text.rstrip().rstrip(_TRAILING_MARKS)
    if not core:
        return None
    last = core[-1]
    if last in _TERMINAL or last in ")]}":
        return None
    end = tail(text)
    if last in _DANGLING_PUNCT:
        return Hit(f"ends on {last!r}, mid-sentence: {end!r}", end)
    ws = words(core)
    if ws and last.isalnum() and ws[-1] in _DANGLING_WORDS:
        return Hit(f"ends on the word {ws[-1]!r}, mid-sentence: {end!r}", end)
    last_line = core.rsplit("\n", 1)[-1]
    if (
        _LIST_LINE_RE.match(last_line)
        or _HEADER_LINE_RE.match(last_line)
        or last_line.lstrip().startswith("|")
    ):
        return None
    if last.isalnum():
        return Hit(f"ends without closing punctuation: {end!r}", end)
    return None  # an emoji or another symbol: a deliberate ending


def unfinished(text: str, finish_reason: str | None = None) -> str | None:
    """Why a free-text answer is not a finished answer, or None: it stopped on the token
    limit, it has no visible text, or it ends mid-sentence (a server that cut it and said
    "stop"). The runner asks such an answer again once with more tokens; the pair filters
    (``truncated``, ``empty``, ``truncated_text``) drop what is still unfinished."""
    if finish_reason == "length":
        return "cut off at max_tokens (finish_reason length)"
    if not visible_text(text):
        return "no visible text"
    hit = ends_mid_sentence(text)
    return f"it {hit.detail}" if hit else None


def normalise(text: str) -> str:
    """Lower case, every non-alphanumeric character a space, single spaces (rapidfuzz's
    default_process): what the similarity rules compare."""
    return " ".join(default_process(text).split())


def word_similarity(a: str, b: str) -> float:
    """Word-level Indel similarity (0-100): rapidfuzz over word lists, not characters, so
    two unrelated English texts score low instead of ~50."""
    return token_similarity(words(a), words(b))


def token_similarity(a: Sequence[str], b: Sequence[str]) -> float:
    """:func:`word_similarity` of two texts already split by ``pipeline.core.fields.words``."""
    return float(fuzz.ratio(a, b))
