"""Seminaive evaluation of any hyper-node (the fallback module).

Round 0 evaluates every rule over the whole view. Each later round evaluates, for every rule and
every body atom over a relation this node derives (a recursive atom), the rule with that atom
reading only the facts that became visible in the previous round. The other atoms read the full
view, including this round's delta: an instance with two new premises is found twice, which the
output set absorbs; in exchange no "old" version of any relation must be kept.
"""

from __future__ import annotations

import time

from ..executor import Executor
from ..language import Atom
from .base import Module, NodeState


class SeminaiveModule(Module):
    name = "seminaive"

    def materialise(self, node: NodeState, executor: Executor) -> None:
        started = time.perf_counter()
        derived = {key: set() for key in node.heads}
        for rule in node.rules:
            executor.run(rule, node.view, derived[rule.head.relation])
        delta = node.absorb(derived)
        rounds = 1
        recursive = [
            (rule, position, item.relation)
            for rule in node.rules
            for position, item in enumerate(rule.body)
            if isinstance(item, Atom) and item.relation in node.heads
        ]
        while delta and recursive:
            derived = {key: set() for key in node.heads}
            for rule, position, relation in recursive:
                changed = delta.get(relation)
                if changed:
                    executor.run(rule, node.view, derived[rule.head.relation], position, changed)
            delta = node.absorb(derived)
            rounds += 1
        node.stats.update(rounds=rounds, seconds=time.perf_counter() - started)
