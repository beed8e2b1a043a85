"""Evaluation and maintenance of an aggregate rule (a hyper-node of its own: aggregation through
recursion is refused at stratification).

Materialisation:
1. The aggregate body is compiled like any rule body, its "head" being the tuple of all body
   variables, so the output set holds exactly the distinct substitutions.
2. Substitutions are grouped by the ``on`` variables and reduced (aggregates.py).
3. The rows ``(group..., result)`` go through the rule's remaining comparisons and binds to the
   head, compiled against a temporary relation holding the rows.

Maintenance touches only the groups the change can affect: the group keys of substitutions that
use a changed fact (over the old state for deletions, the new one for insertions) are
recomputed from scratch, and a group whose row ``(group..., result)`` changed replaces its old
head facts (each group's row is kept: a group whose result stayed puts nothing through the
rule's comparisons and binds again). Which group produced which head fact is remembered, with a
count, because a head that omits a group variable can be produced by several groups (when the
head is the row itself, nothing is). An aggregate read a subject at a time (subject_groups.py)
keeps how its groups share member sets between updates (kept_groups.py), so that a reading
changed reads only the groups it reaches.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from operator import itemgetter

from agent.engine.language import Aggregate, Atom, Bind, Constant, Negation, Rule, Variable
from agent.engine.modules.base import Maintained, Module, NodeState
from agent.engine.modules.support import deltas
from agent.engine.modules.support.kept_groups import KeptPartition
from agent.engine.modules.support.subject_groups import (
    GroupReader,
    SharedSet,
    group_rows,
    subject_shape,
)
from agent.engine.plan.executor import Executor, Variant
from agent.engine.storage.changes import InputChanges
from agent.engine.storage.store import DataStoreBag, Relation

ROWS_PREDICATE = "zodiac:aggregate-rows"
GROUPS_PREDICATE = "zodiac:aggregate-groups"
# Share of the known groups above which a change recomputes the whole aggregate.
RECOMPUTE_GROUP_SHARE = 0.5


def substitution_variables(aggregate: Aggregate) -> tuple[Variable, ...]:
    """Variables bound by the aggregate body (positive atoms and binds), in a fixed order."""
    found: set[Variable] = set()
    for item in aggregate.body:
        if isinstance(item, Atom):
            found |= item.variables()
        elif isinstance(item, Bind):
            found.add(item.variable)
    return tuple(sorted(found, key=lambda v: v.name))


def heads_are_rows(rule: Rule, aggregate: Aggregate) -> bool:
    """Whether the rule's head facts are its aggregate's rows ``(group..., result)``: the
    head lists the group variables then the result, and nothing follows the aggregate."""
    rest = [item for item in rule.body if not isinstance(item, Aggregate)]
    return not rest and tuple(rule.head.terms) == (*aggregate.group_by, aggregate.result)


class AggregateModule(Module):
    name = "aggregate"

    def __init__(self) -> None:
        self.group_heads: dict[tuple, set] = {}
        self.head_groups: dict[tuple, int] = {}
        # Each group's row ``(group..., result)``: a group whose row a change leaves as it was
        # keeps its heads untouched.
        self.rows: dict[tuple, tuple] = {}
        # A subject-shaped aggregate's partition of its groups, kept between updates.
        self.kept: KeptPartition | None = None
        # The head is the row itself (``h(X, N) :- aggregate(...) on X with f(T) as N``, no
        # comparison or bind after): each group's head is its row, so no head bookkeeping
        # (``group_heads``, ``head_groups``) is kept.
        self.direct = False
        self.stale = False  # IDB loaded from saved state: groups unknown until recomputed

    def loaded_from_state(self, node: NodeState) -> None:
        """Group bookkeeping is not saved: the first change rebuilds it (`restore`), or
        recomputes the node where it cannot be read back from the IDB."""
        self.stale = True

    def restore(self, node: NodeState, executor: Executor) -> bool:
        """Rebuild the group bookkeeping of an IDB loaded from saved state, without computing
        a group: possible when the head is the row itself (each saved head fact is its group's
        row, as `materialise` stored it). A subject-shaped aggregate partitions its groups
        again, with no result known (its first read of a shared set gives every group of the
        set, which `replace_rows` compares with the saved rows). The partition is of the new
        state (this runs inside the first change, its lower stores changed already), which
        `KeptPartition.follow_a` then brings "up to date" with the change's facts of A once
        more: a set changed the same way for all its subjects is changed again to what it
        is, any other touched set is partitioned afresh, and either way every group the
        change touched is read again. Why: recomputing every group
        at the first change after a restart cost about what recomputing the program does
        (RS1's count and median over a farm's neighbourhoods). False: it cannot."""
        if len(node.rules) != 1:
            return False
        rule = node.rules[0]
        aggregate = rule.aggregate()
        if aggregate is None or not heads_are_rows(rule, aggregate):
            return False
        self._start_over()
        width = len(aggregate.group_by)
        saved = node.idb.get(rule.head.relation)
        self.rows = {row[:width]: row for row in saved} if saved is not None else {}
        self.direct = True
        self._partition(aggregate, node, executor)
        self.stale = False
        return True

    def _start_over(self) -> None:
        """Forget the group bookkeeping (before it is built again)."""
        self.group_heads.clear()
        self.head_groups.clear()
        self.kept = None

    def _partition(
        self, aggregate: Aggregate, node: NodeState, executor: Executor
    ) -> tuple[GroupReader, list[int], list[SharedSet]] | None:
        """Partition a subject-shaped aggregate's groups and keep the partition (the reader
        and the partition, to read the groups' results with); None for any other shape."""
        shape = subject_shape(aggregate)
        if shape is None:
            return None
        reader = GroupReader(shape, node.bag, executor, aggregate.function, None)
        alone, shared = reader.partition()
        self.kept = KeptPartition(shape, alone, shared)
        return reader, alone, shared

    def materialise(self, node: NodeState, executor: Executor) -> None:
        started = time.perf_counter()
        self.stale = False
        self._start_over()
        for rule in node.rules:
            aggregate = rule.aggregate()
            assert aggregate is not None
            partitioned = self._partition(aggregate, node, executor)
            if partitioned is not None:
                reader, alone, shared = partitioned
                rows = {(x, result) for x, result in reader.rows(alone, shared).items()}
            else:
                variables = substitution_variables(aggregate)
                substitutions: set[tuple[int, ...]] = set()
                executor.run(
                    rule,
                    node.bag,
                    substitutions,
                    body=aggregate.body,
                    head_terms=variables,
                    variant=Variant.AGGREGATE_BODY,
                )
                rows = self.reduce(aggregate, variables, substitutions, executor)
            width = len(aggregate.group_by)
            self.rows = {row[:width]: row for row in rows}
            self.direct = heads_are_rows(rule, aggregate)
            if self.direct:
                node.own(rule.head.relation).add_all(rows)
                continue
            heads = self.heads_by_group(rule, aggregate, rows, node, executor)
            for group, produced in heads.items():
                self.remember(group, produced)
            node.own(rule.head.relation).add_all(set(self.head_groups))
        node.stats.update(rounds=1, seconds=time.perf_counter() - started)

    def remember(self, group: tuple, heads: set) -> list:
        """Record that ``group`` produces ``heads``; returns heads no group produced before."""
        self.group_heads[group] = heads
        fresh = []
        for head in heads:
            count = self.head_groups.get(head, 0)
            if count == 0:
                fresh.append(head)
            self.head_groups[head] = count + 1
        return fresh

    def forget(self, group: tuple) -> list:
        """Drop ``group``'s heads; returns heads no other group produces."""
        gone = []
        for head in self.group_heads.pop(group, ()):
            count = self.head_groups[head] - 1
            if count == 0:
                del self.head_groups[head]
                gone.append(head)
            else:
                self.head_groups[head] = count
        return gone

    # ------------------------------------------------------------------ maintenance
    def maintain(
        self,
        node: NodeState,
        executor: Executor,
        changes: InputChanges,
        removed_rules: Sequence[Rule] = (),
        old_bag: DataStoreBag | None = None,
    ) -> Maintained:
        if self.stale and not self.restore(node, executor):
            return self.recompute(node, executor, "recompute (group state not restored)")
        rule = node.rules[0]
        aggregate = rule.aggregate()
        assert aggregate is not None
        width = len(aggregate.group_by)
        result = Maintained(strategy="groups")
        if self.kept is not None:  # (materialise keeps one for a subject-shaped aggregate)
            # The kept partition tells which groups, read set by set.
            reader = GroupReader(self.kept.shape, node.bag, executor, aggregate.function, None)
            found = self.kept.changed_rows(reader, changes)
            news = {(x,): None if row is None else (x, row) for x, row in found.items()}
            result.strategy = "groups (partition kept)"
            return self.replace_rows(rule, aggregate, node, executor, news, result)
        known = len(self.rows)
        enough = self.costs.aggregate_recompute_group_share * known
        groups = self.affected_groups(rule, aggregate, node, executor, changes)
        if not groups:
            return result
        if len(groups) > enough:
            # Evaluating the body once per touched group reads the same substitutions as the
            # full evaluation, through index probes instead of one scan: when most groups
            # are touched (a value every group reads changed), the full evaluation is the
            # cheaper way to the same rows.
            return self.recompute(
                node, executor, f"recompute ({len(groups)} of {known} groups touched)"
            )
        variables = substitution_variables(aggregate)
        group_atom = Atom(GROUPS_PREDICATE, aggregate.group_by)
        body = [group_atom, *aggregate.body]
        substitutions: set[tuple[int, ...]] = set()
        executor.run(
            rule,
            node.bag,
            substitutions,
            0,
            groups,
            body=body,
            head_terms=variables,
            sources=[[], *deltas.sources_for(aggregate.body, node.bag)],
            variant=Variant.AGGREGATE_GROUPS,
        )
        rows = self.reduce(aggregate, variables, substitutions, executor)
        news: dict[tuple, tuple | None] = dict.fromkeys(groups)
        news.update((row[:width], row) for row in rows)
        return self.replace_rows(rule, aggregate, node, executor, news, result)

    def replace_rows(
        self,
        rule: Rule,
        aggregate: Aggregate,
        node: NodeState,
        executor: Executor,
        news: dict[tuple, tuple | None],
        result: Maintained,
    ) -> Maintained:
        """Give the groups their new rows (None: no row any more): a group whose row is as it
        was keeps its heads; the others' heads are replaced, and the facts no group produces
        any more, or that no group produced before, are the node's changes."""
        rows = self.rows
        changed = {group: row for group, row in news.items() if rows.get(group) != row}
        if not changed:
            return result
        fresh = {row for row in changed.values() if row is not None}
        removed: set = set()
        if self.direct:  # (a group's head is its row)
            added = fresh
            removed.update(rows[group] for group in changed if group in rows)
        else:
            added = set()
            heads = self.heads_by_group(rule, aggregate, fresh, node, executor)
            for group in changed:
                removed.update(self.forget(group))
            for group, produced in heads.items():
                added.update(self.remember(group, produced))
        for group, row in changed.items():
            if row is None:
                del rows[group]
            else:
                rows[group] = row
        relation = node.own(rule.head.relation)
        really_removed = removed - added
        really_added = added - removed
        relation.remove_all(really_removed)
        relation.add_all(really_added)
        result.remove(rule.head.relation, really_removed)
        result.add(rule.head.relation, really_added)
        return result

    def affected_groups(
        self,
        rule: Rule,
        aggregate: Aggregate,
        node: NodeState,
        executor: Executor,
        changes: InputChanges,
    ) -> set:
        """Group keys of substitutions that use a changed fact, before or after the change."""
        old_facts = deltas.temporary_relations(changes.minus)
        groups: set = set()
        for position, item in enumerate(aggregate.body):
            if isinstance(item, Atom):
                gone = changes.minus.get(item.relation)
                new = changes.plus.get(item.relation)
            elif isinstance(item, Negation):
                gone = changes.plus.get(item.atom.relation)
                new = changes.minus.get(item.atom.relation)
            else:
                continue
            for delta, tag in ((gone, "old"), (new, "new")):
                if delta:
                    deltas.overdeletion_candidates(
                        executor,
                        rule,
                        aggregate.body,
                        node.bag,
                        old_facts if tag == "old" else {},
                        position,
                        delta,
                        groups,
                        head_terms=aggregate.group_by,
                        tag=f"agg{tag}",
                    )
        return groups

    # ------------------------------------------------------------------ shared steps
    @staticmethod
    def reduce(
        aggregate: Aggregate,
        variables: tuple[Variable, ...],
        substitutions: set[tuple[int, ...]],
        executor: Executor,
    ) -> set[tuple[int, ...]]:
        """Group the substitutions and compute one ``(group..., result)`` row per group."""
        terms = executor.terms
        group_columns = [variables.index(v) for v in aggregate.group_by]
        argument = aggregate.argument
        # The loop below runs once per substitution (RS1: 160,000 per aggregate), so it is
        # kept to C-level calls: the group key by itemgetter (a bare id for one column, a
        # tuple for several), the argument decoded by a list lookup.
        key_of = itemgetter(*group_columns) if group_columns else (lambda _s: ())
        single = len(group_columns) == 1
        groups: dict = {}
        add_to = groups.setdefault
        if isinstance(argument, Constant):
            constant = argument.value
            for substitution in substitutions:
                add_to(key_of(substitution), []).append(constant)
        else:
            column, decode = variables.index(argument), terms.values
            for substitution in substitutions:
                add_to(key_of(substitution), []).append(decode[substitution[column]])
        return group_rows(aggregate.function, groups, single, executor)

    @staticmethod
    def heads_by_group(
        rule: Rule,
        aggregate: Aggregate,
        rows: set[tuple[int, ...]],
        node: NodeState,
        executor: Executor,
    ) -> dict[tuple, set]:
        """Apply the rule's comparisons and binds to the rows; the head facts of each group."""
        width = len(aggregate.group_by)
        row_atom = Atom(ROWS_PREDICATE, aggregate.group_by + (aggregate.result,))
        post = [item for item in rule.body if not isinstance(item, (Aggregate, Atom, Negation))]
        # The head, prefixed with the group key, so each head fact can be traced to its group.
        traced = tuple(aggregate.group_by) + tuple(rule.head.terms)
        table = Relation(row_atom.relation)
        table.add_all(rows)
        out: set = set()
        executor.run(
            rule,
            node.bag,
            out,
            body=[row_atom, *post],
            head_terms=traced,
            sources=[[table]] + [[] for _ in post],
            variant=Variant.AGGREGATE_HEAD,
        )
        found: dict[tuple, set] = {}
        for fact in out:
            found.setdefault(fact[:width], set()).add(fact[width:])
        return found
