"""Benchmark: this engine against Nemo on general workloads no module of ours is shaped for.

    python -m simulations.bench.peers [--quick] [--repeat N] [--markdown [FILE]]

Nemo (knowsys/nemo, a Rust in-memory Datalog engine; Python bindings ``nemo-python``, module
``nmo_python``) is the peer: both engines run the same program on the same data, each run in a
fresh process (so no run inherits another's memory or caches), the sides alternating, the best
of ``--repeat`` runs kept per side. Workloads (generators deterministic, below):

* **linear TC**: ``tc(X, Y) :- e(X, Y).  tc(X, Z) :- tc(X, Y), e(Y, Z).`` over a random DAG
  (1,000 nodes, 10,000 edges). Ours twice: with modules (the transitive-closure module takes
  this rule) and without (``Reasoner(modules=False)``: plain seminaive);
* **RDFS**: the six RDFS rules with instance data (rdfs2, 3, 5, 7, 9, 11) over reified triples
  ``triple(S, P, O)`` of a university-style data set (classes and properties of LUBM's kind,
  with domains, ranges, subclasses and subproperties), about 100,000 triples.

Both sides start from the same CSV file of the explicit facts. Printed per side: ``load``
(ours: reading the file and adding the facts; Nemo: parsing the program, since it imports
the file while reasoning), ``reason`` (to a complete materialisation), their sum (the figure
to compare; the best run is the one with the smallest sum), the facts of the head relation
(checked equal between the sides) and the process's peak resident set (ru_maxrss).
Requires ``nemo-python`` (installed by ``make venv``).
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

SIDES = ("ours", "ours-no-modules", "nemo")

TC = {
    "ours": "<tc>(X, Y) :- <e>(X, Y) .\n<tc>(X, Z) :- <tc>(X, Y) and <e>(Y, Z) .\n",
    "nemo": "tc(?X, ?Y) :- e(?X, ?Y) .\ntc(?X, ?Z) :- tc(?X, ?Y), e(?Y, ?Z) .\n",
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
    def atom(text: str) -> str:
        terms = [
            t if t.startswith("<") else (t if side == "ours" else f"?{t}") for t in text.split()
        ]
        name = "<triple>" if side == "ours" else "triple"
        return f"{name}({', '.join(terms)})"

    joiner = " and " if side == "ours" else ", "
    return "".join(f"{atom(h)} :- {joiner.join(map(atom, body))} .\n" for h, body in RDFS_RULES)


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
def run_one(side: str, workload: str, quick: bool) -> dict:
    """Both sides start from the same CSV file of explicit facts (written before the clock
    starts): ours reads it with the csv module and adds the tuples, Nemo imports it (which it
    does while reasoning, so for Nemo ``load`` is only parsing the program)."""
    relation, facts = workload_data(workload, quick)
    head = "tc" if workload == "tc" else "triple"
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / f"{relation}.csv"
        with open(path, "w", newline="") as out:
            csv.writer(out).writerows(facts)
        if side == "nemo":
            from nmo_python import NemoEngine, load_string

            program = TC["nemo"] if workload == "tc" else rdfs_program("nemo")
            source = f'@import {relation} :- csv {{resource = "{path}"}} .\n'
            started = time.perf_counter()
            engine = NemoEngine(load_string(source + program))
            loaded = time.perf_counter()
            engine.reason()
            done = time.perf_counter()
            count = sum(1 for _ in engine.result(head))
        else:
            from agent.engine import Reasoner

            program = TC["ours"] if workload == "tc" else rdfs_program("ours")
            started = time.perf_counter()
            reasoner = Reasoner(modules=side == "ours")
            with open(path, newline="") as rows:
                reasoner.add_facts([(relation, *row) for row in csv.reader(rows)])
            loaded = time.perf_counter()
            reasoner.add_rules(program)
            done = time.perf_counter()
            count = sum(1 for _ in reasoner.facts(head))
    return {
        "load": loaded - started,
        "reason": done - loaded,
        "facts": count,
        "maxrss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    }


def in_fresh_process(side: str, workload: str, quick: bool) -> dict:
    command = [sys.executable, "-m", "simulations.bench.peers", "--run", side, workload]
    if quick:
        command.append("--quick")
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{side} on {workload} failed:\n{done.stderr}")
    return json.loads(done.stdout.splitlines()[-1])


def compare(workload: str, title: str, quick: bool, repeat_count: int) -> tuple[bool, Table]:
    """Print the workload's table; return whether the sides agree, and the table as Markdown."""
    best: dict[str, dict] = {}
    for _ in range(repeat_count):
        for side in SIDES:
            if workload == "rdfs" and side == "ours-no-modules":
                continue  # (no module takes the RDFS rules: the same run as "ours")
            found = in_fresh_process(side, workload, quick)
            total = found["load"] + found["reason"]
            if side not in best or total < best[side]["load"] + best[side]["reason"]:
                best[side] = found
    relation, facts = workload_data(workload, quick)
    print(f"\n# {title}: {len(facts):,} explicit facts")
    table = Table(
        ("side", "load s", "reason s", "total s", "facts", "peak RSS MB", "total / nemo's"),
        "lrrrrrr",
        title=f"{title[0].upper()}{title[1:]}: {len(facts):,} explicit facts "
        f"(best of {repeat_count} per side)",
    )
    nemo = best["nemo"]["load"] + best["nemo"]["reason"]
    print(
        f"{'side':<18}{'load s':>9}{'reason s':>10}{'total s':>9}{'facts':>10}{'peak RSS MB':>13}"
    )
    for side, found in best.items():
        print(
            f"{side:<18}{found['load']:>9.3f}{found['reason']:>10.3f}"
            f"{found['load'] + found['reason']:>9.3f}{found['facts']:>10,}"
            f"{found['maxrss'] / 1e6:>13.0f}"
        )
        total = found["load"] + found["reason"]
        table.add(
            side,
            f"{found['load']:.3f}",
            f"{found['reason']:.3f}",
            f"{total:.3f}",
            f"{found['facts']:,}",
            f"{found['maxrss'] / 1e6:.0f}",
            ratio(total, nemo, 2),
        )
    for side in best:
        if side != "nemo":
            ours = best[side]["load"] + best[side]["reason"]
            print(f"{side} / nemo, total time: {ours / nemo:.2f}x")
    counts = {found["facts"] for found in best.values()}
    if len(counts) != 1:
        print(f"MISMATCH: the sides derived different numbers of facts: {counts}")
        return False, table
    return True, table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes only (a smoke run)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per side, best reported")
    parser.add_argument("--run", nargs=2, metavar=("SIDE", "WORKLOAD"), help=argparse.SUPPRESS)
    add_markdown_option(parser)
    args = parser.parse_args(argv)
    if args.run:
        print(json.dumps(run_one(*args.run, quick=args.quick)))
        return 0
    try:
        import nmo_python  # noqa: F401
    except ImportError:
        print("this benchmark needs Nemo's Python bindings: pip install nemo-python")
        return 2
    tc_same, tc = compare("tc", "linear TC of a random DAG", args.quick, args.repeat)
    rdfs_same, rdfs = compare(
        "rdfs", "RDFS closure of a university data set", args.quick, args.repeat
    )
    write_markdown(args.markdown, [tc, rdfs])
    return 0 if tc_same and rdfs_same else 1


if __name__ == "__main__":
    sys.exit(main())
