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
        self.reason = message
        super().__init__(f"{source}:{line}:{column}: {message}")


class RuleError(ZodiacError):
    """A rule that parses but cannot be accepted (unsafe, bad aggregate, duplicate label...)."""

    def __init__(self, message: str, *, rule: str | None = None):
        self.rule = rule
        super().__init__(f"{message}" + (f"\n  in rule: {rule}" if rule else ""))


class UnsafeRuleError(RuleError):
    """A head, comparison, bind or negated variable that no positive atom binds."""


class StratificationError(ZodiacError):
    """Negation or aggregation through recursion: names the cycle of rules."""

    def __init__(self, message: str, cycle: list[str] | None = None):
        self.cycle = cycle or []
        super().__init__(message)


class UnknownRuleError(ZodiacError):
    """``delete_rules`` named a rule the reasoner does not have."""
