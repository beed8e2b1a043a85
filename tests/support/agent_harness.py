"""Helpers for end-to-end agent tests: keys, config files, signed bundles, agent processes.

An :class:`AgentProcess` is a real ``zodiac-agent run`` process (the console script of this
virtual environment, started with the same interpreter), talking to a private broker and writing
a real SQLite file. Tests drive it the way the cloud would: signed bundles on its bundle topic,
readings on its readings topic, and they watch its retained status.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import msgpack

from agent.protocol.keys import generate_key_pair, load_private_key
from agent.protocol.messages import (
    ENVELOPE_VERSION,
    AddFacts,
    AddRules,
    Bundle,
    DeleteFacts,
    DeleteRules,
    RuleSpec,
    Telemetry,
    decode_status,
    encode_fact,
    encode_model,
)
from agent.protocol.signing import sign_bundle
from tests.support.broker import Broker, TestClient

REPO = Path(__file__).resolve().parents[2]


class Cloud:
    """Signs bundles the way cloud/publisher does (key id ``cloud``)."""

    def __init__(self, directory: Path, key_id: str = "cloud") -> None:
        self.keys = directory / "trusted"
        self.keys.mkdir(parents=True, exist_ok=True)
        self.key_id = key_id
        private, _ = generate_key_pair(self.keys, key_id)
        # The private key must not sit among the trusted keys of the device.
        moved = directory / f"{key_id}.key"
        private.rename(moved)
        self.private = load_private_key(moved)

    def bundle(
        self,
        stream: str,
        version: int,
        *,
        farm: str = "farm1",
        device: str = "t1",
        supersedes: list[str] | None = None,
        rules: dict[str, str] | None = None,
        delete_rules: list[str] | None = None,
        facts: list[tuple] | None = None,
        delete_facts: list[tuple] | None = None,
        full_state: bool = False,
        expires_at: float | None = None,
        issued_at: float | None = None,
        watches: list[str] | None = None,
        windows: list[str] | None = None,
    ) -> Bundle:
        """A bundle for ``device`` of ``farm`` (``device="all"``: the whole farm), issued now
        and valid for an hour unless ``issued_at`` / ``expires_at`` say otherwise (an
        ``expires_at`` in the past makes it issued an hour before it)."""
        operations: list = []
        if rules:
            operations.append(
                AddRules(rules=[RuleSpec(id=rid, text=text) for rid, text in rules.items()])
            )
        if delete_rules:
            operations.append(DeleteRules(ids=delete_rules))
        if facts:
            operations.append(AddFacts(facts=[encode_fact(f) for f in facts]))
        if delete_facts:
            operations.append(DeleteFacts(facts=[encode_fact(f) for f in delete_facts]))
        now = time.time()
        expires_at = now + 3600 if expires_at is None else expires_at
        if issued_at is None:
            issued_at = min(now, expires_at - 3600)
        return Bundle(
            bundle_id=f"{stream}-{version}-{uuid.uuid4().hex[:6]}",
            farm=farm,
            device=device,
            stream=stream,
            version=version,
            issued_at=issued_at,
            expires_at=expires_at,
            full_state=full_state,
            supersedes=supersedes or [],
            operations=operations,
            watches=watches,
            windows=windows,
        )

    def sign(self, bundle: Bundle) -> bytes:
        """Signed whatever the signer's clock says: tests send expired and not yet valid
        bundles on purpose, to see the device refuse them."""
        return sign_bundle(bundle, self.private, self.key_id, check_times=False)

    def sign_body(self, body: object) -> bytes:
        """A signed envelope around any msgpack body, valid or not: what a buggy cloud could
        send (a bundle the models would refuse to build, with a genuine signature)."""
        encoded = msgpack.packb(body, use_bin_type=True)
        envelope = {
            "v": ENVELOPE_VERSION,
            "kid": self.key_id,
            "body": encoded,
            "sig": self.private.sign(encoded),
        }
        return msgpack.packb(envelope, use_bin_type=True)


def readings_payload(
    device: str, farm: str, facts: list[tuple], sent_at: float | None = None
) -> bytes:
    telemetry = Telemetry(
        device=device,
        farm=farm,
        readings=[encode_fact(f) for f in facts],
        sent_at=time.time() if sent_at is None else sent_at,
    )
    return encode_model(telemetry)


def write_config(
    directory: Path,
    broker: Broker,
    keys: Path,
    *,
    device: str = "t1",
    farm: str = "farm1",
    username: str | None = None,
    password: str | None = None,
    extra: str = "",
    reasoning: str = "",
    broker_extra: str = "",
    database: str | Path | None = None,
) -> Path:
    """Write ``<directory>/<device>.toml`` for an agent talking to ``broker``.

    ``extra`` is TOML for the top level, ``reasoning`` the body of ``[reasoning]`` and
    ``broker_extra`` more lines for ``[broker]`` (e.g. ``tls = true`` and ``ca_file``): each
    goes inside its table because TOML has no way to reopen a table later in the file.
    ``database`` is the state's path (default ``<device>.db`` beside the file).
    """
    directory.mkdir(parents=True, exist_ok=True)
    auth = ""
    if username:
        auth = f'username = "{username}"\npassword = "{password}"\n'
    text = f"""
device = "{device}"
farm = "{farm}"
database = "{database or f"{device}.db"}"
{extra}
[broker]
host = "{broker.host}"
port = {broker.port}
keepalive = 5
reconnect_min_delay = 1
reconnect_max_delay = 2
{auth}{broker_extra}
[keys]
trusted_keys = "{keys}"
max_bundle_bytes = 20000

[reasoning]
{reasoning}

[log]
level = "DEBUG"
format = "json"
"""
    path = directory / f"{device}.toml"
    path.write_text(text)
    return path


def agent_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "agent.cli", *args]


def run_cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        agent_command(*args), capture_output=True, text=True, timeout=timeout, cwd=REPO
    )


def run_with_the_reader_gone(command: list[str], timeout: float = 60) -> tuple[int, str]:
    """Run ``command`` with its standard output a pipe closed before it writes a byte (a
    reader that went away: ``... | head -1``); its exit status and standard error."""
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO)
    assert process.stdout is not None and process.stderr is not None
    process.stdout.close()  # (the process is still starting: Python takes far longer)
    error = process.stderr.read().decode()
    return process.wait(timeout=timeout), error


class AgentProcess:
    """``zodiac-agent run --config CONFIG`` as a child process, with its log captured."""

    def __init__(self, config: Path) -> None:
        self.config = config
        self.log = config.with_suffix(".log")
        self.process: subprocess.Popen | None = None
        self.offset = 0

    def start(self) -> AgentProcess:
        # Only this run's lines count for log_lines / wait_log (restarts append to one file).
        self.offset = self.log.stat().st_size if self.log.exists() else 0
        handle = open(self.log, "ab")  # noqa: SIM115 - the child owns it
        self.process = subprocess.Popen(
            agent_command("run", "--config", str(self.config)),
            stdout=handle,
            stderr=handle,
            cwd=REPO,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        handle.close()
        return self

    def log_lines(self) -> list[dict]:
        lines = []
        with open(self.log, "rb") as handle:
            handle.seek(self.offset)
            text = handle.read().decode(errors="replace")
        for line in text.splitlines():
            try:
                lines.append(json.loads(line))
            except json.JSONDecodeError:
                lines.append({"message": line})
        return lines

    def wait_log(self, message: str, timeout: float = 20, count: int = 1) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = [e for e in self.log_lines() if e.get("message") == message]
            if len(found) >= count:
                return found[count - 1]
            if self.process is not None and self.process.poll() is not None:
                break
            time.sleep(0.05)
        raise AssertionError(f"agent never logged {message!r}; log:\n{self.log.read_text()}")

    def terminate(self, timeout: float = 15) -> int:
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout)

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)

    def __enter__(self) -> AgentProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)


class StatusWatcher:
    """Follows a device's retained status topic."""

    def __init__(self, client: TestClient, farm: str, device: str) -> None:
        self.client = client
        self.topic = f"zodiac/{farm}/{device}/status"
        client.subscribe(self.topic)

    def wait(self, predicate, timeout: float = 20):
        """The first status (decoded) for which ``predicate(status)`` is true."""
        deadline = time.monotonic() + timeout
        seen = []
        while time.monotonic() < deadline:
            try:
                message = self.client.expect(timeout=max(0.05, deadline - time.monotonic()))
            except Exception:  # noqa: BLE001 - timeout: report below
                break
            if message.topic != self.topic:
                continue
            status = decode_status(message.payload)
            seen.append(status)
            if predicate(status):
                return status
        raise AssertionError(f"no matching status on {self.topic}; seen: {seen[-3:]}")


def last_error(status) -> dict:
    return json.loads(status.last_error) if status.last_error else {}
