"""Bad input to ``zodiac-edge``: every case ends with a non-zero exit and one clear line on
stderr naming the problem, never a traceback (an exception escaping ``main`` is one)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from agent.engine.cli import main

XSD_DOUBLE = "<http://www.w3.org/2001/XMLSchema#double>"
GOOD_RULES = "r: <q>(X, Y) :- <p>(X, Y) .\n"
GOOD_FACTS = "<a> <p> <b> .\n"


def nested(open_: str, close: str, depth: int, core: str = "X") -> str:
    return open_ * depth + core + close * depth


# (id, files to write {name: text or bytes}, argv with {d} for the folder, what stderr names)
CASES = [
    ("rules-missing", {}, ["materialise", "{d}/none.rules"], "none.rules"),
    (
        "windowed",
        {"r.rules": "@window <p> 10 min as <w> .\n" + GOOD_RULES},
        ["materialise", "{d}/r.rules"],
        "windows (@window <p> 10 min as <w> .) are kept by the agent",
    ),
    (
        "watched",
        {"r.rules": "@watch <q>(X) .\n" + GOOD_RULES},
        ["query", "{d}/r.rules", "<q>(X)"],
        "watches (@watch <q>(X) .) are the agent's",
    ),
    ("rules-is-directory", {"dir/x": ""}, ["materialise", "{d}/dir"], "dir"),
    (
        "facts-missing",
        {"r.rules": GOOD_RULES},
        ["materialise", "{d}/r.rules", "{d}/no.nt"],
        "no.nt",
    ),
    (
        "facts-is-directory",
        {"r.rules": GOOD_RULES, "dir/x": ""},
        ["materialise", "{d}/r.rules", "{d}/dir"],
        "dir",
    ),
    ("rules-syntax", {"r.rules": "r: <q>(X :- <p>(X) .\n"}, ["materialise", "{d}/r.rules"], ":1:"),
    (
        "rules-not-utf8",
        {"r.rules": b"\xff\xfe\x00r: <q>(X)"},
        ["materialise", "{d}/r.rules"],
        "r.rules",
    ),
    (
        "facts-not-utf8",
        {"r.rules": GOOD_RULES, "f.nt": b"\xff\xfe<a> <p> \x00 ."},
        ["materialise", "{d}/r.rules", "{d}/f.nt"],
        "f.nt",
    ),
    (
        "facts-syntax",
        {"r.rules": GOOD_RULES, "f.nt": "<a> <p> .\n"},
        ["materialise", "{d}/r.rules", "{d}/f.nt"],
        "f.nt",
    ),
    (
        "deep-parentheses",
        {"r.rules": "<q>(Y) :- <p>(X) and bind(" + nested("(", ")", 3000) + " as Y) .\n"},
        ["materialise", "{d}/r.rules"],
        "nest",
    ),
    (
        "deep-unary-minus",
        {"r.rules": "<q>(Y) :- <p>(X) and bind(" + "-" * 3000 + "X as Y) .\n"},
        ["materialise", "{d}/r.rules"],
        "nest",
    ),
    (
        "deep-abs",
        {"r.rules": "<q>(Y) :- <p>(X) and bind(" + nested("abs(", ")", 3000) + " as Y) .\n"},
        ["materialise", "{d}/r.rules"],
        "nest",
    ),
    (
        "flat-sum-1000",
        {"r.rules": "<q>(Y) :- <p>(X) and bind(" + " + ".join(["X"] * 1000) + " as Y) .\n"},
        ["materialise", "{d}/r.rules"],
        "operators",
    ),
    (
        "flat-product-5000",
        {"r.rules": "<q>(Y) :- <p>(X) and bind(" + " * ".join(["X"] * 5000) + " as Y) .\n"},
        ["materialise", "{d}/r.rules"],
        "operators",
    ),
    (
        "nan-literal-in-rule",
        {"r.rules": f'<q>(X) :- <p>(X, Y) and COMP(Y, <, "NaN"^^{XSD_DOUBLE}) .\n'},
        ["materialise", "{d}/r.rules"],
        "NaN",
    ),
    (
        "inf-literal-in-rule",
        {"r.rules": f'<q>(X) :- <p>(X, Y) and COMP(Y, <, "INF"^^{XSD_DOUBLE}) .\n'},
        ["materialise", "{d}/r.rules"],
        "INF",
    ),
    (
        "nan-in-facts",
        {"r.rules": GOOD_RULES, "f.nt": f'<a> <p> "NaN"^^{XSD_DOUBLE} .\n'},
        ["materialise", "{d}/r.rules", "{d}/f.nt"],
        "NaN",
    ),
    (
        "inf-in-facts",
        {"r.rules": GOOD_RULES, "f.nt": f'<a> <p> "-INF"^^{XSD_DOUBLE} .\n'},
        ["materialise", "{d}/r.rules", "{d}/f.nt"],
        "INF",
    ),
    ("unsafe-rule", {"r.rules": "<q>(X, Z) :- <p>(X, Y) .\n"}, ["materialise", "{d}/r.rules"], "Z"),
    (
        "unstratifiable",
        {"r.rules": "<q>(X) :- <p>(X, Y) and not <s>(X) .\n<s>(X) :- <p>(X, Y) and not <q>(X) .\n"},
        ["materialise", "{d}/r.rules"],
        "cycle",
    ),
    (
        "huge-body",
        {
            "r.rules": "<q>(X0) :- "
            + " and ".join(f"<p>(X{i}, X{i + 1})" for i in range(600))
            + " .\n"
        },
        ["materialise", "{d}/r.rules"],
        "500",
    ),
    (
        "output-dir-missing",
        {"r.rules": GOOD_RULES},
        ["materialise", "{d}/r.rules", "-o", "{d}/none/out.nt"],
        "none",
    ),
    (
        "output-is-directory",
        {"r.rules": GOOD_RULES, "dir/x": ""},
        ["materialise", "{d}/r.rules", "-o", "{d}/dir"],
        "dir",
    ),
    (
        "query-malformed",
        {"r.rules": GOOD_RULES},
        ["query", "{d}/r.rules", "--pattern", "<q>(X"],
        "pattern",
    ),
    (
        "explain-malformed",
        {"r.rules": GOOD_RULES},
        ["explain", "{d}/r.rules", "--fact", "<q>(<a>,"],
        "fact",
    ),
    (
        "explain-not-ground",
        {"r.rules": GOOD_RULES},
        ["explain", "{d}/r.rules", "--fact", "<q>(<a>, X)"],
        "ground",
    ),
    (
        "explain-does-not-hold",
        {"r.rules": GOOD_RULES, "f.nt": GOOD_FACTS},
        ["explain", "{d}/r.rules", "{d}/f.nt", "--fact", "<q>(<b>, <a>)"],
        "does not hold",
    ),
    (
        "plans-unknown-rule",
        {"r.rules": GOOD_RULES},
        ["explain", "{d}/r.rules", "--plans", "x"],
        "x",
    ),
    (
        "budget-facts-exceeded",
        {
            "r.rules": "<q>(X, Y) :- <p>(X, Z) and <p>(W, Y) .\n",
            "f.nt": "".join(f"<a{i}> <p> <b{i}> .\n" for i in range(100)),
        },
        ["--max-derived-facts", "50", "materialise", "{d}/r.rules", "{d}/f.nt"],
        "50",
    ),
]
USAGE = [  # argparse errors: exit 2 and a usage line
    ["--max-derived-facts", "abc", "materialise", "r.rules"],
    ["--max-derived-facts", "-3", "materialise", "r.rules"],
    ["--max-seconds", "nan", "materialise", "r.rules"],
    ["--max-memory-mb", "0", "materialise", "r.rules"],
    ["materialise"],
    ["explain", "r.rules"],
    ["explain", "r.rules", "--fact", "<q>(<a>)", "--max-depth", "0"],
    ["explain", "r.rules", "--fact", "<q>(<a>)", "--max-depth", "deep"],
    ["frobnicate"],
]


def write(folder: Path, files: dict) -> None:
    for name, text in files.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(text if isinstance(text, bytes) else text.encode())


@pytest.mark.parametrize(
    ("files", "argv", "names"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_bad_input_is_one_clear_line_and_a_non_zero_exit(tmp_path, capsys, files, argv, names):
    write(tmp_path, files)
    code = main([a.format(d=tmp_path) for a in argv])  # an escaping exception fails the test
    err = capsys.readouterr().err
    assert code != 0
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("zodiac-edge: error: "), err
    assert names.lower() in lines[0].lower(), err
    assert "Traceback" not in err


@pytest.mark.parametrize("argv", USAGE, ids=[" ".join(a) for a in USAGE])
def test_bad_options_are_usage_errors(capsys, argv):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    assert "error:" in capsys.readouterr().err


@pytest.mark.process
def test_a_closed_output_pipe_ends_quietly(tmp_path):
    rules = tmp_path / "r.rules"
    rules.write_text(GOOD_RULES)
    facts = tmp_path / "f.nt"
    facts.write_text("".join(f"<a{i}> <p> <b{i}> .\n" for i in range(20000)))
    script = f"{sys.executable} -m agent.engine.cli materialise {rules} {facts} | head -1"
    done = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=120)
    assert done.stdout.count("\n") == 1
    assert "Traceback" not in done.stderr and "Error" not in done.stderr, done.stderr
