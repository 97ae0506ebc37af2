"""The LLM request cache: one SQLite file per run, keyed by a hash of the full request.

Each answer is committed as it arrives (WAL journal), so a run killed at any point
keeps every finished request; a re-run sends only what is missing. Failures go to a
separate table: they are never served as answers and are retried on the next run.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterable
from pathlib import Path

from pipeline.backends.base import ChatRequest, ChatResult

_SCHEMA = """
CREATE TABLE IF NOT EXISTS responses (
    key TEXT PRIMARY KEY,
    stage TEXT NOT NULL,
    request TEXT NOT NULL,
    response TEXT NOT NULL,
    created REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS errors (
    key TEXT NOT NULL,
    stage TEXT NOT NULL,
    reason TEXT NOT NULL,
    attempts INTEGER NOT NULL,
    created REAL NOT NULL
);
"""


class RequestCache:
    def __init__(self, path: str | Path, readonly: bool = False) -> None:
        self.path = Path(path)
        if readonly:
            if not self.path.exists():
                raise FileNotFoundError(self.path)
            self._db = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True)
        else:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # autocommit mode: each put is its own transaction, durable on return
            self._db = sqlite3.connect(self.path, isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL")
            # NORMAL in WAL mode survives a killed process (not a power cut) and keeps
            # commits cheap enough to make one per answer.
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.executescript(_SCHEMA)

    def get(self, key: str) -> ChatResult | None:
        row = self._db.execute("SELECT response FROM responses WHERE key=?", (key,)).fetchone()
        return ChatResult.from_dict(json.loads(row[0])) if row else None

    def get_many(self, keys: Iterable[str]) -> dict[str, ChatResult]:
        keys = list(dict.fromkeys(keys))
        found: dict[str, ChatResult] = {}
        for i in range(0, len(keys), 500):
            chunk = keys[i : i + 500]
            marks = ",".join("?" * len(chunk))
            for k, resp in self._db.execute(
                f"SELECT key, response FROM responses WHERE key IN ({marks})", chunk
            ):
                found[k] = ChatResult.from_dict(json.loads(resp))
        return found

    def put(self, request: ChatRequest, result: ChatResult, stage: str) -> None:
        self._db.execute(
            "INSERT OR IGNORE INTO responses(key, stage, request, response, created) "
            "VALUES (?,?,?,?,?)",
            (
                request.key,
                stage,
                json.dumps(request.to_dict(), ensure_ascii=False),
                json.dumps(result.to_dict(), ensure_ascii=False),
                time.time(),
            ),
        )

    def put_error(self, request: ChatRequest, stage: str, reason: str, attempts: int) -> None:
        self._db.execute(
            "INSERT INTO errors(key, stage, reason, attempts, created) VALUES (?,?,?,?,?)",
            (request.key, stage, reason, attempts, time.time()),
        )

    def count(self, stage: str | None = None) -> int:
        if stage is None:
            return self._db.execute("SELECT COUNT(*) FROM responses").fetchone()[0]
        return self._db.execute(
            "SELECT COUNT(*) FROM responses WHERE stage=?", (stage,)
        ).fetchone()[0]

    def errors(self, stage: str | None = None) -> list[dict]:
        q = "SELECT key, stage, reason, attempts, created FROM errors"
        args: tuple = ()
        if stage is not None:
            q += " WHERE stage=?"
            args = (stage,)
        cols = ("key", "stage", "reason", "attempts", "created")
        return [dict(zip(cols, r, strict=True)) for r in self._db.execute(q, args)]

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> RequestCache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
