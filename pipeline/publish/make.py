"""``publish()``: a run's kept pairs, selected by policy, written as a release.

Reads the run's pair stage through its verified accessor (a damaged or unfinished stage is
refused, never published in part), asks the annotate package for the human verdicts,
builds the rows from the release table (:mod:`pipeline.release`), and writes the folder
(:mod:`pipeline.publish.folder`): one parquet file per config, the card, release.json and
the marker with its manifest.
"""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.annotate.rounds import agreement_summaries, latest_verdicts
from pipeline.errors import PipelineError, StageError
from pipeline.publish import folder, targets
from pipeline.publish.card import DATA_FILE, config_name, data_file_digests, render_card
from pipeline.publish.select import check_policy, select_pairs
from pipeline.publish.summary import release_summary
from pipeline.release.columns import build_row, features, json_text
from pipeline.release.recorded import check_current
from pipeline.run import RunDir
from pipeline.run.layout import RELEASE_ALL, RELEASE_SUMMARY

if TYPE_CHECKING:
    from pipeline.config import Config

DEFAULT_LICENSE = "cc-by-4.0"


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


# ---- the release ----------------------------------------------------------------------


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

    ``config`` may be None: the run's ``run.yaml`` is read then. Returns a summary with the
    output folder, row counts per config and what was excluded.
    """
    check_policy(policy)
    rd = RunDir(run_dir)
    if not rd.path.is_dir():
        raise StageError(f"{rd.path}: no such run directory")
    out = Path(out_dir) if out_dir is not None else rd.release_dir
    note = folder.check_out_dir(out, rd, default=out_dir is None, force=force)
    token = targets.hub_token() if push_to_hub else None
    if config is None:
        config = rd.try_config()

    records = list(rd.pair_records())
    # pairs built from stages the run has since re-done (or is re-doing) are not published
    check_current(rd.stage("pairs").path, rd, None, stale_ok=False, overridable=False)
    verdicts = latest_verdicts(rd)
    agreement = agreement_summaries(rd)
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
        name = config_name(r["category"])
        if name == RELEASE_ALL or names.setdefault(name, r["category"]) != r["category"]:
            raise PipelineError(
                f"category {r['category']!r} gives the config name {name!r}, which is taken"
            )
        by_config.setdefault(name, []).append(r)
    # what a person added to an earlier release here, checked before any work
    new_files = {f"{name}/{DATA_FILE}" for name in by_config}
    new_files |= {"README.md", RELEASE_SUMMARY}
    kept = folder.strangers(out, new_files)

    secrets = _secret_values(config)
    for r in rows:
        _check_no_secrets(secrets, f"pair {r['pair_id']}", json_text(r).encode())

    summary = release_summary(rd, config, policy, license, selected, rows, by_config,
                              excluded, agreement)  # fmt: skip
    tmp = folder.temporary_beside(out)
    try:
        table = features()
        for name, part in by_config.items():
            folder.write_parquet(tmp / name / DATA_FILE, part, table)
        summary["data_files"] = data_file_digests(tmp, by_config)
        folder.write_durable(tmp / "README.md", render_card(summary))
        folder.write_durable(
            tmp / RELEASE_SUMMARY,
            json.dumps(summary, indent=2, sort_keys=True, ensure_ascii=False),
        )
        for f in sorted(tmp.rglob("*")):
            if f.is_file():
                _check_no_secrets(secrets, f"release file {f.relative_to(tmp)}", f.read_bytes())
        folder.write_marker(tmp, {"written_by": "prb publish", "run": rd.shown, "policy": policy})
        folder.carry(out, tmp, kept)
        folder.swap_into_place(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise

    result = {
        "out": str(out),
        "policy": policy,
        "rows": len(rows),
        "configs": summary["configs"],
        "excluded": dict(excluded),
        "kept_files": kept,
        "pushed": None,
        "note": note,
    }
    if push_to_hub:
        assert token is not None
        result["pushed"] = targets.push_to_hub(out, push_to_hub, token)
    return result
