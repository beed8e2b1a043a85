"""Linear closures (modules/linear.py): shapes recognised, and the module against the reference
evaluator through fact and rule updates and SQLite save / restore.

The differential test draws a program around one left- or right-linear step (base rules: a
copy of the step relation, a copy of another relation, a filtered copy, several or none; P's
own explicit facts; readers of P; sometimes a rule that merges the step with another node),
a small graph, then a sequence of mixed updates (fact insertions and deletions of every input,
deletes and re-adds in one update, the step replaced under its label by the other direction or
by a non-linear rule, a restart from the saved state) and checks after each step that the
materialisation equals ``tests/support/reference.py``'s.
"""

from __future__ import annotations

import io
import random
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.engine import Reasoner
from agent.engine.modules import linear
from agent.engine.modules.shapes import LinearClosurePattern, node_shape
from agent.engine.program.parser import parse_program
from agent.state.agent_state import AgentState
from tests.support.reference import evaluate, from_external

RIGHT = "step: p(X, Z) :- p(X, Y) and {e}(Y, Z) ."
LEFT = "step: p(X, Z) :- {e}(X, Y) and p(Y, Z) ."
NONLINEAR = "step: p(X, Z) :- p(X, Y) and p(Y, Z) ."
BASES = [
    "b1: p(X, Y) :- e(X, Y) .",
    "b2: p(X, Y) :- f(X, Y) .",
    "b3: p(X, Y) :- e(X, Y) and COMP(X, !=, Y) .",
    "b4: p(X, Y) :- f(Y, X) and g(X, Y) .",
]
READERS = [
    "r1: reach(X, N) :- aggregate( p(X, Y) ) on X with count(Y) as N .",
    "r2: loop(X) :- p(X, X) .",
    "r3: far(X, Z) :- p(X, Y) and p(Y, Z) .",
]
MERGE = "m1: f(X, Y) :- p(Y, X) ."
NODES = ["a", "b", "c", "d", "e", "f"]
RELATIONS = ["e", "f", "g", "p"]


def shape(text: str):
    return node_shape(parse_program(text).rules)


@pytest.mark.parametrize(
    "text, right, step",
    [
        ("p(X, Z) :- p(X, Y) and e(Y, Z) .", True, "e"),
        ("p(X, Z) :- e(Y, Z), p(X, Y) .", True, "e"),
        ("p(A, C) :- e(A, B) and p(B, C) .", False, "e"),
        ("<p>(X, Z) :- <q>(X, Y) and <p>(Y, Z) .", False, "q"),
    ],
)
def test_linear_steps_are_recognised(text, right, step):
    found = shape(text)
    assert isinstance(found, LinearClosurePattern)
    assert found.right == right and found.step[0] == step


@pytest.mark.parametrize(
    "text",
    [
        "p(X, Z) :- p(X, Y) and e(Y, Z) and COMP(X, !=, Z) .",  # a filter on the step
        "p(X, Z) :- p(X, Y) and e(Y, Z) and g(Z) .",
        "p(X, Z) :- p(Y, X) and e(Y, Z) .",  # not a chain
        "p(X, Z) :- p(X, Y) and e(Z, Y) .",
        "p(X, X) :- p(X, Y) and e(Y, X) .",
        "p(X, Z) :- p(X, Y) and e(Y, Z) and e(Z, a) .",
        "p(X, Z) :- p(X, Y) and p(Y, Z) .",  # E = P: the transitive module's
        "p(X, Z) :- p(X, Y), e(Y, Z) .\np(X, Z) :- e(X, Y), p(Y, Z) .",  # two steps
    ],
)
def test_other_shapes_are_not_linear(text):
    assert not isinstance(shape(text), LinearClosurePattern)


def test_module_choice_and_plan():
    reasoner = Reasoner()
    reasoner.add_rules("p(X, Y) :- e(X, Y) .\np(X, Z) :- p(X, Y) and e(Y, Z) .")
    reasoner.add_facts([("e", "a", "b"), ("e", "b", "c")])
    modules = {n["module"] for n in reasoner.stats()["hyper_nodes"]}
    assert "linear closure (right-linear)" in modules
    assert ("p", "a", "c") in {tuple(f) for f in reasoner.facts()}


def test_explain_proves_a_derived_fact():
    reasoner = Reasoner()
    reasoner.add_rules("p(X, Y) :- e(X, Y) .\np(X, Z) :- e(X, Y) and p(Y, Z) .")
    reasoner.add_facts([("e", "a", "b"), ("e", "b", "c"), ("e", "c", "d")])
    proof = reasoner.explain(("p", "a", "d"))
    assert proof.fact == ("p", "a", "d") and proof.rule is not None
    leaves = {node.fact for node in proof._postorder() if node.explicit}
    assert leaves == {("e", "a", "b"), ("e", "b", "c"), ("e", "c", "d")}


# ------------------------------------------------------------------------ differential
@st.composite
def programs(draw: st.DrawFn) -> list[str]:
    e = draw(st.sampled_from(["e", "f"]))
    step = (RIGHT if draw(st.booleans()) else LEFT).format(e=e)
    rules = [step]
    rules += [b for b in BASES if draw(st.integers(0, 2)) == 0]
    rules += [r for r in READERS if draw(st.integers(0, 2)) == 0]
    if draw(st.integers(0, 5)) == 0:
        rules.append(MERGE)
    return rules


fact = st.tuples(st.sampled_from(RELATIONS), st.sampled_from(NODES), st.sampled_from(NODES))


class Subject:
    """A reasoner, or one behind an AgentState that can be closed and reopened."""

    def __init__(self, persistent: bool) -> None:
        self.directory = Path(tempfile.mkdtemp(prefix="zodiac-linear-")) if persistent else None
        self.state = self._open() if persistent else None
        self._reasoner = None if persistent else Reasoner()

    def _open(self) -> AgentState:
        assert self.directory is not None
        return AgentState(self.directory / "agent.db", synchronous="OFF")

    @property
    def reasoner(self) -> Reasoner:
        return self.state.reasoner if self.state is not None else self._reasoner

    def apply(self, **change) -> None:
        if self.state is not None:
            self.state.apply(**change)
        else:
            self.reasoner.update(**change)

    def restart(self) -> None:
        if self.state is not None:
            self.state.close()
            self.state = self._open()
            assert self.state.load_report.how == "loaded"

    def close(self) -> None:
        if self.state is not None:
            self.state.close()
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)


def check(subject: Subject, rules: dict[str, str], facts: set[tuple]) -> None:
    program = parse_program("\n".join(rules.values()))
    wanted = evaluate(program, [from_external(f) for f in facts]).external()
    actual = {tuple(f) for f in subject.reasoner.facts()}
    assert actual == wanted, (
        f"missing {sorted(wanted - actual)}, extra {sorted(actual - wanted)}\n"
        + "\n".join(rules.values())
    )


@settings(
    max_examples=max(1, settings.default.max_examples // 2),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    rules=programs(),
    facts=st.sets(fact, max_size=14),
    persistent=st.booleans(),
    seed=st.integers(0, 2**16),
    one_by_one=st.booleans(),
)
def test_linear_closures_equal_the_reference_through_updates(
    rules, facts, persistent, seed, one_by_one
):
    """``one_by_one``: insertions one gain at a time, or reclosed (``linear.ONE_BY_ONE``, by
    which small graphs would always be reclosed)."""
    rng = random.Random(seed)
    subject = Subject(persistent)
    saved = linear.ONE_BY_ONE
    linear.ONE_BY_ONE = 0 if one_by_one else 10**9
    try:
        current = {text.split(":")[0]: text for text in rules}
        explicit = set(facts)
        if rng.random() < 0.5:
            subject.apply(add_rules="\n".join(current.values()))
            subject.apply(add_facts=sorted(explicit))
        else:
            subject.apply(add_facts=sorted(explicit))
            subject.apply(add_rules="\n".join(current.values()))
        check(subject, current, explicit)
        for _ in range(8):
            roll = rng.random()
            if roll < 0.12:
                subject.restart()
            elif roll < 0.3:
                # the step replaced under its label (or a base rule toggled)
                old = current["step"]
                e = rng.choice(["e", "f"])
                new = rng.choice([RIGHT, LEFT, NONLINEAR]).format(e=e)
                add, delete = [], []
                if new != old:
                    current["step"] = new
                    add, delete = [new], ["step"]
                base = rng.choice(BASES)
                label = base.split(":")[0]
                if label in current:
                    del current[label]
                    delete.append(label)
                else:
                    current[label] = base
                    add.append(base)
                subject.apply(add_rules="\n".join(add) if add else None, delete_rules=delete)
            else:
                present = sorted(explicit)
                gone = set(rng.sample(present, k=min(len(present), rng.choice([0, 1, 2, 4]))))
                new = {
                    (rng.choice(RELATIONS), rng.choice(NODES), rng.choice(NODES))
                    for _ in range(rng.choice([0, 1, 2, 5]))
                }
                if gone and rng.random() < 0.3:
                    new.add(next(iter(gone)))  # deleted and re-added in one update
                subject.apply(add_facts=sorted(new), delete_facts=sorted(gone))
                explicit = (explicit - gone) | new
            check(subject, current, explicit)
    finally:
        linear.ONE_BY_ONE = saved
        subject.close()


@pytest.mark.parametrize("one_by_one", [0, 10**9], ids=["gains", "reclosed"])
def test_module_keeps_a_random_dag_equal_to_from_scratch(monkeypatch, one_by_one):
    """A larger graph than hypothesis draws: edge insertions and deletions against a fresh
    reasoner, both directions, insertions applied both ways."""
    monkeypatch.setattr(linear, "ONE_BY_ONE", one_by_one)
    rng = random.Random(7)
    edges = {(rng.randrange(40), rng.randrange(40)) for _ in range(120)}
    facts = [("e", f"n{a}", f"n{b}") for a, b in edges]
    for step in ("p(X, Z) :- p(X, Y) and e(Y, Z) .", "p(X, Z) :- e(X, Y) and p(Y, Z) ."):
        program = f"p(X, Y) :- e(X, Y) .\n{step}"
        reasoner = Reasoner()
        reasoner.add_rules(program)
        reasoner.add_facts(facts)
        present = list(facts)
        for _ in range(6):
            gone = rng.sample(present, k=rng.choice([1, 3, 10]))
            new = [("e", f"n{rng.randrange(40)}", f"n{rng.randrange(40)}") for _ in range(3)]
            reasoner.update(add_facts=new, delete_facts=gone)
            present = sorted((set(present) - set(gone)) | set(new))
            fresh = Reasoner()
            fresh.add_rules(program)
            fresh.add_facts(present)
            assert {tuple(f) for f in reasoner.facts()} == {tuple(f) for f in fresh.facts()}
            strategies = [
                n["strategy"] for n in reasoner.stats()["last_update"]["hyper_nodes"].values()
            ]
            assert any(s.startswith("linear closure") for s in strategies), strategies


def test_explain_plans_names_the_module(tmp_path: Path):
    from agent.engine.cli import main

    rules = tmp_path / "reach.rules"
    rules.write_text("p(X, Y) :- e(X, Y) .\nstep: p(X, Z) :- p(X, Y) and e(Y, Z) .\n")
    facts = tmp_path / "edges.nt"
    facts.write_text("<a> <e> <b> .\n<b> <e> <c> .\n")
    buffer = io.StringIO()
    assert main(["explain", str(rules), str(facts), "--plans", "step"], out=buffer) == 0
    assert "evaluated by the linear closure (right-linear) module" in buffer.getvalue()
    buffer = io.StringIO()
    assert (
        main(["--no-modules", "explain", str(rules), str(facts), "--plans", "step"], out=buffer)
        == 0
    )
    assert "linear closure" not in buffer.getvalue()


@pytest.mark.parametrize("step", [RIGHT, LEFT], ids=["right", "left"])
def test_first_update_after_a_restart_rebuilds_the_state_from_the_saved_facts(tmp_path, step):
    rules = "b2: p(X, Y) :- f(X, Y) .\n" + step.format(e="e")
    facts = [("e", a, b) for a, b in zip(NODES, NODES[1:], strict=False)]
    facts += [("e", "d", "b"), ("f", "a", "c"), ("p", "e", "a"), ("f", "c", "c")]
    state = AgentState(tmp_path / "agent.db", synchronous="OFF")
    state.apply(add_rules=rules, add_facts=facts)
    state.close()
    for change in ({"delete_facts": [("e", "b", "c")]}, {"add_facts": [("e", "f", "a")]}):
        state = AgentState(tmp_path / "agent.db", synchronous="OFF")
        state.apply(**change)
        strategies = [
            n["strategy"] for n in state.reasoner.stats()["last_update"]["hyper_nodes"].values()
        ]
        assert any("state rebuilt from the saved IDB" in s for s in strategies), strategies
        if "delete_facts" in change:
            facts.remove(change["delete_facts"][0])
        else:
            facts += change["add_facts"]
        program = parse_program(rules)
        wanted = evaluate(program, [from_external(f) for f in facts]).external()
        assert {tuple(f) for f in state.reasoner.facts()} == wanted
        state.close()
