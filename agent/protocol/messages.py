"""The messages between the cloud and an edge agent: rule bundles, device status, rule requests and
telemetry, as pydantic models encoded with msgpack, and the one error type for refusing them.

Keys live in :mod:`agent.protocol.keys`, signing and opening bundles in
:mod:`agent.protocol.signing`.

A bundle is a pydantic model (:class:`Bundle`) encoded with msgpack. It belongs to a *stream*
(``base``, ``anomaly/ambient-temperature``...) and carries a version that increases by one per
bundle of that stream, plus a list of operations applied in order: add rules, delete rules by id,
add facts, delete facts. The agent remembers the highest version applied per stream, so a bundle
delivered twice (MQTT QoS 1 is "at least once") is a harmless no-op, and a missing version is
detected instead of silently leaving the device with half a rule set
(:func:`agent.protocol.signing.check_sequence`).
A ``full_state`` bundle is the whole content of its stream; the cloud sends one to recover a
device that reported a version gap.

Wire format
-----------
The payload on the wire is a msgpack map, the *envelope*::

    {"v": 1, "kid": "<key id>", "body": <bin: msgpack of the Bundle>, "sig": <bin: 64 bytes>}

``sig`` is an Ed25519 signature over exactly the ``body`` bytes, so no canonical encoding is
needed: the device verifies the bytes it received, then decodes those same bytes. Facts are
lists ``[predicate, arg1, ...]`` of encoded terms: a msgpack str is an IRI, ints, floats and
booleans are themselves, and any other RDF literal is a map ``{"lit": lexical, "dt": datatype or
nil, "lang": language or nil}`` (:func:`encode_term` / :func:`decode_term`).

Every refusal is a :class:`BundleError` with a machine-readable ``reason`` (reported to the
cloud in the device status) and a message that says what and where.

This module is imported by the edge agent: it must not import pyspark or anything from
``cloud``; the cloud imports it to build and sign bundles.
"""

from __future__ import annotations

import dataclasses
import datetime
import math
import re
import reprlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeVar

import msgpack
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from agent.engine.errors import ParseError, RuleError, ZodiacError
from agent.engine.language import RDF_TYPE, Rule, Value, is_valid_label
from agent.engine.language import Literal as RdfLiteral
from agent.engine.program.parser import literal_value, parse_program
from agent.engine.program.validation import check_rule

ENVELOPE_VERSION = 1
SIGNATURE_BYTES = 64

#: Every ``BundleError.reason``; the agent reports it verbatim in its status.
REASONS = (
    "too_large",
    "malformed",
    "unknown_key",
    "bad_signature",
    "invalid",
    "too_many_operations",
    "expired",
    "bad_rule",
    "version_gap",
    "wrong_audience",
    "not_owner",
    "budget_exceeded",
    "not_yet_valid",
    "too_many_streams",
    "no_history",
)

#: The audience ``device`` of a bundle for every device of its farm (the farm-wide topic
#: ``zodiac/<farm>/all/bundle``); no device may be called so (agent/config.py).
FARM_WIDE = "all"
#: Sources of an agent's facts that are not bundle streams (agent/service.py): a bundle may not
#: use their names, or it could delete a device's readings.
RESERVED_STREAMS = ("local", "sensor", "window")
RESERVED_STREAM_PREFIXES = ("telemetry/",)
#: How much of an unsigned, untrusted value an error message may repeat.
ECHO_LIMIT = 80

#: The longest stream name a bundle may carry: the name is a key of every status the device
#: publishes, and the status must stay small.
MAX_STREAM_NAME = 100
#: The latest time a bundle may name (the last second of the year 9999, UTC): anything later is
#: no real time, only a way to make a bundle never expire.
MAX_TIMESTAMP = 253402300799.0
#: The longest a bundle may be valid (``expires_at - issued_at``): a year. The cloud's default
#: is a week (``zodiac-cloud --bundle-ttl``); a longer life only helps whoever captured it.
MAX_BUNDLE_LIFETIME = 366 * 24 * 3600.0

_STREAM = re.compile(r"[A-Za-z0-9._/-]+")
# Device, farm and key names end up in MQTT topics and file names: no '/', '+', '#' or spaces.
_NAME = re.compile(r"[A-Za-z0-9._-]+")
_ENVELOPE_KEYS = frozenset({"v", "kid", "body", "sig"})
# msgpack integers are at most 64 bits; refusing bigger ones in the schema turns what would be
# an OverflowError deep in msgpack.packb into an ordinary validation error.
_INT_MIN, _INT_MAX = -(2**63), 2**64 - 1


class BundleError(ZodiacError):
    """A bundle (or model payload) the agent refuses; nothing has been applied.

    ``reason`` is one of :data:`REASONS`, for machines (the device status, the cloud's retry
    logic); the message is for humans and names the bundle and stream when they are known.
    ``rule_id``/``line``/``column`` locate a ``bad_rule`` inside that rule's own text,
    ``version`` is the refused bundle's version (once its body could be read) and
    ``expected_version`` tells the cloud what a ``version_gap`` device is waiting for. Once the
    body is read, ``stream`` is the bundle's source (``all:<stream>`` for a farm-wide bundle),
    the version sequence the refusal is about.
    """

    def __init__(
        self,
        reason: str,
        message: str,
        *,
        bundle_id: str | None = None,
        stream: str | None = None,
        rule_id: str | None = None,
        line: int | None = None,
        column: int | None = None,
        expected_version: int | None = None,
        version: int | None = None,
    ):
        if reason not in REASONS:
            raise ValueError(f"unknown BundleError reason {reason!r}")
        self.reason = reason
        self.bundle_id = bundle_id
        self.stream = stream
        self.rule_id = rule_id
        self.line = line
        self.column = column
        self.expected_version = expected_version
        self.version = version
        self.detail = message
        super().__init__(_where(bundle_id, stream) + message)


def _where(bundle_id: str | None, stream: str | None) -> str:
    if bundle_id is not None and stream is not None:
        return f"bundle {bundle_id!r} (stream {stream!r}): "
    if bundle_id is not None:
        return f"bundle {bundle_id!r}: "
    if stream is not None:
        return f"bundle on stream {stream!r}: "
    return "bundle: "


# --- terms and facts ----------------------------------------------------------------------


class _Frozen(BaseModel):
    """Base of every wire model: immutable, strict (no "3" -> 3 coercion of untrusted input),
    and unknown fields refused, so a typo in the cloud fails loudly instead of being ignored."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)


class LiteralTerm(_Frozen):
    """An RDF literal on the wire: ``{"lit": lexical, "dt": datatype, "lang": language}``."""

    lit: str
    dt: str | None = None
    lang: str | None = None

    @model_validator(mode="after")
    def _not_both(self) -> LiteralTerm:
        # A language-tagged literal's datatype is implicitly rdf:langString; both is ambiguous.
        if self.dt is not None and self.lang is not None:
            raise ValueError("a literal has a datatype or a language tag, not both")
        try:  # "NaN"^^xsd:double is valid XSD but no value (docs/semantics.md): invalid here
            self.value()
        except ZodiacError as error:
            raise ValueError(str(error)) from None
        return self

    def value(self) -> Value:
        """The engine value (see :func:`decode_term`)."""
        return literal_value(self.lit, self.dt, self.lang)


def _term_before(value: Any) -> Any:
    # Lets Python callers (the cloud, tests) write facts with engine Literal objects.
    if isinstance(value, RdfLiteral):
        return encode_term(value)
    # Checked here, not with Field(ge=, le=) on the int member: the union would then quietly
    # fall through to float and turn 2**64 into 1.8e19.
    if isinstance(value, int) and not isinstance(value, bool) and not _INT_MIN <= value <= _INT_MAX:
        raise ValueError(f"integer {value} does not fit in 64 bits")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{value} is not a value (NaN and infinities are refused)")
    return value


Term = Annotated[
    str | bool | int | float | LiteralTerm,
    Field(union_mode="left_to_right"),
    BeforeValidator(_term_before),
]


def _fact_before(value: Any) -> Any:
    # Tuples are the engine's fact shape; the wire (msgpack) only ever gives lists.
    return list(value) if isinstance(value, tuple) else value


def _fact_after(fact: list[Any]) -> list[Any]:
    if len(fact) < 2:
        raise ValueError("a fact is [predicate, arg1, ...] with at least one argument")
    predicate = fact[0]
    if not isinstance(predicate, str) or not predicate:
        raise ValueError(f"a fact's predicate must be a non-empty IRI, got {clip(predicate)}")
    if predicate == RDF_TYPE and len(fact) == 3 and not isinstance(fact[2], str):
        # The engine stores class facts in the class's unary relation: C must be an IRI.
        raise ValueError(f"the class of an rdf:type fact must be an IRI, got {clip(fact[2])}")
    return fact


Fact = Annotated[
    list[Term],
    BeforeValidator(_fact_before),
    AfterValidator(_fact_after),
    # (for the JSON Schema only: _fact_after checks it, with a message that says why)
    Field(json_schema_extra={"minItems": 2}),
]


def encode_term(value: Value) -> str | int | float | bool | dict[str, str | None]:
    """An engine value -> its msgpack form (an RDF literal becomes a ``lit/dt/lang`` map)."""
    if isinstance(value, (str, bool, int, float)):
        return value
    if isinstance(value, RdfLiteral):
        return {"lit": value.lexical, "dt": value.datatype, "lang": value.language}
    raise TypeError(f"not a term: {value!r}")


def decode_term(obj: Any) -> Value:
    """A term as found on the wire (or in a validated model) -> the engine value.

    Literals go through the parser's :func:`~agent.engine.program.parser.literal_value`, so
    ``{"lit": "5", "dt": xsd:integer}`` becomes ``5`` and ``xsd:string`` is dropped: a fact sent
    in a bundle is the same term as the same constant written in a rule or read from RDF.
    """
    if isinstance(obj, LiteralTerm):
        return obj.value()
    if isinstance(obj, (str, bool, int, float)):
        return obj
    if isinstance(obj, dict):
        try:
            return LiteralTerm.model_validate(obj).value()
        except ValidationError as err:
            raise BundleError("invalid", f"bad literal {clip(obj)}: {_summary(err)}") from None
    raise BundleError("invalid", f"not a term: {clip(obj)}")


def encode_fact(fact: tuple[Value, ...]) -> list[Any]:
    """An engine fact tuple ``(predicate, *values)`` -> its wire list."""
    return [encode_term(value) for value in fact]


def fact_tuple(fact: list[Any]) -> tuple[Value, ...]:
    """A validated wire fact -> the engine's fact tuple ``(predicate, *values)``."""
    return tuple(decode_term(term) for term in fact)


# --- operations ---------------------------------------------------------------------------


def clip(value: object, limit: int = ECHO_LIMIT) -> str:
    """``repr(value)``, cut to ``limit`` characters: error messages and the status repeat
    input that nobody signed (a key id, a field of an invalid bundle), which may be huge or
    nested a thousand lists deep (``reprlib`` stops at a few levels and a few items, so the
    text is short and never recurses deeply)."""
    text = _ECHO.repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


_ECHO = reprlib.Repr()
_ECHO.maxlevel = 4
_ECHO.maxlist = _ECHO.maxtuple = _ECHO.maxdict = _ECHO.maxset = 8
_ECHO.maxstring = _ECHO.maxother = 2 * ECHO_LIMIT


def _check_stream(value: str) -> str:
    if not _STREAM.fullmatch(value):
        raise ValueError(f"a stream name is made of [A-Za-z0-9._/-], got {clip(value)}")
    if value in RESERVED_STREAMS or value.startswith(RESERVED_STREAM_PREFIXES):
        raise ValueError(f"stream name {value!r} is reserved for the device's own sources")
    return value


def _check_stream_length(value: str) -> str:
    if len(value) > MAX_STREAM_NAME:
        raise ValueError(
            f"a stream name is at most {MAX_STREAM_NAME} characters, got {len(value)}: "
            f"{clip(value)}"
        )
    return value


def _check_name(value: str) -> str:
    if not _NAME.fullmatch(value):
        raise ValueError(f"a device or farm name is made of [A-Za-z0-9._-], got {clip(value)}")
    return value


def _check_rule_id(value: str) -> str:
    if not is_valid_label(value):
        raise ValueError(f"a rule id must be a valid rule label, got {clip(value)}")
    return value


RuleId = Annotated[str, AfterValidator(_check_rule_id)]
# A bundle's stream: checked for its length too (the status's ``applied`` keys stay unchecked, so
# that a state holding a longer name, accepted before the limit, still reports its status).
StreamName = Annotated[str, AfterValidator(_check_stream), AfterValidator(_check_stream_length)]
Name = Annotated[
    str, AfterValidator(_check_name), Field(json_schema_extra={"pattern": "^[A-Za-z0-9._-]+$"})
]
Timestamp = Annotated[float, Field(allow_inf_nan=False)]
# A time a bundle names: a real one, from 1970 to the end of the year 9999.
BundleTime = Annotated[float, Field(allow_inf_nan=False, ge=0, le=MAX_TIMESTAMP)]


def utc(timestamp: float) -> str:
    """A time as an operator reads it in a message: ISO 8601, UTC, to the second."""
    try:
        moment = datetime.datetime.fromtimestamp(timestamp, datetime.UTC)
    except (OverflowError, OSError, ValueError):
        return repr(timestamp)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


class RuleSpec(_Frozen):
    """One rule with the stable id the cloud (and ``delete_rules``) knows it by.

    ``text`` is exactly one rule in our rule language (prefix directives allowed); a label in the
    text is optional but, when present, must equal ``id``. The text is only parsed by
    :meth:`Bundle.parsed_rules`, so that a bad rule is reported as ``bad_rule`` with its position.
    """

    id: RuleId
    text: str


class AddRules(_Frozen):
    op: Literal["add_rules"] = "add_rules"
    rules: list[RuleSpec]

    @field_validator("rules")
    @classmethod
    def _unique_ids(cls, rules: list[RuleSpec]) -> list[RuleSpec]:
        # Two rules under one id in one operation: which one would delete_rules remove?
        seen: set[str] = set()
        for spec in rules:
            if spec.id in seen:
                raise ValueError(f"rule id {spec.id!r} appears twice")
            seen.add(spec.id)
        return rules

    def count(self) -> int:
        return len(self.rules)

    def parsed_rules(
        self, *, bundle_id: str | None = None, stream: str | None = None
    ) -> list[Rule]:
        """Parse and check every rule (see :func:`parse_rule_spec`)."""
        return [parse_rule_spec(spec, bundle_id=bundle_id, stream=stream) for spec in self.rules]


class DeleteRules(_Frozen):
    op: Literal["delete_rules"] = "delete_rules"
    ids: list[RuleId]

    def count(self) -> int:
        return len(self.ids)


class _FactOperation(_Frozen):
    """Shared behaviour of add_facts and delete_facts (each declares ``op`` then ``facts``, so
    the wire map reads in that order)."""

    if TYPE_CHECKING:  # declared by each subclass, after ``op``
        facts: list[list[Any]]

    def count(self) -> int:
        return len(self.facts)

    def fact_tuples(self) -> Iterator[tuple[Value, ...]]:
        """The facts as engine tuples ``(predicate, *values)``, literals as Literal objects."""
        for fact in self.facts:
            yield fact_tuple(fact)


class AddFacts(_FactOperation):
    op: Literal["add_facts"] = "add_facts"
    facts: list[Fact]


class DeleteFacts(_FactOperation):
    op: Literal["delete_facts"] = "delete_facts"
    facts: list[Fact]


Operation = Annotated[AddRules | DeleteRules | AddFacts | DeleteFacts, Field(discriminator="op")]


# --- models -------------------------------------------------------------------------------


def source_name(stream: str, *, farm_wide: bool) -> str:
    """See :attr:`Bundle.source`. ``:`` is not allowed in stream names, so the two kinds of
    sources never collide."""
    return f"{FARM_WIDE}:{stream}" if farm_wide else stream


def _check_source(value: str) -> str:
    prefix, colon, stream = value.partition(":")
    _check_stream(stream if colon and prefix == FARM_WIDE else value)
    return value


SourceName = Annotated[str, AfterValidator(_check_source)]


class Bundle(_Frozen):
    """A versioned batch of operations on one stream (see the module docstring).

    The audience is part of the signed body: ``farm`` and ``device`` (a device id, or
    :data:`FARM_WIDE` for every device of the farm). A device applies only bundles addressed to
    it or to its farm as a whole, so a bundle captured from another device's topic, or replayed
    to another farm, is refused (``wrong_audience``). Farm-wide and per-device bundles of the
    same stream name are two sequences of versions, and two sources of rules and facts.
    ``expires_at`` is required: a captured bundle is useless after it.
    ``supersedes`` names the streams (of the same audience) whose rules and facts this bundle
    may delete; otherwise a stream may only delete what it added itself.
    ``answers`` is the id of the device's rule request this bundle answers: signed, it is what
    links the request to the bundle's stream (and so what the device deletes when the event is
    resolved); the MQTT correlation data, which anyone on the path could set, is not."""

    bundle_id: Annotated[str, Field(min_length=1, max_length=200)]
    farm: Name
    device: Name
    stream: StreamName
    version: Annotated[int, Field(ge=1)]
    issued_at: BundleTime
    expires_at: BundleTime
    full_state: bool = False
    supersedes: list[StreamName] = []
    answers: Annotated[str, Field(min_length=1, max_length=200)] | None = None
    operations: list[Operation]
    # The stream's watches (atom patterns, e.g. ``<SensorAnomalyWindTurbine>(X)``): the
    # device publishes the changes of their facts as events (docs/agent.md, "Events"). A list
    # replaces the stream's watches; None keeps them (a full-state bundle: none). They go
    # with the stream: superseded, or left with no rule, it watches nothing.
    watches: list[Annotated[str, Field(min_length=1, max_length=500)]] | None = None
    # The stream's windows over readings (canonical ``@window <reading> 10 min as <relation> .``
    # texts, docs/agent.md "Windows"): the device keeps each reading of ``reading`` as a fact
    # ``relation(sensor, value, time)`` while its time is within the window. Like
    # ``watches``: a list replaces the stream's windows, None keeps them (a full-state
    # bundle: none); superseded, the stream's windows go with it.
    windows: (
        Annotated[list[Annotated[str, Field(min_length=1, max_length=1000)]], Field(max_length=100)]
        | None
    ) = None
    # A dry run: applied in a transaction that is rolled back. The device reports what it
    # would derive and what it would cost (``DeviceStatus.dry_run``) and changes nothing, its
    # stream version included: the same version may come again as a real bundle.
    dry_run: bool = False
    # A revert: the stream back to the rules, facts, watches and windows it held at version
    # ``revert_to``, which the device kept (``[limits] stream_history``), as this bundle's
    # version (versions only go up). It carries no operations of its own.
    revert_to: Annotated[int, Field(ge=1)] | None = None

    @model_validator(mode="after")
    def _revert_alone(self) -> Bundle:
        """A revert's content is the device's own copy of an earlier version: operations,
        watches, superseded streams or a full state beside it would say something else."""
        if self.revert_to is None:
            return self
        if self.revert_to >= self.version:
            raise ValueError(
                f"revert_to ({self.revert_to}) must be an earlier version than the bundle's "
                f"own ({self.version})"
            )
        if (
                self.operations
                or self.watches is not None
                or self.windows is not None
                or self.supersedes
                or self.full_state
            ):
            raise ValueError(
                "a revert carries no operations, watches, windows, supersedes or full_state: "
                "its content is the version it reverts to"
            )
        return self

    @model_validator(mode="after")
    def _sensible_times(self) -> Bundle:
        """A bundle is valid from ``issued_at`` to ``expires_at``: the second after the first,
        for at most :data:`MAX_BUNDLE_LIFETIME`. Whether the device's clock is inside that
        window is checked when it is opened (:func:`agent.protocol.signing.check_times`)."""
        if self.expires_at <= self.issued_at:
            raise ValueError(
                f"expires_at ({utc(self.expires_at)}) must be after issued_at "
                f"({utc(self.issued_at)})"
            )
        lifetime = self.expires_at - self.issued_at
        if lifetime > MAX_BUNDLE_LIFETIME:
            raise ValueError(
                f"valid for {lifetime / 86400:.0f} days from issued_at ({utc(self.issued_at)}) "
                f"to expires_at ({utc(self.expires_at)}); at most "
                f"{MAX_BUNDLE_LIFETIME / 86400:.0f} days"
            )
        return self

    @property
    def farm_wide(self) -> bool:
        return self.device == FARM_WIDE

    @property
    def source(self) -> str:
        """The agent's name for this bundle's stream, its version sequence and the rules and
        facts it asserts: the stream name, ``all:<stream>`` for a farm-wide bundle."""
        return source_name(self.stream, farm_wide=self.farm_wide)

    def superseded_sources(self) -> list[str]:
        return [source_name(s, farm_wide=self.farm_wide) for s in self.supersedes]

    def operation_count(self) -> int:
        """What :class:`BundleLimits` bounds: every rule, rule id and fact of every operation,
        and every stream it supersedes (each costs the device a look at what that stream
        claims)."""
        return sum(op.count() for op in self.operations) + len(self.supersedes)

    def parsed_rules(self) -> list[Rule]:
        """Every rule of every ``add_rules`` operation, in order, parsed and checked, with
        ``rule.id`` equal to its RuleSpec id; raises ``BundleError(reason="bad_rule")``."""
        rules: list[Rule] = []
        for op in self.operations:
            if isinstance(op, AddRules):
                rules += op.parsed_rules(bundle_id=self.bundle_id, stream=self.source)
        return rules

    @staticmethod
    def fact_tuples(op: AddFacts | DeleteFacts) -> Iterator[tuple[Value, ...]]:
        """The facts of a fact operation as engine tuples (``op.fact_tuples()``)."""
        return op.fact_tuples()


class Health(_Frozen):
    """The device's health verdicts when the status was sent (docs/operations.md): ``alive``
    (its loop goes round), ``ready`` (state checked, broker connected, no update past its
    budget, outbox below its bound) and, when not, the reasons, one line each."""

    alive: bool
    ready: bool
    reasons: list[Annotated[str, Field(max_length=500)]] = Field([], max_length=16)


MAX_DRY_RUN_PREDICATES = 50  # predicates listed in a dry-run report (the status stays small)
MAX_DRY_RUN_FACTS = 20  # watched facts listed per watch and direction
MAX_DRY_RUN_WATCHES = 20  # watches listed (those with changes, in name order)


class PredicateCount(_Frozen):
    """One predicate's facts (explicit and derived) before and after a dry run's change."""

    predicate: Annotated[str, Field(min_length=1)]
    before: Annotated[int, Field(ge=0)]
    after: Annotated[int, Field(ge=0)]


class WatchedChangeSummary(_Frozen):
    """A dry run's watched change: how many facts would appear and disappear, and the first
    ``MAX_DRY_RUN_FACTS`` of each."""

    watch: Annotated[str, Field(min_length=1)]
    appeared: Annotated[int, Field(ge=0)] = 0
    disappeared: Annotated[int, Field(ge=0)] = 0
    appeared_facts: list[Fact] = []
    disappeared_facts: list[Fact] = []


class DryRunReport(_Frozen):
    """What a dry-run bundle would have done on the device (docs/operations.md, "Dry runs").

    ``verdict``: ``would apply``, ``duplicate`` or the reason a real bundle would be refused
    (``budget_exceeded``, ``version_gap``...). ``predicates``: the fact counts that would
    change, largest first. ``watched``: the watched facts that would appear and disappear.
    ``seconds`` and ``memory_bytes``: what the change cost (the memory is the peak growth).
    ``budget``: the figures of the budget that stopped it."""

    bundle_id: Annotated[str, Field(min_length=1, max_length=200)]
    stream: str
    version: Annotated[int, Field(ge=1)]
    verdict: Annotated[str, Field(min_length=1, max_length=64)]
    message: str = ""
    facts_before: Annotated[int, Field(ge=0)] = 0
    facts_after: Annotated[int, Field(ge=0)] = 0
    predicates: list[PredicateCount] = []
    predicates_omitted: Annotated[int, Field(ge=0)] = 0
    watched: list[WatchedChangeSummary] = []
    seconds: Annotated[float, Field(ge=0, allow_inf_nan=False)] = 0.0
    memory_bytes: Annotated[int, Field(ge=0)] = 0
    budget: dict[str, str | int | float] = {}
    at: Timestamp


class DeviceStatus(_Frozen):
    """What a device publishes (retained) on its status topic."""

    device: Name
    farm: Name
    online: bool
    # Applied version per source: stream name, or ``all:<stream>`` for farm-wide streams.
    applied: dict[SourceName, Annotated[int, Field(ge=0)]]
    rules: Annotated[int, Field(ge=0)]
    facts: Annotated[int, Field(ge=0)]
    explicit_facts: Annotated[int, Field(ge=0)]
    last_error: str | None = None
    updated_at: Timestamp
    # Incoming messages dropped since the agent started, by reason (telemetry from a device
    # that is not the sender, readings out of date or over the limits...).
    dropped: dict[Annotated[str, Field(max_length=64)], Annotated[int, Field(ge=0)]] = {}
    # Derived facts of the device's configured "findings" predicates (e.g. a diagnosis).
    findings: list[Fact] = []
    # The event outbox (docs/agent.md, "Events"): ``pending`` events not yet acknowledged by
    # the broker, ``last_seq`` the last sequence number given, ``over_budget`` the events not
    # kept because the outbox was full (their numbers are missing from the sequence).
    events: dict[Annotated[str, Field(max_length=64)], Annotated[int, Field(ge=0)]] = {}
    # The windows over readings the device holds (docs/agent.md, "Windows"): relation -> the
    # facts its window holds now.
    windows: dict[Annotated[str, Field(max_length=1000)], Annotated[int, Field(ge=0)]] = {}
    # The health verdicts (None: an agent that does not send them, or the last will).
    health: Health | None = None
    # The device's answer to the last dry-run bundle it was sent (docs/operations.md).
    dry_run: DryRunReport | None = None


class WatchedChange(_Frozen):
    """What one update changed of one watch: the facts that appeared and disappeared."""

    watch: Annotated[str, Field(min_length=1)]
    appeared: list[Fact] = []
    disappeared: list[Fact] = []


class Event(_Frozen):
    """The watched facts one update changed on a device, published on
    ``<prefix>/<farm>/<device>/events`` at QoS 1, in ``seq`` order. ``seq`` numbers the
    device's events from 1 without reuse: a consumer drops a duplicate by ``(device, seq)``;
    a missing number is an event the device could not keep (its outbox was over budget, said
    in its status). ``cause`` says what made the update: ``{"kind": "bundle", "stream": ...,
    "version": ...}``, ``{"kind": "readings", "sent_at": ...}``, ``{"kind": "telemetry",
    "device": ...}``, ``{"kind": "watch", ...}`` (a watch added or removed),
    ``{"kind": "local"}``."""

    device: Name
    farm: Name
    seq: Annotated[int, Field(ge=1)]
    at: Timestamp
    cause: dict[str, str | int | float | None]
    changes: list[WatchedChange]


class RuleRequest(_Frozen):
    """A device asking the cloud for the rules that handle ``event`` (a trigger predicate)."""

    request_id: Annotated[str, Field(min_length=1, max_length=200)]
    device: Name
    farm: Name
    event: Annotated[str, Field(min_length=1)]
    facts: list[Fact]
    issued_at: Timestamp

    def fact_tuples(self) -> Iterator[tuple[Value, ...]]:
        for fact in self.facts:
            yield fact_tuple(fact)


class Telemetry(_Frozen):
    """A device's current readings (a snapshot: each message replaces the previous one)."""

    device: Annotated[Name, Field(description="the device the readings are about")]
    farm: Annotated[Name, Field(description="its farm")]
    readings: Annotated[
        list[Fact],
        Field(
            description="facts [predicate, subject, value]: a str is an IRI, numbers and "
            "booleans are themselves, another literal is {lit, dt, lang}"
        ),
    ]
    sent_at: Annotated[
        Timestamp,
        Field(description="when the values were read: seconds since 1970-01-01 UTC"),
    ]

    def fact_tuples(self) -> Iterator[tuple[Value, ...]]:
        for fact in self.readings:
            yield fact_tuple(fact)


def parse_rule_spec(
    spec: RuleSpec, *, bundle_id: str | None = None, stream: str | None = None
) -> Rule:
    """Parse ``spec.text`` into exactly one checked rule labelled ``spec.id``.

    The text is parsed on its own with source ``rule <id>``, so positions are relative to that
    rule's text and messages read ``rule r3:2:7: expected ...``.
    """
    source = f"rule {spec.id}"

    def refuse(message: str, line: int | None = None, column: int | None = None) -> BundleError:
        return BundleError(
            "bad_rule",
            message,
            bundle_id=bundle_id,
            stream=stream,
            rule_id=spec.id,
            line=line,
            column=column,
        )

    try:
        program = parse_program(spec.text, source)
    except ParseError as err:
        raise refuse(str(err), err.line, err.column) from None
    except RuleError as err:
        # The parser prefixes rule errors with "source:line:column: ".
        found = re.match(re.escape(source) + r":(\d+):(\d+): ", str(err))
        line, column = (int(found[1]), int(found[2])) if found else (None, None)
        raise refuse(str(err), line, column) from None
    except ZodiacError as err:
        raise refuse(f"{source}: {err}") from None
    except RecursionError:
        raise refuse(f"{source}: the rule is too deeply nested to parse") from None
    if len(program.rules) != 1 or program.facts or program.windows or program.watches:
        found_what = f"{len(program.rules)} rule(s)"
        if program.facts:
            found_what += f" and {len(program.facts)} fact(s)"
        if program.windows or program.watches:  # (a bundle carries them in windows, watches)
            found_what += " and directives (@window, @watch: a bundle's windows and watches)"
        raise refuse(f"{source}: the text must be exactly one rule, found {found_what}")
    rule = program.rules[0]
    if rule.label is not None and rule.label != spec.id:
        raise refuse(f"{source}: the rule's label {rule.label!r} differs from its id {spec.id!r}")
    rule = dataclasses.replace(rule, label=spec.id)
    try:
        check_rule(rule, location=source)
    except RuleError as err:  # the parser checked it already; kept for rules it might not
        raise refuse(str(err)) from None
    return rule


# --- msgpack ------------------------------------------------------------------------------

M = TypeVar("M", bound=BaseModel)


def encode_model(model: BaseModel) -> bytes:
    """A model -> msgpack bytes (str as msgpack str, bytes as bin)."""
    return msgpack.packb(model.model_dump(mode="python"), use_bin_type=True)


def _refuse_ext(code: int, data: bytes) -> Any:
    raise ValueError(f"msgpack extension type {code} is not allowed")


def _unpack(data: bytes, what: str) -> Any:
    """msgpack bytes -> Python objects; any failure is ``BundleError("malformed")``.

    The C and pure-Python msgpack implementations raise different exception types (ValueError,
    TypeError, FormatError, StackError, ExtraData, UnicodeDecodeError...) on bad input, and the
    input is untrusted: whatever goes wrong while decoding means "this is not msgpack of the
    expected kind", so every Exception is mapped to one reason. ``unpackb`` bounds container
    sizes by the input length, so a short payload cannot make it allocate a lot.
    """
    try:
        return msgpack.unpackb(
            data, raw=False, strict_map_key=True, use_list=True, ext_hook=_refuse_ext
        )
    except Exception as err:  # any decoder failure, see the docstring
        raise BundleError("malformed", f"{what} is not valid msgpack ({err})") from None


def _summary(err: ValidationError, limit: int = 5) -> str:
    """A short, input-free description of a ValidationError (inputs may be large or hostile)."""
    parts = []
    for problem in err.errors(include_url=False, include_input=False)[:limit]:
        where = ".".join(str(part) for part in problem["loc"]) or "<root>"
        parts.append(f"{where}: {problem['msg']}")
    more = err.error_count() - limit
    return "; ".join(parts) + (f"; and {more} more" if more > 0 else "")


def decode_model(data: bytes, model_type: type[M]) -> M:
    """msgpack bytes -> a validated ``model_type``: ``malformed`` or ``invalid`` on error."""
    obj = _unpack(data, model_type.__name__)
    try:
        return model_type.model_validate(obj)
    except ValidationError as err:
        bundle_id = stream = None
        if isinstance(obj, dict):  # best effort, for the message only (clipped: untrusted)
            if isinstance(obj.get("bundle_id"), str):
                bundle_id = obj["bundle_id"][:ECHO_LIMIT]
            if isinstance(obj.get("stream"), str):
                stream = obj["stream"][:ECHO_LIMIT]
        raise BundleError(
            "invalid",
            f"not a valid {model_type.__name__}: {_summary(err)}",
            bundle_id=bundle_id,
            stream=stream,
        ) from None


def decode_bundle(data: bytes) -> Bundle:
    """An (already verified) bundle body -> Bundle. Does not check rules, limits or expiry."""
    return decode_model(data, Bundle)


def decode_status(data: bytes) -> DeviceStatus:
    return decode_model(data, DeviceStatus)


def decode_telemetry(data: bytes) -> Telemetry:
    return decode_model(data, Telemetry)


def decode_request(data: bytes) -> RuleRequest:
    return decode_model(data, RuleRequest)


def decode_event(data: bytes) -> Event:
    return decode_model(data, Event)
