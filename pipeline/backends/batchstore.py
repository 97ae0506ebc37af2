"""What `prb batch` keeps between its commands, in one SQLite file of the run directory
(``RunDir.batch_state``): the requests exported (what an import may answer), the answers
imported (what the batchfile backend hands the runner), and the ids of the result lines
read (so a file imported twice adds nothing).

An imported answer is not the cache: the runner still validates it, caches it if it is
valid and re-asks if not, exactly as for an answer from a server. An answer stays here
after that, so that a re-run builds the same re-ask from the same invalid answer; one whose
request the runner gave up on is retired, so the next export asks that request afresh,
as the next `prb run` would send it again.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from pipeline.core.errors import BackendError
from pipeline.core.io import dumps, loads
from pipeline.types.chat import ChatRequest, ChatResult

_SCHEMA = """
CREATE TABLE IF NOT EXISTS asked (
    key TEXT PRIMARY KEY,
    stage TEXT NOT NULL,
    request TEXT NOT NULL,
    file TEXT NOT NULL,
    created REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS answers (
    key TEXT PRIMARY KEY,
    response TEXT NOT NULL,
    source TEXT NOT NULL,
    retired INTEGER NOT NULL DEFAULT 0,
    created REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS lines (
    line_id TEXT PRIMARY KEY,
    source TEXT NOT NULL,
    created REAL NOT NULL
);
"""
_CHUNK = 900  # below SQLite's default limit of 999 bound parameters


def request_from_dict(d: dict[str, Any]) -> ChatRequest:
    """The request ``ChatRequest.to_dict`` wrote (its key is the same)."""
    return ChatRequest(
        messages=tuple((m["role"], m["content"]) for m in d["messages"]),
        model=d["model"],
        temperature=d["temperature"],
        top_p=d["top_p"],
        max_tokens=d["max_tokens"],
        n=d["n"],
        seed=d["seed"],
        json_schema=d["json_schema"],
        schema_name=d["schema_name"] or "answer",
        served_by=d["served_by"],
        reasoning_budget=d.get("reasoning_budget"),
    )


class BatchState:
    """The state file; ``create``: make it (and its folder) when it is not there."""

    def __init__(self, path: Path, *, create: bool = False) -> None:
        self.path = Path(path)
        if not create and not self.path.exists():
            self._db: sqlite3.Connection | None = None
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(str(self.path), isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.executescript(_SCHEMA)
        except sqlite3.Error as exc:
            raise self._damaged(exc) from None

    def _damaged(self, exc: Exception) -> BackendError:
        return BackendError(
            f"{self.path}: cannot be read as prb batch's state ({exc}); move it away and "
            "export again (answers already in cache.sqlite are kept)"
        )

    @contextlib.contextmanager
    def _guard(self) -> Iterator[sqlite3.Connection]:
        assert self._db is not None
        try:
            yield self._db
        except sqlite3.Error as exc:
            raise self._damaged(exc) from None

    def _by_keys(self, sql: str, keys: Iterable[str]) -> list[tuple[Any, ...]]:
        if self._db is None:
            return []
        keys = list(dict.fromkeys(keys))
        out: list[tuple[Any, ...]] = []
        with self._guard() as db:
            for i in range(0, len(keys), _CHUNK):
                part = keys[i : i + _CHUNK]
                marks = ",".join("?" * len(part))
                out += db.execute(sql.format(marks=marks), part).fetchall()
        return out

    def _write(self, sql: str, rows: Sequence[tuple[Any, ...]]) -> None:
        with self._guard() as db:
            db.execute("BEGIN IMMEDIATE")
            try:
                db.executemany(sql, rows)
                db.execute("COMMIT")
            except BaseException:
                with contextlib.suppress(sqlite3.Error):
                    db.execute("ROLLBACK")
                raise

    # ---- requests exported ---------------------------------------------------------
    def record_asked(self, items: Sequence[tuple[ChatRequest, str]], file: str) -> None:
        """Record ``(request, stage)`` pairs written to the batch file ``file``."""
        now = time.time()
        rows = [(r.key, st, dumps(r.to_dict()).decode("utf-8"), file, now) for r, st in items]
        self._write(
            "INSERT OR REPLACE INTO asked(key, stage, request, file, created) VALUES (?,?,?,?,?)",
            rows,
        )

    def asked(self) -> dict[str, ChatRequest]:
        """custom_id -> request, of every request exported for this run."""
        if self._db is None:
            return {}
        with self._guard() as db:
            rows = db.execute("SELECT key, request FROM asked").fetchall()
        out: dict[str, ChatRequest] = {}
        for key, text in rows:
            try:
                req = request_from_dict(json.loads(text))
            except (ValueError, KeyError, TypeError):
                continue  # a row this version cannot read: its answers are "not asked"
            if req.key == key:
                out[key] = req
        return out

    # ---- answers imported ----------------------------------------------------------
    def answers(self, keys: Iterable[str]) -> dict[str, ChatResult]:
        """The imported answers (not retired) of those keys that have one."""
        sql = "SELECT key, response FROM answers WHERE retired=0 AND key IN ({marks})"
        return {k: ChatResult.from_dict(loads(r)) for k, r in self._by_keys(sql, keys)}

    def seen_lines(self, line_ids: Iterable[str]) -> set[str]:
        """Those of ``line_ids`` read by an earlier import."""
        sql = "SELECT line_id FROM lines WHERE line_id IN ({marks})"
        return {k for (k,) in self._by_keys(sql, line_ids)}

    def store(
        self, answers: Sequence[tuple[str, ChatResult, str]], line_ids: Sequence[tuple[str, str]]
    ) -> None:
        """Keep ``(custom_id, result, source)`` answers and the ``(line_id, source)`` of
        every line read, in one transaction: an import is kept whole or not at all."""
        now = time.time()
        with self._guard() as db:
            db.execute("BEGIN IMMEDIATE")
            try:
                db.executemany(
                    "INSERT OR REPLACE INTO answers(key, response, source, retired, created) "
                    "VALUES (?,?,?,0,?)",
                    [(k, dumps(r.to_dict()).decode("utf-8"), s, now) for k, r, s in answers],
                )
                db.executemany(
                    "INSERT OR IGNORE INTO lines(line_id, source, created) VALUES (?,?,?)",
                    [(i, s, now) for i, s in line_ids],
                )
                db.execute("COMMIT")
            except BaseException:
                with contextlib.suppress(sqlite3.Error):
                    db.execute("ROLLBACK")
                raise

    def retire(self, keys: Iterable[str]) -> None:
        """Stop handing out these answers: their requests go out again."""
        if self._db is None:
            return
        self._write("UPDATE answers SET retired=1 WHERE key=?", [(k,) for k in set(keys)])

    def close(self) -> None:
        if self._db is not None:
            with contextlib.suppress(sqlite3.Error):
                self._db.close()
            self._db = None

    def __enter__(self) -> BatchState:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
