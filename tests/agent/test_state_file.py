"""The state file as operators meet it: a path that is a symbolic link (a volume not mounted
yet at boot, a loop), a file deleted or replaced under a running agent, a full disk.

Every case drives the real entry points: ``zodiac-agent`` as a process (``run_cli``,
``AgentProcess``), MQTT through a private Mosquitto, SQLite files on disk, and a real small
filesystem (a tmpfs) for the full disk.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
from contextlib import closing
from pathlib import Path

import pytest

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

CONFIG = """device = "t1"
farm = "farm1"
database = "{database}"
[keys]
trusted_keys = "{keys}"
"""


@pytest.fixture
def cloud(tmp_path):
    return Cloud(tmp_path / "cloud")


def config_file(directory: Path, cloud: Cloud, database: str | Path) -> Path:
    path = directory / "agent.toml"
    path.write_text(CONFIG.format(database=database, keys=cloud.keys))
    return path


def listing(directory: Path) -> dict[str, str]:
    """Every entry under ``directory``: a link by its target, a file by its size."""
    found = {}
    for place in sorted(directory.rglob("*")):
        name = str(place.relative_to(directory))
        if place.is_symlink():
            found[name] = f"-> {os.readlink(place)}"
        elif place.is_file():
            found[name] = f"{place.stat().st_size} bytes"
    return found


# ------------------------------------------------------------------ a path that is a link
def dangling(directory: Path) -> Path:
    """The state's path links to a volume that is not mounted (its folder does not exist)."""
    link = directory / "agent.db"
    link.symlink_to(directory / "volume" / "agent.db")
    return link


def loop(directory: Path) -> Path:
    link = directory / "agent.db"
    link.symlink_to(directory / "other.db")
    (directory / "other.db").symlink_to(link)
    return link


def dangling_folder(directory: Path) -> Path:
    """The state's folder is a link to a volume not mounted."""
    (directory / "data").symlink_to(directory / "volume")
    return directory / "data" / "agent.db"


@pytest.mark.process
@pytest.mark.parametrize("make_path", [dangling, loop, dangling_folder])
def test_a_state_path_that_is_a_broken_link_is_refused_and_left_alone(tmp_path, cloud, make_path):
    """Before: a dangling link (or a loop) was replaced by a new empty state, abandoning the
    real one and deleting the operator's link. Now every command refuses it with one line
    (exit 2; ``status``, a health check, says unhealthy: exit 1) and leaves it as it is."""
    site = tmp_path / "site"
    site.mkdir()
    database = make_path(site)
    config = config_file(tmp_path, cloud, database)
    bundle = tmp_path / "b.bundle"
    bundle.write_bytes(cloud.sign(cloud.bundle("base", 1, facts=[("a", "x")])))
    before = listing(site)
    for argv in (["run"], ["apply", bundle], ["query", "<a>(X)"]):
        result = run_cli(argv[0], "--config", str(config), *map(str, argv[1:]))
        assert result.returncode == 2, (argv, result.stderr)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
        assert "symbolic link" in lines[0] and "does not create a state" in lines[0]
        assert listing(site) == before
    status = run_cli("status", "--config", str(config))
    assert status.returncode == 1 and "Traceback" not in status.stderr
    report = json.loads(status.stdout)
    assert report["healthy"] is False and "symbolic link" in report["error"]
    assert ("loop" in report["error"]) == (make_path is loop)
    assert listing(site) == before


@pytest.mark.process
def test_a_state_behind_a_link_is_created_where_the_link_leads(tmp_path, cloud):
    """A link to a mounted volume is followed: the state (and SQLite's -wal and -shm) live
    on the volume, and the link stays a link."""
    volume = tmp_path / "volume"
    volume.mkdir()
    (volume / "agent.db").touch()  # (an empty file left there: taken as no state yet)
    site = tmp_path / "site"
    site.mkdir()
    (site / "agent.db").symlink_to(volume / "agent.db")
    config = config_file(tmp_path, cloud, site / "agent.db")
    bundle = tmp_path / "b.bundle"
    bundle.write_bytes(cloud.sign(cloud.bundle("base", 1, facts=[("a", "x")])))
    result = run_cli("apply", "--config", str(config), str(bundle))
    assert result.returncode == 0, result.stderr
    assert listing(site) == {"agent.db": f"-> {volume / 'agent.db'}"}
    assert (volume / "agent.db").stat().st_size > 0
    status = json.loads(run_cli("status", "--config", str(config)).stdout)
    assert status["healthy"] and status["applied"] == {"base": 1}


# ------------------------------------------------------------------ a file deleted under the agent
def bundle_ids_seen(agent: AgentProcess) -> list[str]:
    """The bundle ids an agent process logged an outcome for, in order."""
    return [line["bundle_id"] for line in agent.log_lines() if line.get("bundle_id")]


def test_a_state_file_deleted_under_a_running_agent_acknowledges_nothing_more(
    tmp_path, make_broker, cloud
):
    """Before: bundles v2 and v3 were applied, acknowledged and reported into the deleted
    file (lost at the restart), and the leftover -wal/-shm then stopped the restart with a
    misleading message. Now the agent notices that the path no longer names its file, stops
    (exit 1, one line) without acknowledging anything more, removes its own -wal and -shm,
    and the restart is a first start: the broker redelivers v2 and v3, which the new empty
    state refuses as a version gap, and the stream's full state applies."""
    broker = make_broker()
    config = write_config(tmp_path / "t1", broker, cloud.keys)
    database = tmp_path / "t1" / "t1.db"
    topic = "zodiac/farm1/t1/bundle"
    with TestClient(broker, "cloud-del") as client:
        watcher = StatusWatcher(client, "farm1", "t1")
        with AgentProcess(config) as agent:
            watcher.wait(lambda s: s.online)
            client.publish(topic, cloud.sign(cloud.bundle("base", 1, facts=[("a", "x1")])))
            watcher.wait(lambda s: s.applied.get("base") == 1)
            database.unlink()
            later = [cloud.bundle("base", v, facts=[("a", f"x{v}")]) for v in (2, 3)]
            for bundle in later:
                client.publish(topic, cloud.sign(bundle))
            assert agent.process.wait(20) == 1
            log = agent.log.read_text()
            assert "deleted or moved away while the agent had it open" in log
            assert not [e for e in agent.log_lines() if e.get("status") == "applied"][1:]
        offline = watcher.wait(lambda s: not s.online)
        assert offline.applied == {"base": 1}
        assert "state file was deleted" in last_error(offline)["message"]
        assert sorted(p.name for p in database.parent.glob("t1.db*")) == []
        with AgentProcess(config) as agent:
            agent.wait_log("connected", timeout=30)
            for bundle in later:  # never acknowledged: delivered again
                gap = agent.wait_log("refused", count=later.index(bundle) + 1)
                assert (gap["bundle_id"], gap["reason"]) == (bundle.bundle_id, "version_gap")
            full = cloud.bundle("base", 4, full_state=True, facts=[("a", "x4")])
            client.publish(topic, cloud.sign(full))
            status = watcher.wait(lambda s: s.applied.get("base") == 4)
            assert status.explicit_facts == 1
            assert agent.terminate() == 0


def test_a_change_after_the_file_is_replaced_is_refused_unacknowledged(tmp_path, cloud):
    """The check before (and after) every commit: a bundle arriving after the file was
    replaced is a ``state`` refusal (not acknowledged over MQTT), and the replacement is
    left as it was."""
    agent = make_agent(tmp_path, cloud)
    first = cloud.bundle("base", 1, facts=[("a", "x")])
    assert agent.handle_bundle(cloud.sign(first)).status == "applied"
    database = tmp_path / "t1.db"
    replacement = tmp_path / "copy.db"
    replacement.write_bytes(b"an operator's copy")
    os.replace(replacement, database)
    outcome = agent.handle_bundle(cloud.sign(cloud.bundle("base", 2, facts=[("a", "y")])))
    assert (outcome.status, outcome.reason) == ("refused", "state")
    assert not outcome.committed and "replaced by another file" in outcome.message
    agent.close()
    assert database.read_bytes() == b"an operator's copy"
    assert sorted(p.name for p in tmp_path.glob("t1.db*")) == ["t1.db"]


def test_a_log_left_by_a_deleted_state_is_explained_at_start(tmp_path, make_broker, cloud):
    """An agent killed before it noticed that its file was deleted leaves the -wal and -shm
    beside the path. The next start (and ``status``) says what they are and what to do, and
    touches neither; done as it says, the agent starts."""
    broker = make_broker()
    config = write_config(tmp_path / "t1", broker, cloud.keys)
    database = tmp_path / "t1" / "t1.db"
    with TestClient(broker, "cloud-left") as client, AgentProcess(config) as agent:
        watcher = StatusWatcher(client, "farm1", "t1")
        watcher.wait(lambda s: s.online)
        client.publish("zodiac/farm1/t1/bundle", cloud.sign(cloud.bundle("base", 1)))
        watcher.wait(lambda s: s.applied.get("base") == 1)
        agent.process.send_signal(signal.SIGSTOP)  # (so that it cannot notice first)
        database.unlink()
        agent.kill()
    left = listing(database.parent)
    assert {"t1.db-wal", "t1.db-shm"} <= set(left) and "t1.db" not in left
    run = run_cli("run", "--config", str(config), timeout=30)
    assert run.returncode == 1 and "Traceback" not in run.stderr
    line = run.stderr.strip().splitlines()[-1]
    assert "the state file is missing, but its write-ahead log t1.db-wal" in line
    assert "move it back" in line and f"delete {database}-wal and {database}-shm" in line
    status = run_cli("status", "--config", str(config))
    assert status.returncode == 1 and "write-ahead log" in json.loads(status.stdout)["error"]
    assert listing(database.parent) == left
    for name in ("t1.db-wal", "t1.db-shm"):
        (database.parent / name).unlink()
    with AgentProcess(config) as agent:
        agent.wait_log("connected", timeout=30)
        assert agent.terminate() == 0


# ------------------------------------------------------------------ a full disk
def checkpoint(database: Path) -> None:
    """Empty the live agent's write-ahead log into its file, as SQLite's own checkpoints do,
    from a connection of the test: the agent's next commit then needs new space on the disk
    (a log being reused takes none)."""
    with closing(sqlite3.connect(database, timeout=10)) as conn:
        busy, *_ = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
    assert busy == 0


def wide_facts(tag: str, count: int = 40) -> list[tuple]:
    """Facts of a few kB that need new pages in the state."""
    return [("note", f"{tag}{i}", f"{tag}-{i}-" + "w" * 200) for i in range(count)]


def test_a_full_disk_loses_no_acknowledged_message(tmp_path, make_broker, cloud, small_disk):
    """Before: on a full disk the bundle marker's write raised, the service logged "internal
    error" and acknowledged the bundle; freed and restarted, the device was still at the old
    version. Now every write a bundle or a reading needs is a ``state`` refusal, reported in
    the status (from memory: the disk cannot take it), never acknowledged: the agent keeps
    running and tries the message again, so it applies once space is freed, and the messages
    behind it follow in order; killed while the disk is full, the restarted agent gets the
    message again from the broker."""
    broker = make_broker()
    database = small_disk.mount / "t1.db"
    config = write_config(tmp_path / "t1", broker, cloud.keys, database=database)
    topic = "zodiac/farm1/t1/bundle"
    with TestClient(broker, "cloud-full") as client:
        watcher = StatusWatcher(client, "farm1", "t1")
        with AgentProcess(config) as agent:
            watcher.wait(lambda s: s.online)
            client.publish(topic, cloud.sign(cloud.bundle("base", 1, facts=wide_facts("a"))))
            watcher.wait(lambda s: s.applied.get("base") == 1)
            checkpoint(database)
            small_disk.fill()
            second = cloud.bundle("base", 2, facts=wide_facts("b"))
            client.publish(topic, cloud.sign(second))
            reading = readings_payload("t1", "farm1", [("temp", "t1", 21)])
            client.publish("zodiac/farm1/t1/readings", reading)
            status = watcher.wait(lambda s: last_error(s).get("reason") == "state")
            assert status.online and status.applied == {"base": 1}
            assert last_error(status)["bundle_id"] == second.bundle_id
            assert "disk is full" in last_error(status)["message"]
            assert agent.process.poll() is None
            small_disk.free()
            status = watcher.wait(lambda s: s.applied.get("base") == 2, timeout=30)
            assert status.explicit_facts == 80
            # Full again, and this time the agent is killed before space is freed.
            checkpoint(database)
            small_disk.fill()
            reading = readings_payload("t1", "farm1", [("temp", "t1", 22)])
            client.publish("zodiac/farm1/t1/readings", reading)
            third = cloud.bundle("base", 3, facts=wide_facts("c"))
            client.publish(topic, cloud.sign(third))
            status = watcher.wait(lambda s: last_error(s).get("reason") == "state")
            assert last_error(status)["stream"] == "sensor"
            agent.kill()
        small_disk.free()
        with AgentProcess(config) as agent:
            status = watcher.wait(lambda s: s.online and s.applied.get("base") == 3, timeout=30)
            assert agent.terminate() == 0
    assert status.explicit_facts == 121  # (the reading among them)
    answers = run_cli("query", "--config", str(config), "<temp>(X, Y)")
    assert json.loads(answers.stdout) == {"X": "t1", "Y": 22}
