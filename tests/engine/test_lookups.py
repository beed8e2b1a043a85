"""The composition module's reads of a binary relation by one column (`modules/lookups.py`):
whatever a relation's storage (tuples with or without an index, by subject on sets or on
bitmaps, a bucketed index) and however many distinct values the changes carry, `reach` and
`Lookup.some` give what their definitions over the facts give."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyroaring import BitMap

from agent.engine.modules.support.lookups import FEW_VALUES, Lookup, reach
from agent.engine.storage.store import Relation, by_subject

KEY = ("a", 2)
ids = st.integers(0, 9)  # few ids: keys meet several facts
facts = st.sets(st.tuples(ids, ids), max_size=40)
STORAGES = ["tuples", "indexed", "bucketed", "subject sets", "subject bitmaps"]
# Every storage alone, and views over several stores mixing them (a hyper-node's inputs).
VIEWS = [[storage] for storage in STORAGES] + [
    ["subject bitmaps", "tuples"],
    ["subject sets", "indexed", "subject bitmaps"],
    ["bucketed", "subject bitmaps", "subject bitmaps"],
]
each_view = pytest.mark.parametrize("storages", VIEWS, ids="+".join)
each_column = pytest.mark.parametrize("column", [0, 1])


def stored(rows: set, storage: str, column: int) -> Relation:
    relation = Relation(KEY)
    if storage == "subject sets":
        relation.adopt_subjects(by_subject(rows))
    elif storage == "subject bitmaps":
        relation.adopt_subjects({s: BitMap(o) for s, o in by_subject(rows).items()}, BitMap)
    else:
        relation.add_all(rows)
        if storage == "indexed":
            relation.index((column,))
        elif storage == "bucketed":
            relation.bucketed_index(column, BitMap)
    return relation


def split(rows: set, parts: int) -> list[set]:
    """The facts spread over ``parts`` relations, overlapping (a view's stores may both hold
    a fact)."""
    ordered = sorted(rows)
    return [set(ordered[i::parts]) | set(ordered[:2]) for i in range(parts)]


@each_view
@each_column
@settings(max_examples=25, deadline=None)
@given(
    rows=facts,
    values_by_key=st.dictionaries(ids, st.sets(ids, min_size=1, max_size=12), max_size=12),
    few=st.booleans(),
)
def test_reach_is_the_union_of_the_values_of_the_keys_each_x_meets(
    storages, column, rows, values_by_key, few
):
    if few:  # every key's values among two values: the per-value test
        values_by_key = {key: {min(values) % 2} for key, values in values_by_key.items()}
    relations = [
        stored(part, storage, column)
        for part, storage in zip(split(rows, len(storages)), storages, strict=True)
    ]
    expected: dict[int, set] = {}
    for fact in rows:
        key, x = fact[column], fact[1 - column]
        if key in values_by_key:
            expected.setdefault(x, set()).update(values_by_key[key])
    bitmaps = {key: BitMap(values) for key, values in values_by_key.items()}
    got = reach(relations, column, bitmaps)
    assert {x: set(values) for x, values in got.items()} == expected
    assert bitmaps == {key: BitMap(values) for key, values in values_by_key.items()}  # unchanged


def test_both_ways_of_reaching_through_subjects_are_taken():
    """Few distinct values are tested per value, many are united per key met: both agree."""
    rows = {(x, y) for x in range(40) for y in range(x % 7, 60, 3)}
    relation = stored(rows, "subject bitmaps", 1)
    few = {y: BitMap([7]) for y in range(0, 60, 2)}
    many = {y: BitMap([y, 100 + y % (FEW_VALUES + 3)]) for y in range(0, 60, 2)}
    for values_by_key in (few, many):
        expected: dict[int, BitMap] = {}
        for x, y in rows:
            if y in values_by_key:
                expected[x] = expected.get(x, BitMap()) | values_by_key[y]
        assert reach([relation], 1, values_by_key) == expected


@each_view
@each_column
@settings(max_examples=25, deadline=None)
@given(rows=facts, keys=st.sets(ids, max_size=10))
def test_lookup_for_some_keys_gives_each_keys_values(storages, column, rows, keys):
    relations = [
        stored(part, storage, column)
        for part, storage in zip(split(rows, len(storages)), storages, strict=True)
    ]
    lookup = Lookup.some(relations, column, keys)
    for key in keys:
        expected = {fact[1 - column] for fact in rows if fact[column] == key}
        assert set(lookup(key)) == expected


@pytest.mark.parametrize("order", ["bitmaps first", "sets first"])
def test_a_key_read_from_bitmaps_of_several_relations_is_a_bitmap_of_their_union(order):
    """Over several relations, a key with a bitmap among its values gets a bitmap (united in
    C: a Python set would be built a value at a time), the sets' values included whichever
    relation comes first; the relations' own buckets are left as they were."""
    closure = {(x, y) for x in range(5) for y in range(100) if y != x}
    explicit = {(x, x + 200) for x in range(3)} | {(7, 1)}
    storages = [(closure, "subject bitmaps"), (explicit, "subject sets")]
    if order == "sets first":
        storages.reverse()
    relations = [stored(rows, storage, 0) for rows, storage in storages]
    before = [{x: set(objects) for x, objects in r.existing_index((0,)).items()} for r in relations]
    lookup = Lookup.some(relations, 0, {0, 2, 4, 7})
    for key in (0, 2, 4):
        assert lookup(key).__class__ is BitMap
        assert set(lookup(key)) == {y for x, y in closure | explicit if x == key}
    assert lookup(7).__class__ is set and lookup(7) == {1}
    after = [{x: set(objects) for x, objects in r.existing_index((0,)).items()} for r in relations]
    assert after == before
