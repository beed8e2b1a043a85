"""Facts in and out of the Spark job: RDF files, and Parquet datasets with a manifest.

Parquet layout (``write_parquet`` / ``read_parquet``)::

    DIR/manifest.json               {"format": ..., "relations": [{"predicate", "arity",
                                      "path", "facts"}, ...]}
    DIR/<name>__<arity>/part-*.parquet   one dataset per relation

Each dataset has one column per argument, ``c0 .. c{arity-1}``, holding a term as
``struct<kind, lexical, datatype, language, number>``: ``kind`` is ``iri`` (blank nodes
``_:x`` included), ``int``, ``float``, ``bool`` or ``literal``; ``lexical`` is the IRI, the
number's Python ``repr``, ``true``/``false`` or the literal's text; ``number`` repeats a number
as a DOUBLE for convenience (null otherwise). The encoding is lossless (ints of any size, floats
by ``repr``, literals with datatype or language), so reading a written directory gives back
exactly the same facts, and a written directory can be the input of another run. A class fact
``C(x)`` is relation ``(C, 1)``.

Only distinct *terms* cross to the driver (to be given ids by the engine's dictionary), never
the facts themselves; N-Triples output streams the facts to the driver partition by partition.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from agent.engine.errors import ZodiacError
from agent.engine.language import Literal, Value
from agent.engine.program.rdf import write_ntriples
from cloud.spark.terms import RelationKey, TermSpace

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import DataFrame, SparkSession


MANIFEST = "manifest.json"
FORMAT = "zodiac-cloud facts v1"
TERM_FIELDS = ("kind", "lexical", "datatype", "language", "number")
_UNSAFE = re.compile(r"[^A-Za-z0-9_.\-]+")


# ------------------------------------------------------------------ terms as rows
def term_row(value: Value) -> tuple:
    """A value as ``(kind, lexical, datatype, language, number)``."""
    if isinstance(value, bool):
        return ("bool", "true" if value else "false", None, None, None)
    if isinstance(value, str):
        return ("iri", value, None, None, None)
    if isinstance(value, int):
        return ("int", str(value), None, None, float(value) if abs(value) < 2**1023 else None)
    if isinstance(value, float):
        return ("float", repr(value), None, None, value)
    if isinstance(value, Literal):
        return ("literal", value.lexical, value.datatype, value.language, None)
    raise ZodiacError(f"cannot store a value of type {type(value).__name__}: {value!r}")


def row_value(kind: str, lexical: str, datatype: str | None, language: str | None) -> Value:
    """The inverse of :func:`term_row`."""
    if kind == "iri":
        return lexical
    if kind == "int":
        return int(lexical)
    if kind == "float":
        return float(lexical)
    if kind == "bool":
        return lexical == "true"
    if kind == "literal":
        return Literal(lexical, datatype, language)
    raise ZodiacError(f"unknown term kind {kind!r} (lexical form {lexical!r})")


def term_type():
    from pyspark.sql import types as T

    return T.StructType(
        [
            T.StructField("kind", T.StringType(), False),
            T.StructField("lexical", T.StringType(), False),
            T.StructField("datatype", T.StringType(), True),
            T.StructField("language", T.StringType(), True),
            T.StructField("number", T.DoubleType(), True),
        ]
    )


def terms_frame(space: TermSpace) -> DataFrame:
    """``(id, term)`` for every term of the dictionary."""
    from pyspark.sql import types as T

    schema = T.StructType(
        [T.StructField("id", T.LongType(), False), T.StructField("term", term_type(), False)]
    )
    rows = [(i, term_row(v)) for i, v in enumerate(space.terms.values)]
    return space.spark.createDataFrame(rows, schema)


def decoded(frame: DataFrame, arity: int, terms: DataFrame) -> DataFrame:
    """A relation of term ids -> the same relation with term structs in ``c0 ..``."""
    from pyspark.sql import functions as F

    for i in range(arity):
        lookup = terms.select(F.col("id").alias(f"c{i}"), F.col("term").alias(f"__t{i}"))
        frame = frame.join(lookup, f"c{i}")
    return frame.select([F.col(f"__t{i}").alias(f"c{i}") for i in range(arity)])


# ------------------------------------------------------------------ Parquet out
def dataset_name(key: RelationKey, taken: set[str]) -> str:
    """A directory name for a relation: readable, unique within one output."""
    predicate, arity = key
    tail = predicate.rstrip("/#").rsplit("/", 1)[-1].rsplit("#", 1)[-1]
    base = f"{_UNSAFE.sub('_', tail)[:60] or 'relation'}__{arity}"
    if base in taken:
        base += "_" + hashlib.sha1(predicate.encode()).hexdigest()[:8]
    taken.add(base)
    return base


def write_parquet(
    relations: Mapping[RelationKey, DataFrame], space: TermSpace, directory: str | os.PathLike
) -> dict[RelationKey, int]:
    """One Parquet dataset per relation plus ``manifest.json``; returns the facts written.
    ``relations`` are encoded frames (a ``Materialisation`` is one), ``space`` their terms."""
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    terms = terms_frame(space).persist()
    taken: set[str] = set()
    entries, written = [], {}
    for key in sorted(relations):
        frame = relations[key]
        name = dataset_name(key, taken)
        decoded(frame, key[1], terms).write.mode("overwrite").parquet(str(root / name))
        written[key] = frame.count()
        entries.append(manifest_entry(key, name, written[key]))
    terms.unpersist()
    write_manifest(root, entries)
    return written


def manifest_entry(key: RelationKey, name: str, facts: int) -> dict:
    """One relation's line of ``manifest.json``: its predicate, arity, dataset and size."""
    return {"predicate": key[0], "arity": key[1], "path": name, "facts": facts}


def write_manifest(root: Path, entries: list[dict]) -> None:
    """``manifest.json`` of a fact directory, written by Spark's writer and the engine's."""
    manifest = {"format": FORMAT, "relations": entries}
    (root / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")


# ------------------------------------------------------------------ Parquet in
def read_manifest(directory: str | os.PathLike) -> list[dict]:
    path = Path(directory) / MANIFEST
    if not path.is_file():
        raise ZodiacError(f"{directory} is not a fact directory: it has no {MANIFEST}")
    manifest = json.loads(path.read_text(encoding="utf-8"))
    if manifest.get("format") != FORMAT:
        raise ZodiacError(f"{path}: unknown format {manifest.get('format')!r}, want {FORMAT!r}")
    return manifest["relations"]


def read_parquet(
    spark: SparkSession, directory: str | os.PathLike, space: TermSpace
) -> tuple[dict[RelationKey, DataFrame], dict[RelationKey, int]]:
    """Relations of a directory written by :func:`write_parquet`, encoded with ``space``.

    The distinct terms are collected and encoded on the driver, then joined back as ids."""
    from pyspark.sql import functions as F

    raw: dict[RelationKey, DataFrame] = {}
    for entry in read_manifest(directory):
        key = (entry["predicate"], int(entry["arity"]))
        frame = spark.read.parquet(str(Path(directory) / entry["path"]))
        raw[key] = frame if key not in raw else raw[key].unionByName(frame)
    if not raw:
        return {}, {}
    every = [
        frame.select(F.col(f"c{i}").alias("t")) for (_, n), frame in raw.items() for i in range(n)
    ]
    distinct = every[0]
    for frame in every[1:]:
        distinct = distinct.union(frame)
    fields = ["t.kind", "t.lexical", "t.datatype", "t.language"]
    rows = distinct.select(*fields).distinct().collect()
    ids = [(_key(*row), space.encode(row_value(*row))) for row in rows]
    mapping = spark.createDataFrame(ids, "key string, id long").persist()
    frames, counts = {}, {}
    for (name, arity), frame in raw.items():
        for i in range(arity):
            column = F.col(f"c{i}")
            frame = frame.withColumn(f"__k{i}", _key_column(column)).join(
                mapping.select(F.col("key").alias(f"__k{i}"), F.col("id").alias(f"__i{i}")),
                f"__k{i}",
            )
        frame = frame.select([F.col(f"__i{i}").alias(f"c{i}") for i in range(arity)])
        frames[(name, arity)] = frame.distinct().localCheckpoint(eager=True)
        counts[(name, arity)] = frames[(name, arity)].count()
    mapping.unpersist()
    return frames, counts


def _key(kind: str, lexical: str, datatype: str | None, language: str | None) -> str:
    return "\x1f".join((kind, lexical, datatype or "", language or ""))


def _key_column(column):
    from pyspark.sql import functions as F

    parts = [column[f] for f in ("kind", "lexical")]
    parts += [F.coalesce(column[f], F.lit("")) for f in ("datatype", "language")]
    return F.concat_ws("\x1f", *parts)


# ------------------------------------------------------------------ N-Triples out
def write_facts_ntriples(facts: Iterable[tuple], path: str | os.PathLike) -> tuple[int, int]:
    """Write facts (``Reasoner.facts()`` form) as N-Triples; returns (written, skipped).

    Facts that are no RDF triple (arity 3 or more, a subject that is no IRI) are skipped: they
    are in the Parquet output."""
    seen = 0

    def counted(source: Iterable[tuple]):
        nonlocal seen
        for fact in source:
            seen += 1
            yield fact

    with open(path, "w", encoding="utf-8", newline="\n") as out:
        written = write_ntriples(counted(facts), out)
    return written, seen - written
