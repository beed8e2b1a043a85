"""An embedded pure-Python MQTT v5 broker: the simulation's broker when Mosquitto is missing.

Why our own: no MQTT broker published on PyPI does what the agents need. Each candidate was run
as a child process on a loopback port against tests/simulation/test_broker_conformance.py (paho-mqtt
2.2 MQTT v5 clients; November 2026), whose rows are the features below; the suite runs against
Mosquitto (the reference) and this broker on every test run. "y" = the row's test passes:

    =================================  =========  ====  =======  ========  ========  =====  =====
    row (test_...)                     mosquitto  ours  iotcore  mqttools  moat-lib  mqttd  amqtt
    =================================  =========  ====  =======  ========  ========  =====  =====
    mqtt5_connect                      y          y     y        y         -         y      -
    qos0_publish_subscribe             y          y     y        y         y         y      -
    qos1_puback_and_delivery           y          y     y        -         -         -      -
    topic_wildcards                    y          y     y        y         y         -      -
    retained_messages                  y          y     y        y         -         -      -
    will_on_abrupt_disconnect          y          y     y        y         -         -      -
    will_per_disconnect_reason         y          y     -        -         -         -      -
    response_topic_and_correlation...  y          y     y        y         -         -      -
    user_properties                    y          y     y        -         -         -      -
    content_type_payload_format_and..  y          y     y        y         -         -      -
    persistent_session_queues_qos1..   y          y     y        -         -         -      -
    clean_start_discards_the_session   y          y     -        -         -         -      -
    unacknowledged_qos1_message_is..   y          y     y        -         -         -      -
    session_expiry                     y          y     -        -         -         -      -
    restart_keeps_sessions_queued..    y          y     -        -         -         -      -
    passed                             15/15      15    11       7         2         2      0
    =================================  =========  ====  =======  ========  ========  =====  =====

Versions (month of the latest release): Mosquitto 2.0.11 (Debian's); iotcore 0.4.0 (2026-09,
rumqttd 0.20 compiled in: no persistence, sessions never expire, the will also published on a
normal DISCONNECT, a clean-start session not kept past its connection); mqttools 0.50.0
(2021-12: QoS 0 only, a PUBLISH with user properties dropped, no session expiry);
moat-lib-mqtt 0.8.7 (2026-10: CONNACK's session-present flag is the client's clean-start flag,
SUBACK grants QoS 0 for 1, no wills, no offline queue, only user properties forwarded, as a
dict); mqttd 0.5.3 (2026-02: a message published at QoS 1 is forwarded as a malformed
PUBLISH, no properties forwarded, ``#`` misses its parent level, no wills or persistent
sessions); amqtt 0.12.1 (2026-09: MQTT 3.1.1 only, v5 CONNECT refused). Not run: moat-mqtt
0.42.20 (needs Python 3.12; refuses protocol levels other than 4, i.e. 3.1.1) and
fp-mqtt-broker 0.1.2 (a paho-mqtt 1.6 client wrapper, not a broker). The closest, iotcore,
fails what the simulation's ``broker-restart`` fault and the agents' queued bundles rest on.
A candidate passing every row would replace this package.

So this is our own: stdlib ``asyncio``, no dependencies. `EmbeddedBroker` runs it as a child
process (``python -m simulations.mqttbroker --port N --directory D``) with the interface of
`simulations.mosquitto.Broker` (start/stop/kill/restart on a fixed port, a log, a persistence
file), so the simulation's faults treat both alike. Files in ``directory``: ``broker.log``,
``broker.json`` (the saved state), ``broker.stderr``.

Implemented (MQTT 5.0, and 3.1.1 clients — protocol level 4 — the same way without
properties and reason codes):

- CONNECT/CONNACK with session present and reason codes; other protocol levels are refused
  (level 3 and below with 3.1.1's return code 1, above 5 with 0x84 Unsupported Protocol
  Version); an empty client id gets an assigned one. Keep-alive: a client silent for 1.5x its
  keep-alive is dropped (DISCONNECT 0x8D) and its will published. PINGREQ/PINGRESP.
- Sessions: clean start, Session Expiry Interval (0 = ends with the connection, 0xFFFFFFFF =
  never; a DISCONNECT may change it), per-session queue of QoS 1/2 messages while offline (at
  most ``max_queued_messages``, the oldest dropped first), in-flight messages re-sent with DUP
  (or PUBREL) on resumption, the client's Receive Maximum as the in-flight window. 3.1.1's
  clean session 0 is a session that never expires.
- Session takeover: the old connection gets DISCONNECT 0x8E and is treated as an abnormal
  disconnection, so its will is published — at once with a Will Delay of 0, otherwise after the
  delay unless the new connection resumes the session (with clean start the old session ends,
  which publishes the will at once).
- Wills: published on abrupt close, keep-alive expiry, protocol errors, takeover and DISCONNECT
  with reason 0x04 (any reason other than 0x00); not on a normal DISCONNECT. Will Delay
  Interval honoured (published when the session ends, if earlier).
- PUBLISH QoS 0, 1 and 2 in both directions (PUBACK; PUBREC/PUBREL/PUBCOMP, duplicates of an
  incoming QoS 2 message routed once). Delivered QoS = min(publish, subscription); overlapping
  subscriptions of one client give one copy at the highest QoS with every Subscription
  Identifier. A PUBACK/PUBREC says 0x10 when nobody subscribes (as Mosquitto does).
- Properties: every MQTT 5 property type is parsed (unknown or illegally repeated ones are a
  malformed packet); a PUBLISH's properties are forwarded as received (payload format,
  content type, response topic, correlation data, user properties...), the Message Expiry
  Interval counted down (expired messages are not delivered), Subscription Identifiers added.
- SUBSCRIBE options: QoS, no local, retain as published, retain handling 0/1/2, Subscription
  Identifier. UNSUBSCRIBE/UNSUBACK (0x11 when there was no such subscription).
- Wildcards ``+`` and ``#``, never matching the first level of a topic starting with ``$``.
- Retained messages: per topic, an empty payload clears, delivered on subscribe with the retain
  flag set.
- ``$SYS/broker/...`` published retained every ``sys_interval`` s with Mosquitto's meanings:
  ``messages/received|sent`` and ``bytes/received|sent`` count every packet and byte of any
  type, ``publish/messages/received|sent|dropped`` PUBLISH packets only, ``clients/connected``,
  ``clients/total``, ``retained messages/count``, ``store/messages/count``, ``uptime``,
  ``version``. Clients may not publish to ``$SYS`` (dropped; 0x87 in the v5 acknowledgement).
- Persistence: on a clean stop (SIGTERM) — and every ``autosave_interval`` s when something
  changed — the retained messages and the sessions with an expiry (subscriptions, queued and
  in-flight messages, expiry, incoming QoS 2 ids) are written to ``broker.json`` (base64
  payloads) and loaded at the next start, so a restart keeps persistent sessions and queued
  QoS 1 messages like Mosquitto's. A file that cannot be read is set aside as ``.corrupt``.
- Robustness: a malformed packet (bad length, bad UTF-8, reserved flags, unknown property, a
  first packet other than CONNECT...) closes that connection only (DISCONNECT 0x81/0x82 for v5)
  with a log line; an unexpected exception in a handler costs the connection, never the broker.
  Packets above ``max_packet_size`` (32 MiB, announced in CONNACK) are refused with 0x95; a
  message larger than a client's Maximum Packet Size is not sent to it.

Deliberately not implemented: authentication and ACLs (user names and passwords are accepted
unchecked; enhanced authentication is refused with 0x8C), TLS and WebSockets, shared
subscriptions (refused with 0x9E; CONNACK says they are unavailable), topic aliases (Topic
Alias Maximum 0: a PUBLISH with one is a protocol error, 0x94), server-side reason strings and
user properties on acknowledgements, Request/Response Information, server redirection, queuing
QoS 0 messages for offline clients (like Mosquitto's default), flow control towards publishers
(every incoming message is acknowledged at once). On resumption every in-flight message is
re-sent, even if the client's new Receive Maximum is smaller. Wills are not published when the
broker itself stops, and a pending delayed will is not saved across a restart. Not built for
throughput: one process, one event loop; fine for hundreds of clients and a few thousand
messages per second.
"""

from simulations.mqttbroker.launcher import EmbeddedBroker

__all__ = ["EmbeddedBroker"]
