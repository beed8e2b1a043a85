"""The running agent's metrics and health endpoints: the registry, the scrape-time collector,
the snapshot exchange with the loop and the HTTP port (``[metrics] listen``), for an
``agent.sync.AgentService``."""

from __future__ import annotations

import logging
import sqlite3

from prometheus_client import CollectorRegistry

from agent.observability.metrics import (
    AgentCollector,
    HealthFigures,
    SnapshotExchange,
    UpdateMetrics,
    render,
    take_snapshot,
)
from agent.observability.server import ObservabilityServer

log = logging.getLogger("zodiac.metrics")


class AgentObserver:
    def __init__(self, service) -> None:
        self.service = service
        config = service.config
        self.registry = CollectorRegistry(auto_describe=False)
        self.updates = UpdateMetrics(self.registry)
        self.snapshots = SnapshotExchange(lambda: take_snapshot(service.agent), service.wake)
        self.registry.register(
            AgentCollector(self.snapshots.request, self._health, config.events.max_pending)
        )
        self.server = ObservabilityServer(
            config.metrics.address(),
            metrics=lambda: render(self.registry),
            alive=service.liveness,
            ready=lambda: service.readiness(outbox_depth(service.agent.state.file)),
        )

    def _health(self) -> HealthFigures:
        service = self.service
        return HealthFigures(
            alive=service.liveness().ok,
            ready=service.readiness(outbox_depth(service.agent.state.file)).ok,
            connected=service.connected.is_set(),
        )

    def start(self) -> AgentObserver:
        self.server.start()
        host, _ = self.service.config.metrics.address()
        log.info(
            "metrics listening",
            extra={"fields": {"host": host, "port": self.server.port, "url": self.url}},
        )
        return self

    @property
    def url(self) -> str:
        host, _ = self.service.config.metrics.address()
        shown = f"[{host}]" if ":" in host else host
        return f"http://{shown}:{self.server.port}"

    def stop(self) -> None:
        self.server.stop()


def outbox_depth(file) -> int | None:
    """Events in the outbox, read on a connection of the caller's own (the HTTP thread must
    not use the agent's; WAL lets a reader in while the agent writes). None: unreadable."""
    try:
        conn = sqlite3.connect(f"file:{file}?mode=ro", uri=True, timeout=1.0)
        try:
            return conn.execute("SELECT count(*) FROM outbox").fetchone()[0]
        finally:
            conn.close()
    except sqlite3.Error:
        return None
