"""Evaluation of an aggregate rule (a hyper-node of its own: aggregation through recursion is
refused at stratification).

1. The aggregate body is compiled like any rule body, its "head" being the tuple of all body
   variables, so the output set holds exactly the distinct substitutions.
2. Substitutions are grouped by the ``on`` variables and reduced (aggregates.py).
3. The rows ``(group..., result)`` go through the rule's remaining comparisons and binds to the
   head, compiled against a temporary relation holding the rows.
"""

from __future__ import annotations

import time

from ..aggregates import aggregate_value
from ..executor import Executor
from ..language import Aggregate, Atom, Bind, Constant, Negation, Rule, Variable
from ..store import Relation
from .base import Module, NodeState

ROWS_PREDICATE = "zodiac:aggregate-rows"


def substitution_variables(aggregate: Aggregate) -> tuple[Variable, ...]:
    """Variables bound by the aggregate body (positive atoms and binds), in a fixed order."""
    found: set[Variable] = set()
    for item in aggregate.body:
        if isinstance(item, Atom):
            found |= item.variables()
        elif isinstance(item, Bind):
            found.add(item.variable)
    return tuple(sorted(found, key=lambda v: v.name))


class AggregateModule(Module):
    name = "aggregate"

    def materialise(self, node: NodeState, executor: Executor) -> None:
        started = time.perf_counter()
        for rule in node.rules:
            heads = self.evaluate(rule, node, executor)
            node.own(rule.head.relation).add_all(heads)
        node.stats.update(rounds=1, seconds=time.perf_counter() - started)

    def evaluate(self, rule: Rule, node: NodeState, executor: Executor) -> set:
        aggregate = rule.aggregate()
        assert aggregate is not None
        variables = substitution_variables(aggregate)
        substitutions: set[tuple[int, ...]] = set()
        executor.run(
            rule,
            node.view,
            substitutions,
            body=aggregate.body,
            head_terms=variables,
            cache_key=f"{rule.id}#body",
        )
        rows = self.reduce(aggregate, variables, substitutions, executor)
        return self.finish(rule, aggregate, rows, node, executor)

    @staticmethod
    def reduce(
        aggregate: Aggregate,
        variables: tuple[Variable, ...],
        substitutions: set[tuple[int, ...]],
        executor: Executor,
    ) -> set[tuple[int, ...]]:
        """Group the substitutions and compute one ``(group..., result)`` row per group."""
        terms = executor.terms
        group_columns = [variables.index(v) for v in aggregate.group_by]
        argument = aggregate.argument
        groups: dict[tuple[int, ...], list] = {}
        for substitution in substitutions:
            key = tuple(substitution[c] for c in group_columns)
            if isinstance(argument, Constant):
                value = argument.value
            else:
                value = terms.values[substitution[variables.index(argument)]]
            groups.setdefault(key, []).append(value)
        rows: set[tuple[int, ...]] = set()
        for key, values in groups.items():
            result, errors = aggregate_value(aggregate.function, values)
            executor.errors[0] += errors
            if result is None:
                continue
            try:
                rows.add(key + (terms.encode(result),))
            except ValueError:
                executor.errors[0] += 1
        return rows

    @staticmethod
    def finish(
        rule: Rule,
        aggregate: Aggregate,
        rows: set[tuple[int, ...]],
        node: NodeState,
        executor: Executor,
    ) -> set:
        """Apply the rule's comparisons and binds to the rows and build head facts."""
        row_atom = Atom(ROWS_PREDICATE, aggregate.group_by + (aggregate.result,))
        post = [item for item in rule.body if not isinstance(item, (Aggregate, Atom, Negation))]
        table = Relation(row_atom.relation)
        table.add_all(rows)
        heads: set = set()
        executor.run(
            rule,
            node.view,
            heads,
            body=[row_atom, *post],
            sources=[[table]] + [[] for _ in post],
            cache_key=f"{rule.id}#head",
        )
        return heads
