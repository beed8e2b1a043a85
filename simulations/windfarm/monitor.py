"""A passive MQTT observer of the whole farm: every message on ``zodiac/<farm>/#`` and the broker's
``$SYS`` counters, time-stamped on arrival. The report is computed from what it saw, the way an
operator would see the farm, not from inside the agents.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import paho.mqtt.client as mqtt

from agent.protocol.keys import KeyRing
from agent.protocol.messages import (
    Bundle,
    BundleError,
    DeviceStatus,
    Event,
    RuleRequest,
    decode_event,
    decode_request,
    decode_status,
    decode_telemetry,
)
from agent.protocol.mqtt import mqtt_client
from agent.protocol.signing import open_bundle
from simulations.windfarm.farm import TEMPERATURE

SYS_COUNTERS = {
    "$SYS/broker/messages/received": "messages received",
    "$SYS/broker/messages/sent": "messages sent",
    "$SYS/broker/bytes/received": "bytes received",
    "$SYS/broker/bytes/sent": "bytes sent",
}


@dataclass
class Seen:
    """Everything observed, in arrival order (times are ``time.time()``)."""

    messages: Counter = field(default_factory=Counter)  # kind -> count
    payload_bytes: Counter = field(default_factory=Counter)  # kind -> bytes
    statuses: list[tuple[float, str, DeviceStatus]] = field(default_factory=list)
    requests: list[tuple[float, str, RuleRequest]] = field(default_factory=list)
    bundles: list[tuple[float, str, Bundle | None, int]] = field(default_factory=list)
    temperatures: list[tuple[float, str, float]] = field(default_factory=list)  # readings
    telemetry: list[tuple[float, str, float]] = field(default_factory=list)  # agents' telemetry
    events: list[tuple[float, str, Event]] = field(default_factory=list)  # agents' events
    # $SYS counter -> values per broker life (a restarted broker counts from zero again).
    sys_counters: dict[str, list[int]] = field(default_factory=dict)


def latest_statuses(seen: Seen) -> dict[str, DeviceStatus]:
    """Each device's last status (call with the monitor's lock held, e.g. in ``wait_for``)."""
    return {device: status for _, device, status in seen.statuses}


class Monitor:
    def __init__(self, farm_id: str, host: str, port: int, keyring: KeyRing) -> None:
        self.farm_id = farm_id
        self.keyring = keyring
        self.seen = Seen()
        self.lock = threading.Condition()
        self.client = mqtt_client(f"zodiac-sim-monitor-{farm_id}", reconnect=(1, 2))
        self.client.on_connect = self._on_connect
        self.client.on_message = self._on_message
        self.host, self.port = host, port
        self.connected = threading.Event()

    def start(self) -> Monitor:
        self.client.connect(self.host, self.port, keepalive=10)
        self.client.loop_start()
        if not self.connected.wait(10):
            raise RuntimeError(f"monitor: cannot connect to the broker at {self.host}:{self.port}")
        return self

    def stop(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()

    def _on_connect(self, client, userdata, flags, reason_code, properties) -> None:
        if reason_code.is_failure:
            return
        client.subscribe([(f"zodiac/{self.farm_id}/#", 1), ("$SYS/broker/#", 0)])
        with self.lock:
            for values in self.seen.sys_counters.values():
                values.append(0)  # a new broker life (after a restart) starts counting at 0
        self.connected.set()

    def _on_message(self, client, userdata, message: mqtt.MQTTMessage) -> None:
        now = time.time()
        topic = message.topic
        payload = bytes(message.payload)
        with self.lock:
            if topic.startswith("$SYS/"):
                self._sys(topic, payload)
                return
            parts = topic.split("/")
            if len(parts) != 4:
                return
            device, kind = parts[2], parts[3]
            self.seen.messages[kind] += 1
            self.seen.payload_bytes[kind] += len(payload)
            try:
                if kind == "status":
                    self.seen.statuses.append((now, device, decode_status(payload)))
                elif kind == "request":
                    self.seen.requests.append((now, device, decode_request(payload)))
                elif kind == "events":
                    self.seen.events.append((now, device, decode_event(payload)))
                elif kind == "bundle":
                    self.seen.bundles.append((now, device, self._bundle(payload), len(payload)))
                elif kind in ("readings", "telemetry"):
                    into = self.seen.temperatures if kind == "readings" else self.seen.telemetry
                    for fact in decode_telemetry(payload).fact_tuples():
                        if fact[0] == TEMPERATURE:
                            into.append((now, device, float(fact[2])))
            except BundleError:
                pass  # counted above; not ours to judge (the agents refuse and report)
            self.lock.notify_all()

    def _bundle(self, payload: bytes) -> Bundle | None:
        try:
            return open_bundle(payload, self.keyring)
        except BundleError:
            return None  # e.g. the tampered bundle of the fault injection

    def _sys(self, topic: str, payload: bytes) -> None:
        if topic not in SYS_COUNTERS:
            return
        try:
            value = int(payload)
        except ValueError:
            return
        values = self.seen.sys_counters.setdefault(topic, [0])
        values[-1] = max(values[-1], value)

    # ------------------------------------------------------------------ queries
    def wait_for(self, predicate, timeout: float) -> bool:
        """Wait until ``predicate(seen)`` holds (evaluated under the lock)."""
        with self.lock:
            return self.lock.wait_for(lambda: predicate(self.seen), timeout)

    def seen_telemetry(self) -> list[tuple[float, str, float]]:
        with self.lock:
            return list(self.seen.telemetry)

    def latest_statuses(self) -> dict[str, DeviceStatus]:
        with self.lock:
            return latest_statuses(self.seen)

    def broker_totals(self) -> dict[str, int]:
        """$SYS counters summed over the broker's lives (empty if $SYS was never seen)."""
        with self.lock:
            return {
                SYS_COUNTERS[topic]: sum(values) for topic, values in self.seen.sys_counters.items()
            }
