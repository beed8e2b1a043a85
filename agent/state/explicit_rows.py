"""The explicit facts in the state file: what each source claims, packed by chunk.

A fact is explicit while at least one source claims it (agent/state/claims.py). The ``explicit``
table holds each source's claimed facts as derived facts are held (agent/state/packing.py): by
prefix, the last column's ids as a bitmap, prefixes packed into chunks, a row per (relation,
chunk, source) with the chunk's fact count, largest ids and checksum. Why not a row per fact:
a restart reads every explicit fact, and SQLite hands a row to Python in about half a
microsecond per fact, more than the rest of a small state's restart; and a row per fact would
have no checksum, so a fact whose id a damaged byte changed into another valid id would load
as another fact. A restart reads a few blobs and checks them.

The primary key starts with (relation, chunk): the claims on a fact are one lookup of the
chunk holding it, every source's row together. An index by source serves what one source
claims (its readings, compared with each new batch of them) without a pass over every row.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator

from pyroaring import BitMap

from agent.engine.language import RelationKey
from agent.engine.storage.store import SavedFacts
from agent.state.chunk_tables import EXPLICIT, group_last, saved_facts
from agent.state.packing import chunk_of, unpack, verify

EXPLICIT_TABLE = """CREATE TABLE explicit (
    source TEXT NOT NULL, rel INTEGER NOT NULL, chunk INTEGER NOT NULL,
    size INTEGER NOT NULL, high INTEGER NOT NULL, top INTEGER NOT NULL, crc INTEGER NOT NULL,
    packed BLOB NOT NULL,
    PRIMARY KEY (rel, chunk, source)
);
CREATE INDEX explicit_by_source ON explicit (source)"""

Claimed = dict[str, list[tuple[int, ...]]]  # source -> its facts as (relation id, *fact)


def load_explicit(
    conn: sqlite3.Connection, relations: dict[int, RelationKey]
) -> dict[RelationKey, SavedFacts]:
    """The explicit facts, the union of every source's, by relation: a binary relation that
    one source claims stays serialised until a reader first uses it (``SavedSubjects``, as
    derived facts), one that several claim is united subject by subject (Python sets where
    every subject holds one object, as the engine keeps explicit facts: `subjects_of`), any
    other relation is a set of tuples. A row whose checksum does not match raises
    ValueError, a relation id the file does not have KeyError (a damaged state; ids naming no
    term are found before, by the integrity check)."""
    rows: dict[int, list[tuple[str, int, bytes]]] = {}
    for source, rid, size, high, top, crc, blob in conn.execute(
        "SELECT source, rel, size, high, top, crc, CAST(packed AS BLOB) FROM explicit"
    ):
        verify(size, high, top, crc, blob)
        rows.setdefault(rid, []).append((source, size, blob))
    found: dict[RelationKey, SavedFacts] = {}
    for rid, saved in rows.items():
        one_source = len({source for source, _, _ in saved}) == 1
        count = sum(size for _, size, _ in saved) if one_source else None
        blobs = [blob for *_, blob in saved]
        found[relations[rid]] = saved_facts(relations[rid], blobs, count, plain=True)
    return found


class ClaimReader:
    """The sources claiming explicit facts, read from the file a chunk at a time: the chunk
    holding a fact, with every source's row of it, is read once per reader (one change, whose
    facts often share chunks), checked against its checksum (DamagedRow), and its bitmaps
    deserialised when first asked."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        self._chunks: dict[tuple[int, int], dict[str, dict[tuple[int, ...], bytes | BitMap]]] = {}

    def sources(self, rid: int, fact: tuple[int, ...]) -> set[str]:
        """The sources claiming ``fact`` (term ids) of relation ``rid``."""
        prefix, last = fact[:-1], fact[-1]
        place = (rid, chunk_of(prefix))
        chunks = self._chunks.get(place)
        if chunks is None:
            chunks = self._chunks[place] = {}
            for source, size, high, top, crc, blob in self.conn.execute(
                "SELECT source, size, high, top, crc, CAST(packed AS BLOB) FROM explicit "
                "WHERE rel = ? AND chunk = ?",
                place,
            ):
                verify(size, high, top, crc, blob)  # (DamagedRow: claims read from damage)
                chunk = unpack(blob)
                chunks[source] = dict(zip(chunk.prefixes, chunk.pieces, strict=True))
        found = set()
        for source, pieces in chunks.items():
            ids = pieces.get(prefix)
            if ids is None:
                continue
            if isinstance(ids, bytes):
                ids = pieces[prefix] = BitMap.deserialize(ids)
            if last in ids:
                found.add(source)
        return found


def write_claims(conn: sqlite3.Connection, released: Claimed, claimed: Claimed) -> None:
    """Remove the ``released`` claims and add the ``claimed`` ones, source by source (each
    must be net: a released fact claimed by its source, a claimed one not yet)."""
    for source in released.keys() | claimed.keys():
        EXPLICIT.change(
            conn,
            source,
            group_last(released.get(source, ())),
            group_last(claimed.get(source, ())),
        )


def insert_claims(conn: sqlite3.Connection, claimed: Claimed) -> None:
    """Write every source's facts in full (a new table: the upgrade to schema version 8)."""
    for source, facts in claimed.items():
        EXPLICIT.insert(
            conn, source, ((key, BitMap(ids)) for key, ids in group_last(facts).items())
        )


def facts_of_source(conn: sqlite3.Connection, source: str) -> Iterator[tuple[int, ...]]:
    """The facts ``source`` claims, as ``(relation id, *fact)``."""
    for rid, blob in conn.execute(
        "SELECT rel, CAST(packed AS BLOB) FROM explicit WHERE source = ? ORDER BY rel, chunk",
        (source,),
    ):
        for prefix, ids in unpack(blob).items():
            for last in ids:
                yield (rid, *prefix, last)
