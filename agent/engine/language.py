"""The logical program: an immutable AST for rules, shared by the parser, the planner and the tests.

Nothing here knows about storage or evaluation. Every node prints itself back in our rule
syntax (``str(node)``), so that ``parse(str(program)) == program`` holds (the parser's
round-trip test relies on it).

Values and terms
----------------
A constant's ``value`` is a plain Python value:

* ``str``   - an IRI (``<windTurbine1>`` is ``"windTurbine1"``; ``ex:a`` is expanded),
* ``int`` / ``float`` - a number (numbers compare numerically; ``5`` and ``5.0`` are the same term),
* ``bool``  - ``true`` / ``false``,
* :class:`Literal` - any other RDF literal (plain strings, language-tagged or typed literals).

Atoms
-----
``Atom(predicate, terms)``: a unary atom ``<C>(X)`` means the triple ``(X, rdf:type, C)``;
the parser turns ``<rdf:type>(X, <C>)`` into that unary form, so there is exactly one way to
write a class atom. A binary atom ``<p>(S, O)`` is the triple ``(S, p, O)``; atoms of arity 3
or more are plain relations. A relation is identified by ``(predicate, arity)``.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field

RDF_TYPE = "http://www.w3.org/1999/02/22-rdf-syntax-ns#type"
# Predicates the engine derives for itself (a multi-head rule's body, say): no rule a user
# writes may derive them, and readers of the materialisation never see them.
RESERVED_PREFIX = "zodiac:"
XSD = "http://www.w3.org/2001/XMLSchema#"


@dataclass(frozen=True, slots=True)
class Literal:
    """An RDF literal that is neither a number nor a boolean (e.g. a plain string)."""

    lexical: str
    datatype: str | None = None
    language: str | None = None

    def __post_init__(self) -> None:
        # Language tags compare case-insensitively (BCP 47), and pyoxigraph reads them
        # lower-cased: held so, ``"x"@en-GB`` in a rule, a file or a tuple is one term.
        if self.language and not self.language.islower():
            object.__setattr__(self, "language", self.language.lower())

    def __str__(self) -> str:
        text = '"' + _escape_string(self.lexical) + '"'
        if self.language:
            return f"{text}@{self.language}"
        if self.datatype:
            return f"{text}^^<{self.datatype}>"
        return text

    def __lt__(self, other: object) -> bool:
        if isinstance(other, Literal):
            return (self.lexical, self.datatype or "", self.language or "") < (
                other.lexical,
                other.datatype or "",
                other.language or "",
            )
        return NotImplemented


Value = str | int | float | bool | Literal
RelationKey = tuple[str, int]  # a relation: (predicate, arity)


def is_number(value: object) -> bool:
    """True for ints and floats, never for booleans (which are terms of their own)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def format_value(value: Value) -> str:
    """Print a constant in rule syntax."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return "<" + value + ">"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            # Not expressible as a number token; keep it a typed literal.
            return f'"{value!r}"^^<{XSD}double>'
        return repr(value)
    return str(value)


def _escape_string(text: str) -> str:
    return (
        text.replace("\\", "\\\\")
        .replace('"', '\\"')
        .replace("\n", "\\n")
        .replace("\r", "\\r")
        .replace("\t", "\\t")
    )


@dataclass(frozen=True, slots=True)
class Variable:
    """A variable; its name is kept as written (``X``, ``?x``, ``_1``)."""

    name: str

    def __str__(self) -> str:
        return self.name

    # (written out: planning and compiling a rule hash and compare variables thousands of
    # times, and the generated methods build a tuple of the fields for each)
    def __hash__(self) -> int:
        return hash(self.name)

    def __eq__(self, other: object) -> bool:
        if other.__class__ is Variable:
            return self.name == other.name  # type: ignore[attr-defined]
        return NotImplemented


@dataclass(frozen=True, slots=True)
class Constant:
    value: Value

    def __str__(self) -> str:
        return format_value(self.value)


Term = Variable | Constant


@dataclass(frozen=True, slots=True)
class BinaryOp:
    """Arithmetic ``left op right`` with op in ``+ - * /``."""

    op: str
    left: Expr
    right: Expr

    def __str__(self) -> str:
        return f"({self.left} {self.op} {self.right})"


@dataclass(frozen=True, slots=True)
class Call:
    """A built-in function call: ``abs min max round floor ceil sqrt``."""

    function: str
    args: tuple[Expr, ...]

    def __str__(self) -> str:
        return f"{self.function}({', '.join(str(a) for a in self.args)})"


Expr = Variable | Constant | BinaryOp | Call


def expr_variables(expr: Expr) -> set[Variable]:
    """The variables an expression reads."""
    if isinstance(expr, Variable):
        return {expr}
    if isinstance(expr, Constant):
        return set()
    if isinstance(expr, BinaryOp):
        return expr_variables(expr.left) | expr_variables(expr.right)
    found: set[Variable] = set()
    for arg in expr.args:
        found |= expr_variables(arg)
    return found


@dataclass(frozen=True, slots=True)
class Atom:
    predicate: str
    terms: tuple[Term, ...]

    @property
    def arity(self) -> int:
        return len(self.terms)

    @property
    def relation(self) -> tuple[str, int]:
        """The relation this atom reads or writes: ``(predicate, arity)``."""
        return (self.predicate, len(self.terms))

    def variables(self) -> set[Variable]:
        return {t for t in self.terms if isinstance(t, Variable)}

    def is_ground(self) -> bool:
        return all(isinstance(t, Constant) for t in self.terms)

    def __str__(self) -> str:
        return f"<{self.predicate}>({', '.join(str(t) for t in self.terms)})"


@dataclass(frozen=True, slots=True)
class Negation:
    """``not atom``. Variables of the atom that occur nowhere else in the rule (or, inside an
    aggregate, nowhere else in the aggregate body) are existential: ``not <p13>(Y, Z)`` means
    "there is no ``Z`` with ``p13(Y, Z)``"."""

    atom: Atom

    def __str__(self) -> str:
        return f"not {self.atom}"


@dataclass(frozen=True, slots=True)
class Comparison:
    """``COMP(left, op, right)``; also written ``left op right`` in plain Datalog."""

    left: Expr
    op: str
    right: Expr

    def variables(self) -> set[Variable]:
        return expr_variables(self.left) | expr_variables(self.right)

    def __str__(self) -> str:
        return f"COMP({self.left}, {self.op}, {self.right})"


@dataclass(frozen=True, slots=True)
class Bind:
    """``bind(expr as V)``: computes a new value for the fresh variable ``V``."""

    expr: Expr
    variable: Variable

    def __str__(self) -> str:
        return f"bind({self.expr} as {self.variable})"


@dataclass(frozen=True, slots=True)
class Aggregate:
    """``aggregate( body ) on G1, G2 with fn(T) as R``.

    The aggregate ranges over the *distinct substitutions* of all variables of ``body``:
    two neighbours with the same reading count twice. ``function`` is lower case.
    """

    body: tuple[BodyItem, ...]
    group_by: tuple[Variable, ...]
    function: str
    argument: Term
    result: Variable

    def __str__(self) -> str:
        body = " and ".join(str(item) for item in self.body)
        group = ", ".join(str(v) for v in self.group_by)
        on = f" on {group}" if group else ""
        return f"aggregate( {body} ){on} with {self.function}({self.argument}) as {self.result}"


BodyItem = Atom | Negation | Comparison | Bind | Aggregate


def atom_fact(atom: Atom) -> tuple:
    """A ground atom as a fact tuple ``(predicate, *values)``; a unary (class) atom ``<C>(x)``
    is the triple ``(rdf:type, x, C)``, as the reasoner reads and yields facts."""
    values = tuple(term.value for term in atom.terms)  # type: ignore[union-attr]
    if len(values) == 1:
        return (RDF_TYPE, values[0], atom.predicate)
    return (atom.predicate, *values)


def fact_atom(fact: tuple) -> Atom:
    """The ground atom of a fact tuple (the inverse of `atom_fact`): ``(rdf:type, x, C)`` is
    the class atom ``<C>(x)``."""
    if len(fact) == 3 and fact[0] == RDF_TYPE:
        return Atom(fact[2], (Constant(fact[1]),))
    return Atom(fact[0], tuple(Constant(value) for value in fact[1:]))


_LABEL = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]*")


def item_variables(item: BodyItem) -> set[Variable]:
    """The variables a body item mentions (an aggregate: its group, result and body)."""
    if isinstance(item, Atom):
        return item.variables()
    if isinstance(item, Negation):
        return item.atom.variables()
    if isinstance(item, Comparison):
        return item.variables()
    if isinstance(item, Bind):
        return expr_variables(item.expr) | {item.variable}
    found = set(item.group_by) | {item.result}
    for inner in item.body:
        found |= item_variables(inner)
    return found


@dataclass(frozen=True, slots=True)
class Rule:
    """``head :- body .`` with an optional label (``r3: head :- body .``).

    A rule has two names, for two different jobs:

    * ``key`` is its identity: a hash of its canonical content (the text without the label,
      variables renamed in order of first occurrence, every anonymous ``_`` a variable of its
      own). Two rules with the same key derive the same facts, so the engine keeps one of
      them; hyper-nodes, compiled plans and the saved state are keyed by it. Replacing the
      body of a labelled rule therefore changes its key, and nothing cached for the old body
      can be mistaken for the new one.
    * ``id`` is what users see and name it by: the label when one is given, otherwise the key.
      It is the same on every device for the same rule text.
    """

    head: Atom
    body: tuple[BodyItem, ...]
    label: str | None = field(default=None, compare=True)
    # Further head atoms sharing the body (``a(X, Y), b(Y) :- ...``): the body is evaluated
    # once and every head is derived from each of its substitutions (see heads.py).
    more_heads: tuple[Atom, ...] = field(default=(), compare=True)
    # Caches, derived from the fields above (a Rule is immutable, so they never go stale).
    _key: str | None = field(default=None, init=False, repr=False, compare=False, hash=False)
    _checked: bool = field(default=False, init=False, repr=False, compare=False, hash=False)
    _unverified: bool = field(default=False, init=False, repr=False, compare=False, hash=False)
    _reads: tuple | None = field(default=None, init=False, repr=False, compare=False, hash=False)

    @property
    def id(self) -> str:
        return self.label or self.key

    @property
    def key(self) -> str:
        """The content key (see the class docstring), computed once."""
        key = self._key
        if key is None:
            # (surrogatepass: a rule whose text is not Unicode still has a key, which names
            # it while validation refuses it)
            text = canonical_rule(self).text().encode("utf-8", "surrogatepass")
            key = "h" + hashlib.sha1(text).hexdigest()[:12]
            object.__setattr__(self, "_key", key)
        return key

    def mark_checked(self) -> None:
        """Remember that the rule passed validation (``validation.check_rule``), so that a
        rule parsed from text is not checked again by the engine in the same update."""
        object.__setattr__(self, "_checked", True)

    def mark_saved(self, key: str) -> None:
        """A rule read back from a saved row that its checksum vouches for (the agent's state,
        agent/state/saved_rules.py): the row holds the rule as it was validated and keyed when it
        was saved, so its content key is the saved one and a restart does not validate it.
        It is validated once before it is first compiled (``unverified``): a checksum catches
        damage, not one forged over a rule made unsafe."""
        object.__setattr__(self, "_key", key)
        object.__setattr__(self, "_checked", True)
        object.__setattr__(self, "_unverified", True)

    @property
    def unverified(self) -> bool:
        """Read back from a saved row and not validated since (`mark_saved`)."""
        return self._unverified

    def mark_verified(self) -> None:
        object.__setattr__(self, "_unverified", False)

    @property
    def checked(self) -> bool:
        return self._checked

    @property
    def heads(self) -> tuple[Atom, ...]:
        """Every head atom: ``head`` and ``more_heads``."""
        return (self.head, *self.more_heads)

    def text(self) -> str:
        """The rule without its label, in canonical syntax."""
        heads = ", ".join(str(atom) for atom in self.heads)
        return f"{heads} :- {' and '.join(str(item) for item in self.body)} ."

    def aggregate(self) -> Aggregate | None:
        for item in self.body:
            if isinstance(item, Aggregate):
                return item
        return None

    def body_relations(self) -> tuple[tuple[tuple[str, int], str], ...]:
        """Every relation the body reads, with how: ``positive``, ``negative`` or ``aggregate``.

        Atoms inside an aggregate count as ``aggregate`` (they must be computed in an earlier
        stratum, like negated atoms). Computed once: every update that changes the program
        rebuilds the dependency graph from these, for every rule."""
        reads = self._reads
        if reads is not None:
            return reads
        found: list[tuple[tuple[str, int], str]] = []
        for item in self.body:
            if isinstance(item, Atom):
                found.append((item.relation, "positive"))
            elif isinstance(item, Negation):
                found.append((item.atom.relation, "negative"))
            elif isinstance(item, Aggregate):
                for inner in item.body:
                    if isinstance(inner, Atom):
                        found.append((inner.relation, "aggregate"))
                    elif isinstance(inner, Negation):
                        found.append((inner.atom.relation, "aggregate"))
        reads = tuple(found)
        object.__setattr__(self, "_reads", reads)
        return reads

    def __str__(self) -> str:
        prefix = f"{self.label}: " if self.label else ""
        return prefix + self.text()


# Units of a window's length (``@window <p> 10 min as <r> .``), in seconds.
WINDOW_UNITS: dict[str, float] = {
    **dict.fromkeys(("s", "sec", "second", "seconds"), 1.0),
    **dict.fromkeys(("min", "minute", "minutes"), 60.0),
    **dict.fromkeys(("h", "hour", "hours"), 3600.0),
}


@dataclass(frozen=True, slots=True)
class WindowDeclaration:
    """``@window <reading> N unit as <relation> .``: every reading ``<reading>(sensor, value)``
    the agent applies at time ``t`` is also kept as ``<relation>(sensor, value, t)`` while
    ``t`` is within the last ``seconds`` of the agent's clock (docs/agent.md, "Windows").
    The engine never evaluates a window: the agent keeps its facts (agent/readings/windows.py)."""

    reading: str
    seconds: float
    relation: str

    def __str__(self) -> str:
        """Canonical text, which parses back to an equal declaration: the largest unit that
        the length is a whole number of (``600 s`` is ``10 min``)."""
        unit, size = next(
            (
                (unit, size)
                for unit, size in (("h", 3600.0), ("min", 60.0))
                if self.seconds >= size and float(self.seconds / size).is_integer()
            ),
            ("s", 1.0),
        )
        length = _window_number(self.seconds / size)
        return f"@window <{self.reading}> {length} {unit} as <{self.relation}> ."


def _window_number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


@dataclass(frozen=True, slots=True)
class Program:
    """A parsed rule text: rules in text order, plus any ground facts written in it, and the
    agent's directives: windows over readings (``@window``) and watched patterns
    (``@watch``). The engine evaluates rules and facts only, and refuses a program with
    directives (``Reasoner.update``): they are kept by the agent."""

    rules: tuple[Rule, ...] = ()
    facts: tuple[Atom, ...] = ()
    windows: tuple[WindowDeclaration, ...] = ()
    watches: tuple[Atom, ...] = ()

    def __str__(self) -> str:
        lines = [str(window) for window in self.windows]
        lines += [f"@watch {pattern} ." for pattern in self.watches]
        lines += [str(rule) for rule in self.rules]
        lines += [f"{fact} ." for fact in self.facts]
        return "\n".join(lines) + ("\n" if lines else "")


def is_valid_label(label: str) -> bool:
    return bool(_LABEL.fullmatch(label))


# --- rewriting the terms of a rule --------------------------------------------------------------
TermMap = Callable[[Term], Term]


def map_expr(expr: Expr, fn: TermMap) -> Expr:
    if isinstance(expr, (Variable, Constant)):
        return fn(expr)
    if isinstance(expr, BinaryOp):
        return BinaryOp(expr.op, map_expr(expr.left, fn), map_expr(expr.right, fn))
    return Call(expr.function, tuple(map_expr(arg, fn) for arg in expr.args))


def map_atom(atom: Atom, fn: TermMap) -> Atom:
    return Atom(atom.predicate, tuple(fn(term) for term in atom.terms))


def map_item(item: BodyItem, fn: TermMap) -> BodyItem:
    """``item`` with every term replaced by ``fn(term)``, visited in written order. ``fn`` must
    map a variable in a binding position (a bind's target, a group-by or result variable) to
    a variable."""
    if isinstance(item, Atom):
        return map_atom(item, fn)
    if isinstance(item, Negation):
        return Negation(map_atom(item.atom, fn))
    if isinstance(item, Comparison):
        return Comparison(map_expr(item.left, fn), item.op, map_expr(item.right, fn))
    if isinstance(item, Bind):
        return Bind(map_expr(item.expr, fn), fn(item.variable))  # type: ignore[arg-type]
    body = tuple(map_item(inner, fn) for inner in item.body)
    return Aggregate(
        body,
        tuple(fn(v) for v in item.group_by),  # type: ignore[misc]
        item.function,
        fn(item.argument),
        fn(item.result),  # type: ignore[arg-type]
    )


def map_rule(rule: Rule, fn: TermMap) -> Rule:
    """``rule`` (label kept) with every term replaced by ``fn(term)``, heads first, then the
    body in written order."""
    head = map_atom(rule.head, fn)
    more = tuple(map_atom(atom, fn) for atom in rule.more_heads)
    return Rule(head, tuple(map_item(item, fn) for item in rule.body), rule.label, more)


ANONYMOUS = "_"


def canonical_rule(rule: Rule) -> Rule:
    """The rule without its label, its variables renamed ``V0, V1, ...`` in order of first
    occurrence and every anonymous ``_`` renamed to a variable of its own: two rules that
    differ only in variable names (or in how an anonymous variable is spelled) have the same
    canonical form, and so the same key."""
    names: dict[str, Variable] = {}
    count = 0

    def rename(term: Term) -> Term:
        nonlocal count
        if not isinstance(term, Variable):
            return term
        found = names.get(term.name)
        if found is None:
            found = Variable(f"V{count}")
            count += 1
            if term.name != ANONYMOUS:  # each ``_`` is a variable of its own
                names[term.name] = found
        return found

    renamed = map_rule(rule, rename)
    return Rule(renamed.head, renamed.body, more_heads=renamed.more_heads)


def name_anonymous_variables(rule: Rule) -> Rule:
    """Give every anonymous ``_`` of a rule built as an AST its own name, exactly as the parser
    does for rule text (``_1``, ``_2``, ... in written order, skipping names the rule uses),
    so that the engine evaluates it like its text. A rule without ``_`` is returned as is."""
    used = {v.name for item in rule.body for v in item_variables(item)}
    if ANONYMOUS not in used:
        return rule
    counter = 0

    def fresh(term: Term) -> Term:
        nonlocal counter
        if not (isinstance(term, Variable) and term.name == ANONYMOUS):
            return term
        while True:
            counter += 1
            name = f"_{counter}"
            if name not in used:
                return Variable(name)

    return map_rule(rule, fresh)
