"""Golden tests: every folder under tests/golden is a program, its input facts and the expected
materialisation (see tests/golden/make_golden.py for where the expectations come from).

Every folder runs through each way of evaluating a program, as Soufflé runs its tests through
both of its back-ends: the engine with its modules (closures, renaming, composition...),
without them (plain seminaive) and with every cyclic rule through a hypertree decomposition,
rules before facts and after, and the Spark job.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pytest

from agent.engine import RDF_TYPE, Reasoner
from agent.engine.program.rdf import read_facts

GOLDEN = Path(__file__).resolve().parents[2] / "tests" / "golden"
CASES = sorted(p.name for p in GOLDEN.iterdir() if (p / "program.rules").exists())


def by_predicate(facts) -> dict[str, set]:
    grouped: dict[str, set] = defaultdict(set)
    for fact in facts:
        name = f"{fact[0]} {fact[2]}" if fact[0] == RDF_TYPE else fact[0]
        grouped[name].add(fact)
    return grouped


ENGINES = {
    "modules": {},  # closures, renaming, ..., decompositions where estimated cheaper
    "seminaive": {"modules": False},
    "decompositions": {"decompositions": "always"},  # every cyclic rule decomposed
}


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("engine", sorted(ENGINES))
@pytest.mark.parametrize("rules_first", [True, False], ids=["rules-first", "facts-first"])
def test_golden_case(case: str, engine: str, rules_first: bool) -> None:
    folder = GOLDEN / case
    reasoner = Reasoner(**ENGINES[engine])
    if rules_first:
        reasoner.add_rules(folder / "program.rules")
        reasoner.add_facts(folder / "facts.nt")
    else:
        reasoner.add_facts(folder / "facts.nt")
        reasoner.add_rules(folder / "program.rules")
    assert_expected(case, reasoner.facts())


# The Exp rules are recursive nine-atom joins: every round of their stratum is some thirty
# Spark joins (a delta per body atom), about four minutes in Spark jobs. The Spark job runs them
# on the driver here; its own joins meet several heads, cyclic bodies and skolem IRIs in
# ``multihead_skolem`` (one round).
DRIVER_ONLY = {"expressions_multihead"}
SPARK_MODES = [(0, "spark"), (40, "mixed"), (None, "driver")]


@pytest.mark.parametrize(
    "case, local_below",
    [
        pytest.param(case, below, id=f"{case}-{name}")
        for case in CASES
        for below, name in SPARK_MODES
        if case not in DRIVER_ONLY or name == "driver"
    ],
)
def test_golden_case_through_spark(case: str, local_below: int | None, spark) -> None:
    """Every hyper-node in Spark jobs; the small ones on the driver (``local_below=40``: a
    mix in one run); every one on the driver (the default threshold, for these sizes)."""
    from cloud.spark.materialise import materialise_paths

    folder = GOLDEN / case
    options = {} if local_below is None else {"local_below": local_below}
    result = materialise_paths(spark, folder / "program.rules", [folder / "facts.nt"], **options)
    assert_expected(case, result.facts())
    modules = [report.module for report in result.reports]
    if local_below == 0:
        assert "driver" not in modules
    elif local_below is None:
        assert set(modules) == {"driver"}
    # One Spark stratum per hyper-node of the engine.
    reasoner = Reasoner()
    reasoner.add_rules(folder / "program.rules")
    reasoner.add_facts(folder / "facts.nt")
    assert len(result.reports) == len(reasoner.stats()["hyper_nodes"])


def assert_expected(case: str, facts) -> None:
    expected = by_predicate(read_facts(GOLDEN / case / "expected.nt"))
    actual = by_predicate(facts)
    for predicate in sorted(set(expected) | set(actual)):
        missing = expected.get(predicate, set()) - actual.get(predicate, set())
        extra = actual.get(predicate, set()) - expected.get(predicate, set())
        assert not missing and not extra, (
            f"{case}: predicate {predicate}: missing {sorted(missing, key=repr)[:5]}, "
            f"unexpected {sorted(extra, key=repr)[:5]}"
        )


def test_golden_cases_exist() -> None:
    assert {"rs1_ds1_12", "rs2_ds2_8", "rs3_ds2_8", "fig1_running_example"} <= set(CASES)
    assert set(CASES) >= DRIVER_ONLY
