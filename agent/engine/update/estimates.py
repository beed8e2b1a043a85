"""The update driver's cost estimates: should a hyper-node be maintained or computed again?

Maintenance costs what a change affects; recomputing costs what the hyper-node reads. These
functions estimate both from sizes the stores already know, and answer with the reason to
recompute (shown in ``stats()["last_update"]``) or None. The thresholds are the policy's
(``costs.py``).
"""

from __future__ import annotations

from collections.abc import Callable

from agent.engine.costs import CostPolicy
from agent.engine.modules import NodeState
from agent.engine.storage.changes import ChangeLog, InputChanges
from agent.engine.storage.store import DataStore, RelationKey
from agent.engine.update.transitions import Transition


def recompute_reason(
    policy: CostPolicy, node: NodeState, inputs: InputChanges, transition: Transition
) -> str | None:
    """Why recomputing the node beats maintaining it, or None.

    Insertions are maintained unless most of what a non-recursive join reads is new (see
    ``join_growth``): otherwise their cost is the new derivations only. Deletions cost
    overdeletion plus rederivation, so when the facts a node loses (or that new facts of
    negated relations block) are a large part of what it reads, or when a deleted rule would
    have to be evaluated over more facts than the node holds, deriving the node again is
    cheaper."""
    module = node.module
    if module is not None and not transition.removed_rules and module.handles(inputs):
        return None
    lost = sum(len(rows) for rows in inputs.minus.values())
    retracting = 0
    if inputs.plus:
        negated = node.logical.not_positive_reads
        retracting = sum(len(rows) for key, rows in inputs.plus.items() if key in negated)
    if lost + retracting:
        # (the size is only summed as far as it can matter: an agent's one-fact change stops
        # at the first relation)
        share = policy.deletion_recompute_share
        reads = input_size(node, stop_above=(lost + retracting) / share)
        if lost + retracting > share * max(1, reads):
            if not retracting:
                return f"{lost} input facts lost of {reads}"
            return (
                f"{lost} input facts lost and {retracting} added under a negation or an "
                f"aggregate, of {reads}"
            )
    growth = join_growth(node, inputs)
    if growth > policy.insertion_recompute_growth:
        return f"inputs of its joins grew by {growth:.0%}"
    if transition.removed_rules:
        removed_reads = sum(  # the removed rules read the node's own facts too
            len(r)
            for rule in transition.removed_rules
            for relation, _ in rule.body_relations()
            for r in node.bag.relations(relation)
        )
        keep = node.size() * (2 if node.logical.recursive else 1)
        if removed_reads * 2 > keep:
            return f"removed rules read {removed_reads} facts, node holds {node.size()}"
    return None


def merge_recompute_reason(
    policy: CostPolicy, transition: Transition, size_of: Callable[[RelationKey], int]
) -> str | None:
    """Why a merged hyper-node of a rule insertion is better computed afresh than extended
    from its parts' IDBs, or None. ``size_of``: a relation's facts before the update.

    Extending copies the smaller parts into the largest and evaluates the new rules
    seminaively, paying per new fact; computing afresh pays per fact of the result, in the
    modules' bulk paths. A new rule derives at most what its smallest positive atom holds
    (exactly so for a copy), and in a recursive node each new fact may travel to every head of
    the node: when that estimate exceeds ``merge_recompute_growth`` of what the parts hold,
    most of the node is new and computing it afresh wins (a copy rule closing a cycle over
    160,000 facts brought 480,000 more: 2.3x the from-scratch time extended)."""
    held = sum(source.size() for source in transition.sources)
    estimate = 0
    for rule in transition.new_rules:
        atoms = [key for key, how in rule.body_relations() if how == "positive"]
        if atoms:
            estimate += min(size_of(key) for key in atoms)
    if transition.logical.recursive:
        estimate *= max(1, len(transition.logical.heads))
    if estimate < policy.merge_recompute_min_facts:
        return None
    if estimate > policy.merge_recompute_growth * max(1, held):
        return f"new rules may derive {estimate} facts, its parts hold {held}"
    return None


def join_growth(node: NodeState, inputs: InputChanges) -> float:
    """For a non-recursive node whose rules join several atoms: the largest, over its rules,
    sum over the rule's positive atoms of the share of that atom's facts that are new.
    Seminaive evaluates such a rule once per atom with new facts, each time over that share of
    the work of a full evaluation, so a sum well above 1 costs more than evaluating the rule
    once over everything (RS2's ``p30`` when ``r3`` is added: two thirds of both joined
    relations are new). Recursive nodes are left to seminaive."""
    if node.logical.recursive or not inputs.plus:
        return 0.0
    worst = 0.0
    for rule in node.rules:
        atoms = [rel for rel, how in rule.body_relations() if how == "positive"]
        if len(atoms) < 2:
            continue
        shares = 0.0
        for key in atoms:
            new = len(inputs.plus.get(key, ()))
            if new:
                shares += new / max(1, visible_size(node, key))
        worst = max(worst, shares)
    return worst


def surely_large_deletion(
    policy: CostPolicy,
    node: NodeState,
    old_lower: list[DataStore],
    new_lower: list[DataStore],
    log: ChangeLog,
) -> str | None:
    """Skip computing the exact difference when even a lower bound of the facts lost (the
    facts removed from the only store holding a relation) calls for recomputing.
    ``old_lower``, ``new_lower``: the node's lower stores before and after the update."""
    if set(old_lower) != set(new_lower):
        return None
    reads_keys = node.logical.reads
    # An upper bound first, from the log alone: the facts the lower stores lost. The usual
    # update loses a few facts of relations holding many, and ends here.
    removed_at_most = 0
    for store in old_lower:
        mine = log.of(store)
        if mine is not None and mine.removed and store not in log.created:
            removed_at_most += sum(len(mine.removed.get(key, ())) for key in reads_keys)
    threshold = 2 * policy.deletion_recompute_share
    if not removed_at_most:
        return None
    if removed_at_most <= threshold * max(1, input_size(node, removed_at_most / threshold)):
        return None
    lost = 0
    for key in reads_keys:
        holders = [s for s in old_lower if key in s.relations]
        sizes = [len(s.relations[key]) for s in holders]
        best = 0
        for store in holders:
            mine = log.of(store)
            if mine is None or store in log.created:
                continue
            # At most what the other holders still hold can remain visible.
            others = sum(sizes) - len(store.relations[key])
            best = max(best, len(mine.removed.get(key, ())) - others)
        lost += best
    reads = input_size(node)
    if lost > threshold * max(1, reads):
        return f"{lost} input facts lost of {reads}"
    return None


def input_size(node: NodeState, stop_above: float | None = None) -> int:
    """The facts the node reads from below (`visible_size` summed); with ``stop_above``, the
    sum may stop as soon as it exceeds that bound (the caller only compares it with one)."""
    if stop_above is None:
        return sum(visible_size(node, key) for key in node.logical.reads)
    total = 0
    for key in node.logical.reads:
        total += visible_size(node, key)
        if total > stop_above:
            break
    return total


def visible_size(node: NodeState, key: RelationKey) -> int:
    """Facts of ``key`` the node reads from below (an upper bound of the union's size)."""
    return sum(len(r) for r in node.bag.relations(key) if r is not node.idb.get(key))
