"""``zodiac-cloud``: the cloud side's command line.

``zodiac-cloud materialise --rules FILE --facts FILE --out DIR`` runs the Spark job (local mode
by default, ``--master`` for a cluster) and writes, under DIR, ``parquet/`` (one dataset per
relation, see :mod:`cloud.spark.storage`) and ``facts.nt`` (every fact that is an RDF triple).
With ``--spark auto`` (the default) an input small enough runs on the edge engine instead, with
no Spark session (:mod:`cloud.engine_job`): the same output, seconds sooner.
Progress, one line per stratum, goes to standard error; the count per predicate to standard
output.

``publish`` and ``serve`` (the MQTT publisher) come from :mod:`cloud.publisher_cli`; ``keys
generate`` (the signing key pair) and ``bundle`` (a signed bundle file for ``zodiac-agent
apply``) from :mod:`cloud.operator_cli`.

pyspark is imported only when a command runs, so ``zodiac-cloud --help`` works without it and a
missing pyspark is one clear error line.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from agent import VersionAction
from agent.engine.errors import ZodiacError
from agent.engine.language import Program
from cloud.engine_job import MODES, SPARK_ABOVE
from cloud.spark.driver import LOCAL_BELOW

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="zodiac-cloud",
        description=(
            "Cloud side of zodiac-edge: materialise the farm's knowledge graph with Spark, "
            "publish rule bundles to devices."
        ),
    )
    parser.add_argument("--version", action=VersionAction)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    run = commands.add_parser(
        "materialise",
        help="materialise rules over facts with Spark; write Parquet and N-Triples",
        description=(
            "Materialise a rule program over facts with PySpark, with the edge engine's "
            "semantics, and write every fact (explicit and derived) to --out as Parquet (one "
            "dataset per predicate, plus manifest.json) and N-Triples (facts.nt)."
        ),
    )
    run.add_argument("--rules", required=True, metavar="FILE", help="rule file (.rules)")
    run.add_argument(
        "--facts",
        action="append",
        default=[],
        metavar="PATH",
        help=(
            "facts: an RDF file (.nt, .ttl...) or a Parquet fact directory written by this "
            "command (its parquet/ folder); repeat for several sources"
        ),
    )
    run.add_argument("--out", required=True, metavar="DIR", help="output directory")
    run.add_argument(
        "--master",
        help=(
            "Spark master URL (default: spark-submit's --master when run by spark-submit, "
            "else local[*], Spark in this process)"
        ),
    )
    run.add_argument(
        "--shuffle-partitions",
        type=int,
        default=8,
        metavar="N",
        help="spark.sql.shuffle.partitions (default: 8; raise it on a cluster)",
    )
    run.add_argument(
        "--checkpoint-dir",
        metavar="DIR",
        help=(
            "reliable checkpoints in DIR (on a cluster: a shared file system such as HDFS); "
            "default: local checkpoints, kept by the executors"
        ),
    )
    run.add_argument(
        "--no-closures",
        action="store_true",
        help="evaluate closure hyper-nodes seminaively instead of by the dedicated algorithms",
    )
    run.add_argument(
        "--local-below",
        type=_non_negative,
        default=LOCAL_BELOW,
        metavar="N",
        help="evaluate a hyper-node that reads at most N facts with the edge engine on the "
        f"driver instead of in Spark jobs (default {LOCAL_BELOW:,}; 0: everything in Spark)",
    )
    run.add_argument(
        "--spark",
        choices=MODES,
        default="auto",
        help=f"auto (default): inputs of at most {SPARK_ABOVE:,} facts run on the edge engine "
        "without starting Spark, larger ones in Spark; always: Spark; never: the engine only "
        "(needs neither pyspark nor Java)",
    )
    run.add_argument("--quiet", action="store_true", help="no progress lines on standard error")
    run.set_defaults(handler=_materialise)
    _add_publisher_commands(commands)
    return parser


def _add_publisher_commands(commands) -> None:
    """``publish`` and ``serve`` (cloud.publisher_cli), when that module is installed."""
    try:
        from cloud.publisher_cli import add_commands
    except ModuleNotFoundError as error:
        if error.name != "cloud.publisher_cli":
            raise
        return
    add_commands(commands)
    from cloud.operator_cli import add_commands as add_operator_commands

    add_operator_commands(commands)
    from cloud.events import add_command as add_events_command

    add_events_command(commands)


def _non_negative(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {text}")
    return value


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.handler(args)
    except ImportError as error:  # pyspark missing: SparkUnavailableError says how to fix it
        print(f"zodiac-cloud: {error}", file=sys.stderr)
        return 1
    except (ZodiacError, OSError) as error:
        # One line: the first says what and where; the rest (a rule's text) can be long.
        print(f"zodiac-cloud: {str(error).splitlines()[0]}", file=sys.stderr)
        return 1


def _materialise(args: argparse.Namespace) -> int:
    from agent.engine.program.dependency import build_hyper_graph
    from cloud.engine_job import missing_pyarrow
    from cloud.spark.materialise import checked_rules
    from cloud.spark.session import require_pyspark

    if args.spark == "always":
        require_pyspark()  # first: without the cloud extra, one line and nothing written
    elif args.spark == "never" and missing_pyarrow():
        raise ZodiacError(f"--spark never writes Parquet with pyarrow: {missing_pyarrow()}")

    started = time.perf_counter()
    # Everything wrong with the input said before Spark starts (seconds) and before --out is
    # made: the rules' syntax, safety, labels and strata, and fact paths that do not exist.
    rules, program = checked_rules(Path(args.rules))
    build_hyper_graph(rules)
    for path in args.facts or ():
        if not Path(path).exists():
            raise ZodiacError(f"no such fact file or directory: {path}")

    def progress(line: str) -> None:
        if not args.quiet:
            print(line, file=sys.stderr, flush=True)

    out = Path(args.out)
    if args.spark != "always":
        done = _materialise_on_engine(args, rules, program, out, progress, started)
        if done is not None:
            return done
    require_pyspark()
    return _materialise_with_spark(args, program, out, progress, started)


def _materialise_on_engine(args, rules, program, out: Path, progress, started: float) -> int | None:
    """The engine's run (``--spark never``, or ``auto`` on a small input); None: use Spark."""
    from agent.engine.program.loaders import load_facts
    from cloud.engine_job import (
        directory_size,
        materialise_on_engine,
        missing_pyarrow,
        read_inputs,
        write_parquet_local,
    )
    from cloud.spark.driver import MAX_OUTPUT
    from cloud.spark.storage import write_facts_ntriples

    auto = args.spark == "auto"
    if auto and missing_pyarrow():
        progress(f"Spark: {missing_pyarrow()}, needed to write Parquet without Spark")
        return None
    directories = [path for path in args.facts if Path(path).is_dir()]
    known = len(program.facts) + sum(directory_size(path) for path in directories)
    if auto and known > SPARK_ABOVE:
        progress(f"Spark: the fact directories hold {known:,} facts (> {SPARK_ABOVE:,})")
        return None
    facts = read_inputs(args.facts)
    size = len(program.facts) + len(facts)
    if auto and size > SPARK_ABOVE:
        progress(f"Spark: the input has {size:,} facts (> {SPARK_ABOVE:,})")
        return None
    # The program's own facts first, then the given ones: the Spark job's encoding order
    # (numerically equal numbers are one term, written as the first one seen).
    reasoner = materialise_on_engine(
        Program(rules=tuple(rules)),
        load_facts([*program.facts, *facts]),
        closures=not args.no_closures,
        max_output=MAX_OUTPUT if auto else None,
    )
    if reasoner is None:
        progress(f"Spark: more than {MAX_OUTPUT:,} facts derived")
        return None
    why = "--spark never" if not auto else f"{size:,} input facts <= {SPARK_ABOVE:,}"
    progress(f"engine: {why}, no Spark session")
    out.mkdir(parents=True, exist_ok=True)
    counts = write_parquet_local(reasoner.facts(), out / "parquet")
    written, skipped = write_facts_ntriples(reasoner.facts(), out / "facts.nt")
    errors = reasoner.executor.error_count
    _report(counts, out, written, skipped, errors, started, progress)
    return 0


def _materialise_with_spark(args, program, out: Path, progress, started: float) -> int:
    from cloud.spark.materialise import materialise_paths
    from cloud.spark.session import checkpoint_dir, local_session
    from cloud.spark.storage import write_facts_ntriples, write_parquet

    out.mkdir(parents=True, exist_ok=True)
    running = _active_session()
    spark = local_session(args.master, shuffle_partitions=args.shuffle_partitions)
    try:
        with checkpoint_dir(spark, args.checkpoint_dir):
            result = materialise_paths(
                spark,
                program,
                args.facts,
                closures=not args.no_closures,
                progress=progress,
                local_below=args.local_below,
            )
            # (the relations a reader sees: not the engine's own, such as a multi-head rule's
            # body, which Reasoner.facts() and the engine's run leave out too)
            visible = {key: result[key] for key in result.visible()}
            counts = write_parquet(visible, result.space, out / "parquet")
            written, skipped = write_facts_ntriples(result.stream(), out / "facts.nt")
            errors = result.runtime_errors
    finally:
        # A session that was already running (a notebook's, a test suite's) was reused: only
        # a session this command started is stopped.
        if running is None:
            spark.stop()
    _report(counts, out, written, skipped, errors, started, progress)
    return 0


def _report(counts: dict, out: Path, written: int, skipped: int, errors: int, started, progress):
    """The count per relation on standard output, what was written on standard error."""
    width = max((len(f"{name}/{arity}") for name, arity in counts), default=0)
    for (name, arity), count in sorted(counts.items()):
        print(f"{name + '/' + str(arity):<{width}}  {count}")
    print(f"{'total':<{width}}  {sum(counts.values())}")
    progress(
        f"wrote {out / 'parquet'} ({len(counts)} datasets) and {out / 'facts.nt'} "
        f"({written} triples, {skipped} facts that are no RDF triple left out); "
        f"{errors} run-time error(s); {time.perf_counter() - started:.1f}s"
    )


def _active_session():
    from cloud.spark.session import require_pyspark

    require_pyspark()
    from pyspark.sql import SparkSession

    return SparkSession.getActiveSession()


if __name__ == "__main__":
    sys.exit(main())
