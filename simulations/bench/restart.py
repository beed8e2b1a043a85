"""Benchmark: restarting an agent from its SQLite state vs recomputing the materialisation.

    python -m simulations.bench.restart [--quick] [--repeat N] [--no-memory] [--no-new-process]
                                        [--cpu] [--markdown [FILE]]

For each (rule set, data set), in one run (RS1-RS3 over DS1(400)/DS2(200), and a state of
sensor readings: 20,000 turbines, each with a reading, a neighbour and a label, one rule; its
56,000-odd distinct terms show what a restart costs per term):

* ``recompute``: a fresh Reasoner loads the rules and explicit facts and materialises (what a
  restart would cost without saved derived facts);
* ``save``: the same change applied through ``AgentState`` (materialise + write everything in
  one transaction, WAL, synchronous=FULL), i.e. the first start;
* ``restart``: opening the file again, which loads terms, facts, rules and every hyper-node's
  derived facts and answers queries at once (no rule is evaluated). A binary relation's
  bitmaps stay serialised until a reader first uses the relation (agent/state/packing.py);
  ``all read s`` is the restart plus reading every relation once, what an eager load would
  cost;
* ``1st update s``: a small change committed right after the restart (RS1 and the readings: a
  turbine's reading replaced; RS2 and RS3: the last edge of the p3 chain deleted, which
  changes 16 derived facts). It pays for
  what the restart defers: reading the saved bitmaps of the relations it reaches, an
  aggregate's groups partitioned again, the rule plans it needs compiled. ``later s`` is the
  same change again, on the running agent (the change undone, then made once more: its
  plans compiled, its relations read). ``back to work`` compares recomputing with the restart
  and its first update together: what getting back to work after a restart saves.

Recompute and restart alternate, best of ``--repeat`` each, each timed as in a process just
started (no rule plan compiled before, see ``timed``). Ratios are the figures to watch
(absolute times on shared machines are noisy).

Then the same sides **in new processes**, as an agent really restarts: each run is a process
of its own (``--run``), which imports the engine and builds the case's data before its clock
starts, then recomputes, or opens the saved state and makes the small change. What only a new
process pays shows here and not above: a library's set-up on first use, the interpreter's
caches cold (the opening of the sqlite-utils wrapper the agent once used scanned every
installed package for plugins: 10 ms a start that the table above never saw). Then, per
case, the memory held after recomputing and after a restart (simulations/bench/memory.py):
Python allocations kept and resident-set growth, per fact.
"""

from __future__ import annotations

import argparse
import gc
import json
import marshal
import os
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from agent.engine import Reasoner
from agent.engine.plan.compiler import code_of
from agent.engine.update.reclaim import RECLAIMER
from agent.state.agent_state import AgentState
from simulations.bench.datasets import AIR_TEMPERATURE, ds1, ds2
from simulations.bench.memory import Footprint, fact_count, footprint
from simulations.bench.table import Table, add_markdown_option, ratio, write_markdown
from simulations.bench.timing import clock, use_cpu_clock

RULES = Path(__file__).resolve().parents[2] / "rules" / "benchmarks"


def timed(action):
    """Seconds ``action`` takes, as in a process just started: Python's compilations of rule
    plans, shared by the reasoners of one process (``agent.engine.plan.compiler.code_of``), are
    forgotten first, or a recompute after the first would skip them, which no restarted agent
    can. What the other side dropped is freed first too: the engine's background reclaimer
    (agent/engine/update/reclaim.py) would otherwise free it during this side's time."""
    code_of.cache_clear()
    RECLAIMER.drain()
    gc.collect()
    started = clock()
    result = action()
    return clock() - started, result


# A state of sensor readings: about as many distinct terms (the readings' values, the
# turbines, their labels) as facts, where RS1-RS3 over DS1/DS2 have a few hundred terms. What a
# restart costs per term shows here.
READ = "reading"  # (its predicate)
READINGS_RULES = f"hot: <hot>(X) :- <{READ}>(X, T) and Comp(T, >, 30) ."


def readings(turbines: int, seed: int = 0) -> list[tuple]:
    """Each turbine's reading (a distinct value), its neighbour and its label."""
    rng = random.Random(seed)
    facts: list[tuple] = []
    for i in range(turbines):
        facts.append((READ, f"t{i}", round(rng.uniform(-10, 40), 3) + i * 1e-6))
        facts.append(("near", f"t{i}", f"t{(i + 1) % turbines}"))
        facts.append(("label", f"t{i}", f"turbine {i}"))
    return facts


def rule_set(name: str) -> tuple[str, str]:
    """A benchmark rule set's name and text (rules/benchmarks/NAME.rules)."""
    return name.upper(), (RULES / f"{name}.rules").read_text()


Change = tuple[dict, dict]  # a small change and its undoing, as AgentState.apply arguments
# (rule set, data name, facts, small change, the first query a restarted agent answers)
Case = tuple[tuple[str, str], str, list, Change, str]

RECOMPUTE_FLOOR = 0.1  # where recomputing takes at least this many seconds...
RESTART_SPEEDUP = 5.0  # ... a restart back to work is at least this many times faster
SMALL_BACK_TO_WORK = 0.010  # elsewhere: restart, first query and first update under 10 ms


def rdfs_rules() -> tuple[str, str]:
    """The RDFS rules of ``simulations.bench.peers`` (rdfs2, 3, 5, 7, 9, 11 over ``triple``)."""
    from simulations.bench.peers import rdfs_program

    return "RDFS", rdfs_program("ours")


def university_triples(universities: int) -> list[tuple]:
    """``peers.university``'s triples as ``triple`` facts. Generating a million of them takes
    half a minute here: they are kept in a file of the temporary directory, read again by the
    later processes of the run (before their clocks start)."""
    cache = Path(tempfile.gettempdir()) / f"zodiac-bench-university-{universities}.marshal"
    if cache.exists():
        return marshal.loads(cache.read_bytes())
    from simulations.bench.peers import university

    facts = [("triple", *triple) for triple in university(universities)]
    partial = cache.with_suffix(f".{os.getpid()}")
    partial.write_bytes(marshal.dumps(facts))
    partial.replace(cache)
    return facts


def course_dropped(facts: list, predicate: str) -> Change:
    """A student no longer takes one course (the last ``takesCourse`` triple deleted: its
    domain and range types stay, other triples give them), and takes it again."""
    triple = next(f for f in reversed(facts) if f[2] == predicate)
    return {"delete_facts": [triple]}, {"add_facts": [triple]}


def reading_replaced(facts: list, predicate: str) -> Change:
    """The last reading of ``predicate`` replaced by another value (an agent's everyday
    update), and back."""
    old = next(f for f in reversed(facts) if f[0] == predicate)
    new = (*old[:2], old[2] + 7.5)
    return {"delete_facts": [old], "add_facts": [new]}, {"delete_facts": [new], "add_facts": [old]}


def edge_deleted(facts: list, predicate: str) -> Change:
    """The last fact of ``predicate`` deleted, and added back. For RS2 and RS3 the last edge
    of the p3 chain: its copies and their joins lose 16 facts (an edge of the p1 chain would
    take 80,000 with it, which is no small change)."""
    edge = [f for f in facts if f[0] == predicate][-1]
    return {"delete_facts": [edge]}, {"add_facts": [edge]}


def case(
    program: tuple[str, str],
    data_name: str,
    facts: list,
    small_change: Callable[[list, str], Change],
    predicate: str,
    query: str,
) -> Case:
    """A benchmark case with its small change (``small_change`` of ``predicate``'s facts)
    and its first query (an atom pattern, ``Reasoner.query``)."""
    return program, data_name, facts, small_change(facts, predicate), query


def run_case(
    program: tuple[str, str],
    data_name: str,
    facts: list,
    small_change: Change,
    measure_memory: bool = True,
    repeat: int = 3,
    new_process: Callable[[str, Path], dict] | None = None,
) -> dict:
    """One case's figures; ``new_process(side, state path)``, when given, runs a side in a
    process of its own (``in_new_process``) and its best times go under ``"new_process"``."""
    rules_name, rules = program  # (its name, its text)
    change, undo = small_change
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "agent.db"
        state = AgentState(path)
        save, _ = timed(lambda: state.apply(add_rules=rules, add_facts=facts))
        state.close()
        recompute = restart = read_all = float("inf")
        for _ in range(repeat):  # alternating, each side's result dropped before the next
            recompute = min(recompute, timed(lambda: _materialise(rules, facts))[0])
            opened, state = timed(lambda: AgentState(path))
            assert state.load_report.how == "loaded"
            read = timed(lambda s=state: _read_every_relation(s.reasoner))[0]
            restart, read_all = min(restart, opened), min(read_all, opened + read)
            state.close()
            del state
        reasoner = _materialise(rules, facts)
        first = later = float("inf")
        for _ in range(repeat):
            state = AgentState(path)
            assert state.reasoner.count() == reasoner.count()
            first = min(first, timed(lambda s=state: s.apply(**change))[0])
            timed(lambda s=state: s.apply(**undo))
            later = min(later, timed(lambda s=state: s.apply(**change))[0])
            state.apply(**undo)  # (the file as it was, for the next pass)
            state.close()
        size = os.path.getsize(path) + sum(
            os.path.getsize(p) for p in Path(directory).glob("agent.db-*")
        )
        fresh = {}
        if new_process is not None:  # (alternating, best of each)
            for _ in range(repeat):
                for side in ("recompute", "restart"):
                    for key, seconds in new_process(side, path).items():
                        fresh[key] = min(fresh.get(key, seconds), seconds)
        memory = {}
        if measure_memory:
            memory["recompute"] = footprint(_materialise, fact_count, rules, facts)
            memory["restart"] = footprint(_restarted, fact_count, path)
    return {
        "case": f"{rules_name} {data_name}",
        "facts": reasoner.count(),
        "recompute": recompute,
        "save": save,
        "restart": restart,
        "read_all": read_all,
        "first_update": first,
        "later_update": later,
        "mb": size / 1e6,
        "memory": memory,
        "new_process": fresh,
    }


def run_one(side: str, case_index: int, quick: bool, path: Path) -> dict:
    """One side of case ``case_index`` of ``cases(quick)``, timed in this process, which is
    new: ``recompute`` materialises the case and answers its first query; ``restart`` opens
    the state saved at ``path``, answers the query (``query``), then makes the case's small
    change (``first``), and undoes it untimed, leaving the file as it found it."""
    (_, rules), _, facts, (change, undo), query = cases(quick)[case_index]()
    if side == "recompute":
        seconds, reasoner = timed(lambda: _materialise(rules, facts))
        answered = timed(lambda: reasoner.query(query))[0]
        return {"recompute": seconds + answered}
    opened, state = timed(lambda: AgentState(path))
    answered = timed(lambda: state.reasoner.query(query))[0]
    first = timed(lambda: state.apply(**change))[0]
    state.apply(**undo)
    state.close()
    return {"restart": opened, "query": answered, "first": first}


def clock_is_cpu() -> bool:
    """Whether this run times with CPU time (``--cpu``), which its new processes must too."""
    from simulations.bench import timing

    return timing.CLOCK[0] is time.process_time


def in_new_process(case_index: int, quick: bool) -> Callable[[str, Path], dict]:
    """``run_one`` of ``case_index`` in a new process, for a side and a state file."""

    def run(side: str, path: Path) -> dict:
        command = [sys.executable, "-m", "simulations.bench.restart"]
        command += ["--run", side, str(case_index), str(path)] + (["--quick"] if quick else [])
        command += ["--cpu"] if clock_is_cpu() else []
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"{side} of case {case_index} failed:\n{done.stderr}")
        return json.loads(done.stdout.splitlines()[-1])

    return run


def _read_every_relation(reasoner: Reasoner) -> int:
    """Make every derived relation read its saved facts (each relation's size, through its
    subject index: what reading it first costs, without building its tuples)."""
    return sum(
        len(relation.existing_index((0,)) or ()) + len(relation)
        for node in reasoner.view().nodes
        for relation in node.store.relations.values()
    )


def _restarted(path: Path) -> Reasoner:
    return AgentState(path).reasoner


def _materialise(rules: str, facts: list) -> Reasoner:
    reasoner = Reasoner()
    reasoner.add_rules(rules)
    reasoner.add_facts(facts)
    return reasoner


def cases(quick: bool) -> list[Callable[[], Case]]:
    """The benchmark's cases, each made when called (a new process of ``--run`` makes only
    its own)."""
    rs1_query = "<hasNeighbour>(<windTurbine1>, X)"  # (RS1's closure of one turbine)
    p20_query = "<p20>(<windTurbine0>, X)"  # (RS2/RS3: what one turbine's copies reach)
    if quick:
        return [
            lambda: case(
                rule_set("rs1"), "DS1(50)", ds1(50), reading_replaced, AIR_TEMPERATURE, rs1_query
            ),
            lambda: case(rule_set("rs2"), "DS2(50)", ds2(50), edge_deleted, "p3", p20_query),
            lambda: case(
                rdfs_rules(),
                "university(1)",
                university_triples(1),
                course_dropped,
                "takesCourse",
                "<triple>(<u0d0g0>, <type>, X)",
            ),
        ]
    return [
        lambda: case(
            rule_set("rs1"), "DS1(400)", ds1(400), reading_replaced, AIR_TEMPERATURE, rs1_query
        ),
        lambda: case(rule_set("rs2"), "DS2(200)", ds2(200), edge_deleted, "p3", p20_query),
        lambda: case(rule_set("rs3"), "DS2(200)", ds2(200), edge_deleted, "p3", p20_query),
        lambda: case(rule_set("rs2"), "DS2(800)", ds2(800), edge_deleted, "p3", p20_query),
        lambda: case(rule_set("rs3"), "DS2(800)", ds2(800), edge_deleted, "p3", p20_query),
        lambda: case(
            ("READINGS", READINGS_RULES),
            "20000",
            readings(20000),
            reading_replaced,
            READ,
            "<reading>(<t0>, X)",
        ),
        lambda: case(
            rdfs_rules(),
            "university(106)",
            university_triples(106),
            course_dropped,
            "takesCourse",
            "<triple>(<u0d0g0>, <type>, X)",
        ),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small data sets only")
    parser.add_argument("--no-memory", action="store_true", help="skip the memory table")
    parser.add_argument("--repeat", type=int, default=3, help="runs per side (best kept)")
    parser.add_argument(
        "--no-new-process", action="store_true", help="skip the table of sides in new processes"
    )
    parser.add_argument(
        "--cpu",
        action="store_true",
        help="time with the process's CPU time, not wall time (for a machine shared with "
        "other work, which inflates wall times unevenly)",
    )
    parser.add_argument("--run", nargs=3, metavar=("SIDE", "CASE", "STATE"), help=argparse.SUPPRESS)
    add_markdown_option(parser)
    args = parser.parse_args(argv)
    use_cpu_clock(args.cpu)
    if args.run:
        side, index, path = args.run
        print(json.dumps(run_one(side, int(index), args.quick, Path(path))))
        return 0
    header = (
        f"{'case':<14}{'facts':>9}{'recompute s':>13}{'first save s':>14}{'restart s':>11}"
        f"{'recompute/restart':>19}{'all read s':>12}{'1st update s':>14}{'later s':>10}"
        f"{'back to work':>14}{'file MB':>9}"
    )
    print(header)
    results = []
    for index, made in enumerate(cases(args.quick)):
        rules, data_name, facts, small_change, _ = made()
        r = run_case(
            rules,
            data_name,
            facts,
            small_change,
            measure_memory=not args.no_memory,
            repeat=args.repeat,
            new_process=None if args.no_new_process else in_new_process(index, args.quick),
        )
        results.append(r)
        print(
            f"{r['case']:<14}{r['facts']:>9}{r['recompute']:>13.3f}{r['save']:>14.3f}"
            f"{r['restart']:>11.4f}{r['recompute'] / r['restart']:>18.1f}x{r['read_all']:>12.4f}"
            f"{r['first_update']:>14.4f}{r['later_update']:>10.4f}"
            f"{r['recompute'] / (r['restart'] + r['first_update']):>13.1f}x{r['mb']:>9.1f}",
            flush=True,
        )
    tables = [in_one_process(results, args.repeat)]
    if not args.no_new_process:
        tables.append(print_new_process(results))
    if not args.no_memory:
        print()
        print(
            f"{'case':<14}{'facts':>9}{'recompute: kept B/fact':>24}{'RSS B/fact':>12}"
            f"{'restart: kept B/fact':>22}{'RSS B/fact':>12}"
        )
        for r in results:
            before: Footprint = r["memory"]["recompute"]
            after: Footprint = r["memory"]["restart"]
            print(
                f"{r['case']:<14}{r['facts']:>9}{before.per_fact(before.traced_kept):>24.0f}"
                f"{before.per_fact(before.rss):>12.0f}{after.per_fact(after.traced_kept):>22.0f}"
                f"{after.per_fact(after.rss):>12.0f}"
            )
        tables.append(memory_table(results))
    write_markdown(args.markdown, tables)
    return 0


def in_one_process(results: list[dict], repeat: int) -> Table:
    """The first printed table, as Markdown."""
    table = Table(
        ("case", "facts", "recompute s", "first save s", "restart s", "recompute / restart",
         "all read s", "1st update s", "later s", "back to work", "file MB"),
        "lrrrrrrrrrr",
        title=f"In one process (best of {repeat} per side, sides alternating)",
    )  # fmt: skip
    for r in results:
        table.add(
            r["case"],
            f"{r['facts']:,}",
            f"{r['recompute']:.4f}",
            f"{r['save']:.3f}",
            f"{r['restart']:.4f}",
            ratio(r["recompute"], r["restart"]),
            f"{r['read_all']:.4f}",
            f"{r['first_update']:.4f}",
            f"{r['later_update']:.4f}",
            ratio(r["recompute"], r["restart"] + r["first_update"]),
            f"{r['mb']:.1f}",
        )
    return table


def memory_table(results: list[dict]) -> Table:
    """The printed memory table, as Markdown."""
    table = Table(
        ("case", "facts", "recompute: kept B/fact", "recompute: RSS B/fact",
         "restart: kept B/fact", "restart: RSS B/fact", "restart / recompute (RSS)"),
        "lrrrrrr",
        title="Memory held after recomputing and after a restart (fresh process per side)",
    )  # fmt: skip
    for r in results:
        before: Footprint = r["memory"]["recompute"]
        after: Footprint = r["memory"]["restart"]
        table.add(
            r["case"],
            f"{r['facts']:,}",
            f"{before.per_fact(before.traced_kept):.0f}",
            f"{before.per_fact(before.rss):.0f}",
            f"{after.per_fact(after.traced_kept):.0f}",
            f"{after.per_fact(after.rss):.0f}",
            ratio(after.rss, before.rss, 2),
        )
    return table


def restart_verdict(recompute: float, back: float) -> tuple[str, bool]:
    """Issue 51's restart target for one case: (what it asks, met). ``back``: restart, first
    query and first update, in a new process."""
    if recompute >= RECOMPUTE_FLOOR:
        return f">= {RESTART_SPEEDUP:g}x back to work", recompute >= RESTART_SPEEDUP * back
    return f"back to work < {SMALL_BACK_TO_WORK * 1e3:g} ms", back < SMALL_BACK_TO_WORK


def print_new_process(results: list[dict]) -> Table:
    """The table of sides run in new processes (module docstring); returned as Markdown.
    ``recompute s`` runs until the case's first query is answered, as ``restart s`` plus
    ``1st query s`` does; ``back to work`` adds the first update."""
    table = Table(
        ("case", "recompute s", "restart s", "1st query s", "to 1st answer", "1st update s",
         "back to work s", "back to work", "target", "verdict"),
        "lrrrrrrrll",
        title="In new processes (each run a process of its own, sides alternating, best of each)",
    )  # fmt: skip
    print()
    print("In new processes (each run a process of its own, sides alternating, best of each):")
    print(
        f"{'case':<22}{'recompute s':>13}{'restart s':>11}{'1st query s':>13}"
        f"{'to answer':>11}{'1st update s':>14}{'back s':>9}{'back to work':>14}  target"
    )
    for r in results:
        found = r["new_process"]
        recompute, restart, first = found["recompute"], found["restart"], found["first"]
        query = found["query"]
        back = restart + query + first
        target, met = restart_verdict(recompute, back)
        verdict = "met" if met else "NOT met"
        print(
            f"{r['case']:<22}{recompute:>13.4f}{restart:>11.4f}{query:>13.4f}"
            f"{recompute / (restart + query):>10.1f}x{first:>14.4f}{back:>9.4f}"
            f"{recompute / back:>13.1f}x  {target}: {verdict}",
            flush=True,
        )
        table.add(
            r["case"],
            f"{recompute:.4f}",
            f"{restart:.4f}",
            f"{query:.4f}",
            ratio(recompute, restart + query),
            f"{first:.4f}",
            f"{back:.4f}",
            ratio(recompute, back),
            target,
            verdict,
        )
    return table


if __name__ == "__main__":
    sys.exit(main())
