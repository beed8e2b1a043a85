"""The driver's term dictionary, and how Spark sees it.

Facts reach Spark as tuples of term ids (LONG columns ``c0 .. cN``), encoded on the driver with
the engine's own :class:`~agent.engine.terms.TermDictionary`: numerically equal numbers share
one id (``5`` and ``5.0``), booleans stay apart from numbers, so term identity is id equality and
joins, ``=``/``!=`` and set operations run on plain LONGs.

Values are needed only by binds, ordering comparisons and aggregates; their UDFs read a broadcast
snapshot of the dictionary (:meth:`TermSpace.broadcast`). Binds and aggregates may compute values
(numbers, skolem IRIs) the dictionary has never seen: the UDFs report those by their text
(``expressions.number_result``) and :meth:`TermSpace.resolve`
collects the distinct new ones, encodes them here on the driver (so every id is the driver's)
and joins the ids back in. Encoding order mirrors the engine's: explicit facts first, then rule
constants and computed values stratum by stratum.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from agent.engine.language import RDF_TYPE, Atom, Value
from agent.engine.terms import TermDictionary
from cloud.spark.expressions import Dictionary, parse_value

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.broadcast import Broadcast
    from pyspark.sql import DataFrame, SparkSession

RelationKey = tuple[str, int]


class TermSpace:
    """A TermDictionary plus its Spark-side views (broadcast snapshot, error accumulator)."""

    def __init__(self, spark: SparkSession, terms: TermDictionary | None = None) -> None:
        self.spark = spark
        self.terms = terms if terms is not None else TermDictionary()
        self.errors = spark.sparkContext.accumulator(0)
        self._snapshot: Broadcast | None = None
        self._snapshot_size = -1
        self._snapshots: list[Broadcast] = []

    # ------------------------------------------------------------------ encoding
    def encode(self, value: Value) -> int:
        return self.terms.encode(value)

    def decode(self, term_id: int) -> Value:
        return self.terms.values[term_id]

    def encode_fact(self, fact: tuple | Atom) -> tuple[RelationKey, tuple[int, ...]]:
        """A fact as ``Reasoner.add_facts`` takes it -> ``(relation, ids)``; same shapes and
        errors as the engine (``TermDictionary.encode_fact``)."""
        return self.terms.encode_fact(fact)

    def encode_facts(self, facts: Iterable[tuple | Atom]) -> dict[RelationKey, set[tuple]]:
        grouped: dict[RelationKey, set[tuple]] = {}
        for fact in facts:
            key, ids = self.encode_fact(fact)
            grouped.setdefault(key, set()).add(ids)
        return grouped

    def external(self, key: RelationKey, ids: tuple[int, ...]) -> tuple:
        """Ids of a fact of ``key`` -> the tuple ``Reasoner.facts()`` yields."""
        values = self.terms.values
        name, arity = key
        if arity == 1:
            return (RDF_TYPE, values[ids[0]], name)
        return (name, *(values[i] for i in ids))

    # ------------------------------------------------------------------ Spark views
    def broadcast(self) -> Broadcast:
        """A snapshot of the dictionary for UDFs, rebroadcast only when it has grown.

        Old snapshots stay alive (until :meth:`release`): lazily evaluated DataFrames built
        earlier may still read them."""
        size = len(self.terms)
        if self._snapshot is None or size != self._snapshot_size:
            self._snapshot = self.spark.sparkContext.broadcast(Dictionary(self.terms.values))
            self._snapshots.append(self._snapshot)
            self._snapshot_size = size
        return self._snapshot

    def resolve(self, df: DataFrame, result: str, out: str) -> DataFrame:
        """Replace the ``struct<id, text>`` column ``result`` (a computed number or IRI, from a
        UDF or from ``count``) with its term id in column ``out``.

        New values are collected (distinct, so usually few), encoded here and joined back.
        Rows whose ``result`` is null (a run-time error, an empty group) are dropped. The
        caller caches ``df``: it is read twice."""
        from pyspark.sql import functions as F

        df = df.where(F.col(result).isNotNull())
        new_texts = [
            row[0]
            for row in df.where(F.col(f"{result}.id").isNull())
            .select(F.col(f"{result}.text"))
            .distinct()
            .collect()
        ]
        if not new_texts:
            return df.withColumn(out, F.col(f"{result}.id")).drop(result)
        mapping = self.spark.createDataFrame(
            [(text, self.encode(parse_value(text))) for text in new_texts],
            "__text string, __new long",
        )
        joined = df.withColumn("__text", F.col(f"{result}.text")).join(
            F.broadcast(mapping), on="__text", how="left"
        )
        return joined.withColumn(out, F.coalesce(F.col(f"{result}.id"), F.col("__new"))).drop(
            result, "__text", "__new"
        )

    @property
    def runtime_errors(self) -> int:
        return int(self.errors.value)

    def release(self) -> None:
        """Drop the executors' copies of the broadcast snapshots (the driver keeps the values,
        so a UDF that runs again still works: it fetches them anew)."""
        for snapshot in self._snapshots:
            snapshot.unpersist()
        self._snapshots.clear()
        self._snapshot = None
