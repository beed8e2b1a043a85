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
(the instance that pairs the fact with itself); `tests/test_equality.py` checks the two ways
give the same store.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from operator import itemgetter

from ..language import RelationKey
from .classes import Classes
from .component import SAME_AS
from .facts import FactIndex, PatternRule

Key = tuple[RelationKey, int]  # a relation and the position its key rule makes equal


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
    find = classes.find
    for a, b in explicit.by_relation.get(SAME_AS, ()):
        _merge_group(classes, (find(a), find(b)))
    while True:
        merged = False
        for relation, position in keys:
            rows = explicit.by_relation.get(relation)
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
                if len(names) > 1 and _merge_group(classes, map(find, names)):
                    merged = True
        if not merged:
            return


def store_facts(classes: Classes, explicit: FactIndex, keys: list[Key], store: FactIndex) -> None:
    """Fill ``store`` with what the key rules derive over ``explicit`` under the closed
    ``classes``: the explicit facts in normal form and each key's ``c = c``."""
    normal: dict[RelationKey, list[tuple[int, ...]]] = {}
    for relation, rows in explicit.by_relation.items():
        if rows:
            normal[relation] = classes.normal_rows(list(rows))
            store.add_rows(relation, normal[relation])
    same: dict[tuple[int, ...], None] = {}
    for relation, position in keys:
        for args in normal.get(relation, ()):
            term = args[position]
            same[(term, term)] = None
    store.add_rows(SAME_AS, same)


def _merge_group(classes: Classes, representatives: Iterable[int]) -> bool:
    """Merge the classes of ``representatives`` into the one whose representative comes
    first in the classes' order (so it represents them all); whether any two merged."""
    distinct = set(representatives)
    if len(distinct) < 2:
        return False
    kept = min(distinct, key=classes.order)
    distinct.discard(kept)
    for gone in distinct:
        classes.merge_into(kept, gone)
    return True


def _others(arity: int, position: int) -> Callable[[tuple[int, ...]], object]:
    """The args of a fact but the one at ``position`` (what facts must agree on)."""
    columns = [i for i in range(arity) if i != position]
    if not columns:
        return lambda args: ()
    return itemgetter(*columns)
