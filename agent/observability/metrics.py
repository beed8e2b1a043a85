"""The agent's Prometheus metrics (docs/operations.md lists every one).

Two kinds, so that the hot path pays only for what must be counted as it happens:

* **Counted as it happens** (:class:`UpdateMetrics`): every message the loop handles, by
  kind and outcome, its latency in a histogram, and refusals by reason. A few dict lookups and
  lock-protected additions per message (simulations/bench/metrics.py measures the cost).
* **Read at scrape time** (:class:`AgentCollector`): facts per relation, derived facts per
  module, memory, rules and versions per stream, dropped messages, the outbox, windows, the
  times of the last bundle and reading, the health verdicts. Nothing is updated on the hot
  path for them: a scrape asks the agent's own thread for a :class:`Snapshot` (the reasoner
  and its SQLite connection belong to that thread) between two messages
  (:class:`SnapshotExchange`); if the thread is busy longer than the scrape may wait, the
  last snapshot is served, and its age says so.

``prometheus_client`` is imported by this module only, which the agent imports only when
``[metrics] listen`` is set.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client import Counter as PromCounter
from prometheus_client import Histogram as PromHistogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

log = logging.getLogger("zodiac.metrics")

# Seconds: from a reading of a few facts (milliseconds) to a bundle at the default budget (60).
UPDATE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
SCRAPE_WAIT = 2.0  # seconds a scrape waits for the agent's thread before serving the last one

# Every metric: name -> (type, labels, help). The one list docs/operations.md is checked
# against; the registrations below take their help texts from it.
METRICS: dict[str, tuple[str, tuple[str, ...], str]] = {
    "zodiac_agent_updates_total": (
        "counter",
        ("kind", "outcome"),
        "Messages handled, by kind (bundle, readings, telemetry) and outcome (applied, "
        "unchanged, duplicate, refused).",
    ),
    "zodiac_agent_update_duration_seconds": (
        "histogram",
        ("kind",),
        "Time to handle one message (verify, reason, commit), by kind.",
    ),
    "zodiac_agent_refusals_total": (
        "counter",
        ("reason",),
        "Messages refused, by reason (a bundle's reason such as version_gap or "
        "budget_exceeded; input for a reading or snapshot; state for a write that failed).",
    ),
    "zodiac_agent_dropped_messages_total": (
        "counter",
        ("reason",),
        "Incoming messages or readings dropped, by reason (the status's dropped).",
    ),
    "zodiac_agent_facts": ("gauge", (), "Facts held, explicit and derived."),
    "zodiac_agent_explicit_facts": ("gauge", (), "Explicit facts held."),
    "zodiac_agent_relation_facts": (
        "gauge",
        ("relation",),
        "Facts held per relation (name/arity).",
    ),
    "zodiac_agent_derived_facts": (
        "gauge",
        ("module",),
        "Derived facts per evaluation module of the hyper-nodes (seminaive, closure...).",
    ),
    "zodiac_agent_hyper_nodes": ("gauge", ("module",), "Hyper-nodes per evaluation module."),
    "zodiac_agent_memory_rss_bytes": ("gauge", (), "Resident memory of the agent process."),
    "zodiac_agent_memory_bytes_per_fact": (
        "gauge",
        (),
        "Resident memory divided by the facts held (0 without facts).",
    ),
    "zodiac_agent_stream_rules": ("gauge", ("stream",), "Rules held per stream (or local)."),
    "zodiac_agent_stream_version": ("gauge", ("stream",), "Applied bundle version per stream."),
    "zodiac_agent_outbox_events": ("gauge", (), "Events in the outbox, not yet acknowledged."),
    "zodiac_agent_outbox_bound_events": (
        "gauge",
        (),
        "The outbox's bound ([events] max_pending).",
    ),
    "zodiac_agent_events_over_budget_total": (
        "counter",
        (),
        "Events not kept because the outbox was full.",
    ),
    "zodiac_agent_window_facts": ("gauge", ("window",), "Facts held per reading window."),
    "zodiac_agent_last_bundle_timestamp_seconds": (
        "gauge",
        (),
        "When the last bundle was applied (Unix time; 0: never).",
    ),
    "zodiac_agent_last_reading_timestamp_seconds": (
        "gauge",
        (),
        "The time of the newest reading applied (its sent_at, Unix time; 0: none).",
    ),
    "zodiac_agent_alive": ("gauge", (), "1 when /healthz says alive."),
    "zodiac_agent_ready": ("gauge", (), "1 when /readyz says ready."),
    "zodiac_agent_broker_connected": ("gauge", (), "1 while connected to the broker."),
    "zodiac_agent_snapshot_age_seconds": (
        "gauge",
        (),
        "Age of the state figures served (above 0: the agent's thread was busy at scrape).",
    ),
}


def _help(name: str) -> str:
    return METRICS[name][2]


class UpdateMetrics:
    """The hot path's counters and histogram, in ``registry``. ``observe`` once per message."""

    def __init__(self, registry: CollectorRegistry) -> None:
        # (prometheus_client adds ``_total`` to a counter's name itself)
        self.updates = PromCounter(
            "zodiac_agent_updates",
            _help("zodiac_agent_updates_total"),
            ["kind", "outcome"],
            registry=registry,
        )
        self.duration = PromHistogram(
            "zodiac_agent_update_duration_seconds",
            _help("zodiac_agent_update_duration_seconds"),
            ["kind"],
            buckets=UPDATE_BUCKETS,
            registry=registry,
        )
        self.refusals = PromCounter(
            "zodiac_agent_refusals",
            _help("zodiac_agent_refusals_total"),
            ["reason"],
            registry=registry,
        )
        # The labelled children, looked up once each (labels() takes a lock and builds a key).
        self._counted: dict[tuple[str, str], object] = {}
        self._timed: dict[str, object] = {}

    def observe(self, kind: str, status: str, reason: str, seconds: float) -> None:
        counted = self._counted.get((kind, status))
        if counted is None:
            counted = self._counted[kind, status] = self.updates.labels(kind, status)
        counted.inc()
        timed = self._timed.get(kind)
        if timed is None:
            timed = self._timed[kind] = self.duration.labels(kind)
        timed.observe(seconds)
        if status == "refused":
            self.refusals.labels(reason or "unknown").inc()


@dataclass
class Snapshot:
    """The state's figures at one moment, taken on the agent's thread (see ``take_snapshot``)."""

    taken_at: float  # time.monotonic()
    facts: int = 0
    explicit_facts: int = 0
    relations: dict[str, int] = field(default_factory=dict)
    derived_by_module: dict[str, int] = field(default_factory=dict)
    nodes_by_module: dict[str, int] = field(default_factory=dict)
    stream_rules: dict[str, int] = field(default_factory=dict)
    stream_versions: dict[str, int] = field(default_factory=dict)
    dropped: dict[str, int] = field(default_factory=dict)
    outbox: dict[str, int] = field(default_factory=dict)
    windows: dict[str, int] = field(default_factory=dict)
    last_bundle_at: float = 0.0
    last_reading_at: float = 0.0


def take_snapshot(agent) -> Snapshot:
    """The figures of ``agent`` (an ``agent.service.Agent``) now; on the agent's thread."""
    from agent.service import SENSOR_SOURCE
    from agent.state.outbox import outbox_figures

    reasoner = agent.reasoner
    sizes = reasoner.view().sizes()
    relations = {f"{name}/{arity}": size for (name, arity), size in sizes.items()}
    derived: Counter[str] = Counter()
    nodes: Counter[str] = Counter()
    for node in reasoner.nodes:
        module = node.module.name if node.module is not None else "none"
        derived[module] += node.size()
        nodes[module] += 1
    conn = agent.state.conn
    stream_rules = dict(conn.execute("SELECT stream, count(*) FROM rules GROUP BY stream"))
    (last_bundle,) = conn.execute("SELECT max(applied_at) FROM streams").fetchone()
    (last_reading,) = conn.execute(
        "SELECT max(at) FROM reading_times WHERE source = ?", (SENSOR_SOURCE,)
    ).fetchone()
    explicit = (
        reasoner.equality.explicit_count() if reasoner.equality is not None else reasoner.edb.size()
    )
    return Snapshot(
        taken_at=time.monotonic(),
        facts=sum(relations.values()),
        explicit_facts=explicit,
        relations=relations,
        derived_by_module=dict(derived),
        nodes_by_module=dict(nodes),
        stream_rules=stream_rules,
        stream_versions=agent.state.applied_versions(),
        dropped=dict(agent.dropped),
        outbox=outbox_figures(conn),
        windows=window_sizes(agent),
        last_bundle_at=float(last_bundle or 0.0),
        last_reading_at=float(last_reading or 0.0),
    )


def window_sizes(agent) -> dict[str, int]:
    """Facts per window relation the agent holds now (agent/readings/windows.py)."""
    return dict(agent.state.windows.sizes())


class SnapshotExchange:
    """Hands a scrape's request for a :class:`Snapshot` to the agent's thread and the snapshot
    back. The HTTP thread calls :meth:`request`; the loop calls :meth:`serve` between messages
    (``wake`` makes an idle loop look at once)."""

    def __init__(self, make: Callable[[], Snapshot], wake: Callable[[], None] = lambda: None):
        self.make = make
        self.wake = wake
        self._wanted = threading.Event()
        self._done = threading.Condition()
        self._generation = 0
        self.last: Snapshot | None = None

    def request(self, timeout: float = SCRAPE_WAIT) -> Snapshot | None:
        with self._done:
            generation = self._generation
            self._wanted.set()
            self.wake()
            self._done.wait_for(lambda: self._generation > generation, timeout)
            return self.last

    def serve(self) -> None:
        if not self._wanted.is_set():
            return
        self._wanted.clear()
        try:
            snapshot = self.make()
        except Exception as error:  # noqa: BLE001 - a scrape must not stop the agent
            log.warning(
                "could not read the state's figures", extra={"fields": {"error": str(error)}}
            )
            snapshot = self.last
        with self._done:
            self.last = snapshot
            self._generation += 1
            self._done.notify_all()


def rss_bytes() -> int:
    """Resident memory of this process: /proc/self/statm (Linux), else the peak (getrusage)."""
    try:
        with open("/proc/self/statm") as handle:
            return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


@dataclass
class HealthFigures:
    alive: bool
    ready: bool
    connected: bool


class AgentCollector(Collector):
    """The scrape-time metrics (``collect`` runs on the HTTP thread)."""

    def __init__(
        self,
        snapshots: Callable[[], Snapshot | None],
        health: Callable[[], HealthFigures],
        max_pending: int,
    ) -> None:
        self.snapshots = snapshots
        self.health = health
        self.max_pending = max_pending

    def collect(self) -> Iterator:
        snapshot = self.snapshots()
        figures = self.health()
        yield _gauge("zodiac_agent_alive", int(figures.alive))
        yield _gauge("zodiac_agent_ready", int(figures.ready))
        yield _gauge("zodiac_agent_broker_connected", int(figures.connected))
        rss = rss_bytes()
        yield _gauge("zodiac_agent_memory_rss_bytes", rss)
        yield _gauge("zodiac_agent_outbox_bound_events", self.max_pending)
        if snapshot is None:
            return
        yield _gauge("zodiac_agent_snapshot_age_seconds", time.monotonic() - snapshot.taken_at)
        yield _gauge("zodiac_agent_facts", snapshot.facts)
        yield _gauge("zodiac_agent_explicit_facts", snapshot.explicit_facts)
        yield _gauge(
            "zodiac_agent_memory_bytes_per_fact", rss / snapshot.facts if snapshot.facts else 0
        )
        yield _labelled(GaugeMetricFamily, "zodiac_agent_relation_facts", snapshot.relations)
        yield _labelled(GaugeMetricFamily, "zodiac_agent_derived_facts", snapshot.derived_by_module)
        yield _labelled(GaugeMetricFamily, "zodiac_agent_hyper_nodes", snapshot.nodes_by_module)
        yield _labelled(GaugeMetricFamily, "zodiac_agent_stream_rules", snapshot.stream_rules)
        yield _labelled(GaugeMetricFamily, "zodiac_agent_stream_version", snapshot.stream_versions)
        yield _labelled(
            CounterMetricFamily, "zodiac_agent_dropped_messages_total", snapshot.dropped
        )
        yield _gauge("zodiac_agent_outbox_events", snapshot.outbox.get("pending", 0))
        over = CounterMetricFamily(
            "zodiac_agent_events_over_budget", _help("zodiac_agent_events_over_budget_total")
        )
        over.add_metric([], snapshot.outbox.get("over_budget", 0))
        yield over
        yield _labelled(GaugeMetricFamily, "zodiac_agent_window_facts", snapshot.windows)
        yield _gauge("zodiac_agent_last_bundle_timestamp_seconds", snapshot.last_bundle_at)
        yield _gauge("zodiac_agent_last_reading_timestamp_seconds", snapshot.last_reading_at)


def _gauge(name: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, _help(name), value=value)


def _labelled(kind, name: str, values: dict[str, int]):
    """A family with one label (the metric's only one) and a sample per key."""
    (label,) = METRICS[name][1]
    family_name = name.removesuffix("_total") if kind is CounterMetricFamily else name
    family = kind(family_name, _help(name), labels=[label])
    for key, value in sorted(values.items()):
        family.add_metric([key], value)
    return family


def render(registry: CollectorRegistry) -> bytes:
    """The Prometheus text format of everything in ``registry``."""
    return generate_latest(registry)
