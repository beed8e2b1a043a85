"""Hypertree decompositions: acyclicity, the decomposition search, and the paper's running
example (the PossibleCollaborator rule over the data of its Figures 1-2) through the hypertree
module, with every node's instantiations checked against their definition after each update.

Random cyclic rules in random programs and updates run in the differential machines
(``test_incremental_differential.py``: the cyclic motifs of ``tests/support/strategies.py``).
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.engine import Reasoner
from agent.engine.costs import CostPolicy
from agent.engine.language import Atom, Rule, Variable
from agent.engine.modules import HypertreeModule
from agent.engine.modules.support.eliminated import EliminatedRule
from agent.engine.plan.decomposition import (
    AtomStats,
    decompose,
    is_acyclic,
    is_cyclic_rule,
    positive_atoms,
    seminaive_cost,
)
from agent.engine.program.parser import parse_program

# Decomposed into a tree of nodes even where set-at-a-time elimination applies.
TREES = CostPolicy(decompositions_set_at_a_time=False)
PC_RULE = "<PC>(X, Y) :- <CW>(X, Z1) and <CA>(X, Z2) and <PC>(Z1, Y) and <PC>(Z2, Y) ."


def rule_of(text: str) -> Rule:
    (rule,) = parse_program(text).rules
    return rule


def uniform_stats(rule: Rule, size: int = 1000, distinct: int = 300) -> dict[int, AtomStats]:
    return {p: AtomStats(size, (distinct,) * a.arity) for p, a in positive_atoms(rule).items()}


# ------------------------------------------------------------------ acyclicity
@pytest.mark.parametrize(
    "text, cyclic",
    [
        ("h(X, Z) :- a(X, Y), b(Y, Z) .", False),  # a path
        ("h(X) :- a(X, Y), b(X, Z), c(X, W) .", False),  # a star
        ("h(X) :- a(X, Y), b(Y, Z), c(Z, X) .", True),  # a triangle
        ("h(X) :- a(X, Y), b(Y, Z), c(Z, X), t(X, Y, Z) .", False),  # covered by one atom
        ("h(X) :- a(X, Y), b(Y, Z), c(Z, W), d(W, X) .", True),  # a 4-cycle
        (PC_RULE, True),
        ("h(X) :- a(X, Y), a(Y, X) .", False),  # two atoms over the same two variables
    ],
)
def test_gyo_tells_cyclic_bodies(text: str, cyclic: bool) -> None:
    assert is_cyclic_rule(rule_of(text)) is cyclic


def test_gyo_on_hyperedges() -> None:
    x, y, z = (Variable(n) for n in "XYZ")
    assert is_acyclic([frozenset({x, y}), frozenset({y, z})])
    assert not is_acyclic([frozenset({x, y}), frozenset({y, z}), frozenset({z, x})])
    assert is_acyclic([])


# ------------------------------------------------------------------ the search
def test_the_papers_decomposition_of_possible_collaborator() -> None:
    """Section 3: two nodes {x, z1, y} joining CW and PC, {x, z2, y} joining CA and PC."""
    rule = rule_of(PC_RULE)
    decomposition = decompose(rule, uniform_stats(rule))
    assert decomposition is not None and decomposition.width == 2
    nodes = {
        (
            frozenset(v.name for v in node.variables),
            frozenset(rule.body[p].predicate for p in node.cover),
        )
        for node in decomposition.nodes
    }
    assert nodes == {
        (frozenset({"X", "Z1", "Y"}), frozenset({"CW", "PC"})),
        (frozenset({"X", "Z2", "Y"}), frozenset({"CA", "PC"})),
    }


def test_acyclic_rules_and_single_node_bodies_get_no_decomposition() -> None:
    path = rule_of("h(X, Z) :- a(X, Y), b(Y, Z) .")
    assert decompose(path, uniform_stats(path)) is None
    clique = rule_of("h(A) :- e(A, B), e(A, C), e(A, D), e(B, C), e(B, D), e(C, D) .")
    assert decompose(clique, uniform_stats(clique)) is None  # every bag would hold all four


ATOM_VARIABLES = [Variable(n) for n in "ABCDEF"]


@st.composite
def cyclic_rules(draw: st.DrawFn) -> Rule:
    """A rule whose body is 3-8 random binary atoms over up to six variables, cyclic."""
    atoms = []
    for _ in range(draw(st.integers(3, 8))):
        left, right = draw(
            st.lists(st.sampled_from(ATOM_VARIABLES), min_size=2, max_size=2, unique=True)
        )
        atoms.append(Atom(f"e{draw(st.integers(0, 2))}", (left, right)))
    head = Atom("h", (atoms[0].terms[0],))
    rule = Rule(head, tuple(atoms))
    if not is_cyclic_rule(rule):
        from hypothesis import assume

        assume(False)
    return rule


@settings(max_examples=150, deadline=None)
@given(cyclic_rules(), st.integers(1, 5000), st.integers(1, 500))
def test_decompositions_are_valid_trees(rule: Rule, size: int, distinct: int) -> None:
    """Conditions 1-3 of the definition: every atom lies in a bag, the nodes holding a
    variable are connected, a bag's variables are its cover's; and the tree is well formed."""
    decomposition = decompose(rule, uniform_stats(rule, size, min(size, distinct)))
    if decomposition is None:  # every decomposition found was a single node
        return
    nodes = decomposition.nodes
    assert len(nodes) >= 2 and nodes[0].parent is None
    assert all(node.parent is not None and node.parent < i for i, node in enumerate(nodes) if i)
    for atom in positive_atoms(rule).values():
        assert any(atom.variables() <= set(node.variables) for node in nodes), atom
    for node in nodes:
        covered = set().union(*(rule.body[p].variables() for p in node.cover))
        assert set(node.variables) <= covered
    for variable in {v for node in nodes for v in node.variables}:
        holding = {i for i, node in enumerate(nodes) if variable in node.variables}
        roots = [i for i in holding if nodes[i].parent not in holding]
        assert len(roots) == 1, f"{variable} is in disconnected nodes {sorted(holding)}"
    assert decompose(rule, uniform_stats(rule, size, min(size, distinct))) == decomposition


def test_decomposition_search_is_fast() -> None:
    """The paper's bound: under 50 ms per rule (a ten-atom, eight-variable cyclic rule)."""
    import time

    rule = rule_of(
        "h(A, E) :- e(A, B), f(B, C), g(C, D), e(D, E), f(E, F), g(F, G), e(G, H), f(H, A), "
        "g(A, E), e(C, G) ."
    )
    stats = uniform_stats(rule)
    started = time.perf_counter()
    decompose(rule, stats)
    assert time.perf_counter() - started < 0.5  # generous: a shared machine; typically ~20 ms


@pytest.mark.process
def test_choices_do_not_depend_on_the_hash_seed(tmp_path) -> None:
    """Decompositions and join plans are the same in processes with different hash seeds."""
    script = tmp_path / "plans.py"
    script.write_text(
        "from agent.engine import Reasoner\n"
        "r = Reasoner(decompositions='always')\n"
        "r.add_facts([(p, f'n{i}', f'n{(i * m) % 17}') for i in range(40)"
        " for p, m in (('e0', 3), ('e1', 5), ('e2', 7))])\n"
        "r.add_rules('c(A, D) :- e0(A, B), e1(B, C), e2(C, D), e0(D, E), e1(E, F), e2(F, A) .\\n"
        "k(A) :- e0(A, B), e0(A, C), e1(B, C), e2(C, D), e1(D, A) .')\n"
        "for node in r.stats()['hyper_nodes']:\n"
        "    print(node['module'], node.get('rules_evaluated'))\n"
        "for key, entry in sorted(r.executor._cache.items(), key=lambda kv: repr(kv[0])):\n"
        "    print(entry.describe())\n"
    )
    outputs = set()
    for seed in ("0", "1", "12345"):
        env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": os.getcwd()}
        result = subprocess.run(
            [sys.executable, str(script)], capture_output=True, text=True, env=env, check=True
        )
        outputs.add(_without_timings(result.stdout))
    assert len(outputs) == 1


def _without_timings(text: str) -> str:
    import re

    return re.sub(r"'(decomposition_)?seconds': [0-9.e-]+", "", text)


# ------------------------------------------------------------------ the paper's example
N, K = 6, 3  # a_0 .. a_{N-1} with K coworkers and K coauthors each, and a_N


def collaborator_facts() -> list[tuple]:
    facts = []
    for i in range(N):
        for j in range(1, K + 1):
            facts += [
                ("CW", f"a{i}", f"b{i * K + j}"),
                ("CA", f"a{i}", f"c{i * K + j}"),
                ("PC", f"b{i * K + j}", f"d{j}"),
                ("PC", f"c{i * K + j}", f"d{j}"),
            ]
    return facts + [("CW", f"a{N}", "a2"), ("CA", f"a{N}", "a3")]


def decomposed_rule(reasoner: Reasoner):
    (node,) = reasoner.nodes
    assert isinstance(node.module, HypertreeModule)
    (decomposed,) = node.module.decomposed()
    return decomposed


def instances_by_definition(reasoner: Reasoner, decomposed, index: int) -> set[tuple]:
    """inst_p: the join of the node's atoms over the current facts, projected onto its bag."""
    facts = {(p, s, o) for p, s, o in reasoner.facts()}
    rule = decomposed.node_rules[index]
    found = set()
    atoms = [item for item in rule.body if isinstance(item, Atom)]
    terms = reasoner.terms
    for combination in itertools.product(
        *[[f for f in facts if f[0] == a.predicate] for a in atoms]
    ):
        binding: dict = {}
        if all(_bind(binding, atom, fact) for atom, fact in zip(atoms, combination, strict=True)):
            found.add(tuple(terms.encode(binding[v]) for v in rule.head.terms))
    return found


def _bind(binding: dict, atom: Atom, fact: tuple) -> bool:
    for term, value in zip(atom.terms, fact[1:], strict=True):
        if binding.setdefault(term, value) != value:
            return False
    return True


def assert_instances_are_exact(reasoner: Reasoner) -> None:
    decomposed = decomposed_rule(reasoner)
    if isinstance(decomposed, EliminatedRule):
        return  # (it keeps no instantiations: the relations are its state)
    for index, inst in enumerate(decomposed.instances):
        assert inst.rows == instances_by_definition(reasoner, decomposed, index), f"node {index}"
        assert not decomposed.rederive_later[index]


def collaborators(reasoner: Reasoner, who: str) -> set[str]:
    return {o for _, s, o in reasoner.facts("PC") if s == who}


@pytest.mark.parametrize("costs", [TREES, CostPolicy()], ids=["tree", "set-at-a-time"])
def test_possible_collaborators_materialised_and_maintained(costs: CostPolicy) -> None:
    reasoner = Reasoner(decompositions="always", costs=costs)
    reasoner.add_facts(collaborator_facts())
    reasoner.add_rules(PC_RULE)
    everyone = {f"d{j}" for j in range(1, K + 1)}
    # Example 1: PC(a_i, d_j) in the first round, PC(a_n, d_j) in the second.
    assert all(collaborators(reasoner, f"a{i}") == everyone for i in range(N + 1))
    assert_instances_are_exact(reasoner)

    # Adding CW(a_n, a_4) and CA(a_n, a_5) derives nothing new.
    before = set(reasoner.facts())
    reasoner.add_facts([("CW", f"a{N}", "a4"), ("CA", f"a{N}", "a5")])
    assert set(reasoner.facts()) - before == {("CW", f"a{N}", "a4"), ("CA", f"a{N}", "a5")}
    assert_instances_are_exact(reasoner)

    # Examples 2-3: deleting CA(a_n, a_3) overdeletes PC(a_n, d_j), which a_2 and a_5 rederive.
    reasoner.delete_facts([("CA", f"a{N}", "a3")])
    assert collaborators(reasoner, f"a{N}") == everyone
    assert reasoner.stats()["last_update"]["hyper_nodes"]["hn1"]["strategy"] == "DRed (hypertree)"
    assert_instances_are_exact(reasoner)

    # Without a coauthor a_n has no collaborator left.
    reasoner.delete_facts([("CA", f"a{N}", "a5")])
    assert collaborators(reasoner, f"a{N}") == set()
    assert_instances_are_exact(reasoner)
    reasoner.add_facts([("CA", f"a{N}", "a1")])
    assert collaborators(reasoner, f"a{N}") == everyone
    assert_instances_are_exact(reasoner)


def test_stats_and_the_switch() -> None:
    reasoner = Reasoner(decompositions="always", costs=TREES)
    reasoner.add_facts(collaborator_facts())
    reasoner.add_rules(PC_RULE)
    (node,) = reasoner.stats()["hyper_nodes"]
    assert node["module"].startswith("hypertree") and node["decomposed_rules"] == 1
    (choice,) = node["rules_evaluated"].values()
    assert choice["evaluation"] == "decomposition" and choice["cyclic"]
    assert choice["decomposition_seconds"] >= 0 and "p1:" in choice["decomposition"]
    assert not choice["set_at_a_time"]
    eliminated = Reasoner(decompositions="always")
    eliminated.add_facts(collaborator_facts())
    eliminated.add_rules(PC_RULE)
    (choice,) = eliminated.stats()["hyper_nodes"][0]["rules_evaluated"].values()
    assert choice["set_at_a_time"] and "eliminated" in choice["decomposition"]
    assert set(eliminated.facts()) == set(reasoner.facts())

    plain = Reasoner(decompositions=False)
    plain.add_facts(collaborator_facts())
    plain.add_rules(PC_RULE)
    assert plain.stats()["hyper_nodes"][0]["module"] == "seminaive"
    assert set(plain.facts()) == set(reasoner.facts())
    with pytest.raises(ValueError, match="decompositions"):
        Reasoner(decompositions="sometimes")


def test_a_decomposed_rule_added_replaced_and_deleted() -> None:
    reasoner = Reasoner(decompositions="always")
    reasoner.add_facts(collaborator_facts())
    reasoner.add_rules("base: <PC>(X, Y) :- <friend>(X, Y) .")
    reasoner.add_rules("pc: " + PC_RULE)
    assert collaborators(reasoner, "a0") == {f"d{j}" for j in range(1, K + 1)}
    # Replaced under its label in one update: a body that needs a coworker only.
    reasoner.update(
        delete_rules=["pc"],
        add_rules="pc: <PC>(X, Y) :- <CW>(X, Z1) and <PC>(Z1, Y) and <CW>(X, Z2) and <PC>(Z2, Y) .",
    )
    assert collaborators(reasoner, f"a{N}") == {f"d{j}" for j in range(1, K + 1)}
    reasoner.delete_rules(["pc"])
    assert collaborators(reasoner, "a0") == set()
    assert reasoner.stats()["hyper_nodes"][0]["module"] != "hypertree"


def test_restart_from_sqlite_then_update(tmp_path) -> None:
    from agent.state.agent_state import AgentState

    state = AgentState(tmp_path / "agent.db", decompositions="always")
    state.apply(add_facts=collaborator_facts(), add_rules=PC_RULE)
    state.close()
    state = AgentState(tmp_path / "agent.db", decompositions="always")
    assert state.load_report.how == "loaded"
    state.apply(delete_facts=[("CA", f"a{N}", "a3"), ("CA", f"a{N}", "a5")])
    assert collaborators(state.reasoner, f"a{N}") == set()
    state.apply(add_facts=[("CA", f"a{N}", "a3")])
    assert collaborators(state.reasoner, f"a{N}") == {f"d{j}" for j in range(1, K + 1)}
    assert_instances_are_exact(state.reasoner)
    state.close()


def test_auto_prefers_the_cheaper_estimate() -> None:
    """Without data skew the PossibleCollaborator rule's join plan is estimated cheaper than
    its decomposition: ``auto`` keeps the plan; the estimates are what stats() shows."""
    rule = rule_of(PC_RULE)
    stats = uniform_stats(rule)
    decomposition = decompose(rule, stats)
    assert decomposition is not None
    assert seminaive_cost(rule, stats) < decomposition.cost
