"""owl:sameAs by rewriting, maintained incrementally: the layer between the reasoner and the
engine once a program or its facts use ``<http://www.w3.org/2002/07/owl#sameAs>``.

Without equality nothing here runs and nothing costs. With it, the program splits in two
(``sameas/component.py``):

* the *equality component*: ``owl:sameAs`` and every relation it depends on, with their rules
  (positive atoms only). It is materialised with rewriting (``sameas/rewriting.py``): one
  representative per class of equal names, facts in normal form only. Insertions carry the
  materialisation on; deletions run B/F~ (``sameas/bf.py``), or a rematerialisation of the
  component when a cost estimate says that is cheaper (many deletions) or the component's
  rules changed.
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

from .costs import DEFAULT_COSTS, CostPolicy
from .language import Rule, Value
from .sameas.bf import BackwardForward
from .sameas.classes import Classes, is_literal
from .sameas.component import equality_component, normal_rule
from .sameas.facts import Fact, FactIndex
from .sameas.rewriting import EqualityComponent, Evaluate
from .store import DataStore, RelationKey
from .terms import TermDictionary


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
        # The component's relations: none until the first update, which brings every relation
        # it has in (owl:sameAs at least), the engine's copies of their facts replaced.
        self.relations: set[RelationKey] = set()
        self.component_keys: tuple[str, ...] = ()
        # Explicit facts of the other relations, as given, and how many of them each normal
        # form (what the engine holds) stands for.
        self.explicit = FactIndex(positions=False)
        self.normal_of: dict[Fact, Fact] = {}  # a given fact not in normal form -> its form
        self.counts: dict[Fact, int] = {}
        self.maintenance = ""  # how the last update maintained the component, and why
        self.rewritten = True  # the last update rebuilt the component (a saved copy: in full)
        self.undo: list | None = None  # how to undo the update under way (see ``snapshot``)
        self._clashes: tuple | None = None  # (the classes they were found in, the clashes)

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
        yield from self.explicit

    def is_explicit(self, fact: Fact) -> bool:
        return fact in self.component.explicit or fact in self.explicit

    def explicit_count(self) -> int:
        return len(self.component.explicit) + len(self.explicit)

    def clashes(self) -> list[list[Value]]:
        """Every class holding two distinct literals, as its literals (sorted); computed again
        only after classes changed."""
        if self._clashes is None or self._clashes[0] is not self.classes:
            values = self.terms.values
            found = []
            for members in self.classes.classes():
                literals = [values[m] for m in members if is_literal(values[m])]
                if len(literals) > 1:
                    found.append(sorted(literals, key=repr))
            self._clashes = (self.classes, found)
        return self._clashes[1]

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
    def adopt(self, edb: DataStore) -> None:
        """Take over the explicit facts of a reasoner that had no equality so far (all of them
        in normal form: there were no classes)."""
        for key, relation in edb.relations.items():
            for args in relation:
                self.explicit.add((key, args))
                self.counts[(key, args)] = 1

    def load(
        self,
        rules: dict[str, Rule],
        explicit: dict[RelationKey, set],
        representatives: dict[int, int],
        component_facts: dict[RelationKey, set] | None,
    ) -> dict[RelationKey, set]:
        """Rebuild a saved state (agent/persistence.py): the user's rules, the explicit facts
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
                for args in rows:
                    self.explicit.add((key, args))
                    self._count((key, args), None)
        engine: dict[RelationKey, set] = {}
        for key, args in component.store:
            engine.setdefault(key, set()).add(args)
        for key, args in self.counts:
            engine.setdefault(key, set()).add(args)
        return engine

    def engine_program(self, rules: dict[str, Rule]) -> dict[str, Rule]:
        """The engine's program for the user's ``rules``: those outside the component, every
        constant its representative."""
        component_rules, _ = equality_component(rules.values())
        return self._engine_program(rules, component_rules)

    def saved_changes(self) -> tuple[bool, set[Fact], set[Fact], set[int]]:
        """What the last update changed, for a saved copy: (whether to write the component
        in full, its facts that left, those that entered, the terms whose representative
        changed)."""
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
        if a rule deciding equality is not positive. The caller restores a ``snapshot`` if
        the engine then fails."""
        component_rules, relations = equality_component(rules.values())
        component = self.component
        component.start_log()
        removed_given, added_given = [], []
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
            new = [fact for fact in component_additions if self._add(component.explicit, fact)]
            component.rematerialise()
            self.maintenance = (
                "rematerialised (the rules deciding equality changed)"
                if restructure
                else f"rematerialised ({deleted} of the component's explicit facts deleted)"
            )
        else:
            if gone:
                run = BackwardForward(component)
                run.run(gone)
                self.maintenance = f"B/F~ ({deleted} deleted, {run.steps} steps)"
            new = [fact for fact in component_additions if self._add(component.explicit, fact)]
            component.insert(new)
            if new and not deleted:
                self.maintenance = f"insertion ({len(new)} facts)"
        plan = EnginePlan(program={}, facts_added=len(new), facts_deleted=deleted)
        # The rest of the explicit facts.
        for key, rows in deletions.items():
            if key not in relations:
                for args in rows:
                    if self._discard(self.explicit, (key, args)):
                        removed_given.append((key, args))
        for key, rows in additions.items():
            if key not in relations:
                for args in rows:
                    if self._add(self.explicit, (key, args)):
                        added_given.append((key, args))
        plan.facts_added += len(added_given)
        plan.facts_deleted += len(removed_given)
        changes = _Changes(engine_edb)
        for fact in component.left:
            changes.remove(fact)
        for fact in component.entered:
            changes.add(fact)
        for fact in removed_given:
            self._uncount(self._pop(self.normal_of, fact, fact), changes)
        changed = component.changed_terms
        if changed:
            self._renormalise(changed, changes, skip=set(added_given))
        for fact in added_given:
            self._count(fact, changes)
        for key in moved:  # a relation that joined or left the component: all of it anew
            changes.replace(key, self._engine_facts(key, relations))
        plan.add, plan.remove = changes.result()
        if changed:
            self._clashes = None
        plan.program = self._engine_program(rules, component_rules)
        return plan

    def _engine_facts(self, key: RelationKey, relations: set[RelationKey]) -> set:
        if key in relations:
            return set(self.component.store.by_relation.get(key, ()))
        return {normal for (k, normal) in self.counts if k == key}

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
        for fact in [fact for fact in self.explicit if fact[0] in joined]:
            self._discard(self.explicit, fact)
            self._uncount(self._pop(self.normal_of, fact, fact), None)
            self._add(self.component.explicit, fact)
        for fact in [fact for fact in self.component.explicit if fact[0] in left]:
            self._discard(self.component.explicit, fact)
            self._add(self.explicit, fact)
            self._count(fact, None)
        self.relations = relations

    def _count(self, fact: Fact, changes: _Changes | None) -> None:
        normal = (fact[0], self.classes.normal(fact[1]))
        if normal != fact:
            self._set(self.normal_of, fact, normal)
        count = self.counts.get(normal, 0)
        self._set(self.counts, normal, count + 1)
        if not count and changes is not None:
            changes.add(normal)

    def _uncount(self, normal: Fact, changes: _Changes | None) -> None:
        count = self.counts[normal] - 1
        if count:
            self._set(self.counts, normal, count)
        else:
            self._pop(self.counts, normal, None)
            if changes is not None:
                changes.remove(normal)

    def _renormalise(self, changed: set[int], changes: _Changes, skip: set[Fact]) -> None:
        """The given facts naming a term whose representative changed: their new normal form
        (but those of ``skip``, added in this update and counted after)."""
        seen: set[Fact] = set(skip)
        for term in changed:
            for fact in list(self.explicit.with_term(term)):
                if fact in seen:
                    continue
                seen.add(fact)
                old = self.normal_of.get(fact, fact)
                new = (fact[0], self.classes.normal(fact[1]))
                if new == old:
                    continue
                self._pop(self.normal_of, fact, None)
                self._uncount(old, changes)
                self._count(fact, changes)

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

    def _discard(self, index: FactIndex, fact: Fact) -> bool:
        if not index.discard(fact):
            return False
        if self.undo is not None:
            self.undo.append(partial(index.add, fact))
        return True

    def _set(self, mapping: dict, key, value) -> None:
        if self.undo is not None:
            self.undo.append(partial(_put_back, mapping, key, mapping.get(key, _MISSING)))
        mapping[key] = value

    def _pop(self, mapping: dict, key, default):
        if key not in mapping:
            return default
        value = mapping.pop(key)
        if self.undo is not None:
            self.undo.append(partial(_put_back, mapping, key, value))
        return value

    def snapshot(self) -> tuple:
        """What ``restore`` needs to undo the next ``plan``: the small parts copied (classes
        of merged terms, rules), the rest undone from the journal ``plan`` keeps."""
        component = self.component
        component.start_log()  # (``restore`` undoes the log: it must be this update's alone)
        self.undo = []
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
        self.undo = None

    def restore(self, saved: tuple) -> None:
        component = self.component
        classes, copied, store, rules, normal_rules, index, relations, keys, how, undo = saved
        for step in reversed(undo):
            step()
        if component.store is store:  # changed in place: its changes logged since start_log
            for fact in component.entered:
                store.discard(fact)
            for fact in component.left:
                store.add(fact)
        component.store = store
        component.classes = copied if component.classes is classes else classes
        component.rules, component.normal_rules, component.index = rules, normal_rules, index
        self.relations, self.component_keys, self.maintenance = relations, keys, how
        component.start_log()
        self.undo = None


_MISSING = object()


def _put_back(mapping: dict, key, value) -> None:
    if value is _MISSING:
        mapping.pop(key, None)
    else:
        mapping[key] = value


class _Changes:
    """Changes to the engine's explicit facts, netted, checked against what it holds."""

    def __init__(self, edb: DataStore) -> None:
        self.edb = edb
        self.added: set[Fact] = set()
        self.removed: set[Fact] = set()

    def _holds(self, fact: Fact) -> bool:
        relation = self.edb.get(fact[0])
        return relation is not None and fact[1] in relation

    def add(self, fact: Fact) -> None:
        self.removed.discard(fact)
        if not self._holds(fact):
            self.added.add(fact)

    def remove(self, fact: Fact) -> None:
        self.added.discard(fact)
        if self._holds(fact):
            self.removed.add(fact)

    def replace(self, key: RelationKey, facts: set) -> None:
        relation = self.edb.get(key)
        held = set(relation) if relation is not None else set()
        for args in held - facts:
            self.remove((key, args))
        for args in facts:
            self.add((key, args))
        for args in held & facts:
            self.removed.discard((key, args))

    def result(self) -> tuple[dict, dict]:
        added: dict[RelationKey, list] = {}
        removed: dict[RelationKey, list] = {}
        for key, args in self.added:
            added.setdefault(key, []).append(args)
        for key, args in self.removed:
            removed.setdefault(key, []).append(args)
        return added, removed
