"""The agent's MQTT side (DESIGN §4): paho-mqtt 2.x, MQTT v5, persistent session.

Threads: paho's network loop (``loop_start``) only puts received messages on a queue; the
agent's own thread (:meth:`AgentService.run`) takes them one by one, applies each in one SQLite
transaction and only then acknowledges it (``manual_ack``). A bundle received but not committed
when the process dies is therefore redelivered by the broker at the next connection, and a
bundle delivered twice is a no-op (stream versions). Subscriptions are (re)made in
``on_connect``, so they survive a broker that lost its state; with ``clean_start=False`` and a
session expiry interval, bundles published while the device was away are queued by the broker.

Topics (``zodiac/<farm>/<device>/<kind>``):

============  =========  ======================================================================
kind          direction  payload
============  =========  ======================================================================
bundle        in  QoS 1  a signed bundle envelope (also ``zodiac/<farm>/all/bundle``)
readings      in  QoS 1  the device's own sensor values (msgpack ``Telemetry``; from the
                         turbine controller, unsigned: it is local)
telemetry     in/out     neighbours' readings in, this device's readings out (``Telemetry``)
request       out QoS 1  ``RuleRequest``, with MQTT v5 response topic and correlation data
status        out        ``DeviceStatus``, retained; the last will publishes ``online=False``
events        out QoS 1  ``Event``: the watched facts each change made appear and disappear,
                         from the outbox, in seq order (agent/protocol/event_sender.py)
============  =========  ======================================================================
"""

from __future__ import annotations

import logging
import queue
import signal
import sqlite3
import sys
import threading
import time
from dataclasses import dataclass

import paho.mqtt.client as mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from agent.config import AgentConfig
from agent.protocol.event_sender import EventSender
from agent.protocol.messages import Telemetry, encode_model
from agent.protocol.mqtt import Tls, mqtt_client
from agent.service import Agent, Outcome
from agent.state.agent_state import StateError
from agent.state.outbox import acknowledged, pending_events

log = logging.getLogger("zodiac.sync")

RELOAD = "$reload-keys"  # an inbox item, not a topic: SIGHUP
EVENTS = "$events"  # an inbox item: the broker acknowledged events
TELEMETRY_HEARTBEAT = 30.0  # seconds: unchanged telemetry is re-sent at least this often
# Seconds between two tries of a message whose change could not be made durable (a full disk):
# doubling from the first to the last, so that a disk freed is seen soon, a disk that stays
# full costs a try (a log line, a status) every few seconds at most.
STATE_RETRY_FIRST = 0.5
STATE_RETRY_LAST = 8.0


@dataclass
class Incoming:
    topic: str
    payload: bytes
    mid: int
    qos: int


def client_id(config: AgentConfig) -> str:
    """Stable across restarts: the broker finds the persistent session by it."""
    return f"zodiac-{config.farm}-{config.device}"


def make_client(config: AgentConfig, *, manual_ack: bool = True) -> mqtt.Client:
    """A paho client configured from ``[broker]``: credentials, TLS, back-off."""
    broker = config.broker
    tls = None
    if broker.tls:
        tls = Tls(broker.ca_file, broker.cert_file, broker.key_file, broker.tls_insecure)
    return mqtt_client(
        client_id(config),
        username=broker.username,
        password=broker.resolve_password() if broker.username else None,
        tls=tls,
        manual_ack=manual_ack,
        reconnect=(broker.reconnect_min_delay, broker.reconnect_max_delay),
    )


class AgentService:
    """Runs an :class:`Agent` against the broker until stopped (SIGTERM, SIGINT or stop())."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        self.config = agent.config
        self.inbox: queue.Queue[Incoming] = queue.Queue()
        self.stopping = threading.Event()
        self.connected = threading.Event()
        self.client = make_client(self.config)
        self.client.on_connect = self._on_connect
        self.client.on_connect_fail = self._on_connect_fail
        self.client.on_disconnect = self._on_disconnect
        self.client.on_message = self._on_message
        self.events = EventSender(
            self.client,
            self.config.topic("events"),
            self.config.device,
            self.config.farm,
            lambda after, limit: pending_events(self.agent.state.conn, after, limit),
            lambda seqs: acknowledged(self.agent.state.conn, seqs),
            wake=lambda: self.inbox.put(Incoming(EVENTS, b"", 0, 0)),
        )
        self.client.on_publish = self.events.on_publish
        offline = encode_model(agent.status(online=False))
        self.client.will_set(self.config.topic("status"), offline, qos=1, retain=True)
        self.reported_findings: list | None = None  # as in the last published status
        self.sent_telemetry: tuple[list, float] | None = None  # readings, when
        self.failure: str | None = None  # why the service stopped by itself (see run)
        self.next_tick = 0.0  # when the windows' next expiry batch is due (monotonic)

    # ------------------------------------------------------------------ paho callbacks
    def subscriptions(self) -> list[tuple[str, int]]:
        config = self.config
        topics = [
            config.topic("bundle"),
            config.farm_bundle_topic(),
            config.topic("readings"),
        ]
        topics += config.neighbour_telemetry_topics()
        return [(topic, 1) for topic in topics]

    def _on_connect(self, client, userdata, flags, reason_code, properties) -> None:
        if reason_code.is_failure:
            log.error("connection refused", extra={"fields": {"reason": str(reason_code)}})
            return
        client.subscribe(self.subscriptions())
        log.info("connected", extra={"fields": {"session_present": flags.session_present}})
        self.connected.set()
        self.inbox.put(Incoming("$connected", b"", 0, 0))  # publish status from our thread

    def _on_connect_fail(self, client, userdata) -> None:
        """Log a connection attempt that failed before any CONNACK (then paho retries).

        Without this, a broker that is unreachable or fails the TLS handshake (wrong CA, host
        name mismatch, client certificate refused) leaves no trace at all: paho only retries,
        silently. paho calls this from inside its ``except OSError`` block without passing the
        error, hence ``sys.exception()`` to name the cause (e.g. "certificate verify failed").
        """
        error = sys.exception()
        log.warning(
            "connection failed",
            extra={
                "fields": {
                    "host": self.config.broker.host,
                    "port": self.config.broker.port,
                    "tls": self.config.broker.tls,
                    "error": repr(error) if error is not None else "unknown",
                }
            },
        )

    def _on_disconnect(self, client, userdata, flags, reason_code, properties) -> None:
        self.connected.clear()
        self.events.disconnected()
        if not self.stopping.is_set():
            log.warning(
                "disconnected; reconnecting with back-off",
                extra={"fields": {"reason": str(reason_code)}},
            )

    def _on_message(self, client, userdata, message: mqtt.MQTTMessage) -> None:
        self.inbox.put(Incoming(message.topic, bytes(message.payload), message.mid, message.qos))

    # ------------------------------------------------------------------ main loop
    def run(self, *, install_signals: bool = True) -> None:
        if install_signals:
            signal.signal(signal.SIGTERM, lambda *_: self.stop())
            signal.signal(signal.SIGINT, lambda *_: self.stop())
            # SIGHUP: read the trusted keys again now (they are also read again whenever
            # their directory changes), on the agent's own thread.
            signal.signal(signal.SIGHUP, lambda *_: self.inbox.put(Incoming(RELOAD, b"", 0, 0)))
        connect_props = Properties(PacketTypes.CONNECT)
        connect_props.SessionExpiryInterval = self.config.broker.session_expiry
        self.client.connect_async(
            self.config.broker.host,
            self.config.broker.port,
            keepalive=self.config.broker.keepalive,
            clean_start=False,
            properties=connect_props,
        )
        self.client.loop_start()
        log.info(
            "agent running",
            extra={"fields": {"device": self.config.device, "farm": self.config.farm}},
        )
        try:
            while not self.stopping.is_set():
                try:
                    item = self.inbox.get(timeout=0.2)
                except queue.Empty:
                    self.tick_windows()
                    self.watch_state()
                    self.send_events()
                    continue
                self.handle(item)
                self.tick_windows()
                if item.topic != EVENTS:  # (a change may have written an event)
                    self.events.changed()
                self.watch_state()
                self.send_events()
        finally:
            self._shutdown()

    def stop(self) -> None:
        self.stopping.set()

    def tick_windows(self) -> None:
        """Every ``[windows] tick`` seconds (of the machine's monotonic time), expire the window
        facts that have left their window by the agent's clock, as one change
        (agent/readings/windows.py); an expiry that changed derived facts is acted on like any
        change (rule requests, findings in the status)."""
        now = time.monotonic()
        if now < self.next_tick or self.agent.state.gone is not None:
            return
        self.next_tick = now + self.config.windows.tick
        try:
            outcome = self.agent.tick_windows()
            if outcome is not None and outcome.status == "applied":
                self.events.changed()
                self.after_change()
        except sqlite3.Error as error:  # (tried again at the next tick)
            log.warning("could not expire windows", extra={"fields": {"error": str(error)}})

    def watch_state(self) -> None:
        """Stop the service, with ``failure`` saying why, once the state file was deleted or
        replaced under it (``AgentState.check_file``, also run before and after every commit):
        a change committed then would be acknowledged into a file no path names. Looked at
        between messages too, so that an idle agent notices within a fraction of a second and
        its clean stop leaves nothing beside the path (``AgentState.close``); the service
        manager's restart then opens what the path names (a new state, or the file put back)."""
        try:
            self.agent.state.check_file()
        except StateError as error:
            if self.failure is None:
                self.failure = str(error)
                log.error("state file gone; stopping", extra={"fields": {"error": str(error)}})
                self.agent.note(Outcome("refused", "state", str(error)), quiet=True)
            self.stop()

    def send_events(self) -> None:
        """Publish pending events and forget acknowledged ones (a failure to delete them, a
        full disk, is only logged: they are sent again, duplicates with their seq)."""
        if self.agent.state.gone is not None:
            return
        try:
            self.events.pump()
        except sqlite3.Error as error:
            log.warning("could not send events", extra={"fields": {"error": str(error)}})

    def handle(self, item: Incoming) -> None:
        """One message: apply, acknowledge once durable, then react (requests, release).

        A message whose change could not be made durable (a ``state`` refusal: a full disk, a
        file that cannot be written) is not acknowledged and is tried again, with back-off,
        until it goes through: the messages after it wait their turn (their order matters:
        versions, newest readings), queued by the broker meanwhile. It is never dropped: a
        stop (or a crash) meanwhile leaves it unacknowledged, and the broker delivers it
        again at the next start."""
        if item.topic == "$connected":
            self.events.restart()
            self.publish_status()
            return
        if item.topic == EVENTS:
            return  # (send_events follows every item)
        if item.topic == RELOAD:
            if self.agent.keys is not None:
                ring = self.agent.keys.reload()
                self.agent.keyring = ring
                log.info(
                    "trusted keys reloaded (SIGHUP)",
                    extra={"fields": {"keys": ring.ids(), "problems": self.agent.keys.problems}},
                )
            return
        delay = STATE_RETRY_FIRST
        while not self._handle_once(item):
            if self.agent.state.gone is not None or self.stopping.wait(delay):
                return  # (not acknowledged: delivered again at the next start)
            delay = min(2 * delay, STATE_RETRY_LAST)

    def _handle_once(self, item: Incoming) -> bool:
        """Dispatch a message once; False when it is still to be done (see ``handle``).

        A storage error that escaped (sqlite3.Error) is a ``state`` refusal too. Any other
        unexpected error (a bug) is logged and reported in the status, and the message is
        acknowledged anyway: the state was rolled back to the file, and redelivering a message
        that crashes the agent would only crash it again (a poison message)."""
        try:
            return self._dispatch(item).committed
        except sqlite3.Error as error:
            self.agent.note(Outcome("refused", "state", f"{type(error).__name__}: {error}"))
            self.publish_status()
            return False
        except Exception as error:  # noqa: BLE001 - the service must outlive one bad message
            log.exception("internal error", extra={"fields": {"topic": item.topic}})
            self.agent.note(Outcome("refused", "internal", f"{type(error).__name__}: {error}"))
            if item.qos > 0:
                self.client.ack(item.mid, item.qos)
            self.publish_status()
            return True

    def _dispatch(self, item: Incoming) -> Outcome:
        config = self.config
        report = None
        if item.topic in (config.topic("bundle"), config.farm_bundle_topic()):
            outcome = self.agent.handle_bundle(item.payload)
            if outcome.status != "duplicate":  # a duplicate changes nothing to report
                report = self.publish_status
        elif item.topic == config.topic("readings"):
            outcome = self.agent.record_readings(item.payload)
            if outcome.status == "applied":
                report = self.publish_telemetry
        else:  # zodiac/<farm>/<neighbour>/telemetry: the topic names the sender
            sender = item.topic.split("/")[2] if item.topic.count("/") == 3 else ""
            outcome = self.agent.handle_telemetry(item.payload, sender=sender)
        if not outcome.committed:  # (a reading kept for another try: said in the status too)
            report = self.publish_status
        if item.qos > 0 and outcome.committed:
            # Only now (the change is durable), and before it is reported: the broker gets the
            # acknowledgement ahead of the status on the same connection, so a status showing
            # a bundle applied is never followed by that bundle's redelivery after a crash.
            self.client.ack(item.mid, item.qos)
        if report is not None:
            report()
        if outcome.status == "applied":
            try:
                self.after_change()
            except sqlite3.Error as error:  # (acknowledged already: tried after the next change)
                log.warning(
                    "could not record rule requests", extra={"fields": {"error": str(error)}}
                )
        return outcome

    def after_change(self) -> None:
        """Trigger rule requests and release resolved ones after any applied change."""
        for request in self.agent.new_requests():
            props = Properties(PacketTypes.PUBLISH)
            props.ResponseTopic = self.config.topic("bundle")
            props.CorrelationData = request.request_id.encode()
            self.client.publish(
                self.config.topic("request"), encode_model(request), qos=1, properties=props
            )
        if self.agent.release_resolved() or self.agent.findings() != self.reported_findings:
            self.publish_status()

    # ------------------------------------------------------------------ publishing
    def publish_status(self, *, online: bool = True) -> mqtt.MQTTMessageInfo:
        status = self.agent.status(online=online)
        self.reported_findings = status.findings
        return self.client.publish(
            self.config.topic("status"), encode_model(status), qos=1, retain=True
        )

    def publish_telemetry(self) -> None:
        """Send this device's readings to its neighbours, when they changed (report by
        exception: most readings change predicates no neighbour listens to) or at least every
        ``TELEMETRY_HEARTBEAT`` seconds, so a neighbour that lost a message catches up."""
        telemetry: Telemetry = self.agent.telemetry()
        now = time.monotonic()
        if self.sent_telemetry is not None:
            readings, at = self.sent_telemetry
            if readings == telemetry.readings and now - at < TELEMETRY_HEARTBEAT:
                return
        self.sent_telemetry = (telemetry.readings, now)
        self.client.publish(self.config.topic("telemetry"), encode_model(telemetry), qos=1)

    def _shutdown(self) -> None:
        """Clean stop: say we are offline (retained), let paho flush, close the database."""
        log.info("stopping")
        try:
            if self.client.is_connected():
                info = self.publish_status(online=False)
                deadline = time.monotonic() + 2
                while not info.is_published() and time.monotonic() < deadline:
                    time.sleep(0.02)
            self.client.disconnect()
        finally:
            self.client.loop_stop()
            self.agent.close()
            log.info("stopped")
