"""The one way a zodiac-edge program makes its MQTT client: paho-mqtt 2.x with the version 2
callbacks and MQTT v5, credentials and TLS when given, a bounded reconnection back-off.

The agent (agent/sync.py), the cloud's publisher, the wind-farm simulation's monitor and
controller, and the tests' clients all make theirs here, so that they negotiate alike (one
TLS set-up: the tests' client checks certificates exactly as a device does) and a change of
library version is made once.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path

import paho.mqtt.client as mqtt


@dataclass(frozen=True)
class Tls:
    """TLS towards the broker: the CA that signed its certificate (None: the system's), and
    this client's certificate and key when the broker asks for one (``require_certificate``).
    ``insecure`` skips the check of the broker's host name (tests with an IP only)."""

    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None
    insecure: bool = False


def mqtt_client(
    client_id: str,
    *,
    username: str | None = None,
    password: str | None = None,
    tls: Tls | None = None,
    manual_ack: bool = False,
    reconnect: tuple[float, float] | None = None,
) -> mqtt.Client:
    """A paho client (VERSION2 callbacks, MQTT v5) named ``client_id``. ``manual_ack``: the
    caller acknowledges each QoS 1 message once it is durable (the agent); ``reconnect``: the
    least and most seconds between reconnection attempts (paho's own default otherwise)."""
    client = mqtt.Client(
        mqtt.CallbackAPIVersion.VERSION2,
        client_id=client_id,
        protocol=mqtt.MQTTv5,
        manual_ack=manual_ack,
    )
    if username:
        client.username_pw_set(username, password)
    if tls is not None:
        client.tls_set(
            ca_certs=str(tls.ca_file) if tls.ca_file else None,
            certfile=str(tls.cert_file) if tls.cert_file else None,
            keyfile=str(tls.key_file) if tls.key_file else None,
            cert_reqs=ssl.CERT_REQUIRED,
        )
        client.tls_insecure_set(tls.insecure)
    if reconnect is not None:
        low, high = reconnect
        client.reconnect_delay_set(max(1, int(low)), max(1, int(high)))
    return client
