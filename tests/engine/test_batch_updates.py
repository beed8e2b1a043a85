"""Large batch updates, through the agent's SQLite state (#20).

The other differential tests change a few facts per update; storage by subject changes its
representation when whole subjects or most of a relation go at once (a subject's set emptied
and dropped, a relation kept as its subject index losing most of it). Here every update is one
large batch, applied through ``AgentState`` in one transaction:

* 10-90% of one relation's explicit facts deleted, or inserted back together with new ones;
* every explicit fact of one subject deleted (a node leaving the graph), or inserted back;
* every explicit binary fact inside one connected component deleted (a part of the farm gone);
* half the explicit facts deleted and others inserted in the same update, with a labelled rule
  replaced under its label.

After every step the file is closed and reopened (no recomputation: the saved derived facts are
loaded) and the loaded model must equal the reference evaluator's, fact for fact; the next step
is applied to the reopened state.
"""

from __future__ import annotations

from collections import defaultdict

import pytest
from hypothesis import event, given, note, settings
from hypothesis import strategies as st

from agent.engine.language import Program, Rule
from agent.engine.program.parser import parse_program
from agent.state.agent_state import AgentState
from tests.agent.test_persistence import STEP_SETTINGS, model_after
from tests.engine.test_incremental_differential import assert_same, engine_facts
from tests.support.reference import evaluate
from tests.support.strategies import closure_pools, incremental_programs, labelled, pool_facts

SETTINGS = settings(STEP_SETTINGS, max_examples=max(1, settings.default.max_examples // 3))
KINDS = ("fraction", "subject", "component", "reinsert", "mixed")


def components(facts: set[tuple]) -> list[set[object]]:
    """The connected components of the graph whose edges are the binary facts' arguments."""
    parent: dict[object, object] = {}

    def root(node: object) -> object:
        while parent.setdefault(node, node) != node:
            parent[node] = parent[parent[node]]
            node = parent[node]
        return node

    for fact in facts:
        if len(fact) == 3:
            parent[root(fact[1])] = root(fact[2])
    groups: dict[object, set[object]] = defaultdict(set)
    for node in list(parent):
        groups[root(node)].add(node)
    return sorted(groups.values(), key=lambda group: sorted(map(repr, group)))


def draw_batch(data, kind: str, facts: set[tuple], deleted: set[tuple], pool: Program) -> dict:
    """One large batch of the given kind: {"delete_facts": [...], "add_facts": [...]}."""
    ordered = sorted(facts, key=repr)
    if kind == "fraction" and ordered:
        relations = sorted({fact[0] for fact in ordered})
        relation = data.draw(st.sampled_from(relations))
        share = data.draw(st.integers(1, 9)) / 10
        members = [fact for fact in ordered if fact[0] == relation]
        chosen = data.draw(st.permutations(members))[: max(1, round(share * len(members)))]
        return {"delete_facts": chosen}
    if kind == "subject" and ordered:
        subject = data.draw(st.sampled_from(sorted({fact[1] for fact in ordered}, key=repr)))
        return {"delete_facts": [fact for fact in ordered if fact[1] == subject]}
    if kind == "component" and components(facts):
        group = data.draw(st.sampled_from(components(facts)))
        return {
            "delete_facts": [
                fact for fact in ordered if len(fact) == 3 and {fact[1], fact[2]} <= group
            ]
        }
    new = data.draw(st.lists(pool_facts(pool), min_size=5, max_size=30))
    if kind == "reinsert":
        back = [fact for fact in sorted(deleted, key=repr) if data.draw(st.booleans())]
        return {"add_facts": back + new}
    half = [fact for fact in ordered if data.draw(st.booleans())]
    return {"delete_facts": half, "add_facts": new}


def replacement(data, rules: dict[str, Rule], pool: Program) -> tuple[list[str], list[Rule]]:
    """A labelled rule replaced under its label by another body from the pool, or nothing."""
    labelled_now = sorted(name for name in rules if rules[name].label)
    if not labelled_now:
        return [], []
    name = data.draw(st.sampled_from(labelled_now))
    bodies = [r for r in pool.rules if r.key != rules[name].key]
    if not bodies:
        return [], []
    body = data.draw(st.sampled_from(bodies))
    return [name], [Rule(body.head, body.body, rules[name].label)]


@pytest.mark.parametrize("pools", ["incremental", "closure"])
@SETTINGS
@given(data=st.data())
def test_large_batches_through_the_saved_state_equal_the_reference(tmp_path_factory, pools, data):
    path = tmp_path_factory.mktemp("state") / "agent.db"
    drawn = data.draw(
        labelled(incremental_programs() if pools == "incremental" else closure_pools())
    )
    # Rules reach the agent as text: use the parsed form (hand-built ``_`` variables differ).
    pool = Program(rules=tuple(parse_program(str(rule)).rules[0] for rule in drawn.rules))
    # (a labelled pool has several bodies per label: the agent holds one per label at a time)
    first = list({r.id: r for r in pool.rules if data.draw(st.integers(0, 3)) > 0}.values())
    facts = set(data.draw(st.lists(pool_facts(pool), min_size=20, max_size=80)))
    state = AgentState(path)
    state.apply(add_rules=first, add_facts=sorted(facts, key=repr))
    rules = {rule.id: rule for rule in first}
    deleted: set[tuple] = set()
    for step in range(6):
        kind = data.draw(st.sampled_from(KINDS))
        batch = draw_batch(data, kind, facts, deleted, pool)
        if kind == "mixed":
            batch["delete_rules"], batch["add_rules"] = replacement(data, rules, pool)
        note(f"step {step}: {kind} {batch}")
        event(f"{kind}{' replaced' if batch.get('add_rules') else ''}")
        event(f"deleted {min(len(batch.get('delete_facts', ())) // 10 * 10, 50)}+")
        state.apply(**batch)
        facts = model_after(batch, rules, facts)
        deleted = (deleted | set(batch.get("delete_facts", ()))) - facts
        state.close()
        state = AgentState(path)
        assert state.load_report.how == "loaded"
        program = Program(tuple({rule.key: rule for rule in rules.values()}.values()))
        wanted = evaluate(program, facts).external()
        assert_same(engine_facts(state.reasoner), wanted, f"step {step} ({kind}), reopened")
    state.close()
