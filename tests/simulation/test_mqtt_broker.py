"""The embedded MQTT v5 broker (simulations/mqttbroker) beyond the feature table.

What the agents need from any broker (QoS 1, retained messages, wills, response topic and
correlation data, persistent sessions, restarts...) is tests/simulation/test_broker_conformance.py,
run against Mosquitto and this broker alike. Here: what only this broker's own code decides (topic
matching, QoS 2, $SYS, keep-alive, takeover, malformed packets and old protocol levels through
raw sockets, how it saves its state), then the real agent (``zodiac-agent run``, i.e.
AgentService) end to end against it, with the same test cases as against Mosquitto
(tests/agent/test_agent_e2e.py).

Ordering trick used instead of sleeps (as in tests/simulation/test_broker.py): one publisher's
messages reach one subscriber in order, so a later message acts as a barrier for an earlier one.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.subscribeoptions import SubscribeOptions

import tests.agent.test_agent_e2e as agent_e2e
from simulations.brokerprocess import BrokerError
from simulations.mqttbroker import EmbeddedBroker
from simulations.mqttbroker.codec import matches
from simulations.mqttbroker.server import Subscription, TopicTree
from tests.conftest import started_brokers
from tests.support.agent_harness import Cloud
from tests.support.broker import TestClient

pytestmark = pytest.mark.process


@pytest.fixture(scope="module")
def embedded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedBroker]:
    """One embedded broker for the module ($SYS every second); tests use their own ids/topics."""
    with EmbeddedBroker(tmp_path_factory.mktemp("embedded"), sys_interval=1) as broker:
        yield broker
    # Whatever the tests did to it, it never crashed and it stopped cleanly.
    assert "Traceback" not in broker.log_file.read_text()


@pytest.fixture
def make_embedded(tmp_path: Path) -> Iterator[Callable[..., EmbeddedBroker]]:
    """Like conftest's ``make_broker``, with embedded brokers."""
    yield from started_brokers(EmbeddedBroker, tmp_path, "embedded")


# ----------------------------------------------------------------------- raw MQTT bytes
def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        n, byte = n >> 7, n & 0x7F
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _str(text: str | bytes) -> bytes:
    data = text.encode() if isinstance(text, str) else text
    return len(data).to_bytes(2, "big") + data


def _packet(first: int, body: bytes) -> bytes:
    return bytes((first,)) + _varint(len(body)) + body


def connect_packet(
    client_id: str,
    *,
    keepalive: int = 30,
    will: tuple[str, bytes] | None = None,
    name: str = "MQTT",
    level: int = 5,
) -> bytes:
    """CONNECT, clean start; ``will`` = (topic, payload) at QoS 1, not retained."""
    flags = 0x02 | (0x04 | 0x08 if will else 0)
    body = _str(name) + bytes((level, flags)) + keepalive.to_bytes(2, "big")
    body += (b"\x00" if level == 5 else b"") + _str(client_id)
    if will:
        body += (b"\x00" if level == 5 else b"") + _str(will[0]) + _str(will[1])
    return _packet(0x10, body)


class Raw:
    """A bare TCP connection to the broker, speaking bytes."""

    def __init__(self, broker: EmbeddedBroker) -> None:
        self.sock = socket.create_connection((broker.host, broker.port), timeout=5)

    def send(self, data: bytes) -> Raw:
        self.sock.sendall(data)
        return self

    def _read(self, n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = self.sock.recv(n - len(data))
            if not chunk:
                raise EOFError
            data += chunk
        return data

    def packet(self) -> bytes:
        """The next whole packet, fixed header included."""
        first = self._read(1)
        length, shift, header = 0, 0, first
        while True:
            byte = self._read(1)
            header += byte
            length |= (byte[0] & 0x7F) << shift
            shift += 7
            if not byte[0] & 0x80:
                return header + self._read(length)

    def connect(self, client_id: str, **kwargs) -> Raw:
        self.send(connect_packet(client_id, **kwargs))
        connack = self.packet()
        assert connack[0] == 0x20 and connack[2:4] == b"\x00\x00", connack  # success
        return self

    def closed_by_broker(self) -> bool:
        try:
            while self.sock.recv(4096):
                pass
        except ConnectionResetError:
            pass
        return True

    def close(self) -> None:
        self.sock.close()


def roundtrip(broker: EmbeddedBroker, name: str) -> None:
    """A fresh publisher and subscriber still work (the broker is alive and well)."""
    with TestClient(broker, f"{name}-sub") as sub, TestClient(broker, f"{name}-pub") as pub:
        sub.subscribe(f"alive/{name}")
        pub.publish(f"alive/{name}", b"ok")
        assert sub.expect(f"alive/{name}").payload == b"ok"


def barrier(pub: TestClient, sub: TestClient, topic: str) -> list[mqtt.MQTTMessage]:
    """Everything ``sub`` received before ``pub``'s barrier message on ``topic``."""
    pub.publish(topic, b"barrier")
    before = []
    while (message := sub.expect()).topic != topic:
        before.append(message)
    return before


# ----------------------------------------------------------------------- topic matching
def test_topic_matching_rules():
    cases = {
        ("a/+/c", "a/b/c"): True,
        ("a/+/c", "a/b/d"): False,
        ("a/+", "a/b/c"): False,
        ("a/#", "a"): True,  # '#' also matches the parent level
        ("a/#", "a/b/c"): True,
        ("#", "a/b"): True,
        ("+/+", "/x"): True,  # an empty level is a level
        ("#", "$SYS/broker/uptime"): False,  # no wildcard matches a leading '$'
        ("+/broker/uptime", "$SYS/broker/uptime"): False,
        ("$SYS/#", "$SYS/broker/uptime"): True,
        ("$SYS/+/uptime", "$SYS/broker/uptime"): True,
    }
    tree = TopicTree()
    for i, (topic_filter, _) in enumerate(cases):
        tree.add(f"c{i}", Subscription(topic_filter, 0))
    for i, ((topic_filter, topic), expected) in enumerate(cases.items()):
        assert matches(topic_filter, topic) is expected, (topic_filter, topic)
        assert (f"c{i}" in {cid for cid, _ in tree.match(topic)}) is expected, (topic_filter, topic)
    tree.remove("c0", "a/+/c")
    assert "c0" not in {cid for cid, _ in tree.match("a/b/c")}


# ----------------------------------------------------------------------- publish / subscribe
def test_puback_says_when_nobody_subscribes(embedded):
    # 0x10 No matching subscribers, as Mosquitto answers (the spec allows 0 too).
    with TestClient(embedded, "nobody-pub") as pub:
        assert pub.publish("nobody/listens", b"x", qos=1).value == 0x10


def test_qos2_both_ways_and_no_local(embedded):
    with TestClient(embedded, "q2-sub") as sub, TestClient(embedded, "q2-pub") as pub:
        sub.subscribe("q2/x", qos=2)
        assert pub.publish("q2/x", b"exactly once", qos=2).value == 0  # after PUBCOMP
        message = sub.expect("q2/x")
        assert (message.payload, message.qos) == (b"exactly once", 2)
        # no-local: a client does not receive its own messages on that subscription.
        result, mid = sub.client.subscribe("q2/local", options=SubscribeOptions(1, noLocal=True))
        assert sub._wait_ack(mid, "subscribe")[0].value == 1
        sub.publish("q2/local", b"mine")
        pub.publish("q2/local", b"theirs")
        assert sub.expect("q2/local").payload == b"theirs"


def test_hash_does_not_match_sys_topics(embedded):
    with (
        TestClient(embedded, "sys-hash") as hashed,
        TestClient(embedded, "sys-direct") as direct,
        TestClient(embedded, "sys-pub") as pub,
    ):
        # The $SYS topics are retained: a matching subscription would get them at once.
        direct.subscribe("$SYS/broker/uptime", qos=0)
        assert direct.expect("$SYS/broker/uptime", timeout=3).retain
        hashed.subscribe("#", qos=0)
        hashed.subscribe("+/broker/uptime", qos=0)
        before = barrier(pub, hashed, "sys/barrier")
        assert not [m.topic for m in before if m.topic.startswith("$")]


# ----------------------------------------------------------------------- wills
def test_will_on_keepalive_expiry(embedded):
    with TestClient(embedded, "ka-watch") as watch:
        watch.subscribe("ka/will")
        # Silent past 1.5 x its keep-alive of 1 s: dropped, will published.
        started = time.monotonic()
        silent = Raw(embedded).connect("ka-silent", keepalive=1, will=("ka/will", b"gone"))
        assert watch.expect("ka/will", timeout=4).payload == b"gone"
        assert time.monotonic() - started >= 1.5
        assert silent.packet() == b"\xe0\x02\x8d\x00"  # DISCONNECT: keep alive timeout
    assert "keep-alive of 1 s expired" in embedded.log_file.read_text()


def test_session_takeover(embedded):
    with TestClient(embedded, "take-watch") as watch:
        watch.subscribe("take/will")
        old = Raw(embedded).connect("take-me", will=("take/will", b"old connection gone"))
        with TestClient(embedded, "take-me") as new:
            # The old connection hears "session taken over" and is closed; its will (delay 0)
            # is published, as MQTT 5 requires.
            assert old.packet() == b"\xe0\x02\x8e\x00"
            assert old.closed_by_broker()
            assert watch.expect("take/will").payload == b"old connection gone"
            new.subscribe("take/after")
            watch.publish("take/after", b"the new one works")
            assert new.expect("take/after").payload == b"the new one works"


# ----------------------------------------------------------------------- sessions
def test_mqtt311_clients_talk_to_mqtt5_clients(embedded):
    old = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, "v311", protocol=mqtt.MQTTv311)
    received = []
    old.on_message = lambda client, userdata, message: received.append(message)
    old.connect(embedded.host, embedded.port)
    old.loop_start()
    try:
        with TestClient(embedded, "v5-peer") as peer:
            peer.subscribe("v311/up")
            old.subscribe("v311/down", qos=1)
            old.publish("v311/up", b"from 3.1.1", qos=1).wait_for_publish(5)
            assert peer.expect("v311/up").payload == b"from 3.1.1"
            deadline = time.monotonic() + 5
            while not received and time.monotonic() < deadline:
                peer.publish("v311/down", b"from 5")  # until the SUBSCRIBE got through
                time.sleep(0.05)
            assert received and received[0].payload == b"from 5"
    finally:
        old.disconnect()
        old.loop_stop()


# ----------------------------------------------------------------------- $SYS
def test_sys_counters_appear_and_increase(embedded):
    topics = [f"$SYS/broker/{n}" for n in ("messages/received", "bytes/sent")]
    with TestClient(embedded, "sys-watch") as watch, TestClient(embedded, "sys-load") as load:
        for topic in topics:
            watch.subscribe(topic, qos=0)
        first = {}
        while len(first) < 2:
            message = watch.expect(timeout=3)
            first[message.topic] = int(message.payload)
        for _ in range(5):
            load.publish("sys/load", b"x" * 100)
        later: dict[str, int] = {}
        deadline = time.monotonic() + 4
        while set(later) != set(topics) and time.monotonic() < deadline:
            message = watch.expect(timeout=3)
            if int(message.payload) > first[message.topic]:
                later[message.topic] = int(message.payload)
        assert set(later) == set(topics), (first, later)
        assert later["$SYS/broker/bytes/sent"] > first["$SYS/broker/bytes/sent"]


# ----------------------------------------------------------------------- robustness
MALFORMED = {
    "topic longer than the packet": _packet(0x30, b"\x00\x64ab"),
    "unknown property": _packet(0x30, _str("t") + b"\x02\x7f\x00payload"),
    "invalid UTF-8 topic": _packet(0x30, _str(b"\xff\xfe") + b"\x00"),
    "QoS 3": _packet(0x36, _str("t") + b"\x00\x01\x00"),
    "SUBSCRIBE with reserved flags 0": _packet(0x80, b"\x00\x01\x00" + _str("t") + b"\x01"),
    "remaining length of 5 bytes": b"\x30\xff\xff\xff\xff\x7f",
    "a second CONNECT": connect_packet("again"),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_a_malformed_packet_closes_only_that_connection(embedded, case):
    slug = case.replace(" ", "-")
    with TestClient(embedded, f"bystander-{slug}") as bystander:
        bystander.subscribe(f"bystander/{slug}")
        raw = Raw(embedded).connect(f"malformed-{slug}")
        raw.send(MALFORMED[case])
        disconnect = raw.packet()
        assert disconnect[0] == 0xE0 and disconnect[2] in (0x81, 0x82), disconnect
        assert raw.closed_by_broker()
        bystander.publish(f"bystander/{slug}", b"still here")
        assert bystander.expect(f"bystander/{slug}").payload == b"still here"
    roundtrip(embedded, f"after-{slug}")


def test_old_protocols_and_garbage_are_refused(embedded):
    # MQTT 3.1 (protocol level 3): CONNACK "unacceptable protocol version", then closed.
    raw = Raw(embedded).send(connect_packet("v31", name="MQIsdp", level=3))
    assert raw.packet() == b"\x20\x02\x00\x01" and raw.closed_by_broker()
    # A future level: MQTT 5's 0x84 Unsupported Protocol Version.
    raw = Raw(embedded).send(connect_packet("v6", level=6))
    assert raw.packet() == b"\x20\x03\x00\x84\x00" and raw.closed_by_broker()
    # Not MQTT at all: closed without an answer.
    raw = Raw(embedded).send(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    with pytest.raises(EOFError):
        raw.packet()
    roundtrip(embedded, "after-garbage")
    assert embedded.running


# ----------------------------------------------------------------------- the process
def test_start_on_a_taken_port_reports_the_log(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(BrokerError, match="Address already in use"):
            EmbeddedBroker(tmp_path, port=port).start()


# ----------------------------------------------------------------------- the real agent
@pytest.fixture
def cloud(tmp_path):
    return Cloud(tmp_path / "cloud")


@pytest.mark.parametrize(
    "case",
    [
        # A base bundle applied, status retained, a rule request (response topic +
        # correlation data) answered and its rules released.
        agent_e2e.test_rule_request_answer_and_release,
        # Restart of the broker (the session and queued bundles survive) and an offline agent.
        agent_e2e.test_broker_restart_and_offline_agent_receive_what_was_missed,
        # Manual acknowledgement after the commit; the last will on kill -9.
        agent_e2e.test_acknowledged_bundles_are_not_redelivered_and_last_will_marks_offline,
    ],
    ids=lambda case: case.__name__.removeprefix("test_"),
)
def test_the_agent_end_to_end(case, tmp_path, make_embedded, cloud):
    case(tmp_path, make_embedded, cloud)
