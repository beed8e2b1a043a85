"""Aggregates read a subject at a time (agent/engine/modules/support/subject_groups.py), groups that
share their member set read together: equal to plain evaluation (``modules=False``, which evaluates
the aggregate body as a rule) for every function, with loops (a subject its own member),
several readings per subject, readings that are not numbers, missing readings, and after
random updates; with the sharing threshold lowered so that small graphs take the shared path,
and at the default threshold on components larger than it.

The partition kept between updates (agent/engine/modules/support/kept_groups.py): long runs of an
agent's updates, the cases a result per own reading can hide, a directed A whose sets grow,
shrink, split and gain subjects, and failures half way through an update (the rollback must
not reuse what the failed update kept)."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.engine import Reasoner
from agent.engine.language import Program
from agent.engine.modules.support import kept_groups, subject_groups
from tests.support.reference import evaluate
from tests.support.strategies import random_fact_updates

FUNCTIONS = ("count", "sum", "min", "max", "avg", "med")


def program(symmetric_rule: str) -> str:
    lines = [
        "s: nb(X, Y) :- nb(Y, X) .",
        symmetric_rule,
        *(
            f"{f}: {f}nb(X, V) :- aggregate( nb(X, Y) and temp(Y, T) ) on X with {f}(T) as V ."
            for f in FUNCTIONS
        ),
        "one: onenb(X, V) :- aggregate( nb(X, Y) and temp(Y, T) ) on X with sum(1) as V .",
        "w: weird(X, V) :- aggregate( temp(Y, T) and nb(Y, X) ) on X with min(<a>) as V .",
        # Heads that are not the rows: a comparison after, columns reordered; a head without
        # the group variable, which several groups produce.
        "big: bignb(V, X) :- aggregate( nb(X, Y) and temp(Y, T) ) on X with max(T) as V "
        "and V > 30 .",
        "lvl: levelnb(V) :- aggregate( nb(X, Y) and temp(Y, T) ) on X with min(T) as V .",
    ]
    return "\n".join(lines)


TRANSITIVE = {
    "irreflexive": "t: nb(X, Z) :- nb(X, Y) and nb(Y, Z) and X != Z .",
    "plain": "t: nb(X, Z) :- nb(X, Y) and nb(Y, Z) .",
}


# Readings: some equal (23 and 23.0 are one term), most distinct, so that a group's result
# depends on which of its own values it leaves out.
READINGS = [20, 21.5, 22, 23, 23.0, 25, *range(30, 50)]


# A farm's readings as DS1 has them: a few values, most turbines sharing one with others,
# so that a turbine whose reading changes joins turbines whose groups' results did not.
FEW_READINGS = [24, 25, 26.5, 27]


def farm(
    rng: random.Random,
    turbines: int,
    readings: list = READINGS,
    per_turbine: tuple[int, ...] = (0, 1, 1, 1, 2, 3),
) -> list[tuple]:
    """A few chains of turbines (three on average), some loops, one to three readings each
    (a few missing, a few that are not numbers)."""
    facts: list[tuple] = []
    for i in range(turbines - 1):
        if rng.random() > 2 / turbines:
            facts.append(("nb", f"w{i}", f"w{i + 1}"))
    for i in rng.sample(range(turbines), k=turbines // 10):
        facts.append(("nb", f"w{i}", f"w{i}"))
    for i in range(turbines):
        for _ in range(rng.choice(per_turbine)):
            value = rng.choice(readings) if rng.random() > 0.05 else "n/a"
            facts.append(("temp", f"w{i}", value))
    return facts


def plain(reasoner: Reasoner, reference: bool = True) -> set:
    """The model by plain evaluation (``modules=False``), which must equal the reference
    evaluator's when ``reference`` (an aggregate is the aggregate module's with or without
    modules: only the reference reads every group on its own; it is too slow for the larger
    farms, whose closures it computes a fact at a time)."""
    other = Reasoner(modules=False)
    edb = list(reasoner.edb_facts())
    other.add_facts(edb)
    other.add_rules(list(reasoner.rules.values()))
    found = set(other.facts())
    if reference:
        program = Program(tuple(reasoner.rules.values()))
        assert found == evaluate(program, edb).external()
    return found


@pytest.mark.parametrize("variant", sorted(TRANSITIVE))
@pytest.mark.parametrize("threshold, turbines", [(2, 12), (subject_groups.SHARE_AT, 80)])
def test_shared_groups_equal_plain_evaluation(monkeypatch, variant, threshold, turbines):
    monkeypatch.setattr(subject_groups, "SHARE_AT", threshold)
    shared = []
    original = subject_groups.GroupReader.shared_rows

    def counting(self, one, moved=None):
        shared.append(len(one.xs))
        return original(self, one, moved)

    monkeypatch.setattr(subject_groups.GroupReader, "shared_rows", counting)
    rng = random.Random(turbines * 7 + len(variant))
    small = turbines <= 12  # (checked against the reference evaluator too)
    for _ in range(3):
        facts = farm(rng, turbines)
        reasoner = Reasoner()
        reasoner.add_facts(facts)
        reasoner.add_rules(program(TRANSITIVE[variant]))
        assert set(reasoner.facts()) == plain(reasoner, small)
        for _ in random_fact_updates(reasoner, rng, facts, steps=4):
            assert set(reasoner.facts()) == plain(reasoner, small)
    assert shared and max(shared) > 1  # the shared path was taken


def test_subjects_with_equal_sizes_and_least_members_are_told_apart(monkeypatch):
    """Member sets matched by size and least member, then by a subset test (`partition`):
    a directed graph over a small pool gives many subjects whose sets ``A[x] | {x}`` agree
    in size and least member without being equal, and many that are equal (read together).
    A is a derived relation (stored as bitmaps) and an explicit one (sets) in turn."""
    monkeypatch.setattr(subject_groups, "SHARE_AT", 2)
    kinds = []
    original = subject_groups.GroupReader.partition

    def recording(self):
        found = original(self)
        kinds.extend(objects.__class__.__name__ for _, objects in self.a_out.items())
        return found

    monkeypatch.setattr(subject_groups.GroupReader, "partition", recording)
    rng = random.Random(5)
    for derived in (True, False):
        relation = "a" if derived else "e"
        rules = [
            "c: a(X, Y) :- e(X, Y) .",
            *(
                f"{f}: {f}a(X, V) :- aggregate( {relation}(X, Y) and temp(Y, T) ) on X "
                f"with {f}(T) as V ."
                for f in FUNCTIONS
            ),
        ]
        for _ in range(6):
            pool = [f"p{i}" for i in range(4)]
            nodes = pool + [f"x{i}" for i in range(16)]
            facts: list[tuple] = [  # one to three readings each, few equal
                ("temp", n, value)
                for n in nodes
                for value in rng.sample([*range(12), 2.5, 7.25], k=rng.choice([1, 2, 3]))
            ]
            for subject in nodes:  # members mostly from the pool, sometimes any node
                members = rng.sample(pool, k=rng.choice([1, 2, 2, 3]))
                members += rng.sample(nodes, k=rng.choice([0, 0, 1, 2]))
                facts += [("e", subject, member) for member in set(members)]
            reasoner = Reasoner()
            reasoner.add_facts(facts)
            reasoner.add_rules("\n".join(rules))
            assert set(reasoner.facts()) == plain(reasoner)
            for _ in random_fact_updates(reasoner, rng, facts, steps=3):
                assert set(reasoner.facts()) == plain(reasoner)
    assert "BitMap" in kinds and "set" in kinds


@settings(max_examples=300, deadline=None)
@given(
    values=st.lists(st.integers(-20, 20), min_size=1, max_size=30, unique=True),
    data=st.data(),
)
def test_a_sorted_list_without_some_items_reads_as_the_list_they_left(values, data):
    """`SortedWithout`, a shared group's values without a copy: every index (negative ones
    too) and the functions read off it agree with the list the items were deleted from."""
    values.sort()
    gone = data.draw(st.sets(st.sampled_from(range(len(values))), max_size=len(values)))
    kept = [v for position, v in enumerate(values) if position not in gone]
    view = subject_groups.SortedWithout(values, sorted(gone))
    assert len(view) == len(kept)
    for index in range(-len(kept), len(kept)):
        assert view[index] == kept[index]
    for index in (len(kept), -len(kept) - 1):
        with pytest.raises(IndexError):
            view[index]
    if kept:
        for read in subject_groups.ON_SORTED.values():
            assert read(view) == read(kept)


def reading_updates(
    reasoner: Reasoner, rng: random.Random, turbines: int, steps: int, readings: list = READINGS
):
    """Updates an agent makes: mostly readings replaced, added or removed (B alone), now and
    then one neighbour edge added or removed, a new turbine joining or one leaving, its edges
    and readings deleted (A changes: components joined or split, a set growing or shrinking
    by one). Yields after each."""
    for step in range(steps):
        present = sorted((f for f in reasoner.edb_facts() if f[0] == "temp"), key=repr)
        gone: list[tuple] = []
        new: list[tuple] = []
        kinds = ["replace", "replace", "replace", "add", "remove", "edge", "join", "leave"]
        kind = rng.choice(kinds)
        if kind == "replace" and present:
            for old in rng.sample(present, k=min(len(present), rng.choice([1, 1, 3]))):
                value = rng.choice(readings) if rng.random() > 0.05 else "n/a"
                gone.append(old)
                new.append((*old[:2], value))
        elif kind == "add":
            new.append(("temp", f"w{rng.randrange(turbines)}", rng.choice(readings)))
        elif kind == "remove" and present:
            gone.append(rng.choice(present))
        elif kind == "join":  # a new turbine, with a reading, next to one of the farm's
            newcomer = f"w{turbines + step}"
            new.append(("nb", newcomer, f"w{rng.randrange(turbines)}"))
            new.append(("temp", newcomer, rng.choice(readings)))
        elif kind == "leave":  # a turbine and everything said about it
            edb = sorted(reasoner.edb_facts(), key=repr)
            leaving = rng.choice([f[1] for f in edb if f[0] == "nb"] or ["w0"])
            gone += [f for f in edb if leaving in f[1:]]
        else:
            i = rng.randrange(turbines - 1)
            edge = ("nb", f"w{i}", f"w{i + 1}")
            (gone if edge in set(reasoner.edb_facts()) else new).append(edge)
        reasoner.update(add_facts=new, delete_facts=[f for f in gone if f not in new])
        yield


@pytest.mark.parametrize("few", [False, True], ids=["distinct", "few-readings"])
@pytest.mark.parametrize("variant", sorted(TRANSITIVE))
@pytest.mark.parametrize("threshold, turbines", [(2, 12), (subject_groups.SHARE_AT, 80)])
def test_groups_kept_across_reading_changes_equal_plain_evaluation(
    monkeypatch, variant, threshold, turbines, few
):
    """A change of B alone reads only the groups it reaches through the partition kept
    since the last change of A (`KeptPartition`), and passes on only those whose result
    changed: after every step of a long run of reading changes, with edges changed now and
    then, the model equals the one computed from scratch (and the reference evaluator's, for
    the small farms). With few distinct readings, one each, a turbine whose reading changes
    leaves out the same reading as others whose results stay."""
    monkeypatch.setattr(subject_groups, "SHARE_AT", threshold)
    kept = []
    original = kept_groups.KeptPartition.changed_rows

    def counting(self, reader, changes):
        found = original(self, reader, changes)
        kept.append(len(found))
        return found

    monkeypatch.setattr(kept_groups.KeptPartition, "changed_rows", counting)
    rng = random.Random(turbines * 11 + len(variant) + few)
    small = turbines <= 12
    readings, per_turbine = (FEW_READINGS, (1,)) if few else (READINGS, (0, 1, 1, 1, 2, 3))
    for _ in range(2):
        facts = farm(rng, turbines, readings, per_turbine)
        reasoner = Reasoner()
        reasoner.add_facts(facts)
        reasoner.add_rules(program(TRANSITIVE[variant]))
        steps = 20 if small else 12
        for _ in reading_updates(reasoner, rng, turbines, steps, readings):
            assert set(reasoner.facts()) == plain(reasoner, small)
    assert kept and max(kept) > 1  # the kept partition was read through


@pytest.mark.parametrize("variant", sorted(TRANSITIVE))
def test_a_set_keeps_the_subjects_a_change_of_its_member_set_moved_alike(monkeypatch, variant):
    """A turbine leaving a farm (its edge and reading deleted): the others all lose it, it
    loses them all; they stay one set and only it is partitioned afresh, also when it leaves
    near the start, where the set's first subjects are the few that change otherwise than
    most. A chain cut in two near its end: each part loses the other, the larger part stays
    a set, the smaller one is partitioned afresh. After each step, and after the cut is
    mended and the turbines are back, the results equal plain evaluation, maintained through
    the kept partition (a cut in the middle loses most facts: the driver recomputes, see
    ``estimates.py``)."""
    partitioned: list[int] = []
    original = subject_groups.GroupReader.partition

    def counting(self):
        if self.subjects is not None:
            partitioned.append(len(set(self.subjects)))
        return original(self)

    monkeypatch.setattr(subject_groups.GroupReader, "partition", counting)
    size = 2 * subject_groups.SHARE_AT + 10
    edges = [("nb", f"w{i}", f"w{i + 1}") for i in range(size - 1)]
    readings = [("temp", f"w{i}", 20 + i % 7 + i / 100) for i in range(size)]
    reasoner = Reasoner()
    reasoner.add_facts(edges + readings)
    reasoner.add_rules(program(TRANSITIVE[variant]))
    cut = 4  # w0..w4 and the rest
    steps = [  # (added, deleted, the most subjects an aggregate may partition afresh)
        # w2 leaves: w0 and w1, the set's first subjects, lose the rest; w2 loses all; the
        # others, most of them, lose the first three and stay a set.
        ([], [edges[1], edges[2], readings[2]], 3),
        ([edges[1], edges[2], readings[2]], [], 3),
        ([], [edges[-1], readings[-1]], 1),  # the last turbine leaves
        ([], [edges[cut]], cut + 1),  # cut: the smaller part partitioned afresh
        ([edges[cut]], [], cut + 1),  # mended: the smaller part joins, afresh
        ([edges[-1], readings[-1]], [], 1),  # the last turbine is back
    ]
    for added, deleted, most in steps:
        partitioned.clear()
        report = reasoner.update(add_facts=added, delete_facts=deleted)
        strategies = {
            entry["strategy"]
            for entry in report["hyper_nodes"].values()
            if entry["module"] == "aggregate" and entry["added"] + entry["removed"]
        }
        assert strategies == {"groups (partition kept)"}
        assert set(reasoner.facts()) == plain(reasoner, reference=False)
        assert max(partitioned, default=0) <= most, (added, deleted, partitioned)


def test_a_set_read_again_after_values_left_it_or_moved_within_it(monkeypatch):
    """A shared set with a value that is not a number is read group by group; once that
    value is gone its groups' results are computed per set again and compared with what
    they were then, not with what they were before the set held it (here the median of w1's
    neighbours returns to its old value while a group changed in between). A turbine whose
    own reading changed gets its result even when no reading's result changed."""
    monkeypatch.setattr(subject_groups, "SHARE_AT", 2)
    facts = [("nb", f"w{i}", f"w{i + 1}") for i in range(5)]
    facts += [("temp", f"w{i}", value) for i, value in enumerate([20, 22, 24, 26, 28, 30])]
    reasoner = Reasoner()
    reasoner.add_facts(facts)
    reasoner.add_rules(program(TRANSITIVE["irreflexive"]))
    steps = [
        ([("temp", "w1", "n/a")], []),  # the set holds a value that is not a number
        ([("temp", "w2", 40)], [("temp", "w2", 24)]),  # groups change meanwhile
        ([("temp", "w2", 24)], [("temp", "w1", "n/a"), ("temp", "w2", 40)]),  # both undone
        ([("temp", "w2", 40)], [("temp", "w2", 24)]),
        # Two readings swapped: the set's values and each reading's result stay; the two
        # turbines' own results change (each now leaves out the other's old reading).
        ([("temp", "w0", 30), ("temp", "w5", 20)], [("temp", "w0", 20), ("temp", "w5", 30)]),
    ]
    for added, deleted in steps:
        reasoner.update(add_facts=added, delete_facts=deleted)
        assert set(reasoner.facts()) == plain(reasoner)


def test_aggregates_over_the_same_relations_stay_apart_when_an_update_fails(monkeypatch):
    """Aggregates over the same A and B start from copies of one partition (built once per
    update); each keeps its own after. An update that fails after the first aggregate took a
    reading change and before the second did is rolled back (the first gets a fresh module,
    the second keeps its state): the second must not have seen the first's changes, so the
    readings changed after it are still exact."""
    from agent.engine.modules.aggregate import AggregateModule

    monkeypatch.setattr(subject_groups, "SHARE_AT", 2)
    facts = [("nb", f"w{i}", f"w{i + 1}") for i in range(7)]
    facts += [("temp", f"w{i}", value) for i, value in enumerate([20, 22, 24, 26, 28, 30, 32, 34])]
    reasoner = Reasoner()
    reasoner.add_facts(facts)
    reasoner.add_rules(program(TRANSITIVE["irreflexive"]))
    original = AggregateModule.maintain
    calls = []

    def failing_second(self, *args, **kwargs):
        calls.append(self)
        if len(calls) == 2:
            raise RuntimeError("injected failure between two aggregates")
        return original(self, *args, **kwargs)

    monkeypatch.setattr(AggregateModule, "maintain", failing_second)
    with pytest.raises(RuntimeError, match="injected"):
        reasoner.update(add_facts=[("temp", "w2", 40)], delete_facts=[("temp", "w2", 24)])
    monkeypatch.setattr(AggregateModule, "maintain", original)
    assert set(reasoner.facts()) == plain(reasoner)
    for added, deleted in [
        ([("temp", "w3", 40)], [("temp", "w3", 26)]),
        ([("temp", "w2", 41)], [("temp", "w2", 24)]),
        ([("temp", "w3", 26)], [("temp", "w3", 40)]),
    ]:
        reasoner.update(add_facts=added, delete_facts=deleted)
        assert set(reasoner.facts()) == plain(reasoner)


@pytest.mark.slow
@pytest.mark.parametrize("derived", [True, False], ids=["bitmaps", "sets"])
def test_the_kept_partition_follows_changes_of_a_directed_relation(monkeypatch, derived):
    """`KeptPartition.follow_a` on a directed A, where a set's member set can hold objects
    that are not its subjects: x1 and x2 share ``{x1, x2, p0, p1}``. Both losing the same
    object keeps them one set with a smaller member set; both losing different objects
    splits them; a new subject whose member set is a kept set's joins it; both gaining the
    same object grows the set. A is derived (member sets are bitmaps) or explicit (sets)."""
    monkeypatch.setattr(subject_groups, "SHARE_AT", 2)
    edges = [("x1", "x2"), ("x1", "p0"), ("x1", "p1"), ("x2", "x1"), ("x2", "p0"), ("x2", "p1")]
    facts = [("nb", a, b) for a, b in edges]
    facts += [("temp", n, v) for n, v in [("x1", 20), ("x2", 22), ("p0", 24), ("p1", 26)]]
    facts += [("temp", "p2", 28), ("temp", "p3", 30), ("temp", "p4", 32)]
    # Unrelated lone groups, so that each step is small next to the whole and maintained
    # through the kept partition (a change of a third of the facts is recomputed).
    facts += [("nb", f"z{i}", f"z{i + 1}") for i in range(300)]
    facts += [("temp", f"z{i}", i % 17) for i in range(300)]
    a = "a" if derived else "nb"
    rules = [
        "c: a(X, Y) :- nb(X, Y) .",
        *(
            f"{f}: {f}nb(X, V) :- aggregate( {a}(X, Y) and temp(Y, T) ) on X with {f}(T) as V ."
            for f in FUNCTIONS
        ),
    ]
    kinds = []
    original = kept_groups.KeptPartition.follow_a

    def recording(self, reader, *args):
        kinds.extend(one.closed.__class__.__name__ for one in self.shared)
        return original(self, reader, *args)

    monkeypatch.setattr(kept_groups.KeptPartition, "follow_a", recording)
    reasoner = Reasoner()
    reasoner.add_facts(facts)
    reasoner.add_rules("\n".join(rules))
    steps = [
        ([("nb", "x1", "p2"), ("nb", "x2", "p2")], []),  # both gain p2: one set, grown
        ([], [("nb", "x1", "p0"), ("nb", "x2", "p0")]),  # both lose p0: one set, smaller
        ([], [("nb", "x1", "p2"), ("nb", "x2", "p1")]),  # different losses: split
        ([("nb", "x1", "p2"), ("nb", "x2", "p1")], []),  # together again
        (  # p1 joins them while a member's reading changes
            [("nb", "p1", "x1"), ("nb", "p1", "x2"), ("nb", "p1", "p2"), ("temp", "p2", 29)],
            [("temp", "p2", 28)],
        ),
        ([("nb", "x1", "p3"), ("nb", "x2", "p3")], [("nb", "p1", "x1")]),
        ([("nb", "x1", "p0"), ("nb", "x2", "p4")], []),  # different gains: split
    ]
    for added, deleted in steps:
        report = reasoner.update(add_facts=added, delete_facts=deleted)
        strategies = {
            entry["strategy"]
            for entry in report["hyper_nodes"].values()
            if entry["module"] == "aggregate"
        }
        assert strategies == {"groups (partition kept)"}
        assert set(reasoner.facts()) == plain(reasoner)
    assert set(kinds) == ({"BitMap"} if derived else {"frozenset"})


def test_a_partition_built_by_a_failed_update_is_not_used_by_its_rollback(monkeypatch):
    """An update that splits the farm (the driver recomputes the aggregates: the first one
    partitions the new neighbourhoods) and fails at the second aggregate is rolled back: the
    neighbourhoods are restored and the first aggregate computed again, from a partition of
    the restored neighbourhoods, not the failed update's."""
    from agent.engine.modules.aggregate import AggregateModule

    facts = [("nb", f"w{i}", f"w{i + 1}") for i in range(59)]
    facts += [("temp", f"w{i}", 20 + i % 7) for i in range(60)]
    rules = [  # (two aggregates over the same relations: the second one fails)
        "s: nb(X, Y) :- nb(Y, X) .",
        TRANSITIVE["irreflexive"],
        *(
            f"{f}: {f}nb(X, V) :- aggregate( nb(X, Y) and temp(Y, T) ) on X with {f}(T) as V ."
            for f in ("count", "sum")
        ),
    ]
    reasoner = Reasoner()
    reasoner.add_facts(facts)
    reasoner.add_rules("\n".join(rules))
    before = set(reasoner.facts())
    original = AggregateModule.materialise
    calls = []

    def failing_second(self, node, executor):
        calls.append(self)
        if len(calls) == 2:
            raise RuntimeError("injected failure after one aggregate was recomputed")
        return original(self, node, executor)

    monkeypatch.setattr(AggregateModule, "materialise", failing_second)
    with pytest.raises(RuntimeError, match="injected"):
        reasoner.update(delete_facts=[("nb", "w29", "w30")])  # the farm splits in two
    monkeypatch.setattr(AggregateModule, "materialise", original)
    assert len(calls) > 2  # (recomputed over the split farm, then again by the rollback)
    assert set(reasoner.facts()) == before
    reasoner.update(add_facts=[("temp", "w3", 41)], delete_facts=[("temp", "w3", 23)])
    assert set(reasoner.facts()) == plain(reasoner, reference=False)
