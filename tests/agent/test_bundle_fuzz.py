"""Fuzzing the agent with bundles: whatever arrives, the agent answers, and never breaks its state.

Each example runs a fresh agent (real keys, a real SQLite file, a small budget) through a
sequence of bundles drawn from a grammar of what the cloud sends and what a hostile network or
a buggy cloud could send instead: every audience (this device, another device, the whole farm,
another farm), streams (including reserved names), versions around the applied one, past and
future expiries, full-state and superseding bundles, rules from a pool of good, bad, unsafe,
exploding and replacing rules, facts of every term kind, deletions of what other streams added,
and payloads that are tampered with, truncated, signed by a stranger or not signed at all.

After every bundle: the outcome is applied, duplicate or refused (never an exception); a refused
or duplicate bundle changed nothing (facts, rules, claims, versions); an applied one recorded its
version, and the materialisation equals a from-scratch evaluation of the state's rules and
explicit facts. At the end the state file is reopened and equals memory.

Counts per category are kept in ``COUNTS``; with ``ZODIAC_FUZZ_REPORT=path`` they are written
there as JSON (for long runs outside CI: ``HYPOTHESIS_PROFILE=long``).
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter

import msgpack
import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

from agent.config import AgentConfig
from agent.engine import Reasoner
from agent.engine.language import Literal
from agent.protocol.messages import (
    AddFacts,
    AddRules,
    Bundle,
    DeleteFacts,
    DeleteRules,
    RuleSpec,
    encode_fact,
    encode_model,
)
from agent.service import Agent
from agent.state.agent_state import AgentState
from tests.support.agent_harness import Cloud

COUNTS: Counter[str] = Counter()

RULES = {
    "hot": [
        "hot: <Hot>(X) :- <temp>(X, T) and COMP(T, >, 30) .",
        "hot: <Hot>(X) :- <temp>(X, T) and T < 5 .",  # a replacement body
    ],
    "warm": ["warm: <Warm>(X) :- <temp>(X, T) and COMP(T, >, 20) and not <Hot>(X) ."],
    "near": [
        "near: <near>(X, Y) :- <link>(X, Y) .",
        "near: <near>(X, Z) :- <near>(X, Y) and <link>(Y, Z) .",
    ],
    "count": ["count: <n>(X, N) :- aggregate( <link>(X, Y) ) on X with count(Y) as N ."],
    "boom": ["boom: <pair>(X, A, Y, B) :- <temp>(X, A) and <temp>(Y, B) ."],
    # Sums of 230 and 257 terms: deeper than Python's 200 nested parentheses once compiled;
    # 256 operators are the most an expression may have (257 terms: refused, a bad rule).
    "long": [
        f"long: <s>(X, Y) :- <temp>(X, T) and bind({' + '.join(['T'] * n)} as Y) ."
        for n in (230, 257, 258)
    ],
    "bad": [
        "bad: <p>(X) :- <q>(X) and and .",  # syntax
        "bad: <p>(X, Y) :- <q>(X) .",  # unsafe
        "bad: <q>(X) :- <link>(X, Y) and not <q>(Y) .",  # unstratifiable
        "other: <p>(X) :- <q>(X) .",  # label differs from the id
    ],
}
SUBJECTS = ["t1", "t2", "t3"]
VALUES = [
    0,
    21,
    35,
    -4,
    2.5,
    2**62,
    True,
    "t2",
    Literal("x"),
    Literal("5", language="en"),
]


@st.composite
def facts(draw: st.DrawFn) -> tuple:
    kind = draw(st.sampled_from(["temp", "link", "rdf", "other"]))
    subject = draw(st.sampled_from(SUBJECTS))
    if kind == "temp":
        return ("temp", subject, draw(st.sampled_from(VALUES)))
    if kind == "link":
        return ("link", subject, draw(st.sampled_from(SUBJECTS)))
    if kind == "rdf":
        return ("http://www.w3.org/1999/02/22-rdf-syntax-ns#type", subject, "WindTurbine")
    return ("zz", subject, draw(st.sampled_from(VALUES)), draw(st.sampled_from(VALUES)))


@st.composite
def operations(draw: st.DrawFn) -> list:
    ops: list = []
    for _ in range(draw(st.integers(0, 3))):
        kind = draw(st.sampled_from(["add_rules", "delete_rules", "add_facts", "delete_facts"]))
        if kind == "add_rules":
            names = draw(
                st.lists(st.sampled_from(sorted(RULES)), min_size=1, max_size=3, unique=True)
            )
            specs = []
            for name in names:
                text = draw(st.sampled_from(RULES[name]))
                specs.append(RuleSpec(id="bad" if name == "bad" else name, text=text))
            ops.append(AddRules(rules=specs))
        elif kind == "delete_rules":
            ids = draw(st.lists(st.sampled_from([*RULES, "nosuch"]), min_size=1, max_size=3))
            ops.append(DeleteRules(ids=ids))
        else:
            chosen = draw(st.lists(facts(), min_size=1, max_size=10))
            operation = AddFacts if kind == "add_facts" else DeleteFacts
            ops.append(operation(facts=[encode_fact(f) for f in chosen]))
    return ops


@st.composite
def bundles(draw: st.DrawFn, applied: dict) -> tuple[str, Bundle]:
    """A bundle; versions are drawn around the one applied for its (audience, stream)."""
    farm = draw(st.sampled_from(["farm1", "farm1", "farm1", "farm2"]))
    device = draw(st.sampled_from(["t1", "t1", "t1", "all", "t2"]))
    stream = draw(st.sampled_from(["base", "base", "extra", "anomaly/ambient"]))
    source = f"all:{stream}" if device == "all" else stream
    current = applied.get(source, 0)
    version = max(1, current + draw(st.sampled_from([1, 1, 1, 1, 0, -1, 2, 5])))
    now = time.time()
    expires = now + draw(st.sampled_from([3600] * 7 + [-10]))
    supersedes = draw(st.lists(st.sampled_from(["base", "extra"]), max_size=1))
    bundle = Bundle(
        bundle_id=f"fz-{draw(st.integers(0, 10**9))}",
        farm=farm,
        device=device,
        stream=stream,
        version=version,
        issued_at=min(now, expires - 3600),
        expires_at=expires,
        full_state=draw(st.integers(0, 7)) == 0,
        supersedes=[s for s in supersedes if s != stream],
        operations=draw(operations()),
    )
    return draw(
        st.sampled_from(
            ["signed"] * 12
            + ["flip", "truncate", "stranger", "unsigned", "garbage", "envelope", "forged"]
        )
    ), bundle


def nested(depth: int) -> list:
    value: list = []
    for _ in range(depth):
        value = [value]
    return value


# Terms no model lets the cloud build, signed anyway (a buggy cloud): NaN and infinities as
# literals and as msgpack floats.
NOT_VALUES = [
    {"lit": "NaN", "dt": "http://www.w3.org/2001/XMLSchema#double", "lang": None},
    {"lit": "-INF", "dt": "http://www.w3.org/2001/XMLSchema#double", "lang": None},
    float("nan"),
    float("inf"),
]


def payload_of(how: str, bundle: Bundle, cloud: Cloud, stranger: Cloud, data) -> bytes:
    signed = cloud.sign(bundle)
    if how == "signed":
        return signed
    if how == "flip":
        index = data.draw(st.integers(0, len(signed) - 1))
        return (
            signed[:index]
            + bytes([signed[index] ^ (1 << data.draw(st.integers(0, 7)))])
            + signed[index + 1 :]
        )
    if how == "truncate":
        return signed[: data.draw(st.integers(0, len(signed) - 1))]
    if how == "stranger":
        return stranger.sign(bundle)
    if how == "unsigned":
        return encode_model(bundle)
    if how == "garbage":
        return data.draw(st.binary(max_size=200))
    if how == "forged":  # a genuine signature over a body with a fact that is no value
        body = bundle.model_dump(mode="python")
        fact = ["temp", "t1", data.draw(st.sampled_from(NOT_VALUES))]
        op = data.draw(st.sampled_from(["add_facts", "delete_facts"]))
        body["operations"] = [*body["operations"], {"op": op, "facts": [fact]}]
        return cloud.sign_body(body)
    envelope = msgpack.unpackb(signed)
    envelope[data.draw(st.sampled_from(["v", "kid", "body", "sig"]))] = data.draw(
        st.sampled_from([None, 2, "x" * 300, b"", [1, [2, [3]]], nested(1000)])
    )
    return msgpack.packb(envelope, use_bin_type=True)


def snapshot(agent: Agent) -> tuple:
    state = agent.state
    return (
        frozenset(agent.reasoner.facts()),
        tuple(sorted((n, str(r)) for n, r in agent.reasoner.rules.items())),
        tuple(sorted((n, tuple(s)) for n, s in state.rule_streams().items())),
        tuple(sorted(state.applied_versions().items())),
        tuple(sorted(map(repr, state.conn.execute("SELECT * FROM explicit").fetchall()))),
    )


def from_scratch(agent: Agent) -> set:
    fresh = Reasoner()
    fresh.update(
        add_rules=list(agent.reasoner.rules.values()), add_facts=list(agent.reasoner.edb_facts())
    )
    return set(fresh.facts())


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    root = tmp_path_factory.mktemp("fuzz-keys")
    return Cloud(root / "cloud"), Cloud(root / "stranger", key_id="stranger")


FUZZ_SETTINGS = settings(
    max_examples=max(1, settings.default.max_examples * 2),  # 200 in CI: ~2,000 bundles
    deadline=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.function_scoped_fixture,
    ],
)


@FUZZ_SETTINGS
@given(data=st.data(), steps=st.integers(5, 14))
def test_no_bundle_breaks_the_agent(tmp_path_factory, keys, data, steps):
    cloud, stranger = keys
    directory = tmp_path_factory.mktemp("fuzz")
    (directory / "agent.toml").write_text(
        f'device = "t1"\nfarm = "farm1"\ndatabase = "t1.db"\n'
        f'[keys]\ntrusted_keys = "{cloud.keys}"\nmax_bundle_bytes = 20000\nmax_operations = 40\n'
        "[budget]\nmax_derived_facts = 12\n"
    )
    config = AgentConfig.load(directory / "agent.toml")
    agent = Agent(config, keyring=None)
    COUNTS["runs"] += 1
    try:
        for step in range(steps):
            how, bundle = data.draw(bundles(agent.state.applied_versions()))
            payload = payload_of(how, bundle, cloud, stranger, data)
            before = snapshot(agent)
            note(f"step {step}: {how} {bundle!r}")
            try:
                outcome = agent.handle_bundle(payload)
            except Exception:
                COUNTS["exceptions"] += 1
                raise
            COUNTS["bundles"] += 1
            COUNTS[f"{outcome.status}"] += 1
            if outcome.status == "refused":
                COUNTS[f"refused: {outcome.reason}"] += 1
            assert outcome.status in ("applied", "duplicate", "refused"), outcome
            after = snapshot(agent)
            if outcome.status != "applied":
                assert after == before, f"{outcome.status} {outcome.reason} changed the state"
                continue
            if after != before:
                COUNTS["state changed"] += 1
            assert agent.state.applied_versions()[bundle.source] == bundle.version
            assert set(agent.reasoner.facts()) == from_scratch(agent)
        memory = snapshot(agent)
    finally:
        agent.close()
    with AgentState(directory / "t1.db") as state:
        assert state.load_report.how == "loaded"
        assert frozenset(state.reasoner.facts()) == memory[0]


def teardown_module() -> None:
    path = os.environ.get("ZODIAC_FUZZ_REPORT")
    if path:
        with open(path, "w") as report:
            json.dump(dict(sorted(COUNTS.items())), report, indent=2)
