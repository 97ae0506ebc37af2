"""The package's layers (docs/architecture.md, "Layers"): every import, lazy ones included,
goes to the same layer or a lower one, and no two modules import each other at module
level. Imports under ``if TYPE_CHECKING:`` are annotations only and not counted."""

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
         "pipeline.progress", "pipeline.run.layout", "pipeline.sourcehash"],
    ),
    (
        "types and rules",
        ["pipeline.chat", "pipeline.records", "pipeline.rules", "pipeline.schemas",
         "pipeline.prompts", "pipeline.profile", "pipeline.dedup", "pipeline.filters",
         # the two registries: names only, their modules load when chosen
         "=pipeline.backends", "=pipeline.stages"],
    ),
    ("config", ["pipeline.config"]),
    ("storage and input", ["pipeline.run", "pipeline.cache", "pipeline.ingest"]),
    ("engines", ["pipeline.backends", "pipeline.budget", "pipeline.llm"]),
    ("stages", ["pipeline.stages"]),
    ("orchestration", ["pipeline.orchestrate", "pipeline.runsummary"]),
    (
        "commands",
        ["pipeline.publish", "pipeline.annotate", "pipeline.audit", "pipeline.eval",
         "pipeline.quickstart", "pipeline.plan"],
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


def imports(path: Path) -> list[tuple[str, int, bool]]:
    """(imported project module, line, at module level) for every import of ``path``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip = _type_checking_lines(tree)
    top = {id(n) for n in tree.body}
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
        for n in names:
            target = _resolve(n) if n.startswith("pipeline") else None
            if target is not None:
                found.append((target, node.lineno, id(node) in top))
    return found


def test_every_module_has_a_layer():
    for m in MODULES:
        layer_of(m)


def test_no_import_goes_up_a_layer():
    upward = []
    for m, path in sorted(MODULES.items()):
        mine = layer_of(m)
        for target, line, _ in imports(path):
            theirs = layer_of(target)
            if theirs > mine:
                upward.append(
                    f"{path.relative_to(PKG.parent)}:{line}: {m} ({LAYERS[mine][0]}) imports "
                    f"{target} ({LAYERS[theirs][0]})"
                )
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


def test_no_module_level_import_cycle():
    graph: dict[str, set[str]] = {}
    for m, path in MODULES.items():
        deps = set()
        for target, _, at_top in imports(path):
            # a package's __init__ importing its own submodules (and them importing their
            # parent package, which Python loads first anyway) is how packages work
            own = target == m or target.startswith(m + ".") or m.startswith(target + ".")
            if at_top and not own:
                deps.add(target)
        graph[m] = deps
    assert _cycles(graph) == []


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
    assert all(target != high for target, _, _ in imports(MODULES[low]))
