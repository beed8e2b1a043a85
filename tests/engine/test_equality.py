"""owl:sameAs by rewriting (agent/engine/equality/layer.py): the expanded model equals equality
axiomatised as plain rules (tests/support/reference.py) after every update of random sequences of
fact and rule insertions and deletions, through B/F~, through rematerialisation and through the
default choice; the paper's worked example; clashes; and refused programs change nothing."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from agent.engine import Budget, BudgetExceeded, Reasoner, StratificationError
from agent.engine.costs import DEFAULT_COSTS
from agent.engine.equality.bf import BackwardForward
from agent.engine.equality.facts import PatternRule
from agent.engine.equality.rewriting import EqualityComponent
from agent.engine.language import Program
from agent.engine.program.parser import parse_program
from agent.engine.terms import TermDictionary
from agent.state.agent_state import AgentState
from tests.support.old_states import (
    derived_by_prefix,
    facts_per_claim,
    rules_without_forms,
    terms_per_row,
)
from tests.support.reference import OWL_SAME_AS, evaluate, from_external

PREFIX = "@prefix owl: <http://www.w3.org/2002/07/owl#> .\n"

# Rules deciding equality (positive), rules above it (negation, aggregates, comparisons,
# binds, constants that get merged, owl:sameAs read), and rules refused while equality depends
# on them. Labels as the cloud sends them: "key" has two bodies that replace each other.
POOL = [
    "key: owl:sameAs(X, Y) :- key(X, S), key(Y, S) .",
    "key: owl:sameAs(X, Y) :- key(X, S), key(Y, S), node(X) .",
    "owl:sameAs(Y, Z) :- fn(X, Y), fn(X, Z) .",
    "alias: owl:sameAs(X, <a>) :- alias(X) .",
    "owl:sameAs(X, Y) :- link(X, Y), link(Y, X) .",
    "chain: link(X, Z) :- link(X, Y), link(Y, Z) .",
    "key(X, S) :- code(X, S) .",
    "lonely: lonely(X) :- node(X), not link(X, Z) .",
    "degree(X, N) :- aggregate( link(X, Y) ) on X with count(Y) as N .",
    "total(X, T) :- aggregate( link(X, Y) and val(Y, V) ) on X with sum(V) as T .",
    "distinct(X, Y) :- link(X, Y), X != Y .",
    "plus(X, V) :- val(X, N), bind(N + 1 as V) .",
    "big(X) :- val(X, N), N > 1 .",
    "pair(X, Y) :- owl:sameAs(X, Y), node(X) .",
    "fromA(X) :- link(<a>, X) .",
    "hasB(X) :- link(X, <b>), node(<c>) .",
    "apart(X, Y) :- node(X), node(Y), not owl:sameAs(X, Y) .",
    "reach(X, Y) :- link(X, Y) .",
    "reach(X, Z) :- reach(X, Y), link(Y, Z) .",
    # Refused whenever equality depends on them (and the reference agrees):
    "owl:sameAs(X, Y) :- key(X, S), key(Y, S), X != Y .",
    "key(X, S) :- code(X, S), not alias(X) .",
]
NAMES = ["a", "b", "c", "d", "e"]
RDF = "http://www.w3.org/1999/02/22-rdf-syntax-ns#type"
FACTS = st.one_of(
    st.tuples(st.just("key"), st.sampled_from(NAMES), st.sampled_from(["s1", "s2"])),
    st.tuples(st.just("code"), st.sampled_from(NAMES), st.sampled_from(["s1", "s2"])),
    st.tuples(st.just("fn"), st.sampled_from(NAMES), st.sampled_from(NAMES)),
    st.tuples(st.just("link"), st.sampled_from(NAMES), st.sampled_from(NAMES)),
    st.tuples(st.just(OWL_SAME_AS), st.sampled_from(NAMES), st.sampled_from(NAMES)),
    st.tuples(st.just(OWL_SAME_AS), st.sampled_from(NAMES), st.sampled_from([1, 2])),
    st.tuples(st.just("val"), st.sampled_from(NAMES), st.sampled_from([1, 2, 3])),
    st.tuples(st.just(RDF), st.sampled_from(NAMES), st.sampled_from(["node", "alias"])),
)
OPERATIONS = st.one_of(
    st.tuples(st.just("add facts"), st.lists(FACTS, min_size=1, max_size=4)),
    st.tuples(st.just("delete facts"), st.lists(st.integers(0, 50), min_size=1, max_size=4)),
    st.tuples(st.just("add rule"), st.integers(0, len(POOL) - 1)),
    st.tuples(st.just("delete rule"), st.integers(0, 50), st.booleans()),
    # a mixed change the engine refuses (over budget): the layer must undo its part
    st.tuples(
        st.just("refused"),
        st.lists(FACTS, max_size=4),
        st.lists(st.integers(0, 50), max_size=3),
    ),
)

MODES = {
    "bf": replace(DEFAULT_COSTS, equality_rematerialise_share=10.0, equality_key_closure=False),
    "remat": replace(DEFAULT_COSTS, equality_rematerialise_share=0.0),
    "default": DEFAULT_COSTS,
}


def parse_rule(text: str):
    return parse_program(PREFIX + text).rules[0]


def expected(reasoner: Reasoner, explicit: set[tuple]) -> set[tuple]:
    rules = tuple(reasoner.rules.values())
    facts = [from_external(fact) for fact in explicit]
    return evaluate(Program(rules=rules), facts, equality=True).external()


def check(reasoner: Reasoner, explicit: set[tuple]) -> None:
    got = set(reasoner.facts())
    want = expected(reasoner, explicit)
    assert got == want, (
        f"missing {sorted(want - got, key=repr)[:6]}, extra {sorted(got - want, key=repr)[:6]}"
    )
    assert reasoner.count() == len(want)
    fresh = Reasoner()
    fresh.update(add_rules=list(reasoner.rules.values()), add_facts=sorted(explicit, key=repr))
    assert set(fresh.facts()) == got
    assert clashes(reasoner) == clashes(fresh)  # (kept per class, updated incrementally)
    assert representatives(reasoner) == representatives(fresh)  # (the order's smallest)


def representatives(reasoner: Reasoner) -> dict:
    """Each merged name's representative, as values (term ids differ between reasoners)."""
    if reasoner.equality is None:
        return {}
    values = reasoner.terms.values
    return {values[t]: values[r] for t, r in reasoner.equality.classes.rep.items() if t != r}


def clashes(reasoner: Reasoner) -> list:
    return reasoner.equality.clashes() if reasoner.equality is not None else []


@pytest.mark.parametrize("mode", sorted(MODES))
@settings(max_examples=60)
@given(operations=st.lists(OPERATIONS, min_size=1, max_size=8))
def test_expanded_model_equals_axiomatised_equality(mode, operations):
    reasoner = Reasoner(costs=MODES[mode])
    run_operations(operations, lambda: reasoner, reasoner.update)


@settings(max_examples=40)
@given(
    operations=st.lists(OPERATIONS, min_size=1, max_size=8),
    reopen=st.lists(st.booleans(), min_size=8, max_size=8),
)
def test_saved_state_restored_between_steps(tmp_path_factory, operations, reopen):
    """The same through the agent's SQLite state, closed and reopened between steps: a reopened
    state is loaded, never recomputed, and maintains equality on from there."""
    path = tmp_path_factory.mktemp("equality") / "agent.db"
    state = AgentState(path)
    steps = iter(reopen)

    def current() -> Reasoner:
        return state.reasoner

    def update(budget=None, **change):
        nonlocal state
        state.reasoner.budget = budget  # (the state's limit for every change; here one)
        try:
            report = state.apply(**change)
        finally:
            state.reasoner.budget = None
        if next(steps, False):
            state.close()
            state = AgentState(path)
            assert state.load_report.how == "loaded", state.load_report
        return report

    try:
        run_operations(operations, current, update)
    finally:
        state.close()


def run_operations(operations, reasoner_now, update) -> None:
    """Apply ``operations`` through ``update`` (Reasoner.update or AgentState.apply) and
    compare the reasoner with the reference after each."""
    explicit: set[tuple] = set()
    for operation in operations:
        reasoner = reasoner_now()
        kind = operation[0]
        if kind == "add facts":
            update(add_facts=operation[1])
            explicit |= set(operation[1])
        elif kind == "delete facts":
            present = sorted(explicit, key=repr)
            chosen = {present[i % len(present)] for i in operation[1]} if present else set()
            update(delete_facts=sorted(chosen, key=repr))
            explicit -= chosen
        elif kind == "add rule":
            rule = parse_rule(POOL[operation[1]])
            if rule.label in reasoner.rules and reasoner.rules[rule.label].key == rule.key:
                continue
            change: dict = {"add_rules": [rule]}
            kept = list(reasoner.rules.values())
            if rule.label in reasoner.rules:  # replaced under its label, in one update
                change["delete_rules"] = [rule.label]
                kept = [r for name, r in reasoner.rules.items() if name != rule.label]
            try:
                program = Program(rules=(*kept, rule))
                evaluate(program, [from_external(f) for f in explicit], equality=True)
                accepted = True
            except ValueError:
                accepted = False
            if accepted:
                update(**change)
            else:
                before = set(reasoner.facts())
                with pytest.raises(StratificationError):
                    update(**change)
                assert set(reasoner_now().facts()) == before
        elif kind == "refused":
            present = sorted(explicit, key=repr)
            chosen = {present[i % len(present)] for i in operation[2]} if present else set()
            before = set(reasoner.facts())
            try:
                update(
                    add_facts=operation[1],
                    delete_facts=sorted(chosen, key=repr),
                    budget=Budget(max_seconds=1e-9),
                )
            except BudgetExceeded:
                assert set(reasoner_now().facts()) == before
            else:  # (it derived too little to be refused)
                explicit = (explicit - chosen) | set(operation[1])
        else:
            names = sorted(reasoner.rules)
            if not names:
                continue
            name = names[operation[1] % len(names)]
            by_text = operation[2]
            update(delete_rules=[str(reasoner.rules[name]) if by_text else name])
        check(reasoner_now(), explicit)


def test_the_papers_example():
    """Section 3.1: R is bijective, so a = c and b = d until <a, R, d> is deleted; then the
    store *gains* facts (the split classes' own facts) and pi becomes the identity."""
    rules = parse_program(
        PREFIX + "owl:sameAs(Y1, Y2) :- <R>(Y1, X), <R>(Y2, X) .\n"
        "owl:sameAs(Y1, Y2) :- <R>(X, Y1), <R>(X, Y2) ."
    ).rules
    terms = TermDictionary()
    a, b, c, d = (terms.encode(name) for name in "abcd")
    component = EqualityComponent(terms)
    component.set_rules(rules)
    r = ("R", 2)
    facts = [(r, (a, b)), (r, (c, d)), (r, (a, d))]
    for fact in facts:
        component.explicit.add(fact)
    component.insert(facts)
    same = ("http://www.w3.org/2002/07/owl#sameAs", 2)
    assert set(component.store) == {(r, (a, b)), (same, (a, a)), (same, (b, b))}
    assert component.classes.find(c) == a and component.classes.find(d) == b

    component.start_log()
    run = BackwardForward(component)
    component.explicit.discard((r, (a, d)))
    run.run([(r, (a, d))])
    assert set(component.store) == {
        (r, (a, b)),
        (r, (c, d)),
        *((same, (t, t)) for t in (a, b, c, d)),
    }
    assert all(component.classes.find(t) == t for t in (a, b, c, d))
    entered = {key: rows for key, rows in component.entered.items() if rows}
    assert entered == {r: {(c, d)}, same: {(c, c), (d, d)}}
    assert not any(component.left.values())
    assert component.changed_terms == {c, d}


def test_the_papers_example_through_the_reasoner_both_ways():
    for mode in MODES.values():
        reasoner = Reasoner(costs=mode)
        reasoner.add_rules(
            PREFIX + "owl:sameAs(Y1, Y2) :- <R>(Y1, X), <R>(Y2, X) .\n"
            "owl:sameAs(Y1, Y2) :- <R>(X, Y1), <R>(X, Y2) ."
        )
        reasoner.add_facts([("R", "a", "b"), ("R", "c", "d"), ("R", "a", "d")])
        assert ("R", "c", "b") in set(reasoner.facts())
        assert reasoner.stats()["equality"]["largest_class"] == 2
        reasoner.delete_facts([("R", "a", "d")])
        assert set(reasoner.facts("R")) == {("R", "a", "b"), ("R", "c", "d")}
        assert reasoner.stats()["equality"]["classes"] == 0


def test_two_numbers_made_equal_are_a_clash_reported_not_an_error():
    reasoner = Reasoner()
    report = reasoner.update(
        add_facts=[(OWL_SAME_AS, "t1", 3), (OWL_SAME_AS, "t1", 5), ("reading", "t1", 7)]
    )
    assert report["equality"]["clashes"] == [[3, 5]]
    assert reasoner.stats()["equality"]["clashes"] == [[3, 5]]
    reasoner.delete_facts([(OWL_SAME_AS, "t1", 5)])
    assert reasoner.stats()["equality"]["clashes"] == []
    assert reasoner.stats()["last_update"]["equality"]["clashes"] == []


def test_a_refused_rule_changes_nothing():
    reasoner = Reasoner()
    reasoner.add_rules(PREFIX + "owl:sameAs(X, Y) :- key(X, S), key(Y, S) .")
    reasoner.add_facts([("key", "a", "s"), ("key", "b", "s")])
    before = set(reasoner.facts())
    with pytest.raises(StratificationError, match="cannot take part in deciding"):
        reasoner.add_rules("key(X, S) :- code(X, S), not blocked(X) .")
    with pytest.raises(StratificationError, match="cannot take part in deciding"):
        reasoner.add_rules(PREFIX + "owl:sameAs(X, Y) :- code(X, S), code(Y, S), X != Y .")
    assert set(reasoner.facts()) == before
    assert len(reasoner.rules) == 1


def test_a_refused_rule_leaves_the_last_updates_equalities_in_place():
    """An update refused before the layer planned anything must not undo the update before
    it (the undo of a refused update once replayed the previous update's log: the component
    lost owl:sameAs(a, a), the engine kept it, and the next merge left a stale copy)."""
    reasoner = Reasoner(costs=MODES["bf"])
    reasoner.add_facts([(OWL_SAME_AS, "a", "a")])
    with pytest.raises(StratificationError):
        reasoner.add_rules(PREFIX + "owl:sameAs(X, Y) :- key(X, S), key(Y, S), X != Y .")
    reasoner.add_facts([(OWL_SAME_AS, "a", 1)])
    check(reasoner, {(OWL_SAME_AS, "a", "a"), (OWL_SAME_AS, "a", 1)})


def test_queries_and_counts_see_every_name():
    reasoner = Reasoner()
    reasoner.add_facts([(OWL_SAME_AS, "scada:T7", "registry:WT-007"), ("temp", "scada:T7", 31)])
    answers = reasoner.query("temp(<registry:WT-007>, T)")
    assert answers == [{"T": 31}]
    assert {a["X"] for a in reasoner.query("temp(X, 31)")} == {"scada:T7", "registry:WT-007"}
    assert reasoner.count() == 4 + 2
    assert sorted(reasoner.edb_facts()) == sorted(
        [(OWL_SAME_AS, "scada:T7", "registry:WT-007"), ("temp", "scada:T7", 31)]
    )


def test_a_state_saved_before_equality_was_rewriting_is_recomputed_once(tmp_path):
    """A schema-4 state holding owl:sameAs facts: its derived facts were computed without
    equality, so its first start recomputes (and saves the representatives), the next loads."""
    import sqlite3

    path = tmp_path / "agent.db"
    with AgentState(path) as state:
        state.apply(
            add_rules="seen(X) :- temp(X, T) .",
            add_facts=[(OWL_SAME_AS, "scada:T7", "registry:WT-007"), ("temp", "scada:T7", 31)],
        )
        want = set(state.reasoner.facts())
    conn = sqlite3.connect(path)
    with conn:
        conn.execute("DROP TABLE representatives")
        row = conn.execute("SELECT id FROM nodes WHERE module = 'equality'").fetchone()[0]
        conn.execute("DELETE FROM derived WHERE node = ?", (row,))
        conn.execute("DELETE FROM nodes WHERE id = ?", (row,))
        derived_by_prefix(conn)
        facts_per_claim(conn)
        rules_without_forms(conn)
        terms_per_row(conn)
        conn.execute("UPDATE meta SET value = '4' WHERE key = 'schema_version'")
    conn.close()
    with AgentState(path) as state:
        assert state.load_report.how.startswith("recomputed"), state.load_report
        assert set(state.reasoner.facts()) == want
    with AgentState(path) as state:
        assert state.load_report.how == "loaded"
        assert set(state.reasoner.facts()) == want
        state.apply(delete_facts=[(OWL_SAME_AS, "scada:T7", "registry:WT-007")])
        assert (RDF, "registry:WT-007", "seen") not in set(state.reasoner.facts())
        assert state.reasoner.stats()["equality"]["classes"] == 0


def test_explain_shows_the_merges_a_derivation_relied_on():
    reasoner = Reasoner()
    reasoner.add_rules(
        PREFIX + "owl:sameAs(X, Y) :- hasSerial(X, S), hasSerial(Y, S) .\n"
        "hot: hot(X) :- turbine(X), temp(X, T), T > 5 ."
    )
    reasoner.add_facts(
        [("hasSerial", "scada:T1", "s1"), ("hasSerial", "reg:WT-1", "s1")]
        + [(RDF, "reg:WT-1", "turbine"), ("temp", "scada:T1", 7)]
    )
    tree = reasoner.explain((RDF, "scada:T1", "hot"))
    text = str(tree)
    assert tree.rule == "owl:sameAs" and "<scada:T1> = <reg:WT-1>" in tree.detail
    assert tree.premises[0].rule == "hot"
    assert "<temp>(<scada:T1>, 7)   [explicit]" in text  # the reading as it was given
    assert "<temp>(<reg:WT-1>, 7)   [by rule owl:sameAs" in text
    same = reasoner.explain((OWL_SAME_AS, "reg:WT-1", "scada:T1"))
    assert same.rule == "owl:sameAs"
    assert {leaf.fact for leaf in same.premises[0].premises} <= {
        ("hasSerial", "reg:WT-1", "s1"),
        ("hasSerial", "scada:T1", "s1"),
    }
    with pytest.raises(KeyError):
        reasoner.explain((RDF, "nobody", "hot"))


def test_the_command_line_writes_and_answers_the_expanded_model(tmp_path, capsys):
    from agent.engine.cli import main

    rules = tmp_path / "eq.rules"
    rules.write_text(PREFIX + "owl:sameAs(X, Y) :- <hasSerial>(X, S), <hasSerial>(Y, S) .\n")
    facts = tmp_path / "eq.nt"
    facts.write_text('<a> <hasSerial> "s1" .\n<b> <hasSerial> "s1" .\n<a> <temp> 35 .\n')
    assert main(["materialise", str(rules), str(facts)]) == 0
    out = capsys.readouterr().out
    z = "urn:zodiac:"  # (relative IRIs against the default --base)
    assert f'<{z}b> <{z}temp> "35"^^<http://www.w3.org/2001/XMLSchema#integer> .' in out
    assert f"<{z}b> <http://www.w3.org/2002/07/owl#sameAs> <{z}a> ." in out
    assert main(["query", str(rules), str(facts), "--pattern", "<temp>(X, 35)"]) == 0
    assert capsys.readouterr().out.split() == ["X", "a", "b"]


def test_an_update_over_budget_changes_nothing_and_the_next_ones_are_right():
    """The layer undoes its part of an update the engine refused (here: over budget)."""
    rules = PREFIX + "owl:sameAs(X, Y) :- key(X, S), key(Y, S) .\nreach(X, Z) :- link(X, Z) .\n"
    rules += "reach(X, Z) :- reach(X, Y), link(Y, Z) ."
    reasoner = Reasoner()
    reasoner.add_rules(rules)
    facts = [("link", f"n{i}", f"n{i + 1}") for i in range(8)] + [("key", "n0", "k")]
    reasoner.add_facts(facts)
    before, stats = set(reasoner.facts()), reasoner.stats()["equality"]
    merging = [("key", "n8", "k"), (OWL_SAME_AS, "n3", "m"), ("link", "n8", "n9")]
    with pytest.raises(BudgetExceeded):
        reasoner.update(add_facts=merging, budget=Budget(max_derived_facts=5))
    assert set(reasoner.facts()) == before
    assert reasoner.stats()["equality"]["classes"] == stats["classes"]
    with pytest.raises(BudgetExceeded):
        reasoner.update(delete_facts=[("key", "n0", "k")], add_facts=merging,
                        budget=Budget(max_derived_facts=5))  # fmt: skip
    assert set(reasoner.facts()) == before
    reasoner.update(add_facts=merging)
    reasoner.delete_facts([("key", "n0", "k")])
    explicit = {*facts, *merging} - {("key", "n0", "k")}
    check(reasoner, explicit)


def test_the_view_knows_the_explicit_facts_as_given():
    reasoner = Reasoner()
    reasoner.add_facts([(OWL_SAME_AS, "a", "b"), ("p", "a", "x")])
    view = reasoner.view()
    key, given = reasoner.lookup_fact(("p", "a", "x"))
    _, other = reasoner.lookup_fact(("p", "b", "x"))
    assert view.explicit(key, given) and not view.explicit(key, other)
    assert view.holds(key, other)


def test_given_facts_count_the_names_an_engine_fact_stands_for():
    """GivenFacts (sameas/given.py): a reading given under two names of one turbine is one
    normal form for the engine, which loses it only when neither is left; a split renormalises
    and an undone batch leaves everything as it was."""
    from agent.engine.equality.classes import Classes
    from agent.engine.equality.given import GivenFacts

    class Changes:
        def __init__(self):
            self.added, self.removed = [], []

        def add(self, key, rows):
            self.added += [(key, r) for r in rows]

        def remove(self, key, rows):
            self.removed += [(key, r) for r in rows]

    classes = Classes(lambda term: (0, term))
    classes.merge(1, 2)  # turbine names 1 and 2: representative 1
    given, changes, key = GivenFacts(), Changes(), ("reading", 2)
    given.count(key, given.add(key, [(1, 50), (2, 50), (3, 60)]), classes, changes)
    assert sorted(changes.added) == [(key, (1, 50)), (key, (3, 60))]
    assert sorted(given.represented((key, (1, 50)))) == [(key, (1, 50)), (key, (2, 50))]
    assert given.remove(key, [(1, 50), (9, 9)], changes) == 1
    assert changes.removed == []  # (2, 50) still stands for it
    given.undo = []
    assert given.remove(key, [(2, 50)], changes) == 1
    assert changes.removed == [(key, (1, 50))]
    for step in reversed(given.undo):  # the update refused: undone
        step()
    given.undo = None
    assert (key, (2, 50)) in given and given.engine_rows(key) == {(1, 50), (3, 60)}
    split = Classes(lambda term: (0, term))  # 1 and 2 no longer equal
    changes = Changes()
    given.renormalise({1, 2}, split, changes, skip={})
    assert changes.added == [(key, (2, 50))] and changes.removed == [(key, (1, 50))]
    assert given.engine_rows(key) == {(2, 50), (3, 60)}


def test_counts_expand_a_pair_held_by_two_stores_once():
    """``count()`` reads binary relations by subject (sameas/expansion.py): a pair both given
    and derived, between terms of classes of two and three names, is counted 2 x 3 times."""
    reasoner = Reasoner()
    reasoner.add_rules("link(X, Z) :- link(X, Y), link(Y, Z) .")
    reasoner.add_facts(
        [("link", "a", "b"), ("link", "b", "c"), ("link", "a", "c")]
        + [(OWL_SAME_AS, "b", "b2"), (OWL_SAME_AS, "c", "c2"), (OWL_SAME_AS, "c", "c3")]
    )
    view = reasoner.view()
    assert len(view.holders(("link", 2))) == 2  # the EDB's and the rule's
    assert view.size(("link", 2)) == 1 * 2 + 2 * 3 + 1 * 3 == len(set(reasoner.facts("link")))
    assert reasoner.count() == len(set(reasoner.facts()))


@given(
    edges=st.dictionaries(
        st.integers(0, 40), st.sets(st.integers(0, 40), max_size=30), max_size=12
    ),
    earlier=st.lists(st.tuples(st.integers(0, 40), st.integers(0, 40)), max_size=5),
)
def test_merging_equalities_by_subject_gives_the_classes_pairs_give(edges, earlier):
    """The rematerialisation's rounds merge the equalities a round derived a subject at a
    time when they are held by subject (sameas/rewriting.py, ``merge_edges``; a subject of
    more than 16 against its class as a bitmap): the classes, their representatives and
    whether anything merged are those of merging pair by pair."""
    from pyroaring import BitMap

    from agent.engine.equality.classes import Classes
    from agent.engine.equality.rewriting import merge_edges
    from agent.engine.storage.subject_facts import SubjectFacts

    def classes_after(pairs) -> tuple:
        classes = Classes(lambda term: (0, -term))  # (the largest id represents its class)
        for a, b in earlier:  # classes from an earlier round
            if classes.find(a) != classes.find(b):
                classes.merge(classes.find(a), classes.find(b))
        merged = merge_edges(classes, pairs)
        return merged, classes.rep, {rep: set(m) for rep, m in classes.members.items()}

    pairs = {(a, b) for a, objects in edges.items() for b in objects}
    by_subject = SubjectFacts({a: BitMap(objects) for a, objects in edges.items()})
    assert classes_after(by_subject) == classes_after(pairs)


KEY_RULES = (
    PREFIX
    + """
owl:sameAs(X, Y) :- <email>(X, E), <email>(Y, E) .
owl:sameAs(Y, Z) :- <advisor>(X, Y), <advisor>(X, Z) .
owl:sameAs(X, Y) :- <seen>(X, P, T), <seen>(Y, P, T) .
<email>(X, E) :- <mail>(X, E) .
<contact>(X, E) :- <email>(X, E), <advisor>(X, Y) .
"""
)
PEOPLE = ["p0", "p1", "p2", "p3", "p4", "p5", "p6"]
KEY_FACTS = st.one_of(
    st.tuples(st.sampled_from(["email", "mail"]), st.sampled_from(PEOPLE), st.sampled_from("ef")),
    st.tuples(st.just("advisor"), st.sampled_from(PEOPLE), st.sampled_from(PEOPLE)),
    st.tuples(
        st.just("seen"), st.sampled_from(PEOPLE), st.sampled_from("xy"), st.sampled_from("12")
    ),
    st.tuples(st.just(OWL_SAME_AS), st.sampled_from(PEOPLE), st.sampled_from(PEOPLE)),
    st.tuples(st.just(OWL_SAME_AS), st.sampled_from("efxy"), st.sampled_from("efxy")),
)


@settings(max_examples=80)
@given(
    facts=st.lists(KEY_FACTS, min_size=1, max_size=24),
    deletions=st.lists(st.lists(st.integers(0, 60), min_size=1, max_size=6), max_size=4),
)
def test_key_rules_over_classes_that_split_and_merge_equal_the_reference(facts, deletions):
    """Key rules (inverse-functional, functional, and a key of two columns) over many names
    sharing few keys, keys made equal too, then deletions by B/F~: the facts a checked fact
    stands for that agree on a key are merged at once (``BackwardForward._keyed``), which
    must give what deriving each equality in turn gives, also when a key's class splits."""
    reasoner = Reasoner(costs=MODES["bf"])
    reasoner.update(add_rules=KEY_RULES, add_facts=facts)
    explicit = set(facts)
    check(reasoner, explicit)
    for positions in deletions:
        present = sorted(explicit, key=repr)
        if not present:
            break
        chosen = {present[i % len(present)] for i in positions}
        reasoner.delete_facts(sorted(chosen, key=repr))
        explicit -= chosen
        check(reasoner, explicit)


KEYS_ONLY = [
    "owl:sameAs(X, Y) :- <email>(X, E), <email>(Y, E) .",
    "owl:sameAs(Y, Z) :- <advisor>(X, Y), <advisor>(X, Z) .",
    "owl:sameAs(X, Y) :- <seen>(X, P, T), <seen>(Y, P, T) .",
    "owl:sameAs(X, Y) :- <tagged>(X), <tagged>(Y) .",
]


@settings(max_examples=80)
@given(
    chosen=st.sets(st.integers(0, len(KEYS_ONLY) - 1), min_size=1),
    facts=st.lists(
        st.one_of(KEY_FACTS, st.tuples(st.just("tagged"), st.sampled_from(PEOPLE))),
        min_size=1,
        max_size=24,
    ),
    deletions=st.lists(st.lists(st.integers(0, 60), min_size=1, max_size=6), max_size=4),
)
# Two advisors equal because their students are (one address): deleting the address splits
# both classes. An advisor's address given twice, once under a name merged with it.
@example(
    chosen={0, 1},
    facts=[("email", "p0", "e"), ("email", "p1", "e"), ("advisor", "p0", "p2")]
    + [("advisor", "p1", "p3")],
    deletions=[[3]],
)
@example(
    chosen={0, 1},
    facts=[("email", "p2", "e"), ("email", "p3", "f"), (OWL_SAME_AS, "e", "f")]
    + [("advisor", "p0", "p2"), ("advisor", "p0", "p3")],
    deletions=[[0]],
)
@example(  # p2 = p2 stays: p2 is an advisor still
    chosen={0, 1}, facts=[("email", "p2", "e"), ("advisor", "p0", "p2")], deletions=[[1]]
)
def test_a_component_of_keys_is_maintained_by_grouping_as_by_its_rules(chosen, facts, deletions):
    """A component whose rules are all keys over explicit facts is rematerialised by grouping
    facts that agree on a key, and maintained under deletions by taking apart the classes that
    may split and grouping their facts again (sameas/keys.py): after the materialisation and
    after each deletion, the same classes, representatives and store (each explicit fact in
    normal form, each key's ``c = c``) as evaluating the rules by rounds over what is left;
    through the reasoner, the reference's model after every step."""
    from functools import partial

    from agent.engine.equality.key_rules import KeyDeletion, key_columns
    from agent.engine.reasoner import evaluate_rules

    program = PREFIX + "\n".join(KEYS_ONLY[i] for i in sorted(chosen))
    rules = parse_program(program).rules
    terms = TermDictionary()
    encoded = {fact: terms.encode_fact(fact) for fact in facts}

    def component_over(given, by_keys: bool) -> EqualityComponent:
        component = EqualityComponent(terms, partial(evaluate_rules, terms, True, DEFAULT_COSTS))
        component.by_keys = by_keys
        component.set_rules(rules)
        for fact in given:
            component.explicit.add(fact)
        component.rematerialise()
        return component

    def state(component: EqualityComponent) -> tuple:
        store = {key: rows for key, rows in component.store.by_relation.items() if rows}
        members = {rep: set(names) for rep, names in component.classes.members.items()}
        return component.classes.rep, members, store

    keys = key_columns(component_over([], by_keys=True).rules)
    assert keys is not None
    maintained = component_over(encoded.values(), by_keys=True)
    assert state(maintained) == state(component_over(encoded.values(), by_keys=False))
    reasoner = Reasoner(costs=replace(DEFAULT_COSTS, equality_rematerialise_share=10.0))
    reasoner.update(add_rules=program, add_facts=facts)
    check(reasoner, set(facts))
    for positions in deletions:
        present = sorted(encoded, key=repr)
        if not present:
            break
        gone = {present[i % len(present)] for i in positions}
        gone_ids = [encoded.pop(fact) for fact in gone]
        for fact in gone_ids:
            maintained.explicit.discard(fact)
        maintained.start_log()
        KeyDeletion(maintained, keys).run(gone_ids)
        assert state(maintained) == state(component_over(encoded.values(), by_keys=False))
        reasoner.delete_facts(sorted(gone, key=repr))
        check(reasoner, set(encoded))


def test_key_positions_are_found_for_key_rules_only():
    """``PatternRule.key_position``: the position two facts of one relation differ at, when
    the rule says the terms there are equal; None for any rule that says more than that."""
    cases = {
        "owl:sameAs(X, Y) :- <p>(X, E), <p>(Y, E) .": 0,
        "owl:sameAs(Y, X) :- <p>(X, E), <p>(Y, E) .": 0,
        "owl:sameAs(Y, Z) :- <p>(X, Y), <p>(X, Z) .": 1,
        "owl:sameAs(X, Y) :- <p>(X, A, B), <p>(Y, A, B) .": 0,
        "owl:sameAs(X, Y) :- <p>(X, E), <q>(Y, E) .": None,  # two relations
        "owl:sameAs(X, Y) :- <p>(X, E), <p>(Y, F) .": None,  # no shared key
        "owl:sameAs(X, Y) :- <p>(X, X), <p>(Y, X) .": None,  # the key is a merged name
        "owl:sameAs(X, Y) :- <p>(X, E, E), <p>(Y, E, E) .": None,  # a repeated key variable
        "owl:sameAs(X, Y) :- <p>(X, <k>), <p>(Y, <k>) .": None,  # a constant gamma may rewrite
        "owl:sameAs(X, Y) :- <p>(X, E), <p>(Y, E), <q>(X) .": None,  # a third atom
        "<r>(X, Y) :- <p>(X, E), <p>(Y, E) .": None,  # not an equality
    }
    terms = TermDictionary()
    for text, position in cases.items():
        rule = PatternRule.encode(parse_rule(text), terms)
        assert rule.key_position == position, text


@pytest.mark.parametrize("size", [160, 1600])
def test_bf_proves_a_class_sharing_a_key_in_constant_steps(size):
    """B/F~ over a class of k names, half linked by an explicit owl:sameAs to one name and half
    by an e-mail address they share, after one alias's address is deleted: the facts it proves
    do not grow with k. It used to saturate the address's facts before checking the class's
    ``c = c``, delaying an equality between every two aliases (6,799 proved facts for k =
    160), then proved each alias's equality and address in turn (398); now the explicit
    equalities merge at once and the key rule's facts merge by their key
    (``BackwardForward.merge_all``, ``_keyed``): the class's ``c = c`` and its address."""
    rules = parse_program(PREFIX + "owl:sameAs(X, Y) :- <email>(X, E), <email>(Y, E) .").rules
    terms = TermDictionary()
    star, address = terms.encode("star"), terms.encode("star@mail")
    aliases = [terms.encode(f"alias{i:04}") for i in range(size)]
    email, same = ("email", 2), ("http://www.w3.org/2002/07/owl#sameAs", 2)
    facts = [(email, (star, address))]
    facts += [(same, (a, star)) if i % 2 else (email, (a, address)) for i, a in enumerate(aliases)]
    component = EqualityComponent(terms)
    component.set_rules(rules)
    for fact in facts:
        component.explicit.add(fact)
    component.insert(facts)
    component.start_log()
    gone = (email, (aliases[0], address))
    component.explicit.discard(gone)
    run = BackwardForward(component)
    run.run([gone])
    assert len(run.proved) <= 4
    assert component.classes.size(star) == len(aliases)  # all but the alias that lost its address
    assert component.classes.find(aliases[0]) == aliases[0]


def test_counts_expand_a_pair_derived_by_subject_in_two_hyper_nodes_once():
    """Two composition rules derive ``r`` in two hyper-nodes, each held by subject: ``count()``
    reads both by subject (sameas/expansion.py, ``_pairs_size``) and counts a pair both derive,
    between classes of two and three names, 2 x 3 times, like ``facts()``."""
    from agent.engine.storage.store import SUBJECT

    reasoner = Reasoner()
    reasoner.add_rules("r(X, Z) :- a(X, Y), b(Y, Z) .\nr(X, Z) :- c(X, Y), d(Y, Z) .")
    reasoner.add_facts(
        [("a", "x", "m"), ("b", "m", "z"), ("c", "x", "n"), ("d", "n", "z"), ("a", "y", "m")]
        + [(OWL_SAME_AS, "x", "x2"), (OWL_SAME_AS, "z", "z2"), (OWL_SAME_AS, "z", "z3")]
    )
    view = reasoner.view()
    holders = view.base.holders(("r", 2))
    assert len(holders) == 2 and all(h.existing_index(SUBJECT) is not None for h in holders)
    r_facts = list(reasoner.facts("r"))
    assert len(r_facts) == 2 * 3 + 3  # x's two names and y, each with z's three
    assert view.size(("r", 2)) == len(r_facts)
    assert reasoner.count() == len(set(reasoner.facts()))
