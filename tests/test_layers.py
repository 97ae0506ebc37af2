"""The package's layers (docs/architecture.md, "Layers"): every import, lazy ones included,
goes to the same layer or a lower one, and no two modules import each other at module
level. An import by name (``importlib.import_module("pipeline.x")``) counts as an import,
and a package's ``__init__`` as a module like any other, so a cycle through it is found.
Imports under ``if TYPE_CHECKING:`` count too (as imports that never run): a module that
needs another's type for its annotations depends on it, and two that need each other's
are one module split in two."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.core.sourcehash import imports_in

PKG = Path(__file__).resolve().parent.parent / "pipeline"

# Lowest first. A layer is a list of folders (packages) of pipeline/, and a folder belongs
# to one layer whole, so the folders themselves show the layers ("pipeline" is the
# package's own __init__). Every import, at module level or inside a function, goes to its
# own layer or a lower one. Keep in step with docs/architecture.md.
LAYERS: list[tuple[str, list[str]]] = [
    ("foundation", ["pipeline", "core"]),
    # types, the rules and the kinds that live with them (input formats, pair rules), the
    # release row's table
    ("types and rules", ["types", "rules", "inputs", "release"]),
    # what each engine kind is (a backend, a dialect, a stage) and the registries naming them
    ("kinds", ["kinds"]),
    ("config", ["config"]),
    ("storage", ["run"]),
    ("engines", ["backends", "engine"]),
    ("stages", ["stages"]),
    ("orchestration", ["orchestration"]),
    ("commands", ["publish", "annotate", "audit", "eval", "plan", "batch", "quickstart"]),
    ("interface", ["cli"]),
]  # fmt: skip


def module_name(path: Path) -> str:
    parts = path.relative_to(PKG.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in PKG.rglob("*.py")}


def unit_of(module: str) -> str:
    """The folder (package) or top-level module of pipeline/ a module is in."""
    parts = module.split(".")
    return "pipeline" if len(parts) == 1 else parts[1]


def layer_of(module: str) -> int:
    unit = unit_of(module)
    found = [i for i, (_, units) in enumerate(LAYERS) if unit in units]
    assert len(found) == 1, f"{unit} is in {len(found)} layers: give it one in LAYERS and the docs"
    return found[0]


def imports(path: Path) -> list[tuple[str, int, bool]]:
    """(imported project module, line, at module level) for every import of ``path``, type-only
    ones included: the package's own reader (``pipeline.core.sourcehash.imports_in``), over
    this test's modules."""
    return imports_in(path.read_text(encoding="utf-8"), MODULES.__contains__, type_only=True)


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
    """At module level or inside a function: a lazy import up a layer is an arrow up too."""
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


def import_graph(lazy: bool = False) -> dict[str, set[str]]:
    """module -> the project modules it imports at module level (with ``lazy``: inside
    functions too). A package's ``__init__`` counts as a module like any other: one that
    imports its submodules depends on them, and a submodule that imports a name from its
    package's ``__init__`` depends on it, so a cycle through a package's own ``__init__``
    is a cycle (Python runs the ``__init__`` first, and the submodule would see it
    half-initialised)."""
    graph: dict[str, set[str]] = {}
    for m, path in MODULES.items():
        graph[m] = {t for t, _, at_top in imports(path) if (at_top or lazy) and t != m}
    return graph


def folder_graph() -> dict[str, set[str]]:
    """folder (or top-level module) -> those it imports, every import counted."""
    graph: dict[str, set[str]] = {}
    for m, targets in import_graph(lazy=True).items():
        mine = unit_of(m)
        graph.setdefault(mine, set()).update(u for t in targets if (u := unit_of(t)) != mine)
    return graph


def test_no_module_level_import_cycle():
    assert _cycles(import_graph()) == []


def test_no_import_cycle_at_all():
    """Lazy and type-only imports included: two modules that import each other, even inside
    functions or for annotations only, are one module split in two (the openai backend and
    its batch line format were)."""
    assert _cycles(import_graph(lazy=True)) == []


def test_no_folder_imports_a_folder_that_imports_it_back():
    assert _cycles(folder_graph()) == []


def test_every_folder_is_in_one_layer():
    units = {unit_of(m) for m in MODULES}
    listed = [u for _, us in LAYERS for u in us]
    assert sorted(listed) == sorted(set(listed)), "a folder listed twice"
    assert units == set(listed), units ^ set(listed)


def test_the_package_root_holds_folders_only():
    """A module at the root would belong to no folder, and the folders would not show it."""
    loose = [p.name for p in PKG.glob("*.py") if p.name != "__init__.py"]
    assert loose == [], f"put these in the folder of their layer: {loose}"


@pytest.mark.parametrize(
    "low, high",
    [
        ("pipeline.config", "pipeline.audit.checks"),  # the rules' defaults live below config
        ("pipeline.rules", "pipeline.audit.checks"),  # the audit runs the rules' checks
        ("pipeline.run.cache", "pipeline.kinds.backend"),  # both use pipeline.types.chat
        ("pipeline.core.errors", "pipeline.config"),  # presentation is in pipeline.cli.errorline
        # the base class knew one file format; the openai backend counts a .gguf model
        ("pipeline.kinds.backend", "pipeline.backends.gguf"),
        # the batch line format and the dialects read the wire, not the backend
        ("pipeline.backends.openai.lines", "pipeline.backends.openai.backend"),
        ("pipeline.backends.openai.dialects", "pipeline.backends.openai.backend"),
        ("pipeline.backends.openai.wire", "pipeline.backends.openai.dialects"),
        # the run's folders know the stages' order from the kinds floor
        ("pipeline.run", "pipeline.stages"),
        # the config lists the input formats from the registry, not by calling each reader
        ("pipeline.config", "pipeline.inputs.jsonl"),
        ("pipeline.config", "pipeline.inputs.tables"),
        # type-only imports counted: the input formats own the config's input section, the
        # backends' registry owns the backend section, the Batch API is handed what it
        # sends with, and the run order is names only (the stages' registry is theirs)
        ("pipeline.inputs", "pipeline.config"),
        ("pipeline.kinds.settings", "pipeline.kinds.backend"),
        ("pipeline.backends.openai.batch", "pipeline.backends.openai.backend"),
        ("pipeline.kinds.stages", "pipeline.stages"),
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


def test_a_type_only_import_counts(monkeypatch, tmp_path):
    # an annotation's import runs up a layer and closes a circle like any other
    typed = "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from {} import X\n"
    _fake_modules(
        monkeypatch,
        tmp_path,
        {
            "pipeline.rules.fake_typed": typed.format("pipeline.config"),
            "pipeline.rules.fake_a": typed.format("pipeline.rules.fake_b"),
            "pipeline.rules.fake_b": "from pipeline.rules.fake_a import Y\n",
        },
    )
    assert imports(MODULES["pipeline.rules.fake_typed"]) == [("pipeline.config", 4, False)]
    assert (
        "pipeline.rules.fake_typed (types and rules) imports pipeline.config (config)"
        in "\n".join(upward_imports())
    )
    assert ["pipeline.rules.fake_a", "pipeline.rules.fake_b"] in _cycles(import_graph(lazy=True))


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


def test_importing_the_config_imports_no_reader_and_no_engine():
    import subprocess
    import sys

    code = (
        "import sys, pipeline.config; "
        "print(' '.join(m for m in sys.modules if m.startswith('pipeline.')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.split()
    assert "pipeline.config" in out
    heavy = [
        m
        for m in out
        if m.startswith(("pipeline.backends", "pipeline.stages", "pipeline.inputs.jsonl",
                         "pipeline.inputs.tables", "pipeline.run", "pipeline.engine.llm"))
    ]  # fmt: skip
    assert heavy == []


def test_the_shape_script_counts_what_this_test_reads():
    """scripts/code_shape.py (the figures a restructuring's note quotes) reads the same
    modules and the same lazy imports as the layer checks above."""
    import importlib.util

    script = PKG.parent / "scripts" / "code_shape.py"
    spec = importlib.util.spec_from_file_location("code_shape", script)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    got = module.shape(PKG.parent)
    assert got["modules"] == len(MODULES)
    text = [p.read_text(encoding="utf-8") for p in MODULES.values()]
    lazy = sum(1 for s in text for _, _, top in imports_in(s, MODULES.__contains__) if not top)
    assert got["lazy_project_imports"] == lazy > 0
