"""The farm panel: every agent's own ``/metrics`` (``[metrics] listen``), scraped by the harness
at the start and the end of the scenario, summed up farm-wide for the report.

The figures come from the agents' Prometheus metrics (agent/observability/metrics.py), not from
the harness's bookkeeping: updates per second are the deltas of ``zodiac_agent_updates_total``
between the two scrapes over the time between them, latency quantiles are interpolated from the
deltas of the ``zodiac_agent_update_duration_seconds`` buckets (as Prometheus'
``histogram_quantile`` does; an agent restarted in between counts from zero), memory is
``zodiac_agent_memory_rss_bytes`` and ``zodiac_agent_memory_bytes_per_fact``.

The simulation runs several agents in one host process (simulations/windfarm/host.py), so an
agent's RSS is its process's, shared with the other agents of that process: the panel also
shows each device's share (the process's RSS over its agents).

A scrape of every agent is concurrent (:data:`SCRAPERS` threads, each request with a time-out),
so 800 agents take a few seconds, not one after the other.
"""

from __future__ import annotations

import math
import random
import socket
import statistics
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

SCRAPERS = 32  # concurrent requests of one farm-wide scrape
SCRAPE_TIMEOUT = 10.0  # seconds; the agent answers within its SCRAPE_WAIT (2 s) when healthy
WORST = 5  # devices listed per "worst" table


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """``count`` distinct TCP ports on ``host`` that are free now, below the kernel's ephemeral
    range: a port from that range, released for an agent to bind, can meanwhile be taken by
    another agent's outgoing MQTT connection (with hundreds of agents starting, one was). From
    a random start, so that two runs at once rarely scan the same ports."""
    low = ephemeral_low()
    if low - PORTS_FROM < 2 * count:
        return _kernel_ports(count, host)
    ports: list[int] = []
    span = low - PORTS_FROM
    offset = random.randrange(span)
    for i in range(span):
        port = PORTS_FROM + (offset + i) % span
        if _bindable(host, port):
            ports.append(port)
            if len(ports) == count:
                return ports
    return ports + _kernel_ports(count - len(ports), host)


PORTS_FROM = 10_000  # metrics ports are picked in [PORTS_FROM, start of the ephemeral range)


def ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (Linux; elsewhere IANA's 49152)."""
    try:
        text = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text()
        return int(text.split()[0])
    except (OSError, ValueError, IndexError):
        return 49152


def _bindable(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def _kernel_ports(count: int, host: str) -> list[int]:
    """``count`` distinct ports the kernel picks (all held open while more are picked)."""
    sockets, ports = [], []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((host, 0))
            sockets.append(s)
            ports.append(s.getsockname()[1])
    finally:
        for s in sockets:
            s.close()
    return ports


@dataclass
class DeviceMetrics:
    """What one scrape of one agent said (``error`` set: it did not answer)."""

    at: float
    updates: dict[tuple[str, str], float] = field(default_factory=dict)  # (kind, outcome)
    buckets: dict[float, float] = field(default_factory=dict)  # le -> count, every kind
    rss: float = 0.0
    bytes_per_fact: float = 0.0
    facts: float = 0.0
    refusals: dict[str, float] = field(default_factory=dict)
    stream_versions: dict[str, float] = field(default_factory=dict)
    error: str | None = None

    @property
    def update_count(self) -> float:
        return sum(self.updates.values())


def parse_metrics(text: str, at: float) -> DeviceMetrics:
    """One agent's exposition text, read with prometheus_client's own parser."""
    metrics = DeviceMetrics(at)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name, labels, value = sample.name, sample.labels, sample.value
            if name == "zodiac_agent_updates_total":
                key = (labels.get("kind", ""), labels.get("outcome", ""))
                metrics.updates[key] = metrics.updates.get(key, 0.0) + value
            elif name == "zodiac_agent_update_duration_seconds_bucket":
                le = float(labels["le"])
                metrics.buckets[le] = metrics.buckets.get(le, 0.0) + value
            elif name == "zodiac_agent_memory_rss_bytes":
                metrics.rss = value
            elif name == "zodiac_agent_memory_bytes_per_fact":
                metrics.bytes_per_fact = value
            elif name == "zodiac_agent_facts":
                metrics.facts = value
            elif name == "zodiac_agent_refusals_total":
                metrics.refusals[labels.get("reason", "")] = value
            elif name == "zodiac_agent_stream_version":
                metrics.stream_versions[labels.get("stream", "")] = value
    return metrics


def scrape_one(url: str) -> DeviceMetrics:
    at = time.time()
    try:
        with urllib.request.urlopen(url, timeout=SCRAPE_TIMEOUT) as response:
            text = response.read().decode("utf-8")
    except OSError as error:
        return DeviceMetrics(at, error=f"{type(error).__name__}: {error}")
    try:
        return parse_metrics(text, at)
    except ValueError as error:
        return DeviceMetrics(at, error=f"unparsable metrics: {error}")


@dataclass
class Scrape:
    """One farm-wide scrape: device -> its metrics, and how long the scrape took."""

    started: float
    seconds: float
    devices: dict[str, DeviceMetrics]

    @property
    def failed(self) -> dict[str, str]:
        return {d: m.error for d, m in self.devices.items() if m.error}


def scrape_farm(addresses: dict[str, str]) -> Scrape:
    """Scrape every device's ``http://HOST:PORT/metrics`` (device -> ``HOST:PORT``)."""
    started, clock = time.time(), time.perf_counter()
    devices = list(addresses)
    with ThreadPoolExecutor(max_workers=min(SCRAPERS, max(1, len(devices)))) as pool:
        results = pool.map(lambda d: scrape_one(f"http://{addresses[d]}/metrics"), devices)
        scraped = dict(zip(devices, results, strict=True))
    return Scrape(started, time.perf_counter() - clock, scraped)


def histogram_quantile(q: float, buckets: dict[float, float]) -> float | None:
    """The ``q`` quantile of cumulative ``buckets`` (le -> count), interpolated linearly inside
    the bucket that holds it, as Prometheus does (the +Inf bucket: its lower bound). None: no
    observations."""
    bounds = sorted(buckets)
    if not bounds or buckets[bounds[-1]] <= 0:
        return None
    total = buckets[bounds[-1]]
    rank = q * total
    lower, below = 0.0, 0.0
    for bound in bounds:
        count = buckets[bound]
        if count >= rank:
            if math.isinf(bound):
                return lower
            if count == below:
                return bound
            return lower + (bound - lower) * (rank - below) / (count - below)
        lower, below = bound, count
    return lower


@dataclass
class DeviceFigures:
    """One device's panel row, from the deltas between two scrapes."""

    device: str
    updates_per_second: float
    updates: float
    p50: float | None
    p99: float | None
    rss: float
    rss_share: float  # the process's RSS over the agents it runs
    bytes_per_fact: float
    facts: float


@dataclass
class Panel:
    """The farm-wide figures and each device's row (devices that answered both scrapes)."""

    rows: list[DeviceFigures]
    missing: dict[str, str]  # device -> why it has no row
    elapsed: float  # seconds between the two scrapes (median over devices)
    scrape_seconds: tuple[float, float]
    farm_p50: float | None
    farm_p99: float | None
    total_updates: float

    @property
    def farm_updates_per_second(self) -> float:
        return self.total_updates / self.elapsed if self.elapsed > 0 else 0.0


def build_panel(begin: Scrape, end: Scrape, agents_per_process: dict[str, int]) -> Panel:
    """The panel from the scrapes at the start and the end (counters: end minus start; gauges:
    the end's). ``agents_per_process``: device -> how many agents share its process."""
    rows, missing, elapsed = [], {}, []
    farm_buckets: dict[float, float] = {}
    for device, last in sorted(end.devices.items()):
        first = begin.devices.get(device)
        why = last.error or (first.error if first else "not scraped at the start")
        if why:
            missing[device] = why
            continue
        seconds = last.at - first.at
        elapsed.append(seconds)
        if last.update_count < first.update_count:  # restarted (agent-kill): counters from 0
            first = DeviceMetrics(first.at)
        updates = last.update_count - first.update_count
        buckets = {le: n - first.buckets.get(le, 0.0) for le, n in last.buckets.items()}
        for le, n in buckets.items():
            farm_buckets[le] = farm_buckets.get(le, 0.0) + n
        rows.append(
            DeviceFigures(
                device,
                updates / seconds if seconds > 0 else 0.0,
                updates,
                histogram_quantile(0.5, buckets),
                histogram_quantile(0.99, buckets),
                last.rss,
                last.rss / max(1, agents_per_process.get(device, 1)),
                last.bytes_per_fact,
                last.facts,
            )
        )
    return Panel(
        rows,
        missing,
        statistics.median(elapsed) if elapsed else 0.0,
        (begin.seconds, end.seconds),
        histogram_quantile(0.5, farm_buckets),
        histogram_quantile(0.99, farm_buckets),
        sum(r.updates for r in rows),
    )


# ---------------------------------------------------------------------------- the report
def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.1f} ms"


def _mb(value: float) -> str:
    return f"{value / 1e6:.1f} MB"


SUMMARIES = (
    ("updates per second", lambda r: r.updates_per_second, lambda v: f"{v:.2f}"),
    ("update latency p50", lambda r: r.p50, lambda v: _ms(v)),
    ("update latency p99", lambda r: r.p99, lambda v: _ms(v)),
    ("RSS of the agent's process", lambda r: r.rss, _mb),
    ("RSS share per agent", lambda r: r.rss_share, _mb),
    ("bytes per fact (process RSS / facts)", lambda r: r.bytes_per_fact, lambda v: f"{v:,.0f}"),
    ("facts held", lambda r: r.facts, lambda v: f"{v:,.0f}"),
)


def panel_lines(panel: Panel, devices: int) -> list[str]:
    """The report's "Farm panel" section."""
    lines = [
        "## Farm panel",
        "",
        f"From each agent's own `/metrics` (`[metrics] listen`), scraped at the start of the "
        f"scenario and at its end ({panel.elapsed:.1f} s apart), {SCRAPERS} requests at a time: "
        f"{len(panel.rows)} of {devices} agents answered both scrapes; a farm-wide scrape took "
        f"{panel.scrape_seconds[0]:.1f} s and {panel.scrape_seconds[1]:.1f} s. Updates are "
        "`zodiac_agent_updates_total` deltas, latencies are interpolated from the "
        "`zodiac_agent_update_duration_seconds` bucket deltas, memory is the agents' gauges "
        "(an agent's RSS is its host process's, shared with the other agents there).",
        "",
        f"Farm-wide: {panel.total_updates:.0f} updates, {panel.farm_updates_per_second:.1f} "
        f"per second; update latency p50 {_ms(panel.farm_p50)}, p99 {_ms(panel.farm_p99)}.",
        "",
        "| per device | min | median | max |",
        "|---|---|---|---|",
    ]
    for name, value, shown in SUMMARIES:
        values = [v for v in map(value, panel.rows) if v is not None]
        if values:
            lines.append(
                f"| {name} | {shown(min(values))} | {shown(statistics.median(values))} | "
                f"{shown(max(values))} |"
            )
        else:
            lines.append(f"| {name} | - | - | - |")
    lines += [
        "",
        f"Worst devices (by update latency p99, then bytes per fact), {WORST} each:",
        "",
        "| device | updates/s | p50 | p99 | RSS share | bytes per fact | facts |",
        "|---|---|---|---|---|---|---|",
    ]
    by_latency = sorted(panel.rows, key=lambda r: -(r.p99 or 0.0))[:WORST]
    by_memory = sorted(panel.rows, key=lambda r: -r.bytes_per_fact)[:WORST]
    listed = {row.device: row for row in [*by_latency, *by_memory]}
    for row in listed.values():
        lines.append(
            f"| {row.device} | {row.updates_per_second:.2f} | {_ms(row.p50)} | {_ms(row.p99)} | "
            f"{_mb(row.rss_share)} | {row.bytes_per_fact:,.0f} | {row.facts:,.0f} |"
        )
    if panel.missing:
        shown = ", ".join(f"{d} ({why})" for d, why in sorted(panel.missing.items())[:10])
        lines += ["", f"Not in the panel: {len(panel.missing)} agents: {shown}."]
    return lines


def panel_checks(panel: Panel, devices: int, check) -> list:
    """The report's check that the panel is whole (``check``: the analysis' Check class)."""
    whole = not panel.missing and len(panel.rows) == devices
    counted = panel.total_updates > 0 and all(r.rss > 0 for r in panel.rows)
    return [
        check(
            "farm panel from every agent's metrics",
            whole and counted,
            f"{len(panel.rows)} of {devices} agents scraped at start and end, "
            f"{panel.total_updates:.0f} updates counted"
            + (f"; missing: {', '.join(sorted(panel.missing)[:5])}" if panel.missing else ""),
        )
    ]
