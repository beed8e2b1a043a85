"""The semi-join module (agent/engine/modules/semijoin.py): which rules it takes, and that it
equals plain seminaive evaluation after random insertions, deletions and mixes of the facts it
reads (its source, its filters, upstream relations feeding both)."""

from __future__ import annotations

import random

import pytest

from agent.engine import Reasoner
from agent.engine.modules.shapes import Filter, semijoin_shape
from agent.engine.program.parser import parse_program
from tests.support.strategies import random_fact_updates

A, B, F = ("a", 2), ("b", 2), ("f", 1)


def shape(text: str):
    return semijoin_shape(parse_program(text).rules[0])


@pytest.mark.parametrize(
    "text, source, filters",
    [
        # RS2's r18: the objects of A that are subjects of B.
        ("h(X, Y) :- a(X, Y) and b(Y, Z) .", A, [Filter(B, 0, True, False)]),
        ("h(X, Y) :- b(Z, Y) and a(X, Y) .", A, [Filter(B, 1, True, False)]),
        ("h(X, Y) :- a(X, Y) and not b(X, Z) .", A, [Filter(B, 0, False, True)]),
        (
            "h(X, Y) :- a(X, Y) and f(Y) and not b(W, X) .",
            A,
            [Filter(F, 0, True, False), Filter(B, 1, False, True)],
        ),
    ],
)
def test_semijoin_shape(text: str, source, filters):
    found = shape(text)
    assert found is not None and found.source == source and list(found.filters) == filters


@pytest.mark.parametrize(
    "text",
    [
        "h(X, Y) :- a(Y, X) and b(Y, Z) .",  # the head permutes A's columns
        "h(X, Y) :- a(X, Y) and b(Y, X) .",  # a filter sharing both variables
        "h(X, Y) :- a(X, Y) and b(Y, Z) and f(Z) .",  # Z joins two filters
        "h(X, Y) :- a(X, Y) and b(Y, Y) .",  # a repeated variable in a filter
        "h(X, Y) :- a(X, Y) and b(Y, <c>) .",  # a constant in a filter
        "h(X, Y) :- a(X, Y) and b(Y, Z) and X != Y .",  # a comparison
        "h(X, Y) :- a(X, Y) .",  # no filter: a renaming
        "h(X, Y) :- h(X, Y) and b(Y, Z) .",  # recursive
    ],
)
def test_not_a_semijoin(text: str):
    assert shape(text) is None


def module_names(reasoner: Reasoner) -> list[str]:
    return [node["module"] for node in reasoner.stats()["hyper_nodes"]]


def from_scratch(reasoner: Reasoner) -> set:
    other = Reasoner(modules=False)
    other.add_facts(reasoner.edb_facts())
    other.add_rules(list(reasoner.rules.values()))
    return set(other.facts())


PROGRAMS = [
    "j: h(X, Y) :- a(X, Y) and b(Y, Z) .",
    "j: h(X, Y) :- a(X, Y) and not b(Y, Z) .",
    "j: h(X, Y) :- a(X, Y) and b(X, Z) and not f(Y) .",
    "j: h(X, Y) :- not b(W, X) and a(X, Y) and f(Y) .",
    # The source stored by subject (a transitive closure's output) and derived in two
    # hyper-nodes; the filter derived upstream.
    "t1: a(X, Y) :- e(X, Y) .\nt2: a(X, Z) :- a(X, Y) and a(Y, Z) .\n"
    "u: a(X, Y) :- f2(Y, X) .\nv: b(X, Y) :- e(Y, X) .\nj: h(X, Y) :- a(X, Y) and b(Y, Z) .",
    # A head that other rules read and that has explicit facts too.
    "j: h(X, Y) :- a(X, Y) and b(Y, Z) .\nk: g(X, Y) :- h(X, Y) and not e(Y, X) .",
]


@pytest.mark.parametrize("program", PROGRAMS)
@pytest.mark.parametrize("nodes", [4, 12])
def test_semijoin_module_equals_from_scratch_after_every_update(program: str, nodes: int):
    rng = random.Random(nodes * 1000 + len(program))
    for _ in range(10):
        facts = [
            (relation, f"n{rng.randrange(nodes)}", f"n{rng.randrange(nodes)}")
            for relation in ("a", "b", "e", "f2", "h")
            for _ in range(rng.randrange(nodes, 3 * nodes) if relation != "h" else 2)
        ] + [("f", f"n{rng.randrange(nodes)}") for _ in range(rng.randrange(nodes))]
        reasoner = Reasoner()
        reasoner.add_facts(facts)
        reasoner.add_rules(program)
        assert "semi-join" in module_names(reasoner)
        assert set(reasoner.facts()) == from_scratch(reasoner)
        for _ in random_fact_updates(reasoner, rng, facts):
            assert set(reasoner.facts()) == from_scratch(reasoner)


def test_semijoin_rule_replaced_and_deleted_under_its_label():
    reasoner = Reasoner()
    reasoner.add_facts([("a", "x", "y"), ("a", "x", "z"), ("b", "y", "w")])
    reasoner.add_rules("j: h(X, Y) :- a(X, Y) and b(Y, Z) .")
    assert ("h", "x", "y") in set(reasoner.facts())
    assert ("h", "x", "z") not in set(reasoner.facts())
    # replaced under its label in one update
    reasoner.update(add_rules="j: h(X, Y) :- a(X, Y) and not b(Y, Z) .", delete_rules=["j"])
    assert module_names(reasoner) == ["semi-join"]
    assert set(reasoner.facts()) == from_scratch(reasoner)
    assert ("h", "x", "z") in set(reasoner.facts())
    reasoner.delete_rules(["j"])
    assert not [f for f in reasoner.facts() if f[0] == "h"]
