"""A small turbine controller: publishes one device's readings to its agent over MQTT.

A real controller reads its sensors; this one takes the values on the command line, once, or
sends a simulated stream around them (a bounded random walk), every few seconds::

    python examples/controller.py --broker 127.0.0.1:1883 --farm north-sea-1 \\
        --device turbine-07 --reading ambientTemperature=21.5 --reading windSpeed=9.2
    python examples/controller.py ... --every 2 --count 30      # a stream, 30 messages

Each message is a ``Telemetry`` (docs/readings.md; ``zodiac-agent schema readings``) on the
device's readings topic ``zodiac/<farm>/<device>/readings``: a snapshot of facts
``[predicate, subject, value]`` (the subject is ``--subject``, by default the device), sent at
QoS 1 and encoded with msgpack, through the same MQTT client set-up as the agent's.
It needs the ``agent`` package (installed, or the repository on PYTHONPATH).
Exit status: 0 sent, 1 the broker refused or could not be reached, 2 bad usage.
"""

from __future__ import annotations

import argparse
import random
import sys
import threading
import time
from pathlib import Path

from pydantic import ValidationError

from agent.protocol.messages import Telemetry, encode_model
from agent.protocol.mqtt import mqtt_client


def reading(text: str) -> tuple[str, float | int | bool | str]:
    """``NAME=VALUE``: a number, ``true``/``false``, or else an IRI."""
    name, equals, value = text.partition("=")
    if not equals or not name or not value:
        raise argparse.ArgumentTypeError(f"a reading is NAME=VALUE, got {text!r}")
    if value in ("true", "false"):
        return name, value == "true"
    for kind in (int, float):
        try:
            return name, kind(value)
        except ValueError:
            pass
    return name, value


def broker_address(text: str) -> tuple[str, int]:
    host, colon, port = text.rpartition(":")
    if not colon or not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"the broker is HOST:PORT, got {text!r}")
    return host, int(port)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="controller.py", description="Publish a turbine's readings to its zodiac agent."
    )
    parser.add_argument("--broker", type=broker_address, default=("127.0.0.1", 1883))
    parser.add_argument("--farm", required=True)
    parser.add_argument("--device", required=True)
    parser.add_argument("--subject", help="the readings' subject (default: the device's own name)")
    parser.add_argument(
        "--reading",
        type=reading,
        action="append",
        required=True,
        metavar="NAME=VALUE",
        help="one sensor value; repeat for several",
    )
    parser.add_argument("--username", help="MQTT username (the shipped ACL: <farm>/<device>)")
    parser.add_argument("--password-file", type=Path, help="file whose first line is the password")
    parser.add_argument(
        "--every", type=float, metavar="SECONDS", help="send a simulated stream at this period"
    )
    parser.add_argument(
        "--count", type=int, default=0, help="messages of the stream (default 0: until Ctrl-C)"
    )
    parser.add_argument("--seed", type=int, help="seed of the simulated stream")
    return parser


def messages(args: argparse.Namespace):
    """The readings to send: once, or a random walk of each number within +-10% of its value."""
    subject = args.subject or args.device
    values = dict(args.reading)
    rng = random.Random(args.seed)
    sent = 0
    while True:
        yield Telemetry(
            device=args.device,
            farm=args.farm,
            readings=[[name, subject, value] for name, value in values.items()],
            sent_at=time.time(),
        )
        sent += 1
        if args.every is None or sent == args.count:
            return
        time.sleep(args.every)
        for name, start in dict(args.reading).items():
            value = values[name]
            if isinstance(value, float) and not isinstance(value, bool):
                step = rng.uniform(-0.02, 0.02) * abs(start or 1.0)
                values[name] = round(min(max(value + step, 0.9 * start), 1.1 * start), 2)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:  # (bad names or values: one line, before any connection)
        next(messages(argparse.Namespace(**{**vars(args), "every": None})))
    except ValidationError as error:
        problem = error.errors(include_url=False)[0]
        where = ".".join(str(part) for part in problem["loc"])
        print(f"controller.py: {where}: {problem['msg']}", file=sys.stderr)
        return 2
    password = None
    if args.password_file is not None:
        try:
            password = args.password_file.read_text().splitlines()[0]
        except (OSError, IndexError) as error:
            print(f"controller.py: password file {args.password_file}: {error}", file=sys.stderr)
            return 2
    client = mqtt_client(
        f"controller-{args.farm}-{args.device}", username=args.username, password=password
    )
    connected = threading.Event()
    result: list = []

    def on_connect(client, userdata, flags, reason, properties) -> None:
        result.append(reason)
        connected.set()

    client.on_connect = on_connect
    host, port = args.broker
    try:
        client.connect(host, port)
    except OSError as error:
        print(f"controller.py: cannot reach the broker {host}:{port}: {error}", file=sys.stderr)
        return 1
    client.loop_start()
    try:
        if not connected.wait(10) or result[0].is_failure:
            why = result[0] if result else "no answer in 10 s"
            print(f"controller.py: broker {host}:{port} refused: {why}", file=sys.stderr)
            return 1
        topic = f"zodiac/{args.farm}/{args.device}/readings"
        for telemetry in messages(args):
            client.publish(topic, encode_model(telemetry), qos=1).wait_for_publish(10)
            shown = ", ".join(f"{p}={v}" for p, _, v in telemetry.readings)
            print(f"{topic}: {shown}", flush=True)
    except KeyboardInterrupt:
        pass
    finally:
        client.disconnect()
        client.loop_stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
