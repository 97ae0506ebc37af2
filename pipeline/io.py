"""Atomic file writes and JSONL helpers.

Every file the pipeline writes goes through a temporary file in the same folder, is
fsynced, then renamed over the target, so a crash leaves either the old file or the
new one, never a torn one.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any

import jsonlines


def _current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_UMASK = _current_umask()


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


@contextlib.contextmanager
def atomic_open(path: str | Path, mode: str = "w", encoding: str | None = "utf-8") -> Iterator[IO]:
    """Open a temporary file beside ``path``; on success fsync and rename it over ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    # mkstemp creates 0600 files; give the result the mode a plain open() would have
    os.chmod(tmp, 0o666 & ~_UMASK)
    kwargs = {} if "b" in mode else {"encoding": encoding}
    try:
        with os.fdopen(fd, mode, **kwargs) as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        _fsync_dir(path.parent)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_text_atomic(path: str | Path, text: str) -> None:
    with atomic_open(path) as fh:
        fh.write(text)


def write_json_atomic(path: str | Path, obj: Any) -> None:
    with atomic_open(path) as fh:
        json.dump(obj, fh, indent=2, sort_keys=True, ensure_ascii=False, default=str)
        fh.write("\n")


def write_jsonl_atomic(path: str | Path, rows: Iterable[dict]) -> int:
    """Write rows as JSON lines atomically; returns the number of rows written."""
    n = 0
    with atomic_open(path) as fh:
        writer = jsonlines.Writer(fh, compact=True, sort_keys=False)
        for row in rows:
            writer.write(row)
            n += 1
    return n


def read_jsonl(path: str | Path) -> Iterator[dict]:
    with jsonlines.open(path) as reader:
        yield from reader


def read_json(path: str | Path) -> Any:
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)
