"""examples/controller.py, the turbine controller of the docs, against a real agent: the
readings it publishes arrive in the agent's state, in the format docs/readings.md documents."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from tests.support.agent_harness import (
    REPO,
    AgentProcess,
    Cloud,
    StatusWatcher,
    run_cli,
    write_config,
)
from tests.support.broker import TestClient

pytestmark = pytest.mark.process

CONTROLLER = REPO / "examples" / "controller.py"


def controller(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(CONTROLLER), *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )


def query(config, pattern: str) -> list[dict]:
    result = run_cli("query", "--config", str(config), pattern)
    assert result.returncode == 0, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()]


def wait_query(config, pattern: str, expected: list[dict], timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while (answers := query(config, pattern)) != expected and time.monotonic() < deadline:
        time.sleep(0.2)
    assert answers == expected


def test_readings_from_the_example_controller_reach_the_agents_state(tmp_path, make_broker):
    broker = make_broker()
    cloud = Cloud(tmp_path / "cloud")
    config = write_config(
        tmp_path / "t1",
        broker,
        cloud.keys,
        reasoning='rules = ["hot.rules"]',
    )
    (tmp_path / "t1" / "hot.rules").write_text(
        "hot: <Hot>(X) :- <ambientTemperature>(X, T) and COMP(T, >, 30) .\n"
    )
    address = f"{broker.host}:{broker.port}"
    with AgentProcess(config), TestClient(broker, "operator") as client:
        StatusWatcher(client, "farm1", "t1").wait(lambda s: s.online)
        sent = controller(
            "--broker", address, "--farm", "farm1", "--device", "t1",
            "--reading", "ambientTemperature=21.5", "--reading", "windSpeed=9",
        )  # fmt: skip
        assert sent.returncode == 0, sent.stderr
        assert sent.stdout == "zodiac/farm1/t1/readings: ambientTemperature=21.5, windSpeed=9\n"
        wait_query(config, "<ambientTemperature>(X, T)", [{"X": "t1", "T": 21.5}])
        assert query(config, "<windSpeed>(X, V)") == [{"X": "t1", "V": 9}]
        assert query(config, "<Hot>(X)") == []
        # A stream: each message replaces the sensor's value; a hot one derives Hot.
        stream = controller(
            "--broker", address, "--farm", "farm1", "--device", "t1",
            "--reading", "ambientTemperature=35.0", "--every", "0.2", "--count", "3",
            "--seed", "1",
        )  # fmt: skip
        assert stream.returncode == 0, stream.stderr
        assert len(stream.stdout.splitlines()) == 3
        last = float(stream.stdout.splitlines()[-1].rpartition("=")[2])
        assert 31.5 <= last <= 38.5
        wait_query(config, "<Hot>(X)", [{"X": "t1"}])
        wait_query(config, "<ambientTemperature>(X, T)", [{"X": "t1", "T": last}])


def test_bad_controller_input_is_one_line(tmp_path):
    bad_name = controller("--farm", "f/1", "--device", "t1", "--reading", "a=1")
    assert bad_name.returncode == 2
    assert (
        bad_name.stderr.startswith("controller.py: farm: ") and "Traceback" not in bad_name.stderr
    )
    bad_reading = controller("--farm", "f", "--device", "t1", "--reading", "a")
    assert bad_reading.returncode == 2 and "NAME=VALUE" in bad_reading.stderr
    nobody = controller(
        "--broker", "127.0.0.1:9", "--farm", "f", "--device", "t", "--reading", "a=1"
    )
    assert nobody.returncode == 1 and "cannot reach the broker" in nobody.stderr
