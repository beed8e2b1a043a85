"""What a bundle may say about time and names, checked where it is made and signed (the Bundle
model, ``sign_bundle``, the cutter) and where it is received (``Agent.handle_bundle``, real
keys, a real SQLite state).

A bundle is valid from ``issued_at`` to ``expires_at``: the second after the first, for at most a
year, both real times. The device refuses a bundle its clock says is expired or not yet valid
(``issued_at`` more than ``CLOCK_SKEW`` ahead), and says its clock and the bundle's times, so an
operator reading the status sees a clock problem. A stream name has a length limit, so the
status that echoes it stays small.
"""

from __future__ import annotations

import json
import time

import msgpack
import pytest
from pydantic import ValidationError

from agent.protocol.messages import (
    MAX_STREAM_NAME,
    Bundle,
    BundleError,
    encode_fact,
    encode_model,
    utc,
)
from agent.protocol.signing import CLOCK_SKEW, sign_bundle
from cloud.bundles import BundleCutter
from tests.agent.test_service import make_agent
from tests.support.agent_harness import Cloud

DAY = 86400.0


@pytest.fixture
def cloud(tmp_path):
    return Cloud(tmp_path / "cloud")


def body(version: int = 1, **changes) -> dict:
    """A bundle body as the cloud would encode it, with ``changes`` (unchecked by pydantic)."""
    now = time.time()
    fields = {
        "bundle_id": f"b{version}",
        "farm": "farm1",
        "device": "t1",
        "stream": "base",
        "version": version,
        "issued_at": now,
        "expires_at": now + 3600,
        "full_state": False,
        "supersedes": [],
        "operations": [{"op": "add_facts", "facts": [encode_fact(("temp", "t1", version))]}],
    }
    fields.update(changes)
    return fields


def signed(cloud: Cloud, fields: dict) -> bytes:
    """``fields`` signed for real by the cloud's key, without the model's or the signer's
    checks: what a cloud with a bug (or a wrong clock) would send."""
    data = msgpack.packb(fields, use_bin_type=True)
    envelope = {"v": 1, "kid": cloud.key_id, "body": data, "sig": cloud.private.sign(data)}
    return msgpack.packb(envelope, use_bin_type=True)


def error_of(agent) -> dict:
    return json.loads(agent.status().last_error)


NONSENSE = [
    ("expires_at = 1e308", {"expires_at": 1e308}, "expires_at"),
    ("issued after it expires", {"issued_at": 2e9, "expires_at": 2e9 - 60}, "must be after"),
    ("issued as it expires", {"issued_at": 2e9, "expires_at": 2e9}, "must be after"),
    ("valid for 400 days", {"issued_at": 2e9, "expires_at": 2e9 + 400 * DAY}, "at most 366 days"),
    ("issued before 1970", {"issued_at": -5.0}, "issued_at"),
]


@pytest.mark.parametrize(("name", "times", "words"), NONSENSE, ids=[n for n, _, _ in NONSENSE])
def test_nonsensical_times_are_refused_by_the_model_and_by_the_device(
    tmp_path, cloud, name, times, words
):
    with pytest.raises(ValidationError, match=words):
        Bundle.model_validate(body(**times))
    agent = make_agent(tmp_path, cloud)
    outcome = agent.handle_bundle(signed(cloud, body(**times)))
    assert (outcome.status, outcome.reason) == ("refused", "invalid"), name
    assert words in outcome.message
    assert agent.state.applied_versions() == {} and agent.reasoner.count() == 0
    agent.close()


def test_a_bundle_issued_ahead_of_the_device_clock_is_not_yet_valid(tmp_path, cloud):
    agent = make_agent(tmp_path, cloud)
    now = time.time()
    ten_years = now + 3650 * DAY
    outcome = agent.handle_bundle(
        signed(cloud, body(issued_at=ten_years, expires_at=ten_years + 7 * DAY))
    )
    assert (outcome.status, outcome.reason) == ("refused", "not_yet_valid")
    # The device's clock and the bundle's window, and what they point at.
    assert f"valid from {utc(ten_years)} to {utc(ten_years + 7 * DAY)}" in outcome.message
    assert "this device's clock reads" in outcome.message and "is behind" in outcome.message
    assert error_of(agent)["reason"] == "not_yet_valid"
    assert agent.state.applied_versions() == {}
    # A cloud clock a little ahead (within the tolerance) is no reason to refuse.
    ahead = now + CLOCK_SKEW / 2
    fine = agent.handle_bundle(signed(cloud, body(issued_at=ahead, expires_at=ahead + DAY)))
    assert fine.status == "applied", fine.message
    agent.close()


def test_a_device_clock_eight_days_ahead_is_named_in_the_expiry_refusal(tmp_path, cloud):
    """Every bundle the cloud sends (valid 7 days) looks expired to a device 8 days ahead:
    the refusal says the device's clock, the bundle's times and that the clock may be ahead."""
    agent = make_agent(tmp_path, cloud)
    cloud_now = time.time() - 8 * DAY  # the cloud's clock, as seen from the device
    outcome = agent.handle_bundle(
        signed(cloud, body(issued_at=cloud_now, expires_at=cloud_now + 7 * DAY))
    )
    assert (outcome.status, outcome.reason) == ("refused", "expired")
    message = error_of(agent)["message"]
    assert f"valid from {utc(cloud_now)} to {utc(cloud_now + 7 * DAY)}" in message
    assert "this device's clock reads" in message
    assert "24.0 h after its expiry" in message and "is ahead" in message
    agent.close()


def test_a_long_stream_name_is_refused_and_not_echoed_into_the_status(tmp_path, cloud):
    agent = make_agent(tmp_path, cloud)
    outcome = agent.handle_bundle(signed(cloud, body(stream="s" * 5000)))
    assert (outcome.status, outcome.reason) == ("refused", "invalid")
    assert f"at most {MAX_STREAM_NAME} characters" in outcome.message
    assert len(encode_model(agent.status())) < 1_000
    assert agent.state.applied_versions() == {}
    # The longest allowed name is a stream like any other.
    longest = "s" * MAX_STREAM_NAME
    assert agent.handle_bundle(signed(cloud, body(stream=longest))).status == "applied"
    assert agent.state.applied_versions() == {longest: 1}
    with pytest.raises(ValidationError, match="at most"):
        Bundle.model_validate(body(supersedes=["x" * (MAX_STREAM_NAME + 1)]))
    agent.close()


def test_the_cloud_refuses_to_make_or_sign_what_every_device_would_refuse(tmp_path, cloud):
    bundle = Bundle.model_validate(body())
    # model_copy skips validation: signing validates again.
    forever = bundle.model_copy(update={"expires_at": 1e308})
    with pytest.raises(BundleError, match="expires_at") as info:
        sign_bundle(forever, cloud.private, cloud.key_id)
    assert info.value.reason == "invalid"
    now = time.time()
    stale = Bundle.model_validate(body(issued_at=now - 2 * DAY, expires_at=now - DAY))
    with pytest.raises(BundleError, match="the signer's clock") as info:
        sign_bundle(stale, cloud.private, cloud.key_id)
    assert info.value.reason == "expired"
    early = Bundle.model_validate(body(issued_at=now + DAY, expires_at=now + 2 * DAY))
    with pytest.raises(BundleError) as info:
        sign_bundle(early, cloud.private, cloud.key_id)
    assert info.value.reason == "not_yet_valid"
    assert sign_bundle(bundle, cloud.private, cloud.key_id)  # a sound bundle signs
    # The cutter's time to live is a real lifetime.
    for ttl in (0, -1, 1e308, 400 * DAY):
        with pytest.raises(ValueError, match="time to live"):
            BundleCutter(tmp_path / "cutter.db", "farm1", ttl=ttl)
    cutter = BundleCutter(tmp_path / "cutter.db", "farm1", ttl=30 * DAY)
    cut = cutter.full_state("t1", "base")
    assert cut.expires_at - cut.issued_at == pytest.approx(30 * DAY)
