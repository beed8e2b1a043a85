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
from collections.abc import Iterable
from itertools import compress, repeat
from operator import is_, itemgetter

from .errors import NonFiniteError, RuleError, ZodiacError
from .language import RDF_TYPE, Atom, Constant, Literal, RelationKey, Value

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
        # IRIs (most terms) keyed by the string itself: no key tuple per lookup or per term
        # (the load path's largest cost, and a tuple and a slot per IRI held for good).
        self._iris: dict[str, int] = {}
        self._ids: dict[tuple, int] = {}  # every other value, by its term_key
        self.values: list[Value] = []
        self.limit = MAX_TERMS  # (lowered by tests, to reach it)

    def __len__(self) -> int:
        return len(self.values)

    def encode(self, value: Value) -> int:
        if value.__class__ is str:
            found = self._iris.get(value)  # type: ignore[arg-type]
            return self._new(value, None) if found is None else found
        key = term_key(value)
        if key[0] == "i":  # a str subclass: the IRI it spells
            return self.encode(key[1])
        found = self._ids.get(key)
        if found is not None:
            return found
        if key[0] == "n" and isinstance(value, float) and not math.isfinite(value):
            raise NonFiniteError(value)
        return self._new(value, key)

    def _new(self, value: Value, key: tuple | None) -> int:
        """Give ``value`` the next id (``key`` None: an IRI)."""
        new_id = len(self.values)
        if new_id >= self.limit:
            self._full(value)
        if key is None:
            self._iris[value] = new_id  # type: ignore[index]
        else:
            self._ids[key] = new_id
        self.values.append(value)
        return new_id

    def _add_iris(self, iris: list[str]) -> None:
        """Give IRIs the dictionary has never seen the next ids, in order, at once."""
        start = len(self.values)
        if start + len(iris) > self.limit:
            self._full(iris[max(0, self.limit - start)])
        self.values.extend(iris)
        self._iris.update(zip(iris, range(start, start + len(iris)), strict=True))

    def _full(self, value: Value) -> None:
        raise ZodiacError(
            f"the term dictionary is full: {self.limit:,} distinct terms, the most term "
            f"ids of 32 bits can number; {value!r} is one too many"
        )

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

    def encode_facts(self, facts: Iterable) -> tuple[dict[RelationKey, list[tuple[int, ...]]], int]:
        """Many facts at once -> (relation -> the facts' id tuples, how many facts were given):
        what `encode_fact` gives fact by fact, faster for the common bulk shape.

        A batch of tuples ``(predicate, *arguments)`` of one IRI predicate and one arity (a CSV
        file of one relation, a device's readings) is encoded a column at a time: a column is
        looked up in C, IRIs never seen before get their ids at once, and only other new values
        (numbers, literals, booleans) are encoded one by one. Any other batch, or one whose new
        numbers sit in several columns (which of two equal numbers, ``5`` and ``5.0``, is seen
        first, and so decoded, depends on the order facts are encoded), goes fact by fact."""
        facts = facts if isinstance(facts, list) else list(facts)
        key = _one_shape(facts)
        if key is not None:
            try:
                columns = [list(map(itemgetter(i), facts)) for i in range(1, key[1] + 1)]
                encoded = self._encode_columns(columns)
            except TypeError:  # an unhashable argument: encode_fact says which
                encoded = None
            if encoded is not None:
                return {key: encoded}, len(facts)
        grouped: dict[RelationKey, list[tuple[int, ...]]] = {}
        for fact in facts:
            key, ids = self.encode_fact(fact)
            found = grouped.get(key)
            if found is None:
                grouped[key] = [ids]
            else:
                found.append(ids)
        return grouped, len(facts)

    def _encode_columns(self, columns: list[list]) -> list[tuple[int, ...]] | None:
        """The id tuples of rows given as columns (see `encode_facts`); None when new numbers
        sit in more than one column (then nothing but IRIs was encoded)."""
        get = self._iris.get
        id_columns: list[list] = []
        stale: list[int] = []  # columns with values that had no id
        pending: list[int] = []  # those among them with new values that are not IRIs
        numbers = 0  # columns with new numbers
        for n, column in enumerate(columns):
            ids = list(map(get, column))
            id_columns.append(ids)
            unseen = dict.fromkeys(compress(column, map(is_, ids, repeat(None))))
            if not unseen:
                continue
            stale.append(n)
            iris = [value for value in unseen if value.__class__ is str]
            self._add_iris(iris)
            if len(iris) < len(unseen):
                pending.append(n)
                numbers += any(term_key(v)[0] == "n" for v in unseen if v.__class__ is not str)
        if numbers > 1:
            return None
        encode = self.encode
        for n in stale:
            column = columns[n]
            ids = id_columns[n] = list(map(get, column))
            if n in pending:
                id_columns[n] = [
                    i if i is not None else encode(v) for v, i in zip(column, ids, strict=True)
                ]
        return list(zip(*id_columns, strict=True))

    def lookup_fact(self, fact: tuple | Atom) -> tuple[RelationKey | None, tuple[int, ...]]:
        """Like `encode_fact`, but never adds a term: ``(None, ())`` when a term is unknown
        (then the fact cannot hold). Facts of IRIs only are looked up in C."""
        if fact.__class__ is tuple and len(fact) > 1:  # the common shape, checked first
            predicate = fact[0]
            if predicate.__class__ is str and predicate != RDF_TYPE:
                args = fact[1:]
                try:
                    found = tuple(map(self._iris.get, args))
                except TypeError:  # an unhashable argument: no such term
                    return None, ()
                if None in found:  # numbers, literals (or unknown terms): looked up in turn
                    lookup = self.lookup
                    found = tuple(
                        i if i is not None else lookup(v) for v, i in zip(args, found, strict=True)
                    )
                    if None in found:
                        return None, ()
                return (predicate, len(args)), found
        if isinstance(fact, Atom):
            values = [t.value for t in fact.terms if isinstance(t, Constant)]
            key = fact.relation
        else:
            predicate, *values = fact
            key = (predicate, len(values))
            if predicate == RDF_TYPE and len(values) == 2:
                key, values = (values[1], 1), values[:1]
        ids = [self.lookup(v) for v in values]
        if any(i is None for i in ids):
            return None, ()
        return key, tuple(ids)  # type: ignore[arg-type]

    def lookup(self, value: Value) -> int | None:
        """The id of a value, or None if the dictionary has never seen it (no insertion)."""
        key = term_key(value)
        return self._iris.get(key[1]) if key[0] == "i" else self._ids.get(key)

    def decode(self, term_id: int) -> Value:
        return self.values[term_id]


def _one_shape(facts: list) -> RelationKey | None:
    """The relation when every fact is a tuple of one IRI predicate (not rdf:type) and one
    length, found by C-level passes; else None."""
    if not facts or facts[0].__class__ is not tuple or len(facts[0]) < 2:
        return None
    predicate = facts[0][0]
    if predicate.__class__ is not str or predicate == RDF_TYPE:
        return None
    try:
        same = (
            set(map(type, facts)) == {tuple}
            and len(set(map(len, facts))) == 1
            and set(map(itemgetter(0), facts)) == {predicate}
        )
    except TypeError:  # an unhashable predicate: the per-fact path says what is wrong
        return None
    return (predicate, len(facts[0]) - 1) if same else None
