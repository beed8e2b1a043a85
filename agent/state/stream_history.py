"""The last few versions of each bundle stream's content, so that a signed ``revert`` can bring
a stream back to an earlier version without the cloud re-sending it (docs/operations.md,
"Reverting a stream").

Each applied bundle of a stream saves, in the change's own transaction, what the stream holds
once it is applied: its rules (name and text, in the order they were added), the facts it
asserts (in the protocol's wire form, so that the revert reads them as a bundle's facts), the
patterns it watches and the windows it declares. Only the newest ``keep`` versions of a stream
are kept (``[limits] stream_history``): a stream's history costs at most ``keep`` copies of
its own content, and the oldest goes as a new one comes. A version applied before the table
existed (a state upgraded from an older schema) has no row: reverting to it is refused
(``no_history``).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable
from dataclasses import dataclass

import msgpack

HISTORY_TABLE = (
    "CREATE TABLE stream_history (stream TEXT NOT NULL, version INTEGER NOT NULL, "
    "bundle_id TEXT, rules TEXT NOT NULL, facts BLOB NOT NULL, watches TEXT NOT NULL, "
    "windows TEXT NOT NULL, saved_at REAL NOT NULL, PRIMARY KEY (stream, version))"
)


@dataclass(frozen=True)
class SavedVersion:
    """One stream's content at one version: ``rules`` as (name, text) pairs, ``facts`` in
    wire form (lists of encoded terms), ``watches`` as atom patterns, ``windows`` as the
    canonical texts of its window declarations."""

    stream: str
    version: int
    bundle_id: str | None
    rules: list[tuple[str, str]]
    facts: list[list]
    watches: list[str]
    windows: list[str]


def save_version(
    conn: sqlite3.Connection,
    saved: SavedVersion,
    at: float,
    keep: int,
) -> None:
    """Record ``saved`` in the caller's open transaction and forget the stream's versions
    older than its newest ``keep``."""
    conn.execute(
        "INSERT INTO stream_history (stream, version, bundle_id, rules, facts, watches, "
        "windows, saved_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (stream, version) DO "
        "UPDATE SET bundle_id = excluded.bundle_id, rules = excluded.rules, "
        "facts = excluded.facts, watches = excluded.watches, windows = excluded.windows, "
        "saved_at = excluded.saved_at",
        (
            saved.stream,
            saved.version,
            saved.bundle_id,
            json.dumps([list(rule) for rule in saved.rules]),
            msgpack.packb(saved.facts, use_bin_type=True),
            json.dumps(sorted(saved.watches)),
            json.dumps(sorted(saved.windows)),
            at,
        ),
    )
    conn.execute(
        "DELETE FROM stream_history WHERE stream = ? AND version NOT IN (SELECT version FROM "
        "stream_history WHERE stream = ? ORDER BY version DESC LIMIT ?)",
        (saved.stream, saved.stream, keep),
    )


def saved_version(conn: sqlite3.Connection, stream: str, version: int) -> SavedVersion | None:
    """The content ``stream`` had at ``version``, or None when it is not kept."""
    row = conn.execute(
        "SELECT bundle_id, rules, facts, watches, windows FROM stream_history "
        "WHERE stream = ? AND version = ?",
        (stream, version),
    ).fetchone()
    if row is None:
        return None
    bundle_id, rules, facts, watches, windows = row
    return SavedVersion(
        stream=stream,
        version=version,
        bundle_id=bundle_id,
        rules=[(name, text) for name, text in json.loads(rules)],
        facts=msgpack.unpackb(facts, raw=False),
        watches=json.loads(watches),
        windows=json.loads(windows),
    )


def kept_versions(conn: sqlite3.Connection, stream: str) -> list[int]:
    """The versions of ``stream`` whose content is kept, oldest first."""
    return [
        version
        for (version,) in conn.execute(
            "SELECT version FROM stream_history WHERE stream = ? ORDER BY version", (stream,)
        )
    ]


def stream_watches(watches: dict[str, set[str]], stream: str) -> Iterable[str]:
    """The patterns ``stream`` holds among the state's watches (pattern -> sources)."""
    return sorted(pattern for pattern, sources in watches.items() if stream in sources)
