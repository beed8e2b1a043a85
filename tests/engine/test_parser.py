"""Parser tests: ZodiacEdge's syntax, plain Datalog, the printed syntax (round trip) and errors."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.engine.errors import ParseError, RuleError, UnsafeRuleError
from agent.engine.language import (
    RDF_TYPE,
    XSD,
    Aggregate,
    Atom,
    BinaryOp,
    Bind,
    Call,
    Comparison,
    Constant,
    Literal,
    Negation,
    Program,
    Rule,
    Variable,
)
from agent.engine.program.parser import literal_value, parse_atom, parse_file, parse_program
from agent.engine.values import AGGREGATE_FUNCTIONS, COMPARISON_OPERATORS
from simulations.bench.parse import bundle_text

X, Y, Z, T, M, D = (Variable(n) for n in "XYZTMD")


def atom(predicate: str, *terms: object) -> Atom:
    return Atom(predicate, tuple(t if isinstance(t, Variable) else Constant(t) for t in terms))


def only_rule(text: str) -> Rule:
    program = parse_program(text)
    assert len(program.rules) == 1 and not program.facts
    return program.rules[0]


ZODIAC_EXAMPLES = [
    "<hasNeighbour>(X, Y) :- <hasNeighbour>(Y, X) .",
    "<p11>(X, Y) :- <p11>(X, Z) and <p11>(Z, Y) and COMP(X, !=, Y) .",
    "<p20>(X, Y) :- <p12>(X, Y)  and not <p13>(Y, Z) .",
    "<hasNeighbourAirTemperatureMeasurementNumber>(X, Z) :- aggregate( <hasNeighbour>(X, Y) and "
    "<hasAirTemperatureMesurement>(Y, T)) on X with count(T) as Z .",
    "<hasMedianAirTemperatureMeasurementNearby>(X, Z) :- aggregate( <hasNeighbour>(X, Y) and "
    "<hasAirTemperatureMesurement>(Y, T)) on X with Med(T) as Z .",
    "<SensorAnomalyWindTurbine>(X) :- <hasMedianAirTemperatureMeasurementNearby>(X, M) and "
    "<MoreThan3Neighbours>(X) and <hasAirTemperatureMesurement>(X, T) and "
    "bind(abs(T-M) as D) and Comp(D, >, 5) .",
    "<neighbourMaxPlus1>(X, Y) :- bind(Z+1 as Y) and <neighbourMax>(X, Z) .",
    "<x>(X, E) :- <hasEnergyProduction>(X, E) and "
    "<http://www.w3.org/1999/02/22-rdf-syntax-ns#type>(X, <EnergyFarm>) and not "
    "<http://www.w3.org/1999/02/22-rdf-syntax-ns#type>(X, <SolarFarm>) .",
    "path(X, Y) :- edge(X, Y), not blocked(Y), X != Y.",
    "r3: <p11>(X, Y) :- <p11>(X, Z) and <p11>(Z, Y) and COMP(X, !=, Y) .",
    "@prefix ex: <http://example.org/> .\nex:knows(X, Y) :- ex:knows(Y, X) .",
]


@pytest.mark.parametrize("text", ZODIAC_EXAMPLES)
def test_examples_parse_and_print_back(text: str) -> None:
    program = parse_program("# comment\n" + text)
    assert len(program.rules) == 1
    assert parse_program(str(program)) == program


def test_whole_example_file(tmp_path) -> None:
    path = tmp_path / "rules.dl"
    path.write_text("# comment\n" + "\n".join(ZODIAC_EXAMPLES) + "\nedge(a, b) .\n")
    program = parse_file(path)
    assert len(program.rules) == len(ZODIAC_EXAMPLES)
    assert program.facts == (atom("edge", "a", "b"),)


def test_recursive_rule_with_comparison() -> None:
    rule = only_rule("<p11>(X, Y) :- <p11>(X, Z) and <p11>(Z, Y) and COMP(X, !=, Y) .")
    assert rule == Rule(
        atom("p11", X, Y),
        (atom("p11", X, Z), atom("p11", Z, Y), Comparison(X, "!=", Y)),
    )


def test_negation_with_existential_variable() -> None:
    rule = only_rule("<p20>(X, Y) :- <p12>(X, Y)  and not <p13>(Y, Z) .")
    assert rule.body == (atom("p12", X, Y), Negation(atom("p13", Y, Z)))


def test_aggregate() -> None:
    rule = only_rule(ZODIAC_EXAMPLES[4])
    assert rule == Rule(
        atom("hasMedianAirTemperatureMeasurementNearby", X, Z),
        (
            Aggregate(
                body=(atom("hasNeighbour", X, Y), atom("hasAirTemperatureMesurement", Y, T)),
                group_by=(X,),
                function="med",
                argument=T,
                result=Z,
            ),
        ),
    )


def test_bind_with_function_and_comp_keyword_case() -> None:
    rule = only_rule(ZODIAC_EXAMPLES[5])
    assert rule.body[3:] == (
        Bind(Call("abs", (BinaryOp("-", T, M),)), D),
        Comparison(D, ">", Constant(5)),
    )


def test_rdf_type_atoms_become_unary() -> None:
    rule = only_rule(ZODIAC_EXAMPLES[7])
    assert rule.body == (
        atom("hasEnergyProduction", X, Variable("E")),
        atom("EnergyFarm", X),
        Negation(atom("SolarFarm", X)),
    )
    assert only_rule("p(X) :- q(X), rdf:type(X, <C>).").body[1] == atom("C", X)


def test_plain_datalog() -> None:
    rule = only_rule("path(X, Y) :- edge(X, Y), not blocked(Y), X != Y.")
    assert rule == Rule(
        atom("path", X, Y),
        (atom("edge", X, Y), Negation(atom("blocked", Y)), Comparison(X, "!=", Y)),
    )


def test_label_and_prefixes() -> None:
    assert only_rule(ZODIAC_EXAMPLES[9]).label == "r3"
    rule = only_rule(ZODIAC_EXAMPLES[10])
    assert rule.head == atom("http://example.org/knows", X, Y)
    sparql = only_rule("PREFIX ex: <http://e/>\nprefix : <http://d/>\nex:p(X) :- :q(X) .")
    assert sparql.head == atom("http://e/p", X)
    assert sparql.body == (atom("http://d/q", X),)
    assert only_rule("xsd:p(X) :- rdfs:q(X), owl:r(X) .").head == atom(XSD + "p", X)
    assert only_rule("rule-1.a: p(X) :- q(X) .").label == "rule-1.a"


def test_fact_with_every_kind_of_value() -> None:
    text = '<p>("str", "chat"@fr, "5"^^<http://www.w3.org/2001/XMLSchema#integer>, -3.5e2, true) .'
    program = parse_program(text)
    assert program.rules == ()
    assert program.facts == (
        atom("p", Literal("str"), Literal("chat", None, "fr"), 5, -350.0, True),
    )
    assert program.facts[0].terms[2].value.__class__ is int
    assert parse_program("edge(a, b) .").facts == (atom("edge", "a", "b"),)


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("42", 42),
        ("-7", -7),
        ("2.5", 2.5),
        ("1e3", 1000.0),
        ("-1.5E-2", -0.015),
        ("true", True),
        ("false", False),
        ("a", "a"),
        ("<http://x/y#z>", "http://x/y#z"),
        ("xsd:integer", XSD + "integer"),
        ('"a\\"b\\\\c\\n\\t\\r\\u00e9\\U0001F600"', Literal('a"b\\c\n\t\ré\U0001f600')),
        ('"x"^^xsd:integer', Literal("x", XSD + "integer")),  # ill-typed stays a literal
        ('"5"^^xsd:int', 5),
        ('"2.5"^^xsd:decimal', 2.5),
        ('"1"^^xsd:boolean', True),
        ('"s"^^xsd:string', Literal("s")),
        ('"2020-01-01"^^xsd:date', Literal("2020-01-01", XSD + "date")),
        ('"hi"@en-GB', Literal("hi", None, "en-GB")),
    ],
)
def test_constants(text: str, value: object) -> None:
    fact = parse_program(f"p({text}).").facts[0]
    assert fact.terms == (Constant(value),)
    assert type(fact.terms[0].value) is type(value)


@pytest.mark.parametrize("lexical", ["INF", "-INF", "NaN", "+INF"])
def test_non_finite_doubles_are_refused_where_they_are_written(lexical: str) -> None:
    """NaN equals nothing, not even itself, so it cannot be a term; INF is refused with it
    (docs/semantics.md). The error names the literal's line and column."""
    with pytest.raises(ParseError, match=r"<text>:1:3: not a finite number"):
        parse_program(f'p("{lexical}"^^xsd:double).')


@pytest.mark.parametrize(("text", "column"), [("p(1e400).", 3), ("q(X) :- p(X), X > -2E999 .", 19)])
def test_numbers_too_large_for_a_double_are_refused_where_they_are_written(
    text: str, column: int
) -> None:
    """A number literal past a double's range would be an infinity (refused as a term, as
    NaN and INF are): the error names its line and column, as any syntax error does."""
    with pytest.raises(ParseError, match=rf"<text>:1:{column}: not a finite number"):
        parse_program(text)


def test_variables() -> None:
    rule = only_rule("p(?x, _Foo, _1, Éa) :- q(?x, _Foo, _1, Éa) .")
    assert rule.head.terms == tuple(Variable(n) for n in ("?x", "_Foo", "_1", "Éa"))


def test_anonymous_variables_are_fresh_and_avoid_user_names() -> None:
    rule = only_rule("p(X) :- q(X, _, _), not r(X, _) .")
    assert rule.body == (
        atom("q", X, Variable("_1"), Variable("_2")),
        Negation(atom("r", X, Variable("_3"))),
    )
    rule = only_rule("p(X, _1) :- q(X, _, _1) .")
    assert rule.body == (atom("q", X, Variable("_2"), Variable("_1")),)
    # numbering restarts in every rule
    program = parse_program("p(X) :- q(X, _) .\np(X) :- r(X, _) .")
    assert [r.body[0].terms[1] for r in program.rules] == [Variable("_1"), Variable("_1")]


def test_expression_precedence_and_associativity() -> None:
    rule = only_rule("p(Y) :- q(A, B, C), bind(A - B - C * 2 / A + -B as Y) .")
    a, b, c = Variable("A"), Variable("B"), Variable("C")
    expected = BinaryOp(
        "+",
        BinaryOp("-", BinaryOp("-", a, b), BinaryOp("/", BinaryOp("*", c, Constant(2)), a)),
        BinaryOp("-", Constant(0), b),
    )
    assert rule.body[1] == Bind(expected, Variable("Y"))


def test_minus_before_a_number() -> None:
    body = only_rule("p(Y) :- q(Z), bind(Z-1 as Y), Z > -1, Z - -2 < 3, -(4) < Z .").body
    assert body[1] == Bind(BinaryOp("-", Z, Constant(1)), Y)
    assert body[2] == Comparison(Z, ">", Constant(-1))
    assert body[3] == Comparison(BinaryOp("-", Z, Constant(-2)), "<", Constant(3))
    assert body[4] == Comparison(Constant(-4), "<", Z)
    body = only_rule("p(X) :- q(X) and X > 1 and -1 < X .").body
    assert body[2] == Comparison(Constant(-1), "<", X)


def test_functions_and_comparisons() -> None:
    body = only_rule(
        "p(X) :- q(X), ABS(X) >= 3, MAX(X, 2, 1) == 5, comp(sqrt(X), <>, round(X)), "
        "X <= floor(X) + ceil(X), min(X, 1) < 2, max(X, Y) ."
    ).body
    assert body[1] == Comparison(Call("abs", (X,)), ">=", Constant(3))
    assert body[2] == Comparison(Call("max", (X, Constant(2), Constant(1))), "=", Constant(5))
    assert body[3] == Comparison(Call("sqrt", (X,)), "!=", Call("round", (X,)))
    assert body[4].op == "<="
    assert body[5] == Comparison(Call("min", (X, Constant(1))), "<", Constant(2))
    assert body[6] == atom("max", X, Y)  # not followed by an operator: an atom


@pytest.mark.parametrize("op", COMPARISON_OPERATORS)
def test_every_comparison_operator(op: str) -> None:
    assert only_rule(f"p(X) :- q(X), COMP(X, {op}, 1), X {op} 2 .").body[1:] == (
        Comparison(X, op, Constant(1)),
        Comparison(X, op, Constant(2)),
    )


def test_keywords_are_case_insensitive() -> None:
    rule = only_rule(
        "p(X, Z) :- AGGREGATE( q(X, Y) AND NOT r(Y) And BIND(Y + 1 AS W) ) ON X WITH SUM(W) AS Z "
        "and Z > 1 ."
    )
    aggregate = rule.body[0]
    assert isinstance(aggregate, Aggregate)
    assert aggregate.function == "sum" and aggregate.group_by == (X,)
    assert aggregate.body[1] == Negation(atom("r", Y))


def test_aggregate_without_group_and_with_several_groups() -> None:
    rule = only_rule("total(S) :- aggregate(v(X, V)) with sum(V) as S .")
    assert rule.body[0].group_by == ()
    rule = only_rule(
        "c(X, Y, N) :- aggregate(e(X, Y, W)) on X, Y with count(W) as N, bind(N * 2 as K), K > 1 ."
    )
    assert rule.body[0].group_by == (X, Y)
    assert rule.body[1] == Bind(BinaryOp("*", Variable("N"), Constant(2)), Variable("K"))


def test_parse_atom() -> None:
    assert parse_atom("<p11>(X, Y)") == atom("p11", X, Y)
    assert parse_atom("edge(a, X).") == atom("edge", "a", X)
    assert parse_atom("rdf:type(X, <C>)") == atom("C", X)
    # (a pattern's ``_`` stays anonymous: each matches on its own, see MaterialisedView.query)
    assert parse_atom("q(_, X, _)") == atom("q", Variable("_"), X, Variable("_"))
    assert parse_atom("ex:p(X)", prefixes={"ex": "http://e/"}) == atom("http://e/p", X)
    with pytest.raises(ParseError, match="expected end of input after the atom, found 'q'"):
        parse_atom("p(X) q(X)")


def test_comments_crlf_and_bom() -> None:
    text = "\ufeff# a comment\r\np(X) :- q(X) . # trailing\r\n# last"
    assert len(parse_program(text).rules) == 1
    assert parse_program("") == Program()


def test_rdf_type_with_variable_class_is_refused() -> None:
    with pytest.raises(RuleError, match=r"<text>:1:30: rdf:type with a variable class") as info:
        parse_program("p(X) :- q(X, C), rdf:type(X, C) .")
    assert "write <C>(X) per class" in str(info.value)
    with pytest.raises(RuleError, match="must be an IRI, not 5"):
        parse_program("p(X) :- q(X), rdf:type(X, 5) .")


def test_duplicate_labels() -> None:
    same = "r1: p(X) :- q(X) .\nr1: p(X) :- q(X) ."
    assert len(parse_program(same).rules) == 2
    with pytest.raises(RuleError, match=r"<text>:2:1: duplicate rule label 'r1'"):
        parse_program("r1: p(X) :- q(X) .\nr1: p(X) :- s(X) .")


def test_unsafe_rules_are_refused_with_location() -> None:
    with pytest.raises(UnsafeRuleError) as info:
        parse_program("p(X) :- q(X) .\n\n  p(X, Y) :- q(X) .", source="rules.dl")
    message = str(info.value)
    assert message.startswith(
        "rules.dl:3:3: unsafe rule: variable Y of the head is not bound by a positive atom"
    )
    assert "in rule: <p>(X, Y) :- <q>(X) ." in message
    with pytest.raises(UnsafeRuleError, match=r"<text>:1:1: a fact must be ground.*variables X"):
        parse_program("edge(X, b) .")


# --- syntax errors ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "line", "column", "message"),
    [
        # missing '.'
        ("p(X) :- q(X)", 1, 13, "expected 'and', ',' or '.' after body item, found end of input"),
        (
            "p(X) :- q(X)\nr(X) :- s(X).",
            2,
            1,
            "expected 'and', ',' or '.' after body item, found 'r'",
        ),
        ("edge(a, b)", 1, 11, "expected ':-', ',' or '.' after a head atom, found end of input"),
        ("@prefix ex: <http://e/>\np(X) :- q(X).", 2, 1, "expected '.' after @prefix declaration"),
        # unbalanced parentheses
        ("p(X :- q(X).", 1, 5, "expected ')' or ',' after term, found ':-'"),
        ("p(X) :- q(X and r(X).", 1, 13, "expected ')' or ',' after term, found 'and'"),
        ("p(X) :- q(X)).", 1, 13, "expected 'and', ',' or '.' after body item, found ')'"),
        (
            "p(X) :- q(X), COMP((X + 1, <, 2).",
            1,
            26,
            "expected ')' to close the '(' at line 1, column 20, found ','",
        ),
        ("p(X) :- q(X), bind(abs(X as Y).", 1, 26, "expected ')' or ',' after an argument of abs"),
        # comparison operators
        ("p(X) :- q(X), COMP(X, =>, 1).", 1, 23, "unknown comparison operator '=>'"),
        ("p(X) :- q(X), X =< 1.", 1, 17, "unknown comparison operator '=<'"),
        ("p(X) :- q(X), COMP(X, 1, 2).", 1, 23, "expected a comparison operator"),
        ("p(X) :- q(X), X + 1.", 1, 20, "expected a comparison operator"),
        # prefixes
        ("foo:bar(X) :- q(X).", 1, 1, "unknown prefix 'foo:'"),
        ("p(X) :-\n  q(X, ex:a).", 2, 8, "unknown prefix 'ex:'"),
        ("@base <http://x/> .", 1, 1, "unknown directive '@base'"),
        # aggregates
        (
            "p(X, Z) :- aggregate(q(X, T)) on X with mean(T) as Z.",
            1,
            41,
            "unknown aggregate function 'mean'; expected one of count, sum, min, max, avg, med",
        ),
        ("p(X, Z) :- aggregate(q(X, T)) on X count(T) as Z.", 1, 36, "expected 'with'"),
        ("p(X, Z) :- aggregate(q(X, T)) with count(T) Z.", 1, 45, "expected 'as'"),
        (
            "p(Z) :- aggregate(q(X) and aggregate(r(X)) with count(X) as W) with count(X) as Z.",
            1,
            28,
            "an aggregate cannot contain another aggregate",
        ),
        # strings
        ('p(X) :- q(X, "a\\qb").', 1, 16, "bad string escape '\\q'"),
        ('p(X) :- q(X, "a\\u12").', 1, 16, "bad string escape '\\u': expected 4 hex digits"),
        ('p(X) :- q(X, "abc).\nr(a).', 1, 14, "unterminated string"),
        ('p(X) :- q(X, "a"^^5).', 1, 19, "expected a datatype"),
        # garbage
        ("p(X) :- q(X) & r(X).", 1, 14, "unexpected character '&'"),
        ("p(X) :-\n  q(X) and\n  r(X) and ~s(X).", 3, 12, "unexpected character '~'"),
        ("p(X) :- q(X) and .", 1, 18, "expected a body item"),
        ("p(X) :- .", 1, 9, "expected a body item"),
        ("X(a) :- q(a).", 1, 1, "a variable cannot be a predicate"),
        ("p(X) :- X(a).", 1, 9, "a variable cannot be a predicate"),
        ("p() :- q(a).", 1, 3, "expected a term"),
        # functions, binds, anonymous variables, facts
        ("p(X) :- q(X), bind(round(X, 2) as Y).", 1, 20, "round takes exactly 1 argument, got 2"),
        ("p(X) :- q(X), bind(max(X) as Y).", 1, 20, "max takes at least 2 arguments, got 1"),
        ("p(X) :- q(X), bind(foo(X) as Y).", 1, 20, "unknown function 'foo'"),
        ("p(X) :- q(X), bind(X + 1 as 3).", 1, 29, "expected a variable after 'as' in bind"),
        ("p(X) :- q(X), bind(X + 1 Y).", 1, 26, "expected 'as' after the bind expression"),
        ("p(_) :- q(X).", 1, 3, "the anonymous variable '_' is only allowed in body atoms"),
        ("p(X) :- q(X), _ > 1.", 1, 15, "the anonymous variable '_' is only allowed in body atoms"),
        ("r1: edge(a, b).", 1, 1, "a fact cannot have a label"),
    ],
)
def test_syntax_errors(text: str, line: int, column: int, message: str) -> None:
    with pytest.raises(ParseError) as info:
        parse_program(text, source="rules.dl")
    error = info.value
    assert (error.source, error.line, error.column) == ("rules.dl", line, column), error
    assert message in error.reason
    assert str(error).startswith(f"rules.dl:{line}:{column}: ")


def test_first_error_in_text_order_wins() -> None:
    # the lexical error on line 2 must not hide the syntax error on line 1
    with pytest.raises(ParseError) as info:
        parse_program("p(X) :- q(X) r(X).\np(X) :- q(X) & r(X).")
    assert (info.value.line, info.value.column) == (1, 14)


def test_parse_file_names_the_path(tmp_path) -> None:
    path = tmp_path / "bad.dl"
    path.write_text("p(X) :- q(X).\np(X) :- q(X) r(X).\n", encoding="utf-8")
    with pytest.raises(ParseError) as info:
        parse_file(str(path))
    assert info.value.source == str(path)
    assert info.value.line == 2
    path.write_bytes(b"p(X) :- q(X).\n\xff")
    with pytest.raises(ParseError, match="not valid UTF-8") as info:
        parse_file(path)
    assert (info.value.line, info.value.column) == (2, 1)


def test_literal_value() -> None:
    assert literal_value("7", XSD + "nonNegativeInteger") == 7
    assert literal_value("+7", XSD + "integer") == 7
    assert literal_value("7.0", XSD + "integer") == Literal("7.0", XSD + "integer")
    assert literal_value(" 7", XSD + "integer") == Literal(" 7", XSD + "integer")
    assert literal_value("1_0", XSD + "double") == Literal("1_0", XSD + "double")
    assert literal_value("false", XSD + "boolean") is False
    assert literal_value("yes", XSD + "boolean") == Literal("yes", XSD + "boolean")
    assert literal_value("x", None, "en") == Literal("x", None, "en")


def test_ten_thousand_rules_parse() -> None:
    """A large bundle parses whole and right. Its speed is measured by
    ``python -m simulations.bench.parse``, not here: a wall-clock bound fails on slow machines."""
    program = parse_program(bundle_text(10_000))
    assert len(program.rules) == 10_000
    assert [rule.label for rule in program.rules[:3]] == ["r0", "r1", "r2"]
    last = program.rules[-1]
    assert last.label == "r9999"
    assert str(last) == str(parse_program(str(last)).rules[0])
    assert "COMP(W, >, 9999)" in str(last)


# --- round trip: str(program) parses back to the same program ---------------------------------

_IRI_CHARS = st.characters(
    blacklist_categories=("Cs", "Cc", "Zs", "Zl", "Zp"),
    blacklist_characters='<>"{}|^`\\',
)
iris = st.one_of(
    st.text(_IRI_CHARS, min_size=1, max_size=10),
    st.sampled_from(["a", "windTurbine1", "http://example.org/p#x", "urn:x:1", "-1", "true"]),
)
languages = st.from_regex(r"[A-Za-z]{1,8}(-[A-Za-z0-9]{1,8}){0,2}", fullmatch=True)
datatypes = st.one_of(
    st.sampled_from([XSD + "dateTime", "http://example.org/dt", "geo:wktLiteral"]),
    st.text(_IRI_CHARS, min_size=1, max_size=8).map(lambda s: "http://dt/" + s),
)
lexicals = st.text(
    st.one_of(
        st.sampled_from('"\\\n\r\t\x0b\x85\u2028#.'), st.characters(blacklist_categories=("Cs",))
    )
)
literals = st.one_of(
    st.builds(Literal, lexicals),
    st.builds(Literal, lexicals, st.none(), languages),
    st.builds(Literal, lexicals, datatypes),
)
numbers = st.one_of(st.integers(), st.floats(allow_nan=False, allow_infinity=False))
values = st.one_of(iris, numbers, st.booleans(), literals)
constants = values.map(Constant)
VARIABLE_NAMES = ["X", "Y", "Z", "W", "?x", "?y_1", "_A", "_1", "Éa", "On", "With", "Not", "As"]
predicates = iris.filter(lambda p: p != RDF_TYPE)
labels = st.from_regex(r"[A-Za-z_][A-Za-z0-9_.\-]{0,8}", fullmatch=True)


def _terms(draw: st.DrawFn, variables: list[Variable], arity: int) -> tuple:
    choices = st.sampled_from(variables) | constants if variables else constants
    return tuple(draw(choices) for _ in range(arity))


def _atoms(draw: st.DrawFn, variables: list[Variable]) -> Atom:
    return Atom(draw(predicates), _terms(draw, variables, draw(st.integers(1, 3))))


def _expressions(variables: list[Variable]) -> st.SearchStrategy:
    leaves = st.sampled_from(variables) | constants if variables else constants
    leaves = st.one_of(leaves, numbers.map(Constant))

    def extend(children: st.SearchStrategy) -> st.SearchStrategy:
        return st.one_of(
            st.builds(BinaryOp, st.sampled_from("+-*/"), children, children),
            st.builds(
                lambda f, a: Call(f, (a,)),
                st.sampled_from(["abs", "round", "floor", "ceil", "sqrt"]),
                children,
            ),
            st.builds(
                Call,
                st.sampled_from(["min", "max"]),
                st.lists(children, min_size=2, max_size=3).map(tuple),
            ),
        )

    return st.recursive(leaves, extend, max_leaves=6)


def _once(terms: tuple, existential: list[Variable]) -> tuple:
    """Replace repeated existential variables by a constant: each may occur only once."""
    seen: set = set()
    kept = []
    for term in terms:
        kept.append(Constant("c") if term in existential and term in seen else term)
        seen.add(term)
    return tuple(kept)


def _safe_items(draw: st.DrawFn, tag: str) -> tuple[list, list[Variable]]:
    """Positive atoms, negations (with existential variables used once), comparisons and binds
    over bound variables; returns the items and the variables they bind."""
    pool = [Variable(n) for n in draw(st.permutations(VARIABLE_NAMES))[:4]]
    positives = [_atoms(draw, pool) for _ in range(draw(st.integers(1, 3)))]
    bound = list(dict.fromkeys(v for a in positives for v in a.terms if isinstance(v, Variable)))
    items: list = list(positives)
    for n in range(draw(st.integers(0, 2))):
        existential = [Variable(f"E{tag}{n}_{k}") for k in range(2)]
        negated = _atoms(draw, bound + existential)
        items.append(Negation(Atom(negated.predicate, _once(negated.terms, existential))))
    for n in range(draw(st.integers(0, 2))):
        variable = Variable(f"B{tag}{n}")
        items.append(Bind(draw(_expressions(bound)), variable))
        bound.append(variable)
    for _ in range(draw(st.integers(0, 2))):
        ops = st.sampled_from(COMPARISON_OPERATORS)
        items.append(Comparison(draw(_expressions(bound)), draw(ops), draw(_expressions(bound))))
    return draw(st.permutations(items)), bound


@st.composite
def plain_rules(draw: st.DrawFn) -> Rule:
    body, bound = _safe_items(draw, "")
    head = Atom(draw(predicates), _terms(draw, bound, draw(st.integers(1, 3))))
    return Rule(head, tuple(body))


@st.composite
def aggregate_rules(draw: st.DrawFn) -> Rule:
    inner, bound = _safe_items(draw, "i")
    group = draw(st.lists(st.sampled_from(bound), unique=True, max_size=2)) if bound else []
    argument = draw(st.sampled_from(bound) | constants) if bound else draw(constants)
    result = Variable("Res")
    function = draw(st.sampled_from(AGGREGATE_FUNCTIONS))
    aggregate = Aggregate(tuple(inner), tuple(group), function, argument, result)
    scope = [*group, result]
    items: list = [aggregate]
    if draw(st.booleans()):
        items.append(Bind(draw(_expressions(scope)), Variable("Top")))
        scope.append(Variable("Top"))
    if draw(st.booleans()):
        items.append(Comparison(draw(_expressions(scope)), "<", draw(_expressions(scope))))
    head = Atom(draw(predicates), _terms(draw, scope, draw(st.integers(1, 3))))
    return Rule(head, tuple(draw(st.permutations(items))))


@st.composite
def programs(draw: st.DrawFn) -> Program:
    rules = draw(st.lists(plain_rules() | aggregate_rules(), max_size=4))
    names = draw(st.lists(labels, unique=True, min_size=len(rules), max_size=len(rules)))
    rules = [
        Rule(r.head, r.body, name if draw(st.booleans()) else None)
        for r, name in zip(rules, names, strict=True)
    ]
    facts = draw(
        st.lists(
            st.builds(Atom, predicates, st.lists(constants, min_size=1, max_size=3).map(tuple)),
            max_size=4,
        )
    )
    return Program(tuple(rules), tuple(facts))


@given(programs())
def test_round_trip(program: Program) -> None:
    text = str(program)
    assert parse_program(text) == program, text


@given(values)
def test_round_trip_of_single_values(value: object) -> None:
    fact = Atom("p", (Constant(value),))
    assert parse_program(f"{fact} .").facts == (fact,)


def test_parse_benchmark_prints_its_ratio(capsys) -> None:
    from simulations.bench import parse as parse_bench

    assert parse_bench.main(["--rules", "200", "--repeat", "1"]) == 0
    out = capsys.readouterr().out
    assert "200 rules" in out and "parse / tokenize" in out
