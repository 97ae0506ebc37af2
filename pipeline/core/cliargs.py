"""Command-line options more than one command takes, defined once (argparse only, so
``prb --help`` stays instant)."""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Sequence
from pathlib import Path


def add_set_option(p: argparse.ArgumentParser, example: str = "responses.n=4") -> None:
    """``--set KEY.PATH=VALUE`` (repeatable): override a config field."""
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY.PATH=VALUE",
        help=f"override a config field (repeatable), e.g. --set {example}",
    )


def command_line(
    words: Sequence[str | Path],
    overrides: Sequence[str] = (),
    **options: str | Path | None,
) -> str:
    """A command to suggest, shell-quoted: ``words`` (``prb run CONFIG``), then each option
    given (``until="judge"`` is ``--until judge``; None leaves it out), then every
    ``--set`` of the command it continues, so the suggestion names the same run."""
    parts = [str(w) for w in words]
    for name, value in options.items():
        if value is not None:
            parts += [f"--{name.replace('_', '-')}", str(value)]
    for o in overrides:
        parts += ["--set", o]
    return shlex.join(parts)
