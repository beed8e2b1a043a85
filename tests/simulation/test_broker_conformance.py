"""What the agents need from an MQTT v5 broker, checked the same way against every broker we run.

Each test is one row of the feature table in ``simulations/mqttbroker/__init__.py``: MQTT v5
CONNECT, QoS 0, QoS 1 (PUBACK), topic wildcards, retained messages, wills (on an abrupt close;
by DISCONNECT reason), response topic and correlation data, user properties and the other
PUBLISH properties, persistent sessions (``clean_start=False`` + session expiry) with QoS 1
messages queued while the client is offline, clean start, redelivery of an unacknowledged QoS 1
message, session expiry, and a broker restart that keeps sessions, queued messages and
retained messages. Every test runs against Mosquitto (the reference: it passes everything) and
the embedded broker of ``simulations/mqttbroker``, each a real child process on a free loopback
port, with paho-mqtt 2.x MQTT v5 clients (``CallbackAPIVersion.VERSION2``), as the agents use.
A row tests its own feature: messages are QoS 0 wherever QoS 1 is not the point, so a broker
without QoS 1 still gets a fair answer on wildcards, retained messages or properties.

The tests take a started broker (``host``, ``port``, ``restart()``) and nothing else from
pytest, so the same functions can be run against a candidate broker by a script that starts it:
that is how the Python brokers on PyPI were measured for the table.

Ordering instead of sleeps: one publisher's messages reach one subscriber in order, so a later
message acts as a barrier for an earlier one. The one sleep is session expiry's: a session must
be seen gone after its interval.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode

from simulations.brokerprocess import BrokerProcess
from simulations.mqttbroker import EmbeddedBroker
from tests.support.broker import Broker, MqttError, TestClient, mosquitto_available

pytestmark = pytest.mark.process

# The brokers every test runs against: a name and how to make one in a directory.
BROKERS: dict[str, Callable[[Path], BrokerProcess]] = {
    "mosquitto": lambda directory: Broker(directory),
    "embedded": lambda directory: EmbeddedBroker(directory, sys_interval=0),
}

PERSISTENT = {"clean_start": False, "session_expiry": 3600}


@pytest.fixture(scope="module", params=sorted(BROKERS))
def kind(request: pytest.FixtureRequest) -> str:
    if request.param == "mosquitto" and not mosquitto_available():
        # A failure, not a skip: the reference must be there for the comparison to mean anything.
        pytest.fail("mosquitto is not installed (apt-get install mosquitto)")
    return request.param


@pytest.fixture(scope="module")
def broker(kind: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """One broker of each kind for the module; tests use their own client ids and topics."""
    with BROKERS[kind](tmp_path_factory.mktemp(kind)) as shared:
        yield shared


@pytest.fixture
def fresh_broker(kind: str, tmp_path: Path) -> Iterator[BrokerProcess]:
    """A broker of its own, for a test that restarts it."""
    with BROKERS[kind](tmp_path / kind) as own:
        yield own


def barrier(pub: TestClient, sub: TestClient, topic: str) -> list[mqtt.MQTTMessage]:
    """Everything ``sub`` received before ``pub``'s barrier message on ``topic``."""
    pub.publish(topic, b"barrier", qos=0)
    before = []
    while (message := sub.expect()).topic != topic:
        before.append(message)
    return before


def settle(client: TestClient, topic: str) -> None:
    """Return once the broker has handled everything ``client`` published so far: a broker
    handles one connection's packets in order, so a QoS 0 message to itself (``client`` must
    be subscribed to ``topic``) comes back after them."""
    client.publish(topic, b"settle", qos=0)
    client.expect(topic)


def abrupt_close(client: TestClient) -> None:
    """Close the client's socket without a DISCONNECT, as a crashed device would."""
    client.client.loop_stop()
    sock = client.client.socket()
    assert sock is not None, f"{client.client_id} has no socket"
    sock.close()


# ----------------------------------------------------------------------- the features
def test_mqtt5_connect(broker):
    client = TestClient(broker, "v5-connect")
    reason = client.connect()
    try:
        assert not reason.is_failure, reason
        assert client.session_present is False  # clean start: no session to resume
    finally:
        client.disconnect()


def test_qos0_publish_subscribe(broker):
    with TestClient(broker, "q0-sub") as sub, TestClient(broker, "q0-pub") as pub:
        assert sub.subscribe("q0/x", qos=0).value == 0
        pub.publish("q0/x", b"at most once", qos=0)
        message = sub.expect("q0/x")
        assert (message.payload, message.qos) == (b"at most once", 0)


def test_qos1_puback_and_delivery(broker):
    with TestClient(broker, "q1-sub") as sub, TestClient(broker, "q1-pub") as pub:
        assert sub.subscribe("q1/x", qos=1).value == 1  # granted QoS 1
        assert pub.publish("q1/x", b"at least once", qos=1).value == 0  # PUBACK: success
        message = sub.expect("q1/x")
        assert (message.payload, message.qos) == (b"at least once", 1)
        # Delivered QoS = min(publish, subscription).
        assert sub.subscribe("q1/low", qos=0).value == 0
        pub.publish("q1/low", b"downgraded", qos=1)
        assert sub.expect("q1/low").qos == 0


def test_topic_wildcards(broker):
    with (
        TestClient(broker, "wc-plus") as plus,
        TestClient(broker, "wc-hash") as hashed,
        TestClient(broker, "wc-pub") as pub,
    ):
        assert plus.subscribe("wc/+/temp", qos=0).value == 0
        assert hashed.subscribe("wc/#", qos=0).value == 0
        pub.publish("wc/t1/temp", b"21.5", qos=0)
        pub.publish("wc/t1/power", b"800", qos=0)
        pub.publish("wc", b"root", qos=0)  # '#' also matches the parent level
        assert plus.expect("wc/t1/temp").payload == b"21.5"
        assert [m.topic for m in (hashed.expect() for _ in range(3))] == [
            "wc/t1/temp",
            "wc/t1/power",
            "wc",
        ]
        assert barrier(pub, plus, "wc/t2/temp") == []  # power and the root did not match


def test_retained_messages(broker):
    with TestClient(broker, "ret-pub") as pub:
        pub.subscribe("ret-sync/pub", qos=0)
        pub.publish("ret/status", b"online", qos=0, retain=True)
        settle(pub, "ret-sync/pub")
        with TestClient(broker, "ret-late") as late:  # subscribes after the publication
            late.subscribe("ret/+", qos=0)
            message = late.expect("ret/status")
            assert (message.payload, message.retain) == (b"online", True)
            pub.publish("ret/status", b"offline", qos=0, retain=True)
            live = late.expect("ret/status")
            assert live.payload == b"offline" and not live.retain  # a live copy: flag off
        pub.publish("ret/status", b"", qos=0, retain=True)  # an empty payload clears it
        settle(pub, "ret-sync/pub")
        with TestClient(broker, "ret-after-clear") as after:
            after.subscribe("ret/#", qos=0)
            assert barrier(pub, after, "ret/barrier") == []


def will_client(broker: BrokerProcess, name: str) -> TestClient:
    """A connected client whose will, published at once (Will Delay 0), is ``will/<name>``."""
    client = TestClient(broker, f"will-{name}")
    no_delay = Properties(PacketTypes.WILLMESSAGE)
    no_delay.WillDelayInterval = 0
    client.client.will_set(f"will/{name}", b"gone", qos=0, properties=no_delay)
    assert not client.connect().is_failure
    return client


def test_will_on_abrupt_disconnect(broker):
    with TestClient(broker, "will-watch") as watch:
        watch.subscribe("will/abrupt", qos=0)
        abrupt_close(will_client(broker, "abrupt"))  # the socket just closes
        assert watch.expect("will/abrupt").payload == b"gone"


def test_will_per_disconnect_reason(broker):
    with TestClient(broker, "nowill-watch") as watch, TestClient(broker, "nowill-pub") as pub:
        watch.subscribe("will/+", qos=0)
        for name, reason in (("normal", 0), ("with-will", 4)):
            client = will_client(broker, name)
            # DISCONNECT 0x00 discards the will; 0x04 "with will message" asks for it.
            client.client.disconnect(ReasonCode(PacketTypes.DISCONNECT, identifier=reason))
            client.client.loop_stop()
        assert watch.expect().topic == "will/with-will"
        assert barrier(pub, watch, "will/barrier") == []  # nothing from "will-normal"


def test_response_topic_and_correlation_data(broker):
    """A rule request: the device asks, the cloud answers on the response topic, and the
    correlation data (binary, any bytes) comes back unchanged."""
    with TestClient(broker, "rr-device") as device, TestClient(broker, "rr-cloud") as cloud:
        cloud.subscribe("rr/device/request", qos=0)
        device.subscribe("rr/device/reply", qos=0)
        request = Properties(PacketTypes.PUBLISH)
        request.ResponseTopic = "rr/device/reply"
        request.CorrelationData = b"\x00req-42\xff"
        device.publish("rr/device/request", b"rules?", qos=0, properties=request)
        asked = cloud.expect("rr/device/request")
        assert asked.properties.ResponseTopic == "rr/device/reply"
        assert asked.properties.CorrelationData == b"\x00req-42\xff"
        answer = Properties(PacketTypes.PUBLISH)
        answer.CorrelationData = asked.properties.CorrelationData
        cloud.publish(asked.properties.ResponseTopic, b"rules!", qos=0, properties=answer)
        reply = device.expect("rr/device/reply")
        assert (reply.payload, reply.properties.CorrelationData) == (b"rules!", b"\x00req-42\xff")


def test_user_properties(broker):
    with TestClient(broker, "up-sub") as sub, TestClient(broker, "up-pub") as pub:
        sub.subscribe("up/x", qos=0)
        props = Properties(PacketTypes.PUBLISH)
        # Order and repeated keys are part of the value.
        props.UserProperty = [("device", "t1"), ("device", "t2"), ("ünïcode", "✓")]
        pub.publish("up/x", b"payload", qos=0, properties=props)
        got = sub.expect("up/x")
        assert got.payload == b"payload"
        assert got.properties.UserProperty == [
            ("device", "t1"),
            ("device", "t2"),
            ("ünïcode", "✓"),
        ]


def test_content_type_payload_format_and_message_expiry(broker):
    with TestClient(broker, "mp-sub") as sub, TestClient(broker, "mp-pub") as pub:
        sub.subscribe("mp/x", qos=0)
        props = Properties(PacketTypes.PUBLISH)
        props.ContentType = "application/msgpack"
        props.PayloadFormatIndicator = 0
        props.MessageExpiryInterval = 3600
        pub.publish("mp/x", b"\x81\xa1k\x01", qos=0, properties=props)
        got = sub.expect("mp/x")
        assert got.payload == b"\x81\xa1k\x01"
        assert got.properties.ContentType == "application/msgpack"
        assert 3590 <= got.properties.MessageExpiryInterval <= 3600  # the time left


def test_persistent_session_queues_qos1_while_offline(broker):
    device = TestClient(broker, "ps-device", **PERSISTENT)
    assert not device.connect().is_failure and device.session_present is False
    device.subscribe("ps/bundle", qos=1)
    device.disconnect()
    with TestClient(broker, "ps-cloud") as cloud:
        for i in range(3):
            assert cloud.publish("ps/bundle", f"v{i}".encode(), qos=1).value == 0
    device = TestClient(broker, "ps-device", **PERSISTENT)
    device.connect()
    try:
        assert device.session_present is True
        got = [device.expect("ps/bundle") for _ in range(3)]
        assert [(m.payload, m.qos) for m in got] == [(b"v0", 1), (b"v1", 1), (b"v2", 1)]
        with pytest.raises(MqttError):  # each once
            device.expect(timeout=0.3)
    finally:
        device.disconnect()


def test_clean_start_discards_the_session(broker):
    device = TestClient(broker, "cs-device", **PERSISTENT)
    device.connect()
    device.subscribe("cs/bundle", qos=1)
    device.disconnect()
    # clean_start=True: a new session (kept 3600 s after this connection), no subscriptions.
    fresh = TestClient(broker, "cs-device", clean_start=True, session_expiry=3600)
    fresh.connect()
    assert fresh.session_present is False
    fresh.disconnect()
    with TestClient(broker, "cs-cloud") as cloud:
        cloud.publish("cs/bundle", b"for nobody", qos=1)
    again = TestClient(broker, "cs-device", **PERSISTENT)
    again.connect()
    try:
        assert again.session_present is True  # the new session, kept by its expiry
        with pytest.raises(MqttError):  # without the old subscription: nothing queued
            again.expect(timeout=0.3)
    finally:
        again.disconnect()


def test_unacknowledged_qos1_message_is_redelivered(broker):
    """The agent acknowledges a bundle only once it is committed: a device that dies before
    that gets the bundle again when it comes back."""
    device = TestClient(broker, "ack-device", manual_ack=True, **PERSISTENT)
    device.connect()
    device.subscribe("ack/bundle", qos=1)
    with TestClient(broker, "ack-cloud") as cloud:
        cloud.publish("ack/bundle", b"bundle v1", qos=1)
        assert device.expect("ack/bundle").payload == b"bundle v1"  # received, never acked
        abrupt_close(device)
        device = TestClient(broker, "ack-device", manual_ack=True, **PERSISTENT)
        device.connect()
        try:
            again = device.expect("ack/bundle")
            assert (again.payload, again.qos) == (b"bundle v1", 1)
            device.client.ack(again.mid, again.qos)
            device.disconnect()
            device = TestClient(broker, "ack-device", manual_ack=True, **PERSISTENT)
            device.connect()
            with pytest.raises(MqttError):  # acknowledged: not sent a third time
                device.expect(timeout=0.3)
        finally:
            device.disconnect()


def test_session_expiry(broker):
    def reconnect() -> bool:
        device = TestClient(broker, "exp-device", clean_start=False, session_expiry=1)
        device.connect()
        device.disconnect()
        return bool(device.session_present)

    reconnect()
    assert reconnect() is True  # back within the interval: the session is still there
    time.sleep(2.5)  # past the 1 s interval and the broker's once-a-second expiry check
    assert reconnect() is False


def test_restart_keeps_sessions_queued_messages_and_retained(fresh_broker):
    broker = fresh_broker
    device = TestClient(broker, "rs-device", **PERSISTENT)
    device.connect()
    device.subscribe("rs/bundle", qos=1)
    device.disconnect()
    with TestClient(broker, "rs-cloud") as cloud:
        cloud.publish("rs/status", b"retained", qos=1, retain=True)
        cloud.publish("rs/bundle", b"queued while offline", qos=1)
    port, pid = broker.port, broker.pid
    broker.restart()
    assert broker.port == port and broker.pid != pid  # another process, the same address
    device = TestClient(broker, "rs-device", **PERSISTENT)
    device.connect()
    try:
        assert device.session_present is True
        message = device.expect("rs/bundle")
        assert (message.payload, message.qos) == (b"queued while offline", 1)
        device.subscribe("rs/status", qos=1)
        retained = device.expect("rs/status")
        assert (retained.payload, retained.retain) == (b"retained", True)
    finally:
        device.disconnect()
