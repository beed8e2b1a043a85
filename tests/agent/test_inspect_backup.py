"""``zodiac-agent inspect`` and ``backup`` (agent/state/inspection.py) on real agent states.

The states are made by a real agent (bundles applied, local rules), in process for the output
checks and as a running ``zodiac-agent run`` process, applying bundles from a real Mosquitto,
for the online backup. What matters to an operator: ``inspect`` changes nothing (it opens the
file read-only, so it also works on a file it may not write), ``backup`` makes a copy that is
a healthy state while the agent keeps applying bundles, and never overwrites a file.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import os
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from agent.cli import main
from agent.state.schema import SCHEMA_VERSION
from tests.agent.test_service import make_agent
from tests.support.agent_harness import (
    REPO,
    AgentProcess,
    Cloud,
    StatusWatcher,
    run_cli,
    write_config,
)
from tests.support.broker import TestClient

RULES = {
    "hot": "hot: <Hot>(X) :- <temp>(X, T) and COMP(T, >, 30) .",
    "warm": "warm: <Warm>(X) :- <temp>(X, T) and COMP(T, >, 20) .",
}


@pytest.fixture(autouse=True)
def _restore_logging():
    """`main` points the ``zodiac`` logger at this test's captured stderr: put it back."""
    logger = logging.getLogger("zodiac")
    saved = (logger.handlers[:], logger.level, logger.propagate)
    yield
    logger.handlers[:], logger.level, logger.propagate = saved[0], saved[1], saved[2]


@pytest.fixture
def cloud(tmp_path: Path) -> Cloud:
    return Cloud(tmp_path / "cloud")


@pytest.fixture
def state(tmp_path: Path, cloud: Cloud) -> Path:
    """The config of an agent state holding stream ``base`` at version 2 (rules hot and warm)
    and stream ``anomaly/x`` at version 1 (rule cold); the agent is closed."""
    agent = make_agent(tmp_path, cloud)
    bundles = [
        cloud.bundle("base", 1, rules={"hot": RULES["hot"]}, facts=[("temp", "a", 35)]),
        cloud.bundle("base", 2, rules={"warm": RULES["warm"]}, facts=[("temp", "b", 25)]),
        cloud.bundle("anomaly/x", 1, rules={"cold": "cold: <Cold>(X) :- <temp>(X, 1) ."}),
    ]
    for bundle in bundles:
        assert agent.handle_bundle(cloud.sign(bundle)).status == "applied"
    agent.close()
    return tmp_path / "agent.toml"


def run(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_inspect_lists_tables_rules_and_streams_as_json(state, capsys):
    code, out, err = run(capsys, "inspect", "--config", str(state))
    assert code == 0, err
    data = json.loads(out)
    assert data["schema_version"] == SCHEMA_VERSION
    tables = {row["name"]: row["rows"] for row in data["tables"]}
    assert tables["rules"] == 3 and tables["streams"] == 2 and tables["meta"] >= 1
    assert {"terms", "relations", "explicit", "derived", "nodes"} <= set(tables)
    rules = {(r["label"], r["stream"], r["version"]) for r in data["rules"]}
    assert rules == {("hot", "base", 2), ("warm", "base", 2), ("cold", "anomaly/x", 1)}
    assert {r["label"]: r["text"] for r in data["rules"]}["hot"].startswith("hot:")
    streams = {s["stream"]: s["version"] for s in data["streams"]}
    assert streams == {"base": 2, "anomaly/x": 1}


def test_inspect_csv_prints_one_section(state, capsys):
    code, out, _ = run(capsys, "inspect", "--config", str(state), "--format", "csv")
    assert code == 0
    rows = list(csv.DictReader(io.StringIO(out)))
    assert list(rows[0]) == ["name", "rows"]
    assert {"name": "streams", "rows": "2"} in rows
    code, out, _ = run(capsys, "inspect", "--config", str(state), "--format", "csv", "--table",
                       "rules")  # fmt: skip
    rows = list(csv.DictReader(io.StringIO(out)))
    assert sorted((r["label"], r["version"]) for r in rows) == [
        ("cold", "1"),
        ("hot", "2"),
        ("warm", "2"),
    ]
    # A table of the file: its rows, binary columns shown as their size.
    code, out, _ = run(capsys, "inspect", "--config", str(state), "--table", "derived")
    rows = json.loads(out)
    assert rows and all(row["packed"].endswith(" bytes>") for row in rows)


def test_inspect_is_read_only(state, tmp_path, capsys):
    """The state file is not written (SQLite may add its empty -wal and -shm beside it, as any
    reader of a WAL database does), and a state the user may not write is inspected."""
    database = tmp_path / "t1.db"

    def snapshot() -> tuple[bytes, int]:
        return database.read_bytes(), database.stat().st_mtime_ns

    before = snapshot()
    assert run(capsys, "inspect", "--config", str(state))[0] == 0
    assert snapshot() == before
    wal = tmp_path / "t1.db-wal"
    assert not wal.exists() or wal.stat().st_size == 0
    database.chmod(0o444)
    try:
        code, out, err = run(capsys, "inspect", "--config", str(state), "--table", "streams")
    finally:
        database.chmod(0o644)
    assert code == 0, err
    assert {s["stream"] for s in json.loads(out)} == {"base", "anomaly/x"}
    assert snapshot() == before


@pytest.mark.parametrize(
    "args, code, message",
    [
        (["inspect", "--table", "nope"], 2, "no table 'nope'"),
        (["backup", "{existing}"], 2, "already exists; the backup never overwrites"),
        (["backup", "{missing_dir}/copy.db"], 2, "no such directory"),
    ],
)
def test_bad_arguments_are_one_line(state, tmp_path, capsys, args, code, message):
    existing = tmp_path / "existing.db"
    existing.write_bytes(b"keep me")
    args = [a.format(existing=existing, missing_dir=tmp_path / "nowhere") for a in args]
    result, out, err = run(capsys, args[0], "--config", str(state), *args[1:])
    assert result == code and out == ""
    assert err.count("\n") == 1 and message in err, err
    assert existing.read_bytes() == b"keep me"


def test_no_state_is_one_line_and_creates_nothing(tmp_path, cloud, capsys):
    config = tmp_path / "agent.toml"
    config.write_text(f'device = "t1"\nfarm = "farm1"\ndatabase = "t1.db"\n'
                      f'[keys]\ntrusted_keys = "{cloud.keys}"\n')  # fmt: skip
    for command in (["inspect"], ["backup", str(tmp_path / "copy.db")]):
        code, out, err = run(capsys, command[0], "--config", str(config), *command[1:])
        assert code == 1 and err.count("\n") == 1 and "no agent state here" in err, err
    assert not (tmp_path / "t1.db").exists() and not (tmp_path / "copy.db").exists()


def test_inspect_of_an_older_schema_lists_its_tables_only(state, tmp_path, capsys):
    """An older state (before the agent's start migrates it) lays its rules out otherwise:
    inspect lists its tables and rows, and says so for the rules and streams."""
    conn = sqlite3.connect(tmp_path / "t1.db")
    with conn:
        conn.execute("UPDATE meta SET value = '9' WHERE key = 'schema_version'")
    conn.close()
    code, out, err = run(capsys, "inspect", "--config", str(state))
    assert code == 1 and out == "" and err.count("\n") == 1
    assert f"state schema version 9, this agent reads version {SCHEMA_VERSION}" in err
    code, out, _ = run(capsys, "inspect", "--config", str(state), "--table", "tables")
    assert code == 0 and {"name": "rules", "rows": 3} in json.loads(out)


def test_backup_is_a_healthy_state_with_the_same_rules(state, tmp_path, capsys):
    copy = tmp_path / "copy.db"
    code, out, err = run(capsys, "backup", "--config", str(state), str(copy))
    assert code == 0, err
    report = json.loads(out)
    assert report["backup"] == str(copy) and report["tables"]["rules"] == 3
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []
    copied = backup_config(state, copy)
    code, out, _ = run(capsys, "status", "--config", str(copied))
    status = json.loads(out)
    assert code == 0 and status["healthy"] and status["applied"] == {"base": 2, "anomaly/x": 1}
    code, out, _ = run(capsys, "query", "--config", str(copied), "<Hot>(X)")
    assert [json.loads(line) for line in out.splitlines()] == [{"X": "a"}]


def backup_config(config: Path, copy: Path) -> Path:
    """The same configuration with the backup as its database."""
    text = config.read_text()
    lines = [
        f'database = "{copy}"' if line.startswith("database =") else line
        for line in text.splitlines()
    ]
    path = copy.with_suffix(".toml")
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.process
def test_the_agents_service_does_not_import_sqlite_utils():
    """``zodiac-agent run`` keeps plain sqlite3: its imports (the CLI, the service, the MQTT
    sync) load no sqlite-utils, so its plugin scan and hooks never happen at agent start."""
    code = (
        "import sys\n"
        "import agent.cli, agent.service, agent.sync\n"
        "agent.cli.build_parser()\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] in ('sqlite_utils', 'pluggy'))\n"
        "print(loaded)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
    # (the check is real: the operator commands do load it)
    code = code.replace("agent.cli.build_parser()", "import agent.state.inspection")
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60
    )
    assert "sqlite_utils" in result.stdout


def test_backup_of_a_running_agent_applying_bundles(tmp_path, broker, cloud):
    """Backups taken while the agent process applies a stream of bundles: every copy is a
    healthy state at some version the agent applied, the later copies at later versions, the
    first one before the last bundle."""
    config = write_config(tmp_path / "t1", broker, cloud.keys)
    total = 60  # (one every 0.1 s: the backups below are taken while they arrive)
    copies: list[Path] = []
    with AgentProcess(config) as agent, TestClient(broker, "cloud-1") as client:
        watcher = StatusWatcher(client, "farm1", "t1")
        watcher.wait(lambda s: s.online, timeout=20)
        rules = {"hot": RULES["hot"]}
        first = cloud.bundle("base", 1, rules=rules, facts=[("temp", "s0", 35)])
        client.publish("zodiac/farm1/t1/bundle", cloud.sign(first))
        watcher.wait(lambda s: s.applied.get("base") == 1)

        def publish() -> None:
            for version in range(2, total + 1):
                facts = [("temp", f"s{version}", 30 + version % 10)]
                bundle = cloud.bundle("base", version, facts=facts)
                client.publish("zodiac/farm1/t1/bundle", cloud.sign(bundle))
                time.sleep(0.1)

        sender = threading.Thread(target=publish)
        sender.start()
        inspected = run_cli("inspect", "--config", str(config), "--table", "streams")
        assert inspected.returncode == 0, inspected.stderr
        assert [row["stream"] for row in json.loads(inspected.stdout)] == ["base"]
        for number in range(4):
            copy = tmp_path / f"backup-{number}.db"
            result = run_cli("backup", "--config", str(config), str(copy))
            assert result.returncode == 0, result.stderr
            copies.append(copy)
        sender.join()
        watcher.wait(lambda s: s.applied.get("base") == total, timeout=60)
        again = run_cli("backup", "--config", str(config), str(copies[0]))
        assert again.returncode == 2 and "already exists" in again.stderr
        assert agent.terminate() == 0
    versions = []
    for copy in copies:
        result = run_cli("status", "--config", str(backup_config(config, copy)))
        assert result.returncode == 0, result.stdout + result.stderr
        status = json.loads(result.stdout)
        assert status["healthy"] is True and status["rules"] == 1
        version = status["applied"]["base"]
        # The facts the copy holds are exactly the versions it applied (one fact each).
        assert status["explicit_facts"] == version
        versions.append(version)
    assert versions == sorted(versions) and versions[0] >= 1 and versions[-1] <= total
    assert versions[0] < total, versions  # (the first copy was taken mid-stream)
    assert os.path.getsize(copies[-1]) > 0
