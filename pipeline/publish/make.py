"""``publish()``: a run's kept pairs, selected by policy, written as a release.

Reads the run's pair stage through its verified accessor (a damaged or unfinished stage is
refused, never published in part), asks the annotate package for the human verdicts,
builds the rows from the release table (:mod:`pipeline.release`), and writes the folder
(:mod:`pipeline.publish.folder`): one parquet file per config, the card, release.json and
the marker with its manifest.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.annotate.rounds import agreement_summaries, latest_verdicts, why_unverified
from pipeline.core.errors import PipelineError, RunDirError, StageError
from pipeline.core.io import loads
from pipeline.core.redact import secret_values
from pipeline.publish import folder, targets, validity
from pipeline.publish.card import DATA_FILE, config_name, data_file_digests, render_card
from pipeline.publish.recorded import check_current
from pipeline.publish.select import check_policy, select_pairs
from pipeline.publish.summary import Tally, release_summary
from pipeline.release.columns import BY_NAME, build_row, features, json_text
from pipeline.run import RunDir, StageDir
from pipeline.run.layout import RELEASE_ALL, RELEASE_SUMMARY

if TYPE_CHECKING:
    from pipeline.config import Config

DEFAULT_LICENSE = "cc-by-4.0"
# what orders the release: a row's id and category, made as its columns make them
ID_COLUMN, CATEGORY_COLUMN = BY_NAME["id"], BY_NAME["category"]


# ---- secrets --------------------------------------------------------------------------


def _secret_values(config: Config | None) -> dict[str, str]:
    """Environment variable name -> value for everything that may hold a credential
    (the one rule of ``pipeline.core.redact``)."""
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


def _digest(raw: bytes) -> bytes:
    return hashlib.blake2b(raw, digest_size=16).digest()


def _write_tables(
    tmp: Path,
    rd: RunDir,
    shards: list[Path],
    selected: list[dict[str, Any]],
    verdicts: dict[str, dict[str, Any]],
    secrets: dict[str, str],
) -> Tally:
    """Each selected pair read again, in the release's order, made a release row and checked
    for secrets; the rows gathered as Arrow columns, then written as ``all`` and, each
    config being one category whose rows the order keeps together, as a slice of it per
    config. Returns the figures' tally. The files are the ones the whole table of rows
    gives (``pa.Table.from_pylist`` of every row, written at once): a parquet file is
    written as one row group from single-chunk columns, and a slice of those writes the
    bytes its own table would."""
    every = _Columns(features().arrow_schema)
    tally = Tally()
    parts: dict[str, int] = {}  # config -> its rows, in the release's order
    for e in selected:
        name = config_name(e["category"])
        parts[name] = parts.get(name, 0) + 1
        shard, line, start, length, digest = e["at"]
        raw = StageDir.line_at(shards[shard], start, length)
        if _digest(raw) != digest:
            raise RunDirError(
                f"{shards[shard]}, line {line}: changed while it was being published; "
                "nothing was published. Publish again once the run is not being changed",
                path=shards[shard],
                line=line,
            )
        rec = loads(raw)
        row = build_row(rec, verdicts.get(rec["pair_id"]))
        _check_no_secrets(secrets, f"pair {row['pair_id']}", json_text(row).encode())
        tally.add(rec, row)
        every.add(row)
    table = every.table()
    folder.write_table(tmp / RELEASE_ALL / DATA_FILE, table)
    offset = 0
    for name, n in parts.items():
        folder.write_table(tmp / name / DATA_FILE, table.slice(offset, n))
        offset += n
    return tally


class _Columns:
    """Release rows gathered as Arrow columns, a batch at a time: about 10 KB a pair where
    the Python rows took about 60 KB. ``table`` gives them as one table of single-chunk
    columns, joined column by column (each column's chunks let go once joined, so the
    most held at once is the table and one column's copy)."""

    BATCH = 1024

    def __init__(self, schema: Any) -> None:
        self.schema = schema
        self.chunks: list[list[Any]] = [[] for _ in schema]
        self.pending: list[dict[str, Any]] = []

    def add(self, row: dict[str, Any]) -> None:
        self.pending.append(row)
        if len(self.pending) >= self.BATCH:
            self._flush()

    def _flush(self) -> None:
        import pyarrow as pa

        if self.pending:
            batch = pa.RecordBatch.from_pylist(self.pending, schema=self.schema)
            for j, chunks in enumerate(self.chunks):
                chunks.append(batch.column(j))
            self.pending = []

    def table(self) -> Any:
        import pyarrow as pa

        self._flush()
        arrays = []
        for j, chunks in enumerate(self.chunks):
            arrays.append(pa.concat_arrays(chunks))
            self.chunks[j] = []
        return pa.Table.from_arrays(arrays, schema=self.schema)


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

    # Two passes, so no pair is held whole (they took about 60 KB each: 2.3 GB at 34,652
    # pairs): the first keeps where each kept pair is and what orders it; the second reads
    # them again in the release's order, one at a time, into Arrow columns.
    shards: list[Path] = []
    entries = []
    for path, line, start, raw, rec in rd.located_pair_records():
        if not shards or shards[-1] != path:
            shards.append(path)
        entries.append(
            {
                "pair_id": rec["pair_id"],
                "id": ID_COLUMN.build(rec, {}),
                "category": CATEGORY_COLUMN.build(rec, {}),
                "at": (len(shards) - 1, line, start, len(raw), _digest(raw)),
            }
        )
    # pairs built from stages the run has since re-done (or is re-doing) are not published
    check_current(rd.stage("pairs").path, rd, None, stale_ok=False, overridable=False)
    verdicts = latest_verdicts(rd)
    agreement = agreement_summaries(rd)
    selected, excluded = select_pairs(entries, verdicts, policy)
    if not selected:
        why = ""
        if policy == "verified":
            kept_ids = {e["pair_id"] for e in entries}
            mine = {k: v for k, v in verdicts.items() if k in kept_ids}
            why = why_unverified(rd, mine, len(kept_ids))
            why = (f": {why}" if why else "") + (
                "; `--policy filtered` publishes every kept pair no annotator refuted"
            )
        raise PipelineError(
            f"no pair passes policy '{policy}' ({len(entries)} kept by the filters; "
            f"excluded: {dict(excluded) or 'none'}); nothing was published" + why
        )
    del entries
    selected.sort(key=lambda e: (e["category"] or "", e["id"]))
    dup = [k for k, n in Counter(e["id"] for e in selected).items() if n > 1]
    if dup:
        raise StageError(f"ids repeat in the release (one pair per example expected): {dup[:5]}")

    configs: dict[str, int] = {RELEASE_ALL: len(selected)}
    names: dict[str, str] = {}
    for e in selected:
        name = config_name(e["category"])
        if name == RELEASE_ALL or names.setdefault(name, e["category"]) != e["category"]:
            raise PipelineError(
                f"category {e['category']!r} gives the config name {name!r}, which is taken"
            )
        configs[name] = configs.get(name, 0) + 1
    # what a person added to an earlier release here, checked before any work
    new_files = {f"{name}/{DATA_FILE}" for name in configs}
    new_files |= {"README.md", RELEASE_SUMMARY}
    kept = folder.strangers(out, new_files)

    secrets = _secret_values(config)
    tmp = folder.temporary_beside(out)
    try:
        tally = _write_tables(tmp, rd, shards, selected, verdicts, secrets)
        summary = release_summary(rd, config, policy, license, tally, configs, excluded,
                                  agreement)  # fmt: skip
        summary["data_files"] = data_file_digests(tmp, configs)
        summary["validity"] = validity.claims(
            tmp,
            eval_root=rd.eval_dir,
            report_dir=rd.report_dir,
            agreement_files=[(rnd.name, rnd.agreement) for rnd in rd.rounds()],
            recorded_agreement=agreement,
            shown_as=str(out) if out_dir is not None else rd.shown,
            run_as=rd.shown,
        )
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
        "rows": len(selected),
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
