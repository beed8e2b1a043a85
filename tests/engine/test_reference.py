"""The oracle checked by hand: small programs whose answers are worked out in the comments.

The differential tests trust ``tests/support/reference.py``; these cases are why they may. Each one
pins a point of ``docs/semantics.md``.
"""

from __future__ import annotations

import time

import pytest
from hypothesis import HealthCheck, given, settings

from agent.engine.language import (
    RDF_TYPE,
    Aggregate,
    Atom,
    BinaryOp,
    Bind,
    Call,
    Comparison,
    Constant,
    Literal,
    Negation,
    Program,
    Rule,
    Variable,
)
from tests.support.reference import evaluate, from_external, to_external
from tests.support.strategies import program_and_facts


def term(x: object) -> Variable | Constant:
    """Upper-case names and ``_`` are variables; anything else (lower-case IRIs, numbers) is a
    constant."""
    if isinstance(x, str) and (x[:1].isupper() or x == "_"):
        return Variable(x)
    return Constant(x)


def A(predicate: str, *terms: object) -> Atom:
    return Atom(predicate, tuple(term(t) for t in terms))


def NOT(predicate: str, *terms: object) -> Negation:
    return Negation(A(predicate, *terms))


def COMP(left: object, op: str, right: object) -> Comparison:
    return Comparison(term(left), op, term(right))


def BIND(expr: object, variable: str) -> Bind:
    return Bind(expr, Variable(variable))


def AGG(body: tuple, group: tuple[str, ...], function: str, argument: str, result: str):
    return Aggregate(body, tuple(map(Variable, group)), function, term(argument), Variable(result))


def program(*rules: tuple) -> Program:
    """``program((head, item, item...), ...)``"""
    return Program(tuple(Rule(head, tuple(body)) for head, *body in rules))


def derived(result, predicate: str) -> set[tuple]:
    """The arguments of the facts of one predicate."""
    return {fact[1:] for fact in result.facts if fact[0] == predicate}


X, Y, Z = "X", "Y", "Z"


# --- recursion ---------------------------------------------------------------------------------


def test_transitive_closure_of_a_chain():
    rules = program(
        (A("tc", X, Y), A("edge", X, Y)),
        (A("tc", X, Z), A("tc", X, Y), A("edge", Y, Z)),
    )
    edges = [("edge", "a", "b"), ("edge", "b", "c"), ("edge", "c", "d")]
    result = evaluate(rules, edges)
    # a->b->c->d: every pair (i, j) with i before j.
    pairs = {("a", "b"), ("b", "c"), ("c", "d"), ("a", "c"), ("b", "d"), ("a", "d")}
    assert derived(result, "tc") == pairs
    assert result.facts == set(edges) | {("tc", *p) for p in pairs}
    assert result.errors == 0


def test_transitive_closure_of_a_cycle_reaches_itself():
    rules = program(
        (A("tc", X, Y), A("edge", X, Y)),
        (A("tc", X, Z), A("tc", X, Y), A("tc", Y, Z)),
    )
    result = evaluate(rules, [("edge", "a", "b"), ("edge", "b", "a")])
    assert derived(result, "tc") == {("a", "b"), ("b", "a"), ("a", "a"), ("b", "b")}


SYMMETRIC_TRANSITIVE = [  # Rule Set 1-3, r1-r3
    (A("p11", X, Y), A("p1", X, Y)),
    (A("p11", X, Y), A("p11", Y, X)),
    (A("p11", X, Y), A("p11", X, Z), A("p11", Z, Y), COMP(X, "!=", Y)),
]


def test_symmetric_transitive_with_inequality_on_a_three_node_chain():
    # p1: a-b, b-c. r1 copies them, r2 adds b-a and c-b, r3 joins a-b-c and c-b-a into a-c and
    # c-a. A reflexive pair could only come from r3 (a-b-a), which X != Y blocks, or from r2
    # flipping a reflexive pair: so none. All six ordered pairs of distinct nodes, no (x, x).
    facts = [("p1", "a", "b"), ("p1", "b", "c")]
    result = evaluate(program(*SYMMETRIC_TRANSITIVE), facts)
    nodes = ["a", "b", "c"]
    assert derived(result, "p11") == {(x, y) for x in nodes for y in nodes if x != y}
    # Without the comparison, r3 derives the reflexive pairs too: all nine pairs.
    plain = program(*SYMMETRIC_TRANSITIVE[:2], SYMMETRIC_TRANSITIVE[2][:3])
    assert derived(evaluate(plain, facts), "p11") == {(x, y) for x in nodes for y in nodes}


def test_mutual_recursion():
    rules = program(
        (A("even", X), A("zero", X)),
        (A("odd", Y), A("even", X), A("succ", X, Y)),
        (A("even", Y), A("odd", X), A("succ", X, Y)),
    )
    facts = [("zero", 0)] + [("succ", i, i + 1) for i in range(5)]
    result = evaluate(rules, facts)
    assert derived(result, "even") == {(0,), (2,), (4,)}
    assert derived(result, "odd") == {(1,), (3,), (5,)}


# --- negation ----------------------------------------------------------------------------------


def test_stratified_negation():
    rules = program(
        (A("reach", X, Y), A("edge", X, Y)),
        (A("reach", X, Z), A("reach", X, Y), A("edge", Y, Z)),
        (A("unreached", X), A("node", X), NOT("reach", "a", X)),
    )
    facts = [("node", n) for n in "abcd"] + [("edge", "a", "b"), ("edge", "b", "c")]
    # reach(a, .) = {b, c}, complete before unreached reads it: a (no loop) and d.
    assert derived(evaluate(rules, facts), "unreached") == {("a",), ("d",)}


@pytest.mark.parametrize("existential", ["Z", "_"])
def test_existential_negation(existential: str):
    # RS3 r10new: p20(X, Y) :- p12(X, Y) and not p13(Y, Z). b has a p13 successor, c none.
    # It is "no p13(Y, z) for any z", not "some z without p13(Y, z)" (which would keep (a, b)).
    rules = program((A("p20", X, Y), A("p12", X, Y), NOT("p13", Y, existential)))
    facts = [("p12", "a", "b"), ("p12", "a", "c"), ("p13", "b", "d")]
    assert derived(evaluate(rules, facts), "p20") == {("a", "c")}


def test_repeated_existential_variable_means_equal_values():
    # not p(Y, Z, Z): no fact p(Y, z, z). b has p(b, 1, 2) only (1 != 2), c has p(c, 3, 3).
    rules = program((A("q", Y), A("r", Y), NOT("p", Y, Z, Z)))
    facts = [("r", "b"), ("r", "c"), ("p", "b", 1, 2), ("p", "c", 3, 3)]
    assert derived(evaluate(rules, facts), "q") == {("b",)}


def test_relations_are_predicate_and_arity():
    # p/1 reads p/2 under negation: different relations, so this is stratifiable.
    rules = program((A("p", X), A("e", X), NOT("p", X, X)))
    facts = [("e", "a"), ("e", "b"), ("p", "a", "a")]
    result = evaluate(rules, facts)
    assert derived(result, "p") == {("a", "a"), ("b",)}
    assert to_external(("p", "b")) in result.external()


# --- aggregates --------------------------------------------------------------------------------

NEIGHBOURS = [
    ("hasNeighbour", "t1", "t2"),
    ("hasNeighbour", "t1", "t3"),
    ("hasNeighbour", "t2", "t3"),
    ("hasNeighbour", "t3", "t1"),
    ("temp", "t1", 30),
    ("temp", "t1", 40),
    ("temp", "t2", 20),
    ("temp", "t3", 20),
]


def neighbour_aggregate(function: str) -> Program:
    body = (A("hasNeighbour", X, Y), A("temp", Y, "T"))
    return program((A("out", X, "R"), AGG(body, (X,), function, "T", "R")))


@pytest.mark.parametrize(
    ("function", "expected"),
    [
        # Substitutions (X, Y, T): t1 -> (t2, 20), (t3, 20): the two neighbours with the same
        # reading count twice. t2 -> (t3, 20). t3 -> (t1, 30), (t1, 40).
        ("count", {"t1": 2, "t2": 1, "t3": 2}),
        ("sum", {"t1": 40, "t2": 20, "t3": 70}),
        ("min", {"t1": 20, "t2": 20, "t3": 30}),
        ("max", {"t1": 20, "t2": 20, "t3": 40}),
        ("avg", {"t1": 20.0, "t2": 20.0, "t3": 35.0}),
        ("med", {"t1": 20, "t2": 20, "t3": 35.0}),
    ],
)
def test_aggregate_over_neighbours(function: str, expected: dict):
    result = evaluate(neighbour_aggregate(function), NEIGHBOURS)
    assert derived(result, "out") == set(expected.items())
    assert result.errors == 0


def test_avg_and_even_median_are_floats():
    result = evaluate(neighbour_aggregate("avg"), NEIGHBOURS)
    assert all(isinstance(value, float) for _, value in derived(result, "out"))
    result = evaluate(neighbour_aggregate("med"), NEIGHBOURS)
    assert ("t3", 35.0) in derived(result, "out")


def test_median_is_the_true_median():
    readings = [("r", "s", v) for v in (10, 1, 4, 2)]  # sorted 1 2 4 10: (2 + 4) / 2
    rules = program((A("m", X, "M"), AGG((A("r", X, Y),), (X,), "med", Y, "M")))
    assert derived(evaluate(rules, readings), "m") == {("s", 3.0)}
    odd = readings + [("r", "s", 7)]  # 1 2 4 7 10
    assert derived(evaluate(rules, odd), "m") == {("s", 4)}


def test_aggregate_without_group_and_with_two_groups():
    total = program((A("total", "N"), AGG((A("temp", Y, "T"),), (), "count", "T", "N")))
    assert derived(evaluate(total, NEIGHBOURS), "total") == {(4,)}
    assert to_external(("total", 4)) == (RDF_TYPE, 4, "total")
    body = (A("hasNeighbour", X, Y), A("temp", Y, "T"))
    pairs = program((A("n", X, Y, "N"), AGG(body, (X, Y), "count", "T", "N")))
    assert derived(evaluate(pairs, NEIGHBOURS), "n") == {
        ("t1", "t2", 1),
        ("t1", "t3", 1),
        ("t2", "t3", 1),
        ("t3", "t1", 2),
    }


def test_distinct_substitutions_not_distinct_values():
    # Y does not appear in the result, but two substitutions differing in Y are two.
    rules = program((A("c", X, "N"), AGG((A("e", X, Y),), (X,), "count", X, "N")))
    assert derived(evaluate(rules, [("e", "a", 1), ("e", "a", 2)]), "c") == {("a", 2)}


def test_comparison_on_the_aggregate_result():
    rules = program(
        (
            A("hot", X, "M"),
            AGG((A("temp", X, "T"),), (X,), "max", "T", "M"),
            COMP("M", ">", 25),
        )
    )
    assert derived(evaluate(rules, NEIGHBOURS), "hot") == {("t1", 40)}


def test_aggregate_skips_non_numbers_and_counts_them():
    facts = [("temp", "t4", 5), ("temp", "t4", "broken"), ("temp", "t5", "broken")]
    sums = program((A("s", X, "R"), AGG((A("temp", X, "T"),), (X,), "sum", "T", "R")))
    result = evaluate(sums, facts)
    assert derived(result, "s") == {("t4", 5)}  # t5 is left with no number: no fact
    assert result.errors == 2
    counts = program((A("c", X, "R"), AGG((A("temp", X, "T"),), (X,), "count", "T", "R")))
    result = evaluate(counts, facts)
    assert derived(result, "c") == {("t4", 2), ("t5", 1)}  # count counts anything
    assert result.errors == 0


def test_aggregate_reads_a_lower_stratum_and_feeds_a_higher_one():
    rules = program(
        (A("near", X, Y), A("hasNeighbour", X, Y)),
        (A("near", X, Y), A("near", Y, X)),
        (A("deg", X, "N"), AGG((A("near", X, Y),), (X,), "count", Y, "N")),
        (A("hub", X), A("deg", X, "N"), COMP("N", ">=", 2)),
    )
    # near is symmetric: t1-t2, t1-t3, t2-t3 (t3-t1 is t1-t3 again): every node has degree 2.
    result = evaluate(rules, NEIGHBOURS)
    assert derived(result, "deg") == {("t1", 2), ("t2", 2), ("t3", 2)}
    assert derived(result, "hub") == {("t1",), ("t2",), ("t3",)}


# --- expressions, comparisons, run-time errors -------------------------------------------------


def test_division_by_zero_and_non_numbers_are_dropped_and_counted():
    rules = program((A("q", X, Z), A("e", X, Y), BIND(BinaryOp("/", Constant(10), term(Y)), Z)))
    facts = [("e", "a", 0), ("e", "b", 4), ("e", "c", "iri")]
    result = evaluate(rules, facts)
    assert derived(result, "q") == {("b", 2.5)}
    assert result.errors == 2


def test_ordering_needs_two_numbers_or_two_iris():
    facts = [("e", "a", 0), ("e", "b", 4), ("e", "c", "iri"), ("e", "d", Literal("x"))]
    less = program((A("q", X), A("e", X, Y), COMP(Y, "<", 3)))
    result = evaluate(less, facts)
    assert derived(result, "q") == {("a",)}
    assert result.errors == 2  # "iri" < 3 and "x"^^string < 3
    iris = program((A("q", X), A("e", X, Y), COMP(Y, ">=", "h")))  # "iri" >= "h"
    result = evaluate(iris, facts[2:3])
    assert derived(result, "q") == {("c",)}
    assert result.errors == 0


def test_equality_is_numeric_or_term_identity_and_never_raises():
    facts = [("e", "a", 5), ("e", "b", "5"), ("e", "c", Literal("5")), ("e", "d", True)]
    for value, expected in [(5.0, {("a",)}), ("5", {("b",)}), (True, {("d",)}), (1, set())]:
        result = evaluate(program((A("q", X), A("e", X, Y), COMP(Y, "=", value))), facts)
        assert derived(result, "q") == expected, value
        assert result.errors == 0
    different = program((A("q", X), A("e", X, Y), COMP(Y, "!=", 5)))
    assert derived(evaluate(different, facts), "q") == {("b",), ("c",), ("d",)}


def test_booleans_are_not_numbers():
    facts = [("e", "a", True)]
    assert evaluate(program((A("q", X), A("e", X, 1))), facts).facts == set(facts)
    plus = program((A("q", Y), A("e", X, Z), BIND(BinaryOp("+", term(Z), Constant(1)), Y)))
    assert evaluate(plus, facts).errors == 1
    assert evaluate(program((A("q", X), A("e", X, Y), COMP(Y, "<", 2))), facts).errors == 1


@pytest.mark.parametrize(
    ("function", "argument", "expected"),
    [
        ("round", 2.5, 2),  # half to even
        ("round", 3.5, 4),
        ("floor", 2.5, 2),
        ("ceil", 2.5, 3),
        ("abs", -3, 3),
        ("sqrt", 6.25, 2.5),
        ("sqrt", -1, None),  # run-time error
    ],
)
def test_functions(function: str, argument: float, expected: object):
    rules = program((A("q", Y), A("e", X), BIND(Call(function, (term(X),)), Y)))
    result = evaluate(rules, [("e", argument)])
    if expected is None:
        assert derived(result, "q") == set() and result.errors == 1
    else:
        ((value,),) = derived(result, "q")
        assert value == expected and type(value) is type(expected)


def test_min_max_and_overflow():
    def bind(expr: object) -> set[tuple]:
        result = evaluate(program((A("q", Y), A("e", X), BIND(expr, Y))), [("e", 1e308)])
        return derived(result, "q") if not result.errors else {"error"}

    assert bind(Call("min", (term(X), Constant(3)))) == {(3,)}
    assert bind(Call("max", (term(X), Constant(3)))) == {(1e308,)}
    assert bind(BinaryOp("*", term(X), Constant(10))) == {"error"}  # inf: an overflow


def test_five_and_five_point_zero_are_one_value():
    rules = program(
        (A("q", X), A("p", X, Y), A("r", Y)),  # joins 5 with 5.0
        (A("s", Y), A("r", Y)),  # derives s(5.0) where s(5) is explicit: one fact
        (A("t", X), A("p", X, Y), COMP(Y, "=", 5.0)),
    )
    result = evaluate(rules, [("p", "a", 5), ("r", 5.0), ("s", 5)])
    assert derived(result, "q") == {("a",)}
    assert derived(result, "s") == {(5,)} and len(derived(result, "s")) == 1
    assert derived(result, "t") == {("a",)}


def test_binds_in_any_written_order():
    rules = program(
        (
            A("q", X, "W"),
            BIND(BinaryOp("*", term("V"), Constant(2)), "W"),
            BIND(BinaryOp("+", term(Z), Constant(1)), "V"),
            A("p", X, Z),
        )
    )
    assert derived(evaluate(rules, [("p", "a", 3)]), "q") == {("a", 8)}


# --- programs refused, plumbing ----------------------------------------------------------------


def test_negation_through_recursion_is_refused():
    rules = program(
        (A("p", X), A("e", X), NOT("q", X)),
        (A("q", X), A("e", X), NOT("p", X)),
    )
    with pytest.raises(ValueError, match="not stratifiable"):
        evaluate(rules, [("e", "a")])


def test_aggregate_through_recursion_is_refused():
    rules = program(
        (A("c", X, "N"), AGG((A("c", X, Y),), (X,), "count", Y, "N")),
    )
    with pytest.raises(ValueError, match="not stratifiable"):
        evaluate(rules, [])


def test_aggregate_head_derived_by_another_rule_is_refused():
    rules = program(
        (A("c", X, "N"), AGG((A("e", X, Y),), (X,), "count", Y, "N")),
        (A("c", X, Y), A("e", X, Y)),
    )
    with pytest.raises(ValueError):
        evaluate(rules, [])


def test_program_facts_and_external_form():
    rules = Program(rules=(Rule(A("q", X), (A("p", X, Y),)),), facts=(A("p", "a", "b"),))
    result = evaluate(rules, [])
    assert result.facts == {("p", "a", "b"), ("q", "a")}
    assert result.external() == {("p", "a", "b"), (RDF_TYPE, "a", "q")}
    for fact in result.facts:
        assert from_external(to_external(fact)) == fact


# --- the generated programs are valid and cheap for the oracle ---------------------------------


@settings(
    max_examples=3 * settings.default.max_examples,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(program_and_facts())
def test_generated_programs_are_valid(case):
    program_, facts = case
    started = time.perf_counter()
    result = evaluate(program_, facts)  # raises ValueError if unsafe or not stratifiable
    assert time.perf_counter() - started < 1.0, str(program_)
    assert {tuple(f) for f in facts} <= result.facts
    assert 1 <= len(program_.rules) <= 6


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(program_and_facts(robust_errors=True))
def test_generated_robust_programs_are_valid(case):
    evaluate(*case)
