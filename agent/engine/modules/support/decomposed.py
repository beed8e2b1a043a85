"""One rule evaluated through a hypertree decomposition: the paper's ``Add^r``, ``Del^r`` and
``Red^r`` (Algorithms 3-6 of Zhang, Hu, Nenov, Horrocks, "Enhancing Datalog Reasoning with
Hypertree Decompositions").

Each decomposition node ``p`` keeps ``inst_p``, the join of its atoms (and of the comparisons
and negated atoms whose variables its bag holds) projected onto its bag, across updates.

* In-node evaluation (``Π_p[I, Δ]``) is an ordinary rule evaluation: the node is compiled as a
  rule ``node_p(bag) :- its atoms`` and run by the executor with a delta at each position whose
  relation changed, exactly as seminaive runs a rule; over the old state for deletions
  (``deltas.overdeletion_candidates``).
* Cross-node evaluation (Algorithm 4) treats the nodes as body atoms of a seminaive step: one
  pass per node with new (or deleted) instantiations, that node reading them, the nodes before
  it the old and new ones (``L+``) or the old ones (``L-``), the nodes after it the old ones
  (``L+``) or the old ones minus the deleted (``L-``). Each pass runs the incremental full
  reducer (semi-joins top-down from the delta node when its instantiations are at least three
  times fewer than the largest node's, then bottom-up and top-down from the root) and joins the
  reduced nodes bottom-up, projecting onto the variables the head and the remaining items need.
* What no node can check (binds, comparisons over variables of several nodes) runs after the
  join, in a rule ``head :- joined(U), binds, comparisons`` compiled by the executor, so values
  are computed exactly as in any other rule.
* The rederivation oracle for a node's instantiation is a query: the node's rule with its head
  bound (``deltas.check``); for a head fact it is the join of the nodes restricted to the
  candidates' head values.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from agent.engine.language import Atom, Bind, Comparison, Negation, Rule, Variable, expr_variables
from agent.engine.modules.support import deltas
from agent.engine.modules.support.instances import Active, NodeInstances
from agent.engine.plan.decomposition import Decomposition, negated_shared_variables
from agent.engine.plan.executor import Executor
from agent.engine.storage.changes import Facts
from agent.engine.storage.store import DataStoreBag, Relation, RelationKey

NODE_PREDICATE = "zodiac:decomposition-node"
JOINED_PREDICATE = "zodiac:joined"


class DecomposedRule:
    """A rule, its decomposition and the instantiations of the decomposition's nodes."""

    def __init__(self, rule: Rule, decomposition: Decomposition) -> None:
        self.rule = rule
        self.decomposition = decomposition
        tree = decomposition.nodes
        self.bags: list[tuple[Variable, ...]] = [node.variables for node in tree]
        self.children = [decomposition.children(i) for i in range(len(tree))]
        self.parents = [node.parent for node in tree]
        node_variables = {v for bag in self.bags for v in bag}
        placed: set[int] = set()
        bodies: list[list] = [[rule.body[p] for p in node.cover] for node in tree]
        for position in sorted({p for node in tree for p in node.cover}):
            placed.add(position)
        for position, item in enumerate(rule.body):
            if isinstance(item, Atom) and not item.variables():
                bodies[0].append(item)  # a ground atom: a filter at the root
                placed.add(position)
            elif isinstance(item, Negation):
                needed = negated_shared_variables(rule, position)
                home = next(i for i, bag in enumerate(self.bags) if needed <= set(bag))
                bodies[home].append(item)
                placed.add(position)
            elif isinstance(item, Comparison) and item.variables() <= node_variables:
                homes = [i for i, bag in enumerate(self.bags) if item.variables() <= set(bag)]
                for home in homes:
                    bodies[home].append(item)
                if homes:
                    placed.add(position)
        post = [item for p, item in enumerate(rule.body) if p not in placed]
        self.node_rules = [
            Rule(Atom(f"{NODE_PREDICATE}:{rule.key}:{i}", bag), tuple(body))
            for i, (bag, body) in enumerate(zip(self.bags, bodies, strict=True))
        ]
        # The variables the join hands to the post-join rule: the head's and the remaining
        # items' (never a bind's output), at least one so that the join yields tuples.
        wanted: set[Variable] = set(rule.head.variables())
        for item in post:
            if isinstance(item, Bind):
                wanted |= expr_variables(item.expr)
            elif isinstance(item, Comparison):
                wanted |= item.variables()
        outputs = sorted(wanted & node_variables, key=lambda v: v.name) or [self.bags[0][0]]
        self.outputs = tuple(outputs)
        self.post_rule = Rule(rule.head, (Atom(JOINED_PREDICATE, self.outputs), *post))
        self.instances = [NodeInstances() for _ in tree]
        self.rederive_later: list[set[tuple]] = [set() for _ in tree]  # inst_p^re
        # Per tree edge (child -> parent): the shared variables' columns on each side.
        self.edge_columns: dict[tuple[int, int], tuple[tuple[int, ...], tuple[int, ...]]] = {}
        for child, parent in enumerate(self.parents):
            if parent is None:
                continue
            shared = [v for v in self.bags[child] if v in self.bags[parent]]
            child_columns = tuple(self.bags[child].index(v) for v in shared)
            parent_columns = tuple(self.bags[parent].index(v) for v in shared)
            self.edge_columns[(child, parent)] = (child_columns, parent_columns)
            self.edge_columns[(parent, child)] = (parent_columns, child_columns)
        self.seconds = 0.0

    @property
    def rule_keys(self) -> set[str]:
        """The content keys of the rules compiled for this one (to forget their plans)."""
        return {r.key for r in self.node_rules} | {self.post_rule.key}

    def size(self) -> int:
        """The instantiations kept, over all nodes."""
        return sum(len(inst) for inst in self.instances)

    # ------------------------------------------------------------------ in-node evaluation
    def in_node_all(self, executor: Executor, bag: DataStoreBag, index: int) -> set[tuple]:
        found: set[tuple] = set()
        executor.run(self.node_rules[index], bag, found)
        return found

    def in_node_added(
        self, executor: Executor, bag: DataStoreBag, index: int, plus: Facts, unblocked: Facts
    ) -> set[tuple]:
        """``Π_p[I, Δ+]``: instantiations using a new fact (or that a fact deleted from a
        negated relation enables), over the current state."""
        return deltas.heads_added(executor, self.node_rules[index], bag, plus, unblocked)

    def in_node_removed(
        self,
        executor: Executor,
        bag: DataStoreBag,
        old: dict[RelationKey, Relation],
        index: int,
        minus: Facts,
        blocked: Facts,
    ) -> set[tuple]:
        """``Π_p[I, Δ-]``: instantiations of the old state using a deleted fact (or that a
        fact added to a negated relation blocks)."""
        rule = self.node_rules[index]
        return deltas.heads_removed(executor, rule, bag, old, minus, blocked)

    # ------------------------------------------------------------------ Add / Del / Red
    def materialise(self, executor: Executor, bag: DataStoreBag) -> set[tuple]:
        """Every node's instantiations over the current state, and the heads they derive."""
        started = time.perf_counter()
        for index, inst in enumerate(self.instances):
            inst.clear()
            inst.add(self.in_node_all(executor, bag, index))
            self.rederive_later[index] = set()
        heads = self.heads(executor, bag, self.join([Active([inst]) for inst in self.instances]))
        self.seconds += time.perf_counter() - started
        return heads

    def add(
        self, executor: Executor, bag: DataStoreBag, plus: Facts, unblocked: Facts
    ) -> set[tuple]:
        """Algorithm 3 (``Add^r``): heads of rule instances using a new fact."""
        started = time.perf_counter()
        new = [
            self.in_node_added(executor, bag, index, plus, unblocked) - inst.rows
            for index, inst in enumerate(self.instances)
        ]
        heads = self.cross_node(executor, bag, new, adding=True)
        for inst, rows in zip(self.instances, new, strict=True):
            inst.add(rows)
        self.seconds += time.perf_counter() - started
        return heads

    def delete(
        self,
        executor: Executor,
        bag: DataStoreBag,
        old: dict[RelationKey, Relation],
        minus: Facts,
        blocked: Facts,
    ) -> set[tuple]:
        """Algorithm 5 (``Del^r``): heads of rule instances (of the old state) using a deleted
        fact; the instantiations they used are set aside for rederivation."""
        started = time.perf_counter()
        gone = [
            self.in_node_removed(executor, bag, old, index, minus, blocked) & inst.rows
            for index, inst in enumerate(self.instances)
        ]
        heads = self.cross_node(executor, bag, gone, adding=False)
        for index, rows in enumerate(gone):
            self.instances[index].remove(rows)
            self.rederive_later[index] |= rows
        self.seconds += time.perf_counter() - started
        return heads

    def rederive(
        self, executor: Executor, bag: DataStoreBag, overdeleted: set[tuple]
    ) -> set[tuple]:
        """Algorithm 6 (``Red^r``): the set-aside instantiations that still hold are restored
        and what they derive is returned, with the overdeleted heads the remaining
        instantiations still derive (the oracle for head facts).

        The heads of restored instantiations are all returned, not only the overdeleted ones:
        the state they are checked against already holds this update's new facts, so a
        restored instantiation may derive a new fact, which ``Add^r`` would not find again
        (the instantiation is no longer new by then)."""
        started = time.perf_counter()
        restored = []
        for index, waiting in enumerate(self.rederive_later):
            if waiting:
                key = self.node_rules[index].head.relation
                found = deltas.check(executor, [self.node_rules[index]], bag, {key: waiting})
                restored.append(found.get(key, set()))
            else:
                restored.append(set())
            self.rederive_later[index] = set()
        heads = self.cross_node(executor, bag, restored, adding=True)
        for inst, rows in zip(self.instances, restored, strict=True):
            inst.add(rows)
        if overdeleted:
            heads |= self.heads_among(executor, bag, overdeleted)
        self.seconds += time.perf_counter() - started
        return heads

    def everything(self, executor: Executor, bag: DataStoreBag) -> set[tuple]:
        """Every head the current instantiations derive (a deleted rule's old consequences)."""
        return self.heads(executor, bag, self.join([Active([inst]) for inst in self.instances]))

    def heads_among(
        self, executor: Executor, bag: DataStoreBag, candidates: set[tuple]
    ) -> set[tuple]:
        """The candidate heads that the current instantiations derive: each node is first
        restricted to the candidates' values of the head variables it holds."""
        head = self.rule.head.terms
        actives = []
        for index, bag in enumerate(self.bags):
            columns = [(bag.index(t), c) for c, t in enumerate(head) if t in bag]
            active = Active([self.instances[index]])
            if columns:
                keys = {tuple(fact[c] for _, c in columns) for fact in candidates}
                active.reduce(tuple(b for b, _ in columns), keys)
            actives.append(active)
        return self.heads(executor, bag, self.join(actives)) & candidates

    # ------------------------------------------------------------------ cross-node
    def cross_node(
        self, executor: Executor, bag: DataStoreBag, delta: list[set[tuple]], adding: bool
    ) -> set[tuple]:
        """Algorithm 4 with the labelling ``L+`` (``adding``) or ``L-``: one pass per node
        with a non-empty delta."""
        joined: set[tuple] = set()
        for i, rows in enumerate(delta):
            if not rows:
                continue
            actives = []
            for j, inst in enumerate(self.instances):
                if j == i:
                    actives.append(Active([rows]))
                elif j < i:
                    actives.append(Active([inst, delta[j]] if adding and delta[j] else [inst]))
                elif adding or not delta[j]:
                    actives.append(Active([inst]))
                else:
                    actives.append(Active([inst], excluded=delta[j]))
            joined |= self.join(actives, start=i)
        return self.heads(executor, bag, joined) if joined else set()

    def join(self, actives: list[Active], start: int | None = None) -> set[tuple]:
        """The full reducer, then the join of the reduced nodes projected onto the outputs."""
        if any(active.size() == 0 for active in actives):
            return set()
        largest = max(active.size() for active in actives)
        if start is not None and actives[start].size() * 3 < largest:
            self.semi_joins(actives, self.top_down(start))
        self.semi_joins(actives, [(c, p) for p, c in reversed(self.top_down(0))])
        self.semi_joins(actives, self.top_down(0))
        if any(active.size() == 0 for active in actives):
            return set()
        variables, rows = self.join_up(0, actives)
        if variables == self.outputs:
            return rows
        columns = [variables.index(v) for v in self.outputs]
        return {tuple(row[c] for c in columns) for row in rows}

    def top_down(self, start: int) -> list[tuple[int, int]]:
        """The tree's edges (from, to) in breadth-first order away from ``start``."""
        edges: list[tuple[int, int]] = []
        seen = {start}
        frontier = [start]
        while frontier:
            following: list[int] = []
            for node in frontier:
                neighbours = list(self.children[node])
                if self.parents[node] is not None:
                    neighbours.append(self.parents[node])
                for other in neighbours:
                    if other not in seen:
                        seen.add(other)
                        edges.append((node, other))
                        following.append(other)
            frontier = following
        return edges

    def semi_joins(self, actives: list[Active], edges: Sequence[tuple[int, int]]) -> None:
        """For each edge (source, target): target := target ⋉ source."""
        for source, target in edges:
            source_columns, target_columns = self.edge_columns[(source, target)]
            actives[target].reduce(target_columns, actives[source].keys(source_columns))

    def join_up(self, index: int, actives: list[Active]) -> tuple[tuple[Variable, ...], set]:
        """The join of the subtree at ``index`` projected onto what is needed above it: the
        variables it shares with its parent and the outputs."""
        variables = list(self.bags[index])
        rows = actives[index].materialise()
        for child in self.children[index]:
            child_variables, child_rows = self.join_up(child, actives)
            shared = [v for v in child_variables if v in variables]
            extra = [v for v in child_variables if v not in variables]
            key_columns = [child_variables.index(v) for v in shared]
            extra_columns = [child_variables.index(v) for v in extra]
            by_key: dict[tuple, list[tuple]] = {}
            for row in child_rows:
                by_key.setdefault(tuple(row[c] for c in key_columns), []).append(
                    tuple(row[c] for c in extra_columns)
                )
            own_columns = [variables.index(v) for v in shared]
            joined: set[tuple] = set()
            for row in rows:
                for tail in by_key.get(tuple(row[c] for c in own_columns), ()):
                    joined.add(row + tail)
            variables += extra
            rows = joined
        parent = self.parents[index]
        above = set(self.outputs) | (set(self.bags[parent]) if parent is not None else set())
        kept = tuple(v for v in variables if v in above)
        if parent is None:
            kept = tuple(v for v in self.outputs if v in variables)
        if kept == tuple(variables):
            return kept, rows
        columns = [variables.index(v) for v in kept]
        return kept, {tuple(row[c] for c in columns) for row in rows}

    def heads(self, executor: Executor, bag: DataStoreBag, joined: set[tuple]) -> set[tuple]:
        """The head facts of the joined output tuples, after the binds and comparisons no node
        could check."""
        out: set[tuple] = set()
        if joined:
            sources = [[] for _ in self.post_rule.body]
            executor.run(self.post_rule, bag, out, 0, joined, sources=sources)
        return out
