"""Upgrading an agent state file of an older schema version to the current one
(``SCHEMA_VERSION``, agent/state/schema.py): one step per version, each a function of the open
connection that returns the version it reached (`MIGRATIONS`), all run in one transaction by
`upgrade`, so that a crash leaves the old version, which the next start upgrades again. The
old versions' tables are kept here as they were: the steps read them, and the tests build a
file of every old version with them (tests/support/old_states.py)."""

from __future__ import annotations

import re
import sqlite3

from pyroaring import BitMap

from agent.engine.language import Literal, Value
from agent.engine.program.parser import parse_program
from agent.state.checksums import META_KEY, DictionaryChecksums
from agent.state.chunk_tables import DERIVED, group_last
from agent.state.explicit_rows import EXPLICIT_TABLE, Claimed, insert_claims
from agent.state.outbox import OUTBOX_TABLE
from agent.state.saved_rules import form_of_text, read_saved_rules, row_checksum
from agent.state.schema import (
    OUTBOX_VERSION,
    REBUILD,
    SCHEMA,
    SCHEMA_VERSION,
    WINDOWS_TABLE,
    WINDOWS_VERSION,
    StateError,
    clip,
    execute_all,
    saved_rule_rows,
)
from agent.state.term_rows import TERMS_TABLE, write_terms

# The terms table of schema versions 1 to 8: one row per term.
TERMS_V1 = """CREATE TABLE terms (
    id INTEGER PRIMARY KEY, kind TEXT NOT NULL, value, datatype TEXT, language TEXT
)"""
# The facts table of schema versions 3 to 7: one row per (fact, source claiming it).
FACTS_V3 = """CREATE TABLE facts (
    rel INTEGER NOT NULL, a0 INTEGER NOT NULL, a1 INTEGER NOT NULL, a2 INTEGER NOT NULL,
    rest TEXT NOT NULL, source TEXT NOT NULL,
    PRIMARY KEY (rel, a0, a1, a2, rest, source)
) WITHOUT ROWID;
CREATE INDEX facts_by_source ON facts (source)"""
# The rules table of schema versions 3 to 6 (version 7 added the form).
RULES_V3 = """CREATE TABLE rules (
    name TEXT NOT NULL, key TEXT NOT NULL, text TEXT NOT NULL, stream TEXT NOT NULL,
    bundle_id TEXT, position INTEGER NOT NULL, PRIMARY KEY (name, stream)
)"""
# The derived table of schema versions 4 and 5: one row per (hyper-node, relation, prefix).
DERIVED_V4 = """CREATE TABLE derived (
    node INTEGER NOT NULL, rel INTEGER NOT NULL, a0 INTEGER NOT NULL, a1 INTEGER NOT NULL,
    a2 INTEGER NOT NULL, rest TEXT NOT NULL,
    size INTEGER NOT NULL, high INTEGER NOT NULL, objects BLOB NOT NULL,
    PRIMARY KEY (node, rel, a0, a1, a2, rest)
) WITHOUT ROWID"""

TERM_KINDS = ("i", "z", "f", "b", "l")  # IRI, integer (as text), float, boolean, literal
INTEGER_TEXT = re.compile(r"-?[0-9]+")


def upgrade(conn: sqlite3.Connection, version: int) -> None:
    """Bring a state file of ``version`` to SCHEMA_VERSION, one step per version, all in one
    transaction: a crash leaves the old version, which the next start migrates again.
    (Begun by hand: Python's sqlite3 begins one before a data change only, and the steps
    start with schema changes, which would each be committed at once. The steps run
    their statements one by one for the same reason: ``executescript`` commits first.)"""
    with conn:
        conn.execute("BEGIN IMMEDIATE")
        while version != SCHEMA_VERSION:
            version = MIGRATIONS[version](conn)
        conn.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(version),))


def _rules_by_name_and_key(conn: sqlite3.Connection) -> int:
    """Version 1 -> 2: rules were saved by id (their label, or a hash of their text) and
    hyper-nodes by those ids; now a rule row has its name and its content key, and hyper-nodes
    are keyed by content keys. The saved hyper-nodes are dropped: the first load recomputes
    them from the rules and explicit facts (``Reasoner.restore``) and saves them again."""
    rows = conn.execute("SELECT id, text, stream, bundle_id, position FROM rules").fetchall()
    conn.execute("DROP TABLE rules")
    conn.execute(  # version 2's table (``_claims_per_source`` then makes version 3's)
        "CREATE TABLE rules (name TEXT PRIMARY KEY, key TEXT NOT NULL, text TEXT NOT NULL, "
        "stream TEXT NOT NULL, bundle_id TEXT, position INTEGER NOT NULL)"
    )
    for old_id, text, stream, bundle_id, position in rows:
        parsed = parse_program(text, source=f"<saved rule {old_id}>").rules
        if len(parsed) != 1:
            raise StateError(f"saved rule {old_id} is not one rule: {text!r}")
        rule = parsed[0]
        conn.execute(
            "INSERT OR REPLACE INTO rules (name, key, text, stream, bundle_id, position) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            (rule.id, rule.key, str(rule), stream, bundle_id, position),
        )
    conn.execute("DELETE FROM derived")
    conn.execute("DELETE FROM nodes")
    return 2


def _claims_per_source(conn: sqlite3.Connection) -> int:
    """Version 2 -> 3: a fact or a named rule may be claimed by several sources (one row per
    claim, agent/state/claims.py), and the newest reading time per sensor is kept."""
    conn.execute("ALTER TABLE facts RENAME TO facts_v2")
    conn.execute("DROP INDEX IF EXISTS facts_by_source")
    conn.execute("ALTER TABLE rules RENAME TO rules_v2")
    execute_all(
        conn,
        FACTS_V3,
        next(statement for statement in SCHEMA.split(";") if "TABLE reading_times" in statement),
        RULES_V3,
    )
    conn.execute("INSERT INTO facts SELECT rel, a0, a1, a2, rest, source FROM facts_v2")
    conn.execute(
        "INSERT INTO rules SELECT name, key, text, stream, bundle_id, position FROM rules_v2"
    )
    conn.execute("DROP TABLE facts_v2")
    conn.execute("DROP TABLE rules_v2")
    return 3


def _derived_by_prefix(conn: sqlite3.Connection) -> int:
    """Version 3 -> 4: derived facts were saved one row per fact; now one row per hyper-node,
    relation and prefix, with the last column's ids as a bitmap (module docstring). The rows
    are regrouped, so the first start after the upgrade still loads without recomputing."""
    conn.execute("ALTER TABLE derived RENAME TO derived_v3")
    conn.execute(DERIVED_V4)
    arities = dict(conn.execute("SELECT id, arity FROM relations"))
    groups = group_last(  # (node, relation id, *prefix) -> last-column ids
        (node, rid, *_unpack(arities[rid], a0, a1, a2, rest))
        for node, rid, a0, a1, a2, rest in conn.execute(
            "SELECT node, rel, a0, a1, a2, rest FROM derived_v3"
        )
    )
    conn.executemany(
        "INSERT INTO derived (node, rel, a0, a1, a2, rest, size, high, objects) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (_row_v4(key[0], key[1], key[2:], BitMap(last)) for key, last in groups.items()),
    )
    conn.execute("DROP TABLE derived_v3")
    return 4


def _row_v4(node: int, rid: int, prefix: tuple[int, ...], objects: BitMap) -> tuple:
    """A row of version 4's and 5's derived table (``DERIVED_V4``)."""
    objects.run_optimize()
    return (node, rid, *_pack_prefix(prefix), len(objects), objects.max(), objects.serialize())


def _representatives(conn: sqlite3.Connection) -> int:
    """Version 4 -> 5: owl:sameAs by rewriting keeps each merged term's representative. A
    state with equalities saved before is recomputed at its first load (see ``_load``)."""
    statement = next(s for s in SCHEMA.split(";") if "TABLE representatives" in s)
    conn.execute(statement.replace("CREATE TABLE", "CREATE TABLE IF NOT EXISTS"))
    return 5


def _derived_by_chunk(conn: sqlite3.Connection) -> int:
    """Version 5 -> 6: derived facts were saved one row per prefix; now the prefixes of a
    relation are packed into chunks, a row each (agent/state/packing.py). The bitmaps are
    copied as they are, so the first start after the upgrade still loads without
    recomputing."""
    conn.execute("ALTER TABLE derived RENAME TO derived_v5")
    conn.execute(next(statement for statement in SCHEMA.split(";") if "TABLE derived" in statement))
    arities = dict(conn.execute("SELECT id, arity FROM relations"))
    by_node: dict[int, list[tuple[tuple[int, ...], bytes]]] = {}
    for node, rid, a0, a1, a2, rest, blob in conn.execute(
        "SELECT node, rel, a0, a1, a2, rest, objects FROM derived_v5"
    ):
        prefix = _unpack(arities[rid] - 1, a0, a1, a2, rest) if arities[rid] > 1 else ()
        by_node.setdefault(node, []).append(((rid, *prefix), bytes(blob)))
    for node, entries in by_node.items():
        DERIVED.insert(conn, node, entries)
    conn.execute("DROP TABLE derived_v5")
    return 6


def _rules_with_forms(conn: sqlite3.Connection) -> int:
    """Version 6 -> 7: each saved rule gets its syntax tree as JSON
    (agent/engine/program/rule_form.py), which the next start reads instead of parsing the text. A
    text that does not parse gets no form: the integrity check then reports that rule as damaged, as
    version 6 did."""
    conn.execute("ALTER TABLE rules ADD COLUMN form TEXT")
    rows = conn.execute("SELECT DISTINCT name, text FROM rules").fetchall()
    conn.executemany(
        "UPDATE rules SET form = ? WHERE name = ? AND text = ?",
        ((form_of_text(name, text), name, text) for name, text in rows),
    )
    return 7


def _explicit_by_chunk(conn: sqlite3.Connection) -> int:
    """Version 7 -> 8: explicit facts were saved one row per (fact, source claiming it); now
    each source's facts are packed into chunks with a checksum, as derived facts are
    (agent/state/explicit_rows.py)."""
    arities = dict(conn.execute("SELECT id, arity FROM relations"))
    claimed: Claimed = {}
    for rid, a0, a1, a2, rest, source in conn.execute(
        "SELECT rel, a0, a1, a2, rest, source FROM facts"
    ):
        claimed.setdefault(source, []).append((rid, *_unpack(arities[rid], a0, a1, a2, rest)))
    execute_all(conn, EXPLICIT_TABLE)
    insert_claims(conn, claimed)
    conn.execute("DROP INDEX IF EXISTS facts_by_source")
    conn.execute("DROP TABLE facts")
    return 8


def _terms_by_chunk(conn: sqlite3.Connection) -> int:
    """Version 8 -> 9: terms were saved one row per term, covered by running checksums in
    ``meta``; now they are packed by chunks of ids, each with its own checksum
    (agent/state/term_rows.py). The rows are checked first (ids, kinds, values, their checksums):
    packing damaged terms would give them checksums that vouch for them."""
    term_rows, problems = legacy_term_problems(conn)
    relation_rows = conn.execute("SELECT id, name, arity FROM relations ORDER BY id").fetchall()
    found = DictionaryChecksums.of(term_rows, relation_rows)
    saved = conn.execute("SELECT value FROM meta WHERE key = ?", (META_KEY,)).fetchone()
    if saved is not None:
        try:
            differing = DictionaryChecksums.from_text(saved[0]).differences(found)
        except (ValueError, KeyError, TypeError):
            differing = ["dictionaries' checksums (unreadable)"]
        problems += [f"the {name} do not match their checksums" for name in differing]
    if problems:
        raise StateError(f"damaged agent state: {problems[0]}; {REBUILD}")
    values = [_term_value(*row) for row in term_rows]
    conn.execute("DROP TABLE terms")
    conn.execute(TERMS_TABLE)
    write_terms(conn, values, 0)
    if saved is not None:  # (the relations' checksums stay; the terms' are the chunks' now)
        conn.execute(
            "UPDATE meta SET value = ? WHERE key = ?",
            (DictionaryChecksums(relations=found.relations).to_text(), META_KEY),
        )
    return 9


def _rules_with_checksums(conn: sqlite3.Connection) -> int:
    """Version 9 -> 10: each rule row gets a checksum of its columns, which lets a restart
    take the rule as it was saved instead of validating it and computing its content key
    again (agent/state/saved_rules.py). The rules are read back and checked first, as version 9
    read them at every start: a checksum would vouch for a damaged row."""
    conn.execute("ALTER TABLE rules ADD COLUMN crc INTEGER")
    rows = saved_rule_rows(conn)
    _, damage = read_saved_rules(rows)
    if damage:
        name, reason = damage
        raise StateError(
            f"damaged agent state: saved rule {clip(name)} is damaged: {clip(reason)}; {REBUILD}"
        )
    conn.executemany(
        "UPDATE rules SET crc = ? WHERE name = ? AND stream = ?",
        ((row_checksum(*row[:7]), row[0], row[3]) for row in rows),
    )
    return 10


def _outbox(conn: sqlite3.Connection) -> int:
    """The previous version -> OUTBOX_VERSION: the event outbox (agent/state/outbox.py),
    empty: the watches start with the next start (none was kept before)."""
    conn.execute(OUTBOX_TABLE)
    return OUTBOX_VERSION


def _windows(conn: sqlite3.Connection) -> int:
    """OUTBOX_VERSION -> WINDOWS_VERSION: the windows held (agent/readings/windows.py), none: no
    window was declared before."""
    conn.execute(WINDOWS_TABLE)
    return WINDOWS_VERSION


def _pack(args: tuple[int, ...]) -> tuple[int, int, int, str]:
    n = len(args)
    if n == 2:
        return args[0], args[1], -1, ""
    if n == 1:
        return args[0], -1, -1, ""
    if n == 3:
        return args[0], args[1], args[2], ""
    return args[0], args[1], args[2], ",".join(map(str, args[3:]))


def _unpack(arity: int, a0: int, a1: int, a2: int, rest: str) -> tuple[int, ...]:
    head = (a0, a1, a2)[: min(arity, 3)]
    if arity <= 3:
        return head
    return head + tuple(int(x) for x in rest.split(","))


def _pack_prefix(prefix: tuple[int, ...]) -> tuple[int, int, int, str]:
    """A derived row's prefix (every column but the last) in the ``a0, a1, a2, rest`` columns."""
    return _pack(prefix) if prefix else (-1, -1, -1, "")


def legacy_term_problems(conn: sqlite3.Connection) -> tuple[list[tuple], list[str]]:
    """The term rows of a file before version 9 (a row per term: kind, value, datatype,
    language, by id) and what is wrong with them: ids with gaps, unknown kinds, integers or
    floats whose values are not."""
    problems = []
    rows = conn.execute(
        "SELECT id, kind, value, datatype, language FROM terms ORDER BY id"
    ).fetchall()
    ids, *columns = zip(*rows, strict=True) if rows else ((), (), (), (), ())
    count = len(ids)
    if count and (ids[0] != 0 or ids[-1] != count - 1):
        problems.append(f"term ids are not 0..{count - 1} (found {ids[0]}..{ids[-1]})")
    kinds, values = columns[0], columns[1]
    unknown = sorted(set(kinds) - set(TERM_KINDS))
    if unknown:
        problems.append(f"terms of unknown kind {clip(unknown)}")
    for term_id, kind, value in zip(ids, kinds, values, strict=True):
        if kind == "z" and (not isinstance(value, str) or not INTEGER_TEXT.fullmatch(value)):
            problems.append(f"term {term_id} is an integer whose value {clip(value)} is not")
            break
    for term_id, kind, value in zip(ids, kinds, values, strict=True):
        if kind == "f" and not isinstance(value, (int, float)):
            problems.append(f"term {term_id} is a float whose value is not a number")
            break
    return list(zip(*columns, strict=True)), problems


def _term_value(kind: str, value: object, datatype: str | None, language: str | None) -> Value:
    if kind == "i":
        return str(value)
    if kind == "z":
        return int(value)  # type: ignore[arg-type]
    if kind == "f":
        return float(value)  # type: ignore[arg-type]
    if kind == "b":
        return bool(value)
    if kind == "l":
        return Literal(str(value), datatype, language)
    raise StateError(f"unknown term kind {kind!r} in the state file")


# Schema version -> the step that migrates a file of that version to the next one.
MIGRATIONS = {
    1: _rules_by_name_and_key,
    2: _claims_per_source,
    3: _derived_by_prefix,
    4: _representatives,
    5: _derived_by_chunk,
    6: _rules_with_forms,
    7: _explicit_by_chunk,
    8: _terms_by_chunk,
    9: _rules_with_checksums,
    OUTBOX_VERSION - 1: _outbox,
    OUTBOX_VERSION: _windows,
}
