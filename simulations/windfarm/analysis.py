"""From what the run observed to the report's numbers and verdicts.

Sources, all independent of the agents' good will: the monitor's time-stamped MQTT messages
(statuses, requests, bundles, telemetry), the publisher's record of causes and releases, the
agents' JSON logs (engine time of each applied bundle), and their SQLite files, replayed after
the run to compare each rule update with a from-scratch materialisation of the same state.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from sqlite_utils import Database

from agent.engine import Reasoner
from agent.engine.program.parser import parse_program
from agent.protocol.messages import Event
from agent.state.agent_state import AgentState
from cloud.events import read_events
from cloud.publisher import finding_predicate
from simulations.windfarm.farm import ANOMALY_STREAM, FROZEN_SENSOR, FROZEN_WINDOW

REPEAT = 3  # replays per rule update (best of)


@dataclass
class Check:
    name: str
    ok: bool
    detail: str = ""


@dataclass
class Timeline:
    """One suspicious turbine's event, in seconds after its fault (None: did not happen)."""

    device: str
    cause: str  # what happened to it
    fault_at: float  # scenario time
    suspicion: float | None = None
    rules_applied: float | None = None
    diagnosis: float | None = None
    finding: str | None = None
    released: float | None = None
    expected: str | None = None

    @property
    def needs_release(self) -> bool:
        """Whether its diagnosis comes with rules the cloud then releases: not a frozen
        sensor's, which the window rules every turbine holds diagnose."""
        return self.expected != FROZEN_SENSOR

    @property
    def right(self) -> bool:
        return self.finding == self.expected and (
            self.released is not None or not self.needs_release
        )


@dataclass
class Update:
    """One rule update on one device: engine time live, and replayed against from scratch."""

    device: str
    update: str
    live_seconds: float | None
    incremental_seconds: float
    scratch_seconds: float
    equal: bool

    @property
    def speedup(self) -> float:
        return self.scratch_seconds / max(self.incremental_seconds, 1e-9)


@dataclass
class DiagnosisEvent:
    """A diagnosis that appeared in a device's event (its first copy: one per ``(device,
    seq)``), traced back to the reading that caused it.

    ``reading_sent`` is the ``sent_at`` of that reading batch, as the harness sent it: for an
    event caused by readings, the batch the event's cause names; by a neighbour's telemetry,
    that neighbour's latest batch sent before the telemetry; by a bundle (the answer to the
    device's rule request, whose rules made the diagnosis), the reading that made the device
    suspicious: its first after its fault that base rule b1 flags (``SensorModel.suspicious``;
    not its latest before the request, which a device running behind its readings issues
    long after that reading); by a window's expiry (a frozen sensor: one value left in the
    window), the moment the last reading unlike the later ones left the window (its
    ``sent_at`` plus the window's length), the earliest the diagnosis could be made.
    ``at_broker`` is the
    event's arrival at the harness's monitor (a subscriber of the broker), ``at_cloud`` the
    time the cloud's service kept it (``received_at`` of its ``events`` table)."""

    device: str
    diagnosis: str
    cause: str  # the event cause's kind: readings, telemetry, bundle...
    reading_sent: float | None
    at_broker: float | None
    at_cloud: float | None

    @property
    def to_broker(self) -> float | None:
        if self.reading_sent is None or self.at_broker is None:
            return None
        return self.at_broker - self.reading_sent

    @property
    def to_cloud(self) -> float | None:
        if self.reading_sent is None or self.at_cloud is None:
            return None
        return self.at_cloud - self.reading_sent


@dataclass
class Result:
    sim: object  # the Simulation (options, farm, schedule, log, graph)
    timelines: list[Timeline] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)
    updates: list[Update] = field(default_factory=list)
    base_latencies: dict[str, float] = field(default_factory=dict)
    answer_latencies: list[float] = field(default_factory=list)
    telemetry_latencies: list[float] = field(default_factory=list)
    # Each diagnosis that appeared in an event, with the reading that caused it and the
    # event's arrival at the broker and at the cloud (see DiagnosisEvent).
    diagnosis_events: list[DiagnosisEvent] = field(default_factory=list)
    messages: dict[str, tuple[int, int]] = field(default_factory=dict)  # kind -> (count, bytes)
    broker_totals: dict[str, int] = field(default_factory=dict)
    series: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    burst_rate: float | None = None

    @property
    def ok(self) -> bool:
        return all(check.ok for check in self.checks)


def analyse(sim) -> Result:
    result = Result(sim)
    seen = sim.monitor.seen
    t0 = sim.log.t0
    base_rules = sim.cloud.resident_rules  # (base and window rules: always on the device)
    expected = sim.model.expected_findings()

    # ---- per device event timelines
    requesters = sorted({device for _, device, _ in seen.requests})
    for device in sorted(set(requesters) | set(expected)):
        if device == sim.farm.broken:
            cause, fault_at = f"ambient sensor {sim.options.sensor_fault}", sim.schedule.fault_at
        elif device == sim.farm.warm:
            cause, fault_at = "real local warming", sim.schedule.warm_at
        else:
            cause, fault_at = "none (false suspicion)", sim.schedule.fault_at
        line = Timeline(device, cause, fault_at, expected=expected.get(device))
        fault_wall = t0 + fault_at
        request = next((at for at, d, _ in seen.requests if d == device and at >= fault_wall), None)
        if request is not None:
            line.suspicion = request - fault_wall
            statuses = [(at, s) for at, d, s in seen.statuses if d == device and at >= request]
            applied = next((at for at, s in statuses if s.rules > base_rules), None)
            if applied is not None:
                line.rules_applied = applied - fault_wall
            diagnosed = next(((at, s) for at, s in statuses if s.findings), None)
            if diagnosed is not None:
                at, status = diagnosed
                line.diagnosis = at - fault_wall
                line.finding = finding_predicate(tuple(status.findings[0]))
                released = next(
                    (a for a, s in statuses if a >= at and s.rules == base_rules and s.online),
                    None,
                )
                if released is not None:
                    line.released = released - fault_wall
        elif not line.needs_release:
            # No request: the window rules on the device diagnose it from its readings.
            diagnosed = next(
                (
                    (at, s)
                    for at, d, s in seen.statuses
                    if d == device and at >= fault_wall and s.findings
                ),
                None,
            )
            if diagnosed is not None:
                line.diagnosis = diagnosed[0] - fault_wall
                line.finding = finding_predicate(tuple(diagnosed[1].findings[0]))
        result.timelines.append(line)

    # ---- latencies
    for device, sent in sim.log.base_sent.items():
        applied = next(
            (at for at, d, s in seen.statuses if d == device and s.applied.get("base", 0) >= 1),
            None,
        )
        if applied is not None:
            result.base_latencies[device] = applied - sent
    for at, device, _request in seen.requests:
        answer = next(
            (
                b_at
                for b_at, d, bundle, _ in seen.bundles
                if d == device
                and b_at >= at
                and bundle is not None
                and bundle.stream == ANOMALY_STREAM
            ),
            None,
        )
        if answer is not None:
            result.answer_latencies.append(answer - at)
    result.telemetry_latencies = _telemetry_latencies(seen)
    result.diagnosis_events = _diagnosis_events(sim, seen)

    # ---- traffic
    result.messages = {
        kind: (seen.messages[kind], seen.payload_bytes[kind]) for kind in sorted(seen.messages)
    }
    result.broker_totals = sim.monitor.broker_totals()

    # ---- temperature series for the plots (readings as sent by the controllers)
    for device in (sim.farm.broken, sim.farm.warm, *sim.farm.neighbours(sim.farm.warm)[:2]):
        result.series[device] = [(at - t0, v) for at, d, v in seen.temperatures if d == device]

    # ---- rule updates: live engine time vs replay against from scratch
    result.updates = _updates(sim, requesters)

    # ---- burst
    burst = sim.log.burst
    if burst and burst.get("drained"):
        result.burst_rate = burst["messages"] / max(burst["drained"] - burst["started"], 1e-9)

    result.checks = _checks(sim, result, base_rules)
    return result


def _diagnosis_events(sim, seen) -> list[DiagnosisEvent]:
    """The diagnoses the devices reported through events (see ``DiagnosisEvent``): the events
    the cloud's service kept, joined with their first copy at the monitor (an event only one
    of the two saw is listed with the other's time missing)."""
    at_monitor: dict[tuple[str, int], tuple[float, Event]] = {}
    for at, device, event in seen.events:
        at_monitor.setdefault((device, event.seq), (at, event))
    at_cloud = cloud_events(sim.cloud.ledger) if getattr(sim, "cloud", None) else {}
    sent = sim.log.readings

    def latest_reading(device: str, before: float) -> float | None:
        times = [at for at, _ in sent.get(device, ()) if at <= before]
        return times[-1] if times else None

    def expired_reading(device: str, before: float) -> float | None:
        """When the last reading unlike the ones after it left the frozen-sensor window: what
        made the window's values one (the expiry that caused the event)."""
        readings = [(at, value) for at, value in sent.get(device, ()) if at <= before]
        for (at, value), (_, following) in zip(
            reversed(readings[:-1]), reversed(readings[1:]), strict=True
        ):
            if value != following:
                return at + FROZEN_WINDOW
        return None

    def suspicious_reading(device: str) -> float | None:
        fault = sim.log.t0 + (
            sim.schedule.warm_at if device == sim.farm.warm else sim.schedule.fault_at
        )
        return next(
            (
                at
                for at, value in sent.get(device, ())
                if at >= fault and sim.model.suspicious(value)
            ),
            None,
        )

    found = []
    for key in sorted(set(at_monitor) | set(at_cloud), key=lambda k: (k[0], k[1])):
        device, _seq = key
        monitor_at, event = at_monitor.get(key, (None, None))
        cloud_at, cloud_cause, cloud_changes = at_cloud.get(key, (None, None, None))
        cause = event.cause if event is not None else cloud_cause
        if event is not None:
            appeared = [tuple(f) for change in event.changes for f in change.appeared]
        else:
            appeared = [tuple(f) for change in cloud_changes for f in change["appeared"]]
        if not appeared:
            continue
        kind = str(cause.get("kind", "?"))
        reading = None
        if kind == "readings" and cause.get("sent_at"):
            reading = float(cause["sent_at"])
        elif kind == "telemetry" and cause.get("sent_at") and cause.get("device"):
            reading = latest_reading(str(cause["device"]), float(cause["sent_at"]))
        elif kind == "bundle":
            reading = suspicious_reading(device)
        elif kind == "window expiry":
            reading = expired_reading(device, event.at if event is not None else cloud_at)
        # One diagnosis per predicate: a turbine known under two names (owl:sameAs) has its
        # diagnosis appear under both in the same event.
        for diagnosis in dict.fromkeys(finding_predicate(fact) for fact in appeared):
            found.append(DiagnosisEvent(device, diagnosis, kind, reading, monitor_at, cloud_at))
    return found


def cloud_events(ledger: Path) -> dict[tuple[str, int], tuple[float, dict, list]]:
    """(device, seq) -> (received_at, cause, changes) of the events the cloud's service kept
    in its ledger (cloud/events.py), read after the run."""
    if not Path(ledger).exists():
        return {}
    db = Database(ledger, execute_plugins=False)
    try:
        if "events" not in db.table_names():
            return {}
        return {
            (device, seq): (received, json.loads(cause), json.loads(changes))
            for _, (_farm, device, seq, _at, received, cause, changes) in read_events(db)
        }
    finally:
        db.close()


def _telemetry_latencies(seen) -> list[float]:
    """Reading published -> the agent's telemetry carrying its value (apply + republish).

    Agents send telemetry only when the value changed, so each telemetry message is matched
    with the latest reading of that device and value published before it."""
    readings: dict[tuple[str, float], list[float]] = {}
    for at, device, value in seen.temperatures:
        readings.setdefault((device, value), []).append(at)
    latencies = []
    for at, device, value in seen.telemetry:
        sent = [s for s in readings.get((device, value), ()) if s <= at]
        if sent and at - sent[-1] < 30:
            latencies.append(at - sent[-1])
    return latencies


def _log_times(sim) -> dict[tuple[str, str], list[float]]:
    """(device, stream) -> engine seconds of each applied bundle, in order (agents' logs)."""
    times: dict[tuple[str, str], list[float]] = {}
    for host in sim.hosts:
        for entry in host.log_entries():
            if entry.get("message") == "applied" and entry.get("stream") and "seconds" in entry:
                key = (entry.get("device", "?"), entry["stream"])
                times.setdefault(key, []).append(float(entry["seconds"]))
    return times


def _updates(sim, devices: list[str]) -> list[Update]:
    live = _log_times(sim)
    anomaly_text = "\n".join(sim.cloud.streams[ANOMALY_STREAM].values())
    updates = []
    for device in devices:
        database = sim.directory / "agents" / device / f"{device}.db"
        if not database.exists():
            continue
        with tempfile.TemporaryDirectory() as scratch:
            copy = Path(scratch) / database.name
            for suffix in ("", "-wal", "-shm"):
                source = Path(f"{database}{suffix}")
                if source.exists():
                    shutil.copy(source, f"{copy}{suffix}")
            state = AgentState(copy, synchronous="OFF")
            try:
                reasoner = state.reasoner
                base = list(reasoner.rules.values())
                facts = list(reasoner.edb_facts())
                anomaly = parse_program(anomaly_text).rules
                # Best of REPEAT for each side, after a warm-up: device states are small, so
                # single runs would measure the planner's first compilation, not the update.
                _from_scratch([*base, *anomaly], facts)
                adds, deletes, equal_add, equal_delete = [], [], True, True
                for _ in range(REPEAT):
                    adds.append(reasoner.update(add_rules=anomaly)["seconds"])
                    with_rules = _from_scratch([*base, *anomaly], facts)
                    equal_add &= set(reasoner.facts()) == set(with_rules[0].facts())
                    deletes.append(reasoner.update(delete_rules=[r.id for r in anomaly])["seconds"])
                    without = _from_scratch(base, facts)
                    equal_delete &= set(reasoner.facts()) == set(without[0].facts())
                scratch_with = min(_from_scratch([*base, *anomaly], facts)[1] for _ in range(3))
                scratch_base = min(_from_scratch(base, facts)[1] for _ in range(3))
            finally:
                state.close()
        runs = live.get((device, ANOMALY_STREAM), [])
        updates.append(
            Update(
                device,
                "add anomaly rules",
                runs[0] if runs else None,
                min(adds),
                scratch_with,
                equal_add,
            )
        )
        updates.append(
            Update(
                device,
                "release (delete them)",
                runs[1] if len(runs) > 1 else None,
                min(deletes),
                scratch_base,
                equal_delete,
            )
        )
    return updates


def _from_scratch(rules, facts) -> tuple[Reasoner, float]:
    started = time.perf_counter()
    reasoner = Reasoner()
    reasoner.update(add_rules=rules, add_facts=facts)
    return reasoner, time.perf_counter() - started


def _checks(sim, result: Result, base_rules: int) -> list[Check]:
    checks = []
    expected = sim.model.expected_findings()
    by_device = {line.device: line for line in result.timelines}
    for device, finding in expected.items():
        line = by_device.get(device)
        got = line.finding if line else None
        checks.append(
            Check(
                f"{device} diagnosed as {finding}",
                got == finding,
                f"found {got or 'nothing'}",
            )
        )
        if line is None or line.needs_release:
            checks.append(
                Check(
                    f"{device}'s anomaly rules released",
                    bool(line and line.released is not None),
                    f"after {line.released:.2f} s" if line and line.released is not None else "no",
                )
            )
        reported = [
            e
            for e in result.diagnosis_events
            if e.device == device and e.diagnosis == finding and e.at_cloud is not None
        ]
        checks.append(
            Check(
                f"{device}'s {finding} reported through an event to the cloud",
                bool(reported),
                f"after its reading by {reported[0].to_cloud:.2f} s"
                if reported and reported[0].to_cloud is not None
                else ("yes" if reported else "no"),
            )
        )
    false = [d for d in by_device if d not in expected]
    checks.append(Check("no other turbine suspicious", not false, ", ".join(false) or "none"))
    latest = sim.monitor.latest_statuses()
    found_elsewhere = sorted(
        d for _, d, s in sim.monitor.seen.statuses if s.findings and d not in expected
    )
    checks.append(
        Check(
            "no finding on any other turbine",
            not found_elsewhere,
            ", ".join(sorted(set(found_elsewhere))) or "none",
        )
    )
    tampered_device = sim.log.tampered.get("device")
    not_base = sorted(d for d, s in latest.items() if s.rules != base_rules)
    checks.append(
        Check(
            f"every turbine back to its {base_rules} base and window rules",
            not not_base and len(latest) == len(sim.farm.turbines),
            ", ".join(not_base) or f"all {len(latest)}",
        )
    )
    errors = {d: s.last_error for d, s in latest.items() if s.last_error and d != tampered_device}
    checks.append(Check("no errors reported", not errors, str(errors) if errors else "none"))
    if sim.log.tampered:
        status = latest.get(tampered_device)
        reason = ""
        if status is not None and status.last_error:
            reason = json.loads(status.last_error).get("reason", "")
        checks.append(
            Check(
                f"tampered bundle refused by {tampered_device}",
                reason == "bad_signature" and status.rules == base_rules,
                f"last error: {reason or 'none'}",
            )
        )
    if sim.log.burst:
        checks.append(
            Check(
                "burst of readings absorbed",
                sim.log.burst.get("drained") is not None,
                f"{result.burst_rate:.0f} readings/s" if result.burst_rate else "not drained",
            )
        )
    for fault in sim.log.faults:
        if fault["fault"] == "agent restarted":
            devices = fault["devices"]
            back = all(
                any(
                    d == dev and at > fault["at"] and s.online
                    for at, d, s in sim.monitor.seen.statuses
                )
                for dev in devices
            )
            checks.append(
                Check(
                    f"killed agents {', '.join(devices)} back online",
                    back,
                    f"restarted at t = {fault['t']} s" if back else "not seen online again",
                )
            )
    if any(f["fault"] == "broker restarted" for f in sim.log.faults):
        # At the end the agents were stopped (offline is their last word); check they came
        # back after the restart instead.
        restarted = next(f["at"] for f in sim.log.faults if f["fault"] == "broker restarted")
        back = {d for at, d, s in sim.monitor.seen.statuses if at > restarted and s.online}
        missing = sorted(set(t.id for t in sim.farm.turbines) - back)
        checks.append(
            Check(
                "every agent reconnected after the broker restart",
                not missing,
                ", ".join(missing) or f"all {len(back)}",
            )
        )
    checks.append(
        Check(
            "rule updates replayed equal to from-scratch",
            all(u.equal for u in result.updates),
            f"{sum(u.equal for u in result.updates)}/{len(result.updates)}",
        )
    )
    return checks
