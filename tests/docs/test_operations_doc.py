"""docs/operations.md lists every metric the agent and the cloud service register, with its
type and labels, and no other: read from the registries themselves, filled by a real agent
(its state, a bundle applied) and a real, unconnected publisher."""

from __future__ import annotations

import re
import time
from pathlib import Path

from prometheus_client import CollectorRegistry

from agent.config import AgentConfig
from agent.observability.metrics import (
    METRICS,
    AgentCollector,
    HealthFigures,
    UpdateMetrics,
    take_snapshot,
)
from agent.service import Agent
from cloud.bundles import BundleCutter
from cloud.metrics import METRICS as CLOUD_METRICS
from cloud.metrics import PublisherCollector
from cloud.publisher import Publisher
from tests.support.agent_harness import Cloud, readings_payload

DOC = Path(__file__).resolve().parents[2] / "docs" / "operations.md"
ROW = re.compile(r"^\| `(zodiac_\w+)` \| (\w+) \| ([^|]*) \|", re.MULTILINE)


def documented() -> dict[str, tuple[str, tuple[str, ...]]]:
    rows = {}
    for name, kind, labels in ROW.findall(DOC.read_text(encoding="utf-8")):
        rows[name] = (kind, tuple(re.findall(r"`(\w+)`", labels)))
    return rows


def registered(registry: CollectorRegistry) -> dict[str, tuple[str, tuple[str, ...]]]:
    """Metric name (a counter's with ``_total``) -> (type, label names) as collected."""
    found = {}
    for family in registry.collect():
        name = family.name + "_total" if family.type == "counter" else family.name
        labels: set[str] = set()
        for sample in family.samples:
            labels |= set(sample.labels) - {"le"}
        found[name] = (family.type, tuple(sorted(labels)))
    return found


def test_every_agent_metric_is_documented(tmp_path):
    cloud = Cloud(tmp_path / "cloud")
    path = tmp_path / "agent.toml"
    path.write_text(f'device = "t1"\nfarm = "farm1"\n[keys]\ntrusted_keys = "{cloud.keys}"\n')
    agent = Agent(AgentConfig.load(path))
    bundle = cloud.bundle(
        "base",
        1,
        rules={"q": "q: <q>(X) :- <p>(X, Y) ."},
        facts=[("p", "a", 1)],
        windows=["@window <temp> 10 min as <recentTemp> ."],
    )
    assert agent.handle_bundle(cloud.sign(bundle)).status == "applied"
    reading = readings_payload("t1", "farm1", [("temp", "s1", 12.5)], sent_at=time.time())
    assert agent.record_readings(reading).status == "applied"  # (a window's series)
    agent.dropped["readings: too large"] += 1
    registry = CollectorRegistry(auto_describe=False)
    updates = UpdateMetrics(registry)
    for outcome in ("applied", "refused"):
        updates.observe("bundle", outcome, "version_gap", 0.01)
    health = HealthFigures(alive=True, ready=True, connected=False)
    registry.register(AgentCollector(lambda: take_snapshot(agent), lambda: health, 10))
    found = registered(registry)
    agent.close()
    assert set(found) == set(METRICS), "the METRICS table is what the agent registers"
    docs = documented()
    for name, (kind, labels) in found.items():
        assert name in docs, f"{name} is not in {DOC.name}"
        assert docs[name][0] == kind, f"{name}: {DOC.name} says {docs[name][0]}, it is {kind}"
        assert set(docs[name][1]) == set(labels), f"{name}: labels {labels}"


def test_every_cloud_metric_is_documented_and_nothing_else_is(tmp_path):
    cloud = Cloud(tmp_path / "cloud")
    publisher = Publisher(
        "farm1", BundleCutter(tmp_path / "cloud.db", "farm1"), {}, cloud.private, cloud.key_id
    )  # (not connected: the collector reads what it counts)
    publisher.request_outcomes["t1", "answered"] += 1
    publisher.device_refusals["version_gap"] += 1
    registry = CollectorRegistry(auto_describe=False)
    registry.register(PublisherCollector(publisher))
    found = registered(registry)
    assert set(found) == set(CLOUD_METRICS)
    docs = documented()
    for name, (kind, labels) in found.items():
        assert docs.get(name, (None,))[0] == kind, f"{name} is not in {DOC.name} as a {kind}"
        assert set(docs[name][1]) == set(labels)
    assert set(docs) == set(METRICS) | set(CLOUD_METRICS), "the page lists no other metric"
