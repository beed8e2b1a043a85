"""Differential test of windows over readings: an agent (in-process, real SQLite, injected clock)
against the reference evaluator (tests/support/reference.py) run from scratch, after every
step, over the facts a window should hold then.

Each example draws a random program (tests/support/strategies.py) whose rules read the EDB
relation ``e4`` (three columns), renamed atom by atom to one of two window relations over the
readings ``e2(sensor, value)``: ``w10`` (10 s) and ``w30`` (30 s). Then random steps:

* a message of readings (one or two sensors, one ``sent_at``: lagging the clock by up to 40 s,
  or up to 2 s ahead of it, always newer than the sensor's last: so it is applied, and may
  be late for one window and not the other);
* the clock moving on, with or without a tick (a fact stays until a tick expires it), or to
  the very edge of a window's oldest fact (``now - seconds == t``: it leaves);
* the windows declared again by a bundle (a subset of both, or None: kept), so windows are
  removed (their facts go) and declared anew (empty);
* the agent closed and opened again on its state file (the window index rebuilt from it).

The model (never read back from the agent) keeps the readings each window took and applies
the rules of docs/agent.md, "Windows": late on arrival (``t <= now - seconds``) not taken,
expired at a tick (``now - seconds >= t``), a window removed loses its facts. After every step
the agent's facts equal the reference's over the static facts, the latest value per sensor
and the model's window facts. A window's budget (``[windows] max_facts``) is drawn too: past
it the oldest go first (of one time, by sensor and value as text), counted.
"""

from __future__ import annotations

import time
from pathlib import Path

from hypothesis import HealthCheck, event, given, note, settings
from hypothesis import strategies as st

from agent.engine.language import Aggregate, Atom, Negation, Program, Rule, WindowDeclaration
from agent.service import Agent
from tests.agent.test_service import make_agent
from tests.support.agent_harness import Cloud, readings_payload
from tests.support.reference import evaluate
from tests.support.strategies import IRIS, NUMBERS, fact_sets, programs

WINDOWS = {
    "w10": WindowDeclaration("e2", 10.0, "w10"),
    "w30": WindowDeclaration("e2", 30.0, "w30"),
}
SENSORS = IRIS[:3]
VALUES = [*NUMBERS, *IRIS[:2]]


def rename(items: tuple, names: list[str]) -> tuple:
    """Body items with each ``e4`` atom renamed to the next of ``names`` (cycled)."""
    found = []
    for item in items:
        if isinstance(item, Atom) and item.predicate == "e4":
            names.append(names.pop(0))
            item = Atom(names[-1], item.terms)
        elif isinstance(item, Negation) and item.atom.predicate == "e4":
            names.append(names.pop(0))
            item = Negation(Atom(names[-1], item.atom.terms))
        elif isinstance(item, Aggregate):
            item = Aggregate(
                rename(item.body, names), item.group_by, item.function, item.argument, item.result
            )
        found.append(item)
    return tuple(found)


@st.composite
def windowed_programs(draw: st.DrawFn) -> Program:
    program = draw(programs())
    order = draw(st.lists(st.sampled_from(sorted(WINDOWS)), min_size=1, max_size=4))
    rules = [
        Rule(rule.head, rename(rule.body, order), rule.label, rule.more_heads)
        for rule in program.rules
    ]
    return Program(tuple(dict.fromkeys(rules)))


READ = st.tuples(
    st.just("read"),
    st.lists(st.sampled_from(SENSORS), min_size=1, max_size=2, unique=True),
    st.lists(st.sampled_from(VALUES), min_size=2, max_size=2),
    st.integers(-2, 40),  # how far sent_at lags the clock (negative: ahead of it)
)
STEP = st.one_of(
    READ,
    READ,
    READ,
    st.tuples(st.just("tick"), st.integers(0, 25)),
    st.tuples(st.just("wait"), st.integers(1, 25)),  # the clock moves, no tick
    # The clock moved to where a window's oldest fact is exactly at its edge, and a tick.
    st.tuples(st.just("edge"), st.sampled_from(sorted(WINDOWS))),
    st.tuples(
        st.just("declare"),
        st.none() | st.lists(st.sampled_from(sorted(WINDOWS)), unique=True),
    ),
    st.tuples(st.just("reopen")),
)


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class Model:
    """What the agent should hold (see the module docstring)."""

    def __init__(self, now: float, budget: int) -> None:
        self.now = now
        self.budget = budget
        self.evicted = 0
        self.declared: set[str] = set()
        self.window: dict[str, set[tuple]] = {}
        self.latest: dict[str, object] = {}
        self.last_at: dict[str, float] = {}
        self.late = 0

    def declare(self, names: list[str] | None) -> None:
        if names is None:
            return
        for gone in self.declared - set(names):
            del self.window[gone]
        for new in set(names) - self.declared:
            self.window[new] = set()
        self.declared = set(names)

    def read(self, readings: list[tuple[str, object]], at: float) -> None:
        new: dict[str, list[tuple]] = {name: [] for name in self.declared}
        for sensor, value in readings:
            self.latest[sensor] = value
            self.last_at[sensor] = at
            for name in self.declared:
                fact = (name, sensor, value, at)
                if at <= self.now - WINDOWS[name].seconds:
                    self.late += 1
                elif fact not in self.window[name] and fact not in new[name]:
                    new[name].append(fact)
        for name, facts in new.items():
            held = self.window[name] | set(facts)
            over = len(held) - self.budget
            if over > 0:  # the oldest go first; of one time, by sensor and value as text
                self.evicted += over
                oldest = sorted(held, key=lambda f: (f[3], repr((f[1], f[2]))))
                held -= set(oldest[:over])
            self.window[name] = held

    def tick(self) -> None:
        for name, facts in self.window.items():
            cutoff = self.now - WINDOWS[name].seconds
            self.window[name] = {fact for fact in facts if fact[3] > cutoff}

    def facts(self) -> set[tuple]:
        found = {("e2", sensor, value) for sensor, value in self.latest.items()}
        for facts in self.window.values():
            found |= facts
        return found


def check(agent: Agent, program: Program, static: list[tuple], model: Model) -> None:
    wanted = evaluate(program, [*static, *model.facts()]).external()
    actual = {tuple(fact) for fact in agent.reasoner.facts()}
    assert actual == wanted, (
        f"agent is missing {sorted(map(repr, wanted - actual))}, "
        f"has extra {sorted(map(repr, actual - wanted))}"
    )
    held = {name: len(facts) for name, facts in model.window.items()}
    assert agent.state.windows.sizes() == held
    if any(held.values()):
        event("window facts held")
        derived = {f for f in actual if f[0] in ("q0", "q1", "q2", "a0")}
        if derived:
            event("window facts held, something derived")


@settings(
    max_examples=max(1, settings.default.max_examples // 3),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(  # (the steps drawn first: drawn after the program, hypothesis keeps lists short)
    steps=st.lists(STEP, min_size=6, max_size=25),
    program=windowed_programs(),
    static=fact_sets(("e1", "e3")),
    first=st.lists(st.sampled_from(sorted(WINDOWS)), min_size=1, unique=True),
    budget=st.sampled_from([2, 5, 50_000]),  # [windows] max_facts
)
def test_windows_against_the_reference(tmp_path_factory, program, static, first, steps, budget):
    note(f"program:\n{program}")
    directory: Path = tmp_path_factory.mktemp("windows")
    cloud = Cloud(directory / "cloud")
    start = float(int(time.time()))  # (bundles are valid for an hour from now)
    clock, model = Clock(start), Model(start, budget)

    def opened() -> Agent:
        agent = make_agent(directory, cloud, tables=f"[windows]\nmax_facts = {budget}\n")
        agent.clock = clock
        return agent

    agent = opened()
    agent.state.apply(add_rules=program.rules, source="rules")
    agent.state.apply(add_facts=static, source="static")
    version = 0

    def declare(names: list[str] | None) -> None:
        nonlocal version
        version += 1
        texts = None if names is None else [str(WINDOWS[name]) for name in names]
        bundle = cloud.bundle("base", version, windows=texts, facts=[("c5", "e1", "c5")])
        outcome = agent.handle_bundle(cloud.sign(bundle))
        assert outcome.status == "applied", outcome.message
        model.declare(names)

    declare(first)
    late = evicted = 0
    static = [*static, ("c5", "e1", "c5")]  # (what every declaring bundle brings)
    check(agent, program, static, model)
    for step in steps:
        note(f"step {step}")
        kind = step[0]
        if kind == "read":
            _, sensors, values, lag = step
            at = max([clock.now - lag, *(model.last_at.get(s, 0.0) + 1 for s in sensors)])
            readings = [
                ("e2", sensor, value)
                for sensor, value in zip(sensors, values[: len(sensors)], strict=True)
            ]
            payload = readings_payload("t1", "farm1", readings, sent_at=at)
            outcome = agent.record_readings(payload)
            # (unchanged: the same value again, and no window to take it)
            assert outcome.status in ("applied", "unchanged"), outcome.message
            model.read([(s, v) for _, s, v in readings], at)
        elif kind == "edge":
            held = model.window.get(step[1])
            if held:
                edge = min(fact[3] for fact in held) + WINDOWS[step[1]].seconds
                clock.now = model.now = max(clock.now, edge)
            agent.tick_windows()
            model.tick()
        elif kind in ("tick", "wait"):
            clock.now += step[1]
            model.now = clock.now
            if kind == "tick":
                expired = agent.tick_windows()
                model.tick()
                if expired is not None:
                    event("facts expired at a tick")
        elif kind == "declare":
            declare(step[1])
        else:
            late += agent.dropped["windows: late"]  # (counted since the agent started)
            evicted += agent.dropped["windows: over the budget"]
            if any(model.window.values()):
                event("reopened with window facts")
            agent.close()
            agent = opened()
        check(agent, program, static, model)
    assert late + agent.dropped["windows: late"] == model.late
    assert evicted + agent.dropped["windows: over the budget"] == model.evicted
    if model.evicted:
        event("facts evicted by the budget")
    if model.late:
        event("late readings")
    agent.close()
