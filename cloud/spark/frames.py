"""Small DataFrame helpers shared by the evaluation modules.

Spark charges a fixed cost per job, which dominates on the
small relations of a rule program; so does planning, which grows with a plan's lineage. The
helpers here are about keeping plans short: every relation a step produces is checkpointed, so
no plan ever carries more than a few steps of lineage.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import reduce
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import DataFrame


def columns(arity: int) -> list[str]:
    """Column names of a relation: ``c0 .. c{arity-1}``."""
    return [f"c{i}" for i in range(arity)]


def schema(arity: int) -> str:
    """DDL schema of a relation of term ids."""
    return ", ".join(f"{c} long" for c in columns(arity))


def union_all(frames: Sequence[DataFrame]) -> DataFrame:
    return reduce(lambda a, b: a.union(b), frames)


def settle(df: DataFrame) -> tuple[DataFrame, int]:
    """``df`` computed and stored with its lineage cut (:func:`cut`), and its size: the
    checkpoint is one job, the count a second one that only reads stored blocks.

    (Cached-but-not-checkpointed frames were tried: one job instead of two, but every new
    plan then drags the whole lineage through the cache manager's plan matching, which costs
    far more than the extra job as soon as a recursive node runs a few rounds.)"""
    df = cut(df)
    return df, df.count()


def cut(df: DataFrame) -> DataFrame:
    """``df`` computed now, with its lineage cut.

    A reliable checkpoint when the SparkContext has a checkpoint directory (on a cluster: a
    lost executor then costs no recomputation from scratch), else a local checkpoint (blocks
    kept by the executors; fast, the right choice in local mode)."""
    if df.sparkSession.sparkContext.getCheckpointDir():
        return df.checkpoint(eager=True)
    return df.localCheckpoint(eager=True)
