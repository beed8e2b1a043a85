"""What ``Reasoner.add_rules`` and ``add_facts`` accept, turned into what the engine works on:
rule text, a rule file, a Program or Rule objects -> a Program; an RDF file or fact tuples ->
a list of fact tuples. Files are read by the parsers beside this module (``parser.py`` for
rules, ``rdf.py`` for N-Triples and Turtle); the agent and the Spark job load their inputs
through the same two functions.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from agent.engine.errors import ZodiacError
from agent.engine.language import Program, Rule, name_anonymous_variables
from agent.engine.program.parser import parse_file, parse_program

FactInput = tuple
# The endings of a rule file's name: a one-line string ending so is a path, never rule text.
RULE_FILE_SUFFIXES = (".rules", ".dl", ".datalog")


def load_program(source: str | os.PathLike | Program | Iterable[Rule]) -> Program:
    """Rule text, a path to a rule file, a Program, or Rule objects -> Program. A string is a
    path when it names an existing file and has no rule in it (no ``:-``, one line); one that
    ends as a rule file's name does (RULE_FILE_SUFFIXES) but names no file is a path mistyped,
    said so rather than parsed as rules."""
    if isinstance(source, Program):
        rules = tuple(map(name_anonymous_variables, source.rules))
        return Program(rules, source.facts, source.windows, source.watches)
    if isinstance(source, os.PathLike):
        return parse_file(source)
    if isinstance(source, str):
        one_line = ":-" not in source and "\n" not in source
        if one_line and os.path.exists(source):
            return parse_file(source)
        if one_line and source.strip().endswith(RULE_FILE_SUFFIXES):
            raise ZodiacError(f"no such rule file: {source.strip()}")
        return parse_program(source)
    return Program(rules=tuple(map(name_anonymous_variables, source)))


def load_facts(source: str | os.PathLike | Iterable[FactInput]) -> list[FactInput]:
    """A path to an RDF file (N-Triples, Turtle), or an iterable of fact tuples."""
    if isinstance(source, (str, os.PathLike)):
        from agent.engine.program.rdf import (
            read_facts,  # rdflib is imported only by those who read RDF files
        )

        path = Path(source)
        if not path.exists():
            raise ZodiacError(f"no such fact file: {source}")
        return list(read_facts(path))
    return list(source)
