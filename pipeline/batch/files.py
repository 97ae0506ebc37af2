"""`prb batch export` and `prb batch import`: the cluster loop (docs/batch.md).

Both run the real stages, as `prb run` does, with the ``batchfile`` backend: every answer
an import brought is handed to the runner, which validates it, caches it or re-asks
exactly as for an answer from a server, and every request it has no answer for is
recorded; the run stops at the end of the first stage that waits for answers. Export then
writes those requests as OpenAI batch JSONL; import reports what it stored and what waits.
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.backends.batchfile import BatchFileBackend, Recording, recording
from pipeline.backends.batchstore import BatchState
from pipeline.backends.openai.lines import BROKEN_LINE, Parsed, read_results, request_line
from pipeline.core.errors import ConfigError, InputError, StageError, Unanswered
from pipeline.core.io import write_jsonl_atomic
from pipeline.kinds.backend import BACKENDS
from pipeline.run import RunDir
from pipeline.run.cache import RequestCache
from pipeline.run.outputs import check_output

if TYPE_CHECKING:
    from pipeline.config import Config
    from pipeline.run import RunDir, RunLock
    from pipeline.types.chat import ChatRequest

Echo = Callable[[str], None]
# skipped and failed lines named one by one, up to this many per import
SHOWN_LINES = 20


def _stderr(line: str) -> None:
    print(line, file=sys.stderr)


def check_batchfile(cfg: Config, command: str) -> None:
    """Batch files need the ``batchfile`` backend: its identity is fixed by the config, so
    the keys an export writes are the keys `prb run` looks up."""
    if not issubclass(BACKENDS.get(cfg.backend.name), BatchFileBackend):
        raise ConfigError(
            f"`prb batch {command}` needs backend.name batchfile (answers from batch files, "
            f"keyed without asking any server), but it is '{cfg.backend.name}'; set it in the "
            "config or add --set backend.name=batchfile",
            field="backend.name",
        )


@dataclass
class Pass:
    """One run of the stages with the batchfile backend."""

    recording: Recording
    stopped: Unanswered | None  # None: every stage is done

    @property
    def waiting(self) -> list[ChatRequest]:
        return list(self.recording.missing.values())


def _lock(rd: RunDir, cfg: Config) -> RunLock:
    """The run directory's lock, taken when the folder exists (as `prb run` takes it: a
    second writer is refused at once); run_pipeline takes it after creating the folder."""
    rd.check_writable(cfg)  # a folder of the user's is refused before anything is written
    lock = rd.lock()
    if lock.path.parent.is_dir():
        lock.acquire(create=False)
    return lock


def _run_stages(
    cfg: Config,
    rd: RunDir,
    lock: RunLock,
    *,
    progress: bool,
    echo: Echo,
    command: str,
    what: str = "prb batch export",
) -> Pass:
    """The stages, as `prb run` runs them, until the first that waits for answers; the
    lock (from :func:`_lock`) is released at the end, as run_pipeline releases it."""
    from pipeline.orchestration.orchestrate import run_pipeline

    with recording() as rec:
        try:
            run_pipeline(
                cfg, progress=progress, echo=echo, lock=lock, command=command,
                keep_finished=what,
            )  # fmt: skip
        except Unanswered as exc:
            return Pass(rec, exc)
        except StageError:
            # a request still invalid after its re-asks leaves its example pending ("run
            # the same command again"); its answers were set aside, so the stages run once
            # more and now wait for that request, which the next export asks afresh
            if not rec.retired:
                raise
            again = _lock(rd, cfg)
            try:
                run_pipeline(
                    cfg, progress=progress, echo=echo, lock=again, command=command,
                    keep_finished=what,
                )  # fmt: skip
            except Unanswered as exc:
                return Pass(rec, exc)
    return Pass(rec, None)


@dataclass
class Exported:
    path: Path | None
    stage: str | None
    requests: int


def export_requests(
    cfg: Config,
    out: Path | None = None,
    *,
    progress: bool = True,
    echo: Echo = _stderr,
    command: str = "prb run CONFIG",
) -> Exported:
    """Run the stages until the first one that waits for answers and write the requests it
    waits for to ``out`` (default: ``batch/requests-<stage>-NNN.jsonl`` in the run
    directory), atomically; each is recorded as asked, so an import accepts its answer."""
    if out is not None:
        check_export_target(out, cfg.source)
    check_batchfile(cfg, "export")
    rd = RunDir(cfg.run_dir)
    done = _run_stages(cfg, rd, _lock(rd, cfg), progress=progress, echo=echo, command=command)
    if done.stopped is None:
        return Exported(None, None, 0)
    stage = done.stopped.stage
    requests = done.waiting
    path = out if out is not None else _next_file(rd, stage)
    # the lines first, then the record of what was asked: a request recorded as asked is
    # always in a file (recording it twice, after a kill between the two, is harmless)
    with rd.lock(), BatchState(rd.batch_state, create=True) as state:
        write_jsonl_atomic(path, (request_line(r, r.openai_body()) for r in requests))
        state.record_asked([(r, stage) for r in requests], str(path))
    return Exported(path, stage, len(requests))


# the keys of a batch request line (pipeline/backends/openai/lines.py request_line)
_REQUEST_KEYS = {"custom_id", "method", "url", "body"}


def check_export_target(path: Path, config: Path | None = None) -> None:
    """``-o`` may name a new file, or replace a file of batch request lines (an earlier
    export); never a run's own file, the config being run, a folder or any other file: a
    user's file is not the project's to replace (:func:`pipeline.run.outputs.check_output`).
    Checked before any stage runs, so a refusal leaves nothing done."""
    reads = [("the config being run", config)] if config is not None else []
    check_output(path, flag="-o", command="prb batch export", reads=reads, ours=_request_file)


def _request_file(path: Path) -> bool:
    """Whether ``path`` holds only batch request lines (what `prb batch export` writes)."""
    import json

    with open(path, "rb") as fh:
        for raw in fh:
            try:
                obj = json.loads(raw)
            except ValueError:
                return False
            if not isinstance(obj, dict) or set(obj) != _REQUEST_KEYS:
                return False
    return True


def _next_file(rd: RunDir, stage: str) -> Path:
    n = len(list(rd.batch_dir.glob("requests-*.jsonl"))) if rd.batch_dir.is_dir() else 0
    while True:
        n += 1
        path = rd.batch_dir / f"requests-{stage}-{n:03d}.jsonl"
        if not path.exists():
            return path


@dataclass
class Imported:
    """What an import did: answers handed to the runner and what became of them, and
    every line skipped or failed, with its reason."""

    lines: int = 0
    stored: int = 0
    invalid: int = 0  # answers the runner found invalid: re-asked in the next export
    later: int = 0  # answers kept for a request the stages did not ask this time
    skipped: Counter = field(default_factory=Counter)  # reason -> lines
    named: list[str] = field(default_factory=list)  # "source:line: why", every one
    stopped: Unanswered | None = None
    waiting: int = 0

    def summary(self, files: Sequence[Path]) -> str:
        shown = ", ".join(str(f) for f in files)
        skipped = sum(self.skipped.values())
        why = ", ".join(f"{n} {code}" for code, n in self.skipped.most_common())
        parts = [f"stored {self.stored}", f"skipped {skipped}" + (f" ({why})" if why else "")]
        if self.invalid:
            parts.append(f"{self.invalid} invalid answers (re-asked in the next export)")
        if self.later:
            parts.append(f"{self.later} kept for requests the stages did not ask this time")
        return f"imported {shown}: {self.lines} lines; " + "; ".join(parts)


def import_results(
    cfg: Config,
    files: Sequence[Path],
    *,
    progress: bool = True,
    echo: Echo = _stderr,
    command: str = "prb run CONFIG",
) -> Imported:
    """Check every result line of ``files`` against the requests this run exported, keep
    the usable answers (all of them or none), then run the stages so that the runner
    validates and caches them; returns what was stored and what was skipped, and why."""
    check_batchfile(cfg, "import")
    rd = RunDir(cfg.run_dir)
    if not rd.batch_state.is_file():
        raise InputError(
            f"nothing was exported for the run in {rd.shown}; write the requests first with "
            "`prb batch export CONFIG`",
            path=files[0] if files else None,
        )
    res = Imported()
    lock = _lock(rd, cfg)
    try:
        with BatchState(rd.batch_state, create=True) as state:
            expected = state.asked()
            # every file read whole before anything is kept: one that cannot be read
            # changes nothing
            parsed: list[Parsed] = []
            for path in files:
                try:
                    with open(path, "rb") as fh:
                        parsed += read_results(fh, expected, source=str(path))
                except OSError as exc:
                    why = f"cannot be read ({exc.strerror or exc})"
                    raise InputError(why, path=path) from None
            keep = _accept(parsed, expected, state, rd.cache_path, res)
    except BaseException:
        lock.release()
        raise
    # the runner validates and caches what was kept, and records what is still missing
    done = _run_stages(
        cfg, rd, lock, progress=progress, echo=echo, command=command, what="prb batch import"
    )
    res.stopped, res.waiting = done.stopped, len(done.waiting)
    if keep:
        with RequestCache(rd.cache_path, readonly=True) as cache:
            cached = cache.present(keep)
        for key in keep:
            if key in cached:
                res.stored += 1
            elif key in done.recording.answered:
                res.invalid += 1
            else:
                res.later += 1
    return res


def _accept(
    parsed: list[Parsed],
    expected: dict[str, ChatRequest],
    state: BatchState,
    cache_path: Path,
    res: Imported,
) -> list[str]:
    """Sort the lines into answers to keep and lines to skip (counted and named in
    ``res``); keep the answers and the ids of the lines read, in one transaction."""
    answers = [p for p in parsed if p.result is not None and p.custom_id is not None]
    keys = [p.custom_id for p in answers if p.custom_id is not None]
    cached: set[str] = set()
    if cache_path.exists() and keys:
        with RequestCache(cache_path, readonly=True) as cache:
            cached = cache.present(keys)
    staged = set(state.answers(keys))
    seen = state.seen_lines(p.line_id for p in parsed if p.line_id)
    first: dict[str, str] = {}  # custom_id -> where its answer was read (across files)
    keep: list[tuple[str, Any, str]] = []
    line_ids: list[tuple[str, str]] = []

    def skip(p: Parsed, code: str, why: str) -> None:
        res.skipped[code] += 1
        res.named.append(f"{p.where}: {why}")

    for p in parsed:
        res.lines += 1
        if p.line_id and p.line_id in seen:
            skip(p, "already imported", f"line id {p.line_id} was imported before")
            continue
        if p.line_id and p.code != BROKEN_LINE:
            # read: importing it again is harmless. A broken line was not read, so a
            # corrected line with its id is imported later, not refused as imported
            line_ids.append((p.line_id, p.where))
        if p.result is None:
            skip(p, p.code, p.why)
            continue
        cid = p.custom_id
        assert cid is not None
        if cid in first:
            skip(p, "duplicate", f"custom_id {cid} was answered already ({first[cid]})")
            continue
        first[cid] = p.where
        if cid in cached or cid in staged:
            skip(p, "already imported", f"custom_id {cid} has an answer already")
            continue
        keep.append((cid, p.result, p.where))
    state.store(keep, line_ids)
    return [k for k, _, _ in keep]


def describe_next(cfg_command: str, stopped: Unanswered | None, waiting: int) -> str:
    """The line that says what comes next."""
    batch = cfg_command.replace("prb run", "prb batch export", 1)
    if stopped is None:
        return f"every stage is done: `{cfg_command}` has nothing left to do"
    return f"{waiting} requests of stage '{stopped.stage}' wait for answers: `{batch}` writes them"
