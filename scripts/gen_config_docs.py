"""Rewrite the field table of docs/config.md from the code (`prb config fields --markdown`)."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

from pipeline.cli import main

DOC = Path(__file__).resolve().parent.parent / "docs" / "config.md"
START, END = "<!-- fields:start -->", "<!-- fields:end -->"

buf = io.StringIO()
with contextlib.redirect_stdout(buf):
    main(["config", "fields", "--markdown"])
text = DOC.read_text()
head, rest = text.split(START, 1)
_, tail = rest.split(END, 1)
DOC.write_text(f"{head}{START}\n{buf.getvalue()}{END}{tail}")
print(f"rewrote {DOC}")
