"""What every physical plan node shares: its shape, the logical plan it evaluates, and a text
that says what the generated code will do.

The planner (``planner.py``) orders a rule's body into a logical :class:`~..planner.Plan`; a
rewrite (one module per shape in this package) recognises a plan it can run faster and wraps it
in a node; the compiler (``compiler.py``) emits code for the node and nothing else. A plan no
rewrite claims is run as :class:`NestedLoops`.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

from agent.engine.language import Term, Variable
from agent.engine.plan.planner import BindStep, Plan, ScanStep, Step


class Shape(enum.Enum):
    """The form of the code generated for a plan (``CompiledEntry.shape``)."""

    EMPTY = "empty"  # a positive atom has no facts: nothing to do
    PROJECTION = "projection"  # one atom copied, permuted or projected, in C
    KEY_FILTER = "key filter"  # one atom's facts kept by key lookups in the others, in C
    EXISTS = "exists"  # head bound first, the rest stops at its first match
    GROUPED_JOIN = "grouped join"  # one output tuple per distinct head, buckets unioned
    PRODUCT = "product"  # nested loops whose innermost atom is a C-level set operation
    NESTED_LOOPS = "nested loops"  # one Python loop per atom
    SEGMENTED = "segmented"  # nested loops spread over functions (deeper than Python allows)


@dataclass(frozen=True)
class Context:
    """What a rewrite may look at besides the plan: the terms the head is built from (a
    maintenance variant may bind them), the number of stores each body position reads, and
    whether only the existence of a match per head matters."""

    head_terms: tuple[Term, ...]
    counts: dict[int, int]
    exists: bool = False


@dataclass(frozen=True)
class Node:
    """A plan with the shape it will be compiled as."""

    plan: Plan

    shape = Shape.NESTED_LOOPS

    def describe(self) -> str:
        return f"{self.shape.value}: {self.plan.describe()}"


@dataclass(frozen=True)
class NestedLoops(Node):
    """The general case: a loop (or an index lookup) per atom, filters and binds between."""


@dataclass(frozen=True)
class Empty(Node):
    """A positive atom reads no stores, so the rule derives nothing: the code is ``return``."""

    position: int

    shape = Shape.EMPTY

    def describe(self) -> str:
        return f"empty: {self.plan.rule.body[self.position]} has no facts"


def empty(plan: Plan, context: Context) -> Empty | None:
    for step in plan.steps:
        if isinstance(step, ScanStep) and not step.delta and not context.counts.get(step.position):
            return Empty(plan, step.position)
    return None


def distinct_variables(terms: Sequence[Term]) -> bool:
    return all(isinstance(t, Variable) for t in terms) and len(set(terms)) == len(terms)


def bound_before(steps: Sequence[Step], index: int) -> set[Variable]:
    """The variables bound by the steps before ``index``."""
    bound: set[Variable] = set()
    for step in steps[:index]:
        if isinstance(step, ScanStep):
            bound |= step.atom.variables()
        elif isinstance(step, BindStep):
            bound.add(step.bind.variable)
    return bound
