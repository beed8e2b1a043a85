"""``zodiac-cloud serve --metrics-listen HOST:PORT``: the cloud service's Prometheus metrics
and health endpoints (docs/operations.md lists every metric). All of them are read at scrape
time from what the :class:`cloud.publisher.Publisher` counts anyway; the port and the
endpoints are the agent's (agent/observability/server.py)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from agent.config import listen_address
from agent.observability.health import Verdict
from agent.observability.server import ObservabilityServer

# name -> (type, labels, help): the list docs/operations.md is checked against.
METRICS: dict[str, tuple[str, tuple[str, ...], str]] = {
    "zodiac_cloud_devices_seen": ("gauge", (), "Devices whose status the service received."),
    "zodiac_cloud_devices_online": ("gauge", (), "Devices whose last status says online."),
    "zodiac_cloud_devices_not_ready": (
        "gauge",
        (),
        "Online devices whose last status says not ready (its health reasons).",
    ),
    "zodiac_cloud_statuses_received_total": ("counter", (), "Device statuses received."),
    "zodiac_cloud_events_received_total": ("counter", (), "Device events received."),
    "zodiac_cloud_events_kept_total": (
        "counter",
        (),
        "Device events kept (a copy of an event kept already counts once).",
    ),
    "zodiac_cloud_bundles_published_total": ("counter", (), "Signed bundles published."),
    "zodiac_cloud_requests_total": (
        "counter",
        ("outcome",),
        "Devices' rule requests, by what became of them (answered, ignored and why).",
    ),
    "zodiac_cloud_device_refusals_total": (
        "counter",
        ("reason",),
        "Refusals devices reported in their status (each new last_error once), by reason.",
    ),
    "zodiac_cloud_broker_connected": ("gauge", (), "1 while connected to the broker."),
}


class PublisherCollector(Collector):
    def __init__(self, publisher) -> None:
        self.publisher = publisher

    def collect(self) -> Iterator:
        publisher = self.publisher
        with publisher.lock:  # (the statuses change on paho's thread)
            statuses = list(publisher.statuses.values())
            outcomes: Counter[str] = Counter()
            for (_, outcome), count in publisher.request_outcomes.items():
                outcomes[outcome] += count
            refusals = dict(publisher.device_refusals)
        online = [s for s in statuses if s.online]
        yield _gauge("zodiac_cloud_devices_seen", len(statuses))
        yield _gauge("zodiac_cloud_devices_online", len(online))
        not_ready = [s for s in online if s.health is not None and not s.health.ready]
        yield _gauge("zodiac_cloud_devices_not_ready", len(not_ready))
        yield _counter("zodiac_cloud_statuses_received_total", publisher.statuses_received)
        yield _counter("zodiac_cloud_events_received_total", publisher.events_received)
        yield _counter("zodiac_cloud_events_kept_total", publisher.events_kept)
        yield _counter("zodiac_cloud_bundles_published_total", publisher.bundles_published)
        yield _by_label("zodiac_cloud_requests_total", dict(outcomes))
        yield _by_label("zodiac_cloud_device_refusals_total", refusals)
        yield _gauge("zodiac_cloud_broker_connected", int(publisher.client.is_connected()))


def _gauge(name: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, METRICS[name][2], value=value)


def _counter(name: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name.removesuffix("_total"), METRICS[name][2], value=value)


def _by_label(name: str, values: dict[str, int]) -> CounterMetricFamily:
    (label,) = METRICS[name][1]
    family = CounterMetricFamily(name.removesuffix("_total"), METRICS[name][2], labels=[label])
    for key, count in sorted(values.items()):
        family.add_metric([key], count)
    return family


def serve_metrics(publisher, listen: str) -> ObservabilityServer:
    """Start serving the publisher's metrics on ``listen`` (``HOST:PORT``, port 0: a free
    one). Alive while the process answers; ready while connected to the broker."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(PublisherCollector(publisher))

    def ready() -> Verdict:
        if publisher.client.is_connected():
            return Verdict(True)
        return Verdict(False, ["broker: not connected"])

    return ObservabilityServer(
        listen_address(listen),
        metrics=lambda: generate_latest(registry),
        alive=lambda: Verdict(True),
        ready=ready,
        option="--metrics-listen",
    ).start()
