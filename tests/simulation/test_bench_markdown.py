"""``--markdown`` of every benchmark: after its normal output, the run's results as GitHub
Markdown tables (simulations/bench/table.py), which docs/benchmarks.md holds. Each benchmark
runs for real on its smallest settings, and what it writes must be well formed: a header, a
separator row with as many columns, at least one data row, numbers in every data row, and the
columns that carry the benchmark's point (its ratios, its bytes per fact)."""

from __future__ import annotations

import importlib
import re

import pytest

from simulations.bench.table import Table, render

SEPARATOR = re.compile(r"^:?-{2,}:?$")
NUMBER = re.compile(r"^-?(\d{1,3}(,\d{3})+|\d+)?(\.\d+)?(x|%)?$")


def cells(line: str) -> list[str]:
    """The cells of a table line (an escaped ``\\|`` stays inside its cell)."""
    assert line.startswith("| ") and line.endswith(" |"), line
    return [cell.strip() for cell in re.split(r"(?<!\\)\|", line[1:-1])]


def is_number(cell: str) -> bool:
    return any(ch.isdigit() for ch in cell) and bool(NUMBER.match(cell))


def parse_markdown(text: str) -> list[tuple[str, list[str], list[list[str]]]]:
    """(heading, header, data rows) of every table in ``text``, which must hold nothing but
    one-line ``###`` headings and tables, separated by blank lines; fails on anything else."""
    found = []
    heading = ""
    for block in text.strip().split("\n\n"):
        lines = block.splitlines()
        if lines[0].startswith("### "):
            assert len(lines) == 1, f"a heading is one line: {block!r}"
            heading = lines[0][4:]
            assert heading.strip(), block
            continue
        header, separator, *rows = (cells(line) for line in lines)
        assert all(SEPARATOR.match(cell) for cell in separator), lines[1]
        assert len(separator) == len(header), lines[:2]
        assert rows, f"no data row under {header}"
        for row in rows:
            assert len(row) == len(header), (header, row)
            assert any(is_number(cell) for cell in row), f"no number in {row}"
        found.append((heading, header, rows))
        heading = ""
    return found


def split_output(out: str) -> tuple[str, str]:
    """The normal output and the Markdown after it (from the first ``###`` heading on)."""
    normal, marker, markdown = out.partition("\n\n### ")
    assert marker, f"no Markdown table after the normal output:\n{out[-2000:]}"
    return normal, "### " + markdown


# (module, smallest arguments, header cells some table must have). Under a few seconds each
# unless marked slow; the whole file stays under about 40 s on two cores.
slow = pytest.mark.slow
# hypertree, peers and restart time their sides in processes of their own.
in_processes = [pytest.mark.slow, pytest.mark.process]
CASES = [
    pytest.param(
        "materialise",
        ["--quick", "--repeat", "1"],
        {"materialise / store", "kept B/fact", "RSS B/fact", "peak traced MB"},
        marks=slow,
    ),
    ("parse", ["--rules", "100", "--repeat", "1"], {"parse / tokenize", "us per rule"}),
    (
        "events",
        ["--turbines", "30", "--updates", "4", "--repeat", "1"],
        {"vs no watch", "bytes per event"},
    ),
    (
        "metrics",
        ["--updates", "4", "--repeat", "1", "--facts", "400", "--scrapes", "1"],
        {"on / off", "scrape ms"},
    ),
    pytest.param("bitmaps", ["--quick", "--repeat", "1"], {"bitmap / set"}, marks=slow),
    pytest.param(
        "equality",
        ["--quick", "--repeat", "1", "--largest", "10"],
        {"axiomatised / default", "kept B/fact", "RSS / rewriting"},
        marks=slow,
    ),
    pytest.param(
        "explain",
        ["--quick", "--sample", "2"],
        {"slowest ms", "slowest / 50 ms", "kept B/fact", "RSS B/fact"},
        marks=slow,
    ),
    pytest.param(
        "hypertree",
        ["--quick", "--repeat", "1", "--seeds", "1", "--only", "university L"],
        {"plans / combined", "combined / plans", "decomposed", "PYTHONHASHSEED"},
        marks=in_processes,
    ),
    (
        "incremental",
        ["--quick", "--only", "rs3", "--only", "data", "--memory"],
        {"first speed-up", "again speed-up", "update / scratch", "verdict"},
    ),
    (
        "modules",
        ["--quick", "--repeat", "1"],
        {"seminaive / module", "kept B/fact", "RSS B/fact", "seminaive / modules"},
    ),
    pytest.param(
        "peers",
        ["--quick", "--repeat", "1"],
        {"total / nemo's", "peak RSS MB"},
        marks=in_processes,
    ),
    ("program_size", ["--quick"], {"reading ms", "restart", "kept B/fact", "RSS B/fact"}),
    (
        "ingest",
        ["--facts", "2000", "--repeat", "1", "--parsers", "200"],
        {"facts/s", "kept B/fact", "RSS B/fact", "rdflib / pyoxigraph"},
    ),
    pytest.param(
        "restart",
        ["--quick", "--repeat", "1"],
        {"recompute / restart", "back to work", "restart: kept B/fact"},
        marks=in_processes,
    ),
    (
        "windows",
        ["--sensors", "5", "--minutes", "3", "--ticks", "1", "--repeat", "1"],
        {"scratch / tick", "facts expired", "disk B/fact", "kept B/fact", "RSS B/fact"},
    ),
    (  # (its memory, a fresh process per row, is run by the explain case's helper alike)
        "sweep",
        ["--quick", "--repeat", "1", "--no-memory"],
        {"speed-up", "again speed-up", "count", "kept B/fact", "RSS B/fact"},
    ),
]


@pytest.mark.parametrize(("name", "argv", "columns"), CASES)
def test_benchmark_writes_its_results_as_markdown_tables(name, argv, columns, capsys):
    if name == "peers":  # (the peer is the point of this benchmark: it needs Nemo)
        pytest.importorskip("nmo_python", reason="Nemo's Python bindings are not installed")
    module = importlib.import_module(f"simulations.bench.{name}")
    status = module.main([*argv, "--markdown"])
    out = capsys.readouterr().out
    assert status == 0, out
    normal, markdown = split_output(out)
    assert normal.strip() and "| " not in normal  # (the normal output first, as it was)
    tables = parse_markdown(markdown)
    assert tables
    headers = {cell for _, header, _ in tables for cell in header}
    assert columns <= headers, columns - headers
    if len(tables) > 1:  # several tables: each says what it is
        assert all(heading for heading, _, _ in tables), [h for h, _, _ in tables]


@pytest.mark.slow
def test_spark_benchmark_writes_its_results_as_markdown_tables(spark, capsys):
    """One tiny STC case on the test session's SparkSession (conftest), as the smoke test."""
    from simulations.bench import spark as bench

    argv = ["--widths", "--ds1", "2", "--no-warmup", "--no-fixed-cost", "--markdown"]
    assert bench.main(argv) == 0
    _, markdown = split_output(capsys.readouterr().out)
    tables = parse_markdown(markdown)
    assert [len(rows) for _, _, rows in tables] == [1, 1]  # the case, and its series' reading
    (title, header, [row]), _ = tables
    assert title.startswith("Spark ") and "spark / engine" in header
    assert {"engine kept B/fact", "engine RSS B/fact"} <= set(header)
    assert row[:2] == ["STC DS1(2)", "2"] and row[4].endswith("x")  # n(n - 1) facts


def test_markdown_to_a_file_leaves_stdout_as_it_was(tmp_path, capsys):
    from simulations.bench import parse

    target = tmp_path / "parse.md"
    assert parse.main(["--rules", "20", "--repeat", "1", "--markdown", str(target)]) == 0
    out = capsys.readouterr().out
    assert "|" not in out and "###" not in out and "parse / tokenize" in out
    [(_, header, [row])] = parse_markdown(target.read_text())
    assert header[0] == "rules" and row[0] == "20"
    assert parse.main(["--rules", "20", "--repeat", "1", "--markdown", "-"]) == 0
    assert parse_markdown(split_output(capsys.readouterr().out)[1])


def test_markdown_to_a_missing_folder_is_refused_before_the_run(tmp_path, capsys):
    from simulations.bench import parse

    with pytest.raises(SystemExit) as exit_:
        parse.main(["--rules", "20", "--markdown", str(tmp_path / "no" / "such.md")])
    captured = capsys.readouterr()
    assert exit_.value.code == 2 and captured.out == ""  # nothing ran
    assert "no such directory" in captured.err and "Traceback" not in captured.err


def test_render_pads_aligns_and_escapes():
    table = Table(("name", "value"), "lr", title="Two rows")
    table.add("a|b", "1.5x")
    table.add("longer name", 12)
    assert table.render().splitlines() == [
        "### Two rows",
        "",
        "| name        | value |",
        "| :---------- | ----: |",
        "| a\\|b        |  1.5x |",
        "| longer name |    12 |",
    ]
    assert render(("c",), [("x\ny",)], "c").splitlines()[1:] == ["| :-: |", "| x y |"]
    with pytest.raises(ValueError, match="2 cells for 1 columns"):
        Table(("one",), "l").add("a", "b")
    with pytest.raises(ValueError, match="alignment"):
        Table(("one", "two"), "l")
