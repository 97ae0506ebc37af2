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
    if cfg.name == "llamacpp":  # a relative GGUF path is relative to the config file
        return cls(cfg, resolve=resolve)
    # the openai backend checks that its server answers before its first request, not
    # here: a stage whose answers are all cached needs no server
    return cls(cfg)


_EXTRAS = {"vllm": ("vllm", "vllm"), "ray": ("ray", "ray"), "llamacpp": ("llama_cpp", "local")}


def preflight(
    cfg: Any,
    resolve: Callable[[Path | None], Path | None] | None = None,
    cached: bool = False,
) -> str | None:
    """Check that the configured backend can be built, without building it (loading a
    vLLM model takes minutes): its extra is installed, its server answers, its model file
    (llamacpp) or replay cache exists. Raises BackendError with what to install or fix.
    With ``cached`` (the run has a request cache), an unreachable server is a warning,
    returned: the answers the stages need may all be cached, and the first one that is
    not stops the stage."""
    import importlib.util

    from pipeline.errors import BackendError

    BACKENDS.check(cfg.name)
    if cfg.name in _EXTRAS:
        module, extra = _EXTRAS[cfg.name]
        if importlib.util.find_spec(module) is None:
            raise BackendError(
                f"backend.name is '{cfg.name}', but {module} is not installed: "
                f"pip install 'personalized-rewardbench[{extra}]'"
                + (" on a machine with a CUDA GPU" if cfg.name == "vllm" else "")
            )
        if cfg.name == "llamacpp":
            # the model file is checked now (cheap), loading it waits for the first stage
            from pipeline.backends.llamacpp_backend import resolve_model

            resolve_model(cfg.model, resolve)
        if cfg.name == "ray" and cfg.ray.engine == "http":
            from pipeline.backends.openai_backend import check_reachable

            check_reachable(cfg)
    elif cfg.name == "openai":
        from pipeline.backends.openai_backend import check_reachable

        try:
            check_reachable(cfg)
        except BackendError as exc:
            if not cached:
                raise
            return f"{exc} Continuing with the answers in the run's cache."
    elif cfg.name == "replay" and cfg.replay_cache is not None:
        path = resolve(cfg.replay_cache) if resolve else cfg.replay_cache
        if path is not None and not Path(path).exists():
            raise BackendError(f"backend.replay_cache: {path} does not exist")
    return None
