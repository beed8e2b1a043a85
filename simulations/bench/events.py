"""Benchmark: what watching costs an update, and what an event costs the agent's state.

    python -m simulations.bench.events [--turbines N] [--updates K] [--repeat R] [--markdown [FILE]]

RS1 over DS1(N) (rules/benchmarks/rs1.rules), the paper's anomaly program, with its diagnosis
``<SensorAnomalyWindTurbine>(X)`` watched. Every update is one turbine's new reading (the old
fact deleted, the new one added), alternating between a normal value and an outlier, so that
the diagnosis appears and disappears: the case an agent meets every second.

* ``engine``: K such updates on a Reasoner without a watch and on one with the watch (and one
  with a watch on every derived relation of RS1, the heavy case). Both reasoners are built
  once, untimed; the sides alternate update by update, and the best of R passes is kept. The
  ratio is watched / unwatched: above 1, the watch costs.
* ``agent``: the same readings through ``AgentState.apply`` on a real SQLite file
  (synchronous=OFF, to time the work rather than the disk), without watches and with the
  diagnosis watched, each change then writing its event to the outbox in its own
  transaction. Bytes per event: the outbox rows' stored size (cause, changes, key) divided by
  their number.

Absolute times are noisy on a shared machine; read the ratios (both sides in one run).
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path

from agent.engine import Reasoner
from agent.state.agent_state import AgentState
from simulations.bench.datasets import AIR_TEMPERATURE, ds1, ds1_outliers, turbine
from simulations.bench.table import Table, add_markdown_option, write_markdown
from simulations.bench.timing import timed

RULES = Path(__file__).resolve().parents[2] / "rules" / "benchmarks" / "rs1.rules"
DIAGNOSIS = "<SensorAnomalyWindTurbine>(X)"
EVERY = [
    DIAGNOSIS,
    "<MoreThan3Neighbours>(X)",
    "<hasNeighbour>(X, Y)",
    "<hasNeighbourAirTemperatureMeasurementNumber>(X, Y)",
    "<hasMedianAirTemperatureMeasurementNearby>(X, Y)",
]


def readings(n: int, k: int) -> list[tuple[tuple, tuple]]:
    """K (even) updates (old reading, new reading) of one turbine in the middle of the chain,
    an outlier and its own reading in turn: a pass ends where it began."""
    facts = dict((f[1], f) for f in ds1(n) if f[0] == AIR_TEMPERATURE)
    subject = turbine(n // 2 if turbine(n // 2) not in ds1_outliers(n) else n // 2 + 1)
    current = original = facts[subject]
    steps = []
    for i in range(k + k % 2):
        new = (AIR_TEMPERATURE, subject, 60) if i % 2 == 0 else original
        steps.append((current, new))
        current = new
    return steps


def engine_rows(n: int, k: int, repeat: int) -> list[tuple[str, float, int]]:
    """(case, best seconds per update, events reported) per case."""
    cases = {"no watch": [], "diagnosis watched": [DIAGNOSIS], "every relation watched": EVERY}
    reasoners = {}
    for name, watches in cases.items():
        reasoner = Reasoner()
        reasoner.add_rules(RULES)
        reasoner.add_facts(ds1(n))
        for pattern in watches:
            reasoner.watch(pattern)
        reasoners[name] = reasoner
    steps = readings(n, k)
    best = dict.fromkeys(cases, float("inf"))
    changes = dict.fromkeys(cases, 0)
    for _ in range(repeat):
        totals = dict.fromkeys(cases, 0.0)
        for number, (old, new) in enumerate(steps):
            order = list(reasoners.items())
            for name, reasoner in order if number % 2 else order[::-1]:  # (sides alternate)
                report: dict = {}

                def step(reasoner=reasoner, report=report, old=old, new=new):
                    report.update(reasoner.update(delete_facts=[old], add_facts=[new]))

                totals[name] += timed(step)
                changes[name] += len(report.get("watched", {}))
        for name in cases:
            best[name] = min(best[name], totals[name] / len(steps))
    return [(name, best[name], changes[name] // repeat) for name in cases]


def agent_rows(n: int, k: int, repeat: int) -> tuple[list[tuple[str, float]], float, int]:
    steps = readings(n, k)
    directory = Path(tempfile.mkdtemp(prefix="zodiac-bench-events-"))
    try:
        states = {}
        for name, watches in (("no watch", []), ("diagnosis watched", [DIAGNOSIS])):
            state = AgentState(directory / f"{len(states)}.db", synchronous="OFF")
            state.apply(add_rules=RULES, add_facts=ds1(n), source="local")
            state.set_watches("local", watches)
            states[name] = state
        best = dict.fromkeys(states, float("inf"))
        for _ in range(repeat):
            totals = dict.fromkeys(states, 0.0)
            for number, (old, new) in enumerate(steps):
                order = list(states.items())
                for name, state in order if number % 2 else order[::-1]:
                    totals[name] += timed(
                        lambda s=state, o=old, w=new: s.apply(
                            delete_facts=[o], add_facts=[w], source="local"
                        )
                    )
            for name in states:
                best[name] = min(best[name], totals[name] / len(steps))
        watched = states["diagnosis watched"].conn
        count, size = watched.execute(
            "SELECT count(*), sum(length(cause) + length(changes) + 16) FROM outbox"
        ).fetchone()
        for state in states.values():
            state.close()
        return [(name, best[name]) for name in states], (size or 0) / max(count, 1), count
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turbines", type=int, default=200, help="DS1's size (default 200)")
    parser.add_argument("--updates", type=int, default=40, help="readings per pass (40)")
    parser.add_argument("--repeat", type=int, default=3, help="passes; the best is kept (3)")
    add_markdown_option(parser)
    args = parser.parse_args(argv)
    n, k, repeat = args.turbines, args.updates, args.repeat
    engine = Table(
        [f"engine update (RS1, DS1({n}))", "ms per update", "vs no watch", "watches changed"],
        "lrrr",
        title="Watches on the engine",
    )
    rows = engine_rows(n, k, repeat)
    base = rows[0][1]
    print(f"engine, RS1 over DS1({n}), {k} readings, best of {repeat}:")
    for name, seconds, changed in rows:
        ratio = seconds / base if base else float("inf")
        print(f"  {name:24} {seconds * 1e3:8.3f} ms  x{ratio:.2f}  {changed} watch changes")
        engine.add(name, f"{seconds * 1e3:.3f}", f"{ratio:.2f}", changed)
    agent = Table(
        [
            "agent change (SQLite, synchronous=OFF)",
            "ms per change",
            "vs no watch",
            "events kept",
            "bytes per event",
        ],
        "lrrrr",
        title="Events in the agent's state",
    )
    rows_agent, per_event, events = agent_rows(n, k, repeat)
    base = rows_agent[0][1]
    print(f"agent state, {k} readings, best of {repeat}:")
    for name, seconds in rows_agent:
        ratio = seconds / base if base else float("inf")
        print(f"  {name:24} {seconds * 1e3:8.3f} ms  x{ratio:.2f}")
        watched = name != "no watch"
        agent.add(
            name,
            f"{seconds * 1e3:.3f}",
            f"{ratio:.2f}",
            events if watched else 0,
            f"{per_event:.0f}" if watched else "-",
        )
    print(f"  outbox: {events} events, {per_event:.0f} bytes per event")
    write_markdown(args.markdown, [engine, agent])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
