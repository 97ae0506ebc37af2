"""Case-insensitive regexes gated by the words they need: :class:`PatternSet`.

Reads the regex parser's internals (``re._parser``) to find, for each pattern, word pieces
one of which every match contains; a text without any of them skips the pattern.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Iterable
from collections.abc import Set as AbstractSet
from typing import Any

from pipeline.core.fields import WORD_RE

# The regex parser moved in Python 3.11 (re._parser); the old names warn when imported.
try:
    _sre_c: Any = importlib.import_module("re._constants")
    _sre_p: Any = importlib.import_module("re._parser")
except ImportError:  # pragma: no cover - Python 3.10
    _sre_c = importlib.import_module("sre_constants")
    _sre_p = importlib.import_module("sre_parse")

_PIECE_RE = WORD_RE  # gate pieces are words under the project's one word rule
# Words too common to gate on: a pattern gated by one of these would run on most texts.
_COMMON = frozenset(
    "a an the as of to in on at by for with and or is it its this that your you me my i "
    "be are was not do so if from what here all any each every".split()
)


def _strength(key: str) -> int:
    """How selective a gate key is: '=word' (the whole word) beats '~piece' (inside a word)
    of the same length; the commonest words are worth almost nothing."""
    word = key[1:]
    if key[0] == "=":
        return 1 if word in _COMMON else len(word) + 3
    return len(word)


def _run_keys(run: str, bounded_before: bool, bounded_after: bool) -> list[str]:
    """Gate keys of a literal run: each word piece in it, whole ('=') where the literal
    itself, or a \\b next to it, shows where the word starts and ends."""
    keys = []
    for m in _PIECE_RE.finditer(run):
        whole_start = m.start() > 0 or bounded_before
        whole_end = m.end() < len(run) or bounded_after
        keys.append(("=" if whole_start and whole_end else "~") + m.group().lower())
    return keys


def _required(items: Any) -> frozenset[str] | None:
    """Gate keys one of which every match of this parsed sequence satisfies (the most
    selective such set found), or None when the pattern promises none."""
    best: frozenset[str] | None = None
    items = list(items)

    def score(req: frozenset[str]) -> tuple[int, int]:
        return min(_strength(k) for k in req), -len(req)

    def consider(req: frozenset[str] | None) -> None:
        nonlocal best
        if req and (best is None or score(req) > score(best)):
            best = req

    i = 0
    while i < len(items):
        op, av = items[i]
        if op is _sre_c.LITERAL:
            j = i
            while j < len(items) and items[j][0] is _sre_c.LITERAL:
                j += 1
            run = "".join(chr(items[k][1]) for k in range(i, j))
            before = i > 0 and items[i - 1] == (_sre_c.AT, _sre_c.AT_BOUNDARY)
            after = j < len(items) and items[j] == (_sre_c.AT, _sre_c.AT_BOUNDARY)
            for key in _run_keys(run, before, after):  # every piece is required: take one
                consider(frozenset({key}))
            i = j
            continue
        if op is _sre_c.SUBPATTERN:
            consider(_required(av[-1]))
        elif op is _sre_c.BRANCH:
            alts = [_required(a) for a in av[1]]
            if all(alts):
                consider(frozenset().union(*alts))  # type: ignore[arg-type]
        elif op in (_sre_c.MAX_REPEAT, _sre_c.MIN_REPEAT) and av[0] >= 1:
            consider(_required(av[2]))
        i += 1
    return best


def _anchors(pattern: str) -> frozenset[str] | None:
    """Gate keys for a pattern: a text has none of them means it cannot match. None: no
    gate (the pattern always runs)."""
    try:
        return _required(_sre_p.parse(pattern))
    except Exception:  # an exotic construct: no gate, always run
        return None


class PatternSet:
    """Case-insensitive regexes, each gated by the word pieces it needs.

    Python's ``re`` tries every pattern at every position (about 40 microseconds per
    pattern on a 60-word answer here, so 2 ms for the 53 default meta patterns; minutes at
    100,000 pairs). A text's words are looked up once in a cache of which pieces each word
    contains, and only the patterns whose pieces occur are run: usually none.
    """

    def __init__(self, patterns: Iterable[str], what: str) -> None:
        self.patterns: list[re.Pattern[str]] = []
        # per pattern: (whole words, pieces inside words) one of which a text must have;
        # None: no gate
        self.gates: list[tuple[frozenset[str], frozenset[str]] | None] = []
        for p in patterns:
            try:
                self.patterns.append(re.compile(p, re.IGNORECASE | re.MULTILINE))
            except re.error as exc:
                # config validation catches this at load time; a hand-built rule may not
                raise ValueError(f"{what}: invalid regex {p!r}: {exc}") from None
            keys = _anchors(p)
            self.gates.append(
                None
                if keys is None
                else (
                    frozenset(k[1:] for k in keys if k[0] == "="),
                    frozenset(k[1:] for k in keys if k[0] == "~"),
                )
            )
        # key -> the patterns it opens; patterns without a gate always run
        self._by_word: dict[str, list[int]] = {}
        self._by_piece: dict[str, list[int]] = {}
        self._always = [k for k, g in enumerate(self.gates) if g is None]
        for k, g in enumerate(self.gates):
            if g is not None:
                for w in g[0]:
                    self._by_word.setdefault(w, []).append(k)
                for piece in g[1]:
                    self._by_piece.setdefault(piece, []).append(k)
        self._words = frozenset(self._by_word)
        self._pieces = sorted(self._by_piece)
        self._word_cache: dict[str, tuple[int, ...]] = {}

    def _candidates(self, tokens: AbstractSet[str]) -> list[int]:
        """Indices of the patterns this text's words open, in pattern order. Which
        patterns a word opens through the pieces inside it is cached per distinct word."""
        cache = self._word_cache
        if self._pieces:
            for w in [t for t in tokens if t not in cache]:
                if len(cache) >= 1_000_000:  # one entry per distinct word, bounded
                    cache.clear()
                cache[w] = tuple(
                    k for piece in self._pieces if piece in w for k in self._by_piece[piece]
                )
            opened = set().union(*filter(None, map(cache.__getitem__, tokens)))
        else:
            opened = set()
        for w in self._words.intersection(tokens):
            opened.update(self._by_word[w])
        if self._always:
            opened.update(self._always)
        return sorted(opened)

    def first(
        self, text: str, tokens: AbstractSet[str] | None = None
    ) -> tuple[re.Pattern[str], re.Match[str]] | None:
        """The first pattern (in order) that matches, and its match. ``tokens``: the text's
        lower-cased words (``pipeline.core.fields.words``), if the caller has them already."""
        if not self.patterns:
            return None
        if tokens is None:
            tokens = set(_PIECE_RE.findall(text.lower()))
        for k in self._candidates(tokens):
            m = self.patterns[k].search(text)
            if m:
                return self.patterns[k], m
        return None
