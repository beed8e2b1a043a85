"""Benchmark: what metrics cost the agent's hot path, and what a scrape costs a large device.

    python -m simulations.bench.metrics [--updates K] [--repeat R] [--facts N] [--scrapes S]
                                        [--markdown [FILE]]

* ``reading update``: K readings of one sensor through the agent's service loop
  (``AgentService._dispatch``, what a message on the readings topic runs: decode, reason,
  commit to SQLite with synchronous=OFF, report), the value alternating between hot and
  normal so that a derived fact appears and disappears each time. Metrics off
  (``update_metrics`` None) and on (the counters and histogram of agent/observability/
  metrics.py) alternate update by update on one agent; the best of R passes is kept. The
  ratio is on / off: 1 means metrics cost nothing measurable.
* ``scrape``: a real HTTP GET of ``/metrics`` on a running service (its loop on a thread of
  its own, no broker) whose state holds N explicit readings and the facts one rule derives
  from a quarter of them (N = 80,000: 100,000 facts). The scrape asks the loop for the
  state's figures (agent/observability/metrics.py, ``SnapshotExchange``) and renders the
  text; best of S.

Absolute times are noisy on a shared machine; read the ratio (both sides in one run).
"""

from __future__ import annotations

import argparse
import logging
import shutil
import socket
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from prometheus_client import CollectorRegistry

from agent.config import AgentConfig
from agent.observability.metrics import UpdateMetrics
from agent.protocol.keys import generate_key_pair
from agent.protocol.messages import Telemetry, encode_fact, encode_model
from agent.service import Agent
from agent.sync import AgentService, Incoming
from simulations.bench.table import Table, add_markdown_option, write_markdown
from simulations.bench.timing import timed

RULE = "hot: <Hot>(X) :- <temp>(X, T) and COMP(T, >, 30) ."


def closed_port() -> int:
    """A port nothing listens on (the benchmark's broker: the service never connects)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def make_service(directory: Path, *, listen: str | None = None) -> AgentService:
    keys = directory / "keys"
    keys.mkdir(parents=True, exist_ok=True)
    generate_key_pair(keys, "cloud")
    (keys / "cloud.key").unlink()
    rules = directory / "hot.rules"
    rules.write_text(RULE + "\n")
    metrics = f'[metrics]\nlisten = "{listen}"\n' if listen else ""
    text = (
        f'device = "t1"\nfarm = "farm1"\nsynchronous = "OFF"\n'
        f"[broker]\nport = {closed_port()}\nreconnect_min_delay = 60\nreconnect_max_delay = 60\n"
        f'[keys]\ntrusted_keys = "{keys}"\n[reasoning]\nrules = ["{rules}"]\n'
        f"[telemetry]\nmax_readings = 100000\nmax_message_bytes = 100000000\n"
        f"[limits]\nmax_sensors = 1000000\n{metrics}"
    )
    (directory / "agent.toml").write_text(text)
    return AgentService(Agent(AgentConfig.load(directory / "agent.toml")))


def reading(service: AgentService, facts: list[tuple], at: float) -> Incoming:
    telemetry = Telemetry(
        device="t1", farm="farm1", readings=[encode_fact(f) for f in facts], sent_at=at
    )
    return Incoming(service.config.topic("readings"), encode_model(telemetry), 0, 0)


def update_cost(k: int, repeat: int) -> tuple[float, float]:
    """Best seconds per reading update, metrics off and on."""
    directory = Path(tempfile.mkdtemp(prefix="zodiac-bench-metrics-"))
    try:
        service = make_service(directory)
        base = [("temp", f"s{i}", i % 50) for i in range(100)]
        service.agent.clock = lambda: time.time() + 1e6  # (readings dated ahead are not refused)
        at = time.time()
        service._dispatch(reading(service, base, at))
        metrics = UpdateMetrics(CollectorRegistry(auto_describe=False))
        sides = {"off": None, "on": metrics}
        best = dict.fromkeys(sides, float("inf"))
        hot = False  # (s7 holds 7 now)
        for _ in range(repeat):
            totals = dict.fromkeys(sides, 0.0)
            for number in range(k):
                order = list(sides.items())
                for name, recorder in order if number % 2 else order[::-1]:
                    at += 1
                    hot = not hot
                    item = reading(service, [("temp", "s7", 35 if hot else 10)], at)
                    service.update_metrics = recorder

                    def step(item=item):
                        outcome = service._dispatch(item)
                        assert outcome.status == "applied", outcome

                    totals[name] += timed(step)
            for name in sides:
                best[name] = min(best[name], totals[name] / k)
        service.client.loop_stop()
        service.agent.close()
        return best["off"], best["on"]
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def scrape_cost(n: int, scrapes: int) -> tuple[float, int, int]:
    """Best seconds per real scrape, the facts held, and the size of the text."""
    directory = Path(tempfile.mkdtemp(prefix="zodiac-bench-scrape-"))
    try:
        service = make_service(directory, listen="127.0.0.1:0")
        facts = [("temp", f"s{i}", 35 if i % 4 == 0 else 10) for i in range(n)]
        service.agent.state.apply(add_facts=facts, source="sensor")
        held = service.agent.reasoner.count()
        thread = threading.Thread(target=service.run, kwargs={"install_signals": False})
        thread.start()
        try:
            while service.observer is None:
                time.sleep(0.01)
            url = service.observer.url + "/metrics"
            best, size = float("inf"), 0
            for _ in range(scrapes):
                started = time.perf_counter()
                with urllib.request.urlopen(url, timeout=30) as response:
                    body = response.read()
                best = min(best, time.perf_counter() - started)
                size = len(body)
                assert b"zodiac_agent_facts " in body
        finally:
            service.stop()
            thread.join(30)
        return best, held, size
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--updates", type=int, default=200, help="readings per pass (200)")
    parser.add_argument("--repeat", type=int, default=5, help="passes; the best is kept (5)")
    parser.add_argument(
        "--facts", type=int, default=80_000, help="explicit readings at scrape (80,000)"
    )
    parser.add_argument("--scrapes", type=int, default=5, help="scrapes; the best is kept (5)")
    add_markdown_option(parser)
    args = parser.parse_args(argv)
    logging.getLogger("zodiac").setLevel(logging.ERROR)  # (no broker: its warnings are noise)
    off, on = update_cost(args.updates, args.repeat)
    ratio = on / off if off else float("inf")
    print(f"reading update, {args.updates} per pass, best of {args.repeat}:")
    print(f"  metrics off {off * 1e3:8.3f} ms   on {on * 1e3:8.3f} ms   on / off x{ratio:.3f}")
    hot = Table(
        ["reading update", "off ms", "on ms", "on / off"], "lrrr", title="Metrics on the hot path"
    )
    hot.add("one sensor's reading", f"{off * 1e3:.3f}", f"{on * 1e3:.3f}", f"{ratio:.3f}")
    seconds, held, size = scrape_cost(args.facts, args.scrapes)
    print(
        f"scrape of /metrics, {held} facts held, best of {args.scrapes}: "
        f"{seconds * 1e3:.1f} ms, {size} bytes"
    )
    scrape = Table(["facts held", "scrape ms", "bytes"], "rrr", title="A scrape")
    scrape.add(f"{held:,}", f"{seconds * 1e3:.1f}", f"{size:,}")
    write_markdown(args.markdown, [hot, scrape])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
