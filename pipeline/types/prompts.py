"""Prompt templates: Jinja files under ``prompts/``, each with a version and a hash.

A template file starts with a ``{# version: N ... #}`` comment and holds sections that
begin with a line ``### system`` or ``### user``; each section renders to one message.
The sha256 of the file is recorded on every row the template produced.

Each rendered message is stripped of the whitespace at its ends, unless the header comment
holds a line ``strip: no``: then a message is exactly what its section renders (from the
line after its ``###`` header), so a variable at a message's end keeps its own spaces and
newlines (``eval_pointwise`` sends the question as given).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import jinja2

from pipeline.core.errors import PipelineError
from pipeline.core.resources import data_dir

_VERSION_RE = re.compile(r"\{#\s*version:\s*([\w.\-]+)")
_SECTION_RE = re.compile(r"^### (system|user|assistant)\s*$", re.MULTILINE)
_NO_STRIP_RE = re.compile(r"^\s*strip:\s*no\s*$", re.MULTILINE)

_ENV = jinja2.Environment(
    undefined=jinja2.StrictUndefined,
    autoescape=False,  # plain-text prompts, never HTML
    keep_trailing_newline=False,
    trim_blocks=True,
    lstrip_blocks=True,
)


@dataclass(frozen=True)
class PromptTemplate:
    name: str
    version: str
    sha256: str
    # (role, template, its text when it has no Jinja syntax: rendered once, not per request)
    sections: tuple[tuple[str, jinja2.Template, str | None], ...]
    strip: bool = True  # False: the header says "strip: no"

    def render(self, **variables: Any) -> tuple[tuple[str, str], ...]:
        """Render to (role, content) messages."""
        try:
            return tuple(
                (role, static if static is not None else self._finish(t.render(**variables)))
                for role, t, static in self.sections
            )
        except jinja2.UndefinedError as exc:
            raise PipelineError(f"prompt template '{self.name}': {exc}") from exc

    def _finish(self, text: str) -> str:
        return text.strip() if self.strip else text

    @property
    def short_hash(self) -> str:
        return self.sha256[:12]

    def provenance(self) -> dict[str, str]:
        return {
            "template": self.name,
            "template_version": self.version,
            "template_hash": self.sha256,
        }


def parse_template(name: str, text: str) -> PromptTemplate:
    m = _VERSION_RE.search(text)
    if not m:
        raise PipelineError(f"prompt template '{name}' has no '{{# version: N #}}' header")
    parts = _SECTION_RE.split(text)
    # parts = [preamble, role1, body1, role2, body2, ...]
    strip = not _NO_STRIP_RE.search(parts[0])
    sections = []
    for role, body in zip(parts[1::2], parts[2::2], strict=True):
        if not strip:
            body = body.removeprefix("\n")  # the end of the "### role" line itself
        try:
            template = _ENV.from_string(body)
            plain = not any(mark in body for mark in ("{{", "{%", "{#"))
            static = template.render() if plain else None
            if static is not None and strip:
                static = static.strip()
            sections.append((role, template, static))
        except jinja2.TemplateSyntaxError as exc:
            raise PipelineError(f"prompt template '{name}' line {exc.lineno}: {exc}") from exc
    if not sections:
        raise PipelineError(f"prompt template '{name}' has no '### system' / '### user' section")
    sha = hashlib.sha256(text.encode("utf-8")).hexdigest()
    return PromptTemplate(name, m.group(1), sha, tuple(sections), strip)


@lru_cache(maxsize=64)
def load_template(name: str, folder: str | None = None) -> PromptTemplate:
    base = Path(folder) if folder else data_dir("prompts")
    path = base / f"{name}.j2"
    if not path.exists():
        known = sorted(p.stem for p in base.glob("*.j2"))
        raise PipelineError(f"prompt template '{name}' not found in {base}; known: {known}")
    return parse_template(name, path.read_text(encoding="utf-8"))
