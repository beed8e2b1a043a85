"""Benchmark: hypertree decompositions (the combined approach) vs plain join plans.

    python -m simulations.bench.hypertree [--quick] [--repeat N] [--only NAME ...]
                                          [--scale S] [--forced] [--per-rule] [--no-clingo]
                                          [--seeds N] [--no-memory] [--markdown [FILE]]

Workloads (``simulations/bench/hypertree_workloads.py``, generators deterministic):
expressions (the paper's Exp), graph patterns (its YAGO rules), university L (LUBM's simple
rules: no rule is cyclic, so no decomposition may be chosen), university L+C (with 16
cyclic rules) and skewed patterns (the YAGO-style rules over the skewed graph: 2,000
nodes and 20,000 edges times ``--scale``, 0.2 with ``--quick``).

Per workload, both sides in the same run: **combined** (``Reasoner()``: each cyclic rule
through a decomposition where estimated cheaper, hypertree module) and **plans**
(``Reasoner(decompositions=False)``: every rule by join plans, the other modules as usual).
Steps, each timed on its own: materialisation (the rules added to the explicit facts, 1,000 of
which are held back), adding the 1,000 held-back facts, deleting 1,000 random facts, deleting
25% of the remaining ones. After every step both sides must hold the same facts (checked).
Sides alternate, best of ``--repeat`` kept per step. Printed: seconds per side and their ratio,
the decompositions chosen and the search time, and (unless ``--no-memory``) the peak traced
allocation of each side's materialisation (in a fresh process; tracing never touches a
timing).

On the workloads written in plain Datalog (the graph patterns), clingo materialises the same
facts in the same run (unless ``--no-clingo``): the rules and the materialisation's input facts
as one ASP program, grounded and solved once, timed from adding the text to the model; the
head atoms of its model are counted and must be as many as the facts the reasoner derived.

``--per-rule`` materialises each head's rules of a plain-Datalog workload alone, three ways
(plans only, forced: every cyclic rule decomposed, and the cost model's choice) and prints the
choice's time over the better of the other two (the choice is right when that is about 1).

``--seeds N`` materialises the graph patterns with the combined side in N fresh processes with
different ``PYTHONHASHSEED`` values and prints the times and whether plans and decompositions
were the same in all of them (they must be: choices follow cardinality estimates, never the
process's hashing).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from agent.engine import Reasoner
from agent.engine.plan.decomposition import is_cyclic_rule
from agent.engine.program.heads import single_headed
from simulations.bench.hypertree_workloads import (
    Workload,
    expressions,
    graph_patterns,
    skewed_patterns,
    university_workload,
)
from simulations.bench.memory import fact_count, footprint, megabytes
from simulations.bench.table import Table, add_markdown_option, write_markdown
from simulations.bench.table import ratio as over
from simulations.bench.timing import timed

SIDES = {"combined": {}, "plans": {"decompositions": False}}
FORCED = {"forced": {"decompositions": "always"}}  # --forced: every cyclic rule decomposed
STEPS = ("materialise", "add 1,000", "delete 1,000", "delete 25%")


def workloads(quick: bool, scale: float | None = None) -> dict[str, Callable[[], Workload]]:
    """Sizes: plain join plans take tens of seconds on expressions (seconds with --quick)."""
    skewed = scale if scale is not None else (0.2 if quick else 1.0)
    if quick:
        return {
            "expressions": lambda: expressions(count=8, depth=3, valuations=20),
            "graph patterns": lambda: graph_patterns(nodes=500, edges=4_000),
            "university L": lambda: university_workload(1, complex_rules=False),
            "university L+C": lambda: university_workload(1, complex_rules=True),
            "skewed patterns": lambda: skewed_patterns(skewed),
        }
    return {
        "expressions": lambda: expressions(count=20, depth=4, valuations=50),
        "graph patterns": lambda: graph_patterns(nodes=2_000, edges=20_000),
        "university L": lambda: university_workload(6, complex_rules=False),
        "university L+C": lambda: university_workload(6, complex_rules=True),
        "skewed patterns": lambda: skewed_patterns(skewed),
    }


def is_plain_datalog(workload: Workload) -> bool:
    """Rules clingo reads as they are: no prefixes, IRIs, binds or skolems."""
    return "@prefix" not in workload.rules and "bind(" not in workload.rules


def clingo_program(workload: Workload, facts: list[tuple]) -> str:
    rules = "\n".join(
        line for line in workload.rules.splitlines() if line and not line.startswith("#")
    )
    return "\n".join(f"{p}({s},{o})." for p, s, o in facts) + "\n" + rules + "\n"


def head_predicates(workload: Workload) -> set[str]:
    return {
        line.split("(", 1)[0].strip()
        for line in workload.rules.splitlines()
        if ":-" in line and not line.startswith("#")
    }


def clingo_materialise(workload: Workload, facts: list[tuple]) -> tuple[float, int]:
    """Seconds clingo takes from the program text to its (only) model, and the number of head
    atoms in that model."""
    import clingo  # the dev extra: only this side needs it

    heads = head_predicates(workload)
    text = clingo_program(workload, facts)
    found = [0]

    def on_model(model: clingo.Model) -> None:
        found[0] = sum(1 for atom in model.symbols(atoms=True) if atom.name in heads)

    started = time.perf_counter()
    control = clingo.Control(["--warn=none"])
    control.add("base", [], text)
    control.ground([("base", [])])
    control.solve(on_model=on_model)
    return time.perf_counter() - started, found[0]


@dataclass
class Plan:
    """The facts held back (added in step 2) and deleted (steps 3 and 4)."""

    held: list[tuple]
    start: list[tuple]
    small: list[tuple]
    large: list[tuple]


def update_plan(facts: list[tuple], seed: int = 5) -> Plan:
    rng = random.Random(seed)
    facts = sorted(facts, key=repr)
    held = rng.sample(facts, min(1_000, len(facts) // 10))
    kept = set(held)
    start = [f for f in facts if f not in kept]
    small = rng.sample(facts, min(1_000, len(facts) // 10))
    rest = sorted(set(facts) - set(small), key=repr)
    large = rng.sample(rest, len(rest) // 4)
    return Plan(held, start, small, large)


@dataclass
class SideRun:
    seconds: dict[str, float] = field(default_factory=dict)
    digests: dict[str, str] = field(default_factory=dict)
    stats: dict = field(default_factory=dict)


def digest(reasoner: Reasoner) -> str:
    text = "\n".join(sorted(map(repr, reasoner.facts())))
    return f"{reasoner.count()}:{hashlib.sha1(text.encode()).hexdigest()[:12]}"


def run_side(workload: Workload, plan: Plan, options: dict) -> SideRun:
    run = SideRun()
    reasoner = Reasoner(**options)
    reasoner.add_facts(plan.start)
    steps: list[tuple[str, Callable[[], object]]] = [
        ("materialise", lambda: reasoner.add_rules(workload.rules)),
        ("add 1,000", lambda: reasoner.add_facts(plan.held)),
        ("delete 1,000", lambda: reasoner.delete_facts(plan.small)),
        ("delete 25%", lambda: reasoner.delete_facts(plan.large)),
    ]
    for name, action in steps:
        run.seconds[name] = timed(action)
        run.digests[name] = digest(reasoner)
        if name == "materialise":
            run.stats = choices_of(reasoner)
    return run


def choices_of(reasoner: Reasoner) -> dict:
    """Rules, cyclic ones (a multi-head rule's body counts), decomposed ones, slowest search."""
    decomposed = 0
    search = 0.0
    for node in reasoner.stats()["hyper_nodes"]:
        for choice in node.get("rules_evaluated", {}).values():
            decomposed += choice["evaluation"] == "decomposition"
            search = max(search, choice["decomposition_seconds"])
    cyclic = sum(is_cyclic_rule(part) for part in single_headed(reasoner.program.values()))
    return {"rules": len(reasoner.rules), "cyclic": cyclic, "decomposed": decomposed,
            "slowest search ms": round(search * 1000, 1)}  # fmt: skip


def build_for_memory(name: str, quick: bool, side: str, scale: float | None = None) -> Reasoner:
    workload = workloads(quick, scale)[name]()
    reasoner = Reasoner(**SIDES[side])
    reasoner.add_facts(workload.facts)
    reasoner.add_rules(workload.rules)
    return reasoner


def compare(
    name: str, make: Callable[[], Workload], repeat: int, sides: dict[str, dict], clingo: bool
) -> dict:
    workload = make()
    plan = update_plan(workload.facts)
    best: dict[str, dict[str, float]] = {side: {} for side in sides}
    stats: dict = {}
    clingo_seconds: float | None = None
    use_clingo = clingo and is_plain_datalog(workload)
    for round_ in range(repeat):
        order = list(sides) if round_ % 2 == 0 else list(reversed(sides))
        runs = {side: run_side(workload, plan, sides[side]) for side in order}
        derived = int(runs["combined"].digests["materialise"].split(":")[0]) - len(plan.start)
        if use_clingo:
            seconds, count = clingo_materialise(workload, plan.start)
            if count != derived:
                raise SystemExit(f"{name}: clingo derives {count} facts, the reasoner {derived}")
            clingo_seconds = seconds if clingo_seconds is None else min(clingo_seconds, seconds)
        if len({str(run.digests) for run in runs.values()}) > 1:
            raise SystemExit(f"{name}: the sides disagree: "
                             + "; ".join(f"{s} {r.digests}" for s, r in runs.items()))  # fmt: skip
        for side, run in runs.items():
            for step, seconds in run.seconds.items():
                best[side][step] = min(best[side].get(step, seconds), seconds)
        stats = runs["combined"].stats
        facts = runs["combined"].digests
    return {"workload": name, "explicit": len(workload.facts), "best": best, "stats": stats,
            "facts": facts, "clingo": clingo_seconds}  # fmt: skip


class Tables:
    """The Markdown tables of a run, every workload's rows in each."""

    def __init__(self, repeat: int) -> None:
        self.steps = Table(
            ("workload", "step", "combined s", "plans s", "forced s", "plans / combined"),
            "llrrrr",
            title=f"Steps, each side's best of {repeat} (forced: every cyclic rule decomposed)",
        )
        self.clingo = Table(
            ("workload", "combined s", "plans s", "clingo s", "clingo / combined"),
            "lrrrr",
            title=f"Materialisation against clingo (same facts), best of {repeat}",
        )
        self.choices = Table(
            ("workload", "explicit facts", "facts after materialisation", "rules", "cyclic",
             "decomposed", "slowest search ms"),
            "lrrrrrr",
            title="Decompositions chosen (combined side)",
        )  # fmt: skip
        self.memory = Table(
            ("workload", "combined peak MB", "plans peak MB", "combined / plans",
             "combined kept MB", "plans kept MB", "combined B/fact", "plans B/fact"),
            "lrrrrrrr",
            title="Memory of the materialisation (peak traced allocation, fresh process)",
        )  # fmt: skip
        self.seeds = Table(("PYTHONHASHSEED", "materialise s"), "rr")
        self.rules = Table(
            ("workload", "head", "chosen", "plans s", "forced s", "chosen s",
             "plans / forced", "chosen / better"),
            "lllrrrrr",
            title=f"Per rule (rules of one head together), materialised alone, best of {repeat}",
        )  # fmt: skip

    def all(self) -> list[Table]:
        return [self.steps, self.clingo, self.rules, self.choices, self.memory, self.seeds]


def print_table(result: dict, tables: Tables | None = None) -> None:
    best = result["best"]
    print(f"\n{result['workload']}: {result['explicit']:,} explicit facts, "
          f"{result['facts']['materialise'].split(':')[0]} after materialisation; "
          f"choices {result['stats']}")  # fmt: skip
    print(f"  {'step':<14} {'combined s':>11} {'plans s':>10} {'forced s':>10} "
          f"{'plans/combined':>15}")  # fmt: skip
    for step in STEPS:
        combined, plans = best["combined"][step], best["plans"][step]
        forced = best.get("forced", {}).get(step)
        shown = "—" if forced is None else f"{forced:.3f}"
        print(f"  {step:<14} {combined:>11.3f} {plans:>10.3f} {shown:>10} "
              f"{plans / combined:>14.1f}x")  # fmt: skip
        if tables is not None:
            tables.steps.add(
                result["workload"], step, f"{combined:.3f}", f"{plans:.3f}", shown,
                over(plans, combined),
            )  # fmt: skip
    if result["clingo"] is not None:
        combined, plans = best["combined"]["materialise"], best["plans"]["materialise"]
        print(f"  clingo materialises in {result['clingo']:.3f} s "
              f"({result['clingo'] / combined:.1f}x combined's time)")  # fmt: skip
        if tables is not None:
            tables.clingo.add(
                result["workload"], f"{combined:.3f}", f"{plans:.3f}",
                f"{result['clingo']:.3f}", over(result["clingo"], combined),
            )  # fmt: skip
    if tables is not None:
        stats = result["stats"]
        tables.choices.add(
            result["workload"],
            f"{result['explicit']:,}",
            f"{int(result['facts']['materialise'].split(':')[0]):,}",
            stats["rules"],
            stats["cyclic"],
            stats["decomposed"],
            stats["slowest search ms"],
        )


def print_memory(
    name: str, quick: bool, tables: Tables | None = None, scale: float | None = None
) -> None:
    found = {
        side: footprint(build_for_memory, fact_count, name, quick, side, scale) for side in SIDES
    }
    combined, plans = found["combined"], found["plans"]
    print(f"  memory (materialisation, fresh process): peak traced combined "
          f"{megabytes(combined.traced_peak)} MB, plans {megabytes(plans.traced_peak)} MB "
          f"({combined.traced_peak / max(1, plans.traced_peak):.2f}x); kept "
          f"{megabytes(combined.traced_kept)} vs {megabytes(plans.traced_kept)} MB; bytes per "
          f"stored fact {combined.traced_kept / max(1, combined.facts):.0f} vs "
          f"{plans.traced_kept / max(1, plans.facts):.0f}")  # fmt: skip
    if tables is not None:
        tables.memory.add(
            name,
            megabytes(combined.traced_peak),
            megabytes(plans.traced_peak),
            over(combined.traced_peak, max(1, plans.traced_peak), 2),
            megabytes(combined.traced_kept),
            megabytes(plans.traced_kept),
            round(combined.traced_kept / max(1, combined.facts)),
            round(plans.traced_kept / max(1, plans.facts)),
        )


def seed_spread(count: int, quick: bool, tables: Tables | None = None) -> None:
    """Materialise the graph patterns (combined) in fresh processes with other hash seeds."""
    print(f"\nhash seeds (graph patterns, combined, {count} processes):")
    outputs = []
    for seed in range(count):
        env = {**os.environ, "PYTHONHASHSEED": str(seed)}
        argv = [sys.executable, "-m", "simulations.bench.hypertree", "--child-materialise"]
        argv += ["--quick"] if quick else []
        result = subprocess.run(argv, capture_output=True, text=True, env=env, check=True)
        outputs.append(json.loads(result.stdout))
        print(f"  PYTHONHASHSEED={seed}: {outputs[-1]['seconds']:.2f} s")
        if tables is not None:
            tables.seeds.add(seed, f"{outputs[-1]['seconds']:.3f}")
    same = len({o["plans"] for o in outputs}) == 1
    times = [o["seconds"] for o in outputs]
    print(f"  plans and decompositions identical in all: {same}; "
          f"slowest/fastest {max(times) / min(times):.2f}")  # fmt: skip
    if tables is not None:
        tables.seeds.title = (
            f"Graph patterns (combined) in {count} fresh processes: plans and decompositions "
            f"identical in all: {'yes' if same else 'NO'}; slowest / fastest "
            f"{max(times) / min(times):.2f}x"
        )


def child_materialise(quick: bool) -> None:
    workload = workloads(quick)["graph patterns"]()
    reasoner = Reasoner()
    reasoner.add_facts(workload.facts)
    started = time.perf_counter()
    reasoner.add_rules(workload.rules)
    seconds = time.perf_counter() - started
    plans = sorted(
        entry.describe() for name in sorted(reasoner.rules) for entry in reasoner.plans(name)
    )
    evaluations = [reasoner.evaluation(name) or "" for name in sorted(reasoner.rules)]
    text = "\n".join(plans + evaluations)
    text = "\n".join(line.split("; found in")[0] for line in text.splitlines())
    print(json.dumps({"seconds": seconds, "plans": hashlib.sha1(text.encode()).hexdigest()}))


def rule_groups(workload: Workload) -> dict[str, str]:
    """The rules of a plain-Datalog workload by head predicate (a recursive head's rules
    together), as text."""
    groups: dict[str, list[str]] = {}
    for line in workload.rules.splitlines():
        if ":-" in line and not line.startswith("#"):
            groups.setdefault(line.split("(", 1)[0].strip(), []).append(line)
    return {head: "\n".join(lines) for head, lines in groups.items()}


def materialise_alone(facts: list[tuple], rules: str, options: dict) -> tuple[float, str]:
    reasoner = Reasoner(**options)
    reasoner.add_facts(facts)
    seconds = timed(lambda: reasoner.add_rules(rules))
    evaluations = {
        "set at a time" if choice.get("set_at_a_time") else choice["evaluation"]
        for node in reasoner.stats()["hyper_nodes"]
        for choice in node.get("rules_evaluated", {}).values()
    }
    chosen = "+".join(sorted(evaluations - {"plan"})) or "plan"
    return seconds, chosen


def per_rule(name: str, make: Callable[[], Workload], repeat: int, tables: Tables) -> None:
    """Each head's rules materialised alone over the workload's facts: plans only, forced
    (every cyclic rule decomposed) and the cost model's choice, and the choice against the
    better of the other two (the target: at most 1.1x)."""
    workload = make()
    sides = {"plans": SIDES["plans"], "forced": FORCED["forced"], "chosen": SIDES["combined"]}
    print(f"\n{name}, per rule (materialised alone, best of {repeat}):")
    print(f"  {'head':<10} {'chosen':<14} {'plans s':>9} {'forced s':>9} {'chosen s':>9} "
          f"{'plans/forced':>13} {'chosen/better':>14}")  # fmt: skip
    for head, rules in rule_groups(workload).items():
        best: dict[str, float] = {}
        chosen = ""
        for round_ in range(repeat):
            order = list(sides) if round_ % 2 == 0 else list(reversed(sides))
            for side in order:
                seconds, evaluation = materialise_alone(workload.facts, rules, sides[side])
                best[side] = min(best.get(side, seconds), seconds)
                if side == "chosen":
                    chosen = evaluation
        better = min(best["plans"], best["forced"])
        print(f"  {head:<10} {chosen:<14} {best['plans']:>9.3f} {best['forced']:>9.3f} "
              f"{best['chosen']:>9.3f} {best['plans'] / best['forced']:>12.1f}x "
              f"{best['chosen'] / better:>13.2f}x")  # fmt: skip
        tables.rules.add(
            name, head, chosen, f"{best['plans']:.3f}", f"{best['forced']:.3f}",
            f"{best['chosen']:.3f}", over(best["plans"], best["forced"]),
            over(best["chosen"], better, 2),
        )  # fmt: skip
        sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per side (best kept)")
    parser.add_argument("--only", nargs="*", default=None, help="workloads to run (names)")
    parser.add_argument("--seeds", type=int, default=3, help="hash seeds for the spread")
    parser.add_argument(
        "--scale",
        type=float,
        default=None,
        help="size of the skewed patterns (1: 2,000 nodes, 20,000 edges)",
    )
    parser.add_argument(
        "--forced", action="store_true", help="a third side: every cyclic rule decomposed"
    )
    parser.add_argument("--no-clingo", action="store_true", help="skip the clingo side")
    parser.add_argument(
        "--per-rule", action="store_true", help="each head's rules alone, three ways"
    )
    parser.add_argument("--no-memory", action="store_true", help="skip the memory figures")
    parser.add_argument("--child-materialise", action="store_true", help=argparse.SUPPRESS)
    add_markdown_option(parser)
    args = parser.parse_args(argv)
    if args.child_materialise:
        child_materialise(args.quick)
        return 0
    tables = Tables(args.repeat)
    sides = {**SIDES, **(FORCED if args.forced else {})}
    for name, make in workloads(args.quick, args.scale).items():
        if args.only and name not in args.only:
            continue
        print_table(compare(name, make, args.repeat, sides, not args.no_clingo), tables)
        if args.per_rule and is_plain_datalog(make()):
            per_rule(name, make, args.repeat, tables)
        if not args.no_memory:
            print_memory(name, args.quick, tables, args.scale)
        sys.stdout.flush()
    if args.seeds:
        seed_spread(args.seeds, args.quick, tables)
    write_markdown(args.markdown, tables.all())
    return 0


if __name__ == "__main__":
    sys.exit(main())
