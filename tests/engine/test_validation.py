"""Validation tests: safety, binds, aggregates and labels, for text rules and AST rules alike."""

from __future__ import annotations

import pytest

from agent.engine.errors import RuleError, UnsafeRuleError
from agent.engine.language import (
    Aggregate,
    Atom,
    BinaryOp,
    Bind,
    Call,
    Comparison,
    Constant,
    Negation,
    Program,
    Rule,
    Variable,
)
from agent.engine.program.parser import parse_program
from agent.engine.program.validation import check_label, check_program, check_rule

X, Y, Z, T = (Variable(n) for n in "XYZT")


def rule_of(text: str) -> Rule:
    """Parse a rule, then check it again as an AST (the parser already checked it once)."""
    rule = parse_program(text).rules[0]
    check_rule(rule)
    return rule


def refused(text: str, error: type[RuleError] = UnsafeRuleError) -> str:
    """The message for a rule refused by the parser (through check_rule), of exactly ``error``."""
    with pytest.raises(error) as from_text:
        parse_program(text)
    assert type(from_text.value) is error
    return str(from_text.value)


SAFE = [
    "p(X) :- q(X) .",
    "p(X, Y) :- q(X), r(X, Y), X != Y .",
    "p(X) :- q(X), not r(X, Z) .",  # Z is existential
    "p(X) :- q(X), not r(X, _), not s(X, _) .",
    "p(X) :- q(X), not r(X, Z, Z) .",  # twice in the same negated atom: still existential
    "p(Y) :- bind(Z + 1 as Y) and q(X, Z) .",  # binds in any order
    "p(W) :- bind(V * 2 as W), bind(Z + 1 as V), q(Z) .",  # bind chains, written backwards
    "p(X, D) :- q(X, T), r(X, M), bind(abs(T - M) as D), COMP(D, >, 5) .",
    "p(Y) :- bind(1 as Y) .",  # no positive atom, but everything is bound
    "p(a) :- COMP(1, <, 2) .",
    "p(X, N) :- aggregate(e(X, Y)) on X with count(Y) as N .",
    "p(N) :- aggregate(e(X, Y)) with count(1) as N .",
    "p(X, N) :- aggregate(e(X, Y) and not f(Y, _) and Y > 1 and bind(Y * 2 as W)) "
    "on X with sum(W) as N .",
    "p(X, K) :- aggregate(e(X, Y)) on X with max(Y) as N, bind(N + 1 as K), K > 2, X != a .",
]


@pytest.mark.parametrize("text", SAFE)
def test_safe_rules_are_accepted(text: str) -> None:
    rule_of(text)


def test_head_variable_not_bound() -> None:
    message = refused("p(X, Y) :- q(X) .")
    assert "unsafe rule: variable Y of the head is not bound by a positive atom" in message
    assert "in rule: <p>(X, Y) :- <q>(X) ." in message


def test_all_offending_variables_are_reported() -> None:
    message = refused("p(X, Y, Z) :- q(X), not r(Y) .")
    assert "variables Y, Z of the head are not bound" in message


def test_variables_only_in_negation_or_comparison_do_not_bind() -> None:
    assert "variable Y of the head" in refused("p(X, Y) :- q(X), not r(Y) .")
    assert "variable Y of a comparison" in refused("p(X) :- q(X), X < Y .")
    assert "variable Y of the head" in refused("p(Y) :- q(X), X = Y .")


def test_comparison_and_bind_variables_must_be_bound() -> None:
    message = refused("p(X) :- q(X), COMP(X, <, Y), bind(X + W as V) .")
    assert "variable Y of a comparison is not bound" in message
    assert "variable W of a bind expression is not bound" in message


def test_cyclic_binds_are_unsafe() -> None:
    message = refused("p(X) :- q(X), bind(B + 1 as A), bind(A + 1 as B) .")
    assert "variables B, A of a bind expression are not bound" in message


def test_shared_negated_variable_must_be_bound() -> None:
    message = refused("p(X) :- q(X), not r(X, Z), not s(Z) .")
    assert "variable Z of a negated atom is not bound by a positive atom" in message


def test_variable_bound_twice() -> None:
    message = refused("p(X, D) :- q(X, D), bind(X + 1 as D) .", RuleError)
    assert "variable D is bound twice (by a positive atom and a bind)" in message
    message = refused("p(D) :- q(X), bind(X + 1 as D), bind(X + 2 as D) .", RuleError)
    assert "variable D is bound twice (by two binds)" in message
    message = refused(
        "p(X, N) :- aggregate(e(X)) on X with count(X) as N, bind(1 as N) .", RuleError
    )
    assert "variable N is bound twice (by the aggregate and a bind)" in message


def test_at_most_one_aggregate() -> None:
    message = refused(
        "p(N, M) :- aggregate(e(X)) with count(X) as N, aggregate(f(X)) with count(X) as M .",
        RuleError,
    )
    assert "at most one aggregate" in message


def test_atoms_beside_an_aggregate_must_move_inside() -> None:
    message = refused("p(X, N) :- q(X), aggregate(e(X, Y)) on X with count(Y) as N .", RuleError)
    assert "move <q>(X) inside the aggregate body" in message
    message = refused(
        "p(X, N) :- not q(X), aggregate(e(X, Y)) on X with count(Y) as N .", RuleError
    )
    assert "move not <q>(X) inside the aggregate body" in message


def test_aggregate_body_is_checked_on_its_own() -> None:
    message = refused("p(X, N) :- aggregate(e(Y)) on X with count(Y) as N .")
    assert "unsafe aggregate: variable X of the group-by (on) is not bound" in message
    message = refused("p(X, N) :- aggregate(e(X)) on X with sum(T) as N .")
    assert "variable T of the aggregate argument is not bound" in message
    message = refused("p(X, N) :- aggregate(e(X), T > 1) on X with count(X) as N .")
    assert "variable T of a comparison is not bound" in message
    message = refused("p(X, N) :- aggregate(e(X), not f(X, Z), not g(Z)) on X with count(X) as N .")
    assert "variable Z of a negated atom" in message


def test_aggregate_result_must_be_fresh() -> None:
    message = refused("p(X, Y) :- aggregate(e(X, Y)) on X with count(Y) as Y .", RuleError)
    assert "result variable Y must be fresh" in message
    message = refused("p(X) :- aggregate(e(X, Y)) on X with count(Y) as X .", RuleError)
    assert "result variable X must be fresh" in message


def test_aggregate_head_uses_only_groups_result_and_binds() -> None:
    message = refused("p(X, Y, N) :- aggregate(e(X, Y)) on X with count(Y) as N .")
    assert (
        "variable Y of the head is not a group-by variable, the aggregate result or a bind "
        "variable" in message
    )
    message = refused("p(X, N) :- aggregate(e(X, Y)) on X with count(Y) as N, Y > 1 .")
    assert "variable Y of a comparison is not a group-by variable" in message


def test_empty_body_and_non_ground_facts() -> None:
    with pytest.raises(RuleError, match="non-empty body"):
        check_rule(Rule(Atom("p", (Constant("a"),)), ()))
    with pytest.raises(UnsafeRuleError, match="a fact must be ground"):
        check_program(Program(facts=(Atom("p", (X,)),)))


def test_ast_only_problems() -> None:
    head = Atom("p", (X,))
    q = Atom("q", (X,))
    cases = [
        (Bind(Call("foo", (X,)), Y), "unknown function 'foo'"),
        (Bind(Call("abs", (X, X)), Y), "abs takes exactly 1 argument, got 2"),
        (Bind(Call("min", (X,)), Y), "min takes at least 2 arguments, got 1"),
        (Bind(BinaryOp("%", X, X), Y), "unknown arithmetic operator '%'"),
        (Comparison(X, "==", X), "unknown comparison operator '=='"),
        (Aggregate((q,), (X,), "mean", X, Y), "unknown aggregate function 'mean'"),
        (Aggregate((), (), "count", X, Y), "non-empty body"),
        (
            Aggregate((q, Aggregate((q,), (), "count", X, Z)), (), "count", X, Y),
            "cannot contain another aggregate",
        ),
        ("not an item", "not a body item"),
    ]
    for item, message in cases:
        body = (item,) if isinstance(item, Aggregate) else (q, item)
        with pytest.raises(RuleError, match=message):
            check_rule(Rule(head, body))  # type: ignore[arg-type]


def test_location_is_prefixed() -> None:
    rule = Rule(Atom("p", (Y,)), (Atom("q", (X,)),))
    with pytest.raises(UnsafeRuleError, match=r"^f\.dl:3:1: unsafe rule"):
        check_rule(rule, location="f.dl:3:1")
    with pytest.raises(UnsafeRuleError, match=r"^g\.dl:1:1: unsafe rule"):
        check_rule(rule, location=lambda: "g.dl:1:1")


def test_duplicate_labels() -> None:
    first = Rule(Atom("p", (X,)), (Atom("q", (X,)),), label="r1")
    same = Rule(Atom("p", (X,)), (Atom("q", (X,)),), label="r1")
    other = Rule(Atom("p", (X,)), (Atom("s", (X,)),), label="r1")
    check_program(Program(rules=(first, same)))
    with pytest.raises(RuleError, match="duplicate rule label 'r1'"):
        check_program(Program(rules=(first, other)))
    labels: dict[str, Rule] = {}
    check_label(labels, first)
    check_label(labels, Rule(Atom("p", (X,)), (Atom("q", (X,)),)))  # unlabelled: ignored
    assert labels == {"r1": first}


def test_check_program_checks_every_rule() -> None:
    bad = Rule(Atom("p", (Y,)), (Atom("q", (X,)),))
    with pytest.raises(UnsafeRuleError, match="variable Y of the head"):
        check_program(Program(rules=(Rule(Atom("p", (X,)), (Atom("q", (X,)),)), bad)))
    check_program(parse_program("\n".join(SAFE)))
    # negated existential variables inside an aggregate body are fine too
    check_rule(
        Rule(
            Atom("p", (X, Z)),
            (Aggregate((Atom("e", (X,)), Negation(Atom("f", (X, T)))), (X,), "count", X, Z),),
        )
    )
