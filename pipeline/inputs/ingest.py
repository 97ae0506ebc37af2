"""Ingest: read the input examples into the ``examples`` contract.

The format is ``input.format`` in the config, a name in the input-format registry
(``pipeline.inputs``; docs/inputs.md): ``lamp`` (LaMP-QA-style JSONL), ``generic``
(users + questions JSONL), ``hf`` (a ``datasets`` folder or a parquet file) and ``hub``
(a dataset on the Hugging Face Hub), or any format registered beside them. Each reader
validates every row so that an error names the file (or dataset), the line or row and the
dotted field (e.g. ``profile[2].text``); ingest writes no file, so a bad input never leaves
a partial output behind.

Each returned row has exactly these keys::

    example_id      str   stable_id("example", source_id)
    source_id       str   the input's own id
    user_id         str   the row's user_id, else its id (one asker per question)
    question        str   with visible text (fields.visible_text)
    category        str | None
    profile         list of {"id": str, "category": str | None, "text": str}
    narrative       str | None
    rubric_aspects  list of {"aspect": str, "evidence": str, "reason": str} | None
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

from pipeline.inputs import FORMATS, InputFormat, InputSection

Resolve = Callable[[Path | None], Path | None]


def reader(cfg: InputSection, resolve: Resolve = lambda p: p) -> InputFormat:
    """The configured format's reader for this input."""
    return FORMATS.get(cfg.format)(cfg, resolve)


def iter_examples(cfg: InputSection, resolve: Resolve = lambda p: p) -> Iterator[dict]:
    """Read and validate the input example by example, as rows of the ``examples``
    contract; ``cfg.limit`` keeps the first N. The input is streamed, never held whole, so
    a problem on a late line raises after earlier rows were yielded: a caller that writes
    rows must discard them then (the ingest stage does). Raises ``InputError`` naming the
    file, the line (or row) and the field of the first problem found.

    ``resolve`` turns a configured path into a usable one (pass ``Config.resolve_input``
    so that relative paths are read from the config file's folder).
    """
    rows = reader(cfg, resolve).read()
    for n, row in enumerate(rows):
        if cfg.limit is not None and n >= cfg.limit:
            # the rest is still read and checked: a limited run fails on the same input
            # a full run would
            for _ in rows:
                pass
            return
        yield row


def load_examples(cfg: InputSection, resolve: Resolve = lambda p: p) -> list[dict]:
    """Every input example, validated (see ``iter_examples``); the whole input is checked
    before anything is returned."""
    return list(iter_examples(cfg, resolve))


def check_input(cfg: InputSection, resolve: Resolve = lambda p: p) -> int:
    """Read and validate the whole input without keeping it; returns the row count. Run
    before anything is written, so that bad input changes nothing on disk (at the cost of
    one more pass over the input when the ingest stage runs)."""
    return sum(1 for _ in iter_examples(cfg, resolve))


def expected_examples(cfg: InputSection, resolve: Resolve = lambda p: p) -> int:
    """The examples a run of this input will hold (``input.limit`` applied), as the format
    counts them without validating (a JSONL file's non-blank lines, a dataset's rows)."""
    n = reader(cfg, resolve).count()
    return min(n, cfg.limit) if cfg.limit is not None else n
