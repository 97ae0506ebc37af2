"""publish: the release of a run as a Hugging Face `datasets` dataset.

One parquet file per config (each category, plus ``all``) under ``<out>/<config>/``, a
dataset card ``README.md`` whose YAML header lists the configs (each naming its data
file's sha256, so ``datasets`` never serves one release's cached rows for another's: see
``card_configs``), and ``release.json`` with the card's figures in machine-readable form.
The reference benchmark's eight columns come first, in its names and types, so its
evaluation code loads the release unchanged; our provenance columns follow.

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
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline import fields
from pipeline.errors import InputError, PipelineError, StageError
from pipeline.fields import DIMENSIONS, show
from pipeline.io import _fsync_dir, file_digest, read_json, read_jsonl
from pipeline.rundir import RunDir

if TYPE_CHECKING:
    from datasets import Features

    from pipeline.config import Config

POLICIES = ("verified", "filtered")
STATUSES = ("verified", "refuted", "unresolved")
# The reference's eight columns, and those that describe the user's hidden expectations
# (a reward model that sees them is told the answer, so the card says so in bold): one
# definition, in pipeline.fields.
REFERENCE_COLUMNS = fields.REFERENCE_COLUMNS
PRIVILEGED_COLUMNS = fields.PRIVILEGED_COLUMNS
DATA_FILE = "test-00000-of-00001.parquet"
DEFAULT_LICENSE = "cc-by-4.0"
# The reference release's subsets (its Hub configs, QiyaoMa/Personalized-RewardBench, and
# the --subset choices of its evaluation scripts): our category configs carry these names
# when the input's categories are LaMP-QA's.
REFERENCE_SUBSETS = (
    "Art_and_Entertainment",
    "Lifestyle_and_Personal_Development",
    "Society_and_Culture",
)


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
            float(v["accuracy"])
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
    kept: list[dict[str, Any]] = []
    excluded: Counter[str] = Counter()
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
    """Environment variable name -> value for everything that may hold a credential
    (the one rule of ``pipeline.redact``)."""
    from pipeline.redact import secret_values

    if config is None:
        return secret_values()
    return secret_values([config.backend.api_key_env, config.annotation.token_env])


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


# The card's prose lives in a template file beside the package code (shipped in the wheel).
CARD_TEMPLATE = Path(__file__).resolve().parent / "templates" / "dataset_card.md.j2"


def data_file_digests(folder: Path, configs: Iterable[str]) -> dict[str, dict[str, Any]]:
    """Per config: its data file's path in the release, sha256 and size in bytes."""
    out = {}
    for name in configs:
        path = f"{name}/{DATA_FILE}"
        digest, size, _ = file_digest(folder / path)
        out[name] = {"path": path, "sha256": digest, "bytes": size}
    return out


def card_configs(configs: dict[str, int], data_files: dict[str, dict[str, Any]]) -> list[dict]:
    """The card's YAML ``configs``: one per config, ``all`` the default.

    Each config's ``description`` names its data file's sha256, and that is what keeps one
    release's rows from being served for another's. ``datasets`` caches a local folder
    under ``<cache>/<folder name>/<config>/0.0.0/<hash>``, and for a folder whose card lists
    ``configs`` that hash covers the card's ``dataset_info`` and the configs as written
    (names, relative file patterns, builder parameters), not the files' paths, sizes or
    dates: two releases in folders of one name, or one folder published again, would
    share a cache entry. ``description`` is a builder parameter, so the digest enters the
    hash, and every load names the content it wants without passing anything more.
    """
    return [
        {
            "config_name": name,
            "data_files": [{"split": "test", "path": data_files[name]["path"]}],
            "description": f"{n} pairs; data file sha256 {data_files[name]['sha256']}",
            **({"default": True} if name == "all" else {}),
        }
        for name, n in configs.items()
    ]


def render_card(summary: dict[str, Any]) -> str:
    """README.md with the YAML header the Hub reads (configs, license, sizes)."""
    import yaml

    configs = card_configs(summary["configs"], summary["data_files"])
    header = {
        "license": summary["license"],
        "pretty_name": summary["pretty_name"],
        "language": ["en"],
        "task_categories": ["text-classification", "question-answering"],
        "size_categories": [_size_category(summary["rows"])],
        "tags": ["reward-modeling", "personalization", "preference", "rlhf"],
        "configs": configs,
    }
    import jinja2

    env = jinja2.Environment(
        undefined=jinja2.StrictUndefined, keep_trailing_newline=True, autoescape=False
    )
    template = env.from_string(CARD_TEMPLATE.read_text(encoding="utf-8"))
    prov = summary["provenance"]
    categories = [name for name in summary["configs"] if name != "all"]
    present = [name for name in REFERENCE_SUBSETS if name in categories]
    return template.render(
        header=yaml.safe_dump(header, sort_keys=False, allow_unicode=True).rstrip(),
        s=summary,
        reference_subsets=REFERENCE_SUBSETS,
        example_subset=(present or categories or ["all"])[0],
        missing_subsets=[name for name in REFERENCE_SUBSETS if name not in categories],
        other_configs=[name for name in categories if name not in REFERENCE_SUBSETS],
        p=prov,
        funnel=summary.get("funnel") or {},
        filter_rows=_filter_rows(prov.get("filters")),
        version_rows=_version_rows(prov.get("environment"), prov.get("publish_environment")),
        fmt=show,
        cell=_cell,
        code=_code,
        json=_json,
    )


def _cell(x: Any) -> str:
    """A value as one Markdown table cell: a pipe or a line break would split the row."""
    return show(x).replace("|", "\\|").replace("\n", " ")


def _code(text: str) -> str:
    """Inline code that survives backticks inside the text."""
    return f"`` {text} ``" if "`" in text else f"`{text}`"


def _filter_rows(settings: Any) -> list[tuple[str, str]]:
    """The pair stage's settings as (name, value) table rows; pattern lists by their count
    (release.json has them in full)."""
    if not isinstance(settings, dict):
        return []
    rows = []
    for name, value in settings.items():
        if isinstance(value, list) and name.endswith("_patterns"):
            shown = f"{len(value)} regular expressions (in release.json)"
        elif isinstance(value, list):
            shown = ", ".join(_code(str(v)) for v in value) or "none"
        elif isinstance(value, dict):
            shown = _code(_json(value))
        elif isinstance(value, float):
            shown = f"{value:g}"
        else:
            shown = _cell(value)
        rows.append((name, shown))
    return rows


def _version_rows(run: Any, publish: Any) -> list[tuple[str, Any, Any]]:
    """(library, version in the run, version at publish), the run's order first; names
    compared as pip does (huggingface_hub is huggingface-hub)."""

    def canon(d: Any) -> dict[str, Any]:
        d = d if isinstance(d, dict) else {}
        keep = ("vllm_verified_with",)  # not a package name
        return {k if k in keep else k.lower().replace("_", "-"): v for k, v in d.items()}

    run, publish = canon(run), canon(publish)
    names = list(run) + [k for k in publish if k not in run]
    return [
        (k, _json(run[k]) if isinstance(run.get(k), dict | list) else run.get(k), publish.get(k))
        for k in names
    ]


def _hand_written(config: Config | None, models: list[str]) -> str | None:
    """Why the card must say its pairs come from hand-written sample data, or None."""
    reasons = []
    named = [m for m in models if "hand-written" in m.lower()]
    if named:
        reasons.append(
            "every answer and judge verdict was written by hand and replayed under the model "
            f"name `{named[0]}`, so no model produced them"
        )
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
    from pipeline.redact import redact

    api = HfApi(token=token)
    try:
        # a new repository starts private: a release goes public by a deliberate step
        url = api.create_repo(repo, repo_type="dataset", private=True, exist_ok=True)
        api.upload_folder(
            repo_id=repo,
            folder_path=str(out),
            repo_type="dataset",
            commit_message="prb publish",
        )
    except Exception as exc:  # requests/httpx connection errors, HfHubHTTPError, bad repo id
        first = (str(exc).strip().splitlines() or [""])[0][:200]
        reason = redact(f"{type(exc).__name__}: {first}" if first else type(exc).__name__)
        raise PipelineError(
            f"--push-to-hub {repo}: upload failed ({reason}); check the network connection to "
            f"{api.endpoint}, that the repo id is owner/name and that HF_TOKEN may write to it; "
            f"the release itself is complete in {out}, run the same command to retry the upload"
        ) from None
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
        summary["data_files"] = data_file_digests(tmp, by_config)
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
    models = distinct("generator_model") + distinct("judge_model")
    return {
        "pretty_name": f"Personalized RewardBench pairs ({run_name})",
        "hand_written": _hand_written(config, models),
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
