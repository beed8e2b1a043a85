"""``python -m simulations.windfarm``: run the wind-farm simulation and write its report."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from simulations.windfarm.extras import missing_extras_message
from simulations.windfarm.run import FAULTS, Options, Simulation, SimulationError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m simulations.windfarm",
        description="Simulate a wind farm: one edge agent per turbine, the cloud (Spark + "
        "publisher) and an MQTT broker; break one turbine's ambient-temperature sensor, warm "
        "the air around another, and check that each is diagnosed right and that the anomaly "
        "rules are released again. Writes a Markdown report with plots.",
    )
    parser.add_argument("--turbines", type=int, default=30, help="farm size, 5..800 (default 30)")
    parser.add_argument(
        "--duration", type=float, default=60.0, help="seconds of readings (default 60)"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the sensor noise")
    parser.add_argument(
        "--broker",
        metavar="HOST:PORT",
        default=None,
        help="use this MQTT v5 broker (default: a private Mosquitto on a free loopback port, "
        "or the embedded Python MQTT v5 broker when Mosquitto is not installed)",
    )
    parser.add_argument(
        "--embedded-broker",
        action="store_true",
        help="use the embedded Python MQTT v5 broker even when Mosquitto is installed",
    )
    parser.add_argument(
        "--faults",
        default="",
        help=f"comma-separated faults to inject: {', '.join(FAULTS)}, or 'all' (default none)",
    )
    parser.add_argument(
        "--sensor-fault",
        choices=("stuck", "drift", "frozen"),
        default="stuck",
        help="how the broken sensor fails (default stuck: it reads 85.0; drift: its error "
        "grows; frozen: it repeats a plausible value, which the window rules diagnose)",
    )
    parser.add_argument(
        "--spark",
        choices=("auto", "always", "never"),
        default="auto",
        help="materialise the farm graph with Spark: auto (default, as zodiac-cloud "
        "materialise: a farm this small runs on the edge engine, no Spark session), always, "
        "never",
    )
    parser.add_argument(
        "--no-spark",
        dest="spark",
        action="store_const",
        const="never",
        help="the same as --spark never",
    )
    parser.add_argument(
        "--spark-master", default="local[*]", help="Spark master URL (default local[*])"
    )
    parser.add_argument(
        "--reading-period",
        type=float,
        default=None,
        help="seconds between readings (default max(1, turbines/100))",
    )
    parser.add_argument(
        "--processes", type=int, default=None, help="agent host processes (default min(N, 16))"
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="directory for the report and the run's files (default out/windfarm/<time>)",
    )
    return parser


def parse_faults(text: str) -> tuple[str, ...]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    if names == ["all"]:
        return FAULTS
    unknown = [n for n in names if n not in FAULTS]
    if unknown:
        raise ValueError(f"unknown fault(s) {', '.join(unknown)}; choose from {', '.join(FAULTS)}")
    return tuple(dict.fromkeys(names))


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not 5 <= args.turbines <= 800:
        parser.error("--turbines must be between 5 and 800")
    if args.broker and args.embedded_broker:
        parser.error("--broker and --embedded-broker exclude each other")
    try:
        faults = parse_faults(args.faults)
    except ValueError as error:
        parser.error(str(error))
    # Before anything starts: the plots are drawn last, Spark is started first.
    missing = missing_extras_message(spark=args.spark == "always")
    if missing:
        print(f"windfarm: {missing}", file=sys.stderr)
        return 2
    options = Options(
        turbines=args.turbines,
        duration=args.duration,
        seed=args.seed,
        broker=args.broker,
        embedded_broker=args.embedded_broker,
        out=args.out,
        faults=faults,
        sensor_fault=args.sensor_fault,
        spark=args.spark,
        spark_master=args.spark_master,
        reading_period=args.reading_period,
        processes=args.processes,
    )
    started = time.perf_counter()
    try:
        simulation = Simulation(options)
        result = simulation.run()
    except SimulationError as error:
        print(f"windfarm: {error}", file=sys.stderr)
        return 2
    from simulations.windfarm.report import write_report

    report = write_report(result, simulation.directory)
    print()
    for check in result.checks:
        print(f"  [{'ok' if check.ok else 'FAILED'}] {check.name}: {check.detail}")
    print(
        f"\n{'All diagnoses right.' if result.ok else 'Problems found.'} "
        f"Run took {time.perf_counter() - started:.0f} s."
    )
    print(f"Report: {report}")
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
