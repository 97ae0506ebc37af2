"""What a pair rule is: one registered class owning its thresholds, its test, the wording
of its drop and its audit checks (docs/filters.md, "Adding a rule").

A threshold is a class attribute made with :func:`threshold`; the config's ``pairs``
section is built from them, and a rule instance holds the configured values under the same
names. The pair stage calls :meth:`PairRule.check` on each combination (or :meth:`apply` on
the set); the audit runs the methods marked with :func:`audit` on the rows of any pairs
file, and a method returns :data:`SKIP` on a row that lacks what it reads.
"""

from __future__ import annotations

import ast
import functools
import inspect
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, ClassVar, NamedTuple, TypeVar

from pydantic import AfterValidator, Field

from pipeline.core.fields import SIDES, count_words, words
from pipeline.core.registry import Registry
from pipeline.rules.text import Hit
from pipeline.rules.verdicts import margin, prefers

T = TypeVar("T")


class Skip:
    """What an audit check returns for a row without the columns it reads, and a filter
    for a combination whose verdicts it reads were not asked (yet)."""

    def __bool__(self) -> bool:  # never a hit
        return False


SKIP = Skip()
Found = Hit | None | Skip
Verdict = tuple[bool, str | None]
KEEP: Verdict = (True, None)


@dataclass(frozen=True)
class Threshold:
    """A rule's setting: a field of the config's ``pairs`` section."""

    kind: Any
    default: Any
    description: str
    bounds: dict[str, Any]
    check: Callable[[Any], Any] | None  # validates the value, raising ValueError

    def field(self) -> tuple[Any, Any]:
        """(annotation, pydantic FieldInfo) of the config field."""
        kind = self.kind if self.check is None else Annotated[self.kind, AfterValidator(self.check)]
        if isinstance(self.default, list):
            items = list(self.default)
            return kind, Field(default_factory=lambda: list(items), description=self.description)
        return kind, Field(self.default, description=self.description, **self.bounds)


def threshold(kind: Any, default: T, description: str, **bounds: Any) -> T:
    """A threshold in a rule's class body: ``quality_floor = threshold(int, 4, "One line.",
    ge=1, le=5)``; ``check=`` validates the value, the other keywords are its bounds."""
    check = bounds.pop("check", None)
    return Threshold(kind, default, description, bounds, check)  # type: ignore[return-value]


class AuditCheck(NamedTuple):
    """A code the audit flags pairs with. ``per``: on each answer with visible text, on the
    row, or across rows (``answer``, ``row``, ``set``); ``needs``: the columns it reads;
    ``unless``: a check whose flag on the row makes this one moot."""

    code: str
    label: str
    meaning: str  # the method's docstring
    per: str
    kind: str  # "text", "judge" or "set"
    needs: tuple[str, ...]
    unless: str | None
    method: str


def audit(
    code: str,
    label: str,
    *,
    per: str = "row",
    needs: tuple[str, ...] = (),
    unless: str | None = None,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Mark a rule's method as the audit check ``code``; its docstring says when it fires."""
    if per not in ("answer", "row", "set"):
        raise ValueError(f"audit check {code}: per must be answer, row or set, not {per!r}")

    def mark(fn: Any) -> Any:
        fn._audit = (code, label, " ".join((fn.__doc__ or "").split()), per, needs, unless)
        return fn

    return mark


@functools.lru_cache(maxsize=8192)
def word_set(text: str) -> frozenset[str]:
    """A text's words, once per text: an answer sits in several combinations."""
    return frozenset(words(text))


@dataclass
class Answer:
    """One answer as a rule reads it: the text, its finish reason (None: unknown) and the
    rubric aspects it must not copy; its words and their count, given or computed once."""

    text: str
    finish_reason: str | None = None
    aspects: Sequence[str] = ()
    given_tokens: Any = None
    given_n: int | None = None
    # a reasoning model's reasoning used its whole budget: no answer came at all
    reasoning_cut: bool = False

    @functools.cached_property
    def tokens(self) -> frozenset[str]:
        given = self.given_tokens
        return word_set(self.text) if given is None else frozenset(given)

    @functools.cached_property
    def n_words(self) -> int:
        return count_words(self.text) if self.given_n is None else self.given_n


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
    # the pairwise kinds ("pairwise_aware", "pairwise_blind") not asked (yet)
    pending: frozenset[str] = frozenset()

    def margin(self) -> float:
        """The margin it is ranked by (``pipeline.rules.verdicts.margin``), rounded; -inf
        when a pointwise verdict it needs is missing."""
        qc, qr, cc, cr = (self.quality_chosen, self.quality_rejected, self.coverage_chosen,
                          self.coverage_rejected)  # fmt: skip
        if not all(x and x.get("parse_ok") for x in (qc, qr, cc, cr)):
            return float("-inf")
        assert qc and qr and cc and cr
        blind = prefers(self.pairwise, "pairwise_blind")
        m = margin(cc["scores"], cr["scores"], self.rejected.get("violates") or [], qc, qr, blind)
        return round(m, 4)

    def answer(self, side: str) -> Answer:
        cand = self.chosen if side == "chosen" else self.rejected
        items = (self.rubric or {}).get("items") or []
        aspects = [it["aspect"] for it in items if isinstance(it.get("aspect"), str)]
        reasoning = (cand.get("provenance") or {}).get("reasoning") or {}
        return Answer(
            cand["text"],
            cand.get("finish_reason"),
            aspects,
            reasoning_cut=bool(reasoning.get("cut")),
        )


class RowView:
    """One row of a pairs file as the audit reads it, with each answer's words and count
    where the caller split them already, and the similarity it computed."""

    def __init__(
        self,
        r: Mapping[str, Any],
        n_words: tuple[int, int] | None = None,
        similarity: float | None = None,
        tokens: tuple[Sequence[str], Sequence[str]] | None = None,
    ) -> None:
        self.row, self.similarity = r, similarity
        self.texts = {"chosen": r["chosen"], "rejected": r["rejected"]}
        aspects = [a.get("aspect") for a in r.get("rubric_aspects") or () if isinstance(a, Mapping)]
        finish: Any = r.get("finish_reasons")
        finish = finish if isinstance(finish, Mapping) else {}
        self.answers = {
            side: Answer(
                self.texts[side],
                finish.get(side),
                [a for a in aspects if isinstance(a, str)],
                tokens[i] if tokens else None,
                n_words[i] if n_words else None,
            )
            for i, side in enumerate(SIDES)
        }

    def n_words(self, side: str) -> int:
        return self.answers[side].n_words


class PairRule:
    """A rule a pair must pass: declare thresholds, and override :meth:`answer` (each
    answer), :meth:`combination` (both), :meth:`check` (the whole combination) or, with
    ``set_level``, :meth:`apply`."""

    name: ClassVar[str] = ""
    # where it runs in the default ``pairs.filters``; None: an audit check only
    position: ClassVar[float | None] = None
    set_level: ClassVar[bool] = False
    # reads the judge's verdicts: refused in a run whose judge is off (judge.enabled)
    reads_verdicts: ClassVar[bool] = False
    # reads only the verdicts that were asked (judge_parse): one the judge did not ask, for
    # a candidate a text rule drops anyway, is left to that rule
    asked_only: ClassVar[bool] = False
    thresholds: ClassVar[dict[str, Threshold]] = {}
    audits: ClassVar[tuple[AuditCheck, ...]] = ()

    def __init_subclass__(cls, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        own = {k: v for k, v in vars(cls).items() if isinstance(v, Threshold)}
        cls.thresholds = {**cls.thresholds, **own}
        kind = "judge" if cls.reads_verdicts else "text"
        marked = [(attr, fn._audit) for attr, fn in vars(cls).items() if hasattr(fn, "_audit")]
        cls.audits = tuple(
            AuditCheck(code, label, doc, per, "set" if per == "set" else kind, needs, unless, attr)
            for attr, (code, label, doc, per, needs, unless) in marked
        )

    def __init__(self, settings: Any = None, word_cap: int = 100) -> None:
        """``settings``: the config's ``pairs`` section (None: the defaults)."""
        self.word_cap = word_cap
        for name, t in self.thresholds.items():
            setattr(self, name, t.default if settings is None else getattr(settings, name))
        self.setup()

    def setup(self) -> None:
        """Prepare what the thresholds imply (compiled patterns), once per run."""

    def answer(self, a: Answer) -> Found:
        """A hit on one answer (the pair stage tries both), or None."""
        return None

    def combination(self, pair: PairView) -> Hit | None:
        """A hit on the two answers together, or None."""
        return None

    def check(self, pair: PairView) -> Verdict | Skip:
        """Keep, or drop with a reason (SKIP: not before verdicts that are pending): each
        answer, then both."""
        for side in SIDES:
            if isinstance(found := self.answer(pair.answer(side)), Hit):
                return False, f"{side} answer {found.detail}"
        hit = self.combination(pair)
        return (False, hit.detail) if hit else KEEP

    def apply(self, rows: list[dict[str, Any]]) -> dict[str, str]:
        """example_id -> reason for the rows to drop (rules with ``set_level``)."""
        raise NotImplementedError

    @classmethod
    def settings_problem(
        cls, values: Mapping[str, Any], word_cap: int, enabled: bool
    ) -> tuple[str, str] | None:
        """(threshold, why) when its settings contradict each other so that every pair would
        drop; ``enabled``: the rule is in ``pairs.filters``."""
        return None


class Outcome(NamedTuple):
    """What a combination's filters decided: the first that dropped it (``reason`` None:
    every filter passed), its detail, how many passed before, and whether it stopped at a
    filter that needs verdicts not asked yet (``undecided``)."""

    reason: str | None
    detail: str | None
    passed: int
    undecided: bool = False


def run_filters(filters: Sequence[PairRule], pair: PairView) -> Outcome:
    """The pair-level filters on one combination, in order, to the first that drops it or
    cannot decide: what the pair stage keeps and the judge stops asking by."""
    for i, f in enumerate(x for x in filters if not x.set_level):
        got = f.check(pair)
        if isinstance(got, Skip):
            return Outcome(f.name, None, i, undecided=True)
        if not got[0]:
            return Outcome(f.name, got[1], i)
    return Outcome(None, None, len([x for x in filters if not x.set_level]))


@functools.lru_cache(maxsize=64)
def _classes_of(module: str) -> dict[str, ast.ClassDef]:
    """A module's class statements by qualified name, its source parsed once."""
    try:
        tree = ast.parse(inspect.getsource(sys.modules[module]))
    except (KeyError, OSError, TypeError, SyntaxError):
        return {}
    found: dict[str, ast.ClassDef] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                found[prefix + child.name] = child
                visit(child, f"{prefix}{child.name}.")
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                visit(child, f"{prefix}{child.name}.<locals>.")
            else:
                visit(child, prefix)

    visit(tree, "")
    return found


def check_names(name: str, cls: type[PairRule]) -> None:
    """A rule reads only what it declares or sets, and reads (or names) every threshold it
    declares: a threshold renamed on one side is an error naming it when the rule is
    registered, never a value silently left at its default."""
    reads: set[str] = set()
    sets: set[str] = set()
    strings: set[str] = set()
    trees = [_classes_of(k.__module__).get(k.__qualname__) for k in cls.__mro__]
    for tree in [t for t in trees[: cls.__mro__.index(PairRule)] if t is not None]:
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and getattr(node.value, "id", None) == "self":
                (sets if isinstance(node.ctx, ast.Store) else reads).add(node.attr)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                strings.add(node.value)
    for attr in sorted(reads - sets - set(dir(cls)) - {"word_cap"}):
        why = f"reads self.{attr}, which it does not declare"
        raise ValueError(f"rule '{name}' {why}: declare `{attr} = threshold(...)` or set it")
    if trees[0] is not None:  # its source was read
        for t in sorted(set(cls.thresholds) - reads - strings):
            raise ValueError(f"rule '{name}' declares the threshold pairs.{t} but never reads it")


class RuleRegistry(Registry[type[PairRule]]):
    """The rules; also refuses a rule whose names do not check (:func:`check_names`), and
    a threshold or an audit code another rule has."""

    def _checked(self, name: str, obj: Any) -> Any:
        obj = super()._checked(name, obj)
        check_names(name, obj)
        for other_name, other in self.items():
            mine = {*obj.thresholds, *(c.code for c in obj.audits)}
            taken = mine & {*other.thresholds, *(c.code for c in other.audits)}
            if other is not obj and taken:
                why = f"{sorted(taken)[0]!r} is rule '{other_name}''s threshold or audit code"
                raise ValueError(f"rule '{name}': {why}; name it otherwise")
        return obj


RULES = RuleRegistry("filter", PairRule, field="pairs.filters")


def default_filters() -> list[str]:
    """The default ``pairs.filters``: every pair filter, by its ``position``."""
    placed = [(cls.position, i, n) for i, (n, cls) in enumerate(RULES.items())]
    return [n for _, _, n in sorted(p for p in placed if p[0] is not None)]


def audit_checks() -> dict[str, AuditCheck]:
    """Every audit check by code, in report order (the rules' registration order)."""
    return {c.code: c for cls in RULES.values() for c in cls.audits}


def threshold_fields() -> dict[str, tuple[Any, Any]]:
    """Every rule's thresholds as config fields, in registration order."""
    return {n: t.field() for cls in RULES.values() for n, t in cls.thresholds.items()}


class RuleSet:
    """Every registered rule, built once from a ``pairs`` section (None: the defaults) and
    the word cap: what the pair stage, the audit and a release's record share."""

    def __init__(self, settings: Any = None, word_cap: int = 100) -> None:
        self.settings, self.word_cap = settings, word_cap
        self.rules = {name: cls(settings, word_cap) for name, cls in RULES.items()}

    def with_word_cap(self, word_cap: int) -> RuleSet:
        return RuleSet(self.settings, word_cap)

    def filters(self, names: Sequence[str]) -> list[PairRule]:
        return [self.rules[n] for n in names]

    def checks(self) -> Iterator[tuple[AuditCheck, Callable[..., Any]]]:
        """(check, the bound method that runs it) in report order: a method ``per`` answer
        or row returns a Hit, None or SKIP; one across rows yields (row, Hit)."""
        for rule in self.rules.values():
            for c in rule.audits:
                yield c, getattr(rule, c.method)

    def thresholds(self) -> dict[str, Any]:
        """Every threshold by its config name (a pattern list as its length), the word cap
        and the cap it makes: what a report says it checked with."""
        out: dict[str, Any] = {"word_cap": self.word_cap}
        for rule in self.rules.values():
            for n in rule.thresholds:
                out[n] = len(v) if isinstance(v := getattr(rule, n), list) else v
        if (cap := getattr(self.rules.get("length"), "cap", None)) is not None:
            out["cap"] = round(cap, 2)
        return out
