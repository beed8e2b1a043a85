"""The agent's SQLite state (agent/state/agent_state.py): real files, real SQLite.

* Differential: random sequences of fact and rule changes are applied through ``AgentState``;
  after every step the file is reopened and the loaded reasoner (no recomputation) must equal a
  reasoner built from scratch with the model's rules and facts, fact for fact. The next change
  is applied to the *reopened* state, so restored hyper-nodes (closure and aggregate modules,
  whose auxiliary state is rebuilt lazily) are maintained from a loaded state.
* Bad input changes nothing (in memory and on disk); a failing write (a real "disk full" from
  SQLite's ``max_page_count``) leaves memory and file as before the change.
* Foreign, corrupt and newer-schema files are refused and never modified.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

from agent.engine import RDF_TYPE, Reasoner
from agent.engine.errors import ParseError, StratificationError, UnsafeRuleError
from agent.engine.language import Literal, Program
from agent.engine.program.parser import parse_program
from agent.engine.storage.store import is_unread
from agent.state import migrations as state_migrations
from agent.state import packing as derived_rows
from agent.state.agent_state import SCHEMA_VERSION, AgentState, StateError, StreamVersion
from agent.state.packing import chunk_of, unpack
from agent.state.saved_rules import row_checksum
from agent.state.schema import OUTBOX_VERSION, WINDOWS_VERSION
from agent.state.term_rows import TERMS_PER_CHUNK
from tests.support.old_states import (
    derived_by_prefix,
    derived_per_fact,
    facts_per_claim,
    rules_without_checksums,
    rules_without_forms,
    terms_per_row,
    without_history,
    without_outbox,
    without_windows,
)
from tests.support.strategies import closure_pools, incremental_programs, pool_facts

STEP_SETTINGS = settings(
    max_examples=max(1, settings.default.max_examples // 2),
    deadline=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.function_scoped_fixture,
    ],
)


def scratch(rules, facts) -> set[tuple]:
    reasoner = Reasoner()
    reasoner.update(add_rules=Program(rules=tuple(rules)), add_facts=list(facts))
    return set(reasoner.facts())


def as_triple(fact: tuple) -> tuple:
    """A unary fact ``(C, x)`` is reported by the engine as ``(rdf:type, x, C)``."""
    return (RDF_TYPE, fact[1], fact[0]) if len(fact) == 2 else fact


def check_reopen(path: Path, rules: dict, facts: set) -> AgentState:
    """Reopen the file; the loaded state must equal a from-scratch materialisation."""
    state = AgentState(path)
    assert state.load_report.how == "loaded"
    assert {name: str(rule) for name, rule in state.reasoner.rules.items()} == {
        name: str(rule) for name, rule in rules.items()
    }
    assert set(state.reasoner.edb_facts()) == {as_triple(f) for f in facts}
    assert set(state.reasoner.facts()) == scratch(rules.values(), facts)
    return state


def rewrite(path: Path, *statements: str) -> None:
    """Change a closed state file behind the agent's back, in one transaction."""
    conn = sqlite3.connect(path)
    with conn:
        for statement in statements:
            conn.execute(statement)
    conn.close()


def model_after(change: dict, rules: dict, facts: set) -> set:
    """The model's side of ``AgentState.apply(**change)``: ``rules`` (name -> rule) updated in
    place, the explicit facts after the change returned."""
    for name in change.get("delete_rules", ()):
        del rules[name]
    for rule in change.get("add_rules", ()):
        rules[rule.id] = rule
    return (facts - set(change.get("delete_facts", ()))) | set(change.get("add_facts", ()))


@pytest.mark.parametrize("pools", ["incremental", "closure"])
@STEP_SETTINGS
@given(data=st.data())
def test_random_changes_survive_reopen(tmp_path_factory, monkeypatch, pools, data):
    """Random rule and fact changes committed, the file closed and reopened after each: the
    loaded state equals a from-scratch materialisation. Half the examples save chunks of 2
    subjects, so a relation spans many rows (the farm's data needs thousands of terms for
    that) and updates rewrite one chunk among several."""
    chunk_bits = data.draw(st.sampled_from([derived_rows.CHUNK_BITS, 1]), label="chunk bits")
    monkeypatch.setattr(derived_rows, "CHUNK_BITS", chunk_bits)
    path = tmp_path_factory.mktemp("state") / "agent.db"
    pool = data.draw(incremental_programs() if pools == "incremental" else closure_pools())
    # Rules reach the agent as text: use the parsed form (hand-built ``_`` variables differ).
    pool = Program(rules=tuple(parse_program(str(rule)).rules[0] for rule in pool.rules))
    rules: dict = {}
    facts: set = set()
    state = AgentState(path)
    for step in range(8):
        kind = data.draw(
            st.sampled_from(["add_facts", "delete_facts", "add_rules", "delete_rules", "mixed"])
        )
        add_rules = [r for r in pool.rules if r.id not in rules and data.draw(st.booleans())]
        delete_rules = [rid for rid in rules if data.draw(st.booleans())]
        new_facts = data.draw(st.lists(pool_facts(pool), max_size=8))
        gone_facts = [f for f in sorted(facts, key=repr) if data.draw(st.booleans())]
        change: dict = {}
        if kind in ("add_rules", "mixed"):
            change["add_rules"] = add_rules
        if kind in ("delete_rules", "mixed"):
            change["delete_rules"] = delete_rules
        if kind in ("add_facts", "mixed"):
            change["add_facts"] = new_facts
        if kind in ("delete_facts", "mixed"):
            change["delete_facts"] = gone_facts
        note(f"step {step}: {kind} {change}")
        state.apply(**change)
        facts = model_after(change, rules, facts)
        state.close()
        state = check_reopen(path, rules, facts)
    state.close()


RS = """
r1: anc(X, Y) :- parent(X, Y) .
r2: anc(X, Z) :- anc(X, Y), parent(Y, Z) .
r3: kids(X, N) :- aggregate(parent(X, Y)) on X with count(Y) as N .
"""


TERMS_OF_EVERY_KIND = [
    "http://ex/a",
    "http://ex/é\u2028",
    7,
    2**80,
    -(2**70),
    -3,
    2.5,
    1e300,
    -0.125,
    True,
    False,
    Literal("hi", language="en"),
    Literal("x", datatype="http://ex/dt"),
    Literal("plain"),
    Literal('quote " and \\ backslash\nnewline'),
]


def typed(values) -> list[tuple[str, str]]:
    """Values told apart by type too (``True == 1`` and ``1 == 1.0`` in a set)."""
    return [(type(value).__name__, repr(value)) for value in values]


def test_terms_of_every_kind_round_trip(tmp_path):
    path = tmp_path / "a.db"
    with AgentState(path) as state:
        state.apply(add_facts=[("v", "s", value) for value in TERMS_OF_EVERY_KIND])
        expected = set(state.reasoner.facts())
        terms = typed(state.reasoner.terms.values)
    with AgentState(path) as state:
        assert set(state.reasoner.facts()) == expected
        assert sorted(typed(f[2] for f in state.reasoner.facts("v"))) == sorted(
            typed(TERMS_OF_EVERY_KIND)
        )
        assert typed(state.reasoner.terms.values) == terms


def test_terms_are_saved_by_chunks_across_commits(tmp_path):
    """Terms are packed by chunks of ids (agent/state/term_rows.py): a commit adding terms rewrites
    the last chunk when partly filled and adds new ones; every reopening gives each term its
    id again, whatever the chunk boundaries the commits crossed."""
    path = tmp_path / "a.db"
    batches = [1, TERMS_PER_CHUNK - 3, 1, 2, 1, 2 * TERMS_PER_CHUNK + 5, TERMS_PER_CHUNK, 7]
    number = 0
    for size in batches:
        with AgentState(path) as state:
            facts = [("v", f"s{number + i}", (number + i) * 0.5) for i in range(size)]
            state.apply(add_facts=facts)
            number += size
            terms = typed(state.reasoner.terms.values)
        with AgentState(path) as state:
            assert typed(state.reasoner.terms.values) == terms
            counts = [count for (count,) in state.conn.execute("SELECT count FROM terms")]
            assert sum(counts) == len(terms)
            assert all(count == TERMS_PER_CHUNK for count in counts[:-1])
            assert state.check_integrity() == []


def test_rules_streams_and_versions_are_saved(tmp_path):
    path = tmp_path / "a.db"
    with AgentState(path) as state:
        state.apply(
            add_rules=RS, source="base", bundle_id="b1", version=StreamVersion("base", 1, "b1")
        )
        state.apply(add_facts=[("parent", "a", "b")], source="telemetry")
        state.apply(
            add_facts=[("parent", "b", "c")],
            source="base",
            bundle_id="b2",
            version=StreamVersion("base", 2, "b2"),
        )
    with AgentState(path) as state:
        assert state.applied_versions() == {"base": 2}
        assert state.rules_of_stream("base") == ["r1", "r2", "r3"]
        assert state.facts_of_source("telemetry") == [("parent", "a", "b")]
        assert state.reasoner.query("kids(X, N)") == [{"X": "a", "N": 1}, {"X": "b", "N": 1}]
        # A restored aggregate node is maintained correctly from the loaded state.
        state.apply(add_facts=[("parent", "a", "z")])
        assert sorted(state.reasoner.query("kids(a, N)"), key=str) == [{"N": 2}]


def file_state(path: Path) -> set:
    with AgentState(path) as state:
        return set(state.reasoner.facts()) | {("rule", r) for r in state.reasoner.rules}


def test_bad_input_changes_nothing(tmp_path):
    path = tmp_path / "a.db"
    state = AgentState(path)
    state.apply(add_rules=RS, add_facts=[("parent", "a", "b")])
    before = set(state.reasoner.facts())
    with pytest.raises(ParseError):
        state.apply(add_rules="p(X :- q(X) .", add_facts=[("parent", "x", "y")])
    with pytest.raises(StratificationError):
        state.apply(add_rules="r9: parent(X, Y) :- person(X), person(Y), not anc(X, Y) .")
    assert set(state.reasoner.facts()) == before
    state.close()
    assert file_state(path) == before | {("rule", r) for r in ("r1", "r2", "r3")}


def test_failed_write_rolls_memory_back(tmp_path):
    """A real SQLite 'database or disk is full': memory and file keep the state before."""
    path = tmp_path / "a.db"
    state = AgentState(path)
    state.apply(add_rules=RS, add_facts=[("parent", f"n{i}", f"n{i + 1}") for i in range(20)])
    before = set(state.reasoner.facts())
    pages = state.conn.execute("PRAGMA page_count").fetchone()[0]
    state.conn.execute(f"PRAGMA max_page_count={pages + 1}")
    with pytest.raises(StateError, match="could not save"):
        state.apply(add_facts=[("parent", f"m{i}", f"m{i + 1}") for i in range(400)])
    assert set(state.reasoner.facts()) == before
    state.conn.execute("PRAGMA max_page_count=1073741823")
    state.apply(add_facts=[("parent", "n20", "n21")])  # and the state goes on working
    after = set(state.reasoner.facts())
    assert ("anc", "n0", "n21") in after
    state.close()
    assert file_state(path) - {("rule", r) for r in ("r1", "r2", "r3")} == after


def test_a_failed_write_after_an_integrity_check_rolls_back_to_the_file(tmp_path):
    """The integrity check of a running state reads the terms, relations and rules; only a
    load right after it may use them. A change committed after the check, then a failed
    write: memory is rebuilt from the file as it is now, the committed change included."""
    path = tmp_path / "a.db"
    state = AgentState(path)
    state.apply(add_rules=RS, add_facts=[("parent", "n0", "n1")])
    assert state.check_integrity() == []
    state.apply(
        add_rules="r4: <kin>(X, Y) :- anc(X, Y) .",
        add_facts=[("parent", f"n{i}", f"n{i + 1}") for i in range(1, 20)],
    )
    before = set(state.reasoner.facts())
    assert ("kin", "n0", "n20") in before
    pages = state.conn.execute("PRAGMA page_count").fetchone()[0]
    state.conn.execute(f"PRAGMA max_page_count={pages + 1}")
    with pytest.raises(StateError, match="could not save"):
        state.apply(add_facts=[("parent", f"m{i}", f"m{i + 1}") for i in range(400)])
    assert set(state.reasoner.facts()) == before
    assert set(state.reasoner.rules) == {"r1", "r2", "r3", "r4"}
    state.close()


def test_foreign_sqlite_file_is_refused_untouched(tmp_path):
    path = tmp_path / "other.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE customers (id INTEGER)")
    conn.commit()
    conn.close()
    content = path.read_bytes()
    with pytest.raises(StateError, match="not a zodiac-edge agent state"):
        AgentState(path)
    assert path.read_bytes() == content


@pytest.mark.parametrize("content", [b"hello, this is not a database" * 100, bytes(range(256)) * 8])
def test_garbage_file_is_refused_untouched(tmp_path, content):
    path = tmp_path / "garbage.db"
    path.write_bytes(content)
    with pytest.raises(StateError):
        AgentState(path)
    assert path.read_bytes() == content


def test_corrupt_state_file_is_refused(tmp_path):
    path = tmp_path / "a.db"
    with AgentState(path) as state:
        state.apply(add_rules=RS, add_facts=[("parent", f"n{i}", f"n{i + 1}") for i in range(300)])
        state.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    raw = bytearray(path.read_bytes())
    for offset in range(4096 + 100, len(raw), 4096):  # scribble over every page but the first
        raw[offset : offset + 64] = b"\xff" * 64
    path.write_bytes(bytes(raw))
    with pytest.raises(StateError):
        AgentState(path)


def test_newer_schema_is_refused(tmp_path):
    path = tmp_path / "a.db"
    with AgentState(path) as state:
        state.set_meta("schema_version", "99")
    with pytest.raises(StateError, match="schema version 99"):
        AgentState(path)


WIDE = """
reach(X, Y) :- link(X, Y) .
reach(X, Z) :- reach(X, Y), link(Y, Z) .
hub(X) :- link(X, Y), link(X, Z), Y != Z .
via(X, Y, Z) :- link(X, Y), link(Y, Z) .
loop4(X, Y, Z, X) :- via(X, Y, Z), link(Z, X) .
"""
WIDE_FACTS = [("link", f"n{i}", f"n{(i * 7 + k) % 40}") for i in range(40) for k in (1, 3)]


def test_derived_facts_are_saved_by_prefix_in_chunks(tmp_path):
    """Derived facts of every arity are saved per (hyper-node, relation, all columns but the
    last), the last column as a bitmap, and the prefixes packed into one row per chunk of
    subjects (agent/state/packing.py); the summary counts facts, not rows."""
    path = tmp_path / "a.db"
    with AgentState(path) as state:
        state.apply(add_rules=WIDE, add_facts=WIDE_FACTS)
        derived = sum(node.size() for node in state.reasoner.view().nodes)
        saved_facts = {
            (node.name, key, fact)
            for node in state.reasoner.view().nodes
            for key, relation in node.store.relations.items()
            for fact in relation.tuples
        }
        chunks = {(name, key, chunk_of(fact[:-1])) for name, key, fact in saved_facts}
        expected = set(state.reasoner.facts())
        assert state.summary()["derived_facts"] == derived
        names = dict(state.conn.execute("SELECT id, name FROM nodes"))
        relations = {
            rid: (name, arity)
            for rid, name, arity in state.conn.execute("SELECT id, name, arity FROM relations")
        }
        rows = state.conn.execute("SELECT node, rel, chunk, packed FROM derived").fetchall()
        assert {(names[n], relations[r], c) for n, r, c, _ in rows} == chunks
        assert len(rows) == len(chunks) < len(saved_facts) / 10
        assert {
            (names[n], relations[r], prefix + (last,))
            for n, r, _, blob in rows
            for prefix, objects in unpack(blob).items()
            for last in objects
        } == saved_facts
    with AgentState(path) as state:
        assert state.load_report.how == "loaded"
        assert set(state.reasoner.facts()) == expected


def test_reading_a_restored_state_keeps_its_relations_on_bitmaps(tmp_path):
    """After a restart, derived binary relations hold the saved bitmaps, not even read until
    their first use. Reading through the
    public API (facts, count, stats, query, with and without a subject) answers as a fresh
    reasoner does, and builds no tuples and no Python sets for a relation one store holds."""
    path = tmp_path / "a.db"
    with AgentState(path) as state:
        state.apply(add_rules=WIDE, add_facts=WIDE_FACTS)
    fresh = Reasoner()
    fresh.add_rules(WIDE)
    fresh.add_facts(WIDE_FACTS)
    with AgentState(path) as state:
        reasoner = state.reasoner
        binary = [
            relation
            for node in reasoner.view().nodes
            for key, relation in node.store.relations.items()
            if key[1] == 2
        ]  # (read by their first use: until then the saved bitmaps are not even deserialised)
        assert binary and all(is_unread(relation) for relation in binary)
        reach = next(relation for relation in binary if relation.key == ("reach", 2))
        assert not reach.rows_built
        holders = reasoner.view().holders(("reach", 2))  # the closure and its base rule's node
        assert len(holders) == 2 and set(holders[0]) & set(holders[1])  # (overlapping)
        assert set(reasoner.facts()) == set(fresh.facts())
        assert reasoner.count() == fresh.count()
        assert reasoner.stats()["predicates"] == fresh.stats()["predicates"]
        for subject in ["n0", "n7", "x", "n39"]:
            pattern = f"<reach>(<{subject}>, Y)"
            got, wanted = reasoner.query(pattern), fresh.query(pattern)
            assert sorted(map(repr, got)) == sorted(map(repr, wanted))
        assert sorted(map(repr, reasoner.query("<reach>(X, <n3>)"))) == sorted(
            map(repr, fresh.query("<reach>(X, <n3>)"))
        )
        assert not reach.rows_built  # nothing above built its tuples
        buckets = reach.existing_index((0,))
        assert buckets and all(b.__class__ is not set for b in buckets.values())


FARM = """
r1: near(X, Y) :- near(Y, X) .
r2: near(X, Y) :- near(X, Z), near(Z, Y), COMP(X, !=, Y) .
r3: count(X, N) :- aggregate(near(X, Y) and temp(Y, T)) on X with count(T) as N .
r4: median(X, M) :- aggregate(near(X, Y) and temp(Y, T)) on X with med(T) as M .
r5: hot(X, M) :- aggregate(near(X, Y) and temp(Y, T)) on X with max(T) as M and M > 20 .
r6: odd(X) :- median(X, M), temp(X, T), bind(abs(T - M) as D), COMP(D, >, 5) .
"""
FARM_FACTS = (
    [("near", f"t{i}", f"t{i + 1}") for i in range(7)]
    + [("temp", f"t{i}", 10 + i) for i in range(8)]
    + [("near", "u0", "u1"), ("temp", "u0", 3), ("temp", "u1", 4)]
)


def test_a_restored_aggregate_reads_its_groups_back_from_the_saved_rows(tmp_path):
    """After a restart, an aggregate whose head is its row (count, median) rebuilds its group
    bookkeeping from the saved rows and partitions its groups again: its first change reads
    only the groups that change can reach, as a running agent's does, instead of computing
    every group again. One whose head is not its row (a comparison follows) recomputes.
    Either way every change gives what a fresh reasoner gives."""
    path = tmp_path / "a.db"
    with AgentState(path) as state:
        state.apply(add_rules=FARM, add_facts=FARM_FACTS)
    facts = list(FARM_FACTS)
    changes = [
        ([("temp", "t3", 13)], [("temp", "t3", 40)]),  # a reading: every t-neighbourhood
        ([("near", "u0", "u1")], []),  # a farm of two splits: their groups go
        ([], [("near", "t7", "u0"), ("temp", "v", 1)]),  # the two farms join
    ]
    for step, (deleted, added) in enumerate(changes):
        facts = [f for f in facts if f not in deleted] + added
        with AgentState(path) as state:
            state.apply(delete_facts=deleted, add_facts=added)
            report = state.reasoner.stats()["last_update"]["hyper_nodes"]
            strategies = {
                rule.id: report[node.name]["strategy"]
                for node in state.reasoner.nodes
                for rule in node.logical.rules
                if node.name in report
            }
            fresh = Reasoner()
            fresh.add_rules(FARM)
            fresh.add_facts(facts)
            assert set(state.reasoner.facts()) == set(fresh.facts()), step
        assert strategies["r3"] == strategies["r4"] == "groups (partition kept)", step
        assert strategies["r5"] == "recompute (group state not restored)", step


@pytest.mark.parametrize("version", [3, 5])
def test_an_older_state_file_is_migrated_without_recomputing(tmp_path, version):
    """Version 3 saved a row per derived fact, versions 4 and 5 a row per (hyper-node,
    relation, prefix); the upgrade regroups the rows into chunks (copying the bitmaps of
    version 5), so the first start after it loads the saved materialisation instead of
    recomputing it, and later updates change the new rows."""
    path = tmp_path / "a.db"
    with AgentState(path) as state:
        state.apply(add_rules=WIDE, add_facts=WIDE_FACTS)
        expected = set(state.reasoner.facts())
        chunks = state.conn.execute("SELECT count(*) FROM derived").fetchone()[0]
        saved = state.reasoner
    conn = sqlite3.connect(path)
    with conn:
        if version == 3:
            written = derived_per_fact(conn, saved)
            assert written == sum(node.size() for node in saved.view().nodes)
        else:
            assert derived_by_prefix(conn) > 10 * chunks
        facts_per_claim(conn)
        rules_without_forms(conn)
        terms_per_row(conn)
        conn.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(version),))
    conn.close()
    with AgentState(path) as state:
        assert state.get_meta("schema_version") == str(SCHEMA_VERSION)
        assert state.load_report.how == "loaded"
        assert set(state.reasoner.facts()) == expected
        assert state.conn.execute("SELECT count(*) FROM derived").fetchone()[0] == chunks
        state.apply(delete_facts=WIDE_FACTS[:10], add_facts=[("link", "n0", "x")])
        expected = set(state.reasoner.facts())
        remaining = [*WIDE_FACTS[10:], ("link", "n0", "x")]
        assert expected == scratch(parse_program(WIDE).rules, remaining)
    with AgentState(path) as state:
        assert state.load_report.how == "loaded"
        assert set(state.reasoner.facts()) == expected


def test_a_restart_reads_the_rules_saved_forms_without_parsing(tmp_path, monkeypatch):
    """Rules are saved with their syntax tree (agent/engine/program/rule_form.py); a restart builds
    them from it: no rule text is parsed, and the rules are those that were saved."""
    path = tmp_path / "a.db"
    with AgentState(path) as state:
        state.apply(add_rules=RS + WIDE, add_facts=[("parent", "a", "b"), *WIDE_FACTS])
        saved = {name: str(rule) for name, rule in state.reasoner.rules.items()}
        expected = set(state.reasoner.facts())

    def no_parsing(*args, **kwargs):
        raise AssertionError("a saved rule was parsed")

    monkeypatch.setattr("agent.state.saved_rules.parse_program", no_parsing)
    with AgentState(path) as state:
        assert state.load_report.how == "loaded"
        assert {name: str(rule) for name, rule in state.reasoner.rules.items()} == saved
        assert set(state.reasoner.facts()) == expected


def test_a_restart_takes_the_rules_its_checksums_vouch_for(tmp_path, monkeypatch):
    """Since version 10 each rule row has a checksum of its columns: a restart takes each
    rule as it was validated and keyed when saved (neither validated nor keyed again: most
    of what reading a program of thousands of rules back cost), the same rules."""
    path = tmp_path / "a.db"
    with AgentState(path) as state:
        state.apply(add_rules=RS + WIDE, add_facts=[("parent", "a", "b"), *WIDE_FACTS])
        saved = {name: (str(rule), rule.key) for name, rule in state.reasoner.rules.items()}
        expected = set(state.reasoner.facts())

    def not_again(*args, **kwargs):
        raise AssertionError("a saved rule was validated or keyed again")

    monkeypatch.setattr("agent.state.saved_rules.check_rule", not_again)
    monkeypatch.setattr("agent.engine.language.canonical_rule", not_again)
    with AgentState(path) as state:
        assert state.load_report.how == "loaded"
        rules = state.reasoner.rules
        assert {name: (str(rule), rule.key) for name, rule in rules.items()} == saved
        assert set(state.reasoner.facts()) == expected


@pytest.mark.parametrize(
    "damage",
    [
        "UPDATE rules SET text = 'r3: kids(X, N) :- parent(X, N) .' WHERE name = 'r3'",
        "UPDATE rules SET stream = 'elsewhere' WHERE name = 'r3'",
        "UPDATE rules SET bundle_id = 'b9' WHERE name = 'r3'",
        "UPDATE rules SET position = position + 10 WHERE name = 'r3'",
        "UPDATE rules SET key = 'h000000000000' WHERE name = 'r3'",
        "UPDATE rules SET form = replace(form, '\"count\"', '\"sum\"') WHERE name = 'r3'",
        "UPDATE rules SET crc = crc + 1 WHERE name = 'r3'",
    ],
    ids=["text", "stream", "bundle", "position", "key", "form", "checksum"],
)
def test_a_rule_row_that_does_not_match_its_checksum_is_refused(tmp_path, damage):
    path = tmp_path / "a.db"
    with AgentState(path) as state:
        state.apply(add_rules=RS, add_facts=[("parent", "a", "b")], bundle_id="b1")
    rewrite(path, damage)
    before = path.read_bytes()
    with AgentState(path, load=False) as state:  # a health check names the rule
        assert any("saved rule r3 is damaged" in problem for problem in state.check_integrity())
    with pytest.raises(StateError, match="saved rule r3 is damaged"):
        AgentState(path)
    assert path.read_bytes() == before


def test_a_rule_made_unsafe_under_a_forged_checksum_fails_its_first_update_unchanged(tmp_path):
    """The trust model of version 10: the checksums catch damage, not a forger who writes a
    consistent one. A rule made unsafe that way loads; it is validated before its first
    compilation, so the first update that evaluates it fails, naming it, and changes
    nothing, in memory or in the file."""
    path = tmp_path / "a.db"
    with AgentState(path) as state:
        state.apply(add_rules="q: q(X) :- p(X, Y) .", add_facts=[("p", "a", "b")])
        expected = set(state.reasoner.facts())
    rewrite(path, """UPDATE rules SET form = replace(form, '["V","X"]]]', '["V","Z"]]]')""")
    conn = sqlite3.connect(path)
    with conn:
        for row in conn.execute(
            "SELECT name, key, text, stream, bundle_id, position, form FROM rules"
        ).fetchall():
            conn.execute("UPDATE rules SET crc = ? WHERE name = ?", (row_checksum(*row), row[0]))
    conn.close()
    with AgentState(path) as state:
        assert set(state.reasoner.facts()) == expected
        with pytest.raises(UnsafeRuleError, match="saved rule q: unsafe rule: variable Z"):
            state.apply(add_facts=[("p", "c", "d")])
        assert set(state.reasoner.facts()) == expected
    with AgentState(path) as state:
        assert set(state.reasoner.facts()) == expected


def test_a_version_9_file_gets_its_rule_checksums(tmp_path):
    """Version 9 saved rules without checksums: the upgrade reads every rule back and checks
    it as version 9 did at every start, then gives each row its checksum; a file whose rule
    reads back as another rule than the one saved is refused and left as it was."""
    path = tmp_path / "a.db"
    with AgentState(path) as state:
        state.apply(add_rules=RS + WIDE, add_facts=[("parent", "a", "b"), *WIDE_FACTS])
        checksums = dict(state.conn.execute("SELECT name, crc FROM rules"))
        expected = set(state.reasoner.facts())
    conn = sqlite3.connect(path)
    with conn:
        rules_without_checksums(conn)
        conn.execute("UPDATE meta SET value = '9' WHERE key = 'schema_version'")
    conn.close()
    copy = tmp_path / "b.db"
    copy.write_bytes(path.read_bytes())
    with opened_after_upgrade(path) as state:
        assert dict(state.conn.execute("SELECT name, crc FROM rules")) == checksums
        assert set(state.reasoner.facts()) == expected
    rewrite(  # r1's form made r2's: a valid rule, which only its saved content key tells
        copy,
        "UPDATE rules SET form = (SELECT replace(form, '\"r2\"', '\"r1\"') FROM rules "
        "WHERE name = 'r2') WHERE name = 'r1'",
    )
    before = copy.read_bytes()
    with pytest.raises(StateError, match="saved rule r1 is damaged"):
        AgentState(copy)
    assert copy.read_bytes() == before


def test_a_version_10_file_gets_its_outbox(tmp_path):
    """Version 10 had no event outbox: the upgrade adds it empty, and the next change with a
    watch writes its first event (seq 1) in the change's transaction."""
    path = tmp_path / "a.db"
    with AgentState(path) as state:
        state.apply(add_rules=RS, add_facts=[("parent", "a", "b")])
        expected = set(state.reasoner.facts())
    conn = sqlite3.connect(path)
    with conn:
        without_outbox(conn)
        conn.execute(
            "UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(OUTBOX_VERSION - 1),)
        )
    conn.close()
    with opened_after_upgrade(path) as state:
        assert set(state.reasoner.facts()) == expected
        assert state.conn.execute("SELECT count(*) FROM outbox").fetchone() == (0,)
        state.set_watches("local", ["<parent>(X, Y)"])
        (seq,) = state.conn.execute("SELECT seq FROM outbox").fetchone()
        assert seq == 1


def test_a_version_12_file_gets_its_stream_history(tmp_path):
    """Version 12 kept no stream history: the upgrade adds it empty, the versions applied
    before cannot be reverted to, and the next bundle's version is kept in its transaction."""
    path = tmp_path / "a.db"
    with AgentState(path) as state:
        state.apply(
            add_rules=RS,
            add_facts=[("parent", "a", "b")],
            source="base",
            version=StreamVersion("base", 1, "b1"),
        )
        expected = set(state.reasoner.facts())
    conn = sqlite3.connect(path)
    with conn:
        without_history(conn)
        conn.execute(
            "UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(WINDOWS_VERSION),)
        )
    conn.close()
    with opened_after_upgrade(path) as state:
        assert set(state.reasoner.facts()) == expected
        assert state.kept_versions("base") == []
        state.apply(
            add_facts=[("parent", "b", "c")], source="base", version=StreamVersion("base", 2, "b2")
        )
        assert state.kept_versions("base") == [2]
        saved = state.saved_version("base", 2)
        assert sorted(map(tuple, saved.facts)) == [("parent", "a", "b"), ("parent", "b", "c")]
        assert [name for name, _ in saved.rules] == [r.id for r in parse_program(RS).rules]


def opened_after_upgrade(path: Path) -> AgentState:
    """The state of an older version's file at ``path``: a health check reads it as it is and
    finds nothing wrong, and opening it upgrades it and loads what it saved, not recomputing."""
    with AgentState(path, load=False) as state:
        assert state.check_integrity() == []
    state = AgentState(path)
    assert state.get_meta("schema_version") == str(SCHEMA_VERSION)
    assert state.load_report.how == "loaded"
    return state


def test_a_version_6_file_gets_its_rules_forms(tmp_path):
    """Version 6 saved rules as text only: the upgrade gives each its form (from its text),
    the first start after it loads without recomputing, and the next reads the forms. A
    text that no longer parses gets no form, so the integrity check reports that rule."""
    path = tmp_path / "a.db"
    with AgentState(path) as state:
        state.apply(add_rules=RS, add_facts=[("parent", "a", "b"), ("parent", "b", "c")])
        forms = dict(state.conn.execute("SELECT name, form FROM rules"))
        expected = set(state.reasoner.facts())
    conn = sqlite3.connect(path)
    with conn:
        facts_per_claim(conn)
        rules_without_forms(conn)
        terms_per_row(conn)
        conn.execute("UPDATE meta SET value = '6' WHERE key = 'schema_version'")
    conn.close()
    with opened_after_upgrade(path) as state:
        assert set(state.reasoner.facts()) == expected
        assert dict(state.conn.execute("SELECT name, form FROM rules")) == forms
    conn = sqlite3.connect(path)
    with conn:
        facts_per_claim(conn)
        rules_without_forms(conn)
        terms_per_row(conn)
        conn.execute("UPDATE rules SET text = 'r3: kids(X :- .' WHERE name = 'r3'")
        conn.execute("UPDATE meta SET value = '6' WHERE key = 'schema_version'")
    conn.close()
    with pytest.raises(StateError, match="saved rule r3 is damaged"):
        AgentState(path)


@pytest.mark.parametrize("table", ["derived", "explicit"])
@pytest.mark.parametrize(
    "damage",
    [
        "UPDATE {table} SET packed = x'00ff00ff' WHERE rowid = (SELECT min(rowid) FROM {table})",
        "UPDATE {table} SET packed = packed || x'00' "
        "WHERE rowid = (SELECT min(rowid) FROM {table})",
        "UPDATE {table} SET size = size + 1",
        "UPDATE {table} SET high = high - 1",
        "UPDATE {table} SET high = 1000000",
        "UPDATE {table} SET top = 1000000",
    ],
    ids=[
        "garbage bitmap",
        "a byte more",
        "wrong size",
        "wrong largest id",
        "missing term",
        "missing subject",
    ],
)
def test_a_damaged_row_of_packed_facts_is_refused(tmp_path, table, damage):
    """Derived facts, and since version 8 explicit ones, are packed with counts and a checksum
    (agent/state/chunk_tables.py): a row that does not match them is refused at the start, and a
    health check reports it."""
    path = tmp_path / "a.db"
    with AgentState(path) as state:
        state.apply(add_rules=WIDE, add_facts=WIDE_FACTS)
    rewrite(path, damage.format(table=table))
    with AgentState(path, load=False) as state:
        assert state.check_integrity()
    with pytest.raises(StateError, match="damaged agent state"):
        AgentState(path)


@pytest.mark.parametrize("table", ["derived", "explicit"])
def test_a_row_damaged_while_the_agent_runs_is_refused_at_its_next_write(tmp_path, table):
    """A write reads the chunk it changes, and a change's plan the claims on its facts: a row
    that no longer matches its checksum is not rewritten with a fresh one (which would make
    the damage look sound), the change is refused as a damaged state, and so is every later
    one (memory may hold what the file could not take); opening the file again refuses it
    too."""
    path = tmp_path / "a.db"
    state = AgentState(path)
    state.apply(add_rules=RS, add_facts=[("parent", "a", "b"), ("parent", "b", "c")])
    rewrite(path, f"UPDATE {table} SET size = size + 1")
    with pytest.raises(StateError, match="damaged agent state"):
        state.apply(add_facts=[("parent", "c", "a")])
    if table == "explicit":  # (found by the claims read for the plan: nothing changed)
        assert ("parent", "c", "a") not in set(state.reasoner.facts())
    with pytest.raises(StateError, match="damaged agent state"):
        state.apply(add_facts=[("unrelated", "x", "y")])
    state.close()
    with pytest.raises(StateError, match="damaged agent state"):
        AgentState(path)


@pytest.mark.parametrize("version", [3, 5, 7, 8, 9, 10, 11, 12])
def test_a_migration_that_fails_half_way_leaves_the_old_version(tmp_path, monkeypatch, version):
    """An upgrade is one transaction: when it stops half way (a crash, a full disk), the file
    is the old version as it was, and the next start upgrades it. (Schema changes count:
    SQLite's DDL is transactional, but Python's sqlite3 began no transaction before one, and
    ``executescript`` commits whatever is pending first.)"""
    path = tmp_path / "a.db"
    with AgentState(path) as state:
        state.apply(add_rules=WIDE, add_facts=WIDE_FACTS)
        expected = set(state.reasoner.facts())
        saved = state.reasoner
    conn = sqlite3.connect(path)
    with conn:
        if version < 8:
            facts_per_claim(conn)
        if version < 9:
            terms_per_row(conn)
        if version < 7:
            rules_without_forms(conn)
        elif version < 10:
            rules_without_checksums(conn)
        elif version < 11:
            without_outbox(conn)
        elif version < 12:
            without_windows(conn)  # (drops the history too)
        else:
            without_history(conn)
        if version == 3:
            derived_per_fact(conn, saved)
        elif version == 5:
            derived_by_prefix(conn)
        conn.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(version),))
    conn.close()
    tables = sorted(sqlite3.connect(path).execute("SELECT name, sql FROM sqlite_master"))

    last_step = state_migrations.MIGRATIONS[SCHEMA_VERSION - 1]

    def the_last_step_fails(conn):
        last_step(conn)
        raise OSError("no space left on device")

    monkeypatch.setitem(state_migrations.MIGRATIONS, SCHEMA_VERSION - 1, the_last_step_fails)
    with pytest.raises(OSError):
        AgentState(path)
    assert sorted(sqlite3.connect(path).execute("SELECT name, sql FROM sqlite_master")) == tables
    monkeypatch.undo()
    with AgentState(path) as state:
        assert state.get_meta("schema_version") == str(SCHEMA_VERSION)
        assert set(state.reasoner.facts()) == expected


def test_a_version_7_file_gets_its_explicit_facts_packed(tmp_path):
    """Version 7 saved a row per (explicit fact, source claiming it): the upgrade packs each
    source's facts (agent/state/explicit_rows.py), the first start after it loads without
    recomputing, and every claim is kept: a fact two sources claim stays until both let go."""
    path = tmp_path / "a.db"
    shared = ("parent", "a", "b")
    other_arities = [  # (packed with prefixes of no column, and of two)
        ("http://www.w3.org/1999/02/22-rdf-syntax-ns#type", "a", "Person"),
        ("between", "a", "b", "c"),
    ]
    with AgentState(path) as state:
        state.apply(add_rules=RS + WIDE, add_facts=[shared, *WIDE_FACTS], source="base")
        state.apply(add_facts=[shared, ("parent", "b", "c"), *other_arities], source="local")
        expected = set(state.reasoner.facts())
        claims = {s: sorted(state.facts_of_source(s)) for s in ("base", "local")}
    conn = sqlite3.connect(path)
    with conn:
        assert facts_per_claim(conn) == len(WIDE_FACTS) + 5
        terms_per_row(conn)
        rules_without_checksums(conn)
        conn.execute("UPDATE meta SET value = '7' WHERE key = 'schema_version'")
    conn.close()
    with AgentState(path, load=False) as state:  # a health check: read as it is
        assert state.check_integrity() == []
        assert state.summary()["explicit_facts"] == len(WIDE_FACTS) + 5
    with AgentState(path) as state:
        assert state.get_meta("schema_version") == str(SCHEMA_VERSION)
        assert state.load_report.how == "loaded"
        assert set(state.reasoner.facts()) == expected
        assert {s: sorted(state.facts_of_source(s)) for s in ("base", "local")} == claims
        assert state.summary()["explicit_facts"] == len(WIDE_FACTS) + 5
        state.apply(delete_facts=[shared], source="local")
        assert ("parent", "a", "b") in set(state.reasoner.edb_facts())  # base still claims it
        state.apply(delete_facts=[shared], source="base")
        assert ("parent", "a", "b") not in set(state.reasoner.edb_facts())
        expected = set(state.reasoner.facts())
    with AgentState(path) as state:
        assert state.load_report.how == "loaded"
        assert set(state.reasoner.facts()) == expected


def test_a_version_8_file_gets_its_terms_packed(tmp_path):
    """Version 8 saved a row per term, covered by running checksums: the upgrade checks them,
    packs the terms by chunks (agent/state/term_rows.py), each keeping its id, and the first start
    after it loads without recomputing. A health check reads the old file as it is."""
    path = tmp_path / "a.db"
    many = [("v", f"s{i}", i * 0.25) for i in range(TERMS_PER_CHUNK + 10)]
    with AgentState(path) as state:
        state.apply(add_rules=RS, add_facts=[("parent", "a", "b"), *many])
        state.apply(add_facts=[("v", "t", value) for value in TERMS_OF_EVERY_KIND])
        expected = set(state.reasoner.facts())
        terms = typed(state.reasoner.terms.values)
    conn = sqlite3.connect(path)
    with conn:
        assert terms_per_row(conn) == len(terms)
        rules_without_checksums(conn)
        conn.execute("UPDATE meta SET value = '8' WHERE key = 'schema_version'")
    conn.close()
    with opened_after_upgrade(path) as state:
        assert typed(state.reasoner.terms.values) == terms
        assert set(state.reasoner.facts()) == expected
        assert state.check_integrity() == []
        state.apply(add_facts=[("parent", "b", "new")])
        expected = set(state.reasoner.facts())
    with AgentState(path) as state:
        assert state.load_report.how == "loaded"
        assert set(state.reasoner.facts()) == expected


@pytest.mark.parametrize(
    "damage",
    [
        "UPDATE terms SET value = 'B' WHERE value = 'b'",
        "UPDATE terms SET kind = 'q' WHERE value = 'b'",
        "DELETE FROM terms WHERE value = 'b'",
    ],
    ids=["a term's text", "a term's kind", "a term gone"],
)
def test_a_version_8_file_with_damaged_terms_is_refused_and_left_as_it_was(tmp_path, damage):
    """Packing damaged terms would give them checksums that vouch for them: the upgrade
    checks them first, and refuses the file without changing a byte of it."""
    path = tmp_path / "a.db"
    with AgentState(path) as state:
        state.apply(add_rules=RS, add_facts=[("parent", "a", "b"), ("parent", "b", "c")])
    conn = sqlite3.connect(path)
    with conn:
        terms_per_row(conn)
        rules_without_checksums(conn)
        conn.execute("UPDATE meta SET value = '8' WHERE key = 'schema_version'")
    with conn:
        conn.execute(damage)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    before = path.read_bytes()
    with pytest.raises(StateError, match="damaged agent state: (the terms|term)"):
        AgentState(path)
    assert path.read_bytes() == before


def test_a_term_chunk_damaged_while_the_agent_runs_is_refused_at_its_next_write(tmp_path):
    """A commit that adds terms rewrites the last chunk of terms: one that no longer matches
    its checksum is not rewritten with a fresh one; the change is refused as a damaged state,
    and so is every later one."""
    path = tmp_path / "a.db"
    state = AgentState(path)
    state.apply(add_rules=RS, add_facts=[("parent", "a", "b")])
    rewrite(path, "UPDATE terms SET packed = CAST(replace(CAST(packed AS TEXT), 'a', 'A') AS BLOB)")
    with pytest.raises(StateError, match="damaged agent state"):
        state.apply(add_facts=[("parent", "b", "new")])
    with pytest.raises(StateError, match="damaged agent state"):
        state.apply(add_facts=[("unrelated", "x", "y")])
    state.close()
    with pytest.raises(StateError, match="term chunk 0 does not match its checksum"):
        AgentState(path)


@pytest.mark.parametrize(
    "damage",
    [
        # r1's form made r2's: a valid rule, so only its saved content key tells
        "UPDATE rules SET form = (SELECT replace(form, '\"r2\"', '\"r1\"') FROM rules "
        "WHERE name = 'r2') WHERE name = 'r1'",
        # a derived relation renamed: its saved facts are then a relation no rule derives
        "UPDATE relations SET name = 'kidz' WHERE name = 'kids'",
        # a term's text, an explicit relation's name: only the dictionaries' checksums tell
        "UPDATE terms SET packed = CAST(replace(CAST(packed AS TEXT), '\"b\"', '\"B\"') AS BLOB)",
        "UPDATE relations SET name = 'parenT' WHERE name = 'parent'",
        "UPDATE meta SET value = '{\"terms\": 1}' WHERE key = 'dictionary_checksums'",
    ],
    ids=[
        "a rule's form another rule's",
        "a derived relation renamed",
        "a term's text",
        "an explicit relation renamed",
        "the checksums' note",
    ],
)
def test_damage_sql_cannot_see_is_refused(tmp_path, damage):
    path = tmp_path / "a.db"
    with AgentState(path) as state:
        state.apply(add_rules=RS, add_facts=[("parent", "a", "b"), ("parent", "b", "c")])
    rewrite(path, damage)
    with pytest.raises(StateError, match="damaged agent state"):
        AgentState(path)


def test_a_file_without_dictionary_checksums_gets_them_at_its_first_load(tmp_path):
    """Files written before the relations' checksums existed (any schema version) are trusted
    as they are once, and checked from then on; the checksums follow every commit that adds
    relations, and a reopened state still matches them. (Terms have had a checksum per chunk
    since version 9, written with them.)"""
    path = tmp_path / "a.db"
    with AgentState(path) as state:
        state.apply(add_rules=RS, add_facts=[("parent", "a", "b")])
        state.conn.execute("DELETE FROM meta WHERE key = 'dictionary_checksums'")
        state.conn.commit()
    with AgentState(path) as state:
        assert state.get_meta("dictionary_checksums") is not None
        state.apply(add_facts=[("parent", "b", "c"), ("age", "c", 7)])  # new terms, relation
    with AgentState(path) as state:
        assert ("anc", "a", "c") in set(state.reasoner.facts())
    rewrite(path, "UPDATE relations SET name = 'agE' WHERE name = 'age'")
    with pytest.raises(StateError, match="the relations do not match their checksums"):
        AgentState(path)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(0, 2**20), st.integers(0, 255)), min_size=1, max_size=3))
def test_a_file_with_random_bytes_damaged_loads_or_is_refused(tmp_path_factory, damage):
    """Bytes of a real state file overwritten at random: opening it loads a state (the bytes
    were unused, or their damage is in content no check can see: a term's text, say) or
    refuses the file with StateError; never another exception, and a loaded state answers
    and takes an update. (Before, such files raised decoding errors, IndexError from a fact
    naming term -118, or loaded a relation short of the rows a damaged page hid.)"""
    path = tmp_path_factory.mktemp("damaged") / "a.db"
    with AgentState(path) as state:
        state.apply(add_rules=RS + WIDE, add_facts=[("parent", "a", "b"), *WIDE_FACTS[:30]])
        state.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    raw = bytearray(path.read_bytes())
    for offset, value in damage:
        raw[offset % len(raw)] = value
    path.write_bytes(bytes(raw))
    try:
        state = AgentState(path)
    except StateError:
        return
    with state:
        list(state.reasoner.facts())
        state.apply(add_facts=[("parent", "x", "y")])
        assert ("anc", "x", "y") in set(state.reasoner.facts())


def test_a_state_that_cannot_be_written_is_refused_at_the_start(tmp_path):
    """A file SQLite reads but will not write (here its header's write version says a newer
    SQLite, as one damaged byte can; file permissions and a read-only disk do the same) would
    load and then fail every change: it is refused when opened, and left as it is. (Found by
    the random-bytes test above: byte 18 set to 3.)"""
    path = tmp_path / "a.db"
    with AgentState(path) as state:
        state.apply(add_rules=RS, add_facts=[("parent", "a", "b")])
        state.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    raw = bytearray(path.read_bytes())
    raw[18] = 3
    path.write_bytes(bytes(raw))
    with pytest.raises(StateError, match="cannot be written"):
        AgentState(path)
    assert path.read_bytes() == bytes(raw)


@pytest.mark.parametrize(
    "damage",
    [
        "DELETE FROM nodes WHERE id = (SELECT MIN(id) FROM nodes)",
        "UPDATE nodes SET id = id + 100",  # derived rows of hyper-nodes the file does not have
        # the aggregate's hyper-node saved with facts of a relation none of its rules derives
        "UPDATE derived SET rel = (SELECT id FROM relations WHERE name = 'anc') "
        "WHERE rel = (SELECT id FROM relations WHERE name = 'kids')",
    ],
    ids=["a hyper-node row missing", "hyper-node rows renumbered", "a relation not derived"],
)
def test_missing_hyper_node_rows_are_recomputed(tmp_path, damage):
    """A state whose saved hyper-nodes do not match its rules is recomputed, not trusted (the
    derived facts follow from the rules and explicit facts, which are intact)."""
    path = tmp_path / "a.db"
    with AgentState(path) as state:
        state.apply(add_rules=RS, add_facts=[("parent", "a", "b"), ("parent", "b", "c")])
        expected = set(state.reasoner.facts())
        with state.conn:
            state.conn.execute(damage)
    with AgentState(path) as state:
        assert state.load_report.how.startswith("recomputed")
        assert set(state.reasoner.facts()) == expected
    with AgentState(path) as state:  # and the rewritten rows are complete again
        assert state.load_report.how == "loaded"
        assert set(state.reasoner.facts()) == expected


def test_missing_file_without_create(tmp_path):
    with pytest.raises(StateError, match="no agent state"):
        AgentState(tmp_path / "none.db", create=False)
    assert not (tmp_path / "none.db").exists()
