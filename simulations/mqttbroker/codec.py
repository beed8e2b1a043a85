"""The MQTT wire format (v5, and v3.1.1 which is v5 without properties and reason codes).

Decoding raises `PacketError` for anything the specification calls malformed or a protocol
error; the connection then answers with the error's reason code (v5 only) and closes. A packet
is parsed from its complete body (the fixed header has already been split off), so a short
read can never leave a half-parsed packet behind.

Properties are a list of ``(identifier, value)`` pairs, in the order received: User Property
(a ``(name, value)`` pair) and Subscription Identifier may repeat, every other property may not.
"""

from __future__ import annotations

# Packet types (the high nibble of the fixed header).
CONNECT, CONNACK, PUBLISH, PUBACK, PUBREC, PUBREL, PUBCOMP = 1, 2, 3, 4, 5, 6, 7
SUBSCRIBE, SUBACK, UNSUBSCRIBE, UNSUBACK, PINGREQ, PINGRESP, DISCONNECT, AUTH = range(8, 16)

# Property identifiers used by the broker itself.
PAYLOAD_FORMAT, MESSAGE_EXPIRY, SUBSCRIPTION_ID, SESSION_EXPIRY = 0x01, 0x02, 0x0B, 0x11
ASSIGNED_CLIENT_ID, AUTH_METHOD, WILL_DELAY, RECEIVE_MAXIMUM = 0x12, 0x15, 0x18, 0x21
TOPIC_ALIAS, MAXIMUM_PACKET_SIZE, SHARED_SUBSCRIPTION_AVAILABLE = 0x23, 0x27, 0x2A

BYTE, TWO, FOUR, VARINT, STRING, BINARY, PAIR = range(7)
PROPERTY_TYPES = {
    0x01: BYTE,  # Payload Format Indicator
    0x02: FOUR,  # Message Expiry Interval
    0x03: STRING,  # Content Type
    0x08: STRING,  # Response Topic
    0x09: BINARY,  # Correlation Data
    0x0B: VARINT,  # Subscription Identifier
    0x11: FOUR,  # Session Expiry Interval
    0x12: STRING,  # Assigned Client Identifier
    0x13: TWO,  # Server Keep Alive
    0x15: STRING,  # Authentication Method
    0x16: BINARY,  # Authentication Data
    0x17: BYTE,  # Request Problem Information
    0x18: FOUR,  # Will Delay Interval
    0x19: BYTE,  # Request Response Information
    0x1A: STRING,  # Response Information
    0x1C: STRING,  # Server Reference
    0x1F: STRING,  # Reason String
    0x21: TWO,  # Receive Maximum
    0x22: TWO,  # Topic Alias Maximum
    0x23: TWO,  # Topic Alias
    0x24: BYTE,  # Maximum QoS
    0x25: BYTE,  # Retain Available
    0x26: PAIR,  # User Property
    0x27: FOUR,  # Maximum Packet Size
    0x28: BYTE,  # Wildcard Subscription Available
    0x29: BYTE,  # Subscription Identifier Available
    0x2A: BYTE,  # Shared Subscription Available
}
REPEATABLE = {0x0B, 0x26}

Properties = list[tuple[int, object]]


class PacketError(Exception):
    """A malformed packet (reason 0x81) or another protocol violation (the given reason)."""

    def __init__(self, message: str, reason: int = 0x81) -> None:
        super().__init__(message)
        self.reason = reason


def prop(properties: Properties, identifier: int, default: object = None) -> object:
    """The value of a non-repeatable property, or ``default``."""
    for key, value in properties:
        if key == identifier:
            return value
    return default


# ------------------------------------------------------------------------------- encoding
def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def string(text: str) -> bytes:
    data = text.encode()
    return len(data).to_bytes(2, "big") + data


def binary(data: bytes) -> bytes:
    return len(data).to_bytes(2, "big") + data


def properties(props: Properties) -> bytes:
    """Encoded properties, length prefix included (one zero byte when there are none)."""
    if not props:
        return b"\x00"
    out = bytearray()
    for key, value in props:
        kind = PROPERTY_TYPES[key]
        out.append(key)
        if kind == BYTE:
            out.append(value)
        elif kind == TWO:
            out += value.to_bytes(2, "big")
        elif kind == FOUR:
            out += value.to_bytes(4, "big")
        elif kind == VARINT:
            out += varint(value)
        elif kind == STRING:
            out += string(value)
        elif kind == BINARY:
            out += binary(value)
        else:
            out += string(value[0]) + string(value[1])
    return varint(len(out)) + bytes(out)


def packet(first_byte: int, *parts: bytes) -> bytes:
    """A whole packet: the fixed header's first byte, the remaining length, the parts."""
    body = b"".join(parts)
    return bytes((first_byte,)) + varint(len(body)) + body


def ack(kind: int, pid: int, version: int, reason: int = 0) -> bytes:
    """PUBACK/PUBREC/PUBREL/PUBCOMP; a v5 reason code 0 without properties may be omitted."""
    first = (kind << 4) | (2 if kind == PUBREL else 0)
    if version == 5 and reason:
        return packet(first, pid.to_bytes(2, "big"), bytes((reason,)))
    return packet(first, pid.to_bytes(2, "big"))


# ------------------------------------------------------------------------------- decoding
class Reader:
    """Sequential reads from one packet body; every short read is a `PacketError`."""

    __slots__ = ("data", "pos")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def _take(self, n: int) -> bytes:
        end = self.pos + n
        if end > len(self.data):
            raise PacketError("packet shorter than its contents")
        chunk = self.data[self.pos : end]
        self.pos = end
        return chunk

    def remaining(self) -> int:
        return len(self.data) - self.pos

    def byte(self) -> int:
        return self._take(1)[0]

    def u16(self) -> int:
        return int.from_bytes(self._take(2), "big")

    def u32(self) -> int:
        return int.from_bytes(self._take(4), "big")

    def varint(self) -> int:
        value, shift = 0, 0
        for _ in range(4):
            byte = self.byte()
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return value
            shift += 7
        raise PacketError("variable byte integer longer than 4 bytes")

    def binary(self) -> bytes:
        return self._take(self.u16())

    def string(self) -> str:
        raw = self.binary()
        try:
            text = raw.decode("utf-8")  # strict: rejects surrogates and overlong forms
        except UnicodeDecodeError:
            raise PacketError("string is not valid UTF-8") from None
        if "\x00" in text:
            raise PacketError("string contains U+0000")
        return text

    def rest(self) -> bytes:
        chunk = self.data[self.pos :]
        self.pos = len(self.data)
        return chunk

    def end(self) -> None:
        if self.pos != len(self.data):
            raise PacketError("unexpected bytes at the end of the packet")

    def properties(self) -> Properties:
        length = self.varint()
        end = self.pos + length
        if end > len(self.data):
            raise PacketError("property length beyond the packet")
        props: Properties = []
        seen: set[int] = set()
        while self.pos < end:
            key = self.varint()
            kind = PROPERTY_TYPES.get(key)
            if kind is None:
                raise PacketError(f"unknown property 0x{key:02x}")
            if key in seen and key not in REPEATABLE:
                raise PacketError(f"property 0x{key:02x} given twice", 0x82)
            seen.add(key)
            if kind == BYTE:
                value: object = self.byte()
            elif kind == TWO:
                value = self.u16()
            elif kind == FOUR:
                value = self.u32()
            elif kind == VARINT:
                value = self.varint()
            elif kind == STRING:
                value = self.string()
            elif kind == BINARY:
                value = self.binary()
            else:
                value = (self.string(), self.string())
            props.append((key, value))
        if self.pos != end:
            raise PacketError("property overruns the property length")
        return props


# ------------------------------------------------------------------------------- topics
def valid_topic(topic: str) -> bool:
    return bool(topic) and "+" not in topic and "#" not in topic


def valid_filter(topic_filter: str) -> bool:
    if not topic_filter:
        return False
    levels = topic_filter.split("/")
    for i, level in enumerate(levels):
        if "#" in level and (level != "#" or i != len(levels) - 1):
            return False
        if "+" in level and level != "+":
            return False
    return True


def matches(topic_filter: str, topic: str) -> bool:
    """Whether ``topic`` matches ``topic_filter`` (wildcards never match a leading ``$``)."""
    if topic.startswith("$") and topic_filter[:1] in ("+", "#"):
        return False
    flevels, tlevels = topic_filter.split("/"), topic.split("/")
    for i, level in enumerate(flevels):
        if level == "#":
            return True
        if i >= len(tlevels) or (level != "+" and level != tlevels[i]):
            return False
    return len(flevels) == len(tlevels)
