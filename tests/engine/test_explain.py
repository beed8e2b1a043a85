"""``Reasoner.explain``: every tree is a real, well-founded proof, and the shortest one.

A tree is checked node by node against the program: an explicit leaf is an explicit fact; a
derived node is an instance of the rule it names, whose positive atoms are exactly its
premises (in body order), whose comparisons and binds hold and produce the fact, and whose
negated atoms match nothing in the model; no fact is its own ancestor. Random programs
(generic, motif and closure pools, the shapes every module handles) are explained fact by
fact, after insertions and again after deletions. Heights are checked on chains where the
shortest proof is known.
"""

from __future__ import annotations

import math
from collections import defaultdict

import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

from agent.engine import Derivation, Reasoner
from agent.engine.language import RDF_TYPE, Atom, Literal, Program, Rule, atom_fact
from agent.engine.program.parser import parse_atom
from simulations.bench.explain import ROADS, ROADS_LINEAR, road_chain
from tests.support.reference import finish, from_external, ground, match, same, to_external
from tests.support.strategies import (
    closure_pools,
    incremental_programs,
    pool_facts,
    program_and_facts,
)

SETTINGS = settings(
    deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)


def rules_by_id(reasoner: Reasoner) -> dict[str, Rule]:
    return {rule.id: rule for rule in reasoner.rules.values()}


def check_proof(reasoner: Reasoner, tree: Derivation) -> None:
    """Fail unless ``tree`` is a well-founded proof of its fact (module docstring)."""
    model: dict[tuple[str, int], list[tuple]] = defaultdict(list)
    for fact in reasoner.facts():
        logical = from_external(fact)
        model[(logical[0], len(logical) - 1)].append(logical)
    explicit = {from_external(fact) for fact in reasoner.edb_facts()}
    rules = rules_by_id(reasoner)
    on_path: set[int] = set()
    checked: set[int] = set()
    stack: list[tuple[Derivation, bool]] = [(tree, False)]
    while stack:
        node, leaving = stack.pop()
        if leaving:
            on_path.discard(id(node))
            checked.add(id(node))
            continue
        assert id(node) not in on_path, f"{node.fact} is its own premise"
        if id(node) in checked:
            continue
        fact = from_external(node.fact)
        if node.explicit:
            assert fact in explicit, f"{node.fact} is shown as explicit but is not"
            continue
        check_instance(rules[node.rule], fact, node, model)
        on_path.add(id(node))
        stack.append((node, True))
        stack.extend((premise, False) for premise in node.premises)


def check_instance(rule: Rule, fact: tuple, node: Derivation, model) -> None:
    if rule.aggregate() is not None:
        assert not node.premises and match(rule.head, fact, {}) is not None
        return
    atoms = [item for item in rule.body if isinstance(item, Atom)]
    assert len(node.premises) == len(atoms), f"{node.fact}: premises do not fit rule {rule}"
    s: dict | None = {}
    for atom, premise in zip(atoms, node.premises, strict=True):
        s = match(atom, from_external(premise.fact), s)
        assert s is not None, f"{node.fact}: premise {premise.fact} does not match {atom}"
    rest = [(i, item) for i, item in enumerate(rule.body) if not isinstance(item, Atom)]
    s = finish(rest, s, model, set(), "explain")
    assert s is not None, f"{node.fact}: the rest of rule {rule} fails"
    heads = [ground(head, s) for head in rule.heads]  # a multi-head rule: one of its heads
    assert any(
        len(head) == len(fact) and all(same(a, b) for a, b in zip(head, fact, strict=True))
        for head in heads
    ), f"{heads} do not give {fact}"


def explain_all(reasoner: Reasoner, most: int = 40) -> None:
    for fact in sorted(reasoner.facts(), key=repr)[:most]:
        check_proof(reasoner, reasoner.explain(fact))


@SETTINGS
@given(program_and_facts())
def test_every_fact_of_a_random_program_has_a_checked_proof(case):
    program, facts = case
    reasoner = Reasoner()
    reasoner.add_rules(program)
    reasoner.add_facts([to_external(fact) for fact in facts])
    note(f"program:\n{program}")
    explain_all(reasoner)


@SETTINGS
@given(st.one_of(incremental_programs(), closure_pools()), st.data())
def test_proofs_stay_right_after_insertions_and_deletions(pool: Program, data):
    facts = data.draw(st.lists(pool_facts(pool), min_size=3, max_size=14), label="facts")
    reasoner = Reasoner()
    reasoner.add_rules(pool)
    reasoner.add_facts([to_external(fact) for fact in facts])
    note(f"program:\n{pool}")
    explain_all(reasoner)
    gone = data.draw(st.lists(st.sampled_from(facts), max_size=len(facts)), label="deleted")
    reasoner.delete_facts([to_external(fact) for fact in gone])
    explain_all(reasoner)


@pytest.mark.parametrize("n", [1, 2, 7, 50, 300])
def test_a_closure_fact_is_proved_along_a_shortest_path_split_in_halves(n: int):
    reasoner = Reasoner()
    reasoner.add_rules(ROADS)
    reasoner.add_facts(road_chain(n))
    # city_n back to city0: n edges read backwards (c2), joined by c3 in ceil(log2 n) levels
    tree = reasoner.explain(("connected", f"city{n}", "city0"))
    check_proof(reasoner, tree)
    assert tree.height == 2 + math.ceil(math.log2(n))
    assert tree.size == 3 * n - 1 + n  # n roads, n forward and n backward edges, n-1 joins
    # a city is connected to itself through a neighbour: there and back again
    loop = reasoner.explain(("connected", "city0", "city0"))
    check_proof(reasoner, loop)
    assert loop.height == 3 and [p.fact for p in loop.premises] == [
        ("connected", "city0", "city1"),
        ("connected", "city1", "city0"),
    ]


def test_a_linear_recursion_is_proved_with_the_fewest_levels():
    reasoner = Reasoner()
    reasoner.add_rules(ROADS_LINEAR)
    reasoner.add_facts(road_chain(400))
    tree = reasoner.explain(("reach", "city0", "city400"))
    check_proof(reasoner, tree)
    assert tree.height == 400
    # a shortcut makes the shortest proof short
    reasoner.add_facts([("road", "city0", "city390")])
    tree = reasoner.explain(("reach", "city0", "city400"))
    check_proof(reasoner, tree)
    assert tree.height == 11


def test_printing_shows_a_repeated_fact_once_and_bounds_the_depth():
    reasoner = Reasoner()
    reasoner.add_rules(
        "pair(X) :- <edge>(X, Y) and <edge>(X, Z) .\n<edge>(X, Y) :- <road>(X, Y) .\n"
    )
    reasoner.add_facts([("road", "a", "b")])
    tree = reasoner.explain(("http://www.w3.org/1999/02/22-rdf-syntax-ns#type", "a", "pair"))
    check_proof(reasoner, tree)
    text = str(tree)
    assert text.count("<edge>(<a>, <b>)") == 2 and text.count("<road>(<a>, <b>)") == 1
    assert "shown above" in text
    shallow = tree.lines(max_depth=1)
    assert any("1 more fact(s) below, not shown" in line for line in shallow)
    assert all("road" not in line for line in shallow)


def test_explaining_a_closure_fact_of_a_large_relation_is_immediate():
    """Not a timing test: the budget of rule-body steps is what fails if the search is
    exponential (it was, for a transitive relation over a 50-road chain)."""
    reasoner = Reasoner()
    reasoner.add_rules(ROADS)
    reasoner.add_facts(road_chain(2000))
    tree = reasoner.explain(("connected", "city17", "city1990"))
    assert tree.height == 1 + math.ceil(math.log2(1973))  # forward: c1, then joins


def test_a_rule_replaced_under_its_label_explains_with_the_new_body():
    """Bundles replace a rule by deleting its label and adding a new body under it in one
    update: the proof must use the new body, named by the label."""
    reasoner = Reasoner()
    reasoner.add_rules(ROADS_LINEAR)
    reasoner.add_facts(road_chain(6))
    reasoner.update(
        delete_rules=["c2"],
        add_rules="c2: <reach>(X, Z) :- <road>(X, Y) and <reach>(Y, Z) .",
    )
    tree = reasoner.explain(("reach", "city0", "city6"))
    check_proof(reasoner, tree)
    assert tree.rule == "c2" and tree.height == 6
    assert [p.fact[0] for p in tree.premises] == ["road", "reach"]  # the new body's order


def test_a_state_restored_from_sqlite_explains_like_the_one_saved(tmp_path):
    """The agent's state comes back from its SQLite file without recomputing (closure modules
    adopt the saved facts): its proofs are as short as before the restart."""
    from agent.state.agent_state import AgentState

    path = tmp_path / "agent.db"
    with AgentState(path) as state:
        state.apply(add_rules=ROADS, add_facts=road_chain(40))
        before = state.reasoner.explain(("connected", "city40", "city0"))
    with AgentState(path) as state:
        assert state.load_report.how == "loaded"
        after = state.reasoner.explain(("connected", "city40", "city0"))
        check_proof(state.reasoner, after)
    assert (after.height, after.size) == (before.height, before.size) == (8, 159)


def test_each_line_of_a_tree_is_a_fact_in_rule_syntax():
    """A printed tree's facts read back as the facts they are (class facts, numbers, literals,
    negated atoms with their values), so that a reader can explain any of them in turn."""
    reasoner = Reasoner()
    reasoner.add_rules(
        "near(X, Y) :- edge(X, Y) . near(X, Z) :- near(X, Y), edge(Y, Z) .\n"
        "top(X, M) :- aggregate(near(X, Y) and temp(Y, T)) on X with max(T) as M .\n"
        'hot(X) :- top(X, M), M > 20, not edge(X, X), label(X, L), L != "cold"@en .\n'
    )
    reasoner.add_facts(
        [("edge", "a", "b"), ("edge", "b", "c"), ("temp", "c", 30.5), ("temp", "b", 7)]
        + [("label", "a", Literal("warm", language="en"))]
    )
    tree = reasoner.explain((RDF_TYPE, "a", "hot"))
    lines = tree.lines()
    assert lines[0].startswith("<hot>(<a>)   [by rule")
    assert any(line.strip().startswith("not <edge>(<a>, <a>)") for line in lines)
    for line in lines:
        text = line.strip().split("   [")[0].removeprefix("not ")
        fact = atom_fact(parse_atom(text))
        holds = "[absent]" not in line
        assert (fact in set(reasoner.facts())) == holds, line
        if holds:
            assert reasoner.explain(fact).fact == fact


def test_a_chain_longer_than_the_recursion_limit_is_explained():
    """A chain no closure module shortens (each step also asks ``open``) has a proof as high as
    the chain: 2,000 levels, twice Python's recursion limit, used to raise RecursionError."""
    reasoner = Reasoner()
    reasoner.add_rules(
        """
        road: <conn>(X, Y) :- <road>(X, Y) .
        via:  <conn>(X, Z) :- <road>(X, Y) and <conn>(Y, Z) and <open>(Y) .
        """
    )
    length = 2000
    reasoner.add_facts([("road", f"c{i}", f"c{i + 1}") for i in range(length)])
    reasoner.add_facts([("open", f"c{i}") for i in range(length)])
    tree = reasoner.explain(("conn", "c0", f"c{length}"))
    assert tree.height == length
    lines = tree.lines()
    assert lines[0].startswith("<conn>(<c0>, <c2000>)") and "[by rule via]" in lines[0]
    assert sum("[explicit]" in line for line in lines) == 2 * length - 1
