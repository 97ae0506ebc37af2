"""A reasoning model's answers: the reasoning taken out of the answer, counted, and a
reasoning that used its whole budget told apart from an answer (docs/backends.md,
"Reasoning models").

A model such as DeepSeek-R1 (and its distills), Qwen3 or QwQ writes ``<think> ...
</think>`` before its answer. Every backend with ``backend.<name>.reasoning.enabled`` hands
its results through :func:`finish`, so that a :class:`~pipeline.types.chat.Choice`'s ``text`` is
the answer alone and its ``reasoning`` the block, with its tokens; nothing downstream (a
chosen or rejected text, a rubric, a verdict's rationale) ever sees the reasoning.

Splitting follows vLLM's ``deepseek_r1`` reasoning parser, so that an answer read here and
one read from ``vllm serve --reasoning-parser deepseek_r1`` agree: the start tag, when the
answer begins with it, is dropped; what comes before the end tag is the reasoning and what
follows it the answer. Without an end tag, an answer that opened the block (or one whose chat
template opens it: ``template_opens``) is all reasoning and no answer; one that never opened
it is all answer (the model chose not to reason). A reasoning that did not end when the
engine stopped on its token limit is ``reasoning_cut``: the runner (pipeline/engine/llm.py) asks it
again with twice the reasoning budget, and never reads it as an answer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from pipeline.types.chat import ChatRequest, ChatResult, Choice, reasoning_allowance

# a reasoning budget is doubled at most up to this many tokens (the runner's retry)
REASONING_BUDGET_CAP = 65_536


def split(
    text: str, start_tag: str = "<think>", end_tag: str = "</think>", template_opens: bool = False
) -> tuple[str, str | None, bool]:
    """``(answer, reasoning, ended)`` of one raw answer. ``reasoning`` is None when the
    answer holds no reasoning block; ``ended`` is False when a block was opened and never
    closed (then the answer is empty)."""
    body = text.lstrip()
    opened = body.startswith(start_tag)
    if opened:
        body = body[len(start_tag) :]
    head, found, tail = body.partition(end_tag)
    if found:
        return tail.lstrip(), head.strip(), True
    if opened or template_opens:
        return "", body.strip(), False
    return text, None, True


def _tags(record: dict[str, Any]) -> tuple[str, str, bool]:
    start, end = record.get("tags") or ("<think>", "</think>")
    return str(start), str(end), bool(record.get("template_opens"))


def split_choice(
    choice: Choice, record: dict[str, Any], count: Callable[[str], int] | None = None
) -> Choice:
    """``choice`` with its reasoning taken out of its text (``record``: the backend's
    identity record of its reasoning settings). A reasoning already apart (a server's
    ``reasoning`` field) is kept, and a block still in the text is taken out too. ``count``
    gives a text's tokens; without it the tokens are set later (:func:`share_tokens`)."""
    start, end, opens = _tags(record)
    answer, found, ended = split(choice.text, start, end, opens)
    reasoning = choice.reasoning
    if found is not None:
        reasoning = found if reasoning is None else f"{reasoning}\n{found}".strip()
    elif reasoning is not None:
        # the server split it (its reasoning parser): its content is the answer, and a
        # reasoning cut at the limit left no content at all
        ended = bool(answer.strip()) or choice.finish_reason != "length"
    if reasoning is None:
        return choice
    cut = not ended and choice.finish_reason == "length"
    tokens = count(reasoning) if count is not None else choice.reasoning_tokens
    return replace(
        choice, text=answer, reasoning=reasoning, reasoning_tokens=tokens, reasoning_cut=cut
    )


def share_tokens(result: ChatResult) -> ChatResult:
    """Reasoning tokens for choices that have none counted: the completion tokens shared
    out by characters (a server that reports no reasoning count, an engine whose tokenizer
    is not at hand). An estimate, never more than the completion tokens."""
    todo = [c for c in result.choices if c.reasoning is not None and not c.reasoning_tokens]
    if not todo or result.completion_tokens <= 0:
        return result
    chars = sum(len(c.text) + len(c.reasoning or "") for c in result.choices)
    if chars <= 0:
        return result
    per_char = result.completion_tokens / chars
    choices = [
        replace(c, reasoning_tokens=max(1, round(len(c.reasoning or "") * per_char)))
        if c in todo
        else c
        for c in result.choices
    ]
    return replace(result, choices=choices)


def finish(
    result: ChatResult,
    record: dict[str, Any] | None,
    count: Callable[[str], int] | None = None,
) -> ChatResult:
    """``result`` with every choice's reasoning apart from its answer (no-op when the
    backend does not reason: ``record`` None)."""
    if not record:
        return result
    out = replace(result, choices=[split_choice(c, record, count) for c in result.choices])
    return bound_tokens(share_tokens(out))


def bound_tokens(result: ChatResult) -> ChatResult:
    """Reasoning tokens no more than what was generated: a single answer whose reasoning
    used every token is all reasoning (a text tokenized again can count a few more tokens
    than the engine generated)."""
    total = result.completion_tokens
    if total <= 0:
        return result
    choices = []
    for c in result.choices:
        whole = c.reasoning is not None and len(result.choices) == 1 and c.reasoning_cut
        if whole or c.reasoning_tokens > total:
            c = replace(c, reasoning_tokens=total)
        choices.append(c)
    return replace(result, choices=choices)


def sent_request(req: ChatRequest, record: dict[str, Any] | None) -> ChatRequest:
    """The request as the engine is sent it: the reasoning's allowance added to its
    max_tokens (the answer's own bound)."""
    extra = reasoning_allowance(req, record)
    return replace(req, max_tokens=req.max_tokens + extra) if extra else req


def retry_request(req: ChatRequest, record: dict[str, Any] | None) -> ChatRequest | None:
    """The request an answer whose reasoning used its whole budget is asked again with:
    twice the budget (up to REASONING_BUDGET_CAP); None when there is no more room or the
    backend gave it no reasoning budget."""
    now = reasoning_allowance(req, record)
    more = min(now * 2, REASONING_BUDGET_CAP)
    return replace(req, reasoning_budget=more) if now and more > now else None


def cut_reason(result: ChatResult, req: ChatRequest, record: dict[str, Any] | None) -> str:
    """The failure reason of an answer whose reasoning never ended (its own code,
    ``reasoning_exhausted``)."""
    tokens = max((c.reasoning_tokens for c in result.choices if c.reasoning_cut), default=0)
    budget = reasoning_allowance(req, record)
    if not budget:  # a server that reasons, not told so: the reasoning shared max_tokens
        return (
            f"reasoning_exhausted: the reasoning used every one of the {req.max_tokens} "
            f"tokens (about {tokens} written) without ending, so no answer came; set "
            "backend.<name>.reasoning.enabled to give it a budget of its own"
        )
    return (
        f"reasoning_exhausted: the reasoning used its budget of {budget} tokens (about "
        f"{tokens} written) without ending, so no answer came; raise "
        "backend.<name>.reasoning.budget"
    )


def describe(record: dict[str, Any] | None) -> str:
    """A few words for a backend's description: how its reasoning is handled."""
    if not record:
        return ""
    mode = record.get("json_mode")
    how = "grammar after the reasoning" if mode == "reason_first" else "JSON under the grammar"
    parser = f", parser {record['parser']}" if record.get("parser") else ""
    return f"; a reasoning model (budget {record.get('budget')} tokens, {how}{parser})"
