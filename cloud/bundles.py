"""Cutting per-device bundles: what each device should hold, as signed, versioned differences.

The cloud decides, per device and per rule stream, the rules and facts the device should hold
(its *target*). :class:`BundleCutter` remembers what it last sent each device on each stream and
turns a new target into the smallest bundle that gets the device there: rules and facts added,
rules and facts deleted, version + 1. When a device reports a version gap (it missed a bundle, or
lost its state), :meth:`BundleCutter.full_state` re-sends the whole target as a ``full_state``
bundle, which the agent applies whatever its version; the cutter remembers the last full state
cut per device and stream (:meth:`BundleCutter.last_full_state`), so that one gap gets one.

The cutter's memory (last target and version per device and stream), the ledger of bundles
sent, is kept in a small SQLite file, so a restarted publisher continues the version sequence
instead of starting again at 1 (which every device would ignore as a duplicate). It is written
through sqlite-utils (tables declared as columns, upserts by primary key), opened with
``execute_plugins=False``: a plugin installed beside the publisher must not get hooks on the
connection that holds every device's version sequence.

Rule streams live as text under ``rules/``: ``rules/<farm-set>/base.rules`` is stream ``base``,
``rules/<farm-set>/anomaly/ambient-temperature.rules`` is stream
``anomaly/ambient-temperature`` (:func:`load_streams`). Rules need labels: the label is the rule's
stable id on every device.

This module needs no Spark: the publisher answers requests from the latest cut targets.
"""

from __future__ import annotations

import json
import sqlite3
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from sqlite_utils import Database
from sqlite_utils.db import Table

from agent.engine.errors import ZodiacError
from agent.engine.program.parser import parse_file
from agent.protocol.messages import (
    MAX_BUNDLE_LIFETIME,
    AddFacts,
    AddRules,
    Bundle,
    DeleteFacts,
    DeleteRules,
    RuleSpec,
    decode_term,
    encode_fact,
)
from cloud.events import create_events_table


@dataclass
class Target:
    """What one device should hold on one stream: rule id -> rule text, and facts, and the
    stream's windows over readings and watches (canonical ``@window`` texts and atom
    patterns, from its rule file's ``@window`` and ``@watch`` lines: docs/agent.md)."""

    rules: dict[str, str] = field(default_factory=dict)
    facts: set[tuple] = field(default_factory=set)
    windows: list[str] = field(default_factory=list)
    watches: list[str] = field(default_factory=list)


class StreamRules(dict):
    """One stream's rules, rule id -> rule text (a dict, as :func:`load_streams` has always
    given them), with the ``windows`` and ``watches`` its file declares."""

    def __init__(self, rules: dict[str, str], windows: list[str], watches: list[str]) -> None:
        super().__init__(rules)
        self.windows = windows
        self.watches = watches


def stream_target(rules: dict[str, str], facts: set[tuple] | None = None) -> Target:
    """The target of a stream's rules (a :class:`StreamRules` brings its windows and watches)
    and ``facts``."""
    return Target(
        rules=dict(rules),
        facts=set(facts or ()),
        windows=list(getattr(rules, "windows", [])),
        watches=list(getattr(rules, "watches", [])),
    )


def load_streams(directory: str | Path) -> dict[str, StreamRules]:
    """Every ``.rules`` file under ``directory`` as a stream: name -> {rule id: rule text}.

    Raises ZodiacError for an unlabelled rule (its id would be a hash of its text, which
    changes whenever the rule is edited, so the device could never delete the old version)."""
    root = Path(directory)
    if not root.is_dir():
        raise ZodiacError(f"{directory}: not a directory of rule streams (<stream>.rules)")
    streams: dict[str, dict[str, str]] = {}
    for path in sorted(root.rglob("*.rules")):
        streams[path.relative_to(root).with_suffix("").as_posix()] = load_stream_file(path)
    return streams


def load_stream_file(path: str | Path) -> StreamRules:
    """One stream's rule file as {rule id: rule text}, with its ``@window`` and ``@watch``
    declarations (:class:`StreamRules`); every rule needs a label (see :func:`load_streams`)."""
    rules: dict[str, str] = {}
    program = parse_file(Path(path))
    for rule in program.rules:
        if not rule.label:
            raise ZodiacError(f"{path}: every rule of a stream needs a label: {rule}")
        rules[rule.id] = str(rule)
    windows = [str(window) for window in program.windows]
    return StreamRules(rules, windows, [str(pattern) for pattern in program.watches])


def device_facts(
    facts: Iterable[tuple], device: str, neighbour_predicate: str, *, neighbours: bool = True
) -> set[tuple]:
    """The facts of the farm graph a device needs: every fact about the device itself or
    about one of its neighbours (``neighbour_predicate(device, n)`` in the materialised
    graph), i.e. whose subject is one of them, class facts included. This is what lets the
    device reason about its neighbourhood (e.g. the median of its neighbours' readings)
    without holding the whole farm.

    ``neighbours=False`` keeps only the facts about the device itself (its neighbour links
    included): for rule sets that must reason about the device alone, whose neighbours' facts
    would otherwise make the device draw conclusions about them too."""
    facts = list(facts)
    keep = {device}
    if neighbours:
        keep |= {
            f[2] for f in facts if f[0] == neighbour_predicate and len(f) == 3 and f[1] == device
        }
    return {f for f in facts if len(f) >= 2 and f[1] in keep}


def facts_for(
    facts: Iterable[tuple],
    device: str,
    neighbour_predicate: str | None = None,
    *,
    own_only: bool = False,
) -> set[tuple]:
    """What ``publish --facts`` and ``bundle --facts`` send a device of the farm graph: with
    ``own_only`` the facts about the device itself (its neighbour links included), with a
    ``neighbour_predicate`` those about it and its neighbours, otherwise all of them.

    ``own_only`` is for rules that trigger on any turbine's facts (a reading far from the
    forecast): a device holding its neighbours' forecasts would suspect them too, and ask
    the cloud for rules about them."""
    if own_only:
        return device_facts(facts, device, neighbour_predicate or "", neighbours=False)
    if neighbour_predicate:
        return device_facts(facts, device, neighbour_predicate)
    return set(facts)


# How long a bundle stays valid: a device offline for longer refuses it as expired, reports
# the version gap and gets a fresh full-state bundle; a captured bundle is useless after it.
DEFAULT_TTL = 7 * 24 * 3600.0

# What was last sent to each device on each stream (the table earlier publishers made too:
# sqlite-utils declares it with the same columns, types and key, so their files open as they are).
SENT_COLUMNS = {"device": str, "stream": str, "version": int, "target": str, "at": float}

# The last full state cut for each device and stream, and when: a device that reports a gap
# the full state already answers (it is on its way, or applied) does not get another one.
FULL_STATES_COLUMNS = {"device": str, "stream": str, "version": int, "at": float}

LEDGER_KEY = ("device", "stream")


def open_ledger(path: str | Path) -> Database:
    """The publisher's ledger file as a sqlite-utils `Database` (created when missing), with
    plugins off and WAL on; the connection may be used from the publisher's MQTT thread."""
    conn = sqlite3.connect(path, check_same_thread=False)
    db = Database(conn, execute_plugins=False)
    db.execute("PRAGMA journal_mode=WAL")
    with db.atomic():
        for name, columns in (("sent", SENT_COLUMNS), ("full_states", FULL_STATES_COLUMNS)):
            db.table(name).create(columns, pk=LEDGER_KEY, if_not_exists=True)
        create_events_table(db)  # (the devices' events: cloud/events.py)
    return db


@dataclass(frozen=True)
class SentFullState:
    """The last full state cut for a device and stream: its version, and when (cloud time)."""

    version: int
    at: float


class BundleCutter:
    """Turns per-device targets into versioned difference bundles (see module docstring).

    Every bundle is addressed to one device of ``farm`` (or to ``FARM_WIDE``, the whole farm)
    and expires ``ttl`` seconds after it is cut."""

    def __init__(self, path: str | Path, farm: str, *, ttl: float = DEFAULT_TTL) -> None:
        if not 0 < ttl <= MAX_BUNDLE_LIFETIME:
            raise ValueError(
                f"a bundle's time to live must be positive and at most "
                f"{MAX_BUNDLE_LIFETIME:.0f} s ({MAX_BUNDLE_LIFETIME / 86400:.0f} days), got {ttl}"
            )
        self.farm = farm
        self.ttl = ttl
        # Used from the publisher's MQTT thread too (always under the publisher's lock).
        try:
            self.db = open_ledger(path)
        except sqlite3.Error as error:
            raise ZodiacError(f"{path}: cannot open the publisher's state ({error})") from None
        self.conn = self.db.conn
        self.sent: Table = self.db.table("sent")
        self.full_states: Table = self.db.table("full_states")

    def version(self, device: str, stream: str) -> int:
        row = self._row(device, stream)
        return row[0] if row else 0

    def last_target(self, device: str, stream: str) -> Target:
        row = self._row(device, stream)
        if row is None:
            return Target()
        data = json.loads(row[1])
        facts = {tuple(decode_term(t) for t in fact) for fact in data["facts"]}
        # (a ledger written before windows and watches were cut: none was sent)
        windows, watches = data.get("windows", []), data.get("watches", [])
        return Target(rules=data["rules"], facts=facts, windows=windows, watches=watches)

    def cut(self, device: str, stream: str, target: Target) -> Bundle | None:
        """The bundle taking ``device`` from the last target sent on ``stream`` to ``target``,
        or None when nothing changed. Recorded as sent (call :meth:`full_state` to resend)."""
        before = self.last_target(device, stream)
        operations: list = []
        gone_rules = [rid for rid in before.rules if target.rules.get(rid) != before.rules[rid]]
        new_rules = {
            rid: text for rid, text in target.rules.items() if before.rules.get(rid) != text
        }
        if gone_rules:
            operations.append(DeleteRules(ids=sorted(gone_rules)))
        if new_rules:
            operations.append(
                AddRules(rules=[RuleSpec(id=rid, text=text) for rid, text in new_rules.items()])
            )
        gone_facts = before.facts - target.facts
        new_facts = target.facts - before.facts
        if gone_facts:
            operations.append(
                DeleteFacts(facts=[encode_fact(f) for f in sorted(gone_facts, key=repr)])
            )
        if new_facts:
            operations.append(AddFacts(facts=[encode_fact(f) for f in sorted(new_facts, key=repr)]))
        # Windows and watches are sent as the stream's whole list, when it changed.
        windows = target.windows if target.windows != before.windows else None
        watches = target.watches if target.watches != before.watches else None
        if not operations and windows is None and watches is None:
            return None
        return self._record(
            device, stream, target, operations, full_state=False, windows=windows, watches=watches
        )

    def last_sent_at(self, device: str, stream: str) -> float | None:
        """When the last bundle for ``device`` on ``stream`` was cut (cloud time; None: never)."""
        row = self._get(self.sent, device, stream)
        return row["at"] if row else None

    def last_full_state(self, device: str, stream: str) -> SentFullState | None:
        """The last full state cut for ``device`` on ``stream`` (None: never)."""
        row = self._get(self.full_states, device, stream)
        return SentFullState(row["version"], row["at"]) if row else None

    def full_state(self, device: str, stream: str, target: Target | None = None) -> Bundle:
        """The whole target (by default the last one sent) as a ``full_state`` bundle,
        recorded as sent (see :meth:`last_full_state`)."""
        target = target if target is not None else self.last_target(device, stream)
        operations: list = []
        if target.rules:
            operations.append(
                AddRules(rules=[RuleSpec(id=r, text=t) for r, t in target.rules.items()])
            )
        if target.facts:
            operations.append(
                AddFacts(facts=[encode_fact(f) for f in sorted(target.facts, key=repr)])
            )
        return self._record(
            device,
            stream,
            target,
            operations,
            full_state=True,
            windows=target.windows or None,  # (None: a full state's stream has none)
            watches=target.watches or None,
        )

    def release(self, device: str, stream: str) -> Bundle | None:
        """Empty the stream on the device (the event is over): a bundle deleting everything."""
        return self.cut(device, stream, Target())

    def _record(
        self,
        device: str,
        stream: str,
        target: Target,
        operations: list,
        *,
        full_state: bool,
        windows: list[str] | None = None,
        watches: list[str] | None = None,
    ) -> Bundle:
        version = self.version(device, stream) + 1
        now = time.time()
        bundle = Bundle(
            bundle_id=f"{device}:{stream}:{version}:{uuid.uuid4().hex[:8]}",
            farm=self.farm,
            device=device,
            stream=stream,
            version=version,
            issued_at=now,
            expires_at=now + self.ttl,
            full_state=full_state,
            operations=operations,
            windows=windows,
            watches=watches,
        )
        data = {
            "rules": target.rules,
            "facts": [encode_fact(f) for f in sorted(target.facts, key=repr)],
            "windows": target.windows,
            "watches": target.watches,
        }
        key = {"device": device, "stream": stream}
        with self.db.atomic():  # (both tables or neither)
            self.sent.upsert(
                {**key, "version": version, "target": json.dumps(data), "at": now}, pk=LEDGER_KEY
            )
            if full_state:
                self.full_states.upsert({**key, "version": version, "at": now}, pk=LEDGER_KEY)
        return bundle

    def _row(self, device: str, stream: str) -> tuple[int, str] | None:
        """The version and target (JSON) last sent to ``device`` on ``stream``."""
        row = self._get(self.sent, device, stream)
        return (row["version"], row["target"]) if row else None

    @staticmethod
    def _get(table: Table, device: str, stream: str) -> dict | None:
        """The ledger row of ``device`` and ``stream`` in ``table`` (None: none yet)."""
        rows = list(table.rows_where("device = ? AND stream = ?", [device, stream], limit=1))
        return rows[0] if rows else None
