"""``--smoke``: every benchmark's tiny run, so CI sees a script that no longer runs.

A smoke run checks that the script completes and writes its figures' file; its timings
mean nothing (tests/test_benchmarks_smoke.py runs every ``benchmarks/*.py`` this way and
fails on one without the flag). Its figures never land in ``benchmarks/results/``: an
``--out`` there is replaced by a file of the same name in a fresh temporary folder.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
HELP = (
    "a tiny run that checks the script completes and writes its file (for CI); sets the "
    "sizes, and writes to a temporary folder unless --out is outside benchmarks/results/"
)


def add_flag(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--smoke", action="store_true", help=HELP)


def apply(args: argparse.Namespace, **tiny: Any) -> None:
    """Under ``--smoke``: set ``tiny`` (the sizes of a tiny run) on ``args`` and move an
    ``--out`` that points into ``benchmarks/results/`` to a temporary folder."""
    if not args.smoke:
        return
    for name, value in tiny.items():
        setattr(args, name, value)
    out = Path(args.out).resolve()
    if out.is_relative_to(RESULTS.resolve()):
        args.out = Path(tempfile.mkdtemp(prefix="bench-smoke-")) / out.name
        print(f"smoke run: figures go to {args.out}", flush=True)
