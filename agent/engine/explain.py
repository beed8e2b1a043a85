"""Derivation trees for ``Reasoner.explain``: why does a fact hold?

A proof of a derived fact is a rule instance whose positive premises are themselves proved;
explicit facts are leaves. Explanations are interactive, so they must come back at once even
for a fact of a large recursive relation, and the tree must be one a reader can follow: of
minimal height, not the first proof a depth-first search stumbles on (which for a transitive
relation over a chain of n edges can have n levels, and costs exponential time to find).

The search never goes round in circles because every fact that holds is provable (the
materialisation is exact) and hyper-nodes are evaluated in topological order. A fact is
explained by the *lowest* hyper-node holding it (the EDB first); a premise held by a lower
hyper-node is a separate, smaller question. Only premises held by the same hyper-node need a
search for a well-founded proof, and that search is local to the hyper-node:

* **closure hyper-nodes** (transitive, symmetric-transitive: ``modules.patterns``): the fact
  ``R(a, b)`` is read off a shortest path from a to b over the hyper-node's input edges
  (breadth-first), split in the middle recursively, so the tree has ``log2(path length)``
  levels of the transitivity rule and one leaf per edge;
* **other recursive hyper-nodes**: the instances deriving the fact, and those deriving their
  same-node premises, are collected (goal-directed), then ranked bottom-up level by level
  (Knuth's generalisation of Dijkstra's algorithm for the cost "1 + the highest premise"): the
  tree found has the fewest levels of the hyper-node's rules;
* **non-recursive hyper-nodes**: the first instance (all its premises are lower facts);
* **aggregate hyper-nodes**: the aggregate fact, with what it aggregated over.

Trees share subtrees (a fact proved once is reused), and printing shows a repeated fact once.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from agent.engine import values
from agent.engine.equality.facts import solve, whole_body
from agent.engine.errors import ZodiacError
from agent.engine.gcpause import collector_paused
from agent.engine.language import (
    Aggregate,
    Atom,
    Bind,
    Comparison,
    Constant,
    Negation,
    Rule,
    Variable,
    fact_atom,
    format_value,
)
from agent.engine.modules.shapes import (
    ClosurePattern,
    detect_closure,
    symmetric_shape,
    transitive_shape,
)
from agent.engine.plan.planner import BindStep, FilterStep, NegationStep, Plan, ScanStep, plan_rule
from agent.engine.program.heads import BODY_PREFIX
from agent.engine.storage.store import Relation, RelationKey
from agent.engine.storage.view import MaterialisedView, NodeView
from agent.engine.values import EVAL_ERRORS

if TYPE_CHECKING:  # pragma: no cover
    from agent.engine.equality.layer import EqualityLayer

# Rule-body steps one explanation may take (a guard against pathological programs, not a
# limit any benchmark program comes near).
SEARCH_BUDGET = 2_000_000

Fact = tuple[RelationKey, tuple[int, ...]]


@dataclass(eq=False)
class Derivation:
    """``fact`` holds because it is explicit (``rule is None``) or by ``rule`` from
    ``premises``, while each fact in ``absent`` (from negated atoms) does not hold."""

    fact: tuple
    rule: str | None = None
    premises: list[Derivation] = field(default_factory=list)
    absent: list[str] = field(default_factory=list)
    detail: str = ""

    @property
    def explicit(self) -> bool:
        return self.rule is None

    @property
    def height(self) -> int:
        """Levels of rule applications above the leaves (0 for an explicit fact)."""
        heights: dict[int, int] = {}
        for node in self._postorder():
            below = (heights[id(p)] for p in node.premises)
            heights[id(node)] = 0 if node.explicit else 1 + max(below, default=0)
        return heights[id(self)]

    @property
    def size(self) -> int:
        """Distinct facts in the tree (a fact used twice counts once)."""
        return len({node.fact for node in self._postorder()})

    def _postorder(self) -> list[Derivation]:
        """Every node once, premises before the facts they prove (no recursion: a tree over a
        long chain is deeper than Python's stack)."""
        order: list[Derivation] = []
        done: set[int] = set()
        stack: list[tuple[Derivation, bool]] = [(self, False)]
        while stack:
            node, expanded = stack.pop()
            if id(node) in done:
                continue
            if expanded:
                done.add(id(node))
                order.append(node)
                continue
            stack.append((node, True))
            stack.extend((p, False) for p in reversed(node.premises) if id(p) not in done)
        return order

    def lines(self, max_depth: int | None = None) -> list[str]:
        """The tree, one fact per line, indented by depth. A fact shown already is printed
        again without its premises; below ``max_depth`` levels premises are summarised."""
        out: list[str] = []
        shown: set[tuple] = set()
        stack: list[tuple[Derivation, int]] = [(self, 0)]
        while stack:
            node, depth = stack.pop()
            if isinstance(node, str):  # an absent fact of the node above
                out.append(f"{'  ' * depth}not {node}   [absent]")
                continue
            pad = "  " * depth
            how = "explicit" if node.rule is None else f"by rule {node.rule}"
            extra = f" ({node.detail})" if node.detail else ""
            if node.premises and node.fact in shown:
                out.append(f"{pad}{_format_fact(node.fact)}   [{how}, shown above]")
                continue
            out.append(f"{pad}{_format_fact(node.fact)}   [{how}{extra}]")
            shown.add(node.fact)
            if max_depth is not None and depth >= max_depth and (node.premises or node.absent):
                hidden = node.size - 1
                out.append(f"{pad}  ... {hidden} more fact(s) below, not shown")
                continue
            children: list = [(p, depth + 1) for p in node.premises]
            children += [(a, depth + 1) for a in node.absent]
            stack.extend(reversed(children))
        return out

    def __str__(self) -> str:
        return "\n".join(self.lines())


def _format_fact(fact: tuple) -> str:
    """A fact in rule syntax (``<m>(<a>, 30)``, a class fact ``<C>(<x>)``): what a reader
    can give back to ``zodiac-edge explain --fact`` or ``query``."""
    return str(fact_atom(fact))


@dataclass
class _Instance:
    """One rule instance found while searching a recursive hyper-node."""

    rule: Rule
    head: Fact
    binding: dict[Variable, int]
    premises: list[Fact]  # every positive premise, in body order
    waiting: int  # same-node premises not ranked yet


class _Explainer:
    """One explanation: memoised proofs of the facts it has needed so far."""

    def __init__(self, view: MaterialisedView) -> None:
        self.view = view
        self.terms = view.terms
        self.values = view.terms.values
        self.proved: dict[Fact, Derivation] = {}
        self.steps = 0
        self.plans: dict[tuple[Rule, frozenset[Variable]], Plan] = {}
        self.closures: dict[str, ClosurePattern | None] = {}  # hyper-node name -> its shape

    # ------------------------------------------------------------------ dispatch
    def prove(self, key: RelationKey, args: tuple[int, ...]) -> Derivation:
        fact = (key, args)
        found = self.proved.get(fact)
        if found is not None:
            return found
        if self.view.explicit(key, args):
            found = Derivation(self.view.external(key, args))
        else:
            node = self.lowest_holder(key, args)
            if node is None:
                raise ZodiacError(f"explain: {self.view.external(key, args)!r} does not hold")
            found = self.prove_in(node, key, args)
        self.proved[fact] = found
        return found

    def lowest_holder(self, key: RelationKey, args: tuple[int, ...]) -> NodeView | None:
        """The first hyper-node in evaluation order whose IDB holds the fact."""
        for node in self.view.nodes:
            relation = node.store.get(key)
            if relation is not None and args in relation:
                return node
        return None

    def prove_in(self, node: NodeView, key: RelationKey, args: tuple[int, ...]) -> Derivation:
        rules = [rule for rule in node.rules if rule.head.relation == key]
        for rule in rules:
            aggregate = rule.aggregate()
            if aggregate is not None:
                return self.aggregate_proof(rule, aggregate, key, args)
        if node.name not in self.closures:
            self.closures[node.name] = detect_closure(node.rules)
        closure = self.closures[node.name]
        if closure is not None and closure.relation == key:
            found = self.closure_proof(node, key, args)
            if found is not None:
                return found
        if not node.recursive:
            for rule in rules:
                for binding in self.matches(rule, args):
                    return self.instance_proof(rule, key, args, binding)
            raise ZodiacError(
                f"explain: no rule instance derives {self.view.external(key, args)!r}"
            )
        return self.ranked_proof(node, (key, args))

    # ------------------------------------------------------------------ rule instances
    def instance_proof(
        self,
        rule: Rule,
        key: RelationKey,
        args: tuple[int, ...],
        binding: dict[Variable, int],
        premises: list[Fact] | None = None,
    ) -> Derivation:
        """The rule instance's tree; ``premises`` are its positive premises if known."""
        if premises is None:
            premises = self.premises_of(rule, binding)
        proofs = [self.prove(*premise) for premise in premises]
        absent = [
            self.describe_negated(item.atom, binding)
            for item in rule.body
            if isinstance(item, Negation)
        ]
        return Derivation(self.view.external(key, args), rule.id, proofs, absent)

    def premises_of(self, rule: Rule, binding: dict[Variable, int]) -> list[Fact]:
        return [
            (item.relation, tuple(self.term_id(t, binding) for t in item.terms))
            for item in rule.body
            if isinstance(item, Atom)
        ]

    def aggregate_proof(
        self, rule: Rule, aggregate: Aggregate, key: RelationKey, args: tuple[int, ...]
    ) -> Derivation:
        return Derivation(
            self.view.external(key, args),
            rule.id,
            detail=f"{aggregate.function} over the matches of the aggregate body",
        )

    # ------------------------------------------------------------------ closures
    def closure_proof(
        self, node: NodeView, key: RelationKey, args: tuple[int, ...]
    ) -> Derivation | None:
        """``R(a, b)`` from a shortest path a -> b over the node's input edges (the R facts
        of lower stores; read backwards too when the node holds the symmetric rule)."""
        transitive = next(rule for rule in node.rules if transitive_shape(rule) is not None)
        symmetric = next((rule for rule in node.rules if symmetric_shape(rule) is not None), None)
        own = node.store.get(key)
        edges = [relation for relation in self.view.holders(key) if relation is not own]
        path = _shortest_path(edges, args[0], args[1], backwards=symmetric is not None)
        if path is None:
            return None
        body = [item for item in transitive.body if isinstance(item, Atom)]
        left_first = body[0].terms[0] == transitive.head.terms[0]

        def edge(u: int, v: int) -> Derivation:
            if any((u, v) in relation for relation in edges):
                return self.prove(key, (u, v))
            found = self.proved.get((key, (u, v)))
            if found is None:
                assert symmetric is not None
                found = Derivation(self.view.external(key, (u, v)), symmetric.id)
                found.premises.append(self.prove(key, (v, u)))
                self.proved[(key, (u, v))] = found
            return found

        def segment(i: int, j: int) -> Derivation:
            if j == i + 1:
                return edge(path[i], path[j])
            fact = (key, (path[i], path[j]))
            found = self.proved.get(fact)
            if found is None:
                middle = (i + j) // 2
                left, right = segment(i, middle), segment(middle, j)
                pair = [left, right] if left_first else [right, left]
                found = Derivation(self.view.external(*fact), transitive.id, pair)
                self.proved[fact] = found
            return found

        return segment(0, len(path) - 1)

    # ------------------------------------------------------------------ recursive nodes
    def ranked_proof(self, node: NodeView, goal: Fact) -> Derivation:
        """A proof of ``goal`` with the fewest levels of ``node``'s rules (module docstring)."""
        heads = {rule.head.relation for rule in node.rules}
        rules_by_head: dict[RelationKey, list[Rule]] = {}
        for rule in node.rules:
            rules_by_head.setdefault(rule.head.relation, []).append(rule)

        def same_node(fact: Fact) -> bool:
            key, args = fact
            return (
                key in heads
                and fact not in self.proved
                and not self.view.explicit(key, args)
                and self.lowest_holder(key, args) is node
            )

        # Goal-directed: every instance deriving the goal or a same-node premise of one.
        instances: list[_Instance] = []
        users: dict[Fact, list[_Instance]] = {}
        seen = {goal}
        todo = [goal]
        while todo:
            key, args = todo.pop()
            for rule in rules_by_head.get(key, ()):
                for binding in self.matches(rule, args):
                    premises = self.premises_of(rule, binding)
                    inner = {p for p in premises if same_node(p)}
                    instance = _Instance(rule, (key, args), binding, premises, len(inner))
                    instances.append(instance)
                    for premise in inner:
                        users.setdefault(premise, []).append(instance)
                        if premise not in seen:
                            seen.add(premise)
                            todo.append(premise)
        # Bottom-up, level by level: an instance is ready when its same-node premises are.
        chosen: dict[Fact, _Instance] = {}
        ready = [instance for instance in instances if instance.waiting == 0]
        while ready and goal not in chosen:
            ranked = []
            for instance in ready:
                if instance.head not in chosen:
                    chosen[instance.head] = instance
                    ranked.append(instance.head)
            ready = []
            for fact in ranked:
                for instance in users.get(fact, ()):
                    instance.waiting -= 1
                    if instance.waiting == 0:
                        ready.append(instance)
        if goal not in chosen:
            raise ZodiacError(f"explain: found no derivation for {self.view.external(*goal)!r}")
        # Build the chosen instances' trees, premises first (iteratively: chains are deep).
        order: list[Fact] = []
        stack: list[tuple[Fact, bool]] = [(goal, False)]
        visited: set[Fact] = set()
        while stack:
            fact, expanded = stack.pop()
            if expanded:
                order.append(fact)
                continue
            if fact in visited:
                continue
            visited.add(fact)
            stack.append((fact, True))
            for premise in chosen[fact].premises:
                if premise in chosen and premise not in visited:
                    stack.append((premise, False))
        for fact in order:
            instance = chosen[fact]
            self.proved[fact] = self.instance_proof(
                instance.rule, fact[0], fact[1], instance.binding, instance.premises
            )
        return self.proved[goal]

    # ------------------------------------------------------------------ matching a body
    def term_id(self, term, binding: dict[Variable, int]) -> int:
        if isinstance(term, Variable):
            return binding[term]
        found = self.terms.lookup(term.value)
        return -1 if found is None else found

    def describe_negated(self, atom: Atom, binding: dict[Variable, int]) -> str:
        """The negated atom in rule syntax, its bound variables replaced by their values
        (those left, such as an anonymous ``_``, stay variables: no fact of that shape holds)."""
        values = self.values
        terms = tuple(
            Constant(values[binding[term]])
            if isinstance(term, Variable) and term in binding
            else term
            for term in atom.terms
        )
        return str(Atom(atom.predicate, terms))

    def matches(self, rule: Rule, head_args: tuple[int, ...]) -> Iterator[dict[Variable, int]]:
        """Every binding of the rule's body (over the whole materialisation) whose head is
        the given fact."""
        binding: dict[Variable, int] = {}
        for term, value in zip(rule.head.terms, head_args, strict=True):
            if isinstance(term, Constant):
                if self.term_id(term, binding) != value:
                    return
            elif binding.setdefault(term, value) != value:
                return
        bound = frozenset(binding)
        plan = self.plans.get((rule, bound))
        if plan is None:
            body = rule.body

            def size_of(position: int) -> int:
                item = body[position]
                if not isinstance(item, Atom):
                    return 0
                return sum(len(relation) for relation in self.view.holders(item.relation))

            plan = self.plans[(rule, bound)] = plan_rule(
                rule, size_of=size_of, initially_bound=bound
            )
        yield from self.walk(plan.steps, 0, binding)

    def walk(self, steps: tuple, index: int, binding: dict[Variable, int]):
        self.steps += 1
        if self.steps > SEARCH_BUDGET:
            raise ZodiacError("explain: the search for a derivation exceeded its budget")
        if index == len(steps):
            yield dict(binding)
            return
        step = steps[index]
        if isinstance(step, ScanStep):
            for extended in self.match_atom(step.atom, binding):
                yield from self.walk(steps, index + 1, extended)
        elif isinstance(step, NegationStep):
            if not any(True for _ in self.match_atom(step.atom, binding)):
                yield from self.walk(steps, index + 1, binding)
        elif isinstance(step, FilterStep):
            if self.compare(step.comparison, binding):
                yield from self.walk(steps, index + 1, binding)
        elif isinstance(step, BindStep):
            value = self.bind(step.bind, binding)
            bound = binding.get(step.bind.variable)
            if value is not None and (bound is None or bound == value):
                yield from self.walk(steps, index + 1, {**binding, step.bind.variable: value})

    def match_atom(self, atom: Atom, binding: dict[Variable, int]) -> Iterator[dict]:
        bound_columns = []
        wanted = []
        for column, term in enumerate(atom.terms):
            if isinstance(term, Constant) or term in binding:
                bound_columns.append(column)
                wanted.append(self.term_id(term, binding))
        seen: set[tuple[int, ...]] = set()
        for relation in self.view.holders(atom.relation):
            for fact in _candidates(relation, bound_columns, wanted):
                if fact in seen:
                    continue
                seen.add(fact)
                extended = dict(binding)
                ok = True
                for term, value in zip(atom.terms, fact, strict=True):
                    if isinstance(term, Variable) and extended.setdefault(term, value) != value:
                        ok = False
                        break
                if ok:
                    yield extended

    def value_of(self, binding: dict[Variable, int]):
        return lambda variable: self.values[binding[variable]]

    def compare(self, comparison: Comparison, binding: dict[Variable, int]) -> bool:
        try:
            return values.compare(comparison, self.value_of(binding))
        except EVAL_ERRORS:
            return False

    def bind(self, bind: Bind, binding: dict[Variable, int]) -> int | None:
        try:
            return self.terms.encode(values.evaluate(bind.expr, self.value_of(binding)))
        except EVAL_ERRORS:
            return None


def _candidates(relation: Relation, bound_columns: list[int], wanted: list[int]):
    """The facts of ``relation`` that agree with ``wanted`` on ``bound_columns`` (through
    an index when some but not all columns are bound)."""
    if len(bound_columns) == relation.arity:
        fact = tuple(wanted)
        return [fact] if fact in relation else []
    if not bound_columns:
        return relation
    index = relation.index(tuple(bound_columns))
    key = wanted[0] if len(wanted) == 1 else tuple(wanted)
    free = [c for c in range(relation.arity) if c not in bound_columns]
    rows = []
    for rest in index.get(key, ()):
        rest = (rest,) if len(free) == 1 else rest
        fact = [0] * relation.arity
        for c, w in zip(bound_columns, wanted, strict=True):
            fact[c] = w
        for c, v in zip(free, rest, strict=True):
            fact[c] = v
        rows.append(tuple(fact))
    return rows


def _shortest_path(
    edges: list[Relation], source: int, target: int, *, backwards: bool
) -> list[int] | None:
    """The vertices of a shortest walk of at least one edge from ``source`` to ``target``
    (breadth-first), following edges forwards, and backwards too if asked."""
    forward = [relation.index((0,)) for relation in edges]
    reverse = [relation.index((1,)) for relation in edges] if backwards else []

    def neighbours(u: int) -> Iterator[int]:
        for index in forward:
            yield from index.get(u, ())
        for index in reverse:
            yield from index.get(u, ())

    parent: dict[int, int] = {}
    queue: deque[int] = deque()
    for v in neighbours(source):
        if v == target:
            return [source, target]
        if v not in parent:
            parent[v] = source
            queue.append(v)
    while queue:
        u = queue.popleft()
        for v in neighbours(u):
            if v == target:
                path = [target]
                while u != source:
                    path.append(u)
                    u = parent[u]
                path.append(source)
                return path[::-1]
            if v in parent or v == source:
                continue
            parent[v] = u
            queue.append(v)
    return None


def explain_fact(
    view: MaterialisedView,
    key: RelationKey,
    args: tuple[int, ...],
    rule_names: dict[str, str] | None = None,
) -> Derivation:
    """A derivation tree of a fact; ``rule_names`` (content key -> name) names the rules a
    multi-head rule was split into (heads.py) after it: a step through its hidden body fact
    is shown as one step by the rule, from the body's premises."""
    # A tree over a long chain is thousands of objects: without the pause, the collector's
    # passes over the whole materialisation cost more than the search (gcpause.py).
    with collector_paused():
        tree = _Explainer(view).prove(key, args)
        return _without_body_steps(tree, rule_names or {})


# The name of the step that replaces names by equal ones (owl:sameAs), in explanations.
EQUALITY_STEP = "owl:sameAs"


def explain_with_equality(
    view: MaterialisedView,
    layer: EqualityLayer,
    key: RelationKey,
    args: tuple[int, ...],
    rule_names: dict[str, str] | None = None,
) -> Derivation:
    """A derivation tree of a fact of the expanded model (``view`` reads the stores in normal
    form, see ``sameas/expansion.py``): the tree of its normal form, with a step by
    ``owl:sameAs`` wherever names were replaced by equal ones (the fact asked for, and each
    explicit fact given under other names), naming the merges; a fact the equality
    component derived is a leaf saying so."""
    classes = layer.classes
    values = view.terms.values
    external = view.external

    def merges(given: tuple[int, ...], normal: tuple[int, ...]) -> str:
        pairs = dict.fromkeys((a, b) for a, b in zip(given, normal, strict=True) if a != b)
        return ", ".join(
            f"{format_value(values[a])} = {format_value(values[b])} "
            f"(one of {classes.size(b)} names)"
            for a, b in pairs
        )

    def leaf(fact_key: RelationKey, normal: tuple[int, ...]) -> Derivation:
        fact = (fact_key, normal)
        if layer.is_explicit(fact):
            return Derivation(external(fact_key, normal))
        given = sorted(layer.given_as(fact))
        if given:
            original = given[0][1]
            return Derivation(
                external(fact_key, normal),
                EQUALITY_STEP,
                [Derivation(external(fact_key, original))],
                detail=merges(original, normal),
            )
        return component_proof(fact, set())

    def component_proof(fact, visiting: set) -> Derivation:
        """A fact the equality component derived: a rule instance deriving it from facts of
        the component (each explained the same way; one met again on the way is cut)."""
        component = layer.component
        visiting.add(fact)
        for rule, sigma in component.index.match_head(component.normal_rules, fact):
            for tau in solve(whole_body(rule), component.store, sigma):
                body = [atom.ground(tau) for atom in rule.body]
                if any(premise in visiting for premise in body):
                    continue
                premises = [
                    leaf(*premise)
                    if premise[0] not in layer.relations
                    or premise in component.explicit
                    or premise not in component.store
                    else component_proof(premise, visiting)
                    for premise in body
                ]
                return Derivation(external(*fact), rule.source.id, premises)
        return Derivation(external(*fact), detail="derived by the rules deciding equality")

    def rewrite(tree: Derivation, done: dict[int, Derivation]) -> Derivation:
        found = done.get(id(tree))
        if found is not None:
            return found
        if tree.rule is None:
            fact_key, normal = view.terms.lookup_fact(tree.fact)
            node = leaf(fact_key, normal) if fact_key is not None else tree
        else:
            node = tree
            node.premises = [rewrite(p, done) for p in tree.premises]
        done[id(tree)] = node
        return node

    normal = classes.normal(args)
    tree = rewrite(explain_fact(view, key, normal, rule_names), {})
    if normal == args:
        return tree
    return Derivation(external(key, args), EQUALITY_STEP, [tree], detail=merges(args, normal))


def _without_body_steps(tree: Derivation, names: dict[str, str]) -> Derivation:
    """The tree with each multi-head rule's body step folded into its head step, named by the
    rule's label. Iterative, with a stack: a derivation of a long chain that no closure module
    shortens is as high as the chain, deeper than Python's recursion limit."""
    done: dict[int, Derivation] = {}
    stack = [tree]
    while stack:
        current = stack.pop()
        if id(current) in done:
            continue
        node = current
        owner, _, part = (current.rule or "").rpartition(".")
        if (
            part.startswith("head")
            and len(current.premises) == 1
            and str(current.premises[0].fact[0]).startswith(BODY_PREFIX)
        ):
            body = current.premises[0]
            node = Derivation(current.fact, names.get(owner, owner), body.premises, body.absent)
        done[id(current)] = node
        stack.extend(p for p in node.premises if id(p) not in done)
    for node in {id(node): node for node in done.values()}.values():
        node.premises = [done[id(p)] for p in node.premises]
    return done[id(tree)]


__all__ = ["Derivation", "explain_fact", "explain_with_equality"]
