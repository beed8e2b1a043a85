"""Rules with several head atoms, as single-headed rules for the rest of the engine.

``a(X, Y), b(Y) :- body .`` derives every head from each substitution of one body. The engine
evaluates it as a rule deriving the body's substitutions (projected onto the heads' variables)
into a relation of its own, and one rule per head copying from it::

    zodiac:body:<key>(X, Y) :- body .        labelled  <key>.body
    a(X, Y) :- zodiac:body:<key>(X, Y) .     labelled  <key>.head1
    b(Y) :- zodiac:body:<key>(X, Y) .        labelled  <key>.head2

so the body is evaluated (and maintained) once, however many heads there are, by whichever
module its shape calls for (a cyclic body through a hypertree decomposition), and the copies
are cheap projections. The body relation is named after the rule's content key, so two rules
never share one, and its predicate is reserved (``language.RESERVED_PREFIX``): readers of the
materialisation never see it. The user's rule stays one rule for naming, deletion and saving;
``stats()`` names the parts after its names (``hot.body``, ``hot.head1``).
"""

from __future__ import annotations

from collections.abc import Iterable

from agent.engine.language import RESERVED_PREFIX, Atom, Constant, Rule, Variable

BODY_PREFIX = RESERVED_PREFIX + "body:"


def single_headed(rules: Iterable[Rule]) -> list[Rule]:
    """``rules`` with every multi-head rule replaced by its body rule and head rules."""
    found: list[Rule] = []
    for rule in rules:
        found.extend(split(rule) if rule.more_heads else (rule,))
    return found


def split(rule: Rule) -> list[Rule]:
    variables = dict.fromkeys(
        term for head in rule.heads for term in head.terms if isinstance(term, Variable)
    )
    terms = tuple(variables) or (Constant(True),)  # ground heads: the body only has to hold
    body_atom = Atom(f"{BODY_PREFIX}{rule.key}", terms)
    split_rules = [Rule(body_atom, rule.body, f"{rule.key}.body")]
    for number, head in enumerate(rule.heads, start=1):
        split_rules.append(Rule(head, (body_atom,), f"{rule.key}.head{number}"))
    for part in split_rules:
        # Valid because ``rule`` is (it was checked before its program was analysed), and
        # deriving a reserved predicate, which no user rule may: the Spark job evaluates
        # small hyper-nodes with a reasoner of their rules (cloud/spark/driver.py).
        part.mark_checked()
    return split_rules
