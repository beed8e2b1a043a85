"""The simulation's cloud: materialise the farm graph (Spark), cut each device's base bundle,
and run the publisher that answers rule requests and releases rules once a cause is reported.

This is the product's cloud code (``cloud/``) with the simulation's defaults: Spark in local
mode, the rule streams of ``rules/windfarm/streams``, a throwaway signing key.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from agent.engine import Reasoner
from agent.protocol.keys import generate_key_pair, load_private_key
from cloud.bundles import BundleCutter, device_facts, load_streams, stream_target
from cloud.engine_job import SPARK_ABOVE
from cloud.publisher import Publisher
from simulations.windfarm.farm import ANOMALY_STREAM, CHANGE_CONFIRMED, SENSOR_ANOMALY, Farm

RULES = Path(__file__).resolve().parents[2] / "rules" / "windfarm"
FARM_PROGRAM = RULES / "farm.rules"
STREAMS = RULES / "streams"
NEIGHBOUR = "hasNeighbour"
OWL_SAME_AS = "http://www.w3.org/2002/07/owl#sameAs"
KEY_ID = "cloud"
WINDOWS_STREAM = "windows"  # rules/windfarm/streams/windows.rules: sent with the base rules


@dataclass
class FarmGraph:
    """The materialised farm graph and how it was computed."""

    facts: set[tuple]
    materialiser: str  # "spark (local[*])" or "engine"
    seconds: float
    startup_seconds: float  # Spark session start (0 for the engine)
    checked: bool  # equal to the edge engine's materialisation, fact for fact


def materialise_farm(
    farm: Farm, *, spark: str = "auto", master: str, say: Callable[[str], None]
) -> FarmGraph:
    """The farm program over the layout facts, on Spark (checked against the engine) or on
    the engine alone, as ``zodiac-cloud materialise --spark`` decides: ``auto`` runs a farm
    of at most :data:`cloud.engine_job.SPARK_ABOVE` layout facts (every farm the demo makes)
    on the engine, ``always`` starts Spark, ``never`` does not. Spark is what a large farm's
    cloud runs; for a small one it costs a JVM and a minute."""
    layout = farm.layout_facts()
    started = time.perf_counter()
    engine = Reasoner()
    engine.add_rules(FARM_PROGRAM)
    engine.add_facts(layout)
    engine_facts = set(engine.facts())
    engine_seconds = time.perf_counter() - started
    if spark == "never" or (spark == "auto" and len(layout) <= SPARK_ABOVE):
        why = "" if spark == "never" else f" ({len(layout)} facts: Spark not needed)"
        return FarmGraph(engine_facts, f"engine{why}", engine_seconds, 0.0, True)

    from pyspark.sql import SparkSession

    from cloud.spark.materialise import materialise_facts
    from cloud.spark.session import local_session

    say(f"cloud: starting Spark ({master}) to materialise the farm graph...")
    started = time.perf_counter()
    running = SparkSession.getActiveSession()  # e.g. the test suite's shared session
    spark = running or local_session(master, app_name="zodiac-windfarm", shuffle_partitions=4)
    startup = time.perf_counter() - started
    try:
        started = time.perf_counter()
        facts = materialise_facts(spark, FARM_PROGRAM, layout)
        seconds = time.perf_counter() - started
    finally:
        if running is None:
            spark.stop()
    if facts != engine_facts:
        missing, extra = engine_facts - facts, facts - engine_facts
        raise RuntimeError(
            f"Spark and the engine disagree on the farm graph: {len(missing)} facts missing "
            f"(e.g. {sorted(missing, key=repr)[:3]}), {len(extra)} extra"
        )
    return FarmGraph(facts, f"spark ({master})", seconds, startup, True)


def base_targets(farm: Farm, graph: FarmGraph, streams: dict[str, dict[str, str]]) -> dict:
    """Each device's base stream: the base rules, the facts about the device itself, and the
    other names of its neighbours (their owl:sameAs facts), so that a neighbour's readings
    under either of its names reach the device's reasoning, and a neighbour known under two
    names is one neighbour."""
    base = streams["base"]
    names: dict[str, set[tuple]] = {}
    for fact in graph.facts:
        if fact[0] == OWL_SAME_AS:
            names.setdefault(fact[1], set()).add(fact)
    targets = {}
    for t in farm.turbines:
        facts = device_facts(graph.facts, t.id, NEIGHBOUR, neighbours=False)
        for neighbour in neighbours_of(graph, t.id, farm):
            facts |= names.get(neighbour, set())
        targets[t.id] = stream_target(base, facts)
    return targets


def merged_names(graph: FarmGraph) -> tuple[int, int]:
    """(names merged, classes): how many turbine names owl:sameAs merged, into how many."""
    classes: dict[str, set[str]] = {}
    for fact in graph.facts:
        if fact[0] == OWL_SAME_AS and fact[1] != fact[2]:
            classes.setdefault(min(fact[1], fact[2]), set()).update(fact[1:])
    named = {name for members in classes.values() for name in members}
    return len(named), len({frozenset(m) for m in classes.values()})


def neighbours_of(graph: FarmGraph, device: str, farm: Farm) -> list[str]:
    """The device ids of a device's neighbours (the graph names them by their other names
    too: owl:sameAs)."""
    devices = {t.id for t in farm.turbines}
    return sorted(
        f[2] for f in graph.facts if f[0] == NEIGHBOUR and f[1] == device and f[2] in devices
    )


class SimulationCloud:
    """The signing key, the cutter's state and the running publisher."""

    def __init__(self, directory: Path, farm: Farm, host: str, port: int) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        # The agents trust this directory; they read only its ``.pub`` files.
        self.keys = directory / "keys"
        private, _public = generate_key_pair(self.keys, KEY_ID)
        self.private_key = load_private_key(private)
        self.streams = load_streams(STREAMS)
        # The rules every turbine holds all the time: its base and window rules.
        self.resident_rules = len(self.streams["base"]) + len(self.streams[WINDOWS_STREAM])
        # The publisher's ledger: what it sent, and the devices' events it kept.
        self.ledger = directory / "publisher.db"
        self.publisher = Publisher(
            farm.farm_id,
            BundleCutter(self.ledger, farm.farm_id),
            self.streams,
            self.private_key,
            KEY_ID,
            host=host,
            port=port,
            resolutions={ANOMALY_STREAM: [SENSOR_ANOMALY, CHANGE_CONFIRMED]},
            client_id=f"zodiac-cloud-{farm.farm_id}-sim",
        )
