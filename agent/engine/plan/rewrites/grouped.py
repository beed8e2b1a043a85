"""Grouped join: one output tuple per distinct head, not one per derivation. When the first
step scans a binary atom ``(h, j)`` whose ``h`` is the only head variable besides the product's
new variable and whose ``j`` is not in the head, the scan splits into an outer loop over ``h``
and an inner one over ``j``, and the product's buckets are unioned per ``h``.

Before (a product), for ``p(X, Z) :- q(X, Y), r(Y, Z)``::

    for v0, v1 in T0_0:                 # q(X, Y): one pass per path X -> Y -> Z
        B = I1_0.get(v1)
        if B is None: continue
        out.update(zip(repeat(v0), B))

After::

    for v0, J in G0.items():            # q grouped by X
        A = set()
        for v1 in J:
            B = I1_0.get(v1)
            if B is not None: A |= B
        if A: out.update(zip(repeat(v0), A))

On closures this is the difference between n^2 and n^3 tuples built.
"""

from __future__ import annotations

from dataclasses import dataclass

from agent.engine.language import Variable
from agent.engine.plan.planner import Plan, ScanStep
from agent.engine.plan.rewrites.base import Context, Node, Shape
from agent.engine.plan.rewrites.product import new_variable, product_index


@dataclass(frozen=True)
class GroupedJoin(Node):
    """``group``/``inner``: the first atom's head variable and its other variable; ``at``: the
    product's step index."""

    group: Variable
    inner: Variable
    at: int

    shape = Shape.GROUPED_JOIN

    def describe(self) -> str:
        steps = self.plan.steps
        middle = " -> ".join(map(str, steps[1 : self.at]))
        inner = f"{middle} -> " if middle else ""
        return (
            f"grouped join: {steps[0]} grouped by {self.group} -> for each {self.inner}: "
            f"{inner}union of {steps[self.at]}"
        )


def grouped_join(plan: Plan, context: Context) -> GroupedJoin | None:
    steps = plan.steps
    at = product_index(plan, context)
    if not at:
        return None
    first, product = steps[0], steps[at]
    if not isinstance(first, ScanStep) or first.atom.arity != 2 or first.bound:
        return None
    a, b = first.atom.terms
    if not (isinstance(a, Variable) and isinstance(b, Variable)) or a == b:
        return None
    head = context.head_terms
    new = new_variable(product)
    if new not in head:
        return None
    head_vars = {t for t in head if isinstance(t, Variable)} - {new}
    if a in head_vars and b not in head:
        group, inner = a, b
    elif b in head_vars and a not in head:
        group, inner = b, a
    else:
        return None
    if head_vars != {group}:
        return None
    for later in steps[at + 1 :]:
        left, right = later.comparison.left, later.comparison.right
        other = right if left == new else left
        if isinstance(other, Variable) and other != group:
            return None
    return GroupedJoin(plan, group, inner, at)
