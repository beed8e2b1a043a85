"""Explicit facts packed per source (agent/state/explicit_rows.py) against a model of the claims.

Several sources add and delete facts of arities 1 to 3, whose subjects fall in several chunks
(chunks hold 64 subjects), through the agent's state, which is now and then closed and opened
again. After every step: the explicit facts are those some source claims, each source's facts
are what it claimed, deleting what only another source claims is refused and changes nothing,
and the file's packed rows count exactly the claims.
"""

from __future__ import annotations

import sqlite3

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.state.agent_state import AgentState
from agent.state.claims import OwnershipError
from agent.state.packing import pack, unpack

SOURCES = ("base", "local", "sensor", "telemetry/t2")
TYPE = "http://www.w3.org/1999/02/22-rdf-syntax-ns#type"


def fact_of(shape: int, a: int, b: int) -> tuple:
    """A fact of arity 1 (a class fact), 2 or 3 over terms spread across chunks."""
    if shape == 0:
        return (TYPE, f"n{a}", f"C{b % 3}")
    if shape == 1:
        return ("link", f"n{a}", f"n{b}")
    return ("between", f"n{a}", f"n{b}", f"n{(a + b) % 7}")


# (subjects mostly few, so that sources share them, sometimes spread over three chunks)
subjects = st.one_of(st.integers(0, 5), st.integers(0, 150))
facts = st.builds(fact_of, st.integers(0, 2), subjects, st.integers(0, 150))
steps = st.lists(
    st.tuples(
        st.sampled_from(SOURCES),
        st.booleans(),  # True: add, False: delete
        st.lists(facts, min_size=1, max_size=12),
        st.lists(st.integers(0, 10_000), max_size=8),  # deleting: facts held, by position
        st.booleans(),  # reopen the state afterwards
    ),
    min_size=1,
    max_size=10,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps)
def test_packed_claims_follow_a_model_of_the_claims(tmp_path_factory, program):
    path = tmp_path_factory.mktemp("claims") / "a.db"
    claims: dict[tuple, set[str]] = {}
    state = AgentState(path)
    try:
        for source, adding, batch, picks, reopen in program:
            if not adding:  # facts some source holds (this one's, mostly), and one maybe not
                mine = sorted(f for f, sources in claims.items() if source in sources)
                held = mine or sorted(f for f, sources in claims.items() if sources)
                chosen = [held[i % len(held)] for i in picks] if held else []
                batch = chosen + batch[:1]
            if adding:
                state.apply(add_facts=batch, source=source)
                for fact in batch:
                    claims.setdefault(fact, set()).add(source)
            else:
                others = {f for f in batch if claims.get(f) and source not in claims[f]}
                if others:
                    with pytest.raises(OwnershipError):
                        state.apply(delete_facts=batch, source=source)
                else:
                    state.apply(delete_facts=batch, source=source)
                    for fact in batch:
                        claims.get(fact, set()).discard(source)
            if reopen:
                state.close()
                state = AgentState(path)
                assert state.load_report.how == "loaded"
            check(state, claims)
    finally:
        state.close()


def check(state: AgentState, claims: dict[tuple, set[str]]) -> None:
    held = {fact for fact, sources in claims.items() if sources}
    assert state.reasoner.count() == len(held)  # (no rules: every fact is explicit)
    assert set(state.reasoner.edb_facts()) == held
    for source in SOURCES:
        mine = {fact for fact, sources in claims.items() if source in sources}
        assert sorted(state.facts_of_source(source)) == sorted(mine)
    total = sum(len(sources) for sources in claims.values())
    assert state.summary()["explicit_facts"] == total
    assert state.check_integrity() == []
    assert_counts_are_the_bitmaps(state)


def assert_counts_are_the_bitmaps(state: AgentState) -> None:
    """Every packed row's counts are those of its bitmaps (a chunk changed in place gets them
    from its old counts and the change: agent/state/chunk_tables.py)."""
    for table in ("explicit", "derived"):
        for size, high, top, blob in state.conn.execute(
            f"SELECT size, high, top, packed FROM {table}"
        ):
            chunk = unpack(blob)
            fresh = pack(chunk.width, chunk.items())
            assert (size, high, top) == (fresh.size, fresh.high, fresh.top), table


def test_a_fact_in_a_chunk_another_source_also_writes_keeps_both_claims(tmp_path):
    """Two sources' rows of one chunk are separate rows: changing one leaves the other."""
    path = tmp_path / "a.db"
    with AgentState(path) as state:
        state.apply(add_facts=[("link", "n1", "n2"), ("link", "n3", "n4")], source="base")
        state.apply(add_facts=[("link", "n1", "n2"), ("link", "n1", "n5")], source="local")
        state.apply(delete_facts=[("link", "n1", "n2")], source="base")
        assert ("link", "n1", "n2") in set(state.reasoner.edb_facts())
    with sqlite3.connect(path) as conn:
        rows = conn.execute("SELECT source, size FROM explicit ORDER BY source").fetchall()
    assert rows == [("base", 1), ("local", 2)]
    with AgentState(path) as state:
        assert set(state.reasoner.edb_facts()) == {
            ("link", "n1", "n2"),
            ("link", "n3", "n4"),
            ("link", "n1", "n5"),
        }


def test_a_relation_several_sources_claim_is_united_at_a_restart(tmp_path):
    """Subject by subject (one subject's objects come from two sources' rows), and counted
    once where both claim the same fact."""
    path = tmp_path / "a.db"
    shared = ("link", "n1", "n2")
    with AgentState(path) as state:
        state.apply(add_facts=[shared, ("link", "n1", "n3")], source="base")
        state.apply(add_facts=[shared, ("link", "n1", "n4")], source="local")
    with AgentState(path) as state:
        assert state.load_report.how == "loaded"
        assert state.reasoner.count() == 3  # (before reading: a count the restart was given)
        assert set(state.reasoner.edb_facts()) == {
            shared,
            ("link", "n1", "n3"),
            ("link", "n1", "n4"),
        }
        assert state.summary()["explicit_facts"] == 4  # claims
