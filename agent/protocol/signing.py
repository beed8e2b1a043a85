"""Signing bundles (the cloud) and opening them (the agent): the envelope, its checks, and the
version sequence of each stream.

Why this order of checks (:func:`open_bundle`)
---------------------------------------------
1. *Size first*: refusing an oversized payload costs one ``len()``; nothing else has looked at it.
2. *Envelope shape, key id, signature*: only the tiny fixed-shape envelope goes through msgpack
   before the signature is verified. The body is verified *before* it is decoded, so a body
   forged by someone without the cloud's private key never reaches the msgpack decoder, pydantic
   or the rule parser: their attack surface is only exposed to the cloud itself.
3. *Schema, operation count, times, rule texts*: even a genuine bundle can be wrong (a cloud bug,
   a bundle replayed long after it expired), and the agent must refuse it *before* touching its
   state, so that a bundle is applied entirely or not at all.

Times (:func:`check_times`)
---------------------------
The schema already refuses times that make no sense in themselves (``expires_at`` not after
``issued_at``, valid for more than a year, beyond the year 9999). Against the device's clock, a
bundle is ``expired`` once ``expires_at`` has passed (exactly: a bundle lives for days, so no
clock error matters, and a tolerance would only lengthen a captured bundle's life), and
``not_yet_valid`` while ``issued_at`` is more than :data:`CLOCK_SKEW` ahead (the cloud's and the
device's clocks differ by a little, and a bundle is opened a moment after it is made: without a
tolerance a device a second behind would refuse every fresh bundle). Both messages give the
device's clock and the bundle's times: a device that refuses every new bundle this way has a
wrong clock, and the message must say so to the operator reading the status.

This module is imported by the edge agent: it must not import pyspark or anything from
``cloud``.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Literal

import msgpack
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from agent.protocol.keys import KeyRing, _check_key_id
from agent.protocol.messages import (
    _ENVELOPE_KEYS,
    ENVELOPE_VERSION,
    SIGNATURE_BYTES,
    Bundle,
    BundleError,
    _unpack,
    clip,
    decode_bundle,
    encode_model,
    utc,
)

#: How far a bundle's ``issued_at`` may be ahead of the device's clock (seconds): clocks that
#: are a few minutes apart must not stop bundles (see the module docstring).
CLOCK_SKEW = 300.0

# --- signing and opening ------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class BundleLimits:
    """What one bundle may cost a device: payload bytes, and operations (each rule, rule id
    and fact of every operation counts one)."""

    max_bytes: int = 1_000_000
    max_operations: int = 10_000


def sign_bundle(
    bundle: Bundle,
    private_key: Ed25519PrivateKey,
    key_id: str,
    *,
    now: float | None = None,
    check_times: bool = True,
) -> bytes:
    """The wire payload for ``bundle``: its encoding, signed by ``private_key`` (the cloud's).

    The bundle is validated again first (``model_copy(update=...)`` skips pydantic's checks, and
    whatever is signed must pass the device's), and, unless ``check_times`` is false (tests
    that make bundles a device must refuse), refused when the signer's clock (``now``) says it
    is already expired or not yet valid: a :class:`BundleError` with the reason a device would
    give. It does not parse the rules; call :meth:`Bundle.parsed_rules` first to avoid
    publishing a bundle every device will refuse.
    """
    body = encode_model(bundle)
    decode_bundle(body)  # what the device will decode, checked as the device checks it
    if check_times:
        check_times_at(bundle, time.time() if now is None else now, clock="the signer's clock")
    envelope = {
        "v": ENVELOPE_VERSION,
        "kid": _check_key_id(key_id),
        "body": body,
        "sig": private_key.sign(body),
    }
    return msgpack.packb(envelope, use_bin_type=True)


def open_bundle(
    payload: bytes,
    keyring: KeyRing,
    *,
    limits: BundleLimits = BundleLimits(),
    now: float | None = None,
) -> Bundle:
    """Verify and decode a wire payload; raise :class:`BundleError` if the agent must refuse it.

    Checks, in this order (see the module docstring for why): size, envelope shape, key id,
    signature, then the body's schema, operation count, times and rule texts.
    """
    if not isinstance(payload, (bytes, bytearray, memoryview)):
        raise BundleError("malformed", f"payload must be bytes, not {type(payload).__name__}")
    size = len(payload)
    if size > limits.max_bytes:
        raise BundleError(
            "too_large", f"payload of {size} bytes exceeds the limit of {limits.max_bytes}"
        )

    envelope = _unpack(bytes(payload), "the envelope")
    if not isinstance(envelope, dict) or set(envelope) != _ENVELOPE_KEYS:
        keys = sorted(map(str, envelope)) if isinstance(envelope, dict) else None
        raise BundleError(
            "malformed",
            f"the envelope must be a map with keys {sorted(_ENVELOPE_KEYS)}, got "
            + (f"keys {keys}" if keys is not None else type(envelope).__name__),
        )
    version, key_id, body, signature = (envelope[k] for k in ("v", "kid", "body", "sig"))
    if type(version) is not int or version != ENVELOPE_VERSION:  # bool is an int: be exact
        raise BundleError("malformed", f"unsupported envelope version {clip(version)}")
    if not isinstance(key_id, str) or not isinstance(body, bytes):
        raise BundleError("malformed", "the envelope's kid must be a str and body bin")
    if not isinstance(signature, bytes) or len(signature) != SIGNATURE_BYTES:
        raise BundleError("malformed", f"the signature must be {SIGNATURE_BYTES} bytes of bin")

    public_key = keyring.get(key_id)
    if public_key is None:
        raise BundleError(
            "unknown_key", f"signed with unknown key {clip(key_id)} (trusted: {keyring.ids()})"
        )
    try:
        public_key.verify(signature, body)
    except InvalidSignature:
        raise BundleError(
            "bad_signature", f"the signature does not match the body for key {key_id!r}"
        ) from None

    bundle = decode_bundle(body)
    where = {"bundle_id": bundle.bundle_id, "stream": bundle.source, "version": bundle.version}
    count = bundle.operation_count()
    if count > limits.max_operations:
        raise BundleError(
            "too_many_operations",
            f"{count} operations (rules, rule ids and facts) exceed the limit of "
            f"{limits.max_operations}",
            **where,
        )
    check_times(bundle, time.time() if now is None else now)
    bundle.parsed_rules()
    return bundle


def check_times(bundle: Bundle, now: float) -> None:
    """Refuse a bundle the device's clock (``now``) says is expired or not yet valid (see the
    module docstring), with a message that names the clock and the bundle's times."""
    check_times_at(bundle, now, clock="this device's clock", device=True)


def check_times_at(bundle: Bundle, now: float, *, clock: str, device: bool = False) -> None:
    """:func:`check_times` against a clock named ``clock`` in the message; a device's message
    also says what a fresh bundle refused so means (its own clock is wrong)."""
    where = {"bundle_id": bundle.bundle_id, "stream": bundle.source, "version": bundle.version}
    window = f"valid from {utc(bundle.issued_at)} to {utc(bundle.expires_at)}"
    if now > bundle.expires_at:
        hint = f" (if the cloud sent it just now, {clock} is ahead)" if device else ""
        raise BundleError(
            "expired",
            f"version {bundle.version} is {window}; {clock} reads {utc(now)}, "
            f"{_duration(now - bundle.expires_at)} after its expiry{hint}",
            **where,
        )
    if bundle.issued_at > now + CLOCK_SKEW:
        hint = f"; if the cloud sent it just now, {clock} is behind" if device else ""
        raise BundleError(
            "not_yet_valid",
            f"version {bundle.version} is {window}; {clock} reads {utc(now)}, "
            f"{_duration(bundle.issued_at - now)} before it was issued (more than the "
            f"{CLOCK_SKEW:.0f} s tolerated{hint})",
            **where,
        )


def _duration(seconds: float) -> str:
    """A positive duration in the unit an operator reads at a glance."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


# --- sequencing ---------------------------------------------------------------------------


def check_sequence(bundle: Bundle, applied_version: int | None) -> Literal["apply", "duplicate"]:
    """Decide what to do with ``bundle`` given the version applied for its stream (None: none).

    * ``"apply"``: the next version (``applied + 1``; ``1`` when nothing is applied yet), or a
      ``full_state`` bundle or a revert newer than what is applied (each replaces the stream's
      whole content, so the gap does not matter);
    * ``"duplicate"``: a version already applied (MQTT redelivery): a no-op, not an error;
    * ``BundleError(reason="version_gap")`` otherwise: applying it would skip operations. The
      message and ``expected_version`` say what the device needs, so the cloud can re-send the
      missing versions or a full state.
    """
    applied = 0 if applied_version is None else applied_version
    if bundle.version <= applied:
        return "duplicate"
    if bundle.version == applied + 1 or bundle.full_state or bundle.revert_to is not None:
        return "apply"
    raise BundleError(
        "version_gap",
        f"version {bundle.version} skips versions: expected version {applied + 1} "
        f"(applied: {applied_version}) or a full-state bundle",
        bundle_id=bundle.bundle_id,
        stream=bundle.source,
        version=bundle.version,
        expected_version=applied + 1,
    )
