"""RDF reading (pyoxigraph; rdflib for RDF/XML) and N-Triples writing."""

from __future__ import annotations

import io

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.engine.errors import ParseError, ZodiacError
from agent.engine.language import RDF_TYPE, XSD, Literal
from agent.engine.program.parser import parse_program
from agent.engine.program.rdf import parse_facts, read_facts, write_ntriples

ZODIAC_DATA = """\
<windTurbine1> <hasAirTemperatureMesurement> 25 .
<windTurbine1> <hasNeighbour> <windTurbine2> .
<windTurbine2> <hasAirTemperatureMesurement> -3 .
<windTurbine2> <hasWindSpeed> 12.5 .
<windTurbine2> <http://www.w3.org/1999/02/22-rdf-syntax-ns#type> <WindTurbine> .
"""


def test_zodiac_style_nt_file(tmp_path) -> None:
    path = tmp_path / "data.nt"
    path.write_text(ZODIAC_DATA)
    facts = set(read_facts(path))
    assert facts == {
        ("hasAirTemperatureMesurement", "windTurbine1", 25),
        ("hasNeighbour", "windTurbine1", "windTurbine2"),
        ("hasAirTemperatureMesurement", "windTurbine2", -3),
        ("hasWindSpeed", "windTurbine2", 12.5),
        (RDF_TYPE, "windTurbine2", "WindTurbine"),
    }
    assert all(type(f[2]) is int for f in facts if f[0] == "hasAirTemperatureMesurement")


def test_relative_iris_match_rule_constants(tmp_path) -> None:
    """A data IRI and the same IRI written in a rule are the same string."""
    path = tmp_path / "data.nt"
    path.write_text("<a/b#c> <p> <#frag> .\n<x?y=1> <p> <> .\n")
    facts = set(read_facts(path))
    assert facts == {("p", "a/b#c", "#frag"), ("p", "x?y=1", "")}
    constant = parse_program("<p>(<a/b#c>, <#frag>) .").facts[0]
    assert tuple(t.value for t in constant.terms) == ("a/b#c", "#frag")


def test_turtle_with_prefixes_and_a(tmp_path) -> None:
    path = tmp_path / "data.ttl"
    path.write_text(
        "@prefix ex: <http://example.org/> .\n"
        "@prefix : <> .\n"
        "ex:t1 a ex:WindTurbine ; ex:temp 21, 22 ; ex:near :t2 .\n"
    )
    assert set(read_facts(path)) == {
        (RDF_TYPE, "http://example.org/t1", "http://example.org/WindTurbine"),
        ("http://example.org/temp", "http://example.org/t1", 21),
        ("http://example.org/temp", "http://example.org/t1", 22),
        ("http://example.org/near", "http://example.org/t1", "t2"),
    }


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ('"25"^^<http://www.w3.org/2001/XMLSchema#integer>', 25),
        ('"7"^^xsd:int', 7),
        ('"2.50"^^xsd:decimal', 2.5),
        ("2.50", 2.5),
        ("1e3", 1000.0),
        ('"1E3"^^xsd:double', 1000.0),
        ('"1.5"^^xsd:float', 1.5),
        ("true", True),
        ('"0"^^xsd:boolean', False),
        ('"plain"', Literal("plain")),
        ('"typed"^^xsd:string', Literal("typed")),
        ('"chat"@fr', Literal("chat", None, "fr")),
        ("'single'", Literal("single")),
        ('"a\\"b\\\\c\\nd\\u00e9"', Literal('a"b\\c\nd\u00e9')),
        ('"abc"^^xsd:integer', Literal("abc", XSD + "integer")),
        # lexical forms are kept as written, not normalised by rdflib
        ('"2020-01-01T00:00:00Z"^^xsd:dateTime', Literal("2020-01-01T00:00:00Z", XSD + "dateTime")),
        ('"01"^^<http://example.org/dt>', Literal("01", "http://example.org/dt")),
    ],
)
def test_literal_values(text: str, value: object) -> None:
    ttl = f"@prefix xsd: <{XSD}> .\n<s> <p> {text} ."
    ((predicate, subject, obj),) = list(parse_facts(ttl))
    assert (predicate, subject) == ("p", "s")
    assert obj == value
    assert type(obj) is type(value)


def test_blank_nodes_are_strings_consistent_within_a_file() -> None:
    facts = list(parse_facts("_:a <p> _:b .\n_:b <p> <x> .\n<y> <p> [ <q> 1 ] ."))
    by_subject = {f[1]: f for f in facts}
    assert all(isinstance(v, str) for f in facts for v in f[:2])
    (first,) = [f for f in facts if f[2] != "x" and f[1] != "y" and f[2] != 1]
    assert first[1].startswith("_:") and first[2].startswith("_:")
    assert by_subject[first[2]] == ("p", first[2], "x")
    (anonymous,) = [f for f in facts if f[1] == "y"]
    assert by_subject[anonymous[2]] == ("q", anonymous[2], 1)


def test_format_can_be_given(tmp_path) -> None:
    path = tmp_path / "data.txt"
    path.write_text("@prefix ex: <http://e/> .\nex:a ex:b 1 .\n")
    assert list(read_facts(path, format="turtle")) == [("http://e/b", "http://e/a", 1)]
    assert list(read_facts(path)) == [("http://e/b", "http://e/a", 1)]  # unknown: Turtle
    with pytest.raises(ValueError, match="unknown RDF format"):
        read_facts(path, format="no-such-format")


def test_rdf_xml_is_read_through_rdflib(tmp_path) -> None:
    path = tmp_path / "data.rdf"
    path.write_text(
        '<rdf:RDF xmlns:rdf="http://www.w3.org/1999/02/22-rdf-syntax-ns#" '
        'xmlns:ex="http://e/"><rdf:Description rdf:about="http://e/a">'
        '<ex:b rdf:datatype="http://www.w3.org/2001/XMLSchema#integer">5</ex:b>'
        "</rdf:Description></rdf:RDF>"
    )
    assert list(read_facts(path)) == [("http://e/b", "http://e/a", 5)]


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ('<a> <b> <c> .\n<a> <b> "unterminated .\n', 2),
        ("<a> <b> <c> .\n<a> <b> <c> <d> .\n", 2),
        ("<a> <b> <c> .\n\n<a> ex:b <c> .\n", 3),
        ("<a> <b> <c>\n", 1),
    ],
)
def test_malformed_file_gives_parse_error_with_file_and_line(
    tmp_path, text: str, line: int
) -> None:
    path = tmp_path / "broken.nt"
    path.write_text(text)
    with pytest.raises(ParseError) as info:
        read_facts(path)
    assert info.value.source == str(path)
    assert info.value.line == line
    assert str(info.value).startswith(f"{path}:{line}:")
    assert "invalid RDF" in info.value.reason
    assert info.value.column >= 1


@pytest.mark.parametrize("suffix", [".nt", ".ttl"])
def test_a_fact_file_that_is_not_utf8_names_the_line_and_column(tmp_path, suffix) -> None:
    """A Latin-1 file: rdflib's own error says "position 26" and line 0."""
    path = tmp_path / f"latin1{suffix}"
    path.write_bytes('<a> <p> <b> .\n<a> <p> "café" .\n'.encode("latin-1"))
    with pytest.raises(ParseError, match="not valid UTF-8") as info:
        read_facts(path)
    assert (info.value.source, info.value.line, info.value.column) == (str(path), 2, 13)


def test_malformed_text_gives_parse_error() -> None:
    with pytest.raises(ParseError) as info:
        parse_facts("<a> <b> <c> .\n<a> <b> <c> <d> .", source="upload")
    assert (info.value.source, info.value.line, info.value.column) == ("upload", 2, 13)


def test_write_ntriples_format() -> None:
    out = io.StringIO()
    facts = [
        ("hasAirTemperatureMesurement", "windTurbine1", 25),
        (RDF_TYPE, "windTurbine1", "WindTurbine"),
        ("p", "s", 2.5),
        ("p", "s", True),
        ("p", "s", Literal('say "hi"\n', None, "en")),
        ("p", "s", "_:b1"),
        ("p", "a b", "x"),
        ("r", "a", "b", "c"),  # arity 3: not a triple
        ("p", 5, "x"),  # a number cannot be a subject
    ]
    assert write_ntriples(facts, out) == 7
    assert out.getvalue().splitlines() == [
        f'<windTurbine1> <hasAirTemperatureMesurement> "25"^^<{XSD}integer> .',
        f"<windTurbine1> <{RDF_TYPE}> <WindTurbine> .",
        f'<s> <p> "2.5"^^<{XSD}decimal> .',
        f'<s> <p> "true"^^<{XSD}boolean> .',
        '<s> <p> "say \\"hi\\"\\n"@en .',
        "<s> <p> _:b1 .",
        "<a\\u0020b> <p> <x> .",
    ]


@pytest.mark.parametrize("lexical", ["INF", "-INF", "NaN"])
def test_a_non_finite_double_in_a_fact_file_is_refused_naming_the_file(tmp_path, lexical):
    path = tmp_path / "f.nt"
    path.write_text(f'<a> <p> "{lexical}"^^<http://www.w3.org/2001/XMLSchema#double> .\n')
    with pytest.raises(ZodiacError, match=f"{path}: not a finite number"):
        read_facts(path)


def test_write_then_read_round_trip(tmp_path) -> None:
    facts = {
        ("hasAirTemperatureMesurement", "windTurbine1", 25),
        ("hasAirTemperatureMesurement", "windTurbine1", -4),
        ("hasWindSpeed", "windTurbine1", 12.5),
        ("ok", "windTurbine1", False),
        (RDF_TYPE, "windTurbine1", "WindTurbine"),
        ("http://e/p", "http://e/s", Literal('é\t\x00\u2028 \\ "', XSD + "dateTime")),
        ("http://e/p", "http://e/s", Literal("x", None, "en-GB")),
        ("http://e/p", "http://e/s", Literal("")),
    }
    path = tmp_path / "out.nt"
    with open(path, "w", encoding="utf-8") as out:
        assert write_ntriples(sorted(facts, key=repr), out) == len(facts)
    assert set(read_facts(path)) == facts


def test_an_iri_no_iri_may_spell_is_written_escaped_and_refused_on_reading(tmp_path) -> None:
    """The engine's IRIs are any text; RDF's are not: a space or ``{`` is written as an
    escape, which the W3C suites say a reader must refuse (turtle-syntax-bad-uri-escape-01),
    so reading it back names the line and column."""
    path = tmp_path / "out.nt"
    with open(path, "w", encoding="utf-8") as out:
        write_ntriples([("p", "s", "o"), ("p", "iri with space>", "{weird}|^`")], out)
    with pytest.raises(ParseError, match="Invalid IRI code point") as info:
        read_facts(path)
    assert (info.value.line, info.value.column) == (2, 1)


def test_language_tags_are_lower_cased_in_data_and_rules() -> None:
    """BCP 47 tags compare case-insensitively: one term however a file or a rule writes it."""
    ((_, _, value),) = parse_facts('<s> <p> "x"@EN-gb .')
    assert value == Literal("x", None, "en-gb")
    constant = parse_program('<p>(<s>, "x"@en-GB) .').facts[0]
    assert constant.terms[1].value == value


relative_iris = st.from_regex(r"[A-Za-z0-9_][A-Za-z0-9_\-]{0,10}", fullmatch=True)
iris = st.one_of(
    relative_iris,
    relative_iris.map(lambda s: "http://example.org/" + s),
    # (what an IRI may hold, RFC 3987: not any text, see the test above)
    st.from_regex(r"[A-Za-z0-9._~\-/:@!$&'()*+,;=\u00e9\u4e2d]{0,8}", fullmatch=True).map(
        lambda s: "urn:x:" + s
    ),
)
values = st.one_of(
    iris,
    st.integers(),
    st.floats(allow_nan=False, allow_infinity=False),
    st.booleans(),
    st.builds(Literal, st.text(st.characters(blacklist_categories=("Cs",)))),
    st.builds(
        Literal,
        st.text(),
        st.none(),
        st.sampled_from(["en", "fr", "en-gb", "de-ch", "zh-hans", "es-419"]),  # (BCP 47 tags)
    ),
    st.builds(Literal, st.text(), iris.map(lambda s: "http://dt/" + s)),
)


@given(st.sets(st.tuples(iris, iris, values), max_size=8))
def test_round_trip_property(facts: set[tuple]) -> None:
    out = io.StringIO()
    assert write_ntriples(facts, out) == len(facts)
    assert set(parse_facts(out.getvalue())) == facts
