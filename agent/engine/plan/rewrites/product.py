"""Product: the innermost atom becomes a C-level set operation when its only new variable flows
straight to the head (possibly minus ``!=`` exclusions). On closure rules that is where nearly
all the time goes.

Before, for ``p(X, Y) :- Δp(X, Z), p(Z, Y), COMP(X, !=, Y)``::

    for v0, v1 in D:                    # Δp(X, Z)
        for v2 in I1_0.get(v1) or ():   # p(Z, Y)
            if v0 == v2: continue       # X != Y
            out.add((v0, v2))

After::

    for v0, v1 in D:
        B = I1_0.get(v1)
        if B is None: continue
        if v0 in B: B = B - {v0}
        out.update(zip(repeat(v0), B))

An innermost atom with several free columns (its index's buckets hold tuples) runs so too when
its free variables are all new and distinct and nothing follows it: the head's columns are
cut out of the bucket in C, one ``map`` each over the same set (a set unchanged meanwhile
iterates in one order). For rdfs7, ``triple(X, R, Y) :- triple(P, <sp>, R) and triple(X, P,
Y)``, the loop over the facts of predicate ``P``::

    out.update(zip(map(COLUMN(0), B), repeat(v1), map(COLUMN(1), B)))
"""

from __future__ import annotations

from dataclasses import dataclass

from agent.engine.language import Constant, Variable
from agent.engine.plan.planner import FilterStep, Plan, ScanStep
from agent.engine.plan.rewrites.base import Context, Node, Shape, bound_before


@dataclass(frozen=True)
class Product(Node):
    """``at``: the index of the scan run as a set operation (the last one)."""

    at: int

    shape = Shape.PRODUCT

    def describe(self) -> str:
        steps = self.plan.steps
        loops = " -> ".join(map(str, steps[: self.at]))
        tail = " -> ".join(map(str, steps[self.at :]))
        return f"product: {loops} -> set operation ({tail})"


def product_index(plan: Plan, context: Context) -> int | None:
    """Index of the last scan if it can run as a set operation, else None."""
    steps = plan.steps
    scans = [i for i, s in enumerate(steps) if isinstance(s, ScanStep)]
    if not scans:
        return None
    index = scans[-1]
    step = steps[index]
    atom = step.atom
    if step.delta or not step.bound or len(step.bound) != atom.arity - 1:
        return None
    new = new_variable(step)
    if not isinstance(new, Variable) or any(atom.terms[c] == new for c in step.bound):
        return None
    if new in bound_before(steps, index):
        return None
    for later in steps[index + 1 :]:
        if not isinstance(later, FilterStep):
            return None
        comparison = later.comparison
        if comparison.op != "!=" or not (is_term(comparison.left) and is_term(comparison.right)):
            return None
        sides = (comparison.left, comparison.right)
        if new not in sides or sides[0] == sides[1]:
            return None
    head = context.head_terms
    if sum(1 for t in head if t == new) > 1:
        return None
    if new not in head and len(steps) > index + 1:
        return None
    return index


def product(plan: Plan, context: Context) -> Product | None:
    index = product_index(plan, context)
    if index is None:
        index = tuple_product_index(plan, context)
    return None if index is None else Product(plan, index)


def tuple_product_index(plan: Plan, context: Context) -> int | None:
    """Index of the last step if it is a scan with several free columns that can run as a
    set operation (the head's columns cut out of its bucket of tuples), else None."""
    steps = plan.steps
    index = len(steps) - 1
    step = steps[index]
    if not isinstance(step, ScanStep) or step.delta or not step.bound:
        return None
    if len(step.bound) >= step.atom.arity - 1:
        return None
    return index if tuple_bucket(steps, index, context) else None


def tuple_bucket(steps, index: int, context: Context) -> bool:
    """Whether the scan at ``index``, the last step, with several free columns, can run as a
    set operation: its free columns hold new variables, distinct, each in the head at most
    once (a repeated or already bound variable is an equality test per tuple: nested loops)."""
    step = steps[index]
    free = free_terms(step)
    if not all(isinstance(t, Variable) for t in free) or len(set(free)) != len(free):
        return False
    if set(free) & bound_before(steps, index):
        return False
    return all(sum(1 for t in context.head_terms if t == new) <= 1 for new in free)


def free_terms(step: ScanStep) -> list:
    """The terms in the columns of ``step`` not bound before it, in column order (the order
    of an index bucket's tuples)."""
    atom = step.atom
    return [atom.terms[c] for c in range(atom.arity) if c not in step.bound]


def new_variable(step: ScanStep):
    """The term in the one column of ``step`` that is not bound before it."""
    atom = step.atom
    return next(atom.terms[c] for c in range(atom.arity) if c not in step.bound)


def excluded_by(filters, new: Variable) -> list:
    """The terms ``new`` must differ from, one per ``!=`` filter after the product."""
    excluded = []
    for later in filters:
        left, right = later.comparison.left, later.comparison.right
        excluded.append(right if left == new else left)
    return excluded


def is_term(expr) -> bool:
    return isinstance(expr, (Variable, Constant))
