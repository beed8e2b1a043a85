"""Benchmark: closure modules vs plain seminaive evaluation, measured in the same run.

    python -m simulations.bench.modules [--quick | --linear-only] [--seminaive-limit N]
                                        [--repeat N] [--changes N] [--markdown [FILE]]

1. RS1's first two rules (symmetric-transitive ``hasNeighbour``) over DS1(n), n = 100 .. 1600:
   materialisation with the STC module, with seminaive (up to ``--seminaive-limit`` turbines:
   seminaive considers O(n^3) rule instances), and the time to merely store the output.
2. DAG-R: a random DAG (fixed seed) with one transitive rule: materialisation (best of
   ``--repeat`` per side, alternating), then 100 random edge deletions and re-insertions (one
   update each), module vs seminaive. The module stores the closure by subject; the row
   "+ first full scan" adds the time a reader scanning all of it pays to build its tuples
   (kept), "+ one read through" the time to read every fact once without keeping them.
   Then the memory each side holds after materialising (simulations/bench/memory.py: Python
   allocations kept and resident-set growth, per fact).
3. RS2 over DS2(200) end to end, with and without modules.

Every pair of runs is checked to give the same facts. Ratios are what to compare: absolute
times on shared machines are noisy.
"""

from __future__ import annotations

import argparse
import random
import sys
from collections import deque
from pathlib import Path

from agent.engine import Reasoner
from simulations.bench.datasets import ds1, ds2
from simulations.bench.materialise import store_time
from simulations.bench.memory import fact_count, footprint
from simulations.bench.table import Table, add_markdown_option, factor, write_markdown
from simulations.bench.timing import timed

RULES = Path(__file__).resolve().parents[2] / "rules" / "benchmarks"
STC_RULES = """
r1: <hasNeighbour>(X, Y) :- <hasNeighbour>(Y, X) .
r2: <hasNeighbour>(X, Y) :- <hasNeighbour>(X, Z) and <hasNeighbour>(Z, Y) and COMP(X, !=, Y) .
"""
TC_RULE = "t: <edge>(X, Z) :- <edge>(X, Y) and <edge>(Y, Z) ."
LINEAR_BASE = "b: <p>(X, Y) :- <edge>(X, Y) .\n"
LINEAR_TC = {
    "non-linear": LINEAR_BASE + "s: <p>(X, Z) :- <p>(X, Y) and <p>(Y, Z) .",
    "right-linear": LINEAR_BASE + "s: <p>(X, Z) :- <p>(X, Y) and <edge>(Y, Z) .",
    "left-linear": LINEAR_BASE + "s: <p>(X, Z) :- <edge>(X, Y) and <p>(Y, Z) .",
}


def materialise(rules, facts, modules: bool) -> tuple[Reasoner, float]:
    reasoner = Reasoner(modules=modules)
    reasoner.add_facts(facts)
    return reasoner, timed(lambda: reasoner.add_rules(rules))


def _materialised(rules: str, facts: list, modules: bool) -> Reasoner:
    return materialise(rules, facts, modules)[0]


def module_of(reasoner: Reasoner) -> str:
    return ",".join(sorted({n["module"] for n in reasoner.stats()["hyper_nodes"]}))


def stc_rows(sizes: list[int], seminaive_limit: int) -> Table:
    table = Table(
        ("n", "facts", "module s", "store s", "module / store", "seminaive s",
         "seminaive / module", "module"),
        "rrrrrrrl",
        title="RS1 r1 + r2 (symmetric-transitive) over DS1(n)",
    )  # fmt: skip
    print("\n# RS1 r1 + r2 (symmetric-transitive) over DS1(n)")
    print(
        f"{'n':>6} {'facts':>10} {'module s':>9} {'store s':>8} {'mod/store':>9} "
        f"{'seminaive s':>12} {'speed-up':>9}  module"
    )
    for n in sizes:
        facts = [f for f in ds1(n) if f[0] == "hasNeighbour"]
        fast, module_time = materialise(STC_RULES, facts, True)
        store = store_time(fast)
        line = (
            f"{n:>6} {fast.count():>10} {module_time:>9.3f} {store:>8.3f} "
            f"{module_time / store:>9.1f}"
        )
        cells = [f"{n:,}", f"{fast.count():,}", f"{module_time:.4f}", f"{store:.4f}",
                 factor(module_time / store)]  # fmt: skip
        if n <= seminaive_limit:
            slow, seminaive_time = materialise(STC_RULES, facts, False)
            assert set(slow.facts()) == set(fast.facts()), f"results differ at n={n}"
            line += f" {seminaive_time:>12.3f} {seminaive_time / module_time:>8.1f}x"
            cells += [f"{seminaive_time:.4f}", factor(seminaive_time / module_time, 1)]
            del slow
        else:
            line += f" {'(skipped)':>12} {'':>9}"
            cells += ["(skipped)", "-"]
        print(line + f"  {module_of(fast)}", flush=True)
        table.add(*cells, module_of(fast))
    return table


def module_table(title: str) -> Table:
    """A Markdown table of lines printed as ``label  module ... s   seminaive ... s``."""
    return Table(("case", "module s", "seminaive s", "seminaive / module"), "lrrr", title=title)


def stc_small_deletions(n: int, count: int = 5) -> Table:
    """Delete single hasNeighbour edges (each splits the chain's component), then re-add them:
    the STC module's per-component Del/Red against seminaive DRed^c (which falls back to
    recomputation when overdeletion covers most of the closure)."""
    title = f"Small deletions on STC: DS1({n}), {count} single-edge deletions and re-insertions"
    print(f"\n# {title}")
    table = module_table(title)
    facts = [f for f in ds1(n) if f[0] == "hasNeighbour"]
    picked = facts[n // 3 : n // 3 + count]
    results = {}
    for modules in (True, False):
        reasoner, _ = materialise(STC_RULES, facts, modules)
        deleting = timed(lambda r=reasoner, p=picked: [r.delete_facts([f]) for f in p])
        inserting = timed(lambda r=reasoner, p=picked: [r.add_facts([f]) for f in p])
        results[modules] = (reasoner, deleting, inserting)
    assert set(results[True][0].facts()) == set(results[False][0].facts()), "STC differs"
    for label, index in (("deletions", 1), ("re-insertions", 2)):
        fast, slow = results[True][index], results[False][index]
        print(
            f"{label:<20} module {fast:>8.3f} s   seminaive {slow:>8.3f} s   "
            f"speed-up {slow / fast:>6.1f}x"
        )
        table.add(label, f"{fast:.4f}", f"{slow:.4f}", factor(slow / fast, 1))
    return table


def random_dag(nodes: int, edges: int, seed: int = 7) -> list[tuple]:
    rng = random.Random(seed)
    chosen: set[tuple[int, int]] = set()
    while len(chosen) < edges:
        a, b = rng.randrange(nodes), rng.randrange(nodes)
        if a != b:
            chosen.add((min(a, b), max(a, b)))
    return [("edge", f"v{a}", f"v{b}") for a, b in sorted(chosen)]


def build_tuples(reasoner: Reasoner) -> float:
    """Time for a reader's first full scan: building the tuples of every relation the engine
    keeps by subject only (`Relation.adopt_subjects`: the closure modules' output)."""
    pending = [r for n in reasoner.nodes for r in n.idb.relations.values() if not r.rows_built]
    return timed(lambda: [len(r.tuples) for r in pending])


def read_through(reasoner: Reasoner) -> float:
    """Time for a reader that goes through every derived fact once without keeping them
    (``MaterialisedView.scan``, what ``facts()`` reads before decoding ids to values)."""
    view = reasoner.view()
    keys = {key for node in reasoner.nodes for key in node.idb.relations}
    return timed(lambda: [deque(view.scan(key), maxlen=0) for key in keys])


def dag_rows(nodes: int, edges: int, changes: int, repeat: int) -> list[Table]:
    title = f"DAG-R: random DAG, {nodes} nodes, {edges} edges, transitive rule"
    print(f"\n# {title}")
    facts = random_dag(nodes, edges)
    builds: dict[bool, float] = {True: float("inf"), False: float("inf")}
    scan = read = float("inf")
    for _ in range(repeat):  # the sides alternate; the best of each is kept
        for modules in (True, False):
            reasoner, build = materialise(TC_RULE, facts, modules)
            builds[modules] = min(builds[modules], build)
            if modules:
                read = min(read, read_through(reasoner))
                scan = min(scan, build_tuples(reasoner))
            del reasoner
    results = {}
    for modules in (True, False):
        # A fresh one: the scan above built the closure's tuples, which the updates must not find.
        reasoner, _ = materialise(TC_RULE, facts, modules)
        rng = random.Random(11)
        picked = rng.sample(facts, changes)
        deleting = timed(lambda r=reasoner, p=picked: [r.delete_facts([f]) for f in p])
        inserting = timed(lambda r=reasoner, p=picked: [r.add_facts([f]) for f in p])
        results[modules] = (reasoner, builds[modules], deleting, inserting)
    fast, slow = results[True], results[False]
    assert set(fast[0].facts()) == set(slow[0].facts()), "DAG-R results differ"
    print(f"closure facts: {fast[0].count() - len(facts)} derived, module: {module_of(fast[0])}")
    table = module_table(
        f"{title}: {fast[0].count() - len(facts):,} derived facts, module "
        f"{module_of(fast[0])}; materialise best of {repeat}"
    )
    memory = Table(
        ("side", "kept B/fact", "RSS B/fact", "peak traced MB"),
        "lrrr",
        title="DAG-R: memory after materialising (fresh process per side)",
    )
    for label, index in (
        ("materialise", 1),
        (f"{changes} deletions", 2),
        (f"{changes} re-insertions", 3),
    ):
        print(
            f"{label:<20} module {fast[index]:>8.3f} s   seminaive {slow[index]:>8.3f} s   "
            f"speed-up {slow[index] / fast[index]:>6.1f}x"
        )
        table.add(
            label,
            f"{fast[index]:.4f}",
            f"{slow[index]:.4f}",
            factor(slow[index] / fast[index], 1),
        )
    for modules, side in ((True, "module"), (False, "seminaive")):
        used = footprint(_materialised, fact_count, TC_RULE, facts, modules)
        print(
            f"{'memory, ' + side:<20} kept {used.per_fact(used.traced_kept):>6.0f} B/fact   "
            f"RSS {used.per_fact(used.rss):>6.0f} B/fact   (peak traced "
            f"{used.traced_peak / 1e6:.0f} MB)"
        )
        memory.add(
            side,
            f"{used.per_fact(used.traced_kept):.0f}",
            f"{used.per_fact(used.rss):.0f}",
            f"{used.traced_peak / 1e6:.1f}",
        )
    both = builds[True] + scan
    print(
        f"{'+ first full scan':<20} module {both:>8.3f} s   (the closure is stored by subject; "
        f"a reader scanning all of it builds its tuples once: {scan:.3f} s; "
        f"speed-up {builds[False] / both:.1f}x)"
    )
    table.add(
        f"materialise + first full scan (tuples built: {scan:.4f} s)",
        f"{both:.4f}",
        f"{builds[False]:.4f}",
        factor(builds[False] / both, 1),
    )
    both = builds[True] + read
    print(
        f"{'+ one read through':<20} module {both:>8.3f} s   (every fact read once, none kept: "
        f"{read:.3f} s; speed-up {builds[False] / both:.1f}x)"
    )
    table.add(
        f"materialise + one read through (none kept: {read:.4f} s)",
        f"{both:.4f}",
        f"{builds[False]:.4f}",
        factor(builds[False] / both, 1),
    )
    return [table, memory]


def linear_rows(graphs: list[tuple[str, int, int]], changes: int, repeat: int) -> Table:
    """Section 3 of the module docstring: one row per graph and way of writing the closure."""
    title = "Linear TC: the closure of a random DAG as users write it"
    print(f"\n# {title}")
    table = Table(
        ("graph", "rules", "module", "p facts", "materialise s", "seminaive s",
         "seminaive / module", "1-edge deletion ms", "1-edge insertion ms", "B/fact (RSS)",
         "B/fact (kept)"),
        "llllrrrrrrr",
        title=f"{title}; materialise best of {repeat}, updates the mean of {changes}",
    )  # fmt: skip
    for graph, nodes, edges in graphs:
        facts = random_dag(nodes, edges)
        best = {(name, modules): float("inf") for name in LINEAR_TC for modules in (True, False)}
        for _ in range(repeat):  # programs and sides alternate; the best of each is kept
            for name, rules in LINEAR_TC.items():
                for modules in (True, False):
                    reasoner, took = materialise(rules, facts, modules)
                    best[name, modules] = min(best[name, modules], took)
                    del reasoner
        expected = None
        for name, rules in LINEAR_TC.items():
            reasoner, _ = materialise(rules, facts, True)
            got = set(reasoner.facts())
            assert expected is None or got == expected, f"{graph} {name}: results differ"
            expected = got
            picked = random.Random(11).sample(facts, changes)
            reasoner.delete_facts([picked[-1]])  # a running agent: plans compiled
            reasoner.add_facts([picked[-1]])
            deleting = timed(lambda r=reasoner, p=picked: [r.delete_facts([f]) for f in p])
            inserting = timed(lambda r=reasoner, p=picked: [r.add_facts([f]) for f in p])
            assert set(reasoner.facts()) == expected, f"{graph} {name}: updates differ"
            module = module_of(reasoner)
            derived = reasoner.count() - len(facts)
            del reasoner
            used = footprint(_materialised, fact_count, rules, facts, True)
            fast, slow = best[name, True], best[name, False]
            print(
                f"{graph:<10} {name:<13} {module:<45} materialise {fast:>7.4f} s  "
                f"seminaive {slow:>7.3f} s ({slow / fast:>5.1f}x)  "
                f"-1 {deleting / changes * 1e3:>6.2f} ms  +1 {inserting / changes * 1e3:>6.2f} ms  "
                f"{used.per_fact(used.rss):>4.0f} B/fact",
                flush=True,
            )
            table.add(
                graph, name, module, f"{derived:,}", f"{fast:.4f}", f"{slow:.4f}",
                factor(slow / fast, 1), f"{deleting / changes * 1e3:.2f}",
                f"{inserting / changes * 1e3:.2f}", f"{used.per_fact(used.rss):.0f}",
                f"{used.per_fact(used.traced_kept):.0f}",
            )  # fmt: skip
    return table


def rs2_row(width: int) -> Table:
    print(f"\n# RS2 over DS2({width}) end to end")
    facts = ds2(width)
    fast, module_time = materialise(RULES / "rs2.rules", facts, True)
    slow, seminaive_time = materialise(RULES / "rs2.rules", facts, False)
    assert set(fast.facts()) == set(slow.facts()), "RS2 results differ"
    store = store_time(fast)
    print(
        f"facts {fast.count()}: modules {module_time:.3f} s, seminaive {seminaive_time:.3f} s, "
        f"speed-up {seminaive_time / module_time:.1f}x, store-only {store:.3f} s"
    )
    table = Table(
        ("facts", "modules s", "seminaive s", "seminaive / modules", "store only s"),
        "rrrrr",
        title=f"RS2 over DS2({width}) end to end",
    )
    table.add(
        f"{fast.count():,}",
        f"{module_time:.4f}",
        f"{seminaive_time:.4f}",
        factor(seminaive_time / module_time, 1),
        f"{store:.4f}",
    )
    return table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    parser.add_argument(
        "--seminaive-limit", type=int, default=800, help="largest DS1 size run with seminaive"
    )
    parser.add_argument(
        "--repeat", type=int, default=3, help="DAG-R materialisations per side (best kept)"
    )
    parser.add_argument(
        "--changes", type=int, default=10, help="linear TC: one-edge updates per row (mean)"
    )
    parser.add_argument(
        "--linear-only", action="store_true", help="only section 3 (linear TC), full sizes"
    )
    add_markdown_option(parser)
    args = parser.parse_args(argv)
    if args.linear_only:
        graphs = [("DAG(1000)", 1000, 10000), ("DAG-R", 2000, 10000)]
        tables = [linear_rows(graphs, args.changes, args.repeat)]
    elif args.quick:
        tables = [stc_rows([50, 100], args.seminaive_limit), stc_small_deletions(60, 3)]
        tables += dag_rows(200, 600, 20, args.repeat)
        tables.append(linear_rows([("DAG(100)", 100, 500)], 3, args.repeat))
        tables.append(rs2_row(30))
    else:
        tables = [
            stc_rows([100, 200, 400, 800, 1600], args.seminaive_limit),
            stc_small_deletions(400),
        ]
        tables += dag_rows(2000, 10000, 100, args.repeat)
        tables.append(
            linear_rows(
                [("DAG(1000)", 1000, 10000), ("DAG-R", 2000, 10000)], args.changes, args.repeat
            )
        )
        tables.append(rs2_row(200))
    write_markdown(args.markdown, tables)
    return 0


if __name__ == "__main__":
    sys.exit(main())
