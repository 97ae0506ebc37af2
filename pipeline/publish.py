"""publish: the release of a run as a Hugging Face `datasets` dataset.

One parquet file per config (each category, plus ``all``) under ``<out>/<config>/``, a
dataset card ``README.md`` whose YAML header lists the configs, and ``release.json`` with
the card's figures in machine-readable form. The reference benchmark's eight columns come
first, in its names and types, so its evaluation code loads the release unchanged; our
provenance columns follow.

Policies: ``verified`` publishes only pairs whose latest human verdict is "verified";
``filtered`` publishes every kept pair except those humans refuted. A later annotation
round's verdict for a pair replaces an earlier one.

The release is built in a temporary folder beside the target and renamed into place at
the end, so a failure leaves the previous release (or nothing), never half of one.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.errors import InputError, PipelineError, StageError
from pipeline.io import _fsync_dir, read_json, read_jsonl
from pipeline.rundir import RunDir

if TYPE_CHECKING:
    from datasets import Features

    from pipeline.config import Config

POLICIES = ("verified", "filtered")
STATUSES = ("verified", "refuted", "unresolved")
REFERENCE_COLUMNS = (
    "id",
    "question",
    "profile",
    "rubric_aspects",
    "narrative",
    "category",
    "chosen",
    "rejected",
)
# Columns that describe the user's hidden expectations; a reward model that sees them is
# told the answer, so the card says so in bold.
PRIVILEGED_COLUMNS = ("rubric_aspects", "narrative")
DATA_FILE = "test-00000-of-00001.parquet"
DIMENSIONS = ("correctness", "relevance", "helpfulness")
DEFAULT_LICENSE = "cc-by-4.0"
# Environment variables whose values must never reach a release, besides the ones the
# config names (backend.api_key_env, annotation.token_env).
_SECRET_NAME_RE = re.compile(r"(KEY|TOKEN|SECRET|PASSWORD)$", re.I)
_MIN_SECRET_LEN = 8  # shorter values ("1", "true") would match innocent text


def reference_features() -> Features:
    """The reference release's eight columns and their types."""
    from datasets import Features, List, Value

    s = Value("string")
    return Features(
        {
            "id": s,
            "question": s,
            "profile": List({"id": s, "category": s, "text": s}),
            "rubric_aspects": List({"aspect": s, "evidence": s, "reason": s}),
            "narrative": s,
            "category": s,
            "chosen": s,
            "rejected": s,
        }
    )


def release_features() -> Features:
    """Reference columns first, then provenance, judge and human-verification columns."""
    from datasets import Features, List, Value

    s, i64, f64 = Value("string"), Value("int64"), Value("float64")
    quality = {d: i64 for d in DIMENSIONS}
    orders = {"AB": s, "BA": s}
    return Features(
        {
            **reference_features(),
            "pair_id": s,
            "example_id": s,
            "user_id": s,
            "rubric_version": s,
            "rubric_source": s,
            "rubric_item_ids": List(s),  # aligned with rubric_aspects; violated_item_ids refer here
            "strategy": s,
            "violated_item_ids": List(s),
            "generator_model": s,
            "judge_model": s,
            "sampling": s,  # JSON: generator sampling per side, judge sampling and seed
            "seeds": {"chosen": i64, "rejected": i64},
            "template_hashes": s,  # JSON: template name, version and sha256 per side and judge
            "margin": f64,
            "similarity": f64,
            "quality_chosen": quality,
            "quality_rejected": quality,
            "coverage_chosen_mean": f64,
            "coverage_rejected_mean": f64,
            "coverage_rejected_violated_mean": f64,
            "pairwise_aware": orders,  # which side each A/B order preferred: chosen/rejected/tie
            "pairwise_blind": orders,
            "human_verdict": s,  # latest status: verified / unresolved; null: not annotated
            "human_majority": s,
            "human_votes": i64,
            "human_agreement": f64,  # share of votes behind the majority label
            "human_round": i64,
        }
    )


# ---- reading the run ------------------------------------------------------------------


def _round_key(path: Path) -> tuple[int, str]:
    # round-2 comes before round-10: compare the number, not the text
    m = re.search(r"(\d+)$", path.name)
    return (int(m.group(1)) if m else -1, path.name)


def _rounds(run_dir: Path) -> list[Path]:
    base = run_dir / "annotate"
    if not base.is_dir():
        return []
    return sorted((p for p in base.glob("round-*") if p.is_dir()), key=_round_key)


def load_verdicts(run_dir: str | Path) -> dict[str, dict[str, Any]]:
    """Latest human verdict per pair_id over all annotation rounds (a later round wins)."""
    latest: dict[str, dict[str, Any]] = {}
    for rnd in _rounds(Path(run_dir)):
        path = rnd / "verdicts.jsonl"
        if not path.exists():
            continue
        number = _round_key(rnd)[0]
        for line, row in enumerate(read_jsonl(path), start=1):
            if not isinstance(row, dict) or not row.get("pair_id"):
                raise InputError("verdict row without a pair_id", path=path, line=line)
            if row.get("status") not in STATUSES:
                raise InputError(
                    f"status must be one of {', '.join(STATUSES)}, got {row.get('status')!r}",
                    path=path,
                    line=line,
                    field="status",
                )
            latest[row["pair_id"]] = {**row, "round": number}
    return latest


def _agreement_summary(raw: dict[str, Any]) -> dict[str, Any]:
    """The round-level figures of an agreement.json, without per-item or per-annotator
    detail: annotator names and single votes do not belong in a public release."""
    keep = (
        "items",
        "annotators",
        "annotations",
        "items_with_2plus",
        "krippendorff_alpha",
        "raw_agreement",
    )
    out = {k: raw.get(k) for k in keep if k in raw}
    hvj = raw.get("human_vs_judge")
    if isinstance(hvj, dict):
        out["human_vs_judge"] = {k: hvj.get(k) for k in ("n", "agreement", "kappa")}
    gold = raw.get("gold_accuracy")
    if raw.get("gold_accuracy_overall") is not None:
        out["gold_accuracy"] = raw["gold_accuracy_overall"]
    elif isinstance(gold, dict):  # per annotator: keep only the mean
        accs = [
            v.get("accuracy")
            for v in gold.values()
            if isinstance(v, dict) and v.get("accuracy") is not None
        ]
        out["gold_accuracy"] = sum(accs) / len(accs) if accs else None
    return out


def load_agreement(run_dir: str | Path) -> dict[str, dict[str, Any]]:
    """Round name -> summary figures from ``annotate/round-*/agreement.json``."""
    out = {}
    for rnd in _rounds(Path(run_dir)):
        path = rnd / "agreement.json"
        if path.exists():
            try:
                raw = read_json(path)
            except json.JSONDecodeError as exc:
                raise InputError(f"not valid JSON: {exc}", path=path) from exc
            out[rnd.name] = _agreement_summary(raw if isinstance(raw, dict) else {})
    return out


def _read_optional_json(path: Path) -> Any:
    return read_json(path) if path.exists() else None


# ---- one release row ------------------------------------------------------------------


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _quality(q: dict | None) -> dict[str, int | None]:
    q = q or {}
    return {d: q.get(d) for d in DIMENSIONS}


def _prefers(pairwise: dict, kind: str) -> dict[str, str | None]:
    v = (pairwise or {}).get(kind) or {}
    return {o: (v.get(o) or {}).get("prefers") for o in ("AB", "BA")}


def _template_info(p: dict | None) -> dict[str, Any] | None:
    if not p:
        return None
    return {k: p.get(k) for k in ("template", "template_version", "template_hash")}


def _json(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, ensure_ascii=False)


def build_row(
    pair: dict[str, Any],
    example: dict[str, Any],
    rubric: dict[str, Any],
    verdict: dict[str, Any] | None,
) -> dict[str, Any]:
    """The release row of one kept pair."""
    gen = (pair.get("provenance") or {}).get("generator") or {}
    g_ch, g_rj = gen.get("chosen") or {}, gen.get("rejected") or {}
    judge_prov = (pair.get("provenance") or {}).get("judge") or {}
    judge = pair.get("judge") or {}
    cov = judge.get("coverage") or {}
    cov_c, cov_r = cov.get("chosen") or {}, cov.get("rejected") or {}
    violated = list(pair.get("violated_item_ids") or [])
    items = rubric.get("items") or []
    models = {g_ch.get("model"), g_rj.get("model")}
    if len(models) == 1:
        generator_model = g_ch.get("model")
    else:
        generator_model = f"{g_ch.get('model')} (chosen), {g_rj.get('model')} (rejected)"
    verdict = verdict or {}
    return {
        "id": str(example.get("source_id") or example["example_id"]),
        "question": example["question"],
        "profile": [
            {"id": p.get("id"), "category": p.get("category"), "text": p.get("text")}
            for p in example.get("profile") or []
        ],
        "rubric_aspects": [
            {"aspect": it.get("aspect"), "evidence": it.get("evidence"), "reason": it.get("reason")}
            for it in items
        ],
        "narrative": example.get("narrative"),
        "category": example.get("category"),
        "chosen": pair["chosen"],
        "rejected": pair["rejected"],
        "pair_id": pair["pair_id"],
        "example_id": pair["example_id"],
        "user_id": pair.get("user_id"),
        "rubric_version": pair.get("rubric_version"),
        "rubric_source": rubric.get("source"),
        "rubric_item_ids": [it.get("item_id") for it in items],
        "strategy": pair.get("strategy"),
        "violated_item_ids": violated,
        "generator_model": generator_model,
        "judge_model": judge_prov.get("model"),
        "sampling": _json(
            {
                "chosen": {**(g_ch.get("sampling") or {}), "n": g_ch.get("n")},
                "rejected": {**(g_rj.get("sampling") or {}), "n": g_rj.get("n")},
                "judge": {**(judge_prov.get("sampling") or {}), "seed": judge_prov.get("seed")},
            }
        ),
        "seeds": {"chosen": g_ch.get("seed"), "rejected": g_rj.get("seed")},
        "template_hashes": _json(
            {
                "chosen": _template_info(g_ch),
                "rejected": _template_info(g_rj),
                "judge": {
                    k: _template_info(v) for k, v in (judge_prov.get("templates") or {}).items()
                },
            }
        ),
        "margin": pair.get("margin"),
        "similarity": pair.get("similarity"),
        "quality_chosen": _quality((judge.get("quality") or {}).get("chosen")),
        "quality_rejected": _quality((judge.get("quality") or {}).get("rejected")),
        "coverage_chosen_mean": _mean(list(cov_c.values())),
        "coverage_rejected_mean": _mean(list(cov_r.values())),
        "coverage_rejected_violated_mean": _mean([cov_r[i] for i in violated if i in cov_r]),
        "pairwise_aware": _prefers(judge.get("pairwise") or {}, "pairwise_aware"),
        "pairwise_blind": _prefers(judge.get("pairwise") or {}, "pairwise_blind"),
        "human_verdict": verdict.get("status"),
        "human_majority": verdict.get("majority"),
        "human_votes": int(verdict.get("n_votes") or 0),
        "human_agreement": verdict.get("share"),
        "human_round": verdict.get("round"),
    }


def select_pairs(
    pairs: list[dict[str, Any]], verdicts: dict[str, dict[str, Any]], policy: str
) -> tuple[list[dict[str, Any]], Counter]:
    """The pairs the policy publishes, and a count of the others by why they were left out."""
    if policy not in POLICIES:
        raise PipelineError(f"unknown policy {policy!r}; choose one of {', '.join(POLICIES)}")
    kept, excluded = [], Counter()
    for p in pairs:
        status = (verdicts.get(p["pair_id"]) or {}).get("status")
        if status == "refuted":  # never published, under any policy
            excluded["refuted"] += 1
        elif policy == "verified" and status != "verified":
            excluded["unresolved" if status == "unresolved" else "not_annotated"] += 1
        else:
            kept.append(p)
    return kept, excluded


# ---- secrets --------------------------------------------------------------------------


def _secret_values(config: Config | None) -> dict[str, str]:
    """Environment variable name -> value for everything that may hold a credential."""
    names = {"HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"}
    if config is not None:
        names |= {config.backend.api_key_env, config.annotation.token_env}
    names |= {k for k in os.environ if _SECRET_NAME_RE.search(k)}
    return {n: v for n in sorted(names) if len(v := os.environ.get(n) or "") >= _MIN_SECRET_LEN}


def _check_no_secrets(secrets: dict[str, str], where: str, data: bytes) -> None:
    for name, value in secrets.items():
        if value.encode() in data:
            # name the variable, never the value
            raise PipelineError(
                f"{where} contains the value of the environment variable {name}; "
                "nothing was published"
            )


# ---- the card -------------------------------------------------------------------------


def _size_category(n: int) -> str:
    for bound, label in ((1_000, "n<1K"), (10_000, "1K<n<10K"), (100_000, "10K<n<100K")):
        if n < bound:
            return label
    return "100K<n<1M" if n < 1_000_000 else "n>1M"


def _config_name(category: str | None) -> str:
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", category or "").strip("_.-")
    return name or "uncategorized"


def _fmt(x: Any) -> str:
    if x is None:
        return "n/a"
    if isinstance(x, float):
        return f"{x:.3f}"
    return str(x)


def render_card(summary: dict[str, Any]) -> str:
    """README.md with the YAML header the Hub reads (configs, license, sizes)."""
    import yaml

    configs = [
        {
            "config_name": name,
            "data_files": [{"split": "test", "path": f"{name}/{DATA_FILE}"}],
            **({"default": True} if name == "all" else {}),
        }
        for name in summary["configs"]
    ]
    header = {
        "license": summary["license"],
        "pretty_name": summary["pretty_name"],
        "language": ["en"],
        "task_categories": ["text-classification", "question-answering"],
        "size_categories": [_size_category(summary["rows"])],
        "tags": ["reward-modeling", "personalization", "preference", "rlhf"],
        "configs": configs,
    }
    s = summary
    lines = [
        "---",
        yaml.safe_dump(header, sort_keys=False, allow_unicode=True).rstrip(),
        "---",
        "",
        f"# {s['pretty_name']}",
        "",
        "Pairs for evaluating *personalized* reward models: for each user and question, a "
        "**chosen** answer that covers the aspects this user expects and a **rejected** answer "
        "that misses them while staying correct, relevant and helpful. The first eight columns "
        "follow the Personalized RewardBench release (arXiv 2604.07343) name for name and type "
        "for type, so its evaluation code loads this release unchanged.",
        "",
        "> **Warning: `rubric_aspects` and `narrative` must never be given to a reward model.** "
        "They spell out what the user expects, which is the answer to the benchmark. A reward "
        "model may see `question`, `profile`, `chosen` and `rejected` only. The provenance, "
        "judge and human columns are for analysis, never model input.",
        "",
        "## Loading",
        "",
        "```python",
        "from datasets import load_dataset",
        f'ds = load_dataset("<this repo or folder>", "all", split="test")  # {s["rows"]} pairs',
        "```",
        "",
        "## Configs",
        "",
        "| config | pairs |",
        "|---|---|",
        *[f"| `{name}` | {n} |" for name, n in s["configs"].items()],
        "",
        "## Selection",
        "",
        f"Policy: **{s['policy']}**. "
        + (
            "Only pairs whose latest human verdict is *verified* are published."
            if s["policy"] == "verified"
            else "Every pair the automatic filters kept is published, with the human verdict "
            "where one exists (`human_verdict`; null when the pair was not annotated)."
        )
        + " Pairs that annotators **refuted** are excluded under every policy. When a pair "
        "was annotated in several rounds, the latest round's verdict counts.",
        "",
        "| step | pairs |",
        "|---|---|",
    ]
    f = s.get("funnel") or {}
    if f:
        lines.append(f"| examples entering the pair stage | {f.get('examples', 'n/a')} |")
        for reason, n in sorted((f.get("dropped_by_reason") or {}).items()):
            if n:
                lines.append(f"| dropped by filter `{reason}` | {n} |")
        lines.append(f"| kept by the filters | {f.get('kept', 'n/a')} |")
    for reason, n in sorted(s["excluded"].items()):
        lines.append(f"| excluded at publish: {reason.replace('_', ' ')} | {n} |")
    lines.append(f"| **published** | **{s['rows']}** |")
    if f.get("kept_by_strategy"):
        kinds = ", ".join(f"{k} {v}" for k, v in sorted(f["kept_by_strategy"].items()))
        lines += ["", f"Kept pairs by rejected-answer strategy: {kinds}."]
    lines += ["", "## Per category", "", "| category | pairs | human-verified |", "|---|---|---|"]
    for cat, c in sorted(s["per_category"].items()):
        lines.append(f"| {cat} | {c['pairs']} | {c['verified']} |")

    lines += ["", "## Human verification", ""]
    h = s["human"]
    lines.append(
        f"Published pairs with a human verdict: {h['annotated']} of {s['rows']} "
        f"(verified {h['verified']}, unresolved {h['unresolved']})."
    )
    if s["agreement"]:
        lines += [
            "",
            "| round | items | annotators | Krippendorff's alpha | raw agreement | "
            "human vs judge | gold accuracy |",
            "|---|---|---|---|---|---|---|",
        ]
        for rnd, a in s["agreement"].items():
            hvj = (a.get("human_vs_judge") or {}).get("agreement")
            lines.append(
                f"| {rnd} | {_fmt(a.get('items'))} | {_fmt(a.get('annotators'))} | "
                f"{_fmt(a.get('krippendorff_alpha'))} | {_fmt(a.get('raw_agreement'))} | "
                f"{_fmt(hvj)} | {_fmt(a.get('gold_accuracy'))} |"
            )
    else:
        lines += ["", "No annotation round has agreement figures."]

    p = s["provenance"]
    lines += [
        "",
        "## Provenance",
        "",
        f"- Generator model(s): {', '.join(p['generator_models']) or 'n/a'}",
        f"- Judge model(s): {', '.join(p['judge_models']) or 'n/a'}",
        f"- Run seed: {_fmt(p['run_seed'])}; each answer's sampling seed is in `seeds` "
        "(derived from the run seed and the row's inputs).",
        f"- Generator sampling: `{_json(p['generator_sampling'])}`",
        f"- Judge sampling: `{_json(p['judge_sampling'])}`",
        "- Prompt templates (name, version, sha256):",
        *[
            f"  - `{t['template']}` v{t['template_version']}: `{t['template_hash']}`"
            for t in p["templates"]
        ],
        f"- Pair filters and thresholds: `{_json(p['filters'])}`",
        f"- Library versions of the run: `{_json(p['environment'])}`",
        f"- Library versions at publish time: `{_json(p['publish_environment'])}`",
        f"- License: {s['license']}",
        "",
        "### What decides the output",
        "",
        "The pairs are decided by the input data, the rubric source, the generator and judge "
        "models, the sampling parameters, the seeds, the prompt templates (by hash) and the "
        "filter thresholds above; each is part of the fingerprint of the stage it feeds, so "
        "changing one re-does that stage and those after it. A model name does not pin the "
        "weights: the run records the name the server reported, not a revision. The "
        "selection is decided by the policy and the human verdicts. Library versions do not "
        "change a recorded run (every model answer is cached and replayed), but a re-generation "
        "may differ with another vLLM or server version even at the same seed, since sampling "
        "kernels are not bit-stable across versions. `datasets` and `pyarrow` decide only the "
        "file encoding.",
        "",
        "## Columns",
        "",
        "Reference columns: `id` (the source example's id), `question`, `profile` (the user's "
        "past posts: id, category, text), `rubric_aspects` (aspect, evidence, reason), "
        "`narrative`, `category`, `chosen`, `rejected`.",
        "",
        "Provenance: `pair_id`, `example_id`, `user_id`, `rubric_version`, `rubric_source`, "
        "`rubric_item_ids` (aligned with `rubric_aspects`), `strategy`, `violated_item_ids`, "
        "`generator_model`, `judge_model`, `sampling` (JSON), `seeds`, `template_hashes` "
        "(JSON), `margin`, `similarity` (word-level, 0-100).",
        "",
        "Judge: `quality_chosen` / `quality_rejected` (rubric-blind 1-5 per dimension), "
        "`coverage_chosen_mean`, `coverage_rejected_mean`, `coverage_rejected_violated_mean` "
        "(rubric-aware, 0-2), `pairwise_aware` / `pairwise_blind` (the side each A/B order "
        "preferred).",
        "",
        "Human: `human_verdict` (verified / unresolved / null), `human_majority`, "
        "`human_votes`, `human_agreement` (share of votes behind the majority), `human_round`.",
        "",
    ]
    return "\n".join(lines)


# ---- writing --------------------------------------------------------------------------


def _write_parquet(path: Path, rows: list[dict[str, Any]], features: Features) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    # the schema carries the `datasets` Features as metadata, so loaders get exact types
    table = pa.Table.from_pylist(rows, schema=features.arrow_schema)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as fh:
        pq.write_table(table, fh)
        fh.flush()
        os.fsync(fh.fileno())


def _write_durable(path: Path, text: str) -> None:
    # inside the temporary release folder the rename of the folder is the atomic step;
    # each file only needs to be on disk before it
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())


def _swap_into_place(tmp: Path, out: Path) -> None:
    """Replace ``out`` with ``tmp``: the old release is renamed away first, so at every
    instant ``out`` is either the old release or the new one."""
    trash = None
    if out.exists():
        trash = out.with_name(f".{out.name}.old-{time.time_ns()}")
        out.rename(trash)
    try:
        tmp.rename(out)
    except BaseException:
        if trash is not None:
            trash.rename(out)
        raise
    _fsync_dir(out.parent)
    if trash is not None:
        shutil.rmtree(trash, ignore_errors=True)


def _push(out: Path, repo: str, token: str) -> str:
    try:
        from huggingface_hub import HfApi
    except ImportError as exc:  # pragma: no cover - a dependency of datasets
        raise PipelineError("--push-to-hub needs huggingface_hub (pip install datasets)") from exc
    api = HfApi(token=token)
    # a new repository starts private: a release goes public by a deliberate step
    url = api.create_repo(repo, repo_type="dataset", private=True, exist_ok=True)
    api.upload_folder(
        repo_id=repo,
        folder_path=str(out),
        repo_type="dataset",
        commit_message="prb publish",
    )
    return str(url)


def _load_config(run_dir: Path) -> Config | None:
    from pipeline.config import load_config

    path = RunDir(run_dir).config_path
    if not path.exists():
        return None
    try:
        return load_config(path)
    except PipelineError:
        return None  # an older run.yaml: its figures come from the stage folders anyway


def publish(
    config: Config | None,
    run_dir: str | Path,
    policy: str = "filtered",
    out_dir: str | Path | None = None,
    push_to_hub: str | None = None,
    license: str = DEFAULT_LICENSE,
) -> dict[str, Any]:
    """Build the release of ``run_dir`` under ``out_dir`` (default ``<run>/publish``).

    ``config`` may be None: the run's ``run.yaml`` is read then. Returns a summary with
    the output folder, row counts per config and what was excluded.
    """
    run_dir = Path(run_dir)
    if policy not in POLICIES:
        raise PipelineError(f"unknown policy {policy!r}; choose one of {', '.join(POLICIES)}")
    token = None
    if push_to_hub:
        # checked before any work, so a missing token costs nothing and uploads nothing
        token = os.environ.get("HF_TOKEN")
        if not token:
            raise PipelineError(
                "--push-to-hub needs a Hugging Face token in the environment variable HF_TOKEN "
                "(it is read from there only and never written); nothing was built or uploaded"
            )
    rd = RunDir(run_dir)
    if not run_dir.is_dir():
        raise StageError(f"{run_dir}: no such run directory")
    pairs_dir = rd.stage("pairs")
    if not pairs_dir.done:
        raise StageError(f"{pairs_dir.path}: the pairs stage has not finished; run it first")
    if config is None:
        config = _load_config(run_dir)

    examples = {e["example_id"]: e for e in rd.stage("ingest").rows()}
    rubrics = {r["example_id"]: r for r in rd.stage("rubrics").rows()}
    pairs = list(pairs_dir.rows())
    verdicts = load_verdicts(run_dir)
    agreement = load_agreement(run_dir)
    selected, excluded = select_pairs(pairs, verdicts, policy)
    if not selected:
        raise PipelineError(
            f"no pair passes policy '{policy}' ({len(pairs)} kept by the filters; "
            f"excluded: {dict(excluded) or 'none'}); nothing was published"
        )

    rows = []
    for p in selected:
        ex, rub = examples.get(p["example_id"]), rubrics.get(p["example_id"])
        if ex is None or rub is None:
            missing = "ingest" if ex is None else "rubrics"
            raise StageError(f"pair {p['pair_id']}: example {p['example_id']} not in {missing}")
        if rub.get("rubric_version") != p.get("rubric_version"):
            raise StageError(
                f"pair {p['pair_id']}: rubric version {p.get('rubric_version')} differs from "
                f"the rubrics stage's {rub.get('rubric_version')}; re-run the pipeline"
            )
        rows.append(build_row(p, ex, rub, verdicts.get(p["pair_id"])))
    rows.sort(key=lambda r: (r["category"] or "", r["id"]))
    dup = [k for k, n in Counter(r["id"] for r in rows).items() if n > 1]
    if dup:
        raise StageError(f"ids repeat in the release (one pair per example expected): {dup[:5]}")

    by_config: dict[str, list[dict]] = {"all": rows}
    names: dict[str, str] = {}
    for r in rows:
        name = _config_name(r["category"])
        if name == "all" or names.setdefault(name, r["category"]) != r["category"]:
            raise PipelineError(
                f"category {r['category']!r} gives the config name {name!r}, which is taken"
            )
        by_config.setdefault(name, []).append(r)

    secrets = _secret_values(config)
    for r in rows:
        _check_no_secrets(secrets, f"pair {r['pair_id']}", _json(r).encode())

    summary = _summary(run_dir, config, policy, license, rows, by_config, excluded, agreement)
    out = Path(out_dir) if out_dir is not None else run_dir / "publish"
    out.parent.mkdir(parents=True, exist_ok=True)
    # not mkdtemp: its folder is private (0700), and a release is meant to be shared
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}-{time.time_ns()}"
    tmp.mkdir()
    try:
        features = release_features()
        for name, part in by_config.items():
            _write_parquet(tmp / name / DATA_FILE, part, features)
        _write_durable(tmp / "README.md", render_card(summary))
        _write_durable(
            tmp / "release.json", json.dumps(summary, indent=2, sort_keys=True, ensure_ascii=False)
        )
        for f in sorted(tmp.rglob("*")):
            if f.is_file():
                _check_no_secrets(secrets, f"release file {f.relative_to(tmp)}", f.read_bytes())
        _swap_into_place(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise

    result = {
        "out": str(out),
        "policy": policy,
        "rows": len(rows),
        "configs": summary["configs"],
        "excluded": dict(excluded),
        "pushed": None,
    }
    if push_to_hub:
        assert token is not None
        result["pushed"] = _push(out, push_to_hub, token)
    return result


def _templates(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every distinct prompt template the published rows came from."""
    seen: dict[tuple, dict[str, Any]] = {}
    for r in rows:
        t = json.loads(r["template_hashes"])
        for info in [t.get("chosen"), t.get("rejected"), *(t.get("judge") or {}).values()]:
            if info and info.get("template"):
                key = (info["template"], info.get("template_version"), info.get("template_hash"))
                seen[key] = info
    return [seen[k] for k in sorted(seen, key=str)]


def _summary(
    run_dir: Path,
    config: Config | None,
    policy: str,
    license: str,
    rows: list[dict[str, Any]],
    by_config: dict[str, list[dict]],
    excluded: Counter,
    agreement: dict[str, Any],
) -> dict[str, Any]:
    """Every figure the card reports, also written to release.json."""
    rd = RunDir(run_dir)
    stats = _read_optional_json(rd.stage("pairs").path / "stats.json") or {}
    funnel = {
        k: stats.get(k)
        for k in ("examples", "kept", "dropped", "dropped_by_reason", "kept_by_strategy")
        if k in stats
    }
    pairs_meta = rd.stage("pairs").meta or {}
    env = _read_optional_json(run_dir / "environment.json") or {}
    per_cat: dict[str, dict[str, int]] = {}
    for r in rows:
        c = per_cat.setdefault(str(r["category"]), {"pairs": 0, "verified": 0})
        c["pairs"] += 1
        c["verified"] += r["human_verdict"] == "verified"
    status = Counter(r["human_verdict"] for r in rows)

    def distinct(key: str) -> list[str]:
        return sorted({str(r[key]) for r in rows if r[key] is not None})

    def distinct_json(key: str, side: str) -> list[Any]:
        seen = {_json(json.loads(r[key])[side]) for r in rows}
        return [json.loads(x) for x in sorted(seen)]

    run_name = config.run.name if config is not None else run_dir.name
    return {
        "pretty_name": f"Personalized RewardBench pairs ({run_name})",
        "license": license,
        "policy": policy,
        "rows": len(rows),
        "configs": {name: len(part) for name, part in by_config.items()},
        "excluded": dict(excluded),
        "funnel": funnel,
        "per_category": per_cat,
        "human": {
            "annotated": sum(n for s, n in status.items() if s is not None),
            "verified": status.get("verified", 0),
            "unresolved": status.get("unresolved", 0),
        },
        "agreement": agreement,
        "provenance": {
            "generator_models": distinct("generator_model"),
            "judge_models": distinct("judge_model"),
            "run_seed": config.run.seed if config is not None else None,
            "generator_sampling": distinct_json("sampling", "chosen"),
            "judge_sampling": distinct_json("sampling", "judge"),
            "templates": _templates(rows),
            "filters": (pairs_meta.get("settings") or {}).get("pairs"),
            "environment": env,
            "publish_environment": _publish_versions(),
        },
    }


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
