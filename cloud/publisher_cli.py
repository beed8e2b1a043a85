"""``zodiac-cloud publish`` and ``zodiac-cloud serve``: the publisher's command line.

    zodiac-cloud publish --farm F --rules-dir rules/windfarm --key cloud.key --devices t1 t2 \\
        [--facts farm.nt --neighbour-predicate P] [--stream base] [--broker HOST:PORT]
    zodiac-cloud serve   --farm F --rules-dir rules/windfarm --key cloud.key [--broker HOST:PORT]

``publish`` cuts and sends one stream (default ``base``) to the listed devices: the stream's
rules plus, with ``--facts``, the facts each device needs (about itself and its neighbours) from
a materialised farm graph (N-Triples/Turtle, e.g. ``zodiac-cloud materialise`` output), then
waits (``--timeout``, unless ``--no-wait``) for each device's status and prints whether the
device applied or refused it (cloud/status_wait.py): the exit status says whether all applied.
``serve`` runs until SIGTERM: it answers rule requests for the events it is told to answer
(``--answer EVENT[=STREAM]``, and the streams of ``--resolve``) from the streams under
``--rules-dir``, re-sends full states to devices that report a version gap, and releases a
stream from a device once the device reports a finding that settles it (``--resolve
STREAM=PREDICATE[,PREDICATE]``, repeatable). The key id is the key file's
stem (``cloud.key`` -> ``cloud``): devices trust ``<key id>.pub``.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import threading
from pathlib import Path

from agent.engine.errors import ZodiacError
from agent.protocol.keys import load_private_key
from agent.protocol.messages import MAX_BUNDLE_LIFETIME
from cloud.bundles import DEFAULT_TTL, BundleCutter, facts_for, load_streams, stream_target
from cloud.publisher import Publisher

# Seconds ``publish`` waits for the devices' answers by default: a connected device answers in
# well under a second; a device that is offline gets its bundle when it reconnects (the broker
# keeps it), which ``publish`` cannot wait for.
WAIT_TIMEOUT = 30.0


def add_signing_options(parser: argparse.ArgumentParser, *, ttl_default: float | None) -> None:
    """``--key``, ``--state`` and ``--bundle-ttl``: what signing and numbering a bundle takes,
    the same for ``publish``, ``serve`` and ``bundle`` (one ledger of versions)."""
    parser.add_argument(
        "--key",
        required=True,
        type=Path,
        help="the cloud's Ed25519 private key (PEM); key id = file stem",
    )
    parser.add_argument(
        "--state",
        type=Path,
        default=Path("zodiac-cloud.db"),
        help="the publisher's state (versions sent per device and stream)",
    )
    parser.add_argument(
        "--bundle-ttl",
        type=_positive_seconds,
        default=ttl_default,
        metavar="SECONDS",
        help="how long a bundle stays valid on devices (default: 7 days; at most "
        f"{MAX_BUNDLE_LIFETIME:.0f}, a year)",
    )


def add_commands(commands) -> None:
    """Register ``publish`` and ``serve`` on an argparse sub-parser collection."""
    for name, help_text in (
        (
            "publish",
            "cut and publish one rule stream (and device facts) to devices, then wait for "
            "each device's answer: applied, refused (with the reason) or no answer; exit 0 "
            "only if every device applied it",
        ),
        ("serve", "answer rule requests and version gaps until SIGTERM"),
    ):
        sub = commands.add_parser(name, help=help_text, description=help_text)
        sub.add_argument("--farm", required=True, help="the farm id (MQTT topic level)")
        sub.add_argument(
            "--rules-dir",
            required=True,
            type=Path,
            help="directory of rule streams (<stream>.rules files)",
        )
        sub.add_argument("--broker", default="127.0.0.1:1883", help="MQTT broker HOST:PORT")
        sub.add_argument("--username", default=None, help="MQTT username")
        sub.add_argument("--password", default=None, help="MQTT password")
        add_signing_options(sub, ttl_default=DEFAULT_TTL)
        if name == "publish":
            sub.add_argument("--devices", nargs="+", required=True, help="device ids")
            sub.add_argument("--stream", default="base", help="the stream to send")
            sub.add_argument(
                "--facts",
                type=Path,
                default=None,
                help="materialised farm graph to cut device facts from",
            )
            sub.add_argument(
                "--neighbour-predicate",
                default=None,
                help="with --facts: send each device only the facts about itself and its "
                "neighbours by this predicate (default: all of --facts)",
            )
            sub.add_argument(
                "--own-facts",
                action="store_true",
                help="with --facts: send each device only the facts about itself (its "
                "neighbour links included), not its neighbours'",
            )
            sub.add_argument(
                "--timeout",
                type=_positive_seconds,
                default=WAIT_TIMEOUT,
                metavar="SECONDS",
                help="how long to wait for the devices' answers (default: "
                f"{WAIT_TIMEOUT:.0f}); a device silent that long counts as not applied",
            )
            sub.add_argument(
                "--no-wait",
                action="store_true",
                help="send and exit 0, without waiting for the devices' answers",
            )
        else:
            sub.add_argument(
                "--answer",
                action="append",
                default=[],
                type=_answer,
                metavar="EVENT[=STREAM]",
                help="answer devices' rule requests for EVENT with STREAM (default: the "
                "stream named EVENT; repeatable). The streams of --resolve answer the events "
                "of their names too; a request for any other event is ignored",
            )
            sub.add_argument(
                "--resolve",
                action="append",
                default=[],
                type=_resolution,
                metavar="STREAM=PREDICATE[,PREDICATE]",
                help="release STREAM from a device once its status reports a finding of one "
                "of these predicates (repeatable)",
            )
        sub.set_defaults(handler=cmd_publish if name == "publish" else cmd_serve)


def parse_resolutions(items: list[str]) -> dict[str, list[str]]:
    """``["anomaly/x=P,Q"]`` -> ``{"anomaly/x": ["P", "Q"]}``; a malformed item is an error."""
    resolutions: dict[str, list[str]] = {}
    for item in items:
        stream, _, predicates = item.partition("=")
        names = [p.strip() for p in predicates.split(",") if p.strip()]
        if not stream.strip() or not names:
            raise ValueError(f"--resolve {item!r}: expected STREAM=PREDICATE[,PREDICATE]")
        resolutions.setdefault(stream.strip(), []).extend(names)
    return resolutions


def parse_answers(items: list[str]) -> dict[str, str]:
    """``["anomaly/x", "hot=anomaly/y"]`` -> ``{"anomaly/x": "anomaly/x", "hot": "anomaly/y"}``."""
    answers: dict[str, str] = {}
    for item in items:
        event, equals, stream = (part.strip() for part in item.partition("="))
        if not event or (equals and not stream):
            raise ValueError(f"--answer {item!r}: expected EVENT or EVENT=STREAM")
        answers[event] = stream or event
    return answers


def _answer(item: str) -> str:
    """argparse ``type`` of ``--answer``."""
    try:
        parse_answers([item])
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error).removeprefix("--answer ")) from None
    return item


def answerable_events(
    answers: dict[str, str], resolutions: dict[str, list[str]], streams: dict, rules_dir: Path
) -> dict[str, str]:
    """The events ``serve`` answers: each stream of ``--resolve`` answers the event of its name,
    and ``--answer`` adds (or redirects) events; a stream that does not exist is an error."""
    events = {stream: stream for stream in resolutions} | answers
    for event, stream in events.items():
        if stream not in streams:
            raise ZodiacError(
                f"event {event!r} is answered by stream {stream!r}: no such stream under "
                f"{rules_dir}"
            )
    return events


def _resolution(item: str) -> str:
    """argparse ``type`` of ``--resolve``: a malformed item is a usage error, not a traceback."""
    try:
        parse_resolutions([item])
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error).removeprefix("--resolve ")) from None
    return item


def _positive_seconds(text: str) -> float:
    """argparse ``type`` of ``--bundle-ttl``."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not 0 < value <= MAX_BUNDLE_LIFETIME:
        raise argparse.ArgumentTypeError(
            f"must be a positive number of seconds, at most {MAX_BUNDLE_LIFETIME:.0f} "
            f"(a year), got {text}"
        )
    return value


def _publisher(args: argparse.Namespace) -> Publisher:
    host, _, port = args.broker.rpartition(":")
    # ``serve`` is the farm's one long-lived client; each ``publish`` run gets its own client id,
    # or connecting would take over (disconnect) a running ``serve``, which then misses requests.
    client_id = (
        None if args.handler is cmd_serve else f"zodiac-cloud-{args.farm}-publish-{os.getpid()}"
    )
    streams = load_streams(args.rules_dir)
    resolutions = parse_resolutions(getattr(args, "resolve", []))
    answers = parse_answers(getattr(args, "answer", []))
    events = answerable_events(answers, resolutions, streams, args.rules_dir)  # (before the state)
    return Publisher(
        args.farm,
        BundleCutter(args.state, args.farm, ttl=args.bundle_ttl),
        streams,
        load_private_key(args.key),
        args.key.stem,
        host=host or "127.0.0.1",
        port=int(port or 1883),
        username=args.username,
        password=args.password,
        event_streams=events,
        resolutions=resolutions,
        client_id=client_id,
        # A one-off ``publish`` must not also answer requests or gaps beside ``serve``: both
        # would cut bundles from the same state, and a device could get two versions.
        listen=args.handler is cmd_serve,
    ).start()


def cmd_publish(args: argparse.Namespace) -> int:
    """Send the stream to each device; unless ``--no-wait``, then wait for each device's
    answer (cloud/status_wait.py) and print it: exit 0 only if every device applied it."""
    publisher = _publisher(args)
    waiter = None
    try:
        rules = publisher.streams.get(args.stream)
        if rules is None:
            print(f"zodiac-cloud: no stream {args.stream!r} under {args.rules_dir}")
            return 1
        farm_facts: list[tuple] = []
        if args.facts is not None:
            from agent.engine.program.rdf import read_facts

            farm_facts = list(read_facts(args.facts))
        if not args.no_wait:
            waiter = _status_waiter(args)
        for device in args.devices:
            facts = facts_for(farm_facts, device, args.neighbour_predicate, own_only=args.own_facts)
            bundle = publisher.send(device, args.stream, stream_target(rules, facts))
            state = f"version {bundle.version}" if bundle else "unchanged"
            print(f"{device}: {args.stream} {state} ({len(rules)} rules, {len(facts)} facts)")
            if waiter is not None:
                version = publisher.cutter.version(device, args.stream)
                waiter.expect(device, args.stream, version, bundle.bundle_id if bundle else None)
        publisher.flush()
        if waiter is None:
            return 0
        answers = waiter.wait(args.timeout)
    finally:
        if waiter is not None:
            waiter.stop()
        publisher.stop()
    for answer in answers:
        print(answer.line(args.stream), flush=True)
    return 0 if all(a.outcome == "applied" for a in answers) else 1


def _status_waiter(args: argparse.Namespace):
    """The devices' status follower, subscribed before anything is sent."""
    from cloud.status_wait import StatusWaiter

    host, _, port = args.broker.rpartition(":")
    try:
        return StatusWaiter(
            args.farm,
            args.devices,
            host=host or "127.0.0.1",
            port=int(port or 1883),
            username=args.username,
            password=args.password,
        ).start()
    except TimeoutError as error:
        raise ZodiacError(str(error)) from None


def cmd_serve(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    publisher = _publisher(args)
    print(f"serving farm {args.farm}: streams {', '.join(sorted(publisher.streams))}")
    try:
        stop.wait()
    finally:
        publisher.stop()
    return 0
