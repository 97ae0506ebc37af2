"""The run directory as one object: every path, every verified read.

Readers (publish, annotate, audit, eval, status, inspect, cache repair) get a
:class:`RunDir` from :func:`open_run` and read finished stages through
:meth:`RunDir.finished`, which checks the stage's manifest first and raises the same
one-line error ``prb run`` gives for damage. Nothing outside ``pipeline.run`` builds a path
inside a run directory.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.core.cliargs import command_line
from pipeline.core.errors import InputError, PipelineError, RunDirError
from pipeline.core.io import path_kind, read_json, write_json_atomic, write_text_atomic
from pipeline.kinds.stages import ORDER
from pipeline.run import layout
from pipeline.run.cache import SQLITE_TABLES, TABLES
from pipeline.run.lock import RunLock
from pipeline.run.stage import StageDir, redo_hint
from pipeline.types.records import PAIR_RECORD_FIELDS, RecordProblem, check_pair_record

if TYPE_CHECKING:
    from pipeline.config import Config

# the stages' folders, in run order: the stage registry's order (names only; no stage
# module is imported)
STAGE_NAMES: tuple[str, ...] = ORDER


@dataclass(frozen=True)
class Round:
    """One annotation round's folder and files."""

    number: int
    path: Path

    @property
    def tasks(self) -> Path:
        return self.path / layout.ROUND_TASKS

    @property
    def sides(self) -> Path:
        return self.path / layout.ROUND_SIDES

    @property
    def export(self) -> Path:
        return self.path / layout.ROUND_EXPORT

    @property
    def annotations(self) -> Path:
        return self.path / layout.ROUND_ANNOTATIONS

    @property
    def verdicts(self) -> Path:
        return self.path / layout.ROUND_VERDICTS

    @property
    def adjudication(self) -> Path:
        return self.path / layout.ROUND_ADJUDICATION

    @property
    def agreement(self) -> Path:
        return self.path / layout.ROUND_AGREEMENT

    @property
    def skipped(self) -> Path:
        return self.path / layout.ROUND_SKIPPED

    @property
    def name(self) -> str:
        return self.path.name


def check_round_number(n: Any, field: str = "--round") -> int:
    """A round number: an integer from 1 (rounds are numbered from 1)."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise InputError(
            f"round numbers start at 1, got {n!r}; pass --round 1 for the first round",
            field=field,
        )
    return n


class RunDir:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def __repr__(self) -> str:
        return f"RunDir({str(self.path)!r})"

    @property
    def shown(self) -> str:
        """The run directory as printed: its absolute path."""
        return str(self.path.absolute())

    # ---- files at the top -------------------------------------------------------------
    @property
    def cache_path(self) -> Path:
        return self.path / layout.CACHE

    @property
    def openai_batches(self) -> Path:
        """The records of the Batch API's batches (backend.openai.batch)."""
        return self.path / layout.OPENAI_BATCHES

    @property
    def config_path(self) -> Path:
        return self.path / layout.RUN_CONFIG

    @property
    def environment_path(self) -> Path:
        return self.path / layout.ENVIRONMENT

    def lock(self, command: str = "") -> RunLock:
        return RunLock(self.path, command)

    def write_config(self, text: str) -> None:
        write_text_atomic(self.config_path, text)

    @staticmethod
    def resolved_config(config: Config) -> str:
        """What ``prb run`` writes to run.yaml: the resolved config, no secrets."""
        return "# Resolved config of this run (secrets are never written here).\n" + (
            config.to_yaml()
        )

    def write_environment(self, env: dict[str, Any]) -> None:
        write_json_atomic(self.environment_path, env)

    def environment(self) -> dict[str, Any]:
        """environment.json (empty when there is none); a wrong shape is one error."""
        path = self.environment_path
        try:
            raw = read_json(path)
        except FileNotFoundError:
            return {}
        except (ValueError, UnicodeDecodeError, RecursionError):
            raise RunDirError(
                f"{path}: not valid JSON; run `prb run CONFIG` again to rewrite it", path=path
            ) from None
        if not isinstance(raw, dict):
            raise RunDirError(
                f"{path}: must be a JSON object; run `prb run CONFIG` again to rewrite it",
                path=path,
            )
        return raw

    def load_config(self, overrides: Sequence[str] = ()) -> Config | None:
        """The run's run.yaml as a Config; None when the run has none."""
        if not self.config_path.is_file():
            return None
        from pipeline.config import load_config

        return load_config(self.config_path, list(overrides))

    def try_config(self) -> Config | None:
        """:meth:`load_config`, or None when run.yaml cannot be read (an older version's):
        for readers that only want the settings when they are there."""
        try:
            return self.load_config()
        except PipelineError:
            return None

    # ---- stages -----------------------------------------------------------------------
    def stage(self, name: str) -> StageDir:
        return StageDir(self.path / name)

    def stages(self) -> list[StageDir]:
        return [self.stage(n) for n in STAGE_NAMES]

    def finished(self, name: str) -> StageDir:
        """A finished stage, verified against its manifest; otherwise one error saying what
        to run (see :meth:`StageDir.verified`)."""
        return self.stage(name).verified()

    def pair_records(self) -> Iterator[dict[str, Any]]:
        """The kept pairs of the finished, verified pair stage, each a full pair record
        (:mod:`pipeline.types.records`). A record of the wrong shape is one error naming the
        shard, the line and the field."""
        for _, _, rec in self.numbered_pair_records():
            yield rec

    def numbered_pair_records(self) -> Iterator[tuple[Path, int, dict[str, Any]]]:
        """(shard, line, record) of every kept pair: :meth:`pair_records` with where each
        record is, for errors about a record's content."""
        for path, line, _, _, rec in self.located_pair_records():
            yield path, line, rec

    def located_pair_records(self) -> Iterator[tuple[Path, int, int, bytes, dict[str, Any]]]:
        """(shard, line, byte offset, the line's bytes, record) of every kept pair: where to
        read each record again (``StageDir.line_at``), for a reader that holds none."""
        stage = self.finished("pairs")
        for path, line, start, raw, rec in stage.located_rows():
            missing = sorted(PAIR_RECORD_FIELDS - rec.keys())
            try:
                if missing:
                    raise RecordProblem(missing[0], "present", None)
                check_pair_record(rec)
            except RecordProblem as exc:
                detail = f"field '{exc.field}' is missing" if missing else str(exc)
                raise RunDirError(
                    f"{path}, line {line}: {detail}; {redo_hint('pairs')}", path=path, line=line
                ) from None
            yield path, line, start, raw, rec

    def is_run(self) -> bool:
        """Whether this folder is a run directory prb wrote: its marker, or (a run made
        before the marker) files that read as prb's own (:meth:`not_a_run`)."""
        return self.not_a_run() is None

    def not_a_run(self) -> str | None:
        """Why this folder is not a run directory prb wrote; None when it is one.

        The marker says so. A run made before the marker has none: it is one when it holds
        run.yaml, cache.sqlite or a stage's stage.json and every one of them reads as
        prb's own (a prb config, a request cache with prb's tables and no others, a stage
        record of prb's shape with its manifest). A folder of the user's that merely holds
        files of those names is not taken for a run: prb would write into it."""
        if (self.path / layout.RUN_MARKER).is_file():
            return None
        found = []
        if self.config_path.is_file():
            why = _not_prb_config(self.config_path)
            if why:
                return why
            found.append(layout.RUN_CONFIG)
        if self.cache_path.is_file():
            why = _not_prb_cache(self.cache_path)
            if why:
                return why
            found.append(layout.CACHE)
        for name in STAGE_NAMES:
            sd = self.stage(name)
            if (sd.path / layout.STAGE_META).is_file():
                why = _not_prb_stage(sd)
                if why:
                    return why
                found.append(name)
        if not found:
            return "no marker, run.yaml, cache.sqlite or stage folders"
        return None

    def check_writable(self, config: Config | None = None) -> None:
        """Refuse, before anything is written, a folder `prb run` must not write into: one
        that exists and is neither empty nor a run (a folder of the user's, whose files a
        re-done stage could otherwise replace), or a path that is not a folder. With
        ``config``: also a config file that is this folder's run.yaml (``prb run`` would
        write the resolved config over it), unless it already is that resolved config."""
        p = self.path
        if not os.path.lexists(p):
            return
        if config is not None:
            self._check_config_outside(config)
        fix = "set run.output_dir or run.name to a new or empty folder, or to an earlier run"
        if not p.is_dir():
            raise InputError(f"the run directory is {_kind(p)}, not a folder; {fix}", path=p)
        why = self.not_a_run()
        if why is None:
            return
        # .lock alone: an earlier `prb run` refused this (empty) folder after locking it
        found = sorted(x.name for x in p.iterdir() if x.name != layout.LOCK)
        if found:
            more = f" and {len(found) - 1} more" if len(found) > 1 else ""
            held = f"it holds {found[0]!r}{more}"
            why = (
                f"{held}: {why}"
                if not why.startswith("no marker")
                else f"{held}, not written by prb"
            )
            raise InputError(
                f"exists and is not a run directory ({why}); `prb run` writes only into a "
                f"new or empty folder or an earlier run, so nothing was written: {fix}",
                path=p.resolve(),
            )

    def _check_config_outside(self, config: Config) -> None:
        source = config.source
        if source is None or not self.config_path.is_file():
            return
        if os.path.realpath(source) != os.path.realpath(self.config_path):
            return
        try:
            same = self.config_path.read_text(encoding="utf-8") == self.resolved_config(config)
        except (OSError, UnicodeDecodeError):
            same = False
        if not same:
            raise InputError(
                f"is the {layout.RUN_CONFIG} of its own run directory {self.shown} "
                "(run.output_dir/run.name), where `prb run` writes the resolved config: "
                "your comments, order and relative paths would be lost, so nothing was "
                "written. Move the config out of that folder or rename it, or point "
                "run.output_dir / run.name at another folder",
                path=source,
            )

    def mark(self) -> None:
        """Write the run's marker (once): this folder is a run, made by `prb run`."""
        marker = self.path / layout.RUN_MARKER
        if not marker.is_file():
            write_json_atomic(marker, {"created_by": "prb run", "time": time.time()})

    # ---- annotation rounds ------------------------------------------------------------
    def round(self, number: int) -> Round:
        check_round_number(number)
        return Round(number, self.path / layout.ANNOTATE / f"{layout.ROUND_PREFIX}{number}")

    def rounds(self) -> list[Round]:
        """Every round folder, in number order (round-2 before round-10)."""
        base = self.path / layout.ANNOTATE
        if not base.is_dir():
            return []
        found = []
        for p in base.iterdir():
            m = layout.ROUND_RE.match(p.name)
            if m and p.is_dir() and int(m.group(1)) >= 1:
                found.append(Round(int(m.group(1)), p))
        return sorted(found, key=lambda r: r.number)

    # ---- what commands write beside the stages ----------------------------------------
    @property
    def release_dir(self) -> Path:
        return self.path / layout.RELEASE

    @property
    def report_dir(self) -> Path:
        return self.path / layout.REPORT

    @property
    def eval_dir(self) -> Path:
        return self.path / layout.EVAL

    @property
    def batch_dir(self) -> Path:
        """``prb batch``'s folder: request files and the state of exports and imports."""
        return self.path / layout.BATCH

    @property
    def batch_state(self) -> Path:
        return self.batch_dir / layout.BATCH_STATE

    def has_release(self) -> bool:
        return (self.release_dir / layout.RELEASE_ALL).is_dir()


# run.yaml's sections that are no longer the config's (prices and budget were once)
_OLD_SECTIONS = frozenset({"prices", "budget"})


def _config_sections() -> frozenset[str]:
    """run.yaml's top-level sections, in any version of prb: the config's own today (from
    its model, never listed here), and the ones it once had."""
    from pipeline.config import Config

    return frozenset(Config.model_fields) | _OLD_SECTIONS


def _not_prb_config(path: Path) -> str | None:
    """Why ``path`` is not a run.yaml prb wrote (its resolved config); None when it is."""
    import yaml

    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError, RecursionError):
        return f"{layout.RUN_CONFIG} is not YAML prb wrote"
    if not isinstance(data, dict):
        return f"{layout.RUN_CONFIG} is not a prb config (not a mapping of sections)"
    sections = _config_sections()
    other = sorted(str(k) for k in data if k not in sections)
    if other:
        return f"{layout.RUN_CONFIG} is not a prb config ({other[0]!r} is not one of its sections)"
    if not all(isinstance(data.get(k), dict) for k in ("run", "backend")):
        return f"{layout.RUN_CONFIG} is not a prb config (no run and backend sections)"
    return None


def _not_prb_cache(path: Path) -> str | None:
    """Why ``path`` is not a request cache prb wrote; None when it is. Opened read-only:
    a user's database is never changed by looking."""
    import sqlite3

    try:
        con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            names = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        finally:
            con.close()
    except sqlite3.Error:
        return f"{layout.CACHE} is not a database prb wrote"
    other = sorted(names - TABLES - SQLITE_TABLES)
    if other or "responses" not in names:
        shown = f"it has a table {other[0]!r}" if other else "it has no responses table"
        return f"{layout.CACHE} is not prb's request cache ({shown})"
    return None


def _not_prb_stage(sd: StageDir) -> str | None:
    """Why a stage folder's records are not prb's; None when stage.json is prb's record
    of that stage and its manifest is there."""
    where = f"{sd.name}/{layout.STAGE_META}"
    try:
        meta = sd.meta
        marker = sd.marker()
    except RunDirError:
        return f"{where} or its manifest is not a stage record prb wrote"
    if meta is None or meta.stage != sd.name:
        return f"{where} is not prb's record of the {sd.name} stage"
    if marker is None or marker.files is None:
        return f"{where} has no manifest ({layout.STAGE_MARKER}) beside it"
    return None


def _kind(path: Path) -> str:
    return path_kind(path) or "a link to nothing"


def run_of(path: Path) -> RunDir | None:
    """The run a path belongs to: the run directory itself, or the run whose release,
    report, eval or stage folder it is; None when it is none of these. Compared by real
    path: a link to a run's release folder belongs to that run."""
    path = Path(path).resolve()
    if path.is_dir() and RunDir(path).is_run():
        return RunDir(path)
    parent = path.parent
    known = (layout.RELEASE, layout.REPORT, layout.EVAL, *STAGE_NAMES)
    if path.is_dir() and path.name in known and RunDir(parent).is_run():
        return RunDir(parent)
    return None


def default_eval_root(path: str | Path) -> Path:
    """Where ``prb eval`` writes for a split at ``path`` by default (and where the audit
    and the dataset card look for its results): ``<run>/eval`` for a run or its release,
    else ``<input>-eval`` beside the input."""
    path = Path(path)
    run = run_of(path)
    if run is not None:
        return run.eval_dir
    name = path.stem if path.is_file() else path.name
    return path.with_name(f"{name}-eval")


def open_run(target: str | Path, overrides: Sequence[str] = ()) -> tuple[RunDir, Config | None]:
    """The run a command is pointed at, and its config when one was given or is on disk.

    ``target`` is a run directory (``outputs/<run>``) or the run's config file. Anything
    else is one InputError saying what it is and what to pass instead; nothing is created.
    """
    target = Path(target)
    hint = "pass a run directory (outputs/<run>) or the run's config file"
    kind = path_kind(target)
    if kind not in (None, "a file", "a folder"):
        raise InputError(f"is {kind}; {hint}", path=target)
    if not target.exists():
        raise InputError(f"no such run directory or config file; {hint}", path=target)
    if target.is_file():
        if target.suffix not in (".yaml", ".yml"):
            raise InputError(f"a file, not a run directory; {hint}", path=target)
        from pipeline.config import load_config

        cfg = load_config(target, list(overrides))
        rd = RunDir(cfg.run_dir)
        if not rd.path.is_dir():
            raise InputError(
                f"this config's run directory {rd.shown} does not exist yet; run "
                f"`{command_line(['prb', 'run', target], overrides)}` first",
                path=target,
            )
        return rd, cfg
    if not target.is_dir():
        raise InputError(f"not a file or a folder; {hint}", path=target)
    rd = RunDir(target)
    why = rd.not_a_run()
    if why is not None:
        raise InputError(f"not a run directory ({why}); " + hint, path=target)
    found: Config | None = rd.load_config(overrides) if overrides else rd.try_config()
    return rd, found
