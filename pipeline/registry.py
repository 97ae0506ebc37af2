"""Name -> implementation registries with lazy imports and "did you mean" errors."""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Callable
from typing import Any

from pipeline.errors import ConfigError


class Registry:
    """Maps names to objects, or to ``"module:attr"`` strings imported on first use.

    Lazy entries keep heavy engines (vLLM, Ray) out of ``import pipeline``.
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, Any] = {}

    def register(self, name: str, target: Any = None) -> Callable[[Any], Any] | Any:
        if target is not None:
            self._entries[name] = target
            return target

        def deco(obj: Any) -> Any:
            self._entries[name] = obj
            return obj

        return deco

    def names(self) -> list[str]:
        return sorted(self._entries)

    def check(self, name: str) -> None:
        if name in self._entries:
            return
        close = difflib.get_close_matches(name, self.names(), n=1)
        hint = f" Did you mean '{close[0]}'?" if close else ""
        raise ConfigError(
            f"unknown {self.kind} '{name}'.{hint} Known: {', '.join(self.names())}", field=self.kind
        )

    def get(self, name: str) -> Any:
        self.check(name)
        target = self._entries[name]
        if isinstance(target, str):
            module, _, attr = target.partition(":")
            target = getattr(importlib.import_module(module), attr)
            self._entries[name] = target
        return target

    def __contains__(self, name: str) -> bool:
        return name in self._entries
