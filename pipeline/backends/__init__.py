"""LLM backends, looked up by name. Heavy engines are imported only when chosen.

A backend is one class (pipeline/backends/base.py): registering it here, by its module
path (imported on first use) or the class itself, is all that adding one takes
(docs/backends.md). The registry refuses a name taken twice and a class that is not a
``Backend`` whose ``name`` is the registered one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pipeline.registry import Registry

if TYPE_CHECKING:
    from pipeline.backends.base import Backend


class BackendRegistry(Registry):
    """Name -> backend class; refuses duplicates and anything but a ``Backend``."""

    def register(self, name: str, target: Any = None) -> Any:
        if name in self:
            raise ValueError(f"backend '{name}' is registered twice; pick another name")
        if target is not None and not isinstance(target, str):
            self._check_class(name, target)
        if target is None:

            def deco(obj: Any) -> Any:
                self._check_class(name, obj)
                self._entries[name] = obj
                return obj

            return deco
        return super().register(name, target)

    def unregister(self, name: str) -> None:
        """Drop a backend (a test's own, after the test)."""
        self._entries.pop(name, None)

    @staticmethod
    def _check_class(name: str, obj: Any) -> None:
        from pipeline.backends.base import Backend

        if not (isinstance(obj, type) and issubclass(obj, Backend)):
            raise TypeError(f"backend '{name}': {obj!r} is not a Backend subclass")
        if obj.name != name:
            raise TypeError(f"backend '{name}': its class is named '{obj.name}'; make them one")

    def get(self, name: str) -> type[Backend]:
        fresh = isinstance(self._entries.get(name), str)
        cls = super().get(name)
        if fresh:  # a lazy entry, checked once it is imported
            self._check_class(name, cls)
        return cls

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


BACKENDS = BackendRegistry("backend")
BACKENDS.register("openai", "pipeline.backends.openai_backend:OpenAIBackend")
BACKENDS.register("vllm", "pipeline.backends.vllm_backend:VLLMBackend")
BACKENDS.register("llamacpp", "pipeline.backends.llamacpp_backend:LlamaCppBackend")
BACKENDS.register("replay", "pipeline.backends.replay:ReplayBackend")
BACKENDS.register("ray", "pipeline.backends.ray_backend:RayBackend")
BACKENDS.register("batchfile", "pipeline.batch.backend:BatchFileBackend")

__all__ = ["BACKENDS", "BackendRegistry"]
