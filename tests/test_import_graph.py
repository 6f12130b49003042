"""No two files of src/vitlab import each other, directly or around a circle, counting the imports inside functions
too (STYLE.md: import downward only; a lazy import is for start-up time, never to hide a circle).

The graph has one node per file: a package's `__init__.py` is the package's node. Each `import` and `from ... import`
(module level or inside a function, relative ones resolved) draws one edge, to the module it names: `import a.b.c`
and `from a.b import c` (where c is a submodule) point at a/b/c.py; `from a.b import name` (name is not a module)
points at a/b.py or a/b/__init__.py. Python also runs every parent package's `__init__.py` on such an import; those
edges are left out, because a package that re-exports its submodules would otherwise put each submodule that
imports a sibling on a circle that no file of the two wrote. `importlib.import_module("...")` strings are not read.

The same graph, each file folded into its first-level package (or single-file module), is checked against the
declared layers (`LAYERS`): a package imports only packages of lower layers, so no two packages import each other
either, around any circle.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"

# Circles that run through files this test's authors may not change, each by name with its owner. Empty: the
# circles through src/vitlab/models/, layers/ or config.py (being rewritten elsewhere) would be listed here, each a
# frozenset of its modules, until that rewrite removes them.
ALLOWED_CIRCLES: dict[str, frozenset[str]] = {}

# The first-level packages and single-file modules of src/vitlab in layers, lowest first (STYLE.md: import downward
# only). A file may import the files of its own package and those of lower layers, never a name of its own layer or
# of a higher one. "__init__" is src/vitlab/__init__.py (the package's face), "__main__" `python -m vitlab`.
LAYERS: tuple[tuple[str, ...], ...] = (
    # the ground: modules that import nothing of vitlab's
    ("errors", "environment", "files", "messages", "lazy", "plots"),
    # the model's config and its torch-free parts: the preprocessing contract, the patch grid, the position kinds'
    # traits, the head configs of dense models (below everything that builds, reads or feeds a model)
    ("preprocessing", "patch_grid", "position_kinds"),
    ("head_configs",),
    ("config",),
    # services on the ground: progress lines, the pre-trained catalogue, the patch input, processes, the cache
    ("__init__", "progress", "pretrained", "model_input", "distributed", "download"),
    # medians that survive a noisy machine, the run folder, what this machine has and the choices made from it
    ("timing", "runs", "hardware"),
    # the Vision Transformer's parts, one concept per file
    ("layers",),
    # the CPU kernels a layer can run on; the data sets, loaders and the preprocessing's implementation; the scores of
    # predictions (mIoU, depth errors, k-NN) that evaluation, the dense probes and the objectives share
    ("kernels", "data", "metrics"),
    # the model families' preset architectures (torch-free, below the converters that read their checkpoints)
    ("presets",),
    # named variants: a config by name
    ("variants",),
    ("models",),
    # the checkpoint formats and families (they build models); parameter and FLOP counts of a model
    ("checkpoint", "counts"),
    # the features pipeline `embed` and `dense` write through: sharded stores, their formats, the extraction loop
    ("features",),
    # what a model computes: patch features and dense predictions, exported graphs, then evaluation and prediction
    ("dense",),
    ("export",),
    # the table of runtimes that export, predict, eval, serve, info and bench read (each row wraps `export`'s code)
    ("runtime",),
    ("eval",),
    # what reads them: the paper's analyses, the training objectives
    ("analysis", "objectives"),
    ("train", "serve", "reports"),
    ("bench", "ablate"),
    ("cli",),
    ("__main__",),
)

# Imports that break the layers today, each (importing file, imported file) with its owner: the engineer whose
# branch removes it. Remove an entry when that branch lands (the test fails on an entry whose import is gone).
ALLOWED_UPWARD: dict[tuple[str, str], str] = {}


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


def package_of(module: str) -> str:
    """The first-level name of `module` as `LAYERS` names it: "vitlab.train.loop" -> "train", "vitlab" -> "__init__"."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """`graph` with each file folded into its first-level package: {"train": {"data", "models", ...}, ...}."""
    packages: dict[str, set[str]] = {package_of(name): set() for name in graph}
    for name, imported in graph.items():
        packages[package_of(name)] |= {package_of(other) for other in imported} - {package_of(name)}
    return packages


def imports_against_layers(graph: dict[str, set[str]], layers: tuple[tuple[str, ...], ...]) -> list[tuple[str, str]]:
    """The (importing file, imported file) pairs of `graph` whose package imports one of its own layer or higher."""
    layer_of = {package: index for index, layer in enumerate(layers) for package in layer}
    return sorted(
        (name, other)
        for name, imported in graph.items()
        for other in imported
        if package_of(name) != package_of(other) and layer_of[package_of(other)] >= layer_of[package_of(name)]
    )


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


def test_every_package_imports_only_lower_layers():
    graph = import_graph()
    declared = [package for layer in LAYERS for package in layer]
    assert len(declared) == len(set(declared)), "a package stands on two layers of LAYERS"
    packages = {package_of(name) for name in graph}
    assert not packages - set(declared), f"give {sorted(packages - set(declared))} a layer in LAYERS"
    assert not set(declared) - packages, f"LAYERS names {sorted(set(declared) - packages)}, which are gone"
    layer_of = {package: index for index, layer in enumerate(LAYERS) for package in layer}
    against = imports_against_layers(graph, LAYERS)
    for name, other in against:
        if (name, other) not in ALLOWED_UPWARD:
            print(f"{name} (layer {layer_of[package_of(name)]}) imports {other} (layer {layer_of[package_of(other)]})")
    assert set(against) <= set(ALLOWED_UPWARD), (
        "imports against the layers (printed above): move the piece both need down, or invert the import through "
        "a table that the lower package keeps and the higher one fills"
    )
    gone = sorted(set(ALLOWED_UPWARD) - set(against))
    assert not gone, f"remove these entries of ALLOWED_UPWARD, whose import is gone: {gone}"


def test_the_layer_check_sees_a_sibling_and_a_higher_layer():
    graph = {
        "vitlab": {"vitlab.low"},
        "vitlab.low": set(),
        "vitlab.mid.a": {"vitlab.low", "vitlab.mid.b"},  # its own package: fine
        "vitlab.mid.b": {"vitlab.high.c"},  # a higher layer
        "vitlab.side": {"vitlab.mid.a"},  # its own layer
        "vitlab.high.c": {"vitlab.mid.a", "vitlab"},
    }
    layers = (("low",), ("__init__",), ("mid", "side"), ("high",))
    assert imports_against_layers(graph, layers) == [("vitlab.mid.b", "vitlab.high.c"), ("vitlab.side", "vitlab.mid.a")]
    assert package_graph(graph) == {
        "__init__": {"low"},
        "low": set(),
        "mid": {"low", "high"},
        "side": {"mid"},
        "high": {"mid", "__init__"},
    }
    assert strongly_connected(package_graph(graph)) == [{"mid", "high"}]
