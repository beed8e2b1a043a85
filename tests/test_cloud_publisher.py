"""The cloud publisher against a real Mosquitto and a real ``zodiac-agent run`` process:
base bundle -> applied; reading -> rule request -> answered bundle -> applied -> status;
release -> rules gone; a missed version -> gap reported -> full state sent -> recovered."""

from __future__ import annotations

from cloud.bundles import BundleCutter, Target
from cloud.publisher import Publisher
from tests.agent_harness import AgentProcess, Cloud, readings_payload, write_config
from tests.broker import TestClient

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
    cutter = BundleCutter(tmp_path / "cutter.db")
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
