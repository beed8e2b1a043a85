"""Hypothesis strategies: random *valid* programs and small fact sets for differential tests.

Programs are built directly as AST objects (``agent/engine/language.py``), never as text, so
they do not depend on the parser. Validity holds by construction:

* **Stratifiable.** Every IDB relation gets a level 0..3. A rule whose head is at level ``L``
  reads positively EDB relations and IDB relations of level <= ``L`` (so recursion and mutual
  recursion happen within a level), and reads under negation or inside an aggregate only EDB
  relations and levels < ``L``. Every dependency cycle therefore stays inside one level and is
  purely positive.
* **Safe.** Head, comparison and bind variables are drawn from the variables of the positive
  atoms (and of earlier binds); bind variables (``B0``...) are fresh; negated atoms use bound
  variables, constants, fresh existential variables (``E0``...) and at most one ``_`` per rule
  (so the test holds whether or not the parser gives each ``_`` its own name).
* **At most one aggregate rule**, whose head relation (``a0``) no other rule derives.

Two choices keep engine and oracle comparable exactly:

* ``/`` and ``sqrt`` (inexact floats) only appear in non-aggregate rules whose head is at the
  top level, and there is only one aggregate, so no aggregate ever sums floats whose rounding
  would depend on the order of summation. Data numbers are small ints plus 2.5 and 3.0 (exact
  in binary; 3.0 exercises "5 and 5.0 are one value"); columns of kind "any" also get
  literals.
* ``robust_errors=True`` generates programs whose run-time errors do not depend on evaluation
  order (see :func:`programs`), so that "zero errors vs some errors" can be compared.
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import strategies as st

from agent.engine.language import (
    Aggregate,
    Atom,
    BinaryOp,
    Bind,
    Call,
    Comparison,
    Constant,
    Literal,
    Negation,
    Program,
    Rule,
    Variable,
)
from agent.engine.values import AGGREGATE_FUNCTIONS

IRIS = [f"c{i}" for i in range(6)]
NUMBERS = [0, 1, 2, 3, 4, 5, 6, 2.5, 3.0]
# Literals spelled like an IRI and a number: a literal is neither (no booleans: see reference.py).
LITERALS = [Literal("c0"), Literal("3"), Literal("c0", language="en")]
RULE_CONSTANTS = ["c0", "c1", 0, 1, 3, 3.0]
TOP_LEVEL = 3
MAX_RULES = 6
MAX_FACTS = 25
VARIABLES = [Variable(name) for name in "XYZWUV"]

# Column kinds of the EDB relations: "iri", "num" or "any" (a kind is broken 1 time in 10, so
# comparisons and arithmetic also meet values of the wrong kind).
EDB: dict[str, tuple[str, ...]] = {
    "e1": ("iri", "iri"),
    "e2": ("iri", "num"),
    "e3": ("any",),
    "e4": ("iri", "iri", "num"),
}


@dataclass(frozen=True)
class Relation:
    name: str
    arity: int
    level: int  # -1 for EDB
    aggregate: bool = False


EDB_RELATIONS = [Relation(name, len(kinds), -1) for name, kinds in EDB.items()]


def _value(draw: st.DrawFn, kind: str) -> object:
    if kind != "any" and draw(st.integers(0, 9)) == 0:
        kind = "num" if kind == "iri" else "iri"
    if kind == "any":
        kind = draw(st.sampled_from(["iri", "iri", "num", "num", "lit"]))
    return draw(st.sampled_from({"iri": IRIS, "num": NUMBERS, "lit": LITERALS}[kind]))


@st.composite
def facts(
    draw: st.DrawFn, relations: tuple[str, ...] = tuple(EDB), extra: tuple[Relation, ...] = ()
) -> tuple:
    """One fact in logical form, over one of the EDB ``relations`` or (rarely) ``extra``."""
    if extra and draw(st.integers(0, 7)) == 0:
        rel = draw(st.sampled_from(extra))
        name, kinds = rel.name, ("any",) * rel.arity
    else:
        name = draw(st.sampled_from(relations))
        kinds = EDB[name]
    return (name, *(_value(draw, kind) for kind in kinds))


@st.composite
def fact_sets(
    draw: st.DrawFn,
    relations: tuple[str, ...] = tuple(EDB),
    extra: tuple[Relation, ...] = (),
    size: int | None = None,
) -> list[tuple]:
    """A list (order and duplicates matter for batching tests) of 0..25 logical facts."""
    if size is None:
        size = draw(st.integers(0, MAX_FACTS))
    return draw(st.lists(facts(relations, extra), min_size=size, max_size=size))


class _RuleBuilder:
    """Draws one rule body; tracks the bound variables and the kind of value each may hold."""

    def __init__(self, draw: st.DrawFn, level: int, relations: list[Relation], robust: bool):
        self.draw, self.level, self.robust = draw, level, robust
        self.positive = [r for r in relations if r.level <= level]
        self.lower = [r for r in relations if r.level < level]
        self.bound: list[Variable] = []
        self.kinds: dict[Variable, str] = {}  # column kind where an atom variable first occurs
        self.fresh = 0
        self.anonymous_used = False
        self.recursive = False  # reads its own level: no binds, or values could grow forever
        self.precise = level < TOP_LEVEL  # no / or sqrt: their floats could reach a sum

    def atom(self, rel: Relation) -> Atom:
        """Variables are shared with earlier atoms (a join) when their column kinds fit, so
        that joins can match; a variable repeated inside the atom (``p(X, X)``) is rarer."""
        kinds = EDB[rel.name] if rel.level < 0 else ("any",) * rel.arity
        terms: list = []
        for kind in kinds:
            roll = self.draw(st.integers(0, 9))
            fits = [
                v for v in self.bound if "any" in (kind, self.kinds[v]) or kind == self.kinds[v]
            ]
            earlier = [v for v in fits if v not in terms]
            if roll == 0:
                pool = {"iri": RULE_CONSTANTS[:2], "num": RULE_CONSTANTS[2:]}.get(kind)
                terms.append(Constant(self.draw(st.sampled_from(pool or RULE_CONSTANTS))))
            elif roll <= 4 and earlier:
                terms.append(self.draw(st.sampled_from(earlier)))
            elif (roll == 5 and fits) or len(self.bound) == len(VARIABLES):
                terms.append(self.draw(st.sampled_from(fits or self.bound)))
            else:
                variable = VARIABLES[len(self.bound)]
                self.bound.append(variable)
                self.kinds[variable] = kind
                terms.append(variable)
        return Atom(rel.name, tuple(terms))

    def atoms(self, relations: list[Relation], most: int) -> list[Atom]:
        chosen = [
            self.draw(st.sampled_from(relations))
            for _ in range(self.draw(st.sampled_from([1, 1, 2, 2, 3][: 2 * most - 1])))
        ]
        self.recursive = any(rel.level == self.level for rel in chosen)
        return [self.atom(rel) for rel in chosen]

    def variable(self) -> Variable:
        """A bound variable, usually one that may hold a number (4 times in 5), so that
        arithmetic and ordering mostly succeed but sometimes meet an IRI (a run-time error)."""
        numeric = [v for v in self.bound if self.kinds[v] != "iri"]
        if numeric and self.draw(st.integers(0, 4)):
            return self.draw(st.sampled_from(numeric))
        return self.draw(st.sampled_from(self.bound))

    def operand(self, constants: list = NUMBERS[:7]) -> Variable | Constant:
        if self.bound and self.draw(st.booleans()):
            return self.variable()
        return Constant(self.draw(st.sampled_from(constants)))

    def comparison(self, fallible: bool) -> Comparison | None:
        if not self.bound:
            return None
        if not fallible:  # = and != never raise
            op = self.draw(st.sampled_from(["=", "!="]))
            constants = [Constant(c) for c in RULE_CONSTANTS + LITERALS[:1]]
            right = self.draw(st.sampled_from(self.bound + constants))
        else:
            op = self.draw(st.sampled_from(["<", "<=", "=", "!=", ">=", ">"]))
            right = self.operand(NUMBERS[:7] + RULE_CONSTANTS)
        left = self.variable()
        if right == left:  # X < X is never true: compare with a constant instead
            right = Constant(self.draw(st.sampled_from(NUMBERS[:7])))
        return Comparison(left, op, right)

    def bind(self) -> Bind | None:
        if not self.bound or self.recursive:
            return None
        precise = self.precise
        shape = self.draw(st.sampled_from(["+", "-", "*", "abs", "min", "max", "round", "/"]))
        if shape == "/" and precise:
            shape = "+"
        left = self.variable()
        if shape in "+-*/":
            expr: object = BinaryOp(shape, left, self.operand())
        elif shape in ("min", "max"):
            expr = Call(shape, (left, self.operand()))
        else:
            expr = Call(
                self.draw(
                    st.sampled_from(
                        ["abs", "round", "floor", "ceil"] + ([] if precise else ["sqrt"])
                    )
                ),
                (left,),
            )
        variable = Variable(f"B{self.fresh}")
        self.fresh += 1
        self.bound.append(variable)
        self.kinds[variable] = "num"
        return Bind(expr, variable)

    def negation(self) -> Negation | None:
        rel = self.draw(st.sampled_from(EDB_RELATIONS + self.lower))
        terms: list = []
        for _ in range(rel.arity):
            pick = self.draw(st.integers(0, 9))
            existential = [t for t in terms if isinstance(t, Variable) and t.name[0] == "E"]
            if pick < 4 and self.bound:
                terms.append(self.draw(st.sampled_from(self.bound)))
            elif pick < 5:
                terms.append(Constant(self.draw(st.sampled_from(RULE_CONSTANTS))))
            elif pick == 5 and not self.anonymous_used:
                self.anonymous_used = True
                terms.append(Variable("_"))
            elif pick == 6 and existential:  # not p(Y, E0, E0)
                terms.append(existential[0])
            else:
                terms.append(Variable(f"E{self.fresh}"))
                self.fresh += 1
        if self.bound and not any(t in self.bound for t in terms):  # "p is empty" is dull
            terms[self.draw(st.integers(0, rel.arity - 1))] = self.draw(st.sampled_from(self.bound))
        return Negation(Atom(rel.name, tuple(terms)))

    def body(self, relations: list[Relation], most_atoms: int, most_items: int = 3) -> list:
        """Positive atoms plus a few other items, in a random written order."""
        items: list = self.atoms(relations, most_atoms)
        if self.robust and len(items) == 1 and self.draw(st.booleans()):
            # Simple rule: exactly one item that may raise, and it sees every substitution.
            fallible = self.draw(st.sampled_from(["comparison", "bind"]))
            item = self.comparison(True) if fallible == "comparison" else self.bind()
            items.append(item)
            if isinstance(item, Bind) and self.draw(st.booleans()):  # a filter on its result
                items.append(
                    Comparison(
                        item.variable,
                        self.draw(st.sampled_from(["<", ">="])),
                        Constant(self.draw(st.sampled_from(NUMBERS[:7]))),
                    )
                )
        else:
            for _ in range(self.draw(st.integers(0, most_items))):
                kind = self.draw(st.sampled_from(["comparison", "bind", "negation"]))
                if self.robust:  # only items that never raise
                    item = self.negation() if kind == "negation" else self.comparison(False)
                elif kind == "negation":
                    item = self.negation()
                else:
                    item = self.comparison(True) if kind == "comparison" else self.bind()
                items.append(item)
        items = [item for item in items if item is not None]
        return list(self.draw(st.permutations(items)))

    def head(self, rel: Relation) -> Atom:
        terms = []
        for _ in range(rel.arity):
            if self.bound and self.draw(st.integers(0, 7)) > 0:
                terms.append(self.draw(st.sampled_from(self.bound)))
            else:
                terms.append(Constant(self.draw(st.sampled_from(RULE_CONSTANTS))))
        return Atom(rel.name, tuple(terms))


def _generic_rule(
    draw: st.DrawFn, head: Relation, relations: list[Relation], robust: bool, base: bool
) -> Rule:
    """A random rule; a ``base`` rule reads only lower levels, so its relation is not empty."""
    b = _RuleBuilder(draw, head.level, relations, robust)
    body = b.body(EDB_RELATIONS + b.lower if base else b.positive, 3)
    return Rule(b.head(head), tuple(body))


def _aggregate_rule(
    draw: st.DrawFn, head: Relation, relations: list[Relation], robust: bool
) -> Rule:
    b = _RuleBuilder(draw, head.level, relations, robust)
    b.precise = True  # its sum or avg must not depend on the order of summation
    body = b.body(EDB_RELATIONS + b.lower, 2, 1)
    if not b.bound:  # every atom ground: give the argument something to range over
        b.bound, b.kinds = [VARIABLES[0]], {VARIABLES[0]: "any"}
        body.append(Atom("e3", (VARIABLES[0],)))
    group = draw(st.lists(st.sampled_from(b.bound), max_size=head.arity - 1, unique=True))
    group += [v for v in b.bound if v not in group][: head.arity - 1 - len(group)]
    if len(group) < head.arity - 1:  # not enough variables: fewer group-by columns
        head = Relation(head.name, len(group) + 1, head.level, True)
    result = Variable("R")
    argument = b.variable()
    function = draw(st.sampled_from(AGGREGATE_FUNCTIONS))
    if b.kinds[argument] == "iri" and draw(st.integers(0, 3)):
        function = "count"  # sum of IRIs produces nothing: keep that case, but rarer
    aggregate = Aggregate(tuple(body), tuple(group), function, argument, result)
    items: list = [aggregate]
    if draw(st.integers(0, 3)) == 0:
        items.append(
            Comparison(
                result,
                draw(st.sampled_from([">", "<=", "!="])),
                Constant(draw(st.sampled_from(NUMBERS[:7]))),
            )
        )
    return Rule(Atom(head.name, (*group, result)), tuple(items))


def _template_rules(draw: st.DrawFn, head: Relation, relations: list[Relation]) -> list[Rule]:
    """Classic recursive shapes for a binary relation: transitive closure, symmetric-transitive
    closure with ``X != Z`` (benchmark rule sets 1-3) and mutual recursion."""
    X, Y, Z = VARIABLES[:3]
    binary = [r for r in relations if r.arity == 2 and r.level <= head.level and r != head]
    base = Atom(draw(st.sampled_from(binary)).name, (X, Y))
    h = head.name
    shape = draw(st.sampled_from(["tc", "tc2", "symtrans", "mutual"]))
    rules = [Rule(Atom(h, (X, Y)), (base,))]
    if shape == "tc":
        rules.append(Rule(Atom(h, (X, Z)), (Atom(h, (X, Y)), Atom(base.predicate, (Y, Z)))))
    elif shape == "tc2":
        rules.append(Rule(Atom(h, (X, Z)), (Atom(h, (X, Y)), Atom(h, (Y, Z)))))
    elif shape == "symtrans":
        rules.append(Rule(Atom(h, (X, Y)), (Atom(h, (Y, X)),)))
        rules.append(
            Rule(Atom(h, (X, Z)), (Atom(h, (X, Y)), Atom(h, (Y, Z)), Comparison(X, "!=", Z)))
        )
    else:
        partners = [r for r in binary if r.level == head.level and not r.aggregate]
        if partners:
            other = draw(st.sampled_from(partners)).name
            rules.append(Rule(Atom(other, (X, Y)), (Atom(h, (Y, X)),)))
            rules.append(Rule(Atom(h, (X, Z)), (Atom(other, (X, Y)), Atom(base.predicate, (Y, Z)))))
    return rules


@st.composite
def programs(draw: st.DrawFn, robust_errors: bool = False) -> Program:
    """A random valid program of 1..6 rules.

    With ``robust_errors``, whether a run-time error happens does not depend on the order in
    which an engine evaluates body items: an item that can raise (an ordering comparison on
    a variable that may hold an IRI, a bind) only appears in a rule body made of exactly one
    positive atom and that item (plus maybe a comparison on the bind's result), so it is
    evaluated on exactly the atom's matches, whatever the plan. Rules with joins or negation
    only get ``=``/``!=`` comparisons and negations, which never raise.
    """
    names = draw(
        st.lists(
            st.tuples(st.sampled_from(["q0", "q1", "q2"]), st.sampled_from([1, 2, 2, 3])),
            min_size=1,
            max_size=3,
            unique=True,
        )
    )
    idb = [Relation(name, arity, draw(st.integers(0, TOP_LEVEL))) for name, arity in names]
    first: list[Rule] = []  # kept when the program is cut to MAX_RULES
    if draw(st.booleans()):
        agg = Relation("a0", draw(st.integers(1, 3)), draw(st.integers(0, TOP_LEVEL)), True)
        rule = _aggregate_rule(draw, agg, EDB_RELATIONS + idb, robust_errors)
        first.append(rule)
        idb.append(Relation("a0", rule.head.arity, agg.level, True))
    relations = EDB_RELATIONS + idb
    derived = [rel for rel in idb if not rel.aggregate]
    first += [_generic_rule(draw, rel, relations, robust_errors, True) for rel in derived]
    more: list[Rule] = []
    for rel in derived:
        if rel.arity == 2 and draw(st.integers(0, 2)) == 0:
            more += _template_rules(draw, rel, relations)
        if draw(st.booleans()):
            more.append(_generic_rule(draw, rel, relations, robust_errors, False))
    rules = list(dict.fromkeys(first + more))[:MAX_RULES]  # identical rules share one id
    return Program(tuple(draw(st.permutations(rules))))


def edb_relations(program: Program) -> tuple[str, ...]:
    """The EDB relations the program reads (all of them if it reads none)."""
    read = {rel for rule in program.rules for rel, _ in rule.body_relations()}
    return tuple(name for name, kinds in EDB.items() if (name, len(kinds)) in read) or tuple(EDB)


def idb_relations(program: Program) -> tuple[Relation, ...]:
    """The program's derived relations that may also receive explicit facts (not ``a0``)."""
    heads = {rule.head.relation for rule in program.rules if rule.aggregate() is None}
    return tuple(Relation(name, arity, 0) for name, arity in sorted(heads))


@st.composite
def program_and_facts(draw: st.DrawFn, robust_errors: bool = False) -> tuple[Program, list[tuple]]:
    """A program and a fact list; a few facts may be explicit facts of derived relations.

    The number of facts is drawn *before* the program: hypothesis makes values drawn after
    many other choices small far more often (mostly 0..4 facts here otherwise), and a nearly
    empty EDB derives nothing."""
    size = draw(st.integers(0, MAX_FACTS))
    program = draw(programs(robust_errors))
    return program, draw(fact_sets(edb_relations(program), idb_relations(program), size))


# --- Rule pools for incremental (stateful) tests ------------------------------------------------
#
# ``tests/engine/test_incremental_differential.py`` inserts and deletes rules of a *pool* (a
# program) at random, so every subset of a pool must be valid: the pools below keep the level
# discipline of :func:`programs` (a rule at level L reads positively levels <= L, under negation or
# inside an aggregate only levels < L; every aggregate head has exactly one rule), so any subset is
# stratifiable and, rule by rule, safe. :func:`programs` rarely produces the shapes incremental
# maintenance finds hard, so :func:`motif_programs` assembles them from named motifs over fixed
# relations: mutual recursion, hyper-nodes that one rule merges and whose deletion splits them,
# one predicate derived in several hyper-nodes, negation and aggregates over recursive IDB
# relations, symmetric-transitive closures with ``X != Z``.

_X, _Y, _Z, _V, _C, _E = (Variable(name) for name in ("X", "Y", "Z", "V", "C", "E0"))
_W, _U, _B = (Variable(name) for name in ("W", "U", "B0"))


def _a(predicate: str, *terms: object) -> Atom:
    """An atom; a term that is not a Variable is a constant."""
    return Atom(predicate, tuple(t if isinstance(t, Variable) else Constant(t) for t in terms))


def _r(head: Atom, *body: object) -> Rule:
    return Rule(head, tuple(body))


def _agg(
    head: Atom, body: tuple, group: tuple, function: str, argument: Variable | Constant
) -> Rule:
    return Rule(head, (Aggregate(body, group, function, argument, head.terms[-1]),))


# IDB relations of the motifs: name -> (arity, level, aggregate). Columns hold IRIs, except the
# last column of an aggregate head (a number).
MOTIF_RELATIONS: dict[str, tuple[int, int, bool]] = {
    "p": (2, 0, False),
    "q": (2, 0, False),
    "r": (2, 0, False),
    "c": (1, 0, False),
    "n": (1, 1, False),
    "s": (2, 1, False),
    "t": (2, 1, False),
    "a0": (2, 1, True),
    "a1": (2, 1, True),
    "a2": (1, 1, True),
    "m": (1, 2, False),
    "big": (1, 2, False),
    "a3": (2, 2, True),
    # derived by cyclic rules (decompositions); "hv" carries a number in its last column
    "h": (2, 1, False),
    "hv": (2, 1, True),
    "k": (1, 2, False),
}

MOTIFS: dict[str, tuple[Rule, ...]] = {
    # p: a base rule and a transitive closure (two hyper-nodes deriving p).
    "tc_p": (
        _r(_a("p", _X, _Y), _a("e1", _X, _Y)),
        _r(_a("p", _X, _Z), _a("p", _X, _Y), _a("e1", _Y, _Z)),
    ),
    # q: a base rule and a doubly recursive closure.
    "tc2_q": (
        _r(_a("q", _X, _Y), _a("e1", _Y, _X)),
        _r(_a("q", _X, _Z), _a("q", _X, _Y), _a("q", _Y, _Z)),
    ),
    # p :- q, q :- p: mutual recursion; with tc_p and tc2_q it merges their hyper-nodes.
    "bridge_pq": (
        _r(_a("q", _X, _Y), _a("p", _X, _Y)),
        _r(_a("p", _X, _Y), _a("q", _Y, _X)),
    ),
    # p -> q -> r -> p: a cycle through three one-rule hyper-nodes.
    "cycle_pqr": (
        _r(_a("q", _X, _Y), _a("p", _X, _Y)),
        _r(_a("r", _X, _Y), _a("q", _Y, _X)),
        _r(_a("p", _X, _Y), _a("r", _X, _Y), Comparison(_X, "!=", _Y)),
    ),
    # r: symmetric-transitive closure with X != Z (benchmark rule sets 1-3).
    "symtrans_r": (
        _r(_a("r", _X, _Y), _a("e4", _X, _Y, _V)),
        _r(_a("r", _X, _Y), _a("r", _Y, _X)),
        _r(_a("r", _X, _Z), _a("r", _X, _Y), _a("r", _Y, _Z), Comparison(_X, "!=", _Z)),
    ),
    "cyclic": (
        _r(_a("c", _X), _a("p", _X, _X)),
        _r(_a("c", _X), _a("r", _X, "c0")),
    ),
    # Negation on recursive IDB relations: deleting an e1 fact can make n facts appear (a node
    # left without successors, a pair left without a path back).
    "negation": (
        _r(_a("n", _X), _a("e1", _Y, _X), Negation(_a("p", _X, _E))),
        _r(_a("n", _X), _a("e1", _X, _Y), Negation(_a("q", _X, _Y))),
    ),
    # Negation of a relation itself defined with negation.
    "double_negation": (
        _r(_a("m", _X), _a("e3", _X), Negation(_a("n", _X))),
        _r(_a("m", _X), _a("e1", _X, _Y), Negation(_a("n", _Y))),
        _r(_a("m", _X), _a("e1", _X, _Y), Negation(_a("c", _Y))),
    ),
    # Aggregates over recursive relations, and a rule reading an aggregate.
    "count_p": (
        _agg(_a("a0", _X, _C), (_a("p", _X, _Y),), (_X,), "count", _Y),
        _r(_a("big", _X), _a("a0", _X, _C), Comparison(_C, ">=", Constant(2))),
    ),
    "sum_q": (_agg(_a("a1", _X, _C), (_a("q", _X, _Y), _a("e2", _Y, _V)), (_X,), "sum", _V),),
    "count_r": (_agg(_a("a2", _C), (_a("r", _X, _Y),), (), "count", _X),),
    # Level 1: a symmetric-transitive closure over p (reflexive: no X != Z), and an aggregate
    # over it.
    "symtrans_s": (
        _r(_a("s", _X, _Y), _a("p", _X, _Y)),
        _r(_a("s", _X, _Y), _a("s", _Y, _X)),
        _r(_a("s", _X, _Z), _a("s", _X, _Y), _a("s", _Y, _Z)),
        _agg(_a("a3", _X, _C), (_a("s", _X, _Y), _a("e2", _Y, _V)), (_X,), "med", _V),
    ),
    # Cyclic rules (hypertree decompositions): a triangle, a recursive triangle with a
    # comparison, a 4-cycle over three relations, a 6-cycle, a 4-clique and a petal, with
    # negation, constants and binds.
    "triangles": (
        _r(_a("h", _X, _Z), _a("e1", _X, _Y), _a("e1", _Y, _Z), _a("e1", _Z, _X)),
        _r(
            _a("h", _X, _Z),
            _a("h", _X, _Y),
            _a("p", _Y, _Z),
            _a("e1", _Z, _X),
            Comparison(_X, "!=", _Y),
        ),
    ),
    "cycles": (
        _r(_a("h", _X, _W), _a("e1", _X, _Y), _a("p", _Y, _Z), _a("e1", _Z, _W), _a("q", _W, _X)),
        _r(
            _a("k", _X),
            _a("e1", _X, _Y),
            _a("h", _Y, _Z),
            _a("e1", _Z, _U),
            _a("e1", _U, _V),
            _a("h", _V, _W),
            _a("e1", _W, _X),
            Negation(_a("n", _Z)),
        ),
    ),
    "cliques": (
        _r(
            _a("h", _X, _Y),
            _a("e1", _X, _Y),
            _a("e1", _X, _Z),
            _a("e1", _Y, _Z),
            _a("e1", _X, _W),
            _a("h", _Y, _W),
            _a("e1", _Z, _W),
        ),
        _r(  # a petal: three paths from X to Y
            _a("h", _X, _Y),
            _a("e1", _X, _Z),
            _a("e1", _Z, _Y),
            _a("q", _X, _W),
            _a("q", _W, _Y),
            _a("e1", _X, _U),
            _a("p", _U, _Y),
            Negation(_a("c", _U)),
        ),
    ),
    "cyclic_values": (
        _r(
            _a("hv", _X, _B),
            _a("e1", _X, _Y),
            _a("e1", _Y, _Z),
            _a("e1", _Z, _X),
            _a("e2", _X, _V),
            _a("e2", _Z, _W),
            Bind(BinaryOp("+", _V, _W), _B),
            Comparison(_V, "<", _W),
        ),
        _r(_a("h", _X, _Y), _a("e1", _X, _Y), _a("e1", _Y, "c1"), _a("e1", "c1", _X)),
    ),
    # Several heads sharing a cyclic body, and a skolem IRI per pair.
    "multi_head": (
        Rule(
            _a("h", _X, _Z),
            (_a("e1", _X, _Y), _a("q", _Y, _Z), _a("e1", _Z, _X)),
            more_heads=(_a("k", _Y), _a("h", _Y, _X)),
        ),
        Rule(
            _a("hv", _X, _B),
            (_a("e1", _X, _Y), _a("e1", _Y, _X), Bind(Call("skolem", (_X, _Y)), _B)),
        ),
    ),
    # Level 1: recursion with negation of a lower level inside the recursive rules.
    "negated_closure": (
        _r(_a("t", _X, _Y), _a("q", _X, _Y), Negation(_a("c", _Y))),
        _r(_a("t", _X, _Z), _a("t", _X, _Y), _a("p", _Y, _Z), Negation(_a("c", _Z))),
    ),
    # Merges the s and t hyper-nodes (level 1).
    "bridge_st": (
        _r(_a("s", _X, _Y), _a("t", _X, _Y)),
        _r(_a("t", _X, _Y), _a("s", _Y, _X), Negation(_a("c", _X))),
    ),
}


def motif_relations() -> list[Relation]:
    return [
        Relation(name, arity, level, aggregate)
        for name, (arity, level, aggregate) in MOTIF_RELATIONS.items()
    ]


# How often each motif is in a pool, in tenths: base closures most often, so that bridges find
# something to merge.
MOTIF_WEIGHTS: dict[str, int] = {
    "tc_p": 7,
    "tc2_q": 6,
    "bridge_pq": 5,
    "cycle_pqr": 4,
    "symtrans_r": 4,
    "cyclic": 3,
    "negation": 6,
    "double_negation": 4,
    "count_p": 4,
    "sum_q": 3,
    "count_r": 3,
    "symtrans_s": 4,
    "negated_closure": 3,
    "bridge_st": 3,
    "triangles": 4,
    "cycles": 4,
    "cliques": 3,
    "cyclic_values": 3,
    "multi_head": 3,
}


@st.composite
def motif_programs(draw: st.DrawFn, most_generic: int = 2) -> Program:
    """A pool of motifs (see ``MOTIFS``; each drawn independently, ``MOTIF_WEIGHTS`` times in
    ten, at least two) plus up to ``most_generic`` random rules over the same relations,
    identical rules merged, in a random order: about 12 rules."""
    names = [name for name, weight in MOTIF_WEIGHTS.items() if draw(st.integers(0, 9)) < weight]
    while len(names) < 2:
        name = draw(st.sampled_from(sorted(MOTIFS)))
        names += [] if name in names else [name]
    rules = [rule for name in names for rule in MOTIFS[name]]
    relations = EDB_RELATIONS + motif_relations()
    heads = [rel for rel in relations if rel.level >= 0 and not rel.aggregate]
    for _ in range(draw(st.integers(0, most_generic))):
        head = draw(st.sampled_from(heads))
        rules.append(_generic_rule(draw, head, relations, False, draw(st.booleans())))
    return Program(tuple(draw(st.permutations(list(dict.fromkeys(rules))))))


def incremental_programs() -> st.SearchStrategy[Program]:
    """Rule pools for the stateful tests: motif pools twice as often as :func:`programs`."""
    return st.one_of(motif_programs(), programs(), motif_programs())


# --- Labels: rules as the cloud sends them ------------------------------------------------------
#
# Bundles name their rules (``hot: ...``) and replace a rule by deleting its label and adding a
# new body under the same label in one update. A pool relabelled by :func:`labelled` gives some
# rules a label from a small set, so that several bodies compete for one label (a replacement,
# or a label deleted and later re-added with another body), and now and then gives one body a
# second label (two names for one rule: deleting one name keeps the rule).

LABELS = ("r1", "r2", "r3", "r4")


@st.composite
def labelled(draw: st.DrawFn, pools: st.SearchStrategy[Program]) -> Program:
    """A pool from ``pools`` in which about half the rules carry a label from ``LABELS`` and
    a few carry two (the same rule twice, under two labels)."""
    rules: list[Rule] = []
    for rule in draw(pools).rules:
        roll = draw(st.integers(0, 7))
        if roll < 4:
            rules.append(rule)
            continue
        first = draw(st.sampled_from(LABELS))
        rules.append(Rule(rule.head, rule.body, first))
        if roll == 7:
            second = draw(st.sampled_from([name for name in LABELS if name != first]))
            rules.append(Rule(rule.head, rule.body, second))
    return Program(tuple(dict.fromkeys(rules)))


def _relation_kinds(program: Program) -> tuple[dict, dict]:
    """Column kinds of the EDB relations the program reads and of its derived relations."""
    edb = {name: EDB[name] for name in edb_relations(program)}
    idb: dict[tuple[str, int], tuple[str, ...]] = {}
    for rule in program.rules:
        name, arity = rule.head.relation
        if name in MOTIF_RELATIONS and MOTIF_RELATIONS[name][0] == arity:
            kinds = ("iri",) * arity
            if MOTIF_RELATIONS[name][2]:
                kinds = (*kinds[:-1], "num")
        else:
            kinds = ("any",) * arity
        idb[(name, arity)] = kinds
    return edb, idb


@st.composite
def pool_facts(draw: st.DrawFn, program: Program, derived: int = 5) -> tuple:
    """One logical fact for a rule pool: over an EDB relation it reads, or (1 time in
    ``derived``) an explicit fact of one of its derived relations, aggregate heads included."""
    edb, idb = _relation_kinds(program)
    if idb and draw(st.integers(0, derived - 1)) == 0:
        (name, _), kinds = draw(st.sampled_from(sorted(idb.items())))
    else:
        name = draw(st.sampled_from(sorted(edb)))
        kinds = edb[name]
    return (name, *(_value(draw, kind) for kind in kinds))


# --- Closure pools: RS1/RS2/RS3-like programs over a small graph -------------------------------

_T, _M, _D, _N = (Variable(name) for name in ("T", "M", "D", "N"))

CLOSURE_FAMILIES: dict[str, tuple[Rule, ...]] = {
    # Rule set 1: nb is symmetric-transitive (explicit nb facts are the edges), with aggregates
    # over it, a rule on an aggregate result and a bind.
    "rs1": (
        _r(_a("nb", _X, _Y), _a("nb", _Y, _X)),
        _r(_a("nb", _X, _Y), _a("nb", _X, _Z), _a("nb", _Z, _Y), Comparison(_X, "!=", _Y)),
        _agg(_a("nbcount", _X, _N), (_a("nb", _X, _Y), _a("temp", _Y, _T)), (_X,), "count", _T),
        _agg(_a("nbmed", _X, _M), (_a("nb", _X, _Y), _a("temp", _Y, _T)), (_X,), "med", _T),
        # The same shape (read a subject at a time) with another function, the columns and the
        # body's order swapped, and with a constant argument.
        _agg(_a("nbsum", _X, _M), (_a("temp", _Y, _T), _a("nb", _Y, _X)), (_X,), "sum", _T),
        _agg(
            _a("nbone", _X, _N), (_a("nb", _X, _Y), _a("temp", _Y, _T)), (_X,), "sum", Constant(1)
        ),
        _r(_a("crowded", _X), _a("nbcount", _X, _N), Comparison(_N, ">=", Constant(3))),
        _r(
            _a("anomaly", _X),
            _a("nbmed", _X, _M),
            _a("crowded", _X),
            _a("temp", _X, _T),
            Bind(Call("abs", (BinaryOp("-", _T, _M),)), _D),
            Comparison(_D, ">", Constant(2)),
        ),
    ),
    # Rule sets 2 and 3 (r10 and r10new are both kept).
    "rs3": (
        _r(_a("p11", _X, _Y), _a("p1", _X, _Y)),
        _r(_a("p11", _X, _Y), _a("p11", _Y, _X)),
        _r(_a("p11", _X, _Y), _a("p11", _X, _Z), _a("p11", _Z, _Y), Comparison(_X, "!=", _Y)),
        _r(_a("p12", _X, _Y), _a("p2", _X, _Y)),
        _r(_a("p12", _X, _Y), _a("p12", _X, _Z), _a("p12", _Z, _Y), Comparison(_X, "!=", _Y)),
        _r(_a("p13", _X, _Y), _a("p3", _X, _Y)),
        _r(_a("p14", _X, _Y), _a("p13", _X, _Y)),
        _r(_a("p13", _X, _Y), _a("p14", _Y, _X)),
        _r(_a("p20", _X, _Y), _a("p11", _X, _Y)),
        _r(_a("p20", _X, _Y), _a("p12", _X, _Y)),
        _r(_a("p20", _X, _Y), _a("p12", _X, _Y), Negation(_a("p13", _Y, _Z))),
        _r(_a("p20", _X, _Y), _a("p13", _X, _Y)),
        _r(_a("p21", _X, _Y), _a("p20", _X, _Y)),
        _r(_a("p22", _X, _Y), _a("p21", _X, _Y)),
        _r(_a("p20", _X, _Y), _a("p22", _X, _Y)),
        _r(_a("p25", _X, _Z), _a("p11", _X, _Y), _a("p12", _Y, _Z), Negation(_a("p5", _Y, _Z))),
        _r(_a("p26", _X, _Z), _a("p12", _X, _Y), _a("p13", _Z, _Y), Negation(_a("p5", _Z, _Y))),
        _r(_a("p30", _X, _Z), _a("p22", _X, _Y), _a("p21", _Y, _Z)),
        _r(_a("p31", _X, _Y), _a("p25", _X, _Y), _a("p26", _Y, _Z)),
    ),
    # Transitive closure (linear), reachability counts, cycles, negation of the closure.
    "tc": (
        _r(_a("t", _X, _Y), _a("e", _X, _Y)),
        _r(_a("t", _X, _Z), _a("t", _X, _Y), _a("e", _Y, _Z)),
        _agg(_a("reach", _X, _N), (_a("t", _X, _Y),), (_X,), "count", _Y),
        _r(_a("oncycle", _X), _a("t", _X, _X)),
        # A semi-join over the closure: the reached nodes that have no edge out.
        _r(_a("tend", _X, _Y), _a("t", _X, _Y), Negation(_a("e", _Y, _E))),
        _r(_a("lonely", _X), _a("node", _X), Negation(_a("t", _X, _E))),
        _r(
            _a("apart", _X, _Y),
            _a("node", _X),
            _a("node", _Y),
            Comparison(_X, "!=", _Y),
            Negation(_a("t", _X, _Y)),
        ),
    ),
    # Closures without X != Z: a transitive one (u) and a symmetric-transitive one (v).
    "plain": (
        _r(_a("u", _X, _Y), _a("e", _X, _Y)),
        _r(_a("u", _X, _Z), _a("u", _X, _Y), _a("u", _Y, _Z)),
        _r(_a("v", _X, _Y), _a("p1", _Y, _X)),
        _r(_a("v", _X, _Y), _a("v", _Y, _X)),
        _r(_a("v", _X, _Z), _a("v", _X, _Y), _a("v", _Y, _Z)),
        _agg(_a("ucount", _X, _N), (_a("u", _X, _Y),), (_X,), "count", _Y),
        _r(_a("acyclic", _X), _a("node", _X), Negation(_a("u", _X, _X))),
        _r(_a("vself", _X), _a("v", _X, _X)),
        # Semi-joins over the closures: filters on the object (another closure) and subject.
        _r(_a("ulinked", _X, _Y), _a("u", _X, _Y), _a("v", _Y, _E)),
        _r(_a("unoded", _X, _Y), _a("node", _X), _a("u", _X, _Y), Negation(_a("e", _E, _X))),
    ),
    # Linear closures (modules/linear.py): left-linear over a copy of p1, right-linear over a
    # filtered copy of e and a copy of p2 stepping along p3, left-linear along a derived
    # relation (t), their readers, and a rule that merges l's step with p1's node.
    "linear": (
        _r(_a("l", _X, _Y), _a("p1", _X, _Y)),
        _r(_a("l", _X, _Z), _a("e", _X, _Y), _a("l", _Y, _Z)),
        _r(_a("m", _X, _Y), _a("e", _X, _Y), Comparison(_X, "!=", _Y)),
        _r(_a("m", _X, _Y), _a("p2", _X, _Y)),
        _r(_a("m", _X, _Z), _a("m", _X, _Y), _a("p3", _Y, _Z)),
        _r(_a("k", _X, _Y), _a("e", _Y, _X)),
        _r(_a("k", _X, _Z), _a("t", _X, _Y), _a("k", _Y, _Z)),
        _agg(_a("mcount", _X, _N), (_a("m", _X, _Y),), (_X,), "count", _Y),
        _r(_a("lnot", _X, _Y), _a("node", _X), _a("node", _Y), Negation(_a("l", _X, _Y))),
        _r(_a("p1", _X, _Y), _a("l", _Y, _X)),
    ),
    # Rules merging closures of different families into one hyper-node.
    "bridges": (
        _r(_a("u", _X, _Y), _a("v", _X, _Y)),
        _r(_a("v", _X, _Y), _a("u", _Y, _X)),
        _r(_a("p11", _X, _Y), _a("nb", _X, _Y)),
        _r(_a("nb", _X, _Y), _a("p11", _Y, _X)),
        _r(_a("p13", _X, _Y), _a("p12", _X, _Y)),
        _r(_a("p12", _X, _Y), _a("p13", _Y, _X)),
        _r(_a("t", _X, _Y), _a("p12", _X, _Y)),
    ),
}

# Relations that receive explicit facts in closure tests: edges (some of them explicit facts of
# derived relations), negated edges, readings and nodes.
CLOSURE_EDGES = ("nb", "p1", "p2", "p3", "e")
CLOSURE_DERIVED_EDGES = ("p11", "p12", "p13", "t", "u", "v", "l", "m", "k")
TEMPERATURES = [20, 21, 22, 23, 24, 25, 26, 21.5]


# How often each closure family is in a pool, in tenths.
CLOSURE_WEIGHTS = {"rs1": 5, "rs3": 5, "tc": 4, "plain": 5, "linear": 5, "bridges": 3}


@st.composite
def closure_pools(draw: st.DrawFn) -> Program:
    """The rules of some closure families (``CLOSURE_FAMILIES``, each ``CLOSURE_WEIGHTS``
    times in ten, at least one closure), in a random order."""
    names = [name for name, weight in CLOSURE_WEIGHTS.items() if draw(st.integers(0, 9)) < weight]
    if not set(names) - {"bridges"}:
        names.append(draw(st.sampled_from(["rs1", "rs3", "tc", "plain", "linear"])))
    rules = [rule for name in names for rule in CLOSURE_FAMILIES[name]]
    return Program(tuple(draw(st.permutations(list(dict.fromkeys(rules))))))


# --- Seeded random fact updates (module tests driven by random.Random, not hypothesis) ---------


def random_fact_updates(reasoner, rng, facts: list[tuple], steps: int = 6):
    """Apply ``steps`` random updates to ``reasoner``, yielding after each: deletions of none,
    one, two, a third or half of its explicit facts, mixed with insertions of none, one, three
    or a quarter of ``facts``."""
    for _ in range(steps):
        explicit = sorted(reasoner.edb_facts(), key=repr)  # (values of several types)
        size = rng.choice([0, 1, 2, len(explicit) // 3, len(explicit) // 2])
        gone = rng.sample(explicit, k=min(size, len(explicit)))
        new = rng.sample(facts, k=rng.choice([0, 1, 3, len(facts) // 4]))
        reasoner.update(add_facts=new, delete_facts=gone)
        yield
