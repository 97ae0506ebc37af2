"""The LLM request cache: one SQLite file per run, keyed by a hash of the full request.

Answers are committed in small batches, and the runner acknowledges an answer (to the
stage and the progress display) only after its batch is committed, so a run killed at
any point keeps every answer it reported; a re-run sends only what is missing. WAL
journal with synchronous=NORMAL survives a killed process (not a power cut) and keeps a
commit cheap.

Failures go to a separate table: they are never served as answers and are retried on the
next run. That includes answers that were still invalid after their re-asks: such an
answer is recorded as an error with its reason, never stored as an answer.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from pipeline.core.cliargs import command_line
from pipeline.core.errors import CacheError
from pipeline.core.io import crash_point, dumps, loads
from pipeline.core.redact import redact
from pipeline.types.chat import ChatRequest, ChatResult

# Every table a request cache of prb's holds, in any version (pipeline/run/rundir.py tells
# an older run's cache.sqlite from a user's database by them); SQLite's own tables beside.
TABLES = frozenset({"responses", "errors", "derived", "backends", "ledger", "ledger_state"})
SQLITE_TABLES = frozenset({"sqlite_sequence", "sqlite_stat1", "sqlite_stat4"})

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
CREATE INDEX IF NOT EXISTS errors_key ON errors(key);
CREATE TABLE IF NOT EXISTS derived (
    key TEXT PRIMARY KEY,
    kind TEXT NOT NULL,
    value TEXT NOT NULL,
    created REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS backends (
    id TEXT PRIMARY KEY,
    identity TEXT NOT NULL,
    created REAL NOT NULL
);
"""
# The ledger's totals per (stage, served_by), added to as answers are stored (put_many),
# so that reading them is a few rows, not a scan of every stored request (at 100,000
# examples the scan read 16 GB after every LLM stage). ``ledger_state.covered`` is the
# largest responses rowid they count: totals behind the table (a cache written by an
# older version) are seen, and recomputed by _LEDGER_SCAN, which defines them.
_LEDGER_DDL = (
    "CREATE TABLE IF NOT EXISTS ledger (stage TEXT NOT NULL, served_by TEXT, "
    "answers INTEGER NOT NULL, choices INTEGER NOT NULL, prompt_tokens INTEGER NOT NULL, "
    "completion_tokens INTEGER NOT NULL, reasks INTEGER NOT NULL, first REAL, last REAL)",
    "CREATE TABLE IF NOT EXISTS ledger_state (covered INTEGER NOT NULL)",
)
_LEDGER_COLUMNS = (
    "stage",
    "served_by",
    "answers",
    "choices",
    "prompt_tokens",
    "completion_tokens",
    "reasks",
    "first",
    "last",
)
_ASSISTANT_TURN = '"role":"assistant"'
# what the stored answers add up to, from their rows: the definition the kept totals follow
_LEDGER_SCAN = (
    "SELECT stage, json_extract(request, '$.served_by'), COUNT(*), "
    "COALESCE(SUM(json_array_length(response, '$.choices')), 0), "
    "COALESCE(SUM(json_extract(response, '$.prompt_tokens')), 0), "
    "COALESCE(SUM(json_extract(response, '$.completion_tokens')), 0), "
    f"COALESCE(SUM(instr(request, '{_ASSISTANT_TURN}') > 0 "
    "OR COALESCE(json_extract(request, '$.reask'), 0) > 0), 0), MIN(created), MAX(created) "
    "FROM responses {where} GROUP BY 1, 2 ORDER BY 1, 2"
)


def _ledger_adds(request: dict[str, Any], request_text: str, response: dict[str, Any]) -> tuple:
    """(choices, prompt tokens, completion tokens, re-asks) that one stored answer adds to
    its ledger row: _LEDGER_SCAN's sums for that one row, from what put_many stores."""
    choices = response.get("choices")
    reask = _ASSISTANT_TURN in request_text or (request.get("reask") or 0) > 0
    return (
        len(choices) if isinstance(choices, list) else 0,
        int(response.get("prompt_tokens") or 0),
        int(response.get("completion_tokens") or 0),
        int(reask),
    )


def _max_rowid(db: sqlite3.Connection) -> int:
    return db.execute("SELECT COALESCE(MAX(rowid), 0) FROM responses").fetchone()[0]


def _ledger_covered(db: sqlite3.Connection) -> int | None:
    """The responses rowid the kept totals count up to; None without them."""
    try:
        row = db.execute("SELECT covered FROM ledger_state").fetchone()
    except sqlite3.OperationalError:  # a cache from before the totals were kept
        return None
    return row[0] if row else None


@contextlib.contextmanager
def _transaction(db: sqlite3.Connection) -> Iterator[None]:
    """One write transaction on an autocommit connection: committed on leaving, rolled back
    on any exception (a killed process leaves the last commit, SQLite's journal sees to it)."""
    db.execute("BEGIN IMMEDIATE")
    try:
        yield
        db.execute("COMMIT")
    except BaseException:
        with contextlib.suppress(sqlite3.Error):
            db.execute("ROLLBACK")
        raise


def _rebuild_ledger(db: sqlite3.Connection) -> None:
    """Compute the kept totals from every stored answer (one scan), in the caller's
    transaction."""
    for ddl in _LEDGER_DDL:
        db.execute(ddl)
    db.execute("DELETE FROM ledger")
    db.execute("DELETE FROM ledger_state")
    db.execute(f"INSERT INTO ledger({', '.join(_LEDGER_COLUMNS)}) {_LEDGER_SCAN.format(where='')}")
    db.execute("INSERT INTO ledger_state(covered) VALUES (?)", (_max_rowid(db),))


# Reasons of answers that arrived but stayed invalid after their re-asks.
INVALID_PREFIX = "invalid_json"
_LOOKUP_CHUNK = 900  # below SQLite's default limit of 999 bound parameters


def repair_command(path: Path) -> str:
    """The command that repairs this cache: its run directory, shell-quoted."""
    return command_line(["prb", "cache", "repair", path.parent])


class RequestCache:
    def __init__(self, path: str | Path, readonly: bool = False) -> None:
        self.path = Path(path)
        self.readonly = readonly
        with self._guard("open"):
            if readonly:
                if not self.path.exists():
                    raise FileNotFoundError(self.path)
                # Without a write-ahead log on disk the file is the whole database: opened
                # immutable, SQLite creates no -wal/-shm beside it, so a read-only command
                # (`prb plan`, `prb status`) leaves the run as it found it. A log on disk
                # (a run in progress or killed) holds answers: read through it then.
                from urllib.parse import quote

                wal = Path(f"{self.path}-wal").exists()
                uri = f"file:{quote(str(self.path))}?mode=ro" + ("" if wal else "&immutable=1")
                self._db = sqlite3.connect(uri, uri=True)
                # reading the schema touches the header and the first pages: a damaged
                # file fails here, with the repair command, instead of mid-command
                self._db.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()
            else:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                # autocommit: transactions are explicit (put_many), everything else is
                # a single statement
                self._db = sqlite3.connect(self.path, isolation_level=None)
                self._db.execute("PRAGMA journal_mode=WAL")
                self._db.execute("PRAGMA synchronous=NORMAL")
                self._db.executescript(_SCHEMA)
                if _ledger_covered(self._db) is None and _max_rowid(self._db) == 0:
                    # a new cache keeps its totals from its first answer; an older one
                    # has them computed when they are first read (one scan)
                    with _transaction(self._db):
                        _rebuild_ledger(self._db)

    @contextlib.contextmanager
    def _guard(self, action: str) -> Iterator[None]:
        """Turn SQLite failures into one-line errors that say what to do."""
        try:
            yield
        except sqlite3.DatabaseError as exc:
            msg = str(exc)
            if "locked" in msg or "busy" in msg:
                what = "is locked by another process; wait for it to finish and run again"
            elif "full" in msg:
                what = f"cannot grow ({msg}); free disk space and run the same command again"
            elif "readonly" in msg or "read-only" in msg:
                what = f"is not writable ({msg}); fix the folder's permissions and run again"
            else:
                what = (
                    f"is damaged ({msg}); run `{repair_command(self.path)}` to salvage what "
                    "it holds (finished stages do not need it)"
                )
            raise CacheError(
                f"{self.path}: {action}: the request cache {what}", path=self.path
            ) from None

    def check(self) -> None:
        """Read every page (SQLite's quick_check): a damaged file fails here, with the
        repair command, rather than halfway through a stage."""
        with self._guard("check"):
            verdict = self._db.execute("PRAGMA quick_check(1)").fetchone()[0]
        if verdict != "ok":
            detail = " ".join(str(verdict).split())[:120]
            raise CacheError(
                f"{self.path}: check: the request cache is damaged ({detail}); run "
                f"`{repair_command(self.path)}` to salvage what it holds (finished stages do "
                "not need it)",
                path=self.path,
            )

    def _by_keys(self, sql: str, keys: Iterable[str]) -> list[tuple[Any, ...]]:
        """Rows of ``sql`` (a query with ``{marks}`` in its ``key IN (...)``) for the
        distinct keys, in chunks below SQLite's limit of bound parameters."""
        keys = list(dict.fromkeys(keys))
        out: list[tuple[Any, ...]] = []
        with self._guard("read"):
            for i in range(0, len(keys), _LOOKUP_CHUNK):
                chunk = keys[i : i + _LOOKUP_CHUNK]
                out.extend(self._db.execute(sql.format(marks=",".join("?" * len(chunk))), chunk))
        return out

    def _commit(
        self,
        sql: str,
        rows: Sequence[tuple[Any, ...]],
        label: str,
        then: Callable[[int], None] | None = None,
    ) -> None:
        """``executemany`` in one transaction, durable (against a killed process) on return;
        failpoints before and after it. ``then(rowid)``: more writes in the same
        transaction, given the largest rowid of ``sql``'s table before it ran."""
        with self._guard("write"):
            crash_point(f"before {label}")
            with _transaction(self._db):
                before = _max_rowid(self._db) if then is not None else 0
                self._db.executemany(sql, rows)
                if then is not None:
                    then(before)
            crash_point(f"after {label}")

    # ---- answers -------------------------------------------------------------------
    def get(self, key: str) -> ChatResult | None:
        return self.get_many([key]).get(key)

    def get_many(self, keys: Iterable[str]) -> dict[str, ChatResult]:
        rows = self._by_keys("SELECT key, response FROM responses WHERE key IN ({marks})", keys)
        return {k: ChatResult.from_dict(loads(resp)) for k, resp in rows}

    def present(self, keys: Iterable[str]) -> set[str]:
        """The keys among ``keys`` that have an answer (nothing is parsed: `prb plan`
        checks a whole run's requests with it)."""
        rows = self._by_keys("SELECT key FROM responses WHERE key IN ({marks})", keys)
        return {k for (k,) in rows}

    def put(self, request: ChatRequest, result: ChatResult, stage: str) -> None:
        self.put_many([(request, result, stage)])

    def put_many(self, items: Sequence[tuple[Any, ...]]) -> None:
        """Commit answers, each ``(request, result, stage)`` or ``(request, result, stage,
        re-asks)``, in one transaction; durable (against a killed process) on return. The
        re-ask count is kept beside the request (``"reask"``, not part of its key) for the
        ledger: a free-text retry carries no earlier answer to tell it by."""
        if not items:
            return
        now = time.time()
        rows = []
        adds: dict[str, tuple[str, Any, tuple]] = {}  # key -> (stage, served_by, adds)
        for item in items:
            req, res, stage = item[:3]
            request = req.to_dict()
            if len(item) > 3 and item[3]:
                request["reask"] = item[3]
            request_text = dumps(request).decode("utf-8")
            response = res.to_dict()
            rows.append((req.key, stage, request_text, dumps(response).decode("utf-8"), now))
            # INSERT OR IGNORE keeps a key's first row: so do the totals
            adds.setdefault(
                req.key,
                (stage, request.get("served_by"), _ledger_adds(request, request_text, response)),
            )

        def count(before: int) -> None:
            self._add_to_ledger(before, adds, now)

        self._commit(
            "INSERT OR IGNORE INTO responses(key, stage, request, response, created) "
            "VALUES (?,?,?,?,?)",
            rows,
            "cache commit",
            then=count,
        )

    def _add_to_ledger(
        self, before: int, adds: dict[str, tuple[str, Any, tuple]], now: float
    ) -> None:
        """Add the answers stored above rowid ``before`` to the kept totals, when those
        counted every answer up to it; otherwise leave them behind (ledger() recomputes)."""
        if _ledger_covered(self._db) != before:
            return
        after = _max_rowid(self._db)
        if after == before:
            return
        stored: Iterable[str] = adds.keys()
        if after - before != len(adds):  # some keys were there already
            stored = {
                k
                for (k,) in self._db.execute("SELECT key FROM responses WHERE rowid > ?", (before,))
            }
        groups: dict[tuple[str, Any], list[int]] = {}
        for key in stored:
            stage, served_by, (choices, prompt, completion, reask) = adds[key]
            total = groups.setdefault((stage, served_by), [0, 0, 0, 0, 0])
            for i, v in enumerate((1, choices, prompt, completion, reask)):
                total[i] += v
        for (stage, served_by), (n, choices, prompt, completion, reasks) in groups.items():
            updated = self._db.execute(
                "UPDATE ledger SET answers = answers + ?, choices = choices + ?, "
                "prompt_tokens = prompt_tokens + ?, completion_tokens = completion_tokens + ?, "
                "reasks = reasks + ?, first = MIN(first, ?), last = MAX(last, ?) "
                "WHERE stage = ? AND served_by IS ?",
                (n, choices, prompt, completion, reasks, now, now, stage, served_by),
            ).rowcount
            if not updated:
                self._db.execute(
                    f"INSERT INTO ledger({', '.join(_LEDGER_COLUMNS)}) VALUES (?,?,?,?,?,?,?,?,?)",
                    (stage, served_by, n, choices, prompt, completion, reasks, now, now),
                )
        self._db.execute("UPDATE ledger_state SET covered = ?", (after,))

    # ---- what answered -------------------------------------------------------------
    # Every request carries the id of the backend that answers it (ChatRequest.served_by);
    # the identity behind each id is kept here, so a replay knows whose answers it holds.
    def put_backend(self, ident_id: str, identity: dict[str, Any]) -> None:
        with self._guard("write"):
            self._db.execute(
                "INSERT OR IGNORE INTO backends(id, identity, created) VALUES (?,?,?)",
                (ident_id, dumps(identity).decode("utf-8"), time.time()),
            )

    def backends(self) -> dict[str, dict[str, Any]]:
        """id -> identity of every backend that answered into this cache."""
        with self._guard("read"):
            try:
                rows = self._db.execute("SELECT id, identity FROM backends").fetchall()
            except sqlite3.OperationalError:  # a cache from before identities were kept
                return {}
        return {k: loads(v) for k, v in rows}

    # ---- derived results -------------------------------------------------------------
    # Deterministic computations too costly to repeat on every re-run (the donor search
    # compares every question with hundreds of others), stored under a hash of their whole
    # input like an LLM answer: a changed input is a new key, never a stale value.
    def get_derived(self, key: str) -> Any:
        with self._guard("read"):
            row = self._db.execute("SELECT value FROM derived WHERE key=?", (key,)).fetchone()
        return loads(row[0]) if row else None

    def put_derived(self, key: str, kind: str, value: Any) -> None:
        with self._guard("write"):
            self._db.execute(
                "INSERT OR REPLACE INTO derived(key, kind, value, created) VALUES (?,?,?,?)",
                (key, kind, dumps(value).decode("utf-8"), time.time()),
            )

    def get_derived_many(self, keys: Iterable[str]) -> dict[str, Any]:
        """The stored values of those keys that have one, in batched lookups."""
        rows = self._by_keys("SELECT key, value FROM derived WHERE key IN ({marks})", keys)
        return {k: loads(value) for k, value in rows}

    def put_derived_many(self, items: Sequence[tuple[str, str, Any]]) -> None:
        """Store ``(key, kind, value)`` results in one transaction."""
        if not items:
            return
        now = time.time()
        rows = [(k, kind, dumps(v).decode("utf-8"), now) for k, kind, v in items]
        self._commit(
            "INSERT OR REPLACE INTO derived(key, kind, value, created) VALUES (?,?,?,?)",
            rows,
            "derived commit",
        )

    # ---- failures ------------------------------------------------------------------
    def put_error(self, request: ChatRequest, stage: str, reason: str, attempts: int) -> None:
        self.put_errors([(request, stage, reason, attempts)])

    def put_errors(self, items: Sequence[tuple[ChatRequest, str, str, int]]) -> None:
        if not items:
            return
        now = time.time()
        # error text comes from servers and may echo a key: mask secrets before storing
        rows = [(r.key, st, redact(reason)[:1000], att, now) for r, st, reason, att in items]
        with self._guard("write"):
            self._db.executemany(
                "INSERT INTO errors(key, stage, reason, attempts, created) VALUES (?,?,?,?,?)",
                rows,
            )

    def invalid_failures(self, keys: Iterable[str]) -> dict[str, int]:
        """How many earlier runs recorded each key's answer as invalid after re-asks."""
        sql = (
            "SELECT key, COUNT(*) FROM errors WHERE key IN ({marks}) "
            f"AND reason LIKE '{INVALID_PREFIX}%' GROUP BY key"
        )
        return dict(self._by_keys(sql, keys))

    # ---- summaries -----------------------------------------------------------------
    def count(self, stage: str | None = None) -> int:
        with self._guard("read"):
            if stage is None:
                return self._db.execute("SELECT COUNT(*) FROM responses").fetchone()[0]
            return self._db.execute(
                "SELECT COUNT(*) FROM responses WHERE stage=?", (stage,)
            ).fetchone()[0]

    def counts_by_stage(self) -> dict[str, dict[str, int]]:
        """{stage: {"answers": n, "errors": n, "failed_keys": n}} for ``prb status``."""
        out: dict[str, dict[str, int]] = {}
        with self._guard("read"):
            for stage, n in self._db.execute(
                "SELECT stage, COUNT(*) FROM responses GROUP BY stage"
            ):
                out.setdefault(stage, {"answers": 0, "errors": 0, "failed_keys": 0})["answers"] = n
            for stage, n, k in self._db.execute(
                "SELECT stage, COUNT(*), COUNT(DISTINCT key) FROM errors GROUP BY stage"
            ):
                entry = out.setdefault(stage, {"answers": 0, "errors": 0, "failed_keys": 0})
                entry["errors"], entry["failed_keys"] = n, k
        return out

    # ---- the ledger (read-only; pipeline/engine/budget.py) ------------------------------------
    def ledger(self, stage: str | None = None) -> list[dict[str, Any]]:
        """What was received, as the cache holds it: per stage and answering backend
        (``served_by``, the id every request carries), the answers, their choices, prompt
        and output tokens, the re-asks among them (requests that carry an earlier answer,
        i.e. an assistant turn: the stages' templates have none) and the first and last
        answer's time. Answers that never validated are not stored, so they are missing
        here; failures are in :meth:`counts_by_stage`. ``stage``: that stage's only."""
        with self._guard("read"):
            rows = self._ledger_rows(stage)
        return [dict(zip(_LEDGER_COLUMNS, r, strict=True)) for r in rows]

    def _ledger_rows(self, stage: str | None) -> list[tuple[Any, ...]]:
        """The kept totals when they count every stored answer; otherwise they are
        recomputed (a writable cache: one scan, kept after) or the scan is the answer
        (read-only)."""
        db = self._db
        if _ledger_covered(db) != _max_rowid(db):
            if self.readonly:
                where, args = ("WHERE stage = ?", (stage,)) if stage is not None else ("", ())
                return db.execute(_LEDGER_SCAN.format(where=where), args).fetchall()
            with _transaction(db):
                _rebuild_ledger(db)
        sql = f"SELECT {', '.join(_LEDGER_COLUMNS)} FROM ledger"
        if stage is not None:
            return db.execute(f"{sql} WHERE stage = ? ORDER BY 1, 2", (stage,)).fetchall()
        return db.execute(f"{sql} ORDER BY 1, 2").fetchall()

    def prompt_sample(self, served_by: str, limit: int = 500) -> list[tuple[str, int]]:
        """(request JSON, prompt tokens) of up to ``limit`` first-attempt answers of one
        backend: what a characters-per-token estimate is calibrated on."""
        mark = f'"served_by":"{served_by}"'
        sql = (
            "SELECT request, json_extract(response, '$.prompt_tokens') FROM responses "
            'WHERE instr(request, ?) > 0 AND instr(request, \'"role":"assistant"\') = 0 '
            "ORDER BY rowid LIMIT ?"
        )
        with self._guard("read"):
            rows = self._db.execute(sql, (mark, limit)).fetchall()
        return [(req, int(tok or 0)) for req, tok in rows]

    def errors(self, stage: str | None = None) -> list[dict]:
        q = "SELECT key, stage, reason, attempts, created FROM errors"
        args: tuple = ()
        if stage is not None:
            q += " WHERE stage=?"
            args = (stage,)
        cols = ("key", "stage", "reason", "attempts", "created")
        with self._guard("read"):
            return [dict(zip(cols, r, strict=True)) for r in self._db.execute(q, args)]

    def close(self) -> None:
        with contextlib.suppress(sqlite3.Error):
            self._db.close()

    def __enter__(self) -> RequestCache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def repair_cache(path: str | Path) -> dict[str, Any]:
    """Copy every readable row of a damaged cache into a fresh file, keep the damaged one
    beside it, and say what was saved. Rows are read in rowid ranges, so one bad page
    loses the rows on it, not the rest."""
    path = Path(path)
    if not path.exists():
        raise CacheError(f"{path}: no such cache file", path=path)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    fresh = path.with_name(f".{path.name}.repair.tmp")
    for p in (fresh, Path(f"{fresh}-wal"), Path(f"{fresh}-shm")):
        p.unlink(missing_ok=True)
    saved = {"responses": 0, "errors": 0}
    unreadable = 0
    try:
        src = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    except sqlite3.Error:
        src = None
    dst = sqlite3.connect(fresh, isolation_level=None)
    dst.executescript(_SCHEMA)
    columns = {
        "responses": "key, stage, request, response, created",
        "errors": "key, stage, reason, attempts, created",
    }
    for table, cols in columns.items():
        if src is None:
            break
        try:
            top = src.execute(f"SELECT MAX(rowid) FROM {table}").fetchone()[0] or 0
        except sqlite3.Error:
            top = 1_000_000  # the index is unreadable: probe ranges up to a bound
            unreadable += 1
        step = 512
        start = 0
        while start <= top:
            try:
                rows = src.execute(
                    f"SELECT {cols} FROM {table} WHERE rowid > ? AND rowid <= ?",
                    (start, start + step),
                ).fetchall()
            except sqlite3.Error:
                unreadable += 1
                start += step
                continue
            marks = ",".join("?" * len(cols.split(",")))
            verb = "INSERT OR IGNORE" if table == "responses" else "INSERT"
            dst.executemany(f"{verb} INTO {table}({cols}) VALUES ({marks})", rows)
            saved[table] += len(rows)
            start += step
    if src is not None:
        src.close()
    with _transaction(dst):
        _rebuild_ledger(dst)
    dst.close()
    damaged = path.with_name(f"{path.name}.damaged-{stamp}")
    os.replace(path, damaged)
    for suffix in ("-wal", "-shm"):
        side = Path(f"{path}{suffix}")
        if side.exists():
            os.replace(side, Path(f"{damaged}{suffix}"))
    os.replace(fresh, path)
    return {"path": str(path), "damaged_copy": str(damaged), "saved": saved,
            "unreadable_ranges": unreadable}  # fmt: skip
