"""owl:sameAs by rewriting, maintained incrementally: the layer between the reasoner and the
engine once a program or its facts use ``<http://www.w3.org/2002/07/owl#sameAs>``.

Without equality nothing here runs and nothing costs. With it, the program splits in two
(``sameas/component.py``):

* the *equality component*: ``owl:sameAs`` and every relation it depends on, with their rules
  (positive atoms only). It is materialised with rewriting (``sameas/rewriting.py``): one
  representative per class of equal names, facts in normal form only. Insertions carry the
  materialisation on; deletions run B/F~ (``sameas/bf.py``), or a rematerialisation of the
  component when a cost estimate says that is cheaper (many deletions) or the component's
  rules changed. A component whose rules are all keys (``owl:sameAs(X, Y) :- email(X, E),
  email(Y, E)``, the usual record linkage) is rematerialised by grouping facts on each key,
  and its deletions close again only the classes that may split (``sameas/keys.py``).
* the rest of the program, evaluated and maintained by the engine as always, over the
  component's facts and the other explicit facts, all in normal form, with every constant of
  its rules replaced by its representative. When a class merges or splits, the explicit facts
  and rules naming a term whose representative changed are replaced by their new normal forms
  in the same engine update, so the engine's own incremental maintenance does the rest.

Readers see the expanded model (``sameas/expansion.py``): every fact for every combination of
the names of its terms' classes, and ``owl:sameAs`` between every two names of a class.
Literals are terms like any other, but two distinct literals in one class are a *clash*
(``3 = 5``): reported in every update's report and in ``stats()``, never an error.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import partial

from agent.engine.costs import DEFAULT_COSTS, CostPolicy
from agent.engine.equality.bf import BackwardForward
from agent.engine.equality.classes import Classes, is_literal
from agent.engine.equality.component import equality_component, normal_rule
from agent.engine.equality.facts import Fact, FactIndex, represented
from agent.engine.equality.given import GivenFacts
from agent.engine.equality.key_rules import KeyDeletion, key_columns
from agent.engine.equality.rewriting import EqualityComponent, Evaluate
from agent.engine.language import Rule, Value
from agent.engine.storage.store import DataStore, RelationKey, by_relation
from agent.engine.terms import TermDictionary


@dataclass
class EnginePlan:
    """What the engine must do for one update: its program, and its explicit facts' changes."""

    program: dict[str, Rule]
    add: dict[RelationKey, list[tuple[int, ...]]] = field(default_factory=dict)
    remove: dict[RelationKey, list[tuple[int, ...]]] = field(default_factory=dict)
    facts_added: int = 0
    facts_deleted: int = 0


class EqualityLayer:
    """The classes of equal terms, the equality component, and the explicit facts as given
    (see the module docstring)."""

    def __init__(
        self,
        terms: TermDictionary,
        costs: CostPolicy = DEFAULT_COSTS,
        evaluate: Evaluate | None = None,
    ) -> None:
        self.terms = terms
        self.costs = costs
        self.component = EqualityComponent(terms, evaluate)
        self.component.by_keys = costs.equality_key_closure
        # The component's relations: none until the first update, which brings every relation
        # it has in (owl:sameAs at least), the engine's copies of their facts replaced.
        self.relations: set[RelationKey] = set()
        self.component_keys: tuple[str, ...] = ()
        # Explicit facts of the other relations, as given, and the normal forms they stand for.
        self.given = GivenFacts()
        self.maintenance = ""  # how the last update maintained the component, and why
        self.rewritten = True  # the last update rebuilt the component (a saved copy: in full)
        self.undo: list | None = None  # how to undo the update under way (see ``snapshot``)
        self._clashing: dict[int, list[Value]] = {}  # representative -> its clash
        self._clashes_of: Classes | None = None  # the classes _clashing describes

    @property
    def classes(self) -> Classes:
        return self.component.classes

    # ------------------------------------------------------------------ reading
    def representative_value(self, value: Value) -> Value:
        """The value representing ``value`` (``value`` itself, the same object, when it
        represents itself or is unknown)."""
        term = self.terms.lookup(value)
        if term is None:
            return value
        rep = self.classes.find(term)
        return value if rep == term else self.terms.values[rep]

    def explicit_facts(self) -> Iterable[Fact]:
        yield from self.component.explicit
        yield from self.given

    def is_explicit(self, fact: Fact) -> bool:
        return fact in self.component.explicit or fact in self.given

    def explicit_count(self) -> int:
        return len(self.component.explicit) + len(self.given)

    def given_as(self, fact: Fact) -> list[Fact]:
        """The explicit facts, as given, whose normal form is ``fact`` (a fact in normal form)."""
        if fact[0] in self.relations:
            classes = self.classes
            return represented(self.component.explicit, fact, classes.find, classes.class_of)
        return self.given.represented(fact)

    def clashes(self) -> list[list[Value]]:
        """Every class holding two distinct literals, as its literals (sorted). Kept per
        class: an update checks again the classes its changed terms are in and those that
        clashed before (a class losing a member), never every class."""
        classes = self.classes
        if self._clashes_of is not classes:  # new classes (rematerialised, undone): all anew
            self._clashing = {}
            self._clashes_of = classes
            self._check_clashes(classes.members)
        return sorted(self._clashing.values(), key=repr)

    def _check_clashes(self, representatives: Iterable[int]) -> None:
        classes, values = self.classes, self.terms.values
        for rep in representatives:
            members = classes.members.get(rep) if classes.find(rep) == rep else None
            literals = [values[m] for m in members or () if is_literal(values[m])]
            if len(literals) > 1:
                self._clashing[rep] = sorted(literals, key=repr)
            else:
                self._clashing.pop(rep, None)

    def stats(self) -> dict:
        sizes = [len(members) for members in self.classes.classes()]
        return {
            "classes": len(sizes),
            "largest_class": max(sizes, default=1),
            "merged_names": sum(sizes),
            "clashes": self.clashes(),
            "component_rules": len(self.component.rules),
            "component_relations": sorted(f"{name}/{arity}" for name, arity in self.relations),
            "component_facts": len(self.component.store),
            "maintenance": self.maintenance,
            # rule instances the component evaluated fact by fact (insertions; rounds and
            # B/F~ count theirs in ``maintenance``)
            "derivations": self.component.derivations,
        }

    # ------------------------------------------------------------------ updating
    def start_from(self, edb: DataStore) -> None:
        """Take over the explicit facts of a reasoner that had no equality so far (all of them
        in normal form: there were no classes)."""
        for key, relation in edb.relations.items():
            self.given.count(key, self.given.add(key, relation.as_set()), self.classes, None)

    def load(
        self,
        rules: dict[str, Rule],
        explicit: dict[RelationKey, set],
        representatives: dict[int, int],
        component_facts: dict[RelationKey, set] | None,
    ) -> dict[RelationKey, set]:
        """Rebuild a saved state (agent/state/agent_state.py): the user's rules, the explicit facts
        as given, each merged term's representative and the component's stored facts (None if
        they were not saved: the component is then rematerialised, which recomputes only it).
        Returns the engine's explicit facts."""
        component_rules, relations = equality_component(rules.values())
        component = self.component
        classes = component.classes
        for term, rep in representatives.items():
            classes.rep[term] = rep
            classes.members.setdefault(rep, {rep}).add(term)
            classes.rep[rep] = rep
        self.relations = relations
        self.component_keys = tuple(rule.key for rule in component_rules)
        component.set_rules(component_rules)
        for key, rows in explicit.items():
            for args in rows:
                if key in relations:
                    component.explicit.add((key, args))
        if component_facts is None:
            component.rematerialise()
        else:
            for key, rows in component_facts.items():
                for args in rows:
                    component.store.add((key, args))
        for key, rows in explicit.items():
            if key not in relations:
                self.given.count(key, self.given.add(key, rows), classes, None)
        engine = self.given.engine_facts()
        for key, rows in component.store.by_relation.items():
            if rows:
                engine.setdefault(key, set()).update(rows)
        return engine

    def engine_program(self, rules: dict[str, Rule]) -> dict[str, Rule]:
        """The engine's program for the user's ``rules``: those outside the component, every
        constant its representative."""
        component_rules, _ = equality_component(rules.values())
        return self._engine_program(rules, component_rules)

    def saved_changes(self) -> tuple[bool, dict, dict, set[int]]:
        """What the last update changed, for a saved copy: (whether to write the component
        in full, its facts that left and those that entered, each by relation, the terms whose
        representative changed)."""
        component = self.component
        return self.rewritten, component.left, component.entered, component.changed_terms

    def plan(
        self,
        rules: dict[str, Rule],
        additions: dict[RelationKey, list[tuple[int, ...]]],
        deletions: dict[RelationKey, list[tuple[int, ...]]],
        engine_edb: DataStore,
    ) -> EnginePlan:
        """Apply the explicit fact changes and the program ``rules`` (the user's, by key);
        return what the engine must do. Raises StratificationError, before changing anything,
        if a rule deciding equality is not positive. The caller takes a ``snapshot`` first
        (which starts the component's log of this update; a new layer's log is empty) and
        restores it if the engine then fails."""
        component_rules, relations = equality_component(rules.values())
        component = self.component
        keys = tuple(rule.key for rule in component_rules)
        moved = relations ^ self.relations
        restructure = keys != self.component_keys or bool(moved)
        if restructure:
            self._move_relations(relations)
            component.set_rules(component_rules)
            self.component_keys = keys
        component_deletions = [
            (key, args) for key, rows in deletions.items() if key in relations for args in rows
        ]
        component_additions = [
            (key, args) for key, rows in additions.items() if key in relations for args in rows
        ]
        deleted = sum(1 for fact in component_deletions if fact in component.explicit)
        share = self.costs.equality_rematerialise_share
        many = deleted > share * max(1, len(component.explicit))
        self.rewritten = restructure or many
        gone = [fact for fact in component_deletions if self._discard(component.explicit, fact)]
        if restructure or many:
            new = self._add_all(component.explicit, component_additions)
            component.rematerialise()
            self.maintenance = (
                "rematerialised (the rules deciding equality changed)"
                if restructure
                else f"rematerialised ({deleted} of the component's explicit facts deleted)"
            )
        else:
            keys = key_columns(component.rules) if component.by_keys else None
            if gone and keys is not None:
                closing = KeyDeletion(component, keys)
                closing.run(gone)
                self.maintenance = (
                    f"keys closed again ({deleted} deleted, {closing.names} names of classes "
                    "that may split)"
                )
            elif gone:
                run = BackwardForward(component)
                run.run(gone)
                self.maintenance = f"B/F~ ({deleted} deleted, {run.steps} steps)"
            new = self._add_all(component.explicit, component_additions)
            component.insert(new)
            if new and not deleted:
                self.maintenance = f"insertion ({len(new)} facts)"
        plan = EnginePlan(program={}, facts_added=len(new), facts_deleted=deleted)
        # The rest of the explicit facts, a relation at a time.
        changes = _Changes(engine_edb)
        for key, rows in component.left.items():
            changes.remove(key, rows)
        for key, rows in component.entered.items():
            changes.add(key, rows)
        given = self.given
        for key, rows in deletions.items():
            if key not in relations:
                plan.facts_deleted += given.remove(key, rows, changes)
        added_given = {
            key: given.add(key, rows) for key, rows in additions.items() if key not in relations
        }
        changed = component.changed_terms
        if changed:
            given.renormalise(changed, self.classes, changes, skip=added_given)
        for key, rows in added_given.items():
            plan.facts_added += len(rows)
            given.count(key, rows, self.classes, changes)
        for key in moved:  # a relation that joined or left the component: all of it anew
            changes.replace(key, self._engine_facts(key, relations))
        plan.add, plan.remove = changes.result()
        if changed and self._clashes_of is self.classes:  # (else clashes() starts anew)
            find = self.classes.find
            self._check_clashes({*self._clashing, *map(find, changed)})
        plan.program = self._engine_program(rules, component_rules)
        return plan

    def _engine_facts(self, key: RelationKey, relations: set[RelationKey]) -> set:
        if key in relations:
            return set(self.component.store.by_relation.get(key, ()))
        return self.given.engine_rows(key)

    def _engine_program(self, rules: dict[str, Rule], component: list[Rule]) -> dict[str, Rule]:
        inside = {rule.key for rule in component}
        program: dict[str, Rule] = {}
        for key, rule in rules.items():
            if key in inside:
                continue
            engine_rule = normal_rule(rule, self.representative_value)
            program.setdefault(engine_rule.key, engine_rule)
        return program

    def _move_relations(self, relations: set[RelationKey]) -> None:
        """Explicit facts change sides when their relation joins or leaves the component."""
        joined = relations - self.relations
        left = self.relations - relations
        given = self.given
        for key in joined:
            rows = list(given.of(key))
            given.remove(key, rows, None)
            for args in rows:
                self._add(self.component.explicit, (key, args))
        for key in left:
            rows = list(self.component.explicit.by_relation.get(key, ()))
            for args in rows:
                self._discard(self.component.explicit, (key, args))
            given.count(key, given.add(key, rows), self.classes, None)
        self.relations = relations

    # ------------------------------------------------------------------ rollback
    # An update changes the layer in place and records how to undo each change (``undo``),
    # so that an engine failure after ``plan`` (a budget exceeded) restores it at the cost of
    # what changed, not of a copy of every explicit fact taken before each update.
    def _add(self, index: FactIndex, fact: Fact) -> bool:
        if not index.add(fact):
            return False
        if self.undo is not None:
            self.undo.append(partial(index.discard, fact))
        return True

    def _add_all(self, index: FactIndex, facts: list[Fact]) -> list[Fact]:
        """`_add` of many facts, a relation at a time; returns those that were new."""
        new: list[Fact] = []
        for key, rows in by_relation(facts).items():
            added = index.add_rows(key, rows)
            if added and self.undo is not None:
                self.undo.append(partial(index.discard_rows, key, added))
            new.extend((key, args) for args in added)
        return new

    def _discard(self, index: FactIndex, fact: Fact) -> bool:
        if not index.discard(fact):
            return False
        if self.undo is not None:
            self.undo.append(partial(index.add, fact))
        return True

    def snapshot(self) -> tuple:
        """What ``restore`` needs to undo the next ``plan``: the small parts copied (classes
        of merged terms, rules), the rest undone from the journal ``plan`` keeps."""
        component = self.component
        component.start_log()  # (``restore`` undoes the log: it must be this update's alone)
        self.undo = self.given.undo = []
        return (
            component.classes,
            component.classes.copy(),
            component.store,
            list(component.rules),
            list(component.normal_rules),
            component.index,
            self.relations,
            self.component_keys,
            self.maintenance,
            self.undo,
        )

    def commit(self) -> None:
        """The update went through: forget how to undo it."""
        self.undo = self.given.undo = None
        self.given.commit()

    def restore(self, saved: tuple) -> None:
        component = self.component
        classes, copied, store, rules, normal_rules, index, relations, keys, how, undo = saved
        for step in reversed(undo):
            step()
        if component.store is store:  # changed in place: its changes logged since start_log
            for key, rows in component.entered.items():
                store.discard_rows(key, rows)
            for key, rows in component.left.items():
                store.add_rows(key, rows)
        component.store = store
        component.classes = copied if component.classes is classes else classes
        component.rules, component.normal_rules, component.index = rules, normal_rules, index
        self.relations, self.component_keys, self.maintenance = relations, keys, how
        component.start_log()
        self.undo = self.given.undo = None
        self.given.stale = []  # (the undone update's deletions are given again)


class _Changes:
    """Changes to the engine's explicit facts by relation, netted, checked against what it
    holds."""

    def __init__(self, edb: DataStore) -> None:
        self.edb = edb
        self.added: dict[RelationKey, set[tuple[int, ...]]] = {}
        self.removed: dict[RelationKey, set[tuple[int, ...]]] = {}

    def add(self, key: RelationKey, rows: Iterable[tuple[int, ...]]) -> None:
        rows = set(rows)
        removed = self.removed.get(key)
        if removed:
            removed -= rows
        relation = self.edb.get(key)
        new = rows if relation is None else relation.absent(rows)
        if new:
            self.added.setdefault(key, set()).update(new)

    def remove(self, key: RelationKey, rows: Iterable[tuple[int, ...]]) -> None:
        rows = set(rows)
        added = self.added.get(key)
        if added:
            added -= rows
        relation = self.edb.get(key)
        held = relation.present(rows) if relation is not None else ()
        if held:
            self.removed.setdefault(key, set()).update(held)

    def replace(self, key: RelationKey, rows: set[tuple[int, ...]]) -> None:
        relation = self.edb.get(key)
        held = relation.as_set() if relation is not None else set()
        self.remove(key, held - rows)
        self.add(key, rows)

    def result(self) -> tuple[dict, dict]:
        return (
            {key: list(rows) for key, rows in self.added.items() if rows},
            {key: list(rows) for key, rows in self.removed.items() if rows},
        )
