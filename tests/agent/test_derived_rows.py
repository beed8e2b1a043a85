"""Packed rows of facts read back (agent/state/packing.py, agent/state/chunk_tables.py): whatever
bitmaps a row holds, reading it gives them back, by the general path or by the one for rows
whose every subject holds one id, and for explicit facts as Python sets where every subject
holds one id."""

from __future__ import annotations

import struct

from hypothesis import given
from hypothesis import strategies as st
from pyroaring import BitMap

from agent.state import chunk_tables
from agent.state.chunk_tables import subjects_of
from agent.state.packing import pack, single_ids, unpack

IDS = st.one_of(st.integers(0, 70), st.integers(0, 2**32 - 1), st.sampled_from([0, 65535, 65536]))
OBJECTS = st.one_of(
    st.builds(lambda i: BitMap([i]), IDS),  # one id: most rows of a farm
    st.builds(BitMap, st.lists(IDS, min_size=1, max_size=6)),
    st.builds(lambda a, n: BitMap(range(a, a + n)), st.integers(0, 2**20), st.integers(2, 300)),
)
ROWS = st.lists(
    st.dictionaries(st.integers(0, 2**32 - 1), OBJECTS, min_size=1, max_size=70),
    min_size=1,
    max_size=4,
)


def read_by_unpacking(blobs: list[bytes]) -> dict[int, BitMap]:
    found: dict[int, BitMap] = {}
    for blob in blobs:
        for (subject,), objects in unpack(blob).items():
            found[subject] = found.get(subject, BitMap()) | objects
    return found


@given(ROWS)
def test_rows_read_back_as_the_bitmaps_they_were_packed_from(rows):
    """Several rows may hold one subject (sources claiming facts of it): read back, it holds
    the union, of the same ids by either path."""
    blobs = [pack(1, [((s,), objects) for s, objects in row.items()]).packed for row in rows]
    expected = read_by_unpacking(blobs)
    for row, blob in zip(rows, blobs, strict=True):
        found = single_ids(blob)
        if all(len(objects) == 1 for objects in row.values()):
            assert found is not None
            subjects, ids = found
            assert dict(zip(subjects, ids, strict=True)) == {
                s: objects.min() for s, objects in row.items()
            }
        else:
            assert found is None
    got = subjects_of(blobs)
    assert got == expected
    assert all(objects.__class__ is BitMap for objects in got.values())
    # Explicit facts: Python sets when every subject of every row holds one id (as a running
    # engine keeps them), else bitmaps as above.
    plain = subjects_of(blobs, plain=True)
    assert {s: set(objects) for s, objects in plain.items()} == {
        s: set(objects) for s, objects in expected.items()
    }
    singles = all(len(objects) == 1 for row in rows for objects in row.values())
    kinds = {objects.__class__ for objects in plain.values()}
    assert kinds == ({set} if singles else {BitMap})


def test_a_row_of_one_id_per_subject_takes_the_short_path(monkeypatch):
    blob = pack(1, [((s,), BitMap([s * 70_000])) for s in range(64)]).packed
    monkeypatch.setattr(chunk_tables, "unpack", None)  # (the general path would fail)
    assert subjects_of([blob]) == {s: BitMap([s * 70_000]) for s in range(64)}


def test_a_one_id_bitmap_in_another_form_is_left_to_the_general_path():
    """Only the form ``pack`` writes is read by the short path: the same bytes with any fixed
    word changed (as a bitmap with run containers would be) are not taken for one id."""
    blob = pack(1, [((1,), BitMap([5])), ((2,), BitMap([7]))]).packed
    data = len(blob) - 2 * 18
    for word in (0, 1, 2, 3, 5, 6, 7):
        changed = bytearray(blob)
        struct.pack_into("<H", changed, data + 18 + 2 * word, 3)
        assert single_ids(bytes(changed)) is None
    assert single_ids(blob) is not None
