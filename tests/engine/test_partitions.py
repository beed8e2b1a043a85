"""Atoms with constants and bound variables over a ternary relation read a partition of it
(`Relation.partition`, chosen by the compiler): the RDFS rules over random triples with few
predicates, and random insertions and deletions, equal the reference evaluator after every
step."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from agent.engine import Reasoner
from agent.engine.program.parser import parse_program
from simulations.bench.peers import rdfs_program
from tests.support.reference import evaluate

PROGRAM = rdfs_program("ours")
names = st.sampled_from(["a", "b", "c", "d", "e"])
predicates = st.sampled_from(["<dom>", "<rng>", "<sp>", "<sc>", "<type>", "p", "q"])
triples = st.sets(
    st.tuples(st.just("triple"), st.one_of(names, predicates), predicates, names), max_size=25
)


def strip(value: str) -> str:
    return value[1:-1] if value.startswith("<") else value


def plain(facts) -> set:
    return {tuple(strip(v) for v in fact) for fact in facts}


@settings(max_examples=120, deadline=None)
@given(start=triples, steps=st.lists(st.tuples(st.booleans(), triples), max_size=4))
def test_rdfs_over_partitions_equals_the_reference(start, steps):
    program = parse_program(PROGRAM)
    facts = plain(start)
    reasoner = Reasoner()
    reasoner.add_facts(sorted(facts))
    reasoner.add_rules(PROGRAM)
    assert set(reasoner.facts()) == evaluate(program, facts).external()
    for adding, batch in steps:
        batch = plain(batch)
        if adding:
            reasoner.add_facts(sorted(batch))
            facts |= batch
        else:
            reasoner.delete_facts(sorted(batch))
            facts -= batch
        assert set(reasoner.facts()) == evaluate(program, facts).external()


def test_rdfs_atoms_with_a_constant_and_a_bound_variable_read_partitions():
    reasoner = Reasoner()
    reasoner.add_facts(
        [("triple", "p", "dom", "a"), ("triple", "x", "p", "y"), ("triple", "a", "sc", "b")]
    )
    reasoner.add_rules(PROGRAM)
    assert ("triple", "x", "type", "b") in set(reasoner.facts())
    sources = [entry.source for key in reasoner.rules for entry in reasoner.plans(key)]
    assert any(".partition(((1, " in source for source in sources), sources
