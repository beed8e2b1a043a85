"""docs/rules.md is run: every ```datalog block is followed by an ```expected block (the facts
the program derives, beyond those it states, one a line in any order) or a ```refused block
(the first line of the error the engine raises contains the block's text). The facts are
written in the program itself."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from agent.engine import Reasoner, ZodiacError
from agent.engine.language import RDF_TYPE, Program, format_value
from agent.engine.program.parser import parse_program

DOC = Path(__file__).resolve().parents[2] / "docs" / "rules.md"
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```$", re.DOTALL | re.MULTILINE)
BARE = re.compile(r"[a-z][A-Za-z0-9_]*")


def examples() -> list[tuple[int, str, str, str]]:
    """(line, program, kind, expected) of each example, in the page's order."""
    text = DOC.read_text(encoding="utf-8")
    fences = [
        (text.count("\n", 0, m.start()) + 1, m[1], m[2]) for m in FENCE.finditer(text)
    ]
    found = []
    for (line, kind, body), following in zip(fences, [*fences[1:], None], strict=True):
        if kind != "datalog":
            continue
        assert following is not None and following[1] in ("expected", "refused"), (
            f"docs/rules.md:{line}: a datalog block is followed by an expected or refused block"
        )
        found.append((line, body, following[1], following[2]))
    return found


def term(value: object) -> str:
    """A value as the page prints it: a bare lower-case name as written, else rule syntax."""
    if isinstance(value, str) and BARE.fullmatch(value):
        return value
    return format_value(value)


def render(fact: tuple) -> str:
    if len(fact) == 3 and fact[0] == RDF_TYPE:
        return f"{term(fact[2])}({term(fact[1])})"
    return f"{term(fact[0])}({', '.join(term(v) for v in fact[1:])})"


def derived(program: str) -> list[str]:
    stated = Reasoner()  # (the facts the program states, without its rules)
    stated.add_rules(Program(facts=parse_program(program).facts))
    reasoner = Reasoner()
    reasoner.add_rules(program)
    given = set(stated.facts())
    return sorted(render(f) for f in reasoner.facts() if f not in given)


def test_the_page_has_examples():
    assert len(examples()) >= 20


@pytest.mark.parametrize("example", examples(), ids=lambda e: f"line{e[0]}")
def test_every_example_gives_what_the_page_says(example):
    line, program, kind, expected = example
    if kind == "expected":
        want = sorted(x.strip() for x in expected.splitlines() if x.strip())
        assert derived(program) == want, f"docs/rules.md:{line}"
    else:
        with pytest.raises(ZodiacError) as raised:
            Reasoner().add_rules(program)
        first = str(raised.value).splitlines()[0]
        assert expected.strip() in first, f"docs/rules.md:{line}: {first}"
