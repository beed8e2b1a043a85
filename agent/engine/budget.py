"""Budgets: what one update may cost (derived facts held, memory, wall time), and the guard that
checks them while the update runs.

Why: a validly signed rule bundle can still explode (a cartesian product of two large relations,
an unbounded ``num(X + 1) :- num(X)``). On a turbine's controller that is an out-of-memory kill
or a watchdog restart, and then the same bundle again. With a budget the update stops at the
next check, the reasoner rolls back to exactly the state before it (``maintenance.py``), and
:class:`BudgetExceeded` says which limit was hit with the figures.

Where the checks are (cheap, cooperative, never in the middle of a store mutation):

* at every hyper-node and every seminaive round (``BudgetGuard.check``);
* inside compiled join loops: the outermost loop of every compiled rule tests
  ``len(out) > G.cap`` and calls ``G.pulse(out)`` when its output grew past the cap, so a join
  that produces millions of facts stops after a few thousand more than allowed. The cap is
  raised in steps of ``PULSE_STEP`` facts, so time and memory are looked at every step too.

A loop that runs long without producing anything is seen only at its end; the agent's
poison-bundle marker (agent/budgets/bundle_costs.py) covers what no check sees (a kill by the
kernel).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from agent.engine.errors import ZodiacError

PULSE_STEP = 20_000  # facts between two looks at the clock and the memory from compiled loops
TICK_SECONDS = 0.01  # at most this often from code that runs often
MEMORY_SLACK = 16 * 1024 * 1024  # growth within an update below which memory is not blamed
UNLIMITED = sys.maxsize


@dataclass(frozen=True)
class FactLimit:
    """A bound on the derived facts held by the hyper-nodes of some rules (one owner's: the
    agent gives each stream its own, agent/budgets/stream_budgets.py): ``rules`` are their ids and
    content keys, ``scope`` names them in the refusal ("the rules of stream 'base'"). A
    hyper-node holding rules of several owners counts for each of them."""

    scope: str
    rules: frozenset[str]
    allowed: int

    def counts(self, rules: Iterable) -> bool:
        """Whether a hyper-node of ``rules`` counts against this limit."""
        mine = self.rules
        return any(rule.key in mine or rule.id in mine for rule in rules)


@dataclass(frozen=True)
class Budget:
    """Limits for one update; None means no limit.

    ``max_derived_facts`` bounds the derived facts the reasoner holds during and after the
    update (all hyper-nodes together), ``fact_limits`` those of the hyper-nodes of given
    rules, ``max_memory_bytes`` the process's resident memory (an update is stopped when the
    process is over it and has grown during the update), ``max_seconds`` the update's wall
    time."""

    max_derived_facts: int | None = None
    max_memory_bytes: int | None = None
    max_seconds: float | None = None
    fact_limits: tuple[FactLimit, ...] = ()

    def __post_init__(self) -> None:
        for name in ("max_derived_facts", "max_memory_bytes", "max_seconds"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"{name} must be positive, got {value}")

    @property
    def limited(self) -> bool:
        return bool(self.fact_limits) or any(
            v is not None for v in (self.max_derived_facts, self.max_memory_bytes, self.max_seconds)
        )


class BudgetExceeded(ZodiacError):
    """An update went over its budget; the reasoner is back to the state before it.

    ``limit`` names the budget (``derived_facts``, ``memory_bytes``, ``seconds``), ``allowed``
    and ``used`` are the figures at the check that stopped it, ``scope`` whose facts they are
    when the limit is a `FactLimit` (None: the whole reasoner's)."""

    def __init__(self, limit: str, allowed: float, used: float, scope: str | None = None) -> None:
        self.limit = limit
        self.allowed = allowed
        self.used = used
        self.scope = scope
        units = {"derived_facts": "derived facts", "memory_bytes": "bytes of memory"}
        unit = units.get(limit, "seconds")
        needed = f"{scope} would hold" if scope else "it needed"
        super().__init__(
            f"update stopped: {needed} more than {figure(allowed)} {unit} "
            f"({figure(used)} when stopped); the state is as before the update"
        )

    def figures(self) -> dict:
        found = {"limit": self.limit, "allowed": self.allowed, "used": self.used}
        if self.scope is not None:
            found["scope"] = self.scope
        return found


def figure(value: float) -> str:
    """A budget's figure for a message: whole numbers with thousands separators, others with
    three significant digits (a limit of 0.001 s must not read 0.00)."""
    return f"{value:,.0f}" if value >= 100 or value == int(value) else f"{value:.3g}"


def resident_memory() -> int | None:
    """The process's resident set size in bytes (Linux), or None where it cannot be read."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


class BudgetGuard:
    """Checks one :class:`Budget` during one update (see the module docstring).

    ``held`` counts the derived facts held now; the driver sets it to a function of the
    hyper-nodes it is building. ``cap`` is what compiled loops compare their output size with."""

    def __init__(self, budget: Budget | None = None) -> None:
        self.budget = budget or Budget()
        self.held: Callable[[], int] = lambda: 0
        self.nodes: Callable[[], Iterable] = tuple  # the hyper-nodes, for ``fact_limits``
        self.current: object | None = None  # the hyper-node being computed (None: unknown)
        self._counted: dict[frozenset[str], tuple[int, ...]] = {}  # rule keys -> limits
        self.started = time.monotonic()
        self.cap = UNLIMITED
        self.active = False
        self.last_tick = 0.0
        self.memory_at_start = 0

    def start(self, held: Callable[[], int], nodes: Callable[[], Iterable] = tuple) -> BudgetGuard:
        """Start the update's clock. ``held`` counts the derived facts held now, ``nodes``
        gives the hyper-nodes (``NodeState``: rules, IDB) that ``fact_limits`` look at."""
        self.held = held
        self.nodes = nodes
        self.current = None
        self.started = time.monotonic()
        self.active = self.budget.limited
        if self.budget.max_memory_bytes is not None:
            self.memory_at_start = resident_memory() or 0
        self.cap = PULSE_STEP if self.active else UNLIMITED
        return self

    def stop(self) -> None:
        self.active = False
        self.cap = UNLIMITED

    def check(self, in_flight: int = 0) -> None:
        """Raise BudgetExceeded if a limit is passed; ``in_flight`` facts are derived but not
        yet stored (a compiled rule's output set)."""
        if not self.active:
            return
        budget = self.budget
        if budget.max_seconds is not None:
            elapsed = time.monotonic() - self.started
            if elapsed > budget.max_seconds:
                self._exceeded("seconds", budget.max_seconds, elapsed)
        if budget.max_derived_facts is not None:
            held = self.held() + in_flight
            if held > budget.max_derived_facts:
                self._exceeded("derived_facts", budget.max_derived_facts, held)
        if budget.fact_limits:
            self._check_fact_limits(in_flight)
        if budget.max_memory_bytes is not None:
            memory = resident_memory()
            # Over the limit and grown in this update: memory an earlier (abandoned) update
            # left to Python's allocator is reused without growing the process, so a device
            # is never stuck refusing every change after one bad bundle.
            if (
                memory is not None
                and memory > budget.max_memory_bytes
                and memory - self.memory_at_start > MEMORY_SLACK
            ):
                self._exceeded("memory_bytes", budget.max_memory_bytes, memory)

    def _check_fact_limits(self, in_flight: int) -> None:
        """Each `FactLimit` against the facts of the hyper-nodes it counts; the facts in
        flight belong to the hyper-node being computed (to every limit, when it is not
        known)."""
        limits = self.budget.fact_limits
        held = [0] * len(limits)
        for node in self.nodes():
            size = node.idb.size()
            if size:
                for index in self._limits_of(node):
                    held[index] += size
        if in_flight:
            current = self.current
            for index in range(len(limits)) if current is None else self._limits_of(current):
                held[index] += in_flight
        for limit, facts in zip(limits, held, strict=True):
            if facts > limit.allowed:
                self._exceeded("derived_facts", limit.allowed, facts, limit.scope)

    def _limits_of(self, node) -> tuple[int, ...]:
        """The indices of the fact limits a hyper-node counts for (its rules never change:
        remembered by their keys)."""
        keys = node.logical.rule_keys
        found = self._counted.get(keys)
        if found is None:
            limits = self.budget.fact_limits
            found = tuple(i for i, limit in enumerate(limits) if limit.counts(node.rules))
            self._counted[keys] = found
        return found

    def tick(self) -> None:
        """A cheap check point for code that runs often (every compiled rule call, every
        round): a full check at most every ``TICK_SECONDS``."""
        if self.active:
            now = time.monotonic()
            if now - self.last_tick >= TICK_SECONDS:
                self.last_tick = now
                self.check()

    def pulse(self, out: set) -> None:
        """Called by compiled loops when ``len(out)`` passed ``cap``: check, then raise the
        cap by another step."""
        self.check(len(out))
        self.cap = len(out) + PULSE_STEP

    def _exceeded(self, limit: str, allowed: float, used: float, scope: str | None = None) -> None:
        self.stop()
        raise BudgetExceeded(limit, allowed, used, scope)


class InFlight:
    """Facts a module has computed but not stored yet (a subject's new objects, one subject
    at a time), counted against the update's budget as a compiled loop's output is
    (``pulse``): a tick per `add`, a full check each ``PULSE_STEP`` facts more. Callers add
    only while ``guard.active`` (outside a budget, counting would be wasted work)."""

    def __init__(self, guard: BudgetGuard) -> None:
        self.guard = guard
        self.count = 0
        self.check_at = PULSE_STEP

    def add(self, facts: int) -> None:
        self.count += facts
        self.guard.tick()
        if self.count > self.check_at:
            self.guard.check(self.count)
            self.check_at = self.count + PULSE_STEP


NO_GUARD = BudgetGuard()  # never active: what compiled rules get outside a budgeted update
