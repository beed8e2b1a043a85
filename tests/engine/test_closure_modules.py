"""The transitive (TC) and symmetric-transitive (STC) closure modules against seminaive.

Each test builds a hyper-node by hand: its view is the EDB, a second lower store standing for
another hyper-node that derives ``r`` (so the external facts X are a union of two stores, and a
fact may be held by both), and the node's own IDB. The module under test must leave exactly the
IDB that ``SeminaiveModule`` stores from scratch on the same X, and report exactly the change.

Three oracles agree on the small cases: the seminaive module, a naive fixpoint written here
(heads of all rule instances over the least fixpoint), and the closed-form characterisation the
modules implement (``characterisation`` below).
"""

from __future__ import annotations

import random
import time
from collections import defaultdict
from itertools import combinations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyroaring import BitMap

from agent.engine import Reasoner
from agent.engine.modules.base import InputChanges, NodeState, StoreChanges
from agent.engine.modules.seminaive import SeminaiveModule
from agent.engine.modules.symmetric_transitive import SymmetricTransitiveModule
from agent.engine.modules.transitive import TransitiveClosureModule
from agent.engine.plan.executor import Executor
from agent.engine.program.dependency import build_hyper_graph, strongly_connected_components
from agent.engine.program.parser import parse_program
from agent.engine.storage.store import DataStore, DataStoreBag
from agent.engine.storage.subject_facts import SubjectFacts
from agent.engine.terms import TermDictionary
from tests.support import reference

R = ("r", 2)
S = ("s", 2)
TC_PLAIN = "t: r(X, Z) :- r(X, Y) and r(Y, Z) ."
TC_IRREFLEXIVE = "t: r(X, Z) :- r(X, Y) and r(Y, Z) and COMP(X, !=, Z) ."
SYMMETRIC = "s: r(X, Y) :- r(Y, X) ."
VARIANTS = [("tc", False), ("tc", True), ("stc", False), ("stc", True)]
IDS = ["tc", "tc-irreflexive", "stc", "stc-irreflexive"]
VERTICES = 8


def program_text(kind: str, irreflexive: bool) -> str:
    text = TC_IRREFLEXIVE if irreflexive else TC_PLAIN
    return f"{text}\n{SYMMETRIC}" if kind == "stc" else text


def make_module(kind: str, irreflexive: bool):
    cls = TransitiveClosureModule if kind == "tc" else SymmetricTransitiveModule
    return cls(R, irreflexive)


class Harness:
    """One closure hyper-node over two lower stores (the EDB and another hyper-node's IDB)."""

    def __init__(self, kind: str, irreflexive: bool, module=None) -> None:
        program = parse_program(program_text(kind, irreflexive))
        graph = build_hyper_graph(program.rules)
        assert len(graph.nodes) == 1
        self.executor = Executor(TermDictionary())
        for i in range(VERTICES):  # term ids 0..7 are IRIs
            self.executor.terms.encode(f"v{i}")
        self.edb = DataStore("edb")
        self.other = DataStore("other")
        self.idb = DataStore("hn")
        for store in (self.edb, self.other, self.idb):
            store.relation(R)
        self.edb.relation(S).add_all({(0, 1), (1, 2), (2, 0)})  # never read by the module
        view = DataStoreBag([self.edb, self.other, self.idb])
        self.node = NodeState("hn", graph.nodes[0], self.idb, view)
        self.module = make_module(kind, irreflexive) if module is None else module
        self.node.module = self.module

    def external(self) -> set:
        return self.edb.relation(R).tuples | self.other.relation(R).tuples

    def facts(self) -> set:
        return set(self.idb.relation(R).tuples)

    def materialise(self, edb=(), other=()) -> None:
        self.edb.relation(R).add_all(edb)
        self.other.relation(R).add_all(other)
        self.idb.clear()
        self.module.materialise(self.node, self.executor)

    def update(self, edb_add=(), edb_remove=(), other_add=(), other_remove=()) -> StoreChanges:
        """Change the lower stores, hand the visible difference to the module, check what it
        reports against the actual change of the IDB, and return the report."""
        before_x, before = self.external(), self.facts()
        self.edb.relation(R).remove_all(edb_remove)
        self.other.relation(R).remove_all(other_remove)
        self.edb.relation(R).add_all(edb_add)
        self.other.relation(R).add_all(other_add)
        after_x = self.external()
        changes = InputChanges()
        if after_x - before_x:
            changes.plus[R] = after_x - before_x
        if before_x - after_x:
            changes.minus[R] = before_x - after_x
        report = self.module.maintain(self.node, self.executor, changes)
        after = self.facts()
        assert report.added.get(R, set()) == after - before
        assert report.removed.get(R, set()) == before - after
        assert set(report.added) <= {R} and set(report.removed) <= {R}
        return report


def seminaive_idb(kind: str, irreflexive: bool, external: set) -> set:
    harness = Harness(kind, irreflexive, SeminaiveModule())
    harness.materialise(edb=external)
    return harness.facts()


def naive_idb(kind: str, irreflexive: bool, external: set) -> set:
    """Heads of all rule instances over the least fixpoint of X, the slow obvious way."""

    def heads(facts: set) -> set:
        succ = defaultdict(set)
        for y, z in facts:
            succ[y].add(z)
        found = {(x, z) for x, y in facts for z in succ[y] if not irreflexive or x != z}
        if kind == "stc":
            found |= {(y, x) for x, y in facts}
        return found

    fixpoint = set(external)
    while not heads(fixpoint) <= fixpoint:
        fixpoint |= heads(fixpoint)
    return heads(fixpoint)


def characterisation(kind: str, irreflexive: bool, external: set) -> set:
    """The closed forms the modules implement (see their docstrings)."""
    succ = defaultdict(set)
    for u, v in external:
        succ[u].add(v)
    vertices = {u for fact in external for u in fact}
    if kind == "stc":
        neighbours = defaultdict(set)
        for u, v in external:
            neighbours[u].add(v)
            neighbours[v].add(u)
        found = set()
        for component in strongly_connected_components(sorted(vertices), neighbours.__getitem__):
            found |= {(u, v) for u in component for v in component}
        if irreflexive:
            found = {(u, v) for u, v in found if u != v or (u, u) in external}
        return found

    def reachable(u: int) -> set:  # by one or more edges
        seen, frontier = set(), list(succ[u])
        while frontier:
            v = frontier.pop()
            if v not in seen:
                seen.add(v)
                frontier.extend(succ[v])
        return seen

    reach = {u: reachable(u) for u in vertices}
    two_or_more = {(u, z) for u in vertices for v in succ[u] for z in reach[v]}
    if not irreflexive:
        return two_or_more
    lonely = set()
    for component in strongly_connected_components(sorted(vertices), succ.__getitem__):
        if len(component) == 2 and all((u, u) not in external for u in component):
            u, w = component
            lonely |= {(u, w), (w, u)}
    return {(u, z) for u, z in two_or_more if u != z} - lonely


def check_all_oracles(kind: str, irreflexive: bool, external: set) -> set:
    expected = seminaive_idb(kind, irreflexive, external)
    assert naive_idb(kind, irreflexive, external) == expected
    assert characterisation(kind, irreflexive, external) == expected
    harness = Harness(kind, irreflexive)
    harness.materialise(edb=external)
    assert harness.facts() == expected
    return expected


def chain(n: int, start: int = 0) -> set:
    return {(start + i, start + i + 1) for i in range(n - 1)}


def cycle(n: int, start: int = 0) -> set:
    return chain(n, start) | {(start + n - 1, start)}


def clique(vertices) -> set:
    return {(u, v) for u in vertices for v in vertices if u != v}


SHAPES = {
    "empty": set(),
    "edge": {(0, 1)},
    "loop": {(3, 3)},
    "chain": chain(5),
    "cycle2": cycle(2),
    "cycle2-loop": cycle(2) | {(0, 0)},
    "cycle2-both-loops": cycle(2) | {(0, 0), (1, 1)},
    "cycle2-tail": cycle(2) | {(1, 2), (3, 0)},
    "cycle3": cycle(3),
    "two-cycles": cycle(2) | cycle(2, 2) | {(1, 2)},
    "cycle2-in-cycle": cycle(2) | {(1, 2), (2, 0)},
    "clique4": clique(range(4)),
    "components": chain(3) | cycle(2, 3) | {(6, 6), (7, 5)},
    "chain-with-shortcut": chain(4) | {(0, 2), (0, 3)},
    "diamond": {(0, 1), (0, 2), (1, 3), (2, 3), (3, 4)},
    "reflexive-chain": chain(3) | {(0, 0), (2, 2)},
    "star-in": {(i, 0) for i in range(1, 6)},
    "star-out": {(0, i) for i in range(1, 6)},
}


# ---------------------------------------------------------------------- the characterisation
@pytest.mark.parametrize(("kind", "irreflexive"), VARIANTS, ids=IDS)
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_materialise_equals_seminaive(kind, irreflexive, shape):
    check_all_oracles(kind, irreflexive, SHAPES[shape])


def test_characterisation_examples():
    # TC plain: paths of two or more edges, (u, u) on a cycle.
    assert check_all_oracles("tc", False, chain(4)) == {(0, 2), (0, 3), (1, 3)}
    assert check_all_oracles("tc", False, cycle(2)) == {(0, 0), (0, 1), (1, 0), (1, 1)}
    # TC irreflexive: a loop-free 2-vertex SCC derives nothing although 0 -> 1 -> 0 -> 1 is a
    # path of three edges (every instance with head (0, 1) needs (0, 0) or (1, 1)) ...
    assert check_all_oracles("tc", True, cycle(2)) == set()
    assert check_all_oracles("tc", True, cycle(2) | {(1, 2)}) == {(0, 2), (1, 2)}
    # ... a self-loop on either vertex, or a third SCC member, unblocks it.
    assert check_all_oracles("tc", True, cycle(2) | {(1, 1)}) == {(0, 1), (1, 0)}
    assert check_all_oracles("tc", True, cycle(3)) == clique(range(3))
    # STC plain: C x C per component.
    assert check_all_oracles("stc", False, {(0, 1), (3, 3)}) == {
        (0, 0),
        (0, 1),
        (1, 0),
        (1, 1),
        (3, 3),
    }
    # STC irreflexive: distinct pairs per component, (u, u) only when explicit.
    assert check_all_oracles("stc", True, {(0, 1), (1, 2), (2, 2), (4, 4)}) == clique(range(3)) | {
        (2, 2),
        (4, 4),
    }


def test_explicit_facts_that_are_also_derived_are_stored():
    # (0, 2) is external and also the head of 0 -> 1 -> 2: the IDB holds it, like seminaive.
    for kind, irreflexive in VARIANTS:
        external = chain(3) | {(0, 2)}
        assert (0, 2) in check_all_oracles(kind, irreflexive, external)


def test_describe_and_names():
    assert TransitiveClosureModule(R, True).describe() == "transitive (x != z)"
    assert TransitiveClosureModule(R, False).describe() == "transitive"
    assert SymmetricTransitiveModule(R, True).describe() == "symmetric-transitive (x != z)"
    assert SymmetricTransitiveModule(R, False).name == "symmetric-transitive"


# ---------------------------------------------------------------------- Add (insertions)
@pytest.mark.parametrize(("kind", "irreflexive"), VARIANTS, ids=IDS)
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_insert_one_by_one_equals_seminaive(kind, irreflexive, shape):
    harness = Harness(kind, irreflexive)
    harness.materialise()
    for fact in sorted(SHAPES[shape]):
        harness.update(edb_add={fact})
        assert harness.facts() == seminaive_idb(kind, irreflexive, harness.external())


@pytest.mark.parametrize(("kind", "irreflexive"), VARIANTS, ids=IDS)
def test_insertions_merge_components_and_close_cycles(kind, irreflexive):
    harness = Harness(kind, irreflexive)
    harness.materialise(edb=chain(3) | chain(3, 4))
    steps = [
        {(2, 4)},  # join two chains
        {(6, 0)},  # close one big cycle
        {(3, 3)},  # an isolated loop
        {(3, 7), (7, 3)},  # a 2-cycle, then its merge into the big one
        {(7, 5)},
    ]
    for batch in steps:
        harness.update(other_add=batch)
        assert harness.facts() == seminaive_idb(kind, irreflexive, harness.external())


def test_tc_irreflexive_lonely_pairs_form_and_break():
    harness = Harness("tc", True)
    harness.materialise(edb={(0, 1)})
    harness.update(edb_add={(1, 0)})  # {0, 1} becomes a loop-free 2-vertex SCC
    assert harness.facts() == set()
    harness.update(edb_add={(1, 2)})  # still lonely; (0, 2) and (1, 2) derived
    assert harness.facts() == {(0, 2), (1, 2)}
    harness.update(edb_add={(2, 0)})  # the SCC grows: every distinct pair
    assert harness.facts() == clique(range(3))
    harness.update(edb_remove={(2, 0)})  # lonely again
    assert harness.facts() == {(0, 2), (1, 2)}
    harness.update(edb_add={(0, 0)})  # a self-loop breaks it
    assert harness.facts() == {(0, 1), (1, 0), (0, 2), (1, 2)}
    harness.update(edb_remove={(0, 0)})
    assert harness.facts() == {(0, 2), (1, 2)}
    harness.update(edb_add={(3, 1), (2, 3)})  # a longer cycle through 1 (via 2 and 3)
    assert harness.facts() == seminaive_idb("tc", True, harness.external())


# ---------------------------------------------------------------------- Del + Red
@pytest.mark.parametrize(("kind", "irreflexive"), VARIANTS, ids=IDS)
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_delete_one_by_one_equals_seminaive(kind, irreflexive, shape):
    harness = Harness(kind, irreflexive)
    harness.materialise(edb=SHAPES[shape])
    for fact in sorted(SHAPES[shape], reverse=True):
        harness.update(edb_remove={fact})
        assert harness.facts() == seminaive_idb(kind, irreflexive, harness.external())
    assert harness.facts() == set()


@pytest.mark.parametrize(("kind", "irreflexive"), VARIANTS, ids=IDS)
def test_deletions_split_components_and_break_cycles(kind, irreflexive):
    harness = Harness(kind, irreflexive)
    harness.materialise(edb=cycle(6) | {(2, 2), (6, 7)}, other={(5, 0), (0, 3)})
    steps = [
        {(2, 3)},  # the cycle survives through 0 -> 3
        {(0, 3)},  # other store: (0, 3) gone, the cycle is broken
        {(4, 5), (6, 7)},  # split into pieces, 7 drops out
        {(2, 2)},  # a loop
        {(0, 1), (1, 2)},
    ]
    for batch in steps:
        harness.update(edb_remove=batch & harness.edb.relation(R).tuples, other_remove=batch)
        assert harness.facts() == seminaive_idb(kind, irreflexive, harness.external())


@pytest.mark.parametrize(("kind", "irreflexive"), VARIANTS, ids=IDS)
def test_fact_held_by_two_stores_stays_visible(kind, irreflexive):
    harness = Harness(kind, irreflexive)
    harness.materialise(edb=chain(4), other={(1, 2)})
    report = harness.update(edb_remove={(1, 2)})  # still external through the other store
    assert not report.added and not report.removed
    harness.update(other_remove={(1, 2)})
    assert harness.facts() == seminaive_idb(kind, irreflexive, harness.external())


@pytest.mark.parametrize(("kind", "irreflexive"), VARIANTS, ids=IDS)
def test_mixed_batch_reports_net_changes(kind, irreflexive):
    harness = Harness(kind, irreflexive)
    harness.materialise(edb=chain(5))
    # Remove the middle edge and re-route around it in the same change.
    report = harness.update(edb_remove={(2, 3)}, edb_add={(2, 5), (5, 3)})
    assert harness.facts() == seminaive_idb(kind, irreflexive, harness.external())
    assert not (report.added.get(R, set()) & report.removed.get(R, set()))


@pytest.mark.parametrize(("kind", "irreflexive"), VARIANTS, ids=IDS)
def test_every_external_fact_deleted_empties_the_idb_then_rebuilds(kind, irreflexive):
    """Deleting all of X (both stores) hands the whole IDB over without looking at a pair;
    facts added in the same change, and later ones, are closed from the emptied state."""
    harness = Harness(kind, irreflexive)
    harness.materialise(edb=cycle(4) | {(6, 6)}, other=chain(3, start=4))
    before = harness.facts()
    report = harness.update(
        edb_remove=cycle(4) | {(6, 6)}, other_remove=chain(3, start=4), edb_add=chain(3, start=7)
    )
    assert "emptied" in report.strategy
    assert report.removed.get(R, set()) == before - harness.facts()
    assert harness.facts() == seminaive_idb(kind, irreflexive, chain(3, start=7))
    harness.update(edb_remove=chain(3, start=7))
    assert harness.facts() == set()
    harness.update(edb_add=cycle(3), other_add={(2, 5)})
    assert harness.facts() == seminaive_idb(kind, irreflexive, harness.external())


def test_stc_clique_deletion_keeps_component():
    harness = Harness("stc", False)
    harness.materialise(edb=clique(range(6)))
    report = harness.update(edb_remove={(0, 1), (1, 0)})
    assert not report.added and not report.removed
    harness.update(edb_remove={(u, v) for u, v in clique(range(6)) if 0 in (u, v)})
    assert harness.facts() == {(u, v) for u in range(1, 6) for v in range(1, 6)}


# ---------------------------------------------------------------------- fallbacks and state
@pytest.mark.parametrize(("kind", "irreflexive"), VARIANTS, ids=IDS)
def test_rematerialise_resets_state(kind, irreflexive):
    harness = Harness(kind, irreflexive)
    harness.materialise(edb=cycle(4))
    harness.edb.relation(R).remove_all(cycle(4))
    harness.materialise(edb=chain(3, 4))
    assert harness.facts() == seminaive_idb(kind, irreflexive, chain(3, 4))
    harness.update(edb_add={(6, 0)})
    assert harness.facts() == seminaive_idb(kind, irreflexive, harness.external())


@pytest.mark.parametrize(("kind", "irreflexive"), VARIANTS, ids=IDS)
def test_fallbacks_recompute(kind, irreflexive):
    harness = Harness(kind, irreflexive)
    harness.materialise(edb=chain(4))
    # Removed rules: recompute.
    rule = harness.node.rules[0]
    changes = InputChanges(plus={R: {(3, 0)}})
    harness.edb.relation(R).add_all({(3, 0)})
    before = harness.facts()
    report = harness.module.maintain(harness.node, harness.executor, changes, [rule])
    assert report.strategy.startswith("recompute (rules removed")
    assert harness.facts() == seminaive_idb(kind, irreflexive, harness.external())
    assert report.added.get(R, set()) == harness.facts() - before
    # Someone else changed the IDB: the state is stale.
    harness.idb.relation(R).add_all({(7, 7)})
    report = harness.update(edb_add={(4, 5)})
    assert report.strategy.startswith("recompute")
    assert harness.facts() == seminaive_idb(kind, irreflexive, harness.external())
    # Changes that contradict the recorded X.
    report = harness.module.maintain(
        harness.node, harness.executor, InputChanges(minus={R: {(6, 6)}})
    )
    assert report.strategy.startswith("recompute")
    assert not report.added and not report.removed
    # A fresh module (no state) asked to maintain: recompute.
    fresh = make_module(kind, irreflexive)
    harness.node.module = harness.module = fresh
    harness.edb.relation(R).add_all({(5, 6)})
    report = fresh.maintain(harness.node, harness.executor, InputChanges(plus={R: {(5, 6)}}))
    assert report.strategy.startswith("recompute")
    assert harness.facts() == seminaive_idb(kind, irreflexive, harness.external())
    # ... after which it maintains incrementally.
    report = harness.update(edb_add={(6, 7)})
    assert not report.strategy.startswith("recompute")
    assert harness.facts() == seminaive_idb(kind, irreflexive, harness.external())


@pytest.mark.parametrize(("kind", "irreflexive"), VARIANTS, ids=IDS)
def test_extend(kind, irreflexive):
    harness = Harness(kind, irreflexive)
    harness.materialise(edb=cycle(3) | {(3, 4)})
    expected = harness.facts()
    # A state built for this IDB already covers every rule of the node: nothing to add.
    report = harness.module.extend(harness.node, harness.executor, harness.node.rules)
    assert not report.added and not report.removed and harness.facts() == expected
    # A fresh module over an IDB it did not build (a merge of parts) recomputes.
    harness.idb.relation(R).remove_all({(0, 1), (0, 2)})
    harness.idb.relation(R).add_all({(5, 5)})
    fresh = make_module(kind, irreflexive)
    report = fresh.extend(harness.node, harness.executor, harness.node.rules)
    assert harness.facts() == expected
    assert report.removed.get(R, set()) == {(5, 5)}


class RecordingBag(DataStoreBag):
    """A view that records which relations are looked up."""

    def __init__(self, stores, seen: set) -> None:
        super().__init__(stores)
        self.seen = seen

    def relations(self, key):
        self.seen.add(key)
        return super().relations(key)


@pytest.mark.parametrize(("kind", "irreflexive"), VARIANTS, ids=IDS)
def test_reads_only_its_relation(kind, irreflexive):
    harness = Harness(kind, irreflexive)
    seen: set = set()
    harness.node.bag = RecordingBag(harness.node.bag.stores, seen)
    harness.materialise(edb=chain(4))
    harness.update(edb_add={(3, 0)}, edb_remove={(1, 2)})
    harness.update(other_add={(1, 2)})
    assert seen == {R}


# ---------------------------------------------------------------------- random sequences
edges = st.tuples(st.integers(0, VERTICES - 1), st.integers(0, VERTICES - 1))
edge_sets = st.sets(edges, max_size=14)


@st.composite
def batches(draw):
    """A batch for each of the two lower stores: some facts to add, some of the present (or
    absent) ones to remove."""
    return [
        (draw(edge_sets.map(frozenset)), draw(st.sets(edges, max_size=6).map(frozenset)))
        for _ in range(2)
    ]


@pytest.mark.parametrize(("kind", "irreflexive"), VARIANTS, ids=IDS)
@settings(max_examples=3 * settings.default.max_examples // 2)  # 150 in CI
@given(
    first=edge_sets,
    second=edge_sets,
    steps=st.lists(batches(), max_size=6),
    data=st.data(),
)
def test_random_update_sequences(kind, irreflexive, first, second, steps, data):
    harness = Harness(kind, irreflexive)
    harness.materialise(edb=first, other=second)
    expected = seminaive_idb(kind, irreflexive, harness.external())
    assert harness.facts() == expected
    assert characterisation(kind, irreflexive, harness.external()) == expected
    for (edb_add, edb_drop), (other_add, other_drop) in steps:
        # Remove mostly facts that are present, so deletions really happen.
        present = sorted(harness.edb.relation(R).tuples)
        edb_drop = set(edb_drop) | set(
            data.draw(st.lists(st.sampled_from(present), max_size=4)) if present else []
        )
        present = sorted(harness.other.relation(R).tuples)
        other_drop = set(other_drop) | set(
            data.draw(st.lists(st.sampled_from(present), max_size=4)) if present else []
        )
        report = harness.update(
            edb_add=set(edb_add) - edb_drop,
            edb_remove=edb_drop,
            other_add=set(other_add) - other_drop,
            other_remove=other_drop,
        )
        expected = seminaive_idb(kind, irreflexive, harness.external())
        assert harness.facts() == expected
        assert characterisation(kind, irreflexive, harness.external()) == expected
        assert not report.strategy.startswith("recompute")


@pytest.mark.parametrize(("kind", "irreflexive"), VARIANTS, ids=IDS)
@settings(max_examples=settings.default.max_examples)
@given(facts=st.lists(edges, min_size=1, max_size=20, unique=True), data=st.data())
def test_random_single_fact_updates(kind, irreflexive, facts, data):
    """Insert facts one at a time, then delete them one at a time in a random order."""
    harness = Harness(kind, irreflexive)
    harness.materialise()
    for fact in facts:
        harness.update(edb_add={fact})
        assert harness.facts() == seminaive_idb(kind, irreflexive, harness.external())
    for fact in data.draw(st.permutations(facts)):
        harness.update(edb_remove={fact})
        assert harness.facts() == seminaive_idb(kind, irreflexive, harness.external())


# ---------------------------------------------------------------------- integration
@pytest.mark.parametrize(("kind", "irreflexive"), VARIANTS, ids=IDS)
@settings(max_examples=max(1, settings.default.max_examples * 4 // 10))  # 40 in CI
@given(data=st.data())
def test_through_the_update_driver(kind, irreflexive, data):
    """Reasoners with and without the closure modules, with r also derived by two other
    hyper-nodes and read by a downstream rule, against the naive reference."""
    text = (
        "a: r(X, Y) :- e(X, Y) .\nb: r(X, Y) :- f(X, Y) .\nq: loop(X) :- r(X, X) .\n"
        + program_text(kind, irreflexive)
    )
    program = parse_program(text)
    reasoner, plain = Reasoner(), Reasoner(modules=False)
    for engine in (reasoner, plain):
        engine.add_rules(text)
    used = [n.module for n in reasoner.nodes if "t" in {r.id for r in n.rules}]
    assert type(used[0]) is type(make_module(kind, irreflexive))
    assert used[0].irreflexive == irreflexive
    explicit: set = set()
    vertices = [f"v{i}" for i in range(6)]
    fact = st.tuples(st.sampled_from(["e", "f", "r"]), *[st.sampled_from(vertices)] * 2)
    for _ in range(data.draw(st.integers(1, 5))):
        add = data.draw(st.sets(fact, max_size=8))
        drop = (
            data.draw(st.sets(st.sampled_from(sorted(explicit)), max_size=5)) if explicit else set()
        )
        for engine in (reasoner, plain):
            engine.update(add_facts=sorted(add), delete_facts=sorted(drop))
        explicit = (explicit - drop) | add
        expected = reference.evaluate(program, explicit).external()
        assert set(reasoner.facts()) == expected
        assert set(plain.facts()) == expected


# ---------------------------------------------------------------------- scale
def test_stc_chain_scale_smoke():
    harness = Harness("stc", True)
    started = time.perf_counter()
    harness.materialise(edb=chain(300, 100))
    elapsed = time.perf_counter() - started
    assert len(harness.facts()) == 300 * 299
    assert elapsed < 0.5, elapsed
    # Cutting the chain in the middle removes 2 * 150 * 150 pairs.
    report = harness.update(edb_remove={(249, 250)})
    assert len(report.removed[R]) == 2 * 150 * 150


def test_tc_random_dag_against_seminaive():
    rng = random.Random(7)
    external = {tuple(sorted(rng.sample(range(60), 2))) for _ in range(150)}
    expected = seminaive_idb("tc", False, external)
    harness = Harness("tc", False)
    harness.materialise(edb=external)
    assert harness.facts() == expected
    for u, v in rng.sample(sorted(external), 20):
        harness.update(edb_remove={(u, v)}, edb_add={(v + 60, u)} if u % 3 == 0 else ())
        assert harness.facts() == seminaive_idb("tc", False, harness.external())


@pytest.mark.parametrize(("kind", "irreflexive"), VARIANTS, ids=IDS)
def test_closure_changes_are_made_and_reported_by_subject(kind, irreflexive):
    """A chain cut in the middle and mended, a back edge and a loop added and deleted (a
    lonely pair of the irreflexive TC forms and breaks): the IDB stored by subject stays so
    and the changes handed up are by subject (`SubjectFacts`: a reader grouping by subject
    takes them as they are), each the actual change of the IDB."""
    harness = Harness(kind, irreflexive)
    harness.materialise(edb=chain(8))
    closure = harness.idb.relation(R)
    steps = [  # (removed, added)
        ({(3, 4)}, set()),  # cut
        (set(), {(3, 4)}),  # mended
        (set(), {(6, 5)}),  # a 2-cycle: lonely for the irreflexive TC
        (set(), {(5, 5)}),  # a loop on it: no longer lonely
        ({(6, 5)}, set()),
        ({(5, 5)}, set()),
    ]
    for removed, added in steps:
        before = {(x, y) for x, ys in closure.existing_index((0,)).items() for y in ys}
        harness.edb.relation(R).remove_all(removed)
        harness.edb.relation(R).add_all(added)
        changes = InputChanges()
        if added:
            changes.plus[R] = set(added)
        if removed:
            changes.minus[R] = set(removed)
        report = harness.module.maintain(harness.node, harness.executor, changes)
        assert not closure.rows_built
        after = {(x, y) for x, ys in closure.existing_index((0,)).items() for y in ys}
        for reported, expected in (
            (report.removed, before - after),
            (report.added, after - before),
        ):
            if expected:
                assert isinstance(reported[R], SubjectFacts)
            assert set(reported.get(R, ())) == expected
    assert harness.facts() == seminaive_idb(kind, irreflexive, harness.external())


def test_tc_closure_stays_compressed_until_a_rule_reads_it():
    """The TC module keeps its reach sets and its IDB as compressed bitmaps (a dense closure in
    a few bytes per pair): after materialising and after updates the IDB relation holds a
    bitmap per subject and no tuples. A rule added later that joins on the closure reads it
    as Python sets, and every step answers what the reference evaluator does."""
    rng = random.Random(5)
    edges = {tuple(sorted(rng.sample(range(40), 2))) for _ in range(120)}
    explicit = {("r", f"v{u}", f"v{v}") for u, v in edges}
    text = TC_PLAIN
    reasoner = Reasoner()
    reasoner.add_rules(text)
    reasoner.add_facts(sorted(explicit))
    (closure,) = [
        node.store.relations[R] for node in reasoner.view().nodes if R in node.store.relations
    ]

    def check() -> None:
        expected = reference.evaluate(parse_program(text), explicit).external()
        assert set(reasoner.facts()) == expected

    assert not closure.rows_built
    assert all(isinstance(b, BitMap) for b in closure.existing_index((0,)).values())
    check()
    dropped = set(rng.sample(sorted(explicit), 15))
    added = {("r", f"v{u}", f"v{u + 40}") for u in range(0, 40, 7)}
    reasoner.update(add_facts=sorted(added), delete_facts=sorted(dropped))
    explicit = (explicit - dropped) | added
    assert not closure.rows_built
    assert all(isinstance(b, BitMap) for b in closure.existing_index((0,)).values())
    check()
    text += "\nq: h(X, Z) :- r(X, Y) and s(Y, Z) ."
    reasoner.add_rules(text.splitlines()[-1])
    reasoner.add_facts([("s", f"v{v}", "end") for v in range(0, 80, 3)])
    explicit |= {("s", f"v{v}", "end") for v in range(0, 80, 3)}
    check()
    reasoner.delete_facts(sorted(dropped := set(rng.sample(sorted(explicit), 10))))
    explicit -= dropped
    check()


def test_random_dense_graph_all_variants():
    rng = random.Random(11)
    for kind, irreflexive in VARIANTS:
        external = {(u, v) for u, v in combinations(range(30), 2) if rng.random() < 0.08}
        external |= {(v, u) for u, v in external if rng.random() < 0.2}
        harness = Harness(kind, irreflexive)
        harness.materialise(edb=external)
        assert harness.facts() == seminaive_idb(kind, irreflexive, external)
        for fact in rng.sample(sorted(external), 15):
            harness.update(edb_remove={fact})
            assert harness.facts() == seminaive_idb(kind, irreflexive, harness.external())
