"""Body ordering: turns a rule into a plan, a sequence of steps a join loop can run.

ZodiacEdge section 4.6: positive atoms are ordered greedily by the heuristic
``P(S,O) > P(?s,O) = P(S,?o) > P(?s,?o) > C(?s)`` (more bound columns first), ties broken by the
estimated size of the relation; when evaluating a delta, the delta atom goes first (it is the
smallest input by construction). Comparisons, binds and negations are placed as early as all
the variables they need are bound, so failing substitutions are dropped before the next join.

The plan is purely logical: it names body positions and bound columns, and the compiler turns
it into Python source after a rewrite (``rewrites/``) has chosen the
code's shape.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from agent.engine.language import (
    Atom,
    Bind,
    Comparison,
    Negation,
    Rule,
    Variable,
    expr_variables,
    item_variables,
)


@dataclass(frozen=True)
class ScanStep:
    """Match a positive atom. ``bound`` are the columns known before the step (constants or
    variables bound earlier); ``delta`` means the atom reads the delta set instead of its
    relations."""

    position: int  # index in rule.body: the slot of the atom's sources
    atom: Atom
    bound: tuple[int, ...]
    delta: bool = False

    def __str__(self) -> str:
        return f"{'Δ' if self.delta else ''}{self.atom}[bound {list(self.bound)}]"


@dataclass(frozen=True)
class FilterStep:
    comparison: Comparison

    def __str__(self) -> str:
        return str(self.comparison)


@dataclass(frozen=True)
class BindStep:
    bind: Bind

    def __str__(self) -> str:
        return str(self.bind)


@dataclass(frozen=True)
class NegationStep:
    """Check that no fact matches; ``bound`` are the non-existential columns (and constants)."""

    position: int
    atom: Atom
    bound: tuple[int, ...]

    def __str__(self) -> str:
        return f"not {self.atom}"


Step = ScanStep | FilterStep | BindStep | NegationStep


@dataclass(frozen=True)
class Plan:
    rule: Rule
    steps: tuple[Step, ...]
    delta_position: int | None

    def describe(self) -> str:
        return " -> ".join(map(str, self.steps))


def _bound_columns(atom: Atom, bound: set[Variable]) -> tuple[int, ...]:
    return tuple(i for i, t in enumerate(atom.terms) if not isinstance(t, Variable) or t in bound)


def _atom_rank(atom: Atom, bound: set[Variable]) -> int:
    """Lower is better: all bound, some bound, binary unbound, class atom unbound."""
    columns = _bound_columns(atom, bound)
    if len(columns) == atom.arity:
        return 0
    if columns:
        return 1
    return 2 if atom.arity >= 2 else 3


def plan_rule(
    rule: Rule,
    body: Sequence | None = None,
    delta_position: int | None = None,
    size_of: Callable[[int], int] | None = None,
    initially_bound: frozenset[Variable] = frozenset(),
) -> Plan:
    """Order ``body`` (default: the rule's body) into a plan.

    ``size_of(position)`` estimates the number of facts an atom at a body position ranges over;
    ``initially_bound`` are variables bound before the plan starts (none for ordinary rules).
    """
    items = list(rule.body if body is None else body)
    measured: dict[int, int] = {}  # (each atom's size asked once: the estimate sums stores)

    def sizes(position: int) -> int:
        size = measured.get(position)
        if size is None:
            size = measured[position] = size_of(position) if size_of is not None else 0
        return size

    bound: set[Variable] = set(initially_bound)
    pending_atoms = [i for i, item in enumerate(items) if isinstance(item, Atom)]
    pending_other = [i for i, item in enumerate(items) if not isinstance(item, Atom)]
    occurrences = _variable_occurrences(items)
    # What each non-atom item needs bound before it can run (found once, tested each round).
    needs: dict[int, set[Variable]] = {}
    for i in pending_other:
        item = items[i]
        if isinstance(item, Comparison):
            needs[i] = item.variables()
        elif isinstance(item, Bind):
            needs[i] = expr_variables(item.expr)
        elif isinstance(item, Negation):
            needs[i] = {v for v in item.atom.variables() if occurrences[v] > 1}
    steps: list[Step] = []

    def drain() -> None:
        """Schedule every comparison, bind and negation whose inputs are now bound."""
        progress = True
        while progress:
            progress = False
            for i in list(pending_other):
                needed = needs.get(i)
                if needed is None or not needed <= bound:
                    continue
                item = items[i]
                if isinstance(item, Comparison):
                    steps.append(FilterStep(item))
                elif isinstance(item, Bind):
                    steps.append(BindStep(item))
                    bound.add(item.variable)
                else:
                    steps.append(NegationStep(i, item.atom, _bound_columns(item.atom, bound)))
                pending_other.remove(i)
                progress = True

    drain()
    if delta_position is not None:
        atom = items[delta_position]
        steps.append(ScanStep(delta_position, atom, _bound_columns(atom, bound), delta=True))
        bound |= atom.variables()
        pending_atoms.remove(delta_position)
        drain()
    while pending_atoms:
        best = min(
            pending_atoms,
            key=lambda i: (_atom_rank(items[i], bound), sizes(i), i),
        )
        atom = items[best]
        steps.append(ScanStep(best, atom, _bound_columns(atom, bound)))
        bound |= atom.variables()
        pending_atoms.remove(best)
        drain()
    if pending_other:
        # Validation guarantees safety, so this means a bug or an unvalidated rule.
        leftover = ", ".join(str(items[i]) for i in pending_other)
        raise ValueError(f"cannot schedule {leftover} in rule {rule}: unbound variables")
    return Plan(rule, tuple(steps), delta_position)


def _variable_occurrences(items: Sequence) -> dict[Variable, int]:
    """How many body items mention each variable (to tell existential negated variables)."""
    counts: dict[Variable, int] = {}
    for item in items:
        for variable in item_variables(item):
            counts[variable] = counts.get(variable, 0) + 1
    return counts
