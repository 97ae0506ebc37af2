"""Builds the configured backend by name."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from pipeline.backends import BACKENDS
from pipeline.backends.base import Backend


def make_backend(
    cfg: Any,
    cache_path: Path | None = None,
    resolve: Callable[[Path | None], Path | None] | None = None,
) -> Backend:
    """``cfg`` is the config's ``backend`` section; ``cache_path`` the run's own cache;
    ``resolve`` turns a path from the config into one relative to the config file."""
    cls = BACKENDS.get(cfg.name)
    if cfg.name == "replay":
        replay = resolve(cfg.replay_cache) if resolve and cfg.replay_cache else None
        return cls(cfg, cache_path=cache_path, replay_path=replay)
    if cfg.name == "openai":
        from pipeline.backends.openai_backend import check_reachable

        check_reachable(cfg)
    return cls(cfg)
