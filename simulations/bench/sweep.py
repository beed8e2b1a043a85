"""Benchmark: a sweep of small updates of every kind, each against recomputing its final state.

    python -m simulations.bench.sweep [--quick] [--repeat N] [--seed S] [--no-memory]
                                      [--markdown [FILE]]

``simulations.bench.incremental`` times the updates the papers chose. An update no row covers
can still cost many times what recomputing does, and did: a turbine leaving RS1's farm (its
edge and its reading deleted) took 0.05x of recomputing at DS1(800) until the aggregates kept
their shared neighbourhoods through it; a middle edge of RS2's ``p2`` chain deleted, 0.4x. This
sweep makes the small updates an agent or the cloud can meet, on every benchmark program:

* RS1 over DS1(n), RS2 and RS3 over DS2(w) (``rules/benchmarks``), and the cloud's farm
  program (``rules/windfarm/farm.rules``: owl:sameAs between two names of each turbine,
  neighbours two grid steps apart) over a grid farm's layout;
* for each explicit relation, one of its facts deleted and one added (the subject of one of
  its facts with the object of another);
* a few entities leaving: every explicit fact naming them deleted (a turbine decommissioned).

Facts and entities are drawn with ``--seed``. Each update is timed on a reasoner holding the
start state (loaded untimed), against a fresh reasoner given the final facts (untimed) and then
the rules (timed), alternating, best of ``--repeat``; the first pass checks that the update's
result equals the from-scratch one, fact for fact ("OK" or "MISMATCH": any mismatch makes the
exit status non-zero). ``change`` is the net change, the facts added or removed, as a share of
the final materialisation. A row slower than recomputing shows the hyper-node that took
longest and its strategy. ``again``: the update undone (untimed) and made once more on the same
reasoner, timed and checked too: what a running agent pays, the delta plans and indexes the
first time built kept. ``kept B/fact`` and ``RSS B/fact``: the memory the materialisation
holds after the update per stored fact (traced kept allocation and resident-set growth), in a
fresh process after the row's timings (simulations/bench/memory.py; ``--no-memory`` skips
it). The closing lines list the rows that change under 10% of the result and are slower than
recomputing, the first time and made again: an update that small should never be.
"""

from __future__ import annotations

import argparse
import random
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from agent.engine import Program, Reasoner
from agent.engine.program.parser import parse_file
from simulations.bench.datasets import Fact, ds1, ds2
from simulations.bench.incremental import rule_set
from simulations.bench.memory import fact_count, footprint
from simulations.bench.table import Table, add_markdown_option, factor, write_markdown
from simulations.bench.timing import bring_back, set_aside, speedup, timed

ROOT = Path(__file__).resolve().parents[2]
SMALL_CHANGE = 0.10  # an update changing less than this share of the result...
ENTITIES = 4  # entities leaving, per program


@dataclass(frozen=True)
class Workload:
    """A program and the explicit facts it starts from."""

    name: str
    program: Program
    facts: tuple[Fact, ...]


@dataclass(frozen=True)
class Update:
    name: str
    deleted: tuple[Fact, ...]
    added: tuple[Fact, ...]


@dataclass
class Row:
    workload: str
    update: str
    change: float
    incremental: float
    scratch: float
    equal: bool
    slowest: str
    again: float  # the update made again, after undoing it (see the module docstring)
    kept_per_fact: float = float("nan")  # bytes per stored fact after the update (traced kept)
    rss_per_fact: float = float("nan")  # and resident-set growth; NaN: not measured

    @property
    def speedup(self) -> float:
        return speedup(self.scratch, self.incremental)

    @property
    def again_speedup(self) -> float:
        return speedup(self.scratch, self.again)


def farm_layout(turbines: int) -> tuple[Fact, ...]:
    """The layout facts the cloud reasons over (the wind-farm simulation's grid farm)."""
    from simulations.windfarm.farm import Farm

    return tuple(Farm.grid(turbines).layout_facts())


def workloads(quick: bool) -> list[Workload]:
    def benchmark(name: str) -> Program:
        return Program(rules=rule_set(name))

    n, w, turbines = (40, 20, 30) if quick else (400, 200, 800)
    return [
        Workload(f"RS1 DS1({n})", benchmark("rs1"), tuple(ds1(n))),
        Workload(f"RS2 DS2({w})", benchmark("rs2"), tuple(ds2(w))),
        Workload(f"RS3 DS2({w})", benchmark("rs3"), tuple(ds2(w))),
        Workload(
            f"farm {turbines}",
            Program(rules=parse_file(ROOT / "rules" / "windfarm" / "farm.rules").rules),
            farm_layout(turbines),
        ),
    ]


def updates(facts: tuple[Fact, ...], rng: random.Random) -> list[Update]:
    """One fact of each relation deleted and one added, then entities leaving."""
    by_relation: dict[str, list[Fact]] = {}
    for fact in facts:
        by_relation.setdefault(fact[0], []).append(fact)
    present = set(facts)
    made: list[Update] = []
    for relation, held in sorted(by_relation.items()):
        made.append(Update(f"delete one {relation}", (rng.choice(held),), ()))
        first, second = rng.choice(held), rng.choice(held)
        new = (relation, *first[1:-1], second[-1])
        if new not in present:
            made.append(Update(f"add one {relation}", (), (new,)))
    names = sorted({term for fact in facts for term in fact[1:] if isinstance(term, str)})
    for name in rng.sample(names, min(ENTITIES, len(names))):
        gone = tuple(fact for fact in facts if name in fact[1:])
        made.append(Update(f"{name} leaves", gone, ()))
    return made


def materialised(workload: Workload, facts: list[Fact] | tuple[Fact, ...]) -> Reasoner:
    reasoner = Reasoner()
    reasoner.add_facts(facts)
    reasoner.add_rules(workload.program)
    return reasoner


def updated(quick: bool, number: int, update: Update) -> Reasoner:
    """``footprint``'s build: workload ``number``'s materialisation with ``update`` made, what
    the row's reasoner holds afterwards (rebuilt in the measuring process)."""
    workload = workloads(quick)[number]
    reasoner = materialised(workload, workload.facts)
    reasoner.update(add_facts=update.added, delete_facts=update.deleted)
    return reasoner


def measure_memory(row: Row, quick: bool, number: int, update: Update) -> None:
    """The row's bytes per stored fact, in a fresh process (simulations/bench/memory.py),
    after its timings."""
    used = footprint(updated, fact_count, quick, number, update)
    row.kept_per_fact = used.per_fact(used.traced_kept)
    row.rss_per_fact = used.per_fact(used.rss)


def bytes_per_fact(value: float) -> str:
    return "-" if value != value else f"{value:.0f}"  # (NaN: not measured)


def slowest_node(reasoner: Reasoner) -> str:
    """The hyper-node the last update spent longest on, with its strategy."""
    nodes = reasoner.stats()["last_update"]["hyper_nodes"]
    if not nodes:
        return ""
    name, node = max(nodes.items(), key=lambda item: item[1]["seconds"])
    return f"{name}: {node['strategy']} ({node['seconds'] * 1000:.1f} ms)"


def run(workload: Workload, update: Update, repeat: int, start: set) -> Row:
    """One update, alternating with recomputing its final state; ``start``: the start
    state's materialisation (for the net change)."""
    gone = set(update.deleted)
    final = [fact for fact in workload.facts if fact not in gone] + list(update.added)

    def made(reasoner: Reasoner) -> None:
        reasoner.update(add_facts=update.added, delete_facts=update.deleted)

    best_incremental = best_scratch = best_again = float("inf")
    equal, change, slowest = True, 0.0, ""
    for attempt in range(max(repeat, 1)):
        scratch = Reasoner()
        scratch.add_facts(final)
        best_scratch = min(best_scratch, timed(lambda r=scratch: r.add_rules(workload.program)))
        expected = set(scratch.facts()) if attempt == 0 else None
        del scratch
        if expected is not None:
            set_aside()  # (the facts to check against: out of the collections before timings)
        reasoner = materialised(workload, workload.facts)
        seconds = timed(lambda r=reasoner: made(r))
        if seconds < best_incremental:
            best_incremental, slowest = seconds, slowest_node(reasoner)
        if expected is not None:
            found = set(reasoner.facts())
            equal = found == expected
            change = len(found ^ start) / max(len(found), 1)
        reasoner.update(add_facts=update.deleted, delete_facts=update.added)  # (undone)
        again = timed(lambda r=reasoner: made(r))
        best_again = min(best_again, again)
        if expected is not None:  # (undone and made again: the same result)
            equal = equal and set(reasoner.facts()) == expected
        del reasoner
    return Row(
        workload.name,
        update.name,
        change,
        best_incremental,
        best_scratch,
        equal,
        slowest,
        best_again,
    )


def format_row(row: Row) -> str:
    slow = f"  {row.slowest}" if row.speedup < 1 else ""
    return (
        f"{row.workload:<14}{row.update[:36]:<37}{row.change:>8.1%}{row.incremental:>12.4f}"
        f"{row.scratch:>11.4f}{row.speedup:>10.2f}x{row.again:>9.4f}{row.again_speedup:>8.2f}x "
        f"{'OK' if row.equal else 'MISMATCH':<9}{bytes_per_fact(row.kept_per_fact):>6}"
        f"{bytes_per_fact(row.rss_per_fact):>6}{slow}"
    )


def markdown_tables(rows: list[Row], repeat: int, seed: int) -> list[Table]:
    """The rows as a Markdown table, and the closing lines' lists as another."""
    table = Table(
        ("workload", "update", "change", "incremental s", "scratch s", "speed-up", "again s",
         "again speed-up", "equal", "kept B/fact", "RSS B/fact",
         "slowest hyper-node (when slower than recomputing)"),
        "llrrrrrrlrrl",
        title=f"Small updates against recomputing (seed {seed}, best of {repeat})",
    )  # fmt: skip
    for row in rows:
        table.add(
            row.workload,
            row.update,
            f"{row.change:.1%}",
            f"{row.incremental:.4f}",
            f"{row.scratch:.4f}",
            factor(row.speedup),
            f"{row.again:.4f}",
            factor(row.again_speedup),
            "OK" if row.equal else "MISMATCH",
            bytes_per_fact(row.kept_per_fact),
            bytes_per_fact(row.rss_per_fact),
            row.slowest if row.speedup < 1 else "",
        )
    small = Table(
        ("update made", "count", "changing under 10% of the result and slower than recomputing"),
        "lrl",
        title="Small updates slower than recomputing (there should be none)",
    )
    for how, slow in slower(rows):
        small.add(
            how.strip() or "the first time",
            len(slow),
            ", ".join(f"{r.update} ({r.workload})" for r in slow) if slow else "none",
        )
    return [table, small]


def slower(rows: list[Row]) -> list[tuple[str, list[Row]]]:
    """The rows changing under SMALL_CHANGE of the result and slower than recomputing: the
    first time, and made again."""
    small = [r for r in rows if r.change < SMALL_CHANGE]
    return [
        ("", [r for r in small if r.speedup < 1]),
        (" made again", [r for r in small if r.again_speedup < 1]),
    ]


def main(argv: list[str] | None = None, out: Callable[[str], None] = print) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small data sets (a smoke run)")
    parser.add_argument("--repeat", type=int, default=2, help="runs per update (best kept)")
    parser.add_argument("--seed", type=int, default=1, help="which facts and entities")
    parser.add_argument("--no-memory", action="store_true", help="skip the bytes per stored fact")
    add_markdown_option(parser)
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    out(
        f"{'workload':<14}{'update':<37}{'change':>8}{'incremental s':>14}{'scratch s':>10}"
        f"{'speed-up':>10}{'again s':>9}{'again':>9} equal    {'kept':>6}{'RSS':>6}"
        "  (B/fact)"
    )
    rows: list[Row] = []
    for number, workload in enumerate(workloads(args.quick)):
        start = set(materialised(workload, workload.facts).facts())
        set_aside()  # (see timing.set_aside)
        for update in updates(workload.facts, rng):
            row = run(workload, update, args.repeat, start)
            if not args.no_memory:
                measure_memory(row, args.quick, number, update)
            rows.append(row)
            out(format_row(row))
        del start
        bring_back()
    out("")
    for how, slow in slower(rows):
        out(
            f"Updates changing under {SMALL_CHANGE:.0%} of the result and slower than "
            f"recomputing{how}: "
            + (", ".join(f"{r.update} ({r.workload})" for r in slow) if slow else "none")
        )
    mismatches = [r for r in rows if not r.equal]
    if mismatches:
        out(f"MISMATCH in {len(mismatches)} row(s): the incremental result differs")
    else:
        out(f"All {len(rows)} rows equal the from-scratch materialisation.")
    write_markdown(args.markdown, markdown_tables(rows, args.repeat, args.seed))
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
