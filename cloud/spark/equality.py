"""owl:sameAs in the Spark job: the engine's semantics (docs/semantics.md, "Equality") by
rewriting, with classes found as connected components of the equality graph.

The program splits as in the engine (``agent.engine.equality.component``): the *equality
component* (``owl:sameAs``, what it depends on, their rules: positive atoms only) and the rest.
The component is evaluated by rounds until nothing merges:

1. its rules run (the job's own hyper-node evaluation, on the driver when small), with
   ``owl:sameAs`` renamed to a reserved relation so that nothing treats it as equality there;
2. the equalities between two different terms are the edges of a graph whose connected
   components (``closures.component_labels``: large-star / small-star) are the new merges;
3. each class's representative is its smallest value in the engine's order
   (``sameas.classes.value_order``: chosen on the driver, over the merged terms only), and
   every relation of the component is rewritten to representatives.

Then the other explicit relations and the other rules' constants are rewritten, the rest of the
program runs as usual, and the result is expanded: every fact for every combination of the
names of its terms' classes (a join per column with the members of the classes).
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import product
from typing import TYPE_CHECKING, Any

from agent.engine.equality.classes import value_order
from agent.engine.equality.component import EDGE, SAME_AS, equality_component, normal_rule, renamed
from agent.engine.language import Rule
from agent.engine.program.dependency import build_hyper_graph, execution_plan
from cloud.spark.closures import component_labels
from cloud.spark.frames import columns, settle

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import DataFrame

    from cloud.spark.terms import RelationKey


class SparkEquality:
    """The classes of one materialisation (term id -> representative id, merged terms only)
    and the steps that rewrite and expand the job's relations."""

    def __init__(self, job: Any, run_node: Callable) -> None:
        self.job = job  # the materialisation's relations (materialise._Job)
        self.run_node = run_node  # (step, HyperNode, reports) -> report, counts kept
        self.rep: dict[int, int] = {}
        self.rounds = 0
        self.reports: list = []  # the component's hyper-nodes, every round

    # ------------------------------------------------------------------ the component
    def materialise(self, rules: list[Rule]) -> list[Rule]:
        """Evaluate the equality component by rounds (module docstring) and rewrite the other
        relations; returns the other rules, their constants rewritten."""
        component, relations = equality_component(rules)
        inside = {rule.key for rule in component}
        job = self.job
        self._move(SAME_AS, EDGE)
        relations = (relations - {SAME_AS}) | {EDGE}
        while True:
            self.rounds += 1
            graph = build_hyper_graph([normal_rule(renamed(r), self.value) for r in component])
            for step in execution_plan(graph, range(len(graph.nodes))):
                self.run_node(step, graph.nodes[step], self.reports)
            merges = self._merges()
            if not merges:
                break
            for key in relations:
                self._rewrite(key, merges)
        self._move(EDGE, SAME_AS)
        for key in {*job.frames, *job.local} - relations - {SAME_AS}:
            self._rewrite(key, self.rep)
        return [normal_rule(rule, self.value) for rule in rules if rule.key not in inside]

    def value(self, value):
        """The value representing ``value`` (itself, the same object, when not merged)."""
        term = self.job.space.terms.lookup(value)
        rep = self.rep.get(term) if term is not None else None
        return value if rep is None else self.job.space.decode(rep)

    def _move(self, source: RelationKey, target: RelationKey) -> None:
        job = self.job
        if source in job.local:
            job.local[target] = job.local.pop(source)
        if source in job.frames:
            job.frames[target] = job.frames.pop(source)
        if source in job.counts:
            job.counts[target] = job.counts.pop(source)

    def _merges(self) -> dict[int, int]:
        """The new merges: connected components of the equalities between two terms, each
        term -> its class's smallest value (only terms whose representative changes)."""
        from pyspark.sql import functions as F

        job = self.job
        if EDGE in job.local:
            pairs = [(a, b) for a, b in job.local[EDGE] if a != b]
            if not pairs:
                return {}
            edges = job.spark.createDataFrame(pairs, "a long, b long")
        else:
            if EDGE not in job.frames:
                return {}
            edges = job.frame(EDGE).where(F.col("c0") != F.col("c1"))
            edges = edges.select(F.col("c0").alias("a"), F.col("c1").alias("b"))
            if edges.isEmpty():
                return {}
        vertices = edges.select(F.col("a").alias("v")).union(edges.select(F.col("b").alias("v")))
        labels = component_labels(vertices.distinct(), edges, job.tick).collect()
        classes: dict[int, list[int]] = {}
        for row in labels:
            classes.setdefault(row["label"], []).append(row["v"])
        decode = job.space.decode
        merges: dict[int, int] = {}
        for members in classes.values():
            rep = min(members, key=lambda term: value_order(decode(term)))
            merges.update({term: rep for term in members if term != rep})
        for term, rep in list(self.rep.items()):  # earlier merges follow their representative
            self.rep[term] = merges.get(rep, rep)
        self.rep.update(merges)
        return merges

    def _rewrite(self, key: RelationKey, mapping: dict[int, int]) -> None:
        """The relation with every term of ``mapping`` replaced (distinct facts)."""
        job = self.job
        if not mapping:
            return
        if key in job.local:
            rows = {tuple(mapping.get(t, t) for t in row) for row in job.local[key]}
            job.local[key] = rows
            job.counts[key] = len(rows)
            job.frames.pop(key, None)
            return
        if key not in job.frames:
            return
        table = job.spark.createDataFrame(sorted(mapping.items()), "term long, rep long")
        job.frames[key], job.counts[key] = _through(job.frames[key], key[1], table)

    # ------------------------------------------------------------------ expansion
    def expand(self, frames: dict, local: dict, counts: dict) -> None:
        """Every relation expanded to every name of its terms' classes, in place."""
        if not self.rep:
            return
        members: dict[int, list[int]] = {}
        for term, rep in self.rep.items():
            members.setdefault(rep, [rep]).append(term)
        for key in list(local):
            rows = set()
            for row in local[key]:
                rows.update(product(*(members.get(t, (t,)) for t in row)))
            local[key] = rows
            counts[key] = len(rows)
            frames.pop(key, None)
        pairs = [(rep, name) for rep, names in members.items() for name in names]
        table = self.job.spark.createDataFrame(sorted(pairs), "term long, rep long")
        for key in [k for k in frames if k not in local]:
            frames[key], counts[key] = _through(frames[key], key[1], table)


def _through(frame: DataFrame, arity: int, table: DataFrame) -> tuple[DataFrame, int]:
    """Every column of ``frame`` replaced through ``table`` (``_replace_column``), distinct,
    settled, with its size."""
    for column in columns(arity):
        frame = _replace_column(frame, column, table)
    return settle(frame.distinct())


def _replace_column(frame: DataFrame, column: str, table: DataFrame) -> DataFrame:
    """``frame`` with ``column`` replaced through ``table`` (``term -> rep``; several rows of
    one term give a row each), terms not in it kept."""
    from pyspark.sql import functions as F

    term, rep = f"__term_{column}", f"__rep_{column}"
    renamed_table = table.select(F.col("term").alias(term), F.col("rep").alias(rep))
    joined = frame.join(F.broadcast(renamed_table), F.col(column) == F.col(term), "left")
    replaced = [
        F.coalesce(F.col(rep), F.col(c)).alias(c) if c == column else F.col(c)
        for c in frame.columns
    ]
    return joined.select(*replaced)
