"""The agent's behaviour without MQTT (``agent/service.py``): real keys, real SQLite files.

What a bundle's operations mean when folded into one change, what a ``full_state`` bundle
replaces, how readings and neighbours' telemetry replace earlier values, rule requests and
their release, and the ``zodiac-agent`` command line's help texts.
"""

from __future__ import annotations

import json

import pytest

from agent import service
from agent.cli import build_parser
from agent.config import AgentConfig
from agent.engine import RDF_TYPE
from agent.protocol.messages import AddRules, DeleteRules, RuleRequest, RuleSpec, encode_model
from agent.service import Agent
from tests.engine.test_cli import check_help_texts
from tests.support.agent_harness import Cloud, readings_payload

RULES = {
    "hot": "hot: <Hot>(X) :- <temp>(X, T) and COMP(T, >, 30) .",
    "warm": "warm: <Warm>(X) :- <temp>(X, T) and COMP(T, >, 20) .",
}


@pytest.fixture
def cloud(tmp_path):
    return Cloud(tmp_path / "cloud")


def make_agent(tmp_path, cloud, reasoning: str = "", tables: str = "") -> Agent:
    """An agent for device t1 of farm1; ``tables`` is more TOML tables (e.g. ``[limits]``)."""
    text = f"""
device = "t1"
farm = "farm1"
database = "t1.db"
[keys]
trusted_keys = "{cloud.keys}"
[reasoning]
{reasoning}
{tables}
"""
    path = tmp_path / "agent.toml"
    path.write_text(text)
    return Agent(AgentConfig.load(path))


def facts(agent: Agent, predicate: str) -> set:
    return set(agent.reasoner.facts(predicate))


def test_operations_fold_in_order_into_one_change(tmp_path, cloud):
    agent = make_agent(tmp_path, cloud)
    bundle = cloud.bundle(
        "base",
        1,
        rules=RULES,
        facts=[("temp", "a", 35), ("temp", "b", 25)],
        delete_facts=[("temp", "b", 25)],  # added then deleted in the same bundle: absent
        delete_rules=["nosuch"],  # unknown: a no-op, reported
    )
    outcome = agent.handle_bundle(cloud.sign(bundle))
    assert outcome.status == "applied"
    assert outcome.report["rules_ignored"] == ["nosuch"]
    assert facts(agent, "temp") == {("temp", "a", 35)}
    # Operations apply in order: delete then re-add a rule id replaces the rule...
    replace = cloud.bundle("base", 2)
    replace = replace.model_copy(
        update={
            "operations": [
                DeleteRules(ids=["hot"]),
                AddRules(rules=[RuleSpec(id="hot", text="hot: <Hot>(X) :- <temp>(X, T) .")]),
            ]
        }
    )
    assert agent.handle_bundle(cloud.sign(replace)).status == "applied"
    assert agent.reasoner.query("<Hot>(X)") == [{"X": "a"}]
    assert "COMP" not in str(agent.reasoner.rules["hot"])
    # ... while add then delete (Cloud.bundle's order) leaves the rule deleted.
    gone = cloud.bundle("base", 3, rules={"hot": RULES["hot"]}, delete_rules=["hot"])
    assert agent.handle_bundle(cloud.sign(gone)).status == "applied"
    assert "hot" not in agent.reasoner.rules and agent.reasoner.query("<Hot>(X)") == []
    agent.close()


def test_full_state_bundle_replaces_its_stream_only(tmp_path, cloud):
    agent = make_agent(tmp_path, cloud)
    agent.handle_bundle(cloud.sign(cloud.bundle("base", 1, rules=RULES, facts=[("temp", "a", 35)])))
    other = cloud.bundle(
        "ops",
        1,
        rules={"cold": "cold: <Cold>(X) :- <temp>(X, T) and COMP(T, <, 0) ."},
        facts=[("temp", "z", -5)],
    )
    agent.handle_bundle(cloud.sign(other))
    # Version 7 after 1 is a gap unless the bundle is the stream's full state.
    gap = agent.handle_bundle(cloud.sign(cloud.bundle("base", 7, facts=[("temp", "q", 1)])))
    assert gap.status == "refused" and gap.reason == "version_gap"
    full = cloud.bundle(
        "base", 7, full_state=True, rules={"warm": RULES["warm"]}, facts=[("temp", "b", 22)]
    )
    assert agent.handle_bundle(cloud.sign(full)).status == "applied"
    assert set(agent.reasoner.rules) == {"warm", "cold"}
    assert facts(agent, "temp") == {("temp", "b", 22), ("temp", "z", -5)}
    assert agent.state.applied_versions() == {"base": 7, "ops": 1}
    agent.close()


def test_an_applied_bundle_clears_the_error_it_settles(tmp_path, cloud):
    """``last_error`` says what is wrong now: a bundle applied on a source clears an error about
    that source (a gap, once the full state is applied) and an error about no source (a payload
    that could not be read); an error about another source, and a duplicate, clear nothing."""
    agent = make_agent(tmp_path, cloud)

    def error() -> dict | None:
        text = agent.status().last_error
        return json.loads(text) if text else None

    agent.handle_bundle(cloud.sign(cloud.bundle("base", 1, rules=RULES)))
    assert agent.handle_bundle(cloud.sign(cloud.bundle("base", 3))).reason == "version_gap"
    gap = error()
    assert (gap["reason"], gap["stream"], gap["version"], gap["expected_version"]) == (
        "version_gap",
        "base",
        3,
        2,
    )
    agent.handle_bundle(cloud.sign(cloud.bundle("ops", 1, facts=[("temp", "z", 1)])))
    assert error() == gap  # another stream: base is still waiting
    agent.handle_bundle(cloud.sign(cloud.bundle("base", 1)))  # a duplicate changes nothing
    assert error() == gap
    full = cloud.bundle("base", 4, full_state=True, rules=RULES)
    assert agent.handle_bundle(cloud.sign(full)).status == "applied"
    assert error() is None and agent.status().last_error is None
    # A refusal about no stream (unreadable) is settled by the next bundle applied.
    assert agent.handle_bundle(b"\x93garbage").reason == "malformed"
    assert error()["reason"] == "malformed"
    agent.handle_bundle(cloud.sign(cloud.bundle("ops", 2, facts=[("temp", "y", 2)])))
    assert error() is None
    # And an error on a farm-wide stream is about its source, all:<stream>.
    farm_gap = cloud.bundle("base", 2, device="all")
    assert agent.handle_bundle(cloud.sign(farm_gap)).reason == "version_gap"
    assert error()["stream"] == "all:base"
    agent.handle_bundle(cloud.sign(cloud.bundle("base", 5, facts=[("temp", "x", 3)])))
    assert error()["stream"] == "all:base"
    agent.handle_bundle(cloud.sign(cloud.bundle("base", 1, device="all")))
    assert error() is None
    agent.close()


def test_streams_and_sensors_are_bounded_by_the_limits(tmp_path, cloud):
    """Past ``[limits]`` a new stream's bundle is refused and a new sensor's reading dropped,
    both counted; what the device holds is kept and still updated (before: no limit, 3,000
    streams made a 30 kB status and 100,000 sensor ids were all kept)."""
    agent = make_agent(tmp_path, cloud, tables="[limits]\nmax_streams = 3\nmax_sensors = 5")
    for stream in ("s1", "s2", "s3"):
        assert agent.handle_bundle(cloud.sign(cloud.bundle(stream, 1))).status == "applied"
    refused = agent.handle_bundle(cloud.sign(cloud.bundle("s4", 1, facts=[("temp", "x", 1)])))
    assert (refused.status, refused.reason) == ("refused", "too_many_streams")
    assert "max_streams = 3" in refused.message
    assert agent.state.applied_versions() == {"s1": 1, "s2": 1, "s3": 1}
    assert facts(agent, "temp") == set()
    assert agent.handle_bundle(cloud.sign(cloud.bundle("s1", 2))).status == "applied"
    readings = [("temp", f"sensor{i}", i) for i in range(8)]
    assert agent.record_readings(readings_payload("t1", "farm1", readings)).status == "applied"
    assert facts(agent, "temp") == set(readings[:5])
    assert (
        agent.record_readings(
            readings_payload("t1", "farm1", [("temp", "sensor0", 99), ("temp", "sensor9", 9)])
        ).status
        == "applied"
    )
    assert ("temp", "sensor0", 99) in facts(agent, "temp")
    assert ("temp", "sensor9", 9) not in facts(agent, "temp")
    assert agent.status().dropped == {
        "bundle: too many streams": 1,
        "readings: too many sensors": 4,
    }
    agent.close()


def test_the_status_stays_small_whatever_the_findings(tmp_path, cloud):
    agent = make_agent(tmp_path, cloud, 'findings = ["Broken"]')
    rules = {"b": "b: <Broken>(X) :- <temp>(X, T) and COMP(T, >, 50) ."}
    agent.handle_bundle(cloud.sign(cloud.bundle("base", 1, rules=rules)))
    readings = [("temp", f"sensor-{i:03d}-" + "x" * 500, 60) for i in range(200)]
    for start in range(0, 200, 50):  # (a message is at most 64 kB)
        batch = readings_payload("t1", "farm1", readings[start : start + 50])
        assert agent.record_readings(batch).status == "applied"
    assert len(list(agent.reasoner.facts_named("Broken"))) == 200
    status = agent.status()
    assert 0 < len(status.findings) < 100
    assert len(encode_model(status)) < 10_000
    agent.close()


def test_readings_replace_previous_values_and_neighbours_replace_snapshots(tmp_path, cloud):
    agent = make_agent(tmp_path, cloud, 'telemetry_predicates = ["temp"]\nneighbours = ["t2"]')
    agent.record_readings(readings_payload("t1", "farm1", [("temp", "t1", 20), ("wind", "t1", 7)]))
    agent.record_readings(readings_payload("t1", "farm1", [("temp", "t1", 21)]))  # temp only
    assert facts(agent, "temp") == {("temp", "t1", 21)}
    assert facts(agent, "wind") == {("wind", "t1", 7)}
    assert [tuple(r) for r in agent.telemetry().readings] == [("temp", "t1", 21)]
    agent.handle_telemetry(
        readings_payload("t2", "farm1", [("temp", "t2", 30), ("wind", "t2", 3)]), sender="t2"
    )
    agent.handle_telemetry(readings_payload("t2", "farm1", [("temp", "t2", 31)]), sender="t2")
    assert facts(agent, "temp") == {("temp", "t1", 21), ("temp", "t2", 31)}
    assert facts(agent, "wind") == {("wind", "t1", 7)}  # t2's wind: not an accepted predicate
    # Another farm's telemetry and garbage are dropped without changes, and counted.
    foreign = readings_payload("t9", "farm2", [("temp", "t9", 1)])
    assert agent.handle_telemetry(foreign, sender="t2").status == "unchanged"
    assert agent.handle_telemetry(b"\x93garbage", sender="t2").status == "unchanged"
    assert facts(agent, "temp") == {("temp", "t1", 21), ("temp", "t2", 31)}
    assert agent.status().dropped == {
        "telemetry: predicate not accepted": 1,
        "telemetry: sender mismatch": 1,
        "telemetry: malformed": 1,
    }
    agent.close()


def test_requests_are_sent_once_and_released_when_resolved(tmp_path, cloud):
    reasoning = 'triggers = { "Suspect" = "ambient" }\nresolved = ["Fine"]'
    agent = make_agent(tmp_path, cloud, reasoning)
    base = {"s": "s: <Suspect>(X) :- <temp>(X, T) and COMP(T, >, 60) ."}
    agent.handle_bundle(cloud.sign(cloud.bundle("base", 1, rules=base)))
    assert agent.new_requests() == []
    agent.record_readings(readings_payload("t1", "farm1", [("temp", "t1", 70)]))
    requests = agent.new_requests()
    assert [r.event for r in requests] == ["ambient"] and isinstance(requests[0], RuleRequest)
    assert agent.new_requests() == []  # one open request per event
    answer = cloud.bundle("event/ambient", 1, rules={"f": "f: <Fine>(X) :- <ok>(X) ."})
    answer = answer.model_copy(update={"answers": requests[0].request_id})
    outcome = agent.handle_bundle(cloud.sign(answer))
    assert outcome.status == "applied" and "f" in agent.reasoner.rules
    assert agent.release_resolved() == []  # nothing resolved yet
    # <ok>(t1, yes) is binary: not Fine(X)
    agent.record_readings(readings_payload("t1", "farm1", [("ok", "t1", "yes")]))
    agent.state.apply(add_facts=[("ok", "t1")])
    released = agent.release_resolved()
    assert len(released) == 1 and "f" not in agent.reasoner.rules
    assert agent.state.summary()["open_requests"] == 0
    agent.close()


def test_cloud_release_resolves_the_request_and_a_new_occurrence_asks_again(tmp_path, cloud):
    """The usual life of an event: request, answer, findings in the status, release by the
    cloud. While the trigger still holds after the release the device does not ask again (it
    would loop); once the trigger went away and comes back, it asks again."""
    reasoning = 'triggers = { "Suspect" = "ambient" }\nfindings = ["Broken"]'
    agent = make_agent(tmp_path, cloud, reasoning)
    base = {"s": "s: <Suspect>(X) :- <temp>(X, T) and COMP(T, >, 60) ."}
    agent.handle_bundle(cloud.sign(cloud.bundle("base", 1, rules=base)))
    agent.record_readings(readings_payload("t1", "farm1", [("temp", "t1", 70)]))
    [request] = agent.new_requests()
    assert agent.state.summary()["requests"] == [
        {"event": "ambient", "stream": None, "status": "sent"}
    ]
    diagnose = {"d": "d: <Broken>(X) :- <Suspect>(X) and <temp>(X, T) and COMP(T, >, 65) ."}
    answer = cloud.bundle("anomaly", 1, rules=diagnose)
    agent.handle_bundle(cloud.sign(answer.model_copy(update={"answers": request.request_id})))
    assert [tuple(f) for f in agent.status().findings] == [(RDF_TYPE, "t1", "Broken")]
    answered = {"event": "ambient", "stream": "anomaly", "status": "answered"}
    assert agent.state.summary()["requests"] == [answered]  # (zodiac-agent status shows it)
    release = cloud.bundle("anomaly", 2, delete_rules=["d"])
    assert agent.handle_bundle(cloud.sign(release)).status == "applied"
    assert agent.status().findings == [] and "d" not in agent.reasoner.rules
    assert agent.state.summary()["open_requests"] == 0
    assert agent.state.summary()["requests"] == [{**answered, "status": "resolved"}]
    assert agent.new_requests() == []  # still suspect, but this event was dealt with
    agent.record_readings(readings_payload("t1", "farm1", [("temp", "t1", 20)]))
    assert agent.new_requests() == []  # trigger gone: the event is cleared
    agent.record_readings(readings_payload("t1", "farm1", [("temp", "t1", 80)]))
    [again] = agent.new_requests()
    assert again.event == "ambient" and again.request_id != request.request_id
    agent.close()


def test_an_unanswered_request_is_sent_again_after_the_timeout(tmp_path, cloud, monkeypatch):
    agent = make_agent(tmp_path, cloud, 'triggers = { "Suspect" = "ambient" }')
    base = {"s": "s: <Suspect>(X) :- <temp>(X, T) and COMP(T, >, 60) ."}
    agent.handle_bundle(cloud.sign(cloud.bundle("base", 1, rules=base)))
    agent.record_readings(readings_payload("t1", "farm1", [("temp", "t1", 70)]))
    assert len(agent.new_requests()) == 1 and agent.new_requests() == []
    monkeypatch.setattr(service, "REQUEST_TIMEOUT", -1.0)
    assert len(agent.new_requests()) == 1
    agent.close()


def test_state_survives_a_new_agent_on_the_same_file(tmp_path, cloud):
    agent = make_agent(tmp_path, cloud)
    agent.handle_bundle(cloud.sign(cloud.bundle("base", 1, rules=RULES, facts=[("temp", "a", 35)])))
    agent.close()
    again = make_agent(tmp_path, cloud)
    assert again.state.load_report.how == "loaded"
    assert again.reasoner.query("<Hot>(X)") == [{"X": "a"}]
    assert again.status().applied == {"base": 1}
    again.close()


def test_every_agent_command_and_option_has_help_text():
    commands = {"run", "status", "query", "apply", "init", "inspect", "backup", "schema"}
    check_help_texts(build_parser(), commands)


def test_bundles_carry_cyclic_multi_head_rules_through_the_agent(tmp_path, cloud):
    """A signed bundle adds a labelled rule with two heads, a cyclic body and a skolem IRI; a
    bundle whose multi-head rule is unsafe is refused and changes nothing; the state restarts
    from SQLite and keeps maintaining the rule."""
    agent = make_agent(tmp_path, cloud, "decompositions = true")
    triangle = (
        "tri: <InTriangle>(A), <triangleId>(A, N) :- <nb>(A, B) and <nb>(B, C) and <nb>(C, A) "
        'and bind(skolem("triangle", A) as N) .'
    )
    edges = [("nb", "a", "b"), ("nb", "b", "c"), ("nb", "c", "a"), ("nb", "c", "d")]
    bundle = cloud.bundle("base", 1, rules={"tri": triangle}, facts=edges)
    assert agent.handle_bundle(cloud.sign(bundle)).status == "applied"
    assert {f[1] for f in agent.reasoner.facts(RDF_TYPE) if f[2] == "InTriangle"} == {"a", "b", "c"}
    assert len({o for _, _, o in agent.reasoner.facts("triangleId")}) == 3

    unsafe = "bad: <p>(X), <q>(Z) :- <nb>(X, Y) ."
    refused = agent.handle_bundle(cloud.sign(cloud.bundle("base", 2, rules={"bad": unsafe})))
    assert refused.status != "applied" and "bad" not in agent.reasoner.rules

    agent.close()
    agent = make_agent(tmp_path, cloud, "decompositions = true")
    assert "tri" in agent.reasoner.rules
    again = cloud.bundle("base", 2, delete_facts=[("nb", "c", "a")])
    assert agent.handle_bundle(cloud.sign(again)).status == "applied"
    assert not [f for f in agent.reasoner.facts(RDF_TYPE) if f[2] == "InTriangle"]
    agent.close()


def test_bundles_carry_equality_through_the_agent(tmp_path, cloud):
    """A signed bundle adds a labelled key rule deciding owl:sameAs and facts under two names;
    a bundle whose rule would decide equality through negation is refused and changes nothing;
    the state restarts from SQLite (representatives loaded, not recomputed), the label is
    replaced by a new body in one bundle, and a deletion splits the class."""
    agent = make_agent(tmp_path, cloud, "")
    same = "http://www.w3.org/2002/07/owl#sameAs"
    key = f"key: <{same}>(X, Y) :- <hasSerial>(X, S) and <hasSerial>(Y, S) ."
    hot = "hot: <Hot>(X) :- <temp>(X, T) and COMP(T, >, 30) ."
    facts = [("hasSerial", "scada:T1", "s1"), ("hasSerial", "reg:WT-1", "s1")]
    facts += [("temp", "scada:T1", 34)]
    bundle = cloud.bundle("base", 1, rules={"key": key, "hot": hot}, facts=facts)
    assert agent.handle_bundle(cloud.sign(bundle)).status == "applied"
    assert {a["X"] for a in agent.reasoner.query("<Hot>(X)")} == {"reg:WT-1", "scada:T1"}

    unstratified = "bad: <hasSerial>(X, S) :- <code>(X, S) and not <retired>(X) ."
    refused = cloud.bundle("base", 2, rules={"bad": unstratified})
    before = set(agent.reasoner.facts())
    assert agent.handle_bundle(cloud.sign(refused)).status != "applied"
    assert "bad" not in agent.reasoner.rules and set(agent.reasoner.facts()) == before

    agent.close()
    agent = make_agent(tmp_path, cloud, "")
    assert agent.state.load_report.how == "loaded"
    assert {a["X"] for a in agent.reasoner.query("<Hot>(X)")} == {"reg:WT-1", "scada:T1"}
    replaced = f"key: <{same}>(X, Y) :- <hasTag>(X, S) and <hasTag>(Y, S) ."
    again = cloud.bundle("base", 2, rules={"key": replaced}, delete_rules=["key"])
    assert agent.handle_bundle(cloud.sign(again)).status == "applied"
    assert {a["X"] for a in agent.reasoner.query("<Hot>(X)")} == {"scada:T1"}
    assert agent.reasoner.stats()["equality"]["classes"] == 0
    agent.close()
