"""What a run spends: the ledger of what was sent and received, its cost at the configured
prices, and the budget checked before each request goes to the backend (docs/plan.md).

The ledger over a run's life is read from its cache.sqlite, which holds every answer with
its usage (robust across resumes and kills: an answer is committed before it is used), per
stage and per answering backend (``served_by``); a stage's ``stats.json`` adds what the
latest invocation did (sent, cached, failed, re-asks, seconds).

The budget (``run.budget``) counts what the run already received from the backend that
answers it (the ledger) plus what this invocation has received, plus a bound of every
request in flight: a prompt counts as its UTF-8 bytes plus a few tokens per message (a
token is at least one byte in every tokenizer the backends use), an answer as
``max_tokens`` for each of its ``n`` choices, both as the server is sent it (its dialect:
a schema stated in the prompt, a prompt per choice where ``n`` is split). A request whose
bound could take the run past a limit waits until answers in flight replace their bounds
by their real usage; when nothing is in flight and it still does not fit, the stage stops with
:class:`~pipeline.core.errors.BudgetReached` (everything answered is kept). The bound is
conservative, so a run stops somewhat below its budget, never above it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pipeline.backends.identity import identity_id
from pipeline.config import Config, PricesSection
from pipeline.core.errors import BudgetReached, PipelineError
from pipeline.kinds.backend import BACKENDS, AsSent
from pipeline.run import RunDir
from pipeline.run.cache import RequestCache
from pipeline.types.chat import ChatRequest, ChatResult, RequestFailure, output_bound

# chat-template tokens a message may add around its content (role markers, separators)
TEMPLATE_TOKENS_PER_MESSAGE = 16
LLM_STAGES = ("rubrics", "responses", "judge")


def cost_usd(prompt_tokens: float, completion_tokens: float, prices: PricesSection) -> float | None:
    """The cost of these tokens at ``prices``; None when the prices are not given."""
    if prices.input_usd_per_million is None or prices.output_usd_per_million is None:
        return None
    return (
        prompt_tokens * prices.input_usd_per_million
        + completion_tokens * prices.output_usd_per_million
    ) / 1e6


def run_prices(config: Config) -> PricesSection:
    """The prices a run pays: ``run.prices``, with its batch rates when the backend sends
    batches (``backend.openai.batch``) and they are given; a batch run without batch rates
    is priced at the standard ones, which bound it from above."""
    prices = config.run.prices
    if BACKENDS.get(config.backend.name).batch_priced(config.backend):
        return prices.batch_rates() or prices
    return prices


@dataclass
class Spend:
    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def add(self, other: Spend, sign: int = 1) -> None:
        self.requests += sign * other.requests
        self.prompt_tokens += sign * other.prompt_tokens
        self.completion_tokens += sign * other.completion_tokens


def request_bound(
    req: ChatRequest, as_sent: AsSent | None = None, reasoning: dict[str, Any] | None = None
) -> Spend:
    """The most one request can cost: its prompt's bytes (no token is shorter than a byte)
    plus the template's tokens per message, and ``max_tokens`` for each choice (plus a
    reasoning model's reasoning budget: ``reasoning``, the identity's record); with
    ``as_sent``, summed over what its server is sent (``Backend.as_sent``: the schema
    stated in the prompt, a prompt per choice where ``n`` is split)."""
    prompt = output = 0
    for sent in as_sent(req) if as_sent is not None else (req,):
        prompt += sum(len(c.encode("utf-8", "surrogatepass")) for _, c in sent.messages)
        prompt += TEMPLATE_TOKENS_PER_MESSAGE * len(sent.messages)
        output += output_bound(sent, reasoning) * sent.n
    return Spend(1, prompt, output)


def backend_spend(cache: RequestCache, served_by: str) -> Spend:
    """What the run's cache holds as received from one backend, over every stage."""
    out = Spend()
    for row in cache.ledger():
        if row["served_by"] == served_by:
            out.add(Spend(row["answers"], row["prompt_tokens"], row["completion_tokens"]))
    return out


class Budget:
    """The admission check of one stage's runner (pipeline/engine/llm.py)."""

    def __init__(
        self,
        *,
        requests: int | None,
        tokens: int | None,
        usd: float | None,
        prices: PricesSection,
        spent: Spend,
        as_sent: AsSent | None = None,
        reasoning: dict[str, Any] | None = None,
    ) -> None:
        self.limits = {"requests": requests, "tokens": tokens, "usd": usd}
        # a reasoning model's reasoning budget, on top of each answer's max_tokens
        self.reasoning = reasoning
        # how the server is sent a request (the identity's record): what a request's
        # bound is counted on
        self.as_sent = as_sent
        self.prices = prices
        self.prior = spent  # received before this stage started (the ledger)
        self.received = Spend()  # received by this stage in this invocation
        self.inflight = Spend()  # bounds of what was sent and is not answered yet
        self.reached_limit: str | None = None  # the limit the latest refusal would cross

    def _over(self, s: Spend) -> str | None:
        lim = self.limits
        if lim["requests"] is not None and s.requests > lim["requests"]:
            return "requests"
        if lim["tokens"] is not None and s.tokens > lim["tokens"]:
            return "tokens"
        if lim["usd"] is not None:
            usd = cost_usd(s.prompt_tokens, s.completion_tokens, self.prices)
            if usd is not None and usd > lim["usd"]:
                return "usd"
        return None

    def bound(self, req: ChatRequest) -> Spend:
        return request_bound(req, self.as_sent, self.reasoning)

    def admit(self, req: ChatRequest) -> bool:
        """Whether ``req`` may be sent now: False when its bound, with what was received and
        the bounds of what is in flight, could cross a limit; True counts it in flight."""
        bound = self.bound(req)
        total = Spend()
        for part in (self.prior, self.received, self.inflight, bound):
            total.add(part)
        over = self._over(total)
        if over is not None:
            self.reached_limit = over
            return False
        self.inflight.add(bound)
        return True

    def settle(self, req: ChatRequest, outcome: ChatResult | RequestFailure) -> None:
        """An admitted request came back: its bound leaves, its real usage counts (a failed
        request received nothing and is not counted)."""
        self.inflight.add(self.bound(req), sign=-1)
        if isinstance(outcome, ChatResult):
            self.received.add(Spend(1, outcome.prompt_tokens, outcome.completion_tokens))

    def spent(self) -> Spend:
        total = Spend()
        total.add(self.prior)
        total.add(self.received)
        return total

    def reached(self, stage: str, stats: dict[str, Any]) -> BudgetReached:
        """The error a stage stops with once what was in flight is answered."""
        field = self.reached_limit or "tokens"
        limit = self.limits[field]
        s = self.spent()
        usd = cost_usd(s.prompt_tokens, s.completion_tokens, self.prices)
        shown = f"${limit:,.2f}" if field == "usd" else f"{limit:,}"
        money = f", ${usd:,.2f} at run.prices" if usd is not None else ""
        spent = {
            "requests": s.requests,
            "prompt_tokens": s.prompt_tokens,
            "completion_tokens": s.completion_tokens,
            "usd": usd,
        }
        return BudgetReached(
            f"stage '{stage}' stopped at run.budget.{field} = {shown}: the next request could "
            f"cross it. Spent by this run's backend so far: {s.requests:,} requests, "
            f"{s.prompt_tokens:,} prompt + {s.completion_tokens:,} output tokens{money}. "
            "Everything answered is kept; the stage is unfinished",
            stats=stats,
            spent={"limit": f"run.budget.{field}", "value": limit, **spent},
        )


def make_budget(
    config: Config, cache: RequestCache, served_by: str, identity: dict[str, Any] | None = None
) -> Budget | None:
    """The budget of a stage's runner; None when ``run.budget`` sets no limit. ``identity``:
    what serves the run, whose record decides what a request is sent as."""
    b = config.run.budget
    if b.requests is None and b.tokens is None and b.usd is None:
        return None
    as_sent, _ = BACKENDS.get(config.backend.name).as_sent(identity or {})
    return Budget(
        requests=b.requests,
        tokens=b.tokens,
        usd=b.usd,
        prices=run_prices(config),
        spent=backend_spend(cache, served_by),
        as_sent=as_sent,
        reasoning=(identity or {}).get("reasoning"),
    )


# ---- the ledger ----------------------------------------------------------------------------


def _ledger_entry(row: dict[str, Any] | None, prices: PricesSection | None) -> dict[str, Any]:
    row = row or {}
    prompt, completion = int(row.get("prompt_tokens") or 0), int(row.get("completion_tokens") or 0)
    return {
        "answers": int(row.get("answers") or 0),
        "reasks": int(row.get("reasks") or 0),
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "usd": cost_usd(prompt, completion, prices) if prices is not None else None,
    }


def stage_ledger(
    cache: RequestCache,
    stage: str,
    served_by: str,
    prices: PricesSection | None,
    llm: dict[str, Any] | None,
) -> dict[str, Any]:
    """A stage's ledger for its stats.json: ``run``, what the cache holds as received by
    this stage from its backend over the run's life; ``invocation``, what this invocation
    sent and took from the cache (the runner's figures), with the cost of both."""
    row = next((r for r in cache.ledger(stage) if r["served_by"] == served_by), None)
    out: dict[str, Any] = {"run": _ledger_entry(row, prices)}
    if llm:
        inv = {
            k: llm.get(k, 0)
            for k in (
                "requests",
                "sent",
                "cached",
                "failed",
                "reasks",
                "prompt_tokens",
                "completion_tokens",
                "seconds",
            )
        }
        inv["usd"] = (
            cost_usd(inv["prompt_tokens"], inv["completion_tokens"], prices) if prices else None
        )
        out["invocation"] = inv
    return out


def run_ledger(rd: RunDir, prices: PricesSection | None) -> dict[str, Any]:
    """The whole run's ledger, read-only: per LLM stage that ran, what its backend (the one
    its stage.json records) answered as the cache holds it, failures recorded, the latest
    invocation's figures from stats.json, and totals. Empty without a cache."""
    if not rd.cache_path.is_file():
        return {}
    with RequestCache(rd.cache_path, readonly=True) as cache:
        rows = cache.ledger()
        failures = cache.counts_by_stage()
    stages: dict[str, Any] = {}
    total = Spend()
    reasks = 0
    for name in LLM_STAGES:
        sd = rd.stage(name)
        try:
            meta = sd.meta
            stats = sd.stats()
        except PipelineError:
            continue
        served = (meta.environment or {}).get("served_by") if meta is not None else None
        if not isinstance(served, dict):
            continue
        sid = identity_id(served)
        row = next((r for r in rows if r["stage"] == name and r["served_by"] == sid), None)
        entry = _ledger_entry(row, prices)
        entry["failed_requests"] = (failures.get(name) or {}).get("failed_keys", 0)
        llm = stats.get("llm")
        if isinstance(llm, dict):
            entry["latest_invocation"] = {
                k: llm.get(k) for k in ("sent", "cached", "failed", "reasks", "seconds")
            }
        stages[name] = entry
        total.add(Spend(entry["answers"], entry["prompt_tokens"], entry["completion_tokens"]))
        reasks += entry["reasks"]
    if not stages:
        return {}
    return {
        "stages": stages,
        "total": {
            "answers": total.requests,
            "reasks": reasks,
            "prompt_tokens": total.prompt_tokens,
            "completion_tokens": total.completion_tokens,
            "usd": cost_usd(total.prompt_tokens, total.completion_tokens, prices)
            if prices is not None
            else None,
        },
        "prices": (
            {
                "input_usd_per_million": prices.input_usd_per_million,
                "output_usd_per_million": prices.output_usd_per_million,
            }
            if prices is not None and cost_usd(0, 0, prices) is not None
            else None
        ),
    }
