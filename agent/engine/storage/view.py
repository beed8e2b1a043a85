"""A read-only view of a materialisation: what ``facts``, ``query``, ``count``, ``stats``,
``explain`` and the agent's persistence read, and nothing that could change it.

The reasoner's state is the EDB store, the hyper-nodes' IDB stores and the term dictionary.
Readers should not need to know how hyper-nodes split the facts between stores (a fact derived
in two hyper-nodes is one fact), nor reach into the update machinery: this view answers with
facts as term-id tuples or decoded values, holders per relation, and a summary of the
hyper-nodes, and offers no method that writes.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from itertools import repeat

from agent.engine.language import (
    ANONYMOUS,
    RDF_TYPE,
    RESERVED_PREFIX,
    Atom,
    Constant,
    Rule,
    Value,
    Variable,
)
from agent.engine.storage.store import SUBJECT, DataStore, Relation, RelationKey
from agent.engine.storage.subject_facts import (
    SubjectFacts,
    mostly_by_subject,
    relation_by_subject,
    union_by_subject,
)
from agent.engine.terms import TermDictionary


@dataclass(frozen=True)
class NodeView:
    """What a reader may know of one hyper-node."""

    name: str
    rules: tuple[Rule, ...]
    module: str
    recursive: bool
    store: DataStore  # its IDB: read it, never change it

    def size(self) -> int:
        return self.store.size()


class MaterialisedView:
    """Read-only access to one materialisation (see the module docstring)."""

    def __init__(self, terms: TermDictionary, edb: DataStore, nodes: Sequence[NodeView]) -> None:
        self.terms = terms
        self.edb = edb
        self.nodes = tuple(nodes)

    # ------------------------------------------------------------------ by relation
    def relations(self) -> set[RelationKey]:
        """Every relation holding at least one fact, explicit or derived, but the engine's own
        (``RESERVED_PREFIX``: a multi-head rule's body)."""
        keys = {k for k, r in self.edb.relations.items() if len(r)}
        for node in self.nodes:
            keys.update(k for k, r in node.store.relations.items() if len(r))
        return {k for k in keys if not k[0].startswith(RESERVED_PREFIX)}

    def holders(self, key: RelationKey) -> list[Relation]:
        """The non-empty relations holding facts of ``key``: the EDB's, then the IDBs'."""
        found = []
        for store in (self.edb, *(node.store for node in self.nodes)):
            relation = store.get(key)
            if relation is not None and len(relation):
                found.append(relation)
        return found

    def visible(self, key: RelationKey) -> set[tuple[int, ...]]:
        """The facts of ``key`` as term-id tuples (may be a store's own set: do not change)."""
        holders = [relation.tuples for relation in self.holders(key)]
        if len(holders) == 1:
            return holders[0]
        union: set[tuple[int, ...]] = set()
        for tuples in holders:
            union |= tuples
        return union

    def detached(self, key: RelationKey) -> AbstractSet[tuple[int, ...]]:
        """The facts of ``key``, a copy no store shares: by subject (``SubjectFacts`` of new
        bitmaps, no tuple built for them) when most of them are held by subject, else a set
        of tuples. For a caller that keeps the facts after the stores are gone."""
        holders = self.holders(key)
        if holders and key[1] == 2 and mostly_by_subject(holders):
            return SubjectFacts(union_by_subject(map(relation_by_subject, holders)))
        return set(self.visible(key))

    def scan(self, key: RelationKey) -> Iterable[tuple[int, ...]]:
        """The facts of ``key``, each once, for reading through, without building the tuples
        of a relation kept by subject: one holder's own iteration; of several, their set union
        when they all hold tuples (in C), else each holder's facts not held by an earlier one.
        Do not change the reasoner while iterating."""
        holders = self.holders(key)
        if len(holders) == 1:
            return holders[0]
        if all(relation.rows_built for relation in holders):
            return self.visible(key)
        return _distinct(holders)

    def of_subject(self, key: RelationKey, subject: int) -> set[tuple[int, int]]:
        """The facts of binary ``key`` whose subject is ``subject``: through each relation's
        subject index where it has one (a relation kept by subject always does), else by a
        pass over its facts."""
        found: set[tuple[int, int]] = set()
        for relation in self.holders(key):
            index = relation.existing_index(SUBJECT)
            if index is not None:
                found.update(zip(repeat(subject), index.get(subject, ())))
            else:
                found.update(fact for fact in relation if fact[0] == subject)  # type: ignore[misc]
        return found

    def size(self, key: RelationKey) -> int:
        """Number of distinct facts of ``key`` (no tuples built when one relation holds them)."""
        holders = self.holders(key)
        if len(holders) == 1:
            return len(holders[0])
        if all(relation.rows_built for relation in holders):
            return len(self.visible(key))
        indexes = [relation.existing_index(SUBJECT) for relation in holders]
        if key[1] == 2 and all(index is not None for index in indexes):
            return _distinct_pairs(indexes)  # type: ignore[arg-type]
        return sum(1 for _ in _distinct(holders))

    def holds(self, key: RelationKey, args: tuple[int, ...]) -> bool:
        return any(args in relation for relation in self.holders(key))

    def explicit(self, key: RelationKey, args: tuple[int, ...]) -> bool:
        relation = self.edb.get(key)
        return relation is not None and args in relation

    def sizes(self) -> dict[RelationKey, int]:
        """`size` of every relation holding facts."""
        return {key: self.size(key) for key in self.relations()}

    def count(self) -> int:
        """Number of distinct facts, explicit and derived."""
        return sum(self.sizes().values())

    # ------------------------------------------------------------------ decoded
    def external(self, key: RelationKey, args: tuple[int, ...]) -> tuple:
        """A fact as ``(predicate, *values)``; a class fact ``C(x)`` as ``(rdf:type, x, C)``."""
        name, arity = key
        decode = self.terms.values
        if arity == 1:
            return (RDF_TYPE, decode[args[0]], name)
        return (name, *(decode[a] for a in args))

    def facts(self, predicate: str | None = None) -> Iterator[tuple]:
        for key in sorted(self.relations()):
            name, arity = key
            wanted = RDF_TYPE if arity == 1 else name
            if predicate is not None and predicate != wanted:
                continue
            for args in self.scan(key):
                yield self.external(key, args)

    def facts_named(self, name: str) -> Iterator[tuple]:
        for key in sorted(k for k in self.relations() if k[0] == name):
            for args in self.scan(key):
                yield self.external(key, args)

    def edb_facts(self) -> Iterator[tuple]:
        for key, relation in sorted(self.edb.relations.items()):
            for args in relation:
                yield self.external(key, args)

    def query(self, atom: Atom) -> list[dict[str, Value]]:
        """Answers of one atom pattern: one dict per distinct answer, variable name -> value.
        An anonymous ``_`` (ANONYMOUS, as `parse_atom` leaves it) matches anything, each
        occurrence on its own, and is no part of the answers: ``p(X, _)`` answers each ``X``
        with a ``p`` fact once."""
        wanted = self.wanted(atom)
        if wanted is None:
            return []
        if len(wanted) == 2 and wanted[0] is not None:  # a subject given: read its objects
            rows: Iterable[tuple[int, ...]] = self.of_subject(atom.relation, wanted[0])
        else:
            rows = self.scan(atom.relation)
        return self.answers(atom, wanted, rows)

    def wanted(self, atom: Atom) -> list[int | None] | None:
        """The term id of each constant of ``atom`` (None for a variable); None when a
        constant is no term at all (no fact can match)."""
        wanted: list[int | None] = []
        for term in atom.terms:
            if isinstance(term, Constant):
                found = self.terms.lookup(term.value)
                if found is None:
                    return None
                wanted.append(found)
            else:
                wanted.append(None)
        return wanted

    def answers(
        self, atom: Atom, wanted: list[int | None], rows: Iterable[tuple[int, ...]]
    ) -> list[dict[str, Value]]:
        """The distinct bindings of ``atom``'s named variables by the ``rows`` that match it
        (an anonymous ``_`` is bound to nothing: see `query`)."""
        answers: list[dict[str, Value]] = []
        seen: set[tuple] = set()
        decode = self.terms.values
        for args in rows:
            binding: dict[Variable, int] = {}
            ok = True
            for term, want, value in zip(atom.terms, wanted, args, strict=True):
                if want is not None:
                    ok = value == want
                elif term.name == ANONYMOUS:  # type: ignore[union-attr]
                    continue
                elif binding.setdefault(term, value) != value:  # type: ignore[arg-type]
                    ok = False
                if not ok:
                    break
            if not ok:
                continue
            key = tuple(sorted((v.name, i) for v, i in binding.items()))
            if key in seen:
                continue
            seen.add(key)
            answers.append({v.name: decode[i] for v, i in binding.items()})
        return answers

    # ------------------------------------------------------------------ rules
    def node_of(self, rule: Rule) -> NodeView | None:
        for node in self.nodes:
            if rule in node.rules:
                return node
        return None


def _distinct(holders: list[Relation]) -> Iterator[tuple[int, ...]]:
    """The facts of several relations, each once: all of the largest, then those of each
    smaller one that no larger one holds (membership tests only for the smaller ones' facts:
    a closure's output beside its few base facts costs a pass over the few)."""
    holders = sorted(holders, key=len, reverse=True)
    for position, relation in enumerate(holders):
        earlier = holders[:position]
        if not earlier:
            yield from relation
            continue
        for fact in relation:
            if not any(fact in other for other in earlier):
                yield fact


def _distinct_pairs(indexes: list[dict]) -> int:
    """Number of distinct pairs held by several subject indexes: per subject, its bucket's
    size, or the size of the union of its buckets where several indexes have the subject
    (one Python step per subject, not per fact)."""
    total = 0
    shared: dict[int, list] = {}
    for index in indexes:
        for subject, objects in index.items():
            found = shared.get(subject)
            if found is None:
                shared[subject] = [objects]
            else:
                found.append(objects)
    for buckets in shared.values():
        total += len(buckets[0]) if len(buckets) == 1 else len(set().union(*buckets))
    return total
