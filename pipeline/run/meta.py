"""The run directory's metadata files, parsed into typed objects.

``stage.json``, ``_DONE.json`` and ``stats.json`` are written by the pipeline, but a disk,
an editor or an older version can leave them of another shape. Each is read through
:func:`read_meta`: valid JSON of the wrong shape (``[]``, a string, a ``files`` entry that
is a string) is one :class:`~pipeline.core.errors.RunDirError` naming the file, the field and
the command that rewrites it, never an AttributeError three calls later.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from pipeline.core.errors import RunDirError
from pipeline.core.io import read_json

M = TypeVar("M", bound=BaseModel)


class _Meta(BaseModel):
    # extra keys are kept (a newer version may add some); types of the known ones are not
    # coerced: a count written as "3" is damage, not a count
    model_config = ConfigDict(extra="allow", strict=True)


class StageMeta(_Meta):
    """``stage.json``: what a stage runs with, written when it starts."""

    stage: str
    fingerprint: str
    settings: dict[str, Any] = Field(default_factory=dict)
    expected_examples: int | None = None
    started: float | None = None
    environment: dict[str, Any] = Field(default_factory=dict)


class ShardEntry(_Meta):
    """One shard file in a manifest."""

    rows: int = Field(ge=0)
    bytes: int = Field(ge=0)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")


class Marker(_Meta):
    """``_DONE.json``: the manifest of a finished stage, written last.

    ``files`` is None only for a marker written before manifests existed: such a stage is
    re-done, never trusted."""

    fingerprint: str | None = None
    time: float | None = None
    rows: int = Field(0, ge=0)
    rejects: int = Field(0, ge=0)
    files: dict[str, ShardEntry] | None = None
    # None: written before markers recorded their inputs (such a stage is not re-done)
    inputs: dict[str, str | None] | None = None


class Stats(_Meta):
    """``stats.json``: a stage's figures; only its being an object is checked here (each
    stage writes its own figures), and the few fields readers rely on."""

    examples: int | None = Field(None, ge=0)
    seconds: float | None = None
    pending_examples: int | None = Field(None, ge=0)


def _problem(err: ValidationError) -> str:
    first = err.errors()[0]
    where = ".".join(str(p) for p in first["loc"])
    what = first["msg"].removeprefix("Value error, ")
    if first["type"] == "model_type":
        return "must be a JSON object"
    return f"field '{where}': {what}" if where else what


def parse_meta(path: Path, raw: Any, model: type[M], fix: str) -> M:
    """``raw`` (the parsed JSON of ``path``) as ``model``, or a RunDirError naming the
    file, the first field that is wrong and ``fix`` (the command that rewrites it)."""
    try:
        return model.model_validate(raw)
    except ValidationError as err:
        raise RunDirError(f"{path}: {_problem(err)}; {fix}", path=path) from None


def read_meta(path: Path, model: type[M], fix: str) -> M | None:
    """The file as ``model``; None when it does not exist. Unreadable bytes, invalid JSON
    and a wrong shape are each one RunDirError naming the file and ``fix``."""
    try:
        raw = read_json(path)
    except FileNotFoundError:
        return None
    except (ValueError, UnicodeDecodeError) as exc:
        reason = "not UTF-8 text" if isinstance(exc, UnicodeDecodeError) else "not valid JSON"
        raise RunDirError(f"{path}: {reason}; {fix}", path=path) from None
    except IsADirectoryError:
        raise RunDirError(f"{path}: a folder where a file belongs; {fix}", path=path) from None
    return parse_meta(path, raw, model, fix)
