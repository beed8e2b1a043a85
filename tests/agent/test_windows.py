"""Windows over readings on an agent (in-process: the agent's methods, a real SQLite file, an
injected clock running minutes of readings in milliseconds): the two example rules of
docs/agent.md ("stuck", "rising") end to end, late readings and the budget counted, expiry as
one batch per tick with its event, windows from bundles and local rule files, restarts."""

from __future__ import annotations

import json
import re
import sqlite3
import time
from pathlib import Path

import pytest

from agent.cli import main
from agent.engine.language import Program, WindowDeclaration
from agent.engine.program.parser import parse_program
from agent.protocol.messages import fact_tuple
from agent.readings.windows import LATE, OVER_BUDGET
from agent.state.agent_state import AgentState, StateError
from agent.state.outbox import pending_events
from agent.state.schema import OUTBOX_VERSION, SCHEMA_VERSION
from tests.agent.test_service import make_agent
from tests.support.agent_harness import Cloud, readings_payload
from tests.support.old_states import without_windows

DOC = Path(__file__).resolve().parents[2] / "docs" / "agent.md"
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```$", re.DOTALL | re.MULTILINE)


def documented_program() -> Program:
    """The rules of docs/agent.md, "Windows": its first datalog block."""
    text = DOC.read_text(encoding="utf-8")
    section = text[text.index("\n## Windows\n") :]
    block = next(m[2] for m in FENCE.finditer(section) if m[1] == "datalog")
    return parse_program(block, "docs/agent.md")


PROGRAM = documented_program()
READING = "hasAirTemperatureMeasurement"
TEN_MINUTES, TWO_MINUTES = (str(window) for window in PROGRAM.windows)
RULES = {rule.id: str(rule) for rule in PROGRAM.rules}
# The "stuck" rules of the page (there is no count-distinct aggregate, so "one distinct value"
# is "the smallest value equals the largest"), and the "rising" ones.
STUCK = {name: RULES[name] for name in ("window_count", "window_min", "window_max", "stuck")}
RISING = {name: RULES[name] for name in ("average_10", "average_2", "rising")}


class Clock:
    """The agent's clock, starting at the real time of the test (bundles are valid for an hour
    from when they are cut), moved on by the test."""

    def __init__(self, now: float | None = None) -> None:
        self.start = float(int(time.time())) if now is None else now
        self.now = self.start

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def cloud(tmp_path):
    return Cloud(tmp_path / "cloud")


def windowed_agent(tmp_path, cloud, *, tables: str = ""):
    agent = make_agent(tmp_path, cloud, tables=tables)
    clock = agent.clock = Clock()
    bundle = cloud.bundle(
        "base",
        1,
        rules={**STUCK, **RISING},
        windows=[TEN_MINUTES, TWO_MINUTES],
        watches=[str(pattern) for pattern in PROGRAM.watches],
    )
    outcome = agent.handle_bundle(cloud.sign(bundle))
    assert outcome.status == "applied", outcome.message
    return agent, clock


def read(agent, clock: Clock, value: float, sensor: str = "s1", at: float | None = None):
    """One reading of ``sensor`` sent now (or at ``at``)."""
    sent = clock.now if at is None else at
    payload = readings_payload("t1", "farm1", [(READING, sensor, value)], sent_at=sent)
    return agent.record_readings(payload)


def holds(agent, pattern: str) -> list[dict]:
    return agent.reasoner.query(pattern)


def test_a_stuck_sensor_and_a_rising_one(tmp_path, cloud):
    agent, clock = windowed_agent(tmp_path, cloud)
    for _ in range(25):  # s1 repeats 12.5 every 20 s: its latest value never changes
        read(agent, clock, 12.5)
        clock.now += 20
    assert agent.state.windows.sizes()["recentAirTemperature"] == 25
    # Every reading counts, although the latest-value fact stayed the same.
    assert holds(agent, "<StuckSensor>(S)") == [{"S": "s1"}]
    agent.tick_windows()  # (readings at 0, 20, ... 480 s; now 500 s: 5 within 2 minutes)
    assert agent.status().windows == {"recentAirTemperature": 25, "lastAirTemperature": 5}
    # 10 minutes of one value then another: no longer stuck (two values in the window).
    read(agent, clock, 13.0)
    assert holds(agent, "<StuckSensor>(S)") == []
    # Ten minutes later the old value has left (the tick expires it): one value, 13.0, but
    # fewer than 20 readings of it.
    clock.now += 600
    assert agent.tick_windows().status == "applied"
    assert agent.state.windows.sizes() == {"recentAirTemperature": 0, "lastAirTemperature": 0}
    assert holds(agent, "<windowCount>(S, N)") == []
    # s2 rises: 10 minutes around 10 degrees, then 2 minutes around 20.
    for step in range(40):
        read(agent, clock, 10.0 if step < 32 else 20.0, sensor="s2")
        clock.now += 15
        agent.tick_windows()  # (the service's loop ticks every second)
    assert holds(agent, "<RisingTemperature>(S)") == [{"S": "s2"}]
    assert holds(agent, "<StuckSensor>(S)") == []
    clock.now += 120  # the last 2 minutes' readings leave: no more recent rise
    agent.tick_windows()
    assert holds(agent, "<RisingTemperature>(S)") == []


def test_late_readings_and_the_budget_are_counted(tmp_path, cloud):
    agent, clock = windowed_agent(tmp_path, cloud, tables="[windows]\nmax_facts = 5\n")
    late = read(agent, clock, 1.0, at=clock.now - 300)  # inside 10 min, outside 2 min
    assert late.status == "applied"
    assert agent.dropped[LATE] == 1
    assert agent.state.windows.sizes() == {"recentAirTemperature": 1, "lastAirTemperature": 0}
    for step in range(7):
        clock.now += 1
        read(agent, clock, float(step))
    sizes = agent.state.windows.sizes()
    assert sizes == {"recentAirTemperature": 5, "lastAirTemperature": 5}
    # 8 facts arrived in the 10-minute window (the late one first), 7 in the 2-minute one.
    assert agent.dropped[OVER_BUDGET] == 3 + 2
    held = agent.state.windows.facts("recentAirTemperature")
    assert [fact[2] for fact in held] == [2.0, 3.0, 4.0, 5.0, 6.0]  # the oldest went first
    assert agent.status().dropped[OVER_BUDGET] == 5
    # A reading older than the whole 10 minutes is late for both windows.
    read(agent, clock, 9.0, sensor="s3", at=clock.now - 601)
    assert agent.dropped[LATE] == 3


def test_expiry_is_one_batch_per_tick_with_its_event(tmp_path, cloud):
    agent, clock = windowed_agent(tmp_path, cloud)  # (watching <StuckSensor>(X))
    for _ in range(20):
        read(agent, clock, 7.0)
        clock.now += 10
    assert holds(agent, "<StuckSensor>(S)") == [{"S": "s1"}]
    # Readings at 0, 10, ... 190 s, now 200 s: 9 have left the 2-minute window, one batch.
    assert agent.tick_windows().report["windows"]["deleted"] == 9
    assert agent.tick_windows() is None  # nothing more has left: no change at all
    events_before = len(pending_events(agent.state.conn, limit=1000))
    clock.now = clock.start + 600 + 5  # the first reading leaves 10 minutes, the rest 2 minutes
    outcome = agent.tick_windows()
    assert outcome.status == "applied"
    assert outcome.report["windows"]["deleted"] == 1 + 11
    events = pending_events(agent.state.conn, limit=1000)
    assert len(events) == events_before + 1
    last = events[-1]
    assert last.cause == {"kind": "window expiry"}
    ((watch, appeared, disappeared),) = last.changes
    assert appeared == [] and [fact_tuple(f) for f in disappeared] == [
        ("http://www.w3.org/1999/02/22-rdf-syntax-ns#type", "s1", "StuckSensor")
    ]
    assert agent.tick_windows() is None


def test_windows_survive_a_restart(tmp_path, cloud, capsys):
    agent, clock = windowed_agent(tmp_path, cloud)
    for value in (1.0, 2.0, 3.0):
        read(agent, clock, value)
        clock.now += 50
    before = agent.state.windows.facts()
    agent.close()
    # zodiac-agent status reads them from the file (the state not loaded).
    assert main(["status", "--config", str(tmp_path / "agent.toml")]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["windows"] == [
        {"declaration": TEN_MINUTES, "sources": ["base"], "facts": 3},
        {"declaration": TWO_MINUTES, "sources": ["base"], "facts": 3},
    ]
    again = make_agent(tmp_path, cloud)
    again.clock = clock
    assert again.state.windows.facts() == before
    assert set(again.state.window_claims) == {
        WindowDeclaration(READING, 600.0, "recentAirTemperature"),
        WindowDeclaration(READING, 120.0, "lastAirTemperature"),
    }
    clock.now += 5  # (readings at 0, 50, 100 s; now 155 s) 1.0 leaves the 2-minute window
    assert again.tick_windows().report["windows"]["deleted"] == 1
    assert again.state.windows.sizes() == {"recentAirTemperature": 3, "lastAirTemperature": 2}


def test_a_bad_window_refuses_the_bundle(tmp_path, cloud):
    agent = make_agent(tmp_path, cloud)
    for windows, message in (
        (["@window <p> 10 parsecs as <r> ."], "window 1:1:16: expected a unit of time"),
        (["@window <p> 1 s as <r> .", "x(a) :- y(a) ."], "window 2:1:1: expected exactly one"),
        (
            ["@window <p> 1 s as <r> .", "@window <q> 1 s as <r> ."],
            "the window relation <r> is declared twice",
        ),
        (["@window <p> 1 s as <windowCount> ."], "rule window_count derives <windowCount>"),
    ):
        bundle = cloud.bundle("base", 1, rules=STUCK, windows=windows)
        outcome = agent.handle_bundle(cloud.sign(bundle))
        assert (outcome.status, outcome.reason) == ("refused", "bad_rule")
        assert outcome.message.startswith(message) and "\n" not in outcome.message
        assert agent.reasoner.rules == {} and agent.state.window_claims == {}
        assert agent.state.applied_versions() == {}


def test_a_stream_takes_its_windows_with_it(tmp_path, cloud):
    agent, clock = windowed_agent(tmp_path, cloud)
    for value in (1.0, 2.0):
        read(agent, clock, value)
        clock.now += 1
    # A bundle that keeps its windows (None) keeps their facts.
    keep = cloud.bundle("base", 2, facts=[("site", "t1", "north")])
    assert agent.handle_bundle(cloud.sign(keep)).status == "applied"
    assert agent.state.windows.sizes() == {"recentAirTemperature": 2, "lastAirTemperature": 2}
    # One window replaced by another declaration: the old one's facts go, the new starts empty.
    changed = cloud.bundle(
        "base", 3, windows=[TEN_MINUTES, f"@window <{READING}> 5 min as <lastAirTemperature> ."]
    )
    assert agent.handle_bundle(cloud.sign(changed)).status == "applied"
    assert agent.state.windows.sizes() == {"recentAirTemperature": 2, "lastAirTemperature": 0}
    # Another stream supersedes it: every window of base goes, with its facts.
    take_over = cloud.bundle("next", 1, supersedes=["base"], windows=[])
    assert agent.handle_bundle(cloud.sign(take_over)).status == "applied"
    assert agent.state.window_claims == {}
    assert agent.state.windows.sizes() == {}
    assert agent.state.facts_of_source("window") == []


def test_local_rule_files_declare_windows_and_watches(tmp_path, cloud):
    rules = tmp_path / "local.rules"
    rules.write_text(
        f"{TEN_MINUTES}\n@watch <StuckSensor>(X) .\n" + "\n".join(STUCK.values()) + "\n"
    )
    reasoning = f'rules = ["{rules}"]'
    agent = make_agent(tmp_path, cloud, reasoning=reasoning)
    agent.clock = clock = Clock()
    assert set(agent.state.window_claims) == {
        WindowDeclaration(READING, 600.0, "recentAirTemperature")
    }
    assert "<StuckSensor>(X)" in agent.state.watches
    for _ in range(20):
        read(agent, clock, 3.0)
        clock.now += 1
    assert holds(agent, "<StuckSensor>(S)") == [{"S": "s1"}]
    agent.close()
    rules.write_text("\n".join(STUCK.values()) + "\n")  # the window removed from the file
    again = make_agent(tmp_path, cloud, reasoning=reasoning)
    assert again.state.window_claims == {} and again.state.windows.sizes() == {}
    assert holds(again, "<StuckSensor>(S)") == []


def test_neighbours_telemetry_fills_windows(tmp_path, cloud):
    reasoning = f'neighbours = ["t2"]\ntelemetry_predicates = ["{READING}"]'
    agent = make_agent(tmp_path, cloud, reasoning=reasoning)
    agent.clock = clock = Clock()
    bundle = cloud.bundle("base", 1, rules=STUCK, windows=[TEN_MINUTES])
    assert agent.handle_bundle(cloud.sign(bundle)).status == "applied"
    for _ in range(3):
        payload = readings_payload("t2", "farm1", [(READING, "t2", 5.0)], sent_at=clock.now)
        outcome = agent.handle_telemetry(payload, sender="t2")
        assert outcome.status in ("applied", "unchanged"), outcome.message
        clock.now += 1
    held = agent.state.windows.facts("recentAirTemperature")
    assert [fact[1:] for fact in held] == [("t2", 5.0, clock.start + i) for i in range(3)]


def test_a_version_11_file_gets_its_windows_table(tmp_path):
    path = tmp_path / "a.db"
    with AgentState(path) as state:
        state.apply(add_rules="q(X) :- p(X) .", add_facts=[("p", "a")])
    conn = sqlite3.connect(path)
    with conn:
        without_windows(conn)
        conn.execute(
            "UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(OUTBOX_VERSION),)
        )
    conn.close()
    with AgentState(path, load=False) as state:
        assert state.check_integrity() == []
    with AgentState(path) as state:
        assert state.get_meta("schema_version") == str(SCHEMA_VERSION)
        assert state.load_report.how == "loaded"
        assert state.window_claims == {}
        window = WindowDeclaration("p2", 60.0, "recent")
        state.apply(source="base", windows=[window])
        state.apply(
            add_facts=[("p2", "a", 1)],
            source="sensor",
            window_facts=state.window_arrivals([("p2", "a", 1)], at=100.0, now=100.0),
        )
    with AgentState(path) as state:
        assert state.window_claims == {window: {"base"}}
        assert state.windows.facts() == [("recent", "a", 1, 100.0)]


def test_the_service_loop_expires_once_per_tick(tmp_path, cloud):
    """``AgentService.tick_windows`` (called by the run loop between messages and after each)
    expires at most once per ``[windows] tick`` seconds of monotonic time, by the agent's
    clock, and acts on the change (the stuck sensor's finding goes)."""
    from agent.sync import AgentService

    agent, clock = windowed_agent(tmp_path, cloud, tables="[windows]\ntick = 3600\n")
    service = AgentService(agent)
    try:
        for _ in range(20):
            read(agent, clock, 4.0)
            clock.now += 1
        assert holds(agent, "<StuckSensor>(S)") == [{"S": "s1"}]
        clock.now += 600
        service.tick_windows()  # the first is due at once
        assert agent.state.windows.sizes() == {"recentAirTemperature": 0, "lastAirTemperature": 0}
        assert holds(agent, "<StuckSensor>(S)") == []
        read(agent, clock, 5.0)
        clock.now += 600
        service.tick_windows()  # within the hour: not due
        assert agent.state.windows.sizes()["recentAirTemperature"] == 1
        service.next_tick = 0.0  # (an hour later)
        service.tick_windows()
        assert agent.state.windows.sizes()["recentAirTemperature"] == 0
    finally:
        agent.close()


def test_a_damaged_window_row_is_a_damaged_state(tmp_path):
    path = tmp_path / "a.db"
    with AgentState(path) as state:
        state.apply(source="base", windows=[WindowDeclaration("p", 60.0, "recent")])
    conn = sqlite3.connect(path)
    with conn:
        conn.execute("UPDATE windows SET declaration = '@window <p> 60 parsecs as <recent> .'")
    conn.close()
    with AgentState(path, load=False) as state:
        (problem,) = state.check_integrity()
        assert problem.startswith("saved window @window <p> 60 parsecs") and "damaged" in problem
    with pytest.raises(StateError, match="damaged agent state: saved window"):
        AgentState(path)


def test_a_released_stream_takes_its_windows_with_it(tmp_path, cloud):
    """The device releases an answered stream when its event is resolved: the stream's
    windows go with its rules, and their facts, in that one change."""
    reasoning = 'triggers = { "Suspect" = "stuck" }\nresolved = ["Fine"]'
    agent = make_agent(tmp_path, cloud, reasoning)
    agent.clock = clock = Clock()
    base = {"s": "s: <Suspect>(X) :- <temp>(X, T) and T > 60 ."}
    assert agent.handle_bundle(cloud.sign(cloud.bundle("base", 1, rules=base))).status == "applied"
    agent.record_readings(readings_payload("t1", "farm1", [("temp", "t1", 70)], sent_at=clock.now))
    (request,) = agent.new_requests()
    answer = cloud.bundle("event/stuck", 1, rules=STUCK, windows=[TEN_MINUTES])
    answer = answer.model_copy(update={"answers": request.request_id})
    assert agent.handle_bundle(cloud.sign(answer)).status == "applied"
    clock.now += 1
    read(agent, clock, 3.0)
    assert agent.state.windows.sizes() == {"recentAirTemperature": 1}
    agent.state.apply(add_facts=[("ok", "t1")], add_rules="f: <Fine>(X) :- <ok>(X) .")
    (released,) = agent.release_resolved()
    assert released.status == "applied" and "stuck" not in agent.reasoner.rules
    assert agent.state.window_claims == {} and agent.state.windows.sizes() == {}
    assert agent.state.facts_of_source("window") == []


def test_the_metrics_report_each_windows_size(tmp_path, cloud):
    """``zodiac_agent_window_facts`` (docs/operations.md) is what each window holds, read from
    a real agent's state at scrape time."""
    from prometheus_client import CollectorRegistry
    from prometheus_client.parser import text_string_to_metric_families

    from agent.observability.metrics import AgentCollector, HealthFigures, render, take_snapshot

    agent, clock = windowed_agent(tmp_path, cloud)
    for value in (12.5, 12.6, 12.7):
        read(agent, clock, value)
        clock.now += 30
    registry = CollectorRegistry()
    registry.register(
        AgentCollector(lambda: take_snapshot(agent), lambda: HealthFigures(True, True, True), 10)
    )
    samples = {
        sample.labels["window"]: sample.value
        for family in text_string_to_metric_families(render(registry).decode())
        if family.name == "zodiac_agent_window_facts"
        for sample in family.samples
    }
    assert samples == {"recentAirTemperature": 3, "lastAirTemperature": 3}
    clock.now += 40  # (now 130 s: the first reading leaves the 2-minute window)
    agent.tick_windows()
    assert take_snapshot(agent).windows == {"recentAirTemperature": 3, "lastAirTemperature": 2}
