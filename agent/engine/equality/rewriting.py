"""The equality component materialised with rewriting (Motik et al., AAAI 2015), and kept up
to date under insertions by carrying on from where the materialisation stopped.

Facts are stored in normal form only (every term its class's representative): a class of k
equal names holding a fact costs one fact, not k^2 copies and k^3 derivations. An equality
between two representatives merges their classes: every stored fact naming the one that is no
longer a representative leaves the store and comes back in normal form, and every rule whose
constants changed is normalised again and evaluated anew.

The component keeps a log of what changed since ``start_log``: facts that entered and left the
store, by relation (their args are the store's own tuples, so dropping the log of a whole
materialisation frees no tuples), and terms whose representative changed, for the engine above
it (``equality.py``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from collections.abc import Set as AbstractSet

from pyroaring import BitMap

from agent.engine.equality.classes import Classes, value_order
from agent.engine.equality.component import EDGE, SAME_AS, normal_rule, renamed
from agent.engine.equality.facts import (
    Fact,
    FactIndex,
    PatternRule,
    RuleIndex,
    consequences,
    solve,
    whole_body,
)
from agent.engine.equality.key_rules import close_under_keys, key_columns, store_facts
from agent.engine.language import RelationKey, Rule
from agent.engine.storage.subject_facts import SubjectFacts, as_bitmap
from agent.engine.terms import TermDictionary

Evaluate = Callable[[list[Rule], dict], dict]


class EqualityComponent:
    """The equality component's explicit facts (as given), its rules, and its rewritten
    materialisation ``store`` with the classes ``classes`` (the paper's E, Pi, I and pi)."""

    def __init__(self, terms: TermDictionary, evaluate: Evaluate | None = None) -> None:
        self.terms = terms
        # A set-at-a-time evaluator of positive rules over facts by relation, returning every
        # relation's facts after (the reasoner passes its engine's): rematerialisations run by
        # rounds of it instead of fact by fact (``_by_rounds``).
        self.evaluate = evaluate
        values = terms.values
        self.classes = Classes(lambda term: value_order(values[term]))
        self.explicit = FactIndex()
        self.store = FactIndex()
        self.rules: list[PatternRule] = []
        self.normal_rules: list[PatternRule] = []
        self.index = RuleIndex([])
        self.derivations = 0  # rule instances evaluated, for the benchmark and stats
        # Rematerialise a component of keys only by grouping facts (keys.py); tests turn it
        # off to compare it with evaluating the rules.
        self.by_keys = True
        self.start_log()

    # ------------------------------------------------------------------ the change log
    def start_log(self) -> None:
        self.entered: dict[RelationKey, set[tuple[int, ...]]] = {}
        self.left: dict[RelationKey, set[tuple[int, ...]]] = {}
        self.changed_terms: set[int] = set()

    def note_added(self, fact: Fact) -> None:
        _note(fact, self.entered, self.left)

    def note_removed(self, fact: Fact) -> None:
        _note(fact, self.left, self.entered)

    # ------------------------------------------------------------------ rules
    def set_rules(self, rules: Iterable[Rule]) -> None:
        """Replace the rules (the caller rematerialises)."""
        self.rules = [PatternRule.encode(rule, self.terms) for rule in rules]
        self.normal_rules = [rule.mapped(self.classes.find) for rule in self.rules]
        self.index = RuleIndex(self.rules)

    def renormalise_rules(self, changed: set[int]) -> list[PatternRule]:
        """Normalise again the rules naming a term of ``changed``; returns those that changed."""
        renewed = []
        for number, rule in enumerate(self.rules):
            if rule.constants & changed:
                normal = rule.mapped(self.classes.find)
                if normal != self.normal_rules[number]:
                    self.normal_rules[number] = normal
                    renewed.append(normal)
        return renewed

    # ------------------------------------------------------------------ materialisation
    def normal(self, fact: Fact) -> Fact:
        return (fact[0], self.classes.normal(fact[1]))

    def rematerialise(self) -> None:
        """Compute the store afresh from the explicit facts (the paper's Remat~)."""
        old_store, old_classes = self.store, self.classes
        # The store as it was when the log started, a relation at a time.
        baseline = {key: set(rows) for key, rows in old_store.by_relation.items()}
        for key, rows in self.entered.items():
            baseline[key] -= rows
        for key, rows in self.left.items():
            baseline.setdefault(key, set()).update(rows)
        changed = set(self.changed_terms)
        self.classes = Classes(old_classes.order)
        self.store = FactIndex()
        self.normal_rules = list(self.rules)
        keys = key_columns(self.rules) if self.by_keys else None
        if keys is not None:
            close_under_keys(self.classes, self.explicit, keys)
            store_facts(self.classes, self.explicit, keys, self.store)
        elif self.evaluate is None:
            self.insert(list(self.explicit))
        else:
            self._by_rounds()
        old_find, new_find = old_classes.find, self.classes.find
        touched = {term for term, _ in old_classes.rep.items() ^ self.classes.rep.items()}
        changed |= {term for term in touched if old_find(term) != new_find(term)}
        self.changed_terms = changed
        self.entered, self.left = {}, {}
        for key in baseline.keys() | self.store.by_relation.keys():
            before = baseline.get(key, set())
            after = self.store.by_relation.get(key, set())
            self.entered[key] = after - before
            self.left[key] = before - after

    def _by_rounds(self) -> None:
        """The materialisation by rounds of the engine's own set-at-a-time evaluation
        (``evaluate``, owl:sameAs renamed a plain relation): the rules over the explicit facts
        in normal form, then every equality they derived between two representatives merged,
        until a round merges nothing. Classes only grow, and each round starts again from the
        explicit facts, so the last round's facts are the rewritten materialisation."""
        classes, terms = self.classes, self.terms
        sources = [rule.source for rule in self.rules]

        def representative(value):
            term = terms.lookup(value)
            rep = classes.find(term) if term is not None else None
            return value if rep is None or rep == term else terms.values[rep]

        while True:
            facts = {
                EDGE if key == SAME_AS else key: set(classes.normal_rows(list(rows)))
                for key, rows in self.explicit.by_relation.items()
                if rows
            }
            rules = [normal_rule(renamed(rule), representative) for rule in sources]
            derived = self.evaluate(rules, facts)  # type: ignore[misc]
            if not merge_edges(classes, derived.get(EDGE, ())):
                break
        for key, rows in derived.items():
            self.store.add_rows(SAME_AS if key == EDGE else key, classes.normal_rows(list(rows)))
        self.normal_rules = [rule.mapped(classes.find) for rule in self.rules]

    def insert(self, facts: Iterable[Fact]) -> None:
        """Carry the materialisation on from new explicit facts (already in ``explicit``)."""
        queue: deque[Fact] = deque(facts)
        store, classes = self.store, self.classes
        while queue:
            relation, args = queue.popleft()
            fact = (relation, classes.normal(args))
            if relation == SAME_AS and fact[1][0] != fact[1][1]:
                self._merge(fact[1][0], fact[1][1], queue)
                continue
            if not store.add(fact):
                continue
            self.note_added(fact)
            for head in consequences(self.index, self.normal_rules, fact, store):
                self.derivations += 1
                if head[0] == SAME_AS and head[1][0] != head[1][1]:
                    queue.appendleft(head)  # merge first: what follows is then normalised
                else:
                    queue.append(head)

    def _merge(self, a: int, b: int, queue: deque[Fact]) -> None:
        before = {a: set(self.classes.class_of(a)), b: set(self.classes.class_of(b))}
        kept, gone = self.classes.merge(a, b)
        moved = before[gone]  # their representative was ``gone``; now it is ``kept``
        self.changed_terms |= moved
        # Facts naming the old representative leave and come back in normal form.
        for fact in list(self.store.with_term(gone)):
            self.store.discard(fact)
            self.note_removed(fact)
            queue.append(fact)
        queue.append((SAME_AS, (kept, kept)))
        for rule in self.renormalise_rules(moved):
            for tau in solve(whole_body(rule), self.store, {}):
                self.derivations += 1
                queue.extend(head.ground(tau) for head in rule.heads)


def _note(fact: Fact, into: dict[RelationKey, set], against: dict[RelationKey, set]) -> None:
    """Log ``fact`` in ``into`` (entered or left), unless it cancels its entry in ``against``
    (a fact that left and came back in one update did neither)."""
    relation, args = fact
    opposite = against.get(relation)
    if opposite is not None and args in opposite:
        opposite.discard(args)
        return
    rows = into.get(relation)
    if rows is None:
        into[relation] = {args}
    else:
        rows.add(args)


def merge_edges(classes: Classes, edges: AbstractSet[tuple[int, int]]) -> bool:
    """Merge the classes of both terms of every pair of ``edges``; returns whether any two
    classes merged. A subject holding many pairs (``SubjectFacts``) is read against its class
    as a bitmap: a first round over names not merged yet derives k^2 equalities from a key k
    names share, which take k - 1 merges, and the rest is a set difference in C."""
    find = classes.find
    as_bitmaps: dict[int, BitMap] = {}  # representative -> its class, for this pass
    merged = False

    def join(rep: int, other: int) -> int:
        nonlocal merged
        mine, theirs = as_bitmaps.pop(rep, None), as_bitmaps.pop(other, None)
        kept, _ = classes.merge(rep, other)
        if mine is not None and theirs is not None:
            mine |= theirs
            as_bitmaps[kept] = mine
        merged = True
        return kept

    if not isinstance(edges, SubjectFacts):
        for a, b in edges:
            a, b = find(a), find(b)
            if a != b:
                join(a, b)
        return merged
    for a, objects in edges.by_subject.items():
        rep = find(a)
        if len(objects) <= 16:  # (most subjects: themselves, a name or two)
            for b in objects:
                other = find(b)
                if other != rep:
                    rep = join(rep, other)
            continue
        known = as_bitmaps.get(rep)
        if known is None:
            known = as_bitmaps[rep] = BitMap(classes.class_of(rep))
        for b in as_bitmap(objects) - known:
            other = find(b)
            if other != rep:
                if other not in as_bitmaps:
                    as_bitmaps[other] = BitMap(classes.class_of(other))
                rep = join(rep, other)
    return merged
