"""Errors the pipeline raises on purpose, each carrying where the problem is."""

from __future__ import annotations

from pathlib import Path


class PipelineError(Exception):
    """Base class: an error the CLI prints as one clean message, without a traceback."""


class InputError(PipelineError):
    """Bad user input: names the file, and where known the line and the field."""

    def __init__(
        self,
        message: str,
        *,
        path: str | Path | None = None,
        line: int | None = None,
        field: str | None = None,
    ) -> None:
        self.path = str(path) if path is not None else None
        self.line = line
        self.field = field
        self.reason = message
        where = []
        if self.path:
            where.append(self.path)
        if line is not None:
            where.append(f"line {line}")
        if field:
            where.append(f"field '{field}'")
        prefix = ", ".join(where)
        super().__init__(f"{prefix}: {message}" if prefix else message)


class ConfigError(InputError):
    """A config file or a --set override is invalid."""


class BackendError(PipelineError):
    """The LLM backend cannot be used (missing extra, unreachable server, cache miss...)."""


class StageError(PipelineError):
    """A stage cannot run (missing input stage, too many failed requests...)."""
