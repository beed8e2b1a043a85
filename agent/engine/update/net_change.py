"""What one update does to each fact and rule, however they arrive: the one place that rule is
written (``docs/semantics.md``, "One update").

An update is a sequence of operations (add facts, delete facts, add rules, delete rules).
For each fact the **last operation naming it decides**: added then deleted, it ends absent;
deleted then added, it ends explicit. An update given as two lists, as
``Reasoner.update(add_facts=..., delete_facts=...)`` and ``AgentState.apply`` take it, is the
deletions followed by the additions, so a fact in both ends explicit. A bundle's operations are
folded in their order.

Facts are compared by identity (``terms.fact_identity``), never as Python tuples: a class
fact written ``(C, x)``, ``(rdf:type, x, C)`` or ``<C>(x)`` in rule text is one fact, ``3`` and
``3.0`` are one value, and ``True`` is not ``1``. So a fact that arrives as a tuple and leaves,
in the same update, as rule text, a file's triple or a bundle's wire list is one fact.

Rules follow the same order: a rule added and then deleted (by its label, its content key or
its text: content modulo renaming) in one update is not added; a rule deleted and then added is
a replacement (a label may so move to another body). Deletions of rules the program does not
hold are left to the caller (``Reasoner.update`` refuses them, a bundle ignores them).

``Reasoner.update`` itself applies the same rule on term ids (deletions first, then
additions) without going through this module: its bulk loads must not pay for an identity per
fact. Callers that hold facts as values (the agent's claims, bundles, readings) use it.
"""

from __future__ import annotations

from collections.abc import Iterable

from agent.engine.errors import ZodiacError
from agent.engine.language import Atom, Rule, atom_fact
from agent.engine.program.loaders import load_program
from agent.engine.terms import fact_identity


class NetChange:
    """Operations folded into the net change they make (see the module docstring)."""

    __slots__ = ("_facts", "_rules", "_deleted_rules")

    def __init__(self) -> None:
        self._facts: dict[tuple, tuple[tuple, bool]] = {}  # identity -> (fact, added?)
        self._rules: dict[str, Rule] = {}  # rules to add, by name (rule.id)
        self._deleted_rules: dict[str, None] = {}  # names, keys or texts to delete

    # ------------------------------------------------------------------ operations
    def add_facts(self, facts: Iterable[tuple | Atom]) -> NetChange:
        for fact in facts:
            if isinstance(fact, Atom):
                fact = atom_fact(fact)
            self._facts[fact_identity(fact)] = (fact, True)
        return self

    def delete_facts(self, facts: Iterable[tuple | Atom]) -> NetChange:
        for fact in facts:
            if isinstance(fact, Atom):
                fact = atom_fact(fact)
            self._facts[fact_identity(fact)] = (fact, False)
        return self

    def add_rules(self, rules: Iterable[Rule]) -> NetChange:
        for rule in rules:
            self._rules[rule.id] = rule
        return self

    def delete_rules(self, items: Iterable[str]) -> NetChange:
        """Delete rules by name, content key or text; rules added earlier in this change that
        an item names are not added."""
        for item in items:
            for name in [name for name, rule in self._rules.items() if _names(item, rule)]:
                del self._rules[name]
            self._deleted_rules[item] = None
        return self

    # ------------------------------------------------------------------ the net change
    @property
    def facts_added(self) -> list[tuple]:
        """Facts the change leaves explicit (each once, in the spelling given last)."""
        return [fact for fact, added in self._facts.values() if added]

    @property
    def facts_deleted(self) -> list[tuple]:
        """Facts the change deletes (none of them also in `facts_added`)."""
        return [fact for fact, added in self._facts.values() if not added]

    @property
    def rules_added(self) -> list[Rule]:
        return list(self._rules.values())

    @property
    def rules_deleted(self) -> list[str]:
        """The deletion items as given (names, keys or texts), each once."""
        return list(self._deleted_rules)

    def deletes_fact(self, fact: tuple) -> bool:
        found = self._facts.get(fact_identity(fact))
        return found is not None and not found[1]

    def adds_fact(self, fact: tuple) -> bool:
        found = self._facts.get(fact_identity(fact))
        return found is not None and found[1]


def _names(item: str, rule: Rule) -> bool:
    """Whether deletion ``item`` (a name, a content key or a rule text) names ``rule``, as
    ``Reasoner.resolve_rule_names`` reads it (a text with a label names that label only)."""
    if item == rule.id or item == rule.key:
        return True
    if ":-" not in item:
        return False
    try:
        given = load_program(item).rules
    except ZodiacError:  # not rule text after all: the caller reports unknown items
        return False
    return any(g.key == rule.key and g.label in (None, rule.id) for g in given)
