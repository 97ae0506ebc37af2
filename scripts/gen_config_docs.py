"""Rewrite the tables the code owns: the field table of docs/config.md (`prb config fields
--markdown`), the pair filters' table of docs/filters.md and the audit checks' table of
docs/audit.md (both from the registered rules, ``pipeline/rules/``)."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path
from typing import Any

from pipeline.cli import main
from pipeline.rules import RULES, audit_checks, default_filters

DOCS = Path(__file__).resolve().parent.parent / "docs"


def _value(v: Any) -> str:
    if isinstance(v, (list, tuple)):
        return f"({len(v)} patterns)"
    return f"{v:g}" if isinstance(v, float) else str(v)


def _thresholds(cls: Any, why: bool = True) -> str:
    shown = [
        f"`{n}` {_value(t.default)}" + (f": {t.description.rstrip('.')}" if why else "")
        for n, t in cls.thresholds.items()
    ]
    return "; ".join(shown) or "–"


def filter_table() -> str:
    """docs/filters.md: every pair filter in its default order."""
    lines = [
        "| name | drops a pair when | thresholds (config `pairs.*`) | why | audit checks |",
        "|---|---|---|---|---|",
    ]
    for name in default_filters():
        cls = RULES.get(name)
        # a rule's docstring: when it drops a pair, a blank line, then why
        drops, _, why = (cls.__doc__ or "").partition("\n\n")
        drops, why = (" ".join(x.split()) or "–" for x in (drops, why))
        codes = ", ".join(f"`{c.code}`" for c in cls.audits) or "–"
        lines.append(f"| `{name}` | {drops} | {_thresholds(cls)} | {why} | {codes} |")
    return "\n".join(lines) + "\n"


def audit_table() -> str:
    """docs/audit.md: every audit check in report order."""
    lines = [
        "| code | fires when | threshold (config `pairs.*`) | pair-stage filter |",
        "|---|---|---|---|",
    ]
    for code, check in audit_checks().items():
        cls = next(c for c in RULES.values() if check in c.audits)
        stage = f"`{cls.name}`" if cls.position is not None else "–"
        lines.append(f"| `{code}` | {check.meaning} | {_thresholds(cls, False)} | {stage} |")
    return "\n".join(lines) + "\n"


def _config_table() -> str:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        main(["config", "fields", "--markdown"])
    return buf.getvalue()


TABLES = {
    "config.md": ("fields", _config_table),
    "filters.md": ("filters", filter_table),
    "audit.md": ("checks", audit_table),
}


def rewrite(doc: Path, marker: str, table: str) -> str:
    """The document with its generated table between its markers replaced."""
    start, end = f"<!-- {marker}:start -->", f"<!-- {marker}:end -->"
    head, rest = doc.read_text().split(start, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{start}\n{table}{end}{tail}"


if __name__ == "__main__":
    for name, (marker, make) in TABLES.items():
        doc = DOCS / name
        doc.write_text(rewrite(doc, marker, make()))
        print(f"rewrote {doc}")
