"""The zodiac-edge Datalog engine.

Layers, each knowing only the one below: ``parser`` (text -> ``language`` AST) ->
``dependency`` (hyper-node graph) -> ``planner`` / ``compiler`` (plans -> Python functions) ->
``modules`` (evaluation per hyper-node) -> ``store`` (relations, indexes). ``Reasoner`` is the
facade.
"""

from agent.engine.budget import Budget, BudgetExceeded
from agent.engine.errors import (
    ParseError,
    RuleError,
    StratificationError,
    UnknownRuleError,
    UnsafeRuleError,
    ZodiacError,
)
from agent.engine.explain import Derivation
from agent.engine.language import RDF_TYPE, Literal, Program, Rule
from agent.engine.reasoner import Reasoner

__all__ = [
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
