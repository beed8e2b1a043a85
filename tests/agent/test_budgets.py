"""Budgets (agent/engine/budget.py): an update over its budget stops, and everything is as before.

Through the engine (random programs and updates with small budgets: every update either equals
the reference evaluator or leaves the reasoner exactly as it was), through the agent (an
exploding bundle is refused with the figures, its version is not recorded, the next one
applies; a bundle whose tries got the agent killed after costing the budget is refused when
redelivered, cheap ones never are), through a real agent process over MQTT (killed as the
kernel's out-of-memory killer or a power cut would), and through the CLI.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import time
from contextlib import closing

import pytest
from hypothesis import HealthCheck, event, given, note, settings
from hypothesis import strategies as st

from agent.budgets.bundle_costs import Account, TryCost
from agent.budgets.stream_budgets import StreamBudgets
from agent.engine import Budget, BudgetExceeded, Program, Reasoner
from agent.engine.errors import RuleError
from agent.engine.program.parser import parse_program
from agent.service import APPLYING
from tests.agent.test_service import make_agent
from tests.support.agent_harness import (
    AgentProcess,
    Cloud,
    StatusWatcher,
    last_error,
    readings_payload,
    run_cli,
    write_config,
)
from tests.support.broker import TestClient
from tests.support.reference import evaluate, from_external, to_external
from tests.support.strategies import incremental_programs, labelled, pool_facts

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


def died_applying(tmp_path, cloud, bundle, account: Account):
    """An agent whose marker says it died applying ``bundle`` with ``account``'s costs."""
    agent = make_agent(tmp_path, cloud, "")
    agent.state.set_meta(APPLYING, account.to_text())
    agent.close()
    return make_agent(tmp_path, cloud, "")


@pytest.mark.parametrize(
    ("cost", "said"),
    [
        (Account("", interrupted=2, seconds=50.0, current=TryCost(seconds=11.0)), "61 seconds"),
        (Account("", interrupted=1, over_memory=True, memory=600 << 20), "600 MiB of memory"),
    ],
)
def test_a_bundle_whose_killed_tries_cost_the_budget_is_refused(tmp_path, cloud, cost, said):
    """A bundle whose tries got the agent killed after costing, together, the time budget (or
    one of them the memory budget) is refused the next time; the stream then takes a full
    state."""
    bundle = cloud.bundle("base", 1, rules={"q": "q: <q>(X) :- <a>(X) ."}, facts=FACTS[:3])
    cost.bundle_id = bundle.bundle_id
    again = died_applying(tmp_path, cloud, bundle, cost)
    outcome = again.handle_bundle(cloud.sign(bundle))
    assert (outcome.status, outcome.reason) == ("refused", "budget_exceeded")
    assert "killed while applying this bundle" in outcome.message and said in outcome.message
    assert again.state.applied_versions() == {} and again.state.get_meta(APPLYING) is None
    full = cloud.bundle("base", 2, full_state=True, facts=FACTS[:3])
    assert again.handle_bundle(cloud.sign(full)).status == "applied"
    again.close()


def test_many_cheap_tries_cut_short_never_make_a_bundle_poison(tmp_path, cloud):
    """Deaths that had cost little (power cuts, restarts, unrelated kills) are not poison,
    however many: the marker counts what the tries cost, not how often the process died."""
    bundle = cloud.bundle("base", 1, rules={"q": "q: <q>(X) :- <a>(X) ."}, facts=FACTS[:3])
    cheap = Account(bundle.bundle_id, interrupted=150, seconds=1.5, memory=100 << 20)
    again = died_applying(tmp_path, cloud, bundle, cheap)
    assert again.handle_bundle(cloud.sign(bundle)).status == "applied"
    assert again.state.get_meta(APPLYING) is None
    again.close()


@pytest.mark.parametrize("marker", ['["{id}", 1]', '["{id}", 2]', '["{id}", 3]', "{id}"])
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


@pytest.mark.process
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
            "agent.engine.cli",
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


# ------------------------------------------------------------------ poison, by what tries cost
COUNT_TO = "num(X) :- <start>(X) .\nnum(Y) :- num(X) and bind(X + 1 as Y) and COMP(X, <, {n}) ."
FOREVER = "num(X) :- <start>(X) .\nnum(Y) :- num(X) and bind(X + 1 as Y) ."


def counting(cloud: Cloud, version: int, text: str):
    """A bundle that counts: 100,000 rounds of one fact each (a second or two of work, far
    within the budgets), or for ever (``FOREVER``: stopped by the time budget)."""
    rules = {f"n{i}": f"n{i}: {line}" for i, line in enumerate(text.splitlines())}
    return cloud.bundle("base", version, rules=rules, facts=[("start", 0)])


def marker_of(database) -> Account | None:
    """The poison-bundle marker in a live agent's file, read beside it."""
    try:
        with closing(sqlite3.connect(f"file:{database}?mode=ro", uri=True, timeout=5)) as conn:
            row = conn.execute("SELECT value FROM meta WHERE key = ?", (APPLYING,)).fetchone()
    except sqlite3.OperationalError:  # (not created yet)
        return None
    return Account.read(row[0]) if row else None


def kill_while_applying(
    agent: AgentProcess, database, bundle_id: str, earlier: int, seconds: float = 0.0
) -> None:
    """Kill -9 the agent while it makes try ``earlier + 1`` at ``bundle_id``, once that try
    has recorded at least ``seconds`` of work (as the kernel's out-of-memory killer, or a
    power cut, would)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        account = marker_of(database)
        if (
            account is not None
            and (account.bundle_id, account.interrupted) == (bundle_id, earlier)
            and account.current.seconds >= seconds
        ):
            agent.kill()
            return
        assert agent.process.poll() is None, agent.log.read_text()
        time.sleep(0.02)
    raise AssertionError(f"the agent never marked try {earlier + 1} at {bundle_id}")


def test_kills_while_a_cheap_bundle_applies_never_refuse_it(tmp_path, make_broker, cloud):
    """Before: three unrelated process deaths while one valid bundle was applied got it
    refused as ``budget_exceeded``. Now those tries cost a fraction of the budgets, so the
    bundle is tried again, whatever the number of deaths, and applies."""
    broker = make_broker()
    config = write_config(tmp_path / "t1", broker, cloud.keys)
    database = tmp_path / "t1" / "t1.db"
    bundle = counting(cloud, 1, COUNT_TO.format(n=100_000))
    with TestClient(broker, "cloud-kills") as client:
        watcher = StatusWatcher(client, "farm1", "t1")
        with AgentProcess(config) as agent:
            watcher.wait(lambda s: s.online)
            client.publish("zodiac/farm1/t1/bundle", cloud.sign(bundle))
            kill_while_applying(agent, database, bundle.bundle_id, 0)
        for earlier in (1, 2):  # (three deaths: as many as the old agent allowed)
            with AgentProcess(config) as agent:
                kill_while_applying(agent, database, bundle.bundle_id, earlier)
        with AgentProcess(config) as agent:
            status = watcher.wait(lambda s: s.online and s.applied.get("base") == 1, timeout=60)
            assert agent.terminate() == 0
    assert status.last_error is None and status.facts == 100_002
    assert marker_of(database) is None


def test_a_bundle_killing_the_agent_is_refused_once_its_tries_cost_the_budget(
    tmp_path, make_broker, cloud
):
    """A bundle that gets the agent killed each time (the test plays the out-of-memory
    killer, 1.5 s into each try) is refused once its tries have cost the time budget in all
    (2.5 s here), without a third try: the stream then waits for its full state."""
    broker = make_broker()
    config = write_config(
        tmp_path / "t1", broker, cloud.keys, extra="[budget]\nmax_update_seconds = 2.5\n"
    )
    database = tmp_path / "t1" / "t1.db"
    bundle = counting(cloud, 1, FOREVER)
    with TestClient(broker, "cloud-oom") as client:
        watcher = StatusWatcher(client, "farm1", "t1")
        with AgentProcess(config) as agent:
            watcher.wait(lambda s: s.online)
            client.publish("zodiac/farm1/t1/bundle", cloud.sign(bundle))
            kill_while_applying(agent, database, bundle.bundle_id, 0, seconds=1.5)
        with AgentProcess(config) as agent:
            kill_while_applying(agent, database, bundle.bundle_id, 1, seconds=1.5)
        with AgentProcess(config) as agent:
            status = watcher.wait(lambda s: last_error(s).get("reason") == "budget_exceeded")
            error = last_error(status)
            assert error["bundle_id"] == bundle.bundle_id and status.applied == {}
            assert "killed while applying this bundle (2 tries) after" in error["message"]
            refusal = agent.wait_log("refused")
            assert refusal.get("seconds") is None  # (refused before any work)
            full = cloud.bundle("base", 2, full_state=True, facts=[("start", 0)])
            client.publish("zodiac/farm1/t1/bundle", cloud.sign(full))
            status = watcher.wait(lambda s: s.applied.get("base") == 2)
            assert agent.terminate() == 0


@pytest.mark.process
def test_a_bundle_over_the_time_budget_is_not_tried_again(tmp_path, cloud):
    """Before: a bundle stopped by the time budget took the whole budget again at each
    delivery. Now the same bundle is refused at once (``budget_exceeded``, saying why), until
    the time budget is raised."""
    bundle = tmp_path / "forever.bundle"
    bundle.write_bytes(cloud.sign(counting(cloud, 1, FOREVER)))
    config = tmp_path / "agent.toml"
    text = (
        f'device = "t1"\nfarm = "farm1"\ndatabase = "t1.db"\n[keys]\ntrusted_keys = "{cloud.keys}"'
        "\n[budget]\nmax_update_seconds = {seconds}\n"
    )
    config.write_text(text.format(seconds=1.0))

    def apply() -> tuple[dict, float]:
        started = time.monotonic()
        result = run_cli("apply", "--config", str(config), str(bundle))
        assert result.returncode == 1 and "Traceback" not in result.stderr
        return json.loads(result.stdout.splitlines()[-1]), time.monotonic() - started

    first, _ = apply()
    assert first["reason"] == "budget_exceeded" and "more than 1 seconds" in first["detail"]
    again, took = apply()
    assert again["reason"] == "budget_exceeded"
    assert "refused without another try" in again["detail"]
    assert "needed more than 1 seconds" in again["detail"]
    assert took < first.get("seconds", 1.0) + 5 and "seconds" not in again
    config.write_text(text.format(seconds=1.5))  # a larger budget: tried again
    raised, _ = apply()
    assert "more than 1.5 seconds" in raised["detail"]
    assert "without another try" not in raised["detail"]


# ------------------------------------------------------------------ budgets per stream
COUNT_RULES = {
    "start": "start: <num>(X) :- <start>(X) .",
    "next": "next: <num>(Y) :- <num>(X) and bind(X + 1 as Y) and COMP(X, <, {n}) .",
}
SENSOR_RULES = {
    "hot": "hot: <Hot>(S) :- <temp>(S, T) and COMP(T, >, 30) .",
    "warm": "warm: <Warm>(S) :- <temp>(S, T) and COMP(T, >, 20) .",
}


def test_each_stream_has_its_own_budget_and_readings_have_headroom(
    tmp_path, make_broker, cloud
):
    """Before: one budget for the whole device, so a valid bundle deriving just under it made
    the device refuse other streams and its own readings (as ``engine``). Now each stream's
    rules have their own limit (``[budget] max_derived_facts``, or its own figure in
    ``[budget.streams]``), the device's own changes have headroom beyond it, and a refusal is
    ``budget_exceeded`` naming the stream with the figures."""
    broker = make_broker()
    budget = '[budget]\nmax_derived_facts = 20000\n[budget.streams]\n"anomaly/y" = 100\n'
    config = write_config(tmp_path / "t1", broker, cloud.keys, extra=budget)
    topic = "zodiac/farm1/t1/bundle"
    count = {name: text.format(n=19_998) for name, text in COUNT_RULES.items()}
    with AgentProcess(config) as agent, TestClient(broker, "cloud-shares") as client:
        watcher = StatusWatcher(client, "farm1", "t1")
        watcher.wait(lambda s: s.online)
        # base's rules derive 19,999 facts: within its 20,000.
        base = cloud.bundle("base", 1, rules={**count, **SENSOR_RULES}, facts=[("start", 0)])
        client.publish(topic, cloud.sign(base))
        status = watcher.wait(lambda s: s.applied.get("base") == 1)
        assert status.facts - status.explicit_facts == 19_999
        # Another stream: its own budget.
        small = {"q": "q: <q>(X) :- <num>(X) and COMP(X, <, 140) ."}
        client.publish(topic, cloud.sign(cloud.bundle("anomaly/x", 1, rules=small)))
        status = watcher.wait(lambda s: s.applied.get("anomaly/x") == 1)
        assert last_error(status) == {}
        # The device's readings grow base's facts past its limit: headroom.
        reading = readings_payload("t1", "farm1", [("temp", "t1", 35)])
        client.publish("zodiac/farm1/t1/readings", reading)
        assert wait_for_fact(config, "<Hot>(X)") == [{"X": "t1"}]
        # base may not grow itself further: refused, naming base and the figures.
        more = cloud.bundle("base", 2, facts=[("start", -5)])
        client.publish(topic, cloud.sign(more))
        status = watcher.wait(lambda s: last_error(s).get("stream") == "base")
        error = last_error(status)
        assert error["reason"] == "budget_exceeded" and status.applied["base"] == 1
        assert "the rules of stream 'base' would hold more than 20,001 derived facts" in (
            error["message"]
        )
        # A stream with its own, smaller figure.
        other = {"r": "r: <r>(X) :- <num>(X) and COMP(X, <, 150) ."}
        client.publish(topic, cloud.sign(cloud.bundle("anomaly/y", 1, rules=other)))
        status = watcher.wait(lambda s: last_error(s).get("stream") == "anomaly/y")
        assert "the rules of stream 'anomaly/y' would hold more than 100 derived facts" in (
            last_error(status)["message"]
        )
        assert status.applied == {"base": 1, "anomaly/x": 1}
        assert agent.terminate() == 0


def wait_for_fact(config, pattern: str, timeout: float = 20) -> list[dict]:
    """Answers to ``pattern`` from the live agent's file (``zodiac-agent query``), once any."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = run_cli("query", "--config", str(config), pattern)
        answers = [json.loads(line) for line in result.stdout.splitlines()]
        if answers:
            return answers
        time.sleep(0.2)
    raise AssertionError(f"no answer to {pattern}")


def test_readings_past_a_streams_headroom_are_refused_as_budget_exceeded(tmp_path, cloud):
    """Readings have headroom beyond a stream's limit, not an unbounded one: past it they are
    refused as ``budget_exceeded`` naming the stream (before: ``engine``), and nothing
    changes."""
    agent = make_agent(tmp_path, cloud, "")
    agent.state.stream_budgets = StreamBudgets(max_derived_facts=100, readings_headroom=0.1)
    count = {name: text.format(n=99) for name, text in COUNT_RULES.items()}
    base = cloud.bundle("base", 1, rules={**count, **SENSOR_RULES}, facts=[("start", 0)])
    assert agent.handle_bundle(cloud.sign(base)).status == "applied"  # 100 facts: its limit
    for i in range(5):  # Hot and Warm: 10 facts more, the headroom
        reading = readings_payload("t1", "farm1", [("temp", f"s{i}", 35)])
        assert agent.record_readings(reading).status == "applied"
    before = state_of(agent.reasoner)
    outcome = agent.record_readings(readings_payload("t1", "farm1", [("temp", "s5", 35)]))
    assert (outcome.status, outcome.reason) == ("refused", "budget_exceeded")
    assert "the rules of stream 'base' would hold more than 110 derived facts" in outcome.message
    assert outcome.report["scope"] == "the rules of stream 'base'"
    assert state_of(agent.reasoner) == before
    cooler = readings_payload("t1", "farm1", [("temp", "s0", 10)])  # (shrinks: applies)
    assert agent.record_readings(cooler).status == "applied"
    agent.close()
