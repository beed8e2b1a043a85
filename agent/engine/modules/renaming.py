"""The renaming module: a hyper-node whose rules only copy facts, possibly reordering columns.

Every rule has the shape ``H(v_p(1), ..., v_p(k)) :- B(v_1, ..., v_k)``: one positive body atom of
distinct variables, and a head holding the same variables in some order (a permutation p).
RS2's copy cycle ``p20 -> p21 -> p22 -> p20`` fed by ``p11``, ``p12`` and ``p13`` (r9-r14) and its
inverse cycle ``p13 <-> p14`` (r7, r8) are such hyper-nodes; so is a lone symmetric rule
``R(x, y) :- R(y, x)``.

**What the IDB holds.** Following rules along a path composes their permutations, so a head
relation H receives the facts of a relation S (as seen in the node's lower stores: the EDB and
the predecessors' IDBs) under every permutation of a path from S to H of at least one rule. The
pairs (S, permutation) reaching H, its *sources*, are finitely many (at most the relations times
k! permutations) and found by a breadth-first search over the rules. So

    IDB(H) = union over the sources (S, p) of H of p(lower facts of S),

which is exactly what seminaive evaluation stores (every head of a rule instance over the
fixpoint), computed without rounds.

**Maintenance (Add, Del and Red in one step).** A fact can only enter H as the image of an added
input fact and only leave it as the image of a deleted one. So the candidates to add are the
images of the added facts, and the candidates to remove are the images of the deleted facts;
a removal candidate stays when, for some source (S, p), its preimage under p is still visible in
S (set differences, C-level). Cost: the changed facts times the number of sources; nothing else
is read. Rule deletions inside the hyper-node recompute it (its cost is its output).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from operator import itemgetter

from pyroaring import BitMap

from agent.engine.language import Rule
from agent.engine.modules.base import (
    Maintained,
    Module,
    NodeState,
    as_bitmap,
    by_column,
    by_subject_of,
    by_subject_storage,
)
from agent.engine.modules.shapes import Permutation, renaming_shape
from agent.engine.modules.support.subject_changes import SubjectChanges, group_by_column
from agent.engine.plan.executor import Executor
from agent.engine.storage.changes import InputChanges, difference
from agent.engine.storage.store import EMPTY, DataStoreBag, Relation, RelationKey
from agent.engine.storage.subject_facts import (
    difference_by_subject,
    mostly_by_subject,
    present_by_subject,
    subject_map,
    union_by_subject,
)


def compose(first: Permutation, then: Permutation) -> Permutation:
    """Applying ``first`` and then ``then`` as one permutation."""
    return tuple(first[j] for j in then)


def invert(permutation: Permutation) -> Permutation:
    inverse = [0] * len(permutation)
    for j, source in enumerate(permutation):
        inverse[source] = j
    return tuple(inverse)


def mapper(permutation: Permutation) -> Callable[[Iterable[tuple]], set[tuple]] | None:
    """A function taking facts to their images, or None for the identity (use them as is)."""
    if permutation == tuple(range(len(permutation))):  # (every unary one)
        return None
    reorder = itemgetter(*permutation)
    return lambda facts: set(map(reorder, facts))


def sources_of(rules: Sequence[Rule]) -> dict[RelationKey, set[tuple[RelationKey, Permutation]]]:
    """For every head relation, the (relation, permutation) pairs that reach it along a path
    of at least one rule (breadth-first over the rules, until no new pair appears)."""
    shapes = [renaming_shape(rule) for rule in rules]
    reaching: dict[RelationKey, set[tuple[RelationKey, Permutation]]] = {}
    frontier: list[tuple[RelationKey, RelationKey, Permutation]] = []
    for shape in shapes:
        assert shape is not None
        body, head, permutation = shape
        pair = (body, permutation)
        if pair not in reaching.setdefault(head, set()):
            reaching[head].add(pair)
            frontier.append((head, body, permutation))
    while frontier:
        reached, source, so_far = frontier.pop()
        for shape in shapes:
            assert shape is not None
            body, head, permutation = shape
            if body != reached:
                continue
            pair = (source, compose(so_far, permutation))
            if pair not in reaching.setdefault(head, set()):
                reaching[head].add(pair)
                frontier.append((head, source, pair[1]))
    return reaching


class RenamingModule(Module):
    name = "renaming"
    # The driver still recomputes when a lower bound of the facts lost is most of the input
    # (``cheap_deletions`` stays False); any other change is left to ``maintain``.

    def handles(self, changes: InputChanges) -> bool:
        return True

    def __init__(self) -> None:
        self._sources: dict[RelationKey, set[tuple[RelationKey, Permutation]]] = {}
        self._rules: tuple[str, ...] = ()

    def sources(self, node: NodeState) -> dict[RelationKey, set[tuple[RelationKey, Permutation]]]:
        ids = tuple(rule.key for rule in node.rules)
        if ids != self._rules:
            self._sources, self._rules = sources_of(node.rules), ids
        return self._sources

    @staticmethod
    def lower(node: NodeState, key: RelationKey) -> list[Relation]:
        """The relations of ``key`` in the node's lower stores (not its own IDB)."""
        own = node.idb.get(key)
        return [r for r in node.bag.relations(key) if r is not own and len(r)]

    def images(self, node: NodeState, pairs: Iterable[tuple[RelationKey, Permutation]]) -> set:
        """The lower facts of every source, each under its permutation, as tuples (a source
        stored by subject lends tuples built for the call, not kept)."""
        out: set = set()
        for source, permutation in pairs:
            forth = mapper(permutation)
            for relation in self.lower(node, source):
                facts = relation.as_set()
                out.update(facts if forth is None else forth(facts))
        return out

    def images_by_subject(
        self, node: NodeState, pairs: Iterable[tuple[RelationKey, Permutation]]
    ) -> dict[int, BitMap]:
        """`images` of binary sources, as subject -> objects bitmaps: a source copied as it is
        lends its subject sets (its own buckets when it is stored by subject), a swapped one
        its index on the object; each set is added to the image in C."""
        out: dict[int, BitMap] = {}
        for source, permutation in pairs:
            column = permutation[0]  # the source column that becomes the subject
            for relation in self.lower(node, source):
                for subject, objects in by_column(relation, column).items():
                    found = out.get(subject)
                    if found is None:
                        out[subject] = BitMap(objects)
                    else:
                        found.update(objects)
        return out

    def head_groups(self, node: NodeState) -> list[tuple[frozenset, list[RelationKey]]]:
        """The heads grouped by their sources: heads with the same sources hold the same
        facts (RS2's p20, p21 and p22 all copy p11, p12 and p13), so each group's facts are
        computed once and copied (a C-level copy costs a fraction of computing them)."""
        groups: dict[frozenset, list[RelationKey]] = {}
        for head, pairs in self.sources(node).items():
            groups.setdefault(frozenset(pairs), []).append(head)
        return list(groups.items())

    # ------------------------------------------------------------------ Add
    def materialise(self, node: NodeState, executor: Executor) -> None:
        started = time.perf_counter()
        for pairs, heads in self.head_groups(node):
            if heads[0][1] == 2:
                # Binary heads are stored by subject: bitmaps, no tuple made.
                subjects = self.images_by_subject(node, pairs)
                for head in heads[1:]:
                    copy = {subject: objects.copy() for subject, objects in subjects.items()}
                    node.own(head).adopt_subjects(copy, BitMap)
                node.own(heads[0]).adopt_subjects(subjects, BitMap)
                continue
            facts = self.images(node, pairs)
            for head in heads[1:]:
                node.own(head).adopt(set(facts))
            node.own(heads[0]).adopt(facts)
        node.stats.update(rounds=1, seconds=time.perf_counter() - started)

    def recompute(
        self, node: NodeState, executor: Executor, strategy: str = "recompute"
    ) -> Maintained:
        """`Module.recompute`, with the difference computed once per group of heads that
        held, and hold, the same facts (see `head_groups`)."""
        before = self.rematerialise(node, executor)
        by_subject = any(
            relation.arity == 2 and not relation.rows_built
            for relation in node.idb.relations.values()
        )
        if by_subject or any(isinstance(old, dict) for old in before.values()):
            # Heads stored by subject, now or before (a closure, before a rule deletion made
            # the node a renaming): compared a subject at a time, no tuple built.
            return self.changes_since(node, before, strategy)
        result = Maintained(strategy=strategy)
        for _, (first, *rest) in self.head_groups(node):
            size = len(before.get(first, ()))
            added, removed = difference(before.pop(first, set()), node.own(first).tuples)
            for head in rest:
                old = before.pop(head, set())
                if len(old) == size:  # (always, if this module built the IDB)
                    mine = (set(added), set(removed))
                else:
                    mine = difference(old, node.own(head).tuples)
                result.add(head, mine[0], owned=True)
                result.remove(head, mine[1], owned=True)
            result.add(first, added, owned=True)
            result.remove(first, removed, owned=True)
        for key, old in before.items():  # heads no rule derives any more
            result.remove(key, old, owned=True)
        return result

    def extend(self, node: NodeState, executor: Executor, new_rules: Sequence[Rule]) -> Maintained:
        """ZodiacEdge Alg. 2 continuation: the IDB is complete for the other rules, so only
        the sources reached through a new rule add facts (a path of old rules only was
        already followed)."""
        new_keys = {rule.key for rule in new_rules}
        before = sources_of([rule for rule in node.rules if rule.key not in new_keys])
        result = Maintained()
        # Heads reached by the same new sources gain the same images: computed once (a cycle
        # closed by a new rule gives every head of the cycle the same new sources).
        images: dict[frozenset, object] = {}
        for head, pairs in self.sources(node).items():
            fresh = frozenset(pairs - before.get(head, set()))
            if not fresh:
                continue
            own = node.own(head)
            if own.arity == 2 and by_subject_storage(own):
                # Stored by subject (or empty, so made so): the images as bitmaps, added a
                # subject at a time in C (no tuple built, as `materialise` does).
                gained = images.get(fresh)
                if not isinstance(gained, dict):
                    gained = images[fresh] = self.images_by_subject(node, fresh)
                self.change_by_subject(own, head, {}, gained, result)
                continue
            found = images.get(fresh)
            if not isinstance(found, set):
                found = images[fresh] = self.images(node, fresh)
            result.add(head, own.add_all(found))
        result.strategy = "extend"
        return result

    # ------------------------------------------------------------------ Del + Red + Add
    def maintain(
        self,
        node: NodeState,
        executor: Executor,
        changes: InputChanges,
        removed_rules: Sequence[Rule] = (),
        old_bag: DataStoreBag | None = None,
    ) -> Maintained:
        if removed_rules:
            return self.recompute(node, executor, "recompute (rules removed)")
        sources = self.sources(node)
        changed = sum(
            len(changes.minus.get(source, ())) + len(changes.plus.get(source, ()))
            for pairs in sources.values()
            for source, _ in pairs
        )
        output = sum(
            len(relation)
            for pairs in sources.values()
            for source, _ in pairs
            for relation in self.lower(node, source)
        )
        if changed * self.costs.renaming_recompute_changed_share > output:
            # Copying what the sources hold now is one C-level pass per source; checking
            # each changed image costs several, plus keeping the indexes up to date.
            return self.recompute(
                node, executor, f"recompute ({changed} changed images, {output} to copy)"
            )
        result = Maintained()
        checked = 0
        # Heads with the same sources hold the same facts (RS2's p20, p21 and p22 all copy
        # p20's lower facts): their candidates are found and checked once.
        settled: dict[frozenset, tuple[set, set]] = {}
        grouped: dict[frozenset, tuple[dict, dict]] = {}
        for head, pairs in sources.items():
            own = node.own(head)
            key = frozenset(pairs)
            by_subject = own.arity == 2 and not own.rows_built
            if by_subject and key not in grouped and self.copied_by_subject(changes, pairs):
                # Copies of facts changed by subject (a closure, a composition): candidates
                # found and checked a subject at a time, no tuple built.
                lost_map, gained_map = self.candidates_by_subject(changes, pairs)
                checked += sum(map(len, lost_map.values()))
                grouped[key] = (self.unsupported_by_subject(node, pairs, lost_map), gained_map)
            if by_subject and key in grouped:
                self.change_by_subject(own, head, *grouped[key], result)
                continue
            found = settled.get(key)
            if found is None:
                lost, gained = self.candidates(changes, pairs)
                checked += len(lost)
                if lost:
                    lost = self.unsupported(node, pairs, lost)
                found = settled[key] = (lost, gained)
            lost, gained = found
            if by_subject:
                # Stored by subject: changed a subject at a time, reported so (SubjectFacts);
                # the changes grouped by subject once for the heads of the group.
                grouped[key] = (group_by_column(lost, 0), group_by_column(gained, 0))
                self.change_by_subject(own, head, *grouped[key], result)
                continue
            if lost:
                # (intersected per head: the set is shared with the other heads)
                result.remove(head, own.remove_present(own.present(lost)), owned=True)
            if gained:
                result.add(head, own.add_all(gained))
        result.strategy = f"renaming ({checked} candidates checked)"
        return result

    @staticmethod
    def change_by_subject(
        own: Relation,
        head: RelationKey,
        lost: dict[int, BitMap],
        gained: dict[int, BitMap],
        result: Maintained,
    ) -> None:
        """Remove the held facts of ``lost`` and add those of ``gained`` that are not held
        (both by subject, shared with the other heads of the group: only read), a subject at
        a time."""
        held = by_subject_of(own)
        changes = SubjectChanges(held)
        for subject, objects in lost.items():
            mine = held.get(subject)
            if mine:
                gone = objects & as_bitmap(mine)
                if gone:
                    changes.lose(subject, gone)
        for subject, objects in gained.items():
            changes.gain(subject, objects)
        changes.apply(own, head, result)

    @staticmethod
    def candidates(
        changes: InputChanges, pairs: Iterable[tuple[RelationKey, Permutation]]
    ) -> tuple[set, set]:
        """The images of the deleted and of the added source facts: the only facts a head
        with these sources can lose or gain."""
        lost: set = set()
        gained: set = set()
        for source, permutation in pairs:
            images = mapper(permutation)
            minus = changes.minus.get(source)
            if minus:
                lost.update(minus if images is None else images(minus))
            plus = changes.plus.get(source)
            if plus:
                gained.update(plus if images is None else images(plus))
        return lost, gained

    @staticmethod
    def copied_by_subject(
        changes: InputChanges, pairs: Iterable[tuple[RelationKey, Permutation]]
    ) -> bool:
        """Whether the sources are copied as they are (no column permuted) and most of their
        changes come by subject (`SubjectFacts`): then the candidates are found and checked a
        subject at a time."""
        if any(mapper(permutation) is not None for _, permutation in pairs):
            return False
        sources = [source for source, _ in pairs]
        return mostly_by_subject(
            facts
            for source in sources
            for facts in (changes.minus.get(source, EMPTY), changes.plus.get(source, EMPTY))
        )

    @staticmethod
    def candidates_by_subject(
        changes: InputChanges, pairs: Iterable[tuple[RelationKey, Permutation]]
    ) -> tuple[dict[int, BitMap], dict[int, BitMap]]:
        """`candidates` by subject, for sources copied as they are."""
        sources = [source for source, _ in pairs]
        lost = union_by_subject(subject_map(changes.minus.get(s, EMPTY)) for s in sources)
        gained = union_by_subject(subject_map(changes.plus.get(s, EMPTY)) for s in sources)
        return lost, gained

    def unsupported_by_subject(
        self,
        node: NodeState,
        pairs: Iterable[tuple[RelationKey, Permutation]],
        lost: dict[int, BitMap],
    ) -> dict[int, BitMap]:
        """`unsupported` by subject, for sources copied as they are."""
        for source, _ in pairs:
            for relation in self.lower(node, source):
                if lost and len(relation):
                    lost = difference_by_subject(lost, present_by_subject(relation, lost))
        return lost

    def unsupported(
        self, node: NodeState, pairs: Iterable[tuple[RelationKey, Permutation]], lost: set
    ) -> set:
        """Red: the candidates no source still holds a preimage of. (``lost - facts`` costs
        the size of ``lost``; ``lost -= facts`` would cost the size of ``facts``.)"""
        for source, permutation in pairs:
            forth, back = mapper(permutation), mapper(invert(permutation))
            for relation in self.lower(node, source):
                if forth is None or back is None:
                    lost = relation.absent(lost)
                elif lost:
                    lost = lost - forth(relation.present(back(lost)))
            if not lost:
                break
        return lost
