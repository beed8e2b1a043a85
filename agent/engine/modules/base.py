"""The state of a hyper-node at run time, and the interface every evaluation module implements."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field

from ..dependency import HyperNode
from ..executor import Executor
from ..language import Rule
from ..store import DataStore, DataStoreBag, Relation, RelationKey


@dataclass
class NodeState:
    """A hyper-node's rules, its IDB (a DataStore it owns) and its EDB (a DataStoreBag of
    pointers to the program EDB, its predecessors' IDBs and its own IDB)."""

    name: str
    logical: HyperNode
    idb: DataStore
    view: DataStoreBag
    stats: dict = field(default_factory=dict)

    @property
    def rules(self) -> tuple[Rule, ...]:
        return self.logical.rules

    @property
    def heads(self) -> frozenset[RelationKey]:
        return self.logical.heads

    def own(self, key: RelationKey) -> Relation:
        return self.idb.relation(key)

    def absorb(self, derived: dict[RelationKey, set]) -> dict[RelationKey, set]:
        """Store derived facts in the IDB; return those that became visible (held by no other
        store of the view), which are the next seminaive round's delta."""
        visible: dict[RelationKey, set] = {}
        for key, facts in derived.items():
            if not facts:
                continue
            own = self.idb.relations[key]
            new = own.add_all(facts)
            if not new:
                continue
            for relation in self.view.relations(key):
                if relation is not own and new:
                    new = new - relation.tuples
            if new:
                visible[key] = new
        return visible

    def size(self) -> int:
        return self.idb.size()


class Module(ABC):
    """How one hyper-node's rules are evaluated (and, in later issues, maintained)."""

    name: str = "module"

    @abstractmethod
    def materialise(self, node: NodeState, executor: Executor) -> None:
        """Compute the node's IDB from scratch (Add over an empty IDB)."""
