"""The package's import structure, read from its source with `ast`: no import cycle, counting imports made
inside functions (a cycle hidden in a function is still a cycle), and the pure core importing nothing above
it (no Dagster, no Dagster layer, no runner, no front end)."""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "pack_assets"
# what the core may never import: the layers above it and Dagster itself
ABOVE_CORE = ("pack_assets.defs", "pack_assets.runner", "pack_assets.cli", "pack_assets.definitions", "dagster")


def modules(root: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every .py file of the package at ``root`` (a package is its __init__)."""
    found = {}
    for path in root.rglob("*.py"):
        parts = path.relative_to(root.parent).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imports(name: str, path: Path, known: set[str]) -> list[tuple[str, int]]:
    """(imported module, line) of every import statement in the file, wherever it stands (module level, inside
    a function or class, under ``if``), relative imports resolved: ``from pkg import x`` is pkg.x where that is
    one of the ``known`` modules, else pkg."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            found += [(f"{base}.{a.name}" if f"{base}.{a.name}" in known else base, node.lineno) for a in node.names]
    return found


def import_graph(root: Path) -> dict[str, dict[str, int]]:
    """module -> {module of the package it imports: the first line that does}."""
    mods = modules(root)
    graph: dict[str, dict[str, int]] = {}
    for name, path in mods.items():
        graph[name] = {}
        for target, line in imports(name, path, set(mods)):
            if target in mods and target != name:
                graph[name].setdefault(target, line)
    return graph


def cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """Every strongly connected component of more than one module (Tarjan), each sorted."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _explain(graph: dict[str, dict[str, int]], component: list[str]) -> str:
    inside = set(component)
    return "\n".join(f"  {a} -> {b} (line {line})" for a in component for b, line in sorted(graph[a].items())
                     if b in inside)


def test_no_import_cycle_in_pack_assets_counting_imports_inside_functions():
    graph = import_graph(PACKAGE)
    assert len(graph) > 50 and "pack_assets.core.write.copy" in graph
    found = cycles(graph)
    assert not found, "import cycles:\n" + "\n".join(_explain(graph, c) for c in found)


def test_the_check_finds_a_cycle_hidden_in_a_function(tmp_path):
    """The graph counts an import inside a function and resolves relative imports, so the test above can fail."""
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from .sub import b\n")
    (pkg / "sub" / "b.py").write_text(textwrap.dedent("""
        def late():
            from .. import a  # up into the package, inside a function
            return a
    """))
    (pkg / "c.py").write_text("import pkg.a\n")  # imports the cycle, is not in it
    graph = import_graph(pkg)
    assert graph["pkg.a"] == {"pkg.sub.b": 1} and graph["pkg.sub.b"] == {"pkg.a": 3}
    assert cycles(graph) == [["pkg.a", "pkg.sub.b"]]
    (pkg / "sub" / "b.py").write_text("from .. import sub\n")  # its own package: no cycle
    assert cycles(import_graph(pkg)) == []


def test_the_core_imports_nothing_above_it():
    """The pure core (pack_assets/core) holds the logic; Dagster, its layer, the runner and the CLI call it,
    never the other way round, not even inside a function."""
    found = []
    for name, path in modules(PACKAGE).items():
        if name.startswith("pack_assets.core"):
            found += [f"{name}:{line} imports {target}" for target, line in imports(name, path, set())
                      if any(target == up or target.startswith(up + ".") for up in ABOVE_CORE)]
    assert not found, "\n".join(found)
