"""Reading a config file: its size, its encoding and its YAML, with a loader that refuses
a key given twice; what a YAML error says (without the line it quotes, which may hold a
secret); and the check that only plain values reach the config (no alias loops or alias
bombs, no binary data or dates)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from pipeline.core.errors import ConfigError
from pipeline.core.io import path_kind
from pipeline.core.redact import redact, register_names


def yaml_problem(exc: BaseException) -> str:
    """What is wrong, without the snippet PyYAML quotes (the line may hold a secret)."""
    if isinstance(exc, yaml.MarkedYAMLError):
        # the error's own line goes into ConfigError's prefix; here the column, and where
        # an unclosed quote or bracket started
        text = exc.problem or "syntax error"
        if exc.problem_mark is not None:
            text += f" at column {exc.problem_mark.column + 1}"
        ctx, start = exc.context, exc.context_mark
        if (
            ctx
            and start is not None
            and (exc.problem_mark is None or start.line != exc.problem_mark.line)
        ):
            text += f", {ctx} started on line {start.line + 1}"
        elif ctx:
            text += f", {ctx}"
        return redact(text)
    if isinstance(exc, RecursionError):
        return "nested too deeply"
    if isinstance(exc, ValueError) and "digits" in str(exc):
        return "a number has too many digits"
    return redact(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)


# `api_key_env: NAME` / `token_env: NAME`, found before parsing so that even a YAML error
# message is redacted with the variables this config names
_ENV_NAME_RE = re.compile(
    r"^\s*(?:api_key_env|token_env)\s*:\s*[\"']?([A-Za-z_][A-Za-z0-9_]*)", re.MULTILINE
)


_YAML_TYPES = {
    "bytes": "binary data (!!binary)",
    "set": "a set (!!set)",
    "date": "a date",
    "datetime": "a timestamp",
}


# A config is a few hundred values; YAML aliases can make a small file expand to billions.
_MAX_CONFIG_VALUES = 100_000
# A config is a few KiB; anything far larger is the wrong file.
_MAX_CONFIG_BYTES = 1 << 20


class DuplicateKeyError(yaml.constructor.ConstructorError):
    """A mapping holds the same key twice (YAML itself keeps the last one silently)."""

    def __init__(self, key: Any, first: yaml.Mark, second: yaml.Mark) -> None:
        self.key = key
        self.first_line = first.line + 1
        self.line = second.line + 1
        super().__init__(
            None, None, f"duplicate key {key!r} (first on line {self.first_line})", second
        )


class ConfigLoader(yaml.SafeLoader):
    """PyYAML's SafeLoader, refusing a key given twice in one mapping: two ``responses:``
    blocks would otherwise lose the first without a word."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, yaml.Mark] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue  # `<<: *base` then a key of its own overrides: allowed
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.setdefault(key, key_node.start_mark)
                except TypeError:
                    continue  # unhashable: the base class says so with its own error
                if first is not key_node.start_mark:
                    raise DuplicateKeyError(key, first, key_node.start_mark)
        return super().construct_mapping(node, deep=deep)


def check_plain(data: Any, source: str) -> None:
    """Only JSON-like values, and only valid Unicode, may reach the config: run.yaml, request
    bodies and folder names are written from it. Also refuses alias loops and alias bombs.
    Iterative (the data may nest deeply); each shared container is sized once."""

    def fail(where: str, problem: str) -> ConfigError:
        return ConfigError(problem, path=source, field=where or None)

    sizes: dict[int, int] = {}  # id(container) -> values it expands to
    open_: set[int] = set()  # containers on the current path, to find loops
    stack: list[tuple[str, Any, bool]] = [("", data, False)]
    while stack:
        where, value, leaving = stack.pop()
        if isinstance(value, (dict, list)):
            key = id(value)
            children = list(value.values() if isinstance(value, dict) else value)
            if leaving:
                open_.discard(key)
                sizes[key] = 1 + sum(sizes.get(id(c), 1) for c in children)
                if sizes[key] > _MAX_CONFIG_VALUES:
                    raise fail(where, "expands to too many values (YAML aliases?); simplify it")
                continue
            if key in open_:
                raise fail(where, "refers to itself (a YAML alias loop); remove the alias")
            if key in sizes:
                continue
            open_.add(key)
            stack.append((where, value, True))
            if isinstance(value, dict):
                for k, item in value.items():
                    if not isinstance(k, str):
                        raise fail(where, f"key {k!r} must be text; quote it")
                    stack.append((f"{where}.{k}" if where else k, item, False))
            else:
                stack.extend((f"{where}.{i}", item, False) for i, item in enumerate(value))
        elif isinstance(value, str):
            if any(0xD800 <= ord(ch) <= 0xDFFF for ch in value):
                raise fail(where, "holds a lone UTF-16 surrogate (not valid Unicode); remove it")
        elif value is not None and not isinstance(value, (bool, int, float)):
            what = _YAML_TYPES.get(type(value).__name__, type(value).__name__)
            raise fail(where, f"is {what}; use plain values (quote it to make it text)")


def read_config_file(path: Path) -> dict[str, Any]:
    """The YAML mapping a config file holds, refused with one ConfigError naming the file
    (and the line) when it is not a readable, UTF-8, valid YAML mapping of a sane size. The
    environment variables it names as holding secrets are registered first, so that even a
    YAML error is redacted."""
    kind = path_kind(path)
    if kind is None:
        raise ConfigError("config file not found", path=path)
    if kind != "a file":
        # a named pipe or /dev/zero would be read forever
        raise ConfigError(f"is {kind}, not a file; pass the run's YAML config file", path=path)
    try:
        with open(path, "rb") as fh:
            raw = fh.read(_MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"cannot read config: {exc.strerror or exc}", path=path) from None
    if len(raw) > _MAX_CONFIG_BYTES:
        raise ConfigError(
            f"is larger than {_MAX_CONFIG_BYTES // 1024} KiB, too large for a config (one is a "
            "few KiB); pass the run's YAML config file",
            path=path,
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise ConfigError(
            f"not UTF-8 text (byte 0x{raw[exc.start]:02x} is {exc.reason}); save the file as UTF-8",
            path=path,
            line=line,
        ) from None
    register_names(_ENV_NAME_RE.findall(text))
    try:
        data = yaml.load(text, Loader=ConfigLoader)
    except DuplicateKeyError as exc:
        raise ConfigError(
            redact(
                f"key {exc.key!r} appears twice in one mapping (first on line "
                f"{exc.first_line}); YAML would silently keep only this one: merge the two "
                "or delete one"
            ),
            path=path,
            line=exc.line,
        ) from None
    except (yaml.YAMLError, ValueError, RecursionError) as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        raise ConfigError(
            f"not valid YAML: {yaml_problem(exc)}; fix the syntax there",
            path=path,
            line=mark.line + 1 if mark is not None else None,
        ) from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError("the top level must be a mapping of sections", path=path)
    return data
