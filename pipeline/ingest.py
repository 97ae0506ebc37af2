"""Ingest: read the input examples into the ``examples`` contract.

Three input formats (``input.format`` in the config):

- ``lamp``: LaMP-QA-style JSONL, one question per line with its asker's ``profile``.
- ``generic``: ``users.jsonl`` (``user_id``, ``profile``) plus ``questions.jsonl``
  (``id``, ``user_id``, ``question``, ...), joined on ``user_id``.
- ``hf``: a folder written by ``datasets`` ``save_to_disk`` (a Dataset or a DatasetDict,
  ``input.split`` picks the split) or a ``.parquet`` file, with ``input.columns`` mapping
  our field names to the source's column names.

Every row is validated by hand so that an error names the file, the line (for ``hf``:
the 1-based row) and the dotted field (e.g. ``profile[2].text``). The whole input is
validated before anything is returned, and ingest writes no file, so a bad input never
leaves a partial output behind. Unknown keys (e.g. ``_note``) are ignored.

Each returned row has exactly these keys::

    example_id      str   stable_id("example", source_id)
    source_id       str   the input's own id
    user_id         str   lamp: the row's user_id, else its id (one asker per question)
    question        str   with visible text (fields.visible_text)
    category        str | None
    profile         list of {"id": str, "category": str | None, "text": str}
    narrative       str | None
    rubric_aspects  list of {"aspect": str, "evidence": str, "reason": str} | None
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.config import InputSection, path_kind
from pipeline.errors import InputError
from pipeline.fields import visible_text
from pipeline.ids import stable_id

# Our field names that an ``hf`` source may map to its own column names.
HF_FIELDS = (
    "source_id",
    "user_id",
    "question",
    "category",
    "profile",
    "narrative",
    "rubric_aspects",
)
_HF_REQUIRED = ("source_id", "question", "profile")
# The key each field is read from when no mapping says otherwise.
_DEFAULT_KEYS = {name: name for name in HF_FIELDS} | {"source_id": "id"}


@dataclass(frozen=True)
class _Loc:
    """Where a row comes from: the file, its line (or row) number and the word to use."""

    path: Path
    line: int
    unit: str = "line"  # "line" for JSONL, "row" for datasets / parquet

    def fail(self, field: str | None, message: str) -> InputError:
        # InputError's own prefix already says "line N"; for hf rows say "row N" as well.
        if self.unit != "line":
            message = f"{self.unit} {self.line}: {message}"
        return InputError(message, path=self.path, line=self.line, field=field)


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list | tuple):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


# ---------------------------------------------------------------------------------------
# Field checks (shared by every format)


def _required(obj: Mapping[str, Any], key: str, field: str, loc: _Loc) -> Any:
    # A missing key and a null read the same (Arrow fills absent struct fields with null).
    if obj.get(key) is None:
        raise loc.fail(field, "required field is missing or null")
    return obj[key]


def _blank(value: str) -> str:
    """How a string with nothing visible is described in an error."""
    if not value:
        return "an empty string"
    if not value.strip():
        return "only whitespace"
    return "text with nothing visible (only zero-width, control or blank characters)"


def _text(value: Any, field: str, loc: _Loc) -> str:
    if not isinstance(value, str):
        raise loc.fail(field, f"must be a non-empty string, got {_kind(value)}")
    if not visible_text(value):
        raise loc.fail(field, f"must be a non-empty string, got {_blank(value)}")
    return value


def _opt_text(value: Any, field: str, loc: _Loc) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise loc.fail(field, f"must be a string or null, got {_kind(value)}")
    return value


def _ident(value: Any, field: str, loc: _Loc) -> str:
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise loc.fail(field, f"must be a non-empty string or an integer, got {_kind(value)}")
    text = str(value)
    if not visible_text(text):
        raise loc.fail(field, f"must be a non-empty string or an integer, got {_blank(text)}")
    return text


def _profile(value: Any, field: str, loc: _Loc) -> list[dict]:
    if not isinstance(value, list | tuple):
        raise loc.fail(field, f"must be a list of past posts, got {_kind(value)}")
    posts = []
    for i, item in enumerate(value):
        where = f"{field}[{i}]"
        if not isinstance(item, Mapping):
            raise loc.fail(where, f"must be an object with 'id' and 'text', got {_kind(item)}")
        f_id, f_text = f"{where}.id", f"{where}.text"
        posts.append(
            {
                "id": _ident(_required(item, "id", f_id, loc), f_id, loc),
                "category": _opt_text(item.get("category"), f"{where}.category", loc),
                "text": _text(_required(item, "text", f_text, loc), f_text, loc),
            }
        )
    return posts


def _rubric(value: Any, field: str, loc: _Loc) -> list[dict] | None:
    if value is None:
        return None
    if not isinstance(value, list | tuple):
        raise loc.fail(field, f"must be a list of rubric aspects or null, got {_kind(value)}")
    items = []
    for i, item in enumerate(value):
        where = f"{field}[{i}]"
        if not isinstance(item, Mapping):
            raise loc.fail(where, f"must be an object with 'aspect', got {_kind(item)}")
        aspect = _required(item, "aspect", f"{where}.aspect", loc)
        items.append(
            {
                "aspect": _text(aspect, f"{where}.aspect", loc),
                "evidence": _opt_text(item.get("evidence"), f"{where}.evidence", loc) or "",
                "reason": _opt_text(item.get("reason"), f"{where}.reason", loc) or "",
            }
        )
    return items


def _question_fields(obj: Mapping[str, Any], loc: _Loc, keys: Mapping[str, str]) -> dict:
    """Validate the per-question fields (everything but the profile and the user)."""
    k_id, k_q = keys["source_id"], keys["question"]
    source_id = _ident(_required(obj, k_id, k_id, loc), k_id, loc)
    question = _text(_required(obj, k_q, k_q, loc), k_q, loc)
    k_cat, k_nar, k_rub = keys["category"], keys["narrative"], keys["rubric_aspects"]
    return {
        "source_id": source_id,
        "question": question,
        "category": _opt_text(obj.get(k_cat), k_cat, loc),
        "narrative": _opt_text(obj.get(k_nar), k_nar, loc),
        "rubric_aspects": _rubric(obj.get(k_rub), k_rub, loc),
    }


def _example(fields: dict, user_id: str, profile: list[dict]) -> dict:
    source_id = fields["source_id"]
    return {
        "example_id": stable_id("example", source_id),
        "source_id": source_id,
        "user_id": user_id,
        "question": fields["question"],
        "category": fields["category"],
        "profile": profile,
        "narrative": fields["narrative"],
        "rubric_aspects": fields["rubric_aspects"],
    }


class _Unique:
    """Remembers where each id was first seen, to name both lines of a duplicate."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.seen: dict[str, int] = {}

    def add(self, key: str, field: str, loc: _Loc) -> None:
        first = self.seen.get(key)
        if first is not None:
            raise loc.fail(
                field, f"duplicate {self.what} {key!r} (first seen on {loc.unit} {first})"
            )
        self.seen[key] = loc.line


# ---------------------------------------------------------------------------------------
# JSONL


def _need_path(p: Path | None, name: str, fmt: str) -> Path:
    if p is None:
        raise InputError(f"input.{name} must be set for input.format '{fmt}'", field=name)
    return Path(p)


# A JSON escape of a UTF-16 surrogate; only such an escape can put one in a decoded string
# (raw UTF-8 bytes cannot encode a surrogate, and the decode below rejects them).
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


def _lone_surrogate(obj: Any) -> tuple[str, str] | None:
    """(dotted field, the offending escape) of the first string holding a lone surrogate.

    Iterative, not recursive: the object may be nested as deeply as json allowed."""
    stack: list[tuple[str | None, Any]] = [(None, obj)]
    while stack:
        where, value = stack.pop()
        if isinstance(value, str):
            for ch in value:
                if 0xD800 <= ord(ch) <= 0xDFFF:
                    return where or "(value)", f"\\u{ord(ch):04x}"
        elif isinstance(value, dict):
            for key, item in reversed(list(value.items())):
                name = f"{where}.{key}" if where else str(key)
                if _lone_surrogate(key) is not None:
                    return name, "a key"
                stack.append((name, item))
        elif isinstance(value, list):
            stack.extend((f"{where}[{i}]", item) for i, item in reversed(list(enumerate(value))))
    return None


def _parse_line(text: str, loc: _Loc) -> dict:
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise loc.fail(
            None, f"malformed JSON: {exc.msg} (column {exc.colno}); fix or remove the line"
        ) from None
    except RecursionError:
        raise loc.fail(
            None, "JSON nested too deeply to read; an example is at most a few levels deep"
        ) from None
    except ValueError as exc:  # e.g. an integer past Python's 4,300-digit conversion limit
        what = "an integer with too many digits" if "digits" in str(exc) else str(exc)
        raise loc.fail(
            None, f"malformed JSON: {what}; ids must be short strings or integers"
        ) from None
    if not isinstance(obj, dict):
        raise loc.fail(None, f"each line must be a JSON object, got {_kind(obj)}")
    if _SURROGATE_ESCAPE.search(text):
        found = _lone_surrogate(obj)
        if found is not None:
            field, escape = found
            raise loc.fail(
                field,
                f"holds a lone UTF-16 surrogate ({escape}), which is not valid Unicode; "
                "fix the escape (a pair such as \\ud83d\\ude00) or remove it",
            )
    return obj


def _read_jsonl(path: Path) -> Iterator[tuple[_Loc, dict]]:
    """Yield (location, object) for each non-blank line; raise on anything else.

    A file without a single example is an error too: it would make a run of 0 pairs."""
    kind = path_kind(path)
    if kind not in (None, "a file", "a folder"):
        # checked before open(): opening a named pipe waits for a writer, /dev/zero never ends
        raise InputError(
            f"is {kind}, not a JSONL file; point the config at the input file", path=path
        )
    try:
        fh = open(path, "rb")  # noqa: SIM115 - closed below; lines are read as they are used
    except FileNotFoundError:
        raise InputError("input file not found", path=path) from None
    except IsADirectoryError:
        raise InputError("expected a JSONL file, found a folder", path=path) from None
    except OSError as exc:
        raise InputError(f"cannot read input file: {exc.strerror or exc}", path=path) from None
    with fh:
        yield from _jsonl_lines(path, fh)


def _jsonl_lines(path: Path, fh: Any) -> Iterator[tuple[_Loc, dict]]:
    found = False
    for n, raw in enumerate(fh, start=1):
        if n == 1 and raw.startswith(b"\xef\xbb\xbf"):
            raw = raw[3:]
        loc = _Loc(path, n)
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise loc.fail(
                None,
                f"not valid UTF-8 ({exc.reason} at byte {exc.start} of the line); "
                "save the file as UTF-8",
            ) from None
        if not text.strip():
            continue
        found = True
        yield loc, _parse_line(text, loc)
    if not found:
        raise InputError(
            "the file holds no rows (it is empty or blank); point the config at the input "
            "file with the data",
            path=path,
        )


def _load_lamp(path: Path) -> Iterator[dict]:
    ids = _Unique("id")
    for loc, obj in _read_jsonl(path):
        fields = _question_fields(obj, loc, _DEFAULT_KEYS)
        ids.add(fields["source_id"], "id", loc)
        user_id = obj.get("user_id")
        user_id = fields["source_id"] if user_id is None else _ident(user_id, "user_id", loc)
        profile = _profile(_required(obj, "profile", "profile", loc), "profile", loc)
        yield _example(fields, user_id, profile)


def _load_generic(users_path: Path, questions_path: Path) -> Iterator[dict]:
    users: dict[str, list[dict]] = {}
    user_ids = _Unique("user_id")
    for loc, obj in _read_jsonl(users_path):
        uid = _ident(_required(obj, "user_id", "user_id", loc), "user_id", loc)
        user_ids.add(uid, "user_id", loc)
        users[uid] = _profile(_required(obj, "profile", "profile", loc), "profile", loc)

    ids = _Unique("id")
    for loc, obj in _read_jsonl(questions_path):
        fields = _question_fields(obj, loc, _DEFAULT_KEYS)
        ids.add(fields["source_id"], "id", loc)
        uid = _ident(_required(obj, "user_id", "user_id", loc), "user_id", loc)
        if uid not in users:
            raise loc.fail("user_id", f"unknown user_id {uid!r}: not in {users_path}")
        # Each example gets its own copy so that a later stage editing one cannot touch another.
        profile = [dict(post) for post in users[uid]]
        yield _example(fields, uid, profile)


# ---------------------------------------------------------------------------------------
# Hugging Face datasets folder / parquet


def _hf_rows(
    path: Path, split: str | None, wanted: Callable[[list[str]], list[str]]
) -> Iterator[dict]:
    """The chosen columns of a saved dataset or a parquet file, row by row, read in batches
    so a large input is never held whole."""
    if path.is_file() and path.suffix.lower() == ".parquet":
        import pyarrow.parquet as pq

        try:
            pf = pq.ParquetFile(path)
            columns = wanted(pf.schema_arrow.names)
            batches = pf.iter_batches(batch_size=1024, columns=columns)
            for batch in batches:
                yield from batch.to_pylist()
        except InputError:
            raise
        except Exception as exc:  # pyarrow raises ArrowInvalid, OSError, ...
            raise InputError(f"cannot read parquet file: {exc}", path=path) from None
        return
    if not path.exists():
        raise InputError(
            "input dataset not found (expected a folder or a .parquet file)", path=path
        )
    if not path.is_dir():
        kind = path_kind(path)
        raise InputError(
            f"is {kind}; hf input must be a folder saved with `datasets` save_to_disk or a "
            ".parquet file",
            path=path,
        )

    import datasets

    try:
        ds = datasets.load_from_disk(str(path))
    except FileNotFoundError:
        raise InputError(
            "not a `datasets` folder (no dataset_info.json or dataset_dict.json); "
            "write it with Dataset.save_to_disk or point input.path at a .parquet file",
            path=path,
        ) from None
    except Exception as exc:
        raise InputError(f"cannot load dataset folder: {exc}", path=path) from None
    if isinstance(ds, datasets.DatasetDict):
        splits = sorted(ds)
        if split is None:
            if len(splits) != 1:
                raise InputError(
                    f"the folder holds several splits; set input.split to one of: "
                    f"{', '.join(splits)}",
                    path=path,
                    field="split",
                )
            split = splits[0]
        if split not in ds:
            raise InputError(
                f"split {split!r} not found; available splits: {', '.join(splits) or '(none)'}",
                path=path,
                field="split",
            )
        ds = ds[split]
    ds = ds.select_columns(wanted(ds.column_names))
    for batch in ds.iter(batch_size=1024):  # columns of up to 1024 rows
        names = list(batch)
        for values in zip(*(batch[k] for k in names), strict=True):
            yield dict(zip(names, values, strict=True))


def _load_hf(path: Path, split: str | None, columns: Mapping[str, str]) -> Iterator[dict]:
    unknown = sorted(set(columns) - set(HF_FIELDS))
    if unknown:
        raise InputError(
            f"input.columns names unknown field(s) {', '.join(map(repr, unknown))}; "
            f"known fields: {', '.join(HF_FIELDS)}",
            path=path,
            field=f"columns.{unknown[0]}",
        )
    keys = dict(_DEFAULT_KEYS) | dict(columns)
    present: dict[str, bool] = {}

    def wanted(available: list[str]) -> list[str]:
        for name in HF_FIELDS:
            col = keys[name]
            present[name] = col in available
            if present[name]:
                continue
            if name in columns:
                raise InputError(
                    f"column {col!r} (mapped from field '{name}' in input.columns) not found; "
                    f"available columns: {', '.join(available)}",
                    path=path,
                    field=col,
                )
            if name in _HF_REQUIRED:
                raise InputError(
                    f"required column {col!r} not found; available columns: "
                    f"{', '.join(available)}; map it with input.columns.{name}",
                    path=path,
                    field=col,
                )
        read = [n for n in HF_FIELDS if present[n]]
        for name in read:
            col = keys[name]
            if available.count(col) > 1:
                # a row becomes a dict: the last of the same-named columns would win silently
                raise InputError(
                    f"the source has {available.count(col)} columns named {col!r} (read for "
                    f"field '{name}'); drop or rename all but one, or map the field to another "
                    "column with input.columns",
                    path=path,
                    field=col,
                )
            others = [o for o in read if o != name and keys[o] == col]
            if others and (name in columns or others[0] in columns):
                raise InputError(
                    f"fields '{name}' and '{others[0]}' both read column {col!r}; map each "
                    "field to a column of its own in input.columns",
                    path=path,
                    field=f"columns.{name if name in columns else others[0]}",
                )
        return list(dict.fromkeys(keys[n] for n in read))

    ids = _Unique("id")
    n = 0
    for n, rec in enumerate(_hf_rows(path, split, wanted), start=1):
        loc = _Loc(path, n, unit="row")
        fields = _question_fields(rec, loc, keys)
        ids.add(fields["source_id"], keys["source_id"], loc)
        k_user = keys["user_id"]
        uid = rec.get(k_user) if present["user_id"] else None
        uid = fields["source_id"] if uid is None else _ident(uid, k_user, loc)
        k_prof = keys["profile"]
        prof = _required(rec, k_prof, k_prof, loc)
        yield _example(fields, uid, _profile(prof, k_prof, loc))
    if n == 0:  # a run of 0 pairs is never what was meant
        where = f" (split {split!r})" if split else ""
        raise InputError(
            f"the dataset{where} holds no rows; point input.path at the data", path=path
        )


# ---------------------------------------------------------------------------------------


def iter_examples(
    cfg: InputSection,
    resolve: Callable[[Path | None], Path | None] = lambda p: p,
) -> Iterator[dict]:
    """Read and validate the input example by example, as rows of the ``examples``
    contract; ``cfg.limit`` keeps the first N. The input is streamed, never held whole, so
    a problem on a late line raises after earlier rows were yielded: a caller that writes
    rows must discard them then (the ingest stage does). Raises ``InputError`` naming the
    file, the line (or row) and the field of the first problem found.

    ``resolve`` turns a configured path into a usable one (pass ``Config.resolve_input``
    so that relative paths are read from the config file's folder).
    """
    if cfg.format == "lamp":
        rows = _load_lamp(_need_path(resolve(cfg.path), "path", "lamp"))
    elif cfg.format == "generic":
        users = _need_path(resolve(cfg.users_path), "users_path", "generic")
        questions = _need_path(resolve(cfg.questions_path), "questions_path", "generic")
        rows = _load_generic(users, questions)
    elif cfg.format == "hf":
        rows = _load_hf(_need_path(resolve(cfg.path), "path", "hf"), cfg.split, cfg.columns)
    else:  # pragma: no cover - the config's Literal type rules this out
        raise InputError(f"unknown input.format {cfg.format!r}", field="format")
    for n, row in enumerate(rows):
        if cfg.limit is not None and n >= cfg.limit:
            # the rest is still read and checked: a limited run fails on the same input
            # a full run would
            for _ in rows:
                pass
            return
        yield row


def load_examples(
    cfg: InputSection,
    resolve: Callable[[Path | None], Path | None] = lambda p: p,
) -> list[dict]:
    """Every input example, validated (see ``iter_examples``); the whole input is checked
    before anything is returned."""
    return list(iter_examples(cfg, resolve))


def check_input(
    cfg: InputSection,
    resolve: Callable[[Path | None], Path | None] = lambda p: p,
) -> int:
    """Read and validate the whole input without keeping it; returns the row count. Run
    before anything is written, so that bad input changes nothing on disk (at the cost of
    one more pass over the input when the ingest stage runs)."""
    return sum(1 for _ in iter_examples(cfg, resolve))
