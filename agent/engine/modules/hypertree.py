"""The hypertree-decomposition module: a hyper-node some of whose rules are evaluated through
decompositions (``decomposed.py``), the others by ordinary plans, maintained with DRed as the
backbone (the paper's Algorithm 2, for one module of the modular framework).

Which rules are decomposed is decided per rule when the module is built (``choose_decompositions``):
a rule whose body is cyclic gets its cheapest decomposition (``decomposition.decompose``) when that
is estimated cheaper than the rule's join plan, from the sizes and distinct values of the facts
its atoms read now (a relation the hyper-node derives counts as large as the largest other
relation the rule reads: it is usually empty when the choice is made). The policy's
``decompositions`` setting may instead decompose every cyclic rule (``"always"``) or none.

Every rule, decomposed or not, offers the same four operations, so the backbone does not care
which is which:

* ``materialise``: everything it derives from the current state;
* ``add`` (``Add^r``): the heads of instances using a new fact;
* ``delete`` (``Del^r``): the heads of old instances using a deleted fact;
* ``rederive`` (``Red^r``): which overdeleted facts it still derives.

Maintenance: overdelete (the heads of instances using a lost input fact or a fact added to a
negated relation, closed under the node's recursive rules over the old state), rederive, then
insert (what new input facts and rederived facts derive, closed seminaively). When the
overdeletion reaches the policy's share of the node, the node is recomputed instead.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from agent.engine.language import Atom, Rule
from agent.engine.modules.base import Maintained, Module, NodeState, by_column, net_changes
from agent.engine.modules.support import deltas
from agent.engine.modules.support.decomposed import DecomposedRule
from agent.engine.modules.support.eliminated import (
    EliminatedRule,
    elimination_applies,
    elimination_cost,
)
from agent.engine.plan.decomposition import AtomStats, decompose, is_cyclic_rule, seminaive_cost
from agent.engine.plan.executor import Executor
from agent.engine.storage.changes import Facts, InputChanges
from agent.engine.storage.store import DataStoreBag, Relation, RelationKey


class PlannedRule:
    """A rule evaluated by its compiled join plans (what seminaive does for every rule)."""

    def __init__(self, rule: Rule) -> None:
        self.rule = rule

    def materialise(self, executor: Executor, bag: DataStoreBag) -> set[tuple]:
        found: set[tuple] = set()
        executor.run(self.rule, bag, found)
        return found

    everything = materialise

    def add(
        self, executor: Executor, bag: DataStoreBag, plus: Facts, unblocked: Facts
    ) -> set[tuple]:
        return deltas.heads_added(executor, self.rule, bag, plus, unblocked)

    def delete(
        self,
        executor: Executor,
        bag: DataStoreBag,
        old: dict[RelationKey, Relation],
        minus: Facts,
        blocked: Facts,
    ) -> set[tuple]:
        return deltas.heads_removed(executor, self.rule, bag, old, minus, blocked)

    def rederive(
        self, executor: Executor, bag: DataStoreBag, overdeleted: set[tuple]
    ) -> set[tuple]:
        if not overdeleted:
            return set()
        key = self.rule.head.relation
        return deltas.check(executor, [self.rule], bag, {key: overdeleted}).get(key, set())


RuleEvaluator = PlannedRule | DecomposedRule | EliminatedRule


@dataclass(frozen=True)
class Choice:
    """How one rule is evaluated, and why (shown in ``stats()`` and ``explain``)."""

    rule: Rule
    decomposed: DecomposedRule | EliminatedRule | None
    cyclic: bool
    plan_cost: float
    decomposition_cost: float | None
    seconds: float

    def describe(self) -> dict:
        found: dict = {
            "evaluation": "decomposition" if self.decomposed else "plan",
            "cyclic": self.cyclic,
            "plan_cost": round(self.plan_cost, 1),
            "decomposition_seconds": round(self.seconds, 6),
        }
        if self.decomposition_cost is not None:
            found["decomposition_cost"] = round(self.decomposition_cost, 1)
        if self.decomposed is not None:
            found["decomposition"] = self.decomposed.decomposition.describe(self.rule)
            found["set_at_a_time"] = isinstance(self.decomposed, EliminatedRule)
        return found


def choose_decompositions(
    node: NodeState, mode: str, rules: Sequence[Rule] | None = None, set_at_a_time: bool = True
) -> dict[str, Choice]:
    """Per rule of the node (or of ``rules``), by content key: decomposed or planned (see the
    module docstring). ``mode``: "auto", "always" or "off". ``set_at_a_time``: a rule that
    variable elimination over bitmaps evaluates (``support/eliminated.py``) is decomposed so,
    else through a tree of nodes like any other."""
    choices: dict[str, Choice] = {}
    for rule in node.rules if rules is None else rules:
        cyclic = mode != "off" and is_cyclic_rule(rule)
        if not cyclic:
            choices[rule.key] = Choice(rule, None, False, 0.0, None, 0.0)
            continue
        stats = atom_stats(rule, node)
        plan_cost = seminaive_cost(rule, stats)
        started = time.perf_counter()  # the search alone (the statistics are read above)
        if set_at_a_time and elimination_applies(rule):
            # the plan priced with skew-aware distinct counts (see relation_stats): the
            # textbook estimate assumes uniform values, and hubs make a cyclic join's
            # prefixes far larger than that
            plan_cost = seminaive_cost(rule, atom_stats(rule, node, skewed=True))
            cost = elimination_cost(rule, stats)
            use = mode == "always" or cost < plan_cost
            seconds = time.perf_counter() - started
            evaluator = EliminatedRule(rule) if use else None
            choices[rule.key] = Choice(rule, evaluator, True, plan_cost, cost, seconds)
            continue
        decomposition = decompose(rule, stats)
        seconds = time.perf_counter() - started
        cost = decomposition.cost if decomposition is not None else None
        use = decomposition is not None and (mode == "always" or decomposition.cost < plan_cost)
        decomposed = DecomposedRule(rule, decomposition) if use else None
        choices[rule.key] = Choice(rule, decomposed, True, plan_cost, cost, seconds)
    return choices


def atom_stats(rule: Rule, node: NodeState, skewed: bool = False) -> dict[int, AtomStats]:
    """Sizes and distinct values per column of the facts each positive atom reads (with
    ``skewed``, effective distinct values: see ``relation_stats``)."""
    found: dict[int, AtomStats] = {}
    fallback = 1
    for position, item in enumerate(rule.body):
        if isinstance(item, Atom) and item.relation not in node.heads:
            relations = node.bag.relations(item.relation)
            found[position] = relation_stats(relations, item.arity, skewed)
            fallback = max(fallback, found[position].size)
    for position, item in enumerate(rule.body):
        if isinstance(item, Atom) and item.relation in node.heads:
            stats = relation_stats(node.bag.relations(item.relation), item.arity, skewed)
            if stats.size < fallback:  # still empty (or small) before it is materialised
                share = max(1, fallback)
                stats = AtomStats(share, tuple(max(d, share // 10) for d in stats.distinct))
            found[position] = stats
    return found


def relation_stats(relations: Sequence[Relation], arity: int, skewed: bool = False) -> AtomStats:
    """``skewed``: a binary relation's column counts ``size² / Σ degree²`` values (its
    effective number: the distinct count when every value has the same degree, far fewer when
    a few hubs hold most facts), so that the textbook estimate of a join through it is the
    expected one when the joined relations share their hubs, as the labels of a knowledge
    graph do."""
    size = sum(len(r) for r in relations)
    distinct = []
    for column in range(arity):
        values = 0
        for relation in relations:
            if not len(relation):
                continue
            if relation.arity == 2 and skewed:
                index = by_column(relation, column)
                squares = sum(len(bucket) ** 2 for bucket in index.values())
                values += round(len(relation) ** 2 / max(1, squares))
            elif relation.arity == 2:
                values += len(by_column(relation, column))
            else:
                existing = relation.existing_index((column,))
                values += (
                    len(existing)
                    if existing is not None
                    else len({row[column] for row in relation})
                )
        distinct.append(max(1, min(values, size)))
    return AtomStats(size, tuple(distinct))


class HypertreeModule(Module):
    name = "hypertree"

    def __init__(
        self, choices: dict[str, Choice], mode: str = "auto", set_at_a_time: bool = True
    ) -> None:
        self.choices = choices
        self.mode = mode
        self.set_at_a_time = set_at_a_time
        # Set by materialise: the decomposed rules' instantiations describe the node's
        # current state. A module built for a node whose IDB it did not compute (a merged
        # hyper-node, a state restored from SQLite) recomputes at its first update.
        self.ready = False

    # ------------------------------------------------------------------ helpers
    def evaluators(self, node: NodeState) -> list[tuple[Rule, RuleEvaluator]]:
        found: list[tuple[Rule, RuleEvaluator]] = []
        for rule in node.rules:
            choice = self.choices.get(rule.key)
            if choice is None:  # a rule added by extend without a choice yet
                chosen = choose_decompositions(node, self.mode, [rule], self.set_at_a_time)
                choice = self.choices[rule.key] = chosen[rule.key]
            if isinstance(choice.decomposed, EliminatedRule):
                choice.decomposed.growth = self.costs.elimination_recompute_growth
            found.append((rule, choice.decomposed or PlannedRule(rule)))
        return found

    @staticmethod
    def recursive(node: NodeState, rule: Rule) -> bool:
        return any(isinstance(i, Atom) and i.relation in node.heads for i in rule.body)

    def decomposed(self) -> list[DecomposedRule]:
        return [c.decomposed for c in self.choices.values() if c.decomposed is not None]

    # ------------------------------------------------------------------ Add
    def materialise(self, node: NodeState, executor: Executor) -> None:
        started = time.perf_counter()
        derived: Facts = {key: set() for key in node.heads}
        for rule, evaluator in self.evaluators(node):
            derived[rule.head.relation] |= evaluator.materialise(executor, node.bag)
        rounds = self.close(node, executor, node.absorb(derived))
        self.ready = True
        node.stats.update(
            rounds=rounds + 1, seconds=time.perf_counter() - started, **self.describe_stats()
        )

    def close(
        self, node: NodeState, executor: Executor, delta: Facts, added: Facts | None = None
    ) -> int:
        """Seminaive closure under the node's recursive rules from the newly visible
        ``delta``; returns the number of rounds."""
        recursive = [(r, e) for r, e in self.evaluators(node) if self.recursive(node, r)]
        rounds = 0
        while delta and recursive:
            derived: Facts = {key: set() for key in node.heads}
            for rule, evaluator in recursive:
                derived[rule.head.relation] |= evaluator.add(executor, node.bag, delta, {})
            delta = node.absorb(derived, added)
            rounds += 1
        return rounds

    def extend(self, node: NodeState, executor: Executor, new_rules: Sequence[Rule]) -> Maintained:
        if not self.ready:
            return self.recompute(node, executor, "recompute (no decomposition state)")
        added: Facts = {}
        derived: Facts = {key: set() for key in node.heads}
        new = {rule.key for rule in new_rules}
        for rule, evaluator in self.evaluators(node):
            if rule.key in new:
                derived[rule.head.relation] |= evaluator.materialise(executor, node.bag)
        self.close(node, executor, node.absorb(derived, added), added)
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
        if not self.ready:
            return self.recompute(node, executor, "recompute (no decomposition state)")
        # (facts added to a relation a rule negates block instances, deleted ones enable
        # them: the rules read ``plus`` and ``minus`` at their negated atoms as such)
        old = deltas.temporary_relations(changes.minus)
        evaluators = self.evaluators(node)

        # Overdelete
        candidates: Facts = {key: set() for key in node.heads}
        for rule, evaluator in evaluators:
            candidates[rule.head.relation] |= evaluator.delete(
                executor, node.bag, old, changes.minus, changes.plus
            )
        for rule in removed_rules:
            candidates.setdefault(rule.head.relation, set()).update(
                self.removed(rule, executor, old_bag or node.bag, old)
            )
        overdeleted = self.overdelete(node, executor, evaluators, candidates, old)
        if overdeleted is None:
            return self.recompute(node, executor, "recompute")
        for key, rows in overdeleted.items():
            node.own(key).remove_all(rows)

        # Rederive
        rederived: Facts = {key: set() for key in node.heads}
        for rule, evaluator in evaluators:
            lost = overdeleted.get(rule.head.relation, set())
            rederived[rule.head.relation] |= evaluator.rederive(executor, node.bag, lost)
        added: Facts = {}
        delta = node.absorb(rederived, added)

        # Add
        inserted: Facts = {key: set() for key in node.heads}
        for rule, evaluator in evaluators:
            inserted[rule.head.relation] |= evaluator.add(
                executor, node.bag, changes.plus, changes.minus
            )
        for key, rows in node.absorb(inserted, added).items():
            delta.setdefault(key, set()).update(rows)
        self.close(node, executor, delta, added)
        return net_changes(node, overdeleted, added, "DRed (hypertree)")

    def removed(
        self,
        rule: Rule,
        executor: Executor,
        bag: DataStoreBag,
        old: dict[RelationKey, Relation],
    ) -> set[tuple]:
        """Everything a deleted rule derived over the old state; its decomposition is dropped."""
        choice = self.choices.pop(rule.key, None)
        if choice is not None and choice.decomposed is not None:
            executor.forget(choice.decomposed.rule_keys)
            return choice.decomposed.everything(executor, bag)
        return deltas.removed_rule_heads(executor, rule, bag, old)

    def overdelete(
        self,
        node: NodeState,
        executor: Executor,
        evaluators: list[tuple[Rule, RuleEvaluator]],
        candidates: Facts,
        old: dict[RelationKey, Relation],
    ) -> Facts | None:
        """DRed's overdeletion closed under the recursive rules over the old state, or None
        when it reaches the policy's share of the node (recompute instead)."""
        recursive = [(r, e) for r, e in evaluators if self.recursive(node, r)]
        frontier = deltas.intersect(candidates, node.idb.get)
        overdeleted: Facts = {}
        limit = self.costs.overdeletion_recompute_share * max(1, node.size())
        while frontier:
            for key, rows in frontier.items():
                overdeleted.setdefault(key, set()).update(rows)
            if recursive and deltas.total(overdeleted) > limit:
                return None
            reached: Facts = {key: set() for key in node.heads}
            for rule, evaluator in recursive:
                reached[rule.head.relation] |= evaluator.delete(
                    executor, node.bag, old, frontier, {}
                )
            frontier = {}
            for key, rows in deltas.intersect(reached, node.idb.get).items():
                fresh = rows - overdeleted.get(key, set())
                if fresh:
                    frontier[key] = fresh
        return overdeleted

    def rematerialise(self, node: NodeState, executor: Executor) -> dict:
        self.forget_plans(executor)
        return super().rematerialise(node, executor)

    def forget_plans(self, executor: Executor) -> None:
        for decomposed in self.decomposed():
            executor.forget(decomposed.rule_keys)

    def loaded_from_state(self, node: NodeState) -> None:
        """The IDB was loaded from saved state: the instantiations are computed on the first
        update (materialise recomputes them with the IDB)."""
        self.ready = False

    # ------------------------------------------------------------------ reporting
    def describe_stats(self) -> dict:
        decomposed = self.decomposed()
        return {
            "decomposed_rules": len(decomposed),
            "instantiations": sum(d.size() for d in decomposed),
            "decomposition_seconds": round(sum(c.seconds for c in self.choices.values()), 6),
            "rules_evaluated": {c.rule.id: c.describe() for c in self.choices.values()},
        }

    def describe_rule(self, rule: Rule) -> str | None:
        choice = self.choices.get(rule.key)
        if choice is None or choice.decomposed is None:
            return None
        cost = f"{choice.decomposition_cost:.3g}" if choice.decomposition_cost else "?"
        if isinstance(choice.decomposed, EliminatedRule):
            return (
                f"through a hypertree decomposition, set at a time (estimated cost "
                f"{cost}, its join plan's {choice.plan_cost:.3g} with skew-aware counts): "
                f"{choice.decomposed.decomposition.describe(rule)}"
            )
        return (
            f"through a hypertree decomposition (estimated cost {cost}, its join plan's "
            f"{choice.plan_cost:.3g}; found in {choice.seconds * 1000:.1f} ms), nodes "
            f"p0, p1, ... each compiled as a rule, then the join's binds and comparisons:\n"
            + choice.decomposed.decomposition.describe(rule)
        )

    def plan_keys(self, rule: Rule) -> set[str]:
        choice = self.choices.get(rule.key)
        if choice is None or choice.decomposed is None:
            return {rule.key}
        return choice.decomposed.rule_keys

    def describe(self) -> str:
        decomposed = len(self.decomposed())
        return f"{self.name} ({decomposed} of {len(self.choices)} rules decomposed)"
