"""rubrics: one versioned rubric per example, given by the input or derived by the LLM."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterator
from collections.abc import Set as AbstractSet
from dataclasses import replace
from typing import Any

from rapidfuzz import fuzz

from pipeline.core.ids import content_hash, stable_id
from pipeline.engine.llm import Answer, Failure, Job
from pipeline.run import StageDir
from pipeline.stages.base import Context, Placeholders, PlannedExample, Stage
from pipeline.stages.scaffold import ExampleLoop, OpenExample
from pipeline.types import schemas
from pipeline.types.chat import ChatRequest
from pipeline.types.prompts import load_template
from pipeline.types.records import ranked_posts

TEMPLATE = "rubric_generate"
RUBRIC_FIELDS = frozenset({"example_id", "user_id", "rubric_version", "source", "items"})


# Asked when merging near-duplicate aspects leaves too few: the model sees its answer and why.
TOO_FEW_TEMPLATE = (
    "After merging aspects that say nearly the same thing, only {kept} distinct aspects "
    "remain ({merged}), and at least {min_items} are needed. Reply again with a JSON object "
    "listing {min_items} to {max_items} aspects that are each clearly different from the "
    "others, grounded in what this person wrote."
)


def rubric_schema(min_items: int, max_items: int, max_tokens: int | None) -> dict[str, Any]:
    """The rubric schema sent to the model (bounded; see pipeline/types/schemas.py)."""
    return schemas.rubric_schema(min_items, max_items, max_tokens)


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
    example: dict,
    items: list[dict],
    source: str,
    provenance: dict[str, Any],
    *,
    as_is: bool = False,
) -> dict[str, Any]:
    """Give items stable ids and the rubric a version hash of its content.

    An item's id is a hash of the example and its aspect (case and spaces aside). An aspect
    given twice is kept once, trimmed; ``as_is`` (``rubrics.given_as_is``, the reference's
    construction) keeps every item exactly as given, a repeat with an id of its own (its
    place among the repeats joins the hash)."""
    ex_id = example["example_id"]
    with_ids = []
    seen: Counter[str] = Counter()
    for it in items:
        norm = " ".join(it["aspect"].lower().split())
        repeat = seen[norm]
        seen[norm] += 1
        if repeat and not as_is:  # identical aspect text twice: keep the first
            continue
        key = (ex_id, norm) if not repeat else (ex_id, norm, repeat)
        item_id = "a" + stable_id(*key, length=10)
        keep = (lambda t: t) if as_is else str.strip
        with_ids.append(
            {
                "item_id": item_id,
                "aspect": keep(it["aspect"]),
                "evidence": keep(it.get("evidence") or ""),
                "reason": keep(it.get("reason") or ""),
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


def _append(rows: list[dict], rejects: list[dict], row: dict | None, rej: dict | None) -> None:
    if row is not None:
        rows.append(row)
    elif rej is not None:
        rejects.append(rej)


class RubricStage(Stage):
    name = "rubrics"
    # what this stage reads of each example (checked against what ingest writes)
    reads = {
        "ingest": frozenset(
            {
                "example_id",
                "user_id",
                "question",
                "narrative",
                "profile",
                "profile_view",
                "rubric_aspects",
            }
        )
    }
    writes = RUBRIC_FIELDS | {"provenance"}

    def uses_llm(self, ctx: Context) -> bool:
        return ctx.config.rubrics.source == "generated"

    def settings(self, ctx: Context) -> dict[str, Any]:
        c = ctx.config
        s: dict[str, Any] = {"rubrics": c.rubrics.model_dump(mode="json")}
        if c.rubrics.source == "generated":
            s["model"] = c.backend.model
            s["served_by"] = ctx.served_by_setting()
            s["template_hash"] = load_template(TEMPLATE).sha256
            s["seed"] = c.run.seed
            s["schema"] = self._schema(ctx)
        return s

    @staticmethod
    def _schema(ctx: Context) -> dict[str, Any]:
        r = ctx.config.rubrics
        return rubric_schema(r.min_items, r.max_items, r.sampling.max_tokens)

    def expected(self, ctx: Context) -> int:
        return self.input_count(ctx, "ingest")  # one row per example

    def run(self, ctx: Context, out: StageDir) -> dict[str, Any]:
        done = out.done_examples()
        examples = (e for e in self.input_rows(ctx, "ingest") if e["example_id"] not in done)
        if ctx.config.rubrics.source == "given":
            return self._given(ctx, out, examples, len(done))
        return asyncio.run(self._generated(ctx, out, examples, len(done)))

    def _finish_items(
        self, ctx: Context, example: dict, raw: list[dict], source: str, prov: dict
    ) -> tuple[dict | None, dict | None]:
        r = ctx.config.rubrics
        generated = source == "generated"
        # a given rubric is the input's: kept as it is (the reference keeps every question),
        # merged only when asked; the item counts are a generated rubric's checks
        if generated or r.merge_given:
            kept, merged = merge_items(raw, r.merge_threshold)
        else:
            kept, merged = list(raw), []
        if generated and len(kept) < r.min_items:
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
        as_is = not generated and r.given_as_is
        return make_rubric_row(example, kept, source, prov, as_is=as_is), None

    def _given(self, ctx: Context, out: StageDir, examples: Any, resumed: int) -> dict:
        rows: list[dict] = []
        rejects: list[dict] = []
        chunk = self.shard_size(ctx)
        for ex in examples:
            aspects = ex.get("rubric_aspects")
            if not aspects and not ctx.config.rubrics.given_as_is:
                rejects.append(_reject(ex, "no_given_rubric", "input has no rubric_aspects"))
            else:
                # given_as_is: an empty rubric is the input's too; its pair is written
                row, rej = self._finish_items(
                    ctx, ex, list(aspects or []), "given", {"source": "input"}
                )
                _append(rows, rejects, row, rej)
            if len(rows) + len(rejects) >= chunk:
                out.write_shard(rows, rejects)
                rows, rejects = [], []
        if rows or rejects:
            out.write_shard(rows, rejects)
        return self._stats(out, resumed)

    def _request(self, ctx: Context, ex: dict) -> ChatRequest:
        c = ctx.config
        msgs = load_template(TEMPLATE).render(
            question=ex["question"],
            narrative=ex.get("narrative"),
            profile=ranked_posts(ex),
            min_items=c.rubrics.min_items,
            max_items=c.rubrics.max_items,
        )
        schema = self._schema(ctx)
        return ChatRequest.sampled(
            msgs,
            c.backend.model,
            c.rubrics.sampling,
            seed=c.run.seed,
            max_tokens=schemas.request_tokens(schema, c.rubrics.sampling.max_tokens),
            json_schema=ctx.sent_schema(schema),
            schema_name="rubric",
            served_by=ctx.served_by_id,
        )

    async def _generated(self, ctx: Context, out: StageDir, examples: Any, resumed: int) -> dict:
        c = ctx.config
        tmpl = load_template(TEMPLATE)
        schema = self._schema(ctx)
        s = c.rubrics.sampling

        # checked against the full schema, free text over its bound shortened to it; an
        # answer cut at max_tokens keeps its whole items (pipeline/types/schemas.py: read)
        def validate(req: ChatRequest, text: str) -> schemas.Reading:
            return schemas.read(schema, text, clip=True)

        def salvage(req: ChatRequest, text: str) -> schemas.Reading:
            return schemas.read(schema, text, cut=True, clip=True)

        loop = ExampleLoop(out, self.shard_size(ctx))
        reasked = 0

        def jobs() -> Any:
            for ex in examples:
                # the fields a row needs (the profile is not kept)
                state = {"example_id": ex["example_id"], "user_id": ex["user_id"]}
                job = Job(self._request(ctx, ex), 0, validate, salvage)
                yield from loop.start(ex["example_id"], [job], state)

        def on_outcome(st: OpenExample, attempt: int, outcome: Answer | Failure) -> list[Job]:
            nonlocal reasked
            if isinstance(outcome, Failure):  # final: invalid after every re-ask and retry
                st.extra["reject"] = _reject(st.state, "invalid_rubric", outcome.reason)
                return []
            reading: schemas.Reading = outcome.parsed[0]
            items = reading.value["aspects"]
            kept, merged = merge_items(items, c.rubrics.merge_threshold)
            if len(kept) < c.rubrics.min_items and attempt < c.rubrics.reasks:
                # a repetitive model: tell it what merging found and ask again
                req = outcome.request
                note = TOO_FEW_TEMPLATE.format(
                    kept=len(kept),
                    merged="; ".join(f"'{m['aspect']}' repeats '{m['into']}'"
                                     for m in merged[:3]) or "duplicates",
                    min_items=c.rubrics.min_items,
                    max_items=c.rubrics.max_items,
                )  # fmt: skip
                text = outcome.result.choices[0].text
                again = replace(req, messages=(*req.messages, ("assistant", text), ("user", note)))
                reasked += attempt == 0
                return [Job(again, attempt + 1, validate, salvage)]
            prov = {
                **tmpl.provenance(),
                "model": c.backend.model,
                "served_by": ctx.served_by,
                "sampling": s.model_dump(),
                "seed": c.run.seed,
                "request_key": outcome.request.key,
                "reasks": outcome.reasks,
                "too_few_reasks": attempt,
                "usage": {
                    "prompt_tokens": outcome.result.prompt_tokens,
                    "completion_tokens": outcome.result.completion_tokens,
                },
                "finish_reason": outcome.result.choices[0].finish_reason,
                # how the answer was read: cut at max_tokens (whole items kept), and the
                # fields shortened to their bound
                "cut": reading.cut,
                "clipped": list(reading.clipped),
            }
            row, rej = self._finish_items(ctx, st.state, items, "generated", prov)
            st.extra["row"], st.extra["reject"] = row, rej
            return []

        def on_complete(st: OpenExample) -> tuple[list[dict], list[dict]]:
            row, rej = st.extra.get("row"), st.extra.get("reject")
            return ([row] if row else []), ([rej] if rej else [])

        async with ctx.llm(self.name) as runner:
            await loop.drive(runner, jobs(), on_outcome, on_complete)
            stats_llm = runner.stats.as_dict()
        stats = self._stats(out, resumed)
        stats["llm"] = stats_llm
        stats["pending_examples"] = loop.pending
        stats["reasked_too_few"] = reasked
        return stats

    # ---- prb plan (pipeline/plan/) ------------------------------------------------------
    def plan_examples(
        self, ctx: Context, done: AbstractSet[str], placeholders: Placeholders
    ) -> Iterator[PlannedExample]:
        """Given rubrics: the rows ``run`` writes (no request). Generated: the request
        ``run`` sends first for each example, and its rubric: from the cached answer when
        the cache has one that needs no re-ask, else a placeholder (re-asks and rejects are
        not known before the answers)."""
        generated = ctx.config.rubrics.source == "generated"
        if generated:
            schema = self._schema(ctx)
            # what a row's rubric_version hashes besides the items
            prov = {**load_template(TEMPLATE).provenance(), "model": ctx.config.backend.model}
        for ex in self.input_rows(ctx, "ingest"):
            if ex["example_id"] in done:
                continue
            if generated:
                req = self._request(ctx, ex)
                hit = ctx.cache.get_many([req.key]).get(req.key)
                row = None
                if hit is not None:
                    try:
                        text = hit.choices[0].text
                        items = schemas.read(schema, text, cut=True, clip=True).value["aspects"]
                        row, _ = self._finish_items(ctx, ex, items, "generated", prov)
                    except ValueError:  # the run re-asks: its answer is not known
                        row = None
                guessed = row is None
                if row is None:
                    row = make_rubric_row(ex, placeholders.aspects(), "generated", {})
                yield PlannedExample(ex["example_id"], [req], [row], placeholders=guessed)
                continue
            aspects = ex.get("rubric_aspects")
            row = None
            if aspects or ctx.config.rubrics.given_as_is:
                row, _ = self._finish_items(
                    ctx, ex, list(aspects or []), "given", {"source": "input"}
                )
            yield PlannedExample(ex["example_id"], [], [row] if row else [])

    def _stats(self, out: StageDir, resumed: int) -> dict[str, Any]:
        n_rows = n_items = 0
        for r in out.rows():
            n_rows += 1
            n_items += len(r["items"])
        reasons: dict[str, int] = {}
        n_rejects = 0
        for r in out.rejects():
            n_rejects += 1
            reasons[r["reason"]] = reasons.get(r["reason"], 0) + 1
        return {
            "rubrics": n_rows,
            "rejected": n_rejects,
            "reject_reasons": reasons,
            "items_mean": round(n_items / n_rows, 2) if n_rows else 0,
            "resumed_examples": resumed,
        }
