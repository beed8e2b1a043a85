"""``zodiac-cloud publish --dry-run``, ``--canary`` and ``--revert`` (cloud/rollout.py,
cloud/publisher_cli.py) as real processes, against a real Mosquitto and real ``zodiac-agent
run`` processes.

A dry run prints each device's answer and changes nothing, on the devices (their state files'
rows) or in the publisher's state (the next real bundle has the version the dry run had). A
canary roll-out of a bundle that blows the devices' budget reaches the canaries only: no bundle
is published on the other devices' topics, and their version stays. A revert brings the
devices back to the previous version's rules.
"""

from __future__ import annotations

import hashlib
import sqlite3
from contextlib import ExitStack
from pathlib import Path

import pytest

from cloud.bundles import BundleCutter
from tests.cloud.test_cloud_publisher import FARM, cloud_command, run_cloud
from tests.support.agent_harness import AgentProcess, Cloud, StatusWatcher, write_config
from tests.support.broker import MqttError, TestClient

pytestmark = [pytest.mark.process, pytest.mark.slow]

DEVICES = ["t1", "t2", "t3"]
# Each device is sent its own 60 links (``--own-facts``).
FACTS = "".join(f"<t{i}> <link> <t{i}-{j}> .\n" for i in (1, 2, 3) for j in range(60))
BASE = "n: <Linked>(X) :- <link>(X, Y) .\n"
MORE = BASE + "r: <reach>(X, Y) :- <link>(X, Y) .\n"
# Every pair of a device's 60 links' ends: 3,600 facts, over a budget of 2,000.
PRODUCT = BASE + "p: <pair>(A, B) :- <link>(X, A) and <link>(Y, B) .\n"
BUDGET = "[budget]\nmax_derived_facts = 2000\n"


def logical_digest(path: Path) -> str:
    conn = sqlite3.connect(path)
    try:
        return hashlib.sha256("\n".join(conn.iterdump()).encode()).hexdigest()
    finally:
        conn.close()


def applied(database: Path) -> dict[str, int]:
    """The stream versions an agent's state file holds (read beside the running agent)."""
    conn = sqlite3.connect(database)
    try:
        return dict(conn.execute("SELECT stream, version FROM streams"))
    finally:
        conn.close()


class Farm:
    """Three agents of farm1 on one broker, the publisher's key, rules dir and state."""

    def __init__(self, tmp_path: Path, broker, stack: ExitStack) -> None:
        self.tmp = tmp_path
        self.broker = broker
        cloud = Cloud(tmp_path / "cloud")
        self.key = tmp_path / "cloud" / f"{cloud.key_id}.key"
        self.rules = tmp_path / "rules"
        self.rules.mkdir()
        self.facts = tmp_path / "farm.nt"
        self.facts.write_text(FACTS)
        self.state = tmp_path / "cloud.db"
        self.watchers = {}
        for device in DEVICES:
            client = stack.enter_context(TestClient(broker, f"watcher-{device}"))
            config = write_config(
                tmp_path / device, broker, cloud.keys, device=device, extra=BUDGET
            )
            stack.enter_context(AgentProcess(config))
            self.watchers[device] = StatusWatcher(client, FARM, device)
        for device in DEVICES:
            self.watchers[device].wait(lambda s: s.online)

    def publish(self, rules: str, *args: str):
        (self.rules / "base.rules").write_text(rules)
        command = cloud_command("publish", self.broker, self.rules, self.key, self.state)
        return run_cloud(
            *command, "--facts", str(self.facts), "--own-facts", "--devices", *DEVICES, *args
        )

    def database(self, device: str) -> Path:
        return self.tmp / device / f"{device}.db"

    def version(self, device: str) -> int:
        return BundleCutter(self.state, FARM).version(device, "base")


@pytest.fixture
def farm(tmp_path, make_broker):
    with ExitStack() as stack:
        yield Farm(tmp_path, make_broker(), stack)


def test_a_dry_run_prints_the_fleets_answers_and_changes_nothing(farm):
    first = farm.publish(BASE)
    assert first.returncode == 0, first.stdout + first.stderr
    digests = {d: logical_digest(farm.database(d)) for d in DEVICES}

    result = farm.publish(MORE, "--dry-run")

    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "dry run of base:"
    assert lines[1].split() == [
        "device", "verdict", "facts", "changes", "per", "predicate", "watched", "time", "memory"
    ]  # fmt: skip
    rows = {line.split()[0]: line for line in lines[2:]}
    assert sorted(rows) == DEVICES
    for device in DEVICES:
        assert "would apply" in rows[device] and "reach/2 +60" in rows[device], rows[device]
        assert "61 -> 121" in rows[device]  # (60 links and Linked, then 60 reach facts more)
        assert " ms " in rows[device] and rows[device].endswith(("kB", "MB"))
    assert {d: logical_digest(farm.database(d)) for d in DEVICES} == digests
    assert {d: farm.version(d) for d in DEVICES} == dict.fromkeys(DEVICES, 1)
    for device in DEVICES:
        status = farm.watchers[device].wait(lambda s: s.dry_run is not None)
        assert status.applied == {"base": 1}
        assert status.dry_run.verdict == "would apply" and status.last_error is None
        assert [(p.predicate, p.before, p.after) for p in status.dry_run.predicates] == [
            ("reach/2", 0, 60)
        ]

    real = farm.publish(MORE)
    assert real.returncode == 0, real.stdout + real.stderr
    assert "t1: applied base version 2" in real.stdout.splitlines()


def test_a_dry_run_over_budget_says_so_and_exits_non_zero(farm):
    assert farm.publish(BASE).returncode == 0
    result = farm.publish(PRODUCT, "--dry-run")
    assert result.returncode == 1, result.stdout + result.stderr
    rows = result.stdout.splitlines()[2:]
    assert len(rows) == 3
    assert all("budget_exceeded (derived_facts:" in row and "> 2000)" in row for row in rows)


def test_a_canary_roll_out_with_a_bad_bundle_reaches_only_the_canaries(farm):
    assert farm.publish(BASE).returncode == 0
    with TestClient(farm.broker, "spy") as spy:
        for device in ("t2", "t3"):
            spy.subscribe(f"zodiac/{FARM}/{device}/bundle")

        result = farm.publish(PRODUCT, "--canary", "1")

        assert result.returncode == 1, result.stdout + result.stderr
        lines = result.stdout.splitlines()
        assert lines[0] == "canaries: t1"
        assert lines[1].startswith("t1: base version 2")
        assert lines[2].startswith("t1: refused base: budget_exceeded: ")
        assert lines[3].startswith("stopped: canary t1 refused: budget_exceeded: ")
        assert lines[3].endswith("; not sent to t2 t3")
        with pytest.raises(MqttError):  # nothing was published to the others
            spy.expect(timeout=2)
    # The canary holds version 1, and so does the ledger for it (the next bundle is 2 again).
    assert [farm.version(d) for d in DEVICES] == [1, 1, 1]
    for device in DEVICES:
        assert applied(farm.database(device)) == {"base": 1}

    good = farm.publish(MORE, "--canary-devices", "t3")
    assert good.returncode == 0, good.stdout + good.stderr
    lines = good.stdout.splitlines()
    assert lines[0] == "canaries: t3" and "t3: applied base version 2" in lines
    assert "the rest: t1 t2" in lines
    assert "t1: applied base version 2" in lines and "t2: applied base version 2" in lines


def test_a_revert_brings_the_devices_back_to_the_previous_version(farm):
    assert farm.publish(BASE).returncode == 0
    assert farm.publish(MORE).returncode == 0
    command = cloud_command("publish", farm.broker, farm.rules, farm.key, farm.state)

    result = run_cloud(*command, "--devices", *DEVICES, "--revert")

    assert result.returncode == 0, result.stdout + result.stderr
    assert "t1: base version 3 reverts to 1" in result.stdout.splitlines()
    assert "t2: applied base version 3" in result.stdout.splitlines()
    for device in DEVICES:
        status = farm.watchers[device].wait(lambda s: s.applied.get("base") == 3)
        assert status.rules == 1 and status.last_error is None
    # The ledger knows what they hold: publishing version 1's rules again changes nothing.
    again = farm.publish(BASE)
    assert again.returncode == 0 and "t1: base unchanged (1 rules, 60 facts)" in again.stdout

    nothing = run_cloud(*command, "--devices", "t1", "--revert", "--to-version", "3")
    assert nothing.returncode == 1 and nothing.stdout == ""
    assert nothing.stderr.strip() == (
        "zodiac-cloud: t1: stream 'base' is at version 3: there is no earlier version 3 to "
        "revert to"
    )
