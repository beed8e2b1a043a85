"""Benchmark: what a tick of the time windows costs, against recomputing the window rules.

    python -m simulations.bench.windows [--sensors S] [--minutes M] [--ticks T ...]
                                        [--repeat R] [--markdown [FILE]]

One device with S sensors (default 50) reading once a second, and two windows over their
readings: ``<recentAirTemperature>`` of M minutes (default 10: S * 60 * M = 30,000 window facts)
and ``<lastAirTemperature>`` of 2 minutes (6,000 more). Two window rules read them
(``WINDOW_RULES``): "stuck" (one distinct value, min = max, over at least 20 readings of the
long window) and "rising" (the average of the short window above the long one's by more than a
degree). A few sensors are frozen, a few warm up, the others read noise; so both rules hold
for some sensors and not for others.

A tick of T seconds (``--ticks``, default 1 and 10) is one update: the S * T readings since the
last tick enter both windows and the readings older than each window leave it (the expiry).
Both sides start from the same full windows, and each repetition moves time on by one tick:

* ``incremental``: the update on a reasoner that holds the windows (``Reasoner.update`` with
  the arrivals added and the expired facts deleted), as the agent applies a tick;
* ``from scratch``: a fresh reasoner materialising the window rules over the facts in the
  windows after that tick.

The agent's path (``--no-agent`` skips it) makes the same tick as the agent does: each
second's readings are one ``AgentState.apply`` carrying their window facts
(``AgentState.window_arrivals``), and the tick ends with one ``AgentState.expire_windows``,
on a SQLite file (synchronous=OFF); its from-scratch side goes second each time (it needs the
facts the tick left). Disk bytes per window fact: the SQLite files over the window facts.

The engine's sides alternate which goes first, the best of R repetitions is kept, and after the last
one the two reasoners' facts are compared (a benchmark that doubles as a check). Bytes per
window fact: the memory a reasoner with the rules and full windows keeps, less one with the
rules and no window facts (traced by tracemalloc, and resident-set growth, each in a fresh
process: simulations/bench/memory.py), over the number of window facts.

Absolute times are noisy on a shared machine; read the ratios (both sides in one run).
"""

from __future__ import annotations

import argparse
import random
import shutil
import tempfile
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from agent.engine import Reasoner
from agent.engine.language import RDF_TYPE
from agent.engine.program.parser import parse_program
from agent.state.agent_state import AgentState
from simulations.bench.memory import footprint
from simulations.bench.table import Table, add_markdown_option, factor, write_markdown
from simulations.bench.timing import timed

LONG = "recentAirTemperature"
SHORT = "lastAirTemperature"
SHORT_SECONDS = 120.0
START = 1_800_000_000.0  # the first reading's time (seconds since the epoch)
FROZEN_VALUE = 12.3
RISING_RATE = 0.01  # degrees per second: the short window's mean ends 2.4 degrees higher

# The window rules, as a stream would carry them after its @window directives (the engine
# does not keep windows: the agent does, and hands the engine their facts).
WINDOW_RULES = f"""
w1: <readingCount>(S, N) :- aggregate( <{LONG}>(S, V, T) ) on S with count(T) as N .
w2: <lowest>(S, L) :- aggregate( <{LONG}>(S, V, T) ) on S with min(V) as L .
w3: <highest>(S, H) :- aggregate( <{LONG}>(S, V, T) ) on S with max(V) as H .
stuck: <StuckSensor>(S) :- <readingCount>(S, N) and COMP(N, >=, 20)
    and <lowest>(S, L) and <highest>(S, H) and COMP(L, =, H) .
w4: <longMean>(S, A) :- aggregate( <{LONG}>(S, V, T) ) on S with avg(V) as A .
w5: <shortMean>(S, A) :- aggregate( <{SHORT}>(S, V, T) ) on S with avg(V) as A .
rising: <RisingTemperature>(S) :- <shortMean>(S, B) and <longMean>(S, A)
    and bind(B - A as D) and COMP(D, >, 1) .
"""


def sensor(index: int) -> str:
    return f"sensor:ambient-{index:03d}"


def reading(index: int, second: int, rng: random.Random) -> float:
    """Sensor ``index``'s value at ``second``: sensors 0, 5, 10... are frozen, 1, 6, 11...
    warm up steadily, the others read 12 degrees with noise."""
    if index % 5 == 0:
        return FROZEN_VALUE
    value = 12.0 + rng.uniform(-0.3, 0.3)
    if index % 5 == 1:
        value += RISING_RATE * second
    return round(value, 1)


@dataclass
class Windows:
    """Both windows' facts, oldest first, and the clock (the second of the next reading)."""

    sensors: int
    long_seconds: float
    seed: int = 0
    long: deque = field(default_factory=deque)
    short: deque = field(default_factory=deque)
    second: int = 0

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)

    def advance(self, seconds: int) -> tuple[list[tuple], list[tuple]]:
        """Read for ``seconds`` more seconds: (facts arrived, facts expired) over both
        windows; a fact leaves a window once ``now - window >= time``."""
        arrived = []
        for _ in range(seconds):
            at = START + self.second
            for index in range(self.sensors):
                value = reading(index, self.second, self.rng)
                long_fact, short_fact = (
                    (LONG, sensor(index), value, at),
                    (SHORT, sensor(index), value, at),
                )
                self.long.append(long_fact)
                self.short.append(short_fact)
                arrived += (long_fact, short_fact)
            self.second += 1
        now = START + self.second - 1  # the last reading's time
        expired = []
        for window, length in ((self.long, self.long_seconds), (self.short, SHORT_SECONDS)):
            while window and now - length >= window[0][3]:
                expired.append(window.popleft())
        return arrived, expired

    def facts(self) -> list[tuple]:
        return [*self.long, *self.short]


def filled(sensors: int, minutes: float, seed: int = 0) -> Windows:
    """Windows after a full long window of readings."""
    windows = Windows(sensors, minutes * 60.0, seed)
    windows.advance(int(minutes * 60))
    return windows


def rules():
    return parse_program(WINDOW_RULES).rules


def from_scratch(facts: list[tuple]) -> Reasoner:
    reasoner = Reasoner()
    reasoner.update(add_rules=rules(), add_facts=facts)
    return reasoner


@dataclass
class TickRow:
    tick: int  # seconds
    arrived: int
    expired: int
    incremental: float  # best seconds
    scratch: float
    equal: bool
    stuck: int
    rising: int


def tick_row(sensors: int, minutes: float, tick: int, repeat: int) -> TickRow:
    windows = filled(sensors, minutes)
    live = from_scratch(windows.facts())
    best_incremental = best_scratch = float("inf")
    arrived = expired = 0
    for number in range(repeat):
        new, old = windows.advance(tick)
        arrived, expired = len(new), len(old)
        facts = windows.facts()

        def incremental(new=new, old=old) -> None:
            live.update(add_facts=new, delete_facts=old)

        def scratch(facts=facts) -> None:
            from_scratch(facts)

        sides = [incremental, scratch] if number % 2 == 0 else [scratch, incremental]
        times = {side: timed(side) for side in sides}
        best_incremental = min(best_incremental, times[incremental])
        best_scratch = min(best_scratch, times[scratch])
    reference = from_scratch(windows.facts())
    equal = set(live.facts()) == set(reference.facts())
    return TickRow(
        tick,
        arrived,
        expired,
        best_incremental,
        best_scratch,
        equal,
        _count(live, "StuckSensor"),
        _count(live, "RisingTemperature"),
    )


def _count(reasoner: Reasoner, klass: str) -> int:
    """How many subjects are of class ``klass`` (``<klass>(X)``)."""
    return sum(1 for fact in reasoner.facts(RDF_TYPE) if fact[2] == klass)


# ------------------------------------------------------------------ the agent's path
READING = "hasAirTemperatureMesurement"
WINDOW_DIRECTIVES = f"""
@window <{READING}> 10 min as <{LONG}> .
@window <{READING}> 2 min as <{SHORT}> .
"""


@dataclass
class AgentRow:
    tick: int
    incremental: float  # best seconds: the tick's reading messages, then one expiry
    scratch: float
    equal: bool
    disk_per_fact: float  # bytes of the SQLite file per window fact


def agent_tick_row(sensors: int, minutes: float, tick: int, repeat: int) -> AgentRow:
    """The same tick through the agent's window module and state: each second's readings one
    ``AgentState.apply`` with their window facts (``window_arrivals``), then the tick's one
    ``expire_windows``, on a SQLite file (synchronous=OFF, to time the work, not the disk);
    against a fresh reasoner over the facts then in the windows."""
    directives = WINDOW_DIRECTIVES.replace("10 min", f"{minutes:g} min")
    program = parse_program(directives + WINDOW_RULES)
    rng = random.Random(0)
    directory = Path(tempfile.mkdtemp(prefix="zodiac-bench-windows-"))
    try:
        state = AgentState(directory / "device.db", synchronous="OFF")
        state.apply(add_rules=program.rules, windows=program.windows, source="local")
        second = 0

        def read(seconds: int) -> None:
            nonlocal second
            for _ in range(seconds):
                at = START + second
                readings = [(READING, sensor(i), reading(i, second, rng)) for i in range(sensors)]
                state.apply(source="local", window_facts=state.window_arrivals(readings, at, at))
                second += 1
            state.expire_windows(START + second - 1)

        read(int(minutes * 60))
        best_incremental = best_scratch = float("inf")
        for _ in range(repeat):
            # (the scratch side needs the facts after the tick: it goes second every time,
            # over the same facts the tick left)
            best_incremental = min(best_incremental, timed(lambda: read(tick)))
            facts = [f for relation in (LONG, SHORT) for f in state.windows.facts(relation)]
            best_scratch = min(best_scratch, timed(lambda facts=facts: from_scratch(facts)))
        facts = [f for relation in (LONG, SHORT) for f in state.windows.facts(relation)]
        equal = set(state.reasoner.facts()) == set(from_scratch(facts).facts())
        state.close()
        size = sum(p.stat().st_size for p in directory.iterdir())
        return AgentRow(tick, best_incremental, best_scratch, equal, size / len(facts))
    finally:
        shutil.rmtree(directory, ignore_errors=True)


# ------------------------------------------------------------------ memory (fresh processes)
def build_with_windows(sensors: int, minutes: float) -> Reasoner:
    return from_scratch(filled(sensors, minutes).facts())


def build_without(sensors: int, minutes: float) -> Reasoner:
    return from_scratch([])


def count_facts(reasoner: Reasoner) -> int:
    return reasoner.count()


def bytes_per_window_fact(sensors: int, minutes: float) -> tuple[int, float, float]:
    """(window facts, traced kept bytes per window fact, RSS bytes per window fact)."""
    window_facts = len(filled(sensors, minutes).facts())
    full = footprint(build_with_windows, count_facts, sensors, minutes)
    empty = footprint(build_without, count_facts, sensors, minutes)
    return (
        window_facts,
        (full.traced_kept - empty.traced_kept) / window_facts,
        (full.rss - empty.rss) / window_facts,
    )


def speed_up(row: TickRow | AgentRow) -> str:
    """``from scratch / tick`` of a row, as the tables print it."""
    return factor(row.scratch / row.incremental if row.incremental else float("inf"), 1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sensors", type=int, default=50, help="sensors of the device (50)")
    parser.add_argument(
        "--minutes", type=float, default=10.0, help="the long window's length (10 minutes)"
    )
    parser.add_argument(
        "--ticks", type=int, nargs="+", default=[1, 10], help="tick lengths in seconds (1 10)"
    )
    parser.add_argument("--repeat", type=int, default=5, help="ticks per length; best kept (5)")
    parser.add_argument("--no-memory", action="store_true", help="skip bytes per window fact")
    parser.add_argument(
        "--no-agent", action="store_true", help="skip the agent's path (windows + SQLite state)"
    )
    add_markdown_option(parser)
    args = parser.parse_args(argv)
    if args.sensors < 1 or args.minutes * 60 < SHORT_SECONDS or args.repeat < 1:
        parser.error("--sensors and --repeat must be at least 1, --minutes at least 2")
    if any(tick < 1 for tick in args.ticks):
        parser.error("--ticks must be whole seconds, at least 1")
    sensors, minutes = args.sensors, args.minutes
    long_facts = int(sensors * minutes * 60)
    short_facts = int(sensors * SHORT_SECONDS)
    print(
        f"{sensors} sensors at 1 reading/s; windows of {minutes:g} min ({long_facts} facts) "
        f"and 2 min ({short_facts} facts); rules stuck and rising; best of {args.repeat}:"
    )
    table = Table(
        [
            "tick (engine, window rules)",
            "readings in",
            "facts expired",
            "tick ms",
            "from scratch ms",
            "scratch / tick",
            "stuck",
            "rising",
            "equal",
        ],
        "lrrrrrrrc",
        title=f"A tick against recomputing: {sensors} sensors, {long_facts + short_facts} "
        "window facts",
    )
    ok = True
    for tick in args.ticks:
        row = tick_row(sensors, minutes, tick, args.repeat)
        ok &= row.equal
        ratio = speed_up(row)
        print(
            f"  tick of {tick:3d} s: {row.arrived // 2:5d} readings in, {row.expired:5d} facts "
            f"expired  tick {row.incremental * 1e3:9.3f} ms  from scratch "
            f"{row.scratch * 1e3:9.3f} ms  {ratio}  stuck {row.stuck} rising {row.rising}  "
            f"{'equal' if row.equal else 'MISMATCH'}"
        )
        table.add(
            f"{tick} s",
            row.arrived // 2,
            row.expired,
            f"{row.incremental * 1e3:.2f}",
            f"{row.scratch * 1e3:.1f}",
            ratio,
            row.stuck,
            row.rising,
            "yes" if row.equal else "**no**",
        )
    tables = [table]
    if not args.no_agent:
        agent = Table(
            [
                "tick (agent: windows + SQLite state)",
                "tick ms",
                "from scratch ms",
                "scratch / tick",
                "disk B/fact",
                "equal",
            ],
            "lrrrrc",
            title="The same tick through the agent's windows and state (synchronous=OFF)",
        )
        for tick in args.ticks:
            row = agent_tick_row(sensors, minutes, tick, args.repeat)
            ok &= row.equal
            ratio = speed_up(row)
            print(
                f"  agent, tick of {tick:3d} s: tick {row.incremental * 1e3:9.3f} ms  from "
                f"scratch {row.scratch * 1e3:9.3f} ms  {ratio}  {row.disk_per_fact:.0f} B/fact "
                f"on disk  {'equal' if row.equal else 'MISMATCH'}"
            )
            agent.add(
                f"{tick} s",
                f"{row.incremental * 1e3:.2f}",
                f"{row.scratch * 1e3:.1f}",
                ratio,
                f"{row.disk_per_fact:.0f}",
                "yes" if row.equal else "**no**",
            )
        tables.append(agent)
    if not args.no_memory:
        facts, traced, rss = bytes_per_window_fact(sensors, minutes)
        print(f"  memory: {facts} window facts, kept {traced:.0f} B/fact, RSS {rss:.0f} B/fact")
        memory = Table(
            ["windows in the engine", "window facts", "kept B/fact", "RSS B/fact"],
            "lrrr",
            title="Memory of the windows",
        )
        memory.add("rules + full windows, less rules alone", facts, f"{traced:.0f}", f"{rss:.0f}")
        tables.append(memory)
    write_markdown(args.markdown, tables)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
