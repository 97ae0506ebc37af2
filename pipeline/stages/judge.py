"""judge: rubric-blind quality and rubric-aware coverage of every candidate, then pairwise
verdicts (rubric-aware and rubric-blind, both A/B orders) for the most promising
chosen x rejected combinations of each example. Every score keeps its rationale.

It asks only what can still change the pair the pair stage keeps, by the pair stage's own
filters (``pipeline.rules.run_filters``, the run's ``pairs`` settings):

- a candidate that a text rule drops (over the cap, a refusal, meta-text, cut off...) gets
  no verdict at all: the rules that come before every verdict-reading rule in
  ``pairs.filters`` are tried on each answer first (``skipped`` in the row, with the rule);
- the shortlist (``judge.max_pairs_per_example`` combinations, best pointwise margin
  first) is judged one combination at a time: a combination a filter drops on its
  pointwise verdicts is never sent to the pairwise judge; the rubric-aware verdicts (both
  orders) go first, the rubric-blind ones only if the aware ones keep the pair;
- once a combination passes, the example stops (``judge.stop: first_pass``): the kept
  pair is the passing combination with the best pointwise margin. With ``outranked``, a
  later one is asked while its margin could still beat it (its pointwise margin plus the
  largest rubric-blind term, ``margin_bound``), so the kept pair is the one judging every
  combination would keep. The rest are marked ``not_asked: outranked``.

Each example waits only on its own round trips; the examples in flight fill the engine's
batch. The pair settings are part of this stage's fingerprint: a changed threshold re-does
it from the cache, asking only the verdicts the new thresholds make worth asking.

The stage streams: an example's pointwise requests go out as its candidates are read from
the responses shards; once they are answered, its shortlist's pairwise requests are pushed
ahead of the remaining input, and its row is written when the last verdict is in. Memory
holds the examples in flight, not the stage.

A finished example's row is also kept in the cache's ``derived`` table under a hash of
everything it was computed from (the stage's settings, the example's question, rubric items
and candidate rows): a re-run over the same inputs, whose answers are all cached, takes the
row from there instead of rebuilding, looking up and re-validating each of its requests.
Only rows whose every verdict parsed are kept there, so a failure is always asked again.

Every verdict answers a closed JSON schema (pipeline/types/schemas.py): scores and winners first
as enums, coverage keyed by the rubric points' positions in the prompt (one schema per
rubric size), rationales last. The engine is sent the schema without the rationales'
``maxLength`` (``schemas.wire``: a string bound costs grammar engines milliseconds a token);
the bound is kept here: a rationale over it is shortened to it, and a verdict cut at
``max_tokens`` after its decisions is kept with what its rationales had written. Each
verdict row records both (``cut``, ``clipped``).
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import math
from collections.abc import Iterator, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Any

from pipeline.core.errors import PipelineError
from pipeline.core.fields import DIMENSIONS, ORDERS
from pipeline.core.ids import content_hash, pair_id
from pipeline.core.io import dumps_sorted
from pipeline.engine.llm import Answer, Failure, Job, LLMRunner
from pipeline.kinds.backend import BACKENDS
from pipeline.rules import Hit, PairRule, PairView, RuleSet, run_filters
from pipeline.rules.base import Answer as Text
from pipeline.rules.verdicts import a_side, margin, margin_bound, shown_side
from pipeline.run import StageDir
from pipeline.stages.base import Context, Placeholders, PlannedExample, Stage
from pipeline.stages.scaffold import ExampleLoop, OpenExample
from pipeline.types import schemas
from pipeline.types.chat import ChatRequest
from pipeline.types.prompts import load_template

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
JUDGE_FIELDS = frozenset({"example_id", "quality", "coverage", "pairwise"})
# the kind of the judge's finished rows in the cache's derived table. A memo's key holds
# the code of the judge's modules (``JudgeStage.code``, derived from its imports), so a
# change to how a row is made or laid out misses the old memos by itself: no version to
# bump by hand
MEMO_KIND = "judge_row/1"


# the pairwise judges in the order they are asked: the rubric-aware one can drop a pair alone
STEPS = ("pairwise_aware", "pairwise_blind")
# a combination not asked about: one judged already passes with a margin it cannot reach
OUTRANKED = "outranked"
# what `prb plan` expects of the pairwise judges until this run has judged enough to
# measure it (MEASURED_FROM combinations): the rubric-aware one keeps this share of what it
# is sent, the rubric-blind one this share of what the aware one kept (an assumption)
ASSUMED_SHARES = (0.9, 0.9)
MEASURED_FROM = 20


@dataclass
class _Judged:
    """What an example in flight keeps: its candidates, the verdicts so far, and where
    its shortlist stands (the combination being judged, the best margin passed so far)."""

    question: str
    items: list[dict[str, str]]
    cands: list[dict]
    memo_key: str
    quality: dict[str, dict] = field(default_factory=dict)
    coverage: dict[str, dict] = field(default_factory=dict)
    pairs: list[dict] = field(default_factory=list)
    order: list[int] = field(default_factory=list)  # the shortlist in the order judged
    cursor: int = 0
    best: float | None = None


class JudgeStage(Stage):
    name = "judge"
    reads = {
        "ingest": frozenset({"example_id", "question"}),
        "rubrics": frozenset({"example_id", "items"}),
        "responses": frozenset(
            {"candidate_id", "example_id", "side", "text", "violates", "honours", "strategy",
             "finish_reason", "provenance"}
        ),
    }  # fmt: skip
    writes = JUDGE_FIELDS | {"provenance"}

    def uses_llm(self, ctx: Context) -> bool:
        return ctx.config.judge.enabled

    def settings(self, ctx: Context) -> dict[str, Any]:
        c = ctx.config
        m = c.judge.sampling.max_tokens
        cap = c.judge.rationale_max_chars
        return {
            "judge": c.judge.model_dump(mode="json"),
            "model": self.model(ctx),
            "served_by": ctx.served_by_setting(),
            "seed": c.run.seed,
            "templates": {k: load_template(v).sha256 for k, v in TEMPLATES.items()},
            "schemas": {
                "quality": schemas.quality_schema(m, cap),
                "pairwise": schemas.pairwise_schema(m, cap),
                "coverage": schemas.coverage_schema(1, m, cap)[0],
            },
            # the filters it stops asking by, and when it stops
            "stop": self.stop(ctx),
            "pairs": c.pairs.model_dump(mode="json"),
            "word_cap": c.responses.word_cap,
        }

    @staticmethod
    def filters(ctx: Context) -> list[PairRule]:
        """The pair stage's pair-level filters, built once per run."""
        rules = RuleSet(ctx.config.pairs, ctx.config.responses.word_cap)
        return [f for f in rules.filters(ctx.config.pairs.filters) if not f.set_level]

    @staticmethod
    def text_rules(filters: list[PairRule]) -> list[PairRule]:
        """The filters that come before every one that reads a verdict the judge may not
        ask (``asked_only`` ones read only what was asked): tried on each answer first."""
        out = []
        for f in filters:
            if f.reads_verdicts and not f.asked_only:
                break
            out.append(f)
        return out

    @staticmethod
    def model(ctx: Context) -> str:
        return ctx.config.judge.model or ctx.config.backend.model

    def memo_salt(self, ctx: Context) -> str:
        """What a finished row depends on besides its example's inputs: the stage's
        settings, the code that makes a row, and the runner settings that decide when an
        invalid verdict is final."""
        b = ctx.config.backend
        return content_hash(
            {
                "kind": MEMO_KIND,
                "settings": self.settings(ctx),
                "code": self.code_fingerprint(),
                "max_reasks": b.max_reasks,
                "invalid_retry_runs": b.invalid_retry_runs,
            }
        )

    @staticmethod
    def memo_key(
        salt: str, questions: Mapping[str, str], items: Mapping[str, list], cands: list[dict]
    ) -> str:
        """The hash of everything one example's row is computed from."""
        ex_id = cands[0]["example_id"]
        h = hashlib.sha256(salt.encode())
        h.update(dumps_sorted([ex_id, questions[ex_id], items[ex_id], cands]))
        return h.hexdigest()

    def prompt_inputs(self, ctx: Context) -> tuple[Mapping[str, str], Mapping[str, list]]:
        """What prompts need per example, looked up as each is judged (never all held):
        the question, and the rubric items (id and aspect)."""
        questions = self.input_fields(ctx, "ingest", _question)
        items = self.input_fields(ctx, "rubrics", _rubric_items)
        return questions, items

    def expected(self, ctx: Context) -> int:
        return len({r["example_id"] for r in self.input_rows(ctx, "responses")})

    def run(self, ctx: Context, out: StageDir) -> dict[str, Any]:
        if not ctx.config.judge.enabled:
            return self._run_unjudged(ctx, out)
        return asyncio.run(self._run(ctx, out))

    def _run_unjudged(self, ctx: Context, out: StageDir) -> dict[str, Any]:
        """The judge off (``judge.enabled: false``, the reference's construction): each
        example's row lists its chosen x rejected combinations (the first
        ``max_pairs_per_example``, by candidate id) with no verdict; nothing is sent."""
        done = out.done_examples()
        chunk = self.shard_size(ctx)
        buffer: list[dict] = []
        examples = pairs = 0
        for cands in self._grouped(ctx):
            ex_id = cands[0]["example_id"]
            if ex_id in done:
                continue
            ex = _Judged("", [], cands, "")
            ex.pairs = self._shortlist(ctx, ex_id, ex)
            row = self._row(ctx, ex_id, ex)
            row["provenance"] = {"judged": False}
            buffer.append(row)
            examples += 1
            pairs += len(ex.pairs)
            if len(buffer) >= chunk:
                out.write_shard(buffer)
                buffer = []
        if buffer:
            out.write_shard(buffer)
        return {
            "examples": examples,
            "candidates_judged": 0,
            "pairs_judged": 0,
            "pairs_unjudged": pairs,
            "parse_failures": 0,
            "resumed_examples": len(done),
            "judged": False,
        }

    # ---- requests ----------------------------------------------------------------------
    def _request(
        self,
        ctx: Context,
        kind: str,
        schema: dict[str, Any],
        max_tokens: int | None = None,
        **variables: Any,
    ) -> ChatRequest:
        return ChatRequest.sampled(
            load_template(TEMPLATES[kind]).render(**variables),
            self.model(ctx),
            ctx.config.judge.sampling,
            seed=ctx.config.run.seed,
            max_tokens=max_tokens,
            json_schema=ctx.sent_schema(schema),
            schema_name=SCHEMA_NAMES[kind],
            served_by=ctx.served_by_id,
        )

    @staticmethod
    def _job(req: ChatRequest, tag: Any, schema: dict[str, Any]) -> Job:
        """A verdict's job: checked against the full schema, rationales shortened to their
        bound; an answer cut at max_tokens is read up to the cut (pipeline/types/schemas.py)."""

        def validate(req: ChatRequest, text: str) -> schemas.Reading:
            return schemas.read(schema, text, clip=True)

        def salvage(req: ChatRequest, text: str) -> schemas.Reading:
            return schemas.read(schema, text, cut=True, clip=True)

        return Job(req, tag, validate, salvage)

    @staticmethod
    def _skip(ex: _Judged, rules: list[PairRule], cands: list[dict] | None = None) -> None:
        """Mark the candidates (default: all) a text rule drops (``rules``:
        :meth:`text_rules`): they get no verdict, and every combination holding one is
        dropped by that rule."""
        aspects = [it["aspect"] for it in ex.items if isinstance(it.get("aspect"), str)]
        for cand in ex.cands if cands is None else cands:
            answer = Text(cand["text"], cand.get("finish_reason"), aspects)
            for rule in rules:
                if isinstance(rule.answer(answer), Hit):
                    ex.quality[cand["candidate_id"]] = {"skipped": rule.name}
                    ex.coverage[cand["candidate_id"]] = {"skipped": rule.name}
                    break

    def _pointwise_jobs(self, ctx: Context, ex: _Judged) -> list[Job]:
        c = ctx.config
        m, cap = c.judge.sampling.max_tokens, c.judge.rationale_max_chars
        q_schema = schemas.quality_schema(m, cap)
        c_schema, c_tokens = schemas.coverage_schema(len(ex.items), m, cap)
        points = [
            {"key": k, "aspect": it["aspect"]}
            for k, it in zip(schemas.coverage_keys(len(ex.items)), ex.items, strict=True)
        ]
        jobs = []
        for cand in ex.cands:
            cid = cand["candidate_id"]
            if ex.quality.get(cid, {}).get("skipped"):  # a text rule drops it
                continue
            req = self._request(
                ctx, "quality", q_schema, schemas.request_tokens(q_schema, m),
                question=ex.question, answer=cand["text"],
            )  # fmt: skip
            jobs.append(self._job(req, ("quality", cid), q_schema))
            req = self._request(
                ctx, "coverage", c_schema, c_tokens,
                question=ex.question, answer=cand["text"], items=points,
            )  # fmt: skip
            jobs.append(self._job(req, ("coverage", cid), c_schema))
        return jobs

    def _pairwise_jobs(self, ctx: Context, ex: _Judged, pi: int, kind: str) -> list[Job]:
        """The ``kind`` verdicts of combination ``pi`` of the shortlist, both A/B orders."""
        c = ctx.config
        m = c.judge.sampling.max_tokens
        p_schema = schemas.pairwise_schema(m, c.judge.rationale_max_chars)
        texts = {cand["candidate_id"]: cand["text"] for cand in ex.cands}
        pair = ex.pairs[pi]
        ch, rj = texts[pair["chosen_id"]], texts[pair["rejected_id"]]
        extra: dict[str, Any] = {"items": ex.items} if kind == "pairwise_aware" else {}
        jobs = []
        for order in ORDERS:
            a, b = (ch, rj) if a_side(order) == "chosen" else (rj, ch)
            req = self._request(
                ctx, kind, p_schema, schemas.request_tokens(p_schema, m),
                question=ex.question, answer_a=a, answer_b=b, **extra,
            )  # fmt: skip
            jobs.append(self._job(req, ("pair", (pi, kind, order)), p_schema))
        return jobs

    def _view(self, ex: _Judged, pair: dict) -> PairView:
        """A shortlisted combination as the pair stage will see it."""
        cands = {c["candidate_id"]: c for c in ex.cands}
        c_id, r_id = pair["chosen_id"], pair["rejected_id"]
        return PairView(
            example={},
            rubric={"items": ex.items},
            chosen=cands[c_id],
            rejected=cands[r_id],
            quality_chosen=ex.quality.get(c_id),
            quality_rejected=ex.quality.get(r_id),
            coverage_chosen=ex.coverage.get(c_id),
            coverage_rejected=ex.coverage.get(r_id),
            pairwise={k: pair.get(k, {}) for k in STEPS},
            pending=frozenset(k for k in STEPS if k not in pair),
        )

    @staticmethod
    def stop(ctx: Context) -> str:
        """``judge.stop`` as it applies to this backend (``auto`` resolved)."""
        stop = ctx.config.judge.stop
        if stop != "auto":
            return stop
        backend = BACKENDS.get(ctx.config.backend.name)
        return "all" if backend.answers_in_rounds(ctx.config.backend) else "first_pass"

    def _advance(self, ctx: Context, ex: _Judged, filters: list[PairRule]) -> list[Job]:
        """The next verdicts the shortlist needs, or none when it is settled: each
        combination in turn, judged until a filter drops it or it passes, and none asked
        once the best margin passed so far outranks what is left (``stop: all``: every
        combination a filter does not drop, both judges at once)."""
        mode = self.stop(ctx)
        if mode == "all":
            jobs: list[Job] = []
            for pi in ex.order:
                pair = ex.pairs[pi]
                if run_filters(filters, self._view(ex, pair)).undecided:
                    for kind in [k for k in STEPS if k not in pair]:
                        pair[kind] = {}
                        jobs += self._pairwise_jobs(ctx, ex, pi, kind)
            return jobs
        first = mode == "first_pass"
        while ex.cursor < len(ex.order):
            pi = ex.order[ex.cursor]
            pair = ex.pairs[pi]
            if ex.best is not None and (first or margin_bound(pair["pointwise_margin"]) < ex.best):
                for rest in ex.order[ex.cursor :]:
                    ex.pairs[rest]["not_asked"] = OUTRANKED
                ex.cursor = len(ex.order)
                break
            view = self._view(ex, pair)
            outcome = run_filters(filters, view)
            unasked = [k for k in STEPS if k not in pair]
            if outcome.undecided and unasked:
                pair[unasked[0]] = {}
                return self._pairwise_jobs(ctx, ex, pi, unasked[0])
            if outcome.reason is None:
                ex.best = max(view.margin(), ex.best if ex.best is not None else -math.inf)
            ex.cursor += 1
        return []

    def _shortlist_and_advance(
        self, ctx: Context, example_id: str, ex: _Judged, filters: list[PairRule]
    ) -> list[Job]:
        self._order(ctx, example_id, ex)
        return self._advance(ctx, ex, filters)

    def _order(self, ctx: Context, example_id: str, ex: _Judged) -> None:
        """The shortlist, and the order it is judged in."""
        ex.pairs = self._shortlist(ctx, example_id, ex)
        # judged best first, ties to the smaller pair id: the order the pair stage keeps by
        margins = [p["pointwise_margin"] for p in ex.pairs]
        ex.order = sorted(
            range(len(ex.pairs)),
            key=lambda i: (
                -(margins[i] if margins[i] is not None else -math.inf),
                ex.pairs[i]["pair_id"],
            ),
        )

    # ---- the stage ---------------------------------------------------------------------
    async def _run(self, ctx: Context, out: StageDir) -> dict[str, Any]:
        c = ctx.config
        done = out.done_examples()
        questions, items = self.prompt_inputs(ctx)
        n_examples = self.expected(ctx) - len(done)
        salt = self.memo_salt(ctx)

        memo_new: list[tuple[str, str, Any]] = []
        memo_hits = 0
        # progress: the pointwise requests (two per candidate) are known from the config;
        # the pairwise ones are counted as they are pushed
        per_example = 2 * c.responses.n * (1 + len(c.responses.strategies))

        def store_memos() -> None:
            # after the rows' shard is written: a memo never precedes its row
            nonlocal memo_new
            if memo_new:
                ctx.cache.put_derived_many(memo_new)
                memo_new = []

        loop = ExampleLoop(out, self.shard_size(ctx), after_flush=store_memos)
        filters = self.filters(ctx)
        text_rules = self.text_rules(filters)

        def jobs(runner: LLMRunner) -> Iterator[Job]:
            nonlocal memo_hits
            block: list[list[dict]] = []
            for cands in itertools.chain(self._grouped(ctx), [None]):
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
                        loop.emit([memo["row"]])
                        continue
                    ex = _Judged(questions[ex_id], items[ex_id], cs, mkey)
                    self._skip(ex, text_rules)
                    first = self._pointwise_jobs(ctx, ex)
                    if not first:  # every candidate dropped by a text rule: nothing to ask
                        first = self._shortlist_and_advance(ctx, ex_id, ex, filters)
                    if not first:
                        loop.emit([self._row(ctx, ex_id, ex)])
                        continue
                    yield from loop.start(ex_id, first, ex)
                block = []

        def on_outcome(st: OpenExample, key: tuple, outcome: Answer | Failure) -> list[Job]:
            ex: _Judged = st.state
            kind, what = key
            if kind == "pair":
                self._record_pairwise(ex, what, outcome)
            else:
                target = ex.quality if kind == "quality" else ex.coverage
                target[what] = self._pointwise_row(kind, outcome, ex.items)
            if st.outstanding > 1:
                return []
            if kind != "pair":  # the last pointwise verdict is in: the shortlist
                return self._shortlist_and_advance(ctx, st.example_id, ex, filters)
            return self._advance(ctx, ex, filters)

        def on_complete(st: OpenExample) -> tuple[list[dict], list[dict]]:
            row = self._row(ctx, st.example_id, st.state)
            if not st.failed:  # a verdict that stayed invalid is asked again next time
                memo = {"row": row, "requests": st.requests, "reasks": st.reasks}
                memo_new.append((st.state.memo_key, MEMO_KIND, memo))
            return [row], []

        async with ctx.llm(self.name) as runner:
            await loop.drive(
                runner, jobs(runner), on_outcome, on_complete, total=n_examples * per_example
            )
            llm_stats = runner.stats.as_dict()

        examples = candidates = pairs_judged = parse_failures = outranked = 0
        skipped: dict[str, int] = {}
        for r in out.rows():
            examples += 1
            for v in r["quality"].values():
                if v.get("skipped"):
                    skipped[v["skipped"]] = skipped.get(v["skipped"], 0) + 1
                else:
                    candidates += 1
            for p in r["pairwise"]:
                outranked += p.get("not_asked") == OUTRANKED
                pairs_judged += any(k in p for k in STEPS)
            parse_failures += sum(
                1
                for d in (r["quality"], r["coverage"])
                for v in d.values()
                if not v.get("parse_ok") and not v.get("skipped")
            )
        return {
            "examples": examples,
            "candidates_judged": candidates,
            "candidates_skipped": dict(sorted(skipped.items())),
            "pairs_judged": pairs_judged,
            "pairs_outranked": outranked,
            "parse_failures": parse_failures,
            "resumed_examples": len(done),
            "pending_examples": loop.pending,
            "rows_from_cache": memo_hits,
            "llm": llm_stats,
        }

    def _grouped(self, ctx: Context) -> Iterator[list[dict]]:
        """Candidates of one example at a time (a shard holds an example's rows together)."""
        current: list[dict] = []
        for cand in self.input_rows(ctx, "responses"):
            if current and cand["example_id"] != current[0]["example_id"]:
                yield current
                current = []
            current.append(cand)
        if current:
            yield current

    # ---- prb plan (pipeline/plan/) ------------------------------------------------------
    def plan_examples(
        self, ctx: Context, done: AbstractSet[str], placeholders: Placeholders
    ) -> Iterator[PlannedExample]:
        """The pointwise requests ``run`` sends for each example (none for a candidate a
        text rule drops, where the answers are written) and every pairwise one its
        shortlist could need, each with the share of runs that send it: 1 where the cache
        settles it, else by :meth:`pass_shares` (``prb plan``'s expected count; the largest
        is every one). The shortlist is the one ``run`` picks when every pointwise answer is
        in the cache; otherwise the first combinations stand in for it. An example whose
        row is kept whole in the cache (the memo) sends none of them."""
        if not ctx.config.judge.enabled:
            return  # nothing is sent
        questions, items = self.prompt_inputs(ctx)
        salt = self.memo_salt(ctx)
        filters = self.filters(ctx)
        text_rules = self.text_rules(filters)
        shares = self.pass_shares(ctx)
        filler = placeholders.answer()
        for cands in self._grouped(ctx):
            ex_id = cands[0]["example_id"]
            if ex_id in done:
                continue
            mkey = self.memo_key(salt, questions, items, cands)
            memo = ctx.cache.get_derived_many([mkey]).get(mkey)
            ex = _Judged(questions[ex_id], items[ex_id], cands, mkey)
            if memo is not None:  # the row kept whole: the requests it was made of
                row = memo["row"]
                ex.quality, ex.coverage, ex.pairs = row["quality"], row["coverage"], row["pairwise"]
                asked = self._pointwise_jobs(ctx, ex) + [
                    j for pi, pair in enumerate(ex.pairs) for k in STEPS if k in pair
                    for j in self._pairwise_jobs(ctx, ex, pi, k)
                ]  # fmt: skip
                requests = [j.request for j in asked]
                yield PlannedExample(ex_id, requests, replayed=int(memo["requests"]))
                continue
            self._skip(ex, text_rules, [c for c in cands if c["text"] != filler])
            pointwise = self._pointwise_jobs(ctx, ex)
            hits = ctx.cache.get_many(j.request.key for j in pointwise)
            answers = [self._cached(job, hits) for job in pointwise]
            known = all(a is not None for a in answers)
            for job, answer in zip(pointwise, answers, strict=True):
                if answer is not None:
                    kind, cid = job.tag
                    target = ex.quality if kind == "quality" else ex.coverage
                    target[cid] = self._pointwise_row(kind, answer, ex.items)
            if not known:  # the shortlist waits on verdicts not in: the first ones stand in
                for cid in [c for c in ex.quality if not ex.quality[c].get("skipped")]:
                    ex.quality.pop(cid), ex.coverage.pop(cid, None)
            self._order(ctx, ex_id, ex)
            jobs, sent_share = self._plan_pairwise(ctx, ex, filters, known, shares)
            yield PlannedExample(
                ex_id, [j.request for j in pointwise + jobs], estimated=not known,
                sent_share=[1.0] * len(pointwise) + sent_share,
            )  # fmt: skip

    @staticmethod
    def _cached(job: Job, hits: Mapping[str, Any]) -> Answer | None:
        """The cached answer of a job, read as the run reads it; None when not cached."""
        hit = hits.get(job.request.key)
        if hit is None or job.validate is None:
            return None
        text = hit.choices[0].text
        try:
            reading = job.validate(job.request, text)
        except ValueError:
            if job.salvage is None:
                return None
            try:
                reading = job.salvage(job.request, text)
            except ValueError:
                return None
        return Answer(hit, [reading], job.request)

    def _plan_pairwise(
        self,
        ctx: Context,
        ex: _Judged,
        filters: list[PairRule],
        known: bool,
        shares: tuple[float, float],
    ) -> tuple[list[Job], list[float]]:
        """Every pairwise job the shortlist could need, and the share of runs that send
        each: the run's own steps (:meth:`_advance`) while the cache answers them, then
        by ``shares`` (the rubric-aware judge keeps a pair, the rubric-blind one keeps what
        the aware one kept); a combination a filter drops on its pointwise verdicts, none."""
        mode, (aware, blind) = self.stop(ctx), shares
        reach, settled = 1.0, known
        out: list[tuple[Job, float]] = []
        for pi in ex.order:
            pair = ex.pairs[pi]
            best = ex.best if settled and mode != "all" else None
            bound = margin_bound(pair["pointwise_margin"])
            if best is not None and (mode == "first_pass" or bound < best):
                reach = 0.0
            open_ = False  # this combination reaches a step the cache does not settle
            for kind in STEPS:
                jobs = self._pairwise_jobs(ctx, ex, pi, kind)
                outcome = run_filters(filters, self._view(ex, pair)) if known else None
                if outcome is not None and not outcome.undecided:  # settled without it
                    out += [(j, 0.0) for j in jobs]
                    if outcome.reason is None and settled:
                        ex.best = max(self._view(ex, pair).margin(), ex.best or -math.inf)
                    continue
                answers = [self._cached(j, ctx.cache.get_many([j.request.key])) for j in jobs]
                if settled and all(a is not None for a in answers):
                    for j, a in zip(jobs, answers, strict=True):
                        assert a is not None
                        self._record_pairwise(ex, j.tag[1], a)
                    out += [(j, 0.0 if reach == 0 else 1.0) for j in jobs]
                    continue
                settled, open_ = False, True  # from here on, an expectation
                asked = reach if kind == STEPS[0] or mode == "all" else reach * aware
                out += [(j, asked) for j in jobs]
            if open_ and mode != "all":
                reach *= 1 - aware * blind
        return [j for j, _ in out], [p for _, p in out]

    def pass_shares(self, ctx: Context) -> tuple[float, float]:
        """The shares ``prb plan`` expects the pairwise verdicts by: of the combinations
        sent to the rubric-aware judge, those it keeps (the chosen preferred in both orders),
        and of those sent on to the rubric-blind judge, those it keeps (not the chosen in
        both): measured on this run's judged rows from 20 combinations, else
        ``ASSUMED_SHARES``."""
        aware = [0, 0]
        blind = [0, 0]
        try:
            rows = itertools.islice(ctx.run_dir.stage(self.name).rows(), 5000)
            for r in rows:
                for p in r["pairwise"]:
                    for kind, tally, keeps in (
                        ("pairwise_aware", aware, lambda d: d == ["chosen", "chosen"]),
                        ("pairwise_blind", blind, lambda d: d != ["chosen", "chosen"]),
                    ):
                        v = p.get(kind) or {}
                        if all((v.get(o) or {}).get("parse_ok") for o in ORDERS):
                            tally[0] += 1
                            tally[1] += keeps([v[o].get("prefers") for o in ORDERS])
        except PipelineError:
            pass
        if aware[0] < MEASURED_FROM:
            return ASSUMED_SHARES
        b = blind[1] / blind[0] if blind[0] >= MEASURED_FROM else ASSUMED_SHARES[1]
        return aware[1] / aware[0], b

    def plan_note(self, ctx: Context) -> str | None:
        if not ctx.config.judge.enabled:
            return None
        a, b = self.pass_shares(ctx)
        how = "measured on this run's judged rows" if (a, b) != ASSUMED_SHARES else "assumed"
        stop = self.stop(ctx)
        rule = {
            "first_pass": "stops at the first combination that passes",
            "outranked": "stops once no combination left can win (counted as first_pass: "
            "at least this many)",
            "all": "asks every combination the pointwise filters keep, at once",
        }[stop]
        return (
            f"expected requests: the judge {rule} (judge.stop: {stop}); {a:.0%} of the "
            f"combinations sent to the rubric-aware judge pass it and {b:.0%} of those pass the "
            f"rubric-blind one ({how}); the requests column is the largest it could send"
        )

    @staticmethod
    def _record_pairwise(ex: _Judged, key: tuple, outcome: Answer | Failure) -> None:
        pi, kind, order = key
        verdicts = ex.pairs[pi].setdefault(kind, {})
        if isinstance(outcome, Failure):
            verdicts[order] = {"parse_ok": False, "error": outcome.reason[:300]}
            return
        reading: schemas.Reading = outcome.parsed[0]
        v = reading.value
        # map the position back to the pair's sides
        winner = v["winner"]
        verdicts[order] = {
            "winner": winner,
            "prefers": "tie" if winner == "tie" else shown_side(winner, a_side(order)),
            "rationale": v["rationale"],
            "parse_ok": True,
            "request_key": outcome.request.key,
            **_read_notes(reading),
            **_reasoning_length(outcome),
        }

    @staticmethod
    def _pointwise_row(
        kind: str, outcome: Answer | Failure, items: list[dict[str, str]]
    ) -> dict[str, Any]:
        if isinstance(outcome, Failure):  # final: invalid after every re-ask and retry
            return {"parse_ok": False, "error": outcome.reason[:300]}
        reading: schemas.Reading = outcome.parsed[0]
        v = reading.value
        row: dict[str, Any] = {
            "parse_ok": True,
            "request_key": outcome.request.key,
            "reasks": outcome.reasks,
            **_read_notes(reading),
            **_reasoning_length(outcome),
        }
        if kind == "quality":
            for d in DIMENSIONS:
                row[d] = v[d]
            row["rationale"] = {d: v[f"{d}_rationale"] for d in DIMENSIONS}
        else:
            # the schema's keys are the points' positions: back to the items' own ids
            keys = schemas.coverage_keys(len(items))
            ids = [it["item_id"] for it in items]
            row["scores"] = {i: v["scores"][k] for k, i in zip(keys, ids, strict=True)}
            row["rationale"] = {i: v["rationales"][k] for k, i in zip(keys, ids, strict=True)}
        return row

    def _shortlist(self, ctx: Context, example_id: str, ex: _Judged) -> list[dict]:
        chosen = [c for c in ex.cands if c["side"] == "chosen"]
        rejected = [c for c in ex.cands if c["side"] == "rejected"]
        scored = []
        for ch in chosen:
            for rj in rejected:
                qc, qr = ex.quality.get(ch["candidate_id"]), ex.quality.get(rj["candidate_id"])
                cc, cr = ex.coverage.get(ch["candidate_id"]), ex.coverage.get(rj["candidate_id"])
                if qc and qr and cc and cr and all(x.get("parse_ok") for x in (qc, qr, cc, cr)):
                    # before the pairwise verdicts: the margin without its blind term
                    m = margin(cc["scores"], cr["scores"], rj["violates"], qc, qr)
                else:
                    m = float("-inf")
                scored.append((-m, ch["candidate_id"], rj["candidate_id"], m))
        scored.sort()
        k = ctx.config.judge.max_pairs_per_example
        short = [
            {
                "pair_id": pair_id(example_id, c_id, r_id),
                "chosen_id": c_id,
                "rejected_id": r_id,
                "pointwise_margin": None if m == float("-inf") else round(m, 4),
            }
            for _, c_id, r_id, m in scored[:k]
        ]
        return short

    def _row(self, ctx: Context, example_id: str, ex: _Judged) -> dict[str, Any]:
        ids = [c["candidate_id"] for c in ex.cands]
        return {
            "example_id": example_id,
            "quality": {i: ex.quality[i] for i in ids if i in ex.quality},
            "coverage": {i: ex.coverage[i] for i in ids if i in ex.coverage},
            "pairwise": ex.pairs,
            "provenance": {
                "model": self.model(ctx),
                "served_by": ctx.served_by,
                "sampling": ctx.config.judge.sampling.model_dump(),
                "seed": ctx.config.run.seed,
                "templates": {k: load_template(v).provenance() for k, v in TEMPLATES.items()},
            },
        }


def _read_notes(reading: schemas.Reading) -> dict[str, Any]:
    """How a verdict was read: cut at max_tokens after its decisions (``cut``), and the
    rationales shortened to their bound (``clipped``, the fields' paths)."""
    return {"cut": reading.cut, "clipped": list(reading.clipped)}


def _reasoning_length(outcome: Answer) -> dict[str, Any]:
    """A reasoning model's verdict: the tokens of the reasoning taken out of it (nothing
    for a verdict that came without one)."""
    choice = outcome.result.choices[0]
    return {} if choice.reasoning is None else {"reasoning_tokens": choice.reasoning_tokens}


def _question(row: Mapping[str, Any]) -> str:
    return row["question"]


def _rubric_items(row: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [{"item_id": i["item_id"], "aspect": i["aspect"]} for i in row["items"]]
