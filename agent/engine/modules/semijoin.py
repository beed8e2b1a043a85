"""The semi-join module: a non-recursive hyper-node of one rule that keeps the facts of one binary
atom that have (or lack) a match in other atoms, ``H(x, y) :- A(x, y), B(y, _)``, evaluated and
maintained a subject at a time on compressed bitmaps.

RS2's leaf rule ``r18: p31(X, Y) :- p25(X, Y), p26(Y, Z)`` is the case that matters: its input
``p25`` is stored by subject as bitmaps (the composition module's output), and the rule keeps,
for each subject ``x``, the objects of ``A[x]`` that are subjects of ``p26``. Seen a subject at a
time, that is one bitmap intersection, ``H[x] = A[x] & K`` where ``K`` is the set of values
``p26`` has on the filter's column; the compiled rule (plan/rewrites/key_filter.py) does the same
with a C-level pass over ``A``'s tuples, which a relation stored by subject must first build.

**Shape** (`semijoin_shape`): the head is the binary atom ``A(x, y)`` itself (same relation
columns, two distinct variables); every other body item is a *filter*: an atom or a negated
atom whose variables are distinct, one of them ``x`` or ``y`` and the others occurring nowhere
else in the rule (``B(y, _)``, ``not C(_, x)``, ``F(y)``). A positive filter on ``y`` keeps the
objects in its key set ``K``, a negated one removes them; a filter on ``x`` keeps or drops the
subject whole.

**Materialise.** The key set of each filter (a bitmap: a relation's subjects, the union of its
object bitmaps, or one C-level pass over its tuples), then ``H[x]`` for every subject of ``A``,
stored by subject (`Relation.adopt_subjects`).

**Maintain (any mix of insertions and deletions).** The subjects whose ``H[x]`` may change are
those of the changed ``A`` facts, and those paired in ``A`` with a changed filter key (for a
filter on ``y``, looked up in ``A`` by object). Each is evaluated afresh over the new state and
compared with what it held (`SubjectChanges.become`: a bitmap difference each way); when they are
most of ``A``'s subjects every subject is evaluated. The key sets are computed over the new
state once per update (a cost set by the filters' subjects, not their facts, for relations
stored by subject). Nothing is kept besides the IDB, so nothing needs rebuilding after a
restart.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from operator import itemgetter

from pyroaring import BitMap

from agent.engine.modules.base import Maintained, NodeState, by_column, by_subject_of
from agent.engine.modules.shapes import SemiJoinPattern
from agent.engine.modules.support.lookups import Lookup, subjects_meeting
from agent.engine.modules.support.per_subject import PerSubjectModule
from agent.engine.modules.support.subject_changes import NO_IDS, SubjectChanges
from agent.engine.plan.executor import Executor
from agent.engine.storage.changes import InputChanges
from agent.engine.storage.store import Relation
from agent.engine.storage.subject_facts import as_bitmap, column_values


def key_set(relations: Iterable[Relation], column: int) -> BitMap:
    """The values the union of ``relations`` has on ``column``, as a bitmap: an index's keys
    (a relation stored by subject: its subjects), the union of a subject-keyed relation's
    object bitmaps, else one C-level pass over the tuples."""
    keys = BitMap()
    for relation in relations:
        if not len(relation):
            continue
        index = relation.existing_index((column,))
        if index is not None:
            keys |= BitMap(index.keys())
        elif relation.arity == 2 and not relation.rows_built:
            keys |= BitMap().union(*map(as_bitmap, by_column(relation, 0).values()))
        else:
            keys |= BitMap(map(itemgetter(column), relation.as_set()))
    return keys


class Keys:
    """The filters' key sets over the new state, and ``H[x]`` for a subject from them."""

    def __init__(self, node: NodeState, pattern: SemiJoinPattern) -> None:
        self.objects: list[tuple[BitMap, bool]] = []
        self.subjects: list[tuple[BitMap, bool]] = []
        for f in pattern.filters:
            keys = key_set(node.bag.relations(f.relation), f.column)
            (self.objects if f.on_object else self.subjects).append((keys, f.negated))

    def image(self, x: int, objects: Iterable[int]) -> BitMap:
        """``H[x]`` given ``A[x]``."""
        for keys, negated in self.subjects:
            if (x in keys) == negated:
                return NO_IDS
        got = as_bitmap(objects)
        for keys, negated in self.objects:
            got = got - keys if negated else got & keys
        return got if got is not objects else got.copy()


class SemiJoinModule(PerSubjectModule):
    name = "semi-join"
    pattern: SemiJoinPattern

    def images(
        self, node: NodeState, executor: Executor, held: dict | None = None
    ) -> Iterator[tuple[int, BitMap]]:
        keys = Keys(node, self.pattern)
        source = Lookup.merged(node.bag.relations(self.pattern.source), 0)
        tick = executor.guard.tick
        if not keys.subjects and len(keys.objects) == 1:
            # One filter on the object (RS2's leaf r18): ``A[x] & keys`` (or ``-``) per
            # subject, a new bitmap each time, with no call per subject besides the tick.
            ((filter_keys, negated),) = keys.objects
            apply = BitMap.__sub__ if negated else BitMap.__and__
            for x, objects in source.items():
                tick()
                yield x, apply(as_bitmap(objects), filter_keys)
            return
        for x, objects in source.items():
            tick()
            yield x, keys.image(x, objects)

    # ------------------------------------------------------------------ maintain
    def apply_changes(
        self, node: NodeState, executor: Executor, changes: InputChanges
    ) -> Maintained:
        p = self.pattern
        relations = node.bag.relations(p.source)
        affected: set[int] = set()
        for facts in (changes.plus.get(p.source), changes.minus.get(p.source)):
            if facts:
                affected |= column_values(facts, 0)
        by_object: set[int] = set()
        for f in p.filters:
            for facts in (changes.plus.get(f.relation), changes.minus.get(f.relation)):
                if facts:
                    values = column_values(facts, f.column)
                    (by_object if f.on_object else affected).update(values)
        if by_object:
            affected |= subjects_meeting(relations, by_object)
        if not affected:
            return Maintained(strategy="semi-join (nothing to do)")
        own = node.own(p.head)
        held = by_subject_of(own)
        keys = Keys(node, p)
        source = Lookup.some(relations, 0, affected)
        changed = SubjectChanges(held)
        for x in affected:
            executor.guard.tick()
            changed.become(x, keys.image(x, source(x)))
        result = Maintained(strategy=f"semi-join ({len(affected)} subjects evaluated)")
        changed.apply(own, p.head, result)
        return result
