"""Runs one rule over a hyper-node's bag: plan, compile (cached), call.

The executor is the only place that joins the logical plan with physical storage: it looks up,
for every body atom, the relations that hold its facts in the hyper-node's DataStoreBag, asks the
planner for an order (using those relations' sizes), compiles the plan once per
(rule, variant, detail, delta position, number of stores per atom; ``CacheKey``) and calls the
compiled function.
"""

from __future__ import annotations

import enum
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

from agent.engine.budget import NO_GUARD, BudgetGuard
from agent.engine.language import Atom, Negation, Rule, Term
from agent.engine.plan.compiler import CompiledRule, RuleCompiler
from agent.engine.plan.planner import Plan, plan_rule
from agent.engine.plan.rewrites import Node, Shape
from agent.engine.program.validation import check_saved_rule
from agent.engine.storage.store import DataStoreBag, Relation
from agent.engine.terms import TermDictionary


class Variant(enum.Enum):
    """Which form of a rule a compiled plan evaluates. Modules evaluate a rule in several
    forms besides the rule itself (see ``modules/deltas.py``); each is cached apart, under the
    rule's content key, so forgetting a rule forgets every form of it."""

    RULE = "rule"  # the rule as written
    OVERDELETE = "overdelete"  # over the old state, negations dropped (overdeletion seeds)
    ENABLE = "enable"  # a negated atom matched against facts deleted from its relation
    CHECK = "check"  # head bound: does a candidate still have a derivation?
    REMOVED = "removed"  # a deleted rule over the old state (what it used to derive)
    AGGREGATE_BODY = "aggregate body"  # an aggregate's substitutions
    AGGREGATE_GROUPS = "aggregate groups"  # the substitutions of some groups only
    AGGREGATE_HEAD = "aggregate head"  # the head built from aggregated rows


CacheKey = tuple[str, Variant, Hashable, int | None, tuple[int, ...]]


@dataclass(frozen=True)
class CompiledEntry:
    """One compiled form of a rule: what it evaluates (``variant``, ``delta_position``), the
    logical plan, the node a rewrite chose (its ``shape`` and description) and the source."""

    function: CompiledRule
    plan: Plan
    node: Node
    shape: Shape
    source: str
    variant: Variant
    delta_position: int | None

    def describe(self) -> str:
        """The plan as a reader wants it: which form, which delta, which shape, which steps."""
        delta = "no delta" if self.delta_position is None else f"Δ at {self.delta_position}"
        return f"{self.plan.rule.id} [{self.variant.value}, {delta}] {self.node.describe()}"


class ErrorCount:
    """The run-time errors of compiled rules (a failing bind or comparison, docs/semantics.md):
    one mutable cell every compiled function of an executor is handed and adds to
    (``ERR.count += 1``), since an int passed in could not be changed in place."""

    __slots__ = ("count",)

    def __init__(self) -> None:
        self.count = 0


@dataclass
class Executor:
    terms: TermDictionary
    errors: ErrorCount = field(default_factory=ErrorCount)
    guard: BudgetGuard = NO_GUARD  # the running update's budget (set by the update driver)
    _compiler: RuleCompiler | None = None
    _cache: dict[CacheKey, CompiledEntry] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._compiler = RuleCompiler(self.terms)

    def sources(self, body: Sequence, bag: DataStoreBag) -> list[list[Relation]]:
        """For each body position, the non-empty relations an atom (or negated atom) reads.

        Empty relations are left out so compiled code does not loop over them; the compile
        cache is keyed by these counts, so a relation that fills up later gets its own plan."""
        found: list[list[Relation]] = []
        for item in body:
            if isinstance(item, Atom):
                found.append([r for r in bag.relations(item.relation) if len(r)])
            elif isinstance(item, Negation):
                found.append([r for r in bag.relations(item.atom.relation) if len(r)])
            else:
                found.append([])
        return found

    def run(
        self,
        rule: Rule,
        bag: DataStoreBag,
        out: set,
        delta_position: int | None = None,
        delta: set | None = None,
        *,
        body: Sequence | None = None,
        head_terms: Sequence[Term] | None = None,
        sources: list[list[Relation]] | None = None,
        variant: Variant = Variant.RULE,
        detail: Hashable = None,
        exists: bool = False,
    ) -> None:
        """Evaluate ``rule`` (or ``body`` with ``head_terms``: the rule in another form, named
        by ``variant`` and ``detail``), adding head tuples to ``out``."""
        items = rule.body if body is None else body
        if sources is None:
            sources = self.sources(items, bag)
        counts = tuple(len(s) for s in sources)
        key = (rule.key, variant, detail, delta_position, counts)
        entry = self._cache.get(key)
        if entry is None:
            entry = self.compile(rule, items, sources, delta_position, head_terms, key, exists)
        self.guard.tick()
        entry.function(sources, delta, out, self.errors, self.guard)

    def compile(
        self,
        rule: Rule,
        items: Sequence,
        sources: list[list[Relation]],
        delta_position: int | None,
        head_terms: Sequence[Term] | None,
        key: CacheKey,
        exists: bool = False,
    ) -> CompiledEntry:
        if rule.unverified:  # (read back from a saved state: see check_saved_rule)
            check_saved_rule(rule)

        def size_of(position: int) -> int:
            return sum(len(r) for r in sources[position])

        plan = plan_rule(rule, items, delta_position, size_of)
        counts = {i: len(s) for i, s in enumerate(sources)}
        variant = key[1]
        delta = "" if delta_position is None else f" delta {delta_position}"
        name = f"{rule.id} {variant.value}{delta}"
        compiled = self._compiler.compile(plan, counts, head_terms, name=name, exists=exists)
        entry = CompiledEntry(
            compiled.function,
            plan,
            compiled.node,
            compiled.shape,
            compiled.source,
            variant,
            delta_position,
        )
        self._cache[key] = entry
        return entry

    def forget(self, rule_keys: set[str] | None = None) -> None:
        """Drop compiled plans (all, or every variant of some rules, by content key): plans
        embed store counts and size-based orders, so they are rebuilt after the program
        changes."""
        if rule_keys is None:
            self._cache.clear()
            return
        for key in [k for k in self._cache if k[0] in rule_keys]:
            del self._cache[key]

    def plans(self, rule_key: str) -> list[CompiledEntry]:
        """The compiled plans of one rule (by content key), every variant."""
        return [entry for key, entry in self._cache.items() if key[0] == rule_key]

    @property
    def error_count(self) -> int:
        return self.errors.count
