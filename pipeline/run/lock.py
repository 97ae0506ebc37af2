"""One process at a time writes a run directory.

:class:`RunLock` holds an exclusive ``flock`` on ``<run>/.lock`` for the whole command; the
kernel releases it when the holder dies, so a lock left by a killed process is simply
taken over. A second writer is refused at once (``LOCK_NB``), naming the holder.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import time
from pathlib import Path

from pipeline.core.errors import LockError
from pipeline.run import layout


class RunLock:
    """An exclusive lock on a run directory, held for the life of one command."""

    def __init__(self, run_dir: str | Path, command: str = "") -> None:
        self.path = Path(run_dir) / layout.LOCK
        self.command = command or " ".join(["prb", *sys.argv[1:]])[:200]
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self, create: bool = True) -> RunLock:
        """Take the lock or raise LockError naming its holder. ``create`` makes the run
        directory when it does not exist yet (``prb run`` on a new run); otherwise a
        missing folder is an error and nothing is created."""
        import fcntl

        if self._fd is not None:
            return self
        if create:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        elif not self.path.parent.is_dir():
            raise LockError(f"{self.path.parent}: no such run directory", path=self.path.parent)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(fd)
            os.close(fd)
            raise LockError(
                f"run directory {self.path.parent} is in use by {holder}; wait for that "
                "command to finish (or stop it), then run this one again",
                path=self.path.parent,
            ) from None
        info = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started": time.strftime("%Y-%m-%d %H:%M:%S"),
            "command": self.command,
        }
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(info) + "\n").encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is None:
            return
        import fcntl

        with contextlib.suppress(OSError):
            os.ftruncate(self._fd, 0)
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)
        self._fd = None

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def _read_holder(fd: int) -> str:
    try:
        raw = os.pread(fd, 4096, 0).decode("utf-8", "replace")
        info = json.loads(raw)
        return f"pid {info['pid']} ({info.get('command', 'prb')}, started {info['started']})"
    except (OSError, ValueError, KeyError, TypeError):
        return "another prb process (it is starting up)"
