"""rubrics: one versioned rubric per example, given by the input or derived by the LLM."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from rapidfuzz import fuzz

from pipeline.backends.base import ChatRequest
from pipeline.ids import content_hash, stable_id
from pipeline.llm import json_validator
from pipeline.profile import select_profile
from pipeline.prompts import load_template
from pipeline.resources import data_dir
from pipeline.rundir import StageDir
from pipeline.stages.base import Context, Stage
from pipeline.stages.ingest import EXAMPLE_FIELDS

TEMPLATE = "rubric_generate"
RUBRIC_FIELDS = {"example_id", "user_id", "rubric_version", "source", "items"}


class _Aspect(BaseModel):
    model_config = ConfigDict(extra="forbid")
    aspect: str = Field(min_length=3)
    evidence: str
    reason: str


class _Rubric(BaseModel):
    model_config = ConfigDict(extra="forbid")
    aspects: list[_Aspect]


def rubric_schema(min_items: int, max_items: int) -> dict[str, Any]:
    schema = json.loads((data_dir("rubrics") / "rubric.schema.json").read_text(encoding="utf-8"))
    schema["properties"]["aspects"]["minItems"] = min_items
    schema["properties"]["aspects"]["maxItems"] = max_items
    return schema


def merge_items(items: list[dict[str, str]], threshold: float) -> tuple[list[dict], list[dict]]:
    """Drop items whose aspect is near-identical to an earlier one; returns (kept, merged)."""
    kept: list[dict] = []
    merged: list[dict] = []
    for item in items:
        dup = next(
            (
                k
                for k in kept
                if fuzz.token_set_ratio(item["aspect"].lower(), k["aspect"].lower()) >= threshold
            ),
            None,
        )
        if dup is None:
            kept.append(item)
        else:
            merged.append({"aspect": item["aspect"], "into": dup["aspect"]})
    return kept, merged


def make_rubric_row(
    example: dict, items: list[dict], source: str, provenance: dict[str, Any]
) -> dict[str, Any]:
    """Give items stable ids and the rubric a version hash of its content."""
    ex_id = example["example_id"]
    with_ids = []
    seen: set[str] = set()
    for it in items:
        item_id = "a" + stable_id(ex_id, " ".join(it["aspect"].lower().split()), length=10)
        if item_id in seen:  # identical aspect text twice: keep the first
            continue
        seen.add(item_id)
        with_ids.append(
            {
                "item_id": item_id,
                "aspect": it["aspect"].strip(),
                "evidence": (it.get("evidence") or "").strip(),
                "reason": (it.get("reason") or "").strip(),
            }
        )
    version = content_hash(
        {
            "source": source,
            "items": with_ids,
            "template_hash": provenance.get("template_hash"),
            "model": provenance.get("model"),
        },
        length=12,
    )
    return {
        "example_id": ex_id,
        "user_id": example["user_id"],
        "rubric_version": version,
        "source": source,
        "items": with_ids,
        "provenance": provenance,
    }


def _reject(example: dict, reason: str, detail: str) -> dict[str, Any]:
    return {
        "example_id": example["example_id"],
        "user_id": example["user_id"],
        "reason": reason,
        "detail": detail[:500],
    }


class RubricStage(Stage):
    name = "rubrics"
    requires = ("ingest",)
    reads = {"ingest": EXAMPLE_FIELDS}
    writes = RUBRIC_FIELDS | {"provenance"}

    def settings(self, ctx: Context) -> dict[str, Any]:
        c = ctx.config
        s: dict[str, Any] = {"rubrics": c.rubrics.model_dump(mode="json")}
        if c.rubrics.source == "generated":
            s["model"] = c.backend.model
            s["profile"] = c.profile.model_dump(mode="json")
            s["template_hash"] = load_template(TEMPLATE).sha256
            s["seed"] = c.run.seed
            s["schema"] = rubric_schema(c.rubrics.min_items, c.rubrics.max_items)
        return s

    def expected(self, ctx: Context) -> int:
        return sum(1 for _ in self.input_rows(ctx, "ingest"))

    def run(self, ctx: Context, out: StageDir) -> dict[str, Any]:
        done = out.done_examples()
        examples = [e for e in self.input_rows(ctx, "ingest") if e["example_id"] not in done]
        if ctx.config.rubrics.source == "given":
            return self._given(ctx, out, examples, len(done))
        return asyncio.run(self._generated(ctx, out, examples, len(done)))

    def _finish_items(
        self, ctx: Context, example: dict, raw: list[dict], source: str, prov: dict
    ) -> tuple[dict | None, dict | None]:
        r = ctx.config.rubrics
        kept, merged = merge_items(raw, r.merge_threshold)
        if len(kept) < r.min_items:
            return None, _reject(
                example,
                "too_few_items",
                f"{len(kept)} aspects after merging near-duplicates (min {r.min_items})",
            )
        if len(kept) > r.max_items and source == "generated":
            return None, _reject(
                example, "too_many_items", f"{len(kept)} aspects (max {r.max_items})"
            )
        prov = {**prov, "merged": merged}
        return make_rubric_row(example, kept, source, prov), None

    def _given(self, ctx: Context, out: StageDir, examples: list[dict], resumed: int) -> dict:
        rows, rejects = [], []
        for ex in examples:
            aspects = ex.get("rubric_aspects")
            if not aspects:
                rejects.append(_reject(ex, "no_given_rubric", "input has no rubric_aspects"))
                continue
            row, rej = self._finish_items(ctx, ex, aspects, "given", {"source": "input"})
            (rows if row else rejects).append(row or rej)
        out.write_shard(rows, rejects)
        return self._stats(out, resumed)

    async def _generated(
        self, ctx: Context, out: StageDir, examples: list[dict], resumed: int
    ) -> dict:
        c = ctx.config
        tmpl = load_template(TEMPLATE)
        schema = rubric_schema(c.rubrics.min_items, c.rubrics.max_items)
        s = c.rubrics.sampling
        requests = []
        for ex in examples:
            profile = select_profile(
                ex["question"],
                ex["profile"],
                c.profile.top_k,
                c.profile.ranker,
                c.profile.embedding_model,
            )
            msgs = tmpl.render(
                question=ex["question"],
                narrative=ex.get("narrative"),
                profile=profile,
                min_items=c.rubrics.min_items,
                max_items=c.rubrics.max_items,
            )
            requests.append(
                ChatRequest(
                    messages=msgs,
                    model=c.backend.model,
                    temperature=s.temperature,
                    top_p=s.top_p,
                    max_tokens=s.max_tokens,
                    n=1,
                    seed=c.run.seed,
                    json_schema=schema,
                    schema_name="rubric",
                )
            )

        validate = json_validator(_Rubric)
        rows, rejects = [], []
        pending = 0
        async with ctx.llm(self.name) as runner:
            async for i, outcome in runner.stream(requests, validate):
                ex = examples[i]
                if hasattr(outcome, "result"):
                    parsed: _Rubric = outcome.parsed[0]
                    prov = {
                        **tmpl.provenance(),
                        "model": c.backend.model,
                        "sampling": s.model_dump(),
                        "seed": c.run.seed,
                        "request_key": outcome.request.key,
                        "reasks": outcome.reasks,
                        "usage": {
                            "prompt_tokens": outcome.result.prompt_tokens,
                            "completion_tokens": outcome.result.completion_tokens,
                        },
                        "finish_reason": outcome.result.choices[0].finish_reason,
                    }
                    items = [a.model_dump() for a in parsed.aspects]
                    row, rej = self._finish_items(ctx, ex, items, "generated", prov)
                    (rows if row else rejects).append(row or rej)
                elif outcome.reason.startswith("invalid_json"):
                    rejects.append(_reject(ex, "invalid_rubric", outcome.reason))
                else:
                    pending += 1  # transient failure: retried on the next run
            stats_llm = runner.stats.as_dict()
        out.write_shard(rows, rejects)
        stats = self._stats(out, resumed)
        stats["llm"] = stats_llm
        stats["pending_examples"] = pending
        return stats

    def _stats(self, out: StageDir, resumed: int) -> dict[str, Any]:
        rows = list(out.rows())
        rejects = list(out.rejects())
        reasons: dict[str, int] = {}
        for r in rejects:
            reasons[r["reason"]] = reasons.get(r["reason"], 0) + 1
        return {
            "rubrics": len(rows),
            "rejected": len(rejects),
            "reject_reasons": reasons,
            "items_mean": round(sum(len(r["items"]) for r in rows) / len(rows), 2) if rows else 0,
            "resumed_examples": resumed,
        }
