"""The event outbox: the watched changes of each update, written in the SAME transaction as the
update, so that a crash keeps both or neither; sent in ``seq`` order and deleted once the broker
acknowledged them (agent/sync.py). And the watches themselves, which sources hold them.

* ``outbox``: one row per event: its ``seq`` (the device's sequence, from 1, never reused: the
  last number given is the meta note ``event_seq``, so that deleting sent rows cannot bring a
  number back), when, its cause (JSON) and its changes (msgpack of ``[watch, appeared,
  disappeared]`` per watch, facts in wire form).
* The outbox is bounded (``[events] max_pending``): an event past it is not kept; its number
  is still taken (a consumer sees the gap) and counted in the meta note ``events_over_budget``,
  which the status reports. Nothing grows without limit while the broker is away.
* Watches: the meta note ``watches`` maps each pattern to the sources holding it (``local``
  for the configuration, a bundle's stream): a pattern is watched while some source holds it.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable
from dataclasses import dataclass

import msgpack

from agent.engine.language import Literal, Value
from agent.engine.storage.watches import WatchChange

OUTBOX_TABLE = (
    "CREATE TABLE outbox (seq INTEGER PRIMARY KEY, at REAL NOT NULL, cause TEXT NOT NULL, "
    "changes BLOB NOT NULL)"
)
SEQ_KEY = "event_seq"
OVER_BUDGET_KEY = "events_over_budget"
WATCHES_KEY = "watches"


@dataclass(frozen=True)
class PendingEvent:
    seq: int
    at: float
    cause: dict
    changes: list  # [[watch, appeared facts, disappeared facts], ...] in wire form


def encode_fact(fact: tuple[Value, ...]) -> list:
    """A fact in the wire form of the protocol's ``encode_fact`` (agent/protocol/messages.py:
    an IRI or number as itself, a literal as a ``lit/dt/lang`` map), so that the sender
    publishes the rows as they are; the state does not import the protocol."""
    return [
        {"lit": v.lexical, "dt": v.datatype, "lang": v.language} if isinstance(v, Literal) else v
        for v in fact
    ]


def _meta(conn: sqlite3.Connection, key: str) -> str | None:
    row = conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
    return row[0] if row else None


def _set_meta(conn: sqlite3.Connection, key: str, value: str) -> None:
    conn.execute(
        "INSERT INTO meta (key, value) VALUES (?, ?) "
        "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
        (key, value),
    )


def append_event(
    conn: sqlite3.Connection,
    changes: dict[str, WatchChange],
    cause: dict,
    at: float,
    budget: int,
) -> int | None:
    """Write one event in the caller's open transaction; returns its seq (None: no change).
    Over ``budget`` pending events it is counted instead of kept (see the module docstring)."""
    if not changes:
        return None
    seq = int(_meta(conn, SEQ_KEY) or 0) + 1
    _set_meta(conn, SEQ_KEY, str(seq))
    if _pending_at_least(conn, budget, seq):
        over = int(_meta(conn, OVER_BUDGET_KEY) or 0) + 1
        _set_meta(conn, OVER_BUDGET_KEY, str(over))
        return seq
    rows = [
        [
            name,
            [encode_fact(fact) for fact in change.appeared],
            [encode_fact(fact) for fact in change.disappeared],
        ]
        for name, change in sorted(changes.items())
    ]
    conn.execute(
        "INSERT INTO outbox (seq, at, cause, changes) VALUES (?, ?, ?, ?)",
        (seq, at, json.dumps(cause, sort_keys=True), msgpack.packb(rows, use_bin_type=True)),
    )
    return seq


def _pending_at_least(conn: sqlite3.Connection, budget: int, seq: int) -> bool:
    """Whether ``budget`` events or more wait. The rows hold seqs from the oldest waiting to
    ``seq - 1``, so fewer numbers than that between them is fewer rows, without a count
    (a pass over the table, at every change, when the broker is away)."""
    (oldest,) = conn.execute("SELECT min(seq) FROM outbox").fetchone()
    if oldest is None or seq - oldest < budget:
        return False
    (pending,) = conn.execute("SELECT count(*) FROM outbox").fetchone()
    return pending >= budget


def pending_events(conn: sqlite3.Connection, after: int = 0, limit: int = 100) -> list:
    """The events not acknowledged yet with a seq above ``after``, in order."""
    return [
        PendingEvent(seq, at, json.loads(cause), msgpack.unpackb(changes, raw=False))
        for seq, at, cause, changes in conn.execute(
            "SELECT seq, at, cause, changes FROM outbox WHERE seq > ? ORDER BY seq LIMIT ?",
            (after, limit),
        )
    ]


def acknowledged(conn: sqlite3.Connection, seqs: Iterable[int]) -> None:
    """Delete events the broker acknowledged (committed at once)."""
    with conn:
        conn.executemany("DELETE FROM outbox WHERE seq = ?", ((seq,) for seq in seqs))


def outbox_figures(conn: sqlite3.Connection) -> dict[str, int]:
    (pending,) = conn.execute("SELECT count(*) FROM outbox").fetchone()
    return {
        "pending": pending,
        "last_seq": int(_meta(conn, SEQ_KEY) or 0),
        "over_budget": int(_meta(conn, OVER_BUDGET_KEY) or 0),
    }


def saved_watches(conn: sqlite3.Connection) -> dict[str, set[str]]:
    """Pattern -> the sources holding it."""
    raw = _meta(conn, WATCHES_KEY)
    return {pattern: set(sources) for pattern, sources in json.loads(raw or "{}").items()}


def save_watches(conn: sqlite3.Connection, watches: dict[str, set[str]]) -> None:
    """In the caller's open transaction."""
    text = json.dumps({p: sorted(s) for p, s in sorted(watches.items()) if s})
    _set_meta(conn, WATCHES_KEY, text)


def cause_of(source: str, version) -> dict:
    """The default cause of a change by ``source`` (a bundle's when ``version`` is given)."""
    if version is not None:
        return {"kind": "bundle", "stream": version.stream, "version": version.version}
    if source == "sensor":
        return {"kind": "readings"}
    if source.startswith("telemetry/"):
        return {"kind": "telemetry", "device": source.removeprefix("telemetry/")}
    if source == "local":
        return {"kind": "local"}
    return {"kind": "stream", "stream": source}


def merge_started(
    changes: dict[str, WatchChange], started: dict[str, WatchChange]
) -> dict[str, WatchChange]:
    """An update's changes with those of watches it started: for a reader that knew nothing
    of a new watch, its facts are all 'appeared' (those it had, less those the update took,
    plus those it brought)."""
    merged = dict(changes)
    for name, start in started.items():
        during = changes.get(name, WatchChange())
        now = (set(start.appeared) - set(during.disappeared)) | set(during.appeared)
        merged[name] = WatchChange(appeared=sorted(now, key=repr))
        if not now:
            del merged[name]
    return merged


def merge_stopped(
    changes: dict[str, WatchChange], name: str, stop: WatchChange
) -> dict[str, WatchChange]:
    """An update's changes with a watch stopped after it: for its reader, every fact it had
    before the update has 'disappeared' (what the watch held at the end, less what the update
    brought, plus what it took)."""
    merged = dict(changes)
    during = changes.get(name, WatchChange())
    before = (set(stop.disappeared) - set(during.appeared)) | set(during.disappeared)
    merged[name] = WatchChange(disappeared=sorted(before, key=repr))
    if not before:
        del merged[name]
    return merged
