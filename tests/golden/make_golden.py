"""Regenerate the golden cases' ``expected.nt`` with the reference evaluator.

    python -m tests.golden.make_golden

Each case folder holds ``program.rules``, ``facts.nt`` (input) and ``expected.nt`` (every fact
of the materialisation, explicit and derived, sorted). The expected files were produced by
``tests/support/reference.py`` (the naive oracle, independent of the engine) and their sizes checked
against the hand-derived formulas of ``simulations/bench/datasets.py``; they are committed so
that a change in the reference is a visible diff too. ``cases()`` also (re)writes the inputs of
the generated cases (Rule Sets 1-3 over small DS1/DS2). A case using owl:sameAs is evaluated with
equality axiomatised as rules (``evaluate(..., equality=True)``).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from agent.engine.program.parser import parse_file
from agent.engine.program.rdf import read_facts, write_ntriples
from simulations.bench.datasets import ds1, ds2
from tests.support.reference import evaluate, from_external, to_external

HERE = Path(__file__).parent
BENCHMARKS = HERE.parents[1] / "rules" / "benchmarks"

GENERATED = {
    "rs1_ds1_12": ("rs1.rules", lambda: ds1(12)),
    "rs2_ds2_8": ("rs2.rules", lambda: ds2(8)),
    "rs3_ds2_8": ("rs3.rules", lambda: ds2(8)),
}


def write_inputs() -> None:
    for name, (rules, facts) in GENERATED.items():
        folder = HERE / name
        folder.mkdir(exist_ok=True)
        shutil.copy(BENCHMARKS / rules, folder / "program.rules")
        with open(folder / "facts.nt", "w", encoding="utf-8") as out:
            write_ntriples(sorted(facts(), key=repr), out)


def cases() -> list[Path]:
    return sorted(p for p in HERE.iterdir() if (p / "program.rules").exists())


def regenerate(folder: Path) -> int:
    program = parse_file(folder / "program.rules")
    facts = [from_external(f) for f in read_facts(folder / "facts.nt")]
    facts += [(a.predicate, *(t.value for t in a.terms)) for a in program.facts]
    same_as = "http://www.w3.org/2002/07/owl#sameAs"
    equality = "owl:sameAs" in str(program) or any(f[0] == same_as for f in facts)
    result = evaluate(program, facts, equality=equality)  # owl:sameAs axiomatised (reference)
    expected = sorted((to_external(f) for f in result.facts), key=repr)
    with open(folder / "expected.nt", "w", encoding="utf-8") as out:
        return write_ntriples(expected, out)


def main() -> None:
    write_inputs()
    for folder in cases():
        print(f"{folder.name}: {regenerate(folder)} facts")


if __name__ == "__main__":
    main()
