"""One update that deletes a fact or a rule and adds it back, through every path it can take
(``docs/semantics.md``, "One update"; ``agent/engine/update/net_change.py``).

The same fact may arrive as a tuple, a re-spelt tuple (a class fact as ``(C, x)`` or as the
triple, ``3`` or ``3.0``), a ground fact in rule text, a line of a Turtle file, or a bundle's
wire list; the same rule by label, by content key, by text, by text with its variables
renamed. Whatever the paths, the last operation naming a fact or rule decides, additions
winning over deletions of the same update given as two lists, in the ``Reasoner``, in the
agent's SQLite state (reopened) and in a real ``Agent`` applying signed bundles.

:class:`BundleMachine` is the stateful differential test of the bundle path: random bundles
of random operations (facts re-spelt, rules replaced under their label, full states) signed
and applied by an ``Agent``, restarted from its SQLite file between steps, against the
reference evaluator on a model that folds each bundle's operations in order.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, note, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from agent.config import AgentConfig
from agent.engine import RDF_TYPE, Literal, Reasoner
from agent.engine.language import Program, Rule
from agent.engine.program.parser import parse_program
from agent.engine.terms import fact_identity
from agent.engine.update.net_change import NetChange
from agent.protocol.messages import AddFacts, AddRules, DeleteFacts, DeleteRules, RuleSpec
from agent.service import Agent
from agent.state.agent_state import AgentState
from tests.engine.test_incremental_differential import assert_same, engine_facts, round_trips
from tests.support.agent_harness import Cloud, readings_payload
from tests.support.fact_paths import respell
from tests.support.reference import evaluate, to_external
from tests.support.strategies import incremental_programs, labelled, pool_facts


def state_facts(state: AgentState) -> set:
    return set(state.reasoner.facts())


# ------------------------------------------------------------------ the example
def test_a_fact_deleted_as_tuples_and_added_back_as_rule_text_stays(tmp_path):
    path = tmp_path / "a.db"
    state = AgentState(path, modules=True)
    state.apply(add_facts=[("t", "n2"), ("u", 3.0)])
    state.apply(add_rules="t(n2) .\nu(3) .", delete_facts=[("t", "n2"), ("u", 3.0)])
    wanted = {(RDF_TYPE, "n2", "t"), (RDF_TYPE, 3.0, "u")}
    assert state_facts(state) == wanted
    state.close()
    reopened = AgentState(path, modules=True)
    assert state_facts(reopened) == wanted
    assert reopened.summary()["explicit_facts"] == 2
    reopened.close()


# ------------------------------------------------------------------ fact identity
@pytest.mark.parametrize(
    ("one", "other"),
    [
        (("t", "n2"), (RDF_TYPE, "n2", "t")),  # a class fact as a pair or as the triple
        (("u", 3), ("u", 3.0)),  # one number, two spellings
        (("p", "a", 3, "b"), ("p", "a", 3.0, "b")),
    ],
)
def test_spellings_of_one_fact_have_one_identity(one, other):
    assert fact_identity(one) == fact_identity(other)


def test_a_fact_in_rule_text_has_the_identity_of_its_tuple():
    (atom,) = parse_program("t(n2) .").facts
    assert fact_identity(atom) == fact_identity(("t", "n2"))
    (atom,) = parse_program("u(a, 3) .").facts
    assert fact_identity(atom) == fact_identity(("u", "a", 3.0))


@pytest.mark.parametrize(
    ("one", "other"),
    [
        (("t", True), ("t", 1)),  # booleans are not numbers
        (("t", False), ("t", 0)),
        (("t", Literal("c0")), ("t", "c0")),  # a literal is not an IRI
        (("t", Literal("3")), ("t", 3)),  # nor a number
        (("p", "a", "b"), ("p", "b", "a")),
        (("p", "a"), ("p", "a", "a")),  # two relations p/1 and p/2
    ],
)
def test_different_facts_have_different_identities(one, other):
    assert fact_identity(one) != fact_identity(other)


# ------------------------------------------------------------------ the three update paths
SPELLINGS = [
    pytest.param(("t", "n2"), {"add_rules": "t(n2) ."}, id="class pair -> rule text"),
    pytest.param((RDF_TYPE, "n2", "t"), {"add_facts": [("t", "n2")]}, id="triple -> class pair"),
    pytest.param(("u", "a", 3.0), {"add_facts": [("u", "a", 3)]}, id="3.0 -> 3"),
    pytest.param(("u", "a", 3), {"add_rules": "u(a, 3.0) ."}, id="3 -> 3.0 in rule text"),
    pytest.param(("u", "a", "b"), {"file": "<a> <u> <b> ."}, id="tuple -> Turtle file"),
    pytest.param((RDF_TYPE, "a", "C"), {"file": "<a> a <C> ."}, id="class triple -> file"),
]


def added_back(tmp_path: Path, fact: tuple, how: dict) -> dict:
    """The update that deletes ``fact`` as a tuple and adds it back as ``how`` says."""
    change: dict = {"delete_facts": [fact]}
    if "file" in how:
        path = tmp_path / "back.ttl"
        path.write_text(how["file"] + "\n")
        change["add_facts"] = path
    else:
        change.update(how)
    return change


@pytest.mark.parametrize(("fact", "how"), SPELLINGS)
def test_reasoner_keeps_a_fact_deleted_and_added_back_otherwise(tmp_path, fact, how):
    reasoner = Reasoner()
    reasoner.add_facts([fact])
    before = set(reasoner.facts())
    reasoner.update(**added_back(tmp_path, fact, how))
    assert set(reasoner.facts()) == before


@pytest.mark.parametrize(("fact", "how"), SPELLINGS)
def test_agent_state_keeps_a_fact_deleted_and_added_back_otherwise(tmp_path, fact, how):
    path = tmp_path / "a.db"
    state = AgentState(path)
    state.apply(add_facts=[fact])
    before = state_facts(state)
    report = state.apply(**added_back(tmp_path, fact, how))
    assert (report["facts_added"], report["facts_deleted"]) == (0, 0)
    assert state_facts(state) == before
    state.close()
    with AgentState(path) as reopened:
        assert state_facts(reopened) == before
        assert reopened.summary()["explicit_facts"] == 1


def test_agent_state_takes_fact_files_and_rule_files_as_the_reasoner_does(tmp_path):
    facts = tmp_path / "facts.ttl"
    facts.write_text("<a> <e> <b> .\n<b> <e> <c> .\n")
    rules = tmp_path / "reach.rules"
    rules.write_text("r(X, Y) :- e(X, Y) .\nr(X, Z) :- r(X, Y) and e(Y, Z) .\n")
    with AgentState(tmp_path / "a.db") as state:
        state.apply(add_rules=str(rules), add_facts=facts)
        assert ("r", "a", "c") in state_facts(state)
        state.apply(delete_facts=str(facts))
        assert state_facts(state) == set()


def test_booleans_and_numbers_stay_apart_in_one_update(tmp_path):
    """``True == 1`` in Python: compared as tuples, adding ``t(true)`` would have kept the
    deleted ``t(1)``."""
    with AgentState(tmp_path / "a.db") as state:
        state.apply(add_facts=[("t", "x", 1)])
        state.apply(add_facts=[("t", "x", True)], delete_facts=[("t", "x", 1)])
        # (compared by repr: a set of Python tuples holds one of ("t", "x", 1) and True)
        assert sorted(map(repr, state.reasoner.facts())) == ["('t', 'x', True)"]


def test_one_fact_spelt_twice_in_one_addition_is_added_once(tmp_path):
    with AgentState(tmp_path / "a.db") as state:
        report = state.apply(add_facts=[("t", "n2"), (RDF_TYPE, "n2", "t"), ("u", 3), ("u", 3.0)])
        assert report["facts_added"] == 2
        assert state.summary()["explicit_facts"] == 2
        state.apply(delete_facts=[("t", "n2"), ("u", 3.0)])
        assert state_facts(state) == set()


# ------------------------------------------------------------------ rules, every way
RULE = "u(Z, X, Y) :- e(X, Y, Z) ."
RENAMED = "u(X, Y, Z) :- e(Y, Z, X) ."
KEY = parse_program(RULE).rules[0].key


@pytest.mark.parametrize(
    ("base", "delete", "add"),
    [
        ("r6: " + RULE, "r6", "r6: " + RULE),
        ("r6: " + RULE, "r6", "r6: " + RENAMED),
        ("r6: " + RULE, "r6: " + RENAMED, "r6: " + RULE),
        (RULE, KEY, RENAMED),
        (RULE, RULE, RENAMED),
        (RULE, RENAMED, RULE),
    ],
    ids=["label", "label, renamed", "renamed text", "key", "text", "renamed text, bare"],
)
def test_a_rule_deleted_and_added_back_in_one_update_stays(tmp_path, base, delete, add):
    assert parse_program(RENAMED).rules[0].key == KEY  # content modulo renaming
    wanted = {("e", 1, 2, 3), ("u", 3, 1, 2)}
    reasoner = Reasoner()
    reasoner.update(add_rules=base, add_facts=[("e", 1, 2, 3)])
    reasoner.update(delete_rules=[delete], add_rules=add)
    assert set(reasoner.facts()) == wanted
    path = tmp_path / "a.db"
    with AgentState(path) as state:
        state.apply(add_rules=base, add_facts=[("e", 1, 2, 3)])
        names = set(state.reasoner.rules)
        state.apply(delete_rules=[delete], add_rules=add)
        assert state_facts(state) == wanted and set(state.reasoner.rules) == names
    with AgentState(path) as reopened:
        assert state_facts(reopened) == wanted and set(reopened.reasoner.rules) == names


def test_net_change_drops_a_rule_added_then_deleted_by_any_name():
    rule = parse_program("r6: " + RULE).rules[0]
    for item in ("r6", KEY, RENAMED, "r6: " + RENAMED):
        net = NetChange().add_rules([rule]).delete_rules([item])
        assert net.rules_added == [], item
        assert net.rules_deleted == [item]
    # A text under another label names another rule: the addition stays.
    net = NetChange().add_rules([rule]).delete_rules(["r7: " + RULE])
    assert net.rules_added == [rule]


def test_net_change_is_decided_by_the_last_operation_naming_a_fact():
    net = NetChange().add_facts([("t", "n2")]).delete_facts([(RDF_TYPE, "n2", "t")])
    assert (net.facts_added, net.facts_deleted) == ([], [(RDF_TYPE, "n2", "t")])
    net.add_facts(parse_program("t(n2) .").facts)
    assert (net.facts_added, net.facts_deleted) == ([(RDF_TYPE, "n2", "t")], [])


# ------------------------------------------------------------------ bundles and readings
def make_agent(directory: Path, cloud: Cloud, reasoning: str = "") -> Agent:
    text = f"""
device = "t1"
farm = "farm1"
database = "t1.db"
synchronous = "OFF"
[keys]
trusted_keys = "{cloud.keys}"
[reasoning]
{reasoning}
"""
    path = directory / "agent.toml"
    path.write_text(text)
    return Agent(AgentConfig.load(path))


def test_a_bundle_folds_its_operations_in_order_by_fact_identity(tmp_path):
    cloud = Cloud(tmp_path / "cloud")
    agent = make_agent(tmp_path, cloud)
    agent.handle_bundle(cloud.sign(cloud.bundle("base", 1, facts=[("t", "n2"), ("u", "a", 3)])))
    again = cloud.bundle("base", 2).model_copy(
        update={
            "operations": [
                DeleteFacts(facts=[["t", "n2"], ["u", "a", 3]]),
                AddFacts(facts=[[RDF_TYPE, "n2", "t"], ["u", "a", 3.0]]),  # back, re-spelt
                AddFacts(facts=[["v", "b"]]),
                DeleteFacts(facts=[[RDF_TYPE, "b", "v"]]),  # added, then deleted: absent
            ]
        }
    )
    outcome = agent.handle_bundle(cloud.sign(again))
    assert outcome.status == "applied", outcome
    assert (outcome.report["facts_added"], outcome.report["facts_deleted"]) == (0, 0)
    wanted = {(RDF_TYPE, "n2", "t"), ("u", "a", 3)}
    assert set(agent.reasoner.facts()) == wanted
    # A full state that re-spells what the stream holds keeps it, and changes nothing.
    full = cloud.bundle("base", 3, full_state=True, facts=[(RDF_TYPE, "n2", "t"), ("u", "a", 3.0)])
    outcome = agent.handle_bundle(cloud.sign(full))
    assert (outcome.report["facts_added"], outcome.report["facts_deleted"]) == (0, 0)
    agent.close()
    agent = make_agent(tmp_path, cloud)
    assert set(agent.reasoner.facts()) == wanted
    agent.close()


def test_a_reading_re_spelt_changes_nothing_and_a_boolean_is_not_a_number(tmp_path):
    cloud = Cloud(tmp_path / "cloud")
    agent = make_agent(tmp_path, cloud)
    assert agent.record_readings(readings_payload("t1", "farm1", [("temp", "t1", 3)])).committed
    again = agent.record_readings(readings_payload("t1", "farm1", [("temp", "t1", 3.0)]))
    assert again.status == "unchanged"
    assert set(agent.reasoner.facts()) == {("temp", "t1", 3)}
    agent.record_readings(readings_payload("t1", "farm1", [("on", "t1", True)]))
    changed = agent.record_readings(readings_payload("t1", "farm1", [("on", "t1", 1)]))
    assert changed.committed
    assert [repr(f) for f in agent.reasoner.facts("on")] == ["('on', 't1', 1)"]
    agent.close()


def test_local_facts_re_spelt_in_the_file_change_nothing_at_the_next_start(tmp_path):
    cloud = Cloud(tmp_path / "cloud")
    facts = tmp_path / "local.ttl"
    facts.write_text("<a> a <C> .\n<a> <u> 3 .\n<a> <on> true .\n")
    reasoning = f'facts = ["{facts}"]'
    agent = make_agent(tmp_path, cloud, reasoning)
    before = set(agent.reasoner.facts())
    agent.close()
    rdf_type = "<http://www.w3.org/1999/02/22-rdf-syntax-ns#type>"
    facts.write_text(f"<a> {rdf_type} <C> .\n<a> <u> 3.0 .\n<a> <on> true .\n")
    agent = make_agent(tmp_path, cloud, reasoning)
    assert set(agent.reasoner.facts()) == before
    assert agent.state.summary()["explicit_facts"] == 3
    agent.close()
    facts.write_text(f"<a> {rdf_type} <C> .\n<a> <u> 3.0 .\n<a> <on> 1 .\n")  # true -> 1
    agent = make_agent(tmp_path, cloud, reasoning)
    assert [repr(f) for f in agent.reasoner.facts("on")] == ["('on', 'a', 1)"]
    agent.close()


# ------------------------------------------------------------------ the bundle machine
BUNDLE_SETTINGS = settings(
    max_examples=max(1, settings.default.max_examples * 3 // 10),  # 30 in CI, 300 thorough
    stateful_step_count=15,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


OPERATIONS = ["add_rules", "delete_rules", "add_facts", "delete_facts"]


class BundleMachine(RuleBasedStateMachine):
    """Signed bundles of random operations applied by a real :class:`Agent` (SQLite file on
    disk), restarted now and then; the model folds every bundle's operations in order, by
    logical fact and rule name, and the agent must equal the reference evaluator on it."""

    def __init__(self) -> None:
        super().__init__()
        self.directory = Path(tempfile.mkdtemp(prefix="zodiac-bundle-machine-"))
        self.cloud = Cloud(self.directory / "cloud")
        self.agent = make_agent(self.directory, self.cloud)
        self.rules: dict[str, Rule] = {}  # the model: rules by name, explicit facts
        self.explicit: set[tuple] = set()
        self.version = 0
        self.steps = 0

    def teardown(self) -> None:
        self.agent.close()
        shutil.rmtree(self.directory, ignore_errors=True)

    @initialize(pool=labelled(incremental_programs()))
    def setup(self, pool: Program) -> None:
        self.program = pool
        self.pool = [r for r in pool.rules if round_trips(r)]  # a bundle sends rules as text
        note("rule pool:\n" + "\n".join(f"  [{r.id}] {r}" for r in self.pool))

    def spelling(self, data: st.DataObject, fact: tuple) -> list:
        """A wire fact: the external tuple or a re-spelling of it."""
        return list(respell(fact) if data.draw(st.booleans()) else to_external(fact))

    @rule(data=st.data())
    def send_bundle(self, data: st.DataObject) -> None:
        rules, facts = dict(self.rules), set(self.explicit)  # the model as the bundle goes
        added_rules: dict[str, Rule] = {}  # the bundle's own net additions (for a full state)
        added_facts: set[tuple] = set()
        operations, shown = [], []
        for _ in range(data.draw(st.integers(1, 4), label="operations")):
            kind = data.draw(
                st.sampled_from(["add_rules", "delete_rules", "add_facts", "delete_facts"])
            )
            if kind == "add_rules" and self.pool:
                chosen = data.draw(st.lists(st.sampled_from(self.pool), min_size=1, max_size=2))
                chosen = list({r.id: r for r in chosen}.values())
                chosen = [r for r in chosen if r.id not in rules or rules[r.id].key == r.key]
                if chosen:
                    operations.append(
                        AddRules(rules=[RuleSpec(id=r.id, text=str(r)) for r in chosen])
                    )
                    for r in chosen:
                        rules[r.id] = added_rules[r.id] = r
                    shown.append(f"+rules {[r.id for r in chosen]}")
            elif kind == "delete_rules" and rules:
                names = data.draw(st.lists(st.sampled_from(sorted(rules)), min_size=1, max_size=2))
                operations.append(DeleteRules(ids=list(dict.fromkeys(names))))
                for name in names:
                    rules.pop(name, None)
                    added_rules.pop(name, None)
                shown.append(f"-rules {names}")
            elif kind == "add_facts":
                gone = sorted(set(self.explicit) - facts, key=repr)  # deleted by this bundle
                strategy = pool_facts(self.program)
                if gone and data.draw(st.booleans()):
                    strategy = st.sampled_from(gone)
                chosen = data.draw(st.lists(strategy, min_size=1, max_size=3))
                operations.append(AddFacts(facts=[self.spelling(data, f) for f in chosen]))
                facts |= set(chosen)
                added_facts |= set(chosen)
                shown.append(f"+facts {chosen}")
            elif kind == "delete_facts" and facts:
                chosen = data.draw(st.lists(st.sampled_from(sorted(facts, key=repr)), max_size=3))
                operations.append(DeleteFacts(facts=[self.spelling(data, f) for f in chosen]))
                facts -= set(chosen)
                added_facts -= set(chosen)
                shown.append(f"-facts {chosen}")
        full_state = data.draw(st.integers(0, 5)) == 0
        if full_state:  # the stream's whole content is what the bundle leaves added
            rules, facts = added_rules, added_facts
        self.version += 1
        self.steps += 1
        note(
            f"step {self.steps}: bundle v{self.version}{' (full state)' if full_state else ''} "
            + "; ".join(shown)
        )
        bundle = self.cloud.bundle("base", self.version, full_state=full_state)
        bundle = bundle.model_copy(update={"operations": operations})
        outcome = self.agent.handle_bundle(self.cloud.sign(bundle))
        assert outcome.status == "applied", (outcome.status, outcome.reason, outcome.message)
        self.rules, self.explicit = rules, facts

    @rule()
    def restart(self) -> None:
        self.steps += 1
        note(f"step {self.steps}: restart from SQLite")
        self.agent.close()
        self.agent = make_agent(self.directory, self.cloud)
        assert self.agent.state.load_report.how == "loaded"

    @invariant()
    def agrees_with_the_reference(self) -> None:
        program = Program(tuple({r.key: r for r in self.rules.values()}.values()))
        wanted = {to_external(f) for f in evaluate(program, self.explicit).facts}
        actual = engine_facts(self.agent.reasoner)
        assert_same(actual, wanted, f"after step {self.steps}, agent vs reference evaluator")
        assert set(self.agent.reasoner.rules) == set(self.rules)
        assert self.agent.state.summary()["explicit_facts"] == len(self.explicit)


TestBundleMachine = BundleMachine.TestCase
TestBundleMachine.settings = BUNDLE_SETTINGS
