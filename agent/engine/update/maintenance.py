"""The update driver: applies a change of rules and facts to a materialised program.

One call handles any mix of rule insertions, rule deletions, fact insertions and fact deletions
as a single change (a rule bundle carries all four):

1. The explicit facts change (deletions first): ``apply_edb``.
2. The new hyper-node graph is compared with the old one (``transitions.classify``: kept,
   reduced, merged, split, new; old hyper-nodes no new one takes its IDB from are dropped
   without reasoning). When no rule changed, or only sink rules were added or removed (a
   graph changed in place, ``HyperGraph.kept_from_previous``), there is nothing to compare:
   the old hyper-nodes are kept as they are, sinks dropped or added (``sinks_changed``), so
   the everyday updates (a reading, a diagnosis rule) take no step per hyper-node.
3. The execution plan is the directly impacted hyper-nodes (every one not kept, plus those
   reading changed explicit facts or a dropped node's relations) and everything reachable from
   them, in topological order (ZodiacEdge Alg. 4).
4. Each hyper-node in the plan is computed afresh, merged and extended, or maintained in place
   by its module from the *visible* difference of what it reads (``changes.py``), unless the
   cost estimates (``estimates.py``) say recomputing is cheaper.

An update abandoned half way (over its budget, or failing) is rolled back (``rollback``).
Every hyper-node's transition, strategy, counts and time are in ``Reasoner.stats()``.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from agent.engine.costs import DEFAULT_COSTS, CostPolicy
from agent.engine.language import Rule
from agent.engine.modules import Module, NodeState, choose_module
from agent.engine.modules.base import Maintained, by_subject_of, by_subject_storage
from agent.engine.modules.support.subject_changes import SubjectChanges
from agent.engine.plan.executor import Executor
from agent.engine.program.dependency import HyperGraph, HyperNode, execution_plan
from agent.engine.program.validation import check_saved_rule
from agent.engine.storage.changes import ChangeLog, InputChanges, Journal, NodeJournal, StoreChanges
from agent.engine.storage.changes import visible_difference as union_difference
from agent.engine.storage.store import DataStore, DataStoreBag, Relation, RelationKey
from agent.engine.storage.subject_facts import as_bitmap
from agent.engine.update.estimates import (
    merge_recompute_reason,
    recompute_reason,
    surely_large_deletion,
)
from agent.engine.update.transitions import KEPT, MERGED, NEW, REDUCED, Transition, classify


def new_node_state(
    name: str,
    logical: HyperNode,
    idb: DataStore,
    edb: DataStore,
    predecessors: list[DataStore],
    module: Module | None,
    use_modules: bool,
    costs: CostPolicy = DEFAULT_COSTS,
) -> NodeState:
    """A hyper-node's run-time state: its IDB with a relation per head, its bag (EDB,
    predecessors' IDBs, own IDB) and its module (``module``, or one chosen by pattern)."""
    logical.name = name
    for key in logical.heads:
        idb.relation(key)
    for rule in logical.rules:
        for key, _ in rule.body_relations():
            edb.relation(key)
    bag = DataStoreBag([edb, *predecessors, idb])
    node = NodeState(name, logical, idb, bag)
    node.module = module if module is not None else choose_module(node, use_modules, costs)
    return node


def reusable(old: NodeState | None, logical: HyperNode, lower: list[DataStore]) -> bool:
    """Whether a kept hyper-node's state can serve as it is: the same logical node (a graph
    changed in place keeps its objects, see ``dependency.changed_hyper_graph``) over the same
    stores below. Then making it again (a bag, the relations it reads) is skipped, which is
    most of what a leaf rule's update costs beside the rule itself; its bag forgets the
    relations it found before, as a new one would."""
    if old is None or old.logical is not logical:
        return False
    stores = old.bag.stores
    if len(stores) != len(lower) + 1 or stores[-1] is not old.idb:
        return False
    if any(mine is not theirs for mine, theirs in zip(stores, lower, strict=False)):
        return False
    old.bag.refresh()
    return True


class UpdateDriver:
    """Carries one update from the old program state to the new one (see module docstring)."""

    def __init__(
        self,
        edb: DataStore,
        executor: Executor,
        old_nodes: list[NodeState],
        graph: HyperGraph,
        names: dict[frozenset[str], str],
        progress=None,
        use_modules: bool = True,
        costs: CostPolicy = DEFAULT_COSTS,
        old_graph: HyperGraph | None = None,
    ) -> None:
        self.use_modules = use_modules
        # The graph of ``old_nodes`` (they are its nodes, in its order), when known: a new
        # ``graph`` that is the same (no rule changed) or changed from it by sinks alone is
        # walked without a step per hyper-node (see ``run``).
        matches = old_graph is not None and len(old_graph.nodes) == len(old_nodes)
        self.old_graph = old_graph if matches else None
        self.costs = costs
        self.progress = progress
        self.edb = edb
        self.executor = executor
        self.old_nodes = old_nodes
        self.graph = graph
        self.names = names
        self.names_before = dict(names)
        self.log = ChangeLog()
        self.report: dict = {"hyper_nodes": {}}
        self.nodes: list[NodeState] = []  # the new hyper-nodes, once built
        self.dropped: list[NodeState] = []  # old hyper-nodes no new one reuses
        # Old hyper-nodes whose IDB this update changes in place (kept, reduced, extended):
        # what `rollback` must compute again when the update is abandoned.
        self.touched: list[NodeState] = []
        self.previous: dict[str, str] = {}  # new name -> old name, for reused IDBs
        self.plan: list[int] = []  # the hyper-nodes walked, by index in ``nodes``

    def name_of(self, logical: HyperNode) -> str:
        """A hyper-node's stable name: one per set of rule keys, for ever (``hn<n>``)."""
        name = self.names.get(logical.rule_keys)
        if name is None:
            number = len(self.names) + 1
            taken = set(self.names.values())  # a restored reasoner's names may have gaps
            while f"hn{number}" in taken:
                number += 1
            name = self.names[logical.rule_keys] = f"hn{number}"
        logical.name = name
        return name

    def journal(self) -> Journal:
        """The update's changes by hyper-node name (see :class:`changes.Journal`): the
        hyper-nodes it walked (any other one is as it was)."""
        walked = [self.nodes[i] for i in self.plan]
        nodes = {
            node.name: NodeJournal(
                created=node.idb in self.log.created,
                changes=self.log.of(node.idb) or StoreChanges(),
                previous=self.previous.get(node.name),
            )
            for node in walked
        }
        return Journal(
            edb=self.log.of(self.edb) or StoreChanges(),
            nodes=nodes,
            dropped=[node.name for node in self.dropped],
        )

    # ------------------------------------------------------------------ facts
    def apply_edb(
        self, added: dict[RelationKey, list], removed: dict[RelationKey, list]
    ) -> tuple[int, int]:
        """Explicit facts: deletions first, then insertions, i.e. (E minus E-) plus E+."""
        changes = StoreChanges()
        for key, rows in removed.items():
            relation = self.edb.get(key)
            if relation is not None:
                changes.remove(key, relation.remove_all(rows))
        for key, rows in added.items():
            new = self.edb.relation(key).add_all(rows)
            back = changes.removed.get(key)
            if back:
                again = back & new
                back -= again
                new -= again
            changes.add(key, new)
        self.log.record(self.edb, changes)
        return changes.counts()

    # ------------------------------------------------------------------ the walk
    def run(self, deleted: dict[str, Rule], extend_merges: bool) -> list[NodeState]:
        """Walk the plan. ``deleted``: the deleted rules by content key; ``extend_merges`` (a
        pure rule insertion) lets merged hyper-nodes start from their parts' IDBs instead of
        being recomputed."""
        started = time.perf_counter()
        self.drop_indexes_read_by(deleted.values())
        kept = self.kept_from_old_graph()
        if kept is not None:
            transitions, plan = self.sinks_changed(kept)
            nodes = self.nodes
        else:
            transitions = classify(self.old_nodes, self.graph, set(deleted))
            if extend_merges:
                self.weigh_merges(transitions)
            nodes = self.nodes = self.build_nodes(transitions, extend_merges)
            reused = {node.idb for node in nodes}
            self.dropped = [n for n in self.old_nodes if n.idb not in reused]
            self.log.dropped.update(node.idb for node in self.dropped)
            plan = execution_plan(self.graph, self.impacted(transitions, nodes))
        self.report["dropped"] = [n.name for n in self.dropped]
        self.report["directly_impacted"] = sorted(
            nodes[i].name for i in plan if transitions[i].kind != KEPT
        )
        self.report["plan"] = [nodes[i].name for i in plan]
        self.plan = plan
        for index in plan:  # before any hyper-node changes: a rollback recomputes them
            for rule in nodes[index].logical.rules:
                if rule.unverified:
                    check_saved_rule(rule)
        old_bags = {id(s): s.bag for i in plan for s in transitions[i].sources}
        guard = self.executor.guard
        for done, index in enumerate(plan, start=1):
            if self.progress:
                self.progress(nodes[index].name, done, len(plan))
            transition = transitions[index]
            if transition.reuses_idb(extend_merges):
                self.touched += [s for s in transition.sources if s not in self.touched]
            guard.check()
            guard.current = nodes[index]  # (facts in flight are its: budget.FactLimit)
            self.update_node(nodes[index], transition, old_bags, extend_merges)
            guard.current = None
            guard.check()
        self.report["seconds"] = time.perf_counter() - started
        return nodes

    def kept_from_old_graph(self) -> int | None:
        """How many of the old hyper-nodes the new graph keeps as they are, first in its
        order, when the rest of both are sinks (no rule changed: all of them; sink rules
        added or removed, `dependency.changed_hyper_graph`); None: the graphs must be
        compared (`classify`)."""
        if self.old_graph is None:
            return None
        if self.graph is self.old_graph:
            return len(self.old_nodes)
        return self.graph.kept_from_previous

    def sinks_changed(self, kept: int) -> tuple[dict[int, Transition], list[int]]:
        """The walk of an update whose new graph keeps the first ``kept`` old hyper-nodes as
        they are: the old ones after them were sinks, dropped with their IDBs; the new ones
        after them are sinks, materialised. The plan is the new sinks, the readers of the
        explicit facts that changed (`HyperGraph.readers`) and everything reachable from
        them. Why not `classify` and `build_nodes`: each takes a step per hyper-node, which in
        a program of thousands of rules cost a sensor reading, or a diagnosis rule arriving,
        many times what evaluating it does. Returns the plan's transitions and the plan."""
        graph = self.graph
        unchanged = kept == len(self.old_nodes) == len(graph.nodes)
        nodes = self.nodes = self.old_nodes if unchanged else self.old_nodes[:kept]
        self.dropped = self.old_nodes[kept:]
        self.log.dropped.update(node.idb for node in self.dropped)
        transitions: dict[int, Transition] = {}
        for index in range(kept, len(graph.nodes)):
            logical = graph.nodes[index]
            name = self.name_of(logical)
            idb = DataStore(name)
            self.log.created.add(idb)
            predecessors = [nodes[i].idb for i in graph.predecessors(index)]
            nodes.append(
                new_node_state(
                    name, logical, idb, self.edb, predecessors, None, self.use_modules, self.costs
                )
            )
            transitions[index] = Transition(NEW, logical, [], list(logical.rules))
        impacted = set(transitions)
        changed = self.edb_changed()  # (a dropped sink's relations: read by no one)
        if changed:
            readers = graph.readers
            impacted |= {i for key in changed for i in readers.get(key, ())}
        plan = execution_plan(graph, impacted)
        for index in plan:
            if index not in transitions:
                node = nodes[index]
                node.bag.refresh()  # (as a reused node's, see ``reusable``)
                transitions[index] = Transition(KEPT, node.logical, [node])
        return transitions, plan

    def edb_changed(self) -> set[RelationKey]:
        """The explicit relations this update changed."""
        edb = self.log.of(self.edb)
        if edb is None:
            return set()
        return {k for k, rows in edb.added.items() if rows} | {
            k for k, rows in edb.removed.items() if rows
        }

    def impacted(self, transitions: list[Transition], nodes: list[NodeState]) -> set[int]:
        """The directly impacted hyper-nodes: every one not kept, and those reading explicit
        facts that changed or relations a dropped hyper-node derived."""
        impacted = {i for i, t in enumerate(transitions) if t.kind != KEPT}
        changed = self.edb_changed() | {k for n in self.dropped for k in n.heads}
        impacted |= {i for i, node in enumerate(nodes) if node.logical.reads & changed}
        return impacted

    def weigh_merges(self, transitions: list[Transition]) -> None:
        """Decide, per merged hyper-node of a pure rule insertion, whether extending its
        parts' IDBs (Alg. 2) or computing it afresh is cheaper (``merge_recompute_reason``):
        a rule closing a cycle through copies of many facts derives more than the parts hold,
        and extending pays per new fact what computing afresh pays per fact in C."""
        stores = [self.edb, *(node.idb for node in self.old_nodes)]

        def size_of(key: RelationKey) -> int:
            return sum(len(store.relations[key]) for store in stores if key in store.relations)

        for transition in transitions:
            if transition.kind == MERGED:
                reason = merge_recompute_reason(self.costs, transition, size_of)
                transition.recompute = reason or ""

    def build_nodes(self, transitions: list[Transition], extend_merges: bool) -> list[NodeState]:
        nodes: list[NodeState] = []
        for index, transition in enumerate(transitions):
            logical = transition.logical
            name = self.name_of(logical)
            module = None
            if transition.kind in (KEPT, REDUCED):
                source = transition.sources[0]
                idb, module = source.idb, source.module
            elif transition.extends(extend_merges):
                # Alg. 2: the merged hyper-node starts from its parts' IDBs; the largest one is
                # reused and the others are added to it.
                source = max(transition.sources, key=lambda s: s.size())
                transition.sources.sort(key=lambda s: s is not source)
                idb = source.idb
            else:
                source, idb = None, DataStore(name)
                self.log.created.add(idb)
            if source is not None:
                idb.name = name
                if source.name != name:
                    self.previous[name] = source.name
            predecessors = [nodes[i].idb for i in self.graph.predecessors(index)]
            if transition.kind == KEPT and reusable(source, logical, [self.edb, *predecessors]):
                nodes.append(source)  # type: ignore[arg-type]
                continue
            node = new_node_state(
                name,
                logical,
                idb,
                self.edb,
                predecessors,
                module if transition.kind == KEPT else None,
                self.use_modules,
                self.costs,
            )
            if transition.kind == REDUCED:
                if type(module) is type(node.module):
                    node.module = module
                else:
                    # e.g. the symmetric rule of a symmetric-transitive closure was deleted:
                    # the remaining transitive rule gets its own module, computed afresh.
                    transition.module_changed = True
            if transition.kind == KEPT:
                node.stats = transition.sources[0].stats
            nodes.append(node)
        return nodes

    # ------------------------------------------------------------------ one hyper-node
    def update_node(
        self,
        node: NodeState,
        transition: Transition,
        old_bags: dict[int, DataStoreBag],
        extend_merges: bool,
    ) -> None:
        started = time.perf_counter()
        if transition.computed_afresh(extend_merges):
            strategy = "materialise" if transition.kind == NEW else "recompute"
            if transition.recompute:
                strategy = f"recompute ({transition.recompute})"
            changes = self.compute_afresh(node)
            added, removed = node.idb.size(), 0
        else:
            if transition.kind == MERGED:
                changes = self.merge_and_extend(node, transition, old_bags)
            else:
                changes = self.maintain_in_place(node, transition, old_bags)
                if changes is None:  # kept, and nothing it reads changed
                    return
            strategy = changes.strategy
            added, removed = changes.counts()
        self.log.record(node.idb, changes)
        self.report["hyper_nodes"][node.name] = {
            "transition": transition.kind.value,
            "strategy": strategy,
            "module": node.module.describe() if node.module else "",
            "added": added,
            "removed": removed,
            "seconds": time.perf_counter() - started,
        }

    def compute_afresh(self, node: NodeState) -> StoreChanges:
        """A new IDB computed from nothing. A created store is read as wholly new by the
        hyper-nodes above (``ChangeLog.created``): no copy of its facts is logged."""
        node.idb.clear()
        node.module.materialise(node, self.executor)  # type: ignore[union-attr]
        return StoreChanges()

    def merge_and_extend(
        self, node: NodeState, transition: Transition, old_bags: dict[int, DataStoreBag]
    ) -> Maintained:
        """Alg. 2: the other parts' IDBs are added to the largest one's; the parts were
        complete for their old inputs, which may have changed in this very update (a new rule
        upstream): maintain first, then extend by the new rules."""
        module: Module = node.module  # type: ignore[assignment]
        changes = Maintained(strategy="merge + extend")
        for source in transition.sources[1:]:
            for key, relation in source.idb.relations.items():
                copy_into(node.own(key), key, relation, changes)
        own = {source.idb for source in transition.sources}
        old_lower = list(
            dict.fromkeys(
                store
                for source in transition.sources
                for store in old_bags[id(source)].stores
                if store not in own
            )
        )
        inputs = self.inputs(node, old_lower, node.lower_stores())
        if inputs:
            changes.merge(module.maintain(node, self.executor, inputs))
        changes.merge(module.extend(node, self.executor, transition.new_rules))
        return changes

    def maintain_in_place(
        self, node: NodeState, transition: Transition, old_bags: dict[int, DataStoreBag]
    ) -> Maintained | None:
        """A kept or reduced hyper-node: its module maintains it from the visible difference
        of what it reads, unless the estimates call for recomputing. None: kept, and nothing
        it reads changed."""
        module: Module = node.module  # type: ignore[assignment]
        source = transition.sources[0] if transition.sources else None
        old_bag = old_bags.get(id(source)) if source is not None else None
        new_lower = node.lower_stores()
        old_lower = (
            [s for s in old_bag.stores if s is not source.idb]  # type: ignore[union-attr]
            if old_bag is not None
            else new_lower
        )
        if (
            transition.kind == KEPT
            and not transition.module_changed
            and old_lower == new_lower
            and self.log.unchanged_below(old_lower, node.logical.reads)
        ):
            return None  # (the usual case below a change that stopped early)
        reason = "module changed" if transition.module_changed else None
        if not reason and not module.cheap_deletions:
            reason = surely_large_deletion(self.costs, node, old_lower, new_lower, self.log)
        inputs = InputChanges() if reason else self.inputs(node, old_lower, new_lower)
        if not reason and not inputs and transition.kind == KEPT:
            return None
        reason = reason or recompute_reason(self.costs, node, inputs, transition)
        if reason:
            changes = module.recompute(node, self.executor, f"recompute ({reason})")
        else:
            changes = module.maintain(
                node, self.executor, inputs, transition.removed_rules, old_bag
            )
        if transition.kind == REDUCED:
            changes.strategy = f"rule deletion: {changes.strategy}"
        return changes

    def inputs(
        self,
        node: NodeState,
        old_lower: list[DataStore],
        new_lower: list[DataStore],
    ) -> InputChanges:
        """How what the node reads from below changed (``changes.visible_difference``), its
        lower stores ``old_lower`` before the update and ``new_lower`` now."""
        return union_difference(node.logical.reads, old_lower, new_lower, self.log)

    # ------------------------------------------------------------------ around the walk
    def drop_indexes_read_by(self, deleted: Iterable[Rule]) -> None:
        """Forget the indexes of every relation a deleted rule read, in every store.

        Why: an index is kept up to date on every insertion and deletion for as long as it
        exists, and nothing else tells it that its reader is gone: after deleting a join rule
        (RS2's r17 reads p21 and p22) every later change to those relations would still pay
        for the index, fact by fact. Which of the indexes other rules still use is decided by
        their plans at run time, so all of the relation's indexes go: a remaining reader
        rebuilds the one it needs, once, in a single pass over the facts, when it next runs."""
        keys = {key for rule in deleted for key, _ in rule.body_relations()}
        if not keys:
            return
        if self.old_graph is not None:
            producers = self.old_graph.producers  # (the stores that can hold them)
            holders = {i for key in keys for i in producers.get(key, ())}
            stores = [self.edb, *(self.old_nodes[i].idb for i in sorted(holders))]
        else:
            stores = [self.edb, *(node.idb for node in self.old_nodes)]
        for store in stores:
            for key in keys:
                relation = store.get(key)
                if relation is not None:
                    relation.drop_indexes()

    def rollback(self) -> None:
        """Undo an update abandoned half way (over its budget, or failing): the explicit
        facts go back to what they were (the log has their exact net changes), and every old
        hyper-node whose IDB was changed in place is computed again, in topological order,
        by a fresh module (its auxiliary state may be half updated). Hyper-nodes the update
        created are simply dropped by the caller, which keeps the old node list. The result
        is the state before the update, fact for fact."""
        edb = self.log.of(self.edb)
        if edb is not None:
            for key, rows in edb.added.items():
                self.edb.relation(key).remove_all(rows)
            for key, rows in edb.removed.items():
                self.edb.relation(key).add_all(rows)
        touched = {id(node) for node in self.touched}
        for node in self.old_nodes:  # topological order
            node.idb.name = node.name
            node.logical.name = node.name
            if id(node) in touched:
                node.idb.clear()
                node.bag.refresh()
                node.module = choose_module(node, self.use_modules, self.costs)
                node.module.materialise(node, self.executor)
        self.names.clear()
        self.names.update(self.names_before)


def copy_into(own: Relation, key: RelationKey, relation: Relation, changes: Maintained) -> None:
    """Add ``relation``'s facts to ``own`` and record the new ones in ``changes``. Binary
    relations both stored by subject are united a subject at a time (bitmaps or sets in C):
    building their tuples to copy them cost more than the merge's whole extension (a cycle
    closed over copies of 160,000 facts)."""
    if own.arity == 2 and not relation.rows_built and by_subject_storage(own):
        gained = SubjectChanges(by_subject_of(own))
        for subject, objects in by_subject_of(relation).items():
            if objects:
                gained.gain(subject, as_bitmap(objects))
        gained.apply(own, key, changes)
        return
    changes.add(key, own.add_all(relation.tuples))
