"""End to end: a real ``zodiac-agent run`` process, a private Mosquitto, a real SQLite file.

The test plays the cloud: it signs bundles with its own Ed25519 key, publishes them on the
device's bundle topic and reads the device's retained status. Every bad bundle must be refused,
reported in the status and change nothing; the agent must survive a broker restart and receive
what was published while it was away. The agent under the shipped broker configuration (users,
ACL) is tested in tests/agent/test_deploy_broker.py.
"""

from __future__ import annotations

import json
import math
import os
import signal
import time

import msgpack
import pytest

from agent.protocol.messages import RuleRequest, decode_model, decode_status, encode_model
from tests.support.agent_harness import (
    AgentProcess,
    Cloud,
    StatusWatcher,
    last_error,
    readings_payload,
    run_cli,
    write_config,
)
from tests.support.broker import TestClient

FARM = "farm1"
BASE_RULES = {
    "hot": "hot: <Hot>(X) :- <temp>(X, T) and COMP(T, >, 30) .",
    "near": "near: <near>(X, Y) :- <neighbour>(X, Y) .",
    "nsym": "nsym: <near>(X, Y) :- <near>(Y, X) .",
}


def query(config, pattern: str) -> list[dict]:
    result = run_cli("query", "--config", str(config), pattern)
    assert result.returncode == 0, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()]


@pytest.fixture
def cloud(tmp_path):
    return Cloud(tmp_path / "cloud")


def test_signed_bundle_is_applied_acknowledged_and_reported(tmp_path, make_broker, cloud):
    broker = make_broker()
    config = write_config(tmp_path / "t1", broker, cloud.keys)
    with AgentProcess(config) as agent, TestClient(broker, "cloud-1") as client:
        watcher = StatusWatcher(client, FARM, "t1")
        watcher.wait(lambda s: s.online)
        bundle = cloud.bundle(
            "base",
            1,
            rules=BASE_RULES,
            facts=[("temp", "t1", 35), ("temp", "t2", 20), ("neighbour", "t1", "t2")],
        )
        client.publish(f"zodiac/{FARM}/t1/bundle", cloud.sign(bundle))
        status = watcher.wait(lambda s: s.applied.get("base") == 1)
        assert status.rules == 3 and status.explicit_facts == 3 and status.last_error is None
        assert query(config, "<Hot>(X)") == [{"X": "t1"}]
        assert sorted(a["X"] for a in query(config, "<near>(X, Y)")) == ["t1", "t2"]
        # Acknowledged only after commit: a reconnect with the same session gets nothing again.
        agent.wait_log("applied")
        assert agent.terminate() == 0
        offline = watcher.wait(lambda s: not s.online)
        assert offline.applied == {"base": 1}
    summary = json.loads(run_cli("status", "--config", str(config)).stdout)
    assert summary["healthy"] and summary["applied"] == {"base": 1}


def test_bad_bundles_change_nothing_and_are_reported(tmp_path, make_broker, cloud):
    broker = make_broker()
    config = write_config(tmp_path / "t1", broker, cloud.keys)
    topic = f"zodiac/{FARM}/t1/bundle"
    good = cloud.bundle("base", 1, rules=BASE_RULES, facts=[("temp", "t1", 35)])
    signed = cloud.sign(good)
    envelope = msgpack.unpackb(signed)
    tampered = dict(envelope, body=envelope["body"].replace(b"t1", b"t9"))
    stranger = Cloud(tmp_path / "stranger", key_id="stranger")

    def signed_raw(body: object) -> bytes:
        """A genuine signature over a body that is not a valid Bundle."""
        raw = msgpack.packb(body)
        return msgpack.packb({"v": 1, "kid": "cloud", "body": raw, "sig": cloud.private.sign(raw)})

    cases = [
        ("unsigned", encode_model(cloud.bundle("base", 2, facts=[("temp", "x", 1)])), "malformed"),
        ("tampered", msgpack.packb(tampered), "bad_signature"),
        ("unknown key", stranger.sign(cloud.bundle("base", 2)), "unknown_key"),
        ("random bytes", os.urandom(300), "malformed"),
        (
            "oversized",
            cloud.sign(cloud.bundle("base", 2, facts=[("temp", f"t{i}", i) for i in range(3000)])),
            "too_large",
        ),
        ("wrong schema", signed_raw({"bundle_id": "x", "stream": "base"}), "invalid"),
        ("random bytes again", os.urandom(300), "malformed"),
        # (These three escaped as exceptions: an "internal error", acknowledged.)
        # (Each reason differs from the one before: the test waits for it in the status.)
        ("a signed NaN literal", signed_raw(with_fact(good, NAN_LITERAL)), "invalid"),
        ("an envelope version nested 1,000 deep", msgpack.packb(dict(envelope, v=nested(1000))),
         "malformed"),  # fmt: skip
        ("a signed float NaN deleted", signed_raw(with_fact(good, math.nan, "delete_facts")),
         "invalid"),  # fmt: skip
        (
            "bad rule",
            cloud.sign(cloud.bundle("base", 2, rules={"r9": "<p>(X) :- <q>(X) and and ."})),
            "bad_rule",
        ),
        (
            "version gap",
            cloud.sign(cloud.bundle("base", 5, facts=[("temp", "z", 1)])),
            "version_gap",
        ),
        ("expired", cloud.sign(cloud.bundle("base", 2, expires_at=time.time() - 5)), "expired"),
        ("another device's", cloud.sign(cloud.bundle("base", 2, device="t2")), "wrong_audience"),
        ("another farm's", cloud.sign(cloud.bundle("base", 2, farm="farm2")), "wrong_audience"),
        (
            "another stream's rule deleted",
            cloud.sign(cloud.bundle("intruder", 1, delete_rules=sorted(BASE_RULES)[:1])),
            "not_owner",
        ),
        (
            "a 15 kB key id",
            msgpack.packb({"v": 1, "kid": "k" * 15_000, "body": b"x", "sig": bytes(64)}),
            "unknown_key",
        ),
    ]
    with AgentProcess(config) as agent, TestClient(broker, "cloud-1") as client:
        watcher = StatusWatcher(client, FARM, "t1")
        watcher.wait(lambda s: s.online)  # subscribed: a first session has nothing queued
        client.publish(topic, signed)
        watcher.wait(lambda s: s.applied.get("base") == 1)
        before = query(config, "<temp>(X, T)")
        for name, payload, reason in cases:
            client.publish(topic, payload)
            status = watcher.wait(lambda s, r=reason: last_error(s).get("reason") == r)
            assert status.applied == {"base": 1}, name
            assert status.rules == 3 and status.explicit_facts == 1, name
            assert len(encode_model(status)) < 2_000, name  # untrusted input is not echoed whole
        # Replaying the applied bundle is a no-op, not an error.
        client.publish(topic, signed)
        agent.wait_log("duplicate")
        assert query(config, "<temp>(X, T)") == before
        assert agent.terminate() == 0
    refusals = [e for e in agent.log_lines() if e.get("message") == "refused"]
    assert {e["reason"] for e in refusals} == {reason for _, _, reason in cases}
    assert not [e for e in agent.log_lines() if e.get("message") == "internal error"]


NAN_LITERAL = {"lit": "NaN", "dt": "http://www.w3.org/2001/XMLSchema#double", "lang": None}


def nested(depth: int) -> list:
    value: list = []
    for _ in range(depth):
        value = [value]
    return value


def with_fact(bundle, value, op: str = "add_facts") -> dict:
    """``bundle``'s body as a dict, with one more fact operation whose value is ``value``."""
    body = bundle.model_dump(mode="python")
    body["operations"] = [*body["operations"], {"op": op, "facts": [["temp", "t1", value]]}]
    return body


def test_a_bind_of_230_terms_is_applied(tmp_path, make_broker, cloud):
    """Compiled, a sum of 230 terms nested deeper than Python's 200 parentheses: the bundle
    escaped as an internal error (a SyntaxError from the compiler)."""
    broker = make_broker()
    config = write_config(tmp_path / "t1", broker, cloud.keys)
    total = " + ".join(["T"] * 230)
    rules = {"sum": f"sum: <total>(X, Y) :- <temp>(X, T) and bind({total} as Y) ."}
    bundle = cloud.bundle("base", 1, rules=rules, facts=[("temp", "t1", 2)])
    with AgentProcess(config) as agent, TestClient(broker, "cloud-1") as client:
        watcher = StatusWatcher(client, FARM, "t1")
        watcher.wait(lambda s: s.online)
        client.publish(f"zodiac/{FARM}/t1/bundle", cloud.sign(bundle))
        status = watcher.wait(lambda s: s.applied.get("base") == 1)
        assert status.last_error is None
        assert query(config, "<total>(X, Y)") == [{"X": "t1", "Y": 460}]
        assert agent.terminate() == 0


def test_replayed_duplicates_are_counted_not_reported_or_logged_each(
    tmp_path, make_broker, cloud
):
    """A replayed bundle changes nothing: it costs no retained status publish and no info
    line each (before: one of each per replay); the status counts them."""
    broker = make_broker()
    config = write_config(tmp_path / "t1", broker, cloud.keys)
    topic = f"zodiac/{FARM}/t1/bundle"
    replays = 200
    with AgentProcess(config) as agent, TestClient(broker, "cloud-1") as client:
        watcher = StatusWatcher(client, FARM, "t1")
        watcher.wait(lambda s: s.online)
        signed = cloud.sign(cloud.bundle("base", 1, rules=BASE_RULES))
        client.publish(topic, signed)
        watcher.wait(lambda s: s.applied.get("base") == 1)
        for _ in range(replays):
            client.publish(topic, signed)
        client.publish(topic, cloud.sign(cloud.bundle("base", 2, facts=[("temp", "t1", 31)])))
        statuses = []  # every status published from here on, up to version 2's
        while not statuses or statuses[-1].applied.get("base") != 2:
            statuses.append(decode_status(client.expect(watcher.topic, timeout=20).payload))
        assert len(statuses) == 1  # the replays published none
        assert statuses[0].dropped == {"bundle: duplicate": replays}
        lines = [e for e in agent.log_lines() if e.get("message") == "duplicate"]
        assert len(lines) == replays  # the log is at debug level: one each there...
        infos = [e for e in lines if e["level"] == "INFO"]
        assert len(infos) == 1 and infos[0]["duplicates"] == 1  # ... one summary at info
        assert agent.terminate() == 0


def test_broker_restart_and_offline_agent_receive_what_was_missed(tmp_path, make_broker, cloud):
    broker = make_broker()
    config = write_config(tmp_path / "t1", broker, cloud.keys)
    topic = f"zodiac/{FARM}/t1/bundle"
    with AgentProcess(config) as agent:
        with TestClient(broker, "cloud-1") as client:
            watcher = StatusWatcher(client, FARM, "t1")
            watcher.wait(lambda s: s.online)
            client.publish(topic, cloud.sign(cloud.bundle("base", 1, rules=BASE_RULES)))
            watcher.wait(lambda s: s.applied.get("base") == 1)
        broker.restart()  # the agent loses its connection; its session is in the broker's file
        with TestClient(broker, "cloud-2") as client:
            # Published before the agent is back (its back-off is >= 1 s): queued in its session.
            client.publish(topic, cloud.sign(cloud.bundle("base", 2, facts=[("temp", "t1", 31)])))
            watcher = StatusWatcher(client, FARM, "t1")
            watcher.wait(lambda s: s.applied.get("base") == 2, timeout=30)
        agent.wait_log("connected", count=2)
        assert agent.terminate() == 0
    # While the agent process is down, the broker queues bundles for its persistent session.
    with TestClient(broker, "cloud-3") as client:
        client.publish(topic, cloud.sign(cloud.bundle("base", 3, facts=[("temp", "t2", 40)])))
    with AgentProcess(config) as agent, TestClient(broker, "cloud-4") as client:
        watcher = StatusWatcher(client, FARM, "t1")
        watcher.wait(lambda s: s.applied.get("base") == 3 and s.online)
        assert agent.terminate() == 0
    assert sorted(a["X"] for a in query(config, "<Hot>(X)")) == ["t1", "t2"]


def test_rule_request_answer_and_release(tmp_path, make_broker, cloud):
    broker = make_broker()
    reasoning = """
triggers = { "http://ex/Suspect" = "ambient-temperature" }
resolved = ["http://ex/Resolved"]
telemetry_predicates = ["temp"]
neighbours = ["t2"]
"""
    config = write_config(tmp_path / "t1", broker, cloud.keys, reasoning=reasoning)
    base = {
        "suspect": "suspect: <http://ex/Suspect>(X) :- <temp>(X, T) and COMP(T, >, 60) .",
    }
    with (
        AgentProcess(config) as agent,
        TestClient(broker, "cloud-1") as client,
        TestClient(broker, "cloud-req") as requests,
    ):
        requests.subscribe(f"zodiac/{FARM}/t1/request")
        requests.subscribe(f"zodiac/{FARM}/t1/telemetry")
        watcher = StatusWatcher(client, FARM, "t1")
        watcher.wait(lambda s: s.online)
        client.publish(f"zodiac/{FARM}/t1/bundle", cloud.sign(cloud.bundle("base", 1, rules=base)))
        watcher.wait(lambda s: s.applied.get("base") == 1)
        # The device's own reading: implausible -> Suspect derived -> a rule request.
        client.publish(
            f"zodiac/{FARM}/t1/readings", readings_payload("t1", FARM, [("temp", "t1", 70)])
        )
        telemetry = requests.expect(f"zodiac/{FARM}/t1/telemetry")
        message = requests.expect(f"zodiac/{FARM}/t1/request")
        request = decode_model(message.payload, RuleRequest)
        assert request.event == "ambient-temperature" and request.device == "t1"
        assert message.properties.ResponseTopic == f"zodiac/{FARM}/t1/bundle"
        assert message.properties.CorrelationData == request.request_id.encode()
        assert telemetry.payload
        # The cloud answers with the event's rules (neighbour comparison), correlated.
        from paho.mqtt.packettypes import PacketTypes
        from paho.mqtt.properties import Properties

        answer = cloud.bundle(
            "event/t1/ambient-temperature",
            1,
            rules={
                "ok": "ok: <http://ex/Resolved>(X) :- <temp>(X, T) and <temp>(Y, U) and "
                "COMP(X, !=, Y) and bind(abs(T - U) as D) and COMP(D, <, 5) .",
            },
        ).model_copy(update={"answers": request.request_id})  # (signed: what links them)
        props = Properties(PacketTypes.PUBLISH)
        props.CorrelationData = message.properties.CorrelationData
        client.client.publish(
            message.properties.ResponseTopic, cloud.sign(answer), qos=1, properties=props
        )
        status = watcher.wait(lambda s: s.applied.get("event/t1/ambient-temperature") == 1)
        assert status.rules == 2
        # A neighbour's telemetry close to t1's reading derives Resolved: rules released.
        client.publish(
            f"zodiac/{FARM}/t2/telemetry", readings_payload("t2", FARM, [("temp", "t2", 68)])
        )
        status = watcher.wait(lambda s: s.rules == 1)
        assert agent.terminate() == 0
    assert query(config, "<temp>(X, T)") == [{"X": "t1", "T": 70}, {"X": "t2", "T": 68}] or sorted(
        (a["X"], a["T"]) for a in query(config, "<temp>(X, T)")
    ) == [("t1", 70), ("t2", 68)]
    summary = json.loads(run_cli("status", "--config", str(config)).stdout)
    assert summary["open_requests"] == 0


def test_correlation_data_does_not_decide_which_stream_a_release_deletes(
    tmp_path, make_broker, cloud
):
    """MQTT correlation data is not signed: a ``base`` bundle delivered with the correlation
    data of an open rule request was linked to it, and when the event resolved every rule of
    ``base`` was deleted. The request is linked by the signed ``answers`` field only."""
    broker = make_broker()
    reasoning = """
triggers = { "http://ex/Suspect" = "ambient" }
resolved = ["http://ex/Resolved"]
"""
    config = write_config(tmp_path / "t1", broker, cloud.keys, reasoning=reasoning)
    base = {
        "suspect": "suspect: <http://ex/Suspect>(X) :- <temp>(X, T) and COMP(T, >, 60) .",
        "keep": "keep: <http://ex/Kept>(X) :- <temp>(X, T) .",
    }
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.properties import Properties

    with (
        AgentProcess(config) as agent,
        TestClient(broker, "cloud-1") as client,
        TestClient(broker, "cloud-req") as requests,
    ):
        requests.subscribe(f"zodiac/{FARM}/t1/request")
        watcher = StatusWatcher(client, FARM, "t1")
        watcher.wait(lambda s: s.online)
        topic = f"zodiac/{FARM}/t1/bundle"
        client.publish(topic, cloud.sign(cloud.bundle("base", 1, rules=base)))
        watcher.wait(lambda s: s.applied.get("base") == 1)
        client.publish(
            f"zodiac/{FARM}/t1/readings", readings_payload("t1", FARM, [("temp", "t1", 70)])
        )
        message = requests.expect(f"zodiac/{FARM}/t1/request")
        request = decode_model(message.payload, RuleRequest)
        answer = cloud.bundle(
            "event/ambient", 1, rules={"ok": "ok: <http://ex/Resolved>(X) :- <fine>(X) ."}
        ).model_copy(update={"answers": request.request_id})
        client.publish(topic, cloud.sign(answer))
        watcher.wait(lambda s: s.applied.get("event/ambient") == 1)
        # An ordinary base bundle, delivered with the request's correlation data (by anyone
        # who can publish on the path: the data is not part of what the cloud signs).
        props = Properties(PacketTypes.PUBLISH)
        props.CorrelationData = message.properties.CorrelationData
        more = cloud.bundle("base", 2, facts=[("temp", "t2", 20)])
        client.client.publish(topic, cloud.sign(more), qos=1, properties=props)
        watcher.wait(lambda s: s.applied.get("base") == 2)
        client.publish(f"zodiac/{FARM}/t1/readings", readings_payload("t1", FARM, [("fine", "t1")]))
        status = watcher.wait(lambda s: s.rules == 2)  # the event's rule released ...
        assert agent.terminate() == 0
    assert status.applied == {"base": 2, "event/ambient": 1}
    kept = sorted(a["X"] for a in query(config, "<http://ex/Kept>(X)"))
    assert kept == ["t1", "t2"]  # ... and base's rules kept


def test_cli_apply_status_and_errors(tmp_path, make_broker, cloud):
    broker = make_broker()
    config = write_config(tmp_path / "t1", broker, cloud.keys)
    # status before any run: no database yet -> unhealthy, exit 1, nothing created.
    result = run_cli("status", "--config", str(config))
    assert result.returncode == 1 and not json.loads(result.stdout)["healthy"]
    assert not (tmp_path / "t1" / "t1.db").exists()
    bundle_file = tmp_path / "b1.bundle"
    bundle_file.write_bytes(
        cloud.sign(cloud.bundle("base", 1, rules=BASE_RULES, facts=[("temp", "t1", 31)]))
    )
    result = run_cli("apply", "--config", str(config), str(bundle_file))
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["status"] == "applied"
    again = run_cli("apply", "--config", str(config), str(bundle_file))
    assert again.returncode == 0 and json.loads(again.stdout)["status"] == "duplicate"
    bad_file = tmp_path / "bad.bundle"
    bad_file.write_bytes(b"\x00" * 50)
    bad = run_cli("apply", "--config", str(config), str(bad_file))
    assert bad.returncode == 1 and json.loads(bad.stdout)["reason"] == "malformed"
    assert query(config, "<Hot>(X)") == [{"X": "t1"}]
    status = json.loads(run_cli("status", "--config", str(config)).stdout)
    assert status["healthy"] and status["last_error"]["reason"] == "malformed"
    broken = tmp_path / "broken.toml"
    broken.write_text('device = "t 1"\n')
    result = run_cli("status", "--config", str(broken))
    assert result.returncode == 2 and "device" in result.stderr


def test_acknowledged_bundles_are_not_redelivered_and_last_will_marks_offline(
    tmp_path, make_broker, cloud
):
    broker = make_broker()
    config = write_config(tmp_path / "t1", broker, cloud.keys)
    with AgentProcess(config) as agent, TestClient(broker, "cloud-1") as client:
        watcher = StatusWatcher(client, FARM, "t1")
        watcher.wait(lambda s: s.online)
        for version in (1, 2, 3):
            bundle = cloud.bundle("base", version, facts=[("temp", f"t{version}", 40)])
            client.publish(f"zodiac/{FARM}/t1/bundle", cloud.sign(bundle))
        watcher.wait(lambda s: s.applied.get("base") == 3)
        # kill -9: no clean disconnect, so the broker publishes the last will (retained).
        agent.kill()
        assert not watcher.wait(lambda s: not s.online).online
    with AgentProcess(config) as agent, TestClient(broker, "cloud-2") as client:
        watcher = StatusWatcher(client, FARM, "t1")
        watcher.wait(lambda s: s.online and s.applied.get("base") == 3)
        agent.wait_log("connected")
        time.sleep(0.5)
        messages = [e.get("message") for e in agent.log_lines()]
        # Every bundle was acknowledged after its commit: nothing comes back as a duplicate.
        assert "duplicate" not in messages and "applied" not in messages
        assert agent.terminate() == 0


def test_a_reading_dated_a_year_ahead_does_not_freeze_the_sensor(tmp_path, make_broker, cloud):
    broker = make_broker()
    config = write_config(tmp_path / "t1", broker, cloud.keys)
    topic = f"zodiac/{FARM}/t1/readings"
    with AgentProcess(config) as agent, TestClient(broker, "controller") as client:
        watcher = StatusWatcher(client, FARM, "t1")
        watcher.wait(lambda s: s.online)
        year = 365 * 24 * 3600
        ahead = readings_payload("t1", FARM, [("temp", "t1", 99)], time.time() + year)
        client.publish(topic, ahead)
        client.publish(topic, readings_payload("t1", FARM, [("temp", "t1", 21)]))
        deadline = time.monotonic() + 15
        while query(config, "<temp>(X, T)") != [{"X": "t1", "T": 21}]:
            assert time.monotonic() < deadline, query(config, "<temp>(X, T)")
            time.sleep(0.1)
        client.publish(f"zodiac/{FARM}/t1/bundle", cloud.sign(cloud.bundle("base", 1)))
        status = watcher.wait(lambda s: s.applied.get("base") == 1)
        assert status.dropped == {"readings: from the future": 1}
        assert agent.terminate() == 0


def test_the_cloud_key_rotates_on_a_running_agent(tmp_path, make_broker, cloud):
    """The trusted keys were read once at start: a revoked key stayed trusted until a restart,
    and a bundle signed by a newly added key was refused as unknown_key. They follow their
    directory now (and SIGHUP reads them again)."""
    broker = make_broker()
    config = write_config(tmp_path / "t1", broker, cloud.keys)
    new = Cloud(tmp_path / "new-cloud", key_id="cloud-2")
    topic = f"zodiac/{FARM}/t1/bundle"
    with AgentProcess(config) as agent, TestClient(broker, "cloud-1") as client:
        watcher = StatusWatcher(client, FARM, "t1")
        watcher.wait(lambda s: s.online)
        client.publish(topic, cloud.sign(cloud.bundle("base", 1, facts=[("temp", "a", 1)])))
        watcher.wait(lambda s: s.applied.get("base") == 1)
        # 1. The new key is installed beside the old one: bundles it signs are applied.
        (cloud.keys / "cloud-2.pub").write_bytes((new.keys / "cloud-2.pub").read_bytes())
        client.publish(topic, new.sign(new.bundle("base", 2, facts=[("temp", "b", 2)])))
        status = watcher.wait(lambda s: s.applied.get("base") == 2)
        assert status.last_error is None
        # 2. The old key is removed (revoked): bundles it signs are refused.
        (cloud.keys / "cloud.pub").unlink()
        client.publish(topic, cloud.sign(cloud.bundle("base", 3, facts=[("temp", "c", 3)])))
        status = watcher.wait(lambda s: last_error(s).get("reason") == "unknown_key")
        assert status.applied == {"base": 2}
        # 3. SIGHUP reads the keys again on demand.
        agent.process.send_signal(signal.SIGHUP)
        agent.wait_log("trusted keys reloaded (SIGHUP)")
        assert agent.terminate() == 0
