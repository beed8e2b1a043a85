"""The agent's state in one SQLite file, kept in step with the in-memory reasoner.

What is saved (DESIGN §5): the term dictionary, the explicit facts (with the source that
asserted them: a bundle stream, ``telemetry``, ``local``), the rules (with their bundle and
stream), the applied bundle version per stream, and the derived facts of every hyper-node, so
that a restart answers queries at once instead of recomputing the materialisation.

One change, one transaction. :meth:`AgentState.apply` runs the change in memory (the engine
checks everything first and changes nothing on bad input), then writes exactly what changed,
read off the engine's per-store journal, in a single SQLite transaction. If the write fails, the
in-memory reasoner is rebuilt from the file, which still holds the state before the change, so
memory and disk never disagree. With WAL and ``synchronous=FULL`` a committed change survives a
power cut; after a crash at any point the file holds the state before or after the last change.

Layout choices, for load speed: a fact is stored as integer columns ``a0, a1, a2`` (−1 when
absent) plus ``rest`` (the ids of columns 3 and up, comma-separated, almost always empty), so
loading a binary relation is one ``SELECT a0, a1`` whose rows already are the engine's tuples.
Hyper-nodes get a row each, keyed by a number that follows the in-memory IDB store (a kept or
reduced hyper-node keeps its rows and receives only differences; a new, split or recomputed one
is written in full; a dropped one is deleted).
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import sqlite_utils

from agent.engine.errors import ZodiacError
from agent.engine.language import Literal, Rule, Value
from agent.engine.parser import parse_program
from agent.engine.reasoner import Reasoner
from agent.engine.store import DataStore, RelationKey

FORMAT = "zodiac-edge agent state"
SCHEMA_VERSION = 1
SYNCHRONOUS_MODES = ("OFF", "NORMAL", "FULL", "EXTRA")
EXPECTED_TABLES = {
    "meta",
    "terms",
    "relations",
    "facts",
    "rules",
    "streams",
    "nodes",
    "derived",
    "requests",
}

SCHEMA = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE terms (
    id INTEGER PRIMARY KEY, kind TEXT NOT NULL, value, datatype TEXT, language TEXT
);
CREATE TABLE relations (
    id INTEGER PRIMARY KEY, name TEXT NOT NULL, arity INTEGER NOT NULL, UNIQUE (name, arity)
);
CREATE TABLE facts (
    rel INTEGER NOT NULL, a0 INTEGER NOT NULL, a1 INTEGER NOT NULL, a2 INTEGER NOT NULL,
    rest TEXT NOT NULL, source TEXT NOT NULL,
    PRIMARY KEY (rel, a0, a1, a2, rest)
) WITHOUT ROWID;
CREATE INDEX facts_by_source ON facts (source);
CREATE TABLE rules (
    id TEXT PRIMARY KEY, text TEXT NOT NULL, stream TEXT NOT NULL, bundle_id TEXT,
    position INTEGER NOT NULL
);
CREATE TABLE streams (
    stream TEXT PRIMARY KEY, version INTEGER NOT NULL, bundle_id TEXT, applied_at REAL
);
CREATE TABLE nodes (
    id INTEGER PRIMARY KEY, name TEXT NOT NULL, rules TEXT NOT NULL, module TEXT NOT NULL
);
CREATE TABLE requests (
    request_id TEXT PRIMARY KEY, event TEXT NOT NULL, stream TEXT, status TEXT NOT NULL,
    created_at REAL NOT NULL, resolved_at REAL
);
CREATE TABLE derived (
    node INTEGER NOT NULL, rel INTEGER NOT NULL, a0 INTEGER NOT NULL, a1 INTEGER NOT NULL,
    a2 INTEGER NOT NULL, rest TEXT NOT NULL,
    PRIMARY KEY (node, rel, a0, a1, a2, rest)
) WITHOUT ROWID;
"""


class StateError(ZodiacError):
    """The database file cannot be used (corrupt, foreign, newer schema) or a write failed."""


@dataclass
class StreamVersion:
    """The bundle that a change applies: recorded with the change, in the same transaction."""

    stream: str
    version: int
    bundle_id: str


@dataclass
class LoadReport:
    """How the state was loaded at start, for logs and the restart benchmark."""

    created: bool
    how: str  # "new", "loaded" or "recomputed (...)"
    seconds: float
    facts: int
    derived: int
    rules: int
    extra: dict = field(default_factory=dict)


class AgentState:
    """A reasoner whose every change is also committed to a SQLite file.

    >>> state = AgentState("agent.db")          # doctest: +SKIP
    >>> state.apply(add_rules="q(X) :- p(X) .", add_facts=[("p", "a")])  # doctest: +SKIP
    >>> state.reasoner.query("q(X)")            # doctest: +SKIP
    [{'X': 'a'}]
    """

    def __init__(
        self,
        path: str | Path,
        *,
        synchronous: str = "FULL",
        modules: bool = True,
        create: bool = True,
        load: bool = True,
    ) -> None:
        """Open (or, with ``create``, create) the state file and load the reasoner from it.

        Raises :class:`StateError` for a file that is not an agent state (never overwritten),
        a corrupt file, or a schema newer than this program knows."""
        self.path = Path(path)
        synchronous = synchronous.upper()
        if synchronous not in SYNCHRONOUS_MODES:
            raise StateError(f"synchronous must be one of {', '.join(SYNCHRONOUS_MODES)}")
        self.modules = modules
        existed = self.path.exists() and self.path.stat().st_size > 0
        if not existed and not create:
            raise StateError(f"{self.path}: no agent state here (run the agent once to create it)")
        self.conn = _connect(self.path)
        self.db = sqlite_utils.Database(self.conn)
        try:
            if existed:
                self._check_file()  # before anything that writes, such as the WAL switch
            _enable_wal(self.conn, self.path)
            if not existed:
                self._create()
            self.conn.execute(f"PRAGMA synchronous={synchronous}")
        except sqlite3.DatabaseError as error:
            self.conn.close()
            raise StateError(
                f"{self.path}: not a readable SQLite database ({error}); refusing to touch it"
            ) from error
        except StateError:
            self.conn.close()
            raise
        self._rel_ids: dict[RelationKey, int] = {}
        self._node_rows: dict[int, tuple[DataStore, int]] = {}  # id(idb) -> (idb, row id)
        self._saved_terms = 0
        self.reasoner: Reasoner
        if load:  # ``load=False``: only the SQL summary is wanted (health checks)
            self.load_report = self._load(created=not existed)

    # ------------------------------------------------------------------ opening
    def _create(self) -> None:
        with self.conn:
            self.conn.executescript(SCHEMA)
            self.conn.executemany(
                "INSERT INTO meta (key, value) VALUES (?, ?)",
                [
                    ("format", FORMAT),
                    ("schema_version", str(SCHEMA_VERSION)),
                    ("created_at", str(time.time())),
                ],
            )

    def _check_file(self) -> None:
        """Refuse anything that is not our state: foreign SQLite files, corrupt files, newer
        schemas. Nothing is written before this check passes."""
        check = self.conn.execute("PRAGMA quick_check").fetchone()
        if not check or check[0] != "ok":
            raise StateError(f"{self.path}: the database is corrupt ({check[0] if check else '?'})")
        tables = set(self.db.table_names())
        if "meta" not in tables:
            raise StateError(
                f"{self.path}: a SQLite database that is not a zodiac-edge agent state "
                f"(tables: {', '.join(sorted(tables)) or 'none'}); refusing to overwrite it"
            )
        meta = dict(self.conn.execute("SELECT key, value FROM meta").fetchall())
        if meta.get("format") != FORMAT:
            raise StateError(f"{self.path}: not a zodiac-edge agent state (format {meta!r})")
        version = int(meta.get("schema_version", "0"))
        if version != SCHEMA_VERSION:
            raise StateError(
                f"{self.path}: state schema version {version}, this agent reads version "
                f"{SCHEMA_VERSION}"
            )
        missing = EXPECTED_TABLES - tables
        if missing:
            raise StateError(f"{self.path}: damaged agent state, missing {sorted(missing)}")

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> AgentState:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ loading
    def _load(self, created: bool) -> LoadReport:
        """Rebuild the reasoner from the file, without recomputing (see Reasoner.restore)."""
        started = time.perf_counter()
        conn = self.conn
        terms = [
            _term_value(*row)
            for row in conn.execute("SELECT kind, value, datatype, language FROM terms ORDER BY id")
        ]
        relations = {
            rid: (name, arity)
            for rid, name, arity in conn.execute("SELECT id, name, arity FROM relations")
        }
        self._rel_ids = {key: rid for rid, key in relations.items()}
        edb = {
            key: _load_rows(conn, "facts", "rel = ?", (rid,), key[1])
            for rid, key in relations.items()
        }
        edb = {key: rows for key, rows in edb.items() if rows}
        rules = [
            _parse_rule(rid, text)
            for rid, text in conn.execute("SELECT id, text FROM rules ORDER BY position")
        ]
        stored_nodes: dict[frozenset[str], tuple[str, dict[RelationKey, set]]] = {}
        row_of: dict[frozenset[str], int] = {}
        for node_id, name, rule_ids in conn.execute("SELECT id, name, rules FROM nodes"):
            ids = frozenset(json.loads(rule_ids))
            facts: dict[RelationKey, set] = {}
            for (rid,) in conn.execute(
                "SELECT DISTINCT rel FROM derived WHERE node = ?", (node_id,)
            ).fetchall():
                key = relations[rid]
                facts[key] = _load_rows(
                    conn, "derived", "node = ? AND rel = ?", (node_id, rid), key[1]
                )
            stored_nodes[ids] = (name, facts)
            row_of[ids] = node_id
        self.reasoner = Reasoner.restore(
            terms=terms, rules=rules, edb=edb, nodes=stored_nodes, modules=self.modules
        )
        self._saved_terms = len(terms)
        if self.reasoner.restored == "loaded":
            self._node_rows = {
                id(node.idb): (node.idb, row_of[node.logical.rule_ids])
                for node in self.reasoner.nodes
            }
        else:  # recomputed: rewrite every node from the fresh materialisation
            self._node_rows = {}
            with self.conn:
                self.conn.execute("DELETE FROM derived")
                self.conn.execute("DELETE FROM nodes")
                self._write_terms()
                self._write_nodes()
        how = "new" if created else self.reasoner.restored
        derived = sum(node.size() for node in self.reasoner.nodes)
        return LoadReport(
            created=created,
            how=how,
            seconds=time.perf_counter() - started,
            facts=self.reasoner.edb.size(),
            derived=derived,
            rules=len(rules),
        )

    def reload(self) -> None:
        """Forget the in-memory state and rebuild it from the file (after a failed write)."""
        self.load_report = self._load(created=False)

    # ------------------------------------------------------------------ reading
    def applied_versions(self) -> dict[str, int]:
        return dict(self.conn.execute("SELECT stream, version FROM streams").fetchall())

    def rules_of_stream(self, stream: str) -> list[str]:
        return [
            row[0]
            for row in self.conn.execute(
                "SELECT id FROM rules WHERE stream = ? ORDER BY position", (stream,)
            )
        ]

    def rule_streams(self) -> dict[str, str]:
        return dict(self.conn.execute("SELECT id, stream FROM rules").fetchall())

    def facts_of_source(self, source: str) -> list[tuple]:
        """The explicit facts a source asserted, as engine fact tuples."""
        relations = {rid: key for key, rid in self._rel_ids.items()}
        decode = self.reasoner.terms.values
        found = []
        for rid, a0, a1, a2, rest in self.conn.execute(
            "SELECT rel, a0, a1, a2, rest FROM facts WHERE source = ?", (source,)
        ):
            name, arity = relations[rid]
            args = [decode[i] for i in _unpack(arity, a0, a1, a2, rest)]
            if arity == 1:
                found.append(("http://www.w3.org/1999/02/22-rdf-syntax-ns#type", args[0], name))
            else:
                found.append((name, *args))
        return found

    def summary(self) -> dict:
        """Counts straight from the file, without loading the reasoner (for health checks)."""
        one = self.conn.execute
        last_error = self.get_meta("last_error")
        return {
            "database": str(self.path),
            "applied": self.applied_versions(),
            "rules": one("SELECT COUNT(*) FROM rules").fetchone()[0],
            "explicit_facts": one("SELECT COUNT(*) FROM facts").fetchone()[0],
            "derived_rows": one("SELECT COUNT(*) FROM derived").fetchone()[0],
            "hyper_nodes": one("SELECT COUNT(*) FROM nodes").fetchone()[0],
            "open_requests": one(
                "SELECT COUNT(*) FROM requests WHERE status NOT IN ('resolved', 'cleared')"
            ).fetchone()[0],
            "last_error": json.loads(last_error) if last_error else None,
        }

    def get_meta(self, key: str) -> str | None:
        row = self.conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return row[0] if row else None

    def set_meta(self, key: str, value: str | None) -> None:
        """A small persistent note (last error, device id...), committed at once."""
        with self.conn:
            if value is None:
                self.conn.execute("DELETE FROM meta WHERE key = ?", (key,))
            else:
                self.conn.execute(
                    "INSERT INTO meta (key, value) VALUES (?, ?) "
                    "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                    (key, value),
                )

    # ------------------------------------------------------------------ changing
    def apply(
        self,
        *,
        add_rules: Iterable[Rule] | str | None = None,
        delete_rules: Iterable[str] = (),
        add_facts: Iterable[tuple] | None = None,
        delete_facts: Iterable[tuple] | None = None,
        source: str = "local",
        bundle_id: str | None = None,
        version: StreamVersion | None = None,
    ) -> dict:
        """Apply one change in memory and commit it to the file in one transaction.

        ``source`` names who asserts the rules and facts (a bundle stream, ``telemetry``,
        ``local``); ``version`` records a bundle's stream version in the same transaction.
        Bad input (syntax, safety, stratification) raises the engine's error and changes
        nothing. A failed write raises StateError after restoring memory from the file."""
        if isinstance(add_rules, str):
            add_rules = parse_program(add_rules)
        elif add_rules is not None:
            # Rules are saved as text: keep the form that text parses back to (an anonymous
            # ``_`` built by hand becomes ``_1``), so ids agree before and after a restart.
            add_rules = [_canonical(rule) for rule in add_rules]
        delete_rules = list(delete_rules)
        rules_before = dict(self.reasoner.rules)
        try:
            report = self.reasoner.update(
                add_rules=add_rules,
                delete_rules=delete_rules,
                add_facts=add_facts,
                delete_facts=delete_facts,
            )
        except ZodiacError:
            raise  # checked before anything changed: memory is as it was, nothing to write
        except BaseException:
            self.reload()  # a failure half way through maintenance: trust the file
            raise
        try:
            with self.conn:  # one transaction: BEGIN ... COMMIT, or ROLLBACK on error
                self._write_terms()
                self._write_edb(source)
                self._write_rules(rules_before, source, bundle_id)
                self._write_nodes()
                if version is not None:
                    self.conn.execute(
                        "INSERT INTO streams (stream, version, bundle_id, applied_at) "
                        "VALUES (?, ?, ?, ?) ON CONFLICT (stream) DO UPDATE SET "
                        "version = excluded.version, bundle_id = excluded.bundle_id, "
                        "applied_at = excluded.applied_at",
                        (version.stream, version.version, version.bundle_id, time.time()),
                    )
        except BaseException as error:
            self.reload()
            if isinstance(error, sqlite3.Error):
                raise StateError(
                    f"{self.path}: could not save the change ({error}); "
                    "the agent state is as before the change"
                ) from error
            raise
        return report

    # ------------------------------------------------------------------ writing
    def _write_terms(self) -> None:
        values = self.reasoner.terms.values
        if len(values) > self._saved_terms:
            self.conn.executemany(
                "INSERT INTO terms (id, kind, value, datatype, language) VALUES (?, ?, ?, ?, ?)",
                (
                    (term_id, *_term_row(values[term_id]))
                    for term_id in range(self._saved_terms, len(values))
                ),
            )
        self._saved_terms = len(values)

    def _rel_id(self, key: RelationKey) -> int:
        rid = self._rel_ids.get(key)
        if rid is None:
            cursor = self.conn.execute("INSERT INTO relations (name, arity) VALUES (?, ?)", key)
            rid = self._rel_ids[key] = int(cursor.lastrowid)  # type: ignore[arg-type]
        return rid

    def _write_edb(self, source: str) -> None:
        edb = self.reasoner.journal.edb
        for key, rows in edb.removed.items():
            rid = self._rel_id(key)
            self.conn.executemany(
                "DELETE FROM facts WHERE rel = ? AND a0 = ? AND a1 = ? AND a2 = ? AND rest = ?",
                ((rid, *_pack(args)) for args in rows),
            )
        for key, rows in edb.added.items():
            rid = self._rel_id(key)
            self.conn.executemany(
                "INSERT INTO facts (rel, a0, a1, a2, rest, source) VALUES (?, ?, ?, ?, ?, ?)",
                ((rid, *_pack(args), source) for args in rows),
            )

    def _write_rules(self, before: dict[str, Rule], source: str, bundle_id: str | None) -> None:
        after = self.reasoner.rules
        gone = [rid for rid in before if rid not in after]
        if gone:
            self.conn.executemany("DELETE FROM rules WHERE id = ?", ((rid,) for rid in gone))
        new = [rule for rid, rule in after.items() if rid not in before]
        if new:
            start = self.conn.execute("SELECT COALESCE(MAX(position), 0) FROM rules").fetchone()[0]
            self.conn.executemany(
                "INSERT INTO rules (id, text, stream, bundle_id, position) VALUES (?, ?, ?, ?, ?)",
                (
                    (rule.id, str(rule), source, bundle_id, start + offset)
                    for offset, rule in enumerate(new, start=1)
                ),
            )

    def _write_nodes(self) -> None:
        """Derived facts per hyper-node, from the engine's journal (see module docstring)."""
        journal = self.reasoner.journal
        current = {id(node.idb) for node in self.reasoner.nodes}
        for key in list(self._node_rows):
            if key not in current:
                _, row = self._node_rows.pop(key)
                self.conn.execute("DELETE FROM derived WHERE node = ?", (row,))
                self.conn.execute("DELETE FROM nodes WHERE id = ?", (row,))
        for node in self.reasoner.nodes:
            rules = json.dumps(sorted(node.logical.rule_ids))
            module = node.module.describe() if node.module else ""
            known = self._node_rows.get(id(node.idb))
            if known is not None and id(node.idb) not in journal.created:
                row = known[1]
                self.conn.execute(
                    "UPDATE nodes SET name = ?, rules = ?, module = ? WHERE id = ?",
                    (node.name, rules, module, row),
                )
                self._write_derived(row, journal.of(node.idb).removed, delete=True)
                self._write_derived(row, journal.of(node.idb).added, delete=False)
                continue
            if known is not None:  # a store created in this update yet known: cannot happen
                self.conn.execute("DELETE FROM derived WHERE node = ?", (known[1],))
                self.conn.execute("DELETE FROM nodes WHERE id = ?", (known[1],))
            cursor = self.conn.execute(
                "INSERT INTO nodes (name, rules, module) VALUES (?, ?, ?)",
                (node.name, rules, module),
            )
            row = int(cursor.lastrowid)  # type: ignore[arg-type]
            self._node_rows[id(node.idb)] = (node.idb, row)
            everything = {key: rel.tuples for key, rel in node.idb.relations.items() if len(rel)}
            self._write_derived(row, everything, delete=False)

    def _write_derived(self, row: int, facts: dict[RelationKey, set], *, delete: bool) -> None:
        for key, rows in facts.items():
            if not rows:
                continue
            rid = self._rel_id(key)
            if delete:
                self.conn.executemany(
                    "DELETE FROM derived WHERE node = ? AND rel = ? AND a0 = ? AND a1 = ? "
                    "AND a2 = ? AND rest = ?",
                    ((row, rid, *_pack(args)) for args in rows),
                )
            else:
                self.conn.executemany(
                    "INSERT INTO derived (node, rel, a0, a1, a2, rest) VALUES (?, ?, ?, ?, ?, ?)",
                    ((row, rid, *_pack(args)) for args in rows),
                )


# ---------------------------------------------------------------------- encoding helpers
def _connect(path: Path) -> sqlite3.Connection:
    """Autocommit off by hand: ``with conn`` then wraps each change in BEGIN/COMMIT."""
    conn = sqlite3.connect(path, isolation_level="DEFERRED", check_same_thread=False)
    conn.execute("PRAGMA busy_timeout=5000")
    return conn


def _enable_wal(conn: sqlite3.Connection, path: Path) -> None:
    mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()
    if not mode or mode[0].lower() != "wal":
        raise StateError(f"{path}: could not switch the database to WAL mode (got {mode})")


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


def _load_rows(
    conn: sqlite3.Connection, table: str, where: str, params: tuple, arity: int
) -> set[tuple[int, ...]]:
    """One relation's rows as engine tuples; for arity <= 3 SQLite's rows already are them."""
    if arity <= 3:
        columns = ", ".join(("a0", "a1", "a2")[:arity])
        return set(conn.execute(f"SELECT {columns} FROM {table} WHERE {where}", params))
    return {
        _unpack(arity, *row)
        for row in conn.execute(f"SELECT a0, a1, a2, rest FROM {table} WHERE {where}", params)
    }


def _term_row(value: Value) -> tuple[str, object, str | None, str | None]:
    """(kind, value, datatype, language): integers as text, since SQLite's are 64-bit."""
    if isinstance(value, bool):
        return "b", int(value), None, None
    if isinstance(value, int):
        return "z", str(value), None, None
    if isinstance(value, float):
        return "f", value, None, None
    if isinstance(value, Literal):
        return "l", value.lexical, value.datatype, value.language
    return "i", value, None, None


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


def _canonical(rule: Rule) -> Rule:
    return parse_program(str(rule)).rules[0]


def _parse_rule(rule_id: str, text: str) -> Rule:
    program = parse_program(text, source=f"<saved rule {rule_id}>")
    if len(program.rules) != 1 or program.rules[0].id != rule_id:
        raise StateError(f"saved rule {rule_id} does not parse back to itself: {text!r}")
    return program.rules[0]
