"""Aggregate functions over the values of one group (docs/semantics.md, "Aggregates").

Sums use exact rounding (``math.fsum``) when floats are involved, so the result does not depend
on the order the engine happens to visit substitutions in; integer sums stay integers.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from .language import is_number


def aggregate_value(function: str, values: Sequence) -> tuple[object | None, int]:
    """``(result, errors)`` for one group; ``result`` is None when the group yields no fact.

    ``values`` holds one value per distinct substitution of the aggregate body.
    """
    if function == "count":
        return len(values), 0
    numbers = [v for v in values if v.__class__ is int or v.__class__ is float or is_number(v)]
    errors = len(values) - len(numbers)
    if not numbers:
        return None, errors
    if function == "sum":
        return exact_sum(numbers), errors
    if function == "min":
        return min(numbers), errors
    if function == "max":
        return max(numbers), errors
    if function == "avg":
        return math.fsum(numbers) / len(numbers), errors
    if function == "med":
        return statistics.median(sorted(numbers)), errors
    raise ValueError(f"unknown aggregate function {function!r}")


def exact_sum(numbers: Sequence) -> int | float:
    if all(n.__class__ is int for n in numbers):
        return sum(numbers)
    return math.fsum(numbers)
