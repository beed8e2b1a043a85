"""The rule dependency graph, hyper-nodes and HRDG (ZodiacEdge sections 2.1, 4.2, Alg. 1, 4).

The paper's running example (Fig. 1) is only an image; ``FIG1`` rebuilds a program with
exactly the structure its text states: four hyper-nodes hn1..hn4 with
HEp = {(hn1, hn2), (hn2, hn4), (hn3, hn4)} and HEn = {(hn2, hn3)} (Fig. 3(a)), where adding
r8 ``p2(X, Z) :- p3(X, Y) and p2(Y, Z)`` merges into hn2 (Fig. 3(b)), deleting r4 splits hn2
(Fig. 3(c)), and deleting r5, r6, r7 removes exactly hn3 and hn4.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.engine import Reasoner, RuleError, StratificationError
from agent.engine.language import Atom, Negation, Rule, Variable
from agent.engine.program.dependency import (
    HyperGraph,
    _sinks_only,
    build_hyper_graph,
    changed_hyper_graph,
    execution_plan,
    rule_edges,
    strongly_connected_components,
)
from agent.engine.program.heads import single_headed
from agent.engine.program.parser import parse_file, parse_program
from tests.support.strategies import programs

FIG1 = """
r1: p1(X, Y) :- e(X, Y) .
r2: p2(X, Y) :- p1(X, Y) and <p4>(Y) .
r3: p3(X, Y) :- p2(X, Y) .
r4: <p4>(Y) :- p3(X, Y) .
r5: <p5>(X) :- e(X, Y) and not p3(X, Y) .
r6: p6(X, Y) :- p2(X, Y) and p7(X, Y) .
r7: p7(X, Y) :- p6(Y, X) and <p5>(X) .
"""
R8 = "r8: p2(X, Z) :- p3(X, Y) and p2(Y, Z) ."


def rules_of(text: str):
    return list(parse_program(text).rules)


def structure(graph):
    """Hyper-nodes as sets of rule ids, and hyper-edges as pairs of such sets."""
    names = [frozenset(r.id for r in node.rules) for node in graph.nodes]
    return (
        set(names),
        {(names[a], names[b]) for a, b in graph.positive},
        {(names[a], names[b]) for a, b in graph.negative},
    )


def hn(*ids: str) -> frozenset[str]:
    return frozenset(ids)


def test_fig3a_hyper_nodes_and_dependencies():
    nodes, positive, negative = structure(build_hyper_graph(rules_of(FIG1)))
    hn1, hn2, hn3, hn4 = hn("r1"), hn("r2", "r3", "r4"), hn("r5"), hn("r6", "r7")
    assert nodes == {hn1, hn2, hn3, hn4}
    assert positive == {(hn1, hn2), (hn2, hn4), (hn3, hn4)}
    assert negative == {(hn2, hn3)}


def test_topological_order_respects_every_hyper_edge():
    graph = build_hyper_graph(rules_of(FIG1))
    for a, b in graph.positive | graph.negative:
        assert a < b


def test_fig3b_inserting_r8_merges_into_hn2():
    nodes, positive, negative = structure(build_hyper_graph(rules_of(FIG1 + R8)))
    merged = hn("r2", "r3", "r4", "r8")
    assert nodes == {hn("r1"), merged, hn("r5"), hn("r6", "r7")}
    assert (hn("r1"), merged) in positive and (merged, hn("r6", "r7")) in positive
    assert negative == {(merged, hn("r5"))}


def test_fig3c_deleting_r4_splits_hn2():
    rules = [r for r in rules_of(FIG1) if r.id != "r4"]
    nodes, positive, negative = structure(build_hyper_graph(rules))
    # hn2 = {r2, r3, r4} was one component only through r4; without it r2 and r3 stand alone.
    # (The paper's text names three split nodes; with hn2 = {r2, r3, r4} two remain.)
    assert nodes == {hn("r1"), hn("r2"), hn("r3"), hn("r5"), hn("r6", "r7")}
    assert (hn("r2"), hn("r3")) in positive
    assert negative == {(hn("r3"), hn("r5"))}


def test_deleting_r5_r6_r7_leaves_hn1_hn2_untouched():
    rules = [r for r in rules_of(FIG1) if r.id not in {"r5", "r6", "r7"}]
    nodes, _, _ = structure(build_hyper_graph(rules))
    assert nodes == {hn("r1"), hn("r2", "r3", "r4")}


def test_execution_plan_reaches_successors_in_topological_order():
    graph = build_hyper_graph(rules_of(FIG1))
    index = {frozenset(r.id for r in n.rules): i for i, n in enumerate(graph.nodes)}
    plan = execution_plan(graph, [index[hn("r2", "r3", "r4")]])
    names = [frozenset(r.id for r in graph.nodes[i].rules) for i in plan]
    assert set(names) == {hn("r2", "r3", "r4"), hn("r5"), hn("r6", "r7")}
    assert names.index(hn("r5")) < names.index(hn("r6", "r7"))
    assert names[0] == hn("r2", "r3", "r4")


def test_fig4_views_are_bags_of_pointers_not_copies():
    reasoner = Reasoner()
    reasoner.add_rules(FIG1)
    by_rules = {frozenset(r.id for r in n.rules): n for n in reasoner.nodes}
    hn2, hn3, hn4 = by_rules[hn("r2", "r3", "r4")], by_rules[hn("r5")], by_rules[hn("r6", "r7")]
    stores = hn4.bag.stores
    assert any(s is reasoner.edb for s in stores)
    assert any(s is hn2.idb for s in stores) and any(s is hn3.idb for s in stores)
    assert any(s is hn4.idb for s in stores)
    assert not any(s is by_rules[hn("r1")].idb for s in stores)


def test_rs2_has_fourteen_hyper_nodes_as_in_the_paper():
    graph = build_hyper_graph(rules_of(Path("rules/benchmarks/rs2.rules").read_text()))
    nodes, _, _ = structure(graph)
    assert len(nodes) == 14
    assert {hn("r2", "r3"), hn("r5"), hn("r7", "r8"), hn("r12", "r13", "r14")} <= nodes


def test_negation_through_recursion_is_refused_naming_the_cycle():
    text = "a: p(X) :- e(X) and not q(X) .\nb: q(X) :- p(X) ."
    with pytest.raises(StratificationError) as error:
        build_hyper_graph(rules_of(text))
    assert error.value.cycle[0] == error.value.cycle[-1]
    assert {"a", "b"} <= set(error.value.cycle)
    assert "not stratifiable" in str(error.value) and "negation" in str(error.value)


def test_aggregation_through_recursion_is_refused():
    text = "s: <sum>(X, S) :- aggregate( <sub>(X, Y) and <sum>(Y, V) ) on X with sum(V) as S ."
    with pytest.raises(StratificationError, match="aggregate"):
        build_hyper_graph(rules_of(text))


def test_refused_rule_leaves_the_reasoner_unchanged():
    reasoner = Reasoner()
    reasoner.add_rules("p(X) :- e(X) and not q(X) .")
    reasoner.add_facts([("http://www.w3.org/1999/02/22-rdf-syntax-ns#type", "a", "e")])
    before = (set(reasoner.facts()), list(reasoner.rules), [n.name for n in reasoner.nodes])
    with pytest.raises(StratificationError):
        reasoner.add_rules("q(X) :- p(X) .")
    after = (set(reasoner.facts()), list(reasoner.rules), [n.name for n in reasoner.nodes])
    assert before == after


def test_tarjan_handles_long_chains_without_recursion_limit():
    n = 20_000
    components = strongly_connected_components(range(n), lambda v: [v + 1] if v + 1 < n else [0])
    assert len(components) == 1 and len(components[0]) == n


# --- a changed graph: sinks added or removed in place, anything else built afresh


def shape(graph):
    """Everything a graph says: each node's rules, order, recursion, heads and reads in
    topological order, and the edges."""
    nodes = [
        (node.rule_keys, node.order, node.recursive, node.heads, node.reads) for node in graph.nodes
    ]
    return nodes, graph.positive, graph.negative


@st.composite
def programs_with_leaves(draw):
    """A random program followed by a few leaf rules (fresh heads, reading the program's
    relations, some under negation), in a random order."""
    rules = list(draw(programs()).rules)
    relations = sorted(
        {r.head.relation for r in rules} | {k for r in rules for k, _ in r.body_relations()}
    )
    for number in range(draw(st.integers(0, 3))):
        (name, arity), (other, other_arity) = draw(
            st.lists(st.sampled_from(relations), min_size=2, max_size=2)
        )
        terms = tuple(Variable(f"X{i}") for i in range(arity))
        body = [Atom(name, terms)]
        if other_arity <= arity and draw(st.booleans()):
            body.append(Negation(Atom(other, terms[:other_arity])))
        rules.append(Rule(Atom(f"leaf{number}", terms[:1]), tuple(body)))
    return draw(st.permutations(list(dict.fromkeys(rules))))


def derived(graph: HyperGraph) -> tuple:
    """What a graph computes about itself and a graph changed in place takes over: the
    adjacency lists, the rule total, the relation counts, the producers and the readers."""
    indexes = range(len(graph.nodes))
    return (
        [graph.successors(i) for i in indexes],
        [graph.predecessors(i) for i in indexes],
        graph.rule_total,
        graph.relation_counts,
        graph.producers,
        graph.readers,
    )


def same_graph(changed: HyperGraph, rules: list[Rule], previous: HyperGraph) -> None:
    """``changed`` (from ``previous``) is the graph of ``rules``; the nodes it says it kept
    are ``previous``'s own, with the same edges between them (the update driver keeps their
    states as they are)."""
    fresh = build_hyper_graph(rules)
    assert shape(changed) == shape(fresh)
    assert derived(changed) == derived(fresh)
    kept = changed.kept_from_previous
    if kept is not None:
        assert all(a is b for a, b in zip(changed.nodes[:kept], previous.nodes, strict=False))
        assert len(previous.nodes) >= kept
        for edges, before in (
            (changed.positive, previous.positive),
            (changed.negative, previous.negative),
        ):
            assert {e for e in edges if e[1] < kept} == {e for e in before if e[1] < kept}


@settings(max_examples=300)
@given(programs_with_leaves(), st.data())
def test_a_changed_graph_is_the_graph_built_afresh(rules, data):
    """Rules appended or removed (sinks or not): the graph changed from the old one is the one
    built from the new rules, node for node (order and fields), edge for edge, and in what it
    computes about itself (taken over from the old graph when sinks change: asked of the old
    graph first or not, and changed twice in a row)."""
    cut = data.draw(st.integers(0, len(rules)))
    old = rules[:cut]
    before = build_hyper_graph(old)
    if data.draw(st.booleans()):
        derived(before)
    grown = changed_hyper_graph(before, old, rules)
    same_graph(grown, rules, before)
    removed = data.draw(st.sets(st.sampled_from(rules))) if rules else set()
    kept = [rule for rule in rules if rule not in removed]
    full = build_hyper_graph(rules)
    same_graph(changed_hyper_graph(full, rules, kept), kept, full)
    same_graph(changed_hyper_graph(grown, rules, kept), kept, grown)  # (from a changed graph)
    last = [rule for rule in rules if rule not in set(rules[cut:])]  # (the appended, again)
    same_graph(changed_hyper_graph(grown, rules, last), last, grown)


def test_a_leaf_rule_changes_the_graph_in_place_and_a_merging_rule_does_not():
    """RS2's leaf r18 added and removed without building the graph again; r4, which joins
    hyper-nodes, is built afresh."""
    benchmark = Path(__file__).resolve().parents[2] / "rules" / "benchmarks" / "rs2.rules"
    rs2 = list(parse_file(benchmark).rules)
    without = {label: [r for r in rs2 if r.label != label] for label in ("r18", "r4")}
    full = build_hyper_graph(rs2)
    for label, fewer in without.items():
        smaller = build_hyper_graph(fewer)
        leaf = label == "r18"
        assert (
            _sinks_only(smaller, fewer, [*fewer, *(r for r in rs2 if r.label == label)]) is not None
        ) == leaf
        assert (_sinks_only(full, rs2, fewer) is not None) == leaf


def test_a_rule_sharing_an_aggregate_head_is_refused_when_added_later():
    """The aggregate's head is a sink, and so is the new rule: the graph is still checked, and
    the program stays as it was."""
    reasoner = Reasoner()
    reasoner.add_facts([("e", "a", "b"), ("e", "a", "c")])
    reasoner.add_rules("c(X, N) :- aggregate( e(X, Y) ) on X with count(Y) as N .")
    with pytest.raises(RuleError, match="aggregate's head must be defined by that rule alone"):
        reasoner.add_rules("c(X, Y) :- e(X, Y) .")
    assert set(reasoner.facts("c")) == {("c", "a", 2)}


# --- the graph is built from relation vertices: it must be the graph of the rule edges


def graph_from_rule_edges(rules):
    """The HRDG as the paper defines it, from the rule edges (rule i -> rule j when j reads
    i's head), SCCs of those, a rule reading its own head recursive: (shape, or the message
    of the stratification error for the first edge, in rule order, that closes a cycle under
    negation or aggregation)."""
    rules = single_headed(rules)
    edges = rule_edges(rules)
    successors = {i: [e.target for e in edges if e.source == i] for i in range(len(rules))}
    components = strongly_connected_components(range(len(rules)), successors.__getitem__)
    component_of = {i: n for n, members in enumerate(components) for i in members}
    for edge in edges:
        if edge.kind != "positive" and component_of[edge.source] == component_of[edge.target]:
            return "error", edge
    signs = {"positive": set(), "negative": set()}
    for edge in edges:
        a, b = component_of[edge.source], component_of[edge.target]
        if a != b:
            signs["positive" if edge.kind == "positive" else "negative"].add((a, b))
    order = []
    placed: set[int] = set()
    while len(order) < len(components):  # smallest first rule among the ready components
        ready = [
            c for c in range(len(components)) if c not in placed
            and all(a in placed for a, b in signs["positive"] | signs["negative"] if b == c)
        ]  # fmt: skip
        chosen = min(ready, key=lambda c: min(components[c]))
        order.append(chosen)
        placed.add(chosen)
    position = {c: rank for rank, c in enumerate(order)}
    nodes = []
    for c in order:
        members = sorted(components[c])
        node_rules = [rules[i] for i in members]
        loops = any(e.source == e.target == members[0] for e in edges)
        nodes.append((
            frozenset(r.key for r in node_rules),
            members[0],
            len(members) > 1 or loops,
            frozenset(r.head.relation for r in node_rules),
            frozenset(rel for r in node_rules for rel, _ in r.body_relations()),
        ))  # fmt: skip
    moved = {s: {(position[a], position[b]) for a, b in e} for s, e in signs.items()}
    return nodes, moved["positive"], moved["negative"]


@st.composite
def dense_programs(draw):
    """Rules over a few binary relations, each reading one to three of them, some under
    negation: many rules derive and read the same relations, and many are unstratifiable."""
    relations = [f"p{i}" for i in range(draw(st.integers(1, 5)))]
    x, y = Variable("X"), Variable("Y")
    rules = []
    for _ in range(draw(st.integers(1, 10))):
        body = [Atom(draw(st.sampled_from(relations)), (x, y))]
        for _ in range(draw(st.integers(0, 2))):
            atom = Atom(draw(st.sampled_from(relations)), (x, y))
            body.append(Negation(atom) if draw(st.booleans()) else atom)
        rules.append(Rule(Atom(draw(st.sampled_from(relations)), (x, y)), tuple(body)))
    return list(dict.fromkeys(rules))


@settings(max_examples=400)
@given(programs_with_leaves() | dense_programs())
def test_the_graph_is_the_graph_of_the_rule_edges(rules):
    expected = graph_from_rule_edges(rules)
    if expected[0] == "error":
        reader = single_headed(rules)[expected[1].target].id
        with pytest.raises(StratificationError) as raised:
            build_hyper_graph(rules)
        assert raised.value.cycle[-1] == reader
        assert f"rule {reader} reads {expected[1].relation[0]}/" in str(raised.value)
    else:
        assert shape(build_hyper_graph(rules)) == expected
