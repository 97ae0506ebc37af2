"""responses: n chosen candidates per example and n rejected ones per strategy.

Strategies for the rejected side:
- ``avoid_all``: a good answer that avoids every expected aspect (the reference method);
- ``violate_one``: covers every aspect but one targeted aspect (harder pairs);
- ``other_user``: follows the rubric of another user who asked a similar question.

All of a stage's requests go to the backend at once, so the server sees a full queue
to the end; an example's rows are written as soon as its last request is answered.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass
from typing import Any

from rapidfuzz import fuzz, process

from pipeline.backends.base import ChatRequest
from pipeline.ids import stable_id
from pipeline.llm import Answer
from pipeline.profile import select_profile
from pipeline.prompts import PromptTemplate, load_template
from pipeline.rundir import StageDir
from pipeline.stages.base import Context, Stage
from pipeline.stages.ingest import EXAMPLE_FIELDS
from pipeline.stages.rubrics import RUBRIC_FIELDS

TEMPLATES = {
    "chosen": "response_chosen",
    "avoid_all": "response_avoid_all",
    "violate_one": "response_violate_one",
    "other_user": "response_other_user",
}
CANDIDATE_FIELDS = {
    "candidate_id",
    "example_id",
    "user_id",
    "rubric_version",
    "side",
    "strategy",
    "sample_index",
    "text",
    "finish_reason",
    "honours",
    "violates",
}


def derive_seed(*parts: Any) -> int:
    """A per-request seed from the run seed and the request's identity (fits in int32)."""
    return int(stable_id(*parts, length=8), 16) % (2**31 - 1)


def find_donors(
    examples: list[dict], rubrics: dict[str, dict], block: int = 1024
) -> dict[str, str | None]:
    """For each example, the example of a *different* user with the most similar question.

    Same-category donors are preferred (a bonus of 10 points); ties go to the smaller id,
    so the choice is deterministic. Scored in blocks to bound memory on large inputs.
    """
    import numpy as np

    # sorted by id, so argmax (the first maximum) breaks ties by the smallest id
    pool = sorted(
        (e for e in examples if e["example_id"] in rubrics), key=lambda e: e["example_id"]
    )
    questions = [e["question"] for e in pool]
    users = np.array([e["user_id"] for e in pool], dtype=object)
    cats = np.array([str(e.get("category")) for e in pool], dtype=object)
    donors: dict[str, str | None] = {}
    for start in range(0, len(pool), block):
        chunk = pool[start : start + block]
        scores = process.cdist(
            [e["question"] for e in chunk], questions, scorer=fuzz.token_set_ratio, workers=-1
        ).astype(np.float32)
        for row, ex in zip(scores, chunk, strict=True):
            row = row + np.where(cats == str(ex.get("category")), 10.0, 0.0)
            row[users == ex["user_id"]] = -1.0
            j = int(np.argmax(row)) if len(row) else -1
            donors[ex["example_id"]] = pool[j]["example_id"] if j >= 0 and row[j] >= 0 else None
    return donors


@dataclass
class _Job:
    example_index: int
    strategy: str
    sample_offset: int  # sample index of the first choice of this request
    template: PromptTemplate
    honours: list[str]
    violates: list[str]
    extra: dict[str, Any]


class ResponseStage(Stage):
    name = "responses"
    requires = ("rubrics",)
    reads = {"ingest": EXAMPLE_FIELDS, "rubrics": RUBRIC_FIELDS}
    writes = CANDIDATE_FIELDS | {"provenance"}

    def settings(self, ctx: Context) -> dict[str, Any]:
        c = ctx.config
        names = ["chosen", *c.responses.strategies]
        return {
            "responses": c.responses.model_dump(mode="json"),
            "profile": c.profile.model_dump(mode="json"),
            "model": c.backend.model,
            "seed": c.run.seed,
            "templates": {n: load_template(TEMPLATES[n]).sha256 for n in names},
        }

    def expected(self, ctx: Context) -> int:
        return sum(1 for _ in self.input_rows(ctx, "rubrics"))

    def run(self, ctx: Context, out: StageDir) -> dict[str, Any]:
        return asyncio.run(self._run(ctx, out))

    def build_jobs(
        self, ctx: Context, examples: list[dict], todo: list[dict], rubrics: dict[str, dict]
    ) -> tuple[list[ChatRequest], list[_Job], Counter]:
        c = ctx.config
        r = c.responses
        samp = r.sampling
        by_id = {e["example_id"]: e for e in examples}
        donors = find_donors(examples, rubrics) if "other_user" in r.strategies else {}
        requests: list[ChatRequest] = []
        jobs: list[_Job] = []
        skipped: Counter = Counter()

        def add(
            ei: int,
            strategy: str,
            offset: int,
            n: int,
            tmpl: PromptTemplate,
            msgs: tuple,
            honours: list[str],
            violates: list[str],
            extra: dict | None = None,
        ) -> None:
            ex = todo[ei]
            seed = derive_seed(c.run.seed, ex["example_id"], strategy, offset)
            requests.append(
                ChatRequest(
                    messages=msgs,
                    model=c.backend.model,
                    temperature=samp.temperature,
                    top_p=samp.top_p,
                    max_tokens=samp.max_tokens,
                    n=n,
                    seed=seed,
                )
            )
            jobs.append(_Job(ei, strategy, offset, tmpl, honours, violates, extra or {}))

        for ei, ex in enumerate(todo):
            rub = rubrics[ex["example_id"]]
            items = rub["items"]
            ids = [it["item_id"] for it in items]
            profile = select_profile(
                ex["question"],
                ex["profile"],
                c.profile.top_k,
                c.profile.ranker,
                c.profile.embedding_model,
            )
            common = {"question": ex["question"], "profile": profile, "word_cap": r.word_cap}
            t = load_template(TEMPLATES["chosen"])
            add(ei, "chosen", 0, r.n, t, t.render(items=items, **common), ids, [])
            for strategy in r.strategies:
                t = load_template(TEMPLATES[strategy])
                if strategy == "avoid_all":
                    add(ei, strategy, 0, r.n, t, t.render(items=items, **common), [], ids)
                elif strategy == "violate_one":
                    if len(items) < 2:
                        skipped["violate_one_single_item_rubric"] += 1
                        continue
                    # rotate the target so the n samples spread over different items
                    start = int(stable_id(ex["example_id"], "target", length=8), 16)
                    for j in range(r.n):
                        target = items[(start + j) % len(items)]
                        keep = [it for it in items if it["item_id"] != target["item_id"]]
                        msgs = t.render(keep=keep, target=target, **common)
                        add(
                            ei,
                            strategy,
                            j,
                            1,
                            t,
                            msgs,
                            [it["item_id"] for it in keep],
                            [target["item_id"]],
                            {"target_item": target["item_id"]},
                        )
                elif strategy == "other_user":
                    donor_id = donors.get(ex["example_id"])
                    if donor_id is None:
                        skipped["other_user_no_donor"] += 1
                        continue
                    donor = rubrics[donor_id]
                    msgs = t.render(other_items=donor["items"], **common)
                    add(
                        ei,
                        strategy,
                        0,
                        r.n,
                        t,
                        msgs,
                        [],
                        ids,
                        {
                            "other_user": {
                                "user_id": by_id[donor_id]["user_id"],
                                "example_id": donor_id,
                                "rubric_version": donor["rubric_version"],
                                "item_ids": [it["item_id"] for it in donor["items"]],
                            }
                        },
                    )
        return requests, jobs, skipped

    def _rows(
        self, ctx: Context, ex: dict, rub: dict, job: _Job, req: ChatRequest, ans: Answer
    ) -> list[dict]:
        c = ctx.config
        rows = []
        for k, choice in enumerate(ans.result.choices):
            sample = job.sample_offset + k
            side = "chosen" if job.strategy == "chosen" else "rejected"
            rows.append(
                {
                    "candidate_id": stable_id(
                        ex["example_id"],
                        rub["rubric_version"],
                        job.strategy,
                        job.extra.get("target_item"),
                        sample,
                    ),
                    "example_id": ex["example_id"],
                    "user_id": ex["user_id"],
                    "rubric_version": rub["rubric_version"],
                    "side": side,
                    "strategy": job.strategy,
                    "sample_index": sample,
                    "text": choice.text,
                    "finish_reason": choice.finish_reason,
                    "word_count": len(choice.text.split()),
                    "honours": job.honours,
                    "violates": job.violates,
                    **job.extra,
                    "provenance": {
                        **job.template.provenance(),
                        "model": ans.result.model or c.backend.model,
                        "sampling": c.responses.sampling.model_dump(),
                        "seed": req.seed,
                        "n": req.n,
                        "request_key": req.key,
                        # usage is per request; a request with n choices shares it
                        "usage": {
                            "prompt_tokens": ans.result.prompt_tokens,
                            "completion_tokens": ans.result.completion_tokens,
                        },
                    },
                }
            )
        return rows

    async def _run(self, ctx: Context, out: StageDir) -> dict[str, Any]:
        c = ctx.config
        done = out.done_examples()
        examples = list(self.input_rows(ctx, "ingest"))
        rubrics = {r["example_id"]: r for r in self.input_rows(ctx, "rubrics")}
        todo = [e for e in examples if e["example_id"] in rubrics and e["example_id"] not in done]
        requests, jobs, skipped = self.build_jobs(ctx, examples, todo, rubrics)

        outstanding = Counter(j.example_index for j in jobs)
        failed: set[int] = set()
        partial: dict[int, list[dict]] = {}
        buffer: list[dict] = []
        buffered_examples = 0
        chunk = c.responses.chunk_size
        async with ctx.llm(self.name) as runner:
            async for i, outcome in runner.stream(requests):
                job = jobs[i]
                ei = job.example_index
                if isinstance(outcome, Answer):
                    ex = todo[ei]
                    partial.setdefault(ei, []).extend(
                        self._rows(ctx, ex, rubrics[ex["example_id"]], job, requests[i], outcome)
                    )
                else:
                    failed.add(ei)
                outstanding[ei] -= 1
                if outstanding[ei] == 0:
                    rows = partial.pop(ei, [])
                    if ei not in failed:
                        buffer.extend(
                            sorted(rows, key=lambda r: (r["strategy"], r["sample_index"]))
                        )
                        buffered_examples += 1
                    if buffered_examples >= chunk:
                        out.write_shard(buffer)
                        buffer, buffered_examples = [], 0
            llm_stats = runner.stats.as_dict()
        if buffer:
            out.write_shard(buffer)
        return self._stats(out, llm_stats, len(done), len(failed), skipped)

    def _stats(
        self, out: StageDir, llm: dict, resumed: int, pending: int, skipped: Counter
    ) -> dict[str, Any]:
        per_strategy: Counter = Counter()
        finish: Counter = Counter()
        examples = set()
        for r in out.rows():
            per_strategy[r["strategy"]] += 1
            finish[r["finish_reason"]] += 1
            examples.add(r["example_id"])
        return {
            "examples": len(examples),
            "candidates": sum(per_strategy.values()),
            "per_strategy": dict(per_strategy),
            "finish_reasons": dict(finish),
            "skipped": dict(skipped),
            "resumed_examples": resumed,
            "pending_examples": pending,
            "llm": llm,
        }
