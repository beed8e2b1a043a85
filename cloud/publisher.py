"""The cloud's MQTT service: publishes bundles to devices, answers their rule requests, releases
rules when an event is over, and follows every device's retained status.

It never needs Spark to answer: targets come from the rule streams under ``rules/`` and from the
latest facts cut per device (:class:`cloud.bundles.BundleCutter` remembers what each device was
sent). Every bundle is signed for its audience (the farm, and the device or the whole farm)
and expires after the cutter's time to live. An answer goes to the requesting device's own
bundle topic (never to a response topic the request names) with the request's correlation
data and the request's id in the signed ``answers`` field, by which the device links the
answering stream to its request. A device whose status reports a ``version_gap`` gets the
stream's full state, once per gap (:meth:`Publisher._recover`).

When is an event over? Devices report their findings (derived facts of their configured
``findings`` predicates, e.g. ``SensorAnomalyWindTurbine``) in their retained status.
``resolutions`` maps a stream to the finding predicates that settle it: as soon as a device that
was sent the stream reports such a finding, the cause is known, the publisher records it and
releases the stream (a bundle deleting its rules), and the device returns to its base rules.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections import Counter
from collections.abc import Callable

import paho.mqtt.client as mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from agent.engine.language import RDF_TYPE
from agent.protocol.messages import (
    FARM_WIDE,
    Bundle,
    BundleError,
    DeviceStatus,
    Event,
    decode_event,
    decode_request,
    decode_status,
    fact_tuple,
)
from agent.protocol.mqtt import mqtt_client
from agent.protocol.signing import sign_bundle
from cloud.bundles import BundleCutter, Target, stream_target
from cloud.events import keep_event

log = logging.getLogger("zodiac.cloud")

# Seconds a full state sent for a gap is taken to be on its way (a device that still reports
# the gap meanwhile gets no other one); after that, it was probably lost and is sent again.
FULL_STATE_TIMEOUT = 60.0
# Seconds the answer to a rule request is taken to be on its way when the same request comes
# again: shorter than the 30 s a device waits before asking again (agent/service.py), so that
# a device asking again after its timeout gets its answer again.
ANSWER_TIMEOUT = 10.0
# Rule requests one device may make per minute (in bursts of as many): a device asks once per
# event, and again after 30 s without an answer; more is a loop or an attack, and each answer
# may cost a signed bundle.
MAX_REQUESTS_PER_MINUTE = 6.0
# Seconds between two warnings about one device's ignored requests (the rest: debug lines).
WARNING_INTERVAL = 60.0
# Seconds the broker keeps serve's session (and the events for it) while serve is away.
SESSION_EXPIRY = 7 * 24 * 3600


def last_error(status: DeviceStatus) -> dict:
    """A status's ``last_error`` (JSON made by the device), or {} when none or unreadable."""
    try:
        error = json.loads(status.last_error) if status.last_error else {}
    except ValueError:
        return {}
    return error if isinstance(error, dict) else {}


def audience_of(device: str, source: str) -> tuple[str, str]:
    """The cutter's (device, stream) of a device's source: ``all:<stream>`` is the farm-wide
    stream (cut for ``FARM_WIDE``), anything else the device's own."""
    prefix, colon, stream = source.partition(":")
    return (FARM_WIDE, stream) if colon and prefix == FARM_WIDE else (device, source)


def gap_version(error: dict, applied: int) -> int:
    """The version of the bundle a ``version_gap`` refused: the error's ``version``; from a
    device that does not report it, read from the message (``version 7 skips versions``), or
    else taken as the next one after what is applied."""
    version = error.get("version")
    if isinstance(version, int) and not isinstance(version, bool):
        return version
    found = re.search(r"version (\d+) skips", str(error.get("message", "")))
    return int(found[1]) if found else applied + 1


def finding_predicate(fact: tuple) -> str:
    """The predicate a finding is about: its class for ``rdf:type`` facts (``<C>(x)``)."""
    return fact[2] if fact[0] == RDF_TYPE and len(fact) == 3 else fact[0]


class Publisher:
    """See the module docstring. ``streams`` maps a stream name to {rule id: rule text};
    ``event_streams`` maps each event a device may request to the stream that answers it (by
    default, each stream of ``resolutions`` answers the event of its name): a request for any
    other event (``base``, say) is ignored."""

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
        full_state_timeout: float = FULL_STATE_TIMEOUT,
        max_requests_per_minute: float = MAX_REQUESTS_PER_MINUTE,
    ) -> None:
        self.farm = farm
        self.cutter = cutter
        self.streams = streams
        self.private_key = private_key
        self.key_id = key_id
        self.full_state_timeout = full_state_timeout
        self.statuses: dict[str, DeviceStatus] = {}
        self.requests: list[tuple[str, str, str]] = []  # (device, event, stream) answered
        self.resolutions = {s: set(p) for s, p in (resolutions or {}).items()}
        self.event_streams = (
            dict(event_streams) if event_streams is not None else {s: s for s in self.resolutions}
        )
        self.max_requests_per_minute = max_requests_per_minute
        # (device, what became of the request): answered, held already, on its way, not an
        # answerable event, over the rate limit.
        self.request_outcomes: Counter[tuple[str, str]] = Counter()
        self._request_tokens: dict[str, tuple[float, float]] = {}  # device: tokens, when
        self._warned_at: dict[tuple[str, str], float] = {}
        # (device, stream, finding, time): the causes reported, in order.
        self.resolved: list[tuple[str, str, tuple, float]] = []
        self.lock = threading.Lock()
        self.changed = threading.Condition(self.lock)
        self.client = mqtt_client(
            client_id or f"zodiac-cloud-{farm}", username=username, password=password
        )
        self.client.on_connect = self._on_connect
        self.client.on_message = self._on_message
        self.host, self.port = host, port
        # False: only publish (``zodiac-cloud publish``); the running ``serve`` answers devices.
        self.listen = listen
        self.on_status: Callable[[DeviceStatus], None] | None = None
        self.pending: list[mqtt.MQTTMessageInfo] = []
        self.events_kept = 0  # devices' events kept (copies of one event count once)

    def flush(self, timeout: float = 10) -> None:
        """Wait until every bundle published so far was acknowledged by the broker."""
        for info in self.pending:
            info.wait_for_publish(timeout)
        self.pending.clear()

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> Publisher:
        """Connect; a listening publisher (``serve``) with a persistent session, so that the
        devices' events (QoS 1) published while it is away wait for it at the broker."""
        if self.listen:
            props = Properties(PacketTypes.CONNECT)
            props.SessionExpiryInterval = SESSION_EXPIRY
            self.client.connect(
                self.host, self.port, keepalive=30, clean_start=False, properties=props
            )
        else:
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
            [
                (f"zodiac/{self.farm}/+/status", 1),
                (f"zodiac/{self.farm}/+/request", 1),
                (f"zodiac/{self.farm}/+/events", 1),
            ]
        )

    def _on_message(self, client, userdata, message: mqtt.MQTTMessage) -> None:
        device = message.topic.split("/")[2]
        try:
            if message.topic.endswith("/status"):
                self._status(device, decode_status(message.payload))
            elif message.topic.endswith("/request"):
                self._request(device, message)
            elif message.topic.endswith("/events"):
                self._event(device, decode_event(message.payload))
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
        """Answer a rule request with the bundle that brings the device to the event's stream.

        Only events of ``event_streams`` are answered, at most ``max_requests_per_minute`` per
        device. A request asked again (a device's answer lost, or a replay) cuts no new version
        when the device holds the stream at its current target already (its status says so) or
        the last bundle of the stream went out less than ``ANSWER_TIMEOUT`` ago (on its way):
        nothing is sent, and the device, whose request stays open, asks again after its own
        timeout. Otherwise (the answer was lost) the full state goes out again."""
        request = decode_request(message.payload)
        if not self._within_request_rate(device):
            self._ignore_request(device, "over the rate limit", request.event)
            return
        stream = self.event_streams.get(request.event)
        rules = self.streams.get(stream) if stream is not None else None
        if rules is None:
            self._ignore_request(device, "not an answerable event", request.event)
            return
        target = stream_target(rules)
        with self.lock:
            bundle = self.cutter.cut(device, stream, target)
            if bundle is None:
                bundle, outcome = self._answer_again(device, stream, target)
            else:
                outcome = "answered"
            self.request_outcomes[(device, outcome)] += 1
            version = self.cutter.version(device, stream)
            if bundle is not None:
                self.requests.append((device, request.event, stream))
        if bundle is None:
            log.info(
                "%s's request for %s: %s (v%d), nothing sent",
                device,
                request.event,
                outcome,
                version,
            )
            return
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

    def _answer_again(self, device: str, stream: str, target: Target) -> tuple[Bundle | None, str]:
        """A request for a stream whose target has not changed since it was last sent (see
        :meth:`_request`); call with the lock held."""
        status = self.statuses.get(device)
        applied = status.applied.get(stream, 0) if status is not None else 0
        if applied >= self.cutter.version(device, stream):
            return None, "held already"
        sent_at = self.cutter.last_sent_at(device, stream)
        if sent_at is not None and time.time() - sent_at < ANSWER_TIMEOUT:
            return None, "on its way"
        return self.cutter.full_state(device, stream, target), "answered"

    def _within_request_rate(self, device: str) -> bool:
        """A token bucket per device: ``max_requests_per_minute``, bursts of as many."""
        capacity = self.max_requests_per_minute
        now = time.monotonic()
        tokens, at = self._request_tokens.get(device, (capacity, now))
        tokens = min(capacity, tokens + (now - at) * capacity / 60)
        allowed = tokens >= 1
        self._request_tokens[device] = (tokens - 1 if allowed else tokens, now)
        return allowed

    def _ignore_request(self, device: str, reason: str, event: str) -> None:
        """Count an ignored request; warn at most once a minute per device and reason (a
        device in a loop, or replaying, would otherwise fill the log)."""
        self.request_outcomes[(device, reason)] += 1
        now = time.monotonic()
        key = (device, reason)
        if now - self._warned_at.get(key, float("-inf")) < WARNING_INTERVAL:
            log.debug("ignored %s's request for %s: %s", device, event, reason)
            return
        self._warned_at[key] = now
        log.warning(
            "ignored %s's request for %s: %s (%d so far)",
            device,
            event[:80],
            reason,
            self.request_outcomes[key],
        )

    def _event(self, device: str, event: Event) -> None:
        """Keep a device's event once (cloud/events.py); one that names another device or
        farm than its topic is refused (the broker's ACL says who published there)."""
        if event.device != device or event.farm != self.farm:
            log.warning("event on %s's topic names %s/%s", device, event.farm, event.device)
            return
        with self.lock:
            if keep_event(self.cutter.db, event, time.time()):
                self.events_kept += 1
            self.changed.notify_all()

    def _status(self, device: str, status: DeviceStatus) -> None:
        with self.changed:
            self.statuses[device] = status
            self.changed.notify_all()
        self._recover(device, status)
        self._resolve(device, status)
        if self.on_status is not None:
            self.on_status(status)

    def _recover(self, device: str, status: DeviceStatus) -> None:
        """A device that reports a version gap gets its stream's full state, once per gap.

        Every status repeats the device's last error until the error no longer holds, and
        statuses come after every bundle, at every reconnection, and retained: answering each
        with a new full state (a new version, which the device is then behind of) made a storm.
        A gap is answered unless the last full state cut for that stream already covers it (its
        version is at least the refused bundle's, so it was cut after that bundle) and has been
        applied (the report is older than the recovery) or was sent less than
        ``full_state_timeout`` seconds ago (it is on its way). A gap at a version beyond that
        full state (the full state itself was lost, and a later bundle found the hole) is a new
        gap. The cutter keeps the last full state in its file: a restarted publisher reading a
        retained gap report does not answer it again."""
        error = last_error(status)
        source = error.get("stream")
        if error.get("reason") != "version_gap" or not isinstance(source, str):
            return
        audience, stream = audience_of(device, source)
        applied = status.applied.get(source, 0)
        refused = gap_version(error, applied)
        with self.lock:
            if self.cutter.version(audience, stream) <= applied:
                return  # the device holds everything cut: an old report
            sent = self.cutter.last_full_state(audience, stream)
            if sent is not None and sent.version >= refused:
                if applied >= sent.version:
                    return  # applied: the gap was before the full state
                if time.time() - sent.at < self.full_state_timeout:
                    return  # on its way
            bundle = self.cutter.full_state(audience, stream)
        log.info(
            "device %s reported a gap on %s at version %d (applied %d): full state v%d sent",
            device,
            source,
            refused,
            applied,
            bundle.version,
        )
        self.publish(audience, bundle)

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
