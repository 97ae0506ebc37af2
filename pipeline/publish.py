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
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline import fields
from pipeline.backends.identity import describe
from pipeline.errors import InputError, PipelineError, StageError
from pipeline.fields import DIMENSIONS, ORDERS, quality_scores, show
from pipeline.io import _fsync_dir, file_digest, read_json
from pipeline.rules.verdicts import prefers
from pipeline.run import RunDir
from pipeline.run.layout import RELEASE_ALL, RELEASE_MARKER, RELEASE_SUMMARY

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
    orders = dict.fromkeys(ORDERS, s)
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
            "finish_reasons": {"chosen": s, "rejected": s},  # "length": cut at max_tokens
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


def load_verdicts(rd: RunDir) -> dict[str, dict[str, Any]]:
    """Latest human verdict per pair_id over all annotation rounds (a later round wins)."""
    latest: dict[str, dict[str, Any]] = {}
    for rnd in rd.rounds():
        path = rnd.verdicts
        if not path.exists():
            continue
        for line, row in _jsonl_rows(path):
            if not row.get("pair_id"):
                raise InputError("verdict row without a pair_id", path=path, line=line)
            if row.get("status") not in STATUSES:
                raise InputError(
                    f"status must be one of {', '.join(STATUSES)}, got {row.get('status')!r}",
                    path=path,
                    line=line,
                    field="status",
                )
            latest[row["pair_id"]] = {**row, "round": rnd.number}
    return latest


def _jsonl_rows(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) of a JSONL file the project wrote; damage is one error."""
    with open(path, "rb") as fh:
        for line, raw in enumerate(fh, start=1):
            if not raw.strip():
                continue
            try:
                row = json.loads(raw)
            except ValueError:  # UnicodeDecodeError is a ValueError
                raise InputError(
                    "not valid JSON; run `prb annotate import` for this round again",
                    path=path,
                    line=line,
                ) from None
            if not isinstance(row, dict):
                raise InputError("a row must be a JSON object", path=path, line=line)
            yield line, row


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


def load_agreement(rd: RunDir) -> dict[str, dict[str, Any]]:
    """Round name -> summary figures from each round's agreement.json."""
    out = {}
    for rnd in rd.rounds():
        path = rnd.agreement
        if path.exists():
            try:
                raw = read_json(path)
            except ValueError as exc:
                raise InputError(f"not valid JSON: {exc}", path=path) from None
            out[rnd.name] = _agreement_summary(raw if isinstance(raw, dict) else {})
    return out


# ---- one release row ------------------------------------------------------------------


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _template_info(p: dict | None) -> dict[str, Any] | None:
    if not p:
        return None
    return {k: p.get(k) for k in ("template", "template_version", "template_hash")}


def _json(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, ensure_ascii=False)


def credited(prov: dict[str, Any]) -> str | None:
    """What to credit with an answer or verdict: the model name, unless what served it was
    no model (the stand-in, hand-written answers): then that, never the name it was asked
    under."""
    served = prov.get("served_by") or {}
    if isinstance(served, dict) and served.get("model_output") is False:
        who = served.get("responder") or served.get("kind") or "stand-in"
        return f"not a model: {who} answers (requested as {prov.get('model')})"
    return prov.get("model")


def generator_model(record: dict[str, Any]) -> str | None:
    """What wrote the pair's answers, as the release names it."""
    gen = (record.get("provenance") or {}).get("generator") or {}
    ch, rj = credited(gen.get("chosen") or {}), credited(gen.get("rejected") or {})
    return ch if ch == rj else f"{ch} (chosen), {rj} (rejected)"


def sampling_of(record: dict[str, Any]) -> dict[str, Any]:
    """Generator sampling per side, judge sampling and seed (the release's `sampling`)."""
    prov = record.get("provenance") or {}
    gen = prov.get("generator") or {}
    g_ch, g_rj = gen.get("chosen") or {}, gen.get("rejected") or {}
    judge = prov.get("judge") or {}
    return {
        "chosen": {**(g_ch.get("sampling") or {}), "n": g_ch.get("n")},
        "rejected": {**(g_rj.get("sampling") or {}), "n": g_rj.get("n")},
        "judge": {**(judge.get("sampling") or {}), "seed": judge.get("seed")},
    }


def templates_of(record: dict[str, Any]) -> dict[str, Any]:
    """Template name, version and sha256 per side and per judge template."""
    prov = record.get("provenance") or {}
    gen = prov.get("generator") or {}
    judge = prov.get("judge") or {}
    return {
        "chosen": _template_info(gen.get("chosen")),
        "rejected": _template_info(gen.get("rejected")),
        "judge": {k: _template_info(v) for k, v in (judge.get("templates") or {}).items()},
    }


def build_row(record: dict[str, Any], verdict: dict[str, Any] | None) -> dict[str, Any]:
    """The release row of one pair record (pipeline/records.py)."""
    gen = (record.get("provenance") or {}).get("generator") or {}
    g_ch, g_rj = gen.get("chosen") or {}, gen.get("rejected") or {}
    judge_prov = (record.get("provenance") or {}).get("judge") or {}
    judge = record.get("judge") or {}
    cov = judge.get("coverage") or {}
    cov_c, cov_r = cov.get("chosen") or {}, cov.get("rejected") or {}
    violated = list(record.get("violated_item_ids") or [])
    rubric = record.get("rubric") or {}
    items = rubric.get("items") or []
    pairwise = judge.get("pairwise") or {}
    verdict = verdict or {}
    return {
        "id": str(record.get("source_id") or record["example_id"]),
        "question": record["question"],
        "profile": [
            {"id": p.get("id"), "category": p.get("category"), "text": p.get("text")}
            for p in record.get("profile") or []
        ],
        "rubric_aspects": [
            {"aspect": it.get("aspect"), "evidence": it.get("evidence"), "reason": it.get("reason")}
            for it in items
        ],
        "narrative": record.get("narrative"),
        "category": record.get("category"),
        "chosen": record["chosen"],
        "rejected": record["rejected"],
        "pair_id": record["pair_id"],
        "example_id": record["example_id"],
        "user_id": record.get("user_id"),
        "rubric_version": record.get("rubric_version"),
        "rubric_source": rubric.get("source"),
        "rubric_item_ids": [it.get("item_id") for it in items],
        "strategy": record.get("strategy"),
        "violated_item_ids": violated,
        "finish_reasons": {
            side: (record.get("finish_reasons") or {}).get(side) for side in ("chosen", "rejected")
        },
        "generator_model": generator_model(record),
        "judge_model": credited(judge_prov),
        "sampling": _json(sampling_of(record)),
        "seeds": {"chosen": g_ch.get("seed"), "rejected": g_rj.get("seed")},
        "template_hashes": _json(templates_of(record)),
        "margin": record.get("margin"),
        "similarity": record.get("similarity"),
        "quality_chosen": quality_scores((judge.get("quality") or {}).get("chosen")),
        "quality_rejected": quality_scores((judge.get("quality") or {}).get("rejected")),
        "coverage_chosen_mean": _mean(list(cov_c.values())),
        "coverage_rejected_mean": _mean(list(cov_r.values())),
        "coverage_rejected_violated_mean": _mean([cov_r[i] for i in violated if i in cov_r]),
        "pairwise_aware": prefers(pairwise, "pairwise_aware"),
        "pairwise_blind": prefers(pairwise, "pairwise_blind"),
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
    return secret_values([*config.backend.secret_env_names(), config.annotation.token_env])


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


def _is_release(path: Path) -> bool:
    """Whether ``path`` is a folder `prb publish` wrote: it holds the release marker (or,
    from versions before the marker, a release.json of ours beside an ``all`` config)."""
    if (path / RELEASE_MARKER).is_file():
        return True
    summary = path / RELEASE_SUMMARY
    if summary.is_file() and (path / RELEASE_ALL).is_dir():
        try:
            raw = read_json(summary)
        except (OSError, ValueError):
            return False
        return isinstance(raw, dict) and {"policy", "configs", "provenance"} <= raw.keys()
    return False


def check_out_dir(out: Path, rd: RunDir, *, default: bool, force: bool) -> str | None:
    """Refuse, before any work, an output folder that is not ours to replace: a file, a
    folder `prb publish` did not write, the run directory or anything inside it but its own
    release folder, or a folder holding the run. Returns a note when an existing release
    will be replaced. ``default``: ``out`` is the run's own release folder."""
    full = Path(os.path.abspath(out))
    run = Path(os.path.abspath(rd.path))
    flag = "--out"
    if not default:
        if full == run or run.is_relative_to(full):
            raise InputError(
                f"holds the run directory {run}; publishing there would replace the run. "
                "Choose a folder outside the run (or leave --out out: <run>/publish)",
                path=out,
                field=flag,
            )
        if full.is_relative_to(run) and full != Path(os.path.abspath(rd.release_dir)):
            raise InputError(
                f"is inside the run directory {run}, which only the pipeline writes; choose a "
                "folder outside the run (or leave --out out: <run>/publish)",
                path=out,
                field=flag,
            )
    if full.exists() or full.is_symlink():
        if not full.is_dir() or full.is_symlink():
            raise InputError(
                "is a file (or a link), not a release folder; choose a new folder for the "
                "release, nothing was written",
                path=out,
                field=flag,
            )
        if not any(full.iterdir()):
            return None  # an empty folder: taken as it is
        if not _is_release(full):
            raise InputError(
                "exists and was not written by `prb publish` (no release marker in it); "
                "nothing was written or deleted. Choose a new or empty folder for the release",
                path=out,
                field=flag,
            )
        if not default and not force:
            raise InputError(
                "holds an earlier release; pass --force to replace it (nothing else is "
                "deleted), or choose another folder",
                path=out,
                field=flag,
            )
        return f"replaced the earlier release in {full}"
    return None


def _swap_into_place(tmp: Path, out: Path) -> None:
    """Replace ``out`` with ``tmp``: the old release (checked to be one, see
    :func:`check_out_dir`) is renamed away first, so at every instant ``out`` is either the
    old release or the new one, and only then removed."""
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


def publish(
    config: Config | None,
    run_dir: str | Path,
    policy: str = "filtered",
    out_dir: str | Path | None = None,
    push_to_hub: str | None = None,
    license: str = DEFAULT_LICENSE,
    force: bool = False,
) -> dict[str, Any]:
    """Build the release of ``run_dir`` under ``out_dir`` (default ``<run>/publish``).

    ``config`` may be None: the run's ``run.yaml`` is read then. The pair stage is read
    through the run's verified accessor: a damaged or unfinished stage is refused, never
    published in part. Returns a summary with the output folder, row counts per config and
    what was excluded.
    """
    if policy not in POLICIES:
        raise PipelineError(f"unknown policy {policy!r}; choose one of {', '.join(POLICIES)}")
    rd = RunDir(run_dir)
    if not rd.path.is_dir():
        raise StageError(f"{rd.path}: no such run directory")
    out = Path(out_dir) if out_dir is not None else rd.release_dir
    note = check_out_dir(out, rd, default=out_dir is None, force=force)
    token = None
    if push_to_hub:
        # checked before any work, so a missing token costs nothing and uploads nothing
        token = os.environ.get("HF_TOKEN")
        if not token:
            raise PipelineError(
                "--push-to-hub needs a Hugging Face token in the environment variable HF_TOKEN "
                "(it is read from there only and never written); nothing was built or uploaded"
            )
    if config is None:
        config = rd.try_config()

    records = list(rd.pair_records())
    verdicts = load_verdicts(rd)
    agreement = load_agreement(rd)
    selected, excluded = select_pairs(records, verdicts, policy)
    if not selected:
        raise PipelineError(
            f"no pair passes policy '{policy}' ({len(records)} kept by the filters; "
            f"excluded: {dict(excluded) or 'none'}); nothing was published"
        )
    rows = [build_row(r, verdicts.get(r["pair_id"])) for r in selected]
    order = sorted(range(len(rows)), key=lambda i: (rows[i]["category"] or "", rows[i]["id"]))
    rows = [rows[i] for i in order]
    selected = [selected[i] for i in order]
    dup = [k for k, n in Counter(r["id"] for r in rows).items() if n > 1]
    if dup:
        raise StageError(f"ids repeat in the release (one pair per example expected): {dup[:5]}")

    by_config: dict[str, list[dict]] = {RELEASE_ALL: rows}
    names: dict[str, str] = {}
    for r in rows:
        name = _config_name(r["category"])
        if name == RELEASE_ALL or names.setdefault(name, r["category"]) != r["category"]:
            raise PipelineError(
                f"category {r['category']!r} gives the config name {name!r}, which is taken"
            )
        by_config.setdefault(name, []).append(r)

    secrets = _secret_values(config)
    for r in rows:
        _check_no_secrets(secrets, f"pair {r['pair_id']}", _json(r).encode())

    summary = _summary(rd, config, policy, license, selected, rows, by_config, excluded,
                       agreement)  # fmt: skip
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
            tmp / RELEASE_SUMMARY,
            json.dumps(summary, indent=2, sort_keys=True, ensure_ascii=False),
        )
        _write_durable(
            tmp / RELEASE_MARKER,
            json.dumps({"written_by": "prb publish", "run": rd.shown, "policy": policy}, indent=2)
            + "\n",
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
        "note": note,
    }
    if push_to_hub:
        assert token is not None
        result["pushed"] = _push(out, push_to_hub, token)
    return result


def _templates(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every distinct prompt template the published pairs came from."""
    seen: dict[tuple, dict[str, Any]] = {}
    for r in records:
        t = templates_of(r)
        for info in [t.get("chosen"), t.get("rejected"), *(t.get("judge") or {}).values()]:
            if info and info.get("template"):
                key = (info["template"], info.get("template_version"), info.get("template_hash"))
                seen[key] = info
    return [seen[k] for k in sorted(seen, key=str)]


def _distinct(values: list[Any]) -> list[Any]:
    """Distinct values in a stable order (by their JSON text)."""
    seen = {_json(v): v for v in values}
    return [seen[k] for k in sorted(seen)]


def _summary(
    rd: RunDir,
    config: Config | None,
    policy: str,
    license: str,
    records: list[dict[str, Any]],
    rows: list[dict[str, Any]],
    by_config: dict[str, list[dict]],
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
    env = rd.environment()
    per_cat: dict[str, dict[str, int]] = {}
    for r in rows:
        c = per_cat.setdefault(str(r["category"]), {"pairs": 0, "verified": 0})
        c["pairs"] += 1
        c["verified"] += r["human_verdict"] == "verified"
    status = Counter(r["human_verdict"] for r in rows)

    def distinct(key: str) -> list[str]:
        return sorted({str(r[key]) for r in rows if r[key] is not None})

    run_name = config.run.name if config is not None else rd.path.name
    served = _served_by(rd)
    samplings = [sampling_of(r) for r in records]
    return {
        "pretty_name": f"Personalized RewardBench pairs ({run_name})",
        "hand_written": _hand_written(config),
        "not_model_output": _not_model_output(served),
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
        "ledger": card_ledger(rd, config),
        "provenance": {
            "served_by": {k: {**v, "described": describe(v)} for k, v in served.items()},
            "generator_models": distinct("generator_model"),
            "judge_models": distinct("judge_model"),
            "run_seed": config.run.seed if config is not None else None,
            "generator_sampling": _distinct([s["chosen"] for s in samplings]),
            "judge_sampling": _distinct([s["judge"] for s in samplings]),
            "templates": _templates(records),
            "filters": (meta.settings if meta is not None else {}).get("pairs"),
            "environment": env,
            "publish_environment": _publish_versions(),
        },
    }


def card_ledger(rd: RunDir, config: Config | None) -> dict[str, Any]:
    """What building the run took, for the card's ledger section: per LLM stage, what its
    backend answered over the run's life (pipeline/budget.py), with the cost at the run's
    prices when they are set."""
    from pipeline.budget import run_ledger

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
