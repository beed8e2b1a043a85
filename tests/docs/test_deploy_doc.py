"""docs/deploy.md's OpenSSL commands make a PKI the shipped broker's TLS option accepts.

The block of "The broker over TLS, a certificate per device" is run with bash as an operator
would run it, in an empty folder, with two changes: the broker's address is 127.0.0.1 (where the
test's broker listens) and its last two lines (installing into /etc/mosquitto and restarting
the system's broker) are left out. The shipped configuration with its TLS option then runs on
those files (`DeployedBroker(pki=...)`), and real MQTT clients with the device certificates the
block made show that each is its device: its own topics, not its neighbour's.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support.broker import MqttError, TestClient

pytestmark = pytest.mark.process

DOC = Path(__file__).resolve().parents[2] / "docs" / "deploy.md"
SECTION = "## The broker over TLS, a certificate per device"
LEFT_OUT = ("install -m 640 -g mosquitto ", "systemctl restart mosquitto")
NOT_AUTHORIZED = 0x87


def openssl_block() -> str:
    section = DOC.read_text().split(SECTION, 1)[1].split("\n## ", 1)[0]
    block = re.search(r"^```sh\n(.*?)^```$", section, re.DOTALL | re.MULTILINE)
    assert block, f"no sh block under {SECTION!r}"
    lines = block[1].splitlines()
    kept = [line for line in lines if not line.startswith(LEFT_OUT)]
    assert len(kept) == len(lines) - len(LEFT_OUT), "the block's last lines changed"
    script = "\n".join(kept) + "\n"
    script, count = re.subn(r"(?m)^broker_ip=.*$", "broker_ip=127.0.0.1", script)
    assert count == 1
    return script


@pytest.mark.skipif(shutil.which("openssl") is None, reason="no openssl")
def test_the_documented_certificates_serve_the_tls_option(tmp_path, make_deployed_broker):
    pki = tmp_path / "pki"
    pki.mkdir()
    result = subprocess.run(
        ["bash", "-e", "-o", "pipefail", "-c", openssl_block()],
        cwd=pki,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    broker = make_deployed_broker(
        farms={"north-sea-1": ["turbine-01", "turbine-02"]}, tls=True, pki=pki
    )

    def device(name: str) -> TestClient:
        return TestClient(
            broker,
            "any-id",
            ca_file=pki / "ca.pem",
            cert_file=pki / f"north-sea-1-{name}.pem",
            key_file=pki / f"north-sea-1-{name}.key",
            port=broker.tls_port,
        )

    with device("turbine-01") as t1:
        assert not t1.publish("zodiac/north-sea-1/turbine-01/status", b"mine").is_failure
        forged = t1.publish("zodiac/north-sea-1/turbine-02/status", b"forged")
        assert forged.value == NOT_AUTHORIZED
    with device("turbine-02") as t2:
        assert not t2.publish("zodiac/north-sea-1/turbine-02/status", b"mine").is_failure
    anonymous = TestClient(broker, "x", ca_file=pki / "ca.pem", port=broker.tls_port, timeout=2)
    with pytest.raises((OSError, MqttError)):
        anonymous.connect()
    log = broker.log_file.read_text()
    assert "u'north-sea-1/turbine-01'" in log and "u'north-sea-1/turbine-02'" in log
