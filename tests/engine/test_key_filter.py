"""Key filters, the compiled form of a semi-join (one atom filtered by the existence or
absence of matches in others), are C-level ``compress`` calls: the shapes that take that path,
and those that must not, give the reference evaluator's result, from scratch and through fact
updates."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.engine import Reasoner
from agent.engine.plan.rewrites import Shape
from agent.engine.program.parser import parse_program
from tests.support.reference import evaluate, to_external

# (rule text, whether the compiled plan must be a key filter)
SHAPES = [
    ("h(X, Y) :- q(X, Y), r(Y, Z) .", True),  # RS2's r18: the head is q's fact itself
    ("h(Y, X) :- q(X, Y), r(Y, Z) .", True),  # a permuted head
    ("h(X) :- q(X, Y), r(Y, Z), s(X) .", True),  # projection; a fully bound unary filter
    ("h(X, Y) :- q(X, Y), r(X, Y) .", True),  # a fully bound binary filter
    ("h(X, Y) :- q(X, Y), not r(Y, Z) .", True),  # negation: no match at all
    ("h(X, Y) :- q(X, Y), not s(Y), r(X, Z) .", True),
    ("h(X, Y) :- q(X, Y), r(Y, Z), t(Z) .", False),  # Z joins two filters
    ("h(X, Z) :- q(X, Y), r(Y, Z) .", False),  # a real join
    ("h(X, Y) :- q(X, Y), r(Y, Y) .", False),  # a repeated variable in a filter
    ("h(X, Y) :- q(X, Y), r(Y, Z), X != Y .", False),  # a comparison
]
# r gets facts from the EDB and from a rule: two stores, whose keys the filter must unite.
EXTRA = "r(X, Y) :- u(X, Y) .\n"
values = st.integers(0, 4)
binary = st.sets(st.tuples(values, values), max_size=10)
unary = st.sets(values, max_size=4)


def facts_of(q, r, u, s, t) -> list[tuple]:
    found = [("q", *f) for f in q] + [("r", *f) for f in r] + [("u", *f) for f in u]
    return found + [("s", x) for x in s] + [("t", x) for x in t]


def check(reasoner: Reasoner, text: str, facts: list[tuple]) -> None:
    wanted = evaluate(parse_program(text), facts).external()
    assert {tuple(f) for f in reasoner.facts()} == wanted


@pytest.mark.parametrize("rule, semijoin", SHAPES)
@settings(max_examples=40, deadline=None)
@given(q=binary, r=binary, u=binary, s=unary, t=unary, gone=st.data())
def test_semijoin_shapes_equal_the_reference(rule, semijoin, q, r, u, s, t, gone):
    text = EXTRA + "h1: " + rule
    facts = facts_of(q, r, u, s, t)
    reasoner = Reasoner()
    reasoner.add_facts([to_external(f) for f in facts])
    reasoner.add_rules(text)
    check(reasoner, text, facts)
    # (a plan with a positive atom that has no facts is compiled to a bare return)
    shapes = [entry.shape for entry in reasoner.plans("h1") if entry.shape is not Shape.EMPTY]
    if shapes:
        assert (Shape.KEY_FILTER in shapes) is semijoin, shapes
    removed = gone.draw(st.lists(st.sampled_from(facts), unique=True) if facts else st.just([]))
    reasoner.delete_facts([to_external(f) for f in removed])
    remaining = [f for f in facts if f not in removed]
    check(reasoner, text, remaining)
    reasoner.add_facts([to_external(f) for f in removed])
    check(reasoner, text, facts)
