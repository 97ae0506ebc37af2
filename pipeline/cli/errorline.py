"""The one line the CLI prints for an error (presentation; the errors themselves are in
``pipeline/core/errors.py``).

``format_error`` turns the project's errors, and the few library errors a user can provoke
from outside (disk full, permissions, a damaged SQLite file, undecodable text, a bad
regex), into one line. Every line passes through ``pipeline.core.redact.redact``.
"""

from __future__ import annotations

import errno as _errno
import re
import sqlite3
from collections.abc import Sequence
from pathlib import Path

from pipeline.core.cliargs import command_line
from pipeline.core.errors import _WRITE_ERRNOS, PipelineError, StorageError, _os_hint
from pipeline.core.redact import redact


def _path_in_traceback(exc: BaseException) -> str | None:
    """The ``path`` the innermost pipeline frame was working on, for an OSError without a
    file name (a failed write() or flush() does not carry one)."""
    frames = []
    tb = exc.__traceback__
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    for frame in reversed(frames):
        if "pipeline" not in Path(frame.f_code.co_filename).parts:
            continue
        value = frame.f_locals.get("path")
        if isinstance(value, (str, Path)) and str(value):
            return str(value)
    return None


def _cache_path(target: str | Path | None, overrides: Sequence[str] = ()) -> Path | None:
    """cache.sqlite of the run a command was pointed at (a run directory, or its config and
    the command's --set options, which may name another run)."""
    if target is None:
        return None
    from pipeline.run import RunDir

    t = Path(target)
    if t.is_file() and t.suffix in (".yaml", ".yml"):
        try:
            from pipeline.config import load_config

            return RunDir(load_config(t, list(overrides)).run_dir).cache_path
        except Exception:  # the config itself may be what is broken; say less, not crash
            return None
    return RunDir(t).cache_path


def _sqlite_line(
    exc: sqlite3.DatabaseError, target: str | Path | None, overrides: Sequence[str] = ()
) -> str:
    cache = _cache_path(target, overrides)
    where = str(cache) if cache is not None else "the run's cache.sqlite"
    text = str(exc)
    low = text.lower()
    if "disk is full" in low or "disk full" in low:
        return str(StorageError(where, "no space left on device", _os_hint(_errno.ENOSPC)))
    if "readonly" in low or "read-only" in low or "unable to open" in low:
        return str(StorageError(where, text, _os_hint(_errno.EACCES)))
    if "locked" in low or "busy" in low:
        return (
            f"{where}: {text}; another process is using this run's cache: wait for it to "
            "finish, then run the same command again"
        )
    # a run directory is the run; a config names it with the same --set options
    sets = overrides if target is not None and Path(target).is_file() else ()
    repair = command_line(["prb", "cache", "repair", target if target is not None else "RUN"], sets)
    return (
        f"{where}: the request cache is damaged ({text}); rebuild it from what the stages "
        f"hold with `{repair}`"
    )


def format_error(
    exc: BaseException, target: str | Path | None = None, overrides: Sequence[str] = ()
) -> str | None:
    """The one line to print for an expected failure, or None for a bug (let it raise).

    ``target`` is what the command was pointed at (a run directory or a config file), and
    ``overrides`` its --set options; they name the cache file in SQLite errors and go into
    the repair command.
    """
    line: str | None
    if isinstance(exc, PipelineError):
        line = str(exc)
    elif isinstance(exc, sqlite3.DatabaseError):
        line = _sqlite_line(exc, target, overrides)
    elif isinstance(exc, UnicodeDecodeError):
        line = (
            f"a file is not valid UTF-8 text ({exc.reason} at byte {exc.start}); re-save it "
            "as UTF-8 (run with --debug to see which file)"
        )
    elif isinstance(exc, re.error):
        pattern = exc.pattern if isinstance(exc.pattern, str) else repr(exc.pattern)
        line = f"invalid regular expression {pattern!r}: {exc.msg}; fix it in the config"
    elif isinstance(exc, RecursionError):
        line = (
            "the input is nested too deeply to process; flatten the data (run with --debug "
            "to see where)"
        )
    elif isinstance(exc, (ConnectionError, TimeoutError)):
        line = f"network error: {exc}; check the address and that the server is running"
    elif isinstance(exc, OSError):
        if exc.errno in _WRITE_ERRNOS:
            line = str(StorageError.from_os_error(exc, exc.filename or _path_in_traceback(exc)))
        else:
            where = f"{exc.filename}: " if exc.filename else ""
            hint = _os_hint(exc.errno) or "check the path and its permissions"
            line = f"{where}{exc.strerror or exc}; {hint}"
    else:
        return None
    return redact(line)
