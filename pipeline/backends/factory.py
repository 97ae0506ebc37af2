"""Builds the configured backend by name."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipeline.backends import BACKENDS
from pipeline.backends.base import Backend


def make_backend(cfg: Any, cache_path: Path | None = None) -> Backend:
    """``cfg`` is the config's ``backend`` section; ``cache_path`` the run's own cache."""
    cls = BACKENDS.get(cfg.name)
    if cfg.name == "replay":
        return cls(cfg, cache_path=cache_path)
    if cfg.name == "openai":
        from pipeline.backends.openai_backend import check_reachable

        check_reachable(cfg)
    return cls(cfg)
