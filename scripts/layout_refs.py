"""Count the places in pipeline/ that know a run-directory file or folder name.

A place is a string literal (not a docstring) that contains a run-directory file name
(run.yaml, _DONE.json, data-*.jsonl, round-N, tasks.json...) or that is a run-directory
folder name ("publish", "pairs"...) used as a path part (right after a ``/``). The modules
of ``pipeline/run/``, which own the layout, are counted apart. Prints one line per module
and the total outside the owner:

    .venv/bin/python scripts/layout_refs.py
"""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / "pipeline"
OWNER = PKG / "run"
FILES = re.compile(
    r"(run\.yaml|_DONE\.json|stage\.json|stats\.json|environment\.json|cache\.sqlite|"
    r"data-[*{\d]|rejects-[*{]|round-|tasks\.json|sides\.json|verdicts\.jsonl|export\.json|"
    r"agreement\.json|annotations\.jsonl|adjudication\.jsonl|skipped\.jsonl|release\.json|"
    r"\"\.lock\"|\.prb-release)"
)
DIRS = {"publish", "annotate", "report", "eval", "ingest", "rubrics", "responses", "judge",
        "pairs", "all"}  # fmt: skip
OPENERS = (tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.NL, tokenize.ENCODING)


def places(path: Path) -> list[tuple[int, str]]:
    """(line, literal) of every place in ``path`` that knows a run-directory name."""
    toks = list(tokenize.generate_tokens(io.StringIO(path.read_text()).readline))
    out = []
    for i, t in enumerate(toks):
        if t.type != tokenize.STRING:
            continue
        before = toks[i - 1].type if i else tokenize.NEWLINE
        after = toks[i + 1].type if i + 1 < len(toks) else tokenize.NEWLINE
        if before in OPENERS and after in (tokenize.NEWLINE, tokenize.NL):
            continue  # a docstring
        if FILES.search(t.string) or (
            t.string.strip("'\"") in DIRS and i and toks[i - 1].string == "/"
        ):
            out.append((t.start[0], t.string[:70]))
    return out


def main() -> None:
    outside = 0
    for path in sorted(PKG.rglob("*.py")):
        found = places(path)
        if not found:
            continue
        owner = OWNER in path.parents
        rel = path.relative_to(PKG.parent)
        print(f"{len(found):4d}  {rel}{' (owner)' if owner else ''}")
        if not owner:
            outside += len(found)
            for line, text in found:
                print(f"        line {line}: {text}")
    print(f"places outside pipeline/run/: {outside}")


if __name__ == "__main__":
    main()
