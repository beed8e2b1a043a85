"""Benchmark: compressed bitmaps (pyroaring) against Python sets for this engine's object sets.

    python -m simulations.bench.bitmaps [--quick] [--repeat N] [--markdown [FILE]]

The choice of a per-subject object set decides memory and speed of every binary relation, so
it is made by measurement on the engine's own data, not on a synthetic micro-benchmark:

* **RS2 over DS2(200)**: the subject -> objects sets of every binary relation the engine holds
  after materialising (the index on column 0, which is also the subject-keyed storage);
* **DAG-R**: the transitive closure of a random DAG (2,000 nodes, 10,000 edges, the modules
  benchmark's generator), computed bottom-up as reach(u) = union over successors v of
  {v} + reach(v), once with sets and once with bitmaps.

Per representation: bytes per stored pair (resident-set growth in a fresh process: pyroaring
allocates outside Python's allocator, so tracemalloc would not see it), the time to build the
sets, a tuple-at-a-time scan (what a compiled nested-loop join does with a bucket: iterate it),
a membership test per pair, a set-at-a-time join (H(x, z) :- A(x, y), A(y, z) as the union of
A[y] over y in A[x]), the same join as the engine computes it today (nested loops, a set of
head tuples: in the set column) against the set-at-a-time union into bitmaps (in the bitmap
column), and saving and loading (serialise / deserialise every set). Each time is
the best of ``--repeat`` runs, the two sides alternating. The ratio column is bitmap / set:
below 1 the bitmap is faster (or smaller).
"""

from __future__ import annotations

import argparse
import array
import sys
from collections.abc import Callable
from graphlib import TopologicalSorter
from itertools import chain, repeat

from pyroaring import BitMap

from agent.engine import Reasoner
from simulations.bench.datasets import ds2
from simulations.bench.materialise import RULES
from simulations.bench.memory import footprint
from simulations.bench.modules import random_dag
from simulations.bench.table import Table, add_markdown_option, factor, write_markdown
from simulations.bench.timing import timed

Groups = list[tuple[int, list[int]]]  # subject -> sorted objects, the neutral form of the data
KINDS = ("set", "bitmap")


def rs2_groups(width: int) -> Groups:
    """Every binary relation's subject -> objects after RS2 over DS2(width), one relation
    after another (subjects repeat across relations; each group is one stored set)."""
    reasoner = Reasoner()
    reasoner.add_facts(ds2(width))
    reasoner.add_rules(RULES / "rs2.rules")
    groups: Groups = []
    for store in [reasoner.edb, *(node.idb for node in reasoner.nodes)]:
        for relation in store.relations.values():
            if relation.arity == 2 and len(relation):
                index = relation.index((0,))
                groups += [(subject, sorted(objects)) for subject, objects in index.items()]
    return groups


def dag_groups(nodes: int, edges: int) -> Groups:
    """A random DAG's adjacency, as term-id-like integers."""
    successors: dict[int, list[int]] = {}
    for _, a, b in random_dag(nodes, edges):
        successors.setdefault(int(a[1:]), []).append(int(b[1:]))
    return [(u, sorted(vs)) for u, vs in sorted(successors.items())]


def build(kind: str, groups: Groups) -> list:
    """One set per group, of the given kind (kept in a list: the memory being measured)."""
    if kind == "set":
        return [set(objects) for _, objects in groups]
    return [BitMap(array.array("I", objects)) for _, objects in groups]


def _pairs(stored: object) -> int:
    assert isinstance(stored, list)
    return sum(map(len, stored))


def scan(stored: list) -> int:
    count = 0
    for objects in stored:
        for _ in objects:
            count += 1
    return count


def probe(stored: list, groups: Groups) -> int:
    hits = 0
    for objects, (_, wanted) in zip(stored, groups, strict=True):
        for value in wanted:
            if value in objects:
                hits += 1
    return hits


def compose(kind: str, groups: Groups, stored: list) -> int:
    """|A o A| with A the groups as one map subject -> objects (of several groups with one
    subject, the last): per x, the union of A[y] over y in A[x], in C (``set.update`` /
    ``BitMap.union``)."""
    table = {subject: objects for (subject, _), objects in zip(groups, stored, strict=True)}
    total = 0
    if kind == "set":
        for objects in table.values():
            joined: set[int] = set()
            for y in objects:
                found = table.get(y)
                if found is not None:
                    joined.update(found)
            total += len(joined)
    else:
        for objects in table.values():
            found = [table[y] for y in objects if y in table]
            total += len(BitMap.union(*found)) if found else 0
    return total


def compose_tuples(groups: Groups, stored: list) -> int:
    """|A o A| the way the engine's compiled rules compute it today: nested loops over the
    subject index, the head's tuples collected in one set (``out.update(zip(repeat(x), B))``)."""
    table = {subject: objects for (subject, _), objects in zip(groups, stored, strict=True)}
    out: set[tuple[int, int]] = set()
    for x, objects in table.items():
        for y in objects:
            found = table.get(y)
            if found is not None:
                out.update(zip(repeat(x), found))
    return len(out)


def save_load(kind: str, stored: list) -> int:
    if kind == "set":
        blobs = [array.array("I", objects).tobytes() for objects in stored]
        loaded = [set(array.array("I", blob)) for blob in blobs]
    else:
        blobs = [objects.serialize() for objects in stored]
        loaded = [BitMap.deserialize(blob) for blob in blobs]
    return sum(map(len, loaded))


def closure(kind: str, groups: Groups) -> dict:
    """reach(u) for every vertex of a DAG, bottom-up (successors first)."""
    successors = dict(groups)
    order = TopologicalSorter({u: vs for u, vs in successors.items()}).static_order()
    reach: dict = {}
    make = set if kind == "set" else BitMap
    for u in order:
        vs = successors.get(u)
        if not vs:
            continue
        found = make(vs)
        for v in vs:
            below = reach.get(v)
            if below is not None:
                found |= below
        reach[u] = found
    return reach


def closure_tuples(reach: dict) -> int:
    """A reader's full scan of the closure as tuples (what ``Relation.tuples`` builds)."""
    return len(set(chain.from_iterable(zip(repeat(u), vs) for u, vs in reach.items())))


def best(repeat_count: int, actions: dict[str, Callable[[], object]]) -> dict[str, float]:
    """Best time per side, the sides alternating."""
    found = dict.fromkeys(actions, float("inf"))
    for _ in range(repeat_count):
        for side, action in actions.items():
            found[side] = min(found[side], timed(action))
    return found


def new_table(title: str) -> Table:
    """A Markdown table of the rows ``row`` prints under one ``# title`` line."""
    return Table(("measure", "unit", "set", "bitmap", "bitmap / set"), "llrrr", title=title)


def row(table: Table, label: str, times: dict[str, float], unit: str = "ms") -> None:
    """Print one measure's line (and add it to ``table``)."""
    scale = 1e3 if unit == "ms" else 1.0
    ratio = times["bitmap"] / times["set"] if times["set"] else float("nan")
    print(
        f"{label:<34}{times['set'] * scale:>12.2f}{times['bitmap'] * scale:>12.2f}"
        f"{ratio:>9.2f}  {unit}",
        flush=True,
    )
    table.add(
        label, unit, f"{times['set'] * scale:.2f}", f"{times['bitmap'] * scale:.2f}", factor(ratio)
    )


def workload(title: str, groups: Groups, repeat_count: int) -> Table:
    pairs = sum(len(objects) for _, objects in groups)
    print(f"\n# {title}: {len(groups):,} sets, {pairs:,} pairs")
    print(f"{'':<34}{'set':>12}{'bitmap':>12}{'ratio':>9}")
    table = new_table(f"{title}: {len(groups):,} sets, {pairs:,} pairs")
    memory = {}
    for kind in KINDS:
        used = footprint(build, _pairs, kind, groups)
        memory[kind] = used.per_fact(used.rss)
    row(table, "memory, bytes per pair (RSS)", memory, unit="B")
    stored = {kind: build(kind, groups) for kind in KINDS}
    row(table, "build", best(repeat_count, {k: lambda k=k: build(k, groups) for k in KINDS}))
    row(
        table,
        "scan, tuple at a time",
        best(repeat_count, {k: lambda k=k: scan(stored[k]) for k in KINDS}),
    )
    row(
        table,
        "membership test per pair",
        best(repeat_count, {k: lambda k=k: probe(stored[k], groups) for k in KINDS}),
    )
    row(
        table,
        "join A o A, set at a time",
        best(repeat_count, {k: lambda k=k: compose(k, groups, stored[k]) for k in KINDS}),
    )
    today = best(
        repeat_count,
        {
            "set": lambda: compose_tuples(groups, stored["set"]),
            "bitmap": lambda: compose("bitmap", groups, stored["bitmap"]),
        },
    )
    row(table, "join A o A: tuples out vs bitmaps", today)
    row(
        table,
        "save + load (serialise all)",
        best(repeat_count, {k: lambda k=k: save_load(k, stored[k]) for k in KINDS}),
    )
    assert compose("set", groups, stored["set"]) == compose("bitmap", groups, stored["bitmap"])
    return table


def dag_workload(nodes: int, edges: int, repeat_count: int) -> list[Table]:
    groups = dag_groups(nodes, edges)
    adjacency = workload(
        f"DAG-R adjacency ({nodes:,} nodes, {edges:,} edges)", groups, repeat_count
    )
    reach = {kind: closure(kind, groups) for kind in KINDS}
    assert {u: set(vs) for u, vs in reach["bitmap"].items()} == reach["set"]
    pairs = sum(map(len, reach["set"].values()))
    print(f"# DAG-R transitive closure: {pairs:,} pairs")
    closed = new_table(f"DAG-R transitive closure: {pairs:,} pairs")
    row(
        closed,
        "closure (reach sets)",
        best(repeat_count, {k: lambda k=k: closure(k, groups) for k in KINDS}),
    )
    row(
        closed,
        "closure + full scan as tuples",
        best(
            repeat_count,
            {k: lambda k=k: closure_tuples(closure(k, groups)) for k in KINDS},
        ),
    )
    memory = {}
    for kind in KINDS:
        used = footprint(closure, _closure_pairs, kind, groups)
        memory[kind] = used.per_fact(used.rss)
    row(closed, "closure memory, bytes per pair (RSS)", memory, unit="B")
    return [adjacency, closed]


def _closure_pairs(reach: object) -> int:
    assert isinstance(reach, dict)
    return sum(map(len, reach.values()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes only (a smoke run)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per side, best reported")
    add_markdown_option(parser)
    args = parser.parse_args(argv)
    width, nodes, edges = (20, 200, 1000) if args.quick else (200, 2000, 10000)
    tables = [
        workload(f"RS2 over DS2({width}), subject -> objects", rs2_groups(width), args.repeat)
    ]
    tables += dag_workload(nodes, edges, args.repeat)
    write_markdown(args.markdown, tables)
    return 0


if __name__ == "__main__":
    sys.exit(main())
