"""LLM backends, looked up by name. Heavy engines are imported only when chosen.

A backend is one class (pipeline/backends/base.py): registering it here, by its module
path (imported on first use) or the class itself, is all that adding one takes
(docs/backends.md). The registry (pipeline/registry.py) refuses a name taken twice and a
class that is not a ``Backend`` whose ``name`` is the registered one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pipeline.registry import Registry

if TYPE_CHECKING:
    from pipeline.backends.base import Backend  # noqa: F401  (the registry's type)


class BackendRegistry(Registry["type[Backend]"]):
    """Name -> backend class (pipeline/registry.py's checks), plus what a run records of
    every registered backend."""

    def answers_new(self, name: str) -> bool:
        """Whether backend ``name`` sends requests to a model (not a replay); True for a
        name no longer registered (an older run's)."""
        return name not in self or self.get(name).answers_new

    def environment(self) -> dict[str, str]:
        """Every registered backend's own facts for environment.json (the vLLM release
        its backend was verified with)."""
        out: dict[str, str] = {}
        for name in self.names():
            out.update(self.get(name).environment)
        return out

    def libraries(self) -> list[str]:
        """Every registered backend's libraries, for a run's environment.json."""
        out: list[str] = []
        for name in self.names():
            out += self.get(name).libraries
        return list(dict.fromkeys(out))


BACKENDS = BackendRegistry("backend", "pipeline.backends.base:Backend", field="backend.name")
BACKENDS.register("openai", "pipeline.backends.openai.backend:OpenAIBackend")
BACKENDS.register("vllm", "pipeline.backends.vllm_backend:VLLMBackend")
BACKENDS.register("llamacpp", "pipeline.backends.llamacpp_backend:LlamaCppBackend")
BACKENDS.register("replay", "pipeline.backends.replay:ReplayBackend")
BACKENDS.register("ray", "pipeline.backends.ray_backend:RayBackend")
BACKENDS.register("batchfile", "pipeline.batch.backend:BatchFileBackend")

__all__ = ["BACKENDS", "BackendRegistry"]
