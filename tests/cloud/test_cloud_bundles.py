"""Bundle cutting (cloud/bundles.py): differences, versions across restarts, full state, release,
checked by applying every cut bundle to a real agent state (no Spark, no broker)."""

from __future__ import annotations

import json
import sqlite3

import sqlite_utils
from sqlite_utils import plugins

from agent.protocol.signing import sign_bundle
from cloud.bundles import BundleCutter, SentFullState, Target, device_facts, load_streams
from tests.agent.test_service import make_agent
from tests.support.agent_harness import Cloud

RULES = {
    "hot": "hot: <Hot>(X) :- <temp>(X, T) and COMP(T, >, 30) .",
    "warm": "warm: <Warm>(X) :- <temp>(X, T) and COMP(T, >, 20) .",
}


def test_cuts_are_differences_and_reach_the_target(tmp_path):
    cloud = Cloud(tmp_path / "cloud")
    agent = make_agent(tmp_path, cloud)
    cutter = BundleCutter(tmp_path / "cutter.db", "farm1")
    targets = [
        Target(rules=dict(RULES), facts={("temp", "a", 35), ("temp", "b", 25)}),
        Target(rules={"hot": RULES["hot"]}, facts={("temp", "a", 35), ("temp", "c", 40)}),
        Target(rules={"hot": "hot: <Hot>(X) :- <temp>(X, T) ."}, facts={("temp", "c", 40)}),
    ]
    for number, target in enumerate(targets, start=1):
        bundle = cutter.cut("t1", "base", target)
        assert bundle is not None and bundle.version == number and not bundle.full_state
        outcome = agent.handle_bundle(sign_bundle(bundle, cloud.private, cloud.key_id))
        assert outcome.status == "applied", outcome.message
        assert set(agent.reasoner.rules) == set(target.rules)
        assert set(agent.reasoner.facts("temp")) == target.facts
    assert cutter.cut("t1", "base", targets[-1]) is None  # nothing changed: no bundle
    assert agent.reasoner.query("<Hot>(X)") == [{"X": "c"}]
    agent.close()


def test_versions_continue_after_restart_and_full_state_recovers_a_gap(tmp_path):
    cloud = Cloud(tmp_path / "cloud")
    agent = make_agent(tmp_path, cloud)
    cutter = BundleCutter(tmp_path / "cutter.db", "farm1")
    first = cutter.cut("t1", "base", Target(rules=dict(RULES), facts={("temp", "a", 35)}))
    agent.handle_bundle(sign_bundle(first, cloud.private, cloud.key_id))
    cutter = BundleCutter(tmp_path / "cutter.db", "farm1")  # publisher restarted
    second = cutter.cut("t1", "base", Target(rules=dict(RULES), facts={("temp", "b", 33)}))
    assert second.version == 2
    # The device misses version 2; version 3 is refused as a gap ...
    third = cutter.cut("t1", "base", Target(rules=dict(RULES), facts={("temp", "c", 31)}))
    refused = agent.handle_bundle(sign_bundle(third, cloud.private, cloud.key_id))
    assert refused.status == "refused" and refused.reason == "version_gap"
    # ... and the full state brings it to the target.
    full = cutter.full_state("t1", "base")
    assert full.full_state and full.version == 4
    assert agent.handle_bundle(sign_bundle(full, cloud.private, cloud.key_id)).status == "applied"
    assert set(agent.reasoner.facts("temp")) == {("temp", "c", 31)}
    release = cutter.release("t1", "base")
    assert (
        agent.handle_bundle(sign_bundle(release, cloud.private, cloud.key_id)).status == "applied"
    )
    assert agent.reasoner.rules == {} and set(agent.reasoner.facts("temp")) == set()
    agent.close()


def test_a_ledger_written_by_earlier_publishers_is_read_and_continued(tmp_path):
    """Earlier publishers kept their ledger through sqlite-utils: the table as it made it (its
    DDL, a row at version 3) is read as it is, and the next bundle is version 4."""
    path = tmp_path / "cutter.db"
    conn = sqlite3.connect(path)
    conn.execute(
        "CREATE TABLE [sent] ([device] TEXT, [stream] TEXT, [version] INTEGER, [target] TEXT, "
        "[at] FLOAT, PRIMARY KEY ([device], [stream]))"
    )
    target = {"rules": {"hot": RULES["hot"]}, "facts": []}
    conn.execute("INSERT INTO sent VALUES ('t1', 'base', 3, ?, 1.0)", (json.dumps(target),))
    conn.commit()
    conn.close()
    cutter = BundleCutter(path, "farm1")
    assert cutter.version("t1", "base") == 3
    assert cutter.last_target("t1", "base") == Target(rules={"hot": RULES["hot"]})
    bundle = cutter.cut("t1", "base", Target(rules=dict(RULES)))
    assert bundle is not None and bundle.version == 4
    assert [type(operation).__name__ for operation in bundle.operations] == ["AddRules"]
    assert BundleCutter(path, "farm1").version("t1", "base") == 4  # (saved)
    assert cutter.version("t2", "base") == 0


def test_a_ledger_written_with_plain_sqlite3_is_read_and_continued(tmp_path):
    """Publishers that wrote the ledger with plain sqlite3 made both tables with this DDL: the
    sqlite-utils ledger opens such a file as it is and continues both sequences."""
    path = tmp_path / "cutter.db"
    conn = sqlite3.connect(path)
    conn.execute(
        "CREATE TABLE sent (device TEXT, stream TEXT, version INTEGER, target TEXT, at FLOAT, "
        "PRIMARY KEY (device, stream))"
    )
    conn.execute(
        "CREATE TABLE full_states (device TEXT, stream TEXT, version INTEGER, at FLOAT, "
        "PRIMARY KEY (device, stream))"
    )
    target = {"rules": {"hot": RULES["hot"]}, "facts": []}
    conn.execute("INSERT INTO sent VALUES ('t1', 'base', 5, ?, 1.0)", (json.dumps(target),))
    conn.execute("INSERT INTO full_states VALUES ('t1', 'base', 4, 0.5)")
    conn.commit()
    conn.close()
    cutter = BundleCutter(path, "farm1")
    assert cutter.last_full_state("t1", "base") == SentFullState(4, 0.5)
    assert cutter.last_sent_at("t1", "base") == 1.0
    full = cutter.full_state("t1", "base")
    assert full.version == 6 and full.full_state
    reopened = BundleCutter(path, "farm1")
    assert reopened.last_full_state("t1", "base").version == 6
    assert reopened.last_target("t1", "base") == Target(rules={"hot": RULES["hot"]})


class _Plugin:
    """A sqlite-utils plugin that marks every connection it is given."""

    def __init__(self) -> None:
        self.connections: list[sqlite3.Connection] = []

    @sqlite_utils.hookimpl
    def prepare_connection(self, conn: sqlite3.Connection) -> None:
        self.connections.append(conn)


def test_the_ledger_runs_no_sqlite_utils_plugin(tmp_path):
    """An installed plugin gets no hook on the ledger's connection (``execute_plugins=False``);
    the same plugin does get one on a default `Database`, so the check is real."""
    plugin = _Plugin()
    plugins.pm.register(plugin, name="zodiac-test-plugin")
    try:
        sqlite_utils.Database(tmp_path / "other.db")
        assert len(plugin.connections) == 1
        cutter = BundleCutter(tmp_path / "cutter.db", "farm1")
        cutter.cut("t1", "base", Target(rules=dict(RULES)))
        assert isinstance(cutter.db, sqlite_utils.Database)
        assert cutter.conn not in plugin.connections and len(plugin.connections) == 1
    finally:
        plugins.pm.unregister(name="zodiac-test-plugin")


def test_streams_are_loaded_from_rule_files(tmp_path):
    (tmp_path / "anomaly").mkdir()
    (tmp_path / "base.rules").write_text(RULES["hot"] + "\n")
    (tmp_path / "anomaly" / "ambient-temperature.rules").write_text(RULES["warm"] + "\n")
    streams = load_streams(tmp_path)
    assert set(streams) == {"base", "anomaly/ambient-temperature"}
    assert set(streams["base"]) == {"hot"}


def test_device_facts_are_its_own_and_its_neighbours():
    rdf_type = "http://www.w3.org/1999/02/22-rdf-syntax-ns#type"
    farm = [
        ("nb", "t1", "t2"),
        ("nb", "t2", "t1"),
        ("nb", "t2", "t3"),
        ("nb", "t3", "t2"),
        ("model", "t1", "V90"),
        ("model", "t2", "V90"),
        ("model", "t3", "V112"),
        (rdf_type, "t2", "Turbine"),
        (rdf_type, "t3", "Turbine"),
    ]
    assert device_facts(farm, "t1", "nb") == {
        ("nb", "t1", "t2"),
        ("nb", "t2", "t1"),
        ("nb", "t2", "t3"),
        ("model", "t1", "V90"),
        ("model", "t2", "V90"),
        (rdf_type, "t2", "Turbine"),
    }


def test_facts_for_cuts_the_device_its_neighbourhood_or_all():
    """publish/bundle --facts: all of the graph by default (publish sent none without
    --neighbour-predicate), the neighbourhood with it, the device's own with --own-facts."""
    from cloud.bundles import facts_for

    graph = [
        ("hasNeighbour", "t1", "t2"),
        ("hasNeighbour", "t2", "t1"),
        ("forecast", "t1", 15.0),
        ("forecast", "t2", 15.0),
        ("forecast", "t3", 15.0),
    ]
    assert facts_for(graph, "t1") == set(graph)
    assert facts_for(graph, "t1", "hasNeighbour") == set(graph) - {("forecast", "t3", 15.0)}
    own = {("hasNeighbour", "t1", "t2"), ("forecast", "t1", 15.0)}
    assert facts_for(graph, "t1", "hasNeighbour", own_only=True) == own
    assert facts_for(iter(graph), "t1", own_only=True) == own
