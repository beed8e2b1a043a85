"""The cyclic collector is paused during updates and left as the caller had it."""

from __future__ import annotations

import gc
import weakref

import pytest

from agent.engine import Reasoner
from agent.engine.gcpause import FREEZE_AT, collector_paused


@pytest.fixture
def unfrozen():
    yield
    gc.unfreeze()


def test_collector_is_disabled_inside_and_restored_after(unfrozen) -> None:
    assert gc.isenabled()
    with collector_paused():
        assert not gc.isenabled()
    assert gc.isenabled()


def test_collector_left_disabled_when_the_caller_disabled_it(unfrozen) -> None:
    gc.unfreeze()
    gc.disable()
    try:
        with collector_paused():
            junk = [[i] for i in range(FREEZE_AT + 10)]
        assert not gc.isenabled()
        assert gc.get_freeze_count() == 0, "nothing is frozen for a caller who disabled gc"
        del junk
    finally:
        gc.enable()


def test_restored_even_when_the_block_raises(unfrozen) -> None:
    with pytest.raises(ValueError), collector_paused():
        raise ValueError("boom")
    assert gc.isenabled()


def test_large_updates_freeze_small_ones_do_not(unfrozen) -> None:
    gc.unfreeze()
    gc.collect()
    reasoner = Reasoner()
    reasoner.add_facts([("edge", i, i + 1) for i in range(10)])
    assert gc.get_freeze_count() == 0
    reasoner.add_facts([("edge", i, i + 1) for i in range(10, FREEZE_AT + 1000)])
    assert gc.get_freeze_count() > FREEZE_AT


def test_a_rule_deleted_after_a_freeze_leaves_no_uncollectable_cycle(unfrozen) -> None:
    """Compiled rule functions are kept out of reference cycles, so deleting a rule frees
    its code by reference counting even when the collector froze it."""
    reasoner = Reasoner()
    reasoner.add_facts([("edge", i, i + 1) for i in range(50)])
    # (a filter, so the rule is compiled: a plain copy would go to the renaming module)
    reasoner.add_rules("r: <path>(X, Y) :- <edge>(X, Y) and COMP(X, !=, 7) .")
    assert reasoner.plans("r")
    function = reasoner.plans("r")[0].function
    assert not any(obj is function for obj in function.__globals__.values())


def test_a_block_marked_large_freezes_however_few_objects_it_made(unfrozen) -> None:
    gc.unfreeze()
    gc.collect()
    with collector_paused():
        pass
    assert gc.get_freeze_count() == 0
    with collector_paused() as pause:
        pause.large = True
    assert gc.get_freeze_count() > 0


def test_an_update_changing_many_facts_freezes(unfrozen) -> None:
    """Deleting one edge of a long chain under the TC rule removes many derived facts while
    leaving few new objects alive: the update still counts as large."""
    reasoner = Reasoner()
    reasoner.add_facts([("edge", i, i + 1) for i in range(300)])
    reasoner.add_rules("t: edge(X, Z) :- edge(X, Y) and edge(Y, Z) .")
    gc.unfreeze()
    gc.collect()
    report = reasoner.update(delete_facts=[("edge", 150, 151)])
    removed = sum(node["removed"] for node in report["hyper_nodes"].values())
    assert removed > FREEZE_AT
    assert gc.get_freeze_count() > 0


PROGRAMS = {
    "plain": "<copy>(X, Y) :- <q>(X, Y) .",
    "equality": "owl:sameAs(X, Y) :- <key>(X, S), <key>(Y, S) .\n<copy>(X, Y) :- <q>(X, Y) .",
    "closure": "<reach>(X, Y) :- <q>(X, Y) .\n<reach>(X, Z) :- <reach>(X, Y), <q>(Y, Z) .",
    "aggregate": "<n>(X, N) :- aggregate(<q>(X, Y)) on X with count(Y) as N .",
    "filter and negation": "<f>(X, Y) :- <q>(X, Y), not <key>(X, Y), X != Y .",
    "cycle": "<tri>(X, Y, Z) :- <q>(X, Y), <q>(Y, Z), <q>(Z, X) .",
}


@pytest.mark.parametrize("program", sorted(PROGRAMS))
def test_a_dropped_reasoner_is_freed_after_a_freeze(unfrozen, program) -> None:
    """A large update freezes what is alive (gcpause.py): a reasoner that held a reference
    cycle would then never be freed once dropped. Every kind of hyper-node, the equality layer
    included (it held a method bound to its reasoner: each dropped reasoner with owl:sameAs
    stayed in memory, 24 GB in one benchmark run), must be freed by reference counting."""
    reasoner = Reasoner()
    # Chains of ten (a long cycle made the closure case quadratic: 40-50 s for nothing).
    facts = [("q", f"a{i}", f"a{i + 1}") for i in range(FREEZE_AT + 2200) if i % 10]
    reasoner.update(
        add_rules="@prefix owl: <http://www.w3.org/2002/07/owl#> .\n" + PROGRAMS[program],
        add_facts=[*facts, ("key", "a1", "k"), ("key", "a2", "k")],
    )
    reasoner.update(delete_facts=facts[: len(facts) // 2])
    assert gc.get_freeze_count() > 0  # (the updates were large enough)
    alive = weakref.ref(reasoner)
    del reasoner
    assert alive() is None, "a reference cycle keeps the dropped reasoner"


@pytest.mark.parametrize("program", sorted(PROGRAMS))
def test_opening_a_saved_state_freezes_it_and_a_closed_one_is_freed(
    unfrozen, program, tmp_path
) -> None:
    """Loading the agent's state builds the reasoner's whole state, like a materialisation:
    the collector is paused meanwhile and what is alive is then frozen, however small the
    state (a full collection right after a restart walked every object of a process just
    started). So a closed and dropped state, reasoner and hyper-nodes included, must be freed
    by reference counting alone."""
    from agent.state.agent_state import AgentState

    path = tmp_path / "agent.db"
    with AgentState(path) as state:
        state.apply(
            add_rules="@prefix owl: <http://www.w3.org/2002/07/owl#> .\n" + PROGRAMS[program],
            add_facts=[("q", "a", "b"), ("q", "b", "c"), ("key", "a", "k"), ("key", "b", "k")],
        )
    gc.unfreeze()
    gc.collect()
    state = AgentState(path)
    assert gc.isenabled() and gc.get_freeze_count() > 0
    assert state.load_report.how == "loaded"
    alive = [weakref.ref(state), weakref.ref(state.reasoner)]
    alive += [weakref.ref(node) for node in state.reasoner.nodes]
    state.close()
    del state
    assert all(ref() is None for ref in alive), "a reference cycle keeps the closed state"
