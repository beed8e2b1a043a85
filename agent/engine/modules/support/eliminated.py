"""Set-at-a-time evaluation of a cyclic rule over binary relations, by eliminating its body
variables one at a time (a decomposition whose nodes hold at most three variables, each
projected onto two as soon as it is joined).

Why: over skewed graphs (a few hubs, a few dominant labels) a cyclic body such as a 6-cycle
has orders of magnitude more instantiations than its head has facts, and any join order, or a
decomposition node joining a path of atoms, enumerates them one by one. Its head projects two
variables, so what is needed of each part of the body is only which pairs of values it
connects. Every relation and every intermediate result here is such a set of pairs, kept as a
dict from a value to a pyroaring bitmap of the values it is paired with:

* eliminating ``v`` from ``B1(x, v)`` and ``B2(v, y)`` gives ``F(x, y)`` with ``F[x]`` the
  union of ``B2[v]`` over ``v`` in ``B1[x]`` (one C-level many-way union per ``x``); a factor
  ``U(v)`` filters the ``v``; with no ``y`` the result is the union alone, a set of ``x``;
* factors over the same variables are intersected (bitmap ANDs).

So an intermediate result never holds more than a pair per two values, and the work is the
edges read plus the pairs produced, never the instantiations. The variables are eliminated
greedily (the one whose factors are smallest) among those whose elimination leaves a factor of
at most two variables: a rule qualifies (``elimination_applies``) when that succeeds for every
variable not in the head, its body being positive atoms of one or two variables and its head
one or two distinct variables (6-cycles, petals, flowers, recursive triangles; a 4-clique does
not: each of its variables has three neighbours).

Maintenance is by deltas, as ``PlannedRule``'s: the heads of instances using a new (deleted)
fact are the union, over the body positions with changes, of the evaluation with that position
reading the changed facts and the others the new (old) state. The changed facts' values are
first propagated around the body (each atom narrows its other variable to the values its facts
pair with the known ones: arc consistency, sound for every instance), so an update's
evaluation reads the neighbourhood it reaches, not the relations. Rederivation evaluates the
rule with its head variables narrowed to the candidates' values.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from pyroaring import BitMap

from agent.engine.language import Atom, Rule, Variable
from agent.engine.modules.base import by_column
from agent.engine.plan.decomposition import AtomStats, is_cyclic_rule
from agent.engine.plan.executor import Executor
from agent.engine.storage.changes import Facts
from agent.engine.storage.store import DataStoreBag, Relation, RelationKey

Pairs = dict[int, BitMap]
EMPTY = BitMap()


# ------------------------------------------------------------------ which rules
def elimination_applies(rule: Rule) -> bool:
    """A cyclic rule of positive atoms over one or two variables each (no constants, no
    repeated variable), a head of one or two distinct variables, and an elimination order of
    the other variables that keeps every factor within two variables."""
    if not is_cyclic_rule(rule):
        return False
    head = rule.head.terms
    if not 1 <= len(head) <= 2 or not all(isinstance(t, Variable) for t in head):
        return False
    if len(set(head)) != len(head):
        return False
    edges: list[frozenset[Variable]] = []
    for item in rule.body:
        if not isinstance(item, Atom) or not 1 <= item.arity <= 2:
            return False
        if not all(isinstance(t, Variable) for t in item.terms):
            return False
        if len(set(item.terms)) != item.arity:
            return False
        edges.append(frozenset(item.terms))
    if not set(head) <= set().union(*edges):
        return False
    return elimination_order(edges, frozenset(head)) is not None


def elimination_order(
    edges: Sequence[frozenset[Variable]], keep: frozenset[Variable]
) -> list[Variable] | None:
    """An order eliminating every variable outside ``keep`` whose every step joins factors
    over at most two other variables, or None (any such variable may go first: eliminating it
    only merges edges)."""
    factors = [set(edge) for edge in edges]
    order: list[Variable] = []
    left = sorted({v for edge in edges for v in edge} - keep, key=lambda v: v.name)
    while left:
        for variable in left:
            others = set().union(*(f for f in factors if variable in f)) - {variable}
            if len(others) <= 2:
                break
        else:
            return None
        factors = [f for f in factors if variable not in f] + [others]
        order.append(variable)
        left.remove(variable)
    return order


def elimination_cost(rule: Rule, stats: dict[int, AtomStats]) -> float:
    """The estimated work of one evaluation, in the units of ``seminaive_cost`` (facts read or
    tuples produced): per step the pairs read from its factors plus the pairs it produces
    (estimated as the textbook join size, at most the product of the two variables' distinct
    values); a step's unions run in C, and count once per pair read."""
    sizes: list[tuple[frozenset[Variable], float, dict[Variable, float]]] = []
    for position, item in enumerate(rule.body):
        stat = stats.get(position, AtomStats(1, (1,) * item.arity))
        domains = {t: float(max(1, stat.distinct[c])) for c, t in enumerate(item.terms)}
        sizes.append((frozenset(item.terms), float(max(1, stat.size)), domains))
    order = elimination_order([s[0] for s in sizes], frozenset(rule.head.terms)) or []
    cost = 0.0
    for variable in order:
        joined = [s for s in sizes if variable in s[0]]
        rest = [s for s in sizes if variable not in s[0]]
        others = frozenset().union(*(s[0] for s in joined)) - {variable}
        read = sum(s[1] for s in joined)
        size = 1.0
        for s in joined:
            size *= s[1]
        domain = [s[2][variable] for s in joined]
        domain.sort()
        for extra in domain[1:]:
            size /= extra
        domains: dict[Variable, float] = {}
        for s in joined:
            for v, d in s[2].items():
                if v != variable:
                    domains[v] = min(d, domains.get(v, d))
        bound = 1.0
        for v in others:
            bound *= domains[v]
        size = max(1.0, min(size, bound))
        cost += read + size
        sizes = [*rest, (others, size, domains)]
    return cost + sum(s[1] for s in sizes)


# ------------------------------------------------------------------ factors
class Factor:
    """A set of pairs (or of values, or a truth value) over ``variables``, kept keyed by one
    of them and turned around on demand (a transposition is a Python step per pair)."""

    def __init__(self, variables: tuple[Variable, ...], keyed: dict | None = None) -> None:
        self.variables = variables
        self.keyed: dict[Variable, Pairs] = keyed or {}
        self.values: BitMap | None = None  # a factor of one variable
        self.holds = True  # a factor of no variable

    @classmethod
    def unary(cls, variable: Variable, values: BitMap) -> Factor:
        factor = cls((variable,))
        factor.values = values
        return factor

    def by(self, variable: Variable) -> Pairs:
        found = self.keyed.get(variable)
        if found is None:
            source_variable, source = next(iter(self.keyed.items()))
            assert source_variable != variable
            turned: dict[int, list[int]] = {}
            for key, values in source.items():
                for value in values:
                    bucket = turned.get(value)
                    if bucket is None:
                        turned[value] = [key]
                    else:
                        bucket.append(key)
            found = self.keyed[variable] = {k: BitMap(v) for k, v in turned.items()}
        return found

    def size(self) -> int:
        if len(self.variables) == 2:
            pairs = next(iter(self.keyed.values()))
            return sum(map(len, pairs.values()))
        if len(self.variables) == 1:
            return len(self.values or EMPTY)
        return 1


def intersect_pairs(a: Pairs, b: Pairs) -> Pairs:
    if len(b) < len(a):
        a, b = b, a
    found: Pairs = {}
    for key, values in a.items():
        other = b.get(key)
        if other is not None:
            both = values & other
            if both:
                found[key] = both
    return found


def restrict_pairs(pairs: Pairs, keys: BitMap | None, values: BitMap | None) -> Pairs:
    if keys is not None:
        if len(keys) < len(pairs):
            pairs = {k: pairs[k] for k in keys if k in pairs}
        else:
            pairs = {k: v for k, v in pairs.items() if k in keys}
    if values is not None:
        narrowed: Pairs = {}
        for key, found in pairs.items():
            kept = found & values
            if kept:
                narrowed[key] = kept
        pairs = narrowed
    return pairs


def union_of(pairs: Pairs, keys: Iterable[int]) -> BitMap:
    return BitMap().union(*[pairs[k] for k in keys if k in pairs])


# ------------------------------------------------------------------ reading relations
class Facts2:
    """The facts of one relation (in one state) by either column, converted to bitmaps a key
    at a time as they are read, shared by every body position reading it in one evaluation."""

    def __init__(self, relations: Sequence[Relation | set]) -> None:
        self.relations = [r for r in relations if len(r)]
        self._raw: dict[int, list[dict]] = {}
        self._bits: dict[int, Pairs] = {}
        self._full: set[int] = set()

    def raw(self, column: int) -> list[dict]:
        found = self._raw.get(column)
        if found is None:
            found = []
            for relation in self.relations:
                if isinstance(relation, Relation):
                    found.append(by_column(relation, column))
                else:
                    index: dict[int, list[int]] = {}
                    for row in relation:
                        index.setdefault(row[column], []).append(row[1 - column])
                    found.append(index)
            self._raw[column] = found
        return found

    def get(self, column: int, key: int) -> BitMap | None:
        bits = self._bits.setdefault(column, {})
        if key in bits:
            return bits[key]
        if column in self._full:
            return None
        found = None
        for index in self.raw(column):
            values = index.get(key)
            if values:
                values = values if values.__class__ is BitMap else BitMap(values)
                found = values if found is None else found | values
        bits[key] = found
        return found

    def count(self, column: int) -> int:
        return sum(len(index) for index in self.raw(column))

    def full(self, column: int) -> Pairs:
        if column not in self._full:
            keys: set[int] = set()
            for index in self.raw(column):
                keys.update(index.keys())
            for key in keys:
                self.get(column, key)
            self._full.add(column)
            bits = self._bits[column] = {
                k: v for k, v in self._bits.get(column, {}).items() if v is not None
            }
            return bits
        return self._bits[column]

    def narrowed(self, column: int, keys: BitMap) -> Pairs:
        if len(keys) * 2 > self.count(column):
            full = self.full(column)
            return {k: full[k] for k in keys if k in full}
        found: Pairs = {}
        for key in keys:
            bits = self.get(column, key)
            if bits is not None:
                found[key] = bits
        return found

    def values(self) -> BitMap:
        found = BitMap()
        for relation in self.relations:
            found |= BitMap(row[0] for row in relation)
        return found


class Source:
    """What one body position reads: its atom and the facts of its relation."""

    def __init__(self, atom: Atom, facts: Facts2) -> None:
        self.atom = atom
        self.facts = facts

    def reached(self, column: int, keys: BitMap) -> BitMap:
        """The values paired (at the other column) with ``keys`` at ``column``."""
        get = self.facts.get
        return BitMap().union(*[b for b in (get(column, k) for k in keys) if b is not None])

    def factor(self, domains: dict[Variable, BitMap]) -> Factor:
        terms = self.atom.terms
        if len(terms) == 1:
            values = self.facts.values()
            if terms[0] in domains:
                values &= domains[terms[0]]
            return Factor.unary(terms[0], values)
        x, y = terms
        column = 0
        if y in domains and (x not in domains or len(domains[y]) < len(domains[x])):
            column = 1  # keyed by the narrower variable
        keyed = terms[column]
        pairs = (
            self.facts.narrowed(column, domains[keyed])
            if keyed in domains
            else self.facts.full(column)
        )
        pairs = restrict_pairs(pairs, None, domains.get(terms[1 - column]))
        return Factor((x, y), {keyed: pairs})


# ------------------------------------------------------------------ evaluation
def propagate(sources: Sequence[Source], domains: dict[Variable, BitMap]) -> None:
    """Arc consistency from the narrowed variables: each binary atom narrows one of its
    variables to the values its facts pair with the other's, until nothing narrows (or every
    atom was used as often as there are atoms)."""
    for _ in range(len(sources)):
        changed = False
        for source in sources:
            if source.atom.arity != 2:
                continue
            for column in (0, 1):
                known, other = source.atom.terms[column], source.atom.terms[1 - column]
                if known not in domains:
                    continue
                if len(domains[known]) * 2 > source.facts.count(column) and other in domains:
                    continue  # (wide: narrows little, costs a pass)
                reached = source.reached(column, domains[known])
                if other in domains:
                    reached &= domains[other]
                    if len(reached) == len(domains[other]):
                        continue
                domains[other] = reached
                changed = True
        if not changed:
            return


def evaluate(
    rule: Rule,
    sources: Sequence[Source],
    domains: dict[Variable, BitMap] | None = None,
) -> set[tuple]:
    """The head facts of ``rule`` over the sources (one per body position), its variables
    narrowed to ``domains`` where given."""
    domains = dict(domains or {})
    if domains:
        propagate(sources, domains)
        if any(not values for values in domains.values()):
            return set()
    factors = [source.factor(domains) for source in sources]
    keep = frozenset(rule.head.terms)
    while True:
        factors = merged(factors)
        if any(len(f.variables) == 0 and not f.holds for f in factors):
            return set()
        if any(len(f.variables) == 1 and not f.values for f in factors):
            return set()
        if any(len(f.variables) == 2 and not next(iter(f.keyed.values())) for f in factors):
            return set()
        candidates = sorted({v for f in factors for v in f.variables} - keep, key=lambda v: v.name)
        if not candidates:
            break
        best: tuple[int, str, Variable] | None = None
        for variable in candidates:
            touching = [f for f in factors if variable in f.variables]
            others = {v for f in touching for v in f.variables} - {variable}
            if len(others) <= 2:
                weight = sum(f.size() for f in touching)
                if best is None or (weight, variable.name) < best[:2]:
                    best = (weight, variable.name, variable)
        if best is None:
            raise AssertionError(f"no elimination step for {rule}")
        variable = best[2]
        factors = [f for f in factors if variable not in f.variables] + [
            eliminate(variable, [f for f in factors if variable in f.variables])
        ]
    return head_facts(rule, factors)


def merged(factors: list[Factor]) -> list[Factor]:
    """Factors over the same variables intersected into one."""
    by_variables: dict[frozenset[Variable], Factor] = {}
    for factor in factors:
        key = frozenset(factor.variables)
        known = by_variables.get(key)
        if known is None:
            by_variables[key] = factor
        elif len(key) == 0:
            known.holds = known.holds and factor.holds
        elif len(key) == 1:
            known.values = known.values & factor.values  # type: ignore[operator]
        else:
            variable = next(iter(known.keyed))
            pairs = intersect_pairs(known.keyed[variable], factor.by(variable))
            by_variables[key] = Factor(known.variables, {variable: pairs})
    return list(by_variables.values())


def eliminate(variable: Variable, factors: list[Factor]) -> Factor:
    """The join of ``factors`` (merged: at most one per variable set) with ``variable``
    projected away."""
    allowed: BitMap | None = None
    binary: list[Factor] = []
    for factor in factors:
        if len(factor.variables) == 1:
            allowed = factor.values
        else:
            binary.append(factor)
    if not binary:
        result = Factor(())
        result.holds = bool(allowed)
        return result
    if len(binary) == 1:
        (factor,) = binary
        (other,) = [v for v in factor.variables if v != variable]
        pairs = factor.by(variable)
        keys = allowed if allowed is not None else pairs.keys()
        return Factor.unary(other, union_of(pairs, keys))
    first, second = binary
    (x,) = [v for v in first.variables if v != variable]
    (y,) = [v for v in second.variables if v != variable]
    # F[x] = union of second[v] over v in first[x]: ``first`` keyed by x (turned if it is
    # not: the smaller of the two is turned when neither is)
    if x not in first.keyed and y in second.keyed:
        first, second, x, y = second, first, y, x
    if x not in first.keyed and first.size() > second.size():
        first, second, x, y = second, first, y, x
    outer = first.by(x)
    inner = second.by(variable)
    found: Pairs = {}
    for key, through in outer.items():
        if allowed is not None:
            through = through & allowed
        reached = BitMap().union(*[inner[v] for v in through if v in inner])
        if reached:
            found[key] = reached
    return Factor((x, y), {x: found})


def head_facts(rule: Rule, factors: list[Factor]) -> set[tuple]:
    """The head tuples of the factors left over the head's variables."""
    head = rule.head.terms
    unary = {f.variables[0]: f.values for f in factors if len(f.variables) == 1}
    if len(head) == 1:
        values = unary.get(head[0], EMPTY)
        return {(value,) for value in values}
    a, b = head
    binary = [f for f in factors if len(f.variables) == 2]
    if binary:
        pairs = restrict_pairs(binary[0].by(a), unary.get(a), unary.get(b))
    else:
        right = unary.get(b, EMPTY)
        pairs = {value: right for value in unary.get(a, EMPTY)} if right else {}
    return {(key, value) for key, values in pairs.items() for value in values}


# ------------------------------------------------------------------ the rule evaluator
@dataclass(frozen=True)
class EliminationPlan:
    """What ``explain`` and ``stats()`` show of an eliminated rule."""

    order: tuple[Variable, ...]

    def describe(self, rule: Rule) -> str:
        names = ", ".join(v.name for v in self.order)
        return f"variables eliminated on bitmaps (smallest factors first) of {names}"


class EliminatedRule:
    """The four operations the hypertree module asks of a rule (see ``PlannedRule``), by
    variable elimination over bitmaps. It keeps no state: the relations are the state."""

    rule_keys: frozenset[str] = frozenset()
    # CostPolicy.elimination_recompute_growth (the module sets its policy's)
    growth: float = 0.5

    def __init__(self, rule: Rule) -> None:
        self.rule = rule
        edges = [frozenset(item.terms) for item in rule.body]
        order = elimination_order(edges, frozenset(rule.head.terms)) or []
        self.decomposition = EliminationPlan(tuple(order))

    def size(self) -> int:
        return 0

    def _sources(
        self,
        bag: DataStoreBag,
        old: dict[RelationKey, Relation] | None = None,
        at: int | None = None,
        rows: Iterable[tuple] = (),
        shared: dict[RelationKey, Facts2] | None = None,
    ) -> list[Source]:
        """One source per body position (``at`` reads ``rows``); ``shared``: the relations'
        bitmaps and indexes already read in this update (an index by object of a relation
        stored by subject is built per read: reading it once per changed position cost
        more than the evaluations)."""
        sources = []
        shared = {} if shared is None else shared
        for position, atom in enumerate(self.rule.body):
            if position == at:
                sources.append(Source(atom, Facts2([set(rows)])))
                continue
            facts = shared.get(atom.relation)
            if facts is None:
                relations: list = list(bag.relations(atom.relation))
                if old is not None and atom.relation in old:
                    relations.append(old[atom.relation])
                facts = shared[atom.relation] = Facts2(relations)
            sources.append(Source(atom, facts))
        return sources

    def materialise(self, executor: Executor, bag: DataStoreBag) -> set[tuple]:
        return evaluate(self.rule, self._sources(bag))

    everything = materialise

    def _changed(
        self, bag: DataStoreBag, changes: Facts, old: dict[RelationKey, Relation] | None
    ) -> set[tuple]:
        heads: set[tuple] = set()
        growth = 0.0
        for atom in self.rule.body:
            rows = changes.get(atom.relation)
            if rows:
                size = sum(len(r) for r in bag.relations(atom.relation))
                growth += len(rows) / max(1, size)
        if growth > self.growth:
            # (a superset: every head of the state that holds the changes, which for a
            # deletion is the old state)
            return evaluate(self.rule, self._sources(bag, old))
        shared: dict[RelationKey, Facts2] = {}
        for position, atom in enumerate(self.rule.body):
            rows = changes.get(atom.relation)
            if not rows:
                continue
            sources = self._sources(bag, old, position, rows, shared)
            domains: dict[Variable, BitMap] = {}
            for column, term in enumerate(atom.terms):
                domains[term] = BitMap(row[column] for row in rows)
            heads |= evaluate(self.rule, sources, domains)
        return heads

    def add(
        self, executor: Executor, bag: DataStoreBag, plus: Facts, unblocked: Facts
    ) -> set[tuple]:
        return self._changed(bag, plus, None)

    def delete(
        self,
        executor: Executor,
        bag: DataStoreBag,
        old: dict[RelationKey, Relation],
        minus: Facts,
        blocked: Facts,
    ) -> set[tuple]:
        return self._changed(bag, minus, old)

    def rederive(
        self, executor: Executor, bag: DataStoreBag, overdeleted: set[tuple]
    ) -> set[tuple]:
        if not overdeleted:
            return set()
        domains = {
            term: BitMap(fact[column] for fact in overdeleted)
            for column, term in enumerate(self.rule.head.terms)
        }
        return evaluate(self.rule, self._sources(bag), domains) & overdeleted
