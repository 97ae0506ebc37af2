"""``prb eval bon SPLIT``: Best-of-N downstream evaluation of reward models on a split.

For every question of the split (a release, a run's kept pairs, any file in the reference
schema: whatever ``prb eval`` reads) a policy model draws N answers; every scorer given
scores every answer; for each k the highest-scored of the first k answers is picked
(``pipeline.eval.bonfigures``: ties to the lowest sample index); a rubric-aware judge
scores each distinct picked answer once on the reference's scale (0, 1 or 2 per rubric
aspect); the figures are the mean judge score per scorer, setting, subset and k with
bootstrap intervals, the scaling curves, and the table ``prb eval correlate`` reads, each
scorer joined with its benchmark accuracy from a ``prb eval`` results folder of the same
split. It follows the reference's ``BoN/sample.py``, ``score.py`` and ``evaluate.py``;
docs/eval.md lists where it differs.

Every request (samples, generative scores, verdicts) goes through one request cache in the
output folder, committed as answers arrive, and every reward-model score is kept there too
(``pipeline.eval.bonscore``): a run killed at any point resumes without asking anything
twice, and a run with another scorer draws no sample again. The output files are written
together, at the end, each replaced whole.

Output folder (``--out``, default ``<eval root>/bon``)::

    .prb-bon             the marker: a folder prb eval bon wrote (only such a folder is reused)
    cache.sqlite         every request and answer, and every reward-model score
    bon.json             every figure, the settings and what answered
    samples.jsonl        per question and sample index: the answer and its finish reason
    scores.jsonl         per scorer, setting, question and sample: the score
    picks.jsonl          per scorer, setting, k and question: the sample picked
    verdicts.jsonl       per judged answer: the judge's per-aspect scores and their mean
    correlate-<setting>.csv / .json   the table prb eval correlate reads, and its figures
    report.html          the scaling curves and the tables
"""

from __future__ import annotations

import datetime as dt
import difflib
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.core.errors import InputError, PipelineError
from pipeline.core.io import (
    file_digest,
    path_kind,
    write_json_atomic,
    write_jsonl_atomic,
    write_text_atomic,
)
from pipeline.core.registry import load_target
from pipeline.core.resources import data_dir
from pipeline.eval import bonfigures
from pipeline.eval.bonreport import render_report
from pipeline.eval.bonscore import ScoreContext
from pipeline.eval.correlate import correlate
from pipeline.eval.generative import JUDGE_SYSTEM, Answered, build_requests
from pipeline.run import RunDir, run_of
from pipeline.run.cache import RequestCache
from pipeline.run.outputs import check_output
from pipeline.types import schemas
from pipeline.types.chat import ChatRequest
from pipeline.types.promptfiles import read_prompt_file

# The system turn the reference's BoN/sample.py sends with its sample prompt, quoted so
# that a sample request is the reference's request.
SAMPLE_SYSTEM = (
    "You are a helpful assistant designed to generate personalized responses to user questions."
)
SAMPLE_PROMPT = "bon_sample.txt"  # the project's sample prompt (prompts/)
JUDGE_PROMPT = "bon_judge.txt"  # the project's judge prompt (prompts/)
COVERAGE_TEMPLATE = "judge_coverage"  # the project's JSON coverage verdict (--judge-format json)
SAMPLE_NEEDS, SAMPLE_FILLS = ("question",), ("profile",)
JUDGE_NEEDS, JUDGE_FILLS = ("question", "answer"), ("aspects", "aspect_list")
# the reference's defaults (BoN/sample.py, BoN/evaluate.py)
DEFAULT_N = 16
DEFAULT_POSTS = 10
DEFAULT_TEMPERATURE = 1.0
DEFAULT_TOP_P = 0.9
DEFAULT_MAX_TOKENS = 512
JUDGE_MAX_TOKENS = 32
MAX_N = 1024
# the reference release's size, for the cost statement (arXiv 2604.07343: 2,830 questions)
REFERENCE_QUESTIONS = 2830
REFERENCE_N = 16

SETTINGS = {
    "question": "the question only",
    "profile": "the question with the user's top-k profile posts (prb eval's profile setting)",
    "profile-reference": "the question with the reference's profile text appended directly "
    "(its 'Post i (Category: c):' lines, no separator), as the reference's BoN/score.py "
    "builds a reward model's user turn",
}
DEFAULT_SETTINGS = ("profile",)
JUDGE_FORMATS = ("list", "json")

MARKER = ".prb-bon"
CACHE = "cache.sqlite"
BON_JSON = "bon.json"
SAMPLES = "samples.jsonl"
SCORES = "scores.jsonl"
PICKS = "picks.jsonl"
VERDICTS = "verdicts.jsonl"
REPORT = "report.html"
LOCK = ".lock"
OWN_FILES = (MARKER, LOCK, CACHE, BON_JSON, SAMPLES, SCORES, PICKS, VERDICTS, REPORT)
STAGE_SAMPLE, STAGE_SCORE, STAGE_JUDGE = "bon-sample", "bon-score", "bon-judge"


def table_name(setting: str) -> str:
    return f"correlate-{setting}.csv"


def table_json(setting: str) -> str:
    return f"correlate-{setting}.json"


@dataclass
class BonOptions:
    """Everything ``prb eval bon`` was asked, checked by ``check_options``."""

    split: Path
    scorers: list[str]
    settings: list[str] = field(default_factory=lambda: list(DEFAULT_SETTINGS))
    cfg: Any = None  # the base config (generative scorers' backend)
    policy_cfg: Any = None
    judge_cfg: Any = None
    policy: str = ""
    judge: str = ""
    n: int = DEFAULT_N
    ks: list[int] | None = None
    judge_format: str = "list"
    sample_prompt: str = ""
    judge_prompt: str = ""
    posts: int = DEFAULT_POSTS
    temperature: float = DEFAULT_TEMPERATURE
    top_p: float = DEFAULT_TOP_P
    max_tokens: int = DEFAULT_MAX_TOKENS
    # 0: the reference's 32 (list), the config's judge tokens (json; None: each coverage
    # schema's own bound, as the judge stage asks)
    judge_max_tokens: int | None = 0
    accuracy_from: Path | None = None
    accuracy_setting: str = "question"
    out: Path | None = None
    limit: int | None = None
    n_boot: int = 1000
    seed: int = 0
    plan_only: bool = False
    progress: bool = True
    stale_ok: bool = False


# ---- the user-named output path: every check of --out is here --------------------------


def output_folder(opts: BonOptions) -> Path:
    """The folder ``prb eval bon`` writes (``--out``, or ``<eval root>/bon``), checked:
    a new folder, an empty one, or one this command wrote (its marker); never a run, a
    stage folder, a release, a file, or a folder of the user's. This is the one place the
    command's user-named output path is decided and checked."""
    from pipeline.eval.results import default_root

    out = Path(opts.out) if opts.out is not None else default_root(opts.split) / "bon"
    if (out / MARKER).is_file():  # written by this command before (it holds its cache)
        return out
    # the one check of every output a user names (pipeline/run/outputs.py), then this
    # command's own: a folder of its own
    check_output(
        out,
        flag="--out",
        command="prb eval bon",
        folder=True,
        reads=[("the split being evaluated", Path(opts.split))],
    )
    kind = path_kind(out)
    if kind is None:
        return out
    if kind != "a folder":
        raise InputError(f"is {kind}; --out takes a folder for prb eval bon", path=out)
    if RunDir(out).is_run() or (run_of(out) is not None and _inside_run_files(out)):
        raise InputError(
            "is a run directory or one of its folders; give --out a folder of its own",
            path=out,
        )
    if any(out.iterdir()):
        raise InputError(
            f"is a folder prb eval bon did not write (no {MARKER}); give --out a new or "
            "empty folder, so nothing of yours is overwritten",
            path=out,
        )
    return out


def _inside_run_files(out: Path) -> bool:
    """Whether ``out`` is a run's own folder (a stage, its release, its report...), as
    opposed to a folder of the eval root a run holds (``<run>/eval/bon``)."""
    rd = run_of(out)
    if rd is None:
        return False
    try:
        inside_eval = out.resolve().is_relative_to(rd.eval_dir.resolve())
    except OSError:
        inside_eval = False
    return not inside_eval


# ---- checks before anything loads or is sent --------------------------------------------


def parse_scorers(texts: Sequence[str], default_model: str = "") -> list[Any]:
    """Each ``--scorer`` parsed (``pipeline.eval.spec.parse_spec``), of a kind that scores
    one answer at a time, and no two with one name (the name their rows and the correlate
    table carry)."""
    from pipeline.eval.spec import SCORERS, check_unique_names, parse_spec

    if not texts:
        raise InputError(
            "give at least one --scorer rm:MODEL_FOLDER or --scorer gen:MODEL", path="--scorer"
        )
    specs = []
    for text in texts:
        spec = parse_spec(text)
        if not spec.scorer.answer_scorer:
            kinds = ", ".join(f"{k.name}:" for k in SCORERS.values() if k.answer_scorer)
            raise InputError(
                f"{spec.prefix}: compares two answers; best-of-N scores each answer alone: "
                f"use {kinds} (got {text!r})",
                path="--scorer",
            )
        specs.append(spec)
    check_unique_names(specs, default_model)
    return specs


def check_ks(n: int, ks: Sequence[int] | None) -> list[int]:
    if n < 1:
        raise InputError(f"must be at least 1 (samples per question), got {n}", path="--n")
    if n > MAX_N:
        raise InputError(f"must be at most {MAX_N:,}, got {n:,}", path="--n")
    if ks is None:
        return bonfigures.default_ks(n)
    out = sorted(set(ks))
    if not out:
        raise InputError("give at least one k, e.g. --k 1,2,4", path="--k")
    for k in out:
        if k < 1:
            raise InputError(f"every k must be at least 1, got {k}", path="--k")
        if k > n:
            raise InputError(
                f"k={k} is more than the {n} samples drawn per question (--n {n}); give k "
                f"up to {n}, or draw more with --n {k}",
                path="--k",
            )
    return out


def _prompt_file(option: str, default: str, needs: tuple, fills: tuple, what: str) -> Any:
    path = Path(option).expanduser() if option else data_dir("prompts") / default
    return read_prompt_file(path, needs=needs, fills=fills, what=what)


@dataclass
class Question:
    key: str  # the pair's key (prb eval's: pair_id, else id)
    row_id: str  # the row's own id (the reference's: the source question's)
    subset: str | None
    question: str
    posts: tuple[str, ...]  # the profile setting's posts (prb eval's)
    profile_text: str  # the reference's profile text: its first `posts` posts, "Post i ..."
    aspects: tuple[str, ...]


def questions_of(pairs: Sequence[Any], rows: Sequence[dict[str, Any]], posts: int,
                 source: str) -> list[Question]:  # fmt: skip
    """One question per row of the split, with what its prompts show; a row without rubric
    aspects is refused (the judge scores every picked answer against them)."""
    from pipeline.stages.responses import profile_text

    out = []
    missing = []
    for p, r in zip(pairs, rows, strict=True):
        profile = [x for x in (r.get("profile") or []) if isinstance(x, dict)]
        if not p.aspects:
            missing.append(p.key)
        out.append(
            Question(
                key=p.key,
                row_id=str(r.get("id") or p.key),
                subset=p.groups.get("category"),
                question=p.question,
                posts=p.posts,
                profile_text=profile_text(profile[:posts]),
                aspects=p.aspects,
            )
        )
    if missing:
        raise InputError(
            f"{len(missing)} of {len(out)} rows have no rubric_aspects (first: {missing[0]}); "
            "the judge scores each picked answer against the question's rubric aspects, so "
            "every question needs them",
            path=source,
            field="rubric_aspects",
        )
    return out


# ---- the benchmark accuracy of each scorer, from prb eval's results ---------------------


def accuracy_of(
    specs: Sequence[Any],
    root: Path | None,
    setting: str,
    split: dict[str, Any],
    default_model: str,
) -> dict[str, dict[str, Any]]:
    """Per scorer (its spec text): its accuracy on the split from ``prb eval``'s results in
    ``root`` (``<slug>/<setting>/results.json``, found by the scorer's result-folder name,
    else by its display name), pooled and per category; a results file made on another
    split (its fingerprint) is refused. A scorer without results gets a note instead."""
    from pipeline.eval.results import RESULTS_FILE

    out: dict[str, dict[str, Any]] = {}
    if root is None:
        for spec in specs:
            out[spec.text] = {"note": "no prb eval results folder (--accuracy-from)"}
        return out
    if not root.is_dir():
        raise InputError("no such folder (prb eval's results)", path=root, field="--accuracy-from")
    found: dict[str, Path] = {}
    for f in sorted(root.glob(f"*/{setting}/{RESULTS_FILE}")):
        found[f.parent.parent.name] = f
    by_name: dict[str, Path] = {}
    for f in found.values():
        try:
            doc = json.loads(f.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        name = (doc.get("scorer") or {}).get("name") if isinstance(doc, dict) else None
        if isinstance(name, str):
            by_name.setdefault(name, f)
    for spec in specs:
        slug = spec.slug(default_model)
        name = spec.display_name(default_model)
        path = found.get(slug) or by_name.get(name)
        if path is None:
            out[spec.text] = {
                "note": f"no {setting} results for {slug} in {root} (run: prb eval "
                f"{split['path']} --scorer {spec.text} --setting {setting})"
            }
            continue
        out[spec.text] = _read_accuracy(path, setting, split)
    return out


def _read_accuracy(path: Path, setting: str, split: dict[str, Any]) -> dict[str, Any]:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        block = doc["settings"][setting]["metrics"]
        theirs = doc["split"]["fingerprint"]
    except (OSError, ValueError, KeyError, TypeError):
        raise InputError(
            "is not a prb eval results file; move it aside or evaluate again",
            path=path,
            field="--accuracy-from",
        ) from None
    if theirs != split["fingerprint"]:
        where = (doc.get("split") or {}).get("path")
        raise InputError(
            f"was made on another split ({where}, {doc['split'].get('rows')} pairs, "
            f"fingerprint {theirs}) than the one evaluated here ({split['path']}, "
            f"{split['rows']} pairs, fingerprint {split['fingerprint']}); give the results "
            "folder of this split's prb eval",
            path=path,
            field="--accuracy-from",
        )
    cats = (block.get("by") or {}).get("category") or {}
    return {
        "accuracy": block.get("accuracy"),
        "by_subset": {c: b.get("accuracy") for c, b in cats.items()},
        "file": str(path),
        "sha256": file_digest(path)[0],
        "setting": setting,
    }


# ---- requests -------------------------------------------------------------------------


def sample_seed(base: int, question: str, index: int) -> int:
    """The seed of one sample: from the run seed, the question's key and the sample index,
    so each sample is its own request (and cache entry), reproducible where the server
    honours seeds."""
    from pipeline.stages.responses import derive_seed

    return derive_seed("bon-sample", base, question, index)


def sample_requests(
    questions: Sequence[Question], prompt: Any, role: Any, opts: BonOptions
) -> list[Any]:
    """N requests per question, question by question, sample 0 to N-1."""
    out = []
    for q in questions:
        user = prompt.fill({"question": q.question, "profile": q.profile_text})
        messages = (("system", SAMPLE_SYSTEM), ("user", user))
        for i in range(opts.n):
            out.append(
                ChatRequest(
                    messages=messages,
                    model=role.model,
                    temperature=opts.temperature,
                    top_p=opts.top_p,
                    max_tokens=opts.max_tokens,
                    n=1,
                    seed=sample_seed(role.cfg.run.seed, q.key, i),
                    served_by=role.served_id,
                )
            )
    return out


def _aspect_list(aspects: Sequence[str]) -> str:
    return "\n".join(f"- {a}" for a in aspects)


def judge_request(q: Question, answer: str, prompt: Any, role: Any, opts: BonOptions) -> Any:
    """The judge's request for one answer: the reference's (its system turn, the prompt with
    {question}, {answer} and {aspects}: the aspects joined by ", "), or with
    ``--judge-format json`` the project's coverage verdict under its JSON schema."""
    if opts.judge_format == "json":
        from pipeline.types.prompts import load_template

        cfg = role.cfg
        schema, tokens = schemas.coverage_schema(
            len(q.aspects), opts.judge_max_tokens, cfg.judge.rationale_max_chars
        )
        items = [
            {"key": k, "aspect": a}
            for k, a in zip(schemas.coverage_keys(len(q.aspects)), q.aspects, strict=True)
        ]
        messages = load_template(COVERAGE_TEMPLATE).render(
            question=q.question, answer=answer, items=items
        )
        return ChatRequest(
            messages=messages,
            model=role.model,
            temperature=0.0,
            top_p=1.0,
            max_tokens=tokens,
            n=1,
            seed=role.cfg.run.seed,
            json_schema=schemas.for_engine(schema, role.identity),
            schema_name="CoverageVerdict",
            served_by=role.served_id,
        )
    values = {
        "question": q.question,
        "answer": answer,
        "aspects": ", ".join(q.aspects),
        "aspect_list": _aspect_list(q.aspects),
    }
    return ChatRequest(
        messages=(("system", JUDGE_SYSTEM), ("user", prompt.fill(values))),
        model=role.model,
        temperature=0.0,
        top_p=1.0,
        max_tokens=opts.judge_max_tokens or JUDGE_MAX_TOKENS,  # (a list verdict's: never None)
        n=1,
        seed=role.cfg.run.seed,
        served_by=role.served_id,
    )


def read_verdict_list(text: str) -> tuple[list[float], float, bool]:
    """The reference's reading of a judge's answer (BoN/evaluate.py): the numbers inside
    its first ``[...]`` (or, without one, in the whole answer), their mean, 0.0 when there
    are none. Returns (scores, mean, whether any number was found)."""
    import re

    stripped = text.strip()
    bracket = re.search(r"\[([^\]]+)\]", stripped)
    numbers = re.findall(r"-?\d+\.?\d*", bracket.group(1) if bracket else stripped)
    scores = [float(x) for x in numbers]
    if not scores:
        return [], 0.0, False
    return scores, sum(scores) / len(scores), True


# ---- the run --------------------------------------------------------------------------


@dataclass
class Prepared:
    """What ``prepare`` checked and built, before anything is sent."""

    opts: BonOptions
    specs: list[Any]
    ks: list[int]
    questions: list[Question]
    split: dict[str, Any]
    out: Path
    sample_prompt: Any
    judge_prompt: Any
    policy: Any
    judge: Any
    roles: dict[str, Any]
    accuracy: dict[str, dict[str, Any]]
    sample_reqs: list[Any]
    notes: list[str]


def prepare(opts: BonOptions) -> Prepared:
    """Every check that can be made before anything is sent or written: the scorers (specs,
    model folders, tokenizers), k and N, the prompt files, the split and its rubric aspects,
    the accuracy results, the output folder, and every backend (a server that is down is
    one line here)."""
    if opts.judge_format not in JUDGE_FORMATS:
        raise InputError(f"must be one of {', '.join(JUDGE_FORMATS)}", path="--judge-format")
    if opts.judge_format == "json" and opts.judge_prompt:
        raise InputError(
            "--judge-prompt is a free-text prompt read as a list of scores; the json format "
            "asks the project's coverage verdict (prompts/judge_coverage.j2): leave one out",
            path="--judge-prompt",
        )
    for s in opts.settings:
        if s not in SETTINGS:
            close = difflib.get_close_matches(s, list(SETTINGS), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise InputError(f"unknown setting {s!r} for prb eval bon{hint}", path="--setting")
    if opts.posts < 0:
        raise InputError(f"must be 0 or more, got {opts.posts}", path="--posts")
    _check_sampling(opts)
    base = opts.cfg
    ks = check_ks(opts.n, opts.ks)
    specs = parse_scorers(opts.scorers, base.backend.model)
    for spec in specs:
        spec.scorer.preflight(spec)
        spec.scorer.load_check(spec)
        from pipeline.eval.spec import check_prompt_settings

        check_prompt_settings(spec, [s for s in opts.settings if s != "profile-reference"])
    sample_prompt = _prompt_file(
        opts.sample_prompt, SAMPLE_PROMPT, SAMPLE_NEEDS, SAMPLE_FILLS, "the policy's sample prompt"
    )
    judge_prompt = (
        None
        if opts.judge_format == "json"
        else _prompt_file(
            opts.judge_prompt, JUDGE_PROMPT, JUDGE_NEEDS, JUDGE_FILLS, "the judge's prompt"
        )
    )
    if not opts.judge_max_tokens:
        opts.judge_max_tokens = (
            JUDGE_MAX_TOKENS
            if opts.judge_format == "list"
            else opts.judge_cfg.judge.sampling.max_tokens
        )
    from pipeline.eval.data import load_split_rows

    pairs, split, rows = load_split_rows(opts.split, base, opts.limit, stale_ok=opts.stale_ok)
    questions = questions_of(pairs, rows, opts.posts, split.get("path", str(opts.split)))
    from pipeline.eval.results import default_root

    root = opts.accuracy_from
    notes: list[str] = []
    if root is None and default_root(opts.split).is_dir():
        root = default_root(opts.split)
    accuracy = accuracy_of(specs, root, opts.accuracy_setting, split, base.backend.model)
    out = output_folder(opts)
    cache_path = out / CACHE
    cached = cache_path.is_file()
    from pipeline.eval.llmcalls import identify_role

    policy_model = opts.policy or opts.policy_cfg.backend.model
    judge_model = opts.judge or opts.judge_cfg.judge.model or opts.judge_cfg.backend.model
    policy = identify_role("policy", opts.policy_cfg, policy_model, cache_path, cached=cached)
    judge = identify_role("judge", opts.judge_cfg, judge_model, cache_path, cached=cached)
    roles = {}
    for spec in specs:
        if spec.scorer.asks_backend:
            model = spec.target or base.backend.model
            roles[spec.text] = identify_role(spec.display_name(model), base, model, cache_path,
                                             cached=cached)  # fmt: skip
    for role in (policy, judge, *roles.values()):
        if role.warning:
            notes.append(f"{role.name}: {role.warning}")
    reqs = sample_requests(questions, sample_prompt, policy, opts)
    return Prepared(opts, specs, ks, questions, split, out, sample_prompt, judge_prompt, policy,
                    judge, roles, accuracy, reqs, notes)  # fmt: skip


def _check_sampling(opts: BonOptions) -> None:
    """The policy's sampling within the bounds of the config's own sampling fields."""
    from pydantic import ValidationError

    from pipeline.config import SamplingSection

    for flag, key, value in (
        ("--temperature", "temperature", opts.temperature),
        ("--top-p", "top_p", opts.top_p),
        ("--max-tokens", "max_tokens", opts.max_tokens),
    ):
        try:
            SamplingSection.model_validate({key: value})
        except ValidationError as exc:
            why = exc.errors()[0]["msg"].replace("Input should be", "must be")
            raise InputError(f"{why}, got {value!r}", path=flag) from None
    if opts.judge_max_tokens is not None and opts.judge_max_tokens < 0:
        raise InputError("must be at least 1", path="--judge-max-tokens")


# ---- what it will send: counted before anything is -------------------------------------


def _counter(role: Any, cache: Any) -> Any:
    from pipeline.plan.counters import choose_counter

    counter, _ = choose_counter(role.cfg, role.identity, role.model, cache, role.served_id)
    return counter


def _distinct_picks(n_specs: int, n_settings: int, ks: Sequence[int], n: int) -> int:
    """The most distinct answers one question's picks can be: k = 1 is sample 0 for every
    scorer; each other k may pick another sample per scorer and setting; at most N."""
    return min(n, 1 + n_specs * n_settings * sum(1 for k in ks if k > 1))


def plan_of(prep: Prepared) -> dict[str, Any]:
    """Requests, cached answers and tokens of each step (``prb plan``'s figures): exact for
    the samples (their prompts are built here and looked up in the cache); bounds for the
    scores and verdicts, whose prompts hold answers not drawn yet (each counted at the
    policy's max_tokens), and whose number depends on which answers are picked."""
    from pipeline.plan.placeholders import NoCache

    opts, q = prep.opts, len(prep.questions)
    cache_path = prep.out / CACHE
    cache: Any = RequestCache(cache_path, readonly=True) if cache_path.is_file() else NoCache()
    try:
        counter = _counter(prep.policy, cache)
        reqs = prep.sample_reqs
        present = cache.present(r.key for r in reqs)
        todo = [r for r in reqs if r.key not in present]
        prompt_all = sum(counter.count(r) for r in reqs)
        steps: dict[str, Any] = {
            "sample": {
                "requests": len(reqs),
                "cached": len(reqs) - len(todo),
                "to_send": len(todo),
                "prompt_tokens": sum(counter.count(r) for r in todo),
                "output_bound": len(todo) * opts.max_tokens,
                "prompt_tokens_per_request": prompt_all / max(len(reqs), 1),
                "tokens": counter.method,
            }
        }
        answer_bound = opts.max_tokens  # an answer in a later prompt, at the policy's limit
        for spec in prep.specs:
            if spec.text not in prep.roles:
                continue
            role = prep.roles[spec.text]
            gc = _counter(role, cache)
            items = [Answered(x.question, "", profile=x.profile_text) for x in prep.questions]
            one = build_requests(items, spec.prompts["template"], role.model, spec, 0, "")
            per = sum(gc.count(r) for r in one) / max(q, 1) + answer_bound
            n_req = q * opts.n * len(opts.settings)
            steps[f"score {spec.display_name(role.model)}"] = {
                "requests_at_most": n_req,
                "prompt_tokens_bound": round(per * n_req),
                "output_bound": n_req * spec.opt("max_tokens"),
                "prompt_tokens_per_request_bound": per,
                "tokens": gc.method,
            }
        jc = _counter(prep.judge, cache)
        per_q = _distinct_picks(len(prep.specs), len(opts.settings), prep.ks, opts.n)
        jreqs = [judge_request(x, "", prep.judge_prompt, prep.judge, opts) for x in prep.questions]
        jper = sum(jc.count(r) for r in jreqs) / max(q, 1) + answer_bound
        steps["judge"] = {
            "requests_at_most": q * per_q,
            "prompt_tokens_bound": round(jper * q * per_q),
            "output_bound": q * per_q * judge_tokens(prep),
            "prompt_tokens_per_request_bound": jper,
            "tokens": jc.method,
        }
        rms = [s for s in prep.specs if s.text not in prep.roles]
        steps["reward models"] = {
            "forward_passes": q * opts.n * len(opts.settings) * len(rms),
            "models": len(rms),
        }
    finally:
        cache.close()
    return {"questions": q, "n": opts.n, "ks": prep.ks, "steps": steps,
            "reference_size": reference_size(prep, steps)}  # fmt: skip


def judge_tokens(prep: Prepared) -> int:
    """The most output tokens one judge request may take: its max_tokens, or the largest
    coverage schema's own bound over the split's rubric sizes (json, max_tokens None)."""
    opts = prep.opts
    if opts.judge_max_tokens is not None:
        return opts.judge_max_tokens
    cap = prep.judge.cfg.judge.rationale_max_chars
    sizes = {len(q.aspects) for q in prep.questions} or {1}
    return max(schemas.coverage_schema(n, None, cap)[1] for n in sizes)


def reference_size(prep: Prepared, steps: dict[str, Any]) -> dict[str, Any]:
    """The same command at the reference release's size (2,830 questions, N = 16, its k
    values 1 to 16): requests and tokens from this split's per-request figures, and the
    cost at ``run.prices`` where the config gives them."""
    from pipeline.engine.budget import cost_usd, run_prices

    opts = prep.opts
    q, n = REFERENCE_QUESTIONS, REFERENCE_N
    ks = bonfigures.default_ks(n)
    s = steps["sample"]
    out: dict[str, Any] = {"questions": q, "n": n, "ks": ks}
    sample = {
        "requests": q * n,
        "prompt_tokens": round(s["prompt_tokens_per_request"] * q * n),
        "output_bound": q * n * opts.max_tokens,
    }
    out["sample"] = {**sample, "cost_usd": _cost(sample, run_prices(prep.policy.cfg), cost_usd)}
    per_q = _distinct_picks(len(prep.specs), len(opts.settings), ks, n)
    j = steps["judge"]
    judge = {
        "requests_at_most": q * per_q,
        "prompt_tokens_bound": round(j["prompt_tokens_per_request_bound"] * q * per_q),
        "output_bound": q * per_q * judge_tokens(prep),
    }
    out["judge"] = {**judge, "cost_usd": _cost(judge, run_prices(prep.judge.cfg), cost_usd)}
    for name, st in steps.items():
        if name.startswith("score "):
            n_req = q * n * len(opts.settings)
            one = {
                "requests_at_most": n_req,
                "prompt_tokens_bound": round(st["prompt_tokens_per_request_bound"] * n_req),
                "output_bound": n_req * round(st["output_bound"] / max(st["requests_at_most"], 1)),
            }
            out[name] = {**one, "cost_usd": _cost(one, run_prices(prep.opts.cfg), cost_usd)}
    rms = steps["reward models"]["models"]
    out["reward models"] = {"forward_passes": q * n * len(opts.settings) * rms}
    return out


def _cost(step: dict[str, Any], prices: Any, cost_usd: Callable[..., Any]) -> float | None:
    prompt = step.get("prompt_tokens", step.get("prompt_tokens_bound", 0))
    value = cost_usd(prompt, step.get("output_bound", 0), prices)
    return None if value is None else round(value, 2)


def render_plan(plan: dict[str, Any]) -> str:
    """The plan as printed before anything is sent."""
    st = plan["steps"]
    s = st["sample"]
    lines = [
        f"prb eval bon: {plan['questions']} questions x N={plan['n']} samples, k = "
        f"{', '.join(map(str, plan['ks']))}",
        f"  {'step':28s} {'requests':>10s} {'cached':>8s} {'to send':>8s} "
        f"{'prompt tokens':>14s} {'output (bound)':>15s}",
        f"  {'sample (policy)':28s} {s['requests']:>10,} {s['cached']:>8,} {s['to_send']:>8,} "
        f"{s['prompt_tokens']:>14,} {s['output_bound']:>15,}",
    ]
    for name, f in st.items():
        if "requests_at_most" in f:
            lines.append(
                f"  {name[:28]:28s} {'<=' + format(f['requests_at_most'], ','):>10s} "
                f"{'':>8s} {'':>8s} {'<=' + format(f['prompt_tokens_bound'], ','):>14s} "
                f"{f['output_bound']:>15,}"
            )
    rm = st["reward models"]
    if rm["models"]:
        lines.append(f"  reward models: {rm['forward_passes']:,} answers scored on this machine "
                     f"({rm['models']} models; no requests)")  # fmt: skip
    lines.append(f"  tokens: {s['tokens']}")
    ref = plan["reference_size"]
    parts = [
        f"sample {ref['sample']['requests']:,} requests, {ref['sample']['prompt_tokens']:,} "
        f"prompt and <= {ref['sample']['output_bound']:,} output tokens",
        f"judge <= {ref['judge']['requests_at_most']:,} requests, <= "
        f"{ref['judge']['prompt_tokens_bound']:,} prompt and <= "
        f"{ref['judge']['output_bound']:,} output tokens",
    ]
    parts += [
        f"{k} <= {v['requests_at_most']:,} requests"
        for k, v in ref.items()
        if k.startswith("score ")
    ]
    costs = [v["cost_usd"] for v in ref.values() if isinstance(v, dict) and "cost_usd" in v]
    cost = (
        f"; cost at run.prices: ${sum(c for c in costs if c is not None):,.2f}"
        if costs and all(c is not None for c in costs)
        else "; no cost without run.prices (input/output USD per million tokens)"
    )
    lines.append(
        f"at the reference's size ({ref['questions']:,} questions, N={ref['n']}): "
        + "; ".join(parts)
        + cost
    )
    return "\n".join(lines)


# ---- the run ---------------------------------------------------------------------------


@dataclass
class Sample:
    text: str
    finish_reason: str
    key: str  # its request's key in the cache


def _unanswered(what: str, asked: Any, total: int) -> PipelineError:
    reasons: dict[str, int] = {}
    for o in asked.outcomes:
        if not hasattr(o, "result"):
            code = str(getattr(o, "reason", "")).split(":", 1)[0][:60]
            reasons[code] = reasons.get(code, 0) + 1
    why = ", ".join(f"{k} {v}" for k, v in sorted(reasons.items()))
    return PipelineError(
        f"{asked.failed} of {total} {what} requests got no answer ({why}); nothing was "
        "written but the request cache: run the same command again to send only those"
    )


def draw_samples(prep: Prepared) -> tuple[dict[str, list[Sample]], dict[str, Any]]:
    """N answers per question, from the cache or the policy."""
    from pipeline.eval.llmcalls import ask

    reqs = prep.sample_reqs
    asked = ask(prep.policy, prep.out / CACHE, STAGE_SAMPLE, reqs, progress=prep.opts.progress)
    if asked.failed:
        raise _unanswered("sample", asked, len(reqs))
    out: dict[str, list[Sample]] = {}
    n = prep.opts.n
    for i, (req, o) in enumerate(zip(reqs, asked.outcomes, strict=True)):
        q = prep.questions[i // n]
        choice = o.result.choices[0]  # type: ignore[union-attr]
        out.setdefault(q.key, []).append(Sample(choice.text, choice.finish_reason, req.key))
    return out, asked.stats


def _answered(q: Question, setting: str, answer: str) -> Answered:
    """One answer as a scorer sees it in a setting (``SETTINGS``)."""
    from pipeline.eval.data import listed, user_turn

    if setting == "profile-reference":
        return Answered(q.question, answer, profile=q.profile_text,
                        user_turn=q.question + q.profile_text)  # fmt: skip
    pair = _as_pair(q)
    profile = listed(q.posts) if setting == "profile" else ""
    return Answered(q.question, answer, profile=profile, user_turn=user_turn(pair, setting))


def _as_pair(q: Question) -> Any:
    from pipeline.eval.data import EvalPair

    return EvalPair(q.key, q.question, "", "", q.posts, q.aspects, {}, bool(q.posts), True)


def score_samples(
    prep: Prepared, samples: dict[str, list[Sample]]
) -> tuple[dict[tuple[str, str], dict[str, list[float]]], dict[str, Any]]:
    """Every sample scored by every scorer in every setting: (scorer text, setting) ->
    question -> N scores; and each scorer's details."""
    ctx = ScoreContext(prep.out / CACHE, prep.opts.cfg.run.seed, prep.roles, prep.opts.progress,
                       STAGE_SCORE)  # fmt: skip
    scores: dict[tuple[str, str], dict[str, list[float]]] = {}
    info: dict[str, Any] = {}
    n = prep.opts.n
    for spec in prep.specs:
        items = [
            _answered(q, s, smp.text)
            for s in prep.opts.settings
            for q in prep.questions
            for smp in samples[q.key]
        ]
        got = load_target(spec.scorer.answer_scorer)(spec, items, ctx)
        if got.failed:
            raise PipelineError(
                f"{got.failed} of {len(items)} score requests of {spec.text} got no answer; "
                "nothing was written but the request cache: run the same command again to "
                "send only those"
            )
        info[spec.text] = {**got.info, "scored_now": got.computed, "unparsed": got.unparsed}
        flat = got.scores
        per = len(prep.questions) * n
        for si, s in enumerate(prep.opts.settings):
            block = scores.setdefault((spec.text, s), {})
            for qi, q in enumerate(prep.questions):
                start = si * per + qi * n
                row = flat[start : start + n]
                block[q.key] = [float("nan") if x is None else float(x) for x in row]
    return scores, info


@dataclass
class Verdict:
    scores: list[float]
    mean: float | None  # None: no verdict (a JSON verdict that stayed invalid)
    found: bool  # a number (a list) or a valid verdict was read
    key: str


def judge_picks(
    prep: Prepared, samples: dict[str, list[Sample]], wanted: set[tuple[str, int]]
) -> tuple[dict[tuple[str, int], Verdict], dict[str, Any]]:
    """Each distinct picked answer judged once; identical answers to one question share
    one request, so one verdict."""
    from pipeline.engine.llm import Answer
    from pipeline.eval.llmcalls import ask

    by_key = {q.key: q for q in prep.questions}
    order = sorted(wanted, key=lambda x: (list(by_key).index(x[0]), x[1]))
    reqs = [
        judge_request(by_key[qk], samples[qk][i].text, prep.judge_prompt, prep.judge, prep.opts)
        for qk, i in order
    ]
    validate: Any = None
    if prep.opts.judge_format == "json":
        req_q = {r.key: qk for r, (qk, _) in zip(reqs, order, strict=True)}

        def validate(req: Any, text: str) -> Any:
            schema = schemas.coverage_schema(
                len(by_key[req_q[req.key]].aspects),
                prep.opts.judge_max_tokens,
                prep.judge.cfg.judge.rationale_max_chars,
            )[0]
            return schemas.read(schema, text, clip=True).value

    asked = ask(
        prep.judge,
        prep.out / CACHE,
        STAGE_JUDGE,
        reqs,
        validate=validate,
        max_reasks=prep.judge.cfg.backend.max_reasks if validate is not None else 0,
        progress=prep.opts.progress,
    )
    transport = [o for o in asked.outcomes if not isinstance(o, Answer) and not o.final]
    if transport:
        raise _unanswered("judge", asked, len(reqs))
    out = {}
    for (qk, i), req, o in zip(order, reqs, asked.outcomes, strict=True):
        if not isinstance(o, Answer):
            out[(qk, i)] = Verdict([], None, False, req.key)
        elif validate is not None:
            values = [float(v) for v in o.parsed[0]["scores"].values()]
            out[(qk, i)] = Verdict(values, sum(values) / len(values), True, req.key)
        else:
            got, mean, found = read_verdict_list(o.result.choices[0].text)
            out[(qk, i)] = Verdict(got, mean, found, req.key)
    return out, asked.stats


def run_bon(opts: BonOptions, echo: Callable[[str], Any] = print) -> dict[str, Any]:
    """Check everything, print the plan, then sample, score, pick, judge and write."""
    start = time.perf_counter()
    prep = prepare(opts)
    plan = plan_of(prep)
    echo(render_plan(plan))
    for note in prep.notes:
        echo(f"note: {note}")
    if opts.plan_only:
        return {"plan": plan, "outputs": {}}
    out = prep.out
    out.mkdir(parents=True, exist_ok=True)
    with _locked(out):
        if not (out / MARKER).is_file():
            write_json_atomic(out / MARKER, {"written_by": "prb eval bon"})
        samples, sample_stats = draw_samples(prep)
        scores, scorer_info = score_samples(prep, samples)
        picks: dict[tuple[str, str], dict[str, dict[int, int]]] = {}
        wanted: set[tuple[str, int]] = set()
        for key, per_q in scores.items():
            block = picks.setdefault(key, {})
            for qk, row in per_q.items():
                block[qk] = bonfigures.best_of_k(row, prep.ks)
                wanted.update((qk, i) for i in block[qk].values())
        verdicts, judge_stats = judge_picks(prep, samples, wanted)
        result = assemble(prep, plan, samples, sample_stats, scores, scorer_info, picks,
                          verdicts, judge_stats)  # fmt: skip
        result["seconds"] = round(time.perf_counter() - start, 2)
        result["outputs"] = write_outputs(prep, result, samples, scores, picks, verdicts)
    return result


def _locked(out: Path) -> Any:
    from pipeline.eval.results import _locked as lock

    return lock(out)


# ---- figures and files -----------------------------------------------------------------


def _versions() -> dict[str, str]:
    from pipeline.eval.evaluate import _versions as versions

    return versions()


def assemble(
    prep: Prepared,
    plan: dict[str, Any],
    samples: dict[str, list[Sample]],
    sample_stats: dict[str, Any],
    scores: dict[tuple[str, str], dict[str, list[float]]],
    scorer_info: dict[str, Any],
    picks: dict[tuple[str, str], dict[str, dict[int, int]]],
    verdicts: dict[tuple[str, int], Verdict],
    judge_stats: dict[str, Any],
) -> dict[str, Any]:
    """bon.json: every figure and what made it."""
    opts = prep.opts
    judged = {k: v.mean for k, v in verdicts.items() if v.mean is not None}
    unjudged = {qk for (qk, _), v in verdicts.items() if v.mean is None}
    subsets = {q.key: q.subset for q in prep.questions}
    default_model = opts.cfg.backend.model
    blocks = []
    for spec in prep.specs:
        block: dict[str, Any] = {
            "name": spec.display_name(default_model),
            "spec": spec.text,
            "slug": spec.slug(default_model),
            "kind": spec.prefix,
            "scorer": scorer_info[spec.text],
            "curves": {},
        }
        for s in opts.settings:
            p = {qk: v for qk, v in picks[(spec.text, s)].items() if qk not in unjudged}
            block["curves"][s] = bonfigures.curves(
                p, judged, subsets, prep.ks, opts.n_boot, opts.seed
            )
        acc = prep.accuracy.get(spec.text) or {}
        block["accuracy"] = acc if "accuracy" in acc else None
        block["accuracy_note"] = acc.get("note")
        blocks.append(block)
    finishes: dict[str, int] = {}
    for row in samples.values():
        for smp in row:
            finishes[smp.finish_reason] = finishes.get(smp.finish_reason, 0) + 1
    verdict_list = list(verdicts.values())
    mismatched = sum(
        1
        for (qk, _), v in verdicts.items()
        if v.mean is not None
        and len(v.scores) != len(next(q for q in prep.questions if q.key == qk).aspects)
    )
    return {
        "schema": 1,
        "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "split": prep.split,
        "questions": len(prep.questions),
        "subsets": sorted({str(q.subset) for q in prep.questions if q.subset is not None}),
        "n": opts.n,
        "ks": prep.ks,
        "settings": {s: SETTINGS[s] for s in opts.settings},
        "ties": "best-of-k picks the highest-scored of the first k samples; equal scores go "
        "to the lowest sample index (the reference's max() keeps the first maximum); NaN "
        "ranks below every number",
        "policy": {
            **prep.policy.describe(),
            "temperature": opts.temperature,
            "top_p": opts.top_p,
            "max_tokens": opts.max_tokens,
            "system": SAMPLE_SYSTEM,
            "prompt": prep.sample_prompt.provenance(),
            "profile_posts": opts.posts,
            "seed": prep.policy.cfg.run.seed,
            "finish_reasons": finishes,
            "requests": sample_stats,
        },
        "judge": {
            **prep.judge.describe(),
            "format": opts.judge_format,
            "scale": "0, 1 or 2 per rubric aspect; an answer's score is their mean",
            "reading": "the numbers of the first [...] list of the answer (else of the whole "
            "answer), their mean; 0 when there is none (the reference's reading)"
            if opts.judge_format == "list"
            else "the project's JSON coverage verdict (prompts/judge_coverage.j2), its "
            "per-aspect scores' mean",
            "max_tokens": opts.judge_max_tokens,
            "system": JUDGE_SYSTEM if opts.judge_format == "list" else None,
            "prompt": prep.judge_prompt.provenance() if prep.judge_prompt else COVERAGE_TEMPLATE,
            "judged_answers": len(verdicts),
            "picks": sum(len(ks) for per in picks.values() for ks in per.values()),
            "unparsed": sum(not v.found for v in verdict_list),
            "scores_not_one_per_aspect": mismatched,
            "unjudged_questions": sorted(unjudged),
            "requests": judge_stats,
        },
        "scorers": blocks,
        "accuracy_setting": opts.accuracy_setting,
        "bootstrap": {
            "resamples": opts.n_boot,
            "seed": opts.seed,
            "interval": "95% percentile over questions (pipeline.eval.metrics.bootstrap_ci)",
        },
        "plan": plan,
        "notes": list(prep.notes),
        "versions": _versions(),
    }


def write_outputs(
    prep: Prepared,
    result: dict[str, Any],
    samples: dict[str, list[Sample]],
    scores: dict[tuple[str, str], dict[str, list[float]]],
    picks: dict[tuple[str, str], dict[str, dict[int, int]]],
    verdicts: dict[tuple[str, int], Verdict],
) -> dict[str, Any]:
    """Write every file; bon.json last, naming each table with its SHA-256."""
    out, opts = prep.out, prep.opts
    subset = {q.key: q.subset for q in prep.questions}
    row_id = {q.key: q.row_id for q in prep.questions}
    names = {spec.text: b["name"] for spec, b in zip(prep.specs, result["scorers"], strict=True)}
    write_jsonl_atomic(
        out / SAMPLES,
        (
            {
                "question": qk,
                "id": row_id[qk],
                "subset": subset[qk],
                "sample": i,
                "text": smp.text,
                "finish_reason": smp.finish_reason,
                "request": smp.key,
            }
            for qk, row in samples.items()
            for i, smp in enumerate(row)
        ),
    )
    write_jsonl_atomic(
        out / SCORES,
        (
            {"scorer": names[text], "setting": s, "question": qk, "sample": i, "score": v}
            for (text, s), per_q in scores.items()
            for qk, row in per_q.items()
            for i, v in enumerate(row)
        ),
    )
    write_jsonl_atomic(
        out / PICKS,
        (
            {
                "scorer": names[text],
                "setting": s,
                "k": k,
                "question": qk,
                "sample": i,
                "score": scores[(text, s)][qk][i],
            }
            for (text, s), per_q in picks.items()
            for qk, by_k in per_q.items()
            for k, i in sorted(by_k.items())
        ),
    )
    write_jsonl_atomic(
        out / VERDICTS,
        (
            {
                "question": qk,
                "sample": i,
                "scores": v.scores,
                "score": v.mean,
                "read": v.found,
                "request": v.key,
            }
            for (qk, i), v in sorted(verdicts.items())
        ),
    )
    tables: dict[str, Any] = {}
    for s in opts.settings:
        header, rows, notes = bonfigures.table_rows(result["scorers"], s, prep.ks)
        csv_path = out / table_name(s)
        write_text_atomic(csv_path, bonfigures.csv_text(header, rows))
        entry: dict[str, Any] = {
            "csv": str(csv_path),
            "sha256": file_digest(csv_path)[0],
            "rows": len(rows),
            "notes": notes,
            "correlate": None,
        }
        json_path = out / table_json(s)
        try:
            corr = correlate(csv_path, n_boot=opts.n_boot, seed=opts.seed)
        except InputError as exc:
            entry["correlate_note"] = f"not computed: {exc}"
            json_path.unlink(missing_ok=True)  # an earlier run's figures are not this table's
        else:
            write_json_atomic(json_path, corr)
            entry["correlate"] = str(json_path)
            entry["correlate_sha256"] = file_digest(json_path)[0]
            entry["figures"] = corr["correlations"]
        tables[s] = entry
    result["tables"] = tables
    write_text_atomic(out / REPORT, render_report(result))
    write_json_atomic(out / BON_JSON, result)
    return {
        "folder": str(out),
        "bon": str(out / BON_JSON),
        "report": str(out / REPORT),
        "tables": {s: t["csv"] for s, t in tables.items()},
    }


def format_summary(result: dict[str, Any]) -> str:
    """The short table printed at the end: per setting and scorer, the mean judge score at
    each k (all questions) and the gain of the largest k over k = 1."""
    ks = result["ks"]
    lines = []
    for s in result["settings"]:
        head = " ".join(f"{'k=' + str(k):>7s}" for k in ks)
        lines.append(f"setting {s}: mean judge score (0-2) of the best-of-k answer")
        lines.append(f"  {'scorer':30s} {head}   gain [95% CI]         accuracy")
        for b in result["scorers"]:
            fig = b["curves"][s][bonfigures.ALL]
            cells = " ".join(
                f"{fig['k'][str(k)]['mean']:>7.3f}" if fig["k"][str(k)]["mean"] is not None
                else f"{'-':>7s}"
                for k in ks
            )  # fmt: skip
            g = fig["gain"]
            gain = "-" if g["gain"] is None else f"{g['gain']:+.3f}"
            ci = g["ci95"]
            band = "" if not ci else f"[{ci[0]:+.3f}, {ci[1]:+.3f}]"
            acc = b.get("accuracy") or {}
            shown = "-" if acc.get("accuracy") is None else f"{acc['accuracy']:.3f}"
            lines.append(f"  {b['name'][:30]:30s} {cells}   {gain:>6s} {band:16s} {shown:>8s}")
    j = result["judge"]
    line = f"judge: {j['judged_answers']} distinct answers judged for {j['picks']} picks"
    if j["format"] == "list":
        line += f"; {j['unparsed']} answers without a number read as 0 (the reference's rule)"
    if j["unjudged_questions"]:
        line += f"; {len(j['unjudged_questions'])} questions without a verdict left out"
    lines.append(line)
    return "\n".join(lines)
