"""The zodiac-edge Datalog engine: everything a user of it imports comes from here.

The folders are its layers, each importing only those below it (``tests/docs/test_layers.py``)::

    errors, language, terms, values, costs, budget, gcpause   the shared vocabulary
    program/    text -> rules (parser, validation, RDF input) -> dependency graph, hyper-nodes
    storage/    relations and data stores, facts by subject, changes, read-only views
    plan/       body order, decompositions, code shapes (rewrites), compiler, executor
    equality/   owl:sameAs by rewriting
    modules/    one evaluation module per kind of hyper-node (support/: what they share)
    update/     the update driver: net changes, transitions, estimates, maintenance
    reasoner, explain, cli                                    the facade

``Reasoner`` is the facade; ``docs/semantics.md`` is the language's contract.
"""

from agent.engine.budget import Budget, BudgetExceeded
from agent.engine.errors import (
    DirectiveError,
    NonFiniteError,
    NotTextError,
    ParseError,
    RuleError,
    StratificationError,
    UnknownRuleError,
    UnsafeRuleError,
    ZodiacError,
)
from agent.engine.explain import Derivation
from agent.engine.language import (
    RDF_TYPE,
    XSD,
    Aggregate,
    Atom,
    BinaryOp,
    Bind,
    Call,
    Comparison,
    Constant,
    Literal,
    Negation,
    Program,
    Rule,
    Value,
    Variable,
    WindowDeclaration,
)
from agent.engine.program.loaders import load_facts, load_program
from agent.engine.program.parser import parse_atom, parse_file, parse_program, parse_window
from agent.engine.reasoner import Reasoner
from agent.engine.storage.watches import WatchChange
from agent.engine.terms import fact_identity
from agent.engine.update.net_change import NetChange

__all__ = [
    # the facade
    "Reasoner",
    "Derivation",
    "WatchChange",
    "Budget",
    "BudgetExceeded",
    # reading rules and facts
    "parse_program",
    "parse_file",
    "parse_atom",
    "parse_window",
    "load_program",
    "load_facts",
    "read_facts",
    "write_ntriples",
    # the language: rules as syntax trees, and values
    "Program",
    "Rule",
    "Atom",
    "Negation",
    "Comparison",
    "Bind",
    "Aggregate",
    "BinaryOp",
    "Call",
    "Constant",
    "Variable",
    "Literal",
    "Value",
    "WindowDeclaration",
    "RDF_TYPE",
    "XSD",
    # updates
    "NetChange",
    "fact_identity",
    # errors
    "ZodiacError",
    "ParseError",
    "RuleError",
    "UnsafeRuleError",
    "StratificationError",
    "UnknownRuleError",
    "NonFiniteError",
    "NotTextError",
    "DirectiveError",
]


def __getattr__(name: str):
    """``read_facts`` and ``write_ntriples`` are imported on first use: they need pyoxigraph
    (and rdflib for RDF/XML), which an agent that reads no RDF file should not pay for at
    start."""
    if name in ("read_facts", "write_ntriples"):
        from agent.engine.program import rdf

        return getattr(rdf, name)
    raise AttributeError(f"module 'agent.engine' has no attribute {name!r}")
