"""The partition of a subject-shaped aggregate's groups (subject_groups.py), kept between
updates so that an update reads again only the groups it can change: RS1's everyday update
replaces a reading, and its count and median over a farm's 400 neighbourhoods then read one
shared member set again, not 400 groups."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from collections.abc import Set as AbstractSet
from itertools import repeat

from pyroaring import BitMap

from agent.engine.modules.support.lookups import Lookup, python_set, subjects_meeting
from agent.engine.modules.support.subject_changes import NO_IDS, group_by_column
from agent.engine.modules.support.subject_groups import GroupReader, SharedSet, SubjectShape
from agent.engine.storage.changes import InputChanges
from agent.engine.storage.store import DataStoreBag
from agent.engine.storage.subject_facts import column_counts

# Changed objects of B above which a shared set's kept values are read again rather than
# followed value by value.
FOLLOWED_CHANGES = 64


def subjects_reaching(shape: SubjectShape, bag: DataStoreBag, ys: AbstractSet[int]) -> set[int]:
    """Every x with ``A(x, y)`` for one of ``ys``."""
    if not ys:
        return set()
    if shape.a_x == 0:  # (a test per subject in C, no Python step per (x, y))
        return subjects_meeting(bag.relations(shape.a), ys)
    found: set[int] = set()
    a_in = Lookup.some(bag.relations(shape.a), 1 - shape.a_x, python_set(ys))
    for y in ys:
        found.update(a_in(y))
    return found


def alike(
    xs: list[int], gained: dict[int, BitMap], lost: dict[int, BitMap]
) -> tuple[list[int], list[int], BitMap, BitMap]:
    """Split a shared set's subjects into those that stay a set and those that leave it. The
    staying ones are those whose ``A[x]`` gained the same objects ``plus`` and lost the same
    ``minus`` (none, for the subjects A did not change for), none of those objects being one
    of these subjects: each of them then has the set's member set ``A[x] | {x}`` changed that
    way. The change most subjects share is found by the sizes of what each gained and lost
    (counted in C), then checked exactly (a turbine leaving a farm: 400 subjects lose it, it
    loses the 400; a chain cut near its end: each part loses the other, and the larger part
    stays). Fewer than two alike: none stays. Returns (staying, leaving, plus, minus)."""
    sizes = list(
        zip(
            map(len, map(gained.get, xs, repeat(NO_IDS))),
            map(len, map(lost.get, xs, repeat(NO_IDS))),
            strict=True,
        )
    )
    common, _ = Counter(sizes).most_common(1)[0]
    first = xs[sizes.index(common)]
    plus, minus = gained.get(first, NO_IDS), lost.get(first, NO_IDS)
    staying: list[int] = []
    leaving: list[int] = []
    for x, size in zip(xs, sizes, strict=True):
        same = (
            size == common
            and gained.get(x, NO_IDS) == plus
            and lost.get(x, NO_IDS) == minus
            and x not in plus
            and x not in minus
        )
        (staying if same else leaving).append(x)
    if len(staying) < 2:
        return [], xs, plus, minus
    return staying, leaving, plus, minus


class KeptPartition:
    """A subject-shaped aggregate's partition (`GroupReader.partition` over every subject),
    kept between updates, so that an update reads again only the groups it can change.

    * **B changed** (RS1's everyday update: a reading replaced): the sets and lone groups
      that hold a changed ``B[y]`` are read again, each shared set once
      (`GroupReader.shared_rows`, which passes on only the groups whose result changed). A
      count or a constant argument depends on the number of each ``B[y]`` only: a change
      that keeps every such number affects none of its groups.
    * **A changed** (`follow_a`): the subjects of a set that all gained and lost the same
      objects (a new turbine joins every neighbourhood of a farm, or leaves them all), or
      that A did not change for, stay one set, its member set changed that way (`alike`);
      the set's other subjects (the turbine that left), lone subjects A changed for and new
      subjects are partitioned afresh, and a new one whose member set is a kept set's joins
      it."""

    def __init__(self, shape: SubjectShape, alone: list[int], shared: list[SharedSet]) -> None:
        self.shape = shape  # (the aggregate's, found once: the rule never changes)
        self.alone = set(alone)
        self.shared = shared
        self.set_of = {x: one for one in shared for x in one.xs}

    def changed_rows(self, reader: GroupReader, changes: InputChanges) -> dict[int, int | None]:
        """The results now (None: no row) of the groups the change can affect."""
        shape = reader.shape
        found: dict[int, int | None] = {}
        moved: dict[SharedSet, list[int]] = {}  # a set -> its subjects to give in any case
        stale: set[SharedSet] = set()  # the sets whose member set changed
        done: set[SharedSet] = set()  # the sets read whole already
        a_plus, a_minus = changes.plus.get(shape.a), changes.minus.get(shape.a)
        if a_plus or a_minus:
            self.follow_a(reader, a_plus or (), a_minus or (), found, moved, stale, done)
        net: dict[int, int] = {}  # y -> how many objects B[y] gained (lost: negative)
        b_minus, b_plus = changes.minus.get(shape.b), changes.plus.get(shape.b)
        for delta, sign in ((b_minus, -1), (b_plus, 1)):
            for y, count in column_counts(delta or (), shape.b_y).items():
                net[y] = net.get(y, 0) + sign * count
        for y in net:  # (what a subject leaves out of its set's members is its own B[y])
            one = self.set_of.get(y)
            if one is not None and one not in done:
                reader.read_owns(one, (y,))
                moved.setdefault(one, []).append(y)
        ys = {y for y, count in net.items() if count} if reader.sized else set(net)
        ys_bitmap = BitMap(ys)
        b_lost = b_gained = None  # (B's changes by y, grouped when kept values need them)
        for one in self.shared:
            if one in done:
                continue
            closed = one.closed
            meets = (
                closed.intersect(ys_bitmap)
                if closed.__class__ is BitMap
                else not closed.isdisjoint(ys)
            )
            if meets and one.values is not None:  # (None after a change of its member set)
                if len(ys) > FOLLOWED_CHANGES:
                    one.values = None  # (reading the set again costs less)
                else:
                    if b_lost is None or b_gained is None:
                        b_lost = group_by_column(b_minus or (), shape.b_y)
                        b_gained = group_by_column(b_plus or (), shape.b_y)
                    decode = reader.executor.terms.values
                    one.follow_b(b_lost, b_gained, filter(closed.__contains__, ys), decode)
            if meets or one in stale:  # (a subject whose B changed is in its set: it
                # meets, but for a count only a change of B's size does: the same number of
                # own objects leaves the same number of members)
                found.update(reader.shared_rows(one, moved.get(one, ())))
        if self.alone and ys:
            reached = subjects_reaching(shape, reader.bag, ys) & self.alone
            found.update(dict.fromkeys(reached))
            found.update(reader.alone_rows(reached))
        return found

    def follow_a(
        self,
        reader: GroupReader,
        a_plus: Iterable[tuple[int, int]],
        a_minus: Iterable[tuple[int, int]],
        found: dict[int, int | None],
        moved: dict[SharedSet, list[int]],
        stale: set[SharedSet],
        done: set[SharedSet],
    ) -> None:
        """Bring the partition up to date with a change of A (class docstring): the sets
        whose member set changed go to ``stale``; the subjects partitioned afresh get their
        results in ``found`` (None: no row), their new sets go to ``done``; a subject that
        joined a kept set goes to ``moved`` for it."""
        shape = reader.shape
        gained = group_by_column(a_plus, shape.a_x)
        lost = group_by_column(a_minus, shape.a_x)
        changed = gained.keys() | lost.keys()
        loose = changed - self.set_of.keys()  # lone and new subjects
        self.alone -= loose
        kept = []
        for one in self.shared:
            xs = one.xs
            if changed.isdisjoint(xs):
                kept.append(one)
                continue
            staying, leaving, plus, minus = alike(xs, gained, lost)
            loose.update(leaving)
            for x in leaving:
                del self.set_of[x]
            if not staying:  # (the whole set is partitioned afresh)
                continue
            if leaving:
                one.leave(leaving, staying)
            if plus or minus:  # (each x's A[x] | {x} is the set's, changed the same way)
                closed = one.closed
                closed = (
                    (closed | plus) - minus
                    if closed.__class__ is BitMap
                    else ((closed | frozenset(plus)) - frozenset(minus))
                )
                one.closed = closed  # (a new object: copies share the old one)
                one.values = None
                stale.add(one)
            kept.append(one)
        self.shared = kept
        self.merge_equal([one for one in kept if one in stale], stale)
        if not loose:
            return
        found.update(dict.fromkeys(loose))
        fresh = GroupReader(shape, reader.bag, reader.executor, reader.function, loose)
        alone, shared = fresh.partition()
        alone = self.join_kept(fresh, alone, moved, stale)
        found.update(fresh.rows(alone, shared))
        self.alone.update(alone)
        for one in shared:
            done.add(one)
            self.shared.append(one)
            for x in one.xs:
                self.set_of[x] = one

    def merge_equal(self, changed: list[SharedSet], stale: set[SharedSet]) -> None:
        """Make one set of changed sets whose member sets became equal (two components
        joined by an edge: each side gained the other), so that the set is read once; the
        merged set has no results yet (each of its groups is given again)."""
        by_shape: dict[tuple, list[SharedSet]] = {}
        for one in changed:
            closed = one.closed
            if closed:
                least = closed.min() if closed.__class__ is BitMap else min(closed)
                by_shape.setdefault((len(closed), least), []).append(one)
        for same in by_shape.values():
            while len(same) > 1:
                first, rest = same[0], same[1:]
                equal = [one for one in rest if one.closed == first.closed]
                same = [one for one in rest if one.closed != first.closed]
                if not equal:
                    continue
                merged = SharedSet(first.closed, list(first.xs), set(first.loops))
                for one in (first, *equal):
                    merged.xs += one.xs if one is not first else ()
                    merged.loops |= one.loops
                    for x in one.xs:
                        merged.own(x, one.owns[x])
                        self.set_of[x] = merged
                gone = {first, *equal}
                self.shared = [one for one in self.shared if one not in gone]
                self.shared.append(merged)
                stale.add(merged)

    def join_kept(
        self,
        fresh: GroupReader,
        alone: list[int],
        moved: dict[SharedSet, list[int]],
        stale: set[SharedSet],
    ) -> list[int]:
        """Put each of ``alone`` whose ``A[x] | {x}`` is a kept set's member set into that
        set (a new turbine of a farm); returns the others."""
        if not self.shared or not alone:
            return alone
        assert fresh.a_out is not None
        by_size: dict[int, list[SharedSet]] = {}
        for one in self.shared:
            by_size.setdefault(len(one.closed), []).append(one)
        others = []
        for x in alone:
            objects = fresh.a_out(x)
            loop = x in objects
            for one in by_size.get(len(objects) + (not loop), ()):
                if x in one.closed and all(map(one.closed.__contains__, objects)):
                    # (copies share xs and loops: both are replaced, not changed)
                    one.xs = [*one.xs, x]
                    if loop:
                        one.loops = one.loops | {x}
                    fresh.read_owns(one, (x,))
                    self.set_of[x] = one
                    moved.setdefault(one, []).append(x)
                    stale.add(one)
                    break
            else:
                others.append(x)
        return others
