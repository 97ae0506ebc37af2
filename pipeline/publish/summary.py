"""Every figure a release reports: the card's figures, also written to ``release.json``,
with what the release records about how it was made (the stages it was built from, the
rules its pairs were filtered with, the profile ranking; :mod:`pipeline.publish.recorded`)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.annotate.rounds import UNRESOLVED, VERIFIED
from pipeline.backends.identity import describe
from pipeline.publish.recorded import built_from
from pipeline.release.columns import json_text, sampling_of, templates_of
from pipeline.run import RunDir
from pipeline.types.promptfiles import FILE_VERSION

if TYPE_CHECKING:
    from pipeline.config import Config


class Tally:
    """What the figures need from the published pairs, added one pair at a time in the
    release's order, so no pair is held (``prb publish`` streams its pairs)."""

    def __init__(self) -> None:
        self.rows = 0
        self.per_cat: dict[str, dict[str, int]] = {}
        self.status: Counter = Counter()
        self.models: dict[str, set[str]] = {"generator_model": set(), "judge_model": set()}
        # distinct values by their JSON text (equal texts are equal values)
        self.sampling: dict[str, dict[str, Any]] = {"chosen": {}, "judge": {}}
        self.templates: dict[tuple, dict[str, Any]] = {}

    def add(self, record: dict[str, Any], row: dict[str, Any]) -> None:
        self.rows += 1
        c = self.per_cat.setdefault(str(row["category"]), {"pairs": 0, VERIFIED: 0})
        c["pairs"] += 1
        c[VERIFIED] += row["human_verdict"] == VERIFIED
        self.status[row["human_verdict"]] += 1
        for col, seen in self.models.items():
            if row[col] is not None:
                seen.add(str(row[col]))
        s = sampling_of(record)
        for side, seen_s in self.sampling.items():
            if s[side] is not None:  # None: the pair was not judged
                seen_s[json_text(s[side])] = s[side]
        t = templates_of(record)
        for info in [t.get("chosen"), t.get("rejected"), *(t.get("judge") or {}).values()]:
            if info and info.get("template"):
                at = (info["template"], info.get("template_version"), info.get("template_hash"))
                self.templates[at] = {
                    **info,
                    "from_file": info.get("template_version") == FILE_VERSION,
                }


def release_summary(
    rd: RunDir,
    config: Config | None,
    policy: str,
    license: str,
    tally: Tally,
    configs: dict[str, int],
    excluded: Counter,
    agreement: dict[str, Any],
) -> dict[str, Any]:
    """Every figure the card reports, also written to release.json."""
    pairs = rd.finished("pairs")
    stats = pairs.stats()
    funnel = {
        k: stats.get(k)
        for k in ("examples", "kept", "dropped", "dropped_by_reason", "kept_by_strategy")
        if k in stats
    }
    meta = pairs.meta
    settings = meta.settings if meta is not None else {}
    ingest = rd.stage("ingest").meta
    env = rd.environment()
    status = tally.status

    run_name = config.run.name if config is not None else rd.path.name
    served = _served_by(rd)
    return {
        "pretty_name": f"Personalized RewardBench pairs ({run_name})",
        "hand_written": _hand_written(config),
        "not_model_output": _not_model_output(served),
        "reasoning": _reasoning(rd, served),
        "license": license,
        "policy": policy,
        "rows": tally.rows,
        "configs": dict(configs),
        "excluded": dict(excluded),
        "funnel": funnel,
        "per_category": tally.per_cat,
        "human": {
            "annotated": sum(n for s, n in status.items() if s is not None),
            VERIFIED: status.get(VERIFIED, 0),
            UNRESOLVED: status.get(UNRESOLVED, 0),
        },
        "agreement": agreement,
        "ledger": card_ledger(rd, config),
        "built_from": built_from(rd),
        "provenance": {
            "served_by": {k: {**v, "described": describe(v)} for k, v in served.items()},
            "generator_models": sorted(tally.models["generator_model"]),
            "judge_models": sorted(tally.models["judge_model"]),
            "run_seed": config.run.seed if config is not None else None,
            "generator_sampling": _in_order(tally.sampling["chosen"]),
            "judge_sampling": _in_order(tally.sampling["judge"]),
            "templates": [tally.templates[k] for k in sorted(tally.templates, key=str)],
            "filters": settings.get("pairs"),
            # what `prb audit` of the release applies, wherever the release lies
            "rules": {"pairs": settings.get("pairs"), "word_cap": settings.get("word_cap")}
            if settings.get("pairs") is not None
            else None,
            # the selection behind each row's profile_view, for `prb eval`
            "profile": (ingest.settings if ingest is not None else {}).get("profile"),
            "environment": env,
            "publish_environment": _publish_versions(),
        },
    }


def _in_order(seen: dict[str, Any]) -> list[Any]:
    """Distinct values in a stable order (by their JSON text)."""
    return [seen[k] for k in sorted(seen)]


def card_ledger(rd: RunDir, config: Config | None) -> dict[str, Any]:
    """What building the run took, for the card's ledger section: per LLM stage, what its
    backend answered over the run's life (pipeline/engine/budget.py), with the cost at the run's
    prices when they are set."""
    from pipeline.engine.budget import run_ledger

    return run_ledger(rd, config.run.prices if config is not None else None)


def _served_by(rd: RunDir) -> dict[str, dict[str, Any]]:
    """Per LLM stage, the identity of what produced its answers (its stage.json)."""
    out = {}
    for name in ("rubrics", "responses", "judge"):
        meta = rd.stage(name).meta
        served = (meta.environment or {}).get("served_by") if meta is not None else None
        if isinstance(served, dict):
            out[name] = served
    return out


def _not_model_output(served: dict[str, dict[str, Any]]) -> str | None:
    """The card's plain statement when some stage's answers came from no model."""
    stages = [name for name, ident in served.items() if ident.get("model_output") is False]
    if not stages:
        return None
    return (
        "The "
        + " and ".join(
            {"rubrics": "rubrics", "responses": "answers", "judge": "judge verdicts"}[s]
            for s in stages
        )
        + " in this release are not model output: "
        + "; ".join(f"{s}: {describe(served[s])}" for s in stages)
        + "."
    )


def _reasoning(rd: RunDir, served: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    """Per LLM stage whose backend handled a reasoning model (its identity's ``reasoning``
    record): the settings, the answers that came with a reasoning block and its tokens
    (each stage's stats, this invocation's), and the card's sentence; None when no stage
    reasoned (pipeline/backends/reasoning.py)."""
    stages: dict[str, Any] = {}
    for name, ident in served.items():
        record = ident.get("reasoning")
        if not record:
            continue
        llm = rd.stage(name).stats().get("llm") or {}
        blocks = [llm] if "sent" in llm else [v for v in llm.values() if isinstance(v, dict)]
        stages[name] = {
            "settings": record,
            "reasoned_answers": sum(int(b.get("reasoned_answers") or 0) for b in blocks),
            "reasoning_tokens": sum(int(b.get("reasoning_tokens") or 0) for b in blocks),
            "reasoning_cut": sum(int(b.get("reasoning_cut") or 0) for b in blocks),
            "completion_tokens": sum(int(b.get("completion_tokens") or 0) for b in blocks),
        }
    if not stages:
        return None
    what = {"rubrics": "rubrics", "responses": "answers", "judge": "judge verdicts"}
    parts = []
    for name, f in stages.items():
        parts.append(
            f"{what[name]}: {f['reasoning_tokens']:,} reasoning tokens in "
            f"{f['reasoned_answers']:,} answers with a reasoning block, of "
            f"{f['completion_tokens']:,} output tokens; "
            f"budget {f['settings'].get('budget')} tokens, JSON {f['settings'].get('json_mode')}"
        )
    sentence = (
        "The "
        + " and ".join(what[n] for n in stages)
        + " in this release came from a reasoning model. Its reasoning was taken out of every "
        "answer before anything was stored: no chosen or rejected text, rubric or rationale "
        "holds it; only its length is recorded (each answer's provenance.reasoning). "
        + "; ".join(parts)
        + "."
    )
    return {"stages": stages, "statement": sentence}


def _publish_versions() -> dict[str, str | None]:
    """Versions that decide the release files' encoding (the run's own are in
    environment.json, written when the answers were generated)."""
    import platform
    from importlib import metadata

    out: dict[str, str | None] = {"python": platform.python_version()}
    for lib in ("personalized-rewardbench", "datasets", "pyarrow", "huggingface_hub"):
        try:
            out[lib] = metadata.version(lib)
        except metadata.PackageNotFoundError:
            out[lib] = None
    return out


def _hand_written(config: Config | None) -> str | None:
    """Why the card must say its pairs come from hand-written sample input, or None (that
    the answers came from no model is said by ``not_model_output``, from the provenance)."""
    reasons = []
    if config is not None:
        for p in (config.input.path, config.input.users_path, config.input.questions_path):
            parts = Path(p).parts if p is not None else ()
            if "examples" in parts:
                shown = Path(*parts[parts.index("examples") :]).as_posix()
                reasons.append(
                    f"the questions, profiles and rubrics are the project's hand-written "
                    f"sample input (`{shown}`), not LaMP-QA"
                )
                break
    if not reasons:
        return None
    text = "; ".join(reasons)
    return text[0].upper() + text[1:] + "."
