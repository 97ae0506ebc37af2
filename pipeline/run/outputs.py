"""Where a command may write a path the user names (``--out``, ``-o``): one check for all.

:func:`check_output` is the one rule. Every command that writes a file or a folder a user
names calls it before it does any work (``prb eval correlate --out``, ``prb batch export
-o``, ``prb audit --out``, ``prb eval --out``, ``prb publish --out``, ``prb quickstart
--out``; ``tests/test_output_paths.py`` finds them in the argument parser and runs each
against every target below), so a slip of the tab key never costs a run its answers.
It lives here because only ``pipeline.run`` knows a run directory's own files.

Refused, each with the same one line (``PATH, field 'FLAG': is WHAT; nothing was written
and it is left as it is: give ...``), whatever run the path is in (the command's own or
another), by its real path (links followed) and as typed:

- a run directory, anything in a stage folder (the folder itself included), and a run's
  own files: ``run.yaml``, ``cache.sqlite`` (and its ``-wal`` / ``-shm`` / ``-journal``),
  ``environment.json``, ``.lock``, ``.prb-run``, ``openai-batches/``, the annotation
  rounds (``annotate/``), the batch state (``batch/state.sqlite``) and, for every command
  but ``prb publish`` on its own run, the release (``publish/``);
- a path the command reads: the config being run, the table being read;
- for a file: a folder, a named pipe or device, a path whose folder does not exist, and an
  existing file this command did not write (``ours`` says which are its own: an earlier
  export, an earlier result; an empty file is taken, since it holds nothing to lose);
- for a folder: a file, a named pipe or device.

A new file in a run's top folder, ``report/``, ``eval/`` or ``batch/`` is allowed: those
are where commands put what they write (``<run>/correlate.json`` is a fine ``--out``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path

from pipeline.core.errors import InputError
from pipeline.core.io import path_kind
from pipeline.kinds.stages import ORDER
from pipeline.run import layout
from pipeline.run.rundir import RunDir

# what is left as it is, in every refusal (tests look for it)
LEFT_AS_IT_IS = "nothing was written and it is left as it is"

# the run's own files at its top, by name: what each one is, as a refusal says it
_TOP_FILES = {
    layout.RUN_CONFIG: "the resolved config (run.yaml) of the run {run}, which `prb run` writes",
    layout.CACHE: "the request cache (cache.sqlite: every answer the run received) of the "
    "run {run}",
    layout.ENVIRONMENT: "the environment record (environment.json) of the run {run}",
    layout.LOCK: "the lock file (.lock) of the run {run}",
    layout.RUN_MARKER: "the marker (.prb-run) of the run {run}",
}
_SQLITE_SIDECARS = ("-wal", "-shm", "-journal")


def _is_run(folder: Path) -> bool:
    return (folder / layout.RUN_MARKER).is_file() or RunDir(folder).is_run()


def enclosing_run(path: str | Path) -> Path | None:
    """The nearest folder at or above ``path`` (its real path) that is a run directory prb
    wrote; None when there is none."""
    return _enclosing_run(Path(os.path.realpath(path)))


def _enclosing_run(path: Path) -> Path | None:
    """The nearest folder at or above ``path`` that is a run directory prb wrote."""
    for folder in (path, *path.parents):
        try:
            if folder.is_dir() and _is_run(folder):
                return folder
        except OSError:
            return None
    return None


def run_role(path: str | Path, *, release_ok: bool = False) -> str | None:
    """What ``path`` is to a run that holds it, when it is the run's own (its folder, a
    stage's folder or files, one of its files): the words a refusal uses; None when it is
    no run's, or a place where commands write (a new file at the run's top, ``report/``,
    ``eval/``, ``batch/``). ``release_ok``: the run's ``publish/`` folder is the caller's
    (``prb publish``)."""
    full = Path(os.path.realpath(path))
    run = _enclosing_run(full)
    if run is None:
        return None
    shown = str(run)
    if full == run:
        return f"the run directory {shown}"
    parts = full.relative_to(run).parts
    top = parts[0]
    if top in ORDER:
        if len(parts) == 1:
            return f"the folder of stage '{top}' of the run {shown}, which only `prb run` writes"
        return f"inside the folder of stage '{top}' of the run {shown}, which only `prb run` writes"
    if len(parts) == 1:
        base = top
        for suffix in _SQLITE_SIDECARS:
            if top == layout.CACHE + suffix:
                base = layout.CACHE
        if base in _TOP_FILES:
            return _TOP_FILES[base].format(run=shown)
    if top == layout.OPENAI_BATCHES:
        return f"inside the Batch API records (openai-batches/) of the run {shown}"
    if top == layout.ANNOTATE:
        return (
            f"inside the annotation rounds (annotate/) of the run {shown}, which only "
            "`prb annotate` writes"
        )
    if top == layout.RELEASE and not release_ok:
        return f"inside the release (publish/) of the run {shown}, which only `prb publish` writes"
    if top == layout.BATCH and len(parts) == 2:
        name = parts[1]
        if name == layout.BATCH_STATE or name in {layout.BATCH_STATE + s for s in _SQLITE_SIDECARS}:
            return f"the batch state (batch/{layout.BATCH_STATE}) of the run {shown}"
    return None


def check_output(
    path: str | Path,
    *,
    flag: str,
    command: str,
    folder: bool = False,
    reads: Sequence[tuple[str, str | Path]] = (),
    ours: Callable[[Path], bool] | None = None,
    release_ok: bool = False,
) -> Path:
    """Refuse ``path`` as the output of ``command`` unless it is the command's to write;
    returns it. Call it before any work, with every path the command will write that the
    user named (or that a default put beside what they named).

    ``flag``: the option as the user knows it (``"--out"``), named in the line.
    ``command``: the command's words (``"prb eval correlate"``), named in the line.
    ``folder``: ``path`` is a folder the command writes its files into (else a file).
    ``reads``: (what, path) of each path the command reads, e.g. ``("the config being
    run", cfg_path)``: writing there is refused.
    ``ours``: for a file, whether an existing file is one this command wrote (it may be
    replaced); None: an existing file is always refused unless empty.
    ``release_ok``: the run's ``publish/`` folder is the caller's (``prb publish``).

    Raises :class:`~pipeline.core.errors.InputError` with ``path`` and ``field=flag``; its
    message is ``is WHAT; nothing was written and it is left as it is: give ...``.
    """
    path = Path(path)
    give = (
        "give a new or empty folder (or one this command wrote before)"
        if folder
        else "give the path of a new file (or one this command wrote before)"
    )

    def refuse(what: str) -> InputError:
        return InputError(f"is {what}; {LEFT_AS_IT_IS}: {give}", path=path, field=flag)

    role = run_role(path, release_ok=release_ok)
    if role is not None:
        raise refuse(role)
    full = Path(os.path.realpath(path))
    for what, read in reads:
        if Path(os.path.realpath(read)) == full:
            raise refuse(what)
    kind = path_kind(path)
    if path.is_symlink() and kind is None:
        raise refuse("a link to nothing")
    if folder:
        if kind not in (None, "a folder"):
            raise refuse(f"{kind}, not a folder")
        return path
    if kind == "a folder":
        raise refuse("a folder, not a file")
    if kind is None:
        parent = path.parent
        if not parent.is_dir():
            raise InputError(
                f"the folder {parent} does not exist; nothing was written: create it or "
                "give another path",
                path=path,
                field=flag,
            )
        return path
    if kind != "a file":
        raise refuse(kind)
    if full.stat().st_size == 0:
        return path
    if ours is None or not ours(path):
        raise refuse(f"a file `{command}` did not write")
    return path
