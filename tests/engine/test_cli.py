"""The ``zodiac-edge`` command line: every command documented, real files in and out."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import pytest

from agent.engine.cli import build_parser, main
from agent.engine.language import RDF_TYPE
from agent.engine.program.rdf import read_facts
from tests.support.agent_harness import run_with_the_reader_gone

RULES = Path("rules/benchmarks/rs1.rules")


@pytest.fixture
def farm(tmp_path: Path) -> Path:
    from simulations.bench.datasets import ds1, write_ntriples

    path = tmp_path / "farm.nt"
    with open(path, "w", encoding="utf-8") as out:
        write_ntriples(ds1(30), out)
    return path


def check_help_texts(parser, expected: set[str]) -> None:
    """Every sub-command has a description and every option a help text (like sqlite-utils)."""
    commands = next(a for a in parser._actions if a.dest == "command")
    assert set(commands.choices) == expected
    for name, sub in commands.choices.items():
        assert sub.description, name
        for action in sub._actions:
            if action.dest != "help":
                assert action.help, f"{name} {action.dest} has no help"


def test_every_command_and_option_has_help_text():
    check_help_texts(build_parser(), {"materialise", "query", "explain", "shell"})


def test_materialise_writes_ntriples(tmp_path: Path, farm: Path):
    out = tmp_path / "out.nt"
    assert main(["materialise", str(RULES), str(farm), "-o", str(out)]) == 0
    facts = set(read_facts(out))  # (relative IRIs made absolute with the default --base)
    z = "urn:zodiac:"
    assert (z + "hasNeighbour", z + "windTurbine1", z + "windTurbine30") in facts
    assert len([f for f in facts if f[0] == "urn:zodiac:hasNeighbour"]) == 30 * 29


def test_materialise_says_which_facts_ntriples_cannot_hold(tmp_path: Path, capsys):
    """Facts of arity 3 or more and class facts of a literal have no N-Triples form: they are
    left out of the output, and a note on stderr says how many of each relation, so that no
    derived fact goes missing unsaid."""
    rules = tmp_path / "wide.rules"
    rules.write_text(
        "p(a, b) . p(a, c) . v(5) .\n"
        "t(X, Y, Z) :- p(X, Y), p(X, Z), Y != Z .\n"
        "u(X) :- p(X, Y) .\n"
        "w(N) :- v(N) .\n"
    )
    out = tmp_path / "out.nt"
    assert main(["materialise", str(rules), "-o", str(out)]) == 0
    z = "urn:zodiac:"
    assert set(read_facts(out)) == {
        (z + "p", z + "a", z + "b"),
        (z + "p", z + "a", z + "c"),
        (RDF_TYPE, z + "a", z + "u"),
    }
    err = capsys.readouterr().err
    assert "4 facts not written" in err and "(t/3: 2, v/1: 1, w/1: 1)" in err
    assert main(["materialise", str(RULES), "-o", str(out)]) == 0
    assert "not written" not in capsys.readouterr().err  # (RS1 over no facts: nothing left out)


def test_query_prints_answers(farm: Path):
    buffer = io.StringIO()
    assert (
        main(
            ["query", str(RULES), str(farm), "--pattern", "<SensorAnomalyWindTurbine>(X)"],
            out=buffer,
        )
        == 0
    )
    lines = buffer.getvalue().splitlines()
    assert lines[0] == "X" and len(lines) >= 2


def test_query_prints_a_header_without_answers_and_true_or_false_for_a_ground_pattern(
    tmp_path: Path,
):
    """The TSV header is the pattern's variables (``_`` left out), printed even when nothing
    answers; a pattern without variables prints whether it holds (it printed blank lines,
    one or two)."""
    rules = tmp_path / "p.rules"
    rules.write_text("p(a, b) . p(a, c) .\n")

    def lines(pattern: str) -> list[str]:
        buffer = io.StringIO()
        assert main(["query", str(rules), "--pattern", pattern], out=buffer) == 0
        return buffer.getvalue().splitlines()

    assert lines("p(X, _)") == ["X", "a"]
    assert lines("p(Y, Y)") == ["Y"]
    assert lines("nothing(X, Y)") == ["X\tY"]
    assert lines("p(a, b)") == lines("p(_, _)") == ["true"]
    assert lines("p(b, _)") == ["false"]


def test_explain_prints_a_tree(farm: Path):
    buffer = io.StringIO()
    fact = "<hasNeighbour>(<windTurbine1>, <windTurbine3>)"
    assert main(["explain", str(RULES), str(farm), "--fact", fact], out=buffer) == 0
    assert "by rule r2" in buffer.getvalue() and "explicit" in buffer.getvalue()


def test_errors_exit_2_with_a_message(tmp_path: Path, farm: Path, capsys):
    bad = tmp_path / "bad.rules"
    bad.write_text("p(X) :- q(X\n")
    assert main(["materialise", str(bad), str(farm)]) == 2
    err = capsys.readouterr().err
    assert "bad.rules:1:12:" in err and "expected" in err


@pytest.mark.process
def test_console_script_runs_as_a_process(tmp_path: Path, farm: Path):
    out = tmp_path / "out.nt"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "agent.engine.cli",
            "materialise",
            str(RULES),
            str(farm),
            "-o",
            str(out),
            "--stats",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "facts per predicate" in done.stderr and "hyper-nodes" in done.stderr
    assert out.stat().st_size > 0


def collaborators_files(tmp_path: Path) -> tuple[Path, Path]:
    """The hypertree paper's PossibleCollaborator rule and its data (n = k = 10) as files."""
    rules = tmp_path / "pc.rules"
    rules.write_text(
        "@prefix ex: <http://example.org/> .\n"
        "pc: ex:PC(X, Y) :- ex:CW(X, Z1) and ex:CA(X, Z2) and ex:PC(Z1, Y) and ex:PC(Z2, Y) .\n"
    )
    facts = tmp_path / "pc.nt"
    lines = []
    for i in range(10):
        for j in range(1, 11):
            b, c, d = f"b{i * 10 + j}", f"c{i * 10 + j}", f"d{j}"
            for s, p, o in (
                ("a" + str(i), "CW", b),
                ("a" + str(i), "CA", c),
                (b, "PC", d),
                (c, "PC", d),
            ):
                lines.append(
                    f"<http://example.org/{s}> <http://example.org/{p}> <http://example.org/{o}> ."
                )
    facts.write_text("\n".join(lines) + "\n")
    return rules, facts


def test_explain_plans_shows_a_decomposition_and_the_switch_turns_it_off(tmp_path: Path):
    rules, facts = collaborators_files(tmp_path)
    buffer = io.StringIO()
    assert main(["explain", str(rules), str(facts), "--plans", "pc"], out=buffer) == 0
    text = buffer.getvalue()
    # (a cyclic rule over binary relations with a two-variable head: set at a time)
    assert "evaluated through a hypertree decomposition, set at a time" in text
    assert "variables eliminated on bitmaps" in text and "Z1" in text

    buffer = io.StringIO()
    argv = ["--no-decompositions", "explain", str(rules), str(facts), "--plans", "pc"]
    assert main(argv, out=buffer) == 0
    assert "decomposition" not in buffer.getvalue() and "[rule, no delta]" in buffer.getvalue()


@pytest.mark.process
def test_a_reader_that_goes_away_ends_the_command_quietly(farm: Path):
    """``zodiac-edge materialise ... | head -1``: status 0, no traceback."""
    code, error = run_with_the_reader_gone(
        [sys.executable, "-m", "agent.engine.cli", "materialise", str(RULES), str(farm)]
    )
    assert code == 0 and "Traceback" not in error and "BrokenPipe" not in error, error
