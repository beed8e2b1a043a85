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
packed into chunks of up to 64 subjects, a row each (agent/state/packing.py: the layout, and
why), with its fact count, largest ids and a checksum (counts and integrity checks without
reading the bitmaps). Derived facts are packed per hyper-node (``derived``), explicit facts per
source claiming them (``explicit``, agent/state/explicit_rows.py; agent/state/chunk_tables.py
changes both). A restart checks each row's checksum and hands a binary relation to the engine still
serialised; the engine reads it, as subject -> objects sets it keeps as they are
(``Relation.adopt_subjects``), when a reader first uses the relation (``store.SavedSubjects``).
The file is a fraction of a row per fact (docs/storage.md). Hyper-nodes get a row each, keyed
by a number that follows the in-memory IDB store (a kept or reduced hyper-node keeps its rows
and receives only differences, applied to the bitmaps of the prefixes they touch, in the chunks
holding them; a new, split or recomputed one is written in full; a dropped one is deleted).
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import sqlite3
import time
from collections.abc import Iterable, Iterator
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path

from pyroaring import BitMap

from agent.budgets.stream_budgets import StreamBudgets
from agent.engine.budget import Budget
from agent.engine.equality.component import SAME_AS, mentions_equality
from agent.engine.errors import ZodiacError
from agent.engine.gcpause import collector_paused
from agent.engine.language import Program, Rule, Value, WindowDeclaration
from agent.engine.program.loaders import load_facts, load_program
from agent.engine.program.rule_form import rule_form
from agent.engine.reasoner import Reasoner
from agent.engine.storage.changes import NodeJournal
from agent.engine.storage.store import (
    SUBJECT,
    Relation,
    RelationKey,
    SavedFacts,
    SavedSubjects,
    by_subject,
)
from agent.engine.storage.subject_facts import SubjectFacts
from agent.engine.storage.view import NodeView
from agent.engine.update.net_change import NetChange
from agent.readings.windows import (
    DEFAULT_MAX_FACTS,
    WINDOW_SOURCE,
    WindowChange,
    WindowError,
    WindowIndex,
    checked_declarations,
)
from agent.state.checksums import META_KEY, DictionaryChecksums
from agent.state.chunk_tables import DERIVED, group_last, saved_facts
from agent.state.claims import ClaimChange, RuleClaims, plan_change
from agent.state.explicit_rows import (
    Claimed,
    ClaimReader,
    facts_of_source,
    load_explicit,
    write_claims,
)
from agent.state.migrations import MIGRATIONS, legacy_term_problems, upgrade
from agent.state.outbox import (
    append_event,
    cause_of,
    encode_fact,
    merge_started,
    merge_stopped,
    save_watches,
    saved_watches,
)
from agent.state.packing import DamagedRow, verify
from agent.state.saved_rules import parse_saved_rule, read_saved_rules, row_checksum
from agent.state.schema import (
    EXPECTED_TABLES,
    FORMAT,
    REBUILD,
    SCHEMA,
    SCHEMA_VERSION,
    TERMS_BY_CHUNK,
    StateError,
    StatePathError,
    bookkeeping_problems,
    clip,
    saved_rule_rows,
    table_columns,
    table_names,
)
from agent.state.stream_history import (
    SavedVersion,
    kept_versions,
    save_version,
    saved_version,
    stream_watches,
)
from agent.state.term_rows import load_terms, write_terms

SYNCHRONOUS_MODES = ("OFF", "NORMAL", "FULL", "EXTRA")
# What reading a damaged file raises, beyond SQLite's own check (``_check_file``): a text that
# is not UTF-8 (sqlite3.OperationalError, UnicodeDecodeError), a renamed column, a value of the
# wrong type or out of range. Opening a state turns these into StateError: refused, not a
# traceback.
DAMAGE_SIGNS = (sqlite3.Error, ValueError, TypeError, KeyError, IndexError, OverflowError)
# The ``nodes`` row holding the equality component's facts (agent/engine/equality/layer.py).
EQUALITY_MODULE = "equality"
# How many rule requests `summary()` (zodiac-agent status) lists, the newest.
SUMMARY_REQUESTS = 10


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
        stream_budgets: StreamBudgets | None = None,
        max_events: int = 10_000,
        max_window_facts: int = DEFAULT_MAX_FACTS,
        stream_history: int = 3,
    ) -> None:
        """Open (or, with ``create``, create) the state file and load the reasoner from it.

        Raises :class:`StateError` for a file that is not an agent state (never overwritten),
        a corrupt file, or a schema newer than this program knows. ``budget`` limits every
        change, and ``stream_budgets`` the derived facts each source's rules may hold
        (agent/budgets/stream_budgets.py). ``max_events``: the outbox's budget (outbox.py);
        ``max_window_facts``: each window's (agent/readings/windows.py).
        ``stream_history``: how many versions of each stream's content are kept for reverts
        (stream_history.py; 0: none)."""
        self.path = Path(path)
        self.max_events = max_events
        self.max_window_facts = max_window_facts
        self.stream_history = stream_history
        self.clock = time.time  # the events' time (injectable, as the agent's clock)
        synchronous = synchronous.upper()
        if synchronous not in SYNCHRONOUS_MODES:
            raise StateError(f"synchronous must be one of {', '.join(SYNCHRONOUS_MODES)}")
        self.modules = modules
        self.decompositions = decompositions  # Reasoner(decompositions=...)
        self.budget = budget  # limits every change (not the load: a saved state is trusted)
        self.stream_budgets = stream_budgets
        # The file the path names, links followed: SQLite keeps its -wal and -shm next to it.
        self.file = _state_file(self.path)
        _refuse_orphaned_log(self.path, self.file)
        existed = _has_content(self.file) or _has_content(_wal_of(self.file))
        if not existed and not create:
            raise StateError(f"{self.path}: no agent state here (run the agent once to create it)")
        if not existed:
            _create_atomically(self.file)
        # The collector paused while the file is read, and what is alive then frozen, as after
        # a materialisation (gcpause.py): a load builds the reasoner's whole state, objects
        # that live as long as the agent. Without it, in a process just started, the first
        # full collection (during the open, or right after it) walked every object of the
        # imports and of the state (a large share of a small state's restart), which the
        # recompute it is measured against never pays (its materialisation freezes).
        with collector_paused() as pause:
            pause.large = load
            self._open(existed, synchronous, load)

    def _open(self, existed: bool, synchronous: str, load: bool) -> None:
        """Connect, check the file (migrating an older schema when ``load``) and load the
        reasoner from it (``load``); see ``__init__``."""
        self.conn = _connect(self.file)
        # The file this state is: a path that later names another file, or none, means the
        # file was replaced or deleted under the agent (see ``check_file``).
        self._identity = _identity(self.file)
        self._companions: dict[Path, tuple[int, int] | None] = {}
        self.gone: str | None = None
        try:
            # Before anything that writes, such as the WAL switch. A health check
            # (``load=False``) reads an older file as it is, without migrating it.
            self._check_file(migrate=load)
            _enable_wal(self.conn, self.path)
            self.conn.execute(f"PRAGMA synchronous={synchronous}")
            if load:
                self._check_writable()
                self._companions = {
                    companion: _identity(companion)
                    for companion in (_wal_of(self.file), _shm_of(self.file))
                }
        except sqlite3.DatabaseError as error:
            self.conn.close()
            if _disk_full(self.file):  # (SQLite cannot make its -shm there: an I/O error)
                raise StateError(
                    f"{self.path}: cannot open the agent state: its disk is full ({error}); "
                    "free space and start the agent again"
                ) from None
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
        # relations' running checksums (agent/state/checksums.py).
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
        agent/state/saved_rules.py) or fail validation. ``zodiac-agent status`` reports these;
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
            term_rows, problems = legacy_term_problems(conn)
            count = len(term_rows)
        packed = "high >= ?1 OR high < 0 OR top >= ?1 OR top < 0"
        tables = table_names(self.conn)
        explicit = (  # (a file before version 8, read as it is by a health check: a row per fact)
            ("explicit", packed)
            if "explicit" in tables
            else ("facts", "a0 >= ?1 OR a1 >= ?1 OR a2 >= ?1 OR a0 < -1 OR a1 < -1 OR a2 < -1")
        )
        for table, where in (explicit, ("derived", packed)):
            if checksums and "crc" in table_columns(conn, table):  # (packed: versions 8 and 6)
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
        self._rule_rows = saved_rule_rows(conn)
        self._parsed_rules, damage = read_saved_rules(self._rule_rows)
        if damage:
            name, reason = damage
            problems.append(f"saved rule {clip(name)} is damaged: {clip(reason)}")
        problems += self._check_dictionaries(term_rows)
        problems += bookkeeping_problems(conn)
        if "windows" in tables:  # (an older file, read as it is by a health check: none)
            for (text,) in conn.execute("SELECT DISTINCT declaration FROM windows"):
                try:
                    _saved_window(text)
                except DamagedRow as error:
                    problems.append(str(error))
        return problems

    def _check_dictionaries(self, term_rows: list[tuple] | None = None) -> list[str]:
        """Relations, and the rows of a file's terms before version 9 (``term_rows``), against
        their saved checksums (none saved yet: nothing to say; the load that follows saves
        them). Since version 9 each chunk of terms has its own (agent/state/term_rows.py)."""
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
        tables = table_names(self.conn)
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
                upgrade(self.conn, version)  # (one transaction: agent/state/migrations.py)
            except StateError as error:  # (damage the upgrade found: nothing was changed)
                raise StateError(f"{self.path}: {error}") from None
            self._file_version = SCHEMA_VERSION
            tables = table_names(self.conn)
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

    def check_file(self) -> None:
        """Raise StateError if the configured path no longer names the file this state opened
        (deleted, moved away, or replaced by another file, while the agent runs). SQLite goes
        on writing to the file it has open, so a change committed then would be acknowledged
        into a file no path names: lost at the next start. Found once, it is remembered
        (``gone``): every later change is refused, and ``close`` cleans up."""
        if self.gone is None:
            self.gone = _gone(self.path, self._identity)
        if self.gone is not None:
            raise StateError(self.gone)

    def close(self) -> None:
        """Close the file. A state whose file is gone (``check_file``) first moves what its
        write-ahead log holds into the file it has open, then removes its own -wal and -shm,
        which no path's state owns any more: the next start finds no leftovers beside the
        path, and a state file put there instead (a restored copy) is not paired with them."""
        if self.gone is None:
            self.conn.close()
            return
        try:
            busy, frames, _ = self.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
            emptied = busy == 0 and frames == 0
        except sqlite3.Error:
            emptied = False
        self.conn.close()
        if emptied:
            for companion, identity in self._companions.items():
                if identity is not None and _identity(companion) == identity:
                    companion.unlink(missing_ok=True)

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
        for name, _, text, stream, *_ in rows if rows is not None else saved_rule_rows(conn):
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
        # The watches the file says are held: their changes so far are in the outbox already.
        self.watches = saved_watches(conn)
        for pattern in self.watches:
            self.reasoner.watch(pattern)
        self._load_windows()
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

    def _load_windows(self) -> None:
        """The windows held and, rebuilt from the facts of source ``window``, their index."""
        self.window_claims: dict[WindowDeclaration, set[str]] = {}
        for text, source in self.conn.execute("SELECT declaration, source FROM windows"):
            declaration = _saved_window(text)
            self.window_claims.setdefault(declaration, set()).add(source)
        self.windows = WindowIndex(self.max_window_facts)
        held = WindowChange(add=self.facts_of_source(WINDOW_SOURCE))
        self.windows.commit(held, declarations=self.window_claims)

    def reload(self) -> None:
        """Forget the in-memory state and rebuild it from the file (after a failed write).
        A file found damaged then (a row that no longer matches its checksum, say) raises
        StateError, and every later change is refused with it: memory may hold a change the
        file could not take, and the file cannot be trusted to rebuild it."""
        try:
            self.load_report = self._load(created=False)
        except DAMAGE_SIGNS as error:
            raise self._damage_found(error) from None

    @property
    def damage(self) -> str | None:
        """Why the state was found damaged while running (every change is refused since), or
        None (health checks: agent/observability/health.py)."""
        return self._damaged

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
        """Rule name -> the sources that claim it (see agent/state/claims.py)."""
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
        columns = table_columns(self.conn, "derived")
        # (a file of schema version 3 or older, not migrated by a health check: a row per fact)
        counted = "COALESCE(SUM(size), 0)" if "size" in columns else "COUNT(*)"
        claims = (  # (one per fact and source claiming it; before version 8, a row each)
            "SELECT COALESCE(SUM(size), 0) FROM explicit"
            if "explicit" in table_names(self.conn)
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
            # The latest rule requests and where each is in its life (sent, answered,
            # resolved: its rules released, cleared: its trigger gone), newest first.
            "requests": [
                {"event": event, "stream": stream, "status": status}
                for event, stream, status in one(
                    "SELECT event, stream, status FROM requests "
                    f"ORDER BY created_at DESC, rowid DESC LIMIT {SUMMARY_REQUESTS}"
                )
            ],
            "last_error": json.loads(last_error) if last_error else None,
            "windows": self._window_summary(),
        }

    def _window_summary(self) -> list[dict]:
        """The windows held (from the file): each declaration, who declares it, and the facts
        it holds now (an older file, read as it is by a health check: none)."""
        if "windows" not in table_names(self.conn):
            return []
        counts = dict(
            self.conn.execute(
                "SELECT r.name, COALESCE(SUM(e.size), 0) FROM explicit e "
                "JOIN relations r ON r.id = e.rel WHERE e.source = ? GROUP BY r.name",
                (WINDOW_SOURCE,),
            ).fetchall()
        )
        found: dict[str, dict] = {}
        for text, source in self.conn.execute(
            "SELECT declaration, source FROM windows ORDER BY declaration, source"
        ):
            relation = _saved_window(text).relation
            entry = found.setdefault(
                text, {"declaration": text, "sources": [], "facts": counts.get(relation, 0)}
            )
            entry["sources"].append(source)
        return list(found.values())

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
        add_rules: Iterable[Rule] | Program | str | os.PathLike | None = None,
        delete_rules: Iterable[str] | str = (),
        add_facts: Iterable[tuple] | str | os.PathLike | None = None,
        delete_facts: Iterable[tuple] | str | os.PathLike | None = None,
        source: str = "local",
        bundle_id: str | None = None,
        version: StreamVersion | None = None,
        superseded: Iterable[str] = (),
        reading_times: dict[str, float] | None = None,
        forget_meta: Iterable[str] = (),
        watches: Iterable[str] | None = None,
        cause: dict | None = None,
        windows: Iterable[WindowDeclaration] | None = None,
        window_facts: WindowChange | None = None,
        dry_run: bool = False,
    ) -> dict:
        """Apply one change made by ``source`` in memory and commit it in one transaction.

        Rules and facts are given as ``Reasoner.update`` takes them (text, files, Program,
        tuples); a fact or rule both deleted and added ends present, however each side spells
        it (``docs/semantics.md``, "One update").

        ``source`` names who asserts the rules and facts (a bundle stream, ``sensor``,
        ``telemetry/<device>``, ``local``): the change adds and removes that source's claims
        (agent/state/claims.py), and may delete only what it claims, or what the ``superseded``
        sources claim. ``version`` records a bundle's stream version and ``reading_times`` the
        times of the newest readings per sensor, in the same transaction, which also deletes
        the ``forget_meta`` notes (a bundle's marker, bundle_costs.py). Bad input (syntax,
        safety, stratification, ownership) raises the engine's error and changes nothing. A
        failed write raises StateError after restoring memory from the file. A change while
        the path no longer names the file opened raises StateError too (``check_file``).

        ``watches``: the patterns ``source`` watches after the change (None: as before; the
        ``superseded`` sources' go). The watched facts the change makes appear and disappear
        are one event of the outbox, written in the same transaction (outbox.py), with
        ``cause`` (by default, what ``source`` and ``version`` say).

        ``windows``: the window declarations ``source`` holds after the change (None: as
        before; the ``superseded`` sources' go); a window no source declares any more loses
        its facts in this change. ``window_facts``: window facts to add and delete
        (`WindowIndex.arrivals`, `expiry`), claimed by source ``window``, in this same update
        and transaction (agent/readings/windows.py). Windows that cannot hold together (one
        relation declared twice, differently; a window relation that a rule derives or another
        source asserts facts of) raise WindowError, and nothing is changed.

        ``dry_run``: the change is made and written as it would be, then its transaction is
        rolled back and memory rebuilt from the file (``reload``): the file and the reasoner
        are as before, and the report says what the change did, with ``predicates``, the fact
        counts per predicate (name, arity) before and after that differ. A change over the
        budget raises BudgetExceeded as it would for real. A bundle's version saves the
        stream's content (stream_history.py) in the change's transaction."""
        if self._damaged is not None:
            raise StateError(self._damaged)
        self.check_file()
        # Deletions, then additions (ground facts written in rule text among them), folded
        # into their net change by identity (engine/net_change.py).
        program = load_program(add_rules) if add_rules is not None else Program()
        net = NetChange()
        net.delete_rules([delete_rules] if isinstance(delete_rules, str) else delete_rules)
        net.delete_facts(load_facts(delete_facts) if delete_facts is not None else ())
        net.add_rules(program.rules)
        net.add_facts(load_facts(add_facts) if add_facts is not None else ())
        net.add_facts(program.facts)
        if program.windows or program.watches:
            raise WindowError(
                "a program's @window and @watch directives are given to AgentState.apply as "
                "windows= and watches=, not in its rules"
            )
        window_claims = self._windows_after(source, windows, superseded)
        declared = checked_declarations(window_claims)
        window_change = self.windows.redeclared(declared.values())
        if window_facts is not None:
            window_change = window_change.merged(
                WindowChange(
                    add=[f for f in window_facts.add if f[0] in declared],
                    delete=window_facts.delete,
                    late=window_facts.late,
                    evicted=window_facts.evicted,
                )
            )
        try:
            window_plan = plan_change(
                WINDOW_SOURCE,
                add_rules=(),
                delete_rules=(),
                add_facts=window_change.add,
                delete_facts=window_change.delete,
                rule_claims={},
                fact_claims=partial(self._fact_claims, ClaimReader(self.conn)),
                resolve_names=lambda names: set(names),
            )
        except DamagedRow as error:
            raise self._damage_found(error) from None
        try:
            change = plan_change(
                source,
                add_rules=net.rules_added,
                delete_rules=net.rules_deleted,
                add_facts=net.facts_added,
                delete_facts=net.facts_deleted,
                rule_claims=self._rule_claims,
                fact_claims=partial(self._fact_claims, ClaimReader(self.conn)),
                resolve_names=self.reasoner.resolve_rule_names,
                superseded=superseded,
            )
        except DamagedRow as error:  # (a claims row read for the plan: changed nothing yet)
            raise self._damage_found(error) from None
        self._check_windows(declared, change, source)
        held = self._watches_after(source, watches, superseded)
        sizes_before = self.reasoner.view().sizes() if dry_run else {}
        started = {p: self.reasoner.watch(p) for p in held if p not in self.watches}
        try:
            report = self.reasoner.update(
                add_rules=change.add_rules,
                delete_rules=change.delete_rules,
                add_facts=change.add_facts + window_plan.add_facts,
                delete_facts=change.delete_facts + window_plan.delete_facts,
                budget=self._budget_for(change, source),
            )
        except ZodiacError:
            for pattern in started:  # (the rest is as it was: nothing to write)
                self.reasoner.unwatch(pattern)
            raise
        except BaseException:
            self.reload()  # a failure half way through maintenance: trust the file
            raise
        if dry_run:
            report["predicates"] = _changed_sizes(sizes_before, self.reasoner.view().sizes())
        changes = merge_started(report.get("watched", {}), started)
        for pattern in [p for p in self.watches if p not in held]:
            changes = merge_stopped(changes, pattern, self.reasoner.unwatch(pattern))
        try:
            with self.conn:  # one transaction: BEGIN ... COMMIT, or ROLLBACK on error
                self._write_terms()
                self._write_claims(change, source, bundle_id)
                if window_plan.claimed_facts or window_plan.released_facts:
                    self._write_claims(window_plan, WINDOW_SOURCE, None)
                if window_claims != self.window_claims:
                    self._save_windows(window_claims)
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
                self.conn.executemany(
                    "DELETE FROM meta WHERE key = ?", ((key,) for key in forget_meta)
                )
                if held != self.watches:
                    save_watches(self.conn, held)
                what = cause if cause is not None else cause_of(source, version)
                append_event(self.conn, changes, what, self.clock(), self.max_events)
                if version is not None and self.stream_history > 0:
                    self._save_history(version, held, window_claims)
                if dry_run:
                    raise _RolledBack
        except _RolledBack:  # (a dry run: the file is as before; so is memory, from it)
            self.reload()
            report["events"] = changes
            return report
        except BaseException as error:
            self.reload()
            if isinstance(error, sqlite3.Error):
                raise StateError(
                    f"{self.path}: could not save the change ({error}); "
                    "the agent state is as before the change"
                ) from error
            raise
        self.check_file()  # (committed to the file opened: is it still the state's?)
        self._claim_rules_in_memory(change, source)
        self.watches = held
        self.windows.commit(window_change, declarations=declared.values())
        self.window_claims = window_claims
        report["events"] = changes
        report["windows"] = {
            "added": len(window_plan.add_facts),
            "deleted": len(window_plan.delete_facts),
            "late": window_change.late,
            "evicted": window_change.evicted,
        }
        return report

    def _windows_after(
        self,
        source: str,
        windows: Iterable[WindowDeclaration] | None,
        superseded: Iterable[str],
    ) -> dict[WindowDeclaration, set[str]]:
        """Declaration -> sources once ``source`` declares ``windows`` (None: what it does)
        and the ``superseded`` sources nothing (as `_watches_after`)."""
        gone = {source, *superseded} if windows is not None else set(superseded)
        held = {d: set(s) - gone for d, s in self.window_claims.items()}
        for declaration in windows or ():
            held.setdefault(declaration, set()).add(source)
        return {d: s for d, s in held.items() if s}

    def _check_windows(
        self, declared: dict[str, WindowDeclaration], change: ClaimChange, source: str
    ) -> None:
        """Refuse (WindowError) a change after which a window relation is the head of a rule,
        or has facts another source asserts: a window's facts are the agent's alone."""
        if not declared:
            return
        deleted = set(change.delete_rules)
        rules = [r for name, r in self.reasoner.rules.items() if name not in deleted]
        for rule in [*rules, *change.add_rules]:
            for head in rule.heads:
                if head.predicate in declared:
                    raise WindowError(
                        f"rule {rule.id} derives <{head.predicate}>, the relation of "
                        f"{declared[head.predicate]}: a window's facts are kept by the agent "
                        "from its readings, no rule may derive them"
                    )
        for fact in change.add_facts:
            if len(fact) == 4 and fact[0] in declared:
                raise WindowError(
                    f"{source!r} asserts a fact of <{fact[0]}>, the relation of "
                    f"{declared[fact[0]]}: a window's facts are kept by the agent from its "
                    "readings"
                )

    def _save_windows(self, claims: dict[WindowDeclaration, set[str]]) -> None:
        """The windows held, in the change's transaction."""
        self.conn.execute("DELETE FROM windows")
        self.conn.executemany(
            "INSERT INTO windows (declaration, source) VALUES (?, ?)",
            sorted((str(d), s) for d, sources in claims.items() for s in sources),
        )

    def window_arrivals(self, readings: Iterable[tuple], at: float, now: float) -> WindowChange:
        """The window facts readings applied at ``at`` add when the clock says ``now``
        (`WindowIndex.arrivals`), for ``apply(window_facts=...)``."""
        return self.windows.arrivals(readings, at, now)

    def expire_windows(self, now: float) -> dict | None:
        """Delete, as one change, the window facts that have left their window at ``now``
        (cause ``{"kind": "window expiry"}``); None when none has."""
        change = self.windows.expiry(now)
        if not change:
            return None
        return self.apply(
            source=WINDOW_SOURCE, window_facts=change, cause={"kind": "window expiry"}
        )

    def _save_history(
        self,
        version: StreamVersion,
        held: dict[str, set[str]],
        window_claims: dict[WindowDeclaration, set[str]],
    ) -> None:
        """The stream's content once the change is made, as its ``version`` (in the change's
        open transaction, which reads its own writes)."""
        stream = version.stream
        rules = self.conn.execute(
            "SELECT name, text FROM rules WHERE stream = ? ORDER BY position", (stream,)
        ).fetchall()
        saved = SavedVersion(
            stream=stream,
            version=version.version,
            bundle_id=version.bundle_id,
            rules=[(name, text) for name, text in rules],
            facts=[encode_fact(fact) for fact in self.facts_of_source(stream)],
            watches=list(stream_watches(held, stream)),
            windows=sorted(str(d) for d, sources in window_claims.items() if stream in sources),
        )
        save_version(self.conn, saved, time.time(), self.stream_history)

    def saved_version(self, stream: str, version: int) -> SavedVersion | None:
        """The content ``stream`` had at ``version`` (None: not kept)."""
        return saved_version(self.conn, stream, version)

    def kept_versions(self, stream: str) -> list[int]:
        return kept_versions(self.conn, stream)

    def _watches_after(
        self, source: str, watches: Iterable[str] | None, superseded: Iterable[str]
    ) -> dict[str, set[str]]:
        """Pattern -> sources once ``source`` watches ``watches`` (None: what it watches) and
        the ``superseded`` sources nothing. Patterns are checked here (ParseError)."""
        from agent.engine.program.parser import parse_atom

        gone = {source, *superseded} if watches is not None else set(superseded)
        held = {p: set(s) - gone for p, s in self.watches.items()}
        for pattern in watches or ():
            held.setdefault(str(parse_atom(pattern)), set()).add(source)
        return {p: s for p, s in held.items() if s}

    def set_watches(self, source: str, watches: Iterable[str], cause: dict | None = None) -> dict:
        """``source`` watches exactly ``watches`` from now on: one change with no facts or rules
        (the facts of a new watch appear, those of a watch no source holds any more
        disappear, as one event: see ``apply``)."""
        return self.apply(source=source, watches=list(watches), cause=cause)

    def _budget_for(self, change: ClaimChange, source: str) -> Budget | None:
        """The budget of one change: the reasoner's (``budget``), with the derived facts each
        owner's rules may hold once the change is made (``stream_budgets``); None: the
        reasoner's as it is."""
        if self.stream_budgets is None:
            return None
        claims = {name: dict(holders) for name, holders in self._rule_claims.items()}
        for name, holder in change.released_rules:
            claims.get(name, {}).pop(holder, None)
        for rule in change.claimed_rules:
            claims.setdefault(rule.id, {})[source] = rule.key
        limits = self.stream_budgets.fact_limits(source, claims, self.reasoner.nodes)
        return replace(self.reasoner.budget or Budget(), fact_limits=limits)

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


def _state_file(path: Path) -> Path:
    """The file ``path`` names, symbolic links followed. A link on the way that leads nowhere
    (a volume not mounted yet at boot) or to itself (a loop) is refused: creating a state
    there would put a new empty state in the link's place, abandoning the real one and
    deleting the operator's link."""
    for place in (path, *path.parents):
        if not place.is_symlink():
            continue
        try:
            place.stat()
        except FileNotFoundError:
            raise StatePathError(
                f"{path}: {place} is a symbolic link to {os.readlink(place)}, which does not "
                "exist (a volume not mounted yet?); the agent does not create a state in its "
                "place: mount the volume, or correct the link or the configured database"
            ) from None
        except OSError as error:
            if error.errno != errno.ELOOP:
                raise StateError(f"{path}: cannot use {place} ({error.strerror})") from None
            raise StatePathError(
                f"{path}: {place} is a loop of symbolic links; the agent does not create a "
                "state in its place: correct the link or the configured database"
            ) from None
    return Path(os.path.realpath(path))


def _disk_full(file: Path) -> bool:
    """Whether the disk holding ``file`` has less than a few pages free."""
    try:
        return shutil.disk_usage(file.parent).free < 64 * 1024
    except OSError:
        return False


def _identity(path: Path) -> tuple[int, int] | None:
    """(device, inode) of the file ``path`` names, links followed; None if it names none."""
    try:
        found = os.stat(path)
    except OSError:
        return None
    return found.st_dev, found.st_ino


def _gone(path: Path, identity: tuple[int, int] | None) -> str | None:
    """Why ``path`` no longer names the state file opened as ``identity``, or None."""
    now = _identity(path)
    if now == identity:
        return None
    what = "deleted or moved away" if now is None else "replaced by another file"
    return (
        f"{path}: the state file was {what} while the agent had it open; nothing more is "
        "acknowledged and the agent stops (started again, it opens what the path names then)"
    )


def _refuse_orphaned_log(path: Path, file: Path) -> None:
    """Refuse to start beside the write-ahead log of a state file that is missing: the file
    was deleted or moved away while an agent had it open (and that agent was killed before it
    noticed). The log alone is not a state (what it held before its last checkpoint is in the
    file), and SQLite would pair it with any new file made at the path."""
    wal = _wal_of(file)
    if file.exists() or not _has_content(wal):
        return
    shm = _shm_of(file)
    raise StateError(
        f"{path}: the state file is missing, but its write-ahead log {wal.name} "
        f"({wal.stat().st_size} bytes) and {shm.name} are still there: the state file was "
        "deleted or moved away while an agent had it open. If it was moved, move it back "
        f"(its -wal and -shm with it); to start with a new empty state instead (the cloud then "
        f"resends the streams' full state), delete {wal} and {shm}"
    )


def _has_content(path: Path) -> bool:
    return path.exists() and path.stat().st_size > 0


def _wal_of(path: Path) -> Path:
    return path.with_name(path.name + "-wal")


def _shm_of(path: Path) -> Path:
    return path.with_name(path.name + "-shm")


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
    leftovers = [*path.parent.glob(f".{path.name}.creating-*"), _shm_of(path)]
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


def _enable_wal(conn: sqlite3.Connection, path: Path) -> None:
    mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()
    if not mode or mode[0].lower() != "wal":
        raise StateError(f"{path}: could not switch the database to WAL mode (got {mode})")


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


def _damaged_rows(conn: sqlite3.Connection, table: str) -> int:
    """How many rows of a table of packed facts do not match their checksums."""
    damaged = 0
    for row in conn.execute(f"SELECT size, high, top, crc, CAST(packed AS BLOB) FROM {table}"):
        try:
            verify(*row)
        except ValueError:
            damaged += 1
    return damaged


def _saved_window(text: object) -> WindowDeclaration:
    """A window declaration as the ``windows`` table holds it (its canonical text); one that
    does not read back is a damaged file (DamagedRow)."""
    from agent.engine.errors import ParseError
    from agent.engine.program.parser import parse_window

    try:
        if not isinstance(text, str):
            raise ParseError("not text", source="saved window")
        return parse_window(text, "saved window")
    except ParseError as error:
        raise DamagedRow(f"saved window {clip(text)} is damaged: {clip(str(error))}") from None


def _changed_sizes(
    before: dict[RelationKey, int], after: dict[RelationKey, int]
) -> dict[RelationKey, tuple[int, int]]:
    """(name, arity) -> (facts before, facts after), for the relations whose size changed."""
    return {
        key: (before.get(key, 0), after.get(key, 0))
        for key in before.keys() | after.keys()
        if before.get(key, 0) != after.get(key, 0)
    }


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
