"""``zodiac-edge`` forgives and warns: options on either side of the command, one way to give a
query pattern, the rule file's prefixes in patterns, facts and output, valid N-Triples, warnings
for programs that run but say something else than was meant, and the interactive shell."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import pytest
import rdflib

from agent.engine import Reasoner
from agent.engine.cli import main
from agent.engine.program.lint import edit_distance, program_warnings
from agent.engine.program.parser import parse_file

XSD = "http://www.w3.org/2001/XMLSchema#"
EX = "http://example.org/"
RULES = """@prefix ex: <http://example.org/> .
r1: ex:path(X, Y) :- ex:edge(X, Y) .
r2: ex:path(X, Z) :- ex:edge(X, Y), ex:path(Y, Z) .
"""
FACTS = """@prefix ex: <http://example.org/> .
ex:a ex:edge ex:b .
ex:b ex:edge ex:c .
"""


@pytest.fixture
def files(tmp_path: Path) -> tuple[str, str]:
    rules, facts = tmp_path / "paths.rules", tmp_path / "edges.ttl"
    rules.write_text(RULES)
    facts.write_text(FACTS)
    return str(rules), str(facts)


def run(argv: list[str], capsys) -> tuple[int, str, str]:
    buffer = io.StringIO()
    code = main(argv, out=buffer)
    return code, buffer.getvalue(), capsys.readouterr().err


# --- 1. options before or after the command ------------------------------------------------


def test_shared_options_are_taken_before_or_after_the_command(files, capsys, tmp_path):
    rules, facts = files
    code, _, err = run(["--stats", "materialise", rules, facts], capsys)
    assert code == 0 and "facts: 5 (2 explicit)" in err
    code, _, err = run(["materialise", rules, facts, "--max-seconds", "5"], capsys)
    assert code == 0 and err == ""
    code, _, err = run(["materialise", rules, facts, "--max-derived-facts", "1"], capsys)
    assert code == 2 and err.startswith("zodiac-edge: error: ") and "derived" in err
    out = tmp_path / "out.nt"
    assert run(["-o", str(out), "materialise", rules, facts], capsys)[0] == 0
    assert len(out.read_text().splitlines()) == 5
    # given on both sides, the one after the command wins (it is read last)
    code, _, err = run(["--max-seconds", "5", "materialise", rules, facts, "--stats"], capsys)
    assert code == 0 and "facts: 5" in err


# --- 2. explain --plans before the files ---------------------------------------------------


def test_plans_before_the_files_is_every_rule_not_a_rule_named_after_the_file(files, capsys):
    rules, facts = files
    code, out, err = run(["explain", "--plans", rules, facts], capsys)
    assert code == 0, err
    assert "# r1: " in out and "# r2: " in out
    code, out, _ = run(["explain", rules, facts, "--plans", "r2"], capsys)
    assert code == 0 and "# r2: " in out and "# r1: " not in out
    code, out, _ = run(["explain", rules, facts, "--rule", "r1"], capsys)
    assert code == 0 and "# r1: " in out and "# r2: " not in out
    code, _, err = run(["explain", rules, facts, "--plans", "r7"], capsys)
    assert code == 2 and err.splitlines() == [
        "zodiac-edge: error: --plans: no rule named 'r7' (rules: r1, r2; --plans alone prints "
        "every rule's)"
    ]


# --- 3. the query pattern as the last argument ---------------------------------------------


def test_query_takes_the_pattern_as_its_last_argument_or_as_pattern(files, capsys):
    rules, facts = files
    full = f"<{EX}path>(<{EX}a>, X)"
    expected = f"X\n{EX}b\n{EX}c\n"
    assert run(["query", rules, facts, full], capsys)[:2] == (0, expected)
    assert run(["query", rules, facts, "--pattern", full], capsys)[:2] == (0, expected)
    for argv in (["query", rules], ["query", rules, facts]):  # (a file is no pattern)
        code, _, err = run(argv, capsys)
        assert code == 2 and err.splitlines() == [
            "zodiac-edge: error: query needs RULES, then any FACTS files, then a PATTERN such "
            "as '<p11>(X, Y)'"
        ]


# --- 4. the rule file's prefixes -----------------------------------------------------------


def test_the_rule_files_prefixes_work_in_patterns_facts_and_output(files, capsys):
    rules, facts = files
    assert run(["query", rules, facts, "ex:path(ex:a, X)"], capsys)[:2] == (
        0,
        f"X\n{EX}b\n{EX}c\n",
    )
    assert run(["query", rules, facts, "ex:path(ex:a, X)", "--prefixes"], capsys)[:2] == (
        0,
        "X\nex:b\nex:c\n",
    )
    code, out, _ = run(
        ["explain", rules, facts, "--fact", "ex:path(ex:a, ex:c)", "--prefixes"], capsys
    )
    assert code == 0 and out.splitlines()[0] == "ex:path(ex:a, ex:c)   [by rule r2]"
    code, out, _ = run(["--prefixes", "materialise", rules, facts], capsys)
    assert code == 0 and "@prefix ex: <http://example.org/> ." in out
    assert "ex:a ex:path ex:c ." in out
    graph = rdflib.Graph().parse(data=out, format="turtle")  # (Turtle, read back by rdflib)
    assert len(graph) == 5


def test_an_unknown_prefix_in_a_pattern_says_where_to_declare_it(files, capsys):
    rules, facts = files
    code, _, err = run(["query", rules, facts, "foo:path(X, Y)"], capsys)
    assert code == 2
    assert err.splitlines() == [
        "zodiac-edge: error: pattern:1:1: unknown prefix 'foo:' in 'foo:path'; declare it in "
        "the rule file with @prefix foo: <...> . or write the full <iri>"
    ]


# --- 5. valid N-Triples, datatypes kept ----------------------------------------------------


def test_output_is_valid_ntriples_that_rdflib_reads_back(tmp_path, capsys):
    rules = tmp_path / "r.rules"
    rules.write_text("<near>(X, Y) :- <adjacent>(X, Y) .\n")
    facts = tmp_path / "f.nt"
    facts.write_text(
        "<wt1> <adjacent> <wt2> .\n"
        f'<wt1> <reads> "2.5"^^<{XSD}decimal> .\n'
        "<wt1> <reads2> 4.25 .\n<wt1> <big> 1.0e300 .\n<wt1> <count> 3 .\n"
    )
    code, out, _ = run(["materialise", str(rules), str(facts)], capsys)
    assert code == 0
    graph = rdflib.Graph().parse(data=out, format="nt")  # (strict: absolute IRIs only)
    z = rdflib.Namespace("urn:zodiac:")
    assert (z.wt1, z.near, z.wt2) in graph
    types = {str(p): str(o.datatype) for _, p, o in graph if isinstance(o, rdflib.Literal)}
    assert types == {
        str(z.reads): XSD + "decimal",
        str(z.reads2): XSD + "decimal",
        str(z.big): XSD + "double",
        str(z["count"]): XSD + "integer",
    }
    code, out, _ = run(["materialise", str(rules), str(facts), "--base", EX], capsys)
    assert code == 0 and f"<{EX}wt1> <{EX}near> <{EX}wt2> ." in out
    rdflib.Graph().parse(data=out, format="nt")


def test_a_base_that_is_no_absolute_iri_is_refused(files, capsys):
    rules, facts = files
    code, out, err = run(["materialise", rules, facts, "--base", "turbines/"], capsys)
    assert (code, out) == (2, "")
    assert err.splitlines() == [
        "zodiac-edge: error: --base must be an absolute IRI such as urn:zodiac: or "
        "http://example.org/, got 'turbines/'"
    ]


# --- 6. warnings, --strict ------------------------------------------------------------------

MISTAKES = """path(x, y) :- edge(x, y) .
reach(X, Y) :- edg(X, Y) .
ratio(X, R) :- edge(X, Y), weight(X, W), bind(W / 0 as R) .
"""


def test_programs_that_run_but_mean_something_else_get_warnings(tmp_path, capsys):
    rules = tmp_path / "m.rules"
    rules.write_text(MISTAKES)
    facts = tmp_path / "f.nt"
    facts.write_text("<a> <edge> <b> .\n<a> <weight> 3 .\n")
    code, out, err = run(["materialise", str(rules), str(facts)], capsys)
    assert code == 0 and out
    assert err.splitlines() == [
        "zodiac-edge: warning: rule `<path>(<x>, <y>) :- <edge>(<x>, <y>) .`: <edge>(<x>, <y>) "
        "matches no fact; x, y are constants (a variable starts with an upper-case letter, _ or ?)",
        "zodiac-edge: warning: rule `<reach>(X, Y) :- <edg>(X, Y) .`: atom edg/2 does not occur "
        "in any rule head or fact (did you mean edge/2?)",
        "zodiac-edge: warning: 1 run-time error in binds and comparisons (division by zero, a "
        "number compared with a string, ...): each made a rule body fail",
    ]
    out_file = tmp_path / "out.nt"
    argv = ["--strict", "materialise", str(rules), str(facts), "-o", str(out_file)]
    code, out, err = run(argv, capsys)
    assert code == 1 and out == "" and not out_file.exists()
    last = err.splitlines()[-1]
    assert last == "zodiac-edge: error: 3 warnings under --strict; nothing written"
    assert all(line.startswith("zodiac-edge: error: ") for line in err.splitlines())


def test_comparing_a_number_with_a_string_is_counted(tmp_path, capsys):
    rules = tmp_path / "c.rules"
    rules.write_text('big(X) :- size(X, S), S > "ten" .\n')
    facts = tmp_path / "f.nt"
    facts.write_text("<a> <size> 12 .\n")
    code, _, err = run(["query", str(rules), str(facts), "big(X)", "--strict"], capsys)
    assert code == 1 and "1 run-time error in binds and comparisons" in err


def test_edit_distance():
    assert edit_distance("edge", "edg") == 1
    assert edit_distance("hasNeighbour", "hasNieghbour") == 2
    assert edit_distance("a", "abcdef") == 3  # (past the limit: limit + 1)


def _shipped_programs() -> list[tuple[str, list[Path], list[tuple]]]:
    from simulations.bench.datasets import ds1, ds2
    from simulations.windfarm.farm import Farm, SensorModel

    farm = Farm.grid(9)
    scenario = SensorModel(farm, fault_at=1.0)
    readings = [f for t in farm.turbines for f in scenario.readings(t.id, 10.0)]
    streams = Path("rules/windfarm/streams")
    return [
        ("rs1", [Path("rules/benchmarks/rs1.rules")], ds1(30)),
        ("rs2", [Path("rules/benchmarks/rs2.rules")], ds2(8)),
        ("rs3", [Path("rules/benchmarks/rs3.rules")], ds2(8)),
        ("farm", [Path("rules/windfarm/farm.rules")], farm.layout_facts()),
        (
            "farm+streams",
            [Path("rules/windfarm/farm.rules"), *sorted(streams.rglob("*.rules"))],
            farm.layout_facts() + readings,
        ),
    ]


@pytest.mark.parametrize("case", _shipped_programs(), ids=lambda case: case[0])
def test_no_warning_on_the_shipped_rule_files_with_their_data(case):
    _, rule_files, facts = case
    assert {p.name for p in Path("rules").rglob("*.rules")} <= {
        p.name for _, files, _ in _shipped_programs() for p in files
    }
    reasoner = Reasoner()
    reasoner.add_facts(facts)
    for path in rule_files:
        # A stream's @window and @watch are the agent's: the engine gets the rules, and the
        # window facts the agent would keep of these readings.
        program = parse_file(path)
        reasoner.update(add_rules=program.rules)
        for window in program.windows:
            reasoner.add_facts(
                [
                    (window.relation, *f[1:], 1_800_000_000.0)
                    for f in facts
                    if f[0] == window.reading
                ]
            )
    assert reasoner.count() > len(facts)  # (the rules did derive something)
    assert program_warnings(reasoner) == []


# --- 7. the shell -------------------------------------------------------------------------

SESSION = """help
+ ex:edge(ex:c, ex:d) .
- ex:edge(ex:a, ex:b) .
+rule r3: ex:twice(X, Z) :- ex:edge(X, Y), ex:edge(Y, Z) .
query ex:twice(X, Y)
explain ex:path(ex:b, ex:d)
+ ex:edge(X, ex:d) .
bogus
-rule r9
-rule r3
quit
+ ex:edge(ex:x, ex:y) .
"""


def test_the_shell_shows_what_each_update_changed(files, capsys, monkeypatch):
    rules, facts = files
    monkeypatch.setattr(sys, "stdin", io.StringIO(SESSION))
    code, out, err = run(["shell", rules, facts, "--prefixes"], capsys)
    assert code == 0
    assert err.splitlines() == [
        "error: + must be ground (no variables): ex:edge(X, ex:d) .",
        "error: unknown command 'bogus' (type help)",
        "error: no rule with id or text 'r9'",
    ]
    blocks = out.split("# ")
    added = blocks[0].split("after each update")[1]
    assert (
        "+ ex:edge(ex:c, ex:d)\n+ ex:path(ex:a, ex:d)\n+ ex:path(ex:b, ex:d)\n"
        "+ ex:path(ex:c, ex:d)\n"
    ) in added
    assert "hyper-node" in added and " ms)" in added
    assert "add 1 fact(s): " in blocks[1]
    deleted = blocks[1].split("\n", 1)[1]
    assert deleted.startswith(
        "- ex:edge(ex:a, ex:b)\n- ex:path(ex:a, ex:b)\n- ex:path(ex:a, ex:c)\n"
        "- ex:path(ex:a, ex:d)\n"
    )
    assert "+ ex:twice(ex:b, ex:d)\n" in out and "X\tY\nex:b\tex:d\n" in out
    assert "ex:path(ex:b, ex:d)   [by rule r2]" in out
    assert "- ex:twice(ex:b, ex:d)\n" in out  # (-rule r3)
    assert "ex:x" not in out  # (after quit, nothing runs)


@pytest.mark.process
def test_the_shell_reads_a_pipe(files):
    rules, facts = files
    done = subprocess.run(
        [sys.executable, "-m", "agent.engine.cli", "shell", rules, facts],
        input="+ <http://example.org/edge>(<http://example.org/c>, <http://example.org/d>) .\n",
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(
        "+ <http://example.org/edge>(<http://example.org/c>, <http://example.org/d>)\n"
    )
    assert "# add 1 fact(s): " in done.stdout
