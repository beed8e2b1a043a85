"""Classes of equal terms and their representatives (the paper's mapping pi).

A term that no equality mentions is its own class and costs nothing here: only classes of two
or more terms are stored. The representative of a class is its smallest term in a fixed order
of *values* (numbers by value, then booleans, literals, IRIs by text), never of term ids, so it
does not depend on the order terms were first seen: the same facts give the same
representatives on every device, after a restart and in the reference evaluator. Numbers come
first so that a comparison, a bind or an aggregate reading a class that holds a number reads
that number.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from agent.engine.language import Literal, Value, is_number


def value_order(value: Value) -> tuple:
    """The order representatives are chosen by: the smallest value of a class represents it."""
    if is_number(value):
        return (0, value)
    if isinstance(value, bool):
        return (1, value)
    if isinstance(value, Literal):
        return (2, value.lexical, value.datatype or "", value.language or "")
    return (3, value)


def is_literal(value: Value) -> bool:
    """A literal (number, boolean or other literal): two distinct ones made equal clash."""
    return not isinstance(value, str)


class Classes:
    """Term id -> representative id, and representative -> members, for classes of two or
    more terms (the paper's pi). ``order`` gives the sort key of a term id (``value_order``
    of its value)."""

    def __init__(self, order: Callable[[int], tuple]) -> None:
        self.order = order
        self.rep: dict[int, int] = {}
        self.members: dict[int, set[int]] = {}

    def find(self, term: int) -> int:
        return self.rep.get(term, term)

    def class_of(self, term: int) -> set[int] | tuple[int]:
        """Every member of ``term``'s class (``term`` alone when it is in no class)."""
        found = self.members.get(self.rep.get(term, term))
        return found if found is not None else (term,)

    def size(self, term: int) -> int:
        found = self.members.get(self.rep.get(term, term))
        return len(found) if found is not None else 1

    def normal(self, args: tuple[int, ...]) -> tuple[int, ...]:
        rep = self.rep
        if not rep:
            return args
        return tuple(map(rep.get, args, args))

    def normal_rows(self, rows: list[tuple[int, ...]]) -> list[tuple[int, ...]]:
        """`normal` of each row, in order (``rows`` itself when there are no classes). A row
        naming no merged term is its own normal form, the same tuple: a caller keeping both
        (given facts and their counts) keeps one."""
        rep = self.rep
        if not rep:
            return rows
        get, unmerged = rep.get, rep.keys().isdisjoint
        return [args if unmerged(args) else tuple(map(get, args, args)) for args in rows]

    def merge(self, a: int, b: int) -> tuple[int, int]:
        """Merge the classes of representatives ``a`` and ``b`` (``a != b``): the smaller
        becomes the representative of both. Returns ``(kept, gone)``."""
        kept, gone = (a, b) if self.order(a) <= self.order(b) else (b, a)
        self.merge_into(kept, gone)
        return kept, gone

    def merge_into(self, kept: int, gone: int) -> None:
        """Merge the class of representative ``gone`` into that of ``kept``, which represents
        both whatever the order: for a caller that chooses by its own costs and restores the
        order's representatives itself (B/F~'s gamma, see ``regroup``)."""
        moved = self.members.pop(gone, None) or {gone}
        target = self.members.setdefault(kept, {kept})
        self.rep[kept] = kept
        for member in moved:
            self.rep[member] = kept
        target |= moved

    def merge_group(self, representatives: Iterable[int]) -> bool:
        """Merge the classes of ``representatives`` into the one whose representative comes
        first in the order (so it represents them all); whether any two merged."""
        distinct = set(representatives)
        if len(distinct) < 2:
            return False
        kept = min(distinct, key=self.order)
        distinct.discard(kept)
        for gone in distinct:
            self.merge_into(kept, gone)
        return True

    def take_apart(self, rep: int) -> set[int]:
        """Make every member of ``rep``'s class a class of its own; returns the members."""
        members = self.members.pop(rep, set())
        for member in members:
            self.rep.pop(member, None)
        return members

    def regroup(self, rep: int, new_rep: Callable[[int], int]) -> set[int]:
        """Replace the class of ``rep`` by the classes ``new_rep`` groups its members into
        (the paper's ``pi(d) := gamma(d)``), each represented by its smallest member in this
        order (whichever member ``new_rep`` names). Returns the members whose representative
        changed."""
        members = self.members.pop(rep, None)
        if members is None:
            return set()
        groups: dict[int, set[int]] = {}
        for member in members:
            groups.setdefault(new_rep(member), set()).add(member)
        changed = set()
        for group in groups.values():
            if rep in group:  # (the class's smallest member: still its part's)
                target = rep
            else:
                target = min(group, key=self.order) if len(group) > 1 else next(iter(group))
            if len(group) > 1:
                self.members[target] = group
            for member in group:
                if len(group) > 1:
                    self.rep[member] = target
                else:
                    del self.rep[member]
                if target != rep:
                    changed.add(member)
        return changed

    def classes(self) -> Iterable[set[int]]:
        return self.members.values()

    def copy(self) -> Classes:
        other = Classes(self.order)
        other.rep = dict(self.rep)
        other.members = {rep: set(members) for rep, members in self.members.items()}
        return other
