"""Dry-run bundles and reverts on the agent (agent/service.py, agent/budgets/dry_runs.py,
agent/state/stream_history.py), with real keys and real SQLite files.

A dry run is applied in a transaction that is rolled back: the state's logical content (every
table's rows) is as before, and so is the database file itself; only the write-ahead log
differs, by the poison-bundle marker committed before the try and removed after it
(agent/budgets/bundle_costs.py: a dry run that gets the agent killed counts as a try, like a
real bundle). Memory is as before; what it reports equals what the real bundle then does.
A revert brings a stream back to the rules, facts and watches of an earlier version as a new
version, from the device's own bounded history.
"""

from __future__ import annotations

import hashlib
import sqlite3
from pathlib import Path

import msgpack
import pytest

from agent.protocol.messages import Bundle
from agent.service import Agent
from agent.state.agent_state import AgentState
from tests.agent.test_service import make_agent
from tests.support.agent_harness import Cloud

CLOSURE = {
    "r1": "r1: <reach>(X, Y) :- <link>(X, Y) .",
    "r2": "r2: <reach>(X, Z) :- <reach>(X, Y) and <link>(Y, Z) .",
}
LINKS = [("link", f"n{i}", f"n{i + 1}") for i in range(40)]
WATCH = "<reach>(<n0>, X)"


@pytest.fixture
def cloud(tmp_path):
    return Cloud(tmp_path / "cloud")


def dry(bundle: Bundle) -> Bundle:
    return bundle.model_copy(update={"dry_run": True})


def file_bytes(path: Path) -> bytes:
    """The database file (the write-ahead log holds the marker's commits, ``-shm`` is SQLite's
    own index of the log)."""
    return path.read_bytes()


def logical_digest(path: Path) -> str:
    """Every table's rows, as SQLite dumps them, through a separate connection."""
    conn = sqlite3.connect(path)
    try:
        return hashlib.sha256("\n".join(conn.iterdump()).encode()).hexdigest()
    finally:
        conn.close()


def held(agent: Agent) -> tuple:
    """What a device holds: every fact, the explicit ones, rules and watches."""
    return (
        set(agent.reasoner.facts()),
        set(agent.reasoner.edb_facts()),
        {name: rule.key for name, rule in agent.reasoner.rules.items()},
        {p: sorted(s) for p, s in agent.state.watches.items()},
    )


def sizes(agent: Agent) -> dict[str, int]:
    return dict(agent.reasoner.stats()["predicates"])


def test_a_dry_run_changes_nothing_and_reports_what_the_bundle_then_does(tmp_path, cloud):
    agent = make_agent(tmp_path, cloud)
    first = cloud.bundle("base", 1, rules=CLOSURE, facts=LINKS[:20], watches=[WATCH])
    assert agent.handle_bundle(cloud.sign(first)).status == "applied"
    path = tmp_path / "t1.db"
    before_bytes, before_digest, before = file_bytes(path), logical_digest(path), held(agent)
    before_sizes = sizes(agent)
    second = cloud.bundle("base", 2, facts=LINKS[20:], delete_facts=[LINKS[0]])

    outcome = agent.handle_bundle(cloud.sign(dry(second)))

    assert outcome.status == "dry_run" and outcome.committed
    assert file_bytes(path) == before_bytes
    assert logical_digest(path) == before_digest
    assert held(agent) == before
    assert agent.state.applied_versions() == {"base": 1}
    report = agent.status().dry_run
    assert report is not None and report.verdict == "would apply"
    assert (report.bundle_id, report.stream, report.version) == (second.bundle_id, "base", 2)
    assert agent.status().last_error is None
    assert report.seconds > 0 and report.memory_bytes >= 0
    # The real bundle of the same version applies (the dry run did not advance the stream),
    # and does what the dry run said.
    seq_before = agent.state.conn.execute("SELECT max(seq) FROM outbox").fetchone()[0]
    assert agent.handle_bundle(cloud.sign(second)).status == "applied"
    after_sizes = sizes(agent)
    predicted = {p.predicate: (p.before, p.after) for p in report.predicates}
    changed = {
        key: (before_sizes.get(key, 0), after_sizes.get(key, 0))
        for key in before_sizes.keys() | after_sizes.keys()
        if before_sizes.get(key, 0) != after_sizes.get(key, 0)
    }
    assert predicted == changed and "reach/2" in predicted
    assert (report.facts_before, report.facts_after) == (
        sum(before_sizes.values()),
        sum(after_sizes.values()),
    )
    (changes,) = agent.state.conn.execute(
        "SELECT changes FROM outbox WHERE seq > ?", (seq_before,)
    ).fetchone()  # (the real bundle's event: what the dry run said would appear, disappear)
    [[name, appeared, disappeared]] = msgpack.unpackb(changes)
    (watched,) = report.watched
    assert watched.watch == name == WATCH
    assert (watched.appeared, watched.disappeared) == (len(appeared), len(disappeared)) == (0, 20)
    assert watched.disappeared_facts == sorted(disappeared, key=lambda f: repr(tuple(f)))


def test_a_dry_run_reports_the_budget_verdict_and_refusals_without_a_last_error(tmp_path, cloud):
    agent = make_agent(tmp_path, cloud, tables="[budget]\nmax_derived_facts = 1000\n")
    agent.handle_bundle(cloud.sign(cloud.bundle("base", 1, facts=LINKS)))
    path = tmp_path / "t1.db"
    before_bytes, before = file_bytes(path), held(agent)

    over = cloud.bundle(
        "base", 2, rules={**CLOSURE, "p": "p: <pair>(X, Y) :- <link>(X, A) and <link>(Y, B) ."}
    )
    assert agent.handle_bundle(cloud.sign(dry(over))).status == "dry_run"
    report = agent.status().dry_run
    assert report.verdict == "budget_exceeded", report
    assert report.budget["limit"] == "derived_facts" and report.budget["allowed"] == 1000
    assert "the state is as before" in report.message

    gap = cloud.bundle("base", 5, rules=CLOSURE)
    agent.handle_bundle(cloud.sign(dry(gap)))
    assert agent.status().dry_run.verdict == "version_gap"
    duplicate = cloud.bundle("base", 1, rules=CLOSURE)
    agent.handle_bundle(cloud.sign(dry(duplicate)))
    assert agent.status().dry_run.verdict == "duplicate"
    bad = cloud.bundle("base", 2, rules={"b": "b: <q>(X) :- <link>(X, Y) and not <q>(Y) ."})
    agent.handle_bundle(cloud.sign(dry(bad)))
    assert agent.status().dry_run.verdict == "engine", agent.status().dry_run

    assert agent.status().last_error is None  # (answers, not troubles of the device)
    assert file_bytes(path) == before_bytes and held(agent) == before
    within = cloud.bundle("base", 2, rules=CLOSURE)
    assert agent.handle_bundle(cloud.sign(within)).status == "applied"


def test_a_revert_brings_the_stream_back_to_an_earlier_version(tmp_path, cloud):
    agent = make_agent(tmp_path, cloud)
    v1 = cloud.bundle("base", 1, rules=CLOSURE, facts=LINKS[:10], watches=[WATCH])
    agent.handle_bundle(cloud.sign(v1))
    expected = held(agent)
    other = {"o": "o: <far>(X) :- <reach>(<n0>, X) ."}
    v2 = cloud.bundle(
        "base",
        2,
        rules=other,
        delete_rules=["r2"],
        facts=LINKS[10:15],
        delete_facts=LINKS[:3],
        watches=["<far>(X)"],
    )
    assert agent.handle_bundle(cloud.sign(v2)).status == "applied"
    assert held(agent) != expected

    revert = cloud.bundle("base", 3).model_copy(update={"revert_to": 1})
    outcome = agent.handle_bundle(cloud.sign(revert))

    assert outcome.status == "applied", outcome
    assert held(agent) == expected
    assert agent.state.applied_versions() == {"base": 3}
    assert agent.state.kept_versions("base") == [1, 2, 3]
    # As a fresh device given version 1 only, and the same after a restart.
    agent.close()
    (tmp_path / "fresh").mkdir()
    fresh = make_agent(tmp_path / "fresh", cloud)
    fresh.handle_bundle(cloud.sign(v1))
    assert held(fresh) == expected
    fresh.close()
    with AgentState(tmp_path / "t1.db") as state:
        assert state.load_report.how == "loaded"
        assert set(state.reasoner.facts()) == expected[0]


def test_the_history_is_bounded_and_a_revert_beyond_it_is_refused(tmp_path, cloud):
    agent = make_agent(tmp_path, cloud, tables="[limits]\nstream_history = 2\n")
    for version in range(1, 6):
        bundle = cloud.bundle("base", version, facts=[LINKS[version]])
        assert agent.handle_bundle(cloud.sign(bundle)).status == "applied"
    assert agent.state.kept_versions("base") == [4, 5]
    before = held(agent)
    revert = cloud.bundle("base", 6).model_copy(update={"revert_to": 2})
    outcome = agent.handle_bundle(cloud.sign(revert))
    assert outcome.status == "refused" and outcome.reason == "no_history"
    assert "versions [4, 5]" in outcome.message and "stream_history = 2" in outcome.message
    assert held(agent) == before and agent.state.applied_versions() == {"base": 5}
    revert = cloud.bundle("base", 6).model_copy(update={"revert_to": 4})
    assert agent.handle_bundle(cloud.sign(revert)).status == "applied"
    assert set(agent.reasoner.edb_facts()) == {LINKS[1], LINKS[2], LINKS[3], LINKS[4]}
    # A dry run of a revert reports, and changes nothing.
    dry_revert = cloud.bundle("base", 7).model_copy(update={"revert_to": 5, "dry_run": True})
    agent.handle_bundle(cloud.sign(dry_revert))
    report = agent.status().dry_run
    assert report.verdict == "would apply"
    assert [(p.predicate, p.before, p.after) for p in report.predicates] == [("link/2", 4, 5)]
    assert agent.state.applied_versions() == {"base": 6}


@pytest.mark.parametrize(
    "update, message",
    [
        ({"revert_to": 3}, "must be an earlier version"),
        ({"revert_to": 1, "full_state": True}, "a revert carries no operations"),
    ],
)
def test_a_malformed_revert_is_refused_as_invalid(tmp_path, cloud, update, message):
    agent = make_agent(tmp_path, cloud)
    body = cloud.bundle("base", 3).model_dump(mode="python") | update
    outcome = agent.handle_bundle(cloud.sign_body(body))
    assert outcome.status == "refused" and outcome.reason == "invalid"
    assert message in outcome.message


def test_a_revert_brings_back_the_windows_of_that_version(tmp_path, cloud):
    """A stream's windows are part of its content: reverting to a version declares its windows
    again and drops those declared after it (with their facts)."""
    ten = "@window <temp> 10 min as <recentTemp> ."
    two = "@window <temp> 2 min as <lastTemp> ."
    agent = make_agent(tmp_path, cloud)
    v1 = cloud.bundle("base", 1, rules=CLOSURE, windows=[ten])
    assert agent.handle_bundle(cloud.sign(v1)).status == "applied"
    v2 = cloud.bundle("base", 2, windows=[two])
    assert agent.handle_bundle(cloud.sign(v2)).status == "applied"
    assert agent.state.kept_versions("base") == [1, 2]
    assert set(agent.status().windows) == {"lastTemp"}
    revert = cloud.bundle("base", 3).model_copy(update={"revert_to": 1})
    assert agent.handle_bundle(cloud.sign(revert)).status == "applied"
    assert set(agent.status().windows) == {"recentTemp"}
    assert [str(d) for d in agent.state.windows.declarations.values()] == [ten]
