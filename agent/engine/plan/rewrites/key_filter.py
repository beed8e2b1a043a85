"""Key filter, the compiled semi-join: the head takes its variables from one atom M, and every other
atom only tests that some (positive) or no (negated) fact matches M's values; each head is then one
of M's facts kept or dropped by key lookups, which ``compress`` over ``map`` does in C.

Before (nested loops), for ``p31(X, Y) :- p25(X, Y), p26(Y, Z)``::

    for v0, v1 in T0_0:                 # p25(X, Y)
        t1 = I1_0.get(v1)               # p26(Y, Z)
        if t1 is None: continue
        for v2 in t1:
            out.add((v0, v1))

After::

    K0 = S[1][0].index((0,))
    out.update(compress(T, map(K0.__contains__, map(COLUMN(1), T))))

Conditions: M has distinct variables (the delta atom, if the plan has one); every other atom's
remaining variables are its own (distinct, nowhere else); no comparison or bind.
"""

from __future__ import annotations

from dataclasses import dataclass

from agent.engine.language import Term, Variable
from agent.engine.plan.planner import NegationStep, Plan, ScanStep
from agent.engine.plan.rewrites.base import Context, Node, Shape, distinct_variables


@dataclass(frozen=True)
class Filter:
    """One other atom: its columns holding M's variables, and the M columns giving them."""

    step: ScanStep | NegationStep
    columns: tuple[int, ...]
    main_columns: tuple[int, ...]

    @property
    def negated(self) -> bool:
        return isinstance(self.step, NegationStep)


@dataclass(frozen=True)
class KeyFilter(Node):
    main: ScanStep
    filters: tuple[Filter, ...]

    shape = Shape.KEY_FILTER

    def describe(self) -> str:
        tests = [
            f"{'not ' if f.negated else ''}{f.step.atom} on columns {list(f.columns)}"
            for f in self.filters
        ]
        source = "Δ" if self.main.delta else ""
        return f"key filter: {source}{self.main.atom} kept by {'; '.join(tests)}"


def key_filter(plan: Plan, context: Context) -> KeyFilter | None:
    steps = plan.steps
    head = context.head_terms
    if len(steps) < 2 or not head or not all(isinstance(t, Variable) for t in head):
        return None
    if not all(isinstance(step, (ScanStep, NegationStep)) for step in steps):
        return None
    wanted = set(head)
    mains = [
        step
        for step in steps
        if isinstance(step, ScanStep)
        and (plan.delta_position is None or step.delta)
        and wanted <= set(step.atom.terms)
    ]
    if not mains:
        return None
    main = mains[0]
    terms = main.atom.terms
    if not distinct_variables(terms):
        return None
    seen: set[Term] = set(terms)
    filters = []
    for step in steps:
        if step is main:
            continue
        others = step.atom.terms
        if not distinct_variables(others):
            return None
        own = [t for t in others if t not in terms]
        if any(t in seen for t in own):
            return None  # a variable shared with another filter: a real join
        seen.update(own)
        columns = tuple(c for c, t in enumerate(others) if t in terms)
        if not columns:
            return None
        filters.append(Filter(step, columns, tuple(terms.index(others[c]) for c in columns)))
    return KeyFilter(plan, main, tuple(filters))
