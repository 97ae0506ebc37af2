"""Reading a pairs source for the audit, and checking every field's type.

Sources: a release folder (its ``all`` config), a run directory (its release, or the pair
stage's kept pairs when it has none), a JSONL / JSON / parquet file, or a folder written
by ``datasets``' ``save_to_disk``. Whatever the source, a bad row is one
:class:`~pipeline.errors.InputError` naming the file, the line (or row) and the field, so
the CLI prints one line and no traceback.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from pipeline.errors import InputError
from pipeline.fields import (
    ASPECT_FIELDS,
    COVERAGE_MAX,
    COVERAGE_MIN,
    DIMENSIONS,
    ORDERS,
    PREFERENCES,
    PROFILE_FIELDS,
    QUALITY_MAX,
    QUALITY_MIN,
    SIDES,
    TEXT_COLUMNS,
    is_number,
)
from pipeline.records import type_name as _type_name
from pipeline.run import RunDir
from pipeline.run.layout import RELEASE_ALL

REQUIRED_COLUMNS = TEXT_COLUMNS
# Lone surrogates survive json.loads but cannot be written as UTF-8 (or hashed).
_SURROGATE_RE = re.compile(r"[\ud800-\udfff]")


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


def _from_json(path: Path, where: Where) -> list[dict[str, Any]]:
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
        return data
    rows = []
    for line_no, row in _jsonl_objects(path):
        _check_columns(path, list(row), line=line_no)
        where.add(path, line_no, by_line=True)
        rows.append(row)
    return rows


def _from_table(path: Path, table: Any, where: Where) -> list[dict[str, Any]]:
    _check_columns(path, list(table.column_names))
    rows = table.to_pylist()
    for i in range(len(rows)):
        where.add(path, i, by_line=False)
    return rows


def _from_parquet(path: Path, where: Where) -> list[dict[str, Any]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    files = sorted(path.glob("*.parquet")) if path.is_dir() else [path]
    if not files:
        raise InputError("no parquet file here", path=path)
    rows: list[dict[str, Any]] = []
    for f in files:
        try:
            table = pq.read_table(f)
        except (pa.ArrowException, OSError) as exc:
            raise InputError(f"not a readable parquet file: {exc}", path=f) from None
        rows.extend(_from_table(f, table, where))
    return rows


def _from_disk(path: Path, where: Where) -> list[dict[str, Any]]:
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
    return _from_table(path, ds.data.table, where)


def _from_run(rd: RunDir, where: Where) -> tuple[list[dict[str, Any]], str]:
    """A run without a release: its pair stage's kept pairs as release rows (the columns
    ``prb publish`` writes, through its own ``build_row``), read through the run's verified
    accessor (a damaged or unfinished stage is refused)."""
    from pipeline.publish import build_row

    rows = []
    for path, line, rec in rd.numbered_pair_records():
        where.add(path, line, by_line=True)
        rows.append(build_row(rec, None))
    note = (
        "this run has no release (publish/): auditing the pair stage's kept pairs "
        f"({rd.stage('pairs').path})"
    )
    return rows, note


def load_pairs(path: str | Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Rows of a pairs source and a description of where they came from.

    The description has ``path``, ``format`` and, when the source needed explaining,
    ``note``; its private ``_where`` (a :class:`Where`) locates each row for errors.
    """
    path = Path(path)
    if not path.exists():
        raise InputError("no such file or folder", path=path)
    from pipeline.config import path_kind  # here: pipeline.config imports the audit's rules

    kind = path_kind(path)
    if kind not in ("a file", "a folder"):  # a named pipe would be read forever
        raise InputError(f"is {kind}, not a pairs file or folder", path=path)
    where = Where()

    def described(rows: list[dict[str, Any]], p: Path, fmt: str, **extra: Any):
        return rows, {"path": str(p), "format": fmt, **extra, "_where": where}

    if path.is_dir():
        rd = RunDir(path)
        if rd.is_run():
            if rd.has_release():  # a run directory with a release
                path = rd.release_dir
            else:  # a run, unpublished
                rows, note = _from_run(rd, where)
                return described(rows, path, "pairs_stage", note=note)
        if (path / RELEASE_ALL).is_dir():
            return described(_from_parquet(path / RELEASE_ALL, where), path, "release")
        if (path / "dataset_info.json").exists() or (path / "dataset_dict.json").exists():
            return described(_from_disk(path, where), path, "save_to_disk")
        if any(path.glob("*.parquet")):
            return described(_from_parquet(path, where), path, "parquet")
        raise InputError(
            "not a release folder (no 'all' config), a run directory (no publish/ or pairs/), "
            "a save_to_disk folder or a folder of parquet files",
            path=path,
        )
    if path.suffix == ".parquet":
        return described(_from_parquet(path, where), path, "parquet")
    if path.suffix in (".jsonl", ".json", ".ndjson"):
        fmt = "json" if path.suffix == ".json" else "jsonl"
        return described(_from_json(path, where), path, fmt)
    raise InputError(
        "unknown format: expected .jsonl, .json, .parquet, a release, a run directory or a "
        "save_to_disk folder",
        path=path,
    )


# ---- types --------------------------------------------------------------------------------


def check_types(rows: list[dict[str, Any]], source: Mapping[str, Any]) -> None:
    """Every field the audit reads has the type the reference schema (or our release)
    gives it; the first that does not is an InputError naming its file, line and field."""
    where: Where = source.get("_where") or Where()

    def err(i: int, field: str, expected: str, value: Any) -> InputError:
        if where._file_of:
            return where.error(i, f"'{field}' must be {expected}, got {_type_name(value)}", field)
        return InputError(
            f"row {i}: '{field}' must be {expected}, got {_type_name(value)}",
            path=source.get("path"),
            field=field,
        )

    def text(i: int, field: str, v: Any, optional: bool) -> None:
        if v is None and optional:
            return
        if not isinstance(v, str):
            raise err(i, field, "a string" + (" or null" if optional else ""), v)
        m = None if v.isascii() else _SURROGATE_RE.search(v)  # isascii: one C pass
        if m:
            raise err(i, field, "valid Unicode text", f"a lone surrogate \\u{ord(m.group()):04x}")

    for i, r in enumerate(rows):
        for col in TEXT_COLUMNS:
            text(i, col, r.get(col), optional=False)
        for col in ("narrative", "human_verdict"):
            text(i, col, r.get(col), optional=True)
        fr = r.get("finish_reasons")
        if fr is not None:
            if not isinstance(fr, dict):
                raise err(i, "finish_reasons", "an object {chosen, rejected} or null", fr)
            for side in SIDES:
                text(i, f"finish_reasons.{side}", fr.get(side), optional=True)
        for col in ("id", "category", "user_id", "pair_id", "example_id"):
            v = r.get(col)
            if isinstance(v, int) and not isinstance(v, bool) and col != "category":
                continue  # numeric ids are ids too
            text(i, col, v, optional=True)
        for col, subfields in (("profile", PROFILE_FIELDS), ("rubric_aspects", ASPECT_FIELDS)):
            v = r.get(col)
            if v is None:
                continue
            if not isinstance(v, list):
                raise err(i, col, "a list of objects or null", v)
            for k, item in enumerate(v):
                if not isinstance(item, dict):
                    raise err(i, f"{col}[{k}]", "an object", item)
                for sub in subfields:
                    sv = item.get(sub)
                    if sub == "id" and isinstance(sv, int) and not isinstance(sv, bool):
                        continue
                    text(i, f"{col}[{k}].{sub}", sv, optional=True)
        for col in ("quality_chosen", "quality_rejected"):
            q = r.get(col)
            if q is None:
                continue
            if not isinstance(q, dict):
                raise err(i, col, "an object of scores (correctness, relevance, helpfulness)", q)
            for d in DIMENSIONS:
                v = q.get(d)
                if v is not None and (not is_number(v) or not QUALITY_MIN <= v <= QUALITY_MAX):
                    raise err(i, f"{col}.{d}", f"a score {QUALITY_MIN}-{QUALITY_MAX} or null", v)
        for col in (
            "coverage_chosen_mean",
            "coverage_rejected_mean",
            "coverage_rejected_violated_mean",
        ):
            v = r.get(col)
            if v is not None and (not is_number(v) or not COVERAGE_MIN <= v <= COVERAGE_MAX):
                raise err(i, col, f"a number {COVERAGE_MIN}-{COVERAGE_MAX} or null", v)
        for col in ("pairwise_aware", "pairwise_blind"):
            v = r.get(col)
            if v is None:
                continue
            if not isinstance(v, dict):
                raise err(i, col, "an object {AB, BA}", v)
            for o in ORDERS:
                p = v.get(o)
                if p is not None and p not in PREFERENCES:
                    raise err(i, f"{col}.{o}", " / ".join(PREFERENCES) + " or null", p)
        v = r.get("human_agreement")
        if v is not None and (not is_number(v) or not 0 <= v <= 1):
            raise err(i, "human_agreement", "a share 0-1 or null", v)
