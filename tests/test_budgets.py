"""Budgets (agent/engine/budget.py): an update over its budget stops, and everything is as before.

Through the engine (random programs and updates with small budgets: every update either equals
the reference evaluator or leaves the reasoner exactly as it was), through the agent (an
exploding bundle is refused with the figures, its version is not recorded, the next one
applies; a bundle the agent died applying is refused when redelivered), through a real agent
process over MQTT, and through the CLI.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, event, given, note, settings
from hypothesis import strategies as st

from agent.engine import Budget, BudgetExceeded, Program, Reasoner
from agent.engine.errors import RuleError
from agent.engine.parser import parse_program
from agent.service import APPLYING, POISON_ATTEMPTS
from tests.agent_harness import AgentProcess, Cloud, StatusWatcher, write_config
from tests.broker import TestClient
from tests.reference import evaluate, from_external, to_external
from tests.strategies import incremental_programs, labelled, pool_facts
from tests.test_service import make_agent

PRODUCT = "p(X, Y) :- a(X), b(Y) ."
FACTS = [("a", f"x{i}") for i in range(400)] + [("b", f"y{i}") for i in range(400)]


def state_of(reasoner: Reasoner) -> tuple:
    stats = reasoner.stats()
    nodes = sorted((n["name"], tuple(sorted(n["rules"])), n["facts"]) for n in stats["hyper_nodes"])
    return set(reasoner.facts()), set(reasoner.edb_facts()), dict(reasoner.rules), nodes


# ------------------------------------------------------------------ engine
def test_a_cartesian_product_over_budget_changes_nothing():
    reasoner = Reasoner(budget=Budget(max_derived_facts=50_000))
    reasoner.add_facts(FACTS)
    reasoner.add_rules("q(X) :- a(X) .\nr(X, Y) :- q(X), a(Y), X = Y .")
    before = state_of(reasoner)
    with pytest.raises(BudgetExceeded) as info:
        reasoner.update(add_rules=PRODUCT, delete_facts=FACTS[:10], add_facts=[("a", "new")])
    assert info.value.limit == "derived_facts" and info.value.allowed == 50_000
    assert info.value.used > 50_000
    assert state_of(reasoner) == before
    # The reasoner goes on: a change within budget is applied and maintained as usual.
    reasoner.delete_facts(FACTS[:10])
    text = "q(X) :- a(X) .\nr(X, Y) :- q(X), a(Y), X = Y ."
    wanted = evaluate(parse_program(text), [from_external(f) for f in FACTS[10:]]).external()
    assert set(reasoner.facts()) == wanted


def test_subjects_following_their_one_y_count_against_the_budget():
    """A composition whose 20,000 subjects share their one ``y`` (a farm's turbines) changes
    them together when ``B[y]`` changes (modules/composition.py); the facts that change still
    count against the update's budget, and an update over it changes nothing."""
    reasoner = Reasoner(budget=Budget(max_derived_facts=50_000))
    reasoner.add_facts([("partOf", f"t{i}", "farm") for i in range(20_000)])
    reasoner.add_facts([("forecast", "farm", 12)])
    reasoner.add_rules("f: expected(X, T) :- partOf(X, F), forecast(F, T) .")
    before = state_of(reasoner)
    more = [("forecast", "farm", t) for t in (13, 14, 15)]
    with pytest.raises(BudgetExceeded) as info:
        reasoner.update(add_facts=more, delete_facts=[("forecast", "farm", 12)])
    assert info.value.limit == "derived_facts"
    assert state_of(reasoner) == before
    reasoner.update(add_facts=more[:1], delete_facts=[("forecast", "farm", 12)])
    strategy = reasoner.stats()["last_update"]["hyper_nodes"]
    assert "20000 subjects changed as their one y" in str(strategy)
    assert len(reasoner.query("expected(X, 13)")) == 20_000


def test_unbounded_recursion_is_stopped_by_the_clock():
    reasoner = Reasoner()
    reasoner.add_facts([("start", 0)])
    before = state_of(reasoner)
    with pytest.raises(BudgetExceeded) as info:
        reasoner.update(
            add_rules="num(X) :- start(X) .\nnum(Y) :- num(X), bind(X + 1 as Y) .",
            budget=Budget(max_seconds=0.5),
        )
    assert info.value.limit == "seconds"
    assert state_of(reasoner) == before


def test_a_budget_is_said_with_its_figures():
    """The message names the limit as it was set: a limit of 0.001 s read 0.00."""
    assert "more than 0.001 seconds (0.00168 when stopped)" in str(
        BudgetExceeded("seconds", 0.001, 0.001683)
    )
    assert "more than 1,000 derived facts (160,000 when stopped)" in str(
        BudgetExceeded("derived_facts", 1000, 160000)
    )


def test_memory_growth_over_budget_is_stopped():
    from agent.engine.budget import resident_memory

    now = resident_memory()
    if now is None:
        pytest.fail("resident memory cannot be read on this machine (/proc/self/statm)")
    reasoner = Reasoner(budget=Budget(max_memory_bytes=now + 40 * 1024 * 1024))
    reasoner.add_facts([("a", i) for i in range(3000)] + [("b", i) for i in range(3000)])
    before = state_of(reasoner)
    with pytest.raises(BudgetExceeded) as info:
        reasoner.add_rules(PRODUCT)  # 9 million pairs: far more than 40 MB
    assert info.value.limit == "memory_bytes"
    assert state_of(reasoner) == before
    reasoner.add_rules("c(X) :- a(X) .")  # memory the abandoned update left is reused
    assert len(reasoner.query("c(X)")) == 3000


def walks(edges: set[tuple[str, str]], length: int) -> set[tuple[str, str]]:
    """The (start, end) pairs of the walks of exactly ``length`` edges: what ``p(X0, Xn) :-
    e(X0, X1), ..., e(Xn-1, Xn)`` derives, computed step by step (the reference evaluator joins
    a 40-atom body by brute force, which takes seconds)."""
    reached = {(a, a) for edge in edges for a in edge}
    for _ in range(length):
        reached = {(start, b) for start, end in reached for a, b in edges if a == end}
    return reached


def test_huge_rules_are_refused_and_long_ones_compile():
    body = ", ".join(f"e(X{i}, X{i + 1})" for i in range(10_000))
    reasoner = Reasoner()
    with pytest.raises(RuleError, match="at most 500 items") as refused:
        reasoner.add_rules(f"p(X0, X10000) :- {body} .")
    assert len(str(refused.value)) < 1000  # the rule quoted by its start and end only
    assert "<e>(X9999, X10000)" in str(refused.value) and len(refused.value.rule) > 100_000
    # 40 atoms nest deeper than Python allows in one function: compiled in segments.
    text = f"p(X0, X40) :- {', '.join(f'e(X{i}, X{i + 1})' for i in range(40))} ."
    edges = {("a", "b"), ("b", "c"), ("c", "a"), ("b", "a")}
    reasoner.add_facts([("e", *edge) for edge in edges])
    reasoner.add_rules(text)
    derived = {fact[1:] for fact in reasoner.facts() if fact[0] == "p"}
    assert derived == walks(edges, 40)
    assert len(derived) == 9  # (a, b, c all reach each other in 40 steps)
    reasoner.delete_facts([("e", "b", "a")])
    derived = {fact[1:] for fact in reasoner.facts() if fact[0] == "p"}
    assert derived == walks(edges - {("b", "a")}, 40)
    assert derived == {("a", "b"), ("b", "c"), ("c", "a")}  # 40 = 1 (mod 3) on the cycle


@settings(
    max_examples=max(1, settings.default.max_examples * 4 // 10),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(pool=labelled(incremental_programs()), data=st.data())
def test_every_update_completes_or_changes_nothing(pool, data):
    """Random rule pools and updates under small derived-fact budgets: each update either
    succeeds and equals the reference evaluator, or raises BudgetExceeded and leaves the
    reasoner exactly as it was (the next update starts from there)."""
    limit = data.draw(st.integers(1, 8), label="max derived facts")
    reasoner = Reasoner(budget=Budget(max_derived_facts=limit))
    rules: dict = {}
    explicit: set = set()
    refused = 0
    for step in range(6):
        adds = [r for r in pool.rules if data.draw(st.integers(0, 3)) == 0]
        adds = [r for r in adds if rules.get(r.id, r).key == r.key]
        adds = list({r.id: r for r in adds}.values())
        deletes = [n for n in rules if data.draw(st.integers(0, 4)) == 0]
        adds = [r for r in adds if r.id not in rules or r.id in deletes]
        new_facts = data.draw(st.lists(pool_facts(pool), max_size=6))
        gone = [f for f in sorted(explicit, key=repr) if data.draw(st.integers(0, 3)) == 0]
        note(f"step {step}: +{[str(r) for r in adds]} -{deletes} +{new_facts} -{gone}")
        before = state_of(reasoner)
        try:
            reasoner.update(
                add_rules=Program(tuple(adds)),
                delete_rules=deletes,
                add_facts=[to_external(f) for f in new_facts],
                delete_facts=[to_external(f) for f in gone],
            )
        except BudgetExceeded:
            refused += 1
            assert state_of(reasoner) == before
            continue
        for name in deletes:
            del rules[name]
        rules.update((r.id, r) for r in adds)
        explicit = (explicit - set(gone)) | set(new_facts)
        program = Program(tuple({r.key: r for r in rules.values()}.values()))
        assert set(reasoner.facts()) == evaluate(program, explicit).external()
    event("some update refused" if refused else "no update refused")


# ------------------------------------------------------------------ agent
@pytest.fixture
def cloud(tmp_path):
    return Cloud(tmp_path / "cloud")


def test_an_exploding_bundle_is_refused_and_the_sequence_goes_on(tmp_path, cloud):
    agent = make_agent(tmp_path, cloud, "")
    agent.state.budget = agent.reasoner.budget = Budget(max_derived_facts=20_000)
    first = cloud.bundle("base", 1, facts=FACTS, rules={"q": "q: <q>(X) :- <a>(X) ."})
    assert agent.handle_bundle(cloud.sign(first)).status == "applied"
    before = state_of(agent.reasoner)
    boom = cloud.bundle("base", 2, rules={"boom": "boom: <p>(X, Y) :- <a>(X) and <b>(Y) ."})
    outcome = agent.handle_bundle(cloud.sign(boom))
    assert (outcome.status, outcome.reason) == ("refused", "budget_exceeded")
    assert outcome.report["limit"] == "derived_facts" and outcome.report["allowed"] == 20_000
    assert "20,000 derived facts" in agent.status().last_error
    assert state_of(agent.reasoner) == before
    assert agent.state.applied_versions() == {"base": 1}
    assert agent.state.get_meta(APPLYING) is None
    fine = cloud.bundle("base", 2, rules={"ok": "ok: <ok>(X) :- <b>(X) ."})
    assert agent.handle_bundle(cloud.sign(fine)).status == "applied"
    agent.close()
    again = make_agent(tmp_path, cloud, "")
    assert set(again.reasoner.rules) == {"q", "ok"}
    again.close()


def test_a_bundle_the_agent_died_applying_is_refused_when_redelivered(tmp_path, cloud):
    """A bundle that killed the agent POISON_ATTEMPTS times in a row is refused the next time;
    a single kill (power cut, restart) costs nothing: the redelivered bundle applies."""
    agent = make_agent(tmp_path, cloud, "")
    bundle = cloud.bundle("base", 1, rules={"q": "q: <q>(X) :- <a>(X) ."}, facts=FACTS[:3])
    marker = json.dumps([bundle.bundle_id, POISON_ATTEMPTS])
    agent.state.set_meta(APPLYING, marker)  # as if killed while applying it, each time
    agent.close()
    again = make_agent(tmp_path, cloud, "")
    outcome = again.handle_bundle(cloud.sign(bundle))
    assert (outcome.status, outcome.reason) == ("refused", "budget_exceeded")
    assert f"stopped {POISON_ATTEMPTS} times while applying this bundle" in outcome.message
    assert again.state.applied_versions() == {} and again.state.get_meta(APPLYING) is None
    # The cloud answers the refusal with the stream's full state, which applies.
    full = cloud.bundle("base", 2, full_state=True, facts=FACTS[:3])
    assert again.handle_bundle(cloud.sign(full)).status == "applied"
    again.close()


@pytest.mark.parametrize("marker", ['["{id}", 1]', '["{id}", 2]', "{id}"])
def test_a_bundle_killed_fewer_times_applies_when_redelivered(tmp_path, cloud, marker):
    agent = make_agent(tmp_path, cloud, "")
    bundle = cloud.bundle("base", 1, rules={"q": "q: <q>(X) :- <a>(X) ."}, facts=FACTS[:3])
    agent.state.set_meta(APPLYING, marker.format(id=bundle.bundle_id))
    agent.close()
    again = make_agent(tmp_path, cloud, "")
    assert again.handle_bundle(cloud.sign(bundle)).status == "applied"
    assert again.state.applied_versions() == {"base": 1}
    assert again.state.get_meta(APPLYING) is None
    again.close()


def test_an_agent_process_survives_an_exploding_bundle(tmp_path, make_broker, cloud):
    broker = make_broker()
    config = write_config(
        tmp_path / "t1", broker, cloud.keys, extra="[budget]\nmax_derived_facts = 30000\n"
    )
    topic = "zodiac/farm1/t1/bundle"
    with AgentProcess(config) as agent, TestClient(broker, "cloud-b") as client:
        watcher = StatusWatcher(client, "farm1", "t1")
        watcher.wait(lambda s: s.online)
        client.publish(topic, cloud.sign(cloud.bundle("base", 1, facts=FACTS)))
        watcher.wait(lambda s: s.applied.get("base") == 1)
        boom = cloud.bundle("base", 2, rules={"boom": "boom: <p>(X, Y) :- <a>(X) and <b>(Y) ."})
        client.publish(topic, cloud.sign(boom))
        status = watcher.wait(lambda s: "budget_exceeded" in (s.last_error or ""))
        assert status.online and status.applied == {"base": 1} and status.rules == 0
        client.publish(topic, cloud.sign(cloud.bundle("base", 2, facts=[("a", "more")])))
        status = watcher.wait(lambda s: s.applied.get("base") == 2)
        assert status.explicit_facts == len(FACTS) + 1
        assert agent.terminate() == 0


def test_the_cli_takes_the_same_budgets(tmp_path):
    rules = tmp_path / "boom.rules"
    rules.write_text(PRODUCT)
    facts = tmp_path / "facts.nt"
    facts.write_text(
        "".join(
            f"<{s}> <{p}> <{o}> .\n"
            for p, s, o in [
                ("http://www.w3.org/1999/02/22-rdf-syntax-ns#type", f"x{i}", c)
                for i in range(300)
                for c in ("a", "b")
            ]
        )
    )
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "agent.zodiac_edge_cli",
            "--max-derived-facts",
            "1000",
            "materialise",
            str(rules),
            str(facts),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2, result.stderr
    assert "more than 1,000 derived facts" in result.stderr and "Traceback" not in result.stderr
