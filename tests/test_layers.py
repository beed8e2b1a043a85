"""The structure holds: read from the code's own imports (``ast``), nothing is run.

* ``agent`` never imports ``cloud``, ``simulations``, ``tests`` or pyspark (the edge image
  installs ``agent`` alone); ``cloud`` never imports ``simulations`` or ``tests``.
* No import cycle anywhere in ``agent``, ``cloud`` or ``simulations`` (imports inside functions
  count too, and so do imports for annotations under ``if TYPE_CHECKING:``: a cycle hidden
  there is still a cycle a reader must untangle).
* The engine's layers only import downwards: text -> program -> plan -> execution -> storage,
  with the update machinery and the facade on top (``ENGINE_LAYERS``).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("agent", "cloud", "simulations")

# Lowest first. A module may import modules of its own layer or of a lower one, never higher.
ENGINE_LAYERS: list[set[str]] = [
    {"errors", "gcpause", "costs"},
    {"language"},
    {"values", "terms"},
    {"validation"},
    {"parser", "rdf", "loaders", "rule_form"},
    {"dependency", "heads", "net_change"},
    {"store", "budget", "subject_facts"},
    {"planner", "decomposition"},
    {"rewrites"},
    {"compiler"},
    {"executor"},
    {"changes", "view"},
    {"sameas", "equality"},
    {"modules"},
    {"transitions", "estimates", "explain"},
    {"maintenance", "reclaim"},
    {"reasoner"},
    {"__init__"},
]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts)


def imports_of(path: Path, modules: set[str] | None = None) -> set[str]:
    """Every module ``path`` imports, relative imports resolved, as dotted names.
    ``from package import module`` depends on the module (the package is being imported
    already); ``from module import name`` on the module. Without ``modules`` (the project's),
    both readings are returned."""
    name = module_name(path)
    # The package relative imports start from: a.b.c -> a.b, and a.b.__init__ -> a.b too.
    package = name.split(".")[:-1]
    tree = ast.parse(path.read_text(), str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            submodules = {f"{target}.{alias.name}" for alias in node.names}
            if modules is not None and submodules & modules:
                found.update(submodules & modules)
            else:
                found.add(target)
                if modules is None:
                    found.update(submodules)
    return found


def project_modules() -> dict[str, Path]:
    modules = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            name = module_name(path)
            modules[name.removesuffix(".__init__")] = path
    return modules


def graph() -> dict[str, set[str]]:
    modules = project_modules()
    edges: dict[str, set[str]] = {}
    known = set(modules)
    for name, path in modules.items():
        edges[name] = {target for target in imports_of(path, known) if target in modules} - {name}
    return edges


@pytest.mark.parametrize(
    ("package", "forbidden"),
    [
        ("agent", ("cloud", "simulations", "tests", "pyspark")),
        ("cloud", ("simulations", "tests")),
    ],
)
def test_packages_import_only_what_they_may(package, forbidden):
    offenders = [
        f"{module_name(path)} imports {target}"
        for path in (ROOT / package).rglob("*.py")
        for target in imports_of(path)
        if target.split(".")[0] in forbidden
    ]
    assert not offenders, offenders


def test_no_import_cycles():
    edges = graph()
    cycles: list[list[str]] = []
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[str] = []

    def visit(name: str) -> None:
        state[name] = 1
        stack.append(name)
        for target in sorted(edges.get(name, ())):
            if state.get(target) == 1:
                cycles.append([*stack[stack.index(target) :], target])
            elif target not in state:
                visit(target)
        stack.pop()
        state[name] = 2

    for name in sorted(edges):
        if name not in state:
            visit(name)
    # A package's __init__ importing its own modules is how packages work, not a cycle.
    cycles = [c for c in cycles if not all(p.startswith(c[0]) or c[0].startswith(p) for p in c)]
    assert not cycles, "\n".join(" -> ".join(c) for c in cycles)


def engine_layer(name: str) -> int:
    short = name.removeprefix("agent.engine.").split(".")[0] or "__init__"
    if name == "agent.engine":
        short = "__init__"
    for rank, layer in enumerate(ENGINE_LAYERS):
        if short in layer:
            return rank
    raise AssertionError(f"{name} is in no engine layer: add it to ENGINE_LAYERS")


def test_engine_layers_import_downwards():
    edges = graph()
    upward = []
    for name, targets in sorted(edges.items()):
        if not name.startswith("agent.engine"):
            continue
        for target in sorted(targets):
            if not target.startswith("agent.engine"):
                continue
            same_package = (
                name.split(".")[:3]
                == target.split(".")[:3]
                == [
                    "agent",
                    "engine",
                    "modules",
                ]
            )
            if same_package:
                continue
            if engine_layer(target) > engine_layer(name):
                upward.append(f"{name} imports {target}")
    assert not upward, upward
