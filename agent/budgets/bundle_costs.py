"""What applying a bundle costs the device, remembered across process deaths and deliveries.

Two records in the state's ``meta`` table, both about bundles that the budgets' own checks
(agent/engine/budget.py) could not simply stop and refuse:

* **The marker of the try in progress** (``applying_bundle``): written before a bundle is
  applied, updated every ``HEARTBEAT_SECONDS`` while it is (by a thread of its own, so that a
  loop no budget check sees, or a long commit, still counts), removed in the transaction that
  commits the bundle, or when it is refused. A marker found at the next delivery of the same
  bundle means the process died while applying it: that try is *interrupted*, and what it had
  cost as far as it got (its time, the process's memory) is added to the bundle's account.
  Poison is decided by that account against the budgets, never by the number of deaths: a
  power cut or an operator's restart during a cheap bundle costs a few milliseconds, however
  often it happens, while a bundle that got the agent killed (the kernel's out-of-memory
  killer, a watchdog) after its tries together took the update's time budget, or one of them
  more memory than the memory budget allows, is refused (``budget_exceeded``) instead of
  killing the agent in a loop.
* **Bundles that went over the time budget** (``over_time_budget``): a bundle stopped by the
  time budget is refused after a full budget of work; the same bundle (the same signed bytes)
  delivered again is refused at once, without another try, unless the time budget was raised
  since. The last ``OVER_TIME_KEPT`` such bundles are remembered.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from agent.engine.budget import MEMORY_SLACK, Budget, figure, resident_memory

MARKER = "applying_bundle"  # meta key: the bundle being applied and its account
OVER_TIME = "over_time_budget"  # meta key: bundles refused by the time budget
HEARTBEAT_SECONDS = 0.5  # how often a try in progress records what it has cost so far
OVER_TIME_KEPT = 20
MIB = 1024 * 1024


@dataclass
class TryCost:
    """What one try at applying a bundle had cost when last recorded."""

    seconds: float = 0.0
    memory: int = 0  # the process's resident memory, at its highest seen
    memory_at_start: int = 0

    def over_memory(self, budget: Budget) -> bool:
        """Over the memory budget by the budget's own rule: over the limit, and grown during
        the try by more than the slack (memory held before it is not the bundle's)."""
        limit = budget.max_memory_bytes
        return (
            limit is not None
            and self.memory > limit
            and self.memory - self.memory_at_start > MEMORY_SLACK
        )


@dataclass
class Account:
    """A bundle's tries that ended with the process gone, and the try in progress."""

    bundle_id: str
    interrupted: int = 0
    seconds: float = 0.0  # the interrupted tries' time, each as far as it got
    memory: int = 0  # the highest memory an interrupted try reached
    over_memory: bool = False  # an interrupted try went over the memory budget
    current: TryCost = field(default_factory=TryCost)

    @classmethod
    def read(cls, text: str | None) -> Account | None:
        """The account a marker holds (None: no marker). A marker of an older agent (the
        bundle id, or ``[id, tries]``) has tries of no known cost."""
        if text is None:
            return None
        try:
            data = json.loads(text)
        except ValueError:
            return cls(text, interrupted=0)
        if isinstance(data, list) and len(data) == 2:
            return cls(str(data[0]))
        if not isinstance(data, dict) or not isinstance(data.get("bundle_id"), str):
            return cls(str(data))
        try:
            current = TryCost(**data.get("current", {}))
            return cls(
                data["bundle_id"],
                interrupted=int(data.get("interrupted", 0)),
                seconds=float(data.get("seconds", 0.0)),
                memory=int(data.get("memory", 0)),
                over_memory=bool(data.get("over_memory", False)),
                current=current,
            )
        except (TypeError, ValueError):  # (a damaged marker: its costs are unknown)
            return cls(data["bundle_id"])

    def to_text(self) -> str:
        return json.dumps(asdict(self))

    def interrupt(self, budget: Budget) -> None:
        """The try in progress ended with the process gone: its cost joins the account."""
        self.interrupted += 1
        self.seconds += self.current.seconds
        self.memory = max(self.memory, self.current.memory)
        self.over_memory = self.over_memory or self.current.over_memory(budget)
        self.current = TryCost()

    def poison(self, budget: Budget) -> str | None:
        """Why the bundle must not be tried again (None: it may be)."""
        tries = f"{self.interrupted} tr{'y' if self.interrupted == 1 else 'ies'}"
        limit = budget.max_seconds
        if limit is not None and self.seconds >= limit:
            return (
                f"the agent was killed while applying this bundle ({tries}) after "
                f"{figure(self.seconds)} seconds of work in all, more than the update's time "
                f"budget of {figure(limit)} seconds; refused so that it cannot cause a "
                "restart loop"
            )
        if self.over_memory:
            return (
                f"the agent was killed while applying this bundle ({tries}) with "
                f"{self.memory / MIB:,.0f} MiB of memory, more than the memory budget of "
                f"{(budget.max_memory_bytes or 0) / MIB:,.0f} MiB; refused so that it cannot "
                "cause a restart loop"
            )
        return None


def begin_try(account: Account | None, bundle_id: str, budget: Budget) -> Account:
    """The account for a new try at ``bundle_id``: the marker found (a death while applying
    it) with its try in progress counted as interrupted, or a new one."""
    if account is None or account.bundle_id != bundle_id:
        account = Account(bundle_id)
    else:
        account.interrupt(budget)
    account.current = TryCost(memory_at_start=resident_memory() or 0)
    account.current.memory = account.current.memory_at_start
    return account


class Heartbeat:
    """While a bundle is applied: every ``HEARTBEAT_SECONDS``, the try's time and the process's
    memory so far, written into the marker by a thread with its own connection. Without
    fsync (``synchronous = NORMAL``): what a killed process wrote survives it, and what a
    power cut loses only makes a try look cheaper, which is right for a power cut. Writing
    only updates an existing marker, so a beat that races the commit removing the marker
    never brings it back."""

    def __init__(self, file: Path, account: Account) -> None:
        self.file = file
        self.account = account
        self.started = time.monotonic()
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, name="bundle-heartbeat", daemon=True)

    def __enter__(self) -> Heartbeat:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        self.thread.join()

    def _run(self) -> None:
        conn: sqlite3.Connection | None = None
        try:
            while not self.done.wait(HEARTBEAT_SECONDS):
                current = self.account.current
                current.seconds = time.monotonic() - self.started
                current.memory = max(current.memory, resident_memory() or 0)
                try:
                    if conn is None:
                        conn = sqlite3.connect(  # (mode=rw: a file gone is not made anew)
                            f"{self.file.as_uri()}?mode=rw",
                            uri=True,
                            timeout=0.05,
                            isolation_level=None,
                        )
                        conn.execute("PRAGMA synchronous=NORMAL")
                    conn.execute(
                        "UPDATE meta SET value = ? WHERE key = ?",
                        (self.account.to_text(), MARKER),
                    )
                except sqlite3.Error:  # (busy with the commit, a full disk: the next beat)
                    pass
        finally:
            if conn is not None:
                conn.close()


def payload_digest(payload: bytes) -> str:
    """The identity of a bundle as delivered: its signed bytes."""
    return hashlib.sha256(payload).hexdigest()[:32]


def over_time_refusal(text: str | None, digest: str, budget: Budget) -> str | None:
    """Why the bundle of ``digest`` is refused without a try: it went over the time budget
    before and the budget is not larger now (None: it may be tried)."""
    limit = budget.max_seconds
    for entry in _over_time_entries(text):
        if entry.get("digest") != digest:
            continue
        allowed = float(entry.get("allowed", 0))
        if limit is not None and limit <= allowed:
            when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(float(entry.get("at", 0))))
            return (
                f"refused without another try: this bundle needed more than "
                f"{figure(allowed)} seconds when it was applied at {when}, and the time "
                "budget is not larger now ([budget] max_update_seconds)"
            )
    return None


def over_time_recorded(text: str | None, digest: str, bundle_id: str, allowed: float) -> str:
    """The over-time record with this bundle added (the last ``OVER_TIME_KEPT`` kept)."""
    entries = [e for e in _over_time_entries(text) if e.get("digest") != digest]
    entry = {"digest": digest, "bundle_id": bundle_id, "allowed": allowed, "at": time.time()}
    entries.append(entry)
    return json.dumps(entries[-OVER_TIME_KEPT:])


def _over_time_entries(text: str | None) -> list[dict]:
    try:
        entries = json.loads(text) if text else []
    except ValueError:
        return []
    return [e for e in entries if isinstance(e, dict)] if isinstance(entries, list) else []
