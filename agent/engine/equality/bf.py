"""Deletion from the rewritten equality component by B/F~ (Motik, Nenov, Piro, Horrocks:
"Combining Rewriting and Incremental Materialisation Maintenance for Datalog Programs with
Equality", IJCAI 2015, Algorithms 1-7; line numbers below are the paper's).

Deleting facts may retract equalities, and a retracted equality may *add* facts to the store:
a class that splits needs its facts back under each new representative. B/F~ marks the
consequences of the deleted facts as doubtful (D), checks each doubtful fact's provability by
backward chaining over the store (checkProvability) while forward chaining proves what the
remaining explicit facts still give within the checked part (saturate, with its own classes
gamma: rewrite), and applies the changes at the end (propagateChanges).

One departure from the paper, by our semantics (docs/semantics.md): a term equals itself only
when an equality names it (``x = x`` follows from ``x = y``), not whenever a fact mentions it
(the paper's rules (=4)). In the store every equality is a class fact ``c = c`` of a
representative, so the paper's handling of (=4) reduces to nothing: line 12 adds ``c = c`` to D
when it is already there, lines 25-28 would check ``c = c`` itself, lines 37-39 are covered by
line 40 (the explicit equalities naming a member of ``c``'s class are exactly those ``c = c``
represents), and line 47 proves the fact being processed. The rest is the paper's.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from itertools import product

from agent.engine.equality.classes import Classes
from agent.engine.equality.component import SAME_AS
from agent.engine.equality.facts import (
    Fact,
    FactIndex,
    consequences,
    represented,
    solve,
    whole_body,
)
from agent.engine.equality.rewriting import EqualityComponent
from agent.engine.language import RelationKey


class BackwardForward:
    """One run of B/F~ over ``component`` (its store, classes and explicit facts)."""

    def __init__(self, component: EqualityComponent) -> None:
        self.component = component
        self.pi = component.classes
        self.store = component.store
        self.gamma = Classes(self.pi.order)  # line 2: identity
        self.gamma_rules = list(component.rules)  # line 2: Gamma := Pi
        self.key_positions: dict[RelationKey, set[int]] = {}  # see ``_keyed``
        for rule in self.gamma_rules:
            if rule.key_position is not None:
                relation = rule.body[0].relation
                self.key_positions.setdefault(relation, set()).add(rule.key_position)
        self.checked: list[Fact] = []  # C, in order of addition
        self.checked_set: set[Fact] = set()
        self.doubtful: list[Fact] = []  # D
        self.doubtful_set: set[Fact] = set()
        self.proved: list[Fact] = []  # P
        self.proved_set: set[Fact] = set()
        self.outdated: set[Fact] = set()  # P-hat
        # The joins and lookups read only facts that are not outdated (a class of k names
        # merging one name at a time outdates k facts naming it, which would otherwise stay
        # in every join on its key): the proved facts naming each term, and V, hold P minus
        # P-hat and V minus P-hat (line 42's test reads V as "V minus P-hat, or P-hat").
        self.proved_by_term: dict[int, set[Fact]] = {}
        self.delayed = FactIndex()  # Y
        self.processed = FactIndex()  # V minus P-hat
        self.done: set[Fact] = set()  # O
        self.disproved: set[Fact] = set()  # S
        self._next_checked = 0  # saturate's position in C
        self._next_proved = 0  # saturate's position in P
        self._next_disproof = 0  # line 7's position in C
        # Proved equalities between two names, processed before the rest of P (its order is
        # free): merging at once normalises what follows, where a queue would first derive
        # the equalities between every two of k names with one key, k^2 of them.
        self._equalities: deque[Fact] = deque()
        self._merges = 0  # gamma's merges so far (the option cache's version)
        self._option_cache: dict[int, tuple[int, set[int]]] = {}
        self.steps = 0  # facts made doubtful, checked or proved (the paper's D count)

    # ------------------------------------------------------------------ sets
    def _add_doubtful(self, fact: Fact) -> None:
        if fact not in self.doubtful_set:
            self.doubtful_set.add(fact)
            self.doubtful.append(fact)
            self.steps += 1

    def _add_checked(self, fact: Fact) -> bool:
        if fact in self.checked_set:
            return False
        self.checked_set.add(fact)
        self.checked.append(fact)
        self.steps += 1
        return True

    def _add_proved(self, fact: Fact) -> None:
        if fact not in self.proved_set:
            self.proved_set.add(fact)
            self.proved.append(fact)
            for term in fact[1]:
                self.proved_by_term.setdefault(term, set()).add(fact)
            if fact[0] == SAME_AS and fact[1][0] != fact[1][1]:
                self._equalities.append(fact)

    def _outdate(self, fact: Fact) -> None:
        """Add ``fact`` to P-hat, and take it out of the indexes that hold only up-to-date
        facts."""
        self.outdated.add(fact)
        self.processed.discard(fact)
        for term in fact[1]:
            facts = self.proved_by_term.get(term)
            if facts is not None:
                facts.discard(fact)

    def _up_to_date(self, fact: Fact) -> bool:
        """In P minus P-hat."""
        return fact in self.proved_set and fact not in self.outdated

    def _gamma(self, fact: Fact) -> Fact:
        return (fact[0], self.gamma.normal(fact[1]))

    def _options(self, term: int) -> set[int]:
        """gamma's representatives of the members of ``term``'s class under pi, cached until
        gamma next merges (a class of k names is not walked again at every test)."""
        cached = self._option_cache.get(term)
        if cached is not None and cached[0] == self._merges:
            return cached[1]
        find = self.gamma.find
        options = {find(member) for member in self.pi.class_of(term)}
        self._option_cache[term] = (self._merges, options)
        return options

    def _image_counts(self, fact: Fact, enough: int | None = None) -> tuple[int, int]:
        """How many of gamma(F^pi), the facts ``fact`` stands for in gamma's normal form, are
        in P minus P-hat (counting stops at ``enough``), and how many there are. Small
        products are enumerated; a large one (a fact of a big class) is counted from the
        proved facts naming its first term."""
        relation, args = fact
        merged = self.pi.rep
        if not any(term in merged for term in args):  # no class: the fact stands for itself
            return int(self._up_to_date((relation, self.gamma.normal(args)))), 1
        options = [self._options(term) for term in args]
        total = 1
        for option in options:
            total *= len(option)
        if enough is None and total > len(self.proved_set):
            return 0, total  # (asked whether all are proved: they cannot all be)
        found = 0
        if total <= 64:
            for combination in product(*options):
                if self._up_to_date((relation, combination)):
                    found += 1
                    if found == enough:
                        break
            return found, total
        for first in options[0]:
            for candidate in self.proved_by_term.get(first, ()):
                found_relation, found_args = candidate
                if (
                    found_relation == relation
                    and found_args[0] == first
                    and all(found_args[i] in options[i] for i in range(1, len(args)))
                ):
                    found += 1
                    if found == enough:
                        return found, total
        return found, total

    def all_proved(self, fact: Fact) -> bool:
        if fact in self.disproved:
            return False
        found, total = self._image_counts(fact)
        return found == total

    def all_disproved(self, fact: Fact) -> bool:
        return self._image_counts(fact, enough=1)[0] == 0

    # ------------------------------------------------------------------ Algorithm 1
    def run(self, deleted: list[Fact]) -> None:
        """Maintain the store after ``deleted`` (as given, not normalised) left the explicit
        facts: lines 3-4's deletion is the caller's, which keeps an undo journal."""
        index = self.component.index
        for fact in deleted:  # lines 3-4
            self._add_doubtful(self.component.normal(fact))
        position = 0
        while position < len(self.doubtful):  # line 5
            fact = self.doubtful[position]
            position += 1
            self.check_provability(fact)  # line 6
            while self._next_disproof < len(self.checked):  # line 7
                candidate = self.checked[self._next_disproof]
                self._next_disproof += 1
                if self.all_disproved(candidate):
                    self.disproved.add(candidate)
            if self.all_proved(fact):  # line 8
                continue
            relation, args = fact
            if relation == SAME_AS and self.pi.size(args[0]) > 1:  # lines 9-11
                for other in list(self.store.with_term(args[0])):
                    if other not in self.done:
                        self._add_doubtful(other)
            rules = self.component.normal_rules  # lines 13-15
            for head in consequences(index, rules, fact, self.store, self.done):
                self._add_doubtful(head)
            self.done.add(fact)  # line 16
        self.propagate_changes()  # line 17

    # ------------------------------------------------------------------ Algorithm 2
    def propagate_changes(self) -> None:
        component = self.component
        changed: set[int] = set()
        for relation, args in self.checked:  # lines 18-19
            if relation == SAME_AS and args[0] == args[1]:
                changed |= self.pi.regroup(args[0], self.gamma.find)
        for fact in self.doubtful:  # line 20
            if not self._up_to_date(fact) and self.store.discard(fact):
                component.note_removed(fact)
        for fact in self.proved:  # line 21
            if fact not in self.outdated:
                normal = component.normal(fact)
                if self.store.add(normal):
                    component.note_added(normal)
        component.changed_terms |= changed
        component.renormalise_rules(changed)

    # ------------------------------------------------------------------ Algorithm 4
    def check_provability(self, root: Fact) -> None:
        """Lines 22-35, with an explicit stack instead of recursion (proofs can be long)."""
        if not self._add_checked(root):  # line 22
            return
        stack = [self._check(root)]
        while stack:
            child = next(stack[-1], None)
            if child is None:
                stack.pop()
            elif self._add_checked(child):
                stack.append(self._check(child))

    def _check(self, fact: Fact) -> Iterator[Fact]:
        """The body of checkProvability(fact) after line 22: yields each fact whose
        provability it checks recursively, and stops once every fact ``fact`` stands for is
        proved.

        The reflexive equalities of ``fact``'s classes (lines 29-31) are checked before the
        first saturation (line 23), not after: until ``c = c`` is checked, no equality
        between two names of ``c``'s class can be proved (Algorithm 7 delays it), so
        saturating first would join each of the class's facts with all the others, still
        apart (k names sharing one key: k^2 delayed equalities). The order of the checks
        is free; what is checked, and so proved, is the same."""
        relation, args = fact
        for term in dict.fromkeys(args):  # lines 29-31, before line 23 (see the docstring)
            reflexive = (SAME_AS, (term, term))
            if reflexive not in self.disproved and self.pi.size(term) > 1:
                yield reflexive
        self.saturate()  # line 23
        if self.all_proved(fact):  # line 24
            return
        rules, index = self.component.normal_rules, self.component.index
        for rule, sigma in index.match_head(rules, fact):  # lines 32-35
            for tau in solve(
                whole_body(rule), self.store, sigma, lambda p, f: f not in self.disproved
            ):
                for atom in rule.body:
                    yield atom.ground(tau)
                    if self.all_proved(fact):
                        return

    # ------------------------------------------------------------------ Algorithm 5
    def saturate(self) -> None:
        explicit = self.component.explicit
        pi = self.pi
        while (
            self._next_checked < len(self.checked)
            or self._next_proved < len(self.proved)
            or self._equalities
        ):
            while self._next_checked < len(self.checked):  # lines 36-40
                fact = self.checked[self._next_checked]
                self._next_checked += 1
                equalities, others = [], []
                for source in (explicit, self.delayed):
                    for given in represented(source, fact, pi.find, pi.class_of):
                        normal = self._gamma(given)
                        if normal[0] == SAME_AS and normal[1][0] != normal[1][1]:
                            equalities.append(normal[1])
                        else:
                            others.append(normal)
                equalities += self._keyed(fact, others)
                if equalities:
                    self.merge_all(equalities)
                    others = [self._gamma(normal) for normal in others]
                for normal in others:
                    self._add_proved(normal)
            while self._equalities or self._next_proved < len(self.proved):  # line 41
                if self._equalities:
                    fact = self._equalities.popleft()
                else:
                    fact = self.proved[self._next_proved]
                    self._next_proved += 1
                if fact in self.outdated or fact in self.processed:  # line 42
                    continue
                self.steps += 1
                normal = self._gamma(fact)  # line 43
                if normal != fact:  # line 44 (in V and P-hat: only the latter is kept)
                    self._outdate(fact)
                    self._add_proved(normal)
                    continue
                self.processed.add(fact)
                if fact[0] == SAME_AS and fact[1][0] != fact[1][1]:  # line 45
                    self.rewrite(fact[1][0], fact[1][1])
                else:  # lines 48-50 (47: see the module docstring)
                    index, rules = self.component.index, self.gamma_rules
                    for head in consequences(index, rules, normal, self.processed):
                        self.prove(head)

    # ------------------------------------------------------------------ Algorithm 6
    def rewrite(self, a: int, b: int) -> None:
        """Lines 51-58. Of the two representatives, the one whose class and proved facts are
        fewer is merged away (its members move, its facts are proved again under the
        other): a class built one name at a time by the order's representative would move
        all its members and facts each time a smaller name joined. ``propagate_changes``
        makes the order's smallest member of each class its representative again
        (``Classes.regroup``)."""
        kept, gone = (a, b) if self._weight(a) >= self._weight(b) else (b, a)
        self.gamma.merge_into(kept, gone)  # lines 51-52
        self._merges += 1
        self._moved({gone})

    def merge_all(self, equalities: list[tuple[int, int]]) -> None:
        """Lines 41-58 for many proved equalities between gamma's representatives at once:
        those lines 36-40 prove together, the explicit equalities a checked ``c = c`` stands
        for (which hold the whole class of ``c`` again) and those key rules derive among the
        facts a checked fact stands for (`_keyed`). Each connected group merges into its heaviest
        representative (see `rewrite`) before any fact is moved or rule re-normalised, so a
        fact naming k merged names is proved again once, not at each of k merges, and no
        equality goes through the queue of proved facts. The group's ``r = r`` is proved,
        as the last of the single merges would prove it (lines 53-54 on the equalities
        themselves); the result is the same (saturation reaches one fixpoint)."""
        parent: dict[int, int] = {}

        def root(term: int) -> int:
            while (up := parent.get(term, term)) != term:
                parent[term] = parent.get(up, up)
                term = up
            return term

        for a, b in equalities:
            a, b = root(a), root(b)
            if a != b:
                parent[b] = a
        groups: dict[int, list[int]] = {}
        for term in parent:
            groups.setdefault(root(term), []).append(term)
        gone: set[int] = set()
        for members in groups.values():
            members.append(root(members[0]))  # (a root has no parent entry)
            kept = max(members, key=self._weight)
            for term in members:
                if term != kept:
                    self.gamma.merge_into(kept, term)  # lines 51-52
                    gone.add(term)
            self._add_proved((SAME_AS, (kept, kept)))
        self._merges += 1
        self._moved(gone)

    def _keyed(self, checked: Fact, facts: list[Fact]) -> list[tuple[int, int]]:
        """The equalities the key rules (``PatternRule.key_position``) derive among ``facts``,
        the facts a checked fact stands for, proved together by lines 36-40: those agreeing
        everywhere but at a rule's key position are equal there. Saturation would derive
        each of them from the two facts, and Algorithm 7 would prove it, since its normal
        form under pi, ``c = c`` for the class ``c`` at that position of ``checked``, is
        checked (else nothing is derived here, and the equalities take the usual path):
        merged at once, the facts have one normal form, processed once, where k names of one
        class with one key would each be processed, joined and merged in turn."""
        found: list[tuple[int, int]] = []
        if len(facts) < 2:
            return found
        relation, args = checked
        for position in self.key_positions.get(relation, ()):
            if (SAME_AS, (args[position], args[position])) not in self.checked_set:
                continue
            first_of: dict[tuple[int, ...], int] = {}
            for _, values in facts:
                term = values[position]
                first = first_of.setdefault(values[:position] + values[position + 1 :], term)
                if first != term:
                    found.append((first, term))
        return found

    def _weight(self, term: int) -> int:
        """What merging representative ``term`` away moves: its proved facts and members."""
        return len(self.proved_by_term.get(term, ())) + self.gamma.size(term)

    def _moved(self, gone: set[int]) -> None:
        """Lines 53-58 after the representatives ``gone`` were merged away in gamma: their
        proved facts are outdated and proved again in normal form, and the rules naming them
        are re-normalised and evaluated again."""
        for term in gone:  # lines 53-54
            for fact in list(self.proved_by_term.get(term, ())):
                self._outdate(fact)
                self._add_proved(self._gamma(fact))
        for number, rule in enumerate(self.gamma_rules):  # lines 55-58
            if rule.constants.isdisjoint(gone):  # (in normal form: only ``gone`` can change)
                continue
            normal = rule.mapped(self.gamma.find)
            self.gamma_rules[number] = normal
            for tau in solve(whole_body(normal), self.processed, {}):
                for head in normal.heads:
                    self.prove(head.ground(tau))

    # ------------------------------------------------------------------ Algorithm 7
    def prove(self, fact: Fact) -> None:
        if self.component.normal(fact) in self.checked_set:  # line 59
            self._add_proved(fact)
        else:
            self.delayed.add(fact)
