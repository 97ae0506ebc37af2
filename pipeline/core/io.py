"""Atomic file writes, JSONL helpers and the crash failpoints that test them.

Every file the pipeline writes goes through a temporary file in the same folder, is
fsynced, then renamed over the target, so a crash leaves either the old file or the
new one, never a torn one. Temporary files start with a dot and end in ``.tmp``; a run
removes the strays a killed process left behind (``remove_strays``).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import stat
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any

import jsonlines
import orjson

from pipeline.core.errors import _WRITE_ERRNOS, StorageError


def _current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_UMASK = _current_umask()

# ---- failpoints -------------------------------------------------------------------------
# The crash-consistency test kills the process at each point where durable state changes
# (before and after every atomic write, every cache commit). PRB_CRASH_LOG names a file
# that receives one line per point reached; PRB_CRASH_AT=N exits the process at the Nth
# point with os._exit, so no finally block, flush or atexit hook runs: as close to a
# SIGKILL as a test can aim. Unset (the normal case), a failpoint costs one dict lookup.
_failpoints_seen = 0


def crash_point(label: str) -> None:
    """Mark a point where a crash must leave the run directory recoverable."""
    at = os.environ.get("PRB_CRASH_AT")
    log = os.environ.get("PRB_CRASH_LOG")
    if not at and not log:
        return
    global _failpoints_seen
    _failpoints_seen += 1
    if log:
        with open(log, "a", encoding="utf-8") as fh:
            fh.write(f"{_failpoints_seen}\t{label}\n")
    if at and int(at) == _failpoints_seen:
        os._exit(86)


def _fsync_dir(path: Path) -> None:
    # The rename is durable only once the directory entry is flushed too.
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


# the public name, for writers outside this module (a release folder's rename)
fsync_dir = _fsync_dir


@contextlib.contextmanager
def atomic_open(path: str | Path, mode: str = "w", encoding: str | None = "utf-8") -> Iterator[IO]:
    """Open a temporary file beside ``path``; on success fsync and rename it over ``path``."""
    path = Path(path)
    crash_point(f"before {path.parent.name}/{path.name}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        if exc.errno in _WRITE_ERRNOS:
            raise StorageError.from_os_error(exc, path) from exc
        raise
    # mkstemp creates 0600 files; give the result the mode a plain open() would have
    os.chmod(tmp, 0o666 & ~_UMASK)
    try:
        with os.fdopen(fd, mode, encoding=None if "b" in mode else encoding) as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        _fsync_dir(path.parent)
    except BaseException as exc:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        if isinstance(exc, OSError) and exc.errno in _WRITE_ERRNOS:
            # disk full, read-only, no permission: one line naming the file we were writing
            raise StorageError.from_os_error(exc, path) from exc
        raise
    crash_point(f"after {path.parent.name}/{path.name}")


def write_text_atomic(path: str | Path, text: str) -> None:
    with atomic_open(path) as fh:
        fh.write(text)


def write_json_atomic(path: str | Path, obj: Any) -> None:
    with atomic_open(path) as fh:
        json.dump(obj, fh, indent=2, sort_keys=True, ensure_ascii=False, default=str)
        fh.write("\n")


def dumps(obj: Any) -> bytes:
    """Compact JSON as UTF-8 bytes. A string orjson refuses (a lone surrogate a model
    answer may carry) falls back to json with ASCII escapes, which any reader accepts."""
    try:
        return orjson.dumps(obj, default=str)
    except TypeError:
        return json.dumps(obj, separators=(",", ":"), default=str).encode("ascii")


def dumps_sorted(obj: Any) -> bytes:
    """:func:`dumps` with sorted keys: equal content gives equal bytes (for hashing)."""
    try:
        return orjson.dumps(obj, default=str, option=orjson.OPT_SORT_KEYS)
    except TypeError:
        return json.dumps(obj, separators=(",", ":"), sort_keys=True, default=str).encode("ascii")


def loads(data: bytes | str) -> Any:
    """Parse JSON; orjson rejects escaped lone surrogates, which json reads."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return json.loads(data)


def write_jsonl_atomic(path: str | Path, rows: Iterable[dict]) -> int:
    """Write rows as JSON lines atomically; returns the number of rows written."""
    n = 0
    with atomic_open(path, "wb") as fh:
        for row in rows:
            fh.write(dumps(row) + b"\n")
            n += 1
    return n


def read_jsonl(path: str | Path) -> Iterator[dict]:
    with jsonlines.open(path) as reader:
        yield from reader


def read_json(path: str | Path) -> Any:
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


def file_digest(path: str | Path) -> tuple[str, int, int]:
    """(sha256 hex, size in bytes, newline count) of a file, read in 1 MiB blocks."""
    h = hashlib.sha256()
    size = lines = 0
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
            size += len(block)
            lines += block.count(b"\n")
    return h.hexdigest(), size, lines


# ".<name>.<random part>.tmp" (tempfile.mkstemp's random part: letters, digits, "_")
_TEMP_RE = re.compile(r"^\..+\.[a-z0-9_]+\.tmp$")


def remove_strays(folder: str | Path) -> int:
    """Delete the temporary files (``.name.XXXX.tmp``) a killed writer left under ``folder``
    and the ``.trash-*`` folders of interrupted clears; returns how many were removed.
    Only safe while the run directory's lock is held."""
    import shutil

    folder = Path(folder)
    if not folder.is_dir():
        return 0
    n = 0
    for p in list(folder.rglob(".*")):
        # only the names atomic_open gives (".<name>.<random part>.tmp"): a user's
        # own ".notes.tmp" in the run directory is not ours to delete
        if p.is_file() and _TEMP_RE.match(p.name):
            with contextlib.suppress(FileNotFoundError):
                p.unlink()
                n += 1
        elif p.is_dir() and p.name.startswith(".trash-"):
            shutil.rmtree(p, ignore_errors=True)
            n += 1
    return n


# ---- what is at a path ------------------------------------------------------------------

_PATH_KINDS = (
    (stat.S_ISREG, "a file"),
    (stat.S_ISDIR, "a folder"),
    (stat.S_ISFIFO, "a named pipe"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def path_kind(path: str | Path) -> str | None:
    """What is at ``path`` (links followed): "a file", "a folder", "a named pipe", "a
    character device"...; None when nothing is. Only stat()s: never opens it."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return None
    except NotADirectoryError:
        return None  # a parent is a file: nothing can be there
    except OSError as exc:
        return f"unreadable ({exc.strerror or exc})"
    return next((name for test, name in _PATH_KINDS if test(mode)), "a special file")
