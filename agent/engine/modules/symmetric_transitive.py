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

**Materialise / insertions (Add, CLOSEEDGES).** Components by graph search; per component the
pairs come from ``itertools.product`` (plain) or ``itertools.permutations(C, 2)`` plus the
loops (irreflexive). An inserted fact (u, v) creates missing singleton components ((u, u)
derived, plain; irreflexive only for a loop) and, when u and v lie in different components U
and V, merges the smaller into the larger and derives U x V and V x U. Cost: the new pairs,
plus relabelling the smaller side.

**Deletions (Del + Red).** Only the components holding a deleted fact change (both its ends
lie in one). Each such component C is searched again over the remaining external facts: it
splits into subcomponents S1..Sk, and vertices left with no fact drop out (set D). The IDB
loses exactly S x (C - S) for each S and D x C (and, irreflexive, (u, u) for every deleted
loop). This is the paper's Del (overdelete every pair of C) followed by Red (CLOSEEDGES over
the remaining edges, the paper's Y_R) without materialising the overdeleted pairs: because our
IDB is a function of X alone, the remaining external facts of C are exactly what Red closes.
Cost: O(edges of C) for the search, plus the removed pairs; a component that does not split
costs only the search. Nothing outside the affected components is read.

A batch with both is applied as deletions, then insertions; the returned StoreChanges is the net
difference of the IDB. Fallbacks (removed rules, missing or stale state) recompute.
"""

from __future__ import annotations

from itertools import chain, permutations, product

from ..changes import StoreChanges
from ..store import Relation, RelationKey
from .transitive import EMPTY, ClosureModule


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
    def build(self, external: list[Relation]) -> set[tuple[int, int]]:
        self.reset()
        link = self._link
        for relation in external:
            for u, v in relation:
                link(u, v)
        component = self.component
        pairs: set[tuple[int, int]] = set()
        for start in self.succ.keys() | self.pred.keys():
            if start in component:
                continue
            members = self._search(start)
            for u in members:
                component[u] = members
            # A component's closure is made in one C call: its size is checked before.
            if len(members) > 100:
                self.guard.check(len(pairs) + len(members) ** 2)
            if self.irreflexive:
                pairs.update(permutations(members, 2))
            else:
                pairs.update(product(members, repeat=2))
        if self.irreflexive:
            pairs.update((u, u) for u in self.loops)
        return pairs

    # ------------------------------------------------------------------ Del + Red
    def delete(self, own: Relation, facts: set, result: StoreChanges) -> None:
        component = self.component
        touched: dict[int, set[int]] = {}
        for u, v in facts:
            self._unlink(u, v)
            members = component[u]
            touched[id(members)] = members
        out, inn = self.succ, self.pred
        gone: set[tuple[int, int]] = set()
        lost_loops = {u for u, v in facts if u == v}
        if self.irreflexive:
            gone.update((u, u) for u in lost_loops)
        for old in touched.values():
            parts: list[set[int]] = []
            dropped: list[int] = []
            placed: set[int] = set()
            for start in old:
                if start in placed:
                    continue
                if start not in out and start not in inn:
                    dropped.append(start)
                    del component[start]
                    continue
                members = self._search(start)
                placed |= members
                parts.append(members)
                for u in members:
                    component[u] = members
            if len(parts) == 1 and not dropped:
                continue  # still connected: every pair is still derived
            for members in parts:
                gone.update(product(members, old - members))
            if dropped:
                gone.update(product(dropped, old))
                if self.irreflexive:  # (d, d) was derived only from a loop, lost above
                    gone.difference_update((d, d) for d in dropped if d not in lost_loops)
        # Every pair in ``gone`` is derived now (the IDB is a function of X): no test needed.
        result.remove(self.relation, own.remove_present(gone), owned=True)

    # ------------------------------------------------------------------ Add
    def insert(self, own: Relation, facts: set, result: StoreChanges) -> None:
        component = self.component
        new: set[tuple[int, int]] = set()
        plain = not self.irreflexive
        for u, v in facts:
            self._link(u, v)
            if u == v and not plain:
                new.add((u, u))
            left = component.get(u)
            if left is None:
                left = component[u] = {u}
                if plain:
                    new.add((u, u))
            right = component.get(v)
            if right is None:
                right = component[v] = {v}
                if plain:
                    new.add((v, v))
            if left is right:
                continue
            new.update(product(left, right))
            new.update(product(right, left))
            if len(left) < len(right):
                left, right = right, left
            left |= right
            for w in right:
                component[w] = left
        # Every pair in ``new`` is underived now (the IDB is a function of X): no test needed.
        result.add(self.relation, own.add_absent(new), owned=True)
