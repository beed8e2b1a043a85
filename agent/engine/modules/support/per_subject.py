"""What the one-rule modules that compute a binary head a subject at a time share (composition.py,
semijoin.py): the head stored by subject as bitmaps, materialised from every subject's image,
and recomputed by diffing each subject's new image with what it holds (never as tuples)."""

from __future__ import annotations

import time
from abc import abstractmethod
from collections.abc import Iterable, Sequence
from typing import Any

from pyroaring import BitMap

from agent.engine.language import Rule
from agent.engine.modules.base import Maintained, Module, NodeState, by_subject_of
from agent.engine.modules.support.subject_changes import NO_IDS, SubjectChanges
from agent.engine.plan.executor import Executor
from agent.engine.storage.changes import InputChanges
from agent.engine.storage.store import DataStoreBag, RelationKey


class PerSubjectModule(Module):
    """A hyper-node of one rule with a binary head ``H``, whose image ``H[x]`` of each subject
    is computed from the new state alone (subclasses: `images`, `maintain`)."""

    # Every change costs what it reaches (the subjects it affects), never more than
    # recomputing, which is the same per-subject pass over every subject.
    cheap_deletions = True

    def __init__(self, pattern: Any) -> None:
        super().__init__()
        self.pattern = pattern  # where the rule's variables sit; ``pattern.head``: H

    @property
    def head(self) -> RelationKey:
        return self.pattern.head

    @abstractmethod
    def images(
        self, node: NodeState, executor: Executor, held: dict | None = None
    ) -> Iterable[tuple[int, BitMap]]:
        """``(x, H[x])`` over the new state for every subject ``x`` whose image may be
        non-empty (``held``: what the IDB holds by subject, for the update's budget)."""

    @abstractmethod
    def apply_changes(
        self, node: NodeState, executor: Executor, changes: InputChanges
    ) -> Maintained:
        """`maintain` for changed inputs (the rule itself unchanged)."""

    def handles(self, changes: InputChanges) -> bool:
        return True

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
        return self.apply_changes(node, executor, changes)

    def materialise(self, node: NodeState, executor: Executor) -> None:
        started = time.perf_counter()
        own = node.own(self.head)
        if len(own):
            own.clear()
        subjects = {x: got for x, got in self.images(node, executor) if got}
        own.adopt_subjects(subjects, BitMap)
        node.stats.update(rounds=1, seconds=time.perf_counter() - started)

    def recompute(
        self, node: NodeState, executor: Executor, strategy: str = "recompute"
    ) -> Maintained:
        """Evaluate every subject afresh and diff per subject (the base class would build the
        old and the new IDB as tuples to diff them)."""
        own = node.own(self.head)
        held = by_subject_of(own)
        changed = SubjectChanges(held)
        seen: set[int] = set()
        for x, got in self.images(node, executor, held):
            changed.become(x, got)
            seen.add(x)
        for x in held.keys() - seen:
            changed.become(x, NO_IDS)
        result = Maintained(strategy=strategy)
        changed.apply(own, self.head, result)
        return result
