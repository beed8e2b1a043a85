"""docs/tutorial.md, run: every ``sh`` block of the page, in order, as one bash script in an
empty folder, as a reader copying them into one terminal would.

The page starts its own Mosquitto from the shipped deploy/mosquitto files; the test only gives
it free ports (``PORT``, ``CLOUD_PORT``), the clone (``ZODIAC``) and commands that run this
checkout's code (``zodiac-agent``, ``zodiac-cloud`` and ``python`` on PATH, the console
scripts of an installed package). Then it checks what the page says happened: the diagnosis
was printed, the cloud released the event's rules, and the turbine's state holds the base
rule alone and no diagnosis.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from simulations.brokerprocess import free_port
from tests.conftest import _require_mosquitto
from tests.support.agent_harness import REPO

pytestmark = pytest.mark.process

TUTORIAL = REPO / "docs" / "tutorial.md"
SH_BLOCK = re.compile(r"^```sh\n(.*?)^```", re.M | re.S)


def tutorial_script() -> str:
    blocks = SH_BLOCK.findall(TUTORIAL.read_text())
    assert len(blocks) >= 10, "the tutorial's commands are no longer in sh blocks"
    # (the trap: a failing command stops what the page started in the background at once)
    return "set -eu\ntrap 'kill $(jobs -p) 2>/dev/null || true' EXIT\n" + "\n".join(blocks)


def commands(directory: Path) -> Path:
    """A bin folder whose zodiac-agent, zodiac-cloud and python run this checkout."""
    bin_dir = directory / "bin"
    bin_dir.mkdir()
    for name, module in (("zodiac-agent", "agent.cli"), ("zodiac-cloud", "cloud.zodiac_cloud_cli")):
        (bin_dir / name).write_text(f'#!/bin/sh\nexec "{sys.executable}" -m {module} "$@"\n')
    (bin_dir / "python").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    for script in bin_dir.iterdir():
        script.chmod(0o755)
    return bin_dir


def test_the_tutorial_runs_from_an_empty_folder_to_the_diagnosis_and_its_release(tmp_path):
    _require_mosquitto()  # (a failure, not a skip, as for every broker test)
    work = tmp_path / "work"
    work.mkdir()
    env = {
        **os.environ,
        "PATH": f"{commands(tmp_path)}:{os.environ.get('PATH', '')}",
        "PYTHONPATH": str(REPO),
        "ZODIAC": str(REPO),
        "PORT": str(free_port()),
        "CLOUD_PORT": str(free_port()),
    }
    script = tmp_path / "tutorial.sh"
    script.write_text(tutorial_script())
    process = subprocess.Popen(
        ["bash", str(script)],
        cwd=work,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # (its background processes too, killed below if need be)
    )
    try:
        out, err = process.communicate(timeout=90)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        out, err = process.communicate()
        err += "\n(killed after 90 s)"
    finally:
        with contextlib.suppress(ProcessLookupError):  # (nothing is left once it ended)
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    farm = work / "farm"
    logs = "".join(
        f"\n--- {log}:\n{log.read_text()[-3000:]}"
        for log in sorted(farm.glob("**/*.log"))
        if log.is_file()
    )
    assert process.returncode == 0, f"stdout:\n{out}\nstderr:\n{err}{logs}"

    # publish: every device applied the base stream (exit 0, one line each), as shown.
    page = TUTORIAL.read_text()
    for n in (1, 2, 3):
        line = f"turbine-{n}: applied base version 1"
        assert line in out and line in page, out
        line = f"turbine-{n}: base version 1 (1 rules, 4 facts)"
        assert line in out and line in page, out
    # The diagnosis, as the page shows it, printed once (the waiting loop's query is silent).
    assert out.count('{"X": "turbine-2"}') == 1 and '{"X": "turbine-2"}' in page, out
    # The statuses: the answering stream applied and the request open, then released.
    during, after = (json.loads(s) for s in re.findall(r"(?ms)^\{\n.*?^\}$", out))
    assert during["applied"] == {"base": 1, "anomaly/ambient-temperature": 1}, during
    assert (during["rules"], during["open_requests"]) == (6, 1), during
    assert after["applied"] == {"base": 1, "anomaly/ambient-temperature": 2}, after
    assert (after["rules"], after["open_requests"]) == (1, 0), after
    request = {"event": "anomaly/ambient-temperature", "stream": "anomaly/ambient-temperature"}
    assert during["requests"] == [{**request, "status": "answered"}], during
    assert after["requests"] == [{**request, "status": "resolved"}], after
    assert json.dumps(during["requests"], indent=2).replace("\n", "\n  ") in page
    # The release: the cloud said so, and the turbine holds its base rule alone (the CSV the
    # page shows).
    assert "releasing anomaly/ambient-temperature" in (farm / "cloud.log").read_text()
    table = out[out.index("label,stream,version,text\n") :].split("\n{", 1)[0]
    assert table in page, table
    assert [row[0] for row in csv.reader(io.StringIO(table))] == ["label", "b1"], table
    # What the agent left on disk: no diagnosis.
    query = subprocess.run(
        [sys.executable, "-m", "agent.cli", "query", "--config",
         farm / "agent-turbine-2" / "agent.toml", "<SensorAnomalyWindTurbine>(X)"],
        capture_output=True, text=True, cwd=REPO, timeout=60,
    )  # fmt: skip
    assert query.returncode == 0 and query.stdout == "", query.stdout + query.stderr
    # Its neighbours, sent their own facts only (--own-facts), never suspected it: they hold
    # the base stream alone.
    for n in (1, 3):
        status = subprocess.run(
            [sys.executable, "-m", "agent.cli", "status", "--config",
             farm / f"agent-turbine-{n}" / "agent.toml"],
            capture_output=True, text=True, cwd=REPO, timeout=60,
        )  # fmt: skip
        assert json.loads(status.stdout)["applied"] == {"base": 1}, status.stdout
