"""pairs: one chosen/rejected pair per example, or a drop with reason codes.

Each judged combination runs through the configured filters in order
(``pipeline.rules.run_filters``); the first filter that drops it gives its reason. Of the
combinations that pass, the one with the best margin (``PairView.margin``) is kept; ties
go to the smaller pair id. An example none of whose combinations pass is dropped with the
reason of the combination that got furthest, and every combination's reason is kept on
disk. Set-level filters (near-duplicates across the set) run last over the kept pairs.

The judge asks only what can still change the kept pair (``pipeline/stages/judge.py``): a
combination it stopped asking about because one it judged already outranks it is passed
over here (``pairs_outranked``); one whose verdicts it did not ask because an earlier
filter drops it is dropped here by that filter, with the same reason.

A kept pair is written as a full pair record (``pipeline/types/records.py``): the example, its
profile and the run's ranking of it, the rubric, both answers, the judge's verdicts and the
provenance, so every command after this stage reads one record and joins nothing.
"""

from __future__ import annotations

import math
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pipeline.core.ids import pair_id
from pipeline.core.io import dumps, loads
from pipeline.rules import PairRule, PairView, RuleSet, run_filters, word_similarity
from pipeline.rules.dedup import profile_text
from pipeline.run import StageDir
from pipeline.stages.base import Context, Stage
from pipeline.types.records import PAIR_RECORD_FIELDS

PAIRWISE = ("pairwise_aware", "pairwise_blind")
# a combination the judge did not ask about: one it judged passes with a margin this one
# cannot reach (pipeline/stages/judge.py)
OUTRANKED = "outranked"


def pick(passing: list[tuple[float, str]]) -> int:
    """Index of the combination to keep among those that passed every filter, given as
    (margin, pair_id): the best margin, ties to the smaller pair id."""
    return min(range(len(passing)), key=lambda i: (-passing[i][0], passing[i][1]))


class PairStage(Stage):
    name = "pairs"
    reads = {
        "ingest": frozenset(
            {"example_id", "source_id", "user_id", "question", "category", "narrative",
             "profile", "profile_view"}
        ),
        "rubrics": frozenset({"example_id", "rubric_version", "source", "items"}),
        "responses": frozenset(
            {"candidate_id", "example_id", "text", "strategy", "violates", "honours",
             "finish_reason", "provenance"}
        ),
        "judge": frozenset({"example_id", "quality", "coverage", "pairwise", "provenance"}),
    }  # fmt: skip
    writes = PAIR_RECORD_FIELDS
    # no LLM calls: a stage cut short is re-done from its start, never appended to
    resumable = False

    def settings(self, ctx: Context) -> dict[str, Any]:
        return {
            "pairs": ctx.config.pairs.model_dump(mode="json"),
            "word_cap": ctx.config.responses.word_cap,
        }

    def expected(self, ctx: Context) -> int:
        return self.input_count(ctx, "judge")  # one row per example

    @staticmethod
    def filters(ctx: Context) -> list[PairRule]:
        """The run's filters: its rules (``pairs`` thresholds and the answers' word cap,
        built once per run) in ``pairs.filters`` order."""
        rules = RuleSet(ctx.config.pairs, ctx.config.responses.word_cap)
        return rules.filters(ctx.config.pairs.filters)

    def run(self, ctx: Context, out: StageDir) -> dict[str, Any]:
        filters = self.filters(ctx)
        pair_filters = [f for f in filters if not f.set_level]
        set_filters = [f for f in filters if f.set_level]
        # examples, rubrics and candidates are read per judged example through an index
        # (where each example's rows sit in the shards), never held all at once: memory
        # stays flat in the input's size but for these offsets; each row is seen through
        # the stage's declared reads
        examples = self.input_index(ctx, "ingest")
        rubrics = self.input_index(ctx, "rubrics")
        cands_of = self.input_index(ctx, "responses")

        kept_tmp = out.path / ".pass1-kept.jsonl.tmp"
        rejects_tmp = out.path / ".pass1-rejects.jsonl.tmp"
        pair_drops: Counter = Counter()
        dropped: Counter = Counter()
        strategies: Counter = Counter()
        pairs_judged = pairs_unjudged = pairs_outranked = kept_n = 0
        with (
            open(kept_tmp, "wb") as kept_fh,
            open(rejects_tmp, "wb") as rej_fh,
        ):
            for judged in self.input_rows(ctx, "judge"):
                ex_id = judged["example_id"]
                (ex,) = examples.get(ex_id)
                (rub,) = rubrics.get(ex_id)
                cands = {c["candidate_id"]: c for c in cands_of.get(ex_id)}
                passing: list[tuple[float, PairView, dict]] = []
                outcomes = []
                unjudged = (judged.get("provenance") or {}).get("judged") is False
                for p in judged["pairwise"]:
                    if p.get("not_asked") == OUTRANKED:
                        pairs_outranked += 1
                        continue
                    if unjudged:  # the judge is off (judge.enabled: false): no verdicts
                        pairs_unjudged += 1
                    else:
                        pairs_judged += 1
                    view = PairView(
                        example=ex,
                        rubric=rub,
                        chosen=cands[p["chosen_id"]],
                        rejected=cands[p["rejected_id"]],
                        quality_chosen=judged["quality"].get(p["chosen_id"]),
                        quality_rejected=judged["quality"].get(p["rejected_id"]),
                        coverage_chosen=judged["coverage"].get(p["chosen_id"]),
                        coverage_rejected=judged["coverage"].get(p["rejected_id"]),
                        pairwise={k: p.get(k, {}) for k in PAIRWISE},
                        pending=frozenset(k for k in PAIRWISE if k not in p),
                    )
                    reason, detail, passed, undecided = run_filters(pair_filters, view)
                    if undecided:  # the judge did not ask what this filter reads
                        detail = "not judged: the verdicts this filter reads were not asked"
                    if reason is None:
                        passing.append((view.margin(), view, p))
                    else:
                        pair_drops[reason] += 1
                    outcomes.append(
                        {
                            "chosen_id": p["chosen_id"],
                            "rejected_id": p["rejected_id"],
                            "strategy": view.rejected["strategy"],
                            "reason": reason,
                            "detail": detail,
                            "filters_passed": passed,
                        }
                    )
                if passing:
                    best = pick([(m, p["pair_id"]) for m, _, p in passing])
                    m, view, p = passing[best]
                    row = self.record(ex, rub, view, m, judged)
                    kept_fh.write(dumps(row) + b"\n")
                    kept_n += 1
                else:
                    furthest = max(outcomes, key=lambda o: o["filters_passed"], default=None)
                    reason = furthest["reason"] if furthest else "no_pairs"
                    dropped[reason] += 1
                    rej = {
                        "example_id": ex_id,
                        "user_id": ex["user_id"],
                        "reason": reason,
                        "detail": furthest["detail"] if furthest else "no judged combination",
                        "pairs": outcomes,
                    }
                    rej_fh.write(dumps(rej) + b"\n")

        del examples, rubrics, cands_of
        set_drops: Counter = Counter()
        drops: dict[str, tuple[str, str]] = {}  # example_id -> (filter, detail)
        if set_filters:
            # a set-level filter compares every kept pair with every other, so it needs
            # them all at once; it gets only the fields it reads, from the kept pairs
            # written above, after the per-example state is gone
            views = [_view(row) for row in _read_lines(kept_tmp)]
            for f in set_filters:
                found = f.apply([v for v in views if v["example_id"] not in drops])
                for ex_id, why in found.items():
                    drops.setdefault(ex_id, (f.name, why))
            del views

        chunk = self.shard_size(ctx)
        buffer: list[dict] = []
        set_rejects: list[dict] = []
        for row in _read_lines(kept_tmp):
            hit = drops.get(row["example_id"])
            if hit is None:
                buffer.append(row)
                strategies[row["strategy"]] += 1
                if len(buffer) >= chunk:
                    out.write_shard(buffer)
                    buffer = []
                continue
            name, why = hit
            set_drops[name] += 1
            dropped[name] += 1
            set_rejects.append(
                {
                    "example_id": row["example_id"],
                    "user_id": row["user_id"],
                    "reason": name,
                    "detail": why,
                    "pairs": [
                        {
                            "chosen_id": row["chosen_id"],
                            "rejected_id": row["rejected_id"],
                            "strategy": row["strategy"],
                            "reason": name,
                            "detail": why,
                        }
                    ],
                }
            )
        out.write_shard(buffer, set_rejects)
        batch: list[dict] = []
        for rej in _read_lines(rejects_tmp):
            batch.append(rej)
            if len(batch) >= chunk:
                out.write_shard([], batch)
                batch = []
        if batch:
            out.write_shard([], batch)
        kept_tmp.unlink()
        rejects_tmp.unlink()

        n_kept = kept_n - sum(set_drops.values())
        n_dropped = sum(dropped.values())
        names = {f.name for f in filters}
        return {
            "examples": n_kept + n_dropped,
            "kept": n_kept,
            "dropped": n_dropped,
            "dropped_by_reason": {f.name: dropped.get(f.name, 0) for f in filters}
            | {k: v for k, v in dropped.items() if k not in names},
            "pairs_judged": pairs_judged,
            **({"pairs_unjudged": pairs_unjudged} if pairs_unjudged else {}),
            **({"pairs_outranked": pairs_outranked} if pairs_outranked else {}),
            "pairs_dropped_by_filter": dict(pair_drops),
            "set_level_drops": dict(set_drops),
            "kept_by_strategy": dict(strategies),
        }

    @staticmethod
    def record(ex: dict, rub: dict, view: PairView, m: float, judged: dict) -> dict:
        """The pair record of a kept pair (pipeline/types/records.py)."""
        ch, rj = view.chosen, view.rejected
        return {
            "pair_id": pair_id(ex["example_id"], ch["candidate_id"], rj["candidate_id"]),
            "example_id": ex["example_id"],
            "source_id": ex.get("source_id"),
            "user_id": ex["user_id"],
            "question": ex["question"],
            "category": ex.get("category"),
            "narrative": ex.get("narrative"),
            "profile": [
                {"id": p.get("id"), "category": p.get("category"), "text": p.get("text")}
                for p in ex.get("profile") or []
            ],
            "profile_view": ex["profile_view"],
            "rubric": {
                "version": rub["rubric_version"],
                "source": rub.get("source"),
                "items": [
                    {k: it.get(k) for k in ("item_id", "aspect", "evidence", "reason")}
                    for it in rub["items"]
                ],
            },
            "rubric_version": rub["rubric_version"],
            "chosen": ch["text"],
            "rejected": rj["text"],
            "chosen_id": ch["candidate_id"],
            "rejected_id": rj["candidate_id"],
            "strategy": rj["strategy"],
            "violated_item_ids": rj.get("violates", []),
            "finish_reasons": {
                "chosen": ch.get("finish_reason"),
                "rejected": rj.get("finish_reason"),
            },
            "margin": m if math.isfinite(m) else None,
            "similarity": round(word_similarity(ch["text"], rj["text"]), 2),
            "judge": {
                "quality": {"chosen": view.quality_chosen, "rejected": view.quality_rejected},
                "coverage": {
                    "chosen": (view.coverage_chosen or {}).get("scores"),
                    "rejected": (view.coverage_rejected or {}).get("scores"),
                },
                "pairwise": view.pairwise,
            },
            "provenance": {
                "generator": {"chosen": ch.get("provenance"), "rejected": rj.get("provenance")},
                "judge": judged.get("provenance"),
            },
        }


def _view(row: dict) -> dict:
    """What the set-level filters see of a kept pair record."""
    return {k: row[k] for k in ("example_id", "user_id", "question", "chosen", "rejected")} | {
        # interned: the examples of one user mostly share one profile
        "profile": sys.intern(profile_text(row["profile"]) or "")
    }


def _read_lines(path: Path) -> Iterator[dict]:
    with open(path, "rb") as fh:
        for line in fh:
            yield loads(line)
