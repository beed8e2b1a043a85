"""Benchmark: parsing a large rule bundle.

    python -m simulations.bench.parse [--rules N] [--repeat N] [--markdown [FILE]]

A bundle of ``N`` rules (10,000 by default), each with a label, a join, COMP, BIND with
arithmetic, a comparison and an existential negation, is parsed and validated into a Program.
Printed in one run: the time per rule, and the ratio to merely tokenizing the same text (the
floor any parser of this grammar pays), because absolute times on shared machines are noisy.
This replaces a wall-clock bound in the unit tests: speed is measured here, never by timed tests.
"""

from __future__ import annotations

import argparse

from agent.engine.gcpause import collector_paused
from agent.engine.program.parser import parse_program, tokenize
from simulations.bench.table import Table, add_markdown_option, write_markdown
from simulations.bench.timing import timed


def bundle_text(count: int) -> str:
    """``count`` distinct rules of the shape above, one per line."""
    return "\n".join(
        f"r{i}: <p{i % 50}>(X, Y) :- <p11>(X, Z) and <q{i}>(Z, Y) and COMP(X, !=, Y) "
        f"and bind(abs(Z - 1) * 2 as W) and W > {i} and not <n>(Y, _) ."
        for i in range(count)
    )


def scan_only(text: str) -> None:
    """Tokenizing as `parse_program` does it, with the cyclic collector paused."""
    with collector_paused():
        tokenize(text)


def best_of(repeat: int, action) -> float:
    return min(timed(action) for _ in range(repeat))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rules", type=int, default=10_000, help="rules in the bundle")
    parser.add_argument("--repeat", type=int, default=3, help="runs per side; the best counts")
    add_markdown_option(parser)
    args = parser.parse_args(argv)

    text = bundle_text(args.rules)
    program = parse_program(text)
    assert len(program.rules) == args.rules
    parse = best_of(args.repeat, lambda: parse_program(text))
    scan = best_of(args.repeat, lambda: scan_only(text))
    print(f"{args.rules:,} rules, {len(text) / 1e6:.1f} MB of text")
    print(f"  parse + validate  {parse:8.3f} s  ({parse / args.rules * 1e6:6.0f} us per rule)")
    print(f"  tokenize only     {scan:8.3f} s  ({scan / args.rules * 1e6:6.0f} us per rule)")
    print(f"  parse / tokenize  {parse / scan:8.2f}x")
    table = Table(
        ("rules", "text MB", "parse + validate s", "us per rule", "tokenize only s",
         "us per rule", "parse / tokenize"),
        "rrrrrrr",
        title=f"Parsing a bundle of rules (best of {args.repeat})",
    )  # fmt: skip
    table.add(
        f"{args.rules:,}",
        f"{len(text) / 1e6:.1f}",
        f"{parse:.3f}",
        f"{parse / args.rules * 1e6:.0f}",
        f"{scan:.3f}",
        f"{scan / args.rules * 1e6:.0f}",
        f"{parse / scan:.2f}x",
    )
    write_markdown(args.markdown, [table])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
