"""The oracle: a tiny, deliberately naive evaluator of ``docs/semantics.md``.

It shares nothing with the engine but the AST (``agent/engine/language.py``), so a bug in the
engine's encoding, planning or incremental maintenance cannot hide here. Everything is done the
slowest obvious way: predicate-level stratification by iterating stratum numbers until stable,
then per stratum a naive fixpoint that re-evaluates every rule over the whole fact set with plain
dicts as substitutions. Use it on small inputs only.

Run-time errors are counted once per distinct (rule, body item, substitution) that raised,
however many naive iterations meet it. An engine evaluating items in another order may meet
other partial substitutions, so only "zero errors or not" is comparable (and only on programs
where evaluation order cannot matter: see ``tests/support/strategies.py``).

Facts are tuples ``(predicate, *args)`` in the *logical* form: a class fact is ``(C, x)``.
Values are plain Python values. ``5`` and ``5.0`` are one value because Python's ``==`` and
``hash`` agree on them, so sets of tuples already merge them. ``True == 1`` in Python, though:
comparisons and matching below keep booleans apart from numbers, but fact *sets* would still
merge ``(p, True)`` with ``(p, 1)``. We assume test data never puts a boolean and a number in the
same position of the same relation, which keeps the sets plain.
"""

from __future__ import annotations

import hashlib
import math
import operator
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from agent.engine.language import (
    RDF_TYPE,
    Aggregate,
    Atom,
    BinaryOp,
    Bind,
    Call,
    Comparison,
    Constant,
    Negation,
    Program,
    Rule,
    Variable,
    expr_variables,
    is_number,
    map_rule,
)

Subst = dict[Variable, object]
Facts = dict[tuple[str, int], list[tuple]]  # facts grouped by relation (no index beyond that)


class EvalError(Exception):
    """A run-time error: it drops the substitution being evaluated and is counted."""


@dataclass
class ReferenceResult:
    facts: set[tuple]  # explicit + derived, logical form
    errors: int  # distinct (rule, item, substitution) that raised a run-time error

    def external(self) -> set[tuple]:
        """The facts as ``Reasoner.facts()`` yields them."""
        return {to_external(fact) for fact in self.facts}


def to_external(fact: tuple) -> tuple:
    """``(C, x)`` -> ``(rdf:type, x, C)``; other facts unchanged."""
    return (RDF_TYPE, fact[1], fact[0]) if len(fact) == 2 else tuple(fact)


def from_external(fact: tuple) -> tuple:
    """``(rdf:type, x, C)`` -> ``(C, x)``; other facts unchanged."""
    return (fact[2], fact[1]) if len(fact) == 3 and fact[0] == RDF_TYPE else tuple(fact)


def same(a: object, b: object) -> bool:
    """Term identity: numbers by value (5 is 5.0), anything else by type and value (True is
    not 1, the IRI "x" is not the literal "x")."""
    if is_number(a) and is_number(b):
        return a == b
    return type(a) is type(b) and a == b


ARITHMETIC = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv}
FUNCTIONS = {
    "abs": abs,
    "min": min,
    "max": max,
    "round": round,
    "floor": math.floor,
    "ceil": math.ceil,
    "sqrt": math.sqrt,
}


def skolem(tag: object, *args: object) -> str:
    """docs/semantics.md: ``urn:zodiac:skolem:<tag>:<hash>``, the hash the first 32 hex digits
    of SHA-256 over the arguments' canonical texts joined by U+001F (kind letter, colon, value;
    integral floats written as ints, in the tag's text too)."""

    def text(value: object) -> str:
        if isinstance(value, bool):
            return f"b:{value}"
        if is_number(value):
            return f"n:{int(value)!r}" if float(value).is_integer() else f"n:{value!r}"
        if isinstance(value, str):
            return f"i:{value}"
        return f"l:{value}"

    joined = "\x1f".join(text(v) for v in (tag, *args))
    digest = hashlib.sha256(joined.encode("utf-8")).hexdigest()[:32]
    if is_number(tag) and not isinstance(tag, bool) and float(tag).is_integer():
        tag = int(tag)  # (5 and 5.0 are one term: the name is the same for both)
    lexical = tag if isinstance(tag, str) else getattr(tag, "lexical", str(tag))
    name = "".join(c if c.isascii() and (c.isalnum() or c in "_.-") else "_" for c in lexical)
    return f"urn:zodiac:skolem:{name[:40]}:{digest}"


ORDER = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge}


def evaluate_expr(expr: object, s: Subst) -> object:
    """Value of a bind or comparison operand; EvalError on anything semantics.md calls an
    error (non-number operand, division by zero, sqrt of a negative, overflow)."""
    if isinstance(expr, Variable):
        return s[expr]
    if isinstance(expr, Constant):
        return expr.value
    if isinstance(expr, Call) and expr.function == "skolem":  # any values, an IRI
        return skolem(*(evaluate_expr(arg, s) for arg in expr.args))
    if isinstance(expr, BinaryOp):
        args, fn = [expr.left, expr.right], ARITHMETIC[expr.op]
    else:
        args, fn = list(expr.args), FUNCTIONS[expr.function]
    values = [evaluate_expr(arg, s) for arg in args]
    if not all(is_number(v) for v in values):
        raise EvalError(f"not a number in {expr}")
    try:
        result = fn(*values)
    except (ArithmeticError, ValueError, TypeError) as exc:  # /0, sqrt(-1), overflow
        raise EvalError(str(exc)) from exc
    if isinstance(result, float) and not math.isfinite(result):  # 1e308 * 10 overflows to inf
        raise EvalError(f"overflow in {expr}")
    return result


def compare(left: object, op: str, right: object) -> bool:
    if op == "=":
        return same(left, right)
    if op == "!=":
        return not same(left, right)
    if (is_number(left) and is_number(right)) or (type(left) is str and type(right) is str):
        return ORDER[op](left, right)
    raise EvalError(f"cannot order {left!r} and {right!r}")


def match(atom: Atom, fact: tuple, s: Subst) -> Subst | None:
    """``s`` extended so that ``atom`` equals ``fact``, or None. ``_`` is anonymous."""
    s = dict(s)
    for term, value in zip(atom.terms, fact[1:], strict=True):
        if isinstance(term, Constant):
            if not same(term.value, value):
                return None
        elif term.name == "_":
            continue
        elif term in s:
            if not same(s[term], value):
                return None
        else:
            s[term] = value
    return s


def freeze(s: Subst) -> tuple:
    return tuple(sorted(s.items(), key=lambda item: item[0].name))


def solve(items: tuple, facts: Facts, errors: set, key: object) -> list[Subst]:
    """Every substitution satisfying ``items``: positive atoms first, in written order; then the
    other items in written order, each postponed until it is ready (a bind or comparison when
    its variables are bound, a negation when no bind is pending, so that its unbound variables
    are exactly its existential ones). An item that raises drops the substitution and records
    ``(key, item position, substitution)`` in ``errors``."""
    substs: list[Subst] = [{}]
    for atom in (item for item in items if isinstance(item, Atom)):
        substs = [
            m
            for s in substs
            for fact in facts[atom.relation]
            if (m := match(atom, fact, s)) is not None
        ]
    rest = [(i, item) for i, item in enumerate(items) if not isinstance(item, Atom)]
    return [out for s in substs if (out := finish(rest, s, facts, errors, key)) is not None]


def ready(item: object, s: Subst, pending: list) -> bool:
    if isinstance(item, Bind):
        return expr_variables(item.expr) <= s.keys()
    if isinstance(item, Comparison):
        return item.variables() <= s.keys()
    return not any(isinstance(other, Bind) for _, other in pending)  # Negation (or other)


def finish(rest: list, s: Subst, facts: Facts, errors: set, key: object) -> Subst | None:
    s, pending = dict(s), list(rest)
    while pending:
        found = [entry for entry in pending if ready(entry[1], s, pending)]
        if not found:
            raise ValueError(f"unsafe body: cannot evaluate {[str(i) for _, i in pending]}")
        pending.remove(found[0])
        position, item = found[0]
        try:
            if isinstance(item, Bind):
                if item.variable in s:
                    raise ValueError(f"bind variable {item.variable} is not fresh")
                s[item.variable] = evaluate_expr(item.expr, s)
            elif isinstance(item, Comparison):
                left, right = evaluate_expr(item.left, s), evaluate_expr(item.right, s)
                if not compare(left, item.op, right):
                    return None
            elif isinstance(item, Negation):
                if any(match(item.atom, f, s) is not None for f in facts[item.atom.relation]):
                    return None
            else:
                raise ValueError(f"unexpected body item here: {item}")
        except EvalError:
            errors.add((key, position, freeze(s)))
            return None
    return s


def aggregate_value(function: str, values: list[object]) -> object | None:
    """``values`` holds the argument of each distinct substitution of one group."""
    if function == "count":
        return len(values)
    numbers = [v for v in values if is_number(v)]
    if not numbers:
        return None  # a group left with no number produces no fact
    if function == "sum":
        return sum(numbers)
    if function == "min":
        return min(numbers)
    if function == "max":
        return max(numbers)
    if function == "avg":  # over the numbers that were not skipped
        return sum(numbers) / len(numbers)
    ordered, half = sorted(numbers), len(numbers) // 2  # med
    return ordered[half] if len(numbers) % 2 else (ordered[half - 1] + ordered[half]) / 2


def fire(rule: Rule, key: int, facts: Facts, errors: set, heads=None) -> set[tuple]:
    """The facts of the rule's ``heads`` (default: all of them) that it derives from ``facts``
    (all of them, not just new ones)."""
    agg = rule.aggregate()
    if agg is None:
        substs = solve(rule.body, facts, errors, key)
    else:
        distinct = {freeze(s): s for s in solve(agg.body, facts, errors, (key, "body"))}
        groups: dict[tuple, list[tuple[Subst, object]]] = defaultdict(list)
        for s in distinct.values():
            value = evaluate_expr(agg.argument, s)
            groups[tuple(s[v] for v in agg.group_by)].append((s, value))
        rest = [(i, item) for i, item in enumerate(rule.body) if not isinstance(item, Aggregate)]
        substs = []
        for group, members in groups.items():
            for s, value in members:  # non-numbers are skipped, and counted as errors
                if agg.function != "count" and not is_number(value):
                    errors.add(((key, "skipped"), -1, freeze(s)))
            result = aggregate_value(agg.function, [value for _, value in members])
            if result is not None:
                s = dict(zip(agg.group_by, group, strict=True)) | {agg.result: result}
                if (out := finish(rest, s, facts, errors, key)) is not None:
                    substs.append(out)
    return {ground(head, s) for head in heads or rule.heads for s in substs}


def ground(atom: Atom, s: Subst) -> tuple:
    """The fact ``atom`` becomes under ``s``."""
    return (atom.predicate, *(s[t] if isinstance(t, Variable) else t.value for t in atom.terms))


def stratify(program: Program, equality: bool = False) -> dict[tuple[str, int], int]:
    """Stratum of every relation: a head is at least as high as what it reads positively and
    strictly higher than what it reads under negation or in an aggregate. Raise ValueError when
    the numbers keep growing past the number of relations (a cycle through negation).

    With ``equality``, a rule that sees individuals (``sees_individuals``) also reads
    owl:sameAs as if under negation: it needs the classes complete."""
    relations = {head.relation for rule in program.rules for head in rule.heads}
    relations |= {rel for rule in program.rules for rel, _ in rule.body_relations()}
    if equality:
        relations.add(SAME_AS)
    stratum = dict.fromkeys(relations, 0)
    changed = True
    while changed:
        changed = False
        for rule in program.rules:
            reads = rule.body_relations()
            if equality and sees_individuals(rule):
                reads = [*reads, (SAME_AS, "negative")]
            for head in (h.relation for h in rule.heads):
                for rel, how in reads:
                    need = stratum[rel] + (0 if how == "positive" else 1)
                    if stratum[head] < need:
                        if need > len(relations):
                            raise ValueError(
                                f"not stratifiable: {head} depends on itself "
                                f"through negation or aggregation"
                            )
                        stratum[head], changed = need, True
    return stratum


def evaluate(program: Program, facts: Iterable[tuple], equality: bool = False) -> ReferenceResult:
    """Materialise ``program`` over ``facts`` (logical form); see the module docstring. With
    ``equality``, owl:sameAs is a congruence (see ``equality_axioms``)."""
    if equality:
        return evaluate_with_equality(program, facts)
    heads = [rule.head.relation for rule in program.rules]
    for rule in program.rules:
        if rule.aggregate() and heads.count(rule.head.relation) > 1:
            raise ValueError(f"{rule.head.relation} has an aggregate rule and another rule")
    strata = stratify(program)
    known = {tuple(fact) for fact in facts}
    known |= {ground(atom, {}) for atom in program.facts}
    errors: set = set()
    levels = {strata[head.relation] for rule in program.rules for head in rule.heads}
    for level in sorted(levels):
        # A rule with several heads fires in the stratum of each head, for that head only.
        rules = [
            (i, r, [h for h in r.heads if strata[h.relation] == level])
            for i, r in enumerate(program.rules)
        ]
        rules = [(i, r, heads) for i, r, heads in rules if heads]
        while True:
            by_relation: Facts = defaultdict(list)
            for fact in known:
                by_relation[(fact[0], len(fact) - 1)].append(fact)
            new = set().union(
                *(fire(rule, i, by_relation, errors, heads) for i, rule, heads in rules)
            )
            if new <= known:
                break
            known |= new
    return ReferenceResult(facts=known, errors=len(errors))


# --- equality (docs/semantics.md, "Equality") ---------------------------------------------------
# owl:sameAs axiomatised as plain rules: symmetric, transitive, reflexive on the terms an equality
# names, and every relation closed under replacing an argument by an equal term. A rule with
# negation, an aggregate, a comparison or a bind sees individuals: it is evaluated over the
# facts with every term replaced by its class's smallest value (numbers by value, then
# booleans, other literals, IRIs), and needs the classes complete (``stratify``).

OWL_SAME_AS = "http://www.w3.org/2002/07/owl#sameAs"
SAME_AS = (OWL_SAME_AS, 2)


def sees_individuals(rule: Rule) -> bool:
    return any(not isinstance(item, Atom) for item in rule.body)


def value_key(value: object) -> tuple:
    if isinstance(value, bool):
        return (1, value)
    if is_number(value):
        return (0, value)
    if isinstance(value, str):
        return (3, value)
    return (2, value.lexical, value.datatype or "", value.language or "")


def equality_axioms(relations: Iterable[tuple[str, int]]) -> list[Rule]:
    x, y, z = Variable("X"), Variable("Y"), Variable("Z")

    def same(a: Variable, b: Variable) -> Atom:
        return Atom(OWL_SAME_AS, (a, b))

    axioms = [
        Rule(same(y, x), (same(x, y),)),
        Rule(same(x, z), (same(x, y), same(y, z))),
        Rule(same(x, x), (same(x, y),)),
    ]
    for name, arity in sorted(relations):
        if (name, arity) == SAME_AS:
            continue
        variables = tuple(Variable(f"A{i}") for i in range(arity))
        for position in range(arity):
            other = Variable("B")
            replaced = variables[:position] + (other,) + variables[position + 1 :]
            body = (Atom(name, variables), same(variables[position], other))
            axioms.append(Rule(Atom(name, replaced), body))
    return axioms


def representatives(facts: set[tuple]) -> dict[object, object]:
    """Each term named by an equality -> the smallest term of its class."""
    parent: dict[object, object] = {}

    def find(term: object) -> object:
        while parent.setdefault(term, term) != term:
            term = parent[term]
        return term

    for fact in facts:
        if fact[0] == OWL_SAME_AS and len(fact) == 3:
            a, b = find(fact[1]), find(fact[2])
            if a != b:
                low, high = sorted((a, b), key=value_key)
                parent[high] = low
    return {term: find(term) for term in parent}


def canonical_rule(rule: Rule, rep: dict) -> Rule:
    def canon(term):
        if isinstance(term, Constant) and term.value in rep:
            return Constant(rep[term.value])
        return term

    return map_rule(rule, canon)


def evaluate_with_equality(program: Program, facts: Iterable[tuple]) -> ReferenceResult:
    known = {tuple(fact) for fact in facts}
    known |= {ground(atom, {}) for atom in program.facts}
    relations = {(fact[0], len(fact) - 1) for fact in known}
    relations |= {head.relation for rule in program.rules for head in rule.heads}
    relations |= {rel for rule in program.rules for rel, _ in rule.body_relations()}
    rules = [*program.rules, *equality_axioms(relations)]
    strata = stratify(Program(rules=tuple(rules)), equality=True)
    errors: set = set()
    levels = {strata[head.relation] for rule in rules for head in rule.heads}
    for level in sorted(levels):
        chosen = [
            (i, r, [h for h in r.heads if strata[h.relation] == level]) for i, r in enumerate(rules)
        ]
        chosen = [(i, r, heads) for i, r, heads in chosen if heads]
        while True:
            by_relation: Facts = defaultdict(list)
            for fact in known:
                by_relation[(fact[0], len(fact) - 1)].append(fact)
            quotient: Facts | None = None
            new: set[tuple] = set()
            for i, rule, heads in chosen:
                if sees_individuals(rule):
                    if quotient is None:
                        rep = representatives(known)
                        quotient = defaultdict(list)
                        for fact in {(f[0], *(rep.get(v, v) for v in f[1:])) for f in known}:
                            quotient[(fact[0], len(fact) - 1)].append(fact)
                    canon = canonical_rule(rule, rep)
                    wanted = [h for h in canon.heads if strata[h.relation] == level]
                    new |= fire(canon, i, quotient, errors, wanted)
                else:
                    new |= fire(rule, i, by_relation, errors, heads)
            if new <= known:
                break
            known |= new
    return ReferenceResult(facts=known, errors=len(errors))
