"""The plan as a table for a terminal (``prb plan`` without ``--json``)."""

from __future__ import annotations

from pipeline.engine.budget import TEMPLATE_TOKENS_PER_MESSAGE
from pipeline.plan.result import Plan


def _n(x: float | None) -> str:
    return "-" if x is None else f"{round(x):,}"


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


# example prices the plan's hint shows (both are needed: run.prices takes both or none)
EXAMPLE_PRICES = (
    "run.prices.input_usd_per_million=0.15",
    "run.prices.output_usd_per_million=0.60",
)


def render(plan: Plan, fresh: Plan | None = None, command: str | None = None) -> str:
    """The plan as a table for a terminal. ``command``: the `prb plan` command that made
    it (config, options, every --set), which the hint for the cost extends."""
    lines = [f"run: {plan.run_dir}", f"backend: {plan.backend}"]
    head = (
        f"{'stage':11s}{'action':8s}{'examples':>10s}{'requests':>10s}{'cached':>9s}"
        f"{'to send':>9s}{'prompt tok':>12s}{'output tok':>12s}{'bound':>13s}"
    )
    lines += ["", head, "-" * len(head)]
    marked = False
    for e in plan.stages:
        mark = "*" if e.estimated else " "
        marked |= e.estimated
        if not e.uses_llm:
            what = "given rubrics, no request" if e.stage == "rubrics" else "no request"
            lines.append(f"{e.stage:11s}{e.action:8s}{e.examples_to_do:>10,}   ({what})")
            continue
        s = e.to_send
        lines.append(
            f"{e.stage + mark:11s}{e.action:8s}{e.examples_to_do:>10,}{e.total.requests:>10,}"
            f"{e.cached:>9,}{s.requests:>9,}{s.prompt_tokens:>12,}"
            f"{_n(s.output_expected) if s.requests else '0':>12s}{s.output_bound:>13,}"
        )
    t = plan.totals
    lines.append("-" * len(head))
    lines.append(
        f"{'total':19s}{'':>10s}{'':>10s}{'':>9s}{t['requests_to_send']:>9,}"
        f"{t['prompt_tokens']:>12,}{_n(t['output_tokens_expected']):>12s}"
        f"{t['output_tokens_bound']:>13,}"
    )
    lines.append("")
    lines.append(
        "examples: still to process; requests: every first attempt of the stage; "
        "to send: not done and not in the cache"
    )
    if marked:
        lines.append(
            "* estimate from upstream bounds: the stage's input is not written yet, so "
            "its prompts hold placeholders; the count is exact if every earlier "
            "answer comes back"
        )
    for e in plan.stages:
        s = e.to_send
        if e.uses_llm and s.requests_expected < s.requests - 1e-6:
            lines.append(
                f"{e.stage}: expected to send {s.requests_expected:,.0f} of these {s.requests:,} "
                f"requests ({s.requests_expected / max(e.examples_to_do, 1):.1f} an example, of "
                f"{s.requests / max(e.examples_to_do, 1):.1f} at most), output bound "
                f"{s.output_bound_expected:,.0f} tokens of {s.output_bound:,}"
            )
            lines += [f"{e.stage}: {note}" for note in e.notes]
    for e in plan.stages:
        if e.uses_llm:
            lines.append(f"{e.stage}: prompt tokens: {e.tokens}; output: {e.output_basis}")
            if e.reask_rate is not None:
                lines.append(
                    f"{e.stage}: re-asks: {e.reask_rate:.1%} of first attempts "
                    f"(measured), {e.reasks_expected:,.0f} expected, in the totals"
                )
            else:
                lines.append(
                    f"{e.stage}: re-asks: none measured, counted as 0 (invalid or "
                    "cut-off answers add requests the plan cannot know)"
                )
    for note in plan.notes:
        lines.append(f"note: {note}")
    need = t.get("budget_to_finish")
    if need and t["requests_to_send"]:
        usd = f", usd ${need['usd']:,.2f}" if need["usd"] is not None else ""
        lines.append(
            f"budget: the rest finishes under run.budget.requests {need['requests']:,}, "
            f"tokens {need['tokens']:,}{usd} or more: this backend's spending so far "
            f"({need['spent_requests']:,} requests, {need['spent_tokens']:,} tokens), plus "
            "what is to send as the budget bounds it (prompt bytes + "
            f"{TEMPLATE_TOKENS_PER_MESSAGE} a message, max_tokens a choice) and the expected "
            "re-asks at twice a first attempt's bound"
        )
    tm, c = plan.time, plan.cost
    if tm["seconds"] is not None:
        lines.append(
            f"time: about {_duration(tm['seconds'])} for the {tm['basis']} at "
            f"{tm['output_tokens_per_second']:,.0f} output tokens/s ({tm['source']})"
        )
    else:
        lines.append(f"time: not estimated ({tm['source']})")
    if plan.cost.get("batch_mode"):
        lines.append(
            "time: batches are answered within 24 hours (backend.openai.batch), often "
            "sooner; the estimate above is for sending them one by one"
        )
    batch = c.get("batch")
    paid_batch = c.get("paid") == "batch"
    if c["usd_bound"] is not None:
        exp = f"${c['usd_expected']:,.2f} expected, " if c["usd_expected"] is not None else ""
        lines.append(
            f"cost: {exp}${c['usd_bound']:,.2f} at most for first attempts (every answer "
            "at max_tokens, also where later prompts quote it), at "
            f"${c['input_usd_per_million']:g} / ${c['output_usd_per_million']:g} per "
            "million prompt / output tokens (run.prices)"
            + ("; not what this run pays, see batch below" if paid_batch else "")
        )
    if batch is not None:
        exp = (
            f"${batch['usd_expected']:,.2f} expected, " if batch["usd_expected"] is not None else ""
        )
        paid = (
            "what this run pays (backend.openai.batch is on)"
            if paid_batch
            else "if sent as batches (backend.openai.batch: true)"
        )
        lines.append(
            f"cost at batch rates: {exp}${batch['usd_bound']:,.2f} at most, at "
            f"${batch['input_usd_per_million']:g} / ${batch['output_usd_per_million']:g} per "
            f"million prompt / output tokens (run.prices.batch_*): {paid}"
        )
    if c["usd_bound"] is not None and batch is None and c.get("batch_mode"):
        lines.append(
            "cost: backend.openai.batch is on, but run.prices.batch_input_usd_per_million and "
            "batch_output_usd_per_million are not set: the run is priced at the standard "
            "rates above (OpenAI's batch rates are half of them)"
        )
    if c["usd_bound"] is None and batch is None:
        example = " ".join(f"--set {p}" for p in EXAMPLE_PRICES)
        with_prices = f"`{command} {example}`" if command else example
        lines.append(
            "cost: set run.prices.input_usd_per_million and output_usd_per_million to see "
            f"it, e.g. {with_prices}"
        )
    # a finished stage's estimate against what its backend answered (for a stage still
    # under way the ledger is only part of it)
    actual = [e for e in plan.stages if e.actual and e.action == "skip"]
    before = {e.stage: e for e in fresh.stages} if fresh is not None else {}
    if actual:
        lines += [
            "",
            "finished stages: the estimate a plan gives before the run (no cache, no run "
            "directory) against what was received (this backend's answers in cache.sqlite, "
            "re-asks included); output est: the expected tokens, else the max_tokens bound",
        ]
        lines.append(
            f"{'stage':11s}{'requests':>10s}{'answered':>10s}{'prompt est':>12s}"
            f"{'actual':>10s}{'output est':>12s}{'actual':>10s}"
        )
        for e in actual:
            a = e.actual or {}
            b = before.get(e.stage, e)
            out_est = b.total.output_expected
            shown = _n(out_est) if out_est is not None else f"<={b.total.output_bound:,}"
            # the expected counts: where the judge sends only part of what it could, the
            # share it expected (for every other stage, the counts themselves)
            lines.append(
                f"{e.stage:11s}{round(b.total.requests_expected):>10,}{a['answers']:>10,}"
                f"{round(b.total.prompt_expected):>12,}{a['prompt_tokens']:>10,}"
                f"{shown:>12s}{a['completion_tokens']:>10,}"
            )
    for e in plan.stages:
        if e.actual and e.action != "skip":
            a = e.actual
            lines.append(
                f"{e.stage}: so far {a['answers']:,} answers of this backend in the cache, "
                f"{a['prompt_tokens']:,} prompt + {a['completion_tokens']:,} output tokens"
            )
    lines.append(f"(planned in {plan.seconds:.1f} s; nothing was written or sent)")
    return "\n".join(lines)
