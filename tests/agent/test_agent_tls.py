"""The agent's ``[broker]`` TLS options against a real Mosquitto TLS listener.

Why end to end: ``tls``, ``ca_file``, ``cert_file`` and ``key_file`` only matter if paho,
OpenSSL and Mosquitto agree on them; a unit test of `make_client` would only show that we pass
the paths along. Each test gets a throwaway PKI (``make_tls_files``) and a broker whose only
listener is TLS, so an agent that silently fell back to clear text could not connect at all.

The third test is the one that matters in the field: a device with the wrong CA must not talk
to the broker (no status ever appears), must say why in its log, and must keep retrying rather
than crash — the operator fixes the CA file and the service recovers without a restart loop.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.support.agent_harness import AgentProcess, Cloud, StatusWatcher, write_config
from tests.support.broker import MqttError, TestClient, TlsFiles, make_tls_files

FARM = "farm1"
RULES = {"hot": "hot: <Hot>(X) :- <temp>(X, T) and COMP(T, >, 30) ."}


def tls_options(ca_file: Path, cert_file: Path | None = None, key_file: Path | None = None) -> str:
    """The ``[broker]`` lines for `write_config`'s ``broker_extra``."""
    lines = ["tls = true", f'ca_file = "{ca_file}"']
    if cert_file is not None and key_file is not None:
        lines += [f'cert_file = "{cert_file}"', f'key_file = "{key_file}"']
    return "\n".join(lines) + "\n"


@pytest.fixture
def cloud(tmp_path: Path) -> Cloud:
    return Cloud(tmp_path / "cloud")


@pytest.fixture
def pki(tmp_path: Path) -> TlsFiles:
    return make_tls_files(tmp_path / "pki")


def cloud_client(broker, pki: TlsFiles, client_id: str) -> TestClient:
    """The test's own connection, as the cloud: client certificate included (harmless when the
    broker does not ask for one, required when it does)."""
    return TestClient(
        broker,
        client_id,
        ca_file=pki.ca_cert,
        cert_file=pki.client_cert,
        key_file=pki.client_key,
    )


def apply_one_bundle(agent: AgentProcess, client: TestClient, cloud: Cloud) -> None:
    """The e2e pattern: wait until the agent is online (subscribed), publish, see it applied."""
    watcher = StatusWatcher(client, FARM, "t1")
    watcher.wait(lambda s: s.online, timeout=15)
    bundle = cloud.bundle("base", 1, rules=RULES, facts=[("temp", "t1", 35)])
    client.publish(f"zodiac/{FARM}/t1/bundle", cloud.sign(bundle))
    status = watcher.wait(lambda s: s.applied.get("base") == 1)
    assert status.rules == 1 and status.last_error is None
    agent.wait_log("applied")
    assert not [e for e in agent.log_lines() if e.get("message") == "connection failed"]
    assert agent.terminate() == 0


def test_agent_verifies_the_broker_with_ca_file(tmp_path, make_broker, cloud, pki):
    broker = make_broker(tls=pki)
    options = tls_options(pki.ca_cert)
    config = write_config(tmp_path / "t1", broker, cloud.keys, broker_extra=options)
    with AgentProcess(config) as agent, cloud_client(broker, pki, "cloud-1") as client:
        apply_one_bundle(agent, client, cloud)


def test_agent_presents_its_client_certificate(tmp_path, make_broker, cloud, pki):
    broker = make_broker(tls=pki, require_certificate=True)
    # The broker really demands a certificate: the same CA without one gets no session.
    anonymous = TestClient(broker, "no-cert", ca_file=pki.ca_cert, timeout=2)
    with pytest.raises((OSError, MqttError)):
        anonymous.connect()
    options = tls_options(pki.ca_cert, pki.client_cert, pki.client_key)
    config = write_config(tmp_path / "t1", broker, cloud.keys, broker_extra=options)
    with AgentProcess(config) as agent, cloud_client(broker, pki, "cloud-1") as client:
        apply_one_bundle(agent, client, cloud)


def test_agent_with_another_ca_is_refused_logs_why_and_keeps_retrying(
    tmp_path, make_broker, cloud, pki
):
    broker = make_broker(tls=pki)
    stranger = make_tls_files(tmp_path / "other-pki")
    options = tls_options(stranger.ca_cert)
    config = write_config(tmp_path / "t1", broker, cloud.keys, broker_extra=options)
    with AgentProcess(config) as agent, cloud_client(broker, pki, "cloud-1") as client:
        watcher = StatusWatcher(client, FARM, "t1")
        # Back-off is 1-2 s (write_config), but paho's first retry comes ~3 s after the first
        # failure: it waits min_delay in its first-connection loop, then the doubled delay in
        # its main loop before reconnecting. A second failure proves the agent retries.
        first = agent.wait_log("connection failed", timeout=15)
        second = agent.wait_log("connection failed", timeout=10, count=2)
        for failure in (first, second):
            assert failure["level"] == "WARNING"
            assert "CERTIFICATE_VERIFY_FAILED" in failure["error"], failure
            assert failure["port"] == broker.port and failure["tls"] is True
        # Never connected, so never online: no status (not even a retained one) was published.
        with pytest.raises(AssertionError, match="no matching status"):
            watcher.wait(lambda s: True, timeout=1)
        assert not [e for e in agent.log_lines() if e.get("message") == "connected"]
        # Still alive and retrying, and it stops cleanly while disconnected.
        assert agent.process is not None and agent.process.poll() is None
        started = time.monotonic()
        assert agent.terminate() == 0
        assert time.monotonic() - started < 5
    # The broker saw the handshakes fail on its side too (the agent did reach it).
    assert "unknown ca" in broker.log_file.read_text()
