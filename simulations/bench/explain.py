"""Benchmark: how long ``Reasoner.explain`` takes, and how large its trees are.

    python -m simulations.bench.explain [--quick] [--sample N] [--roads N ...]
                                        [--no-memory] [--markdown [FILE]]

For each program (RS1-RS3 over the benchmark data sets, road connections over a chain of
roads, nonlinear with symmetry and linear), the materialisation is built once, then facts are
explained one by one: a fixed random sample of every relation plus the hardest facts (the two
ends of every chain, both ways). Printed per program: the facts explained, the median and the
slowest time per explanation, the largest tree (height: levels of rule applications; size:
distinct facts), for scale the time to materialise, and the memory the materialisation holds
per stored fact (traced kept and resident-set growth, in a fresh process apart from the
timings: simulations/bench/memory.py; ``--no-memory`` skips it). An explanation is interactive: the
slowest one is the figure to watch (it took seconds for a transitive relation over a chain of
50 roads when proofs were found by depth-first search).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from agent.engine import Reasoner
from agent.engine.language import RDF_TYPE
from simulations.bench.datasets import ds1, ds2, turbine
from simulations.bench.memory import fact_count, footprint
from simulations.bench.table import Table, add_markdown_option, factor, write_markdown

RULES = Path(__file__).resolve().parents[2] / "rules" / "benchmarks"

ROADS = """
c1: <connected>(X, Y) :- <road>(X, Y) .
c2: <connected>(X, Y) :- <connected>(Y, X) .
c3: <connected>(X, Z) :- <connected>(X, Y) and <connected>(Y, Z) .
"""
ROADS_LINEAR = """
c1: <reach>(X, Y) :- <road>(X, Y) .
c2: <reach>(X, Z) :- <reach>(X, Y) and <road>(Y, Z) .
"""


def city(i: int) -> str:
    return f"city{i}"


def road_chain(n: int) -> list[tuple]:
    return [("road", city(i), city(i + 1)) for i in range(n)]


@dataclass
class Case:
    name: str
    data: str
    rules: str
    facts: Callable[[], list[tuple]]
    hardest: list[tuple]  # facts explained besides the sample
    target: bool = True  # counts for the 50 ms target (False: a larger size, for scale)


ROADS_SIZES = [50, 400, 2000]  # chain lengths; the target counts up to TARGET_ROADS
QUICK_ROADS_SIZES = [10, 50]
TARGET_ROADS = 400


def cases(quick: bool, roads: list[int] | None = None) -> list[Case]:
    """The cases; ``roads``: the lengths of the road chains (default by ``quick``)."""
    if roads is None:
        roads = QUICK_ROADS_SIZES if quick else ROADS_SIZES
    found = [
        Case(
            "roads",
            f"chain({n})",
            ROADS,
            lambda n=n: road_chain(n),
            _ends("connected", n),
            target=n <= TARGET_ROADS,
        )
        for n in roads
    ]
    found += [
        Case(
            "roads-linear",
            f"chain({n})",
            ROADS_LINEAR,
            lambda n=n: road_chain(n),
            [("reach", city(0), city(n))],
            target=n <= TARGET_ROADS,
        )
        for n in roads
    ]
    for n in [20] if quick else [100, 400]:
        ends = [("hasNeighbour", turbine(1), turbine(n)), ("hasNeighbour", turbine(n), turbine(1))]
        found.append(Case("RS1", f"DS1({n})", _rules("rs1"), lambda n=n: ds1(n), ends))
    for name in ("rs2", "rs3"):
        for w in [10] if quick else [50, 200]:
            found.append(Case(name.upper(), f"DS2({w})", _rules(name), lambda w=w: ds2(w), []))
    return found


def _rules(name: str) -> str:
    return (RULES / f"{name}.rules").read_text()


def _ends(relation: str, n: int) -> list[tuple]:
    return [
        (relation, city(0), city(n)),
        (relation, city(n), city(0)),
        (relation, city(0), city(0)),
    ]


@dataclass
class Result:
    case: Case
    materialise: float
    explained: int
    times: list[float]
    height: int
    size: int


def run_case(case: Case, sample: int, seed: int = 0) -> Result:
    reasoner = Reasoner()
    reasoner.add_rules(case.rules)
    start = time.perf_counter()
    reasoner.add_facts(case.facts())
    materialise = time.perf_counter() - start
    rng = random.Random(seed)
    wanted = list(case.hardest)
    by_relation: dict[str, list[tuple]] = {}
    for fact in reasoner.facts():
        relation = fact[2] if fact[0] == RDF_TYPE else fact[0]  # a class, or a predicate
        by_relation.setdefault(relation, []).append(fact)
    for facts in by_relation.values():
        facts.sort(key=repr)
        wanted += rng.sample(facts, min(sample, len(facts)))
    times, height, size = [], 0, 0
    for fact in wanted:
        start = time.perf_counter()
        tree = reasoner.explain(fact)
        times.append(time.perf_counter() - start)
        height, size = max(height, tree.height), max(size, tree.size)
    return Result(case, materialise, len(wanted), times, height, size)


def materialised(quick: bool, roads: list[int] | None, number: int) -> Reasoner:
    """``footprint``'s build: the case's materialisation (the case rebuilt in the measuring
    process from picklable arguments: its facts are a closure)."""
    case = cases(quick, roads)[number]
    reasoner = Reasoner()
    reasoner.add_rules(case.rules)
    reasoner.add_facts(case.facts())
    return reasoner


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes only (a smoke run)")
    parser.add_argument("--sample", type=int, default=20, help="facts explained per relation")
    parser.add_argument(
        "--roads",
        type=int,
        nargs="+",
        default=None,
        metavar="N",
        help=f"lengths of the road chains (default {' '.join(map(str, ROADS_SIZES))}; "
        f"longer than {TARGET_ROADS}: for scale, not counted for the target)",
    )
    parser.add_argument("--no-memory", action="store_true", help="skip the bytes per stored fact")
    add_markdown_option(parser)
    args = parser.parse_args(argv)
    table = Table(
        ("program", "data", "facts explained", "median ms", "slowest ms", "slowest / 50 ms",
         "height", "size", "materialise s", "kept B/fact", "RSS B/fact",
         "counts for the target"),
        "llrrrrrrrrrl",
    )  # fmt: skip
    header = (
        f"{'program':<13} {'data':<12} {'facts':>7} {'median ms':>10} {'slowest ms':>11} "
        f"{'height':>7} {'size':>6} {'materialise s':>14} {'kept B/fact':>12} {'RSS B/fact':>11}"
    )
    print(header)
    print("-" * len(header))
    slowest = 0.0
    for number, case in enumerate(cases(args.quick, args.roads)):
        result = run_case(case, args.sample)
        worst = max(result.times)
        kept = rss = "-"
        if not args.no_memory:  # (a fresh process, after the timings)
            used = footprint(materialised, fact_count, args.quick, args.roads, number)
            kept = f"{used.per_fact(used.traced_kept):.0f}"
            rss = f"{used.per_fact(used.rss):.0f}"
        if case.target:
            slowest = max(slowest, worst)
        print(
            f"{case.name:<13} {case.data:<12} {result.explained:>7} "
            f"{statistics.median(result.times) * 1000:>10.2f} {worst * 1000:>11.2f} "
            f"{result.height:>7} {result.size:>6} {result.materialise:>14.3f}"
            f" {kept:>12} {rss:>11}" + ("" if case.target else "   (for scale)"),
            flush=True,
        )
        table.add(
            case.name,
            case.data,
            f"{result.explained:,}",
            f"{statistics.median(result.times) * 1000:.2f}",
            f"{worst * 1000:.2f}",
            factor(worst / 0.05),
            result.height,
            f"{result.size:,}",
            f"{result.materialise:.3f}",
            kept,
            rss,
            "yes" if case.target else "no (for scale)",
        )
    verdict = "met" if slowest < 0.05 else "NOT met"
    print(
        f"\nTarget: every explanation of these programs at the benchmark sizes under 50 ms: "
        f"{verdict} (slowest {slowest * 1000:.1f} ms; rows marked 'for scale' do not count)."
    )
    table.title = (
        f"Explanations (target: every one under 50 ms in the rows that count: {verdict}, "
        f"slowest {slowest * 1000:.1f} ms)"
    )
    write_markdown(args.markdown, [table])
    return 0


if __name__ == "__main__":
    sys.exit(main())
