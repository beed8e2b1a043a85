"""Windows in a real ``zodiac-agent run`` process (a private Mosquitto, a real SQLite file, the
real clock): readings published on the device's topic fill the window in their own update, and
the run loop's tick expires them by the agent's clock."""

from __future__ import annotations

import json
import time

import pytest

from tests.support.agent_harness import (
    AgentProcess,
    Cloud,
    StatusWatcher,
    readings_payload,
    run_cli,
    write_config,
)
from tests.support.broker import TestClient

pytestmark = [pytest.mark.process, pytest.mark.slow]
FARM = "farm1"
WINDOW = "@window <temp> 5 s as <recentTemp> ."
RULES = {
    "count": "count: <readingCount>(S, N) :- "
    "aggregate( <recentTemp>(S, V, T) ) on S with count(V) as N ."
}


def query(config, pattern: str) -> list[dict]:
    result = run_cli("query", "--config", str(config), pattern)
    assert result.returncode == 0, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()]


def test_readings_fill_a_window_and_the_tick_empties_it(tmp_path, make_broker):
    cloud = Cloud(tmp_path / "cloud")
    broker = make_broker()
    config = write_config(
        tmp_path / "t1",
        broker,
        cloud.keys,
        extra="[windows]\ntick = 0.2\n",
    )
    with AgentProcess(config) as agent, TestClient(broker, "cloud-1") as client:
        watcher = StatusWatcher(client, FARM, "t1")
        watcher.wait(lambda s: s.online)
        bundle = cloud.bundle("base", 1, rules=RULES, windows=[WINDOW])
        client.publish(f"zodiac/{FARM}/t1/bundle", cloud.sign(bundle))
        watcher.wait(lambda s: s.applied.get("base") == 1)
        for value in (5, 5, 5):  # one value repeated: each reading counts
            payload = readings_payload("t1", FARM, [("temp", "s1", value)], sent_at=time.time())
            client.publish(f"zodiac/{FARM}/t1/readings", payload)
            time.sleep(0.05)
        deadline = time.monotonic() + 10
        while query(config, "<readingCount>(S, N)") != [{"S": "s1", "N": 3}]:
            assert time.monotonic() < deadline, query(config, "<recentTemp>(S, V, T)")
            time.sleep(0.1)
        # Five seconds later the tick has expired them, as one change.
        deadline = time.monotonic() + 10
        while query(config, "<recentTemp>(S, V, T)"):
            assert time.monotonic() < deadline, "the window was not emptied by the tick"
            time.sleep(0.2)
        assert query(config, "<readingCount>(S, N)") == []
        assert agent.terminate() == 0
    windows = json.loads(run_cli("status", "--config", str(config)).stdout)["windows"]
    assert windows == [{"declaration": WINDOW, "sources": ["base"], "facts": 0}]
