"""The import graph of ``src/dxopt`` has no circle and never reaches ``benchmarks``/``examples``.

Every module of the package is parsed with :mod:`ast` (nothing is imported, so
an import hidden behind a lazy path or a function body is seen just the same).
Both module-level and function-level imports count: an ``import`` inside a
function body still makes the module depend on its target.  Imports under
``if TYPE_CHECKING:`` are type-only (they never run) and are skipped.

The graph is at module granularity:

* ``from dxopt.qp import X`` is an edge to the package ``dxopt.qp`` (its
  ``__init__``), unless ``dxopt.qp.X`` is itself a module, in which case the
  edge goes to that submodule (``from pkg import submodule``);
* ``import dxopt.qp.api.solve`` is an edge to ``dxopt.qp.api.solve``;
* relative imports are resolved against the importing module's package.

Importing a submodule also runs its parent packages' ``__init__``; those
implicit edges are left out on purpose, since a package ``__init__`` that
re-exports its submodules would otherwise close a "circle" with every one of
them.  A package ``__init__`` importing its submodules is an ordinary edge.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Collection, Iterator
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = "dxopt"
FORBIDDEN_ROOTS = ("benchmarks", "examples")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(path): path for path in sorted((SRC / PACKAGE).rglob("*.py"))}


def _is_type_checking(test: ast.expr) -> bool:
    if isinstance(test, ast.Name):
        return test.id == "TYPE_CHECKING"
    if isinstance(test, ast.Attribute):
        return test.attr == "TYPE_CHECKING"
    return False


def _runtime_imports(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement in ``tree`` except those under ``if TYPE_CHECKING:``."""
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
            continue
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        stack.extend(ast.iter_child_nodes(node))


def _resolve_base(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    package = module.split(".") if is_package else module.split(".")[:-1]
    if node.level > 1:
        package = package[: len(package) - (node.level - 1)]
    return ".".join([*package, *([node.module] if node.module else [])])


def _targets(
    module: str, source: str, is_package: bool, known: Collection[str]
) -> Iterator[tuple[str, int]]:
    """The (imported module, line) pairs of ``module`` whose text is ``source``."""
    tree = ast.parse(source, filename=module)
    for node in _runtime_imports(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
            continue
        base = _resolve_base(module, is_package, node)
        for alias in node.names:
            candidate = f"{base}.{alias.name}"
            yield (candidate if candidate in known else base), node.lineno


def _graph() -> tuple[dict[str, set[str]], list[str]]:
    known = _modules()
    graph: dict[str, set[str]] = {name: set() for name in known}
    forbidden: list[str] = []
    for module, path in known.items():
        source = path.read_text(encoding="utf-8")
        for target, line in _targets(module, source, path.name == "__init__.py", known):
            root = target.split(".")[0]
            if root in FORBIDDEN_ROOTS:
                forbidden.append(f"{module} (line {line}) imports {target}")
            elif root == PACKAGE and target != module:
                if target not in known:
                    raise AssertionError(f"{module} (line {line}) imports unknown {target}")
                graph[module].add(target)
    return graph, forbidden


def _find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected component with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[list[str]] = []
    counter = 0

    def visit(root: str) -> None:
        nonlocal counter
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(component)

    for name in sorted(graph):
        if name not in index:
            visit(name)
    return [_cycle_in(graph, set(component)) for component in components]


def _cycle_in(graph: dict[str, set[str]], component: set[str]) -> list[str]:
    """A shortest cycle through the first module of ``component`` (breadth-first)."""
    start = min(component)
    parent: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for child in sorted(graph[node] & component):
                if child == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(parent[path[-1]])
                    return [start, *reversed(path[:-1]), start]
                if child not in parent:
                    parent[child] = node
                    following.append(child)
        frontier = following
    raise AssertionError(f"no cycle through {start}")  # pragma: no cover


def test_edges_cover_function_level_relative_and_submodule_imports() -> None:
    """The walker's rules on a synthetic module ``dxopt.qp._x`` (no file needed)."""
    known = {"dxopt.qp", "dxopt.qp._x", "dxopt.qp._a", "dxopt.qp._b", "dxopt.qp.sub",
             "dxopt.qp.sub._c", "dxopt._core", "dxopt.linalg"}  # fmt: skip
    source = """
from typing import TYPE_CHECKING
import torch
from dxopt._core import Status
from ._a import thing
from . import _b
from .sub import _c
import dxopt.linalg

if TYPE_CHECKING:
    from dxopt.qp import QPSolution

def late():
    from dxopt.qp import solve
    from benchmarks.qp import runner
"""
    edges = sorted({t for t, _ in _targets("dxopt.qp._x", source, False, known)})
    assert edges == [
        "benchmarks.qp",
        "dxopt._core",
        "dxopt.linalg",
        "dxopt.qp",  # the function-level import; the TYPE_CHECKING one alone would not count
        "dxopt.qp._a",
        "dxopt.qp._b",
        "dxopt.qp.sub._c",
        "torch",
        "typing",
    ]
    # a package __init__ resolves "." to itself
    inits = {t for t, _ in _targets("dxopt.qp", "from ._a import thing", True, known)}
    assert inits == {"dxopt.qp._a"}
    only_typing = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import dxopt.qp\n"
    assert {t for t, _ in _targets("dxopt.qp._x", only_typing, False, known)} == {"typing"}


def test_graph_covers_the_package() -> None:
    graph, _ = _graph()
    assert len(graph) > 50
    assert (
        "dxopt.qp.autograd.state" in graph
        and "dxopt.qp.solvers.forward" in graph["dxopt.qp.autograd.state"]
    )


def test_cycle_finder_reports_a_path() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _find_cycles(graph) == [["a", "b", "c", "a"]]
    assert _find_cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_in_dxopt() -> None:
    graph, _ = _graph()
    cycles = _find_cycles(graph)
    assert not cycles, "import circles in src/dxopt:\n" + "\n".join(
        " -> ".join(cycle) for cycle in cycles
    )


def test_library_never_imports_benchmarks_or_examples() -> None:
    _, forbidden = _graph()
    assert not forbidden, "the library imports benchmarks/examples:\n" + "\n".join(forbidden)


# The layers of dxopt.qp, lowest first: a module of one layer imports only its own layer and
# the layers before it (the data flow of one solve: problem -> certify -> solvers -> backward
# -> autograd -> lean -> api -> frontend). The package ``dxopt.qp`` itself (its __init__) sits on
# top.
QP_LAYERS = ("problem", "certify", "solvers", "backward", "autograd", "lean", "api", "frontend")
# Edges against the flow that are known and scheduled to go; keep this empty (the last one,
# solvers.forward -> autograd.torch_entry, went when the router took the torch branch out of
# solve_forward).
QP_UPWARD_ALLOWED: frozenset[tuple[str, str]] = frozenset()


def _qp_layer(module: str) -> int | None:
    parts = module.split(".")
    if len(parts) < 3 or parts[:2] != ["dxopt", "qp"]:
        return None
    return QP_LAYERS.index(parts[2]) if parts[2] in QP_LAYERS else None


def test_qp_has_only_layer_subpackages() -> None:
    flat = sorted(p.name for p in (SRC / PACKAGE / "qp").glob("*.py") if p.name != "__init__.py")
    assert not flat, f"dxopt.qp keeps its modules in the layer sub-packages {QP_LAYERS}: {flat}"
    for layer in QP_LAYERS:
        init = SRC / PACKAGE / "qp" / layer / "__init__.py"
        text = init.read_text(encoding="utf-8")
        assert ('"""' in text and "May import" in text) or layer == "frontend", (
            f"{init} must say in its docstring what it owns and what it may import"
        )


def test_qp_imports_point_down_the_layers() -> None:
    graph, _ = _graph()
    upward = []
    for module, targets in graph.items():
        low = _qp_layer(module)
        if low is None:
            continue
        for target in targets:
            high = _qp_layer(target)
            if target == "dxopt.qp" and module.split(".")[2] != "frontend":
                upward.append(f"{module} -> {target} (the package top)")
            elif high is not None and high > low and (module, target) not in QP_UPWARD_ALLOWED:
                upward.append(f"{module} ({QP_LAYERS[low]}) -> {target} ({QP_LAYERS[high]})")
    assert not upward, "imports against the qp layers:\n" + "\n".join(sorted(upward))


# The table "The rest of the library" in docs/architecture.md: which dxopt subpackage may
# import which. Every subpackage (and the top-level modules such as ``dxopt.cli``) has a row.
ARCHITECTURE = SRC.parent / "docs" / "architecture.md"
TOP = "dxopt"  # the package itself (``import dxopt``), "`dxopt` itself" in the table


def _architecture_table() -> dict[str, set[str]]:
    """Row name -> the names allowed in its imports column (backticked words; ``nothing``)."""
    rows: dict[str, set[str]] = {}
    for line in ARCHITECTURE.read_text(encoding="utf-8").splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) != 3 or not cells[0].startswith("`"):
            continue
        name = cells[0].strip("`")
        allowed = set(re.findall(r"`([A-Za-z_.]+)`", cells[2]))
        rows[name] = {TOP if item == "dxopt" else item for item in allowed}
    return rows


def _subpackage(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else TOP


def test_architecture_table_parser_reads_rows() -> None:
    rows = _architecture_table()
    assert rows["_core"] == set()
    assert rows["dfl"] == {"_core", "linalg", "qp", "conic"}
    assert TOP in rows["distributed"]


def test_every_subpackage_imports_only_what_the_architecture_table_allows() -> None:
    """docs/architecture.md's import table, tested for the whole library (not only qp)."""
    graph, _ = _graph()
    rows = _architecture_table()
    missing = sorted({_subpackage(m) for m in graph if _subpackage(m) != TOP} - set(rows))
    assert not missing, f"docs/architecture.md has no import-table row for {missing}"
    stale = sorted(set(rows) - {_subpackage(m) for m in graph})
    assert not stale, f"docs/architecture.md lists subpackages that do not exist: {stale}"
    bad = []
    for module, targets in graph.items():
        source = _subpackage(module)
        if source == TOP:
            continue
        for target in targets:
            dest = _subpackage(target)
            if dest != source and dest not in rows[source]:
                bad.append(f"{module} -> {target} (row `{source}` allows {sorted(rows[source])})")
    assert not bad, "imports the architecture table does not allow:\n" + "\n".join(sorted(bad))
