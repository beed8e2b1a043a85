"""The cloud's MQTT service: publishes bundles to devices, answers their rule requests, releases
rules when an event is over, and follows every device's retained status.

It never needs Spark to answer: targets come from the rule streams under ``rules/`` and from the
latest facts cut per device (:class:`cloud.bundles.BundleCutter` remembers what each device was
sent). Every bundle is signed for its audience (the farm, and the device or the whole farm)
and expires after the cutter's time to live. An answer goes to the requesting device's own
bundle topic (never to a response topic the request names) with the request's correlation
data and the request's id in the signed ``answers`` field, by which the device links the
answering stream to its request. A device whose status reports a
``version_gap`` gets the stream's full state.

When is an event over? Devices report their findings (derived facts of their configured
``findings`` predicates, e.g. ``SensorAnomalyWindTurbine``) in their retained status.
``resolutions`` maps a stream to the finding predicates that settle it: as soon as a device that
was sent the stream reports such a finding, the cause is known, the publisher records it and
releases the stream (a bundle deleting its rules), and the device returns to its base rules.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable

import paho.mqtt.client as mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from agent.engine.language import RDF_TYPE
from agent.messages import (
    Bundle,
    BundleError,
    DeviceStatus,
    decode_request,
    decode_status,
    fact_tuple,
)
from agent.signing import sign_bundle
from cloud.bundles import BundleCutter, Target

log = logging.getLogger("zodiac.cloud")


def finding_predicate(fact: tuple) -> str:
    """The predicate a finding is about: its class for ``rdf:type`` facts (``<C>(x)``)."""
    return fact[2] if fact[0] == RDF_TYPE and len(fact) == 3 else fact[0]


class Publisher:
    """See the module docstring. ``streams`` maps a stream name to {rule id: rule text};
    ``event_streams`` maps a request's event to the stream that answers it (default: the
    stream named like the event)."""

    def __init__(
        self,
        farm: str,
        cutter: BundleCutter,
        streams: dict[str, dict[str, str]],
        private_key,
        key_id: str,
        *,
        host: str = "127.0.0.1",
        port: int = 1883,
        username: str | None = None,
        password: str | None = None,
        event_streams: dict[str, str] | None = None,
        resolutions: dict[str, list[str]] | None = None,
        client_id: str | None = None,
        listen: bool = True,
    ) -> None:
        self.farm = farm
        self.cutter = cutter
        self.streams = streams
        self.private_key = private_key
        self.key_id = key_id
        self.event_streams = event_streams or {}
        self.statuses: dict[str, DeviceStatus] = {}
        self.requests: list[tuple[str, str, str]] = []  # (device, event, stream) answered
        self.resolutions = {s: set(p) for s, p in (resolutions or {}).items()}
        # (device, stream, finding, time): the causes reported, in order.
        self.resolved: list[tuple[str, str, tuple, float]] = []
        self.lock = threading.Lock()
        self.changed = threading.Condition(self.lock)
        self.client = mqtt.Client(
            mqtt.CallbackAPIVersion.VERSION2,
            client_id=client_id or f"zodiac-cloud-{farm}",
            protocol=mqtt.MQTTv5,
        )
        if username:
            self.client.username_pw_set(username, password)
        self.client.on_connect = self._on_connect
        self.client.on_message = self._on_message
        self.host, self.port = host, port
        # False: only publish (``zodiac-cloud publish``); the running ``serve`` answers devices.
        self.listen = listen
        self.on_status: Callable[[DeviceStatus], None] | None = None
        self.pending: list[mqtt.MQTTMessageInfo] = []

    def flush(self, timeout: float = 10) -> None:
        """Wait until every bundle published so far was acknowledged by the broker."""
        for info in self.pending:
            info.wait_for_publish(timeout)
        self.pending.clear()

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> Publisher:
        self.client.connect(self.host, self.port, keepalive=30)
        self.client.loop_start()
        return self

    def stop(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()

    def _on_connect(self, client, userdata, flags, reason_code, properties) -> None:
        if reason_code.is_failure:
            log.error("connection refused: %s", reason_code)
            return
        if not self.listen:
            return
        client.subscribe(
            [(f"zodiac/{self.farm}/+/status", 1), (f"zodiac/{self.farm}/+/request", 1)]
        )

    def _on_message(self, client, userdata, message: mqtt.MQTTMessage) -> None:
        device = message.topic.split("/")[2]
        try:
            if message.topic.endswith("/status"):
                self._status(device, decode_status(message.payload))
            elif message.topic.endswith("/request"):
                self._request(device, message)
        except BundleError as error:
            log.warning("bad message from %s: %s", device, error)
        except Exception:  # noqa: BLE001 - one bad device must not stop the service
            log.exception("while handling %s", message.topic)

    # ------------------------------------------------------------------ behaviour
    def publish(self, device: str, bundle: Bundle, *, correlation: bytes | None = None) -> None:
        """Sign and publish a bundle (QoS 1) on the device's bundle topic (``zodiac/<farm>/all/
        bundle`` for ``FARM_WIDE``); ``correlation`` answers a request (MQTT v5 correlation
        data)."""
        properties = None
        if correlation is not None:
            properties = Properties(PacketTypes.PUBLISH)
            properties.CorrelationData = correlation
        payload = sign_bundle(bundle, self.private_key, self.key_id)
        info = self.client.publish(
            f"zodiac/{self.farm}/{device}/bundle", payload, qos=1, properties=properties
        )
        self.pending.append(info)
        log.info("published %s v%d to %s", bundle.stream, bundle.version, device)

    def send(self, device: str, stream: str, target: Target) -> Bundle | None:
        """Bring ``device`` to ``target`` on ``stream`` (a difference bundle, if any)."""
        with self.lock:
            bundle = self.cutter.cut(device, stream, target)
        if bundle is not None:
            self.publish(device, bundle)
        return bundle

    def release(self, device: str, stream: str) -> Bundle | None:
        """The event is over: delete the stream's rules and facts on the device."""
        with self.lock:
            bundle = self.cutter.release(device, stream)
        if bundle is not None:
            self.publish(device, bundle)
        return bundle

    def _request(self, device: str, message: mqtt.MQTTMessage) -> None:
        request = decode_request(message.payload)
        stream = self.event_streams.get(request.event, request.event)
        rules = self.streams.get(stream)
        if rules is None:
            log.warning("device %s asked for unknown event %s", device, request.event)
            return
        target = Target(rules=dict(rules))
        with self.lock:
            bundle = self.cutter.cut(device, stream, target)
            if bundle is None:  # the device should already have it: send it whole again
                bundle = self.cutter.full_state(device, stream, target)
            self.requests.append((device, request.event, stream))
        # Which request this answers is signed (``answers``): the device links the request to
        # the stream by it. The correlation data is set too, as MQTT v5 requests expect.
        bundle = bundle.model_copy(update={"answers": request.request_id})
        props = getattr(message, "properties", None)
        correlation = getattr(props, "CorrelationData", None) or request.request_id.encode()
        # Always on the requesting device's own bundle topic, whatever response topic the
        # request names: a device must not be able to have the cloud publish rules cut for it
        # on another device's topic (the bundle's signed audience would refuse them there
        # too, but it is not the cloud's business to deliver them).
        self.publish(device, bundle, correlation=correlation)
        log.info(
            "answered %s's request for %s with %s v%d",
            device,
            request.event,
            stream,
            bundle.version,
        )

    def _status(self, device: str, status: DeviceStatus) -> None:
        with self.changed:
            self.statuses[device] = status
            self.changed.notify_all()
        error = json.loads(status.last_error) if status.last_error else {}
        stream = error.get("stream")
        if error.get("reason") == "version_gap" and stream:
            applied = status.applied.get(stream, 0)
            with self.lock:
                if self.cutter.version(device, stream) > applied:
                    bundle = self.cutter.full_state(device, stream)
                else:
                    bundle = None
            if bundle is not None:
                log.info("device %s reported a gap on %s: full state sent", device, stream)
                self.publish(device, bundle)
        self._resolve(device, status)
        if self.on_status is not None:
            self.on_status(status)

    def _resolve(self, device: str, status: DeviceStatus) -> None:
        """Release every answered stream that one of the device's findings settles."""
        findings = [fact_tuple(f) for f in status.findings]
        for stream, predicates in self.resolutions.items():
            settled = [f for f in findings if finding_predicate(f) in predicates]
            if not settled:
                continue
            with self.lock:
                # Sent and not yet released, as the cutter remembers it (survives restarts).
                if not self.cutter.last_target(device, stream).rules:
                    continue
                self.resolved.append((device, stream, settled[0], time.time()))
            log.info("device %s reported %s: releasing %s", device, settled[0], stream)
            self.release(device, stream)

    def wait_status(self, device: str, predicate, timeout: float = 30) -> DeviceStatus:
        """Block until the device's latest status satisfies ``predicate`` (for tools/tests)."""
        with self.changed:
            ok = self.changed.wait_for(
                lambda: device in self.statuses and predicate(self.statuses[device]), timeout
            )
            if not ok:
                raise TimeoutError(f"{device}: no matching status ({self.statuses.get(device)})")
            return self.statuses[device]
