"""The agent's health verdicts, served on ``/healthz`` and ``/readyz`` and sent in its status.

* **Alive** (``/healthz``): the process answers and the agent's loop went round recently.
  A loop stuck for longer than ``LOOP_STALL_FACTOR`` times the update budget (at least
  ``LOOP_STALL_MIN`` seconds) is not alive: a supervisor should restart the process.
* **Ready** (``/readyz``): the state was loaded and checked and has not been found damaged
  or replaced since, the broker is connected, no update has been running past its budget
  (``[budget] max_update_seconds``), and the event outbox holds fewer events than its bound
  (``[events] max_pending``). Not ready means "do not count on this device now": each reason
  says why, in words an operator can act on.

The verdicts read only what the loop publishes as plain attributes (``Watchdog``) and the
outbox's depth, so they are answered while the loop is busy.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

LOOP_STALL_FACTOR = 2.0
LOOP_STALL_MIN = 30.0


@dataclass(frozen=True)
class Verdict:
    ok: bool
    reasons: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        return {"ok": self.ok, "reasons": list(self.reasons)}


class Watchdog:
    """What the loop says about itself: when it last went round, and since when the message
    it is handling runs (None: none). Written by the loop's thread, read by the HTTP one
    (plain float attributes: each read sees one whole value)."""

    def __init__(self, clock=time.monotonic) -> None:
        self.clock = clock
        self.loop_at = clock()
        self.busy_since: float | None = None
        self.busy_kind: str | None = None

    def tick(self) -> None:
        self.loop_at = self.clock()

    def begin(self, kind: str) -> None:
        self.busy_kind = kind
        self.busy_since = self.clock()

    def end(self) -> None:
        self.busy_since = None
        self.busy_kind = None
        self.loop_at = self.clock()


def liveness(watchdog: Watchdog, budget_seconds: float) -> Verdict:
    stall = max(LOOP_STALL_MIN, LOOP_STALL_FACTOR * budget_seconds)
    quiet = watchdog.clock() - watchdog.loop_at
    busy = watchdog.busy_since
    if busy is not None:  # (an update running: its own budget check is readiness's)
        quiet = watchdog.clock() - busy
    if quiet > stall:
        return Verdict(False, [f"the agent's loop has not gone round for {quiet:.0f} s"])
    return Verdict(True)


def readiness(
    *,
    damage: str | None,
    connected: bool,
    watchdog: Watchdog,
    budget_seconds: float,
    outbox_pending: int | None,
    max_pending: int,
) -> Verdict:
    reasons = []
    if damage is not None:
        reasons.append(f"state: {damage}")
    if not connected:
        reasons.append("broker: not connected")
    busy = watchdog.busy_since
    if busy is not None:
        running = watchdog.clock() - busy
        if running > budget_seconds:
            reasons.append(
                f"update: a {watchdog.busy_kind} update has run {running:.1f} s, past its "
                f"budget of {budget_seconds:g} s ([budget] max_update_seconds)"
            )
    if outbox_pending is None:
        reasons.append("events: the outbox cannot be read")
    elif outbox_pending >= max_pending:
        reasons.append(
            f"events: the outbox holds {outbox_pending} events, its bound "
            f"([events] max_pending = {max_pending}); new events are not kept"
        )
    return Verdict(not reasons, reasons)
