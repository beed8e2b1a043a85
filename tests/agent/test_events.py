"""Events: the watched facts each change makes appear and disappear, written to the outbox in
the change's own transaction (agent/state/outbox.py), in the device's ``seq`` order.

In-process here (the agent's methods, a real SQLite file); the MQTT side, kill -9 and broker
restarts are in test_events_delivery.py.
"""

from __future__ import annotations

import random

import pytest

from agent.protocol.messages import fact_tuple
from agent.state.outbox import pending_events
from tests.agent.test_service import make_agent
from tests.support.agent_harness import Cloud, readings_payload

HOT = {"hot": "hot: <Hot>(X) :- <temp>(X, T) and COMP(T, >, 30) ."}
WARM = {"warm": "warm: <Warm>(X) :- <temp>(X, T) and COMP(T, >, 20) ."}
EVENTS = '[events]\nwatch = ["<Hot>(X)"]\n'


@pytest.fixture
def cloud(tmp_path):
    return Cloud(tmp_path / "cloud")


def replay(agent, upto: dict[str, set] | None = None) -> dict[str, set]:
    """The outbox's events replayed from the first, per watch (events must follow on)."""
    known: dict[str, set] = {} if upto is None else upto
    for event in pending_events(agent.state.conn, limit=10_000):
        for watch, appeared, disappeared in event.changes:
            facts = known.setdefault(watch, set())
            appeared = {fact_tuple(f) for f in appeared}
            disappeared = {fact_tuple(f) for f in disappeared}
            assert not appeared & facts, (watch, appeared)
            assert disappeared <= facts, (watch, disappeared)
            facts -= disappeared
            facts |= appeared
    return {watch: facts for watch, facts in known.items() if facts}


def watched_now(agent) -> dict[str, set]:
    found = {}
    for pattern in agent.state.watches:
        facts = {fact for fact in agent.reasoner.facts() if _matches(pattern, fact)}
        if facts:
            found[pattern] = facts
    return found


def _atom(pattern: str):
    from agent.engine.program.parser import parse_atom

    return parse_atom(pattern)


def _matches(pattern: str, fact: tuple) -> bool:
    from agent.engine import RDF_TYPE

    atom = _atom(pattern)
    if atom.arity == 1:
        return fact[0] == RDF_TYPE and fact[2] == atom.predicate
    return fact[0] == atom.predicate and len(fact) - 1 == atom.arity


def test_events_replayed_equal_the_watched_facts_after_every_change(tmp_path, cloud):
    """Readings, bundles bringing rules and watches, a stream superseded, the configuration's
    watches changed at a restart: after each, the outbox replayed from its first event equals
    the watched facts, and the seqs run 1, 2, 3... with their causes."""
    rng = random.Random(52)
    agent = make_agent(tmp_path, cloud, tables=EVENTS)
    assert agent.handle_bundle(cloud.sign(cloud.bundle("base", 1, rules=HOT))).status == "applied"
    warm = cloud.bundle("warm", 1, rules=WARM, watches=["<Warm>(X)"])
    sent = [("base", 1)]
    for step in range(40):
        if step == 10:
            assert agent.handle_bundle(cloud.sign(warm)).status == "applied"
            sent.append(("warm", 1))
        if step == 25:  # the stream is released: its watch goes with its rules
            release = cloud.bundle("warm", 2, delete_rules=["warm"])
            assert agent.handle_bundle(cloud.sign(release)).status == "applied"
            assert "<Warm>(X)" not in agent.state.watches
        readings = [("temp", f"s{i}", rng.choice([15, 25, 35])) for i in range(3)]
        agent.record_readings(readings_payload("t1", "farm1", readings, sent_at=1000.0 + step))
        assert replay(agent) == watched_now(agent), step
    events = pending_events(agent.state.conn, limit=10_000)
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    kinds = {e.cause["kind"] for e in events}
    assert {"readings", "bundle"} <= kinds, kinds
    agent.close()
    agent = make_agent(tmp_path, cloud, tables='[events]\nwatch = ["<Warm>(X)"]\n')
    assert replay(agent) == watched_now(agent)
    assert set(agent.state.watches) == {"<Warm>(X)"}
    agent.close()


def test_the_outbox_is_bounded_and_says_so(tmp_path, cloud):
    agent = make_agent(tmp_path, cloud, tables=EVENTS + "max_pending = 3\n")
    agent.handle_bundle(cloud.sign(cloud.bundle("base", 1, rules=HOT)))
    for step in range(8):
        value = 35 if step % 2 == 0 else 15
        agent.record_readings(
            readings_payload("t1", "farm1", [("temp", "a", value)], 1000.0 + step)
        )
    events = pending_events(agent.state.conn)
    assert [e.seq for e in events] == [1, 2, 3]
    assert agent.status().events == {"pending": 3, "last_seq": 8, "over_budget": 5}
    agent.close()


def test_a_bad_watch_in_a_bundle_refuses_the_bundle(tmp_path, cloud):
    agent = make_agent(tmp_path, cloud)
    bundle = cloud.bundle("base", 1, rules=HOT, watches=["<p>(X"])
    outcome = agent.handle_bundle(cloud.sign(bundle))
    assert outcome.status == "refused" and outcome.reason == "engine"
    assert agent.state.watches == {} and not agent.reasoner.rules
    agent.close()


def test_a_bad_watch_in_the_configuration_is_one_clear_line():
    from agent.config import AgentConfig, ConfigError

    text = 'device = "t1"\nfarm = "f"\n[keys]\ntrusted_keys = "/tmp"\n[events]\nwatch = ["<p>(X"]\n'
    with pytest.raises(ConfigError) as error:
        AgentConfig.loads(text)
    message = str(error.value)
    assert "\n" not in message and "events.watch: not an atom pattern '<p>(X'" in message
