"""One version: each command's ``--version`` prints the installed distribution's version, and
the newest release in CHANGELOG.md is the version pyproject.toml declares (so a release bumps
both, or this fails)."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest

import agent

pytestmark = pytest.mark.process

REPO = Path(__file__).resolve().parents[2]
COMMANDS = [
    ("zodiac-edge", "agent.engine.cli"),
    ("zodiac-agent", "agent.cli"),
    ("zodiac-cloud", "cloud.zodiac_cloud_cli"),
]
RELEASE = re.compile(r"^## \[(\d+\.\d+\.\d+)\] - (\d{4}-\d{2}-\d{2})$", re.MULTILINE)


def pyproject_version(path: Path) -> str:
    return tomllib.loads(path.read_text(encoding="utf-8"))["project"]["version"]


@pytest.mark.parametrize(("program", "module"), COMMANDS)
def test_version_option_prints_the_installed_version(program: str, module: str) -> None:
    # The commands as the console scripts run them, but this checkout's code (cwd = REPO).
    result = subprocess.run(
        [sys.executable, "-m", module, "--version"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"{program} {metadata.version('zodiac-edge')}\n"


def test_version_without_an_installed_distribution(monkeypatch) -> None:
    def missing(name: str) -> str:
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "version", missing)
    assert agent.installed_version() is None
    assert agent.version_text("zodiac-edge").startswith("zodiac-edge: version unknown")


def test_the_edge_image_distribution_counts_too(monkeypatch) -> None:
    """The edge image installs the agent alone as ``zodiac-edge-agent``."""

    def only_the_agent(name: str) -> str:
        if name == "zodiac-edge-agent":
            return "9.8.7"
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "version", only_the_agent)
    assert agent.version_text("zodiac-agent") == "zodiac-agent 9.8.7"


def test_changelog_newest_release_is_the_project_version() -> None:
    text = (REPO / "CHANGELOG.md").read_text(encoding="utf-8")
    headings = re.findall(r"^## \[([^\]]+)\]", text, re.MULTILINE)
    assert headings[:1] == ["Unreleased"], "Keep a Changelog: an [Unreleased] section on top"
    releases = RELEASE.findall(text)
    assert releases, "no '## [X.Y.Z] - YYYY-MM-DD' heading in CHANGELOG.md"
    versions = [tuple(int(part) for part in version.split(".")) for version, _ in releases]
    assert versions == sorted(versions, reverse=True), "releases newest first"
    dates = [date for _, date in releases]
    assert dates == sorted(dates, reverse=True), "release dates newest first"
    newest = releases[0][0]
    assert newest == pyproject_version(REPO / "pyproject.toml")
    assert newest == pyproject_version(REPO / "packaging" / "edge" / "pyproject.toml")
