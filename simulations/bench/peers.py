"""Benchmark: this engine against Nemo and clingo on general workloads nobody tuned for.

    python -m simulations.bench.peers [--quick] [--repeat N] [--no-memory] [--markdown [FILE]]

The peers: Nemo (knowsys/nemo, a Rust in-memory Datalog engine; Python bindings
``nemo-python``, module ``nmo_python``) and clingo (Potassco's grounder and solver, its Python
API ``clingo.Control``: the program grounded and solved; for a positive program grounding
alone computes the model). All sides run the same program on the same data, each run in a
fresh process (so no run inherits another's memory or caches), the sides alternating, the best
of ``--repeat`` runs kept per side. Workloads (generators deterministic, below):

* **linear TC**: ``tc(X, Y) :- e(X, Y).  tc(X, Z) :- tc(X, Y), e(Y, Z).`` over a random DAG
  (1,000 nodes, 10,000 edges). Ours twice: with modules (the default; the ``module`` column
  says which one took the rules) and without (``Reasoner(modules=False)``: plain seminaive);
* **RDFS**: the six RDFS rules with instance data (rdfs2, 3, 5, 7, 9, 11) over reified triples
  ``triple(S, P, O)`` of a university-style data set (classes and properties of LUBM's kind,
  with domains, ranges, subclasses and subproperties), about 140,000 triples.

Every side starts from the same CSV file of the explicit facts, and its clock from the file:
``load`` is ours reading it and adding the facts, clingo reading it and adding them as facts
(``e("v1","v2").``), Nemo parsing the program (it imports the file while reasoning);
``reason`` runs to a complete materialisation (clingo: ground and solve). Their sum is the
figure compared (the best run is the one with the smallest sum). Printed per side too: the
facts of the head relation (checked equal between the sides), the process's peak resident set
(ru_maxrss) and, unless ``--no-memory``, the resident-set growth of building the
materialisation per stored fact (explicit and derived, the same count for every side),
measured in a fresh process apart from the timings (simulations/bench/memory.py). Then the
targets: ours at most 0.8x Nemo's total and at most clingo's. Requires ``nemo-python`` and
``clingo`` (installed by ``make venv``).
"""

from __future__ import annotations

import argparse
import csv
import json
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from simulations.bench.modules import random_dag
from simulations.bench.table import Table, add_markdown_option, ratio, write_markdown

SIDES = ("ours", "ours-no-modules", "nemo", "clingo")
PEERS = ("nemo", "clingo")
TARGET_NEMO = 0.8  # ours at most 0.8x Nemo's total time, and at most clingo's

TC = {
    "ours": "<tc>(X, Y) :- <e>(X, Y) .\n<tc>(X, Z) :- <tc>(X, Y) and <e>(Y, Z) .\n",
    "nemo": "tc(?X, ?Y) :- e(?X, ?Y) .\ntc(?X, ?Z) :- tc(?X, ?Y), e(?Y, ?Z) .\n",
    "clingo": "tc(X, Y) :- e(X, Y) .\ntc(X, Z) :- tc(X, Y), e(Y, Z) .\n",
}
RDFS_RULES = [  # (head, body atoms) over triple/3; constants in angle brackets, variables bare
    ("X <type> C", ["P <dom> C", "X P Y"]),  # rdfs2
    ("Y <type> C", ["P <rng> C", "X P Y"]),  # rdfs3
    ("P <sp> R", ["P <sp> Q", "Q <sp> R"]),  # rdfs5
    ("X R Y", ["P <sp> R", "X P Y"]),  # rdfs7
    ("X <type> D", ["C <sc> D", "X <type> C"]),  # rdfs9
    ("C <sc> E", ["C <sc> D", "D <sc> E"]),  # rdfs11
]


def rdfs_program(side: str) -> str:
    """The RDFS rules in a side's syntax: constants are IRIs for ours, quoted strings for
    clingo (whose bare names would start upper-case: variables), IRIs for Nemo."""

    def term(text: str) -> str:
        if text.startswith("<"):
            return f'"{text[1:-1]}"' if side == "clingo" else text
        return f"?{text}" if side == "nemo" else text

    def atom(text: str) -> str:
        name = "<triple>" if side == "ours" else "triple"
        return f"{name}({', '.join(map(term, text.split()))})"

    joiner = " and " if side == "ours" else ", "
    return "".join(f"{atom(h)} :- {joiner.join(map(atom, body))} .\n" for h, body in RDFS_RULES)


def program_of(side: str, workload: str) -> str:
    syntax = "ours" if side.startswith("ours") else side
    return TC[syntax] if workload == "tc" else rdfs_program(syntax)


# ------------------------------------------------------------------ the university data set
SUBCLASSES = [
    ("Student", "Person"), ("GraduateStudent", "Student"), ("UndergraduateStudent", "Student"),
    ("Employee", "Person"), ("Faculty", "Employee"), ("Professor", "Faculty"),
    ("FullProfessor", "Professor"), ("AssociateProfessor", "Professor"),
    ("AssistantProfessor", "Professor"), ("Lecturer", "Faculty"),
    ("University", "Organization"), ("Department", "Organization"),
    ("GraduateCourse", "Course"), ("Article", "Publication"),
]  # fmt: skip
SUBPROPERTIES = [
    ("worksFor", "memberOf"), ("headOf", "worksFor"), ("doctoralDegreeFrom", "degreeFrom"),
    ("mastersDegreeFrom", "degreeFrom"), ("undergraduateDegreeFrom", "degreeFrom"),
    ("advisor", "knows"),
]  # fmt: skip
DOMAINS = [
    ("takesCourse", "Student"), ("teacherOf", "Faculty"), ("memberOf", "Person"),
    ("advisor", "Student"), ("degreeFrom", "Person"), ("publicationAuthor", "Publication"),
    ("subOrganizationOf", "Organization"), ("headOf", "Professor"),
]  # fmt: skip
RANGES = [
    ("takesCourse", "Course"), ("teacherOf", "Course"), ("memberOf", "Organization"),
    ("advisor", "Professor"), ("degreeFrom", "University"), ("publicationAuthor", "Person"),
    ("subOrganizationOf", "Organization"),
]  # fmt: skip
RANKS = ("FullProfessor", "AssociateProfessor", "AssistantProfessor", "Lecturer")


def university(universities: int, seed: int = 3) -> list[tuple[str, str, str]]:
    """Triples of a university-style data set: per university 15 departments, each with 10
    faculty (one heads it), 30 graduate and 60 undergraduate students, 20 courses and 30
    articles. About 6,800 triples per university, plus the schema."""
    rng = random.Random(seed)
    triples = [(a, "sc", b) for a, b in SUBCLASSES] + [(a, "sp", b) for a, b in SUBPROPERTIES]
    triples += [(p, "dom", c) for p, c in DOMAINS] + [(p, "rng", c) for p, c in RANGES]
    for u in range(universities):
        uni = f"u{u}"
        triples.append((uni, "type", "University"))
        for d in range(15):
            dept = f"{uni}d{d}"
            triples += [(dept, "type", "Department"), (dept, "subOrganizationOf", uni)]
            courses = [f"{dept}c{c}" for c in range(20)]
            for c, course in enumerate(courses):
                triples.append((course, "type", "GraduateCourse" if c < 8 else "Course"))
            faculty = [f"{dept}f{f}" for f in range(10)]
            for f, person in enumerate(faculty):
                triples += [
                    (person, "type", RANKS[f % 4]),
                    (person, "worksFor", dept),
                    (person, "teacherOf", courses[2 * f]),
                    (person, "teacherOf", courses[2 * f + 1]),
                    (person, "doctoralDegreeFrom", f"u{rng.randrange(universities)}"),
                ]
            triples.append((faculty[0], "headOf", dept))
            for s in range(30):
                student = f"{dept}g{s}"
                triples += [
                    (student, "type", "GraduateStudent"),
                    (student, "memberOf", dept),
                    (student, "advisor", rng.choice(faculty[:6])),
                    (student, "takesCourse", rng.choice(courses[:8])),
                    (student, "takesCourse", rng.choice(courses[:8])),
                    (student, "undergraduateDegreeFrom", f"u{rng.randrange(universities)}"),
                ]
            for s in range(60):
                student = f"{dept}s{s}"
                triples += [(student, "type", "UndergraduateStudent"), (student, "memberOf", dept)]
                triples += [(student, "takesCourse", rng.choice(courses[8:])) for _ in range(3)]
            for a in range(30):
                article = f"{dept}a{a}"
                triples += [
                    (article, "type", "Article"),
                    (article, "publicationAuthor", rng.choice(faculty)),
                    (article, "publicationAuthor", f"{dept}g{rng.randrange(30)}"),
                ]
    return sorted(set(triples))


def workload_data(workload: str, quick: bool) -> tuple[str, list[tuple[str, ...]]]:
    """(relation, facts): the explicit facts as tuples of names."""
    if workload == "tc":
        nodes, edges = (200, 1000) if quick else (1000, 10000)
        return "e", [(a, b) for _, a, b in random_dag(nodes, edges)]
    return "triple", university(1 if quick else 15)


# ------------------------------------------------------------------ one run, in its own process
def write_input(workload: str, quick: bool, directory: str) -> tuple[str, Path]:
    """The explicit facts as a CSV file (written before any clock starts): (relation, path)."""
    relation, facts = workload_data(workload, quick)
    path = Path(directory) / f"{relation}.csv"
    with open(path, "w", newline="") as out:
        csv.writer(out).writerows(facts)
    return relation, path


def materialise(side: str, workload: str, relation: str, path: Path) -> tuple[object, dict]:
    """From the CSV file to a complete materialisation on one side: (the engine, timings).

    Ours reads the file with the csv module and adds the tuples; clingo reads it too and adds
    the rows as facts; Nemo imports it (which it does while reasoning, so for Nemo ``load`` is
    only parsing the program)."""
    program = program_of(side, workload)
    imported(side)  # (a module's import is not the workload's time)
    started = time.perf_counter()
    if side == "nemo":
        from nmo_python import NemoEngine, load_string

        source = f'@import {relation} :- csv {{resource = "{path}"}} .\n'
        engine = NemoEngine(load_string(source + program))
        loaded = time.perf_counter()
        engine.reason()
    elif side == "clingo":
        import clingo

        engine = clingo.Control(["--warn=none"])
        with open(path, newline="") as rows:
            facts = "".join(
                f"{relation}({','.join(map(quoted, row))}).\n" for row in csv.reader(rows)
            )
        engine.add("base", [], facts + program)
        loaded = time.perf_counter()
        engine.ground([("base", [])])
        engine.solve()
    else:
        from agent.engine import Reasoner

        engine = Reasoner(modules=side == "ours")
        with open(path, newline="") as rows:
            engine.add_facts([(relation, *row) for row in csv.reader(rows)])
        loaded = time.perf_counter()
        engine.add_rules(program)
    done = time.perf_counter()
    return engine, {"load": loaded - started, "reason": done - loaded}


def quoted(name: str) -> str:
    return f'"{name}"'


def head_count(side: str, workload: str, engine: object) -> int:
    head = "tc" if workload == "tc" else "triple"
    if side == "nemo":
        return sum(1 for _ in engine.result(head))  # type: ignore[attr-defined]
    if side == "clingo":
        signature = engine.symbolic_atoms.by_signature(head, 2 if workload == "tc" else 3)  # type: ignore[attr-defined]
        return sum(1 for _ in signature)
    return sum(1 for _ in engine.facts(head))  # type: ignore[attr-defined]


def module_of(side: str, engine: object) -> str:
    """The module(s) that took the rules (ours), ``-`` for a peer."""
    if not side.startswith("ours"):
        return "-"
    nodes = engine.stats()["last_update"]["hyper_nodes"].values()  # type: ignore[attr-defined]
    return ", ".join(sorted({node["module"] for node in nodes}))


def run_one(side: str, workload: str, quick: bool) -> dict:
    with tempfile.TemporaryDirectory() as directory:
        relation, path = write_input(workload, quick, directory)
        engine, found = materialise(side, workload, relation, path)
        found["facts"] = head_count(side, workload, engine)
        found["module"] = module_of(side, engine)
    found["maxrss"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return found


def built(side: str, workload: str, quick: bool, directory: str) -> tuple[object, int]:
    """``footprint``'s build: a side's materialisation from the file (written by the parent
    before, so that the file's own bytes are not counted), and its stored facts."""
    relation = "e" if workload == "tc" else "triple"
    engine, _ = materialise(side, workload, relation, Path(directory) / f"{relation}.csv")
    return engine, head_count(side, workload, engine)


def imported(side: str, *_: object) -> None:
    """A side's modules imported before the measurement: their code is not the
    materialisation's memory."""
    if side == "nemo":
        import nmo_python  # noqa: F401
    elif side == "clingo":
        import clingo  # noqa: F401
    else:
        import agent.engine  # noqa: F401


def stored(result: tuple[object, int]) -> int:
    return result[1]


def in_fresh_process(side: str, workload: str, quick: bool) -> dict:
    command = [sys.executable, "-m", "simulations.bench.peers", "--run", side, workload]
    if quick:
        command.append("--quick")
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{side} on {workload} failed:\n{done.stderr}")
    return json.loads(done.stdout.splitlines()[-1])


def sides_of(workload: str) -> list[str]:
    """(no module takes the RDFS rules: ours without modules would be the same run)"""
    return [s for s in SIDES if not (workload == "rdfs" and s == "ours-no-modules")]


def memory_per_fact(workload: str, quick: bool) -> dict[str, float]:
    """Resident-set growth of each side's materialisation per stored fact (explicit and
    derived), each in a fresh process (simulations/bench/memory.py), never during a timing.
    The stored facts are the same count for every side: the explicit facts plus the head
    relation's, less those two share (RDFS: the head relation is the explicit one)."""
    from simulations.bench.memory import resident_growth

    explicit = len(workload_data(workload, quick)[1])
    found = {}
    with tempfile.TemporaryDirectory() as directory:
        write_input(workload, quick, directory)
        for side in sides_of(workload):
            growth, head = resident_growth(
                built, stored, side, workload, quick, directory, prepare=imported
            )
            facts = head + explicit if workload == "tc" else head
            found[side] = growth / facts
    return found


def compare(
    workload: str, title: str, quick: bool, repeat_count: int, memory: bool
) -> tuple[bool, Table, list[tuple[str, str, str, str]]]:
    """Print the workload's table; return whether the sides agree, the table, and the
    targets' rows (target, measured, verdict)."""
    best: dict[str, dict] = {}
    sides = sides_of(workload)
    for _ in range(repeat_count):
        for side in sides:
            found = in_fresh_process(side, workload, quick)
            total = found["load"] + found["reason"]
            if side not in best or total < best[side]["load"] + best[side]["reason"]:
                best[side] = found
    per_fact = memory_per_fact(workload, quick) if memory else {}
    relation, facts = workload_data(workload, quick)
    print(f"\n# {title}: {len(facts):,} explicit facts")
    table = Table(
        ("side", "module", "load s", "reason s", "total s", "facts", "peak RSS MB",
         "RSS B/fact", "total / nemo's", "total / clingo's"),
        "llrrrrrrrr",
        title=f"{title[0].upper()}{title[1:]}: {len(facts):,} explicit facts "
        f"(best of {repeat_count} per side)",
    )  # fmt: skip
    totals = {side: found["load"] + found["reason"] for side, found in best.items()}
    print(
        f"{'side':<18}{'module':<21}{'load s':>9}{'reason s':>10}{'total s':>9}{'facts':>10}"
        f"{'peak RSS MB':>13}{'RSS B/fact':>12}"
    )
    for side, found in best.items():
        bytes_per_fact = f"{per_fact[side]:.0f}" if side in per_fact else "-"
        print(
            f"{side:<18}{found['module']:<21}{found['load']:>9.3f}{found['reason']:>10.3f}"
            f"{totals[side]:>9.3f}{found['facts']:>10,}{found['maxrss'] / 1e6:>13.0f}"
            f"{bytes_per_fact:>12}"
        )
        table.add(
            side,
            found["module"],
            f"{found['load']:.3f}",
            f"{found['reason']:.3f}",
            f"{totals[side]:.3f}",
            f"{found['facts']:,}",
            f"{found['maxrss'] / 1e6:.0f}",
            bytes_per_fact,
            ratio(totals[side], totals["nemo"], 2),
            ratio(totals[side], totals["clingo"], 2),
        )
    for side in best:
        if side not in PEERS:
            print(
                f"{side}, total time: {totals[side] / totals['nemo']:.2f}x nemo's, "
                f"{totals[side] / totals['clingo']:.2f}x clingo's"
            )
    targets = []
    for peer, limit in (("nemo", TARGET_NEMO), ("clingo", 1.0)):
        measured = totals["ours"] / totals[peer]
        verdict = "met" if measured <= limit else "not met"
        targets.append(
            (title, f"ours' total <= {limit:.1f}x {peer}'s", f"{measured:.2f}x", verdict)
        )
    counts = {found["facts"] for found in best.values()}
    if len(counts) != 1:
        print(f"MISMATCH: the sides derived different numbers of facts: {counts}")
        return False, table, targets
    return True, table, targets


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes only (a smoke run)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per side, best reported")
    parser.add_argument(
        "--no-memory", action="store_true", help="skip the bytes per stored fact (RSS B/fact)"
    )
    parser.add_argument("--run", nargs=2, metavar=("SIDE", "WORKLOAD"), help=argparse.SUPPRESS)
    add_markdown_option(parser)
    args = parser.parse_args(argv)
    if args.run:
        print(json.dumps(run_one(*args.run, quick=args.quick)))
        return 0
    try:
        import clingo  # noqa: F401
        import nmo_python  # noqa: F401
    except ImportError as missing:
        print(f"this benchmark needs its peers' Python bindings ({missing.name}): "
              "pip install nemo-python clingo")  # fmt: skip
        return 2
    memory = not args.no_memory
    tc_same, tc, tc_targets = compare(
        "tc", "linear TC of a random DAG", args.quick, args.repeat, memory
    )
    rdfs_same, rdfs, rdfs_targets = compare(
        "rdfs", "RDFS closure of a university data set", args.quick, args.repeat, memory
    )
    targets = Table(
        ("workload", "target", "measured", "verdict"),
        "lllr",
        title="Targets (ours: the default reasoner, best totals of this run)",
    )
    print("\n# Targets")
    for row in tc_targets + rdfs_targets:
        print(f"  {row[0]}: {row[1]}: {row[2]} ({row[3]})")
        targets.add(*row)
    write_markdown(args.markdown, [tc, rdfs, targets])
    return 0 if tc_same and rdfs_same else 1


if __name__ == "__main__":
    sys.exit(main())
