"""Bundle format tests: signing, every refusal reason, term encoding, sequencing and key files.

Real Ed25519 keys and real msgpack throughout: a refusal must come from the input the agent
would actually receive, not from a mocked verifier.
"""

from __future__ import annotations

import math
import os
import stat
from pathlib import Path

import msgpack
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from agent.engine.errors import ZodiacError
from agent.engine.language import RDF_TYPE, XSD, Literal
from agent.engine.reasoner import Reasoner
from agent.protocol.keys import KeyRing, generate_key_pair, load_private_key
from agent.protocol.messages import (
    REASONS,
    AddFacts,
    AddRules,
    Bundle,
    BundleError,
    DeleteFacts,
    DeleteRules,
    DeviceStatus,
    RuleRequest,
    RuleSpec,
    decode_bundle,
    decode_request,
    decode_status,
    decode_term,
    encode_model,
    encode_term,
)
from agent.protocol.signing import BundleLimits, check_sequence, open_bundle
from agent.protocol.signing import sign_bundle as sign_now

NOW = 1_750_000_000.0
KID = "cloud-2025"


def sign_bundle(bundle: Bundle, key: Ed25519PrivateKey, kid: str, **kwargs) -> bytes:
    """Signed at NOW, the time these tests' bundles are made and opened."""
    return sign_now(bundle, key, kid, now=NOW, **kwargs)


@pytest.fixture(scope="module")
def private_key() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.generate()


@pytest.fixture(scope="module")
def keyring(private_key: Ed25519PrivateKey) -> KeyRing:
    ring = KeyRing()
    ring.add(KID, private_key.public_key())
    return ring


def make_bundle(**changes) -> Bundle:
    fields = {
        "bundle_id": "b-0001",
        "farm": "farm1",
        "device": "t1",
        "stream": "anomaly/ambient-temperature",
        "version": 1,
        "issued_at": NOW,
        "expires_at": NOW + 3600,
        "operations": [
            AddRules(
                rules=[
                    RuleSpec(id="hot", text="<hot>(X) :- <temp>(X, T), T > 80 ."),
                    RuleSpec(
                        id="cold",
                        text="@prefix ex: <http://ex.org/> .\n"
                        "cold: ex:cold(X) :- ex:temp(X, T), T < -20 .",
                    ),
                ]
            ),
            DeleteRules(ids=["old.rule-1"]),
            AddFacts(facts=[("temp", "wt1", 85.5), [RDF_TYPE, "wt1", "WindTurbine"]]),
            DeleteFacts(facts=[("temp", "wt1", 12)]),
        ],
    }
    fields.update(changes)
    return Bundle(**fields)


def sign_raw(body: bytes, key: Ed25519PrivateKey, kid: str = KID, **envelope) -> bytes:
    """An envelope around arbitrary body bytes, signed for real: what a buggy cloud would send."""
    fields = {"v": 1, "kid": kid, "body": body, "sig": key.sign(body)}
    fields.update(envelope)
    return msgpack.packb(fields, use_bin_type=True)


def refusal(payload: bytes, keyring: KeyRing, **kwargs) -> BundleError:
    with pytest.raises(BundleError) as info:
        open_bundle(payload, keyring, now=kwargs.pop("now", NOW), **kwargs)
    assert info.value.reason in REASONS
    return info.value


# --- round trips ----------------------------------------------------------------------------


def test_sign_and_open_round_trip(private_key, keyring):
    bundle = make_bundle(expires_at=NOW + 3600, full_state=True)
    payload = sign_bundle(bundle, private_key, KID)
    opened = open_bundle(payload, keyring, now=NOW)
    assert opened == bundle
    assert [rule.id for rule in opened.parsed_rules()] == ["hot", "cold"]
    assert opened.operation_count() == 2 + 1 + 2 + 1


def test_parsed_rules_carry_the_spec_id_and_feed_the_reasoner(private_key, keyring):
    opened = open_bundle(sign_bundle(make_bundle(), private_key, KID), keyring, now=NOW)
    reasoner = Reasoner()
    assert reasoner.add_rules(opened.parsed_rules()) == ["hot", "cold"]
    adds = [op for op in opened.operations if isinstance(op, AddFacts)]
    reasoner.add_facts(list(Bundle.fact_tuples(adds[0])))
    assert (RDF_TYPE, "wt1", "hot") in set(reasoner.facts())


VALUES = [
    "http://example.org/wt1",
    0,
    -(2**63),
    2**64 - 1,
    True,
    False,
    1.5,
    -0.0,
    1e308,
    Literal("plain"),
    Literal("bonjour", None, "fr"),
    Literal("2025-01-01T00:00:00Z", XSD + "dateTime"),
    Literal(""),
]


def test_terms_survive_the_wire(private_key, keyring):
    fact = ("reading", *VALUES)
    bundle = make_bundle(operations=[AddFacts(facts=[fact])])
    opened = open_bundle(sign_bundle(bundle, private_key, KID), keyring, now=NOW)
    (decoded,) = opened.operations[0].fact_tuples()
    assert decoded == fact
    # bool stays bool and float stays float (1 == True == 1.0 in Python, so compare types too)
    assert [type(v) for v in decoded] == [type(v) for v in fact]


@pytest.mark.parametrize(
    "value",
    [
        math.nan,
        math.inf,
        -math.inf,
        {"lit": "NaN", "dt": XSD + "double", "lang": None},
        {"lit": "INF", "dt": XSD + "float", "lang": None},
    ],
    ids=["nan", "inf", "-inf", "NaN literal", "INF literal"],
)
def test_a_number_that_is_no_value_makes_a_signed_bundle_invalid(value, private_key, keyring):
    """NaN and infinities are no terms (docs/semantics.md): the cloud's models refuse to build
    such a fact, and a device refuses a body that holds one, signed or not, as ``invalid``
    before anything is applied (it escaped as an exception, and deleting one advanced the
    stream's version)."""
    with pytest.raises(ValidationError):
        AddFacts(facts=[["x", "a", value]])
    for op in ("add_facts", "delete_facts"):
        body = make_bundle().model_dump(mode="python")
        body["operations"] = [{"op": op, "facts": [["x", "a", value]]}]
        payload = sign_raw(msgpack.packb(body, use_bin_type=True), private_key)
        error = refusal(payload, keyring)
        assert error.reason == "invalid", error
        assert "NaN" in str(error) or "inf" in str(error).lower()


def test_term_encoding():
    assert encode_term(Literal("a", None, "en")) == {"lit": "a", "dt": None, "lang": "en"}
    assert encode_term(True) is True
    for value in VALUES:
        assert decode_term(encode_term(value)) == value
    # Like the parser and the RDF reader: typed numbers are numbers, xsd:string is dropped.
    assert decode_term({"lit": "5", "dt": XSD + "integer", "lang": None}) == 5
    assert decode_term({"lit": "a", "dt": XSD + "string"}) == Literal("a")
    with pytest.raises(BundleError) as info:
        decode_term({"lit": "a", "dt": XSD + "string", "lang": "en"})
    assert info.value.reason == "invalid"
    with pytest.raises(BundleError):
        decode_term([1, 2])
    with pytest.raises(TypeError):
        encode_term(object())  # type: ignore[arg-type]


def test_wire_shape_of_a_bundle():
    body = msgpack.unpackb(encode_model(make_bundle()), raw=False)
    assert body["operations"][0]["op"] == "add_rules"
    assert body["operations"][2] == {
        "op": "add_facts",
        "facts": [["temp", "wt1", 85.5], [RDF_TYPE, "wt1", "WindTurbine"]],
    }
    assert decode_bundle(encode_model(make_bundle())) == make_bundle()


def test_status_and_request_round_trip():
    status = DeviceStatus(
        device="wt-017",
        farm="north-sea.1",
        online=True,
        applied={"base": 4, "anomaly/ambient-temperature": 2},
        rules=12,
        facts=3400,
        explicit_facts=1200,
        last_error="bundle 'b-9' (stream 'base'): version_gap",
        updated_at=NOW,
    )
    assert decode_status(encode_model(status)) == status
    request = RuleRequest(
        request_id="req-1",
        device="wt-017",
        farm="north-sea.1",
        event="http://zodiac.example/ambientTemperatureHigh",
        facts=[("ambientTemperature", "wt-017", 41.5, Literal("°C"))],
        issued_at=NOW,
    )
    decoded = decode_request(encode_model(request))
    assert decoded == request
    assert list(decoded.fact_tuples()) == [("ambientTemperature", "wt-017", 41.5, Literal("°C"))]
    with pytest.raises(BundleError) as info:
        decode_status(encode_model(status)[:-3])
    assert info.value.reason == "malformed"
    bad = status.model_dump() | {"device": "wt/017"}  # a '/' would break the MQTT topic
    with pytest.raises(BundleError) as info:
        decode_status(msgpack.packb(bad, use_bin_type=True))
    assert info.value.reason == "invalid"


# --- refusals before the signature -----------------------------------------------------------


def test_too_large_is_checked_before_anything_else(private_key, keyring):
    huge = make_bundle(operations=[AddFacts(facts=[("note", "wt1", Literal("x" * 1_000_001))])])
    error = refusal(sign_bundle(huge, private_key, KID), keyring)
    assert error.reason == "too_large"
    # garbage too: the size alone decides, nothing is decoded
    assert refusal(b"\xc1" * 2000, keyring, limits=BundleLimits(max_bytes=1000)).reason == (
        "too_large"
    )


@pytest.mark.parametrize(
    "envelope",
    [
        [1, KID, b"body", b"s" * 64],
        {"v": 1, "kid": KID, "body": b"body"},
        {"v": 1, "kid": KID, "body": b"body", "sig": b"s" * 64, "extra": 1},
        {"v": 2, "kid": KID, "body": b"body", "sig": b"s" * 64},
        {"v": True, "kid": KID, "body": b"body", "sig": b"s" * 64},
        {"v": 1, "kid": KID, "body": "body as str", "sig": b"s" * 64},
        {"v": 1, "kid": 7, "body": b"body", "sig": b"s" * 64},
        {"v": 1, "kid": KID, "body": b"body", "sig": b"s" * 63},
    ],
)
def test_malformed_envelope(envelope, keyring):
    error = refusal(msgpack.packb(envelope, use_bin_type=True), keyring)
    assert error.reason == "malformed"
    assert error.bundle_id is None and error.stream is None


def test_not_msgpack_and_not_bytes(keyring):
    assert refusal(b"", keyring).reason == "malformed"
    assert refusal(b"\x81\xa1v", keyring).reason == "malformed"  # truncated
    assert refusal(msgpack.packb({1: 2}), keyring).reason == "malformed"  # non-str map key
    assert refusal(msgpack.packb(msgpack.ExtType(5, b"x")), keyring).reason == "malformed"
    with pytest.raises(BundleError) as info:
        open_bundle("not bytes", keyring)  # type: ignore[arg-type]
    assert info.value.reason == "malformed"


def test_unknown_key(private_key, keyring):
    error = refusal(sign_bundle(make_bundle(), private_key, "rogue"), keyring)
    assert error.reason == "unknown_key"
    assert "rogue" in str(error)


def test_tampered_body_byte(private_key, keyring):
    payload = sign_bundle(make_bundle(version=1), private_key, KID)
    envelope = msgpack.unpackb(payload, raw=False)
    body = bytearray(envelope["body"])
    index = body.index(
        b"\x01"
    )  # the version; 2 is still a valid bundle, only the signature says no
    body[index] = 0x02
    envelope["body"] = bytes(body)
    assert decode_bundle(envelope["body"]).version == 2
    assert refusal(msgpack.packb(envelope, use_bin_type=True), keyring).reason == "bad_signature"


def test_tampered_signature(private_key, keyring):
    envelope = msgpack.unpackb(sign_bundle(make_bundle(), private_key, KID), raw=False)
    signature = bytearray(envelope["sig"])
    signature[10] ^= 0x01
    envelope["sig"] = bytes(signature)
    assert refusal(msgpack.packb(envelope, use_bin_type=True), keyring).reason == "bad_signature"


def test_known_key_id_but_other_private_key(keyring):
    intruder = Ed25519PrivateKey.generate()
    assert refusal(sign_bundle(make_bundle(), intruder, KID), keyring).reason == "bad_signature"


@given(st.binary(max_size=300))
def test_random_bytes_are_refused_cleanly(data):
    ring = KeyRing({KID: Ed25519PrivateKey.from_private_bytes(b"k" * 32).public_key()})
    with pytest.raises(BundleError) as info:
        open_bundle(data, ring, now=NOW)
    assert info.value.reason in {"malformed", "unknown_key", "bad_signature"}


msgpack_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats()
    | st.text(max_size=5)
    | st.binary(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner),
    max_leaves=10,
)


@given(
    st.fixed_dictionaries(
        {},
        optional={
            "v": msgpack_values | st.just(1),
            "kid": msgpack_values | st.just(KID),
            "body": msgpack_values,
            "sig": msgpack_values | st.binary(min_size=64, max_size=64),
        },
    )
)
def test_random_envelopes_are_refused_cleanly(envelope):
    ring = KeyRing({KID: Ed25519PrivateKey.from_private_bytes(b"k" * 32).public_key()})
    with pytest.raises(BundleError) as info:
        open_bundle(msgpack.packb(envelope, use_bin_type=True), ring, now=NOW)
    assert info.value.reason in {"malformed", "bad_signature"}


@given(st.data())
def test_signed_garbage_bodies_are_refused_cleanly(data):
    """Even with a valid signature (a buggy cloud), a bad body is a BundleError, nothing else."""
    key = Ed25519PrivateKey.from_private_bytes(b"k" * 32)
    ring = KeyRing({KID: key.public_key()})
    if data.draw(st.booleans()):
        body = data.draw(st.binary(max_size=200))
    else:
        body = msgpack.packb(data.draw(msgpack_values), use_bin_type=True)
    with pytest.raises(BundleError) as info:
        open_bundle(sign_raw(body, key), ring, now=NOW)
    assert info.value.reason in {"malformed", "invalid"}


# --- refusals after the signature ------------------------------------------------------------


def body_of(bundle: Bundle) -> dict:
    return msgpack.unpackb(encode_model(bundle), raw=False)


def test_signed_body_that_is_not_msgpack(private_key, keyring):
    assert refusal(sign_raw(b"\xc1not msgpack", private_key), keyring).reason == "malformed"


@pytest.mark.parametrize(
    ("change", "where"),
    [
        (lambda body: body.pop("version"), "version"),
        (lambda body: body.update(priority=3), "priority"),
        (lambda body: body.update(version="2"), "version"),
        (lambda body: body.update(version=0), "version"),
        (lambda body: body.update(version=True), "version"),
        (lambda body: body.update(issued_at=math.inf), "issued_at"),
        (lambda body: body.update(stream="bad stream!"), "stream"),
        (lambda body: body["operations"].append({"op": "reboot"}), "operations.4"),
        (lambda body: body["operations"][1].update(ids=["not a label"]), "operations.1"),
        (lambda body: body["operations"][2]["facts"].append(["p"]), "operations.2"),
        (lambda body: body["operations"][2]["facts"].append([7, "a"]), "operations.2"),
        (lambda body: body["operations"][2]["facts"].append([RDF_TYPE, "a", 3]), "operations.2"),
        (lambda body: body["operations"][2]["facts"].append(["p", None]), "operations.2"),
        (lambda body: body["operations"][2]["facts"].append(["p", {"lit": 1}]), "operations.2"),
        (
            lambda body: body["operations"][0]["rules"].append({"id": "hot", "text": "x"}),
            "operations.0",
        ),
    ],
)
def test_invalid_schema(change, where, private_key, keyring):
    body = body_of(make_bundle())
    change(body)
    error = refusal(sign_raw(msgpack.packb(body, use_bin_type=True), private_key), keyring)
    assert error.reason == "invalid"
    assert where in str(error)
    if where != "stream":
        assert error.bundle_id == "b-0001" and "b-0001" in str(error)


def test_integers_outside_msgpack_range_are_refused_by_the_schema():
    """Caught when the cloud builds the fact, not as an OverflowError inside msgpack.packb."""
    for value in (2**64, -(2**63) - 1):
        with pytest.raises(ValidationError):
            AddFacts(facts=[("p", value)])


def test_too_many_operations(private_key, keyring):
    facts = [("temp", f"wt{i}", i) for i in range(4)]
    bundle = make_bundle(operations=[AddFacts(facts=facts[:2]), DeleteFacts(facts=facts[2:])])
    payload = sign_bundle(bundle, private_key, KID)
    assert open_bundle(payload, keyring, now=NOW, limits=BundleLimits(max_operations=4))
    error = refusal(payload, keyring, limits=BundleLimits(max_operations=3))
    assert error.reason == "too_many_operations"
    assert (error.bundle_id, error.stream) == ("b-0001", "anomaly/ambient-temperature")


def test_expired(private_key, keyring):
    bundle = make_bundle(issued_at=NOW - 3600, expires_at=NOW - 60)
    payload = sign_bundle(bundle, private_key, KID, check_times=False)
    error = refusal(payload, keyring)
    assert error.reason == "expired"
    assert "b-0001" in str(error)
    assert open_bundle(payload, keyring, now=NOW - 120).version == 1


def bad_rule(text: str, private_key, keyring, rule_id: str = "r7") -> BundleError:
    bundle = make_bundle(operations=[AddRules(rules=[RuleSpec(id=rule_id, text=text)])])
    error = refusal(sign_bundle(bundle, private_key, KID), keyring)
    assert error.reason == "bad_rule"
    assert error.rule_id == rule_id
    assert rule_id in str(error) and "b-0001" in str(error)
    return error


def test_rule_that_does_not_parse(private_key, keyring):
    error = bad_rule("<p>(X) :- <q>(X)\n   and .", private_key, keyring)
    assert (error.line, error.column) == (2, 8)
    assert "rule r7:2:8:" in str(error)


def test_unsafe_rule(private_key, keyring):
    error = bad_rule("<p>(X, Y) :- <q>(X) .", private_key, keyring)
    assert "unsafe" in str(error) and "Y" in str(error)
    assert (error.line, error.column) == (1, 1)


def test_text_must_be_exactly_one_rule(private_key, keyring):
    assert "found 2 rule" in str(
        bad_rule("<p>(X) :- <q>(X) . <r>(X) :- <q>(X) .", private_key, keyring)
    )
    assert "found 0 rule" in str(bad_rule("# nothing", private_key, keyring))
    assert "fact" in str(bad_rule("<p>(X) :- <q>(X) . <q>(<a>) .", private_key, keyring))


def test_label_must_match_id(private_key, keyring):
    error = bad_rule("other: <p>(X) :- <q>(X) .", private_key, keyring)
    assert "other" in str(error)


def test_deeply_nested_rule_is_a_bad_rule_not_a_crash(private_key, keyring):
    text = "<p>(X) :- <q>(X), X > " + "(" * 20_000 + "X" + ")" * 20_000 + " ."
    bad_rule(text, private_key, keyring)


# --- sequencing -------------------------------------------------------------------------------


def test_check_sequence():
    assert check_sequence(make_bundle(version=1), None) == "apply"
    assert check_sequence(make_bundle(version=4), 3) == "apply"
    assert check_sequence(make_bundle(version=3), 3) == "duplicate"
    assert check_sequence(make_bundle(version=1), 3) == "duplicate"
    assert check_sequence(make_bundle(version=9, full_state=True), 3) == "apply"
    assert check_sequence(make_bundle(version=5, full_state=True), None) == "apply"
    assert check_sequence(make_bundle(version=3, full_state=True), 3) == "duplicate"
    with pytest.raises(BundleError) as info:
        check_sequence(make_bundle(version=6), 3)
    error = info.value
    assert (error.reason, error.expected_version, error.stream) == (
        "version_gap",
        4,
        "anomaly/ambient-temperature",
    )
    assert "expected version 4" in str(error)
    with pytest.raises(BundleError) as info:
        check_sequence(make_bundle(version=2), None)
    assert info.value.expected_version == 1


# --- keys ---------------------------------------------------------------------------------------


def test_key_files_and_key_ring(tmp_path: Path):
    private_path, public_path = generate_key_pair(tmp_path / "keys", "cloud-a")
    assert (private_path.name, public_path.name) == ("cloud-a.key", "cloud-a.pub")
    assert stat.S_IMODE(os.stat(private_path).st_mode) == 0o600
    assert private_path.read_bytes().startswith(b"-----BEGIN PRIVATE KEY-----")
    assert public_path.read_bytes().startswith(b"-----BEGIN PUBLIC KEY-----")
    with pytest.raises(FileExistsError):
        generate_key_pair(tmp_path / "keys", "cloud-a")
    with pytest.raises(ValueError):
        generate_key_pair(tmp_path / "keys", "../escape")
    generate_key_pair(tmp_path / "keys", "cloud-b")

    ring = KeyRing.from_directory(tmp_path / "keys")
    assert ring.ids() == ["cloud-a", "cloud-b"] and len(ring) == 2 and "cloud-a" in ring
    for kid in ("cloud-a", "cloud-b"):
        key = load_private_key(tmp_path / "keys" / f"{kid}.key")
        assert open_bundle(sign_bundle(make_bundle(), key, kid), ring, now=NOW).version == 1
    other = load_private_key(tmp_path / "keys" / "cloud-b.key")
    assert refusal(sign_bundle(make_bundle(), other, "cloud-a"), ring).reason == "bad_signature"

    (tmp_path / "keys" / "broken.pub").write_text("not a key")
    with pytest.raises((ValueError, ZodiacError)):
        KeyRing.from_directory(tmp_path / "keys")


@pytest.mark.parametrize("depth", [100, 1_010, 100_000])
def test_an_envelope_nested_deep_is_malformed_not_a_crash(private_key, keyring, depth):
    """A msgpack payload of ``depth`` nested one-element arrays (a 1,010-deep one raised
    RecursionError once): refused as malformed before anything else looks at it."""
    payload = b"\x91" * depth + b"\xc0"
    with pytest.raises(BundleError) as info:
        open_bundle(payload, keyring, now=NOW)
    assert info.value.reason == "malformed"


def test_superseded_streams_count_as_operations(private_key, keyring):
    """``supersedes`` was not counted by ``max_operations``: a bundle of one operation could
    name any number of streams, each of which the device looks up."""
    bundle = make_bundle(operations=[], supersedes=[f"s{i}" for i in range(5)])
    payload = sign_bundle(bundle, private_key, KID)
    error = refusal(payload, keyring, limits=BundleLimits(max_operations=4))
    assert error.reason == "too_many_operations"
    assert open_bundle(payload, keyring, now=NOW, limits=BundleLimits(max_operations=5))
