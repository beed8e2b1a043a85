"""The linear-closure module: reachability as most users write it (``shapes.py``,
``LinearClosurePattern``), a hyper-node holding one linear step::

    P(x, z) :- P(x, y) and E(y, z)               (right-linear)
    P(x, z) :- E(x, y) and P(y, z)               (left-linear)

The base rules (``P(x, y) :- E(x, y)``, a copy, a filtered copy...) are not recursive and sit
in hyper-nodes of their own: what they derive reaches this one as P facts of its lower stores.

**What the IDB holds.** As for every module, the head of every rule instance over the least
fixpoint L. With X = P's facts visible in the node's lower stores (base rules' and explicit
facts alike), L = X ; E* (right) or E* ; X (left), and the IDB is X ; E+ or E+ ; X.

**State.** E as adjacency (``succ``/``pred``, Python sets), X by subject (``seeds``) and,
right-linear, inverted (``seed_pred``), and one bitmap per vertex, ``q``, a closure over E:

* right: q(u) = E+(u), the vertices reachable from u by at least one E edge (the transitive
  module's reach), and IDB(x) = the union of q(y) over y in X(x);
* left: q(u) = (E* ; X)(u) = X(u) + the union of q(w) over the E-successors w of u, and
  IDB(x) = the union of q(w) over the E-successors w of x ("p2(x)").

Both closures are "seed(u) + p2(u)" (seed: E(u) on the right, X(u) on the left), computed
bottom-up over the SCCs of E (a cyclic component has one set: p2 = q there), so one closure
routine serves both. On the left the IDB is p2; on the right, where X(x) = E(x) (the base rule
``P(x, y) :- E(x, y)`` alone), it is p2 too: materialising costs what the transitive module's
does, and stores the same bitmaps.

**Insertions (Add).** A vertex whose seed or out-edges grew gains the new part; a gain g at u
propagates to u's E-predecessors p as g - q(p), and stops where that is empty (the transitive
module's pruned backward search, with sets). The IDB of x gains, on the right, the gains of
the y in X(x) and q(y) for a new fact (x, y) of X; on the left, the gains of x's successors
and q(w) for a new edge (x, w).

**Deletions (Del + Red), and insertions of more than 1 / ``ONE_BY_ONE`` of the inputs.** As in the
transitive module's deletions, q is recomputed where it can change:
over the vertices reaching one whose seed or out-edges shrank (a backward search over the
remaining edges), bottom-up, reading the final q of successors outside that set, skipping
components with no changed member and no successor whose q changed. The IDB of every subject
that can be affected (its X facts or out-edges changed, or a vertex it reads changed q) is
recomputed from its definition and compared with what it holds; no counters are needed.

A batch is applied as deletions, then insertions. Removed rules, a state built for another IDB
or input changes that contradict the recorded inputs fall back to recomputing, as in the
closure modules. The state is not saved: after a restart, the first update rebuilds it from
the inputs and the saved IDB (``adopt``: the IDB is p2, so q(x) is a union of two sets),
without recomputing the closure.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence

from pyroaring import BitMap

from agent.engine.budget import NO_GUARD, BudgetGuard
from agent.engine.language import Rule
from agent.engine.modules.base import Maintained, Module, NodeState, as_bitmap, by_subject_of
from agent.engine.modules.shapes import LinearClosurePattern
from agent.engine.modules.support.subject_changes import SubjectChanges
from agent.engine.modules.transitive import successors_within
from agent.engine.plan.executor import Executor
from agent.engine.program.dependency import strongly_connected_components
from agent.engine.storage.changes import InputChanges, StoreChanges
from agent.engine.storage.store import (
    SUBJECT,
    DataStore,
    DataStoreBag,
    Relation,
    RelationKey,
    grouped_by,
)

EMPTY: frozenset = frozenset()
# Insertions in one update above 1 / ONE_BY_ONE of the inputs (E and X) are applied by
# reclosing (``reclose``), not one gain at a time (``insert``): on DAG(1000), 1% went 4x faster
# one by one, 5% 1.5x faster reclosed.
ONE_BY_ONE = 40
Adjacency = dict[int, set[int]]


def _link(forward: Adjacency, u: int, v: int) -> bool:
    """Add (u, v); whether it was new."""
    found = forward.get(u)
    if found is None:
        forward[u] = {v}
        return True
    if v in found:
        return False
    found.add(v)
    return True


def _unlink(forward: Adjacency, u: int, v: int) -> bool:
    """Remove (u, v); whether it was there."""
    found = forward.get(u)
    if found is None or v not in found:
        return False
    found.discard(v)
    if not found:
        del forward[u]
    return True


def _adjacency(
    relations: list[Relation], like: tuple[Adjacency, Adjacency] | None = None
) -> tuple[Adjacency, Adjacency]:
    """The union of binary relations as forward and backward adjacency sets; when the forward
    sets equal ``like``'s, both are copies of ``like``'s (no fact visited in Python)."""
    forward: Adjacency = {}
    for relation in relations:
        index = relation.existing_index(SUBJECT)
        groups = index if index is not None else grouped_by(relation, 0)
        for u, objects in groups.items():
            known = forward.get(u)
            if known is None:
                forward[u] = set(objects)
            else:
                known.update(objects)
    if like is not None and forward == like[0]:
        return forward, {v: set(us) for v, us in like[1].items()}
    backward: Adjacency = {}
    for u, objects in forward.items():
        for v in objects:
            known = backward.get(v)
            if known is None:
                backward[v] = {u}
            else:
                known.add(u)
    return forward, backward


class LinearClosureModule(Module):
    """One linear step over P (see the module docstring)."""

    name = "linear closure"
    # Deletions cost the SCCs downstream of a change, never more than recomputing.
    cheap_deletions = True

    def __init__(self, pattern: LinearClosurePattern) -> None:
        self.pattern = pattern
        self.head = pattern.head
        self.step = pattern.step
        self.right = pattern.right
        self.guard: BudgetGuard = NO_GUARD
        self._idb: DataStore | None = None  # the IDB the state describes
        self._size = -1  # its size when the state was last brought up to date
        self._loaded: DataStore | None = None  # an IDB loaded from saved state (``adopt``)
        self.reset()

    def describe(self) -> str:
        return f"linear closure ({self.pattern.kind})"

    def reset(self) -> None:
        self.succ: Adjacency = {}  # E, forwards
        self.pred: Adjacency = {}  # and backwards
        self.seeds: Adjacency = {}  # X by subject
        self.seed_pred: Adjacency = {}  # and by object (right-linear only: who reads q(y))
        self.q: dict[int, BitMap] = {}  # non-empty sets only

    # ------------------------------------------------------------------ reading the state
    def seed(self, u: int) -> set[int]:
        """What q(u) holds besides p2(u) (see the module docstring)."""
        return (self.succ if self.right else self.seeds).get(u, EMPTY)

    def idb_of(self, x: int) -> BitMap:
        """IDB(x) from its definition (a fresh bitmap)."""
        q = self.q
        reads = (self.seeds if self.right else self.succ).get(x, EMPTY)
        return BitMap().union(*[q[y] for y in reads if y in q])

    def subjects(self) -> Iterable[int]:
        """Every x whose IDB may be non-empty."""
        return self.seeds if self.right else self.succ

    def holds(self, key: RelationKey, fact: tuple[int, int]) -> tuple[bool, ...]:
        """Whether the recorded E and X hold ``fact`` of ``key`` (one flag per role)."""
        u, v = fact
        found: tuple[bool, ...] = ()
        if key == self.step:
            found += (v in self.succ.get(u, EMPTY),)
        if key == self.head:
            found += (v in self.seeds.get(u, EMPTY),)
        return found

    # ------------------------------------------------------------------ the closure
    def _close(
        self, vertices: list[int], inside: set[int] | None = None, dirty: set[int] | None = None
    ) -> tuple[set[int], dict[int, BitMap]]:
        """Compute q bottom-up over the SCCs of ``vertices`` (successors outside ``inside``
        have final q); with ``dirty``, a component with no dirty member and no successor whose
        q changed keeps its q. Returns the vertices whose q changed (every one computed when
        ``dirty`` is None) and p2 of those computed (shared with q on a cycle: read only)."""
        succ, q = self.succ, self.q
        successors = successors_within(succ, inside)
        changed: set[int] = set()
        p2: dict[int, BitMap] = {}
        tick = self.guard.tick
        for component in strongly_connected_components(vertices, successors):
            tick()
            if dirty is not None and not any(
                u in dirty or not changed.isdisjoint(succ.get(u, EMPTY)) for u in component
            ):
                continue
            if len(component) == 1 and component[0] not in succ.get(component[0], EMPTY):
                u = component[0]  # on no cycle: q(u) = seed(u) + p2(u)
                before = q.get(u)
                got = BitMap().union(*[q[w] for w in succ.get(u, EMPTY) if w in q])
                p2[u] = got
                mine = got.copy()
                mine.update(self.seed(u))
                if mine:
                    q[u] = mine
                elif before is not None:
                    del q[u]
                if dirty is None or before != q.get(u):
                    changed.add(u)
                continue
            members = set(component)  # a cycle: every member has the same q, = its p2
            got = BitMap()
            reads: list[BitMap] = []
            for u in component:
                got.update(self.seed(u))
                reads.extend(q[w] for w in succ.get(u, EMPTY) if w not in members and w in q)
            if reads:
                got = got.union(*reads)
            for i, u in enumerate(component):
                before = q.get(u)
                q[u] = p2[u] = got if i == 0 else got.copy()
                if dirty is None or before != got:
                    changed.add(u)
        return changed, p2

    # ------------------------------------------------------------------ interface
    def external(self, node: NodeState, key: RelationKey) -> list[Relation]:
        own = node.own(self.head)
        return [r for r in node.bag.relations(key) if r is not own and len(r)]

    def materialise(self, node: NodeState, executor: Executor) -> None:
        started = time.perf_counter()
        self.guard = executor.guard
        self._loaded = None
        self._read_inputs(node)
        succ, pred, seeds = self.succ, self.pred, self.seeds
        _, p2 = self._close(list(succ.keys() | pred.keys() | seeds.keys()))
        subjects = {}
        q = self.q
        for x in self.subjects():
            if self.right and seeds.get(x) != succ.get(x):
                got = self.idb_of(x)
            else:  # p2(x), held apart from q
                got = p2.get(x)
                if got is None:
                    continue
                if got is q.get(x):
                    got = got.copy()
            if got:
                subjects[x] = got
        own = node.own(self.head)
        if len(own):
            own.clear()
        own.adopt_subjects(subjects, BitMap)
        self._remember(node)
        node.stats.update(rounds=1, seconds=time.perf_counter() - started)

    def _read_inputs(self, node: NodeState) -> None:
        """A fresh state holding the inputs the bag holds now (no closure yet). Read a subject
        at a time (a relation's subject index, or its facts grouped): the usual X is a copy
        of E, whose adjacency is then copied whole rather than built again fact by fact."""
        self.reset()
        self.succ, self.pred = _adjacency(self.external(node, self.step))
        external = self.external(node, self.head)
        if self.right:
            self.seeds, self.seed_pred = _adjacency(external, like=(self.succ, self.pred))
        else:
            self.seeds = _adjacency(external, like=(self.succ, self.pred))[0]

    def loaded_from_state(self, node: NodeState) -> None:
        """The IDB is the saved one: the first update rebuilds the state from it (``adopt``)
        rather than recomputing."""
        self._loaded = node.idb

    def adopt(self, node: NodeState, minus: dict, plus: dict) -> bool:
        """Rebuild the state for an IDB loaded from saved state, as it was before this update's
        input changes (``minus``, ``plus``), without recomputing the IDB: on the left
        q(x) = X(x) + IDB(x) for every x (the IDB is p2); on the right, q(x) = E(x) + IDB(x)
        where X(x) = E(x), and the other vertices are closed over those. Costs reading the
        inputs and a union per vertex, where recomputing costs the whole closure and a
        comparison of the IDB. False (nothing trusted) if the changes contradict the inputs."""
        self._loaded = None
        self._read_inputs(node)
        for key in (self.step, self.head):
            if not all(all(self.holds(key, f)) for f in plus[key]):
                return False
            if any(any(self.holds(key, f)) for f in minus[key]):
                return False
        self._apply_inputs(plus, add=False)  # back to the inputs the saved IDB was built on
        self._apply_inputs(minus, add=True)
        held = by_subject_of(node.own(self.head))
        q, succ, seeds = self.q, self.succ, self.seeds
        rest: list[int] = []
        for u in succ.keys() | seeds.keys():
            if self.right and seeds.get(u) != succ.get(u):
                if u in succ:
                    rest.append(u)
                continue
            got = BitMap(self.seed(u))
            mine = held.get(u)
            if mine:
                got |= as_bitmap(mine)
            if got:
                q[u] = got
        if rest:
            self._close(rest, set(rest))
        self._remember(node)
        return True

    def _remember(self, node: NodeState) -> None:
        self._idb = node.idb
        self._size = len(node.own(self.head))

    def maintain(
        self,
        node: NodeState,
        executor: Executor,
        changes: InputChanges,
        removed_rules: Sequence[Rule] = (),
        old_bag: DataStoreBag | None = None,
    ) -> Maintained:
        self.guard = executor.guard
        keys = (self.step, self.head)
        minus = {k: changes.minus.get(k) or set() for k in keys}
        plus = {k: changes.plus.get(k) or set() for k in keys}
        reason = None
        adopted = False
        if removed_rules:
            reason = "rules removed"
        elif self._idb is not node.idb or len(node.own(self.head)) != self._size:
            reason = "no state for this IDB"
            if self._loaded is node.idb and self.adopt(node, minus, plus):
                reason, adopted = None, True
        if not reason and (
            not all(all(self.holds(k, f)) for k, facts in minus.items() for f in facts)
            or any(any(self.holds(k, f)) for k, facts in plus.items() for f in facts)
        ):
            reason = "input changes disagree with the recorded inputs"
        if reason:
            return self.recompute(node, executor, f"recompute ({reason})")
        lost = sum(map(len, minus.values()))
        gained = sum(map(len, plus.values()))
        if gained and not lost and not self.q:
            # Nothing closed yet (the rule came before its facts): building the closure at
            # once, as materialise does, beats inserting the facts one by one.
            return self.recompute(node, executor, f"{self.describe()} (+{gained}: built)")
        own = node.own(self.head)
        result = Maintained()
        inputs = sum(len(r) for key in keys for r in self.external(node, key))
        if gained * ONE_BY_ONE > inputs:
            # Many insertions: pushing each gain up separately revisits the same ancestors
            # (10% of DAG(1000)'s edges took 10x recomputing); reclosing what lies above the
            # changes costs at most about a materialisation.
            self.reclose(own, minus, plus, result)
        else:
            if lost:
                self.reclose(own, minus, None, result)
            if gained:
                self.insert(own, plus, result)
        self._remember(node)
        result.strategy = f"{self.describe()} (-{lost} +{gained} input facts)"
        if adopted:
            result.strategy += ", state rebuilt from the saved IDB"
        return result

    def extend(self, node: NodeState, executor: Executor, new_rules: Sequence[Rule]) -> Maintained:
        """Chosen for the node's whole rule set: a state built for this IDB covers the new
        rule already; without one, recompute."""
        if self._idb is node.idb and len(node.own(self.head)) == self._size:
            return Maintained(strategy=f"{self.describe()} (extend: already complete)")
        return self.recompute(node, executor, "recompute (extend)")

    # ------------------------------------------------------------------ applying changes
    def _apply_inputs(
        self, facts: dict[RelationKey, Iterable], add: bool
    ) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
        """Change the recorded E and X; returns the E edges and X facts changed."""
        change = _link if add else _unlink
        edges: list[tuple[int, int]] = []
        seeds: list[tuple[int, int]] = []
        for u, v in facts[self.step]:
            change(self.succ, u, v)
            change(self.pred, v, u)
            edges.append((u, v))
        for u, v in facts[self.head]:
            change(self.seeds, u, v)
            if self.right:
                change(self.seed_pred, v, u)
            seeds.append((u, v))
        return edges, seeds

    def reclose(
        self,
        own: Relation,
        minus: dict[RelationKey, Iterable],
        plus: dict[RelationKey, Iterable] | None,
        result: StoreChanges,
    ) -> None:
        """Deletions (Del + Red), and large insertions: apply the changes to the inputs,
        recompute q over the vertices reaching a change, bottom-up, and the IDB of every
        subject that can be affected from its definition (module docstring). A new walk, like
        an old one, reaches a changed vertex (an edge's source, a seed's subject) before it
        uses a changed edge, over edges that stay; so the search runs over the final edges."""
        edges, seeds = self._apply_inputs(minus, add=False)
        if plus is not None:
            more_edges, more_seeds = self._apply_inputs(plus, add=True)
            edges += more_edges
            seeds += more_seeds
        dirty = {u for u, _ in edges}
        if not self.right:
            dirty.update(u for u, _ in seeds)
        affected: set[int] = set(dirty)
        frontier = list(dirty)
        pred = self.pred
        while frontier:
            v = frontier.pop()
            for u in pred.get(v, EMPTY):
                if u not in affected:
                    affected.add(u)
                    frontier.append(u)
        # (most of the graph: its SCCs are found over all edges, no successor set intersected)
        inside = affected if 2 * len(affected) < len(self.succ) else None
        changed, p2 = self._close(list(affected), inside, dirty) if dirty else (set(), {})
        subjects = {u for u, _ in (seeds if self.right else edges)}
        readers = self.seed_pred if self.right else pred
        for y in changed:
            subjects.update(readers.get(y, EMPTY))
        changes = SubjectChanges(by_subject_of(own))
        q, succ, all_seeds = self.q, self.succ, self.seeds
        for x in subjects:
            # p2(x), when computed and the IDB's definition (as in materialise): a subject
            # that reads a changed vertex was recomputed (on the left, always)
            got = p2.get(x)
            if got is not None and (not self.right or all_seeds.get(x) == succ.get(x)):
                changes.become(x, got.copy() if got is q.get(x) else got)
            else:
                changes.become(x, self.idb_of(x))
        changes.apply(own, self.head, result)

    def insert(
        self, own: Relation, facts: dict[RelationKey, Iterable], result: StoreChanges
    ) -> None:
        edges, seeds = self._apply_inputs(facts, add=True)
        q, pred = self.q, self.pred
        # Gains of q, propagated backwards while they add something.
        todo: list[tuple[int, BitMap]] = []
        for a, b in edges:
            gain = BitMap(q.get(b, ()))
            if self.right:
                gain.add(b)
            todo.append((a, gain))
        if not self.right:
            todo.extend((x, BitMap((y,))) for x, y in seeds)
        gains: dict[int, BitMap] = {}
        tick = self.guard.tick
        while todo:
            tick()
            u, gain = todo.pop()
            mine = q.get(u)
            if mine is None:
                new = gain
                q[u] = gain.copy()
            else:
                new = gain - mine
                if not new:
                    continue
                mine |= new
            known = gains.get(u)
            if known is None:
                gains[u] = new.copy()
            else:
                known |= new
            for p in pred.get(u, EMPTY):
                todo.append((p, new))
        candidates: dict[int, BitMap] = {}

        def offer(x: int, objects: BitMap) -> None:
            known = candidates.get(x)
            if known is None:
                candidates[x] = objects.copy()
            else:
                known |= objects

        readers = self.seed_pred if self.right else pred
        for y, gain in gains.items():
            for x in readers.get(y, EMPTY):
                offer(x, gain)
        for x, y in seeds if self.right else edges:
            got = q.get(y)
            if got:
                offer(x, got)
        changes = SubjectChanges(by_subject_of(own))
        for x, got in candidates.items():
            changes.gain(x, got)
        changes.apply(own, self.head, result)
