"""The package's size and shape, for notes on a restructuring: lines, modules, and project
imports made inside functions (lazy ones), counted with the import reader the layer test
uses (``pipeline.core.sourcehash.imports_in``).

    python scripts/code_shape.py                 # this checkout's pipeline/
    python scripts/code_shape.py /tmp/old-clone  # another checkout (e.g. a git worktree)

Prints one line of JSON."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from pipeline.core.sourcehash import imports_in


def shape(root: Path) -> dict[str, int]:
    pkg = root / "pipeline"
    files = sorted(pkg.rglob("*.py"))
    names = set()
    for p in files:
        parts = p.relative_to(root).with_suffix("").parts
        names.add(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    lines = lazy = 0
    for p in files:
        text = p.read_text(encoding="utf-8")
        lines += text.count("\n")
        lazy += sum(1 for _, _, top in imports_in(text, names.__contains__) if not top)
    return {"modules": len(files), "lines": lines, "lazy_project_imports": lazy}


if __name__ == "__main__":
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent.parent
    print(json.dumps({"root": str(root), **shape(root)}))
