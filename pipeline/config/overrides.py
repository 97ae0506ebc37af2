"""``--set key.path=value`` overrides, and the once-flat backend keys (``backend.base_url``)
still read, with a deprecation warning."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import yaml

from pipeline.config.sections import Config, path_fields
from pipeline.config.yamlfile import ConfigLoader, yaml_problem
from pipeline.core.errors import ConfigError
from pipeline.kinds.settings import FLAT_KEYS as _FLAT_BACKEND_KEYS
from pipeline.kinds.settings import deprecation_line


def parse_override(spec: str) -> tuple[list[str], Any]:
    """Parse ``key.path=value``; the value is read as YAML (so 3, true, [a, b] work)."""
    if "=" not in spec:
        raise ConfigError(f"--set expects key.path=value, got {spec!r}", path="--set")
    key, raw = spec.split("=", 1)
    parts = key.strip().split(".")
    if not any(parts):
        raise ConfigError(f"--set has an empty key: {spec!r}", path="--set")
    if not all(parts):
        raise ConfigError(
            f"key {key.strip()!r} has an empty part (two dots, or a dot at an end); write "
            "it as section.field, e.g. run.name",
            path="--set",
        )
    try:
        value = yaml.load(raw, Loader=ConfigLoader) if raw.strip() else ""
    except (yaml.YAMLError, ValueError, RecursionError) as exc:
        # the value is not repeated: it may be a secret typed in the wrong place
        raise ConfigError(
            f"cannot parse the value as YAML ({yaml_problem(exc)})", path="--set", field=key
        ) from None
    return parts, value


# Config fields that hold paths, from their types. In a config file a relative one is the
# file's folder's; typed with --set it is the current folder's, like any path on a command
# line.
PATH_FIELDS: tuple[str, ...] = tuple(path_fields(Config))


def _current_key(parts: list[str]) -> list[str]:
    """A key path with a backend key that was once flat (backend.base_url) in its section."""
    if len(parts) == 2 and parts[0] == "backend" and parts[1] in _FLAT_BACKEND_KEYS:
        return ["backend", *_FLAT_BACKEND_KEYS[parts[1]]]
    return parts


def flat_backend_keys(data: dict, overrides: list[str]) -> list[str]:
    """The once-flat backend keys a config file and its ``--set`` options use."""
    found = []
    backend = data.get("backend")
    if isinstance(backend, dict):
        found += [k for k in backend if k in _FLAT_BACKEND_KEYS]
    for spec in overrides:
        key = spec.split("=", 1)[0].strip().split(".")
        if len(key) == 2 and key[0] == "backend" and key[1] in _FLAT_BACKEND_KEYS:
            found.append(key[1])
    return list(dict.fromkeys(found))


def warn_flat_keys(found: list[str], source: str) -> None:
    # a warning, not an error: configs written before the backend sections still run
    if found:
        print(deprecation_line(found, source), file=sys.stderr)


def apply_overrides(data: dict, overrides: list[str], cwd_paths: bool = False) -> dict:
    """Apply ``--set`` overrides to the parsed config. ``cwd_paths``: a relative path given
    for a path field is made absolute against the current folder (the config file's folder
    is what relative paths in the file itself resolve against)."""
    for spec in overrides:
        parts, value = parse_override(spec)
        parts = _current_key(parts)
        path_field = ".".join(parts) in PATH_FIELDS and isinstance(value, str) and value
        if cwd_paths and path_field and not Path(value).expanduser().is_absolute():
            value = os.path.abspath(value)
        cur = data
        for p in parts[:-1]:
            nxt = cur.get(p)
            if nxt is None:
                nxt = cur[p] = {}
            if not isinstance(nxt, dict):
                raise ConfigError(
                    "cannot set below a non-mapping value", path="--set", field=".".join(parts)
                )
            cur = nxt
        cur[parts[-1]] = value
    return data
