"""The saved form of a rule (agent/engine/program/rule_form.py): every rule the parser can produce
reads back equal, with the same key and text; anything else is refused with FormError."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.engine.language import Atom, Constant, Literal, Rule, Variable
from agent.engine.program.parser import parse_program
from agent.engine.program.rule_form import FormError, rule_form, rule_from_form
from tests.engine.test_parser import programs as syntax_programs
from tests.engine.test_parser import values
from tests.support.strategies import incremental_programs, motif_programs

ROOT = Path(__file__).resolve().parents[2]


def assert_reads_back(rule: Rule) -> None:
    form = rule_form(rule)
    back = rule_from_form(form)
    assert back == rule, form
    assert str(back) == str(rule) and back.key == rule.key and back.id == rule.id
    assert rule_form(back) == form


def test_every_shipped_and_golden_rule_reads_back() -> None:
    files = sorted(ROOT.glob("rules/**/*.rules")) + sorted(ROOT.glob("tests/golden/**/*.rules"))
    rules = [rule for path in files for rule in parse_program(path.read_text()).rules]
    assert len(rules) > 50
    for rule in rules:
        assert_reads_back(rule)


@settings(max_examples=max(1, settings.default.max_examples // 3))  # (slow to draw)
@given(syntax_programs())
def test_random_rules_read_back(program) -> None:
    for rule in program.rules:
        assert_reads_back(rule)


@given(incremental_programs() | motif_programs())
def test_the_differential_tests_programs_read_back(program) -> None:
    """Labelled rules, multi-head rules, skolem binds, aggregates, negation, comparisons."""
    for rule in program.rules:
        assert_reads_back(rule)


@given(values)
def test_every_kind_of_constant_keeps_its_type(value) -> None:
    rule = Rule(Atom("q", (Variable("X"), Constant(value))), (Atom("p", (Variable("X"),)),))
    back = rule_from_form(rule_form(rule)).head.terms[1].value
    assert type(back) is type(value)
    assert back == value or (isinstance(value, float) and math.isnan(value) and math.isnan(back))


def test_a_literal_an_int_a_float_and_a_boolean_stay_apart() -> None:
    text = 'q(X, 1, 1.0, true, "1", "1"@en, "1"^^<http://x/t>) :- p(X) .'
    (rule,) = parse_program(text).rules
    terms = rule_from_form(rule_form(rule)).head.terms
    assert [t.value for t in terms[1:]] == [
        1,
        1.0,
        True,
        Literal("1"),
        Literal("1", language="en"),
        Literal("1", datatype="http://x/t"),
    ]
    assert [type(t.value) for t in terms[1:4]] == [int, float, bool]


GOOD = rule_form(
    parse_program(
        "r: q(X, N) :- aggregate(p(X, Y) and m(X, T) and not n(Y, _) and T != 0) on X "
        "with count(T) as N and bind(abs(N - 1) as Z) and Z > 2 ."
    ).rules[0]
)


def damaged(old: str, new: str) -> str:
    assert old in GOOD, old
    return GOOD.replace(old, new, 1)


@pytest.mark.parametrize(
    "form, reason",
    [
        ("", "not JSON"),
        (GOOD[:-3], "not JSON"),
        ("{}", "expected a rule node"),
        ('["R"]', "has 4 fields"),
        (damaged('"r"', '"1 r"'), "not a label"),
        (damaged('"r"', "7"), "not a label"),
        (damaged('["A","q"', '["A",""'), "predicate must be a non-empty string"),
        (damaged('["A","q"', '["A",["q"]'), "predicate must be a non-empty string"),
        (damaged('["A","p"', '["X","p"'), "expected a body item"),
        (damaged('["A","p"', '["Q","p"'), "comparison node has 3 fields"),
        (damaged('"abs"', '"exec"'), "unknown function"),
        (damaged('"abs",[', '"abs",[["C",1],'), "abs takes exactly 1 argument"),
        (damaged('"-"', '"**"'), "unknown arithmetic operator"),
        (damaged('">"', '"~"'), "unknown comparison operator"),
        (damaged('"count"', '"eval"'), "unknown aggregate function"),
        (damaged('["V","Z"]]', '["V",null]]'), "variable's name"),
        (damaged('["V","Z"]]', '["C",1]]'), "expected a variable node"),
        (damaged('["C",2]', '["C",{"a":1}]'), "expected a literal node"),
        (damaged('["C",2]', '["C",["L",1,null,null]]'), "literal's text"),
        (damaged('["C",2]', '["C",["L","a","",null]]'), "datatype or language"),
        ("[" * 100_000 + "]" * 100_000, "not JSON"),
        (damaged('["C",2]', '["O","+",' * 5000 + '["C",2]' + ',["C",1]]' * 5000), "depth|deeply"),
    ],
)
def test_a_damaged_form_is_refused_with_its_reason(form: str, reason: str) -> None:
    with pytest.raises(FormError, match=reason):
        rule_from_form(form)


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=4)
    | st.sampled_from(["R", "A", "N", "Q", "B", "G", "V", "C", "O", "F", "L", "+", "abs", "<"]),
    lambda children: st.lists(children, max_size=6) | st.dictionaries(st.text(), children),
    max_leaves=30,
)  # fmt: skip


@given(JSON)
def test_any_json_gives_a_rule_or_a_form_error(tree) -> None:
    """Never any other exception: the state's integrity check reports FormError as damage."""
    try:
        rule = rule_from_form(json.dumps(tree))
    except FormError:
        return
    assert isinstance(rule, Rule)
