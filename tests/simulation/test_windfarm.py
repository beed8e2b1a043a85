"""The wind-farm simulation end to end: a real private Mosquitto, five real agent processes with
their SQLite files, the cloud's Spark job (the test session's shared SparkSession) and
publisher, the broken-sensor / warm-air scenario with every fault injected.

What must hold (the simulation's own checks, asserted one by one here): the broken sensor is
diagnosed as SensorAnomalyWindTurbine and the warmed turbine as
AmbientTemperatureChangeConfirmed, no other turbine suspects anything, the cloud releases the
anomaly rules and every turbine ends on its base rules; the killed agent and every agent after
the broker restart come back; the tampered bundle is refused; the burst is absorbed; each rule
update replayed on the device's state equals a from-scratch materialisation. A shorter run does
the same on the embedded Python MQTT v5 broker (``--embedded-broker``) through a broker restart.
"""

from __future__ import annotations

import pytest

from agent.engine.program.parser import parse_file
from agent.state.agent_state import AgentState
from simulations.brokerprocess import BrokerError
from simulations.mqttbroker import EmbeddedBroker
from simulations.windfarm import run as windfarm_run
from simulations.windfarm.__main__ import build_parser, main, parse_faults
from simulations.windfarm.cloud import STREAMS, neighbours_of
from simulations.windfarm.farm import (
    CHANGE_CONFIRMED,
    FROZEN_READINGS,
    FROZEN_SENSOR,
    FROZEN_WINDOW,
    SENSOR_ANOMALY,
    SUSPICIOUS_DEVIATION,
    Farm,
    SensorModel,
)
from simulations.windfarm.report import write_report
from simulations.windfarm.run import FAULTS, Options, Simulation, SimulationError

pytestmark = pytest.mark.process
BASE_RULES = STREAMS / "base.rules"


def test_five_turbines_end_to_end_with_every_fault(tmp_path, spark):
    options = Options(turbines=5, duration=39, faults=FAULTS, spark="always", out=tmp_path / "run")
    simulation = Simulation(options, say=lambda message: None)
    result = simulation.run()

    failed = [f"{c.name}: {c.detail}" for c in result.checks if not c.ok]
    assert not failed, failed
    assert simulation.graph.materialiser.startswith("spark")
    findings = {line.device: line.finding for line in result.timelines}
    assert findings == {
        simulation.farm.broken: SENSOR_ANOMALY,
        simulation.farm.warm: CHANGE_CONFIRMED,
    }
    for line in result.timelines:
        assert line.suspicion is not None and line.suspicion <= line.diagnosis <= line.released
    names = {check.name for check in result.checks}
    assert f"tampered bundle refused by {simulation.log.tampered['device']}" in names
    assert "every agent reconnected after the broker restart" in names
    assert len(result.updates) == 4 and all(u.equal for u in result.updates)
    assert result.messages["request"][0] == 2  # one request per suspicious turbine
    assert_diagnoses_reached_the_cloud_after_their_reading(simulation, result)

    report = write_report(result, simulation.directory)
    text = report.read_text()
    assert "every diagnosis right" in text and "FAILED" not in text
    for plot in ("timeline.png", "latency.png", "updates.png"):
        assert (simulation.directory / plot).stat().st_size > 10_000
    databases = list((simulation.directory / "agents").glob("*/*.db"))
    assert len(databases) == 5
    # Two sources name each turbine; a turbine reporting under its registry name is one of
    # its neighbours' neighbours like any other (its readings reached their reasoning).
    assert "10 turbine names from two sources" in text and "into 5 turbines" in text
    registry_fed = [
        t.id for t in simulation.farm.turbines if t.id != simulation.farm.reading_name(t.id)
    ]
    assert registry_fed
    for database in databases:
        with AgentState(database, create=False) as state:
            readings = {f[1] for f in state.reasoner.facts("hasAirTemperatureMesurement")}
            device = database.stem
            for other in registry_fed:
                if other in neighbours_of(simulation.graph, device, simulation.farm):
                    assert other in readings and Farm.registry_name(other) in readings


def assert_diagnoses_reached_the_cloud_after_their_reading(simulation, result) -> None:
    """Each expected diagnosis came through an event the cloud's service kept, traced back to
    a reading the harness sent before it (the report's reading -> event latencies)."""
    expected = simulation.model.expected_findings()
    traced = {
        (e.device, e.diagnosis)
        for e in result.diagnosis_events
        if e.to_cloud is not None and 0 < e.to_broker < 30 and 0 < e.to_cloud < 30
    }
    assert set(expected.items()) <= traced, result.diagnosis_events


def test_the_scenario_is_decided_by_the_thresholds_whatever_the_noise():
    """The sensor model's bounded noise keeps the diagnosis deterministic: over many seeds and
    farm sizes, only the two protagonists leave the forecast by more than 4 degrees."""
    b1 = next(line for line in BASE_RULES.read_text().splitlines() if line.startswith("b1:"))
    assert f"COMP(D, >, {SUSPICIOUS_DEVIATION:g})" in b1  # (what SensorModel.suspicious tests)
    for n in (5, 8, 30, 100, 800):
        farm = Farm.grid(n)
        for seed in range(20):
            model = SensorModel(farm, fault_at=10.0, seed=seed)
            late = model.warm_at + 10.0
            suspicious = {
                t.id for t in farm.turbines if model.suspicious(model.readings(t.id, late)[0][2])
            }
            assert suspicious == {farm.broken, farm.warm}, (n, seed)


@pytest.mark.slow
def test_a_frozen_sensor_is_diagnosed_by_the_window_rules_only(tmp_path):
    """--sensor-fault frozen: the broken sensor repeats a plausible value, so base rule b1
    never fires and the turbine asks for nothing; the window rules of the windows stream
    (sent with the base rules) diagnose it once its window holds one value, and its event
    reaches the cloud. The warm turbine is diagnosed and released as before."""
    options = Options(
        turbines=5, duration=50, sensor_fault="frozen", spark="never", out=tmp_path / "run"
    )
    simulation = Simulation(options, say=lambda message: None)
    result = simulation.run()

    failed = [f"{c.name}: {c.detail}" for c in result.checks if not c.ok]
    assert not failed, failed
    broken, warm = simulation.farm.broken, simulation.farm.warm
    assert {line.device: line.finding for line in result.timelines} == {
        broken: FROZEN_SENSOR,
        warm: CHANGE_CONFIRMED,
    }
    assert {device for _, device, _ in simulation.monitor.seen.requests} == {warm}
    sent = [value for at, value in simulation.log.readings[broken]]
    assert not any(simulation.model.suspicious(value) for value in sent)
    frozen = next(line for line in result.timelines if line.device == broken)
    # Diagnosable once the last reading before the fault left the window, not before.
    assert FROZEN_WINDOW - 2 * options.period <= frozen.diagnosis <= FROZEN_WINDOW + 5
    [event] = [e for e in result.diagnosis_events if e.diagnosis == FROZEN_SENSOR]
    assert event.device == broken and event.cause == "window expiry"
    assert 0 < event.to_cloud < 5
    assert_diagnoses_reached_the_cloud_after_their_reading(simulation, result)
    text = write_report(result, simulation.directory).read_text()
    assert f"| {FROZEN_SENSOR} | {broken} | window expiry | 1 |" in text


def test_the_frozen_fault_needs_readings_enough_for_its_window(tmp_path):
    with pytest.raises(SimulationError, match="reading period of at most 1.36 s"):
        Simulation(
            Options(turbines=5, duration=60, sensor_fault="frozen", reading_period=2.0),
            say=lambda m: None,
        )
    with pytest.raises(SimulationError, match="too short"):
        Simulation(Options(turbines=5, duration=30, sensor_fault="frozen"), say=lambda m: None)
    program = parse_file(STREAMS / "windows.rules")
    [window] = program.windows
    assert window.seconds == FROZEN_WINDOW and window.reading == "hasAirTemperatureMesurement"
    assert f"COMP(N, >=, {FROZEN_READINGS})" in str(program.rules[-1])
    assert [str(atom) for atom in program.watches] == [f"<{FROZEN_SENSOR}>(X)"]


def test_a_frozen_sensor_stays_within_the_forecasts_band():
    for n in (5, 30, 100):
        farm = Farm.grid(n)
        for seed in range(10):
            model = SensorModel(farm, fault_at=10.0, sensor_fault="frozen", seed=seed)
            values = {model.readings(farm.broken, t)[0][2] for t in range(10, 60)}
            assert values == {model.frozen_value()}
            assert not model.suspicious(model.frozen_value())
            assert model.expected_findings()[farm.broken] == FROZEN_SENSOR


def test_bad_arguments_are_reported_without_a_run(tmp_path, capsys):
    for size in ("3", "801"):
        with pytest.raises(SystemExit):
            main(["--turbines", size])
        assert "between 5 and 800" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--faults", "meteor"])
    assert "unknown fault(s) meteor" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--broker", "127.0.0.1:1883", "--embedded-broker"])
    assert "exclude each other" in capsys.readouterr().err
    assert (
        main(["--turbines", "5", "--duration", "10", "--faults", "all", "--out", str(tmp_path)])
        == 2
    )
    assert "too short" in capsys.readouterr().err
    assert parse_faults("all") == FAULTS and parse_faults("burst, burst") == ("burst",)


def test_five_turbines_on_the_embedded_broker_with_a_broker_restart(tmp_path):
    """The same scenario on the embedded Python MQTT v5 broker (``--embedded-broker``), with
    the fault that depends most on the broker: a restart that must keep every persistent
    session and the retained statuses. The edge engine materialises the farm (no Spark)."""
    options = Options(
        turbines=5,
        duration=24,
        faults=("broker-restart",),
        spark="never",
        embedded_broker=True,
        out=tmp_path / "run",
    )
    said: list[str] = []
    simulation = Simulation(options, say=said.append)
    result = simulation.run()

    failed = [f"{c.name}: {c.detail}" for c in result.checks if not c.ok]
    assert not failed, failed
    assert isinstance(simulation.broker, EmbeddedBroker)
    assert any(line.startswith("broker: embedded Python MQTT v5 broker on") for line in said)
    assert "every agent reconnected after the broker restart" in {c.name for c in result.checks}
    assert {line.device: line.finding for line in result.timelines} == {
        simulation.farm.broken: SENSOR_ANOMALY,
        simulation.farm.warm: CHANGE_CONFIRMED,
    }
    assert_diagnoses_reached_the_cloud_after_their_reading(simulation, result)
    totals = result.broker_totals  # the $SYS counters the monitor read, over both broker lives
    assert totals["messages received"] > 0 and totals["bytes sent"] > totals["bytes received"]
    text = write_report(result, simulation.directory).read_text()
    assert "broker embedded Python MQTT v5 broker" in text and "Broker totals" in text


def _mosquitto_that_does_not_start(self, timeout=10.0):
    raise BrokerError("mosquitto exited with status 3 during start-up\nlog tail...")


@pytest.mark.parametrize(
    ("installed", "expected"),
    [
        (False, ["... (no Mosquitto installed)"]),
        (
            True,
            [
                "broker: Mosquitto did not start (mosquitto exited with status 3 during start-up)",
                "... (Mosquitto did not start)",
            ],
        ),
    ],
    ids=["mosquitto-missing", "mosquitto-broken"],
)
def test_the_embedded_broker_is_the_fallback(tmp_path, monkeypatch, installed, expected):
    monkeypatch.setattr(windfarm_run, "mosquitto_available", lambda: installed)
    monkeypatch.setattr(windfarm_run.Broker, "start", _mosquitto_that_does_not_start)
    said: list[str] = []
    simulation = Simulation(
        Options(turbines=5, duration=30, spark="never", out=tmp_path), say=said.append
    )
    try:
        simulation._start_broker()
        assert isinstance(simulation.broker, EmbeddedBroker) and simulation.broker.running
        where = f"broker: embedded Python MQTT v5 broker on 127.0.0.1:{simulation.port}"
        assert said == [line.replace("...", where) for line in expected]
    finally:
        if simulation.broker is not None:
            simulation.broker.stop()


def test_when_no_broker_can_start_the_user_is_told_what_to_do(tmp_path, monkeypatch):
    def fail(self, timeout=10.0):
        raise BrokerError("embedded MQTT broker exited with status 1 during start-up")

    monkeypatch.setattr(windfarm_run, "mosquitto_available", lambda: False)
    monkeypatch.setattr(EmbeddedBroker, "start", fail)
    simulation = Simulation(
        Options(turbines=5, duration=30, spark="never", out=tmp_path), say=lambda m: None
    )
    with pytest.raises(
        SimulationError, match="(?s)Install Mosquitto.*--broker HOST:PORT.*status 1"
    ):
        simulation.run()


def test_every_option_has_help_text():
    parser = build_parser()
    for action in parser._actions:
        assert action.help, action.dest
