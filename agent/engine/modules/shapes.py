"""Which evaluation module a hyper-node gets: the one place the shapes of its rules are
recognised (``node_shape``), read by the module choice (``modules/__init__.py``), ``explain``
and the Spark job alike.

Shapes are recognised after normalising variable names and body order:

* **transitive closure** (TC) of a binary relation R, a hyper-node holding exactly
  ``R(x, z) :- R(x, y), R(y, z)``, optionally with ``COMP(x, !=, z)`` (the *irreflexive*
  variant of Rule Sets 1-3: transitivity never produces a pair (u, u));
* **symmetric-transitive closure** (STC): the TC rule (either variant) together with
  ``R(x, y) :- R(y, x)``;
* **linear closure** (``LinearClosurePattern``, modules/linear.py): a hyper-node holding
  exactly one linear step over a binary relation P, right-linear ``P(x, z) :- P(x, y), E(y, z)``
  or left-linear ``P(x, z) :- E(x, y), P(y, z)``, E another relation. The base rules that
  start the recursion (``P(x, y) :- E(x, y)``, a copy of another relation, several of them,
  any filter or join) are not recursive: they sit in hyper-nodes of their own, below, and
  reach the step only as P facts of its lower stores, together with P's explicit facts. So
  every base rule is sound whatever its body: with X those P facts, the least fixpoint is
  X ; E* (right) or E* ; X (left). A filter on the step itself is not claimed: ``x != z``
  makes each source's walk avoid its own vertex, which no shared reach set expresses; nor
  are constants, repeated variables, a second rule in the node, or E = P (that is TC).
  Only the module choice reads this shape: ``explain`` proves its facts by its generic
  search over the rule, and the Spark job evaluates the node seminaively (``detect_closure``
  does not return it);
* **renaming**: every rule only copies one atom, its columns possibly permuted (RS2's copy
  cycle ``p20 -> p21 -> p22 -> p20``);
* **composition**: one rule ``H(x, z) :- A(x, y), B(y, z)``, optionally ``and not N(y, z)``;
* **semi-join**: one rule keeping the facts of one binary atom that have (or lack) a match in
  filter atoms, ``H(x, y) :- A(x, y), B(y, _)``.

Anything else (including a closure rule sharing its hyper-node with other rules) is evaluated
by the hypertree module when a rule is worth decomposing, else by the seminaive module. An
aggregate rule is always a hyper-node of its own, with its own module.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace

from agent.engine.language import Atom, Comparison, Negation, Rule, Variable
from agent.engine.storage.store import RelationKey

Permutation = tuple[int, ...]  # head column j takes the body's column permutation[j]


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


# ---------------------------------------------------------------------------- linear closure


@dataclass(frozen=True)
class LinearClosurePattern:
    """``head`` = P; ``step`` = E; ``right``: the rule is ``P(x, z) :- P(x, y), E(y, z)``
    (else ``P(x, z) :- E(x, y), P(y, z)``)."""

    head: RelationKey
    step: RelationKey
    right: bool

    @property
    def kind(self) -> str:
        return "right-linear" if self.right else "left-linear"


def linear_step_shape(rule: Rule) -> tuple[RelationKey, bool] | None:
    """``(E, right)`` when the rule is ``P(x, z) :- P(x, y), E(y, z)`` (right) or
    ``P(x, z) :- E(x, y), P(y, z)`` (left), three distinct variables, E != P."""
    head = rule.head
    if head.arity != 2 or not _distinct_variables(head.terms) or len(rule.body) != 2:
        return None
    atoms = [a for a in rule.body if isinstance(a, Atom)]
    if len(atoms) != 2 or not all(a.arity == 2 and _distinct_variables(a.terms) for a in atoms):
        return None
    x, z = head.terms
    mine = [a for a in atoms if a.relation == head.relation]
    other = [a for a in atoms if a.relation != head.relation]
    if len(mine) != 1 or len(other) != 1:
        return None
    (p,), (e,) = mine, other
    if p.terms[0] == x and e.terms[1] == z and p.terms[1] == e.terms[0]:
        y, right = p.terms[1], True
    elif e.terms[0] == x and p.terms[1] == z and e.terms[1] == p.terms[0]:
        y, right = e.terms[1], False
    else:
        return None
    if y in (x, z):
        return None
    return e.relation, right


def linear_closure_shape(rules: Sequence[Rule]) -> LinearClosurePattern | None:
    """The pattern when the hyper-node is one linear step (module docstring)."""
    if len(rules) != 1:
        return None
    found = linear_step_shape(rules[0])
    if found is None:
        return None
    return LinearClosurePattern(rules[0].head.relation, found[0], found[1])


# ---------------------------------------------------------------------------- renaming


def renaming_shape(rule: Rule) -> tuple[RelationKey, RelationKey, Permutation] | None:
    """``(body relation, head relation, permutation)`` when the rule only renames columns."""
    head = rule.head
    if rule.aggregate() is not None or len(rule.body) != 1:
        return None
    (atom,) = rule.body
    if not isinstance(atom, Atom) or atom.arity != head.arity or head.arity == 0:
        return None
    terms = atom.terms
    if not all(isinstance(t, Variable) for t in terms) or len(set(terms)) != len(terms):
        return None
    if set(head.terms) != set(terms) or len(head.terms) != len(terms):
        return None
    return atom.relation, head.relation, tuple(terms.index(t) for t in head.terms)


def is_renaming_node(rules: Sequence[Rule]) -> bool:
    return bool(rules) and all(renaming_shape(rule) is not None for rule in rules)


@dataclass(frozen=True)
class RenamingPattern:
    """Every rule of the hyper-node copies one atom (``renaming_shape`` of each)."""

    rules: int


# ---------------------------------------------------------------------------- composition


@dataclass(frozen=True)
class CompositionPattern:
    """Where the variables sit: ``A`` holds the head's subject x at column ``a_x`` (and y at
    ``1 - a_x``); ``B`` holds y at ``b_y`` (and the head's object z at ``1 - b_y``). With a
    negated atom ``not N(y, z)`` (either column order), ``N`` holds y at ``n_y``."""

    head: RelationKey
    a: RelationKey
    b: RelationKey
    a_x: int
    b_y: int
    n: RelationKey | None = None
    n_y: int = 0

    def as_b(self, fact: tuple[int, int]) -> tuple[int, int]:
        """An ``N`` fact in ``B``'s column order (the pair it blocks)."""
        return fact if self.n_y == self.b_y else (fact[1], fact[0])


def composition_shape(rule: Rule) -> CompositionPattern | None:
    """The pattern when ``rule`` is ``H(x, z) :- A(x, y), B(y, z)`` up to the order of the
    body and the columns of each atom, optionally with ``not N(y, z)`` (RS2's r15 and r16:
    then ``B[y]`` stands for ``B[y] - N[y]``). Three distinct variables, nothing else in the
    body, the head relation not read by the body. ``A`` is the atom holding the head's
    subject."""
    head = rule.head
    if rule.aggregate() is not None or head.arity != 2:
        return None
    atoms = [item for item in rule.body if isinstance(item, Atom)]
    negated = [item.atom for item in rule.body if isinstance(item, Negation)]
    if len(atoms) != 2 or len(negated) > 1 or len(atoms) + len(negated) != len(rule.body):
        return None
    if not all(a.arity == 2 for a in (*atoms, *negated)):
        return None
    if any(a.relation == head.relation for a in (*atoms, *negated)):
        return None
    terms = [*head.terms, *(t for a in (*atoms, *negated) for t in a.terms)]
    if not all(isinstance(t, Variable) for t in terms):
        return None
    if len(set(head.terms)) != 2 or any(len(set(a.terms)) != 2 for a in (*atoms, *negated)):
        return None
    x, z = head.terms
    for first, second in (atoms, atoms[::-1]):
        shared = set(first.terms) & set(second.terms)
        if len(shared) != 1:
            return None
        (y,) = shared
        if set(first.terms) != {x, y} or set(second.terms) != {y, z}:
            continue
        pattern = CompositionPattern(
            head=head.relation,
            a=first.relation,
            b=second.relation,
            a_x=first.terms.index(x),
            b_y=second.terms.index(y),
        )
        if not negated:
            return pattern
        (blocked,) = negated
        if set(blocked.terms) != {y, z}:
            return None
        return replace(pattern, n=blocked.relation, n_y=blocked.terms.index(y))
    return None


# ---------------------------------------------------------------------------- semi-join


@dataclass(frozen=True)
class Filter:
    """One filter atom: ``relation`` holds the shared variable at ``column``; it is ``A``'s
    object (``on_object``) or subject; ``negated``: the fact must have no match."""

    relation: RelationKey
    column: int
    on_object: bool
    negated: bool


@dataclass(frozen=True)
class SemiJoinPattern:
    head: RelationKey
    source: RelationKey
    filters: tuple[Filter, ...]


def semijoin_shape(rule: Rule) -> SemiJoinPattern | None:
    """The pattern when ``rule`` is ``H(x, y) :- A(x, y)`` and filters (modules/semijoin.py)."""
    head = rule.head
    if rule.aggregate() is not None or head.arity != 2 or len(rule.body) < 2:
        return None
    if not all(isinstance(t, Variable) for t in head.terms) or len(set(head.terms)) != 2:
        return None
    sources = [item for item in rule.body if isinstance(item, Atom) and item.terms == head.terms]
    if not sources:
        return None
    source = sources[0]
    filters = [item for item in rule.body if item is not source]
    atoms = [f.atom if isinstance(f, Negation) else f for f in filters]
    if not all(isinstance(f, (Atom, Negation)) for f in filters):
        return None
    if any(a.relation == head.relation for a in (source, *atoms)):
        return None
    occurrences = Counter(t for a in (head, source, *atoms) for t in a.terms)
    x, y = head.terms
    found = []
    for item, atom in zip(filters, atoms, strict=True):
        if not all(isinstance(t, Variable) for t in atom.terms):
            return None
        if len(set(atom.terms)) != atom.arity:
            return None
        shared = [t for t in atom.terms if t in (x, y)]
        rest = [t for t in atom.terms if t not in (x, y)]
        if len(shared) != 1 or any(occurrences[t] != 1 for t in rest):
            return None
        (variable,) = shared
        found.append(
            Filter(
                relation=atom.relation,
                column=atom.terms.index(variable),
                on_object=variable == y,
                negated=isinstance(item, Negation),
            )
        )
    return SemiJoinPattern(head=head.relation, source=source.relation, filters=tuple(found))


# ---------------------------------------------------------------------------- all of them

NodeShape = (
    ClosurePattern | LinearClosurePattern | RenamingPattern | CompositionPattern | SemiJoinPattern
)


def node_shape(rules: Sequence[Rule]) -> NodeShape | None:
    """The shape of a hyper-node's rules (see the module docstring), or None: the hypertree or
    seminaive module's. Aggregate rules have none (they have their own module)."""
    if any(rule.aggregate() is not None for rule in rules):
        return None
    closure = detect_closure(rules)
    if closure is not None:
        return closure
    linear = linear_closure_shape(rules)
    if linear is not None:
        return linear
    if is_renaming_node(rules):
        return RenamingPattern(len(rules))
    if len(rules) == 1:
        return composition_shape(rules[0]) or semijoin_shape(rules[0])
    return None
