"""Value semantics: what the rule language's operators, functions, comparisons and aggregates
compute on term values. ``docs/semantics.md`` says it in prose; this module is its executable
twin, and the only place it is written.

Everyone evaluates through it: the compiler generates calls to the functions of these tables
(by their ``code`` names, see ``RUNTIME``), ``explain`` and the Spark job's Python workers call
:func:`evaluate` and :func:`compare`, the parser and the validator read names and arities, and
the aggregate module and Spark call :func:`aggregate_value`. Changing a semantic rule here
changes it everywhere at once.

The rules, briefly: arithmetic only on numbers (``int``/``float``; Python's exact integers and
true division); ordering only between two numbers or two strings (IRIs, plain literals);
equality by term identity, except that ``5 = 5.0``; anything else, division by zero, the square
root of a negative number, an overflow, raises one of ``EVAL_ERRORS``, and the engine drops that
substitution and counts it.
"""

from __future__ import annotations

import hashlib
import math
import re
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from agent.engine.language import BinaryOp, Call, Comparison, Constant, Expr, Variable, is_number
from agent.engine.terms import term_key


class EvalError(Exception):
    """A run-time error in a bind or comparison (non-number, division by zero...)."""


EVAL_ERRORS = (EvalError, ArithmeticError, ValueError, TypeError)


def number(value):
    """``value`` if it is a number, else an EvalError (booleans are not numbers here)."""
    cls = value.__class__
    if cls is int or cls is float:
        return value
    raise EvalError(f"not a number: {value!r}")


def add(a, b):
    return number(a) + number(b)


def subtract(a, b):
    return number(a) - number(b)


def multiply(a, b):
    return number(a) * number(b)


def divide(a, b):
    divisor = number(b)
    if divisor == 0:
        raise EvalError("division by zero")
    return number(a) / divisor


def square_root(a):
    value = number(a)
    if value < 0:
        raise EvalError("square root of a negative number")
    return math.sqrt(value)


def _orderable(a, b) -> None:
    ca, cb = a.__class__, b.__class__
    if (ca is int or ca is float) and (cb is int or cb is float):
        return
    if ca is str and cb is str:
        return
    raise EvalError(f"cannot order {a!r} and {b!r}")


def less(a, b):
    _orderable(a, b)
    return a < b


def less_or_equal(a, b):
    _orderable(a, b)
    return a <= b


def greater(a, b):
    _orderable(a, b)
    return a > b


def greater_or_equal(a, b):
    _orderable(a, b)
    return a >= b


def equal(a, b):
    return term_key(a) == term_key(b)


def not_equal(a, b):
    return term_key(a) != term_key(b)


def skolem(tag, *args) -> str:
    """A fresh IRI named by ``tag`` and ``args``: the same values give the same IRI in every
    process, on every device and in the Spark job (a hash of their canonical text, equal numbers
    written alike, so ``5`` and ``5.0`` agree), different ones a different IRI (a 128-bit
    hash). Rules use it to create one node per combination of values (one value node per
    expression and valuation)."""
    text = "\x1f".join(_canonical(value) for value in (tag, *args))
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", _lexical(_integral(tag)))[:40]
    return f"urn:zodiac:skolem:{name}:{digest}"


def _integral(value):
    """An integral float as the int it equals (``5.0`` and ``5`` are one term, whichever
    spelling was seen first: the IRI must not depend on it); anything else as it is."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _canonical(value) -> str:
    if isinstance(value, bool):
        return f"b:{value}"
    if is_number(value):
        return f"n:{_integral(value)!r}"
    if isinstance(value, str):
        return f"i:{value}"
    return f"l:{value}"  # a literal, printed with its datatype or language


def _lexical(value) -> str:
    return value if isinstance(value, str) else getattr(value, "lexical", str(value))


@dataclass(frozen=True)
class Operator:
    """One entry of the language's operator tables.

    ``arity``: the number of arguments, or None for "at least ``min_arity``" (min, max);
    ``code``: the name compiled code calls ``function`` by."""

    symbol: str
    arity: int | None
    function: Callable
    code: str
    min_arity: int = 0


ARITHMETIC: dict[str, Operator] = {
    op.symbol: op
    for op in (
        Operator("+", 2, add, "ADD"),
        Operator("-", 2, subtract, "SUB"),
        Operator("*", 2, multiply, "MUL"),
        Operator("/", 2, divide, "DIV"),
    )
}
FUNCTIONS: dict[str, Operator] = {
    op.symbol: op
    for op in (
        Operator("abs", 1, lambda a: abs(number(a)), "F_abs"),
        Operator("min", None, lambda *a: min(map(number, a)), "F_min", min_arity=2),
        Operator("max", None, lambda *a: max(map(number, a)), "F_max", min_arity=2),
        Operator("round", 1, lambda a: round(number(a)), "F_round"),
        Operator("floor", 1, lambda a: math.floor(number(a)), "F_floor"),
        Operator("ceil", 1, lambda a: math.ceil(number(a)), "F_ceil"),
        Operator("sqrt", 1, square_root, "F_sqrt"),
        Operator("skolem", None, skolem, "F_skolem", min_arity=1),
    )
}
COMPARISONS: dict[str, Operator] = {
    op.symbol: op
    for op in (
        Operator("<", 2, less, "LT"),
        Operator("<=", 2, less_or_equal, "LE"),
        Operator(">", 2, greater, "GT"),
        Operator(">=", 2, greater_or_equal, "GE"),
        Operator("=", 2, equal, "EQ"),
        Operator("!=", 2, not_equal, "NE"),
    )
}
# What compiled code finds in its globals: every operator under its code name.
RUNTIME: dict[str, Callable] = {
    op.code: op.function for table in (ARITHMETIC, FUNCTIONS, COMPARISONS) for op in table.values()
}


def arity_error(function: str, count: int) -> str | None:
    """Why ``function`` cannot take ``count`` arguments, or None (parser and validator)."""
    op = FUNCTIONS[function]
    if op.arity is not None and count != op.arity:
        plural = "" if op.arity == 1 else "s"
        return f"{function} takes exactly {op.arity} argument{plural}, got {count}"
    if op.arity is None and count < op.min_arity:
        return f"{function} takes at least {op.min_arity} arguments, got {count}"
    return None


def evaluate(expr: Expr, value_of: Callable[[Variable], object]):
    """The value of ``expr``, with ``value_of`` giving each variable's value; raises one of
    ``EVAL_ERRORS`` on a run-time error."""
    if isinstance(expr, Variable):
        return value_of(expr)
    if isinstance(expr, Constant):
        return expr.value
    if isinstance(expr, BinaryOp):
        function = ARITHMETIC[expr.op].function
        return function(evaluate(expr.left, value_of), evaluate(expr.right, value_of))
    assert isinstance(expr, Call)
    return FUNCTIONS[expr.function].function(*(evaluate(a, value_of) for a in expr.args))


def compare(comparison: Comparison, value_of: Callable[[Variable], object]) -> bool:
    """Whether ``comparison`` holds; raises one of ``EVAL_ERRORS`` on a run-time error."""
    left = evaluate(comparison.left, value_of)
    right = evaluate(comparison.right, value_of)
    return bool(COMPARISONS[comparison.op].function(left, right))


# -- aggregates ---------------------------------------------------------------------------
# Sums use exact rounding (math.fsum) when floats are involved, so a result does not depend on
# the order substitutions are visited in; integer sums stay integers.


def exact_sum(numbers: Sequence) -> int | float:
    if all(n.__class__ is int for n in numbers):
        return sum(numbers)
    return math.fsum(numbers)


AGGREGATES: dict[str, Callable[[Sequence], object]] = {
    "count": len,
    "sum": exact_sum,
    "min": min,
    "max": max,
    "avg": lambda numbers: math.fsum(numbers) / len(numbers),
    "med": lambda numbers: statistics.median(sorted(numbers)),
}


def aggregate_value(function: str, values: Sequence) -> tuple[object | None, int]:
    """``(result, errors)`` for one group; ``result`` is None when the group yields no fact.

    ``values`` holds one value per distinct substitution of the aggregate body; every function
    but ``count`` skips (and counts as errors) the values that are not numbers."""
    if function == "count":
        return len(values), 0
    numbers = [v for v in values if v.__class__ is int or v.__class__ is float or is_number(v)]
    errors = len(values) - len(numbers)
    if not numbers:
        return None, errors
    return AGGREGATES[function](numbers), errors


# Names, for the parser, the validator and test generators.
COMPARISON_OPERATORS = tuple(COMPARISONS)
ARITHMETIC_OPERATORS = tuple(ARITHMETIC)
FUNCTION_NAMES = tuple(FUNCTIONS)
AGGREGATE_FUNCTIONS = tuple(AGGREGATES)
