"""The run directory: ``outputs/<run>/`` with one folder per stage.

A stage folder holds ``stage.json`` (its fingerprint and settings, written first),
JSONL shards ``data-NNNNN.jsonl`` and ``rejects-NNNNN.jsonl``, ``stats.json``, and the
completion marker ``_DONE.json``, written last. A shard's data file is written after
its rejects file, so a data file on disk means the whole shard is there.
"""

from __future__ import annotations

import re
import shutil
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from pipeline.io import read_json, read_jsonl, write_json_atomic, write_jsonl_atomic

MARKER = "_DONE.json"
META = "stage.json"
_SHARD_RE = re.compile(r"^data-(\d{5})\.jsonl$")


class StageDir:
    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.name = self.path.name

    # ---- state -------------------------------------------------------------------
    @property
    def meta(self) -> dict[str, Any] | None:
        p = self.path / META
        return read_json(p) if p.exists() else None

    @property
    def done(self) -> bool:
        return (self.path / MARKER).exists()

    def marker(self) -> dict[str, Any] | None:
        p = self.path / MARKER
        return read_json(p) if p.exists() else None

    def begin(
        self,
        fingerprint: str,
        settings: dict[str, Any],
        expected: int,
        environment: dict[str, Any] | None = None,
    ) -> None:
        """Record what this stage runs with; ``environment`` is the machine and library
        versions of this invocation (a resumed stage records the one that finished it)."""
        self.path.mkdir(parents=True, exist_ok=True)
        write_json_atomic(
            self.path / META,
            {
                "stage": self.name,
                "fingerprint": fingerprint,
                "settings": settings,
                "expected_examples": expected,
                "started": time.time(),
                "environment": environment or {},
            },
        )
        # a rejects file without its data file is a shard cut short: drop it
        for rej in self.path.glob("rejects-*.jsonl"):
            if not (self.path / rej.name.replace("rejects-", "data-")).exists():
                rej.unlink()

    def finish(self, stats: dict[str, Any]) -> None:
        write_json_atomic(self.path / "stats.json", stats)
        write_json_atomic(
            self.path / MARKER,
            {"fingerprint": self.meta["fingerprint"] if self.meta else None, "time": time.time()},
        )

    def clear(self) -> None:
        """Remove the folder; renamed first so a crash never leaves a half-deleted stage."""
        if not self.path.exists():
            return
        trash = self.path.with_name(f".trash-{self.name}-{time.time_ns()}")
        self.path.rename(trash)
        shutil.rmtree(trash, ignore_errors=True)

    # ---- shards ------------------------------------------------------------------
    def shard_ids(self) -> list[int]:
        if not self.path.exists():
            return []
        ids = [int(m.group(1)) for p in self.path.iterdir() if (m := _SHARD_RE.match(p.name))]
        return sorted(ids)

    def write_shard(self, rows: Iterable[dict], rejects: Iterable[dict] = ()) -> int:
        ids = self.shard_ids()
        n = (ids[-1] + 1) if ids else 0
        write_jsonl_atomic(self.path / f"rejects-{n:05d}.jsonl", rejects)
        write_jsonl_atomic(self.path / f"data-{n:05d}.jsonl", rows)
        return n

    def rows(self) -> Iterator[dict]:
        for n in self.shard_ids():
            yield from read_jsonl(self.path / f"data-{n:05d}.jsonl")

    def rejects(self) -> Iterator[dict]:
        for n in self.shard_ids():
            p = self.path / f"rejects-{n:05d}.jsonl"
            if p.exists():
                yield from read_jsonl(p)

    def done_examples(self) -> set[str]:
        """Example ids that already have a final outcome (kept or rejected) on disk."""
        seen = {r["example_id"] for r in self.rows()}
        seen.update(r["example_id"] for r in self.rejects())
        return seen

    def status(self) -> tuple[str, int, int | None]:
        """(state, examples done, examples expected)."""
        if not self.path.exists():
            return "not started", 0, None
        meta = self.meta or {}
        expected = meta.get("expected_examples")
        done = len(self.done_examples())
        if self.done:
            return "done", done, expected
        return "partial", done, expected


class RunDir:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def stage(self, name: str) -> StageDir:
        return StageDir(self.path / name)

    @property
    def cache_path(self) -> Path:
        return self.path / "cache.sqlite"

    @property
    def config_path(self) -> Path:
        return self.path / "run.yaml"
