"""The agent's directives in rule text: ``@window`` (windows over readings) and ``@watch``
(watched patterns). Parsed into ``Program.windows`` / ``Program.watches``, printed back
canonically, refused by the engine (it keeps neither)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.engine.errors import DirectiveError, ParseError
from agent.engine.language import Atom, Constant, Program, Variable, WindowDeclaration
from agent.engine.program.parser import parse_program, parse_window
from agent.engine.reasoner import Reasoner

TEXT = """@prefix ex: <http://example.org/> .
@window <hasAirTemperatureMeasurement> 10 min as <recentAirTemperature> .
@window ex:speed 90 s as ex:recentSpeed .
@window ex:speed 1.5 hours as ex:slowSpeed .
@watch <SensorAnomalyWindTurbine>(X) .
@watch ex:alarm(_, 3) .
r1: <stuck>(S) :- aggregate( <recentAirTemperature>(S, V, T) ) on S with count(V) as N and N >= 20 .
"""
EX = "http://example.org/"


def test_windows_and_watches_are_read_in_order():
    program = parse_program(TEXT)
    assert program.windows == (
        WindowDeclaration("hasAirTemperatureMeasurement", 600.0, "recentAirTemperature"),
        WindowDeclaration(EX + "speed", 90.0, EX + "recentSpeed"),
        WindowDeclaration(EX + "speed", 5400.0, EX + "slowSpeed"),
    )
    assert program.watches == (
        Atom("SensorAnomalyWindTurbine", (Variable("X"),)),
        Atom(EX + "alarm", (Variable("_"), Constant(3))),
    )
    assert [rule.id for rule in program.rules] == ["r1"]


@pytest.mark.parametrize(
    ("unit", "seconds"),
    [
        ("s", 1), ("sec", 1), ("second", 1), ("seconds", 1), ("min", 60), ("minute", 60),
        ("minutes", 60), ("h", 3600), ("hour", 3600), ("hours", 3600), ("MIN", 60),
    ],
)  # fmt: skip
def test_units(unit: str, seconds: int):
    window = parse_window(f"@window <p> 2 {unit} as <r> .")
    assert window == WindowDeclaration("p", 2.0 * seconds, "r")


def test_canonical_text_uses_the_largest_whole_unit():
    assert str(WindowDeclaration("p", 600.0, "r")) == "@window <p> 10 min as <r> ."
    assert str(WindowDeclaration("p", 7200.0, "r")) == "@window <p> 2 h as <r> ."
    assert str(WindowDeclaration("p", 90.0, "r")) == "@window <p> 90 s as <r> ."
    assert str(WindowDeclaration("p", 0.25, "r")) == "@window <p> 0.25 s as <r> ."


def test_program_round_trip():
    program = parse_program(TEXT)
    assert parse_program(str(program)) == program
    assert str(program).startswith(
        "@window <hasAirTemperatureMeasurement> 10 min as <recentAirTemperature> .\n"
    )


@given(
    seconds=st.one_of(
        st.integers(1, 10**6).map(float),
        st.floats(1e-3, 1e6, allow_nan=False, allow_infinity=False),
    )
)
def test_declaration_round_trip(seconds: float):
    window = WindowDeclaration("http://x/reading", seconds, "http://x/window")
    assert parse_window(str(window)) == window


@pytest.mark.parametrize(
    ("text", "where", "message"),
    [
        ("@window <p> 0 min as <r> .", "1:13", "a positive number"),
        ("@window <p> -3 min as <r> .", "1:13", "a positive number"),
        ("@window <p> min as <r> .", "1:13", "the window's length"),
        ("@window <p> 10 parsecs as <r> .", "1:16", "a unit of time"),
        ("@window <p> 10 min <r> .", "1:20", "expected 'as'"),
        ("@window <p> 10 min as <r>", "1:26", "at the end of the @window"),
        ("\n  @window <p> 10 min as <p> .", "2:3", "its own reading predicate"),
        ("@window <p> 1 s as <r> .\n@window <q> 1 s as <r> .", "2:1", "declared twice"),
        ("@window <p> 1 s as <r> .\nr: <r>(X, Y, Z) :- <a>(X, Y, Z) .", "1:1", "head of a rule"),
        ("@window x:p 1 s as <r> .", "1:9", "unknown prefix 'x:'"),
        ("@watch <p>(X)", "1:14", "at the end of the @watch"),
        ("@watch X .", "1:8", "expected a predicate"),
        ("@wndow <p> .", "1:1", "unknown directive '@wndow'"),
    ],
)
def test_errors_say_where(text: str, where: str, message: str):
    with pytest.raises(ParseError, match=message) as info:
        parse_program(text, "f.rules")
    assert str(info.value).startswith(f"f.rules:{where}: ")


def test_the_same_declaration_twice_is_one():
    program = parse_program("@window <p> 60 s as <r> .\n@window <p> 1 min as <r> .")
    assert program.windows == (WindowDeclaration("p", 60.0, "r"),)


def test_parse_window_takes_exactly_one_declaration():
    for text in ("", "@window <p> 1 s as <r> .\n@window <p> 1 s as <q> .", "p(a) ."):
        with pytest.raises(ParseError, match="exactly one"):
            parse_window(text)


def test_the_engine_refuses_directives_with_one_line():
    reasoner = Reasoner()
    for text, word in (("@window <p> 10 min as <r> .", "windows"), ("@watch <p>(X) .", "watches")):
        with pytest.raises(DirectiveError, match=f"^{word} ") as info:
            reasoner.add_rules(text + "\nq(X) :- p(X) .")
        assert "\n" not in str(info.value)
    assert reasoner.rules == {}  # nothing applied
    reasoner.add_rules(Program(rules=parse_program("q(X) :- p(X) .").rules))
    assert len(reasoner.rules) == 1
