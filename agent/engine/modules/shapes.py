"""Which evaluation module a hyper-node gets, by the shape of its rules.

Shapes are recognised after normalising variable names and body order:

* transitive closure (TC) of a binary relation R, a hyper-node holding exactly
  ``R(x, z) :- R(x, y), R(y, z)``, optionally with ``COMP(x, !=, z)`` (the *irreflexive* variant
  of Rule Sets 1-3: transitivity never produces a pair (u, u));
* symmetric-transitive closure (STC): the TC rule (either variant) together with
  ``R(x, y) :- R(y, x)``.

Anything else (including a closure rule sharing its hyper-node with other rules) is evaluated by
the seminaive module. An aggregate rule is always a hyper-node of its own, with its own module.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from agent.engine.language import Atom, Comparison, Rule, Variable
from agent.engine.storage.store import RelationKey


@dataclass(frozen=True)
class ClosurePattern:
    kind: str  # "transitive" or "symmetric-transitive"
    relation: RelationKey
    irreflexive: bool


def transitive_shape(rule: Rule) -> tuple[RelationKey, bool] | None:
    """``(R, irreflexive)`` when the rule is ``R(x, z) :- R(x, y), R(y, z) [, x != z]``."""
    head = rule.head
    if head.arity != 2 or not _distinct_variables(head.terms):
        return None
    x, z = head.terms
    atoms = [item for item in rule.body if isinstance(item, Atom)]
    others = [item for item in rule.body if not isinstance(item, Atom)]
    if len(atoms) != 2 or any(a.relation != head.relation for a in atoms):
        return None
    if not all(_distinct_variables(a.terms) for a in atoms):
        return None
    for first, second in (atoms, atoms[::-1]):
        a, y = first.terms
        y2, c = second.terms
        if a == x and c == z and y == y2 and y not in (x, z):
            break
    else:
        return None
    if not others:
        return head.relation, False
    if len(others) == 1 and isinstance(others[0], Comparison):
        comparison = others[0]
        if comparison.op == "!=" and {comparison.left, comparison.right} == {x, z}:
            return head.relation, True
    return None


def symmetric_shape(rule: Rule) -> RelationKey | None:
    """``R`` when the rule is ``R(x, y) :- R(y, x)``."""
    head = rule.head
    if head.arity != 2 or not _distinct_variables(head.terms) or len(rule.body) != 1:
        return None
    atom = rule.body[0]
    if not isinstance(atom, Atom) or atom.relation != head.relation:
        return None
    x, y = head.terms
    return head.relation if atom.terms == (y, x) else None


def detect_closure(rules: Sequence[Rule]) -> ClosurePattern | None:
    if len(rules) == 1:
        shape = transitive_shape(rules[0])
        if shape is not None:
            return ClosurePattern("transitive", shape[0], shape[1])
        return None
    if len(rules) == 2:
        for transitive, symmetric in (rules, rules[::-1]):
            shape = transitive_shape(transitive)
            if shape is not None and symmetric_shape(symmetric) == shape[0]:
                return ClosurePattern("symmetric-transitive", shape[0], shape[1])
    return None


def _distinct_variables(terms: Sequence) -> bool:
    return all(isinstance(t, Variable) for t in terms) and len(set(terms)) == len(terms)
