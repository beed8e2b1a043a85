"""Seminaive evaluation and DRed^c-style maintenance of any hyper-node (the fallback module).

Materialisation: round 0 evaluates every rule over the whole bag; each later round evaluates,
for every body atom over a relation this node derives (a recursive atom), the rule with that
atom reading only the facts that became visible in the previous round. Other atoms read the full
bag including this round's delta: an instance with two new premises is found twice, which the
output set absorbs; in exchange no "old" copy of any relation is kept.

Maintenance (modular-materialisation paper, Algorithm 3 for one module):

1. *Diff*: the heads of rule instances that used a fact that disappeared from the node's inputs
   (or that a fact added to a negated relation now blocks) are overdeletion candidates; removed
   rules contribute every head they derived.
2. *Del*: candidates are closed under the node's recursive rules (over the old state), but, as
   in DRed^c, a fact that still has a *non-recursive* derivation in the new state is neither
   deleted nor propagated. DRed^c keeps counters for that test; we evaluate the non-recursive
   rules with the head bound instead, only for the candidates (no counters to maintain during
   materialisation, where the grouped joins never enumerate single derivations).
3. *Red*: overdeleted facts with a one-step derivation from what remains are put back.
4. *Add*: rederived facts, heads of instances that use new input facts (or that a deleted fact
   of a negated relation unblocks) are inserted and closed seminaively.

When overdeletion reaches a share of the node's facts (``CostPolicy.overdeletion_recompute_share``,
costs.py), the node is recomputed instead: rederiving much of a relation is slower than deriving
it again (the strategy is reported).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from agent.engine.language import Atom, Rule
from agent.engine.modules.base import Maintained, Module, NodeState, net_changes
from agent.engine.modules.support import deltas
from agent.engine.plan.executor import Executor
from agent.engine.storage.changes import Facts, InputChanges
from agent.engine.storage.store import DataStoreBag


class SeminaiveModule(Module):
    name = "seminaive"

    # ------------------------------------------------------------------ Add
    def materialise(self, node: NodeState, executor: Executor) -> None:
        started = time.perf_counter()
        derived: Facts = {key: set() for key in node.heads}
        for rule in node.rules:
            executor.run(rule, node.bag, derived[rule.head.relation])
        rounds = self.add(node, executor, node.absorb(derived))
        node.stats.update(rounds=rounds + 1, seconds=time.perf_counter() - started)

    def add(
        self, node: NodeState, executor: Executor, delta: Facts, added: Facts | None = None
    ) -> int:
        """Close the IDB under the recursive rules, starting from the newly visible ``delta``."""
        recursive = self.recursive_positions(node)
        rounds = 0
        while delta and recursive:
            derived: Facts = {key: set() for key in node.heads}
            for rule, position, relation in recursive:
                changed = delta.get(relation)
                if changed:
                    executor.run(rule, node.bag, derived[rule.head.relation], position, changed)
            delta = node.absorb(derived, added)
            rounds += 1
        return rounds

    @staticmethod
    def recursive_positions(node: NodeState) -> list[tuple[Rule, int, tuple]]:
        return [
            (rule, position, item.relation)
            for rule in node.rules
            for position, item in enumerate(rule.body)
            if isinstance(item, Atom) and item.relation in node.heads
        ]

    def extend(self, node: NodeState, executor: Executor, new_rules: Sequence[Rule]) -> Maintained:
        """ZodiacEdge Alg. 2 continuation: the IDB is complete for the node's other rules, so
        evaluate the new rules over it and close the result seminaively."""
        added: Facts = {}
        derived: Facts = {key: set() for key in node.heads}
        for rule in new_rules:
            executor.run(rule, node.bag, derived[rule.head.relation])
        self.add(node, executor, node.absorb(derived, added), added)
        return Maintained(added=added, strategy="extend")

    # ------------------------------------------------------------------ maintenance
    def maintain(
        self,
        node: NodeState,
        executor: Executor,
        changes: InputChanges,
        removed_rules: Sequence[Rule] = (),
        old_bag: DataStoreBag | None = None,
    ) -> Maintained:
        old_facts = deltas.temporary_relations(changes.minus)
        candidates = self.diff_removed(node, executor, changes, old_facts)
        for rule in removed_rules:
            out = candidates.setdefault(rule.head.relation, set())
            deltas.removed_rule_heads(executor, rule, old_bag or node.bag, old_facts, out)
        overdeleted = self.delete(node, executor, candidates, old_facts)
        if overdeleted is None:
            return self.recompute(node, executor, "recompute")
        for key, rows in overdeleted.items():
            node.own(key).remove_all(rows)
        added: Facts = {}
        rederived = deltas.check(executor, node.rules, node.bag, overdeleted)
        delta = node.absorb(rederived, added)
        inserted = self.diff_added(node, executor, changes)
        for key, rows in node.absorb(inserted, added).items():
            delta.setdefault(key, set()).update(rows)
        self.add(node, executor, delta, added)
        return net_changes(node, overdeleted, added, "DRed^c")

    def diff_removed(
        self, node: NodeState, executor: Executor, changes: InputChanges, old_facts: dict
    ) -> Facts:
        """Heads of instances invalidated by the input change (overdeletion seeds)."""
        candidates: Facts = {key: set() for key in node.heads}
        for rule in node.rules:
            out = candidates[rule.head.relation]
            deltas.heads_removed(
                executor, rule, node.bag, old_facts, changes.minus, changes.plus, out
            )
        return candidates

    def diff_added(self, node: NodeState, executor: Executor, changes: InputChanges) -> Facts:
        """Heads of instances made applicable by the input change, over the new state."""
        derived: Facts = {key: set() for key in node.heads}
        for rule in node.rules:
            out = derived[rule.head.relation]
            deltas.heads_added(executor, rule, node.bag, changes.plus, changes.minus, out)
        return derived

    def delete(
        self, node: NodeState, executor: Executor, candidates: Facts, old_facts: dict
    ) -> Facts | None:
        """Del: the overdeleted facts, or None when so many go that recomputing is cheaper."""
        frontier = deltas.intersect(candidates, node.idb.get)
        nonrecursive = [
            rule
            for rule in node.rules
            if not any(isinstance(i, Atom) and i.relation in node.heads for i in rule.body)
        ]
        recursive = self.recursive_positions(node)
        if recursive and nonrecursive:
            frontier = self.without_nonrecursive_support(node, executor, nonrecursive, frontier)
        overdeleted: Facts = {}
        limit = self.costs.overdeletion_recompute_share * max(1, node.size())
        while frontier:
            for key, rows in frontier.items():
                overdeleted.setdefault(key, set()).update(rows)
            if recursive and deltas.total(overdeleted) > limit:
                return None
            if not recursive:
                break
            reached: Facts = {key: set() for key in node.heads}
            for rule, position, relation in recursive:
                changed = frontier.get(relation)
                if changed:
                    deltas.overdeletion_candidates(
                        executor,
                        rule,
                        rule.body,
                        node.bag,
                        old_facts,
                        position,
                        changed,
                        reached[rule.head.relation],
                        tag="rec",
                    )
            frontier = {}
            for key, rows in deltas.intersect(reached, node.idb.get).items():
                fresh = rows - overdeleted.get(key, set())
                if fresh:
                    frontier[key] = fresh
            if frontier and nonrecursive:
                frontier = self.without_nonrecursive_support(node, executor, nonrecursive, frontier)
        return overdeleted

    @staticmethod
    def without_nonrecursive_support(
        node: NodeState, executor: Executor, nonrecursive: list[Rule], facts: Facts
    ) -> Facts:
        """DRed^c's stop: drop facts that a non-recursive rule still derives (such a rule only
        reads lower hyper-nodes, which are already up to date)."""
        supported = deltas.check(executor, nonrecursive, node.bag, facts)
        kept: Facts = {}
        for key, rows in facts.items():
            rest = rows - supported.get(key, set())
            if rest:
                kept[key] = rest
        return kept

    def describe(self) -> str:
        return self.name
