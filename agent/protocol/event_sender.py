"""Sending the event outbox (agent/state/outbox.py) on ``zodiac/<farm>/<device>/events``, QoS 1,
in ``seq`` order, and deleting each event once the broker acknowledged it (paho's
``on_publish`` with the message's mid).

Threads: ``on_publish`` runs on paho's network thread and only queues the mid (paho may hold
its own lock then: taking another one there could deadlock a publish); everything that reads
or writes SQLite runs on the agent's thread, in :meth:`EventSender.pump`.

Order and duplicates: at most ``window`` events are in flight, published in seq order on one
connection, which MQTT keeps in order. After a disconnection every pending event is published
again from the lowest (paho also re-sends its own unacknowledged copies first, in order): the
first copy of each seq still arrives in order, and a later copy has the same seq, which a
consumer drops by ``(device, seq)``. Nothing is deleted before its PUBACK, so a kill -9 or a
broker outage loses nothing: the next start publishes what is left.
"""

from __future__ import annotations

import queue
from collections.abc import Callable, Iterable
from typing import Any, Protocol

import paho.mqtt.client as mqtt

from agent.protocol.messages import Event, WatchedChange, encode_model


class Pending(Protocol):
    """An event of the outbox (agent/state/outbox.py ``PendingEvent``)."""

    seq: int
    at: float
    cause: dict
    changes: list[Any]


WINDOW = 100  # events in flight at most


class EventSender:
    def __init__(
        self,
        client: mqtt.Client,
        topic: str,
        device: str,
        farm: str,
        pending: Callable[[int, int], list[Pending]],
        acknowledged: Callable[[Iterable[int]], None],
        *,
        window: int = WINDOW,
        wake: Callable[[], None] = lambda: None,
    ) -> None:
        self.client, self.topic, self.device, self.farm = client, topic, device, farm
        # The outbox's events after a seq (at most so many), and the deletion of acknowledged
        # ones: both on the agent's thread only (the state's connection is its own).
        self.pending, self.acknowledged = pending, acknowledged
        self.window = window
        self.wake = wake  # tells the agent's thread that acknowledgements arrived
        self.acks: queue.SimpleQueue[int] = queue.SimpleQueue()
        self.in_flight: dict[int, int] = {}  # mid -> seq
        self.sent_upto = 0  # the highest seq published on this connection
        self.published = 0  # events published (copies included), for the figures
        # False from a disconnection (paho's thread) until the agent's thread saw the new
        # connection (``restart``): nothing is published meanwhile.
        self.ready = False
        # Whether the outbox may hold events not yet published on this connection: set by
        # every change (``changed``) and connection, cleared when a look found none, so that
        # an idle agent's loop reads nothing (800 agents look several times a second).
        self.dirty = True

    def on_publish(self, client, userdata, mid, reason_code, properties) -> None:
        self.acks.put(mid)
        self.wake()

    def disconnected(self) -> None:
        self.ready = False

    def changed(self) -> None:
        """A change was committed: it may have written an event."""
        self.dirty = True

    def restart(self) -> None:
        """A new connection: publish every pending event again, from the lowest."""
        self.ready = True
        self.dirty = True
        self.in_flight.clear()
        self.sent_upto = 0
        while not self.acks.empty():  # (mids of the old connection mean nothing now)
            self.acks.get_nowait()

    def pump(self) -> None:
        """Delete what was acknowledged, then publish what the window allows (connected)."""
        done = []
        while not self.acks.empty():
            seq = self.in_flight.pop(self.acks.get_nowait(), None)
            if seq is not None:
                done.append(seq)
        if done:
            self.acknowledged(done)
        room = self.window - len(self.in_flight)
        if room <= 0 or not self.dirty or not self.ready or not self.client.is_connected():
            return
        events = self.pending(self.sent_upto, room)
        if len(events) < room:
            self.dirty = False  # (all of it is on its way: nothing more until a change)
        for event in events:
            info = self.client.publish(self.topic, self.payload(event), qos=1)
            if info.rc != mqtt.MQTT_ERR_SUCCESS:
                self.dirty = True
                return  # (not connected any more: all of it again at the next connection)
            self.in_flight[info.mid] = event.seq
            self.sent_upto = event.seq
            self.published += 1

    def payload(self, event: Pending) -> bytes:
        changes = [
            WatchedChange(watch=watch, appeared=appeared, disappeared=disappeared)
            for watch, appeared, disappeared in event.changes
        ]
        message = Event(
            device=self.device,
            farm=self.farm,
            seq=event.seq,
            at=event.at,
            cause=event.cause,
            changes=changes,
        )
        return encode_model(message)
