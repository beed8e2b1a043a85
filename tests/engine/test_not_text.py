"""Strings that are not Unicode text (a lone surrogate, which ``\\uD800`` in rule text or
N-Triples spells) are bad input: refused with a clear, printable error where they come in,
before anything changes. No state file, bundle or output could hold them (UTF-8 has no lone
surrogates), and before this they broke far from their source: a signed bundle with such a
rule was refused as an agent's "internal" error, and a fact made the state's write fail."""

from __future__ import annotations

import pytest

from agent.engine import Reasoner
from agent.engine.errors import NotTextError, ParseError, RuleError, ZodiacError
from agent.engine.language import Atom, Constant, Literal, Rule, Variable
from agent.engine.program.parser import parse_program
from agent.engine.program.rdf import parse_facts
from agent.state.agent_state import AgentState
from tests.agent.test_service import make_agent
from tests.support.agent_harness import Cloud

RDF_TYPE = "http://www.w3.org/1999/02/22-rdf-syntax-ns#type"
X = Variable("X")


def printable(error: Exception) -> str:
    """The message, which must be writable as UTF-8 (a terminal, a log, a status message)."""
    text = str(error)
    text.encode("utf-8")
    return text


@pytest.mark.parametrize("escape", ["\\uD800", "\\uDFFF", "\\U0000DC00"])
def test_a_surrogate_escape_in_rule_text_is_a_parse_error_at_its_place(escape):
    with pytest.raises(ParseError) as raised:
        parse_program(f'q(X) :-\n  p(X, "ab{escape}") .')
    assert (raised.value.line, raised.value.column) == (2, 11)  # the backslash
    assert "surrogate" in printable(raised.value)


def test_escapes_of_characters_beyond_the_basic_plane_still_read():
    (rule,) = parse_program('q(X) :- p(X, "\\U0001F600\\u00e9") .').rules
    assert rule.body[0].terms[1].value == Literal("\U0001f600\u00e9")


@pytest.mark.parametrize(
    "fact",
    [
        ("p", "a", "x\ud800"),  # an IRI
        ("p", "a", Literal("x\udfff")),  # a literal's text
        ("p", "a", Literal("x", language="e\ud800")),
        ("p\ud800", "a", "b"),  # a predicate
        ("p\ud800", 1, 2.5),  # (new numbers in two columns: encoded fact by fact)
        (RDF_TYPE, "a", "C\ud800"),  # a class
    ],
)
def test_a_fact_holding_a_lone_surrogate_is_refused_and_changes_nothing(fact):
    reasoner = Reasoner()
    reasoner.add_rules("q(X, Y) :- p(X, Y) .")
    reasoner.add_facts([("p", "a", "b")])
    before = set(reasoner.facts())
    for batch in ([fact], [("p", "c", 1), fact]):  # alone, and after a good fact
        with pytest.raises(NotTextError) as raised:
            reasoner.add_facts(batch)
        assert "lone surrogate" in printable(raised.value)
        assert set(reasoner.facts()) == before


@pytest.mark.parametrize(
    "rule",
    [
        Rule(Atom("q", (X,)), (Atom("p", (X, Constant("a\ud800"))),)),
        Rule(Atom("q\ud800", (X,)), (Atom("p", (X, X)),)),
        Rule(Atom("q", (X,)), (Atom("p", (X, Constant(Literal("\udc00")))),)),
    ],
)
def test_a_rule_holding_a_lone_surrogate_is_refused_with_a_printable_message(rule):
    reasoner = Reasoner()
    reasoner.add_rules("q(X) :- p(X, X) .")
    with pytest.raises(RuleError) as raised:
        reasoner.add_rules([rule])
    assert "not Unicode text" in printable(raised.value)
    assert list(reasoner.rules) == [next(iter(reasoner.rules))] and len(reasoner.rules) == 1


@pytest.mark.parametrize("text", ['<a> <p> "x\\uD800" .\n', "<a\\uD800> <p> <b> .\n"])
def test_n_triples_with_a_surrogate_escape_are_refused_naming_the_source(text):
    """(refused by the parser itself, at the escape: "\\uD800 ... not a valid unicode
    character")"""
    with pytest.raises(ZodiacError) as raised:
        list(parse_facts(text, source="readings.nt"))
    assert printable(raised.value).startswith("readings.nt:1:")
    assert "D800" in str(raised.value) and "not a valid unicode character" in str(raised.value)


def test_the_state_refuses_such_a_fact_before_writing(tmp_path):
    with AgentState(tmp_path / "a.db") as state:
        state.apply(add_facts=[("p", "a", "b")])
        with pytest.raises(NotTextError):
            state.apply(add_facts=[("p", "a", "x\ud800")])
        assert set(state.reasoner.facts()) == {("p", "a", "b")}
    with AgentState(tmp_path / "a.db") as state:
        assert set(state.reasoner.facts()) == {("p", "a", "b")}


def test_an_agent_refuses_a_bundle_whose_rule_spells_a_surrogate(tmp_path):
    """Signed and well formed, but its rule cannot be read: refused as a bad rule (not as the
    agent's internal error), with a message that can be printed; nothing changes."""
    cloud = Cloud(tmp_path / "cloud")
    agent = make_agent(tmp_path, cloud)
    good = cloud.bundle("base", 1, rules={"q": "q: <q>(X) :- <p>(X, Y) ."}, facts=[("p", "a", 1)])
    assert agent.handle_bundle(cloud.sign(good)).status == "applied"
    before = set(agent.reasoner.facts())
    bad = cloud.bundle("base", 2, rules={"r": 'r: <r>(X) :- <p>(X, "\\uD800") .'})
    outcome = agent.handle_bundle(cloud.sign(bad))
    assert outcome.status == "refused" and outcome.reason != "internal", outcome
    assert "surrogate" in printable(Exception(outcome.message))
    assert set(agent.reasoner.facts()) == before and set(agent.reasoner.rules) == {"q"}


@pytest.mark.parametrize("text", ['q(X) :- p(X, "\\\ud800") .', "q(X) :- p(X, Y) \ud800 ."])
def test_a_parse_error_quoting_a_lone_surrogate_can_be_printed(text):
    """Rule text given as a Python string may hold one; the error quotes it escaped."""
    with pytest.raises(ParseError) as raised:
        parse_program(text)
    assert "\\ud800" in printable(raised.value)


def test_rdf_text_given_with_a_lone_surrogate_is_a_parse_error_at_its_place():
    with pytest.raises(ParseError) as raised:
        list(parse_facts('<a> <p> <b> .\n<a> <p> "x\ud800" .\n', source="upload"))
    assert (raised.value.line, raised.value.column) == (2, 11)
