"""``python -m simulations.mqttbroker``: run the embedded MQTT v5 broker until SIGTERM/SIGINT."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from pathlib import Path

from simulations.mqttbroker.server import Broker, serve


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m simulations.mqttbroker",
        description="A small MQTT v5 (and 3.1.1) broker in pure Python, for the simulation and "
        "tests when no Mosquitto is installed. SIGTERM stops it cleanly and saves its state.",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--port", type=int, required=True, help="TCP port to listen on")
    parser.add_argument(
        "--directory",
        type=Path,
        required=True,
        help="directory of broker.log and broker.json (the saved state)",
    )
    parser.add_argument(
        "--sys-interval", type=float, default=10, help="seconds between $SYS updates (0: none)"
    )
    parser.add_argument(
        "--max-queued-messages",
        type=int,
        default=100_000,
        help="per offline session; the oldest are dropped beyond it",
    )
    parser.add_argument(
        "--max-packet-size", type=int, default=32 * 1024 * 1024, help="largest packet accepted"
    )
    parser.add_argument(
        "--autosave-interval",
        type=float,
        default=0,
        help="also save the state this often when it changed (0: only on a clean stop)",
    )
    parser.add_argument(
        "--no-persistence", action="store_true", help="neither load nor save any state"
    )
    parser.add_argument("--verbose", action="store_true", help="log debug messages too")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.directory.mkdir(parents=True, exist_ok=True)
    logging.basicConfig(
        filename=args.directory / "broker.log",
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(message)s",
        datefmt="%Y-%m-%dT%H:%M:%S",
    )
    broker = Broker(
        args.directory,
        sys_interval=args.sys_interval,
        max_queued_messages=args.max_queued_messages,
        max_packet_size=args.max_packet_size,
        persistence=not args.no_persistence,
        autosave_interval=args.autosave_interval,
    )

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        await serve(args.host, args.port, broker, stop)

    asyncio.run(run())  # exits with status 1 if it cannot listen (see the log)
    return 0


if __name__ == "__main__":
    sys.exit(main())
