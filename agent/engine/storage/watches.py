"""Watches: the facts matching a pattern, kept up to date so that each update can say which of
them appeared and which disappeared, without the embedding program diffing ``facts()``.

A watch is an atom pattern like a query's (``<SensorAnomalyWindTurbine>(X)``, ``<p>(<a>, Y)``,
``<p>(X, X)``). It holds the term-id rows of its relation that match the pattern, as of the last
update. After an update it is brought up to date one of two ways:

* from the update's journal (a fact update, no owl:sameAs): a fact can only appear or disappear
  for a reader if some store gained or lost it, so the candidates are the journal's net changes
  of the watched relation, each tested against the new view (a fact derived in two hyper-nodes
  and lost by one is still held). The cost is that of the changes, not of the relation.
* afresh, by a scan of the relation, when the journal cannot be read that way: rules were added
  or deleted (hyper-nodes created and dropped with their facts), a hyper-node was recomputed
  into a new store, or owl:sameAs rewrites what a reader sees.

Either way the result is exact: the watch's rows afterwards are the matching rows of the new
materialisation, and the change is the difference from the rows before.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from agent.engine.language import ANONYMOUS, Atom, Constant, Variable
from agent.engine.storage.changes import Journal
from agent.engine.storage.store import RelationKey
from agent.engine.storage.view import MaterialisedView


@dataclass(frozen=True)
class WatchChange:
    """What one update changed of one watch: facts as ``Reasoner.facts`` gives them
    (``(predicate, *values)``, a class fact ``(rdf:type, x, C)``), sorted."""

    appeared: list[tuple] = field(default_factory=list)
    disappeared: list[tuple] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.appeared or self.disappeared)


class Watch:
    """One pattern and the rows of its relation that match it (term ids)."""

    def __init__(self, name: str, atom: Atom) -> None:
        self.name = name
        self.atom = atom
        self.rows: set[tuple[int, ...]] = set()

    @property
    def key(self) -> RelationKey:
        return self.atom.relation

    def matcher(self, view: MaterialisedView):
        """A test of one row against the pattern, or None when a constant of the pattern is no
        term yet (then nothing matches)."""
        wanted = view.wanted(self.atom)
        if wanted is None:
            return None
        fixed = [(i, want) for i, want in enumerate(wanted) if want is not None]
        first: dict[Variable, int] = {}
        same: list[tuple[int, int]] = []  # positions that must hold the same term
        for i, term in enumerate(self.atom.terms):
            if isinstance(term, Constant) or term.name == ANONYMOUS:
                continue
            if term in first:
                same.append((first[term], i))
            else:
                first[term] = i
        if not fixed and not same:
            return lambda row: True
        return lambda row: (
            all(row[i] == w for i, w in fixed) and all(row[i] == row[j] for i, j in same)
        )

    def matching(self, view: MaterialisedView, rows: Iterable[tuple[int, ...]]) -> set:
        match = self.matcher(view)
        if match is None:
            return set()
        return {row for row in rows if match(row)}

    def start(self, view: MaterialisedView) -> WatchChange:
        """Fill the watch from the current materialisation: every match has 'appeared'."""
        self.rows = self.matching(view, view.scan(self.key))
        return WatchChange(appeared=decoded(view, self.key, self.rows))

    def stop(self, view: MaterialisedView) -> WatchChange:
        """The watch removed: every match it held has 'disappeared' for its reader."""
        gone, self.rows = self.rows, set()
        return WatchChange(disappeared=decoded(view, self.key, gone))

    def refresh(self, view: MaterialisedView, journal: Journal | None) -> WatchChange:
        """Bring the rows up to date after an update (``journal`` None: afresh, see the module
        docstring) and return what changed."""
        key = self.key
        if journal is None:
            now = self.matching(view, view.scan(key))
            appeared, disappeared = now - self.rows, self.rows - now
            self.rows = now
        else:
            candidates: set[tuple[int, ...]] = set()
            for changes in [journal.edb, *(entry.changes for entry in journal.nodes.values())]:
                for side in (changes.added, changes.removed):
                    rows = side.get(key)
                    if rows:
                        candidates.update(rows)
            if not candidates:
                return WatchChange()
            candidates = self.matching(view, candidates)
            held = {row for row in candidates if view.holds(key, row)}
            appeared = held - self.rows
            disappeared = (candidates - held) & self.rows
            self.rows |= appeared
            self.rows -= disappeared
        if not appeared and not disappeared:
            return WatchChange()
        return WatchChange(decoded(view, key, appeared), decoded(view, key, disappeared))


def journal_readable(journal: Journal, structural: bool, equality: bool) -> bool:
    """Whether watches may be refreshed from ``journal`` alone (see the module docstring)."""
    if structural or equality or journal.dropped:
        return False
    return not any(entry.created or entry.previous for entry in journal.nodes.values())


def decoded(view: MaterialisedView, key: RelationKey, rows: Iterable[tuple[int, ...]]) -> list:
    return sorted((view.external(key, row) for row in rows), key=repr)
