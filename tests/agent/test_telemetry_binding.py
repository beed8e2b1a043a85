"""Telemetry bound to its sender, scoped and bounded; readings kept newest-first (agent/service.py).

A neighbour's telemetry topic is writable by that neighbour only (deploy/mosquitto's ACL), so
the topic names the sender. A message is accepted only from a configured neighbour, claiming to
be that neighbour, with readings about that neighbour (or its sensors) of accepted predicates,
within the size and rate limits and newer than what was applied; everything else is dropped,
counted in the status, and never stored. Readings from the device's own controller keep the
newest value per sensor, so a message redelivered after a crash never undoes newer readings.
"""

from __future__ import annotations

import pytest

from agent.config import AgentConfig
from agent.protocol.messages import Telemetry, encode_fact, encode_model
from agent.service import Agent
from tests.support.agent_harness import Cloud, readings_payload

RESOLVED = "r: <Resolved>(X) :- <hasNeighbour>(X, Y) and <temp>(Y, T) and COMP(T, <, 25) ."


@pytest.fixture
def agent(tmp_path):
    cloud = Cloud(tmp_path / "cloud")
    (tmp_path / "local.rules").write_text(RESOLVED)
    (tmp_path / "farm.nt").write_text(
        "<t1> <hasNeighbour> <t2> .\n<t1> <hasNeighbour> <t3> .\n<t2> <hasSensor> <s2a> .\n"
    )
    text = f"""
device = "t1"
farm = "farm1"
database = "t1.db"
[keys]
trusted_keys = "{cloud.keys}"
[reasoning]
rules = ["local.rules"]
facts = ["farm.nt"]
neighbours = ["t2", "t3"]
telemetry_predicates = ["temp"]
[telemetry]
owner_predicate = "hasSensor"
max_message_bytes = 20000
max_readings = 50
max_messages_per_second = 2.0
"""
    (tmp_path / "agent.toml").write_text(text)
    made = Agent(AgentConfig.load(tmp_path / "agent.toml"))
    yield made
    made.close()


def temps(agent: Agent) -> set:
    return set(agent.reasoner.facts("temp"))


def test_a_neighbour_cannot_speak_for_another_device(agent):
    claims_t3 = readings_payload("t3", "farm1", [("temp", "t3", 10)])
    assert agent.handle_telemetry(claims_t3, sender="t2").status == "unchanged"
    about_t3 = readings_payload("t2", "farm1", [("temp", "t3", 10)])
    assert agent.handle_telemetry(about_t3, sender="t2").status == "unchanged"
    assert temps(agent) == set()
    assert agent.reasoner.query("<Resolved>(X)") == []  # nothing derived from forged readings
    assert agent.status().dropped == {
        "telemetry: sender mismatch": 1,
        "telemetry: subject not the sender's": 1,
    }


def test_only_neighbours_accepted_predicates_and_owned_sensors(agent):
    assert agent.handle_telemetry(readings_payload("t9", "farm1", []), sender="t9").reason == (
        "dropped"
    )
    mixed = readings_payload(
        "t2",
        "farm1",
        [("temp", "t2", 20), ("temp", "s2a", 21), ("temp", "s3a", 22), ("stop", "t2", 1)],
    )
    assert agent.handle_telemetry(mixed, sender="t2").status == "applied"
    assert temps(agent) == {("temp", "t2", 20), ("temp", "s2a", 21)}
    assert agent.reasoner.query("<Resolved>(X)") == [{"X": "t1"}]
    assert agent.status().dropped == {
        "telemetry: not a neighbour": 1,
        "telemetry: subject not the sender's": 1,
        "telemetry: predicate not accepted": 1,
    }


def test_size_and_count_limits_are_checked_before_anything_is_stored(agent, tmp_path):
    huge = readings_payload("t2", "farm1", [("temp", "t2", i) for i in range(5000)])
    assert len(huge) > 20000
    assert agent.handle_telemetry(huge, sender="t2").status == "unchanged"
    many = readings_payload("t2", "farm1", [("temp", f"x{i}", i) for i in range(60)])
    assert len(many) < 20000
    assert agent.handle_telemetry(many, sender="t2").status == "unchanged"
    assert agent.record_readings(huge).status == "unchanged"  # own readings: the same limits
    assert temps(agent) == set() and agent.state.facts_of_source("telemetry/t2") == []
    assert agent.status().dropped == {
        "telemetry: too large": 1,
        "telemetry: too many readings": 1,
        "readings: too large": 1,
    }


def test_each_neighbour_is_rate_limited(agent):
    outcomes = [
        agent.handle_telemetry(
            readings_payload("t2", "farm1", [("temp", "t2", i)], sent_at=1000 + i), sender="t2"
        ).status
        for i in range(10)
    ]
    assert outcomes.count("applied") == 4  # a burst of twice the rate, then refused at once
    assert agent.status().dropped == {"telemetry: over the rate limit": 6}
    # The other neighbour has its own budget.
    other = readings_payload("t3", "farm1", [("temp", "t3", 30)])
    assert agent.handle_telemetry(other, sender="t3").status == "applied"


def test_an_older_snapshot_never_replaces_a_newer_one(agent):
    new = readings_payload("t2", "farm1", [("temp", "t2", 22)], sent_at=2000)
    old = readings_payload("t2", "farm1", [("temp", "t2", 11)], sent_at=1999)
    assert agent.handle_telemetry(new, sender="t2").status == "applied"
    assert agent.handle_telemetry(old, sender="t2").status == "unchanged"
    assert temps(agent) == {("temp", "t2", 22)}
    assert agent.status().dropped == {"telemetry: out of date": 1}


def test_redelivered_readings_do_not_undo_newer_ones_even_after_a_restart(agent, tmp_path):
    batches = [
        readings_payload("t1", "farm1", [("temp", "t1", 20), ("wind", "t1", 5)], sent_at=100),
        readings_payload("t1", "farm1", [("temp", "t1", 21)], sent_at=101),
        readings_payload("t1", "farm1", [("temp", "t1", 22)], sent_at=102),
        readings_payload("t1", "farm1", [("temp", "t1", 22)], sent_at=103),  # unchanged value
    ]
    for payload in batches:
        agent.record_readings(payload)
    agent.close()
    again = Agent(AgentConfig.load(tmp_path / "agent.toml"))
    for payload in batches[:3]:  # the broker redelivers the last three batches
        assert again.record_readings(payload).status == "unchanged"
    late = readings_payload("t1", "farm1", [("temp", "t1", 15), ("wind", "t1", 6)], sent_at=102.5)
    again.record_readings(late)  # wind is newer than its last value, temp is not
    assert set(again.reasoner.facts("temp")) == {("temp", "t1", 22)}
    assert set(again.reasoner.facts("wind")) == {("wind", "t1", 6)}
    again.close()


def test_a_message_naming_another_farm_is_dropped(agent):
    message = Telemetry(
        device="t2", farm="farm9", readings=[encode_fact(("temp", "t2", 1))], sent_at=1.0
    )
    assert agent.handle_telemetry(encode_model(message), sender="t2").status == "unchanged"
    assert agent.status().dropped == {"telemetry: sender mismatch": 1}


YEAR = 365 * 24 * 3600.0


def test_a_reading_from_the_future_is_dropped_and_holds_nothing_back(agent):
    """One reading dated a year ahead made every correct later reading of the sensor be
    dropped as out of date, for a year."""
    now = agent.clock()
    ahead = readings_payload("t1", "farm1", [("temp", "t1", 99)], sent_at=now + YEAR)
    assert agent.record_readings(ahead).status == "unchanged"
    right = readings_payload("t1", "farm1", [("temp", "t1", 21)], sent_at=now)
    assert agent.record_readings(right).status == "applied"
    assert temps(agent) == {("temp", "t1", 21)}
    # A neighbour's snapshot alike; a small skew (within max_clock_skew) is a clock, not a fault.
    ahead = readings_payload("t2", "farm1", [("temp", "t2", 99)], sent_at=now + YEAR)
    assert agent.handle_telemetry(ahead, sender="t2").status == "unchanged"
    slightly = readings_payload("t2", "farm1", [("temp", "t2", 23)], sent_at=now + 30)
    assert agent.handle_telemetry(slightly, sender="t2").status == "applied"
    assert temps(agent) == {("temp", "t1", 21), ("temp", "t2", 23)}
    assert agent.status().dropped == {
        "readings: from the future": 1,
        "telemetry: from the future": 1,
    }


def test_a_clock_stepped_back_does_not_freeze_its_sensors(agent):
    """A controller clock stepped back an hour (an NTP correction) froze its sensors for that
    hour: every reading was older than the last one applied. A redelivery (older by less than
    replay_window) is still dropped."""
    now = agent.clock()
    agent.record_readings(readings_payload("t1", "farm1", [("temp", "t1", 20)], sent_at=now))
    again = readings_payload("t1", "farm1", [("temp", "t1", 18)], sent_at=now - 5)
    assert agent.record_readings(again).status == "unchanged"  # a late redelivery
    stepped = readings_payload("t1", "farm1", [("temp", "t1", 19)], sent_at=now - 3600)
    assert agent.record_readings(stepped).status == "applied"
    later = readings_payload("t1", "farm1", [("temp", "t1", 17)], sent_at=now - 3590)
    assert agent.record_readings(later).status == "applied"  # the stepped clock goes on
    assert temps(agent) == {("temp", "t1", 17)}
    agent.handle_telemetry(readings_payload("t2", "farm1", [("temp", "t2", 30)]), sender="t2")
    old_clock = readings_payload("t2", "farm1", [("temp", "t2", 31)], sent_at=now - 3600)
    assert agent.handle_telemetry(old_clock, sender="t2").status == "applied"
    assert ("temp", "t2", 31) in temps(agent)
    assert agent.status().dropped == {
        "readings: out of date": 1,
        "readings: clock stepped back (applied)": 1,
        "telemetry: clock stepped back (applied)": 1,
    }


def test_refused_telemetry_never_hides_a_bundle_error(tmp_path):
    """A neighbour's message refused (here: over the budget) overwrote the
    persisted ``last_error``: unsigned input could hide a real bundle error (the version gap
    the cloud answers with a full state). It is counted and logged instead."""
    cloud = Cloud(tmp_path / "cloud")
    (tmp_path / "local.rules").write_text("wide: <wide>(X, Y) :- <temp>(X, T) and <big>(Y) .\n")
    (tmp_path / "big.nt").write_text("".join(f"<b{i}> a <big> .\n" for i in range(10)))
    (tmp_path / "agent.toml").write_text(f"""
device = "t1"
farm = "farm1"
database = "t1.db"
[keys]
trusted_keys = "{cloud.keys}"
[reasoning]
rules = ["local.rules"]
facts = ["big.nt"]
neighbours = ["t2"]
telemetry_predicates = ["temp"]
[budget]
max_derived_facts = 5
""")
    agent = Agent(AgentConfig.load(tmp_path / "agent.toml"))
    gap = agent.handle_bundle(cloud.sign(cloud.bundle("base", 3)))
    assert gap.reason == "version_gap"
    error = agent.status().last_error
    snapshot = readings_payload("t2", "farm1", [("temp", "t2", 20)])
    assert agent.handle_telemetry(snapshot, sender="t2").status == "refused"
    assert agent.status().last_error == error
    assert agent.status().dropped == {"telemetry: over the budget": 1}
    agent.close()
    again = Agent(AgentConfig.load(tmp_path / "agent.toml"))
    assert again.status().last_error == error
    again.close()
