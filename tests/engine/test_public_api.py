"""The engine's public surface is ``agent.engine.__all__``: everything a user imports comes from
there, whatever folder it lives in, and the names it ever exported keep working."""

from __future__ import annotations

import subprocess
import sys

import pytest

import agent.engine

# What ``agent.engine`` exported before its modules moved into folders: each must stay.
EXPORTED_BEFORE = [
    "RDF_TYPE",
    "Budget",
    "BudgetExceeded",
    "Derivation",
    "Literal",
    "ParseError",
    "Program",
    "Reasoner",
    "Rule",
    "RuleError",
    "StratificationError",
    "UnknownRuleError",
    "UnsafeRuleError",
    "ZodiacError",
]


def test_every_public_name_imports():
    for name in agent.engine.__all__:
        assert getattr(agent.engine, name) is not None, name
    namespace: dict = {}
    exec("from agent.engine import *", namespace)
    assert set(agent.engine.__all__) <= set(namespace)


def test_what_was_exported_before_still_is():
    assert set(EXPORTED_BEFORE) <= set(agent.engine.__all__)
    for name in EXPORTED_BEFORE:
        exec(f"from agent.engine import {name}", {})


def test_what_users_reached_into_modules_for_is_public():
    for name in ("parse_program", "load_program", "load_facts", "read_facts", "Atom", "Negation"):
        assert name in agent.engine.__all__, name


def test_the_surface_works_end_to_end(tmp_path):
    from agent.engine import Atom, Constant, Reasoner, Variable, load_facts, parse_program

    facts = tmp_path / "f.nt"
    facts.write_text("<a> <e> <b> .\n<b> <e> <c> .\n")
    reasoner = Reasoner()
    reasoner.update(add_rules=parse_program("t(X, Y) :- e(X, Y) .\nt(X, Z) :- t(X, Y), e(Y, Z) ."),
                    add_facts=load_facts(facts))  # fmt: skip
    pattern = Atom("t", (Constant("a"), Variable("Y")))
    assert sorted(a["Y"] for a in reasoner.query(pattern)) == ["b", "c"]


@pytest.mark.process
def test_importing_the_engine_does_not_import_rdflib():
    """pyoxigraph and rdflib are for reading RDF files: an agent that reads none must not pay
    for them at start (``read_facts`` and ``write_ntriples`` load them on first use)."""
    probe = (
        "import sys, agent.engine; print('rdflib' in sys.modules or 'pyoxigraph' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
