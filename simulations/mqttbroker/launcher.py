"""`EmbeddedBroker`: the pure-Python broker as a child process, like a Mosquitto `Broker`."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

from simulations.brokerprocess import BrokerProcess

REPO = Path(__file__).resolve().parents[2]


class EmbeddedBroker(BrokerProcess):
    """``python -m simulations.mqttbroker`` in ``directory``, on a free port of 127.0.0.1.

    Same interface as `simulations.mosquitto.Broker` for what the simulation uses: the port is
    chosen at the first `start` and kept, `stop` (SIGTERM) saves the state to
    ``broker.json`` and the next `start` loads it, `kill` loses what was not autosaved yet
    (every ``autosave_interval`` s, as Mosquitto's ``autosave_interval 1``).
    """

    name = "embedded MQTT broker"

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        port: int | None = None,
        sys_interval: float = 10,
        persistence: bool = True,
        max_queued_messages: int = 100_000,
        autosave_interval: float = 1.0,
        verbose: bool = False,
    ) -> None:
        super().__init__(directory, port)
        self.sys_interval = sys_interval
        self.persistence = persistence
        self.max_queued_messages = max_queued_messages
        self.autosave_interval = autosave_interval
        self.verbose = verbose

    @property
    def log_file(self) -> Path:
        return self.directory / "broker.log"

    @property
    def persistence_file(self) -> Path:
        return self.directory / "broker.json"

    def _command(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "simulations.mqttbroker",
            "--host",
            self.host,
            "--port",
            str(self.port),
            "--directory",
            str(self.directory),
            "--sys-interval",
            str(self.sys_interval),
            "--max-queued-messages",
            str(self.max_queued_messages),
            "--autosave-interval",
            str(self.autosave_interval),
            *([] if self.persistence else ["--no-persistence"]),
            *(["--verbose"] if self.verbose else []),
        ]

    def _popen_kwargs(self) -> dict:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
        return {"cwd": REPO, "env": env}

    def _ready(self, log_offset: int) -> bool:
        pattern = rf"running on {re.escape(self.host)}:{self.port} ".encode()
        return re.search(pattern, self._log_since(log_offset)) is not None
