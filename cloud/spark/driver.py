"""Small hyper-nodes evaluated on the driver, by the edge engine itself, on the job's term ids.

Why: Spark charges a fixed cost per job (planning, scheduling, a checkpoint and a count per
stratum and per seminaive round). For the 30 to a few hundred turbines of one farm, most
hyper-nodes read a few thousand facts, and RS2 over DS2(10) (1,300 facts) cost 15-25 s in
local mode, almost all of it jobs that each move a handful of rows. The engine evaluates such a
hyper-node in milliseconds. So the job keeps the facts of small relations on the driver, as
sets of term-id tuples, and hands a hyper-node whose inputs are small to the engine; only what
is large goes through Spark. The result is the engine's by construction: the same rules, the
same modules, the same term dictionary (the engine shares the job's, so the numbers its binds
compute get ids in the job's dictionary directly).

A hyper-node runs here only when all it reads, and what its head relations already hold, is
at most ``local_below`` facts; and it gives up (the node then runs in Spark) as soon as it
would derive more than ``max_output`` facts, so a small input with a huge output (a join that
explodes) never fills the driver's memory.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from agent.engine.budget import Budget, BudgetExceeded
from agent.engine.language import Program
from agent.engine.program.dependency import HyperNode
from agent.engine.reasoner import Reasoner
from cloud.spark.terms import RelationKey, TermSpace

LOCAL_BELOW = 200_000  # facts a hyper-node may read (heads' facts included) to run here
MAX_OUTPUT = 2_000_000  # derived facts above which it is handed back to Spark


def inputs_of(node: HyperNode) -> frozenset[RelationKey]:
    """Every relation the hyper-node reads, and its head relations (whose facts so far, explicit
    or from earlier hyper-nodes, are part of its result)."""
    return node.reads | node.heads


def evaluate_on_driver(
    node: HyperNode,
    space: TermSpace,
    facts: Mapping[RelationKey, set[tuple[int, ...]]],
    *,
    closures: bool,
    max_output: int = MAX_OUTPUT,
) -> tuple[dict[RelationKey, set[tuple[int, ...]]], int] | None:
    """The hyper-node's head relations after it ran (all their facts) and the run-time errors
    it met, or None when it would derive more than ``max_output`` facts. ``facts`` holds every
    relation of :func:`inputs_of` (a missing one is empty); nothing in it is changed."""
    # The job's own dictionary, shared: the ids in ``facts`` are the engine's, and numbers its
    # binds and aggregates compute get their ids in the job's dictionary directly.
    reasoner = Reasoner.restore(
        terms=space.terms,
        rules=[],
        edb={key: rows for key, rows in facts.items() if rows},
        nodes={},
        modules=closures,
    )
    reasoner.budget = Budget(max_derived_facts=max_output)
    try:
        reasoner.add_rules(Program(rules=tuple(node.rules)))
    except BudgetExceeded:
        return None
    view = reasoner.view()
    heads = {key: set(view.visible(key)) for key in node.heads}
    return heads, reasoner.executor.error_count


def fits(sizes: Sequence[int], local_below: int) -> bool:
    """Whether inputs of these sizes are small enough to run on the driver."""
    return local_below > 0 and sum(sizes) <= local_below
