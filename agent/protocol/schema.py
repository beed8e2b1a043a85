"""JSON Schemas of the messages on a farm's MQTT topics, generated from the pydantic models.

``zodiac-agent schema KIND`` prints one; docs/readings.md shows those a turbine controller and
an operator's tools need, and a test checks that the docs and the command agree, so the
published format is the one the agent validates against (the models), never a hand-written copy.
The wire encoding is msgpack (agent/protocol/messages.py); the schema describes the decoded
map, as it would be written in JSON.
"""

from __future__ import annotations

import json

from pydantic import BaseModel

from agent.protocol.messages import Bundle, DeviceStatus, Event, RuleRequest, Telemetry

#: Message kind -> (model, the topic it travels on, who publishes it).
MESSAGES: dict[str, tuple[type[BaseModel], str, str]] = {
    "readings": (
        Telemetry,
        "zodiac/<farm>/<device>/readings",
        "the turbine controller, to its own device's agent",
    ),
    "telemetry": (
        Telemetry,
        "zodiac/<farm>/<device>/telemetry",
        "the agent, to the agents of its neighbours",
    ),
    "status": (
        DeviceStatus,
        "zodiac/<farm>/<device>/status",
        "the agent (retained), to the cloud and operators",
    ),
    "request": (RuleRequest, "zodiac/<farm>/<device>/request", "the agent, to the cloud"),
    "events": (
        Event,
        "zodiac/<farm>/<device>/events",
        "the agent (QoS 1, in seq order), to the cloud",
    ),
    "bundle": (
        Bundle,
        "zodiac/<farm>/<device>/bundle",
        "the cloud (the body of a signed envelope), to the agent",
    ),
}


def message_schema(kind: str) -> dict:
    """The JSON Schema of message ``kind`` (a key of :data:`MESSAGES`), with the topic."""
    model, topic, publisher = MESSAGES[kind]
    schema = model.model_json_schema()
    schema["$comment"] = f"{kind}: on {topic}, published by {publisher}; encoded with msgpack"
    return schema


def schema_text(kind: str) -> str:
    """:func:`message_schema` as the command prints it (and docs/readings.md shows it)."""
    return json.dumps(message_schema(kind), indent=2)
