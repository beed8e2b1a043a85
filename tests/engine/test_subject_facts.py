"""SubjectFacts (agent/engine/storage/subject_facts.py) behaves as the set of tuples it stands for,
with plain sets on either side of every operator, and StoreChanges records net changes the same
whether it is given SubjectFacts or plain sets."""

from __future__ import annotations

from collections import defaultdict

from hypothesis import given, settings
from hypothesis import strategies as st
from pyroaring import BitMap

from agent.engine.storage import changes as changes_module
from agent.engine.storage import subject_facts
from agent.engine.storage.changes import ChangeLog, StoreChanges, visible_difference
from agent.engine.storage.store import DataStore
from agent.engine.storage.subject_facts import (
    SubjectFacts,
    difference_by_subject,
    intersection_by_subject,
    mutable,
    present_by_subject,
    union_by_subject,
)

MOSTLY_BY_SUBJECT = changes_module.mostly_by_subject

pairs = st.sets(st.tuples(st.integers(0, 6), st.integers(0, 6)), max_size=25)


def by_subject(facts: set, bitmaps: bool) -> SubjectFacts:
    grouped: dict = defaultdict(set)
    for s, o in facts:
        grouped[s].add(o)
    if bitmaps:
        return SubjectFacts({s: BitMap(objects) for s, objects in grouped.items()})
    return SubjectFacts(dict(grouped))


@given(pairs, pairs, st.booleans(), st.integers(-1, 7), st.integers(-1, 7))
def test_subject_facts_behave_as_their_tuples(left, right, bitmaps, s, o):
    lazy = by_subject(left, bitmaps)
    other = by_subject(right, not bitmaps)
    assert len(lazy) == len(left)
    assert set(lazy) == left and sorted(lazy) == sorted(left)
    assert ((s, o) in lazy) == ((s, o) in left)
    assert "x" not in lazy and (s,) not in lazy
    for plain in (right, frozenset(right), other):
        assert lazy & plain == left & right and plain & lazy == right & left
        assert lazy | plain == left | right and plain | lazy == right | left
        assert lazy - plain == left - right and plain - lazy == right - left
        assert lazy ^ plain == left ^ right and plain ^ lazy == right ^ left
        assert (lazy == plain) == (left == right) and (plain == lazy) == (right == left)
        assert lazy.isdisjoint(plain) == left.isdisjoint(right)
        assert (lazy <= plain) == (left <= right)
    assert set(lazy) == left  # iteration after the tuples were built
    copy = lazy.copy()
    copy.add((99, 99))
    assert (99, 99) not in lazy and set(lazy) == left
    changed = mutable(lazy)
    changed.discard(next(iter(left), None))
    assert set(lazy) == left
    # In-place operators on a plain set with SubjectFacts on the right.
    plain = set(right)
    plain -= lazy
    assert plain == right - left
    plain = set(right)
    plain |= lazy
    assert plain == right | left


steps = st.lists(
    st.tuples(st.sampled_from(["add", "remove"]), pairs, st.booleans(), st.booleans()),
    max_size=6,
)


@given(steps)
def test_store_changes_net_the_same_with_subject_facts(script):
    plain, lazy = StoreChanges(), StoreChanges()
    key = ("p", 2)
    for operation, facts, owned, bitmaps in script:
        getattr(plain, operation)(key, set(facts), owned=owned)
        getattr(lazy, operation)(key, by_subject(facts, bitmaps), owned=owned)
    assert set(lazy.added.get(key, ())) == plain.added.get(key, set())
    assert set(lazy.removed.get(key, ())) == plain.removed.get(key, set())
    assert lazy.counts() == plain.counts()


def subject_map_of(facts: set, bitmaps: bool) -> dict:
    return dict(by_subject(facts, bitmaps).by_subject)


def tuples_of(grouped: dict) -> set:
    return {(s, o) for s, objects in grouped.items() for o in objects}


@given(pairs, pairs, pairs, st.booleans())
def test_algebra_by_subject_equals_the_set_operators(left, right, more, bitmaps):
    mine = {s: BitMap(objects) for s, objects in subject_map_of(left, True).items()}
    theirs = subject_map_of(right, bitmaps)
    before = {s: BitMap(objects) for s, objects in mine.items()}
    assert tuples_of(intersection_by_subject(mine, theirs)) == left & right
    assert tuples_of(difference_by_subject(mine, theirs)) == left - right
    parts = (mine, theirs, subject_map_of(more, not bitmaps))
    assert tuples_of(union_by_subject(parts)) == left | right | more
    assert mine == before  # the arguments are only read
    for result in (union_by_subject(parts), difference_by_subject(mine, theirs)):
        assert all(result[s] is not mine.get(s) for s in result)  # new bitmaps, not shared


# --- visible differences computed a subject at a time equal the tuple path and the definition

store_contents = st.lists(st.tuples(pairs, pairs, st.booleans(), st.booleans()), max_size=4)


@settings(max_examples=300)
@given(store_contents, st.data())
def test_visible_difference_by_subject_equals_the_definition(contents, data):
    """Random lower stores before and after an update (created, dropped, staying, kept as tuples
    or by subject, changes as plain sets or SubjectFacts): the facts that became visible and
    invisible through the union, by either path, are exactly the definition's. Half the
    examples keep every store in place (a fact update: the path that tests each store only
    against the others' changes)."""
    key = ("p", 2)
    stores, log = [], ChangeLog()
    in_place = data.draw(st.booleans())
    before_of, after_of = {}, {}
    for index, (held, changed, as_subjects, subject_changes) in enumerate(contents):
        store = DataStore(f"s{index}")
        relation = store.relation(key)
        if as_subjects and held:
            relation.adopt_subjects(
                {s: BitMap(objects) for s, objects in subject_map_of(held, True).items()}
            )
        else:
            relation.add_all(held)
        added = held & changed
        removed = changed - held
        fate = "staying"
        if not in_place:
            fate = data.draw(
                st.sampled_from(["staying", "created", "dropped", "entering", "leaving"])
            )
        if added or removed or fate != "staying":
            wrap = (lambda f: by_subject(f, True)) if subject_changes else set
            log.record(store, StoreChanges(added={key: wrap(added)}, removed={key: wrap(removed)}))
        if fate == "created":
            log.created.add(store)
        if fate == "dropped":
            log.dropped.add(store)
        before_of[store] = set() if fate == "created" else (held - added) | removed
        after_of[store] = set() if fate == "dropped" else held
        stores.append((store, fate))
    old_lower = [s for s, fate in stores if fate not in ("created", "entering")]
    new_lower = [s for s, fate in stores if fate not in ("dropped", "leaving")]
    visible_before = set().union(*(before_of[s] for s in old_lower))
    visible_after = set().union(*(after_of[s] for s in new_lower))
    for by_subjects in (False, True):
        changes_module.mostly_by_subject = lambda *args, forced=by_subjects: forced
        try:
            fresh = ChangeLog(changes=log.changes, created=log.created, dropped=log.dropped)
            found = visible_difference([key], old_lower, new_lower, fresh)
        finally:
            changes_module.mostly_by_subject = MOSTLY_BY_SUBJECT
        assert set(found.plus.get(key, ())) == visible_after - visible_before
        assert set(found.minus.get(key, ())) == visible_before - visible_after


@given(pairs, pairs, st.booleans(), st.sampled_from([0, 4, 10**9]))
def test_present_by_subject_is_the_intersection_whichever_way_it_looks(
    held, candidates, indexed, row_cost
):
    """A relation's facts among candidates, by its subject index, by a pass over its rows, or
    by looking each candidate up in them (the choice forced through ``ROW_TEST_COST``)."""
    relation = DataStore("s").relation(("p", 2))
    relation.add_all(held)
    if indexed:
        relation.index((0,))
    wanted = {s: BitMap(objects) for s, objects in by_subject(candidates, True).by_subject.items()}
    saved = subject_facts.ROW_TEST_COST
    subject_facts.ROW_TEST_COST = row_cost
    try:
        found = present_by_subject(relation, wanted)
    finally:
        subject_facts.ROW_TEST_COST = saved
    assert all(objects.__class__ is BitMap for objects in found.values())
    assert set(SubjectFacts(found)) == held & candidates
