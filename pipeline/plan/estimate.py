"""The estimate: every stage's requests counted from its own request builders
(``Stage.plan_examples``), looked up in the run's cache, their tokens counted, and the
totals, time and cost summed; see the package's docstring."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from pipeline.backends.identity import describe
from pipeline.config import Config
from pipeline.core.errors import BackendError
from pipeline.engine.budget import Spend, backend_spend, cost_usd, request_bound, run_prices
from pipeline.inputs.ingest import iter_examples
from pipeline.kinds.backend import BACKENDS, AsSent
from pipeline.kinds.stages import ORDER
from pipeline.orchestration.orchestrate import check_contracts, make_plan, plan_stages
from pipeline.plan.counters import TokenCounter, WordCounter, choose_counter
from pipeline.plan.placeholders import NoCache, make_filler
from pipeline.plan.result import Figures, Plan, StageEstimate
from pipeline.plan.throughput import throughput
from pipeline.run import RunDir
from pipeline.run.cache import RequestCache
from pipeline.stages import STAGES
from pipeline.stages.base import Context, PlannedExample, Stage
from pipeline.stages.ingest import IngestStage
from pipeline.types import schemas
from pipeline.types.chat import ChatRequest, output_bound
from pipeline.types.profile import check_ranker_installed

LOOKUP_BATCH = 900


def _measured(ledger: list[dict[str, Any]], served_by: str) -> dict[str, dict[str, Any]]:
    """Per stage, this backend's answers in the cache (``RequestCache.ledger``): mean output
    tokens per choice and the share of re-asks."""
    out: dict[str, dict[str, Any]] = {}
    for row in ledger:
        if row["served_by"] != served_by or not row["answers"]:
            continue
        first = row["answers"] - row["reasks"]
        out[row["stage"]] = {
            **row,
            "output_per_choice": row["completion_tokens"] / max(row["choices"], 1),
            "prompt_per_answer": row["prompt_tokens"] / row["answers"],
            "reask_rate": row["reasks"] / first if first > 0 else None,
        }
    return out


class _Extra:
    """What a placeholder answer adds to the prompt bounds of one stage's requests: the
    placeholder's occurrences in its prompts, counted as they pass, and added at the end
    when the stage it stands for turned out to hold placeholders (``_finish``)."""

    def __init__(self, text: str, tokens: int, nbytes: int) -> None:
        self.text, self.tokens, self.bytes = text, tokens, nbytes
        self.held_total = self.held_to_send = 0


def _counted(
    est: StageEstimate,
    planned: Iterable[PlannedExample],
    done: set[str] | None,
    cache: RequestCache,
    counter: TokenCounter,
    mean: float | None,
    extra: _Extra | None = None,
    as_sent: AsSent | None = None,
    reasoning: dict[str, Any] | None = None,
) -> Iterator[dict]:
    """Count the planned requests into ``est`` as they pass; what is done (``done`` None:
    everything) or cached is not to be sent. Yields the rows of examples still to do, for
    the stages that read them (nothing holds them: see ``_Planned``). ``extra``: where the
    placeholder answer's occurrences are counted, for the prompt bounds. ``as_sent``: how
    the server is sent a request (``Backend.as_sent``: the schema in the prompt, a prompt
    per choice where ``n`` is split), whose prompts are counted as sent. ``reasoning``: a
    reasoning model's settings (the identity's record), whose reasoning budget each answer
    may take on top of its max_tokens."""
    batch: list[tuple[ChatRequest, bool, float | None]] = []

    def flush() -> None:
        present = cache.present(r.key for r, settled, _ in batch if not settled)
        for req, settled, share in batch:
            # (a key is hashed only when the cache holds something to find)
            cached = settled or (bool(present) and req.key in present)
            sent = as_sent(req) if as_sent is not None else [req]
            # the copies of a split request are one prompt each
            tokens = counter.count(sent[0]) * len(sent)
            held = 0
            if extra is not None:
                held = sum(c.count(extra.text) for _, c in req.messages) * len(sent)
                extra.held_total += held
                if not cached:
                    extra.held_to_send += held
            per_choice = output_bound(req, reasoning)
            bound = per_choice * req.n
            budget_prompt = request_bound(req, as_sent).prompt_tokens
            expected = min(mean, per_choice) * req.n if mean is not None else None
            p = 1.0 if share is None else share
            for fig in (est.total,) if cached else (est.total, est.to_send):
                fig.requests += 1
                fig.prompt_tokens += tokens
                fig.prompt_bound += tokens
                fig.budget_prompt += budget_prompt
                fig.output_bound += bound
                fig.choices += req.n
                if expected is not None:
                    fig.output_expected = (fig.output_expected or 0.0) + p * expected
                fig.requests_expected += p
                fig.prompt_expected += p * tokens
                fig.output_bound_expected += p * bound
            est.cached += cached
        batch.clear()

    for pe in planned:
        est.examples += 1
        is_done = done is None or pe.example_id in done
        if not is_done:
            est.examples_to_do += 1
            est.estimated |= pe.estimated
            est.placeholders |= pe.placeholders
            yield from pe.rows
        shares: list[float | None] = [None] * len(pe.requests)
        if pe.sent_share is not None:
            shares = list(pe.sent_share)
        for req, share in zip(pe.requests, shares, strict=True):
            batch.append((req, is_done or pe.replayed > 0, share))
        if len(batch) >= LOOKUP_BATCH:
            flush()
    flush()


class _Planned:
    """The rows a planned stage would write, for the stages after it that read them, never
    held in memory (they ran to about 34 KB an example: at 100,000 examples, 3.5 GB).

    The first read takes them as the stage's own count makes them (``_counted``), so
    counting and reading are one pass; a later read makes them again with the stage's
    ``plan_examples`` (the same code, cache and inputs: the same rows, in the same order).
    ``finish`` completes the count where no later stage read them to the end."""

    def __init__(self, first: Iterator[dict], again: Callable[[], Iterator[dict]]) -> None:
        self._first = first
        self._again = again
        self._started = False

    def __iter__(self) -> Iterator[dict]:
        if not self._started:
            self._started = True
            return self._first
        return self._again()

    def finish(self) -> None:
        for _ in self._first:  # an exhausted generator yields nothing
            pass


class _IngestRows:
    """The examples, read again on each pass (not held): from the ingest stage when it is
    done, else read from the input and ranked as the ingest stage would
    (pipeline/stages/ingest.py). Each example's profile ranking is made once and kept by
    its position in the input (a few hundred bytes an example), so a pass re-parses the
    input but never ranks again. ``count``: the examples, once a pass has seen them all."""

    def __init__(self, ctx: Context, action: str) -> None:
        self.ctx, self.action = ctx, action
        self.count: int | None = None
        self._views: list[dict] = []

    def __iter__(self) -> Iterator[dict]:
        n = 0
        for n, row in enumerate(self._rows(), 1):  # noqa: B007 - n counts the pass
            yield row
        self.count = n

    def _rows(self) -> Iterator[dict]:
        ctx = self.ctx
        if self.action == "skip":
            yield from ctx.run_dir.stage("ingest").rows()
            return
        views = self._views
        for i, r in enumerate(iter_examples(ctx.config.input, ctx.config.resolve_input)):
            if i == len(views):
                views.append(IngestStage.profile_view(ctx, r))
            r["profile_view"] = views[i]
            yield r

    def __len__(self) -> int:
        if self.count is None:
            for _ in self:
                pass
        assert self.count is not None
        return self.count


def _identity(ctx: Context, has_cache: bool) -> tuple[str, list[str]]:
    """What answers this run, as the plan can know it without writing or sending."""
    try:
        # what a server takes is read from the run's record only
        with BACKENDS.get(ctx.config.backend.name).planning(lambda: _sent_schemas(ctx)) as known:
            ident = ctx.served_by
    except BackendError as exc:
        note = f"the backend's identity is unknown ({exc})"
        if has_cache:
            note += "; the cache cannot be matched, so every request counts as to be sent"
        ctx.assume_served_by({"kind": "unknown", "model_output": True, "reason": str(exc)[:200]})
        return "unknown: " + str(exc)[:200], [note]
    return describe(ident), [*dict.fromkeys(ctx.warnings), *known]


def _sent_schemas(ctx: Context) -> list[dict[str, Any]]:
    """The JSON schemas this config sends, as sent."""
    c = ctx.config
    j, r = c.judge, c.rubrics
    m, cap = j.sampling.max_tokens, j.rationale_max_chars
    found = [
        schemas.quality_schema(m, cap),
        schemas.pairwise_schema(m, cap),
        schemas.coverage_schema(max(r.max_items, 10), m, cap)[0],
    ]
    if r.source == "generated":
        found.append(schemas.rubric_schema(r.min_items, r.max_items, r.sampling.max_tokens))
    return [ctx.sent_schema(s) for s in found]


def estimate(
    config: Config,
    *,
    until: str | None = None,
    only: str | None = None,
    tokens_per_second: float | None = None,
    fresh: bool = False,
) -> Plan:
    """Plan the run ``config`` describes; writes nothing, sends no request. ``fresh``: as
    if nothing had run yet (no run directory, no cache): what the plan said before the run,
    which a finished stage's actual figures are compared with."""
    t0 = time.perf_counter()
    names = plan_stages(until, only)
    last = ORDER.index(names[-1])
    stages: dict[str, Stage] = {n: STAGES.get(n)() for n in ORDER[: last + 1]}
    check_contracts(stages)
    # a fresh plan looks at a run directory that is not there (nothing is created)
    rd = RunDir(config.run_dir / ".prb-plan-fresh" if fresh else config.run_dir)
    if not fresh:
        rd.check_writable(config)  # a folder `prb run` would refuse is refused here the same way
    ctx = Context(config=config, run_dir=rd, progress=False, planned_rows={})
    has_cache = rd.cache_path.is_file()
    ctx.use_cache(RequestCache(rd.cache_path, readonly=True) if has_cache else NoCache())
    try:
        return _estimate(ctx, stages, names, has_cache, tokens_per_second, t0)
    finally:
        ctx.close()


def _estimate(
    ctx: Context,
    stages: dict[str, Stage],
    names: list[str],
    has_cache: bool,
    tokens_per_second: float | None,
    t0: float,
) -> Plan:
    config, rd, cache = ctx.config, ctx.run_dir, ctx.cache
    assert ctx.planned_rows is not None
    llm_stages = [n for n, s in stages.items() if s.uses_llm(ctx)]
    backend, notes = _identity(ctx, has_cache) if llm_stages else ("none (no LLM stage)", [])
    served_by = ctx.served_by_id if llm_stages else ""
    plans = make_plan(ctx, stages, names)
    ledger = cache.ledger()
    measured = _measured(ledger, served_by) if served_by else {}
    kind = BACKENDS.get(config.backend.name)
    models = {
        n: kind.stage_model(config.backend, config.judge.model if n == "judge" else None)
        for n in llm_stages
    }
    counters: dict[str, TokenCounter] = {}
    for model in dict.fromkeys(models.values()):
        counters[model], more = choose_counter(config, ctx.served_by, model, cache, served_by)
        notes += more
    # what the run found (or was told) the server takes: prompts counted as sent
    as_sent, sent_notes = kind.as_sent(ctx.served_by) if llm_stages else (None, [])
    reasoning = ctx.served_by.get("reasoning") if llm_stages else None
    if reasoning:
        notes.append(
            f"a reasoning model: every answer may take up to {reasoning.get('budget')} reasoning "
            "tokens on top of its max_tokens (counted in the output bound"
            + (
                "; JSON answers under the grammar from their first token, without reasoning)"
                if reasoning.get("json_mode") == "grammar_only"
                else ")"
            )
        )
    notes += sent_notes

    ingest_plan = plans[0]
    if ingest_plan.action != "skip":
        # the plan ranks profiles as ingest would: a missing ranker extra is one line
        check_ranker_installed(config.profile.ranker)
    ingest_rows = _IngestRows(ctx, ingest_plan.action)
    if ingest_plan.action != "skip":
        ctx.planned_rows["ingest"] = ingest_rows
    first_counter = counters[models[llm_stages[0]]] if llm_stages else WordCounter()
    filler, filler_notes = make_filler(config, rd, ingest_rows, first_counter, measured)
    ingest_est = StageEstimate("ingest", ingest_plan.action, False)
    out = [ingest_est]
    # A stage's planned rows are read by the stages after it as they are counted (see
    # _Planned), so a stage's count may finish after a later one's begins: what depends
    # on the whole of an earlier stage (its placeholders) is settled in _finish below.
    readers = {
        u for p in plans[1:] if p.stage.uses_llm(ctx) or p.name == "rubrics" for u in p.stage.reads
    }
    sources: list[_Planned] = []
    counted_names: set[str] = set()  # stages before this one whose rows may hold placeholders
    counted: list[tuple[StageEstimate, Stage, TokenCounter, dict[str, Any], _Extra | None]] = []
    for p in plans[1:]:
        name, stage = p.name, p.stage
        uses = stage.uses_llm(ctx)
        est = StageEstimate(name, p.action, uses)
        out.append(est)
        sd = rd.stage(name)
        if p.action == "skip":
            done: set[str] | None = None
        elif p.action == "resume" and stage.resumable:
            done = sd.done_examples()
        else:
            done = set()
        if not uses and name != "rubrics":
            continue  # the pair stage: no request, and no later LLM stage reads its rows
        counter = counters[models[name]].fresh() if uses else WordCounter()
        m = measured.get(name, {})
        extra = None
        if uses and "responses" in counted_names:
            # counted in case the answers turn out to hold placeholders (known at the end)
            text = filler.answer()
            beyond = max((config.responses.sampling.max_tokens or 0) - counter.text(text), 0)
            # the budget counts a prompt's bytes: the placeholder's bytes per token
            per_token = len(text.encode("utf-8")) / max(counter.text(text), 1)
            if beyond > 0:
                extra = _Extra(text, beyond, math.ceil(beyond * per_token))
        rows = _counted(
            est, stage.plan_examples(ctx, set(), filler), done, cache, counter,
            m.get("output_per_choice"), extra, as_sent, reasoning,
        )  # fmt: skip
        counted.append((est, stage, counter, m, extra))
        if p.action != "skip":
            counted_names.add(name)
        if p.action == "skip" or name not in readers:
            for _ in rows:
                pass
            continue
        source = _Planned(_with_done_rows(sd, done, rows), _again(ctx, stage, sd, done, filler))
        ctx.planned_rows[name] = source
        sources.append(source)
    for source in sources:
        source.finish()
    used_filler = _finish(counted, out)
    for est, stage, *_ in counted:
        if est.to_send.requests_expected < est.to_send.requests - 1e-6:
            note = stage.plan_note(ctx)
            if note:
                est.notes.append(note)
    ingest_est.examples = len(ingest_rows)
    ingest_est.examples_to_do = 0 if ingest_plan.action == "skip" else ingest_est.examples
    if used_filler:
        notes = filler_notes + notes
    if "rubrics" in {e.stage for e in out if e.placeholders and e.action != "skip"}:
        notes.append(
            "the bounds count rubrics not yet generated at their expected size: for the "
            "stages that quote them, the prompt bound is an estimate"
        )
    spent = backend_spend(cache, served_by) if served_by else None
    totals, time_, cost = _summarise(ctx, out, tokens_per_second, measured, spent)
    return Plan(
        run_dir=rd.shown,
        backend=backend,
        stages=out,
        totals=totals,
        time=time_,
        cost=cost,
        notes=notes,
        seconds=round(time.perf_counter() - t0, 3),
    )


def _again(
    ctx: Context, stage: Stage, sd: Any, done: set[str] | None, filler: Any
) -> Callable[[], Iterator[dict]]:
    """How a stage's planned rows are made again for a second reader (see _Planned)."""

    def rows() -> Iterator[dict]:
        for pe in stage.plan_examples(ctx, set(), filler):
            if done is None or pe.example_id not in done:
                yield from pe.rows

    return lambda: _with_done_rows(sd, done, rows())


def _with_done_rows(sd: Any, done: set[str] | None, rows: Iterator[dict]) -> Iterator[dict]:
    """A resumed stage's rows: what is on disk, then what the rest would add."""
    if done:
        yield from sd.rows()
    yield from rows


def _finish(
    counted: list[tuple[StageEstimate, Stage, TokenCounter, dict[str, Any], _Extra | None]],
    out: list[StageEstimate],
) -> bool:
    """What each counted stage's figures take from whole stages, in run order (each stage's
    count is complete now): whether its prompts read placeholders, the placeholder answers'
    share of its prompt bounds, how its tokens were counted, its measured output and
    re-asks. Returns whether any planned rows hold placeholders."""
    placeholders_in: set[str] = set()  # stages whose planned rows hold placeholders
    for est, stage, counter, m, extra in counted:
        est.estimated = est.estimated or any(u in placeholders_in for u in stage.reads)
        if extra is not None and "responses" in placeholders_in:
            est.total.prompt_bound += extra.held_total * extra.tokens
            est.total.budget_prompt += extra.held_total * extra.bytes
            est.to_send.prompt_bound += extra.held_to_send * extra.tokens
            est.to_send.budget_prompt += extra.held_to_send * extra.bytes
        if est.action != "skip" and est.placeholders:
            placeholders_in.add(est.stage)
        if not est.uses_llm:
            continue
        mean = m.get("output_per_choice")
        est.tokens = counter.method
        est.output_mean = mean
        if mean is not None:
            est.output_basis = (
                f"{mean:.1f} tokens per answer: the mean of {m['choices']:,} "
                "answers of this backend in the cache"
            )
        else:
            est.output_basis = "no answers of this backend to measure: the bound only"
        rate = m.get("reask_rate")
        est.reask_rate = rate
        if rate and est.to_send.requests:
            est.reasks_expected = rate * est.to_send.requests
            per_out = (m["completion_tokens"] / m["answers"]) if m.get("answers") else 0.0
            est.reask_prompt_tokens = est.reasks_expected * (m["prompt_per_answer"] + per_out)
            est.reask_output_tokens = est.reasks_expected * per_out
        if m:
            keys = ("answers", "reasks", "prompt_tokens", "completion_tokens")
            est.actual = {k: m[k] for k in keys}
    for i, est in enumerate(out):
        if not est.uses_llm and est.stage not in ("ingest", "rubrics"):
            est.examples = out[i - 1].examples  # the pair stage: the judge's examples
            est.examples_to_do = est.examples if est.action != "skip" else 0
    return bool(placeholders_in)


def _summarise(
    ctx: Context,
    stages: list[StageEstimate],
    tokens_per_second: float | None,
    measured: dict[str, dict[str, Any]],
    spent: Spend | None = None,
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    send = Figures()
    expected_known = True
    reasks = reask_prompt = reask_output = 0.0
    reask_budget_prompt = reask_budget_output = 0.0
    for e in stages:
        if not e.uses_llm:
            continue
        s = e.to_send
        send.requests += s.requests
        send.prompt_tokens += s.prompt_tokens
        send.prompt_bound += s.prompt_bound
        send.budget_prompt += s.budget_prompt
        send.output_bound += s.output_bound
        send.requests_expected += s.requests_expected
        send.prompt_expected += s.prompt_expected
        send.output_bound_expected += s.output_bound_expected
        if s.requests and e.reasks_expected:
            # a re-ask repeats the prompt with the answer and the reason appended, and a
            # cut-off one doubles max_tokens: counted at twice a first attempt's bound
            reask_budget_prompt += e.reasks_expected * 2 * s.budget_prompt / s.requests
            reask_budget_output += e.reasks_expected * 2 * s.output_bound / s.requests
        if s.requests and s.output_expected is None:
            expected_known = False
        send.output_expected = (send.output_expected or 0.0) + (s.output_expected or 0.0)
        reasks += e.reasks_expected
        reask_prompt += e.reask_prompt_tokens
        reask_output += e.reask_output_tokens
    expected_out = (send.output_expected or 0.0) + reask_output if expected_known else None
    prompt_all = send.prompt_tokens + reask_prompt
    totals: dict[str, Any] = {
        "requests_to_send": send.requests,
        # where the judge sends only what its verdicts make worth asking: what it expects
        "requests_expected": round(send.requests_expected, 1),
        "output_tokens_bound_expected": round(send.output_bound_expected),
        "reasks_expected": round(reasks, 1),
        "prompt_tokens": round(prompt_all),
        "output_tokens_expected": round(expected_out) if expected_out is not None else None,
        "output_tokens_bound": send.output_bound,
        "prompt_tokens_bound": send.prompt_bound,
    }
    prices = ctx.config.run.prices
    batch_prices = prices.batch_rates()
    # what the run pays: the batch rates when the backend sends batches and they are given
    paid = run_prices(ctx.config)
    spent = spent or Spend()
    # the run.budget under which the rest finishes: what this backend was paid so far
    # (the budget counts it) and the budget's own bound of every request still to send,
    # so a run given these limits is never refused a request the plan counted
    prompt_total = spent.prompt_tokens + send.budget_prompt + math.ceil(reask_budget_prompt)
    output_total = spent.completion_tokens + send.output_bound + math.ceil(reask_budget_output)
    totals["budget_to_finish"] = {
        "requests": spent.requests + send.requests + math.ceil(round(reasks, 6)),
        "tokens": prompt_total + output_total,
        "usd": cost_usd(prompt_total, output_total, paid),
        "spent_requests": spent.requests,
        "spent_tokens": spent.tokens,
    }
    tps, source = throughput(ctx, tokens_per_second, measured)
    out_tokens = expected_out if expected_out is not None else send.output_bound_expected
    time_ = {
        "output_tokens_per_second": tps,
        "source": source,
        "seconds": round(out_tokens / tps, 1) if tps else None,
        "basis": "expected output"
        if expected_out is not None
        else "output bound of the requests expected",
    }
    cost: dict[str, Any] = {
        "input_usd_per_million": prices.input_usd_per_million,
        "output_usd_per_million": prices.output_usd_per_million,
        "usd_expected": cost_usd(prompt_all, expected_out, prices)
        if expected_out is not None
        else None,
        "usd_bound": cost_usd(send.prompt_bound, send.output_bound, prices),
        # the same requests at run.prices' batch rates, beside the standard ones
        "batch": None,
        # which of the two this run pays: "batch" when the backend sends batches
        # (backend.openai.batch) and the batch rates are given
        "paid": "batch" if paid is not prices else "standard",
        "batch_mode": BACKENDS.get(ctx.config.backend.name).batch_priced(ctx.config.backend),
    }
    if batch_prices is not None:
        cost["batch"] = {
            "input_usd_per_million": batch_prices.input_usd_per_million,
            "output_usd_per_million": batch_prices.output_usd_per_million,
            "usd_expected": cost_usd(prompt_all, expected_out, batch_prices)
            if expected_out is not None
            else None,
            "usd_bound": cost_usd(send.prompt_bound, send.output_bound, batch_prices),
        }
    return totals, time_, cost
