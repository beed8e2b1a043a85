"""A hyper-node's IDB changed a subject at a time: what each subject lost and gained, as bitmaps,
applied to a binary relation bucket by bucket and reported by subject (SubjectFacts, in
StoreChanges). Shared by the modules that compute their output per subject (composition,
symmetric-transitive, renaming)."""

from __future__ import annotations

from collections.abc import Iterable

from pyroaring import BitMap

from agent.engine.modules.base import as_bitmap
from agent.engine.storage.changes import StoreChanges
from agent.engine.storage.store import Relation, RelationKey, grouped_by
from agent.engine.storage.subject_facts import SubjectFacts

NO_IDS = BitMap()  # an empty set of ids (read only)


class SubjectChanges:
    """What the IDB loses and gains, per subject, against ``held`` (the IDB by subject before
    the change); applied to the relation a subject at a time, reported as tuples."""

    def __init__(self, held: dict) -> None:
        self.held = held
        self.lost: dict[int, BitMap] = {}
        self.gained: dict[int, BitMap] = {}

    def become(self, x: int, objects: BitMap) -> None:
        """``x``'s objects are now exactly ``objects``."""
        before = self.held.get(x)
        if before is None:
            if objects:
                self.gained[x] = objects
            return
        before = as_bitmap(before)
        if objects != before:
            self.lost[x] = before - objects
            self.gained[x] = objects - before

    def known(self, x: int, lost: BitMap, gained: BitMap) -> None:
        """``x`` loses exactly ``lost`` (all held) and gains exactly ``gained`` (none held),
        a subject with no change recorded yet; both are copied (one pair is given to many
        subjects)."""
        if x in self.lost or x in self.gained:
            raise AssertionError(f"subject {x}: a change is recorded already")
        if lost:
            self.lost[x] = lost.copy()
        if gained:
            self.gained[x] = gained.copy()

    def lose(self, x: int, objects: BitMap) -> None:
        """``x`` loses ``objects`` (all held; the bitmap is taken over)."""
        known = self.lost.get(x)
        if known is None:
            self.lost[x] = objects
        else:
            known |= objects

    def gain(self, x: int, objects: BitMap) -> None:
        """``x`` gains whichever of ``objects`` it does not hold (``objects`` is only read:
        one bitmap may be offered to many subjects)."""
        before = self.held.get(x)
        objects = objects - as_bitmap(before) if before else objects.copy()
        if objects:
            known = self.gained.get(x)
            if known is None:
                self.gained[x] = objects
            else:
                known |= objects

    def apply(self, own: Relation, head: RelationKey, result: StoreChanges) -> None:
        """Change ``own`` (bucket by bucket when it is subject-keyed, else through its tuples)
        and record the changes in ``result`` by subject (`SubjectFacts`: tuples only for a
        reader that wants them). The relation's size is checked against the changes: a loss
        that was not held or a gain that was is a bug, raised at once."""
        gone = SubjectFacts({x: objs for x, objs in self.lost.items() if objs})
        new = SubjectFacts({x: objs for x, objs in self.gained.items() if objs})
        if own.rows_built:
            own.remove_present(gone.tuples())
            own.add_absent(new.tuples())
        else:
            expected = len(own) - len(gone) + len(new)
            own.change_subjects(gone.by_subject, new.by_subject)
            if len(own) != expected:
                raise AssertionError(f"{own!r}: per-subject changes disagree with its facts")
        result.remove(head, gone, owned=True)
        result.add(head, new, owned=True)


def group_by_column(facts: Iterable[tuple[int, int]], column: int) -> dict[int, BitMap]:
    """Binary facts as key -> the other column's values (a bitmap), keyed on ``column`` (a
    SubjectFacts keyed on its subjects is grouped already)."""
    if isinstance(facts, SubjectFacts) and column == 0:
        return {key: as_bitmap(values) for key, values in facts.by_subject.items() if values}
    return {key: BitMap(values) for key, values in grouped_by(facts, column).items()}
