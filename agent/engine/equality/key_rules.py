"""Materialising an equality component made of keys only, by grouping facts instead of
evaluating rules.

``owl:sameAs(X, Y) :- email(X, E), email(Y, E)`` (an inverse-functional property),
``owl:sameAs(Y, Z) :- hasAdvisor(X, Y), hasAdvisor(X, Z)`` (a functional one) and keys over
more columns are how record linkage usually decides which names are equal. When they are the
component's only rules (`key_columns`), nothing but explicit facts feeds them, and the
materialisation is a union-find closure: the terms at the key's position of the facts that
agree at every other position (in normal form) are one class. A merge can make more facts
agree, so the groups are formed again, until a pass over every key merges nothing. Evaluated
as rules instead, each group of k names derives k^2 equalities, each a tuple, and the rules
run once more after each round of merges to see whether the merges made more facts agree.

The component's store then holds what those rules would: every explicit fact in normal form,
and ``c = c`` for the representative ``c`` at the key's position of every fact a key reads
(the instance that pairs the fact with itself); `tests/engine/test_equality.py` checks the two ways
give the same store.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from operator import itemgetter
from typing import Protocol

from agent.engine.equality.classes import Classes
from agent.engine.equality.component import SAME_AS
from agent.engine.equality.facts import Fact, FactIndex, PatternRule, represented
from agent.engine.language import RelationKey

Key = tuple[RelationKey, int]  # a relation and the position its key rule makes equal


class Rewritten(Protocol):
    """What `KeyDeletion` changes of the equality component (rewriting.py), and its log."""

    classes: Classes
    explicit: FactIndex
    store: FactIndex
    changed_terms: set[int]

    def note_added(self, fact: Fact) -> None: ...

    def note_removed(self, fact: Fact) -> None: ...


def key_columns(rules: Sequence[PatternRule]) -> list[Key] | None:
    """``(relation, position)`` of every rule when each is a key (`PatternRule.key_position`)
    over a relation other than owl:sameAs (so no rule derives what a key reads); None when
    some rule is not, or there are none."""
    keys: list[Key] = []
    for rule in rules:
        position = rule.key_position
        relation = rule.body[0].relation if rule.body else SAME_AS
        if position is None or relation == SAME_AS:
            return None
        keys.append((relation, position))
    return list(dict.fromkeys(keys)) or None


def close_under_keys(classes: Classes, explicit: FactIndex, keys: list[Key]) -> None:
    """Merge in ``classes`` the terms the explicit owl:sameAs facts and ``keys`` make equal,
    until no pass merges anything."""
    by_key = [
        (relation, position, explicit.by_relation.get(relation, ())) for relation, position in keys
    ]
    _close(classes, explicit.by_relation.get(SAME_AS, ()), by_key)


def _close(
    classes: Classes,
    equalities: Iterable[tuple[int, ...]],
    by_key: list[tuple[RelationKey, int, Collection[tuple[int, ...]]]],
) -> None:
    """Merge the terms of each of ``equalities``, then, pass after pass until one merges
    nothing, the terms at ``position`` of the rows of each ``(relation, position, rows)``
    of ``by_key`` that agree everywhere else in normal form."""
    find = classes.find
    for a, b in equalities:
        classes.merge_group((find(a), find(b)))
    while True:
        merged = False
        for relation, position, rows in by_key:
            if not rows:
                continue
            others = _others(relation[1], position)
            groups: dict[object, list[int]] = {}
            for args in classes.normal_rows(list(rows)):
                key = others(args)
                group = groups.get(key)
                if group is None:
                    groups[key] = [args[position]]
                else:
                    group.append(args[position])
            for names in groups.values():
                if len(names) > 1 and classes.merge_group(map(find, names)):
                    merged = True
        if not merged:
            return


def store_facts(classes: Classes, explicit: FactIndex, keys: list[Key], store: FactIndex) -> None:
    """Fill ``store`` with what the key rules derive over ``explicit`` under the closed
    ``classes``: the explicit facts in normal form and each key's ``c = c``."""
    for relation, rows in _derived(classes, _positions(keys), explicit.by_relation).items():
        store.add_rows(relation, rows)


def _derived(
    classes: Classes,
    positions: dict[RelationKey, list[int]],
    rows_by_relation: Mapping[RelationKey, Collection[tuple[int, ...]]],
) -> dict[RelationKey, set[tuple[int, ...]]]:
    """What the key rules (``positions``: relation -> its keys' positions) give the store for
    explicit rows, under the classes now: each row in normal form, and ``c = c`` for the
    class ``c`` at each key's position of each row (the instance pairing a fact with itself).
    """
    found: dict[RelationKey, set[tuple[int, ...]]] = {SAME_AS: set()}
    for relation, rows in rows_by_relation.items():
        if not rows:
            continue
        normal = classes.normal_rows(list(rows))
        found.setdefault(relation, set()).update(normal)
        for position in positions.get(relation, ()):
            found[SAME_AS].update((args[position], args[position]) for args in normal)
    return found


def _positions(keys: list[Key]) -> dict[RelationKey, list[int]]:
    """Each key relation's key positions."""
    positions: dict[RelationKey, list[int]] = {}
    for relation, position in keys:
        positions.setdefault(relation, []).append(position)
    return positions


def _others(arity: int, position: int) -> Callable[[tuple[int, ...]], object]:
    """The args of a fact but the one at ``position`` (what facts must agree on)."""
    columns = [i for i in range(arity) if i != position]
    if not columns:
        return lambda args: ()
    return itemgetter(*columns)


class KeyDeletion:
    """Deleting explicit facts from a component of keys only (`key_columns`): the classes
    that may split are taken apart and closed again over the facts naming their members, and
    the store's facts those facts and the deleted ones stand for are replaced: a
    rematerialisation of exactly the part a deletion can change, in place of B/F~'s
    fact-by-fact proofs (bf.py), which it gives the same result as
    (`tests/engine/test_equality.py`).

    Why the part is exact: deleting facts only splits classes. A class may split when a
    deleted fact had a term of it at a key's position (or was an owl:sameAs naming it), or
    when a fact naming one of its members at a key's position also names, at another
    position, a member of a class that may split (its key may stop agreeing with others'):
    `splitting` closes over that. Every other class keeps what made it. Each new class lies
    within an old one, so the terms of the classes taken apart (``members``) can only merge
    with each other, and only through facts holding one of them at the key's position.
    """

    def __init__(self, component: Rewritten, keys: list[Key]) -> None:
        self.component = component
        self.keys = keys
        self.positions = _positions(keys)
        self.names = 0  # members of the classes taken apart

    def run(self, deleted: list[Fact]) -> None:
        """Maintain the store and classes after ``deleted`` (as given) left the explicit
        facts (the caller's deletion, which keeps an undo journal)."""
        component = self.component
        classes, explicit = component.classes, component.explicit
        members, naming = self.splitting(deleted)
        self.names = len(members)
        # Explicit facts naming no member that stood for what a deleted one stood for (a
        # fact naming no merged term stood for itself alone).
        merged = classes.rep.keys()
        for relation, args in deleted:
            if members.isdisjoint(args) and not merged.isdisjoint(args):
                normal = (relation, classes.normal(args))
                naming.update(represented(explicit, normal, classes.find, classes.class_of))
        before = self.stored(naming) | self.stored(deleted)
        old_find = {term: classes.find(term) for term in members}
        for rep in set(old_find.values()):
            classes.take_apart(rep)
        equalities: list[tuple[int, ...]] = []
        rows: dict[Key, list[tuple[int, ...]]] = {key: [] for key in self.keys}
        for relation, args in naming:
            if relation == SAME_AS:
                equalities.append(args)
            for position in self.positions.get(relation, ()):
                if args[position] in members:
                    rows[relation, position].append(args)
        _close(classes, equalities, [(*key, found) for key, found in rows.items()])
        after = self.stored(naming)
        for fact in before - after:  # a c = c that other facts still give stays
            if fact[0] == SAME_AS and self.supported(fact[1][0]):
                after.add(fact)
        store = component.store
        for fact in before - after:
            if store.discard(fact):
                component.note_removed(fact)
        for fact in after:
            if store.add(fact):
                component.note_added(fact)
        find = classes.find
        component.changed_terms |= {t for t, rep in old_find.items() if find(t) != rep}

    def splitting(self, deleted: list[Fact]) -> tuple[set[int], set[Fact]]:
        """The members of the classes that may split (see the class docstring), and the
        explicit facts naming them."""
        classes = self.component.classes
        explicit = self.component.explicit
        reps: set[int] = set()
        queue: list[int] = []

        def may_split(term: int) -> None:
            rep = classes.find(term)
            if rep not in reps and classes.size(rep) > 1:
                reps.add(rep)
                queue.append(rep)

        for relation, args in deleted:
            for position in (
                range(len(args)) if relation == SAME_AS else self.positions.get(relation, ())
            ):
                may_split(args[position])
        members: set[int] = set()
        naming: set[Fact] = set()
        while queue:
            rep = queue.pop()
            for term in classes.class_of(rep):
                members.add(term)
                for fact in explicit.with_term(term):
                    naming.add(fact)
                    relation, args = fact
                    for position in self.positions.get(relation, ()):
                        if any(t == term for i, t in enumerate(args) if i != position):
                            may_split(args[position])
        return members, naming

    def stored(self, facts: Iterable[Fact]) -> set[Fact]:
        """What the key rules give the store for ``facts`` under the classes now (`_derived`)."""
        by_relation: dict[RelationKey, list[tuple[int, ...]]] = {}
        for relation, args in facts:
            by_relation.setdefault(relation, []).append(args)
        derived = _derived(self.component.classes, self.positions, by_relation)
        return {(relation, args) for relation, rows in derived.items() for args in rows}

    def supported(self, rep: int) -> bool:
        """Whether a remaining explicit fact gives ``rep = rep``: one holding a member of its
        class at a key's position, or an owl:sameAs naming one."""
        columns = self.component.explicit.columns
        same = columns.get(SAME_AS)
        for term in self.component.classes.class_of(rep):
            if same is not None and (term in same[0] or term in same[1]):
                return True
            for relation, positions in self.positions.items():
                found = columns.get(relation)
                if found is not None and any(term in found[p] for p in positions):
                    return True
        return False
