"""Command-line options more than one command takes, defined once (argparse only, so
``prb --help`` stays instant)."""

from __future__ import annotations

import argparse


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
