"""Crash safety: ``kill -9`` a real agent process at random points while it applies a stream of
signed bundles and reading batches from the broker, restart it, and check every time that the
SQLite file holds exactly a replay of a committed prefix, and that in the end nothing is lost.

The stream is published up front into the agent's persistent session (QoS 1), so each restarted
process picks up where the last one was killed: messages it had not acknowledged (acknowledgement
follows the commit) are redelivered; a bundle committed but not acknowledged comes back and is a
duplicate (stream version), a reading batch comes back and replaces the same values.

Each reading batch carries every sensor's value plus ``seq(t1, k)``, so the state after batch k
does not depend on earlier batches; each bundle ``v`` carries the next chunk of an edge list for
a transitive closure (and some deletions), and serial numbers that make nodes equal by a key rule
deciding owl:sameAs (classes merge and split), so the prefix applied is read off ``applied`` and
the derived facts must match a from-scratch replay of bundles 1..v.

The same stream runs with the state on a small real disk that fills up (started on a full disk,
filled while working, killed either way, then freed), and with the state file deleted while the
agent works through it (every bundle not applied before is delivered again).
"""

from __future__ import annotations

import random
import sqlite3
import time
from contextlib import closing

from agent.engine import Reasoner
from agent.engine.language import Program
from agent.engine.program.parser import parse_program
from agent.state.agent_state import AgentState
from agent.state.term_rows import load_terms
from tests.support.agent_harness import (
    AgentProcess,
    Cloud,
    StatusWatcher,
    readings_payload,
    run_cli,
    write_config,
)
from tests.support.broker import TestClient

FARM = "farm1"
RULES = {
    "e2p": "e2p: <path>(X, Y) :- <edge>(X, Y) .",
    "tc": "tc: <path>(X, Z) :- <path>(X, Y) and <edge>(Y, Z) .",
    "deg": "deg: <degree>(X, N) :- aggregate(<edge>(X, Y)) on X with count(Y) as N .",
    "hot": "hot: <Hot>(S) :- <temp>(S, T) and COMP(T, >, 25) .",
    # owl:sameAs by a key: nodes sharing a serial are one node (classes merge and split as
    # bundles add and delete serials; agent/engine/equality/layer.py)
    "key": "key: <http://www.w3.org/2002/07/owl#sameAs>(X, Y) :- <serial>(X, S) and "
    "<serial>(Y, S) .",
}
BUNDLES = 20
BATCHES = 20
KILL_ROUNDS = 12
SENSORS = [f"s{i}" for i in range(5)]


def bundle_ops(version: int, rng: random.Random) -> dict:
    """Bundle 1 adds the rules; later ones add a chunk of edges and serials, and delete a few
    old ones."""
    if version == 1:
        return {"rules": RULES, "facts": [("edge", "n0", "n1")]}
    base = version * 12
    facts = [("edge", f"n{rng.randrange(base)}", f"n{rng.randrange(base)}") for _ in range(40)]
    facts += serials(version)
    delete = [("edge", f"n{rng.randrange(base)}", f"n{rng.randrange(base)}") for _ in range(10)]
    delete += serials(version - 2)[:1]  # a class splits (or a name leaves it)
    ops = {"facts": facts, "delete_facts": delete}
    if version == 7:
        ops["delete_rules"] = ["deg"]
    if version == 10:
        ops["rules"] = {"deg": RULES["deg"]}
    return ops


def serials(version: int) -> list[tuple]:
    """Bundle ``version``'s serial numbers: three nodes, few serials, so some nodes share one."""
    if version < 2:
        return []
    rng = random.Random(version)
    base = version * 12
    return [("serial", f"n{rng.randrange(base)}", f"s{rng.randrange(base // 3)}") for _ in range(3)]


def batch(k: int) -> list[tuple]:
    return [("seq", "t1", k)] + [("temp", s, 20 + (k * 7 + i) % 10) for i, s in enumerate(SENSORS)]


def expected_state(ops_by_version: list[dict], applied: int, seq: int | None) -> set:
    reasoner = Reasoner()
    for ops in ops_by_version[:applied]:
        rules = ops.get("rules", {})
        reasoner.update(
            add_rules=Program(rules=tuple(parse_program(t).rules[0] for t in rules.values())),
            delete_rules=[r for r in ops.get("delete_rules", []) if r not in rules],
            add_facts=[f for f in ops.get("facts", []) if f not in ops.get("delete_facts", [])],
            delete_facts=ops.get("delete_facts", []),
        )
    if seq is not None:
        reasoner.add_facts(batch(seq))
    return set(reasoner.facts())


def test_kill_9_at_random_points_loses_nothing_committed(tmp_path, make_broker):
    rng = random.Random(20261121)
    broker = make_broker()
    cloud = Cloud(tmp_path / "cloud")
    config = write_config(tmp_path / "t1", broker, cloud.keys)
    database = tmp_path / "t1" / "t1.db"
    ops_by_version = [bundle_ops(v, rng) for v in range(1, BUNDLES + 1)]
    queue_stream(broker, cloud, config, ops_by_version)
    finished = kill_rounds(config, database, ops_by_version, rng)
    finish(config, database, ops_by_version, finished)


def test_kill_9_with_the_disk_filling_up_loses_nothing_committed(
    tmp_path, make_broker, small_disk
):
    """The same stream with the state on a small real disk (a tmpfs) that fills up: in some
    rounds the agent starts on a full disk, in others the disk fills while it works, and it is
    killed at a random point either way; then space is freed. Every file is still a replay of
    a committed prefix, and in the end nothing is lost: a change the full disk refused was
    never acknowledged, so the broker delivered it again."""
    rng = random.Random(20261122)
    broker = make_broker()
    cloud = Cloud(tmp_path / "cloud")
    database = small_disk.mount / "t1.db"
    config = write_config(tmp_path / "t1", broker, cloud.keys, database=database)
    ops_by_version = [bundle_ops(v, rng) for v in range(1, BUNDLES + 1)]
    queue_stream(broker, cloud, config, ops_by_version)
    refusals = []

    def fill(round_: int, agent: AgentProcess | None, window: float) -> None:
        if round_ % 3 == 2:
            return  # (a round with space)
        if agent is None:  # (before the start)
            checkpoint(database)  # (a log being reused takes no new space: empty it first)
            if round_ % 3 == 0:  # (a start on a full disk: refused, saying so)
                small_disk.fill()
                refused = run_cli("run", "--config", str(config), timeout=60)
                assert refused.returncode == 1 and "its disk is full" in refused.stderr
                small_disk.free()
            return
        checkpoint(database)  # (the disk fills while it works, and its next write needs space)
        small_disk.fill()
        time.sleep(rng.uniform(0.1, 0.1 + window))  # (it tries a few messages meanwhile)

    def free(agent: AgentProcess) -> None:
        refusals.extend(e for e in agent.log_lines() if e.get("reason") == "state")
        small_disk.free()

    finished = kill_rounds(config, database, ops_by_version, rng, disturb=fill, after=free)
    assert refusals, "the full disk never refused a change: the test proved nothing"
    finish(config, database, ops_by_version, finished)


def test_a_state_file_deleted_mid_stream_loses_no_unacknowledged_bundle(tmp_path, make_broker):
    """The state file deleted while the agent works through the stream: the agent stops by
    itself (exit 1); every bundle it had not logged as applied is delivered again to the
    restarted agent (a new empty state, so they are version gaps), none it had applied comes
    back (they were acknowledged, into the file the operator deleted), and the stream's full
    state then brings the device to the same state as a replay of the whole stream."""
    rng = random.Random(20261123)
    broker = make_broker()
    cloud = Cloud(tmp_path / "cloud")
    config = write_config(tmp_path / "t1", broker, cloud.keys)
    database = tmp_path / "t1" / "t1.db"
    ops_by_version = [bundle_ops(v, rng) for v in range(1, BUNDLES + 1)]
    bundles = queue_stream(broker, cloud, config, ops_by_version)
    with AgentProcess(config) as agent:
        agent.wait_log("connected", timeout=30)
        wait_until(lambda: committed_prefix(database)[0] >= 3, timeout=60)
        database.unlink()
        assert agent.process.wait(30) == 1
        applied = [e["bundle_id"] for e in agent.log_lines() if e.get("status") == "applied"]
    versions = sorted(int(bundle_id.split("-")[1]) for bundle_id in applied)
    assert versions == list(range(1, len(versions) + 1)) and len(versions) < BUNDLES
    unacknowledged = {b.bundle_id for b in bundles[len(versions) :]}
    with AgentProcess(config) as agent, TestClient(broker, "cloud-del") as client:
        agent.wait_log("connected", timeout=30)
        wait_until(lambda: unacknowledged <= bundle_ids_seen(agent), timeout=60)
        assert bundle_ids_seen(agent) == unacknowledged
        full = full_state(cloud, ops_by_version, BUNDLES + 1)
        for bundle in full:
            client.publish(f"zodiac/{FARM}/t1/bundle", cloud.sign(bundle))
        last = full[-1].version
        wait_until(lambda: committed_prefix(database)[0] == last, timeout=60)
        assert agent.terminate() == 0
    with AgentState(database) as state:  # (the stream's part: readings left aside)
        held = {f for f in state.reasoner.facts() if not from_readings(f)}
    replay = expected_state(ops_by_version, BUNDLES, None)
    assert held == {f for f in replay if not from_readings(f)}


def queue_stream(broker, cloud: Cloud, config, ops_by_version: list[dict]) -> list:
    """Start the agent once (its persistent session), stop it, and queue the whole stream in
    the session: bundle 1..BUNDLES and reading batches 0..BATCHES-1, interleaved. Returns
    the bundles."""
    bundles = []
    with AgentProcess(config) as agent, TestClient(broker, "cloud-1") as client:
        StatusWatcher(client, FARM, "t1").wait(lambda s: s.online)
        agent.kill()
        for i in range(max(BUNDLES, BATCHES)):
            if i < BUNDLES:
                ops = ops_by_version[i]
                bundle = cloud.bundle(
                    "base",
                    i + 1,
                    rules=ops.get("rules"),
                    delete_rules=ops.get("delete_rules"),
                    facts=ops.get("facts"),
                    delete_facts=ops.get("delete_facts"),
                )
                bundles.append(bundle)
                client.publish(f"zodiac/{FARM}/t1/bundle", cloud.sign(bundle))
            if i < BATCHES:
                client.publish(f"zodiac/{FARM}/t1/readings", readings_payload("t1", FARM, batch(i)))
    return bundles


def kill_rounds(config, database, ops_by_version, rng, *, disturb=None, after=None) -> bool:
    """Kill rounds: each restarted process is killed at a random point, and the file checked
    to be a committed prefix. A round that makes no progress (slow machine: the process spent
    its time starting) doubles the window, so the kill points keep landing mid-stream on
    machines of any speed. ``disturb(round, agent, window)`` runs before each start (agent
    None) and before each kill; ``after(agent)`` after each kill. True if the stream was
    done."""
    kills_mid_stream = 0
    seen_prefixes = set()
    window = 0.06  # seconds after "connected"; a few messages take ~10 ms each on a fast machine
    finished = False
    for round_ in range(KILL_ROUNDS):
        if disturb is not None:
            disturb(round_, None, window)
        with AgentProcess(config) as agent:
            agent.wait_log("connected", timeout=30)
            time.sleep(rng.uniform(0.0, window))
            if disturb is not None:
                disturb(round_, agent, window)
            agent.kill()
        if after is not None:
            after(agent)
        prefix = check_committed_prefix(database, ops_by_version)
        if prefix in seen_prefixes or prefix == (0, None):
            window *= 2
        seen_prefixes.add(prefix)
        if prefix == (BUNDLES, BATCHES - 1):
            finished = True
            break
        kills_mid_stream += 1
    print(f"kill points (bundles applied, last batch): {sorted(seen_prefixes, key=str)}")
    assert kills_mid_stream >= 3, f"too few kills landed mid-stream: {sorted(seen_prefixes)}"
    return finished


def finish(config, database, ops_by_version, finished: bool) -> None:
    """One undisturbed run takes the rest of the stream: nothing queued may be lost."""
    if not finished:
        with AgentProcess(config) as agent:
            agent.wait_log("connected", timeout=30)
            wait_until(lambda: committed_prefix(database) == (BUNDLES, BATCHES - 1), timeout=120)
            agent.terminate()
    assert check_committed_prefix(database, ops_by_version) == (BUNDLES, BATCHES - 1)


def full_state(cloud: Cloud, ops_by_version: list[dict], version: int) -> list:
    """The stream's full state after all its bundles: a ``full_state`` bundle, then as many
    bundles as its facts need to stay within the agent's bundle size."""
    rules: dict[str, str] = {}
    facts: set = set()
    for ops in ops_by_version:
        for name in ops.get("delete_rules", []):
            rules.pop(name, None)
        rules.update(ops.get("rules", {}))
        added = [f for f in ops.get("facts", []) if f not in ops.get("delete_facts", [])]
        facts = (facts - set(ops.get("delete_facts", []))) | set(added)
    facts = sorted(facts, key=repr)
    chunks = [facts[start : start + 200] for start in range(0, len(facts), 200)] or [[]]
    first = cloud.bundle("base", version, rules=rules, facts=chunks[0], full_state=True)
    rest = [cloud.bundle("base", version + i, facts=c) for i, c in enumerate(chunks[1:], 1)]
    return [first, *rest]


def from_readings(fact: tuple) -> bool:
    """A reading, or a fact derived from one (the rule ``hot``)."""
    return fact[0] in ("seq", "temp") or fact[-1] == "Hot"


def bundle_ids_seen(agent: AgentProcess) -> set[str]:
    return {e["bundle_id"] for e in agent.log_lines() if e.get("bundle_id")}


def checkpoint(database) -> None:
    """Empty the live agent's write-ahead log into its file from the test's side, as SQLite's
    own checkpoints do (busy: left as it is)."""
    with closing(sqlite3.connect(database, timeout=10)) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()


def check_committed_prefix(database, ops_by_version: list[dict]) -> tuple[int, int | None]:
    """Load the agent's file as a restart would and check it equals a replay of what it claims
    to have committed: bundles 1..applied and reading batch ``seq``. Returns (applied, seq)."""
    with AgentState(database) as state:
        assert state.load_report.how == "loaded"
        applied = state.applied_versions().get("base", 0)
        seqs = [f[2] for f in state.reasoner.facts("seq")]
        assert len(seqs) <= 1
        seq = seqs[0] if seqs else None
        assert set(state.reasoner.facts()) == expected_state(ops_by_version, applied, seq), (
            f"state after kill does not equal the committed prefix (bundles 1..{applied}, "
            f"batch {seq})"
        )
    return applied, seq


def committed_prefix(database) -> tuple[int, int | None]:
    """(applied bundle version, last reading batch) read from the live agent's file, read-only
    (SQLite lets a reader in beside the writer), without loading the state."""
    with closing(sqlite3.connect(f"file:{database}?mode=ro", uri=True, timeout=5)) as conn:
        version = conn.execute("SELECT version FROM streams WHERE stream = 'base'").fetchone()
        seq = conn.execute(  # (one seq fact: its chunk's largest object is its value's id)
            "SELECT e.high FROM explicit e JOIN relations r ON r.id = e.rel WHERE r.name = 'seq'"
        ).fetchone()
        terms = load_terms(conn) if seq else []
    return (version[0] if version else 0), (int(terms[seq[0]]) if seq else None)


def wait_until(condition, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout} s")
        time.sleep(0.1)
