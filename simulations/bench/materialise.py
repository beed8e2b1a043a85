"""Benchmark: materialisation from scratch vs. the time to merely store its output.

    python -m simulations.bench.materialise [--quick] [--repeat N] [--markdown [FILE]]

For each (rule set, data set) the engine materialises the program, then the same run times
inserting the final set of facts (distinct, per relation) into a fresh DataStore with the same
indexes the engine built (a relation the engine keeps by subject only, a transitive closure's
output, is stored likewise: `Relation.adopt_subjects`). The ratio ``materialise / store`` is
the figure to watch: absolute times on shared machines are noisy, ratios measured in one run
much less so.

Then, per case, the memory the materialisation takes (simulations/bench/memory.py): peak and
retained Python allocations, resident-set growth, and both per stored fact (facts counted once
per store holding them, as ``Reasoner.count`` does).

Default cases: RS1 on DS1(50..400), RS2 and RS3 on DS2(50, 100, 200) (DS2(200) is the paper's
~800-turbine data set). The best of ``--repeat`` runs is reported.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from agent.engine import Reasoner
from agent.engine.storage.store import DataStore, by_subject
from simulations.bench.datasets import ds1, ds2
from simulations.bench.memory import fact_count, footprint, megabytes
from simulations.bench.table import Table, add_markdown_option, factor, write_markdown
from simulations.bench.timing import speedup

RULES = Path(__file__).resolve().parents[2] / "rules" / "benchmarks"


@dataclass
class Result:
    rules: str
    data: str
    facts: int
    materialise: float
    store: float

    @property
    def ratio(self) -> float:
        return speedup(self.materialise, self.store)


def store_time(reasoner: Reasoner) -> float:
    """Time to insert the materialisation's distinct facts into a fresh store with the same
    indexes (per relation: the union of the index layouts the engine's relations built)."""
    layouts: dict = {}
    kinds: dict = {}  # per relation key: whether each non-empty holder keeps rows
    for store in [reasoner.edb, *(node.idb for node in reasoner.nodes)]:
        for key, relation in store.relations.items():
            layouts.setdefault(key, set()).update(relation._indexes)
            if len(relation):
                kinds.setdefault(key, []).append(relation.rows_built)
    # A relation the engine keeps by subject only (a closure's output) is stored likewise.
    subject_only = {key for key, rows in kinds.items() if rows == [False]}
    view = reasoner.view()
    facts = {key: set(view.visible(key)) for key in view.relations()}
    fresh = DataStore("baseline")
    gc.collect()
    started = time.perf_counter()
    for key, rows in facts.items():
        relation = fresh.relation(key)
        if key in subject_only:  # stored as its subject index alone, like the engine's
            relation.adopt_subjects(by_subject(rows))
            continue
        for bound in layouts.get(key, ()):
            relation.index(bound)
        relation.add_all(rows)
    return time.perf_counter() - started


def run_case(rule_file: str, data_name: str, facts: list, repeat: int) -> Result:
    best: Result | None = None
    for _ in range(repeat):
        reasoner = Reasoner()
        reasoner.add_facts(facts)
        gc.collect()
        started = time.perf_counter()
        reasoner.add_rules(RULES / rule_file)
        elapsed = time.perf_counter() - started
        result = Result(rule_file, data_name, reasoner.count(), elapsed, store_time(reasoner))
        if best is None or result.materialise < best.materialise:
            best = result
        del reasoner
    assert best is not None
    return best


def cases(quick: bool) -> list[tuple[str, str, list]]:
    sizes1 = (50, 100) if quick else (50, 100, 200, 400)
    sizes2 = (50, 100) if quick else (50, 100, 200)
    found = [("rs1.rules", f"DS1({n})", ds1(n)) for n in sizes1]
    for rules in ("rs2.rules", "rs3.rules"):
        found += [(rules, f"DS2({w})", ds2(w)) for w in sizes2]
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes only (a smoke run)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per case, best reported")
    parser.add_argument("--no-memory", action="store_true", help="skip the memory table")
    add_markdown_option(parser)
    args = parser.parse_args(argv)
    chosen = cases(args.quick)
    timing = Table(
        ("rules", "data", "facts", "materialise s", "store s", "materialise / store"),
        "llrrrr",
        title=f"Materialisation against storing its output (best of {args.repeat})",
    )
    header = (
        f"{'rules':<10} {'data':<9} {'facts':>9} {'materialise s':>14} {'store s':>9} {'ratio':>7}"
    )
    print(header)
    print("-" * len(header))
    for rule_file, data_name, facts in chosen:
        result = run_case(rule_file, data_name, facts, args.repeat)
        print(
            f"{result.rules:<10} {result.data:<9} {result.facts:>9} {result.materialise:>14.3f} "
            f"{result.store:>9.3f} {result.ratio:>7.1f}",
            flush=True,
        )
        timing.add(
            rules_name(result.rules),
            result.data,
            f"{result.facts:,}",
            f"{result.materialise:.4f}",
            f"{result.store:.4f}",
            factor(result.ratio),
        )
    tables = [timing]
    if not args.no_memory:
        print()
        tables.append(print_memory(chosen))
    write_markdown(args.markdown, tables)
    return 0


def rules_name(rule_file: str) -> str:
    """``RS1`` for ``rs1.rules``."""
    return rule_file.removesuffix(".rules").upper()


def print_memory(chosen: list[tuple[str, str, list]]) -> Table:
    """Print the memory table; return it as a Markdown table too."""
    table = Table(
        ("rules", "data", "facts", "peak traced MB", "kept MB", "kept B/fact", "RSS MB",
         "RSS B/fact"),
        "llrrrrrr",
        title="Memory of the materialisation (fresh process per case)",
    )  # fmt: skip
    header = (
        f"{'rules':<10} {'data':<9} {'facts':>9} {'traced peak MB':>15} {'kept MB':>8} "
        f"{'kept B/fact':>12} {'RSS MB':>7} {'RSS B/fact':>11}"
    )
    print(header)
    print("-" * len(header))
    for rule_file, data_name, facts in chosen:
        used = footprint(_materialised, fact_count, rule_file, facts)
        print(
            f"{rule_file:<10} {data_name:<9} {used.facts:>9} {megabytes(used.traced_peak):>15} "
            f"{megabytes(used.traced_kept):>8} {used.per_fact(used.traced_kept):>12.0f} "
            f"{megabytes(used.rss):>7} {used.per_fact(used.rss):>11.0f}",
            flush=True,
        )
        table.add(
            rules_name(rule_file),
            data_name,
            f"{used.facts:,}",
            megabytes(used.traced_peak),
            megabytes(used.traced_kept),
            f"{used.per_fact(used.traced_kept):.0f}",
            megabytes(used.rss),
            f"{used.per_fact(used.rss):.0f}",
        )
    return table


def _materialised(rule_file: str, facts: list) -> Reasoner:
    reasoner = Reasoner()
    reasoner.add_facts(facts)
    reasoner.add_rules(RULES / rule_file)
    return reasoner


if __name__ == "__main__":
    sys.exit(main())
