"""Binary facts held by subject: a change set that becomes tuples only for a reader that wants
tuples.

A module that computes its output a subject at a time (the closures, the composition) knows
what each subject lost and gained as a set of object ids. Reporting that as a set of tuples
costs a tuple and a set slot per changed fact, which is most of an update that adds or removes
a whole closure; the hyper-nodes above, the journal and the update's report often need far
less (a count, the changed subjects). :class:`SubjectFacts` keeps the per-subject sets and
behaves as the (read-only) set of tuples they stand for: ``len``, ``in`` and iteration read the
subjects' sets, and the set operators (``&``, ``-``, ``|``, ``^``, with plain sets on either
side) build the tuples once, keep them, and answer with plain sets. Nothing changes it after
construction, so it is stored and shared without copies; a holder that must change it (the
update's net changes, StoreChanges) takes a plain set copy first (:func:`mutable`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator
from collections.abc import Set as AbstractSet
from itertools import chain, repeat

from pyroaring import BitMap

from agent.engine.storage.store import SUBJECT, Relation, grouped_by


class SubjectFacts(AbstractSet):
    """The pairs ``(s, o)`` for every subject ``s`` and ``o`` in ``by_subject[s]`` (the dict and
    its sets are taken over and never changed; empty sets are allowed)."""

    __slots__ = ("by_subject", "_size", "_tuples")

    def __init__(self, by_subject: dict[int, AbstractSet[int]]) -> None:
        self.by_subject = by_subject
        self._size = sum(map(len, by_subject.values()))
        self._tuples: set[tuple[int, int]] | None = None

    def __len__(self) -> int:
        return self._size

    def __iter__(self) -> Iterator[tuple[int, int]]:
        if self._tuples is not None:
            return iter(self._tuples)
        pairs = (zip(repeat(s), objects) for s, objects in self.by_subject.items())
        return chain.from_iterable(pairs)

    def __contains__(self, fact: object) -> bool:
        if not isinstance(fact, tuple) or len(fact) != 2:
            return False
        objects = self.by_subject.get(fact[0])
        try:
            return objects is not None and fact[1] in objects
        except (TypeError, OverflowError):  # not a term id (a bitmap holds 32-bit ids only)
            return False

    def __repr__(self) -> str:
        return f"SubjectFacts({len(self.by_subject)} subjects, {self._size} facts)"

    def tuples(self) -> set[tuple[int, int]]:
        """The facts as a set of tuples, built on first use and kept (read only)."""
        if self._tuples is None:
            rows: set[tuple[int, int]] = set()
            for subject, objects in self.by_subject.items():
                rows.update(zip(repeat(subject), objects))
            self._tuples = rows
        return self._tuples

    # Set algebra over the tuples, answered with plain sets (the mixins would go element by
    # element in Python).
    @classmethod
    def _from_iterable(cls, iterable: Iterable) -> set:
        return set(iterable)

    def __and__(self, other: object) -> set:
        return self.tuples() & _plain(other)

    __rand__ = __and__

    def __or__(self, other: object) -> set:
        return self.tuples() | _plain(other)

    __ror__ = __or__

    def __sub__(self, other: object) -> set:
        return self.tuples() - _plain(other)

    def __rsub__(self, other: object) -> set:
        return _plain(other) - self.tuples()

    def __xor__(self, other: object) -> set:
        return self.tuples() ^ _plain(other)

    __rxor__ = __xor__

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, AbstractSet):
            return NotImplemented
        return len(self) == len(other) and self.tuples() == _plain(other)

    __hash__ = None  # type: ignore[assignment]

    def isdisjoint(self, other: Iterable) -> bool:
        return self.tuples().isdisjoint(other)

    def copy(self) -> set[tuple[int, int]]:
        return set(self.tuples())


def _plain(other: object) -> set | frozenset:
    if isinstance(other, SubjectFacts):
        return other.tuples()
    if isinstance(other, (set, frozenset)):
        return other
    return set(other)  # type: ignore[call-overload]


def mutable(facts: AbstractSet) -> set:
    """A set the caller may change: ``facts`` itself when it is a plain set, else a copy."""
    return facts if facts.__class__ is set else set(facts)


def column_values(facts: Iterable[tuple[int, ...]], column: int) -> set[int]:
    """The distinct values of one column of binary facts: for a SubjectFacts, its subjects
    (column 0) or the union of its object sets (column 1), without making tuples."""
    if isinstance(facts, SubjectFacts):
        sets = facts.by_subject
        if column == 0:
            return {subject for subject, objects in sets.items() if objects}
        return set().union(*sets.values())
    return {fact[column] for fact in facts}


def column_counts(facts: Iterable[tuple[int, ...]], column: int) -> dict[int, int]:
    """How many facts each value of one column has (`column_values` with their numbers)."""
    if isinstance(facts, SubjectFacts) and column == 0:
        return {subject: len(objects) for subject, objects in facts.by_subject.items() if objects}
    return Counter(fact[column] for fact in facts)


# --------------------------------------------------------------------------------------------
# Set algebra a subject at a time, over subject -> objects maps (the buckets of a relation
# stored by subject, a SubjectFacts' sets, ...). The results are new maps of new bitmaps, the
# arguments are only read; a subject's cost is one C-level operation on its objects. Used to
# decide which facts of a relation became visible or invisible to a hyper-node (changes.py)
# without building a tuple per fact.

SubjectMap = dict[int, AbstractSet[int]]


def as_bitmap(objects: AbstractSet[int]) -> BitMap:
    """``objects`` as a bitmap: itself when it is one (then read only), else a converted copy."""
    return objects if isinstance(objects, BitMap) else BitMap(objects)


def common(objects: BitMap, theirs: AbstractSet[int]) -> BitMap:
    """``objects & theirs`` as a new bitmap, at the cost of ``objects`` when ``theirs`` is a
    Python set (each of ``objects`` looked up in it, none of ``theirs`` converted)."""
    if isinstance(theirs, BitMap):
        return objects & theirs
    return BitMap(theirs.intersection(objects))  # type: ignore[attr-defined]


def union_by_subject(maps: Iterable[SubjectMap]) -> dict[int, BitMap]:
    """The union of the maps, per subject."""
    out: dict[int, BitMap] = {}
    for part in maps:
        for subject, objects in part.items():
            if not objects:
                continue
            known = out.get(subject)
            if known is None:
                out[subject] = BitMap(objects)
            else:
                known |= as_bitmap(objects)
    return out


def bitmaps_of(facts: SubjectMap) -> dict[int, BitMap]:
    """``facts`` with every object set a bitmap (read only: bitmaps are not copied)."""
    if all(objects.__class__ is BitMap for objects in facts.values()):
        return facts  # type: ignore[return-value]
    return {subject: as_bitmap(objects) for subject, objects in facts.items()}


def shared_union_by_subject(parts: Iterable[SubjectMap]) -> dict[int, BitMap]:
    """`union_by_subject` for reading only: a subject keeps a part's bitmap when no other part
    adds to it (it alone names the subject, or the others' objects are among its own: a
    symmetric closure's explicit edges under the closure), only the others get a new one.
    The part with the most facts is read first; the others' sets are converted only where
    they add something."""
    maps = sorted((part for part in parts if part), key=_fact_count, reverse=True)
    if not maps:
        return {}
    if len(maps) == 1:
        return bitmaps_of(maps[0])
    out = {subject: as_bitmap(objects) for subject, objects in maps[0].items()}
    for part in maps[1:]:
        for subject, objects in part.items():
            known = out.get(subject)
            if known is None:
                out[subject] = as_bitmap(objects)
            elif not all(map(known.__contains__, objects)):
                out[subject] = known | as_bitmap(objects)
    return out


def _fact_count(facts: SubjectMap) -> int:
    return sum(map(len, facts.values()))


def intersection_by_subject(mine: dict[int, BitMap], theirs: SubjectMap) -> dict[int, BitMap]:
    """``mine & theirs`` per subject (at the cost of ``mine``'s subjects)."""
    out: dict[int, BitMap] = {}
    get = theirs.get
    for subject, objects in mine.items():
        other = get(subject)
        if other:
            hit = common(objects, other)
            if hit:
                out[subject] = hit
    return out


def difference_by_subject(
    mine: dict[int, BitMap], theirs: SubjectMap, *, share: bool = False
) -> dict[int, BitMap]:
    """``mine - theirs`` per subject (at the cost of ``mine``'s subjects). ``share``: for a
    result that is only read, a subject ``theirs`` does not name keeps ``mine``'s bitmap
    instead of a copy."""
    out: dict[int, BitMap] = {}
    get = theirs.get
    for subject, objects in mine.items():
        other = get(subject)
        if other:
            objects = objects - (other if isinstance(other, BitMap) else common(objects, other))
        if objects:
            out[subject] = objects if other or share else objects.copy()
    return out


def subject_map(facts: AbstractSet) -> SubjectMap:
    """Binary facts by subject, read only: a SubjectFacts' own map, a relation's buckets or
    subject index (`relation_by_subject`), else one grouped now."""
    if isinstance(facts, SubjectFacts):
        return facts.by_subject
    if isinstance(facts, Relation):
        return relation_by_subject(facts)
    return grouped_by(facts, 0)


def mostly_by_subject(parts: Iterable[AbstractSet]) -> bool:
    """Whether most of the facts in ``parts`` are held by subject already (a SubjectFacts, a
    relation stored by subject): then a reader working a subject at a time groups the rest for
    less than building tuples of those would cost."""
    by_subject = as_tuples = 0
    for facts in parts:
        if isinstance(facts, SubjectFacts) or (
            isinstance(facts, Relation) and not facts.rows_built
        ):
            by_subject += len(facts)
        else:
            as_tuples += len(facts)
    return by_subject > as_tuples


def relation_by_subject(relation: Relation) -> SubjectMap:
    """A binary relation's facts by subject, read only: its buckets or subject index when it
    has them, else grouped now."""
    found = relation.existing_index(SUBJECT)
    return found if found is not None else subject_map(relation.as_set())


# A relation kept as tuples is tested against candidates one way or the other: each of its
# rows looked up in the candidates' bitmaps (a Python loop, about 0.07 us a row) or each
# candidate pair made in C and looked up in its rows (about 0.27 us a candidate, the pair's
# tuple and hash included); measured on this machine's Python 3.11, in the ratio below.
ROW_TEST_COST = 4


def present_by_subject(relation: Relation, candidates: dict[int, BitMap]) -> dict[int, BitMap]:
    """The candidates ``relation`` holds, by subject: per subject against its buckets or
    subject index, else (a relation kept as tuples only) each of its rows looked up in the
    candidates or each candidate looked up in its rows, whichever is fewer lookups by cost
    (``ROW_TEST_COST``)."""
    found = relation.existing_index(SUBJECT)
    if found is not None:
        return intersection_by_subject(candidates, found)
    rows = relation.as_set()  # (kept as tuples: the relation's own set)
    if not rows:
        return {}
    if len(rows) < ROW_TEST_COST * sum(map(len, candidates.values())):
        hits: dict[int, list[int]] = {}
        get = candidates.get
        for subject, obj in rows:
            objects = get(subject)
            if objects is not None and obj in objects:
                hits.setdefault(subject, []).append(obj)
        return {subject: BitMap(objects) for subject, objects in hits.items()}
    # each candidate pair made in C and looked up in the rows, no set of them built
    hits_set = rows.intersection(SubjectFacts(candidates))
    return {s: BitMap(objects) for s, objects in subject_map(hits_set).items()}


def absent(relation: Relation, facts: AbstractSet) -> AbstractSet:
    """``facts`` less those ``relation`` holds: by subject for a SubjectFacts (the answer a
    SubjectFacts too), else ``relation.absent``."""
    if isinstance(facts, SubjectFacts) and relation.arity == 2:
        mine = {s: as_bitmap(objects) for s, objects in facts.by_subject.items() if objects}
        return SubjectFacts(difference_by_subject(mine, present_by_subject(relation, mine)))
    return relation.absent(facts)  # type: ignore[arg-type]
