"""The error of the annotate commands: Label Studio cannot be used.

A module of its own, imported by ``server``, ``export``, ``importer`` and ``cli`` and
importing none of them, so that sharing it makes no import circle.
"""

from __future__ import annotations

from pipeline.core.errors import PipelineError


class LabelStudioError(PipelineError):
    """Label Studio cannot be used: server down, bad token, missing project or server venv."""
