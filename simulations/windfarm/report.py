"""The run's report: ``report.md`` and three PNG plots next to it (matplotlib, no display)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from simulations.mqttbroker import EmbeddedBroker
from simulations.windfarm.analysis import Result
from simulations.windfarm.cloud import merged_names

PLOTS = {
    "timeline": "timeline.png",
    "latency": "latency.png",
    "updates": "updates.png",
}


def _s(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.1f}"


def _distribution(values) -> str:
    values = list(values)
    if not values:
        return "- | - | - | -"
    ordered = sorted(values)
    p95 = ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]
    return f"{len(values)} | {_ms(statistics.median(values))} | {_ms(p95)} | {_ms(max(values))}"


def _broker_name(sim) -> str:
    if isinstance(sim.broker, EmbeddedBroker):
        return "embedded Python MQTT v5 broker"
    return "private Mosquitto" if sim.broker else sim.options.broker


def write_report(result: Result, directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    plots = write_plots(result, directory)
    sim = result.sim
    options, schedule, log = sim.options, sim.schedule, sim.log
    lines = [
        "# Wind-farm simulation report",
        "",
        "**Verdict: "
        + ("every diagnosis right, every release clean" if result.ok else "PROBLEMS FOUND")
        + "** (see the checks)",
        "",
        f"- Farm `{sim.farm.farm_id}`: {len(sim.farm.turbines)} turbines on a grid of "
        f"{sim.farm.columns} columns; neighbours = turbines at most two grid steps apart.",
        f"- Run: {options.duration:g} s of readings every {options.period:g} s, seed "
        f"{options.seed}; agents in {len(sim.hosts)} processes; broker "
        f"{_broker_name(sim)}.",
        f"- Cloud: farm graph of {len(sim.graph.facts)} facts by {sim.graph.materialiser} in "
        f"{sim.graph.seconds:.1f} s"
        + (f" (Spark start-up {sim.graph.startup_seconds:.1f} s)" if sim.options.spark else "")
        + ", equal to the edge engine's fact for fact.",
        "- Names: {} turbine names from two sources (SCADA device ids, asset-registry names) "
        "merged into {} turbines by owl:sameAs (a key rule on the serial number); every "
        "third turbine's controller reports under its registry name.".format(
            *merged_names(sim.graph)
        ),
        f"- Scenario: `{sim.farm.broken}`'s ambient-temperature sensor fails "
        f"({options.sensor_fault}) at t = {schedule.fault_at:g} s; warm air reaches "
        f"`{sim.farm.warm}` at t = {schedule.warm_at:g} s.",
        "- Set-up: " + ", ".join(f"{k} {v} s" for k, v in log.setup_seconds.items()) + ".",
        "",
        "## Checks",
        "",
        "| check | result | detail |",
        "|---|---|---|",
        *(f"| {c.name} | {'ok' if c.ok else '**FAILED**'} | {c.detail} |" for c in result.checks),
        "",
        "## The anomaly, turbine by turbine",
        "",
        "Seconds after the turbine's fault (the sensor failure, or the arrival of the warm air):"
        " suspicion = its rule request reaches the broker; rules applied = its status shows the"
        " anomaly rules; diagnosis = its status reports a finding; released = its status is"
        " back to the base rules after the cloud's release.",
        "",
        "| turbine | cause | suspicion | rules applied | diagnosis | finding | right? | released |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for t in result.timelines:
        lines.append(
            f"| {t.device} | {t.cause} | {_s(t.suspicion)} | {_s(t.rules_applied)} | "
            f"{_s(t.diagnosis)} | {t.finding or '-'} | {'yes' if t.right else 'no'} | "
            f"{_s(t.released)} |"
        )
    lines += [
        "",
        "## Rule updates on the devices: incremental vs from scratch",
        "",
        "Live = the engine time the agent logged when it applied the bundle. Replayed = the same"
        " update applied again, after the run, to a copy of the device's SQLite state, and a"
        " from-scratch materialisation of the same rules and facts, in the same process;"
        " results compared fact for fact.",
        "",
        "| turbine | update | live ms | replayed incremental ms | from scratch ms | speed-up "
        "| equal |",
        "|---|---|---|---|---|---|---|",
        *(
            f"| {u.device} | {u.update} | {_ms(u.live_seconds)} | {_ms(u.incremental_seconds)} | "
            f"{_ms(u.scratch_seconds)} | {u.speedup:.1f}x | {'yes' if u.equal else '**no**'} |"
            for u in result.updates
        ),
        "",
        "## Latencies",
        "",
        "| what | count | median ms | p95 ms | max ms |",
        "|---|---|---|---|---|",
        *(
            f"| {what} | {_distribution(values)} |"
            for what, values in (
                ("base bundle published -> applied (status)", result.base_latencies.values()),
                ("rule request -> answering bundle published", result.answer_latencies),
                ("reading published -> agent's telemetry out", result.telemetry_latencies),
            )
        ),
        "",
        "## Messages on the broker",
        "",
        "Published messages seen by the harness's monitor, per topic kind (payload bytes):",
        "",
        "| kind | messages | bytes |",
        "|---|---|---|",
        *(f"| {kind} | {count} | {size} |" for kind, (count, size) in result.messages.items()),
    ]
    if result.broker_totals:
        lines += [
            "",
            "Broker totals ($SYS, summed over restarts; `sent` includes the fan-out to every "
            "subscriber): "
            + ", ".join(f"{k}: {v}" for k, v in sorted(result.broker_totals.items()))
            + ".",
        ]
    if log.faults:
        lines += ["", "## Faults injected", "", "| t (s) | fault | details |", "|---|---|---|"]
        for fault in log.faults:
            details = {k: v for k, v in fault.items() if k not in ("fault", "t", "at")}
            lines.append(
                f"| {fault['t']} | {fault['fault']} | {json.dumps(details) if details else ''} |"
            )
        if result.burst_rate:
            lines.append(
                f"\nThe burst of {log.burst['messages']} readings was absorbed at "
                f"{result.burst_rate:.0f} readings/s (last reading back as telemetry)."
            )
    if log.notes:
        lines += ["", "## Notes", "", *(f"- {note}" for note in log.notes)]
    lines += ["", "## Plots", ""]
    lines += [f"![{name}]({path.name})" for name, path in plots.items()]
    broker_files = f"; broker log: `{sim.broker.log_file}`" if sim.broker is not None else ""
    lines += [
        "",
        f"Agent configs, SQLite files and logs: `{sim.directory / 'agents'}`{broker_files}.",
        "",
    ]
    path = directory / "report.md"
    path.write_text("\n".join(lines))
    return path


def write_plots(result: Result, directory: Path) -> dict[str, Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sim = result.sim
    paths = {name: directory / file for name, file in PLOTS.items()}

    # 1. timeline: events of the suspicious turbines (top), ambient readings (bottom)
    fig, (events, temps) = plt.subplots(
        2, 1, sharex=True, figsize=(11, 6.5), gridspec_kw={"height_ratios": [1, 2]}
    )
    markers = {
        "fault": ("x", "fault"),
        "suspicion": ("o", "suspicion (request)"),
        "rules_applied": ("s", "anomaly rules applied"),
        "diagnosis": ("*", "diagnosis reported"),
        "released": ("v", "rules released"),
    }
    for row, line in enumerate(result.timelines):
        times = {"fault": 0.0} | {name: getattr(line, name) for name in markers if name != "fault"}
        known = {k: line.fault_at + v for k, v in times.items() if v is not None}
        events.plot(list(known.values()), [row] * len(known), color="grey", linewidth=1)
        for name, at in known.items():
            marker, label = markers[name]
            events.plot(
                [at],
                [row],
                marker=marker,
                markersize=9,
                linestyle="",
                color=f"C{list(markers).index(name)}",
                label=label if row == 0 else None,
            )
    events.set_yticks(
        range(len(result.timelines)),
        [f"{line.device}\n{line.finding or line.cause}" for line in result.timelines],
        fontsize=7,
    )
    events.set_ylim(-0.7, len(result.timelines) - 0.3)
    events.legend(fontsize=7, ncol=5, loc="upper center", bbox_to_anchor=(0.5, 1.35))
    for device, points in result.series.items():
        if points:
            xs, ys = zip(*points, strict=True)
            label = {sim.farm.broken: " (broken sensor)", sim.farm.warm: " (warm air)"}.get(
                device, " (neighbour of the warm turbine)"
            )
            temps.plot(xs, ys, label=device + label, linewidth=1.2)
    normal = [v for pts in result.series.values() for _, v in pts if v < 60]
    if normal:
        temps.set_ylim(min(normal) - 1, max(normal) + 3)
    if sim.options.sensor_fault == "stuck":
        temps.annotate(
            f"{sim.farm.broken} reads 85.0 from t = {sim.schedule.fault_at:g} s (off scale)",
            (sim.schedule.fault_at, temps.get_ylim()[1]),
            xytext=(5, -12),
            textcoords="offset points",
            fontsize=8,
        )
    for fault in sim.log.faults:
        for axis in (events, temps):
            axis.axvline(fault["t"], color="red", alpha=0.4, linewidth=1)
        temps.annotate(
            fault["fault"],
            (fault["t"], temps.get_ylim()[0]),
            rotation=90,
            fontsize=7,
            color="red",
            xytext=(2, 4),
            textcoords="offset points",
        )
    temps.set_xlabel("scenario time (s)")
    temps.set_ylabel("ambient temperature (°C)")
    temps.legend(fontsize=7, loc="upper left")
    fig.suptitle("Scenario timeline (red lines: injected faults)", y=0.995)
    fig.tight_layout()
    fig.savefig(paths["timeline"], dpi=110)
    plt.close(fig)

    # 2. latency distributions
    fig, ax = plt.subplots(figsize=(8, 4))
    data = {
        "base bundle\napplied": [v * 1000 for v in result.base_latencies.values()],
        "request ->\nanswer": [v * 1000 for v in result.answer_latencies],
        "reading ->\ntelemetry": [v * 1000 for v in result.telemetry_latencies],
    }
    data = {k: v for k, v in data.items() if v}
    if data:
        ax.boxplot(list(data.values()), tick_labels=list(data.keys()))
    ax.set_ylabel("milliseconds")
    ax.set_title("Latency distributions")
    fig.tight_layout()
    fig.savefig(paths["latency"], dpi=110)
    plt.close(fig)

    # 3. incremental vs recompute per update
    fig, ax = plt.subplots(figsize=(8, 4))
    labels = [f"{u.device}\n{u.update}" for u in result.updates]
    xs = range(len(labels))
    ax.bar(
        [x - 0.2 for x in xs],
        [u.incremental_seconds * 1000 for u in result.updates],
        0.4,
        label="incremental",
    )
    ax.bar(
        [x + 0.2 for x in xs],
        [u.scratch_seconds * 1000 for u in result.updates],
        0.4,
        label="from scratch",
    )
    ax.set_xticks(list(xs), labels, fontsize=7)
    ax.set_ylabel("milliseconds (replayed)")
    ax.set_title("Rule updates on the devices: incremental vs from scratch")
    ax.legend()
    fig.tight_layout()
    fig.savefig(paths["updates"], dpi=110)
    plt.close(fig)
    return paths
