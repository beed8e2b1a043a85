"""Private Mosquitto brokers for tests, plus a small synchronous MQTT client for assertions.

Why real brokers: the agent's guarantees (persistent sessions, QoS 1 redelivery, retained
status, last will, per-device ACLs) are the *broker's* behaviour as much as ours; a fake broker
would only test our assumptions about Mosquitto. Each `Broker` is a `mosquitto` process with its
own config, password file, ACL file, persistence file and log in a directory the test owns, on a
free port of 127.0.0.1 — so tests never touch the system broker on 1883 and can restart, crash
or reconfigure their broker freely.

Typical use (see also the ``broker`` / ``make_broker`` fixtures in ``tests/conftest.py``)::

    with Broker(tmp_path, users={"dev1": "pw"}, acl=device_acl("farm1")) as broker:
        with TestClient(broker, "dev1", username="dev1", password="pw") as dev1:
            dev1.subscribe("zodiac/farm1/dev1/bundle")

TLS: ``make_tls_files(directory)`` writes a throwaway CA with a server and a client certificate,
and ``Broker(directory, tls=files)`` serves MQTT over TLS only (``require_certificate=True``
also demands a client certificate)::

    files = make_tls_files(tmp_path / "pki")
    with Broker(tmp_path / "b", tls=files) as broker:
        with TestClient(broker, "cloud", ca_file=files.ca_cert) as cloud:
            ...
"""

from __future__ import annotations

import atexit
import contextlib
import os
import pwd
import queue
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from ipaddress import IPv4Address
from pathlib import Path
from types import TracebackType

import paho.mqtt.client as mqtt
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode

__all__ = [
    "MOSQUITTO",
    "MOSQUITTO_PASSWD",
    "Broker",
    "BrokerError",
    "TestClient",
    "TlsFiles",
    "device_acl",
    "free_port",
    "make_tls_files",
    "mosquitto_available",
    "mosquitto_version",
]

MOSQUITTO = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
MOSQUITTO_PASSWD = shutil.which("mosquitto_passwd") or "/usr/bin/mosquitto_passwd"

# Brokers still running when the interpreter exits (a test run interrupted by Ctrl-C, a fixture
# that never reached teardown). Without this, orphaned mosquitto processes would outlive pytest.
_RUNNING: set[Broker] = set()


@atexit.register
def _stop_orphans() -> None:
    for broker in list(_RUNNING):
        with contextlib.suppress(Exception):
            broker.stop(timeout=2)


class BrokerError(RuntimeError):
    """The broker could not be started or stopped; the message includes the broker's log tail."""


def mosquitto_available() -> bool:
    """Whether both the broker and ``mosquitto_passwd`` are installed (fixtures skip otherwise)."""
    return os.access(MOSQUITTO, os.X_OK) and os.access(MOSQUITTO_PASSWD, os.X_OK)


def mosquitto_version() -> tuple[int, int, int]:
    """The installed broker's version, parsed from ``mosquitto -h``.

    Mosquitto has no ``--version``; ``-h`` prints "mosquitto version X.Y.Z" and exits non-zero,
    so the exit status is deliberately ignored.
    """
    out = subprocess.run([MOSQUITTO, "-h"], capture_output=True, text=True, timeout=10)
    match = re.search(r"mosquitto version (\d+)\.(\d+)\.(\d+)", out.stdout + out.stderr)
    if not match:
        raise BrokerError(f"cannot parse the version of {MOSQUITTO}: {out.stdout[:200]!r}")
    major, minor, patch = (int(g) for g in match.groups())
    return major, minor, patch


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (the kernel picks it; racy, so `start` retries)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def device_acl(
    farm: str,
    *,
    cloud_user: str | None = "cloud",
    farm_bundle: bool = False,
    neighbour_telemetry: bool = False,
) -> str:
    """Mosquitto ACL text confining every device user to its own topics of ``farm``.

    ``pattern`` lines substitute ``%u`` with the connecting username, so one ACL serves every
    device of the farm: a device's MQTT username must equal its device id. By default a device
    may read only ``zodiac/<farm>/<me>/bundle`` and write only its ``status``, ``request`` and
    ``telemetry`` topics. ``farm_bundle`` also lets it read ``zodiac/<farm>/all/bundle``, and
    ``neighbour_telemetry`` lets it read every device's telemetry (the ACL cannot express "my
    neighbours only" — that filtering is the agent's job). ``cloud_user`` (``None`` for none)
    may read and write everything under ``zodiac/<farm>/``: it publishes bundles and reads
    statuses, requests and telemetry.
    """
    lines = [
        f"# Device ACL for farm {farm!r}: %u is the MQTT username, which must be the device id.",
        f"pattern read zodiac/{farm}/%u/bundle",
        f"pattern write zodiac/{farm}/%u/status",
        f"pattern write zodiac/{farm}/%u/request",
        f"pattern write zodiac/{farm}/%u/telemetry",
    ]
    if farm_bundle:
        lines.append(f"pattern read zodiac/{farm}/all/bundle")
    if neighbour_telemetry:
        lines.append(f"pattern read zodiac/{farm}/+/telemetry")
    if cloud_user is not None:
        # `pattern` lines apply to all users, the cloud included; they only add rights.
        lines += ["", f"user {cloud_user}", f"topic readwrite zodiac/{farm}/#"]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------- TLS
@dataclass(frozen=True)
class TlsFiles:
    """PEM files of one throwaway PKI: a CA, a server certificate and a client certificate.

    The server certificate is valid for ``127.0.0.1`` (IP SAN, what the brokers listen on and
    what clients verify, since Python checks IP addresses against IP SANs only) and
    ``localhost`` (DNS SAN). Keys are unencrypted: nothing secret is protected by them.
    """

    ca_cert: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def make_tls_files(
    directory: str | os.PathLike[str], *, client_name: str = "zodiac-test-client"
) -> TlsFiles:
    """Generate a fresh CA, server and client certificate as PEM files in ``directory``.

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
    return TlsFiles(
        ca_cert=write_cert(ca_cert, directory / "ca.pem"),
        server_cert=write_cert(server_cert, directory / "server.pem"),
        server_key=write_key(server_key, directory / "server.key"),
        client_cert=write_cert(client_cert, directory / "client.pem"),
        client_key=write_key(client_key, directory / "client.key"),
    )


class Broker:
    """One private ``mosquitto`` process, configured from scratch in ``directory``.

    The port is chosen once, at the first `start`, and kept for the broker's life so that
    `restart` looks to clients exactly like a broker that went away and came back: same address,
    same persistence file, hence the same persistent sessions and queued QoS 1/2 messages.

    With ``tls`` (see `make_tls_files`) the one listener speaks MQTT over TLS only — there is
    no clear-text fallback a misconfigured client could silently use — and
    ``require_certificate`` makes the broker refuse clients without a certificate signed by the
    same CA.
    """

    host = "127.0.0.1"

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        users: dict[str, str] | None = None,
        acl: str | None = None,
        persistence: bool = True,
        port: int | None = None,
        max_queued_messages: int = 100_000,
        tls: TlsFiles | None = None,
        require_certificate: bool = False,
    ) -> None:
        if require_certificate and tls is None:
            raise BrokerError("require_certificate needs tls files")
        self.directory = Path(directory).resolve()
        self.users = dict(users) if users else {}
        self.acl = acl
        self.persistence = persistence
        self.max_queued_messages = max_queued_messages
        self.tls = tls
        self.require_certificate = require_certificate
        self._port: int | None = port
        self._process: subprocess.Popen[bytes] | None = None
        self._configured = False

    # ----------------------------------------------------------------------------- properties
    @property
    def port(self) -> int:
        """The broker's TCP port (allocated at the first `start`)."""
        if self._port is None:
            raise BrokerError("the broker has no port until it is started")
        return self._port

    @property
    def config_file(self) -> Path:
        return self.directory / "mosquitto.conf"

    @property
    def log_file(self) -> Path:
        return self.directory / "mosquitto.log"

    @property
    def persistence_file(self) -> Path:
        return self.directory / "data" / "mosquitto.db"

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        scheme = "mqtts" if self.tls else "mqtt"
        return f"<Broker {scheme}://{self.host}:{self._port} {state} in {self.directory}>"

    # ---------------------------------------------------------------------------- lifecycle
    def start(self, timeout: float = 10.0) -> Broker:
        """Start mosquitto and return once its listener accepts TCP connections.

        The very first start retries on a fresh port if the chosen one was taken in the
        meantime (the free-port probe is inherently racy); later starts keep their port.
        """
        if self.running:
            return self
        self.directory.mkdir(parents=True, exist_ok=True)
        if not self._configured:
            self._write_auth_files()
            self._configured = True
        # Only a port we picked ourselves, before it was ever used, may be swapped for another.
        attempts = 3 if self._port is None else 1
        for attempt in range(attempts):
            if self._port is None:
                self._port = free_port(self.host)
            self._write_config()
            try:
                self._spawn_and_wait(timeout)
                _RUNNING.add(self)
                return self
            except BrokerError:
                if attempt + 1 == attempts or not self._port_in_use_error():
                    raise
                self._port = None
        raise AssertionError("unreachable")

    def stop(self, timeout: float = 10.0) -> None:
        """Stop with SIGTERM and wait, so that mosquitto writes its persistence file on exit.

        SIGKILL is only the fallback after ``timeout``: a killed broker saves nothing beyond
        its last autosave (every second here).
        """
        process = self._process
        _RUNNING.discard(self)
        if process is None:
            return
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout)
        self._process = None

    def kill(self) -> None:
        """Crash the broker (SIGKILL): nothing is saved beyond the last autosave."""
        if self._process is not None and self._process.poll() is None:
            self._process.kill()
            self._process.wait()
        _RUNNING.discard(self)
        self._process = None

    def restart(self, timeout: float = 10.0) -> Broker:
        """Stop and start again on the same port with the same persistence file."""
        self.stop(timeout)
        return self.start(timeout)

    def __enter__(self) -> Broker:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def log_tail(self, lines: int = 40) -> str:
        """The last lines of the broker's log and of its stderr (config errors go there)."""
        chunks = []
        for path in (self.directory / "mosquitto.stderr", self.log_file):
            if path.exists():
                text = path.read_text(errors="replace").splitlines()[-lines:]
                if text:
                    chunks.append(f"--- {path.name} ---\n" + "\n".join(text))
        return "\n".join(chunks) or "(no log output)"

    # ------------------------------------------------------------------------------ helpers
    def _write_auth_files(self) -> None:
        if self.users:
            passwd = self.directory / "passwd"
            passwd.unlink(missing_ok=True)
            for i, (user, password) in enumerate(self.users.items()):
                # -c (create) only for the first user: it would truncate the file each time.
                args = [MOSQUITTO_PASSWD, "-b", *(["-c"] if i == 0 else []), str(passwd)]
                result = subprocess.run(
                    [*args, user, password], capture_output=True, text=True, timeout=30
                )
                if result.returncode != 0:
                    raise BrokerError(
                        f"mosquitto_passwd failed for user {user!r}: {result.stderr.strip()}"
                    )
        if self.acl is not None:
            (self.directory / "acl").write_text(self.acl)

    def _write_config(self) -> None:
        # When the tests run as root, mosquitto would otherwise drop to the `mosquitto` user,
        # which cannot write our 0700 temp directories; as any other user `user` is ignored.
        me = pwd.getpwuid(os.geteuid()).pw_name
        lines = [
            "# Generated by tests/broker.py for one private test broker.",
            f"user {me}",
            "per_listener_settings false",
            f"listener {self._port} {self.host}",
            f"allow_anonymous {'false' if self.users else 'true'}",
            f"max_queued_messages {self.max_queued_messages}",
            "set_tcp_nodelay true",
            f"log_dest file {self.log_file}",
            "log_type all",
            "log_timestamp_format %Y-%m-%dT%H:%M:%S",
            "connection_messages true",
        ]
        if self.tls is not None:
            # Listener settings: they follow the `listener` line they belong to.
            lines += [
                f"cafile {self.tls.ca_cert}",
                f"certfile {self.tls.server_cert}",
                f"keyfile {self.tls.server_key}",
                f"require_certificate {'true' if self.require_certificate else 'false'}",
            ]
        if self.users:
            lines.append(f"password_file {self.directory / 'passwd'}")
        if self.acl is not None:
            lines.append(f"acl_file {self.directory / 'acl'}")
        if self.persistence:
            self.persistence_file.parent.mkdir(parents=True, exist_ok=True)
            lines += [
                "persistence true",
                f"persistence_location {self.persistence_file.parent}/",
                f"persistence_file {self.persistence_file.name}",
                # Also save every second, so a crash (`kill`) loses at most one second.
                "autosave_interval 1",
            ]
        else:
            lines.append("persistence false")
        self.config_file.write_text("\n".join(lines) + "\n")

    def _spawn_and_wait(self, timeout: float) -> None:
        # Where this run's log lines start: earlier runs (before a restart) share the file.
        log_offset = self.log_file.stat().st_size if self.log_file.exists() else 0
        stderr = open(self.directory / "mosquitto.stderr", "ab")  # noqa: SIM115 (kept by Popen)
        try:
            self._process = subprocess.Popen(
                [MOSQUITTO, "-c", str(self.config_file)],
                stdin=subprocess.DEVNULL,
                stdout=stderr,
                stderr=stderr,
                # Its own session: a Ctrl-C meant for pytest must not kill the broker before
                # teardown has stopped it properly.
                start_new_session=True,
            )
        finally:
            stderr.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                code = self._process.returncode
                self._process = None
                raise BrokerError(
                    f"mosquitto exited with status {code} during start-up "
                    f"(config {self.config_file}):\n{self.log_tail()}"
                )
            # Ready = this run logged "running" (its listener is open: a connection cannot be
            # another process that happens to hold our port) and the port accepts connections.
            if self._logged_running(log_offset):
                try:
                    with socket.create_connection((self.host, self.port), timeout=0.2):
                        return
                except OSError:
                    pass
            time.sleep(0.01)
        self.kill()
        raise BrokerError(
            f"mosquitto did not accept connections on {self.host}:{self.port} within "
            f"{timeout} s:\n{self.log_tail()}"
        )

    def _logged_running(self, offset: int) -> bool:
        try:
            with open(self.log_file, "rb") as log:
                log.seek(offset)
                return re.search(rb"mosquitto version \S+ running", log.read()) is not None
        except FileNotFoundError:
            return False

    def _port_in_use_error(self) -> bool:
        return "Address already in use" in self.log_tail(10)


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
    ) -> None:
        """``ca_file`` switches TLS on (verifying the broker against that CA, host name
        included); ``cert_file``/``key_file`` add a client certificate."""
        if (cert_file is None) != (key_file is None):
            raise ValueError("cert_file and key_file go together")
        if cert_file is not None and ca_file is None:
            raise ValueError("a client certificate needs TLS: give ca_file too")
        self.broker = broker
        self.client_id = client_id
        self.timeout = timeout
        self.messages: queue.Queue[mqtt.MQTTMessage] = queue.Queue()
        self.session_present: bool | None = None
        self.connect_reason: ReasonCode | None = None
        self._clean_start = clean_start
        self._session_expiry = session_expiry
        self._connected = threading.Event()
        self._acks: dict[int, threading.Event] = {}
        self._ack_codes: dict[int, list[ReasonCode]] = {}
        self._lock = threading.Lock()
        self.client = mqtt.Client(
            mqtt.CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv5
        )
        if username is not None:
            self.client.username_pw_set(username, password)
        if ca_file is not None:
            # The same call the agent's make_client uses, so both sides negotiate alike.
            self.client.tls_set(
                ca_certs=str(ca_file),
                certfile=str(cert_file) if cert_file is not None else None,
                keyfile=str(key_file) if key_file is not None else None,
            )
        self.client.on_connect = self._on_connect
        self.client.on_message = self._on_message
        self.client.on_subscribe = self._on_subscribe
        self.client.on_publish = self._on_publish

    # paho callbacks (network thread) ---------------------------------------------------------
    def _on_connect(self, client, userdata, flags, reason_code, properties) -> None:
        self.connect_reason = reason_code
        self.session_present = bool(flags.session_present)
        self._connected.set()

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
            self.broker.port,
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

    def subscribe(self, topic: str, qos: int = 1) -> ReasonCode:
        """Subscribe and wait for SUBACK; returns the granted QoS or the refusal reason."""
        result, mid = self.client.subscribe(topic, qos)
        if result != mqtt.MQTT_ERR_SUCCESS or mid is None:
            raise MqttError(f"{self.client_id}: subscribe {topic!r} failed: {result}")
        return self._wait_ack(mid, f"SUBSCRIBE {topic}")[0]

    def publish(
        self, topic: str, payload: bytes | str = b"", qos: int = 1, retain: bool = False
    ) -> ReasonCode:
        """Publish; for QoS 1 wait for PUBACK and return its reason code (e.g. 0x87)."""
        info = self.client.publish(topic, payload, qos=qos, retain=retain)
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
