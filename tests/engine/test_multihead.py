"""Rules with several heads (``a(X, Y), b(Y) :- ...``) and the ``skolem`` function: parsed,
validated, printed back, evaluated once per body substitution, maintained, saved and restored.
The differential machines draw them too (the ``multi_head`` motif of
``tests/support/strategies.py``) and the Spark job runs them (the ``expressions_multihead`` golden
case)."""

from __future__ import annotations

import pytest

from agent.engine import RDF_TYPE, Reasoner
from agent.engine.errors import ParseError, RuleError, UnsafeRuleError
from agent.engine.language import Literal
from agent.engine.program.parser import parse_program
from agent.engine.values import skolem
from agent.state.agent_state import AgentState
from tests.support.reference import skolem as reference_skolem

RULE = "m: <p>(X, Y), <q>(Y), <done>(<x>) :- <e>(X, Y) and not <blocked>(Y) ."


def test_parsed_printed_and_parsed_again() -> None:
    (rule,) = parse_program(RULE).rules
    assert [str(h) for h in rule.heads] == ["<p>(X, Y)", "<q>(Y)", "<done>(<x>)"]
    assert parse_program(str(rule)).rules == (rule,)
    (other,) = parse_program(
        "m: <q>(Y), <p>(X, Y), <done>(<x>) :- <e>(X, Y) and not <blocked>(Y) ."
    ).rules
    assert other.key != rule.key  # heads in another order: another text, another rule


def test_several_facts_in_one_statement() -> None:
    program = parse_program("<a>(<x>), <b>(<y>, 2) .")
    assert [str(f) for f in program.facts] == ["<a>(<x>)", "<b>(<y>, 2)"]


@pytest.mark.parametrize(
    "text, error, words",
    [
        ("<a>(X), <b>(Z) :- <e>(X, Y) .", UnsafeRuleError, "Z"),
        (
            "<a>(X, N), <b>(X) :- aggregate( <e>(X, Y) ) on X with count(Y) as N .",
            RuleError,
            "one head",
        ),
        ("<zodiac:body:x>(X) :- <e>(X, Y) .", RuleError, "engine's own"),
        ("<a>(X, N) :- <e>(X, Y) and bind(skolem() as N) .", ParseError, "expected a term"),
    ],
)
def test_bad_rules_are_refused(text: str, error: type, words: str) -> None:
    with pytest.raises(error, match=words):
        parse_program(text)
    reasoner = Reasoner()
    reasoner.add_rules("<ok>(X) :- <e>(X, Y) .")
    with pytest.raises(error):
        reasoner.add_rules(text)
    assert len(reasoner.rules) == 1  # the program is as it was


def test_every_head_derived_and_maintained() -> None:
    reasoner = Reasoner()
    reasoner.add_facts([("e", "a", "b"), ("e", "b", "c")])
    reasoner.add_rules(RULE)
    assert set(reasoner.facts("p")) == {("p", "a", "b"), ("p", "b", "c")}
    assert {f[1] for f in reasoner.facts() if f[-1] == "q"} == {"b", "c"}
    assert reasoner.count() == 7  # the body's own relation is not a fact users see
    names = {n for node in reasoner.stats()["hyper_nodes"] for n in node["rules"]}
    assert names == {"m.body", "m.head1", "m.head2", "m.head3"}

    reasoner.add_facts([(RDF_TYPE, "b", "blocked")])  # Y = b is blocked: p(a, b), q(b) go
    assert set(reasoner.facts("p")) == {("p", "b", "c")}
    reasoner.delete_facts([("e", "b", "c")])
    assert set(reasoner.facts("p")) == set() and reasoner.count() == 2
    reasoner.delete_facts([(RDF_TYPE, "b", "blocked")])
    assert set(reasoner.facts("p")) == {("p", "a", "b")}
    reasoner.delete_rules(["m"])
    assert reasoner.count() == 1 and not reasoner.stats()["hyper_nodes"]


def test_saved_and_restored(tmp_path) -> None:
    state = AgentState(tmp_path / "agent.db")
    state.apply(add_facts=[("e", "a", "b")], add_rules=RULE)
    before = set(state.reasoner.facts())
    state.close()
    state = AgentState(tmp_path / "agent.db")
    assert state.load_report.how == "loaded" and set(state.reasoner.facts()) == before
    state.apply(add_facts=[("e", "c", "d")])
    assert ("p", "c", "d") in set(state.reasoner.facts())
    state.close()


def test_skolem_names_values_not_their_spelling() -> None:
    assert skolem(Literal("v"), 5) == skolem(Literal("v"), 5.0)
    assert skolem(Literal("v"), 5) != skolem(Literal("v"), "5") != skolem(Literal("w"), 5)
    assert skolem(Literal("v"), "a", "b") != skolem(Literal("v"), "ab")
    assert skolem(Literal("v"), 1).startswith("urn:zodiac:skolem:v:")
    # a number as the tag: its text in the IRI does not depend on the spelling seen first
    assert skolem(5.0, 1) == skolem(5, 1) == reference_skolem(5.0, 1) == reference_skolem(5, 1)
    assert skolem(2.5, 1).startswith("urn:zodiac:skolem:2.5:")
    reasoner = Reasoner()
    reasoner.add_facts([("v", "e1", 5), ("v", "e2", 5.0), ("v", "e3", 2.5)])
    reasoner.add_rules('<node>(E, N), <of>(N, E) :- <v>(E, X) and bind(skolem("n", X) as N) .')
    nodes = {e: n for _, e, n in reasoner.facts("node")}
    assert nodes["e1"] == nodes["e2"] != nodes["e3"] == skolem(Literal("n"), 2.5)
