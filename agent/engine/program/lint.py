"""Warnings about a program that parses and runs but probably does not say what was meant.

A Datalog mistake rarely fails: ``path(x, y) :- edge(x, y) .`` is a valid rule about the
constants ``x`` and ``y`` and derives nothing; a body atom ``edg(X, Y)`` reads a relation no
one writes. The engine cannot refuse them, but a command line can say so on stderr, as clingo
does ("atom does not occur in any rule head"). The checks run on a materialised reasoner, so
that each warning is about something that did happen (an atom that matched nothing), and
stay quiet on a program that works:

* a body relation that no rule derives and no fact holds (with the known relation nearest in
  spelling, edit distance at most 2, as a suggestion);
* a body atom that matches no fact and holds a short lower-case name (``x``, ``y1``) where a
  variable was probably meant (variables start with an upper-case letter, ``_`` or ``?``);
* run-time errors of binds and comparisons (division by zero, a number compared with a
  string): each made one body fail (docs/semantics.md).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator

from agent.engine.language import (
    RDF_TYPE,
    Aggregate,
    Atom,
    BodyItem,
    Constant,
    Negation,
    Rule,
)

__all__ = ["edit_distance", "program_warnings"]

OWL_SAME_AS = "http://www.w3.org/2002/07/owl#sameAs"
_VARIABLE_LIKE = re.compile(r"[a-z][a-z0-9]?")
MAX_SUGGESTION_DISTANCE = 2


def edit_distance(a: str, b: str, limit: int = MAX_SUGGESTION_DISTANCE) -> int:
    """Levenshtein distance of two names, or ``limit + 1`` once it is sure to exceed ``limit``
    (names of very different lengths are not compared letter by letter)."""
    if abs(len(a) - len(b)) > limit:
        return limit + 1
    previous = list(range(len(b) + 1))
    for i, left in enumerate(a, 1):
        current = [i]
        for j, right in enumerate(b, 1):
            current.append(
                min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (left != right))
            )
        if min(current) > limit:
            return limit + 1
        previous = current
    return previous[-1]


def _atoms(body: Iterable[BodyItem]) -> Iterator[tuple[Atom, bool]]:
    """Every atom a body reads, with whether it is positive (aggregate bodies included)."""
    for item in body:
        if isinstance(item, Atom):
            yield item, True
        elif isinstance(item, Negation):
            yield item.atom, False
        elif isinstance(item, Aggregate):
            yield from _atoms(item.body)


def relation_of(atom: Atom) -> tuple[str, int] | None:
    """The relation an atom reads, as the store keys it (``rdf:type(X, C)`` reads ``C/1``);
    None when that depends on a variable."""
    if atom.predicate == RDF_TYPE and atom.arity == 2:
        kind = atom.terms[1]
        return (str(kind.value), 1) if isinstance(kind, Constant) else None
    return atom.relation


def _heads(rule: Rule) -> Iterator[Atom]:
    yield rule.head
    yield from rule.more_heads


def _rule_ref(rule: Rule) -> str:
    """A rule as a warning names it: its label, or its text (shortened) when it has none."""
    if rule.label:
        return f"rule {rule.label}"
    text = str(rule)
    return f"rule `{text if len(text) <= 80 else text[:77] + '...'}`"


def _name(relation: tuple[str, int]) -> str:
    return f"{relation[0]}/{relation[1]}"


def program_warnings(reasoner) -> list[str]:
    """The warnings of a materialised :class:`~agent.engine.Reasoner`'s program, one line
    each, in rule order."""
    rules: list[Rule] = list(reasoner.rules.values())
    known: set[tuple[str, int]] = set()
    for rule in rules:
        for head in _heads(rule):
            relation = relation_of(head)
            if relation is not None:
                known.add(relation)
    known |= set(reasoner.view().sizes())
    warnings: list[str] = []
    said: set[tuple[str, int]] = set()
    for rule in rules:
        for atom, _positive in _atoms(rule.body):
            relation = relation_of(atom)
            if relation is None or relation in known or relation[0] == OWL_SAME_AS:
                continue
            if relation in said:
                continue
            said.add(relation)
            near = sorted(
                (edit_distance(relation[0], other[0]), _name(other))
                for other in known
                if other[1] == relation[1] and other[0] != relation[0]
            )
            hint = (
                f" (did you mean {near[0][1]}?)"
                if near and near[0][0] <= MAX_SUGGESTION_DISTANCE
                else ""
            )
            warnings.append(
                f"{_rule_ref(rule)}: atom {_name(relation)} does not occur in any rule head or "
                f"fact{hint}"
            )
        for atom, positive in _atoms(rule.body):
            if not positive:
                continue
            names = [
                str(t.value)
                for t in atom.terms
                if isinstance(t, Constant)
                and isinstance(t.value, str)
                and _VARIABLE_LIKE.fullmatch(t.value)
            ]
            if names and relation_of(atom) in known and not reasoner.query(atom):
                spelt = ", ".join(dict.fromkeys(names))
                warnings.append(
                    f"{_rule_ref(rule)}: {atom} matches no fact; {spelt} "
                    f"{'is a constant' if len(set(names)) == 1 else 'are constants'} "
                    "(a variable starts with an upper-case letter, _ or ?)"
                )
    errors = reasoner.stats()["runtime_errors"]
    if errors:
        warnings.append(
            f"{errors} run-time error{'s' if errors != 1 else ''} in binds and comparisons "
            "(division by zero, a number compared with a string, ...): each made a rule body "
            "fail"
        )
    return warnings
