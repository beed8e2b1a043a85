"""The update driver: applies a change of rules and facts to a materialised program.

One call handles any mix of rule insertions, rule deletions, fact insertions and fact deletions
as a single change (a rule bundle carries all four):

1. The candidate program is checked (safety, stratification) before anything is touched.
2. The new HRDG is compared with the old one (ZodiacEdge Alg. 2 and 3, computed as a difference
   of the two graphs): a hyper-node whose rules are unchanged is *kept* with its IDB; one that
   only lost rules is *reduced* (maintained by overdeleting what the removed rules derived, or
   recomputed when that is cheaper); one made of several old hyper-nodes plus new rules is
   *merged* (the old IDBs are united and only the new rules' consequences added, Alg. 2); one
   split off a larger hyper-node, or new, is computed; hyper-nodes that lost all their rules are
   *dropped* with their IDB, without reasoning. The directly impacted hyper-nodes (DIHN) are the
   new, merged, split and reduced ones, plus those reading changed explicit facts.
3. The execution plan is the DIHN and everything reachable from them, in topological order
   (Alg. 4). Each hyper-node in the plan receives the *visible* difference of its EDB bag: how
   the union of the EDB and its predecessors' IDBs changed (a fact derived in two hyper-nodes
   disappears for a reader only when both lose it), and its module maintains its IDB.

Every hyper-node's strategy and time is reported in ``Reasoner.stats()["last_update"]``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from .dependency import HyperGraph, HyperNode, execution_plan
from .executor import Executor
from .language import Rule
from .modules import Module, NodeState, choose_module
from .modules.base import InputChanges, StoreChanges
from .store import DataStore, DataStoreBag, RelationKey

KEPT = "kept"
REDUCED = "reduced"
MERGED = "merged"
SPLIT = "split"
NEW = "new"
DELETION_RECOMPUTE_RATIO = 0.3
# Summed shares of new facts in a join's atoms above which recomputing beats seminaive.
INSERTION_RECOMPUTE_GROWTH = 1.0


@dataclass
class Transition:
    """How one hyper-node of the new graph relates to the old graph."""

    kind: str
    logical: HyperNode
    sources: list[NodeState] = field(default_factory=list)  # old nodes it takes rules from
    new_rules: list[Rule] = field(default_factory=list)
    removed_rules: list[Rule] = field(default_factory=list)
    module_changed: bool = False


@dataclass
class StoreLog:
    """Changes of every store during the update, to compute visible differences."""

    changes: dict[int, StoreChanges] = field(default_factory=dict)
    created: set[int] = field(default_factory=set)
    dropped: set[int] = field(default_factory=set)

    def record(self, store: DataStore, changes: StoreChanges) -> None:
        if id(store) not in self.changes:
            self.changes[id(store)] = changes
            return
        mine = self.changes[id(store)]
        for key, rows in changes.added.items():
            mine.add(key, rows)
        for key, rows in changes.removed.items():
            mine.remove(key, rows)

    def touched(self, store: DataStore, key: RelationKey) -> set:
        mine = self.changes.get(id(store))
        if mine is None:
            return set()
        return mine.added.get(key, set()) | mine.removed.get(key, set())

    def changed(self, store: DataStore, key: RelationKey) -> bool:
        """Whether ``store`` gained or lost facts of ``key`` in this update."""
        mine = self.changes.get(id(store))
        return mine is not None and bool(mine.added.get(key) or mine.removed.get(key))

    def held_before(self, store: DataStore, key: RelationKey, candidates: set) -> set:
        """The candidates ``store`` held before the update."""
        if id(store) in self.created:
            return set()
        relation = store.relations.get(key)
        present = relation.present(candidates) if relation is not None else set()
        mine = self.changes.get(id(store))
        if mine is None:
            return present
        added = mine.added.get(key)
        if added:
            present -= added
        removed = mine.removed.get(key)
        if removed:
            present |= candidates & removed
        return present

    def in_place(self, store: DataStore, old_ids: set[int], new_ids: set[int]) -> bool:
        """Whether ``store`` was below a node both before and after the update, and neither
        appeared nor disappeared in it: then its net changes are exact (see net_changes)."""
        return (
            id(store) in old_ids
            and id(store) in new_ids
            and id(store) not in self.created
            and id(store) not in self.dropped
        )

    def net_changes(self, store: DataStore, key: RelationKey) -> tuple[set, set]:
        """Copies of what ``store`` gained and lost of ``key`` in this update. StoreChanges
        records net changes (a fact removed then re-added is neither), so these are exactly
        the facts held after and not before, and before and not after."""
        mine = self.changes.get(id(store))
        if mine is None:
            return set(), set()
        return set(mine.added.get(key, ())), set(mine.removed.get(key, ()))

    def held_after(self, store: DataStore, key: RelationKey, candidates: set) -> set:
        """The candidates ``store`` holds after the update."""
        if id(store) in self.dropped:
            return set()
        relation = store.relations.get(key)
        return relation.present(candidates) if relation is not None else set()


@dataclass
class Journal:
    """What one update changed, store by store, for whoever keeps a copy of the state (the
    agent's SQLite file): ``edb`` holds the net explicit-fact changes; a hyper-node IDB that
    was ``created`` in the update must be written in full, any other one changed by exactly
    ``changes[id(idb)]``. IDBs of the previous node list that no node uses any more were
    dropped."""

    edb: StoreChanges = field(default_factory=StoreChanges)
    created: set[int] = field(default_factory=set)
    changes: dict[int, StoreChanges] = field(default_factory=dict)

    def of(self, store: DataStore) -> StoreChanges:
        return self.changes.get(id(store)) or StoreChanges()


def new_node_state(
    name: str,
    logical: HyperNode,
    idb: DataStore,
    edb: DataStore,
    predecessors: list[DataStore],
    module: Module | None,
    use_modules: bool,
) -> NodeState:
    """A hyper-node's run-time state: its IDB with a relation per head, its view (EDB,
    predecessors' IDBs, own IDB) and its module (``module``, or one chosen by pattern)."""
    logical.name = name
    for key in logical.heads:
        idb.relation(key)
    for rule in logical.rules:
        for key, _ in rule.body_relations():
            edb.relation(key)
    view = DataStoreBag([edb, *predecessors, idb])
    node = NodeState(name, logical, idb, view)
    node.module = module if module is not None else choose_module(node, use_modules)
    return node


def classify(old_nodes: list[NodeState], graph: HyperGraph, deleted: set[str]) -> list[Transition]:
    """Alg. 2/3 as a graph difference: the transition of every hyper-node of the new graph."""
    by_rules = {node.logical.rule_ids: node for node in old_nodes}
    owner: dict[str, NodeState] = {}
    for node in old_nodes:
        for rule_id in node.logical.rule_ids:
            owner[rule_id] = node
    transitions: list[Transition] = []
    for logical in graph.nodes:
        ids = logical.rule_ids
        if ids in by_rules:
            transitions.append(Transition(KEPT, logical, [by_rules[ids]]))
            continue
        sources: list[NodeState] = []
        for rule_id in sorted(ids):
            node = owner.get(rule_id)
            if node is not None and all(node is not s for s in sources):
                sources.append(node)
        new_rules = [r for r in logical.rules if r.id not in owner]
        if not sources:
            transitions.append(Transition(NEW, logical, [], new_rules))
            continue
        remaining = [s.logical.rule_ids - deleted for s in sources]
        same_heads = len(sources) == 1 and logical.heads == sources[0].heads
        if same_heads and not new_rules and remaining[0] == ids:
            # Only rules removed, same relations derived: overdelete what they derived. (If a
            # relation stopped being derived here, its stale facts would feed the remaining
            # rules as if they were inputs: such a node is recomputed like a split one.)
            removed = [r for r in sources[0].rules if r.id in deleted]
            transitions.append(Transition(REDUCED, logical, sources, [], removed))
        elif all(rest <= ids for rest in remaining) and all(
            not (s.logical.rule_ids & deleted) for s in sources
        ):
            transitions.append(Transition(MERGED, logical, sources, new_rules))
        else:
            transitions.append(Transition(SPLIT, logical, sources, new_rules))
    return transitions


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
    ) -> None:
        self.use_modules = use_modules
        self.progress = progress
        self.edb = edb
        self.executor = executor
        self.old_nodes = old_nodes
        self.graph = graph
        self.names = names
        self.log = StoreLog()
        self.report: dict = {"hyper_nodes": {}}
        self.dropped: list[NodeState] = []  # old hyper-nodes no new one reuses

    def name_of(self, logical: HyperNode) -> str:
        name = self.names.get(logical.rule_ids)
        if name is None:
            number = len(self.names) + 1
            taken = set(self.names.values())  # a restored reasoner's names may have gaps
            while f"hn{number}" in taken:
                number += 1
            name = self.names[logical.rule_ids] = f"hn{number}"
        logical.name = name
        return name

    def journal(self) -> Journal:
        """The update's changes, store by store (see :class:`Journal`)."""
        return Journal(
            edb=self.log.changes.get(id(self.edb)) or StoreChanges(),
            created=set(self.log.created),
            changes=dict(self.log.changes),
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
    def run(self, deleted: set[str], extend_merges: bool) -> list[NodeState]:
        """Walk the plan; ``extend_merges`` (a pure rule insertion) lets merged hyper-nodes
        start from their parts' IDBs instead of being recomputed."""
        started = time.perf_counter()
        self.drop_indexes_read_by(deleted)
        transitions = classify(self.old_nodes, self.graph, deleted)
        nodes = self.build_nodes(transitions, extend_merges)
        old_view = {id(n): n.view for n in self.old_nodes}
        reused = {id(n.idb) for n in nodes}
        dropped = self.dropped = [n for n in self.old_nodes if id(n.idb) not in reused]
        for node in dropped:
            self.log.dropped.add(id(node.idb))
        self.report["dropped"] = [n.name for n in dropped]

        impacted = {i for i, t in enumerate(transitions) if t.kind != KEPT}
        changed_keys = {k for k, rows in self.changed_edb_keys().items() if rows}
        changed_keys |= {k for n in dropped for k in n.heads}
        for index, node in enumerate(nodes):
            if node.logical.reads & changed_keys:
                impacted.add(index)
        plan = execution_plan(self.graph, impacted)
        self.report["directly_impacted"] = sorted(
            nodes[i].name for i, t in enumerate(transitions) if t.kind != KEPT
        )
        self.report["plan"] = [nodes[i].name for i in plan]
        for done, index in enumerate(plan, start=1):
            if self.progress:
                self.progress(nodes[index].name, done, len(plan))
            self.update_node(nodes[index], transitions[index], old_view, extend_merges)
        self.report["seconds"] = time.perf_counter() - started
        return nodes

    def drop_indexes_read_by(self, deleted: set[str]) -> None:
        """Forget the indexes of every relation a deleted rule read, in every store.

        Why: an index is kept up to date on every insertion and deletion for as long as it
        exists, and nothing else tells it that its reader is gone: after deleting a join rule
        (RS2's r17 reads p21 and p22) every later change to those relations would still pay
        for the index, fact by fact. Which of the indexes other rules still use is decided by
        their plans at run time, so all of the relation's indexes go: a remaining reader
        rebuilds the one it needs, once, in a single pass over the facts, when it next runs."""
        if not deleted:
            return
        keys = {
            key
            for node in self.old_nodes
            for rule in node.rules
            if rule.id in deleted
            for key, _ in rule.body_relations()
        }
        for store in [self.edb, *(node.idb for node in self.old_nodes)]:
            for key in keys:
                relation = store.get(key)
                if relation is not None:
                    relation.drop_indexes()

    def changed_edb_keys(self) -> dict[RelationKey, set]:
        mine = self.log.changes.get(id(self.edb))
        if mine is None:
            return {}
        keys: dict[RelationKey, set] = {}
        for key, rows in [*mine.added.items(), *mine.removed.items()]:
            keys.setdefault(key, set()).update(rows)
        return keys

    def build_nodes(self, transitions: list[Transition], extend_merges: bool) -> list[NodeState]:
        nodes: list[NodeState] = []
        for index, transition in enumerate(transitions):
            logical = transition.logical
            name = self.name_of(logical)
            module = None
            if transition.kind in (KEPT, REDUCED):
                source = transition.sources[0]
                idb, module = source.idb, source.module
                idb.name = name
            elif transition.kind == MERGED and extend_merges:
                # Alg. 2: the merged hyper-node starts from its parts' IDBs; the largest one is
                # reused and the others are added to it.
                largest = max(transition.sources, key=lambda s: s.size())
                transition.sources.sort(key=lambda s: s is not largest)
                idb = largest.idb
                idb.name = name
            else:
                idb = DataStore(name)
                self.log.created.add(id(idb))
            predecessors = [nodes[i].idb for i in self.graph.predecessors(index)]
            node = new_node_state(
                name,
                logical,
                idb,
                self.edb,
                predecessors,
                module if transition.kind == KEPT else None,
                self.use_modules,
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

    def update_node(
        self,
        node: NodeState,
        transition: Transition,
        old_view: dict[int, DataStoreBag],
        extend_merges: bool,
    ) -> None:
        started = time.perf_counter()
        module: Module = node.module  # type: ignore[assignment]
        kind = transition.kind
        if kind in (NEW, SPLIT) or (kind == MERGED and not extend_merges):
            strategy = "materialise" if kind == NEW else "recompute"
            node.idb.clear()
            module.materialise(node, self.executor)
            # A created store is read as wholly new by visible_difference: no copy of its
            # facts is logged; only the count is reported.
            changes = StoreChanges()
            created_count = node.idb.size()
        elif kind == MERGED:
            strategy = "merge + extend"
            changes = StoreChanges()
            for source in transition.sources[1:]:
                for key, relation in source.idb.relations.items():
                    changes.add(key, node.own(key).add_all(relation.tuples))
            # The parts' IDBs were complete for their old inputs; inputs may have changed in
            # this very update (a new rule upstream), so maintain first, then extend.
            own = {id(s.idb) for s in transition.sources}
            old_lower = list(
                {
                    id(store): store
                    for source in transition.sources
                    for store in old_view[id(source)].stores
                    if id(store) not in own
                }.values()
            )
            inputs = self.visible_difference(node, old_lower)
            steps = [module.maintain(node, self.executor, inputs)] if inputs else []
            steps.append(module.extend(node, self.executor, transition.new_rules))
            for step in steps:
                for key, rows in step.added.items():
                    changes.add(key, rows)
                for key, rows in step.removed.items():
                    changes.remove(key, rows)
        else:
            sources_view = old_view.get(id(transition.sources[0])) if transition.sources else None
            old_lower = (
                [s for s in sources_view.stores if s is not transition.sources[0].idb]
                if sources_view is not None
                else node.lower_stores()
            )
            reason = "module changed" if transition.module_changed else None
            if not reason and not module.cheap_deletions:
                reason = self.surely_large_deletion(node, old_lower)
            inputs = InputChanges() if reason else self.visible_difference(node, old_lower)
            if not reason and not inputs and kind == KEPT:
                return
            reason = reason or self.recompute_reason(node, inputs, transition)
            if reason:
                changes = module.recompute(node, self.executor)
                strategy = f"recompute ({reason})"
            else:
                changes = module.maintain(
                    node, self.executor, inputs, transition.removed_rules, sources_view
                )
                strategy = getattr(module, "last_strategy", "") or "incremental"
            if kind == REDUCED:
                strategy = f"rule deletion: {strategy}"
        self.log.record(node.idb, changes)
        added, removed = changes.counts()
        if kind in (NEW, SPLIT) or (kind == MERGED and not extend_merges):
            added = created_count
        self.report["hyper_nodes"][node.name] = {
            "transition": kind,
            "strategy": strategy,
            "module": module.describe(),
            "added": added,
            "removed": removed,
            "seconds": time.perf_counter() - started,
        }

    def recompute_reason(
        self, node: NodeState, inputs: InputChanges, transition: Transition
    ) -> str | None:
        """Cost estimate: why recomputing the node beats maintaining it, or None.

        Insertions are maintained unless most of what a non-recursive join reads is new (see
        ``join_growth``): otherwise their cost is the new derivations only. Deletions
        cost overdeletion plus rederivation, so when the facts a node loses (or that new facts
        of negated relations block) are a large part of what it reads, or when a deleted rule
        would have to be evaluated over more facts than the node holds, deriving the node again
        is cheaper."""
        module = node.module
        if module is not None and not transition.removed_rules and module.handles(inputs):
            return None
        reads = self.input_size(node)
        negated = {rel for r in node.rules for rel, how in r.body_relations() if how != "positive"}
        lost = sum(len(rows) for key, rows in inputs.minus.items())
        lost += sum(len(rows) for key, rows in inputs.plus.items() if key in negated)
        if lost > DELETION_RECOMPUTE_RATIO * max(1, reads):
            return f"{lost} input facts lost of {reads}"
        growth = self.join_growth(node, inputs)
        if growth > INSERTION_RECOMPUTE_GROWTH:
            return f"inputs of its joins grew by {growth:.0%}"
        if transition.removed_rules:
            removed_reads = sum(  # the removed rules read the node's own facts too
                len(r)
                for rule in transition.removed_rules
                for relation, _ in rule.body_relations()
                for r in node.view.relations(relation)
            )
            keep = node.size() * (2 if node.logical.recursive else 1)
            if removed_reads * 2 > keep:
                return f"removed rules read {removed_reads} facts, node holds {node.size()}"
        return None

    def join_growth(self, node: NodeState, inputs: InputChanges) -> float:
        """For a non-recursive node whose rules join several atoms: the largest, over its
        rules, sum over the rule's positive atoms of the share of that atom's facts that are
        new. Seminaive evaluates such a rule once per atom with new facts, each time over
        that share of the work of a full evaluation, so a sum well above 1 costs more than
        evaluating the rule once over everything (RS2's ``p30`` when ``r3`` is added: two
        thirds of both joined relations are new). Recursive nodes are left to seminaive."""
        if node.logical.recursive or not inputs.plus:
            return 0.0
        worst = 0.0
        for rule in node.rules:
            atoms = [rel for rel, how in rule.body_relations() if how == "positive"]
            if len(atoms) < 2:
                continue
            shares = 0.0
            for key in atoms:
                new = len(inputs.plus.get(key, ()))
                if new:
                    shares += new / max(1, self.visible_size(node, key))
            worst = max(worst, shares)
        return worst

    def surely_large_deletion(self, node: NodeState, old_lower: list[DataStore]) -> str | None:
        """Skip computing the exact difference when even a lower bound of the facts lost (the
        facts removed from the only store holding a relation) calls for recomputing."""
        if {id(s) for s in old_lower} != {id(s) for s in node.lower_stores()}:
            return None
        lost = 0
        for key in node.logical.reads:
            holders = [s for s in old_lower if key in s.relations]
            sizes = [len(s.relations[key]) for s in holders]
            best = 0
            for store in holders:
                mine = self.log.changes.get(id(store))
                if mine is None or id(store) in self.log.created:
                    continue
                # At most what the other holders still hold can remain visible.
                others = sum(sizes) - len(store.relations[key])
                best = max(best, len(mine.removed.get(key, ())) - others)
            lost += best
        reads = self.input_size(node)
        if lost > 2 * DELETION_RECOMPUTE_RATIO * max(1, reads):
            return f"{lost} input facts lost of {reads}"
        return None

    def input_size(self, node: NodeState) -> int:
        return sum(self.visible_size(node, key) for key in node.logical.reads)

    @staticmethod
    def visible_size(node: NodeState, key: RelationKey) -> int:
        """Facts of ``key`` the node reads from below (an upper bound of the union's size)."""
        return sum(len(r) for r in node.view.relations(key) if r is not node.idb.get(key))

    def visible_difference(self, node: NodeState, old_lower: list[DataStore]) -> InputChanges:
        """How the union of the node's lower stores changed, per relation it reads.

        Candidates are the facts some lower store gained or lost (all facts of a store that
        appeared, disappeared, or entered or left the node's lower set); their membership
        before and after is decided with set operations, store by store. The common case
        skips all that: when one store alone changed a relation and stayed below the node,
        its net changes are the difference (the copies cost far less than the membership
        tests: RS2's p20 -> p30 when r3 is added passes 119,400 facts on)."""
        new_lower = node.lower_stores()
        old_ids = {id(s) for s in old_lower}
        new_ids = {id(s) for s in new_lower}
        everyone = list({id(s): s for s in [*old_lower, *new_lower]}.values())
        # Stores below the node before and after, neither created nor dropped: the others
        # count whole (every fact they hold appeared or disappeared for this node).
        staying = [s for s in old_lower if self.log.in_place(s, old_ids, new_ids)]
        staying_ids = {id(s) for s in staying}
        changes = InputChanges()
        for key in node.logical.reads:
            # A store staying below the node, unchanged for this key, holds the same
            # candidates before and after: it cannot make one appear or disappear, only
            # hide a change of another store. So it is subtracted from the changes (cost: the
            # changes) instead of intersected with the candidates twice (cost: 2 x candidates).
            steady = [s for s in staying if not self.log.changed(s, key)]
            steady_ids = {id(s) for s in steady}
            moving = [
                s
                for s in everyone
                if id(s) not in steady_ids and (key in s.relations or self.log.changed(s, key))
            ]
            if not moving:
                continue
            if len(moving) == 1 and id(moving[0]) in staying_ids:
                # One store changed and it stayed below the node: its net changes are the
                # visible ones, up to what the steady stores hide (no membership tests).
                plus, minus = self.log.net_changes(moving[0], key)
            else:
                candidates: set = set()
                for store in moving:
                    relation = store.relations.get(key)
                    if id(store) not in staying_ids and relation is not None:
                        candidates |= relation.tuples
                    candidates |= self.log.touched(store, key)
                if not candidates:
                    continue
                plus, minus = self.changed_membership(
                    key, candidates, old_lower, new_lower, steady_ids
                )
            for store in steady:
                relation = store.relations.get(key)
                if relation is not None and len(relation):
                    if plus:
                        plus = relation.absent(plus)
                    if minus:
                        minus = relation.absent(minus)
            if plus:
                changes.plus[key] = plus
            if minus:
                changes.minus[key] = minus
        return changes

    def changed_membership(
        self,
        key: RelationKey,
        candidates: set,
        old_lower: list[DataStore],
        new_lower: list[DataStore],
        steady_ids: set[int],
    ) -> tuple[set, set]:
        """The candidates visible after but not before, and before but not after, through the
        stores that are not steady (decided store by store with set operations)."""
        before = set().union(
            *(
                self.log.held_before(s, key, candidates)
                for s in old_lower
                if id(s) not in steady_ids
            )
        )
        after = set().union(
            *(self.log.held_after(s, key, candidates) for s in new_lower if id(s) not in steady_ids)
        )
        return after - before, before - after
