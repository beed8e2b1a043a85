"""Reading RDF facts (pyoxigraph; rdflib for RDF/XML, N3 and JSON-LD), and writing facts back
as N-Triples.

A fact is a tuple ``(predicate, subject, object)`` of Python values (see ``language.py``): IRIs
and blank nodes (``"_:label"``) are ``str``, numbers ``int``/``float``, booleans ``bool``, any
other literal a :class:`~agent.engine.language.Literal`. ``rdf:type`` triples are facts like any
other: ``(RDF_TYPE, x, C)`` is how the engine hands out a unary fact ``C(x)``.

Turtle and N-Triples go through pyoxigraph's parsers (Rust): about 15x faster than rdflib's,
and strict, so that the W3C test suites' negative cases are refused with a line and column
(tests/engine/test_rdf_w3c.py). ZodiacEdge's data files are named ``.nt`` but use relative IRIs
(``<windTurbine1>``) and bare numbers, which strict N-Triples refuses. N-Triples is a subset of
Turtle, so ``.nt`` files are read as Turtle; the format ``n-triples`` (or ``ntriples``,
``nt11``) asks for strict N-Triples. Relative IRIs must come out as written (``windTurbine1``,
the same constant a rule writes as ``<windTurbine1>``), not resolved against a ``file:`` URI, so
we parse against a private base IRI and strip it again afterwards. The one loss: resolving
removes leading dot segments, so ``<./a>`` and ``<../a>`` come out as ``a`` and ``</a>`` as
``a``.

Lexical forms are kept as written (``"...Z"^^xsd:dateTime`` is not normalised to ``+00:00``),
so that a data literal and the same literal written in a rule are one term; language tags are
lower-cased (they compare case-insensitively; ``literal_value`` does the same for rules). Blank
nodes get fresh labels in every file read (``_:a`` of two files are two nodes), consistent
within the file.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from collections import Counter
from collections.abc import Iterable, Iterator
from typing import TextIO

from agent.engine.errors import (
    NonFiniteError,
    NotTextError,
    ParseError,
    ZodiacError,
    decode_utf8,
    read_bytes,
)
from agent.engine.language import RDF_TYPE, XSD, Literal, Value
from agent.engine.program.parser import literal_value
from agent.engine.terms import check_value_text

__all__ = ["parse_facts", "read_facts", "write_ntriples"]

# A base no real data uses, with a path so that relative references resolve against it.
_RELATIVE_BASE = "x-zodiac-relative:/"
_TURTLE_NAMES = frozenset({"turtle", "ttl", "nt"})  # ("nt": ZodiacEdge's .nt files, Turtle)
_NTRIPLES_NAMES = frozenset({"nt11", "ntriples", "n-triples"})  # strict N-Triples
_EXTENSION_FORMATS = {
    ".nt": "turtle",
    ".ttl": "turtle",
    ".turtle": "turtle",
    ".n3": "n3",
    ".rdf": "xml",
    ".owl": "xml",
    ".xml": "xml",
    ".jsonld": "json-ld",
}
_normalize_lock = threading.Lock()
_RDFLIB_TERM_LOG = logging.getLogger("rdflib.term")

Fact = tuple[Value, ...]


def read_facts(path: str | os.PathLike[str], format: str | None = None) -> Iterator[Fact]:
    """Facts of an RDF file; the format is guessed from the extension (unknown: Turtle).

    The whole file is parsed before this returns, so a syntax error is raised here (as a
    ParseError naming the file) rather than halfway through the caller's loop.
    """
    source = os.fspath(path)
    if format is None:
        format = _EXTENSION_FORMATS.get(os.path.splitext(source)[1].lower(), "turtle")
    return _parse(read_bytes(path, "fact file"), format, source)


def parse_facts(text: str, format: str = "turtle", source: str = "<text>") -> Iterator[Fact]:
    """Facts of RDF text (Turtle, hence N-Triples, by default)."""
    # (surrogatepass: a lone surrogate, which no file can hold, is then reported at its place)
    return _parse(text.encode("utf-8", "surrogatepass"), format, source)


def write_ntriples(
    facts: Iterable[tuple[Value, ...]],
    out: TextIO,
    skipped: Counter[str] | None = None,
    base: str | None = None,
) -> int:
    """Write facts as N-Triples lines; return how many were written.

    N-Triples holds absolute IRIs only: with ``base``, an IRI without a scheme (``windTurbine1``,
    as ZodiacEdge's data writes them) is written as ``base`` + the IRI, so the output is valid
    N-Triples that any RDF reader takes (rdflib's ``nt`` parser included); without it they are
    written as they are (read back by :func:`read_facts`, which takes relative IRIs).

    A non-integer number is written as ``xsd:decimal`` (Turtle's bare ``1.5``, what sensor data
    writes), or ``xsd:double`` when only an exponent can spell it (``1e+300``, NaN, INF): the
    engine holds one kind of non-integer number, so a decimal read in comes back a decimal.

    ``(p, s, o)`` becomes ``s p o .`` and a 2-tuple ``(C, x)`` becomes ``x rdf:type C .``.
    Facts that are not triples (arity 3 or more), or whose subject or predicate is not an IRI
    (``p(5, x)`` is a Datalog fact but no RDF triple), are skipped: they cannot be expressed.
    ``skipped``, when given, counts them by relation (``name/arity``), so that a caller can
    say what the output leaves out. Reading the output back gives the same facts (blank-node
    labels aside).
    """
    written = 0
    for fact in facts:
        given = fact
        if len(fact) == 2:
            fact = (RDF_TYPE, fact[1], fact[0])
        if len(fact) != 3 or not _is_iri(fact[0]) or not isinstance(fact[1], str):
            if skipped is not None:  # (a class fact ``(rdf:type, x, C)`` is C's, unary)
                unary = len(given) == 3 and given[0] == RDF_TYPE
                skipped[f"{given[2]}/1" if unary else f"{given[0]}/{len(given) - 1}"] += 1
            continue
        predicate, subject, obj = fact
        if base is not None:
            predicate, subject = _absolute(predicate, base), _absolute(subject, base)
            if isinstance(obj, str):
                obj = _absolute(obj, base)
        out.write(f"{_format_node(subject)} <{_escape_iri(predicate)}> {_format_object(obj)} .\n")
        written += 1
    return written


# --- reading ------------------------------------------------------------------------------


def _parse(data: bytes, format: str, source: str) -> Iterator[Fact]:
    name = format.lower()
    if name in _TURTLE_NAMES or name in _NTRIPLES_NAMES:
        decode_utf8(data, source)  # (UTF-8 by definition; this names the line and column)
        return iter(_parse_oxigraph(data, name in _NTRIPLES_NAMES, source))
    return _parse_rdflib(data, format, source)


def _parse_oxigraph(data: bytes, strict_ntriples: bool, source: str) -> list[Fact]:
    """Turtle (or strict N-Triples) through pyoxigraph, every fact read before one is kept."""
    from pyoxigraph import RdfFormat, parse

    name = "n-triples" if strict_ntriples else "turtle"
    oxi_format = RdfFormat.N_TRIPLES if strict_ntriples else RdfFormat.TURTLE
    try:
        try:  # (absolute IRIs only, as most RDF holds: no base to strip from every IRI)
            return _absolute_facts(parse(data, format=oxi_format, rename_blank_nodes=True))
        except SyntaxError as err:
            if strict_ntriples or "No scheme found" not in str(err):
                raise
        # a relative IRI, as ZodiacEdge's files hold: read again against the private base
        quads = parse(data, format=oxi_format, base_iri=_RELATIVE_BASE, rename_blank_nodes=True)
        return _oxigraph_facts(quads)
    except SyntaxError as err:
        raise _oxigraph_error(err, data, source, name) from None
    except (NonFiniteError, NotTextError) as error:
        raise ZodiacError(f"{source}: {error}") from None


def _absolute_facts(quads: Iterable) -> list[Fact]:
    """pyoxigraph's quads, read without a base -> facts: a triple of IRIs in one step of a
    comprehension (the cost per fact of loading a file, in Python), others through
    ``_oxigraph_value``."""
    from pyoxigraph import NamedNode as iri

    return [
        (p.value, s.value, o.value)
        if o.__class__ is iri and s.__class__ is iri
        else (
            p.value,
            s.value if s.__class__ is iri else "_:" + s.value,
            o.value if o.__class__ is iri else _oxigraph_value(o),
        )
        for s, p, o, _ in quads
    ]


def _oxigraph_facts(quads: Iterable) -> list[Fact]:
    """pyoxigraph's quads -> facts. Why written out so: this loop is what loading a file
    costs per fact in Python, so IRIs (most terms) take the fewest steps; other terms go
    through ``_oxigraph_value``."""
    from pyoxigraph import NamedNode

    base, cut = _RELATIVE_BASE, len(_RELATIVE_BASE)
    iri_class = NamedNode
    facts = []
    append = facts.append
    for subject, predicate, obj, _ in quads:
        p = predicate.value
        if p.startswith(base):
            p = p[cut:]
        if subject.__class__ is iri_class:
            s = subject.value
            if s.startswith(base):
                s = s[cut:]
        else:
            s = "_:" + subject.value
        if obj.__class__ is iri_class:
            o = obj.value
            if o.startswith(base):
                o = o[cut:]
            append((p, s, o))
        else:
            append((p, s, _oxigraph_value(obj)))
    return facts


def _oxigraph_value(node: object) -> Value:
    """A blank node or literal of pyoxigraph's -> an engine value."""
    from pyoxigraph import BlankNode
    from pyoxigraph import Literal as OxLiteral

    if isinstance(node, OxLiteral):
        language = node.language
        if language:
            return Literal(node.value, None, language)
        datatype = node.datatype.value
        if datatype.startswith(_RELATIVE_BASE):  # (a relative datatype IRI, as written)
            datatype = datatype[len(_RELATIVE_BASE) :]
        return literal_value(node.value, datatype)
    if isinstance(node, BlankNode):
        return "_:" + node.value
    raise ValueError(f"unexpected RDF node {node!r}")  # (RDF 1.2 triple terms)


_OXI_POSITION = re.compile(
    r"^Parser error at line \d+ (?:between columns \d+ and \d+|column \d+): "
)


def _oxigraph_error(err: SyntaxError, data: bytes, source: str, format: str) -> ParseError:
    """A ParseError with pyoxigraph's reason, line and column; an error at the end of the
    input points just after its last text (where it ended), as a reader would look for it."""
    message = str(err.args[0]) if err.args else str(err)
    reason = _OXI_POSITION.sub("", message.splitlines()[0]) if message else "syntax error"
    place = err.args[1] if len(err.args) > 1 and isinstance(err.args[1], tuple) else ()
    line, column = (int(place[1] or 0), int(place[2] or 0)) if len(place) >= 3 else (0, 0)
    text = data.decode("utf-8")
    if line > text.count("\n", 0, len(text.rstrip())) + 1:  # (past the last text)
        last = text.rstrip()
        line = last.count("\n") + 1
        column = len(last) - (last.rfind("\n") + 1) + 1
    return ParseError(f"invalid RDF ({format}): {reason}", source=source, line=line, column=column)


def _parse_rdflib(data: bytes, format: str, source: str) -> Iterator[Fact]:
    """RDF/XML, N3, JSON-LD (and any other format rdflib has a plugin for)."""
    import rdflib
    from rdflib.parser import Parser as RdflibParser
    from rdflib.plugin import PluginException
    from rdflib.plugin import get as get_plugin

    rdflib_format = format
    if rdflib_format == "n3":  # UTF-8 by definition (RDF/XML may declare another)
        decode_utf8(data, source)
    try:
        get_plugin(rdflib_format, RdflibParser)
    except PluginException:
        raise ValueError(f"unknown RDF format {format!r}") from None
    graph = rdflib.Graph()
    with _normalize_lock:
        saved, rdflib.NORMALIZE_LITERALS = rdflib.NORMALIZE_LITERALS, False
        _RDFLIB_TERM_LOG.addFilter(_quiet_term_warnings)
        try:
            graph.parse(data=data, format=rdflib_format, publicID=_RELATIVE_BASE)
        except (OSError, MemoryError):
            raise
        except Exception as err:  # rdflib's parsers raise many kinds; all mean bad input here
            raise _parse_error(err, source, rdflib_format) from err
        finally:
            rdflib.NORMALIZE_LITERALS = saved
            _RDFLIB_TERM_LOG.removeFilter(_quiet_term_warnings)
    facts = []
    for s, p, o in graph:
        try:
            fact = _fact(s, p, o)
            for value in fact:
                check_value_text(value)
        except (NonFiniteError, NotTextError) as error:
            raise ZodiacError(f"{source}: {error}") from None
        facts.append(fact)
    return iter(facts)


def _quiet_term_warnings(record: logging.LogRecord) -> bool:
    """Drop rdflib's warnings about ill-typed literals and unusual IRIs while we parse: we keep
    such literals as :class:`Literal` on purpose, and escaped IRIs are legal input."""
    message = str(record.msg)
    return not (
        message.startswith("Failed to convert Literal")
        or "does not look like a valid URI" in message
    )


def _parse_error(err: Exception, source: str, format: str) -> ParseError:
    """A ParseError with rdflib's reason and, when rdflib knows it, the line and column."""
    line, column = 0, 0
    reason = getattr(err, "_why", None) or str(err).strip() or type(err).__name__
    if isinstance(getattr(err, "lines", None), int):  # notation3's BadSyntax: 0-based line
        line = err.lines + 1  # type: ignore[attr-defined]
        text, offset = getattr(err, "_str", b""), getattr(err, "_i", None)
        if isinstance(text, bytes) and isinstance(offset, int):
            decoded = text.decode("utf-8", "replace")
            if offset < 0:  # "EOF found ...": point just after the last text, where it ended
                offset = len(decoded.rstrip())
            line = decoded.count("\n", 0, offset) + 1
            column = offset - decoded.rfind("\n", 0, offset)
    elif callable(getattr(err, "getLineNumber", None)):  # xml.sax errors (RDF/XML)
        line = int(err.getLineNumber() or 0)  # type: ignore[attr-defined]
        column = int(err.getColumnNumber() or 0) + 1  # type: ignore[attr-defined]
    reason = reason.splitlines()[0] if reason else "syntax error"
    return ParseError(f"invalid RDF ({format}): {reason}", source=source, line=line, column=column)


def _fact(subject: object, predicate: object, obj: object) -> Fact:
    return (_value(predicate), _value(subject), _value(obj))


def _value(node: object) -> Value:
    import rdflib

    if isinstance(node, rdflib.URIRef):
        iri = str(node)
        return iri[len(_RELATIVE_BASE) :] if iri.startswith(_RELATIVE_BASE) else iri
    if isinstance(node, rdflib.BNode):
        return "_:" + str(node)
    if isinstance(node, rdflib.Literal):
        datatype = str(node.datatype) if node.datatype is not None else None
        return literal_value(str(node), datatype, node.language)
    raise ValueError(f"unexpected RDF node {node!r}")


# --- writing ------------------------------------------------------------------------------

_IRI_UNSAFE = re.compile(r'[\x00-\x20<>"{}|^`\\]')
_BNODE_LABEL = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_.\-]*[A-Za-z0-9_\-])?")
_STRING_UNSAFE = re.compile(r'[\x00-\x1f\x7f"\\]')
_STRING_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t"}


_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*:")


def is_absolute_iri(iri: str) -> bool:
    """Whether an IRI has a scheme (``http:``, ``urn:``...), as N-Triples requires."""
    return bool(_SCHEME.match(iri))


def _absolute(value: str, base: str) -> str:
    if value.startswith("_:") or _SCHEME.match(value):
        return value
    return base + value


def _is_iri(value: object) -> bool:
    return isinstance(value, str) and not value.startswith("_:")


def _escape_iri(iri: str) -> str:
    return _IRI_UNSAFE.sub(lambda m: f"\\u{ord(m.group()):04X}", iri)


def _escape_string(text: str) -> str:
    return _STRING_UNSAFE.sub(
        lambda m: _STRING_ESCAPES.get(m.group(), f"\\u{ord(m.group()):04X}"), text
    )


def _format_node(value: str) -> str:
    if value.startswith("_:"):
        label = value[2:]
        if not _BNODE_LABEL.fullmatch(label):
            label = "b" + label.encode("utf-8").hex()
        return "_:" + label
    return f"<{_escape_iri(value)}>"


def _format_object(value: Value) -> str:
    if isinstance(value, bool):
        return f'"{"true" if value else "false"}"^^<{XSD}boolean>'
    if isinstance(value, str):
        return _format_node(value)
    if isinstance(value, int):
        return f'"{value}"^^<{XSD}integer>'
    if isinstance(value, float):
        text = repr(value)
        if value == value and abs(value) != float("inf") and "e" not in text:
            return f'"{text}"^^<{XSD}decimal>'
        return f'"{_double_lexical(value)}"^^<{XSD}double>'
    if isinstance(value, Literal):
        text = f'"{_escape_string(value.lexical)}"'
        if value.language:
            return f"{text}@{value.language}"
        if value.datatype:
            return f"{text}^^<{_escape_iri(value.datatype)}>"
        return text
    raise TypeError(f"not a fact value: {value!r}")


def _double_lexical(value: float) -> str:
    if value != value:
        return "NaN"
    if value in (float("inf"), float("-inf")):
        return "INF" if value > 0 else "-INF"
    return repr(value)
