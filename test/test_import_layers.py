"""The library's import graph points down: no import reaches a higher layer, no two modules import each other.

Every ``.py`` under ``torchrl_muzero/`` is parsed with :mod:`ast` (nothing is
imported). Every ``import`` of ``torchrl_muzero.*`` is an arrow, wherever it
stands: at module level, inside a function (a lazy import is still a
dependency, it only runs later) and relative (``from . import x``). Only the
imports under ``if TYPE_CHECKING:`` are left out: they never run, they name a
type for the annotations.

``from a.b import c`` is an arrow to the module ``a.b.c`` when it is one, else
to ``a.b``; importing a submodule also runs its package's ``__init__``, but
that is not counted as an arrow (a package's ``__init__`` re-exports its own
modules, so counting it would make every package a circle).
"""
from __future__ import annotations

import ast
import pathlib
from collections import defaultdict
from typing import NamedTuple

PACKAGE = "torchrl_muzero"
ROOT = pathlib.Path(__file__).resolve().parent.parent / PACKAGE

# The layers, lowest first. A module may import its own layer's modules (as long
# as no circle forms) and those of lower layers only. Why this order (what each
# layer needs from the ones below it):
#   leaves        stdlib, torch, tensordict, torchrl only; nothing of torchrl_muzero
#                 (``_C`` is the compiled kernel; ``errors`` the exceptions the
#                 configs raise; ``durable_files`` / ``bounded_call`` small utilities)
#   kernel        the C++ kernel's loader and build flags: loads ``_C``
#   torchrl_guards  the torchrl workarounds; the envs (AsyncEnvPool) and the
#                 trainers (collectors, weight sync) use them
#   envs          the games and env factories; ``action_spaces`` describes the
#                 action spaces every layer above reads
#   modules       the networks: read the action spaces; run the kernel's fused forwards
#   mcts          the searches: step the models (``modules.step``), call the kernel
#   data          the replay buffer: its reanalyze searches (mcts)
#   objectives    the losses: read the models' outputs and the action spaces
#   algorithms    each algorithm builds a model, a search, a loss and a buffer
#   trainers      the training loops, configs and command-line entry points: use
#                 the algorithms and everything below
# Layers on the same rank may not import each other at all.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("", "_C", "errors", "durable_files", "bounded_call"),  # "": the package's own __init__ (its version)
    ("kernel",),
    ("torchrl_guards",),
    ("envs",),
    ("modules",),
    ("mcts",),
    ("data",),
    ("objectives",),
    ("algorithms",),
    ("trainers",),
)
RANK = {layer: rank for rank, group in enumerate(LAYERS) for layer in group}

# Compiled modules: not a .py file, but a module an import may name.
EXTENSIONS = {f"{PACKAGE}._C"}

class Arrow(NamedTuple):
    source: str  # the importing module
    target: str  # the imported module
    where: str  # file:line of the import


def module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def all_modules() -> dict[str, pathlib.Path]:
    return {module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def _under_type_checking(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    while node in parents:
        node = parents[node]
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            return True
    return False


def _resolve(name: str, modules: dict[str, pathlib.Path]) -> str | None:
    """The module ``name`` stands for: itself if it is one (or the compiled kernel), else its parent package."""
    while name:
        if name in modules or name in EXTENSIONS:
            return name
        name = name.rpartition(".")[0]
    return None


def import_arrows() -> list[Arrow]:
    modules = all_modules()
    arrows = []
    for source, path in modules.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
        is_package = path.name == "__init__.py"
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Import, ast.ImportFrom)) or _under_type_checking(node, parents):
                continue
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                base = node.module or ""
                if node.level:  # relative: from the importing module's package, up level - 1 packages
                    package = source if is_package else source.rpartition(".")[0]
                    for _ in range(node.level - 1):
                        package = package.rpartition(".")[0]
                    base = f"{package}.{base}" if base else package
                # "from a.b import c": the module a.b.c when it is one, else a.b
                names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules or
                         f"{base}.{alias.name}" in EXTENSIONS else base for alias in node.names]
            for name in names:
                if not (name == PACKAGE or name.startswith(PACKAGE + ".")):
                    continue
                target = _resolve(name, modules)
                if target is None or target == source:
                    continue
                # a package's own __init__ re-exports its modules: not an arrow (see the module docstring)
                if is_package and target.startswith(source + "."):
                    continue
                arrows.append(Arrow(source, target, f"{path.relative_to(ROOT.parent)}:{node.lineno}"))
    return arrows


def layer(module: str) -> str:
    """The layer of a module: its first part below the package ("" for the package itself)."""
    rest = module[len(PACKAGE) + 1:] if module != PACKAGE else ""
    return rest.split(".")[0]


def strongly_connected_components(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm (iterative); only the components of two or more modules (the circles)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    counter = 0
    nodes = set(graph) | {t for ts in graph.values() for t in ts}
    for root in sorted(nodes):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
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
                    work.append((child, iter(sorted(graph.get(child, ())))))
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
                    out.append(sorted(component))
    return out


def test_every_module_is_in_a_layer():
    unknown = sorted({m for m in all_modules() if layer(m) not in RANK})
    assert not unknown, f"modules outside every layer of LAYERS (add their folder there): {unknown}"


def test_the_walk_sees_lazy_and_relative_imports():
    """The walk itself: a function-level import and a package's relative import are arrows."""
    arrows = {(a.source, a.target) for a in import_arrows()}
    assert arrows, "no arrow found: the walk is broken"
    lazy = [a for a in import_arrows() if a.source == f"{PACKAGE}.algorithms.sampled_muzero"
            and a.target.startswith(f"{PACKAGE}.modules")]
    assert lazy, "algorithms/sampled_muzero.py imports its models inside functions: the walk must see it"


def test_no_import_points_up():
    upward = [a for a in import_arrows()
              if layer(a.source) != layer(a.target) and RANK[layer(a.target)] >= RANK[layer(a.source)]]
    lines = sorted({f"  {a.where}: {a.source} ({layer(a.source) or PACKAGE}) imports {a.target} "
                    f"({layer(a.target) or PACKAGE})" for a in upward})
    assert not upward, "imports that point up or sideways (see LAYERS):\n" + "\n".join(lines)


def test_no_import_circle():
    arrows = import_arrows()
    graph: dict[str, set[str]] = defaultdict(set)
    for a in arrows:
        graph[a.source].add(a.target)
    cycles = list(strongly_connected_components(graph))
    lines = []
    for component in cycles:
        members = set(component)
        lines.append("  circle: " + ", ".join(component))
        lines += sorted({f"    {a.where}: {a.source} -> {a.target}" for a in arrows
                         if a.source in members and a.target in members})
    assert not cycles, "modules that import each other (directly or around a circle):\n" + "\n".join(lines)
