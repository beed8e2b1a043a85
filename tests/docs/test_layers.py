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

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("agent", "cloud", "simulations")

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


# The engine's layers, lowest first: its folders, with the files at its root split into the
# shared vocabulary (below everything) and the facade (above everything). A module may import
# modules of its own layer or of a lower one, never of a higher one.
ENGINE_VOCABULARY = {"errors", "gcpause", "costs", "language", "terms", "values", "budget"}
ENGINE_FACADE = {"reasoner", "explain", "cli", "console", "__init__"}
ENGINE_LAYERS = ["program", "storage", "plan", "equality", "modules", "update"]
# What may sit at a package's root: the rest goes in a folder of its layer.
MOST_AT_ROOT = {"agent/engine": 12, "agent": 6}


def engine_layer(name: str) -> tuple[int, str]:
    """(rank, layer name) of an engine module: 0 the vocabulary, then the folders in
    ENGINE_LAYERS' order, then the facade."""
    short = name.removeprefix("agent.engine").removeprefix(".").split(".")[0] or "__init__"
    if short in ENGINE_VOCABULARY:
        return 0, "vocabulary"
    if short in ENGINE_LAYERS:
        return 1 + ENGINE_LAYERS.index(short), short
    if short in ENGINE_FACADE:
        return 1 + len(ENGINE_LAYERS), "facade"
    raise AssertionError(
        f"{name} is in no engine layer: put it in the folder of its layer, or name it in "
        "ENGINE_VOCABULARY or ENGINE_FACADE (tests/test_layers.py)"
    )


def test_engine_layers_import_downwards():
    edges = graph()
    upward = []
    for name, targets in sorted(edges.items()):
        if not name.startswith("agent.engine"):
            continue
        for target in sorted(targets):
            if target.startswith("agent.engine") and engine_layer(target) > engine_layer(name):
                upward.append(
                    f"{name} ({engine_layer(name)[1]}) imports {target} "
                    f"({engine_layer(target)[1]})"
                )
    assert not upward, upward


def test_every_engine_module_is_in_a_layer():
    for name in project_modules():
        if name.startswith("agent.engine"):
            engine_layer(name)


@pytest.mark.parametrize(("package", "most"), sorted(MOST_AT_ROOT.items()))
def test_package_roots_stay_small(package, most):
    files = sorted(p.name for p in (ROOT / package).glob("*.py"))
    assert len(files) <= most, f"{package} has {len(files)} files at its root: {files}"


def test_the_agent_state_and_protocol_know_nothing_of_the_service():
    """``agent/state`` (the SQLite file) and ``agent/protocol`` (messages, keys, signing) are
    libraries the service uses; neither imports the service, the MQTT side, the command lines,
    or the other."""
    above = ("agent.service", "agent.sync", "agent.cli", "agent.engine.cli")
    offenders = [
        f"{name} imports {target}"
        for name, targets in graph().items()
        if name.startswith(("agent.state", "agent.protocol"))
        for target in targets
        if target.startswith(above)
        or (name.startswith("agent.state") and target.startswith("agent.protocol"))
        or (name.startswith("agent.protocol") and target.startswith("agent.state"))
    ]
    assert not offenders, offenders
