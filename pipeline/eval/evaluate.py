"""Run scorers over a split and assemble their results (the engine behind ``prb eval``).

Each scorer kind (``pipeline.eval.spec.SCORERS``) names its ``evaluator``, a function from a
``Job`` to its ``Scored`` figures (``score_rm``, ``score_judge``)."""

from __future__ import annotations

import datetime as dt
import platform
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.core.errors import InputError
from pipeline.core.registry import load_target
from pipeline.eval import metrics
from pipeline.eval.data import (
    DEFAULT_SETTINGS,
    PAIRWISE_TEMPLATE,
    POINTWISE_TEMPLATE,
    SETTINGS,
    EvalPair,
    listed,
    load_split,
    usable_settings,
    user_turn,
)
from pipeline.eval.generative import Answered, score_answers
from pipeline.eval.llmcalls import identify_role
from pipeline.eval.pairwise import run_judge
from pipeline.eval.pointwise import crosscheck, load_scorer
from pipeline.eval.results import SCHEMA_VERSION, check_root, default_root, write_results
from pipeline.eval.spec import ScorerSpec, check_prompt_settings, check_unique_names
from pipeline.run import RunDir
from pipeline.run.layout import CACHE
from pipeline.run.outputs import enclosing_run, run_role
from pipeline.types.prompts import load_template


@dataclass(frozen=True)
class Job:
    """One scorer over a split: what its kind's ``evaluator`` is given."""

    pairs: list[EvalPair]
    settings: list[str]
    spec: ScorerSpec
    cfg: Any
    folder: Path  # the scorer's result folder (a judge's request cache is kept there)
    n_boot: int = metrics.N_BOOT
    seed: int = metrics.SEED
    progress: bool = True


@dataclass
class Scored:
    """One scorer's figures over a split, as its kind's ``evaluator`` returns them."""

    blocks: dict[str, Any]  # setting -> its label, role and metrics
    outcomes: dict[str, list[str | None]]  # setting -> each pair's outcome
    scores: list[dict[str, Any]]  # one row per pair and setting
    info: dict[str, Any]  # the scorer's details, in results.json beside its spec
    template: dict[str, Any]  # the provenance of the prompt it was shown
    failed: int = 0  # requests that got no answer: the results are incomplete


def _versions() -> dict[str, str]:
    import importlib.metadata as md

    out = {"python": platform.python_version()}
    for name in ("personalized-rewardbench", "torch", "transformers", "vllm"):
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            continue
    return out


def setting_block(
    name: str,
    outcomes: list[str | None],
    pairs: list[EvalPair],
    n_boot: int,
    seed: int,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One setting's block of results.json from its outcomes (each kind's evaluator)."""
    s = SETTINGS[name]
    m = metrics.summary(outcomes, n_boot, seed)
    m["by"] = metrics.by_group(outcomes, [p.groups for p in pairs], n_boot, seed)
    # the mean of the per-category accuracies beside the pooled one (the reference reports
    # each subset on its own)
    cats = m["by"].get("category")
    m["accuracy_mean_of_categories"] = (
        metrics.mean_of_rates([(b["wins"], b["scored"]) for b in cats.values()]) if cats else None
    )
    if extra:
        m.update(extra)
    return {"label": s.label, "role": s.role, "metrics": m}


def _categories(pairs: list[EvalPair]) -> list[str] | None:
    """Each pair's category when the split has them: the reference's subsets, each of
    which its pairwise script shuffles with a freshly seeded draw."""
    if not any("category" in p.groups for p in pairs):
        return None
    return [p.groups.get("category", "not annotated") for p in pairs]


def _category_positions(
    by: dict[str, Any],
    cats: list[str] | None,
    ab: list[str | None],
    ba: list[str | None],
) -> None:
    """Position figures for each category (its reference-order draw seeded afresh, as the
    reference's per-subset run is), under ``by.category.<value>.position``."""
    if cats is None:
        return
    for value, block in by.get("category", {}).items():
        idx = [i for i, c in enumerate(cats) if c == value]
        block["position"] = metrics.position_figures([ab[i] for i in idx], [ba[i] for i in idx])


def _reference_order_mean(m: dict[str, Any]) -> None:
    """The mean of the categories' reference-order figures, beside the pooled one
    (``position.accuracy_reference_order_mean_of_categories``)."""
    pos = m.get("position")
    if not pos:
        return
    cats = m.get("by", {}).get("category")
    if not cats:
        pos["accuracy_reference_order_mean_of_categories"] = None
        return
    counts = [
        (b["position"]["reference_order_correct"], b["position"]["reference_order_scored"])
        for b in cats.values()
        if b.get("position")
    ]
    pos["accuracy_reference_order_mean_of_categories"] = metrics.mean_of_rates(counts)


def score_rm(job: Job) -> Scored:
    """A reward model's figures: each answer scored alone (all settings in one call, so the
    length sort spans them), the higher score wins; with the engine's details."""
    pairs, settings, spec = job.pairs, job.settings, job.spec
    encoder, scorer = load_scorer(spec, progress=job.progress)
    try:
        convs = []
        for s in settings:
            for p in pairs:
                u = user_turn(p, s)
                convs += [(u, p.chosen), (u, p.rejected)]
        ids = encoder.encode(convs)
        flat = scorer.score_ids(ids)
        info: dict[str, Any] = {
            **scorer.info(),
            "model_path": str(encoder.path),
            "num_labels": scorer.num_labels,
            "max_length": encoder.max_length,
            "truncated_inputs": encoder.truncated,
            "special_tokens": encoder.special_tokens,
            "template": encoder.template,
        }
        n_check = min(spec.opt("crosscheck"), len(pairs))
        if scorer.engine_args is not None:
            info["engine_args"] = scorer.engine_args
        if scorer.crosschecks and n_check:
            info["crosscheck"] = crosscheck(encoder, ids[: 2 * n_check], flat[: 2 * n_check], spec)
    finally:
        scorer.close()
    got = Scored({}, {}, [], info, load_template(POINTWISE_TEMPLATE).provenance())
    blocks, outcomes, scores = got.blocks, got.outcomes, got.scores
    for k, s in enumerate(settings):
        base = 2 * len(pairs) * k
        pair_scores = [(flat[base + 2 * i], flat[base + 2 * i + 1]) for i in range(len(pairs))]
        outcomes[s] = [metrics.pointwise_outcome(c, r) for c, r in pair_scores]
        sc = [c for c, _ in pair_scores]
        sr = [r for _, r in pair_scores]
        extra: dict[str, Any] = {
            "mean_chosen": round(sum(sc) / len(sc), 6),
            "mean_rejected": round(sum(sr) / len(sr), 6),
            "mean_margin": round(sum(c - r for c, r in pair_scores) / len(sc), 6),
        }
        blocks[s] = setting_block(s, outcomes[s], pairs, job.n_boot, job.seed, extra)
        for p, (c, r), o in zip(pairs, pair_scores, outcomes[s], strict=True):
            scores.append({"pair": p.key, "setting": s, "chosen": c, "rejected": r, "outcome": o})
    return got


def score_gen(job: Job) -> Scored:
    """A generative reward model's figures: each answer rated alone (a number in [0, 1]
    from a template, ``pipeline.eval.generative``), the higher score wins."""
    pairs, settings, spec, cfg = job.pairs, job.settings, job.spec, job.cfg
    model = spec.target or cfg.backend.model
    cache_path = job.folder / CACHE
    role = identify_role("scorer", cfg, model, cache_path, cached=cache_path.exists())
    items = []
    for s in settings:
        for p in pairs:
            profile = listed(p.posts) if s == "profile" else ""
            rubric = listed(p.aspects) if s == "rubric" else ""
            for answer in (p.chosen, p.rejected):
                items.append(Answered(p.question, answer, profile=profile, rubric=rubric))
    got_scores = score_answers(
        spec, items, role, cache_path, stage="eval-gen", seed=cfg.run.seed,
        progress=job.progress,
    )  # fmt: skip
    flat = got_scores.scores
    template = spec.prompts["template"]
    info = {
        **role.describe(),
        "temperature": spec.opt("temperature"),
        "max_tokens": spec.opt("max_tokens"),
        "template": template.provenance(),
        "unparsed_answers": got_scores.unparsed,
        "unparsed_read_as": 0.5,
        "requests": got_scores.stats,
    }
    got = Scored({}, {}, [], info, template.provenance(), failed=got_scores.failed)
    for k, s in enumerate(settings):
        base = 2 * len(pairs) * k
        pair_scores = [(flat[base + 2 * i], flat[base + 2 * i + 1]) for i in range(len(pairs))]
        got.outcomes[s] = [metrics.pointwise_outcome(c, r) for c, r in pair_scores]
        both = [(c, r) for c, r in pair_scores if c is not None and r is not None]
        extra: dict[str, Any] = {
            "mean_chosen": round(sum(c for c, _ in both) / len(both), 6) if both else None,
            "mean_rejected": round(sum(r for _, r in both) / len(both), 6) if both else None,
            "failed_requests": sum(c is None or r is None for c, r in pair_scores),
        }
        got.blocks[s] = setting_block(s, got.outcomes[s], pairs, job.n_boot, job.seed, extra)
        for p, (c, r), o in zip(pairs, pair_scores, got.outcomes[s], strict=True):
            got.scores.append(
                {"pair": p.key, "setting": s, "chosen": c, "rejected": r, "outcome": o}
            )
    return got


def score_judge(job: Job) -> Scored:
    """An LLM judge's figures: each pair asked in both orders, with position figures."""
    pairs, settings, spec = job.pairs, job.settings, job.spec
    judged, info = run_judge(pairs, settings, spec, job.cfg, job.folder, progress=job.progress)
    template = (
        {k: f.provenance() for k, f in spec.prompts.items()}
        if spec.prompts
        else load_template(PAIRWISE_TEMPLATE).provenance()
    )
    got = Scored({}, {}, [], info, template)
    blocks, outcomes, scores = got.blocks, got.outcomes, got.scores
    for s in settings:
        j = judged[s]
        ab = [j.letters[p.key]["AB"] for p in pairs]
        ba = [j.letters[p.key]["BA"] for p in pairs]
        outcomes[s] = [metrics.pairwise_outcome(a, b) for a, b in zip(ab, ba, strict=True)]
        cats = _categories(pairs)
        extra = {
            "position": metrics.position_figures(ab, ba, subsets=cats),
            "unparsed_verdicts": j.unparsed,
            "failed_requests": j.transport_failed,
        }
        got.failed += j.transport_failed
        blocks[s] = setting_block(s, outcomes[s], pairs, job.n_boot, job.seed, extra)
        _category_positions(blocks[s]["metrics"]["by"], cats, ab, ba)
        _reference_order_mean(blocks[s]["metrics"])
        for p, o in zip(pairs, outcomes[s], strict=True):
            scores.append(
                {
                    "pair": p.key,
                    "setting": s,
                    "verdicts": j.letters[p.key],
                    "failures": j.reasons.get(p.key, {}),
                    "rationales": j.rationales.get(p.key, {}),
                    "outcome": o,
                }
            )
    return got


def judge_model_of(spec: ScorerSpec, cfg: Any) -> str:
    """The model a judge spec names, or the config's (``judge:`` alone)."""
    return spec.target or cfg.judge.model or cfg.backend.model


def evaluate_one(
    pairs: list[EvalPair],
    settings: list[str],
    spec: ScorerSpec,
    *,
    cfg: Any,
    root: Path,
    split: dict[str, Any],
    skipped: dict[str, str],
    n_boot: int = metrics.N_BOOT,
    seed: int = metrics.SEED,
    progress: bool = True,
) -> dict[str, Any]:
    """Score the pairs with one scorer, write its results (one file per setting) and the
    leaderboards; returns every setting's figures, with the paths written under
    ``outputs``."""
    start = time.perf_counter()
    judge_model = judge_model_of(spec, cfg)
    slug = spec.slug(judge_model)
    job = Job(pairs, settings, spec, cfg, root / slug, n_boot, seed, progress)
    got: Scored = load_target(spec.scorer.evaluator)(job)
    outcomes = got.outcomes
    gain = None
    if "question" in outcomes and "profile" in outcomes:
        gain = metrics.paired_gain(outcomes["profile"], outcomes["question"], n_boot, seed)
    results = {
        "schema": SCHEMA_VERSION,
        "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "scorer": {
            "kind": spec.kind,
            "spec": spec.text,
            "slug": slug,
            "name": spec.display_name(judge_model),
            "options": spec.options,
            **got.info,
        },
        "split": split,
        "profile_selection": {
            **(
                split.get("profile_selection")
                or {"top_k": cfg.profile.top_k, "ranker": cfg.profile.ranker}
            ),
            "pairs_with_profile": sum(p.has_profile for p in pairs),
        },
        "template": got.template,
        "bootstrap": {"resamples": n_boot, "seed": seed},
        "settings": got.blocks,
        "skipped_settings": skipped,
        "profile_gain": gain,
        "incomplete": got.failed > 0,
        "seconds": round(time.perf_counter() - start, 2),
        "versions": _versions(),
    }
    results["outputs"] = write_results(root, results, got.scores)
    return results


def evaluate(
    path: str | Path,
    specs: Sequence[ScorerSpec],
    *,
    cfg: Any,
    settings: Sequence[str] = DEFAULT_SETTINGS,
    out: str | Path | None = None,
    limit: int | None = None,
    n_boot: int = metrics.N_BOOT,
    seed: int = metrics.SEED,
    progress: bool = True,
    stale_ok: bool = False,
) -> list[dict[str, Any]]:
    """Evaluate every scorer on the split at ``path``; returns each scorer's results."""
    check_unique_names(specs, lambda spec: judge_model_of(spec, cfg))
    reads = [("the split being evaluated", Path(path))]
    if cfg is not None and cfg.source is not None:
        reads.append(("the config being run", cfg.source))
    if out is not None:
        check_root(Path(out), reads)  # before the split loads
    pairs, split = load_split(path, cfg, limit, stale_ok=stale_ok)
    usable, skipped = usable_settings(pairs, list(settings))
    if not usable:
        reasons = "; ".join(f"{k}: {v}" for k, v in skipped.items())
        raise InputError(f"no setting can run on this split ({reasons})", path=str(path))
    for spec in specs:  # a prompt file without a place for a setting: before anything runs
        check_prompt_settings(spec, usable)
    root = Path(out) if out is not None else default_root(path)
    if out is None:
        run = enclosing_run(root)
        if run is not None and run_role(root) is not None:
            # beside a file inside a run's own folders (a release's parquet file): the
            # run's eval folder, never a folder of the release or of a stage
            root = RunDir(run).eval_dir
        check_root(root, reads)
    return [
        evaluate_one(
            pairs,
            usable,
            spec,
            cfg=cfg,
            root=root,
            split=split,
            skipped=skipped,
            n_boot=n_boot,
            seed=seed,
            progress=progress,
        )
        for spec in specs
    ]
