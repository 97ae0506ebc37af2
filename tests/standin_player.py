"""The stand-in server's default answers: a rule-based player of the pipeline's prompts.

It is not a model. It reads the prompts the pipeline sends (``prompts/*.j2``) and answers
them the way a simple, consistent model would, from word overlap alone:

- generation prompts ("Question:" plus lists of points): an answer that names its topic in
  a word or two of the question (never the whole question), with one of several openings,
  and one sentence per point it is asked to cover (the point's content words, reordered:
  never the point's own text, which the pair stage would drop as an echo of the rubric),
  padded with generic
  advice that shares no content word with the points it is asked to avoid; at most
  ``max_points`` points are covered (a small model's attention span), within the prompt's
  "at most N words", ending at a sentence end;
- rubric prompts: distinct aspects taken from the person's explanation and posts;
- coverage: each rubric item scored 0/1/2 by the share of its content words (not counting
  the question's own words) that the answer uses;
- quality: similar high scores for any non-empty answer that is on topic;
- pairwise, rubric-aware: the answer that covers more of the listed points wins;
- best-of-N (prompts/bon_judge.txt, prompts/gen_score.txt): a list of each listed aspect's
  coverage score in square brackets, and a number in [0, 1]: the share of the question's
  and posts' content words the answer uses;
- pairwise, rubric-blind: a position bias (answer A) unless one answer is empty or off
  topic, so general quality alone never picks the same side in both orders.

Verdicts are filled from the request's JSON schema structure (enums, bounds, required
properties, additionalProperties, uniqueItems), with the values above hooked in by
property name, so a schema that moves a field or renames the verdict still gets a valid
answer. A prompt the player does not recognise gets ``None`` (the server's filler then).
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

WORD_RE = re.compile(r"[\w']+")  # the pipeline's word rule (pipeline/core/fields.py)
_CAP = re.compile(r"at most (\d+) words", re.IGNORECASE)
# a coverage prompt's point: "- id ITEM: aspect" (older prompts) or "- P1: aspect"
_ITEM_LINE = re.compile(r"^-\s*(?:id\s+(\S+?)|(P\d+)):\s*(.+)$")
_ANSWER_BLOCK = re.compile(r"<<<\n(.*?)\n?>>>", re.S)
# A list header that asks to leave its points out ("does not address any of these points").
_AVOID = re.compile(
    r"\b(?:not|never|n't)\b[^.:]*\b(?:address|cover|mention|include|touch|discuss)"
    r"|\bavoid|\bleave (?:them|it) out\b|\bleaves? out\b"
    r"|\bwithout (?:address|cover|mention|touch|discuss)",
    re.IGNORECASE,
)
DIMENSIONS = ("correctness", "relevance", "helpfulness")

STOPWORDS = frozenset(
    """a about above after again against all also am an and any are aren't as at be because
    been before being below between both but by can can't could did didn't do does doesn't
    doing don't down during each even few for from further get gets had has have having he her
    here hers herself him himself his how i i'd i'll i'm i've if in into is isn't it it's its
    itself just let's like me more most much my myself no nor not now of off on once only or
    other ought our ours ourselves out over own same she should so some such than that that's
    the their theirs them themselves then there there's these they they're this those through
    to too under until up very via was wasn't we we're were what what's when where which while
    who whom why will with won't would you you'd you'll you're you've your yours yourself
    yourselves e g etc e.g answer answers question questions person people user one ones way
    ways thing things well really""".split()
)
# Verbs that open an aspect ("Suggests ...", "Uses ...") say what the answer does, not what
# it contains: an answer covers the point without repeating them.
GENERIC_VERBS = frozenset(
    """suggest use give keep offer include recommend address explain provide draw build fit
    consider weigh handle add involve respect connect check anchor ground favour favor be
    mention cover describe list discuss help make take account work accommodate fact""".split()
)

_PARAPHRASES = (
    "Think about {b} as well as {a}",
    "Keep {b} in mind, along with {a}",
    "Plan around {b}, and around {a} too",
    "Give some thought to {b} and to {a}",
)
# Generic advice for padding; sentences sharing a content word with an avoided point are
# skipped, so the vocabulary is kept away from typical rubric words.
_FILLER = (
    "Start with one small step this week and see how it goes.",
    "Write down what you want out of it so you can tell later whether it worked.",
    "Give it a few weeks before you judge the results.",
    "Ask someone who has been through the same thing what surprised them.",
    "Keep a short note of what works and drop what does not.",
    "Expect a slow start; most of the gain comes after the first month.",
    "Pick the option you can repeat, not the most impressive one.",
    "Plan for bad days so a missed step does not end the whole effort.",
    "Look at what already goes well for you and build from there.",
    "Be honest about the time and money you can really spare.",
    "Compare two or three choices side by side before you commit.",
    "Read the reviews, but trust your own trial more than any ranking.",
    "Set one clear goal and let the rest wait.",
    "Celebrate small wins; they keep the motivation going.",
    "If something feels wrong, change one thing at a time.",
    "A checklist makes the next step obvious when energy is low.",
    "Talk it over with a friend who will give you a straight answer.",
    "Keep it simple enough that it still works on a busy week.",
    "Review your progress at the end of each month.",
    "Mistakes are normal here, so treat them as information.",
    "Borrow or rent before buying anything expensive.",
    "Learn the basics first; the details make sense later.",
    "Look for a local group or club where others share the interest.",
    "Keep your expectations realistic and your plan flexible.",
    "Measure one thing that matters and ignore the rest for now.",
    "Sleep, food and rest affect this more than most people think.",
    "Try the cheapest reasonable option first and upgrade only if needed.",
    "Write a short plan and put it somewhere you will see it.",
    "Decide in advance what you will do when things slip.",
    "Patience pays off more than intensity.",
    "Check official guidance where safety or money is involved.",
    "Note the questions that come up and look them up one by one.",
    "Keep the first attempt small so it is easy to finish.",
    "Ask for feedback early rather than late.",
    "Leave room for rest so the habit does not burn you out.",
    "Focus on the next step, not on the whole road.",
)
# How a generated answer names its topic: a model varies its openings and refers to the
# question in a word or two; it does not open every answer the same way or repeat the
# question. ``{t}``: one or two adjacent content words of the question.
_TOPIC_SENTENCES = (
    "When it comes to {t}, a few things help.",
    "{T} gets easier with a plan.",
    "A good way into {t} is to start small.",
    "There are a few ways to approach {t}.",
    "My advice on {t} is to keep it practical.",
    "With {t}, the details matter more than the gear.",
    "Here is what I would try for {t}.",
    "{T} is more manageable than it looks.",
    "Most people overthink {t} at first.",
    "It helps to treat {t} as a series of small steps.",
)
# content words that do not name a topic
_NOT_TOPICS = frozenset(
    """without within want wants need needs best good better right rather someone something
    anything looking know think feel find start keep much many lot lots ever always never
    still already tips advice help look approach realistic""".split()
)
_SWAP = {
    "i": "you", "i'm": "you're", "i've": "you've", "i'd": "you'd", "i'll": "you'll",
    "me": "you", "my": "your", "mine": "yours", "myself": "yourself", "am": "are",
    "we": "you", "our": "your", "us": "you",
}  # fmt: skip
_ASPECT_PREFIXES = (
    "Respects that",
    "Builds on the fact that",
    "Fits the situation where",
    "Accounts for how",
    "Works with the detail that",
    "Keeps in mind that",
    "Takes seriously that",
    "Reflects that",
)


@lru_cache(maxsize=1 << 16)
def stem(word: str) -> str:
    """A light suffix stripper, so "sessions"/"session" and "fits"/"fit" match."""
    w = word.lower().replace("'s", "").strip("'")
    if len(w) > 5 and w.endswith("ing"):
        return w[:-3]
    if len(w) > 4 and w.endswith("ies"):
        return w[:-3] + "y"
    if len(w) > 4 and (w.endswith(("sses", "ches", "shes", "xes", "zes"))):
        return w[:-2]
    if len(w) > 3 and w.endswith("s") and not w.endswith("ss"):
        return w[:-1]
    if len(w) > 4 and w.endswith("ed"):
        return w[:-2]
    return w


def stems(text: str) -> set[str]:
    return {stem(w) for w in WORD_RE.findall(text.lower())}


def content_stems(text: str, drop: set[str] | frozenset[str] = frozenset()) -> list[str]:
    """The distinct content words of ``text`` (stemmed, in order), minus ``drop``."""
    out: list[str] = []
    for w in WORD_RE.findall(text.lower()):
        s = stem(w)
        if w in STOPWORDS or s in STOPWORDS or s in GENERIC_VERBS or s in drop or len(s) < 2:
            continue
        if s not in out:
            out.append(s)
    return out


def count_words(text: str) -> int:
    """Words under both the pipeline's rule and whitespace splitting: the larger count."""
    return max(len(WORD_RE.findall(text)), len(text.split()))


def coverage_score(answer: str, aspect: str, question: str = "") -> tuple[int, list[str]]:
    """0/1/2 by the share of the aspect's content words the answer uses; the question's own
    words do not count (restating the question covers no point). Returns (score, matched)."""
    q = set(content_stems(question))
    want = content_stems(aspect, drop=q) or content_stems(aspect)
    if not want:
        return 0, []
    have = stems(answer)
    matched = [w for w in want if w in have]
    share = len(matched) / len(want)
    return (2 if share >= 0.6 else 1 if share >= 0.25 else 0), matched


def second_person(text: str) -> str:
    """ "I keep hiding my sketches" -> "you keep hiding your sketches"."""

    def swap(m: re.Match[str]) -> str:
        w = m.group(0)
        return _SWAP.get(w.lower(), w)

    return re.sub(r"[A-Za-z']+", swap, text)


def paraphrase(point: str, rng: random.Random) -> str:
    """A sentence with the point's content words, reordered and with other function words,
    so it covers the point without copying its text (the pair stage drops answers that
    echo a rubric aspect)."""
    kept = [
        w
        for w in WORD_RE.findall(point)
        if w.lower() not in STOPWORDS and stem(w) not in GENERIC_VERBS
    ] or WORD_RE.findall(point)
    half = math.ceil(len(kept) / 2)
    first, second = " ".join(kept[:half]), " ".join(kept[half:])
    if not second:
        return sentence(f"Think about {first} early on")
    return sentence(rng.choice(_PARAPHRASES).format(a=first, b=second))


def topic_words(question: str, rng: random.Random) -> str:
    """One or two adjacent content words of the question: how an answer names its topic
    (an answer that shares none of the question's words reads as off topic)."""
    words = WORD_RE.findall(question)
    runs: list[list[str]] = [[]]
    for w in words:
        low = w.lower()
        if low in STOPWORDS or low in _NOT_TOPICS or stem(w) in GENERIC_VERBS or len(w) < 4:
            if runs[-1]:
                runs.append([])
        else:
            runs[-1].append(low)
    # the longer runs of content words name the topic ("drawing hands", "morning routine")
    runs = sorted((r for r in runs if r), key=len, reverse=True)[:2]
    if not runs:
        return "this"
    run = rng.choice(runs)
    start = rng.randrange(max(1, len(run) - 1))
    return " ".join(run[start : start + 2])


def topic_sentence(question: str, rng: random.Random) -> str:
    t = topic_words(question, rng)
    return rng.choice(_TOPIC_SENTENCES).format(t=t, T=t[:1].upper() + t[1:])


def sentence(text: str) -> str:
    text = text.strip()
    if not text:
        return text
    text = text[:1].upper() + text[1:]
    return text if text[-1] in ".!?" else text + "."


def fit_text(text: str, max_len: int | None, min_len: int = 0) -> str:
    """``text`` within [min_len, max_len] characters, cut at a sentence end if it can be,
    else at a word boundary with a full stop."""
    if max_len is not None and len(text) > max_len:
        cut = text[:max_len]
        end = max(cut.rfind(". "), cut.rfind("! "), cut.rfind("? "))
        if cut.endswith((".", "!", "?")):
            text = cut
        elif end > 0:
            text = cut[: end + 1]
        else:
            space = cut.rfind(" ", 0, max(max_len - 1, 1))
            text = (cut[:space] if space > 0 else cut[: max(max_len - 1, 0)]).rstrip(",;: ")
            text = text + "." if len(text) < max_len else text
    while len(text) < min_len:
        text = (text + " Noted.").strip()
    if max_len is not None:
        text = text[:max_len]
    return text


def cap_words(sentences: list[str], cap: int | None) -> str:
    """Whole sentences while they fit in ``cap`` words; a first sentence that alone is too
    long is cut to the cap and closed with a full stop."""
    if cap is None:
        return " ".join(sentences)
    kept: list[str] = []
    for s in sentences:
        if count_words(" ".join([*kept, s])) <= cap:
            kept.append(s)
        elif not kept:
            words = s.split()
            while words and count_words(" ".join(words)) > cap:
                words.pop()
            kept.append(" ".join(words).rstrip(",;:.") + "." if words else "")
            break
    return " ".join(k for k in kept if k)


# --- prompt parsing ------------------------------------------------------------------------


@dataclass
class Prompt:
    """What the player reads from a request: the main user turn and its parts."""

    text: str
    question: str
    answers: list[str]
    lists: list[tuple[str, list[str]]]  # (header line, bullets) outside the answer blocks
    items: list[tuple[str | None, str]]  # rubric items: (id or None, aspect text)
    narrative: str
    caps: list[int] = field(default_factory=list)

    @property
    def posts(self) -> list[str]:
        return [b for h, bl in self.lists if "post" in h.lower() for b in bl]

    def point_lists(self) -> tuple[list[str], list[str]]:
        """(points to cover, points to avoid) from the generation prompt's lists."""
        cover: list[str] = []
        avoid: list[str] = []
        for header, bullets in self.lists:
            if "post" in header.lower():
                continue
            (avoid if _AVOID.search(header) else cover).extend(bullets)
        return cover, avoid


def _user_turns(messages: list[dict[str, Any]]) -> list[str]:
    out = []
    for m in messages:
        if isinstance(m, dict) and m.get("role") == "user":
            c = m.get("content") or ""
            if isinstance(c, list):
                c = " ".join(p.get("text", "") for p in c if isinstance(p, dict))
            out.append(str(c))
    return out


def parse_prompt(messages: list[dict[str, Any]]) -> Prompt | None:
    """The first user turn with a "Question:" (a re-ask appends turns after it)."""
    turns = _user_turns(messages)
    main = next((t for t in turns if "Question:" in t), None)
    if main is None:
        return None
    m = re.search(r"Question:[ \t]*\n?(.*?)(?:\n[ \t]*\n|$)", main, re.S)
    question = " ".join((m.group(1) if m else "").split())
    answers = [a.strip() for a in _ANSWER_BLOCK.findall(main)]
    outside = _ANSWER_BLOCK.sub("\n", main)
    lists: list[tuple[str, list[str]]] = []
    header, bullets, last_line = "", [], ""
    for raw in outside.splitlines():
        line = raw.strip()
        if line.startswith("- "):
            if not bullets:
                header = last_line
            bullets.append(line[2:].strip())
            continue
        if bullets:
            lists.append((header, bullets))
            bullets = []
        if line:
            last_line = line
    if bullets:
        lists.append((header, bullets))
    items: list[tuple[str | None, str]] = []
    for _, bl in lists:
        for b in bl:
            im = _ITEM_LINE.match("- " + b)
            if im:
                items.append((im.group(1) or im.group(2), im.group(3).strip()))
    if not items:  # the rubric-aware pairwise template lists aspects without ids
        items = [
            (None, b)
            for h, bl in lists
            if re.search(r"\b(?:expects?|needs|looking for|cares?)\b", h, re.I)
            and "post" not in h.lower()
            for b in bl
        ]
    nm = re.search(r"(?:explanation|narrative)[^\n]*:\s*\n(.*?)(?:\n[ \t]*\n|$)", main, re.S)
    narrative = " ".join(nm.group(1).split()) if nm else ""
    if narrative.startswith("(none"):
        narrative = ""
    caps = [int(c) for t in turns for c in _CAP.findall(t)]
    return Prompt(main, question, answers, lists, items, narrative, caps)


# --- schema filling ------------------------------------------------------------------------


def _resolve(schema: dict[str, Any], root: dict[str, Any]) -> dict[str, Any]:
    for _ in range(32):
        if "$ref" in schema:
            target: Any = root
            for part in schema["$ref"].lstrip("#/").split("/"):
                target = target[part.replace("~1", "/").replace("~0", "~")]
            schema = {**{k: v for k, v in schema.items() if k != "$ref"}, **target}
            continue
        if "allOf" in schema:
            merged = {k: v for k, v in schema.items() if k != "allOf"}
            for branch in schema["allOf"]:
                merged.update(_resolve(branch, root))
            schema = merged
            continue
        for key in ("anyOf", "oneOf"):
            if key in schema:
                branches = [b for b in schema[key] if b.get("type") != "null"] or schema[key]
                rest = {k: v for k, v in schema.items() if k != key}
                schema = {**rest, **branches[0]}
                break
        else:
            return schema
    return schema


def _kind(schema: dict[str, Any]) -> str:
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind is None:
        if "enum" in schema:
            return "enum"
        kind = "object" if "properties" in schema else "array" if "items" in schema else "string"
    return kind


def _property_names(schema: Any, root: dict[str, Any], depth: int = 0) -> set[str]:
    if depth > 8 or not isinstance(schema, dict):
        return set()
    schema = _resolve(schema, root)
    names = set(schema.get("properties", {}))
    for sub in schema.get("properties", {}).values():
        names |= _property_names(sub, root, depth + 1)
    if isinstance(schema.get("items"), dict):
        names |= _property_names(schema["items"], root, depth + 1)
    return names


def _coerce_int(value: float, schema: dict[str, Any]) -> int | float:
    if schema.get("enum"):
        return min(schema["enum"], key=lambda e: abs(e - value) if isinstance(e, int) else 1e9)
    lo, hi = schema.get("minimum"), schema.get("maximum")
    if schema.get("exclusiveMinimum") is not None:
        lo = math.floor(schema["exclusiveMinimum"]) + 1
    if schema.get("exclusiveMaximum") is not None:
        hi = math.ceil(schema["exclusiveMaximum"]) - 1
    if lo is not None:
        value = max(value, lo)
    if hi is not None:
        value = min(value, hi)
    return int(value) if _kind(schema) == "integer" else value


Fallback = Callable[[dict[str, Any], random.Random, dict[str, Any]], Any]


class _Filler:
    """Builds a value valid against ``root`` and asks ``hooks`` for the values that carry
    meaning; anything a hook leaves alone comes from ``fallback`` (the server's filler)."""

    def __init__(
        self, root: dict[str, Any], rng: random.Random, hooks: _Hooks, fallback: Fallback
    ) -> None:
        self.root, self.rng, self.hooks, self.fallback = root, rng, hooks, fallback

    def fill(self, schema: dict[str, Any], ctx: dict[str, Any], name: str | None) -> Any:
        schema = _resolve(schema, self.root)
        if "const" in schema:
            return schema["const"]
        kind = _kind(schema)
        if kind == "object":
            props = dict(schema.get("properties") or {})
            extra = schema.get("additionalProperties")
            if not props and isinstance(extra, dict) and self.hooks.item_ids:
                allowed = (schema.get("propertyNames") or {}).get("enum")
                for item_id in self.hooks.item_ids:
                    if allowed is None or item_id in allowed:
                        props[item_id] = extra
            for req in schema.get("required", []):
                props.setdefault(req, {"type": "string"})
            out = {}
            for key, sub in props.items():
                child = {**ctx, "item": key} if key in self.hooks.item_ids else ctx
                out[key] = self.fill(sub, child, key)
            return out
        if kind == "array":
            return self._array(schema, ctx, name)
        value = self.hooks.leaf(name, schema, ctx)
        if value is None:
            value = self.fallback(schema, self.rng, self.root)
        return self._coerce(value, schema)

    def _array(self, schema: dict[str, Any], ctx: dict[str, Any], name: str | None) -> list:
        lo = schema.get("minItems", 0)
        hi = schema.get("maxItems", math.inf)
        item_schema = schema.get("items") or {}
        contexts = self.hooks.elements(name, _resolve(item_schema, self.root), ctx)
        if contexts is None:
            contexts = [ctx] * int(min(max(3, lo), hi))
        contexts = contexts[: int(hi) if hi != math.inf else None]
        while len(contexts) < lo:
            contexts.append({**ctx, "spare": len(contexts)})
        out: list[Any] = []
        seen: set[str] = set()
        for c in contexts:
            value = self.fill(item_schema, c, name)
            key = json.dumps(value, sort_keys=True)
            tries = 0
            while schema.get("uniqueItems") and key in seen and tries < 20:
                value = self.fill(item_schema, {**c, "spare": f"{tries}-{len(out)}"}, name)
                key, tries = json.dumps(value, sort_keys=True), tries + 1
            seen.add(key)
            out.append(value)
        return out

    def _coerce(self, value: Any, schema: dict[str, Any]) -> Any:
        kind = _kind(schema)
        if schema.get("enum") and value not in schema["enum"]:
            if kind in ("integer", "number") and isinstance(value, (int, float)):
                return _coerce_int(value, schema)
            return schema["enum"][0]
        if kind in ("integer", "number"):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                return self.fallback(schema, self.rng, self.root)
            return _coerce_int(value, schema)
        if kind == "string":
            if not isinstance(value, str):
                value = str(value)
            pattern = schema.get("pattern")
            if schema.get("format") or (pattern and not re.fullmatch(pattern, value, re.S)):
                return self.fallback(schema, self.rng, self.root)
            return fit_text(value, schema.get("maxLength"), schema.get("minLength", 0))
        return value


@dataclass
class _Hooks:
    """Meaning for a verdict's fields, by property name and context."""

    kind: str
    item_ids: list[str] = field(default_factory=list)
    values: dict[str, Any] = field(default_factory=dict)

    def elements(
        self, name: str | None, item: dict[str, Any], ctx: dict[str, Any]
    ) -> list[dict[str, Any]] | None:
        props = set(item.get("properties", {}))
        if self.kind == "coverage" and props & {"id", "item_id"}:
            return [{**ctx, "item": i} for i in self.item_ids]
        if self.kind == "rubric" and "aspect" in props:
            return [{**ctx, "aspect": k} for k in range(len(self.values["aspects"]))]
        return None

    def leaf(self, name: str | None, schema: dict[str, Any], ctx: dict[str, Any]) -> Any:
        kind, v, n = _kind(schema), self.values, (name or "").lower()
        if self.kind == "coverage" and "item" in ctx:
            item = ctx["item"]
            if kind in ("integer", "number"):
                return v["scores"][item]
            if n in ("id", "item_id"):
                return item
            if kind == "string":
                return v["rationales"][item]
        if self.kind == "quality":
            dim = next((d for d in DIMENSIONS if n.startswith(d)), None)
            if dim and kind in ("integer", "number"):
                return v["scores"][dim]
            if kind == "string" and schema.get("enum") is None:
                return v["rationales"].get(dim or "", v["rationales"]["correctness"])
        if self.kind == "pairwise":
            if n == "winner" or (schema.get("enum") and "A" in schema["enum"]):
                return v["winner"]
            if kind == "string":
                return v["rationale"]
        if self.kind == "rubric" and "aspect" in ctx and kind == "string":
            aspect = v["aspects"][ctx["aspect"]]
            spare = ctx.get("spare")
            text = aspect.get(n)
            if text is None:
                return None
            return text if spare is None else f"{text} ({spare})"
        return None


# --- the player ------------------------------------------------------------------------------


class ModelPlayer:
    """Answers the pipeline's prompts like a simple, consistent model (see module doc)."""

    def __init__(self, fallback: Fallback, max_points: int = 3) -> None:
        """``fallback(schema, rng, root)`` fills schema parts that carry no meaning here;
        ``max_points``: the most points one generated answer covers."""
        self.fallback = fallback
        self.max_points = max_points

    def answer(self, body: dict[str, Any], index: int) -> str | None:
        """The content for choice ``index`` of this request, or None if not recognised."""
        messages = body.get("messages") or []
        prompt = parse_prompt(messages)
        if prompt is None:
            return None
        rng = _rng(body, index)
        fmt = body.get("response_format") or {}
        if fmt.get("type") != "json_schema":
            if fmt:
                return None
            if prompt.answers and "square brackets" in prompt.text:
                return self._score_list(prompt)
            if prompt.answers and "one number between 0 and 1" in prompt.text:
                return self._rating(prompt)
            return self.generate(prompt, rng)
        spec = fmt.get("json_schema") or {}
        schema = spec.get("schema") or {}
        hooks = self._hooks(prompt, schema, str(spec.get("name") or ""))
        if hooks is None:
            return None
        return json.dumps(_Filler(schema, rng, hooks, self.fallback).fill(schema, {}, None))

    # -- which verdict, and its values -------------------------------------------------------
    def _hooks(self, p: Prompt, schema: dict[str, Any], name: str) -> _Hooks | None:
        names = _property_names(schema, schema)
        low = name.lower()
        if "winner" in names or "pairwise" in low:
            return self._pairwise(p)
        if set(DIMENSIONS) <= names or "quality" in low:
            return self._quality(p)
        if p.items and any(i for i, _ in p.items) and ("coverage" in low or p.answers):
            return self._coverage(p)
        if "aspects" in names or "aspect" in names or "rubric" in low:
            return self._rubric(p, schema)
        return None

    def _coverage(self, p: Prompt) -> _Hooks:
        answer = p.answers[0] if p.answers else ""
        scores, rationales = {}, {}
        for item_id, aspect in p.items:
            if item_id is None:
                continue
            score, matched = coverage_score(answer, aspect, p.question)
            scores[item_id] = score
            if score == 2:
                why = f"The answer covers this directly ({', '.join(matched[:4])})."
            elif score == 1:
                why = f"The answer only touches on this ({', '.join(matched[:3])})."
            else:
                why = "The answer does not cover this point."
            rationales[item_id] = why
        ids = [i for i, _ in p.items if i is not None]
        return _Hooks("coverage", ids, {"scores": scores, "rationales": rationales})

    @staticmethod
    def _score_list(p: Prompt) -> str:
        """A best-of-N judge's verdict (prompts/bon_judge.txt): each listed aspect's coverage
        (0/1/2, as the coverage verdict scores it), as one list in square brackets."""
        answer = p.answers[0]
        aspects = [aspect for _, aspect in p.items]
        return "[" + ", ".join(str(coverage_score(answer, a, p.question)[0]) for a in aspects) + "]"

    @staticmethod
    def _rating(p: Prompt) -> str:
        """A generative reward model's number (prompts/gen_score.txt): the share of the
        question's and the posts' content words that the answer uses, to two decimals."""
        answer = stems(p.answers[0])
        wanted = set(content_stems(p.question))
        for post in p.posts:
            wanted |= set(content_stems(post))
        if not wanted:
            return "0.5"
        return f"{len(wanted & answer) / len(wanted):.2f}"

    @staticmethod
    def _on_topic(answer: str, question: str) -> bool:
        q = set(content_stems(question))
        return bool(answer.strip()) and (not q or bool(q & stems(answer)))

    def _quality(self, p: Prompt) -> _Hooks:
        answer = p.answers[0] if p.answers else ""
        n = count_words(answer)
        if n == 0:
            scores = dict.fromkeys(DIMENSIONS, 1)
        else:
            on_topic = self._on_topic(answer, p.question)
            scores = {
                "correctness": 5,
                "relevance": 5 if on_topic else 2,
                "helpfulness": 5 if n >= 40 else 4 if n >= 15 else 3,
            }
        rationales = {
            "correctness": "Nothing in the answer is wrong for this question."
            if scores["correctness"] >= 4
            else "The answer is empty.",
            "relevance": "It stays on the question asked."
            if scores["relevance"] >= 4
            else "It drifts away from the question asked.",
            "helpfulness": "It gives concrete, usable steps."
            if scores["helpfulness"] >= 4
            else "It is too short to help much.",
        }
        return _Hooks("quality", [], {"scores": scores, "rationales": rationales})

    def _pairwise(self, p: Prompt) -> _Hooks:
        a, b = [*p.answers, "", ""][:2]
        aspects = [aspect for _, aspect in p.items]
        if aspects:  # rubric-aware: more coverage of the listed points wins
            ca = sum(coverage_score(a, x, p.question)[0] for x in aspects)
            cb = sum(coverage_score(b, x, p.question)[0] for x in aspects)
            winner = "A" if ca > cb else "B" if cb > ca else "tie"
            top = 2 * len(aspects)
            why = f"A covers {ca} of {top} points' worth, B covers {cb}."
        else:  # rubric-blind: position bias unless one side is empty or off topic
            ok_a, ok_b = self._on_topic(a, p.question), self._on_topic(b, p.question)
            winner = "B" if ok_b and not ok_a else "A"
            why = (
                "Both answers are reasonable; A reads slightly better."
                if ok_a == ok_b
                else f"Only {winner} addresses the question."
            )
        return _Hooks("pairwise", [], {"winner": winner, "rationale": why})

    def _rubric(self, p: Prompt, schema: dict[str, Any]) -> _Hooks:
        arr = _find_array(schema, schema, "aspects") or {}
        lo, hi = arr.get("minItems", 1), arr.get("maxItems", 6)
        want = max(lo, min(3, hi))
        sources = [(s, "narrative") for s in _sentences(p.narrative)]
        sources += [(s, "posts") for post in p.posts for s in _sentences(post)[:1]]
        aspects: list[dict[str, str]] = []
        seen: set[str] = set()
        for text, origin in sources:
            if len(aspects) >= want:
                break
            key = " ".join(content_stems(text)[:6])
            if not key or key in seen:
                continue
            seen.add(key)
            words = second_person(text).rstrip(".!?").split()[:18]
            while len(words) > 3 and words[-1].lower().strip(",;:") in STOPWORDS:
                words.pop()  # "... because" reads cut off
            clause = " ".join(words).rstrip(",;:")
            if origin == "posts":
                prefix = "Draws on what they wrote:"
            else:
                prefix = _ASPECT_PREFIXES[len(aspects) % len(_ASPECT_PREFIXES)]
                if words[0].lower() in STOPWORDS:
                    clause = clause[:1].lower() + clause[1:]
            reason = (
                "They say so in their own explanation of the question."
                if origin == "narrative"
                else "It comes up in their past posts."
            )
            aspects.append({"aspect": f"{prefix} {clause}", "evidence": text, "reason": reason})
        k = 0
        while len(aspects) < want:  # too little text: fall back on the question itself
            k += 1
            aspects.append(
                {
                    "aspect": f"Answers the question directly, point {k}: {p.question}",
                    "evidence": p.question,
                    "reason": "It is what they asked.",
                }
            )
        return _Hooks("rubric", [], {"aspects": aspects})

    # -- generation --------------------------------------------------------------------------
    def generate(self, p: Prompt, rng: random.Random) -> str:
        """An answer that covers the points it is asked to cover (at most ``max_points``)
        and shares no content word with the points it is asked to avoid."""
        cap = min(p.caps) if p.caps else None
        cover, avoid = p.point_lists()
        q = set(content_stems(p.question))
        forbidden = {s for point in avoid for s in content_stems(point, drop=q)}
        intro = topic_sentence(p.question, rng)
        body = [paraphrase(point, rng) for point in cover[: self.max_points]]
        top = cap if cap is not None else 100
        target = rng.randint(max(1, int(top * 0.65)), max(1, int(top * 0.85)))
        pool = [s for s, st in _filler_stems() if not (st & forbidden)]
        rng.shuffle(pool)
        # the topic sentence opens most answers; some open with their first point instead
        at = 1 if body and rng.random() < 0.3 else 0
        sentences = [*body[:at], intro, *body[at:]]
        words = count_words(" ".join(sentences))
        for s in pool:
            if words >= target:
                break
            sentences.append(s)
            words += count_words(s)
        return cap_words(sentences, cap)


@lru_cache(maxsize=1)
def _filler_stems() -> tuple[tuple[str, frozenset[str]], ...]:
    return tuple((s, frozenset(content_stems(s))) for s in _FILLER)


def _rng(body: dict[str, Any], index: int) -> random.Random:
    key = [body.get("model"), body.get("messages"), body.get("seed"), body.get("temperature")]
    blob = json.dumps([*key, index, "player"], sort_keys=True, default=str).encode()
    return random.Random(hashlib.sha256(blob).hexdigest())


def _sentences(text: str) -> list[str]:
    return [s.strip() for s in re.split(r"(?<=[.!?])\s+", text or "") if len(s.split()) >= 3]


def _find_array(schema: Any, root: dict[str, Any], name: str, depth: int = 0) -> dict | None:
    if depth > 8 or not isinstance(schema, dict):
        return None
    schema = _resolve(schema, root)
    for key, sub in (schema.get("properties") or {}).items():
        sub = _resolve(sub, root)
        if key == name and _kind(sub) == "array":
            return sub
        found = _find_array(sub, root, name, depth + 1)
        if found:
            return found
    return None
