"""The devices' events as the cloud keeps them, and ``zodiac-cloud events``.

``serve`` subscribes to ``zodiac/<farm>/+/events`` (QoS 1, persistent session: events published
while it is down wait at the broker) and keeps each event in the ledger file (``--state``),
table ``events``, through sqlite-utils with ``execute_plugins=False`` as the rest of the
ledger. An event is kept once: a device re-sends an event it has no acknowledgement of (after a
crash or a broker restart) with the same ``seq``, and ``(farm, device, seq)`` is the key.

``zodiac-cloud events --state FILE [--device D] [--follow]`` prints them, one line each, in
the order they arrived: the device, its seq, the cause and each watch's facts that appeared
(``+``) and disappeared (``-``); ``--follow`` keeps printing new ones until interrupted.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from sqlite_utils import Database

from agent.engine.errors import ZodiacError
from agent.protocol.messages import Event, utc

EVENTS_COLUMNS = {
    "farm": str,
    "device": str,
    "seq": int,
    "at": float,  # the device's time of the change
    "received_at": float,  # the cloud's, when the first copy arrived
    "cause": str,  # JSON
    "changes": str,  # JSON: [{"watch", "appeared", "disappeared"}], facts in wire form
}
EVENTS_KEY = ("farm", "device", "seq")
FOLLOW_INTERVAL = 0.5  # seconds between two looks for new events with --follow


def create_events_table(db: Database) -> None:
    db.table("events").create(EVENTS_COLUMNS, pk=EVENTS_KEY, if_not_exists=True)


def keep_event(db: Database, event: Event, received_at: float) -> bool:
    """Keep ``event`` unless its ``(farm, device, seq)`` is kept already; True when new."""
    row = {
        "farm": event.farm,
        "device": event.device,
        "seq": event.seq,
        "at": event.at,
        "received_at": received_at,
        "cause": json.dumps(event.cause, sort_keys=True),
        "changes": json.dumps([change.model_dump(mode="json") for change in event.changes]),
    }
    cursor = db.execute(
        "INSERT OR IGNORE INTO events (farm, device, seq, at, received_at, cause, changes) "
        "VALUES (:farm, :device, :seq, :at, :received_at, :cause, :changes)",
        row,
    )
    db.conn.commit()
    return cursor.rowcount == 1


def read_events(db: Database, device: str | None = None, after: int = 0) -> Iterator[tuple]:
    """(rowid, row) of the events kept after rowid ``after``, in arrival order."""
    where, params = "rowid > ?", [after]
    if device is not None:
        where += " AND device = ?"
        params.append(device)
    cursor = db.execute(
        f"SELECT rowid, farm, device, seq, at, received_at, cause, changes FROM events "
        f"WHERE {where} ORDER BY rowid",
        params,
    )
    yield from ((row[0], row[1:]) for row in cursor.fetchall())


def event_line(row: tuple) -> str:
    farm, device, seq, at, _received, cause, changes = row
    what = json.loads(cause)
    kind = what.pop("kind", "?")
    said = " ".join(f"{k}={v}" for k, v in sorted(what.items()))
    parts = [f"{utc(at)} {farm}/{device} #{seq} {kind}" + (f" ({said})" if said else "")]
    for change in json.loads(changes):
        facts = [f"+{_fact(f)}" for f in change["appeared"]]
        facts += [f"-{_fact(f)}" for f in change["disappeared"]]
        parts.append(f"{change['watch']}: {' '.join(facts)}")
    return "  ".join(parts)


def _fact(fact: list) -> str:
    predicate, *args = fact
    if predicate.endswith("#type") and len(args) == 2:
        return f"{args[1]}({args[0]})"
    return f"{predicate}({', '.join(map(str, args))})"


def add_command(commands) -> None:
    sub = commands.add_parser(
        "events",
        help="show the devices' events (watched facts that appeared and disappeared)",
        description=(
            "Print the events 'serve' kept in its state file, in the order they arrived: "
            "device, seq, cause, and per watch the facts that appeared (+) and disappeared "
            "(-). Each event is kept once, whatever the copies a device sent."
        ),
    )
    sub.add_argument(
        "--state",
        type=Path,
        default=Path("zodiac-cloud.db"),
        help="the publisher's state file, where serve keeps the events",
    )
    sub.add_argument("--device", default=None, help="only this device's events")
    sub.add_argument(
        "--follow", action="store_true", help="keep printing new events until interrupted"
    )
    sub.set_defaults(handler=cmd_events)


def cmd_events(args: argparse.Namespace) -> int:
    if not args.state.is_file():
        raise ZodiacError(f"{args.state}: no publisher state here (run 'serve' to create it)")
    db = Database(args.state, execute_plugins=False)
    if "events" not in db.table_names():
        if not args.follow:
            return 0
        create_events_table(db)
    after = 0
    try:
        while True:
            for rowid, row in read_events(db, args.device, after):
                print(event_line(row), flush=True)
                after = rowid
            if not args.follow:
                return 0
            time.sleep(FOLLOW_INTERVAL)
    except KeyboardInterrupt:
        return 0
    except BrokenPipeError:
        sys.stderr.close()
        return 0
