"""The canary roll-out fault (``--rollout-fault budget``): after the scenario, the cloud rolls
out a stream whose rule blows the devices' derived-facts budget, staged with ``zodiac-cloud
publish --canary N`` (the product's command, run as a process, on the simulation's ledger and
key). The canaries must refuse it (``budget_exceeded``), the roll-out must stop there, and no
other turbine may be sent or apply it: checked in the devices' statuses, the cloud's ledger
and (in the report's checks, from the end scrape) the agents' own metrics.

The stream's rule pairs every seed fact with every other: :data:`SEEDS` facts derive
``SEEDS ** 2`` pairs, far beyond :data:`AGENT_MAX_DERIVED_FACTS`, the modest
``[budget] max_derived_facts`` the simulation gives its agents (a turbine holds a few hundred
facts in all, its window facts included)."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from agent.engine.program.rdf import write_ntriples

STREAM = "canary-budget"
SEEDS = 200
AGENT_MAX_DERIVED_FACTS = 5_000
CANARIES = 2
RULE = "cb1: <CanaryPair>(X, Y) :- <canarySeed>(X, A) and <canarySeed>(Y, B) .\n"
REPO = Path(__file__).resolve().parents[2]


@dataclass
class RolloutFault:
    """What the staged roll-out did and what the farm shows of it afterwards."""

    command: list[str]
    exit_code: int
    output: str
    seconds: float
    canaries: list[str]
    refused: dict[str, str] = field(default_factory=dict)  # canary -> its status's last error
    applied_elsewhere: list[str] = field(default_factory=list)  # non-canaries holding the stream
    ledger_devices: list[str] = field(default_factory=list)  # devices the ledger sent it to
    errors_elsewhere: list[str] = field(default_factory=list)  # non-canaries erring on it

    @property
    def stopped_at_canary(self) -> bool:
        return self.exit_code == 1 and "stopped: canary" in self.output

    @property
    def budget_refusal(self) -> bool:
        return "budget_exceeded" in self.output


def write_stream(directory: Path) -> tuple[Path, Path]:
    """The over-budget stream (rules directory) and its seed facts (N-Triples)."""
    rules = directory / "rollout-streams"
    rules.mkdir(parents=True, exist_ok=True)
    (rules / f"{STREAM}.rules").write_text(
        "# Over budget on purpose: every pair of seeds, SEEDS ** 2 derived facts.\n" + RULE
    )
    facts = directory / "canary-seeds.nt"
    with open(facts, "w") as out:
        write_ntriples([("canarySeed", f"seed-{i:03d}", i) for i in range(SEEDS)], out)
    return rules, facts


def run_rollout_fault(sim, say) -> RolloutFault:
    """Roll the over-budget stream out to the whole farm, two canaries first."""
    rules, facts = write_stream(sim.directory / "cloud")
    devices = sorted(t.id for t in sim.farm.turbines)
    command = [
        sys.executable,
        "-m",
        "cloud.zodiac_cloud_cli",
        "publish",
        "--farm",
        sim.farm.farm_id,
        "--rules-dir",
        str(rules),
        "--key",
        str(sim.cloud.keys / "cloud.key"),
        "--state",
        str(sim.cloud.ledger),
        "--broker",
        f"{sim.host}:{sim.port}",
        "--stream",
        STREAM,
        "--facts",
        str(facts),
        "--canary",
        str(CANARIES),
        "--timeout",
        "30",
        "--devices",
        *devices,
    ]
    say(f"rollout fault: publishing {STREAM} ({SEEDS} seeds, {SEEDS**2} pairs) --canary {CANARIES}")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    started = time.perf_counter()
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, cwd=REPO, env=env, timeout=120, check=False
        )
        exit_code, stdout, output = done.returncode, done.stdout, done.stdout + done.stderr
    except subprocess.TimeoutExpired as expired:  # (the checks fail: no "stopped" line)
        stdout = _text(expired.stdout)
        exit_code, output = -1, stdout + _text(expired.stderr) + "\n(killed after 120 s)"
    seconds = time.perf_counter() - started
    canaries = devices[:CANARIES]
    for line in stdout.splitlines():
        if line.startswith("canaries: "):
            canaries = line.removeprefix("canaries: ").split()
    fault = RolloutFault(command, exit_code, output, seconds, canaries)
    time.sleep(1.0)  # the last statuses
    for device, status in sim.monitor.latest_statuses().items():
        if device in canaries:
            fault.refused[device] = status.last_error or ""
        else:
            if status.applied.get(STREAM, 0) > 0:
                fault.applied_elsewhere.append(device)
            if STREAM in (status.last_error or ""):
                fault.errors_elsewhere.append(device)
    fault.ledger_devices = ledger_devices(sim.cloud.ledger, STREAM)
    stopped = [line for line in output.splitlines() if line.startswith("stopped:")]
    say(
        f"rollout fault: exit {exit_code} in {seconds:.1f} s; "
        + (stopped or output.strip().splitlines() or ["no output"])[-1][:200]
    )
    return fault


def _text(data: bytes | str | None) -> str:
    if isinstance(data, bytes):
        return data.decode(errors="replace")
    return data or ""


def canary_refusal(sim, device: str, last_error: str) -> bool:
    """Whether ``last_error`` is a canary's refusal of the over-budget stream: the error the
    fault asks for, not one the run's "no errors" check should count."""
    fault = getattr(sim, "rollout", None)
    if fault is None or device not in fault.canaries:
        return False
    try:
        error = json.loads(last_error)
    except ValueError:
        return False
    return (
        isinstance(error, dict)
        and error.get("stream") == STREAM
        and error.get("reason") == "budget_exceeded"
    )


def ledger_devices(ledger: Path, stream: str) -> list[str]:
    """Every device the cloud's ledger has sent ``stream`` to (now or in its history)."""
    with sqlite3.connect(ledger) as conn:
        rows = conn.execute(
            "SELECT device FROM sent WHERE stream = ? UNION SELECT device FROM sent_history "
            "WHERE stream = ?",
            (stream, stream),
        ).fetchall()
    return sorted(row[0] for row in rows)


def rollout_checks(fault: RolloutFault, panel_end, check) -> list:
    """The report's checks of the fault; ``panel_end`` is the end scrape (device ->
    DeviceMetrics), ``check`` the analysis' Check class."""
    others_sent = [d for d in fault.ledger_devices if d not in fault.canaries]
    metric_holders = sorted(
        d for d, m in panel_end.devices.items() if not m.error and m.stream_versions.get(STREAM)
    )
    counted = sorted(
        d
        for d in fault.canaries
        if (m := panel_end.devices.get(d)) and not m.error and m.refusals.get("budget_exceeded")
    )
    refused_in_status = sorted(d for d, e in fault.refused.items() if "budget_exceeded" in e)
    # A device sent the bundle that refused it is gone from the ledger again (the publisher
    # takes a refused version back), but its metrics count the refusal.
    refused_elsewhere = sorted(
        d
        for d, m in panel_end.devices.items()
        if d not in fault.canaries and not m.error and m.refusals.get("budget_exceeded")
    )
    return [
        check(
            "canary roll-out stopped at the canaries (budget_exceeded)",
            fault.stopped_at_canary and fault.budget_refusal,
            f"exit {fault.exit_code}; canaries {', '.join(fault.canaries)}; refused in their "
            f"statuses: {', '.join(refused_in_status) or 'none'}",
        ),
        check(
            "no other turbine received or applied the over-budget bundle",
            not others_sent
            and not fault.applied_elsewhere
            and not metric_holders
            and not refused_elsewhere
            and not fault.errors_elsewhere,
            f"ledger holds it for {', '.join(fault.ledger_devices) or 'nobody'}; applied per "
            f"statuses: {', '.join(fault.applied_elsewhere) or 'nobody'}; per metrics: "
            f"{', '.join(metric_holders) or 'nobody'}; refused by other turbines (metrics, "
            f"statuses): {', '.join(refused_elsewhere + fault.errors_elsewhere) or 'none'}",
        ),
        check(
            "the canaries' metrics count the budget refusal",
            counted == sorted(fault.canaries),
            f"zodiac_agent_refusals_total{{reason=budget_exceeded}} on "
            f"{', '.join(counted) or 'none'}",
        ),
    ]


def rollout_lines(fault: RolloutFault) -> list[str]:
    """The report's section on the fault."""
    stopped = [line for line in fault.output.splitlines() if line.startswith("stopped:")]
    shown = [line for line in fault.output.splitlines() if not line.startswith("stopped:")]
    lines = [
        "## Canary roll-out of an over-budget bundle",
        "",
        f"`zodiac-cloud publish --stream {STREAM} --canary {CANARIES}` to every turbine: one "
        f"rule pairing {SEEDS} seed facts ({SEEDS**2} derived facts) against the agents' "
        f"`[budget] max_derived_facts = {AGENT_MAX_DERIVED_FACTS}`. Exit {fault.exit_code} "
        f"after {fault.seconds:.1f} s.",
        "",
        "```",
        *shown[:20],
        *(s[:300] + (" ..." if len(s) > 300 else "") for s in stopped),
        "```",
        "",
        "The cloud's ledger (which takes a refused version back) holds the stream for "
        f"{', '.join(fault.ledger_devices) or 'no device'}; other turbines applying it per "
        f"their statuses: {', '.join(fault.applied_elsewhere) or 'none'}, refusing it: "
        f"{', '.join(fault.errors_elsewhere) or 'none'}.",
    ]
    return lines
