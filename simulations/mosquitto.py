"""A private Mosquitto broker process: the simulation's embedded broker, and the tests' brokers.

Why a process of the real broker: the agent's guarantees (persistent sessions, QoS 1 redelivery,
retained status, last will, per-device ACLs) are the *broker's* behaviour as much as ours. A
`Broker` is a ``mosquitto`` process with its own config, password file, ACL file, persistence
file and log in a directory its owner chooses, on a free port of 127.0.0.1, so it never touches
a system broker on 1883 and can be restarted, crashed or reconfigured freely.

Why not an embedded Python broker as a fallback: the agents speak MQTT v5 (response topic and
correlation data for rule requests, session expiry), and the Python brokers on PyPI do not:
amqtt 0.12.1 accepts protocol level 4 (MQTT 3.1.1) only. Without ``mosquitto`` the simulation
says how to install it, or how to point it at an existing broker (``--broker HOST:PORT``).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

__all__ = [
    "MOSQUITTO",
    "MOSQUITTO_PASSWD",
    "Broker",
    "BrokerError",
    "TlsFiles",
    "free_port",
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
        log_types: tuple[str, ...] = ("all",),
        sys_interval: int = 10,
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
        # "all" logs every packet (what a failing test needs); a long simulation keeps less.
        self.log_types = log_types
        # Seconds between $SYS/broker/... statistics (message and byte counters).
        self.sys_interval = sys_interval
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
            "# Generated by simulations/mosquitto.py for one private broker.",
            f"user {me}",
            "per_listener_settings false",
            f"listener {self._port} {self.host}",
            f"allow_anonymous {'false' if self.users else 'true'}",
            f"max_queued_messages {self.max_queued_messages}",
            "set_tcp_nodelay true",
            f"log_dest file {self.log_file}",
            *(f"log_type {kind}" for kind in self.log_types),
            f"sys_interval {self.sys_interval}",
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
