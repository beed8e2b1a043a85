"""Benchmark: what an everyday update costs as the rule program grows.

    python -m simulations.bench.program_size [--quick] [--sizes 20,200,2000] [--repeat N]
                                             [--no-memory] [--markdown [FILE]]

A device's rule bundle may hold hundreds or thousands of rules, while its everyday updates are
small: a sensor reading, a diagnosis rule arriving from the cloud and leaving again (a rule no
other rule reads: a leaf of the dependency graph). Their cost should follow what they change,
not the program's size. For programs of each size (``simulations.bench.parse``'s bundle: rules
of a join, COMP, BIND and a negation, over 100 facts), in one run:

* ``reading``: one reading replaced (its old fact deleted, the new one added) in a reasoner
  in memory, a relation no rule reads;
* ``leaf``: a leaf rule added, then deleted;
* ``committed``: the same two through ``AgentState`` (one SQLite transaction each, with
  ``synchronous=OFF``, so the disk's flush, the same at every size, does not hide the rest);
* ``restart``: opening the saved state again.

Best of ``--repeat`` each (sizes alternate between passes, so a slow spell of the shared
machine hits every size). The ratio columns divide each time by the smallest program's: 1.0
means the update does not grow with the program. Absolute times on shared machines are noisy.
Then the memory the reasoner in memory holds per stored fact (traced kept allocation and
resident-set growth, in a fresh process after the timings: simulations/bench/memory.py), which
at 100 facts is mostly the rules' (their plans, their hyper-nodes); ``--no-memory`` skips it.
"""

from __future__ import annotations

import argparse
import gc
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from agent.engine import Reasoner
from agent.engine.update.reclaim import RECLAIMER
from agent.state.agent_state import AgentState
from simulations.bench.memory import fact_count, footprint
from simulations.bench.parse import bundle_text
from simulations.bench.table import Table, add_markdown_option, ratio, write_markdown

LEAF = "leaf: <z>(X) :- <p3>(X, Y) ."
FACTS = [("p11", f"a{i}", f"b{i}") for i in range(50)] + [("q3", f"b{i}", 5) for i in range(50)]
COLUMNS = ("reading", "leaf", "committed reading", "committed leaf", "restart")


def timed(action: Callable[[], object]) -> float:
    """Seconds ``action`` takes, after the background reclaimer freed what came before."""
    RECLAIMER.drain()
    gc.collect()
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def in_memory(size: int) -> Reasoner:
    """``footprint``'s build: the reasoner in memory of one program size."""
    reasoner = Reasoner()
    reasoner.add_rules(bundle_text(size))
    reasoner.add_facts(FACTS)
    return reasoner


def reading(value: int) -> dict:
    """A reading replacing the one before it (``update`` keywords)."""
    return {
        "add_facts": [("reading", "t1", float(value))],
        "delete_facts": [("reading", "t1", float(value - 1))],
    }


class Program:
    """One program size: a reasoner in memory and a saved state, both holding the bundle."""

    def __init__(self, size: int, directory: Path) -> None:
        self.size = size
        self.reasoner = Reasoner()
        self.reasoner.add_rules(bundle_text(size))
        self.reasoner.add_facts(FACTS)
        self.path = directory / f"{size}.db"
        self.state = AgentState(self.path, synchronous="OFF")  # (open all along: an agent's)
        self.state.apply(add_rules=bundle_text(size), add_facts=FACTS)
        self.hyper_nodes = len(self.reasoner.nodes)
        self.best = dict.fromkeys(COLUMNS, float("inf"))
        self.readings = 0

    def measure(self) -> None:
        """One pass over every column, keeping the best of each."""
        self.readings += 1
        update = reading(self.readings)
        self.keep("reading", timed(lambda: self.reasoner.update(**update)))

        def leaf() -> None:
            self.reasoner.add_rules(LEAF)
            self.reasoner.delete_rules(["leaf"])

        self.keep("leaf", timed(leaf))
        self.keep("committed reading", timed(lambda: self.state.apply(**update)))

        def committed_leaf() -> None:
            self.state.apply(add_rules=LEAF)
            self.state.apply(delete_rules=["leaf"])

        self.keep("committed leaf", timed(committed_leaf))
        self.keep("restart", timed(lambda: AgentState(self.path).close()))

    def keep(self, column: str, seconds: float) -> None:
        self.best[column] = min(self.best[column], seconds)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="sizes 10 and 40, 2 passes")
    parser.add_argument("--sizes", default="20,200,2000", help="rules per program (comma list)")
    parser.add_argument("--repeat", type=int, default=8, help="passes (best of each kept)")
    parser.add_argument("--no-memory", action="store_true", help="skip the bytes per stored fact")
    add_markdown_option(parser)
    args = parser.parse_args(argv)
    sizes = [10, 40] if args.quick else [int(s) for s in args.sizes.split(",")]
    repeat = 2 if args.quick else args.repeat
    with tempfile.TemporaryDirectory() as directory:
        programs = [Program(size, Path(directory)) for size in sorted(sizes)]
        for number in range(repeat):
            for program in programs if number % 2 == 0 else reversed(programs):
                program.measure()
        for program in programs:
            program.state.close()
    smallest = programs[0]
    memory = {}  # size -> (stored facts, kept B/fact, RSS B/fact), after the timings
    for program in [] if args.no_memory else programs:
        used = footprint(in_memory, fact_count, program.size)
        kept, rss = used.per_fact(used.traced_kept), used.per_fact(used.rss)
        memory[program.size] = (f"{used.facts:,}", f"{kept:,.0f}", f"{rss:,.0f}")
    print(
        f"{'rules':>6}{'hyper-nodes':>13}"
        + "".join(f"{c + ' ms':>21}" for c in COLUMNS)
        + f"{'facts':>7}{'kept B/fact':>13}{'RSS B/fact':>12}"
    )
    for program in programs:
        cells = "".join(f"{program.best[c] * 1e3:>21.3f}" for c in COLUMNS)
        facts, kept, rss = memory.get(program.size, ("-", "-", "-"))
        print(f"{program.size:>6}{program.hyper_nodes:>13}{cells}{facts:>7}{kept:>13}{rss:>12}")
    print(f"\nRatio to {smallest.size} rules (1.0: the update does not grow with the program):")
    for program in programs[1:]:
        ratios = "".join(f"{program.best[c] / smallest.best[c]:>20.1f}x" for c in COLUMNS)
        print(f"{program.size:>6}{'':>13}{ratios}")
    times = Table(
        (
            "rules",
            "hyper-nodes",
            *(f"{column} ms" for column in COLUMNS),
            "facts",
            "kept B/fact",
            "RSS B/fact",
        ),
        "r" * (5 + len(COLUMNS)),
        title=f"Milliseconds, best of {repeat} passes",
    )
    growth = Table(
        ("rules", *COLUMNS),
        "r" * (1 + len(COLUMNS)),
        title=f"Ratio to {smallest.size} rules (1.0x: the update does not grow with the program)",
    )
    for program in programs:
        times.add(
            f"{program.size:,}",
            f"{program.hyper_nodes:,}",
            *(f"{program.best[c] * 1e3:.3f}" for c in COLUMNS),
            *memory.get(program.size, ("-", "-", "-")),
        )
        if program is not smallest:
            growth.add(
                f"{program.size:,}", *(ratio(program.best[c], smallest.best[c]) for c in COLUMNS)
            )
    write_markdown(args.markdown, [times, growth])
    return 0


if __name__ == "__main__":
    sys.exit(main())
