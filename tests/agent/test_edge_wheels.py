"""The edge package installs on the hardware it is for: every dependency of the agent's build
configuration (packaging/edge/pyproject.toml, the one Dockerfile.edge installs), resolved with
its own dependencies, has a wheel for CPython 3.11 on 64-bit ARM Linux, so a turbine's
controller never builds anything from source.

The platform tags are manylinux2014 (glibc 2.17) and manylinux_2_28 (glibc 2.28): pyoxigraph
and pyroaring publish aarch64 wheels for manylinux_2_28 only (pyroaring's say 2_24 and 2_28),
so the edge image needs glibc 2.28 or later (docs/operations.md, "The edge install"). pip asks
the package index (PyPI, or the index pip is configured with) for each; a dependency with no
such wheel fails the test by its name.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

pytestmark = [pytest.mark.process, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
EDGE = REPO / "packaging" / "edge" / "pyproject.toml"
PLATFORMS = ("manylinux2014_aarch64", "manylinux_2_28_aarch64")
NO_WHEEL = re.compile(r"No matching distribution found for ([^\s;]+)")


def edge_dependencies() -> list[str]:
    return tomllib.loads(EDGE.read_text())["project"]["dependencies"]


def download_command(requirements: list[str], into: Path) -> list[str]:
    platforms = [word for tag in PLATFORMS for word in ("--platform", tag)]
    return [
        sys.executable, "-m", "pip", "download", "--disable-pip-version-check",
        "--only-binary=:all:", *platforms, "--python-version", "3.11",
        "--implementation", "cp", "--dest", str(into), *requirements,
    ]  # fmt: skip


def missing_wheel(output: str) -> str | None:
    """The requirement pip found no wheel for, from its output (None: not that failure)."""
    found = NO_WHEEL.search(output)
    return found[1] if found else None


def test_every_edge_dependency_has_an_aarch64_wheel(tmp_path):
    requirements = edge_dependencies()
    assert any(r.startswith("pyoxigraph") for r in requirements)  # (the file read is right)
    result = subprocess.run(
        download_command(requirements, tmp_path), capture_output=True, text=True, timeout=600
    )
    output = result.stdout + result.stderr
    if result.returncode != 0:
        name = missing_wheel(output)
        if name is not None:
            pytest.fail(f"{name} has no wheel for CPython 3.11 on aarch64 ({', '.join(PLATFORMS)})")
        pytest.fail(f"pip download failed:\n{output[-2000:]}")
    wheels = sorted(p.name for p in tmp_path.iterdir())
    assert wheels and all(name.endswith(".whl") for name in wheels), wheels
    # Every wheel with compiled code is for aarch64; the others are pure Python.
    for name in wheels:
        assert "aarch64" in name or name.endswith("-none-any.whl"), name
    names = {re.split(r"-\d", name, maxsplit=1)[0].lower().replace("_", "-") for name in wheels}
    for requirement in requirements:
        wanted = re.split(r"[<>=!~\[ ;]", requirement, maxsplit=1)[0].lower()
        assert wanted.replace("_", "-") in names, (wanted, names)


def test_a_dependency_without_an_aarch64_wheel_is_named(tmp_path):
    """What the test above turns into its failure: for a requirement no index can meet with
    such a wheel (here, a name no index has), pip's message names it, and ``missing_wheel``
    reads the name from it."""
    result = subprocess.run(
        download_command(["zodiac-no-such-package-anywhere==1.0"], tmp_path),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode != 0
    assert missing_wheel(result.stdout + result.stderr) == "zodiac-no-such-package-anywhere==1.0"
