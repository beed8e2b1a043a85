"""The facade users see: ``Reasoner.add_rules / add_facts / facts / query / explain / stats``.

Path of a call, top to bottom (each folder is a layer; seven files from ``add_rules`` to a
join loop)::

    reasoner.py                 Reasoner.add_rules -> update -> _update: load the text
                                (program/loaders.py), check it, build the hyper-node graph
                                (program/dependency.py), hand over to the driver
    update/maintenance.py       UpdateDriver.run -> update_node: per hyper-node, in topological
                                order, new (compute_afresh), kept (maintain) or changed
                                (update/transitions.py)
    modules/seminaive.py        SeminaiveModule.materialise -> add: every rule, then rounds
                                over the delta (the closure, renaming... modules are
                                alternatives to this one, modules/__init__.py picks one)
    plan/executor.py            Executor.run: find each atom's relations, plan and compile once,
                                call
    plan/planner.py             plan_rule: the body ordered into steps (the logical plan)
    plan/rewrites/              choose_shape: the shape of the code (one file per fast path)
    plan/compiler.py            RuleCompiler.compile: the Python source of the join loop
    storage/store.py            Relation: the facts and indexes the loop reads

``Reasoner.plans(name)`` and ``zodiac-edge explain RULES FACTS --plans`` print every compiled
plan of a rule, its shape and its source.

Every public method either completes or raises leaving the reasoner exactly as it was: rule
insertions are checked (syntax, safety, stratification) on a candidate program before anything
is touched.

Every change (facts, rules, or both) goes through ``update.maintenance.UpdateDriver``, which
maintains the materialisation incrementally, hyper-node by hyper-node.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace
from functools import partial

from agent.engine.budget import NO_GUARD, Budget, BudgetGuard
from agent.engine.costs import DEFAULT_COSTS, CostPolicy
from agent.engine.equality.component import SAME_AS, mentions_equality
from agent.engine.equality.expansion import ExpandedView
from agent.engine.equality.layer import EqualityLayer
from agent.engine.errors import RuleError, UnknownRuleError, refuse_directives
from agent.engine.explain import Derivation, explain_fact, explain_with_equality
from agent.engine.gcpause import FREEZE_AT, collector_paused
from agent.engine.language import Atom, Program, Rule, Value
from agent.engine.modules import Module, NodeState
from agent.engine.plan.executor import Executor
from agent.engine.program.dependency import HyperGraph, build_hyper_graph, changed_hyper_graph
from agent.engine.program.heads import single_headed
from agent.engine.program.loaders import FactInput, load_facts, load_program
from agent.engine.program.validation import check_rule
from agent.engine.storage.changes import Journal
from agent.engine.storage.store import DataStore, RelationKey, SavedFacts, by_relation
from agent.engine.storage.view import MaterialisedView, NodeView
from agent.engine.storage.watches import Watch, WatchChange, journal_readable
from agent.engine.terms import TermDictionary
from agent.engine.update.maintenance import UpdateDriver, new_node_state
from agent.engine.update.reclaim import RECLAIMER

ProgressCallback = Callable[[str, int, int], None]


def evaluate_rules(
    terms: TermDictionary,
    modules: bool,
    costs: CostPolicy,
    rules: list[Rule],
    facts: dict[RelationKey, set],
) -> dict:
    """Every relation's facts after ``rules`` over ``facts`` (term ids), by a reasoner of their
    own on ``terms``: the equality component's rounds (equality.py); the rules must not use
    owl:sameAs (they are given it renamed)."""
    inner = Reasoner.restore(terms=terms, rules=[], edb=facts, nodes={}, modules=modules)
    inner.costs = costs
    inner.add_rules(Program(rules=tuple(rules)))
    view = inner.view()
    keys = {*facts, *(head.relation for rule in rules for head in rule.heads)}
    return {key: view.detached(key) for key in keys}


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

    def __init__(
        self,
        *,
        modules: bool = True,
        decompositions: bool | str = True,
        progress: ProgressCallback | None = None,
        budget: Budget | None = None,
        costs: CostPolicy = DEFAULT_COSTS,
        terms: TermDictionary | None = None,
    ) -> None:
        """``modules=False`` evaluates every hyper-node with plain seminaive evaluation
        instead of the specialised modules (for comparison, and as a safety switch); aggregate
        rules keep their module, which is how they are evaluated at all.
        ``decompositions``: True evaluates a cyclic rule through a hypertree decomposition
        when that is estimated cheaper than its join plan (modules/hypertree.py), False never,
        ``"always"`` whenever the rule has one (for comparisons and tests).
        ``budget`` limits every update (derived facts held, memory, wall time; see budget.py):
        an update over budget raises BudgetExceeded and leaves the reasoner as it was (its
        facts and rules; terms it encoded stay in the dictionary, which only grows).
        ``terms`` shares a caller's term dictionary instead of a new one: the cloud job
        evaluates small strata with the engine on its own term ids (cloud/spark/driver.py)."""
        self.use_modules = modules
        self.budget = budget
        # the recompute thresholds of maintenance and the decomposition setting (costs.py)
        self.costs = replace(costs, decompositions=decomposition_mode(decompositions))
        self.terms = terms if terms is not None else TermDictionary()
        self.edb = DataStore("edb")
        # Rules by name (label, or content key for an unlabelled rule): what users add and
        # delete. Several names may denote one rule (the same content under two labels).
        self.rules: dict[str, Rule] = {}
        # The program itself: one rule per content key (see ``Rule.key``), in insertion order.
        self.program: dict[str, Rule] = {}
        # ``rules`` by content key: the program the user gave (``program`` is the engine's,
        # rewritten under owl:sameAs), kept so that an update of facts alone makes no pass
        # over the rules.
        self._given_program: dict[str, Rule] = {}
        self.graph = HyperGraph([], set(), set())
        self.nodes: list[NodeState] = []
        # ``nodes`` by name, and the list they were taken from (see ``node_views``).
        self._nodes_by_name: tuple[list[NodeState] | None, dict[str, NodeState]] = (None, {})
        self.executor = Executor(self.terms)
        self.progress = progress
        self.restored = ""  # how restore() rebuilt the state ("" for a fresh reasoner)
        self._node_names: dict[frozenset[str], str] = {}
        self._last_update: dict = {}
        # The last update's changes store by store, for a persistent copy (agent/persistence).
        self.journal = Journal()
        # owl:sameAs by rewriting, from the first update that uses it (equality.py).
        self.equality: EqualityLayer | None = None
        # Watched patterns by name (storage/watches.py): each update reports their changes.
        self._watches: dict[str, Watch] = {}

    @classmethod
    def restore(
        cls,
        *,
        terms: list[Value] | TermDictionary,
        rules: list[Rule],
        edb: dict[RelationKey, SavedFacts],
        nodes: dict[frozenset[str], tuple[str, dict[RelationKey, SavedFacts]]],
        modules: bool = True,
        decompositions: bool | str = True,
        progress: ProgressCallback | None = None,
        equality: tuple[dict[int, int], dict[RelationKey, set] | None] | None = None,
    ) -> Reasoner:
        """A reasoner from a saved state, without recomputing: ``terms`` in id order (or a
        dictionary to share, see ``__init__``), the rules
        (each named by its ``id``), the explicit facts and, per hyper-node (keyed by its rules'
        content keys), its name and IDB (each per relation a set of tuples, or subject ->
        objects for a binary relation, kept as the relation's storage: store.SavedFacts; with
        ``equality``, the explicit facts as sets of tuples).
        ``equality``: with owl:sameAs, each merged term's representative and the equality
        component's facts (None if not saved: the component alone is then recomputed).

        The saved hyper-nodes must be exactly those of the rules' HRDG, each with facts of
        relations its rules derive only; if they are not (a state saved by a different engine
        version, or damaged), everything is recomputed from the rules and explicit facts
        instead, and ``stats()["restored"]`` says so. Modules rebuild
        auxiliary state (closure adjacency, aggregate groups) on the first change they see."""
        if isinstance(terms, TermDictionary):  # the caller's, shared (see __init__)
            reasoner = cls(
                modules=modules, decompositions=decompositions, progress=progress, terms=terms
            )
        else:
            reasoner = cls(modules=modules, decompositions=decompositions, progress=progress)
            reasoner.terms.load(terms)
        program = by_key(rules)
        for rule in program.values():
            check_rule(rule)
        engine_edb, engine_program = edb, program
        if equality is not None or SAME_AS in edb or mentions_equality(program.values()):
            layer = reasoner.equality = EqualityLayer(
                reasoner.terms, reasoner.costs, reasoner._rule_evaluator()
            )
            representatives, component = equality or ({}, None)
            engine_edb = layer.load(program, edb, representatives, component)
            engine_program = layer.engine_program(program)
        graph = build_hyper_graph(list(engine_program.values()))
        if {logical.rule_keys for logical in graph.nodes} != set(nodes) or any(
            not set(nodes[logical.rule_keys][1]) <= logical.heads for logical in graph.nodes
        ):  # (or a hyper-node saved with a relation none of its rules derives)
            reasoner.equality = None
            for key, facts in edb.items():
                reasoner.edb.relation(key).fill(facts)
            reasoner.update(add_rules=Program(rules=tuple(rules)))
            reasoner.restored = "recomputed (saved hyper-nodes do not match the rules)"
            return reasoner
        for key, facts in engine_edb.items():
            reasoner.edb.relation(key).fill(facts)
        reasoner.graph = graph
        reasoner.rules = {rule.id: rule for rule in rules}
        reasoner._given_program = program
        reasoner.program = engine_program  # (``program`` itself, but under owl:sameAs)
        for index, logical in enumerate(graph.nodes):
            name, facts = nodes[logical.rule_keys]
            reasoner._node_names[logical.rule_keys] = name
            idb = DataStore(name)
            for key, saved in facts.items():
                idb.relation(key).fill(saved)
            predecessors = [reasoner.nodes[i].idb for i in graph.predecessors(index)]
            node = new_node_state(
                name, logical, idb, reasoner.edb, predecessors, None, modules, reasoner.costs
            )
            node.module.loaded_from_state(node)  # type: ignore[union-attr]
            reasoner.nodes.append(node)
        reasoner.restored = "loaded"
        return reasoner

    # ------------------------------------------------------------------ updates
    def add_rules(self, source: str | os.PathLike | Program | Iterable[Rule]) -> list[str]:
        """Add rules (text, a path to a rule file, a Program, or Rule objects).

        Returns the ids of the given rules in the order of the text (rules already present keep
        their id and are not added twice). Ground facts written in the text are added as
        explicit facts in the same change. Raises ParseError / RuleError / StratificationError,
        changing nothing.
        """
        program = load_program(source)
        self.update(add_rules=program)
        return [rule.id for rule in program.rules]

    def delete_rules(self, rules: str | Iterable[str]) -> list[str]:
        """Delete rules by id (a label, or the content key of any rule), or by rule text with
        the same content as a rule's. Returns the deleted ids; an unknown id or text raises
        UnknownRuleError and changes nothing."""
        report = self.update(delete_rules=[rules] if isinstance(rules, str) else list(rules))
        return report["rules_deleted"]

    def add_facts(self, source: str | os.PathLike | Iterable[FactInput]) -> int:
        """Add explicit facts: a path to an N-Triples/Turtle file, or tuples
        ``(predicate, *arguments)`` (a class fact is ``(rdf:type, x, C)``). Returns how many
        were new; facts that were already explicit are ignored."""
        return self.update(add_facts=source)["facts_added"]

    def delete_facts(self, source: str | os.PathLike | Iterable[FactInput]) -> int:
        """Delete explicit facts. Returns how many were deleted; facts that are not explicit
        (derived only, or unknown) are ignored, never an error."""
        return self.update(delete_facts=source)["facts_deleted"]

    def update(
        self,
        *,
        add_rules: str | os.PathLike | Program | Iterable[Rule] | None = None,
        delete_rules: Iterable[str] = (),
        add_facts: str | os.PathLike | Iterable[FactInput] | None = None,
        delete_facts: str | os.PathLike | Iterable[FactInput] | None = None,
        budget: Budget | None = None,
    ) -> dict:
        """Apply rule and fact insertions and deletions as one change, incrementally.

        Deleted facts are removed before added ones are inserted, so a fact in both ends up
        explicit. Everything is checked first (syntax, safety, stratification, fact shapes):
        on error nothing changes. Returns a report (also kept as ``stats()["last_update"]``):
        counts, the directly impacted hyper-nodes, the plan and each hyper-node's strategy.

        ``budget`` (default: the reasoner's) limits the update; over it, BudgetExceeded is
        raised and the reasoner is exactly as before.

        With watches (:meth:`watch`), the report's ``watched`` maps the name of each watch
        whose matches changed to a WatchChange: the facts that appeared and disappeared.

        Python's cyclic garbage collector is paused meanwhile (see ``gcpause``)."""
        guard = BudgetGuard(budget if budget is not None else self.budget)
        with collector_paused() as pause, RECLAIMER.paused():
            report = self._update(add_rules, delete_rules, add_facts, delete_facts, guard)
            if self._watches:
                report["watched"] = self._refresh_watches(report)
            changed = sum(
                node["added"] + node["removed"] for node in report["hyper_nodes"].values()
            )
            pause.large = changed + report["facts_added"] + report["facts_deleted"] > FREEZE_AT
            return report

    def _update(
        self,
        add_rules: str | os.PathLike | Program | Iterable[Rule] | None,
        delete_rules: Iterable[str],
        add_facts: str | os.PathLike | Iterable[FactInput] | None,
        delete_facts: str | os.PathLike | Iterable[FactInput] | None,
        guard: BudgetGuard,
    ) -> dict:
        started = time.perf_counter()
        program = load_program(add_rules) if add_rules is not None else Program()
        refuse_directives(program.windows, program.watches)
        deleted_names = self.resolve_rule_names(delete_rules)
        names, added_names, rules = self.rules, [], self._given_program
        if program.rules or deleted_names:
            names = {name: rule for name, rule in names.items() if name not in deleted_names}
            for rule in program.rules:
                existing = names.get(rule.id)
                if existing is not None and existing.key != rule.key:
                    raise RuleError(
                        f"label {rule.id} is already used by a different rule: {existing}; "
                        "delete it in the same update to replace it",
                        rule=str(rule),
                    )
                if existing is None:
                    names[rule.id] = rule
                    added_names.append(rule.id)
            # The program changes by content: a replaced body is a deleted key and a new one;
            # a second name for a rule already present changes nothing.
            rules = by_key(names.values())
        given = program.facts if add_facts is None else [*program.facts, *load_facts(add_facts)]
        additions, addition_count = self.terms.encode_facts(given)
        deletions = (
            [] if delete_facts is None else self.terms.lookup_facts(load_facts(delete_facts))
        )
        layer = self._equality_for(program.rules, additions)
        if layer is not None:  # owl:sameAs: the engine runs a normalised program (equality.py)
            known = {rule.key for rule in self.rules.values()}
            for rule in rules.values():
                if rule.key not in known:
                    check_rule(rule)
        # A layer new in this update is dropped if the update fails: nothing to undo in it.
        saved = layer.snapshot() if layer is not None and layer is self.equality else None
        try:
            if layer is not None:
                plan = layer.plan(rules, additions, by_relation(deletions), self.edb)
                target, edb_added, edb_removed = plan.program, plan.add, plan.remove
            else:
                target, edb_added, edb_removed = rules, additions, by_relation(deletions)
            driven = self._run(target, edb_added, edb_removed, guard)
        except BaseException:
            if layer is not None and saved is not None:
                layer.restore(saved)
            raise
        added, removed = driven.pop("edb_counts")
        if layer is not None:
            layer.commit()
            self.equality = layer
            added, removed = plan.facts_added, plan.facts_deleted
            driven["equality"] = {"maintenance": layer.maintenance, "clashes": layer.clashes()}
        self.rules, self._given_program = names, rules
        report = {
            "operation": _describe_operation(added_names, deleted_names, added, removed),
            "rules_added": added_names,
            "rules_deleted": sorted(deleted_names),
            "facts_added": added,
            "facts_deleted": removed,
            "facts_ignored": addition_count - added + len(deletions) - removed,
            **driven,
            "seconds": time.perf_counter() - started,
        }
        report.setdefault("plan", [])
        report.setdefault("directly_impacted", [])
        self._last_update = report
        return report

    # ------------------------------------------------------------------ watches
    def watch(self, pattern: str | Atom, name: str | None = None) -> WatchChange:
        """Watch the facts matching an atom pattern (as :meth:`query` takes it): from now on
        every update's report says, under ``watched[name]``, which of them appeared and which
        disappeared. ``name`` defaults to the pattern's text. Returns the facts matching now
        (all 'appeared': a reader replaying changes from here starts from them). Watching a
        name again with the same pattern changes nothing and returns no change; with another
        pattern it raises ValueError."""
        from agent.engine.program.parser import parse_atom

        atom = parse_atom(pattern) if isinstance(pattern, str) else pattern
        name = name if name is not None else str(atom)
        known = self._watches.get(name)
        if known is not None:
            if known.atom != atom:
                raise ValueError(f"watch {name!r} already watches {known.atom}, not {atom}")
            return WatchChange()
        watch = self._watches[name] = Watch(name, atom)
        return watch.start(self.view())

    def unwatch(self, name: str) -> WatchChange:
        """Stop watching ``name``; returns the facts it held, all 'disappeared' (KeyError for
        an unknown name)."""
        watch = self._watches.pop(name)
        return watch.stop(self.view())

    def watches(self) -> dict[str, str]:
        """The watches: name -> pattern text."""
        return {name: str(watch.atom) for name, watch in self._watches.items()}

    def _refresh_watches(self, report: dict) -> dict[str, WatchChange]:
        structural = bool(report["rules_added"] or report["rules_deleted"])
        readable = journal_readable(self.journal, structural, self.equality is not None)
        journal = self.journal if readable else None
        view = self.view()
        changes = {}
        for name, watch in self._watches.items():
            change = watch.refresh(view, journal)
            if change:
                changes[name] = change
        return changes

    def _equality_for(
        self, added: Iterable[Rule], additions: dict[RelationKey, list]
    ) -> EqualityLayer | None:
        """The equality layer this update runs through: the reasoner's, or a new one when the
        update brings the first ``owl:sameAs`` (in an ``added`` rule or a fact), or the explicit
        facts hold one (a saved state recomputed, see ``restore``). Without a layer no rule
        held so far mentions owl:sameAs, so only the update's own rules need a look."""
        if self.equality is not None:
            return self.equality
        held = self.edb.get(SAME_AS)
        if SAME_AS in additions or held is not None and len(held) or mentions_equality(added):
            layer = EqualityLayer(self.terms, self.costs, self._rule_evaluator())
            layer.start_from(self.edb)
            return layer
        return None

    def _rule_evaluator(self) -> Callable[[list[Rule], dict[RelationKey, set]], dict]:
        """`evaluate_rules` on this reasoner's terms and settings, for the equality layer.
        Not a bound method: the layer is the reasoner's, and a reference back from it would
        make a cycle, which a large update's ``gc.freeze`` (gcpause.py) keeps for good: a
        dropped reasoner with equality was never freed."""
        return partial(evaluate_rules, self.terms, self.use_modules, self.costs)

    def _run(
        self,
        rules: dict[str, Rule],
        edb_added: dict[RelationKey, list],
        edb_removed: dict[RelationKey, list],
        guard: BudgetGuard,
    ) -> dict:
        """The engine's part of an update: ``rules`` is its whole program by content key,
        the other two the changes to its explicit facts. Returns the driver's report, with
        ``edb_counts``: how many explicit facts the engine added and removed."""
        if rules is self.program:  # (facts alone: no pass over the rules)
            deleted_keys, new_rules = set(), []
        else:
            deleted_keys = {key for key in self.program if key not in rules}
            new_rules = [rule for key, rule in rules.items() if key not in self.program]
        structural = bool(deleted_keys or new_rules)
        if structural:
            for rule in new_rules:  # each new rule once; parsed ones were checked already
                check_rule(rule)
            graph = changed_hyper_graph(
                self.graph, list(self.program.values()), list(rules.values())
            )
        else:
            graph = self.graph
        driver = UpdateDriver(
            self.edb,
            self.executor,
            self.nodes,
            graph,
            self._node_names,
            self.progress,
            self.use_modules,
            self.costs,
            old_graph=self.graph,
        )
        added, removed = driver.apply_edb(edb_added, edb_removed)
        # The previous journal (and the facts it removed) and dropped hyper-nodes are freed
        # off this update's path (see reclaim.py).
        RECLAIMER.discard(self.journal)
        self.journal = Journal()
        if structural or added or removed:
            pure_insertion = not (deleted_keys or added or removed)
            self.executor.guard = guard.start(
                lambda: sum(n.idb.size() for n in driver.nodes), lambda: driver.nodes
            )
            try:
                deleted = {key: self.program[key] for key in deleted_keys}
                self.nodes = driver.run(deleted, extend_merges=pure_insertion)
            except BaseException:
                # Over budget, or a failure half way: back to the state before the update.
                # The rollback is not part of the update: it runs outside its guard, so that
                # nothing kept for the update's length (aggregate partitions of the new state,
                # by the guard) is read back.
                guard.stop()
                self.executor.guard = NO_GUARD
                driver.rollback()
                raise
            finally:
                guard.stop()
                self.executor.guard = NO_GUARD
                RECLAIMER.discard(driver.log.release())  # its per-update caches
            RECLAIMER.discard(*driver.dropped)
            self.graph = graph
            self.program = rules
            if deleted_keys:
                self.executor.forget(deleted_keys)
            self.journal = driver.journal()
        return {**driver.report, "edb_counts": (added, removed)}

    def resolve_rule_names(self, wanted: Iterable[str]) -> set[str]:
        """The names of the rules to delete, from names, content keys or rule texts (a text
        without a label matches every name of a rule with its content; with a label, that
        name only). UnknownRuleError if any item matches no current rule."""
        names: set[str] = set()
        for item in wanted:
            if item in self.rules:
                names.add(item)
                continue
            matched = [name for name, rule in self.rules.items() if rule.key == item]
            if not matched and ":-" in item:
                for given in load_program(item).rules:
                    matched += [
                        name
                        for name, rule in self.rules.items()
                        if rule.key == given.key and given.label in (None, name)
                    ]
            if not matched:
                raise UnknownRuleError(f"no rule with id or text {item!r}")
            names.update(matched)
        return names

    # ------------------------------------------------------------------ reading
    def view(self) -> MaterialisedView:
        """A read-only view of the materialisation (what every reader below uses). With
        owl:sameAs it reads the expanded model (sameas/expansion.py)."""
        view = MaterialisedView(self.terms, self.edb, [_node_view(node) for node in self.nodes])
        if self.equality is None:
            return view
        layer = self.equality
        return ExpandedView(view, layer.classes, layer.explicit_facts, layer.is_explicit)

    def node_views(self, names: Iterable[str]) -> dict[str, NodeView]:
        """Some hyper-nodes' views, by name (those ``view().nodes`` holds), without a view of
        every hyper-node: a commit asks for the few the last update walked."""
        listed, by_name = self._nodes_by_name
        if listed is not self.nodes:  # (a new node list: a rule changed)
            by_name = {node.name: node for node in self.nodes}
            self._nodes_by_name = (self.nodes, by_name)
        return {name: _node_view(by_name[name]) for name in names}

    def facts(self, predicate: str | None = None) -> Iterator[tuple]:
        """Every fact (explicit and derived) as ``(predicate, *arguments)`` of Python values;
        a class fact ``C(x)`` is ``(rdf:type, x, C)``. ``predicate`` filters on the first
        element of those tuples."""
        return self.view().facts(predicate)

    def facts_named(self, name: str) -> Iterator[tuple]:
        """Every fact whose relation is called ``name``, whatever its arity: for a class
        ``C`` the facts ``(rdf:type, x, C)``, for a predicate ``p`` the facts ``(p, ...)``.
        Reads only those relations (``facts(rdf:type)`` would decode every class fact)."""
        return self.view().facts_named(name)

    def edb_facts(self) -> Iterator[tuple]:
        """The explicit facts only, in the same form as :meth:`facts`."""
        return self.view().edb_facts()

    def count(self) -> int:
        """Number of distinct facts, explicit and derived."""
        return self.view().count()

    def query(self, pattern: str | Atom) -> list[dict[str, Value]]:
        """Answers of one atom pattern such as ``<p11>(X, <windTurbine3>)`` or ``<C>(X)``:
        one dict per distinct match, mapping variable names to values."""
        from agent.engine.program.parser import parse_atom

        atom = parse_atom(pattern) if isinstance(pattern, str) else pattern
        return self.view().query(atom)

    def explain(self, fact: FactInput) -> Derivation:
        """One derivation tree of a fact (raises KeyError if the fact does not hold)."""
        key, args = self.lookup_fact(fact)
        view = self.view()
        if key is None or not view.holds(key, args):
            raise KeyError(f"{fact!r} is not a fact of the materialisation")
        names = {key: rule.id for key, rule in self.program.items()}
        if isinstance(view, ExpandedView) and self.equality is not None:
            return explain_with_equality(view.base, self.equality, key, args, names)
        return explain_fact(view, key, args, names)

    def plans(self, name: str) -> list:
        """The compiled plans of the rule named ``name`` (label or content key), every variant
        compiled so far (see ``Executor.plans``)."""
        rule = self.rules.get(name)
        if rule is None:
            return self.executor.plans(name)
        keys: set[str] = set()
        for part in single_headed([rule]):  # a multi-head rule's body and copies
            module = self.module_of(part)
            keys |= module.plan_keys(part) if module is not None else {part.key}
        return [entry for key in sorted(keys) for entry in self.executor.plans(key)]

    def evaluation(self, name: str) -> str | None:
        """How the rule named ``name`` is evaluated when not by its own join plans (through a
        hypertree decomposition: the decomposition and why), else None."""
        rule = self.rules.get(name)
        found = []
        for part in single_headed([rule]) if rule is not None else []:
            module = self.module_of(part)
            described = module.describe_rule(part) if module is not None else None
            if described is not None:
                found.append(described)
        return "\n".join(found) or None

    def module_of(self, rule: Rule) -> Module | None:
        """The module evaluating ``rule`` (None for a rule not in the program)."""
        for node in self.nodes:
            if rule in node.rules:
                return node.module
        return None

    def stats(self) -> dict:
        """Sizes, hyper-nodes (rules, module, facts, time) and the last update's timings."""
        names: dict[str, list[str]] = {}
        for name, rule in self.rules.items():
            names.setdefault(rule.key, []).append(name)
        view = self.view()
        per_predicate = {f"{name}/{arity}": size for (name, arity), size in view.sizes().items()}
        return {
            "facts": sum(per_predicate.values()),
            "explicit_facts": (
                self.equality.explicit_count() if self.equality is not None else self.edb.size()
            ),
            "rules": len(self.rules),
            "predicates": dict(sorted(per_predicate.items())),
            "hyper_nodes": [
                {
                    "name": node.name,
                    "rules": [name for r in node.rules for name in rule_names(r, names)],
                    "module": node.module.describe() if node.module else "",
                    "recursive": node.logical.recursive,
                    "facts": node.size(),
                    **node.stats,
                }
                for node in self.nodes
            ],
            "runtime_errors": self.executor.error_count,
            "last_update": dict(self._last_update),
            "terms": len(self.terms),
            **({"equality": self.equality.stats()} if self.equality is not None else {}),
            **({"restored": self.restored} if self.restored else {}),
        }

    # ------------------------------------------------------------------ internals
    def lookup_fact(self, fact: FactInput) -> tuple[RelationKey | None, tuple[int, ...]]:
        """Like TermDictionary.encode_fact but never adds terms to the dictionary."""
        return self.terms.lookup_fact(fact)


def rule_names(rule: Rule, names: dict[str, list[str]]) -> list[str]:
    """The names of a rule of the program (``names``: content key -> names); a part of a
    multi-head rule (``heads.split``: labelled ``<key>.body``, ``<key>.head1``...) is named
    after each name of its rule (``hot.body``)."""
    found = names.get(rule.key)
    if found is not None:
        return found
    owner, _, part = (rule.label or "").partition(".")
    if part and owner in names:
        return [f"{name}.{part}" for name in names[owner]]
    return [rule.id]


def decomposition_mode(setting: bool | str) -> str:
    """``Reasoner(decompositions=...)`` as the cost policy's setting."""
    if setting is True:
        return "auto"
    if setting is False:
        return "off"
    if setting in ("auto", "always", "off"):
        return setting
    raise ValueError(f"decompositions must be True, False or 'always', not {setting!r}")


def _node_view(node: NodeState) -> NodeView:
    return NodeView(
        node.name,
        node.rules,
        node.module.describe() if node.module else "",
        node.logical.recursive,
        node.idb,
    )


def by_key(rules: Iterable[Rule]) -> dict[str, Rule]:
    """One rule per content key, the first of each, in order."""
    unique: dict[str, Rule] = {}
    for rule in rules:
        unique.setdefault(rule.key, rule)
    return unique


def _describe_operation(added_ids, deleted_ids, added: int, removed: int) -> str:
    parts = []
    if added_ids:
        parts.append(f"add {len(added_ids)} rule(s)")
    if deleted_ids:
        parts.append(f"delete {len(deleted_ids)} rule(s)")
    if added:
        parts.append(f"add {added} fact(s)")
    if removed:
        parts.append(f"delete {removed} fact(s)")
    return ", ".join(parts) or "no change"
