"""Checksums of an agent state's dictionaries: its relations, and in files before schema
version 9 its terms (since then, each chunk of terms has its own: agent/state/term_rows.py).

Why: SQLite checks a file's structure, not what its cells say, and the packed rows of facts
carry a CRC of their own (agent/state/packing.py). A byte changed in a term's text
(``windTurbine11`` read back as ``windTur{ine11``) or in a relation's name was loaded as if nothing
had happened: every fact naming it moved to a term or relation nobody knows, and the diagnoses with
it.

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
    """Running CRC-32s: one per column of relations and, for a file before version 9, one
    per column of the terms table (``terms`` None: not kept, as since version 9)."""

    terms: list[int] | None = None
    relations: list[int] = field(default_factory=lambda: [0, 0, 0])

    def add_relations(self, rows: Sequence[Row]) -> None:
        self.relations = _extended(self.relations, rows)

    def to_text(self) -> str:
        saved: dict[str, list[int]] = {"relations": self.relations}
        if self.terms is not None:
            saved["terms"] = self.terms
        return json.dumps(saved)

    @classmethod
    def of(cls, terms: Sequence[Row] | None, relations: Sequence[Row]) -> DictionaryChecksums:
        """The checksums of these rows (``terms`` None: of the relations only)."""
        found = cls(terms=None if terms is None else _extended([0, 0, 0, 0], terms))
        found.add_relations(relations)
        return found

    @classmethod
    def from_text(cls, text: str) -> DictionaryChecksums:
        """The saved checksums; ValueError when the note itself is damaged."""
        saved = json.loads(text)
        terms, relations = saved.get("terms"), saved["relations"]
        if not (
            isinstance(relations, list)
            and len(relations) == 3
            and (terms is None or isinstance(terms, list) and len(terms) == 4)
            and all(isinstance(crc, int) for crc in [*(terms or ()), *relations])
        ):
            raise ValueError(f"not dictionary checksums: {text[:80]!r}")
        return cls(terms, relations)

    def differences(self, saved: DictionaryChecksums) -> list[str]:
        """Which of the dictionaries these checksums cover differ from ``saved``: ``terms``,
        ``relations``, both or none (terms saved but not covered here are not compared)."""
        differing = []
        if self.terms is not None and self.terms != saved.terms:
            differing.append("terms")
        if self.relations != saved.relations:
            differing.append("relations")
        return differing
