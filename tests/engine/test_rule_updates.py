"""Rule insertion and deletion on the paper's examples (ZodiacEdge Alg. 2-4, Fig. 3 and 5):
which hyper-nodes are directly impacted, the execution plan, the strategy each one gets, and
that the result always equals a from-scratch materialisation.
"""

from __future__ import annotations

import pytest

from agent.engine import Reasoner
from tests.engine.test_dependency import FIG1, R8

FIG1_FACTS = [
    ("e", "a", "b"),
    ("e", "b", "c"),
    ("e", "c", "a"),
    ("e", "c", "d"),
    ("e", "d", "e"),
    ("http://www.w3.org/1999/02/22-rdf-syntax-ns#type", "b", "p4"),
    ("p7", "b", "a"),
    ("p6", "a", "c"),
    ("p3", "c", "a"),
]

# Fig. 5's situation: r7 belongs to a recursive hyper-node that survives its deletion (same
# relations derived), followed by one successor.
FIG5 = """
r1: a(X, Y) :- e(X, Y) .
r5: b(X, Y) :- a(X, Y) .
r6: b(X, Z) :- b(X, Y) and b(Y, Z) .
r7: b(X, Y) :- b(Y, X) .
r8: <c>(X) :- b(X, Y) and not <d>(Y) .
"""
FIG5_FACTS = [("e", "a", "b"), ("e", "b", "c"), ("e", "c", "d"), ("e", "x", "y")]
FIG5_FACTS += [("http://www.w3.org/1999/02/22-rdf-syntax-ns#type", "a", "d")]


def rules_of(reasoner: Reasoner, names: list[str]) -> list[frozenset[str]]:
    by_name = {node.name: frozenset(r.id for r in node.rules) for node in reasoner.nodes}
    return [by_name[name] for name in names]


def fresh(reasoner: Reasoner) -> set:
    other = Reasoner()
    other.add_facts(reasoner.edb_facts())
    other.add_rules(list(reasoner.rules.values()))
    return set(other.facts())


def loaded(text: str, facts: list) -> Reasoner:
    reasoner = Reasoner()
    reasoner.add_rules(text)
    reasoner.add_facts(facts)
    return reasoner


def test_inserting_r8_merges_into_hn2_and_extends_it():
    reasoner = loaded(FIG1, FIG1_FACTS)
    report = reasoner.update(add_rules=R8)
    merged = frozenset({"r2", "r3", "r4", "r8"})
    assert rules_of(reasoner, report["directly_impacted"]) == [merged]
    plan = rules_of(reasoner, report["plan"])
    assert plan[0] == merged and set(plan[1:]) <= {frozenset({"r5"}), frozenset({"r6", "r7"})}
    node = report["directly_impacted"][0]
    assert report["hyper_nodes"][node]["strategy"] == "merge + extend"
    assert set(reasoner.facts()) == fresh(reasoner)


def test_deleting_r4_splits_hn2_and_recomputes_the_parts():
    reasoner = loaded(FIG1, FIG1_FACTS)
    report = reasoner.update(delete_rules=["r4"])
    assert sorted(rules_of(reasoner, report["directly_impacted"])) == sorted(
        [frozenset({"r2"}), frozenset({"r3"})]
    )
    plan = rules_of(reasoner, report["plan"])
    assert frozenset({"r6", "r7"}) in plan and frozenset({"r5"}) in plan
    assert plan.index(frozenset({"r5"})) < plan.index(frozenset({"r6", "r7"}))
    assert set(reasoner.facts()) == fresh(reasoner)


def test_deleting_r7_in_fig5_impacts_hn2_only_and_plans_hn2_then_hn3():
    reasoner = loaded(FIG5, FIG5_FACTS)
    report = reasoner.update(delete_rules=["r7"])
    assert rules_of(reasoner, report["directly_impacted"]) == [frozenset({"r6"})]
    assert rules_of(reasoner, report["plan"]) == [frozenset({"r6"}), frozenset({"r8"})]
    strategy = report["hyper_nodes"][report["directly_impacted"][0]]["strategy"]
    assert strategy.startswith("rule deletion")
    assert set(reasoner.facts()) == fresh(reasoner)


def test_deleting_r5_r6_r7_drops_hn3_and_hn4_without_reasoning():
    reasoner = loaded(FIG1, FIG1_FACTS)
    hn3_hn4 = {n.name for n in reasoner.nodes if {r.id for r in n.rules} & {"r5", "r6", "r7"}}
    report = reasoner.update(delete_rules=["r5", "r6", "r7"])
    assert set(report["dropped"]) == hn3_hn4
    assert report["plan"] == [] and report["hyper_nodes"] == {}
    assert set(reasoner.facts()) == fresh(reasoner)


def test_leaf_rule_insertion_and_deletion_touch_only_the_leaf():
    reasoner = loaded(FIG1, FIG1_FACTS)
    report = reasoner.update(add_rules="leaf: q(X) :- p6(X, Y) .")
    assert rules_of(reasoner, report["plan"]) == [frozenset({"leaf"})]
    report = reasoner.update(delete_rules=["leaf"])
    assert report["plan"] == [] and len(report["dropped"]) == 1
    assert set(reasoner.facts()) == fresh(reasoner)


def test_mixed_update_in_one_pass_equals_from_scratch():
    reasoner = loaded(FIG1, FIG1_FACTS)
    report = reasoner.update(
        add_rules=R8 + "\nextra: p1(X, Y) :- p3(Y, X) .",
        delete_rules=["r6"],
        add_facts=[("e", "e", "a"), ("p3", "d", "b")],
        delete_facts=[("e", "c", "a"), ("p7", "b", "a")],
    )
    assert report["rules_added"] == ["r8", "extra"] and report["rules_deleted"] == ["r6"]
    assert report["facts_added"] == 2 and report["facts_deleted"] == 2
    assert set(reasoner.facts()) == fresh(reasoner)


def test_fact_updates_are_incremental_and_reported():
    reasoner = loaded(FIG5, FIG5_FACTS)
    report = reasoner.update(delete_facts=[("e", "b", "c")], add_facts=[("e", "d", "x")])
    strategies = {entry["strategy"].split(" (")[0] for entry in report["hyper_nodes"].values()}
    known = {"DRed^c", "recompute", "groups", "closure", "renaming", "composition"}
    assert strategies and strategies <= known
    assert all(entry["seconds"] >= 0 for entry in report["hyper_nodes"].values())
    assert reasoner.stats()["last_update"] == report
    assert set(reasoner.facts()) == fresh(reasoner)


def test_no_op_fact_changes_are_reported_not_errors():
    reasoner = loaded(FIG5, FIG5_FACTS)
    before = set(reasoner.facts())
    report = reasoner.update(add_facts=[("e", "a", "b")], delete_facts=[("b", "a", "b")])
    assert report["facts_added"] == 0 and report["facts_deleted"] == 0
    assert report["facts_ignored"] == 2 and report["plan"] == []
    assert set(reasoner.facts()) == before


def test_deleting_a_rule_that_splits_a_cycle_leaves_no_stale_facts():
    """Regression: deleting ``p14 :- p13`` from the p13/p14 cycle once left ``p13(w1, w0)``
    (derived from the now underived p14) in the reduced hyper-node's reused store."""
    reasoner = Reasoner()
    reasoner.add_rules("a: p14(X, Y) :- p13(X, Y) .\nb: p13(X, Y) :- p14(Y, X) .")
    reasoner.add_facts([("p13", "w0", "w1")])
    assert ("p13", "w1", "w0") in set(reasoner.facts())
    reasoner.delete_rules(["a"])
    assert set(reasoner.facts()) == {("p13", "w0", "w1")}
    assert set(reasoner.facts()) == fresh(reasoner)


def test_a_join_whose_inputs_are_mostly_new_is_recomputed_and_stays_exact():
    """Seminaive would evaluate the join once per changed atom, each over most of the data:
    the driver recomputes it instead, says so, and the result equals a fresh reasoner's. (The
    comparison keeps the rule seminaive: a bare composition goes to the composition module,
    which applies any change a subject at a time.)"""
    rules = "j: <p>(X, Z) :- <a>(X, Y) and <b>(Y, Z) and COMP(X, !=, Z) ."
    old = [("a", i, i + 1) for i in range(10)] + [("b", i, i + 2) for i in range(10)]
    new = [("a", i, i + 1) for i in range(10, 40)] + [("b", i, i + 2) for i in range(10, 40)]
    reasoner = Reasoner()
    reasoner.add_facts(old)
    reasoner.add_rules(rules)
    reasoner.add_facts(new)
    strategies = [n["strategy"] for n in reasoner.stats()["last_update"]["hyper_nodes"].values()]
    assert any(s.startswith("recompute (inputs of its joins grew by") for s in strategies)
    fresh = Reasoner()
    fresh.add_facts(old + new)
    fresh.add_rules(rules)
    assert set(reasoner.facts()) == set(fresh.facts())

    # A small insertion into the same join is maintained seminaively.
    reasoner.add_facts([("a", 100, 101), ("b", 101, 7)])
    strategies = [n["strategy"] for n in reasoner.stats()["last_update"]["hyper_nodes"].values()]
    assert strategies == ["DRed^c"]
    assert ("p", 100, 7) in set(reasoner.facts("p"))


@pytest.mark.parametrize("by_subject", [True, False])
def test_an_aggregate_reads_only_touched_groups_unless_most_are_touched(by_subject):
    """Groups read a subject at a time (subject_groups.py) keep their partition across
    changes of ``p`` and ``w`` and read only the groups a change reaches; other aggregates
    (here: ``w`` has three columns) recompute only touched groups, and the whole aggregate
    when most are touched."""
    w = "w(Y, V)" if by_subject else "w(Y, V, U)"
    extra = () if by_subject else ("u",)
    reasoner = loaded(
        f"n(X, N) :- aggregate( p(X, Y) and {w} ) on X with sum(V) as N .",
        [("p", f"g{g}", f"y{g}_{i}") for g in range(10) for i in range(3)]
        + [("w", f"y{g}_{i}", g + i, *extra) for g in range(10) for i in range(3)],
    )

    def aggregate_strategy(report: dict) -> str:
        (entry,) = report["hyper_nodes"].values()
        return entry["strategy"]

    # One group of ten touched: only it is evaluated again.
    report = reasoner.update(add_facts=[("p", "g0", "y1_0")])
    assert aggregate_strategy(report) == ("groups (partition kept)" if by_subject else "groups")
    assert set(reasoner.facts()) == fresh(reasoner)
    # A value read by most groups: the whole aggregate is evaluated once instead.
    shared = [("p", f"g{g}", "hub") for g in range(8)] + [("w", "hub", 100, *extra)]
    report = reasoner.update(add_facts=shared)
    if by_subject:
        assert aggregate_strategy(report) == "groups (partition kept)"
    else:
        assert aggregate_strategy(report) == "recompute (8 of 10 groups touched)"
    assert set(reasoner.facts()) == fresh(reasoner)
    # And the groups path stays exact after the group bookkeeping was rebuilt.
    report = reasoner.update(delete_facts=[("w", "y3_1", 4, *extra)])
    expected = "groups (partition kept)" if by_subject else "groups"
    assert aggregate_strategy(report) == expected
    assert set(reasoner.facts()) == fresh(reasoner)
