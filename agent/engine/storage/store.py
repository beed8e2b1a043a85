"""Storage of facts: Relation, DataStore and DataStoreBag (ZodiacEdge section 4.1).

* A :class:`Relation` is a set of tuples of term ids plus hash indexes keyed by the columns a
  plan binds. Indexes are built on first use and kept up to date on every insert and delete.
  For binary relations the indexes on column 0 and column 1 are ZodiacEdge's PSO and POS.
* A :class:`DataStore` holds one relation per ``(predicate, arity)``: the program's EDB is one,
  and every hyper-node owns one for the facts its rules derive (its IDB).
* A :class:`DataStoreBag` is a bag of several stores read as one, with the predicate -> relations
index:
  a hyper-node reads the EDB and its predecessors' IDBs through a bag, never through a copy.

Index layout: ``index(bound)`` maps a key to the set of the remaining columns' values. A key is
the bare id when one column is bound, else a tuple; likewise the values are bare ids when one
column is free, else tuples. Compiled rules rely on this layout.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from collections.abc import Set as AbstractSet
from itertools import chain, compress, repeat
from operator import itemgetter
from typing import Any

from agent.engine.gcpause import FREEZE_AT, collector_paused
from agent.engine.language import RelationKey


class SavedSubjects:
    """A binary relation's saved facts, subject -> objects, not read yet: ``count`` facts and
    ``read()``, which returns them (the agent's state deserialises its bitmaps there). A
    relation filled with one keeps it until a reader first uses the relation (`Relation.fill`):
    a restart then costs no work per subject, and a relation nobody reads costs none at all."""

    __slots__ = ("count", "read")

    def __init__(self, count: int, read: Callable[[], dict[int, AbstractSet[int]]]) -> None:
        self.count = count
        self.read = read


# A relation's facts as a saved state hands them over: a set of tuples, or, for a binary
# relation, subject -> objects (taken as the relation's storage, see adopt_subjects; the
# objects a set, or any set-like container of ints: the agent's state hands over bitmaps),
# possibly not read yet (SavedSubjects).
SavedFacts = set[tuple[int, ...]] | dict[int, AbstractSet[int]] | SavedSubjects

EMPTY: frozenset = frozenset()
SUBJECT = (0,)  # the bound columns of a binary relation's index on its subject
SUBJECT_GETTERS = (itemgetter(0), itemgetter(1))
BUCKETED = "bucketed"  # the first part of a bucketed index's key (`Relation.bucketed_index`)


class Relation:
    """A set of same-arity tuples with lazily built, incrementally maintained indexes.

    **Subject-keyed storage.** A binary relation can also be filled with `adopt_subjects`:
    a dict from subject to the set of its objects, which is exactly the index on column 0. The
    relation then keeps only that index (``_rows`` is None) and answers `len`, `in`, iteration,
    ``index((0,))`` and every insert, delete and membership test from it (never building
    tuples for them); the set of tuples is built, once, by the first caller that reads
    ``tuples`` (another index, a set operation over all rows). Why: a transitive closure's
    output is a set of objects per subject already, and building its tuples costs more than
    the closure itself (DAG-R in simulations.bench.modules); a reader that looks up subjects,
    or nobody reading at all, never pays for them.

    **Foreign buckets.** `adopt_subjects` also takes objects in another set-like container
    (the agent's saved state and the transitive-closure module hand over compressed bitmaps,
    which hold a dense set of ids in a few bytes each). The relation's own methods need only
    membership, iteration, ``add`` and ``discard`` of a bucket, so it keeps them as they are
    (and gives a new subject the same kind of bucket); `index` hands compiled rules (which
    do set algebra with Python sets) Python sets, converting every bucket the first time a
    plan asks. A relation no plan reads (a leaf output, answered only to queries) is never
    converted."""

    __slots__ = (
        "key",
        "arity",
        "_rows",
        "_count",
        "_indexes",
        "_getters",
        "_foreign",
        "_bucket",
        "_unread",
    )

    def __init__(self, key: RelationKey) -> None:
        self.key = key
        self.arity = key[1]
        self._rows: set[tuple[int, ...]] | None = set()
        self._count = 0  # the size while _rows is None
        self._indexes: dict[tuple[int, ...], dict] = {}
        self._getters: dict[tuple[int, ...], tuple[itemgetter, itemgetter]] = {}
        self._foreign = False  # some subject bucket is not a Python set (see the docstring)
        self._bucket: type = set  # the container a new subject's bucket gets
        self._unread: SavedSubjects | None = None  # (see fill)

    @property
    def tuples(self) -> set[tuple[int, ...]]:
        """The facts as a set of tuples (built here from the subjects, the first time)."""
        rows = self._rows
        if rows is None:
            rows = self._rows = self._built_tuples()
        return rows

    def as_set(self) -> set[tuple[int, ...]]:
        """The facts as a set of tuples for a caller that reads it and lets it go: the
        relation's own set (do not change it) or, for subject-keyed storage, one built for the
        caller and not kept (`tuples` would keep it: a tuple per fact for good)."""
        rows = self._rows
        return self._built_tuples() if rows is None else rows

    def detach(self) -> SavedFacts:
        """The facts for a caller about to clear the relation (which then gets fresh storage):
        the set of tuples, or, for subject-keyed storage, the subject -> objects dict itself
        (no tuple built)."""
        rows = self._rows
        return self._indexes[SUBJECT] if rows is None else rows

    def _built_tuples(self) -> set[tuple[int, ...]]:
        # (outside an update too, the collector must not walk the new tuples again and again
        # while they are made: that tripled the cost, see gcpause.py)
        with collector_paused() as pause:
            pause.large = self._count > FREEZE_AT
            rows: set[tuple[int, ...]] = set()
            for subject, objects in self._indexes[SUBJECT].items():
                rows.update(zip(repeat(subject), objects))
        return rows

    @property
    def rows_built(self) -> bool:
        """False while the relation holds only its subject index (see the class docstring)."""
        return self._rows is not None

    def __len__(self) -> int:
        rows = self._rows
        return self._count if rows is None else len(rows)

    def __contains__(self, fact: tuple[int, ...]) -> bool:
        rows = self._rows
        if rows is None:
            return fact[1] in self._indexes[SUBJECT].get(fact[0], EMPTY)
        return fact in rows

    def __iter__(self) -> Iterator[tuple[int, ...]]:
        rows = self._rows
        if rows is None:
            return chain.from_iterable(
                zip(repeat(s), objects) for s, objects in self._indexes[SUBJECT].items()
            )
        return iter(rows)

    def __repr__(self) -> str:
        return f"Relation({self.key[0]}/{self.key[1]}, {len(self)} facts)"

    def present(self, candidates: set[tuple[int, ...]]) -> set[tuple[int, ...]]:
        """The candidates the relation holds (``candidates & tuples``). Subject-keyed storage
        tests each candidate in its subject's bucket; more candidates than facts (a whole
        closure changed) against the relation's tuples, built for the intersection and let go
        (a tuple per fact, where a test per candidate costs about as much); the tuples are
        never kept."""
        if self._rows is None:
            if len(candidates) >= self._count:
                return candidates & self._built_tuples()
            get = self._indexes[SUBJECT].get
            return {f for f in candidates if f[1] in get(f[0], EMPTY)}
        return candidates & self._rows

    def absent(self, candidates: set[tuple[int, ...]]) -> set[tuple[int, ...]]:
        """The candidates the relation does not hold (``candidates - tuples``; see `present`)."""
        if self._rows is None:
            if len(candidates) >= self._count:
                return candidates - self._built_tuples()
            get = self._indexes[SUBJECT].get
            return {f for f in candidates if f[1] not in get(f[0], EMPTY)}
        return candidates - self._rows

    def index(self, bound: tuple[int, ...]) -> dict:
        """The index on the given (sorted) bound columns, built now if it does not exist."""
        index = self._indexes.get(bound)
        if self._foreign and bound == SUBJECT:
            self._thaw()
        if index is None:
            if not bound or len(bound) >= self.arity:
                raise ValueError(f"an index needs some but not all columns bound, got {bound}")
            free = tuple(c for c in range(self.arity) if c not in bound)
            getters = (itemgetter(*bound), itemgetter(*free))
            rows = self.tuples
            self._getters[bound] = getters
            index = {}
            _index_insert(index, getters, rows)
            self._indexes[bound] = index
        return index

    def partition(self, constants: tuple[tuple[int, int], ...], bound: tuple[int, ...]) -> dict:
        """The index on the ``bound`` columns of the facts whose columns hold the given
        constants (``((column, id), ...)``), built now if it does not exist, and kept up to
        date like every index; its buckets hold the columns neither constant nor bound.

        Why: an atom such as ``triple(P, <domain>, C)`` with ``P`` bound probes the facts of one
        predicate. The index on columns (0, 1) of the whole relation serves it, at the cost of
        an entry per fact of every predicate (the RDFS rules over 140,580 triples built one of
        101,975 keys to probe 8 domain triples); this one holds the domain triples only."""
        key = (constants, bound)
        index = self._indexes.get(key)  # type: ignore[call-overload]
        if index is None:
            columns = tuple(column for column, _ in constants)
            used = set(columns) | set(bound)
            if not bound or len(used) >= self.arity or len(used) != len(columns) + len(bound):
                raise ValueError(f"a partition needs free columns, got {constants} {bound}")
            free = tuple(c for c in range(self.arity) if c not in used)
            wanted = tuple(value for _, value in constants)
            getters = (itemgetter(*bound), itemgetter(*free), itemgetter(*columns), wanted)
            # Filled from the index on the constant columns (few keys: one pass over the
            # relation, shared by every partition on those columns), whose bucket holds the
            # other columns of the facts with these constants: only those are read.
            rest = [c for c in range(self.arity) if c not in columns]
            bucket = self.index(columns).get(wanted[0] if len(wanted) == 1 else wanted, ())
            relative = (
                itemgetter(*(rest.index(c) for c in bound)),
                itemgetter(*(rest.index(c) for c in free)),
            )
            index = {}
            _index_insert(index, relative, bucket)
            self._getters[key] = getters  # type: ignore[index]
            self._indexes[key] = index  # type: ignore[index]
        return index

    def bucketed_index(self, column: int, bucket: type) -> dict:
        """A binary relation kept as tuples, keyed on ``column``, with its buckets made by
        ``bucket`` (a container class taking an iterable of ids, with ``add`` and
        ``discard``: the modules give compressed bitmaps), built now if it does not exist and
        kept up to date like every index. Apart from `index`'s: compiled rules never read it.

        Why: a module reading an explicit relation by a column with few values (students by
        the course they take) finds a key's facts with one lookup instead of a pass over all
        of them at every update, for a few bytes per fact where an index of Python sets costs
        about a hundred."""
        key = (BUCKETED, column)
        index = self._indexes.get(key)  # type: ignore[call-overload]
        if index is None:
            if self.arity != 2 or column not in (0, 1):
                raise ValueError(f"{self!r}: a bucketed index is for a column of a binary relation")
            getters = (itemgetter(column), itemgetter(1 - column), bucket)
            rows = self.tuples
            grouped: dict[int, list[int]] = {}  # (lists first: a bucket's add is a call each)
            get = grouped.get
            for value, other in zip(map(getters[0], rows), map(getters[1], rows), strict=True):
                found = get(value)
                if found is None:
                    grouped[value] = [other]
                else:
                    found.append(other)
            index = {value: bucket(others) for value, others in grouped.items()}
            self._getters[key] = getters  # type: ignore[index]
            self._indexes[key] = index  # type: ignore[index]
        return index

    def existing_bucketed_index(self, column: int) -> dict | None:
        """The `bucketed_index` on ``column`` if it exists; never builds one."""
        return self._indexes.get((BUCKETED, column))  # type: ignore[call-overload]

    def existing_index(self, bound: tuple[int, ...]) -> dict | None:
        """The index on these bound columns if it exists; never builds one. (Its buckets may be
        foreign set-likes, see the class docstring: read them by membership and iteration.)"""
        return self._indexes.get(bound)

    def _thaw(self) -> None:
        """Turn every foreign subject bucket into a Python set (see the class docstring)."""
        subjects = self._indexes[SUBJECT]
        for subject, objects in subjects.items():
            if objects.__class__ is not set:
                subjects[subject] = set(objects)
        self._foreign = False
        self._bucket = set

    def add_all(self, facts: Iterable[tuple[int, ...]]) -> set[tuple[int, ...]]:
        """Insert facts; returns those that were not already present."""
        if self._rows is None:
            return self._insert_by_subject(facts)
        new = set(facts)
        new -= self._rows
        if new:
            self._insert(new)
        return new

    def add_absent(self, facts: set[tuple[int, ...]]) -> set[tuple[int, ...]]:
        """Insert a set of facts the caller knows are all absent (a closure module's new
        pairs, a function of its state): `add_all` without the membership test per fact.
        Returns ``facts``; a fact that was present after all is a bug, raised at once."""
        if facts:
            before = len(self)
            self._insert(facts)
            if len(self) != before + len(facts):
                raise AssertionError(f"{self!r}: add_absent was given facts already present")
        return facts

    def _insert(self, new: set[tuple[int, ...]]) -> None:
        rows = self._rows
        if rows is None:
            self._insert_by_subject(new)
            return
        rows |= new
        for bound, index in self._indexes.items():
            getters = self._getters[bound]
            _index_insert(index, getters, _matching(getters, new))

    def adopt(self, facts: set[tuple[int, ...]]) -> set[tuple[int, ...]]:
        """Insert a set the caller hands over and will not use again: into an empty
        relation it becomes the relation's set as is, with no copy (a closure module's
        freshly built output); otherwise this is `add_all`."""
        if len(self):
            return self.add_all(facts)
        self._rows = facts
        self.drop_indexes()
        return facts

    def adopt_subjects(
        self, subjects: dict[int, AbstractSet[int]], bucket: type | None = None
    ) -> None:
        """Fill an empty binary relation with subject -> objects sets the caller hands over
        and will not use again (no set may be empty; sets, or foreign set-likes with ``add``
        and ``discard``): subject-keyed storage, see the class docstring. A subject added
        later gets a ``bucket`` (a container class taking an iterable of ids), by default the
        class of the buckets handed over."""
        if self.arity != 2 or len(self):
            raise ValueError(f"{self!r}: adopt_subjects needs an empty binary relation")
        self.drop_indexes()
        self._rows = None
        handed = next((o.__class__ for o in subjects.values() if o.__class__ is not set), None)
        self._bucket = bucket or handed or set
        self._foreign = handed is not None or self._bucket is not set
        self._count = sum(map(len, subjects.values()))
        self._indexes[SUBJECT] = subjects
        self._getters[SUBJECT] = SUBJECT_GETTERS

    def fill(self, facts: SavedFacts) -> None:
        """Fill an empty relation from saved facts (see SavedFacts). Facts not read yet
        (SavedSubjects) stay so: the relation answers ``len`` from their count and reads them
        at its first use of any other kind (`_Unread`)."""
        if isinstance(facts, SavedSubjects):
            if self.arity != 2 or len(self):
                raise ValueError(f"{self!r}: saved subjects fill an empty binary relation")
            self._unread = facts
            self._count = facts.count
            self.__class__ = _Unread
        elif isinstance(facts, dict):
            self.adopt_subjects(facts)
        else:
            self.add_all(facts)

    def remove_all(self, facts: Iterable[tuple[int, ...]]) -> set[tuple[int, ...]]:
        """Delete facts; returns those that were present.

        When at least half the facts go, the indexes are dropped rather than updated fact by
        fact: rebuilding one from what remains, when a plan next asks, costs no more."""
        if self._rows is None:
            return self._discard_by_subject(facts)
        rows = self._rows
        gone = rows.intersection(facts)
        if gone:
            rows -= gone
            self._unindex(gone)
        return gone

    def remove_present(self, facts: set[tuple[int, ...]]) -> set[tuple[int, ...]]:
        """Delete a set of facts the caller knows are all present (a closure module's lost
        pairs): `remove_all` without the intersection, which costs a membership test per
        fact. Returns ``facts``; a fact that was absent after all is a bug, raised at once."""
        if facts:
            before = len(self)
            if self._rows is not None:
                self._rows -= facts
            self._unindex(facts)
            if len(self) != before - len(facts):
                raise AssertionError(f"{self!r}: remove_present was given absent facts")
        return facts

    def change_subjects(self, lost: dict, gained: dict) -> None:
        """Subject-keyed storage (``rows_built`` False): every subject of ``lost`` loses its
        objects, then every subject of ``gained`` gains its objects, a whole set at a time
        (C-level for bitmaps). Used by the modules that compute each subject's new objects
        themselves (subject_changes.py); the size follows the buckets. The callers' sets are
        only read (one bitmap may be offered to many subjects): a new subject gets a copy."""
        if self._rows is not None:
            raise ValueError(f"{self!r}: change_subjects needs subject-keyed storage")
        subjects = self._indexes[SUBJECT]
        get = subjects.get
        count = self._count
        for subject, objects in lost.items():
            mine = get(subject)
            if mine is None:
                continue
            count -= len(mine)
            if mine.__class__ is objects.__class__:
                mine -= objects  # (for bitmaps, several times faster than difference_update)
            else:
                mine.difference_update(objects)
            if mine:
                count += len(mine)
            else:
                del subjects[subject]
        bucket = self._bucket
        for subject, objects in gained.items():
            if not objects:
                continue
            mine = get(subject)
            if mine is None:
                subjects[subject] = bucket(objects)
                count += len(objects)
            else:
                count -= len(mine)
                if mine.__class__ is objects.__class__:
                    mine |= objects
                else:
                    mine.update(objects)
                count += len(mine)
        self._count = count

    def _insert_by_subject(self, facts: Iterable[tuple[int, ...]]) -> set[tuple[int, ...]]:
        """Subject-keyed storage: add each fact to its subject's bucket (a new subject gets a
        Python set); returns the facts that were absent. No tuple of the stored facts is made
        (see the class docstring)."""
        subjects = self._indexes[SUBJECT]
        get = subjects.get
        new: set[tuple[int, ...]] = set()
        for fact in facts:
            s, o = fact
            objects = get(s)
            if objects is None:
                subjects[s] = {o} if self._bucket is set else self._bucket((o,))
            elif o not in objects:
                objects.add(o)
            else:
                continue
            new.add(fact)
        self._count += len(new)
        return new

    def _discard_by_subject(self, facts: Iterable[tuple[int, ...]]) -> set[tuple[int, ...]]:
        """Subject-keyed storage: remove each fact from its subject's bucket (an emptied
        subject goes); returns the facts that were present."""
        subjects = self._indexes[SUBJECT]
        get = subjects.get
        gone: set[tuple[int, ...]] = set()
        for fact in facts:
            s, o = fact
            objects = get(s)
            if objects is not None and o in objects:
                objects.discard(o)
                if not objects:
                    del subjects[s]
                gone.add(fact)
        self._count -= len(gone)
        return gone

    def _unindex(self, gone: set[tuple[int, ...]]) -> None:
        if self._rows is None:
            self._discard_by_subject(gone)
            return
        if len(gone) >= len(self._rows):
            self.drop_indexes()
            return
        for bound, index in self._indexes.items():
            getters = self._getters[bound]
            key_of, value_of = getters[:2]
            for fact in _matching(getters, gone):
                key = key_of(fact)
                bucket = index[key]
                bucket.discard(value_of(fact))
                if not bucket:
                    del index[key]

    def clear(self) -> None:
        """Empty the relation and drop its indexes: they are rebuilt, in one pass over the
        facts then present, by the first plan that asks (a recomputed relation is refilled
        at once, and an index whose readers were deleted is never built again)."""
        self._rows = set()
        self._count = 0
        self._foreign = False
        self._bucket = set
        self._indexes.clear()
        self._getters.clear()

    def drop_indexes(self) -> None:
        """Forget every index; `index` rebuilds one, from the facts then present, on demand.
        (Subject-keyed storage keeps its subject index: it holds the facts.)"""
        kept = self._indexes.get(SUBJECT) if self._rows is None else None
        self._indexes.clear()
        self._getters.clear()
        if kept is None:
            self._foreign = False
            self._bucket = set
        else:
            self._indexes[SUBJECT] = kept
            self._getters[SUBJECT] = SUBJECT_GETTERS

    def _read_saved(self) -> None:
        """Read the saved facts `fill` kept (SavedSubjects) and become a plain relation."""
        saved = object.__getattribute__(self, "_unread")
        self.__class__ = Relation  # (first: from here on every access is a plain one)
        self._unread = None
        self._count = 0
        self.adopt_subjects(saved.read())


# What a relation not read yet answers without reading its saved facts.
_ANSWERED_UNREAD = frozenset({"key", "arity", "_count", "_unread", "__class__", "_read_saved"})


class _Unread(Relation):
    """A relation filled with saved facts not read yet (`Relation.fill`, SavedSubjects): any
    use but ``len`` reads them first and turns the object into a plain Relation (its class
    is swapped back), so no method of the relation needs to know, and a relation once read
    pays nothing for this. Why: a restart from the agent's state would otherwise spend more
    on deserialising every subject's bitmap than on everything else."""

    __slots__ = ()

    def __getattribute__(self, name: str):
        if name not in _ANSWERED_UNREAD:
            Relation._read_saved(self)
        return object.__getattribute__(self, name)

    def __len__(self) -> int:
        return object.__getattribute__(self, "_count")

    def __contains__(self, fact: tuple[int, ...]) -> bool:
        Relation._read_saved(self)
        return Relation.__contains__(self, fact)

    def __iter__(self) -> Iterator[tuple[int, ...]]:
        Relation._read_saved(self)
        return Relation.__iter__(self)

    def __repr__(self) -> str:
        key = object.__getattribute__(self, "key")
        return f"Relation({key[0]}/{key[1]}, {len(self)} facts, not read yet)"


def is_unread(relation: Relation) -> bool:
    """Whether ``relation`` still holds saved facts not read (see `_Unread`)."""
    return relation.__class__ is _Unread


def by_relation(facts: Iterable[tuple[RelationKey, tuple[int, ...]]]) -> dict[RelationKey, list]:
    """``(relation, args)`` facts grouped by relation: relation -> list of args."""
    return lists_by_first(facts)


def lists_by_first(pairs: Iterable[tuple[Any, Any]]) -> dict[Any, list]:
    """Pairs grouped on their first item: first -> list of the seconds, in order."""
    grouped: dict[Any, list] = {}
    for key, value in pairs:
        found = grouped.get(key)
        if found is None:
            grouped[key] = [value]
        else:
            found.append(value)
    return grouped


def by_subject(rows: Iterable[tuple[int, int]]) -> dict[int, set[int]]:
    """Binary facts grouped as subject -> set of objects (the layout `adopt_subjects` takes)."""
    return grouped_by(rows, 0)


def grouped_by(rows: Iterable[tuple[int, int]], column: int) -> dict[int, set[int]]:
    """Binary facts grouped on ``column``: value -> set of the other column's values (the
    layout of an index on that column)."""
    grouped: dict[int, set[int]] = {}
    _index_insert(grouped, (itemgetter(column), itemgetter(1 - column)), rows)
    return grouped


def _matching(getters: tuple, facts: Iterable) -> Iterable:
    """The facts an index holds: all of them, or for a partition (`Relation.partition`) those
    with its constants, picked in C."""
    if len(getters) != 4:
        return facts
    _, _, columns_of, wanted = getters
    if len(wanted) == 1:
        (wanted,) = wanted
    facts = facts if isinstance(facts, (set, frozenset, list, tuple)) else list(facts)
    return compress(facts, map(wanted.__eq__, map(columns_of, facts)))


def _index_insert(index: dict, getters: tuple, facts: Iterable) -> None:
    key_of, value_of = getters[:2]
    make = getters[2] if len(getters) == 3 else None  # a bucketed index's bucket class
    get = index.get
    for fact in facts:
        key = key_of(fact)
        bucket = get(key)
        if bucket is None:
            index[key] = {value_of(fact)} if make is None else make((value_of(fact),))
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
    """Several stores read as one (never a copy), with the predicate -> relations index.

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
            found.update(k for k, r in store.relations.items() if len(r))
        return found
