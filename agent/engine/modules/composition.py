"""The composition module: a non-recursive hyper-node of one rule ``H(x, z) :- A(x, y), B(y, z)``,
evaluated and maintained a subject at a time on compressed bitmaps.

RS2's ``p30(X, Z) :- p22(X, Y), p21(Y, Z)`` is the case that matters: a join of two binary
relations on one variable, projecting it away, with many derivations per head fact (one per
witness ``y``; about 8 million for DS2(200)). Seen a subject at a time, the rule is a union of
sets: ``H[x]`` is the union of ``B[y]`` over the ``y`` in ``A[x]``. That union is what this
module computes, with ``B[y]`` as pyroaring bitmaps (one C-level many-way union per subject,
never a Python step per derivation), and the IDB is stored by subject with those bitmaps as
its buckets (`Relation.adopt_subjects`): no head tuple is built unless a reader asks for them.
(RS2's ``p30`` over DS2(200): the unions take a fifth of the time the same unions over Python
sets take, and the whole hyper-node half of what the compiled rule took, nested loops with set
unions into head tuples; building the two input indexes is most of what remains.)

**Materialise.** ``H[x]`` for every subject ``x`` of A; B's object sets are converted to bitmaps
once per call (a C-level copy of each).

**Maintain (any mix of insertions and deletions).** Every change is applied per subject, over
the new state of A and B (the lower hyper-nodes are up to date when this one runs):

* a deleted ``A(x, y)``: ``x`` is *recomputed*: ``H[x]`` afresh, compared with the old one (a
  bitmap difference each way);
* a deleted ``B(y, z)``: every ``x`` with ``A(x, y)`` may lose ``z``; it keeps it exactly when
  a witness remains (``A[x]`` meets ``B^-1[z]``, a C-level ``isdisjoint`` that stops at the
  first common ``y``). A subject with at least as many such candidates as it has ``y`` values
  is recomputed instead (cheaper than the tests), and a subject whose only ``y`` it is, before
  and after, changes as ``B[y]`` did: found once for all of them (a farm's turbines when its
  forecast changes);
* an inserted ``A(x, y)`` adds ``B[y]`` to ``H[x]``, an inserted ``B(y, z)`` adds ``z`` to
  ``H[x]`` for every ``x`` with ``A(x, y)`` (what is not held already).

Recomputing ``x`` reads ``A[x]``; when A is kept as tuples with no index by ``x`` (an explicit
relation: its index by subject is not kept, and none is saved), that is a pass over all of A.
Then each deleted ``A(x, y)`` is a candidate loss of every ``z`` that ``y`` gave ``x``, tested
like a deleted B fact's: ``x`` keeps ``z`` when some ``y'`` of ``B^-1[z]`` still has ``A(x,
y')``, a membership test in A's tuples (`_lost_by_probing`), unless those tests would cost
more than the pass.

Deletions are decided over the new state, insertions included, so a fact that loses one
derivation and gains another stays; no fact is overdeleted and put back, no counter is kept.
The cost is what the change reaches (at most the derivations of the subjects it touches) and
never more than recomputing, which is the same per-subject pass over every subject: the module
handles every change itself (``cheap_deletions``), and its `recompute` (rules removed, a driver
decision) diffs per subject too; when the changed inputs are a large share of the inputs
(``CostPolicy.composition_recompute_changed_share``) it goes straight to that pass instead of
grouping the changes. The IDB's changes are reported by subject (`SubjectFacts`): tuples only
for a reader above that wants them.

**A negated atom ``not N(y, z)``** (RS2's r15 and r16) makes ``B[y]`` read as ``B[y] - N[y]``
(one bitmap difference per ``y``) and ``B^-1[z]`` as ``B^-1[z] - N^-1[z]``; a new ``N(y, z)``
is handled as a candidate deletion of ``B(y, z)``, a deleted one as a candidate insertion, and
both are decided over the new state like B's own changes (an inserted candidate counts only if
it is in ``B[y] - N[y]``).

The module keeps no state besides the IDB, so nothing needs rebuilding after a restart.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from collections.abc import Set as AbstractSet
from itertools import repeat
from operator import itemgetter

from pyroaring import BitMap

from agent.engine.budget import BudgetGuard, InFlight
from agent.engine.modules.base import Maintained, NodeState, as_bitmap, by_subject_of
from agent.engine.modules.shapes import CompositionPattern
from agent.engine.modules.support.lookups import Lookup, add_into, python_set, reach
from agent.engine.modules.support.per_subject import PerSubjectModule
from agent.engine.modules.support.subject_changes import NO_IDS, SubjectChanges, group_by_column
from agent.engine.plan.executor import Executor
from agent.engine.storage.changes import InputChanges
from agent.engine.storage.store import EMPTY, RelationKey
from agent.engine.storage.subject_facts import column_values


class Bitmaps:
    """``B[y]`` as a bitmap (less ``N[y]`` when the rule negates ``N(y, z)``), converted on
    first use and kept for the rest of the call, with the keys converted (``seen``) and
    those whose ``B[y]`` has objects (``present``)."""

    def __init__(self, lookup: Lookup, blocked: Lookup | None = None) -> None:
        self.lookup = lookup
        self.blocked = blocked
        self.known: dict[int, BitMap] = {}
        self.seen = BitMap()
        self.present = BitMap()

    def __call__(self, key: int) -> BitMap:
        got = self.known.get(key)
        if got is None:
            got = as_bitmap(self.lookup(key))
            if self.blocked is not None:
                blocked = self.blocked(key)
                if blocked:
                    got = got - as_bitmap(blocked)
            self.known[key] = got
            self.seen.add(key)
            if got:
                self.present.add(key)
        return got

    def convert_all(self) -> None:
        """Convert every ``B[y]`` now, for a pass over every subject (which needs about all
        of them): `union` then gathers its bitmaps in C instead of a Python call per ``y``."""
        for key in self.lookup.keys():  # noqa: SIM118 (a Lookup, not a dict)
            self(key)
        self.complete = True

    complete = False  # every B[y] converted (convert_all)

    def union(self, keys: AbstractSet[int]) -> BitMap:
        """The union of ``B[y]`` over ``keys``: one many-way union in C, after converting the
        keys not seen yet (a set difference in C: recomputed subjects share most of their
        ``y``, and a Python call per ``y`` cost more than the union). A bitmap of keys is cut
        to those whose ``B[y]`` has objects first (in C): a subject whose ``y`` have none
        (RS2's r15 once ``p12`` is empty: 200 keys per subject) costs one intersection."""
        known = self.known
        if keys.__class__ is BitMap:
            if not self.complete:
                for key in keys - self.seen:
                    self(key)
            return BitMap().union(*map(known.__getitem__, keys & self.present))
        if not self.complete:
            for key in python_set(keys).difference(known):
                self(key)
        return BitMap().union(*map(known.get, keys, repeat(NO_IDS)))


class CompositionModule(PerSubjectModule):
    name = "composition"
    pattern: CompositionPattern

    def materialise(self, node: NodeState, executor: Executor) -> None:
        super().materialise(node, executor)
        self._index_a_by_y(node)

    def _index_a_by_y(self, node: NodeState) -> None:
        """Give each relation of A kept as tuples a bucketed index on ``y`` (bitmaps of ``x``)
        when ``y`` takes few values. A change of ``B(y, z)`` reaches every ``x`` with
        ``A(x, y)``: without an index, each update passes over all of A to find them (RS2 has
        none such; the equality benchmark's students by the course they take: 52k facts,
        about 4.5 ms an update, for an index of 0.4 MB). Few: distinct values at most
        ``costs.composition_bucketed_share`` of the facts, as a bitmap per value costs about
        as much as a tuple."""
        a_y = 1 - self.pattern.a_x
        for relation in node.bag.relations(self.pattern.a):
            if not relation.rows_built or relation.existing_index((a_y,)) is not None:
                continue
            if relation.existing_bucketed_index(a_y) is not None:
                continue
            rows = relation.tuples
            wanted = len(rows) * self.costs.composition_bucketed_share
            if rows and len(set(map(itemgetter(a_y), rows))) <= wanted:
                relation.bucketed_index(a_y, BitMap)

    def images(
        self, node: NodeState, executor: Executor, held: dict | None = None
    ) -> Iterator[tuple[int, BitMap]]:
        a_out = Lookup.merged(node.bag.relations(self.pattern.a), self.pattern.a_x)
        objects = self._objects(node)
        objects.convert_all()
        return self._evaluate(a_out, objects, list(a_out.keys()), executor.guard, held)

    def _objects(self, node: NodeState, keys: AbstractSet[int] | None = None) -> Bitmaps:
        """``B[y]`` less ``N[y]`` (when the rule negates ``N``) over the bag, for every ``y``
        or (a lookup built for a few keys) for ``keys`` only."""
        p = self.pattern

        def lookup(relation: RelationKey, column: int) -> Lookup:
            relations = node.bag.relations(relation)
            if keys is None:
                return Lookup(relations, column)
            return Lookup.some(relations, column, keys)

        blocked = lookup(p.n, p.n_y) if p.n is not None else None
        return Bitmaps(lookup(p.b, p.b_y), blocked)

    def _blocked_changes(self, changes: InputChanges) -> tuple[AbstractSet, AbstractSet]:
        """The B facts that may stop or start deriving because the negated ``N`` changed,
        in B's column order: a new ``N(y, z)`` may block ``B(y, z)``, a deleted one unblock
        it. Both are candidates only, decided over the new state like B's own changes."""
        p = self.pattern
        if p.n is None:
            return EMPTY, EMPTY
        n_plus = changes.plus.get(p.n) or EMPTY
        n_minus = changes.minus.get(p.n) or EMPTY
        return {p.as_b(f) for f in n_plus}, {p.as_b(f) for f in n_minus}

    @staticmethod
    def _evaluate(
        a_out: Lookup,
        objects: Bitmaps,
        subjects: Iterable[int],
        guard: BudgetGuard,
        held: dict | None = None,
    ) -> Iterator[tuple[int, BitMap]]:
        """``(x, H[x])`` over the new state for every ``x`` of ``subjects``, under the update's
        budget: the facts not stored yet count as in flight (beyond what ``held``, the IDB by
        subject, holds for ``x`` already)."""
        flight = InFlight(guard)
        for x in subjects:
            got = objects.union(a_out(x))
            if guard.active:
                flight.add(len(got) - (len(held.get(x, EMPTY)) if held is not None else 0))
            yield x, got

    # ------------------------------------------------------------------ maintain
    def apply_changes(
        self, node: NodeState, executor: Executor, changes: InputChanges
    ) -> Maintained:
        p = self.pattern
        a_minus = changes.minus.get(p.a) or EMPTY
        a_plus = changes.plus.get(p.a) or EMPTY
        b_minus = changes.minus.get(p.b) or EMPTY
        b_plus = changes.plus.get(p.b) or EMPTY
        blocked, unblocked = self._blocked_changes(changes)
        if blocked:
            b_minus = b_minus | blocked
        if unblocked:
            b_plus = b_plus | unblocked
        if not (a_minus or a_plus or b_minus or b_plus):
            return Maintained(strategy="composition (nothing to do)")
        a_relations = node.bag.relations(p.a)
        b_relations = node.bag.relations(p.b)
        changed_inputs = len(a_minus) + len(a_plus) + len(b_minus) + len(b_plus)
        inputs = sum(map(len, a_relations))
        if p.b != p.a:
            inputs += sum(map(len, b_relations))
        if p.n is not None and p.n not in (p.a, p.b):
            inputs += sum(map(len, node.bag.relations(p.n)))
        if changed_inputs > self.costs.composition_recompute_changed_share * inputs:
            return self.recompute(
                node,
                executor,
                f"composition (all subjects: {changed_inputs} of {inputs} input facts changed)",
            )
        own = node.own(p.head)
        held = by_subject_of(own)
        changed = SubjectChanges(held)
        a_y = 1 - p.a_x
        lost_by_y = group_by_column(b_minus, p.b_y)
        new_by_y = group_by_column(b_plus, p.b_y)
        # Deleted A(x, y): x is evaluated afresh. Deleted B(y, z): every x with A(x, y) may
        # lose z: a test per candidate, or x evaluated afresh when it has as many candidates
        # as witnesses to look at.
        recomputed = column_values(a_minus, p.a_x)
        candidates: dict[int, BitMap] = {}
        alone_with: dict[int, list[int]] = {}  # y -> the candidates whose only y it is
        probed = None
        if recomputed and any(len(r) and r.existing_index((p.a_x,)) is None for r in a_relations):
            a_in = Lookup.some(a_relations, a_y, lost_by_y.keys())
            probed = self._lost_by_probing(node, a_relations, held, a_minus, lost_by_y, a_in)
        if probed is not None:  # (each deleted A(x, y) tested like a deleted B(y, z))
            lost, tested = probed
            for x, zs in lost.items():
                changed.lose(x, zs)
            recomputed = set()
            a_out = Lookup([], p.a_x)
        else:
            reached = reach(a_relations, a_y, lost_by_y)
            candidates = {x: zs for x, zs in reached.items() if x not in recomputed}
            a_out = Lookup.some(a_relations, p.a_x, recomputed | candidates.keys())
            test_cost = self.costs.composition_test_cost
            a_gained = column_values(a_plus, p.a_x)
            for x, zs in list(candidates.items()):
                ys = a_out(x)
                if len(ys) == 1 and x not in a_gained:  # (its A[x] was {y} before too)
                    alone_with.setdefault(next(iter(ys)), []).append(x)
                    del candidates[x]
                elif len(zs) * test_cost >= len(ys):
                    recomputed.add(x)
                    del candidates[x]
            tested = sum(map(len, candidates.values()))
        if candidates:
            b_in = self._witnesses_of(node, BitMap().union(*candidates.values()))
            for x, zs in candidates.items():
                mine = held.get(x, EMPTY)
                witnesses = python_set(a_out(x))
                gone = [z for z in zs if z in mine and witnesses.isdisjoint(b_in(z))]
                if gone:
                    changed.lose(x, BitMap(gone))
        # Inserted A(x, y) add B[y] to H[x]; inserted B(y, z) add z to H[x] for every x with
        # A(x, y): for the subjects not evaluated afresh, minus what they hold. (Under a
        # negation the inserted B(y, z) are candidates: those that derive are in B[y] - N[y].)
        needed = column_values(a_plus, a_y)
        if recomputed:  # (their keys united in C: a Python set takes a step per key)
            needed.update(BitMap().union(*(as_bitmap(a_out(x)) for x in recomputed)))
        if p.n is not None:
            needed.update(new_by_y.keys())
        needed.update(alone_with.keys())
        objects = self._objects(node, needed)
        if p.n is not None:
            new_by_y = {y: kept for y, zs in new_by_y.items() if (kept := zs & objects(y))}
        for x, got in self._evaluate(a_out, objects, recomputed, executor.guard, held):
            changed.become(x, got)
        followed = self._follow_their_y(alone_with, objects, held, changed, executor.guard)
        evaluated = recomputed.union(followed)
        found_new: dict[int, BitMap] = {}
        for fact in a_plus:
            x = fact[p.a_x]
            if x not in evaluated:
                add_into(found_new, x, objects(fact[a_y]))
        for x, zs in reach(a_relations, a_y, new_by_y).items():
            if x not in evaluated:
                add_into(found_new, x, zs)
        for x, got in found_new.items():
            changed.gain(x, got)
        by_probing = " by membership in A" if probed is not None else ""
        alike = f", {len(followed)} subjects changed as their one y" if followed else ""
        result = Maintained(
            strategy=f"composition ({len(recomputed)} subjects recomputed, "
            f"{tested} candidates tested{by_probing}{alike})"
        )
        changed.apply(own, self.pattern.head, result)
        return result

    @staticmethod
    def _follow_their_y(
        alone_with: dict[int, list[int]],
        objects: Bitmaps,
        held: dict,
        changed: SubjectChanges,
        guard: BudgetGuard,
    ) -> list[int]:
        """The subjects whose ``A[x]`` is one ``y``, before and after the update, changed
        as ``B[y]`` did: ``H[x]`` is ``B[y]`` (less ``N[y]``), so all of a ``y``'s subjects
        that held the same objects lose and gain the same ones, found once per ``y`` (the
        farm's turbines when its forecast changes: 800 subjects, one union and one
        comparison each before). A subject holding something else is evaluated on its own
        (``become``), under the update's budget as `_evaluate`'s subjects are. Returns the
        subjects done."""
        done: list[int] = []
        flight = InFlight(guard)
        for y, xs in alone_with.items():
            now = objects(y)
            first = held.get(xs[0])
            before = as_bitmap(first) if first else NO_IDS
            lost, gained = before - now, now - before
            for x in xs:
                mine = held.get(x)
                same = mine is first or (mine is not None and first is not None and mine == first)
                if same:
                    changed.known(x, lost, gained)
                else:
                    changed.become(x, BitMap(now))
                if guard.active:
                    held_x = len(mine) if mine is not None else 0
                    flight.add(len(gained) - len(lost) if same else len(now) - held_x)
            done += xs
        return done

    def _lost_by_probing(
        self,
        node: NodeState,
        a_relations: list,
        held: dict,
        a_minus: AbstractSet[tuple[int, int]],
        lost_by_y: dict[int, BitMap],
        a_in: Lookup,
    ) -> tuple[dict[int, BitMap], int] | None:
        """What each subject loses, and how many candidates were tested, found without
        reading ``A[x]``: for a relation A kept as tuples with no index on x, reading ``A[x]``
        for the subjects that lost an A fact is a pass over all of A. Instead a deleted
        ``A(x, y)`` makes every ``z`` that ``y`` gave (``B[y]`` now, and what B lost at y) a
        candidate loss of ``x``, like a deleted ``B(y, z)`` does, and ``x`` keeps ``z``
        exactly when some ``y'`` with ``B(y', z)`` still has ``A(x, y')``: a membership test
        per ``y'`` in A's tuples, over the new state. None when those tests would cost more
        than the pass (``CostPolicy.composition_probe_cost``)."""
        p = self.pattern
        a_y = 1 - p.a_x
        ys = column_values(a_minus, a_y)
        objects = self._objects(node, ys)
        gave = {y: objects(y) | lost_by_y[y] if y in lost_by_y else objects(y) for y in ys}
        b_in = self._witnesses_of(node, BitMap().union(*gave.values(), *lost_by_y.values()))
        # The tests, at most (before keeping what each subject holds), against a pass.
        per_y = {y: sum(len(b_in(z)) for z in zs) for y, zs in {**lost_by_y, **gave}.items()}
        tests_at_most = sum(per_y[fact[a_y]] for fact in a_minus)
        tests_at_most += sum(per_y[y] * len(a_in(y)) for y in lost_by_y)
        if tests_at_most * self.costs.composition_probe_cost > sum(map(len, a_relations)):
            return None
        tests: dict[int, BitMap] = {}
        for y, zs in lost_by_y.items():  # deleted B(y, z): every x with A(x, y)
            for x in a_in(y):
                add_into(tests, x, zs)
        for fact in a_minus:
            add_into(tests, fact[p.a_x], gave[fact[a_y]])
        for x, zs in list(tests.items()):
            mine = held.get(x)
            kept = zs & as_bitmap(mine) if mine else None
            if kept:
                tests[x] = kept
            else:
                del tests[x]
        holds = [relation.__contains__ for relation in a_relations]
        x_first = p.a_x == 0
        lost: dict[int, BitMap] = {}
        for x, zs in tests.items():
            gone = [
                z
                for z in zs
                if not any(has((x, y) if x_first else (y, x)) for y in b_in(z) for has in holds)
            ]
            if gone:
                lost[x] = BitMap(gone)
        return lost, sum(map(len, tests.values()))

    def _witnesses_of(self, node: NodeState, zs: AbstractSet[int]) -> Callable[[int], Iterable]:
        """``z -> {y : B(y, z)}`` over the new state for the ``zs`` asked, less the ``y`` with
        ``N(y, z)`` when the rule negates ``N``."""
        p = self.pattern
        b_in = Lookup.some(node.bag.relations(p.b), 1 - p.b_y, zs)
        if p.n is None:
            return b_in
        n_in = Lookup.some(node.bag.relations(p.n), 1 - p.n_y, zs)

        def unblocked(z: int) -> Iterable[int]:
            blocked = n_in(z)
            return set(b_in(z)).difference(blocked) if blocked else b_in(z)

        return unblocked

    def describe(self) -> str:
        return self.name
