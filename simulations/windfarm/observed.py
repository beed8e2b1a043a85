"""What the harness saw through the product's own observability: the farm panel from the
agents' scraped metrics, and the canary roll-out fault; both join the run's checks and report."""

from __future__ import annotations

from simulations.windfarm.analysis import Check, Result
from simulations.windfarm.panel import build_panel, panel_checks, panel_lines
from simulations.windfarm.rollout_fault import rollout_checks, rollout_lines


def observed(sim, result: Result) -> Result:
    """Build the panel (on ``sim.panel``) and add its checks, and the roll-out fault's, to
    ``result``."""
    sim.panel = None
    if len(sim.scrapes) == 2:
        begin, end = sim.scrapes
        shared = {device: len(host.devices) for device, host in sim.host_of.items()}
        sim.panel = build_panel(begin, end, shared)
        result.checks += panel_checks(sim.panel, len(sim.farm.turbines), Check)
        if sim.rollout is not None:
            result.checks += rollout_checks(sim.rollout, end, Check)
    return result


def observed_lines(sim) -> list[str]:
    """The report's sections: the farm panel, then the roll-out fault (if it ran)."""
    lines: list[str] = []
    if getattr(sim, "panel", None) is not None:
        lines += ["", *panel_lines(sim.panel, len(sim.farm.turbines))]
    if getattr(sim, "rollout", None) is not None:
        lines += ["", *rollout_lines(sim.rollout)]
    return lines
