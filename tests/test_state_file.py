"""The state file as operators meet it: a path that is a symbolic link (a volume not mounted
yet at boot, a loop), a file deleted or replaced under a running agent, a full disk.

Every case drives the real entry points: ``zodiac-agent`` as a process (``run_cli``,
``AgentProcess``), MQTT through a private Mosquitto, SQLite files on disk, and a real small
filesystem (a tmpfs) for the full disk.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.agent_harness import Cloud, run_cli

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
