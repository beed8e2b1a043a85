"""Derived facts budgeted per stream: what one stream's rules may hold, so that one stream can
neither starve another nor the device's own readings.

Why not one budget for the whole device: a valid bundle deriving just under the device's limit
left nothing for anyone else, and every later change (another stream's bundle, the device's own
readings) was refused. So the facts a hyper-node holds are charged to the owners of its rules
(agent/state/claims.py: the sources claiming them): each bundle stream (``base``, ``all:base``,
``anomaly/...``) is an owner, and the device's own rules (``local``) are one. A hyper-node
holding rules of several owners is charged to each. Every change is then checked against every
owner's limit, as the engine runs it (``budget.FactLimit``):

* an owner may hold up to its limit (``[budget] max_derived_facts``, or its own figure in
  ``[budget.streams]``), or, when it holds more already (its limit was lowered, readings made it
  grow), as much as it holds: a change may shrink it, not grow it;
* a change by the device's own sources (its readings, its neighbours' telemetry, its local
  files) may take every owner ``readings_headroom`` beyond its limit: a stream near its limit
  never gets the device's readings refused, and readings that keep growing a stream's facts are
  still bounded.

Facts nobody's rules derive (explicit facts, the equality component's) are not charged; the
memory and time budgets bound every change as a whole.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from agent.engine.budget import FactLimit

LOCAL = "local"  # the owner of the device's own rules (its local files)


def is_device_source(source: str) -> bool:
    """The device's own sources: its local files, its readings, its neighbours' telemetry
    (no bundle may use these names, agent/protocol/messages.py)."""
    return source in (LOCAL, "sensor") or source.startswith("telemetry/")


@dataclass(frozen=True)
class StreamBudgets:
    """Per-owner limits on derived facts (see the module docstring)."""

    max_derived_facts: int
    streams: Mapping[str, int] = field(default_factory=dict)
    readings_headroom: float = 0.1

    def limit_of(self, owner: str) -> int:
        """An owner's own figure (a farm-wide ``all:<stream>`` takes ``<stream>``'s unless it
        has its own), else the default."""
        for name in (owner, owner.removeprefix("all:")):
            if name in self.streams:
                return self.streams[name]
        return self.max_derived_facts

    def fact_limits(
        self, source: str, claims: Mapping[str, Mapping[str, str]], nodes: Iterable
    ) -> tuple[FactLimit, ...]:
        """The limits a change by ``source`` runs under: ``claims`` are the rule claims once
        the change is made (rule name -> {source: content key}), ``nodes`` the hyper-nodes
        before it (``NodeState``), whose facts say what each owner holds now."""
        owned: dict[str, set[str]] = {}
        for name, holders in claims.items():
            for holder, key in holders.items():
                owner = LOCAL if is_device_source(holder) else holder
                owned.setdefault(owner, set()).update((name, key))
        headroom = self.readings_headroom if is_device_source(source) else 0.0
        limits = []
        nodes = list(nodes)
        for owner, rules in sorted(owned.items()):
            limit = self.limit_of(owner)
            mine = FactLimit(_scope(owner), frozenset(rules), limit + int(limit * headroom))
            held = sum(node.idb.size() for node in nodes if mine.counts(node.rules))
            limits.append(replace(mine, allowed=max(mine.allowed, held)))
        return tuple(limits)


def _scope(owner: str) -> str:
    return "the device's local rules" if owner == LOCAL else f"the rules of stream {owner!r}"
