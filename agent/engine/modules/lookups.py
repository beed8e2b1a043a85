"""Reading a binary relation of the view by one column, a key at a time, over the union of the
relations holding it (a hyper-node reads the EDB and lower IDBs through a DataStoreBag): what
the modules that work a subject at a time (composition.py, aggregate.py) share."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from collections.abc import Set as AbstractSet
from itertools import compress, repeat
from operator import itemgetter

from pyroaring import BitMap

from ..store import EMPTY, SUBJECT, Relation, grouped_by
from ..subject_facts import relation_by_subject, union_by_subject
from .base import by_column


class Lookup:
    """The values a relation of the view pairs with a key on one column, over the union of
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
        found: dict[int, set[int]] = {}
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
                for subject, objects in relation.existing_index(SUBJECT).items():  # type: ignore[union-attr]
                    hits = objects & keys_bitmap if objects.__class__ is BitMap else keys & objects
                    for key in hits:
                        add_all(found, key, (subject,))
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
        elif holding:
            lookup.indexes = [union_by_subject(map(read, holding))]
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


def add_all(found: dict[int, set[int]], key: int, values: Iterable[int]) -> None:
    known = found.get(key)
    if known is None:
        found[key] = set(values)
    else:
        known.update(values)


def python_set(values: AbstractSet[int]) -> set[int]:
    return values if isinstance(values, set) else set(values)
