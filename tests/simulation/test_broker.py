"""The private-broker fixtures really behave like the Mosquitto the agent will meet.

These are the broker guarantees the agent's design relies on (DESIGN.md section 4): delivery,
authentication and, above all, QoS 1 messages queued for an offline persistent session
surviving a broker restart. If one of them fails, integration tests built on the fixtures would
test nothing. The per-device ACL is the shipped one, tested in tests/agent/test_deploy_broker.py.
"""

from __future__ import annotations

import socket
from collections.abc import Callable

import pytest

import simulations.brokerprocess as brokerprocess
import tests.support.broker as broker_module
from tests.support.broker import Broker, MqttError, TestClient, mosquitto_version

pytestmark = pytest.mark.process

PASSWORDS = {"dev1": "pw-dev1", "dev2": "pw-dev2", "cloud": "pw-cloud"}


def client(broker: Broker, user: str, **kwargs: object) -> TestClient:
    return TestClient(broker, user, username=user, password=PASSWORDS[user], **kwargs)


def test_mosquitto_is_version_2():
    # Mosquitto 2 changed defaults the fixtures depend on (no anonymous access by default,
    # per_listener_settings) — a 1.x broker would need a different config.
    assert mosquitto_version() >= (2, 0, 0)


def test_publish_subscribe_round_trip(broker: Broker):
    with TestClient(broker, "rt-sub") as sub, TestClient(broker, "rt-pub") as pub:
        assert sub.subscribe("test/round-trip/#", qos=1).value == 1  # granted QoS 1
        assert not pub.publish("test/round-trip/a", b"\x00payload\xff", qos=1).is_failure
        message = sub.expect("test/round-trip/a")
        assert message.payload == b"\x00payload\xff"
        assert message.qos == 1


def test_restart_keeps_the_port(make_broker: Callable[..., Broker]):
    broker = make_broker(persistence=False)
    port = broker.port
    broker.restart()
    assert broker.port == port
    with TestClient(broker, "after-restart") as c:
        assert c.subscribe("x").value == 1


def test_wrong_password_is_rejected(make_broker: Callable[..., Broker]):
    broker = make_broker(users=PASSWORDS)
    refused = TestClient(broker, "dev1", username="dev1", password="not-the-password")
    reason = refused.connect()
    # Mosquitto 2.0.11 answers a v5 client's bad password with 0x87 "Not authorized"
    # (not 0x86 "Bad user name or password"): accept either, the point is the refusal.
    assert reason.is_failure, reason
    assert reason.value in (0x86, 0x87)
    anonymous = TestClient(broker, "anon")
    assert anonymous.connect().is_failure
    with client(broker, "dev1") as dev1:
        assert dev1.connect_reason is not None and not dev1.connect_reason.is_failure


def test_queued_qos1_message_survives_subscriber_offline_and_broker_restart(
    make_broker: Callable[..., Broker],
):
    broker = make_broker()
    persistent = {"clean_start": False, "session_expiry": 3600}

    # The agent's first connection: creates the session and its QoS 1 subscription.
    device = TestClient(broker, "dev-persistent", **persistent)
    assert not device.connect().is_failure
    assert device.session_present is False
    device.subscribe("zodiac/farm1/dev-persistent/bundle", qos=1)
    device.disconnect()

    # While the device is offline the cloud publishes a bundle, then the broker restarts.
    with TestClient(broker, "cloud-pub") as cloud:
        assert not cloud.publish("zodiac/farm1/dev-persistent/bundle", b"bundle v1").is_failure
    broker.restart()

    # The device reconnects to its old session and receives the queued bundle, without
    # subscribing again.
    device = TestClient(broker, "dev-persistent", **persistent)
    assert not device.connect().is_failure
    try:
        assert device.session_present is True
        message = device.expect("zodiac/farm1/dev-persistent/bundle")
        assert message.payload == b"bundle v1"
        assert message.qos == 1
    finally:
        device.disconnect()


def test_without_persistence_a_restart_forgets_the_session(make_broker: Callable[..., Broker]):
    # The control for the test above: proves the restart really is a new broker process.
    broker = make_broker(persistence=False)
    persistent = {"clean_start": False, "session_expiry": 3600}
    device = TestClient(broker, "dev-volatile", **persistent)
    device.connect()
    device.subscribe("q/volatile", qos=1)
    device.disconnect()
    with TestClient(broker, "pub-volatile") as pub:
        pub.publish("q/volatile", b"lost")
    broker.restart()
    device = TestClient(broker, "dev-volatile", **persistent)
    device.connect()
    try:
        assert device.session_present is False
        with pytest.raises(MqttError):
            device.expect(timeout=0.3)
    finally:
        device.disconnect()


def test_start_failure_reports_the_log(tmp_path, monkeypatch):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        # An explicit port in use: no retry, a clear error with mosquitto's own words.
        with pytest.raises(broker_module.BrokerError, match="Address already in use"):
            Broker(tmp_path / "explicit", port=port).start()
        # A picked port that was taken meanwhile: start retries on another one. (The pick is
        # made in simulations.brokerprocess, the life cycle shared with the embedded broker.)
        picks = iter([port])
        real_free_port = brokerprocess.free_port
        monkeypatch.setattr(
            brokerprocess, "free_port", lambda host: next(picks, None) or real_free_port(host)
        )
        with Broker(tmp_path / "picked") as retried:
            assert retried.port != port
        assert next(picks, None) is None  # the taken port really was tried first
