"""The term dictionary as the state file keeps it: chunks of ids with a checksum each
(agent/state/term_rows.py), written as commits add terms and read back whole."""

from __future__ import annotations

import sqlite3
import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.engine.language import Literal
from agent.state.packing import DamagedRow
from agent.state.term_rows import TERMS_PER_CHUNK, TERMS_TABLE, load_terms, pack_terms, write_terms

TERMS = st.one_of(
    st.text(min_size=1).filter(lambda s: not any(0xD800 <= ord(c) <= 0xDFFF for c in s)),
    st.integers(),
    st.floats(allow_nan=False, allow_infinity=False),
    st.booleans(),
    st.builds(
        Literal,
        st.text(),
        st.none() | st.just("http://ex/dt"),
        st.none() | st.sampled_from(["en", "fr-be"]),
    ),
)


def typed(values) -> list[tuple[str, str]]:
    return [(type(value).__name__, repr(value)) for value in values]


def empty_table() -> sqlite3.Connection:
    conn = sqlite3.connect(":memory:")
    conn.execute(TERMS_TABLE)
    return conn


def insert_chunk(conn: sqlite3.Connection, chunk: int, values: list) -> None:
    """A chunk written by hand, its count and checksum consistent with what it holds."""
    packed = pack_terms(values)
    conn.execute(
        "INSERT INTO terms (chunk, count, crc, packed) VALUES (?, ?, ?, ?)",
        (chunk, len(values), zlib.crc32(packed), packed),
    )


@given(st.lists(st.lists(TERMS, max_size=2 * TERMS_PER_CHUNK + 3), min_size=1, max_size=6))
def test_terms_written_commit_after_commit_read_back_with_their_ids(batches):
    """Each batch is one commit's new terms: the last chunk is rewritten when partly filled
    and new chunks follow; reading back gives every term, of its own type, at its id."""
    conn = empty_table()
    values: list = []
    for batch in batches:
        saved = len(values)
        values += batch
        write_terms(conn, values, saved)
        assert typed(load_terms(conn)) == typed(values)
        counts = [count for (count,) in conn.execute("SELECT count FROM terms ORDER BY chunk")]
        assert sum(counts) == len(values)
        assert all(count == TERMS_PER_CHUNK for count in counts[:-1])


def ids(start: int, count: int) -> list[str]:
    return [f"http://ex/t{i}" for i in range(start, start + count)]


@pytest.mark.parametrize(
    "chunks",
    [
        [(0, ids(0, 10)), (1, ids(10, 5))],  # a chunk not full before the last
        [(0, ids(0, TERMS_PER_CHUNK + 1))],  # one too many (the next commit would misplace)
        [(0, ids(0, TERMS_PER_CHUNK)), (2, ids(TERMS_PER_CHUNK, 3))],  # a chunk missing
        [(1, ids(0, 4))],  # the first missing
        [(0, [])],  # an empty chunk
    ],
    ids=["short", "too long", "gap", "no first", "empty"],
)
def test_chunks_that_would_shift_ids_are_refused(chunks):
    conn = empty_table()
    for chunk, values in chunks:
        insert_chunk(conn, chunk, values)
    with pytest.raises(DamagedRow):
        load_terms(conn)


@pytest.mark.parametrize(
    "packed",
    [
        b'{"a": 1}',
        b'[{"a": 1}, []]',
        b'[["x", {"a": 1}], []]',
        b'[["x", ["l", null, null]], []]',  # a literal not listed as one
        b'[["x", ["l", 7, null]], [1]]',
        b'[["x", "y"], [0]]',
        b"[[1, 2], [0, 0]]",
        b"not json",
    ],
)
def test_a_chunk_that_holds_anything_but_terms_is_refused(packed):
    """Even with its checksum consistent (damage that kept it, or a writer's bug)."""
    conn = empty_table()
    conn.execute(
        "INSERT INTO terms (chunk, count, crc, packed) VALUES (0, 2, ?, ?)",
        (zlib.crc32(packed), packed),
    )
    with pytest.raises(DamagedRow):
        load_terms(conn)


def test_a_chunk_is_rewritten_only_as_it_was_written():
    """The chunk a commit rewrites is checked first: damaged (or not the count memory
    holds), it is refused rather than given a fresh checksum."""
    conn = empty_table()
    values = ids(0, 5)
    write_terms(conn, values, 0)
    conn.execute("UPDATE terms SET packed = CAST(replace(packed, 't3', 'T3') AS BLOB)")
    with pytest.raises(sqlite3.IntegrityError, match="term chunk 0"):
        write_terms(conn, [*values, "http://ex/new"], 5)
    with pytest.raises(sqlite3.IntegrityError, match="term chunk 0"):
        write_terms(empty_table(), [*values, "http://ex/new"], 5)  # (no such chunk saved)
