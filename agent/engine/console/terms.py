"""Facts and IRIs as a command line reads and prints them: a ground atom written by a user
(``ex:hot(<t1>)``) turned into the fact tuple the engine takes, a fact tuple printed back as
an atom, and IRIs printed with the rule file's ``@prefix`` names (``--prefixes``).

Shared by ``zodiac-edge`` and its shell so that what one prints the other reads.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from agent.engine.errors import ZodiacError
from agent.engine.language import RDF_TYPE, Atom, Constant, format_value
from agent.engine.program.parser import PREDEFINED_PREFIXES, parse_atom

# A Turtle local name we dare to print after a prefix (a safe subset of PN_LOCAL).
_LOCAL = re.compile(r"[A-Za-z_][A-Za-z0-9_\-]*")
# An N-Triples/Turtle string literal (skipped) or an <IRI> (shortened).
_TOKEN = re.compile(r'"(?:[^"\\\n]|\\.)*"|<([^<>"\s]*)>')


def ground_fact(text: str, source: str, prefixes: Mapping[str, str] | None) -> tuple:
    """The fact tuple of a ground atom as a user writes it; a ZodiacError if not ground."""
    atom = parse_atom(text, source=source, prefixes=prefixes)
    if not atom.is_ground():
        raise ZodiacError(f"{source} must be ground (no variables): {text.strip()}")
    return atom_fact(atom)


def atom_fact(atom: Atom) -> tuple:
    values = [t.value for t in atom.terms if isinstance(t, Constant)]
    return (RDF_TYPE, values[0], atom.predicate) if atom.arity == 1 else (atom.predicate, *values)


def fact_text(fact: tuple) -> str:
    """A fact tuple as the atom a rule file writes: ``<p>(<a>, 5)``, ``<C>(<x>)``."""
    if len(fact) == 3 and fact[0] == RDF_TYPE:
        return f"<{fact[2]}>({format_value(fact[1])})"
    return f"<{fact[0]}>({', '.join(format_value(v) for v in fact[1:])})"


class Shortener:
    """Rewrites ``<IRI>`` in printed text as ``prefix:local`` for the declared prefixes (the
    longest namespace first); string literals are left alone. With no prefixes, a no-op."""

    def __init__(self, prefixes: Mapping[str, str] | None):
        self.prefixes = dict(prefixes or {})
        self.order = sorted(self.prefixes.items(), key=lambda item: -len(item[1]))

    def declared(self) -> dict[str, str]:
        """The prefixes a file declared beyond the predefined ones (for a Turtle header)."""
        return {
            name: ns
            for name, ns in self.prefixes.items()
            if PREDEFINED_PREFIXES.get(name) != ns
        }

    def iri(self, iri: str) -> str | None:
        """``prefix:local`` for an IRI, or None when no prefix fits."""
        for name, namespace in self.order:
            if iri.startswith(namespace) and _LOCAL.fullmatch(iri[len(namespace) :]):
                return f"{name}:{iri[len(namespace):]}"
        return None

    def text(self, line: str) -> str:
        if not self.order:
            return line

        def replace(found: re.Match) -> str:
            if found.group(1) is None:
                return found.group()
            return self.iri(found.group(1)) or found.group()

        return _TOKEN.sub(replace, line)

    def value(self, value: object) -> str:
        """A query answer's value for the TSV output (an IRI as is, or shortened)."""
        if isinstance(value, str) and self.order:
            return self.iri(value) or value
        return str(value)
