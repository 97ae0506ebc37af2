"""One stage folder of a run: its metadata, its shards and their manifest.

A stage folder holds ``stage.json`` (its fingerprint and settings, written first), JSONL
shards ``data-NNNNN.jsonl`` and ``rejects-NNNNN.jsonl``, ``stats.json``, and the
completion marker ``_DONE.json``, written last. A shard's data file is written after its
rejects file, so a data file on disk means the whole shard is there.

The marker is a manifest: every shard file with its row count, size and sha256. A
finished stage is verified against it before anything reads it (:meth:`StageDir.verified`),
so a shard cut short, edited or lost is reported (with the command that re-does the
stage) instead of silently shrinking every later stage or a release.
"""

from __future__ import annotations

import contextlib
import itertools
import shutil
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from pipeline.core.errors import RunDirError, StageError
from pipeline.core.ids import content_hash
from pipeline.core.io import (
    crash_point,
    file_digest,
    loads,
    read_json,
    write_json_atomic,
    write_jsonl_atomic,
)
from pipeline.run import layout
from pipeline.run.meta import Marker, StageMeta, Stats, read_meta


def redo_hint(stage: str) -> str:
    return f"re-do the stage with `prb run CONFIG --redo {stage}` (cached answers are reused)"


def run_hint(stage: str) -> str:
    return f"run the pipeline through it with `prb run CONFIG --until {stage}`"


class StageDir:
    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.name = self.path.name
        # Fields every data row must carry (the stage's declared writes); checked on the
        # first shard this process writes, so a stage that breaks its contract fails at
        # once instead of at the next stage.
        self.contract: set[str] | None = None
        self._contract_checked = False

    # ---- metadata ----------------------------------------------------------------------
    @property
    def meta(self) -> StageMeta | None:
        """``stage.json``; None before the stage first ran."""
        return read_meta(self.path / layout.STAGE_META, StageMeta, redo_hint(self.name))

    @property
    def interrupted_clear(self) -> bool:
        """Whether a clear of this stage was killed half-way (see :meth:`clear`)."""
        meta = self.meta
        return meta is not None and meta.fingerprint == layout.CLEARING

    @property
    def done(self) -> bool:
        return (self.path / layout.STAGE_MARKER).exists()

    def marker(self) -> Marker | None:
        """``_DONE.json``; None while the stage has not finished."""
        return read_meta(self.path / layout.STAGE_MARKER, Marker, redo_hint(self.name))

    def content_id(self) -> str | None:
        """Identity of the finished stage's data: the hash of its manifest (None while it
        has not finished)."""
        marker = self.marker()
        if marker is None or marker.files is None:
            return None
        return content_hash({k: v.model_dump() for k, v in marker.files.items()}, length=16)

    def stats(self) -> dict[str, Any]:
        """``stats.json`` as a dict (empty when there is none yet)."""
        got = read_meta(self.path / layout.STAGE_STATS, Stats, redo_hint(self.name))
        return got.model_dump() if got is not None else {}

    def write_stats(self, stats: dict[str, Any]) -> None:
        write_json_atomic(self.path / layout.STAGE_STATS, stats)

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
            self.path / layout.STAGE_META,
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

    def manifest(self) -> dict[str, dict[str, Any]]:
        """Every shard file with its row count, size and sha256, as they are on disk."""
        files: dict[str, dict[str, Any]] = {}
        for p in sorted(self.path.iterdir()):
            if not layout.SHARD_RE.match(p.name):
                continue
            sha, size, rows = file_digest(p)
            files[p.name] = {"rows": rows, "bytes": size, "sha256": sha}
        return files

    def finish(self, stats: dict[str, Any], inputs: dict[str, str | None] | None = None) -> None:
        """Write stats, then the marker with the manifest: the marker is the last write.
        ``inputs``: the content ids of the upstream stages this data was built from."""
        self.write_stats(stats)
        files = self.manifest()
        meta = self.meta
        write_json_atomic(
            self.path / layout.STAGE_MARKER,
            {
                "fingerprint": meta.fingerprint if meta is not None else None,
                "time": time.time(),
                "rows": sum(f["rows"] for n, f in files.items() if n.startswith("data-")),
                "rejects": sum(f["rows"] for n, f in files.items() if n.startswith("rejects-")),
                "files": files,
                "inputs": inputs or {},
            },
        )

    # ---- verification ------------------------------------------------------------------
    def verify(self, quick: bool = False) -> list[str]:
        """Problems of a finished stage's data against its manifest (empty: all good).
        ``quick`` compares sizes only; the full check hashes every shard."""
        marker = self.marker()
        if marker is None:
            return []
        listed = marker.files
        if listed is None:
            return [f"{self.path / layout.STAGE_MARKER}: written by an older version, without a "
                    "manifest"]  # fmt: skip
        problems = []
        on_disk = {p.name for p in self.path.iterdir() if layout.SHARD_RE.match(p.name)}
        for name in sorted(on_disk - set(listed)):
            problems.append(f"{self.path / name}: not in the stage's manifest")
        for name, want in sorted(listed.items()):
            p = self.path / name
            if not layout.SHARD_RE.match(name):
                problems.append(f"{self.path / layout.STAGE_MARKER}: lists {name!r}, not a shard")
                continue
            if not p.is_file():
                problems.append(f"{p}: missing ({want.rows} rows)")
                continue
            size = p.stat().st_size
            if size != want.bytes:
                problems.append(f"{p}: {size} bytes, the manifest says {want.bytes}")
                continue
            if not quick and file_digest(p)[0] != want.sha256:
                problems.append(f"{p}: contents changed since the stage finished (sha256)")
        return problems

    def damage(self, problems: list[str]) -> RunDirError:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        return RunDirError(
            f"stage '{self.name}' is damaged: {problems[0]}{more}; {redo_hint(self.name)}",
            path=self.path,
        )

    def check_intact(self) -> None:
        """Raise naming the first damaged file and the repair command: a metadata file of
        the wrong shape, or a shard that does not match the manifest."""
        self.meta  # noqa: B018 - parsing it is the check
        self.stats()
        problems = self.verify()
        if problems:
            raise self.damage(problems)

    def verified(self) -> StageDir:
        """This stage, finished and matching its manifest; otherwise one RunDirError (or
        StageError when it has not finished) saying what to run. Every reader of a
        finished stage comes through here, so none reads a damaged or partial stage."""
        if not self.path.is_dir():
            raise StageError(f"{self.path}: stage '{self.name}' has not run; {run_hint(self.name)}")
        if not self.done:
            state = "has not finished" + (" (it is partly done)" if self.shard_ids() else "")
            raise StageError(f"{self.path}: stage '{self.name}' {state}; {run_hint(self.name)}")
        self.check_intact()
        return self

    # ---- changing the folder -----------------------------------------------------------
    @staticmethod
    def wrote(name: str) -> bool:
        """Whether a file of this name in a stage folder is one a stage writes: its fixed
        files, its shards, and the temporary files of either (pipeline/core/io.py)."""
        if name.startswith(".") and name.endswith(".tmp"):
            name = name[1:].rsplit(".", 2)[0]  # ".data-00001.jsonl.k3j9x.tmp"
        return name in layout.STAGE_FILES or bool(layout.SHARD_RE.match(name))

    def strangers(self) -> list[Path]:
        """Files and folders in the stage folder that no stage wrote (a user's notes, a
        survey put there by hand): a clear leaves them where they are."""
        if not self.path.is_dir():
            return []
        return sorted(p for p in self.path.iterdir() if not self.wrote(p.name))

    def check_clearable(self) -> None:
        """Refuse a clear that would leave a stranger the re-done stage reads as its own:
        a shard-named file a finished stage's manifest does not list. Called before a run
        changes anything, and again by :meth:`clear`."""
        if not self.path.is_dir():
            return
        try:
            marker = self.marker()
        except RunDirError:
            return  # a damaged marker lists nothing to trust: every shard is the stage's
        if marker is None or marker.files is None:
            return  # unfinished: the shards on disk are those this stage wrote
        for p in sorted(self.path.iterdir()):
            if layout.SHARD_RE.match(p.name) and p.name not in marker.files:
                raise RunDirError(
                    f"{p}: not written by this stage (its manifest {layout.STAGE_MARKER} "
                    "does not list it), and a re-done stage would read it as its own data; "
                    "move it out of the stage folder, then run the same command again",
                    path=p,
                )

    def clear(self) -> list[Path]:
        """Remove exactly the files the stage wrote; anything else stays (returned, so the
        caller can say so). The folder goes too once nothing is left in it.

        A finished stage's shards are those its manifest lists: a shard-named file beside
        them was put there by someone else, and left in place it would be read as the new
        stage's data, so the clear is refused naming it, with nothing removed.

        Order makes a kill safe at any point: stage.json is first rewritten with a
        fingerprint no setting produces (the next run re-does the stage whatever else it
        finds), then the marker goes (nothing reads the stage as finished), the shards and
        stats, and stage.json last."""
        if not self.path.is_dir():
            return []
        self.check_clearable()
        meta_path = self.path / layout.STAGE_META
        if meta_path.is_file():
            try:
                old = read_json(meta_path)
            except (ValueError, UnicodeDecodeError):
                old = {}
            clearing = old if isinstance(old, dict) else {}
            write_json_atomic(meta_path, {**clearing, "stage": self.name,
                                          "fingerprint": layout.CLEARING})  # fmt: skip
        order = {layout.STAGE_MARKER: 0, layout.STAGE_META: 3}
        ours = [p for p in self.path.iterdir() if self.wrote(p.name)]
        for p in sorted(ours, key=lambda p: (order.get(p.name, 1 if p.is_file() else 2), p.name)):
            crash_point(f"clear {self.name}/{p.name}")
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p, ignore_errors=True)
            else:
                with contextlib.suppress(FileNotFoundError):
                    p.unlink()
        left = self.strangers()
        if not left:
            with contextlib.suppress(OSError):
                self.path.rmdir()
        return left

    def clear_shards(self) -> None:
        """Remove data, rejects, stats and marker but keep stage.json (a stage that is
        re-done from the start rather than resumed)."""
        for p in list(self.path.iterdir()) if self.path.exists() else []:
            if layout.SHARD_RE.match(p.name) or p.name in (layout.STAGE_MARKER,
                                                            layout.STAGE_STATS):  # fmt: skip
                p.unlink()

    # ---- shards ------------------------------------------------------------------------
    def shard_ids(self) -> list[int]:
        if not self.path.is_dir():
            return []
        ids = []
        for p in self.path.iterdir():
            m = layout.SHARD_RE.match(p.name)
            if m and m.group(1) == "data":
                ids.append(int(m.group(2)))
        return sorted(ids)

    def data_path(self, n: int) -> Path:
        return self.path / layout.data_shard(n)

    def write_shard(self, rows: Iterable[dict], rejects: Iterable[dict] = ()) -> int:
        rows = list(rows)
        if self.contract and rows and not self._contract_checked:
            missing = sorted(self.contract - set(rows[0]))
            if missing:
                raise StageError(
                    f"stage '{self.name}' wrote a row without the fields it declares "
                    f"{missing}: a bug in the stage, nothing was written"
                )
            self._contract_checked = True
        ids = self.shard_ids()
        n = (ids[-1] + 1) if ids else 0
        write_jsonl_atomic(self.path / layout.rejects_shard(n), rejects)
        write_jsonl_atomic(self.data_path(n), rows)
        return n

    def _read(self, path: Path) -> Iterator[dict]:
        for _, row in self._read_numbered(path):
            yield row

    def _read_numbered(self, path: Path) -> Iterator[tuple[int, dict]]:
        for line_no, _, _, row in self._read_located(path):
            yield line_no, row

    def _read_located(self, path: Path) -> Iterator[tuple[int, int, bytes, dict]]:
        """(line number, byte offset, the line's bytes, row) of each row of one shard."""
        try:
            fh = open(path, "rb")  # noqa: SIM115 - closed by the with below
        except FileNotFoundError:
            raise RunDirError(f"{path}: missing; {redo_hint(self.name)}", path=path) from None
        offset = 0
        with fh:
            for line_no, line in enumerate(fh, 1):
                start = offset
                offset += len(line)
                if not line.strip():
                    continue
                try:
                    row = loads(line)
                except ValueError as exc:  # UnicodeDecodeError is a ValueError too
                    raise RunDirError(
                        f"{path}, line {line_no}: damaged row ({type(exc).__name__}); "
                        + redo_hint(self.name),
                        path=path,
                        line=line_no,
                    ) from None
                if not isinstance(row, dict):
                    raise RunDirError(
                        f"{path}, line {line_no}: a row must be a JSON object; "
                        + redo_hint(self.name),
                        path=path,
                        line=line_no,
                    )
                yield line_no, start, line, row

    def rows(self) -> Iterator[dict]:
        for n in self.shard_ids():
            yield from self._read(self.data_path(n))

    def numbered_rows(self) -> Iterator[tuple[Path, int, dict]]:
        """(shard path, line number, row) of every data row, for errors that name a line."""
        for n in self.shard_ids():
            path = self.data_path(n)
            for line, row in self._read_numbered(path):
                yield path, line, row

    def located_rows(self) -> Iterator[tuple[Path, int, int, bytes, dict]]:
        """(shard path, line number, byte offset, the line's bytes, row) of every data row:
        where to read one row again (:meth:`line_at`) without holding the stage in memory."""
        for n in self.shard_ids():
            path = self.data_path(n)
            for line, start, raw, row in self._read_located(path):
                yield path, line, start, raw, row

    @staticmethod
    def line_at(path: Path, offset: int, length: int) -> bytes:
        """The bytes of one row where :meth:`located_rows` found it."""
        with open(path, "rb") as fh:
            fh.seek(offset)
            return fh.read(length)

    def rejects(self) -> Iterator[dict]:
        for n in self.shard_ids():
            p = self.path / layout.rejects_shard(n)
            if p.exists():
                yield from self._read(p)

    def done_examples(self) -> set[str]:
        """Example ids that already have a final outcome (kept or rejected) on disk."""
        seen: set[str] = set()
        for r in itertools.chain(self.rows(), self.rejects()):
            ex = r.get("example_id")
            if not isinstance(ex, str):
                raise RunDirError(
                    f"{self.path}: a row without an example_id; {redo_hint(self.name)}",
                    path=self.path,
                )
            seen.add(ex)
        return seen

    def index(self, key: str = "example_id") -> ShardIndex:
        """Where each ``key``'s rows sit in the data shards, for reads by key without
        holding the stage in memory (rows of one key must be contiguous in a shard)."""
        return ShardIndex(self, key)

    def status(self) -> tuple[str, int, int | None]:
        """(state, examples done, examples expected)."""
        if not self.path.exists():
            return "not started", 0, None
        meta = self.meta
        expected = meta.expected_examples if meta is not None else None
        done = len(self.done_examples())
        if self.done:
            return "done", done, expected
        return "partial", done, expected


class ShardIndex:
    """key -> (shard number, byte offset, byte length) of the key's contiguous rows."""

    def __init__(self, stage: StageDir, key: str) -> None:
        self.stage = stage
        self.key = key
        self._where: dict[str, tuple[int, int, int]] = {}
        for n in stage.shard_ids():
            path = stage.data_path(n)
            offset = 0
            current: str | None = None
            start = 0
            for row_bytes in _lines(path):
                value = _key_of(row_bytes, key, path, stage.name)
                if value != current:
                    if current is not None:
                        self._add(current, n, start, offset - start, path)
                    current, start = value, offset
                offset += len(row_bytes)
            if current is not None:
                self._add(current, n, start, offset - start, path)

    def _add(self, value: str, shard: int, start: int, length: int, path: Path) -> None:
        if value in self._where:
            raise RunDirError(
                f"{path}: rows of {self.key} {value!r} are not contiguous; "
                + redo_hint(self.stage.name),
                path=path,
            )
        self._where[value] = (shard, start, length)

    def __contains__(self, value: str) -> bool:
        return value in self._where

    def __len__(self) -> int:
        return len(self._where)

    def __iter__(self) -> Iterator[str]:
        return iter(self._where)

    def get(self, value: str) -> list[dict]:
        """The rows of ``value`` (empty when it has none)."""
        where = self._where.get(value)
        if where is None:
            return []
        shard, start, length = where
        with open(self.stage.data_path(shard), "rb") as fh:
            fh.seek(start)
            data = fh.read(length)
        return [loads(line) for line in data.splitlines() if line.strip()]


def _lines(path: Path) -> Iterator[bytes]:
    with open(path, "rb") as fh:
        yield from fh


def _key_of(line: bytes, key: str, path: Path, stage: str) -> str:
    try:
        return str(loads(line)[key])
    except (ValueError, KeyError, TypeError) as exc:
        raise RunDirError(
            f"{path}: a row without a readable {key} ({type(exc).__name__}); {redo_hint(stage)}",
            path=path,
        ) from None
