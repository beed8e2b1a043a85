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
"""

from __future__ import annotations

import random
import sqlite3
import time
from contextlib import closing

from agent.engine import Reasoner
from agent.engine.language import Program
from agent.engine.parser import parse_program
from agent.persistence import AgentState
from agent.term_rows import load_terms
from tests.agent_harness import AgentProcess, Cloud, StatusWatcher, readings_payload, write_config
from tests.broker import TestClient

FARM = "farm1"
RULES = {
    "e2p": "e2p: <path>(X, Y) :- <edge>(X, Y) .",
    "tc": "tc: <path>(X, Z) :- <path>(X, Y) and <edge>(Y, Z) .",
    "deg": "deg: <degree>(X, N) :- aggregate(<edge>(X, Y)) on X with count(Y) as N .",
    "hot": "hot: <Hot>(S) :- <temp>(S, T) and COMP(T, >, 25) .",
    # owl:sameAs by a key: nodes sharing a serial are one node (classes merge and split as
    # bundles add and delete serials; agent/engine/equality.py)
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

    # First start creates the persistent session; then the whole stream is queued in it.
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
                client.publish(f"zodiac/{FARM}/t1/bundle", cloud.sign(bundle))
            if i < BATCHES:
                client.publish(f"zodiac/{FARM}/t1/readings", readings_payload("t1", FARM, batch(i)))

    # Kill rounds: each restarted process is killed at a random point. A round that makes no
    # progress (slow machine: the process spent its time starting) doubles the window, so the
    # kill points keep landing mid-stream on machines of any speed.
    kills_mid_stream = 0
    seen_prefixes = set()
    window = 0.06  # seconds after "connected"; a few messages take ~10 ms each on a fast machine
    finished = False
    for _round in range(KILL_ROUNDS):
        with AgentProcess(config) as agent:
            agent.wait_log("connected", timeout=30)
            time.sleep(rng.uniform(0.0, window))
            agent.kill()
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

    # Then one undisturbed run takes the rest of the stream: nothing queued may be lost.
    if not finished:
        with AgentProcess(config) as agent:
            agent.wait_log("connected", timeout=30)
            wait_until(lambda: committed_prefix(database) == (BUNDLES, BATCHES - 1), timeout=120)
            agent.terminate()
    assert check_committed_prefix(database, ops_by_version) == (BUNDLES, BATCHES - 1)


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
