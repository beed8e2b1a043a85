"""Evaluation modules: each evaluates and maintains the rules of one hyper-node.

All modules share the interface of :class:`base.Module` (the modular-materialisation paper's
Add / Del / Diff / Red), so the update driver never needs to know which algorithm a hyper-node
uses. ``choose_module`` picks one by the shape of the rules (``shapes.py``); the helpers the
modules share are in ``support/``.
"""

from agent.engine.costs import DEFAULT_COSTS, CostPolicy
from agent.engine.modules.aggregate import AggregateModule
from agent.engine.modules.base import Module, NodeState
from agent.engine.modules.composition import CompositionModule
from agent.engine.modules.hypertree import HypertreeModule, choose_decompositions
from agent.engine.modules.linear import LinearClosureModule
from agent.engine.modules.renaming import RenamingModule
from agent.engine.modules.semijoin import SemiJoinModule
from agent.engine.modules.seminaive import SeminaiveModule
from agent.engine.modules.shapes import (
    ClosurePattern,
    CompositionPattern,
    LinearClosurePattern,
    RenamingPattern,
    SemiJoinPattern,
    detect_closure,
    node_shape,
)
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
    """Aggregates have their own module. Unless ``use_modules`` is off, the shape of the rules
    (``shapes.node_shape``) picks the closure (transitive,
    symmetric-transitive, linear), renaming, composition or semi-join module; a
    hyper-node with a cyclic rule worth decomposing (by the policy's ``decompositions``
    setting) gets the hypertree module. Everything else is seminaive."""
    if any(rule.aggregate() is not None for rule in node.rules):
        return AggregateModule()
    if not use_modules:
        return SeminaiveModule()
    shape = node_shape(node.rules)
    if isinstance(shape, ClosurePattern):
        if shape.kind == "transitive":
            return TransitiveClosureModule(shape.relation, shape.irreflexive)
        return SymmetricTransitiveModule(shape.relation, shape.irreflexive)
    if isinstance(shape, LinearClosurePattern):
        return LinearClosureModule(shape)
    if isinstance(shape, RenamingPattern):
        return RenamingModule()
    if isinstance(shape, CompositionPattern):
        return CompositionModule(shape)
    if isinstance(shape, SemiJoinPattern):
        return SemiJoinModule(shape)
    return _hypertree_or_seminaive(node, costs)


def _hypertree_or_seminaive(node: NodeState, costs: CostPolicy) -> Module:
    if costs.decompositions != "off":
        at_a_time = costs.decompositions_set_at_a_time
        choices = choose_decompositions(node, costs.decompositions, set_at_a_time=at_a_time)
        if any(choice.decomposed is not None for choice in choices.values()):
            return HypertreeModule(choices, costs.decompositions, at_a_time)
    return SeminaiveModule()


__all__ = [
    "AggregateModule",
    "ClosurePattern",
    "CompositionModule",
    "HypertreeModule",
    "LinearClosureModule",
    "Module",
    "NodeState",
    "RenamingModule",
    "SemiJoinModule",
    "SeminaiveModule",
    "SymmetricTransitiveModule",
    "TransitiveClosureModule",
    "choose_module",
    "detect_closure",
    "node_shape",
]
