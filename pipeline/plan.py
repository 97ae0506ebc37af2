"""`prb plan CONFIG`: what a run will send, and what it may cost, before anything is sent.

For every stage: the examples it would process, its requests (counted from the stage's own
request builders, ``Stage.plan_examples``, the same requests ``prb run`` sends, so their
keys are looked up in the run's cache and a resumed run counts only what is missing), the
prompt tokens of what is to be sent, and the output tokens: the bound (``max_tokens`` for
each choice) and, where the run's cache has answers of this backend, the measured mean.
Then time (at a throughput given or measured) and money (at ``run.prices``). After a run,
the estimate of each whole stage stands beside what its ledger says was received.

A stage whose input does not exist yet (the judge before the answers) is planned on
placeholder rows: the upstream stage's own row builder fed with placeholder text of the
expected length. Its number of requests is still exact when every upstream answer comes
back (the judge asks two pointwise questions per candidate and four per shortlisted pair);
its prompts are estimates, and the table marks them.

Planning writes nothing (no run directory, no cache file, no lock) and sends no request:
the cache is opened read-only, or an empty one is kept in memory; the backend's identity
(part of every request's key) may ask a server's ``/models``, and when it cannot be had the
identity the run recorded is used, or the plan says the cache cannot be matched.
"""

from __future__ import annotations

import itertools
import json
import math
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pipeline.backends import BACKENDS
from pipeline.budget import (
    LLM_STAGES,
    TEMPLATE_TOKENS_PER_MESSAGE,
    Spend,
    backend_spend,
    cost_usd,
    request_bound,
)
from pipeline.cache import RequestCache
from pipeline.chat import ChatRequest
from pipeline.config import Config
from pipeline.errors import BackendError, PipelineError
from pipeline.run import RunDir
from pipeline.stages.base import Context, PlannedExample, Stage

DEFAULT_CHARS_PER_TOKEN = 4.0  # English text with the current BPE tokenizers
# a slow tokenizer counts this many prompts of a stage exactly; the rest are counted by
# their characters at the ratio measured on those
EXACT_PROMPTS = 2000
# cached answers a characters-per-token estimate is calibrated on, and the fewest it needs
CALIBRATION_ANSWERS = 500
MIN_CALIBRATION = 20
# words of a generated rubric's aspect when no rubric exists yet to measure
GUESSED_ASPECT_WORDS = 8
LOOKUP_BATCH = 900
# what throughputs measured by the project's benchmarks are read from
BENCHMARK_RESULTS = Path(__file__).resolve().parent.parent / "benchmarks" / "results"


# ---- counting tokens -----------------------------------------------------------------------


class TokenCounter:
    """Prompt tokens of a request; ``method`` says how they are counted."""

    method: str = ""
    exact: bool = False

    def count(self, req: ChatRequest) -> int:
        raise NotImplementedError

    def text(self, text: str) -> int:
        raise NotImplementedError

    def fresh(self) -> TokenCounter:
        """A counter for the next stage (a sampled counter measures each stage anew)."""
        return self


class WordCounter(TokenCounter):
    """The stand-in server's own count: the words of each message (tests/standin_server.py)."""

    method = "the stand-in server's own count (words of each message)"
    exact = True

    def count(self, req: ChatRequest) -> int:
        return sum(len(c.split()) for _, c in req.messages)

    def text(self, text: str) -> int:
        return len(text.split())


class CharCounter(TokenCounter):
    def __init__(self, chars_per_token: float, method: str) -> None:
        self.chars_per_token = chars_per_token
        self.method = method

    def count(self, req: ChatRequest) -> int:
        return math.ceil(sum(len(c) for _, c in req.messages) / self.chars_per_token)

    def text(self, text: str) -> int:
        return math.ceil(len(text) / self.chars_per_token)


class SampledCounter(TokenCounter):
    """A real tokenizer (``exact_count``) on the first EXACT_PROMPTS prompts of a stage,
    then characters at the ratio measured on them: a tokenizer with a chat template takes
    about a millisecond a prompt, and a run has hundreds of thousands."""

    exact = True

    def __init__(self, exact_count: Any, exact_text: Any, method: str) -> None:
        self._exact, self._text, self.base = exact_count, exact_text, method
        self.counted = self.scaled = 0
        self._tokens = self._chars = 0

    @property
    def method(self) -> str:  # type: ignore[override]
        if not self.scaled:
            return self.base
        return (
            f"{self.base}; {self.counted:,} prompts counted, {self.scaled:,} more by "
            "their characters at the ratio measured on those"
        )

    def fresh(self) -> SampledCounter:
        return SampledCounter(self._exact, self._text, self.base)

    def count(self, req: ChatRequest) -> int:
        chars = sum(len(c) for _, c in req.messages)
        if self.counted < EXACT_PROMPTS:
            n = int(self._exact(req))
            self.counted += 1
            self._tokens += n
            self._chars += chars
            return n
        self.scaled += 1
        return round(chars * self._tokens / max(self._chars, 1))

    def text(self, text: str) -> int:
        return int(self._text(text))


def _hf_counter(name: str, local_files_only: bool = True) -> SampledCounter:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(name, local_files_only=local_files_only)
    templated = bool(getattr(tok, "chat_template", None))

    def count(req: ChatRequest) -> int:
        msgs = req.message_dicts()
        if templated:
            out: Any = tok.apply_chat_template(msgs, tokenize=True, add_generation_prompt=True)
            # a list of ids, or (newer releases) a BatchEncoding holding them
            return len(out["input_ids"] if hasattr(out, "keys") else out)
        return sum(len(tok.encode(m["content"], add_special_tokens=False)) + 4 for m in msgs)

    def text(s: str) -> int:
        return len(tok.encode(s, add_special_tokens=False))

    how = "with its chat template" if templated else "contents, +4 tokens a message"
    return SampledCounter(count, text, f"the model's tokenizer (transformers, {name}; {how})")


def _hf_local(model: str) -> tuple[str, bool] | None:
    """(what to load, local files only) for a model whose tokenizer is on this machine: a
    model folder, or a name in the Hugging Face cache."""
    import os

    folder = Path(model).expanduser()
    if folder.is_dir():
        return str(folder), True
    if "/" not in model or model.startswith((".", "/")):
        return None
    hub = os.environ.get("HF_HUB_CACHE") or os.path.join(
        os.environ.get("HF_HOME") or str(Path.home() / ".cache" / "huggingface"), "hub"
    )
    if (Path(hub) / f"models--{model.replace('/', '--')}").is_dir():
        return model, True
    return None


def choose_counter(
    config: Config, identity: dict[str, Any], model: str, cache: RequestCache, served_by: str
) -> tuple[TokenCounter, list[str]]:
    """The best token count available here for ``model``, and notes on what was not."""
    notes: list[str] = []
    if identity.get("kind") == "stand-in":
        return WordCounter(), notes
    own, more = BACKENDS.get(config.backend.name).token_counter(
        config.backend, model, config.resolve_input
    )
    if own is not None:
        return SampledCounter(own.prompt, own.text, own.method), notes
    notes += more
    local = _hf_local(model)
    if local is not None:
        try:
            return _hf_counter(*local), notes
        except ImportError:
            notes.append(
                f"{model}: transformers is not installed, so its tokenizer cannot "
                "count (pip install transformers)"
            )
        except Exception as exc:  # no tokenizer files in the folder, an unknown format
            notes.append(f"{model}: no tokenizer could be loaded from it ({str(exc)[:120]})")
    sample = cache.prompt_sample(served_by, CALIBRATION_ANSWERS) if served_by else []
    chars = tokens = 0
    for request, n in sample:
        try:
            msgs = json.loads(request).get("messages") or []
        except ValueError:
            continue
        chars += sum(len(str(m.get("content") or "")) for m in msgs)
        tokens += n
    if len(sample) >= MIN_CALIBRATION and tokens > 0:
        cpt = chars / tokens
        return CharCounter(
            cpt,
            f"estimate: {cpt:.2f} characters per token, measured on "
            f"{len(sample)} answers of this backend in the run's cache",
        ), notes
    return CharCounter(
        DEFAULT_CHARS_PER_TOKEN,
        f"estimate: {DEFAULT_CHARS_PER_TOKEN:g} characters per token (typical of English "
        f"text); no tokenizer for '{model}' on this machine",
    ), notes


class NoCache(RequestCache):
    """The cache of a run that has none yet: holds nothing and opens no file (planning must
    not create one). Its look-ups take no keys, so no request is hashed for nothing."""

    def __init__(self) -> None:
        self.path = Path("(no cache.sqlite yet)")
        self.readonly = True

    def get_many(self, keys: Iterable[str]) -> dict[str, Any]:
        return {}

    def present(self, keys: Iterable[str]) -> set[str]:
        return set()

    def get_derived(self, key: str) -> Any:
        return None

    def get_derived_many(self, keys: Iterable[str]) -> dict[str, Any]:
        return {}

    def ledger(self, stage: str | None = None) -> list[dict[str, Any]]:
        return []

    def prompt_sample(self, served_by: str, limit: int = 500) -> list[tuple[str, int]]:
        return []

    def backends(self) -> dict[str, dict[str, Any]]:
        return {}

    def close(self) -> None:
        pass


# ---- placeholders for answers that do not exist yet ----------------------------------------


class Filler:
    """Text of the expected length standing in for answers and rubric aspects, made of the
    input's own words (so a tokenizer counts it like the real thing)."""

    def __init__(self, corpus: list[str], answer_words: int, aspects: int, aspect_words: int):
        self.words = corpus or "the answer explains what to do and why it helps".split()
        self.answer_words, self.n_aspects, self.aspect_words = answer_words, aspects, aspect_words
        self._answer = self._take(0, answer_words)

    def _take(self, start: int, n: int) -> str:
        it = itertools.islice(itertools.cycle(self.words), start, start + max(n, 1))
        return " ".join(it)

    def answer(self) -> str:
        return self._answer

    def aspects(self) -> list[dict[str, str]]:
        # distinct texts: a rubric keeps one of two identical aspects
        return [
            {"aspect": f"{i + 1}: {self._take(7 * i, self.aspect_words)}"}
            for i in range(self.n_aspects)
        ]


def _corpus(rows: Iterable[dict], limit: int = 200) -> list[str]:
    words: list[str] = []
    for row in itertools.islice(rows, limit):
        words.extend(str(row.get("question") or "").split())
        for post in row.get("profile") or []:
            if isinstance(post, dict):
                words.extend(str(post.get("text") or "").split())
    return words


# ---- the estimate --------------------------------------------------------------------------


@dataclass
class Figures:
    requests: int = 0
    prompt_tokens: int = 0
    # the prompts with every placeholder answer in them at its max_tokens
    prompt_bound: int = 0
    output_bound: int = 0
    output_expected: float | None = None
    choices: int = 0
    # the prompts as run.budget bounds them before sending (UTF-8 bytes plus
    # TEMPLATE_TOKENS_PER_MESSAGE a message; pipeline/budget.py), placeholder answers at
    # max_tokens: what a budget must leave room for
    budget_prompt: int = 0


@dataclass
class StageEstimate:
    stage: str
    action: str  # skip | resume | run | redo, as `prb run` would decide
    uses_llm: bool
    examples: int = 0  # examples of the stage's input
    examples_to_do: int = 0
    # every first attempt of the stage over all its examples, and what is still to send
    total: Figures = field(default_factory=Figures)
    to_send: Figures = field(default_factory=Figures)
    cached: int = 0
    estimated: bool = False  # prompts built on placeholder inputs
    placeholders: bool = False  # rows it would write hold placeholder text
    reask_rate: float | None = None  # measured on this backend's answers in the cache
    reasks_expected: float = 0.0
    reask_prompt_tokens: float = 0.0
    reask_output_tokens: float = 0.0
    output_mean: float | None = None  # measured output tokens per choice
    output_basis: str = ""
    tokens: str = ""  # how prompt tokens were counted
    actual: dict[str, Any] | None = None  # the ledger: what the cache holds as received
    notes: list[str] = field(default_factory=list)


@dataclass
class Plan:
    run_dir: str
    backend: str
    stages: list[StageEstimate]
    totals: dict[str, Any]
    time: dict[str, Any]
    cost: dict[str, Any]
    notes: list[str]
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


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


def _count(
    est: StageEstimate,
    planned: Iterable[PlannedExample],
    done: set[str] | None,
    cache: RequestCache,
    counter: TokenCounter,
    mean: float | None,
    keep_rows: list[dict] | None,
    placeholder: tuple[str, int, int] | None = None,
) -> None:
    """Count the planned requests into ``est``; what is done (``done`` None: everything)
    or cached is not to be sent. Rows of examples still to do go to ``keep_rows``.
    ``placeholder``: the placeholder answer's text, and the tokens and the bytes an answer
    may have beyond it (at ``max_tokens``), for the prompt bounds."""
    batch: list[tuple[ChatRequest, bool]] = []

    def flush() -> None:
        present = cache.present(r.key for r, settled in batch if not settled)
        for req, settled in batch:
            # (a key is hashed only when the cache holds something to find)
            cached = settled or (bool(present) and req.key in present)
            tokens = counter.count(req)
            prompt_bound = tokens
            budget_prompt = request_bound(req).prompt_tokens
            if placeholder is not None and placeholder[1] > 0:
                held = sum(c.count(placeholder[0]) for _, c in req.messages)
                prompt_bound += held * placeholder[1]
                budget_prompt += held * placeholder[2]
            bound = req.max_tokens * req.n
            expected = min(mean, req.max_tokens) * req.n if mean is not None else None
            for fig in (est.total,) if cached else (est.total, est.to_send):
                fig.requests += 1
                fig.prompt_tokens += tokens
                fig.prompt_bound += prompt_bound
                fig.budget_prompt += budget_prompt
                fig.output_bound += bound
                fig.choices += req.n
                if expected is not None:
                    fig.output_expected = (fig.output_expected or 0.0) + expected
            est.cached += cached
        batch.clear()

    for pe in planned:
        est.examples += 1
        is_done = done is None or pe.example_id in done
        if not is_done:
            est.examples_to_do += 1
            est.estimated |= pe.estimated
            est.placeholders |= pe.placeholders
            if keep_rows is not None:
                keep_rows.extend(pe.rows)
        for req in pe.requests:
            batch.append((req, is_done or pe.replayed > 0))
        if len(batch) >= LOOKUP_BATCH:
            flush()
    flush()


def _rows_sample(rd: RunDir, stage: str, limit: int = 2000) -> list[dict]:
    try:
        return list(itertools.islice(rd.stage(stage).rows(), limit))
    except PipelineError:
        return []


def make_filler(
    config: Config,
    rd: RunDir,
    ingest_rows: list[dict],
    counter: TokenCounter,
    measured: dict[str, dict[str, Any]],
) -> tuple[Filler, list[str]]:
    """Placeholders sized from what the run has (answers and rubrics on disk, this
    backend's answers in the cache), else from the settings; notes say which."""
    corpus = _corpus(ingest_rows)
    sample = " ".join(corpus[:2000])
    tokens_per_word = counter.text(sample) / max(len(sample.split()), 1) if sample else 1.3
    r = config.responses
    notes = []
    answers = [
        w for c in _rows_sample(rd, "responses") if isinstance(w := c.get("word_count"), int)
    ]
    if answers:
        words = round(sum(answers) / len(answers))
        notes.append(
            f"answers not yet written count {words} words each: the mean of "
            f"{len(answers)} answers on disk"
        )
    elif "responses" in measured:
        per = measured["responses"]["output_per_choice"]
        words = round(per / max(tokens_per_word, 1e-6))
        notes.append(
            f"answers not yet written count {words} words each ({per:.0f} tokens: the "
            "mean of this backend's answers in the cache)"
        )
    else:
        words = min(r.word_cap, int(r.sampling.max_tokens / max(tokens_per_word, 1e-6)))
        notes.append(
            f"answers not yet written count {words} words each: responses.word_cap, "
            "the length the prompts ask for (nothing measured yet)"
        )
    rubrics = [x for x in _rows_sample(rd, "rubrics") if x.get("source") == "generated"]
    if rubrics:
        items = [it.get("aspect", "") for x in rubrics for it in x.get("items", [])]
        n_aspects = round(len(items) / len(rubrics))
        aspect_words = round(sum(len(a.split()) for a in items) / max(len(items), 1))
        basis = f"the mean of {len(rubrics)} generated rubrics on disk"
    else:
        n_aspects = round((config.rubrics.min_items + config.rubrics.max_items) / 2)
        aspect_words = GUESSED_ASPECT_WORDS
        basis = "a guess: between rubrics.min_items and max_items"
    if config.rubrics.source == "generated":
        notes.append(
            f"rubrics not yet generated hold {n_aspects} aspects of {aspect_words} words ({basis})"
        )
    return Filler(corpus, words, n_aspects, aspect_words), notes


def _ingest_rows(ctx: Context, action: str) -> list[dict]:
    """The examples: from the ingest stage when it is done, else read and ranked in memory
    as the ingest stage would (pipeline/stages/ingest.py)."""
    if action == "skip":
        return list(ctx.run_dir.stage("ingest").rows())
    from pipeline.ingest import iter_examples
    from pipeline.stages.ingest import IngestStage

    rows = []
    for r in iter_examples(ctx.config.input, ctx.config.resolve_input):
        r["profile_view"] = IngestStage.profile_view(ctx, r)
        rows.append(r)
    return rows


def _identity(ctx: Context, has_cache: bool) -> tuple[str, list[str]]:
    """What answers this run, as the plan can know it without writing or sending."""
    from pipeline.backends.identity import describe

    try:
        ident = ctx.served_by
    except BackendError as exc:
        note = f"the backend's identity is unknown ({exc})"
        if has_cache:
            note += "; the cache cannot be matched, so every request counts as to be sent"
        ctx._served_by = {"kind": "unknown", "model_output": True, "reason": str(exc)[:200]}
        return "unknown: " + str(exc)[:200], [note]
    return describe(ident), list(dict.fromkeys(ctx.warnings))


def _throughput(
    ctx: Context, given: float | None, measured: dict[str, dict[str, Any]]
) -> tuple[float | None, str]:
    """Output tokens per second, and where the figure comes from."""
    if given is not None:
        return given, "given with --tokens-per-second"
    tokens = seconds = 0.0
    for name in LLM_STAGES:
        try:
            llm = ctx.run_dir.stage(name).stats().get("llm")
        except PipelineError:
            continue
        if isinstance(llm, dict) and llm.get("sent") and name in measured:
            tokens += float(llm.get("completion_tokens") or 0)
            seconds += float(llm.get("seconds") or 0)
    if tokens and seconds:
        return tokens / seconds, "measured on this run (the latest invocation of its LLM stages)"
    benchmark = BACKENDS.get(ctx.config.backend.name).throughput_benchmark
    if benchmark is not None:
        path = BENCHMARK_RESULTS / benchmark
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            figures = [
                v.get("output_tokens_per_s")
                for v in (data.get("variants") or data.get("results") or [])
                if isinstance(v, dict)
            ]
            best = max(f for f in figures if isinstance(f, (int, float)))
            return float(best), f"measured by benchmarks/{path.stem}.py ({path.name})"
        except (OSError, ValueError, AttributeError):
            pass
    return None, "no throughput: give --tokens-per-second (output tokens per second)"


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
    from pipeline.orchestrate import check_contracts, plan_stages
    from pipeline.stages import ORDER, STAGES

    t0 = time.perf_counter()
    names = plan_stages(until, only)
    last = ORDER.index(names[-1])
    stages: dict[str, Stage] = {n: STAGES.get(n)() for n in ORDER[: last + 1]}
    check_contracts(stages)
    # a fresh plan looks at a run directory that is not there (nothing is created)
    rd = RunDir(config.run_dir / ".prb-plan-fresh" if fresh else config.run_dir)
    ctx = Context(config=config, run_dir=rd, progress=False, planned_rows={})
    has_cache = rd.cache_path.is_file()
    ctx._cache = RequestCache(rd.cache_path, readonly=True) if has_cache else NoCache()
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
    from pipeline.orchestrate import make_plan

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

    ingest_plan = plans[0]
    ingest_rows = _ingest_rows(ctx, ingest_plan.action)
    if ingest_plan.action != "skip":
        ctx.planned_rows["ingest"] = ingest_rows
    first_counter = counters[models[llm_stages[0]]] if llm_stages else WordCounter()
    filler, filler_notes = make_filler(config, rd, ingest_rows, first_counter, measured)
    out = [
        StageEstimate(
            "ingest",
            ingest_plan.action,
            False,
            len(ingest_rows),
            0 if ingest_plan.action == "skip" else len(ingest_rows),
        )
    ]
    placeholders_in: set[str] = set()  # stages whose planned rows hold placeholders
    used_filler = False
    for p in plans[1:]:
        name, stage = p.name, p.stage
        uses = stage.uses_llm(ctx)
        est = StageEstimate(name, p.action, uses)
        sd = rd.stage(name)
        if p.action == "skip":
            done: set[str] | None = None
        elif p.action == "resume" and stage.resumable:
            done = sd.done_examples()
        else:
            done = set()
        if not uses and name != "rubrics":
            # the pair stage: no request, and no later LLM stage reads its rows
            est.examples = out[-1].examples
            est.examples_to_do = est.examples if p.action != "skip" else 0
            out.append(est)
            continue
        counter = counters[models[name]].fresh() if uses else WordCounter()
        m = measured.get(name, {})
        mean = m.get("output_per_choice")
        keep: list[dict] | None = None if p.action == "skip" else []
        est.estimated = any(u in placeholders_in for u in stage.reads)
        placeholder = None
        if "responses" in placeholders_in and uses:
            text = filler.answer()
            extra = max(config.responses.sampling.max_tokens - counter.text(text), 0)
            # the budget counts a prompt's bytes: the placeholder's bytes per token
            per_token = len(text.encode("utf-8")) / max(counter.text(text), 1)
            placeholder = (text, extra, math.ceil(extra * per_token))
        planned = stage.plan_examples(ctx, set(), filler)
        _count(est, planned, done, cache, counter, mean, keep, placeholder)
        if keep is not None:
            if done:  # resumed: what is on disk, then what the rest would add
                keep = list(sd.rows()) + keep
            ctx.planned_rows[name] = keep
            if est.placeholders:
                placeholders_in.add(name)
                used_filler = True
        if uses:
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
                est.actual = {
                    k: m[k] for k in ("answers", "reasks", "prompt_tokens", "completion_tokens")
                }
        out.append(est)
    if used_filler:
        notes = filler_notes + notes
    if "rubrics" in placeholders_in:
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
        "reasks_expected": round(reasks, 1),
        "prompt_tokens": round(prompt_all),
        "output_tokens_expected": round(expected_out) if expected_out is not None else None,
        "output_tokens_bound": send.output_bound,
        "prompt_tokens_bound": send.prompt_bound,
    }
    prices = ctx.config.run.prices
    spent = spent or Spend()
    # the run.budget under which the rest finishes: what this backend was paid so far
    # (the budget counts it) and the budget's own bound of every request still to send,
    # so a run given these limits is never refused a request the plan counted
    prompt_total = spent.prompt_tokens + send.budget_prompt + math.ceil(reask_budget_prompt)
    output_total = spent.completion_tokens + send.output_bound + math.ceil(reask_budget_output)
    totals["budget_to_finish"] = {
        "requests": spent.requests + send.requests + math.ceil(round(reasks, 6)),
        "tokens": prompt_total + output_total,
        "usd": cost_usd(prompt_total, output_total, prices),
        "spent_requests": spent.requests,
        "spent_tokens": spent.tokens,
    }
    tps, source = _throughput(ctx, tokens_per_second, measured)
    out_tokens = expected_out if expected_out is not None else float(send.output_bound)
    time_ = {
        "output_tokens_per_second": tps,
        "source": source,
        "seconds": round(out_tokens / tps, 1) if tps else None,
        "basis": "expected output" if expected_out is not None else "output bound",
    }
    cost = {
        "input_usd_per_million": prices.input_usd_per_million,
        "output_usd_per_million": prices.output_usd_per_million,
        "usd_expected": cost_usd(prompt_all, expected_out, prices)
        if expected_out is not None
        else None,
        "usd_bound": cost_usd(send.prompt_bound, send.output_bound, prices),
    }
    return totals, time_, cost


# ---- the table -----------------------------------------------------------------------------


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
    if c["usd_bound"] is not None:
        exp = f"${c['usd_expected']:,.2f} expected, " if c["usd_expected"] is not None else ""
        lines.append(
            f"cost: {exp}${c['usd_bound']:,.2f} at most for first attempts (every answer "
            "at max_tokens, also where later prompts quote it), at "
            f"${c['input_usd_per_million']:g} / ${c['output_usd_per_million']:g} per "
            "million prompt / output tokens (run.prices)"
        )
    else:
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
            lines.append(
                f"{e.stage:11s}{b.total.requests:>10,}{a['answers']:>10,}"
                f"{b.total.prompt_tokens:>12,}{a['prompt_tokens']:>10,}"
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
