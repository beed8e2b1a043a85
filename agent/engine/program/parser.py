"""Rule text -> :class:`~agent.engine.language.Program`: a tokenizer and a recursive-descent parser.

It reads ZodiacEdge's rule files unchanged and plain Datalog. Keywords (``and not comp bind
aggregate on with as prefix``, function names) are case-insensitive. Grammar, in EBNF::

    program     = { statement } ;
    statement   = directive | clause ;
    directive   = "@prefix" prefix-name IRIREF "." | "PREFIX" prefix-name IRIREF [ "." ]
                | window | watch ;
    window      = "@window" predicate NUMBER UNIT "as" predicate "." ;
    watch       = "@watch" atom "." ;      (* a pattern: variables, constants and "_" *)
    prefix-name = [ NAME ] ":" ;
    clause      = [ LABEL ":" ] atom ( ":-" body | (* a ground fact *) ) "." ;
    body        = item { ( "and" | "," ) item } ;
    item        = "not" atom | comp | bind | aggregate | atom | expr compare-op expr ;
    comp        = "COMP" "(" expr "," compare-op "," expr ")" ;
    bind        = "bind" "(" expr "as" VARIABLE ")" ;
    aggregate   = "aggregate" "(" body ")" [ "on" VARIABLE { "," VARIABLE } ]
                  "with" AGG-FUNCTION "(" term ")" "as" VARIABLE ;    (* no nested aggregate *)
    atom        = predicate "(" term { "," term } ")" ;
    predicate   = IRIREF | PNAME | NAME ;
    term        = VARIABLE | "_" | constant ;
    constant    = IRIREF | PNAME | NAME | NUMBER | "true" | "false"
                | STRING [ LANGTAG | "^^" ( IRIREF | PNAME ) ] ;
    expr        = product { ( "+" | "-" ) product } ;
    product     = unary { ( "*" | "/" ) unary } ;
    unary       = "-" unary | primary ;
    primary     = "(" expr ")" | FUNCTION "(" expr { "," expr } ")" | term ;
    compare-op  = "<" | "<=" | "=" | "==" | "!=" | "<>" | ">=" | ">" ;

``UNIT`` is ``s``, ``sec``, ``second(s)``, ``min``, ``minute(s)``, ``h``, ``hour(s)`` and the
``NUMBER`` before it positive: ``@window <hasAirTemperatureMeasurement> 10 min as
<recentAirTemperature> .`` keeps every reading ``<hasAirTemperatureMeasurement>(S, V)`` of the
last ten minutes as ``<recentAirTemperature>(S, V, T)`` (``T``: the reading's time). Windows and
watches are the agent's (docs/agent.md, "Windows" and "Events"): the parser reads them into
``Program.windows`` and ``Program.watches``, the engine refuses to materialise a program that has
any (:class:`~agent.engine.errors.DirectiveError`). A window's relation may not be the head of a
rule of the program nor its own reading predicate, and one relation has one declaration.

Tokens: ``IRIREF`` is ``<...>`` without spaces (its text is kept as written, never resolved);
``PNAME`` is ``prefix:local`` (expanded with ``@prefix``; ``rdf: rdfs: xsd: owl:`` are
predefined); ``NAME`` starts with a lower-case letter (an IRI as is, ``edge`` or ``a``);
``VARIABLE`` starts with an upper-case letter, ``_`` or ``?``; a lone ``_`` is anonymous (a fresh
variable per occurrence); ``NUMBER`` is an int, or a float when it has a ``.`` or an exponent,
and a ``-`` directly before it belongs to it unless it follows an operand (``Z-1`` is ``Z - 1``);
``#`` starts a comment. ``<`` begins an IRI only when a ``>`` follows before any space, so
write comparisons as ``X < Y``. A ``LABEL`` is a name followed by ``:`` and a space, which tells
``r3: p(X) :- ...`` apart from the prefixed name ``ex:knows``. The words ``not``, ``comp``,
``bind`` and ``aggregate`` followed by ``(`` are keywords; use ``<comp>(X)`` for such a predicate.

Every syntax error is a :class:`~agent.engine.errors.ParseError` pointing at the offending token
and saying what was expected; rules that parse but are unsafe raise the
:class:`~agent.engine.errors.RuleError` of :func:`agent.engine.program.validation.check_rule`,
prefixed with ``source:line:column``.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from typing import NoReturn

from agent.engine.errors import (
    NonFiniteError,
    ParseError,
    RuleError,
    UnsafeRuleError,
    decode_utf8,
    read_bytes,
)
from agent.engine.gcpause import collector_paused
from agent.engine.language import (
    ANONYMOUS,
    RDF_TYPE,
    WINDOW_UNITS,
    XSD,
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
    Program,
    Rule,
    Term,
    Value,
    Variable,
    WindowDeclaration,
    is_number,
    is_valid_label,
)
from agent.engine.program.validation import check_label, check_rule
from agent.engine.values import AGGREGATE_FUNCTIONS, FUNCTION_NAMES, arity_error

__all__ = [
    "PREDEFINED_PREFIXES",
    "literal_value",
    "parse_atom",
    "parse_file",
    "parse_file_with_prefixes",
    "parse_program",
    "parse_window",
]

PREDEFINED_PREFIXES: Mapping[str, str] = {
    "rdf": "http://www.w3.org/1999/02/22-rdf-syntax-ns#",
    "rdfs": "http://www.w3.org/2000/01/rdf-schema#",
    "xsd": XSD,
    "owl": "http://www.w3.org/2002/07/owl#",
}


def parse_program(text: str, source: str = "<text>") -> Program:
    """Parse rule text (rules, facts and prefix directives) into a checked Program.

    The cyclic collector is paused meanwhile (`collector_paused`): a bundle of 10,000 rules makes
    570,000 tokens and the AST, and the collector's passes over them found nothing (no cycles)
    while taking about half the parse time."""
    with collector_paused():
        return _Parser(text, source).program()


def parse_file(path: str | os.PathLike[str]) -> Program:
    """Parse a UTF-8 rule file; errors name the path as given."""
    source = os.fspath(path)
    return parse_program(decode_utf8(read_bytes(path, "rule file"), source), source)


def parse_file_with_prefixes(path: str | os.PathLike[str]) -> tuple[Program, dict[str, str]]:
    """Like :func:`parse_file`, plus the prefixes in force at the end of the file (the
    predefined ones and every ``@prefix`` it declares), so that a command line can read
    patterns and facts, and print answers, with the rule file's own prefixes."""
    source = os.fspath(path)
    text = decode_utf8(read_bytes(path, "rule file"), source)
    with collector_paused():
        parser = _Parser(text, source)
        return parser.program(), dict(parser.prefixes)


def parse_window(text: str, source: str = "<window>") -> WindowDeclaration:
    """Parse one window declaration (``@window <p> 10 min as <r> .``, as a bundle carries
    them in ``Bundle.windows``); anything else in the text is a ParseError."""
    program = parse_program(text, source)
    if len(program.windows) != 1 or program.rules or program.facts or program.watches:
        raise ParseError(
            "expected exactly one '@window <reading> N unit as <relation> .' declaration",
            source=source,
            line=1,
            column=1,
        )
    return program.windows[0]


def parse_atom(
    text: str, source: str = "<query>", prefixes: Mapping[str, str] | None = None
) -> Atom:
    """Parse one atom such as a query pattern ``<p11>(X, Y)``; a trailing ``.`` is optional.
    Each anonymous ``_`` stays ``Variable("_")`` (ANONYMOUS): in a pattern it matches anything
    and is no part of the answers (`MaterialisedView.query`), where a rule names each one.

    ``prefixes`` adds to the predefined ``rdf: rdfs: xsd: owl:``.
    """
    parser = _Parser(text, source, prefixes)
    parser.names_anonymous = False
    parser.in_pattern = True
    return parser.single_atom()


# --- values -------------------------------------------------------------------------------

_INTEGER_TYPES = frozenset(
    XSD + name
    for name in (
        "integer", "int", "long", "short", "byte", "nonNegativeInteger", "positiveInteger",
        "nonPositiveInteger", "negativeInteger", "unsignedLong", "unsignedInt",
        "unsignedShort", "unsignedByte",
    )
)  # fmt: skip
_FLOAT_TYPES = frozenset(XSD + name for name in ("decimal", "double", "float"))
_INTEGER_LEXICAL = re.compile(r"[+-]?[0-9]+")
_FLOAT_LEXICAL = re.compile(
    r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|[+-]?(?:inf|infinity)|nan",
    re.IGNORECASE,
)
_BOOLEANS = {"true": True, "1": True, "false": False, "0": False}


def literal_value(lexical: str, datatype: str | None = None, language: str | None = None) -> Value:
    """The Python value of an RDF literal: numbers and booleans become ``int``/``float``/``bool``
    (so ``"5"^^xsd:integer`` and ``5`` are one term), anything else a :class:`Literal`.

    ``xsd:string`` is dropped (RDF 1.1: ``"a"`` and ``"a"^^xsd:string`` are the same literal);
    an ill-typed literal such as ``"abc"^^xsd:integer`` stays a Literal. Shared by the RDF reader
    so rule constants and data compare equal.
    """
    if language:
        return Literal(lexical, None, language)
    if datatype is None or datatype == XSD + "string":
        return Literal(lexical)
    if datatype in _INTEGER_TYPES and _INTEGER_LEXICAL.fullmatch(lexical):
        return int(lexical)
    if datatype in _FLOAT_TYPES and _FLOAT_LEXICAL.fullmatch(lexical):
        number = float(lexical)
        if not math.isfinite(number):
            raise NonFiniteError(lexical)
        return number
    if datatype == XSD + "boolean" and lexical in _BOOLEANS:
        return _BOOLEANS[lexical]
    return Literal(lexical, datatype)


# --- tokens -------------------------------------------------------------------------------

IRI, PNAME, LABEL, NAME, VAR, ANON = "iri", "pname", "label", "name", "var", "anon"
NUMBER, STRING, LANG, CMP, PUNCT, EOF, ERROR = (
    "number", "string", "lang", "cmp", "punct", "eof", "error",
)  # fmt: skip

_TOKEN = re.compile(
    r"""
     (?P<skip>\s+|\#[^\n]*)
    |(?P<iri><[^\x00-\x20<>"{}|^`\\]+>)
    |(?P<label>[A-Za-z_][A-Za-z0-9_.\-]*:(?=\s|\Z))
    |(?P<pname>(?:[^\W\d_][\w.\-]*)?:[\w:%](?:[\w:%\-]|\.(?=[\w:%\-]))*)
    |(?P<number>-?[0-9]+(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?)
    |(?P<string>"(?:[^"\\\n\r]|\\[^\n\r])*")
    |(?P<badstring>")
    |(?P<lang>@[A-Za-z]+(?:-[A-Za-z0-9]+)*)
    |(?P<var>\?\w+)
    |(?P<word>[^\W\d]\w*)
    |(?P<cmp>[<>=!]+)
    |(?P<punct>:-|\^\^|[(),.:+\-*/])
    |(?P<bad>.)
    """,
    re.VERBOSE | re.DOTALL,
)
_ESCAPE = re.compile(r"\\(?:u([0-9A-Fa-f]{4})|U([0-9A-Fa-f]{8})|(.))", re.DOTALL)
_SIMPLE_ESCAPES = {
    "t": "\t", "n": "\n", "r": "\r", "b": "\b", "f": "\f", '"': '"', "'": "'", "\\": "\\",
}  # fmt: skip
_OPERAND_END_KINDS = frozenset({VAR, ANON, NUMBER, STRING, IRI, PNAME, NAME, LANG})
_COMPARISONS = {
    "<": "<", "<=": "<=", "=": "=", "==": "=", "!=": "!=", "<>": "!=", ">=": ">=", ">": ">",
}  # fmt: skip
_ARITHMETIC = frozenset("+-*/")
MAX_EXPRESSION_DEPTH = 64  # parentheses, calls and unary minus nested in one expression
MAX_EXPRESSION_OPERATORS = 256  # arithmetic operators in one expression


class Token:
    """One token; ``pos`` is a character offset, turned into line and column only on error."""

    __slots__ = ("kind", "text", "pos", "value")

    def __init__(self, kind: str, text: str, pos: int, value: object = None):
        self.kind = kind
        self.text = text
        self.pos = pos
        self.value = value

    def __repr__(self) -> str:
        return f"Token({self.kind}, {self.text!r}, {self.pos})"


class _LexError(Exception):
    def __init__(self, message: str, pos: int):
        super().__init__(message)
        self.message = message
        self.pos = pos


def tokenize(text: str) -> list[Token]:
    """Split ``text`` into tokens ending with EOF. A lexical error becomes an ERROR token (then
    EOF), so the parser reports errors in text order, whichever phase finds them.

    One ``finditer`` pass (the last alternative of ``_TOKEN`` matches any character, so matches
    are contiguous); the frequent kinds are built inline, since this loop runs once per token of
    a bundle (10,000 rules: 570,000 tokens)."""
    tokens: list[Token] = []
    append = tokens.append
    last_end = 0
    for found in _TOKEN.finditer(text):
        kind = found.lastgroup
        if kind == "skip":
            continue
        lexeme, pos = found.group(), found.start()
        if kind == "word":
            if lexeme == "_":
                append(Token(ANON, lexeme, pos))
            else:
                first = lexeme[0]
                append(Token(VAR if first == "_" or first.isupper() else NAME, lexeme, pos))
        elif kind == "punct":
            append(Token(PUNCT, lexeme, pos))
        elif kind == "number" and lexeme[0] == "-" and tokens and _ends_operand(tokens[-1]):
            # A binary minus (``Z-1``): the sign is an operator, the rest a number.
            append(Token(PUNCT, "-", pos))
            append(_make_token(kind, lexeme[1:], pos + 1))
        else:
            try:
                append(_make_token(kind, lexeme, pos))
            except _LexError as err:
                append(Token(ERROR, lexeme, err.pos, err.message))
                last_end = err.pos
                break
        last_end = found.end()
    tokens.append(Token(EOF, "", last_end))
    return tokens


def _make_token(kind: str | None, lexeme: str, pos: int) -> Token:
    """The token of a kind other than word and punct (built inline by `tokenize`)."""
    if kind == "number":
        if "." in lexeme or "e" in lexeme or "E" in lexeme:
            number = float(lexeme)
            if not math.isfinite(number):  # (``1e400``: refused, said here with its place)
                raise _LexError(str(NonFiniteError(lexeme)), pos)
            return Token(NUMBER, lexeme, pos, number)
        return Token(NUMBER, lexeme, pos, int(lexeme))
    if kind == "string":
        body = lexeme[1:-1]
        return Token(STRING, lexeme, pos, _unescape(body, pos + 1) if "\\" in body else body)
    if kind == "iri":
        return Token(IRI, lexeme, pos, lexeme[1:-1])
    if kind == "badstring":
        raise _LexError("unterminated string: expected a closing '\"' on the same line", pos)
    if kind == "bad":
        raise _LexError(f"unexpected character {lexeme!r}", pos)
    return Token(_KINDS[kind], lexeme, pos)


_KINDS = {"label": LABEL, "pname": PNAME, "lang": LANG, "var": VAR, "cmp": CMP, "punct": PUNCT}


def _unescape(body: str, offset: int) -> str:
    def replace(found: re.Match[str]) -> str:
        short, long, char = found.groups()
        if short or long:
            code = int(short or long, 16)
            if 0xD800 <= code <= 0xDFFF:
                raise _LexError(
                    f"bad string escape '{found.group()}': U+{code:04X} is a surrogate (half "
                    "of a UTF-16 pair), not a character; write the character itself or "
                    "\\UXXXXXXXX",
                    offset + found.start(),
                )
            if code <= 0x10FFFF:
                return chr(code)
            raise _LexError(f"bad string escape {found.group()!r}: beyond Unicode", offset)
        if char in _SIMPLE_ESCAPES:
            return _SIMPLE_ESCAPES[char]
        where = offset + found.start()
        if char in "uU":
            digits = 4 if char == "u" else 8
            raise _LexError(f"bad string escape '\\{char}': expected {digits} hex digits", where)
        raise _LexError(
            f"bad string escape '\\{char}': expected one of "
            '\\" \\\\ \\n \\t \\r \\b \\f \\uXXXX \\UXXXXXXXX',
            where,
        )

    return _ESCAPE.sub(replace, body)


def _ends_operand(token: Token) -> bool:
    """Whether a ``-`` after ``token`` is a binary minus (``Z-1``) rather than a sign (``, -1``)."""
    if token.kind in _OPERAND_END_KINDS:
        return token.text.lower() != "and"
    return token.kind == PUNCT and token.text == ")"


def _describe(token: Token) -> str:
    if token.kind == EOF:
        return "end of input"
    text = token.text if len(token.text) <= 40 else token.text[:37] + "..."
    return f"'{text}'"


# --- parser -------------------------------------------------------------------------------


class _Parser:
    """One instance per text. Methods named after the grammar productions above."""

    def __init__(self, text: str, source: str, prefixes: Mapping[str, str] | None = None):
        self.text = text[1:] if text.startswith("\ufeff") else text
        self.source = source
        self.tokens = tokenize(self.text)
        self.tokens += [self.tokens[-1]] * 2  # EOF padding so that peek(2) needs no bounds check
        self.index = 0
        self.prefixes = dict(PREDEFINED_PREFIXES)
        self.prefixes.update(prefixes or {})
        # Names of the form _N written by the user: anonymous variables must avoid them.
        self.taken = {t.text for t in self.tokens if t.kind == VAR and t.text[0] == "_"}
        self.anonymous = 0
        self.names_anonymous = True  # (a rule's ``_`` each get a name; a pattern's stay ``_``)
        self.in_pattern = False  # (one atom given on a command line: it cannot hold @prefix)
        self.depth = 0  # expression nesting (see enter)
        self.operators = 0  # operators of the current top-level expression (see operator)

    # -- token access

    def peek(self, ahead: int = 0) -> Token:
        token = self.tokens[self.index + ahead]  # never past the padding: ahead <= 2
        if token.kind == ERROR:
            raise self.error(token, str(token.value))
        return token

    def advance(self) -> Token:
        token = self.peek()
        if token.kind != EOF:
            self.index += 1
        return token

    def at_punct(self, text: str, ahead: int = 0) -> bool:
        token = self.peek(ahead)
        return token.kind == PUNCT and token.text == text

    def at_word(self, word: str, ahead: int = 0) -> bool:
        token = self.peek(ahead)
        return token.kind in (NAME, VAR) and token.text.lower() == word

    def expect_punct(self, text: str, where: str) -> Token:
        if not self.at_punct(text):
            self.fail(f"expected '{text}' {where}")
        return self.advance()

    def expect_word(self, word: str, where: str) -> Token:
        if not self.at_word(word):
            self.fail(f"expected '{word}' {where}")
        return self.advance()

    def fail(self, expected: str) -> NoReturn:
        token = self.peek()
        raise self.error(token, f"{expected}, found {_describe(token)}")

    def error(self, token: Token, message: str) -> ParseError:
        line, column = self.position(token.pos)
        return ParseError(message, source=self.source, line=line, column=column)

    def position(self, pos: int) -> tuple[int, int]:
        line = self.text.count("\n", 0, pos) + 1
        return line, pos - self.text.rfind("\n", 0, pos)

    def location(self, token: Token) -> str:
        line, column = self.position(token.pos)
        return f"{self.source}:{line}:{column}"

    # -- statements

    def program(self) -> Program:
        rules: list[Rule] = []
        facts: list[Atom] = []
        labels: dict[str, Rule] = {}
        self.windows: dict[str, tuple[WindowDeclaration, Token]] = {}  # by relation
        self.watches: dict[Atom, None] = {}
        while self.peek().kind != EOF:
            if self.at_directive():
                self.directive()
            else:
                self.clause(rules, facts, labels)
        self.check_windows(rules)
        windows = tuple(window for window, _ in self.windows.values())
        return Program(tuple(rules), tuple(facts), windows, tuple(self.watches))

    def check_windows(self, rules: list[Rule]) -> None:
        """A window's relation is the agent's alone: no rule of the program derives it."""
        heads = {head.predicate for rule in rules for head in rule.heads}
        for window, token in self.windows.values():
            if window.relation in heads:
                raise self.error(
                    token,
                    f"the window relation <{window.relation}> is the head of a rule; a "
                    "window's facts are kept by the agent from its readings, no rule may "
                    "derive them",
                )

    def single_atom(self) -> Atom:
        atom = self.atom()
        if self.at_punct("."):
            self.advance()
        if self.peek().kind != EOF:
            self.fail("expected end of input after the atom")
        return atom

    def at_directive(self) -> bool:
        token = self.peek()
        if token.kind == LANG:
            return True
        if token.kind in (NAME, VAR) and token.text.lower() == "prefix":
            after = self.peek(1)
            return (
                after.kind == LABEL
                or (after.kind == PUNCT and after.text == ":")
                or (after.kind in (NAME, VAR) and self.at_punct(":", 2))
            )
        return False

    def directive(self) -> None:
        keyword = self.advance()
        turtle_style = keyword.kind == LANG
        word = keyword.text.lower()
        if turtle_style and word == "@window":
            return self.window(keyword)
        if turtle_style and word == "@watch":
            return self.watch()
        if turtle_style and word != "@prefix":
            raise self.error(
                keyword,
                f"unknown directive {_describe(keyword)}; expected '@prefix', '@window' or "
                "'@watch'",
            )
        name = self.prefix_name()
        token = self.peek()
        if token.kind == IRI:
            namespace = str(token.value)
        elif token.kind == CMP and token.text == "<>":
            namespace = ""
        else:
            self.fail(f"expected <iri> after the prefix name '{name}:'")
        self.advance()
        if turtle_style:
            self.expect_punct(".", "after @prefix declaration")
        elif self.at_punct("."):
            self.advance()
        self.prefixes[name] = namespace

    def window(self, keyword: Token) -> None:
        """``@window <reading> N unit as <relation> .`` (see the module docstring)."""
        reading = self.predicate()
        token = self.peek()
        if token.kind != NUMBER or not is_number(token.value) or token.value <= 0:
            self.fail("expected the window's length, a positive number, after its reading")
        self.advance()
        unit = self.peek()
        size = WINDOW_UNITS.get(unit.text.lower()) if unit.kind in (NAME, VAR) else None
        if size is None:
            self.fail("expected a unit of time (s, min or h) after the window's length")
        self.advance()
        self.expect_word("as", "after the window's length")
        relation = self.predicate()
        self.expect_punct(".", "at the end of the @window declaration")
        window = WindowDeclaration(reading, float(token.value) * size, relation)  # type: ignore[operator]
        if relation == reading:
            raise self.error(
                keyword, f"the window relation <{relation}> is its own reading predicate"
            )
        known = self.windows.get(relation)
        if known is not None and known[0] != window:
            line, column = self.position(known[1].pos)
            raise self.error(
                keyword,
                f"the window relation <{relation}> is declared twice, differently: {window} "
                f"and, at line {line}, column {column}, {known[0]}",
            )
        self.windows.setdefault(relation, (window, keyword))

    def watch(self) -> None:
        """``@watch <pattern> .``: the pattern's anonymous ``_`` stay anonymous (as in
        `parse_atom`)."""
        self.names_anonymous = False
        try:
            pattern = self.atom()
        finally:
            self.names_anonymous = True
        self.expect_punct(".", "at the end of the @watch declaration")
        self.watches.setdefault(pattern, None)

    def prefix_name(self) -> str:
        token = self.peek()
        if token.kind == LABEL:
            self.advance()
            return token.text[:-1]
        if token.kind in (NAME, VAR) and self.at_punct(":", 1):
            self.index += 2
            return token.text
        if token.kind == PUNCT and token.text == ":":
            self.advance()
            return ""
        self.fail("expected a prefix name such as 'ex:'")

    def clause(self, rules: list[Rule], facts: list[Atom], labels: dict[str, Rule]) -> None:
        start = self.peek()
        self.anonymous = 0
        label = self.label()
        heads = [self.atom(in_head=True)]
        while self.at_punct(","):
            self.advance()
            heads.append(self.atom(in_head=True))
        if self.at_punct(":-"):
            self.advance()
            body = self.body(closing=".", inside_aggregate=False)
            self.expect_punct(".", "at the end of the rule")
            rule = Rule(heads[0], tuple(body), label, tuple(heads[1:]))
            where = lambda: self.location(start)  # noqa: E731 - only evaluated on error
            check_rule(rule, location=where)
            check_label(labels, rule, location=where)
            rules.append(rule)
        elif self.at_punct("."):
            for head in heads:
                self.fact(start, label, head)
            self.advance()
            facts.extend(heads)
        else:
            self.fail("expected ':-', ',' or '.' after a head atom")

    def label(self) -> str | None:
        token = self.peek()
        if token.kind == LABEL:
            self.advance()
            return token.text[:-1]
        if token.kind in (NAME, VAR) and self.at_punct(":", 1):
            if not is_valid_label(token.text):
                raise self.error(token, f"invalid rule label {_describe(token)}")
            self.index += 2
            return token.text
        return None

    def fact(self, start: Token, label: str | None, head: Atom) -> None:
        if label is not None:
            raise self.error(start, f"a fact cannot have a label ('{label}:')")
        if not head.is_ground():
            names = ", ".join(dict.fromkeys(str(v) for v in head.terms if isinstance(v, Variable)))
            raise UnsafeRuleError(
                f"{self.location(start)}: a fact must be ground, but {head} has variables "
                f"{names}; did you forget ':-' and a body?"
            )

    # -- bodies

    def body(self, *, closing: str, inside_aggregate: bool) -> list[BodyItem]:
        items = [self.item(inside_aggregate)]
        while True:
            if self.at_punct(",") or self.at_word("and"):
                self.advance()
                items.append(self.item(inside_aggregate))
            elif self.at_punct(closing):
                return items
            else:
                self.fail(f"expected 'and', ',' or '{closing}' after body item")

    def item(self, inside_aggregate: bool) -> BodyItem:
        token = self.peek()
        if token.kind in (EOF, LABEL, LANG, CMP) or (
            token.kind == PUNCT and token.text not in ("(", "-")
        ):
            self.fail("expected a body item (atom, not, COMP, bind, aggregate or comparison)")
        word = token.text.lower() if token.kind in (NAME, VAR) else ""
        after = self.peek(1)
        if word == "not" and after.kind != CMP and not self.at_arithmetic(1):
            self.advance()
            return Negation(self.atom())
        if word and after.kind == PUNCT and after.text == "(":
            if word == "comp":
                return self.comp()
            if word == "bind":
                return self.bind()
            if word == "aggregate":
                if inside_aggregate:
                    raise self.error(token, "an aggregate cannot contain another aggregate")
                return self.aggregate()
        starts_atom = token.kind in (IRI, PNAME, NAME) and after.kind == PUNCT and after.text == "("
        if starts_atom and not (word in FUNCTION_NAMES and self.call_then_operator()):
            return self.atom()
        return self.plain_comparison()

    def at_arithmetic(self, ahead: int = 0) -> bool:
        token = self.peek(ahead)
        return token.kind == PUNCT and token.text in _ARITHMETIC

    def call_then_operator(self) -> bool:
        """At ``name(``: whether the matching ``)`` is followed by an operator, i.e. this is a
        function call starting a comparison (``abs(X) > 3``) rather than an atom ``max(X, Y)``."""
        depth, index = 0, self.index + 1
        while index < len(self.tokens):
            token = self.tokens[index]
            if token.kind in (EOF, ERROR):
                return False
            if token.kind == PUNCT and token.text == "(":
                depth += 1
            elif token.kind == PUNCT and token.text == ")":
                depth -= 1
                if depth == 0:
                    following = self.tokens[index + 1]
                    return following.kind == CMP or (
                        following.kind == PUNCT and following.text in _ARITHMETIC
                    )
            index += 1
        return False

    def comp(self) -> Comparison:
        self.advance()
        self.expect_punct("(", "after COMP")
        left = self.expr()
        self.expect_punct(",", "after the left operand of COMP")
        op = self.compare_op("as the operator of COMP")
        self.expect_punct(",", "after the operator of COMP")
        right = self.expr()
        self.expect_punct(")", "to close COMP(")
        return Comparison(left, op, right)

    def plain_comparison(self) -> Comparison:
        left = self.expr()
        op = self.compare_op("after the expression (or an atom, 'not', COMP, bind, aggregate)")
        right = self.expr()
        return Comparison(left, op, right)

    def compare_op(self, where: str) -> str:
        token = self.peek()
        if token.kind == CMP:
            if token.text in _COMPARISONS:
                self.advance()
                return _COMPARISONS[token.text]
            raise self.error(
                token,
                f"unknown comparison operator {_describe(token)}; "
                "expected one of < <= = != >= > (or == <>)",
            )
        self.fail(f"expected a comparison operator (< <= = != >= >) {where}")

    def bind(self) -> Bind:
        self.advance()
        self.expect_punct("(", "after bind")
        expr = self.expr()
        self.expect_word("as", "after the bind expression")
        variable = self.variable("after 'as' in bind")
        self.expect_punct(")", "to close bind(")
        return Bind(expr, variable)

    def aggregate(self) -> Aggregate:
        self.advance()
        self.expect_punct("(", "after aggregate")
        body = self.body(closing=")", inside_aggregate=True)
        self.advance()
        group: list[Variable] = []
        if self.at_word("on"):
            self.advance()
            group.append(self.variable("after 'on'"))
            while self.at_punct(","):
                self.advance()
                group.append(self.variable("after ',' in the group-by list"))
            self.expect_word("with", "after the group-by variables")
        else:
            self.expect_word("with", "or 'on' after the aggregate body")
        function = self.aggregate_function()
        self.expect_punct("(", f"after the aggregate function {function}")
        argument = self.term(allow_anonymous=False)
        self.expect_punct(")", "after the aggregate argument")
        self.expect_word("as", "after the aggregate function")
        result = self.variable("after 'as' in the aggregate")
        return Aggregate(tuple(body), tuple(group), function, argument, result)

    def aggregate_function(self) -> str:
        token = self.peek()
        name = token.text.lower()
        if token.kind in (NAME, VAR) and name in AGGREGATE_FUNCTIONS:
            self.advance()
            return name
        known = ", ".join(AGGREGATE_FUNCTIONS)
        if token.kind in (NAME, VAR):
            raise self.error(
                token, f"unknown aggregate function {_describe(token)}; expected one of {known}"
            )
        self.fail(f"expected an aggregate function ({known}) after 'with'")

    # -- expressions

    def expr(self) -> Expr:
        if self.depth == 0:
            self.operators = 0
        self.enter()
        try:
            left = self.product()
            while self.at_punct("+") or self.at_punct("-"):
                op = self.operator().text
                left = BinaryOp(op, left, self.product())
            return left
        finally:
            self.depth -= 1

    def product(self) -> Expr:
        left = self.unary()
        while self.at_punct("*") or self.at_punct("/"):
            op = self.operator().text
            left = BinaryOp(op, left, self.unary())
        return left

    def unary(self) -> Expr:
        if not self.at_punct("-"):
            return self.primary()
        self.operator()
        self.enter()
        try:
            operand = self.unary()
        finally:
            self.depth -= 1
        if isinstance(operand, Constant) and is_number(operand.value):
            return Constant(-operand.value)  # type: ignore[operator]
        return BinaryOp("-", Constant(0), operand)

    def enter(self) -> None:
        """One level deeper into an expression (parentheses, a call, a unary minus). Every
        later stage (validation, planning, compiling, explaining) walks expressions
        recursively, so depth is bounded here, where the error can name a line and column."""
        self.depth += 1
        if self.depth > MAX_EXPRESSION_DEPTH:
            raise self.error(
                self.peek(), f"expression nested deeper than {MAX_EXPRESSION_DEPTH} levels"
            )

    def operator(self) -> Token:
        """Take an arithmetic operator, counting it: a flat sum is a deep tree too."""
        self.operators += 1
        if self.operators > MAX_EXPRESSION_OPERATORS:
            raise self.error(
                self.peek(),
                f"an expression has at most {MAX_EXPRESSION_OPERATORS} operators: split it "
                "into several binds",
            )
        return self.advance()

    def primary(self) -> Expr:
        token = self.peek()
        if token.kind == PUNCT and token.text == "(":
            self.advance()
            inner = self.expr()
            if not self.at_punct(")"):
                line, column = self.position(token.pos)
                self.fail(f"expected ')' to close the '(' at line {line}, column {column}")
            self.advance()
            return inner
        if token.kind in (NAME, VAR) and self.at_punct("(", 1):
            return self.call()
        return self.term(allow_anonymous=False)

    def call(self) -> Call:
        token = self.advance()
        name = token.text.lower()
        if name not in FUNCTION_NAMES and token.kind == VAR:
            raise self.error(
                token,
                f"a variable cannot be a predicate, and {_describe(token)} is not a function "
                f"({', '.join(FUNCTION_NAMES)})",
            )
        if name not in FUNCTION_NAMES:
            raise self.error(
                token,
                f"unknown function {_describe(token)}; expected one of {', '.join(FUNCTION_NAMES)} "
                "(a predicate cannot be used inside an expression)",
            )
        self.advance()
        args = [self.expr()]
        while self.at_punct(","):
            self.advance()
            args.append(self.expr())
        self.expect_punct(")", f"or ',' after an argument of {name}")
        problem = arity_error(name, len(args))
        if problem:
            raise self.error(token, problem)
        return Call(name, tuple(args))

    # -- atoms and terms

    def atom(self, *, in_head: bool = False) -> Atom:
        predicate = self.predicate()
        self.expect_punct("(", f"after the predicate {predicate!r}")
        terms = [self.term(allow_anonymous=not in_head)]
        while True:
            if self.at_punct(","):
                self.advance()
                last = self.peek()
                terms.append(self.term(allow_anonymous=not in_head))
            elif self.at_punct(")"):
                self.advance()
                break
            else:
                self.fail("expected ')' or ',' after term")
        if predicate == RDF_TYPE and len(terms) == 2:
            return Atom(self.class_of(terms[1], last), (terms[0],))
        return Atom(predicate, tuple(terms))

    def class_of(self, term: Term, where: Token) -> str:
        """The class C of ``rdf:type(X, C)``, which becomes the unary atom ``C(X)``."""
        if isinstance(term, Variable):
            raise RuleError(
                f"{self.location(where)}: rdf:type with a variable class is not supported; "
                "write <C>(X) per class"
            )
        if not isinstance(term.value, str):
            raise RuleError(
                f"{self.location(where)}: the class of an rdf:type atom must be an IRI, not {term}"
            )
        return term.value

    def predicate(self) -> str:
        token = self.peek()
        if token.kind == IRI:
            self.advance()
            return str(token.value)
        if token.kind == PNAME:
            return self.expand(self.advance())
        if token.kind == NAME:
            self.advance()
            return token.text
        what = "a variable cannot be a predicate" if token.kind == VAR else ""
        self.fail(
            "expected a predicate (<iri>, prefix:name or a lower-case name)"
            + (f" ({what})" if what else "")
        )

    def term(self, *, allow_anonymous: bool) -> Term:
        token = self.peek()
        kind = token.kind
        if kind == VAR:
            self.advance()
            return Variable(token.text)
        if kind == ANON:
            if not allow_anonymous:
                raise self.error(token, "the anonymous variable '_' is only allowed in body atoms")
            self.advance()
            return self.fresh_variable()
        if kind in (NUMBER, IRI):
            self.advance()
            return Constant(token.value)  # type: ignore[arg-type]
        if kind == PNAME:
            return Constant(self.expand(self.advance()))
        if kind == NAME:
            self.advance()
            if token.text in ("true", "false"):
                return Constant(token.text == "true")
            return Constant(token.text)
        if kind == STRING:
            return Constant(self.literal())
        self.fail("expected a term (variable, <iri>, prefix:name, number or string)")

    def literal(self) -> Value:
        start = self.peek()
        try:
            return self.typed_literal()
        except NonFiniteError as error:
            raise self.error(start, str(error)) from None

    def typed_literal(self) -> Value:
        lexical = str(self.advance().value)
        if self.peek().kind == LANG:
            return literal_value(lexical, None, self.advance().text[1:])
        if self.at_punct("^^"):
            self.advance()
            token = self.peek()
            if token.kind == IRI:
                self.advance()
                return literal_value(lexical, str(token.value))
            if token.kind == PNAME:
                return literal_value(lexical, self.expand(self.advance()))
            self.fail("expected a datatype (<iri> or prefix:name) after '^^'")
        return Literal(lexical)

    def expand(self, token: Token) -> str:
        prefix, _, local = token.text.partition(":")
        namespace = self.prefixes.get(prefix)
        if namespace is None:
            advice = (
                f"declare it in the rule file with @prefix {prefix}: <...> . or write the "
                "full <iri>"
                if self.in_pattern
                else f"declare it first with @prefix {prefix}: <...> ."
            )
            raise self.error(token, f"unknown prefix '{prefix}:' in {_describe(token)}; {advice}")
        return namespace + local

    def variable(self, where: str) -> Variable:
        token = self.peek()
        if token.kind != VAR:
            self.fail(f"expected a variable {where}")
        self.advance()
        return Variable(token.text)

    def fresh_variable(self) -> Variable:
        if not self.names_anonymous:
            return Variable(ANONYMOUS)
        while True:
            self.anonymous += 1
            name = f"_{self.anonymous}"
            if name not in self.taken:
                return Variable(name)
