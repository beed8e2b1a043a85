"""Bundles bound to their audience and streams isolated from each other (agent/service.py,
agent/state/claims.py), with real keys and real SQLite files.

A signature says who made a bundle; the signed audience (farm, device or the whole farm) says
whom it is for. A stream may delete only what it added itself, unless the signed body says it
supersedes the stream that added it. Every refusal leaves the state exactly as it was: the
same facts, the same rules, the same applied versions (so the next version still applies).
"""

from __future__ import annotations

import time

import pytest

from agent.engine.errors import RuleError
from agent.protocol.messages import BundleError, DeleteFacts, encode_fact
from agent.protocol.signing import open_bundle
from agent.state.agent_state import AgentState
from tests.agent.test_service import make_agent
from tests.support.agent_harness import Cloud

RULES = {"hot": "hot: <Hot>(X) :- <temp>(X, T) and COMP(T, >, 30) ."}


@pytest.fixture
def cloud(tmp_path):
    return Cloud(tmp_path / "cloud")


def snapshot(agent) -> tuple:
    return (
        set(agent.reasoner.facts()),
        dict(agent.reasoner.rules),
        agent.state.applied_versions(),
    )


def agent_for(tmp_path, cloud, device: str, farm: str = "farm1"):
    directory = tmp_path / f"{farm}-{device}"
    directory.mkdir()
    text = f"""
device = "{device}"
farm = "{farm}"
database = "state.db"
[keys]
trusted_keys = "{cloud.keys}"
"""
    (directory / "agent.toml").write_text(text)
    from agent.config import AgentConfig
    from agent.service import Agent

    return Agent(AgentConfig.load(directory / "agent.toml"))


# ------------------------------------------------------------------ audience
def test_a_bundle_for_one_device_is_refused_by_every_other(tmp_path, cloud):
    t1, t2 = agent_for(tmp_path, cloud, "t1"), agent_for(tmp_path, cloud, "t2")
    c1 = agent_for(tmp_path, cloud, "t1", farm="farm2")  # same device id, another farm
    for_t1 = [
        cloud.sign(
            cloud.bundle("base", v, rules=RULES if v == 1 else None, facts=[("temp", "t1", 30 + v)])
        )
        for v in (1, 2)
    ]
    assert t1.handle_bundle(for_t1[0]).status == "applied"
    for other in (t2, c1):
        before = snapshot(other)
        for payload in for_t1:
            outcome = other.handle_bundle(payload)
            assert (outcome.status, outcome.reason) == ("refused", "wrong_audience")
            assert "addressed to device 't1' of farm 'farm1'" in outcome.message
        assert snapshot(other) == before
    # t2's own versions 1 and 2 still apply: nothing of t1's was recorded as applied.
    for version in (1, 2):
        own = cloud.bundle("base", version, device="t2", facts=[("temp", "t2", version)])
        assert t2.handle_bundle(cloud.sign(own)).status == "applied"
    assert t2.state.applied_versions() == {"base": 2}
    for agent in (t1, t2, c1):
        agent.close()


def test_farm_wide_and_device_streams_are_separate_sequences(tmp_path, cloud):
    agent = agent_for(tmp_path, cloud, "t1")
    farm_v1 = cloud.bundle("base", 1, device="all", facts=[("limit", "farm1", 80)])
    farm_v2 = cloud.bundle("base", 2, device="all", facts=[("limit", "farm1", 85)])
    own_v1 = cloud.bundle("base", 1, rules=RULES)
    own_v2 = cloud.bundle("base", 2, facts=[("temp", "t1", 35)])
    for bundle in (farm_v1, own_v1, own_v2, farm_v2):
        assert agent.handle_bundle(cloud.sign(bundle)).status == "applied", bundle.bundle_id
    assert agent.state.applied_versions() == {"base": 2, "all:base": 2}
    assert agent.status().applied == {"base": 2, "all:base": 2}
    assert {f[2] for f in agent.reasoner.facts("limit")} == {80, 85}
    # A farm-wide bundle for another farm is refused like any other.
    other = cloud.bundle("base", 3, device="all", farm="farm2")
    assert agent.handle_bundle(cloud.sign(other)).reason == "wrong_audience"
    agent.close()


def test_bundles_expire_and_must_say_when(tmp_path, cloud, monkeypatch):
    keyring = agent_for(tmp_path, cloud, "t1").keyring
    expired = cloud.sign(cloud.bundle("base", 1, expires_at=time.time() - 1))
    with pytest.raises(BundleError) as info:
        open_bundle(expired, keyring)
    assert info.value.reason == "expired"
    body = cloud.bundle("base", 1).model_dump()
    del body["expires_at"]
    with pytest.raises(Exception, match="expires_at"):
        type(cloud.bundle("base", 1)).model_validate(body)


@pytest.mark.parametrize("stream", ["local", "sensor", "telemetry/t2"])
def test_a_bundle_may_not_use_the_name_of_a_device_source(cloud, stream):
    with pytest.raises(Exception, match="reserved"):
        cloud.bundle(stream, 1)


# ------------------------------------------------------------------ stream isolation
def test_a_stream_may_not_delete_what_another_stream_added(tmp_path, cloud):
    agent = agent_for(tmp_path, cloud, "t1")
    base = cloud.bundle("base", 1, rules=RULES, facts=[("temp", "t1", 35), ("site", "t1", "x")])
    assert agent.handle_bundle(cloud.sign(base)).status == "applied"
    before = snapshot(agent)
    attacks = [
        cloud.bundle("intruder", 1, delete_rules=["hot"]),
        cloud.bundle("intruder", 1, delete_facts=[("temp", "t1", 35)]),
        cloud.bundle("intruder", 1, device="all", delete_rules=["hot"]),  # farm-wide "intruder"
        cloud.bundle("intruder", 1, full_state=True, delete_facts=[("site", "t1", "x")]),
    ]
    for bundle in attacks:
        outcome = agent.handle_bundle(cloud.sign(bundle))
        assert (outcome.status, outcome.reason) == ("refused", "not_owner"), bundle
        assert "added by 'base'" in outcome.message
        assert snapshot(agent) == before
    # Its own versions still apply afterwards: a refusal records no version.
    assert agent.handle_bundle(cloud.sign(cloud.bundle("intruder", 1))).status == "applied"
    agent.close()


def test_a_stream_that_supersedes_another_may_delete_its_items(tmp_path, cloud):
    agent = agent_for(tmp_path, cloud, "t1")
    agent.handle_bundle(
        cloud.sign(cloud.bundle("base", 1, rules=RULES, facts=[("temp", "t1", 35)]))
    )
    takeover = cloud.bundle(
        "base-v2",
        1,
        supersedes=["base"],
        delete_rules=["hot"],
        delete_facts=[("temp", "t1", 35)],
        rules={"warm": "warm: <Warm>(X) :- <temp>(X, T) and COMP(T, >, 20) ."},
    )
    assert agent.handle_bundle(cloud.sign(takeover)).status == "applied"
    assert set(agent.reasoner.rules) == {"warm"}
    assert not set(agent.reasoner.facts("temp"))
    assert agent.state.rules_of_stream("base") == []
    agent.close()


def test_what_two_streams_assert_stays_until_both_delete_it(tmp_path, cloud):
    agent = agent_for(tmp_path, cloud, "t1")
    fact = ("temp", "t1", 35)
    agent.handle_bundle(cloud.sign(cloud.bundle("base", 1, rules=RULES, facts=[fact])))
    agent.handle_bundle(cloud.sign(cloud.bundle("extra", 1, rules=RULES, facts=[fact])))
    assert agent.state.rule_streams() == {"hot": ["base", "extra"]}
    agent.handle_bundle(
        cloud.sign(cloud.bundle("extra", 2, delete_rules=["hot"], delete_facts=[fact]))
    )
    assert agent.reasoner.query("<Hot>(X)") == [{"X": "t1"}]  # base still asserts both
    assert agent.state.facts_of_source("base") == [fact]
    agent.handle_bundle(
        cloud.sign(cloud.bundle("base", 2, delete_rules=["hot"], delete_facts=[fact]))
    )
    assert agent.reasoner.rules == {} and set(agent.reasoner.facts()) == set()
    agent.close()


def test_a_stream_cannot_replace_a_label_another_stream_holds(tmp_path, cloud):
    agent = agent_for(tmp_path, cloud, "t1")
    agent.handle_bundle(cloud.sign(cloud.bundle("base", 1, rules=RULES)))
    before = snapshot(agent)
    other = {"hot": "hot: <Hot>(X) :- <temp>(X, T) and COMP(T, >, 99) ."}
    outcome = agent.handle_bundle(cloud.sign(cloud.bundle("extra", 1, rules=other)))
    assert (outcome.status, outcome.reason) == ("refused", "engine")
    assert "already used by a different rule" in outcome.message
    assert snapshot(agent) == before
    agent.close()


def test_claims_survive_a_restart(tmp_path, cloud):
    path = tmp_path / "claims.db"
    fact = ("temp", "t1", 35)
    with AgentState(path) as state:
        state.apply(add_facts=[fact], add_rules="r: <Hot>(X) :- <temp>(X, T) .", source="a")
        state.apply(add_facts=[fact], add_rules="r: <Hot>(X) :- <temp>(X, T) .", source="b")
    with AgentState(path) as state:
        assert state.rule_streams() == {"r": ["a", "b"]}
        state.apply(delete_facts=[fact], delete_rules=["r"], source="a")
        assert state.reasoner.query("<Hot>(X)") == [{"X": "t1"}]
        with pytest.raises(RuleError):
            state.apply(add_rules="r: <Hot>(X) :- <site>(X, T) .", source="a")
    with AgentState(path) as state:
        assert state.facts_of_source("b") == [fact] and state.facts_of_source("a") == []
        assert state.reasoner.query("<Hot>(X)") == [{"X": "t1"}]


def test_deleting_what_nobody_holds_is_a_no_op(tmp_path, cloud):
    agent = agent_for(tmp_path, cloud, "t1")
    bundle = cloud.bundle("base", 1).model_copy(
        update={"operations": [DeleteFacts(facts=[encode_fact(("temp", "nowhere", 1))])]}
    )
    outcome = agent.handle_bundle(cloud.sign(bundle))
    assert outcome.status == "applied" and outcome.report["facts_deleted"] == 0
    agent.close()


def test_make_agent_fixture_still_talks_to_t1(tmp_path, cloud):
    """The shared fixture's agent (device t1 of farm1) takes the harness's default bundles."""
    agent = make_agent(tmp_path, cloud)
    assert agent.handle_bundle(cloud.sign(cloud.bundle("base", 1, rules=RULES))).status == "applied"
    agent.close()
