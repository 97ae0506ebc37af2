"""The code behind a stage's rows, as a hash that only its meaning changes.

A stage names the modules that decide its rows (``Stage.code``); each module's source is
read through its import spec (``importlib.util.find_spec`` and the loader's
``get_source``), so the same hash comes from a checkout, an editable install, a wheel in
site-packages or a zip. The source is parsed and its syntax tree written out without
docstrings, comments, line numbers or layout: reformatting a module, editing a comment or a
docstring changes nothing; changing a threshold, a condition or a string that reaches a
row changes the hash, and the stage is re-done.

A module installed without its source (``.pyc`` only) is hashed from its compiled code
object instead, which line numbers also change: a re-do too many, never one too few.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib.util
import marshal

from pipeline.errors import PipelineError

__all__ = ["normalised_source", "read_source", "source_hash", "source_hashes"]


def _inert(node: object) -> bool:
    """A statement that does nothing: a docstring or any other bare constant (a string
    used as a comment), or ``pass``."""
    return isinstance(node, ast.Pass) or (
        isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
    )


def _write(node: object, out: list[str]) -> None:
    """A node as text into ``out``: its type and its fields by name, recursively, without
    positions and without inert statements. Empty fields (None, []) are left out, so a
    field a newer Python adds to a node (``type_params`` in 3.12) does not change the text
    of code that does not use it; written here because ``ast.dump``'s own output changes
    between versions."""
    if isinstance(node, ast.AST):
        out.append(type(node).__name__)
        out.append("(")
        for f in node._fields:
            v = getattr(node, f, None)
            if v is None or (type(v) is list and not v):
                continue
            out.append(f)
            out.append("=")
            _write(v, out)
            out.append(",")
        out.append(")")
    elif type(node) is list:
        out.append("[")
        for x in node:
            if not _inert(x):
                _write(x, out)
                out.append(",")
        out.append("]")
    else:
        out.append(repr(node))


def normalised_source(source: str) -> str:
    """``source`` with comments, docstrings and formatting taken out (its syntax tree)."""
    out: list[str] = []
    _write(ast.parse(source), out)
    return "".join(out)


@functools.lru_cache(maxsize=256)
def _hash_source(source: str) -> str:
    return hashlib.sha256(normalised_source(source).encode()).hexdigest()[:16]


def read_source(module: str) -> str | bytes:
    """``module``'s source text through its import spec (the module is not imported), or
    its compiled code as bytes when it was installed without source."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        spec = None
    if spec is None or spec.loader is None:
        raise PipelineError(f"module '{module}' is named as stage code but cannot be found")
    get_source = getattr(spec.loader, "get_source", None)
    source = get_source(module) if get_source is not None else None
    if source is not None:
        return str(source)
    get_code = getattr(spec.loader, "get_code", None)
    code = get_code(module) if get_code is not None else None
    if code is None:
        raise PipelineError(f"module '{module}' is named as stage code but has no source")
    return marshal.dumps(code)


def source_hash(module: str) -> str:
    """The hash of ``module``'s normalised source (of its code object when it has no
    source)."""
    source = read_source(module)
    if isinstance(source, bytes):
        return hashlib.sha256(source).hexdigest()[:16]
    return _hash_source(source)


def source_hashes(modules: tuple[str, ...] | list[str]) -> dict[str, str]:
    """module -> :func:`source_hash`, for each of ``modules``."""
    return {m: source_hash(m) for m in modules}
