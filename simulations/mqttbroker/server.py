"""The broker: connections, sessions, routing, retained messages, wills, $SYS, persistence.

Everything runs in one asyncio event loop and every packet is handled synchronously inside
``data_received``: no handler ever awaits, so there are no interleavings to reason about and
the broker's state is only ever touched from one place at a time. See the package docstring
for what is (and is not) implemented.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import math
import os
import time
import uuid
from collections import deque
from pathlib import Path

from simulations.mqttbroker import codec
from simulations.mqttbroker.codec import (
    ASSIGNED_CLIENT_ID,
    AUTH_METHOD,
    CONNACK,
    CONNECT,
    DISCONNECT,
    MAXIMUM_PACKET_SIZE,
    MESSAGE_EXPIRY,
    PINGREQ,
    PUBACK,
    PUBCOMP,
    PUBLISH,
    PUBREC,
    PUBREL,
    RECEIVE_MAXIMUM,
    SESSION_EXPIRY,
    SHARED_SUBSCRIPTION_AVAILABLE,
    SUBACK,
    SUBSCRIBE,
    SUBSCRIPTION_ID,
    TOPIC_ALIAS,
    UNSUBACK,
    UNSUBSCRIBE,
    WILL_DELAY,
    PacketError,
    Properties,
    Reader,
    prop,
)

log = logging.getLogger("mqttbroker")

NEVER = 0xFFFFFFFF  # session expiry interval: the session never expires
CONNECT_TIMEOUT = 10.0  # seconds a new connection has to send CONNECT
TICK = 0.25  # seconds between housekeeping rounds (keep-alive, expiry, $SYS, autosave)
FIXED_FLAGS = {PUBREL: 2, SUBSCRIBE: 2, UNSUBSCRIBE: 2}  # other packets (but PUBLISH): 0


class Message:
    """An application message as published (properties minus topic alias), shared by every
    subscriber it is delivered to; ``expires_at`` is wall-clock time, ``sender`` a client id."""

    __slots__ = ("topic", "payload", "qos", "retain", "props", "expires_at", "sender", "_props")

    def __init__(self, topic, payload, qos, retain, props, expires_at=None, sender=None):
        self.topic: str = topic
        self.payload: bytes = payload
        self.qos: int = qos
        self.retain: bool = retain
        self.props: Properties = props
        self.expires_at: float | None = expires_at
        self.sender: str | None = sender
        self._props: bytes | None = None

    def expired(self, now: float) -> bool:
        return self.expires_at is not None and now >= self.expires_at

    def encoded_props(self, sub_ids: list[int], now: float) -> bytes:
        """The PUBLISH properties for one subscriber: Message Expiry Interval set to the time
        left, that subscriber's Subscription Identifiers added."""
        if self.expires_at is None and not sub_ids:
            if self._props is None:
                self._props = codec.properties(self.props)
            return self._props
        props = [(k, v) for k, v in self.props if k != MESSAGE_EXPIRY]
        if self.expires_at is not None:
            props.append((MESSAGE_EXPIRY, max(1, math.ceil(self.expires_at - now))))
        props += [(SUBSCRIPTION_ID, i) for i in sub_ids]
        return codec.properties(props)

    def to_json(self) -> dict:
        return {
            "topic": self.topic,
            "payload": base64.b64encode(self.payload).decode(),
            "qos": self.qos,
            "retain": self.retain,
            "props": base64.b64encode(codec.properties(self.props)).decode(),
            "expires_at": self.expires_at,
            "sender": self.sender,
        }

    @classmethod
    def from_json(cls, data: dict) -> Message:
        props = Reader(base64.b64decode(data["props"])).properties()
        payload = base64.b64decode(data["payload"])
        return cls(
            data["topic"], payload, data["qos"], data["retain"], props, data["expires_at"],
            data["sender"],
        )  # fmt: skip


class Subscription:
    __slots__ = ("filter", "qos", "no_local", "retain_as_published", "retain_handling", "id")

    def __init__(self, topic_filter, qos, no_local=False, rap=False, handling=0, sub_id=None):
        self.filter: str = topic_filter
        self.qos: int = qos
        self.no_local: bool = no_local
        self.retain_as_published: bool = rap
        self.retain_handling: int = handling
        self.id: int | None = sub_id

    def to_json(self) -> list:
        return [self.filter, self.qos, self.no_local, self.retain_as_published,
                self.retain_handling, self.id]  # fmt: skip


class Outgoing:
    """One QoS 1/2 delivery to one session: queued, or in flight under a packet id."""

    __slots__ = ("message", "qos", "retain", "sub_ids", "released")

    def __init__(self, message: Message, qos: int, retain: bool, sub_ids: list[int]) -> None:
        self.message, self.qos, self.retain, self.sub_ids = message, qos, retain, sub_ids
        self.released = False  # QoS 2: PUBREC received, PUBREL sent, waiting for PUBCOMP

    def to_json(self) -> dict:
        return {"message": self.message.to_json(), "qos": self.qos, "retain": self.retain,
                "sub_ids": self.sub_ids, "released": self.released}  # fmt: skip

    @classmethod
    def from_json(cls, data: dict) -> Outgoing:
        out = cls(Message.from_json(data["message"]), data["qos"], data["retain"], data["sub_ids"])
        out.released = data["released"]
        return out


class Session:
    def __init__(self, client_id: str) -> None:
        self.client_id = client_id
        self.subscriptions: dict[str, Subscription] = {}
        self.expiry = 0  # seconds after disconnection; NEVER = never
        self.connection: Connection | None = None
        self.disconnected_at: float | None = None  # wall-clock time
        self.queue: deque[Outgoing] = deque()
        self.inflight: dict[int, Outgoing] = {}  # packet id -> delivery, in sending order
        self.next_pid = 1
        self.awaiting_rel: set[int] = set()  # incoming QoS 2 packet ids before PUBREL
        self.pending_will: tuple[Message, asyncio.TimerHandle] | None = None
        self.dropped = 0

    def new_pid(self) -> int:
        while True:
            pid, self.next_pid = self.next_pid, self.next_pid % 65535 + 1
            if pid not in self.inflight:
                return pid

    def to_json(self) -> dict:
        return {
            "client_id": self.client_id,
            "expiry": self.expiry,
            "disconnected_at": self.disconnected_at or time.time(),
            "subscriptions": [s.to_json() for s in self.subscriptions.values()],
            "inflight": [[pid, out.to_json()] for pid, out in self.inflight.items()],
            "queue": [out.to_json() for out in self.queue],
            "next_pid": self.next_pid,
            "awaiting_rel": sorted(self.awaiting_rel),
        }


class TopicTree:
    """Subscriptions by topic level, so a PUBLISH visits only the filters that can match."""

    __slots__ = ("children", "subscribers")

    def __init__(self) -> None:
        self.children: dict[str, TopicTree] = {}
        self.subscribers: dict[str, Subscription] = {}  # client id -> its subscription

    def add(self, client_id: str, sub: Subscription) -> None:
        node = self
        for level in sub.filter.split("/"):
            node = node.children.setdefault(level, TopicTree())
        node.subscribers[client_id] = sub

    def remove(self, client_id: str, topic_filter: str) -> None:
        path, node = [], self
        for level in topic_filter.split("/"):
            path.append((node, level))
            node = node.children.get(level)
            if node is None:
                return
        node.subscribers.pop(client_id, None)
        for parent, level in reversed(path):  # prune empty branches
            child = parent.children[level]
            if child.subscribers or child.children:
                break
            del parent.children[level]

    def match(self, topic: str) -> list[tuple[str, Subscription]]:
        levels = topic.split("/")
        found: list[tuple[str, Subscription]] = []
        stack = [(self, 0)]
        while stack:
            node, i = stack.pop()
            # Wildcards never match the first level of a topic that starts with "$".
            wild = i > 0 or not topic.startswith("$")
            hashed = node.children.get("#") if wild else None
            if hashed is not None:
                found.extend(hashed.subscribers.items())
            if i == len(levels):
                found.extend(node.subscribers.items())
                continue
            plus = node.children.get("+") if wild else None
            if plus is not None:
                stack.append((plus, i + 1))
            child = node.children.get(levels[i])
            if child is not None:
                stack.append((child, i + 1))
        return found


class Broker:
    """The broker's state, shared by all connections of one event loop."""

    def __init__(
        self,
        directory: Path | None = None,
        *,
        sys_interval: float = 10.0,
        max_queued_messages: int = 100_000,
        max_packet_size: int = 32 * 1024 * 1024,
        persistence: bool = True,
        autosave_interval: float = 0.0,
    ) -> None:
        self.directory = directory
        self.persistence = persistence and directory is not None
        self.sys_interval = sys_interval
        self.max_queued = max_queued_messages
        self.max_packet_size = max_packet_size
        self.autosave_interval = autosave_interval
        self.sessions: dict[str, Session] = {}
        self.retained: dict[str, Message] = {}
        self.tree = TopicTree()
        self.connections: set[Connection] = set()
        self.started = time.monotonic()
        self.counters = dict.fromkeys(
            ("messages/received", "messages/sent", "bytes/received", "bytes/sent",
             "publish/messages/received", "publish/messages/sent", "publish/messages/dropped"),
            0,
        )  # fmt: skip
        self.dirty = False  # persistent state changed since the last save
        self._last_save = time.monotonic()
        self._save_seconds = 0.0  # how long the last save took
        self._last_sys = -math.inf  # the first housekeeping round publishes $SYS

    @property
    def persistence_file(self) -> Path:
        assert self.directory is not None
        return self.directory / "broker.json"

    # ----------------------------------------------------------------------- sessions
    def attach(self, conn: Connection, client_id: str, clean: bool, expiry: int) -> bool:
        """Give ``conn`` its session (taking over a connected one); True if it existed."""
        old = self.sessions.get(client_id)
        if old is not None and old.connection is not None:
            log.info("client %s already connected: closing the old connection", client_id)
            old.connection.close(0x8E)  # Session taken over; its will follows the rules
        session = self.sessions.get(client_id)  # the takeover may have ended it
        present = session is not None and not clean
        if session is not None and not present:
            self.end_session(session, "clean start")
        if not present:
            session = self.sessions[client_id] = Session(client_id)
        elif session.pending_will is not None:  # back within the will delay: no will
            session.pending_will[1].cancel()
            session.pending_will = None
        session.connection, session.expiry, session.disconnected_at = conn, expiry, None
        conn.session = session
        self.dirty |= expiry != 0
        return present

    def resume(self, session: Session) -> None:
        """After CONNACK: re-send what was in flight (DUP), then what was queued."""
        conn = session.connection
        for pid, out in session.inflight.items():
            if out.released:
                conn.write(codec.ack(PUBREL, pid, conn.version))
            else:
                conn.send_publish(out.message, out.qos, out.retain, out.sub_ids, pid, dup=True)
        self.pump(session)

    def detach(self, conn: Connection, will: bool) -> None:
        session, conn.session = conn.session, None
        self.connections.discard(conn)
        if session is None:
            return
        if will and conn.will is not None:
            self.schedule_will(session, *conn.will)
        conn.will = None
        if session.connection is conn:
            session.connection, session.disconnected_at = None, time.time()
            if session.expiry == 0:
                self.end_session(session, "session expiry 0")

    def end_session(self, session: Session, why: str) -> None:
        if self.sessions.get(session.client_id) is session:
            del self.sessions[session.client_id]
        for topic_filter in session.subscriptions:
            self.tree.remove(session.client_id, topic_filter)
        if session.pending_will is not None:  # the session ends before the will delay
            message, handle = session.pending_will
            session.pending_will = None
            handle.cancel()
            self.publish_will(message)
        if session.expiry:
            self.dirty = True
            log.info("session of %s ended (%s)", session.client_id, why)

    def schedule_will(self, session: Session, message: Message, delay: int) -> None:
        if delay == 0 or session.expiry == 0:
            self.publish_will(message)
            return
        loop = asyncio.get_running_loop()
        handle = loop.call_later(min(delay, session.expiry), self._fire_will, session)
        session.pending_will = (message, handle)

    def _fire_will(self, session: Session) -> None:
        if session.pending_will is not None:
            message, _ = session.pending_will
            session.pending_will = None
            self.publish_will(message)

    def publish_will(self, message: Message) -> None:
        log.info("publishing the will of %s on %s", message.sender, message.topic)
        expiry = prop(message.props, MESSAGE_EXPIRY)
        if expiry is not None:
            message.expires_at = time.time() + expiry
        self.publish(message)

    # ----------------------------------------------------------------------- routing
    def publish(self, message: Message) -> bool:
        """Route one message to every matching session; False if nobody subscribes."""
        if message.retain:
            if message.payload:
                self.retained[message.topic] = message
            else:
                self.retained.pop(message.topic, None)
            self.dirty |= not message.topic.startswith("$SYS/")
        targets: dict[str, list] = {}
        for client_id, sub in self.tree.match(message.topic):
            if sub.no_local and client_id == message.sender:
                continue
            target = targets.get(client_id)
            if target is None:
                targets[client_id] = [sub.qos, sub.retain_as_published, []]
                target = targets[client_id]
            else:  # overlapping subscriptions: one copy, the highest QoS, every identifier
                target[0] = max(target[0], sub.qos)
                target[1] |= sub.retain_as_published
            if sub.id is not None:
                target[2].append(sub.id)
        for client_id, (qos, rap, sub_ids) in targets.items():
            retain = message.retain and rap
            self.deliver(self.sessions[client_id], message, min(qos, message.qos), retain, sub_ids)
        return bool(targets)

    def deliver(self, session: Session, message: Message, qos: int, retain: bool, sub_ids):
        conn = session.connection
        if qos == 0:
            if conn is not None:  # QoS 0 is never queued for an offline session
                conn.send_publish(message, 0, retain, sub_ids)
            return
        out = Outgoing(message, qos, retain, sub_ids)
        if conn is not None and not session.queue and len(session.inflight) < conn.receive_max:
            self._send_new(session, out)
        else:
            if len(session.queue) >= self.max_queued:
                session.queue.popleft()
                session.dropped += 1
                self.counters["publish/messages/dropped"] += 1
                if session.dropped & (session.dropped - 1) == 0:  # 1, 2, 4, 8, ... : log less
                    log.warning(
                        "queue of %s full (%d): %d oldest messages dropped so far",
                        session.client_id, self.max_queued, session.dropped,
                    )  # fmt: skip
            session.queue.append(out)
        self.dirty |= session.expiry != 0

    def _send_new(self, session: Session, out: Outgoing) -> None:
        pid = session.new_pid()
        if session.connection.send_publish(out.message, out.qos, out.retain, out.sub_ids, pid):
            session.inflight[pid] = out

    def pump(self, session: Session) -> None:
        """Move queued messages in flight while the client's Receive Maximum allows."""
        conn = session.connection
        if conn is None:
            return
        now = time.time()
        while session.queue and len(session.inflight) < conn.receive_max:
            out = session.queue.popleft()
            if not out.message.expired(now):
                self._send_new(session, out)
        self.dirty |= session.expiry != 0

    def retained_for(self, topic_filter: str) -> list[Message]:
        now = time.time()
        if "+" not in topic_filter and "#" not in topic_filter:
            candidates = [self.retained.get(topic_filter)]
        else:
            candidates = [m for t, m in self.retained.items() if codec.matches(topic_filter, t)]
        return [m for m in candidates if m is not None and not m.expired(now)]

    # ----------------------------------------------------------------------- housekeeping
    def tick(self) -> None:
        now, wall = time.monotonic(), time.time()
        for conn in list(self.connections):
            if conn.version is None and now - conn.opened > CONNECT_TIMEOUT:
                log.info("no CONNECT from %s within %g s: closing", conn.peer, CONNECT_TIMEOUT)
                conn.close()
            elif conn.keepalive and now - conn.last_seen > 1.5 * conn.keepalive:
                log.info("client %s: keep-alive of %d s expired", conn.client_id, conn.keepalive)
                conn.close(0x8D)
        for session in list(self.sessions.values()):
            if (
                session.connection is None
                and session.expiry != NEVER
                and wall >= session.disconnected_at + session.expiry
            ):
                self.end_session(session, "expired")
        if self.sys_interval > 0 and now - self._last_sys >= self.sys_interval:
            self._last_sys = now
            self.publish_sys()
        # A save blocks the loop: one that took long (big offline queues) spaces out the next
        # ones, so that autosaving never takes more than a tenth of the broker's time.
        every = max(self.autosave_interval, 10 * self._save_seconds)
        if self.autosave_interval > 0 and self.dirty and now - self._last_save >= every:
            self.save()

    def publish_sys(self) -> None:
        connected = sum(1 for s in self.sessions.values() if s.connection is not None)
        stored = sum(len(s.queue) + len(s.inflight) for s in self.sessions.values())
        values = {
            "version": "zodiac-edge embedded MQTT broker 1.0",
            "uptime": f"{int(time.monotonic() - self.started)} seconds",
            "clients/connected": connected,
            "clients/total": len(self.sessions),
            "retained messages/count": len(self.retained),
            "store/messages/count": stored,
            **self.counters,
        }
        for name, value in values.items():
            self.publish(Message(f"$SYS/broker/{name}", str(value).encode(), 0, True, []))

    # ----------------------------------------------------------------------- persistence
    def save(self) -> None:
        self._last_save = time.monotonic()
        self.dirty = False
        if not self.persistence:
            return
        state = {
            "format": "zodiac-edge mqttbroker 1",
            "saved_at": time.time(),
            "retained": [m.to_json() for t, m in self.retained.items() if not t.startswith("$")],
            "sessions": [s.to_json() for s in self.sessions.values() if s.expiry != 0],
        }
        tmp = self.persistence_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, separators=(",", ":")))
        os.replace(tmp, self.persistence_file)
        self._save_seconds = time.monotonic() - self._last_save

    def load(self) -> None:
        if not self.persistence or not self.persistence_file.exists():
            return
        try:
            state = json.loads(self.persistence_file.read_text())
            retained = [Message.from_json(m) for m in state["retained"]]
            sessions = [self._session_from_json(s) for s in state["sessions"]]
        except (ValueError, KeyError, TypeError, PacketError) as error:
            broken = self.persistence_file.with_suffix(".corrupt")
            os.replace(self.persistence_file, broken)
            log.error("cannot load %s (%s): moved to %s", self.persistence_file, error, broken)
            return
        now = time.time()
        self.retained = {m.topic: m for m in retained if not m.expired(now)}
        for session in sessions:
            self.sessions[session.client_id] = session
            for sub in session.subscriptions.values():
                self.tree.add(session.client_id, sub)
        log.info(
            "loaded %d retained messages and %d sessions (%d queued messages) from %s",
            len(self.retained), len(sessions),
            sum(len(s.queue) + len(s.inflight) for s in sessions), self.persistence_file,
        )  # fmt: skip

    @staticmethod
    def _session_from_json(data: dict) -> Session:
        session = Session(data["client_id"])
        session.expiry = data["expiry"]
        session.disconnected_at = data["disconnected_at"]
        for args in data["subscriptions"]:
            session.subscriptions[args[0]] = Subscription(*args)
        session.inflight = {pid: Outgoing.from_json(out) for pid, out in data["inflight"]}
        session.queue = deque(Outgoing.from_json(out) for out in data["queue"])
        session.next_pid = data["next_pid"]
        session.awaiting_rel = set(data["awaiting_rel"])
        return session

    def shutdown(self) -> None:
        """Close every connection (v5 clients hear "server shutting down"), then save.
        Wills are not published: a stopped broker is like a crashed one to its clients."""
        for conn in list(self.connections):
            conn.close(0x8B, will=False)
        self.save()


class Connection(asyncio.Protocol):
    """One client's network connection: packet framing and the per-packet protocol rules."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.version: int | None = None  # 4 or 5 once CONNECT was accepted
        self.client_id: str | None = None
        self.session: Session | None = None
        self.keepalive = 0
        self.opened = self.last_seen = time.monotonic()
        self.will: tuple[Message, int] | None = None  # message, will delay
        self.receive_max = 65535
        self.max_packet: int | None = None
        self.closed = False
        self.peer = "?"

    # ----------------------------------------------------------------------- transport
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        self.broker.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed:
            self.closed = True
            if self.client_id is not None:
                log.info("client %s closed its connection%s", self.client_id,
                         f" ({exc})" if exc else "")  # fmt: skip
            self.broker.detach(self, will=True)
        self.broker.connections.discard(self)

    def write(self, data: bytes) -> None:
        counters = self.broker.counters
        counters["messages/sent"] += 1
        counters["bytes/sent"] += len(data)
        self.transport.write(data)

    def send_publish(self, message, qos, retain, sub_ids, pid=0, dup=False) -> bool:
        """Send one PUBLISH; False if it exceeds the client's Maximum Packet Size (then the
        message is discarded for this client, as the specification requires)."""
        first = 0x30 | (8 if dup else 0) | (qos << 1) | (1 if retain else 0)
        parts = [codec.string(message.topic)]
        if qos:
            parts.append(pid.to_bytes(2, "big"))
        if self.version == 5:
            parts.append(message.encoded_props(sub_ids, time.time()))
        parts.append(message.payload)
        data = codec.packet(first, *parts)
        if self.max_packet is not None and len(data) > self.max_packet:
            log.warning("message on %s too large for %s: discarded", message.topic, self.client_id)
            return False
        self.broker.counters["publish/messages/sent"] += 1
        self.write(data)
        return True

    def close(self, reason: int | None = None, *, will: bool = True) -> None:
        """Close now (a DISCONNECT with ``reason`` first for a v5 client); the session is
        detached at once, its will published unless ``will`` is False."""
        if self.closed:
            return
        self.closed = True
        if reason is not None and self.version == 5 and self.session is not None:
            self.write(codec.packet(DISCONNECT << 4, bytes((reason, 0))))
        self.broker.detach(self, will)
        self.transport.close()

    def data_received(self, data: bytes) -> None:
        counters = self.broker.counters
        counters["bytes/received"] += len(data)
        self.last_seen = time.monotonic()
        if self.closed:
            return
        buf = self.buffer
        buf += data
        pos = 0
        try:
            if self.version is None and buf[0] != CONNECT << 4:  # not MQTT: don't wait for more
                raise PacketError(f"first packet is not CONNECT (first byte {buf[0]:#04x})")
            while len(buf) - pos >= 2:
                length, i, multiplier = 0, pos + 1, 1
                while i < len(buf):
                    byte = buf[i]
                    length += (byte & 0x7F) * multiplier
                    i += 1
                    if not byte & 0x80:
                        break
                    if multiplier == 128**3:
                        raise PacketError("remaining length longer than 4 bytes")
                    multiplier *= 128
                else:
                    break  # the remaining length itself is incomplete
                if length + i - pos > self.broker.max_packet_size:
                    raise PacketError(f"packet of {length} bytes is too large", 0x95)
                if i + length > len(buf):
                    break
                header, body, pos = buf[pos], bytes(buf[i : i + length]), i + length
                counters["messages/received"] += 1
                self.handle(header >> 4, header & 0x0F, body)
                if self.closed:
                    break
        except PacketError as error:
            log.warning("client %s (%s): %s: closing", self.client_id, self.peer, error)
            self.close(error.reason)
        except Exception:  # a bug must cost one connection, never the broker
            log.exception("client %s (%s): internal error: closing", self.client_id, self.peer)
            self.close(0x83)
        finally:
            del buf[:pos]

    # ----------------------------------------------------------------------- packets
    def handle(self, kind: int, flags: int, body: bytes) -> None:
        if kind != PUBLISH and flags != FIXED_FLAGS.get(kind, 0):
            raise PacketError(f"packet type {kind} with reserved flags {flags:#x}")
        if self.version is None:
            if kind != CONNECT:
                raise PacketError(f"first packet is of type {kind}, not CONNECT")
            self.on_connect(Reader(body))
            return
        handler = self.HANDLERS.get(kind)
        if handler is None:  # a second CONNECT, AUTH, or a server-to-client packet
            raise PacketError(f"unexpected packet type {kind}", 0x82)
        handler(self, flags, Reader(body))

    def _props(self, reader: Reader) -> Properties:
        return reader.properties() if self.version == 5 else []

    def on_connect(self, r: Reader) -> None:
        name, level = r.string(), r.byte()
        if name not in ("MQTT", "MQIsdp"):
            raise PacketError(f"unknown protocol name {name!r}")
        if name != "MQTT" or level not in (4, 5):
            log.warning("%s: protocol %s level %d not supported: refused", self.peer, name, level)
            # v3.1/v3.1.1 clients understand return code 1; later versions get v5's 0x84.
            reason = bytes((0, 0x84, 0)) if level > 5 else b"\x00\x01"
            self.write(codec.packet(CONNACK << 4, reason))
            self.closed = True
            self.broker.connections.discard(self)
            self.transport.close()
            return
        flags = r.byte()
        will_qos = (flags >> 3) & 3
        if flags & 1 or will_qos == 3 or (not flags & 4 and flags & 0x38):
            raise PacketError(f"invalid CONNECT flags {flags:#04x}")
        self.version = level
        clean, self.keepalive = bool(flags & 2), r.u16()
        props = self._props(r)
        client_id = r.string()
        if flags & 4:
            will_props = self._props(r)
            topic, payload = r.string(), r.binary()
            if not codec.valid_topic(topic):
                raise PacketError(f"invalid will topic {topic!r}", 0x90)
            delay = prop(will_props, WILL_DELAY, 0)
            will_props = [(k, v) for k, v in will_props if k != WILL_DELAY]
            message = Message(topic, payload, will_qos, bool(flags & 0x20), will_props)
            self.will = (message, delay)
        if flags & 0x80:
            r.string()  # user name: accepted, not checked (no authentication)
        if flags & 0x40:
            r.binary()
        r.end()
        self.receive_max = prop(props, RECEIVE_MAXIMUM, 65535)
        self.max_packet = prop(props, MAXIMUM_PACKET_SIZE)
        if self.receive_max == 0 or self.max_packet == 0:
            raise PacketError("Receive Maximum or Maximum Packet Size of 0", 0x82)
        if prop(props, AUTH_METHOD) is not None:
            return self._refuse(0x8C, "enhanced authentication is not supported")
        assigned = None
        if not client_id:
            if level == 4 and not clean:
                return self._refuse(0x02, "empty client id without clean session")
            client_id = assigned = f"auto-{uuid.uuid4()}"
        expiry = prop(props, SESSION_EXPIRY, 0) if level == 5 else (0 if clean else NEVER)
        self.client_id = client_id
        if self.will is not None:
            self.will[0].sender = client_id
        present = self.broker.attach(self, client_id, clean, expiry)
        if level == 5:
            out_props = [(SHARED_SUBSCRIPTION_AVAILABLE, 0),
                         (MAXIMUM_PACKET_SIZE, self.broker.max_packet_size)]  # fmt: skip
            if assigned:
                out_props.append((ASSIGNED_CLIENT_ID, assigned))
            self.write(codec.packet(CONNACK << 4, bytes((present, 0)), codec.properties(out_props)))
        else:
            self.write(codec.packet(CONNACK << 4, bytes((present, 0))))
        log.info(
            "new client %s from %s (p%d, c%d, k%d, e%d, session %s%s)",
            client_id, self.peer, level, clean, self.keepalive, expiry,
            "resumed" if present else "new", ", will" if self.will else "",
        )  # fmt: skip
        self.broker.resume(self.session)

    def _refuse(self, reason: int, why: str) -> None:
        log.warning("client %s refused: %s", self.peer, why)
        code = reason if self.version == 5 else {0x02: 2}.get(reason, 3)
        tail = b"\x00" if self.version == 5 else b""
        self.write(codec.packet(CONNACK << 4, bytes((0, code)), tail))
        self.close()

    def on_publish(self, flags: int, r: Reader) -> None:
        qos, retain = (flags >> 1) & 3, bool(flags & 1)
        if qos == 3 or (qos == 0 and flags & 8):
            raise PacketError(f"invalid PUBLISH flags {flags:#x}")
        topic = r.string()
        pid = r.u16() if qos else 0
        if qos and pid == 0:
            raise PacketError("packet identifier 0")
        props = self._props(r)
        payload = r.rest()
        if prop(props, TOPIC_ALIAS) is not None:
            raise PacketError("topic aliases are not supported (Topic Alias Maximum 0)", 0x94)
        if prop(props, SUBSCRIPTION_ID) is not None:
            raise PacketError("a client may not send a Subscription Identifier", 0x82)
        if not codec.valid_topic(topic):
            raise PacketError(f"invalid topic name {topic!r}", 0x90)
        broker, session = self.broker, self.session
        broker.counters["publish/messages/received"] += 1
        if topic.startswith("$SYS"):
            log.warning("client %s may not publish to %s: dropped", self.client_id, topic)
            if qos:
                self.write(codec.ack(PUBACK if qos == 1 else PUBREC, pid, self.version, 0x87))
            return
        if qos == 2 and pid in session.awaiting_rel:  # a re-sent QoS 2 PUBLISH: once only
            self.write(codec.ack(PUBREC, pid, self.version))
            return
        expiry = prop(props, MESSAGE_EXPIRY)
        expires_at = time.time() + expiry if expiry is not None else None
        message = Message(topic, payload, qos, retain, props, expires_at, self.client_id)
        matched = broker.publish(message)
        if qos == 2:
            session.awaiting_rel.add(pid)
        if qos:
            # 0x10: no matching subscribers (v5, as Mosquitto answers).
            ack = PUBACK if qos == 1 else PUBREC
            self.write(codec.ack(ack, pid, self.version, 0 if matched else 0x10))

    def on_puback(self, flags: int, r: Reader) -> None:
        session, pid = self.session, r.u16()
        out = session.inflight.get(pid)
        if out is not None and out.qos == 1:
            del session.inflight[pid]
            self.broker.pump(session)

    def on_pubrec(self, flags: int, r: Reader) -> None:
        session, pid = self.session, r.u16()
        reason = r.byte() if r.remaining() else 0
        out = session.inflight.get(pid)
        if out is None or out.qos != 2:
            self.write(codec.ack(PUBREL, pid, self.version, 0x92))  # id not found
        elif reason >= 0x80:  # the receiver refused it: the exchange ends here
            del session.inflight[pid]
            self.broker.pump(session)
        else:
            out.released = True
            self.write(codec.ack(PUBREL, pid, self.version))

    def on_pubrel(self, flags: int, r: Reader) -> None:
        pid = r.u16()
        known = pid in self.session.awaiting_rel
        self.session.awaiting_rel.discard(pid)
        self.write(codec.ack(PUBCOMP, pid, self.version, 0 if known else 0x92))

    def on_pubcomp(self, flags: int, r: Reader) -> None:
        session, pid = self.session, r.u16()
        out = session.inflight.get(pid)
        if out is not None and out.released:
            del session.inflight[pid]
            self.broker.pump(session)

    def on_subscribe(self, flags: int, r: Reader) -> None:
        pid = r.u16()
        props = self._props(r)
        sub_id = prop(props, SUBSCRIPTION_ID)
        if sub_id == 0:
            raise PacketError("Subscription Identifier 0", 0x82)
        session, codes, retained = self.session, [], []
        while r.remaining() or not codes:
            topic_filter, options = r.string(), r.byte()
            qos, handling = options & 3, (options >> 4) & 3
            if qos == 3 or handling == 3 or options & (0xC0 if self.version == 5 else 0xFC):
                raise PacketError(f"invalid subscription options {options:#04x}")
            if topic_filter.startswith("$share/"):
                codes.append(0x9E if self.version == 5 else 0x80)  # not supported
                continue
            if not codec.valid_filter(topic_filter):
                codes.append(0x8F if self.version == 5 else 0x80)
                continue
            existed = topic_filter in session.subscriptions
            sub = Subscription(topic_filter, qos, bool(options & 4), bool(options & 8),
                               handling, sub_id)  # fmt: skip
            session.subscriptions[topic_filter] = sub
            self.broker.tree.add(session.client_id, sub)
            codes.append(qos)
            log.info("%s subscribed to %s (QoS %d)", session.client_id, topic_filter, qos)
            if handling == 0 or (handling == 1 and not existed):
                retained += [(m, sub) for m in self.broker.retained_for(topic_filter)]
        self.broker.dirty |= session.expiry != 0
        tail = codec.properties([]) if self.version == 5 else b""
        self.write(codec.packet(SUBACK << 4, pid.to_bytes(2, "big"), tail, bytes(codes)))
        for message, sub in retained:
            ids = [sub.id] if sub.id is not None else []
            self.broker.deliver(session, message, min(message.qos, sub.qos), True, ids)

    def on_unsubscribe(self, flags: int, r: Reader) -> None:
        pid = r.u16()
        self._props(r)
        session, codes = self.session, []
        while r.remaining() or not codes:
            topic_filter = r.string()
            found = session.subscriptions.pop(topic_filter, None) is not None
            if found:
                self.broker.tree.remove(session.client_id, topic_filter)
                log.info("%s unsubscribed from %s", session.client_id, topic_filter)
            codes.append(0 if found else 0x11)  # 0x11: no subscription existed
        self.broker.dirty |= session.expiry != 0
        tail = codec.properties([]) + bytes(codes) if self.version == 5 else b""
        self.write(codec.packet(UNSUBACK << 4, pid.to_bytes(2, "big"), tail))

    def on_pingreq(self, flags: int, r: Reader) -> None:
        r.end()
        self.write(b"\xd0\x00")

    def on_disconnect(self, flags: int, r: Reader) -> None:
        reason = r.byte() if r.remaining() else 0
        props = self._props(r) if r.remaining() else []
        expiry = prop(props, SESSION_EXPIRY)
        if expiry is not None:
            if self.session.expiry == 0 and expiry != 0:
                raise PacketError("session expiry changed from 0 at DISCONNECT", 0x82)
            self.session.expiry = expiry
        log.info("client %s disconnected (reason %#04x)", self.client_id, reason)
        # Only a normal disconnection (0x00) discards the will; 0x04 asks for it explicitly.
        self.close(will=reason != 0)

    HANDLERS = {
        PUBLISH: on_publish,
        PUBACK: on_puback,
        PUBREC: on_pubrec,
        PUBREL: on_pubrel,
        PUBCOMP: on_pubcomp,
        SUBSCRIBE: on_subscribe,
        UNSUBSCRIBE: on_unsubscribe,
        PINGREQ: on_pingreq,
        DISCONNECT: on_disconnect,
    }


async def serve(
    host: str, port: int, broker: Broker, stop: asyncio.Event
) -> None:  # pragma: no cover - exercised through the process in the tests
    """Listen until ``stop`` is set, then shut down cleanly (connections closed, state saved)."""
    loop = asyncio.get_running_loop()
    broker.load()
    try:
        server = await loop.create_server(lambda: Connection(broker), host, port)
    except OSError as error:
        why = os.strerror(error.errno) if error.errno else str(error)
        log.error("cannot listen on %s:%d: %s (%s)", host, port, why, error)
        raise SystemExit(1) from None
    log.info("running on %s:%d (pid %d)", host, port, os.getpid())
    try:
        while not stop.is_set():
            try:
                broker.tick()
            except Exception:  # noqa: BLE001 - housekeeping must go on
                log.exception("housekeeping failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), TICK)
    finally:
        server.close()
        broker.shutdown()
        await asyncio.sleep(0.05)  # let the transports flush their DISCONNECTs
        log.info("stopped; state saved" if broker.persistence else "stopped")
