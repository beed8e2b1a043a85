"""Aggregates read a subject at a time: ``aggregate( A(x, y) and B(y, t) ) on x with fn(t)``
(RS1's neighbour count and median), the members of group x being ``B[y]`` for every y in
``A[x]``, read from the relations' own buckets (bitmaps included) without making a
substitution tuple.

**Shared member sets.** When A is a symmetric closure (RS1's ``hasNeighbour``), every member
x of a component C has ``A[x] = C - {x}``: the groups of C differ only by their own member.
Reading each group on its own costs |C| values per group, |C|^2 per component (160,000 values
per aggregate for a farm of 400 turbines). Instead, subjects whose ``A[x] | {x}`` is the same
set S are read together: S's values once, sorted once, and each group's values are that list
less x's own values when x is not its own member (for ``med``, ``min`` and ``max`` a bag
that skips them, `SortedWithout`; for the others a C-level copy and deletion), computed once
for all the groups that leave out the same objects (a farm's turbines share a handful of
readings). The results are the same numbers as group by group: the functions (values.py) do
not depend on the order of their arguments, and groups with a value that is not a number are
read on their own (their error counts are kept).

**Kept between updates** (`kept_groups.KeptPartition`). A change of B (a reading replaced, added or
removed) reads again only the shared sets and lone groups that hold a changed ``B[y]``, and a
count (or a constant argument) only where the number of objects of a ``B[y]`` changed. A
change of A moves the partition along: a set whose subjects all changed alike (a new turbine
joins every neighbourhood) keeps its subjects, the others are partitioned afresh."""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Iterable, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from itertools import chain
from operator import itemgetter
from weakref import WeakKeyDictionary

from pyroaring import BitMap

from agent.engine.budget import NO_GUARD, BudgetGuard
from agent.engine.language import Aggregate, Atom, Constant, RelationKey, Variable
from agent.engine.modules.support.lookups import Lookup
from agent.engine.plan.executor import Executor
from agent.engine.storage.store import DataStoreBag
from agent.engine.values import AGGREGATES, aggregate_value

# The partitions of every subject built during one update (by its budget guard, which lives as
# long as the update): an aggregate over the same A and B as another one in the same program
# (RS1's count and median of the neighbours' readings) starts from a copy of the other's. A
# and B are below both, so they do not change in between.
_PARTITIONS: WeakKeyDictionary[BudgetGuard, dict[tuple, tuple]] = WeakKeyDictionary()

# Groups with fewer members are read on their own: finding who shares a member set costs a
# bitmap copy per group, more than reading a few members.
SHARE_AT = 32


@dataclass(frozen=True)
class SubjectShape:
    """``aggregate( A(x, y) and B(y, t) ) on x with fn(t) as R`` (or ``fn(constant)``): the
    members of group x are ``B[y]`` for every y in ``A[x]``, read a subject at a time."""

    a: RelationKey
    b: RelationKey
    a_x: int  # x's column in A (y is the other)
    b_y: int  # y's column in B (t is the other)
    constant: object | None  # the argument when it is a constant, else None (t)


def subject_shape(aggregate: Aggregate) -> SubjectShape | None:
    """The shape above, up to the order of the body and the columns of each atom (three
    distinct variables, nothing else in the body, grouped by x alone); else None."""
    body = aggregate.body
    if len(body) != 2 or len(aggregate.group_by) != 1:
        return None
    if not all(isinstance(a, Atom) and a.arity == 2 for a in body):
        return None
    if not all(isinstance(t, Variable) for a in body for t in a.terms):  # type: ignore[union-attr]
        return None
    (x,) = aggregate.group_by
    for first, second in (body, body[::-1]):
        shared = set(first.terms) & set(second.terms)  # type: ignore[union-attr]
        if len(shared) != 1 or len(set(first.terms)) != 2 or len(set(second.terms)) != 2:  # type: ignore[union-attr]
            return None
        (y,) = shared
        if x == y or x not in first.terms:  # type: ignore[union-attr]
            continue
        (t,) = set(second.terms) - {y}  # type: ignore[union-attr]
        if t == x:
            return None
        argument = aggregate.argument
        if isinstance(argument, Constant):
            constant = argument.value
        elif argument == t:
            constant = None
        else:
            return None
        return SubjectShape(
            a=first.relation,  # type: ignore[union-attr]
            b=second.relation,  # type: ignore[union-attr]
            a_x=first.terms.index(x),  # type: ignore[union-attr]
            b_y=second.terms.index(y),  # type: ignore[union-attr]
            constant=constant,
        )
    return None


def group_rows(
    function: str, groups: dict, single: bool, executor: Executor
) -> set[tuple[int, ...]]:
    """One ``(group..., result)`` row per group of member values (``single``: the keys are
    bare ids, one group column)."""
    terms = executor.terms
    rows: set[tuple[int, ...]] = set()
    for key, values in groups.items():
        result, errors = aggregate_value(function, values)
        executor.errors.count += errors
        if result is None:
            continue
        try:
            rows.add(((key,) if single else key) + (terms.encode(result),))
        except ValueError:
            executor.errors.count += 1
    return rows


Rows = dict[int, int]  # group x -> the term id of its aggregate result (no entry: no row)


def median_of_sorted(values: Sequence) -> object:
    """``statistics.median`` of values already sorted (the same expression, no sort)."""
    middle = len(values) // 2
    if len(values) % 2:
        return values[middle]
    return (values[middle - 1] + values[middle]) / 2


# Functions read straight off a sorted list (min and max: the first of equal values in sorted
# order is an equal number, so the same term).
ON_SORTED = {"med": median_of_sorted, "min": itemgetter(0), "max": itemgetter(-1)}


Outcome = tuple[int | None, int]  # a result's term id (None: no row) and the errors met


@dataclass(eq=False)  # (compared and hashed by identity: kept in sets)
class SharedSet:
    """Subjects whose groups share the member set ``closed`` (``A[x] | {x}`` for each x in
    ``xs``). Group x's members are those of ``closed`` less the objects ``owns[x]`` (``B[x]``,
    or none when x is its own member), so groups with equal ``owns`` have equal results: one
    is computed per distinct ``owns`` (``by_own``), and the last ones are kept (``outcomes``)
    so that a later read passes on only the groups whose result changed."""

    closed: AbstractSet[int]
    xs: list[int]
    loops: set[int] = field(default_factory=set)  # the xs with ``x`` in ``A[x]``
    owns: dict[int, tuple[int, ...]] = field(default_factory=dict)
    by_own: dict[tuple[int, ...], set[int]] = field(default_factory=dict)
    outcomes: dict[tuple[int, ...], Outcome] = field(default_factory=dict)
    # The members' values, sorted, as the last read found them (all numbers), kept up to
    # date by `follow_b`; None: read them again.
    values: list | None = None

    def copy(self) -> SharedSet:
        """A set of the same subjects whose own objects and results change apart from
        this one's (the member set, subjects and loops are never changed once found)."""
        by_own = {own: set(xs) for own, xs in self.by_own.items()}
        copied = SharedSet(self.closed, self.xs, self.loops, dict(self.owns), by_own)
        copied.values = None if self.values is None else list(self.values)
        return copied

    def leave(self, leaving: Iterable[int], staying: list[int]) -> None:
        """Take ``leaving`` out of the set, ``staying`` being the subjects left (the subjects
        and loops are replaced, not changed: copies share them)."""
        self.xs = staying
        gone = set(leaving)
        if not self.loops.isdisjoint(gone):
            self.loops = self.loops - gone
        for x in gone:
            own = self.owns.pop(x)
            sharing = self.by_own[own]
            sharing.discard(x)
            if not sharing:
                del self.by_own[own]

    def follow_b(self, lost: dict, gained: dict, ys: Iterable[int], decode: list) -> None:
        """Bring the kept values up to date with the objects ``ys`` of the member set lost
        and gained (by bisection: a reading replaced moves one value); a value that is not
        a number, or one not found, leaves them to be read again."""
        values = self.values
        if values is None:
            return
        for y in ys:
            for t in lost.get(y, ()):
                value = decode[t]
                at = bisect_left(values, value)
                if at == len(values) or values[at] != value:
                    self.values = None
                    return
                del values[at]
            for t in gained.get(y, ()):
                value = decode[t]
                if value.__class__ is not int and value.__class__ is not float:
                    self.values = None
                    return
                insort(values, value)

    def own(self, x: int, objects: tuple[int, ...]) -> None:
        """Record that x leaves out ``objects`` (and no longer what it left out before)."""
        before = self.owns.get(x)
        if before is not None:
            sharing = self.by_own[before]
            sharing.discard(x)
            if not sharing:
                del self.by_own[before]
        self.owns[x] = objects
        self.by_own.setdefault(objects, set()).add(x)


class GroupReader:
    """Reads the members of groups of the subject shape over the bag."""

    def __init__(
        self,
        shape: SubjectShape,
        bag: DataStoreBag,
        executor: Executor,
        function: str,
        subjects: Iterable[int] | None,
    ) -> None:
        self.b_out = Lookup(bag.relations(shape.b), shape.b_y)
        self.shape = shape
        self.bag = bag
        self.executor = executor
        self.function = function
        self.subjects = subjects
        # A's lookup, made by `partition` for the subjects it partitions.
        self.a_out: Lookup | None = None
        # A count needs the number of members only; a constant argument is repeated.
        self.counted = function == "count"
        self.sized = self.counted or shape.constant is not None
        # The function reads a few items of the sorted values by index (ON_SORTED): a shared
        # group's values are then a bag of its set's values less its own, not a copy.
        self.by_index = function in ON_SORTED

    def partition(self) -> tuple[list[int], list[SharedSet]]:
        """The subjects read on their own, and those sharing a member set ``A[x] | {x}``.

        A bitmap ``A[x]`` is matched against the sets found so far with its size and least
        member, each a C-level subset test: ``A[x] | {x}`` equals such a set ``S`` exactly
        when ``x`` is in ``S`` and ``A[x]`` is a subset of it (the sizes being equal). Only a
        subject that matches none copies its set (hashing a copy of every subject's set cost
        several times as much: a farm's 400 turbines share one)."""
        a_relations = self.bag.relations(self.shape.a)
        if self.subjects is None:
            known = _PARTITIONS.get(self.executor.guard, {}).get(self.partition_key())
            if known is not None:
                self.a_out, alone, shared = known
                return list(alone), [one.copy() for one in shared]
            self.a_out = a_out = Lookup.merged(a_relations, self.shape.a_x)
            subjects = list(a_out.keys())
        else:
            subjects = list(set(self.subjects))
            self.a_out = a_out = Lookup.some(a_relations, self.shape.a_x, set(subjects))
        alone: list[int] = []
        by_shape: dict[tuple[int, int], list[SharedSet]] = {}
        by_closed: dict[frozenset[int], SharedSet] = {}
        for x, objects in zip(subjects, a_out.values_of(subjects), strict=True):
            if not objects:  # (asked for, with no A fact now: no group)
                continue
            if len(objects) < SHARE_AT:
                alone.append(x)
                continue
            loop = x in objects
            if objects.__class__ is BitMap:
                shape = (len(objects) + (not loop), min(objects.min(), x))
                found = by_shape.setdefault(shape, [])
                for shared in found:
                    if x in shared.closed and objects.issubset(shared.closed):
                        break
                else:
                    closed = BitMap(objects)
                    closed.add(x)
                    shared = SharedSet(closed, [])
                    found.append(shared)
            else:
                key = frozenset(objects).union((x,))
                shared = by_closed.get(key) or by_closed.setdefault(key, SharedSet(key, []))
            shared.xs.append(x)
            if loop:
                shared.loops.add(x)
        sets = [*(shared for found in by_shape.values() for shared in found)]
        sets += by_closed.values()
        kept = []
        for shared in sets:
            if len(shared.xs) > 1:
                self.read_owns(shared, shared.xs)
                kept.append(shared)
            else:
                alone.extend(shared.xs)
        if self.subjects is None and self.executor.guard is not NO_GUARD:
            found = _PARTITIONS.setdefault(self.executor.guard, {})
            found[self.partition_key()] = (a_out, list(alone), kept)  # (copied when read)
        return alone, kept

    def partition_key(self) -> tuple:
        """What a partition of every subject depends on: A and B, by the relations the bag
        reads them from (and their sizes, a guard: within one update they do not change),
        and their columns."""
        shape, bag = self.shape, self.bag
        a, b = bag.relations(shape.a), bag.relations(shape.b)
        return (
            shape.a_x,
            shape.b_y,
            tuple(map(id, a)),
            tuple(map(id, b)),
            tuple(map(len, a)),
            tuple(map(len, b)),
        )

    def read_owns(self, shared: SharedSet, xs: Iterable[int]) -> None:
        """Record what each of ``xs`` leaves out of its set's members: its own objects in
        B, sorted (a bitmap's come sorted), or none when it is its own member."""
        loops = shared.loops
        for x, objects in zip(xs, self.b_out.values_of(xs), strict=True):
            if x in loops or not objects:
                own: tuple[int, ...] = ()
            elif objects.__class__ is BitMap or len(objects) == 1:
                own = tuple(objects)
            else:
                own = tuple(sorted(objects))
            shared.own(x, own)

    def rows(self, alone: Iterable[int], shared: Iterable[SharedSet]) -> Rows:
        """The results of the groups of ``alone`` and of every subject of the ``shared``
        sets."""
        found = self.alone_rows(alone)
        for one in shared:
            found.update(self.shared_rows(one))
        return found

    def alone_rows(self, subjects: AbstractSet[int] | list[int]) -> Rows:
        """Results group by group, each group's members read (A through the partition's
        lookup when it holds them, else through one made for these subjects)."""
        a_out = self.a_out
        if a_out is None:
            a_out = Lookup.some(self.bag.relations(self.shape.a), self.shape.a_x, set(subjects))
        groups = self.members(subjects, a_out)
        return dict(group_rows(self.function, groups, True, self.executor))

    def members(self, subjects: Iterable[int], a_out: Lookup) -> dict[int, Sequence]:
        """Group x's member values (one per distinct substitution ``(x, y, t)``: ``t`` for
        every y in ``A[x]`` and t in ``B[y]``, decoded; or the constant argument as many
        times; for a count, a range of the number of members)."""
        b_out = self.b_out
        decode = self.executor.terms.values
        constant = self.shape.constant
        tick = self.executor.guard.tick
        grouped: dict[int, Sequence] = {}
        for x in subjects:
            tick()
            buckets = b_out.values_of(a_out(x))
            if self.sized:
                size = sum(map(len, buckets))
                found: Sequence = range(size) if self.counted else [constant] * size
            else:
                found = [decode[t] for t in chain.from_iterable(buckets)]
            if found:
                grouped[x] = found
        return grouped

    def shared_rows(
        self, shared: SharedSet, moved: Iterable[int] | None = None
    ) -> dict[int, int | None]:
        """The results of a shared set's groups: the set's members read once (their number,
        or their values sorted), and one result computed per distinct ``owns`` (the members
        less those objects' values). A set with a value that is not a number is read group by
        group (its errors are counted as plain evaluation counts them).

        With ``moved`` (the subjects whose ``owns`` changed since the last read), only the
        groups whose result may differ from the last read's are given, None for no row:
        those of an ``owns`` whose result changed, and the moved ones. Without, every group
        with a row is."""
        self.executor.guard.tick()
        buckets = self.b_out.values_of(shared.closed)
        decode = self.executor.terms.values
        if self.sized:
            total = sum(map(len, buckets))
            constant = self.shape.constant

            def result(own: tuple[int, ...]) -> tuple[object | None, int]:
                size = total - len(own)
                values = range(size) if self.counted else [constant] * size
                return aggregate_value(self.function, values) if size else (None, 0)

        else:
            values = shared.values
            if values is None:
                values = [decode[t] for t in chain.from_iterable(buckets)]
                if not all(v.__class__ is int or v.__class__ is float for v in values):
                    shared.outcomes.clear()  # (the next read gives every group again)
                    found = self.alone_rows(shared.xs)
                    return found if moved is None else {**dict.fromkeys(shared.xs), **found}
                values.sort()
                shared.values = values
            function = ON_SORTED.get(self.function) or AGGREGATES[self.function]

            def result(own: tuple[int, ...]) -> tuple[object | None, int]:
                mine: Sequence = values
                if own and self.by_index:
                    mine = SortedWithout(
                        values, sorted(bisect_left(values, decode[t]) for t in own)
                    )
                elif own:
                    mine = values.copy()
                    for t in own:
                        del mine[bisect_left(mine, decode[t])]
                return (function(mine), 0) if mine else (None, 0)

        encode, errors = self.executor.terms.encode, self.executor.errors
        before = shared.outcomes
        outcomes: dict[tuple[int, ...], Outcome] = {}
        found: dict[int, int | None] = {}
        for own, xs in shared.by_own.items():
            value, failed = result(own)
            row = None
            if value is not None:
                try:
                    row = encode(value)
                except ValueError:
                    failed += 1
            outcomes[own] = outcome = (row, failed)
            if moved is None:
                errors.count += failed * len(xs)
                if row is not None:
                    found.update(dict.fromkeys(xs, row))
            elif before.get(own) != outcome:
                errors.count += failed * len(xs)
                found.update(dict.fromkeys(xs, row))
        if moved is not None:
            for x in moved:
                if x not in found:
                    row, failed = outcomes[shared.owns[x]]
                    errors.count += failed
                    found[x] = row
        shared.outcomes = outcomes
        return found


class SortedWithout(Sequence):
    """A sorted list less the items at some positions, read by index without a copy: a
    shared group's values, its member set's values less its own (distinct terms, so
    distinct numbers: each at its own position, the first of its equals). ``med``, ``min``
    and ``max`` read one or two items; a copy of the list per group cost more than the
    rest of the group's reading."""

    __slots__ = ("values", "gone")

    def __init__(self, values: list, gone: list[int]) -> None:
        self.values = values
        self.gone = gone  # ascending positions in ``values``

    def __len__(self) -> int:
        return len(self.values) - len(self.gone)

    def __getitem__(self, index):  # type: ignore[override]
        size = len(self)
        if index < 0:
            index += size
        if not 0 <= index < size:
            raise IndexError(index)
        for position in self.gone:  # the index-th item kept: skip each gone one up to it
            if position > index:
                break
            index += 1
        return self.values[index]
