"""Projection: a rule whose body is one atom of distinct variables, and whose head only uses
them, is a whole relation copied, permuted or projected in one C-level call.

Before (nested loops)::

    for v0, v1 in T0_0:                 # q(X, Y)
        out.add((v1, v0))               # p(Y, X)

After::

    out.update(zip(map(COLUMN(1), T), map(COLUMN(0), T)))

Sub-property and inverse-property rules and the copy cycles of Rule Set 2 take this shape.
"""

from __future__ import annotations

from dataclasses import dataclass

from agent.engine.plan.planner import Plan, ScanStep
from agent.engine.plan.rewrites.base import Context, Node, Shape, distinct_variables


@dataclass(frozen=True)
class Projection(Node):
    """The atom's column of each head term (identity: the atom's tuples are the heads)."""

    step: ScanStep
    columns: tuple[int, ...]

    shape = Shape.PROJECTION

    def describe(self) -> str:
        source = "Δ" if self.step.delta else ""
        return f"projection: {source}{self.step.atom} -> columns {list(self.columns)}"


def projection(plan: Plan, context: Context) -> Projection | None:
    steps = plan.steps
    if len(steps) != 1 or not isinstance(steps[0], ScanStep) or steps[0].bound:
        return None
    terms = steps[0].atom.terms
    head = context.head_terms
    if not distinct_variables(terms) or not head or not all(t in terms for t in head):
        return None
    return Projection(plan, steps[0], tuple(terms.index(t) for t in head))
