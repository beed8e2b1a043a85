"""Freeing dropped facts off the update's critical path.

Why: deleting rules can drop hyper-nodes holding hundreds of thousands of facts (ZodiacEdge
Alg. 3 drops an emptied hyper-node "without reasoning"), and recomputing a hyper-node replaces
its facts. In CPython the memory of those facts is returned the moment the last reference goes,
one tuple at a time, and on Rule Set 2 that alone took longer than re-deriving what remains
(deleting {r10, r15, r17} frees about 260,000 facts). The paper's Java implementation leaves
this to the JVM's collector, off the update's path; this is the CPython equivalent.

How: an update hands what it drops (the previous update's journal, with the facts it removed,
and the IDBs of dropped hyper-nodes) to the process-wide `RECLAIMER` instead of letting the
references die inside the update. A daemon thread drops them one piece at a time (a relation's
fact set, one index), so a single step holds the interpreter lock for at most a few
milliseconds, and it waits while any update runs (`Reclaimer.paused`): freeing happens when the
agent is idle, as it mostly is between MQTT messages. Nothing is mutated that anyone else could
still read: the thread only drops its own references, so a piece still referenced elsewhere
simply stays alive.

``RECLAIMER.drain()`` waits until everything handed over is freed (tests, benchmarks, and
anyone measuring memory). ``RECLAIMER.seconds`` is the time the thread spent freeing.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager

from agent.engine.modules.base import Module, NodeState
from agent.engine.storage.changes import Journal, StoreChanges
from agent.engine.storage.store import DataStore, Relation, is_unread

__all__ = ["RECLAIMER", "Reclaimer"]


class Reclaimer:
    """A background thread that drops references handed to it, while no update runs."""

    def __init__(self) -> None:
        self._pending: deque = deque()
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._idle = threading.Condition(self._lock)
        self._updates = 0  # updates running now, in any thread
        self._working = False
        self._thread: threading.Thread | None = None
        self.seconds = 0.0  # time spent freeing, for benchmarks
        self.freed = 0  # pieces freed

    # ------------------------------------------------------------------ for updates
    def discard(self, *objects: object) -> None:
        """Take over references to objects nobody will read again; they are freed later."""
        with self._lock:
            self._pending.extend(o for o in objects if o is not None)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="zodiac-reclaimer", daemon=True
                )
                self._thread.start()
            self._wake.notify()

    @contextmanager
    def paused(self) -> Iterator[None]:
        """No freeing while the block (an update) runs."""
        with self._lock:
            self._updates += 1
        try:
            yield
        finally:
            with self._lock:
                self._updates -= 1
                self._wake.notify()

    def drain(self, timeout: float = 60.0) -> bool:
        """Wait until everything handed over so far is freed; False on time-out."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while self._pending or self._working:
                left = deadline - time.monotonic()
                if left <= 0 or self._updates:
                    return not (self._pending or self._working)
                self._idle.wait(left)
        return True

    @property
    def pending(self) -> int:
        return len(self._pending)

    # ------------------------------------------------------------------ the thread
    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._pending or self._updates:
                    self._working = False
                    self._idle.notify_all()
                    self._wake.wait(0.05 if self._updates else None)
                self._working = True
                item = self._pending.popleft()
            started = time.perf_counter()
            self._pending.extendleft(reversed(_pieces(item)))
            del item  # the last reference, in the usual case: freed here
            self.seconds += time.perf_counter() - started
            self.freed += 1
            time.sleep(0)  # let a waiting thread take the interpreter lock


def _pieces(item: object) -> list:
    """Split a big container into parts freed one by one (none is mutated if shared)."""
    if isinstance(item, NodeState):
        return [item.idb, item.module]
    if isinstance(item, DataStore):
        return list(item.relations.values())
    if isinstance(item, Module):
        return list(getattr(item, "__dict__", {}).values())
    if isinstance(item, Relation):
        if is_unread(item):  # (its saved bytes go with it: nothing to read and split)
            return []
        return [item._rows, *item._indexes.values()]
    if isinstance(item, Journal):
        return [item.edb, *(node.changes for node in item.nodes.values())]
    if isinstance(item, StoreChanges):
        return [*item.added.values(), *item.removed.values()]
    return []


RECLAIMER = Reclaimer()
