"""Static checks on rules: safety, binds, aggregates, labels (see ``docs/semantics.md``).

The parser calls :func:`check_rule` for every rule it reads, so rule text with an unsafe rule
never becomes a :class:`~agent.engine.language.Program`; the engine calls it for every rule an
update adds, which covers rules handed over as AST objects. Both paths therefore refuse exactly
the same rules with exactly the same messages. A rule remembers that it passed
(``Rule.checked``), so a parsed rule is not checked a second time by the engine.

Safety, in short: a variable is *bound* when a positive atom of the (top-level) body contains
it, or when a ``bind`` computes it from bound variables (binds may be written in any order).
Every variable of the head, of a comparison and of a bind expression must be bound, and so must
every variable of a negated atom that also occurs somewhere else in the rule (the others are
existential). Aggregate rules are checked in two scopes: the aggregate body on its own, and the
rule around it, where only the group-by variables, the result and bind variables exist.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from agent.engine.errors import NotTextError, RuleError, UnsafeRuleError, check_text
from agent.engine.language import (
    RESERVED_PREFIX,
    Aggregate,
    Atom,
    BinaryOp,
    Bind,
    BodyItem,
    Call,
    Comparison,
    Constant,
    Expr,
    Negation,
    Program,
    Rule,
    Variable,
)
from agent.engine.terms import check_value_text
from agent.engine.values import (
    AGGREGATE_FUNCTIONS,
    ARITHMETIC_OPERATORS,
    COMPARISON_OPERATORS,
    FUNCTION_NAMES,
    arity_error,
)

__all__ = ["check_label", "check_program", "check_rule"]

Location = str | Callable[[], str] | None
_NOT_BOUND = "not bound by a positive atom"
# Planning a body costs about the square of its size (each step ranks every remaining atom):
# 500 items plan and compile in a fraction of a second; 10,000 took minutes.
MAX_BODY_ITEMS = 500


class _Problem(Exception):
    """Raised inside this module; :func:`check_rule` turns it into the public error class,
    adding the rule text once instead of threading it through every helper."""

    def __init__(self, error: type[RuleError], message: str):
        super().__init__(message)
        self.error = error
        self.message = message


def check_rule(rule: Rule, *, location: Location = None) -> None:
    """Refuse a rule that cannot be evaluated; return None when it is fine.

    ``location`` (``file:line:column``, or a function returning it, called only on error since
    counting lines is not free) is prepended to the message when the rule comes from text, so
    the user can find it.
    """
    if rule.checked:  # immutable, and checked once already (by the parser, say)
        return
    try:
        _check(rule)
    except _Problem as problem:
        raise problem.error(_prefix(location) + problem.message, rule=str(rule)) from None
    rule.mark_checked()


def check_saved_rule(rule: Rule) -> None:
    """Validate, once, a rule a restart took from its saved row on the word of the row's
    checksum (`Rule.mark_saved`), before it is first compiled: the checksum catches damage,
    not one forged over a rule made unsafe, which would otherwise fail deep in the compiler.
    The error names the saved rule."""
    if not rule.unverified:
        return
    try:
        _check(rule)
    except _Problem as problem:
        raise problem.error(f"saved rule {rule.id}: {problem.message}", rule=str(rule)) from None
    rule.mark_verified()


def _check(rule: Rule) -> None:
    _check_shape(rule)
    aggregate = _single_aggregate(rule)
    if aggregate is None:
        _check_plain_rule(rule)
    else:
        _check_aggregate_rule(rule, aggregate)


def check_label(labels: dict[str, Rule], rule: Rule, *, location: Location = None) -> None:
    """Record ``rule``'s label in ``labels``; refuse a label already used by a different rule.

    Repeating the very same rule under the same label is harmless (it is one rule), so only a
    label naming two different rules is an error: deleting by label would be ambiguous.
    """
    if not rule.label:
        return
    previous = labels.setdefault(rule.label, rule)
    if previous is not rule and previous.key != rule.key:
        raise RuleError(
            f"{_prefix(location)}duplicate rule label '{rule.label}': already used by {previous}",
            rule=str(rule),
        )


def check_program(program: Program) -> None:
    """Check every rule, duplicate labels, and that every fact is ground."""
    labels: dict[str, Rule] = {}
    for rule in program.rules:
        check_rule(rule)
        check_label(labels, rule)
    for fact in program.facts:
        if not fact.is_ground():
            names = ", ".join(v.name for v in _ordered_atom_variables(fact))
            raise UnsafeRuleError(f"a fact must be ground, but {fact} has variables {names}")


def _prefix(location: Location) -> str:
    if callable(location):
        location = location()
    return f"{location}: " if location else ""


# --- well-formedness (matters for AST rules built in code; the parser never produces these) ---


def _check_shape(rule: Rule) -> None:
    for head in rule.heads:
        if not isinstance(head, Atom):
            raise _Problem(RuleError, f"the head must be an atom, not {head!r}")
        _check_atom(head)
        if head.predicate.startswith(RESERVED_PREFIX):
            raise _Problem(
                RuleError, f"predicates starting with {RESERVED_PREFIX!r} are the engine's own"
            )
    if rule.more_heads and any(isinstance(item, Aggregate) for item in rule.body):
        raise _Problem(RuleError, "an aggregate rule has one head atom")
    if not rule.body:
        raise _Problem(
            RuleError, "a rule needs a non-empty body; write a ground atom as a fact instead"
        )
    size = sum(1 + len(item.body) if isinstance(item, Aggregate) else 1 for item in rule.body)
    if size > MAX_BODY_ITEMS:
        raise _Problem(
            RuleError,
            f"a rule body has at most {MAX_BODY_ITEMS} items (atoms, comparisons, binds), this "
            f"one has {size}: split it into several rules",
        )
    for item in rule.body:
        _check_item(item, inside_aggregate=False)


def _check_item(item: BodyItem, *, inside_aggregate: bool) -> None:
    if isinstance(item, Atom):
        _check_atom(item)
    elif isinstance(item, Negation):
        _check_atom(item.atom)
    elif isinstance(item, Comparison):
        if item.op not in COMPARISON_OPERATORS:
            raise _Problem(RuleError, f"unknown comparison operator {item.op!r}")
        _check_expr(item.left)
        _check_expr(item.right)
    elif isinstance(item, Bind):
        _check_expr(item.expr)
    elif isinstance(item, Aggregate):
        if inside_aggregate:
            raise _Problem(RuleError, "an aggregate cannot contain another aggregate")
        _check_aggregate_shape(item)
    else:
        raise _Problem(RuleError, f"not a body item: {item!r}")


def _check_aggregate_shape(aggregate: Aggregate) -> None:
    if aggregate.function not in AGGREGATE_FUNCTIONS:
        raise _Problem(
            RuleError,
            f"unknown aggregate function {aggregate.function!r}; "
            f"expected one of {', '.join(AGGREGATE_FUNCTIONS)}",
        )
    if not aggregate.body:
        raise _Problem(RuleError, "an aggregate needs a non-empty body")
    if isinstance(aggregate.argument, Constant):
        _check_constant(aggregate.argument)
    for inner in aggregate.body:
        _check_item(inner, inside_aggregate=True)


def _check_atom(atom: Atom) -> None:
    _check_text(atom.predicate)
    for term in atom.terms:
        if isinstance(term, Constant):
            _check_constant(term)
        elif not isinstance(term, Variable):
            raise _Problem(RuleError, f"atom {atom} has a term that is not a term: {term!r}")


def _check_constant(constant: Constant) -> None:
    """IRIs and literals must be Unicode text (errors.NotTextError), or no state file,
    bundle or output could hold them."""
    try:
        check_value_text(constant.value)
    except NotTextError as error:
        raise _Problem(RuleError, str(error)) from None


def _check_text(value: str) -> None:
    try:
        check_text(value)
    except NotTextError as error:
        raise _Problem(RuleError, str(error)) from None


def _check_expr(expr: Expr) -> None:
    if isinstance(expr, BinaryOp):
        if expr.op not in ARITHMETIC_OPERATORS:
            raise _Problem(RuleError, f"unknown arithmetic operator {expr.op!r}")
        _check_expr(expr.left)
        _check_expr(expr.right)
    elif isinstance(expr, Call):
        if expr.function not in FUNCTION_NAMES:
            raise _Problem(RuleError, f"unknown function {expr.function!r}")
        problem = arity_error(expr.function, len(expr.args))
        if problem:
            raise _Problem(RuleError, problem)
        for arg in expr.args:
            _check_expr(arg)
    elif isinstance(expr, Constant):
        _check_constant(expr)
    elif not isinstance(expr, Variable):
        raise _Problem(RuleError, f"not an expression: {expr!r}")


def _single_aggregate(rule: Rule) -> Aggregate | None:
    aggregates = [item for item in rule.body if isinstance(item, Aggregate)]
    if len(aggregates) > 1:
        raise _Problem(RuleError, "a rule may contain at most one aggregate")
    return aggregates[0] if aggregates else None


# --- safety ---


def _check_plain_rule(rule: Rule) -> None:
    bound = _bound_variables(rule.body, seed=set(), seed_what="")
    in_heads = [v for head in rule.heads for v in _ordered_atom_variables(head)]
    unsafe = [("the head", _unbound(list(dict.fromkeys(in_heads)), bound))]
    unsafe += _unsafe_body_items(rule.body, bound, extra=in_heads)
    _raise_unsafe(unsafe, _NOT_BOUND)


def _check_aggregate_rule(rule: Rule, aggregate: Aggregate) -> None:
    for item in rule.body:
        if isinstance(item, (Atom, Negation)):
            raise _Problem(
                RuleError,
                f"an aggregate rule may contain, besides the aggregate, only comparisons and "
                f"binds: move {item} inside the aggregate body",
            )
    _check_aggregate_body(aggregate)

    scope = list(aggregate.group_by) + [aggregate.result]
    others = [item for item in rule.body if item is not aggregate]
    bound = _bound_variables(others, seed=set(scope), seed_what="the aggregate")
    unsafe = [("the head", _unbound(_ordered_atom_variables(rule.head), bound))]
    unsafe += _unsafe_body_items(others, bound, extra=[])
    _raise_unsafe(unsafe, "not a group-by variable, the aggregate result or a bind variable")


def _check_aggregate_body(aggregate: Aggregate) -> None:
    body = aggregate.body
    inner = _ordered_items_variables(body)
    if aggregate.result in inner or aggregate.result in aggregate.group_by:
        raise _Problem(
            RuleError,
            f"the aggregate result variable {aggregate.result} must be fresh, "
            f"but it already occurs in the aggregate",
        )
    if aggregate.argument == aggregate.result:
        raise _Problem(
            RuleError,
            f"the aggregate result variable {aggregate.result} cannot be its own argument",
        )
    bound = _bound_variables(body, seed=set(), seed_what="")
    unsafe = [("the group-by (on)", _unbound(aggregate.group_by, bound))]
    if isinstance(aggregate.argument, Variable):
        unsafe.append(("the aggregate argument", _unbound([aggregate.argument], bound)))
    unsafe += _unsafe_body_items(body, bound, extra=[])
    _raise_unsafe(unsafe, _NOT_BOUND + " of the aggregate body", scope="aggregate")


def _bound_variables(
    items: Sequence[BodyItem], *, seed: set[Variable], seed_what: str
) -> set[Variable]:
    """Variables of positive atoms (plus ``seed``), closed under binds whose expression only
    reads bound variables. Refuses a bind of an already bound variable."""
    bound = set(seed)
    for item in items:
        if isinstance(item, Atom):
            bound |= item.variables()
    binds = [item for item in items if isinstance(item, Bind)]
    seen: set[Variable] = set()
    for bind in binds:
        if bind.variable in bound or bind.variable in seen:
            if bind.variable in seen:
                by = "two binds"
            elif bind.variable in seed:
                by = seed_what + " and a bind"
            else:
                by = "a positive atom and a bind"
            raise _Problem(RuleError, f"variable {bind.variable} is bound twice (by {by}): {bind}")
        seen.add(bind.variable)
    pending = binds
    while pending:
        ready = [b for b in pending if _expr_variables(b.expr) <= bound]
        if not ready:
            break
        bound.update(b.variable for b in ready)
        pending = [b for b in pending if b not in ready]
    return bound


def _unsafe_body_items(
    items: Sequence[BodyItem], bound: set[Variable], *, extra: Sequence[Variable]
) -> list[tuple[str, list[Variable]]]:
    """Unbound variables of comparisons, bind expressions and non-existential negated atoms.

    ``extra`` are variables occurring outside ``items`` (the head), which make a negated
    variable non-existential."""
    found: list[tuple[str, list[Variable]]] = []
    for index, item in enumerate(items):
        if isinstance(item, Comparison):
            variables = _ordered_expr_variables(item.left) + _ordered_expr_variables(item.right)
            found.append(("a comparison", _unbound(variables, bound)))
        elif isinstance(item, Bind):
            found.append(("a bind expression", _unbound(_ordered_expr_variables(item.expr), bound)))
        elif isinstance(item, Negation):
            elsewhere = set(extra) | set(_ordered_items_variables(items[:index]))
            elsewhere |= set(_ordered_items_variables(items[index + 1 :]))
            shared = [v for v in _ordered_atom_variables(item.atom) if v in elsewhere]
            found.append(("a negated atom", _unbound(shared, bound)))
    return found


def _raise_unsafe(
    unsafe: list[tuple[str, list[Variable]]], why: str, *, scope: str = "rule"
) -> None:
    by_role: dict[str, list[Variable]] = {}
    for role, variables in unsafe:
        by_role.setdefault(role, []).extend(variables)
    parts = []
    for role, variables in by_role.items():
        names = list(dict.fromkeys(v.name for v in variables))
        if len(names) == 1:
            parts.append(f"variable {names[0]} of {role} is {why}")
        elif names:
            parts.append(f"variables {', '.join(names)} of {role} are {why}")
    if parts:
        raise _Problem(UnsafeRuleError, f"unsafe {scope}: " + "; ".join(parts))


# --- variable helpers (ordered, so messages list variables in the order they were written) ---


def _unbound(variables: Iterable[Variable], bound: set[Variable]) -> list[Variable]:
    return [v for v in variables if v not in bound]


def _ordered_atom_variables(atom: Atom) -> list[Variable]:
    return [t for t in atom.terms if isinstance(t, Variable)]


def _ordered_expr_variables(expr: Expr) -> list[Variable]:
    if isinstance(expr, Variable):
        return [expr]
    if isinstance(expr, BinaryOp):
        return _ordered_expr_variables(expr.left) + _ordered_expr_variables(expr.right)
    if isinstance(expr, Call):
        return [v for arg in expr.args for v in _ordered_expr_variables(arg)]
    return []


def _expr_variables(expr: Expr) -> set[Variable]:
    return set(_ordered_expr_variables(expr))


def _ordered_items_variables(items: Sequence[BodyItem]) -> list[Variable]:
    found: list[Variable] = []
    for item in items:
        if isinstance(item, Atom):
            found += _ordered_atom_variables(item)
        elif isinstance(item, Negation):
            found += _ordered_atom_variables(item.atom)
        elif isinstance(item, Comparison):
            found += _ordered_expr_variables(item.left) + _ordered_expr_variables(item.right)
        elif isinstance(item, Bind):
            found += _ordered_expr_variables(item.expr) + [item.variable]
        elif isinstance(item, Aggregate):
            found += _ordered_items_variables(item.body) + list(item.group_by)
            if isinstance(item.argument, Variable):
                found.append(item.argument)
            found.append(item.result)
    return found
