"""A verification round's tasks, built from a run's kept pairs without any server.

A round samples ``annotation.sample_size`` kept pairs, spread over strata (category,
rejected strategy, judge confidence) in proportion to their size, skipping pairs sent in
earlier rounds, and adds attention checks with a known answer: ``annotation.gold_tasks``
for a full round, the same share of a smaller one (:func:`gold_count`).
Every choice is derived from hashes of the round's seed (``run.seed + round``) and the
pair ids, so the same run and round give the same tasks in any order of input rows, and
a re-export recognises what it already sent.

Each task shows the pair's answers as A and B; which side is A is drawn per task from
the seed and recorded in the task (``a_side``: "chosen" or "rejected"), so annotations
map back to chosen/rejected without trusting the display order.
"""

from __future__ import annotations

import functools
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.core.errors import StageError
from pipeline.core.ids import stable_id
from pipeline.core.io import read_json
from pipeline.core.resources import data_dir
from pipeline.rules.verdicts import shown_side
from pipeline.run import RunDir, check_round_number
from pipeline.types.records import ranked_posts

LABEL_CONFIG_FILE = "labeling_config.xml"
PROFILE_POSTS = 3  # posts shown to the annotator: enough for a sense of the user, quick to read
POST_CHARS = 280
CONFIDENCE_LEVELS = ("low", "mid", "high")
# The labeling config's choice values -> labels after mapping A/B back to the pair's sides.
CHOICES = ("A", "B", "tie", "both bad")
FLAGS = {"general quality differs": "general_quality_differs", "rubric unclear": "rubric_unclear"}
# Control names in annotation/labeling_config.xml.
CHOICE_CONTROL = "choice"
FLAGS_CONTROL = "flags"
CONFIDENCE_CONTROL = "confidence"
COMMENT_CONTROL = "comment"


def label_config() -> str:
    """The Label Studio labeling config (annotation/labeling_config.xml)."""
    return (data_dir("annotation") / LABEL_CONFIG_FILE).read_text(encoding="utf-8")


GUIDELINES_FILE = "guidelines.md"


def guidelines_html() -> str:
    """annotation/guidelines.md as the HTML Label Studio shows annotators (a project's
    ``expert_instruction``, opened before the first task and from the labeling page)."""
    text = (data_dir("annotation") / GUIDELINES_FILE).read_text(encoding="utf-8")
    return markdown_html(text)


def _inline(text: str) -> str:
    import html
    import re

    out = html.escape(text, quote=False)
    out = re.sub(r"`([^`]+)`", r"<code>\1</code>", out)
    out = re.sub(r"\*\*(.+?)\*\*", r"<strong>\1</strong>", out)
    return re.sub(r"(?<![*\w])\*([^*\s][^*]*?)\*(?![*\w])", r"<em>\1</em>", out)


def markdown_html(text: str) -> str:
    """The Markdown the guidelines use, as HTML: headings, paragraphs, bullet and numbered
    lists (an item may run over several lines), pipe tables, bold, italics and code.
    Everything else is escaped text: nothing in the file becomes markup by accident."""
    import re

    blocks: list[str] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if not line.strip():
            i += 1
            continue
        heading = re.match(r"^(#{1,6})\s+(.*)$", line)
        if heading:
            n = len(heading.group(1))
            blocks.append(f"<h{n}>{_inline(heading.group(2).strip())}</h{n}>")
            i += 1
            continue
        if line.lstrip().startswith("|"):
            rows = []
            while i < len(lines) and lines[i].lstrip().startswith("|"):
                cells = [c.strip() for c in lines[i].strip().strip("|").split("|")]
                if not all(re.fullmatch(r":?-+:?", c) for c in cells):
                    rows.append(cells)
                i += 1
            head, *body = rows
            html_rows = ["<tr>" + "".join(f"<th>{_inline(c)}</th>" for c in head) + "</tr>"]
            html_rows += [
                "<tr>" + "".join(f"<td>{_inline(c)}</td>" for c in r) + "</tr>" for r in body
            ]
            # <tbody> written out: Label Studio's sanitizer adds it, so what the server
            # keeps is what was sent
            blocks.append("<table><tbody>" + "".join(html_rows) + "</tbody></table>")
            continue
        item = re.match(r"^(-|\d+\.)\s+(.*)$", line)
        if item:
            tag = "ul" if item.group(1) == "-" else "ol"
            items: list[str] = []
            while i < len(lines) and lines[i].strip():
                m = re.match(r"^(-|\d+\.)\s+(.*)$", lines[i])
                if m:
                    items.append(m.group(2).strip())
                else:
                    items[-1] += " " + lines[i].strip()
                i += 1
            blocks.append(
                f"<{tag}>" + "".join(f"<li>{_inline(x)}</li>" for x in items) + f"</{tag}>"
            )
            continue
        para = []
        while (
            i < len(lines) and lines[i].strip() and not re.match(r"^(#|\||-\s|\d+\.\s)", lines[i])
        ):
            para.append(lines[i].strip())
            i += 1
        blocks.append(f"<p>{_inline(' '.join(para))}</p>")
    return "\n".join(blocks)


def project_title(run_dir: str | Path, round_no: int) -> str:
    """The round's project title; the export finds an existing project by it."""
    return f"prb {Path(run_dir).resolve().name} round {round_no}"


def round_seed(base_seed: int, round_no: int) -> int:
    return base_seed + round_no


def task_key(pair_id: str, gold: bool = False) -> str:
    """Stable identity of a task within a round: the pair id, or ``gold:<pair_id>``."""
    return f"gold:{pair_id}" if gold else pair_id


def _rank(seed: int, *parts: Any) -> str:
    # A hash instead of random.shuffle: each item's place depends only on the seed and
    # its own id, never on how many other rows there are or in which order they came.
    return stable_id(seed, *parts)


def _decoy_rank(seed: Any, base_id: str, q: dict[str, Any]) -> Any:
    """Order of the candidate distractors for a gold task, seeded by the base pair."""
    return _rank(seed, "decoy", base_id, q["pair_id"])


def a_side_for(key: str, seed: int) -> str:
    """Which of the pair's answers is shown as A for this task: "chosen" or "rejected"."""
    return "chosen" if int(_rank(seed, "ab", key)[:8], 16) % 2 == 0 else "rejected"


def map_choice(choice: str, a_side: str) -> str:
    """A/B/tie/both bad as clicked -> chosen/rejected/tie/both_bad for the pair."""
    c = choice.strip().lower()
    if c in ("a", "b"):
        return shown_side(c.upper(), a_side)
    if c == "tie":
        return "tie"
    if c.replace("_", " ") == "both bad":
        return "both_bad"
    raise ValueError(f"unknown choice {choice!r} (expected one of {', '.join(CHOICES)})")


# ---- the run's data ------------------------------------------------------------------------


@dataclass
class RunData:
    """The run's kept pairs, each a full pair record (pipeline/types/records.py)."""

    pairs: list[dict]

    @property
    def by_pair(self) -> dict[str, dict]:
        return {p["pair_id"]: p for p in self.pairs}


def load_run(run_dir: str | Path) -> RunData:
    """Kept pairs of the finished, verified pair stage (a sample drawn from a stage still
    being written would change once it finishes)."""
    rd = RunDir(run_dir)
    pairs = list(rd.pair_records())
    if not pairs:
        raise StageError(
            f"{rd.stage('pairs').path}: the pair stage kept no pairs; there is nothing to "
            "annotate (`prb inspect RUN` lists why each example was dropped)"
        )
    return RunData(pairs=pairs)


def sent_pair_ids(run_dir: str | Path, round_no: int) -> set[str]:
    """Pair ids shown as real (non-gold) tasks in rounds before ``round_no``."""
    sent: set[str] = set()
    for rnd in RunDir(run_dir).rounds():
        if rnd.number < round_no and rnd.tasks.exists():
            tasks = read_json(rnd.tasks)
            sent.update(t["data"]["pair_id"] for t in tasks if not t["data"].get("gold"))
    return sent


# ---- sampling ------------------------------------------------------------------------------


def confidence_levels(pairs: Sequence[dict]) -> dict[str, str]:
    """Tercile of the judge margin per pair: "low", "mid" or "high".

    Rank-based (ties broken by pair id) so the three groups are equal in size even when
    many pairs share a margin, and computed over all kept pairs so a pair keeps its level
    from round to round.
    """
    order = sorted(pairs, key=lambda p: (float(p.get("margin") or 0.0), p["pair_id"]))
    n = len(order)
    return {p["pair_id"]: CONFIDENCE_LEVELS[min(3 * i // n, 2)] for i, p in enumerate(order)}


def stratum(pair: dict, keys: Sequence[str], levels: dict[str, str]) -> tuple[str, ...]:
    out = []
    for k in keys:
        if k == "confidence":
            out.append(f"confidence={levels[pair['pair_id']]}")
        else:
            out.append(f"{k}={pair.get(k)}")
    return tuple(out)


def allocate(sizes: dict[tuple, int], n: int, seed: int) -> dict[tuple, int]:
    """Proportional allocation of ``n`` over strata (largest remainder, seeded tie-break)."""
    total = sum(sizes.values())
    n = min(n, total)
    if total == 0:
        return {k: 0 for k in sizes}
    exact = {k: n * s / total for k, s in sizes.items()}
    quota = {k: int(v) for k, v in exact.items()}
    left = n - sum(quota.values())
    by_remainder = sorted(sizes, key=lambda k: (-(exact[k] - quota[k]), _rank(seed, "alloc", k)))
    for k in by_remainder[:left]:
        quota[k] += 1
    return quota


@dataclass
class Sample:
    pairs: list[dict]
    strata: dict[str, dict[str, int]] = field(default_factory=dict)


def stratified_sample(
    pairs: Sequence[dict],
    n: int,
    keys: Sequence[str],
    seed: int,
    *,
    exclude: Iterable[str] = (),
    levels: dict[str, str] | None = None,
) -> Sample:
    """``n`` pairs spread over the strata in proportion to their size; deterministic."""
    levels = levels if levels is not None else confidence_levels(pairs)
    skip = set(exclude)
    groups: dict[tuple, list[dict]] = defaultdict(list)
    population: Counter = Counter()
    for p in pairs:
        s = stratum(p, keys, levels)
        population[s] += 1
        if p["pair_id"] not in skip:
            groups[s].append(p)
    quota = allocate({s: len(g) for s, g in groups.items()}, n, seed)
    chosen: list[dict] = []
    strata: dict[str, dict[str, int]] = {}
    for s in sorted(population):
        g = sorted(groups.get(s, []), key=lambda p: _rank(seed, "sample", p["pair_id"]))
        take = g[: quota.get(s, 0)]
        chosen.extend(take)
        strata["|".join(s) or "all"] = {
            "population": population[s],
            "eligible": len(g),
            "sampled": len(take),
        }
    chosen.sort(key=lambda p: p["pair_id"])
    return Sample(pairs=chosen, strata=strata)


def gold_count(gold_tasks: int, pairs: int, sample_size: int) -> int:
    """Gold tasks in a round of ``pairs`` pair tasks: ``annotation.gold_tasks`` is the
    count for a full round of ``sample_size`` pairs (10 in 200 by default: one task in 21);
    a smaller round (a small run, the last pairs left) keeps that share, rounded up, so it
    has at least one while it has a pair and never more gold than the share says: a
    10-pair round gets 1, not 10."""
    if gold_tasks <= 0 or pairs <= 0:
        return 0
    if pairs >= sample_size:
        return gold_tasks
    return -(-gold_tasks * pairs // sample_size)


def _shown_texts(pair: dict) -> set[str]:
    """What a pair's own task shows that could give a gold task away: its question and
    both answers (whitespace-normalised)."""
    return {" ".join(str(pair.get(k) or "").split()) for k in ("question", "chosen", "rejected")}


def pick_gold(
    pairs: Sequence[dict],
    n: int,
    seed: int,
    *,
    shown: Sequence[dict] = (),
    avoid: Iterable[str] = (),
) -> list[tuple[dict, dict]]:
    """Up to ``n`` (base pair, distractor pair) couples for attention checks, from pairs
    outside the round.

    A gold task shows a base pair's question and chosen answer beside a distractor's chosen
    answer to an unrelated question (another category; another example when the run has
    one category only). None of the three may appear in the round's other tasks (``shown``:
    the round's pairs) or in another gold task, so a gold task never repeats a real task's
    question or answers two tasks apart; each pair serves one gold task at most. Pairs of
    earlier rounds (``avoid``) are used after the others. Fewer than ``n`` when the pairs
    outside the round run out (:func:`gold_shortfall` says why)."""
    if n <= 0:
        return []
    avoid = set(avoid)
    taken = {p["pair_id"] for p in shown}
    seen: set[str] = set()
    for p in shown:
        seen |= _shown_texts(p)
    ranked = sorted(pairs, key=lambda p: _rank(seed, "gold", p["pair_id"]))
    pool = [p for p in ranked if p["pair_id"] not in taken and p["pair_id"] not in avoid]
    pool += [p for p in ranked if p["pair_id"] not in taken and p["pair_id"] in avoid]

    def text(p: dict, k: str) -> str:
        return " ".join(str(p.get(k) or "").split())

    out: list[tuple[dict, dict]] = []
    for base in pool:
        if len(out) == n:
            break
        shows = {text(base, "question"), text(base, "chosen")}
        if base["pair_id"] in taken or shows & seen:
            continue
        free = [
            q
            for q in pool
            if q["pair_id"] not in taken
            and q["pair_id"] != base["pair_id"]
            and text(q, "chosen") not in seen | shows
            and text(q, "question") != text(base, "question")
        ]
        others = [q for q in free if q.get("category") != base.get("category")]
        if not others:
            others = [q for q in free if q["example_id"] != base["example_id"]]
        if not others:
            continue
        distractor = min(others, key=functools.partial(_decoy_rank, seed, base["pair_id"]))
        out.append((base, distractor))
        taken |= {base["pair_id"], distractor["pair_id"]}
        seen |= shows | {text(distractor, "chosen")}
    return out


def gold_shortfall(wanted: int, made: int, pairs: int, in_round: int) -> str | None:
    """Why a round has fewer gold tasks than ``annotation.gold_tasks`` gives it, in one
    line (printed by the export and kept in the round's export.json); None when it has
    them all."""
    if made >= wanted:
        return None
    outside = pairs - in_round
    if made == 0:
        head = "no gold attention check in this round"
    else:
        head = f"{made} of {wanted} gold attention checks in this round"
    return (
        f"{head}: a gold task is made of two kept pairs outside the round (its question and "
        f"answers must not appear in the round's other tasks), and {outside} of the run's "
        f"{pairs} kept pairs {'is' if outside == 1 else 'are'} outside it; a smaller "
        f"annotation.sample_size leaves pairs for them"
    )


# ---- what the annotator sees ---------------------------------------------------------------


def _clip(text: str, limit: int) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def profile_view(record: dict, k: int = PROFILE_POSTS, chars: int = POST_CHARS) -> str:
    """The user's ``k`` posts most relevant to the question, in the run's own ranking
    (the configured ranker's, computed once at ingest), shortened."""
    top = [p for p in ranked_posts(record, k) if str(p.get("text", "")).strip()]
    if not top:
        return "(no past posts)"
    return "\n".join(f"- {_clip(p['text'], chars)}" for p in top)


def rubric_view(record: dict) -> str:
    items = (record.get("rubric") or {}).get("items") or []
    if not items:
        return "(no rubric items)"
    return "\n".join(f"{i}. {it['aspect']}" for i, it in enumerate(items, 1))


# Fields that give the answer away: they stay in the local sides.json and never reach the
# server or tasks.json, since Label Studio's task table shows every data field to annotators.
PRIVATE_FIELDS = ("a_side", "expected")


def public_task(task: dict[str, Any]) -> dict[str, Any]:
    """The task as annotators may see it: without the A/B side or a gold task's answer."""
    return {**task, "data": {k: v for k, v in task["data"].items() if k not in PRIVATE_FIELDS}}


def sides_of(tasks: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """task_key -> the private fields (a_side, and expected for gold tasks)."""
    return {
        t["data"]["task_key"]: {k: t["data"][k] for k in PRIVATE_FIELDS if k in t["data"]}
        for t in tasks
    }


def make_task(
    pair: dict,
    *,
    round_no: int,
    seed: int,
    distractor: dict | None = None,
) -> dict[str, Any]:
    """One Label Studio task (``{"data": {...}}``) for a pair, or a gold task when
    ``distractor`` is given (its chosen answer plays the rejected side)."""
    gold = distractor is not None
    key = task_key(pair["pair_id"], gold)
    side = a_side_for(key, seed)
    chosen = pair["chosen"]
    rejected = distractor["chosen"] if distractor is not None else pair["rejected"]
    a, b = (chosen, rejected) if side == "chosen" else (rejected, chosen)
    data: dict[str, Any] = {
        "task_key": key,
        "pair_id": pair["pair_id"],
        "round": round_no,
        "gold": gold,
        "a_side": side,
        "question": pair["question"],
        "profile": profile_view(pair),
        "rubric": rubric_view(pair),
        "answer_a": a,
        "answer_b": b,
    }
    if distractor is not None:
        # the on-topic answer is the pair's chosen one: the right click is its letter
        data["expected"] = "A" if side == "chosen" else "B"
        data["distractor_pair_id"] = distractor["pair_id"]
    return {"data": data}


# ---- a whole round -------------------------------------------------------------------------


@dataclass
class RoundPlan:
    round_no: int
    seed: int
    tasks: list[dict]
    strata: dict[str, dict[str, int]]
    excluded: int
    n_pairs: int
    n_gold: int
    gold_note: str | None = None  # why it has fewer gold tasks than asked (gold_shortfall)

    def keys(self) -> list[str]:
        return [t["data"]["task_key"] for t in self.tasks]


def build_round(
    run_dir: str | Path,
    round_no: int,
    *,
    sample_size: int,
    stratify_by: Sequence[str],
    gold_tasks: int,
    base_seed: int,
    data: RunData | None = None,
) -> RoundPlan:
    """Sample, add gold tasks, randomise A/B; tasks come in a seeded order that mixes gold in."""
    check_round_number(round_no)
    data = data or load_run(run_dir)
    seed = round_seed(base_seed, round_no)
    levels = confidence_levels(data.pairs)
    earlier = sent_pair_ids(run_dir, round_no)
    sample = stratified_sample(
        data.pairs, sample_size, stratify_by, seed, exclude=earlier, levels=levels
    )
    n_gold = gold_count(gold_tasks, len(sample.pairs), sample_size)
    gold = pick_gold(data.pairs, n_gold, seed, shown=sample.pairs, avoid=earlier)

    tasks = [make_task(p, round_no=round_no, seed=seed) for p in sample.pairs]
    for base, decoy in gold:
        tasks.append(make_task(base, round_no=round_no, seed=seed, distractor=decoy))
    # Label Studio serves tasks in import order: a seeded order keeps gold from bunching.
    tasks.sort(key=lambda t: _rank(seed, "order", t["data"]["task_key"]))
    return RoundPlan(
        round_no=round_no,
        seed=seed,
        tasks=tasks,
        strata=sample.strata,
        excluded=len(earlier),
        n_pairs=len(sample.pairs),
        n_gold=len(gold),
        gold_note=gold_shortfall(n_gold, len(gold), len(data.pairs), len(sample.pairs)),
    )
