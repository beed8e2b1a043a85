"""Existential split: when the caller only needs to know whether each head has *some* match
(a maintenance check with the head bound), the steps after the head is fully bound move into an
inner function that returns at the first match.

Before, for ``h(X) :- a(X, Y), b(Y, Z)`` with only existence wanted::

    for v0, v1 in T0_0:                 # a(X, Y): X bound here
        for v2 in I1_0.get(v1) or ():   # b(Y, Z): every match enumerated
            out.add((v0,))

After::

    def _rest(v0, v1):
        for v2 in I1_0.get(v1) or ():
            return True
        return False
    for v0, v1 in T0_0:
        if _rest(v0, v1): out.add((v0,))
"""

from __future__ import annotations

from dataclasses import dataclass

from agent.engine.language import Variable
from agent.engine.plan.planner import BindStep, Plan, ScanStep
from agent.engine.plan.rewrites.base import Context, Node, Shape


@dataclass(frozen=True)
class ExistsSplit(Node):
    """``split``: the index of the step after which every head variable is bound."""

    split: int

    shape = Shape.EXISTS

    def describe(self) -> str:
        steps = self.plan.steps
        outer = " -> ".join(map(str, steps[: self.split + 1]))
        inner = " -> ".join(map(str, steps[self.split + 1 :]))
        return f"exists: {outer} -> first match of ({inner})"


def exists_split(plan: Plan, context: Context) -> ExistsSplit | None:
    if not context.exists:
        return None
    wanted = {t for t in context.head_terms if isinstance(t, Variable)}
    bound: set[Variable] = set()
    for index, step in enumerate(plan.steps):
        if isinstance(step, ScanStep):
            bound |= step.atom.variables()
        elif isinstance(step, BindStep):
            bound.add(step.bind.variable)
        if wanted <= bound:
            return ExistsSplit(plan, index) if index + 1 < len(plan.steps) else None
    return None
