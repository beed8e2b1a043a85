"""One simulation run: broker, cloud, agents, the scenario with its faults, then the evidence.

The order of a run (each step prints what it does):

1. the broker: ``--broker HOST:PORT``, or a private one on a free loopback port: Mosquitto if
   it is installed, else (or with ``--embedded-broker``) the embedded Python MQTT v5 broker;
2. the cloud: Spark (local mode) materialises the farm graph from the layout, checked against the
   edge engine; the publisher starts;
3. the agents: one config and SQLite file per turbine, a few host processes; all must report
   online, then all receive and apply their base bundle;
4. the scenario: readings every period; the sensor fault, then the warm air mass; the requested
   faults at fixed times; a progress line every few seconds;
5. the end: wait until every requested stream is released (or a time-out), stop everything
   cleanly, and hand the observations to :mod:`simulations.windfarm.analysis`.
"""

from __future__ import annotations

import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import paho.mqtt.client as mqtt

from agent.protocol.keys import KeyRing
from agent.protocol.messages import AddRules, Bundle, RuleSpec, Telemetry, encode_model
from agent.protocol.mqtt import mqtt_client
from agent.protocol.signing import sign_bundle
from cloud.bundles import stream_target
from simulations.brokerprocess import BrokerError, BrokerProcess
from simulations.mosquitto import Broker, mosquitto_available
from simulations.mqttbroker import EmbeddedBroker
from simulations.windfarm.agents import HostProcess, group, write_config
from simulations.windfarm.cloud import (
    WINDOWS_STREAM,
    SimulationCloud,
    base_targets,
    materialise_farm,
    merged_names,
    neighbours_of,
)
from simulations.windfarm.farm import (
    FROZEN_READINGS,
    FROZEN_SENSOR,
    FROZEN_WINDOW,
    TEMPERATURE,
    WARM_RAMP,
    Farm,
    SensorModel,
)
from simulations.windfarm.monitor import Monitor, latest_statuses

FAULTS = ("agent-kill", "broker-restart", "burst", "tampered-bundle")
BURST_MESSAGES = 300
MISSING_BROKER = (
    "no MQTT broker: the embedded Python MQTT v5 broker did not start. Install Mosquitto "
    "(Debian/Ubuntu: sudo apt-get install mosquitto; macOS: brew install mosquitto), or pass "
    "--broker HOST:PORT of a running MQTT v5 broker. The embedded broker's error:\n{error}"
)


class SimulationError(RuntimeError):
    """The run cannot start or went wrong in a way the report cannot describe."""


@dataclass
class Options:
    turbines: int = 30
    duration: float = 60.0
    seed: int = 0
    broker: str | None = None  # HOST:PORT of an existing broker
    embedded_broker: bool = False  # the Python broker even when Mosquitto is installed
    out: Path | None = None
    faults: tuple[str, ...] = ()
    sensor_fault: str = "stuck"
    spark: str = "auto"  # as zodiac-cloud materialise --spark: auto, always or never
    spark_master: str = "local[*]"
    reading_period: float | None = None  # seconds; default max(1, turbines / 100)
    processes: int | None = None  # agent host processes; default min(turbines, 16)
    columns: int | None = None

    @property
    def period(self) -> float:
        return self.reading_period or max(1.0, self.turbines / 100)


@dataclass
class Schedule:
    """Scenario times in seconds since the first reading."""

    fault_at: float
    warm_at: float
    faults: dict[str, float] = field(default_factory=dict)
    # Seconds the sensor fault takes to be diagnosable: a frozen sensor is one once the last
    # reading before it froze has left the window.
    diagnosable_after: float = 0.0

    @classmethod
    def plan(
        cls,
        duration: float,
        faults: tuple[str, ...],
        period: float,
        diagnosable_after: float = 0.0,
    ) -> Schedule:
        def times(d: float) -> Schedule:
            planned = cls._times(d, faults, period)
            planned.diagnosable_after = diagnosable_after
            return planned

        schedule = times(duration)
        if duration < schedule.needed(period):
            shortest = next(d for d in range(1, 10_000) if d >= times(d).needed(period))
            raise SimulationError(
                f"--duration {duration:g} is too short for this scenario"
                f"{' and faults' if faults else ''}: it needs at least {shortest} s"
            )
        return schedule

    @classmethod
    def _times(cls, duration: float, faults: tuple[str, ...], period: float) -> Schedule:
        fault_at = max(4.0 * period, 0.2 * duration)
        warm_at = fault_at + 2.0
        times: dict[str, float] = {}
        if "agent-kill" in faults:
            times["agent-kill"] = warm_at + 1.0  # the warm turbine dies as its air warms
        at = max(0.5 * duration, warm_at + WARM_RAMP + 6.0)  # after both diagnoses
        for name in ("broker-restart", "burst", "tampered-bundle"):
            if name in faults:
                times[name] = at
                at += 4.0 + 2.0 * period
        return cls(fault_at, warm_at, times)

    def needed(self, period: float) -> float:
        """The shortest duration that holds both diagnoses and every fault."""
        settled = self.warm_at + WARM_RAMP + 6.0
        if self.diagnosable_after:
            settled = max(settled, self.fault_at + self.diagnosable_after + 2.0)
        return max([settled, *self.faults.values()]) + 4.0 * period + 2.0


@dataclass
class RunLog:
    """What the harness did, with wall-clock times (``time.time()``)."""

    started: float = 0.0
    t0: float = 0.0  # first reading
    base_sent: dict[str, float] = field(default_factory=dict)
    faults: list[dict] = field(default_factory=list)
    burst: dict = field(default_factory=dict)
    tampered: dict = field(default_factory=dict)
    setup_seconds: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    # device -> (``sent_at``, ambient temperature) of each reading batch sent, in order: the
    # analysis traces each diagnosis back to its reading (events name theirs by ``sent_at``).
    readings: dict[str, list[tuple[float, float]]] = field(default_factory=dict)


class Simulation:
    def __init__(self, options: Options, say: Callable[[str], None] | None = None) -> None:
        self.options = options
        self.say = say or (lambda message: print(message, file=sys.stderr, flush=True))
        stamp = time.strftime("%Y%m%d-%H%M%S")
        self.directory = (options.out or Path("out") / "windfarm" / stamp).resolve()
        self.farm = Farm.grid(options.turbines, options.columns)
        if options.broker:
            # A shared broker keeps persistent sessions and retained statuses between runs:
            # a farm id of its own keeps this run's topics apart from earlier runs'.
            self.farm.farm_id = f"{self.farm.farm_id}-{uuid.uuid4().hex[:6]}"
        if options.sensor_fault == "drift" and self._too_close_for_drift():
            raise SimulationError(
                "the drift fault needs the broken turbine at least 5 grid steps from the warm "
                "one (a farm of about 30 turbines or more); use --sensor-fault stuck"
            )
        frozen = options.sensor_fault == "frozen"
        if frozen and options.period > FROZEN_WINDOW / (FROZEN_READINGS + 2):
            raise SimulationError(
                f"the frozen fault is diagnosed over {FROZEN_READINGS} readings in a "
                f"{FROZEN_WINDOW:g}-s window (rules/windfarm/streams/windows.rules): it needs a "
                f"reading period of at most {FROZEN_WINDOW / (FROZEN_READINGS + 2):.2f} s, and "
                f"this run reads every {options.period:g} s; pass --reading-period 1"
            )
        self.schedule = Schedule.plan(
            options.duration,
            options.faults,
            options.period,
            diagnosable_after=FROZEN_WINDOW if frozen else 0.0,
        )
        self.model = SensorModel(
            self.farm, self.schedule.fault_at, options.sensor_fault, seed=options.seed
        )
        self.log = RunLog()
        self.broker: BrokerProcess | None = None
        self.hosts: list[HostProcess] = []
        self.host_of: dict[str, HostProcess] = {}
        self.graph = None
        self.cloud: SimulationCloud | None = None
        self.monitor = None
        self.controller: mqtt.Client | None = None

    def _too_close_for_drift(self) -> bool:
        broken, warm = self.farm.by_id(self.farm.broken), self.farm.by_id(self.farm.warm)
        return broken.steps_to(warm) < 5

    # ------------------------------------------------------------------ the run
    def run(self):
        from simulations.windfarm.analysis import analyse

        self.directory.mkdir(parents=True, exist_ok=True)
        self.log.started = time.time()
        try:
            self._start_broker()
            self._start_cloud()
            self._start_agents()
            self._send_base()
            self._scenario()
            self._wait_for_releases()
        finally:
            self._shutdown()
        return analyse(self)

    # ------------------------------------------------------------------ set-up
    def _timed(self, name: str, started: float) -> None:
        self.log.setup_seconds[name] = round(time.perf_counter() - started, 2)

    def _start_broker(self) -> None:
        started = time.perf_counter()
        if self.options.broker:
            host, _, port = self.options.broker.rpartition(":")
            if not host or not port.isdigit():
                raise SimulationError(f"--broker {self.options.broker!r}: expected HOST:PORT")
            if "broker-restart" in self.options.faults:
                raise SimulationError(
                    "the broker-restart fault needs the simulation's own broker (omit --broker)"
                )
            self.host, self.port = host, int(port)
            self.say(f"broker: using {host}:{port}")
        else:
            why = "" if self.options.embedded_broker else " (no Mosquitto installed)"
            if mosquitto_available() and not self.options.embedded_broker:
                try:
                    self.broker = Broker(
                        self.directory / "broker",
                        log_types=("error", "warning", "notice", "information"),
                        sys_interval=1,
                    ).start()
                except BrokerError as error:
                    # An installed but broken Mosquitto must not end the run: say why and
                    # use the embedded broker instead.
                    first_line = str(error).splitlines()[0] if str(error) else repr(error)
                    self.say(f"broker: Mosquitto did not start ({first_line})")
                    why = " (Mosquitto did not start)"
                else:
                    self.host, self.port = self.broker.host, self.broker.port
                    self.say(f"broker: private Mosquitto on {self.host}:{self.port}")
            if self.broker is None:
                try:
                    self.broker = EmbeddedBroker(
                        self.directory / "embedded-broker", sys_interval=1
                    ).start()
                except BrokerError as error:
                    raise SimulationError(MISSING_BROKER.format(error=error)) from error
                self.host, self.port = self.broker.host, self.broker.port
                self.say(f"broker: embedded Python MQTT v5 broker on {self.host}:{self.port}{why}")
        self._timed("broker", started)

    def _start_cloud(self) -> None:
        started = time.perf_counter()
        self.graph = materialise_farm(
            self.farm,
            spark=self.options.spark,
            master=self.options.spark_master,
            say=self.say,
        )
        self._timed("farm graph", started)
        self.say(
            f"cloud: farm graph of {len(self.graph.facts)} facts by {self.graph.materialiser} "
            f"in {self.graph.seconds:.1f} s"
            + (
                f" (+{self.graph.startup_seconds:.1f} s Spark start-up)"
                if self.graph.materialiser.startswith("spark")
                else ""
            )
            + ", equal to the edge engine's"
        )
        merged, classes = merged_names(self.graph)
        self.say(
            f"cloud: {merged} turbine names from two sources (SCADA, asset registry) merged "
            f"into {classes} turbines by owl:sameAs; every third turbine reports under its "
            "registry name"
        )
        self.cloud = SimulationCloud(self.directory / "cloud", self.farm, self.host, self.port)
        self.monitor = Monitor(
            self.farm.farm_id, self.host, self.port, KeyRing.from_directory(self.cloud.keys)
        ).start()
        self.cloud.publisher.start()

    def _start_agents(self) -> None:
        started = time.perf_counter()
        configs = []
        for turbine in self.farm.turbines:
            configs.append(
                write_config(
                    self.directory / "agents" / turbine.id,
                    turbine.id,
                    self.farm.farm_id,
                    self.host,
                    self.port,
                    self.cloud.keys,
                    neighbours_of(self.graph, turbine.id, self.farm),
                )
            )
        count = self.options.processes or min(len(configs), 16)
        devices = [t.id for t in self.farm.turbines]
        for index, (chunk, names) in enumerate(
            zip(group(configs, count), group(devices, count), strict=True)
        ):
            host = HostProcess(chunk, names, self.directory / "agents" / f"host-{index:02d}.log")
            self.hosts.append(host.start())
            for name in names:
                self.host_of[name] = host
        self.say(
            f"agents: {len(devices)} turbines in {len(self.hosts)} processes "
            f"(configs and SQLite files under {self.directory / 'agents'})"
        )
        timeout = 60 + 0.5 * len(devices)
        if not self.monitor.wait_for(lambda seen: self._online(seen) >= len(devices), timeout):
            raise SimulationError(
                f"only {self._online(self.monitor.seen)} of {len(devices)} agents came online "
                f"within {timeout:.0f} s; see {self.directory / 'agents'}/host-*.log"
            )
        self._timed("agents online", started)
        self.say(
            f"agents: all {len(devices)} online in {self.log.setup_seconds['agents online']} s"
        )

    @staticmethod
    def _online(seen) -> int:
        return sum(status.online for status in latest_statuses(seen).values())

    def _send_base(self) -> None:
        started = time.perf_counter()
        targets = base_targets(self.farm, self.graph, self.cloud.streams)
        windows = stream_target(self.cloud.streams[WINDOWS_STREAM])  # (its @window, @watch)
        for device, target in targets.items():
            self.log.base_sent[device] = time.time()
            self.cloud.publisher.send(device, "base", target)
            self.cloud.publisher.send(device, WINDOWS_STREAM, windows)
        self.cloud.publisher.flush()
        devices = set(targets)

        def applied(seen) -> bool:
            done = {
                d
                for _, d, s in seen.statuses
                if s.applied.get("base", 0) >= 1 and s.applied.get(WINDOWS_STREAM, 0) >= 1
            }
            return devices <= done

        if not self.monitor.wait_for(applied, 60 + 0.2 * len(devices)):
            raise SimulationError(
                "not every agent applied its base and windows bundles within the time-out"
            )
        self._timed("base bundles applied", started)
        self.say(
            f"cloud: base bundles ({len(self.cloud.streams['base'])} rules + the device's "
            f"topology facts) and window rules ({len(windows.rules)} rules) applied on all "
            f"{len(devices)} turbines in {self.log.setup_seconds['base bundles applied']} s"
        )

    # ------------------------------------------------------------------ the scenario
    def _scenario(self) -> None:
        options, schedule = self.options, self.schedule
        self.controller = mqtt_client(
            f"zodiac-sim-controllers-{uuid.uuid4().hex[:6]}", reconnect=(1, 2)
        )
        self.controller.connect(self.host, self.port, keepalive=10)
        self.controller.loop_start()
        self.say(
            f"scenario: {options.duration:g} s, readings every {options.period:g} s; "
            f"{self.farm.broken}'s ambient sensor fails ({options.sensor_fault}) at "
            f"t={schedule.fault_at:g} s, warm air reaches {self.farm.warm} at "
            f"t={schedule.warm_at:g} s"
            + "".join(f"; {name} at t={at:g} s" for name, at in schedule.faults.items())
        )
        pending = dict(schedule.faults)
        restarts: list[tuple[float, HostProcess]] = []
        self.log.t0 = t0 = time.time()
        tick, next_progress, last_progress = 0, 0.0, ""
        while True:
            t = tick * options.period
            if t > options.duration:
                break
            self._sleep_until(t0 + t)
            for turbine in self.farm.turbines:
                self._send_readings(turbine.id, self.model.readings(turbine.id, t))
            for name, at in list(pending.items()):
                if t >= at:
                    del pending[name]
                    restarts += self._inject(name, t)
            for when, host in list(restarts):
                if t >= when:
                    restarts.remove((when, host))
                    host.start()
                    self._fault("agent restarted", t, devices=host.devices)
            progress = self._progress(t)
            if progress != last_progress or t >= next_progress:
                self.say(f"  t={t:5.1f} s  {progress}  messages: {self._messages()}")
                last_progress, next_progress = progress, t + 10.0
            tick += 1

    def _sleep_until(self, wall: float) -> None:
        delay = wall - time.time()
        if delay > 0:
            time.sleep(delay)

    def _send_readings(self, device: str, facts: list[tuple]) -> None:
        payload = Telemetry(
            device=device,
            farm=self.farm.farm_id,
            readings=[list(f) for f in facts],
            sent_at=time.time(),
        )
        self.log.readings.setdefault(device, []).append((payload.sent_at, float(facts[0][2])))
        self.controller.publish(
            f"zodiac/{self.farm.farm_id}/{device}/readings", encode_model(payload), qos=1
        )

    def _fault(self, name: str, t: float, **details) -> None:
        self.log.faults.append({"fault": name, "t": round(t, 2), "at": time.time(), **details})
        self.say(f"  t={t:5.1f} s  fault: {name} {details if details else ''}".rstrip())

    def _inject(self, name: str, t: float) -> list[tuple[float, HostProcess]]:
        if name == "agent-kill":
            host = self.host_of[self.farm.warm]
            host.kill()
            self._fault("agent killed (SIGKILL)", t, devices=host.devices)
            return [(t + 2.0, host)]
        if name == "broker-restart":
            self._fault("broker stopped", t)
            self.broker.stop()
            time.sleep(1.0)
            self.broker.start()
            self._fault("broker restarted", t + 1.0)
        elif name == "burst":
            self._burst(t)
        elif name == "tampered-bundle":
            self._tampered(t)
        return []

    def _bystander(self) -> str:
        """A turbine that plays no part in the scenario (for the burst and the tampering)."""
        involved = {self.farm.broken, self.farm.warm}
        return next(t.id for t in reversed(self.farm.turbines) if t.id not in involved)

    def _burst(self, t: float) -> None:
        device = self._bystander()
        normal = self.model.true_temperature(device, t)
        marker = round(normal + 0.35, 1)
        started = time.time()
        for i in range(BURST_MESSAGES):
            value = marker if i == BURST_MESSAGES - 1 else round(normal + (i % 3 - 1) * 0.1, 1)
            facts = self.model.readings(device, t)
            facts[0] = (TEMPERATURE, device, value)
            self._send_readings(device, facts)
        self.log.burst = {
            "device": device,
            "messages": BURST_MESSAGES,
            "marker": marker,
            "started": started,
            "sent": time.time(),
        }
        self._fault("burst of readings", t, device=device, messages=BURST_MESSAGES)

    def _tampered(self, t: float) -> None:
        device = self._bystander()
        publisher = self.cloud.publisher
        bundle = Bundle(
            bundle_id=f"tampered-{uuid.uuid4().hex[:8]}",
            farm=self.farm.farm_id,
            device=device,
            stream="base",
            version=publisher.cutter.version(device, "base") + 1,
            issued_at=time.time(),
            expires_at=time.time() + 3600,
            operations=[
                AddRules(rules=[RuleSpec(id="evil", text="evil: <Stop>(X) :- <WindTurbine>(X) .")])
            ],
        )
        payload = bytearray(sign_bundle(bundle, self.cloud.private_key, "cloud"))
        index = payload.find(b"evil: <Stop>")
        payload[index] ^= 0x01  # one flipped bit in the signed body
        publisher.client.publish(
            f"zodiac/{self.farm.farm_id}/{device}/bundle", bytes(payload), qos=1
        )
        self.log.tampered = {"device": device, "bundle_id": bundle.bundle_id, "at": time.time()}
        self._fault("tampered bundle", t, device=device)

    def _progress(self, t: float) -> str:
        seen = self.monitor.seen
        with self.monitor.lock:
            requested = sorted({d for _, d, _ in seen.requests})
            found = {}
            for _, device, status in seen.statuses:
                for fact in status.findings:
                    found[device] = fact[2] if len(fact) == 3 else fact[0]
        return (
            f"requests: {', '.join(requested) or '-'}  diagnoses: "
            + (", ".join(f"{d}={p}" for d, p in sorted(found.items())) or "-")
            + f"  released: {len(self.cloud.publisher.resolved)}"
        )

    def _messages(self) -> int:
        with self.monitor.lock:
            return sum(self.monitor.seen.messages.values())

    def _wait_for_releases(self) -> None:
        """Give the last diagnoses and releases a few seconds after the readings stop."""
        publisher = self.cloud.publisher
        findings = self.model.expected_findings()
        # A frozen sensor is diagnosed by the window rules the turbine holds all the time: no
        # request, nothing to release; the others by the anomaly stream, then released.
        frozen = {d for d, finding in findings.items() if finding == FROZEN_SENSOR}
        expected = set(findings) - frozen

        def settled(seen) -> bool:
            released = {device for device, *_ in publisher.resolved}
            if not expected <= released:
                return False
            latest = latest_statuses(seen)
            resident = self.cloud.resident_rules
            return all(latest.get(d) and latest[d].rules == resident for d in expected) and all(
                latest.get(d) and any(FROZEN_SENSOR in map(str, f) for f in latest[d].findings)
                for d in frozen
            )

        # Scaled with the farm, as the set-up's time-outs are: a large farm on a small machine
        # runs behind its readings (agents, monitor and publisher all wait for a core), and its
        # last diagnoses and releases come well after the last reading was sent.
        timeout = 15.0 + 0.1 * len(self.farm.turbines)
        if not self.monitor.wait_for(settled, timeout):
            self.log.notes.append(
                f"not every expected diagnosis was released within {timeout:.0f} s of the end"
            )
        if self.log.burst:
            marker = self.log.burst["marker"]
            device = self.log.burst["device"]
            self.monitor.wait_for(lambda seen: self._burst_drained(device, marker) is not None, 10)
            self.log.burst["drained"] = self._burst_drained(device, marker)
        time.sleep(1.0)  # last statuses

    def _burst_drained(self, device: str, marker: float) -> float | None:
        """When the burst's last reading came back as the device's telemetry."""
        for at, who, value in self.monitor.seen_telemetry():
            if who == device and value == marker and at >= self.log.burst["started"]:
                return at
        return None

    # ------------------------------------------------------------------ tear-down
    def _shutdown(self) -> None:
        if self.controller is not None:
            self.controller.disconnect()
            self.controller.loop_stop()
        for host in self.hosts:
            host.terminate()
        if self.cloud is not None:
            self.cloud.publisher.stop()
        if self.monitor is not None:
            self.monitor.stop()
        if self.broker is not None:
            self.broker.stop()
