"""The benchmarks' Markdown tables: what a run measured, ready for docs/benchmarks.md.

Every benchmark with a ``main`` takes ``--markdown [FILE]`` (``add_markdown_option``): after
its normal output, which stays as it is, it writes the rows it printed as GitHub Markdown
tables (``Table``), to stdout (no FILE, or ``-``) or to FILE (``write_markdown``). One place
renders them, so every benchmark's tables look alike and docs/benchmarks.md can hold exactly
what a documented command printed. Cells are strings the benchmark formatted itself (it knows
how many digits a figure deserves); this module only lays them out.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field

STDOUT = "-"
ALIGNMENTS = "lrc"  # left, right, centre


@dataclass
class Table:
    """One table: column headers, one alignment letter per column (``l``, ``r`` or ``c``),
    rows of formatted cells, and an optional one-line heading (for a benchmark that writes
    several tables)."""

    headers: Sequence[str]
    align: str
    title: str = ""
    rows: list[tuple[str, ...]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if len(self.align) != len(self.headers) or set(self.align) - set(ALIGNMENTS):
            raise ValueError(f"alignment {self.align!r} does not fit headers {self.headers!r}")

    def add(self, *cells: object) -> None:
        """Append a row; each cell is shown as ``str(cell)`` (format numbers before)."""
        if len(cells) != len(self.headers):
            raise ValueError(f"{len(cells)} cells for {len(self.headers)} columns: {cells!r}")
        self.rows.append(tuple(str(cell) for cell in cells))

    def render(self) -> str:
        """The table (preceded by its heading, if any), one line per row, no final newline."""
        table = render(self.headers, self.rows, self.align)
        return f"### {self.title}\n\n{table}" if self.title else table


def render(headers: Sequence[str], rows: Sequence[Sequence[str]], align: str) -> str:
    """A GitHub Markdown table, its columns padded to one width so the text reads as a table
    too. ``|`` inside a cell is escaped; a newline becomes a space (a row is one line)."""
    cells = [[_cell(text) for text in row] for row in [headers, *rows]]
    if any(len(row) != len(align) for row in cells):
        raise ValueError("every row needs one cell per column")
    widths = [max(3, *(len(row[i]) for row in cells)) for i in range(len(align))]
    lines = [_line(cells[0], widths, align)]
    lines.append(
        "| "
        + " | ".join(_rule(letter, width) for letter, width in zip(align, widths, strict=True))
        + " |"
    )
    lines += [_line(row, widths, align) for row in cells[1:]]
    return "\n".join(lines)


def add_markdown_option(parser: argparse.ArgumentParser) -> None:
    """``--markdown [FILE]``: the run's results as Markdown tables, after the normal output on
    stdout (no FILE, or ``-``) or written to FILE. A FILE whose folder does not exist is
    refused before the benchmark runs (one line, exit status 2), not after minutes of work."""
    parser.add_argument(
        "--markdown",
        nargs="?",
        const=STDOUT,
        default=None,
        type=_destination,
        metavar="FILE",
        help="also write the results as Markdown tables: to stdout after the normal output "
        "(no FILE, or '-'), or to FILE",
    )


def write_markdown(destination: str | None, tables: Sequence[Table]) -> None:
    """Write ``tables`` where ``--markdown`` said (nothing when it was not given)."""
    if destination is None:
        return
    text = "\n\n".join(table.render() for table in tables if table.rows) + "\n"
    if destination == STDOUT:
        sys.stdout.write("\n" + text)
        sys.stdout.flush()
        return
    with open(destination, "w", encoding="utf-8") as out:
        out.write(text)


def ratio(value: float | None, reference: float | None, digits: int = 1) -> str:
    """``value / reference`` as ``2.5x`` (``-`` when either is missing or the reference 0)."""
    if value is None or reference is None or not reference:
        return "-"
    return factor(value / reference, digits)


def factor(value: float | None, digits: int = 2) -> str:
    """A ratio as ``2.50x``; from 100 on without decimals (``1,250x``); ``-`` when not measured
    (None or NaN), ``inf`` for a division by no time at all."""
    if value is None or math.isnan(value):
        return "-"
    if math.isinf(value):
        return "inf"
    return f"{value:,.0f}x" if abs(value) >= 100 else f"{value:.{digits}f}x"


def _destination(text: str) -> str:
    if text == STDOUT:
        return text
    folder = os.path.dirname(os.path.abspath(text))
    if os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"{text} is a directory, not a file")
    if not os.path.isdir(folder):
        raise argparse.ArgumentTypeError(f"no such directory: {folder}")
    if not os.access(folder, os.W_OK):
        raise argparse.ArgumentTypeError(f"cannot write in {folder}")
    return text


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _line(cells: Sequence[str], widths: Sequence[int], align: str) -> str:
    padded = [
        cell.rjust(width) if letter == "r" else cell.ljust(width)
        for cell, width, letter in zip(cells, widths, align, strict=True)
    ]
    return "| " + " | ".join(padded) + " |"


def _rule(letter: str, width: int) -> str:
    """The separator cell of a column: ``:---`` (left), ``---:`` (right), ``:---:`` (centre),
    as wide as the column."""
    left = ":" if letter in "lc" else "-"
    right = ":" if letter in "rc" else "-"
    return left + "-" * (width - 2) + right
