"""Checksums of an agent state's dictionaries: its terms and its relations.

Why: SQLite checks a file's structure, not what its cells say, and the packed rows of facts
carry a CRC of their own (agent/derived_rows.py). A byte changed in a term's text (``windTurbine11``
read back as ``windTur{ine11``) or in a relation's name was loaded as if nothing had happened:
every fact naming it moved to a term or relation nobody knows, and the diagnoses with it.

How: both tables only ever grow, in id order, so each keeps running CRC-32s over its rows as
written (one per column: a column's values joined and hashed in C costs far less than a pass
per row, and a restart reads every term anyway). A commit that adds terms or relations extends
them in the same transaction; opening the state compares them with the rows read. A file
written before these checksums existed gets them at its first load (from what it holds then).
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field

META_KEY = "dictionary_checksums"
SEPARATOR = "\x1e"  # after every value: appending rows appends to every column's text

# A term row as saved: (kind, value, datatype, language); a relation row: (id, name, arity).
Row = tuple


def _extend(crc: int, column: Sequence[object]) -> int:
    """``crc`` over the column's values as text, each followed by the separator."""
    if not column:
        return crc
    text = SEPARATOR.join(map(str, column)) + SEPARATOR
    return zlib.crc32(text.encode("utf-8", "surrogatepass"), crc)


def _extended(crcs: list[int], rows: Sequence[Row]) -> list[int]:
    """Each column's CRC extended by the rows' values in that column."""
    if not rows:
        return crcs
    columns = zip(*rows, strict=True)
    return [_extend(crc, column) for crc, column in zip(crcs, columns, strict=True)]


@dataclass
class DictionaryChecksums:
    """Running CRC-32s: one per column of the terms table, one per column of relations."""

    terms: list[int] = field(default_factory=lambda: [0, 0, 0, 0])
    relations: list[int] = field(default_factory=lambda: [0, 0, 0])

    def add_terms(self, rows: Sequence[Row]) -> None:
        self.terms = _extended(self.terms, rows)

    def add_relations(self, rows: Sequence[Row]) -> None:
        self.relations = _extended(self.relations, rows)

    def to_text(self) -> str:
        return json.dumps({"terms": self.terms, "relations": self.relations})

    @classmethod
    def of(cls, terms: Sequence[Row], relations: Sequence[Row]) -> DictionaryChecksums:
        found = cls()
        found.add_terms(terms)
        found.add_relations(relations)
        return found

    @classmethod
    def from_text(cls, text: str) -> DictionaryChecksums:
        """The saved checksums; ValueError when the note itself is damaged."""
        saved = json.loads(text)
        terms, relations = saved["terms"], saved["relations"]
        if not (
            isinstance(terms, list)
            and isinstance(relations, list)
            and len(terms) == 4
            and len(relations) == 3
            and all(isinstance(crc, int) for crc in [*terms, *relations])
        ):
            raise ValueError(f"not dictionary checksums: {text[:80]!r}")
        return cls(terms, relations)

    def differences(self, other: DictionaryChecksums) -> list[str]:
        """Which dictionaries differ: ``terms``, ``relations``, both or none."""
        return [
            name
            for name, mine, theirs in (
                ("terms", self.terms, other.terms),
                ("relations", self.relations, other.relations),
            )
            if mine != theirs
        ]
