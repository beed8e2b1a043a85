"""The cost policy: every threshold at which maintaining a hyper-node incrementally is judged
dearer than computing it again, in one place.

Incremental maintenance costs what a change affects; recomputing costs what the hyper-node
reads. Each module and the update driver compare estimates of the two; the factors they compare
them with live here, so that they can be tuned (and printed) together. ``Reasoner(costs=...)``
takes another policy.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CostPolicy:
    # Update driver: input facts a hyper-node loses (or that new facts of negated relations
    # block), as a share of the facts it reads, above which it is recomputed (DRed's
    # overdeletion and rederivation would touch most of it).
    deletion_recompute_share: float = 0.3
    # Update driver: summed shares of new facts in the atoms of a non-recursive join above
    # which recomputing beats seminaive (which evaluates the rule once per atom with new facts,
    # each time over that share of a full evaluation).
    insertion_recompute_growth: float = 1.0
    # Update driver: facts a merged hyper-node's new rules may derive (see
    # ``estimates.merge_recompute_reason``), as a share of what its parts hold, above which
    # the merge is computed afresh instead of extended (Alg. 2).
    merge_recompute_growth: float = 0.5
    # ... once that estimate reaches this many facts (below, both take well under a
    # millisecond and the merge keeps its parts' IDBs).
    merge_recompute_min_facts: int = 10_000
    # Seminaive (DRed^c): overdeleted facts, as a share of the node's facts, above which the
    # overdeletion stops and the node is recomputed.
    overdeletion_recompute_share: float = 0.3
    # Aggregates: touched groups, as a share of all groups, above which the whole rule is
    # evaluated again (one scan instead of an index probe per group).
    aggregate_recompute_group_share: float = 0.5
    # Renaming: changed source facts (counted once per path that copies them), times this,
    # above the number of facts copying the sources afresh would read: recompute.
    renaming_recompute_changed_share: float = 2.0
    # Composition: changed input facts (A and B, added or deleted) above this share of the
    # input facts: every subject is evaluated afresh, without grouping the changes (each a
    # Python step, where a subject's evaluation is one union of bitmaps in C).
    composition_recompute_changed_share: float = 0.25
    # Composition: a membership test in A's tuples (a deleted A fact's candidate tested without
    # reading A[x], see modules/composition.py) costs about this many facts of a pass over A.
    composition_probe_cost: float = 3.0
    # Composition: a candidate ``z`` a subject may lose (a deleted B fact reached through A)
    # tested against the ``y`` left to derive it (a Python step: a lookup and a set test)
    # costs about what uniting this many ``B[y]`` bitmaps in C does when the subject is
    # evaluated afresh instead.
    composition_test_cost: float = 8.0
    # Composition: A kept as tuples gets a bucketed index on y (bitmaps of x, see
    # modules/composition.py) when y's distinct values are at most this share of A's facts (a
    # bitmap per value costs about what a tuple does; 0 never builds one).
    composition_bucketed_share: float = 0.125
    # Hypertree decompositions (modules/hypertree.py): "auto" decomposes a cyclic rule when its
    # cheapest decomposition is estimated cheaper than its join plan, "always" decomposes every
    # cyclic rule that has a decomposition (for comparisons and tests), "off" none.
    # ``Reasoner(decompositions=...)`` sets it.
    decompositions: str = "auto"
    # A cyclic rule over binary relations whose head has one or two variables and whose other
    # variables can be eliminated keeping every intermediate result binary (6-cycles, petals,
    # flowers: modules/support/eliminated.py) is decomposed into such eliminations, evaluated
    # set at a time on bitmaps; False: through a tree of nodes like any other cyclic rule (for
    # comparisons and tests).
    decompositions_set_at_a_time: bool = True
    # Set at a time: changed facts, as a share of the facts each body position reads, summed
    # over the positions, above which an update's heads are found by one evaluation over the
    # whole state instead of one narrowed evaluation per changed position (each of which then
    # reaches about all of it).
    elimination_recompute_growth: float = 0.5
    # Equality (equality.py): deleted explicit facts of the equality component, as a share of
    # its explicit facts, above which the component is rematerialised instead of maintained by
    # B/F~ (each deleted fact costs B/F~ a backward search and a forward re-proof of what it
    # touched, about what recomputing costs per fact; the B/F~ paper's Table 1 shows the two
    # meeting between a tenth and a half of the facts).
    equality_rematerialise_share: float = 0.25
    # A component whose rules are all keys over explicit facts (sameas/keys.py) is
    # rematerialised by grouping facts on each key, and maintained under deletions by closing
    # again the classes that may split; False: by rounds of rule evaluation and by B/F~, like
    # any other component (for comparisons and tests).
    equality_key_closure: bool = True


DEFAULT_COSTS = CostPolicy()
