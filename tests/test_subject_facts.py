"""SubjectFacts (agent/engine/subject_facts.py) behaves as the set of tuples it stands for, with
plain sets on either side of every operator, and StoreChanges records net changes the same
whether it is given SubjectFacts or plain sets."""

from __future__ import annotations

from collections import defaultdict

from hypothesis import given
from hypothesis import strategies as st
from pyroaring import BitMap

from agent.engine.changes import StoreChanges
from agent.engine.subject_facts import SubjectFacts, mutable

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
