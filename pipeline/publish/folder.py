"""The release folder on disk: where it may go, what is in it, and replacing it.

A release is built in a temporary folder beside its target and renamed into place at the
end, so a failure leaves the previous release (or nothing), never half of one. The folder
holds the marker ``.prb-release`` with a manifest of every file ``prb publish`` wrote
there (size and sha256). Replacing an earlier release removes exactly those files: what a
person added (a notebook, a ``figs/`` folder) is carried into the new release unchanged,
and where keeping it would make the release wrong (a file where the release writes one, a
parquet file inside a config folder, a release file edited since) the command refuses
before any work, naming it. Paths are compared by their real path (links resolved), so a
link cannot lead a release into the run directory.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

from pipeline.core.errors import InputError
from pipeline.core.io import fsync_dir, read_json
from pipeline.run import RunDir
from pipeline.run.layout import RELEASE_ALL, RELEASE_MARKER, RELEASE_SUMMARY
from pipeline.run.outputs import check_output

FLAG = "--out"


def _real(path: Path) -> Path:
    return Path(os.path.realpath(path))


def read_marker(path: Path) -> dict[str, Any] | None:
    """The release marker of ``path`` as an object; None when there is none or it is not
    one of ours."""
    try:
        raw = read_json(path / RELEASE_MARKER)
    except (OSError, ValueError, RecursionError):
        return None
    return raw if isinstance(raw, dict) else None


def is_release(path: Path) -> bool:
    """Whether ``path`` is a folder `prb publish` wrote: it holds the release marker (or,
    from versions before the marker, a release.json of ours beside an ``all`` config)."""
    if (path / RELEASE_MARKER).is_file():
        return True
    summary = path / RELEASE_SUMMARY
    if summary.is_file() and (path / RELEASE_ALL).is_dir():
        try:
            raw = read_json(summary)
        except (OSError, ValueError):
            return False
        return isinstance(raw, dict) and {"policy", "configs", "provenance"} <= raw.keys()
    return False


def check_out_dir(out: Path, rd: RunDir, *, default: bool, force: bool) -> str | None:
    """Refuse, before any work, an output folder that is not ours to replace: a file, a
    link, a folder `prb publish` did not write, the run directory or anything inside it but
    its own release folder, or a folder holding the run (all by real path). Returns a note
    when an existing release will be replaced. ``default``: ``out`` is the run's own
    release folder."""
    lexical = Path(os.path.abspath(out))
    full = _real(out)
    run = _real(rd.path)
    if not default:
        # a run's own files and folders, whatever run: the one check of outputs
        own = full == _real(rd.release_dir)
        check_output(out, flag=FLAG, command="prb publish", folder=True, release_ok=own)
        if full == run or run.is_relative_to(full):
            raise InputError(
                f"holds the run directory {run}; publishing there would replace the run. "
                "Choose a folder outside the run (or leave --out out: <run>/publish)",
                path=out,
                field=FLAG,
            )
        if full.is_relative_to(run) and full != _real(rd.release_dir):
            raise InputError(
                f"is inside the run directory {run}"
                + (f" (it leads to {full})" if full != lexical else "")
                + ", which only the pipeline writes; choose a folder outside the run (or "
                "leave --out out: <run>/publish)",
                path=out,
                field=FLAG,
            )
    if lexical.exists() or lexical.is_symlink():
        if not lexical.is_dir() or lexical.is_symlink():
            raise InputError(
                "is a file (or a link), not a release folder; choose a new folder for the "
                "release, nothing was written",
                path=out,
                field=FLAG,
            )
        if not any(lexical.iterdir()):
            return None  # an empty folder: taken as it is
        if not is_release(lexical):
            raise InputError(
                "exists and was not written by `prb publish` (no release marker in it); "
                "nothing was written or deleted. Choose a new or empty folder for the release",
                path=out,
                field=FLAG,
            )
        if not default and not force:
            raise InputError(
                "holds an earlier release; pass --force to replace it (only the files "
                "`prb publish` wrote are replaced; files you added are kept), or choose "
                "another folder",
                path=out,
                field=FLAG,
            )
        return f"replaced the earlier release in {full}"
    return None


# ---- what the project wrote -----------------------------------------------------------


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def manifest(folder: Path) -> dict[str, dict[str, Any]]:
    """Every file under ``folder`` (its path relative to it, POSIX): size and sha256."""
    out = {}
    for p in sorted(folder.rglob("*")):
        if p.is_file() and not p.is_symlink():
            out[p.relative_to(folder).as_posix()] = {
                "bytes": p.stat().st_size,
                "sha256": _sha256(p),
            }
    return out


def _written(out: Path) -> dict[str, dict[str, Any] | None]:
    """The files `prb publish` wrote in the release at ``out``, with their size and sha256
    where its marker recorded them; for a release from before the manifest, the files of
    its release.json (content unknown: None)."""
    marker = read_marker(out)
    files = marker.get("files") if marker is not None else None
    if isinstance(files, dict):
        own: dict[str, dict[str, Any] | None] = {
            str(k): (v if isinstance(v, dict) else None) for k, v in files.items()
        }
    else:
        own = {"README.md": None, RELEASE_SUMMARY: None}
        try:
            summary = read_json(out / RELEASE_SUMMARY)
        except (OSError, ValueError, RecursionError):
            summary = {}
        configs = summary.get("configs") if isinstance(summary, dict) else None
        data = summary.get("data_files") if isinstance(summary, dict) else None
        for name in configs if isinstance(configs, dict) else {RELEASE_ALL: 0}:
            entry = data.get(name) if isinstance(data, dict) else None
            path = entry.get("path") if isinstance(entry, dict) else None
            if isinstance(path, str):
                own[path] = None
    own[RELEASE_MARKER] = None
    return own


def strangers(out: Path, new_files: set[str]) -> list[str]:
    """What a person added to the release at ``out`` (paths relative to it; a folder of
    theirs as one entry), checked to be safe to keep beside the new release's files
    ``new_files``; one InputError naming the first that is not (nothing is written)."""
    if not out.is_dir() or not is_release(out):
        return []
    own = _written(out)
    own_dirs = {p.rsplit("/", i)[0] for p in own for i in range(1, p.count("/") + 1)}
    new_dirs = {f.rsplit("/", 1)[0] for f in new_files if "/" in f}
    kept: list[str] = []
    for root, dirs, files in os.walk(out):
        base = Path(root)
        for name in sorted(dirs):
            p = base / name
            rel = p.relative_to(out).as_posix()
            if rel in own_dirs and not p.is_symlink():
                continue  # ours: its contents are looked at one by one
            if rel in new_dirs or any(f.startswith(rel + "/") for f in new_files):
                _refuse(out, rel, "the new release writes its own files there")
            kept.append(rel)
        dirs[:] = [d for d in dirs if (base / d).relative_to(out).as_posix() in own_dirs]
        for name in sorted(files):
            p = base / name
            rel = p.relative_to(out).as_posix()
            if rel in own:
                want = own[rel]
                if want is not None and (
                    p.is_symlink()
                    or p.stat().st_size != want.get("bytes")
                    or _sha256(p) != want.get("sha256")
                ):
                    _refuse(
                        out,
                        rel,
                        "`prb publish` wrote it, but it was changed since; replacing the "
                        "release would lose the change: move your copy out of the folder",
                    )
                continue
            if rel in new_files:
                _refuse(out, rel, "the new release writes a file of this name")
            folder = rel.rsplit("/", 1)[0] if "/" in rel else ""
            if folder in new_dirs and name.endswith(".parquet"):
                _refuse(out, rel, f"a parquet file would be read as part of config '{folder}'")
            kept.append(rel)
    return kept


def _refuse(out: Path, rel: str, why: str) -> None:
    raise InputError(
        f"holds {rel}, which `prb publish` did not write: {why}. Nothing was written or "
        "deleted; move it out of the release folder, then publish again",
        path=out,
        field=FLAG,
    )


def write_marker(folder: Path, content: dict[str, Any]) -> None:
    """The release marker, with the manifest of every file written so far: the last file
    of a release."""
    files = manifest(folder)
    files.pop(RELEASE_MARKER, None)
    write_durable(
        folder / RELEASE_MARKER,
        json.dumps({**content, "files": files}, indent=2, sort_keys=True) + "\n",
    )


# ---- writing ------------------------------------------------------------------------------


def write_table(path: Path, table: Any) -> None:
    """An Arrow table (its schema carrying the `datasets` Features) as one parquet file."""
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as fh:
        pq.write_table(table, fh)
        fh.flush()
        os.fsync(fh.fileno())


def write_durable(path: Path, text: str) -> None:
    # inside the temporary release folder the rename of the folder is the atomic step;
    # each file only needs to be on disk before it
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())


def temporary_beside(out: Path) -> Path:
    """A new folder beside ``out`` to build the release in (not mkdtemp: its folder is
    private, 0700, and a release is meant to be shared)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}-{time.time_ns()}"
    tmp.mkdir()
    return tmp


def carry(out: Path, tmp: Path, kept: list[str]) -> None:
    """Copy what a person added to the old release into the new one (copied, not moved:
    until the swap, the old release stays whole)."""
    for rel in kept:
        src, dst = out / rel, tmp / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir() and not src.is_symlink():
            shutil.copytree(src, dst, symlinks=True)
        else:
            shutil.copy2(src, dst, follow_symlinks=False)


def swap_into_place(tmp: Path, out: Path) -> None:
    """Replace ``out`` with ``tmp``: the old release (checked to be one, see
    :func:`check_out_dir`) is renamed away first, so at every instant ``out`` is either the
    old release or the new one, and only then removed."""
    trash = None
    if out.exists():
        trash = out.with_name(f".{out.name}.old-{time.time_ns()}")
        out.rename(trash)
    try:
        tmp.rename(out)
    except BaseException:
        if trash is not None:
            trash.rename(out)
        raise
    fsync_dir(out.parent)
    if trash is not None:
        shutil.rmtree(trash, ignore_errors=True)
