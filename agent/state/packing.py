"""How the agent's state file packs facts into rows: a hyper-node's derived facts (``derived``)
and the explicit facts each source claims (``explicit``).

A relation's facts are grouped by **prefix** (every column but the last; for a binary relation,
the subject), each prefix holding the last column's ids as a compressed bitmap (pyroaring's
``BitMap`` in the portable Roaring format). Prefixes are then packed into **chunks**: those
whose first id agrees above the low ``CHUNK_BITS`` bits share one row, whose ``packed`` blob is

    header      two little-endian uint32: the number of prefixes n, the prefix width w
    prefixes    n * w uint32, sorted
    ends        n uint32: where each prefix's serialised bitmap ends in ``bitmaps``
    bitmaps     the serialised bitmaps, one after the other

with, beside it, the chunk's fact count (``size``), its largest last-column id (``high``), its
largest prefix id (``top``) and a CRC-32 of the counts and the blob (``crc``).

Why chunks and not a row per prefix: a restart reads every row, and SQLite hands over a row
in about a microsecond per column, which for a row per subject cost more than the rest of the
restart together (RS2 over DS2(200): half of the restart for 5,008 rows; 92 rows now). Why
not bigger chunks: an update rewrites the chunks it touches, reading each untouched bitmap of
them again for the row's counts, and a chunk of 64 subjects (about 1.4 KB for the farm's
relations) stays within one SQLite page; with 1,024 a small committed update cost 2.2x the
same update in memory instead of 1.6x. The CRC is checked when the file is opened (a damaged
row is refused then, never met later by a query), which is what lets the agent leave the
bitmaps serialised until a reader first asks for the relation (``store.SavedSubjects``).
"""

from __future__ import annotations

import struct
import sys
import zlib
from array import array
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import NamedTuple

from pyroaring import BitMap

CHUNK_BITS = 6  # a chunk holds the prefixes whose first id agrees above these bits
_HEADER = struct.Struct("<II")
_COUNTS = struct.Struct("<qqq")
_SWAP = sys.byteorder != "little"  # (the blob is little-endian on every machine)


def chunk_of(prefix: tuple[int, ...]) -> int:
    """The chunk a prefix belongs to (a relation of arity 1 has one prefix, (), in chunk 0)."""
    return prefix[0] >> CHUNK_BITS if prefix else 0


@dataclass
class Chunk:
    """One row's prefixes with their bitmaps, still serialised (``pieces``) until `items`
    or an update needs them."""

    width: int
    prefixes: list[tuple[int, ...]]
    pieces: list[bytes]

    def items(self) -> Iterator[tuple[tuple[int, ...], BitMap]]:
        for prefix, piece in zip(self.prefixes, self.pieces, strict=True):
            yield prefix, BitMap.deserialize(piece)


class PackedRow(NamedTuple):
    """A chunk as the ``derived`` table holds it, in its columns' order (see the module
    docstring)."""

    size: int
    high: int
    top: int
    crc: int
    packed: bytes


def pack(
    width: int,
    entries: Iterable[tuple[tuple[int, ...], BitMap | bytes]],
    counts: tuple[int, int, int] | None = None,
) -> PackedRow:
    """A chunk's row from its prefixes and their non-empty bitmaps (or bitmaps serialised
    already, copied as they are). Prefixes are written sorted: the same facts give the same
    bytes. ``counts``: the row's (size, high, top) when the caller knows them (a chunk changed
    in place, from its old row's counts and the change), so that the bitmaps copied as they
    are need not be read again for them."""
    ordered = sorted(entries, key=lambda entry: entry[0])
    prefixes = array("I")
    ends = array("I")
    pieces: list[bytes] = []
    size = high = top = end = 0
    for prefix, objects in ordered:
        if isinstance(objects, bytes):
            piece = objects
            if counts is None:
                bitmap = BitMap.deserialize(objects)
                size += len(bitmap)
                high = max(high, bitmap.max())
        else:
            objects.run_optimize()  # runs of consecutive ids (a sensor's readings) as ranges
            piece = objects.serialize()
            if counts is None:
                size += len(objects)
                high = max(high, objects.max())
        if prefix and counts is None:
            top = max(top, *prefix)
        prefixes.extend(prefix)
        end += len(piece)
        ends.append(end)
        pieces.append(piece)
    if counts is not None:
        size, high, top = counts
    if _SWAP:
        prefixes.byteswap()
        ends.byteswap()
    blob = b"".join(
        [_HEADER.pack(len(ordered), width), prefixes.tobytes(), ends.tobytes(), *pieces]
    )
    return PackedRow(size, high, top, checksum(size, high, top, blob), blob)


class DamagedRow(ValueError):
    """A packed row that is not as `pack` wrote it: a damaged state file."""


def unpack(blob: bytes) -> Chunk:
    """A row's chunk (its bitmaps left serialised). Raises DamagedRow for a blob that is not
    one (`verify` finds damage first: see the module docstring)."""
    if len(blob) < _HEADER.size:
        raise DamagedRow("a packed row's blob is too short")
    count, width = _HEADER.unpack_from(blob)
    start = _HEADER.size
    middle = start + 4 * count * width
    data = middle + 4 * count
    if data > len(blob):
        raise DamagedRow("a packed row's blob is shorter than its header says")
    prefixes, ends = array("I"), array("I")
    prefixes.frombytes(blob[start:middle])
    ends.frombytes(blob[middle:data])
    if _SWAP:
        prefixes.byteswap()
        ends.byteswap()
    if width == 0:
        keys = [()] * count
    elif width == 1:
        keys = [(value,) for value in prefixes]
    else:
        keys = [tuple(prefixes[i : i + width]) for i in range(0, count * width, width)]
    if count and data + ends[-1] != len(blob):
        raise DamagedRow("a packed row's bitmaps do not fill its blob")
    view = memoryview(blob)
    pieces = []
    begin = data
    for end in ends:
        pieces.append(bytes(view[begin : data + end]))
        begin = data + end
    return Chunk(width, keys, pieces)


# A bitmap of one id in the portable format, as nine little-endian uint16: the cookie of a
# bitmap without run containers (12346, two words), one container (two words), its key (the
# id's high 16 bits), its cardinality less one (0), the offset of its data (16, two words),
# and the id's low 16 bits. `pack` writes every one-id bitmap so (a run container never holds
# a lone id). Word -> the value every such bitmap has there:
_ONE_ID_WORDS = 9
_ONE_ID_FIXED = {0: 12346, 1: 0, 2: 1, 3: 0, 5: 0, 6: 16, 7: 0}


def single_ids(blob: bytes) -> tuple[array, list[int]] | None:
    """A row of a binary relation whose every subject holds one id: (its subjects, their
    ids), read in a few C-level passes; None for any other row (`unpack` reads those).
    Why: deserialising a bitmap costs about 0.9 us whatever it holds, and relations of one
    object per subject (a reading, a count, a median per turbine) are most of a farm's rows."""
    if len(blob) < _HEADER.size:
        return None
    count, width = _HEADER.unpack_from(blob)
    start = _HEADER.size
    middle = start + 4 * count
    data = middle + 4 * count
    size = 2 * _ONE_ID_WORDS
    if width != 1 or not count or data + size * count != len(blob):
        return None
    ends, words = array("I"), array("H")
    ends.frombytes(blob[middle:data])
    words.frombytes(blob[data:])
    if _SWAP:
        ends.byteswap()
        words.byteswap()
    if ends != array("I", range(size, size * count + 1, size)):
        return None
    for word, value in _ONE_ID_FIXED.items():
        if words[word::_ONE_ID_WORDS].count(value) != count:
            return None
    subjects = array("I")
    subjects.frombytes(blob[start:middle])
    if _SWAP:
        subjects.byteswap()
    highs, lows = words[4::_ONE_ID_WORDS], words[8::_ONE_ID_WORDS]
    ids = [high << 16 | low for high, low in zip(highs, lows, strict=True)]
    return subjects, ids


def checksum(size: int, high: int, top: int, blob: bytes) -> int:
    """The CRC-32 of a row's counts and blob: a row whose counts or bytes changed after it
    was written no longer matches it."""
    return zlib.crc32(blob, zlib.crc32(_COUNTS.pack(size, high, top)))


def verify(size: int, high: int, top: int, crc: int, blob: bytes) -> None:
    """Raise DamagedRow unless the row is as `pack` wrote it (its bitmaps are not read: the
    restart leaves them serialised, and this check is what lets it)."""
    if checksum(size, high, top, blob) != crc:
        raise DamagedRow("a packed row does not match its checksum")
