"""Compiles a plan into a Python function of nested loops over index lookups on term ids.

For one rule and one delta position the generated function looks like::

    def rule(S, D, out, ERR, GUARD):
        I1_0 = S[1][0].index((0,))
        for _once in ONCE:
            for v0, v1 in D:                      # Δ p11(X, Z)
                B = I1_0.get(v1)                  # p11(Z, Y) via the index on column 0
                if B is None: continue
                if v0 in B: B = B - {v0}          # COMP(X, !=, Y) as a set difference
                out.update(zip(repeat(v0), B))    # head p11(X, Y), built in C

No dictionary of bindings per match: variables are Python locals holding term ids. ``S`` gives,
per body position, the list of relations the atom reads (a DataStoreBag lookup done once per
call), ``D`` the delta set when the plan has a delta atom, ``out`` the set receiving head tuples,
``ERR`` the executor's ErrorCount of run-time errors (a failing bind or comparison drops the
substitution and counts, see docs/semantics.md) and ``GUARD`` the update's budget guard: the
outermost loop over facts starts with ``if len(out) > GUARD.cap: GUARD.pulse(out)`` (budget.py).

The compiler decides nothing about the code's shape: ``rewrites.choose_shape`` turns the plan into a
node (nested loops, or one of the faster shapes, each in its own module under ``rewrites/``
with the code before and after in its docstring) and the compiler emits code for that node.
The code is compiled under a filename naming the rule, its variant, delta position and shape,
so tracebacks and profiles say which rule ran.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from itertools import compress, repeat
from operator import and_, itemgetter, not_, or_
from types import CodeType

from agent.engine import values
from agent.engine.language import Atom, BinaryOp, Call, Comparison, Constant, Expr, Term, Variable
from agent.engine.plan.planner import FilterStep, NegationStep, Plan, ScanStep
from agent.engine.plan.rewrites import (
    Context,
    Empty,
    ExistsSplit,
    GroupedJoin,
    KeyFilter,
    Node,
    Product,
    Projection,
    Shape,
    choose_shape,
)
from agent.engine.plan.rewrites.product import excluded_by, free_terms, is_term, new_variable
from agent.engine.terms import TermDictionary
from agent.engine.values import EVAL_ERRORS

RUNTIME = {
    "ONCE": (None,),
    "repeat": repeat,
    "COLUMN": itemgetter,
    "compress": compress,
    "NOT": not_,
    "AND": and_,
    "OR": or_,
    "EVAL_ERRORS": EVAL_ERRORS,
    **values.RUNTIME,  # the language's operators, by their code names
}
# Calls nested in one generated expression before the inner ones go to a temporary (Python
# refuses more than 200 nested parentheses; see Compiler.value_code).
SPILL_DEPTH = 32
# Python allows 20 statically nested blocks in a function: deeper plans are split into nested
# functions (see ``_RuleGenerator.regenerate_segmented``).
MAX_NESTING = 17
SEGMENT_NESTING = 12

FUNCTION = "rule"  # the generated function's name; its filename names the rule and shape
HEADER = f"def {FUNCTION}(S, D, out, ERR, GUARD):"
CompiledRule = Callable[[Sequence[list], object, set, list, object], None]


class _Emitter:
    """Source text with indentation, plus the constants the code refers to."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.depth = 1

    def line(self, text: str) -> None:
        self.lines.append("    " * self.depth + text)

    def indent(self) -> None:
        self.depth += 1


class RuleCompiler:
    """Generates code for plans; keeps no plans (the executor caches them by rule, variant,
    delta position and sources). Python's compilation of the text is shared process-wide
    (``code_of``)."""

    def __init__(self, terms: TermDictionary) -> None:
        self.terms = terms

    def compile(
        self,
        plan: Plan,
        source_counts: dict[int, int],
        head_terms: Sequence[Term] | None = None,
        name: str = "rule",
        exists: bool = False,
    ) -> Compiled:
        """The function for ``plan``, with its node (shape and description) and source.

        ``exists``: the caller only needs to know whether each head has *some* match (checking
        candidate facts with the head bound): see ``rewrites/exists.py``. ``name`` names the
        code in tracebacks and profiles (with the shape appended)."""
        head = tuple(plan.rule.head.terms if head_terms is None else head_terms)
        node = choose_shape(plan, Context(head, source_counts, exists))
        generator = _RuleGenerator(self.terms, node, source_counts, head)
        source, shape = generator.generate()
        namespace = dict(RUNTIME)
        namespace["V"] = self.terms.values
        namespace["ENC"] = self.terms.encode
        namespace["KV"] = generator.constant_values
        exec(code_of(source, f"<{name} {shape.value}>"), namespace)  # noqa: S102 - generated code
        # Popped, not read: a function left in its own globals would form a reference cycle,
        # which the frozen collector (gcpause) would never reclaim after the rule is deleted.
        return Compiled(namespace.pop(FUNCTION), node, shape, source)


@lru_cache(maxsize=1024)
def code_of(source: str, filename: str) -> CodeType:
    """Python's compilation of generated source, shared by every reasoner of the process.

    Each reasoner caches its own plans, but a reasoner that is new (the equality layer's
    rounds and the Spark job's per-hyper-node evaluations make one each time, an agent
    makes one at every reload) would otherwise compile the same text again; that is most of
    a small rule's compilation time. A code object is immutable and names no term: the ids
    are literals of the text, so equal texts compile to the same code."""
    return compile(source, filename, "exec")


@dataclass(frozen=True)
class Compiled:
    """A compiled plan: ``shape`` is the node's, or ``SEGMENTED`` when the plan was too deep
    for one Python function."""

    function: CompiledRule
    node: Node
    shape: Shape
    source: str


class _RuleGenerator:
    """Python source for one node; emits, never decides (the rewrites did)."""

    def __init__(
        self,
        terms: TermDictionary,
        node: Node,
        source_counts: dict[int, int],
        head_terms: tuple[Term, ...],
    ) -> None:
        self.terms = terms
        self.node = node
        self.plan = node.plan
        self.counts = source_counts
        self.head_terms = head_terms
        self.names: dict[Variable, str] = {}
        self.constant_values: list = []
        self.out = _Emitter()
        self.temp = 0

    # -- names -------------------------------------------------------------------------
    def var(self, variable: Variable) -> str:
        name = self.names.get(variable)
        if name is None:
            name = self.names[variable] = f"v{len(self.names)}"
        return name

    def fresh(self) -> str:
        self.temp += 1
        return f"t{self.temp}"

    def term_id(self, term: Term) -> str:
        """Code for a term's id: a bound variable's local, or a constant's id as a literal."""
        if isinstance(term, Variable):
            return self.names[term]
        return str(self.terms.encode(term.value))

    def value_code(self, expr: Expr, spilled: list[str]) -> str:
        """Code computing an expression's Python value. Sub-expressions nested deeper than
        SPILL_DEPTH calls are computed first into temporaries, whose assignments are appended
        to ``spilled`` (to run before the code, in the same ``try``): Python refuses more than
        200 nested parentheses in one expression, and the language allows 256 operators
        (a sum of 230 terms is 229 nested calls)."""
        code, _ = self._value_code(expr, spilled)
        return code

    def _value_code(self, expr: Expr, spilled: list[str]) -> tuple[str, int]:
        """(code, how many calls deep it nests)."""
        if isinstance(expr, Variable):
            return f"V[{self.names[expr]}]", 0
        if isinstance(expr, Constant):
            value = expr.value
            if value.__class__ in (int, float) and math.isfinite(value):
                return repr(value), 0
            self.constant_values.append(value)
            return f"KV[{len(self.constant_values) - 1}]", 0
        if isinstance(expr, BinaryOp):
            function, operands = values.ARITHMETIC[expr.op].code, (expr.left, expr.right)
        else:
            assert isinstance(expr, Call)
            function, operands = values.FUNCTIONS[expr.function].code, expr.args
        parts = [self._value_code(operand, spilled) for operand in operands]
        code = f"{function}({', '.join(part for part, _ in parts)})"
        depth = 1 + max((depth for _, depth in parts), default=0)
        if depth < SPILL_DEPTH:
            return code, depth
        temporary = self.fresh()
        spilled.append(f"{temporary} = {code}")
        return temporary, 0

    @staticmethod
    def key_code(parts: list[str]) -> str:
        return parts[0] if len(parts) == 1 else "(" + ", ".join(parts) + ")"

    @staticmethod
    def tuple_code(parts: list[str]) -> str:
        return "(" + ", ".join(parts) + ("," if len(parts) == 1 else "") + ")"

    # -- generation --------------------------------------------------------------------
    def generate(self) -> tuple[str, Shape]:
        source, shape = self.generate_flat(), self.node.shape
        depth = max(len(line) - len(line.lstrip()) for line in source.splitlines()) // 4
        if depth > MAX_NESTING:
            lines = [HEADER, *self.regenerate_segmented()]
            source, shape = "\n".join(lines) + "\n", Shape.SEGMENTED
        return with_budget_pulse(source), shape

    def generate_flat(self) -> str:
        node, out = self.node, self.out
        if isinstance(node, Empty):
            body = ["    return"]
        elif isinstance(node, Projection):
            body = self.emit_projection(node)
        elif isinstance(node, KeyFilter):
            body = self.emit_key_filter(node)
        else:
            self.emit_preamble(self.plan.steps[0] if isinstance(node, GroupedJoin) else None)
            out.line("for _once in ONCE:")
            out.indent()
            if isinstance(node, ExistsSplit):
                body = self.emit_exists(node.split)
            else:
                if isinstance(node, GroupedJoin):
                    self.emit_grouped(node)
                elif isinstance(node, Product):
                    self.emit_steps(self.plan.steps[: node.at])
                    self.emit_product(self.plan.steps[node.at], self.plan.steps[node.at + 1 :])
                else:
                    self.emit_steps(self.plan.steps)
                    self.emit_head()
                body = out.lines
        return "\n".join([HEADER, *body]) + "\n"

    def emit_head(self) -> None:
        head = [self.term_id(t) for t in self.head_terms]
        self.out.line(f"out.add({self.tuple_code(head)})")

    # -- deep plans: loops nested in several functions ----------------------------------
    def regenerate_segmented(self) -> list[str]:
        """The plan again, its loops spread over nested functions ``_seg1``, ``_seg2``...,
        each called from the innermost loop of the one before with the variables bound so
        far. Python refuses more than 20 statically nested blocks in one function (and a
        rule of 10 atoms over two stores each needs 21), so a plan deeper than
        ``MAX_NESTING`` is cut every ``SEGMENT_NESTING`` levels. The C-level innermost step
        is not used here: such rules are rare, and correctness is the point."""
        self.names, self.temp, self.constant_values = {}, 0, []
        self.out = _Emitter()
        self.emit_preamble()
        preamble = self.out.lines
        main = _Emitter()
        main.line("for _once in ONCE:")
        main.indent()
        self.out, current, segments = main, main, []
        for step in self.plan.steps:
            if current.depth >= SEGMENT_NESTING:
                name = f"_seg{len(segments) + 1}"
                params = ", ".join(self.names.values())
                current.line(f"{name}({params})")
                current = _Emitter()
                current.line(f"def {name}({params}):")
                current.indent()
                current.line("for _once in ONCE:")
                current.indent()
                segments.append(current)
                self.out = current
            self.emit_steps([step])
        self.emit_head()
        self.out = main
        return preamble + [line for segment in segments for line in segment.lines] + main.lines

    # -- projections (rewrites/projection.py) --------------------------------------------
    def emit_projection(self, node: Projection) -> list[str]:
        step, columns = node.step, list(node.columns)
        if step.delta:
            names, lines = ["D"], []
        else:
            names = self.sources(step, "T")
            lines = [f"    {name} = S[{step.position}][{j}].tuples" for j, name in enumerate(names)]
        identity = columns == list(range(step.atom.arity))
        for name in names:
            if identity:
                lines.append(f"    out.update({name})")
            else:
                maps = ", ".join(f"map(COLUMN({c}), {name})" for c in columns)
                lines.append(f"    out.update(zip({maps}))")
        return lines

    # -- key filters (rewrites/key_filter.py) ----------------------------------------------
    def emit_key_filter(self, node: KeyFilter) -> list[str]:
        main = node.main
        lines = []
        tests = []
        for n, test_of in enumerate(node.filters):
            step, columns, main_columns = test_of.step, test_of.columns, test_of.main_columns
            count = self.counts.get(step.position, 0)
            negated = test_of.negated
            if count == 0:  # (a positive atom with no store returned early in generate)
                continue  # nothing holds the negated relation: always true
            relations = [f"S[{step.position}][{j}]" for j in range(count)]
            arity = step.atom.arity
            if len(columns) < arity:
                keys = [f"{r}.index({columns!r})" for r in relations]
            elif arity == 1:
                keys = [f"set(map(COLUMN(0), {r}.tuples))" for r in relations]
            else:
                keys = [f"{r}.tuples" for r in relations]
            union = keys[0] if len(keys) == 1 else f"set().union({', '.join(keys)})"
            lines.append(f"    K{n} = {union}")
            getter = ", ".join(map(str, main_columns))
            test = f"map(K{n}.__contains__, map(COLUMN({getter}), T))"
            tests.append(f"map(NOT, {test})" if negated else test)
        if main.delta:
            tables = ["D"]
        else:
            tables = [f"S[{main.position}][{j}].tuples" for j in range(self.counts[main.position])]
        selector = tests[0] if tests else None
        for test in tests[1:]:
            selector = f"map(AND, {selector}, {test})"
        head = [main.atom.terms.index(t) for t in self.head_terms]
        identity = head == list(range(main.atom.arity))
        for table in tables:
            lines.append(f"    T = {table}")
            kept = f"compress(T, {selector})" if selector else "T"
            if identity:
                lines.append(f"    out.update({kept})")
            else:
                maps = ", ".join(f"map(COLUMN({c}), R)" for c in head)
                lines.append(f"    R = list({kept})")
                lines.append(f"    out.update(zip({maps}))")
        return lines

    # -- grouped joins (rewrites/grouped.py) -----------------------------------------------
    def emit_grouped(self, node: GroupedJoin) -> None:
        out, steps = self.out, self.plan.steps
        h, j, product_at = node.group, node.inner, node.at
        first, product = steps[0], steps[product_at]
        h_column = first.atom.terms.index(h)
        j_column = 1 - h_column
        hv, jv = self.var(h), self.var(j)
        if first.delta:
            out.line("G = {}")
            out.line("for t in D:")
            out.line(f"    G.setdefault(t[{h_column}], []).append(t[{j_column}])")
            groups = "G"
        else:
            names = []
            for k in range(self.counts.get(first.position, 0)):
                names.append(f"G{k}")
                out.line(f"G{k} = S[{first.position}][{k}].index(({h_column},))")
            groups = self.open_source_loop(names)
        out.line(f"for {hv}, J in {groups}.items():")
        out.indent()
        outer = out.depth
        out.line("A = set()")
        out.line(f"for {jv} in J:")
        out.indent()
        self.emit_steps(steps[1:product_at])
        key = self.key_code([self.term_id(product.atom.terms[c]) for c in self.keyed(product)])
        index = self.open_source_loop(self.sources(product, "I"))
        bucket = self.fresh()
        out.line(f"{bucket} = {index}.get({key})")
        out.line(f"if {bucket} is not None: A |= {bucket}")
        out.depth = outer
        new = new_variable(product)
        for other in excluded_by(steps[product_at + 1 :], new):
            out.line(f"A.discard({self.term_id(other)})")
        columns = ["A" if t == new else f"repeat({self.term_id(t)})" for t in self.head_terms]
        out.line(f"if A: out.update(zip({', '.join(columns)}))")

    # -- existence checks (rewrites/exists.py) ---------------------------------------------
    def emit_steps(self, steps: Sequence) -> None:
        for step in steps:
            if isinstance(step, ScanStep):
                self.emit_scan(step)
            elif isinstance(step, NegationStep):
                self.emit_negation(step)
            elif isinstance(step, FilterStep):
                self.emit_filter(step.comparison)
            else:
                self.emit_bind(step.bind.expr, step.bind.variable)

    def emit_exists(self, split: int) -> list[str]:
        """Main loops up to ``split``, then ``if _rest(bound...): out.add(head)`` where
        ``_rest`` runs the remaining steps and returns True at the first match."""
        steps = self.plan.steps
        self.emit_steps(steps[: split + 1])
        params = ", ".join(self.names.values())
        head = self.tuple_code([self.term_id(t) for t in self.head_terms])
        self.out.line(f"if _rest({params}): out.add({head})")
        main = self.out.lines
        preamble_end = main.index("    for _once in ONCE:")
        self.out = _Emitter()
        self.out.line(f"def _rest({params}):")
        self.out.indent()
        self.out.line("for _once in ONCE:")
        self.out.indent()
        self.emit_steps(steps[split + 1 :])
        self.out.line("return True")
        self.out.depth = 2
        self.out.line("return False")
        return main[:preamble_end] + self.out.lines + main[preamble_end:]

    def emit_preamble(self, skip: ScanStep | None = None) -> None:
        """Each atom's tuples or index, fetched once per call, except ``skip``: a grouped join
        reads its first atom through an index of its own (``emit_grouped``), and fetching its
        tuples as well would build them for a relation stored by subject only, for nothing."""
        for step in self.plan.steps:
            if isinstance(step, ScanStep) and step.delta or step is skip:
                continue
            if not isinstance(step, (ScanStep, NegationStep)):
                continue
            count = self.counts.get(step.position, 0)
            partial = 0 < len(step.bound) < step.atom.arity
            constants = self.partitioned(step)
            for j in range(count):
                relation = f"S[{step.position}][{j}]"
                if constants:
                    keyed = self.keyed(step)
                    constant_ids = ", ".join(
                        f"({c}, {self.term_id(step.atom.terms[c])})" for c in constants
                    )
                    index = f"{relation}.partition(({constant_ids},), {keyed!r})"
                    self.out.line(f"I{step.position}_{j} = {index}")
                elif partial:
                    self.out.line(f"I{step.position}_{j} = {relation}.index({step.bound!r})")
                else:
                    self.out.line(f"T{step.position}_{j} = {relation}.tuples")

    @staticmethod
    def partitioned(step: ScanStep | NegationStep) -> tuple[int, ...]:
        """The bound columns holding constants when the atom is read through a partition
        (`Relation.partition`): some bound columns are constants and some variables, and
        some are free; else nothing (the atom is read through ``index(step.bound)``)."""
        atom = step.atom
        if not 0 < len(step.bound) < atom.arity:
            return ()
        constants = tuple(c for c in step.bound if not isinstance(atom.terms[c], Variable))
        return constants if 0 < len(constants) < len(step.bound) else ()

    def keyed(self, step: ScanStep | NegationStep) -> tuple[int, ...]:
        """The columns of the key an atom's index is probed with: its bound columns, less
        the constants a partition holds fixed."""
        constants = self.partitioned(step)
        return tuple(c for c in step.bound if c not in constants)

    def sources(self, step: ScanStep | NegationStep, prefix: str) -> list[str]:
        return [f"{prefix}{step.position}_{j}" for j in range(self.counts.get(step.position, 0))]

    def open_source_loop(self, names: list[str]) -> str:
        """One name: use it directly; several: loop over them (a fact in two stores is simply
        matched twice, which the output set absorbs)."""
        if len(names) == 1:
            return names[0]
        holder = self.fresh()
        self.out.line(f"for {holder} in ({', '.join(names)},):")
        self.out.indent()
        return holder

    def bind_targets(
        self, atom: Atom, columns: Sequence[int], constants_checked: bool = False
    ) -> tuple[list[str], list[str]]:
        """Loop targets for free columns, and the equality checks their values still need
        (constants, unless ``constants_checked``: the loop's source holds only facts with
        them; variables bound earlier; a variable repeated in the atom)."""
        targets: list[str] = []
        checks: list[str] = []
        for column in columns:
            term = atom.terms[column]
            if constants_checked and not isinstance(term, Variable):
                targets.append("_")
            elif isinstance(term, Variable) and term not in self.names:
                targets.append(self.var(term))
            else:
                temp = self.fresh()
                targets.append(temp)
                checks.append(f"{temp} != {self.term_id(term)}")
        return targets, checks

    def emit_checks(self, checks: list[str]) -> None:
        if checks:
            self.out.line(f"if {' or '.join(checks)}: continue")

    def emit_scan(self, step: ScanStep) -> None:
        atom, out = step.atom, self.out
        arity = atom.arity
        if step.delta:
            selected = self.delta_selected(atom)  # (constants checked there)
            targets, checks = self.bind_targets(atom, range(arity), selected != "D")
            selected = self.delta_semijoin(step, selected)
            out.line(f"for {self.tuple_code(targets)} in {selected}:")
            out.indent()
            self.emit_checks(checks)
            return
        if len(step.bound) == arity:
            fact = self.tuple_code([self.term_id(t) for t in atom.terms])
            tests = " or ".join(f"{fact} in {name}" for name in self.sources(step, "T"))
            out.line(f"if not ({tests}): continue")
            return
        if step.bound:
            key = self.key_code([self.term_id(atom.terms[c]) for c in self.keyed(step)])
            index = self.open_source_loop(self.sources(step, "I"))
            bucket = self.fresh()
            out.line(f"{bucket} = {index}.get({key})")
            out.line(f"if {bucket} is None: continue")
            free = [c for c in range(arity) if c not in step.bound]
            targets, checks = self.bind_targets(atom, free)
            target = targets[0] if len(targets) == 1 else ", ".join(targets)
            out.line(f"for {target} in {bucket}:")
            out.indent()
            self.emit_checks(checks)
            return
        table = self.open_source_loop(self.sources(step, "T"))
        targets, checks = self.bind_targets(atom, range(arity))
        out.line(f"for {self.tuple_code(targets)} in {table}:")
        out.indent()
        self.emit_checks(checks)

    def delta_selected(self, atom: Atom) -> str:
        """The delta, or, when the atom has constants, its facts holding them, picked in C:
        a delta atom such as ``triple(X, <subClassOf>, Y)`` matches a few of the delta's facts
        (the round's new triples of every predicate), and a Python loop testing each one was
        most of such a rule's time."""
        constants = [c for c, t in enumerate(atom.terms) if not isinstance(t, Variable)]
        if not constants:
            return "D"
        wanted = self.key_code([self.term_id(atom.terms[c]) for c in constants])
        getter = ", ".join(map(str, constants))
        return f"compress(D, map(({wanted}).__eq__, map(COLUMN({getter}), D)))"

    def delta_semijoin(self, step: ScanStep, selected: str) -> str:
        """The delta facts whose key can match the next atom, when that atom is probed by an
        index on variables of the delta atom only: picked in C by a membership test of the
        key in the index (or indexes), so that the Python loop runs only over facts with a
        match. Why: a rule such as rdfs7, ``triple(X, R, Y) :- triple(P, <sp>, R) and
        triple(X, P, Y)``, with the delta on ``triple(X, P, Y)``, probes a few subproperties
        with every new triple of the round; nearly all probes miss."""
        steps = self.plan.steps
        at = next(i for i, s in enumerate(steps) if s is step)
        probe = steps[at + 1] if at + 1 < len(steps) else None
        if at or not isinstance(probe, ScanStep) or probe.delta:
            return selected
        if len(probe.bound) == probe.atom.arity:
            return selected
        keyed = self.keyed(probe)
        terms = [probe.atom.terms[c] for c in keyed]
        columns = step.atom.terms
        if not keyed or not all(isinstance(t, Variable) and t in columns for t in terms):
            return selected
        indexes = self.sources(probe, "I")
        if not indexes:
            return selected
        getter = ", ".join(str(columns.index(t)) for t in terms)
        out = self.out
        out.line(f"DS = {selected}" if selected == "D" else f"DS = list({selected})")
        out.line(f"DK = list(map(COLUMN({getter}), DS))")
        tests = [f"map({index}.__contains__, DK)" for index in indexes]
        test = tests[0]
        for other in tests[1:]:
            test = f"map(OR, {test}, {other})"
        return f"compress(DS, {test})"

    def emit_negation(self, step: NegationStep) -> None:
        atom, out = step.atom, self.out
        tables = self.sources(step, "T")
        indexes = self.sources(step, "I")
        if not tables and not indexes:
            return  # nothing holds this relation: the negation always holds
        free = [c for c in range(atom.arity) if c not in step.bound]
        free_vars = [atom.terms[c] for c in free]
        if len(set(free_vars)) < len(free_vars):
            # A repeated existential variable (not p(Y, Z, Z)): scan and compare columns.
            first: dict[Term, int] = {}
            conditions = []
            for column, term in enumerate(atom.terms):
                if column in step.bound:
                    conditions.append(f"f[{column}] == {self.term_id(term)}")
                elif term in first:
                    conditions.append(f"f[{column}] == f[{first[term]}]")
                else:
                    first[term] = column
            test = " and ".join(conditions) or "True"
            names = [f"S[{step.position}][{j}].tuples" for j in range(self.counts[step.position])]
            out.line(f"if any({test} for T in ({', '.join(names)},) for f in T): continue")
            return
        if len(step.bound) == atom.arity:
            fact = self.tuple_code([self.term_id(t) for t in atom.terms])
            out.line(f"if {' or '.join(f'{fact} in {t}' for t in tables)}: continue")
        elif step.bound:
            key = self.key_code([self.term_id(atom.terms[c]) for c in self.keyed(step)])
            out.line(f"if {' or '.join(f'{key} in {i}' for i in indexes)}: continue")
        else:
            out.line(f"if {' or '.join(tables)}: continue")

    def emit_filter(self, comparison: Comparison) -> None:
        left, right, op = comparison.left, comparison.right, comparison.op
        if op in ("=", "!=") and is_term(left) and is_term(right):
            negate = "!=" if op == "=" else "=="
            self.out.line(f"if {self.term_id(left)} {negate} {self.term_id(right)}: continue")
            return
        spilled: list[str] = []
        sides = f"{self.value_code(left, spilled)}, {self.value_code(right, spilled)}"
        self.emit_guarded(*spilled, f"ok = {values.COMPARISONS[op].code}({sides})")
        self.out.line("if not ok: continue")

    def emit_bind(self, expr: Expr, variable: Variable) -> None:
        """Bind a fresh variable; when the variable is already bound (a rule evaluated with its
        head bound, or a maintenance variant), the bind becomes an equality test."""
        spilled: list[str] = []
        value = self.value_code(expr, spilled)
        if variable in self.names:
            self.emit_guarded(*spilled, f"ok = ENC({value}) == {self.names[variable]}")
            self.out.line("if not ok: continue")
            return
        self.emit_guarded(*spilled, f"{self.var(variable)} = ENC({value})")

    def emit_guarded(self, *statements: str) -> None:
        out = self.out
        out.line("try:")
        for statement in statements:
            out.line(f"    {statement}")
        out.line("except EVAL_ERRORS:")
        out.line("    ERR.count += 1")
        out.line("    continue")

    # -- the C-level innermost step (rewrites/product.py) ----------------------------------
    def emit_product(self, step: ScanStep, filters: Sequence) -> None:
        atom, out = step.atom, self.out
        key = self.key_code([self.term_id(atom.terms[c]) for c in self.keyed(step)])
        index = self.open_source_loop(self.sources(step, "I"))
        bucket = self.fresh()
        out.line(f"{bucket} = {index}.get({key})")
        out.line(f"if {bucket} is None: continue")
        free = free_terms(step)
        if len(free) > 1:  # buckets of tuples: the head's columns cut out in C
            if not set(free) & set(self.head_terms):
                head = self.tuple_code([self.term_id(t) for t in self.head_terms])
                out.line(f"if {bucket}: out.add({head})")
                return
            columns = [
                f"map(COLUMN({free.index(term)}), {bucket})"
                if term in free
                else f"repeat({self.term_id(term)})"
                for term in self.head_terms
            ]
            out.line(f"out.update(zip({', '.join(columns)}))")
            return
        new = new_variable(step)
        excluded = [self.term_id(other) for other in excluded_by(filters, new)]
        if len(excluded) == 1:
            out.line(f"if {excluded[0]} in {bucket}: {bucket} = {bucket} - {{{excluded[0]}}}")
        elif excluded:
            banned = self.fresh()
            out.line(f"{banned} = {{{', '.join(excluded)}}}")
            out.line(f"if not {banned}.isdisjoint({bucket}): {bucket} = {bucket} - {banned}")
        if new not in self.head_terms:
            head = self.tuple_code([self.term_id(t) for t in self.head_terms])
            out.line(f"if {bucket}: out.add({head})")
            return
        columns = [
            bucket if term == new else f"repeat({self.term_id(term)})" for term in self.head_terms
        ]
        out.line(f"out.update(zip({', '.join(columns)}))")


def with_budget_pulse(source: str) -> str:
    """Insert the budget check (agent/engine/budget.py) at the top of the outermost loop over
    facts: the first ``for`` after ``for _once in ONCE:`` that is not a loop over a tuple of
    sources. A rule with no such loop (C-level projections and key filters) produces at most
    as many facts as one relation holds, and is checked before and after by its module."""
    lines = source.split("\n")
    started = False
    for number, line in enumerate(lines):
        text = line.strip()
        if text == "for _once in ONCE:":
            started = True
        elif started and text.startswith("for ") and not text.endswith(",):"):
            indent = len(line) - len(line.lstrip()) + 4
            lines.insert(number + 1, " " * indent + "if len(out) > GUARD.cap: GUARD.pulse(out)")
            break
    return "\n".join(lines)
