"""Evaluation modules: each evaluates and maintains the rules of one hyper-node.

All modules share the interface of :class:`base.Module` (the modular-materialisation paper's
Add / Del / Diff / Red, starting with materialisation from scratch), so the update driver never
needs to know which algorithm a hyper-node uses. ``choose_module`` picks one by rule pattern.
"""

from .aggregate import AggregateModule
from .base import Module, NodeState
from .seminaive import SeminaiveModule


def choose_module(node: NodeState) -> Module:
    """The module for a hyper-node: aggregates have their own; everything else is seminaive."""
    if any(rule.aggregate() is not None for rule in node.rules):
        return AggregateModule()
    return SeminaiveModule()


__all__ = ["AggregateModule", "Module", "NodeState", "SeminaiveModule", "choose_module"]
