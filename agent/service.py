"""The agent's behaviour, independent of how messages arrive: what a turbine does with a bundle,
a reading, a neighbour's telemetry, and when it asks the cloud for rules or releases them.

``Agent`` owns the persistent reasoner (:class:`agent.state.agent_state.AgentState`) and the trusted
keys. Every method that changes state is one transaction: it returns an :class:`Outcome` that
says what happened (applied, duplicate, refused and why), so the transport (``agent/sync.py``
over MQTT, or ``zodiac-agent apply`` from a file) can acknowledge, report and log it. The agent
never raises for bad input from outside: a bad bundle is refused and reported, the state is
unchanged.

Choices:

* A bundle's operations are applied as ONE engine update (``Reasoner.update``): they are folded
  in order into net rule/fact insertions and deletions first (add-then-delete of the same fact
  cancels), so the result equals applying them one by one, with one incremental pass.
* Deleting a rule id or fact the agent does not have is a no-op, counted in the outcome (a
  release may race with a full-state re-send); it never refuses the whole bundle.
* A ``full_state`` bundle replaces its stream: rules and facts the stream asserted earlier and
  that the bundle does not contain are deleted in the same change.
* Readings are snapshots: a new value of ``<pred>(sensor, value)`` replaces the sensor's previous
  value for that predicate (delete + insert in one change). A neighbour's telemetry message is
  its whole current snapshot and replaces what it sent before.
* Rule requests: when a fact of a configured trigger predicate is derived and no request for
  that event is open, the agent asks the cloud (``RuleRequest``); the answer is an ordinary
  signed bundle naming the request in its signed ``answers`` field, whose stream is then linked
  to the request (the MQTT correlation data the cloud also sets is not trusted for this: anyone
  on the path could set it, and the linked stream is what the device deletes on release).
  When a configured "resolved" predicate is derived, the rules of the linked streams are
  deleted locally and the request is closed. The cloud may also release them by sending a
  bundle on that stream that deletes them (the usual way: the device reports its findings in
  its status, and the cloud decides that the event is dealt with).
* A request's life: ``sent`` -> ``answered`` -> ``resolved`` (its rules are gone) ->
  ``cleared`` (the trigger no longer holds). A resolved event is not requested again while its
  trigger still holds (the broken sensor is still broken: asking again would loop), only after
  the trigger went away and came back. A ``sent`` request unanswered for
  ``REQUEST_TIMEOUT`` seconds (the cloud was down) no longer blocks a new one.
* Findings: the facts of the configured ``findings`` predicates (a diagnosis) are part of the
  status, so the cloud learns the cause without querying the device.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import msgpack

from agent.budgets.bundle_costs import (
    MARKER,
    OVER_TIME,
    Account,
    Heartbeat,
    begin_try,
    over_time_recorded,
    over_time_refusal,
    payload_digest,
)
from agent.budgets.dry_runs import WOULD_APPLY, dry_run_report, measured
from agent.config import AgentConfig
from agent.engine.budget import Budget, BudgetExceeded
from agent.engine.equality.component import OWL_SAME_AS
from agent.engine.errors import ParseError, ZodiacError
from agent.engine.language import RDF_TYPE, Atom, Constant, Variable, WindowDeclaration
from agent.engine.program.parser import parse_window
from agent.engine.terms import fact_identity
from agent.engine.update.net_change import NetChange
from agent.protocol.keys import KeyDirectory, KeyRing
from agent.protocol.messages import (
    FARM_WIDE,
    AddFacts,
    AddRules,
    Bundle,
    BundleError,
    DeleteFacts,
    DeleteRules,
    DeviceStatus,
    DryRunReport,
    RuleRequest,
    RuleSpec,
    Telemetry,
    decode_telemetry,
    encode_fact,
    fact_tuple,
    parse_rule_spec,
)
from agent.protocol.signing import BundleLimits, check_sequence, open_bundle
from agent.readings.windows import LATE, OVER_BUDGET, WINDOW_SOURCE, WindowChange, WindowError
from agent.state.agent_state import AgentState, StateError, StreamVersion
from agent.state.claims import OwnershipError
from agent.state.outbox import outbox_figures

log = logging.getLogger("zodiac.agent")

SENSOR_SOURCE = "sensor"  # the device's own readings
APPLYING = MARKER  # meta key: the bundle being applied, and its tries' cost (bundle_costs.py)
LOCAL_SOURCE = "local"  # rules and facts from the config file
REQUEST_TIMEOUT = 30.0  # seconds before an unanswered rule request may be sent again
MAX_FINDINGS = 100  # facts per status message (a status must stay small)
MAX_FINDINGS_BYTES = 8_000  # and their size, encoded
MAX_ERROR_TEXT = 500  # characters of an error message kept in the status (it echoes input)
# Seconds between two info lines about duplicate bundles: a replayed bundle changes nothing,
# and thousands of replays must not make thousands of lines (they are counted in the status).
DUPLICATE_LOG_INTERVAL = 60.0
DUPLICATE = "bundle: duplicate"  # the status's ``dropped`` count of duplicate bundles
TOO_MANY_STREAMS = "bundle: too many streams"  # ... of bundles refused by [limits] max_streams
TOO_MANY_SENSORS = "readings: too many sensors"  # ... of readings dropped by max_sensors
X = Variable("X")


def sensor_key(fact: tuple) -> str:
    """A sensor's identity in a reading ``(predicate, subject, value)``: its predicate and
    subject, as text (the key of the newest reading time applied)."""
    return json.dumps(encode_fact(fact[:2]))


def clip_text(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def bundle_change(bundle: Bundle) -> NetChange:
    """A bundle's operations folded in their order into one net change (the last operation
    naming a fact decides)."""
    rules = {rule.id: rule for rule in bundle.parsed_rules()}
    net = NetChange()
    for op in bundle.operations:
        if isinstance(op, AddRules):
            net.add_rules(rules[spec.id] for spec in op.rules)
        elif isinstance(op, DeleteRules):
            net.delete_rules(op.ids)
        elif isinstance(op, AddFacts):
            net.add_facts(op.fact_tuples())
        elif isinstance(op, DeleteFacts):
            net.delete_facts(op.fact_tuples())
    return net


@dataclass
class Outcome:
    """What happened to one incoming change."""

    status: str  # "applied", "duplicate", "refused", "unchanged", "dry_run"
    # A BundleError reason, or "engine" / "state" for refusals ("input": a reading or a
    # neighbour's snapshot refused, see Agent.refuse_input).
    reason: str = ""
    message: str = ""
    report: dict = field(default_factory=dict)
    bundle_id: str | None = None
    stream: str | None = None
    version: int | None = None  # the bundle's, once its body was read
    expected_version: int | None = None  # what a version_gap device waits for

    @property
    def committed(self) -> bool:
        """True when the message may be acknowledged: its effect (or none) is durable."""
        return self.status != "refused" or self.reason != "state"

    def as_log(self) -> dict:
        return {
            "status": self.status,
            "reason": self.reason,
            "detail": self.message,
            "bundle_id": self.bundle_id,
            "stream": self.stream,
            **({"version": self.version} if self.version is not None else {}),
            **{k: self.report[k] for k in ("operation", "seconds") if k in self.report},
        }


class Agent:
    """One turbine's reasoning agent (see the module docstring)."""

    def __init__(self, config: AgentConfig, *, keyring: KeyRing | None = None) -> None:
        self.config = config
        # The trusted keys follow their directory while the agent runs (key rotation), unless
        # a fixed ring is given (tests, tools).
        self.keys = None if keyring is not None else KeyDirectory(config.keys.trusted_keys)
        self.keyring = keyring if keyring is not None else self.keys.ring
        self.limits = BundleLimits(
            max_bytes=config.keys.max_bundle_bytes, max_operations=config.keys.max_operations
        )
        self.state = AgentState(
            config.database,
            synchronous=config.synchronous,
            modules=config.reasoning.modules,
            decompositions=config.reasoning.decompositions,
            budget=config.budget.budget(),
            stream_budgets=config.budget.stream_budgets(),
            max_events=config.events.max_pending,
            max_window_facts=config.windows.max_facts,
            stream_history=config.limits.stream_history,
        )
        report = self.state.load_report
        log.info(
            "state loaded",
            extra={
                "fields": {
                    "how": report.how,
                    "seconds": round(report.seconds, 3),
                    "facts": report.facts,
                    "derived": report.derived,
                    "rules": report.rules,
                }
            },
        )
        # The agent's clock (injectable: tests run minutes of readings in milliseconds).
        self.clock: Callable[[], float] = time.time
        self.dropped: Counter[str] = Counter()  # incoming messages dropped, by reason
        # Duplicates since the last info line about them, and when that line was written.
        self._duplicates_unlogged = 0
        self._duplicate_logged_at = float("-inf")
        # The last refusal when the state could not take it (a full disk): see ``note``.
        self.unsaved_error: str | None = None
        self._buckets: dict[str, tuple[float, float]] = {}  # telemetry rate: tokens, time
        # The answer to the last dry-run bundle (the status carries it; not kept on disk).
        self.last_dry_run: DryRunReport | None = None
        self.state.clock = lambda: self.clock()
        self.sync_local_files()
        self.sync_watches()

    @property
    def reasoner(self):
        return self.state.reasoner

    def close(self) -> None:
        self.state.close()

    # ------------------------------------------------------------------ start-up
    def sync_local_files(self) -> None:
        """Bring the rules and facts of source ``local`` to exactly what the configured files
        say, at every start: a first start killed before its commit, a file edited or fixed
        since, all converge at the next start. A file that does not parse raises (ParseError
        with its line and column): the agent must not run with half its local program."""
        reasoning = self.config.reasoning
        from agent.engine.program.loaders import load_facts, load_program

        programs = [load_program(path) for path in reasoning.rules]
        rules = {rule.id: rule for program in programs for rule in program.rules}
        windows = list(dict.fromkeys(w for program in programs for w in program.windows))
        facts = {fact_identity(fact): fact for path in reasoning.facts for fact in load_facts(path)}
        known = {
            name: self.reasoner.rules[name]
            for name in self.state.rules_of_stream(LOCAL_SOURCE)
            if name in self.reasoner.rules
        }
        old_facts = {fact_identity(f): f for f in self.state.facts_of_source(LOCAL_SOURCE)}
        gone_rules = [n for n, r in known.items() if n not in rules or rules[n].key != r.key]
        new_rules = [r for n, r in rules.items() if n not in known or known[n].key != r.key]
        gone_facts = [fact for key, fact in old_facts.items() if key not in facts]
        new_facts = [fact for key, fact in facts.items() if key not in old_facts]
        held = [w for w, sources in self.state.window_claims.items() if LOCAL_SOURCE in sources]
        same_windows = set(held) == set(windows)
        if not (gone_rules or new_rules or gone_facts or new_facts) and same_windows:
            return
        self.state.apply(
            add_rules=new_rules,
            delete_rules=gone_rules,
            add_facts=sorted(new_facts, key=repr),
            delete_facts=sorted(gone_facts, key=repr),
            source=LOCAL_SOURCE,
            windows=None if same_windows else windows,
        )
        log.info(
            "local rules and facts loaded",
            extra={
                "fields": {
                    "rules_added": len(new_rules),
                    "rules_deleted": len(gone_rules),
                    "facts_added": len(new_facts),
                    "facts_deleted": len(gone_facts),
                    "windows": len(windows),
                }
            },
        )

    def sync_watches(self) -> None:
        """The configuration's watches (``[events] watch``), held by source ``local``: a
        watch added since the last start makes its facts 'appear' in an event, one removed
        makes them 'disappear' (cause ``{"kind": "watch"}``)."""
        from agent.engine.program.loaders import load_program
        from agent.engine.program.parser import parse_atom

        wanted = {str(parse_atom(p)) for p in self.config.events.watch}
        for path in self.config.reasoning.rules:  # (a local rule file's @watch lines)
            wanted |= {str(pattern) for pattern in load_program(path).watches}
        held = {p for p, sources in self.state.watches.items() if LOCAL_SOURCE in sources}
        if wanted != held:
            self.state.set_watches(LOCAL_SOURCE, sorted(wanted), cause={"kind": "watch"})

    def drop_watches_of_ruleless(self, stream: str) -> None:
        """A stream left with no rule watches nothing any more (its watches go with it)."""
        held = any(stream in sources for sources in self.state.watches.values())
        if held and not self.state.rules_of_stream(stream):
            self.state.set_watches(stream, [], cause={"kind": "watch", "stream": stream})

    # ------------------------------------------------------------------ bundles
    def handle_bundle(self, payload: bytes) -> Outcome:
        """Verify, address-check, sequence-check and apply one signed bundle, in one
        transaction. A bundle that answers one of the device's rule requests says so in its
        signed body (``answers``); that, not the MQTT correlation data, links the request to
        the bundle's stream."""
        answers: str | None = None
        try:
            bundle = open_bundle(payload, self.trusted_keys(), limits=self.limits, now=self.clock())
            self.check_audience(bundle)
            if bundle.dry_run:
                return self.note(self.dry_run(bundle, payload))
            self.check_stream_limit(bundle)
            answers = bundle.answers
            applied = self.state.applied_versions().get(bundle.source)
            account = Account.read(self.state.get_meta(APPLYING))
            if check_sequence(bundle, applied) == "duplicate":
                if account is not None and account.bundle_id == bundle.bundle_id:
                    self._clear_marker()  # (applied by an older agent, killed before it went)
                return self.note(
                    Outcome(
                        "duplicate",
                        message=f"version {bundle.version} <= applied {applied}",
                        bundle_id=bundle.bundle_id,
                        stream=bundle.source,
                        version=bundle.version,
                    )
                )
            outcome = self._try_bundle(bundle, payload, account)
        except BundleError as error:
            outcome = Outcome(
                "refused",
                error.reason,
                str(error),
                bundle_id=error.bundle_id,
                stream=error.stream,
                version=error.version,
                expected_version=error.expected_version,
            )
        if outcome.status == "applied":
            self._after_applied(outcome, answers)
        return self.note(outcome)

    def dry_run(self, bundle: Bundle, payload: bytes) -> Outcome:
        """Try a (verified, well addressed) dry-run bundle as a real one would be tried, in a
        transaction that is rolled back (``AgentState.apply(dry_run=True)``): its answer,
        the verdict a real bundle would get with what it would change and cost, becomes
        ``last_dry_run`` (reported in the status), never the status's ``last_error``: a
        refused dry run is an answer, not a device in trouble (a ``version_gap`` there would
        have the cloud send a full state). The stream's version is not advanced."""
        facts_before = self.reasoner.count()
        change: dict = {}
        with measured() as cost:
            try:
                self.check_stream_limit(bundle, count=False)
                applied = self.state.applied_versions().get(bundle.source)
                if check_sequence(bundle, applied) == "duplicate":
                    verdict, message = "duplicate", f"version {bundle.version} <= applied {applied}"
                else:
                    account = Account.read(self.state.get_meta(APPLYING))
                    outcome = self._try_bundle(bundle, payload, account, dry_run=True)
                    change = outcome.report
                    if outcome.status == "dry_run":
                        verdict, message = WOULD_APPLY, outcome.message
                    else:
                        verdict, message = outcome.reason, outcome.message
                        if outcome.reason == "budget_exceeded":
                            change = {"budget": outcome.report}
            except BundleError as error:
                verdict, message = error.reason, str(error)
        message = clip_text(message, MAX_ERROR_TEXT)
        report = dry_run_report(
            bundle, verdict, message, change, cost, facts_before, at=self.clock()
        )
        self.last_dry_run = report
        return Outcome(
            "dry_run",
            reason="" if verdict == WOULD_APPLY else verdict,
            message=f"dry run: {verdict}" + (f": {message}" if message else ""),
            report={"seconds": report.seconds},
            bundle_id=bundle.bundle_id,
            stream=bundle.source,
            version=bundle.version,
        )

    def trusted_keys(self) -> KeyRing:
        """The keys a bundle may be signed by now: the trusted-keys directory as it is (a key
        added or removed since the last bundle counts at once; docs/agent.md, "Rotating the
        cloud's key")."""
        if self.keys is None:
            return self.keyring
        before = self.keyring
        self.keyring = self.keys.current()
        if self.keyring is not before:
            log.info(
                "trusted keys reloaded",
                extra={"fields": {"keys": self.keyring.ids(), "problems": self.keys.problems}},
            )
        return self.keyring

    def _unwritable(self, bundle: Bundle, error: sqlite3.Error) -> Outcome:
        """The refusal of a bundle whose marker could not be written (a full disk, say): a
        ``state`` refusal, which the transport does not acknowledge, so that the bundle is
        tried again once the state can be written."""
        return Outcome(
            "refused",
            "state",
            f"{self.state.path}: could not write to the agent state ({error}); the bundle is "
            "not applied and is tried again",
            bundle_id=bundle.bundle_id,
            stream=bundle.source,
        )

    def _clear_marker(self) -> None:
        """Remove the poison-bundle marker. A failure (a full disk) is only logged: the
        outcome stands, and a marker left behind is cleared at the bundle's next delivery (a
        duplicate once applied) or counted as one try."""
        try:
            self.state.set_meta(APPLYING, None)
        except sqlite3.Error as error:
            log.warning(
                "could not clear the bundle marker", extra={"fields": {"error": str(error)}}
            )

    def _after_applied(self, outcome: Outcome, answers: str | None) -> None:
        """Link the stream to its rule request and close released requests. The bundle is
        committed already: a failure to write this (a full disk) must not undo its
        acknowledgement, so it is only logged."""
        try:
            if answers:
                self._link_request(answers, outcome.stream or "")
            if outcome.stream:
                self._close_released(outcome.stream)
                self.drop_watches_of_ruleless(outcome.stream)
        except (sqlite3.Error, StateError) as error:
            log.warning(
                "could not update the rule requests", extra={"fields": {"error": str(error)}}
            )

    def _try_bundle(
        self, bundle: Bundle, payload: bytes, account: Account | None, *, dry_run: bool = False
    ) -> Outcome:
        """Apply a bundle that is due for its stream, unless what it cost before refuses it
        (agent/budgets/bundle_costs.py): it went over the time budget already, or tries of it that
        got the agent killed have together cost the budget. The try is marked, with what it
        costs as it goes, until its outcome is known."""
        budget = self.state.budget or Budget()
        digest = payload_digest(payload)
        where = {"bundle_id": bundle.bundle_id, "stream": bundle.source}
        refusal = over_time_refusal(self.state.get_meta(OVER_TIME), digest, budget)
        if refusal is not None:
            raise BundleError("budget_exceeded", refusal, **where)
        account = begin_try(account, bundle.bundle_id, budget)
        poison = account.poison(budget)
        if poison is not None:
            self._clear_marker()
            raise BundleError("budget_exceeded", poison, **where)
        try:
            self.state.set_meta(APPLYING, account.to_text())
        except sqlite3.Error as error:  # (a full disk): not tried without its marker
            return self._unwritable(bundle, error)
        outcome = None
        try:
            with Heartbeat(self.state.file, account):
                # (its commit removes the marker; a dry run's rollback keeps it: cleared below)
                outcome = self.apply_bundle(bundle, dry_run=dry_run)
        finally:
            if outcome is None or outcome.status != "applied":
                self._clear_marker()
        over_time = outcome.reason == "budget_exceeded" and outcome.report.get("limit") == "seconds"
        if over_time and not dry_run:  # (a dry run leaves no trace but its answer)
            self._remember_over_time(digest, bundle, outcome.report["allowed"])
        return outcome

    def _remember_over_time(self, digest: str, bundle: Bundle, allowed: float) -> None:
        """A bundle stopped by the time budget: not tried again while the budget is as small
        (agent/budgets/bundle_costs.py). A failure to write it (a full disk) costs one more try."""
        try:
            recorded = over_time_recorded(
                self.state.get_meta(OVER_TIME), digest, bundle.bundle_id, allowed
            )
            self.state.set_meta(OVER_TIME, recorded)
        except sqlite3.Error as error:
            log.warning(
                "could not record the bundle over budget", extra={"fields": {"error": str(error)}}
            )

    def check_audience(self, bundle: Bundle) -> None:
        """A signature says who made a bundle; its signed audience says for whom. Refuse a
        bundle for another farm or another device (``wrong_audience``)."""
        farm, device = self.config.farm, self.config.device
        if bundle.farm != farm or bundle.device not in (device, FARM_WIDE):
            raise BundleError(
                "wrong_audience",
                f"addressed to device {bundle.device!r} of farm {bundle.farm!r}; this is "
                f"device {device!r} of farm {farm!r}",
                bundle_id=bundle.bundle_id,
                stream=bundle.source,
            )

    def check_stream_limit(self, bundle: Bundle, *, count: bool = True) -> None:
        """Refuse a bundle that would add a stream past ``[limits] max_streams``
        (``too_many_streams``): every stream with a version stays in the state and in every
        status, so their number must be bounded whoever signs them. ``count``: counted in the
        status's ``dropped`` (not for a dry run, which leaves no trace but its answer)."""
        applied = self.state.applied_versions()
        limit = self.config.limits.max_streams
        if bundle.source in applied or len(applied) < limit:
            return
        if count:
            self.dropped[TOO_MANY_STREAMS] += 1
        raise BundleError(
            "too_many_streams",
            f"the device holds {len(applied)} streams, the limit ([limits] max_streams = "
            f"{limit}); a new stream is refused",
            bundle_id=bundle.bundle_id,
            stream=bundle.source,
            version=bundle.version,
        )

    def apply_bundle(self, bundle: Bundle, *, dry_run: bool = False) -> Outcome:
        """Apply an already verified bundle (its operations as one change, made by the
        bundle's source: it may delete only what it, or a stream it supersedes, added). A
        revert (``revert_to``) is the full state of the version it names, as the device kept
        it. ``dry_run``: made and rolled back, the outcome ``dry_run`` with the change's
        report."""
        source = bundle.source
        where = {"bundle_id": bundle.bundle_id, "stream": source, "version": bundle.version}
        watches = [] if bundle.full_state and bundle.watches is None else bundle.watches
        kept_windows = None  # (a revert's: the windows the stream declared at that version)
        if bundle.revert_to is not None:
            net, watches, kept_windows = self._reverted(bundle)
        else:
            net = bundle_change(bundle)
        full_state = bundle.full_state or bundle.revert_to is not None
        add_rules = {rule.id: rule for rule in net.rules_added}
        delete_rules = net.rules_deleted
        delete_facts = net.facts_deleted
        if full_state:
            held = self.reasoner.rules
            for rule_id in self.state.rules_of_stream(source):
                # Gone from the stream, or held with another text: replaced (deleted and added
                # in this one change). A rule held as sent is left alone.
                if rule_id not in add_rules or (
                    rule_id in held and held[rule_id].key != add_rules[rule_id].key
                ):
                    delete_rules.append(rule_id)
            delete_facts += [
                fact for fact in self.state.facts_of_source(source) if not net.adds_fact(fact)
            ]
        try:
            windows = self._bundle_windows(bundle, kept_windows)
        except ParseError as error:
            return Outcome("refused", "bad_rule", str(error), **where)
        known = self.reasoner.rules
        ignored = [rid for rid in delete_rules if rid not in known]
        delete_rules = sorted({rid for rid in delete_rules if rid in known})
        # A rule deleted and re-added with the same id in one bundle is a replacement.
        try:
            report = self.state.apply(
                add_rules=list(add_rules.values()),
                delete_rules=delete_rules,
                add_facts=net.facts_added,
                delete_facts=delete_facts,
                source=source,
                bundle_id=bundle.bundle_id,
                version=StreamVersion(source, bundle.version, bundle.bundle_id),
                superseded=bundle.superseded_sources(),
                forget_meta=(APPLYING,),  # (the marker goes with the commit)
                watches=watches,
                windows=windows,
                dry_run=dry_run,
            )
        except StateError as error:
            return Outcome("refused", "state", str(error), **where)
        except WindowError as error:
            return Outcome("refused", "bad_rule", str(error).splitlines()[0], **where)
        except OwnershipError as error:
            return Outcome("refused", "not_owner", str(error), **where)
        except BudgetExceeded as error:
            return Outcome(
                "refused", "budget_exceeded", str(error), report=error.figures(), **where
            )
        except ZodiacError as error:
            return Outcome("refused", "engine", str(error), **where)
        report["rules_ignored"] = ignored
        if dry_run:
            return Outcome("dry_run", report=report, **where)
        return Outcome("applied", report=report, **where)

    @staticmethod
    def _bundle_windows(
        bundle: Bundle, kept: list[str] | None = None
    ) -> list[WindowDeclaration] | None:
        """The windows a bundle's stream declares after it: its ``windows`` (None: as before;
        a full-state bundle with none: none), or for a revert the ``kept`` ones of the version
        it goes back to. A declaration that does not parse raises ParseError naming it
        (``window 2:1:13: ...``)."""
        texts = kept if kept is not None else bundle.windows
        if texts is None:
            return [] if bundle.full_state else None
        return [parse_window(text, f"window {number}") for number, text in enumerate(texts, 1)]

    # ------------------------------------------------------------------ windows
    def tick_windows(self) -> Outcome | None:
        """Expire, as one change, the window facts that have left their window by the agent's
        clock (cause ``{"kind": "window expiry"}``); None when none has. Run every ``[windows]
        tick`` seconds by the service's loop (agent/sync.py)."""
        try:
            report = self.state.expire_windows(self.clock())
        except StateError as error:
            return self.note(Outcome("refused", "state", str(error), stream=WINDOW_SOURCE))
        except ZodiacError as error:  # (a budget: the expiry is tried again at the next tick)
            return self.refuse_input("windows: expiry refused", f"windows: {error}")
        if report is None:
            return None
        return self.note(Outcome("applied", report=report, stream=WINDOW_SOURCE), quiet=True)

    def _window_arrivals(self, readings: list[tuple], at: float) -> WindowChange:
        """The window facts of readings applied at ``at`` (late ones and evictions counted in
        the status's ``dropped`` once the change is made)."""
        return self.state.window_arrivals(readings, at, self.clock())

    def _count_windows(self, change: WindowChange | None) -> None:
        if change is None:
            return
        if change.late:
            self.dropped[LATE] += change.late
        if change.evicted:
            self.dropped[OVER_BUDGET] += change.evicted

    def _reverted(self, bundle: Bundle) -> tuple[NetChange, list[str], list[str]]:
        """The change, watches and windows that bring the bundle's stream back to version
        ``revert_to`` as the device kept it; ``no_history`` when it is not kept."""
        source = bundle.source
        saved = self.state.saved_version(source, bundle.revert_to)
        if saved is None:
            kept = self.state.kept_versions(source)
            raise BundleError(
                "no_history",
                f"cannot revert to version {bundle.revert_to}: this device keeps the content "
                f"of versions {kept or 'none'} of the stream ([limits] stream_history = "
                f"{self.config.limits.stream_history})",
                bundle_id=bundle.bundle_id,
                stream=source,
                version=bundle.version,
            )
        net = NetChange()
        net.add_rules(
            parse_rule_spec(RuleSpec(id=name, text=text), bundle_id=bundle.bundle_id, stream=source)
            for name, text in saved.rules
        )
        net.add_facts(fact_tuple(fact) for fact in saved.facts)
        return net, list(saved.watches), list(saved.windows)

    # ------------------------------------------------------------------ readings
    def record_readings(self, payload: bytes) -> Outcome:
        """The device's own sensor values (a ``Telemetry`` message from its controller): each
        replaces the sensor's previous value, unless it is older than the value applied (a
        message redelivered after a crash must not undo newer readings)."""
        limits = self.config.telemetry
        if len(payload) > limits.max_message_bytes:
            return self.drop("readings: too large")
        try:
            telemetry = decode_telemetry(payload)
        except BundleError as error:
            return self.refuse_input(f"readings: {error.reason}", f"readings: {error}")
        if len(telemetry.readings) > limits.max_readings:
            return self.drop("readings: too many")
        applied = self.state.reading_times(SENSOR_SOURCE)
        room = self.config.limits.max_sensors - len(applied)  # for sensors not known yet
        fresh, times = [], {}
        for fact in telemetry.fact_tuples():
            sensor = sensor_key(fact)
            order = self.reading_order(telemetry.sent_at, applied.get(sensor))
            if order in ("newer", "stepped back") and sensor not in applied:
                if room <= 0:
                    self.dropped[TOO_MANY_SENSORS] += 1
                    continue
                room -= 1
            if order in ("newer", "stepped back"):
                fresh.append(fact)
                times[sensor] = telemetry.sent_at
            if order == "stepped back":
                self.dropped["readings: clock stepped back (applied)"] += 1
            elif order != "newer":
                self.dropped[f"readings: {order}"] += 1
        if not fresh:
            return Outcome("unchanged", message="no reading newer than the one applied")
        cause = {"kind": "readings", "sent_at": telemetry.sent_at}
        window_facts = self._window_arrivals(fresh, telemetry.sent_at)
        return self._replace(
            SENSOR_SOURCE, fresh, by_sensor=True, times=times, cause=cause, windows=window_facts
        )

    def handle_telemetry(self, payload: bytes, *, sender: str) -> Outcome:
        """A neighbour's snapshot of readings, from the telemetry topic of device ``sender``
        (the broker's ACL lets only that device publish there): it replaces what ``sender``
        sent before. Only readings about ``sender`` (or its sensors) of accepted predicates are
        kept; a message from another farm, claiming another sender, older than the last one,
        over the size limits or over the rate limit is dropped and counted."""
        limits = self.config.telemetry
        if sender == self.config.device or sender not in self.config.reasoning.neighbours:
            return self.drop("telemetry: not a neighbour")
        if len(payload) > limits.max_message_bytes:
            return self.drop("telemetry: too large")
        if not self._within_rate(sender):
            return self.drop("telemetry: over the rate limit")
        try:
            telemetry = decode_telemetry(payload)
        except BundleError:
            return self.drop("telemetry: malformed")
        if telemetry.farm != self.config.farm or telemetry.device != sender:
            return self.drop("telemetry: sender mismatch")
        if len(telemetry.readings) > limits.max_readings:
            return self.drop("telemetry: too many readings")
        source = f"telemetry/{sender}"
        order = self.reading_order(telemetry.sent_at, self.state.reading_times(source).get("*"))
        if order not in ("newer", "stepped back"):
            return self.drop(f"telemetry: {order}")
        if order == "stepped back":
            self.dropped["telemetry: clock stepped back (applied)"] += 1
        accepted = self.config.accepted_telemetry_predicates()
        owned = self._owned_subjects(sender)
        readings = []
        for fact in telemetry.fact_tuples():
            predicate = fact[2] if fact[0] == RDF_TYPE and len(fact) == 3 else fact[0]
            if predicate not in accepted:
                self.dropped["telemetry: predicate not accepted"] += 1
            elif fact[1] not in owned:
                self.dropped["telemetry: subject not the sender's"] += 1
            else:
                readings.append(fact)
        cause = {"kind": "telemetry", "device": sender, "sent_at": telemetry.sent_at}
        return self._replace(
            source,
            readings,
            by_sensor=False,
            times={"*": telemetry.sent_at},
            cause=cause,
            windows=self._window_arrivals(readings, telemetry.sent_at),
        )

    def reading_order(self, sent_at: float, applied: float | None) -> str:
        """Where a reading (or a neighbour's snapshot) dated ``sent_at`` stands against the
        newest one applied for its sensor (``applied``; None: none yet), by the rules of
        ``[telemetry]`` (docs/agent.md, "Readings and time"):

        * ``from the future``: more than ``max_clock_skew`` ahead of the agent's clock;
          dropped (taken, it would hold back every correct reading until its time came);
        * ``newer``: applied;
        * ``out of date``: not newer, by at most ``replay_window``: a message redelivered
          after a lost acknowledgement; dropped, so it cannot undo a newer reading;
        * ``stepped back``: older by more than that: the sender's clock was stepped back (an
          NTP correction); applied (dropping it would freeze the sensor until the clock caught
          up) and counted."""
        limits = self.config.telemetry
        if sent_at > self.clock() + limits.max_clock_skew:
            return "from the future"
        if applied is None or sent_at > applied:
            return "newer"
        if applied - sent_at <= limits.replay_window:
            return "out of date"
        return "stepped back"

    def _owned_subjects(self, device: str) -> set:
        """What ``device`` may report about: itself under any of its names (owl:sameAs facts
        held here) and, with ``owner_predicate``, its sensors per the facts held here."""
        owned: set = {device}
        if self.reasoner.equality is not None:
            names = Atom(OWL_SAME_AS, (Constant(device), X))
            owned |= {answer["X"] for answer in self.reasoner.query(names)}
        predicate = self.config.telemetry.owner_predicate
        if predicate:
            pattern = Atom(predicate, (Constant(device), X))
            owned |= {answer["X"] for answer in self.reasoner.query(pattern)}
        return owned

    def _within_rate(self, sender: str) -> bool:
        """A token bucket per neighbour: ``max_messages_per_second``, bursts of twice that."""
        rate = self.config.telemetry.max_messages_per_second
        now = time.monotonic()
        tokens, at = self._buckets.get(sender, (2 * rate, now))
        tokens = min(2 * rate, tokens + (now - at) * rate)
        if tokens < 1:
            self._buckets[sender] = (tokens, now)
            return False
        self._buckets[sender] = (tokens - 1, now)
        return True

    def refuse_input(
        self, counted: str, message: str, *, reason: str = "input", report: dict | None = None
    ) -> Outcome:
        """A reading or a neighbour's snapshot the agent could not take: counted (under
        ``counted`` in the status's ``dropped``) and logged, but not made the status's
        ``last_error``, which reports bundles to the cloud (a neighbour's unsigned message must
        not hide a real bundle error, such as the ``version_gap`` the cloud answers with a
        full state)."""
        self.dropped[counted] += 1
        log.warning("refused", extra={"fields": {"reason": reason, "message": message}})
        return Outcome("refused", reason, message, report=report or {})

    def drop(self, reason: str) -> Outcome:
        """Count a dropped message (reported in the status); logged at debug level only, as a
        misbehaving neighbour could otherwise flood the log."""
        self.dropped[reason] += 1
        log.debug("dropped", extra={"fields": {"reason": reason}})
        return Outcome("unchanged", reason="dropped", message=reason)

    def _replace(
        self,
        source: str,
        readings: list[tuple],
        *,
        by_sensor: bool,
        times: dict[str, float] | None = None,
        cause: dict | None = None,
        windows: WindowChange | None = None,
    ) -> Outcome:
        """Replace ``source``'s readings (see the module docstring), with the window facts
        they add (``windows``: every reading counts, also one whose value did not change)."""
        old = self.state.facts_of_source(source)
        new = [tuple(f) for f in readings]
        old_set, new_set = set(map(fact_identity, old)), set(map(fact_identity, new))
        if by_sensor:
            fresh = {(f[0], f[1]) for f in new}
            gone = [f for f in old if (f[0], f[1]) in fresh and fact_identity(f) not in new_set]
        else:
            gone = [f for f in old if fact_identity(f) not in new_set]
        added = [f for f in new if fact_identity(f) not in old_set]
        window_facts = windows if windows else None
        try:
            if not gone and not added and window_facts is None:
                if times:
                    self.state.apply(source=source, reading_times=times)
                self._count_windows(windows)
                return Outcome("unchanged")
            report = self.state.apply(
                add_facts=added,
                delete_facts=gone,
                source=source,
                reading_times=times,
                cause=cause,
                window_facts=window_facts,
            )
        except StateError as error:  # (not durable: not acknowledged, tried again)
            return self.note(Outcome("refused", "state", f"{source}: {error}", stream=source))
        except BudgetExceeded as error:
            kind = "readings" if source == SENSOR_SOURCE else "telemetry"
            return self.refuse_input(
                f"{kind}: over the budget",
                f"{source}: {error}",
                reason="budget_exceeded",
                report=error.figures(),
            )
        except ZodiacError as error:
            kind = "readings" if source == SENSOR_SOURCE else "telemetry"
            return self.refuse_input(f"{kind}: refused by the engine", f"{source}: {error}")
        self._count_windows(windows)
        return self.note(Outcome("applied", report=report, stream=source), quiet=True)

    def telemetry(self) -> Telemetry:
        """This device's current readings of the configured telemetry predicates."""
        wanted = set(self.config.reasoning.telemetry_predicates)
        readings = [
            encode_fact(f)
            for f in self.state.facts_of_source(SENSOR_SOURCE)
            if f[0] in wanted or (f[0] == RDF_TYPE and f[2] in wanted)
        ]
        return Telemetry(
            device=self.config.device, farm=self.config.farm, readings=readings, sent_at=time.time()
        )

    # ------------------------------------------------------------------ rule requests
    def new_requests(self) -> list[RuleRequest]:
        """Requests to send now: a trigger predicate holds and no request for its event is
        open. The request is recorded (status ``sent``) in the same call."""
        requests = []
        # One read per call (this runs after every applied reading): which events are blocked
        # by an open request, and which were resolved and may be cleared.
        open_events: set[str] = set()
        resolved_events: set[str] = set()
        for event, status in self.state.conn.execute(
            "SELECT event, status FROM requests WHERE status IN ('answered', 'resolved') "
            "OR (status = 'sent' AND created_at > ?)",
            (time.time() - REQUEST_TIMEOUT,),
        ):
            open_events.add(event)
            if status == "resolved":
                resolved_events.add(event)
        for predicate, event in sorted(self.config.reasoning.triggers.items()):
            facts = list(self.reasoner.facts_named(predicate))
            if not facts:
                if event in resolved_events:  # write only when there is something to clear
                    self._clear(event)
                continue
            if event in open_events:
                continue
            request = RuleRequest(
                request_id=uuid.uuid4().hex,
                device=self.config.device,
                farm=self.config.farm,
                event=event,
                facts=[encode_fact(f) for f in facts[:100]],
                issued_at=time.time(),
            )
            with self.state.conn:
                self.state.conn.execute(
                    "INSERT INTO requests (request_id, event, status, created_at) "
                    "VALUES (?, ?, 'sent', ?)",
                    (request.request_id, event, time.time()),
                )
            open_events.add(event)
            requests.append(request)
            log.info(
                "rule request", extra={"fields": {"event": event, "request_id": request.request_id}}
            )
        return requests

    def _link_request(self, request_id: str, stream: str) -> None:
        with self.state.conn:
            self.state.conn.execute(
                "UPDATE requests SET stream = ?, status = 'answered' WHERE request_id = ? "
                "AND status IN ('sent', 'answered')",
                (stream, request_id),
            )

    def _close_released(self, stream: str) -> None:
        """The cloud released ``stream`` (it has no rules left here): its requests are
        resolved."""
        if self.state.rules_of_stream(stream):
            return
        with self.state.conn:
            self.state.conn.execute(
                "UPDATE requests SET status = 'resolved', resolved_at = ? "
                "WHERE stream = ? AND status = 'answered'",
                (time.time(), stream),
            )

    def _clear(self, event: str) -> None:
        """The trigger of ``event`` no longer holds: a new occurrence gets a new request."""
        with self.state.conn:
            self.state.conn.execute(
                "UPDATE requests SET status = 'cleared' WHERE event = ? AND status = 'resolved'",
                (event,),
            )

    def release_resolved(self) -> list[Outcome]:
        """Delete the rules of answered requests once a "resolved" predicate is derived."""
        outcomes = []
        resolved = self.config.reasoning.resolved
        if not resolved or not any(
            next(self.reasoner.facts_named(p), None) is not None for p in resolved
        ):
            return outcomes
        rows = self.state.conn.execute(
            "SELECT request_id, event, stream FROM requests WHERE status = 'answered'"
        ).fetchall()
        for request_id, event, stream in rows:
            rule_ids = [r for r in self.state.rules_of_stream(stream) if r in self.reasoner.rules]
            try:
                # (its windows go with its rules, in the same change)
                report = self.state.apply(delete_rules=rule_ids, source=stream, windows=[])
            except ZodiacError as error:
                outcomes.append(self.note(Outcome("refused", "engine", str(error))))
                continue
            with self.state.conn:
                self.state.conn.execute(
                    "UPDATE requests SET status = 'resolved', resolved_at = ? WHERE request_id = ?",
                    (time.time(), request_id),
                )
            self.drop_watches_of_ruleless(stream)
            log.info(
                "rules released",
                extra={"fields": {"event": event, "stream": stream, "rules": len(rule_ids)}},
            )
            outcomes.append(Outcome("applied", report=report, stream=stream))
        return outcomes

    # ------------------------------------------------------------------ status
    def status(self, *, online: bool = True) -> DeviceStatus:
        reasoner = self.reasoner
        return DeviceStatus(
            device=self.config.device,
            farm=self.config.farm,
            online=online,
            applied=self.state.applied_versions(),
            rules=len(reasoner.rules),
            findings=self.findings(),
            facts=reasoner.count(),
            explicit_facts=reasoner.edb.size(),
            last_error=self.unsaved_error or self.state.get_meta("last_error"),
            updated_at=time.time(),
            dropped=dict(self.dropped),
            events=outbox_figures(self.state.conn),
            windows=self.state.windows.sizes(),
            dry_run=self.last_dry_run,
        )

    def findings(self) -> list[list]:
        """The derived facts of the configured ``findings`` predicates (encoded, sorted), at
        most ``MAX_FINDINGS`` of them in at most ``MAX_FINDINGS_BYTES``: they go into every
        status, and a finding may name a sensor of any length."""
        found = []
        for predicate in self.config.reasoning.findings:
            found += [encode_fact(f) for f in self.reasoner.facts_named(predicate)]
        kept, size = [], 0
        for fact in sorted(found, key=repr)[:MAX_FINDINGS]:
            size += len(msgpack.packb(fact, use_bin_type=True))
            if size > MAX_FINDINGS_BYTES:
                break
            kept.append(fact)
        return kept

    def note(self, outcome: Outcome, *, quiet: bool = False) -> Outcome:
        """Log an outcome; a refusal also becomes the status's ``last_error``, and an applied
        bundle clears the ``last_error`` it settles (:meth:`_clear_settled_error`)."""
        fields = outcome.as_log()
        if outcome.status == "refused":
            log.warning("refused", extra={"fields": fields})
            self._record_error(outcome)
        elif outcome.status == "duplicate":
            self._note_duplicate(fields)
        else:
            if not quiet:
                log.info(outcome.status, extra={"fields": fields})
            if outcome.status == "applied":
                self.unsaved_error = None  # (a change went through: the state takes writes)
            if outcome.status == "applied" and outcome.bundle_id is not None:
                self._clear_settled_error(outcome.stream)
        return outcome

    def _note_duplicate(self, fields: dict) -> None:
        """Count a duplicate bundle (the status's ``dropped``) and log it at info level at most
        once every ``DUPLICATE_LOG_INTERVAL`` seconds, with how many came since the last such
        line; the others at debug level. A duplicate changes nothing: a broker redelivering
        after a crash is worth a line, someone replaying a bundle 2,000 times is not worth
        2,000."""
        self.dropped[DUPLICATE] += 1
        self._duplicates_unlogged += 1
        now = time.monotonic()
        if now - self._duplicate_logged_at < DUPLICATE_LOG_INTERVAL:
            log.debug("duplicate", extra={"fields": fields})
            return
        log.info("duplicate", extra={"fields": {**fields, "duplicates": self._duplicates_unlogged}})
        self._duplicates_unlogged = 0
        self._duplicate_logged_at = now

    def _record_error(self, outcome: Outcome) -> None:
        """A refusal as the status's ``last_error``: the reason, the (clipped) message, and
        which bundle, source and version it is about, so the cloud can tell one gap from the
        next (cloud/publisher.py)."""
        error = {
            "reason": outcome.reason,
            "message": clip_text(outcome.message, MAX_ERROR_TEXT),
            "bundle_id": outcome.bundle_id,
            "stream": outcome.stream,
            "at": time.time(),
        }
        if outcome.version is not None:
            error["version"] = outcome.version
        if outcome.expected_version is not None:
            error["expected_version"] = outcome.expected_version
        text = json.dumps(error)
        try:
            self.state.set_meta("last_error", text)
            self.unsaved_error = None
        except Exception as failure:  # noqa: BLE001 - reporting must not fail the agent
            # (a full disk): the status still says it, from memory
            self.unsaved_error = text
            log.warning("could not record the error", extra={"fields": {"error": str(failure)}})

    def _clear_settled_error(self, source: str | None) -> None:
        """A bundle of ``source`` was applied: the ``last_error`` no longer holds if it was
        about that source (whatever was refused on it, a gap, an expired or bad bundle, has been
        replaced: the source's sequence and content are again the cloud's), or about no source
        at all (a payload that could not be read far enough: bundles get through and pass
        again). An error about another source stays: that source is still waiting. Without
        this, a recovered device kept reporting its gap, and the cloud kept answering it."""
        try:
            raw = self.state.get_meta("last_error")
            if raw is None:
                return
            try:
                about = json.loads(raw).get("stream")
            except (ValueError, AttributeError):
                about = None
            if about is None or about == source:
                self.state.set_meta("last_error", None)
        except Exception:  # noqa: BLE001 - reporting must not fail the agent
            log.exception("could not clear the error")
