"""Benchmark: the Spark job (local mode) vs the edge engine, materialising from scratch.

    python -m simulations.bench.spark [--widths 50 100 ...] [--ds1 400 800 ...] [--quick]
                                      [--no-memory] [--markdown [FILE]]

Why: the cloud job (``cloud.spark``) exists for data that outgrow one Python process. Spark pays
a fixed cost per job (planning, scheduling, a checkpoint per stratum and per seminaive round)
that the in-memory engine does not, and it can use every core while the engine uses one. This
measures where, if anywhere, Spark's parallelism overtakes its overhead on this machine, and how
each side's time grows with the output:

1. RS2 (``rules/benchmarks/rs2.rules``) over DS2(w): 14 hyper-nodes (closures, cycles, negation,
   one big join), output about 2.6 w^2 facts.
2. STC: RS1's first two rules (symmetric-transitive ``hasNeighbour``) over DS1(n)'s
   ``hasNeighbour`` chain: one hyper-node, output n(n - 1) facts (one component: a complete
   graph). DS1(6400), 41M facts, is about the largest the engine holds here (~9 GB).

Each case starts from the same fact tuples: the engine time is ``Reasoner(modules=True)``
loading the facts and materialising the rules; the Spark time is ``cloud.spark.materialise``
(encoding, every stratum, checkpoints) plus a ``count()`` per relation. SparkSession start-up is
reported once, not charged to any case, and an untimed warm-up case runs first (JVM JIT, Python
workers). Every case checks that both sides give the same count per relation, and the same
facts when the output is small enough (``--full-check-limit``): a mismatch stops the benchmark.
A case that exceeds ``--timeout`` seconds on either side is abandoned, and that side skips the
larger cases of the series. Per case, the engine's materialisation's bytes per stored fact
(traced kept allocation and resident-set growth, in a fresh process after the timings;
``--no-memory`` skips it). Compare ratios and slopes (log-log slope of time vs output facts):
absolute times on shared machines are noisy. The default sizes take about 10 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import gc
import math
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agent.engine import Reasoner
from simulations.bench.datasets import NEIGHBOUR, ds1, ds2
from simulations.bench.materialise import RULES
from simulations.bench.memory import fact_count, footprint
from simulations.bench.modules import STC_RULES, timed
from simulations.bench.table import Table, add_markdown_option, factor, write_markdown

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import SparkSession

WIDTHS = [50, 100, 200, 400, 800]
DS1_SIZES = [400, 800, 1600, 3200, 6400]
QUICK_WIDTHS = [20, 50]
QUICK_DS1_SIZES = [100, 200]
TIMEOUT = 600.0  # seconds per case and side
FULL_CHECK_LIMIT = 2_000_000  # compare whole fact sets up to this many facts


class CaseTimeout(Exception):
    """One side of a case ran longer than the time-out."""


class MismatchError(AssertionError):
    """Spark and the engine disagree."""


@dataclass
class Case:
    series: str  # "RS2" or "STC"
    data: str  # "DS2(200)"
    program: Any
    facts: list

    @property
    def name(self) -> str:
        return f"{self.series} {self.data}"


@dataclass
class Row:
    case: str
    series: str
    facts: int | None = None
    engine: float | None = None  # seconds; None: timed out or skipped
    spark: float | None = None
    note: str = ""
    kept_per_fact: float | None = None  # the engine's materialisation, bytes per stored fact
    rss_per_fact: float | None = None

    @property
    def ratio(self) -> float | None:
        return self.spark / self.engine if self.spark and self.engine else None


def rs2_case(w: int) -> Case:
    return Case("RS2", f"DS2({w})", RULES / "rs2.rules", ds2(w))


def stc_case(n: int) -> Case:
    return Case("STC", f"DS1({n})", STC_RULES, [f for f in ds1(n) if f[0] == NEIGHBOUR])


def progress(message: str) -> None:
    print(f"[bench.spark] {message}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------ time-outs
@contextmanager
def alarm(seconds: float) -> Iterator[None]:
    """Raise CaseTimeout in the main thread after ``seconds`` (the engine is pure Python, so
    the signal interrupts it wherever it is). Not in another thread: then no time-out."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def expire(signum, frame):
        raise CaseTimeout

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@contextmanager
def job_deadline(spark: SparkSession, seconds: float) -> Iterator[threading.Event]:
    """Cancel every Spark job, once a second, from ``seconds`` on, until the block ends: the
    running step then fails, and the caller turns that into CaseTimeout (the event is set)."""
    expired, done = threading.Event(), threading.Event()

    def watch() -> None:
        if done.wait(seconds):
            return
        expired.set()
        while not done.is_set():
            spark.sparkContext.cancelAllJobs()
            done.wait(1.0)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        yield expired
    finally:
        done.set()
        watcher.join()


def engine_materialised(series: str, size: int) -> Reasoner:
    """``footprint``'s build: the engine's materialisation of one case (rebuilt in the
    measuring process)."""
    case = rs2_case(size) if series == "RS2" else stc_case(size)
    reasoner = Reasoner(modules=True)
    reasoner.add_facts(case.facts)
    reasoner.add_rules(case.program)
    return reasoner


def measure_engine_memory(rows: list[Row], widths: list[int], sizes: list[int]) -> None:
    """Each row's engine bytes per stored fact (traced kept allocation and resident-set
    growth), in a fresh process after the timings (simulations/bench/memory.py). Spark's side
    lives in a JVM whose heap says nothing per fact; it is not measured."""
    cases = [("RS2", w) for w in widths] + [("STC", n) for n in sizes]
    for row, (series, size) in zip(rows, cases, strict=True):
        if row.engine is None:
            continue
        used = footprint(engine_materialised, fact_count, series, size)
        row.kept_per_fact = used.per_fact(used.traced_kept)
        row.rss_per_fact = used.per_fact(used.rss)


# ------------------------------------------------------------------ the two sides
def run_engine(case: Case, timeout: float) -> tuple[Reasoner, float]:
    holder: list[Reasoner] = []

    def materialise() -> None:
        reasoner = Reasoner(modules=True)
        reasoner.add_facts(case.facts)
        reasoner.add_rules(case.program)
        holder.append(reasoner)

    with alarm(timeout):
        elapsed = timed(materialise)
    return holder[0], elapsed


def run_spark(
    spark: SparkSession, case: Case, timeout: float, local_below: int = 0
) -> tuple[Any, dict, float]:
    """The job on ``case``; ``local_below=0`` (the series' setting): every hyper-node in Spark
    jobs, since the series measure Spark's evaluation itself, not the driver-side path."""
    from cloud.spark.materialise import materialise

    out: dict[str, Any] = {}

    def job() -> None:
        out["result"] = result = materialise(
            spark, case.program, case.facts, local_below=local_below
        )
        out["counts"] = result.counts()

    with job_deadline(spark, timeout) as expired:
        try:
            elapsed = timed(job)
        except Exception:
            if expired.is_set():
                raise CaseTimeout from None
            raise
    if expired.is_set():  # finished while being cancelled: still over the limit
        raise CaseTimeout
    return out["result"], out["counts"], elapsed


def engine_counts(reasoner: Reasoner) -> dict:
    view = reasoner.view()
    return {key: len(view.visible(key)) for key in sorted(view.relations())}


def check_equal(case: Case, want: dict, reasoner: Reasoner | None, result, counts: dict) -> None:
    """Engine counts ``want`` against Spark's ``counts``; whole fact sets too if ``reasoner``
    (kept only for outputs up to the full-check limit)."""
    got = {key: n for key, n in counts.items() if n}
    if got != want:
        differ = sorted(k for k in set(got) | set(want) if got.get(k) != want.get(k))
        detail = ", ".join(f"{k}: spark {got.get(k, 0)} engine {want.get(k, 0)}" for k in differ)
        raise MismatchError(f"{case.name}: counts per relation differ: {detail}")
    if reasoner is not None:
        mine, theirs = set(reasoner.facts()), set(result.facts())
        if mine != theirs:
            missing, extra = sorted(map(repr, mine - theirs)), sorted(map(repr, theirs - mine))
            raise MismatchError(
                f"{case.name}: Spark misses {len(missing)} fact(s) {missing[:5]}, "
                f"has {len(extra)} extra {extra[:5]}"
            )


def run_case(
    spark: SparkSession,
    case: Case,
    given_up: dict[str, str],
    timeout: float,
    limit: int,
    report: Callable[[str], None],
) -> Row:
    """Both sides of one case (a side in ``given_up`` is skipped; one that times out is added
    to it), then the check."""
    row = Row(case.name, case.series)
    want = reasoner = result = counts = None
    notes = [given_up[side] for side in ("engine", "spark") if side in given_up]
    if "engine" not in given_up:
        try:
            reasoner, row.engine = run_engine(case, timeout)
            row.facts = reasoner.count()
            want = engine_counts(reasoner)
            report(f"{case.name}: engine {row.engine:.2f} s, {row.facts} facts")
            if row.facts > limit:  # counts suffice: free the engine's memory for Spark
                reasoner = None
        except CaseTimeout:
            notes.append(given_up.setdefault("engine", f"engine > {timeout:.0f} s at {case.data}"))
            report(f"{case.name}: engine timed out; skipping larger engine cases")
    if "spark" not in given_up:
        try:
            result, counts, row.spark = run_spark(spark, case, timeout)
            row.facts = row.facts or sum(counts.values())
            report(f"{case.name}: spark {row.spark:.2f} s")
        except CaseTimeout:
            notes.append(given_up.setdefault("spark", f"spark > {timeout:.0f} s at {case.data}"))
            report(f"{case.name}: spark timed out; skipping larger spark cases")
    if want is not None and counts is not None:
        check_equal(case, want, reasoner, result, counts)
        report(f"{case.name}: results equal" + ("" if reasoner else " (counts per relation)"))
    row.note = "; ".join(notes)
    return row


def run(
    spark: SparkSession,
    widths: list[int],
    ds1_sizes: list[int],
    *,
    timeout: float = TIMEOUT,
    full_check_limit: int = FULL_CHECK_LIMIT,
    report: Callable[[str], None] = progress,
) -> list[Row]:
    """One row per case (RS2 over DS2(w), then STC over DS1(n)), checked equal on both sides."""
    rows = []
    for series in ([rs2_case(w) for w in widths], [stc_case(n) for n in ds1_sizes]):
        given_up: dict[str, str] = {}  # side -> why it skips the larger cases of the series
        for case in series:
            rows.append(run_case(spark, case, given_up, timeout, full_check_limit, report))
            gc.collect()
    return rows


# ------------------------------------------------------------------ the table and its reading
def fit(points: list[tuple[int, float]]) -> tuple[float, float] | None:
    """Least-squares line ``log(time) = a + b log(output facts)``: ``(a, b)``."""
    if len(points) < 2:
        return None
    xs = [math.log(x) for x, _ in points]
    ys = [math.log(y) for _, y in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    spread = sum((x - mx) ** 2 for x in xs)
    if not spread:
        return None
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / spread
    return my - b * mx, b


def fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def print_table(rows: list[Row], title: str = "") -> list[Table]:
    """Print the cases and, per series, its reading; return both as Markdown tables."""
    table = Table(
        ("case", "out facts", "engine s", "spark s", "spark / engine", "engine facts/s",
         "spark facts/s", "engine kept B/fact", "engine RSS B/fact", "note"),
        "lrrrrrrrrl",
        title=title,
    )  # fmt: skip
    header = (
        f"{'case':<14} {'out facts':>10} {'engine s':>9} {'spark s':>9} {'spark/eng':>9} "
        f"{'engine f/s':>11} {'spark f/s':>11} {'kept B/fact':>12} {'RSS B/fact':>11}"
    )
    print(header)
    print("-" * len(header))
    for row in rows:
        rate = [row.facts / t if row.facts and t else None for t in (row.engine, row.spark)]
        print(
            f"{row.case:<14} {fmt(row.facts, 'd'):>10} {fmt(row.engine, '.3f'):>9} "
            f"{fmt(row.spark, '.3f'):>9} {fmt(row.ratio, '.1f'):>9} "
            f"{fmt(rate[0], ',.0f'):>11} {fmt(rate[1], ',.0f'):>11}"
            f" {fmt(row.kept_per_fact, '.0f'):>12} {fmt(row.rss_per_fact, '.0f'):>11}"
            + (f"  ({row.note})" if row.note else ""),
            flush=True,
        )
        table.add(
            row.case,
            fmt(row.facts, ","),
            fmt(row.engine, ".3f"),
            fmt(row.spark, ".3f"),
            factor(row.ratio, 1),
            fmt(rate[0], ",.0f"),
            fmt(rate[1], ",.0f"),
            fmt(row.kept_per_fact, ".0f"),
            fmt(row.rss_per_fact, ".0f"),
            row.note,
        )
    reading = Table(
        ("series", "Spark first wins at", "closest spark / engine", "engine slope",
         "spark slope", "engine slope, last two", "spark slope, last two"),
        "llrrrrr",
        title="How each side's time grows with the output: slope of log(time) against "
        "log(output facts), over every case and over the last two",
    )  # fmt: skip
    for series in dict.fromkeys(row.series for row in rows):
        print_reading(series, [row for row in rows if row.series == series], reading)
    return [table, reading]


def print_reading(series: str, rows: list[Row], table: Table | None = None) -> None:
    both = [row for row in rows if row.ratio is not None]
    wins = [row for row in both if row.ratio < 1]  # type: ignore[operator]
    if wins:
        line = f"{series}: Spark first wins at {wins[0].case} (spark/engine {wins[0].ratio:.2f})"
    elif both:
        best = min(both, key=lambda row: row.ratio)  # type: ignore[arg-type,return-value]
        line = f"{series}: Spark wins no case (closest: {best.case}, spark/engine {best.ratio:.1f})"
    else:
        line = f"{series}: no case ran on both sides"
    print(line)
    tops, slopes = {}, {}
    for side in ("engine", "spark"):
        points = [(row.facts, getattr(row, side)) for row in rows if getattr(row, side)]
        overall, tops[side] = fit(points), fit(points[-2:])
        print(
            f"  {side:<6} time ~ facts^{fmt(overall and overall[1], '.2f')} over "
            f"{len(points)} case(s) (last two: ^{fmt(tops[side] and tops[side][1], '.2f')})"
        )
        slopes[side] = (
            fmt(overall and overall[1], ".2f"),
            fmt(tops[side] and tops[side][1], ".2f"),
        )
    if table is not None:
        ratios = [row.ratio for row in both if row.ratio is not None]
        table.add(
            series,
            wins[0].case if wins else "no case",
            factor(min(ratios) if ratios else None, 2),
            slopes["engine"][0],
            slopes["spark"][0],
            slopes["engine"][1],
            slopes["spark"][1],
        )
    engine, spark = tops["engine"], tops["spark"]
    if wins or not (engine and spark):
        return
    largest = max(row.facts or 0 for row in both)
    # (in logs: lines of nearly equal slope cross beyond any float's range)
    log_cross = (spark[0] - engine[0]) / (engine[1] - spark[1]) if engine[1] > spark[1] else 0.0
    if largest and math.log(largest) < log_cross < math.log(1000 * largest):
        cross = math.exp(log_cross)
        print(f"  the last-two-case lines cross at ~{cross:,.0f} output facts (extrapolated)")
    else:
        print("  the last-two-case lines do not cross within 1000x the largest output")


# ------------------------------------------------------------------ command line
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--widths", type=int, nargs="*", help=f"DS2 widths (default {WIDTHS})")
    parser.add_argument("--ds1", type=int, nargs="*", help=f"DS1 sizes (default {DS1_SIZES})")
    parser.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    parser.add_argument("--timeout", type=float, default=TIMEOUT, help="seconds per case, side")
    parser.add_argument("--full-check-limit", type=int, default=FULL_CHECK_LIMIT)
    parser.add_argument("--master", default="local[*]", help="Spark master (default local[*])")
    parser.add_argument("--shuffle-partitions", type=int, default=8, help="as zodiac-cloud's")
    parser.add_argument("--driver-memory", default="8g", help="spark.driver.memory (local mode)")
    parser.add_argument("--no-warmup", action="store_true", help="skip the untimed warm-up")
    parser.add_argument(
        "--no-fixed-cost",
        action="store_true",
        help="skip the fixed-cost table (RS2 DS2(10) and a 30-turbine farm, with and without "
        "the driver-side path)",
    )
    parser.add_argument(
        "--cores-width",
        type=int,
        default=None,
        help="DS2 width of the 1-vs-2-core speed-up (default 800, --quick 20; 0 skips it; "
        "not run on a caller's session)",
    )
    parser.add_argument(
        "--no-memory", action="store_true", help="skip the engine's bytes per stored fact"
    )
    add_markdown_option(parser)
    args = parser.parse_args(argv)
    if args.cores_width is None:
        args.cores_width = 20 if args.quick else 800
    widths = args.widths if args.widths is not None else QUICK_WIDTHS if args.quick else WIDTHS
    sizes = args.ds1 if args.ds1 is not None else QUICK_DS1_SIZES if args.quick else DS1_SIZES

    from cloud.spark.session import require_pyspark

    require_pyspark()
    from pyspark.sql import SparkSession

    running = SparkSession.getActiveSession()  # a caller's session (a test's) is reused
    started = time.perf_counter()
    spark = spark_or_new(running, args)
    spark.range(1).count()
    startup = time.perf_counter() - started
    setting = (
        f"Spark {spark.version}, master {spark.sparkContext.master} (default parallelism "
        f"{spark.sparkContext.defaultParallelism}), shuffle partitions "
        f"{spark.conf.get('spark.sql.shuffle.partitions')}; session start-up {startup:.1f} s "
        "(not in the times below)"
    )
    try:
        if not args.no_warmup:
            warm = time.perf_counter()
            run(spark, [5], [10], timeout=args.timeout, report=lambda _: None)
            progress(f"warm-up (RS2 DS2(5), STC DS1(10)): {time.perf_counter() - warm:.1f} s")
        rows = run(
            spark, widths, sizes, timeout=args.timeout, full_check_limit=args.full_check_limit
        )
    except MismatchError as error:
        print(f"MISMATCH: {error}", file=sys.stderr)
        return 1
    finally:
        if running is None:
            spark.stop()
    if not args.no_memory:
        measure_engine_memory(rows, widths, sizes)
    print(setting)
    tables = print_table(rows, title=setting.replace("session start-up", "Spark's start-up"))
    if not args.no_fixed_cost:
        session = spark_or_new(running, args)
        try:
            tables.append(print_fixed_cost(session, startup, args.timeout))
        finally:
            if running is None:
                session.stop()
    if args.cores_width and running is None:
        tables.append(print_core_speedup(args, args.cores_width))
    write_markdown(args.markdown, tables)
    return 0


def spark_or_new(running, args) -> SparkSession:
    from cloud.spark.session import local_session

    return running or local_session(
        args.master,
        app_name="zodiac-bench-spark",
        shuffle_partitions=args.shuffle_partitions,
        extra={"spark.driver.memory": args.driver_memory},
    )


def fixed_cost_cases() -> list[Case]:
    from simulations.windfarm.cloud import FARM_PROGRAM
    from simulations.windfarm.farm import Farm

    farm = Farm.grid(30).layout_facts()
    return [rs2_case(10), Case("farm", "30 turbines", FARM_PROGRAM.read_text(), farm)]


def print_fixed_cost(spark: SparkSession, startup: float, timeout: float) -> Table:
    """The job as zodiac-cloud runs it (small hyper-nodes on the driver) and with every
    hyper-node in Spark, on the small inputs of one farm, against the session's start-up;
    returned as a Markdown table too."""
    from cloud.spark.driver import LOCAL_BELOW

    table = Table(
        ("case", "default s", "default / start-up", "all Spark s", "all Spark / start-up"),
        "lrrrr",
        title=f"Fixed cost (Spark's start-up {startup:.1f} s; best of 2 each)",
    )

    print(f"\nFixed cost (session start-up {startup:.1f} s; best of 2 each):")
    print(
        f"{'case':<22} {'default s':>10} {'x start-up':>11} {'all Spark s':>12} {'x start-up':>11}"
    )
    for case in fixed_cost_cases():
        times = []
        for local_below in (LOCAL_BELOW, 0):
            times.append(min(run_spark(spark, case, timeout, local_below)[2] for _ in range(2)))
        print(
            f"{case.name:<22} {times[0]:>10.2f} {times[0] / startup:>11.2f} "
            f"{times[1]:>12.2f} {times[1] / startup:>11.2f}",
            flush=True,
        )
        table.add(
            case.name,
            f"{times[0]:.2f}",
            factor(times[0] / startup),
            f"{times[1]:.2f}",
            factor(times[1] / startup),
        )
    return table


def print_core_speedup(args, width: int) -> Table:
    """RS2 over DS2(width), every hyper-node in Spark, with one and with two executor cores
    (local[1], local[2]: a new session each), and the speed-up; returned as a Markdown table
    too."""
    from cloud.spark.session import local_session

    case, seconds = rs2_case(width), {}
    for cores in (1, 2):
        spark = local_session(
            f"local[{cores}]",
            app_name="zodiac-bench-spark-cores",
            shuffle_partitions=args.shuffle_partitions,
            extra={"spark.driver.memory": args.driver_memory},
        )
        try:
            run_spark(spark, rs2_case(5), args.timeout)  # warm-up, untimed
            seconds[cores] = run_spark(spark, case, args.timeout)[2]
        finally:
            spark.stop()
        progress(f"{case.name} on local[{cores}]: {seconds[cores]:.1f} s")
    print(
        f"\nCores: {case.name}, every hyper-node in Spark: 1 core {seconds[1]:.1f} s, "
        f"2 cores {seconds[2]:.1f} s, speed-up {seconds[1] / seconds[2]:.2f}x"
    )
    table = Table(
        ("case", "1 core s", "2 cores s", "1 core / 2 cores"),
        "lrrr",
        title="Cores: every hyper-node in Spark, local[1] against local[2]",
    )
    table.add(case.name, f"{seconds[1]:.1f}", f"{seconds[2]:.1f}", factor(seconds[1] / seconds[2]))
    return table


if __name__ == "__main__":
    sys.exit(main())
