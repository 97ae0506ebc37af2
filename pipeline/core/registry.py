"""One registry class for every kind the project extends: backends, dialects, input formats,
pair rules, stages, eval scorers.

A registry maps names to classes. An entry is the class itself or a ``"module:attr"``
string imported on first use, so heavy engines (vLLM, Ray, ``datasets``) stay out of
``import pipeline``. Every registration is checked the same way: a name taken twice, an
object that is not a class, a class that is not a subclass of the kind's base, and a class
whose own name differs from the registered one are refused at once (a lazy entry when it is
first imported). An unknown name is a ``ConfigError`` with the closest known name.
"""

from __future__ import annotations

import difflib
import importlib
import re
from collections.abc import Iterator
from typing import Any, Generic, TypeVar, cast

from pipeline.core.errors import ConfigError

T = TypeVar("T")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_\-]*$")


def load_target(spec: str) -> Any:
    """The object a ``"module:attr"`` string names."""
    module, _, attr = spec.partition(":")
    return getattr(importlib.import_module(module), attr)


class Registry(Generic[T]):
    """Names -> the kind's classes.

    ``base``: the class every entry must subclass, given as the class or a
    ``"module:Class"`` string resolved when first needed. ``name_attr``: the entry's
    attribute that holds its name; an entry whose attribute is empty gets the registered
    name, one whose attribute differs is refused. ``field``: the config field an unknown
    name is reported on (default: the kind).
    """

    def __init__(
        self,
        kind: str,
        base: type | str,
        *,
        name_attr: str = "name",
        field: str | None = None,
    ) -> None:
        self.kind = kind
        self._base = base
        self.name_attr = name_attr
        self.field = field or kind
        self._entries: dict[str, Any] = {}

    # ---- registering -------------------------------------------------------------------
    def register(self, name: str, target: Any = None) -> Any:
        """``register(name, obj)``, ``register(name, "module:attr")`` or, as a class
        decorator, ``@register(name)``. Returns the object (the decorator returns it)."""
        if target is None:
            return lambda obj: self.register(name, obj)
        if not isinstance(name, str) or not _NAME.match(name):
            raise ValueError(f"{self.kind} name {name!r}: use letters, digits, '-' and '_'")
        if name in self._entries:
            raise ValueError(
                f"{self.kind} '{name}' is already registered ({self._where(name)}); "
                "pick another name"
            )
        if not isinstance(target, str):
            self._checked(name, target)
        self._entries[name] = target
        return target

    def unregister(self, name: str) -> None:
        """Remove an entry (a test that registered one cleans up with this)."""
        self._entries.pop(name, None)

    @property
    def base(self) -> type:
        if isinstance(self._base, str):
            self._base = load_target(self._base)
        return cast(type, self._base)

    def _checked(self, name: str, obj: Any) -> Any:
        base = self.base
        if not isinstance(obj, type):
            raise TypeError(f"{self.kind} '{name}': {obj!r} is not a class")
        elif not issubclass(obj, base):
            raise TypeError(
                f"{self.kind} '{name}': {obj.__qualname__} is not a subclass of "
                f"{base.__module__}.{base.__qualname__}"
            )
        own = getattr(obj, self.name_attr, None)
        if own is None or own == "":
            setattr(obj, self.name_attr, name)
        elif own != name:
            raise TypeError(f"{self.kind} '{name}': its {self.name_attr} is '{own}'; make them one")
        return obj

    def _where(self, name: str) -> str:
        target = self._entries[name]
        if isinstance(target, str):
            return target
        return f"{target.__module__}:{target.__qualname__}"

    # ---- looking up --------------------------------------------------------------------
    def names(self) -> list[str]:
        """Registered names, in registration order."""
        return list(self._entries)

    def unknown(self, name: str) -> str:
        """The message for a name nothing is registered under, with the closest one."""
        close = difflib.get_close_matches(str(name), self.names(), n=1)
        hint = f" Did you mean '{close[0]}'?" if close else ""
        return f"unknown {self.kind} '{name}'.{hint} Known: {', '.join(self.names())}"

    def check(self, name: str) -> None:
        """A ``ConfigError`` (on ``field``) unless ``name`` is registered."""
        if name not in self._entries:
            raise ConfigError(self.unknown(name), field=self.field)

    def get(self, name: str) -> T:
        self.check(name)
        target = self._entries[name]
        if isinstance(target, str):
            target = self._checked(name, load_target(target))
            self._entries[name] = target
        return cast(T, target)

    def items(self) -> Iterator[tuple[str, T]]:
        """(name, entry) of every entry, lazy ones imported."""
        for name in self.names():
            yield name, self.get(name)

    def values(self) -> Iterator[T]:
        """Every entry, lazy ones imported, in registration order."""
        for name in self.names():
            yield self.get(name)

    def __getitem__(self, name: str) -> T:
        return self.get(name)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._entries)
