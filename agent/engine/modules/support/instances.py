"""A decomposition node's instantiations, and the semi-joins and joins between nodes.

A node's instantiations are tuples over its bag's variables. They are kept as a set with hash
indexes on the columns it shares with its neighbours, built on first use and kept up to date,
so that a semi-join by a few keys (a small update's instantiations) costs the matches it finds,
not a scan of the node.

An :class:`Active` set is what one pass of the cross-node evaluation reads at a node: a union
of parts (the node's instantiations, new ones), possibly minus some (the deleted ones), left
lazy until a semi-join reduces it or the join needs its rows.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field


class NodeInstances:
    """``inst_p``: the instantiations of a node, with indexes by column groups."""

    def __init__(self) -> None:
        self.rows: set[tuple] = set()
        self.indexes: dict[tuple[int, ...], dict[tuple, set[tuple]]] = {}

    def __len__(self) -> int:
        return len(self.rows)

    def add(self, rows: Iterable[tuple]) -> None:
        rows = [row for row in rows if row not in self.rows]
        self.rows.update(rows)
        for columns, index in self.indexes.items():
            for row in rows:
                key = tuple(row[c] for c in columns)
                bucket = index.get(key)
                if bucket is None:
                    index[key] = {row}
                else:
                    bucket.add(row)

    def remove(self, rows: Iterable[tuple]) -> None:
        rows = [row for row in rows if row in self.rows]
        self.rows.difference_update(rows)
        for columns, index in self.indexes.items():
            for row in rows:
                key = tuple(row[c] for c in columns)
                bucket = index[key]
                bucket.discard(row)
                if not bucket:
                    del index[key]

    def clear(self) -> None:
        self.rows = set()
        self.indexes = {}

    def index(self, columns: tuple[int, ...]) -> dict[tuple, set[tuple]]:
        found = self.indexes.get(columns)
        if found is None:
            found = self.indexes[columns] = {}
            for row in self.rows:
                key = tuple(row[c] for c in columns)
                bucket = found.get(key)
                if bucket is None:
                    found[key] = {row}
                else:
                    bucket.add(row)
        return found

    def matching(self, columns: tuple[int, ...], keys: set[tuple]) -> set[tuple]:
        """The rows whose values at ``columns`` are one of ``keys``."""
        if not columns:
            return set(self.rows) if keys else set()
        if len(keys) * 4 < len(self.rows) or columns in self.indexes:
            index = self.index(columns)
            found: set[tuple] = set()
            for key in keys if len(keys) <= len(index) else index.keys() & keys:
                bucket = index.get(key)
                if bucket:
                    found |= bucket
            return found
        return _filtered(self.rows, columns, keys)


@dataclass
class Active:
    """The instantiations one pass reads at a node: the union of ``parts`` minus ``excluded``
    (lazy), or ``rows`` once computed."""

    parts: list[NodeInstances | set] = field(default_factory=list)
    excluded: set | None = None
    rows: set | None = None

    def size(self) -> int:
        if self.rows is not None:
            return len(self.rows)
        return sum(len(part) for part in self.parts)

    def materialise(self) -> set:
        if self.rows is None:
            rows: set = set()
            for part in self.parts:
                rows |= part.rows if isinstance(part, NodeInstances) else part
            if self.excluded:
                rows -= self.excluded
            self.rows = rows
            self.parts = []
        return self.rows

    def reduce(self, columns: tuple[int, ...], keys: set[tuple]) -> None:
        """Keep the rows whose values at ``columns`` are one of ``keys`` (a left semi-join)."""
        if self.rows is not None:
            self.rows = (
                _filtered(self.rows, columns, keys) if columns else (self.rows if keys else set())
            )
            return
        rows: set = set()
        for part in self.parts:
            if isinstance(part, NodeInstances):
                rows |= part.matching(columns, keys)
            elif columns:
                rows |= _filtered(part, columns, keys)
            elif keys:
                rows |= part
        if self.excluded:
            rows -= self.excluded
        self.rows = rows
        self.parts = []

    def keys(self, columns: tuple[int, ...]) -> set[tuple]:
        return {tuple(row[c] for c in columns) for row in self.materialise()}


def _filtered(rows: Iterable[tuple], columns: Sequence[int], keys: set[tuple]) -> set[tuple]:
    if len(columns) == 1:
        (column,) = columns
        singles = {key[0] for key in keys}
        return {row for row in rows if row[column] in singles}
    return {row for row in rows if tuple(row[c] for c in columns) in keys}
