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

from .language import Literal, Value


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

    __slots__ = ("_ids", "values")

    def __init__(self) -> None:
        self._ids: dict[tuple, int] = {}
        self.values: list[Value] = []

    def __len__(self) -> int:
        return len(self.values)

    def encode(self, value: Value) -> int:
        key = term_key(value)
        found = self._ids.get(key)
        if found is not None:
            return found
        if key[0] == "n" and isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"not a finite number: {value!r}")
        new_id = len(self.values)
        self._ids[key] = new_id
        self.values.append(value)
        return new_id

    def load(self, values: list[Value]) -> None:
        """Append stored terms, which must get exactly the ids they had when saved (an empty
        dictionary, values in id order)."""
        for expected, value in enumerate(values, start=len(self.values)):
            if self.encode(value) != expected:
                raise ValueError(f"term {expected} ({value!r}) duplicates an earlier term")

    def lookup(self, value: Value) -> int | None:
        """The id of a value, or None if the dictionary has never seen it (no insertion)."""
        return self._ids.get(term_key(value))

    def decode(self, term_id: int) -> Value:
        return self.values[term_id]
