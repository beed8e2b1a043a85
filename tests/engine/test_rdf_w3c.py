"""The W3C RDF 1.1 N-Triples and Turtle test suites (tests/data/w3c/, with their licence) through
``read_facts`` and ``Reasoner.add_facts``.

Every positive case (syntax and evaluation) must load to the facts rdflib reads from it (the
reader ZodiacEdge used before pyoxigraph; blank nodes up to renaming), every negative case must
be refused with one ParseError line naming the file, line and column, and a reasoner given a
bad file must be left exactly as it was. The N-Triples suite is read as strict N-Triples (the
format ``n-triples``); a ``.nt`` file given without a format is read as Turtle (ZodiacEdge's own
``.nt`` files hold relative IRIs and bare numbers), which accepts the negative cases listed in
``TURTLE_ACCEPTS``, checked here too.
"""

from __future__ import annotations

from contextlib import suppress
from pathlib import Path

import pytest
import rdflib
from rdflib.compare import isomorphic

from agent.engine.errors import ParseError
from agent.engine.program import rdf
from agent.engine.program.rdf import read_facts
from agent.engine.reasoner import Reasoner

SUITES = Path(__file__).parent.parent / "data" / "w3c"
MF = rdflib.Namespace("http://www.w3.org/2001/sw/DataAccess/tests/test-manifest#")
RDFT = rdflib.Namespace("http://www.w3.org/ns/rdftest#")

# Negative N-Triples cases that are valid Turtle, so accepted when a .nt file is read without a
# format (as Turtle): prefixes, bases, relative IRIs, bare numbers, ``,`` lists, long strings.
TURTLE_ACCEPTS = {
    "nt-syntax-bad-base-01.nt",
    "nt-syntax-bad-num-01.nt",
    "nt-syntax-bad-num-02.nt",
    "nt-syntax-bad-num-03.nt",
    "nt-syntax-bad-prefix-01.nt",
    "nt-syntax-bad-string-02.nt",
    "nt-syntax-bad-string-03.nt",
    "nt-syntax-bad-string-04.nt",
    "nt-syntax-bad-string-05.nt",
    "nt-syntax-bad-struct-01.nt",
    "nt-syntax-bad-uri-06.nt",
    "nt-syntax-bad-uri-07.nt",
    "nt-syntax-bad-uri-08.nt",
    "nt-syntax-bad-uri-09.nt",
}
# Positive cases where rdflib, the reference, is itself wrong, and what it does: compared with
# the suite's expected N-Triples (as rdflib reads them) instead, or with rdflib's Turtle reader.
_RESOLVES = "rdflib resolves relative references against @base unlike RFC 3986"
RDFLIB_WRONG = {
    "IRI-resolution-01.ttl": _RESOLVES,
    "IRI-resolution-02.ttl": _RESOLVES,
    "IRI-resolution-07.ttl": _RESOLVES,
    "IRI-resolution-08.ttl": _RESOLVES,
    "literal_with_CARRIAGE_RETURN.ttl": "rdflib reads the escape \\r as a line feed",
    "minimal_whitespace.nt": "rdflib's N-Triples reader refuses it (its Turtle reader takes it)",
}


def cases(suite: str) -> list[tuple[str, str, str | None]]:
    """(kind, action file, result file or None) of every entry of a suite's manifest."""
    graph = rdflib.Graph().parse(SUITES / suite / "manifest.ttl", format="turtle")
    found = []
    for test in set(graph.subjects(MF.action, None)):
        kind = str(graph.value(test, rdflib.RDF.type)).rsplit("#", 1)[-1]
        action = str(graph.value(test, MF.action)).rsplit("/", 1)[-1]
        result = graph.value(test, MF.result)
        found.append((kind, action, str(result).rsplit("/", 1)[-1] if result else None))
    return sorted(found, key=lambda case: case[1])


NTRIPLES = cases("rdf-n-triples")
TURTLE = cases("rdf-turtle")
RESULTS = {action: result for _, action, result in TURTLE if result}


def test_the_suites_are_all_here() -> None:
    """(the numbers the suites' READMEs and manifests give: nothing lost on the way in)"""
    assert len(NTRIPLES) == 70 and len(TURTLE) == 313
    for suite, entries in (("rdf-n-triples", NTRIPLES), ("rdf-turtle", TURTLE)):
        for _, action, result in entries:
            assert (SUITES / suite / action).is_file()
            assert result is None or (SUITES / suite / result).is_file()
    assert (SUITES / "LICENSE").is_file() and (SUITES / "LICENSE.md").is_file()


def as_graph(facts: list[tuple]) -> rdflib.Graph:
    """Facts as an rdflib graph in which only blank nodes are blank, for ``isomorphic``: every
    other value becomes a node naming its Python type and value, so equal graphs hold equal
    engine values (``5`` is not ``5.0``'s type, an IRI is not a literal)."""
    graph = rdflib.Graph()

    def node(value: object) -> rdflib.term.Node:
        if isinstance(value, str) and value.startswith("_:"):
            return rdflib.BNode(value[2:])
        return rdflib.Literal(f"{type(value).__name__}:{value!r}")

    for predicate, subject, obj in facts:
        graph.add((node(subject), rdflib.URIRef("p:" + predicate), node(obj)))
    return graph


def rdflib_facts(path: Path, rdflib_format: str) -> list[tuple]:
    """What the rdflib reader (kept for RDF/XML, N3, JSON-LD) makes of a file."""
    return list(rdf._parse_rdflib(path.read_bytes(), rdflib_format, str(path)))


POSITIVE = ("TestNTriplesPositiveSyntax", "TestTurtlePositiveSyntax", "TestTurtleEval")
positive = [
    pytest.param("rdf-n-triples", action, "n-triples", "nt", id=action)
    for kind, action, _ in NTRIPLES
    if kind in POSITIVE
] + [
    pytest.param("rdf-turtle", action, "turtle", "turtle", id=action)
    for kind, action, _ in TURTLE
    if kind in POSITIVE
]
negative = [
    pytest.param("rdf-n-triples", action, "n-triples", id=action)
    for kind, action, _ in NTRIPLES
    if "Negative" in kind
] + [
    pytest.param("rdf-turtle", action, "turtle", id=action)
    for kind, action, _ in TURTLE
    if "Negative" in kind
]


@pytest.mark.parametrize(("suite", "action", "format", "rdflib_format"), positive)
def test_a_positive_case_loads_as_rdflib_reads_it(suite, action, format, rdflib_format) -> None:
    path = SUITES / suite / action
    mine = list(read_facts(path, format=format))
    if action in RDFLIB_WRONG:  # (see there: the suite's result, or rdflib's Turtle reader)
        with suppress(ParseError):  # (the list stays honest: rdflib is wrong on each one)
            assert not isomorphic(as_graph(mine), as_graph(rdflib_facts(path, rdflib_format)))
        reference = path.with_name(RESULTS[action]) if action in RESULTS else path
        rdflib_format = "nt" if action in RESULTS else "turtle"
        assert isomorphic(as_graph(mine), as_graph(rdflib_facts(reference, rdflib_format)))
    else:
        assert isomorphic(as_graph(mine), as_graph(rdflib_facts(path, rdflib_format))), action
    if suite == "rdf-n-triples":  # (strict N-Triples is Turtle too: read so, the same facts)
        assert isomorphic(as_graph(list(read_facts(path))), as_graph(mine))
    reasoner = Reasoner()
    reasoner.add_facts(path)  # (as Turtle, by its extension)
    assert reasoner.count() == len(set(mine)) or suite == "rdf-n-triples"


@pytest.mark.parametrize(("suite", "action", "format"), negative)
def test_a_negative_case_is_refused_with_its_line_and_column(suite, action, format) -> None:
    path = SUITES / suite / action
    with pytest.raises(ParseError) as refused:
        read_facts(path, format=format)
    error = refused.value
    assert error.source == str(path) and error.line >= 1 and error.column >= 1, str(error)
    assert str(error).startswith(f"{path}:{error.line}:{error.column}: invalid RDF")
    assert "\n" not in str(error)


@pytest.mark.parametrize(("suite", "action", "format"), negative)
def test_a_reasoner_given_a_negative_case_is_left_as_it_was(suite, action, format) -> None:
    path = SUITES / suite / action
    reasoner = Reasoner()
    reasoner.add_facts([("http://e/p", "http://e/a", "http://e/b")])
    if action in TURTLE_ACCEPTS:  # (valid Turtle: a .nt file given without a format is)
        reasoner.add_facts(path)  # (a prefix or a base alone holds no fact)
        return
    with pytest.raises(ParseError, match=f"^{path}:"):
        reasoner.add_facts(path)
    assert sorted(reasoner.facts()) == [("http://e/p", "http://e/a", "http://e/b")]


def test_the_turtle_accepts_list_is_exact() -> None:
    """Every listed case is accepted as Turtle, every other negative N-Triples case refused."""
    accepted = set()
    for kind, action, _ in NTRIPLES:
        if "Negative" in kind:
            try:
                read_facts(SUITES / "rdf-n-triples" / action)
            except ParseError:
                continue
            accepted.add(action)
    assert accepted == TURTLE_ACCEPTS
