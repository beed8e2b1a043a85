"""The symmetric-transitive-closure module (modular-materialisation paper, section 6, Alg. 7-9).

A hyper-node handled here holds, for one binary relation R, the transitivity rule (plain, or
with ``COMP(x, !=, z)``) and ``R(x, y) :- R(y, x)``.

**What the IDB holds.** X is the set of external R facts (visible through the node's lower
stores); the IDB holds the head of every rule instance over the least fixpoint L of X, as the
seminaive module stores it. Take the connected components of the undirected graph of X (its
vertices are the ends of X facts). L is symmetric, so the symmetric rule alone makes IDB = L:

* plain: IDB = C x C for every component C ((u, u) included: u - v - u);
* irreflexive: IDB = {(u, v) in C x C : u != v} for every component C, plus (u, u) only when
  X holds (u, u) (the symmetric rule maps it to itself; transitivity never yields it).

**State.** The X facts as directed adjacency (``out`` / ``inn``: (u, v) and (v, u) are two
facts, and the undirected edge survives while either remains), ``loops`` (vertices with an X
self-loop) and ``component``: vertex -> the member set of its component (shared by its members;
the paper's C_R).

**Materialise / insertions (Add, CLOSEEDGES).** Components by graph search; the IDB is stored
by subject, each member of C holding C as a bitmap (less itself, irreflexive, unless it has a
loop): no pair becomes a tuple unless a reader asks for tuples. An inserted fact (u, v)
creates missing singleton components ((u, u) derived, plain; irreflexive only for a loop) and,
when u and v lie in different components U and V, merges the smaller into the larger and
derives U x V and V x U. Cost: the new pairs, plus relabelling the smaller side.

**Deletions (Del + Red).** Only the components holding a deleted fact change (both its ends
lie in one). Each such component C splits into subcomponents S1..Sk over the remaining
external facts, and vertices left with no fact drop out (set D). The IDB loses exactly
S x (C - S) for each S and D x C (and, irreflexive, (u, u) for every deleted loop). This is
the paper's Del (overdelete every pair of C) followed by Red (CLOSEEDGES over the remaining
edges, the paper's Y_R) without materialising the overdeleted pairs: because our IDB is a
function of X alone, the remaining external facts of C are exactly what Red closes. The parts
are found from the *seeds*, the ends of deleted facts that keep a fact: every part holds one
(C was connected). One seed means no split at all; several are searched from in turns until
one search alone is left running, whose part is the rest of C (`_split`). Cost: about twice the
parts split off plus the removed pairs, not C's size (a turbine leaving the end of a chain
costs no search); nothing outside the affected components is read.

A batch with both is applied as deletions, then insertions; the returned StoreChanges is the net
difference of the IDB. Fallbacks (removed rules, missing or stale state) recompute.
"""

from __future__ import annotations

from itertools import chain

from pyroaring import BitMap

from agent.engine.modules.base import by_subject_of
from agent.engine.modules.support.subject_changes import NO_IDS, SubjectChanges
from agent.engine.modules.transitive import EMPTY, ClosureModule
from agent.engine.storage.changes import StoreChanges
from agent.engine.storage.store import Relation, RelationKey


class SymmetricTransitiveModule(ClosureModule):
    """R(x, z) :- R(x, y), R(y, z) [, x != z] and R(x, y) :- R(y, x) (module docstring)."""

    name = "symmetric-transitive"

    def __init__(self, relation: RelationKey, irreflexive: bool = False) -> None:
        super().__init__(relation, irreflexive)
        self.loops: set[int] = set()
        self.component: dict[int, set[int]] = {}

    def reset(self) -> None:
        super().reset()
        self.loops, self.component = set(), {}

    # ------------------------------------------------------------------ helpers
    def _link(self, u: int, v: int) -> None:
        super()._link(u, v)
        if u == v:
            self.loops.add(u)

    def _unlink(self, u: int, v: int) -> None:
        super()._unlink(u, v)
        if u == v:
            self.loops.discard(u)

    def _search(self, start: int) -> set[int]:
        """The vertices connected to ``start`` by external facts (in either direction)."""
        out, inn = self.succ, self.pred
        members = {start}
        frontier = [start]
        while frontier:
            u = frontier.pop()
            for w in chain(out.get(u, EMPTY), inn.get(u, EMPTY)):
                if w not in members:
                    members.add(w)
                    frontier.append(w)
        return members

    # ------------------------------------------------------------------ materialise
    def build(self, external: list[Relation]) -> dict[int, BitMap]:
        """The IDB by subject: each member of a component C gets C as a bitmap (without
        itself, irreflexive, unless it has a loop), stored as the relation's buckets
        (`Relation.adopt_subjects`): a component of n vertices costs n small bitmaps instead
        of n^2 tuples, and a reader by subject (an aggregate over the neighbours) reads them
        as they are."""
        self.reset()
        link = self._link
        for relation in external:
            for u, v in relation:
                link(u, v)
        component, loops, irreflexive = self.component, self.loops, self.irreflexive
        subjects: dict[int, BitMap] = {}
        held = 0
        for start in self.succ.keys() | self.pred.keys():
            if start in component:
                continue
            members = self._search(start)
            for u in members:
                component[u] = members
            held += len(members) ** 2
            if len(members) > 100:
                self.guard.check(held)
            closed = BitMap(members)
            for u in members:
                mine = closed.copy()
                if irreflexive and u not in loops:
                    mine.discard(u)
                if mine:
                    subjects[u] = mine
        return subjects

    # ------------------------------------------------------------------ Del + Red
    def delete(self, own: Relation, facts: set, result: StoreChanges) -> None:
        component = self.component
        touched: dict[int, tuple[set[int], set[int]]] = {}  # id -> (old members, ends)
        for u, v in facts:
            self._unlink(u, v)
            members = component[u]
            found = touched.get(id(members))
            if found is None:
                touched[id(members)] = (members, {u, v})
            else:
                found[1].update((u, v))
        out, inn = self.succ, self.pred
        held = by_subject_of(own)
        changes = SubjectChanges(held)
        if self.irreflexive:
            for u in {u for u, v in facts if u == v}:
                changes.lose(u, BitMap((u,)))
        lost = changes.lost
        for old, ends in touched.values():
            dropped = [u for u in ends if u not in out and u not in inn]
            seeds = [u for u in ends if u in out or u in inn]
            parts = self._split(seeds)
            if not parts and not dropped:
                continue  # still connected: every pair is still derived
            for d in dropped:
                del component[d]
                changes.lose(d, BitMap(held.get(d, ())))
            # The old set stays the component of what is left of it once the split-off parts
            # and dropped vertices are taken out: its members need not be relabelled.
            gone = BitMap(dropped)
            for members in parts:
                gone |= BitMap(members)
                rest = BitMap(old - members)  # shared by the part's members: only read
                for u in members:
                    component[u] = members
                    known = lost.get(u)
                    lost[u] = rest if known is None else known | rest
            old.difference_update(gone)
            for u in old:
                known = lost.get(u)
                lost[u] = gone if known is None else known | gone
        changes.apply(own, self.relation, result)

    def _split(self, seeds: list[int]) -> list[set[int]]:
        """The parts a component split into, but the one left over: searches from the
        ``seeds`` (the ends of its deleted facts that still have facts) run in turns, a vertex
        each, and a search that meets another joins it. A search that runs out has found a
        whole part; once one search alone is still running, the rest of the component is its
        part, unsearched. Every part left holds a seed (the old component was connected), so
        a component that stayed connected costs the searches until they all met, and one
        that lost a small piece costs about twice that piece, not the component's size (one
        seed: nothing is searched)."""
        if len(seeds) < 2:
            return []
        out, inn = self.succ, self.pred
        owner: dict[int, int] = {}  # vertex -> the search that reached it first
        joined = list(range(len(seeds)))  # search -> the search it joined (union-find)
        found: list[set[int]] = []
        frontier: list[list[int]] = []
        for index, seed in enumerate(seeds):
            owner[seed] = index
            found.append({seed})
            frontier.append([seed])

        def root(index: int) -> int:
            while joined[index] != index:
                joined[index] = joined[joined[index]]
                index = joined[index]
            return index

        running = set(range(len(seeds)))
        parts: list[set[int]] = []
        while len(running) > 1:
            for index in list(running):
                if index not in running:
                    continue  # joined another search earlier in this turn
                queue = frontier[index]
                if not queue:
                    running.discard(index)
                    parts.append(found[index])
                    if len(running) == 1:
                        break
                    continue
                u = queue.pop()
                for w in chain(out.get(u, EMPTY), inn.get(u, EMPTY)):
                    other = owner.get(w)
                    if other is None:
                        owner[w] = index
                        found[index].add(w)
                        queue.append(w)
                        continue
                    other = root(other)
                    if other == index:
                        continue
                    # Two searches met: the smaller joins the larger (its vertices, its queue).
                    big, small = (
                        (index, other) if len(found[index]) >= len(found[other]) else (other, index)
                    )
                    found[big] |= found[small]
                    frontier[big].extend(frontier[small])
                    found[small], frontier[small] = set(), []
                    joined[small] = big
                    running.discard(small)
                    index, queue = big, frontier[big]
                if len(running) == 1:
                    break
        return parts

    # ------------------------------------------------------------------ Add
    def insert(self, own: Relation, facts: set, result: StoreChanges) -> None:
        """Merge the components the new facts connect, then give each member what its
        component gained: every member of an old component O now in C gains C - O (the same
        bitmap, shared, whatever the variant: a member's own pair and loop do not change),
        a new vertex gains C (plain) or C without itself unless it has a loop (irreflexive)."""
        component = self.component
        plain = not self.irreflexive
        held = by_subject_of(own)
        # The components the facts touch, as they were (merging changes the sets in place; the
        # sets are kept beside their snapshot so that their ids stay theirs).
        before: dict[int, tuple[set[int], BitMap]] = {}
        for fact in facts:
            for vertex in fact:
                members = component.get(vertex)
                if members is not None and id(members) not in before:
                    before[id(members)] = (members, BitMap(members))
        new_vertices: set[int] = set()
        new_loops: list[int] = []
        for u, v in facts:
            self._link(u, v)
            if u == v:
                new_loops.append(u)
            left = component.get(u)
            if left is None:
                left = component[u] = {u}
                new_vertices.add(u)
            right = component.get(v)
            if right is None:
                right = component[v] = {v}
                new_vertices.add(v)
            if left is right:
                continue
            if len(left) < len(right):
                left, right = right, left
            left |= right
            for w in right:
                component[w] = left
        changes = SubjectChanges(held)
        gained = changes.gained
        closed: dict[int, BitMap] = {}  # id(final component) -> the component as a bitmap

        def closure_of(members: set[int]) -> BitMap:
            found = closed.get(id(members))
            if found is None:
                found = closed[id(members)] = BitMap(members)
            return found

        for _, old_ids in before.values():
            first = next(iter(old_ids))  # old members all share their final component
            delta = closure_of(component[first]) - old_ids
            if delta:
                for w in old_ids:
                    gained[w] = delta
        for w in new_vertices:
            mine = closure_of(component[w])
            if not plain:
                mine = mine.copy()
                mine.discard(w)
            if mine:
                gained[w] = mine
        if not plain:
            for u in new_loops:
                if u not in held.get(u, EMPTY):
                    gained[u] = gained.get(u, NO_IDS) | BitMap((u,))
        changes.apply(own, self.relation, result)
