"""The skewed graph patterns of the hypertree benchmark (``simulations.bench.hypertree_workloads``:
6-cycles, 4-cliques, petals, flowers and recursive cyclic rules over a graph with Zipf-like
endpoints and labels), small, against the reference evaluator: decompositions chosen by the
cost model, forced (set at a time, and as trees of nodes) and off, through fact updates (deletions
of hub edges included) and rule updates."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from agent.engine import Reasoner
from agent.engine.costs import CostPolicy
from agent.engine.program.parser import parse_program
from simulations.bench.hypertree_workloads import GRAPH_RULES, skewed_graph
from tests.engine.test_incremental_differential import assert_same, engine_facts
from tests.support.reference import evaluate, from_external

SIDES = {
    "chosen": {},
    "forced": {"decompositions": "always"},
    "forced trees": {
        "decompositions": "always",
        "costs": CostPolicy(decompositions_set_at_a_time=False),
    },
    # every update's heads through the changed facts' neighbourhoods, however large
    "forced narrowed": {
        "decompositions": "always",
        "costs": CostPolicy(elimination_recompute_growth=float("inf")),
    },
    "off": {"decompositions": False},
}
RULES = [
    f"r{i}: {line}"
    for i, line in enumerate(line for line in GRAPH_RULES.splitlines() if not line.startswith("#"))
    if line
]


def wanted(rules: list[str], facts: set[tuple]) -> set[tuple]:
    program = parse_program("\n".join(rules))
    return evaluate(program, [from_external(f) for f in facts]).external()


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 10_000), side=st.sampled_from(sorted(SIDES)))
def test_skewed_patterns_equal_the_reference_through_updates(seed: int, side: str) -> None:
    rng = random.Random(seed)
    facts = set(skewed_graph(nodes=16, edges=80, seed=seed))
    reasoner = Reasoner(**SIDES[side])
    reasoner.add_facts(sorted(facts))
    rules = list(RULES)
    reasoner.add_rules("\n".join(rules))
    assert_same(engine_facts(reasoner), wanted(rules, facts), f"{side}: materialised")

    # the busiest node loses a third of its edges, a few others too, and some come back
    degree: dict[str, int] = {}
    for _, s, o in facts:
        degree[s] = degree.get(s, 0) + 1
        degree[o] = degree.get(o, 0) + 1
    hub = max(sorted(degree), key=degree.__getitem__)
    gone = {f for f in sorted(facts) if hub in f[1:] and rng.random() < 0.33}
    gone |= set(rng.sample(sorted(facts - gone), 6))
    reasoner.delete_facts(sorted(gone))
    facts -= gone
    assert_same(engine_facts(reasoner), wanted(rules, facts), f"{side}: deleted")
    back = set(rng.sample(sorted(gone), len(gone) // 2))
    reasoner.add_facts(sorted(back))
    facts |= back
    assert_same(engine_facts(reasoner), wanted(rules, facts), f"{side}: added")

    # a rule deleted, then a recursive one with a cyclic body added
    dropped = rng.choice(rules)
    reasoner.delete_rules([dropped.split(":")[0]])
    rules.remove(dropped)
    assert_same(engine_facts(reasoner), wanted(rules, facts), f"{side}: rule deleted")
    extra = "tri(A, C) :- tri(A, B), l1(B, C), l0(C, A) ."
    reasoner.add_rules(extra)
    rules.append(extra)
    assert_same(engine_facts(reasoner), wanted(rules, facts), f"{side}: rule added")
