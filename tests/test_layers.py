"""The package's layers (docs/architecture.md, "Layers"): every import, lazy ones included,
goes to the same layer or a lower one, and no two modules import each other at module
level. An import by name (``importlib.import_module("pipeline.x")``) counts as an import,
and a package's ``__init__`` as a module like any other, so a cycle through it is found.
Imports under ``if TYPE_CHECKING:`` are annotations only and not counted."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parent.parent / "pipeline"

# Lowest first; a module belongs to the layer of the longest entry naming it or a package
# above it. Keep in step with docs/architecture.md.
LAYERS: list[tuple[str, list[str]]] = [
    (
        "foundation",
        ["pipeline", "pipeline.errors", "pipeline.ids", "pipeline.io", "pipeline.fields",
         "pipeline.redact", "pipeline.registry", "pipeline.resources", "pipeline.cliargs",
         "pipeline.progress", "pipeline.run.layout", "pipeline.section", "pipeline.sourcehash",
         "pipeline.modelfiles"],
    ),
    (
        "types and rules",
        ["pipeline.chat", "pipeline.records", "pipeline.rules", "pipeline.schemas",
         "pipeline.prompts", "pipeline.promptfiles", "pipeline.profile", "pipeline.dedup",
         "pipeline.filters", "pipeline.inputs",
         # the release row's table; its `recorded` module reads runs (a command)
         "pipeline.release",
         # the two registries: names only, their modules load when chosen
         "=pipeline.backends", "=pipeline.stages",
         # what a backend is (its interface and settings, GGUF headers): no engine
         "=pipeline.backends.base", "=pipeline.backends.settings", "=pipeline.backends.gguf"],
    ),
    # a package: sections, yamlfile, overrides, checks, load, describe
    ("config", ["pipeline.config"]),
    ("storage and input", ["pipeline.run", "pipeline.cache", "pipeline.ingest",
                           "pipeline.batch.store"]),
    # batch files: the line format (read with the openai backend's reply parser) and the
    # batchfile backend; its commands (files, cli) are commands
    ("engines", ["pipeline.backends", "pipeline.budget", "pipeline.llm",
                 "pipeline.batch.backend"]),
    ("stages", ["pipeline.stages"]),
    ("orchestration", ["pipeline.orchestrate", "pipeline.runsummary"]),
    (
        "commands",
        ["pipeline.publish", "pipeline.annotate", "pipeline.audit", "pipeline.eval",
         "pipeline.release.recorded",
         "pipeline.quickstart", "pipeline.batch.files", "pipeline.batch.cli",
         # a package: counters, placeholders, estimate, throughput, result, render
         "pipeline.plan"],
    ),
    ("interface", ["pipeline.cli", "pipeline.errorline"]),
]  # fmt: skip


def module_name(path: Path) -> str:
    parts = path.relative_to(PKG.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in PKG.rglob("*.py")}


def layer_of(module: str) -> int:
    best, best_len = None, -1
    for i, (_, names) in enumerate(LAYERS):
        for entry in names:
            exact = entry.startswith("=")
            name = entry.lstrip("=")
            hit = module == name if exact else module == name or module.startswith(name + ".")
            if hit and len(name) + exact > best_len:
                best, best_len = i, len(name) + exact
    assert best is not None, f"{module} is in no layer: add it to LAYERS and the docs"
    return best


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


def _resolve(name: str) -> str | None:
    """The project module an imported name refers to (the longest existing prefix)."""
    parts = name.split(".")
    while parts and ".".join(parts) not in MODULES:
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


def imports(path: Path) -> list[tuple[str, int, bool]]:
    """(imported project module, line, at module level) for every import of ``path``:
    import statements, and calls that import a module by a name written in the code. At
    module level: run when the module is imported (not inside a function), ``try`` and
    ``if`` blocks included."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip = _type_checking_lines(tree)
    lazy = _in_functions(tree)
    found = []
    for node in ast.walk(tree):
        if node.lineno in skip if hasattr(node, "lineno") else True:
            continue
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # `from pkg import sub` depends on pkg.sub when that is a module, else on pkg
            names = [
                f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in MODULES else node.module
                for a in node.names
            ]
        elif (dynamic := _dynamic_import(node)) is not None:
            names = [dynamic]
        for n in names:
            target = _resolve(n) if n.startswith("pipeline") else None
            if target is not None:
                found.append((target, node.lineno, id(node) not in lazy))
    return found


def test_every_module_has_a_layer():
    for m in MODULES:
        layer_of(m)


def _shown(path: Path) -> Path:
    return path.relative_to(PKG.parent) if path.is_relative_to(PKG.parent) else path


def upward_imports() -> list[str]:
    upward = []
    for m, path in sorted(MODULES.items()):
        mine = layer_of(m)
        for target, line, _ in imports(path):
            theirs = layer_of(target)
            if theirs > mine:
                upward.append(
                    f"{_shown(path)}:{line}: {m} ({LAYERS[mine][0]}) imports "
                    f"{target} ({LAYERS[theirs][0]})"
                )
    return upward


def test_no_import_goes_up_a_layer():
    upward = upward_imports()
    assert not upward, "imports from a lower layer to a higher one:\n" + "\n".join(upward)


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def import_graph() -> dict[str, set[str]]:
    """module -> the project modules it imports at module level. A package's ``__init__``
    counts as a module like any other: one that imports its submodules depends on them,
    and a submodule that imports a name from its package's ``__init__`` depends on it, so
    a cycle through a package's own ``__init__`` is a cycle (Python runs the ``__init__``
    first, and the submodule would see it half-initialised)."""
    graph: dict[str, set[str]] = {}
    for m, path in MODULES.items():
        graph[m] = {target for target, _, at_top in imports(path) if at_top and target != m}
    return graph


def test_no_module_level_import_cycle():
    assert _cycles(import_graph()) == []


@pytest.mark.parametrize(
    "low, high",
    [
        ("pipeline.config", "pipeline.audit.checks"),  # the rules' defaults live below config
        ("pipeline.filters", "pipeline.audit.checks"),  # the filters use pipeline.rules
        ("pipeline.cache", "pipeline.backends.base"),  # both use pipeline.chat
        ("pipeline.errors", "pipeline.config"),  # presentation is in pipeline.errorline
    ],
)
def test_the_cycles_the_layers_replaced_are_gone(low, high):
    # a package (pipeline.config) is all its modules; a target inside ``high`` counts too
    lows = [m for m in MODULES if m == low or m.startswith(low + ".")]
    assert lows
    for m in lows:
        for target, _, _ in imports(MODULES[m]):
            assert target != high and not target.startswith(high + "."), (m, target)


def _fake_modules(monkeypatch, tmp_path: Path, files: dict[str, str]) -> None:
    """Project modules that exist only for a test: name -> source."""
    for name, source in files.items():
        path = tmp_path / (name.replace(".", "_") + ".py")
        path.write_text(source, encoding="utf-8")
        monkeypatch.setitem(MODULES, name, path)


def test_an_import_by_name_counts_like_an_import_statement(monkeypatch, tmp_path):
    _fake_modules(
        monkeypatch,
        tmp_path,
        {
            "pipeline.rules.fake_lazy": (
                "import importlib\n\n\ndef later():\n"
                "    return importlib.import_module('pipeline.cli')\n"
            ),
            "pipeline.rules.fake_fstring": (
                "from importlib import import_module\n\n\ndef later(name):\n"
                "    return import_module(f'pipeline.audit.{name}')\n"
            ),
            "pipeline.rules.fake_dunder": "cfg = __import__('pipeline.config')\n",
        },
    )
    assert imports(MODULES["pipeline.rules.fake_lazy"]) == [("pipeline.cli", 5, False)]
    assert imports(MODULES["pipeline.rules.fake_fstring"]) == [("pipeline.audit", 5, False)]
    assert imports(MODULES["pipeline.rules.fake_dunder"]) == [("pipeline.config", 1, True)]
    upward = "\n".join(upward_imports())
    for line in (
        "pipeline.rules.fake_lazy (types and rules) imports pipeline.cli (interface)",
        "pipeline.rules.fake_fstring (types and rules) imports pipeline.audit (commands)",
        "pipeline.rules.fake_dunder (types and rules) imports pipeline.config (config)",
    ):
        assert line in upward


def test_a_cycle_through_a_packages_own_init_is_a_cycle(monkeypatch, tmp_path):
    # the package's __init__ imports a submodule that takes a name from that __init__:
    # importing the submodule first runs the __init__, which re-enters it half-made
    _fake_modules(
        monkeypatch,
        tmp_path,
        {
            "pipeline.fakepkg": "from pipeline.fakepkg.worker import Worker\nLIMIT = 3\n",
            "pipeline.fakepkg.worker": (
                "from pipeline.fakepkg import LIMIT\n\n\nclass Worker:\n    limit = LIMIT\n"
            ),
            # an import at module level inside `try` runs at import time too
            "pipeline.fakepkg.other": (
                "try:\n    from pipeline.fakepkg import LIMIT\nexcept ImportError:\n    pass\n"
            ),
        },
    )
    graph = import_graph()
    assert graph["pipeline.fakepkg.other"] == {"pipeline.fakepkg"}
    assert _cycles(graph) == [["pipeline.fakepkg", "pipeline.fakepkg.worker"]]
