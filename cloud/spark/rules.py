"""One rule body as a DataFrame pipeline: joins, filters, anti-joins, binds, aggregates.

A relation ``(name, arity)`` is a DataFrame of distinct term-id tuples in LONG columns
``c0 .. c{arity-1}``. A rule body becomes, with one column per variable (``v0``, ``v1``...):

* positive atom: its relation, filtered on constants (``c_i = id``) and repeated variables
  (``c_i = c_j``), projected on its variables, then inner-joined with what came before on the
  shared variables (a cross join when there are none, a semi-join for a ground atom);
* ``not atom``: a left anti-join on the atom's non-existential variables only; an existential
  variable (one occurring in no other body item, ``_`` included) is projected away, or, when
  repeated inside the atom, becomes an equality filter on the negated relation first;
* ``=`` / ``!=`` between terms: a comparison of ids (the dictionary makes numeric equality term
  identity); any other comparison, and ``bind``, a UDF calling the engine's functions
  (:mod:`.udfs`);
* items are placed as soon as their variables are bound, as the engine's planner does (which
  only affects how much work is done: a bind or comparison depends on its own variables alone);
* aggregates: the aggregate body as above, projected on *all* its variables and made distinct
  (aggregates range over distinct substitutions, ``_`` included), grouped by the ``on``
  variables; ``count`` is Spark's, the others the engine's function over ``collect_list``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from functools import reduce
from typing import TYPE_CHECKING

from agent.engine.language import (
    Aggregate,
    Atom,
    Bind,
    Comparison,
    Constant,
    Negation,
    Rule,
    Term,
    Variable,
    expr_variables,
    item_variables,
)
from agent.engine.modules.aggregate import substitution_variables
from cloud.spark.expressions import EVAL_ERRORS, compare, evaluate
from cloud.spark.terms import RelationKey, TermSpace
from cloud.spark.udfs import aggregate_column, bind_column, comparison_column

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import Column, DataFrame

Frames = Callable[[RelationKey], "DataFrame"]


class Body:
    """The substitutions of a body, built item by item (one instance per evaluation)."""

    def __init__(self, space: TermSpace, frames: Frames, keep: list[DataFrame]) -> None:
        self.space = space
        self.frames = frames
        self.keep = keep  # DataFrames persisted here, unpersisted by the caller when done
        self.names: dict[Variable, str] = {}
        self.fresh = 0  # next column number: names never repeat, even for adopted variables
        self.bound: set[Variable] = set()
        self.current: DataFrame | None = None
        self.occurrences: Counter[Variable] = Counter()

    # ------------------------------------------------------------------ helpers
    def name(self, variable: Variable) -> str:
        found = self.names.get(variable)
        if found is None:
            found = self.names[variable] = f"v{self.fresh}"
            self.fresh += 1
        return found

    def term(self, term: Term) -> Column:
        from pyspark.sql import functions as F

        if isinstance(term, Variable):
            return F.col(self.names[term])
        return F.lit(self.space.encode(term.value))

    def one_row(self) -> DataFrame:
        """The single empty substitution: where a body without positive atoms starts."""
        return self.space.spark.range(1).select()

    def persist(self, df: DataFrame) -> DataFrame:
        df = df.persist()
        self.keep.append(df)
        return df

    # ------------------------------------------------------------------ evaluation
    def run(
        self,
        items: Sequence,
        delta: tuple[int, DataFrame] | None = None,
        start: DataFrame | None = None,
    ) -> Body:
        """Evaluate ``items``; ``delta`` = (body position, frame) replaces that atom's relation
        (seminaive evaluation); ``start`` seeds the substitutions (columns already named and
        bound: the rows of an aggregate)."""
        for item in items:
            self.occurrences.update(item_variables(item))
        atoms = [(i, item) for i, item in enumerate(items) if isinstance(item, Atom)]
        pending = [item for item in items if not isinstance(item, Atom)]
        if start is not None:
            self.current = start
        elif not atoms:
            self.current = self.one_row()
        if delta is not None:
            atoms.sort(key=lambda entry: entry[0] != delta[0])
        while atoms:
            index = self.next_atom(atoms)
            position, atom = atoms.pop(index)
            source = delta[1] if delta is not None and position == delta[0] else None
            self.join(atom, source if source is not None else self.frames(atom.relation))
            self.drain(pending)
        self.drain(pending)
        if pending:  # validation makes every rule safe: this is a bug, not a user error
            raise ValueError(f"cannot place {', '.join(map(str, pending))}: unbound variables")
        return self

    def next_atom(self, atoms: list[tuple[int, Atom]]) -> int:
        """The first atom (the delta atom, sorted first), then the one sharing most bound
        variables (joins before cross products), ties broken by body position."""
        if self.current is None:
            return 0
        shared = [len(atom.variables() & self.bound) for _, atom in atoms]
        return max(range(len(atoms)), key=lambda i: (shared[i] > 0, shared[i], -atoms[i][0]))

    def drain(self, pending: list) -> None:
        """Apply every comparison, bind and negation whose needed variables are bound."""
        if self.current is None:
            return
        progress = True
        while progress:
            progress = False
            for item in list(pending):
                if isinstance(item, Comparison) and item.variables() <= self.bound:
                    self.compare(item)
                elif isinstance(item, Bind) and expr_variables(item.expr) <= self.bound:
                    self.bind(item)
                elif isinstance(item, Negation) and self.needed(item.atom) <= self.bound:
                    self.negate(item.atom)
                else:
                    continue
                pending.remove(item)
                progress = True

    def needed(self, atom: Atom) -> set[Variable]:
        """The non-existential variables of a negated atom: those other items mention."""
        return {v for v in atom.variables() if self.occurrences[v] > 1}

    # ------------------------------------------------------------------ items
    def join(self, atom: Atom, frame: DataFrame) -> None:
        from pyspark.sql import functions as F

        conditions: list[Column] = []
        first: dict[Variable, int] = {}
        for i, term in enumerate(atom.terms):
            if isinstance(term, Constant):
                conditions.append(F.col(f"c{i}") == F.lit(self.space.encode(term.value)))
            elif term in first:
                conditions.append(F.col(f"c{i}") == F.col(f"c{first[term]}"))
            else:
                first[term] = i
        if conditions:
            frame = frame.where(reduce(lambda a, b: a & b, conditions))
        frame = frame.select([F.col(f"c{i}").alias(self.name(v)) for v, i in first.items()])
        shared = [self.names[v] for v in first if v in self.bound]
        if self.current is None:
            self.current = frame
        elif shared:
            self.current = self.current.join(frame, on=shared, how="inner")
        elif not first:  # a ground atom: a test that the fact exists
            self.current = self.current.join(frame, how="left_semi")
        else:
            self.current = self.current.crossJoin(frame)
        self.bound.update(first)

    def negate(self, atom: Atom) -> None:
        from pyspark.sql import functions as F

        needed = self.needed(atom)
        conditions: list[Column] = []
        keep: dict[Variable, int] = {}
        existential: dict[Variable, int] = {}
        for i, term in enumerate(atom.terms):
            if isinstance(term, Constant):
                conditions.append(F.col(f"c{i}") == F.lit(self.space.encode(term.value)))
                continue
            seen = keep if term in needed else existential
            if term in seen:  # not p(Y, Z, Z): the repeated variable still means equal values
                conditions.append(F.col(f"c{i}") == F.col(f"c{seen[term]}"))
            else:
                seen[term] = i
        frame = self.frames(atom.relation)
        if conditions:
            frame = frame.where(reduce(lambda a, b: a & b, conditions))
        frame = frame.select([F.col(f"c{i}").alias(self.names[v]) for v, i in keep.items()])
        on = [self.names[v] for v in keep]
        assert self.current is not None
        if on:
            self.current = self.current.join(frame, on=on, how="left_anti")
        else:  # "no such fact at all"
            self.current = self.current.join(frame, how="left_anti")

    def compare(self, comparison: Comparison) -> None:
        from pyspark.sql import functions as F

        assert self.current is not None
        left, right, op = comparison.left, comparison.right, comparison.op
        variables = sorted(comparison.variables(), key=lambda v: self.names[v])
        if op in ("=", "!=") and _is_term(left) and _is_term(right):
            a, b = self.term(left), self.term(right)
            condition = a == b if op == "=" else a != b
        elif not variables:  # constants only: decide here, once
            holds = compare(comparison, self.space.terms.values, {})
            if holds is None:
                self.space.errors.add(1)
            condition = F.lit(bool(holds))
        else:
            condition = comparison_column(
                comparison,
                variables,
                [self.names[v] for v in variables],
                self.space.broadcast(),
                self.space.errors,
            )
        self.current = self.current.where(condition)

    def bind(self, item: Bind) -> None:
        from pyspark.sql import functions as F

        assert self.current is not None
        variables = sorted(expr_variables(item.expr), key=lambda v: self.names[v])
        target = self.name(item.variable)
        if not variables:  # a constant expression: compute it here, once, as the engine does
            try:
                found = self.space.encode(evaluate(item.expr, self.space.terms.values, {}))
            except EVAL_ERRORS:  # including encode's refusal of inf
                self.space.errors.add(1)
                self.current = self.current.where(F.lit(False))
                found = None
            self.current = self.current.withColumn(target, F.lit(found).cast("long"))
        else:
            computed = self.current.withColumn(
                "__result",
                bind_column(
                    item.expr,
                    variables,
                    [self.names[v] for v in variables],
                    self.space.broadcast(),
                    self.space.errors,
                ),
            )
            self.current = self.space.resolve(self.persist(computed), "__result", target)
        self.bound.add(item.variable)

    # ------------------------------------------------------------------ results
    def project(self, terms: Sequence[Term]) -> DataFrame:
        """Distinct tuples of ``terms`` as columns ``c0 ..``."""
        assert self.current is not None
        return self.current.select(
            [self.term(t).alias(f"c{i}") for i, t in enumerate(terms)]
        ).distinct()


def _is_term(expr: object) -> bool:
    return isinstance(expr, (Variable, Constant))


def evaluate_rule(
    rule: Rule,
    space: TermSpace,
    frames: Frames,
    keep: list[DataFrame],
    delta: tuple[int, DataFrame] | None = None,
) -> DataFrame:
    """The head facts ``rule`` derives (distinct, columns ``c0 ..``). ``delta`` = (body position
    of a positive atom, frame): that atom reads ``frame`` instead of its whole relation."""
    aggregate = rule.aggregate()
    if aggregate is not None:
        return evaluate_aggregate(rule, aggregate, space, frames, keep)
    return Body(space, frames, keep).run(rule.body, delta).project(rule.head.terms)


def evaluate_aggregate(
    rule: Rule,
    aggregate: Aggregate,
    space: TermSpace,
    frames: Frames,
    keep: list[DataFrame],
) -> DataFrame:
    """An aggregate rule: distinct substitutions of the aggregate body, grouped by the ``on``
    variables and reduced; then the rule's comparisons and binds on ``(group..., result)``."""
    from pyspark.sql import functions as F

    inner = Body(space, frames, keep).run(aggregate.body)
    assert inner.current is not None
    variables = substitution_variables(aggregate)
    substitutions = inner.current.select([inner.names[v] for v in variables]).distinct()
    group = list(dict.fromkeys(inner.names[v] for v in aggregate.group_by))
    argument = aggregate.argument
    value = inner.term(argument)
    size = F.count(F.lit(1)).alias("__size")
    if aggregate.function == "count":
        rows = substitutions.groupBy(*group).agg(size)
        result = F.struct(
            F.lit(None).cast("long").alias("id"), F.col("__size").cast("string").alias("text")
        )
    else:
        rows = substitutions.groupBy(*group).agg(F.collect_list(value).alias("__ids"), size)
        result = aggregate_column(aggregate.function, "__ids", space.broadcast(), space.errors)
    # A group exists only with a substitution (a global aggregate over nothing has no row).
    rows = rows.where(F.col("__size") > 0).withColumn("__result", result)
    outer = Body(space, frames, keep)
    outer.fresh = inner.fresh
    for v in aggregate.group_by:
        outer.names[v] = inner.names[v]
    target = outer.name(aggregate.result)
    rows = space.resolve(outer.persist(rows), "__result", target)
    rows = rows.select(*group, target)
    outer.bound = set(aggregate.group_by) | {aggregate.result}
    others = [item for item in rule.body if item is not aggregate]
    return outer.run(others, start=rows).project(rule.head.terms)
