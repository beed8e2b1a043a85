"""The agent's behaviour, independent of how messages arrive: what a turbine does with a bundle,
a reading, a neighbour's telemetry, and when it asks the cloud for rules or releases them.

``Agent`` owns the persistent reasoner (:class:`agent.persistence.AgentState`) and the trusted
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
  signed bundle carrying the request id as MQTT correlation data, whose stream is then linked to
  the request. When a configured "resolved" predicate is derived, the rules of the linked
  streams are deleted locally and the request is closed. The cloud may also release them by
  sending a bundle on that stream that deletes them (the usual way: the device reports its
  findings in its status, and the cloud decides that the event is dealt with).
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
import time
import uuid
from dataclasses import dataclass, field

from agent.bundle import (
    AddFacts,
    AddRules,
    Bundle,
    BundleError,
    BundleLimits,
    DeleteFacts,
    DeleteRules,
    DeviceStatus,
    KeyRing,
    RuleRequest,
    Telemetry,
    check_sequence,
    encode_fact,
    open_bundle,
)
from agent.config import AgentConfig
from agent.engine.errors import ZodiacError
from agent.engine.language import RDF_TYPE
from agent.persistence import AgentState, StateError, StreamVersion

log = logging.getLogger("zodiac.agent")

SENSOR_SOURCE = "sensor"  # the device's own readings
LOCAL_SOURCE = "local"  # rules and facts from the config file
REQUEST_TIMEOUT = 30.0  # seconds before an unanswered rule request may be sent again
MAX_FINDINGS = 100  # facts per status message (a status must stay small)


@dataclass
class Outcome:
    """What happened to one incoming change."""

    status: str  # "applied", "duplicate", "refused", "unchanged"
    reason: str = ""  # a BundleError reason, or "engine"/"state" for refusals
    message: str = ""
    report: dict = field(default_factory=dict)
    bundle_id: str | None = None
    stream: str | None = None

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
            **{k: self.report[k] for k in ("operation", "seconds") if k in self.report},
        }


class Agent:
    """One turbine's reasoning agent (see the module docstring)."""

    def __init__(self, config: AgentConfig, *, keyring: KeyRing | None = None) -> None:
        self.config = config
        self.keyring = keyring or KeyRing.from_directory(config.keys.trusted_keys)
        self.limits = BundleLimits(
            max_bytes=config.keys.max_bundle_bytes, max_operations=config.keys.max_operations
        )
        config.database.parent.mkdir(parents=True, exist_ok=True)
        self.state = AgentState(
            config.database, synchronous=config.synchronous, modules=config.reasoning.modules
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
        if report.created:
            self._load_local_files()

    @property
    def reasoner(self):
        return self.state.reasoner

    def close(self) -> None:
        self.state.close()

    # ------------------------------------------------------------------ start-up
    def _load_local_files(self) -> None:
        """Rules and facts named in the config, loaded once when the state file is created."""
        reasoning = self.config.reasoning
        if not reasoning.rules and not reasoning.facts:
            return
        from agent.engine.reasoner import load_facts, load_program

        rules = [rule for path in reasoning.rules for rule in load_program(path).rules]
        facts = [fact for path in reasoning.facts for fact in load_facts(path)]
        self.state.apply(add_rules=rules, add_facts=facts, source=LOCAL_SOURCE)
        log.info(
            "local rules and facts loaded",
            extra={"fields": {"rules": len(rules), "facts": len(facts)}},
        )

    # ------------------------------------------------------------------ bundles
    def handle_bundle(self, payload: bytes, *, correlation: str | None = None) -> Outcome:
        """Verify, sequence-check and apply one signed bundle, in one transaction."""
        try:
            bundle = open_bundle(payload, self.keyring, limits=self.limits)
            applied = self.state.applied_versions().get(bundle.stream)
            if check_sequence(bundle, applied) == "duplicate":
                return self.note(
                    Outcome(
                        "duplicate",
                        message=f"version {bundle.version} <= applied {applied}",
                        bundle_id=bundle.bundle_id,
                        stream=bundle.stream,
                    )
                )
            outcome = self.apply_bundle(bundle)
        except BundleError as error:
            outcome = Outcome(
                "refused", error.reason, str(error), bundle_id=error.bundle_id, stream=error.stream
            )
        if outcome.status == "applied" and correlation:
            self._link_request(correlation, outcome.stream or "")
        if outcome.status == "applied" and outcome.stream:
            self._close_released(outcome.stream)
        return self.note(outcome)

    def apply_bundle(self, bundle: Bundle) -> Outcome:
        """Apply an already verified bundle (its operations as one change)."""
        rules = {rule.id: rule for rule in bundle.parsed_rules()}
        add_rules: dict[str, object] = {}
        delete_rules: list[str] = []
        add_facts: dict[tuple, None] = {}
        delete_facts: dict[tuple, None] = {}
        for op in bundle.operations:
            if isinstance(op, AddRules):
                for spec in op.rules:
                    add_rules[spec.id] = rules[spec.id]
            elif isinstance(op, DeleteRules):
                for rule_id in op.ids:
                    add_rules.pop(rule_id, None)
                    delete_rules.append(rule_id)
            elif isinstance(op, AddFacts):
                for fact in op.fact_tuples():
                    delete_facts.pop(fact, None)
                    add_facts[fact] = None
            elif isinstance(op, DeleteFacts):
                for fact in op.fact_tuples():
                    add_facts.pop(fact, None)
                    delete_facts[fact] = None
        if bundle.full_state:
            for rule_id in self.state.rules_of_stream(bundle.stream):
                if rule_id not in add_rules:
                    delete_rules.append(rule_id)
            for fact in self.state.facts_of_source(bundle.stream):
                if fact not in add_facts:
                    delete_facts[fact] = None
        known = self.reasoner.rules
        ignored = [rid for rid in delete_rules if rid not in known]
        delete_rules = sorted({rid for rid in delete_rules if rid in known})
        # A rule deleted and re-added with the same id in one bundle is a replacement.
        try:
            report = self.state.apply(
                add_rules=list(add_rules.values()),
                delete_rules=delete_rules,
                add_facts=list(add_facts),
                delete_facts=list(delete_facts),
                source=bundle.stream,
                bundle_id=bundle.bundle_id,
                version=StreamVersion(bundle.stream, bundle.version, bundle.bundle_id),
            )
        except StateError as error:
            return Outcome(
                "refused", "state", str(error), bundle_id=bundle.bundle_id, stream=bundle.stream
            )
        except ZodiacError as error:
            return Outcome(
                "refused", "engine", str(error), bundle_id=bundle.bundle_id, stream=bundle.stream
            )
        report["rules_ignored"] = ignored
        return Outcome("applied", report=report, bundle_id=bundle.bundle_id, stream=bundle.stream)

    # ------------------------------------------------------------------ readings
    def record_readings(self, readings: list[tuple]) -> Outcome:
        """The device's own sensor values: each replaces the sensor's previous value."""
        return self._replace(SENSOR_SOURCE, readings, by_sensor=True)

    def handle_telemetry(self, payload: bytes) -> Outcome:
        """A neighbour's snapshot of readings: replaces what that neighbour sent before."""
        try:
            from agent.bundle import decode_telemetry

            telemetry = decode_telemetry(payload)
        except BundleError as error:
            return self.note(Outcome("refused", error.reason, f"telemetry: {error}"))
        if telemetry.farm != self.config.farm or telemetry.device == self.config.device:
            return Outcome("unchanged", message="telemetry of another farm or of this device")
        readings = list(telemetry.fact_tuples())
        return self._replace(f"telemetry/{telemetry.device}", readings, by_sensor=False)

    def _replace(self, source: str, readings: list[tuple], *, by_sensor: bool) -> Outcome:
        old = self.state.facts_of_source(source)
        new = [tuple(f) for f in readings]
        old_set, new_set = set(old), set(new)
        if by_sensor:
            fresh = {(f[0], f[1]) for f in new}
            gone = [f for f in old if (f[0], f[1]) in fresh and f not in new_set]
        else:
            gone = [f for f in old if f not in new_set]
        added = [f for f in new if f not in old_set]
        if not gone and not added:
            return Outcome("unchanged")
        try:
            report = self.state.apply(add_facts=added, delete_facts=gone, source=source)
        except ZodiacError as error:
            return self.note(Outcome("refused", "engine", f"{source}: {error}"))
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
                report = self.state.apply(delete_rules=rule_ids, source=stream)
            except ZodiacError as error:
                outcomes.append(self.note(Outcome("refused", "engine", str(error))))
                continue
            with self.state.conn:
                self.state.conn.execute(
                    "UPDATE requests SET status = 'resolved', resolved_at = ? WHERE request_id = ?",
                    (time.time(), request_id),
                )
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
            last_error=self.state.get_meta("last_error"),
            updated_at=time.time(),
        )

    def findings(self) -> list[list]:
        """The derived facts of the configured ``findings`` predicates (encoded, sorted)."""
        found = []
        for predicate in self.config.reasoning.findings:
            found += [encode_fact(f) for f in self.reasoner.facts_named(predicate)]
        return sorted(found, key=repr)[:MAX_FINDINGS]

    def note(self, outcome: Outcome, *, quiet: bool = False) -> Outcome:
        """Log an outcome; a refusal also becomes the status's ``last_error``."""
        fields = outcome.as_log()
        if outcome.status == "refused":
            log.warning("refused", extra={"fields": fields})
            try:
                self.state.set_meta(
                    "last_error",
                    json.dumps(
                        {
                            "reason": outcome.reason,
                            "message": outcome.message,
                            "bundle_id": outcome.bundle_id,
                            "stream": outcome.stream,
                            "at": time.time(),
                        }
                    ),
                )
            except Exception:  # noqa: BLE001 - reporting must not fail the agent
                log.exception("could not record the error")
        elif not quiet:
            log.info(outcome.status, extra={"fields": fields})
        return outcome
