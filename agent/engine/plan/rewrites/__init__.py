"""Rewrites: each recognises one shape of logical plan that has a faster physical form, and
returns a node saying so (one module per shape, with the plan before and after in its
docstring). :func:`choose_shape` tries them in order; the compiler emits code for the node it gets.

Order matters: an empty relation ends everything; projections and key filters need no loop at
all; an existence check stops at the first match; a grouped join is a product that also groups
its first scan; a product is nested loops whose innermost atom is a set operation.
"""

from __future__ import annotations

from collections.abc import Callable

from agent.engine.plan.planner import Plan
from agent.engine.plan.rewrites.base import Context, Empty, NestedLoops, Node, Shape, empty
from agent.engine.plan.rewrites.exists import ExistsSplit, exists_split
from agent.engine.plan.rewrites.grouped import GroupedJoin, grouped_join
from agent.engine.plan.rewrites.key_filter import KeyFilter, key_filter
from agent.engine.plan.rewrites.product import Product, product
from agent.engine.plan.rewrites.projection import Projection, projection

Rewrite = Callable[[Plan, Context], Node | None]

REWRITES: tuple[Rewrite, ...] = (empty, projection, key_filter, exists_split, grouped_join, product)


def choose_shape(plan: Plan, context: Context) -> Node:
    """The first rewrite that claims ``plan``, or plain nested loops."""
    for rewrite in REWRITES:
        node = rewrite(plan, context)
        if node is not None:
            return node
    return NestedLoops(plan)


__all__ = [
    "REWRITES",
    "Context",
    "Empty",
    "ExistsSplit",
    "GroupedJoin",
    "NestedLoops",
    "Node",
    "Product",
    "Projection",
    "KeyFilter",
    "Shape",
    "choose_shape",
]
