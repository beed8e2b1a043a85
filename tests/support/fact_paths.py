"""The ways one fact reaches the engine, for the stateful differential tests.

A fact in the tests' logical form (``(C, x)`` for a class fact, see ``tests/support/reference.py``)
can be given as the external tuple (``(rdf:type, x, C)``), re-spelt (the class fact as the
pair ``(C, x)``, an integral number as the other of ``3`` / ``3.0``), as a ground fact in rule
text, or as a line of an N-Triples/Turtle file. Every spelling is the same fact
(``docs/semantics.md``, "One update"); the machines draw them so that one update may delete a
fact through one path and add it back through another.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from pathlib import Path

from agent.engine.language import Atom, Constant, Literal, Value
from agent.engine.program.parser import parse_program
from tests.support.reference import to_external

PATHS = ("tuple", "respelt", "text", "file")


def other_number(value: Value) -> Value:
    """``3`` <-> ``3.0`` (one value, two spellings); anything else as it is."""
    if value.__class__ is int:
        return float(value)
    if value.__class__ is float and value.is_integer():
        return int(value)
    return value


def respell(fact: tuple) -> tuple:
    """Another tuple for the same logical fact: a class fact as the pair ``(C, x)`` rather than
    the triple, integral numbers in the other spelling."""
    return (fact[0], *map(other_number, fact[1:]))


def text_of(fact: tuple) -> str | None:
    """The fact as rule text (``<e2>(<c0>, 3) .``), or None if the text would not read back
    as the same fact."""
    atom = Atom(fact[0], tuple(Constant(value) for value in fact[1:]))
    text = f"{atom} ."
    parsed = parse_program(text).facts
    return text if parsed == (atom,) else None


def _turtle_term(value: Value) -> str | None:
    if value.__class__ is str:
        return f"<{value}>"
    if value.__class__ is int or value.__class__ is float:
        return repr(value)  # 3 is xsd:integer, 3.0 and 2.5 xsd:decimal: numbers either way
    if isinstance(value, Literal) and value.datatype is None:
        return str(value)
    return None


def line_of(fact: tuple) -> str | None:
    """The fact as a Turtle line, or None where a file cannot hold it (arity 3 or more, a
    subject that is not an IRI)."""
    if len(fact) == 2:
        subject, predicate, obj = fact[1], "a", f"<{fact[0]}>"
    elif len(fact) == 3:
        subject, predicate, obj = fact[1], f"<{fact[0]}>", _turtle_term(fact[2])
    else:
        return None
    if subject.__class__ is not str or obj is None:
        return None
    return f"<{subject}> {predicate} {obj} ."


def spelt(fact: tuple, path: str) -> tuple:
    """``fact`` as a tuple for ``path`` ``tuple`` or ``respelt``."""
    return to_external(fact) if path == "tuple" else respell(fact)


def can_go(fact: tuple, path: str) -> bool:
    if path == "text":
        return text_of(fact) is not None
    if path == "file":
        return line_of(fact) is not None
    return True


def write_fact_file(directory: Path, facts: Iterable[tuple]) -> Path:
    """A new Turtle file of ``facts`` (each must fit: ``can_go(fact, "file")``)."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"facts-{uuid.uuid4().hex[:8]}.ttl"
    lines = [line_of(fact) for fact in facts]
    assert None not in lines, lines
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")  # type: ignore[arg-type]
    return path
