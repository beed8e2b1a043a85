"""Watches (``Reasoner.watch``): each update's ``watched`` changes are exactly the difference
between consecutive materialisations restricted to the watched patterns.

The differential machines of test_incremental_differential.py (random rule pools, and closure
programs with many edge insertions and deletions) run again with watches on every relation of
their pool: the whole relation, ``p(X, X)`` and ``p(<c1>, Y)`` (a constant that may be no term
yet when the watch starts). After every step:

* the step's changes equal the reference evaluator's materialisation now minus before
  (appeared) and before minus now (disappeared), restricted to each watch;
* the changes replayed from the start of each watch (``watch()`` returns the matches then)
  equal the reference's matches now.

Both ways of refreshing a watch are exercised: from the journal (fact updates) and afresh (rule
updates, hyper-nodes recomputed); ``COVERAGE`` counts them.
"""

from __future__ import annotations

from hypothesis import note, settings
from hypothesis.stateful import run_state_machine_as_test

from agent.engine import RDF_TYPE, Reasoner, WatchChange
from agent.engine.language import Atom, Constant, Program, Variable
from tests.engine.test_incremental_differential import (
    CLOSURE_SETTINGS,
    COVERAGE,
    MACHINE_SETTINGS,
    ClosureMachine,
    RulePoolMachine,
    record,
)
from tests.support.reference import evaluate, match, to_external

X, Y = Variable("X"), Variable("Y")


def patterns(relations: set[tuple[str, int]]) -> list[Atom]:
    found = []
    for name, arity in sorted(relations):
        found.append(Atom(name, tuple(Variable(f"V{i}") for i in range(arity))))
        if arity == 2:
            found.append(Atom(name, (X, X)))
            found.append(Atom(name, (Constant("c1"), Y)))
    return found


def matches(atom: Atom, facts: set[tuple]) -> set[tuple]:
    """The reference's facts (logical form) matching ``atom``, as ``Reasoner.facts`` spells
    them."""
    return {
        to_external(fact)
        for fact in facts
        if fact[0] == atom.predicate
        and len(fact) - 1 == atom.arity
        and match(atom, fact, {}) is not None
    }


class Watching:
    """Mixed into a differential machine: watches on every relation of the pool, the changes
    of each step, the replay, and the invariant."""

    def watch_all(self) -> None:
        relations = set()
        for rule in self.pool:
            relations |= {head.relation for head in rule.heads}
            relations |= {key for key, _ in rule.body_relations()}
        self.atoms = {str(atom): atom for atom in patterns(relations)}
        self.replayed: dict[str, set[tuple]] = {}
        for name, atom in self.atoms.items():
            start = self.reasoner.watch(atom)
            assert not start.disappeared
            self.replayed[name] = set(start.appeared)
        self.before = {name: set(facts) for name, facts in self.replayed.items()}
        self.step_changes: dict[str, WatchChange] = {}

    def __init__(self) -> None:
        super().__init__()
        # Every update, whichever method of the reasoner the step calls, is seen here.
        update = self._reasoner.update
        self._reasoner.update = lambda **change: self.seen(update, change)

    def seen(self, update, change: dict) -> dict:
        if not hasattr(self, "atoms"):
            self.watch_all()  # (before the first change: the reasoner is empty)
        report = update(**change)
        watched = report.get("watched", {})
        for name, got in watched.items():
            assert got, f"{name}: an empty change is reported"
            known = self.step_changes.get(name, WatchChange())
            self.step_changes[name] = WatchChange(
                [*known.appeared, *got.appeared], [*known.disappeared, *got.disappeared]
            )
            replay = self.replayed[name]
            assert not set(got.appeared) & replay, f"{name}: appeared twice {got.appeared}"
            assert set(got.disappeared) <= replay, f"{name}: disappeared unseen {got}"
            replay -= set(got.disappeared)
            replay |= set(got.appeared)
        structural = report["rules_added"] or report["rules_deleted"]
        if watched:
            record("watch refreshed afresh" if structural else "watch refreshed from journal")
        return report

    def check_watches(self) -> None:
        if not hasattr(self, "atoms"):
            return
        program = Program(tuple({r.key: r for r in self.rules.values()}.values()))
        logical = evaluate(program, self.explicit).facts
        for name, atom in self.atoms.items():
            now = matches(atom, logical)
            change = self.step_changes.get(name, WatchChange())
            before = self.before[name]
            note(f"watch {name}: {change}")
            assert set(change.appeared) == now - before, (
                f"after step {self.steps}, watch {name}: appeared {change.appeared}, "
                f"wanted {sorted(now - before, key=repr)}"
            )
            assert set(change.disappeared) == before - now, (
                f"after step {self.steps}, watch {name}: disappeared {change.disappeared}, "
                f"wanted {sorted(before - now, key=repr)}"
            )
            assert self.replayed[name] == now, f"watch {name}: the replay differs"
            self.before[name] = now
            if change:
                record("watch changed in a step")
        self.step_changes = {}


class WatchedRulePoolMachine(Watching, RulePoolMachine):
    def agrees_with_oracle_and_fresh_engine(self) -> None:
        super().agrees_with_oracle_and_fresh_engine()
        self.check_watches()


class WatchedClosureMachine(Watching, ClosureMachine):
    def agrees_with_oracle_and_fresh_engine(self) -> None:
        super().agrees_with_oracle_and_fresh_engine()
        self.check_watches()


# A third of the plain machines' examples (20 in CI, 200 thorough): the machines are theirs,
# the watches ride along.
FEWER = max(1, settings.default.max_examples // 5)
TestWatchedRulePoolMachine = WatchedRulePoolMachine.TestCase
TestWatchedRulePoolMachine.settings = settings(MACHINE_SETTINGS, max_examples=FEWER)
TestWatchedClosureMachine = WatchedClosureMachine.TestCase
TestWatchedClosureMachine.settings = settings(CLOSURE_SETTINGS, max_examples=FEWER)


def test_both_refresh_paths_ran():
    """Both ways of refreshing a watch were exercised by the machines. COVERAGE is a dict of
    this process, and pytest-xdist may run the machines on another worker or after this test:
    a machine that has not run here is run now, with a few examples."""
    paths = ("watch refreshed from journal", "watch refreshed afresh")
    for machine, machine_settings in (
        (WatchedRulePoolMachine, MACHINE_SETTINGS),
        (WatchedClosureMachine, CLOSURE_SETTINGS),
    ):
        if not all(COVERAGE[path] for path in paths):
            run_state_machine_as_test(
                machine, settings=settings(machine_settings, max_examples=FEWER)
            )
    assert COVERAGE["watch refreshed from journal"], dict(COVERAGE)
    assert COVERAGE["watch refreshed afresh"], dict(COVERAGE)


# ---------------------------------------------------------------------------------- examples
def test_watch_reports_appeared_and_disappeared_facts():
    r = Reasoner()
    r.add_rules("anc(X, Y) :- parent(X, Y). anc(X, Z) :- anc(X, Y), parent(Y, Z).")
    assert r.watch("anc(X, <c>)") == WatchChange()
    report = r.update(add_facts=[("parent", "a", "b"), ("parent", "b", "c")])
    assert report["watched"] == {
        "<anc>(X, <c>)": WatchChange(appeared=[("anc", "a", "c"), ("anc", "b", "c")])
    }
    report = r.update(delete_facts=[("parent", "a", "b")])
    assert report["watched"] == {"<anc>(X, <c>)": WatchChange(disappeared=[("anc", "a", "c")])}
    assert r.update(add_facts=[("parent", "x", "y")])["watched"] == {}
    assert r.unwatch("<anc>(X, <c>)") == WatchChange(disappeared=[("anc", "b", "c")])
    assert "watched" not in r.update(add_facts=[("parent", "a", "b")])


def test_a_fact_derived_twice_disappears_when_both_derivations_go():
    r = Reasoner()
    r.add_rules("hot(X) :- temp(X, T), T > 30. hot(X) :- alarm(X).")
    r.watch("hot(X)", name="hot")
    r.add_facts([("temp", "t1", 35), ("alarm", "t1")])
    assert r.update(delete_facts=[("alarm", "t1")])["watched"] == {}
    changed = r.update(delete_facts=[("temp", "t1", 35)])["watched"]
    assert changed == {"hot": WatchChange(disappeared=[(RDF_TYPE, "t1", "hot")])}


def test_watching_a_name_twice():
    r = Reasoner()
    r.watch("p(X)", name="w")
    assert r.watch("p(X)", name="w") == WatchChange()
    try:
        r.watch("q(X)", name="w")
    except ValueError as error:
        assert "already watches" in str(error)
    else:
        raise AssertionError("a second pattern under one name was accepted")
    assert r.watches() == {"w": "<p>(X)"}


def test_watches_follow_owl_same_as():
    """With owl:sameAs a reader sees the expanded model: a merge makes the other names'
    facts appear, a split makes them disappear (the watches are read afresh then)."""
    same = "http://www.w3.org/2002/07/owl#sameAs"
    r = Reasoner()
    r.add_rules("hot: <Hot>(X) :- <temp>(X, T) and COMP(T, >, 30) .")
    r.watch("<Hot>(X)", name="hot")
    replay: set = set()

    def step(**change):
        got = r.update(**change).get("watched", {}).get("hot", WatchChange())
        replay.difference_update(got.disappeared)
        replay.update(got.appeared)
        assert replay == set(r.facts_named("Hot")), (change, replay)

    step(add_facts=[("temp", "a", 35)])
    step(add_facts=[(same, "a", "b")])
    assert (RDF_TYPE, "b", "Hot") in replay
    step(delete_facts=[(same, "a", "b")])
    step(delete_facts=[("temp", "a", 35)])
    assert replay == set()
