"""Rule dependency graph (RDG), hyper-nodes and the hyper rule dependency graph (HRDG).

ZodiacEdge section 2.1 and 4.2: rule ``ri`` -> rule ``rj`` when the head relation of ``ri`` is
read by ``rj`` (positively, under negation, or inside an aggregate). Hyper-nodes are the strongly
connected components of the RDG; they are the reasoning units, evaluated in topological order of
the HRDG (Algorithm 1). A negative or aggregate edge inside a component means negation or
aggregation through recursion: such a program is not stratifiable and is refused, naming the
cycle.

This module only knows rules (the logical program); it never touches facts.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left
from collections import deque
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property

from agent.engine.errors import RuleError, StratificationError
from agent.engine.language import RelationKey, Rule
from agent.engine.program.heads import single_headed

POSITIVE = "positive"
NEGATIVE = "negative"
AGGREGATE = "aggregate"


@dataclass(frozen=True)
class RuleEdge:
    source: int  # index of the producing rule
    target: int  # index of the reading rule
    kind: str  # positive / negative / aggregate
    relation: RelationKey


@dataclass
class HyperNode:
    """A strongly connected component of the RDG: the rules evaluated together."""

    rules: tuple[Rule, ...]
    order: int  # position of its first rule in the program: a stable tie-breaker
    recursive: bool  # a cycle of rules (or a rule reading its own head)
    heads: frozenset[RelationKey] = field(default_factory=frozenset)
    reads: frozenset[RelationKey] = field(default_factory=frozenset)
    name: str = ""

    @cached_property
    def rule_keys(self) -> frozenset[str]:
        """The content keys of its rules: the hyper-node's identity (see ``Rule.key``); its
        rules never change, and every update looks every node up by it."""
        return frozenset(r.key for r in self.rules)

    @cached_property
    def not_positive_reads(self) -> frozenset[RelationKey]:
        """The relations its rules read under a negation or inside an aggregate: new facts
        of these retract derivations, as deletions do (the update driver's estimates)."""
        return frozenset(
            key for rule in self.rules for key, how in rule.body_relations() if how != "positive"
        )

    def __repr__(self) -> str:
        return f"HyperNode({self.name or '?'}: {', '.join(r.id for r in self.rules)})"


@dataclass
class HyperGraph:
    """The HRDG: hyper-nodes in topological order, with positive and negative hyper-edges.

    Its edges never change once built (a changed program gets a new graph), so each node's
    successors and predecessors are listed once, at the first question."""

    nodes: list[HyperNode]
    positive: set[tuple[int, int]]  # (i, j): node i's IDB is read positively by node j
    negative: set[tuple[int, int]]  # read under negation or inside an aggregate
    _adjacency: tuple[dict[int, list[int]], dict[int, list[int]]] | None = field(
        default=None, init=False, repr=False, compare=False
    )
    # A graph changed in place from another (``changed_hyper_graph``): how many of its first
    # nodes are that graph's own, with the same edges between them; the rest are sinks it
    # added (or the other graph had sinks more). None: built afresh.
    kept_from_previous: int | None = field(default=None, init=False, repr=False, compare=False)

    def successors(self, index: int) -> list[int]:
        return self._lists()[0].get(index, [])

    def predecessors(self, index: int) -> list[int]:
        return self._lists()[1].get(index, [])

    def _lists(self) -> tuple[dict[int, list[int]], dict[int, list[int]]]:
        adjacency = self._adjacency
        if adjacency is None:
            after: dict[int, list[int]] = {}
            before: dict[int, list[int]] = {}
            for i, j in sorted(self.positive | self.negative):
                after.setdefault(i, []).append(j)
                before.setdefault(j, []).append(i)
            adjacency = self._adjacency = (after, before)
        return adjacency

    # What a graph changed in place (sink rules added or removed: ``changed_hyper_graph``)
    # takes over from the graph it came from, changed by the sinks only, instead of a pass over
    # every rule: a program of thousands of rules pays for them at every such update otherwise.
    @cached_property
    def rule_total(self) -> int:
        return sum(len(node.rules) for node in self.nodes)

    @cached_property
    def relation_counts(self) -> tuple[dict[RelationKey, int], dict[RelationKey, int]]:
        """Per relation, how many rules read it and how many derive it."""
        readers: dict[RelationKey, int] = {}
        derivers: dict[RelationKey, int] = {}
        for node in self.nodes:
            for rule in node.rules:
                _count_rule(rule, readers, derivers, 1)
        return readers, derivers

    @cached_property
    def readers(self) -> dict[RelationKey, list[int]]:
        """Per relation, the hyper-nodes reading it, in order (asked by updates of facts
        alone, which keep the graph: listed once per graph, not once per update)."""
        found: dict[RelationKey, list[int]] = {}
        for index, node in enumerate(self.nodes):
            for relation in node.reads:
                found.setdefault(relation, []).append(index)
        return found

    @cached_property
    def producers(self) -> dict[RelationKey, list[int]]:
        """Per relation, the hyper-nodes deriving it, in order."""
        found: dict[RelationKey, list[int]] = {}
        for index, node in enumerate(self.nodes):
            for relation in node.heads:
                found.setdefault(relation, []).append(index)
        return found


def _count_rule(
    rule: Rule, readers: dict[RelationKey, int], derivers: dict[RelationKey, int], step: int
) -> None:
    """Count ``rule`` into (``step`` 1) or out of (-1) the relation counts (a count reaching
    0 is dropped, so counts taken over agree with counts made afresh)."""
    for counts, relations in (
        (readers, {relation for relation, _ in rule.body_relations()}),
        (derivers, [head.relation for head in rule.heads]),
    ):
        for relation in relations:
            count = counts.get(relation, 0) + step
            if count:
                counts[relation] = count
            else:
                del counts[relation]


def rule_edges(rules: Sequence[Rule]) -> list[RuleEdge]:
    """The RDG's edges (Ep and En; aggregate reads are kept apart but count as negative)."""
    producers: dict[RelationKey, list[int]] = {}
    for index, rule in enumerate(rules):
        producers.setdefault(rule.head.relation, []).append(index)
    edges: list[RuleEdge] = []
    seen: set[tuple[int, int, str, RelationKey]] = set()
    for target, rule in enumerate(rules):
        for relation, kind in rule.body_relations():
            for source in producers.get(relation, ()):
                key = (source, target, kind, relation)
                if key not in seen:
                    seen.add(key)
                    edges.append(RuleEdge(source, target, kind, relation))
    return edges


def strongly_connected_components(
    vertices: Sequence[Hashable], successors: Callable[[Hashable], Iterable[Hashable]]
) -> list[list[Hashable]]:
    """Tarjan's algorithm, iterative (rule sets can be deep enough to overflow recursion)."""
    index_of: dict[Hashable, int] = {}
    low: dict[Hashable, int] = {}
    on_stack: set[Hashable] = set()
    stack: list[Hashable] = []
    components: list[list[Hashable]] = []
    counter = 0
    for root in vertices:
        if root in index_of:
            continue
        work: list[tuple[Hashable, Iterable]] = [(root, iter(successors(root)))]
        index_of[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            vertex, children = work[-1]
            advanced = False
            for child in children:
                if child not in index_of:
                    index_of[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(successors(child))))
                    advanced = True
                    break
                if child in on_stack:
                    low[vertex] = min(low[vertex], index_of[child])
            if advanced:
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[vertex])
            if low[vertex] == index_of[vertex]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == vertex:
                        break
                components.append(component)
    return components


def build_hyper_graph(rules: Sequence[Rule]) -> HyperGraph:
    """Algorithm 1, lines 1-4: RDG -> SCCs -> HRDG in topological order.

    The RDG is not built edge by edge: a relation read by r readers and derived by p rules
    gives p x r rule edges (a bundle of 2,000 rules reading one relation that 40 of them
    derive: 80,000), which made building the graph the largest part of restarting a large
    program. The components are those of the graph with a vertex per rule and per relation
    (rule -> its head's relation -> each rule reading it), whose edges are as many as the
    program's atoms: a cycle of rules is a cycle there, and back. The hyper-edges between
    components are then collected per read, from the distinct components deriving the
    relation read. The result is the same graph as from the rule edges (``rule_edges``, which
    the error for an unstratifiable program still uses, to name the cycle).

    Raises StratificationError for negation/aggregation through recursion and RuleError when
    an aggregate's head relation is also derived by another rule.
    """
    rules = single_headed(rules)  # a multi-head rule: a body rule and a rule per head
    _check_aggregate_heads(rules)
    count = len(rules)
    vertex_of: dict[RelationKey, int] = {}  # a derived relation's vertex: count, count + 1, ...
    producers: dict[RelationKey, list[int]] = {}
    for index, rule in enumerate(rules):
        relation = rule.head.relation
        producers.setdefault(relation, []).append(index)
        vertex_of.setdefault(relation, count + len(vertex_of))
    # Each rule's distinct reads of derived relations, in body order.
    reads = [
        [(relation, kind) for relation, kind in dict.fromkeys(rule.body_relations())
         if relation in vertex_of]
        for rule in rules
    ]  # fmt: skip
    readers: list[list[int]] = [[] for _ in vertex_of]
    for index, found in enumerate(reads):
        for relation in dict.fromkeys(relation for relation, _ in found):
            readers[vertex_of[relation] - count].append(index)
    heads = [vertex_of[rule.head.relation] for rule in rules]

    def successors(vertex: int) -> list[int]:
        return [heads[vertex]] if vertex < count else readers[vertex - count]

    found_components = strongly_connected_components(range(count + len(vertex_of)), successors)
    components: list[list[int]] = []
    recursive: list[bool] = []
    component_of: dict[int, int] = {}
    for vertices in found_components:
        members = [vertex for vertex in vertices if vertex < count]
        if not members:
            continue  # a relation on no cycle
        for rule_index in members:
            component_of[rule_index] = len(components)
        components.append(members)
        recursive.append(len(vertices) > 1)  # (no vertex has an edge to itself)

    producer_components = {
        relation: sorted({component_of[i] for i in indexes})
        for relation, indexes in producers.items()
    }
    positive: set[tuple[int, int]] = set()
    negative: set[tuple[int, int]] = set()
    for target, found in enumerate(reads):
        b = component_of[target]
        for relation, kind in found:
            for a in producer_components[relation]:
                if a != b:
                    (positive if kind == POSITIVE else negative).add((a, b))
                elif kind != POSITIVE:
                    source = next(i for i in producers[relation] if component_of[i] == b)
                    bad = RuleEdge(source, target, kind, relation)
                    raise _stratification_error(rules, rule_edges(rules), bad, component_of)

    order = _topological_order(
        len(components), positive | negative, key=lambda c: min(components[c])
    )
    position = {component: rank for rank, component in enumerate(order)}
    nodes: list[HyperNode] = []
    for component in order:
        members = sorted(components[component])
        node_rules = tuple(rules[i] for i in members)
        nodes.append(
            HyperNode(
                rules=node_rules,
                order=members[0],
                recursive=recursive[component],
                heads=frozenset(r.head.relation for r in node_rules),
                reads=frozenset(rel for r in node_rules for rel, _ in r.body_relations()),
            )
        )
    return HyperGraph(
        nodes=nodes,
        positive={(position[a], position[b]) for a, b in positive},
        negative={(position[a], position[b]) for a, b in negative},
    )


def changed_hyper_graph(
    previous: HyperGraph, old_rules: Sequence[Rule], new_rules: Sequence[Rule]
) -> HyperGraph:
    """The HRDG of ``new_rules``, given ``previous``, that of ``old_rules``.

    When the change only appends or removes *sink* rules (a leaf such as RS2's r18: no rule
    reads its head, no other rule derives it, one head), their hyper-nodes are added to or
    taken from ``previous`` without building the graph again: a leaf rule arriving or leaving
    is the commonest rule update of a device (the cloud sends a diagnosis rule and takes it
    back), and rebuilding cost more than evaluating such a rule. The result is the graph
    `build_hyper_graph` gives (the same nodes in the same order, the same edges): a sink
    joins no component and, appended last, comes last in the topological order; removed, it
    leaves the order of the others as it was. Any other change is built afresh."""
    shortcut = _sinks_only(previous, old_rules, new_rules)
    return shortcut if shortcut is not None else build_hyper_graph(new_rules)


def _sinks_only(
    previous: HyperGraph, old_rules: Sequence[Rule], new_rules: Sequence[Rule]
) -> HyperGraph | None:
    if previous.rule_total != len(old_rules):
        return None  # (not the graph of these rules)
    old_keys = [rule.key for rule in old_rules]
    new_keys = [rule.key for rule in new_rules]
    if len(new_keys) > len(old_keys) and new_keys[: len(old_keys)] == old_keys:
        added = list(new_rules[len(old_keys) :])
        return _with_sinks(previous, added) if _all_sinks(added, previous, True) else None
    removed_keys = set(old_keys) - set(new_keys)
    if len(new_keys) < len(old_keys) and [k for k in old_keys if k not in removed_keys] == new_keys:
        removed = [rule for rule in old_rules if rule.key in removed_keys]
        if not _all_sinks(removed, previous, False):
            return None
        return _without_sinks(previous, removed_keys, removed)
    return None


def _all_sinks(changed: Sequence[Rule], previous: HyperGraph, added: bool) -> bool:
    """Whether each ``changed`` rule (``added`` to the program of ``previous``, or taken from
    it) has one head, which no rule of the program with it reads and no other rule derives.
    (A rule with several heads is never one: its parts sit elsewhere in the rules' order.)"""
    if any(rule.more_heads for rule in changed):
        return False
    heads = {rule.head.relation for rule in changed}
    if len(heads) < len(changed):
        return False
    readers, derivers = previous.relation_counts
    if added:
        if any(readers.get(head) or derivers.get(head) for head in heads):
            return False
        return not any(
            relation in heads for rule in changed for relation, _ in rule.body_relations()
        )
    return not any(readers.get(head) or derivers.get(head) != 1 for head in heads)


def _with_sinks(previous: HyperGraph, added: list[Rule]) -> HyperGraph:
    producers = previous.producers
    nodes = list(previous.nodes)
    positive, negative = set(previous.positive), set(previous.negative)
    first = previous.rule_total
    new_edges: set[tuple[int, int]] = set()
    for offset, rule in enumerate(added):
        target = len(nodes)
        reads = rule.body_relations()
        for relation, kind in reads:
            for source in producers.get(relation, ()):
                (positive if kind == POSITIVE else negative).add((source, target))
                new_edges.add((source, target))
        nodes.append(
            HyperNode(
                rules=(rule,),
                order=first + offset,
                recursive=False,
                heads=frozenset((rule.head.relation,)),
                reads=frozenset(relation for relation, _ in reads),
            )
        )
    graph = HyperGraph(nodes=nodes, positive=positive, negative=negative)
    graph.kept_from_previous = len(previous.nodes)
    # What it takes over (see HyperGraph): copies, the previous graph's are left as they were.
    readers, derivers = (dict(counts) for counts in previous.relation_counts)
    found = dict(producers)
    for offset, rule in enumerate(added):
        _count_rule(rule, readers, derivers, 1)
        found[rule.head.relation] = [len(previous.nodes) + offset]
    graph.__dict__.update(
        rule_total=first + len(added), relation_counts=(readers, derivers), producers=found
    )
    if "readers" in previous.__dict__:  # (asked by every update of facts alone)
        readers_of = dict(previous.readers)
        for index in range(len(previous.nodes), len(nodes)):
            for relation in nodes[index].reads:
                readers_of[relation] = [*readers_of.get(relation, ()), index]
        graph.__dict__["readers"] = readers_of
    if previous._adjacency is not None:
        after, before = (dict(lists) for lists in previous._adjacency)
        for source, target in sorted(new_edges):  # (targets ascending: lists stay sorted)
            after[source] = [*after.get(source, ()), target]
            before.setdefault(target, []).append(source)
        graph._adjacency = (after, before)
    return graph


def _without_sinks(
    previous: HyperGraph, removed_keys: set[str], removed: Sequence[Rule]
) -> HyperGraph:
    producers = previous.producers
    gone = {producers[rule.head.relation][0] for rule in removed}  # (a sink: its own node)
    removed_positions = sorted(previous.nodes[i].order for i in gone)
    count, total = len(previous.nodes), previous.rule_total
    if sorted(gone) == list(range(count - len(gone), count)) and removed_positions == list(
        range(total - len(gone), total)
    ):  # the last nodes and the last rules (the commonest case: the sinks added last)
        return _without_last(previous, removed)
    # A node's order is its first rule's position in the program: it moves back by the
    # removed rules before it.
    position: dict[int, int] = {}
    nodes: list[HyperNode] = []
    for index, node in enumerate(previous.nodes):
        if index in gone:
            continue
        position[index] = len(nodes)
        shift = bisect_left(removed_positions, node.order)
        nodes.append(replace(node, order=node.order - shift) if shift else node)
    return HyperGraph(
        nodes=nodes,
        positive={(position[a], position[b]) for a, b in previous.positive if b not in gone},
        negative={(position[a], position[b]) for a, b in previous.negative if b not in gone},
    )


def _without_last(previous: HyperGraph, removed: Sequence[Rule]) -> HyperGraph:
    """``previous`` less its last ``len(removed)`` hyper-nodes, which are the sinks of the
    ``removed`` rules and hold the program's last rules: no other node moves or changes."""
    cut = len(previous.nodes) - len(removed)
    graph = HyperGraph(
        nodes=previous.nodes[:cut],
        positive={edge for edge in previous.positive if edge[1] < cut},
        negative={edge for edge in previous.negative if edge[1] < cut},
    )
    graph.kept_from_previous = cut
    readers, derivers = (dict(counts) for counts in previous.relation_counts)
    producers = dict(previous.producers)
    for rule in removed:
        _count_rule(rule, readers, derivers, -1)
        del producers[rule.head.relation]
    graph.__dict__.update(
        rule_total=previous.rule_total - len(removed),
        relation_counts=(readers, derivers),
        producers=producers,
    )
    if "readers" in previous.__dict__:
        readers_of = dict(previous.readers)
        for node in previous.nodes[cut:]:
            for relation in node.reads:
                left = [i for i in readers_of.get(relation, ()) if i < cut]
                if left:
                    readers_of[relation] = left
                else:
                    readers_of.pop(relation, None)
        graph.__dict__["readers"] = readers_of
    if previous._adjacency is not None:
        after, before = (dict(lists) for lists in previous._adjacency)
        sources = {i for target in range(cut, len(previous.nodes)) for i in before.pop(target, ())}
        for source in sources:
            kept = [j for j in after[source] if j < cut]
            if kept:
                after[source] = kept
            else:
                del after[source]
        graph._adjacency = (after, before)
    return graph


def _check_aggregate_heads(rules: Sequence[Rule]) -> None:
    heads: dict[RelationKey, list[Rule]] = {}
    for rule in rules:
        heads.setdefault(rule.head.relation, []).append(rule)
    for rule in rules:
        if rule.aggregate() is not None and len(heads[rule.head.relation]) > 1:
            others = [r for r in heads[rule.head.relation] if r is not rule]
            predicate, arity = rule.head.relation
            raise RuleError(
                f"the head {predicate}/{arity} of aggregate rule {rule.id} is also derived by "
                f"rule {others[0].id}; an aggregate's head must be defined by that rule alone",
                rule=str(rule),
            )


def _stratification_error(
    rules: Sequence[Rule],
    edges: list[RuleEdge],
    bad: RuleEdge,
    component_of: dict[int, int],
) -> StratificationError:
    """Name the cycle: bad.target's result flows back to bad.source within the component."""
    component = component_of[bad.source]
    adjacency: dict[int, list[int]] = {}
    for edge in edges:
        if component_of[edge.source] == component == component_of[edge.target]:
            adjacency.setdefault(edge.source, []).append(edge.target)
    # Shortest path target -> ... -> source, then close the cycle with the bad edge.
    parents: dict[int, int | None] = {bad.target: None}
    queue = deque([bad.target])
    while queue:
        vertex = queue.popleft()
        if vertex == bad.source:
            break
        for nxt in adjacency.get(vertex, ()):
            if nxt not in parents:
                parents[nxt] = vertex
                queue.append(nxt)
    path: list[int] = []
    cursor: int | None = bad.source
    while cursor is not None:
        path.append(cursor)
        cursor = parents.get(cursor)
    path.reverse()  # bad.target ... bad.source
    cycle = [rules[i].id for i in path] + [rules[bad.target].id]
    how = "under negation" if bad.kind == NEGATIVE else "inside an aggregate"
    predicate, arity = bad.relation
    return StratificationError(
        f"program is not stratifiable: rule {rules[bad.target].id} reads {predicate}/{arity} "
        f"{how}, but {predicate}/{arity} depends on that rule's own result through the cycle "
        + " -> ".join(cycle),
        cycle=cycle,
    )


def _topological_order(
    count: int, edges: set[tuple[int, int]], key: Callable[[int], int]
) -> list[int]:
    """Kahn's algorithm; among ready vertices the one with the smallest key goes first."""
    indegree = [0] * count
    outgoing: dict[int, list[int]] = {}
    for a, b in edges:
        indegree[b] += 1
        outgoing.setdefault(a, []).append(b)
    ready = [(key(v), v) for v in range(count) if indegree[v] == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        _, vertex = heapq.heappop(ready)
        order.append(vertex)
        for nxt in outgoing.get(vertex, ()):
            indegree[nxt] -= 1
            if indegree[nxt] == 0:
                heapq.heappush(ready, (key(nxt), nxt))
    return order


def execution_plan(graph: HyperGraph, impacted: Iterable[int]) -> list[int]:
    """Algorithm 4: the directly impacted hyper-nodes and everything reachable from them, in
    topological order (reverse DFS post-order)."""
    visited: set[int] = set()
    post_order: list[int] = []
    for start in sorted(impacted):
        if start in visited:
            continue
        visited.add(start)
        work = [(start, iter(graph.successors(start)))]
        while work:
            vertex, children = work[-1]
            for child in children:
                if child not in visited:
                    visited.add(child)
                    work.append((child, iter(graph.successors(child))))
                    break
            else:
                work.pop()
                post_order.append(vertex)
    post_order.reverse()
    return post_order
