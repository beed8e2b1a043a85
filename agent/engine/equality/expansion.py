"""The expanded model: what readers see when the materialisation is kept in normal form.

The stores hold each fact once, with every term its class's representative. A reader gets
every fact for every combination of the names of its terms' classes, and ``owl:sameAs``
between every two names of a class (the class fact ``c = c`` of a representative stands for
all of them), exactly what equality axiomatised as rules would have derived.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from itertools import filterfalse, product, repeat
from math import prod

from agent.engine.equality.classes import Classes
from agent.engine.equality.facts import Fact
from agent.engine.language import Atom, Value
from agent.engine.storage.store import SUBJECT, RelationKey
from agent.engine.storage.subject_facts import union_by_subject
from agent.engine.storage.view import MaterialisedView


class ExpandedView(MaterialisedView):
    """A ``MaterialisedView`` whose readers see the expanded model (see the module docstring).
    ``nodes`` and ``edb`` stay the stores as they are (normal form), for persistence and the
    update machinery; ``explicit_given`` is the explicit facts as given."""

    def __init__(
        self,
        base: MaterialisedView,
        classes: Classes,
        explicit_given: Callable[[], Iterable[Fact]],
        is_explicit: Callable[[Fact], bool],
    ) -> None:
        super().__init__(base.terms, base.edb, base.nodes)
        self.base = base  # reads the stores as they are: the methods below expand its facts
        self.classes = classes
        self.explicit_given = explicit_given  # the explicit facts as given
        self.is_explicit = is_explicit

    def expand(self, args: tuple[int, ...]) -> Iterator[tuple[int, ...]]:
        class_of = self.classes.class_of
        if not self.classes.rep or all(len(class_of(a)) == 1 for a in args):
            yield args
            return
        yield from product(*(class_of(a) for a in args))

    def scan(self, key: RelationKey) -> Iterable[tuple[int, ...]]:
        base = self.base.scan(key)
        if not self.classes.rep:
            return base
        return (expanded for args in base for expanded in self.expand(args))

    def visible(self, key: RelationKey) -> set[tuple[int, ...]]:
        return set(self.scan(key))

    def of_subject(self, key: RelationKey, subject: int) -> set[tuple[int, int]]:
        rep = self.classes.find(subject)
        found: set[tuple[int, int]] = set()
        for _, obj in self.base.of_subject(key, rep):
            for name in self.classes.class_of(obj):
                found.add((subject, name))
        return found

    def size(self, key: RelationKey) -> int:
        return self._size(key, self._class_sizes())

    def sizes(self) -> dict[RelationKey, int]:
        sizes = self._class_sizes()  # (once for every relation)
        return {key: self._size(key, sizes) for key in self.relations()}

    def _size(self, key: RelationKey, sizes: dict[int, int]) -> int:
        """The stored facts, plus for each naming a merged term its other combinations of
        names (the product of its terms' class sizes, less one). The facts naming a merged
        term are picked out in C and the class sizes read from one dict: a reader polling
        ``count()`` on a large store walked every fact in Python."""
        if not sizes:
            return self.base.size(key)
        if key[1] == 2:  # by subject where every holder keeps its facts so
            indexes = [holder.existing_index(SUBJECT) for holder in self.base.holders(key)]
            if all(index is not None for index in indexes):
                return _pairs_size(indexes, sizes)  # type: ignore[arg-type]
        facts = self.base.scan(key)
        if not hasattr(facts, "__len__"):  # (several holders: their distinct facts, once)
            facts = list(facts)
        get, ones = sizes.get, repeat(1)
        named = list(filterfalse(sizes.keys().isdisjoint, facts))
        return len(facts) - len(named) + sum(prod(map(get, args, ones)) for args in named)

    def _class_sizes(self) -> dict[int, int]:
        """Each merged term's class size (none: no classes)."""
        members = self.classes.members
        return {term: len(members[rep]) for term, rep in self.classes.rep.items()}

    def holds(self, key: RelationKey, args: tuple[int, ...]) -> bool:
        return self.base.holds(key, self.classes.normal(args))

    def explicit(self, key: RelationKey, args: tuple[int, ...]) -> bool:
        return self.is_explicit((key, args))

    def edb_facts(self) -> Iterator[tuple]:
        for key, args in sorted(self.explicit_given()):
            yield self.external(key, args)

    def query(self, atom: Atom) -> list[dict[str, Value]]:
        """Answers of one atom pattern over the expanded model: a constant matches the facts
        of its class, and is answered with its own name."""
        wanted = self.wanted(atom)
        if wanted is None:
            return []
        return self.answers(atom, wanted, self._expanded_rows(atom.relation, wanted))

    def _expanded_rows(
        self, key: RelationKey, wanted: list[int | None]
    ) -> Iterator[tuple[int, ...]]:
        """The expanded facts of ``key`` whose constants are the ``wanted`` names."""
        find, class_of = self.classes.find, self.classes.class_of
        reps = [None if w is None else find(w) for w in wanted]
        for args in self.base.scan(key):
            if any(r is not None and r != a for r, a in zip(reps, args, strict=True)):
                continue
            yield from product(
                *((w,) if w is not None else class_of(a) for w, a in zip(wanted, args, strict=True))
            )


def _pairs_size(indexes: list[dict], sizes: dict[int, int]) -> int:
    """`ExpandedView._size` of a binary relation held by subject (``indexes``: each holder's
    subject -> objects): per subject, its class size times its objects' class sizes (a
    subject's objects in several holders counted once)."""
    subjects = indexes[0] if len(indexes) == 1 else union_by_subject(indexes)
    merged, get = set(sizes), sizes.get
    total = 0
    for subject, objects in subjects.items():
        count = len(objects)
        common = merged.intersection(objects)
        if common:
            count += sum(map(get, common)) - len(common)
        total += count * get(subject, 1)
    return total
