"""Private Mosquitto brokers for tests, plus a small synchronous MQTT client for assertions.

The broker process itself is `simulations.mosquitto.Broker` (the wind-farm simulation runs
the same one); this module adds what only tests need: `DeployedBroker` (the shipped
deployment configuration of ``deploy/mosquitto/``), throwaway TLS certificates and a
synchronous test client.

Why real brokers: the agent's guarantees (persistent sessions, QoS 1 redelivery, retained
status, last will, per-device ACLs) are the *broker's* behaviour as much as ours; a fake broker
would only test our assumptions about Mosquitto. Each `Broker` is a `mosquitto` process with its
own config, password file, ACL file, persistence file and log in a directory the test owns, on a
free port of 127.0.0.1 — so tests never touch the system broker on 1883 and can restart, crash
or reconfigure their broker freely.

Typical use (see also the ``broker`` / ``make_broker`` fixtures in ``tests/conftest.py``)::

    with DeployedBroker(tmp_path, farms={"farm1": ["t1"]}) as broker:
        with broker.client("farm1/t1") as t1:
            t1.subscribe("zodiac/farm1/t1/bundle")

TLS: ``make_tls_files(directory)`` writes a throwaway CA with a server and a client certificate,
and ``Broker(directory, tls=files)`` serves MQTT over TLS only (``require_certificate=True``
also demands a client certificate)::

    files = make_tls_files(tmp_path / "pki")
    with Broker(tmp_path / "b", tls=files) as broker:
        with TestClient(broker, "cloud", ca_file=files.ca_cert) as cloud:
            ...
"""

from __future__ import annotations

import contextlib
import os
import pwd
import queue
import re
import subprocess
import threading
import time
from datetime import UTC, datetime, timedelta
from ipaddress import IPv4Address
from pathlib import Path

import paho.mqtt.client as mqtt
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode

from agent.protocol.mqtt import Tls, mqtt_client
from simulations.mosquitto import (
    MOSQUITTO,
    MOSQUITTO_PASSWD,
    Broker,
    BrokerError,
    TlsFiles,
    free_port,
    mosquitto_available,
    mosquitto_version,
)

__all__ = [
    "MOSQUITTO",
    "MOSQUITTO_PASSWD",
    "Broker",
    "BrokerError",
    "DeployedBroker",
    "TestClient",
    "TlsFiles",
    "free_port",
    "client_files",
    "make_tls_files",
    "mosquitto_available",
    "mosquitto_version",
]


DEPLOY_DIR = Path(__file__).resolve().parents[2] / "deploy" / "mosquitto"


class DeployedBroker(Broker):
    """Mosquitto started from exactly the shipped ``deploy/mosquitto/`` files.

    The configuration, the ACL and the users are the ones an operator installs: the shipped
    ``mosquitto.conf`` with only what must differ substituted (its listeners' ports, on
    127.0.0.1, the paths of the password, ACL, persistence and TLS files, and the user to run
    as), the shipped ``acl``, and the users of ``farms`` (``{farm: [device, ...]}``, each with
    its turbine controller when ``controllers``) and ``cloud`` created by the shipped
    ``add-users`` script. ``tls`` also enables the configuration's documented TLS option (the
    lines it ships commented out) with a throwaway PKI whose client certificate's Common Name
    is ``tls_client``.

    `port` is the devices' listener, `cloud_port` the cloud's, `tls_port` the TLS listener's;
    `client` connects as one of the users, with the password ``add-users`` generated for it.
    """

    stderr_name = "mosquitto.log"  # the shipped configuration logs to stderr

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        farms: dict[str, list[str]],
        controllers: bool = True,
        tls: bool = False,
        tls_client: str = "zodiac-test-client",
        tls_devices: bool = False,
        pki: str | os.PathLike[str] | None = None,
    ) -> None:
        super().__init__(directory)
        self.tls_devices = tls_devices
        self.pki = Path(pki) if pki is not None else None
        self.farms = farms
        self.controllers = controllers
        self.device_tls = tls
        self.tls_client = tls_client
        self.tls_files: TlsFiles | None = None
        self.cloud_port: int | None = None
        self.tls_port: int | None = None
        self._extra_ports_for: int | None = None  # the device port they were picked with

    @property
    def log_file(self) -> Path:
        return self.directory / self.stderr_name

    @property
    def secrets(self) -> Path:
        return self.directory / "secrets"

    def password(self, username: str) -> str:
        """The password ``add-users`` generated for ``username`` (from its secrets file)."""
        farm, _, rest = username.partition("/")
        if not rest:
            name = f"{username}.password"
        else:
            device, _, controller = rest.partition("/")
            name = f"{farm}/{device}{'-controller' if controller else ''}.password"
        return (self.secrets / name).read_text().strip()

    def client(self, username: str, client_id: str | None = None, **kwargs) -> TestClient:
        """A `TestClient` logged in as ``username``; the cloud on its own listener."""
        if username == "cloud":
            kwargs.setdefault("port", self.cloud_port)
        return TestClient(
            self,
            client_id or username,
            username=username,
            password=self.password(username),
            **kwargs,
        )

    def wait_log(self, text: str, offset: int = 0, timeout: float = 10.0) -> None:
        """Wait until the broker's log, from byte ``offset`` on, contains ``text``: the broker
        has done what that line reports (e.g. handled a client's disconnection)."""
        deadline = time.monotonic() + timeout
        while text.encode() not in self._log_since(offset):
            if time.monotonic() > deadline:
                raise BrokerError(f"{text!r} never logged:\n{self.log_tail()}")
            time.sleep(0.01)

    def add_users(self, *args: str) -> subprocess.CompletedProcess[str]:
        """Run the shipped ``add-users`` on this broker's files (raises when it fails)."""
        return subprocess.run(
            [
                str(DEPLOY_DIR / "add-users"),
                "--dir",
                str(self.directory),
                "--secrets",
                str(self.secrets),
                *args,
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )

    def _setup(self) -> None:
        (self.directory / "acl").write_bytes((DEPLOY_DIR / "acl").read_bytes())
        self.add_users("cloud")
        for farm, devices in self.farms.items():
            self.add_users(
                *(["--controllers"] if self.controllers else []), "devices", farm, *devices
            )
        if self.device_tls and self.pki is not None:
            for name in ("ca.pem", "server.pem", "server.key"):
                (self.directory / name).write_bytes((self.pki / name).read_bytes())
        elif self.device_tls:
            # Named as the shipped configuration expects them (ca.pem, server.pem, server.key).
            devices = [f"{farm}/{device}" for farm, names in self.farms.items() for device in names]
            self.tls_files = make_tls_files(
                self.directory,
                client_name=self.tls_client,
                clients=devices if self.tls_devices else (),
            )

    def device_tls_files(self, username: str) -> dict[str, Path]:
        """``ca_file``, ``cert_file`` and ``key_file`` of device ``username``'s certificate
        (``tls_devices``), as `TestClient` takes them."""
        assert self.tls_files is not None and self.tls_devices, "no device certificates"
        cert_file, key_file = client_files(self.directory, username)
        return {"ca_file": self.tls_files.ca_cert, "cert_file": cert_file, "key_file": key_file}

    def _configure(self) -> None:
        if self._extra_ports_for != self.port:  # first start, or a retry on a new port
            self.cloud_port, self.tls_port = free_port(self.host), free_port(self.host)
            self._extra_ports_for = self.port
        text = (DEPLOY_DIR / "mosquitto.conf").read_text()
        if self.device_tls:
            # The documented option: its lines are the only ones commented out without a space.
            text, count = re.subn(r"(?m)^#(?=[a-z])", "", text)
            assert count >= 7, "the TLS option is no longer shipped as commented-out lines"
        substitutions = [
            (r"(?m)^listener 1883$", f"listener {self.port} {self.host}"),
            (r"(?m)^listener 1884 127\.0\.0\.1$", f"listener {self.cloud_port} {self.host}"),
            (r"/etc/mosquitto/zodiac/", f"{self.directory}/"),
            (r"/var/lib/mosquitto/", f"{self.persistence_file.parent}/"),
        ]
        if self.device_tls:
            substitutions.append((r"(?m)^listener 8883$", f"listener {self.tls_port} {self.host}"))
        for pattern, replacement in substitutions:
            text, count = re.subn(pattern, replacement, text)
            # A shipped file that no longer looks as this class expects must fail loudly, not
            # start a broker that differs from it.
            assert count >= 1, f"{pattern!r} not found in the shipped mosquitto.conf"
        # Run as root (CI containers), mosquitto would switch to the `mosquitto` user, which
        # cannot read the test's private directory; as any other user the line is ignored.
        text += f"\nuser {pwd.getpwuid(os.geteuid()).pw_name}\n"
        self.persistence_file.parent.mkdir(parents=True, exist_ok=True)
        self.config_file.write_text(text)


# ------------------------------------------------------------------------------------- TLS
def client_files(directory: str | os.PathLike[str], common_name: str) -> tuple[Path, Path]:
    """The certificate and key files `make_tls_files` writes for a client of ``clients``:
    ``client-<name>.pem`` and ``.key``, the name's slashes made dashes
    (``farm1/t1`` -> ``client-farm1-t1.pem``)."""
    stem = "client-" + common_name.replace("/", "-")
    directory = Path(directory).resolve()
    return directory / f"{stem}.pem", directory / f"{stem}.key"


def make_tls_files(
    directory: str | os.PathLike[str],
    *,
    client_name: str = "zodiac-test-client",
    clients: tuple[str, ...] | list[str] = (),
) -> TlsFiles:
    """Generate a fresh CA, server and client certificate as PEM files in ``directory``.

    ``clients`` are more client certificates of the same CA, one per Common Name (a device's
    ``<farm>/<device>``, say), at the paths `client_files` gives.

    Done with ``cryptography`` (already a dependency, for bundle signatures) rather than the
    openssl CLI, so the tests need no extra tool. Each call makes an independent CA, so two
    calls give a CA that does *not* trust the other's certificates — the "wrong CA" case.
    P-256 keys and SHA-256 keep generation fast (milliseconds) and are accepted at OpenSSL's
    default security level; the extensions (CA basic constraints, key usages, SKI/AKI) are the
    ones strict verifiers (OpenSSL's X509_STRICT) insist on.
    """
    directory = Path(directory).resolve()
    directory.mkdir(parents=True, exist_ok=True)
    # Backdated a little: a clock that differs by a few seconds must not make it "not yet valid".
    now = datetime.now(UTC) - timedelta(minutes=5)
    until = now + timedelta(days=2)

    def name(common_name: str) -> x509.Name:
        return x509.Name(
            [
                x509.NameAttribute(NameOID.ORGANIZATION_NAME, "zodiac-edge tests"),
                x509.NameAttribute(NameOID.COMMON_NAME, common_name),
            ]
        )

    def write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> Path:
        path.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        path.chmod(0o600)
        return path

    def write_cert(cert: x509.Certificate, path: Path) -> Path:
        path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        return path

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = name(f"zodiac test CA {os.urandom(4).hex()}")
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(until)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), False)
        .sign(ca_key, hashes.SHA256())
    )

    def leaf(
        common_name: str, usage: x509.ObjectIdentifier, sans: list[x509.GeneralName] | None
    ) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
        key = ec.generate_private_key(ec.SECP256R1())
        builder = (
            x509.CertificateBuilder()
            .subject_name(name(common_name))
            .issuer_name(ca_name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now)
            .not_valid_after(until)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=True,
                    key_cert_sign=False,
                    crl_sign=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
            )
        )
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        return builder.sign(ca_key, hashes.SHA256()), key

    server_cert, server_key = leaf(
        "127.0.0.1",
        ExtendedKeyUsageOID.SERVER_AUTH,
        [x509.IPAddress(IPv4Address("127.0.0.1")), x509.DNSName("localhost")],
    )
    client_cert, client_key = leaf(client_name, ExtendedKeyUsageOID.CLIENT_AUTH, None)
    for common_name in clients:
        cert, key = leaf(common_name, ExtendedKeyUsageOID.CLIENT_AUTH, None)
        cert_path, key_path = client_files(directory, common_name)
        write_cert(cert, cert_path)
        write_key(key, key_path)
    return TlsFiles(
        ca_cert=write_cert(ca_cert, directory / "ca.pem"),
        server_cert=write_cert(server_cert, directory / "server.pem"),
        server_key=write_key(server_key, directory / "server.key"),
        client_cert=write_cert(client_cert, directory / "client.pem"),
        client_key=write_key(client_key, directory / "client.key"),
    )


# ------------------------------------------------------------------------------ test client
class MqttError(AssertionError):
    """An MQTT operation failed or timed out (an AssertionError so pytest shows it plainly)."""


class TestClient:
    """A paho-mqtt 2.x MQTT v5 client that makes the asynchronous protocol synchronous.

    Every call waits for the broker's answer (CONNACK, SUBACK, PUBACK) and returns its reason
    codes, and received messages land in a queue read with `expect` / `expect_nothing` — so
    tests assert on protocol outcomes without sleeps. Not a model for the agent's own client,
    which must never block its network loop like this.
    """

    __test__ = False  # not a pytest test class, despite the name

    def __init__(
        self,
        broker: Broker,
        client_id: str,
        *,
        username: str | None = None,
        password: str | None = None,
        clean_start: bool = True,
        session_expiry: int = 0,
        timeout: float = 5.0,
        ca_file: str | os.PathLike[str] | None = None,
        cert_file: str | os.PathLike[str] | None = None,
        key_file: str | os.PathLike[str] | None = None,
        port: int | None = None,
        manual_ack: bool = False,
    ) -> None:
        """``ca_file`` switches TLS on (verifying the broker against that CA, host name
        included); ``cert_file``/``key_file`` add a client certificate. ``port`` is another
        listener of the broker than its `Broker.port`. With ``manual_ack`` received QoS 1
        messages are acknowledged only by ``client.ack`` (as the agent does)."""
        if (cert_file is None) != (key_file is None):
            raise ValueError("cert_file and key_file go together")
        if cert_file is not None and ca_file is None:
            raise ValueError("a client certificate needs TLS: give ca_file too")
        self.broker = broker
        self.port = broker.port if port is None else port
        self.client_id = client_id
        self.timeout = timeout
        self.messages: queue.Queue[mqtt.MQTTMessage] = queue.Queue()
        self.session_present: bool | None = None
        self.connect_reason: ReasonCode | None = None
        # Every DISCONNECT reason seen (the broker's, e.g. 0x8E "session taken over", or our
        # own); paho reconnects by itself after the broker's.
        self.disconnects: list[ReasonCode] = []
        self._disconnected = threading.Event()
        self._clean_start = clean_start
        self._session_expiry = session_expiry
        self._connected = threading.Event()
        self._acks: dict[int, threading.Event] = {}
        self._ack_codes: dict[int, list[ReasonCode]] = {}
        self._lock = threading.Lock()
        # The agent's own way of making a client, so both sides negotiate alike.
        tls = Tls(Path(ca_file), cert_file, key_file) if ca_file is not None else None
        self.client = mqtt_client(
            client_id, username=username, password=password, tls=tls, manual_ack=manual_ack
        )
        self.client.on_connect = self._on_connect
        self.client.on_message = self._on_message
        self.client.on_subscribe = self._on_subscribe
        self.client.on_publish = self._on_publish
        self.client.on_disconnect = self._on_disconnect

    # paho callbacks (network thread) ---------------------------------------------------------
    def _on_connect(self, client, userdata, flags, reason_code, properties) -> None:
        self.connect_reason = reason_code
        self.session_present = bool(flags.session_present)
        self._connected.set()

    def _on_disconnect(self, client, userdata, flags, reason_code, properties) -> None:
        self.disconnects.append(reason_code)
        self._disconnected.set()

    def _on_message(self, client, userdata, message) -> None:
        self.messages.put(message)

    def _on_subscribe(self, client, userdata, mid, reason_codes, properties) -> None:
        self._ack(mid, list(reason_codes))

    def _on_publish(self, client, userdata, mid, reason_code, properties) -> None:
        self._ack(mid, [reason_code])

    def _ack(self, mid: int, codes: list[ReasonCode]) -> None:
        with self._lock:
            self._ack_codes[mid] = codes
            self._acks.setdefault(mid, threading.Event()).set()

    def _wait_ack(self, mid: int, what: str) -> list[ReasonCode]:
        with self._lock:
            event = self._acks.setdefault(mid, threading.Event())
        if not event.wait(self.timeout):
            raise MqttError(f"{self.client_id}: no acknowledgement for {what}")
        with self._lock:
            self._acks.pop(mid)
            return self._ack_codes.pop(mid)

    # public API -------------------------------------------------------------------------------
    def connect(self) -> ReasonCode:
        """Connect and wait for CONNACK; returns its reason code (success, or the refusal)."""
        self._connected.clear()
        props = Properties(PacketTypes.CONNECT)
        if self._session_expiry:
            props.SessionExpiryInterval = self._session_expiry
        self.client.connect(
            self.broker.host,
            self.port,
            keepalive=30,
            clean_start=self._clean_start,
            properties=props,
        )
        # Run the network loop by hand until CONNACK, and start paho's thread only on success:
        # after a refusal that thread would sit in paho's reconnect back-off, which `loop_stop`
        # can only interrupt at one-second granularity.
        deadline = time.monotonic() + self.timeout
        while not self._connected.is_set() and time.monotonic() < deadline:
            if self.client.loop(timeout=0.05) != mqtt.MQTT_ERR_SUCCESS:
                break
        if not self._connected.is_set():
            self.client.disconnect()
            raise MqttError(f"{self.client_id}: no CONNACK from {self.broker}")
        assert self.connect_reason is not None
        if self.connect_reason.is_failure:
            self.client.disconnect()
        else:
            self.client.loop_start()
        return self.connect_reason

    def disconnect(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()

    def wait_disconnected(self, timeout: float | None = None) -> ReasonCode:
        """Wait until the broker (or we) ended the connection; returns the reason."""
        if not self._disconnected.wait(self.timeout if timeout is None else timeout):
            raise MqttError(f"{self.client_id}: still connected")
        return self.disconnects[-1]

    def subscribe(self, topic: str, qos: int = 1) -> ReasonCode:
        """Subscribe and wait for SUBACK; returns the granted QoS or the refusal reason."""
        result, mid = self.client.subscribe(topic, qos)
        if result != mqtt.MQTT_ERR_SUCCESS or mid is None:
            raise MqttError(f"{self.client_id}: subscribe {topic!r} failed: {result}")
        return self._wait_ack(mid, f"SUBSCRIBE {topic}")[0]

    def publish(
        self,
        topic: str,
        payload: bytes | str = b"",
        qos: int = 1,
        retain: bool = False,
        properties: Properties | None = None,
    ) -> ReasonCode:
        """Publish; for QoS 1 wait for PUBACK and return its reason code (e.g. 0x87)."""
        info = self.client.publish(topic, payload, qos=qos, retain=retain, properties=properties)
        if info.rc != mqtt.MQTT_ERR_SUCCESS:
            raise MqttError(f"{self.client_id}: publish {topic!r} failed: {info.rc}")
        if qos == 0:
            return ReasonCode(PacketTypes.PUBACK, "Success")
        return self._wait_ack(info.mid, f"PUBLISH {topic}")[0]

    def expect(self, topic: str | None = None, timeout: float | None = None) -> mqtt.MQTTMessage:
        """The next received message (asserting its topic when given)."""
        try:
            message = self.messages.get(timeout=self.timeout if timeout is None else timeout)
        except queue.Empty:
            raise MqttError(f"{self.client_id}: no message received (wanted {topic})") from None
        if topic is not None and message.topic != topic:
            raise MqttError(
                f"{self.client_id}: got {message.topic!r} {message.payload!r}, wanted {topic!r}"
            )
        return message

    def drain(self) -> list[mqtt.MQTTMessage]:
        """Everything received so far, without waiting."""
        out = []
        with contextlib.suppress(queue.Empty):
            while True:
                out.append(self.messages.get_nowait())
        return out

    def __enter__(self) -> TestClient:
        reason = self.connect()
        if reason.is_failure:
            raise MqttError(f"{self.client_id}: connection refused: {reason}")
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.disconnect()
