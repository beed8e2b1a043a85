"""What ``zodiac-cloud publish`` waits for: each addressed device's answer to its bundle, read
from the device's retained status (``zodiac/<farm>/<device>/status``).

A device answers every bundle it applies or refuses with a new status (agent/sync.py): an
applied bundle shows as the stream's version in ``applied``; a refusal as ``last_error``, a JSON
object with the ``reason``, the ``message`` and the ``bundle_id`` (agent/service.py). A bundle
refused before its signature was checked (an unknown key, a bad signature, a malformed payload)
names no bundle: the device cannot trust what such a payload says about itself. So:

* *applied*: a status (retained or new) whose ``applied`` holds the version sent, or a later one;
* *refused*: a status published after the bundle (not the retained one the subscription
  delivers first) whose ``last_error`` names this bundle, or names no bundle and is not the
  error the device reported before (then it is about a payload that came in meanwhile: ours);
* otherwise, at the deadline, *no answer*: the device is offline (the broker keeps the bundle
  for its session), or does not read its topic.

A dry-run bundle (:meth:`StatusWaiter.expect_dry_run`) is answered by a status whose
``dry_run`` report names it (agent/budgets/dry_runs.py), or refused as above when the device
could not read it as far as its dry-run flag (an expired bundle, another audience).

Its own MQTT client, subscribed before the bundles go out (so no answer is missed), apart from
the publisher's: ``publish`` must not answer requests or version gaps (``serve`` does).
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass

import paho.mqtt.client as mqtt

from agent.protocol.messages import BundleError, DeviceStatus, DryRunReport, decode_status
from agent.protocol.mqtt import mqtt_client

__all__ = ["Answer", "StatusWaiter"]


@dataclass(frozen=True)
class Answer:
    """A device's answer to one bundle: ``applied`` (with the version it holds), ``refused``
    (with the reason and message) or ``no answer``."""

    device: str
    outcome: str
    version: int | None = None
    reason: str = ""
    message: str = ""
    status: DeviceStatus | None = None  # the status that answered (None: no answer)
    dry_run: DryRunReport | None = None  # a dry run's report (outcome ``dry run``)

    def line(self, stream: str) -> str:
        if self.outcome == "applied":
            return f"{self.device}: applied {stream} version {self.version}"
        if self.outcome == "refused":
            return f"{self.device}: refused {stream}: {self.reason}: {self.message}"
        return f"{self.device}: no answer (is the agent running and connected?)"


@dataclass
class _Expected:
    source: str  # the device's name of the stream (``all:<stream>`` farm-wide)
    version: int
    bundle_id: str | None  # None: nothing sent (unchanged), the device should hold it already
    dry_run: bool = False  # the bundle is a dry run: answered by the status's ``dry_run``


class StatusWaiter:
    """Follows the status topics of ``devices`` of ``farm`` (see the module docstring)."""

    def __init__(
        self,
        farm: str,
        devices: list[str],
        *,
        host: str,
        port: int,
        username: str | None = None,
        password: str | None = None,
    ) -> None:
        self.farm = farm
        self.devices = list(dict.fromkeys(devices))
        self.lock = threading.Condition()
        self.retained: dict[str, DeviceStatus] = {}  # the status held before our bundles
        self.fresh: dict[str, list[DeviceStatus]] = {d: [] for d in self.devices}
        self.subscribed = threading.Event()
        self.expected: dict[str, _Expected] = {}
        self.client = mqtt_client(
            f"zodiac-cloud-{farm}-wait-{os.getpid()}", username=username, password=password
        )
        self.client.on_connect = self._on_connect
        self.client.on_subscribe = self._on_subscribe
        self.client.on_message = self._on_message
        self.host, self.port = host, port

    def start(self, timeout: float = 10) -> StatusWaiter:
        """Connect and subscribe; return once the broker acknowledged the subscriptions."""
        self.client.connect(self.host, self.port, keepalive=30)
        self.client.loop_start()
        if not self.subscribed.wait(timeout):
            self.stop()
            raise TimeoutError(f"the broker {self.host}:{self.port} did not accept the client")
        return self

    def stop(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()

    def _on_connect(self, client, userdata, flags, reason_code, properties) -> None:
        if reason_code.is_failure:
            return
        client.subscribe([(f"zodiac/{self.farm}/{d}/status", 1) for d in self.devices])

    def _on_subscribe(self, client, userdata, mid, reason_codes, properties) -> None:
        self.subscribed.set()

    def _on_message(self, client, userdata, message: mqtt.MQTTMessage) -> None:
        device = message.topic.split("/")[2]
        try:
            status = decode_status(message.payload)
        except BundleError:
            return  # (not a status: nothing to learn from it)
        with self.lock:
            if message.retain:
                self.retained[device] = status
            else:
                self.fresh.setdefault(device, []).append(status)
            self.lock.notify_all()

    def expect(self, device: str, source: str, version: int, bundle_id: str | None) -> None:
        """The device is to hold ``version`` of ``source``; ``bundle_id`` is the bundle sent
        for it (None: nothing was sent, it should hold it already)."""
        with self.lock:
            self.expected[device] = _Expected(source, version, bundle_id)

    def expect_dry_run(self, device: str, source: str, version: int, bundle_id: str) -> None:
        """The device is to answer the dry-run bundle ``bundle_id`` in its status."""
        with self.lock:
            self.expected[device] = _Expected(source, version, bundle_id, dry_run=True)

    def wait(self, timeout: float) -> list[Answer]:
        """Every expected device's answer, waiting at most ``timeout`` seconds in all."""
        deadline = time.monotonic() + timeout
        answers: dict[str, Answer] = {}
        with self.lock:
            while True:
                for device in self.expected:
                    if device not in answers:
                        answer = self._answer(device)
                        if answer is not None:
                            answers[device] = answer
                left = deadline - time.monotonic()
                if len(answers) == len(self.expected) or left <= 0:
                    break
                self.lock.wait(left)
        return [answers.get(d, Answer(d, "no answer")) for d in self.expected]

    def _answer(self, device: str) -> Answer | None:
        expected = self.expected[device]
        retained = self.retained.get(device)
        before = retained.last_error if retained is not None else None
        if expected.dry_run:
            for status in self.fresh.get(device, []):
                report = status.dry_run
                if report is not None and report.bundle_id == expected.bundle_id:
                    return Answer(
                        device,
                        "dry run",
                        report.version,
                        report.verdict,
                        report.message,
                        status=status,
                        dry_run=report,
                    )
        else:
            for status in [*([retained] if retained else []), *self.fresh.get(device, [])]:
                held = status.applied.get(expected.source, 0)
                if held >= expected.version:
                    return Answer(device, "applied", version=held, status=status)
        if expected.bundle_id is None:
            return None  # (nothing sent: no refusal can be about it)
        for status in self.fresh.get(device, []):
            error = last_error_fields(status.last_error)
            if not error:
                continue
            about = error.get("bundle_id")
            if about == expected.bundle_id or (about is None and status.last_error != before):
                return Answer(
                    device,
                    "refused",
                    version=expected.version,
                    reason=str(error.get("reason", "refused")),
                    message=" ".join(str(error.get("message", "")).split()),
                    status=status,
                )
        return None


def last_error_fields(text: str | None) -> dict:
    """A status's ``last_error`` (JSON: reason, message, stream, bundle_id...) as a dict; {}
    when there is none or it does not read as one."""
    try:
        error = json.loads(text) if text else {}
    except ValueError:
        return {}
    return error if isinstance(error, dict) else {}
