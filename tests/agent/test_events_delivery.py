"""Events over MQTT, against a real Mosquitto and real agent processes: a stream of readings
turns a watched diagnosis on and off while the agent is killed with SIGKILL at random points
and the broker is restarted. A consumer with a persistent session must see every seq from 1 to
the last, the first copy of each in order, a duplicate only with its seq's content, and the
events replayed equal the watched facts the agent holds at the end.
"""

from __future__ import annotations

import random
import sqlite3
import time
from contextlib import closing

import pytest

from agent.protocol.messages import decode_event, fact_tuple
from agent.state.agent_state import AgentState
from tests.support.agent_harness import AgentProcess, Cloud, readings_payload, write_config
from tests.support.broker import TestClient

pytestmark = pytest.mark.process

HOT = {"hot": "hot: <Hot>(X) :- <temp>(X, T) and COMP(T, >, 30) ."}
EXTRA = '[events]\nwatch = ["<Hot>(X)"]\n'
READINGS = 60


def outbox(database) -> tuple[int, int, float]:
    """(events pending, last seq, newest reading applied) as the agent's file says."""
    with closing(sqlite3.connect(database)) as conn:
        (pending,) = conn.execute("SELECT count(*) FROM outbox").fetchone()
        row = conn.execute("SELECT value FROM meta WHERE key = 'event_seq'").fetchone()
        (newest,) = conn.execute("SELECT max(at) FROM reading_times").fetchone()
    return pending, int(row[0]) if row else 0, newest or 0.0


def rules_held(database) -> bool:
    if not database.exists():
        return False
    with closing(sqlite3.connect(database)) as conn:
        try:
            return conn.execute("SELECT count(*) FROM rules").fetchone()[0] > 0
        except sqlite3.OperationalError:  # (the file is being created)
            return False


def received(sink: TestClient) -> list:
    return [decode_event(message.payload) for message in sink.drain()]


def test_events_survive_kill_9_and_a_broker_restart(tmp_path, make_broker):
    rng = random.Random(52)
    broker = make_broker()
    cloud = Cloud(tmp_path / "cloud")
    config = write_config(tmp_path / "t1", broker, cloud.keys, extra=EXTRA)
    database = tmp_path / "t1" / "t1.db"
    topic = "zodiac/farm1/t1/events"
    sink = TestClient(broker, "events-sink", clean_start=False, session_expiry=3600)
    sender = TestClient(broker, "controller")
    events = []
    with sink, sender:
        sink.subscribe(topic)
        agent = AgentProcess(config).start()
        try:
            agent.wait_log("connected")
            # (sent again until applied: the first copy may reach the broker before the
            # agent's first SUBSCRIBE; a copy after it is a duplicate, ignored)
            bundle = cloud.sign(cloud.bundle("base", 1, rules=HOT))
            deadline = time.monotonic() + 30
            while not rules_held(database):
                assert time.monotonic() < deadline, "the bundle was never applied"
                sender.publish("zodiac/farm1/t1/bundle", bundle)
                time.sleep(1)
            base = time.time() - 600
            kills = sorted(rng.sample(range(5, READINGS - 5), 3))
            for i in range(READINGS):
                value = rng.choice([25, 35])
                sensor = f"s{rng.randrange(3)}"
                payload = readings_payload("t1", "farm1", [("temp", sensor, value)], base + i)
                sender.publish("zodiac/farm1/t1/readings", payload)
                if i in kills:
                    time.sleep(rng.uniform(0.0, 0.3))
                    agent.kill()  # SIGKILL, wherever it is
                    agent.start()
                if i == READINGS // 2:
                    events += received(sink)
                    broker.restart()
                    time.sleep(1.5)  # (every client reconnects by itself)
            agent.wait_log("connected")
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                pending, last, newest = outbox(database)
                done = newest == base + READINGS - 1 and pending == 0
                if done and {e.seq for e in events} >= set(range(1, last + 1)):
                    break
                events += received(sink)
                time.sleep(0.2)
            assert agent.terminate() == 0
        finally:
            agent.kill()
    events += received(sink)
    pending, last, _ = outbox(database)
    assert pending == 0 and last > 5, (pending, last)
    firsts: list[int] = []
    by_seq = {}
    for event in events:
        if event.seq in by_seq:  # a duplicate: the same event
            assert by_seq[event.seq] == event, event.seq
            continue
        by_seq[event.seq] = event
        firsts.append(event.seq)
    assert firsts == list(range(1, last + 1)), firsts  # none lost, none reordered
    print(f"{last} events, {len(events) - last} duplicates")
    watched: set = set()
    for seq in firsts:
        for change in by_seq[seq].changes:
            watched -= {fact_tuple(f) for f in change.disappeared}
            watched |= {fact_tuple(f) for f in change.appeared}
    with AgentState(database) as state:
        assert watched == set(state.reasoner.facts_named("Hot"))
