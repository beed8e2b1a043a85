"""A missing optional dependency stops a command at once, with the install command that fixes it.

The simulation (``python -m simulations.windfarm``) needs matplotlib (the ``simulation`` extra)
for its report and pyspark (the ``cloud`` extra) with ``--spark always``; ``zodiac-cloud
materialise --spark always`` needs pyspark (``auto`` on a small input and ``never`` do not).
Each command runs in a subprocess whose PYTHONPATH puts a stub package first that raises
ImportError, as an install without that extra would; the command must say so in one line, exit
non-zero, and neither run nor write anything.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.process

ROOT = Path(__file__).resolve().parents[2]


def run_without(modules: list[str], args: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    """``python ARGS`` from the repository root with ``modules`` made unimportable."""
    hidden = tmp_path / "hidden"
    for module in modules:
        (hidden / module).mkdir(parents=True)
        message = f"No module named {module!r} (hidden by the test)"
        (hidden / module / "__init__.py").write_text(f"raise ImportError({message!r})\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(hidden), str(ROOT)]))
    return subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )


WINDFARM = ["-m", "simulations.windfarm", "--turbines", "5", "--duration", "30"]


@pytest.mark.parametrize(
    ("hidden", "options", "install", "named", "not_named"),
    [
        # --no-spark, or auto (the default): pyspark is not needed, only matplotlib is missing.
        (["matplotlib", "pyspark"], ["--no-spark"], ".[simulation]", ["matplotlib"], ["pyspark"]),
        (["matplotlib", "pyspark"], [], ".[simulation]", ["matplotlib"], ["pyspark"]),
        (["pyspark"], ["--spark", "always"], ".[cloud]", ["pyspark", "--spark"], ["matplotlib"]),
        (
            ["matplotlib", "pyspark"],
            ["--spark", "always"],
            ".[simulation,cloud]",
            ["matplotlib", "pyspark"],
            [],
        ),
    ],
    ids=["no-matplotlib", "no-matplotlib-auto", "no-pyspark", "neither"],
)
def test_windfarm_stops_before_starting_without_an_extra(
    tmp_path, hidden, options, install, named, not_named
):
    out = tmp_path / "run"
    done = run_without(hidden, [*WINDFARM, *options, "--out", str(out)], tmp_path)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("windfarm: "), done.stderr
    assert f"pip install -e '{install}'" in lines[0]
    assert all(word in lines[0] for word in named), lines[0]
    assert not any(word in lines[0] for word in not_named), lines[0]
    # Nothing of the scenario ran: no broker, cloud or agent lines, no run directory.
    assert done.stdout == ""
    assert not out.exists()


def test_cloud_materialise_stops_before_writing_without_pyspark(tmp_path):
    out = tmp_path / "out"
    rules = ROOT / "rules" / "windfarm" / "farm.rules"
    args = ["-m", "cloud.zodiac_cloud_cli", "materialise", "--rules", str(rules), "--out", str(out)]
    done = run_without(["pyspark"], [*args, "--spark", "always"], tmp_path)
    assert done.returncode == 1, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("zodiac-cloud: pyspark is not installed")
    assert "pip install -e '.[cloud]'" in lines[0]
    assert done.stdout == ""
    assert not out.exists()  # nothing written, not even the output directory
