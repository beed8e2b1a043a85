"""Rewrite an agent state file in an older schema's layout, to test the migrations."""

from __future__ import annotations

import sqlite3

from agent.engine.language import Literal, RelationKey, Value
from agent.engine.reasoner import Reasoner
from agent.state.checksums import META_KEY, DictionaryChecksums
from agent.state.migrations import DERIVED_V4, FACTS_V3, TERMS_V1
from agent.state.packing import unpack
from agent.state.term_rows import load_terms

# The derived table of schema versions 1 to 3: one row per derived fact.
DERIVED_PER_FACT = (
    "CREATE TABLE derived (node INTEGER NOT NULL, rel INTEGER NOT NULL, a0 INTEGER NOT NULL, "
    "a1 INTEGER NOT NULL, a2 INTEGER NOT NULL, rest TEXT NOT NULL, "
    "PRIMARY KEY (node, rel, a0, a1, a2, rest)) WITHOUT ROWID"
)


def derived_per_fact(conn: sqlite3.Connection, reasoner: Reasoner) -> int:
    """Replace the derived table by version 3's, holding the reasoner's derived facts one row
    per fact (hyper-nodes matched by name). Returns the number of rows written."""
    relations = conn.execute("SELECT id, name, arity FROM relations")
    relation_ids: dict[RelationKey, int] = {(name, arity): rid for rid, name, arity in relations}
    node_ids = dict(conn.execute("SELECT name, id FROM nodes"))
    conn.execute("DROP TABLE derived")
    conn.execute(DERIVED_PER_FACT)
    rows = []
    for node in reasoner.view().nodes:
        for key, relation in node.store.relations.items():
            for fact in relation.tuples:
                padded = (*fact, -1, -1, -1)[:3]
                rest = ",".join(map(str, fact[3:]))
                rows.append((node_ids[node.name], relation_ids[key], *padded, rest))
    conn.executemany("INSERT INTO derived VALUES (?, ?, ?, ?, ?, ?)", rows)
    return len(rows)


def term_row(value: Value) -> tuple[str, object, str | None, str | None]:
    """A term as a row of the terms table of schema versions 1 to 8: (kind, value, datatype,
    language), integers as text, since SQLite's are 64-bit."""
    if isinstance(value, bool):
        return "b", int(value), None, None
    if isinstance(value, int):
        return "z", str(value), None, None
    if isinstance(value, float):
        return "f", value, None, None
    if isinstance(value, Literal):
        return "l", value.lexical, value.datatype, value.language
    return "i", value, None, None


def terms_per_row(conn: sqlite3.Connection) -> int:
    """Replace the terms table by that of schema versions 1 to 8, one row per term, and the
    dictionaries' checksums (when the file has them) by version 8's, which covered the terms'
    rows too. Returns the number of rows written."""
    rows = [term_row(value) for value in load_terms(conn)]
    conn.execute("DROP TABLE terms")
    conn.execute(TERMS_V1)
    conn.executemany(
        "INSERT INTO terms (id, kind, value, datatype, language) VALUES (?, ?, ?, ?, ?)",
        ((term_id, *row) for term_id, row in enumerate(rows)),
    )
    relations = conn.execute("SELECT id, name, arity FROM relations ORDER BY id").fetchall()
    conn.execute(
        "UPDATE meta SET value = ? WHERE key = ?",
        (DictionaryChecksums.of(rows, relations).to_text(), META_KEY),
    )
    return len(rows)


def facts_per_claim(conn: sqlite3.Connection) -> int:
    """Replace the explicit table by the facts table of schema versions 3 to 7, one row per
    (fact, source claiming it). Returns the number of rows written."""
    rows = []
    for source, rid, blob in conn.execute("SELECT source, rel, packed FROM explicit"):
        for prefix, ids in unpack(blob).items():
            for last in ids:
                fact = (*prefix, last)
                padded = (*fact, -1, -1, -1)[:3]
                rows.append((rid, *padded, ",".join(map(str, fact[3:])), source))
    conn.execute("DROP TABLE explicit")
    conn.executescript(FACTS_V3)
    conn.executemany("INSERT INTO facts VALUES (?, ?, ?, ?, ?, ?)", rows)
    return len(rows)


def without_history(conn: sqlite3.Connection) -> None:
    """Drop the streams' history: the tables of the versions before HISTORY_VERSION."""
    conn.execute("DROP TABLE stream_history")


def without_windows(conn: sqlite3.Connection) -> None:
    """Drop the windows held (and the streams' history, which came after them): the tables of
    the versions before WINDOWS_VERSION."""
    without_history(conn)
    conn.execute("DROP TABLE windows")


def without_outbox(conn: sqlite3.Connection) -> None:
    """Drop the event outbox (and the windows and history): the tables of the versions before
    OUTBOX_VERSION."""
    without_windows(conn)
    conn.execute("DROP TABLE outbox")


def rules_without_checksums(conn: sqlite3.Connection) -> None:
    """Drop the rule rows' checksums and the outbox: the rules table of schema versions 7 to
    9 (and the tables of before the outbox)."""
    without_outbox(conn)
    conn.execute("ALTER TABLE rules DROP COLUMN crc")


def rules_without_forms(conn: sqlite3.Connection) -> None:
    """Drop the rules' saved forms and checksums: the rules table of schema versions 3 to 6."""
    rules_without_checksums(conn)
    conn.execute("ALTER TABLE rules DROP COLUMN form")


def derived_by_prefix(conn: sqlite3.Connection) -> int:
    """Replace the derived table by versions 4's and 5's, one row per (hyper-node, relation,
    prefix) holding the last column's bitmap, from the current table's chunks. Returns the
    number of rows written."""
    rows = []
    for node, rid, blob in conn.execute("SELECT node, rel, packed FROM derived"):
        for prefix, objects in unpack(blob).items():
            padded = (*prefix, -1, -1, -1)[:3]
            rest = ",".join(map(str, prefix[3:]))
            rows.append(
                (node, rid, *padded, rest, len(objects), objects.max(), objects.serialize())
            )
    conn.execute("DROP TABLE derived")
    conn.execute(DERIVED_V4)
    conn.executemany("INSERT INTO derived VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)
    return len(rows)
