"""The agent state file's layout: the current schema and the names that identify a state file,
and the few SQL helpers that reading it (agent/state/agent_state.py) and upgrading an older one
(agent/state/migrations.py) share. The tables themselves are described where they are read and
written: agent/state/term_rows.py, agent/state/explicit_rows.py, agent/state/packing.py,
agent/state/saved_rules.py."""

from __future__ import annotations

import sqlite3

from agent.engine.errors import ZodiacError
from agent.state.explicit_rows import EXPLICIT_TABLE
from agent.state.outbox import OUTBOX_TABLE
from agent.state.term_rows import TERMS_TABLE

FORMAT = "zodiac-edge agent state"
OUTBOX_VERSION = 11  # the first version with the event outbox (agent/state/outbox.py)
WINDOWS_VERSION = 12  # the first version with the windows held (agent/readings/windows.py)
SCHEMA_VERSION = WINDOWS_VERSION
TERMS_BY_CHUNK = 9  # the first version with the terms packed by chunks (agent/state/term_rows.py)
EXPECTED_TABLES = {
    "meta",
    "terms",
    "relations",
    "explicit",
    "rules",
    "streams",
    "nodes",
    "derived",
    "requests",
    "reading_times",
    "representatives",
    "outbox",
    "windows",
}
# The window declarations held, and which source declared each (a bundle stream, ``local``):
# a window is held while some source declares it; its facts are the explicit facts of source
# ``window`` (agent/readings/windows.py).
WINDOWS_TABLE = """CREATE TABLE windows (
    declaration TEXT NOT NULL, source TEXT NOT NULL, PRIMARY KEY (declaration, source)
) WITHOUT ROWID"""

SCHEMA = f"""
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
{TERMS_TABLE};  -- the term dictionary, packed by chunks of ids: agent/state/term_rows.py
CREATE TABLE relations (
    id INTEGER PRIMARY KEY, name TEXT NOT NULL, arity INTEGER NOT NULL, UNIQUE (name, arity)
);
{OUTBOX_TABLE};  -- events not yet acknowledged by the broker: agent/state/outbox.py
{WINDOWS_TABLE};  -- the windows held, by declaring source: agent/readings/windows.py
{EXPLICIT_TABLE};  -- the facts each source claims (state/claims.py), packed: state/explicit_rows.py
CREATE TABLE rules (
    name TEXT NOT NULL, key TEXT NOT NULL, text TEXT NOT NULL, stream TEXT NOT NULL,
    bundle_id TEXT, position INTEGER NOT NULL, form TEXT, crc INTEGER,
    PRIMARY KEY (name, stream)
);  -- one row per (rule name, source claiming it), form and crc: agent/state/saved_rules.py
CREATE TABLE reading_times (
    source TEXT NOT NULL, sensor TEXT NOT NULL, at REAL NOT NULL, PRIMARY KEY (source, sensor)
) WITHOUT ROWID;  -- the time of the newest reading applied, per sensor of a source
CREATE TABLE streams (
    stream TEXT PRIMARY KEY, version INTEGER NOT NULL, bundle_id TEXT, applied_at REAL
);
CREATE TABLE nodes (
    id INTEGER PRIMARY KEY, name TEXT NOT NULL, rules TEXT NOT NULL, module TEXT NOT NULL
);  -- rules: a JSON list of the content keys of the hyper-node's rules
CREATE TABLE requests (
    request_id TEXT PRIMARY KEY, event TEXT NOT NULL, stream TEXT, status TEXT NOT NULL,
    created_at REAL NOT NULL, resolved_at REAL
);
CREATE TABLE representatives (
    term INTEGER PRIMARY KEY, representative INTEGER NOT NULL
);  -- owl:sameAs: every term of a class of two or more names -> the class's representative
CREATE TABLE derived (
    node INTEGER NOT NULL, rel INTEGER NOT NULL, chunk INTEGER NOT NULL,
    size INTEGER NOT NULL, high INTEGER NOT NULL, top INTEGER NOT NULL, crc INTEGER NOT NULL,
    packed BLOB NOT NULL,
    PRIMARY KEY (node, rel, chunk)
);  -- one row per (hyper-node, relation, chunk of prefixes): agent/state/packing.py
"""

REBUILD = (
    "to rebuild it, move the file away and start the agent again: it recreates the state "
    "and the cloud resends its streams"
)


def clip(value: object, limit: int = 120) -> str:
    """``value`` as text for a message, cut to ``limit`` characters (what a damaged file holds
    can be any length)."""
    text = repr(value) if not isinstance(value, str) else value
    return text if len(text) <= limit else text[: limit - 3] + "..."


class StateError(ZodiacError):
    """The database file cannot be used (corrupt, foreign, newer schema) or a write failed."""


class StatePathError(StateError):
    """The configured path cannot name a state as it is (a symbolic link to nothing, a loop of
    links): the deployment is wrong, not the state, so the command line says so as it says a
    bad configuration (exit 2)."""


def table_names(conn: sqlite3.Connection) -> set[str]:
    """The file's tables, asked of SQLite directly. (This was the agent's one use of
    sqlite-utils, whose ``Database`` wrapper scans every installed package's entry points for
    plugins the first time it is made: in a new agent process that cost more than the rest of
    opening its state, and it let any installed plugin hook the state's connection.)"""
    return {name for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}


def saved_rule_rows(conn: sqlite3.Connection) -> list[tuple]:
    """The rules table's rows as agent/state/saved_rules.py reads them, in the order the rules
    were added (a load keeps it), a column an older file lacks read as NULL."""
    columns = table_columns(conn, "rules")
    form = "form" if "form" in columns else "NULL"  # (before version 7: no forms)
    crc = "crc" if "crc" in columns else "NULL"  # (before version 10: no checksums)
    return conn.execute(
        f"SELECT name, key, text, stream, bundle_id, position, {form}, {crc} FROM rules "
        "ORDER BY position"
    ).fetchall()


def table_columns(conn: sqlite3.Connection, table: str) -> set[str]:
    """The columns ``table`` has in this file (an older version's may lack some)."""
    return {column for _, column, *_ in conn.execute(f"PRAGMA table_info({table})")}


def execute_all(conn: sqlite3.Connection, *scripts: str) -> None:
    """Run each statement of the scripts in the open transaction (``executescript`` would
    commit it first)."""
    for script in scripts:
        for statement in script.split(";"):
            if statement.strip():
                conn.execute(statement)


# What the agent reads from its bookkeeping tables as numbers and names: a row of another
# type (a damaged or hand-edited file) would reach the status message and fail there, after
# a health check had called the state healthy.
_BOOKKEEPING_CHECKS = (
    (
        "streams",
        "typeof(stream) != 'text' OR typeof(version) != 'integer' OR version < 0 "
        "OR typeof(applied_at) NOT IN ('real', 'integer', 'null')",
        "stream versions",
    ),
    (
        "reading_times",
        "typeof(source) != 'text' OR typeof(sensor) != 'text' "
        "OR typeof(at) NOT IN ('real', 'integer')",
        "reading times",
    ),
    (
        "requests",
        "typeof(request_id) != 'text' OR typeof(event) != 'text' "
        "OR status NOT IN ('sent', 'answered', 'resolved', 'cleared') "
        "OR typeof(created_at) NOT IN ('real', 'integer')",
        "rule requests",
    ),
)


def bookkeeping_problems(conn: sqlite3.Connection) -> list[str]:
    """Rows of the stream, reading-time and request tables whose values are not of the types
    the agent reads them as, one line per table."""
    tables = table_names(conn)
    problems = []
    for table, wrong, what in _BOOKKEEPING_CHECKS:
        if table not in tables:  # (an older file: upgraded before use)
            continue
        count = conn.execute(f"SELECT count(*) FROM {table} WHERE {wrong}").fetchone()[0]
        if count:
            problems.append(f"{count} row(s) of {table} ({what}) hold values of the wrong type")
    return problems
