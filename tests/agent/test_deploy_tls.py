"""A farm over TLS with a client certificate per device (docs/deploy.md, "The broker over TLS").

The broker is the shipped ``deploy/mosquitto/`` configuration with its documented TLS option
enabled (`DeployedBroker`: only ports and paths differ): ``require_certificate true`` and
``use_identity_as_username true`` beside the shipped ACL. The PKI is made in the test with the
``cryptography`` package: a CA, the broker's certificate, and one certificate per device whose
Common Name is the device's username ``<farm>/<device>``.

What a farm relies on, each seen with real MQTT v5 clients: a device with its certificate
connects and may publish its own topics; a client without a certificate, or with one of another
CA, gets no session; a device's certificate gives the rights of that device only (the ACL's
``%u`` is the certificate's Common Name), so t2's certificate cannot publish t1's topics; and a
real agent, configured with the ``[broker]`` TLS options of agent.example.toml and no password,
connects with its certificate and applies a bundle the cloud sends.
"""

from __future__ import annotations

import pytest

from tests.support.agent_harness import AgentProcess, Cloud, StatusWatcher, write_config
from tests.support.broker import MqttError, TestClient, make_tls_files

pytestmark = pytest.mark.process

FARMS = {"farm1": ["t1", "t2"]}
NOT_AUTHORIZED = 0x87
OWN_TOPICS = ("status", "telemetry", "request")


@pytest.fixture
def broker(make_deployed_broker):
    return make_deployed_broker(farms=FARMS, tls=True, tls_devices=True)


def device(broker, username: str, client_id: str = "any-id", **tls) -> TestClient:
    """A client on the TLS listener with ``username``'s certificate (or the given files)."""
    files = tls or broker.device_tls_files(username)
    return TestClient(broker, client_id, port=broker.tls_port, **files)


def test_a_device_with_its_certificate_publishes_its_own_topics(broker):
    with device(broker, "farm1/t1") as t1, broker.client("cloud") as cloud:
        cloud.subscribe("zodiac/farm1/t1/+")
        for topic in OWN_TOPICS:
            assert not t1.publish(f"zodiac/farm1/t1/{topic}", topic.encode()).is_failure
        received = {cloud.expect().topic for _ in OWN_TOPICS}
        assert received == {f"zodiac/farm1/t1/{topic}" for topic in OWN_TOPICS}
    # No password was given: the broker took the username from the certificate.
    assert "as farm1/t1 " in broker.log_file.read_text()


def test_without_a_certificate_or_with_another_cas_there_is_no_session(broker, tmp_path):
    files = broker.tls_files
    assert files is not None
    anonymous = TestClient(broker, "x", ca_file=files.ca_cert, port=broker.tls_port, timeout=2)
    with pytest.raises((OSError, MqttError)):
        anonymous.connect()
    stranger = make_tls_files(tmp_path / "stranger", client_name="farm1/t1")
    forged = TestClient(
        broker,
        "y",
        ca_file=files.ca_cert,  # (the broker is verified; the client's CA is not the farm's)
        cert_file=stranger.client_cert,
        key_file=stranger.client_key,
        port=broker.tls_port,
        timeout=2,
    )
    with pytest.raises((OSError, MqttError)):
        forged.connect()
    # A password does not open the TLS listener either: the certificate is the identity.
    with_password = TestClient(
        broker,
        "z",
        username="farm1/t1",
        password=broker.password("farm1/t1"),
        ca_file=files.ca_cert,
        port=broker.tls_port,
        timeout=2,
    )
    with pytest.raises((OSError, MqttError)):
        with_password.connect()


def test_another_devices_certificate_cannot_publish_the_first_devices_topics(broker):
    with device(broker, "farm1/t2") as t2, broker.client("cloud") as cloud:
        cloud.subscribe("zodiac/farm1/+/+")
        for topic in OWN_TOPICS:
            result = t2.publish(f"zodiac/farm1/t1/{topic}", b"forged")
            assert result.value == NOT_AUTHORIZED, topic
            assert not t2.publish(f"zodiac/farm1/t2/{topic}", b"mine").is_failure
        # Only t2's own messages were routed.
        received = {cloud.expect().topic for _ in OWN_TOPICS}
        assert received == {f"zodiac/farm1/t2/{topic}" for topic in OWN_TOPICS}
        assert cloud.drain() == []
        # Nor can it read t1's bundles: the first message it gets is its own.
        t2.subscribe("zodiac/farm1/t1/bundle")
        t2.subscribe("zodiac/farm1/t2/bundle")
        assert not cloud.publish("zodiac/farm1/t1/bundle", b"for t1").is_failure
        assert not cloud.publish("zodiac/farm1/t2/bundle", b"for t2").is_failure
        assert t2.expect().payload == b"for t2"
        assert t2.drain() == []


def test_an_agent_with_the_tls_options_applies_a_bundle(broker, tmp_path):
    cloud = Cloud(tmp_path / "cloud")
    tls = broker.device_tls_files("farm1/t1")
    options = (
        "tls = true\n"
        f'ca_file = "{tls["ca_file"]}"\n'
        f'cert_file = "{tls["cert_file"]}"\n'
        f'key_file = "{tls["key_file"]}"\n'
    )
    config = write_config(tmp_path / "t1", broker, cloud.keys, broker_extra=options)
    text = config.read_text().replace(f"port = {broker.port}\n", f"port = {broker.tls_port}\n")
    config.write_text(text)
    rules = {"hot": "hot: <Hot>(X) :- <temp>(X, T) and COMP(T, >, 30) ."}
    with AgentProcess(config) as agent, broker.client("cloud") as client:
        watcher = StatusWatcher(client, "farm1", "t1")
        watcher.wait(lambda s: s.online, timeout=20)
        bundle = cloud.bundle("base", 1, rules=rules, facts=[("temp", "t1", 35)])
        assert not client.publish("zodiac/farm1/t1/bundle", cloud.sign(bundle)).is_failure
        status = watcher.wait(lambda s: s.applied.get("base") == 1)
        assert status.rules == 1 and status.last_error is None
        assert agent.terminate() == 0
    # Its identity is the certificate's: no password in its configuration, none sent.
    assert "password" not in config.read_text() and "username" not in config.read_text()
    log = broker.log_file.read_text()
    assert "as farm1/t1 (" in log and "u'farm1/t1')" in log
