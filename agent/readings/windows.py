"""Windows over readings: which window facts a batch of readings adds, and which a tick expires.

A window (``@window <reading> 10 min as <relation> .``, a
:class:`~agent.engine.language.WindowDeclaration`) keeps every reading
``<reading>(sensor, value)`` the agent applies at time ``t`` as the fact
``<relation>(sensor, value, t)`` while ``t`` is within the window (docs/agent.md, "Windows"):

* ``t`` is the reading's time, the ``sent_at`` of the message that brought it (own sensors'
  and neighbours' alike), a float number of seconds since the epoch; the agent's clock
  (``now``) decides what has left: a fact leaves once ``now - seconds >= t``;
* a reading already outside the window when it arrives (``t <= now - seconds``) is not added
  (``late``, counted); a reading dated ahead of the clock (within ``[telemetry]
  max_clock_skew``: further ahead, it is dropped before it gets here) is kept with its own
  time and leaves at ``t + seconds``;
* every reading of a message counts, also one whose value did not change: a stuck sensor
  repeats its value, its latest-value fact stays the same, its window gets a new fact;
* a window holds at most ``max_facts`` facts: past it the oldest go first, in the same change
  as the arrivals (``evicted``, counted).

This module only plans: :meth:`WindowIndex.arrivals`, :meth:`WindowIndex.expiry` and
:meth:`WindowIndex.redeclared` return a :class:`WindowChange` and change nothing;
:meth:`WindowIndex.commit` makes the index follow a change once it is committed
(agent/state/agent_state.py applies the facts, claimed by source ``window``, in the same update
and transaction as the readings). No SQLite here, no clock: ``now`` is an argument.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right, insort
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from agent.engine.errors import RuleError
from agent.engine.language import RDF_TYPE, Value, WindowDeclaration

WINDOW_SOURCE = "window"  # the source claiming every window fact (agent/state/claims.py)
DEFAULT_MAX_FACTS = 50_000  # per window relation ([windows] max_facts)
DEFAULT_TICK = 1.0  # seconds between two expiry batches ([windows] tick)
LATE = "windows: late"  # the status's ``dropped`` count of readings already out of their window
OVER_BUDGET = "windows: over the budget"  # ... of window facts evicted by max_facts

WindowFact = tuple  # (relation, sensor, value, t)


class WindowError(RuleError):
    """Window declarations that cannot hold together: two declarations of one relation, or a
    window relation some rule derives or some source asserts facts of."""


@dataclass
class WindowChange:
    """Window facts to add and delete in one change, and what was counted planning it."""

    add: list[WindowFact] = field(default_factory=list)
    delete: list[WindowFact] = field(default_factory=list)
    late: int = 0  # readings already outside their window
    evicted: int = 0  # facts left out or deleted by the budget (the oldest first)

    def __bool__(self) -> bool:
        return bool(self.add or self.delete)

    def merged(self, other: WindowChange) -> WindowChange:
        """Both changes as one; a fact ``other`` deletes is not added."""
        gone = set(other.delete)
        return WindowChange(
            add=[fact for fact in self.add if fact not in gone] + other.add,
            delete=list(dict.fromkeys([*self.delete, *other.delete])),
            late=self.late + other.late,
            evicted=self.evicted + other.evicted,
        )


class _Window:
    """One window's facts, oldest first: ``order`` holds ``(t, tie, seq)`` sorted (``tie``:
    `tie_break`, so that facts of one time are in one order whatever order they arrived in,
    and after a restart too), ``facts`` maps seq to the fact and ``seqs`` the fact to its seq."""

    __slots__ = ("declaration", "order", "facts", "seqs")

    def __init__(self, declaration: WindowDeclaration) -> None:
        self.declaration = declaration
        self.order: list[tuple[float, str, int]] = []
        self.facts: dict[int, WindowFact] = {}
        self.seqs: dict[WindowFact, int] = {}

    def oldest(self, count: int) -> list[WindowFact]:
        return [self.facts[seq] for *_, seq in self.order[:count]]

    def until(self, cutoff: float) -> list[WindowFact]:
        """The facts with ``t <= cutoff``, oldest first."""
        end = bisect_right(self.order, (cutoff, "\U0010ffff"))
        return [self.facts[seq] for *_, seq in self.order[:end]]

    def add(self, fact: WindowFact, seq: int) -> None:
        if fact in self.seqs:
            return
        self.seqs[fact] = seq
        self.facts[seq] = fact
        insort(self.order, (fact[3], tie_break(fact), seq))

    def remove(self, facts: list[WindowFact]) -> None:
        gone: list[tuple[float, str, int]] = []
        for fact in facts:
            seq = self.seqs.pop(fact, None)
            if seq is not None:
                del self.facts[seq]
                gone.append((fact[3], tie_break(fact), seq))
        if len(gone) <= 4:  # (an eviction or two: found by time)
            for entry in gone:
                del self.order[bisect_left(self.order, entry)]
        elif gone:
            dropped = {seq for *_, seq in gone}
            self.order = [entry for entry in self.order if entry[2] not in dropped]


class WindowIndex:
    """The windows an agent holds and their facts by time (see the module docstring)."""

    def __init__(self, max_facts: int = DEFAULT_MAX_FACTS) -> None:
        if max_facts <= 0:
            raise ValueError(f"a window's budget must be positive, got {max_facts}")
        self.max_facts = max_facts
        self._windows: dict[str, _Window] = {}  # by relation
        self._by_reading: dict[str, list[_Window]] = {}
        self._seq = 0

    # ------------------------------------------------------------------ reading
    @property
    def declarations(self) -> dict[str, WindowDeclaration]:
        """Relation -> its declaration."""
        return {relation: w.declaration for relation, w in self._windows.items()}

    def sizes(self) -> dict[str, int]:
        """Relation -> the facts its window holds."""
        return {relation: len(w.seqs) for relation, w in self._windows.items()}

    def facts(self, relation: str | None = None) -> list[WindowFact]:
        """The facts held (of one relation), oldest first."""
        windows = self._windows.values() if relation is None else [self._windows[relation]]
        return [w.facts[seq] for w in windows for *_, seq in w.order]

    def holds(self, fact: WindowFact) -> bool:
        window = self._windows.get(fact[0])
        return window is not None and fact in window.seqs

    # ------------------------------------------------------------------ planning
    def arrivals(self, readings: Iterable[tuple], at: float, now: float) -> WindowChange:
        """The window facts of readings ``(predicate, sensor, value)`` applied at time ``at``
        (the message's ``sent_at``) when the agent's clock says ``now``: one per reading and
        window on its predicate, unless late; past a window's budget its oldest go."""
        change = WindowChange()
        t = float(at)
        new: dict[str, dict[WindowFact, None]] = {}
        for reading in readings:
            if len(reading) != 3 or reading[0] == RDF_TYPE:
                continue  # (a class fact is no reading of a value)
            for window in self._by_reading.get(reading[0], ()):
                declaration = window.declaration
                if t <= now - declaration.seconds:
                    change.late += 1
                    continue
                fact = (declaration.relation, reading[1], reading[2], t)
                if fact not in window.seqs:
                    new.setdefault(declaration.relation, {})[fact] = None
        for relation, facts in new.items():
            window = self._windows[relation]
            over = len(window.seqs) + len(facts) - self.max_facts
            if over <= 0:
                change.add += facts
                continue
            change.evicted += over
            # The oldest of what is held and what arrives go first (an arrival older than
            # everything held, a reading of a clock stepped back, goes before them); facts of
            # one time in `tie_break` order.
            candidates = [*window.oldest(over), *facts]
            candidates.sort(key=lambda f: (f[3], tie_break(f)))
            evicted = set(candidates[:over])
            change.delete += [f for f in window.oldest(over) if f in evicted]
            change.add += [f for f in facts if f not in evicted]
        return change

    def expiry(self, now: float) -> WindowChange:
        """The facts that have left their window when the clock says ``now``."""
        change = WindowChange()
        for window in self._windows.values():
            change.delete += window.until(now - window.declaration.seconds)
        return change

    def redeclared(self, declarations: Iterable[WindowDeclaration]) -> WindowChange:
        """What holding exactly ``declarations`` from now on deletes: the facts of every window
        that is no longer declared, or declared differently (a window declared anew starts
        empty). Raises WindowError for two declarations of one relation."""
        wanted = checked_declarations(declarations)
        change = WindowChange()
        for relation, window in self._windows.items():
            if wanted.get(relation) != window.declaration:
                change.delete += [window.facts[seq] for *_, seq in window.order]
        return change

    # ------------------------------------------------------------------ committing
    def commit(
        self, change: WindowChange, declarations: Iterable[WindowDeclaration] | None = None
    ) -> None:
        """Make the index hold ``declarations`` (None: as now), then follow ``change``
        (committed to the state)."""
        if declarations is not None:
            wanted = checked_declarations(declarations)
            windows = {
                relation: window
                for relation, window in self._windows.items()
                if wanted.get(relation) == window.declaration
            }
            for relation, declaration in wanted.items():
                windows.setdefault(relation, _Window(declaration))
            self._windows = windows
            self._by_reading = {}
            for window in windows.values():
                self._by_reading.setdefault(window.declaration.reading, []).append(window)
        gone: dict[str, list[WindowFact]] = {}
        for fact in change.delete:
            gone.setdefault(fact[0], []).append(fact)
        for relation, facts in gone.items():
            if relation in self._windows:
                self._windows[relation].remove(facts)
        for fact in change.add:
            window = self._windows.get(fact[0])
            if window is not None:
                self._seq += 1
                window.add(fact, self._seq)


def tie_break(fact: WindowFact) -> str:
    """The order of window facts of one time: by sensor and value, as text (any two values
    compare so, whatever their types)."""
    return repr((fact[1], fact[2]))


def checked_declarations(
    declarations: Iterable[WindowDeclaration],
) -> dict[str, WindowDeclaration]:
    """Relation -> declaration; WindowError for one relation declared twice, differently."""
    found: dict[str, WindowDeclaration] = {}
    for declaration in declarations:
        known = found.setdefault(declaration.relation, declaration)
        if known != declaration:
            raise WindowError(
                f"the window relation <{declaration.relation}> is declared twice, differently: "
                f"{known} and {declaration}"
            )
    return found


def window_facts_of(
    facts: Iterable[tuple[Value, ...]], declarations: Mapping[str, WindowDeclaration]
) -> list[WindowFact]:
    """The facts of ``facts`` that belong to a declared window (relation and arity 4)."""
    return [fact for fact in facts if len(fact) == 4 and fact[0] in declarations]
