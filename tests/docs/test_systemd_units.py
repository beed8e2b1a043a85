"""The systemd units shipped under ``deploy/systemd/`` (docs/deploy.md).

What can be checked without booting them: ``systemd-analyze verify`` (when installed) reads
each unit as systemd would, with its ExecStart pointed at this environment's console script
(it refuses a command that does not exist) and its EnvironmentFile at the shipped example;
every warning it prints fails the test (it exits 0 for an unknown or misspelt key). Whatever
systemd is there, each unit is parsed here: it runs as its own user, restarts on failure but
not after a configuration error, is hardened (``ProtectSystem=strict`` with its state folder as
the only writable path, ``NoNewPrivileges``), and its ExecStart is one of the project's console
scripts with options its own parser accepts.
"""

from __future__ import annotations

import configparser
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from agent.cli import build_parser as agent_parser
from cloud.zodiac_cloud_cli import build_parser as cloud_parser

pytestmark = pytest.mark.process

REPO = Path(__file__).resolve().parents[2]
UNITS = REPO / "deploy" / "systemd"
ENV_FILE = UNITS / "zodiac-cloud-publisher.env"
PARSERS = {"zodiac-agent": agent_parser, "zodiac-cloud": cloud_parser}
# What each unit runs: the command and the writable state folder its files use.
EXPECTED = {
    "zodiac-agent.service": ("zodiac-agent", "run", "/var/lib/zodiac"),
    "zodiac-cloud-publisher.service": ("zodiac-cloud", "serve", "/var/lib/zodiac-cloud"),
}


def read_unit(path: Path) -> configparser.ConfigParser:
    unit = configparser.ConfigParser(interpolation=None, strict=True, delimiters=("=",))
    unit.optionxform = str  # (systemd keys are case-sensitive)
    unit.read_string(path.read_text())
    return unit


def environment() -> dict[str, str]:
    values = {}
    for line in ENV_FILE.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            key, _, value = line.partition("=")
            values[key] = value
    return values


def exec_start(unit: configparser.ConfigParser) -> list[str]:
    """ExecStart's words, ``${VAR}`` taken from the shipped environment file."""
    values = environment()

    def substitute(match: re.Match) -> str:
        assert match[1] in values, f"${{{match[1]}}} is not set in {ENV_FILE.name}"
        return values[match[1]]

    return [
        re.sub(r"\$\{(\w+)\}", substitute, w) for w in shlex.split(unit["Service"]["ExecStart"])
    ]


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_unit_runs_a_console_script_with_options_it_accepts(name):
    unit = read_unit(UNITS / name)
    command, subcommand, _ = EXPECTED[name]
    argv = exec_start(unit)
    assert Path(argv[0]).name == command
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert command in scripts
    args = PARSERS[command]().parse_args(argv[1:])  # (SystemExit on an option it refuses)
    assert args.command == subcommand


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_unit_is_hardened_and_restarts_on_failure(name):
    service = read_unit(UNITS / name)["Service"]
    _, _, state = EXPECTED[name]
    assert service["User"] and service["User"] != "root"
    assert service["Restart"] == "on-failure"
    assert service["RestartPreventExitStatus"] == "2"  # (a configuration error)
    assert service["NoNewPrivileges"] == "yes"
    assert service["ProtectSystem"] == "strict"
    assert service["ReadWritePaths"].split() == [state]
    assert f"/var/lib/{service['StateDirectory']}" == state
    if name == "zodiac-agent.service":
        # The documented database lies in the one writable folder.
        assert "/var/lib/zodiac/agent.db".startswith(state + "/")
        assert "--config" in exec_start(read_unit(UNITS / name))


def verify(unit_file: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["systemd-analyze", "verify", str(unit_file)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "SYSTEMD_LOG_COLOR": "0"},
    )


def localised(name: str, directory: Path, extra: str = "") -> Path:
    """The unit with its command at this environment's console script and its environment
    file at the shipped example (systemd-analyze checks that both exist)."""
    text = (UNITS / name).read_text()
    scripts = Path(sys.executable).parent
    text = re.sub(r"/opt/zodiac/bin/", f"{scripts}/", text)
    text = re.sub(r"(?m)^EnvironmentFile=.*$", f"EnvironmentFile={ENV_FILE}", text)
    text = text.replace("[Service]\n", f"[Service]\n{extra}", 1)
    path = directory / name
    path.write_text(text)
    return path


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze")
@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_systemd_analyze_verify_finds_nothing(name, tmp_path):
    command = EXPECTED[name][0]
    if not (Path(sys.executable).parent / command).exists():
        pytest.skip(f"no {command} console script beside {sys.executable}")
    result = verify(localised(name, tmp_path))
    assert result.returncode == 0 and result.stderr.strip() == "", result.stderr
    # The check is real: a misspelt key is reported.
    (tmp_path / "bad").mkdir()
    result = verify(localised(name, tmp_path / "bad", extra="ProtectSystm=strict\n"))
    assert "ProtectSystm" in result.stderr
