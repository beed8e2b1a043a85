"""``zodiac-cloud materialise`` without Spark: the edge engine on the driver, for small inputs.

Why: a Spark session costs a JVM and Python workers before the first job (on a laptop most of a
small job's time, see docs/cloud.md "Small jobs skip Spark"), while the engine materialises a
farm's few thousand facts in well under a second. The engine is the reference the Spark job is
checked against (``Materialisation.facts()`` equals ``set(Reasoner.facts())``), so the output
is the same either way: the same Parquet layout and manifest (cloud/spark/storage.py, written
here with pyarrow) and the same ``facts.nt``.

``--spark auto`` (the default) runs here when the input has at most :data:`SPARK_ABOVE` facts
and the result stays under :data:`cloud.spark.driver.MAX_OUTPUT`; ``--spark never`` always
runs here (and needs neither pyspark nor Java); ``--spark always`` always starts Spark.
Nothing here imports pyspark.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from pathlib import Path

from agent.engine.budget import Budget, BudgetExceeded
from agent.engine.errors import ZodiacError
from agent.engine.language import RDF_TYPE, Program, Rule
from agent.engine.program.loaders import load_facts
from agent.engine.reasoner import Reasoner
from cloud.spark.driver import LOCAL_BELOW
from cloud.spark.storage import (
    TERM_FIELDS,
    dataset_name,
    manifest_entry,
    read_manifest,
    row_value,
    term_row,
    write_manifest,
)

#: Input facts (of the rule file, the RDF files and the Parquet fact directories) above which
#: ``--spark auto`` starts Spark: the driver's own threshold for a hyper-node's inputs
#: (``--local-below``), since a Spark job over fewer facts would run its first hyper-nodes on
#: the driver with the engine anyway, after paying for the session. Measured in docs/cloud.md
#: ("Small jobs skip Spark"): up to this size the engine alone finishes well before Spark.
SPARK_ABOVE = LOCAL_BELOW
MODES = ("auto", "always", "never")

RelationKey = tuple[str, int]


def missing_pyarrow() -> str | None:
    """Why Parquet cannot be written without Spark, or None."""
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        return "pyarrow is not installed (pip install pyarrow, part of the 'cloud' extra)"
    return None


def read_inputs(paths: Iterable[str | os.PathLike]) -> list[tuple]:
    """The facts of RDF files and of Parquet fact directories (written by ``materialise``)."""
    facts: list[tuple] = []
    for path in paths:
        if os.path.isdir(path):
            facts.extend(read_fact_directory(path))
        else:
            facts.extend(load_facts(path))
    return facts


def directory_size(path: str | os.PathLike) -> int:
    """The facts of a fact directory, from its manifest (nothing else is read)."""
    return sum(int(entry["facts"]) for entry in read_manifest(path))


def read_fact_directory(directory: str | os.PathLike) -> Iterator[tuple]:
    """A fact directory's facts as engine tuples, read with pyarrow."""
    import pyarrow.parquet as pq

    for entry in read_manifest(directory):
        predicate, arity = entry["predicate"], int(entry["arity"])
        table = pq.read_table(Path(directory) / entry["path"])
        columns = [table.column(f"c{i}").to_pylist() for i in range(arity)]
        for row in zip(*columns, strict=True):
            values = [
                row_value(t["kind"], t["lexical"], t["datatype"], t["language"]) for t in row
            ]
            if arity == 1:  # a class fact C(x): the engine's (rdf:type, x, C)
                yield (RDF_TYPE, values[0], predicate)
            else:
                yield (predicate, *values)


def materialise_on_engine(
    program: Program | Iterable[Rule],
    facts: Iterable[tuple],
    *,
    closures: bool = True,
    max_output: int | None = None,
) -> Reasoner | None:
    """The engine after it materialised ``program`` over ``facts``; None when it would hold
    more than ``max_output`` derived facts (then the job belongs in Spark)."""
    reasoner = Reasoner(modules=closures)
    reasoner.add_facts(facts)
    if max_output is not None:
        reasoner.budget = Budget(max_derived_facts=max_output)
    try:
        reasoner.add_rules(program)
    except BudgetExceeded:
        return None
    return reasoner


def relation_of(fact: tuple) -> tuple[RelationKey, tuple]:
    """A fact of ``Reasoner.facts()`` -> its relation and arguments; a class fact
    ``(rdf:type, x, C)`` is relation ``(C, 1)``, as in the Spark job's output."""
    if fact[0] == RDF_TYPE and len(fact) == 3 and isinstance(fact[2], str):
        return (fact[2], 1), (fact[1],)
    return (fact[0], len(fact) - 1), tuple(fact[1:])


def write_parquet_local(facts: Iterable[tuple], directory: str | os.PathLike) -> dict:
    """The layout of :func:`cloud.spark.storage.write_parquet` (one dataset per relation, one
    part file each, and ``manifest.json``), from fact tuples; returns the facts per relation."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    relations: dict[RelationKey, list[tuple]] = {}
    for fact in facts:
        key, arguments = relation_of(fact)
        relations.setdefault(key, []).append(arguments)
    term = pa.struct(
        [
            pa.field("kind", pa.string(), nullable=False),
            pa.field("lexical", pa.string(), nullable=False),
            pa.field("datatype", pa.string()),
            pa.field("language", pa.string()),
            pa.field("number", pa.float64()),
        ]
    )
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    taken: set[str] = set()
    entries, written = [], {}
    for key in sorted(relations):
        rows = relations[key]
        name = dataset_name(key, taken)
        columns = {
            f"c{i}": pa.array(
                [dict(zip(TERM_FIELDS, term_row(row[i]), strict=True)) for row in rows], term
            )
            for i in range(key[1])
        }
        (root / name).mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.table(columns), root / name / "part-00000.parquet")
        written[key] = len(rows)
        entries.append(manifest_entry(key, name, len(rows)))
    write_manifest(root, entries)
    return written


def check_mode(mode: str) -> str:
    if mode not in MODES:
        raise ZodiacError(f"--spark is one of {', '.join(MODES)}, got {mode!r}")
    return mode
