"""A short run of ``python -m simulations.faults.broker_kills``: Mosquitto killed with SIGKILL
at random moments for 25 s while the real publisher sends bundles to three real agent
processes. Every device must end at the publisher's last version, and no more full states may
be sent than bundles were lost (before, each status repeating a gap got a new full state:
tens of thousands in a run like this one). The 180 s run is the same command with
``--seconds 180``."""

from __future__ import annotations

import pytest

from simulations.faults.broker_kills import Options, main, run
from tests.conftest import _require_mosquitto

pytestmark = pytest.mark.process


@pytest.mark.slow
def test_broker_kills_lose_bundles_but_recovery_never_storms(tmp_path):
    _require_mosquitto()
    lines: list[str] = []
    result = run(Options(seconds=25, devices=3, seed=1, directory=tmp_path), say=lines.append)
    report = "\n".join(lines + result.lines())
    assert result.kills >= 3, report
    for device in result.devices:
        assert device.converged, report
        assert device.full_states <= device.lost, report
        assert device.last_error is None, report  # recovered, and the status says so
    assert result.total("full_states") <= result.total("lost"), report
    assert result.ok, report


def test_broker_kills_refuses_nonsensical_options(capsys):
    assert main(["--seconds", "0"]) == 2
    assert "must be positive" in capsys.readouterr().err
