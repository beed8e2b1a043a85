"""Benchmark: owl:sameAs by rewriting (B/F~) vs equality axiomatised as rules.

    python -m simulations.bench.equality [--quick] [--largest N ...] [--repeat N]
                                         [--axiomatised-up-to N] [--departments N]
                                         [--axiomatised-seminaive] [--markdown [FILE]]
    python -m simulations.bench.equality --largest 2000

The default sizes are 10 to 500 names (the axiomatised side makes them take about 35 minutes
with ``--repeat 3``); 1,000 and 2,000 take 3-4 minutes each, at about 2 GB of resident memory.
(One run of every size grew to 24 GB and was killed: each dropped reasoner with equality stayed
in memory, a reference cycle kept by gc.freeze; fixed in reasoner.py, ``_rule_evaluator``.)

Data: a university in the spirit of UOBM (``university``, deterministic): departments,
faculty, students with advisors, courses, emails, home towns (``hasSameHomeTownWith`` is
symmetric and transitive: cliques), and records of the same person from several sources.
The person recorded ``--largest`` times is a professor whose courses 3,000 students attend:
each of those facts names the professor, so axiomatised equality copies it once per name and
derives each copy once per name again (k^2 per fact), where rewriting stores it once.
Equality comes from an inverse-functional ``email`` (two records with one address are one
person), an inverse-functional ``isHeadOf`` and a functional ``hasAdvisor``; ``--largest``
sets the size of the largest class of names (one person recorded that many times), the other
duplicates make classes of two and three. Half of the largest class's names are linked to it by
explicit ``owl:sameAs`` facts.

Sides, each timed alone and in the same run:

* **rewriting**: ``Reasoner()`` (agent/engine/equality/layer.py);
* **axiomatised**: the same program with ``owl:sameAs`` renamed ``eq`` and written out as rules
  (symmetry, transitivity, reflexivity, one replacement rule per relation and argument), on the
  same engine (DRed^c, its modules on; ``--axiomatised-seminaive``: plain seminaive): k names
  of one individual cost k^2 ``eq`` facts and k copies of each of its facts, each derived k
  times, so it is skipped above ``--axiomatised-up-to``.

Steps: materialisation; then deleting 100, 1,000 and 5,000 random explicit facts, and every
explicit owl:sameAs fact of the largest class (half of its names were linked by a record-linkage
tool, half by their email address: the class splits), each from the same materialisation, by
**default** (what the reasoner chooses: this program's rules deciding equality are all keys,
so the classes that may split are closed again, sameas/keys.py), **B/F~** (the component
maintained by Algorithm 1, the key closure turned off), **remat~** (the component
rematerialised, the rest maintained incrementally), **scratch** (a new ``Reasoner`` over what
is left) and the axiomatised program's incremental maintenance; ratios are each side's time
over the default's. After every step each side must hold the same facts as the axiomatised
side (``eq`` read as ``owl:sameAs``) where it ran, else as scratch (above 3M expanded facts,
the same classes and facts in normal form). Best of ``--repeat`` per cell. Memory
(``--no-memory`` skips it): peak and kept traced allocation and RSS growth of materialising,
each side in a fresh process.
"""

from __future__ import annotations

import argparse
import random
import sys
from dataclasses import replace

from agent.engine import Reasoner
from agent.engine.costs import DEFAULT_COSTS
from simulations.bench.memory import fact_count, footprint
from simulations.bench.table import Table, add_markdown_option, write_markdown
from simulations.bench.table import ratio as over
from simulations.bench.timing import timed

OWL_SAME_AS = "http://www.w3.org/2002/07/owl#sameAs"
RDF_TYPE = "http://www.w3.org/1999/02/22-rdf-syntax-ns#type"
EQ = "eq"
EXPANDED_CHECK_LIMIT = 3_000_000  # expanded facts above which results are compared by classes

RULES = """@prefix owl: <http://www.w3.org/2002/07/owl#> .
owl:sameAs(X, Y) :- email(X, E), email(Y, E) .
owl:sameAs(X, Y) :- isHeadOf(X, D), isHeadOf(Y, D) .
owl:sameAs(Y, Z) :- hasAdvisor(X, Y), hasAdvisor(X, Z) .
<Person>(X) :- <Student>(X) .
<Person>(X) :- <Faculty>(X) .
memberOfUniversity(X, U) :- memberOf(X, D), subOrganizationOf(D, U) .
worksForUniversity(X, U) :- worksFor(X, D), subOrganizationOf(D, U) .
advisedAt(X, U) :- hasAdvisor(X, Y), worksForUniversity(Y, U) .
hasSameHomeTownWith(X, Y) :- hasSameHomeTownWith(Y, X) .
hasSameHomeTownWith(X, Z) :- hasSameHomeTownWith(X, Y), hasSameHomeTownWith(Y, Z) .
teaches(Y, C) :- teacherOf(Y, C) .
attendsCourseOf(X, Y) :- takesCourse(X, C), teacherOf(Y, C) .
"""
RELATIONS = [
    ("email", 2),
    ("isHeadOf", 2),
    ("hasAdvisor", 2),
    ("Student", 1),
    ("Faculty", 1),
    ("Person", 1),
    ("memberOf", 2),
    ("worksFor", 2),
    ("subOrganizationOf", 2),
    ("memberOfUniversity", 2),
    ("worksForUniversity", 2),
    ("advisedAt", 2),
    ("hasSameHomeTownWith", 2),
    ("teacherOf", 2),
    ("teaches", 2),
    ("takesCourse", 2),
    ("attendsCourseOf", 2),
]


def university(largest: int, departments: int = 30, students: int = 150, seed: int = 7) -> list:
    """The explicit facts (see the module docstring), ``largest`` names in the largest class."""
    rng = random.Random(seed)
    facts: list[tuple] = []
    people: list[str] = []
    for d in range(departments):
        dept, univ = f"u{d % 3}/d{d}", f"u{d % 3}"
        facts.append(("subOrganizationOf", dept, univ))
        faculty = [f"{dept}/f{i}" for i in range(8)]
        for f in faculty:
            facts += [(RDF_TYPE, f, "Faculty"), ("worksFor", f, dept), ("email", f, f"{f}@mail")]
            course = f"{f}/course"
            facts.append(("teacherOf", f, course))
            people.append(f)
        facts.append(("isHeadOf", faculty[0], dept))
        for i in range(students):
            s = f"{dept}/s{i}"
            facts += [(RDF_TYPE, s, "Student"), ("memberOf", s, dept), ("email", s, f"{s}@mail")]
            facts.append(("hasAdvisor", s, rng.choice(faculty)))
            for _ in range(2):
                facts.append(("takesCourse", s, f"{rng.choice(faculty)}/course"))
            people.append(s)
    for _ in range(len(people) // 12):  # home towns: chains that the closure makes cliques
        members = rng.sample(people, 4)
        facts += [("hasSameHomeTownWith", a, b) for a, b in zip(members, members[1:], strict=False)]
    # Records of the same people from other sources: the same email, some facts of their own.
    for number, person in enumerate(rng.sample(people, len(people) // 5)):
        for copy in range(1 + number % 2):
            alias = f"registry{copy}:{person}"
            facts += [("email", alias, f"{person}@mail"), ("takesCourse", alias, "extra")]
    star = people[0]  # a professor: teaches 20 courses that 3,000 students attend
    courses = sorted({f[2] for f in facts if f[0] == "teacherOf"})
    star_courses = [f"{star}/course{i}" for i in range(20)]
    facts += [("teacherOf", star, course) for course in star_courses]
    students_now = [p for p in people if "/s" in p]
    for student in rng.sample(students_now, min(3000, len(students_now))):
        facts.append(("takesCourse", student, rng.choice(star_courses)))
    for copy in range(largest - 1):  # each record of the star brings facts of its own
        alias = f"source{copy}:{star}"
        if copy % 2:  # linked by a record-linkage tool: an explicit owl:sameAs
            facts.append((OWL_SAME_AS, alias, star))
        else:  # linked by its email address
            facts.append(("email", alias, f"{star}@mail"))
        facts.append(("memberOf", alias, "u0/d0"))
        facts += [("takesCourse", alias, rng.choice(courses)) for _ in range(2)]
    # A department head recorded twice; an advisor under a second name.
    facts.append(("isHeadOf", "registry:head0", "u0/d0"))
    first = next(f for f in facts if f[0] == "hasAdvisor")
    facts.append(("hasAdvisor", first[1], f"hr:{first[2]}"))
    return list(dict.fromkeys(facts))


def axiomatised(rules: str) -> str:
    """The program with owl:sameAs renamed ``eq`` and equality written out as rules."""
    text = rules.replace("owl:sameAs", EQ)
    lines = [
        f"{EQ}(Y, X) :- {EQ}(X, Y) .",
        f"{EQ}(X, Z) :- {EQ}(X, Y), {EQ}(Y, Z) .",
        f"{EQ}(X, X) :- {EQ}(X, Y) .",
    ]
    for name, arity in RELATIONS:
        args = [f"A{i}" for i in range(arity)]
        for position in range(arity):
            replaced = args[:position] + ["B"] + args[position + 1 :]
            lines.append(
                f"<{name}>({', '.join(replaced)}) :- <{name}>({', '.join(args)}), "
                f"{EQ}({args[position]}, B) ."
            )
    return text + "\n".join(lines) + "\n"


def renamed(facts) -> list[tuple]:
    return [(EQ, *f[1:]) if f[0] == OWL_SAME_AS else f for f in facts]


def as_same_as(facts) -> set[tuple]:
    return {(OWL_SAME_AS, *f[1:]) if f[0] == EQ else f for f in facts}


def rewriting(facts, share: float | None = None, keys: bool = True) -> Reasoner:
    """The rewriting side; ``share``: the cost policy's rematerialisation share (None: the
    default), ``keys`` False: B/F~ even though every rule deciding equality is a key."""
    costs = replace(DEFAULT_COSTS, equality_key_closure=keys)
    if share is not None:
        costs = replace(costs, equality_rematerialise_share=share)
    reasoner = Reasoner(costs=costs)
    reasoner.update(add_rules=RULES, add_facts=facts)
    return reasoner


def run(
    largest: int,
    repeat: int,
    axiomatised_up_to: int,
    departments: int,
    modules: bool = True,
    memory: bool = True,
    memory_table: Table | None = None,
) -> Table:
    """Print one class size's steps (and memory lines, added to ``memory_table`` too); return
    the steps as a Markdown table."""
    facts = university(largest, departments, 20 if departments < 10 else 150)
    with_axioms = largest <= axiomatised_up_to
    print(f"\n## largest class {largest} names: {len(facts):,} explicit facts")
    best: dict[str, float] = {}

    def keep(name: str, seconds: float) -> None:
        best[name] = min(best.get(name, seconds), seconds)

    for _ in range(repeat):
        keep("mat rewriting", timed(lambda: rewriting(facts)))
        if with_axioms:
            keep("mat axiomatised", timed(lambda: _axiomatised(facts, modules)))
    reference = rewriting(facts)
    want = _model(reference, with_axioms)
    if with_axioms:
        got = as_same_as(_axiomatised(facts, modules).facts())
        _check(got, want, "materialisation")
    stats = reference.stats()
    equality = stats["equality"]
    print(
        f"  materialised: {stats['facts']:,} facts (expanded), {equality['classes']} classes, "
        f"largest {equality['largest_class']}, component {equality['component_facts']:,} facts"
    )
    table = Table(
        ("step", "default s", "B/F~ s", "remat~ s", "scratch s", "axiomatised s",
         "B/F~ / default", "remat~ / default", "scratch / default", "axiomatised / default"),
        "lrrrrrrrrr",
        title=f"Largest class {largest} names: {len(facts):,} explicit facts, "
        f"{stats['facts']:,} facts expanded, {equality['classes']:,} classes",
    )  # fmt: skip
    materialised = best.get("mat rewriting"), None, None, None, best.get("mat axiomatised")
    table.add(*_row("materialise", *materialised))
    if memory:
        _memory_row(facts, with_axioms, modules, stats["facts"], largest, memory_table)
    rng = random.Random(11)
    star = _star(facts)
    star_links = [f for f in facts if f[0] == OWL_SAME_AS and f[2] == star]
    updates = {
        f"delete {n:,}": rng.sample(facts, min(n, len(facts) // 2)) for n in (100, 1000, 5000)
    }
    updates["split largest class"] = star_links
    for name, deleted in updates.items():
        times, result, baseline = _deletions(facts, deleted, repeat, with_axioms, modules)
        expected = _model(rewriting([f for f in facts if f not in set(deleted)]), with_axioms)
        _check(result, expected, name)
        if baseline is not None:
            _check(as_same_as(baseline.facts()), expected, name + " (axiomatised)")
        row = _row(
            name,
            times["keys"],
            times["bf"],
            times["remat"],
            times["scratch"],
            times.get("axiomatised"),
        )
        table.add(*row)
    return table


def _deletions(facts: list, deleted: list, repeat: int, with_axioms: bool, modules: bool):
    """Best times of one deletion per side; the last incremental sides' result (each checked
    against the one before) and axiomatised reasoner."""
    left = [f for f in facts if f not in set(deleted)]
    times: dict[str, float] = {}
    result: set | tuple = set()
    baseline = None
    for _ in range(repeat):
        sides = (("keys", 1e9, True), ("bf", 1e9, False), ("remat", 0.0, True))
        for number, (side, share, keys) in enumerate(sides):
            reasoner = rewriting(facts, share, keys)
            seconds = timed(lambda r=reasoner: r.delete_facts(deleted))
            times[side] = min(times.get(side, seconds), seconds)
            model = _model(reasoner, with_axioms)
            if number:
                _check(model, result, f"{side} against keys")
            result = model
        seconds = timed(lambda: rewriting(left))
        times["scratch"] = min(times.get("scratch", seconds), seconds)
        if with_axioms:
            baseline = _axiomatised(facts, modules)
            seconds = timed(lambda b=baseline: b.delete_facts(renamed(deleted)))
            times["axiomatised"] = min(times.get("axiomatised", seconds), seconds)
    return times, result, baseline


def _star(facts) -> str:
    """The person recorded ``--largest`` times (its first alias is linked by email)."""
    return next(f[2] for f in facts if f[0] == "email" and f[1].startswith("source0:"))[:-5]


def _axiomatised(facts, modules: bool) -> Reasoner:
    """The axiomatised side: with the engine's modules (the replacement rules then run as
    per-subject unions of bitmaps, eq's closure by components) or plain seminaive."""
    reasoner = Reasoner(modules=modules)
    reasoner.update(add_rules=axiomatised(RULES), add_facts=renamed(facts))
    return reasoner


def memory_table() -> Table:
    """The Markdown table of the memory lines, every class size's in one."""
    return Table(
        ("largest class", "side", "peak traced MB", "kept MB", "RSS MB", "kept B/fact",
         "RSS B/fact", "peak / rewriting", "kept / rewriting", "RSS / rewriting"),
        "rlrrrrrrrr",
        title="Memory of materialising (fresh process per side; per fact of the expanded model)",
    )  # fmt: skip


def _memory_row(
    facts: list,
    with_axioms: bool,
    modules: bool,
    expanded: int,
    largest: int = 0,
    table: Table | None = None,
) -> None:
    """Peak and kept traced allocation and RSS growth of materialising, each side in a fresh
    process (simulations/bench/memory.py), per fact of the expanded model (the same model on
    both sides, so the figures compare)."""
    sides = [("rewriting", footprint(rewriting, fact_count, facts))]
    if with_axioms:
        sides.append(("axiomatised", footprint(_axiomatised, fact_count, facts, modules)))
    for name, found in sides:
        print(
            f"  memory {name:12}  peak traced {found.traced_peak / 1e6:7.1f} MB, kept "
            f"{found.traced_kept / 1e6:6.1f} MB, RSS {found.rss / 1e6:6.1f} MB; per expanded "
            f"fact {found.traced_kept / expanded:5.1f} B kept, {found.rss / expanded:5.1f} B RSS"
        )
        if table is not None:
            ours = sides[0][1]
            table.add(
                f"{largest:,}",
                name,
                f"{found.traced_peak / 1e6:.1f}",
                f"{found.traced_kept / 1e6:.1f}",
                f"{found.rss / 1e6:.1f}",
                f"{found.traced_kept / expanded:.1f}",
                f"{found.rss / expanded:.1f}",
                over(found.traced_peak, ours.traced_peak),
                over(found.traced_kept, ours.traced_kept),
                over(found.rss, ours.rss),
            )
    if with_axioms:
        (_, ours), (_, axioms) = sides
        print(
            f"  memory axiomatised/rewriting: peak {axioms.traced_peak / ours.traced_peak:.1f}x,"
            f" kept {axioms.traced_kept / ours.traced_kept:.1f}x, RSS {axioms.rss / ours.rss:.1f}x"
        )


def _model(reasoner: Reasoner, expanded: bool) -> set | tuple:
    """What two results are compared by: the expanded facts, or, when the axiomatised side is
    not compared (``expanded`` false) and there are more than ``EXPANDED_CHECK_LIMIT`` (a set
    of 22M facts at 2,000 names takes minutes to build), the classes and the facts in normal
    form, as values: representatives are chosen by value, so these determine the expanded
    model."""
    if expanded or reasoner.count() <= EXPANDED_CHECK_LIMIT:
        return set(reasoner.facts())
    values = reasoner.terms.values
    classes = reasoner.equality.classes.classes()  # type: ignore[union-attr]
    named = {frozenset(values[t] for t in members) for members in classes}
    return named, set(reasoner.view().base.facts())  # type: ignore[attr-defined]


def _check(got: set | tuple, want: set | tuple, step: str) -> None:
    if isinstance(got, tuple) and isinstance(want, tuple):  # (classes, normal forms)
        for part, mine, theirs in zip(("classes", "normal forms"), got, want, strict=True):
            _check(mine, theirs, f"{step}, {part}")
        return
    if got != want:
        print(
            f"MISMATCH at {step}: missing {sorted(want - got, key=repr)[:3]}, "
            f"extra {sorted(got - want, key=repr)[:3]}",
            file=sys.stderr,
        )
        raise SystemExit(1)


def _row(step: str, ours, bf, remat, scratch, axioms) -> tuple[str, ...]:
    """Print one step: seconds per side, and each other side's time over ours (the default);
    return the same as Markdown cells."""

    def cell(seconds) -> str:
        return "-" if seconds is None else f"{seconds:.3f}"

    def ratio(other) -> str:
        return "-" if other is None or ours is None else f"{other / ours:.1f}x"

    print(
        f"  {step:20} {cell(ours):>8} {cell(bf):>8} {cell(remat):>8} {cell(scratch):>8}"
        f" {cell(axioms):>11}   B/F~ {ratio(bf):>6}  remat~ {ratio(remat):>6}"
        f"  scratch {ratio(scratch):>6}  axiomatised {ratio(axioms):>7}"
    )
    times = [cell(seconds) for seconds in (ours, bf, remat, scratch, axioms)]
    return (step, *times, *(ratio(other) for other in (bf, remat, scratch, axioms)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    parser.add_argument("--largest", type=int, nargs="*", default=None, help="class sizes")
    parser.add_argument("--repeat", type=int, default=3, help="runs per cell (best kept)")
    parser.add_argument(
        "--axiomatised-up-to", type=int, default=200, help="largest class the axioms run for"
    )
    parser.add_argument(
        "--departments", type=int, default=150, help="university size (150: ~160k facts)"
    )
    parser.add_argument("--no-memory", action="store_true", help="skip the memory lines")
    parser.add_argument(
        "--axiomatised-seminaive",
        action="store_true",
        help="the axiomatised side with plain seminaive evaluation (no modules)",
    )
    add_markdown_option(parser)
    args = parser.parse_args(argv)
    departments = 4 if args.quick else args.departments
    sizes = args.largest or ([10, 40] if args.quick else [10, 100, 200, 500])
    print(
        "seconds per step, and each side's time over the default's; materialise: rewriting "
        "(first column) vs axiomatised"
    )
    print(
        f"  {'step':20} {'default':>8} {'B/F~':>8} {'remat~':>8} {'scratch':>8} {'axiomatised':>11}"
    )
    memory = memory_table()
    tables = [
        run(
            largest,
            args.repeat,
            args.axiomatised_up_to,
            departments,
            modules=not args.axiomatised_seminaive,
            memory=not args.no_memory,
            memory_table=memory,
        )
        for largest in sizes
    ]
    write_markdown(args.markdown, [*tables, memory])
    return 0


if __name__ == "__main__":
    sys.exit(main())
