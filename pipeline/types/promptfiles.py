"""Prompt files a user brings: plain text with ``{name}`` placeholders.

This is the style of the reference benchmark's ``prompts/*.txt`` (arXiv 2604.07343): a
file is read as UTF-8 and stripped at its ends, as the reference's ``load_template`` reads
it, and each ``{name}`` is replaced by its value. The project does not ship those files; a
user with a checkout of the reference points the pipeline (``prompts.dir`` and
``prompts.files``) and ``prb eval`` at them.

Each use of a file declares the placeholders it fills. A file is checked when it is
loaded, before anything is sent: a placeholder the use needs but the file lacks, or one
the file holds but the use cannot fill, is one line naming the file (and the line), the
placeholder and the ones the use knows. Substitution is one pass over the file's text, so
a value that itself contains ``{question}`` is sent as written (the reference's chained
``str.replace`` would substitute inside it).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from pipeline.core.errors import InputError
from pipeline.core.io import path_kind

# The version a row records for a prompt file (a project template records its own number).
FILE_VERSION = "file"
PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
# the longest prompt file read; a larger one is a mistake (a dataset, a binary file)
MAX_BYTES = 1_000_000


@dataclass(frozen=True)
class PromptFile:
    """One prompt file, read and checked: ``text`` is the file stripped at its ends."""

    path: Path
    text: str
    sha256: str
    placeholders: tuple[str, ...]

    def fill(self, values: Mapping[str, str]) -> str:
        """The text with every placeholder replaced by its value (one pass)."""
        return PLACEHOLDER.sub(lambda m: values[m.group(1)], self.text)

    def provenance(self) -> dict[str, str]:
        """What a row records of the file (its name, not the folder: paths are the
        user's machine)."""
        return {
            "template": self.path.name,
            "template_version": FILE_VERSION,
            "template_hash": self.sha256,
        }


def read_prompt_file(
    path: str | Path,
    *,
    needs: Iterable[str],
    fills: Iterable[str] = (),
    what: str,
) -> PromptFile:
    """Read and check one prompt file for a use (``what``, e.g. "the chosen prompt"):
    every placeholder in ``needs`` must occur; any placeholder must be in ``needs`` or
    ``fills`` (those the use can fill but does not require)."""
    p = Path(path).expanduser()
    needed = tuple(dict.fromkeys(needs))
    known = needed + tuple(n for n in dict.fromkeys(fills) if n not in needed)
    known_text = ", ".join("{" + n + "}" for n in known)
    try:
        kind = path_kind(p)
        if kind != "a file":
            why = "does not exist" if kind is None else f"is {kind}, not a file"
            raise InputError(f"{why}; {what} is read from this file", path=p)
        if p.stat().st_size > MAX_BYTES:
            raise InputError(
                f"is larger than {MAX_BYTES:,} bytes; {what} should be a short text file", path=p
            )
        raw = p.read_bytes()
    except OSError as exc:
        raise InputError(
            f"cannot be read ({exc.strerror or exc}); {what} needs it", path=p
        ) from None
    try:
        full = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise InputError("is not UTF-8 text; save it as UTF-8", path=p, line=line) from None
    text = full.strip()
    if not text:
        raise InputError(f"is empty; {what} needs its text", path=p)
    found: dict[str, int] = {}
    lead = len(full) - len(full.lstrip())
    for m in PLACEHOLDER.finditer(text):
        found.setdefault(m.group(1), full.count("\n", 0, lead + m.start()) + 1)
    for name, line in found.items():
        if name not in known:
            raise InputError(
                f"placeholder {{{name}}} is not one {what} can fill ({known_text}); "
                "rename or remove it",
                path=p,
                line=line,
            )
    missing = [n for n in needed if n not in found]
    if missing:
        raise InputError(
            f"has no {{{missing[0]}}} placeholder; {what} needs "
            + ", ".join("{" + n + "}" for n in needed),
            path=p,
        )
    return PromptFile(p, text, hashlib.sha256(raw).hexdigest(), tuple(found))


def read_prompt_files(
    folder: Path | None,
    files: Mapping[str, str],
    uses: Mapping[str, Iterable[str]],
    optional: Iterable[str] = (),
    *,
    section: str = "prompts",
) -> dict[str, PromptFile]:
    """The files a config section names (``<section>.files``: use -> file name in
    ``<section>.dir``), each read and checked for its use's placeholders (``uses``) and
    the ``optional`` ones. Read again only when a file changes."""
    if not files:
        return {}
    if folder is None:
        raise InputError(
            f"{section}.files names {', '.join(files)}, but {section}.dir is not set; point it "
            "at the folder that holds the files",
            field=f"{section}.dir",
        )
    kind = path_kind(Path(folder).expanduser())
    if kind not in (None, "a folder"):  # a missing folder: each file says it does not exist
        raise InputError(
            f"is {kind}, not a folder; point {section}.dir at the folder that holds the files",
            path=Path(folder).expanduser(),
            field=f"{section}.dir",
        )
    out = {}
    for use, name in files.items():
        path = Path(folder).expanduser() / name
        try:
            st = path.stat()
            stamp: tuple[int, int] = (st.st_mtime_ns, st.st_size)
        except OSError:
            stamp = (0, -1)  # read_prompt_file says what is wrong with it
        out[use] = _cached(
            str(path),
            stamp,
            tuple(uses[use]),
            tuple(optional),
            f"the {use} prompt ({section}.files.{use})",
        )
    return out


@lru_cache(maxsize=64)
def _cached(
    path: str, stamp: tuple[int, int], needs: tuple[str, ...], fills: tuple[str, ...], what: str
) -> PromptFile:
    return read_prompt_file(path, needs=needs, fills=fills, what=what)
