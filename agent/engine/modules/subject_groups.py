"""Aggregates read a subject at a time: ``aggregate( A(x, y) and B(y, t) ) on x with fn(t)``
(RS1's neighbour count and median), the members of group x being ``B[y]`` for every y in
``A[x]``, read from the relations' own buckets (bitmaps included) without making a
substitution tuple.

**Shared member sets.** When A is a symmetric closure (RS1's ``hasNeighbour``), every member
x of a component C has ``A[x] = C - {x}``: the groups of C differ only by their own member.
Reading each group on its own costs |C| values per group, |C|^2 per component (160,000 values
per aggregate for a farm of 400 turbines). Instead, subjects whose ``A[x] | {x}`` is the same
set S are read together: S's values once, sorted once, and each group's values are that list
less x's own values when x is not its own member (for ``med``, ``min`` and ``max`` a view
that skips them, `SortedWithout`; for the others a C-level copy and deletion). The results
are the same numbers as group by group: the functions (values.py) do not depend on the order
of their arguments, and groups with a value that is not a number are read on their own (their
error counts are kept)."""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from itertools import chain
from operator import itemgetter

from pyroaring import BitMap

from ..changes import InputChanges
from ..executor import Executor
from ..language import Aggregate, Atom, Constant, RelationKey, Variable
from ..store import DataStoreBag
from ..subject_facts import column_values
from ..values import AGGREGATES, aggregate_value
from .lookups import Lookup, subjects_meeting

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
    aggregate: Aggregate, groups: dict, single: bool, executor: Executor
) -> set[tuple[int, ...]]:
    """One ``(group..., result)`` row per group of member values (``single``: the keys are
    bare ids, one group column)."""
    terms = executor.terms
    rows: set[tuple[int, ...]] = set()
    for key, values in groups.items():
        result, errors = aggregate_value(aggregate.function, values)
        executor.errors[0] += errors
        if result is None:
            continue
        try:
            rows.add(((key,) if single else key) + (terms.encode(result),))
        except ValueError:
            executor.errors[0] += 1
    return rows


def subject_rows(
    aggregate: Aggregate,
    shape: SubjectShape,
    view: DataStoreBag,
    executor: Executor,
    subjects: Iterable[int] | None = None,
) -> set[tuple[int, int]]:
    """The rows ``(x, result)`` of the given subjects (or of every subject of A), groups that
    share their member set read together (module docstring)."""
    reader = GroupReader(shape, view, executor, aggregate.function, subjects)
    alone, shared = reader.partition()
    rows = group_rows(aggregate, reader.members(alone), True, executor)
    for closed, xs in shared:
        groups = reader.shared_members(closed, xs)
        if groups is None:  # a value that is not a number: group by group
            groups = reader.members(xs)
            rows |= group_rows(aggregate, groups, True, executor)
            continue
        if reader.sized:  # (counts, constants: the values are not read)
            rows |= group_rows(aggregate, groups, True, executor)
        else:
            rows |= number_rows(aggregate, groups, executor)
    return rows


def median_of_sorted(values: Sequence) -> object:
    """``statistics.median`` of values already sorted (the same expression, no sort)."""
    middle = len(values) // 2
    if len(values) % 2:
        return values[middle]
    return (values[middle - 1] + values[middle]) / 2


# Functions read straight off a sorted list (min and max: the first of equal values in sorted
# order is an equal number, so the same term).
ON_SORTED = {"med": median_of_sorted, "min": itemgetter(0), "max": itemgetter(-1)}


def number_rows(aggregate: Aggregate, groups: dict, executor: Executor) -> set:
    """`group_rows` for groups of numbers only, each sorted (no value to skip, no error to
    count)."""
    name = aggregate.function
    function, encode = ON_SORTED.get(name) or AGGREGATES[name], executor.terms.encode
    rows = set()
    for x, values in groups.items():
        try:
            rows.add((x, encode(function(values))))
        except ValueError:
            executor.errors[0] += 1
    return rows


class GroupReader:
    """Reads the members of groups of the subject shape over the view."""

    def __init__(
        self,
        shape: SubjectShape,
        view: DataStoreBag,
        executor: Executor,
        function: str,
        subjects: Iterable[int] | None,
    ) -> None:
        a_relations = view.relations(shape.a)
        if subjects is None:
            self.a_out = Lookup.merged(a_relations, shape.a_x)
            self.subjects: Iterable[int] = self.a_out.keys()
        else:
            self.subjects = set(subjects)
            self.a_out = Lookup.some(a_relations, shape.a_x, self.subjects)
        self.b_out = Lookup(view.relations(shape.b), shape.b_y)
        self.shape = shape
        self.executor = executor
        # A count needs the number of members only; a constant argument is repeated.
        self.counted = function == "count"
        self.sized = self.counted or shape.constant is not None
        # The subjects of a shared member set that are their own member (``x`` in ``A[x]``),
        # found by `partition` and read by `shared_members`.
        self.loops: set[int] = set()
        # The function reads a few items of the sorted values by index (ON_SORTED): a shared
        # group's values are then a view of its set's values less its own, not a copy.
        self.by_index = function in ON_SORTED

    def partition(self) -> tuple[list[int], list[tuple[AbstractSet[int], list[int]]]]:
        """The subjects read on their own, and those sharing a member set ``A[x] | {x}``.

        A bitmap ``A[x]`` is matched against the sets found so far with its size and least
        member, each a C-level subset test: ``A[x] | {x}`` equals such a set ``S`` exactly
        when ``x`` is in ``S`` and ``A[x]`` is a subset of it (the sizes being equal). Only a
        subject that matches none copies its set (hashing a copy of every subject's set cost
        several times as much: a farm's 400 turbines share one)."""
        subjects = list(self.subjects)
        alone: list[int] = []
        by_shape: dict[tuple[int, int], list[tuple[BitMap, list[int]]]] = {}
        by_closed: dict[frozenset[int], list[int]] = {}
        loops = self.loops
        for x, objects in zip(subjects, self.a_out.values_of(subjects), strict=True):
            if len(objects) < SHARE_AT:
                alone.append(x)
                continue
            if x in objects:
                loops.add(x)
            if objects.__class__ is BitMap:
                shape = (len(objects) + (x not in loops), min(objects.min(), x))
                found = by_shape.setdefault(shape, [])
                for closed, xs in found:
                    if x in closed and objects.issubset(closed):
                        xs.append(x)
                        break
                else:
                    closed = BitMap(objects)
                    closed.add(x)
                    found.append((closed, [x]))
            else:
                by_closed.setdefault(frozenset(objects).union((x,)), []).append(x)
        groups: list[tuple[AbstractSet[int], list[int]]] = [
            *(group for found in by_shape.values() for group in found),
            *by_closed.items(),
        ]
        shared = []
        for closed, xs in groups:
            if len(xs) > 1:
                shared.append((closed, xs))
            else:
                alone.extend(xs)
        return alone, shared

    def members(self, subjects: Iterable[int]) -> dict[int, Sequence]:
        """Group x's member values (one per distinct substitution ``(x, y, t)``: ``t`` for
        every y in ``A[x]`` and t in ``B[y]``, decoded; or the constant argument as many
        times; for a count, a range of the number of members)."""
        a_out, b_out = self.a_out, self.b_out
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

    def shared_members(self, closed: AbstractSet[int], xs: list[int]) -> dict | None:
        """`members` of the subjects ``xs``, which share the member set ``closed`` (each is
        in it, and is its own member only when ``A[x]`` holds it): the set's values read and
        sorted once. None when a value is not a number (then read group by group). (Called
        on `partition`'s result, which knows who is their own member.)"""
        b_out, loops = self.b_out, self.loops
        self.executor.guard.tick()
        if self.sized:
            sizes = dict(zip(closed, map(len, b_out.values_of(closed)), strict=True))
            total = sum(sizes.values())
            grouped: dict = {}
            for x in xs:
                size = total if x in loops else total - sizes[x]
                if size:
                    grouped[x] = range(size) if self.counted else [self.shape.constant] * size
            return grouped
        decode = self.executor.terms.values
        values = [decode[t] for t in chain.from_iterable(b_out.values_of(closed))]
        if not all(v.__class__ is int or v.__class__ is float for v in values):
            return None
        values.sort()
        grouped = {}
        for x in xs:
            mine: Sequence = values
            if x not in loops:
                own = b_out(x)
                if own and self.by_index:
                    gone = sorted(bisect_left(values, decode[t]) for t in own)
                    mine = SortedWithout(values, gone)
                elif own:
                    mine = values.copy()
                    for t in own:
                        del mine[bisect_left(mine, decode[t])]
            if mine:
                grouped[x] = mine
        return grouped


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


def affected_subjects(
    shape: SubjectShape, view: DataStoreBag, changes: InputChanges, enough: float | None = None
) -> set[int]:
    """The groups a change can affect: x of every changed A fact, and every x with ``A(x, y)``
    (over the new state) for the y of a changed B fact (an A fact deleted at the same time
    names its x itself). When A's changes alone name more than ``enough`` groups, those are
    returned without looking B's up (the caller recomputes every group then)."""
    found: set[int] = set()
    ys: set[int] = set()
    for delta in (changes.minus.get(shape.a), changes.plus.get(shape.a)):
        if delta:
            found |= column_values(delta, shape.a_x)
    if enough is not None and len(found) > enough:
        return found
    for delta in (changes.minus.get(shape.b), changes.plus.get(shape.b)):
        if delta:
            ys |= column_values(delta, shape.b_y)
    if ys and shape.a_x == 0:  # (a test per subject in C, no Python step per (x, y))
        found |= subjects_meeting(view.relations(shape.a), ys)
    elif ys:
        a_in = Lookup.some(view.relations(shape.a), 1 - shape.a_x, ys)
        for y in ys:
            found.update(a_in(y))
    return found
