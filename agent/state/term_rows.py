"""How the agent's state file keeps the term dictionary: in chunks of
``TERMS_PER_CHUNK`` consecutive term ids, one row each, with a checksum.

A term's id is its position in the dictionary (agent/engine/terms.py), and ids are given in
order and never taken back, so chunk ``c`` holds the terms ``c * TERMS_PER_CHUNK`` onwards, and
every chunk but the last is full. A row's ``packed`` blob is the JSON text (ASCII)

    [values, literals]

where ``values`` are the chunk's terms in id order, as JSON has them: an IRI is a string, an
integer a number without a fraction (of any size), a float one with it (``NaN`` and
``Infinity`` as Python writes them), a boolean ``true`` or ``false``; a literal that is none of
these is ``[lexical, datatype, language]`` (the last two may be null) at one of the positions
listed in ``literals``. Beside the blob: the number of terms (``count``) and a CRC-32 of the blob
(``crc``).

Why: a term was a row of four columns before, and a restart read them all, one by one,
through SQLite's row interface, hashed their text against running checksums and checked their
kinds with four queries more. That cost more than the rest of a restart of the farm's rule sets
together, and grows with the terms: a state of 60,000 sensor readings has about as many
distinct values. One JSON text per chunk is decoded by C code in one call, and its checksum
covers it whole. Why not bigger chunks: a commit that adds terms rewrites the last chunk,
which must stay small next to the commit's fixed cost (a chunk of 256 terms of the farm is
about 5 KB, encoded in some tens of microseconds); a restart pays a small cost per row, which
for 256 terms a row is negligible next to decoding them.
"""

from __future__ import annotations

import json
import sqlite3
import zlib
from collections.abc import Sequence

from agent.engine.language import Literal, Value
from agent.state.packing import DamagedRow

TERMS_PER_CHUNK = 256
TERMS_TABLE = (
    "CREATE TABLE terms (chunk INTEGER PRIMARY KEY, count INTEGER NOT NULL, "
    "crc INTEGER NOT NULL, packed BLOB NOT NULL)"
)
_PLAIN = frozenset({str, int, float, bool})  # what JSON gives back for a term not a literal


def pack_terms(values: Sequence[Value]) -> bytes:
    """The blob of a chunk holding ``values`` (module docstring)."""
    plain: list[object] = list(values)
    literals = []
    for position, value in enumerate(values):
        if value.__class__ is Literal:
            plain[position] = [value.lexical, value.datatype, value.language]  # type: ignore[union-attr]
            literals.append(position)
    return json.dumps([plain, literals], separators=(",", ":"), allow_nan=True).encode("ascii")


def unpack_terms(chunk: int, count: int, crc: int, packed: bytes) -> list[Value]:
    """A chunk's terms, checked against its count and checksum (DamagedRow if they differ or
    the blob holds anything but terms)."""
    if not isinstance(packed, bytes) or zlib.crc32(packed) != crc:
        raise DamagedRow(f"term chunk {chunk} does not match its checksum")
    try:
        values, literals = json.loads(packed)
        if values.__class__ is not list or literals.__class__ is not list:
            raise TypeError("not two lists")
        for position in literals:
            lexical, datatype, language = values[position]
            if not isinstance(lexical, str) or not all(
                part is None or isinstance(part, str) for part in (datatype, language)
            ):
                raise ValueError(f"not a literal: {values[position]!r}")
            values[position] = Literal(lexical, datatype, language)
    except (ValueError, TypeError, IndexError) as error:
        raise DamagedRow(f"term chunk {chunk} does not hold terms ({error})") from None
    if len(values) != count:
        raise DamagedRow(f"term chunk {chunk} holds {len(values)} terms, saved as {count}")
    kinds = set(map(type, values))  # (a list left at a position not listed: not a term)
    kinds.discard(Literal)
    if not kinds <= _PLAIN:
        raise DamagedRow(f"term chunk {chunk} holds values that are not terms")
    return values


def load_terms(conn: sqlite3.Connection) -> list[Value]:
    """Every saved term, in id order. DamagedRow when a chunk is damaged, missing, or not
    full before the last (the ids after it would shift)."""
    terms: list[Value] = []
    for chunk, count, crc, packed in conn.execute(
        "SELECT chunk, count, crc, packed FROM terms ORDER BY chunk"
    ):
        # (after a chunk not full, len(terms) is no multiple of the chunk size: refused too)
        if chunk * TERMS_PER_CHUNK != len(terms):
            raise DamagedRow(f"term chunk {chunk} is not where the ids before it end")
        values = unpack_terms(chunk, count, crc, packed)
        if not values or len(values) > TERMS_PER_CHUNK:
            raise DamagedRow(f"term chunk {chunk} holds {len(values)} terms")
        terms += values
    return terms


def write_terms(conn: sqlite3.Connection, values: Sequence[Value], saved: int) -> None:
    """Save the terms from id ``saved`` on (the first ``saved`` are in the file): the last
    chunk, when partly filled, is rewritten with them, and new chunks follow. The chunk
    rewritten must be as it was written, or its damage would get a fresh checksum: anything
    else raises sqlite3.IntegrityError (the caller's transaction then changes nothing)."""
    if len(values) <= saved:
        return
    first = saved // TERMS_PER_CHUNK
    held = saved - first * TERMS_PER_CHUNK  # the terms of chunk ``first`` in the file
    if held:
        row = conn.execute(
            "SELECT count, crc, packed FROM terms WHERE chunk = ?", (first,)
        ).fetchone()
        count, crc, packed = row if row is not None else (None, None, None)
        if count != held or not isinstance(packed, bytes) or zlib.crc32(packed) != crc:
            raise sqlite3.IntegrityError(
                f"term chunk {first}: damaged (it does not match its checksum or its count)"
            )
    rows = []
    for chunk in range(first, (len(values) - 1) // TERMS_PER_CHUNK + 1):
        part = values[chunk * TERMS_PER_CHUNK : (chunk + 1) * TERMS_PER_CHUNK]
        packed = pack_terms(part)
        rows.append((chunk, len(part), zlib.crc32(packed), packed))
    conn.executemany(
        "INSERT INTO terms (chunk, count, crc, packed) VALUES (?, ?, ?, ?) "
        "ON CONFLICT (chunk) DO UPDATE SET count = excluded.count, crc = excluded.crc, "
        "packed = excluded.packed",
        rows,
    )
