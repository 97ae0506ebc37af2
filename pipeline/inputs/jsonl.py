"""The JSONL formats: ``lamp`` (one LaMP-QA-style question per line, with its asker's
``profile``) and ``generic`` (``users.jsonl`` with ``user_id`` and ``profile``, plus
``questions.jsonl`` with ``id``, ``user_id``, ``question``..., joined on ``user_id``).

Errors name the file, the 1-based physical line and the dotted field; blank lines are
skipped, unknown keys (e.g. ``_note``) ignored."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pipeline.core.errors import InputError
from pipeline.core.io import path_kind
from pipeline.inputs.base import (
    DEFAULT_KEYS,
    FORMATS,
    InputFormat,
    InputSection,
    Loc,
    PathWant,
    Unique,
    example_row,
    ident,
    kind_of,
    profile,
    question_fields,
    required,
)

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


def parse_line(text: str, loc: Loc) -> dict:
    """One JSONL line as a JSON object, or an error naming the line and what is wrong."""
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
        raise loc.fail(None, f"each line must be a JSON object, got {kind_of(obj)}")
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


def _open(path: Path) -> Any:
    kind = path_kind(path)
    if kind not in (None, "a file", "a folder"):
        # checked before open(): opening a named pipe waits for a writer, /dev/zero never ends
        raise InputError(
            f"is {kind}, not a JSONL file; point the config at the input file", path=path
        )
    try:
        return open(path, "rb")  # the caller closes it
    except FileNotFoundError:
        raise InputError("input file not found", path=path) from None
    except IsADirectoryError:
        raise InputError("expected a JSONL file, found a folder", path=path) from None
    except OSError as exc:
        raise InputError(f"cannot read input file: {exc.strerror or exc}", path=path) from None


def read_jsonl(path: Path) -> Iterator[tuple[Loc, dict]]:
    """Yield (location, object) for each non-blank line; raise on anything else.

    A file without a single example is an error too: it would make a run of 0 pairs."""
    with _open(path) as fh:
        found = False
        for n, raw in enumerate(fh, start=1):
            if n == 1 and raw.startswith(b"\xef\xbb\xbf"):
                raw = raw[3:]
            loc = Loc(path, n)
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise _other_format(
                    loc.fail(
                        None,
                        f"not valid UTF-8 ({exc.reason} at byte {exc.start} of the line); "
                        "save the file as UTF-8",
                    ),
                    path,
                    first=not found,
                ) from None
            if not line.strip():
                continue
            try:
                obj = parse_line(line, loc)
            except InputError as exc:
                raise _other_format(exc, path, first=not found) from None
            found = True
            yield loc, obj
    if not found:
        raise InputError(
            "the file holds no rows (it is empty or blank); point the config at the input "
            "file with the data",
            path=path,
        )


def _other_format(exc: InputError, path: Path, *, first: bool) -> InputError:
    """The error, naming the format the file looks like when its very first row fails
    (a parquet file given as JSONL is not "invalid UTF-8 on line 1" to its owner)."""
    other = FORMATS.detect(path) if first else None
    if other is None or other in ("lamp", "generic"):
        return exc
    return InputError(
        f"{exc.reason}; the file looks like input.format '{other}'",
        path=exc.path,
        line=exc.line,
        field=exc.field,
    )


def count_lines(path: Path) -> int:
    """Non-blank lines: one example each (nothing is parsed; the read validates)."""
    with _open(path) as fh:
        return sum(1 for line in fh if line.strip())


def _looks_like_jsonl(path: Path, keys: tuple[str, ...]) -> bool:
    """The first non-blank line of a regular file is a JSON object holding ``keys``."""
    if path_kind(path) != "a file":
        return False
    try:
        with open(path, "rb") as fh:
            for raw in fh:
                if raw.strip():
                    obj = json.loads(raw.decode("utf-8-sig"))
                    return isinstance(obj, dict) and all(k in obj for k in keys)
    except (OSError, ValueError, RecursionError):
        return False
    return False


class LampFormat(InputFormat):
    summary = "LaMP-QA-style JSONL."

    @classmethod
    def path_fields(cls, section: InputSection) -> list[tuple[str, Path | None, PathWant]]:
        return [("input.path", section.path, "file")]

    @classmethod
    def detect(cls, path: Path) -> bool:
        return _looks_like_jsonl(path, ("question", "profile"))

    def count(self) -> int:
        return count_lines(self.need_path("path"))

    def read(self) -> Iterator[dict]:
        ids = Unique("id")
        for loc, obj in read_jsonl(self.need_path("path")):
            fields = question_fields(obj, loc, DEFAULT_KEYS)
            ids.add(fields["source_id"], "id", loc)
            user_id = obj.get("user_id")
            user_id = fields["source_id"] if user_id is None else ident(user_id, "user_id", loc)
            posts = profile(required(obj, "profile", "profile", loc), "profile", loc)
            yield example_row(fields, user_id, posts)


class GenericFormat(InputFormat):
    summary = "users.jsonl + questions.jsonl."

    @classmethod
    def path_fields(cls, section: InputSection) -> list[tuple[str, Path | None, PathWant]]:
        return [
            ("input.users_path", section.users_path, "file"),
            ("input.questions_path", section.questions_path, "file"),
        ]

    @classmethod
    def detect(cls, path: Path) -> bool:
        # a questions file: rows carry a user_id and no profile of their own
        return _looks_like_jsonl(path, ("question", "user_id")) and not _looks_like_jsonl(
            path, ("profile",)
        )

    def count(self) -> int:
        return count_lines(self.need_path("questions_path"))

    def read(self) -> Iterator[dict]:
        users_path = self.need_path("users_path")
        questions_path = self.need_path("questions_path")
        users: dict[str, list[dict]] = {}
        user_ids = Unique("user_id")
        for loc, obj in read_jsonl(users_path):
            uid = ident(required(obj, "user_id", "user_id", loc), "user_id", loc)
            user_ids.add(uid, "user_id", loc)
            users[uid] = profile(required(obj, "profile", "profile", loc), "profile", loc)

        ids = Unique("id")
        for loc, obj in read_jsonl(questions_path):
            fields = question_fields(obj, loc, DEFAULT_KEYS)
            ids.add(fields["source_id"], "id", loc)
            uid = ident(required(obj, "user_id", "user_id", loc), "user_id", loc)
            if uid not in users:
                raise loc.fail("user_id", f"unknown user_id {uid!r}: not in {users_path}")
            # Each example gets its own copy so that a later stage editing one cannot touch
            # another.
            yield example_row(fields, uid, [dict(post) for post in users[uid]])
