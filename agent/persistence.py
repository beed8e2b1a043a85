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

Rules are saved by name (the label, or the content key of an unlabelled rule) with their
content key (``Rule.key``); hyper-nodes by the content keys of their rules. Replacing a labelled
rule's body therefore deletes one row and inserts another in the change's transaction, and a
hyper-node is never matched to the rules of another body under the same labels.

Layout choices, for load speed: facts are stored by **prefix** (every column but the last; for
a binary relation, the subject), each holding the last column's ids as a compressed bitmap
(pyroaring's ``BitMap``, in the portable Roaring format), and the prefixes of a relation are
packed into chunks of up to 64 subjects, a row each (agent/derived_rows.py: the layout, and
why), with its fact count, largest ids and a checksum (counts and integrity checks without
reading the bitmaps). Derived facts are packed per hyper-node (``derived``), explicit facts per
source claiming them (``explicit``, agent/explicit_rows.py; agent/chunk_tables.py changes
both). A restart checks each row's checksum and hands a binary relation to the engine still
serialised; the engine reads it, as subject -> objects sets it keeps as they are
(``Relation.adopt_subjects``), when a reader first uses the relation (``store.SavedSubjects``).
The file is a fraction of a row per fact (docs/storage.md). Hyper-nodes get a row each, keyed
by a number that follows the in-memory IDB store (a kept or reduced hyper-node keeps its rows
and receives only differences, applied to the bitmaps of the prefixes they touch, in the chunks
holding them; a new, split or recomputed one is written in full; a dropped one is deleted).
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import time
from collections.abc import Iterable, Iterator
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from pyroaring import BitMap

from agent.chunk_tables import DERIVED, group_last, saved_facts
from agent.claims import ClaimChange, RuleClaims, plan_change
from agent.derived_rows import DamagedRow, verify
from agent.dictionary_checksums import META_KEY, DictionaryChecksums
from agent.engine.budget import Budget
from agent.engine.changes import NodeJournal
from agent.engine.errors import ZodiacError
from agent.engine.gcpause import collector_paused
from agent.engine.language import Literal, Program, Rule, Value, atom_fact
from agent.engine.parser import parse_program
from agent.engine.reasoner import Reasoner
from agent.engine.rule_form import rule_form
from agent.engine.sameas.component import SAME_AS, mentions_equality
from agent.engine.store import (
    SUBJECT,
    Relation,
    RelationKey,
    SavedFacts,
    SavedSubjects,
    by_subject,
)
from agent.engine.subject_facts import SubjectFacts
from agent.engine.view import NodeView
from agent.explicit_rows import (
    EXPLICIT_TABLE,
    Claimed,
    ClaimReader,
    facts_of_source,
    insert_claims,
    load_explicit,
    write_claims,
)
from agent.saved_rules import (
    form_of_text,
    parse_saved_rule,
    read_saved_rules,
    row_checksum,
)
from agent.term_rows import TERMS_TABLE, load_terms, write_terms

FORMAT = "zodiac-edge agent state"
SCHEMA_VERSION = 10
TERMS_BY_CHUNK = 9  # the first version with the terms packed by chunks (agent/term_rows.py)
SYNCHRONOUS_MODES = ("OFF", "NORMAL", "FULL", "EXTRA")
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
}
# What reading a damaged file raises, beyond SQLite's own check (``_check_file``): a text that
# is not UTF-8 (sqlite3.OperationalError, UnicodeDecodeError), a renamed column, a value of the
# wrong type or out of range. Opening a state turns these into StateError: refused, not a
# traceback.
DAMAGE_SIGNS = (sqlite3.Error, ValueError, TypeError, KeyError, IndexError, OverflowError)
# The ``nodes`` row holding the equality component's facts (agent/engine/equality.py).
EQUALITY_MODULE = "equality"

SCHEMA = f"""
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
{TERMS_TABLE};  -- the term dictionary, packed by chunks of ids: agent/term_rows.py
CREATE TABLE relations (
    id INTEGER PRIMARY KEY, name TEXT NOT NULL, arity INTEGER NOT NULL, UNIQUE (name, arity)
);
{EXPLICIT_TABLE};  -- the facts each source claims (agent/claims.py), packed: agent/explicit_rows.py
CREATE TABLE rules (
    name TEXT NOT NULL, key TEXT NOT NULL, text TEXT NOT NULL, stream TEXT NOT NULL,
    bundle_id TEXT, position INTEGER NOT NULL, form TEXT, crc INTEGER,
    PRIMARY KEY (name, stream)
);  -- one row per (rule name, source claiming it), form and crc: agent/saved_rules.py
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
);  -- one row per (hyper-node, relation, chunk of prefixes): agent/derived_rows.py
"""
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
REBUILD = (
    "to rebuild it, move the file away and start the agent again: it recreates the state "
    "and the cloud resends its streams"
)


def clip(value: object, limit: int = 120) -> str:
    text = repr(value) if not isinstance(value, str) else value
    return text if len(text) <= limit else text[: limit - 3] + "..."


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
        decompositions: bool | str = True,
        create: bool = True,
        load: bool = True,
        budget: Budget | None = None,
    ) -> None:
        """Open (or, with ``create``, create) the state file and load the reasoner from it.

        Raises :class:`StateError` for a file that is not an agent state (never overwritten),
        a corrupt file, or a schema newer than this program knows."""
        self.path = Path(path)
        synchronous = synchronous.upper()
        if synchronous not in SYNCHRONOUS_MODES:
            raise StateError(f"synchronous must be one of {', '.join(SYNCHRONOUS_MODES)}")
        self.modules = modules
        self.decompositions = decompositions  # Reasoner(decompositions=...)
        self.budget = budget  # limits every change (not the load: a saved state is trusted)
        existed = _has_content(self.path) or _has_content(_wal_of(self.path))
        if not existed and not create:
            raise StateError(f"{self.path}: no agent state here (run the agent once to create it)")
        if not existed:
            _create_atomically(self.path)
        # The collector paused while the file is read, and what is alive then frozen, as after
        # a materialisation (gcpause.py): a load builds the reasoner's whole state, objects
        # that live as long as the agent. Without it, in a process just started, the first
        # full collection (during the open, or right after it) walked every object of the
        # imports and of the state (0.9 ms of a 3.1 ms RS1 restart, in one measurement), which
        # the recompute it is measured against never pays (its materialisation freezes).
        with collector_paused() as pause:
            pause.large = load
            self._open(existed, synchronous, load)

    def _open(self, existed: bool, synchronous: str, load: bool) -> None:
        """Connect, check the file (migrating an older schema when ``load``) and load the
        reasoner from it (``load``); see ``__init__``."""
        self.conn = _connect(self.path)
        try:
            # Before anything that writes, such as the WAL switch. A health check
            # (``load=False``) reads an older file as it is, without migrating it.
            self._check_file(migrate=load)
            _enable_wal(self.conn, self.path)
            self.conn.execute(f"PRAGMA synchronous={synchronous}")
            if load:
                self._check_writable()
        except sqlite3.DatabaseError as error:
            self.conn.close()
            raise StateError(
                f"{self.path}: not a readable SQLite database ({error}); refusing to touch it"
            ) from error
        except StateError:
            self.conn.close()
            raise
        except DAMAGE_SIGNS as error:  # (SQLite's check quoting damaged text, say)
            self.conn.close()
            raise StateError(
                f"{self.path}: the database is corrupt ({clip(str(error))}); refusing to touch it"
            ) from None
        self._rel_ids: dict[RelationKey, int] = {}
        self._rule_claims: RuleClaims = {}  # rule name -> {source: content key}
        self._node_rows: dict[str, int] = {}  # hyper-node name -> its row id in ``nodes``
        # Commits whose journal did not cover the file, so that every hyper-node's row was
        # looked at (``_write_nodes``): 0 unless the engine's journal has a bug, which would
        # show only as slowness otherwise (the differential tests assert it stays 0).
        self.full_node_writes = 0
        self._saved_terms = 0
        self._parsed_rules: dict[tuple[str, str], Rule] = {}  # (see check_integrity)
        self._rule_rows: list[tuple] | None = None  # (the rows they were read from)
        # The terms and relation rows check_integrity read, for the load that follows, and the
        # relations' running checksums (agent/dictionary_checksums.py).
        self._terms: list[Value] | None = None
        self._relation_rows: list[tuple[int, str, int]] | None = None
        self._checksums = DictionaryChecksums()
        self._checksums_saved = False
        self._damaged: str | None = None  # found damaged while running: see ``reload``
        self.reasoner: Reasoner
        if load:  # ``load=False``: only the SQL summary is wanted (health checks)
            problems = self._read_and_check(checksums=False)  # (the load verifies its rows)
            if problems:
                self.conn.close()
                raise StateError(f"{self.path}: damaged agent state: {problems[0]}; {REBUILD}")
            try:
                self.load_report = self._load(created=not existed)
            except DAMAGE_SIGNS as error:
                self.conn.close()
                raise StateError(
                    f"{self.path}: damaged agent state ({clip(str(error))}); {REBUILD}"
                ) from None

    def check_integrity(self, *, checksums: bool = True) -> list[str]:
        """What makes the file unusable although SQLite finds it sound: terms of unknown kinds
        or values that are not what their kind says, term ids with gaps, facts naming terms
        or relations that do not exist, packed facts that do not match their checksums
        (unless ``checksums`` is false: a load verifies every row as it reads it), saved
        rules that do not read back (from their form, or their text where they have none:
        agent/saved_rules.py) or fail validation. ``zodiac-agent status`` reports these;
        opening the state for use refuses them."""
        problems = self._read_and_check(checksums)
        # What the check read is handed to a load only when the load follows at once (opening
        # the state): a running state's file changes after a check, and a reload after a
        # failed write must read it as it is then, not the terms and rules of the check.
        self._terms = self._relation_rows = self._rule_rows = None
        self._parsed_rules = {}
        return problems

    def _read_and_check(self, checksums: bool) -> list[str]:
        """`check_integrity`'s problems, keeping the terms, relations and rules it read for
        the load that follows, which would otherwise read them again."""
        try:
            return self._integrity_problems(checksums)
        except DAMAGE_SIGNS as error:  # (a page SQLite's check passed, but not its content)
            return [f"unreadable: {clip(str(error))}"]

    def _integrity_problems(self, checksums: bool) -> list[str]:
        conn = self.conn
        self._parsed_rules = {}
        self._terms = None
        term_rows = None  # (a file before version 9: its term rows, for their checksums)
        if self._file_version >= TERMS_BY_CHUNK:
            try:
                self._terms = load_terms(conn)
                count, problems = len(self._terms), []
            except DamagedRow as error:
                count = conn.execute("SELECT COALESCE(SUM(count), 0) FROM terms").fetchone()[0]
                problems = [str(error)]
        else:  # (a file before version 9, read as it is by a health check)
            term_rows, problems = _legacy_term_problems(conn)
            count = len(term_rows)
        packed = "high >= ?1 OR high < 0 OR top >= ?1 OR top < 0"
        tables = _table_names(self.conn)
        explicit = (  # (a file before version 8, read as it is by a health check: a row per fact)
            ("explicit", packed)
            if "explicit" in tables
            else ("facts", "a0 >= ?1 OR a1 >= ?1 OR a2 >= ?1 OR a0 < -1 OR a1 < -1 OR a2 < -1")
        )
        for table, where in (explicit, ("derived", packed)):
            if checksums and "crc" in _columns(conn, table):  # (packed: versions 8 and 6)
                damaged = _damaged_rows(conn, table)
                if damaged:
                    problems.append(f"{damaged} row(s) of {table} do not match their checksums")
            dangling = conn.execute(
                f"SELECT count(*) FROM {table} WHERE {where} "
                "OR rel NOT IN (SELECT id FROM relations)",
                (count,),
            ).fetchone()[0]
            if dangling:
                problems.append(f"{dangling} row(s) of {table} name missing terms or relations")
        if "representatives" in tables:  # (an older file: none yet)
            dangling = conn.execute(
                "SELECT count(*) FROM representatives WHERE term >= ?1 OR term < 0 "
                "OR representative >= ?1 OR representative < 0",
                (count,),
            ).fetchone()[0]
            if dangling:
                problems.append(f"{dangling} representative(s) name missing terms")
        self._rule_rows = _saved_rule_rows(conn)
        self._parsed_rules, damage = read_saved_rules(self._rule_rows)
        if damage:
            name, reason = damage
            problems.append(f"saved rule {clip(name)} is damaged: {clip(reason)}")
        problems += self._check_dictionaries(term_rows)
        return problems

    def _check_dictionaries(self, term_rows: list[tuple] | None = None) -> list[str]:
        """Relations, and the rows of a file's terms before version 9 (``term_rows``), against
        their saved checksums (none saved yet: nothing to say; the load that follows saves
        them). Since version 9 each chunk of terms has its own (agent/term_rows.py)."""
        relation_rows = self.conn.execute(
            "SELECT id, name, arity FROM relations ORDER BY id"
        ).fetchall()
        self._relation_rows = relation_rows
        found = DictionaryChecksums.of(term_rows, relation_rows)
        saved = self.conn.execute("SELECT value FROM meta WHERE key = ?", (META_KEY,)).fetchone()
        self._checksums, self._checksums_saved = found, saved is not None
        if saved is None:
            return []
        try:
            differing = DictionaryChecksums.from_text(saved[0]).differences(found)
        except (ValueError, KeyError, TypeError):
            return ["the dictionaries' checksums are unreadable"]
        return [f"the {name} do not match their checksums" for name in differing]

    # ------------------------------------------------------------------ opening
    def _check_file(self, *, migrate: bool = True) -> None:
        """Refuse anything that is not our state: foreign SQLite files, corrupt files, newer
        schemas. Nothing is written before this check passes."""
        check = self.conn.execute("PRAGMA quick_check").fetchone()
        if not check or check[0] != "ok":
            raise StateError(f"{self.path}: the database is corrupt ({check[0] if check else '?'})")
        tables = _table_names(self.conn)
        if "meta" not in tables:
            raise StateError(
                f"{self.path}: a SQLite database that is not a zodiac-edge agent state "
                f"(tables: {', '.join(sorted(tables)) or 'none'}); refusing to overwrite it"
            )
        meta = dict(self.conn.execute("SELECT key, value FROM meta").fetchall())
        if meta.get("format") != FORMAT:
            raise StateError(f"{self.path}: not a zodiac-edge agent state (format {meta!r})")
        try:
            version = int(meta.get("schema_version", "0"))
        except ValueError:
            raise StateError(
                f"{self.path}: damaged agent state: schema version "
                f"{clip(meta.get('schema_version'))} is not a number; {REBUILD}"
            ) from None
        self._file_version = version
        if version != SCHEMA_VERSION:
            if version not in MIGRATIONS:
                raise StateError(
                    f"{self.path}: state schema version {version}, this agent reads version "
                    f"{SCHEMA_VERSION}"
                )
            if not migrate:
                return  # read as it is (a health check): its tables are the old version's
            try:
                self._migrate(version)
            except StateError as error:  # (damage the upgrade found: nothing was changed)
                raise StateError(f"{self.path}: {error}") from None
            self._file_version = SCHEMA_VERSION
            tables = _table_names(self.conn)
        missing = EXPECTED_TABLES - tables
        if missing:
            raise StateError(f"{self.path}: damaged agent state, missing {sorted(missing)}")

    def _check_writable(self) -> None:
        """Refuse a state the agent could read but never change (file permissions, a
        read-only disk, or a header byte saying the file is for a newer SQLite): it would
        load, then fail every change it is given. A write that changes nothing, rolled back."""
        try:
            with self.conn:
                self.conn.execute("UPDATE meta SET value = value WHERE key = 'format'")
                raise _RolledBack
        except _RolledBack:
            pass
        except sqlite3.OperationalError as error:
            if error.sqlite_errorcode & 0xFF != sqlite3.SQLITE_READONLY:
                return  # (busy, say: another process is writing it, so it can be written)
            raise StateError(
                f"{self.path}: the agent state cannot be written ({error}); check the file's "
                "permissions and its disk"
            ) from None

    def _migrate(self, version: int) -> None:
        """Bring an older state file to SCHEMA_VERSION, one step per version, all in one
        transaction: a crash leaves the old version, which the next start migrates again.
        (Begun by hand: Python's sqlite3 begins one before a data change only, and the steps
        start with schema changes, which would each be committed at once. The steps run
        their statements one by one for the same reason: ``executescript`` commits first.)"""
        with self.conn:
            self.conn.execute("BEGIN IMMEDIATE")
            while version != SCHEMA_VERSION:
                version = MIGRATIONS[version](self.conn)
            self.conn.execute(
                "UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(version),)
            )

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
        terms, relation_rows = self._terms, self._relation_rows
        if terms is None or relation_rows is None:  # (a reload after a failed write)
            terms = load_terms(conn)
            damage = self._check_dictionaries()
            if damage:
                raise DamagedRow(damage[0])
            relation_rows = self._relation_rows
        self._terms = self._relation_rows = None
        relations = {rid: (name, arity) for rid, name, arity in relation_rows}  # type: ignore[union-attr]
        self._rel_ids = {key: rid for rid, key in relations.items()}
        edb = load_explicit(conn, relations)
        rules: dict[str, Rule] = {}
        self._rule_claims = {}
        rows, self._rule_rows = self._rule_rows, None  # (read by the integrity check)
        for name, _, text, stream, *_ in rows if rows is not None else _saved_rule_rows(conn):
            rule = (
                rules.get(name)
                or self._parsed_rules.get((name, text))
                or parse_saved_rule(name, text)
            )
            rules.setdefault(name, rule)
            self._rule_claims.setdefault(name, {})[stream] = rule.key
        self._parsed_rules = {}
        stored_nodes: dict[frozenset[str], tuple[str, dict[RelationKey, SavedFacts]]] = {}
        row_of: dict[frozenset[str], int] = {}
        self._equality_row = None
        component = None
        derived = _load_derived(conn, relations)
        node_rows = conn.execute("SELECT id, name, rules, module FROM nodes").fetchall()
        # Derived rows of a hyper-node the file does not have: the saved hyper-nodes are not
        # what was written, so none is trusted (recomputed below, from rules and explicit facts).
        orphans = not set(derived) <= {node_id for node_id, *_ in node_rows}
        for node_id, name, rule_keys, module in node_rows:
            facts = derived.get(node_id, {})
            if module == EQUALITY_MODULE:
                self._equality_row, component = node_id, _as_tuples(facts)
                continue
            keys = frozenset(json.loads(rule_keys))
            stored_nodes[keys] = (name, facts)
            row_of[keys] = node_id
        representatives = dict(conn.execute("SELECT term, representative FROM representatives"))
        equality = (representatives, component) if self._equality_row is not None else None
        rewriting = SAME_AS in edb or mentions_equality(rules.values())
        if orphans or (equality is None and rewriting):
            # (or saved before equality was rewriting: derived without it, so recomputed)
            stored_nodes = {}
        if equality is not None or rewriting:  # (the equality layer reads tuples)
            edb = _as_tuples(edb)
        self.reasoner = Reasoner.restore(
            terms=terms,
            rules=list(rules.values()),
            edb=edb,
            nodes=stored_nodes,
            modules=self.modules,
            decompositions=self.decompositions,
            equality=equality,
        )
        self.reasoner.budget = self.budget
        self._saved_terms = len(terms)
        if self.reasoner.restored == "loaded":
            self._node_rows = {
                node.name: row_of[frozenset(r.key for r in node.rules)]
                for node in self.reasoner.view().nodes
            }
        else:  # recomputed: rewrite every node from the fresh materialisation
            self._node_rows = {}
            self._equality_row = None
            with self.conn:
                self.conn.execute("DELETE FROM derived")
                self.conn.execute("DELETE FROM nodes")
                self._write_terms()
                self._write_nodes()
                self._write_equality()
        if self.reasoner.equality is not None and component is None and not created:
            with self.conn:  # the component was recomputed at load: save it
                self._write_equality()
        if not self._checksums_saved:  # (a file from before the checksums, or a new one)
            with self.conn:
                self._save_checksums()
        how = "new" if created else self.reasoner.restored
        derived = sum(node.size() for node in self.reasoner.view().nodes)
        return LoadReport(
            created=created,
            how=how,
            seconds=time.perf_counter() - started,
            facts=self.reasoner.edb.size(),
            derived=derived,
            rules=len(rules),
        )

    def reload(self) -> None:
        """Forget the in-memory state and rebuild it from the file (after a failed write).
        A file found damaged then (a row that no longer matches its checksum, say) raises
        StateError, and every later change is refused with it: memory may hold a change the
        file could not take, and the file cannot be trusted to rebuild it."""
        try:
            self.load_report = self._load(created=False)
        except DAMAGE_SIGNS as error:
            raise self._damage_found(error) from None

    def _damage_found(self, error: BaseException) -> StateError:
        """The file found damaged while the agent runs: remembered, so that every later
        change is refused (see ``reload``), and said."""
        self._damaged = f"{self.path}: damaged agent state ({clip(str(error))}); {REBUILD}"
        return StateError(self._damaged)

    # ------------------------------------------------------------------ reading
    def applied_versions(self) -> dict[str, int]:
        return dict(self.conn.execute("SELECT stream, version FROM streams").fetchall())

    def rules_of_stream(self, stream: str) -> list[str]:
        """The names of the rules a stream added, in the order they were added."""
        return [
            row[0]
            for row in self.conn.execute(
                "SELECT name FROM rules WHERE stream = ? ORDER BY position", (stream,)
            )
        ]

    def rule_streams(self) -> dict[str, list[str]]:
        """Rule name -> the sources that claim it (see agent/claims.py)."""
        return {name: sorted(holders) for name, holders in self._rule_claims.items()}

    def facts_of_source(self, source: str) -> list[tuple]:
        """The explicit facts a source asserted, as engine fact tuples."""
        relations = {rid: key for key, rid in self._rel_ids.items()}
        decode = self.reasoner.terms.values
        found = []
        for rid, *ids in facts_of_source(self.conn, source):
            name, arity = relations[rid]
            args = [decode[i] for i in ids]
            if arity == 1:
                found.append(("http://www.w3.org/1999/02/22-rdf-syntax-ns#type", args[0], name))
            else:
                found.append((name, *args))
        return found

    def summary(self) -> dict:
        """Counts straight from the file, without loading the reasoner (for health checks)."""
        one = self.conn.execute
        columns = _columns(self.conn, "derived")
        # (a file of schema version 3 or older, not migrated by a health check: a row per fact)
        counted = "COALESCE(SUM(size), 0)" if "size" in columns else "COUNT(*)"
        claims = (  # (one per fact and source claiming it; before version 8, a row each)
            "SELECT COALESCE(SUM(size), 0) FROM explicit"
            if "explicit" in _table_names(self.conn)
            else "SELECT COUNT(*) FROM facts"
        )
        last_error = self.get_meta("last_error")
        return {
            "database": str(self.path),
            "applied": self.applied_versions(),
            "rules": one("SELECT COUNT(*) FROM rules").fetchone()[0],
            "explicit_facts": one(claims).fetchone()[0],
            "derived_facts": one(f"SELECT {counted} FROM derived").fetchone()[0],
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
        superseded: Iterable[str] = (),
        reading_times: dict[str, float] | None = None,
    ) -> dict:
        """Apply one change made by ``source`` in memory and commit it in one transaction.

        ``source`` names who asserts the rules and facts (a bundle stream, ``sensor``,
        ``telemetry/<device>``, ``local``): the change adds and removes that source's claims
        (agent/claims.py), and may delete only what it claims, or what the ``superseded``
        sources claim. ``version`` records a bundle's stream version and ``reading_times`` the
        times of the newest readings per sensor, in the same transaction. Bad input (syntax,
        safety, stratification, ownership) raises the engine's error and changes nothing. A
        failed write raises StateError after restoring memory from the file."""
        if self._damaged is not None:
            raise StateError(self._damaged)
        if isinstance(add_rules, str):
            add_rules = parse_program(add_rules)
        if isinstance(add_rules, Program):  # ground facts written in rule text come along
            add_facts = [*(add_facts or ()), *(atom_fact(atom) for atom in add_rules.facts)]
            add_rules = add_rules.rules
        try:
            change = plan_change(
                source,
                add_rules=list(add_rules or ()),
                delete_rules=list(delete_rules),
                add_facts=[tuple(f) for f in add_facts or ()],
                delete_facts=[tuple(f) for f in delete_facts or ()],
                rule_claims=self._rule_claims,
                fact_claims=partial(self._fact_claims, ClaimReader(self.conn)),
                resolve_names=self.reasoner.resolve_rule_names,
                superseded=superseded,
            )
        except DamagedRow as error:  # (a claims row read for the plan: changed nothing yet)
            raise self._damage_found(error) from None
        try:
            report = self.reasoner.update(
                add_rules=change.add_rules,
                delete_rules=change.delete_rules,
                add_facts=change.add_facts,
                delete_facts=change.delete_facts,
            )
        except ZodiacError:
            raise  # checked before anything changed: memory is as it was, nothing to write
        except BaseException:
            self.reload()  # a failure half way through maintenance: trust the file
            raise
        try:
            with self.conn:  # one transaction: BEGIN ... COMMIT, or ROLLBACK on error
                self._write_terms()
                self._write_claims(change, source, bundle_id)
                self._write_nodes()
                self._write_equality()
                if version is not None:
                    self.conn.execute(
                        "INSERT INTO streams (stream, version, bundle_id, applied_at) "
                        "VALUES (?, ?, ?, ?) ON CONFLICT (stream) DO UPDATE SET "
                        "version = excluded.version, bundle_id = excluded.bundle_id, "
                        "applied_at = excluded.applied_at",
                        (version.stream, version.version, version.bundle_id, time.time()),
                    )
                if reading_times:
                    self.conn.executemany(
                        "INSERT INTO reading_times (source, sensor, at) VALUES (?, ?, ?) "
                        "ON CONFLICT (source, sensor) DO UPDATE SET at = excluded.at",
                        ((source, sensor, at) for sensor, at in reading_times.items()),
                    )
        except BaseException as error:
            self.reload()
            if isinstance(error, sqlite3.Error):
                raise StateError(
                    f"{self.path}: could not save the change ({error}); "
                    "the agent state is as before the change"
                ) from error
            raise
        self._claim_rules_in_memory(change, source)
        return report

    def reading_times(self, source: str) -> dict[str, float]:
        """Sensor -> time of the newest reading of ``source`` applied so far."""
        return dict(
            self.conn.execute(
                "SELECT sensor, at FROM reading_times WHERE source = ?", (source,)
            ).fetchall()
        )

    # ------------------------------------------------------------------ claims
    def _fact_claims(self, claims: ClaimReader, fact: tuple) -> set[str]:
        """The sources claiming an explicit fact (none for a fact with an unknown term)."""
        key, args = self.reasoner.lookup_fact(fact)
        if key is None or key not in self._rel_ids:
            return set()
        return claims.sources(self._rel_ids[key], args)

    def _write_claims(self, change: ClaimChange, source: str, bundle_id: str | None) -> None:
        encode = self.reasoner.lookup_fact
        released: Claimed = {}
        for fact, holder in change.released_facts:
            key, args = encode(fact)
            released.setdefault(holder, []).append((self._rel_id(key), *args))
        claimed: Claimed = {}
        for fact in change.claimed_facts:
            key, args = encode(fact)
            claimed.setdefault(source, []).append((self._rel_id(key), *args))
        write_claims(self.conn, released, claimed)
        self.conn.executemany(
            "DELETE FROM rules WHERE name = ? AND stream = ?", change.released_rules
        )
        if change.claimed_rules:
            start = self.conn.execute("SELECT COALESCE(MAX(position), 0) FROM rules").fetchone()[0]
            rows = [
                (rule.id, rule.key, str(rule), source, bundle_id, start + offset, rule_form(rule))
                for offset, rule in enumerate(change.claimed_rules, start=1)
            ]
            self.conn.executemany(
                "INSERT INTO rules (name, key, text, stream, bundle_id, position, form, crc) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                ((*row, row_checksum(*row)) for row in rows),
            )

    def _claim_rules_in_memory(self, change: ClaimChange, source: str) -> None:
        for name, holder in change.released_rules:
            holders = self._rule_claims.get(name, {})
            holders.pop(holder, None)
            if not holders:
                self._rule_claims.pop(name, None)
        for rule in change.claimed_rules:
            self._rule_claims.setdefault(rule.id, {})[source] = rule.key

    # ------------------------------------------------------------------ writing
    def _write_terms(self) -> None:
        values = self.reasoner.terms.values
        write_terms(self.conn, values, self._saved_terms)
        self._saved_terms = len(values)

    def _rel_id(self, key: RelationKey) -> int:
        rid = self._rel_ids.get(key)
        if rid is None:
            cursor = self.conn.execute("INSERT INTO relations (name, arity) VALUES (?, ?)", key)
            rid = self._rel_ids[key] = int(cursor.lastrowid)  # type: ignore[arg-type]
            self._checksums.add_relations([(rid, *key)])
            self._save_checksums()
        return rid

    def _save_checksums(self) -> None:
        """The running checksums, in the transaction that added the rows they cover (a failed
        one rolls both back, and the reload reads them again from the file)."""
        self.conn.execute(
            "INSERT INTO meta (key, value) VALUES (?, ?) "
            "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            (META_KEY, self._checksums.to_text()),
        )
        self._checksums_saved = True

    def _write_nodes(self) -> None:
        """Derived facts per hyper-node, by name, from the engine's journal, which lists the
        hyper-nodes the update walked and those it dropped: one created in the update is
        written in full, any other one gets its net changes (under its new name, when it kept
        its IDB under another); the rows of those dropped are deleted. The others are as they
        were and are not looked at: a commit's cost follows its update, not the program (a
        sensor reading's commit took a statement per hyper-node before)."""
        journal = self.reasoner.journal
        rows = self._node_rows
        for name in journal.dropped:
            self._delete_node_row(rows.pop(name, None))
        moving = {
            entry.previous: rows.pop(entry.previous, None)
            for entry in journal.nodes.values()
            if entry.previous
        }
        views = self.reasoner.node_views(journal.nodes)
        for name, entry in journal.nodes.items():
            row = moving.pop(entry.previous, None) if entry.previous else rows.pop(name, None)
            rows[name] = self._write_node(views[name], entry, row)
        for row in moving.values():  # (none: a moved IDB is its new hyper-node's)
            self._delete_node_row(row)
        if len(rows) != len(self.reasoner.nodes):  # (a journal that does not cover the file)
            self.full_node_writes += 1
            self._write_every_node()

    def _write_node(self, node: NodeView, entry: NodeJournal | None, row: int | None) -> int:
        """One hyper-node's row and derived facts (``row``: the row it had, if any); returns
        its row."""
        if row is not None and entry is not None and entry.created:  # (a new IDB: rewritten)
            self._delete_node_row(row)
            row = None
        rules = json.dumps(sorted(r.key for r in node.rules))
        if row is None:
            cursor = self.conn.execute(
                "INSERT INTO nodes (name, rules, module) VALUES (?, ?, ?)",
                (node.name, rules, node.module),
            )
            row = int(cursor.lastrowid)  # type: ignore[arg-type]
            self._write_derived(row, node.store.relations)
            return row
        self.conn.execute(
            "UPDATE nodes SET name = ?, rules = ?, module = ? WHERE id = ?",
            (node.name, rules, node.module, row),
        )
        if entry is not None and (entry.changes.removed or entry.changes.added):
            self._update_derived(row, entry.changes.removed, entry.changes.added)
        return row

    def _write_every_node(self) -> None:
        """Every hyper-node's row made what the reasoner holds (``_write_nodes`` when the
        journal does not say it all: the file and memory disagree on which hyper-nodes exist)."""
        journal = self.reasoner.journal
        rows = self._node_rows
        kept: dict[str, int] = {}
        for node in self.reasoner.view().nodes:
            entry = journal.nodes.get(node.name)
            row = rows.get(node.name)
            if entry is not None and row is not None:  # (written by _write_nodes already)
                kept[node.name] = row
                continue
            kept[node.name] = self._write_node(node, None, row)
        for gone in set(rows.values()) - set(kept.values()):
            self._delete_node_row(gone)
        self._node_rows = kept

    def _delete_node_row(self, row: int | None) -> None:
        if row is None:
            return
        self.conn.execute("DELETE FROM derived WHERE node = ?", (row,))
        self.conn.execute("DELETE FROM nodes WHERE id = ?", (row,))

    def _write_equality(self) -> None:
        """The equality component's facts (one ``nodes`` row, module ``equality``, written
        like a hyper-node's: in full when the component was rebuilt, else its net changes) and
        the representatives of the terms whose representative changed."""
        layer = self.reasoner.equality
        if layer is None:
            return
        full, left, entered, changed = layer.saved_changes()
        row = self._equality_row
        keys = json.dumps(list(layer.component_keys))
        classes = layer.classes
        if row is None or full:
            if row is None:
                cursor = self.conn.execute(
                    "INSERT INTO nodes (name, rules, module) VALUES (?, ?, ?)",
                    (EQUALITY_MODULE, keys, EQUALITY_MODULE),
                )
                row = self._equality_row = int(cursor.lastrowid)  # type: ignore[arg-type]
            else:
                self.conn.execute("UPDATE nodes SET rules = ? WHERE id = ?", (keys, row))
                self.conn.execute("DELETE FROM derived WHERE node = ?", (row,))
            facts: dict[RelationKey, set] = {}
            for key, args in layer.component.store:
                facts.setdefault(key, set()).add(args)
            DERIVED.insert(
                self.conn,
                row,
                (
                    (key, BitMap(objects))
                    for key, objects in self._by_prefix_with_rel_ids(facts).items()
                ),
            )
            self.conn.execute("DELETE FROM representatives")
            self.conn.executemany(
                "INSERT INTO representatives (term, representative) VALUES (?, ?)",
                ((term, rep) for term, rep in classes.rep.items() if term != rep),
            )
            return
        self.conn.execute("UPDATE nodes SET rules = ? WHERE id = ?", (keys, row))
        self._update_derived(row, left, entered)
        for term in changed:
            rep = classes.find(term)
            if rep == term:
                self.conn.execute("DELETE FROM representatives WHERE term = ?", (term,))
            else:
                self.conn.execute(
                    "INSERT INTO representatives (term, representative) VALUES (?, ?) "
                    "ON CONFLICT (term) DO UPDATE SET representative = excluded.representative",
                    (term, rep),
                )

    def _write_derived(self, row: int, relations: dict[RelationKey, Relation]) -> None:
        """A hyper-node's derived facts in full: one row per chunk of prefixes (module
        docstring)."""
        DERIVED.insert(
            self.conn,
            row,
            (
                ((self._rel_id(key), *prefix), BitMap(objects))
                for key, relation in relations.items()
                if len(relation)
                for prefix, objects in _by_prefix(relation)
            ),
        )

    def _with_rel_ids(self, changes: dict[RelationKey, set]) -> Iterator[tuple[int, ...]]:
        """Every changed fact as ``(relation id, *fact)``."""
        for key, facts in changes.items():
            if facts:
                rid = self._rel_id(key)
                yield from ((rid, *fact) for fact in facts)

    def _by_prefix_with_rel_ids(
        self, changes: dict[RelationKey, AbstractSet]
    ) -> dict[tuple[int, ...], Iterable[int]]:
        """Changed facts grouped as ``(relation id, *prefix)`` -> the last column's values; a
        change kept by subject (`SubjectFacts`) is grouped already, its tuples never made."""
        grouped: dict[tuple[int, ...], Iterable[int]] = {}
        rest: dict[RelationKey, AbstractSet] = {}
        for key, facts in changes.items():
            if isinstance(facts, SubjectFacts):
                rid = self._rel_id(key)
                for subject, objects in facts.by_subject.items():
                    if objects:
                        grouped[(rid, subject)] = objects
            elif facts:
                rest[key] = facts
        grouped.update(group_last(self._with_rel_ids(rest)))
        return grouped

    def _update_derived(
        self, row: int, removed: dict[RelationKey, set], added: dict[RelationKey, set]
    ) -> None:
        """A kept hyper-node's net changes, applied to the chunks holding the prefixes they
        touch (``ChunkTable.change``: a mismatch between the journal and the file is raised
        as an integrity error, and ``apply`` then reloads from the file)."""
        gone_by, new_by = (self._by_prefix_with_rel_ids(changes) for changes in (removed, added))
        DERIVED.change(self.conn, row, gone_by, new_by)


# ---------------------------------------------------------------------- encoding helpers
class _RolledBack(Exception):
    """Ends a transaction that must change nothing (``with conn`` then rolls it back)."""


def _has_content(path: Path) -> bool:
    return path.exists() and path.stat().st_size > 0


def _wal_of(path: Path) -> Path:
    return path.with_name(path.name + "-wal")


def _create_atomically(path: Path) -> None:
    """Create an empty agent state at ``path`` so that the path never names a half-made file.

    The schema is written to a temporary file next to it, committed, flushed to disk, and
    renamed over ``path`` (an empty file left by an earlier attempt, if any): a start killed at
    any point leaves either no state (the next start creates it) or a complete empty one,
    never a file the agent then refuses as foreign. Leftovers of killed attempts are removed."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise StateError(
            f"{path}: cannot create the agent state here ({error.strerror or error})"
        ) from None
    leftovers = [*path.parent.glob(f".{path.name}.creating-*"), path.with_name(path.name + "-shm")]
    for stale in leftovers:
        stale.unlink(missing_ok=True)
    _wal_of(path).unlink(missing_ok=True)  # empty (else the state would not be created anew)
    temporary = path.with_name(f".{path.name}.creating-{os.getpid()}")
    conn = sqlite3.connect(temporary)
    try:
        with conn:
            conn.executescript(SCHEMA)
            conn.executemany(
                "INSERT INTO meta (key, value) VALUES (?, ?)",
                [
                    ("format", FORMAT),
                    ("schema_version", str(SCHEMA_VERSION)),
                    ("created_at", str(time.time())),
                ],
            )
    finally:
        conn.close()
    with open(temporary, "rb") as written:
        os.fsync(written.fileno())
    os.replace(temporary, path)
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def _connect(path: Path) -> sqlite3.Connection:
    """Autocommit off by hand: ``with conn`` then wraps each change in BEGIN/COMMIT."""
    try:
        conn = sqlite3.connect(path, isolation_level="DEFERRED", check_same_thread=False)
    except sqlite3.OperationalError as error:
        raise StateError(f"{path}: cannot open the agent state ({error})") from None
    conn.execute("PRAGMA busy_timeout=5000")
    return conn


def _table_names(conn: sqlite3.Connection) -> set[str]:
    """The file's tables, asked of SQLite directly. (This was the agent's one use of
    sqlite-utils, whose ``Database`` wrapper scans every installed package's entry points for
    plugins the first time it is made: in a new agent process that cost more than the rest of
    opening its state, and it let any installed plugin hook the state's connection.)"""
    return {name for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}


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


def _pack_prefix(prefix: tuple[int, ...]) -> tuple[int, int, int, str]:
    """A derived row's prefix (every column but the last) in the ``a0, a1, a2, rest`` columns."""
    return _pack(prefix) if prefix else (-1, -1, -1, "")


def _by_prefix(relation: Relation) -> Iterable[tuple[tuple[int, ...], Iterable[int]]]:
    """A relation's facts grouped by every column but the last: (prefix, last-column ids).
    A binary relation's index on its subject, where the engine keeps one, is that grouping."""
    if relation.arity == 2:
        subjects = relation.existing_index(SUBJECT)
        if subjects is None:
            subjects = by_subject(relation.tuples)
        return (((subject,), objects) for subject, objects in subjects.items())
    return group_last(relation.tuples).items()


def _load_derived(
    conn: sqlite3.Connection, relations: dict[int, RelationKey]
) -> dict[int, dict[RelationKey, SavedFacts]]:
    """Every hyper-node's derived facts, by node row (one query for all): a binary relation
    as subject -> bitmap of objects not read yet (``store.SavedSubjects``: the engine
    deserialises the bitmaps, and adopts them as its storage, when a reader first uses the
    relation), any other as a set of tuples. A row whose checksum does not match raises
    ValueError (a damaged state; ids naming no term are found before, by
    ``check_integrity``)."""
    rows: dict[tuple[int, RelationKey], list[bytes]] = {}
    counts: dict[tuple[int, RelationKey], int] = {}
    for node, rid, size, high, top, crc, blob in conn.execute(
        "SELECT node, rel, size, high, top, crc, CAST(packed AS BLOB) FROM derived"
    ):
        verify(size, high, top, crc, blob)
        place = (node, relations[rid])
        rows.setdefault(place, []).append(blob)
        counts[place] = counts.get(place, 0) + size
    found: dict[int, dict[RelationKey, SavedFacts]] = {}
    for (node, key), blobs in rows.items():
        found.setdefault(node, {})[key] = saved_facts(key, blobs, counts[node, key])
    return found


def _legacy_term_problems(conn: sqlite3.Connection) -> tuple[list[tuple], list[str]]:
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


# ---------------------------------------------------------------------- schema migrations
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
    claim, agent/claims.py), and the newest reading time per sensor is kept."""
    conn.execute("ALTER TABLE facts RENAME TO facts_v2")
    conn.execute("DROP INDEX IF EXISTS facts_by_source")
    conn.execute("ALTER TABLE rules RENAME TO rules_v2")
    _execute_all(
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
    relation are packed into chunks, a row each (agent/derived_rows.py). The bitmaps are
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
    """Version 6 -> 7: each saved rule gets its syntax tree as JSON (agent/engine/rule_form.py),
    which the next start reads instead of parsing the text. A text that does not parse gets no
    form: the integrity check then reports that rule as damaged, as version 6 did."""
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
    (agent/explicit_rows.py)."""
    arities = dict(conn.execute("SELECT id, arity FROM relations"))
    claimed: Claimed = {}
    for rid, a0, a1, a2, rest, source in conn.execute(
        "SELECT rel, a0, a1, a2, rest, source FROM facts"
    ):
        claimed.setdefault(source, []).append((rid, *_unpack(arities[rid], a0, a1, a2, rest)))
    _execute_all(conn, EXPLICIT_TABLE)
    insert_claims(conn, claimed)
    conn.execute("DROP INDEX IF EXISTS facts_by_source")
    conn.execute("DROP TABLE facts")
    return 8


def _terms_by_chunk(conn: sqlite3.Connection) -> int:
    """Version 8 -> 9: terms were saved one row per term, covered by running checksums in
    ``meta``; now they are packed by chunks of ids, each with its own checksum
    (agent/term_rows.py). The rows are checked first (ids, kinds, values, their checksums):
    packing damaged terms would give them checksums that vouch for them."""
    term_rows, problems = _legacy_term_problems(conn)
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
    again (agent/saved_rules.py). The rules are read back and checked first, as version 9
    read them at every start: a checksum would vouch for a damaged row."""
    conn.execute("ALTER TABLE rules ADD COLUMN crc INTEGER")
    rows = _saved_rule_rows(conn)
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


def _saved_rule_rows(conn: sqlite3.Connection) -> list[tuple]:
    """The rules table's rows as agent/saved_rules.py reads them, in the order the rules
    were added (a load keeps it), a column an older file lacks read as NULL."""
    columns = _columns(conn, "rules")
    form = "form" if "form" in columns else "NULL"  # (before version 7: no forms)
    crc = "crc" if "crc" in columns else "NULL"  # (before version 10: no checksums)
    return conn.execute(
        f"SELECT name, key, text, stream, bundle_id, position, {form}, {crc} FROM rules "
        "ORDER BY position"
    ).fetchall()


def _columns(conn: sqlite3.Connection, table: str) -> set[str]:
    return {column for _, column, *_ in conn.execute(f"PRAGMA table_info({table})")}


def _damaged_rows(conn: sqlite3.Connection, table: str) -> int:
    """How many rows of a table of packed facts do not match their checksums."""
    damaged = 0
    for row in conn.execute(f"SELECT size, high, top, crc, CAST(packed AS BLOB) FROM {table}"):
        try:
            verify(*row)
        except ValueError:
            damaged += 1
    return damaged


def _execute_all(conn: sqlite3.Connection, *scripts: str) -> None:
    """Run each statement of the scripts in the open transaction (``executescript`` would
    commit it first)."""
    for script in scripts:
        for statement in script.split(";"):
            if statement.strip():
                conn.execute(statement)


def _as_tuples(facts: dict[RelationKey, SavedFacts]) -> dict[RelationKey, set]:
    """Saved facts as sets of tuples (a binary relation is saved as subject -> objects)."""
    found: dict[RelationKey, set] = {}
    for key, saved in facts.items():
        if isinstance(saved, SavedSubjects):
            saved = saved.read()
        if isinstance(saved, dict):
            found[key] = {(s, o) for s, objects in saved.items() for o in objects}
        else:
            found[key] = set(saved)
    return found


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
}
