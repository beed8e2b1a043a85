"""Storage of facts: Relation, DataStore and DataStoreBag (ZodiacEdge section 4.1).

* A :class:`Relation` is a set of tuples of term ids plus hash indexes keyed by the columns a
  plan binds. Indexes are built on first use and kept up to date on every insert and delete.
  For binary relations the indexes on column 0 and column 1 are ZodiacEdge's PSO and POS.
* A :class:`DataStore` holds one relation per ``(predicate, arity)``: the program's EDB is one,
  and every hyper-node owns one for the facts its rules derive (its IDB).
* A :class:`DataStoreBag` is a view over several stores with the predicate -> relations index:
  a hyper-node reads the EDB and its predecessors' IDBs through a bag, never through a copy.

Index layout: ``index(bound)`` maps a key to the set of the remaining columns' values. A key is
the bare id when one column is bound, else a tuple; likewise the values are bare ids when one
column is free, else tuples. Compiled rules rely on this layout.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from operator import itemgetter

RelationKey = tuple[str, int]
EMPTY: frozenset = frozenset()


class Relation:
    """A set of same-arity tuples with lazily built, incrementally maintained indexes."""

    __slots__ = ("key", "arity", "tuples", "_indexes", "_getters")

    def __init__(self, key: RelationKey) -> None:
        self.key = key
        self.arity = key[1]
        self.tuples: set[tuple[int, ...]] = set()
        self._indexes: dict[tuple[int, ...], dict] = {}
        self._getters: dict[tuple[int, ...], tuple[itemgetter, itemgetter]] = {}

    def __len__(self) -> int:
        return len(self.tuples)

    def __contains__(self, fact: tuple[int, ...]) -> bool:
        return fact in self.tuples

    def __iter__(self) -> Iterator[tuple[int, ...]]:
        return iter(self.tuples)

    def __repr__(self) -> str:
        return f"Relation({self.key[0]}/{self.key[1]}, {len(self.tuples)} facts)"

    def index(self, bound: tuple[int, ...]) -> dict:
        """The index on the given (sorted) bound columns, built now if it does not exist."""
        index = self._indexes.get(bound)
        if index is None:
            if not bound or len(bound) >= self.arity:
                raise ValueError(f"an index needs some but not all columns bound, got {bound}")
            free = tuple(c for c in range(self.arity) if c not in bound)
            getters = (itemgetter(*bound), itemgetter(*free))
            self._getters[bound] = getters
            index = {}
            _index_insert(index, getters, self.tuples)
            self._indexes[bound] = index
        return index

    def existing_index(self, bound: tuple[int, ...]) -> dict | None:
        """The index on these bound columns if it exists; never builds one."""
        return self._indexes.get(bound)

    def add_all(self, facts: Iterable[tuple[int, ...]]) -> set[tuple[int, ...]]:
        """Insert facts; returns those that were not already present."""
        new = set(facts)
        new -= self.tuples
        if new:
            self._insert(new)
        return new

    def add_absent(self, facts: set[tuple[int, ...]]) -> set[tuple[int, ...]]:
        """Insert a set of facts the caller knows are all absent (a closure module's new
        pairs, a function of its state): `add_all` without the membership test per fact.
        Returns ``facts``; a fact that was present after all is a bug, raised at once."""
        if facts:
            before = len(self.tuples)
            self._insert(facts)
            if len(self.tuples) != before + len(facts):
                raise AssertionError(f"{self!r}: add_absent was given facts already present")
        return facts

    def _insert(self, new: set[tuple[int, ...]]) -> None:
        self.tuples |= new
        for bound, index in self._indexes.items():
            _index_insert(index, self._getters[bound], new)

    def adopt(self, facts: set[tuple[int, ...]]) -> set[tuple[int, ...]]:
        """Insert a set the caller hands over and will not use again: into an empty
        relation it becomes the relation's set as is, with no copy (a closure module's
        freshly built output); otherwise this is `add_all`."""
        if self.tuples:
            return self.add_all(facts)
        self.tuples = facts
        self.drop_indexes()
        return facts

    def remove_all(self, facts: Iterable[tuple[int, ...]]) -> set[tuple[int, ...]]:
        """Delete facts; returns those that were present.

        When at least half the facts go, the indexes are dropped rather than updated fact by
        fact: rebuilding one from what remains, when a plan next asks, costs no more."""
        gone = self.tuples.intersection(facts)
        if gone:
            self.tuples -= gone
            self._unindex(gone)
        return gone

    def remove_present(self, facts: set[tuple[int, ...]]) -> set[tuple[int, ...]]:
        """Delete a set of facts the caller knows are all present (a closure module's lost
        pairs): `remove_all` without the intersection, which costs a membership test per
        fact. Returns ``facts``; a fact that was absent after all is a bug, raised at once."""
        if facts:
            before = len(self.tuples)
            self.tuples -= facts
            if len(self.tuples) != before - len(facts):
                raise AssertionError(f"{self!r}: remove_present was given absent facts")
            self._unindex(facts)
        return facts

    def _unindex(self, gone: set[tuple[int, ...]]) -> None:
        if len(gone) >= len(self.tuples):
            self.drop_indexes()
            return
        for bound, index in self._indexes.items():
            key_of, value_of = self._getters[bound]
            for fact in gone:
                key = key_of(fact)
                bucket = index[key]
                bucket.discard(value_of(fact))
                if not bucket:
                    del index[key]

    def clear(self) -> None:
        """Empty the relation and drop its indexes: they are rebuilt, in one pass over the
        facts then present, by the first plan that asks (a recomputed relation is refilled
        at once, and an index whose readers were deleted is never built again)."""
        self.tuples = set()
        self.drop_indexes()

    def drop_indexes(self) -> None:
        """Forget every index; `index` rebuilds one, from the facts then present, on demand."""
        self._indexes.clear()
        self._getters.clear()

    def index_count(self) -> int:
        return len(self._indexes)


def _index_insert(index: dict, getters: tuple[itemgetter, itemgetter], facts: Iterable) -> None:
    key_of, value_of = getters
    get = index.get
    for fact in facts:
        key = key_of(fact)
        bucket = get(key)
        if bucket is None:
            index[key] = {value_of(fact)}
        else:
            bucket.add(value_of(fact))


class DataStore:
    """One relation per (predicate, arity): the EDB, or one hyper-node's IDB."""

    __slots__ = ("name", "relations")

    def __init__(self, name: str) -> None:
        self.name = name
        self.relations: dict[RelationKey, Relation] = {}

    def __repr__(self) -> str:
        return f"DataStore({self.name}, {self.size()} facts)"

    def relation(self, key: RelationKey) -> Relation:
        """The relation for ``key``, created empty if the store has none yet."""
        found = self.relations.get(key)
        if found is None:
            found = self.relations[key] = Relation(key)
        return found

    def get(self, key: RelationKey) -> Relation | None:
        return self.relations.get(key)

    def size(self) -> int:
        return sum(len(r) for r in self.relations.values())

    def clear(self) -> None:
        for relation in self.relations.values():
            relation.clear()


class DataStoreBag:
    """A read view over several stores, with the predicate -> relations index.

    The bag holds pointers to stores, never copies of their facts. ``relations(key)`` lists the
    relations holding facts of ``key`` in the bag's stores; a fact is visible through the bag
    while at least one of them holds it.
    """

    __slots__ = ("stores", "_by_key")

    def __init__(self, stores: Iterable[DataStore] = ()) -> None:
        self.stores: list[DataStore] = []
        self._by_key: dict[RelationKey, list[Relation]] = {}
        for store in stores:
            self.add_store(store)

    def add_store(self, store: DataStore) -> None:
        if any(s is store for s in self.stores):
            return
        self.stores.append(store)
        self._by_key.clear()

    def relations(self, key: RelationKey) -> list[Relation]:
        """Relations holding facts of ``key``, in store order (cached; see :meth:`refresh`)."""
        found = self._by_key.get(key)
        if found is None:
            found = [s.relations[key] for s in self.stores if key in s.relations]
            self._by_key[key] = found
        return found

    def refresh(self) -> None:
        """Forget the cached index (call after a store of the bag gained a new relation)."""
        self._by_key.clear()

    def contains(self, key: RelationKey, fact: tuple[int, ...]) -> bool:
        return any(fact in r.tuples for r in self.relations(key))

    def facts(self, key: RelationKey) -> set[tuple[int, ...]]:
        """The visible facts of ``key``: the union over the bag's stores."""
        relations = self.relations(key)
        if len(relations) == 1:
            return relations[0].tuples
        union: set[tuple[int, ...]] = set()
        for relation in relations:
            union |= relation.tuples
        return union

    def keys(self) -> set[RelationKey]:
        found: set[RelationKey] = set()
        for store in self.stores:
            found.update(k for k, r in store.relations.items() if r.tuples)
        return found
