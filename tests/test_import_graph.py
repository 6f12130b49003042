"""No two files of src/vitlab import each other, directly or around a circle, counting the imports inside functions
too (STYLE.md: import downward only; a lazy import is for start-up time, never to hide a circle).

The graph has one node per file: a package's `__init__.py` is the package's node. Each `import` and `from ... import`
(module level or inside a function, relative ones resolved) draws one edge, to the module it names: `import a.b.c`
and `from a.b import c` (where c is a submodule) point at a/b/c.py; `from a.b import name` (name is not a module)
points at a/b.py or a/b/__init__.py. Python also runs every parent package's `__init__.py` on such an import; those
edges are left out, because a package that re-exports its submodules would otherwise put each submodule that
imports a sibling on a circle that no file of the two wrote. `importlib.import_module("...")` strings are not read.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"

# Circles that run through files this test's authors may not change, each by name with its owner. Empty: the
# circles through src/vitlab/models/, layers/ or config.py (being rewritten elsewhere) would be listed here, each a
# frozenset of its modules, until that rewrite removes them.
ALLOWED_CIRCLES: dict[str, frozenset[str]] = {}


def module_names() -> dict[str, Path]:
    """{"vitlab.train.loop": its path, "vitlab.train": .../train/__init__.py, ...}"""
    names = {}
    for path in (SRC / "vitlab").rglob("*.py"):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return names


def imported_modules(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The vitlab modules `name` (at `path`) imports anywhere in its text."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    edges = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            edges |= {alias.name for alias in node.names if alias.name in modules}
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from . import x, from ..a import b
                base = package[: len(package) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                if f"{target}.{alias.name}" in modules:
                    edges.add(f"{target}.{alias.name}")
                elif target in modules:
                    edges.add(target)
    edges.discard(name)
    return edges


def import_graph() -> dict[str, set[str]]:
    modules = module_names()
    return {name: imported_modules(name, path, modules) for name, path in modules.items()}


def strongly_connected(graph: dict[str, set[str]]) -> list[set[str]]:
    """The groups of two or more modules that reach each other (Tarjan's algorithm, without recursion)."""
    index: dict[str, int] = {}
    lowest: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = lowest[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, successors = work[-1]
            for successor in successors:
                if successor not in index:
                    index[successor] = lowest[successor] = len(index)
                    stack.append(successor)
                    on_stack.add(successor)
                    work.append((successor, iter(sorted(graph[successor]))))
                    break
                if successor in on_stack:
                    lowest[node] = min(lowest[node], index[successor])
            else:
                work.pop()
                if work:
                    lowest[work[-1][0]] = min(lowest[work[-1][0]], lowest[node])
                if lowest[node] == index[node]:
                    group = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        group.add(member)
                        if member == node:
                            break
                    if len(group) > 1:
                        groups.append(group)
    return groups


def one_circle(group: set[str], graph: dict[str, set[str]]) -> list[str]:
    """A shortest path from the group's first module back to itself, through the group: a circle to print."""
    start = min(group)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for successor in sorted(graph[node] & group):
                if successor == start:
                    return paths[node] + [start]
                if successor not in paths:
                    paths[successor] = paths[node] + [successor]
                    following.append(successor)
        frontier = following
    raise AssertionError(f"{group} is not strongly connected")


def test_no_file_of_vitlab_imports_itself_around_a_circle():
    graph = import_graph()
    assert "vitlab.train.loop" in graph and "vitlab.train.epoch" in graph["vitlab.train.loop"]
    allowed = set(ALLOWED_CIRCLES.values())
    circles = [group for group in strongly_connected(graph) if frozenset(group) not in allowed]
    for group in circles:
        print(f"import circle of {len(group)} modules: {' -> '.join(one_circle(group, graph))}")
    assert not circles, "import circles (printed above): move the shared piece down into a module both can import"


def test_the_graph_counts_imports_inside_functions_and_relative_ones(tmp_path):
    package = tmp_path / "vitlab" / "pkg"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "low.py").write_text("def f():\n    from . import high\n")
    (package / "high.py").write_text("from vitlab.pkg.low import f\nimport vitlab.pkg\n")
    modules = {"vitlab.pkg": package / "__init__.py", "vitlab.pkg.low": package / "low.py"}
    modules["vitlab.pkg.high"] = package / "high.py"
    graph = {name: imported_modules(name, path, modules) for name, path in modules.items()}
    assert graph == {
        "vitlab.pkg": set(),
        "vitlab.pkg.low": {"vitlab.pkg.high"},
        "vitlab.pkg.high": {"vitlab.pkg.low", "vitlab.pkg"},
    }
    assert strongly_connected(graph) == [{"vitlab.pkg.low", "vitlab.pkg.high"}]
    assert one_circle({"vitlab.pkg.low", "vitlab.pkg.high"}, graph) == [
        "vitlab.pkg.high",
        "vitlab.pkg.low",
        "vitlab.pkg.high",
    ]
