"""``zodiac-cloud serve --metrics-listen``: the cloud service's metrics and health endpoints,
scraped with a real HTTP client while a real agent and a private Mosquitto run."""

from __future__ import annotations

import os
import signal
import subprocess

import pytest

from tests.agent.test_metrics import get, ready, scrape, value, wait_for
from tests.cloud.test_cloud_publisher import FARM, REPO, cloud_command, rules_dir, run_cloud
from tests.support.agent_harness import (
    AgentProcess,
    Cloud,
    StatusWatcher,
    readings_payload,
    write_config,
)
from tests.support.broker import TestClient, free_port

pytestmark = [pytest.mark.process, pytest.mark.slow]


def test_serve_metrics_move_with_statuses_requests_bundles_and_refusals(tmp_path, make_broker):
    broker = make_broker()
    cloud = Cloud(tmp_path / "cloud")
    key = tmp_path / "cloud" / f"{cloud.key_id}.key"
    rules = rules_dir(tmp_path / "rules", anomaly=True)
    state = tmp_path / "cloud.db"
    reasoning = 'triggers = { "Suspect" = "anomaly/ambient-temperature" }'
    config = write_config(tmp_path / "t1", broker, cloud.keys, reasoning=reasoning)
    stream = "anomaly/ambient-temperature"
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    serve_log = tmp_path / "serve.log"
    command = cloud_command(
        "serve",
        broker,
        rules,
        key,
        state,
        "--answer",
        stream,
        "--metrics-listen",
        f"127.0.0.1:{port}",
    )
    with serve_log.open("wb") as handle:
        serve = subprocess.Popen(
            command,
            stdout=handle,
            stderr=subprocess.STDOUT,
            cwd=REPO,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    try:
        wait_for(lambda: get(base + "/healthz")[0] == 200 if _up(base) else False, what="serve up")
        wait_for(lambda: ready(base)[0] == 200, what="serve ready")
        with AgentProcess(config), TestClient(broker, "sensors") as client:
            watcher = StatusWatcher(client, FARM, "t1")
            watcher.wait(lambda s: s.online)
            wait_for(
                lambda: value(scrape(base), "zodiac_cloud_devices_seen") == 1, what="a device seen"
            )
            result = run_cloud(
                *cloud_command("publish", broker, rules, key, state, "--devices", "t1")
            )
            assert result.returncode == 0, result.stderr
            client.publish(
                f"zodiac/{FARM}/t1/readings", readings_payload("t1", FARM, [("temp", "t1", 70)])
            )
            watcher.wait(lambda s: s.applied.get(stream) == 1)
            samples = scrape(base)
            assert value(samples, "zodiac_cloud_bundles_published_total") == 1  # the answer
            assert (
                sum(v for (n, _), v in samples.items() if n == "zodiac_cloud_requests_total") == 1
            )
            assert value(samples, "zodiac_cloud_statuses_received_total") >= 2
            assert value(samples, "zodiac_cloud_devices_online") == 1
            assert value(samples, "zodiac_cloud_devices_not_ready") == 0
            assert value(samples, "zodiac_cloud_broker_connected") == 1
            # A device's refusal, reported in its status, counted by reason once.
            gap = cloud.bundle("base", 5, facts=[("temp", "x", 1)])
            client.publish(f"zodiac/{FARM}/t1/bundle", cloud.sign(gap))
            wait_for(
                lambda: (
                    value(scrape(base), "zodiac_cloud_device_refusals_total", reason="version_gap")
                    == 1
                ),
                what="the refusal counted",
            )
        broker.stop()
        code, verdict = wait_for(
            lambda: (found := ready(base))[0] == 503 and found, what="serve not ready"
        )
        assert verdict["reasons"] == ["broker: not connected"]
        serve.send_signal(signal.SIGTERM)
        assert serve.wait(10) == 0, serve_log.read_text()
    finally:
        if serve.poll() is None:
            serve.kill()
            serve.wait(10)
    log = serve_log.read_text()
    assert f"metrics on http://127.0.0.1:{port}" in log
    assert "Traceback" not in log


def _up(base: str) -> bool:
    try:
        get(base + "/healthz")
        return True
    except OSError:
        return False


def test_serve_refuses_a_bad_metrics_listen_in_one_line(tmp_path):
    rules = rules_dir(tmp_path / "rules")
    result = run_cloud(
        *cloud_command(
            "serve",
            "127.0.0.1:1",
            rules,
            tmp_path / "k.key",
            tmp_path / "s.db",
            "--metrics-listen",
            "nowhere",
        )
    )
    assert result.returncode == 2
    assert "--metrics-listen" in result.stderr and "is not HOST:PORT" in result.stderr
    assert "Traceback" not in result.stderr
