"""Errors the pipeline raises on purpose, each carrying where the problem is.

The lowest layer: every module may raise these. Turning an error into the line the CLI
prints is presentation, in ``pipeline/cli/errorline.py``.
"""

from __future__ import annotations

import errno as _errno
from pathlib import Path


class PipelineError(Exception):
    """Base class: an error the CLI prints as one clean message, without a traceback."""


class InputError(PipelineError):
    """Bad user input: names the file, and where known the line and the field."""

    def __init__(
        self,
        message: str,
        *,
        path: str | Path | None = None,
        line: int | None = None,
        field: str | None = None,
    ) -> None:
        self.path = str(path) if path is not None else None
        self.line = line
        self.field = field
        self.reason = message
        where = []
        if self.path:
            where.append(self.path)
        if line is not None:
            where.append(f"line {line}")
        if field:
            where.append(f"field '{field}'")
        prefix = ", ".join(where)
        super().__init__(f"{prefix}: {message}" if prefix else message)


class ConfigError(InputError):
    """A config file or a --set override is invalid."""


class BackendError(PipelineError):
    """The LLM backend cannot be used (missing extra, unreachable server, cache miss...)."""


class StageError(PipelineError):
    """A stage cannot run (missing input stage, too many failed requests...)."""


class Unanswered(BackendError):
    """A stage stopped because its backend holds no answer yet for ``count`` of its
    requests: they are answered elsewhere (batch files, pipeline/batch/). Everything the
    stage could finish is kept; the stage is left unfinished. ``hint``: what to do next."""

    def __init__(self, stage: str, count: int, total: int, hint: str) -> None:
        self.stage, self.count, self.total, self.hint = stage, count, total, hint
        super().__init__(f"stage '{stage}': {count} of {total} requests have no answer yet; {hint}")

    def suggesting(self, command: str) -> Unanswered:
        """The same, its hint's ``prb batch export CONFIG`` made the command to type:
        ``command`` (``prb run`` with the config and --set options) as an export."""
        export = command.replace("prb run", "prb batch export", 1)
        hint = self.hint.replace("prb batch export CONFIG", export)
        return Unanswered(self.stage, self.count, self.total, hint)


# The exit status of a run that finished its pair stage with no pair kept: every stage
# worked, but there is no benchmark to publish (docs/errors.md).
NO_PAIR_KEPT_EXIT_STATUS = 5


class BudgetReached(PipelineError):
    """A stage stopped before a request could cross ``run.budget``: what was in flight was
    answered and kept; the stage is left unfinished. ``stats``: the runner's figures of the
    stage so far; ``spent``: the run's spending (requests, tokens, usd) it was checked on."""

    # the exit status of a run stopped by its budget (docs/errors.md)
    EXIT_STATUS = 4

    def __init__(
        self,
        message: str,
        *,
        stats: dict | None = None,
        spent: dict | None = None,
    ) -> None:
        self.stats = stats or {}
        self.spent = spent or {}
        super().__init__(message)


class RunDirError(PipelineError):
    """A run directory's data is damaged or inconsistent; the message names the file and
    the command that repairs it."""

    def __init__(
        self, message: str, *, path: str | Path | None = None, line: int | None = None
    ) -> None:
        self.path = str(path) if path is not None else None
        self.line = line
        super().__init__(message)


class LockError(PipelineError):
    """Another process holds the run directory's lock."""

    def __init__(self, message: str, *, path: str | Path | None = None) -> None:
        self.path = str(path) if path is not None else None
        super().__init__(message)


class CacheError(PipelineError):
    """The request cache (cache.sqlite) cannot be opened or read."""

    def __init__(self, message: str, *, path: str | Path | None = None) -> None:
        self.path = str(path) if path is not None else None
        super().__init__(message)


class StorageError(PipelineError):
    """A file or folder cannot be written (disk full, no permission, read-only system)."""

    def __init__(self, path: str | Path | None, strerror: str, hint: str | None = None) -> None:
        self.path = str(path) if path is not None else None
        self.strerror = strerror
        self.hint = hint
        where = f"cannot write {self.path}" if self.path else "cannot write"
        super().__init__(f"{where}: {strerror}" + (f"; {hint}" if hint else ""))

    @classmethod
    def from_os_error(cls, exc: OSError, path: str | Path | None = None) -> StorageError:
        """The one-line form of an OSError raised while writing ``path``."""
        where = path if path is not None else (exc.filename or None)
        return cls(where, exc.strerror or str(exc), _os_hint(exc.errno))


# Writes fail for these reasons; each gets what the user can do about it.
_OS_HINTS = {
    _errno.ENOSPC: "free some disk space (or set run.output_dir on another disk), then run "
    "the same command again: finished work is kept",
    _errno.EDQUOT: "the disk quota is used up; free some space, then run the same command again",
    _errno.EROFS: "the file system is read-only; set run.output_dir (or --out) to a writable "
    "folder",
    _errno.EACCES: "this user may not write there; fix the folder's permissions or set "
    "run.output_dir (or --out) to a writable folder",
    _errno.EPERM: "the operation is not permitted there; fix the permissions or choose "
    "another folder",
    _errno.EFBIG: "the file is too large for this file system; choose another disk",
    _errno.ENOTDIR: "a part of the path is a file, not a folder; choose another path",
    _errno.EISDIR: "a folder is in the way of a file; move it or choose another path",
    _errno.EEXIST: "something is already in the way; move it or choose another path",
    _errno.ENAMETOOLONG: "the name is too long for this file system; choose a shorter run.name",
}
_WRITE_ERRNOS = {
    _errno.ENOSPC,
    _errno.EDQUOT,
    _errno.EROFS,
    _errno.EACCES,
    _errno.EPERM,
    _errno.EFBIG,
}


def _os_hint(code: int | None) -> str | None:
    return _OS_HINTS.get(code) if code is not None else None
