"""Hypertree decompositions of rule bodies, chosen by estimated cost.

A rule body is a hypergraph: one vertex per variable, one hyperedge per positive atom (its
variables). When the hypergraph is acyclic (the GYO reduction removes every edge) ordinary join
plans are fine. When it is cyclic, a join plan may build intermediate results far larger than
the output, and the hypertree-decomposition paper (Zhang, Hu, Nenov, Horrocks) evaluates the
rule through a decomposition instead: a tree of nodes, each joining a few atoms (its cover,
``λ``) projected onto a bag of variables (``χ``), such that every atom's variables lie in one
bag and the bags holding a variable form a connected subtree.

How decompositions are found: each elimination order of the variables (primal graph: variables
adjacent when an atom, or a negated atom, holds both) gives a tree decomposition (a bag per
eliminated variable, its neighbours at elimination); bags contained in another are merged away
and each bag gets the cheapest smallest set of atoms covering its variables. Orders are the
greedy min-fill and min-degree orders started from every variable, so the search is
deterministic and polynomial (a rule of 10 variables tries at most 20 orders). This gives
generalised hypertree decompositions, which is what evaluation needs: every atom is checked in
full at a node whose bag holds all its variables, and projecting other nodes' covers is a sound
filter. (The paper's extra condition 4 only matters for finding decompositions of guaranteed
width; the algorithms evaluating a decomposition do not depend on it.)

Cost (the paper's choice, after Scarcello et al.): per node, the work of its in-node join (the
sum of the textbook estimates of the join prefixes in the planner's order), plus
``2 (|p| + |q|)`` per tree edge for the semi-joins between nodes, with ``|p|`` the node's
estimated size (its join projected onto its bag). The same estimate of the planner's order
prices the rule's seminaive plan, so the reasoner can choose per rule.
Nothing here depends on Python's hashing: candidates are compared by cost, then by text.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from agent.engine.language import Atom, Constant, Negation, Rule, Variable, item_variables
from agent.engine.plan.planner import ScanStep, plan_rule


@dataclass(frozen=True)
class AtomStats:
    """What the estimator knows of the facts an atom reads: their number and the number of
    distinct values per column."""

    size: int
    distinct: tuple[int, ...]


@dataclass(frozen=True)
class TreeNode:
    """A decomposition node: its bag ``variables`` (χ), the body positions of its cover (λ:
    the atoms joined to produce its instantiations, including every atom whose variables all
    lie in the bag), its parent (None for the root) and its estimated size."""

    variables: tuple[Variable, ...]
    cover: tuple[int, ...]
    parent: int | None
    estimate: float

    def describe(self, rule: Rule) -> str:
        names = ", ".join(v.name for v in self.variables)
        atoms = " and ".join(str(rule.body[p]) for p in self.cover)
        return f"{{{names}}} <- {atoms}"


@dataclass(frozen=True)
class Decomposition:
    """A rooted tree of nodes (node 0 is the root; parents come before children), its width
    (the largest cover among the atoms the bags need) and its estimated cost."""

    nodes: tuple[TreeNode, ...]
    width: int
    cost: float

    def children(self, index: int) -> list[int]:
        return [i for i, node in enumerate(self.nodes) if node.parent == index]

    def describe(self, rule: Rule) -> str:
        lines = [f"width {self.width}, estimated cost {self.cost:.3g}"]

        def walk(index: int, depth: int) -> None:
            lines.append("  " * (depth + 1) + f"p{index}: " + self.nodes[index].describe(rule))
            for child in self.children(index):
                walk(child, depth + 1)

        walk(0, 0)
        return "\n".join(lines)


# ------------------------------------------------------------------ acyclicity
def positive_atoms(rule: Rule) -> dict[int, Atom]:
    """Body position -> positive atom with at least one variable (the hyperedges)."""
    return {
        position: item
        for position, item in enumerate(rule.body)
        if isinstance(item, Atom) and item.variables()
    }


def is_acyclic(edges: Sequence[frozenset[Variable]]) -> bool:
    """GYO reduction: repeatedly drop variables that occur in one edge only and edges contained
    in another; the hypergraph is acyclic when at most one edge is left."""
    remaining = [set(edge) for edge in edges if edge]
    if len(remaining) <= 2:  # (two edges always reduce to one: most rules, decided at once)
        return True
    changed = True
    while changed and len(remaining) > 1:
        changed = False
        counts: dict[Variable, int] = {}
        for edge in remaining:
            for variable in edge:
                counts[variable] = counts.get(variable, 0) + 1
        for edge in remaining:
            lonely = {v for v in edge if counts[v] == 1}
            if lonely:
                edge -= lonely
                changed = True
        kept: list[set[Variable]] = []
        for index, edge in enumerate(remaining):
            contained = not edge or any(
                edge <= other and (edge != other or other_index < index)
                for other_index, other in enumerate(remaining)
                if other_index != index
            )
            if contained:
                changed = True
            else:
                kept.append(edge)
        remaining = kept
    return len(remaining) <= 1


def is_cyclic_rule(rule: Rule) -> bool:
    return not is_acyclic([frozenset(a.variables()) for a in positive_atoms(rule).values()])


# ------------------------------------------------------------------ estimates
class Estimator:
    """The textbook join-size estimate (Garcia-Molina et al., Database Systems, 16.4): the
    product of the atoms' sizes (each first reduced by its constants and repeated variables),
    divided, for every variable shared by several atoms, by all but the smallest of its
    distinct-value counts."""

    def __init__(self, rule: Rule, stats: dict[int, AtomStats]) -> None:
        self.rule = rule
        self.stats = stats
        self._cache: dict[tuple, float] = {}
        # per atom: its size after selections, and per variable its distinct count
        self.sizes: dict[int, float] = {}
        self.domains: dict[int, dict[Variable, float]] = {}
        for position, stat in stats.items():
            atom = rule.body[position]
            size = float(max(stat.size, 1))
            domains: dict[Variable, float] = {}
            for column, term in enumerate(atom.terms):
                values = float(max(stat.distinct[column] if column < len(stat.distinct) else 1, 1))
                if isinstance(term, Constant):
                    size /= values
                elif term in domains:
                    size /= max(values, domains[term])
                    domains[term] = min(values, domains[term])
                else:
                    domains[term] = values
            self.sizes[position] = max(size, 1.0)
            self.domains[position] = {v: min(d, self.sizes[position]) for v, d in domains.items()}

    def join(self, positions: Sequence[int]) -> float:
        key = tuple(sorted(positions))
        found = self._cache.get(key)
        if found is not None:
            return found
        size = 1.0
        per_variable: dict[Variable, list[float]] = {}
        for position in key:
            size *= self.sizes[position]
            for variable, values in self.domains[position].items():
                per_variable.setdefault(variable, []).append(values)
        for values in per_variable.values():
            if len(values) > 1:
                values.sort()
                for extra in values[1:]:
                    size /= extra
        size = max(size, 1.0)
        self._cache[key] = size
        return size

    def projected(self, positions: Sequence[int], variables: Sequence[Variable]) -> float:
        """The join's estimate projected onto ``variables``: at most the product of their
        smallest domains."""
        bound = 1.0
        for variable in variables:
            domains = [self.domains[p][variable] for p in positions if variable in self.domains[p]]
            bound *= min(domains) if domains else 1.0
        return min(self.join(positions), bound)

    def plan_cost(self, positions: Sequence[int]) -> float:
        """The estimated work of joining the atoms at ``positions`` in the planner's order:
        the sum of the estimated sizes of its join prefixes (what nested loops enumerate)."""
        key = ("plan", *sorted(positions))
        found = self._cache.get(key)
        if found is not None:
            return found
        order = sorted(positions)
        items = [self.rule.body[p] for p in order]
        plan = plan_rule(self.rule, items, size_of=lambda i: self.stats[order[i]].size)
        prefix: list[int] = []
        cost = 0.0
        for step in plan.steps:
            if isinstance(step, ScanStep):
                prefix.append(order[step.position])
                cost += self.join(prefix)
        self._cache[key] = cost
        return cost


def seminaive_cost(rule: Rule, stats: dict[int, AtomStats]) -> float:
    """The estimated work of evaluating ``rule`` with the planner's join order."""
    return Estimator(rule, stats).plan_cost(sorted(stats))


# ------------------------------------------------------------------ search
def decompose(rule: Rule, stats: dict[int, AtomStats]) -> Decomposition | None:
    """The cheapest decomposition of two nodes or more found for a cyclic rule, or None for an
    acyclic one, one whose negated atoms cannot be placed (see ``required_sets``) or one whose
    every decomposition is a single node (a 4-clique: the rule itself)."""
    atoms = positive_atoms(rule)
    if is_acyclic([frozenset(a.variables()) for a in atoms.values()]):
        return None
    variables = sorted({v for a in atoms.values() for v in a.variables()}, key=_name)
    required = required_sets(rule, set(variables))
    if required is None:
        return None
    adjacency: dict[Variable, set[Variable]] = {v: set() for v in variables}
    for group in [frozenset(a.variables()) for a in atoms.values()] + required:
        for a, b in itertools.permutations(group, 2):
            adjacency[a].add(b)
    estimator = Estimator(rule, stats)
    covers: dict[frozenset[Variable], tuple[tuple[int, ...], float] | None] = {}
    best: tuple[float, str, Decomposition] | None = None
    seen: set[frozenset[frozenset[Variable]]] = set()
    for order in elimination_orders(variables, adjacency):
        bags = tree_of_bags(order, adjacency)
        if len(bags) < 2:  # one node is the rule itself: nothing to decompose
            continue
        signature = frozenset(b for b, _ in bags)
        if signature in seen:
            continue
        seen.add(signature)
        decomposition = _priced(rule, bags, atoms, estimator, covers)
        if decomposition is None:
            continue
        text = decomposition.describe(rule)
        if best is None or (decomposition.cost, text) < (best[0], best[1]):
            best = (decomposition.cost, text, decomposition)
    return None if best is None else best[2]


def required_sets(rule: Rule, variables: set[Variable]) -> list[frozenset[Variable]] | None:
    """Variable sets that must lie in one bag: a negated atom's variables that occur elsewhere
    in the rule (its others are existential). None when such a variable is bound only by a
    bind (the rule is then left to seminaive evaluation)."""
    required: list[frozenset[Variable]] = []
    for position, item in enumerate(rule.body):
        if not isinstance(item, Negation):
            continue
        shared = negated_shared_variables(rule, position)
        if not shared <= variables:
            return None
        if len(shared) > 1:
            required.append(shared)
    return required


def negated_shared_variables(rule: Rule, position: int) -> frozenset[Variable]:
    """The variables of the negated atom at ``position`` that occur elsewhere in the rule (its
    others are existential)."""
    elsewhere: set[Variable] = set(rule.head.variables())
    for other, item in enumerate(rule.body):
        if other != position:
            elsewhere |= item_variables(item)
    return frozenset(rule.body[position].atom.variables() & elsewhere)


def elimination_orders(
    variables: list[Variable], adjacency: dict[Variable, set[Variable]]
) -> list[list[Variable]]:
    """Greedy min-fill and min-degree elimination orders, one per starting variable."""
    orders: list[list[Variable]] = []
    for first in variables:
        for score in (_fill_in, _degree):
            graph = {v: set(n) for v, n in adjacency.items()}
            order = [first]
            _eliminate(graph, first)
            while graph:
                chosen = min(graph, key=lambda v: (score(graph, v), v.name))
                order.append(chosen)
                _eliminate(graph, chosen)
            orders.append(order)
    return orders


def _eliminate(graph: dict[Variable, set[Variable]], variable: Variable) -> None:
    neighbours = graph.pop(variable)
    for a in neighbours:
        graph[a].discard(variable)
        graph[a] |= neighbours - {a}


def _degree(graph: dict[Variable, set[Variable]], variable: Variable) -> int:
    return len(graph[variable])


def _fill_in(graph: dict[Variable, set[Variable]], variable: Variable) -> int:
    neighbours = sorted(graph[variable], key=_name)
    return sum(1 for a, b in itertools.combinations(neighbours, 2) if b not in graph[a])


def tree_of_bags(
    order: list[Variable], adjacency: dict[Variable, set[Variable]]
) -> list[tuple[frozenset[Variable], int | None]]:
    """The tree decomposition of an elimination order: the bag of each variable is it and its
    neighbours when eliminated; its parent is the bag of the first of those neighbours to be
    eliminated. Bags contained in a neighbouring bag are merged into it. Returns (bag, parent
    index) with parents before children."""
    graph = {v: set(n) for v, n in adjacency.items()}
    position = {v: i for i, v in enumerate(order)}
    bags: list[frozenset[Variable]] = []
    parents: list[int | None] = []
    for variable in order:
        neighbours = set(graph[variable])
        bags.append(frozenset(neighbours | {variable}))
        parents.append(min((position[n] for n in neighbours), default=None))
        _eliminate(graph, variable)
    # Merge a bag into its parent when contained in it, and a parent into a child containing it.
    alive = list(range(len(bags)))
    merged = True
    while merged:
        merged = False
        for index in alive:
            parent = parents[index]
            if parent is None:
                continue
            if bags[index] <= bags[parent] or bags[parent] <= bags[index]:
                keep = parent if bags[index] <= bags[parent] else index
                drop = index if keep == parent else parent
                bags[keep] = bags[keep] | bags[drop]
                for other in alive:
                    if parents[other] == drop:
                        parents[other] = keep
                if keep == index:
                    parents[index] = parents[parent]
                alive.remove(drop)
                merged = True
                break
    # Several roots (a disconnected body): hang them under the first one.
    roots = [i for i in alive if parents[i] is None]
    for extra in roots[1:]:
        parents[extra] = roots[0]
    ordered: list[int] = []

    def visit(index: int) -> None:
        ordered.append(index)
        for child in sorted((i for i in alive if parents[i] == index), key=lambda i: order[i].name):
            visit(child)

    visit(roots[0])
    renumber = {old: new for new, old in enumerate(ordered)}
    return [
        (bags[old], None if parents[old] is None else renumber[parents[old]]) for old in ordered
    ]


def _priced(
    rule: Rule,
    bags: list[tuple[frozenset[Variable], int | None]],
    atoms: dict[int, Atom],
    estimator: Estimator,
    covers: dict,
) -> Decomposition | None:
    """Cover and price a tree of bags, then merge neighbouring bags while that lowers the cost
    (a bigger bag may hold more atoms in full, and so join fewer projected ones)."""
    current = _decomposition(bags, atoms, estimator, covers)
    while current is not None and len(bags) > 2:
        best = current
        for index, (_, parent) in enumerate(bags):
            if parent is None:
                continue
            merged = _merge(bags, parent, index)
            candidate = _decomposition(merged, atoms, estimator, covers)
            if candidate is not None and candidate.cost < best.cost:
                best, best_bags = candidate, merged
        if best is current:
            return current
        current, bags = best, best_bags
    return current


def _merge(
    bags: list[tuple[frozenset[Variable], int | None]], parent: int, child: int
) -> list[tuple[frozenset[Variable], int | None]]:
    """The tree with ``child`` merged into ``parent`` (its children move to ``parent``)."""
    merged: list[tuple[frozenset[Variable], int | None]] = []
    renumber = {old: old - (old > child) for old in range(len(bags)) if old != child}
    for index, (bag, up) in enumerate(bags):
        if index == child:
            continue
        if index == parent:
            bag = bag | bags[child][0]
        if up == child:
            up = parent
        merged.append((bag, None if up is None else renumber[up]))
    return merged


def _decomposition(
    bags: list[tuple[frozenset[Variable], int | None]],
    atoms: dict[int, Atom],
    estimator: Estimator,
    covers: dict,
) -> Decomposition | None:
    nodes: list[TreeNode] = []
    width = 0
    cost = 0.0
    for bag, parent in bags:
        if bag not in covers:
            covers[bag] = _cheapest_cover(bag, atoms, estimator)
        found = covers[bag]
        if found is None:
            return None
        cover, needed, size = found
        width = max(width, needed)
        cost += estimator.plan_cost(cover)  # the in-node join
        nodes.append(TreeNode(tuple(sorted(bag, key=_name)), cover, parent, size))
    for node in nodes:
        if node.parent is not None:  # the semi-joins between neighbours
            cost += 2 * (node.estimate + nodes[node.parent].estimate)
    return Decomposition(tuple(nodes), width, cost)


def _cheapest_cover(
    bag: frozenset[Variable], atoms: dict[int, Atom], estimator: Estimator
) -> tuple[tuple[int, ...], int, float] | None:
    """The atoms a node joins: the cheapest among the smallest sets of atoms covering the bag's
    variables (their number is the node's width), plus every other atom whose variables all lie
    in the bag (a free filter). Returns the positions, the width and the estimated size."""
    edges = {p: frozenset(a.variables()) for p, a in atoms.items()}
    inside = [p for p, edge in edges.items() if edge <= bag]
    touching = [p for p, edge in edges.items() if edge & bag]
    variables = sorted(bag, key=_name)
    for size in range(1, len(touching) + 1):
        best: tuple[float, tuple[int, ...]] | None = None
        for chosen in itertools.combinations(touching, size):
            reached = frozenset().union(*(edges[p] for p in chosen))
            if not bag <= reached:
                continue
            cover = tuple(sorted({*inside, *chosen}))
            estimate = estimator.projected(cover, variables)
            if best is None or (estimate, cover) < best:
                best = (estimate, cover)
        if best is not None:
            return best[1], size, best[0]
    return None


def _name(variable: Variable) -> str:
    return variable.name
