"""The cloud publisher against a real Mosquitto and a real ``zodiac-agent run`` process:
base bundle -> applied; reading -> rule request -> answered bundle -> applied -> status;
release -> rules gone; a missed version -> gap reported -> full state sent -> recovered.
Then the same through the command line: ``zodiac-cloud publish`` (rules and device facts, sent
once) and ``zodiac-cloud serve`` (request answered, finding reported, stream released, SIGTERM)
as real processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from agent.engine.language import RDF_TYPE
from agent.messages import fact_tuple
from cloud.bundles import BundleCutter, Target
from cloud.publisher import Publisher
from tests.agent_harness import (
    REPO,
    AgentProcess,
    Cloud,
    StatusWatcher,
    readings_payload,
    write_config,
)
from tests.broker import MqttError, TestClient

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
    publisher = Publisher(
        FARM, cutter, STREAMS, cloud.private, cloud.key_id, host=broker.host, port=broker.port
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
    finally:
        publisher.stop()


# ------------------------------------------------------------- the command line, end to end
# ``zodiac-cloud publish`` and ``zodiac-cloud serve`` (cloud/publisher_cli.py) as real
# processes, against the same private broker and real agent process.
ZODIAC_CLOUD = Path(sys.executable).with_name("zodiac-cloud")
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
        str(ZODIAC_CLOUD),
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
        assert result.stdout.splitlines() == ["t1: base version 1 (2 rules, 3 facts)"]
        status = watcher.wait(lambda s: s.applied.get("base") == 1)
        assert status.rules == 2 and status.explicit_facts == 3
        assert status.facts == 4  # and Near(t1, t2)
        assert status.last_error is None
        spy.expect(f"zodiac/{FARM}/t1/bundle")

        again = run_cloud(*publish)
        assert again.returncode == 0, again.stderr
        assert again.stdout.splitlines() == ["t1: base unchanged (2 rules, 3 facts)"]
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
            assert result.stdout.splitlines() == ["t1: base version 1 (2 rules, 0 facts)"]
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
