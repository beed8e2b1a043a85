"""The wind-farm simulation's farm panel and canary roll-out fault.

The panel's arithmetic on the agent's own metrics (rendered by the agent's real registry and
read back with prometheus_client's parser): the histogram quantile lands in the bucket holding
the true quantile, counters restarted by a killed agent count from zero. Then a short run of
five real agents: the panel is filled from their scraped ``/metrics`` (at least the readings
the harness sent each of them), and the over-budget bundle rolled out with ``zodiac-cloud
publish --canary 2`` stops at the canaries: refused there (``budget_exceeded``), never sent to
the others, and no agent's SQLite state holds any of it.
"""

from __future__ import annotations

import math
import socket

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from agent.observability.metrics import UPDATE_BUCKETS, UpdateMetrics, render
from agent.state.agent_state import AgentState
from simulations.windfarm.panel import (
    PORTS_FROM,
    DeviceMetrics,
    Scrape,
    build_panel,
    ephemeral_low,
    free_ports,
    histogram_quantile,
    parse_metrics,
)
from simulations.windfarm.rollout_fault import CANARIES, STREAM


def _agent_metrics(durations: list[float], kind: str = "readings") -> DeviceMetrics:
    registry = CollectorRegistry()
    metrics = UpdateMetrics(registry)
    for seconds in durations:
        metrics.observe(kind, "applied", "", seconds)
    return parse_metrics(render(registry).decode(), at=0.0)


@given(
    st.lists(st.floats(min_value=0.0, max_value=70.0), min_size=1, max_size=200),
    st.sampled_from([0.5, 0.9, 0.99]),
)
def test_the_quantile_lies_in_the_bucket_of_the_true_quantile(durations, q):
    metrics = _agent_metrics(durations)
    assert metrics.update_count == len(durations)
    got = histogram_quantile(q, metrics.buckets)
    true = sorted(durations)[max(0, math.ceil(q * len(durations)) - 1)]
    bounds = [0.0, *UPDATE_BUCKETS, math.inf]
    upper = next(b for b in bounds[1:] if true <= b)
    lower = bounds[bounds.index(upper) - 1]
    if math.isinf(upper):
        assert got == lower  # Prometheus: the +Inf bucket's lower bound
    else:
        assert lower <= got <= upper


def test_no_observations_no_quantile():
    assert histogram_quantile(0.5, _agent_metrics([]).buckets) is None


def test_the_panel_takes_deltas_and_a_restarted_agents_counters_from_zero():
    before = {"wt001": _agent_metrics([0.002] * 10), "wt002": _agent_metrics([0.002] * 50)}
    after = {"wt001": _agent_metrics([0.002] * 30), "wt002": _agent_metrics([0.2] * 5)}
    for m in before.values():
        m.at = 100.0
    for m in after.values():
        m.at = 110.0
        m.rss, m.facts = 4e6, 100
    after["wt003"] = DeviceMetrics(110.0, error="URLError: refused")
    panel = build_panel(
        Scrape(100.0, 0.1, before), Scrape(110.0, 0.1, after), {"wt001": 2, "wt002": 2}
    )
    rows = {row.device: row for row in panel.rows}
    assert rows["wt001"].updates == 20 and rows["wt001"].updates_per_second == 2.0
    assert rows["wt002"].updates == 5  # restarted: 5 since the restart, not 5 - 50
    assert 0.1 <= rows["wt002"].p99 <= 0.25 and rows["wt001"].p99 <= 0.0025
    assert rows["wt001"].rss_share == 2e6
    assert set(panel.missing) == {"wt003"} and panel.total_updates == 25


def test_free_ports_are_distinct_bindable_and_never_ephemeral():
    ports = free_ports(50)
    assert len(set(ports)) == 50
    assert all(PORTS_FROM <= p < ephemeral_low() for p in ports)
    for port in ports[:5]:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


@pytest.mark.process
@pytest.mark.slow
def test_a_short_run_fills_the_panel_from_scraped_metrics_and_the_canaries_stop_the_bundle(
    tmp_path,
):
    from simulations.windfarm.report import write_report
    from simulations.windfarm.run import Options, Simulation

    options = Options(turbines=5, duration=25, spark="never", rollout_fault="budget")
    options.out = tmp_path / "run"
    simulation = Simulation(options, say=lambda message: None)
    result = simulation.run()

    failed = [f"{c.name}: {c.detail}" for c in result.checks if not c.ok]
    assert not failed, failed
    devices = sorted(t.id for t in simulation.farm.turbines)
    panel = simulation.panel
    assert sorted(row.device for row in panel.rows) == devices and not panel.missing
    begin, end = simulation.scrapes
    for row in panel.rows:
        # Every reading batch the harness sent the device between the scrapes is one update
        # the agent counted (plus its neighbours' telemetry and its bundles).
        sent = [
            at
            for at, _ in simulation.log.readings[row.device]
            if begin.devices[row.device].at < at < end.devices[row.device].at - 2
        ]
        assert row.updates >= len(sent) > 10
        assert row.p50 is not None and 0 < row.p50 <= row.p99 < 5
        assert row.rss > 10e6 and row.bytes_per_fact > 0 and row.facts > 0

    fault = simulation.rollout
    canaries = devices[:CANARIES]
    assert fault.canaries == canaries and fault.exit_code == 1
    assert f"not sent to {' '.join(devices[CANARIES:])}" in fault.output
    for device in canaries:
        assert end.devices[device].refusals.get("budget_exceeded") == 1
    for device in devices[CANARIES:]:
        assert not end.devices[device].refusals.get("budget_exceeded")
    for database in (simulation.directory / "agents").glob("*/*.db"):
        with AgentState(database, create=False) as state:
            assert not list(state.reasoner.facts("canarySeed")), database
            assert not list(state.reasoner.facts("CanaryPair")), database

    text = write_report(result, simulation.directory).read_text()
    assert "## Farm panel" in text and "5 of 5 agents answered both scrapes" in text
    assert f"`zodiac-cloud publish --stream {STREAM} --canary {CANARIES}`" in text
    assert "stopped: canary" in text and "FAILED" not in text


def test_an_unknown_rollout_fault_is_refused_before_anything_starts(capsys):
    from simulations.windfarm.__main__ import main

    with pytest.raises(SystemExit) as exit_info:
        main(["--rollout-fault", "nope"])
    assert exit_info.value.code == 2
    error = capsys.readouterr().err
    assert "--rollout-fault: invalid choice: 'nope'" in error and "Traceback" not in error
