"""Loading a config: read the YAML file, apply ``--set`` overrides, validate, then check
(pipeline/config/checks.py). Errors name the file, the line or the dotted field."""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from pipeline.config.checks import (
    check_consistency,
    check_input_paths,
    check_judge_off,
    check_output_dir,
    check_prompt_files,
    check_schema_budgets,
)
from pipeline.config.overrides import apply_overrides, flat_backend_keys, warn_flat_keys
from pipeline.config.sections import Config
from pipeline.config.yamlfile import check_plain, read_config_file
from pipeline.core.errors import ConfigError
from pipeline.core.redact import redact, register_names, register_value, url_secrets
from pipeline.kinds.settings import move_flat_keys

_SECRET_KEYS = {"api_key", "token", "password", "secret", "access_token"}


def _fields_of(model: type[BaseModel], loc: tuple) -> list[str]:
    """Field names valid at ``loc`` (for 'did you mean'), read off a default instance, so
    a section whose model is built at run time (``pairs``: the rules' thresholds) lists
    its real fields."""
    cur: Any = model()
    for part in loc[:-1]:
        cur = getattr(cur, str(part), None) if isinstance(cur, BaseModel) else None
    return list(type(cur).model_fields) if isinstance(cur, BaseModel) else []


def _shown(value: Any) -> str:
    """A short rendering of what the user gave, for "got ..." (never a long value)."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _plain_words(e: Any) -> str:
    """pydantic's message in the project's words: what the field must be, and what it got.
    pydantic says "Input should be ..." and names its own classes ("a valid dictionary or
    instance of VLLMSettings"); a user wrote a YAML key, not a Python object."""
    kind = e["type"]
    msg = str(e["msg"]).removeprefix("Value error, ")
    if kind in ("model_type", "model_attributes_type", "dict_type"):
        got = _shown(e.get("input"))
        return f"must be a section of settings (indented `key: value` lines), got {got}"
    if kind == "string_type" and isinstance(e.get("input"), (bool, int, float)):
        # YAML read a plain word as a number (2024, 0755 -> 493, 1e3) or a bool (yes, on):
        # the same hint a date gets
        got = e["input"]
        what = (
            "a true/false value (yes, no, on, off...)"
            if isinstance(got, bool)
            else "a number (a leading 0: an octal one)"
        )
        shown = str(got).lower() if isinstance(got, bool) else str(got)
        return (
            f"must be text, got {shown}: YAML reads the value as {what}; quote it to make it "
            'text ("..." in the file, --set \'key="..."\' on the command line)'
        )
    if kind in ("int_parsing", "int_type", "int_from_float"):
        msg = "Input should be a whole number"
    elif kind in ("float_parsing", "float_type"):
        msg = "Input should be a number"
    if msg.startswith("Input should be "):
        msg = "must be " + msg.removeprefix("Input should be ")
        if "input" in e and not isinstance(e["input"], (dict, list)):
            msg += f", got {_shown(e['input'])}"
    return msg


def format_validation(err: ValidationError, source: str) -> ConfigError:
    lines: list[tuple[str, str]] = []
    first_field = None
    for e in err.errors():
        loc = tuple(e["loc"])
        field = ".".join(str(p) for p in loc) or "<root>"
        first_field = first_field or field
        msg = _plain_words(e)
        if e["type"] == "extra_forbidden":
            name = str(loc[-1])
            if name.lower() in _SECRET_KEYS or name.lower().endswith(("_key", "_token")):
                msg = (
                    "secrets are not read from config files; put the value in an environment "
                    "variable and name it (e.g. backend.openai.api_key_env)"
                )
            else:
                known = _fields_of(Config, loc)
                close = difflib.get_close_matches(name, known, n=1)
                msg = "unknown key" + (f"; did you mean '{close[0]}'?" if close else "")
                if known:
                    msg += f" (known: {', '.join(known)})"
        lines.append((field, msg))
    # one line: a single problem reads "<file>, field 'x': <what>", several are listed
    if len(lines) == 1:
        return ConfigError(redact(lines[0][1]), path=source, field=first_field)
    detail = "; ".join(f"field '{f}': {m}" for f, m in lines)
    return ConfigError(
        redact(f"invalid config ({len(lines)} problems): {detail}"), path=source, field=first_field
    )


def config_from_overrides(overrides: list[str]) -> Config:
    """The defaults with ``--set`` overrides, for commands run without a config file; a bad
    value is one ConfigError naming the field."""
    warn_flat_keys(flat_backend_keys({}, overrides), "--set")
    data = apply_overrides({}, overrides)
    check_plain(data, "--set")
    try:
        cfg = Config.model_validate(data)
    except ValidationError as err:
        raise format_validation(err, "--set") from None
    register_names([*cfg.backend.secret_env_names(), cfg.annotation.token_env])
    return cfg


def load_config(path: str | Path, overrides: list[str] | None = None) -> Config:
    """Load, override and validate a YAML config; errors name the file and the field.

    The environment variables the config names as holding secrets are registered with
    ``pipeline.core.redact``, so that every later error and echo masks their values.
    """
    path = Path(path)
    data = read_config_file(path)
    source = str(path) + (" (with --set overrides)" if overrides else "")
    warn_flat_keys(flat_backend_keys(data, overrides or []), source)
    backend = data.get("backend")
    if isinstance(backend, dict):
        # the file's once-flat keys move into their sections before the --set options
        # apply, so that `--set backend.openai.base_url=...` overrides a file's flat
        # `backend.base_url` (a --set of a flat key is moved by apply_overrides); a clash
        # within the file names the file
        try:
            data["backend"], _ = move_flat_keys(backend)
        except ValueError as exc:
            raise ConfigError(str(exc), path=str(path), field="backend") from None
    data = apply_overrides(data, overrides or [], cwd_paths=True)
    check_plain(data, source)
    try:
        cfg = Config.model_validate(data)
    except ValidationError as err:
        raise format_validation(err, source) from None
    except RecursionError:
        raise ConfigError("nested too deeply", path=source) from None
    register_names([*cfg.backend.secret_env_names(), cfg.annotation.token_env])
    for url in (*cfg.backend.urls(), cfg.annotation.url):
        for secret in url_secrets(url) if url else []:
            register_value(secret)
    cfg.set_base_dir(path.resolve().parent)  # before the checks that look at the run dir
    cfg.set_source(path.resolve())
    check_consistency(cfg, source)
    check_judge_off(cfg, source)
    check_prompt_files(cfg, source)
    check_output_dir(cfg, source)
    check_schema_budgets(cfg, source)
    check_input_paths(cfg, source)
    return cfg
