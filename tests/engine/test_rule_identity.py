"""A rule's identity is its content, not its label (``Rule.key`` against ``Rule.id``).

The cloud replaces a rule by deleting its label and adding a new body under the same label in
one bundle. Everything the engine keys by rule (hyper-nodes and their classification on
updates, compiled plans and every variant of them, the SQLite state) must therefore key by
content: these tests replay the three ways a label used as identity went wrong, through the
``Reasoner``, through ``AgentState`` with a restart, and through a signed bundle applied by the
agent, each time against a from-scratch evaluation and the reference evaluator.
"""

from __future__ import annotations

import sqlite3

import pytest

from agent.engine import Reasoner, UnknownRuleError
from agent.engine.errors import RuleError
from agent.engine.language import Atom, Negation, Program, Rule, Variable
from agent.engine.program import validation as validation_module
from agent.engine.program.parser import parse_program
from agent.protocol.messages import AddRules, DeleteRules, RuleSpec
from agent.state.agent_state import SCHEMA_VERSION, AgentState
from tests.agent.test_service import make_agent
from tests.support.old_states import derived_per_fact, facts_per_claim, terms_per_row
from tests.support.reference import evaluate, from_external


def scratch(text: str, facts: list[tuple]) -> set[tuple]:
    reasoner = Reasoner()
    reasoner.add_rules(text)
    reasoner.add_facts(facts)
    return set(reasoner.facts())


def reference(text: str, facts: list[tuple]) -> set[tuple]:
    return evaluate(parse_program(text), [from_external(f) for f in facts]).external()


# ------------------------------------------------------------------ 1. replacement in one update
def test_replacing_a_labelled_rule_in_one_update_evaluates_the_new_body():
    facts = [("e", "a", "b"), ("f", "c", "d")]
    reasoner = Reasoner()
    reasoner.add_rules("r1: t(X, Y) :- e(X, Y) .")
    reasoner.add_facts(facts)
    report = reasoner.update(delete_rules=["r1"], add_rules="r1: t(X, Y) :- f(X, Y) .")
    assert sorted(reasoner.facts("t")) == [("t", "c", "d")]
    assert set(reasoner.facts()) == scratch("r1: t(X, Y) :- f(X, Y) .", facts)
    assert report["rules_added"] == ["r1"] and report["rules_deleted"] == ["r1"]
    (node,) = report["hyper_nodes"].values()
    assert node["transition"] == "new"


def test_replacing_one_rule_of_a_recursive_hyper_node_keeps_the_others():
    before = "r1: t(X, Y) :- e(X, Y) .\nr2: t(X, Z) :- t(X, Y), e(Y, Z) ."
    after = "r1: t(X, Y) :- e(X, Y) .\nr2: t(X, Z) :- t(X, Y), t(Y, Z), X != Z ."
    facts = [("e", "a", "b"), ("e", "b", "c"), ("e", "c", "a")]
    reasoner = Reasoner()
    reasoner.add_rules(before)
    reasoner.add_facts(facts)
    assert ("t", "a", "a") in set(reasoner.facts())
    reasoner.update(delete_rules=["r2"], add_rules="r2: t(X, Z) :- t(X, Y), t(Y, Z), X != Z .")
    assert set(reasoner.facts()) == scratch(after, facts) == reference(after, facts)
    assert ("t", "a", "a") not in set(reasoner.facts())


def test_a_label_naming_another_body_is_refused_unless_deleted_in_the_same_update():
    reasoner = Reasoner()
    reasoner.add_rules("r1: t(X) :- e(X) .")
    reasoner.add_facts([("e", "a"), ("f", "b")])
    before = set(reasoner.facts())
    with pytest.raises(RuleError, match="already used by a different rule"):
        reasoner.add_rules("r1: t(X) :- f(X) .")
    assert set(reasoner.facts()) == before
    assert str(reasoner.rules["r1"]) == "r1: <t>(X) :- <e>(X) ."
    # The same content under the same label (other variable names) is the same rule.
    assert reasoner.add_rules("r1: t(Y) :- e(Y) .") == ["r1"]
    assert reasoner.stats()["last_update"]["operation"] == "no change"


# ------------------------------------------------------------------ 2. compiled plans
REUSE_CASES = [
    (
        "r1: g(C) :- aggregate( u(X, X) ) with sum(X) as C, C < 2.5 .",
        "r1: g(C) :- aggregate( u(X, Y) ) with med(Y) as C, C >= 1 .",
        [("u", "n2", -2)],
    ),
    (
        "r1: g(X, C) :- aggregate( u(X, Y) ) on X with count(Y) as C .",
        "r1: g(C) :- aggregate( u(X, Y), v(Y) ) with count(X) as C .",
        [("u", "a", "b"), ("v", "b")],
    ),
    (
        "r1: p(X) :- u(X, Y), not v(Y) .",
        "r1: p(X, Y) :- u(X, Y), not v(X) .",
        [("u", "a", "b"), ("u", "b", "c"), ("v", "b")],
    ),
    (
        "r1: p(X, Z) :- u(X, Y), u(Y, Z) .\nr2: p(X, Z) :- p(X, Y), u(Y, Z) .",
        "r1: p(X, Z) :- u(Z, X) .\nr2: p(X, Z) :- p(X, Y), p(Y, Z), X != Z .",
        [("u", "a", "b"), ("u", "b", "c"), ("u", "c", "a")],
    ),
]


@pytest.mark.parametrize(("old", "new", "facts"), REUSE_CASES)
def test_a_new_body_under_an_old_label_never_runs_the_old_plans(old, new, facts):
    """Every variant a module compiles (overdeletion, checks, aggregate groups...) is cached
    under the rule's content key: a body added later under the same label compiles its own."""
    reasoner = Reasoner()
    reasoner.add_rules(old)
    reasoner.add_facts([("u", "x", "y"), ("u", "y", "y"), ("v", "y")])
    reasoner.delete_facts([("u", "x", "y")])  # maintenance compiles the modules' variants
    old_keys = {rule.key for rule in reasoner.rules.values()}
    reasoner.delete_rules(list(reasoner.rules))
    assert not any(reasoner.executor.plans(key) for key in old_keys)
    reasoner.update(add_rules=new, add_facts=facts)
    everything = facts + [("u", "y", "y"), ("v", "y")]
    assert set(reasoner.facts()) == scratch(new, everything) == reference(new, everything)
    reasoner.delete_facts(facts[:1])
    rest = facts[1:] + [("u", "y", "y"), ("v", "y")]
    assert set(reasoner.facts()) == scratch(new, rest) == reference(new, rest)


# ------------------------------------------------------------------ 3. SQLite state
def test_a_replacement_is_saved_so_a_restart_keeps_the_new_body(tmp_path):
    path = tmp_path / "agent.db"
    facts = [("e", "a", "b"), ("f", "c", "d")]
    with AgentState(path) as state:
        state.apply(add_rules="r1: t(X, Y) :- e(X, Y) .", add_facts=facts, source="base")
        state.apply(delete_rules=["r1"], add_rules="r1: t(X, Y) :- f(X, Y) .", source="base")
        in_memory = set(state.reasoner.facts())
        (text,) = [row[0] for row in state.conn.execute("SELECT text FROM rules")]
        assert text == "r1: <t>(X, Y) :- <f>(X, Y) ."
    with AgentState(path) as state:
        assert state.load_report.how == "loaded"
        assert str(state.reasoner.rules["r1"]) == "r1: <t>(X, Y) :- <f>(X, Y) ."
        assert set(state.reasoner.facts()) == in_memory
    assert in_memory == scratch("r1: t(X, Y) :- f(X, Y) .", facts)


def test_a_signed_bundle_replacing_a_rule_through_the_agent(tmp_path):
    from tests.support.agent_harness import Cloud

    cloud = Cloud(tmp_path / "cloud")
    agent = make_agent(tmp_path, cloud)
    first = cloud.bundle(
        "base",
        1,
        rules={"hot": "hot: <Hot>(X) :- <temp>(X, T) and COMP(T, >, 30) ."},
        facts=[("temp", "a", 35), ("temp", "b", 25)],
    )
    assert agent.handle_bundle(cloud.sign(first)).status == "applied"
    assert agent.reasoner.query("<Hot>(X)") == [{"X": "a"}]
    replace = cloud.bundle("base", 2).model_copy(
        update={
            "operations": [
                DeleteRules(ids=["hot"]),
                AddRules(
                    rules=[RuleSpec(id="hot", text="hot: <Hot>(X) :- <temp>(X, T) and T < 30 .")]
                ),
            ]
        }
    )
    assert agent.handle_bundle(cloud.sign(replace)).status == "applied"
    wanted = scratch(
        "hot: <Hot>(X) :- <temp>(X, T) and T < 30 .", [("temp", "a", 35), ("temp", "b", 25)]
    )
    assert set(agent.reasoner.facts()) == wanted
    assert agent.reasoner.query("<Hot>(X)") == [{"X": "b"}]
    agent.close()
    again = make_agent(tmp_path, cloud)  # the same database file, reloaded
    assert again.state.load_report.how == "loaded"
    assert set(again.reasoner.facts()) == wanted
    again.close()


# ------------------------------------------------------------------ deleting by name, key, text
def test_a_rule_built_with_an_anonymous_variable_is_deleted_by_its_text():
    rule = Rule(
        Atom("lone", (Variable("X"),)),
        (Atom("n", (Variable("X"),)), Negation(Atom("t", (Variable("X"), Variable("_"))))),
    )
    reasoner = Reasoner()
    (rule_id,) = reasoner.add_rules([rule])
    reasoner.add_facts([("n", "a"), ("n", "b"), ("t", "a", "c")])
    assert reasoner.query("lone(X)") == [{"X": "b"}]
    assert str(rule) == "<lone>(X) :- <n>(X) and not <t>(X, _) ."
    assert reasoner.delete_rules(str(rule)) == [rule_id]
    assert reasoner.query("lone(X)") == []


def test_two_names_for_one_rule_keep_it_until_both_are_deleted():
    reasoner = Reasoner()
    reasoner.add_rules("base1: t(X) :- e(X) .")
    reasoner.add_rules("extra7: t(Y) :- e(Y) .")  # the same rule, under a second name
    reasoner.add_facts([("e", "a")])
    assert len(reasoner.program) == 1 and len(reasoner.rules) == 2
    (node,) = reasoner.stats()["hyper_nodes"]
    assert sorted(node["rules"]) == ["base1", "extra7"]
    reasoner.delete_rules(["base1"])
    assert reasoner.query("t(X)") == [{"X": "a"}]
    assert reasoner.delete_rules(["extra7"]) == ["extra7"]
    assert reasoner.query("t(X)") == []


def test_deleting_by_content_key_or_bare_text_deletes_every_name():
    reasoner = Reasoner()
    reasoner.add_rules("a: t(X) :- e(X) .\nb: t(X) :- e(X) .\nc: s(X) :- e(X) .")
    key = reasoner.rules["a"].key
    assert sorted(reasoner.delete_rules([key])) == ["a", "b"]
    reasoner.add_rules("a: t(X) :- e(X) .\nb: t(X) :- e(X) .")
    assert sorted(reasoner.delete_rules("t(Z) :- e(Z) .")) == ["a", "b"]
    reasoner.add_rules("a: t(X) :- e(X) .\nb: t(X) :- e(X) .")
    assert reasoner.delete_rules("b: t(Z) :- e(Z) .") == ["b"]  # a label names that name only
    with pytest.raises(UnknownRuleError):
        reasoner.delete_rules("c: t(X) :- e(X) .")  # c names another rule
    assert sorted(reasoner.rules) == ["a", "c"]


# ------------------------------------------------------------------ validation once
def test_every_added_rule_is_validated_once_per_update(monkeypatch):
    calls: list[str] = []
    original = validation_module._check_shape

    def counting(rule):
        calls.append(str(rule))
        return original(rule)

    monkeypatch.setattr(validation_module, "_check_shape", counting)
    reasoner = Reasoner()
    reasoner.add_rules("r1: t(X) :- e(X) .\nr2: s(X) :- t(X), not u(X) .")
    assert len(calls) == 2  # by the parser; the engine knows they were checked
    reasoner.add_rules("r3: u(X) :- e(X), X != 1 .")
    assert len(calls) == 3  # the rules already in the program are not checked again
    built = Rule(Atom("v", (Variable("X"),)), (Atom("e", (Variable("X"),)),))
    reasoner.add_rules(Program((built,)))
    assert len(calls) == 4  # an AST rule: checked by the engine, once


# ------------------------------------------------------------------ an older state file
def test_a_state_file_of_schema_version_1_is_migrated(tmp_path):
    """Version 1 saved rules by id and hyper-nodes by rule ids; version 2 by name and content
    key. An agent upgraded in the field must start from its old file, not refuse it."""
    path = tmp_path / "old.db"
    text = "r1: t(X, Y) :- e(X, Y) .\nt(X, Z) :- t(X, Y), e(Y, Z) ."
    with AgentState(path) as state:
        state.apply(add_rules=text, add_facts=[("e", "a", "b"), ("e", "b", "c")], source="base")
        expected = set(state.reasoner.facts())
        saved = state.reasoner
    conn = sqlite3.connect(path)
    with conn:  # rewrite the file as version 1 wrote it
        rows = conn.execute("SELECT name, text, stream, bundle_id, position FROM rules").fetchall()
        conn.execute("DROP TABLE rules")
        conn.execute(
            "CREATE TABLE rules (id TEXT PRIMARY KEY, text TEXT NOT NULL, stream TEXT NOT NULL, "
            "bundle_id TEXT, position INTEGER NOT NULL)"
        )
        conn.executemany(
            "INSERT INTO rules VALUES (?, ?, ?, ?, ?)",
            [("hold1234" if name.startswith("h") else name, *rest) for name, *rest in rows],
        )
        conn.execute("UPDATE nodes SET rules = '[\"r1\"]'")
        conn.execute("DROP TABLE reading_times")  # version 3's
        conn.execute("DROP TABLE outbox")  # version 11's
        conn.execute("DROP TABLE windows")  # version 12's
        conn.execute("DROP TABLE stream_history")  # version 13's
        terms_per_row(conn)
        facts_per_claim(conn)  # versions 3-7's facts table, then 1's
        conn.execute("ALTER TABLE facts RENAME TO facts_v3")
        conn.execute("DROP INDEX facts_by_source")
        conn.execute(
            "CREATE TABLE facts (rel INTEGER NOT NULL, a0 INTEGER NOT NULL, a1 INTEGER NOT NULL, "
            "a2 INTEGER NOT NULL, rest TEXT NOT NULL, source TEXT NOT NULL, "
            "PRIMARY KEY (rel, a0, a1, a2, rest)) WITHOUT ROWID"
        )
        conn.execute("CREATE INDEX facts_by_source ON facts (source)")
        conn.execute("INSERT INTO facts SELECT * FROM facts_v3")
        conn.execute("DROP TABLE facts_v3")
        conn.execute("UPDATE meta SET value = '1' WHERE key = 'schema_version'")
        derived_per_fact(conn, saved)  # version 3's layout of derived facts, and 1's
    conn.close()
    with AgentState(path, load=False) as state:  # a health check reads it, migrates nothing
        assert state.summary()["rules"] == 2
        assert state.summary()["explicit_facts"] == 2
    with AgentState(path) as state:
        assert state.get_meta("schema_version") == str(SCHEMA_VERSION)
        assert state.load_report.how.startswith("recomputed")
        assert set(state.reasoner.facts()) == expected
        assert state.rule_streams() == {name: ["base"] for name in state.reasoner.rules}
    with AgentState(path) as state:
        assert state.load_report.how == "loaded"
        assert set(state.reasoner.facts()) == expected
