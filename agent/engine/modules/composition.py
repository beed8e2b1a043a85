"""The composition module: a non-recursive hyper-node of one rule ``H(x, z) :- A(x, y), B(y, z)``.

RS2's ``p30(X, Z) :- p22(X, Y), p21(Y, Z)`` is the case that matters: a join of two binary
relations on one variable, projecting it away. Each head fact has many derivations (one per
witness ``y``; about 8 million for DS2(200)), so both ways the seminaive module maintains it
are expensive when a deletion removes a large part of its inputs: DRed enumerates every
derivation that used a deleted fact (about 2.7 million when RS2 loses ``r4``), and recomputing
enumerates every derivation that remains.

**Deletions (Del + Red in one step).** A head ``(x, z)`` can only lose a derivation through a
deleted ``A(x, y)`` or a deleted ``B(y, z)``, so the candidates are the head facts whose ``x``
starts a deleted A fact or whose ``z`` ends a deleted B fact. They are found either by
enumerating the deleted derivations (when they are few) or by one pass over the head relation
(when there are more of them than head facts). A candidate survives exactly when it still has a
witness: ``A.out(x)`` and ``B.in(z)`` (index buckets, over the new state) intersect, a C-level
``isdisjoint`` that stops at the first common ``y`` and costs nothing when either side lost all
its facts, which is what a large deletion usually does. No derivation is enumerated to decide
what stays; the overdeleted facts are never removed and put back.

Capture: every head fact that loses all its derivations is a candidate, and the test is the
rule's own body over the new state, so the result is the materialisation of the new inputs.

Everything else (insertions, a batch that also adds facts, the rule's first evaluation) is the
seminaive module's, unchanged; the driver's cost estimates still apply to those.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence, Set
from dataclasses import dataclass
from itertools import compress, repeat
from operator import and_, itemgetter, or_

from ..changes import InputChanges
from ..executor import Executor
from ..language import Atom, Rule, Variable
from ..store import EMPTY, DataStoreBag, Relation, RelationKey
from .base import Maintained, NodeState
from .seminaive import SeminaiveModule


@dataclass(frozen=True)
class CompositionPattern:
    """Where the variables sit: ``A`` holds x at column ``a_x`` and y at ``1 - a_x``; ``B``
    holds y at ``b_y``; the head holds x at column ``head_x``."""

    head: RelationKey
    a: RelationKey
    b: RelationKey
    a_x: int
    b_y: int
    head_x: int


def composition_shape(rule: Rule) -> CompositionPattern | None:
    """The pattern when ``rule`` is ``H(x, z) :- A(x, y), B(y, z)`` up to the order of the
    body, the columns of each atom and of the head (three distinct variables, nothing else in
    the body, the head relation not read by the body)."""
    head = rule.head
    if rule.aggregate() is not None or head.arity != 2 or len(rule.body) != 2:
        return None
    atoms = list(rule.body)
    if not all(isinstance(a, Atom) and a.arity == 2 for a in atoms):
        return None
    if any(a.relation == head.relation for a in atoms):
        return None
    terms = [*head.terms, *atoms[0].terms, *atoms[1].terms]
    if not all(isinstance(t, Variable) for t in terms):
        return None
    if len(set(head.terms)) != 2 or any(len(set(a.terms)) != 2 for a in atoms):
        return None
    for first, second in (atoms, atoms[::-1]):
        shared = set(first.terms) & set(second.terms)
        if len(shared) != 1:
            return None
        (y,) = shared
        (x,) = set(first.terms) - {y}
        (z,) = set(second.terms) - {y}
        if set(head.terms) == {x, z}:
            return CompositionPattern(
                head=head.relation,
                a=first.relation,
                b=second.relation,
                a_x=first.terms.index(x),
                b_y=second.terms.index(y),
                head_x=head.terms.index(x),
            )
    return None


def _lookup(relations: list[Relation], column: int) -> Callable[[int], Set[int]]:
    """``neighbours(key)``: the values the relations pair with ``key`` on ``column``, over their
    indexes (built on first use, then maintained). With one relation holding facts (the usual
    case) it returns the index's own set: read only."""
    indexes = [r.index((column,)) for r in relations if len(r)]
    if len(indexes) == 1:
        get = indexes[0].get
        return lambda key: get(key, EMPTY)
    if not indexes:
        return lambda _key: EMPTY
    return lambda key: set().union(*(index.get(key, EMPTY) for index in indexes))


def _lookup_some(
    relations: list[Relation], column: int, keys: set[int]
) -> Callable[[int], Set[int]]:
    """`_lookup` for a few known ``keys``: through an index a relation already has, else by
    one C-level pass keeping the facts whose ``column`` is a key (the deletion that asks has
    usually left a few hundred heads to test, and a full index costs a Python step per fact)."""
    if all(r.existing_index((column,)) is not None for r in relations if len(r)):
        return _lookup(relations, column)
    found: dict[int, set[int]] = {}
    other = 1 - column
    for relation in relations:
        index = relation.existing_index((column,))
        if index is not None:
            for key in keys:
                values = index.get(key)
                if values:
                    found.setdefault(key, set()).update(values)
            continue
        rows = relation.tuples
        for fact in compress(rows, map(keys.__contains__, map(itemgetter(column), rows))):
            found.setdefault(fact[column], set()).add(fact[other])
    get = found.get
    return lambda key: get(key, EMPTY)


def _keys_in(relations: list[Relation], column: int, keys: set[int]) -> set[int]:
    """The keys that appear in ``column`` of some relation: through its index when it has one,
    else by one C-level pass over its facts (cheaper than building an index to ask once)."""
    found: set[int] = set()
    for relation in relations:
        if not len(relation) or not keys:
            continue
        index = relation.existing_index((column,))
        if index is not None:
            hits = {k for k in keys if k in index}
        else:
            hits = keys.intersection(map(itemgetter(column), relation.tuples))
        found |= hits
        keys = keys - hits
    return found


def _by_column(facts: set, column: int) -> dict[int, set]:
    grouped: dict[int, set] = {}
    other = 1 - column
    for fact in facts:
        grouped.setdefault(fact[column], set()).add(fact[other])
    return grouped


class CompositionModule(SeminaiveModule):
    name = "composition"
    # The driver still recomputes when a lower bound of the facts lost is most of the input
    # (``cheap_deletions`` stays False); other pure deletions are left to ``maintain``.

    def __init__(self, pattern: CompositionPattern) -> None:
        super().__init__()
        self.pattern = pattern

    def handles(self, changes: InputChanges) -> bool:
        """Pure deletions are maintained here at a cost set by what they reach; a change that
        also adds facts goes the seminaive way, under the driver's cost estimates."""
        return not any(changes.plus.values())

    def maintain(
        self,
        node: NodeState,
        executor: Executor,
        changes: InputChanges,
        removed_rules: Sequence[Rule] = (),
        old_view: DataStoreBag | None = None,
    ) -> Maintained:
        if removed_rules or not self.handles(changes):
            return super().maintain(node, executor, changes, removed_rules, old_view)
        p = self.pattern
        lost_a = changes.minus.get(p.a, set())
        lost_b = changes.minus.get(p.b, set())
        own = node.own(p.head)
        result = Maintained()
        if not len(own) or not (lost_a or lost_b):
            result.strategy = "composition (nothing to check)"
            return result
        remaining = sum(map(len, node.view.relations(p.a)))
        if p.b != p.a:
            remaining += sum(map(len, node.view.relations(p.b)))
        lost = len(lost_a) + len(lost_b)
        if lost > self.costs.composition_recompute_lost_share * remaining:
            # Most of the join's input is gone: evaluating it over what remains reads less
            # than checking every head that the lost facts reach.
            return self.recompute(
                node, executor, f"recompute ({lost} input facts lost of {remaining})"
            )
        candidates = self.candidates(node, lost_a, lost_b, own)
        # Survivors still have a witness y over the new state: A.out(x) meets B.in(z). A
        # candidate whose x starts no A fact, or whose z ends no B fact, has none: a large
        # deletion usually leaves most candidates so, and they go without a test each.
        hx, hz = p.head_x, 1 - p.head_x
        a_relations, b_relations = node.view.relations(p.a), node.view.relations(p.b)
        live_x = _keys_in(a_relations, p.a_x, set(map(itemgetter(hx), candidates)))
        live_z = _keys_in(b_relations, 1 - p.b_y, set(map(itemgetter(hz), candidates)))
        rest = set(
            compress(
                candidates,
                map(
                    and_,
                    map(live_x.__contains__, map(itemgetter(hx), candidates)),
                    map(live_z.__contains__, map(itemgetter(hz), candidates)),
                ),
            )
        )
        gone = candidates - rest
        if rest:
            out_of = _lookup_some(a_relations, p.a_x, set(map(itemgetter(hx), rest)))
            into = _lookup_some(b_relations, 1 - p.b_y, set(map(itemgetter(hz), rest)))
            gone.update(h for h in rest if out_of(h[hx]).isdisjoint(into(h[hz])))
        # Every candidate is a head fact (the scan reads them, the enumeration keeps only
        # those held): ``gone`` is present, no membership test needed.
        result.remove(p.head, own.remove_present(gone), owned=True)
        result.strategy = f"composition ({len(candidates)} candidates, {len(gone)} gone)"
        return result

    def candidates(self, node: NodeState, lost_a: set, lost_b: set, own: Relation) -> set:
        """Head facts that may have lost their last derivation: by enumerating the deleted
        derivations when there are fewer of them than head facts, else by one pass over the
        head relation keeping the facts whose x or z a deleted fact mentions."""
        p = self.pattern
        a_y = 1 - p.a_x
        if (len(lost_a) + len(lost_b)) * self.costs.composition_scan_lost_share > len(own):
            return self.scan(own, lost_a, lost_b)
        lost_a_by_y = _by_column(lost_a, a_y)
        lost_b_by_y = _by_column(lost_b, p.b_y)
        into_y = _lookup(node.view.relations(p.a), a_y)
        out_of_y = _lookup(node.view.relations(p.b), p.b_y)
        # The old state is the new one plus the deleted facts (the change only deletes).
        work = 0
        for y, xs in lost_a_by_y.items():
            work += len(xs) * (len(out_of_y(y)) + len(lost_b_by_y.get(y, ())))
        for y, zs in lost_b_by_y.items():
            work += len(zs) * (len(into_y(y)) + len(lost_a_by_y.get(y, ())))
        if work > len(own):
            return self.scan(own, lost_a, lost_b)
        pairs: set = set()
        for y, xs in lost_a_by_y.items():
            zs = out_of_y(y) | lost_b_by_y.get(y, EMPTY)
            for x in xs:
                pairs.update(zip(repeat(x), zs))
        for y, zs in lost_b_by_y.items():
            xs = into_y(y) | lost_a_by_y.get(y, EMPTY)
            for z in zs:
                pairs.update(zip(xs, repeat(z)))
        if p.head_x != 0:
            pairs = {(z, x) for x, z in pairs}
        return own.present(pairs)  # (each is an old derivation's head: held, unless a bug)

    def scan(self, own: Relation, lost_a: set, lost_b: set) -> set:
        """The head facts whose x starts a deleted A fact or whose z ends a deleted B fact."""
        p = self.pattern
        xs = {fact[p.a_x] for fact in lost_a}
        zs = {fact[1 - p.b_y] for fact in lost_b}
        hx, hz = p.head_x, 1 - p.head_x
        rows = own.tuples
        # (C-level filters, as the compiler's semi-joins: no Python loop per head fact)
        starts = map(xs.__contains__, map(itemgetter(hx), rows))
        if not zs:
            return set(compress(rows, starts))
        ends = map(zs.__contains__, map(itemgetter(hz), rows))
        return set(compress(rows, map(or_, starts, ends) if xs else ends))
