"""Relation storage: a relation kept by subject only (`Relation.adopt_subjects`, a closure
module's output, or a restored state's bitmaps) must behave exactly like one kept as a set of
tuples, through every read and every update, whether or not a reader has made it build its
tuples, and hand compiled rules Python sets whatever container it was given."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyroaring import BitMap

from agent.engine.storage.store import Relation, SavedSubjects, by_subject, is_unread

KEY = ("edge", 2)
pairs = st.tuples(st.integers(0, 5), st.integers(0, 5))
pair_sets = st.sets(pairs, max_size=12)
operations = st.lists(
    st.tuples(
        st.sampled_from(
            ["add_all", "remove_all", "add_absent", "remove_present", "index0", "index1", "scan"]
        ),
        pair_sets,
    ),
    max_size=12,
)


def plain_relation(rows: set) -> Relation:
    relation = Relation(KEY)
    relation.add_all(rows)
    return relation


def subject_relation(rows: set) -> Relation:
    relation = Relation(KEY)
    relation.adopt_subjects(by_subject(rows))
    return relation


def bitmap_relation(rows: set) -> Relation:
    """Subject storage on foreign buckets (bitmaps), as the agent's saved state hands over."""
    relation = Relation(KEY)
    buckets = {s: BitMap(objects) for s, objects in by_subject(rows).items()}
    relation.adopt_subjects(buckets, BitMap)
    return relation


def saved_relation(rows: set) -> Relation:
    """Bitmaps a restart has not read yet (`SavedSubjects`): read by the first use. (The
    agent's state saves no empty relation: one is an empty relation of bitmaps.)"""
    if not rows:
        return bitmap_relation(rows)
    relation = Relation(KEY)
    buckets = {s: BitMap(objects) for s, objects in by_subject(rows).items()}
    relation.fill(SavedSubjects(len(rows), lambda: buckets))
    return relation


def same_contents(relation: Relation, expected: set, build_index: bool = True) -> None:
    assert len(relation) == len(expected)
    assert set(relation) == expected
    for fact in expected:
        assert fact in relation
    assert (9, 9) not in relation
    assert relation.present(expected | {(9, 9)}) == expected
    assert relation.absent(expected | {(9, 9)}) == {(9, 9)}
    if build_index:
        assert relation.index((0,)) == by_subject(expected)
    index = relation.existing_index((0,))
    if index is not None:  # (read as a reader of existing_index may: membership, iteration)
        assert {s: set(objects) for s, objects in index.items()} == by_subject(expected)


@settings(max_examples=150, deadline=None)
@given(start=pair_sets, steps=operations)
@pytest.mark.parametrize(
    "make",
    [subject_relation, bitmap_relation, saved_relation],
    ids=["sets", "bitmaps", "saved bitmaps"],
)
def test_subject_storage_behaves_like_tuple_storage(make, start, steps):
    expected = set(start)
    plain, subjects = plain_relation(start), make(start)
    foreign = make is not subject_relation
    assert not subjects.rows_built or not start
    thawed = False  # index0 hands compiled rules Python sets, converting the buckets
    for operation, facts in steps:
        built = subjects.rows_built
        thawed |= operation == "index0"
        if operation == "add_all":
            assert subjects.add_all(facts) == plain.add_all(facts) == facts - expected
            expected |= facts
        elif operation == "remove_all":
            assert subjects.remove_all(facts) == plain.remove_all(facts) == facts & expected
            expected -= facts
        elif operation == "add_absent":
            facts = facts - expected
            subjects.add_absent(facts)
            plain.add_absent(facts)
            expected |= facts
        elif operation == "remove_present":
            facts = facts & expected
            subjects.remove_present(facts)
            plain.remove_present(facts)
            expected -= facts
        elif operation == "index0":  # what compiled rules read: Python sets, always
            index = subjects.index((0,))
            assert index == plain.index((0,))
            assert all(objects.__class__ is set for objects in index.values())
        elif operation == "index1":  # needs the tuples: built here, then kept up to date
            assert subjects.index((1,)) == plain.index((1,))
        else:
            assert subjects.tuples == plain.tuples == expected
        if operation not in ("index1", "scan"):
            # Changes test and write buckets: no tuple is built for them, however many.
            assert subjects.rows_built == built
        if foreign and not thawed and not subjects.rows_built:
            # A new subject gets a bitmap too: the relation stays compressed.
            assert all(b.__class__ is BitMap for b in existing_buckets(subjects))
        same_contents(subjects, expected, build_index=not foreign)
        same_contents(plain, expected)


FIRST_USES = {
    "in": lambda r: (0, 1) in r,
    "iterate": lambda r: sorted(r),
    "index on subject": lambda r: r.index((0,)),
    "index on object": lambda r: r.index((1,)),
    "existing index": lambda r: r.existing_index((1,)),
    "tuples": lambda r: r.tuples,
    "present": lambda r: r.present({(0, 1), (9, 9)}),
    "add": lambda r: r.add_all({(5, 5)}),
    "remove": lambda r: r.remove_all({(0, 1)}),
    "clear": lambda r: r.clear(),
    "repr": repr,
}


@pytest.mark.parametrize("use", sorted(FIRST_USES))
def test_saved_facts_are_read_once_by_the_first_use_of_any_kind(use):
    """A relation filled with saved facts not read yet answers ``len`` from their count; any
    other first use reads them, once, and then the relation is a plain one (repr excepted:
    it says the facts are not read yet)."""
    rows = {(0, 1), (0, 2), (3, 4)}
    reads = []
    relation = Relation(KEY)

    def read() -> dict:
        reads.append(1)
        return {s: BitMap(objects) for s, objects in by_subject(rows).items()}

    relation.fill(SavedSubjects(len(rows), read))
    assert len(relation) == 3 and relation and is_unread(relation) and not reads
    plain = plain_relation(rows)
    assert FIRST_USES[use](plain) == FIRST_USES[use](relation) or use == "repr"
    if use == "repr":
        assert "not read yet" in repr(relation) and not reads
        return
    assert reads == [1] and not is_unread(relation) and type(relation) is Relation
    same_contents(relation, set(plain))
    assert reads == [1]


def existing_buckets(relation: Relation) -> list:
    index = relation.existing_index((0,))
    return list(index.values()) if index is not None else []


def test_tuples_are_built_once_on_first_read_and_the_subject_index_kept():
    relation = subject_relation({(1, 2), (1, 3), (2, 3)})
    assert not relation.rows_built
    assert relation.index((0,)) == {1: {2, 3}, 2: {3}}
    assert not relation.rows_built  # the subject index is the storage: no tuples needed
    assert relation.tuples == {(1, 2), (1, 3), (2, 3)}
    assert relation.rows_built
    relation.remove_all({(1, 2)})
    assert relation.index((0,)) == {1: {3}, 2: {3}}
    assert relation.tuples == {(1, 3), (2, 3)}


def test_dropping_indexes_keeps_the_facts_of_subject_storage():
    relation = subject_relation({(1, 2), (2, 3)})
    relation.drop_indexes()
    assert set(relation) == {(1, 2), (2, 3)}
    relation.clear()
    assert len(relation) == 0 and relation.tuples == set()


def test_the_size_checks_hold_for_subject_storage():
    relation = subject_relation({(1, 2)})
    with pytest.raises(AssertionError):
        relation.add_absent({(1, 2)})
    relation = subject_relation({(1, 2)})
    with pytest.raises(AssertionError):
        relation.remove_present({(5, 6)})


def test_adopt_subjects_needs_an_empty_binary_relation():
    with pytest.raises(ValueError):
        Relation(("p", 3)).adopt_subjects({1: {2}})
    filled = plain_relation({(1, 2)})
    with pytest.raises(ValueError):
        filled.adopt_subjects({3: {4}})


triples = st.sets(st.tuples(st.integers(0, 4), st.integers(0, 3), st.integers(0, 4)), max_size=30)
PARTITIONS = [  # (constants, bound): what an atom with constants and bound variables probes
    (((1, 2),), (0,)),  # triple(P, <2>, C) with P bound
    (((1, 0),), (2,)),  # triple(X, <0>, C) with C bound
    (((0, 1),), (2,)),  # triple(<1>, P, O) with O bound
]


def changed(relation: Relation, start: set, steps: list):
    """Apply each step (insert or delete a batch) to ``relation``; yield the facts after each."""
    facts = set(start)
    for adding, batch in steps:
        if adding:
            relation.add_all(batch)
            facts |= batch
        else:
            relation.remove_all(batch)
            facts -= batch
        yield facts


@settings(max_examples=150, deadline=None)
@given(start=triples, steps=st.lists(st.tuples(st.booleans(), triples), max_size=5))
def test_partitions_equal_filtered_indexes_through_changes(start, steps):
    """A partition (Relation.partition) holds, keyed on its bound columns, exactly the facts
    with its constants, after any insertions and deletions made after it was built."""
    relation = Relation(("triple", 3))
    relation.add_all(start)
    for constants, bound in PARTITIONS:
        relation.partition(constants, bound)
    for facts in changed(relation, start, steps):
        for constants, bound in PARTITIONS:
            used = {c for c, _ in constants} | set(bound)
            free = [c for c in range(3) if c not in used]
            expected: dict = {}
            for fact in facts:
                if all(fact[c] == v for c, v in constants):
                    key = fact[bound[0]] if len(bound) == 1 else tuple(fact[c] for c in bound)
                    value = fact[free[0]] if len(free) == 1 else tuple(fact[c] for c in free)
                    expected.setdefault(key, set()).add(value)
            assert relation.partition(constants, bound) == expected


@settings(max_examples=150, deadline=None)
@given(
    start=st.sets(st.tuples(st.integers(0, 6), st.integers(0, 3)), max_size=30),
    steps=st.lists(
        st.tuples(st.booleans(), st.sets(st.tuples(st.integers(0, 6), st.integers(0, 3)))),
        max_size=5,
    ),
)
def test_a_bucketed_index_holds_the_facts_through_changes(start, steps):
    """A bucketed index (bitmaps keyed on one column) holds exactly the relation's facts after
    any insertions and deletions made after it was built, beside an ordinary index."""
    relation = Relation(("takes", 2))
    relation.add_all(start)
    relation.index((0,))
    for column in (0, 1):
        relation.bucketed_index(column, BitMap)
    for facts in changed(relation, start, steps):
        for column in (0, 1):
            index = relation.existing_bucketed_index(column)
            if index is None:  # (dropped when half the facts went: rebuilt on demand)
                index = relation.bucketed_index(column, BitMap)
            assert all(bucket.__class__ is BitMap and bucket for bucket in index.values())
            grouped: dict = {}
            for fact in facts:
                grouped.setdefault(fact[column], set()).add(fact[1 - column])
            assert {key: set(bucket) for key, bucket in index.items()} == grouped
