"""How each hyper-node of the new program relates to the old one (ZodiacEdge Alg. 2 and 3).

A rule update changes the hyper-node graph. Comparing the old and new graphs, by the content
keys of their rules (``Rule.key``; never by label), every new hyper-node is:

* ``KEPT``: the same rules as an old hyper-node; it keeps that IDB and module;
* ``REDUCED``: an old hyper-node that only lost rules and still derives the same relations; it
  keeps its IDB and overdeletes what the removed rules derived (or is recomputed when cheaper);
* ``MERGED``: old hyper-nodes united by new rules (Alg. 2): on a pure rule insertion it starts
  from their IDBs and adds the new rules' consequences, otherwise it is recomputed;
* ``SPLIT``: part of an old hyper-node that lost rules otherwise (Alg. 3): recomputed;
* ``NEW``: only new rules: materialised.

An old hyper-node no new one takes its IDB from is dropped with its IDB, without reasoning.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from agent.engine.language import Rule
from agent.engine.modules import NodeState
from agent.engine.program.dependency import HyperGraph, HyperNode


class TransitionKind(enum.Enum):
    KEPT = "kept"
    REDUCED = "reduced"
    MERGED = "merged"
    SPLIT = "split"
    NEW = "new"

    def __str__(self) -> str:
        return self.value


KEPT, REDUCED, MERGED, SPLIT, NEW = TransitionKind


@dataclass
class Transition:
    """How one hyper-node of the new graph relates to the old graph."""

    kind: TransitionKind
    logical: HyperNode
    sources: list[NodeState] = field(default_factory=list)  # old nodes it takes rules from
    new_rules: list[Rule] = field(default_factory=list)
    removed_rules: list[Rule] = field(default_factory=list)
    module_changed: bool = False
    # Why a merge that could be extended is computed afresh instead (the cost estimates: its
    # new rules would derive most of it); empty: extended when the update allows it.
    recompute: str = ""

    def extends(self, extend_merges: bool) -> bool:
        """Whether a merged hyper-node starts from its parts' IDBs (Alg. 2)."""
        return self.kind == MERGED and extend_merges and not self.recompute

    def reuses_idb(self, extend_merges: bool) -> bool:
        """Whether the new hyper-node keeps an old IDB and changes it in place."""
        return self.kind in (KEPT, REDUCED) or self.extends(extend_merges)

    def computed_afresh(self, extend_merges: bool) -> bool:
        """Whether the new hyper-node is computed from nothing into a new IDB."""
        return self.kind in (NEW, SPLIT) or (
            self.kind == MERGED and not self.extends(extend_merges)
        )


def classify(old_nodes: list[NodeState], graph: HyperGraph, deleted: set[str]) -> list[Transition]:
    """The transition of every hyper-node of the new ``graph`` (in its order); ``deleted``
    holds the content keys of the deleted rules."""
    by_rules = {node.logical.rule_keys: node for node in old_nodes}
    owner: dict[str, NodeState] = {}
    for node in old_nodes:
        for rule_key in node.logical.rule_keys:
            owner[rule_key] = node
    transitions: list[Transition] = []
    for logical in graph.nodes:
        keys = logical.rule_keys
        if keys in by_rules:
            transitions.append(Transition(KEPT, logical, [by_rules[keys]]))
            continue
        sources: list[NodeState] = []
        for rule_key in sorted(keys):
            node = owner.get(rule_key)
            if node is not None and all(node is not s for s in sources):
                sources.append(node)
        new_rules = [r for r in logical.rules if r.key not in owner]
        if not sources:
            transitions.append(Transition(NEW, logical, [], new_rules))
            continue
        remaining = [s.logical.rule_keys - deleted for s in sources]
        same_heads = len(sources) == 1 and logical.heads == sources[0].heads
        if same_heads and not new_rules and remaining[0] == keys:
            # Only rules removed, same relations derived: overdelete what they derived. (If a
            # relation stopped being derived here, its stale facts would feed the remaining
            # rules as if they were inputs: such a node is recomputed like a split one.)
            removed = [r for r in sources[0].rules if r.key in deleted]
            transitions.append(Transition(REDUCED, logical, sources, [], removed))
        elif all(rest <= keys for rest in remaining) and all(
            not (s.logical.rule_keys & deleted) for s in sources
        ):
            transitions.append(Transition(MERGED, logical, sources, new_rules))
        else:
            transitions.append(Transition(SPLIT, logical, sources, new_rules))
    return transitions
