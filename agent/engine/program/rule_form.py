"""A rule's syntax tree as JSON: the form in which the agent's state saves its rules.

Why not the rule's text? A restart would parse every saved rule again, and parsing is most of
what a restart of a rule-heavy state costs (a bundle of 2,000 rules: about half). Reading this
form back only builds the tree. Why not pickle? A pickle in the state file would turn write
access to that file into running code; this form can only ever build the node types below,
and `rule_from_form` checks every field of every node (types, operator and function names,
arities, the label's syntax), so a damaged form is refused with the reason instead of giving
the engine a tree the parser could never have produced.

Each node is a JSON array whose first element is a tag::

    ["R", label or null, head, [more heads], [body items]]     Rule
    ["A", predicate, [terms]]                                  Atom
    ["N", atom]                                                Negation
    ["Q", left, op, right]                                     Comparison
    ["B", expr, variable]                                      Bind
    ["G", [body items], [group variables], function, argument, result]   Aggregate
    ["V", name]                                                Variable
    ["C", value]                                               Constant
    ["O", op, left, right]                                     BinaryOp (arithmetic)
    ["F", function, [arguments]]                               Call

A constant's value is a JSON string (an IRI), number (``1`` an int, ``1.0`` a float, ``NaN``
and ``Infinity`` as Python's json writes them), ``true``/``false``, or ``["L", lexical,
datatype or null, language or null]`` for any other literal. The form is not the rule's
identity: its key is computed from the tree, as for a parsed rule.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from agent.engine.language import (
    Aggregate,
    Atom,
    BinaryOp,
    Bind,
    BodyItem,
    Call,
    Comparison,
    Constant,
    Expr,
    Literal,
    Negation,
    Rule,
    Term,
    Value,
    Variable,
    is_valid_label,
)
from agent.engine.values import (
    AGGREGATE_FUNCTIONS,
    ARITHMETIC_OPERATORS,
    COMPARISON_OPERATORS,
    FUNCTION_NAMES,
    arity_error,
)


class FormError(ValueError):
    """A saved rule form that no rule could have produced (a damaged state file)."""


# ---------------------------------------------------------------------- writing
def rule_form(rule: Rule) -> str:
    """The JSON form of ``rule`` (compact: no spaces)."""
    return json.dumps(_rule(rule), separators=(",", ":"), ensure_ascii=False)


def _rule(rule: Rule) -> list:
    return [
        "R",
        rule.label,
        _atom(rule.head),
        [_atom(atom) for atom in rule.more_heads],
        [_item(item) for item in rule.body],
    ]


def _atom(atom: Atom) -> list:
    return ["A", atom.predicate, [_expr(term) for term in atom.terms]]


def _item(item: BodyItem) -> list:
    if isinstance(item, Atom):
        return _atom(item)
    if isinstance(item, Negation):
        return ["N", _atom(item.atom)]
    if isinstance(item, Comparison):
        return ["Q", _expr(item.left), item.op, _expr(item.right)]
    if isinstance(item, Bind):
        return ["B", _expr(item.expr), _expr(item.variable)]
    return [
        "G",
        [_item(inner) for inner in item.body],
        [_expr(v) for v in item.group_by],
        item.function,
        _expr(item.argument),
        _expr(item.result),
    ]


def _expr(expr: Expr) -> list:
    if isinstance(expr, Variable):
        return ["V", expr.name]
    if isinstance(expr, Constant):
        value = expr.value
        if isinstance(value, Literal):
            return ["C", ["L", value.lexical, value.datatype, value.language]]
        return ["C", value]
    if isinstance(expr, BinaryOp):
        return ["O", expr.op, _expr(expr.left), _expr(expr.right)]
    return ["F", expr.function, [_expr(arg) for arg in expr.args]]


# ---------------------------------------------------------------------- reading
def rule_from_form(text: str) -> Rule:
    """The rule whose form is ``text``; :class:`FormError` says what is wrong with a damaged one."""
    try:
        tree = json.loads(text)
    except (ValueError, TypeError, RecursionError) as error:
        raise FormError(f"not JSON ({error})") from None
    try:
        return _read_rule(tree)
    except RecursionError:
        raise FormError("nested too deeply") from None


def _fields(node: object, tag: str, count: int) -> list:
    """The fields of ``node``, which must be a ``tag`` node with ``count`` of them."""
    if not isinstance(node, list) or not node or node[0] != tag:
        raise FormError(f"expected a {_NAMES[tag]} node ({tag!r}), found {_show(node)}")
    if len(node) != count + 1:
        raise FormError(f"a {_NAMES[tag]} node has {count} fields, found {len(node) - 1}")
    return node[1:]


def _list(node: object, what: str) -> list:
    if not isinstance(node, list):
        raise FormError(f"expected a list of {what}, found {_show(node)}")
    return node


def _name(value: object, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise FormError(f"{what} must be a non-empty string, found {_show(value)}")
    return value


def _one_of(value: object, names: tuple[str, ...], what: str) -> str:
    if value not in names:
        raise FormError(f"unknown {what} {_show(value)}")
    return value  # type: ignore[return-value]


def _read_rule(node: object) -> Rule:
    label, head, more, body = _fields(node, "R", 4)
    if label is not None and not (isinstance(label, str) and is_valid_label(label)):
        raise FormError(f"the label {_show(label)} is not a label")
    return Rule(
        _read_atom(head),
        tuple(_read_item(item) for item in _list(body, "body items")),
        label,
        tuple(_read_atom(atom) for atom in _list(more, "head atoms")),
    )


def _read_atom(node: object) -> Atom:
    predicate, terms = _fields(node, "A", 2)
    return Atom(_name(predicate, "a predicate"), tuple(map(_read_term, _list(terms, "terms"))))


def _read_item(node: object) -> BodyItem:
    tag = node[0] if isinstance(node, list) and node else None
    read = _ITEMS.get(tag)  # type: ignore[arg-type]
    if read is None:
        raise FormError(f"expected a body item, found {_show(node)}")
    return read(node)


def _read_negation(node: object) -> Negation:
    (atom,) = _fields(node, "N", 1)
    return Negation(_read_atom(atom))


def _read_comparison(node: object) -> Comparison:
    left, op, right = _fields(node, "Q", 3)
    op = _one_of(op, COMPARISON_OPERATORS, "comparison operator")
    return Comparison(_read_expr(left), op, _read_expr(right))


def _read_bind(node: object) -> Bind:
    expr, variable = _fields(node, "B", 2)
    return Bind(_read_expr(expr), _read_variable(variable))


def _read_aggregate(node: object) -> Aggregate:
    body, group, function, argument, result = _fields(node, "G", 5)
    return Aggregate(
        tuple(_read_item(item) for item in _list(body, "body items")),
        tuple(map(_read_variable, _list(group, "group variables"))),
        _one_of(function, AGGREGATE_FUNCTIONS, "aggregate function"),
        _read_term(argument),
        _read_variable(result),
    )


def _read_variable(node: object) -> Variable:
    (name,) = _fields(node, "V", 1)
    return Variable(_name(name, "a variable's name"))


def _read_term(node: object) -> Term:
    if isinstance(node, list) and node and node[0] == "C":
        return _read_constant(node)
    return _read_variable(node)


def _read_constant(node: object) -> Constant:
    (value,) = _fields(node, "C", 1)
    return Constant(_read_value(value))


def _read_value(value: object) -> Value:
    if isinstance(value, (str, bool, int, float)):
        return value
    lexical, datatype, language = _fields(value, "L", 3)
    if not isinstance(lexical, str):
        raise FormError(f"a literal's text must be a string, found {_show(lexical)}")
    for part in (datatype, language):
        if part is not None:
            _name(part, "a literal's datatype or language")
    return Literal(lexical, datatype, language)


def _read_expr(node: object) -> Expr:
    tag = node[0] if isinstance(node, list) and node else None
    if tag == "O":
        op, left, right = _fields(node, "O", 3)
        op = _one_of(op, ARITHMETIC_OPERATORS, "arithmetic operator")
        return BinaryOp(op, _read_expr(left), _read_expr(right))
    if tag == "F":
        function, args = _fields(node, "F", 2)
        function = _one_of(function, FUNCTION_NAMES, "function")
        args = _list(args, "arguments")
        problem = arity_error(function, len(args))
        if problem:
            raise FormError(problem)
        return Call(function, tuple(map(_read_expr, args)))
    return _read_term(node)


def _show(value: object) -> str:
    text = json.dumps(value) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


_ITEMS: dict[str, Callable[[object], BodyItem]] = {
    "A": _read_atom,
    "N": _read_negation,
    "Q": _read_comparison,
    "B": _read_bind,
    "G": _read_aggregate,
}
_NAMES = {
    "R": "rule",
    "A": "atom",
    "N": "negation",
    "Q": "comparison",
    "B": "bind",
    "G": "aggregate",
    "V": "variable",
    "C": "constant",
    "O": "arithmetic",
    "F": "function call",
    "L": "literal",
}
