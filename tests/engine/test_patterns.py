"""Module choice by rule shape (issue 4): normalised variable names and body order."""

from __future__ import annotations

import pytest

from agent.engine import Reasoner
from agent.engine.modules import detect_closure
from agent.engine.program.parser import parse_program


def pattern(text: str):
    return detect_closure(parse_program(text).rules)


@pytest.mark.parametrize(
    "text, kind, irreflexive",
    [
        ("r(X, Z) :- r(X, Y), r(Y, Z) .", "transitive", False),
        ("r(A, C) :- r(B, C), r(A, B) .", "transitive", False),
        ("<p>(X, Z) :- <p>(X, Y) and <p>(Y, Z) and COMP(X, !=, Z) .", "transitive", True),
        ("r(X, Z) :- r(X, Y), r(Y, Z), Z != X .", "transitive", True),
        ("r(X, Y) :- r(Y, X) .\nr(X, Z) :- r(X, Y), r(Y, Z) .", "symmetric-transitive", False),
        (
            "<p11>(X, Y) :- <p11>(Y, X) .\n"
            "<p11>(X, Y) :- <p11>(X, Z) and <p11>(Z, Y) and COMP(X, !=, Y) .",
            "symmetric-transitive",
            True,
        ),
    ],
)
def test_closure_shapes_are_recognised(text, kind, irreflexive):
    found = pattern(text)
    assert found is not None and found.kind == kind and found.irreflexive == irreflexive


@pytest.mark.parametrize(
    "text",
    [
        "r(X, Z) :- r(X, Y), r(Y, Z), X != Y .",  # a different filter
        "r(X, Z) :- r(X, Y), s(Y, Z) .",  # not the same relation
        "r(X, X) :- r(X, Y), r(Y, X) .",  # not a closure head
        "r(X, Z) :- r(X, Y), r(Y, Z), X < Z .",
        "r(X, Y) :- r(Y, X) .",  # symmetric alone
        "r(X, Y) :- r(Y, X) .\nr(X, Z) :- r(X, Y), r(Y, Z) .\nr(X, Y) :- r(X, Y), e(X) .",
    ],
)
def test_other_shapes_fall_back_to_seminaive(text):
    assert pattern(text) is None


def test_modules_false_forces_seminaive_everywhere():
    text = "r(X, Y) :- r(Y, X) .\nr(X, Z) :- r(X, Y), r(Y, Z), X != Z ."
    plain = Reasoner(modules=False)
    plain.add_rules(text)
    assert {n["module"] for n in plain.stats()["hyper_nodes"]} == {"seminaive"}


def test_deleting_the_symmetric_rule_turns_stc_into_tc():
    rules = "sym: r(X, Y) :- r(Y, X) .\ntrans: r(X, Z) :- r(X, Y), r(Y, Z), X != Z ."
    reasoner = Reasoner()
    reasoner.add_rules(rules)
    reasoner.add_facts([("r", "a", "b"), ("r", "b", "c"), ("r", "d", "c")])
    assert {n["module"] for n in reasoner.stats()["hyper_nodes"]} == {
        "symmetric-transitive (x != z)"
    }
    reasoner.delete_rules(["sym"])
    assert [n["module"] for n in reasoner.stats()["hyper_nodes"]] == ["transitive (x != z)"]
    fresh = Reasoner(modules=False)
    fresh.add_facts([("r", "a", "b"), ("r", "b", "c"), ("r", "d", "c")])
    fresh.add_rules("r(X, Z) :- r(X, Y), r(Y, Z), X != Z .")
    assert (
        set(reasoner.facts())
        == set(fresh.facts())
        == {("r", "a", "b"), ("r", "b", "c"), ("r", "d", "c"), ("r", "a", "c")}
    )
    reasoner.add_facts([("r", "c", "a")])  # module state keeps working after the change
    fresh.add_facts([("r", "c", "a")])
    assert set(reasoner.facts()) == set(fresh.facts())
