"""The state of a hyper-node at run time, and the interface every evaluation module implements.

The interface follows the modular-materialisation paper (Hu, Motik, Horrocks): a module
materialises its hyper-node (Add from nothing) and maintains it when the facts it reads change
(Diff for the consequences of changed inputs, Del for overdeletion, Red for rederivation, Add
for insertion). The update driver (update/maintenance.py) calls ``materialise``, ``extend``,
``maintain`` and ``recompute``, so it never needs to know which algorithm a hyper-node uses.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field

from pyroaring import BitMap

from agent.engine.costs import DEFAULT_COSTS, CostPolicy
from agent.engine.language import Rule
from agent.engine.plan.executor import Executor
from agent.engine.program.dependency import HyperNode
from agent.engine.storage.changes import Facts, InputChanges, StoreChanges, difference
from agent.engine.storage.store import (
    SUBJECT,
    DataStore,
    DataStoreBag,
    Relation,
    RelationKey,
    grouped_by,
)
from agent.engine.storage.subject_facts import SubjectFacts, as_bitmap


@dataclass
class Maintained(StoreChanges):
    """What a module did to its hyper-node's IDB (the net changes), and how: the strategy it
    chose, reported per hyper-node in ``Reasoner.stats()["last_update"]``."""

    strategy: str = ""


@dataclass
class NodeState:
    """A hyper-node's rules, its IDB (a DataStore it owns) and its EDB (a DataStoreBag of
    pointers to the program EDB, its predecessors' IDBs and its own IDB)."""

    name: str
    logical: HyperNode
    idb: DataStore
    bag: DataStoreBag
    module: Module | None = None
    stats: dict = field(default_factory=dict)

    @property
    def rules(self) -> tuple[Rule, ...]:
        return self.logical.rules

    @property
    def heads(self) -> frozenset[RelationKey]:
        return self.logical.heads

    def own(self, key: RelationKey) -> Relation:
        return self.idb.relation(key)

    def lower_stores(self) -> list[DataStore]:
        """The stores this node reads besides its own IDB."""
        return [s for s in self.bag.stores if s is not self.idb]

    def absorb(self, derived: Facts, added: Facts | None = None) -> Facts:
        """Store derived facts in the IDB; return those that became visible (held by no other
        store of the bag), which are the next seminaive round's delta. Facts actually added
        to the IDB are also recorded in ``added`` when given."""
        visible: Facts = {}
        for key, facts in derived.items():
            if not facts:
                continue
            own = self.own(key)
            # An empty relation (a first evaluation) takes the derived set as it is: every
            # caller builds ``derived`` for this call. Inserting its facts one by one costs
            # about as much as deriving them (simulations.bench.incremental, RS2's r18). The
            # delta returned must not be the relation's own set, hence the copy (a C-level
            # copy that keeps the stored hashes, far cheaper).
            new = own.add_all(facts) if len(own) else set(own.adopt(facts))
            if not new:
                continue
            if added is not None:
                added.setdefault(key, set()).update(new)
            for relation in self.bag.relations(key):
                if relation is not own and new:
                    new = relation.absent(new)
            if new:
                visible[key] = new
        return visible

    def size(self) -> int:
        return self.idb.size()


class Module(ABC):
    """How one hyper-node's rules are evaluated and maintained."""

    name: str = "module"
    # The recompute thresholds (costs.py); choose_module sets the reasoner's policy.
    costs: CostPolicy = DEFAULT_COSTS
    # True when the module's own maintenance handles deletions at a cost proportional to what
    # they affect (the closure modules): the driver then never recomputes it for large deletions.
    cheap_deletions: bool = False

    def handles(self, changes: InputChanges) -> bool:
        """Whether ``maintain`` applies this change at a cost set by what it affects, so the
        driver should not recompute the node however large the change (a module with
        ``cheap_deletions`` may still leave some changes to the driver's estimates)."""
        return self.cheap_deletions

    @abstractmethod
    def materialise(self, node: NodeState, executor: Executor) -> None:
        """Compute the node's IDB from scratch (Add over an empty IDB)."""

    @abstractmethod
    def maintain(
        self,
        node: NodeState,
        executor: Executor,
        changes: InputChanges,
        removed_rules: Sequence[Rule] = (),
        old_bag: DataStoreBag | None = None,
    ) -> Maintained:
        """Bring the IDB up to date after the node's inputs changed (and, for a hyper-node that
        lost rules, after ``removed_rules`` were deleted from it; ``old_bag`` is the bag those
        rules used to read). Returns what changed in the IDB and the strategy chosen."""

    def extend(self, node: NodeState, executor: Executor, new_rules: Sequence[Rule]) -> Maintained:
        """Add the consequences of rules newly added to a hyper-node whose IDB is complete for
        its other rules (ZodiacEdge Alg. 2: seminaive over the new rules, then incremental).
        The default recomputes."""
        return self.recompute(node, executor, "recompute (extend)")

    def recompute(
        self, node: NodeState, executor: Executor, strategy: str = "recompute"
    ) -> Maintained:
        """Re-materialise from scratch and report the difference to the previous IDB (a
        relation stored by subject before is compared a subject at a time: its old facts are
        never made into tuples, only the changed ones)."""
        return self.changes_since(node, self.rematerialise(node, executor), strategy)

    @staticmethod
    def changes_since(node: NodeState, before: dict, strategy: str) -> Maintained:
        """The node's IDB now against ``before`` (`rematerialise`'s result), per relation."""
        changes = Maintained(strategy=strategy)
        for key in set(before) | set(node.idb.relations):
            relation = node.idb.relations.get(key)
            old = before.pop(key, set())
            by_subject = relation is not None and relation.arity == 2 and not relation.rows_built
            if isinstance(old, dict) or by_subject:
                # (stored by subject before or now: compared by subject; old tuples, usually
                # none, as the storage of a relation that was empty, are grouped first)
                old_subjects = old if isinstance(old, dict) else grouped_by(old, 0)
                new_subjects = by_subject_of(relation) if relation is not None else {}
                added, removed = subject_difference(old_subjects, new_subjects)
            else:
                new = relation.as_set() if relation is not None else set()
                added, removed = difference(old, new)
            changes.add(key, added, owned=True)
            changes.remove(key, removed, owned=True)
        return changes

    def rematerialise(self, node: NodeState, executor: Executor) -> dict:
        """Materialise the node afresh; returns the previous IDB per relation, which the
        caller now owns (the relations got fresh storage): its set of tuples, or, for a
        relation stored by subject, its subject -> objects dict."""
        before = {key: relation.detach() for key, relation in node.idb.relations.items()}
        node.idb.clear()
        self.materialise(node, executor)
        return before

    def loaded_from_state(self, node: NodeState) -> None:
        """The node's IDB was loaded from saved state rather than computed by this module:
        make sure no auxiliary state is trusted that was not rebuilt. The default has none."""
        return None

    def describe(self) -> str:
        return self.name

    def describe_rule(self, rule: Rule) -> str | None:
        """How the module evaluates ``rule`` when that is not by the rule's own compiled plans
        (a decomposition, say), for ``explain``; None otherwise."""
        return None

    def plan_keys(self, rule: Rule) -> set[str]:
        """The content keys under which ``rule``'s compiled plans are cached (its own, or
        those of the rules a module compiles in its place)."""
        return {rule.key}


def net_changes(node: NodeState, overdeleted: Facts, added: Facts, strategy: str) -> Maintained:
    """What DRed did to the IDB: the overdeleted facts that stayed away (and are held by no
    other store), and the facts added that had not been there before the update."""
    result = Maintained(strategy=strategy)
    for key, rows in overdeleted.items():
        result.remove(key, node.own(key).absent(rows))
    for key, rows in added.items():
        result.add(key, rows - overdeleted.get(key, set()))
    return result


def by_subject_of(own: Relation) -> dict:
    """A binary relation's facts by subject, read only: the storage itself when subject-keyed,
    else its subject index (built if it has none)."""
    return by_column(own, 0)


def by_subject_storage(own: Relation) -> bool:
    """Whether a binary IDB relation is stored by subject, an empty one made so first (what
    a module's by-subject output is added to: a new head of a merged hyper-node would
    otherwise start as tuples and make every later addition build one per fact)."""
    if not own.rows_built:
        return True
    if len(own):
        return False
    own.adopt_subjects({}, BitMap)
    return True


def by_column(relation: Relation, column: int) -> dict:
    """A binary relation's facts keyed on ``column`` (value -> the other column's values),
    read only: an index it has (for a relation stored by subject and column 0, its storage,
    bitmaps included), else one built now (a relation stored by subject, asked by object,
    lends one built from its buckets and not kept: building its tuples for an index would
    keep a tuple per fact)."""
    found = relation.existing_index((column,))
    if found is not None:
        return found
    if column == 1 and not relation.rows_built:
        inverse: dict[int, set[int]] = {}
        for subject, objects in relation.existing_index(SUBJECT).items():  # type: ignore[union-attr]
            for value in objects:
                known = inverse.get(value)
                if known is None:
                    inverse[value] = {subject}
                else:
                    known.add(subject)
        return inverse
    return relation.index((column,))


def subject_difference(old: dict, new: dict) -> tuple[SubjectFacts, SubjectFacts]:
    """``(new - old, old - new)`` for two subject -> objects dicts, by subject (`SubjectFacts`):
    equal subjects compared as bitmaps, one C-level comparison each, and no fact made into a
    tuple. ``old`` is handed over (a detached relation's storage); ``new`` is a live relation's,
    so what is taken from it is copied."""
    added: dict[int, BitMap] = {}
    removed: dict[int, BitMap] = {}
    for subject in old.keys() | new.keys():
        before = old.get(subject)
        after = new.get(subject)
        if before is None:
            added[subject] = BitMap(after)
            continue
        if after is None:
            removed[subject] = as_bitmap(before)
            continue
        before, after = as_bitmap(before), as_bitmap(after)
        if before != after:
            added[subject] = after - before
            removed[subject] = before - after
    return SubjectFacts(added), SubjectFacts(removed)
