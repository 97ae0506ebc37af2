"""judge: rubric-blind quality and rubric-aware coverage of every candidate, then pairwise
verdicts (rubric-aware and rubric-blind, both A/B orders) for the most promising
chosen x rejected combinations of each example. Every score keeps its rationale."""

from __future__ import annotations

import asyncio
from collections import Counter, defaultdict
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from pipeline.backends.base import ChatRequest
from pipeline.ids import pair_id
from pipeline.llm import Answer, json_validator
from pipeline.prompts import load_template
from pipeline.rundir import StageDir
from pipeline.stages.base import Context, Stage
from pipeline.stages.ingest import EXAMPLE_FIELDS
from pipeline.stages.responses import CANDIDATE_FIELDS
from pipeline.stages.rubrics import RUBRIC_FIELDS

TEMPLATES = {
    "quality": "judge_quality",
    "coverage": "judge_coverage",
    "pairwise_aware": "judge_pairwise_aware",
    "pairwise_blind": "judge_pairwise_blind",
}
JUDGE_FIELDS = {"example_id", "quality", "coverage", "pairwise"}
DIMENSIONS = ("correctness", "relevance", "helpfulness")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class QualityVerdict(_Strict):
    correctness_rationale: str
    correctness: int = Field(ge=1, le=5)
    relevance_rationale: str
    relevance: int = Field(ge=1, le=5)
    helpfulness_rationale: str
    helpfulness: int = Field(ge=1, le=5)


class ItemCoverage(_Strict):
    id: str
    rationale: str
    score: Literal[0, 1, 2]


class CoverageVerdict(_Strict):
    items: list[ItemCoverage]


class PairwiseVerdict(_Strict):
    rationale: str
    winner: Literal["A", "B", "tie"]


def pointwise_margin(
    chosen_cov: dict[str, int] | None,
    rejected_cov: dict[str, int] | None,
    violated: list[str],
    q_chosen: dict | None,
    q_rejected: dict | None,
) -> float:
    """How promising a pair looks before the pairwise judge: the chosen answer's mean
    coverage minus the rejected answer's mean coverage of the items it should violate,
    less a quarter point per unit of the largest quality difference."""
    if not chosen_cov or not rejected_cov or not q_chosen or not q_rejected:
        return float("-inf")
    cov_c = sum(chosen_cov.values()) / len(chosen_cov)
    v = [rejected_cov.get(i, 0) for i in violated] or [0]
    cov_r = sum(v) / len(v)
    gap = max(abs(q_chosen[d] - q_rejected[d]) for d in DIMENSIONS)
    return cov_c - cov_r - 0.25 * gap


class JudgeStage(Stage):
    name = "judge"
    requires = ("responses",)
    reads = {"ingest": EXAMPLE_FIELDS, "rubrics": RUBRIC_FIELDS, "responses": CANDIDATE_FIELDS}
    writes = JUDGE_FIELDS | {"provenance"}

    def settings(self, ctx: Context) -> dict[str, Any]:
        c = ctx.config
        return {
            "judge": c.judge.model_dump(mode="json"),
            "model": self.model(ctx),
            "seed": c.run.seed,
            "templates": {k: load_template(v).sha256 for k, v in TEMPLATES.items()},
            "schemas": {
                "quality": QualityVerdict.model_json_schema(),
                "coverage": CoverageVerdict.model_json_schema(),
                "pairwise": PairwiseVerdict.model_json_schema(),
            },
        }

    @staticmethod
    def model(ctx: Context) -> str:
        return ctx.config.judge.model or ctx.config.backend.model

    def expected(self, ctx: Context) -> int:
        return len({r["example_id"] for r in self.input_rows(ctx, "responses")})

    def run(self, ctx: Context, out: StageDir) -> dict[str, Any]:
        return asyncio.run(self._run(ctx, out))

    def _request(
        self, ctx: Context, kind: str, schema_model: type[BaseModel], **variables
    ) -> ChatRequest:
        s = ctx.config.judge.sampling
        return ChatRequest(
            messages=load_template(TEMPLATES[kind]).render(**variables),
            model=self.model(ctx),
            temperature=s.temperature,
            top_p=s.top_p,
            max_tokens=s.max_tokens,
            n=1,
            seed=ctx.config.run.seed,
            json_schema=schema_model.model_json_schema(),
            schema_name=schema_model.__name__,
        )

    async def _run(self, ctx: Context, out: StageDir) -> dict[str, Any]:
        done = out.done_examples()
        examples = {e["example_id"]: e for e in self.input_rows(ctx, "ingest")}
        rubrics = {r["example_id"]: r for r in self.input_rows(ctx, "rubrics")}
        by_example: dict[str, list[dict]] = defaultdict(list)
        for cand in self.input_rows(ctx, "responses"):
            if cand["example_id"] not in done:
                by_example[cand["example_id"]].append(cand)
        order = sorted(by_example)

        # ---- phase 1: pointwise quality and coverage of every candidate ----------------
        expected_ids: dict[str, list[str]] = {}

        def check_ids(req: ChatRequest, parsed: CoverageVerdict) -> None:
            want = expected_ids[req.key]
            got = [it.id for it in parsed.items]
            if sorted(got) != sorted(want):
                raise ValueError(f"items: expected ids {want}, got {got}")

        reqs: list[ChatRequest] = []
        meta: list[tuple[str, str, str]] = []  # (kind, example_id, candidate_id)
        for ex_id in order:
            q = examples[ex_id]["question"]
            items = rubrics[ex_id]["items"]
            for cand in by_example[ex_id]:
                reqs.append(
                    self._request(ctx, "quality", QualityVerdict, question=q, answer=cand["text"])
                )
                meta.append(("quality", ex_id, cand["candidate_id"]))
                creq = self._request(
                    ctx, "coverage", CoverageVerdict, question=q, answer=cand["text"], items=items
                )
                expected_ids[creq.key] = [it["item_id"] for it in items]
                reqs.append(creq)
                meta.append(("coverage", ex_id, cand["candidate_id"]))
        quality: dict[str, dict] = {}
        coverage: dict[str, dict] = {}
        pending: set[str] = set()
        validators = {
            "quality": json_validator(QualityVerdict),
            "coverage": json_validator(CoverageVerdict, check_ids),
        }

        def validate(req: ChatRequest, text: str) -> Any:
            kind = "coverage" if req.schema_name == "CoverageVerdict" else "quality"
            return validators[kind](req, text)

        async with ctx.llm(self.name) as runner:
            async for i, outcome in runner.stream(reqs, validate):
                kind, ex_id, cid = meta[i]
                target = quality if kind == "quality" else coverage
                if isinstance(outcome, Answer):
                    target[cid] = self._pointwise_row(kind, outcome)
                elif outcome.reason.startswith("invalid_json"):
                    target[cid] = {"parse_ok": False, "error": outcome.reason[:300]}
                else:
                    pending.add(ex_id)
            pointwise_stats = runner.stats.as_dict()

        # ---- phase 2: pairwise verdicts on the most promising combinations -------------
        preqs: list[ChatRequest] = []
        pmeta: list[tuple[str, int, str, str]] = []  # (example_id, pair index, kind, order)
        pairs: dict[str, list[dict]] = {}
        for ex_id in order:
            if ex_id in pending:
                continue
            pairs[ex_id] = self._shortlist(ctx, by_example[ex_id], quality, coverage)
            q = examples[ex_id]["question"]
            items = rubrics[ex_id]["items"]
            texts = {c["candidate_id"]: c["text"] for c in by_example[ex_id]}
            for pi, pair in enumerate(pairs[ex_id]):
                ch, rj = texts[pair["chosen_id"]], texts[pair["rejected_id"]]
                for kind in ("pairwise_aware", "pairwise_blind"):
                    extra = {"items": items} if kind == "pairwise_aware" else {}
                    for order_name, (a, b) in (("AB", (ch, rj)), ("BA", (rj, ch))):
                        preqs.append(
                            self._request(
                                ctx,
                                kind,
                                PairwiseVerdict,
                                question=q,
                                answer_a=a,
                                answer_b=b,
                                **extra,
                            )
                        )
                        pmeta.append((ex_id, pi, kind, order_name))
        outstanding = Counter(m[0] for m in pmeta)
        buffer: list[dict] = []
        chunk = ctx.config.responses.chunk_size

        def flush_ready(ex_id: str) -> None:
            nonlocal buffer
            if ex_id not in pending:
                buffer.append(
                    self._row(ctx, ex_id, by_example[ex_id], quality, coverage, pairs[ex_id])
                )
            if len(buffer) >= chunk:
                out.write_shard(buffer)
                buffer = []

        for ex_id in pairs:
            if outstanding[ex_id] == 0:
                flush_ready(ex_id)
        async with ctx.llm(self.name) as runner:
            async for i, outcome in runner.stream(preqs, json_validator(PairwiseVerdict)):
                ex_id, pi, kind, order_name = pmeta[i]
                verdicts = pairs[ex_id][pi].setdefault(kind, {})
                if isinstance(outcome, Answer):
                    v: PairwiseVerdict = outcome.parsed[0]
                    # map the position back to the pair's sides
                    prefers = {"tie": "tie"}
                    prefers["A"] = "chosen" if order_name == "AB" else "rejected"
                    prefers["B"] = "rejected" if order_name == "AB" else "chosen"
                    verdicts[order_name] = {
                        "winner": v.winner,
                        "prefers": prefers[v.winner],
                        "rationale": v.rationale,
                        "parse_ok": True,
                        "request_key": outcome.request.key,
                    }
                elif outcome.reason.startswith("invalid_json"):
                    verdicts[order_name] = {"parse_ok": False, "error": outcome.reason[:300]}
                else:
                    pending.add(ex_id)
                outstanding[ex_id] -= 1
                if outstanding[ex_id] == 0:
                    flush_ready(ex_id)
            pairwise_stats = runner.stats.as_dict()
        if buffer:
            out.write_shard(buffer)

        rows = list(out.rows())
        return {
            "examples": len(rows),
            "candidates_judged": sum(len(r["quality"]) for r in rows),
            "pairs_judged": sum(len(r["pairwise"]) for r in rows),
            "parse_failures": sum(
                1
                for r in rows
                for d in (r["quality"], r["coverage"])
                for v in d.values()
                if not v.get("parse_ok")
            ),
            "resumed_examples": len(done),
            "pending_examples": len(pending),
            "llm": {
                "pointwise": pointwise_stats,
                "pairwise": pairwise_stats,
                "failure_reasons": {
                    **pointwise_stats["failure_reasons"],
                    **pairwise_stats["failure_reasons"],
                },
            },
        }

    @staticmethod
    def _pointwise_row(kind: str, ans: Answer) -> dict[str, Any]:
        v = ans.parsed[0]
        row: dict[str, Any] = {
            "parse_ok": True,
            "request_key": ans.request.key,
            "reasks": ans.reasks,
        }
        if kind == "quality":
            for d in DIMENSIONS:
                row[d] = getattr(v, d)
            row["rationale"] = {d: getattr(v, f"{d}_rationale") for d in DIMENSIONS}
        else:
            row["scores"] = {it.id: it.score for it in v.items}
            row["rationale"] = {it.id: it.rationale for it in v.items}
        return row

    def _shortlist(
        self, ctx: Context, cands: list[dict], quality: dict, coverage: dict
    ) -> list[dict]:
        chosen = [c for c in cands if c["side"] == "chosen"]
        rejected = [c for c in cands if c["side"] == "rejected"]
        scored = []
        for ch in chosen:
            for rj in rejected:
                qc, qr = quality.get(ch["candidate_id"]), quality.get(rj["candidate_id"])
                cc, cr = coverage.get(ch["candidate_id"]), coverage.get(rj["candidate_id"])
                ok = all(x and x.get("parse_ok") for x in (qc, qr, cc, cr))
                margin = pointwise_margin(
                    cc["scores"] if ok else None,
                    cr["scores"] if ok else None,
                    rj["violates"],
                    qc if ok else None,
                    qr if ok else None,
                )
                scored.append((-margin, ch["candidate_id"], rj["candidate_id"], margin))
        scored.sort()
        k = ctx.config.judge.max_pairs_per_example
        ex_id = cands[0]["example_id"] if cands else ""
        return [
            {
                "pair_id": pair_id(ex_id, c_id, r_id),
                "chosen_id": c_id,
                "rejected_id": r_id,
                "pointwise_margin": None if m == float("-inf") else round(m, 4),
            }
            for _, c_id, r_id, m in scored[:k]
        ]

    def _row(
        self,
        ctx: Context,
        ex_id: str,
        cands: list[dict],
        quality: dict,
        coverage: dict,
        pairs: list[dict],
    ) -> dict[str, Any]:
        ids = [c["candidate_id"] for c in cands]
        return {
            "example_id": ex_id,
            "quality": {i: quality[i] for i in ids if i in quality},
            "coverage": {i: coverage[i] for i in ids if i in coverage},
            "pairwise": pairs,
            "provenance": {
                "model": self.model(ctx),
                "sampling": ctx.config.judge.sampling.model_dump(),
                "seed": ctx.config.run.seed,
                "templates": {k: load_template(v).provenance() for k, v in TEMPLATES.items()},
            },
        }
