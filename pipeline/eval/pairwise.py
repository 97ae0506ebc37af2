"""Pairwise LLM judges through the project's backends and request cache.

Every pair is asked in both A/B orders. The verdict comes from a JSON schema (``winner``
pinned by an enum, the rationale bounded by maxLength), or, with ``format=text``, from a
free-text "Result: A" line as the reference script asks for (the last such line by
default, the first with ``parse=first`` as the reference reads it). A verdict that cannot be
parsed is a recorded failure with its reason (``invalid_json`` for a JSON verdict,
``no_verdict`` for a free-text one), not read as "A" as the reference script reads it,
unless ``unparsed=a`` asks for the reference's rule (the reason is recorded and counted
either way). The prompt is the project's template, or with ``system_prompt=`` and
``user_prompt=`` the user's own files (``data.file_messages``). Answers are cached in the
result folder's ``cache.sqlite``: a re-run sends nothing but the requests that failed to
get an answer. An unparseable answer is not asked again: with greedy decoding the judge
would say the same.
"""

from __future__ import annotations

import asyncio
import copy
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.backends.factory import make_backend
from pipeline.backends.identity import identify, identity_id
from pipeline.core.errors import InputError
from pipeline.core.fields import ORDERS
from pipeline.engine.llm import Answer, LLMRunner
from pipeline.eval.data import EvalPair, file_messages, pairwise_messages
from pipeline.run.cache import INVALID_PREFIX, RequestCache
from pipeline.run.layout import CACHE
from pipeline.types import schemas
from pipeline.types.chat import ChatRequest


def verdict_schema(max_tokens: int, ties: bool) -> dict[str, Any]:
    """The project's pairwise verdict schema (``pipeline.types.schemas``: the winner first, pinned
    by an enum, then a rationale whose maxLength fits ``max_tokens``), without "tie" unless
    ties are allowed."""
    try:
        schema = copy.deepcopy(schemas.pairwise_schema(max_tokens))
    except schemas.SchemaBudgetError as exc:
        raise InputError(str(exc), path="--scorer", field="max_tokens") from None
    if not ties:
        schema["properties"]["winner"]["enum"] = ["A", "B"]
    return schema


_THINK_END = re.compile(r"</think>", re.I)
_RESULT = re.compile(r"result\s*[:：]\s*(a|b|tie)\b", re.I)
_RESULT_MARK = re.compile(r"result\s*[:：]", re.I)
# The reason a free-text answer without a verdict is recorded under (a JSON one keeps the
# cache's "invalid_json": it is one).
TEXT_FAILURE = "no_verdict"


def parse_text_verdict(text: str, ties: bool, which: str = "last") -> str:
    """The letter of the last "Result: X" (``which="last"``) or of the first "Result:"
    (``which="first"``, as the reference script reads it: what follows its first
    "result:" decides, and a first one without a letter is no verdict), after any
    </think> block, with quotes and markdown emphasis removed; raises ValueError when
    there is none."""
    parts = _THINK_END.split(text)
    if len(parts) == 1 and "<think>" in text.lower():
        raise ValueError("the answer ends inside its <think> block")
    tail = parts[-1].replace('"', "").replace("*", "")
    if which == "first":
        mark = _RESULT_MARK.search(tail)
        m = _RESULT.match(tail, mark.start()) if mark else None
        found = [m.group(1)] if m else []
    else:
        found = _RESULT.findall(tail)
    if not found:
        where = " first" if which == "first" else ""
        raise ValueError(f"no 'Result: A' or 'Result: B' line{where} in the answer")
    value = found[-1].lower()
    if value == "tie":
        if not ties:
            raise ValueError("answered 'tie' but ties are not allowed")
        return "tie"
    return value.upper()


@dataclass
class JudgeOutcome:
    """The verdicts of one setting: per pair, per order, a letter or a failure reason."""

    letters: dict[str, dict[str, str | None]] = field(default_factory=dict)
    reasons: dict[str, dict[str, str]] = field(default_factory=dict)
    rationales: dict[str, dict[str, str]] = field(default_factory=dict)
    # verdicts that could not be parsed (final: failures, or "A" with unparsed=a)
    unparsed: int = 0
    transport_failed: int = 0  # requests that failed to get an answer (retried next run)


def build_requests(
    pairs: list[EvalPair],
    setting: str,
    model: str,
    spec: Any,
    seed: int,
    served_by: str = "",
    identity: dict[str, Any] | None = None,
) -> tuple[list[ChatRequest], list[tuple[str, str]]]:
    """Both orders of every pair; ``identity`` (the answering backend's) decides whether
    the schema is sent with its rationale's bound (pipeline/types/schemas.py: for_engine)."""
    fmt, ties = spec.opt("format"), spec.opt("ties")
    schema = verdict_schema(spec.opt("max_tokens"), ties) if fmt == "json" else None
    files = getattr(spec, "prompts", None) or {}
    reqs, meta = [], []
    for p in pairs:
        for order in ORDERS:
            if files:
                messages = file_messages(
                    p, setting, order, system=files["system_prompt"], user=files["user_prompt"]
                )
            else:
                messages = pairwise_messages(p, setting, order, fmt=fmt, ties=ties)
            reqs.append(
                ChatRequest(
                    messages=messages,
                    model=model,
                    temperature=spec.opt("temperature"),
                    top_p=1.0,
                    max_tokens=spec.opt("max_tokens"),
                    n=1,
                    seed=seed,
                    # checked with the rationale's bound, sent with it only where the engine
                    # enforces it cheaply (schemas.for_engine)
                    json_schema=None
                    if schema is None
                    else schemas.for_engine(schema, identity or {}),
                    schema_name="PairwiseVerdict" if fmt == "json" else "answer",
                    served_by=served_by,
                )
            )
            meta.append((p.key, order))
    return reqs, meta


def _record_failure(
    out: JudgeOutcome,
    key: str,
    order: str,
    reason: str,
    fmt: str = "json",
    unparsed_as_a: bool = False,
) -> None:
    """Record why a request has no verdict; an unparseable verdict is read as "A" with
    ``unparsed_as_a`` (the reference's rule), its reason kept all the same."""
    if reason.startswith(INVALID_PREFIX) and fmt == "text":
        # the cache files every unparseable answer under one prefix; a free-text answer
        # is not JSON: its reason says what it is
        reason = TEXT_FAILURE + reason[len(INVALID_PREFIX) :]
    out.reasons.setdefault(key, {})[order] = reason[:300]
    if reason.startswith((INVALID_PREFIX, TEXT_FAILURE)):
        out.unparsed += 1
        if unparsed_as_a:
            out.letters.setdefault(key, {o: None for o in ORDERS})[order] = "A"
    else:
        out.transport_failed += 1


async def _judge(
    runner: Any, reqs: list[ChatRequest], meta: list[tuple[str, str]], spec: Any
) -> JudgeOutcome:
    fmt, ties = spec.opt("format"), spec.opt("ties")
    as_a = spec.opt("unparsed") == "a"
    full = verdict_schema(spec.opt("max_tokens"), ties) if fmt == "json" else None

    def validate(req: ChatRequest, text: str, cut: bool = False) -> tuple[str, str]:
        """(letter, rationale); ValueError names what is wrong, for the re-ask. JSON is
        checked against the full schema, as the judge stage checks it: a rationale over
        its bound is shortened, and a verdict cut at max_tokens after its winner is kept."""
        if full is not None:
            value = schemas.read(full, text, cut=cut, clip=True).value
            return value["winner"], value["rationale"]
        return parse_text_verdict(text, ties, spec.opt("parse")), ""

    def salvage(req: ChatRequest, text: str) -> tuple[str, str]:
        return validate(req, text, cut=True)

    out = JudgeOutcome()
    for key, _ in meta:
        out.letters.setdefault(key, {o: None for o in ORDERS})
    # An answer that could not be parsed is the judge's final word (greedy decoding gives
    # the same again): an earlier run's is recorded as it was, and not asked again.
    cache = runner.cache
    known = cache.invalid_failures(r.key for r in reqs)
    why = {
        e["key"]: e["reason"]
        for e in cache.errors(runner.stage)
        if e["key"] in known and e["reason"].startswith(INVALID_PREFIX)
    }
    send = [i for i, r in enumerate(reqs) if r.key not in known]
    for i, r in enumerate(reqs):
        if r.key in known:
            reason = why.get(r.key, f"{INVALID_PREFIX}: earlier run")
            _record_failure(out, *meta[i], reason, fmt, as_a)
    salvage_json = salvage if full is not None else None
    async for j, outcome in runner.stream([reqs[i] for i in send], validate, salvage_json):
        key, order = meta[send[j]]
        if isinstance(outcome, Answer):
            letter, rationale = (outcome.parsed or [(None, "")])[0]
            out.letters[key][order] = letter
            if rationale:
                out.rationales.setdefault(key, {})[order] = rationale
        else:
            _record_failure(out, key, order, outcome.reason, fmt, as_a)
    return out


def prompt_info(spec: Any) -> dict[str, Any]:
    """What the judge was asked with, for results.json: the project's template, or the
    user's prompt files by name and SHA-256 (not their folder: paths are the user's)."""
    files = getattr(spec, "prompts", None) or {}
    if not files:
        return {"source": "template", "template": "eval_pairwise"}
    return {
        "source": "files",
        **{k: {"file": f.path.name, "sha256": f.sha256} for k, f in files.items()},
        "user_prompt_placeholders": list(files["user_prompt"].placeholders),
    }


def run_judge(
    pairs: list[EvalPair],
    settings: list[str],
    spec: Any,
    cfg: Any,
    out_dir: Path,
    *,
    progress: bool = True,
) -> tuple[dict[str, JudgeOutcome], dict[str, Any]]:
    """Ask the judge about every pair, in both orders, for each setting."""
    model = spec.target or cfg.judge.model or cfg.backend.model
    cache_path = out_dir / CACHE  # the judge's own cache, beside its results
    # what answers is part of each request's key, as in a run (pipeline/backends/identity.py)
    served = identify(cfg.backend, [model], resolve=cfg.resolve_input, cache_path=cache_path)
    served_id = identity_id(served)

    async def go() -> tuple[dict[str, JudgeOutcome], dict[str, Any]]:
        backend = make_backend(cfg.backend, cache_path, cfg.resolve_input)
        results: dict[str, JudgeOutcome] = {}
        stats: dict[str, Any] = {}
        try:
            with RequestCache(cache_path) as cache:
                cache.put_backend(served_id, served)
                for setting in settings:
                    reqs, meta = build_requests(
                        pairs, setting, model, spec, cfg.run.seed, served_by=served_id,
                        identity=served,
                    )  # fmt: skip
                    runner = LLMRunner(
                        backend,
                        cache,
                        f"eval-{setting}",
                        # The re-ask message asks for JSON: a text judge gets no re-ask.
                        max_reasks=cfg.backend.max_reasks if spec.opt("format") == "json" else 0,
                        abort_after_failures=cfg.backend.abort_after_failures,
                        progress=progress,
                        invalid_retry_runs=0,  # see _judge: an unparseable verdict is final
                    )
                    results[setting] = await _judge(runner, reqs, meta, spec)
                    stats[setting] = runner.stats.as_dict()
        finally:
            await backend.aclose()
        return results, stats

    out_dir.mkdir(parents=True, exist_ok=True)
    results, stats = asyncio.run(go())
    info = {
        "model": model,
        "backend": cfg.backend.name,
        "served_by": served,
        "format": spec.opt("format"),
        "ties_allowed": spec.opt("ties"),
        "temperature": spec.opt("temperature"),
        "max_tokens": spec.opt("max_tokens"),
        "parse": f"{spec.opt('parse')} 'Result:' line" if spec.opt("format") == "text" else None,
        "unparsed_verdicts_read_as": "A" if spec.opt("unparsed") == "a" else "failure",
        "prompt": prompt_info(spec),
        "seed": cfg.run.seed,
        "requests": stats,
    }
    return results, info
