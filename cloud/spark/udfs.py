"""Spark UDFs for the items whose semantics Spark's column expressions cannot mirror exactly.

Ordering comparisons (numbers vs IRIs vs errors), arithmetic (Python ints never overflow, ``/``
is true division, ``round`` is half-to-even, ints stay ints) and the aggregate functions
(``math.fsum``, the true median) are evaluated by :mod:`.expressions`, i.e. by the engine's own
functions, on values decoded from a broadcast of the term dictionary. Everything else (joins,
constants, ``=``/``!=`` on terms, negation, ``count``) stays in plain Spark on term ids.

Run-time errors are counted in a Spark accumulator. Like the engine's count it is diagnostic
(docs/semantics.md: only "zero or not" is comparable), and a recomputed partition counts again.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from agent.engine.language import Comparison, Expr, Variable
from cloud.spark.expressions import bind, compare, reduce_group

if TYPE_CHECKING:  # pragma: no cover
    from pyspark import Accumulator
    from pyspark.broadcast import Broadcast
    from pyspark.sql import Column

RESULT_FIELDS = ("id", "text")  # a computed number: its id if known, else its repr


def result_type():
    from pyspark.sql import types as T

    return T.StructType(
        [T.StructField("id", T.LongType(), True), T.StructField("text", T.StringType(), True)]
    )


def comparison_column(
    comparison: Comparison,
    variables: Sequence[Variable],
    columns: Sequence[str],
    dictionary: Broadcast,
    errors: Accumulator,
) -> Column:
    """A boolean column: the comparison holds (False on a run-time error, which is counted)."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    names = tuple(variables)

    def holds(*ids: int) -> bool:
        result = compare(comparison, dictionary.value.values, dict(zip(names, ids, strict=True)))
        if result is None:
            errors.add(1)
            return False
        return result

    udf = F.udf(holds, T.BooleanType(), useArrow=False)
    return udf(*[F.col(c) for c in columns])


def bind_column(
    expr: Expr,
    variables: Sequence[Variable],
    columns: Sequence[str],
    dictionary: Broadcast,
    errors: Accumulator,
) -> Column:
    """A ``struct<id, text>`` column with the bind's result, null on a run-time error."""
    from pyspark.sql import functions as F

    names = tuple(variables)

    def compute(*ids: int):
        result = bind(expr, dictionary.value, dict(zip(names, ids, strict=True)))
        if result is None:
            errors.add(1)
        return result

    udf = F.udf(compute, result_type(), useArrow=False)
    return udf(*[F.col(c) for c in columns])


def aggregate_column(
    function: str, column: str, dictionary: Broadcast, errors: Accumulator
) -> Column:
    """A ``struct<id, text>`` column reducing an ``array<long>`` of argument ids with the
    engine's aggregate function; null when the group yields no fact."""
    from pyspark.sql import functions as F

    def reduce(ids: list[int]):
        result, failed = reduce_group(function, ids, dictionary.value)
        if failed:
            errors.add(failed)
        return result

    udf = F.udf(reduce, result_type(), useArrow=False)
    return udf(F.col(column))
