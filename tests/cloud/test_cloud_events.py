"""The cloud keeps the devices' events: a real agent process watching ``<Hot>(X)``, a real
Mosquitto, the publisher serving. Events published while the publisher is away wait for it at
the broker (its persistent session); a copy of an event already kept is not kept again; and
``zodiac-cloud events`` prints them, for one device or all."""

from __future__ import annotations

import sqlite3
import time
from contextlib import closing

import pytest

from agent.protocol.messages import Event, WatchedChange, encode_model
from cloud.bundles import BundleCutter, Target
from cloud.publisher import Publisher
from cloud.zodiac_cloud_cli import main
from tests.support.agent_harness import AgentProcess, Cloud, readings_payload, write_config
from tests.support.broker import TestClient

pytestmark = pytest.mark.process

FARM = "farm1"
STREAMS = {"base": {"hot": "hot: <Hot>(X) :- <temp>(X, T) and COMP(T, >, 50) ."}}


def kept(path) -> list[tuple]:
    with closing(sqlite3.connect(path)) as conn:
        return conn.execute("SELECT device, seq, changes FROM events ORDER BY rowid").fetchall()


def wait_kept(path, count: int, timeout: float = 20) -> list[tuple]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rows = kept(path)
        if len(rows) >= count:
            return rows
        time.sleep(0.1)
    raise AssertionError(f"{count} events never kept: {kept(path)}")


def serving(cloud: Cloud, path, broker) -> Publisher:
    return Publisher(
        FARM,
        BundleCutter(path, FARM),
        STREAMS,
        cloud.private,
        cloud.key_id,
        host=broker.host,
        port=broker.port,
    ).start()


def test_events_are_kept_once_and_shown(tmp_path, make_broker, capsys):
    broker = make_broker()
    cloud = Cloud(tmp_path / "cloud")
    extra = '[events]\nwatch = ["<Hot>(X)"]\n'
    config = write_config(tmp_path / "t1", broker, cloud.keys, extra=extra)
    state = tmp_path / "cloud.db"
    publisher = serving(cloud, state, broker)
    try:
        with AgentProcess(config), TestClient(broker, "sensors") as sensors:
            publisher.wait_status("t1", lambda s: s.online)
            publisher.send("t1", "base", Target(rules=STREAMS["base"]))
            publisher.wait_status("t1", lambda s: s.applied.get("base") == 1)
            now = time.time()
            sensors.publish(
                f"zodiac/{FARM}/t1/readings",
                readings_payload("t1", FARM, [("temp", "t1", 70)], now),
            )
            wait_kept(state, 1)
            publisher.stop()  # away: the next event waits at the broker
            sensors.publish(
                f"zodiac/{FARM}/t1/readings",
                readings_payload("t1", FARM, [("temp", "t1", 20)], now + 1),
            )
            time.sleep(1)
            assert len(kept(state)) == 1
            publisher.cutter.db.conn.close()
            publisher = serving(cloud, state, broker)
            rows = wait_kept(state, 2)
            # A copy of event 1 (a device re-sending after a crash) is not kept again.
            copy = Event(
                device="t1",
                farm=FARM,
                seq=1,
                at=now,
                cause={"kind": "readings"},
                changes=[WatchedChange(watch="<Hot>(X)", appeared=[])],
            )
            sensors.publish(f"zodiac/{FARM}/t1/events", encode_model(copy))
            time.sleep(0.5)
            assert kept(state) == rows
    finally:
        publisher.stop()
    assert [(device, seq) for device, seq, _ in rows] == [("t1", 1), ("t1", 2)]
    capsys.readouterr()
    assert main(["events", "--state", str(state)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2, lines
    assert "farm1/t1 #1 readings" in lines[0] and "+Hot(t1)" in lines[0], lines[0]
    assert "farm1/t1 #2 readings" in lines[1] and "-Hot(t1)" in lines[1], lines[1]
    assert main(["events", "--state", str(state), "--device", "t2"]) == 0
    assert capsys.readouterr().out == ""


def test_events_of_a_missing_state_file_is_one_line(tmp_path, capsys):
    assert main(["events", "--state", str(tmp_path / "none.db")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no publisher state here" in err
