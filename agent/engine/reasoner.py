"""The facade users see: ``Reasoner.add_rules / add_facts / facts / query / explain / stats``.

Path of a call, top to bottom::

    add_rules(text) -> parser (Program) -> validation -> dependency (HRDG of hyper-nodes)
        -> per hyper-node, in topological order: module.materialise
            -> executor (plan + compiled function per rule) -> store (relations, indexes)

Every public method either completes or raises leaving the reasoner exactly as it was: rule
insertions are checked (syntax, safety, stratification) on a candidate program before anything
is touched.

This version re-materialises every hyper-node after a change; incremental maintenance of facts
and rules replaces that in ``maintenance.py``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from .dependency import HyperGraph, build_hyper_graph
from .errors import RuleError, ZodiacError
from .executor import Executor
from .explain import Derivation, explain_fact
from .language import RDF_TYPE, Atom, Constant, Program, Rule, Value, Variable
from .modules import Module, NodeState, choose_module
from .store import DataStore, DataStoreBag, RelationKey
from .terms import TermDictionary

FactInput = tuple
ProgressCallback = Callable[[str, int, int], None]


class Reasoner:
    """An in-memory Datalog reasoner that keeps the materialisation of its rules up to date.

    >>> r = Reasoner()
    >>> r.add_rules("anc(X, Y) :- parent(X, Y). anc(X, Z) :- anc(X, Y), parent(Y, Z).")
    ['h...', 'h...']
    >>> r.add_facts([("parent", "a", "b"), ("parent", "b", "c")])
    2
    >>> sorted(r.facts("anc"))
    [('anc', 'a', 'b'), ('anc', 'a', 'c'), ('anc', 'b', 'c')]
    """

    def __init__(self, *, progress: ProgressCallback | None = None) -> None:
        self.terms = TermDictionary()
        self.edb = DataStore("edb")
        self.rules: dict[str, Rule] = {}
        self.graph = HyperGraph([], set(), set())
        self.nodes: list[NodeState] = []
        self.modules: dict[str, Module] = {}
        self.executor = Executor(self.terms)
        self.progress = progress
        self._node_names: dict[frozenset[str], str] = {}
        self._last_update: dict = {}

    # ------------------------------------------------------------------ rules
    def add_rules(self, source: str | os.PathLike | Program | Iterable[Rule]) -> list[str]:
        """Add rules (text, a path to a rule file, a Program, or Rule objects).

        Returns the ids of the given rules in the order of the text (rules already present keep
        their id and are not added twice). Ground facts written in the text are added as
        explicit facts. Raises ParseError / RuleError / StratificationError, changing nothing.
        """
        program = load_program(source)
        new_rules = dict(self.rules)
        ids: list[str] = []
        for rule in program.rules:
            existing = new_rules.get(rule.id)
            if existing is not None and existing.text() != rule.text():
                raise RuleError(
                    f"label {rule.id} is already used by a different rule: {existing}",
                    rule=str(rule),
                )
            new_rules.setdefault(rule.id, rule)
            ids.append(rule.id)
        graph = self._check_program(list(new_rules.values()))
        facts = [self._encode_atom(atom) for atom in program.facts]
        self.rules = new_rules
        self._install_graph(graph)
        self._insert_explicit(facts)
        self._rematerialise("add_rules")
        return ids

    def delete_rules(self, rules: str | Iterable[str]) -> list[str]:
        """Delete rules by id, or by rule text identical to a rule's. Returns the deleted ids;
        unknown ids or texts raise UnknownRuleError and change nothing."""
        from .errors import UnknownRuleError

        wanted = [rules] if isinstance(rules, str) else list(rules)
        ids: list[str] = []
        for item in wanted:
            if item in self.rules:
                ids.append(item)
                continue
            program = load_program(item) if ":-" in item else None
            matched = [
                rid
                for rule in (program.rules if program else ())
                for rid, known in self.rules.items()
                if known.text() == rule.text()
            ]
            if not matched:
                raise UnknownRuleError(f"no rule with id or text {item!r}")
            ids.extend(matched)
        remaining = {rid: r for rid, r in self.rules.items() if rid not in set(ids)}
        graph = self._check_program(list(remaining.values()))
        self.rules = remaining
        self._install_graph(graph)
        self._rematerialise("delete_rules")
        return ids

    def _check_program(self, rules: list[Rule]) -> HyperGraph:
        from .validation import check_rule

        for rule in rules:
            check_rule(rule)
        return build_hyper_graph(rules)

    # ------------------------------------------------------------------ facts
    def add_facts(self, source: str | os.PathLike | Iterable[FactInput]) -> int:
        """Add explicit facts: a path to an N-Triples/Turtle file, or tuples
        ``(predicate, *arguments)`` (a class fact is ``(rdf:type, x, C)``). Returns how many
        facts were new."""
        encoded = [self._encode_fact(f) for f in load_facts(source)]
        added = self._insert_explicit(encoded)
        if added:
            self._rematerialise("add_facts")
        return added

    def delete_facts(self, source: str | os.PathLike | Iterable[FactInput]) -> int:
        """Delete explicit facts; facts that are not explicit are ignored. Returns how many
        were deleted."""
        removed = 0
        for fact in load_facts(source):
            key, args = self._lookup_fact(fact)
            if key is None:
                continue
            relation = self.edb.get(key)
            if relation is not None and relation.remove_all([args]):
                removed += 1
        if removed:
            self._rematerialise("delete_facts")
        return removed

    def _insert_explicit(self, encoded: list[tuple[RelationKey, tuple[int, ...]]]) -> int:
        by_key: dict[RelationKey, list[tuple[int, ...]]] = {}
        for key, args in encoded:
            by_key.setdefault(key, []).append(args)
        added = 0
        created = False
        for key, rows in by_key.items():
            created |= key not in self.edb.relations
            added += len(self.edb.relation(key).add_all(rows))
        if created:
            for node in self.nodes:
                node.view.refresh()
            self.executor.forget()
        return added

    # ------------------------------------------------------------------ reading
    def facts(self, predicate: str | None = None) -> Iterator[tuple]:
        """Every fact (explicit and derived) as ``(predicate, *arguments)`` of Python values;
        a class fact ``C(x)`` is ``(rdf:type, x, C)``. ``predicate`` filters on the first
        element of those tuples."""
        decode = self.terms.values
        for key in sorted(self._all_keys()):
            name, arity = key
            if arity == 1:
                if predicate is not None and predicate != RDF_TYPE:
                    continue
                for (x,) in self._visible(key):
                    yield (RDF_TYPE, decode[x], name)
            else:
                if predicate is not None and predicate != name:
                    continue
                for args in self._visible(key):
                    yield (name, *(decode[a] for a in args))

    def count(self) -> int:
        """Number of distinct facts, explicit and derived."""
        return sum(len(self._visible(key)) for key in self._all_keys())

    def query(self, pattern: str | Atom) -> list[dict[str, Value]]:
        """Answers of one atom pattern such as ``<p11>(X, <windTurbine3>)`` or ``<C>(X)``:
        one dict per distinct match, mapping variable names to values."""
        from .parser import parse_atom

        atom = parse_atom(pattern) if isinstance(pattern, str) else pattern
        wanted: list[int | None] = []
        for term in atom.terms:
            if isinstance(term, Constant):
                found = self.terms.lookup(term.value)
                if found is None:
                    return []
                wanted.append(found)
            else:
                wanted.append(None)
        answers: list[dict[str, Value]] = []
        seen: set[tuple] = set()
        decode = self.terms.values
        for args in self._visible(atom.relation):
            binding: dict[Variable, int] = {}
            ok = True
            for term, want, value in zip(atom.terms, wanted, args, strict=True):
                if want is not None:
                    ok = value == want
                elif binding.setdefault(term, value) != value:
                    ok = False
                if not ok:
                    break
            if not ok:
                continue
            key = tuple(sorted((v.name, i) for v, i in binding.items()))
            if key in seen:
                continue
            seen.add(key)
            answers.append(
                {v.name: decode[i] for v, i in binding.items() if not v.name.startswith("_")}
            )
        return answers

    def explain(self, fact: FactInput) -> Derivation:
        """One derivation tree of a fact (raises KeyError if the fact does not hold)."""
        key, args = self._lookup_fact(fact)
        if key is None or not self._visible(key) or args not in self._visible(key):
            raise KeyError(f"{fact!r} is not a fact of the materialisation")
        return explain_fact(self, key, args)

    def stats(self) -> dict:
        """Sizes, hyper-nodes (rules, module, facts, time) and the last update's timings."""
        per_predicate = {
            f"{name}/{arity}": len(self._visible((name, arity))) for name, arity in self._all_keys()
        }
        return {
            "facts": sum(per_predicate.values()),
            "explicit_facts": self.edb.size(),
            "rules": len(self.rules),
            "predicates": dict(sorted(per_predicate.items())),
            "hyper_nodes": [
                {
                    "name": node.name,
                    "rules": [r.id for r in node.rules],
                    "module": self.modules[node.name].name,
                    "recursive": node.logical.recursive,
                    "facts": node.size(),
                    **node.stats,
                }
                for node in self.nodes
            ],
            "runtime_errors": self.executor.error_count,
            "last_update": dict(self._last_update),
            "terms": len(self.terms),
        }

    # ------------------------------------------------------------------ internals
    def _all_keys(self) -> set[RelationKey]:
        keys = {k for k, r in self.edb.relations.items() if r.tuples}
        for node in self.nodes:
            keys.update(k for k, r in node.idb.relations.items() if r.tuples)
        return keys

    def _visible(self, key: RelationKey) -> set[tuple[int, ...]]:
        holders = []
        relation = self.edb.get(key)
        if relation is not None and relation.tuples:
            holders.append(relation.tuples)
        for node in self.nodes:
            relation = node.idb.get(key)
            if relation is not None and relation.tuples:
                holders.append(relation.tuples)
        if len(holders) == 1:
            return holders[0]
        union: set[tuple[int, ...]] = set()
        for tuples in holders:
            union |= tuples
        return union

    def _install_graph(self, graph: HyperGraph) -> None:
        """Create the run-time hyper-nodes: their IDB stores and views (pointers, no copies)."""
        self.graph = graph
        nodes: list[NodeState] = []
        for index, logical in enumerate(graph.nodes):
            name = self._node_names.get(logical.rule_ids)
            if name is None:
                name = self._node_names[logical.rule_ids] = f"hn{len(self._node_names) + 1}"
            logical.name = name
            idb = DataStore(name)
            for key in logical.heads:
                idb.relation(key)
            for rule in logical.rules:
                for key, _ in rule.body_relations():
                    self.edb.relation(key)
            predecessors = [nodes[i].idb for i in graph.predecessors(index)]
            view = DataStoreBag([self.edb, *predecessors, idb])
            nodes.append(NodeState(name, logical, idb, view))
        self.nodes = nodes
        self.modules = {node.name: choose_module(node) for node in nodes}
        self.executor.forget()

    def _rematerialise(self, reason: str) -> None:
        started = time.perf_counter()
        total = len(self.nodes)
        for number, node in enumerate(self.nodes, start=1):
            node.idb.clear()
            node.stats.clear()
            if self.progress:
                self.progress(node.name, number, total)
            self.modules[node.name].materialise(node, self.executor)
        self._last_update = {
            "operation": reason,
            "strategy": "rematerialise",
            "hyper_nodes": [n.name for n in self.nodes],
            "seconds": time.perf_counter() - started,
        }

    def _encode_fact(self, fact: FactInput) -> tuple[RelationKey, tuple[int, ...]]:
        if isinstance(fact, Atom):
            return self._encode_atom(fact)
        if not isinstance(fact, tuple) or len(fact) < 2:
            raise ZodiacError(f"a fact is a tuple (predicate, *arguments), got {fact!r}")
        predicate, *args = fact
        if not isinstance(predicate, str):
            raise ZodiacError(f"a fact's predicate must be an IRI string, got {predicate!r}")
        if predicate == RDF_TYPE and len(args) == 2:
            subject, cls = args
            if not isinstance(cls, str):
                raise ZodiacError(f"a class must be an IRI string, got {cls!r} in {fact!r}")
            return (cls, 1), (self.terms.encode(subject),)
        return (predicate, len(args)), tuple(self.terms.encode(a) for a in args)

    def _encode_atom(self, atom: Atom) -> tuple[RelationKey, tuple[int, ...]]:
        if not atom.is_ground():
            raise RuleError(f"a fact must be ground: {atom}")
        return atom.relation, tuple(self.terms.encode(t.value) for t in atom.terms)

    def _lookup_fact(self, fact: FactInput) -> tuple[RelationKey | None, tuple[int, ...]]:
        """Like _encode_fact but never adds terms to the dictionary."""
        if isinstance(fact, Atom):
            values = [t.value for t in fact.terms if isinstance(t, Constant)]
            key = fact.relation
        else:
            predicate, *values = fact
            key = (predicate, len(values))
            if predicate == RDF_TYPE and len(values) == 2:
                key, values = (values[1], 1), values[:1]
        ids = [self.terms.lookup(v) for v in values]
        if any(i is None for i in ids):
            return None, ()
        return key, tuple(ids)  # type: ignore[arg-type]


def load_program(source: str | os.PathLike | Program | Iterable[Rule]) -> Program:
    """Rule text, a path to a rule file, a Program, or Rule objects -> Program."""
    if isinstance(source, Program):
        return source
    from .parser import parse_file, parse_program

    if isinstance(source, os.PathLike):
        return parse_file(source)
    if isinstance(source, str):
        if ":-" not in source and "\n" not in source and os.path.exists(source):
            return parse_file(source)
        return parse_program(source)
    return Program(rules=tuple(source))


def load_facts(source: str | os.PathLike | Iterable[FactInput]) -> Iterable[FactInput]:
    """A path to an RDF file (N-Triples, Turtle), or an iterable of fact tuples."""
    if isinstance(source, (str, os.PathLike)):
        from .rdf import read_facts

        path = Path(source)
        if not path.exists():
            raise ZodiacError(f"no such fact file: {source}")
        return list(read_facts(path))
    return list(source)
