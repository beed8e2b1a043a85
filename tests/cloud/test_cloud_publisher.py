"""The cloud publisher against a real Mosquitto and a real ``zodiac-agent run`` process:
base bundle -> applied; reading -> rule request -> answered bundle -> applied -> status;
release -> rules gone; a missed version -> gap reported -> full state sent -> recovered.
Then the same through the command line: ``zodiac-cloud publish`` (rules and device facts, sent
once) and ``zodiac-cloud serve`` (request answered, finding reported, stream released, SIGTERM)
as real processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import msgpack
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from agent.engine.language import RDF_TYPE
from agent.protocol.messages import (
    DeviceStatus,
    RuleRequest,
    decode_bundle,
    decode_status,
    encode_model,
    fact_tuple,
)
from cloud.bundles import BundleCutter, Target
from cloud.publisher import Publisher
from tests.support.agent_harness import (
    REPO,
    AgentProcess,
    Cloud,
    StatusWatcher,
    readings_payload,
    write_config,
)
from tests.support.broker import MqttError, TestClient

FARM = "farm1"
STREAMS = {
    "base": {"suspect": "suspect: <Suspect>(X) :- <temp>(X, T) and COMP(T, >, 60) ."},
    "anomaly/ambient-temperature": {
        "hot": "hot: <Hot>(X) :- <temp>(X, T) and COMP(T, >, 50) .",
    },
}


def test_request_answer_release_and_gap_recovery(tmp_path, make_broker):
    broker = make_broker()
    cloud = Cloud(tmp_path / "cloud")
    reasoning = 'triggers = { "Suspect" = "anomaly/ambient-temperature" }'
    config = write_config(tmp_path / "t1", broker, cloud.keys, reasoning=reasoning)
    cutter = BundleCutter(tmp_path / "cutter.db", "farm1")
    event = "anomaly/ambient-temperature"
    publisher = Publisher(
        FARM,
        cutter,
        STREAMS,
        cloud.private,
        cloud.key_id,
        host=broker.host,
        port=broker.port,
        event_streams={event: event},  # the one event devices may request
    ).start()
    try:
        with AgentProcess(config), TestClient(broker, "sensors") as sensors:
            publisher.wait_status("t1", lambda s: s.online)
            base = Target(rules=STREAMS["base"], facts={("site", "t1", "north")})
            publisher.send("t1", "base", base)
            publisher.wait_status("t1", lambda s: s.applied.get("base") == 1)
            reading = readings_payload("t1", FARM, [("temp", "t1", 70)])
            sensors.publish(f"zodiac/{FARM}/t1/readings", reading)
            status = publisher.wait_status(
                "t1", lambda s: s.applied.get("anomaly/ambient-temperature") == 1
            )
            assert status.rules == 2 and status.last_error is None
            assert publisher.requests == [
                ("t1", "anomaly/ambient-temperature", "anomaly/ambient-temperature")
            ]
            publisher.release("t1", "anomaly/ambient-temperature")
            publisher.wait_status("t1", lambda s: s.rules == 1)
            # A version the device never receives: the next one is a gap, which the device
            # reports; the publisher answers with the full state.
            with publisher.lock:
                cutter.cut("t1", "base", Target(rules=STREAMS["base"], facts=set()))
            publisher.send("t1", "base", Target(rules=STREAMS["base"], facts={("site", "t1", "s")}))
            status = publisher.wait_status("t1", lambda s: s.applied.get("base") == 4)
            assert status.explicit_facts == 2  # site(t1, s) and the reading temp(t1, 70)
            # Recovered: the gap no longer holds, and the status no longer says it does.
            assert status.last_error is None
            assert cutter.version("t1", "base") == 4  # one full state for the one gap
    finally:
        publisher.stop()


# ------------------------------------------------------------- one full state per gap
def gap_report(applied: int, refused: int, at: float) -> bytes:
    """The status a device sends when version ``refused`` of ``base`` was a gap, with
    ``applied`` applied, its last error as the agent writes it (agent/service.py)."""
    error = {
        "reason": "version_gap",
        "message": f"version {refused} skips versions: expected version {applied + 1}",
        "bundle_id": f"t1:base:{refused}:x",
        "stream": "base",
        "version": refused,
        "expected_version": applied + 1,
        "at": at,
    }
    status = DeviceStatus(
        device="t1",
        farm=FARM,
        online=True,
        applied={"base": applied},
        rules=1,
        facts=1,
        explicit_facts=1,
        last_error=json.dumps(error),
        updated_at=at,
    )
    return encode_model(status)


def bundles_seen(spy: TestClient, publisher: Publisher) -> list[tuple[int, bool]]:
    """(version, full_state) of every bundle that reached the device's topic so far, once
    what the publisher was doing is done."""
    time.sleep(0.3)
    publisher.flush()
    time.sleep(0.3)
    seen = []
    for message in spy.drain():
        bundle = decode_bundle(msgpack.unpackb(message.payload)["body"])
        seen.append((bundle.version, bundle.full_state))
    return seen


def test_a_gap_gets_one_full_state_however_often_the_device_reports_it(tmp_path, make_broker):
    """The device reports its gap in every status it sends (after each bundle, at each
    reconnection; retained, so every publisher that connects reads it again), while the
    publisher goes on sending. Before, every such status got a new full state, whose version
    the device was then behind of: one full state per status, 25,300 in 180 s."""
    broker = make_broker()
    cloud = Cloud(tmp_path / "cloud")
    state = tmp_path / "cutter.db"
    rules = STREAMS["base"]

    def start(**kwargs) -> Publisher:
        cutter = BundleCutter(state, FARM)
        return Publisher(
            FARM,
            cutter,
            STREAMS,
            cloud.private,
            cloud.key_id,
            host=broker.host,
            port=broker.port,
            **kwargs,
        ).start()

    def target(version: int) -> Target:
        return Target(rules=rules, facts={("site", "t1", f"s{version}")})

    publisher = start()
    topic = f"zodiac/{FARM}/t1/status"
    with TestClient(broker, "t1") as device, TestClient(broker, "t1-spy") as spy:
        spy.subscribe(f"zodiac/{FARM}/t1/bundle")

        def report(applied: int, refused: int) -> None:
            at = time.time()
            device.publish(topic, gap_report(applied, refused, at), retain=True)
            publisher.wait_status("t1", lambda s: s.updated_at == at)

        publisher.send("t1", "base", target(1))
        with publisher.lock:
            publisher.cutter.cut("t1", "base", target(2))  # acknowledged, then lost
        publisher.send("t1", "base", target(3))
        assert bundles_seen(spy, publisher) == [(1, False), (3, False)]
        report(applied=1, refused=3)
        assert bundles_seen(spy, publisher) == [(4, True)]
        # The device applies the full state and each bundle after it, one behind the
        # publisher, and (as a device that never cleared its error) still reports the gap.
        for version in range(5, 10):
            publisher.send("t1", "base", target(version))
            report(applied=version - 1, refused=3)
        assert bundles_seen(spy, publisher) == [(v, False) for v in range(5, 10)]
        report(applied=1, refused=3)  # an old report again (a retained copy): answered already
        assert bundles_seen(spy, publisher) == []
        # A new gap: version 10 lost, 11 refused. One full state, however often reported.
        with publisher.lock:
            publisher.cutter.cut("t1", "base", target(10))
        publisher.send("t1", "base", target(11))
        for _ in range(3):
            report(applied=9, refused=11)
        assert bundles_seen(spy, publisher) == [(11, False), (12, True)]
        # A restarted publisher reads the retained report: the full state it remembers (in
        # the cutter's file) is on its way, so it is not sent again.
        publisher.stop()
        publisher = start()
        publisher.wait_status("t1", lambda s: s.applied == {"base": 9})
        assert bundles_seen(spy, publisher) == []
        publisher.stop()
        # Once a full state is older than the timeout and still not applied, it was lost:
        # sent again, once.
        time.sleep(1.2)
        publisher = start(full_state_timeout=1.0)  # reads the retained report: sent again
        publisher.wait_status("t1", lambda s: s.applied == {"base": 9})
        report(applied=9, refused=11)  # and not once more
        assert bundles_seen(spy, publisher) == [(13, True)]
        publisher.stop()


# ------------------------------------------------------------- the command line, end to end
# ``zodiac-cloud publish`` and ``zodiac-cloud serve`` (cloud/publisher_cli.py) as real
# processes, against the same private broker and real agent process.
# ``zodiac-cloud`` as the module the console script runs, from this checkout (cwd = REPO): the
# console script of the virtual environment imports the package it was installed from.
ZODIAC_CLOUD = [sys.executable, "-m", "cloud.zodiac_cloud_cli"]
BASE_RULES = """
s: <Suspect>(X) :- <temp>(X, T) and COMP(T, >, 60) .
n: <Near>(X, Y) :- <hasNeighbour>(X, Y) .
"""
ANOMALY_RULES = "f: <Broken>(X) :- <Suspect>(X) and <temp>(X, T) and COMP(T, >, 65) .\n"
FARM_FACTS = """<t1> <hasNeighbour> <t2> .
<t1> <site> "north" .
<t2> <site> "south" .
<t3> <site> "east" .
"""


def rules_dir(directory: Path, *, anomaly: bool = False) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "base.rules").write_text(BASE_RULES)
    if anomaly:
        (directory / "anomaly").mkdir(exist_ok=True)
        (directory / "anomaly" / "ambient-temperature.rules").write_text(ANOMALY_RULES)
    return directory


def cloud_command(command: str, broker, rules: Path, key: Path, state: Path, *args: str):
    """``zodiac-cloud COMMAND`` for farm1 on ``broker`` (a Broker or ``HOST:PORT``)."""
    address = broker if isinstance(broker, str) else f"{broker.host}:{broker.port}"
    return [
        *ZODIAC_CLOUD,
        command,
        "--farm",
        FARM,
        "--rules-dir",
        str(rules),
        "--key",
        str(key),
        "--broker",
        address,
        "--state",
        str(state),
        *args,
    ]


def run_cloud(*command: str, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=REPO)


def test_publish_command_sends_rules_and_device_facts_once(tmp_path, make_broker):
    broker = make_broker()
    cloud = Cloud(tmp_path / "cloud")
    key = tmp_path / "cloud" / f"{cloud.key_id}.key"
    rules = rules_dir(tmp_path / "rules")
    facts = tmp_path / "farm.nt"
    facts.write_text(FARM_FACTS)
    state = tmp_path / "cloud.db"
    config = write_config(tmp_path / "t1", broker, cloud.keys)
    publish = cloud_command(
        "publish",
        broker,
        rules,
        key,
        state,
        "--devices",
        "t1",
        "--facts",
        str(facts),
        "--neighbour-predicate",
        "hasNeighbour",
    )
    with (
        AgentProcess(config),
        TestClient(broker, "watcher") as client,
        TestClient(broker, "spy") as spy,
    ):
        watcher = StatusWatcher(client, FARM, "t1")
        watcher.wait(lambda s: s.online)
        spy.subscribe(f"zodiac/{FARM}/t1/bundle")
        result = run_cloud(*publish)
        assert result.returncode == 0, result.stderr
        # The facts about t1 and its neighbour t2, not about t3.
        assert result.stdout.splitlines() == [
            "t1: base version 1 (2 rules, 3 facts)",
            "t1: applied base version 1",  # (publish waits for the device's answer)
        ]
        status = watcher.wait(lambda s: s.applied.get("base") == 1)
        assert status.rules == 2 and status.explicit_facts == 3
        assert status.facts == 4  # and Near(t1, t2)
        assert status.last_error is None
        spy.expect(f"zodiac/{FARM}/t1/bundle")

        again = run_cloud(*publish)
        assert again.returncode == 0, again.stderr
        assert again.stdout.splitlines() == [
            "t1: base unchanged (2 rules, 3 facts)",
            "t1: applied base version 1",  # (the device's retained status says so)
        ]
        # Nothing sent: no bundle reaches the device's topic, the version stays 1.
        with pytest.raises(MqttError):
            spy.expect(timeout=1)
        assert BundleCutter(state, "farm1").version("t1", "base") == 1


def test_serve_command_answers_requests_and_releases_on_finding(tmp_path, make_broker):
    broker = make_broker()
    cloud = Cloud(tmp_path / "cloud")
    key = tmp_path / "cloud" / f"{cloud.key_id}.key"
    rules = rules_dir(tmp_path / "rules", anomaly=True)
    state = tmp_path / "cloud.db"
    reasoning = 'triggers = { "Suspect" = "anomaly/ambient-temperature" }\nfindings = ["Broken"]'
    config = write_config(tmp_path / "t1", broker, cloud.keys, reasoning=reasoning)
    stream = "anomaly/ambient-temperature"
    serve_log = tmp_path / "serve.log"
    with serve_log.open("wb") as handle:
        serve = subprocess.Popen(
            cloud_command("serve", broker, rules, key, state, "--resolve", f"{stream}=Broken"),
            stdout=handle,
            stderr=subprocess.STDOUT,
            cwd=REPO,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    try:
        with AgentProcess(config), TestClient(broker, "sensors") as client:
            watcher = StatusWatcher(client, FARM, "t1")
            watcher.wait(lambda s: s.online)
            result = run_cloud(
                *cloud_command("publish", broker, rules, key, state, "--devices", "t1")
            )
            assert result.returncode == 0, result.stderr
            assert result.stdout.splitlines() == [
                "t1: base version 1 (2 rules, 0 facts)",
                "t1: applied base version 1",
            ]
            watcher.wait(lambda s: s.applied.get("base") == 1 and s.rules == 2)

            client.publish(
                f"zodiac/{FARM}/t1/readings", readings_payload("t1", FARM, [("temp", "t1", 70)])
            )
            # Suspect(t1) -> request -> serve answers (v1) -> Broken(t1) reported as a finding.
            found = watcher.wait(lambda s: s.applied.get(stream) == 1 and s.findings)
            assert found.rules == 3
            assert [fact_tuple(f) for f in found.findings] == [(RDF_TYPE, "t1", "Broken")]
            # The finding settles the stream: serve releases it (v2), the device is back to
            # its base rules and the finding is gone.
            released = watcher.wait(lambda s: s.applied.get(stream) == 2)
            assert released.rules == 2 and released.findings == []
            assert released.applied.get("base") == 1 and released.last_error is None
        assert serve.poll() is None, serve_log.read_text()
        serve.send_signal(signal.SIGTERM)
        assert serve.wait(5) == 0, serve_log.read_text()
    finally:
        if serve.poll() is None:
            serve.kill()
            serve.wait(10)
    log = serve_log.read_text()
    assert f"serving farm {FARM}: streams {stream}, base" in log
    assert f"answered t1's request for {stream} with {stream} v1" in log
    assert f"releasing {stream}" in log
    assert "Traceback" not in log


@pytest.mark.process
def test_serve_command_rejects_a_malformed_resolution(tmp_path):
    cloud = Cloud(tmp_path / "cloud")
    key = tmp_path / "cloud" / f"{cloud.key_id}.key"
    rules = rules_dir(tmp_path / "rules")
    # No broker needed: the argument is refused before anything connects.
    command = cloud_command("serve", "127.0.0.1:1", rules, key, tmp_path / "cloud.db")
    result = run_cloud(*command, "--resolve", "nonsense", timeout=15)
    assert result.returncode == 2
    assert "--resolve" in result.stderr and "STREAM=PREDICATE" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "cloud.db").exists()


def test_a_farm_wide_gap_gets_the_farm_wide_full_state(tmp_path, make_broker):
    """A gap on ``all:base`` is about the farm-wide stream: its full state goes to the farm's
    topic (before, the device was sent a full state of its own ``base``)."""
    broker = make_broker()
    cloud = Cloud(tmp_path / "cloud")
    cutter = BundleCutter(tmp_path / "cutter.db", FARM)
    publisher = Publisher(
        FARM, cutter, STREAMS, cloud.private, cloud.key_id, host=broker.host, port=broker.port
    ).start()
    try:
        with TestClient(broker, "t1") as device, TestClient(broker, "spy") as spy:
            spy.subscribe(f"zodiac/{FARM}/+/bundle")
            publisher.send("t1", "base", Target(rules=STREAMS["base"]))
            farm = Target(rules=STREAMS["base"], facts={("limit", "all", 80)})
            publisher.send("all", "base", farm)
            with publisher.lock:
                cutter.cut("all", "base", Target(rules=STREAMS["base"]))  # lost
            publisher.send("all", "base", farm)
            assert bundles_seen(spy, publisher) == [(1, False), (1, False), (3, False)]
            error = json.loads(decode_status(gap_report(1, 3, time.time())).last_error)
            error["stream"] = "all:base"
            status = DeviceStatus(
                device="t1",
                farm=FARM,
                online=True,
                applied={"base": 1, "all:base": 1},
                rules=1,
                facts=1,
                explicit_facts=1,
                last_error=json.dumps(error),
                updated_at=time.time(),
            )
            device.publish(f"zodiac/{FARM}/t1/status", encode_model(status), retain=True)
            publisher.wait_status("t1", lambda s: s.applied.get("all:base") == 1)
            time.sleep(0.3)
            publisher.flush()
            [message] = spy.drain() or [spy.expect()]
            assert message.topic == f"zodiac/{FARM}/all/bundle"
            full = decode_bundle(msgpack.unpackb(message.payload)["body"])
            assert (full.device, full.version, full.full_state) == ("all", 4, True)
            assert cutter.last_full_state("t1", "base") is None
    finally:
        publisher.stop()


# ------------------------------------------------------------- rule requests, bounded
def test_repeated_and_unanswerable_requests_cut_no_new_versions(tmp_path, make_broker):
    """Before, every repeat of a request got a new signed full state (500 requests, 503
    bundles) and any device could request any stream (``base``). Now a repeat cuts nothing
    while the answer is on its way or held, only configured events are answered, and a device
    gets at most MAX_REQUESTS_PER_MINUTE answers a minute."""
    broker = make_broker()
    cloud = Cloud(tmp_path / "cloud")
    cutter = BundleCutter(tmp_path / "cutter.db", FARM)
    stream = "anomaly/ambient-temperature"
    publisher = Publisher(
        FARM,
        cutter,
        STREAMS,
        cloud.private,
        cloud.key_id,
        host=broker.host,
        port=broker.port,
        resolutions={stream: ["Broken"]},  # the streams it releases are the answerable events
    ).start()
    try:
        with TestClient(broker, "devices") as devices, TestClient(broker, "spy") as spy:
            spy.subscribe(f"zodiac/{FARM}/+/bundle")

            def ask(device: str, event: str, times: int = 1) -> None:
                for _ in range(times):
                    request = RuleRequest(
                        request_id=uuid.uuid4().hex,
                        device=device,
                        farm=FARM,
                        event=event,
                        facts=[],
                        issued_at=time.time(),
                    )
                    props = Properties(PacketTypes.PUBLISH)
                    props.CorrelationData = request.request_id.encode()
                    devices.publish(
                        f"zodiac/{FARM}/{device}/request", encode_model(request), properties=props
                    )

            def answered(device: str) -> int:
                return sum(1 for d, _, _ in publisher.requests if d == device)

            ask("t1", stream)
            ask("t1", stream, times=4)  # asked again at once: the answer is on its way
            status = DeviceStatus(
                device="t1",
                farm=FARM,
                online=True,
                applied={stream: 1},
                rules=1,
                facts=0,
                explicit_facts=0,
                updated_at=time.time(),
            )
            devices.publish(f"zodiac/{FARM}/t1/status", encode_model(status), retain=True)
            publisher.wait_status("t1", lambda s: s.applied.get(stream) == 1)
            ask("t1", stream)  # held already
            ask("t1", stream, times=20)  # over the rate limit
            ask("t2", "base")  # not an event: base is never answered on request
            ask("t2", stream)  # another device has its own rate
            deadline = time.monotonic() + 10
            while answered("t2") < 1 and time.monotonic() < deadline:
                time.sleep(0.05)
            seen = [
                (message.topic.split("/")[2], bundle.stream, bundle.version)
                for message in (spy.drain() or [])
                for bundle in [decode_bundle(msgpack.unpackb(message.payload)["body"])]
            ]
            time.sleep(0.3)
            seen += [
                (message.topic.split("/")[2], bundle.stream, bundle.version)
                for message in spy.drain()
                for bundle in [decode_bundle(msgpack.unpackb(message.payload)["body"])]
            ]
            assert seen == [("t1", stream, 1), ("t2", stream, 1)]
            assert cutter.version("t1", stream) == 1 and cutter.version("t2", "base") == 0
            assert dict(publisher.request_outcomes) == {
                ("t1", "answered"): 1,
                ("t1", "on its way"): 4,
                ("t1", "held already"): 1,
                ("t1", "over the rate limit"): 20,
                ("t2", "not an answerable event"): 1,
                ("t2", "answered"): 1,
            }
    finally:
        publisher.stop()
