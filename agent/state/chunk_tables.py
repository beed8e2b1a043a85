"""The state file's two tables of packed facts, and the SQL that reads and changes them.

``derived`` holds each hyper-node's derived facts (owner: the hyper-node's row in ``nodes``);
``explicit`` holds the explicit facts each source claims (owner: the source's name, see
agent/state/claims.py). Both hold one row per (owner, relation id, chunk of prefixes), packed as
agent/state/packing.py describes, with the chunk's fact count, largest ids and checksum beside
it. Facts are handed in and out as ``(relation id, *prefix) -> last-column ids``.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from functools import partial
from itertools import chain

from pyroaring import BitMap

from agent.engine.language import RelationKey
from agent.engine.storage.store import SavedFacts, SavedSubjects, grouped_by
from agent.state.packing import checksum, chunk_of, pack, single_ids, unpack

Entries = Iterable[tuple[tuple[int, ...], BitMap | bytes]]  # ((relation id, *prefix), ids)


@dataclass(frozen=True)
class ChunkTable:
    """One table of packed facts: its name and the column naming a row's owner."""

    name: str
    owner: str

    def insert(self, conn: sqlite3.Connection, owner: object, entries: Entries) -> None:
        """Write an owner's facts in full, by chunk (no row of theirs may exist yet)."""
        chunks: dict[tuple[int, int], list[tuple[tuple[int, ...], BitMap | bytes]]] = {}
        for key, objects in entries:
            prefix = key[1:]
            chunks.setdefault((key[0], chunk_of(prefix)), []).append((prefix, objects))
        conn.executemany(
            f"INSERT INTO {self.name} ({self.owner}, rel, chunk, size, high, top, crc, packed) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (
                (owner, rid, chunk, *pack(len(items[0][0]), items))
                for (rid, chunk), items in chunks.items()
            ),
        )

    def change(
        self,
        conn: sqlite3.Connection,
        owner: object,
        gone: Mapping[tuple[int, ...], Iterable[int]],
        new: Mapping[tuple[int, ...], Iterable[int]],
    ) -> None:
        """Apply net changes to the bitmaps of the prefixes they touch (read, changed, written
        back; a bitmap left empty is dropped, and a chunk left empty deleted) in the chunks
        holding them; the chunks' other bitmaps are copied as they are. The changes must be
        net: a removed fact saved, an added one not; anything else means the caller and the
        file disagree, and is raised as ``sqlite3.IntegrityError``, as is a chunk that no
        longer matches its checksum (rewritten, its damage would get a fresh one)."""
        touched: dict[tuple[int, int], list[tuple[int, ...]]] = {}
        for key in gone.keys() | new.keys():  # (relation id, *prefix)
            touched.setdefault((key[0], chunk_of(key[1:])), []).append(key)
        where = f"{self.owner} = ? AND rel = ? AND chunk = ?"
        for (rid, chunk), keys in touched.items():
            saved = conn.execute(
                f"SELECT size, high, top, crc, CAST(packed AS BLOB) FROM {self.name} WHERE {where}",
                (owner, rid, chunk),
            ).fetchone()
            entries: dict[tuple[int, ...], BitMap | bytes] = {}
            size = high = top = 0
            if saved:
                size, high, top, crc, blob = saved
                if checksum(size, high, top, blob) != crc:  # (its counts are trusted below)
                    raise sqlite3.IntegrityError(
                        f"{self.name} row of {self.owner} {owner!r}, relation {rid}, chunk "
                        f"{chunk}: damaged (it does not match its checksum)"
                    )
                old = unpack(blob)
                entries.update(zip(old.prefixes, old.pieces, strict=True))
            # The row's counts follow from the old ones and the change, except the largest
            # object when the change removes it (then ``pack`` reads every bitmap again).
            exact = True
            for key in keys:
                prefix = key[1:]
                lost, gained = BitMap(gone.get(key, ())), BitMap(new.get(key, ()))
                piece = entries.pop(prefix, None)
                objects = BitMap() if piece is None else BitMap.deserialize(piece)  # type: ignore[arg-type]
                if not lost.issubset(objects) or gained.intersect(objects - lost):
                    raise sqlite3.IntegrityError(
                        f"{self.name} row of {self.owner} {owner!r}, relation {rid}, prefix "
                        f"{prefix}: the saved facts do not match the change being written"
                    )
                objects -= lost
                objects |= gained
                size += len(gained) - len(lost)
                if lost and lost.max() >= high:
                    exact = False
                if gained:
                    high = max(high, gained.max())
                if objects:
                    entries[prefix] = objects
            if entries:
                top = max((max(prefix) for prefix in entries if prefix), default=0)
                conn.execute(
                    f"INSERT INTO {self.name} "
                    f"({self.owner}, rel, chunk, size, high, top, crc, packed) "
                    f"VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT ({self.owner}, rel, chunk) "
                    "DO UPDATE SET size = excluded.size, high = excluded.high, "
                    "top = excluded.top, crc = excluded.crc, packed = excluded.packed",
                    (
                        owner,
                        rid,
                        chunk,
                        *pack(
                            len(keys[0]) - 1,
                            entries.items(),
                            (size, high, top) if exact else None,
                        ),
                    ),
                )
            elif saved:
                conn.execute(f"DELETE FROM {self.name} WHERE {where}", (owner, rid, chunk))


DERIVED = ChunkTable("derived", "node")
EXPLICIT = ChunkTable("explicit", "source")


def group_last(facts: Iterable[tuple[int, ...]]) -> dict[tuple[int, ...], list[int]]:
    """Tuples grouped by every column but the last: prefix -> the last column's values."""
    groups: dict[tuple[int, ...], list[int]] = {}
    for fact in facts:
        found = groups.get(fact[:-1])
        if found is None:
            groups[fact[:-1]] = [fact[-1]]
        else:
            found.append(fact[-1])
    return groups


def saved_facts(
    key: RelationKey, blobs: list[bytes], count: int | None, *, plain: bool = False
) -> SavedFacts:
    """A relation's rows (checked already) as the engine takes them back: a binary relation
    as subject -> objects, left serialised until a reader first uses it when its fact count
    is known (``count``: the rows hold no fact twice), else united now; any other arity as a
    set of tuples. ``plain``: see `subjects_of`."""
    if key[1] != 2:
        return {
            (*prefix, last)
            for blob in blobs
            for prefix, ids in unpack(blob).items()
            for last in ids
        }
    if count is not None:
        return SavedSubjects(count, partial(subjects_of, blobs, plain=plain))
    return subjects_of(blobs, plain=plain)


def subjects_of(blobs: list[bytes], *, plain: bool = False) -> dict[int, AbstractSet[int]]:
    """A binary relation's rows as subject -> objects, united where several rows hold one
    subject (several sources claim facts of it): bitmaps, or, with ``plain`` and when every
    subject of every row holds one id, Python sets. Why sets there: the engine keeps explicit
    facts in Python sets, so a restarted agent's readings (one per sensor) are then stored as
    a running agent's are, made for a fraction of a bitmap's cost each, and never converted
    for a rule's plan."""
    rows = [single_ids(blob) for blob in blobs]
    if plain and all(row is not None for row in rows):
        pairs = chain.from_iterable(zip(*row, strict=True) for row in rows)  # type: ignore[misc]
        return grouped_by(pairs, 0)
    bitmaps: dict[int, BitMap] = {}
    deserialize = BitMap.deserialize
    for blob, singles in zip(blobs, rows, strict=True):
        if singles is not None:  # (every subject of the row holds one id)
            for subject, one in zip(*singles, strict=True):
                known = bitmaps.get(subject)
                if known is None:
                    bitmaps[subject] = known = BitMap()
                known.add(one)
            continue
        chunk = unpack(blob)
        for (subject,), piece in zip(chunk.prefixes, chunk.pieces, strict=True):
            known = bitmaps.get(subject)
            if known is None:
                bitmaps[subject] = deserialize(piece)
            else:
                known |= deserialize(piece)
    return bitmaps
