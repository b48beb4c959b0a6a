"""The package's shape: no import cycles, no private names reached across modules, every Spec in
the tables keeps the contract of `hpcring.algorithms.base`, and nothing outside the algorithms
package keeps a list of algorithm names. Serial: it reads the source and the tables."""

from __future__ import annotations

import ast
import inspect
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpcring import algorithms

PACKAGE = Path(algorithms.__file__).resolve().parent.parent


def _modules() -> dict[str, Path]:
    """Every module of the package by dotted name."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


MODULES = _modules()


def _outside_type_checking(tree: ast.AST) -> Iterator[ast.AST]:
    """Every node, except what sits under ``if TYPE_CHECKING:`` (it never runs)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            stack.extend(node.orelse)
            continue
        yield node
        stack.extend(ast.iter_child_nodes(node))


def _resolve(module: str, level: int, target: str | None) -> str:
    """The absolute name of a relative import ``from .target`` written in ``module``."""
    package = module if MODULES[module].name == "__init__.py" else module.rpartition(".")[0]
    for _ in range(level - 1):
        package = package.rpartition(".")[0]
    return f"{package}.{target}" if target else package


def _imports(module: str) -> Iterator[tuple[str, list[str]]]:
    """(the module imported, the names taken from it) for each import the module can run,
    at top level or deferred inside a function alike."""
    tree = ast.parse(MODULES[module].read_text())
    for node in _outside_type_checking(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, []
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(module, node.level, node.module) if node.level else node.module or ""
            yield base, [alias.name for alias in node.names]


def _edges(module: str) -> set[str]:
    """The package's modules that ``module`` imports (``from . import x`` imports module x)."""
    found = set()
    for base, names in _imports(module):
        for name in names:
            if f"{base}.{name}" in MODULES:
                found.add(f"{base}.{name}")
        if base in MODULES and (not names or any(f"{base}.{name}" not in MODULES for name in names)):
            found.add(base)  # a name the module itself defines
    return found - {module}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_cycles() -> None:
    """Deferred imports count: a cycle held together by an import inside a function is still a
    cycle of modules that cannot be read, tested or changed apart."""
    graph = {module: _edges(module) for module in MODULES}
    assert _cycles(graph) == []


def test_the_cycle_finder_finds_one() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_private_name_is_reached_across_modules() -> None:
    """``from .x import _y`` and ``x._y`` on a module of the package: what is private to a module
    stays in it (the package's face re-exports under private names, which is not reaching in)."""
    offences = []
    for module, path in MODULES.items():
        tree = ast.parse(path.read_text())
        bound = {}  # local name -> package module it names
        for base, names in _imports(module):
            if not base.startswith("hpcring"):
                continue
            for name in names:
                if name.startswith("_") and not name.startswith("__") and f"{base}.{name}" not in MODULES:
                    offences.append(f"{module}: from {base} import {name}")
                if f"{base}.{name}" in MODULES:
                    bound[name] = f"{base}.{name}"
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.startswith("hpcring"):
                        bound[alias.asname or alias.name.split(".")[0]] = alias.name
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in bound
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
            ):
                offences.append(f"{module}:{node.lineno}: {node.value.id}.{node.attr}")
    assert offences == []


def test_algorithms_and_the_cost_model_import_without_mpi_or_numpy() -> None:
    """The algorithms reach MPI through their channel, so the tables (and the cost model, which
    prices their declared phases) load where MPI is not initialized."""
    import subprocess
    import sys

    code = (
        "import sys, hpcring.algorithms, hpcring.model.costs; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('mpi4py', 'numpy')))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


# ---- the Spec contract ---------------------------------------------------------------------------

RUN_ARGUMENTS = {
    algorithms.ALLREDUCE: ["ch", "src", "dst", "op"],
    algorithms.REDUCE_SCATTER: ["ch", "src", "dst", "op"],
    algorithms.ALLGATHER: ["ch", "src", "dst"],
    algorithms.BROADCAST: ["ch", "buf", "root"],
    algorithms.ALLTOALL: ["ch", "src", "dst", "layout"],
}
SPECS = [
    pytest.param(collective, name, id=f"{collective}-{name}")
    for collective in algorithms.COLLECTIVES
    for name in algorithms.table(collective)
]


def _required(function: object) -> list[str]:
    return [
        p.name
        for p in inspect.signature(function).parameters.values()  # type: ignore[arg-type]
        if p.default is inspect.Parameter.empty and p.kind is not inspect.Parameter.VAR_KEYWORD
    ]


@pytest.mark.parametrize(("collective", "name"), SPECS)
def test_every_spec_keeps_the_contract(collective: str, name: str) -> None:
    spec = algorithms.spec(collective, name)
    assert spec.name == name and spec.collective == collective  # the table names it
    if spec.choose is not None:  # a chooser: the engine runs, prices and counts its choice
        assert spec.run is spec.bytes_sent is spec.scratch_bytes is None
        assert spec.default is not None
        default = spec.default(1 << 20, 4)
        assert default in algorithms.table(collective) and default != name
        return
    assert _required(spec.run) == RUN_ARGUMENTS[collective]
    assert _required(spec.scratch_bytes) == ["count", "itemsize", "size", "rank"]
    assert _required(spec.bytes_sent) == ["count", "itemsize", "size", "rank"]
    sent = spec.sent(1000, 4, 4, 1, root=0 if collective == algorithms.BROADCAST else None)
    assert sent is None or sent >= 0
    assert spec.scratch_bytes(1000, 4, 4, 1) >= 0
    assert not (spec.phases and spec.modelled_as)  # priced one way
    for other in spec.modelled_as:
        assert algorithms.spec(collective, other).phases is not None
    if spec.phases is not None:
        phases = spec.phases(1 << 20, 4)
        assert phases and all(isinstance(p, algorithms.Phase) for p in phases)
        assert spec.phases(1 << 20, 1) == []  # one rank: nothing to do
    if spec.narrowings is not None:
        assert spec.narrowings(4, 1) >= 1


@pytest.mark.parametrize("collective", algorithms.COLLECTIVES)
def test_an_unknown_name_is_an_error_in_every_table(collective: str) -> None:
    with pytest.raises(ValueError, match="unknown algorithm 'tree'; choose one of"):
        algorithms.spec(collective, "tree")
    with pytest.raises(ValueError, match="unknown algorithm"):
        algorithms.bytes_sent("tree", 10, 4, 2, 0, collective=collective)
    with pytest.raises(ValueError, match="unknown collective"):
        algorithms.table("alltoallw")


def test_no_list_of_algorithm_names_outside_the_algorithms_package() -> None:
    """Traits are declared where an algorithm lives: a module outside `hpcring.algorithms` that
    compares against, or lists, algorithm names by hand keeps knowledge that is not its own.
    (Defaults that name one algorithm, the bench's and examples' choices, are arguments, not lists;
    a line that reports on one algorithm itself says so: "# by name: ...".)"""
    names = {name for collective in algorithms.COLLECTIVES for name in algorithms.table(collective)}
    literal = "|".join(sorted(names))
    listed = re.compile(
        rf"""(==|!=|\bin)\s*\(?\s*["']({literal})["']|\(["']({literal})["'],\s*["']({literal})["']"""
    )
    offences = []
    for module, path in MODULES.items():
        if module.startswith("hpcring.algorithms") or module.startswith("hpcring.examples"):
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            code, _, comment = line.partition("#")
            if listed.search(code) and not comment.strip().startswith("by name:"):
                offences.append(f"{module}:{number}: {line.strip()}")
    assert offences == []
