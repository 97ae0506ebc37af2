"""Finds the project's data folders (prompts/, rubrics/, annotation/).

In a built wheel they are packaged under ``pipeline/_data/``; in a source checkout or an
editable install they sit at the repository root, beside the package.
"""

from __future__ import annotations

from pathlib import Path

from pipeline.core.errors import PipelineError

_PKG = Path(__file__).resolve().parents[1]  # pipeline/


def data_dir(name: str) -> Path:
    for candidate in (_PKG / "_data" / name, _PKG.parent / name):
        if candidate.is_dir():
            return candidate
    raise PipelineError(
        f"data folder '{name}' not found (looked in {_PKG / '_data'} and {_PKG.parent}); "
        "reinstall personalized-rewardbench"
    )
