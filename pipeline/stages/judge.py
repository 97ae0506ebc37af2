"""judge: rubric-blind quality and rubric-aware coverage of every candidate, then pairwise
verdicts (rubric-aware and rubric-blind, both A/B orders) for the most promising
chosen x rejected combinations of each example. Every score keeps its rationale.

The stage streams: an example's pointwise requests go out as its candidates are read from
the responses shards; once they are answered, its shortlist's pairwise requests are pushed
ahead of the remaining input, and its row is written when the last verdict is in. Memory
holds the examples in flight, not the stage.

A finished example's row is also kept in the cache's ``derived`` table under a hash of
everything it was computed from (the stage's settings, the example's question, rubric items
and candidate rows): a re-run over the same inputs, whose answers are all cached, takes the
row from there instead of rebuilding, looking up and re-validating each of its requests.
Only rows whose every verdict parsed are kept there, so a failure is always asked again.

Every verdict answers a closed JSON schema (pipeline/schemas.py): scores and winners first
as bounded integers and enums, coverage keyed by the rubric's own item ids, rationales
with a maxLength that fits the request's max_tokens.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from pipeline import schemas
from pipeline.chat import ChatRequest
from pipeline.fields import DIMENSIONS
from pipeline.ids import content_hash, pair_id
from pipeline.io import dumps_sorted
from pipeline.llm import Answer, Failure, Job, LLMRunner
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
SCHEMA_NAMES = {
    "quality": "QualityVerdict",
    "coverage": "CoverageVerdict",
    "pairwise_aware": "PairwiseVerdict",
    "pairwise_blind": "PairwiseVerdict",
}
JUDGE_FIELDS = {"example_id", "quality", "coverage", "pairwise"}
ORDERS = ("AB", "BA")
# the kind of the judge's finished rows in the cache's derived table; bump the version
# when a row's layout changes
MEMO_KIND = "judge_row/1"


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


@dataclass
class _Open:
    """An example whose verdicts are in flight."""

    example_id: str
    question: str
    items: list[dict[str, str]]
    cands: list[dict]
    quality: dict[str, dict] = field(default_factory=dict)
    coverage: dict[str, dict] = field(default_factory=dict)
    pairs: list[dict] = field(default_factory=list)
    outstanding: int = 0
    pending: bool = False
    memo_key: str = ""
    requests: int = 0  # jobs of this example (pointwise and pairwise)
    reasks: int = 0
    failed: bool = False  # a verdict stayed invalid: the row is written, never memoized


class JudgeStage(Stage):
    name = "judge"
    requires = ("responses",)
    reads = {"ingest": EXAMPLE_FIELDS, "rubrics": RUBRIC_FIELDS, "responses": CANDIDATE_FIELDS}
    writes = JUDGE_FIELDS | {"provenance"}

    def uses_llm(self, ctx: Context) -> bool:
        return True

    def settings(self, ctx: Context) -> dict[str, Any]:
        c = ctx.config
        m = c.judge.sampling.max_tokens
        cap = c.judge.rationale_max_chars
        return {
            "judge": c.judge.model_dump(mode="json"),
            "model": self.model(ctx),
            "seed": c.run.seed,
            "templates": {k: load_template(v).sha256 for k, v in TEMPLATES.items()},
            "schemas": {
                "quality": schemas.quality_schema(m, cap),
                "pairwise": schemas.pairwise_schema(m, cap),
                "coverage": schemas.coverage_schema(["ITEM_ID"], m, cap)[0],
            },
        }

    @staticmethod
    def model(ctx: Context) -> str:
        return ctx.config.judge.model or ctx.config.backend.model

    def memo_salt(self, ctx: Context) -> str:
        """What a finished row depends on besides its example's inputs: the stage's
        settings and the runner settings that decide when an invalid verdict is final."""
        b = ctx.config.backend
        return content_hash(
            {
                "kind": MEMO_KIND,
                "settings": self.settings(ctx),
                "max_reasks": b.max_reasks,
                "invalid_retry_runs": b.invalid_retry_runs,
            }
        )

    @staticmethod
    def memo_key(
        salt: str, questions: dict[str, str], items: dict[str, list], cands: list[dict]
    ) -> str:
        """The hash of everything one example's row is computed from."""
        ex_id = cands[0]["example_id"]
        h = hashlib.sha256(salt.encode())
        h.update(dumps_sorted([ex_id, questions[ex_id], items[ex_id], cands]))
        return h.hexdigest()

    def expected(self, ctx: Context) -> int:
        return len({r["example_id"] for r in self.input_rows(ctx, "responses")})

    def run(self, ctx: Context, out: StageDir) -> dict[str, Any]:
        return asyncio.run(self._run(ctx, out))

    # ---- requests ----------------------------------------------------------------------
    def _request(
        self,
        ctx: Context,
        kind: str,
        schema: dict[str, Any],
        max_tokens: int | None = None,
        **variables: Any,
    ) -> ChatRequest:
        s = ctx.config.judge.sampling
        return ChatRequest(
            messages=load_template(TEMPLATES[kind]).render(**variables),
            model=self.model(ctx),
            temperature=s.temperature,
            top_p=s.top_p,
            max_tokens=max_tokens or s.max_tokens,
            n=1,
            seed=ctx.config.run.seed,
            json_schema=schema,
            schema_name=SCHEMA_NAMES[kind],
        )

    @staticmethod
    def _validator(schema: dict[str, Any]) -> Any:
        def validate(req: ChatRequest, text: str) -> Any:
            return schemas.parse(schema, text)

        return validate

    def _pointwise_jobs(self, ctx: Context, st: _Open) -> Iterator[Job]:
        c = ctx.config
        m, cap = c.judge.sampling.max_tokens, c.judge.rationale_max_chars
        q_schema = schemas.quality_schema(m, cap)
        ids = [it["item_id"] for it in st.items]
        c_schema, c_tokens = schemas.coverage_schema(ids, m, cap)
        for cand in st.cands:
            cid = cand["candidate_id"]
            req = self._request(ctx, "quality", q_schema, question=st.question, answer=cand["text"])
            yield Job(req, (st.example_id, "quality", cid), self._validator(q_schema))
            req = self._request(
                ctx, "coverage", c_schema, c_tokens,
                question=st.question, answer=cand["text"], items=st.items,
            )  # fmt: skip
            yield Job(req, (st.example_id, "coverage", cid), self._validator(c_schema))

    def _pairwise_jobs(self, ctx: Context, st: _Open) -> list[Job]:
        c = ctx.config
        p_schema = schemas.pairwise_schema(c.judge.sampling.max_tokens, c.judge.rationale_max_chars)
        validate = self._validator(p_schema)
        texts = {cand["candidate_id"]: cand["text"] for cand in st.cands}
        jobs = []
        for pi, pair in enumerate(st.pairs):
            ch, rj = texts[pair["chosen_id"]], texts[pair["rejected_id"]]
            for kind in ("pairwise_aware", "pairwise_blind"):
                extra: dict[str, Any] = {"items": st.items} if kind == "pairwise_aware" else {}
                for order, (a, b) in zip(ORDERS, ((ch, rj), (rj, ch)), strict=True):
                    req = self._request(
                        ctx, kind, p_schema, question=st.question, answer_a=a, answer_b=b, **extra
                    )
                    jobs.append(Job(req, (st.example_id, "pair", (pi, kind, order)), validate))
        return jobs

    # ---- the stage ---------------------------------------------------------------------
    async def _run(self, ctx: Context, out: StageDir) -> dict[str, Any]:
        c = ctx.config
        done = out.done_examples()
        # what prompts need, per example: the question and the rubric items (id, aspect)
        questions = {e["example_id"]: e["question"] for e in self.input_rows(ctx, "ingest")}
        items = {
            r["example_id"]: [{"item_id": i["item_id"], "aspect": i["aspect"]} for i in r["items"]]
            for r in self.input_rows(ctx, "rubrics")
        }
        open_examples: dict[str, _Open] = {}
        n_examples = self.expected(ctx) - len(done)
        salt = self.memo_salt(ctx)

        def grouped() -> Iterator[list[dict]]:
            """Candidates of one example at a time (a shard holds an example's rows
            together)."""
            current: list[dict] = []
            for cand in self.input_rows(ctx, "responses"):
                if current and cand["example_id"] != current[0]["example_id"]:
                    yield current
                    current = []
                current.append(cand)
            if current:
                yield current

        buffer: list[dict] = []
        memo_new: list[tuple[str, str, Any]] = []
        memo_hits = 0
        pending = 0
        chunk = c.responses.chunk_size
        # progress: the pointwise requests (two per candidate) are known from the config;
        # the pairwise ones are counted as they are pushed
        per_example = 2 * c.responses.n * (1 + len(c.responses.strategies))

        def flush() -> None:
            nonlocal buffer, memo_new
            if buffer:
                out.write_shard(buffer)  # the rows first: a memo never precedes its row
                buffer = []
            if memo_new:
                ctx.cache.put_derived_many(memo_new)
                memo_new = []

        def emit(row: dict[str, Any]) -> None:
            buffer.append(row)
            if len(buffer) >= chunk:
                flush()

        def jobs(runner: LLMRunner) -> Iterator[Job]:
            nonlocal memo_hits
            block: list[list[dict]] = []
            for cands in itertools.chain(grouped(), [None]):
                if cands is not None:
                    if cands[0]["example_id"] not in done:
                        block.append(cands)
                    if len(block) < runner.lookup_batch // 2:
                        continue
                keys = [self.memo_key(salt, questions, items, cs) for cs in block]
                memos = ctx.cache.get_derived_many(keys)
                for cs, mkey in zip(block, keys, strict=True):
                    ex_id = cs[0]["example_id"]
                    memo = memos.get(mkey)
                    if memo is not None:
                        runner.replayed(memo["requests"], memo["reasks"], expected=per_example)
                        memo_hits += 1
                        emit(memo["row"])
                        continue
                    st = _Open(
                        ex_id, questions[ex_id], items[ex_id], cs,
                        outstanding=2 * len(cs), memo_key=mkey, requests=2 * len(cs),
                    )  # fmt: skip
                    open_examples[ex_id] = st
                    yield from self._pointwise_jobs(ctx, st)
                block = []

        try:
            async with ctx.llm(self.name) as runner:
                async for (ex_id, kind, key), outcome in runner.run(
                    jobs(runner), total=n_examples * per_example
                ):
                    st = open_examples[ex_id]
                    if isinstance(outcome, Failure):
                        if outcome.final:
                            st.failed = True
                        else:
                            st.pending = True  # retried on the next run
                    else:
                        st.reasks += outcome.reasks
                    if st.pending:
                        pass  # nothing of it is written this run
                    elif kind == "pair":
                        self._record_pairwise(st, key, outcome)
                    else:
                        target = st.quality if kind == "quality" else st.coverage
                        target[key] = self._pointwise_row(kind, outcome)
                    st.outstanding -= 1
                    if st.outstanding:
                        continue
                    if kind != "pair" and not st.pending:
                        # pointwise complete: ask for the shortlist's pairwise verdicts
                        st.pairs = self._shortlist(ctx, st)
                        follow = self._pairwise_jobs(ctx, st)
                        if follow:
                            st.outstanding = len(follow)
                            st.requests += len(follow)
                            for job in follow:
                                runner.push(job)
                            continue
                    del open_examples[ex_id]
                    if st.pending:
                        pending += 1
                        continue
                    row = self._row(ctx, st)
                    if not st.failed:
                        memo = {"row": row, "requests": st.requests, "reasks": st.reasks}
                        memo_new.append((st.memo_key, MEMO_KIND, memo))
                    emit(row)
                llm_stats = runner.stats.as_dict()
        finally:
            flush()  # finished examples are kept, also when the stage stops early

        examples = candidates = pairs_judged = parse_failures = 0
        for r in out.rows():
            examples += 1
            candidates += len(r["quality"])
            pairs_judged += len(r["pairwise"])
            parse_failures += sum(
                1 for d in (r["quality"], r["coverage"]) for v in d.values() if not v["parse_ok"]
            )
        return {
            "examples": examples,
            "candidates_judged": candidates,
            "pairs_judged": pairs_judged,
            "parse_failures": parse_failures,
            "resumed_examples": len(done),
            "pending_examples": pending,
            "rows_from_cache": memo_hits,
            "llm": llm_stats,
        }

    @staticmethod
    def _record_pairwise(st: _Open, key: tuple, outcome: Answer | Failure) -> None:
        pi, kind, order = key
        verdicts = st.pairs[pi].setdefault(kind, {})
        if isinstance(outcome, Failure):
            verdicts[order] = {"parse_ok": False, "error": outcome.reason[:300]}
            return
        v = outcome.parsed[0]
        # map the position back to the pair's sides
        prefers = {"tie": "tie"}
        prefers["A"] = "chosen" if order == "AB" else "rejected"
        prefers["B"] = "rejected" if order == "AB" else "chosen"
        verdicts[order] = {
            "winner": v["winner"],
            "prefers": prefers[v["winner"]],
            "rationale": v["rationale"],
            "parse_ok": True,
            "request_key": outcome.request.key,
        }

    @staticmethod
    def _pointwise_row(kind: str, outcome: Answer | Failure) -> dict[str, Any]:
        if isinstance(outcome, Failure):  # final: invalid after every re-ask and retry
            return {"parse_ok": False, "error": outcome.reason[:300]}
        v = outcome.parsed[0]
        row: dict[str, Any] = {
            "parse_ok": True,
            "request_key": outcome.request.key,
            "reasks": outcome.reasks,
        }
        if kind == "quality":
            for d in DIMENSIONS:
                row[d] = v[d]
            row["rationale"] = {d: v[f"{d}_rationale"] for d in DIMENSIONS}
        else:
            row["scores"] = dict(v["scores"])
            row["rationale"] = dict(v["rationales"])
        return row

    def _shortlist(self, ctx: Context, st: _Open) -> list[dict]:
        chosen = [c for c in st.cands if c["side"] == "chosen"]
        rejected = [c for c in st.cands if c["side"] == "rejected"]
        scored = []
        for ch in chosen:
            for rj in rejected:
                qc, qr = st.quality.get(ch["candidate_id"]), st.quality.get(rj["candidate_id"])
                cc, cr = st.coverage.get(ch["candidate_id"]), st.coverage.get(rj["candidate_id"])
                if qc and qr and cc and cr and all(x.get("parse_ok") for x in (qc, qr, cc, cr)):
                    margin = pointwise_margin(cc["scores"], cr["scores"], rj["violates"], qc, qr)
                else:
                    margin = float("-inf")
                scored.append((-margin, ch["candidate_id"], rj["candidate_id"], margin))
        scored.sort()
        k = ctx.config.judge.max_pairs_per_example
        return [
            {
                "pair_id": pair_id(st.example_id, c_id, r_id),
                "chosen_id": c_id,
                "rejected_id": r_id,
                "pointwise_margin": None if m == float("-inf") else round(m, 4),
            }
            for _, c_id, r_id, m in scored[:k]
        ]

    def _row(self, ctx: Context, st: _Open) -> dict[str, Any]:
        ids = [c["candidate_id"] for c in st.cands]
        return {
            "example_id": st.example_id,
            "quality": {i: st.quality[i] for i in ids if i in st.quality},
            "coverage": {i: st.coverage[i] for i in ids if i in st.coverage},
            "pairwise": st.pairs,
            "provenance": {
                "model": self.model(ctx),
                "sampling": ctx.config.judge.sampling.model_dump(),
                "seed": ctx.config.run.seed,
                "templates": {k: load_template(v).provenance() for k, v in TEMPLATES.items()},
            },
        }
