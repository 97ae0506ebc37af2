"""The interface: the ``prb`` command (``prb``) and the one line an error prints
(``errorline``). ``python -m pipeline.cli`` runs ``prb``."""

from pipeline.cli.prb import main

__all__ = ["main"]
