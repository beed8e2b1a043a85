"""Evaluation modules: each evaluates and maintains the rules of one hyper-node.

All modules share the interface of :class:`base.Module` (the modular-materialisation paper's
Add / Del / Diff / Red), so the update driver never needs to know which algorithm a hyper-node
uses. ``choose_module`` picks one by rule pattern (``patterns.py``).
"""

from agent.engine.costs import DEFAULT_COSTS, CostPolicy
from agent.engine.modules.aggregate import AggregateModule
from agent.engine.modules.base import Module, NodeState
from agent.engine.modules.composition import CompositionModule, composition_shape
from agent.engine.modules.hypertree import HypertreeModule, choose_decompositions
from agent.engine.modules.renaming import RenamingModule, is_renaming_node
from agent.engine.modules.semijoin import SemiJoinModule, semijoin_shape
from agent.engine.modules.seminaive import SeminaiveModule
from agent.engine.modules.shapes import ClosurePattern, detect_closure
from agent.engine.modules.symmetric_transitive import SymmetricTransitiveModule
from agent.engine.modules.transitive import TransitiveClosureModule


def choose_module(
    node: NodeState, use_modules: bool = True, costs: CostPolicy = DEFAULT_COSTS
) -> Module:
    """The module for a hyper-node, deciding by the recompute thresholds of ``costs``."""
    module = _module_for(node, use_modules, costs)
    module.costs = costs
    return module


def _module_for(node: NodeState, use_modules: bool, costs: CostPolicy) -> Module:
    """Aggregates have their own module. Unless ``use_modules`` is off: transitive and
    symmetric-transitive closures get the closure modules, hyper-nodes that only copy facts
    (columns possibly permuted) the renaming module, a lone rule ``H(x, z) :- A(x, y),
    B(y, z)`` (optionally ``and not N(y, z)``) the composition module, a lone rule keeping the
    facts of one atom that match (or not) filter atoms, ``H(x, y) :- A(x, y), B(y, _)``, the
    semi-join module. A hyper-node with a cyclic rule worth decomposing (by the policy's
    ``decompositions`` setting) gets the hypertree module.
    Everything else is seminaive."""
    if any(rule.aggregate() is not None for rule in node.rules):
        return AggregateModule()
    if not use_modules:
        return SeminaiveModule()
    pattern = detect_closure(node.rules)
    if pattern is not None:
        if pattern.kind == "transitive":
            return TransitiveClosureModule(pattern.relation, pattern.irreflexive)
        return SymmetricTransitiveModule(pattern.relation, pattern.irreflexive)
    if is_renaming_node(node.rules):
        return RenamingModule()
    if len(node.rules) == 1:
        composition = composition_shape(node.rules[0])
        if composition is not None:
            return CompositionModule(composition)
        semijoin = semijoin_shape(node.rules[0])
        if semijoin is not None:
            return SemiJoinModule(semijoin)
    return _hypertree_or_seminaive(node, costs)


def _hypertree_or_seminaive(node: NodeState, costs: CostPolicy) -> Module:
    if costs.decompositions != "off":
        choices = choose_decompositions(node, costs.decompositions)
        if any(choice.decomposed is not None for choice in choices.values()):
            return HypertreeModule(choices, costs.decompositions)
    return SeminaiveModule()


__all__ = [
    "AggregateModule",
    "ClosurePattern",
    "CompositionModule",
    "HypertreeModule",
    "Module",
    "NodeState",
    "RenamingModule",
    "SemiJoinModule",
    "SeminaiveModule",
    "SymmetricTransitiveModule",
    "TransitiveClosureModule",
    "choose_module",
    "detect_closure",
]
