"""Reading a binary relation of the bag by one column, a key at a time, over the union of the
relations holding it (a hyper-node reads the EDB and lower IDBs through a DataStoreBag): what
the modules that work a subject at a time (composition.py, aggregate.py) share."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from collections.abc import Set as AbstractSet
from itertools import chain, compress, repeat
from operator import itemgetter

from pyroaring import BitMap

from agent.engine.modules.base import by_column
from agent.engine.storage.store import EMPTY, SUBJECT, Relation, grouped_by, lists_by_first
from agent.engine.storage.subject_facts import relation_by_subject, shared_union_by_subject


class Lookup:
    """The values a relation of the bag pairs with a key on one column, over the union of
    the relations holding it: each relation's index on that column (`base.by_column`: an
    existing one as it is, a subject-keyed relation's own buckets included, else one built).
    Values are read only."""

    def __init__(self, relations: list[Relation], column: int) -> None:
        self.indexes = [by_column(r, column) for r in relations if len(r)]

    @classmethod
    def some(cls, relations: list[Relation], column: int, keys: AbstractSet[int]) -> Lookup:
        """A lookup good for ``keys`` only: through an index a relation already has, else by
        one C-level pass over its facts keeping those whose ``column`` is a key (an update
        usually asks for a few keys, and building an index costs a Python step per fact)."""
        holding = [r for r in relations if len(r)]
        if len(holding) == 1:
            index = _index_on(holding[0], column)
            if index is not None:
                lookup = cls([], column)
                lookup.indexes = [index]  # the index itself, no copy
                return lookup
        found: dict[int, AbstractSet[int]] = {}
        keys = python_set(keys)
        keys_bitmap = None  # (built for a relation stored by subject: see below)
        for relation in holding:
            if not keys:
                break
            index = _index_on(relation, column)
            if index is not None:
                for key in keys:
                    values = index.get(key)
                    if values:
                        add_all(found, key, values)
            elif relation.rows_built:
                rows = relation.tuples
                hits = compress(rows, map(keys.__contains__, map(itemgetter(column), rows)))
                for key, values in grouped_by(hits, column).items():
                    add_all(found, key, values)
            else:  # subject-keyed, asked by object: the keys among each subject's objects
                if keys_bitmap is None:  # (a set's intersection would iterate the bitmap)
                    keys_bitmap = BitMap(keys)
                for key, subjects in _inverted(relation, keys, keys_bitmap).items():
                    add_all(found, key, subjects)
        lookup = cls([], column)
        lookup.indexes = [found]
        return lookup

    @classmethod
    def merged(cls, relations: list[Relation], column: int) -> Lookup:
        """A lookup for a reader that asks about every key: the relations' indexes united
        once, a key at a time into bitmaps (``__call__`` over several relations would unite a
        key's sets again at every call). By subject (column 0), a relation kept as tuples only
        is grouped for the reader and not given an index it would keep."""

        def read(relation: Relation) -> dict:
            return relation_by_subject(relation) if column == 0 else by_column(relation, column)

        holding = [r for r in relations if len(r)]
        lookup = cls([], column)
        if len(holding) == 1:
            lookup.indexes = [read(holding[0])]
        elif holding:  # (read only: a bitmap no other relation adds to is not copied)
            lookup.indexes = [shared_union_by_subject(map(read, holding))]
        return lookup

    def __call__(self, key: int) -> AbstractSet[int]:
        indexes = self.indexes
        if len(indexes) == 1:
            return indexes[0].get(key, EMPTY)
        found = [got for index in indexes if (got := index.get(key))]
        if len(found) <= 1:
            return found[0] if found else EMPTY
        return set().union(*found)

    def values_of(self, keys: Iterable[int]) -> Iterator[AbstractSet[int]]:
        """The values of each key in turn: ``map(self, keys)``, but one C-level ``dict.get``
        per key when a single index holds the relation (a group with thousands of members
        would otherwise pay a Python call for each)."""
        if len(self.indexes) == 1:
            return map(self.indexes[0].get, keys, repeat(EMPTY))
        return map(self, keys)

    def items(self) -> Iterable[tuple[int, AbstractSet[int]]]:
        """Every key with its values (over several relations, united key by key)."""
        if len(self.indexes) == 1:
            return self.indexes[0].items()
        return ((key, self(key)) for key in self.keys())

    def keys(self) -> Iterable[int]:
        if len(self.indexes) == 1:
            return self.indexes[0].keys()
        return set().union(*(index.keys() for index in self.indexes))


def _index_on(relation: Relation, column: int) -> dict | None:
    """An index the relation already has on ``column``: its own, or a bucketed one."""
    index = relation.existing_index((column,))
    return index if index is not None else relation.existing_bucketed_index(column)


def reach(
    relations: list[Relation], column: int, values_by_key: dict[int, BitMap]
) -> dict[int, BitMap]:
    """``x -> the union of values_by_key[y]`` over the facts of the (binary) relations with
    ``y`` at ``column``, a key of ``values_by_key``, and ``x`` at the other column: the
    composition module's "every x with A(x, y) gains (or may lose) the z that B gained (or
    lost) at y". Through an index on ``column`` where a relation has one, else by one pass:
    over its tuples, or, for a relation stored by subject (``x``), over its subjects, with
    no Python step per ``(x, y)`` pair (inverting the relation first cost one per pair:
    20,000 for RS3's ``p30`` when r6 is added or deleted): each subject's keys found by a
    bitmap intersection and their values united in C, or, when the values are few, each
    value's keys tested against the subject's (`FEW_VALUES`)."""
    reached: dict[int, BitMap] = {}
    if not values_by_key:
        return reached
    keys_bitmap = by_value = None
    for relation in relations:
        if not len(relation):
            continue
        index = _index_on(relation, column)
        if index is None and relation.rows_built:
            rows = relation.tuples
            contains = values_by_key.__contains__
            hits = compress(rows, map(contains, map(itemgetter(column), rows)))
            index = grouped_by(hits, column)
        if index is not None:
            for key, values in values_by_key.items():
                for x in index.get(key, EMPTY):
                    add_into(reached, x, values)
            continue
        if keys_bitmap is None:  # (for either kind of bucket: a set meets a set in C)
            keys, keys_bitmap = set(values_by_key), BitMap(values_by_key)
            by_value = _keys_by_value(values_by_key)
        get = values_by_key.get
        for x, ys in relation.existing_index(SUBJECT).items():  # type: ignore[union-attr]
            if by_value is not None:  # a test per value, no union
                if ys.__class__ is BitMap:
                    got = [value for value, keys_in, _ in by_value if ys.intersect(keys_in)]
                else:
                    got = [value for value, _, keys_in in by_value if not keys_in.isdisjoint(ys)]
                if not got:
                    continue
                gained = BitMap(got)
            else:
                hits = ys & keys_bitmap if ys.__class__ is BitMap else keys.intersection(ys)
                if not hits:
                    continue
                gained = BitMap().union(*map(get, hits))
            known = reached.get(x)
            if known is None:
                reached[x] = gained
            else:
                known |= gained
    return reached


FEW_VALUES = 8
"""At most this many distinct values over all keys: `reach` tests each subject against each
value's keys (a C-level test each) instead of uniting the values of every key it meets, which
costs a bitmap per key met. Many keys with one value is common (a node that many subjects
point to loses or gains them all: RS3's ``p30`` when r6 goes, 20,000 keys met, one value)."""


def _keys_by_value(
    values_by_key: dict[int, BitMap],
) -> list[tuple[int, BitMap, set[int]]] | None:
    """``(value, the keys holding it as a bitmap and as a set)`` for each value, or None when
    there are more than FEW_VALUES values."""
    every = BitMap().union(*values_by_key.values())
    if len(every) > FEW_VALUES:
        return None
    grouped = []
    for value in every:
        keys = [key for key, values in values_by_key.items() if value in values]
        grouped.append((value, BitMap(keys), set(keys)))
    return grouped


def add_into(grouped: dict[int, BitMap], key: int, values: BitMap) -> None:
    """``values`` added to ``grouped[key]`` (a copy of them for a new key)."""
    known = grouped.get(key)
    if known is None:
        grouped[key] = values.copy()
    else:
        known |= values


def _inverted(
    relation: Relation, keys: AbstractSet[int], keys_bitmap: BitMap
) -> dict[int, list[int]]:
    """``key -> subjects`` for the ``keys`` among the objects of a relation stored by subject:
    one bitmap intersection per subject, its hits paired with it in C (a call per hit cost
    several times as much: a changed ``y`` of RS3's ``p30`` reaches about fifty subjects)."""
    subjects = relation.existing_index(SUBJECT).items()  # type: ignore[union-attr]
    return lists_by_first(
        chain.from_iterable(
            zip(
                objects & keys_bitmap if objects.__class__ is BitMap else keys & objects,
                repeat(subject),
            )
            for subject, objects in subjects
        )
    )


def add_all(found: dict[int, AbstractSet[int]], key: int, values: Iterable[int]) -> None:
    """``values`` added to ``found[key]`` (a copy of them for a new key). A key with a bitmap
    among its values gets a bitmap: a copy and a union in C, where a Python set is built a
    value at a time (a farm's neighbourhoods read again from the closure's bitmaps and the
    explicit edges: as sets, several times what recomputing the farm costs)."""
    known = found.get(key)
    if values.__class__ is BitMap:
        if known is None or known.__class__ is BitMap:
            add_into(found, key, values)  # type: ignore[arg-type]
        else:  # (a set so far, then a bitmap: the bitmap's copy takes in the set)
            united = values.copy()
            united.update(known)
            found[key] = united
    elif known is None:
        found[key] = set(values)
    else:
        known.update(values)  # type: ignore[attr-defined]


def subjects_meeting(relations: list[Relation], values: AbstractSet[int]) -> set[int]:
    """The subjects ``x`` with ``A(x, y)`` for some ``y`` of ``values``: a C-level
    ``isdisjoint`` per subject of a relation stored by subject (or with a subject index),
    else one C-level pass over its tuples."""
    as_set, as_bitmap_ = set(values), BitMap(values)
    found: set[int] = set()
    for relation in relations:
        if not len(relation):
            continue
        index = relation.existing_index(SUBJECT)
        if index is None:
            rows = relation.as_set()
            hits = compress(rows, map(as_set.__contains__, map(itemgetter(1), rows)))
            found.update(map(itemgetter(0), hits))
            continue
        for x, objects in index.items():
            wanted = as_bitmap_ if objects.__class__ is BitMap else as_set
            if not objects.isdisjoint(wanted):
                found.add(x)
    return found


def python_set(values: AbstractSet[int]) -> set[int]:
    return values if isinstance(values, set) else set(values)
