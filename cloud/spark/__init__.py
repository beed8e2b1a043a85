"""Materialisation of a rule program with PySpark, with the edge engine's semantics.

Entry points: :func:`cloud.spark.materialise.materialise` and
:func:`cloud.spark.materialise.materialise_facts`; :func:`cloud.spark.session.local_session`
builds a local SparkSession. This package imports pyspark only inside functions that use it, so
that ``import cloud.spark`` works on an install without pyspark (see :mod:`cloud`).

Modules, one job each: ``session`` (pyspark import, SparkSession), ``terms`` (driver-side term
dictionary and its Spark views), ``expressions`` (the engine's run-time semantics, plain Python),
``udfs`` (those semantics as Spark UDFs), ``rules`` (a rule body as joins, filters, anti-joins),
``frames`` (checkpoints, small helpers), ``closures`` (transitive and symmetric-transitive
closure algorithms), ``materialise`` (strata, seminaive evaluation, the API), ``storage``
(Parquet and N-Triples in and out).
"""
