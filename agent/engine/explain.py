"""Derivation trees for ``Reasoner.explain``: why does a fact hold?

A proof of a derived fact is a rule instance whose positive premises are themselves proved;
explicit facts are leaves. Recursive rules allow cyclic "proofs" (``p(a,b)`` from ``p(b,a)``
from ``p(a,b)``), so the search is bounded by proof height and deepened iteratively (1, 2, 4,
...): the first tree found is one of (nearly) minimal height, and "no proof of height <= h" is
memoised per fact, which keeps the search polynomial. Explanations are rare and interactive,
so this module favours being obviously right over being fast: it interprets rules instead of
compiling them.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from . import values
from .errors import ZodiacError
from .language import (
    Aggregate,
    Atom,
    Bind,
    Comparison,
    Constant,
    Negation,
    Rule,
    Variable,
)
from .planner import BindStep, FilterStep, NegationStep, ScanStep, plan_rule
from .store import RelationKey
from .values import EVAL_ERRORS
from .view import MaterialisedView

SEARCH_BUDGET = 2_000_000


@dataclass
class Derivation:
    """``fact`` holds because it is explicit (``rule is None``) or by ``rule`` from
    ``premises``, while each fact in ``absent`` (from negated atoms) does not hold."""

    fact: tuple
    rule: str | None = None
    premises: list[Derivation] = field(default_factory=list)
    absent: list[str] = field(default_factory=list)
    detail: str = ""

    @property
    def explicit(self) -> bool:
        return self.rule is None

    def lines(self, depth: int = 0) -> list[str]:
        pad = "  " * depth
        how = "explicit" if self.rule is None else f"by rule {self.rule}"
        extra = f" ({self.detail})" if self.detail else ""
        out = [f"{pad}{_format_fact(self.fact)}   [{how}{extra}]"]
        for premise in self.premises:
            out.extend(premise.lines(depth + 1))
        for missing in self.absent:
            out.append(f"{pad}  not {missing}   [absent]")
        return out

    def __str__(self) -> str:
        return "\n".join(self.lines())


def _format_fact(fact: tuple) -> str:
    return "(" + ", ".join(repr(v) for v in fact) + ")"


class _Search:
    def __init__(self, view: MaterialisedView) -> None:
        self.view = view
        self.terms = view.terms
        self.values = view.terms.values
        self.proved: dict[tuple, Derivation] = {}
        self.failed: dict[tuple, int] = {}
        self.steps = 0
        self.rules_by_head = view.rules_by_head()
        self.external = view.external
        self.explicit = view.explicit
        self.holders = view.holders

    def prove(self, key: RelationKey, args: tuple[int, ...], height: int) -> Derivation | None:
        fact = (key, args)
        if fact in self.proved:
            return self.proved[fact]
        if self.explicit(key, args):
            found = Derivation(self.external(key, args))
            self.proved[fact] = found
            return found
        if height <= 0 or self.failed.get(fact, -1) >= height:
            return None
        for rule in self.rules_by_head.get(key, ()):
            found = self.prove_by(rule, key, args, height)
            if found is not None:
                self.proved[fact] = found
                return found
        self.failed[fact] = height
        return None

    def prove_by(
        self, rule: Rule, key: RelationKey, args: tuple[int, ...], height: int
    ) -> Derivation | None:
        aggregate = rule.aggregate()
        if aggregate is not None:
            node = self.view.node_of(rule)
            if node is not None:
                relation = node.store.get(key)
                if relation is not None and args in relation:
                    return Derivation(
                        self.external(key, args),
                        rule.id,
                        detail=f"{aggregate.function} over the matches of the aggregate body",
                    )
            return None
        for binding in self.matches(rule, args):
            premises: list[Derivation] = []
            for item in rule.body:
                if not isinstance(item, Atom):
                    continue
                premise_args = tuple(self.term_id(t, binding) for t in item.terms)
                found = self.prove(item.relation, premise_args, height - 1)
                if found is None:
                    break
                premises.append(found)
            else:
                absent = [
                    self.describe_negated(item.atom, binding)
                    for item in rule.body
                    if isinstance(item, Negation)
                ]
                return Derivation(self.external(key, args), rule.id, premises, absent)
        return None

    def term_id(self, term, binding: dict[Variable, int]) -> int:
        if isinstance(term, Variable):
            return binding[term]
        found = self.terms.lookup(term.value)
        return -1 if found is None else found

    def describe_negated(self, atom: Atom, binding: dict[Variable, int]) -> str:
        parts = []
        for term in atom.terms:
            if isinstance(term, Variable) and term in binding:
                parts.append(repr(self.values[binding[term]]))
            else:
                parts.append(str(term))
        return f"{atom.predicate}({', '.join(parts)})"

    def matches(self, rule: Rule, head_args: tuple[int, ...]) -> Iterator[dict[Variable, int]]:
        binding: dict[Variable, int] = {}
        for term, value in zip(rule.head.terms, head_args, strict=True):
            if isinstance(term, Constant):
                if self.term_id(term, binding) != value:
                    return
            elif binding.setdefault(term, value) != value:
                return
        plan = plan_rule(rule, initially_bound=frozenset(binding))
        yield from self.walk(list(plan.steps), 0, binding)

    def walk(self, steps: list, index: int, binding: dict[Variable, int]):
        self.steps += 1
        if self.steps > SEARCH_BUDGET:
            raise ZodiacError("explain: the search for a derivation exceeded its budget")
        if index == len(steps):
            yield dict(binding)
            return
        step = steps[index]
        if isinstance(step, ScanStep):
            for extended in self.match_atom(step.atom, binding):
                yield from self.walk(steps, index + 1, extended)
        elif isinstance(step, NegationStep):
            if not any(True for _ in self.match_atom(step.atom, binding)):
                yield from self.walk(steps, index + 1, binding)
        elif isinstance(step, FilterStep):
            if self.compare(step.comparison, binding):
                yield from self.walk(steps, index + 1, binding)
        elif isinstance(step, BindStep):
            value = self.bind(step.bind, binding)
            bound = binding.get(step.bind.variable)
            if value is not None and (bound is None or bound == value):
                yield from self.walk(steps, index + 1, {**binding, step.bind.variable: value})

    def match_atom(self, atom: Atom, binding: dict[Variable, int]) -> Iterator[dict]:
        bound_columns = []
        wanted = []
        for column, term in enumerate(atom.terms):
            if isinstance(term, Constant) or term in binding:
                bound_columns.append(column)
                wanted.append(self.term_id(term, binding))
        for relation in self.holders(atom.relation):
            for fact in (
                relation.tuples
                if len(relation) < 64
                else self.candidates(relation, bound_columns, wanted)
            ):
                if any(fact[c] != w for c, w in zip(bound_columns, wanted, strict=True)):
                    continue
                extended = dict(binding)
                ok = True
                for term, value in zip(atom.terms, fact, strict=True):
                    if isinstance(term, Variable) and extended.setdefault(term, value) != value:
                        ok = False
                        break
                if ok:
                    yield extended

    @staticmethod
    def candidates(relation, bound_columns: list[int], wanted: list[int]):
        if not bound_columns or len(bound_columns) == relation.arity:
            if len(bound_columns) == relation.arity:
                fact = tuple(wanted)
                return [fact] if fact in relation else []
            return relation.tuples
        index = relation.index(tuple(bound_columns))
        key = wanted[0] if len(wanted) == 1 else tuple(wanted)
        free = [c for c in range(relation.arity) if c not in bound_columns]
        rows = []
        for rest in index.get(key, ()):
            rest = (rest,) if len(free) == 1 else rest
            fact = [0] * relation.arity
            for c, w in zip(bound_columns, wanted, strict=True):
                fact[c] = w
            for c, v in zip(free, rest, strict=True):
                fact[c] = v
            rows.append(tuple(fact))
        return rows

    def value_of(self, binding: dict[Variable, int]):
        return lambda variable: self.values[binding[variable]]

    def compare(self, comparison: Comparison, binding: dict[Variable, int]) -> bool:
        try:
            return values.compare(comparison, self.value_of(binding))
        except EVAL_ERRORS:
            return False

    def bind(self, bind: Bind, binding: dict[Variable, int]) -> int | None:
        try:
            return self.terms.encode(values.evaluate(bind.expr, self.value_of(binding)))
        except EVAL_ERRORS:
            return None


def explain_fact(view: MaterialisedView, key: RelationKey, args: tuple[int, ...]) -> Derivation:
    search = _Search(view)
    height = 1
    limit = max(2, view.count()) * 2
    while height <= limit:
        found = search.prove(key, args, height)
        if found is not None:
            return found
        height *= 2
    raise ZodiacError(f"explain: found no derivation for {search.external(key, args)!r}")


__all__ = ["Derivation", "explain_fact", "Aggregate"]
