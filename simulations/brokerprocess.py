"""What the private broker processes share: a free port, the life cycle, orphan clean-up.

A broker here is a child process listening on a free port of 127.0.0.1, with its files
(configuration, log, persistence) in a directory its owner chooses. `BrokerProcess` is the life
cycle common to `simulations.mosquitto.Broker` (a ``mosquitto`` binary) and
`simulations.mqttbroker.EmbeddedBroker` (the pure-Python broker): the port is chosen once and
kept across restarts, `start` returns once the listener accepts connections, `stop` sends
SIGTERM (the broker saves its state) and waits, `kill` crashes it. A subclass says how to
configure and run its broker and how it logs that it is ready.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from types import TracebackType

__all__ = ["BrokerError", "BrokerProcess", "free_port"]

# Brokers still running when the interpreter exits (a test run interrupted by Ctrl-C, a fixture
# that never reached teardown). Without this, orphaned broker processes would outlive pytest.
_RUNNING: set[BrokerProcess] = set()


@atexit.register
def _stop_orphans() -> None:
    for broker in list(_RUNNING):
        with contextlib.suppress(Exception):
            broker.stop(timeout=2)


class BrokerError(RuntimeError):
    """The broker could not be started or stopped; the message includes the broker's log tail."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (the kernel picks it; racy, so `start` retries)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


class BrokerProcess:
    """The life cycle of one private broker process; see the module docstring.

    Subclasses define `log_file`, `_command` (the argv), `_ready` (this run's log says the
    listener is open) and may override `_setup` (once, before the first start) and `_configure`
    (before every start, once the port is known).
    """

    host = "127.0.0.1"
    name = "broker"  # in error messages
    stderr_name = "broker.stderr"  # the process's stdout and stderr, in `directory`

    def __init__(self, directory: str | os.PathLike[str], port: int | None = None) -> None:
        self.directory = Path(directory).resolve()
        self._port: int | None = port
        self._process: subprocess.Popen[bytes] | None = None
        self._set_up = False

    # ------------------------------------------------------------------- to be provided
    @property
    def log_file(self) -> Path:
        raise NotImplementedError

    def _command(self) -> list[str]:
        raise NotImplementedError

    def _ready(self, log_offset: int) -> bool:
        """Whether the log, from ``log_offset`` on (this run), says the broker listens."""
        raise NotImplementedError

    def _setup(self) -> None:
        """Once, before the first start (e.g. password files)."""

    def _configure(self) -> None:
        """Before every start, with `port` known (e.g. the config file)."""

    def _popen_kwargs(self) -> dict:
        return {}

    # ------------------------------------------------------------------- properties
    @property
    def port(self) -> int:
        """The broker's TCP port (allocated at the first `start`)."""
        if self._port is None:
            raise BrokerError("the broker has no port until it is started")
        return self._port

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"<{type(self).__name__} {self.host}:{self._port} {state} in {self.directory}>"

    # ------------------------------------------------------------------- life cycle
    def start(self, timeout: float = 10.0):
        """Start the broker and return once its listener accepts TCP connections.

        The very first start retries on a fresh port if the chosen one was taken in the
        meantime (the free-port probe is inherently racy); later starts keep their port.
        """
        if self.running:
            return self
        self.directory.mkdir(parents=True, exist_ok=True)
        if not self._set_up:
            self._setup()
            self._set_up = True
        # Only a port we picked ourselves, before it was ever used, may be swapped for another.
        attempts = 3 if self._port is None else 1
        for attempt in range(attempts):
            if self._port is None:
                self._port = free_port(self.host)
            self._configure()
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
        """Stop with SIGTERM and wait, so that the broker writes its persistence file on exit.

        SIGKILL is only the fallback after ``timeout``: a killed broker saves nothing beyond
        its last autosave.
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

    def restart(self, timeout: float = 10.0):
        """Stop and start again on the same port with the same persistence file."""
        self.stop(timeout)
        return self.start(timeout)

    def __enter__(self):
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def log_tail(self, lines: int = 40) -> str:
        """The last lines of the broker's log and of its stderr (start-up errors go there)."""
        chunks = []
        # Both may be one file (a broker that logs to stderr): show it once.
        for path in dict.fromkeys((self.directory / self.stderr_name, self.log_file)):
            if path.exists():
                text = path.read_text(errors="replace").splitlines()[-lines:]
                if text:
                    chunks.append(f"--- {path.name} ---\n" + "\n".join(text))
        return "\n".join(chunks) or "(no log output)"

    # ------------------------------------------------------------------- helpers
    def _spawn_and_wait(self, timeout: float) -> None:
        # Where this run's log lines start: earlier runs (before a restart) share the file.
        log_offset = self.log_file.stat().st_size if self.log_file.exists() else 0
        stderr = open(self.directory / self.stderr_name, "ab")  # noqa: SIM115 (kept by Popen)
        try:
            self._process = subprocess.Popen(
                self._command(),
                stdin=subprocess.DEVNULL,
                stdout=stderr,
                stderr=stderr,
                # Its own session: a Ctrl-C meant for pytest must not kill the broker before
                # teardown has stopped it properly.
                start_new_session=True,
                **self._popen_kwargs(),
            )
        finally:
            stderr.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                code = self._process.returncode
                self._process = None
                raise BrokerError(
                    f"{self.name} exited with status {code} during start-up "
                    f"(in {self.directory}):\n{self.log_tail()}"
                )
            # Ready = this run logged that it listens (a connection cannot be another process
            # that happens to hold our port) and the port accepts connections.
            if self._ready(log_offset):
                try:
                    with socket.create_connection((self.host, self.port), timeout=0.2):
                        return
                except OSError:
                    pass
            time.sleep(0.01)
        self.kill()
        raise BrokerError(
            f"{self.name} did not accept connections on {self.host}:{self.port} within "
            f"{timeout} s:\n{self.log_tail()}"
        )

    def _log_since(self, offset: int) -> bytes:
        try:
            with open(self.log_file, "rb") as log:
                log.seek(offset)
                return log.read()
        except FileNotFoundError:
            return b""

    def _port_in_use_error(self) -> bool:
        return "Address already in use" in self.log_tail(10)
