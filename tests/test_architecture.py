"""The package's layering (docs/architecture.md): imports go downward only, so no two modules
import each other, however indirectly (imports inside functions count: a cycle broken by a
late import is still a cycle of concepts); the Python API loads neither the command line nor
the plugin; and no module imports another's private names."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "pytest_ptq"


def _module(path):
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path, name):
    """``{(imported module, imported name or None)}`` of every import in ``path``."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.update((target, a.name) for a in node.names)
        elif isinstance(node, ast.Import):
            found.update((a.name, None) for a in node.names)
    return found


def _graph():
    """``{module: {module it imports}}`` within the package (a name imported from a package
    that is itself a module counts as that module)."""
    modules = {_module(p): p for p in PACKAGE.rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        edges = set()
        for target, item in _imports(path, name):
            if f"{target}.{item}" in modules:
                edges.add(f"{target}.{item}")
            elif target in modules:
                edges.add(target)
        edges.discard(name)
        graph[name] = edges
    return graph, modules


def _cycles(graph):
    """Strongly connected components of more than one module (Tarjan's algorithm)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = []
            while True:
                w = stack.pop()
                on.discard(w)
                part.append(w)
                if w == v:
                    break
            if len(part) > 1:
                out.append(sorted(part))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(graph)))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_module_imports_one_that_imports_it_back():
    graph, _ = _graph()
    # a package's __init__ re-exports its modules: the edge from it down to them is its own
    for name in graph:
        graph[name] = {t for t in graph[name] if not t.startswith(name + ".")}
    assert _cycles(graph) == []


def test_no_module_imports_a_private_name_of_another():
    _, modules = _graph()
    private = [(name, f"{target}.{item}") for name, path in modules.items()
               for target, item in _imports(path, name)
               if target.startswith("pytest_ptq") and item and item.startswith("_") and not item.startswith("__")
               and target != name]
    assert private == []


def test_the_python_api_loads_neither_the_command_line_nor_the_plugin():
    code = ("import sys, pytest_ptq.debug, pytest_ptq.engine, pytest_ptq.remedy; "
            "print(sorted(m for m in sys.modules if m.startswith(('pytest_ptq.cli', 'pytest_ptq.plugin'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_temporary_folders_are_made_where_a_killed_runs_are_swept():
    """guard.scratch and guard.output_folder name a temporary folder with its process's id, so
    that a later run removes one a killed run left; a plain tempfile folder stays for good
    (the report's figure folders did)."""
    makers = ("TemporaryDirectory(", "mkdtemp(")
    found = sorted(f"{path.relative_to(PACKAGE)}:{k}" for path in PACKAGE.rglob("*.py") if path.name != "guard.py"
                   for k, line in enumerate(path.read_text().splitlines(), 1) if any(m in line for m in makers))
    # the engine's marker folder: only where an install lost its one-byte file, removed at exit
    assert [f.split(":")[0] for f in found] == ["engine/runtime.py"], found
