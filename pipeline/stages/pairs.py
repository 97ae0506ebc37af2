"""pairs: one chosen/rejected pair per example, or a drop with reason codes.

Each judged combination runs through the configured filters in order; the first filter
that drops it gives its reason. Of the combinations that pass, the one with the best
margin is kept. An example none of whose combinations pass is dropped with the reason
of the combination that got furthest, and every combination's reason is kept on disk.
Set-level filters (near-duplicates across the set) run last over the kept pairs.

Margin = the chosen answer's mean coverage minus the rejected answer's mean coverage of
its violated items, plus a quarter point for each rubric-blind verdict that does not
prefer the chosen, minus a quarter point per unit of the largest quality gap.
"""

from __future__ import annotations

import math
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pipeline.filters import DIMENSIONS, FILTERS, PairFilter, PairView, word_similarity
from pipeline.ids import pair_id
from pipeline.io import dumps, loads
from pipeline.rundir import StageDir
from pipeline.stages.base import Context, Stage
from pipeline.stages.ingest import EXAMPLE_FIELDS
from pipeline.stages.judge import JUDGE_FIELDS
from pipeline.stages.responses import CANDIDATE_FIELDS
from pipeline.stages.rubrics import RUBRIC_FIELDS

PAIR_FIELDS = {
    "pair_id",
    "example_id",
    "user_id",
    "question",
    "category",
    "chosen",
    "rejected",
    "chosen_id",
    "rejected_id",
    "strategy",
    "violated_item_ids",
    "rubric_version",
    "margin",
}


def margin(view: PairView) -> float:
    qc, qr = view.quality_chosen, view.quality_rejected
    cov_chosen, cov_rejected = view.coverage_chosen, view.coverage_rejected
    if not (qc and qr and cov_chosen and cov_rejected) or not all(
        x.get("parse_ok") for x in (qc, qr, cov_chosen, cov_rejected)
    ):
        return float("-inf")  # nothing to rank by (possible only without judge_parse)
    cc, cr = cov_chosen["scores"], cov_rejected["scores"]
    cov_c = sum(cc.values()) / max(len(cc), 1)
    violated = view.rejected.get("violates") or list(cr)
    cov_r = sum(cr.get(i, 0) for i in violated) / max(len(violated), 1)
    blind = view.pairwise.get("pairwise_blind", {})
    not_leaky = sum(1 for o in ("AB", "BA") if blind.get(o, {}).get("prefers") != "chosen")
    gap = max(abs(qc[d] - qr[d]) for d in DIMENSIONS)
    return round(cov_c - cov_r + 0.25 * not_leaky - 0.25 * gap, 4)


class PairStage(Stage):
    name = "pairs"
    requires = ("judge",)
    reads = {
        "ingest": EXAMPLE_FIELDS,
        "rubrics": RUBRIC_FIELDS,
        "responses": CANDIDATE_FIELDS,
        "judge": JUDGE_FIELDS,
    }
    writes = PAIR_FIELDS | {"judge", "provenance"}
    # no LLM calls: a stage cut short is re-done from its start, never appended to
    resumable = False

    def settings(self, ctx: Context) -> dict[str, Any]:
        return {
            "pairs": ctx.config.pairs.model_dump(mode="json"),
            "word_cap": ctx.config.responses.word_cap,
        }

    def expected(self, ctx: Context) -> int:
        return sum(1 for _ in self.input_rows(ctx, "judge"))

    def filters(self, ctx: Context) -> list[PairFilter]:
        cfg = ctx.config
        return [FILTERS.get(n)(cfg.pairs, cfg.responses.word_cap) for n in cfg.pairs.filters]

    def run(self, ctx: Context, out: StageDir) -> dict[str, Any]:
        filters = self.filters(ctx)
        pair_filters = [f for f in filters if not f.set_level]
        set_filters = [f for f in filters if f.set_level]
        # light per-example fields (the profile only as text, for the set-level filters)
        want_profile = bool(set_filters)
        examples: dict[str, dict] = {}
        for e in self.input_rows(ctx, "ingest"):
            examples[e["example_id"]] = {
                "example_id": e["example_id"],
                "source_id": e.get("source_id"),
                "user_id": e["user_id"],
                "question": e["question"],
                "category": e.get("category"),
                # interned: the examples of one user mostly share one profile text
                "profile": sys.intern("\n".join(p.get("text", "") for p in e.get("profile") or []))
                if want_profile
                else None,
            }
        rubrics = {r["example_id"]: r for r in self.input_rows(ctx, "rubrics")}
        # candidates are read per example through an index, not held all at once
        cands_of = self.input_stage(ctx, "responses").index("example_id")

        kept_tmp = out.path / ".pass1-kept.jsonl.tmp"
        rejects_tmp = out.path / ".pass1-rejects.jsonl.tmp"
        views: list[dict] = []  # what the set-level filters see of each kept pair
        pair_drops: Counter = Counter()
        dropped: Counter = Counter()
        strategies: Counter = Counter()
        pairs_seen = kept_n = 0
        with (
            open(kept_tmp, "wb") as kept_fh,
            open(rejects_tmp, "wb") as rej_fh,
        ):
            for judged in self.input_rows(ctx, "judge"):
                ex_id = judged["example_id"]
                ex, rub = examples[ex_id], rubrics[ex_id]
                cands = {c["candidate_id"]: c for c in cands_of.get(ex_id)}
                passing: list[tuple[float, PairView, dict]] = []
                outcomes = []
                for p in judged["pairwise"]:
                    pairs_seen += 1
                    view = PairView(
                        example=ex,
                        rubric=rub,
                        chosen=cands[p["chosen_id"]],
                        rejected=cands[p["rejected_id"]],
                        quality_chosen=judged["quality"].get(p["chosen_id"]),
                        quality_rejected=judged["quality"].get(p["rejected_id"]),
                        coverage_chosen=judged["coverage"].get(p["chosen_id"]),
                        coverage_rejected=judged["coverage"].get(p["rejected_id"]),
                        pairwise={k: p.get(k, {}) for k in ("pairwise_aware", "pairwise_blind")},
                    )
                    reason, detail, passed = None, None, 0
                    for f in pair_filters:
                        ok, why = f.check(view)
                        if not ok:
                            reason, detail = f.name, why
                            break
                        passed += 1
                    if reason is None:
                        passing.append((margin(view), view, p))
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
                    passing.sort(key=lambda t: (-t[0], t[2]["pair_id"]))
                    m, view, p = passing[0]
                    row = self._pair_row(ex, rub, view, p, m, judged)
                    kept_fh.write(dumps(row) + b"\n")
                    kept_n += 1
                    views.append(
                        {k: row[k] for k in ("example_id", "user_id", "question", "chosen",
                                             "rejected")} | {"profile": ex["profile"]}
                    )  # fmt: skip
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

        set_drops: Counter = Counter()
        drops: dict[str, tuple[str, str]] = {}  # example_id -> (filter, detail)
        for f in set_filters:
            found = f.apply([v for v in views if v["example_id"] not in drops])
            for ex_id, why in found.items():
                drops.setdefault(ex_id, (f.name, why))
        del views

        chunk = ctx.config.responses.chunk_size
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
            "pairs_judged": pairs_seen,
            "pairs_dropped_by_filter": dict(pair_drops),
            "set_level_drops": dict(set_drops),
            "kept_by_strategy": dict(strategies),
        }

    @staticmethod
    def _pair_row(ex: dict, rub: dict, view: PairView, p: dict, m: float, judged: dict) -> dict:
        ch, rj = view.chosen, view.rejected
        return {
            "pair_id": pair_id(ex["example_id"], ch["candidate_id"], rj["candidate_id"]),
            "example_id": ex["example_id"],
            "source_id": ex.get("source_id"),
            "user_id": ex["user_id"],
            "question": ex["question"],
            "category": ex.get("category"),
            "chosen": ch["text"],
            "rejected": rj["text"],
            "chosen_id": ch["candidate_id"],
            "rejected_id": rj["candidate_id"],
            "strategy": rj["strategy"],
            "violated_item_ids": rj.get("violates", []),
            "rubric_version": rub["rubric_version"],
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


def _read_lines(path: Path) -> Iterator[dict]:
    with open(path, "rb") as fh:
        for line in fh:
            yield loads(line)
