"""Dropped facts are freed by the background reclaimer, never while an update runs, and
nothing still in use is touched."""

from __future__ import annotations

import time
import weakref

from agent.engine import Reasoner
from agent.engine.storage.store import DataStore, SavedSubjects
from agent.engine.update.reclaim import RECLAIMER, Reclaimer


class Payload:
    """Something weak-referenceable standing for a dropped store."""


def test_discarded_objects_are_freed_after_drain() -> None:
    reclaimer = Reclaimer()
    payload = Payload()
    ref = weakref.ref(payload)
    reclaimer.discard(payload)
    del payload
    assert reclaimer.drain(timeout=10)
    assert ref() is None
    assert reclaimer.freed >= 1


def test_nothing_is_freed_while_an_update_runs() -> None:
    reclaimer = Reclaimer()
    payload = Payload()
    ref = weakref.ref(payload)
    with reclaimer.paused():
        reclaimer.discard(payload)
        del payload
        time.sleep(0.2)
        assert ref() is not None, "freed during an update"
        assert not reclaimer.drain(timeout=0.1)
    assert reclaimer.drain(timeout=10)
    assert ref() is None


def test_a_store_still_referenced_is_left_intact() -> None:
    reclaimer = Reclaimer()
    store = DataStore("kept")
    store.relation(("p", 2)).add_all({(1, 2), (2, 3)})
    store.relation(("p", 2)).index((0,))
    reclaimer.discard(store)
    assert reclaimer.drain(timeout=10)
    assert store.relation(("p", 2)).tuples == {(1, 2), (2, 3)}
    assert store.relation(("p", 2)).index((0,)) == {1: {2}, 2: {3}}


def test_a_dropped_store_of_saved_facts_not_read_is_freed_without_reading_them() -> None:
    """A restart's relations hold their saved bytes until first used (store.SavedSubjects);
    one dropped before that is freed as it is, never deserialised by the reclaimer."""
    reads = []
    saved_bytes = Payload()  # (what the relation holds until read)

    def read(held: Payload = saved_bytes) -> dict:
        reads.append(held)
        return {1: {2, 3}}

    store = DataStore("restored")
    store.relation(("p", 2)).fill(SavedSubjects(2, read))
    ref = weakref.ref(saved_bytes)
    del saved_bytes, read
    reclaimer = Reclaimer()
    reclaimer.discard(store)
    del store
    assert reclaimer.drain(timeout=10)
    assert not reads and ref() is None


def test_rule_deletion_hands_the_dropped_hyper_node_to_the_reclaimer() -> None:
    reasoner = Reasoner()
    reasoner.add_facts([("edge", i, i + 1) for i in range(200)])
    reasoner.add_rules(
        "copy: <copy>(X, Y) :- <edge>(X, Y) .\nback: <back>(Y, X) :- <edge>(X, Y) .\n"
    )
    assert RECLAIMER.drain(timeout=10)
    dropped = next(n for n in reasoner.nodes if n.rules[0].id == "copy")
    relation = dropped.idb.relation(("copy", 2))
    before = RECLAIMER.freed
    reasoner.delete_rules(["copy"])
    assert RECLAIMER.drain(timeout=10)
    assert RECLAIMER.freed > before
    # The dropped relation object is only freed once nobody holds it; ours still does, and
    # it was not emptied behind our back.
    assert len(relation) == 200
    assert sorted(reasoner.facts("copy")) == []
    assert len(list(reasoner.facts("back"))) == 200
