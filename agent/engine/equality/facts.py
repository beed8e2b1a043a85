"""An indexed set of facts and the join of a rule body over it, for the equality component.

The equality component's rules are positive atoms only (``component.py``), and it is evaluated
fact by fact (B/F~ checks, proves and retracts single facts), so a small interpreter over
indexes is the right tool here; the engine's compiled plans evaluate every other rule. A
fact is ``(relation, args)`` with args term ids; a rule is a ``PatternRule`` whose atoms hold
term ids (ints) for constants and variables' names (strs) for variables: a substitution is a
dict keyed by names, whose hashes Python keeps, where a ``Variable`` dataclass would hash its
fields in Python at every lookup.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import cached_property

from agent.engine.equality.component import SAME_AS
from agent.engine.language import Atom, Constant, RelationKey, Rule
from agent.engine.terms import TermDictionary

Fact = tuple[RelationKey, tuple[int, ...]]
Term = int | str  # a term id, or a variable's name
Subst = dict[str, int]


@dataclass(frozen=True)
class Pattern:
    relation: RelationKey
    terms: tuple[Term, ...]

    def ground(self, sigma: Subst) -> Fact:
        return (
            self.relation,
            tuple(sigma[t] if t.__class__ is str else t for t in self.terms),
        )

    def unify(self, args: tuple[int, ...], sigma: Subst) -> Subst | None:
        """``sigma`` extended so that this pattern becomes ``args``, or None."""
        out = sigma.copy()
        for term, value in zip(self.terms, args, strict=False):  # (the arity is the same)
            if term.__class__ is str:
                bound = out.setdefault(term, value)
                if bound != value:
                    return None
            elif term != value:
                return None
        return out

    def mapped(self, find: Callable[[int], int]) -> Pattern:
        return Pattern(
            self.relation, tuple(t if t.__class__ is str else find(t) for t in self.terms)
        )


@dataclass(frozen=True)
class PatternRule:
    """A rule of the equality component over term ids; ``source`` is the user's rule."""

    heads: tuple[Pattern, ...]
    body: tuple[Pattern, ...]
    source: Rule

    @classmethod
    def encode(cls, rule: Rule, terms: TermDictionary) -> PatternRule:
        def pattern(atom: Atom) -> Pattern:
            return Pattern(
                atom.relation,
                tuple(
                    terms.encode(t.value) if isinstance(t, Constant) else t.name  # type: ignore[union-attr]
                    for t in atom.terms
                ),
            )

        body = tuple(pattern(item) for item in rule.body if isinstance(item, Atom))
        return cls(tuple(pattern(head) for head in rule.heads), body, rule)

    @cached_property
    def constants(self) -> frozenset[int]:
        """The term ids the rule mentions (computed once: B/F~ asks at every merge)."""
        return frozenset(
            t for atom in (*self.heads, *self.body) for t in atom.terms if t.__class__ is not str
        )

    @cached_property
    def key_position(self) -> int | None:
        """The position ``k`` when the rule is a key: two facts of one relation that agree
        everywhere but at ``k`` make the terms at ``k`` equal, as in ``owl:sameAs(X, Y) :-
        email(X, E), email(Y, E)`` (k = 0, an inverse-functional property) or ``owl:sameAs(Y,
        Z) :- hasAdvisor(X, Y), hasAdvisor(X, Z)`` (k = 1, a functional one). The body's other
        terms must be distinct variables and the rule must name no constant (so that gamma
        never rewrites it); None for any other rule."""
        if len(self.heads) != 1 or len(self.body) != 2 or self.constants:
            return None
        (head,), (first, second) = self.heads, self.body
        if first.relation != second.relation or head.relation != SAME_AS:
            return None
        pairs = zip(first.terms, second.terms, strict=True)
        differ = [i for i, (a, b) in enumerate(pairs) if a != b]
        if len(differ) != 1:
            return None
        position = differ[0]
        equal = {first.terms[position], second.terms[position]}
        rest = first.terms[:position] + first.terms[position + 1 :]
        if set(head.terms) != equal or len(equal) != 2 or len(set(rest)) != len(rest):
            return None
        return position if equal.isdisjoint(rest) else None

    def mapped(self, find: Callable[[int], int]) -> PatternRule:
        return PatternRule(
            tuple(h.mapped(find) for h in self.heads),
            tuple(b.mapped(find) for b in self.body),
            self.source,
        )


class FactIndex:
    """A set of facts with, per relation and position, an index from term to the facts holding
    it there (``columns[relation][position]``): the joins of ``solve`` and the facts naming a
    term (`with_term`, a few relations and positions at most in the component).

    A term held by one fact only (most of them: a person's e-mail address) maps to that fact's
    args, a tuple, rather than to a set of one: an empty set alone costs four times a pair's
    tuple, and the index would otherwise weigh several times the facts."""

    __slots__ = ("by_relation", "columns")

    def __init__(self) -> None:
        self.by_relation: dict[RelationKey, set[tuple[int, ...]]] = {}
        self.columns: dict[RelationKey, list[dict[int, set[tuple[int, ...]]]]] = {}

    def __contains__(self, fact: Fact) -> bool:
        found = self.by_relation.get(fact[0])
        return found is not None and fact[1] in found

    def __len__(self) -> int:
        return sum(len(facts) for facts in self.by_relation.values())

    def __iter__(self) -> Iterator[Fact]:
        for relation, facts in self.by_relation.items():
            for args in facts:
                yield (relation, args)

    def _relation(self, relation: RelationKey) -> set[tuple[int, ...]]:
        facts = self.by_relation.get(relation)
        if facts is None:
            facts = self.by_relation[relation] = set()
            self.columns[relation] = [{} for _ in range(relation[1])]
        return facts

    def add(self, fact: Fact) -> bool:
        relation, args = fact
        facts = self._relation(relation)
        if args in facts:
            return False
        facts.add(args)
        for column, term in zip(self.columns[relation], args, strict=True):
            _put(column, term, args)
        return True

    def add_rows(
        self, relation: RelationKey, rows: Iterable[tuple[int, ...]]
    ) -> list[tuple[int, ...]]:
        """Add many facts of one relation (a column at a time); returns the new ones."""
        facts = self._relation(relation)
        new = [args for args in dict.fromkeys(rows) if args not in facts]
        facts.update(new)
        for position, column in enumerate(self.columns[relation]):
            for args in new:
                _put(column, args[position], args)
        return new

    def discard_rows(self, relation: RelationKey, rows: Iterable[tuple[int, ...]]) -> None:
        for args in rows:
            self.discard((relation, args))

    def discard(self, fact: Fact) -> bool:
        relation, args = fact
        facts = self.by_relation.get(relation)
        if facts is None or args not in facts:
            return False
        facts.discard(args)
        for column, term in zip(self.columns[relation], args, strict=True):
            bucket = column[term]
            if bucket.__class__ is tuple:
                del column[term]
                continue
            bucket.discard(args)
            if len(bucket) == 1:
                column[term] = next(iter(bucket))
        return True

    def with_term(self, term: int) -> set[Fact]:
        found: set[Fact] = set()
        for relation, columns in self.columns.items():
            for column in columns:
                bucket = column.get(term)
                if bucket is None:
                    continue
                if bucket.__class__ is tuple:
                    found.add((relation, bucket))
                else:
                    found.update((relation, args) for args in bucket)
        return found

    def candidates(self, relation: RelationKey, bound: tuple[int | None, ...]) -> Iterable:
        """The args of ``relation`` that may match ``bound`` (None: any term): the smallest
        index bucket of a bound position (the caller unifies)."""
        columns = self.columns.get(relation)
        if columns is None:
            return ()
        best: set | None = None
        for column, term in zip(columns, bound, strict=True):
            if term is None:
                continue
            bucket = column.get(term)
            if bucket is None:
                return ()
            if bucket.__class__ is tuple:
                return (bucket,)
            if best is None or len(bucket) < len(best):
                best = bucket
        if best is None:
            return self.by_relation[relation]
        return best


def _put(column: dict, term: int, args: tuple[int, ...]) -> None:
    """Index ``args`` under ``term`` (see FactIndex: one fact alone is kept as its args)."""
    bucket = column.get(term)
    if bucket is None:
        column[term] = args
    elif bucket.__class__ is tuple:
        column[term] = {bucket, args}
    else:
        bucket.add(args)


def solve(
    atoms: Sequence[tuple[int, Pattern]],
    store: FactIndex,
    sigma: Subst,
    accept: Callable[[int, Fact], bool] | None = None,
) -> Iterator[Subst]:
    """Every extension of ``sigma`` matching all ``atoms`` (``(position in the rule body,
    atom)``) in ``store``, each atom's fact also passing ``accept(position, fact)`` when given.
    Atoms are joined most-bound first."""
    if not atoms:
        yield sigma
        return
    if len(atoms) == 1:
        (position, atom), rest = atoms[0], atoms[1:]
    else:
        best = max(
            range(len(atoms)),
            key=lambda i: sum(1 for t in atoms[i][1].terms if t.__class__ is not str or t in sigma),
        )
        position, atom = atoms[best]
        rest = atoms[:best] + atoms[best + 1 :]
    bound = tuple((sigma.get(t) if t.__class__ is str else t) for t in atom.terms)
    for args in list(store.candidates(atom.relation, bound)):
        extended = atom.unify(args, sigma)
        if extended is None:
            continue
        if accept is not None and not accept(position, (atom.relation, args)):
            continue
        yield from solve(rest, store, extended, accept)


def consequences(
    index: RuleIndex,
    rules: Sequence[PatternRule],
    fact: Fact,
    store: FactIndex,
    excluded: Container[Fact] = (),
) -> Iterator[Fact]:
    """Every head fact of a rule instance that uses ``fact`` and otherwise facts of ``store``
    not in ``excluded``: the paper's ``matchBody(F)`` and ``[store - excluded].eval(Q, {F},
    sigma)``, whose annotation keeps the atoms before ``fact``'s position from matching
    ``fact`` again (an instance using ``fact`` twice is found once)."""
    for rule, at, sigma in index.match_body(rules, fact):
        for tau in solve(
            body_except(rule, at),
            store,
            sigma,
            lambda p, found, at=at: found not in excluded and (p > at or found != fact),
        ):
            for head in rule.heads:
                yield head.ground(tau)


def body_except(rule: PatternRule, position: int) -> list[tuple[int, Pattern]]:
    """The body atoms of ``rule`` but the one at ``position``, with their positions."""
    return [(i, atom) for i, atom in enumerate(rule.body) if i != position]


def whole_body(rule: PatternRule) -> list[tuple[int, Pattern]]:
    return list(enumerate(rule.body))


class RuleIndex:
    """Where a relation occurs in a list of rules (their body and head atoms), by relation.
    The list may be replaced rule by rule with rules of the same shape (renormalised
    constants): positions stay valid."""

    def __init__(self, rules: Sequence[PatternRule]) -> None:
        self.body: dict[RelationKey, list[tuple[int, int]]] = {}
        self.head: dict[RelationKey, list[tuple[int, int]]] = {}
        for number, rule in enumerate(rules):
            for position, atom in enumerate(rule.body):
                self.body.setdefault(atom.relation, []).append((number, position))
            for position, atom in enumerate(rule.heads):
                self.head.setdefault(atom.relation, []).append((number, position))

    def match_body(
        self, rules: Sequence[PatternRule], fact: Fact
    ) -> Iterator[tuple[PatternRule, int, Subst]]:
        """The paper's matchBody: each rule and body position ``fact`` matches, with the
        substitution."""
        for number, position in self.body.get(fact[0], ()):
            rule = rules[number]
            sigma = rule.body[position].unify(fact[1], {})
            if sigma is not None:
                yield rule, position, sigma

    def match_head(
        self, rules: Sequence[PatternRule], fact: Fact
    ) -> Iterator[tuple[PatternRule, Subst]]:
        """The paper's matchHead: each rule with a head atom ``fact`` matches."""
        for number, position in self.head.get(fact[0], ()):
            rule = rules[number]
            sigma = rule.heads[position].unify(fact[1], {})
            if sigma is not None:
                yield rule, sigma


def represented(index: FactIndex, fact: Fact, find: Callable[[int], int], members) -> list[Fact]:
    """The facts of ``index`` whose normal form (under ``find``) is ``fact``: those of the
    first position's class members, filtered (the paper's ``F^pi & E``)."""
    relation, args = fact
    if not args:
        return [fact] if fact in index else []
    found = []
    rest = (None,) * (len(args) - 1)
    for member in members(args[0]):
        for candidate in index.candidates(relation, (member, *rest)):
            if tuple(find(a) for a in candidate) == args:
                found.append((relation, candidate))
    return found
