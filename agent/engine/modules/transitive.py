"""The transitive-closure module (modular-materialisation paper, section 5, Algorithms 4-6).

A hyper-node handled here holds exactly one rule over a binary relation R::

    R(x, z) :- R(x, y) and R(y, z)                      (plain)
    R(x, z) :- R(x, y) and R(y, z) and COMP(x, !=, z)   (irreflexive)

**What the IDB holds.** X is the set of *external* R facts: those visible through the node's
lower stores (the EDB and other hyper-nodes deriving R). Like the seminaive module, the IDB
holds the head of every rule instance over the least fixpoint L of X under the rule, whether or
not that head is also external. With ``reach(u)`` = the vertices reachable from u by a walk of
at least one X edge, and ``P2(u)`` = those reachable by a walk of at least two X edges
(``P2(u)`` = union of ``reach(v)`` over the X-successors v of u):

* plain: L = X + IDB, and IDB(u) = P2(u) (so (u, u) when u lies on a cycle);
* irreflexive: L = X + {(u, v) : u != v, v in reach(u)}, and IDB(u) = P2(u) minus u minus the
  *lonely partner* of u: when the strongly connected component (SCC) of u is exactly {u, w}
  and neither u nor w has an X self-loop, (u, w) is NOT derived. The only instances with
  head (u, w) go through u or w, i.e. need (u, u) or (w, w) in L, which the COMP keeps out
  (X = {(a, b), (b, a)} gives an empty IDB although a -> b -> a -> b is a path).

**State.** ``succ`` / ``pred`` (X as adjacency, the paper's X_R, in Python sets), ``reach``
(reach(u) for every vertex with successors, a compressed bitmap) and, irreflexive only,
``lonely`` (u -> its lonely partner). IDB(u) is a function of them, so a change of the IDB is
computed from a change of ``reach``. The IDB itself is stored by subject, P2(u) as a bitmap
(``Relation.adopt_subjects``): no tuple is built unless a reader asks for tuples.

**Materialise (Add from nothing).** SCCs of the X graph (iterative Tarjan, sinks first); for
each SCC bottom-up: a cyclic SCC C (two or more vertices, or a self-loop) has reach = P2 = C
plus its outside successors plus their reach (one bitmap union over the successors'
bitmaps); a vertex u on no cycle has P2(u) = union of its successors' reach and reach(u) =
P2(u) + succ(u). Cost: sum over condensation edges of |reach|, plus the output.

**Insertions (Add).** Per new edge (a, b) (Italiano's incremental closure, the paper's Alg. 4
restated on vertices): every u reaching a (a included) gains S = {b} + reach(b) (S taken before
the update: a new walk's last use of (a, b) is followed by an old walk from b). A backward
search over X-predecessors from a visits u only if b is not yet in reach(u): otherwise reach(u)
already contains S, and so does the reach of every vertex reaching u, so the search is pruned
there. Gains are accumulated per vertex; the IDB gains, for every X-predecessor x of a vertex
that gained, the gain, and for every new edge (x, b), reach(b) (filtered of x and x's lonely
partner, irreflexive). Lonely pairs are re-checked where a new edge can create or break one.
Cost: per inserted edge, the vertices whose reach grows times |S|.

**Deletions (Del + Red).** Choice: instead of the paper's overdeletion along X_R followed by
per-source rederivation (Alg. 5-6), reach is recomputed where it can change. Only vertices
reaching the source a of a deleted edge (the set A, a backward search over the remaining edges)
can lose anything: a walk avoiding every deleted edge survives, and a walk using one passes
through its source. The SCCs of A (over the remaining edges) are visited bottom-up as in
materialisation, reading the final reach of successors outside A; an SCC with no member that
lost an out-edge and no successor whose reach changed keeps its reach (a walk from it either
stays on its own unchanged edges or leaves through such a successor), so only SCCs downstream
of an actual change are recomputed. That is Del (overdelete the pairs of the recomputed SCCs)
and Red (close them again over what remains) without materialising the overdeleted facts. The
IDB loses, for a recomputed u, the pairs (u, z) with z in old reach(u) - new reach(u), or z a
direct successor no longer reachable by two edges, and (irreflexive) (u, w) for a new lonely
partner w; the IDB is monotone in X, so deletions never add. No counters are needed: the new
IDB(u) follows from its definition. Cost: Tarjan over A, the unions of the recomputed SCCs and
the removed pairs; at most a rematerialisation without rebuilding the untouched IDB (deleting
25% of the edges of a 2,000-vertex / 10,000-edge DAG costs about a recomputation, 1% a fifth).

**Extend.** The module is chosen for the node's whole rule set, so a state built for the IDB
already covers newly added rules (nothing to add); without one, extend recomputes.

A batch with both is applied as deletions, then insertions; the returned StoreChanges is the net
difference of the IDB. Removed rules, a state built for another IDB, or input changes that
contradict the recorded X (a fact "added" that X holds, or "removed" that it lacks) fall back to
recomputing from scratch.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence

from pyroaring import BitMap, FrozenBitMap

from agent.engine.budget import NO_GUARD, BudgetGuard
from agent.engine.language import Rule
from agent.engine.modules.base import Maintained, Module, NodeState, by_subject_of
from agent.engine.modules.support.subject_changes import SubjectChanges
from agent.engine.plan.executor import Executor
from agent.engine.program.dependency import strongly_connected_components
from agent.engine.storage.changes import InputChanges, StoreChanges
from agent.engine.storage.store import DataStore, DataStoreBag, Relation, RelationKey
from agent.engine.storage.subject_facts import SubjectFacts, common

EMPTY: frozenset = frozenset()


def successors_within(
    succ: dict[int, BitMap], inside: BitMap | None
) -> Callable[[int], Iterable[int]]:
    """A vertex's successors in ``succ``, only those in ``inside`` when given: the graph the
    closure modules walk component by component."""
    if inside is None:
        return lambda u: succ.get(u, EMPTY)
    return lambda u: succ.get(u, EMPTY) & inside
NO_IDS = FrozenBitMap()  # the reach of a vertex without successors (read only)


class ClosureModule(Module):
    """What the TC and STC modules share: the relation, the variant, the external facts as
    forward/backward adjacency sets (``succ``, ``pred``, ``holds``, ``_link``, ``_unlink``),
    and the fallbacks.

    Subclasses implement ``build`` (materialise into a fresh state), ``delete`` and ``insert``
    (update the state and the IDB for removed / added external facts, recording the changes of
    the IDB)."""

    name = "closure"
    # Deletions cost what they affect (STC: the touched components; TC: the SCCs downstream of
    # a deleted edge), never more than recomputing: the driver need not recompute for them.
    cheap_deletions = True

    def __init__(self, relation: RelationKey, irreflexive: bool = False) -> None:
        self.relation = relation
        self.irreflexive = irreflexive
        self._idb: DataStore | None = None  # the IDB the state describes
        self._size = -1  # its size when the state was last brought up to date
        self.succ: dict[int, set[int]] = {}  # external facts, forwards
        self.pred: dict[int, set[int]] = {}  # and backwards
        self.guard: BudgetGuard = NO_GUARD  # the running update's (set by materialise/maintain)

    def describe(self) -> str:
        return f"{self.name} (x != z)" if self.irreflexive else self.name

    def holds(self, fact: tuple[int, ...]) -> bool:
        return fact[1] in self.succ.get(fact[0], EMPTY)

    def _link(self, u: int, v: int) -> None:
        found = self.succ.get(u)
        if found is None:
            self.succ[u] = {v}
        else:
            found.add(v)
        found = self.pred.get(v)
        if found is None:
            self.pred[v] = {u}
        else:
            found.add(u)

    def _unlink(self, u: int, v: int) -> None:
        out = self.succ[u]
        out.discard(v)
        if not out:
            del self.succ[u]
        into = self.pred[v]
        into.discard(u)
        if not into:
            del self.pred[v]

    # ------------------------------------------------------------------ inputs
    def external(self, node: NodeState) -> list[Relation]:
        """The relations of the bag holding external R facts (every one but the node's own)."""
        own = node.own(self.relation)
        return [r for r in node.bag.relations(self.relation) if r is not own and len(r)]

    # ------------------------------------------------------------------ interface
    def materialise(self, node: NodeState, executor: Executor) -> None:
        started = time.perf_counter()
        self.guard = executor.guard
        own = node.own(self.relation)
        built = self.build(self.external(node))
        if len(own):
            own.clear()
        if isinstance(built, dict):
            own.adopt_subjects(built, BitMap)
        else:
            own.adopt(built)
        self._remember(node)
        node.stats.update(rounds=1, seconds=time.perf_counter() - started)

    def maintain(
        self,
        node: NodeState,
        executor: Executor,
        changes: InputChanges,
        removed_rules: Sequence[Rule] = (),
        old_bag: DataStoreBag | None = None,
    ) -> Maintained:
        self.guard = executor.guard
        minus = changes.minus.get(self.relation) or set()
        plus = changes.plus.get(self.relation) or set()
        reason = None
        if removed_rules:
            reason = "rules removed"
        elif self._idb is not node.idb or len(node.own(self.relation)) != self._size:
            reason = "no state for this IDB"
        elif not all(self.holds(f) for f in minus) or any(self.holds(f) for f in plus):
            reason = "input changes disagree with the recorded external facts"
        if reason:
            return self.recompute(node, executor, f"recompute ({reason})")
        if plus and not minus and not self.succ:
            # Nothing recorded (the rule came before its facts, or all of them went): the IDB
            # is empty, and building the closure of the new facts at once, as materialise does,
            # beats inserting them edge by edge.
            return self.recompute(node, executor, f"closure (+{len(plus)} external facts: built)")
        own = node.own(self.relation)
        result = Maintained()
        # (X holds at least one fact per vertex with successors: the sum is rarely taken)
        lost = len(minus)
        if lost and lost >= len(self.succ) and lost == sum(map(len, self.succ.values())):
            # Every external fact goes (RS2 deleting r4 empties p12's input): the IDB is
            # empty whatever the variant; handed over whole, no pair is looked at.
            emptied = len(minus)
            old = own.detach()  # (by subject when stored so: no tuple built)
            result.remove(
                self.relation, SubjectFacts(old) if isinstance(old, dict) else old, owned=True
            )
            own.clear()
            self.reset()
            minus = set()
        else:
            emptied = 0
        if minus:
            self.delete(own, minus, result)
        if plus:
            self.insert(own, plus, result)
        self._remember(node)
        if emptied:
            result.strategy = f"closure (all {emptied} external facts deleted: emptied)"
            if plus:
                result.strategy += f", then +{len(plus)}"
        else:
            result.strategy = f"closure (-{len(minus)} +{len(plus)} external facts)"
        return result

    def extend(self, node: NodeState, executor: Executor, new_rules: Sequence[Rule]) -> Maintained:
        """The module was chosen for the node's whole rule set, so a state built for this IDB
        (a merged hyper-node maintained just before) already covers the new rules; without
        one (the IDB is the union of the merged parts' IDBs), recompute."""
        if self._idb is node.idb and len(node.own(self.relation)) == self._size:
            return Maintained(strategy="closure (extend: already complete)")
        return self.recompute(node, executor, "recompute (extend)")

    def reset(self) -> None:
        """Forget every external fact (and the state derived from them)."""
        self.succ, self.pred = {}, {}

    def _remember(self, node: NodeState) -> None:
        self._idb = node.idb
        self._size = len(node.own(self.relation))

    # ------------------------------------------------------------------ per module
    def build(self, external: list[Relation]) -> set[tuple[int, int]] | dict[int, set[int]]:
        """Materialise into a fresh state; the IDB as a set of pairs, or as subject ->
        objects sets (stored without building the pairs)."""
        raise NotImplementedError

    def delete(self, own: Relation, facts: set, result: StoreChanges) -> None:
        raise NotImplementedError

    def insert(self, own: Relation, facts: set, result: StoreChanges) -> None:
        raise NotImplementedError


class TransitiveClosureModule(ClosureModule):
    """R(x, z) :- R(x, y), R(y, z) [, x != z] (see the module docstring)."""

    name = "transitive"

    def __init__(self, relation: RelationKey, irreflexive: bool = False) -> None:
        super().__init__(relation, irreflexive)
        self.reach: dict[int, BitMap] = {}  # only vertices with successors (see _close)
        self.lonely: dict[int, int] = {}  # irreflexive: partner in a loop-free 2-vertex SCC

    def reset(self) -> None:
        super().reset()
        self.reach, self.lonely = {}, {}

    # ------------------------------------------------------------------ helpers

    def _close(
        self, vertices: list[int], inside: set[int] | None = None, dirty: set[int] | None = None
    ) -> dict[int, BitMap]:
        """Compute ``reach`` bottom-up over the SCCs of ``vertices``; returns P2 of every vertex
        it recomputed that has successors (the sets live in ``reach``: read, don't mutate).

        Reach sets are compressed bitmaps (pyroaring): the closure is made of unions of whole
        sets, which a bitmap does in C over runs of ids, and it holds a dense set of ids in a
        few bytes each where a Python set takes about 50 (docs/storage.md, the measurement).
        The adjacency (``succ``/``pred``) stays in Python sets: a handful of ids per vertex,
        read one at a time.

        ``inside`` (deletions): the vertex set being recomputed; successors outside it have
        final reach. ``dirty``: its vertices whose out-edges changed. An SCC with no dirty
        member and no successor whose reach changed keeps its reach (a walk from it either
        stays on its unchanged edges or leaves through such a successor), so only SCCs
        downstream of a change are recomputed. Lonely pairs among ``vertices`` are recorded
        (the caller has forgotten the old ones)."""
        succ, reach, irreflexive = self.succ, self.reach, self.irreflexive
        successors = successors_within(succ, inside)
        changed: set[int] = set()
        p2: dict[int, BitMap] = {}
        tick = self.guard.tick
        for component in strongly_connected_components(vertices, successors):
            tick()
            if irreflexive and len(component) == 2:
                u, w = component
                if u not in succ[u] and w not in succ[w]:
                    self.lonely[u] = w
                    self.lonely[w] = u
            if dirty is not None and not any(
                u in dirty or not changed.isdisjoint(succ.get(u, EMPTY)) for u in component
            ):
                continue
            before = [reach.get(u) for u in component] if dirty is not None else ()
            if len(component) == 1:
                u = component[0]
                out = succ.get(u)
                if not out:
                    reach.pop(u, None)
                    if before and before[0]:
                        changed.add(u)
                    continue
                if u not in out:  # on no cycle
                    got = BitMap().union(*[reach[w] for w in out if w in reach])
                    p2[u] = got
                    reach[u] = mine = got.copy()
                    mine.update(out)
                    if before and before[0] != reach[u]:
                        changed.add(u)
                    continue
            members = set(component)
            leaving = set().union(*[succ.get(u, EMPTY) for u in component]) - members
            closed = BitMap(members)
            closed.update(leaving)
            closed.update(*[reach[w] for w in leaving if w in reach])
            first = True
            for u in component:
                reach[u] = p2[u] = closed if first else closed.copy()
                first = False
            if before and any(old != closed for old in before):
                changed.update(component)
        return p2

    def _is_lonely(self, u: int, w: int) -> bool:
        """Whether {u, w} is a whole SCC without self-loops (checked on the current state)."""
        succ, reach = self.succ, self.reach
        su, sw = succ.get(u, EMPTY), succ.get(w, EMPTY)
        if u == w or w not in su or u not in sw or u in su or w in sw:
            return False
        # A larger SCC would have an edge from {u, w} to a third member, which reaches u.
        return not any(u in reach.get(y, EMPTY) for y in (su | sw) if y != u and y != w)

    # ------------------------------------------------------------------ materialise
    def build(self, external: list[Relation]) -> dict[int, BitMap]:
        """The IDB as subject -> objects (P2 per vertex, see the module docstring): stored as
        such (`Relation.adopt_subjects`, the bitmaps as the relation's buckets), its 456k
        tuples on DAG-R are never built unless a reader scans them."""
        self.reset()
        link = self._link
        for relation in external:
            for u, v in relation:
                link(u, v)
        vertices = list(self.succ.keys() | self.pred.keys())
        reach, lonely = self.reach, self.lonely
        subjects: dict[int, BitMap] = {}
        for u, got in self._close(vertices, None).items():
            if got is reach[u]:  # a cyclic SCC's set, shared with the state
                got = got.copy()
            if self.irreflexive:
                got.discard(u)
                w = lonely.get(u)
                if w is not None:
                    got.discard(w)
            if got:
                subjects[u] = got
        return subjects

    # ------------------------------------------------------------------ Del + Red
    def delete(self, own: Relation, facts: set, result: StoreChanges) -> None:
        for u, v in facts:
            self._unlink(u, v)
        # A: every vertex reaching the source of a deleted edge (over the remaining edges: a
        # walk to a source through another deleted edge passes that edge's source first).
        affected = {u for u, _ in facts}
        frontier = list(affected)
        pred = self.pred
        while frontier:
            v = frontier.pop()
            for u in pred.get(v, EMPTY):
                if u not in affected:
                    affected.add(u)
                    frontier.append(u)
        old_reach = {u: self.reach[u] for u in affected if u in self.reach}
        old_partner = {}
        if self.irreflexive:
            for u in affected:
                w = self.lonely.pop(u, None)
                if w is not None:
                    old_partner[u] = w
        new_p2 = self._close(list(affected), affected, {u for u, _ in facts})
        # What each vertex may lose (some of it not held: a successor derived no other way),
        # by subject: intersected with what it holds and removed a bitmap at a time.
        candidates: dict[int, BitMap] = {}
        reach, succ = self.reach, self.succ
        for u, before in old_reach.items():
            after = reach.get(u, NO_IDS)
            maybe = before - after if after is not before and len(after) != len(before) else None
            got = new_p2.get(u)
            if got is not None:
                direct = [v for v in succ[u] if v not in got]
                if direct:
                    maybe = BitMap(direct) if maybe is None else maybe | BitMap(direct)
            if maybe:
                candidates[u] = maybe
        if self.irreflexive:
            lonely = self.lonely
            for u in affected:
                w = lonely.get(u)
                if w is not None and old_partner.get(u) != w:
                    candidates.setdefault(u, BitMap()).add(w)
        held = by_subject_of(own)
        changes = SubjectChanges(held)
        for u, maybe in candidates.items():
            mine = held.get(u)
            if mine and maybe:
                changes.lose(u, common(maybe, mine))
        changes.apply(own, self.relation, result)

    # ------------------------------------------------------------------ Add
    def insert(self, own: Relation, facts: set, result: StoreChanges) -> None:
        reach, pred = self.reach, self.pred
        gains: dict[int, BitMap] = {}
        for a, b in facts:
            self._link(a, b)
            start = reach.get(a)
            if start is not None and b in start:
                continue  # a already reached b: nobody's reach changes (nor P2(a))
            new = BitMap(reach.get(b, NO_IDS))
            new.add(b)
            seen = {a}
            frontier = [a]
            while frontier:
                u = frontier.pop()
                mine = reach.get(u)
                if mine is None:
                    mine = reach[u] = BitMap()
                elif b in mine:
                    continue  # u, and everyone reaching u, already reach b and reach(b)
                gain = new - mine
                mine |= gain
                known = gains.get(u)
                if known is None:
                    gains[u] = gain
                else:
                    known |= gain
                for p in pred.get(u, EMPTY):
                    if p not in seen:
                        seen.add(p)
                        frontier.append(p)
        # P2(x) grows by the gains of x's successors and by reach(b) for new edges (x, b).
        candidates: dict[int, BitMap] = {}
        for v, gain in gains.items():
            for x in pred.get(v, EMPTY):
                known = candidates.get(x)
                if known is None:
                    candidates[x] = gain.copy()
                else:
                    known |= gain
        for x, b in facts:
            got = reach.get(b)
            if got:
                known = candidates.get(x)
                if known is None:
                    candidates[x] = got.copy()
                else:
                    known |= got
        changes = SubjectChanges(by_subject_of(own))
        if self.irreflexive:
            for u, w in self._relonely(facts):
                changes.gain(u, BitMap((w,)))
            lonely = self.lonely
            for x, got in candidates.items():
                got.discard(x)
                w = lonely.get(x)
                if w is not None:
                    got.discard(w)
        for x, got in candidates.items():
            changes.gain(x, got)
        changes.apply(own, self.relation, result)

    def _relonely(self, facts: set) -> set[tuple[int, int]]:
        """Irreflexive: update the lonely pairs after insertions; returns the pairs of those
        that stopped being lonely (now derived). A pair forms only with a new edge between its
        vertices; one breaks only with a self-loop on it or when its SCC grows, and then a new
        edge lies on a cycle through it: its source is in the SCC."""
        lonely, reach = self.lonely, self.reach
        check: set[int] = set()
        for a, b in facts:
            if a == b:
                check.add(a)
                continue
            if b in lonely or a in lonely:
                check.update((a, b))
            elif self._is_lonely(a, b):
                lonely[a] = b
                lonely[b] = a
            cyclic = reach.get(a, EMPTY)
            if a in cyclic and lonely:
                if len(cyclic) < len(lonely):
                    found = [y for y in cyclic if y in lonely]
                else:
                    found = [y for y in lonely if y in cyclic]
                check.update(y for y in found if a in reach.get(y, EMPTY))
        freed: set[tuple[int, int]] = set()
        for u in check:
            w = lonely.get(u)
            if w is not None and not self._is_lonely(u, w):
                del lonely[u]
                del lonely[w]
                freed.add((u, w))
                freed.add((w, u))
        return freed
