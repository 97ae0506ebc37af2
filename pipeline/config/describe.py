"""Every config field with its default and description, for docs/config.md and the CLI."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from pipeline.config.sections import Config
from pipeline.core.registry import load_target


def describe_fields(model: BaseModel | None = None, prefix: str = "") -> list[tuple[str, str, str]]:
    """(dotted name, default as JSON, description) for every field, for docs and the CLI.

    Walks a default instance, so a section's own defaults (rubric sampling is greedy,
    say) show rather than the defaults of the nested class.
    """
    model = model if model is not None else Config()
    rows = []
    for name, f in type(model).model_fields.items():
        dotted = f"{prefix}{name}"
        value = getattr(model, name)
        if isinstance(value, BaseModel):
            rows.extend(describe_fields(value, dotted + "."))
        else:
            shown = json.dumps(str(value) if isinstance(value, Path) else value)
            desc = f.description or ""
            extra = f.json_schema_extra if isinstance(f.json_schema_extra, dict) else {}
            registry = extra.get("registry")
            if isinstance(registry, str):
                desc = f"{desc} {registry_help(registry)}"
            bounds = _bounds_text(f.metadata)
            rows.append((dotted, shown, f"{desc} {bounds}" if bounds else desc))
    return rows


def registry_help(spec: str) -> str:
    """The entries of a registry (``"module:NAME"``) as a field's help lists them: each
    name, with its class's ``summary`` where it has one. Imports the entries: help only."""
    registry = load_target(spec)
    parts = []
    for name, entry in registry.items():
        summary = str(getattr(entry, "summary", "") or "").rstrip(".")
        parts.append(f"{name} ({summary})" if summary else name)
    return "; ".join(parts) + "."


def _bounds_text(metadata: list[Any]) -> str | None:
    """A field's allowed range from its ge/gt/le/lt constraints, e.g. "(1 to 1,024)"."""
    low = high = None
    for m in metadata:
        if getattr(m, "ge", None) is not None:
            low = f"{m.ge:,}"
        elif getattr(m, "gt", None) is not None:
            low = f"more than {m.gt:,}"
        if getattr(m, "le", None) is not None:
            high = f"{m.le:,}"
        elif getattr(m, "lt", None) is not None:
            high = f"less than {m.lt:,}"
    if low is None and high is None:
        return None
    if high is None:
        return f"({low})" if str(low).startswith("more") else f"(at least {low})"
    if low is None:
        return f"(at most {high})"
    if low.startswith("more"):
        return f"({low}, at most {high})"
    return f"({low} to {high})"
