"""Errors the engine raises. Every one leaves the reasoner exactly as it was before the call."""

from __future__ import annotations


class ZodiacError(Exception):
    """Base class of every error raised on bad input."""


class ParseError(ZodiacError):
    """A syntax error in rule text or a fact file, with where it happened and what was expected."""

    def __init__(self, message: str, *, source: str = "<text>", line: int = 0, column: int = 0):
        self.source = source
        self.line = line
        self.column = column
        self.reason = message = printable(message)
        super().__init__(f"{source}:{line}:{column}: {message}")


class RuleError(ZodiacError):
    """A rule that parses but cannot be accepted (unsafe, bad aggregate, duplicate label...)."""

    def __init__(self, message: str, *, rule: str | None = None):
        self.rule = rule  # the whole text, for a caller that wants it
        super().__init__(f"{message}" + (f"\n  in rule: {shortened(rule)}" if rule else ""))


def printable(text: str) -> str:
    """``text`` with any lone surrogate as its escape (``\\ud800``): error messages quote
    input, and one holding a lone surrogate (see NotTextError) could be neither printed nor
    logged nor sent."""
    if text.isascii():
        return text
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


# How much of a rule an error message quotes: a rule refused for being huge (10,000 atoms) would
# otherwise fill a terminal or a log line with hundreds of kilobytes.
QUOTED_RULE_CHARS = 400


def shortened(text: str, limit: int = QUOTED_RULE_CHARS) -> str:
    """``text`` (`printable`) when short, else its start and end around the number of
    characters left out."""
    text = printable(text)
    if len(text) <= limit:
        return text
    keep = limit // 2
    return f"{text[:keep]} ... ({len(text) - 2 * keep} characters) ... {text[-keep:]}"


class UnsafeRuleError(RuleError):
    """A head, comparison, bind or negated variable that no positive atom binds."""


class StratificationError(ZodiacError):
    """Negation or aggregation through recursion: names the cycle of rules."""

    def __init__(self, message: str, cycle: list[str] | None = None):
        self.cycle = cycle or []
        super().__init__(message)


class DirectiveError(ZodiacError):
    """A program given to the engine has directives only the agent keeps: windows over its
    readings (``@window``) or watched patterns (``@watch``)."""


def refuse_directives(windows: tuple, watches: tuple) -> None:
    """Raise DirectiveError when a program to materialise declares windows or watches: the
    engine (and ``zodiac materialise``, the Spark job) has no readings over time, and no
    events to send; materialising the rest silently would give other answers than the agent."""
    if windows:
        raise DirectiveError(
            f"windows ({windows[0]}) are kept by the agent over its readings, not "
            "materialised by the engine: give the program to zodiac-agent (a bundle or "
            "[reasoning] rules), or remove its @window lines to materialise it here"
        )
    if watches:
        raise DirectiveError(
            f"watches (@watch {watches[0]} .) are the agent's (it publishes their changes as "
            "events), not materialised by the engine: give the program to zodiac-agent, or "
            "remove its @watch lines to materialise it here"
        )


class UnknownRuleError(ZodiacError):
    """``delete_rules`` named a rule the reasoner does not have."""


def read_bytes(path, what: str) -> bytes:
    """The bytes of an input file, or a ZodiacError that says which file and why (missing, a
    directory, unreadable) instead of an OSError's traceback."""
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except FileNotFoundError:
        raise ZodiacError(f"no such {what}: {path}") from None
    except IsADirectoryError:
        raise ZodiacError(f"{what} {path} is a directory, not a file") from None
    except OSError as error:
        raise ZodiacError(f"cannot read {what} {path}: {error.strerror or error}") from None


class NonFiniteError(ZodiacError, ValueError):
    """A NaN or an infinity where a number is stored (a literal, a fact, a computed value).
    They are refused everywhere (docs/semantics.md): NaN equals nothing, not even itself, so it
    cannot be a term. A ValueError too, so that a bind computing one is a run-time error."""

    def __init__(self, value: object) -> None:
        super().__init__(
            f"not a finite number: {value!r} (NaN and INF are refused as numbers, see "
            "docs/semantics.md)"
        )


class NotTextError(ZodiacError, ValueError):
    """A string that is not Unicode text: it holds a lone surrogate (half of a UTF-16 pair,
    which an escape such as ``\\uD800`` in rule text or N-Triples spells), so no UTF-8 file
    or message can hold it: not the agent's state, not a bundle, not the cloud's output.
    Refused where a term or a predicate comes in, as bad input, before anything changes."""

    def __init__(self, value: str) -> None:
        bad = next((c for c in value if 0xD800 <= ord(c) <= 0xDFFF), "?")
        shown = repr(value) if len(value) <= 60 else repr(value[:57]) + "..."
        super().__init__(
            f"not Unicode text: {shown} holds the lone surrogate U+{ord(bad):04X} (half of a "
            "UTF-16 pair, not a character)"
        )


def check_text(value: str) -> str:
    """``value`` if it is Unicode text (encodable as UTF-8), else NotTextError."""
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise NotTextError(value) from None
    return value


def decode_utf8(data: bytes, source: str) -> str:
    """``data`` as text; a byte sequence that is not UTF-8 is a ParseError at its line and
    column (a Latin-1 file, say), which the decoder's own error names only by byte offset."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        column = err.start - (data.rfind(b"\n", 0, err.start) + 1) + 1
        raise ParseError(
            "the file is not valid UTF-8", source=source, line=line, column=column
        ) from None
