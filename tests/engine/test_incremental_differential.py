"""Incremental differential tests: random interleavings of fact and rule updates.

Two hypothesis state machines drive one :class:`Reasoner` through ``add_facts``,
``delete_facts``, ``add_rules``, ``delete_rules`` (by id and by rule text), rule deletions that
must fail (``UnknownRuleError``, nothing changed) and, once the reasoner offers it, the mixed
``update(add_rules=, delete_rules=, add_facts=, delete_facts=)``. Each machine keeps its own model
of the current rules and explicit facts (the oracle state, never read back from the engine), and
after every step checks that the engine's materialisation equals

(1) the reference evaluator (``tests/support/reference.py``) on the model's rules and explicit
facts, (2) a freshly built reasoner loaded with the same rules and facts,

The engine under test decomposes every cyclic rule it can (``decompositions="always"``, so the
pools' cyclic motifs run through the hypertree module); the fresh reasoner of (2) never does.

and that the engine's hyper-nodes are exactly the strongly connected components of the current
rules (hyper-nodes merge on rule insertion and split on deletion).

* :class:`RulePoolMachine` draws a rule pool (``tests/support/strategies.py``: random programs, and
  motif pools built for incremental maintenance: mutual recursion, hyper-nodes one rule merges,
  a predicate derived in several hyper-nodes, negation and aggregates over recursive relations,
  symmetric-transitive closures), starts with a random subset of it and moves rules in and out.
* :class:`ClosureMachine` runs RS1/RS2/RS3-like closure programs and a transitive closure over
  5-8 nodes with many edge insertions and deletions (paths, cycles, cut nodes), so connected
  components merge and split, plus occasional rule toggles.

Every step is logged with ``note()`` (printed on failure, with the pool). Coverage of the cases
that matter is recorded with ``event()`` (``pytest --hypothesis-show-statistics``) and counted in
``COVERAGE``. Plain regression tests of tricky sequences follow the machines.

Budget: ``max_examples`` is 60% of the active profile's (60 in CI, 600 with
``HYPOTHESIS_PROFILE=thorough``), 25 steps per run (30 for the closure machine).
"""

from __future__ import annotations

import shutil
import tempfile
from collections import Counter, defaultdict
from collections.abc import Iterable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, note, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from agent.engine import RDF_TYPE, Reasoner, UnknownRuleError
from agent.engine.errors import RuleError
from agent.engine.language import Aggregate, Atom, Negation, Program, Rule, Variable, map_rule
from agent.engine.program.parser import parse_program
from agent.state.agent_state import AgentState
from tests.support.fact_paths import PATHS, can_go, spelt, text_of, write_fact_file
from tests.support.reference import evaluate, fire, from_external, to_external
from tests.support.strategies import (
    CLOSURE_DERIVED_EDGES,
    CLOSURE_EDGES,
    TEMPERATURES,
    closure_pools,
    incremental_programs,
    labelled,
    pool_facts,
)

MACHINE_SETTINGS = settings(
    max_examples=max(1, settings.default.max_examples * 6 // 10),  # 60 in CI, 600 thorough
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.filter_too_much,
    ],
)
CLOSURE_SETTINGS = settings(MACHINE_SETTINGS, stateful_step_count=30)
PERSISTENT_SETTINGS = settings(
    MACHINE_SETTINGS, max_examples=max(1, settings.default.max_examples * 3 // 10)
)

COVERAGE: Counter[str] = Counter()  # every event() of the machines, counted over all runs


def record(what: str) -> None:
    COVERAGE[what] += 1
    event(what)


# ---------------------------------------------------------------------------------- helpers
def external(facts: Iterable[tuple]) -> list[tuple]:
    return [to_external(fact) for fact in facts]


def show(facts: Iterable[tuple]) -> str:
    return ", ".join(sorted(f"{f[0]}({', '.join(map(repr, f[1:]))})" for f in facts)) or "-"


def engine_facts(reasoner: Reasoner) -> set[tuple]:
    listed = [tuple(fact) for fact in reasoner.facts()]
    found = set(listed)
    assert len(found) == len(listed), (
        f"facts() yields some facts twice: {sorted(map(repr, (Counter(listed) - Counter(found))))}"
    )
    return found


def assert_same(actual: set[tuple], wanted: set[tuple], how: str) -> None:
    assert actual == wanted, (
        f"{how}: engine is missing {sorted(map(repr, wanted - actual))}, "
        f"has extra {sorted(map(repr, actual - wanted))}"
    )


def has_negation(rule: Rule) -> bool:
    items = list(rule.body)
    for item in rule.body:
        if isinstance(item, Aggregate):
            items += item.body
    return any(isinstance(item, Negation) for item in items)


def hyper_nodes(rules: Iterable[Rule]) -> dict[frozenset[str], bool]:
    """Strongly connected components of the rule dependency graph (rule i -> rule j when j reads
    i's head relation, in any way), each with whether it is recursive, as sets of rule names.
    Rules with one content (``Rule.key``) are one rule of the program, known by all its names.
    Computed here, apart from the engine's ``dependency.py``."""
    names: dict[str, set[str]] = defaultdict(set)
    unique: dict[str, Rule] = {}
    for r in rules:
        names[r.key].add(r.id)
        unique.setdefault(r.key, r)
    # A rule with several heads is a body rule and one rule per head
    # (agent/engine/program/heads.py), named after its names: ``r1.body``, ``r1.head1``...
    for key, r in list(unique.items()):
        if not r.more_heads:
            continue
        del unique[key]
        body = Atom(f"zodiac:body:{key}", ())
        pieces = {"body": Rule(body, r.body)} | {
            f"head{n}": Rule(head, (body,)) for n, head in enumerate(r.heads, start=1)
        }
        for part, piece in pieces.items():
            piece_key = f"{key}.{part}"
            names[piece_key] = {f"{name}.{part}" for name in names[key]}
            unique[piece_key] = piece
    keys = {id(rule): key for key, rule in unique.items()}
    rules = list(unique.values())
    reads = [{rel for rel, _ in r.body_relations()} for r in rules]
    successors = [
        [j for j in range(len(rules)) if rules[i].head.relation in reads[j]]
        for i in range(len(rules))
    ]
    reach: list[set[int]] = []
    for i in range(len(rules)):
        seen: set[int] = set()
        todo = list(successors[i])
        while todo:
            j = todo.pop()
            if j not in seen:
                seen.add(j)
                todo.extend(successors[j])
        reach.append(seen)
    nodes: dict[frozenset[str], bool] = {}
    for i in range(len(rules)):
        members = [i] + [j for j in reach[i] if j != i and i in reach[j]]
        member_names = (name for j in members for name in names[keys[id(rules[j])]])
        nodes[frozenset(member_names)] = i in reach[i]
    return nodes


def engine_hyper_nodes(reasoner: Reasoner) -> set[frozenset[str]]:
    return {frozenset(node["rules"]) for node in reasoner.stats()["hyper_nodes"]}


def round_trips(rule: Rule) -> bool:
    """Whether the rule's text parses back to the same rule (same label, same content: an
    anonymous ``_`` built by hand is named ``_1`` by the parser, which changes no content),
    so that it can be added or deleted by text."""
    try:
        (parsed,) = parse_program(str(rule)).rules
    except Exception:  # noqa: BLE001 - any parse failure means "not by text"
        return False
    return parsed.key == rule.key and parsed.label == rule.label


def by_relation(facts: Iterable[tuple]) -> dict:
    grouped: dict = defaultdict(list)
    for fact in facts:
        grouped[(fact[0], len(fact) - 1)].append(fact)
    return grouped


# How a rule deletion names its rule: by name (label, or key when unlabelled), by content key,
# by text with its label (that name only), by text without label (every name of the content),
# by the text of the rule with its variables renamed (one rule: the key is content modulo
# renaming; with its label, if any).
DELETE_BY = ("name", "key", "text", "bare text", "renamed text")


def renamed(rule: Rule) -> Rule:
    """The rule with every variable renamed (``X`` -> ``Xr``): another spelling of the same
    rule, with the same key and label."""

    def rename(term):
        if isinstance(term, Variable) and term.name != "_":
            return Variable(term.name + "r")
        return term

    spelt = map_rule(rule, rename)
    assert spelt.key == rule.key, (rule, spelt)
    return spelt


# ---------------------------------------------------------------------------------- the model
class OracleMachine(RuleBasedStateMachine):
    """The model (rules by name, and explicit facts), the update operations applied to both
    model and engine, and the invariant. Subclasses draw the pool and the updates.

    With ``persistent``, the engine is an :class:`AgentState` (a real SQLite file): every
    change is committed through it, and a ``restart`` step reopens the file, so that the next
    steps run on a reasoner loaded from disk."""

    reasoner_class: type[Reasoner] = Reasoner  # a sabotaged subclass must make the test fail
    persistent = False

    def __init__(self) -> None:
        super().__init__()
        self.pool: list[Rule] = []
        self.textual: set[Rule] = set()  # pool rules that can be written as text
        self.rules: dict[str, Rule] = {}  # the model: current rules by name ...
        self.explicit: set[tuple] = set()  # ... and current explicit facts (logical form)
        self.state: AgentState | None = None
        self.directory: Path | None = None
        self.files: Path | None = None  # fact files written for the file path
        if self.persistent:
            self.directory = Path(tempfile.mkdtemp(prefix="zodiac-machine-"))
            self.state = AgentState(
                self.directory / "agent.db", synchronous="OFF", decompositions="always"
            )
        else:
            self._reasoner = self.reasoner_class(decompositions="always")
        self.logical: set[tuple] = set()  # the oracle's materialisation after the last check
        self.operation = "start"  # kind of the last step, for the coverage events
        self.deleted_explicit: set[tuple] = set()  # explicit facts the last step deleted
        self.deleted_rule_facts: set[tuple] = set()  # facts the rules it deleted derived
        self.steps = 0

    @property
    def reasoner(self) -> Reasoner:
        return self.state.reasoner if self.state is not None else self._reasoner

    def teardown(self) -> None:
        if self.state is not None:
            self.state.close()
        for directory in (self.directory, self.files):
            if directory is not None:
                shutil.rmtree(directory, ignore_errors=True)

    def apply(self, **change) -> dict:
        """One change, through the agent's state (committed to SQLite) or the reasoner."""
        if self.state is not None:
            report = self.state.apply(**change)
            # Every commit wrote the hyper-nodes the journal named, and those alone: a journal
            # short of the file falls back to looking at every row, which is right but hides
            # the journal's bug as slowness.
            assert self.state.full_node_writes == 0
            return report
        return self.reasoner.update(**change)

    # ------------------------------------------------------------------ set-up and logging
    def log(self, text: str) -> None:
        self.steps += 1
        COVERAGE["(steps)"] += 1
        note(f"step {self.steps}: {text}")

    def start(self, pool: Program, rules: list[Rule], facts: list[tuple], rules_first: bool):
        self.pool = list(pool.rules)
        self.textual = {r for r in self.pool if round_trips(r)}
        COVERAGE["(runs)"] += 1
        note("rule pool:\n" + "\n".join(f"  [{r.id}] {r.text()}" for r in self.pool))
        rules = self.addable(rules)
        if rules_first:
            self.add_rules(rules, as_text=False)
            self.add_facts(facts)
        else:
            self.add_facts(facts)
            self.add_rules(rules, as_text=False)
        self.operation = "start"

    def name(self, rule: Rule) -> str:
        return f"[{rule.id}] {rule.text()}"

    def addable(self, rules: list[Rule], present: dict[str, Rule] | None = None) -> list[Rule]:
        """The rules that can be added together to ``present`` (the model by default): at
        most one rule per name, and none whose name is taken by a different content."""
        taken = dict(self.rules if present is None else present)
        chosen: list[Rule] = []
        for r in rules:
            known = taken.get(r.id)
            if known is None or known.key == r.key:
                taken[r.id] = r
                chosen.append(r)
        return chosen

    def deleted_names(self, rules: list[Rule], how: list[str]) -> tuple[list[str], set[str]]:
        """What to pass to ``delete_rules`` for ``rules`` named ``how`` (see DELETE_BY), and
        the names the model loses: a key or a bare text names every name of that content."""
        items: list[str] = []
        names: set[str] = set()
        for given, by in zip(rules, how, strict=True):
            items.append(
                {
                    "name": given.id,
                    "key": given.key,
                    "text": str(given),
                    "bare text": given.text(),
                    "renamed text": str(renamed(given)) if by == "renamed text" else "",
                }[by]
            )
            if by == "name" or (by in ("text", "renamed text") and given.label):
                names.add(given.id)
            else:
                names |= {n for n, r in self.rules.items() if r.key == given.key}
        return items, names

    def draw_how(self, data: st.DataObject, rule: Rule) -> str:
        return data.draw(st.sampled_from(DELETE_BY if rule in self.textual else DELETE_BY[:2]))

    # ------------------------------------------------------------------ operations
    def add_facts(self, facts: list[tuple]) -> None:
        self.log(f"add_facts {show(facts)}")
        new = len(set(facts) - self.explicit)
        if any(f[0] in self.heads() for f in facts):
            record("explicit fact of a derived relation added")
        if self.state is not None:
            added = self.apply(add_facts=external(facts))["facts_added"]
        else:
            added = self.reasoner.add_facts(external(facts))
        self.explicit |= set(facts)
        self.operation = "insert"
        assert added == new, f"add_facts returned {added}, but {new} facts were new"

    def delete_facts(self, facts: list[tuple]) -> None:
        self.log(f"delete_facts {show(facts)}")
        gone = set(facts) & self.explicit
        if set(facts) - self.explicit:
            record("delete_facts with facts that are not explicit")
        if self.state is not None:
            removed = self.apply(delete_facts=external(facts))["facts_deleted"]
        else:
            removed = self.reasoner.delete_facts(external(facts))
        self.explicit -= gone
        self.operation = "delete"
        self.deleted_explicit = gone
        assert removed == len(gone), f"delete_facts returned {removed}, expected {len(gone)}"

    def add_rules(self, rules: list[Rule], as_text: bool) -> None:
        if not rules:
            return
        how = "as text" if as_text else "as AST"
        self.log(f"add_rules {how}:\n" + "\n".join(f"    {self.name(r)}" for r in rules))
        before = hyper_nodes(self.rules.values())
        source = "\n".join(map(str, rules)) if as_text else Program(tuple(rules))
        if self.state is not None:
            report = self.apply(add_rules=source)
            new = list(dict.fromkeys(r.id for r in rules if r.id not in self.rules))
            assert report["rules_added"] == new, f"rules_added is {report['rules_added']}"
        else:
            ids = self.reasoner.add_rules(source)
            assert ids == [r.id for r in rules], f"add_rules returned {ids}"
        if all(r.id in self.rules for r in rules):
            record("add_rules of rules already present")
        if any(r.label for r in rules):
            record("labelled rule added")
        if any(r.id not in self.rules and r.key in self.program_keys() for r in rules):
            record("second name for a rule already present")
        self.rules.update((r.id, r) for r in rules)
        self.operation = "insert"
        self.count_graph_changes(before)

    def delete_rules(self, rules: list[Rule], how: list[str]) -> None:
        items, names = self.deleted_names(rules, how)
        self.log(
            "delete_rules:\n"
            + "\n".join(f"    by {b} {self.name(r)}" for r, b in zip(rules, how, strict=True))
        )
        before = hyper_nodes(self.rules.values())
        if self.state is not None:
            deleted = self.apply(delete_rules=items)["rules_deleted"]
        else:
            deleted = self.reasoner.delete_rules(items)
        assert sorted(deleted) == sorted(names), f"delete_rules returned {deleted}"
        for by in how:
            record(f"rule deleted by {by}")
        old = by_relation(self.logical)
        gone_keys = {self.rules[n].key for n in names} - {
            r.key for n, r in self.rules.items() if n not in names
        }
        if {self.rules[n].key for n in names} - gone_keys:
            record("a name deleted, the rule kept under another name")
        gone = [r for r in self.rules.values() if r.key in gone_keys]
        self.deleted_rule_facts = set().union(*(fire(r, 0, old, set()) for r in gone))
        for n in names:
            del self.rules[n]
        self.operation = "delete"
        self.count_graph_changes(before)

    def delete_unknown_rules(self, known: list[Rule], unknown: list[str]) -> None:
        """``unknown`` are ids or texts of rules that are not present: the call must raise and
        change nothing, even when it also names rules that are present."""
        items = [r.id for r in known] + unknown
        self.log(f"delete_rules (must fail) {items}")
        with pytest.raises(UnknownRuleError):
            if self.state is not None:
                self.apply(delete_rules=items)
            else:
                self.reasoner.delete_rules(items)
        self.operation = "none"

    def add_conflicting_rule(self, rule: Rule) -> None:
        """A rule whose label names a different rule already: refused, nothing changes."""
        self.log(f"add_rules (must fail: label taken by {self.rules[rule.id]}) {self.name(rule)}")
        with pytest.raises(RuleError, match="already used by a different rule"):
            self.apply(add_rules=Program((rule,)))
        record("label taken by another body refused")
        self.operation = "none"

    def update(
        self,
        add_rules: list[Rule],
        delete_rules: list[Rule],
        add_facts: list[tuple],
        delete_facts: list[tuple],
        how: list[str] | None = None,
        add_paths: list[str] | None = None,
        delete_path: str = "tuple",
    ) -> None:
        """One ``update`` call. ``add_paths`` says how each added fact arrives (``tuple``,
        ``respelt``, ``text``: in the rule text, ``file``: in a Turtle file, see
        tests/support/fact_paths.py) and ``delete_path`` how the deleted ones do."""
        how = how or ["name"] * len(delete_rules)
        add_paths = add_paths or ["tuple"] * len(add_facts)
        items, names = self.deleted_names(delete_rules, how)
        self.log(
            "update:\n"
            + "".join(f"    + {self.name(r)}\n" for r in add_rules)
            + "".join(
                f"    - by {b} {self.name(r)}\n" for r, b in zip(delete_rules, how, strict=True)
            )
            + f"    + facts {show(add_facts)} as {add_paths}\n"
            + f"    - facts {show(delete_facts)} as {delete_path}"
        )
        before = hyper_nodes(self.rules.values())
        replaced = {r.id for r in add_rules if r.id in names and r.key != self.rules[r.id].key}
        paths = dict(zip(add_facts, add_paths, strict=True))
        if any(paths.get(f) not in (None, delete_path) for f in delete_facts):
            record("fact deleted and added back through another path")
        if {r.key for r in add_rules} & {r.key for r in delete_rules}:
            record("rule deleted and added back in one update")
        self.apply(
            add_rules=self.rules_with_facts(add_rules, add_facts, add_paths),
            delete_rules=items,
            add_facts=self.facts_by_path(
                [f for f, p in zip(add_facts, add_paths, strict=True) if p != "text"],
                [p for p in add_paths if p != "text"],
            ),
            delete_facts=self.facts_by_path(delete_facts, [delete_path] * len(delete_facts)),
        )
        for n in names:
            del self.rules[n]
        self.rules.update((r.id, r) for r in add_rules)
        self.explicit -= set(delete_facts)
        self.explicit |= set(add_facts)
        self.operation = "update"
        record("mixed update")
        if replaced:
            record("labelled rule replaced in one update")
        self.count_graph_changes(before)

    def rules_with_facts(
        self, rules: list[Rule], facts: list[tuple], paths: list[str]
    ) -> Program | str:
        """The ``add_rules`` argument: the rules, and the facts whose path is ``text`` written
        as ground facts in the rule text (a Program of the text's facts when a rule does not
        read back from its text)."""
        lines = [text_of(f) for f, p in zip(facts, paths, strict=True) if p == "text"]
        if not lines:
            return Program(tuple(rules))
        if all(r in self.textual for r in rules):
            return "\n".join([*map(str, rules), *lines]) + "\n"  # type: ignore[list-item]
        return Program(tuple(rules), parse_program("\n".join(lines)).facts)  # type: ignore[arg-type]

    def facts_by_path(self, facts: list[tuple], paths: list[str]) -> list[tuple] | Path:
        """Facts as an ``add_facts`` / ``delete_facts`` argument: a Turtle file when every
        one of them goes by ``file``, else tuples (each as drawn, or re-spelt)."""
        if facts and all(p == "file" for p in paths):
            if self.files is None:
                self.files = Path(tempfile.mkdtemp(prefix="zodiac-machine-facts-"))
            return write_fact_file(self.files, facts)
        return [
            spelt(f, "respelt" if p == "respelt" else "tuple")
            for f, p in zip(facts, paths, strict=True)
        ]

    def draw_paths(self, data: st.DataObject, facts: list[tuple], text: bool) -> list[str]:
        """A path per fact (see `update`): ``file`` only if all of them can go so."""
        allowed = [p for p in PATHS if p != "text" or text]
        if "file" in allowed and not all(can_go(f, "file") for f in facts):
            allowed.remove("file")
        return [
            data.draw(st.sampled_from([p for p in allowed if can_go(f, p)]), label="path")
            for f in facts
        ]

    def restart(self) -> None:
        """Close the SQLite state and open it again: the reasoner is loaded, not recomputed."""
        assert self.state is not None and self.directory is not None
        self.log("restart from SQLite")
        self.state.close()
        self.state = AgentState(
            self.directory / "agent.db", synchronous="OFF", decompositions="always"
        )
        assert self.state.load_report.how == "loaded", self.state.load_report.how
        assert set(self.reasoner.rules) == set(self.rules)
        record("restarted from SQLite")
        self.operation = "none"

    # ------------------------------------------------------------------ coverage
    def heads(self) -> set[str]:
        return {r.head.predicate for r in self.rules.values()}

    def program_keys(self) -> set[str]:
        return {r.key for r in self.rules.values()}

    def count_graph_changes(self, before: dict[frozenset[str], bool]) -> None:
        after = hyper_nodes(self.rules.values())
        node_before = {rid: node for node in before for rid in node}
        node_after = {rid: node for node in after for rid in node}
        for node in after:
            parts = {node_before[rid] for rid in node if rid in node_before}
            if len(parts) > 1:
                record("hyper-nodes merged")
                if sum(before[part] for part in parts) > 1:
                    record("two recursive hyper-nodes merged")
        for node in before:
            parts = {node_after[rid] for rid in node if rid in node_after}
            if len(parts) > 1:
                record("hyper-node split")
                if sum(after[part] for part in parts) > 1:
                    record("hyper-node split into two recursive ones")
        if any(len(node) > 1 for node in after):
            record("mutual recursion (hyper-node of several rules)")

    def count_changes(self, old: set[tuple], new: set[tuple]) -> None:
        negated = {r.head.relation for r in self.rules.values() if has_negation(r)}
        aggregated = {r.head.relation for r in self.rules.values() if r.aggregate()}
        kind = {"insert": "insertion", "delete": "deletion"}.get(self.operation)
        if kind is None:
            return
        changed = (new - old) if kind == "deletion" else (old - new)
        verb = "appear" if kind == "deletion" else "disappear"
        relations = {(f[0], len(f) - 1) for f in changed}
        if relations & negated:
            record(f"{kind} made facts {verb} through negation")
        if relations & aggregated:
            record(f"{kind} changed an aggregate")
        if self.operation == "delete" and self.deleted_explicit:
            if self.deleted_explicit & new:
                record("deleted explicit fact still derived")
            if self.deleted_explicit - new:
                record("deleted explicit fact vanished")
        if self.operation == "delete" and self.deleted_rule_facts:
            if self.deleted_rule_facts & new:
                record("fact of a deleted rule kept by another derivation")
            if self.deleted_rule_facts - new:
                record("facts of a deleted rule vanished")
        self.deleted_explicit = set()
        self.deleted_rule_facts = set()

    # ------------------------------------------------------------------ the invariant
    @invariant()
    def agrees_with_oracle_and_fresh_engine(self) -> None:
        # The program has one rule per content: two names for one rule are one rule.
        program = Program(tuple({r.key: r for r in self.rules.values()}.values()))
        logical = evaluate(program, self.explicit).facts
        wanted = {to_external(f) for f in logical}
        self.count_changes(self.logical, logical)
        self.logical = logical
        actual = engine_facts(self.reasoner)
        assert_same(actual, wanted, f"after step {self.steps}, engine vs reference evaluator")

        fresh = self.reasoner_class(decompositions=False)
        fresh.add_rules(Program(tuple(self.rules.values())))
        fresh.add_facts(external(self.explicit))
        assert_same(actual, engine_facts(fresh), f"after step {self.steps}, engine vs fresh engine")

        stats = self.reasoner.stats()
        for module in {node.get("module") for node in stats["hyper_nodes"]}:
            record(f"module in use: {module}")
        assert stats["rules"] == len(self.rules), stats["rules"]
        assert stats["explicit_facts"] == len(self.explicit), stats["explicit_facts"]
        assert stats["facts"] == len(wanted) == self.reasoner.count(), (
            f"stats()['facts'] is {stats['facts']}, count() {self.reasoner.count()}, "
            f"but there are {len(wanted)} facts"
        )
        nodes = set(hyper_nodes(self.rules.values()))
        assert engine_hyper_nodes(self.reasoner) == nodes, (
            f"hyper-nodes {sorted(map(sorted, engine_hyper_nodes(self.reasoner)))} "
            f"are not the rules' strongly connected components {sorted(map(sorted, nodes))}"
        )
        assert engine_hyper_nodes(fresh) == nodes, "a fresh engine's hyper-nodes differ"

    # ------------------------------------------------------------------ shared steps
    def absent_pool_rules(self) -> list[Rule]:
        return [r for r in self.pool if self.rules.get(r.id) != r]

    def draw_rules(self, data: st.DataObject, rules: list[Rule], most: int) -> list[Rule]:
        if not rules:
            return []
        return data.draw(st.lists(st.sampled_from(rules), min_size=1, max_size=most, unique=True))

    def fail_to_delete_rules(self, data: st.DataObject) -> None:
        """Delete absent rules (some maybe with present ones): an error, nothing changes."""
        keys = self.program_keys()
        absent = [r for r in self.absent_pool_rules() if r.key not in keys]
        choices = [r.id for r in absent if r.id not in self.rules]
        choices += [r.text() for r in absent if r in self.textual]
        choices += ["h000000000000", "<nothing>(X) :- <nowhere>(X) ."]
        unknown = data.draw(st.lists(st.sampled_from(choices), min_size=1, max_size=2))
        known = self.draw_rules(data, list(self.rules.values()), 2)
        self.delete_unknown_rules(known, unknown)

    def structural_rules(self) -> list[Rule]:
        """Pool rules whose insertion or deletion merges or splits hyper-nodes of other rules."""

        def others(rules: dict[str, Rule], rid: str) -> set[frozenset[str]]:
            return {node - {rid} for node in hyper_nodes(rules.values())} - {frozenset()}

        found = []
        for r in self.pool:
            toggled = dict(self.rules)
            if toggled.pop(r.id, None) is None:
                toggled[r.id] = r
            if others(toggled, r.id) != others(self.rules, r.id):
                found.append(r)
        return found

    def replacements(self) -> list[tuple[Rule, Rule]]:
        """(present rule, pool rule with the same label and another content) pairs."""
        return [
            (present, other)
            for present in self.rules.values()
            if present.label
            for other in self.pool
            if other.label == present.label and other.key != present.key
        ]

    @precondition(lambda self: hasattr(self.reasoner_class, "update"))
    @rule(data=st.data())
    def mixed_update(self, data: st.DataObject) -> None:
        """Rules and facts inserted and deleted in one ``update`` call. Now and then a rule or a
        fact is both deleted and inserted: deletions apply first, so it stays. Half the time
        when the pool allows it, a labelled rule is replaced: its label deleted and another
        body added under it."""
        present = list(self.rules.values())
        replacements = self.replacements()
        if replacements and data.draw(st.booleans()):
            old, new = data.draw(st.sampled_from(replacements))
            delete_rules = [old]
            add_rules = [new]
        else:
            delete_rules = self.draw_rules(data, present, 2) if data.draw(st.booleans()) else []
            candidates = self.absent_pool_rules() if data.draw(st.integers(0, 3)) else self.pool
            add_rules = self.draw_rules(data, candidates, 2) if data.draw(st.booleans()) else []
        how = [self.draw_how(data, r) for r in delete_rules]
        _, gone = self.deleted_names(delete_rules, how)
        remaining = {n: r for n, r in self.rules.items() if n not in gone}
        add_rules = self.addable(add_rules, remaining)
        add_facts = data.draw(st.lists(self.fact_strategy(), max_size=4))
        explicit = sorted(self.explicit, key=repr)
        delete_facts = (
            data.draw(st.lists(st.sampled_from(explicit), max_size=3)) if explicit else []
        )
        if add_facts and data.draw(st.integers(0, 3)) == 0:
            delete_facts.append(data.draw(st.sampled_from(add_facts)))
        if delete_facts and data.draw(st.integers(0, 3)) == 0:  # deleted, added back
            add_facts.append(data.draw(st.sampled_from(delete_facts)))
        if delete_rules and data.draw(st.integers(0, 3)) == 0:  # maybe spelt otherwise
            back = data.draw(st.sampled_from(delete_rules))
            candidate = renamed(back) if data.draw(st.booleans()) else back
            add_rules = self.addable([*add_rules, candidate], remaining)
        add_paths = self.draw_paths(data, add_facts, text=True)
        delete_paths = self.draw_paths(data, delete_facts, text=False)
        delete_path = delete_paths[0] if len(set(delete_paths)) == 1 else "tuple"
        self.update(add_rules, delete_rules, add_facts, delete_facts, how, add_paths, delete_path)

    @rule(data=st.data())
    def refuse_taken_label(self, data: st.DataObject) -> None:
        """Adding a body under a label that names another body (without deleting it in the
        same update) is refused and changes nothing."""
        replacements = self.replacements()
        if replacements:
            self.add_conflicting_rule(data.draw(st.sampled_from(replacements))[1])

    def fact_strategy(self) -> st.SearchStrategy[tuple]:
        raise NotImplementedError


# ---------------------------------------------------------------------------------- machine 1
class RulePoolMachine(OracleMachine):
    """A random rule pool; the reasoner starts with a random subset of it. Two kinds of steps
    (plus ``mixed_update``), each choosing what to do with even odds, so that insertions and
    deletions stay balanced."""

    @initialize(pool=labelled(incremental_programs()), data=st.data())
    def setup(self, pool: Program, data: st.DataObject) -> None:
        self.pool_program = pool
        rules = [r for r in pool.rules if data.draw(st.integers(0, 3)) < 3]  # 0: simplest
        size = data.draw(st.integers(6, 20), label="number of facts")
        facts = data.draw(st.lists(pool_facts(pool), min_size=size, max_size=size))
        self.start(pool, rules, facts, data.draw(st.booleans(), label="rules first"))

    def fact_strategy(self) -> st.SearchStrategy[tuple]:
        return pool_facts(self.pool_program)

    @rule(data=st.data())
    def change_facts(self, data: st.DataObject) -> None:
        """Insert 1..4 facts, or delete 0..3 explicit facts plus sometimes facts that are not
        explicit (derived only, or unknown): those must be ignored."""
        if data.draw(st.sampled_from(["insert", "delete"])) == "insert":
            self.add_facts(data.draw(st.lists(self.fact_strategy(), min_size=1, max_size=4)))
            return
        explicit = sorted(self.explicit, key=repr)
        of_derived = [f for f in explicit if f[0] in self.heads()]
        if of_derived and data.draw(st.integers(0, 2)) == 0:  # maybe derived as well
            explicit = of_derived
        facts = data.draw(st.lists(st.sampled_from(explicit), max_size=3)) if explicit else []
        if not facts or data.draw(st.integers(0, 3)) == 0:
            derived_only = sorted(self.logical - self.explicit, key=repr)
            if derived_only and data.draw(st.booleans()):
                facts.append(data.draw(st.sampled_from(derived_only)))
            else:
                facts.append(data.draw(self.fact_strategy()))
        self.delete_facts(facts)

    @rule(data=st.data())
    def change_rules(self, data: st.DataObject) -> None:
        """Insert 1..2 pool rules (half the time one that merges hyper-nodes, if any), or delete
        1..2 present ones (half the time one whose deletion splits a hyper-node), by id or by
        text; now and then a deletion of absent rules, which must fail."""
        structural = self.structural_rules()
        if data.draw(st.sampled_from(["insert", "delete"])) == "insert":
            absent = self.addable(self.absent_pool_rules())
            merging = self.addable([r for r in structural if r.id not in self.rules])
            if merging and data.draw(st.booleans()):
                rules = [data.draw(st.sampled_from(merging))]
                rules += self.draw_rules(data, absent, 1) if data.draw(st.booleans()) else []
                rules = list(dict.fromkeys(rules))
            elif absent and data.draw(st.integers(0, 3)):
                rules = self.draw_rules(data, absent, 2)
            else:  # present ones too: a no-op for them
                rules = self.draw_rules(data, self.pool, 2)
            rules = self.addable(rules)
            as_text = all(r in self.textual for r in rules) and data.draw(st.booleans())
            self.add_rules(rules, as_text)
            return
        if not self.rules or data.draw(st.integers(0, 5)) == 0:
            self.fail_to_delete_rules(data)
            return
        splitting = [r for r in structural if self.rules.get(r.id) == r]
        if splitting and data.draw(st.booleans()):
            rules = [data.draw(st.sampled_from(splitting))]
        else:
            rules = self.draw_rules(data, list(self.rules.values()), 2)
        self.delete_rules(rules, [self.draw_how(data, r) for r in rules])


TestRulePoolMachine = RulePoolMachine.TestCase
TestRulePoolMachine.settings = MACHINE_SETTINGS


class PersistentRulePoolMachine(RulePoolMachine):
    """The rule-pool machine with every change committed to a real SQLite file through the
    agent's :class:`AgentState`, and restarts from that file between steps."""

    persistent = True

    @rule()
    def restart_from_disk(self) -> None:
        self.restart()


TestPersistentRulePoolMachine = PersistentRulePoolMachine.TestCase
TestPersistentRulePoolMachine.settings = PERSISTENT_SETTINGS


# ---------------------------------------------------------------------------------- machine 2
class ClosureMachine(OracleMachine):
    """Closure programs (RS1/RS2/RS3-like, transitive closure, rules bridging them) over 5-8
    nodes; mostly edge insertions and deletions, so that components merge and split."""

    @initialize(pool=labelled(closure_pools()), size=st.integers(5, 8), data=st.data())
    def setup(self, pool: Program, size: int, data: st.DataObject) -> None:
        self.nodes = [f"w{i}" for i in range(size)]
        read = {rel for r in pool.rules for rel, _ in r.body_relations()}
        heads = {r.head.relation for r in pool.rules}
        self.edges = [name for name in CLOSURE_EDGES if (name, 2) in read]
        self.derived_edges = [name for name in CLOSURE_DERIVED_EDGES if (name, 2) in heads]
        self.reads_p5 = ("p5", 2) in read
        self.reads_temp = ("temp", 2) in read
        if data.draw(st.integers(0, 2)):
            rules = list(pool.rules)
        else:
            rules = [r for r in pool.rules if data.draw(st.integers(0, 3))]
        facts = [("node", n) for n in self.nodes]
        if self.reads_temp:
            for n in self.nodes:
                if data.draw(st.integers(0, 4)):
                    facts.append(("temp", n, data.draw(st.sampled_from(TEMPERATURES))))
        size = data.draw(st.integers(3, 12), label="number of edges")
        facts += data.draw(st.lists(self.edge(), min_size=size, max_size=size))
        self.start(pool, rules, facts, data.draw(st.booleans(), label="rules first"))

    def node(self) -> st.SearchStrategy[str]:
        return st.sampled_from(self.nodes)

    def edge(self, relation: str | None = None) -> st.SearchStrategy[tuple]:
        names = [relation] if relation else self.edges
        derived = [] if relation else self.derived_edges

        @st.composite
        def edges(draw: st.DrawFn) -> tuple:
            pool = derived if derived and draw(st.integers(0, 4)) == 0 else names
            x = draw(self.node())
            y = x if draw(st.integers(0, 11)) == 0 else draw(self.node())
            return (draw(st.sampled_from(pool)), x, y)

        return edges()

    def fact_strategy(self) -> st.SearchStrategy[tuple]:
        return self.edge()

    def components(self) -> int:
        """Connected components of the explicit edges (all relations, undirected)."""
        parent = {n: n for n in self.nodes}

        def find(n: str) -> str:
            while parent[n] != n:
                n = parent[n]
            return n

        for fact in self.explicit:
            if len(fact) == 3 and fact[0] != "temp" and fact[1] in parent and fact[2] in parent:
                parent[find(fact[1])] = find(fact[2])
        return len({find(n) for n in self.nodes})

    def tally(self, before: int) -> None:
        after = self.components()
        if after < before:
            record("closure: components merged")
        elif after > before:
            record("closure: component split")

    @rule(data=st.data())
    def insert_edges(self, data: st.DataObject) -> None:
        before = self.components()
        self.add_facts(data.draw(st.lists(self.edge(), min_size=1, max_size=3)))
        self.tally(before)

    @rule(data=st.data())
    def insert_path(self, data: st.DataObject) -> None:
        """A path or a cycle over 2..4 distinct nodes in one relation."""
        before = self.components()
        relation = data.draw(st.sampled_from(self.edges))
        path = data.draw(st.lists(self.node(), min_size=2, max_size=4, unique=True))
        if len(path) > 2 and data.draw(st.booleans()):
            path.append(path[0])
        self.add_facts([(relation, a, b) for a, b in zip(path, path[1:], strict=False)])
        self.tally(before)

    def explicit_edges(self) -> list[tuple]:
        return sorted((f for f in self.explicit if len(f) == 3 and f[0] != "temp"), key=repr)

    @rule(data=st.data())
    def remove_edges(self, data: st.DataObject) -> None:
        before = self.components()
        edges = self.explicit_edges()
        of_derived = [f for f in edges if f[0] in self.heads()]  # nb, and explicit p11, t...
        if of_derived and data.draw(st.booleans()):
            edges = of_derived
        facts = (
            data.draw(st.lists(st.sampled_from(edges), max_size=3, unique=True)) if edges else []
        )
        if not facts or data.draw(st.integers(0, 4)) == 0:
            facts.append(data.draw(self.edge()))  # maybe not explicit: ignored
        self.delete_facts(facts)
        self.tally(before)

    @rule(data=st.data())
    def cut_node(self, data: st.DataObject) -> None:
        """Delete every explicit edge at one node (sometimes the node fact too)."""
        before = self.components()
        linked = sorted({n for f in self.explicit_edges() for n in f[1:]})
        n = data.draw(st.sampled_from(linked) if linked else self.node())
        facts = sorted(
            (f for f in self.explicit if f[0] not in ("temp", "node") and n in f[1:]), key=repr
        )
        if data.draw(st.integers(0, 3)) == 0:
            facts.append(("node", n))
        self.delete_facts(facts or [("node", n)])
        self.tally(before)

    @rule(data=st.data())
    def change_readings(self, data: st.DataObject) -> None:
        """Readings (temp) and negated edges (p5): add or delete one, or re-add a node."""
        choices = ["node"] + ["temp"] * self.reads_temp + ["p5"] * self.reads_p5
        kind = data.draw(st.sampled_from(choices))
        if kind == "temp":
            fact: tuple = ("temp", data.draw(self.node()), data.draw(st.sampled_from(TEMPERATURES)))
        elif kind == "p5":
            fact = data.draw(self.edge("p5"))
        else:
            fact = ("node", data.draw(self.node()))
        if fact in self.explicit:
            self.delete_facts([fact])
        else:
            self.add_facts([fact])

    @rule(data=st.data())
    def toggle_rule(self, data: st.DataObject) -> None:
        if data.draw(st.integers(0, 5)) == 0:
            self.fail_to_delete_rules(data)
            return
        structural = self.structural_rules()
        if structural and data.draw(st.booleans()):
            chosen = data.draw(st.sampled_from(structural))
        else:
            chosen = data.draw(st.sampled_from(self.pool))
        if self.rules.get(chosen.id) == chosen:
            self.delete_rules([chosen], [self.draw_how(data, chosen)])
        elif self.addable([chosen]):
            textual = chosen in self.textual and data.draw(st.booleans())
            self.add_rules([chosen], as_text=textual)
        else:  # its label names another body: replace that one in one update
            self.update([chosen], [self.rules[chosen.id]], [], [])


TestClosureMachine = ClosureMachine.TestCase
TestClosureMachine.settings = CLOSURE_SETTINGS


class PersistentClosureMachine(ClosureMachine):
    """The closure machine as a turbine's agent runs it: every change committed to a real
    SQLite file through :class:`AgentState`, and restarts from that file between steps. A
    restart leaves the closures' adjacency and the aggregates' kept partitions to be rebuilt
    by the first change after it (``Module.adopt``), which runs inside that change: a turbine
    joining or leaving, a reading replaced or a rule replaced under its label, right after
    a restart."""

    persistent = True

    @rule()
    def restart_from_disk(self) -> None:
        self.restart()


TestPersistentClosureMachine = PersistentClosureMachine.TestCase
TestPersistentClosureMachine.settings = settings(
    CLOSURE_SETTINGS, max_examples=PERSISTENT_SETTINGS.max_examples
)


# ---------------------------------------------------------------------------------- regressions
def materialisation(reasoner: Reasoner) -> set[tuple]:
    return engine_facts(reasoner)


def check(reasoner: Reasoner, rules: str, facts: Iterable[tuple]) -> set[tuple]:
    """The reasoner equals the reference evaluator on ``rules`` (text) and explicit ``facts``
    (external form); returns the materialisation."""
    wanted = evaluate(parse_program(rules), [from_external(f) for f in facts]).external()
    actual = materialisation(reasoner)
    assert_same(actual, wanted, "engine vs reference evaluator")
    return actual


SYMMETRIC = "p(X, Y) :- e(X, Y) .\np(X, Y) :- p(Y, X) ."


def test_deleting_the_support_of_a_cycle_removes_the_whole_cycle():
    reasoner = Reasoner()
    reasoner.add_rules(SYMMETRIC)
    reasoner.add_facts([("e", "a", "b")])
    assert materialisation(reasoner) == {("e", "a", "b"), ("p", "a", "b"), ("p", "b", "a")}
    assert reasoner.delete_facts([("e", "a", "b")]) == 1
    assert materialisation(reasoner) == set()


def test_cycle_through_two_rules_vanishes_with_its_support_but_not_with_half_of_it():
    rules = "p(X, Y) :- e(X, Y) .\nq(X, Y) :- p(Y, X) .\np(X, Y) :- q(X, Y) ."
    reasoner = Reasoner()
    reasoner.add_rules(rules)
    reasoner.add_facts([("e", "a", "b"), ("e", "b", "a")])
    check(reasoner, rules, [("e", "a", "b"), ("e", "b", "a")])
    reasoner.delete_facts([("e", "a", "b")])  # e(b, a) still supports the whole cycle
    assert {("p", "a", "b"), ("p", "b", "a")} <= check(reasoner, rules, [("e", "b", "a")])
    reasoner.delete_facts([("e", "b", "a")])
    assert check(reasoner, rules, []) == set()


def test_explicit_fact_of_a_derived_relation_stays_until_both_supports_go():
    reasoner = Reasoner()
    reasoner.add_rules(SYMMETRIC)
    reasoner.add_facts([("e", "a", "b"), ("p", "a", "b")])
    reasoner.delete_facts([("p", "a", "b")])  # still derived from e(a, b)
    assert ("p", "a", "b") in check(reasoner, SYMMETRIC, [("e", "a", "b")])
    reasoner.add_facts([("p", "a", "b")])
    reasoner.delete_facts([("e", "a", "b")])  # still explicit, and p(b, a) follows from it
    assert check(reasoner, SYMMETRIC, [("p", "a", "b")]) == {("p", "a", "b"), ("p", "b", "a")}


def test_delete_then_re_add_the_same_fact():
    rules = "t(X, Y) :- e(X, Y) .\nt(X, Z) :- t(X, Y), e(Y, Z) .\nlone(X) :- n(X), not t(X, _) ."
    facts = [("e", "a", "b"), ("e", "b", "c"), ("e", "c", "a"), (RDF_TYPE, "a", "n")]
    reasoner = Reasoner()
    reasoner.add_rules(rules)
    reasoner.add_facts(facts)
    before = check(reasoner, rules, facts)
    assert reasoner.delete_facts([("e", "c", "a")]) == 1
    after = check(reasoner, rules, [f for f in facts if f != ("e", "c", "a")])
    assert ("t", "a", "a") in before and ("t", "a", "a") not in after
    assert reasoner.add_facts([("e", "c", "a")]) == 1
    assert materialisation(reasoner) == before


def test_deleting_a_fact_makes_facts_appear_through_negation():
    rules = (
        "q(X, Y) :- e(X, Y) .\nq(X, Z) :- q(X, Y), q(Y, Z) .\nfar(X, Y) :- f(X, Y), not q(X, Y) ."
    )
    facts = [("e", "a", "b"), ("e", "b", "c"), ("f", "a", "c")]
    reasoner = Reasoner()
    reasoner.add_rules(rules)
    reasoner.add_facts(facts)
    assert ("far", "a", "c") not in check(reasoner, rules, facts)
    reasoner.delete_facts([("e", "b", "c")])
    assert ("far", "a", "c") in check(reasoner, rules, facts[::2])


def test_adding_then_deleting_a_rule_restores_the_state_fact_for_fact():
    rules = (
        "p(X, Z) :- p(X, Y), e(Y, Z) .\n"
        "p(X, Y) :- e(X, Y) .\n"
        "c(X, N) :- aggregate( p(X, Y) ) on X with count(Y) as N ."
    )
    facts = [("e", "a", "b"), ("e", "b", "c"), ("p", "c", "a"), ("e", "d", "d")]
    reasoner = Reasoner()
    reasoner.add_rules(rules)
    reasoner.add_facts(facts)
    before = check(reasoner, rules, facts)
    stats_before = reasoner.stats()
    nodes_before = engine_hyper_nodes(reasoner)
    # q :- p and p :- q merge p's closure with the new rules into one hyper-node
    merging = "q(X, Y) :- p(Y, X) .\np(X, Y) :- q(X, Y) ."
    ids = reasoner.add_rules(merging)
    grown = check(reasoner, rules + "\n" + merging, facts)
    assert {f for f in grown if f[0] == "p"} > {f for f in before if f[0] == "p"}
    merged = [node for node in engine_hyper_nodes(reasoner) if set(ids) <= node]
    assert len(merged) == 1 and len(merged[0]) == 3, engine_hyper_nodes(reasoner)  # + p :- p, e
    assert sorted(reasoner.delete_rules(ids)) == sorted(ids)
    assert materialisation(reasoner) == before
    assert engine_hyper_nodes(reasoner) == nodes_before
    stats = reasoner.stats()
    for key in ("facts", "explicit_facts", "rules", "predicates"):
        assert stats[key] == stats_before[key], key


def test_deleting_a_rule_that_was_never_added_fails_and_changes_nothing():
    reasoner = Reasoner()
    ids = reasoner.add_rules(SYMMETRIC)
    reasoner.add_facts([("e", "a", "b")])
    before = materialisation(reasoner)
    for unknown in (
        "h000000000000",
        "p(X, Y) :- f(X, Y) .",
        [ids[0], "p(X, Y) :- f(X, Y) ."],  # one known, one unknown: nothing is deleted
    ):
        with pytest.raises(UnknownRuleError):
            reasoner.delete_rules(unknown)
        assert materialisation(reasoner) == before
        assert reasoner.stats()["rules"] == 2
    assert reasoner.delete_rules("p(X, Y) :- p(Y, X) .") == [ids[1]]  # by identical text
    assert materialisation(reasoner) == {("e", "a", "b"), ("p", "a", "b")}


def test_deleting_a_fact_that_is_not_explicit_returns_zero_and_changes_nothing():
    reasoner = Reasoner()
    reasoner.add_rules(SYMMETRIC)
    reasoner.add_facts([("e", "a", "b")])
    before = materialisation(reasoner)
    assert reasoner.delete_facts([("p", "a", "b")]) == 0  # derived, not explicit
    assert reasoner.delete_facts([("e", "b", "a")]) == 0  # known terms, no such fact
    assert reasoner.delete_facts([("e", "a", "zzz")]) == 0  # unknown term
    assert reasoner.delete_facts([]) == 0
    assert materialisation(reasoner) == before
    assert reasoner.delete_facts([("e", "a", "b"), ("e", "a", "b")]) == 1  # counted once
    assert materialisation(reasoner) == set()


def test_mixed_update_is_one_change_with_deletions_first():
    if not hasattr(Reasoner, "update"):
        pytest.skip("Reasoner.update does not exist yet")
    rules = "t(X, Y) :- e(X, Y) .\nt(X, Z) :- t(X, Y), e(Y, Z) ."
    reasoner = Reasoner()
    ids = reasoner.add_rules(rules)
    reasoner.add_facts([("e", "a", "b"), ("e", "b", "c")])
    symmetric = "t(X, Y) :- t(Y, X) ."
    reasoner.update(
        add_rules=symmetric,
        delete_rules=[ids[1]],
        add_facts=[("e", "c", "d"), ("e", "a", "b")],
        delete_facts=[("e", "a", "b"), ("e", "b", "c")],  # e(a, b) is deleted and re-added
    )
    now = "t(X, Y) :- e(X, Y) .\n" + symmetric
    check(reasoner, now, [("e", "a", "b"), ("e", "c", "d")])
    assert reasoner.stats()["rules"] == 2
