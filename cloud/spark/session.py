"""Getting pyspark and a SparkSession: the one place that imports pyspark for the first time.

pyspark is an optional dependency (the ``cloud`` extra): :func:`require_pyspark` turns its absence
into one clear message instead of an ImportError deep inside a Spark helper.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover - typing only
    from pyspark.sql import SparkSession

MISSING_PYSPARK = (
    "pyspark is not installed: the cloud job needs the 'cloud' extra "
    "(pip install -e '.[cloud]', which also needs Java 17 or newer)"
)


class SparkUnavailableError(ImportError):
    """pyspark cannot be imported."""


def require_pyspark() -> None:
    """Raise :class:`SparkUnavailableError` with an install hint when pyspark is missing."""
    try:
        import pyspark  # noqa: F401
    except ImportError as error:
        raise SparkUnavailableError(MISSING_PYSPARK) from error


def local_session(
    master: str | None = "local[*]",
    *,
    app_name: str = "zodiac-cloud",
    shuffle_partitions: int = 8,
    extra: dict[str, str] | None = None,
) -> SparkSession:
    """A SparkSession for the materialisation job (local mode by default).

    ``master=None`` sets no master: under ``spark-submit`` its ``--master`` applies, and a plain
    ``python`` process gets pyspark's own default, ``local[*]``.

    Python workers run the driver's interpreter (``spark.pyspark.python``): the UDFs evaluating
    binds, comparisons and aggregates import ``agent`` and ``cloud``, which only this
    interpreter's environment is sure to have. The UI is off and logs quiet: the job prints its
    own progress.
    """
    require_pyspark()
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = SparkSession.builder
    if master is not None:
        builder = builder.master(master)
    builder = (
        builder.appName(app_name)
        .config("spark.pyspark.python", sys.executable)
        .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        # UDFs here take plain Python objects; Arrow would need pandas and pyarrow.
        .config("spark.sql.execution.pythonUDF.arrow.enabled", "false")
    )
    for key, value in (extra or {}).items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session


@contextmanager
def checkpoint_dir(spark: SparkSession, path: str | None) -> Iterator[None]:
    """Reliable checkpoints in ``path`` for the block (nothing changes without one).

    Afterwards the SparkContext's previous setting comes back, "no checkpoint directory"
    included, so a job run on a caller's session (a notebook's, a test suite's) leaves it as it
    was. PySpark can set a checkpoint directory but not unset one: the previous value is put
    back through the JVM's ``SparkContext.checkpointDir`` (``setCheckpointDir`` itself would
    make a new subdirectory).
    """
    if not path:
        yield
        return
    context = spark.sparkContext
    previous = context.getCheckpointDir()
    context.setCheckpointDir(path)
    try:
        yield
    finally:
        jvm = context._jvm
        assert jvm is not None
        getattr(context._jsc.sc(), "checkpointDir_$eq")(jvm.scala.Option.apply(previous))
