"""The shipped broker configuration (``deploy/mosquitto/``) enforces who publishes and reads what.

Every test runs a private Mosquitto started from exactly the shipped ``mosquitto.conf``, ``acl``
and users made by the shipped ``add-users`` (`DeployedBroker`: only ports and file paths
differ), with real MQTT v5 clients: two devices of farm1 (t1, t2), a device of farm2 that is
also called t1 (the farm is part of a device's identity), their turbine controllers and the
cloud.

How a refusal is observed: Mosquitto answers a refused QoS 1 publish with PUBACK 0x87 "not
authorized" and drops it, so that is asserted. It does not check subscriptions against its
acl_file (SUBACK grants them; it checks each message when delivering it), so a forbidden read
is asserted as non-delivery, with a barrier instead of a sleep: once every publish was
acknowledged by the broker (routed), a message the reader may read is published, and it must
be the first and only thing the reader receives.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode

from agent.protocol.messages import RuleRequest, decode_model
from tests.support.agent_harness import (
    AgentProcess,
    Cloud,
    StatusWatcher,
    readings_payload,
    run_cli,
    write_config,
)
from tests.support.broker import (
    DEPLOY_DIR,
    DeployedBroker,
    MqttError,
    TestClient,
    mosquitto_available,
    mosquitto_version,
)

pytestmark = pytest.mark.process

FARMS = {"farm1": ["t1", "t2"], "farm2": ["t1"]}
NOT_AUTHORIZED = 0x87

# The barrier for each reader: who publishes what it may read.
BARRIERS = {
    "farm1/t1": ("cloud", "zodiac/farm1/t1/bundle"),
    "farm1/t2": ("cloud", "zodiac/farm1/t2/bundle"),
    "farm2/t1": ("cloud", "zodiac/farm2/t1/bundle"),
    "cloud": ("farm1/t2", "zodiac/farm1/t2/status"),
}

# (publisher, topic, reader): published and delivered.
ALLOWED = [
    ("cloud", "zodiac/farm1/t1/bundle", "farm1/t1"),  # its own bundle
    ("cloud", "zodiac/farm1/all/bundle", "farm1/t1"),  # its farm's bundle
    ("cloud", "zodiac/farm2/all/bundle", "farm2/t1"),  # ... in every farm
    ("farm1/t1/controller", "zodiac/farm1/t1/readings", "farm1/t1"),  # its own sensor values
    ("farm1/t2", "zodiac/farm1/t2/telemetry", "farm1/t1"),  # a neighbour's telemetry
    ("farm1/t1", "zodiac/farm1/t1/telemetry", "farm1/t1"),  # its own telemetry
    ("farm1/t1", "zodiac/farm1/t1/status", "cloud"),
    ("farm1/t1", "zodiac/farm1/t1/request", "cloud"),
    ("farm1/t1", "zodiac/farm1/t1/telemetry", "cloud"),
    ("farm2/t1", "zodiac/farm2/t1/status", "cloud"),  # one cloud user serves every farm
]

# (publisher, topic, reader): the publish is allowed, but this reader never receives it.
UNREADABLE = [
    ("cloud", "zodiac/farm1/t2/bundle", "farm1/t1"),  # another device's bundle
    ("farm1/t2/controller", "zodiac/farm1/t2/readings", "farm1/t1"),  # ... its readings
    ("farm1/t2", "zodiac/farm1/t2/status", "farm1/t1"),  # ... its status
    ("farm1/t2", "zodiac/farm1/t2/request", "farm1/t1"),  # ... its rule requests
    ("cloud", "zodiac/farm2/t1/bundle", "farm1/t1"),  # another farm: a device of the same id
    ("cloud", "zodiac/farm2/all/bundle", "farm1/t1"),  # ... the farm-wide bundle
    ("farm2/t1", "zodiac/farm2/t1/telemetry", "farm1/t1"),  # ... telemetry
    ("farm2/t1", "zodiac/farm2/t1/status", "farm1/t1"),  # ... status
    ("cloud", "zodiac/farm1/t1/bundle", "farm2/t1"),  # and the other way round
    ("cloud", "zodiac/farm1/all/bundle", "farm2/t1"),
    ("farm1/t1", "zodiac/farm1/t1/telemetry", "farm2/t1"),
]

# (publisher, topic, reader): refused with PUBACK 0x87, and the reader, who could read that
# topic, never receives it.
REFUSED = [
    ("farm1/t1", "zodiac/farm1/t1/bundle", "farm1/t1"),  # only the cloud publishes bundles
    ("farm1/t1", "zodiac/farm1/all/bundle", "farm1/t2"),
    ("farm1/t1", "zodiac/farm1/t2/bundle", "farm1/t2"),
    ("farm1/t1", "zodiac/farm1/t2/status", "cloud"),  # another device's topics
    ("farm1/t1", "zodiac/farm1/t2/request", "cloud"),
    ("farm1/t1", "zodiac/farm1/t2/telemetry", "cloud"),
    ("farm1/t1", "zodiac/farm1/t1/readings", "farm1/t1"),  # only its controller writes these
    ("farm1/t1", "zodiac/farm2/t1/status", "cloud"),  # the device of that id in another farm
    ("farm1/t1", "zodiac/farm2/t1/bundle", "farm2/t1"),
    ("farm1/t1/controller", "zodiac/farm1/t2/readings", "farm1/t2"),  # another's readings
    ("farm1/t1/controller", "zodiac/farm1/t1/status", "cloud"),  # a controller is no device
    ("cloud", "zodiac/farm1/t1/status", "cloud"),  # the cloud cannot forge device reports
    ("cloud", "zodiac/farm1/t1/readings", "farm1/t1"),
]


def case_id(case: tuple[str, str, str]) -> str:
    publisher, topic, reader = case
    return f"{publisher} -> {topic} -> {reader}"


@pytest.fixture(scope="module")
def deployed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DeployedBroker]:
    """One broker for the ACL tables: they only publish and subscribe, never retain."""
    if not mosquitto_available():
        pytest.fail("mosquitto / mosquitto_passwd not installed (apt-get install mosquitto)")
    with DeployedBroker(tmp_path_factory.mktemp("deployed"), farms=FARMS) as broker:
        yield broker


def connect(stack: ExitStack, broker: DeployedBroker, *users: str) -> dict[str, TestClient]:
    """One connection per user (a second one would replace the first: the forced client id)."""
    return {user: stack.enter_context(broker.client(user)) for user in dict.fromkeys(users)}


def assert_only_barrier(clients: dict[str, TestClient], reader: str) -> None:
    """Publish the reader's barrier; it must be the first and only message the reader gets."""
    publisher, topic = BARRIERS[reader]
    assert not clients[publisher].publish(topic, b"barrier").is_failure
    message = clients[reader].expect()
    assert (message.topic, message.payload) == (topic, b"barrier"), "received before the barrier"
    assert clients[reader].drain() == []


def suback_ok_or_refused(code: ReasonCode) -> bool:
    """Mosquitto 2.0 grants every subscription (see the module docstring); a broker that
    refuses a forbidden one instead is just as right."""
    return not code.is_failure or code.value == NOT_AUTHORIZED


@pytest.mark.parametrize("case", ALLOWED, ids=case_id)
def test_allowed_publish_is_delivered(deployed, case):
    publisher, topic, reader = case
    with ExitStack() as stack:
        clients = connect(stack, deployed, publisher, reader)
        assert clients[reader].subscribe("#").value == 1
        assert not clients[publisher].publish(topic, b"allowed").is_failure
        message = clients[reader].expect()
        assert (message.topic, message.payload) == (topic, b"allowed")


@pytest.mark.parametrize("case", UNREADABLE, ids=case_id)
def test_forbidden_subscription_delivers_nothing(deployed, case):
    publisher, topic, reader = case
    with ExitStack() as stack:
        clients = connect(stack, deployed, publisher, reader, BARRIERS[reader][0])
        assert suback_ok_or_refused(clients[reader].subscribe(topic))
        assert suback_ok_or_refused(clients[reader].subscribe("#"))
        assert not clients[publisher].publish(topic, b"not for you").is_failure
        assert_only_barrier(clients, reader)


@pytest.mark.parametrize("case", REFUSED, ids=case_id)
def test_forbidden_publish_is_refused(deployed, case):
    publisher, topic, reader = case
    with ExitStack() as stack:
        clients = connect(stack, deployed, publisher, reader, BARRIERS[reader][0])
        clients[reader].subscribe("#")
        refused = clients[publisher].publish(topic, b"forged")
        assert refused.is_failure and refused.value == NOT_AUTHORIZED, refused
        assert_only_barrier(clients, reader)


def test_a_rule_request_is_answered_on_the_devices_response_topic(deployed):
    """What agent/sync.py and cloud/publisher.py do: the request names the device's own bundle
    topic as MQTT v5 response topic, the cloud publishes the answer there with the request's
    correlation data, and the device receives it."""
    with ExitStack() as stack:
        clients = connect(stack, deployed, "farm1/t1", "cloud")
        t1, cloud = clients["farm1/t1"], clients["cloud"]
        t1.subscribe("zodiac/farm1/t1/bundle")
        cloud.subscribe("zodiac/+/+/request")
        props = Properties(PacketTypes.PUBLISH)
        props.ResponseTopic = "zodiac/farm1/t1/bundle"
        props.CorrelationData = b"request-1"
        info = t1.client.publish("zodiac/farm1/t1/request", b"rules please", 1, properties=props)
        info.wait_for_publish(5)
        request = cloud.expect("zodiac/farm1/t1/request")
        answer = Properties(PacketTypes.PUBLISH)
        answer.CorrelationData = request.properties.CorrelationData
        cloud.client.publish(request.properties.ResponseTopic, b"rules", 1, properties=answer)
        response = t1.expect("zodiac/farm1/t1/bundle")
        assert response.payload == b"rules"
        assert response.properties.CorrelationData == b"request-1"


def test_a_last_will_can_only_mark_the_device_itself_offline(deployed):
    """The agent's last will is its own retained status; a will naming another device's status
    is accepted at CONNECT by Mosquitto but never published."""
    with ExitStack() as stack:
        clients = connect(stack, deployed, "cloud", "farm1/t2")
        clients["cloud"].subscribe("zodiac/+/+/status")
        for will_topic in ("zodiac/farm1/t2/status", "zodiac/farm1/t1/status"):
            client = deployed.client("farm1/t1")
            client.client.will_set(will_topic, b"offline", qos=1)
            assert not client.connect().is_failure
            offset = deployed.log_file.stat().st_size
            # MQTT v5 "disconnect with will message": the broker publishes the will now.
            client.client.disconnect(
                ReasonCode(PacketTypes.DISCONNECT, "Disconnect with will message")
            )
            client.client.loop_stop()
            deployed.wait_log("Client farm1/t1 disconnected", offset)
        message = clients["cloud"].expect()
        assert (message.topic, message.payload) == ("zodiac/farm1/t1/status", b"offline")
        assert_only_barrier(clients, "cloud")


def test_no_other_client_takes_over_a_devices_client_id(make_deployed_broker):
    """A client id is the device's username (use_username_as_clientid): a wrong password,
    another user asking for t1's client id, or an unknown user neither disconnects t1 nor
    touches its persistent session."""
    broker = make_deployed_broker(farms=FARMS)
    with broker.client("cloud") as cloud:
        # As the agent connects: its own client id, a persistent session.
        t1 = broker.client("farm1/t1", "zodiac-farm1-t1", clean_start=False, session_expiry=3600)
        assert not t1.connect().is_failure
        t1.subscribe("zodiac/farm1/t1/bundle")
        refused = [
            TestClient(broker, "zodiac-farm1-t1", username="farm1/t1", password="wrong"),
            TestClient(broker, "farm1/t1", username="farm1/t1", password="wrong"),
            TestClient(broker, "farm1/t1", username="farm9/t1", password="unknown"),
            TestClient(broker, "zodiac-farm1-t1"),  # anonymous
        ]
        for intruder in refused:
            reason = intruder.connect()
            assert reason.is_failure, intruder.client_id
        accepted = [
            broker.client("farm1/t2", "zodiac-farm1-t1"),
            broker.client("farm2/t1", "farm1/t1"),
        ]
        for other in accepted:
            # Connected, but as itself: its client id is its own username.
            assert not other.connect().is_failure
        assert not cloud.publish("zodiac/farm1/t1/bundle", b"after the intruders").is_failure
        assert t1.expect("zodiac/farm1/t1/bundle").payload == b"after the intruders"
        assert t1.disconnects == []
        for other in accepted:
            assert other.disconnects == [] and other.drain() == []
            other.disconnect()
        # The session is still t1's: a bundle published while it is away is queued for it.
        t1.disconnect()
        assert not cloud.publish("zodiac/farm1/t1/bundle", b"while away").is_failure
        back = broker.client("farm1/t1", "zodiac-farm1-t1", clean_start=False, session_expiry=3600)
        with back:
            assert back.session_present is True
            assert back.expect("zodiac/farm1/t1/bundle").payload == b"while away"


# Installed Mosquitto's version; (0, 0, 0) when it is missing (the broker fixtures then fail).
MOSQUITTO_VERSION = mosquitto_version() if mosquitto_available() else (0, 0, 0)


@pytest.mark.xfail(
    MOSQUITTO_VERSION < (2, 0, 13),
    strict=True,
    reason="Mosquitto 2.0.11-2.0.12: an anonymous client refused under use_username_as_clientid "
    "removes the device's session from the broker's index (fixed in 2.0.13, commit be80a3f4)",
)
def test_an_anonymous_client_with_a_devices_username_as_client_id_leaves_its_session(
    make_deployed_broker,
):
    broker = make_deployed_broker(farms=FARMS)
    with broker.client("cloud") as cloud:
        t1 = broker.client("farm1/t1", "zodiac-farm1-t1", clean_start=False, session_expiry=3600)
        assert not t1.connect().is_failure
        t1.subscribe("zodiac/farm1/t1/bundle")
        assert TestClient(broker, "farm1/t1").connect().is_failure
        assert not cloud.publish("zodiac/farm1/t1/bundle", b"still there").is_failure
        assert t1.expect("zodiac/farm1/t1/bundle").payload == b"still there"
        assert t1.disconnects == []
        t1.disconnect()
        assert not cloud.publish("zodiac/farm1/t1/bundle", b"while away").is_failure
        back = broker.client("farm1/t1", "zodiac-farm1-t1", clean_start=False, session_expiry=3600)
        with back:
            assert back.session_present is True
            assert back.expect("zodiac/farm1/t1/bundle", timeout=2).payload == b"while away"


def test_the_password_holder_replaces_a_stale_connection_and_resumes_its_session(
    make_deployed_broker,
):
    """What a restarted agent does when the broker still holds its old connection."""
    broker = make_deployed_broker(farms=FARMS)
    with broker.client("cloud") as cloud:
        old = broker.client("farm1/t1", "zodiac-farm1-t1", clean_start=False, session_expiry=3600)
        assert not old.connect().is_failure
        old.client.reconnect_delay_set(30, 60)  # paho must not come back before we stop it
        old.subscribe("zodiac/farm1/t1/bundle")
        new = broker.client("farm1/t1", "zodiac-farm1-t1", clean_start=False, session_expiry=3600)
        with new:
            old.wait_disconnected()
            old.disconnect()
            assert new.session_present is True
            assert not cloud.publish("zodiac/farm1/t1/bundle", b"to the new one").is_failure
            assert new.expect("zodiac/farm1/t1/bundle").payload == b"to the new one"


def test_the_cloud_listener_keeps_client_ids_so_keep_it_private(make_deployed_broker):
    """``zodiac-cloud serve`` and a one-off ``publish`` run are both the user "cloud", with
    their own client ids, so the cloud's listener does not force ids, and there any user who
    asks for a client id takes it over: that is why it must not be reachable by devices."""
    broker = make_deployed_broker(farms=FARMS)
    port = broker.cloud_port
    serve = broker.client("cloud", "zodiac-cloud-farm1")
    with serve, broker.client("cloud", "zodiac-cloud-farm1-publish-42"):
        assert serve.disconnects == []
        serve.client.reconnect_delay_set(30, 60)
        with broker.client("farm1/t2", "zodiac-cloud-farm1", port=port):
            serve.wait_disconnected()


def test_queued_bundles_survive_a_broker_restart(make_deployed_broker):
    """Persistence, with the ACL checked for a device that is offline (per_listener_settings
    true would break exactly this)."""
    broker = make_deployed_broker(farms=FARMS)
    persistent = {"clean_start": False, "session_expiry": 3600}
    with broker.client("farm1/t1", "zodiac-farm1-t1", **persistent) as t1:
        t1.subscribe("zodiac/farm1/t1/bundle")
        t1.subscribe("zodiac/farm1/all/bundle")
    with broker.client("cloud") as cloud:
        assert not cloud.publish("zodiac/farm1/t1/bundle", b"v1").is_failure
        assert not cloud.publish("zodiac/farm1/all/bundle", b"farm v1").is_failure
    broker.restart()
    with broker.client("farm1/t1", "zodiac-farm1-t1", **persistent) as t1:
        assert t1.session_present is True
        assert t1.expect("zodiac/farm1/t1/bundle").payload == b"v1"
        assert t1.expect("zodiac/farm1/all/bundle").payload == b"farm v1"


def test_tls_option_takes_the_username_from_the_client_certificate(make_deployed_broker):
    """The documented TLS listener: no password, the certificate's Common Name is the
    username, so the same ACL applies, and the client id is forced to it too."""
    broker = make_deployed_broker(farms=FARMS, tls=True, tls_client="farm1/t1")
    files = broker.tls_files
    assert files is not None
    without_certificate = TestClient(broker, "x", ca_file=files.ca_cert, port=broker.tls_port)
    with pytest.raises((OSError, MqttError)):
        without_certificate.connect()
    device = TestClient(
        broker,
        "any-id",
        ca_file=files.ca_cert,
        cert_file=files.client_cert,
        key_file=files.client_key,
        port=broker.tls_port,
    )
    with device, broker.client("cloud") as cloud:
        device.subscribe("#")
        assert device.publish("zodiac/farm1/t2/status", b"forged").value == NOT_AUTHORIZED
        assert not device.publish("zodiac/farm1/t1/status", b"mine").is_failure
        for topic in (
            "zodiac/farm1/t2/bundle",
            "zodiac/farm1/t1/bundle",
            "zodiac/farm1/all/bundle",
        ):
            assert not cloud.publish(topic, b"bundle").is_failure
        received = [device.expect().topic for _ in range(2)]
        assert received == ["zodiac/farm1/t1/bundle", "zodiac/farm1/all/bundle"]
        assert device.drain() == []
    assert "as farm1/t1 " in broker.log_file.read_text()  # the forced client id


# ------------------------------------------------------------------------------ add-users
def add_users(directory: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            str(DEPLOY_DIR / "add-users"),
            "--dir",
            str(directory),
            "--secrets",
            str(directory / "secrets"),
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    "args, message",
    [
        (["devices", "farm1", "all"], "device 'all' is reserved"),
        (["devices", "farm/1", "t1"], "farm 'farm/1' is not a valid id"),
        (["devices", "farm1", "t1", "t+"], "device 't+' is not a valid id"),
        (["devices", "farm1", "t1", "t1"], "device 't1' is listed twice"),
        (["devices", "farm1"], "needs a farm and at least one device"),
        (["devices", "farm1", "t1", "--controllers"], "options go before"),
        (["cloud", "extra"], "'cloud' takes no arguments"),
        (["robots"], "unknown kind 'robots'"),
    ],
)
def test_add_users_refuses_bad_arguments_and_changes_nothing(tmp_path, args, message):
    (tmp_path / "acl").write_bytes((DEPLOY_DIR / "acl").read_bytes())
    before = sorted(p.name for p in tmp_path.iterdir())
    result = add_users(tmp_path, *args)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and message in result.stderr, result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    assert (tmp_path / "acl").read_bytes() == (DEPLOY_DIR / "acl").read_bytes()


def test_add_users_again_changes_the_password_and_keeps_one_acl_block(make_deployed_broker):
    broker = make_deployed_broker(farms={"farm1": ["t1"]})
    old = broker.password("farm1/t1")
    broker.add_users("--controllers", "devices", "farm1", "t1", "t2")
    acl = (broker.directory / "acl").read_text()
    assert acl.count("\nuser farm1/t1\n") == 1 and acl.count("\nuser farm1/t2\n") == 1
    assert acl.count("\nuser farm1/t1/controller\n") == 1
    users = [line.split(":")[0] for line in (broker.directory / "passwd").read_text().splitlines()]
    assert sorted(users) == sorted(
        ["cloud", "farm1/t1", "farm1/t1/controller", "farm1/t2", "farm1/t2/controller"]
    )
    new = broker.password("farm1/t1")
    assert new != old
    broker.restart()  # an operator would reload; a restart rereads the files just as well
    stale = TestClient(broker, "stale", username="farm1/t1", password=old)
    assert stale.connect().is_failure
    with (
        broker.client("farm1/t1"),
        broker.client("farm1/t2") as t2,
        broker.client("cloud") as cloud,
    ):
        t2.subscribe("zodiac/farm1/all/bundle")  # the new device's ACL block is in force
        assert not cloud.publish("zodiac/farm1/all/bundle", b"hello").is_failure
        assert t2.expect("zodiac/farm1/all/bundle").payload == b"hello"


# --------------------------------------------------------------------------- the real agent
def test_agent_works_under_the_shipped_configuration(tmp_path, make_deployed_broker):
    """``zodiac-agent run`` with the username and password file an operator gives it: it
    publishes its status, applies its own and its farm's bundles but not a neighbour's, takes
    its own readings from its controller, publishes its telemetry, asks for rules and gets the
    answer on its response topic, and ingests its neighbour's telemetry. A wrong password is
    refused and logged."""
    broker = make_deployed_broker(farms=FARMS)
    cloud = Cloud(tmp_path / "cloud")
    password_file = broker.secrets / "farm1" / "t1.password"
    reasoning = """
triggers = { "http://ex/Suspect" = "ambient-temperature" }
telemetry_predicates = ["temp"]
neighbours = ["t2"]
findings = ["http://ex/Seen"]
"""
    config = write_config(
        tmp_path / "t1",
        broker,
        cloud.keys,
        reasoning=reasoning,
        broker_extra=f'username = "farm1/t1"\npassword_file = "{password_file}"\n',
    )
    suspect = {"suspect": "suspect: <http://ex/Suspect>(X) :- <temp>(X, T) and COMP(T, >, 60) ."}
    seen = {"seen": "seen: <http://ex/Seen>(X) :- <temp>(X, T) ."}
    with (
        AgentProcess(config) as agent,
        broker.client("cloud", "cloud-status") as client,
        broker.client("cloud", "cloud-requests") as requests,
        broker.client("farm1/t1/controller") as controller,
        broker.client("farm1/t2") as t2,
    ):
        requests.subscribe("zodiac/farm1/t1/request")
        requests.subscribe("zodiac/farm1/t1/telemetry")
        watcher = StatusWatcher(client, "farm1", "t1")
        watcher.wait(lambda s: s.online)
        client.publish("zodiac/farm1/t2/bundle", cloud.sign(cloud.bundle("t2only", 1)))
        client.publish("zodiac/farm1/all/bundle", cloud.sign(cloud.bundle("farm", 1)))
        client.publish("zodiac/farm1/t1/bundle", cloud.sign(cloud.bundle("base", 1, rules=suspect)))
        status = watcher.wait(lambda s: s.applied.get("base") == 1 and "farm" in s.applied)
        assert "t2only" not in status.applied
        # Its controller's reading makes it suspect: its telemetry goes out, and a request.
        reading = readings_payload("t1", "farm1", [("temp", "t1", 70)])
        assert not controller.publish("zodiac/farm1/t1/readings", reading).is_failure
        assert requests.expect("zodiac/farm1/t1/telemetry").payload
        message = requests.expect("zodiac/farm1/t1/request")
        assert decode_model(message.payload, RuleRequest).event == "ambient-temperature"
        props = Properties(PacketTypes.PUBLISH)
        props.CorrelationData = message.properties.CorrelationData
        answer = cloud.bundle("anomaly/ambient-temperature", 1, rules=seen)
        requests.client.publish(
            message.properties.ResponseTopic, cloud.sign(answer), qos=1, properties=props
        )
        status = watcher.wait(lambda s: s.applied.get("anomaly/ambient-temperature") == 1)
        assert len(status.findings) == 1  # Seen(t1)
        neighbour = readings_payload("t2", "farm1", [("temp", "t2", 21)])
        assert not t2.publish("zodiac/farm1/t2/telemetry", neighbour).is_failure
        watcher.wait(lambda s: len(s.findings) == 2)  # Seen(t2): its telemetry arrived
        assert agent.terminate() == 0
    result = run_cli("query", "--config", str(config), "<http://ex/Seen>(X)")
    assert sorted(json.loads(line)["X"] for line in result.stdout.splitlines()) == ["t1", "t2"]
    wrong = tmp_path / "wrong.password"
    wrong.write_text("not the password\n")
    bad = write_config(
        tmp_path / "bad",
        broker,
        cloud.keys,
        broker_extra=f'username = "farm1/t1"\npassword_file = "{wrong}"\n',
    )
    with AgentProcess(bad) as agent:
        agent.wait_log("connection refused")
