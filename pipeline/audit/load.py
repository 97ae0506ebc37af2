"""Reading a pairs source for the audit, and checking every field's type.

Sources: a release folder (its ``all`` config), a run directory (its release, or the pair
stage's kept pairs when it has none), a JSONL / JSON / parquet file, or a folder written
by ``datasets``' ``save_to_disk``. Whatever the source, a bad row is one
:class:`~pipeline.core.errors.InputError` naming the file, the line (or row) and the field, so
the CLI prints one line and no traceback.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from pipeline.core.errors import InputError
from pipeline.core.io import path_kind
from pipeline.publish.recorded import check_current, summary_of
from pipeline.publish.validity import release_sha256
from pipeline.release.columns import REQUIRED_COLUMNS, build_row, check_row
from pipeline.rules.dedup import profile_text
from pipeline.run import RunDir, run_of
from pipeline.run.layout import RELEASE_ALL
from pipeline.types.records import RecordProblem


class Where:
    """Where each row came from, for error messages: a file and a line, or a row index."""

    def __init__(self) -> None:
        self.files: list[str] = []
        self._file_of: list[int] = []
        self._pos: list[int] = []
        self._by_line: list[bool] = []

    def add(self, path: Path, pos: int, by_line: bool) -> None:
        if not self.files or self.files[-1] != str(path):
            self.files.append(str(path))
        self._file_of.append(len(self.files) - 1)
        self._pos.append(pos)
        self._by_line.append(by_line)

    def error(self, i: int, message: str, field: str | None = None) -> InputError:
        path = self.files[self._file_of[i]] if self._file_of else None
        if self._by_line and self._by_line[i]:
            return InputError(message, path=path, line=self._pos[i], field=field)
        row = self._pos[i] if self._pos else i
        return InputError(f"row {row}: {message}", path=path, field=field)

    def line(self, i: int) -> int | None:
        return self._pos[i] if self._by_line and self._by_line[i] else None


# The fields the audit reads from a row once its types are checked (the checks, figures
# and probe; ``row_id`` takes the first of id, pair_id and example_id).
AUDIT_FIELDS = (
    "id", "pair_id", "example_id", "question", "chosen", "rejected", "category", "user_id",
    "profile", "rubric_aspects", "finish_reasons", "quality_chosen", "quality_rejected",
    "coverage_chosen_mean", "coverage_rejected_mean", "coverage_rejected_violated_mean",
    "pairwise_aware", "pairwise_blind", "human_verdict", "human_agreement",
)  # fmt: skip


class Compact:
    """Each row's types checked as it is read, then the row cut down to what the audit
    reads: :data:`AUDIT_FIELDS`, the profile as its joined text (one copy per distinct
    profile: a user's questions share it), each rubric aspect as its text. A release row
    held whole took about 49 KB (1.8 GB at 34,652 pairs), most of it the user's 30 posts.
    The first row whose types fail is kept, and :func:`check_types` raises it where it
    always did (after the rules are resolved, before any figure)."""

    def __init__(self) -> None:
        self.n = 0
        self.problem: tuple[int, RecordProblem] | None = None
        self._profiles: dict[str, str] = {}

    def __call__(self, row: dict[str, Any]) -> dict[str, Any]:
        i, self.n = self.n, self.n + 1
        if self.problem is not None:
            return row  # the audit stops at the first bad row: the rest are never read
        try:
            check_row(row)
        except RecordProblem as exc:
            self.problem = (i, exc)
            return row
        out = {k: row[k] for k in AUDIT_FIELDS if k in row}
        if "profile" in out:
            text = profile_text(out["profile"])
            out["profile"] = self._profiles.setdefault(text, text) if text else None
        aspects = out.get("rubric_aspects")
        if isinstance(aspects, list):
            out["rubric_aspects"] = [
                {"aspect": a.get("aspect")} if isinstance(a, Mapping) else a for a in aspects
            ]
        return out


def _keep(row: dict[str, Any], compact: Compact | None) -> dict[str, Any]:
    return compact(row) if compact is not None else row


# ---- reading ------------------------------------------------------------------------------


def _jsonl_objects(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) for each non-blank line; bad bytes or JSON are one error."""
    try:
        fh = open(path, "rb")  # noqa: SIM115 - the generator closes it below
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror}", path=path) from None
    with fh:
        for line_no, raw in enumerate(fh, start=1):
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise InputError(
                    f"not UTF-8 (byte 0x{raw[exc.start]:02x} at column {exc.start + 1}); "
                    "save the file as UTF-8",
                    path=path,
                    line=line_no,
                ) from None
            if not text.strip():
                continue
            row = _parse_json(text, path, line_no)
            if not isinstance(row, dict):
                raise InputError("each line must be a JSON object", path=path, line=line_no)
            yield line_no, row


def _parse_json(text: str, path: Path, line: int | None) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        at = line if line is not None else exc.lineno
        raise InputError(f"not valid JSON: {exc.msg}", path=path, line=at) from None
    except RecursionError:
        raise InputError("JSON nested too deeply", path=path, line=line) from None
    except ValueError as exc:  # e.g. an integer with more digits than Python converts
        raise InputError(f"not valid JSON: {exc}", path=path, line=line) from None


def _check_columns(path: Path, columns: list[str], where: str = "", line: int | None = None):
    """Raise naming the file (and line or row) and the first required column missing."""
    for col in REQUIRED_COLUMNS:
        if col not in columns:
            raise InputError(
                f"{where}missing column '{col}': the reference schema needs "
                f"{', '.join(REQUIRED_COLUMNS)}; found: {', '.join(columns) or 'none'}",
                path=path,
                line=line,
                field=col,
            )


def _from_json(path: Path, where: Where, compact: Compact | None = None) -> list[dict[str, Any]]:
    """JSON lines, or (for a file starting with '[') one array of objects."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(4096).lstrip()
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror}", path=path) from None
    if head.startswith(b"["):
        try:
            text = path.read_bytes().decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InputError(
                f"not UTF-8 (byte offset {exc.start}); save the file as UTF-8", path=path
            ) from None
        data = _parse_json(text, path, None)
        if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
            raise InputError("expected a JSON array of objects", path=path)
        for i, row in enumerate(data):
            _check_columns(path, list(row), where=f"row {i}: ")
            where.add(path, i, by_line=False)
        return data if compact is None else [compact(r) for r in data]
    rows = []
    for line_no, row in _jsonl_objects(path):
        _check_columns(path, list(row), line=line_no)
        where.add(path, line_no, by_line=True)
        rows.append(_keep(row, compact))
    return rows


# rows made Python objects at a time, from a table or a parquet file (not the whole table)
BATCH_ROWS = 1024


def _from_batches(
    path: Path, batches: Iterator[Any], where: Where, compact: Compact | None
) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for batch in batches:
        for row in batch.to_pylist():
            where.add(path, len(rows), by_line=False)
            rows.append(_keep(row, compact))
    return rows


def _from_table(
    path: Path, table: Any, where: Where, compact: Compact | None = None
) -> list[dict[str, Any]]:
    _check_columns(path, list(table.column_names))
    return _from_batches(path, iter(table.to_batches(BATCH_ROWS)), where, compact)


def _from_parquet(path: Path, where: Where, compact: Compact | None = None) -> list[dict[str, Any]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    files = sorted(path.glob("*.parquet")) if path.is_dir() else [path]
    if not files:
        raise InputError("no parquet file here", path=path)
    rows: list[dict[str, Any]] = []
    for f in files:
        try:
            names = pq.read_schema(f).names
            repeated = sorted({n for n in names if names.count(n) > 1})
            if repeated:
                raise InputError(
                    f"the column name '{repeated[0]}' appears {names.count(repeated[0])} "
                    "times; a pairs file needs each column once (rename or drop the copies)",
                    path=f,
                    field=repeated[0],
                )
            _check_columns(f, list(names))
            fh = pq.ParquetFile(f)
            # where each file's rows start: a row's number is its place in its own file
            start = len(rows)
            for batch in fh.iter_batches(BATCH_ROWS):
                for row in batch.to_pylist():
                    where.add(f, len(rows) - start, by_line=False)
                    rows.append(_keep(row, compact))
        except (pa.ArrowException, OSError) as exc:
            # pyarrow's message can run over many lines (a schema dump): its first says why
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise InputError(f"not a readable parquet file: {first}", path=f) from None
    return rows


def _from_disk(path: Path, where: Where, compact: Compact | None = None) -> list[dict[str, Any]]:
    from datasets import DatasetDict, load_from_disk

    try:
        ds = load_from_disk(str(path))
    except Exception as exc:  # datasets raises many kinds for a damaged folder
        raise InputError(f"not a readable save_to_disk folder: {exc}", path=path) from None
    if isinstance(ds, DatasetDict):
        if "test" in ds:
            ds = ds["test"]
        elif len(ds) == 1:
            ds = next(iter(ds.values()))
        else:
            raise InputError(
                f"a DatasetDict with splits {', '.join(ds)} and none named 'test'; "
                "save the split to audit",
                path=path,
            )
    return _from_table(path, ds.data.table, where, compact)


def _from_run(
    rd: RunDir, where: Where, compact: Compact | None = None
) -> tuple[list[dict[str, Any]], str]:
    """A run without a release: its pair stage's kept pairs as release rows (the release
    table's row builder, :mod:`pipeline.release`), read through the run's verified
    accessor (a damaged or unfinished stage is refused)."""
    rows = []
    for path, line, rec in rd.numbered_pair_records():
        where.add(path, line, by_line=True)
        rows.append(_keep(build_row(rec, None), compact))
    note = (
        "this run has no release (publish/): auditing the pair stage's kept pairs "
        f"({rd.stage('pairs').path})"
    )
    return rows, note


def _real(path: Path) -> Path:
    return Path(os.path.realpath(path))


def _recorded(summary: dict[str, Any] | None, folder: Path) -> dict[str, Any]:
    """What a release records for its readers: the rules its pairs were filtered with and
    the profile selection (``recorded`` in the source description)."""
    if summary is None:
        return {}
    prov = summary.get("provenance")
    prov = prov if isinstance(prov, dict) else {}
    return {"summary": summary, "folder": str(folder), "profile": prov.get("profile")}


def load_pairs(
    path: str | Path, *, stale_ok: bool = False, compact: bool = False
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Rows of a pairs source and a description of where they came from.

    The description has ``path``, ``format`` and, when the source needed explaining,
    ``note``; a release's private ``_recorded`` (its release.json, see
    :mod:`pipeline.publish.recorded`); its private ``_where`` (a :class:`Where`) locates
    each row for errors. A release inside its run, or a run's pair stage, that the run no
    longer supports (a stage re-done or being re-done since) is refused with one line,
    unless ``stale_ok`` (then the note says so). ``compact``: each row's types checked as
    it is read and the row cut down to what the audit reads (:class:`Compact`); its private
    ``_compact`` holds the first type problem for :func:`check_types`.
    """
    path = Path(path)
    if not path.exists():
        raise InputError("no such file or folder", path=path)
    kind = path_kind(path)
    if kind not in ("a file", "a folder"):  # a named pipe would be read forever
        raise InputError(f"is {kind}, not a pairs file or folder", path=path)
    where = Where()
    cut = Compact() if compact else None

    def described(rows: list[dict[str, Any]], p: Path, fmt: str, **extra: Any):
        extra = {k: v for k, v in extra.items() if v}
        if cut is not None:
            extra["_compact"] = cut
        return rows, {"path": str(p), "format": fmt, **extra, "_where": where}

    if path.is_dir():
        rd = RunDir(path)
        run = run_of(path)  # the run this folder is, or whose release it is
        if rd.is_run():
            if rd.has_release():  # a run directory with a release
                path = rd.release_dir
            else:  # a run, unpublished
                note = check_current(path, rd, None, stale_ok=stale_ok)
                rows, about = _from_run(rd, where, cut)
                return described(rows, path, "pairs_stage", note=note or about)
        if (path / RELEASE_ALL).is_dir():
            summary = summary_of(path)
            inside = run is not None and _real(run.release_dir) == _real(path)
            note = (
                check_current(path, run, summary or {}, stale_ok=stale_ok)
                if inside and run is not None
                else None
            )
            rows = _from_parquet(path / RELEASE_ALL, where, cut)
            # what identifies the release: outputs made for it record it (their validity)
            return described(rows, path, "release", note=note, data_sha256=release_sha256(path),
                             _recorded=_recorded(summary, path))  # fmt: skip
        if (path / "dataset_info.json").exists() or (path / "dataset_dict.json").exists():
            return described(_from_disk(path, where, cut), path, "save_to_disk")
        if any(path.glob("*.parquet")):
            return described(_from_parquet(path, where, cut), path, "parquet")
        raise InputError(
            "not a release folder (no 'all' config), a run directory (no publish/ or pairs/), "
            "a save_to_disk folder or a folder of parquet files",
            path=path,
        )
    if path.suffix == ".parquet":
        return described(_from_parquet(path, where, cut), path, "parquet")
    if path.suffix in (".jsonl", ".json", ".ndjson"):
        fmt = "json" if path.suffix == ".json" else "jsonl"
        return described(_from_json(path, where, cut), path, fmt)
    raise InputError(
        "unknown format: expected .jsonl, .json, .parquet, a release, a run directory or a "
        "save_to_disk folder",
        path=path,
    )


# ---- types --------------------------------------------------------------------------------


def check_types(rows: list[dict[str, Any]], source: Mapping[str, Any]) -> None:
    """Every checked column of the release table (:mod:`pipeline.release`) has its type in
    every row; the first field that has not is an InputError naming its file, line (or
    row) and field."""
    where: Where = source.get("_where") or Where()
    compact: Compact | None = source.get("_compact")
    problems: Iterable[tuple[int, RecordProblem]]
    if compact is not None:  # checked as they were read: the first problem, if any
        problems = [compact.problem] if compact.problem is not None else []
    else:
        problems = _problems(rows)
    for i, exc in problems:
        if where.files:
            raise where.error(i, str(exc), exc.field) from None
        raise InputError(f"row {i}: {exc}", path=source.get("path"), field=exc.field) from None


def _problems(rows: list[dict[str, Any]]) -> Iterator[tuple[int, RecordProblem]]:
    for i, r in enumerate(rows):
        try:
            check_row(r)
        except RecordProblem as exc:
            yield i, exc
