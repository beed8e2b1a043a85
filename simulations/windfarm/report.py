"""The run's report: ``report.md`` and three PNG plots next to it (matplotlib, no display)."""

from __future__ import annotations

import json
import os
import statistics
from pathlib import Path

from simulations.mqttbroker import EmbeddedBroker
from simulations.windfarm.analysis import REPEAT, Result
from simulations.windfarm.cloud import merged_names

#: Why the replayed times are smaller than the live ones (the report and the update plot say it).
REPLAY_NOTE = (
    f"Replayed times are the best of {REPEAT} runs after a warm-up, one device at a time with"
    " the CPU to themselves; a live time is the one run in the agent during the scenario, the"
    " first time its planner met those rules, while the other agents, the broker and the"
    " harness shared the CPU: so live times are several times longer, and only the replayed"
    " ones compare incremental with from scratch."
)
#: Fewer samples than this are shown as points, not as a box (a box of 2 says nothing).
MIN_BOX_SAMPLES = 5

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


def event_latency_lines(result: Result) -> list[str]:
    """The diagnoses reported through events and their latency from the reading that caused
    them, per diagnosis: what is measured, then the table (see analysis.DiagnosisEvent)."""
    events = result.diagnosis_events
    lines = [
        "Diagnoses through events (`zodiac/<farm>/<device>/events`, QoS 1; one per `(device, "
        "seq)`, however many copies were sent), and their latency from the reading that caused "
        "them: that reading batch's `sent_at` (the harness's clock, the machine the agents run "
        "on) to the event's arrival at the broker (the harness's monitor, a subscriber) and at "
        "the cloud (the `received_at` the cloud's service kept in its ledger's `events` "
        "table). The reading of an event caused by a bundle (the answer to the device's rule "
        "request, whose rules made the diagnosis) is the one that made the device suspicious "
        "(its first after its fault that base rule b1 flags), so that latency spans the whole "
        "round trip (reading, suspicion, request, answer, diagnosis, event); of an event caused "
        "by a neighbour's telemetry, that neighbour's latest reading before the telemetry; of "
        "one caused by a window's expiry (a frozen sensor), the moment the last reading unlike "
        "the later ones left the window (the earliest the diagnosis could be made). "
        "Sample counts are diagnoses; p50 and p99 of few samples are their median and maximum.",
        "",
        "| diagnosis | turbines | cause of the event | samples | reading -> event at the "
        "broker p50 ms | p99 ms | reading -> event at the cloud p50 ms | p99 ms |",
        "|---|---|---|---|---|---|---|---|",
    ]
    groups: dict[tuple[str, str], list] = {}
    for event in events:
        groups.setdefault((event.diagnosis, event.cause), []).append(event)
    for (diagnosis, cause), group in sorted(groups.items()):
        devices = ", ".join(sorted({e.device for e in group}))
        broker = [e.to_broker for e in group if e.to_broker is not None]
        cloud = [e.to_cloud for e in group if e.to_cloud is not None]
        lines.append(
            f"| {diagnosis} | {devices} | {cause} | {len(group)} | {_p50_p99(broker)} | "
            f"{_p50_p99(cloud)} |"
        )
    if not events:
        lines.append("| none | - | - | 0 | - | - | - | - |")
    traced = sum(e.reading_sent is not None for e in events)
    if traced < len(events):
        lines += [
            "",
            f"{len(events) - traced} of {len(events)} diagnoses could not be traced "
            "back to a reading (their cause's bundle or request was not seen).",
        ]
    return lines


def _p50_p99(values: list[float]) -> str:
    """``p50 | p99`` in milliseconds (``- | -`` without a sample)."""
    if not values:
        return "- | -"
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
    return f"{_ms(statistics.median(ordered))} | {_ms(p99)}"


def _relative(path: Path | str, directory: Path) -> str:
    """``path`` as seen from the report's folder: the report is read on other machines and
    its folder moved or archived, so it names no absolute path of the machine it ran on."""
    return Path(os.path.relpath(Path(path).resolve(), Path(directory).resolve())).as_posix()


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
        + (
            f" (Spark start-up {sim.graph.startup_seconds:.1f} s)"
            if sim.graph.materialiser.startswith("spark")
            else ""
        )
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
        " results compared fact for fact. " + REPLAY_NOTE,
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
        *event_latency_lines(result),
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
    broker_log = getattr(sim.broker, "log_file", None) if sim.broker is not None else None
    broker_files = f"; broker log: `{_relative(broker_log, directory)}`" if broker_log else ""
    lines += [
        "",
        "Agent configs, SQLite files and logs (relative to this report's folder): "
        f"`{_relative(sim.directory / 'agents', directory)}`{broker_files}.",
        "",
    ]
    path = directory / "report.md"
    path.write_text("\n".join(lines))
    return path


def write_plots(result: Result, directory: Path) -> dict[str, Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = {name: directory / file for name, file in PLOTS.items()}

    for name, draw in (
        ("timeline", timeline_figure),
        ("latency", latency_figure),
        ("updates", updates_figure),
    ):
        fig = draw(plt, result)
        fig.savefig(paths[name], dpi=110)
        plt.close(fig)
    return paths


#: Each event of a turbine's timeline: marker, label, vertical offset within the turbine's
#: row (events a few milliseconds apart would otherwise hide each other) and z-order (the
#: diagnosis, what the plot is about, on top).
EVENT_MARKERS = {
    "fault": ("x", "fault", -0.24, 3),
    "suspicion": ("o", "suspicion (request)", -0.12, 3),
    "rules_applied": ("s", "anomaly rules applied", 0.0, 3),
    "diagnosis": ("*", "diagnosis reported", 0.12, 5),
    "released": ("v", "rules released", 0.24, 4),
}


def timeline_title(result: Result) -> str:
    """What the timeline shows, sample counts included; red fault lines only when faults were
    injected (a default run has none)."""
    sim = result.sim
    events = sum(
        1
        for line in result.timelines
        for name in EVENT_MARKERS
        if name == "fault" or getattr(line, name) is not None
    )
    readings = sum(len(points) for points in result.series.values())
    title = (
        f"Scenario timeline: {events} events of {len(result.timelines)} suspicious turbines "
        f"(top), {readings} ambient readings of {len(result.series)} turbines (bottom)"
    )
    faults = len(sim.log.faults)
    if faults:
        title += f"; red lines: {faults} injected fault{'s' if faults != 1 else ''}"
    return title


def timeline_figure(plt, result: Result):
    sim = result.sim
    fig, (events, temps) = plt.subplots(
        2, 1, sharex=True, figsize=(11, 6.5), gridspec_kw={"height_ratios": [1, 2]}
    )
    for row, line in enumerate(result.timelines):
        times = {"fault": 0.0} | {n: getattr(line, n) for n in EVENT_MARKERS if n != "fault"}
        known = {k: line.fault_at + v for k, v in times.items() if v is not None}
        events.plot(list(known.values()), [row] * len(known), color="grey", linewidth=1, zorder=1)
        for name, at in known.items():
            marker, label, offset, zorder = EVENT_MARKERS[name]
            events.plot(
                [at],
                [row + offset],
                marker=marker,
                markersize=12 if name == "diagnosis" else 8,
                markeredgecolor="black" if name == "diagnosis" else None,
                linestyle="",
                color=f"C{list(EVENT_MARKERS).index(name)}",
                label=label if row == 0 else None,
                zorder=zorder,
            )
    events.set_yticks(
        range(len(result.timelines)),
        [f"{line.device}\n{line.finding or line.cause}" for line in result.timelines],
        fontsize=7,
    )
    events.set_ylim(-0.7, len(result.timelines) - 0.3)
    if result.timelines:
        events.legend(fontsize=7, ncol=5, loc="upper center", bbox_to_anchor=(0.5, 1.35))
    for device, points in result.series.items():
        if points:
            xs, ys = zip(*points, strict=True)
            label = {sim.farm.broken: " (broken sensor)", sim.farm.warm: " (warm air)"}.get(
                device, " (neighbour of the warm turbine)"
            )
            temps.plot(
                xs,
                ys,
                label=f"{device}{label}, {len(points)} reading{'s' if len(points) != 1 else ''}",
                linewidth=1.2,
            )
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
            axis.axvline(fault["t"], color="red", alpha=0.4, linewidth=1, zorder=0)
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
    if result.series:
        temps.legend(fontsize=7, loc="upper left")
    fig.suptitle(timeline_title(result), y=0.995, fontsize=10)
    fig.tight_layout()
    return fig


def latency_samples(result: Result) -> dict[str, list[float]]:
    """Each latency's samples, in milliseconds (the plot's groups, empty ones included)."""
    return {
        "base bundle\napplied": [v * 1000 for v in result.base_latencies.values()],
        "request ->\nanswer": [v * 1000 for v in result.answer_latencies],
        "reading ->\ntelemetry": [v * 1000 for v in result.telemetry_latencies],
    }


def latency_figure(plt, result: Result):
    """A box per latency with its sample count; fewer than MIN_BOX_SAMPLES: the points."""
    fig, ax = plt.subplots(figsize=(8, 4))
    data = latency_samples(result)
    boxes = {k: v for k, v in data.items() if len(v) >= MIN_BOX_SAMPLES}
    positions = {name: n + 1 for n, name in enumerate(data)}
    if boxes:
        ax.boxplot(
            list(boxes.values()),
            positions=[positions[k] for k in boxes],
            widths=0.5,
            manage_ticks=False,
        )
    few = {k: v for k, v in data.items() if 0 < len(v) < MIN_BOX_SAMPLES}
    for name, values in few.items():
        ax.plot([positions[name]] * len(values), values, "D", color="C0", linestyle="")
    ax.set_xticks(
        list(positions.values()),
        [
            f"{name}\nn = {len(values)}" + (" (points)" if name in few else "")
            for name, values in data.items()
        ],
    )
    ax.set_xlim(0.5, len(data) + 0.5)
    ax.set_ylabel("milliseconds")
    total = sum(len(v) for v in data.values())
    ax.set_title(
        f"Latency distributions ({total} samples; boxes from {MIN_BOX_SAMPLES} samples up, "
        "points below that)",
        fontsize=10,
    )
    fig.tight_layout()
    return fig


def updates_figure(plt, result: Result):
    """Live and replayed times in separate panels: they are measured under different
    conditions (REPLAY_NOTE), so bars side by side would compare what cannot be compared."""
    fig, (live, replayed) = plt.subplots(
        1, 2, figsize=(11, 4.5), gridspec_kw={"width_ratios": [1, 2]}
    )
    labels = [f"{u.device}\n{u.update}" for u in result.updates]
    xs = list(range(len(labels)))
    measured = [
        (x, u.live_seconds * 1000)
        for x, u in zip(xs, result.updates, strict=True)
        if u.live_seconds is not None
    ]
    if measured:
        live.bar([x for x, _ in measured], [v for _, v in measured], 0.6, color="C2")
    live.set_xticks(xs, labels, fontsize=7)
    live.set_ylabel("milliseconds")
    live.set_title(f"Live, in the agents during the run\n({len(measured)} updates)", fontsize=9)
    replayed.bar(
        [x - 0.2 for x in xs],
        [u.incremental_seconds * 1000 for u in result.updates],
        0.4,
        label="incremental",
    )
    replayed.bar(
        [x + 0.2 for x in xs],
        [u.scratch_seconds * 1000 for u in result.updates],
        0.4,
        label="from scratch",
    )
    replayed.set_xticks(xs, labels, fontsize=7)
    replayed.set_ylabel("milliseconds")
    replayed.set_title(
        f"Replayed after the run, best of {REPEAT} warm runs\n({len(result.updates)} updates "
        f"of {len({u.device for u in result.updates})} turbines)",
        fontsize=9,
    )
    if result.updates:
        replayed.legend(fontsize=8)
    fig.suptitle("Rule updates on the devices: incremental vs from scratch", fontsize=10)
    fig.text(
        0.5,
        0.01,
        "Replayed times are smaller than live ones: warm, alone on the CPU, best of "
        f"{REPEAT} runs (see report.md).",
        ha="center",
        fontsize=7,
    )
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    return fig
