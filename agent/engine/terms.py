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
from collections import Counter
from collections.abc import Iterable
from itertools import compress, count, repeat
from operator import is_, itemgetter, not_

from agent.engine.errors import NonFiniteError, RuleError, ZodiacError, check_text
from agent.engine.language import RDF_TYPE, Atom, Constant, Literal, RelationKey, Value

# Term ids are unsigned 32-bit integers: the agent's state saves sets of ids as compressed
# bitmaps of 32-bit values (agent/state/agent_state.py). Four billion distinct terms is far beyond
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


def fact_identity(fact: tuple | Atom) -> tuple:
    """What makes two spellings of a fact one fact, without a dictionary: ``(predicate,
    *values)`` with a class fact as ``(C, x)`` whichever way it was written (``(C, x)``,
    ``(rdf:type, x, C)``, ``<C>(x)`` in rule text) and each value by term identity (``5`` and
    ``5.0`` are one value; ``True`` is not ``1``; the literal ``"c0"`` is not the IRI ``c0``).

    Two facts have the same identity exactly when the dictionary gives them the same
    relation and ids, so code that compares facts given as Python values (the agent's claims,
    a bundle's operations, a reading replacing another) decides as the engine does. The common
    shape, a tuple of IRIs, is its own identity."""
    if fact.__class__ is tuple and len(fact) > 2 and fact[0] != RDF_TYPE:
        for value in fact:
            if value.__class__ is not str:
                break
        else:
            return fact
    key, values = fact_shape(fact)
    return (key[0], *map(_value_identity, values))


def _value_identity(value: Value) -> object:
    """An IRI is itself; any other value is tagged by its kind (``term_key``), so that it
    never equals an IRI or a value of another kind."""
    if value.__class__ is str:
        return value
    key = term_key(value)
    return key[1] if key[0] == "i" else key


def fact_shape(fact: tuple | Atom) -> tuple[RelationKey, tuple[Value, ...]]:
    """A fact as ``Reasoner.add_facts`` takes it -> ``(relation, values)``: a tuple
    ``(predicate, *arguments)``, where ``(rdf:type, x, C)`` is the class fact ``C(x)``
    (relation ``(C, 1)``), or a ground Atom. The one place fact shapes are checked, for the
    engine, the agent and the cloud's Spark job alike."""
    if isinstance(fact, Atom):
        if not fact.is_ground():
            raise RuleError(f"a fact must be ground: {fact}")
        return fact.relation, tuple(t.value for t in fact.terms)  # type: ignore[union-attr]
    if not isinstance(fact, tuple) or len(fact) < 2:
        raise ZodiacError(f"a fact is a tuple (predicate, *arguments), got {fact!r}")
    predicate, *args = fact
    if not isinstance(predicate, str):
        raise ZodiacError(f"a fact's predicate must be an IRI string, got {predicate!r}")
    if predicate == RDF_TYPE and len(args) == 2:
        subject, cls = args
        if not isinstance(cls, str):
            raise ZodiacError(f"a class must be an IRI string, got {cls!r} in {fact!r}")
        return (cls, 1), (subject,)
    return (predicate, len(args)), tuple(args)


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
        check_value_text(value)
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
        if not "".join(iris).isascii():
            for iri in iris:
                check_text(iri)
        self.values.extend(iris)
        self._iris.update(zip(iris, range(start, start + len(iris)), strict=True))

    def _full(self, value: Value) -> None:
        raise ZodiacError(
            f"the term dictionary is full: {self.limit:,} distinct terms, the most term "
            f"ids of 32 bits can number; {value!r} is one too many"
        )

    def load(self, values: list[Value]) -> None:
        """Append stored terms, which must get exactly the ids they had when saved (an empty
        dictionary, values in id order). ValueError for a term that would not get its id (a
        duplicate) or that no dictionary holds (NaN, INF); the texts, checked when the terms
        were first encoded, are not checked again.

        Why by whole columns: a restart loads every term, and a state of sensor readings holds
        about as many terms as facts. The IRIs (most terms) go into their map in one C-level
        pass; the other values take a step each."""
        start = len(self.values)
        if start + len(values) > self.limit:
            self._full(values[max(0, self.limit - start)])
        iris, ids = self._iris, self._ids
        is_iri = [value.__class__ is str for value in values]
        expected_iris = len(iris) + sum(is_iri)
        iris.update(zip(compress(values, is_iri), compress(count(start), is_iri), strict=True))  # type: ignore[arg-type]
        if len(iris) != expected_iris:
            repeated = next(v for v, n in Counter(compress(values, is_iri)).items() if n > 1)
            raise ValueError(f"term {repeated!r} is saved twice (or was known already)")
        for expected, value in compress(enumerate(values, start), map(not_, is_iri)):
            key = term_key(value)
            if key[0] == "i" or key in ids or key[0] == "n" and not math.isfinite(value):  # type: ignore[arg-type]
                raise ValueError(f"term {expected} ({value!r}) duplicates another or is no term")
            ids[key] = expected
        self.values.extend(values)

    def encode_fact(self, fact: tuple | Atom) -> tuple[tuple[str, int], tuple[int, ...]]:
        """A fact as ``Reasoner.add_facts`` takes it (see `fact_shape`) -> ``(relation,
        ids)``, encoding its terms."""
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
        key, values = fact_shape(fact)
        return key, tuple(map(self.encode, values))

    def encode_facts(self, facts: Iterable) -> tuple[dict[RelationKey, list[tuple[int, ...]]], int]:
        """Many facts at once -> (relation -> the facts' id tuples, how many facts were given):
        what `encode_fact` gives fact by fact, faster for the common bulk shapes.

        Tuples ``(predicate, *arguments)`` with IRI predicates (a CSV file of one relation, a
        device's readings, an RDF file's triples; class facts ``(rdf:type, x, C)`` too) are
        grouped by relation and encoded a column at a time: a column is looked up in C, IRIs
        and plain numbers never seen before get their ids at once, and only other new values
        (literals, booleans) are encoded one by one. Any other batch, or one in which two
        columns bring a new number in two spellings (which of two equal numbers, ``5`` and
        ``5.0``, is seen first, and so decoded, depends on the order facts are encoded), goes
        fact by fact."""
        facts = facts if isinstance(facts, list) else list(facts)
        shaped = _by_relation(facts) if len(facts) >= COLUMNS_FROM[0] else None
        if shaped is not None:
            keys = list(shaped)
            try:
                encoded = self._encode_columns([shaped[key] for key in keys])
            except TypeError:  # an unhashable argument: encode_fact says which
                encoded = None
            if encoded is not None:
                _check_predicates(keys)
                return dict(zip(keys, encoded, strict=True)), len(facts)
        grouped: dict[RelationKey, list[tuple[int, ...]]] = {}
        for fact in facts:
            key, ids = self.encode_fact(fact)
            found = grouped.get(key)
            if found is None:
                grouped[key] = [ids]
            else:
                found.append(ids)
        _check_predicates(grouped)
        return grouped, len(facts)

    def _encode_columns(self, tables: list[list[list]]) -> list[list[tuple[int, ...]]] | None:
        """The id tuples of tables of rows given as columns (see `encode_facts`); None when
        two columns bring one new number in two spellings (``5`` and ``5.0``, ``0.0`` and
        ``-0.0``: which is decoded depends on the facts' order; then nothing but IRIs was
        encoded).

        Why numbers get their ids at once too: a device's readings and typed literals of a
        file are mostly numbers never seen before, one per fact."""
        get = self._iris.get
        id_tables: list[list[list]] = []
        stale: list[tuple[int, int]] = []  # (table, column) with values that had no id
        numbers: dict[int | float, int | float] = {}  # new numbers, by value: as first spelt
        for t, columns in enumerate(tables):
            id_columns = []
            id_tables.append(id_columns)
            for n, column in enumerate(columns):
                ids = list(map(get, column))
                id_columns.append(ids)
                new = list(compress(column, map(is_, ids, repeat(None))))
                if not new:
                    continue
                unseen = dict.fromkeys(new)  # (1 and True are one key here: IRIs only)
                stale.append((t, n))
                iris = [value for value in unseen if value.__class__ is str]
                self._add_iris(iris)
                if len(iris) < len(unseen) and not self._gather_numbers(new, numbers):
                    return None
        if numbers:
            self._add_numbers(list(numbers))
        encode, nget = self.encode, self._ids.get
        for t, n in stale:
            column = tables[t][n]
            ids = id_tables[t][n] = list(map(get, column))
            if None in ids:
                id_tables[t][n] = [
                    i
                    if i is not None
                    else nget(("n", v))
                    if v.__class__ is int or v.__class__ is float
                    else encode(v)
                    for v, i in zip(column, ids, strict=True)
                ]
        return [list(zip(*id_columns, strict=True)) for id_columns in id_tables]

    @staticmethod
    def _gather_numbers(new: list, numbers: dict) -> bool:
        """Add a column's new plain numbers (each as first spelt in it) to ``numbers``; False
        when one is a number another column brought in another spelling (``5`` against
        ``5.0``, ``-0.0`` against ``0.0``: the order of facts across columns is not known)."""
        local: dict[int | float, int | float] = {}  # (within a column, facts are in order)
        for value in new:
            cls = value.__class__
            if cls is int or cls is float:
                local.setdefault(value, value)
        for value in local.values():
            first = numbers.setdefault(value, value)
            if first is not value and (
                first.__class__ is not value.__class__
                or value.__class__ is float
                and math.copysign(1.0, first) != math.copysign(1.0, value)
            ):
                return False
        return True

    def _add_numbers(self, numbers: list[int | float]) -> None:
        """Give the numbers the dictionary has never seen the next ids, in order, at once."""
        keys = list(zip(repeat("n"), numbers))
        known = self._ids
        fresh = [key for key in keys if key not in known]
        for _, value in fresh:
            if value.__class__ is float and not math.isfinite(value):
                raise NonFiniteError(value)
        start = len(self.values)
        if start + len(fresh) > self.limit:
            self._full(fresh[max(0, self.limit - start)][1])
        self.values.extend(value for _, value in fresh)
        known.update(zip(fresh, range(start, start + len(fresh)), strict=True))

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

    def lookup_facts(self, facts: Iterable) -> list[tuple[RelationKey, tuple[int, ...]]]:
        """`lookup_fact` for many facts, leaving out those naming an unknown term: for the
        bulk shapes of `encode_facts` a column at a time (looked up in C; numbers and
        literals one by one), else fact by fact."""
        facts = facts if isinstance(facts, list) else list(facts)
        shaped = _by_relation(facts) if len(facts) >= COLUMNS_FROM[1] else None
        found: list[tuple[RelationKey, tuple[int, ...]]] = []
        if shaped is None:
            for fact in facts:
                key, ids = self.lookup_fact(fact)
                if key is not None:
                    found.append((key, ids))
            return found
        get, lookup = self._iris.get, self.lookup
        for key, columns in shaped.items():
            id_columns = []
            for column in columns:
                try:
                    ids = list(map(get, column))
                except TypeError:  # an unhashable value somewhere: fact by fact says which
                    return [f for f in map(self.lookup_fact, facts) if f[0] is not None]
                if None in ids:
                    ids = [
                        i if i is not None else lookup(v) for v, i in zip(column, ids, strict=True)
                    ]
                id_columns.append(ids)
            found.extend((key, row) for row in zip(*id_columns, strict=True) if None not in row)
        return found

    def lookup(self, value: Value) -> int | None:
        """The id of a value, or None if the dictionary has never seen it (no insertion)."""
        key = term_key(value)
        return self._iris.get(key[1]) if key[0] == "i" else self._ids.get(key)

    def decode(self, term_id: int) -> Value:
        return self.values[term_id]


# Batches from this many facts on (encoding, looking up) go a column at a time: below, the
# set-up of the column passes costs more than the facts one by one (a device's reading is
# one fact).
COLUMNS_FROM = (12, 3)


def _by_relation(facts: list) -> dict[RelationKey, list[list]] | None:
    """The facts as columns per relation (``(rdf:type, x, C)`` as ``C(x)``), when every fact
    is a tuple of an IRI predicate and at least one argument (checked by C-level passes);
    else None."""
    if not facts:
        return None
    try:
        if set(map(type, facts)) != {tuple} or min(map(len, facts)) < 2:
            return None
        predicates = set(map(itemgetter(0), facts))
    except TypeError:  # (a fact without a length, an unhashable predicate)
        return None
    if set(map(type, predicates)) != {str}:
        return None
    if len(predicates) == 1 and RDF_TYPE not in predicates:
        lengths = set(map(len, facts))
        if len(lengths) == 1:  # (one relation, a CSV file's: its columns cut out in C)
            (predicate,), (length,) = predicates, lengths
            return {(predicate, length - 1): list(map(list, zip(*facts, strict=True)))[1:]}
    rows: dict[tuple[str, int], list[tuple]] = {}
    for fact in facts:
        shape = (fact[0], len(fact))
        found = rows.get(shape)
        if found is None:
            rows[shape] = [fact]
        else:
            found.append(fact)
    tables: dict[RelationKey, list[list]] = {}
    by_class: set[RelationKey] = set()  # (the tables class facts began)
    for (predicate, length), group in rows.items():
        if predicate == RDF_TYPE and length == 3:
            classes = list(map(itemgetter(2), group))
            if set(map(type, classes)) != {str}:
                return None  # (encode_fact says what is wrong)
            subjects = list(map(itemgetter(1), group))
            iris_only = set(map(type, subjects)) == {str}
            for cls, subject in zip(classes, subjects, strict=True):
                table = tables.get((cls, 1))
                if table is None:
                    tables[(cls, 1)] = [[subject]]
                    by_class.add((cls, 1))
                elif (cls, 1) in by_class or iris_only and set(map(type, table[0])) == {str}:
                    table[0].append(subject)
                else:
                    return None  # (facts ``C(x)`` came first: see below)
            continue
        columns = [list(map(itemgetter(i), group)) for i in range(1, length)]
        table = tables.get((predicate, length - 1))  # (class facts of that name came first)
        if table is None:
            tables[(predicate, length - 1)] = columns
        elif set(map(type, table[0])) | set(map(type, columns[0])) != {str}:
            # Class facts ``(rdf:type, x, C)`` and facts ``C(x)`` in one batch, not both IRIs:
            # the column is no longer in the facts' order, which decides how a number both
            # brings (``3`` and ``3.0``) is spelt.
            return None
        else:
            for mine, more in zip(table, columns, strict=True):
                mine.extend(more)
    return tables


def _check_predicates(keys: Iterable[RelationKey]) -> None:
    """A fact's predicate (a class fact's class) names a relation, saved and sent as text: it
    must be Unicode text, like a term (errors.NotTextError)."""
    for predicate, _ in keys:
        check_text(predicate)


def check_value_text(value: Value) -> None:
    """An IRI, or a literal's text, datatype and language, must be Unicode text
    (errors.NotTextError); numbers and booleans have none."""
    if isinstance(value, str):
        check_text(value)
    elif isinstance(value, Literal):
        for part in (value.lexical, value.datatype, value.language):
            if part is not None:
                check_text(part)
