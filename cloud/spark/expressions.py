"""Run-time evaluation of comparisons, binds and aggregate functions, exactly as the engine does.

These functions run inside Spark's Python workers (called by the UDFs of :mod:`.udfs`) on the
*values* of terms, decoded from the broadcast term dictionary. They call the engine's own
evaluator, operators and aggregate functions (``agent.engine.values``), so every corner of the
semantics (Python int arithmetic, true division, round-half-to-even, ``5 == 5.0``, ordering
only between numbers or between IRIs, errors for non-numbers, division by zero, overflow,
``math.fsum`` sums, the true median) is the engine's by construction, not a re-implementation.

Nothing here imports pyspark: the module is plain Python, testable without Spark.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from agent.engine import values as semantics
from agent.engine.language import Comparison, Expr, Variable, is_number
from agent.engine.values import EVAL_ERRORS, aggregate_value

__all__ = [
    "EVAL_ERRORS",
    "Dictionary",
    "bind",
    "compare",
    "evaluate",
    "parse_number",
    "parse_value",
    "reduce_group",
]


class Dictionary:
    """What a worker needs to decode term ids and find the id of a computed number.

    ``numbers`` maps every number of the dictionary to its id. Python's ``5 == 5.0`` (same
    hash) makes ``numbers.get(5.0)`` find the id of ``5``, as the engine's dictionary does;
    booleans are left out, or ``True`` would find the id of ``1``.
    """

    __slots__ = ("values", "numbers", "_iris")

    def __init__(self, values: Sequence) -> None:
        self.values = list(values)
        self.numbers = {v: i for i, v in enumerate(self.values) if is_number(v)}
        self._iris: dict[str, int] | None = None  # built on a worker's first IRI result

    def __getstate__(self):
        return (self.values, self.numbers)

    def __setstate__(self, state) -> None:
        self.values, self.numbers = state
        self._iris = None

    def iri(self, value: str) -> int | None:
        """The id of an IRI (a ``skolem`` result), if the dictionary has it."""
        if self._iris is None:
            self._iris = {v: i for i, v in enumerate(self.values) if v.__class__ is str}
        return self._iris.get(value)


def evaluate(expr: Expr, values: Sequence, row: dict[Variable, int]):
    """The value of ``expr`` under ``row`` (variable -> term id); raises on a run-time error."""
    return semantics.evaluate(expr, lambda variable: values[row[variable]])


def compare(comparison: Comparison, values: Sequence, row: dict[Variable, int]) -> bool | None:
    """True or False, or None for a run-time error (the engine drops the substitution)."""
    try:
        return semantics.compare(comparison, lambda variable: values[row[variable]])
    except EVAL_ERRORS:
        return None


def number_result(value, dictionary: Dictionary) -> tuple[int | None, str | None] | None:
    """A computed value as ``(id, None)`` when the dictionary has it, ``(None, text)`` when it
    is new (the driver gives it an id, see :func:`parse_value`: a number's ``repr``, an IRI
    in angle brackets), or None when the engine would refuse to store it (not a finite
    number: its ``terms.encode`` raises)."""
    if value.__class__ is str:  # an IRI: skolem's result
        found = dictionary.iri(value)
        return (found, None) if found is not None else (None, f"<{value}>")
    if value.__class__ not in (int, float):
        return None
    found = dictionary.numbers.get(value)
    if found is not None:
        return found, None
    if value.__class__ is float and not math.isfinite(value):
        return None
    return None, repr(value)


def bind(expr: Expr, dictionary: Dictionary, row: dict[Variable, int]):
    """``number_result`` of ``expr``, or None on a run-time error."""
    try:
        value = evaluate(expr, dictionary.values, row)
    except EVAL_ERRORS:
        return None
    return number_result(value, dictionary)


def reduce_group(function: str, ids: Sequence[int], dictionary: Dictionary):
    """``(result, errors)`` for one group: ``result`` as :func:`number_result` gives it (None:
    no fact for this group) and ``errors`` the skipped non-numbers. ``ids`` holds the
    aggregate argument of each distinct substitution of the group."""
    values = dictionary.values
    try:
        result, errors = aggregate_value(function, [values[i] for i in ids])
    except EVAL_ERRORS:  # e.g. fsum overflowing: the engine could not store it either
        return None, 1
    if result is None:
        return None, errors
    found = number_result(result, dictionary)
    return found, errors + (1 if found is None else 0)


def parse_value(text: str) -> int | float | str:
    """The inverse of the texts :func:`number_result` reports for new values."""
    if text.startswith("<") and text.endswith(">"):
        return text[1:-1]
    return parse_number(text)


def parse_number(text: str) -> int | float:
    """The inverse of ``repr`` on the ints and floats :func:`number_result` reports."""
    try:
        return int(text)
    except ValueError:
        return float(text)
