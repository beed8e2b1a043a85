"""A private Mosquitto broker process: the simulation's broker, and the tests' brokers.

Why a process of the real broker: the agent's guarantees (persistent sessions, QoS 1 redelivery,
retained status, last will, per-device ACLs) are the *broker's* behaviour as much as ours. A
`Broker` is a ``mosquitto`` process with its own config, password file, ACL file, persistence
file and log in a directory its owner chooses, on a free port of 127.0.0.1, so it never touches
a system broker on 1883 and can be restarted, crashed or reconfigured freely.

When ``mosquitto`` is not installed, the simulation falls back to the embedded pure-Python MQTT
v5 broker of :mod:`simulations.mqttbroker` (`EmbeddedBroker`, the same interface, also a child
process). Python brokers from PyPI would not do: measured against what the agents need (MQTT
v5, persistent sessions that survive a broker restart...), none passes, see the table in that
package's docstring. The tests' fixtures keep using Mosquitto (ACLs, passwords and TLS are its
alone); tests/simulation/test_broker_conformance.py runs the same feature tests against both
brokers. The process life cycle (port, start/stop/kill/restart, orphan clean-up) is
`simulations.brokerprocess.BrokerProcess`, shared by both.
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from simulations.brokerprocess import BrokerError, BrokerProcess, free_port

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


class Broker(BrokerProcess):
    """One private ``mosquitto`` process, configured from scratch in ``directory``.

    The port is chosen once, at the first `start`, and kept for the broker's life so that
    `restart` looks to clients exactly like a broker that went away and came back: same address,
    same persistence file, hence the same persistent sessions and queued QoS 1/2 messages.

    With ``tls`` (see `make_tls_files`) the one listener speaks MQTT over TLS only — there is
    no clear-text fallback a misconfigured client could silently use — and
    ``require_certificate`` makes the broker refuse clients without a certificate signed by the
    same CA.
    """

    name = "mosquitto"
    stderr_name = "mosquitto.stderr"

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
        super().__init__(directory, port)
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

    # ----------------------------------------------------------------------------- properties
    @property
    def config_file(self) -> Path:
        return self.directory / "mosquitto.conf"

    @property
    def log_file(self) -> Path:
        return self.directory / "mosquitto.log"

    @property
    def persistence_file(self) -> Path:
        return self.directory / "data" / "mosquitto.db"

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        scheme = "mqtts" if self.tls else "mqtt"
        return f"<Broker {scheme}://{self.host}:{self._port} {state} in {self.directory}>"

    # ------------------------------------------------------------------------------ helpers
    def _command(self) -> list[str]:
        return [MOSQUITTO, "-c", str(self.config_file)]

    def _ready(self, log_offset: int) -> bool:
        # This run logged "running": its listener is open.
        return re.search(rb"mosquitto version \S+ running", self._log_since(log_offset)) is not None

    def _configure(self) -> None:
        self._write_config()

    def _setup(self) -> None:
        self._write_auth_files()

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
