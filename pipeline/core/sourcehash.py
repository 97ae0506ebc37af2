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
from collections.abc import Callable

from pipeline.core.errors import PipelineError

__all__ = [
    "code_closure",
    "imports_in",
    "normalised_source",
    "read_source",
    "source_hash",
    "source_hashes",
]


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


# ---- which modules a module imports --------------------------------------------------


@functools.lru_cache(maxsize=1024)
def is_module(name: str) -> bool:
    """Whether ``name`` is an importable module of this project (found, not imported)."""
    if not name.startswith("pipeline"):
        return False
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _type_checking_lines(tree: ast.AST) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If):
            t = node.test
            if (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
                isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING"
            ):
                lines.update(n.lineno for n in ast.walk(node) if hasattr(n, "lineno"))
    return lines


def _resolve(name: str, exists: Callable[[str], bool]) -> str | None:
    """The project module an imported name refers to (the longest existing prefix)."""
    parts = name.split(".")
    while parts and not exists(".".join(parts)):
        parts.pop()
    return ".".join(parts) or None


def _dynamic_import(node: ast.AST) -> str | None:
    """The module a call imports by name (``importlib.import_module("pipeline.x")``,
    ``import_module(...)``, ``__import__(...)``), when the name is written in the call: a
    literal, or an f-string's leading literal part (``f"pipeline.audit.{name}"`` imports
    some module of ``pipeline.audit``)."""
    if not isinstance(node, ast.Call) or not node.args:
        return None
    f = node.func
    called = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
    if called not in ("import_module", "__import__"):
        return None
    arg = node.args[0]
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return arg.value
    if isinstance(arg, ast.JoinedStr) and arg.values:
        head = arg.values[0]
        if isinstance(head, ast.Constant) and isinstance(head.value, str):
            return head.value.rstrip(".")
    return None


def _in_functions(tree: ast.AST) -> set[int]:
    """Ids of the nodes inside a function or lambda body: run when called, not at import."""
    inside: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            inside.update(id(n) for n in ast.walk(node) if n is not node)
    return inside


def imports_in(
    source: str,
    exists: Callable[[str], bool] = is_module,
    *,
    registered: bool = False,
    type_only: bool = False,
) -> list[tuple[str, int, bool]]:
    """(imported project module, line, at module level) for every import in ``source``:
    import statements, and calls that import a module by a name written in the code
    (``exists`` says which names are project modules). At module level: run when the
    module is imported (not inside a function), ``try`` and ``if`` blocks included, a
    ``TYPE_CHECKING`` block not. With ``registered``, a registry's entry named as a
    ``"module:Class"`` string in a ``.register(...)`` call counts too (imported when
    chosen: a lazy import); with ``type_only``, the imports of a ``TYPE_CHECKING`` block
    count too (never run: not at module level)."""
    tree = ast.parse(source)
    typing_only = _type_checking_lines(tree)
    lazy = _in_functions(tree)
    found = []
    for node in ast.walk(tree):
        if not hasattr(node, "lineno") or (node.lineno in typing_only and not type_only):
            continue
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # `from pkg import sub` depends on pkg.sub when that is a module, else on pkg
            names = [
                f"{node.module}.{a.name}" if exists(f"{node.module}.{a.name}") else node.module
                for a in node.names
            ]
        elif (dynamic := _dynamic_import(node)) is not None:
            names = [dynamic]
        elif registered and (entry := _registered(node)) is not None:
            names = [entry]
            lazy.add(id(node))
        top = id(node) not in lazy and node.lineno not in typing_only
        for n in names:
            target = _resolve(n, exists) if n.startswith("pipeline") else None
            if target is not None:
                found.append((target, node.lineno, top))
    return found


def _registered(node: ast.AST) -> str | None:
    """The module of a registry entry given as ``"module:Class"`` in ``X.register(...)``."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
        return None
    if node.func.attr != "register":
        return None
    for arg in node.args[1:2]:
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and ":" in arg.value:
            return arg.value.partition(":")[0]
    return None


def code_closure(module: str, follow: Callable[[str], bool]) -> tuple[str, ...]:
    """``module`` and every project module it imports (lazily too, and a registry's
    ``"module:Class"`` entries) for which ``follow`` is true, followed through their own
    imports: the modules whose code a stage's rows come from (``Stage.code``)."""
    seen = [module]
    todo = [module]
    while todo:
        source = read_source(todo.pop())
        if not isinstance(source, str):
            continue  # installed without source: its own hash stands for it
        for target, _, _ in imports_in(source, registered=True):
            if target not in seen and follow(target):
                seen.append(target)
                todo.append(target)
    return tuple(seen)
