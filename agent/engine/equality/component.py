"""Which rules decide equality, and what they may contain.

Equality is a congruence: every relation is closed under replacing a term by an equal one, so
every relation depends on ``owl:sameAs``, and ``owl:sameAs`` depends on whatever its rules
read. The *equality component* is ``owl:sameAs`` with every relation its rules read,
transitively, and every rule deriving one of them. It is evaluated by rewriting and maintained
by B/F~ (``rewriting.py``, ``bf.py``); the rest of the program runs on the engine over
facts in normal form.

Negation, aggregates, comparisons and binds see individuals (a class of equal names is one
value: its representative, see docs/semantics.md). Inside the equality component the classes
are still being formed, so they have no fixed meaning there: like negation through recursion,
such a rule is refused (StratificationError, the program unchanged).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from agent.engine.errors import StratificationError
from agent.engine.language import RESERVED_PREFIX, Atom, Constant, RelationKey, Rule, Term, map_rule

OWL_SAME_AS = "http://www.w3.org/2002/07/owl#sameAs"
SAME_AS: RelationKey = (OWL_SAME_AS, 2)
# owl:sameAs as a plain relation, for evaluating the component's rules by rounds with an
# evaluator that must not treat it as equality (the engine's own, the Spark job's).
EDGE: RelationKey = (RESERVED_PREFIX + "sameas-edge", 2)


def mentions_equality(rules: Iterable[Rule]) -> bool:
    """Whether any rule derives or reads ``owl:sameAs``."""
    for rule in rules:
        if any(head.relation == SAME_AS for head in rule.heads):
            return True
        if any(relation == SAME_AS for relation, _ in rule.body_relations()):
            return True
    return False


def equality_component(rules: Iterable[Rule]) -> tuple[list[Rule], set[RelationKey]]:
    """The rules and relations of the equality component (see the module docstring).
    Raises StratificationError when one of its rules has anything but positive atoms."""
    rules = list(rules)
    relations: set[RelationKey] = {SAME_AS}
    chosen: dict[int, Rule] = {}
    changed = True
    while changed:
        changed = False
        for number, rule in enumerate(rules):
            if number in chosen or not any(h.relation in relations for h in rule.heads):
                continue
            chosen[number] = rule
            changed = True
            relations |= {head.relation for head in rule.heads}
            relations |= {relation for relation, _ in rule.body_relations()}
    for rule in chosen.values():
        extra = [item for item in rule.body if not isinstance(item, Atom)]
        if extra:
            raise StratificationError(
                f"rule {rule.id} is part of deciding owl:sameAs (it derives "
                f"{'/'.join(map(str, rule.head.relation))}, which owl:sameAs depends on) "
                f"and uses {extra[0]}: negation, aggregates, comparisons and binds see "
                "equal names as one individual, so they cannot take part in deciding which "
                "names are equal; write this rule with positive atoms only",
                [rule.id],
            )
    return [chosen[n] for n in sorted(chosen)], relations


def normal_rule(rule: Rule, representative: Callable[[object], object]) -> Rule:
    """``rule`` with every constant replaced by its representative's value (``rule`` itself
    when none changes). A changed rule is labelled with the user rule's id, so that stats and
    plans name it as the user does."""
    changed = False

    def normal(term: Term) -> Term:
        nonlocal changed
        if isinstance(term, Constant):
            value = representative(term.value)  # the same object when it represents itself
            if value is not term.value:
                changed = True
                return Constant(value)  # type: ignore[arg-type]
        return term

    mapped = map_rule(rule, normal)
    if not changed:
        return rule
    result = Rule(mapped.head, mapped.body, rule.id, mapped.more_heads)
    if rule.checked:
        result.mark_checked()
    return result


def renamed(rule: Rule) -> Rule:
    """``rule`` with its owl:sameAs atoms reading and writing ``EDGE`` instead."""

    def atom(a: Atom) -> Atom:
        return Atom(EDGE[0], a.terms) if a.relation == SAME_AS else a

    heads = [atom(h) for h in rule.heads]
    body = tuple(atom(item) if isinstance(item, Atom) else item for item in rule.body)
    result = Rule(heads[0], body, rule.label, tuple(heads[1:]))
    result.mark_checked()  # checked as the user's rule; it derives a reserved relation
    return result
