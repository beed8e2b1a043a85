"""Rule variants and views used to evaluate the consequences of changes (shared by modules).

Incremental maintenance evaluates rules in a few shapes besides the ordinary one:

* *over the old state*: overdeletion must find rule instances that held before the update,
  including instances using facts that are gone now. The old state of a relation is its current
  relations plus a temporary relation holding the deleted facts (a superset of the old state
  when facts were also added, which only adds candidates: overdeletion is an upper bound that
  rederivation corrects).
* *with negations dropped*: again a superset of the instances that held before; used only to
  collect overdeletion candidates.
* *with a negated atom matched positively* against facts added to (or removed from) the
  negated relation: the instances that a new fact blocks (or a deleted fact enables).
* *with the head bound*: ``check`` keeps, of some candidate facts, those that have a derivation
  in the current state (one-step rederivation, and DRed^c's "still has a non-recursive
  derivation" test computed on demand instead of with counters).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from agent.engine.language import Atom, Negation, Rule, Variable, item_variables
from agent.engine.plan.executor import Executor, Variant
from agent.engine.storage.changes import Facts
from agent.engine.storage.store import DataStoreBag, Relation, RelationKey

HEAD_PREDICATE = "zodiac:head"


def temporary_relations(facts: Facts) -> dict[RelationKey, Relation]:
    found: dict[RelationKey, Relation] = {}
    for key, rows in facts.items():
        if rows:
            relation = Relation(key)
            relation.add_all(rows)
            found[key] = relation
    return found


def sources_for(
    body: Sequence, bag: DataStoreBag, extra: dict[RelationKey, Relation] | None = None
) -> list[list[Relation]]:
    """Per body position, the non-empty relations of ``bag`` plus an extra relation (old
    facts) for positive atoms whose relation has one."""
    found: list[list[Relation]] = []
    for item in body:
        if isinstance(item, Atom):
            relations = [r for r in bag.relations(item.relation) if len(r)]
            if extra and item.relation in extra:
                relations.append(extra[item.relation])
            found.append(relations)
        elif isinstance(item, Negation):
            found.append([r for r in bag.relations(item.atom.relation) if len(r)])
        else:
            found.append([])
    return found


def positive_body(body: Sequence, keep: int | None = None) -> tuple[list, dict[int, int]]:
    """The body without negations (a superset of instances), except that the negation at
    ``keep`` becomes a positive atom. Returns the body and the map old position -> new one."""
    items: list = []
    positions: dict[int, int] = {}
    for index, item in enumerate(body):
        if isinstance(item, Negation):
            if index != keep:
                continue
            item = item.atom
        positions[index] = len(items)
        items.append(item)
    return items, positions


def overdeletion_candidates(
    executor: Executor,
    rule: Rule,
    body: Sequence,
    bag: DataStoreBag,
    old: dict[RelationKey, Relation],
    position: int,
    delta: set,
    out: set,
    head_terms: Sequence | None = None,
    tag: str = "",
) -> None:
    """Heads of the instances (over the old state, negations ignored) whose body item at
    ``position`` matches a fact of ``delta``. A negated item at ``position`` is matched
    positively: the instances that a fact added to the negated relation blocks."""
    items, positions = positive_body(body, keep=position)
    executor.run(
        rule,
        bag,
        out,
        positions[position],
        delta,
        body=items,
        head_terms=head_terms,
        sources=sources_for(items, bag, old),
        variant=Variant.OVERDELETE,
        detail=(tag, position),
    )


def enabled_by_deletion(
    executor: Executor,
    rule: Rule,
    body: Sequence,
    bag: DataStoreBag,
    position: int,
    delta: set,
    out: set,
    head_terms: Sequence | None = None,
    tag: str = "",
) -> None:
    """Heads of the instances, over the current state, that hold because a fact of ``delta``
    was deleted from the relation negated at ``position`` (the negation itself is still checked:
    another fact may block the instance)."""
    items = [*body, _with_fresh_existentials(body, position)]
    executor.run(
        rule,
        bag,
        out,
        len(body),
        delta,
        body=items,
        head_terms=head_terms,
        sources=sources_for(items, bag),
        variant=Variant.ENABLE,
        detail=(tag, position),
    )


def _with_fresh_existentials(body: Sequence, position: int) -> Atom:
    """A positive copy of the atom negated at ``position`` whose existential variables (those
    occurring nowhere else in the body) are renamed, so the negation keeps them existential."""
    atom = body[position].atom
    elsewhere: set[Variable] = set()
    for index, item in enumerate(body):
        if index != position:
            elsewhere |= item_variables(item)
    terms = tuple(
        Variable(f"{t.name}#deleted") if isinstance(t, Variable) and t not in elsewhere else t
        for t in atom.terms
    )
    return Atom(atom.predicate, terms)


def heads_added(
    executor: Executor,
    rule: Rule,
    bag: DataStoreBag,
    plus: Facts,
    unblocked: Facts,
    out: set | None = None,
) -> set:
    """Heads of the instances, over the current state, that use a fact of ``plus`` or that a
    fact of ``unblocked`` (deleted from a negated relation) enables: ``rule`` evaluated once per
    body position whose relation changed. Added to ``out`` (a new set by default), returned."""
    out = set() if out is None else out
    for position, item in enumerate(rule.body):
        if isinstance(item, Atom):
            delta = plus.get(item.relation)
            if delta:
                executor.run(rule, bag, out, position, delta)
        elif isinstance(item, Negation):
            delta = unblocked.get(item.atom.relation)
            if delta:
                enabled_by_deletion(executor, rule, rule.body, bag, position, delta, out)
    return out


def heads_removed(
    executor: Executor,
    rule: Rule,
    bag: DataStoreBag,
    old: dict[RelationKey, Relation],
    minus: Facts,
    blocked: Facts,
    out: set | None = None,
    tag: str = "",
) -> set:
    """Heads of the instances of the old state that use a fact of ``minus`` (deleted) or that
    a fact of ``blocked`` (added to a negated relation) blocks; added to ``out`` (a new set by
    default), returned."""
    out = set() if out is None else out
    for position, item in enumerate(rule.body):
        if isinstance(item, Atom):
            delta = minus.get(item.relation)
        elif isinstance(item, Negation):
            delta = blocked.get(item.atom.relation)
        else:
            continue
        if delta:
            overdeletion_candidates(
                executor, rule, rule.body, bag, old, position, delta, out, tag=tag
            )
    return out


def removed_rule_heads(
    executor: Executor,
    rule: Rule,
    bag: DataStoreBag,
    old: dict[RelationKey, Relation],
    out: set | None = None,
) -> set:
    """Everything a deleted ``rule`` derived over the old state (``bag`` plus the facts of
    ``old``): what its deletion may take away."""
    out = set() if out is None else out
    sources = sources_for(rule.body, bag, old)
    executor.run(rule, bag, out, sources=sources, variant=Variant.REMOVED)
    return out


def check(executor: Executor, rules: Iterable[Rule], bag: DataStoreBag, candidates: Facts) -> Facts:
    """The candidates that some rule derives in one step from the current state."""
    found: Facts = {}
    for rule in rules:
        key = rule.head.relation
        wanted = candidates.get(key)
        if not wanted:
            continue
        head = Atom(HEAD_PREDICATE, rule.head.terms)
        body = [head, *rule.body]
        out = found.setdefault(key, set())
        executor.run(
            rule,
            bag,
            out,
            0,
            wanted,
            body=body,
            sources=[[], *sources_for(rule.body, bag)],
            variant=Variant.CHECK,
            exists=True,
        )
    return found


def intersect(facts: Facts, store_of) -> Facts:
    """Keep, per relation, the facts present in ``store_of(key)`` (a Relation or None)."""
    kept: Facts = {}
    for key, rows in facts.items():
        relation = store_of(key)
        if relation is not None and rows:
            hit = relation.present(rows)
            if hit:
                kept[key] = hit
    return kept


def total(facts: Facts) -> int:
    return sum(len(rows) for rows in facts.values())
