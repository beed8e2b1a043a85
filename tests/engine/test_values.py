"""values.py is the executable twin of docs/semantics.md: every operator, function, comparison
and aggregate of its tables is documented there, the compiled code and the evaluator use the
same functions, and validation's arities come from the table."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from agent.engine import Reasoner, values
from agent.engine.errors import ZodiacError
from agent.engine.language import BinaryOp, Call, Comparison, Constant, Variable
from agent.engine.plan.compiler import RUNTIME

DOC = (Path(__file__).resolve().parents[2] / "docs" / "semantics.md").read_text()
# Inline code only: a fenced block's three backticks would pair the spans off by one.
DOC = re.sub(r"^```.*?^```$", "", DOC, flags=re.DOTALL | re.MULTILINE)
TABLES = {
    "arithmetic": values.ARITHMETIC,
    "functions": values.FUNCTIONS,
    "comparisons": values.COMPARISONS,
}


@pytest.mark.parametrize(
    "name",
    [*values.ARITHMETIC, *values.FUNCTIONS, *values.COMPARISONS, *values.AGGREGATES],
)
def test_every_operator_is_documented(name):
    # Written in backticks, alone or in a space-separated list such as `+ - * /`.
    spans = re.findall(r"`([^`]+)`", DOC)
    assert any(name in span.split() or span == name for span in spans), name


@pytest.mark.parametrize("table", sorted(TABLES))
def test_compiled_code_calls_the_table_functions(table):
    for operator in TABLES[table].values():
        assert RUNTIME[operator.code] is operator.function


def test_the_evaluator_follows_the_documented_rules():
    X = Variable("X")
    value_of = {X: 7}.__getitem__
    assert values.evaluate(BinaryOp("/", X, Constant(2)), value_of) == 3.5
    assert values.evaluate(Call("round", (Constant(2.5),)), value_of) == 2  # half to even
    assert values.compare(Comparison(Constant(5), "=", Constant(5.0)), value_of)
    with pytest.raises(values.EVAL_ERRORS):
        values.evaluate(BinaryOp("/", X, Constant(0)), value_of)
    with pytest.raises(values.EVAL_ERRORS):
        values.compare(Comparison(Constant("a"), "<", Constant(1)), value_of)
    assert values.aggregate_value("sum", [1, 2, "x"]) == (3, 1)
    assert values.aggregate_value("med", [1, 2, 3, 4]) == (2.5, 0)


@pytest.mark.parametrize(
    ("expression", "message"),
    [("abs(X, X)", "abs takes exactly 1 argument, got 2"), ("max(X)", "max takes at least 2")],
)
def test_validation_reads_arities_from_the_table(expression, message):
    with pytest.raises(ZodiacError, match=re.escape(message)):
        Reasoner().add_rules(f"<h>(Y) :- <p>(X) and bind({expression} as Y) .")
