"""Run several edge agents in one process: ``python -m simulations.windfarm.host CONFIG...``.

A real turbine runs one ``zodiac-agent run`` process. A simulated farm of hundreds of turbines
on a two-core machine cannot afford hundreds of Python interpreters, so the harness packs a few
agents per process: each agent is the real :class:`agent.sync.AgentService` (its own MQTT
client, persistent session, SQLite file and thread), only the process is shared. Killing the
process kills all of its agents at once, like a power cut of several turbines.

Logs are JSON lines on stderr (as ``zodiac-agent run`` writes them) with the agent's device id
in ``device``, taken from the thread name.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
from pathlib import Path

from agent.cli import JsonFormatter
from agent.config import AgentConfig
from agent.service import Agent
from agent.sync import AgentService


class DeviceJsonFormatter(JsonFormatter):
    """``zodiac-agent``'s JSON lines plus the device (agent threads are named after it)."""

    def format(self, record: logging.LogRecord) -> str:
        entry = json.loads(super().format(record))
        name = record.threadName  # "wt001", or paho's "paho-mqtt-client-zodiac-<farm>-wt001"
        entry["device"] = name.rsplit("-", 1)[-1] if name.startswith("paho-") else name
        return json.dumps(entry, default=str)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("configs", nargs="+", type=Path, help="agent TOML files")
    args = parser.parse_args(argv)

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(DeviceJsonFormatter())
    root = logging.getLogger("zodiac")
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)
    root.propagate = False

    services = [AgentService(Agent(AgentConfig.load(path))) for path in args.configs]
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    threads = [
        threading.Thread(
            target=service.run, kwargs={"install_signals": False}, name=service.config.device
        )
        for service in services
    ]
    for thread in threads:
        thread.start()
    stop.wait()
    for service in services:
        service.stop()
    for thread in threads:
        thread.join(timeout=10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
