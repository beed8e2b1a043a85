"""What an update changed: per-store change sets, the update's change log, the journal a
persistent copy reads, and the *visible* difference a hyper-node receives.

* :class:`StoreChanges`: the net facts one store gained and lost (a fact removed then re-added
  in the same update is neither).
* :class:`ChangeLog`: every store's changes during one update, plus which stores the update
  created and dropped; keyed by the store objects themselves.
* :class:`Journal`: the update's changes as a persistent copy (the agent's SQLite file) needs
  them: the explicit-fact changes, and per hyper-node, by its stable name, either "written in
  full" or its net changes (and the name it had before, when a reduced hyper-node kept its IDB
  under a new name).
* :func:`visible_difference`: how the union of a hyper-node's lower stores changed. A fact
  derived in two hyper-nodes disappears for a reader only when both lose it.

Nothing here evaluates rules: these are functions of stores and change sets.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field

from pyroaring import BitMap

from agent.engine.storage.store import EMPTY, DataStore, Relation, RelationKey
from agent.engine.storage.subject_facts import (
    SubjectFacts,
    SubjectMap,
    absent,
    as_bitmap,
    bitmaps_of,
    difference_by_subject,
    intersection_by_subject,
    mostly_by_subject,
    mutable,
    present_by_subject,
    shared_union_by_subject,
    subject_map,
    union_by_subject,
)

Facts = dict[RelationKey, set]


@dataclass
class InputChanges:
    """How the facts a hyper-node reads from below (the EDB and its predecessors' IDBs, as one
    union) changed: ``plus`` became visible, ``minus`` stopped being visible."""

    plus: Facts = field(default_factory=dict)
    minus: Facts = field(default_factory=dict)

    def __bool__(self) -> bool:
        return any(self.plus.values()) or any(self.minus.values())

    def size(self) -> int:
        return sum(map(len, self.plus.values())) + sum(map(len, self.minus.values()))


@dataclass
class StoreChanges:
    """What actually changed in one DataStore during an update."""

    added: Facts = field(default_factory=dict)
    removed: Facts = field(default_factory=dict)

    def add(self, key: RelationKey, facts: AbstractSet, *, owned: bool = False) -> None:
        """Record insertions as net changes: re-adding a fact removed earlier in the same
        update cancels the removal. ``owned``: as for `remove`. (A SubjectFacts is stored as
        it is, never changed: a recorded set is made a plain one before it is changed.)"""
        if not facts:
            return
        removed = self.removed.get(key)
        if removed:
            cancelled = _cancel(facts, removed)
            if cancelled is not None:
                facts, self.removed[key] = cancelled
                owned = True
        if not facts:
            return
        known = self.added.get(key)
        if known is None:
            self.added[key] = facts if owned or facts.__class__ is not set else set(facts)
        else:
            self.added[key] = known = mutable(known)
            known.update(facts)

    def remove(self, key: RelationKey, facts: AbstractSet, *, owned: bool = False) -> None:
        """Record deletions as net changes: removing a fact added earlier in the same update
        cancels the insertion. ``owned``: the caller hands ``facts`` over (no copy is made;
        it must not use the set again)."""
        if not facts:
            return
        added = self.added.get(key)
        if added:
            cancelled = _cancel(facts, added)
            if cancelled is not None:
                facts, self.added[key] = cancelled
                owned = True
        if not facts:
            return
        known = self.removed.get(key)
        if known is None:
            self.removed[key] = facts if owned or facts.__class__ is not set else set(facts)
        else:
            self.removed[key] = known = mutable(known)
            known.update(facts)

    def merge(self, other: StoreChanges) -> None:
        """Add ``other``'s changes to these (as net changes)."""
        for key, rows in other.added.items():
            self.add(key, rows)
        for key, rows in other.removed.items():
            self.remove(key, rows)

    def counts(self) -> tuple[int, int]:
        return sum(map(len, self.added.values())), sum(map(len, self.removed.values()))


def _cancel(facts: AbstractSet, opposite: AbstractSet) -> tuple[AbstractSet, AbstractSet] | None:
    """``facts`` and the recorded ``opposite`` change without the facts they share (a fact
    both added and removed in one update is neither), or None when they share none. Held
    by subject on both sides (a closure that lost a part of a component and regained some of
    it), a subject at a time on bitmaps; else as tuples, ``opposite`` made a plain set the
    record owns."""
    if isinstance(facts, SubjectFacts) and isinstance(opposite, SubjectFacts):
        mine = {s: as_bitmap(objects) for s, objects in facts.by_subject.items()}
        shared = intersection_by_subject(mine, opposite.by_subject)
        if not shared:
            return None
        theirs = {s: as_bitmap(objects) for s, objects in opposite.by_subject.items()}
        return (
            SubjectFacts(difference_by_subject(mine, shared)),
            SubjectFacts(difference_by_subject(theirs, shared)),
        )
    shared = facts & opposite
    if not shared:
        return None
    opposite = mutable(opposite)
    opposite -= shared
    return facts - shared, opposite


def difference(old: set, new: set) -> tuple[set, set]:
    """``(new - old, old - new)`` for an ``old`` set the caller hands over (it is reused).

    Why not just the two expressions: CPython's ``a - b`` walks ``a`` and ``a -= b`` walks
    ``b``. A recomputed node has either grown or shrunk a lot; the lost part is computed with
    whichever walk is over the smaller set, in place when that is ``new`` (no copy of what
    remains of ``old``)."""
    added = new - old
    if len(old) <= len(new):
        return added, old - new
    old -= new
    return added, old


@dataclass
class ChangeLog:
    """Changes of every store during one update, to compute visible differences."""

    changes: dict[DataStore, StoreChanges] = field(default_factory=dict)
    created: set[DataStore] = field(default_factory=set)
    dropped: set[DataStore] = field(default_factory=set)
    # Tuples of relations stored by subject, built once per update for the membership tests
    # below (every hyper-node reading a relation asks about the same candidates) and let go
    # with the log: id(relation) -> (relation, its size then, its tuples).
    _tuples: dict[int, tuple[Relation, int, set]] = field(default_factory=dict)
    # Visible differences already computed in this update, by relation and lower stores
    # (hyper-nodes reading the same relation over the same stores get the same answer: RS1's
    # two aggregates over the neighbour closure): (key, old ids, new ids) -> (plus, minus).
    _visible: dict[tuple, tuple[set, set]] = field(default_factory=dict)

    def record(self, store: DataStore, changes: StoreChanges) -> None:
        mine = self.changes.get(store)
        if mine is None:
            self.changes[store] = changes
        else:
            mine.merge(changes)

    def of(self, store: DataStore) -> StoreChanges | None:
        return self.changes.get(store)

    def touched(self, store: DataStore, key: RelationKey) -> set:
        mine = self.changes.get(store)
        if mine is None:
            return set()
        return mine.added.get(key, set()) | mine.removed.get(key, set())

    def changed(self, store: DataStore, key: RelationKey) -> bool:
        """Whether ``store`` gained or lost facts of ``key`` in this update."""
        mine = self.changes.get(store)
        return mine is not None and bool(mine.added.get(key) or mine.removed.get(key))

    def unchanged_below(self, stores: list[DataStore], keys: Iterable[RelationKey]) -> bool:
        """Whether no store of ``stores`` was created or dropped in this update, nor gained or
        lost a fact of ``keys``: then a node that kept them as its lower stores reads exactly
        what it read before."""
        for store in stores:
            if store in self.created or store in self.dropped:
                return False
            mine = self.changes.get(store)
            if mine is not None and any(mine.added.get(k) or mine.removed.get(k) for k in keys):
                return False
        return True

    def release(self) -> list:
        """Hand over the per-update caches (tuples built for membership tests, visible
        differences) and forget them: the caller frees them off the update's path."""
        caches = [self._tuples, self._visible]
        self._tuples, self._visible = {}, {}
        return caches

    def present(self, relation: Relation, candidates: set) -> set:
        """``relation.present(candidates)``; for many candidates against a relation stored by
        subject, through its tuples built once for the whole update. (Hyper-nodes read their
        lower stores after those are final, so the tuples stay right; a size that changed
        anyway makes them built again.)"""
        if relation.rows_built or len(candidates) * 4 < len(relation):
            return relation.present(candidates)
        known = self._tuples.get(id(relation))
        if known is None or known[0] is not relation or known[1] != len(relation):
            known = self._tuples[id(relation)] = (relation, len(relation), relation.as_set())
        return candidates & known[2]

    def held_before(self, store: DataStore, key: RelationKey, candidates: set) -> set:
        """The candidates ``store`` held before the update."""
        if store in self.created:
            return set()
        relation = store.relations.get(key)
        present = self.present(relation, candidates) if relation is not None else set()
        mine = self.changes.get(store)
        if mine is None:
            return present
        added = mine.added.get(key)
        if added:
            present -= added
        removed = mine.removed.get(key)
        if removed:
            present |= candidates & removed
        return present

    def held_after(self, store: DataStore, key: RelationKey, candidates: set) -> set:
        """The candidates ``store`` holds after the update."""
        if store in self.dropped:
            return set()
        relation = store.relations.get(key)
        return self.present(relation, candidates) if relation is not None else set()

    def in_place(self, store: DataStore, before: set[DataStore], after: set[DataStore]) -> bool:
        """Whether ``store`` was below a node both before and after the update, and neither
        appeared nor disappeared in it: then its net changes are exact (see net_changes)."""
        return (
            store in before
            and store in after
            and store not in self.created
            and store not in self.dropped
        )

    def net_changes(self, store: DataStore, key: RelationKey) -> tuple[AbstractSet, AbstractSet]:
        """What ``store`` gained and lost of ``key`` in this update, read only (the log's own
        sets). StoreChanges records net changes (a fact removed then re-added is neither), so
        these are exactly the facts held after and not before, and before and not after."""
        mine = self.changes.get(store)
        if mine is None:
            return EMPTY, EMPTY
        return mine.added.get(key, EMPTY), mine.removed.get(key, EMPTY)


@dataclass
class NodeJournal:
    """One hyper-node's part of a :class:`Journal`: ``created`` means its IDB is new (write it
    in full), otherwise ``changes`` are its net changes; ``previous`` is the name the same IDB
    had before the update (a hyper-node that lost rules keeps its IDB under a new name)."""

    created: bool
    changes: StoreChanges
    previous: str | None = None


@dataclass
class Journal:
    """What one update changed, for whoever keeps a copy of the state (the agent's SQLite
    file): ``edb`` holds the net explicit-fact changes, ``nodes`` the hyper-nodes the update
    walked (its plan) by their stable names; a hyper-node not listed is as it was.
    ``dropped`` names the hyper-nodes of before that are gone with their IDBs (one that lost
    rules and kept its IDB under a new name is the ``previous`` of a listed one instead)."""

    edb: StoreChanges = field(default_factory=StoreChanges)
    nodes: dict[str, NodeJournal] = field(default_factory=dict)
    dropped: list[str] = field(default_factory=list)


def visible_difference(
    reads: Iterable[RelationKey],
    old_lower: list[DataStore],
    new_lower: list[DataStore],
    log: ChangeLog,
) -> InputChanges:
    """How the union of a node's lower stores changed, per relation it ``reads``, between
    ``old_lower`` (the stores below it before the update) and ``new_lower`` (after).

    Candidates are the facts some lower store gained or lost (all facts of a store that
    appeared, disappeared, or entered or left the node's lower set); their membership before
    and after is decided with set operations, store by store. The common case skips all that:
    when one store alone changed a relation and stayed below the node, its net changes are the
    difference (the copies cost far less than the membership tests)."""
    # Stores below the node before and after, neither created nor dropped: the others count
    # whole (every fact they hold appeared or disappeared for this node).
    if old_lower == new_lower:  # (the usual case: the same stores below, in the same order)
        everyone = old_lower
        staying = [s for s in old_lower if s not in log.created and s not in log.dropped]
        ids = tuple(map(id, old_lower))
        signature = (ids, ids)
    else:
        before, after = set(old_lower), set(new_lower)
        everyone = list(dict.fromkeys([*old_lower, *new_lower]))
        staying = [s for s in old_lower if log.in_place(s, before, after)]
        signature = (tuple(map(id, old_lower)), tuple(map(id, new_lower)))
    changes = InputChanges()
    for key in reads:
        known = log._visible.get((key, *signature))
        if known is None:
            known = log._visible[(key, *signature)] = _visible_change(
                key, old_lower, new_lower, staying, everyone, log
            )
        plus, minus = known
        # (copies of plain sets: a module may change the sets it is given; a SubjectFacts
        # cannot be changed, and is handed on as it is, tuples built only if a module asks)
        if plus:
            changes.plus[key] = plus if isinstance(plus, SubjectFacts) else set(plus)
        if minus:
            changes.minus[key] = minus if isinstance(minus, SubjectFacts) else set(minus)
    return changes


def _visible_change(
    key: RelationKey,
    old_lower: list[DataStore],
    new_lower: list[DataStore],
    staying: list[DataStore],
    everyone: list[DataStore],
    log: ChangeLog,
) -> tuple[set, set]:
    """`visible_difference` for one relation: (plus, minus)."""
    # A store staying below the node, unchanged for this key, holds the same candidates
    # before and after: it cannot make one appear or disappear, only hide a change of
    # another store. So it is subtracted from the changes (cost: the changes) instead of
    # intersected with the candidates twice (cost: 2 x candidates).
    steady = [s for s in staying if not log.changed(s, key)]
    moving = [
        s for s in everyone if s not in steady and (key in s.relations or log.changed(s, key))
    ]
    if not moving:
        return set(), set()
    if len(moving) == 1 and moving[0] in staying:
        plus, minus = log.net_changes(moving[0], key)
    elif key[1] == 2 and mostly_by_subject(_candidate_sources(key, moving, staying, log)):
        plus, minus = _visible_change_by_subject(
            key, old_lower, new_lower, staying, steady, moving, log
        )
    else:
        candidates: set = set()
        for store in moving:
            relation = store.relations.get(key)
            if store not in staying and relation is not None:
                candidates |= relation.as_set()
            candidates |= log.touched(store, key)
        if not candidates:
            return set(), set()
        plus, minus = changed_membership(key, candidates, old_lower, new_lower, set(steady), log)
    for store in steady:
        relation = store.relations.get(key)
        if relation is not None and len(relation):
            if plus:
                plus = absent(relation, plus)
            if minus:
                minus = absent(relation, minus)
    return plus, minus


def changed_membership(
    key: RelationKey,
    candidates: set,
    old_lower: list[DataStore],
    new_lower: list[DataStore],
    steady: set[DataStore],
    log: ChangeLog,
) -> tuple[set, set]:
    """The candidates visible after but not before, and before but not after, through the
    stores that are not steady (decided store by store with set operations)."""
    held_before = set().union(
        *(log.held_before(s, key, candidates) for s in old_lower if s not in steady)
    )
    held_after = set().union(
        *(log.held_after(s, key, candidates) for s in new_lower if s not in steady)
    )
    return held_after - held_before, held_before - held_after


# --------------------------------------------------------------------------------------------
# The same a subject at a time, for binary relations whose candidates are mostly stored by
# subject (closures, compositions and copies of them, as whole stores appearing or
# disappearing when rules are added or deleted): the candidates and every membership test are
# per-subject bitmap operations, and no tuple is built for them.


def _candidate_sources(
    key: RelationKey, moving: list[DataStore], staying: list[DataStore], log: ChangeLog
) -> Iterator[AbstractSet]:
    """Where the candidates of `_visible_change` come from: the relation of every store that
    appeared, disappeared or entered or left the node's lower set, and every store's changes."""
    for store in moving:
        relation = store.relations.get(key)
        if store not in staying and relation is not None:
            yield relation  # type: ignore[misc]
        yield from log.net_changes(store, key)


def _visible_change_by_subject(
    key: RelationKey,
    old_lower: list[DataStore],
    new_lower: list[DataStore],
    staying: list[DataStore],
    steady: list[DataStore],
    moving: list[DataStore],
    log: ChangeLog,
) -> tuple[AbstractSet, AbstractSet]:
    """`_visible_change` a subject at a time, before the steady stores hide what they hold:
    (plus, minus) as SubjectFacts."""
    if all(store in staying for store in moving):
        return _visible_change_in_place(key, moving, log)
    candidates = union_by_subject(map(subject_map, _candidate_sources(key, moving, staying, log)))
    if not candidates:
        return EMPTY, EMPTY

    def held(store: DataStore, before: bool) -> dict[int, BitMap]:
        if store in (log.created if before else log.dropped):
            return {}
        relation = store.relations.get(key)
        found = present_by_subject(relation, candidates) if relation is not None else {}
        if before:
            added, removed = log.net_changes(store, key)
            if added:
                found = difference_by_subject(found, subject_map(added))
            if removed:
                back = intersection_by_subject(candidates, subject_map(removed))
                found = union_by_subject((found, back))
        return found

    quiet = set(steady)
    held_before = union_by_subject(held(s, True) for s in old_lower if s not in quiet)
    held_after = union_by_subject(held(s, False) for s in new_lower if s not in quiet)
    plus = difference_by_subject(held_after, held_before)
    minus = difference_by_subject(held_before, held_after)
    return SubjectFacts(plus), SubjectFacts(minus)


def _visible_change_in_place(
    key: RelationKey, moving: list[DataStore], log: ChangeLog
) -> tuple[AbstractSet, AbstractSet]:
    """`_visible_change_by_subject` when every store that changed ``key`` stayed below the
    node (a fact update, or a rule update that left these stores in place).

    A fact one store gained became visible unless another store held it before; one it lost
    became invisible unless another holds it now. So only the *other* stores' changes are
    tested against a store's relation: the store that derived 800 new facts is not asked
    about them, and most subjects cost nothing (RS1's new turbine: one explicit edge beside
    800 derived facts)."""
    gained = [subject_map(log.net_changes(store, key)[0]) for store in moving]
    lost = [subject_map(log.net_changes(store, key)[1]) for store in moving]
    plus = _unless_held(key, moving, gained, lost)
    minus = _unless_held(key, moving, lost, None)
    return SubjectFacts(plus), SubjectFacts(minus)


def _unless_held(
    key: RelationKey,
    stores: list[DataStore],
    changed: list[SubjectMap],
    reverse: list[SubjectMap] | None,
) -> dict[int, BitMap]:
    """The facts some store's ``changed`` holds that no store held on the other side of the
    update: before it for gains (``reverse``: what each store lost, which it held before),
    after it for losses (``reverse`` None: a store holds now what its relation holds).

    A store holds on the other side what it holds now among the facts it did not change
    itself, plus, for gains, what it lost. The maps made here share the bitmaps of the
    change sets they come from (all of them are only read)."""
    candidates = shared_union_by_subject(changed)
    if not candidates:
        return {}
    held: list[SubjectMap] = []
    for number, store in enumerate(stores):
        relation = store.relations.get(key)
        if relation is not None and len(relation):
            others = shared_union_by_subject(
                part for other, part in enumerate(changed) if other != number
            )
            unchanged = difference_by_subject(others, changed[number], share=True)
            if unchanged:
                held.append(present_by_subject(relation, unchanged))
        if reverse is not None and reverse[number]:
            held.append(intersection_by_subject(bitmaps_of(reverse[number]), candidates))
    hidden = union_by_subject(held)
    return difference_by_subject(candidates, hidden, share=True) if hidden else candidates
