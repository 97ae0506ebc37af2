"""Builds and checks the configured backend: each asks the backend's own class."""

from __future__ import annotations

from pathlib import Path

from pipeline.kinds.backend import BACKENDS, Backend, BackendSection, Resolve


def make_backend(
    cfg: BackendSection, cache_path: Path | None = None, resolve: Resolve | None = None
) -> Backend:
    """``cfg`` is the config's ``backend`` section; ``cache_path`` the run's own cache;
    ``resolve`` turns a path from the config into one relative to the config file."""
    return BACKENDS.get(cfg.name).build(cfg, cache_path=cache_path, resolve=resolve)


def check_installed(cfg: BackendSection) -> None:
    """BackendError with the install line when the backend's extra is missing: said
    before the first stage, also when every stage is done."""
    BACKENDS.get(cfg.name).check_installed(cfg)


def preflight(
    cfg: BackendSection, resolve: Resolve | None = None, cached: bool = False
) -> str | None:
    """Check that the configured backend can be built, without building it (loading a
    vLLM model takes minutes): see :meth:`Backend.preflight`. Raises BackendError with
    what to install or fix; returns a warning the run's cache may make harmless."""
    return BACKENDS.get(cfg.name).preflight(cfg, resolve=resolve, cached=cached)
