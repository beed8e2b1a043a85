"""The explicit facts outside the equality component, as given, and the normal forms the engine
holds for them.

The engine holds normal forms (every term its class's representative). Several given facts
may share one normal form (a fact given under two names of one individual), so each normal
form keeps how many given facts stand for it, and leaves the engine when that count reaches
zero. A given fact that is its own normal form (no term of it merged: almost every fact)
costs its count and no mapping.

Work is done a relation at a time, and the undo journal (``equality.py``) takes one step per
batch rather than one per fact: an update may bring a whole data set, and per-fact
bookkeeping here was a large share of materialising with equality.

When a class merges or splits, the given facts naming a term whose representative changed
are counted again. They are found through an index of the facts naming each term that was
ever merged (``naming``), not through an index of every fact by every term (which weighed
more than the facts): a term merged for the first time costs one pass over the given facts,
after which the facts naming it are indexed as they come. Terms are never taken out of
``ever_merged`` (an update undone may have merged one: its facts stay indexed, which is
merely more than needed), and entries for facts no longer given are skipped when read and
dropped once the update commits; so the index needs no undo steps of its own.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from functools import partial
from typing import Protocol

from agent.engine.equality.classes import Classes
from agent.engine.equality.facts import Fact
from agent.engine.language import RelationKey

Args = tuple[int, ...]


class EngineChanges(Protocol):
    """Where normal forms entering and leaving the engine are reported (``equality.py``)."""

    def add(self, key: RelationKey, rows: Iterable[Args]) -> None: ...

    def remove(self, key: RelationKey, rows: Iterable[Args]) -> None: ...


class GivenFacts:
    """Given facts by relation, the normal form of each given fact that is not its own, and
    per normal form how many given facts stand for it."""

    def __init__(self) -> None:
        self.rows: dict[RelationKey, set[Args]] = {}
        self.normal_of: dict[RelationKey, dict[Args, Args]] = {}
        self.counts: dict[RelationKey, dict[Args, int]] = {}
        self.ever_merged: set[int] = set()
        self.naming: dict[int, set[Fact]] = {}  # term of ever_merged -> given facts naming it
        self.stale: list[tuple[int, Fact]] = []  # entries of naming found stale, see `commit`
        self.undo: list | None = None  # the layer's journal while an update is under way

    def __contains__(self, fact: Fact) -> bool:
        rows = self.rows.get(fact[0])
        return rows is not None and fact[1] in rows

    def __len__(self) -> int:
        return sum(map(len, self.rows.values()))

    def __iter__(self) -> Iterator[Fact]:
        for key, rows in self.rows.items():
            for args in rows:
                yield (key, args)

    def of(self, key: RelationKey) -> set[Args]:
        return self.rows.get(key, set())

    def engine_rows(self, key: RelationKey) -> set[Args]:
        """The normal forms of ``key`` the engine holds for the given facts."""
        return set(self.counts.get(key, ()))

    def engine_facts(self) -> dict[RelationKey, set[Args]]:
        return {key: set(counts) for key, counts in self.counts.items() if counts}

    def represented(self, fact: Fact) -> list[Fact]:
        """The given facts whose normal form is ``fact``."""
        key, args = fact
        mine = self.normal_of.get(key, {})
        found = [(key, given) for given, normal in mine.items() if normal == args]
        if args in self.rows.get(key, ()) and args not in mine:
            found.append(fact)
        return found

    # ------------------------------------------------------------------ changing
    def add(self, key: RelationKey, rows: Iterable[Args]) -> list[Args]:
        """Take rows of ``key`` as given; returns those that were not given yet, which the
        caller then counts (`count`) once the classes they are counted under are known."""
        held = self.rows.get(key)
        if held is None:
            held = self.rows[key] = set()
        new = [args for args in dict.fromkeys(rows) if args not in held]
        if new:
            held.update(new)
            self._journal(partial(held.difference_update, new))
        return new

    def remove(self, key: RelationKey, rows: Iterable[Args], changes: EngineChanges | None) -> int:
        """Forget given rows of ``key`` (rows not given are ignored); a normal form no given
        fact stands for any more leaves the engine. Returns how many were given."""
        held = self.rows.get(key)
        if not held:
            return 0
        gone = [args for args in dict.fromkeys(rows) if args in held]
        if gone:
            held.difference_update(gone)
            self._journal(partial(held.update, gone))
            self._uncount(key, gone, changes)
        return len(gone)

    def count(
        self, key: RelationKey, rows: list[Args], classes: Classes, changes: EngineChanges | None
    ) -> None:
        """Count given rows under their normal forms; a normal form counted for the first
        time enters the engine."""
        self._index(key, rows)
        normals = classes.normal_rows(rows)
        if normals is not rows:
            pairs = zip(rows, normals, strict=True)
            mapped = {args: normal for args, normal in pairs if args != normal}
            if mapped:
                mine = self.normal_of.get(key)
                if mine is None:
                    mine = self.normal_of[key] = {}
                self._journal(partial(_put_back, mine, dict.fromkeys(mapped, _MISSING)))
                mine.update(mapped)
        counts = self.counts.get(key)
        if counts is None:
            counts = self.counts[key] = {}
        fresh = self._bump(counts, normals, 1)
        if changes is not None and fresh:
            changes.add(key, fresh)

    def renormalise(
        self,
        changed: set[int],
        classes: Classes,
        changes: EngineChanges,
        skip: dict[RelationKey, list[Args]],
    ) -> None:
        """Count again under their new normal forms the given facts naming a term of
        ``changed`` (whose representative changed), but those of ``skip`` (given in this
        update and counted after)."""
        first = changed - self.ever_merged
        if first:  # merged for the first time: the facts naming them, indexed from now on
            self.ever_merged |= first
            for key, rows in self.rows.items():
                skipped = skip.get(key)
                if skipped is not None and len(skipped) == len(rows):
                    continue  # (all given in this update: indexed when counted)
                self._index(key, [args for args in rows if not first.isdisjoint(args)])
        naming: dict[RelationKey, list[Args]] = {}
        for term in changed:
            facts = self.naming.get(term)
            if not facts:
                continue
            for fact in facts:
                if fact in self:
                    naming.setdefault(fact[0], []).append(fact[1])
                else:
                    self.stale.append((term, fact))
        for key, found in naming.items():
            found = list(dict.fromkeys(found))
            skipped = skip.get(key)
            if skipped:
                skipped_set = set(skipped)
                found = [args for args in found if args not in skipped_set]
            mine = self.normal_of.get(key, {})
            now = classes.normal_rows(found)
            pairs = zip(found, now, strict=True)
            moved = [args for args, new in pairs if new != mine.get(args, args)]
            if moved:
                self._uncount(key, moved, changes)
                self.count(key, moved, classes, changes)

    def commit(self) -> None:
        """The update went through: drop the index entries it found stale (not before: an
        update undone gives its deleted facts back, and their entries with them)."""
        for term, fact in self.stale:
            found = self.naming.get(term)
            if found is not None and fact not in self:
                found.discard(fact)
                if not found:
                    del self.naming[term]
        self.stale = []

    def _index(self, key: RelationKey, rows: list[Args]) -> None:
        """Index the rows naming a term of ``ever_merged`` under those terms."""
        ever = self.ever_merged
        if not ever:
            return
        unmerged, naming = ever.isdisjoint, self.naming
        for args in rows:
            if not unmerged(args):
                for term in args:
                    if term in ever:
                        found = naming.get(term)
                        if found is None:
                            naming[term] = {(key, args)}
                        else:
                            found.add((key, args))

    def _uncount(self, key: RelationKey, rows: list[Args], changes: EngineChanges | None) -> None:
        mine = self.normal_of.get(key)
        if mine:
            normals = [mine.get(args, args) for args in rows]
            mapped = {args: mine[args] for args in rows if args in mine}
            if mapped:
                self._journal(partial(_put_back, mine, mapped))
                for args in mapped:
                    del mine[args]
        else:
            normals = rows
        lost = self._bump(self.counts[key], normals, -1)
        if changes is not None and lost:
            changes.remove(key, lost)

    def _bump(self, counts: dict[Args, int], normals: list[Args], step: int) -> list[Args]:
        """Add ``step`` (1 or -1) to the count of each normal form; returns those whose count
        left zero (step 1) or reached it (step -1)."""
        self._journal(partial(_put_back, counts, {n: counts.get(n, _MISSING) for n in normals}))
        crossed = []
        get = counts.get
        if step > 0:
            for normal in normals:
                count = get(normal, 0)
                counts[normal] = count + 1
                if not count:
                    crossed.append(normal)
        else:
            for normal in normals:
                count = counts[normal] - 1
                if count:
                    counts[normal] = count
                else:
                    del counts[normal]
                    crossed.append(normal)
        return crossed

    def _journal(self, step: partial) -> None:
        if self.undo is not None:
            self.undo.append(step)


_MISSING = object()


def _put_back(mapping: dict, old: dict) -> None:
    """Undo: every key of ``old`` back to its value there (``_MISSING``: absent)."""
    for key, value in old.items():
        if value is _MISSING:
            mapping.pop(key, None)
        else:
            mapping[key] = value
