"""Metrics and health endpoints of a running agent (agent/observability/, docs/operations.md).

A real ``zodiac-agent run`` process with ``[metrics] listen`` on a free port, a private
Mosquitto, and a real HTTP client (urllib): each metric moves when its cause happens, and
``/readyz`` flips to not ready on a broker outage and on a state found damaged.
"""

from __future__ import annotations

import json
import sqlite3
import time
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.agent_harness import (
    AgentProcess,
    Cloud,
    StatusWatcher,
    readings_payload,
    run_cli,
    write_config,
)
from tests.support.broker import TestClient, free_port

pytestmark = [pytest.mark.process, pytest.mark.slow]

RULES = {"hot": "hot: <Hot>(X) :- <temp>(X, T) and COMP(T, >, 30) ."}


def get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def scrape(base: str) -> dict[tuple[str, tuple], float]:
    """(sample name, sorted labels) -> value, from a real scrape of ``/metrics``."""
    code, body = get(base + "/metrics")
    assert code == 200
    samples = {}
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            samples[sample.name, tuple(sorted(sample.labels.items()))] = sample.value
    return samples


def value(samples, name: str, **labels) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def wait_for(predicate, timeout: float = 20, what: str = "a condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = predicate()
        if found:
            return found
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def ready(base: str) -> tuple[int, dict]:
    code, body = get(base + "/readyz")
    return code, json.loads(body)


@pytest.fixture
def running(tmp_path, make_broker):
    broker = make_broker()
    cloud = Cloud(tmp_path / "cloud")
    config = write_config(
        tmp_path / "agent",
        broker,
        cloud.keys,
        extra=f'[metrics]\nlisten = "127.0.0.1:{free_port()}"\n',  # (status asks it there)
        reasoning='neighbours = ["t2"]\ntelemetry_predicates = ["temp"]',
    )
    with AgentProcess(config) as agent, TestClient(broker, "cloud-1") as client:
        line = agent.wait_log("metrics listening")
        base = line["url"]
        wait_for(lambda: ready(base)[0] == 200, what="ready")
        yield broker, cloud, config, agent, client, base


def test_every_metric_moves_with_its_cause(running):
    broker, cloud, config, agent, client, base = running
    watcher = StatusWatcher(client, "farm1", "t1")
    before = scrape(base)
    assert value(before, "zodiac_agent_broker_connected") == 1
    assert value(before, "zodiac_agent_ready") == 1 and value(before, "zodiac_agent_alive") == 1
    assert value(before, "zodiac_agent_memory_rss_bytes") > 10_000_000
    assert value(before, "zodiac_agent_outbox_bound_events") == 10_000
    assert value(before, "zodiac_agent_last_bundle_timestamp_seconds") == 0

    # A bundle: updates, latency, stream version and rules, facts, derived facts per module.
    sent = time.time()
    bundle = cloud.bundle("base", 1, rules=RULES, facts=[("temp", "a", 35), ("temp", "b", 10)])
    client.publish("zodiac/farm1/t1/bundle", cloud.sign(bundle))
    watcher.wait(lambda s: s.applied.get("base") == 1)
    after = scrape(base)
    assert value(after, "zodiac_agent_updates_total", kind="bundle", outcome="applied") == 1
    assert value(after, "zodiac_agent_update_duration_seconds_count", kind="bundle") == 1
    assert value(after, "zodiac_agent_update_duration_seconds_sum", kind="bundle") > 0
    assert value(after, "zodiac_agent_stream_version", stream="base") == 1
    assert value(after, "zodiac_agent_stream_rules", stream="base") == 1
    assert value(after, "zodiac_agent_relation_facts", relation="temp/2") == 2
    assert value(after, "zodiac_agent_facts") == 3  # two temps and Hot(a)
    assert value(after, "zodiac_agent_explicit_facts") == 2
    assert sum(v for (n, _), v in after.items() if n == "zodiac_agent_derived_facts") == 1
    assert sum(v for (n, _), v in after.items() if n == "zodiac_agent_hyper_nodes") == 1
    assert value(after, "zodiac_agent_memory_bytes_per_fact") > 0
    assert value(after, "zodiac_agent_last_bundle_timestamp_seconds") >= sent - 1

    # A reading: its update, and the time of the newest reading.
    at = time.time()
    client.publish(
        "zodiac/farm1/t1/readings", readings_payload("t1", "farm1", [("temp", "c", 40)], at)
    )
    wait_for(
        lambda: (
            value(scrape(base), "zodiac_agent_updates_total", kind="readings", outcome="applied")
            == 1
        ),
        what="the reading counted",
    )
    now = scrape(base)
    assert value(now, "zodiac_agent_last_reading_timestamp_seconds") == pytest.approx(at)
    assert value(now, "zodiac_agent_relation_facts", relation="temp/2") == 3

    # A refusal by reason (a version gap), and drops by reason (a reading from the future, a
    # malformed telemetry message of a neighbour).
    gap = cloud.bundle("base", 3, facts=[("temp", "d", 1)])
    client.publish("zodiac/farm1/t1/bundle", cloud.sign(gap))
    future = readings_payload("t1", "farm1", [("temp", "c", 41)], time.time() + 10_000)
    client.publish("zodiac/farm1/t1/readings", future)
    client.publish("zodiac/farm1/t2/telemetry", b"not msgpack")
    wait_for(
        lambda: (
            value(scrape(base), "zodiac_agent_updates_total", kind="telemetry", outcome="unchanged")
            == 1
        ),
        what="the telemetry counted",
    )
    last = scrape(base)
    assert value(last, "zodiac_agent_refusals_total", reason="version_gap") == 1
    assert value(last, "zodiac_agent_updates_total", kind="bundle", outcome="refused") == 1
    assert (
        value(last, "zodiac_agent_dropped_messages_total", reason="readings: from the future") == 1
    )
    assert value(last, "zodiac_agent_dropped_messages_total", reason="telemetry: malformed") == 1
    assert value(last, "zodiac_agent_outbox_events") == 0
    assert value(last, "zodiac_agent_events_over_budget_total") == 0

    # The status the cloud receives carries the same verdicts.
    status = watcher.wait(lambda s: s.health is not None)
    assert status.health.alive and status.health.ready and status.health.reasons == []
    code, body = get(base + "/healthz")
    assert code == 200 and json.loads(body) == {"ok": True, "reasons": []}
    assert get(base + "/nosuch")[0] == 404


def test_readiness_flips_on_a_broker_outage_and_on_a_damaged_state(running):
    broker, cloud, config, agent, client, base = running
    bundle = cloud.bundle("base", 1, rules=RULES, facts=[("temp", "a", 35)])
    watcher = StatusWatcher(client, "farm1", "t1")
    client.publish("zodiac/farm1/t1/bundle", cloud.sign(bundle))
    watcher.wait(lambda s: s.applied.get("base") == 1)
    status = run_cli("status", "--config", str(config))
    assert status.returncode == 0, status.stdout
    assert json.loads(status.stdout)["running"]["ready"] is True

    broker.stop()
    code, verdict = wait_for(
        lambda: (found := ready(base))[0] == 503 and found, what="not ready on the outage"
    )
    assert verdict["reasons"] == ["broker: not connected"]
    assert get(base + "/healthz")[0] == 200  # alive: only not ready
    assert value(scrape(base), "zodiac_agent_broker_connected") == 0
    status = run_cli("status", "--config", str(config))
    assert status.returncode == 1
    running_verdict = json.loads(status.stdout)["running"]
    assert running_verdict["ready"] is False and running_verdict["alive"] is True
    assert running_verdict["reasons"] == ["broker: not connected"]

    broker.start()
    wait_for(lambda: ready(base)[0] == 200, timeout=30, what="ready again after the outage")

    # Damage the file behind the agent's back: the next write finds it and refuses it.
    conn = sqlite3.connect(config.parent / "t1.db")
    with conn:
        conn.execute("UPDATE derived SET size = size + 1")
    conn.close()
    with TestClient(broker, "cloud-2") as sender:
        sender.publish(
            "zodiac/farm1/t1/readings", readings_payload("t1", "farm1", [("temp", "b", 50)])
        )
    code, verdict = wait_for(
        lambda: (found := ready(base))[0] == 503 and found, what="not ready on the damage"
    )
    assert len(verdict["reasons"]) == 1 and verdict["reasons"][0].startswith("state: ")
    assert "damaged agent state" in verdict["reasons"][0]
    # The status the cloud receives says so too (retained: the latest one).
    with TestClient(broker, "cloud-3") as reader:
        status = StatusWatcher(reader, "farm1", "t1").wait(
            lambda s: s.health is not None and not s.health.ready
        )
    assert status.health.alive and status.health.reasons[0].startswith("state: ")


def test_a_port_it_cannot_listen_on_stops_the_start_with_one_line(tmp_path, broker):
    import socket

    cloud = Cloud(tmp_path / "cloud")
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    try:
        config = write_config(
            tmp_path / "agent",
            broker,
            cloud.keys,
            extra=f'[metrics]\nlisten = "127.0.0.1:{port}"\n',
        )
        result = run_cli("run", "--config", str(config), timeout=60)
    finally:
        taken.close()
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(f"zodiac-agent: metrics.listen 127.0.0.1:{port}: cannot listen there")


def test_the_outbox_at_its_bound_is_not_ready_until_the_broker_takes_its_events(
    tmp_path, make_broker
):
    """An event written at start (a watch of the configuration) while the broker is away
    fills an outbox of one: not ready for both reasons, the depth in the metrics; once the
    broker is back and has the event, ready again and the outbox empty."""
    broker = make_broker()
    broker.stop()
    cloud = Cloud(tmp_path / "cloud")
    directory = tmp_path / "agent"
    directory.mkdir()
    (directory / "hot.rules").write_text(
        "hot: <http://ex/Hot>(X) :- <http://ex/temp>(X, T) and COMP(T, >, 30) .\n"
    )
    integer = "<http://www.w3.org/2001/XMLSchema#integer>"
    (directory / "facts.nt").write_text(f'<http://ex/a> <http://ex/temp> "35"^^{integer} .\n')
    port = free_port()
    extra = (
        f'[metrics]\nlisten = "127.0.0.1:{port}"\n'
        '[events]\nwatch = ["<http://ex/Hot>(X)"]\nmax_pending = 1\n'
    )
    config = write_config(
        directory,
        broker,
        cloud.keys,
        extra=extra,
        reasoning='rules = ["hot.rules"]\nfacts = ["facts.nt"]',
    )
    base = f"http://127.0.0.1:{port}"
    with AgentProcess(config) as agent:
        agent.wait_log("metrics listening")
        code, verdict = ready(base)
        assert code == 503
        assert verdict["reasons"][0] == "broker: not connected"
        assert verdict["reasons"][1].startswith("events: the outbox holds 1 events, its bound")
        assert value(scrape(base), "zodiac_agent_outbox_events") == 1
        broker.start()
        wait_for(lambda: ready(base)[0] == 200, timeout=30, what="ready once the event went")
        assert value(scrape(base), "zodiac_agent_outbox_events") == 0


def test_an_agent_without_metrics_does_not_import_prometheus_client():
    """Its import costs tens of milliseconds at every start: only ``[metrics] listen`` pays."""
    import subprocess
    import sys

    code = "import sys, agent.cli, agent.sync; print('prometheus_client' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
    )
    assert result.stdout.strip() == "False", result.stderr


def test_an_update_past_its_budget_is_not_ready_and_a_stuck_loop_not_alive():
    """The watchdog's verdicts on a clock of the test's own (agent/observability/health.py):
    the loop's own figures, as the HTTP thread reads them while an update runs."""
    from agent.observability.health import Watchdog, liveness, readiness

    now = [1000.0]
    watchdog = Watchdog(clock=lambda: now[0])

    def verdict():
        return readiness(
            damage=None,
            connected=True,
            watchdog=watchdog,
            budget_seconds=10,
            outbox_pending=0,
            max_pending=5,
        )

    assert verdict().ok and liveness(watchdog, 10).ok
    watchdog.begin("bundle")
    now[0] += 9
    assert verdict().ok  # (within its budget)
    now[0] += 2
    assert not verdict().ok
    assert verdict().reasons == [
        "update: a bundle update has run 11.0 s, past its budget of 10 s "
        "([budget] max_update_seconds)"
    ]
    assert liveness(watchdog, 10).ok  # (alive: at least 30 s, twice the budget)
    now[0] += 20
    assert not liveness(watchdog, 10).ok
    watchdog.end()
    assert verdict().ok and liveness(watchdog, 10).ok
    now[0] += 31  # (a loop that stopped going round, no update running)
    assert liveness(watchdog, 10).reasons == ["the agent's loop has not gone round for 31 s"]
