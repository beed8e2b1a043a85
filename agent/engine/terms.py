"""Dictionary encoding: every value the engine stores is a small int (a term id).

Joins, indexes and sets then work on ints, which hash and compare fast. Numbers keep their
numeric value (``values[id]``) so comparisons, binds and aggregates compute on real numbers.

Numerically equal numbers share one id (``5`` and ``5.0`` are one term: the first
representation seen is the one decoded), so term identity and numeric equality agree and the
compiled code can test ``X != Y`` as an int comparison. Booleans are kept apart from numbers
(``True == 1`` in Python, but not in our language).
"""

from __future__ import annotations

import math

from .errors import NonFiniteError, RuleError, ZodiacError
from .language import RDF_TYPE, Atom, Literal, Value

# Term ids are unsigned 32-bit integers: the agent's state saves sets of ids as compressed
# bitmaps of 32-bit values (agent/persistence.py). Four billion distinct terms is far beyond
# what one device or one farm holds; reaching the limit is refused as bad input (the update
# that brought the 2**32-th term changes nothing), never an overflow later.
MAX_TERMS = 2**32


def term_key(value: Value) -> tuple:
    """The dictionary key of a value: a kind tag plus the value."""
    cls = value.__class__
    if cls is str:
        return ("i", value)
    if cls is bool:
        return ("b", value)
    if cls is int or cls is float:
        return ("n", value)
    if isinstance(value, Literal):
        return ("l", value)
    if isinstance(value, bool):
        return ("b", bool(value))
    if isinstance(value, (int, float)):
        return ("n", value)
    if isinstance(value, str):
        return ("i", str(value))
    raise TypeError(f"cannot store a value of type {type(value).__name__}: {value!r}")


class TermDictionary:
    """Two-way map between values and term ids, append-only.

    Ids are never reused, so an id held anywhere (a fact, a compiled constant) stays valid.
    """

    __slots__ = ("_ids", "_iris", "values", "limit")

    def __init__(self) -> None:
        self._ids: dict[tuple, int] = {}
        # IRIs (plain str values) again, keyed by the string itself: most terms are IRIs, and
        # this skips building a key tuple per lookup (the load path's largest cost).
        self._iris: dict[str, int] = {}
        self.values: list[Value] = []
        self.limit = MAX_TERMS  # (lowered by tests, to reach it)

    def __len__(self) -> int:
        return len(self.values)

    def encode(self, value: Value) -> int:
        if value.__class__ is str:
            found = self._iris.get(value)  # type: ignore[arg-type]
            if found is not None:
                return found
        key = term_key(value)
        found = self._ids.get(key)
        if found is not None:
            return found
        if key[0] == "n" and isinstance(value, float) and not math.isfinite(value):
            raise NonFiniteError(value)
        new_id = len(self.values)
        if new_id >= self.limit:
            raise ZodiacError(
                f"the term dictionary is full: {self.limit:,} distinct terms, the most term "
                f"ids of 32 bits can number; {value!r} is one too many"
            )
        self._ids[key] = new_id
        if value.__class__ is str:
            self._iris[value] = new_id  # type: ignore[index]
        self.values.append(value)
        return new_id

    def load(self, values: list[Value]) -> None:
        """Append stored terms, which must get exactly the ids they had when saved (an empty
        dictionary, values in id order)."""
        for expected, value in enumerate(values, start=len(self.values)):
            if self.encode(value) != expected:
                raise ValueError(f"term {expected} ({value!r}) duplicates an earlier term")

    def encode_fact(self, fact: tuple | Atom) -> tuple[tuple[str, int], tuple[int, ...]]:
        """A fact as ``Reasoner.add_facts`` takes it -> ``(relation, ids)``, encoding its
        terms: a tuple ``(predicate, *arguments)``, where ``(rdf:type, x, C)`` is the class
        fact ``C(x)`` (relation ``(C, 1)``), or a ground Atom. The one place fact shapes are
        checked, for the engine and the cloud's Spark job alike."""
        if fact.__class__ is tuple and len(fact) > 1:  # the common shape, checked first
            predicate = fact[0]
            if predicate.__class__ is str and predicate != RDF_TYPE:
                args = fact[1:]
                try:  # every argument a known IRI: looked up in C
                    found = tuple(map(self._iris.get, args))
                except TypeError:  # an unhashable argument: encode() says what is wrong
                    found = (None,)
                if None in found:
                    found = tuple(map(self.encode, args))
                return (predicate, len(args)), found
        if isinstance(fact, Atom):
            if not fact.is_ground():
                raise RuleError(f"a fact must be ground: {fact}")
            return fact.relation, tuple(self.encode(t.value) for t in fact.terms)  # type: ignore[union-attr]
        if not isinstance(fact, tuple) or len(fact) < 2:
            raise ZodiacError(f"a fact is a tuple (predicate, *arguments), got {fact!r}")
        predicate, *args = fact
        if not isinstance(predicate, str):
            raise ZodiacError(f"a fact's predicate must be an IRI string, got {predicate!r}")
        if predicate == RDF_TYPE and len(args) == 2:
            subject, cls = args
            if not isinstance(cls, str):
                raise ZodiacError(f"a class must be an IRI string, got {cls!r} in {fact!r}")
            return (cls, 1), (self.encode(subject),)
        return (predicate, len(args)), tuple(map(self.encode, args))

    def lookup(self, value: Value) -> int | None:
        """The id of a value, or None if the dictionary has never seen it (no insertion)."""
        return self._ids.get(term_key(value))

    def decode(self, term_id: int) -> Value:
        return self.values[term_id]
